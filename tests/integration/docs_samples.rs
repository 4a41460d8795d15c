//! Every console sample in README.md and docs/*.md runs, as written, and prints what the sample
//! shows (issue 31 item 1): a sample cannot go stale.
//!
//! A sample is a ```` ```console ```` block: lines starting with `$ ` are commands, the lines
//! after a command are what it prints (stdout and stderr, in the order they came), and a last
//! line `[exit status N]` says it exits non-zero. The blocks of one file run in order in one bash
//! session from the repository's root (variables, files and a background emulator carry from one
//! command to the next), with the debug build first on `PATH` and no setting of the test
//! process's environment leaking in. Blocks fenced ```` ```text ```` (or anything but
//! `console`) are not run.
//!
//! What differs on every run is normalised on both sides before they are compared: times,
//! UUIDs (so CIDs and blob names), loopback ports, process ids, durations and rates, and runs of
//! spaces (table columns widen with a port's digits). A sample line `...` matches any number of
//! lines, and `[..]` inside a line matches any text. Anything else must be equal.
//!
//! `DOCS_SAMPLES=overwrite cargo test --test integration docs_samples` rewrites each sample's
//! output with what the commands printed (then review the diff).

use std::path::{Path, PathBuf};

use regex::Regex;

/// One command of a sample and what the sample says it prints.
#[derive(Debug, Clone)]
struct Sample {
    /// 1-based line of the command in its file.
    line: usize,
    command: String,
    expected: Vec<String>,
    exit: i32,
}

/// A console block: where its body starts and ends (0-based line indexes, body only).
#[derive(Debug)]
struct Block {
    start: usize,
    end: usize,
    samples: Vec<Sample>,
}

fn blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() != "```console" {
            i += 1;
            continue;
        }
        let start = i + 1;
        let mut end = start;
        while end < lines.len() && lines[end].trim_end() != "```" {
            end += 1;
        }
        let mut samples: Vec<Sample> = Vec::new();
        for (n, l) in lines[start..end].iter().enumerate() {
            if let Some(cmd) = l.strip_prefix("$ ") {
                samples.push(Sample {
                    line: start + n + 1,
                    command: cmd.to_string(),
                    expected: Vec::new(),
                    exit: 0,
                });
            } else if let Some(s) = samples.last_mut() {
                match l
                    .strip_prefix("[exit status ")
                    .and_then(|r| r.strip_suffix(']'))
                {
                    Some(code) => s.exit = code.parse().unwrap_or(-1),
                    None => s.expected.push(l.to_string()),
                }
            }
        }
        out.push(Block {
            start,
            end,
            samples,
        });
        i = end + 1;
    }
    out
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What each command of `samples` printed, and its exit status, run in one bash session.
fn run_session(samples: &[&Sample]) -> Vec<(String, i32)> {
    const MARK: &str = "@@@docs-sample@@@";
    let mut script = String::from("set +e\n");
    for (i, s) in samples.iter().enumerate() {
        script.push_str(&format!(
            "printf '\\n{MARK} {i}\\n'\n{{\n{}\n}} 2>&1\nprintf '\\n{MARK} exit %s\\n' \"$?\"\n",
            s.command
        ));
    }
    // The session's background processes (an emulator) end with it.
    script.push_str("kill $(jobs -p) 2>/dev/null; wait 2>/dev/null\n");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_stemcell-gallery"));
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // A sample that never ends (a server in the foreground) fails the test instead of hanging
    // it: GNU timeout signals the whole session, background emulator included.
    let mut cmd = std::process::Command::new("timeout");
    cmd.args(["-k", "5", "600", "bash", "-c"])
        .arg(&script)
        .current_dir(root());
    // Nothing of the test process's settings: only what the samples set themselves.
    for (k, _) in std::env::vars() {
        if k.starts_with("STEMCELL_GALLERY_")
            || k.starts_with("AZURE_")
            || k == "RUST_LOG"
            || k == "NO_COLOR"
        {
            cmd.env_remove(&k);
        }
    }
    cmd.env("PATH", path).env("NO_COLOR", "1");
    let out = cmd.output().expect("bash runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut results = vec![(String::new(), -1); samples.len()];
    let mut current: Option<usize> = None;
    let mut buf: Vec<&str> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(MARK) {
            let rest = rest.trim();
            if let Some(code) = rest.strip_prefix("exit ") {
                if let Some(i) = current.take() {
                    // The printf before the mark adds one empty line.
                    while buf.last().is_some_and(|l| l.is_empty()) {
                        buf.pop();
                    }
                    results[i] = (buf.join("\n"), code.trim().parse().unwrap_or(-1));
                }
                buf.clear();
            } else if let Ok(i) = rest.parse::<usize>() {
                current = Some(i);
                buf.clear();
            }
        } else if current.is_some() {
            buf.push(line);
        }
    }
    results
}

/// What differs on every run, and what replaces it (compiled once: every line of every sample
/// goes through them).
static RULES: std::sync::LazyLock<Vec<(Regex, &'static str)>> = std::sync::LazyLock::new(|| {
    let rules: &[(&str, &'static str)] = &[
        (
            r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)",
            "<time>",
        ),
        (
            r"(?i)[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "<uuid>",
        ),
        (r"127\.0\.0\.1:\d+", "127.0.0.1:<port>"),
        (r#""(pid|mib_per_s|seconds)":\s*[\d.]+"#, r#""$1":<n>"#),
        (r"process \d+", "process <n>"),
        (r"\d+(\.\d+)? (B|KiB|MiB|GiB)/s", "<rate>"),
        (r#"seconds="?[\d.]+"?"#, "seconds=<n>"),
        (r"\b\d+(\.\d+)? ?(s|ms)\b", "<duration>"),
        (r"[ \t]+", " "),
    ];
    rules
        .iter()
        .map(|(pattern, with)| (Regex::new(pattern).unwrap(), *with))
        .collect()
});

/// Both sides with what differs on every run replaced.
fn normalise(text: &str) -> String {
    let mut out = text.to_string();
    for (pattern, with) in RULES.iter() {
        out = pattern.replace_all(&out, *with).to_string();
    }
    out.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `actual` matches `expected` (`...` lines, `[..]` in a line), both normalised.
fn matches(expected: &[String], actual: &str) -> bool {
    let exp: Vec<String> = expected.iter().map(|l| normalise(l)).collect();
    let act: Vec<String> = normalise(actual).lines().map(str::to_string).collect();
    fn line_matches(pattern: &str, line: &str) -> bool {
        if !pattern.contains("[..]") {
            return pattern == line;
        }
        let parts: Vec<&str> = pattern.split("[..]").collect();
        let mut rest = line;
        for (i, p) in parts.iter().enumerate() {
            if i == 0 {
                let Some(r) = rest.strip_prefix(p) else {
                    return false;
                };
                rest = r;
            } else if i == parts.len() - 1 {
                return rest.ends_with(p);
            } else {
                let Some(at) = rest.find(p) else {
                    return false;
                };
                rest = &rest[at + p.len()..];
            }
        }
        true
    }
    fn go(exp: &[String], act: &[String]) -> bool {
        match exp.split_first() {
            None => act.is_empty(),
            Some((e, rest)) if e.trim() == "..." => {
                (0..=act.len()).any(|skip| go(rest, &act[skip..]))
            }
            Some((e, rest)) => !act.is_empty() && line_matches(e, &act[0]) && go(rest, &act[1..]),
        }
    }
    go(&exp, &act)
}

/// The Markdown files whose samples run.
fn documents() -> Vec<PathBuf> {
    let mut out = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    out.extend(docs);
    out
}

fn check_document(path: &Path, overwrite: bool) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let blocks = blocks(&text);
    let samples: Vec<&Sample> = blocks.iter().flat_map(|b| b.samples.iter()).collect();
    if samples.is_empty() {
        return Vec::new();
    }
    let results = run_session(&samples);
    let shown = path
        .strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string();
    let mut failures = Vec::new();
    for (s, (actual, code)) in samples.iter().zip(&results) {
        if *code != s.exit || !matches(&s.expected, actual) {
            failures.push(format!(
                "{shown}:{}: $ {}\n--- the sample shows (exit {}):\n{}\n--- it printed (exit {code}):\n{actual}\n",
                s.line,
                s.command,
                s.exit,
                s.expected.join("\n")
            ));
        }
    }
    if overwrite && !failures.is_empty() {
        let lines: Vec<&str> = text.lines().collect();
        let mut out: Vec<String> = Vec::new();
        let mut next = 0;
        let mut k = 0;
        for b in &blocks {
            out.extend(lines[next..b.start].iter().map(|l| l.to_string()));
            for s in &b.samples {
                let (actual, code) = &results[k];
                k += 1;
                out.push(format!("$ {}", s.command));
                if *code == s.exit && matches(&s.expected, actual) {
                    out.extend(s.expected.iter().cloned());
                } else {
                    out.extend(actual.lines().map(str::to_string));
                }
                if *code != 0 {
                    out.push(format!("[exit status {code}]"));
                }
            }
            next = b.end;
        }
        out.extend(lines[next..].iter().map(|l| l.to_string()));
        let mut written = out.join("\n");
        if text.ends_with('\n') {
            written.push('\n');
        }
        std::fs::write(path, written).unwrap();
    }
    failures
}

#[test]
fn every_console_sample_in_the_docs_prints_what_it_shows() {
    let overwrite = std::env::var("DOCS_SAMPLES").as_deref() == Ok("overwrite");
    let mut failures = Vec::new();
    for doc in documents() {
        failures.extend(check_document(&doc, overwrite));
    }
    assert!(
        failures.is_empty(),
        "{} samples differ from what they print{}:\n\n{}",
        failures.len(),
        if overwrite {
            " (rewritten: review the diff)"
        } else {
            " (DOCS_SAMPLES=overwrite rewrites them)"
        },
        failures.join("\n")
    );
}

#[test]
fn the_sample_matcher_normalises_what_changes_and_nothing_else() {
    let exp = |s: &str| s.lines().map(str::to_string).collect::<Vec<_>>();
    assert!(matches(
        &exp("2026-11-29T20:46:58.169938Z  INFO blob=stemcell/bosh-stemcell-79dbb08e-002c-4ce1-a654-e881d36a28bc.vhd\n  time:   0.1 s (34 MiB/s)"),
        "2026-12-03T01:02:03.4Z INFO blob=stemcell/bosh-stemcell-11111111-2222-4333-8444-555555555555.vhd\n  time: 12.7 s (3.1 MiB/s)"
    ));
    assert!(!matches(&exp("created 1.506.0"), "created 1.507.0"));
    assert!(matches(&exp("a\n...\nz"), "a\nb\nc\nz"));
    assert!(matches(&exp("a\n...\nz"), "a\nz"));
    assert!(!matches(&exp("a\n...\nz"), "a\nb"));
    assert!(matches(
        &exp("id: [..]/versions/1.506.0"),
        "id: /x/y/versions/1.506.0"
    ));
    assert!(!matches(
        &exp("id: [..]/versions/1.506.0"),
        "id: /x/versions/1.507.0"
    ));
    assert!(matches(
        &exp(r#"{"arm":"http://127.0.0.1:41839","pid":7684}"#),
        r#"{"arm":"http://127.0.0.1:5","pid":1}"#
    ));
}
