//! A sweep over message sizes: what `xiw-bench --sweep` measures and writes
//! as JSON, what the guest benchmark's `BENCH` lines turn into, and what
//! `xiw-bench --plot` draws.
//!
//! The JSON (`schema` "xiw-bench-sweep/1"):
//!
//! ```text
//! { "schema": "xiw-bench-sweep/1",
//!   "tool": "xiw-bench --sweep",            the command that measured
//!   "title": "xiw standalone on lo ...",    what was compared, where
//!   "machine": { "cpus": 2, "cpu": "...", "kernel": "6.1.0-...",
//!                "date": "2025-01-31T12:00:00Z", "xiw_version": "0.1.0",
//!                "rdma_core": "...", "perftest": "...", "load": "..." },
//!   "sizes": [2, 4, ..., 8388608],          every size measured, bytes
//!   "series": [ { "name": "xiw standalone: RDMA Write (ib_write_lat)",
//!                 "kind": "latency" | "bandwidth",
//!                 "unit": "us" | "MiB/s",
//!                 "measure": "what the value is",
//!                 "command": "how it was measured",
//!                 "device": "xiw-standalone",  as the BENCH lines name it
//!                 "test": "ib_write_lat",      (both absent in older files)
//!                 "points": [ { "bytes": 2, "value": 3.71 }, ... ],
//!                 "failed": [ 4096 ] },     sizes that gave no number
//!               ... ],
//!   "notes": [ "..." ] }
//! ```
//!
//! A size a series could not measure has no point (and is in `failed` when
//! the run said so). MiB/s is 2^20 bytes per second: perftest's "MB/sec" (it
//! divides by 0x100000) and the TCP stream's; the guest converts qperf's
//! decimal MB/sec to it. Latency is in microseconds.
//!
//! The guest's lines, one per value: `BENCH DEVICE TEST_SIZE VALUE` (as
//! tests/vm/guest/bench.sh prints them, VALUE a number, `failed`, or `n/a`
//! for a test the device cannot run, which is left out), and
//! `BENCH info KEY TEXT...` for the machine (`kernel`, `cpus`, `cpu`) and
//! notes (`note`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const SCHEMA: &str = "xiw-bench-sweep/1";

/// The sizes perftest's `-a` runs: 2 B to 8 MiB, powers of two.
pub fn perftest_sizes() -> Vec<u64> {
    (1..24).map(|k| 1u64 << k).collect()
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Sweep {
    pub schema: String,
    pub tool: String,
    pub title: String,
    pub machine: Machine,
    pub sizes: Vec<u64>,
    pub series: Vec<Series>,
    #[serde(default)]
    pub notes: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct Machine {
    pub cpus: usize,
    pub cpu: String,
    pub kernel: String,
    /// When the sweep ended, UTC, RFC 3339.
    pub date: String,
    pub xiw_version: String,
    #[serde(default)]
    pub rdma_core: String,
    #[serde(default)]
    pub perftest: String,
    /// Load average (1/5/15 min) at the start and the end.
    #[serde(default)]
    pub load: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Latency,
    Bandwidth,
}

impl Kind {
    /// The unit every series of this kind is in.
    pub fn unit(self) -> &'static str {
        match self {
            Kind::Latency => "us",
            Kind::Bandwidth => "MiB/s",
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub kind: Kind,
    pub unit: String,
    pub measure: String,
    pub command: String,
    /// The device and the test as the BENCH lines name them.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub device: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub test: String,
    pub points: Vec<Point>,
    /// Sizes whose run gave no number.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed: Vec<u64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub bytes: u64,
    pub value: f64,
}

/// What a device is called in a legend.
pub fn device_label(dev: &str) -> String {
    match dev {
        "xiw-kernel" => "xiw kernel mode".into(),
        "xiw-kernel-crc" => "xiw kernel mode, CRC".into(),
        "xiw-standalone" => "xiw standalone".into(),
        "siw" => "siw".into(),
        "rxe" => "rxe (RoCE v2)".into(),
        "tcp" => "TCP".into(),
        other => other.into(),
    }
}

/// A test's legend text, kind, what its value is, and how it is run.
pub fn test_info(test: &str) -> (String, Kind, String, String) {
    let lat_perftest = "perftest t_typical: median of the round trips / 2";
    let lat_qperf = "qperf's mean: the run's time over the messages both ends received, each end waiting on a completion channel";
    match test {
        "ib_write_lat" => (
            "RDMA Write (ib_write_lat)".into(),
            Kind::Latency,
            format!("one-way latency, {lat_perftest}"),
            "ib_write_lat -a".into(),
        ),
        "ib_send_lat" => (
            "Send (ib_send_lat)".into(),
            Kind::Latency,
            format!("one-way latency, {lat_perftest}"),
            "ib_send_lat -a".into(),
        ),
        "ib_read_lat" => (
            "RDMA Read, round trip (ib_read_lat)".into(),
            Kind::Latency,
            "round trip, perftest t_typical (a read is not halved): median".into(),
            "ib_read_lat -a".into(),
        ),
        "ib_write_bw" => (
            "RDMA Write (ib_write_bw)".into(),
            Kind::Bandwidth,
            "perftest BW average [MB/sec], MB = 2^20 bytes".into(),
            "ib_write_bw -a".into(),
        ),
        "ib_write_bw_q4_bidir" => (
            "RDMA Write, 4 QPs, both ways (ib_write_bw -q 4 -b)".into(),
            Kind::Bandwidth,
            "perftest BW average [MB/sec] of both directions over the 4 QPs, summed (perftest adds the two ends' reports), MB = 2^20 bytes".into(),
            "ib_write_bw -q 4 -b".into(),
        ),
        "qperf_rc_lat" => (
            "Send, blocking (qperf rc_lat)".into(),
            Kind::Latency,
            format!("one-way latency, {lat_qperf}"),
            "qperf -cm1 rc_lat".into(),
        ),
        "qperf_rc_rdma_write_lat" => (
            "RDMA Write with Immediate, blocking (qperf rc_rdma_write_lat)".into(),
            Kind::Latency,
            format!("one-way latency, {lat_qperf}"),
            "qperf -cm1 rc_rdma_write_lat".into(),
        ),
        "qperf_rc_bw" => (
            "Send stream (qperf rc_bw)".into(),
            Kind::Bandwidth,
            "qperf's receive bandwidth, its decimal MB/sec converted to 2^20 bytes per second".into(),
            "qperf -cm1 rc_bw".into(),
        ),
        "lat-spin" => (
            "ping-pong, busy-poll".into(),
            Kind::Latency,
            "one-way latency: median of the round trips / 2, TCP_NODELAY, both ends spinning on non-blocking recv()".into(),
            "xiw-bench floor-client lat-spin".into(),
        ),
        "lat-block" => (
            "ping-pong, blocking".into(),
            Kind::Latency,
            "one-way latency: median of the round trips / 2, TCP_NODELAY, both ends blocking in recv()".into(),
            "xiw-bench floor-client lat-block".into(),
        ),
        "bw" => (
            "stream".into(),
            Kind::Bandwidth,
            "bytes / time from the first write() to the receiver's acknowledgement of the last byte, one write() per message, TCP_NODELAY".into(),
            "xiw-bench floor-client bw".into(),
        ),
        other => {
            let kind = if other.ends_with("_bw") || other.starts_with("bw") {
                Kind::Bandwidth
            } else {
                Kind::Latency
            };
            (other.into(), kind, String::new(), other.into())
        }
    }
}

/// A test's name in a few words (a group of bars): the program and what
/// sets it apart, each a line; a long qperf test name in two, at the `_`
/// nearest its middle.
pub fn test_short(test: &str) -> Vec<String> {
    let lines: &[&str] = match test {
        "ib_write_bw_q4_bidir" => &["ib_write_bw", "-q 4 -b, sum"],
        "lat-spin" => &["TCP ping-pong", "busy-poll"],
        "lat-block" => &["TCP ping-pong", "blocking"],
        "bw" => &["TCP stream"],
        other => match other.strip_prefix("qperf_") {
            Some(t) => {
                let mut v = vec!["qperf".to_string()];
                let mid = t.len() / 2;
                let cut = t
                    .match_indices('_')
                    .map(|(i, _)| i)
                    .min_by_key(|i| i.abs_diff(mid));
                match cut {
                    Some(i) if t.len() > 12 => {
                        v.push(t[..i].to_string());
                        v.push(t[i + 1..].to_string());
                    }
                    _ => v.push(t.to_string()),
                }
                return v;
            }
            None => return vec![other.into()],
        },
    };
    lines.iter().map(|l| l.to_string()).collect()
}

/// A series of `test` on `dev` (both as the BENCH lines name them).
pub fn series(dev: &str, test: &str, points: Vec<Point>) -> Series {
    let (label, kind, measure, command) = test_info(test);
    Series {
        name: format!("{}: {label}", device_label(dev)),
        kind,
        unit: kind.unit().into(),
        measure,
        command,
        device: dev.into(),
        test: test.into(),
        points,
        failed: Vec::new(),
    }
}

impl Sweep {
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a sweep serialises")
    }

    pub fn from_json(text: &str) -> Result<Sweep, String> {
        let s: Sweep = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if s.schema != SCHEMA {
            return Err(format!("schema {:?}, not {SCHEMA:?}", s.schema));
        }
        Ok(s)
    }

    /// The series of one kind that have at least one point.
    pub fn of_kind(&self, kind: Kind) -> Vec<&Series> {
        self.series
            .iter()
            .filter(|s| s.kind == kind && !s.points.is_empty())
            .collect()
    }

    /// A sweep from the guest benchmark's `BENCH` lines (anything else in
    /// `text` is ignored). Series keep the order of their first line; the
    /// points of a series are sorted by size. A test a device cannot run
    /// (`n/a`) makes no series; any other value that is not a number is a
    /// failed size of its series, and a note.
    pub fn from_bench_lines(text: &str, tool: &str, title: &str, machine: Machine) -> Sweep {
        let mut m = machine;
        let mut notes = Vec::new();
        let mut order: Vec<(String, String)> = Vec::new();
        let mut points: BTreeMap<(String, String), Vec<Point>> = BTreeMap::new();
        let mut failed: BTreeMap<(String, String), Vec<u64>> = BTreeMap::new();
        for line in text.lines() {
            let t: Vec<&str> = line.split_whitespace().collect();
            match t.as_slice() {
                ["BENCH", "info", key, rest @ ..] => {
                    let v = rest.join(" ");
                    match *key {
                        "kernel" => m.kernel = v,
                        "cpus" => m.cpus = v.parse().unwrap_or(0),
                        "cpu" => m.cpu = v,
                        "rdma_core" => m.rdma_core = v,
                        "perftest" => m.perftest = v,
                        _ => notes.push(v),
                    }
                }
                ["BENCH", dev, test_size, value] => {
                    let Some((test, size)) = test_size.rsplit_once('_') else {
                        continue;
                    };
                    let Ok(bytes) = size.parse::<u64>() else {
                        continue;
                    };
                    if *value == "n/a" {
                        continue;
                    }
                    let key = (dev.to_string(), test.to_string());
                    if !order.contains(&key) {
                        order.push(key.clone());
                    }
                    match value.parse::<f64>() {
                        Ok(value) if value.is_finite() => {
                            points.entry(key).or_default().push(Point { bytes, value })
                        }
                        _ => {
                            failed.entry(key).or_default().push(bytes);
                            notes.push(format!("{dev} {test} {bytes} B: {value}"));
                        }
                    }
                }
                _ => {}
            }
        }
        let mut sizes: Vec<u64> = points.values().flatten().map(|p| p.bytes).collect();
        sizes.sort_unstable();
        sizes.dedup();
        let series = order
            .into_iter()
            .map(|k| {
                let mut p = points.remove(&k).unwrap_or_default();
                p.sort_by_key(|p| p.bytes);
                let mut f = failed.remove(&k).unwrap_or_default();
                f.sort_unstable();
                f.dedup();
                Series {
                    failed: f,
                    ..series(&k.0, &k.1, p)
                }
            })
            .collect();
        Sweep {
            schema: SCHEMA.into(),
            tool: tool.into(),
            title: title.into(),
            machine: m,
            sizes,
            series,
            notes,
        }
    }
}

/// A size as the axis shows it: 2 B, 512 B, 1 KiB, 8 MiB.
pub fn size_label(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = bytes;
    let mut u = 0;
    while v >= 1024 && v.is_multiple_of(1024) && u + 1 < UNITS.len() {
        v /= 1024;
        u += 1;
    }
    format!("{v} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Sweep {
        let m = Machine {
            cpus: 2,
            cpu: "Some CPU @ 2.0GHz".into(),
            kernel: "6.1.0-test".into(),
            date: "2025-01-31T12:00:00Z".into(),
            xiw_version: "0.1.0".into(),
            ..Machine::default()
        };
        Sweep {
            schema: SCHEMA.into(),
            tool: "xiw-bench --sweep".into(),
            title: "test".into(),
            machine: m,
            sizes: perftest_sizes(),
            series: vec![
                series(
                    "xiw-standalone",
                    "ib_write_lat",
                    vec![
                        Point {
                            bytes: 2,
                            value: 3.25,
                        },
                        Point {
                            bytes: 8 << 20,
                            value: 2890.5,
                        },
                    ],
                ),
                series(
                    "tcp",
                    "bw",
                    vec![Point {
                        bytes: 65536,
                        value: 1795.4,
                    }],
                ),
            ],
            notes: vec!["a note".into()],
        }
    }

    #[test]
    fn json_round_trip() {
        let s = sample();
        let text = s.to_json();
        assert!(text.contains("\"kind\": \"latency\""), "{text}");
        assert!(text.contains("\"unit\": \"MiB/s\""), "{text}");
        let back = Sweep::from_json(&text).expect("parses");
        assert_eq!(back, s);
        assert_eq!(back.of_kind(Kind::Bandwidth).len(), 1);
        let other = text.replace(SCHEMA, "something-else/1");
        assert!(Sweep::from_json(&other).is_err());
        assert!(Sweep::from_json("{}").is_err());
    }

    #[test]
    fn bench_lines_to_series() {
        let text = "\
XIW-VM-START
BENCH info kernel 6.1.0-31-amd64
BENCH info cpus 2
BENCH info note ib_write_lat -a -n 100 -R
BENCH tcp lat-spin_4 21.5
BENCH tcp lat-spin_2 20.25
BENCH siw ib_write_lat_2 30.5
BENCH siw ib_write_lat_4 failed
BENCH xiw-kernel ib_write_bw_1048576 310.75
--- server (0)
";
        let s = Sweep::from_bench_lines(
            text,
            "tests/vm/bench.sh --sweep",
            "guest",
            Machine::default(),
        );
        assert_eq!(s.machine.kernel, "6.1.0-31-amd64");
        assert_eq!(s.machine.cpus, 2);
        assert_eq!(s.sizes, vec![2, 4, 1048576]);
        let names: Vec<&str> = s.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "TCP: ping-pong, busy-poll",
                "siw: RDMA Write (ib_write_lat)",
                "xiw kernel mode: RDMA Write (ib_write_bw)"
            ]
        );
        let p: Vec<(u64, f64)> = s.series[0]
            .points
            .iter()
            .map(|p| (p.bytes, p.value))
            .collect();
        assert_eq!(p, [(2, 20.25), (4, 21.5)]);
        assert_eq!(s.series[1].points.len(), 1);
        assert_eq!(s.series[1].failed, [4]);
        assert_eq!(s.series[0].failed, [0u64; 0]);
        assert_eq!(
            (s.series[1].device.as_str(), s.series[1].test.as_str()),
            ("siw", "ib_write_lat")
        );
        assert_eq!(s.series[2].kind, Kind::Bandwidth);
        assert_eq!(s.series[2].unit, "MiB/s");
        assert_eq!(
            s.notes,
            ["ib_write_lat -a -n 100 -R", "siw ib_write_lat 4 B: failed"]
        );
    }

    #[test]
    fn one_boot_lines() {
        let text = "\
BENCH tcp lat-block_2 60.1
BENCH xiw-standalone qperf_rc_lat_2 n/a
BENCH xiw-standalone ib_write_bw_q4_bidir_65536 98.5
BENCH xiw-kernel qperf_rc_lat_2 88.25
BENCH xiw-kernel qperf_rc_bw_65536 failed
BENCH siw qperf_rc_rdma_write_lat_65536 failed
BENCH siw qperf_rc_rdma_write_lat_2 failed
";
        let s = Sweep::from_bench_lines(text, "tests/vm/bench.sh", "one boot", Machine::default());
        let got: Vec<(&str, &str, Kind, usize, &[u64])> = s
            .series
            .iter()
            .map(|s| {
                (
                    s.device.as_str(),
                    s.test.as_str(),
                    s.kind,
                    s.points.len(),
                    s.failed.as_slice(),
                )
            })
            .collect();
        // n/a makes no series; a series of failures alone is kept.
        assert_eq!(
            got,
            [
                ("tcp", "lat-block", Kind::Latency, 1, &[][..]),
                (
                    "xiw-standalone",
                    "ib_write_bw_q4_bidir",
                    Kind::Bandwidth,
                    1,
                    &[][..]
                ),
                ("xiw-kernel", "qperf_rc_lat", Kind::Latency, 1, &[][..]),
                (
                    "xiw-kernel",
                    "qperf_rc_bw",
                    Kind::Bandwidth,
                    0,
                    &[65536][..]
                ),
                (
                    "siw",
                    "qperf_rc_rdma_write_lat",
                    Kind::Latency,
                    0,
                    &[2, 65536][..]
                ),
            ]
        );
        assert_eq!(s.sizes, [2, 65536]);
        assert_eq!(s.notes.len(), 3, "{:?}", s.notes);
        // Series without points are left out of the line pictures.
        assert_eq!(s.of_kind(Kind::Bandwidth).len(), 1);
        let back = Sweep::from_json(&s.to_json()).expect("parses");
        assert_eq!(back, s);
    }

    #[test]
    fn older_files_without_device_or_failures() {
        let text = r#"{ "schema": "xiw-bench-sweep/1", "tool": "t", "title": "t",
            "machine": { "cpus": 2, "cpu": "c", "kernel": "k", "date": "d", "xiw_version": "v" },
            "sizes": [2],
            "series": [ { "name": "TCP: stream", "kind": "bandwidth", "unit": "MiB/s",
                          "measure": "m", "command": "c", "points": [ { "bytes": 2, "value": 1.5 } ] } ] }"#;
        let s = Sweep::from_json(text).expect("parses");
        assert_eq!(s.series[0].device, "");
        assert!(s.series[0].failed.is_empty());
        assert!(!s.to_json().contains("\"failed\""));
    }

    #[test]
    fn short_test_names() {
        assert_eq!(
            test_short("qperf_rc_rdma_write_lat"),
            ["qperf", "rc_rdma", "write_lat"]
        );
        assert_eq!(test_short("qperf_rc_lat"), ["qperf", "rc_lat"]);
        assert_eq!(
            test_short("ib_write_bw_q4_bidir"),
            ["ib_write_bw", "-q 4 -b, sum"]
        );
        assert_eq!(test_short("ib_read_lat"), ["ib_read_lat"]);
        assert_eq!(test_short("lat-spin"), ["TCP ping-pong", "busy-poll"]);
    }

    #[test]
    fn size_labels() {
        assert_eq!(size_label(2), "2 B");
        assert_eq!(size_label(512), "512 B");
        assert_eq!(size_label(2048), "2 KiB");
        assert_eq!(size_label(8 << 20), "8 MiB");
        assert_eq!(size_label(1536), "1536 B");
    }
}
