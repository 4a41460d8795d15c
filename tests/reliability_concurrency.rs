//! Concurrency (issue #9): processes seeding at once against one emulator. `tests/gallery_emulator.rs`
//! already runs 8 `ensure` processes on one version; these run the whole `seed` (upload lock,
//! sparse upload, definition, version, replication wait):
//! - 8 processes seeding the same stemcell, each with its own reference: all exit 0, exactly one
//!   version (one PUT), one complete blob (one upload), every reference recorded;
//! - 8 processes seeding 8 different stemcells: all exit 0, one Succeeded version per stemcell
//!   with its reference, one complete blob each, one definition, no partial upload.
//!
//! Then the same-stemcell race again with throttling and dropped connections sprinkled in.

mod reliability_support;

use std::collections::BTreeSet;
use std::process::{Child, Stdio};
use std::time::Instant;

use reliability_support::*;
use serde_json::{json, Value};
use stemcell_gallery::azure::blob::list_stemcell_blobs;
use stemcell_gallery::emulator::{Handle, Options};

fn spawn(h: &Handle, args: &[String]) -> Child {
    let mut cmd = binary(h);
    // Contention is the point here: the default budgets, only a shorter request timeout.
    cmd.env_remove("STEMCELL_GALLERY_ARM_RETRIES")
        .env_remove("STEMCELL_GALLERY_BLOB_RETRIES")
        .env("STEMCELL_GALLERY_HTTP_TIMEOUT", "10")
        .env("STEMCELL_GALLERY_OPERATION_TIMEOUT", "120");
    cmd.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts")
}

async fn wait_all(children: Vec<Child>) -> Vec<Run> {
    let started = Instant::now();
    tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|c| run_output(c.wait_with_output().unwrap(), started))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap()
}

fn puts_of(h: &Handle, key: &str) -> usize {
    h.state
        .requests()
        .into_iter()
        .filter(|r| r.method == "PUT" && r.path.ends_with(&format!("/versions/{key}")))
        .count()
}

async fn same_stemcell_race(h: &Handle, n: usize) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let (path, sha) = stemcell(dir.path(), "1.506", 21, 8);
    let started = Instant::now();
    let children: Vec<Child> = (0..n)
        .map(|i| spawn(h, &seed_args(&path, &format!("bosh-stemcell-p{i}"))))
        .collect();
    let runs = wait_all(children).await;
    let seconds = started.elapsed().as_secs_f64();
    let mut ids = BTreeSet::new();
    for (i, r) in runs.iter().enumerate() {
        assert_eq!(r.code, 0, "process {i}: {}", r.stderr);
        assert_eq!(r.json["image_sha256"], sha.as_str());
        ids.insert(r.json["id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), 1, "every process prints the same version id");
    let refs: Vec<String> = (0..n).map(|i| format!("bosh-stemcell-p{i}")).collect();
    let refs: Vec<&str> = refs.iter().map(String::as_str).collect();
    // One version with every reference, one complete blob, no partial.
    check_converged(h, "1.506.0", &refs).await.unwrap();
    let uploaded = runs.iter().filter(|r| r.json["uploaded"] == true).count();
    assert_eq!(uploaded, 1, "exactly one process uploaded");
    seconds
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_seeding_the_same_stemcell_make_one_version_with_eight_references() {
    let h = start_with(Options {
        polls_to_complete: 2,
        ..Options::default()
    })
    .await;
    let seconds = same_stemcell_race(&h, 8).await;
    assert_eq!(puts_of(&h, "1.506.0"), 1, "exactly one version PUT");
    println!("8 × seed of one stemcell: {seconds:.1} s, 1 version, 8 references, 1 upload");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_seeding_eight_stemcells_make_eight_versions() {
    let h = start_with(Options {
        polls_to_complete: 2,
        ..Options::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let stemcells: Vec<(String, std::path::PathBuf, String)> = (0..8)
        .map(|i| {
            let version = format!("1.{}", 600 + i);
            let (path, sha) = stemcell(dir.path(), &version, 100 + i as u64, 4);
            (version, path, sha)
        })
        .collect();
    let started = Instant::now();
    let children: Vec<Child> = stemcells
        .iter()
        .enumerate()
        .map(|(i, (_, path, _))| spawn(&h, &seed_args(path, &format!("bosh-stemcell-s{i}"))))
        .collect();
    let runs = wait_all(children).await;
    let seconds = started.elapsed().as_secs_f64();
    for (i, r) in runs.iter().enumerate() {
        assert_eq!(r.code, 0, "process {i}: {}", r.stderr);
    }
    let versions: Vec<Value> = versions(&h, DEFINITION).await;
    assert_eq!(versions.len(), 8, "one version per stemcell");
    let blobs = list_stemcell_blobs(&storage(&h).container("stemcell"))
        .await
        .unwrap();
    assert_eq!(blobs.len(), 8, "one blob per stemcell");
    assert!(blobs.iter().all(|b| b.is_complete()), "no partial upload");
    for (i, (version, _, sha)) in stemcells.iter().enumerate() {
        let key = format!("{version}.0");
        let v = versions
            .iter()
            .find(|v| v["name"] == key.as_str())
            .unwrap_or_else(|| panic!("version {key} missing"));
        assert_eq!(state_of(v), "Succeeded", "{key}");
        assert_eq!(v["tags"]["image_sha256"], sha.as_str(), "{key}");
        assert_eq!(
            references_of(v),
            vec![format!("bosh-stemcell-s{i}")],
            "{key} carries its reference"
        );
        assert_eq!(puts_of(&h, &key), 1, "{key}: exactly one version PUT");
        let source = v["properties"]["storageProfile"]["osDiskImage"]["source"]["uri"]
            .as_str()
            .unwrap();
        assert!(
            blobs.iter().any(|b| source.ends_with(&b.name)),
            "{key}: its source blob exists"
        );
    }
    let definitions = h
        .state
        .requests()
        .into_iter()
        .filter(|r| r.method == "PUT" && r.path.ends_with(&format!("/images/{DEFINITION}")))
        .count();
    assert!(definitions >= 1, "the definition was created");
    println!("8 × seed of 8 stemcells: {seconds:.1} s, 8 versions, 8 blobs, {definitions} definition PUT(s)");
}

/// The same-stemcell race while ARM throttles and connections drop: still one version with
/// every reference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_seeding_one_stemcell_under_throttling_and_drops_still_converge() {
    let h = start_with(Options {
        polls_to_complete: 2,
        ..Options::default()
    })
    .await;
    for f in [
        json!({"method": "GET", "path": "*/versions/1.506.0", "status": 429, "retry_after": 1, "count": 6}),
        json!({"method": "PUT", "path": "*/versions/1.506.0", "hold_after": true, "drop": true}),
        json!({"method": "PATCH", "path": "*/versions/1.506.0", "status": 503, "count": 3}),
        json!({"method": "PUT", "path": "*.lock", "query": "comp=lease", "drop": true, "count": 4}),
        json!({"method": "PUT", "path": "*/bosh-stemcell-*.vhd", "query": "comp=page", "status": 500, "count": 3}),
    ] {
        add_fault(&h, f).await;
    }
    let seconds = same_stemcell_race(&h, 8).await;
    println!("8 × seed of one stemcell under faults: {seconds:.1} s, 1 version, 8 references");
}
