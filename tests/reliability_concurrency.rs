//! Concurrency across processes: eight hosts seeding at once against one emulator (one gallery,
//! one storage account, the blob-lease lock between them). Eight seeding the same stemcell make
//! one blob and one version holding all eight references; eight seeding eight different stemcells
//! (all in one image definition, which none of them finds at the start) make eight versions with
//! one reference each, and no process fails.

#[path = "seed_support/mod.rs"]
mod seed_support;

use std::collections::BTreeSet;

use seed_support::{small_spec, write_stemcell, World, DEFINITION};
use serde_json::Value;

const HOSTS: usize = 8;

/// Start every command at once and wait for all of them.
async fn all_at_once(
    world: &World,
    runs: Vec<(std::path::PathBuf, String)>,
) -> Vec<seed_support::Seeded> {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(runs.len()));
    let mut tasks = Vec::new();
    for (stemcell, reference) in runs {
        let mut cmd = world.seed_command(&stemcell, &["--reference", &reference]);
        let barrier = barrier.clone();
        tasks.push(tokio::task::spawn_blocking(move || {
            barrier.wait();
            seed_support::Seeded::from(cmd.output().expect("the binary runs"))
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("the runner thread finishes"));
    }
    out
}

fn references(version: &Value) -> BTreeSet<String> {
    let tags = version["tags"].as_object().cloned().unwrap_or_default();
    let mut refs = BTreeSet::new();
    for (k, v) in tags {
        if k.starts_with("sg_refs_") {
            for r in v.as_str().unwrap_or_default().split(',') {
                if !r.trim().is_empty() {
                    refs.insert(r.trim().to_string());
                }
            }
        }
    }
    refs
}

fn version_puts(world: &World) -> usize {
    world
        .writes()
        .iter()
        .filter(|w| w.starts_with("PUT ") && w.contains("/versions/"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_hosts_seeding_the_same_stemcell_make_one_blob_and_one_version_with_every_reference()
{
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (stemcell, _) = write_stemcell(dir.path(), "same.tgz", &small_spec("'1.506'", 7, 8));
    let runs = (0..HOSTS)
        .map(|i| (stemcell.clone(), format!("host-{i}")))
        .collect();
    let results = all_at_once(&world, runs).await;
    let mut outcomes = Vec::new();
    for r in &results {
        let json = r.assert_ok();
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
        outcomes.push(json["outcome"].as_str().unwrap_or_default().to_string());
    }
    let ids: BTreeSet<_> = results.iter().map(|r| r.json["id"].to_string()).collect();
    assert_eq!(ids.len(), 1, "every host reports the same version: {ids:?}");
    assert_eq!(
        outcomes.iter().filter(|o| *o == "created").count(),
        1,
        "exactly one host created it: {outcomes:?}"
    );
    assert_eq!(
        version_puts(&world),
        1,
        "one version PUT: {:?}",
        world.writes()
    );
    assert_eq!(world.stemcell_blobs().await.len(), 1, "one uploaded blob");
    let version = world
        .version(DEFINITION, "1.506.0")
        .await
        .expect("the version exists");
    assert_eq!(version["properties"]["provisioningState"], "Succeeded");
    let expected: BTreeSet<String> = (0..HOSTS).map(|i| format!("host-{i}")).collect();
    assert_eq!(references(&version), expected, "every reference kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_hosts_seeding_eight_stemcells_make_eight_versions_in_one_new_definition() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let runs: Vec<_> = (0..HOSTS)
        .map(|i| {
            let (path, _) = write_stemcell(
                dir.path(),
                &format!("s{i}.tgz"),
                &small_spec(&format!("'1.{}'", 500 + i), 100 + i as u64, 4),
            );
            (path, format!("host-{i}"))
        })
        .collect();
    let results = all_at_once(&world, runs).await;
    for r in &results {
        r.assert_ok();
        assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    }
    assert_eq!(
        version_puts(&world),
        HOSTS,
        "one PUT per version: {:?}",
        world.writes()
    );
    assert_eq!(
        world.stemcell_blobs().await.len(),
        HOSTS,
        "one blob per stemcell"
    );
    for i in 0..HOSTS {
        let key = format!("1.{}.0", 500 + i);
        let version = world
            .version(DEFINITION, &key)
            .await
            .unwrap_or_else(|| panic!("version {key} exists"));
        assert_eq!(
            version["properties"]["provisioningState"], "Succeeded",
            "{key}"
        );
        assert_eq!(
            references(&version),
            BTreeSet::from([format!("host-{i}")]),
            "{key} holds its host's reference"
        );
    }
}
