//! The house's rules, checked on the source tree (issue 17's "done when", DESIGN.md §3): which
//! layer may import which, where the environment is read, how long a file may grow, and that
//! every error type has a row in the one exit-code/retry table. A change that breaks a rule
//! fails here, naming the file and line.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, as (path relative to the package, text).
fn sources(dir: &str) -> Vec<(String, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root().join(dir), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(root()).unwrap().display().to_string();
            (rel, std::fs::read_to_string(&p).unwrap())
        })
        .collect()
}

/// The code of a line: comments dropped, string literals blanked (a log target or a message may
/// name a path without importing it).
fn code(line: &str) -> String {
    let line = line.trim_start();
    if line.starts_with("//") {
        return String::new();
    }
    let mut out = String::new();
    let mut in_str = false;
    let mut prev = ' ';
    for c in line.chars() {
        if c == '"' && prev != '\\' {
            in_str = !in_str;
            out.push('"');
        } else if !in_str {
            out.push(c);
        }
        prev = c;
    }
    out.split("//").next().unwrap_or_default().to_string()
}

/// `file:line: text` of every code line in `dir` (minus `except`) that `bad` flags.
fn offenders(dir: &str, except: &[&str], bad: impl Fn(&str) -> bool) -> Vec<String> {
    flagged(dir, except, false, bad)
}

/// The same, of production code only: unit tests cut off at their `#[cfg(test)]`, `*tests.rs`
/// files skipped.
fn production_offenders(dir: &str, except: &[&str], bad: impl Fn(&str) -> bool) -> Vec<String> {
    flagged(dir, except, true, bad)
}

fn flagged(
    dir: &str,
    except: &[&str],
    production_only: bool,
    bad: impl Fn(&str) -> bool,
) -> Vec<String> {
    sources(dir)
        .into_iter()
        .filter(|(path, _)| !except.iter().any(|e| path.starts_with(e)))
        .filter(|(path, _)| !(production_only && path.ends_with("tests.rs")))
        .flat_map(|(path, text)| {
            let body = if production_only {
                text.split("#[cfg(test)]").next().unwrap_or_default()
            } else {
                &text
            };
            body.lines()
                .enumerate()
                .filter(|(_, l)| bad(&code(l)))
                .map(|(i, l)| format!("{path}:{}: {}", i + 1, l.trim()))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn nothing_below_the_cli_imports_it() {
    let found = offenders("src", &["src/cli/", "src/main.rs"], |l| {
        l.contains("crate::cli")
    });
    assert!(
        found.is_empty(),
        "imports of crate::cli below the CLI:\n{}",
        found.join("\n")
    );
}

#[test]
fn config_knows_neither_the_cli_nor_the_adapters() {
    let found = offenders("src/config", &[], |l| {
        l.contains("crate::azure") || l.contains("crate::cli") || l.contains("crate::app")
    });
    assert!(
        found.is_empty(),
        "config imports an adapter or a front end:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_emulator_links_nothing_of_the_tool_but_the_development_constants() {
    let found = offenders("src/emulator", &[], |l| {
        l.match_indices("crate::").any(|(i, _)| {
            let rest = &l[i + "crate::".len()..];
            !(rest.starts_with("emulator") || rest.starts_with("devstore"))
        })
    });
    assert!(
        found.is_empty(),
        "the emulator imports the tool:\n{}",
        found.join("\n")
    );
}

#[test]
fn stemcell_is_a_ground_floor_that_imports_no_gallery() {
    let found = offenders("src/stemcell", &[], |l| {
        [
            "crate::gallery",
            "crate::azure",
            "crate::app",
            "crate::cleanup",
            "crate::cpi",
        ]
        .iter()
        .any(|m| l.contains(m))
    });
    assert!(
        found.is_empty(),
        "stemcell imports a higher floor:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_environment_is_read_only_by_config_the_front_ends_and_the_emulator() {
    let found = offenders(
        "src",
        // The ledger simulator is a test (`#[cfg(test)]`): its seeds come from the test
        // runner's environment, as proptest's cases do.
        &[
            "src/config/",
            "src/cli/",
            "src/emulator/",
            "src/main.rs",
            "src/gallery/sim/",
        ],
        |l| l.contains("env::var"),
    );
    assert!(
        found.is_empty(),
        "environment read at a use site:\n{}",
        found.join("\n")
    );
}

#[test]
fn azure_sdk_types_stay_inside_the_azure_adapters() {
    let found = offenders("src", &["src/azure/"], |l| {
        [
            "azure_core",
            "azure_storage",
            "azure_identity",
            "azure_mgmt_compute",
        ]
        .iter()
        .any(|c| l.contains(&format!("{c}::")) || l.contains(&format!("use {c}")))
    });
    assert!(
        found.is_empty(),
        "SDK types outside src/azure:\n{}",
        found.join("\n")
    );
}

#[test]
fn no_source_file_is_over_900_lines() {
    let long: Vec<String> = sources("src")
        .into_iter()
        .filter(|(_, text)| text.lines().count() > 900)
        .map(|(path, text)| format!("{path}: {} lines", text.lines().count()))
        .collect();
    assert!(
        long.is_empty(),
        "split these along their seams:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_integration_tests_are_one_binary() {
    let top: Vec<String> = std::fs::read_dir(root().join("tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        top.len() <= 3,
        "each tests/*.rs links the whole crate again: {top:?}"
    );
}

/// Error types that never reach a command's exit: each with the reason.
const UNCLASSIFIED_BY_DESIGN: &[(&str, &str)] = &[
    (
        "MissingContainer",
        "doctor's storage probe marker, rendered as a failed check (doctor's exit is its report's)",
    ),
    (
        "CpiError",
        "the CPI's answer, built from a classified chain (cpi::handler::cloud_error); the CPI \
         reads its ok_to_retry itself (cpi::protocol::is_transient): the app floor knows no front",
    ),
];

#[test]
fn every_error_type_has_a_row_in_the_exit_and_retry_table() {
    // (top-level module, type name) of each row: `crate::gallery::lock::LockError` and
    // `crate::azure::lock::LockError` are two rows, not one.
    let classified: Vec<(String, String)> = stemcell_gallery::wiring::failure::CLASSIFIED
        .iter()
        .map(|t| {
            let path = t.replace(' ', "");
            let parts: Vec<&str> = path.split("::").collect();
            (parts[1].to_string(), parts[parts.len() - 1].to_string())
        })
        .collect();
    let mut missing = Vec::new();
    for (path, text) in sources("src") {
        if path.starts_with("src/emulator/") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !(line.trim_start().starts_with("#[derive(") && line.contains("thiserror::Error")) {
                continue;
            }
            let Some(decl) = lines[i + 1..]
                .iter()
                .map(|l| l.trim())
                .find(|l| l.contains("struct ") || l.contains("enum "))
            else {
                continue;
            };
            let name: String = decl
                .split_whitespace()
                .skip_while(|w| *w != "struct" && *w != "enum")
                .nth(1)
                .unwrap_or_default()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let by_design = UNCLASSIFIED_BY_DESIGN.iter().any(|(n, _)| *n == name);
            let top = path
                .trim_start_matches("src/")
                .split(['/', '.'])
                .next()
                .unwrap_or_default()
                .to_string();
            if !classified.contains(&(top, name.clone())) && !by_design {
                missing.push(format!("{path}:{}: {name}", i + 1));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "error types without a row in wiring::failure's table (their exit would silently be 1):\n{}",
        missing.join("\n")
    );
}

/// One error classification (DESIGN.md §3): the application floor reads a chain's classes
/// without knowing which front end asks.
#[test]
fn the_application_floor_imports_no_front_end() {
    let found = offenders("src/app", &[], |l| {
        l.contains("crate::cli") || l.contains("crate::cpi")
    });
    assert!(
        found.is_empty(),
        "the application floor imports a front end:\n{}",
        found.join("\n")
    );
}

/// The application floor depends on ports only (issue 45 item 3): it names no adapter
/// (`crate::azure`) and not the composition root above it (`crate::wiring`, which builds the
/// adapters and hands them over as ports in the one `Context`).
#[test]
fn the_application_floor_names_no_adapter_and_no_composition_root() {
    let found = production_offenders("src/app", &[], |l| {
        l.contains("crate::azure") || l.contains("crate::wiring")
    });
    assert!(
        found.is_empty(),
        "the application floor names an adapter or the composition root:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_domain_knows_no_adapter_no_application_floor_and_no_front_end() {
    let higher = [
        "crate::azure",
        "crate::app",
        "crate::cli",
        "crate::cpi",
        "crate::config",
    ];
    let found: Vec<String> = ["src/gallery", "src/cleanup"]
        .into_iter()
        .flat_map(|dir| offenders(dir, &[], |l| higher.iter().any(|m| l.contains(m))))
        .collect();
    assert!(
        found.is_empty(),
        "the domain imports a higher floor or an adapter:\n{}",
        found.join("\n")
    );
}

/// One lifecycle model (DESIGN.md §3): a provisioning state is named only where it is parsed
/// (`gallery/model.rs`, the ARM wire mapping), classified (`gallery/lifecycle.rs`), or made up
/// (the emulator, the in-memory fake, tests). Every decision asks `Phase` instead, so a state
/// Azure adds is one arm in one file and the compiler names each answer it changes.
#[test]
fn only_the_lifecycle_model_judges_a_provisioning_state() {
    let allowed = [
        "src/gallery/lifecycle.rs",
        "src/gallery/model.rs",
        "src/gallery/fake.rs",
        "src/azure/arm/wire/",
        "src/emulator/",
    ];
    let found = production_offenders("src", &allowed, |c| {
        c.match_indices("ProvisioningState::")
            .any(|(i, _)| !c[i..].starts_with("ProvisioningState::parse"))
    });
    assert!(
        found.is_empty(),
        "a provisioning state judged outside gallery/lifecycle.rs (ask `v.phase()`):\n{}",
        found.join("\n")
    );
}

/// One decision table (issue 45 item 1): outside `gallery/lifecycle.rs` no production code
/// matches a `Phase` itself; it asks `Phase` a question (`ensure_step`, `cleanup_hold`,
/// `latest`, `delete_now`, …) and matches the answer, so a new phase is answered in one file.
/// (The simulator's plain CPI, a model of another tool, aside.)
#[test]
fn only_the_lifecycle_model_matches_a_phase() {
    let found = production_offenders(
        "src",
        &["src/gallery/lifecycle.rs", "src/gallery/sim/"],
        |c| c.contains("Phase::"),
    );
    assert!(
        found.is_empty(),
        "a Phase matched outside gallery/lifecycle.rs (ask it a question there):\n{}",
        found.join("\n")
    );
}

/// One retry and backoff policy (DESIGN.md §3, issue 29 item 4): jitter and the `Retry-After`
/// headers are read only in `src/backoff.rs` (the emulator, which sends them, aside).
#[test]
fn backoff_and_retry_after_have_one_home() {
    let found = production_offenders("src", &["src/backoff.rs", "src/emulator/"], |l| {
        l.contains("rand::")
            || l.contains("RETRY_AFTER")
            || l.to_ascii_lowercase().contains("retry-after")
    });
    assert!(
        found.is_empty(),
        "jitter or Retry-After outside src/backoff.rs (use crate::backoff):\n{}",
        found.join("\n")
    );
}

/// The fronts parse, call one use case of the application floor and render (DESIGN.md §3,
/// issue 29 items 1 and 6): they reach Azure only through `app/`.
#[test]
fn the_fronts_reach_azure_only_through_the_application_floor() {
    let found: Vec<String> = ["src/cli", "src/cpi"]
        .into_iter()
        .flat_map(|dir| production_offenders(dir, &[], |l| l.contains("crate::azure")))
        .collect();
    assert!(
        found.is_empty(),
        "a front end reaches an Azure adapter past the application floor:\n{}",
        found.join("\n")
    );
}

/// A port owns its types (issue 29 item 6): nothing outside the adapters re-exports an
/// adapter's item, so a port's signature never names the adapter's types.
#[test]
fn no_port_re_exports_an_adapters_types() {
    let found = offenders("src", &["src/azure/"], |l| {
        l.trim_start().starts_with("pub use crate::azure")
    });
    assert!(
        found.is_empty(),
        "an adapter's items re-exported outside the adapters:\n{}",
        found.join("\n")
    );
}

/// Adapters take values, not the settings tree (issue 29 item 6, issue 45 item 3): no file of
/// `src/azure` names `Settings` (the composition root hands each adapter the values it needs,
/// e.g. `Settings::credentials()`), and no production code of `src/azure` imports `config` at
/// all: the values it takes are the ground floor's (`crate::access`), which imports no `config`
/// either.
#[test]
fn adapters_take_values_not_the_settings_tree() {
    let found = offenders("src/azure", &[], |l| {
        l.split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == "Settings")
            || l.trim_start().starts_with("pub use crate::config")
    });
    let imports = production_offenders("src/azure", &[], |l| l.contains("crate::config"));
    assert!(
        imports.is_empty(),
        "an adapter imports config (take the value from crate::access instead):\n{}",
        imports.join("\n")
    );
    let ground = offenders("src/access", &[], |l| {
        [
            "crate::config",
            "crate::azure",
            "crate::app",
            "crate::gallery",
        ]
        .iter()
        .any(|m| l.contains(m))
    });
    assert!(
        ground.is_empty(),
        "the ground floor's access values import a floor above:\n{}",
        ground.join("\n")
    );
    assert!(
        found.is_empty(),
        "an adapter takes the settings tree or re-exports config:\n{}",
        found.join("\n")
    );
}

/// One retry rule (issue 45 item 2): an HTTP status becomes a class only in `src/error.rs`'s
/// table (`class_of_status`, a column per service), `error::Class` is the only classification
/// (re-send, observe again and `ok_to_retry` follow from it), and words decide a certificate
/// failure only where they arrive as words (`az`'s output in `gallery::Error::no_token`, an
/// untyped cause in `wiring::failure`), never for an error that arrives typed.
#[test]
fn one_status_table_and_one_class_decide_every_retry() {
    let except = ["src/error.rs", "src/emulator/", "src/gallery/sim/"];
    // A status compared or matched (`== 429`, `429 | 503 =>`, `matches!(s, 408 | …)`), not a
    // number that happens to be one (`from_millis(500)`).
    let statuses = production_offenders("src", &except, |l| {
        let compared = (l.contains("=>") || l.contains("==") || l.contains("matches!"))
            && !l.contains("from_millis");
        compared
            && l.split(|c: char| !c.is_ascii_digit())
                .any(|w| matches!(w, "408" | "429" | "500" | "502" | "503" | "504"))
            || l.contains("is_server_error")
            || l.contains(">= 500")
    });
    assert!(
        statuses.is_empty(),
        "a status decides a retry outside error::class_of_status:\n{}",
        statuses.join("\n")
    );
    let second = production_offenders("src", &["src/emulator/"], |l| {
        l.contains("Retryability") || l.contains("fn retryability")
    });
    assert!(
        second.is_empty(),
        "a second retry classification beside error::Class:\n{}",
        second.join("\n")
    );
    let words = production_offenders(
        "src",
        &[
            "src/error.rs",
            "src/azure/tls.rs",
            "src/gallery/error.rs",
            "src/wiring/failure.rs",
            "src/emulator/",
        ],
        |l| l.contains("is_certificate_failure"),
    );
    assert!(
        words.is_empty(),
        "an error classified by its words outside the places words arrive:\n{}",
        words.join("\n")
    );
}

/// What the import-circle check does not read: the emulator (its own program), the test-only
/// simulator (`gallery/sim`, `#[cfg(test)]`) and stemcell generator (`stemcell/testgen`, tests
/// and the `test-support` feature).
const NOT_READ_FOR_CIRCLES: [&str; 3] = ["src/emulator", "src/gallery/sim", "src/stemcell/testgen"];

/// The names after a path prefix at the start of `rest`: each item of a `{…}` group, or the one
/// path (`a::b::C`), each as written (`a::b`, `C as D`).
fn names_after(rest: &str) -> Vec<String> {
    if let Some(group) = rest.strip_prefix('{') {
        let mut level = 0;
        let mut items = vec![String::new()];
        for c in group.chars() {
            match c {
                '{' => level += 1,
                '}' if level == 0 => break,
                '}' => level -= 1,
                ',' if level == 0 => {
                    items.push(String::new());
                    continue;
                }
                _ => {}
            }
            items.last_mut().unwrap().push(c);
        }
        items.into_iter().map(|i| i.trim().to_string()).collect()
    } else {
        vec![rest
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .next()
            .unwrap_or("")
            .to_string()]
    }
}

/// The production code of a file: cut at its `#[cfg(test)]`, comments dropped, strings blanked.
fn production_code(text: &str) -> String {
    let production = text.split("#[cfg(test)]").next().unwrap_or_default();
    production.lines().map(code).collect::<Vec<_>>().join("\n")
}

/// The names `dir`'s `mod.rs` (`lib.rs` for `src`) re-exports from one of its modules
/// (`pub use m::{A, b::C as D}`, `pub use self::m::E`), each with that module: a file that names
/// `super::A` (or `crate::dir::A`) imports `m`.
fn re_exports(
    dir: &str,
    modules: &std::collections::BTreeSet<String>,
) -> std::collections::BTreeMap<String, String> {
    let base = root().join(dir);
    let facade = if dir == "src" { "lib.rs" } else { "mod.rs" };
    let text = std::fs::read_to_string(base.join(facade)).unwrap_or_default();
    let body = production_code(&text);
    let mut out = std::collections::BTreeMap::new();
    for (at, _) in body.match_indices("use ") {
        let before = body[..at].trim_end();
        if !(before.ends_with("pub") || before.ends_with(')')) {
            continue;
        }
        let rest = body[at + 4..].trim_start();
        let rest = rest.strip_prefix("self::").unwrap_or(rest);
        let Some((module, tail)) = rest.split_once("::") else {
            continue;
        };
        if !modules.contains(module) {
            continue;
        }
        for item in names_after(tail) {
            let leaf = item
                .rsplit(" as ")
                .next()
                .unwrap_or("")
                .rsplit("::")
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            if !leaf.is_empty() && leaf != "*" {
                out.insert(leaf, module.to_string());
            }
        }
    }
    out
}

/// The modules of `dir` (its files and folders, `mod.rs` aside) and, for each, the sibling
/// modules its production code names (`super::m`, `super::super::m` from a nested file,
/// `crate::<dir>::m`, and each `m` of a `{…}` group after one of them). A name `mod.rs`
/// re-exports from a module counts as that module (issue 45 item 4: `super::SourceError`, from
/// `pub use evidence::SourceError`, imports `evidence`); a name `mod.rs` defines itself is the
/// facade's, no module's. For `src` itself the modules are the crate's top-level ones, named
/// `crate::m`.
fn module_imports(
    dir: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    let base = root().join(dir);
    let modules: BTreeSet<String> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let name = p.file_stem()?.to_str()?.to_string();
            (p.is_dir() || p.extension().is_some_and(|e| e == "rs")).then_some(name)
        })
        .filter(|m| !["mod", "lib", "main"].contains(&m.as_str()))
        .collect();
    let re_exported = re_exports(dir, &modules);
    let crate_path = if dir == "src" {
        "crate::".to_string()
    } else {
        format!(
            "crate::{}::",
            dir.trim_start_matches("src/").replace('/', "::")
        )
    };
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, text) in sources(dir) {
        if NOT_READ_FOR_CIRCLES.iter().any(|n| path.starts_with(n)) {
            continue;
        }
        let rel = path.trim_start_matches(&format!("{dir}/")).to_string();
        let parts: Vec<&str> = rel.split('/').collect();
        if parts.len() == 1 && ["mod.rs", "lib.rs", "main.rs"].contains(&parts[0])
            || rel.ends_with("tests.rs")
        {
            continue;
        }
        let module = parts[0].trim_end_matches(".rs").to_string();
        // How many `super::` reach `dir` from this file.
        let depth = if rel.ends_with("mod.rs") {
            parts.len() - 1
        } else {
            parts.len()
        };
        let body = production_code(&text);
        let mut prefixes = vec![crate_path.clone()];
        if dir != "src" {
            prefixes.push("super::".repeat(depth));
        }
        for prefix in prefixes {
            for (at, _) in body.match_indices(&prefix) {
                // `super::super::x` must not also count as `super::x` at depth 1, nor
                // `crate::a::b::` as `crate::a::`'s sibling when read from `src`.
                if body[..at].ends_with("super::") || body[..at].ends_with(':') {
                    continue;
                }
                for item in names_after(&body[at + prefix.len()..]) {
                    let first = item.split("::").next().unwrap_or("").trim().to_string();
                    let target = if modules.contains(&first) {
                        Some(first)
                    } else {
                        re_exported.get(&first).cloned()
                    };
                    if let Some(target) = target.filter(|t| *t != module) {
                        graph.entry(module.clone()).or_default().insert(target);
                    }
                }
            }
        }
    }
    graph
}

/// A circle in `graph`, as `a -> b -> a`, if there is one.
fn a_circle(
    graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> Option<String> {
    fn visit(
        graph: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        node: &str,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<String> {
        if let Some(i) = path.iter().position(|n| n == node) {
            let mut circle = path[i..].to_vec();
            circle.push(node.to_string());
            return Some(circle.join(" -> "));
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(graph, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(graph, n, &mut Vec::new(), &mut done))
}

/// No import circle in `src/` (issue 29 item 6, issue 45 item 4): in every folder, its modules
/// import one another in one direction only, names re-exported through `mod.rs` followed, so each
/// can be read (and changed) from the bottom up; and so do the crate's floors. Not read:
/// [`NOT_READ_FOR_CIRCLES`].
#[test]
fn no_import_circle_anywhere() {
    // The finder finds one (error <-> lock, as gallery/ had before issue 29).
    let two: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        [("error", "lock"), ("lock", "error"), ("service", "error")]
            .into_iter()
            .fold(Default::default(), |mut g, (a, b)| {
                g.entry(a.to_string()).or_default().insert(b.to_string());
                g
            });
    assert_eq!(a_circle(&two).as_deref(), Some("error -> lock -> error"));
    // A re-exported name is followed: cleanup's inventory names `super::SourceError`.
    let cleanup = module_imports("src/cleanup");
    assert!(
        cleanup["evidence"].contains("inventory"),
        "cleanup: the import graph was not read: {cleanup:?}"
    );
    let mut folders = vec!["src".to_string()];
    let mut i = 0;
    while i < folders.len() {
        let dir = folders[i].clone();
        i += 1;
        for entry in std::fs::read_dir(root().join(&dir)).unwrap() {
            let path = entry.unwrap().path();
            let rel = format!("{dir}/{}", path.file_name().unwrap().to_str().unwrap());
            if path.is_dir() && !NOT_READ_FOR_CIRCLES.contains(&rel.as_str()) {
                folders.push(rel);
            }
        }
    }
    assert!(folders.len() > 15, "{folders:?}");
    for dir in ["src", "src/gallery", "src/cleanup", "src/app", "src/azure"] {
        let graph = module_imports(dir);
        assert!(
            graph.values().map(|s| s.len()).sum::<usize>() > 3,
            "{dir}: the import graph was not read: {graph:?}"
        );
    }
    let mut circles = Vec::new();
    for dir in &folders {
        let mut graph = module_imports(dir);
        if dir == "src" {
            graph.remove("emulator");
            for targets in graph.values_mut() {
                targets.remove("emulator");
            }
        }
        if let Some(circle) = a_circle(&graph) {
            circles.push(format!("{dir}: {circle}"));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

/// Issue 45: no production function over 120 lines (from its `fn` line to its closing brace),
/// so each reads as a few named steps. Test-only code (unit tests after `#[cfg(test)]`,
/// `tests.rs` files, the simulator, the generated test stemcells) and the emulator may run
/// longer. Fails naming `path:line fn name (N lines)`.
#[test]
fn no_production_function_is_over_120_lines() {
    const LIMIT: usize = 120;
    let skipped = ["src/emulator/", "src/gallery/sim/", "src/stemcell/testgen/"];
    let long: Vec<String> = sources("src")
        .into_iter()
        .filter(|(path, _)| !skipped.iter().any(|s| path.starts_with(s)))
        .filter(|(path, _)| !path.ends_with("/tests.rs"))
        .flat_map(|(path, text)| {
            long_functions(&text, LIMIT)
                .into_iter()
                .map(move |(line, name, n)| format!("{path}:{line} fn {name} ({n} lines)"))
        })
        .collect();
    assert!(
        long.is_empty(),
        "functions over {LIMIT} lines (split them into named steps):\n{}",
        long.join("\n")
    );
}

/// The functions of `text`'s production part (up to a line that is exactly `#[cfg(test)]`)
/// longer than `limit` lines, as (line, name, lines). Braces are counted on
/// [`blank_literals`]'s text.
fn long_functions(text: &str, limit: usize) -> Vec<(usize, String, usize)> {
    let production: Vec<&str> = text.lines().take_while(|l| *l != "#[cfg(test)]").collect();
    let code = blank_literals(&production.join("\n"));
    let lines: Vec<&str> = code.lines().collect();
    let mut long = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(name) = fn_name(line) else {
            continue;
        };
        let (mut depth, mut nest, mut end) = (0usize, 0usize, None);
        'scan: for (k, l) in lines.iter().enumerate().skip(start) {
            for c in l.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth = depth.saturating_sub(1);
                        if depth == 0 {
                            end = Some(k);
                            break 'scan;
                        }
                    }
                    '(' | '[' => nest += 1,
                    ')' | ']' => nest = nest.saturating_sub(1),
                    // A declaration without a body (a trait's method).
                    ';' if depth == 0 && nest == 0 => break 'scan,
                    _ => {}
                }
            }
        }
        if let Some(end) = end {
            let n = end - start + 1;
            if n > limit {
                long.push((start + 1, name, n));
            }
        }
    }
    long
}

/// The name of the function a line of code declares (`pub(crate) async fn name…`), if it does.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    loop {
        let before = rest;
        if rest.starts_with("pub(") {
            rest = rest[rest.find(')')? + 1..].trim_start();
        }
        for q in ["pub", "async", "const", "unsafe", "extern"] {
            if let Some(r) = rest.strip_prefix(q) {
                if r.starts_with(char::is_whitespace) {
                    rest = r.trim_start();
                }
            }
        }
        if rest == before {
            break;
        }
    }
    let name: String = rest
        .strip_prefix("fn ")?
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// `text` with every comment and the inside of every string and char literal blanked (line
/// breaks kept, so line numbers hold), leaving code whose braces can be counted. Unlike
/// [`code`], which reads a line at a time, it follows a literal over several lines (a message
/// continued with `\`) and tells `'{'` from a lifetime.
fn blank_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        match skipped_until(&chars, i) {
            Some(end) => {
                out.extend(
                    chars[i..end]
                        .iter()
                        .map(|&c| if c == '\n' { '\n' } else { ' ' }),
                );
                i = end;
            }
            None => {
                out.push(chars[i]);
                i += 1;
            }
        }
    }
    out
}

/// Where the comment or literal that starts at `chars[i]` ends (exclusive), if one starts there.
fn skipped_until(chars: &[char], i: usize) -> Option<usize> {
    let n = chars.len();
    let at = |k: usize| chars.get(k).copied();
    let after_word = |k: usize| k > 0 && (chars[k - 1].is_alphanumeric() || chars[k - 1] == '_');
    match (chars[i], at(i + 1)) {
        ('/', Some('/')) => Some(
            chars[i..]
                .iter()
                .position(|&c| c == '\n')
                .map_or(n, |p| i + p),
        ),
        ('/', Some('*')) => Some(
            (i + 2..n)
                .find(|&k| chars[k] == '*' && at(k + 1) == Some('/'))
                .map_or(n, |k| k + 2),
        ),
        ('"', _) => {
            let mut k = i + 1;
            while k < n && chars[k] != '"' {
                k += if chars[k] == '\\' { 2 } else { 1 };
            }
            Some((k + 1).min(n))
        }
        // A raw string (r"…", r#"…"#, br"…"); not a raw identifier (r#type).
        ('r', Some('"' | '#')) if !after_word(i) || (chars[i - 1] == 'b' && !after_word(i - 1)) => {
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            if at(i + 1 + hashes) != Some('"') {
                return None;
            }
            let closes = |k: usize| chars[k] == '"' && (1..=hashes).all(|h| at(k + h) == Some('#'));
            Some(
                (i + 2 + hashes..n)
                    .find(|&k| closes(k))
                    .map_or(n, |k| k + 1 + hashes),
            )
        }
        // A char literal: '\n', '\'', '\u{7b}'; 'x'. Not a lifetime ('a).
        ('\'', Some('\\')) => chars[i + 3..]
            .iter()
            .take(10)
            .position(|&c| c == '\'')
            .map(|p| i + p + 4),
        ('\'', Some(_)) if at(i + 2) == Some('\'') => Some(i + 3),
        _ => None,
    }
}
