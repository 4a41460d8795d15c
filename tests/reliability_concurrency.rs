//! Concurrency across processes: eight hosts seeding at once against one emulator (one gallery,
//! one storage account, the blob-lease lock between them). Eight seeding the same stemcell make
//! one blob and one version holding all eight references; eight seeding eight different stemcells
//! (all in one image definition, which none of them finds at the start) make eight versions with
//! one reference each, and no process fails.

#[path = "reliability_support/mod.rs"]
mod reliability_support;
#[path = "seed_support/mod.rs"]
mod seed_support;

use std::collections::{BTreeMap, BTreeSet};

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
    let tags: BTreeMap<String, String> =
        serde_json::from_value(version["tags"].clone()).unwrap_or_default();
    stemcell_gallery::gallery::tags::references(&tags)
        .into_iter()
        .collect()
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

/// The same races through the reliability helpers (short knobs, fault injection): the same
/// stemcell seeded by eight processes while ARM throttles, a version PUT's response is lost after
/// it took effect, tag updates meet 503s, lock-lease requests drop and Put Pages fail.
mod under_faults {
    use std::collections::BTreeSet;
    use std::process::{Child, Stdio};
    use std::time::Instant;

    use super::reliability_support::*;
    use serde_json::json;
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
}

/// Issue 14 item 9: a director seed and a create-env seed of the same stemcell at once (two
/// image definitions, one content). The upload is one identity (its digest): the second waits for
/// the first's upload lock and reuses its blob instead of deleting it in flight as a leftover.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn director_and_create_env_seeding_the_same_stemcell_at_once_both_succeed() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (stemcell, _) = write_stemcell(dir.path(), "same.tgz", &small_spec("'1.506'", 9, 8));
    // The director's upload is slow: its page writes are held a while each.
    let fault = serde_json::json!({"method": "PUT", "path": "*/bosh-stemcell-*.vhd", "query": "comp=page", "delay_ms": 700, "count": 4});
    let resp = reqwest::Client::new()
        .post(format!("{}/_emulator/faults", world.emulator.arm))
        .json(&fault)
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success());
    let mut director = world.seed_command(&stemcell, &["--reference", "director-cid"]);
    let director = tokio::task::spawn_blocking(move || {
        seed_support::Seeded::from(director.output().expect("the binary runs"))
    });
    // Start the create-env publish once the director's upload is in flight.
    let container = world.container();
    let mut in_flight = false;
    for _ in 0..500 {
        let blobs = stemcell_gallery::azure::blob::list_stemcell_blobs(&container)
            .await
            .unwrap_or_default();
        if blobs.iter().any(|b| !b.is_complete()) {
            in_flight = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(in_flight, "the director's upload was seen in flight");
    let create_env = world
        .seed(
            &stemcell,
            &["--create-env", "--reference", "create-env-cid"],
        )
        .await;
    let director = director.await.unwrap();
    director.assert_ok();
    create_env.assert_ok();
    for definition in [DEFINITION.to_string(), format!("{DEFINITION}-create-env")] {
        let v = world
            .version(&definition, "1.506.0")
            .await
            .unwrap_or_else(|| panic!("{definition}/1.506.0 exists"));
        assert_eq!(
            v["properties"]["provisioningState"], "Succeeded",
            "{definition}"
        );
    }
    let blobs = world.stemcell_blobs().await;
    assert!(
        blobs.iter().all(|b| b.is_complete()),
        "no partial upload left"
    );
}
