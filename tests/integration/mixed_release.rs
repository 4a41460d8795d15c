//! Hosts upgraded one at a time (issue 44 item 1): the previous release's binary, built from git
//! history by `scripts/mixed-release.sh` (which names it in `STEMCELL_GALLERY_PREVIOUS_BIN`), and
//! this release's, against one emulator. The previous release keeps its lock and record by the
//! gallery's name (`locks/<gallery>/…`); this release keys them by the gallery's identity and also
//! takes the previous release's lock.
//!
//! Ignored by default (they need that binary): `bash scripts/mixed-release.sh` runs them.

use crate::support::emulated;
use crate::support::reliability::*;

use serde_json::Value;
use stemcell_gallery::emulator::Handle;

/// The previous release's binary, as `scripts/mixed-release.sh` built it.
fn previous_bin() -> std::path::PathBuf {
    std::env::var_os("STEMCELL_GALLERY_PREVIOUS_BIN")
        .map(Into::into)
        .expect("STEMCELL_GALLERY_PREVIOUS_BIN names the previous release's binary (scripts/mixed-release.sh)")
}

/// Run `args` with the previous release (`old`) or this one against `h`, as a host would.
async fn run_release(h: &Handle, old: bool, args: &[String]) -> Run {
    let mut cmd = emulated::binary_against(h, GALLERY);
    if old {
        let mut other = std::process::Command::new(previous_bin());
        other.args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => other.env(k, v),
                None => other.env_remove(k),
            };
        }
        cmd = other;
    }
    for (k, v) in FAST_ENV {
        cmd.env(k, v);
    }
    cmd.env("STEMCELL_GALLERY_OPERATION_TIMEOUT", "60");
    cmd.args(args);
    let started = std::time::Instant::now();
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("the binary runs"))
        .await
        .unwrap();
    run_output(out, started)
}

fn with_holder(mut args: Vec<String>, holder: &str) -> Vec<String> {
    args.extend(["--holder".to_string(), holder.to_string()]);
    args
}

async fn lookup(h: &Handle) -> Value {
    let args: Vec<String> = ["lookup", "--name", DEFINITION, "--version", "1.506.0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let r = run_release(h, false, &args).await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    r.json
}

/// The references `lookup` shows (the tags merged with the record).
fn refs(doc: &Value) -> Vec<String> {
    doc["references"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn holder_of(doc: &Value, reference: &str) -> Option<String> {
    doc["reference_sources"]
        .as_array()?
        .iter()
        .find(|s| s["reference"] == reference)
        .and_then(|s| s["holder"].as_str().map(str::to_string))
}

/// What the previous release recorded (with its holder) is read by this one, and both
/// releases' references stay as either writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the previous release's binary: bash scripts/mixed-release.sh"]
async fn what_the_previous_release_recorded_is_read_without_loss() {
    let h = start().await;
    let old = run_release(
        &h,
        true,
        &with_holder(ensure_args("1.506.0", SHA_A, "b-old", "r-old"), "host-old"),
    )
    .await;
    assert_eq!(old.code, 0, "{}", old.stderr);
    let new = run_release(
        &h,
        false,
        &with_holder(ensure_args("1.506.0", SHA_A, "b-old", "r-new"), "host-new"),
    )
    .await;
    assert_eq!(new.code, 0, "{}", new.stderr);
    let again = run_release(
        &h,
        true,
        &with_holder(
            ensure_args("1.506.0", SHA_A, "b-old", "r-old-2"),
            "host-old",
        ),
    )
    .await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    let doc = lookup(&h).await;
    let refs = refs(&doc);
    for r in ["r-old", "r-new", "r-old-2"] {
        assert!(refs.contains(&r.to_string()), "{r} kept: {doc}");
    }
    assert_eq!(
        holder_of(&doc, "r-old").as_deref(),
        Some("host-old"),
        "{doc}"
    );
    assert_eq!(
        holder_of(&doc, "r-new").as_deref(),
        Some("host-new"),
        "{doc}"
    );
}

/// Eight hosts, every other one still on the previous release, add their references to one
/// version at once: the two releases exclude each other, and no reference is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the previous release's binary: bash scripts/mixed-release.sh"]
async fn both_releases_writing_one_version_at_once_lose_nothing() {
    let h = start().await;
    let first = run_release(&h, false, &ensure_args("1.506.0", SHA_A, "b", "r-first")).await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    // Every version write lasts 2 s: writers that did not exclude each other would overlap, and
    // whole-tag-set writes would erase each other's references.
    admin(
        &h,
        "PUT",
        "/_emulator/timing",
        Some(serde_json::json!({"version_write_ms": 2000})),
    )
    .await;
    let runs = futures::future::join_all((0..8).map(|i| {
        let h = &h;
        async move {
            let r = format!("r-{i}");
            (
                r.clone(),
                run_release(h, i % 2 == 0, &ensure_args("1.506.0", SHA_A, "b", &r)).await,
            )
        }
    }))
    .await;
    for (r, run) in &runs {
        assert_eq!(run.code, 0, "{r}: {}", run.stderr);
    }
    let refs = refs(&lookup(&h).await);
    for (r, _) in &runs {
        assert!(refs.contains(r), "{r} kept: {refs:?}");
    }
    assert!(refs.contains(&"r-first".to_string()), "{refs:?}");
}
