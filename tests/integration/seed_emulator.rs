//! `seed` as an operator runs it, against the emulator (ARM and its blob store): a sparse upload
//! that equals the VHD, nothing uploaded twice, conflicts refused before any upload, bad input
//! refused before any request, a killed upload that converges, and the create-env definition.

use crate::support::seeding;

use std::time::Duration;

use crate::support::emulated::{gallery_path, Raw};
use seeding::*;
use stemcell_gallery::emulator::Fault;
use stemcell_gallery::stemcell::testgen::ShaField;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_uploads_only_data_then_reuses_and_refuses_a_different_build() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let spec = small_spec("'1.506'", 7, 4);
    let (path, generated) = write_stemcell(dir.path(), "a.tgz", &spec);
    let vhd = vhd_bytes(&spec);

    // First seed: created from a new blob holding exactly the VHD.
    let first = world.seed(&path, &[]).await;
    let j = first.assert_ok();
    assert_eq!(j["outcome"], "created");
    assert_eq!(j["definition"], DEFINITION);
    assert_eq!(j["version"], "1.506.0");
    assert_eq!(j["mode"], "director");
    assert_eq!(j["provisioning_state"], "Succeeded");
    assert_eq!(j["image_sha256"], generated.image_sha256);
    assert_eq!(j["uploaded"], true);
    assert_eq!(j["bytes_read"], generated.vhd_file_size);
    assert_eq!(j["bytes_sent"], generated.data_bytes);
    assert_eq!(j["zero_bytes_skipped"], generated.zero_bytes);
    let cid = j["cid"].as_str().unwrap().to_string();
    assert!(cid.starts_with("bosh-stemcell-"), "{cid}");
    let blob_name = format!("{cid}.vhd");
    assert!(j["blob_uri"]
        .as_str()
        .unwrap()
        .ends_with(&format!("/stemcell/{blob_name}")));
    let blobs = world.stemcell_blobs().await;
    assert_eq!(blobs.len(), 1);
    assert!(blobs[0].is_complete());
    assert_eq!(blobs[0].metadata["image_sha256"], generated.image_sha256);
    assert_eq!(blobs[0].metadata["compute_gallery_name"], GALLERY);
    assert_eq!(
        blobs[0].metadata["compute_gallery_image_definition"],
        DEFINITION
    );
    assert_blob_is_vhd(&world.container(), &blob_name, &vhd).await;
    let version = world
        .version(DEFINITION, "1.506.0")
        .await
        .expect("version exists");
    // No --reference: none recorded (DESIGN.md §4 "`seed` records none unless asked"), and the
    // JSON says so.
    assert_eq!(j["reference"], serde_json::Value::Null, "{j}");
    // The CPI's tag is there, empty: the Azure CPI reuses only versions carrying it (REFERENCE.md).
    assert_eq!(version["tags"]["stemcell_references"], "");
    assert!(
        version["tags"].get("stemcell_name").is_none(),
        "{}",
        version["tags"]
    );

    // Second seed of the same stemcell: nothing sent, the version reused, its reference recorded.
    world.emulator.state.reset_log();
    let again = world.seed(&path, &["--reference", "ops-preseed"]).await;
    let j = again.assert_ok();
    assert_eq!(j["outcome"], "reused");
    assert_eq!(j["reference"], "ops-preseed");
    assert_eq!(j["uploaded"], false);
    assert_eq!(j["bytes_sent"], 0);
    // Issue 16 item 5: a reuse decided by the image's digest does not inflate the image.
    assert_eq!(j["bytes_read"], 0, "{j}");
    assert_eq!(world.stemcell_blobs().await.len(), 1, "no second blob");
    let writes = world.writes();
    assert!(
        !writes.iter().any(|w| w.contains("bosh-stemcell-")),
        "no blob written: {writes:?}"
    );
    assert!(
        writes
            .iter()
            .all(|w| w.starts_with("PATCH") || w.contains("/locks/") || w.contains("/galleries/") || w.contains("restype=container")),
        "only the tags-only reference update (under the service's version lock) was written: {writes:?}"
    );
    let refs = refs_of(&world.version(DEFINITION, "1.506.0").await.unwrap());
    assert_eq!(
        refs,
        vec!["ops-preseed"],
        "only the asked-for reference, not the CID {cid}"
    );

    // A different build under the same version: conflict, exit 4, nothing uploaded.
    let other_spec = small_spec("'1.506'", 99, 4);
    let (other, other_gen) = write_stemcell(dir.path(), "b.tgz", &other_spec);
    world.emulator.state.reset_log();
    let refused = world.seed(&other, &[]).await;
    assert_eq!(refused.code, 4, "{}\n{}", refused.json, refused.stderr);
    let message = refused.json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&generated.image_sha256) && message.contains(&other_gen.image_sha256),
        "{message}"
    );
    assert_eq!(world.stemcell_blobs().await.len(), 1, "no new blob");
    assert_eq!(world.writes(), Vec::<String>::new(), "nothing written");
}

/// Issue 15 item 2: `seed` used to record its new CID, which no director holds and none will ever
/// delete, so a pre-seeded version nobody adopted was kept forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_seeded_version_nobody_adopted_is_an_orphan_for_cleanup() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.507'", 3, 2));
    let seeded = world.seed(&path, &[]).await;
    let j = seeded.assert_ok();
    assert_eq!(j["reference"], serde_json::Value::Null, "{j}");

    let plan = world
        .run(&["cleanup", "--min-age", "0s", "--keep-latest", "0"])
        .await;
    assert_eq!(plan.code, 0, "{}\n{}", plan.json, plan.stderr);
    let versions = plan.json["versions"]
        .as_array()
        .expect("the plan lists versions");
    let v = versions
        .iter()
        .find(|v| v["version"] == "1.507.0")
        .unwrap_or_else(|| panic!("1.507.0 is in the plan: {}", plan.json));
    assert_eq!(v["verdict"], "delete", "nobody adopted it: {v}");
}

/// Issue 32: on a miss the image's SHA-1 is checked while it uploads (one read), so a wrong one is
/// found after pages were sent: the blob is deleted, nothing is written through ARM, no version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_manifest_sha1_found_during_the_upload_leaves_nothing() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = small_spec("'1.506'", 3, 2);
    spec.sha = ShaField::Literal("0123456789abcdef0123456789abcdef01234567".into());
    let (path, _) = write_stemcell(dir.path(), "bad.tgz", &spec);
    world.emulator.state.reset_log();

    let out = world.seed(&path, &[]).await;
    assert_eq!(out.code, 1, "{}\n{}", out.json, out.stderr);
    let message = out.json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("sha1") || message.contains("SHA-1"),
        "{message}"
    );
    assert!(message.contains("download the stemcell again"), "{message}");
    let writes = world.writes();
    let arm: Vec<&String> = writes
        .iter()
        .filter(|w| w.contains("/subscriptions/"))
        .collect();
    assert!(arm.is_empty(), "no ARM write: {arm:?}");
    assert!(
        writes
            .iter()
            .any(|w| w.starts_with("DELETE /devstoreaccount1/stemcell/bosh-stemcell-")),
        "the blob written was deleted: {writes:?}"
    );
    assert!(world.stemcell_blobs().await.is_empty(), "no blob left");
    assert!(
        world.version(DEFINITION, "1.506.0").await.is_none(),
        "no version"
    );
}

/// Issue 16 item 3: `seed` used to upload the whole VHD, then fail on the missing gallery and
/// leave the blob behind. The gallery is now checked before the first byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_into_a_gallery_that_does_not_exist_uploads_nothing() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 3));
    world.emulator.state.reset_log();

    let stemcell = path.display().to_string();
    let cmd = world.command_in("no_such_gallery", &["seed", &stemcell]);
    let out = run_to_end(cmd).await;
    assert_eq!(out.code, 3, "not found: {}\n{}", out.json, out.stderr);
    let message = out.json["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no_such_gallery") && message.contains("az sig create"),
        "names the gallery and how to create it: {message}"
    );
    assert!(message.contains("nothing was uploaded"), "{message}");
    assert_eq!(
        world.writes(),
        Vec::<String>::new(),
        "no blob, no lock, no PUT"
    );
    assert!(world.stemcell_blobs().await.is_empty(), "no blob left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_part_version_is_refused_before_any_request() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "four.tgz", &small_spec("'1.2.3.4'", 3, 1));
    world.emulator.state.reset_log();
    let out = world.seed(&path, &[]).await;
    assert_eq!(out.code, 1, "{}\n{}", out.json, out.stderr);
    assert!(out.json["error"]["message"]
        .as_str()
        .unwrap()
        .contains("1.2.3.4"));
    assert!(
        world.emulator.state.requests().is_empty(),
        "not a single request"
    );
}

/// A 75-character stemcell name is a valid definition name, but not with `-create-env` after it:
/// refused before anything is uploaded, naming the suffix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_env_name_past_azures_limit_is_refused_before_any_request() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut spec = small_spec("'1.506'", 5, 1);
    spec.name = format!("bosh-azure-hyperv-{}", "x".repeat(57));
    assert_eq!(spec.name.len(), 75);
    let (path, _) = write_stemcell(dir.path(), "long.tgz", &spec);
    world.emulator.state.reset_log();
    let out = world.seed(&path, &["--create-env"]).await;
    assert_eq!(out.code, 2, "{}\n{}", out.json, out.stderr);
    let message = out.json["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("cannot be an image definition name")
            && message.contains("create_env_suffix"),
        "{message}"
    );
    assert!(
        world.emulator.state.requests().is_empty(),
        "not a single request: {:?}",
        world.writes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_env_seed_goes_to_the_create_env_definition() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 2));
    let out = world.seed(&path, &["--create-env"]).await;
    let j = out.assert_ok();
    let def = format!("{DEFINITION}-create-env");
    assert_eq!(j["definition"], def.as_str());
    assert_eq!(j["mode"], "create-env");
    let v = world
        .version(&def, "1.506.0")
        .await
        .expect("create-env version");
    assert_eq!(v["tags"]["stemcell_gallery_mode"], "create-env");
    assert!(
        world.version(DEFINITION, "1.506.0").await.is_none(),
        "director definition untouched"
    );

    // The director then seeds the same stemcell: its own version, no 409, the blob reused.
    let director = world.seed(&path, &[]).await;
    let j = director.assert_ok();
    assert_eq!(j["definition"], DEFINITION);
    assert_eq!(j["outcome"], "created");
    assert_eq!(
        j["bytes_sent"], 0,
        "the complete blob of the same content is reused"
    );
    assert_eq!(world.stemcell_blobs().await.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn target_regions_are_validated_and_replicated() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'2.1'", 5, 1));
    let bad = world
        .seed(&path, &["--target-region", "eastus=1=Ultra_LRS"])
        .await;
    assert_eq!(bad.code, 2, "usage error: {}", bad.stderr);
    assert!(bad.stderr.contains("Standard_LRS"), "{}", bad.stderr);

    let out = world
        .seed(
            &path,
            &[
                "--target-region",
                "westeurope=2",
                "--target-region",
                "eastus=1=Standard_ZRS",
            ],
        )
        .await;
    let j = out.assert_ok();
    assert_eq!(j["replication"], "Completed");
    let v = world.version(DEFINITION, "2.1.0").await.unwrap();
    let regions = v["properties"]["publishingProfile"]["targetRegions"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(regions.len(), 2, "{regions:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_upload_rerun_converges_to_one_version_and_one_blob() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    // 96 MiB disk, a quarter of it data in 1 MiB blocks: 24 Put Pages, each slowed down so the
    // upload is still running when it is killed.
    let mut spec = small_spec("'3.1'", 11, 96);
    spec.vhd.block = 1024 * 1024;
    let (path, generated) = write_stemcell(dir.path(), "big.tgz", &spec);
    world.emulator.state.add_fault(Fault {
        method: "PUT".into(),
        path: "*/stemcell/bosh-stemcell-*".into(),
        count: 10_000,
        status: None,
        code: None,
        message: None,
        retry_after: None,
        delay_ms: 150,
        drop: false,
        ..Fault::default()
    });

    let mut child = world.seed_command(&path, &[]).spawn().expect("seed starts");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let put_pages = world
            .emulator
            .state
            .requests()
            .iter()
            .filter(|r| r.method == "PUT" && r.query.contains("comp=page"))
            .count();
        if put_pages > 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no Put Page within 60 s"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "seed ended before uploading"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.kill().expect("kill seed");
    let _ = child.wait();

    let partial = world.stemcell_blobs().await;
    assert_eq!(partial.len(), 1, "one partial blob");
    assert!(
        !partial[0].is_complete(),
        "the killed upload is not marked complete"
    );
    assert!(world.version(DEFINITION, "3.1.0").await.is_none());

    // Re-run: waits out the dead holder's upload lease, replaces the partial blob, converges.
    let rerun = world.seed(&path, &[]).await;
    let j = rerun.assert_ok();
    assert_eq!(j["outcome"], "created");
    assert_eq!(j["bytes_sent"], generated.data_bytes);
    let blobs = world.stemcell_blobs().await;
    assert_eq!(
        blobs.len(),
        1,
        "exactly one blob: {:?}",
        blobs.iter().map(|b| &b.name).collect::<Vec<_>>()
    );
    assert!(blobs[0].is_complete());
    assert_ne!(
        blobs[0].name, partial[0].name,
        "the partial blob was replaced"
    );
    let v = world.version(DEFINITION, "3.1.0").await.unwrap();
    assert_eq!(v["properties"]["provisioningState"], "Succeeded");
}

/// Upgrading from Azure CPI v53.0.0: its versions carry no image_sha256. seed adopts one whose
/// blob holds the same VHD (the CPI wrote it whole, seed's own uploads are sparse: one content
/// digest either way), refuses one whose blob is gone naming --adopt-unverified, and adopts that
/// one without proof when asked, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_adopts_versions_azure_cpi_v53_0_0_made_without_image_sha256_and_says_how() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let cid = "bosh-stemcell-5e3d0000-0000-4000-8000-000000000053";

    // 1.506: the CPI's blob holds this stemcell's VHD.
    let spec = small_spec("'1.506'", 11, 4);
    let (path, generated) = write_stemcell(dir.path(), "a.tgz", &spec);
    world.cpi_v53_version(cid, "1.506", &vhd_bytes(&spec)).await;
    let seeded = world.seed(&path, &["--reference", "ops-pipeline"]).await;
    let j = seeded.assert_ok();
    assert_eq!(j["outcome"], "reused", "{j}");
    assert_eq!(j["uploaded"], false, "{j}");
    assert_eq!(j["adopted"]["proof"], "content-matched", "{j}");
    let v = world.version(DEFINITION, "1.506.0").await.unwrap();
    assert_eq!(v["tags"]["image_sha256"], generated.image_sha256, "{v}");
    assert_eq!(
        refs_of(&v),
        vec![cid.to_string(), "ops-pipeline".to_string()],
        "{v}"
    );

    // 1.507: the CPI's blob is gone.
    let cid2 = "bosh-stemcell-5e3d0000-0000-4000-8000-000000000054";
    let spec = small_spec("'1.507'", 12, 4);
    let (path, generated) = write_stemcell(dir.path(), "b.tgz", &spec);
    world
        .cpi_v53_version(cid2, "1.507", &vhd_bytes(&spec))
        .await;
    world
        .container()
        .blob_client(format!("{cid2}.vhd"))
        .delete()
        .await
        .unwrap();
    let refused = world.seed(&path, &[]).await;
    assert_eq!(refused.code, 4, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("--adopt-unverified") && refused.stderr.contains("gone"),
        "{}",
        refused.stderr
    );
    let adopted = world.seed(&path, &["--adopt-unverified"]).await;
    let j = adopted.assert_ok();
    assert_eq!(j["adopted"]["proof"], "unverified", "{j}");
    assert!(
        adopted.stderr.contains("WITHOUT proof"),
        "{}",
        adopted.stderr
    );
    let v = world.version(DEFINITION, "1.507.0").await.unwrap();
    assert_eq!(v["tags"]["image_sha256"], generated.image_sha256, "{v}");
    assert_eq!(v["tags"]["stemcell_references"], cid2, "{v}");
}

/// One content digest for one disk, however it was written: seed's sparse upload (only the data
/// pages), the Azure CPI's whole upload (every page), and the stemcell's root.vhd read locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_content_digest_of_a_sparse_upload_a_whole_upload_and_the_stemcell_agree() {
    use stemcell_gallery::azure::blob::content_digest;
    use stemcell_gallery::stemcell::{content::ContentSink, read_stemcell};
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let spec = small_spec("'1.508'", 21, 6);
    let (path, _) = write_stemcell(dir.path(), "c.tgz", &spec);
    let j = world.seed(&path, &[]).await.assert_ok().clone();
    let sparse = format!("{}.vhd", j["cid"].as_str().unwrap());
    let whole = "bosh-stemcell-5e3d0000-0000-4000-8000-0000000000ff";
    world
        .cpi_v53_version(whole, "1.509", &vhd_bytes(&spec))
        .await;

    let container = world.container();
    let a = content_digest(&container.blob_client(&sparse))
        .await
        .unwrap()
        .unwrap();
    let b = content_digest(&container.blob_client(format!("{whole}.vhd")))
        .await
        .unwrap()
        .unwrap();
    let mut sink = ContentSink::new();
    read_stemcell(std::fs::File::open(&path).unwrap(), &mut sink).unwrap();
    assert_eq!(a.digest, b.digest);
    assert_eq!(Some(a.digest.as_str()), sink.digest());
    assert!(
        a.bytes_read < b.bytes_read,
        "the sparse blob costs its data: {a:?} {b:?}"
    );
    assert!(
        content_digest(&container.blob_client("bosh-stemcell-absent.vhd"))
            .await
            .unwrap()
            .is_none(),
        "a missing blob is None, not an error"
    );
}

/// `ensure` proves a v53.0.0-era version against the blob it is given: the CPI's whole copy as
/// the version's source, seed's sparse copy of the same stemcell as --blob-uri.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ensure_adopts_a_version_azure_cpi_v53_0_0_made_when_the_given_blob_holds_the_same_vhd() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let spec = small_spec("'1.510'", 31, 4);
    let (path, generated) = write_stemcell(dir.path(), "d.tgz", &spec);
    let cid = "bosh-stemcell-5e3d0000-0000-4000-8000-000000000510";
    world.cpi_v53_version(cid, "1.510", &vhd_bytes(&spec)).await;
    // The same stemcell, seeded for create-env: a sparse blob of ours.
    let j = world
        .seed(&path, &["--create-env"])
        .await
        .assert_ok()
        .clone();
    let blob_uri = j["blob_uri"].as_str().unwrap().to_string();

    let args = [
        "ensure",
        "--blob-uri",
        blob_uri.as_str(),
        "--name",
        DEFINITION,
        "--version",
        "1.510",
        "--reference",
        "ops",
    ];
    let r = world.run(&args).await;
    let j = r.assert_ok();
    assert_eq!(j["outcome"], "reused", "{j}");
    assert_eq!(j["adopted"]["proof"], "content-matched", "{j}");
    let v = world.version(DEFINITION, "1.510.0").await.unwrap();
    assert_eq!(v["tags"]["image_sha256"], generated.image_sha256, "{v}");
    assert_eq!(refs_of(&v), vec![cid.to_string(), "ops".to_string()], "{v}");
}

/// The references of a version as this tool reads them (the CPI's CID stays in its tag, ours
/// lives in the overflow).
fn refs_of(v: &serde_json::Value) -> Vec<String> {
    let t: std::collections::BTreeMap<String, String> =
        serde_json::from_value(v["tags"].clone()).unwrap();
    stemcell_gallery::gallery::tags::references(&t)
}

/// Issue 16: the version's `storageAccountId` names the real account. The storage account
/// lives in its own resource group (common: one storage resource group for many galleries);
/// without `storage_account_resource_group` the tool assumed the gallery's, and Azure refuses a
/// source whose `storageAccountId` does not name the uri's account. The tool resolves it through
/// ARM (`GET /subscriptions/{s}/providers/Microsoft.Storage/storageAccounts`) before any byte is
/// uploaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_names_the_storage_account_in_its_own_resource_group_not_the_gallerys() {
    let world = World::start_with_storage_account_in("stemcell-storage-rg").await;
    let dir = tempfile::tempdir().unwrap();
    let spec = small_spec("'1.507'", 11, 2);
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &spec);
    let seeded = world.seed(&path, &[]).await;
    seeded.assert_ok();
    let version = world.version(DEFINITION, "1.507.0").await.expect("created");
    assert_eq!(
        version["properties"]["storageProfile"]["osDiskImage"]["source"]["storageAccountId"],
        format!("/subscriptions/{SUB}/resourceGroups/stemcell-storage-rg/providers/Microsoft.Storage/storageAccounts/devstoreaccount1"),
    );
    // Resolved once, before the first byte of the VHD.
    let requests = world.emulator.state.requests();
    let lookups: Vec<usize> = requests
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            r.path
                .ends_with("/providers/Microsoft.Storage/storageAccounts")
        })
        .map(|(i, _)| i)
        .collect();
    assert_eq!(lookups.len(), 1, "one lookup per process");
    let first_upload = requests
        .iter()
        .position(|r| r.path.contains("bosh-stemcell-") && r.method == "PUT")
        .expect("the VHD was uploaded");
    assert!(lookups[0] < first_upload, "resolved before uploading");
}

/// An account the identity cannot find in the subscription is a clear error naming the account,
/// the subscription and the remedy, before anything is uploaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_refuses_a_storage_account_it_cannot_find_before_uploading() {
    let world = World::start_with(stemcell_gallery::emulator::Options {
        world: Some(stemcell_gallery::emulator::World {
            resources: vec![serde_json::json!({
                "id": "/subscriptions/99999999-2222-3333-4444-555555555555/resourceGroups/elsewhere/providers/Microsoft.Storage/storageAccounts/devstoreaccount1",
                "location": LOC,
            })],
        }),
        ..Default::default()
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.508'", 12, 2));
    let refused = world.seed(&path, &[]).await;
    assert_eq!(refused.code, 1, "{}\n{}", refused.json, refused.stderr);
    let message = refused.json["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("storage account devstoreaccount1 not found in subscription")
            && message.contains(SUB)
            && message.contains("storage_account_resource_group"),
        "{message}"
    );
    assert!(world.stemcell_blobs().await.is_empty(), "nothing uploaded");
    assert!(
        !world.writes().iter().any(|w| w.contains("bosh-stemcell-")),
        "{:?}",
        world.writes()
    );
}

/// Issue 16: a version PUT that Azure refuses synchronously (400, e.g. `InvalidVhd`) leaves
/// nothing half-made: no version, no lock held, the uploaded blob complete and reused by the
/// re-run; the error names the version and Azure's code, and the exit code is 1 (an error, not
/// a conflict). The definition created for the version stays (Azure keeps it; it is what a
/// re-run needs, and `cleanup` never deletes definitions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_put_refused_synchronously_leaves_no_version_no_lock_and_a_reusable_blob() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.509'", 13, 2));
    world.emulator.state.add_fault(Fault {
        method: "PUT".into(),
        path: "*/versions/*".into(),
        status: Some(400),
        code: Some("InvalidVhd".into()),
        message: Some(
            "The specified VHD is not fixed: Disk is expected to have cookie value 'conectix'."
                .into(),
        ),
        ..Fault::default()
    });
    let refused = world.seed(&path, &[]).await;
    assert_eq!(refused.code, 1, "{}\n{}", refused.json, refused.stderr);
    let message = refused.json["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("InvalidVhd")
            && message.contains("1.509.0")
            && message.contains("nothing was created")
            && message.contains("run again"),
        "{message}"
    );
    assert!(
        world.version(DEFINITION, "1.509.0").await.is_none(),
        "no version"
    );
    // No lease left on any lock blob.
    let container = world.container();
    for b in container.list().await.unwrap() {
        assert_ne!(
            b.lease_state,
            Some(azure_storage_blob::models::LeaseState::Leased),
            "{} is still leased",
            b.name
        );
    }
    let blobs = world.stemcell_blobs().await;
    assert_eq!(blobs.len(), 1, "the upload stays");
    assert!(blobs[0].is_complete(), "and is complete");
    // The re-run reuses the blob: nothing uploaded again.
    let again = world.seed(&path, &[]).await;
    let j = again.assert_ok();
    assert_eq!(j["outcome"], "created");
    assert_eq!(j["bytes_sent"], 0, "{j}");
    assert_eq!(world.stemcell_blobs().await.len(), 1);
}

/// A re-run of seed for a stemcell the gallery already holds observes the version once (one
/// plain GET, as `ensure` does), then only waits for replication (issue 17: it was two GETs, one
/// by publish and one by the service, beside each other).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seed_rerun_that_reuses_the_version_observes_it_once() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 3));
    world.seed(&path, &[]).await.assert_ok();
    world.emulator.state.reset_log();

    let again = world.seed(&path, &[]).await;
    assert_eq!(again.assert_ok()["outcome"], "reused");
    let version_gets: Vec<String> = world
        .emulator
        .state
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/versions/1.506.0"))
        .filter(|r| !r.query.to_ascii_lowercase().contains("expand"))
        .map(|r| format!("{}?{}", r.path, r.query))
        .collect();
    assert_eq!(version_gets.len(), 1, "{version_gets:#?}");
    assert_eq!(
        world.writes(),
        Vec::<String>::new(),
        "a reuse writes nothing"
    );
}

/// Issue 30 item 6: `seed --end-of-life SPAN --block-deletion-before-end-of-life` creates the
/// version with both, sent explicitly (so no api-version default decides for it); a version
/// made without them carries `blockDeletionBeforeEndOfLife: false` and no end of life.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_sets_the_end_of_life_and_the_deletion_block_it_is_asked_for() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (guarded, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 3));
    let (plain, _) = write_stemcell(dir.path(), "b.tgz", &small_spec("'1.507'", 5, 3));
    let before = time::OffsetDateTime::now_utc();
    world
        .seed(
            &guarded,
            &[
                "--end-of-life",
                "180days",
                "--block-deletion-before-end-of-life",
            ],
        )
        .await
        .assert_ok();
    world.seed(&plain, &[]).await.assert_ok();
    let raw = Raw::new(&world.emulator.arm);
    let at_2024 = |key: &str| {
        format!(
            "{}/images/{DEFINITION}/versions/{key}?api-version=2024-03-03",
            gallery_path(GALLERY)
        )
    };
    let v = raw.get(&at_2024("1.506.0")).await.body;
    assert_eq!(
        v["properties"]["safetyProfile"]["blockDeletionBeforeEndOfLife"], true,
        "{v}"
    );
    let eol = time::OffsetDateTime::parse(
        v["properties"]["publishingProfile"]["endOfLifeDate"]
            .as_str()
            .unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert!(
        (179..=181).contains(&(eol - before).whole_days()),
        "180 days after publishing: {eol}"
    );
    let p = raw.get(&at_2024("1.507.0")).await.body;
    assert_eq!(
        p["properties"]["safetyProfile"]["blockDeletionBeforeEndOfLife"], false,
        "{p}"
    );
    assert!(p["properties"]["publishingProfile"]
        .get("endOfLifeDate")
        .is_none());
}

/// Issue 30 item 6: a past end of life, an unreadable one, or a block with none is refused
/// before any request writes anything (exit 2, naming the remedy).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_past_or_malformed_end_of_life_or_an_endless_block_is_refused_before_any_write() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 3));
    world.emulator.state.reset_log();
    for (flags, says) in [
        (vec!["--end-of-life", "2020-01-01"], "not in the future"),
        (vec!["--end-of-life", "soon"], "not an end of life"),
        (
            vec!["--block-deletion-before-end-of-life"],
            "needs an end of life",
        ),
    ] {
        let out = world.seed(&path, &flags).await;
        assert_eq!(out.code, 2, "{flags:?}: {}\n{}", out.json, out.stderr);
        assert!(
            out.stderr.contains(says) || out.json.to_string().contains(says),
            "{flags:?} says {says:?}: {}\n{}",
            out.json,
            out.stderr
        );
    }
    assert_eq!(world.writes(), Vec::<String>::new(), "nothing written");
    assert!(world.stemcell_blobs().await.is_empty(), "no blob");
}

/// An end of life that would not be in the future when Azure receives the create (which comes
/// after the upload) is refused before anything is written, exit 2, naming the earliest end of
/// life accepted and the remedy: `--end-of-life 1ms` (sent to the second, it is already past;
/// before, the upload ran and Azure refused the create: "EndOfLifeDate must be set to a future
/// date"), a span under a minute, a date less than a minute away (issue 46 item 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_end_of_life_too_soon_for_azure_is_refused_before_the_upload() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 3));
    world.emulator.state.reset_log();
    let soon = (time::OffsetDateTime::now_utc() + time::Duration::seconds(20))
        .replace_nanosecond(0)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    for when in ["1ms", "59s", soon.as_str()] {
        let before = time::OffsetDateTime::now_utc();
        let out = world.seed(&path, &["--end-of-life", when]).await;
        assert_eq!(out.code, 2, "{when}: {}\n{}", out.json, out.stderr);
        let said = format!("{}{}", out.stderr, out.json);
        assert!(
            said.contains("the earliest end of life Azure accepts is"),
            "{when}: {said}"
        );
        // The earliest date it names: a minute after now, to the second.
        let named = said
            .split("accepts is ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map(|s| s.trim_end_matches([',', ';', ')']))
            .unwrap_or_default()
            .to_string();
        let earliest =
            time::OffsetDateTime::parse(&named, &time::format_description::well_known::Rfc3339)
                .unwrap_or_else(|e| panic!("{when}: {named:?} is a date ({e}): {said}"));
        let ahead = earliest - before;
        assert!(
            ahead >= time::Duration::seconds(59) && ahead <= time::Duration::seconds(70),
            "{when}: {earliest} is a minute from {before}"
        );
        assert!(said.contains("at least 1m"), "{when}: the remedy: {said}");
    }
    assert_eq!(world.writes(), Vec::<String>::new(), "nothing written");
    assert!(world.stemcell_blobs().await.is_empty(), "no blob");
    assert!(
        world.version(DEFINITION, "1.506.0").await.is_none(),
        "no version"
    );
}
