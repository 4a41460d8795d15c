//! First-use frictions an operator met (issue 19 part 5), through the binary.

use crate::support::seeding;

use seeding::{small_spec, write_stemcell, World};

/// Log lines on a pipe carry no ANSI escapes (they did: the log layer coloured whatever stderr
/// was); `--color always` still colours, and NO_COLOR wins over auto.
#[tokio::test(flavor = "multi_thread")]
async fn logs_are_coloured_only_on_a_terminal_or_when_asked() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 2));
    let piped = world.seed(&path, &[]).await;
    piped.assert_ok();
    assert!(piped.stderr.contains("INFO"), "{}", piped.stderr);
    assert!(!piped.stderr.contains('\u{1b}'), "{:?}", piped.stderr);

    let mut cmd = world.seed_command(&path, &["--color", "always"]);
    cmd.env("NO_COLOR", "1");
    let always = seeding::run_to_end(cmd).await;
    always.assert_ok();
    assert!(always.stderr.contains('\u{1b}'), "{:?}", always.stderr);

    let never = world.seed(&path, &["--color", "never"]).await;
    never.assert_ok();
    assert!(!never.stderr.contains('\u{1b}'), "{:?}", never.stderr);
}

fn help(args: &[&str]) -> String {
    let out = crate::support::binary::command()
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// `--help` puts the global flags under their own heading and names every environment variable
/// the source reads (found by scanning src/ for the names), so none is a secret knob.
#[test]
fn help_separates_global_options_and_names_every_environment_variable() {
    let top = help(&["--help"]);
    assert!(top.contains("Global options:"), "{top}");
    assert!(top.contains("Exit codes:"), "{top}");
    let sub = help(&["cleanup", "--help"]);
    assert!(sub.contains("Global options:"), "{sub}");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut names = std::collections::BTreeSet::new();
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                // The emulator's own variables are its business, listed with it.
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for piece in text.split('"').skip(1).step_by(2) {
                    let known = ["STEMCELL_GALLERY_", "AZURE_", "BOSH_"]
                        .iter()
                        .any(|p| piece.starts_with(p));
                    if known
                        && piece.len() > 6
                        && piece.bytes().all(|b| b.is_ascii_uppercase() || b == b'_')
                    {
                        names.insert(piece.to_string());
                    }
                }
            }
        }
    }
    assert!(names.contains("STEMCELL_GALLERY_LOCK_WAIT"), "{names:?}");
    let missing: Vec<&String> = names.iter().filter(|n| !top.contains(n.as_str())).collect();
    assert!(missing.is_empty(), "not in --help: {missing:?}\n{top}");
    for cmd in ["seed", "ensure"] {
        let h = help(&[cmd, "--help"]);
        assert!(h.contains("3 the gallery"), "{cmd}: {h}");
    }
    // An interrupted upload starts over: the help no longer promises to resume it.
    assert!(!top.to_lowercase().contains("resumable"), "{top}");
    assert!(!help(&["seed", "--help"])
        .to_lowercase()
        .contains("resumable"));
}

/// Issue 31: `lookup` and `delete` without a stemcell suggested `--manifest`, which neither
/// takes. A usage error names only flags of the command that printed it.
#[test]
fn a_usage_hint_names_only_flags_the_command_takes() {
    let flag = regex::Regex::new(r"--[a-z][a-z0-9-]*").unwrap();
    for (command, args) in [
        ("lookup", &["lookup"][..]),
        ("delete", &["delete"][..]),
        (
            "ensure",
            &["ensure", "--blob-uri", "http://127.0.0.1:1/c/b.vhd"][..],
        ),
    ] {
        let out = crate::support::binary::command()
            .args(["--emulator"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {err}");
        let taken = help(&[command, "--help"]);
        let named: Vec<&str> = flag.find_iter(&err).map(|m| m.as_str()).collect();
        assert!(
            !named.is_empty(),
            "{command}: the hint names no flag: {err}"
        );
        for f in named {
            assert!(
                taken.contains(&format!("{f} ")) || taken.contains(&format!("{f}\n")),
                "`{command}` suggests {f}, which it does not take: {err}"
            );
        }
    }
}

/// Issue 31: `list` hid a definition that holds no version (the gallery looked empty, and the
/// definition an operator must delete by hand was nowhere), and warned twice about records it
/// had no need to read.
#[tokio::test(flavor = "multi_thread")]
async fn list_shows_a_definition_that_holds_no_version() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 2));
    world.seed(&path, &[]).await.assert_ok();
    let definition = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
    let deleted = world
        .run(&["delete", "--name", definition, "--version", "1.506"])
        .await;
    assert_eq!(deleted.code, 0, "{}", deleted.stderr);

    let mut cmd = world.human_command(&["list"]);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let (human, stderr) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert!(out.status.success(), "{stderr}");
    let row = human
        .lines()
        .find(|l| l.starts_with(definition))
        .unwrap_or_else(|| panic!("{definition} is not listed:\n{human}"));
    assert!(row.contains("no versions"), "{row}");
    assert!(!stderr.contains("WARN"), "{stderr}");

    let json = world.run(&["list"]).await;
    let defs = json.json["definitions"].as_array().unwrap();
    assert_eq!(defs.len(), 1, "{}", json.json);
    assert_eq!(defs[0]["name"], definition);
    assert_eq!(defs[0]["versions"], serde_json::json!([]));
}

/// Issue 31: `seed` printed nothing for two minutes while Azure created the version (7.5 min at
/// Azure's pace). A wait that goes on now says, every few seconds, what it waits for and how long
/// it has waited.
#[tokio::test(flavor = "multi_thread")]
async fn a_long_version_create_says_what_it_waits_for_every_few_seconds() {
    let world = World::start().await;
    let slow = crate::support::emulated::admin(
        &world.emulator,
        "PUT",
        "/_emulator/timing",
        Some(serde_json::json!({"version_write_ms": 11_000})),
    )
    .await;
    assert!((200..300).contains(&slow.status), "{}", slow.text);
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 2));
    let seeded = world.seed(&path, &[]).await;
    seeded.assert_ok();
    let waits: Vec<&str> = seeded
        .stderr
        .lines()
        .filter(|l| l.contains("still waiting for Azure (create)"))
        .collect();
    assert!(waits.len() >= 2, "{}", seeded.stderr);
    assert!(
        waits[0].contains("InProgress")
            && waits[0].contains("s so far")
            && waits[0].contains("(gives up after"),
        "{}",
        waits[0]
    );
}

/// Issue 31: `seed` on a reuse printed a new CID as if it meant something; nothing records it.
/// The human output now says so next to it.
#[tokio::test(flavor = "multi_thread")]
async fn seed_says_plainly_that_its_cid_is_recorded_nowhere() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 2));
    world.seed(&path, &[]).await.assert_ok();
    let mut cmd = world.human_command(&["seed"]);
    cmd.arg(&path);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    let human = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{human}");
    assert!(human.starts_with("reused "), "{human}");
    let cid = human
        .lines()
        .find(|l| l.trim_start().starts_with("cid:"))
        .unwrap_or_else(|| panic!("no cid line: {human}"));
    assert!(
        cid.ends_with("(not recorded: no version refers to it)"),
        "{cid}"
    );
}

/// Issue 48 items 3 and 5: with nothing configured, one run of `list` names every missing
/// setting (flag, environment variable, config key) and the way to try the tool without Azure,
/// exit 2; `--gallery ''` is refused by name (it was taken as unset and replaced by the
/// default gallery, exit 0).
#[test]
fn missing_settings_are_named_at_once_and_an_empty_gallery_is_refused() {
    let out = crate::support::binary::command()
        .args(["list"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for want in [
        "--subscription",
        "--resource-group",
        "--gallery",
        "--emulator",
    ] {
        assert!(err.contains(want), "{want}: {err}");
    }
    let out = crate::support::binary::command()
        .args(["--emulator", "--gallery", "", "list"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--gallery ''"), "{err}");
}

/// Issue 48 item 4: a stemcell path that is a directory or does not exist gets one wording in
/// `seed` and `inspect`, the right cause (a directory was read as a broken gzip stream) and a
/// remedy, exit 1, before any request.
#[test]
fn a_stemcell_path_that_is_a_directory_or_missing_is_named_with_its_cause() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("bosh-stemcell.tgz");
    let folder = dir.path().display().to_string();
    let missing = missing.display().to_string();
    for (args, cause) in [
        (
            vec!["--emulator", "seed", &folder],
            "it is a directory; give the file itself",
        ),
        (
            vec!["--emulator", "seed", &missing],
            "no such file; check the path",
        ),
        (
            vec!["inspect", &folder],
            "it is a directory; give the file itself",
        ),
        (vec!["inspect", &missing], "no such file; check the path"),
    ] {
        let out = crate::support::binary::command()
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("cannot read the stemcell"), "{args:?}: {err}");
        assert!(err.contains(cause), "{args:?}: {err}");
        assert!(!err.contains("gzip"), "{args:?}: {err}");
    }
}
