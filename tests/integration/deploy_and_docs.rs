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

/// A command line found in a document: where it is, and its words.
struct Example {
    file: String,
    line: usize,
    /// The words after `stemcell-gallery`.
    args: Vec<String>,
    /// Lines printed after a `$ ` prompt in a `console` block, up to the next prompt.
    has_output: bool,
}

/// The `stemcell-gallery` commands in a Markdown file's code blocks. In `console` blocks only
/// lines after a `$ ` prompt are commands (the rest is sample output); in every other block each
/// line is. A line may continue with `\`, start with `VAR=value` assignments, and be one stage
/// of a pipeline; redirections (`<`, `>`) and `&` are dropped.
fn examples(path: &Path) -> Vec<Example> {
    let text = std::fs::read_to_string(path).unwrap();
    let file = path
        .strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(path)
        .display()
        .to_string();
    let mut out: Vec<Example> = Vec::new();
    let mut block: Option<String> = None;
    let mut pending = String::new();
    let mut start = 0;
    let mut last_prompt_found: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(info) = trimmed.strip_prefix("```") {
            block = match block {
                None => Some(info.trim().to_string()),
                Some(_) => None,
            };
            last_prompt_found = None;
            continue;
        }
        let Some(kind) = &block else { continue };
        let l = line.trim();
        let console = kind == "console";
        if pending.is_empty() {
            start = n + 1;
            if console {
                match l.strip_prefix("$ ") {
                    Some(cmd) => {
                        last_prompt_found = None;
                        if cmd.ends_with('\\') {
                            pending.push_str(cmd.trim_end_matches('\\'));
                            pending.push(' ');
                            continue;
                        }
                        pending.push_str(cmd);
                    }
                    None => {
                        if let Some(i) = last_prompt_found {
                            if !l.is_empty() {
                                out[i].has_output = true;
                            }
                        }
                        continue;
                    }
                }
            } else {
                pending.push_str(l);
            }
        } else {
            pending.push_str(l);
        }
        if pending.ends_with('\\') {
            pending.pop();
            pending.push(' ');
            continue;
        }
        let full = std::mem::take(&mut pending);
        let before = out.len();
        for stage in stages(&full) {
            let mut words = words(stage.trim());
            // Leading environment assignments.
            while words
                .first()
                .is_some_and(|w| w.contains('=') && !w.starts_with('-'))
            {
                words.remove(0);
            }
            // `timeout [-s SIG] DURATION stemcell-gallery ...` runs the tool.
            if words.first().is_some_and(|w| w == "timeout") {
                if let Some(i) = words.iter().position(|w| w == "stemcell-gallery") {
                    words.drain(..i);
                }
            }
            let mut words = words.into_iter();
            let rest: Vec<String> = match words.next().as_deref() {
                Some("stemcell-gallery") => words.collect(),
                Some("cargo") => {
                    let all: Vec<String> = words.collect();
                    match all.iter().position(|w| w == "--") {
                        Some(i) if all.first().map(String::as_str) == Some("run") => {
                            all[i + 1..].to_vec()
                        }
                        _ => continue,
                    }
                }
                _ => continue,
            };
            // Drop redirections (and their targets) and a trailing `&`.
            let mut argv = Vec::new();
            let mut skip = false;
            for w in rest {
                if skip {
                    skip = false;
                    continue;
                }
                if w == "&" {
                    continue;
                }
                if w == "<" || w == ">" || w == ">>" || w == "2>" || w == "2>&1" {
                    skip = w != "2>&1";
                    continue;
                }
                if w.starts_with('>') || w.starts_with('<') || w.starts_with("2>") {
                    continue;
                }
                argv.push(w);
            }
            out.push(Example {
                file: file.clone(),
                line: start,
                args: argv,
                has_output: false,
            });
        }
        if console && out.len() > before {
            last_prompt_found = Some(out.len() - 1);
        }
    }
    out
}

/// Split a shell line into pipeline / list stages at `|`, `;` and `&&` outside quotes.
fn stages(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut quote: Option<char> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (None, '"') | (None, '\'') => quote = Some(c),
            (None, '|') | (None, ';') => {
                out.push(String::new());
                continue;
            }
            (None, '&') if chars.peek() == Some(&'&') => {
                chars.next();
                out.push(String::new());
                continue;
            }
            _ => {}
        }
        out.last_mut().unwrap().push(c);
    }
    out
}

impl Example {
    /// The whole command line, program name first.
    fn argv(&self) -> Vec<String> {
        let mut argv = vec!["stemcell-gallery".to_string()];
        argv.extend(self.args.iter().cloned());
        argv
    }
}

fn parse_example(e: &Example) {
    let argv = e.argv();
    if let Err(err) = Cli::try_parse_from(&argv) {
        panic!(
            "{}:{}: command `{}` does not parse: {err}",
            e.file,
            e.line,
            argv[1..].join(" ")
        );
    }
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_command_in_the_readme_parses() {
    let all = examples(&root().join("README.md"));
    assert!(all.len() >= 8, "found only {} commands", all.len());
    for e in &all {
        parse_example(e);
    }
}

#[test]
fn every_command_in_the_deploy_docs_parses() {
    let mut docs = Vec::new();
    files(&root().join("deploy"), &mut docs);
    if root().join("docs").is_dir() {
        files(&root().join("docs"), &mut docs);
    }
    let mut n = 0;
    for p in docs
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
    {
        for e in examples(p) {
            parse_example(&e);
            n += 1;
        }
    }
    assert!(n >= 5, "found only {n} commands in deploy/ and docs/");
}

/// README is the front door (issue 31: at most 250 lines, linking every page of the guide), and
/// the operator's guide in docs/ shows every command with an example and the output it printed.
#[test]
fn the_guide_shows_every_command_with_sample_output() {
    use clap::CommandFactory;
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(
        readme.lines().count() <= 250,
        "README has {} lines; it is the front door (at most 250), the guide is docs/",
        readme.lines().count()
    );
    let mut all = examples(&root().join("README.md"));
    for (page, heading) in [
        ("install", "# Install"),
        ("configure", "# Configure"),
        ("commands", "# Commands"),
        ("commands", "## Exit codes"),
        ("create-env", "# create-env hint mode"),
        ("cleanup-safety", "# Cleanup safety"),
        ("cpi", "# BOSH CPI wiring"),
        ("references", "# References"),
        ("end-of-life", "# Soft delete and end of life"),
        ("migrate", "# Migrating pre-gallery stemcells"),
        ("troubleshooting", "# Troubleshooting"),
        ("benchmarks", "# Benchmarks"),
        ("deployment", "# Deployment files"),
        ("dependencies", "# Dependencies"),
        ("architecture", "# Architecture"),
    ] {
        let path = root().join(format!("docs/{page}.md"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            text.lines().any(|l| l.trim() == heading),
            "docs/{page}.md has no `{heading}` heading"
        );
        assert!(
            readme.contains(&format!("](docs/{page}.md)")),
            "README does not link docs/{page}.md"
        );
        all.extend(examples(&path));
    }
    for sub in Cli::command().get_subcommands() {
        let name = sub.get_name();
        let shown = all.iter().any(|e| {
            e.has_output
                && Cli::command()
                    .try_get_matches_from(e.argv())
                    .is_ok_and(|m| m.subcommand_name() == Some(name))
        });
        assert!(
            shown,
            "the guide shows no `$ stemcell-gallery ... {name}` example with its output in a console block"
        );
    }
    // Both cleanup modes and the lookup variants the guide promises.
    for needle in [
        " cleanup",
        "--apply",
        "lookup --cid",
        "completions man",
        "--output json",
    ] {
        assert!(
            all.iter()
                .any(|e| e.has_output && e.args.join(" ").contains(needle.trim())),
            "the guide shows no example with output for `{needle}`"
        );
    }
    assert!(
        std::fs::read_to_string(root().join("docs/commands.md"))
            .unwrap()
            .contains("[exit status 3]"),
        "docs/commands.md shows no lookup that exits 3"
    );
}

/// Every `((variable))` the BOSH ops files use is given by the worked example: in its vars file,
/// with `-v` on its `bosh create-env` line, or in the vars file scripts/bosh-release.sh writes
/// (when the example loads it with `-l`). Every ops/vars file it names exists.
#[test]
fn the_create_env_example_provides_every_ops_variable() {
    let bosh = root().join("deploy/bosh");
    let example = std::fs::read_to_string(bosh.join("examples/create-env.md")).unwrap();
    let vars: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(bosh.join("examples/vars.yml")).unwrap())
            .unwrap();
    let vars = vars.as_mapping().expect("vars.yml is a mapping");
    let script = std::fs::read_to_string(root().join("scripts/bosh-release.sh")).unwrap();
    let release_vars_loaded = example.contains("-l releases/stemcell-gallery-release-vars.yml")
        && script.contains("\"$out/stemcell-gallery-release-vars.yml\"");
    let mut ops = Vec::new();
    files(&bosh.join("ops"), &mut ops);
    assert!(ops.len() >= 2);
    for p in &ops {
        let text = std::fs::read_to_string(p).unwrap();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("((") {
            let after = &rest[i + 2..];
            let j = after.find("))").expect("unclosed ((");
            let name = &after[..j];
            let given = vars.contains_key(serde_yaml_ng::Value::from(name))
                || example.contains(&format!("-v {name}="))
                || (release_vars_loaded
                    && script.lines().any(|l| l.starts_with(&format!("{name}: "))));
            assert!(
                given,
                "{}: (({name})) is neither in examples/vars.yml nor passed with -v in examples/create-env.md",
                p.display()
            );
            rest = &after[j + 2..];
        }
        let rel = p.strip_prefix(root()).unwrap().display().to_string();
        assert!(
            example.contains(&format!("stemcell-gallery/{rel}")),
            "examples/create-env.md does not apply {rel}"
        );
    }
    for word in example.split_whitespace() {
        if let Some(rel) = word.strip_prefix("stemcell-gallery/deploy/") {
            let rel = rel.trim_end_matches(['\\', '`', ')', ',', '.']);
            assert!(
                root().join("deploy").join(rel).exists(),
                "examples/create-env.md names deploy/{rel}, which does not exist"
            );
        }
    }
}

/// Every relative link in the README, docs/ and the deploy docs points at a file that exists.
#[test]
fn every_relative_link_in_the_docs_exists() {
    let mut docs = vec![root().join("README.md")];
    files(&root().join("docs"), &mut docs);
    files(&root().join("deploy"), &mut docs);
    docs.retain(|p| p.extension().is_some_and(|e| e == "md"));
    let mut checked = 0;
    for doc in &docs {
        let text = std::fs::read_to_string(doc).unwrap();
        let dir = doc.parent().unwrap();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(j) = after.find(')') else { break };
            let target = &after[..j];
            rest = &after[j..];
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target, None),
            };
            let file = if path.is_empty() {
                doc.clone()
            } else {
                dir.join(path)
            };
            assert!(
                file.exists(),
                "{}: link to {target}, which does not exist",
                doc.display()
            );
            if let Some(anchor) = anchor {
                let text = std::fs::read_to_string(&file).unwrap();
                assert!(
                    anchors(&text).iter().any(|a| a == anchor),
                    "{}: link to {target}, but {} has no heading with that anchor",
                    doc.display(),
                    file.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 5, "found only {checked} relative links");
}

/// GitHub's heading anchors: lower case, punctuation other than `-` and `_` dropped, spaces to `-`.
fn anchors(markdown: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        out.push(
            title
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect(),
        );
    }
    out
}

/// `completions man --dir DIR` writes every page the top-level man page refers to
/// (`stemcell-gallery-ensure(1)`, ...), and the README installs the pages that way.
#[test]
fn every_man_page_the_top_level_page_names_is_generated() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_stemcell-gallery"))
        .args(["--output", "json", "completions", "man", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let top = std::fs::read_to_string(dir.path().join("stemcell-gallery.1")).unwrap();
    let printed = std::process::Command::new(env!("CARGO_BIN_EXE_stemcell-gallery"))
        .args(["completions", "man"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&printed.stdout),
        top,
        "stdout and --dir agree"
    );
    let mut named = 0;
    for line in top.lines() {
        let plain = line.replace("\\-", "-");
        let Some(page) = plain.strip_suffix("(1)") else {
            continue;
        };
        named += 1;
        assert!(
            dir.path().join(format!("{page}.1")).is_file(),
            "the top-level man page names {page}(1), which was not generated"
        );
    }
    assert!(named >= 10, "only {named} pages named:\n{top}");

    // Every command at every level has its page (issue 31: `references prune` had none), and
    // every page another page names was written.
    fn commands(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            if sub.get_name() == "help" {
                continue;
            }
            let name = format!("{prefix}-{}", sub.get_name());
            out.push(name.clone());
            commands(sub, &name, out);
        }
    }
    let mut every = Vec::new();
    commands(
        &<Cli as clap::CommandFactory>::command(),
        "stemcell-gallery",
        &mut every,
    );
    assert!(
        every
            .iter()
            .any(|c| c == "stemcell-gallery-references-prune"),
        "{every:?}"
    );
    for page in &every {
        assert!(
            dir.path().join(format!("{page}.1")).is_file(),
            "no man page for {page}"
        );
    }
    let written: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(written.len(), every.len() + 1, "{written:?}");
    for file in &written {
        let text = std::fs::read_to_string(file).unwrap();
        for line in text.lines() {
            let plain = line.replace("\\-", "-");
            if let Some(page) = plain.strip_suffix("(1)") {
                assert!(
                    dir.path().join(format!("{page}.1")).is_file(),
                    "{} names {page}(1), which was not generated",
                    file.display()
                );
                assert!(!page.ends_with("-help"), "{}: {page}", file.display());
            }
        }
    }
    let install = std::fs::read_to_string(root().join("docs/install.md")).unwrap();
    assert!(
        install.contains("completions man --dir"),
        "docs/install.md installs the man pages with --dir"
    );
}

/// A directory of executables for a stripped PATH: each name links to the machine's own
/// (`bash`) or is a stand-in that exits 0 (`stub`).
fn path_dir(links: &[&str], stubs: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in links {
        let real = ["/usr/bin", "/bin"]
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{name} is not in /usr/bin or /bin"));
        std::os::unix::fs::symlink(real, dir.path().join(name)).unwrap();
    }
    for name in stubs {
        let p = dir.path().join(name);
        std::fs::write(&p, "#!/bin/bash\nexit 0\n").unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    dir
}

/// `bash scripts/test-tools.sh` with PATH and the tools directory given (never the real .tools).
fn test_tools(path: &str, tools: &Path, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = std::process::Command::new("/bin/bash");
    cmd.arg(root().join("scripts/test-tools.sh"))
        .env("PATH", path)
        .env("STEMCELL_GALLERY_TOOLS", tools)
        .envs(env.iter().copied());
    cmd.output().unwrap()
}

/// Issue 31: on a machine without node, npm, python3 or ruby the test script named none of them
/// (a raw "command not found" from deep inside). It now names each missing one with how to get
/// it, before installing anything.
#[test]
fn the_test_tools_script_names_what_the_machine_lacks_and_how_to_get_it() {
    let tmp = tempfile::tempdir().unwrap();
    let tools = tmp.path().join("tools");

    // Nothing but bash: every tool is named, with its package, and nothing is created.
    let bare = path_dir(&["bash"], &[]);
    let o = test_tools(bare.path().to_str().unwrap(), &tools, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for (tool, how) in [
        ("node", "apt-get install nodejs"),
        ("npm", "apt-get install npm"),
        ("python3", "apt-get install python3 python3-venv"),
        ("ruby", "apt-get install ruby"),
        ("jq", "apt-get install jq"),
        ("curl", "apt-get install curl"),
    ] {
        assert!(
            err.lines()
                .any(|l| l.starts_with(&format!("  - {tool}: ")) && l.contains(how)),
            "{tool} ({how}) not named:\n{err}"
        );
    }
    assert!(!err.contains("command not found"), "{err}");
    assert!(
        !tools.exists(),
        "nothing is installed when a tool is missing"
    );

    // Everything but npm, with Azurite still to install: only npm is named.
    let no_npm = path_dir(
        &["bash", "sha1sum", "cut", "grep", "mkdir"],
        &["node", "python3", "ruby", "jq", "curl"],
    );
    let o = test_tools(no_npm.path().to_str().unwrap(), &tools, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let named: Vec<&str> = err
        .lines()
        .filter_map(|l| l.strip_prefix("  - "))
        .filter_map(|l| l.split(':').next())
        .collect();
    assert_eq!(named, ["npm"], "{err}");
    assert!(!tools.exists());
}

/// Without network (here: a registry on a closed loopback port), the install says which registry
/// it could not use and what to do, instead of ending on npm's or pip's own error.
#[test]
fn the_test_tools_script_says_which_registry_it_could_not_reach() {
    let tmp = tempfile::tempdir().unwrap();
    // ruby is only checked for, never run by the script: a stand-in keeps the check quiet on a
    // machine without it.
    let stubs = path_dir(&[], &["ruby"]);
    let path = format!(
        "{}:{}",
        stubs.path().display(),
        std::env::var("PATH").unwrap()
    );
    let closed = "http://127.0.0.1:1/";

    let tools = tmp.path().join("npm");
    let o = test_tools(
        &path,
        &tools,
        &[
            ("npm_config_registry", closed),
            ("npm_config_fetch_retries", "0"),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("could not install azurite@")
            && err.contains("from the npm registry (http://127.0.0.1:1/")
            && err.contains("Is the network up"),
        "{err}"
    );

    // Azurite already there: the Python packages come next, from PyPI.
    let tools = tmp.path().join("pypi");
    let azurite = tools.join("node_modules");
    std::fs::create_dir_all(azurite.join(".bin")).unwrap();
    std::fs::create_dir_all(azurite.join("azurite")).unwrap();
    let version = std::fs::read_to_string(root().join("scripts/test-tools.sh"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("AZURITE_VERSION=").map(String::from))
        .unwrap();
    std::fs::write(
        azurite.join("azurite/package.json"),
        format!("{{\"name\": \"azurite\", \"version\": \"{version}\"}}"),
    )
    .unwrap();
    let bin = azurite.join(".bin/azurite-blob");
    std::fs::write(&bin, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let index = format!("{closed}simple");
    let o = test_tools(
        &path,
        &tools,
        &[("PIP_INDEX_URL", index.as_str()), ("PIP_RETRIES", "0")],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("from PyPI (http://127.0.0.1:1/simple") && err.contains("Is the network up"),
        "{err}"
    );
    assert!(!err.contains("installing azurite"), "{err}");
}

/// Headings of a markdown file, as written (`#` marks and surrounding space removed), with the
/// text of each one's section (up to the next heading of the same or a higher level).
fn sections(markdown: &str) -> Vec<(String, String)> {
    let mut in_code = false;
    let mut heads = Vec::new();
    let lines: Vec<&str> = markdown.lines().collect();
    for (n, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            let level = line.chars().take_while(|c| *c == '#').count();
            heads.push((n, level, line.trim_start_matches('#').trim().to_string()));
        }
    }
    heads
        .iter()
        .enumerate()
        .map(|(i, (n, level, title))| {
            let end = heads[i + 1..]
                .iter()
                .find(|(_, l, _)| l <= level)
                .map_or(lines.len(), |(e, _, _)| *e);
            (title.clone(), lines[*n..end].join("\n"))
        })
        .collect()
}

/// The references a deploy file or script makes in its comments and descriptions: a markdown
/// file's section by heading (`README "Heading"`, optionally `(its paragraph "Words")`), and
/// repository paths (`deploy/bosh/README.md`, `README.md#anchor`, `scripts/test.sh`).
#[derive(Debug, PartialEq)]
struct SectionRef {
    /// `README`, or a markdown file's path.
    doc: String,
    heading: String,
    /// `(its paragraph "Words")`: words the section must hold.
    paragraph: Option<String>,
}

fn references(text: &str) -> (Vec<SectionRef>, Vec<String>) {
    let mut sections = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(".md \"").or_else(|| rest.find("README \"")) {
        let start = rest[..i]
            .rfind(|c: char| c.is_whitespace() || c == '(' || c == '`')
            .map_or(0, |s| s + 1);
        let file_end = rest[i..].find(' ').unwrap() + i;
        let file = rest[start..file_end].to_string();
        let after = &rest[file_end + 2..];
        let close = after.find('"').unwrap();
        let heading = after[..close]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let tail = &after[close + 1..];
        let paragraph = tail
            .trim_start()
            .strip_prefix("(its paragraph \"")
            .map(|p| p[..p.find('"').unwrap()].to_string());
        sections.push(SectionRef {
            doc: file,
            heading,
            paragraph,
        });
        rest = tail;
    }
    let mut paths = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_.-/#@".contains(c);
    let mut i = 0;
    while i < chars.len() {
        if path_char(chars[i]) && (i == 0 || !path_char(chars[i - 1])) {
            let mut j = i;
            while j < chars.len() && path_char(chars[j]) {
                j += 1;
            }
            let word: String = chars[i..j].iter().collect();
            let word = word.trim_end_matches(['.', '-', '/']).to_string();
            let glob = chars
                .get(j)
                .is_some_and(|c| matches!(c, '*' | '$' | '{' | '<'));
            let top = [
                "deploy/",
                "scripts/",
                "src/",
                "tests/",
                "fixtures/",
                "docs/",
                "bench/",
            ];
            if !glob && (top.iter().any(|t| word.starts_with(t)) || word.contains(".md#")) {
                paths.push(word);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    (sections, paths)
}

/// Issue 31: the CPI job's spec sent operators to README "Adopting versions", which does not
/// exist. Every section that a job spec, job template, package file, ops file, unit, manifest or
/// script names, and every path a deploy file names (outside markdown, which the test above
/// covers), must exist.
#[test]
fn every_reference_in_the_job_specs_templates_and_deploy_files_resolves() {
    // Sections named anywhere in deploy/ and scripts/; paths named in deploy/ (a script names
    // paths it creates, such as bench/out, which need not exist).
    let mut all = Vec::new();
    files(&root().join("deploy"), &mut all);
    files(&root().join("scripts"), &mut all);
    all.retain(|p| p.extension().is_none_or(|e| e != "md"));
    let cpi_job = root().join("deploy/bosh/jobs/stemcell_gallery_cpi");
    assert!(
        all.contains(&cpi_job.join("spec")) && all.contains(&cpi_job.join("templates/cpi.erb"))
    );
    let (mut headings, mut paths) = (0, 0);
    for file in &all {
        let text = std::fs::read_to_string(file).unwrap();
        let (sections_named, mut paths_named) = references(&text);
        if !file.starts_with(root().join("deploy")) {
            paths_named.clear();
        }
        for SectionRef {
            doc,
            heading,
            paragraph,
        } in sections_named
        {
            let doc_path = if doc == "README" || doc == "README.md" {
                root().join("README.md")
            } else if root().join(&doc).exists() {
                root().join(&doc)
            } else {
                file.parent().unwrap().join(&doc)
            };
            assert!(
                doc_path.is_file(),
                "{}: names {doc} \"{heading}\", and there is no {}",
                file.display(),
                doc_path.display()
            );
            let md = std::fs::read_to_string(&doc_path).unwrap();
            let found = sections(&md)
                .into_iter()
                .find(|(title, _)| title.replace('`', "") == heading)
                .unwrap_or_else(|| {
                    panic!(
                        "{}: names {doc} \"{heading}\", which has no such heading",
                        file.display()
                    )
                });
            if let Some(paragraph) = paragraph {
                assert!(
                    found.1.replace('`', "").contains(&paragraph),
                    "{}: {doc} \"{heading}\" has no paragraph \"{paragraph}\"",
                    file.display()
                );
            }
            headings += 1;
        }
        for named in paths_named {
            let (path, anchor) = match named.split_once('#') {
                Some((p, a)) => (p.to_string(), Some(a.to_string())),
                None => (named.clone(), None),
            };
            let resolved = [root().join(&path), file.parent().unwrap().join(&path)]
                .into_iter()
                .find(|p| p.exists())
                .unwrap_or_else(|| {
                    panic!("{}: names {named}, which does not exist", file.display())
                });
            if let Some(anchor) = anchor {
                let md = std::fs::read_to_string(&resolved).unwrap();
                assert!(
                    anchors(&md).contains(&anchor),
                    "{}: names {named}, and {path} has no such anchor",
                    file.display()
                );
            }
            paths += 1;
        }
    }
    assert!(headings >= 3, "only {headings} section references found");
    assert!(paths >= 10, "only {paths} path references found");

    // The checker itself: the reference the spec used to make is caught.
    let (named, _) = references("Leave false unless README \"Adopting versions\" says otherwise.");
    assert_eq!(
        named,
        [SectionRef {
            doc: "README".into(),
            heading: "Adopting versions".into(),
            paragraph: None
        }]
    );
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(!sections(&readme)
        .iter()
        .any(|(t, _)| t == "Adopting versions"));
}
