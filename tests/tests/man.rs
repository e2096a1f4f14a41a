//! The man pages: xiw(7), xiw(8), xiwdv(7) and xiwdv(3), rendered by man-db
//! (`man -l`) with every groff warning turned on (`--warnings=w`), in a
//! UTF-8 locale and in the C locale (ASCII output). Each must render without
//! a single warning, with its NAME section and a body worth the name; a
//! deliberately broken page shows that the same command does report
//! warnings, the default ones and those only `w` enables.
//!
//! The pages are held to the code they describe: xiw(8) names every
//! subcommand the built `target/release/xiw` lists in `xiw --help`, and in
//! each subcommand's entry every option `xiw help SUBCOMMAND` prints; xiw(7)
//! documents every environment variable the provider, its engine, the direct
//! verbs and the tool read (found by scanning their source, so a new one
//! without documentation fails here), with the default the source gives it,
//! and every module parameter of `kernel-shim/*.c` with its type and default.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// The pages, relative to the repository.
const PAGES: [&str; 4] = [
    "docs/man/xiw.7",
    "docs/man/xiw.8",
    "xiwdv/man/xiwdv.7",
    "xiwdv/man/xiwdv.3",
];

/// The sources whose environment variables xiw(7) documents.
const ENV_SOURCES: [&str; 3] = ["provider/src", "provider/engine/src", "xiwdv/src"];

/// What `man -l` made of a page.
struct Rendered {
    /// Standard output, with the minus and hyphen characters some groff
    /// setups print for `\-` mapped to `-`.
    text: String,
    /// Standard error: groff's warnings, man's complaints.
    stderr: String,
    ok: bool,
}

fn repo() -> PathBuf {
    Path::new(REPO).to_path_buf()
}

/// Renders `page` as a reader's `man` does, 80 columns wide, with all of
/// groff's warnings on.
fn render(page: &Path, locale: &str) -> Rendered {
    let out = Command::new("man")
        .args(["--warnings=w", "-l"])
        .arg(page)
        .env("MANWIDTH", "80")
        .env("LC_ALL", locale)
        .env_remove("MANOPT")
        .env_remove("MANROFFOPT")
        .env_remove("MAN_KEEP_FORMATTING")
        .env_remove("GROFF_SGR")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running man -l {} (is man-db installed?): {e}",
                page.display()
            )
        });
    Rendered {
        text: String::from_utf8_lossy(&out.stdout).replace(['\u{2212}', '\u{2010}'], "-"),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        ok: out.status.success(),
    }
}

/// The page as a reader sees it, checked to render cleanly in both locales.
fn rendered(rel: &str) -> String {
    let page = repo().join(rel);
    assert!(page.is_file(), "{rel} is missing");
    let mut text = None;
    for locale in ["C.UTF-8", "C"] {
        let r = render(&page, locale);
        assert!(r.ok, "man -l {rel} failed ({locale}):\n{}", r.stderr);
        assert!(
            r.stderr.trim().is_empty(),
            "man -l {rel} warns ({locale}):\n{}",
            r.stderr
        );
        text.get_or_insert(r.text);
    }
    text.unwrap()
}

/// The text of the section headed `name` (a line of its own at the left
/// margin), up to the next such heading.
fn section<'a>(text: &'a str, name: &str) -> &'a str {
    let mut start = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let heading = !line.starts_with(char::is_whitespace) && !line.trim().is_empty();
        match start {
            None if heading && line.trim_end() == name => start = Some(offset + line.len()),
            Some(s) if heading => return &text[s..offset],
            _ => {}
        }
        offset += line.len();
    }
    match start {
        Some(s) => &text[s..],
        None => panic!("no section {name} in:\n{text}"),
    }
}

/// The entries of a section that are tagged paragraphs (`.TP`): each tag
/// line, at the section's indentation (7 columns), with the lines up to the
/// next tag.
fn entries(section: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in section.lines() {
        let tag = line.len() > 7
            && line.starts_with("       ")
            && !line[7..].starts_with(char::is_whitespace);
        if tag {
            out.push((line.trim().to_string(), String::new()));
        } else if let Some((_, body)) = out.last_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    out
}

/// Whether `word` occurs in `text` on its own: not as part of a longer name
/// or option.
fn names(text: &str, word: &str) -> bool {
    let part = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        !before.is_some_and(part) && !after.is_some_and(part)
    })
}

#[test]
fn every_page_renders_without_warnings() {
    for rel in PAGES {
        let text = rendered(rel);
        let file = Path::new(rel).file_name().unwrap().to_string_lossy();
        let (name, sect) = file.rsplit_once('.').unwrap();
        let title = format!("{}({sect})", name.to_uppercase());
        assert!(
            text.lines().next().is_some_and(|l| l.starts_with(&title)),
            "{rel}: the header is not {title}:\n{text}"
        );
        let name_section = section(&text, "NAME");
        assert!(
            names(name_section, name) && name_section.contains(" - "),
            "{rel}: the NAME section is not `{name} - ...`: {name_section:?}"
        );
        for heading in ["DESCRIPTION", "SEE ALSO"] {
            assert!(
                !section(&text, heading).trim().is_empty(),
                "{rel}: {heading} is empty"
            );
        }
        let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
        assert!(lines > 80, "{rel}: only {lines} lines rendered:\n{text}");
    }
}

/// The check above would pass on a man that hid groff's warnings: this page
/// has an undefined macro (a warning groff gives by default) and a negative
/// indent (one only `--warnings=w` turns on), and both must be reported, by
/// line.
#[test]
fn a_broken_page_is_caught() {
    let dir = std::env::temp_dir().join(format!("xiw-man-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let page = dir.join("broken.7");
    fs::write(
        &page,
        ".TH BROKEN 7 2026-12-01 xiw\n\
         .SH NAME\n\
         broken \\- a page with mistakes\n\
         .SH DESCRIPTION\n\
         .NOSUCHMACRO text\n\
         Some text.\n\
         .in -40n\n\
         More text.\n",
    )
    .unwrap();
    for locale in ["C.UTF-8", "C"] {
        let r = render(&page, locale);
        assert!(
            r.stderr.contains(":5:") && r.stderr.contains("warning"),
            "the undefined macro on line 5 went unreported ({locale}): {:?}",
            r.stderr
        );
        assert!(
            r.stderr.contains(":7:"),
            "the negative indent on line 7 went unreported ({locale}); are all warnings on? {:?}",
            r.stderr
        );
        assert!(
            r.text.contains("BROKEN(7)"),
            "it still renders: {:?}",
            r.text
        );
    }
    let _ = fs::remove_dir_all(&dir);
}

/// The built tool, as the test command builds it.
fn xiw() -> PathBuf {
    let bin = repo().join("target/release/xiw");
    assert!(
        bin.is_file(),
        "{} is missing: cargo build --release first",
        bin.display()
    );
    bin
}

fn help(args: &[&str]) -> String {
    let out = Command::new(xiw())
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("running xiw");
    assert!(out.status.success(), "xiw {args:?} failed: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The lines of `heading:` in clap's help, up to the next line at the left
/// margin (long help puts blank lines between the entries).
fn help_block<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| l.trim_end() != heading)
        .skip(1)
        .take_while(|l| l.trim().is_empty() || l.starts_with(char::is_whitespace))
        .filter(|l| !l.trim().is_empty())
        .collect()
}

/// The options clap lists in `text`: every `-x` and `--long` at the start
/// of an entry of its Options block (whatever follows, a value or the
/// description).
fn help_options(text: &str) -> Vec<String> {
    let mut v = Vec::new();
    for line in help_block(text, "Options:") {
        let entry = line.trim_start();
        if !entry.starts_with('-') {
            continue; // a description continued on its own line
        }
        for word in entry
            .split([',', ' '])
            .take_while(|w| w.is_empty() || w.starts_with('-'))
        {
            if word.len() > 1 {
                v.push(word.to_string());
            }
        }
    }
    assert!(!v.is_empty(), "no options in:\n{text}");
    v
}

#[test]
fn xiw_8_names_every_subcommand_and_option() {
    let page = rendered("docs/man/xiw.8");
    let synopsis = section(&page, "SYNOPSIS");
    let commands = entries(section(&page, "COMMANDS"));
    let options = section(&page, "OPTIONS");

    let top = help(&["--help"]);
    let subs: Vec<String> = help_block(&top, "Commands:")
        .iter()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    assert!(
        subs.len() >= 5,
        "xiw --help lists too few subcommands: {subs:?}"
    );
    for opt in help_options(&top) {
        assert!(
            names(options, &opt),
            "xiw.8's OPTIONS do not name {opt}:\n{options}"
        );
    }
    for sub in &subs {
        assert!(
            names(synopsis, &format!("xiw {sub}")),
            "xiw.8's SYNOPSIS does not name `xiw {sub}`:\n{synopsis}"
        );
        let Some((tag, body)) = commands
            .iter()
            .find(|(tag, _)| tag.split_whitespace().next() == Some(sub))
        else {
            panic!("xiw.8's COMMANDS have no entry for {sub}: {commands:?}");
        };
        if sub == "help" {
            continue;
        }
        let sub_opts = help_options(&help(&["help", sub]));
        // The parse must find what is known to be there (long help puts a
        // blank line between entries), or it checks too little.
        if sub == "up" {
            for known in ["--netdev", "--provider", "--root", "--help"] {
                assert!(
                    sub_opts.iter().any(|o| o == known),
                    "xiw help up: {known} not found in {sub_opts:?}"
                );
            }
        }
        for opt in sub_opts {
            if opt == "-h" || opt == "--help" {
                continue; // every subcommand's, under OPTIONS
            }
            assert!(
                names(tag, &opt) && names(body, &opt),
                "xiw.8's entry for {sub} does not name and describe {opt} \
                 (xiw help {sub} lists it):\n{tag}\n{body}"
            );
        }
    }
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The name in the string literal that starts right at `s` (after its
/// opening quote), if it looks like an environment variable's.
fn literal_name(s: &str) -> Option<&str> {
    let end = s.find('"')?;
    let name = &s[..end];
    let ok = !name.is_empty()
        && name.starts_with(|c: char| c.is_ascii_uppercase())
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    ok.then_some(name)
}

/// The environment variables the source reads or sets for programs: every
/// `"XIW_..."` literal, and the names given to `env::var`, `env::var_os`
/// and `Command::env`; with the default of those read as `num("NAME",
/// DEFAULT)`.
fn env_vars() -> BTreeMap<String, Option<String>> {
    let mut files = Vec::new();
    for dir in ENV_SOURCES {
        rust_files(&repo().join(dir), &mut files);
    }
    let mut vars: BTreeMap<String, Option<String>> = BTreeMap::new();
    for file in &files {
        let src = fs::read_to_string(file).unwrap();
        for (i, _) in src.match_indices("\"XIW_") {
            if let Some(name) = literal_name(&src[i + 1..]) {
                vars.entry(name.to_string()).or_default();
            }
        }
        for call in ["var(\"", "var_os(\"", ".env(\""] {
            for (i, _) in src.match_indices(call) {
                if let Some(name) = literal_name(&src[i + call.len()..]) {
                    vars.entry(name.to_string()).or_default();
                }
            }
        }
        for (i, _) in src.match_indices("num(\"") {
            let rest = &src[i + 5..];
            let Some(name) = literal_name(rest) else {
                continue;
            };
            let after = rest[name.len() + 1..].trim_start();
            let Some(arg) = after.strip_prefix(',') else {
                continue;
            };
            let default: String = arg
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '_')
                .filter(|c| *c != '_')
                .collect();
            if !default.is_empty() {
                vars.insert(name.to_string(), Some(default));
            }
        }
    }
    vars
}

#[test]
fn xiw_7_documents_every_environment_variable() {
    let vars = env_vars();
    // The scan must find what is known to be there, or it finds nothing.
    for known in [
        "XIW_CRC",
        "XIW_DEBUG",
        "XIW_COMPLETION",
        "XIW_PROVIDER",
        "SYSFS_PATH",
    ] {
        assert!(
            vars.contains_key(known),
            "the scan missed {known}: {vars:?}"
        );
    }
    assert_eq!(vars["XIW_CONNECT_TIMEOUT_MS"].as_deref(), Some("10000"));

    let page = rendered("docs/man/xiw.7");
    let env = entries(section(&page, "ENVIRONMENT"));
    for (var, default) in &vars {
        let Some((_, body)) = env
            .iter()
            .find(|(tag, _)| tag.split(", ").any(|t| t == var))
        else {
            panic!("xiw.7's ENVIRONMENT has no entry for {var}, which the source reads");
        };
        if let Some(d) = default {
            assert!(
                body.contains(&format!("Default {d}.")),
                "xiw.7 gives {var} another default than the source's {d}:\n{body}"
            );
        }
    }
}

/// `module_param(NAME, TYPE, PERM)` of the module's source, with the
/// initialiser of `static ... NAME = VALUE;` as its default (0 for a
/// `static ... NAME;` without one, as C has it and the kernel's style asks).
fn module_params() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let dir = repo().join("kernel-shim");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "c"))
        .collect();
    files.sort();
    for file in files {
        let src = fs::read_to_string(&file).unwrap();
        for (i, _) in src.match_indices("module_param(") {
            let args = &src[i + "module_param(".len()..];
            let args = &args[..args.find(')').expect("module_param's closing parenthesis")];
            let words: Vec<&str> = args.split(',').map(str::trim).collect();
            let [name, kind, _perm] = words[..] else {
                panic!("{}: module_param({args})", file.display());
            };
            let decl = src
                .lines()
                .find(|l| {
                    l.starts_with("static ")
                        && (l.contains(&format!(" {name} = ")) || l.ends_with(&format!(" {name};")))
                })
                .unwrap_or_else(|| panic!("{}: no declaration of {name}", file.display()));
            let value = decl
                .split(" = ")
                .nth(1)
                .map_or("0", |v| v.trim_end_matches(';').trim());
            let value = match value {
                "true" => "1",
                "false" => "0",
                v => v,
            };
            out.push((name.to_string(), kind.to_string(), value.to_string()));
        }
    }
    out
}

#[test]
fn xiw_7_documents_every_module_parameter() {
    let params = module_params();
    assert!(
        params.iter().any(|(n, _, _)| n == "mpa_crc"),
        "the scan missed mpa_crc: {params:?}"
    );
    let page = rendered("docs/man/xiw.7");
    let section = section(&page, "MODULE PARAMETERS");
    assert!(
        section.contains("/sys/module/xiw/parameters/"),
        "xiw.7 does not say where the parameters are:\n{section}"
    );
    let documented = entries(section);
    for (name, kind, default) in &params {
        let tag = format!("{name} ({kind}, default {default})");
        assert!(
            documented
                .iter()
                .any(|(t, body)| *t == tag && !body.trim().is_empty()),
            "xiw.7's MODULE PARAMETERS have no entry `{tag}`: {documented:?}"
        );
    }
}
