//! Instructions per 2-byte message, counted by callgrind on each side of a
//! perftest pair (`xiw-bench --instr`).
//!
//! - posting: the requester's `post_send` (framing, and handing the bytes to
//!   the socket), inclusive, divided by the messages;
//! - receiving: the responder's receive path from the bytes read
//!   (`rx::take_in`: parsing, checks, placement, the completion) plus, for
//!   Sends, re-posting the receive (`post_recv`), divided by the messages.
//!   The read itself and the polls that find nothing are not counted: they
//!   are the system call and the application's waiting.
//!
//! Only user-space instructions count (callgrind sees no kernel work), so
//! this follows the provider's own cost, not the machine's speed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use xiw_tests::harness::{self, Device};

/// The functions whose inclusive counts make each side, as callgrind_annotate
/// names them: the demangled symbol's first and last parts (the verbs entry
/// points have moved between modules; this matches them wherever they are).
const POSTING: &[(&str, &str)] = &[("xiw::verbs", "::post_send")];
const RECEIVING: &[(&str, &str)] = &[("xiw::", "rx::take_in")];
const REPOST: &[(&str, &str)] = &[("xiw::verbs", "::post_recv")];

pub struct Count {
    pub posting: f64,
    pub receiving: f64,
}

/// Runs `tool -s 2 -n iters` with both processes under callgrind.
pub fn measure(
    dev: &Device,
    env: &[(String, String)],
    tool: &str,
    iters: usize,
    dir: &Path,
) -> Result<Count, String> {
    let port = harness::port();
    let out = |side: &str| dir.join(format!("callgrind-{tool}-{side}.out"));
    let mk = |client: bool| {
        let mut c: Command = dev.cmd("valgrind");
        c.envs(env.iter().map(|(k, v)| (k, v)));
        c.args(["--tool=callgrind", "--fair-sched=yes", "--quiet"]);
        c.arg(format!(
            "--callgrind-out-file={}",
            out(if client { "client" } else { "server" }).display()
        ));
        c.args([tool, "-d", "xiw0", "-p", &port.to_string(), "-F"]);
        c.args(["-s", "2", "-n", &iters.to_string()]);
        if client {
            c.arg(&dev.addr);
        }
        c
    };
    // ib_send_bw without -R exits 1 at teardown on any iWARP provider (its
    // credit MR is never deregistered): the counts are complete by then, so
    // the pair is judged by what callgrind recorded.
    let pair = harness::run_pair(mk(false), None, port, mk(true), Duration::from_secs(600));
    let counts = inclusive(&out("client")).and_then(|c| Ok((c, inclusive(&out("server"))?)));
    let (client, server) = counts.map_err(|e| format!("{e}\n{}", pair.dump()))?;
    // A function whose code came from several files is listed once per file;
    // its largest entry is the whole of it.
    let sum = |counts: &[(String, u64)], names: &[(&str, &str)]| -> u64 {
        names
            .iter()
            .map(|(first, last)| {
                counts
                    .iter()
                    .filter(|(f, _)| f.starts_with(first) && f.ends_with(last))
                    .map(|(_, c)| *c)
                    .max()
                    .unwrap_or(0)
            })
            .sum()
    };
    let posted = sum(&client, POSTING);
    let received = sum(&server, RECEIVING);
    if posted == 0 || received == 0 {
        return Err(format!(
            "{tool}: no instructions found in {POSTING:?} (client) or {RECEIVING:?} (server)\n{}",
            pair.dump()
        ));
    }
    let repost = if tool.contains("send") {
        sum(&server, REPOST)
    } else {
        0
    };
    let msgs = iters as f64;
    Ok(Count {
        posting: posted as f64 / msgs,
        receiving: (received + repost) as f64 / msgs,
    })
}

/// Inclusive instruction counts by function, from callgrind_annotate.
fn inclusive(file: &PathBuf) -> Result<Vec<(String, u64)>, String> {
    let out = Command::new("callgrind_annotate")
        .args(["--inclusive=yes", "--threshold=100"])
        .arg(file)
        .output()
        .map_err(|e| format!("callgrind_annotate: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "callgrind_annotate {}: {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(parse_annotate(&String::from_utf8_lossy(&out.stdout)))
}

/// Lines like `1,234 (12.3%)  src/x.rs:xiw::qp::rx::read_stream [/usr/lib/libxiw-rdmav34.so]`.
fn parse_annotate(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let (num, rest) = l.split_once(' ')?;
            let n: u64 = num.replace(',', "").parse().ok()?;
            let rest = rest.trim_start();
            let rest = match rest.strip_prefix('(') {
                Some(r) => r.split_once(')')?.1.trim_start(),
                None => rest,
            };
            let func = rest.split(" [").next()?;
            // `file:function`, where the function's path has `::` of its own.
            let func = func.split_once(':').map_or(func, |(_, f)| f).trim();
            Some((func.to_string(), n))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_annotate_lines() {
        let text = "\
--------------------------------------------------------------------------------
Ir                  file:function
--------------------------------------------------------------------------------
46,301,553 (100.0%)  ???:0x0000000000001100 [/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2]
 2,398,112 ( 5.18%)  provider/src/verbs/qp.rs:xiw::verbs::qp::post_send [/usr/lib/x86_64-linux-gnu/libibverbs/libxiw-rdmav34.so]
   812,000  ( 1.75%)  provider/src/qp/rx.rs:xiw::qp::rx::read_stream [/usr/lib/libxiw-rdmav34.so]
";
        let v = parse_annotate(text);
        assert!(v.contains(&("xiw::verbs::qp::post_send".to_string(), 2_398_112)));
        assert!(v.contains(&("xiw::qp::rx::read_stream".to_string(), 812_000)));
    }
}
