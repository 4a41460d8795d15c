//! Every deploy file parses, and every command shown in the README exists with those flags.

use std::path::{Path, PathBuf};

use clap::Parser;
use stemcell_gallery::cli::Cli;

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

#[test]
fn every_deploy_file_parses() {
    let mut all = Vec::new();
    files(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy")
            .as_path(),
        &mut all,
    );
    let mut checked = 0;
    for p in &all {
        let text = std::fs::read_to_string(p).unwrap();
        match p.extension().and_then(|e| e.to_str()) {
            Some("json") => {
                serde_json::from_str::<serde_json::Value>(&text)
                    .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            }
            Some("yml") | Some("yaml") => {
                for doc in serde_yaml_ng::Deserializer::from_str(&text) {
                    let v: serde_yaml_ng::Value = serde::Deserialize::deserialize(doc)
                        .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
                    assert!(!v.is_null(), "{}: empty YAML document", p.display());
                }
            }
            Some("service") | Some("timer") => check_unit(p, &text),
            _ => continue,
        }
        checked += 1;
    }
    assert!(checked >= 4, "found only {checked} deploy files");
}

/// systemd unit syntax: sections in brackets, `Key=value` lines, comments, nothing else.
fn check_unit(p: &Path, text: &str) {
    let mut section = None;
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            assert!(
                line.ends_with(']'),
                "{}:{}: bad section header",
                p.display(),
                n + 1
            );
            section = Some(line.to_string());
            continue;
        }
        assert!(
            section.is_some(),
            "{}:{}: key outside a section",
            p.display(),
            n + 1
        );
        let (k, _) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("{}:{}: not Key=value: {line}", p.display(), n + 1));
        assert!(
            !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric()),
            "{}:{}: bad key {k:?}",
            p.display(),
            n + 1
        );
    }
    let want = if p.extension().unwrap() == "timer" {
        "[Timer]"
    } else {
        "[Service]"
    };
    assert!(text.contains(want), "{}: no {want} section", p.display());
}

/// Split a shell line into words (double/single quotes, no expansion).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"') | (None, '\'') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if !cur.is_empty() || any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            (None, c) => cur.push(c),
        }
    }
    if !cur.is_empty() || any {
        out.push(cur);
    }
    out
}

#[test]
fn every_command_in_the_readme_parses() {
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let mut in_code = false;
    let mut pending = String::new();
    let mut commands = Vec::new();
    for line in readme.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if !in_code {
            continue;
        }
        let l = line.trim();
        if let Some(stripped) = l.strip_suffix('\\') {
            pending.push_str(stripped);
            pending.push(' ');
            continue;
        }
        pending.push_str(l);
        let full = std::mem::take(&mut pending);
        let full = full.trim();
        let rest = if let Some(r) = full.strip_prefix("stemcell-gallery ") {
            r.to_string()
        } else if let Some(idx) = full.find("cargo run --release -- ") {
            full[idx + "cargo run --release -- ".len()..].to_string()
        } else {
            continue;
        };
        // Drop redirections and pipes.
        let rest = rest
            .split(['>', '|'])
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
        commands.push(rest);
    }
    assert!(
        commands.len() >= 8,
        "found only {} commands",
        commands.len()
    );
    for c in commands {
        let mut argv = vec!["stemcell-gallery".to_string()];
        argv.extend(words(&c));
        if let Err(e) = Cli::try_parse_from(&argv) {
            panic!("README command `{c}` does not parse: {e}");
        }
    }
}
