//! The gallery service over HTTP against the emulator: the real ARM adapter (azure_core 1.x),
//! the real blob-lease lock, and the binary for exit codes and concurrency across processes.

use crate::support::emulated;

use std::collections::BTreeMap;
use std::sync::Arc;

use emulated::{gallery_path, Raw, LOC, RG, SUB};
use serde_json::{json, Value};
use stemcell_gallery::azure::arm::{ArmGallery, ArmOptions};
use stemcell_gallery::azure::auth::EmulatorCredential;
use stemcell_gallery::azure::blob::{StorageAuth, StorageTarget};
use stemcell_gallery::azure::gallery_locks::BlobLocks;
use stemcell_gallery::emulator::{self, Handle, Options};
use stemcell_gallery::gallery::model::TargetRegion;
use stemcell_gallery::gallery::service::*;
use stemcell_gallery::gallery::{tags, Architecture, GalleryRef, HyperVGeneration};

const GALLERY: &str = "bosh_stemcells";
const NAME: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
const SHA_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const SHA_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

async fn emulator(polls: u32) -> Handle {
    let h = emulator::start(Options {
        polls_to_complete: polls,
        timing: emulated::test_timing(),
        ..Options::default()
    })
    .await
    .expect("emulator starts");
    h.state.ensure_gallery(SUB, RG, GALLERY, LOC).unwrap();
    h.state.ensure_container("stemcell").unwrap();
    h
}

fn service(h: &Handle) -> GalleryService {
    let gallery = GalleryRef {
        subscription: SUB.into(),
        resource_group: RG.into(),
        gallery: GALLERY.into(),
    };
    let opts = ArmOptions {
        poll_interval: std::time::Duration::from_millis(20),
        ..ArmOptions::default()
    };
    let api = Arc::new(
        ArmGallery::new(
            &url::Url::parse(&h.arm).unwrap(),
            stemcell_gallery::azure::credential::Credential::fixed(Arc::new(EmulatorCredential)),
            gallery.clone(),
            opts,
        )
        .unwrap(),
    );
    let storage = StorageTarget::new(
        &url::Url::parse(&h.blob).unwrap(),
        StorageAuth::DevelopmentKey,
    )
    .unwrap();
    let locks = Arc::new(BlobLocks::new(
        storage.container("stemcell"),
        std::time::Duration::from_secs(60),
        true,
    ));
    GalleryService::new(api, locks, gallery, LOC)
}

fn request(sha: &str, mode: Mode, blob: &str, reference: &str) -> EnsureRequest {
    EnsureRequest {
        stemcell: StemcellImage {
            name: NAME.into(),
            version: "1.506".into(),
            version_key: "1.506.0".into(),
            definition: NAME.into(),
            architecture: Architecture::X64,
            generation: HyperVGeneration::V1,
            features: BTreeMap::new(),
            image_sha256: sha.into(),
            cloud_property_tags: BTreeMap::from([("os_type".to_string(), "linux".to_string())]),
        },
        mode,
        create_env_suffix: DEFAULT_CREATE_ENV_SUFFIX.into(),
        source_uri: format!("https://bosh.blob.core.windows.net/stemcell/{blob}.vhd"),
        storage_account_id: format!(
            "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Storage/storageAccounts/bosh"
        ),
        target_regions: vec![],
        replica_count: Some(1),
        exclude_from_latest: false,
        safeguards: Default::default(),
        extra_tags: BTreeMap::new(),
        reference: Some(reference.into()),
        holder: None,
        arrival: None,
        soft_deleted_checked: false,
    }
}

/// ARM requests the emulator served (blob requests of the lock excluded).
fn arm_requests(h: &Handle) -> Vec<(String, String)> {
    h.state
        .requests()
        .into_iter()
        .filter(|r| r.service == "arm")
        .map(|r| (r.method, r.path))
        .collect()
}

fn version_path(def: &str) -> String {
    format!("{}/images/{def}/versions/1.506.0", gallery_path(GALLERY))
}

#[tokio::test]
async fn create_env_then_director_upload_of_the_same_stemcell_no_409() {
    let h = emulator(1).await;
    let svc = service(&h);
    let ce = svc
        .ensure(&request(
            SHA_A,
            Mode::CreateEnv,
            "blob-a",
            "bosh-stemcell-a",
        ))
        .await
        .unwrap();
    assert_eq!(ce.outcome, Outcome::Created);
    let d = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .expect("the director's upload must not meet a 409");
    assert_eq!(d.outcome, Outcome::Created);
    assert_eq!(d.definition, NAME);
    assert_ne!(ce.version.id, d.version.id);
    // The create-env version is untouched: its source and its single reference.
    let raw = Raw::new(&h.arm);
    let v = raw
        .get(&version_path(&format!("{NAME}-create-env")))
        .await
        .body;
    assert_eq!(
        v["properties"]["storageProfile"]["osDiskImage"]["source"]["uri"],
        "https://bosh.blob.core.windows.net/stemcell/blob-a.vhd"
    );
    assert_eq!(refs_of(&v), vec!["bosh-stemcell-a"]);
    assert_eq!(v["tags"]["stemcell_gallery_mode"], "create-env");
    assert!(!arm_requests(&h).is_empty());
    assert!(
        h.state
            .requests()
            .iter()
            .all(|r| r.service != "arm" || r.status != 409),
        "no ARM 409 at all"
    );
}

#[tokio::test]
async fn director_then_create_env_upload_of_the_same_stemcell_no_409() {
    let h = emulator(1).await;
    let svc = service(&h);
    svc.ensure(&request(SHA_A, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .unwrap();
    let ce = svc
        .ensure(&request(
            SHA_A,
            Mode::CreateEnv,
            "blob-a",
            "bosh-stemcell-a",
        ))
        .await
        .unwrap();
    assert_eq!(ce.outcome, Outcome::Created);
    assert_eq!(ce.definition, format!("{NAME}-create-env"));
    assert!(h
        .state
        .requests()
        .iter()
        .all(|r| r.service != "arm" || r.status != 409));
}

#[tokio::test]
async fn reuse_with_the_reference_recorded_is_exactly_one_arm_request() {
    let h = emulator(1).await;
    let svc = service(&h);
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    h.state.reset_log();
    let r = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Reused);
    let reqs = h.state.requests();
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    assert_eq!(reqs[0].method, "GET");
    assert!(reqs[0].path.ends_with("/versions/1.506.0"));
}

#[tokio::test]
async fn request_counts_for_a_miss_and_a_lookup_by_cid() {
    let h = emulator(1).await;
    let svc = service(&h);
    h.state.reset_log();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    let miss = arm_requests(&h);
    let blob = h.state.requests().len() - miss.len();
    h.state.reset_log();
    let found = svc.lookup_by_reference("bosh-stemcell-a").await.unwrap();
    assert!(found.is_some());
    let by_cid = arm_requests(&h);
    // Printed for bench/README.md (run with --nocapture).
    println!(
        "ensure-miss: {} ARM requests ({:?}) + {} blob requests (lock); lookup-by-CID with 1 definition: {} ARM requests",
        miss.len(),
        miss.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(),
        blob,
        by_cid.len()
    );
    // 11 under the instant timing (bench/README.md lists them, the definition's soft-deleted
    // versions among them: a create under a soft-deleted name is restored, not refused); under
    // --timing azure a few more operation polls.
    assert!(miss.len() <= 14, "{miss:?}");
    assert_eq!(
        by_cid.len(),
        2,
        "list definitions + list versions of the one definition"
    );
}

#[tokio::test]
async fn a_second_reference_is_added_with_a_tags_only_patch() {
    let h = emulator(1).await;
    let svc = service(&h);
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    h.state.reset_log();
    let r = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Reused);
    let writes: Vec<_> = arm_requests(&h)
        .into_iter()
        .filter(|(m, _)| m != "GET")
        .collect();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].0, "PATCH");
    let v = Raw::new(&h.arm).get(&version_path(NAME)).await.body;
    assert_eq!(refs_of(&v), vec!["bosh-stemcell-a", "bosh-stemcell-b"]);
}

/// Azure answers regions by display name and refuses a duplicate (the emulator does too): adding a
/// region the version already has, spelled as the request spelled it, writes nothing; a new one is
/// one PATCH that Azure accepts.
#[tokio::test]
async fn adding_a_region_compares_display_names_and_never_sends_one_twice() {
    let h = emulator(1).await;
    let svc = service(&h);
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    let v = Raw::new(&h.arm).get(&version_path(NAME)).await.body;
    let first = &v["properties"]["publishingProfile"]["targetRegions"][0]["name"];
    assert_eq!(first, "West Europe", "{v}");
    h.state.reset_log();
    let region = |name: &str| TargetRegion {
        name: name.to_string(),
        replicas: Some(1),
        storage_account_type: None,
        exclude_from_latest: None,
    };
    svc.ensure_target_region(NAME, "1.506.0", region(LOC))
        .await
        .unwrap();
    let writes = |h: &Handle| {
        arm_requests(h)
            .into_iter()
            .filter(|(m, _)| m != "GET")
            .count()
    };
    assert_eq!(writes(&h), 0, "westeurope is West Europe: nothing to add");
    let v = svc
        .ensure_target_region(NAME, "1.506.0", region("northeurope"))
        .await
        .expect("Azure accepts the PATCH: no region twice");
    assert_eq!(writes(&h), 1);
    let names: Vec<String> = v.target_regions.iter().map(|r| r.name.clone()).collect();
    assert_eq!(names, ["West Europe", "North Europe"]);
}

#[tokio::test]
async fn a_version_still_creating_is_waited_for() {
    let h = emulator(4).await;
    let svc = service(&h);
    // Someone else's create, not yet finished (the emulator needs 4 polls).
    let raw = Raw::new(&h.arm);
    emulated::gallery_and_definition_in(&raw, GALLERY, NAME).await;
    let mut body = emulated::version_body("https://bosh.blob.core.windows.net/stemcell/other.vhd");
    body["tags"] = json!({"image_sha256": SHA_A, "stemcell_references": "bosh-stemcell-other"});
    let put = raw.put(&version_path(NAME), body).await;
    assert_eq!(put.status, 201, "{}", put.text);
    let r = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Waited);
    let refs = tags::references(&r.version.tags);
    assert_eq!(refs, vec!["bosh-stemcell-other", "bosh-stemcell-a"]);
}

#[tokio::test]
async fn a_failed_version_is_deleted_and_created_again() {
    let h = emulator(1).await;
    let svc = service(&h);
    let raw = Raw::new(&h.arm);
    // A source inside the emulator's own blob store that does not exist: the version ends
    // Failed, while holding this very content (only then is it replaced).
    failed_version(&h, &raw).await;
    let r = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Recreated);
    assert_eq!(r.version.provisioning_state.as_str(), "Succeeded");
    assert_eq!(r.version.tags[tags::IMAGE_SHA256], SHA_A);
}

/// Make the version at `version_path(NAME)` Failed while holding SHA_A (a source in the
/// emulator's own store that does not exist), as the replace path meets it.
async fn failed_version(h: &Handle, raw: &Raw) {
    emulated::gallery_and_definition_in(raw, GALLERY, NAME).await;
    let missing = format!("{}/stemcell/missing.vhd", h.blob);
    let mut body = emulated::version_body(&missing);
    body["tags"]["image_sha256"] = json!(SHA_A);
    assert_eq!(raw.put(&version_path(NAME), body).await.status, 201);
    let started = std::time::Instant::now();
    while raw.get(&version_path(NAME)).await.body["properties"]["provisioningState"] != "Failed" {
        assert!(started.elapsed().as_secs() < 30, "the version ends Failed");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Replacing a Failed version (issue 16 item 3): right after the DELETE, Azure may still be
/// busy with the deleted version (it still counts it as a nested resource for ~10–20 s,
/// REFERENCE.md "After a DELETE completes"; what a PUT of the same name answers then is not
/// recorded, so the refusal is injected here: 409 with Retry-After). The tool does not re-PUT
/// into it blindly: it backs off as Retry-After says and creates again, and when it never
/// clears it stops with an error that says what happened and what to do.
#[tokio::test]
async fn a_failed_version_replaced_into_the_delete_lag_is_created_after_backing_off() {
    let h = emulator(1).await;
    let svc = service(&h);
    let raw = Raw::new(&h.arm);
    failed_version(&h, &raw).await;
    let refusal = |count: u32, retry_after: u32| emulator::Fault {
        method: "PUT".into(),
        path: version_path(NAME),
        count,
        status: Some(409),
        code: Some("OperationNotAllowed".into()),
        message: Some("Injected: the deleted version is still being removed.".into()),
        retry_after: Some(retry_after),
        ..Default::default()
    };
    h.state.add_fault(refusal(2, 1));
    h.state.reset_log();
    let started = std::time::Instant::now();
    let r = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .expect("created once the refusal clears");
    let took = started.elapsed();
    assert_eq!(r.outcome, Outcome::Recreated);
    assert_eq!(r.version.provisioning_state.as_str(), "Succeeded");
    let puts: Vec<u16> = h
        .state
        .requests()
        .iter()
        .filter(|q| q.method == "PUT" && q.path.eq_ignore_ascii_case(&version_path(NAME)))
        .map(|q| q.status)
        .collect();
    assert_eq!(
        puts,
        vec![409, 409, 201],
        "two refused creates, then the create"
    );
    assert!(
        took >= std::time::Duration::from_secs(2),
        "Retry-After: 1 was honoured after each refusal ({took:?})"
    );

    // It never clears: a clear error, after a bounded number of attempts.
    let h = emulator(1).await;
    let svc = service(&h);
    let raw = Raw::new(&h.arm);
    failed_version(&h, &raw).await;
    h.state.add_fault(refusal(1000, 0));
    let err = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .expect_err("a create that is refused for ever fails");
    let text = format!("{err:#}");
    assert!(
        text.contains("refused to create gallery version") && text.contains("re-run"),
        "{text}"
    );
}

/// Issue 30 item 4: in a gallery with soft delete on, Azure cannot delete a Failed version
/// (SDDOC; the emulator refuses the DELETE with 409). `ensure` of the same content stops at once
/// with the remedy — no DELETE sent, no retry until a timeout, the version left as it was — and
/// once soft delete is off the same call replaces it.
#[tokio::test]
async fn a_failed_version_in_a_soft_delete_gallery_is_refused_at_once_with_the_remedy() {
    let h = emulator(1).await;
    let svc = service(&h);
    let raw = Raw::new(&h.arm);
    failed_version(&h, &raw).await;
    emulated::set_soft_delete(&raw, GALLERY, true).await;
    h.state.reset_log();
    let started = std::time::Instant::now();
    let err = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .expect_err("a Failed version in a soft-delete gallery is not replaced");
    let text = format!("{err:#}");
    assert!(
        text.contains("soft delete on")
            && text.contains("isSoftDeleteEnabled: false")
            && text.contains("re-run"),
        "{text}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "refused at once ({:?})",
        started.elapsed()
    );
    let writes: Vec<String> = h
        .state
        .requests()
        .iter()
        .filter(|q| q.method != "GET" && q.path.contains("/providers/"))
        .map(|q| format!("{} {}", q.method, q.path))
        .collect();
    assert!(writes.is_empty(), "no gallery write: {writes:?}");
    assert_eq!(
        raw.get(&version_path(NAME)).await.body["properties"]["provisioningState"],
        "Failed"
    );

    emulated::set_soft_delete(&raw, GALLERY, false).await;
    let r = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .expect("replaced once soft delete is off");
    assert_eq!(r.outcome, Outcome::Recreated);
}

/// A Failed version that a VM still runs from (its tag update failed, not its create) is never
/// deleted to be replaced: ensure stops with an error naming the VM, and the version stays.
#[tokio::test]
async fn a_failed_version_still_in_use_is_not_replaced() {
    let h = emulator(1).await;
    let svc = service(&h);
    let raw = Raw::new(&h.arm);
    // Failed while holding this very content (only then is it replaced).
    failed_version(&h, &raw).await;
    let version = raw.get(&version_path(NAME)).await.body;
    assert_eq!(version["properties"]["provisioningState"], "Failed");
    let id = version["id"].as_str().unwrap().to_string();
    let vm = format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/worker-0");
    let vm_put = raw
        .send(
            "PUT",
            &format!("{vm}?api-version=2024-07-01"),
            Some(json!({"location": LOC, "properties": {"storageProfile": {"imageReference": {"id": id}}}})),
            true,
        )
        .await;
    assert!(vm_put.status < 300, "{}", vm_put.text);

    let err = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .expect_err("a version in use is not replaced");
    let text = err.to_string();
    assert!(
        text.contains("worker-0") && text.contains("not replaced"),
        "{text}"
    );
    let after = raw.get(&version_path(NAME)).await;
    assert_eq!(after.status, 200, "the version is still there");
    assert_eq!(after.body["properties"]["provisioningState"], "Failed");
}

#[tokio::test]
async fn a_version_made_the_azure_cpi_way_is_recognised_and_reused() {
    let h = emulator(1).await;
    let svc = service(&h);
    let raw = Raw::new(&h.arm);
    emulated::gallery_and_definition_in(&raw, GALLERY, NAME).await;
    let mut body =
        emulated::version_body("https://bosh.blob.core.windows.net/stemcell/bosh-stemcell-cpi.vhd");
    body["tags"] = json!({
        "image_sha256": SHA_A,
        "stemcell_references": "bosh-stemcell-cpi",
        "compute_gallery_name": GALLERY,
        "compute_gallery_image_definition": NAME,
    });
    assert_eq!(raw.put(&version_path(NAME), body).await.status, 201);
    emulated::until_settled(&raw, &version_path(NAME)).await;
    let r = svc
        .ensure(&request(
            SHA_A,
            Mode::Director,
            "blob-mine",
            "bosh-stemcell-mine",
        ))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Reused);
    assert_eq!(
        r.version.source_uri.as_deref(),
        Some("https://bosh.blob.core.windows.net/stemcell/bosh-stemcell-cpi.vhd")
    );
    assert_eq!(
        tags::references(&r.version.tags),
        vec!["bosh-stemcell-cpi", "bosh-stemcell-mine"]
    );
    // The CPI's CID stays in its tag, where its lookup finds it; ours lives in the overflow,
    // guarded by the version's sentinel (which the front hands the CPI's create_vm).
    let v = raw.get(&version_path(NAME)).await.body;
    assert_eq!(
        v["tags"]["stemcell_references"],
        format!("{},bosh-stemcell-cpi", tags::sentinel(NAME, "1.506.0")).as_str()
    );
}

fn cli(h: &Handle, args: &[&str]) -> std::process::Output {
    emulated::binary_against(h, GALLERY)
        .args(args)
        .output()
        .expect("the binary runs")
}

fn ensure_args<'a>(sha: &'a str, blob: &'a str, reference: &'a str) -> Vec<&'a str> {
    vec![
        "ensure", "--blob-uri", blob, "--storage-account-id",
        "/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/bosh-rg/providers/Microsoft.Storage/storageAccounts/bosh",
        "--name", NAME, "--version", "1.506", "--sha256", sha, "--reference", reference,
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_content_conflict_exits_4_naming_both_digests_sources_and_the_remedy() {
    let h = emulator(1).await;
    let a = cli(
        &h,
        &ensure_args(
            SHA_A,
            "https://bosh.blob.core.windows.net/stemcell/a.vhd",
            "bosh-stemcell-a",
        ),
    );
    assert_eq!(
        a.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&a.stderr)
    );
    let b = cli(
        &h,
        &ensure_args(
            SHA_B,
            "https://bosh.blob.core.windows.net/stemcell/b.vhd",
            "bosh-stemcell-b",
        ),
    );
    assert_eq!(b.status.code(), Some(4));
    let err = String::from_utf8_lossy(&b.stderr);
    for want in [SHA_A, SHA_B, "a.vhd", "b.vhd", "Remedy", "create-env"] {
        assert!(err.contains(want), "missing {want:?} in: {err}");
    }
    let doc: Value = serde_json::from_slice(&b.stdout).unwrap();
    assert_eq!(doc["error"]["exit_code"], 4);
    assert!(!err.contains("panicked"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_four_part_version_is_refused_before_any_request() {
    let h = emulator(1).await;
    h.state.reset_log();
    let mut args = ensure_args(
        SHA_A,
        "https://bosh.blob.core.windows.net/stemcell/a.vhd",
        "bosh-stemcell-a",
    );
    assert_eq!(args[7], "--version");
    args[8] = "1.2.3.4";
    let out = cli(&h, &args);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("4 parts"));
    assert!(h.state.requests().is_empty(), "{:?}", h.state.requests());
}

#[tokio::test(flavor = "multi_thread")]
async fn eight_processes_ensuring_one_stemcell_make_one_version_with_eight_references() {
    let h = emulator(2).await;
    let children: Vec<_> = (0..8)
        .map(|i| {
            let blob = format!("https://bosh.blob.core.windows.net/stemcell/b{i}.vhd");
            let reference = format!("bosh-stemcell-{i}");
            let args = ensure_args(SHA_A, &blob, &reference);
            emulated::binary_against(&h, GALLERY)
                .args(&args)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<_> = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|c| c.wait_with_output().unwrap())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    let mut ids = Vec::new();
    for o in &outputs {
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let doc: Value = serde_json::from_slice(&o.stdout).unwrap();
        ids.push(doc["id"].as_str().unwrap().to_string());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "every process prints the same id");
    let raw = Raw::new(&h.arm);
    let list = raw
        .get(&format!("{}/images/{NAME}/versions", gallery_path(GALLERY)))
        .await
        .body;
    assert_eq!(list["value"].as_array().unwrap().len(), 1);
    let v = raw.get(&version_path(NAME)).await.body;
    let tags: BTreeMap<String, String> = serde_json::from_value(v["tags"].clone()).unwrap();
    let mut refs = tags::references(&tags);
    refs.sort();
    assert_eq!(
        refs,
        (0..8)
            .map(|i| format!("bosh-stemcell-{i}"))
            .collect::<Vec<_>>()
    );
    let puts = h
        .state
        .requests()
        .into_iter()
        .filter(|r| r.method == "PUT" && r.path.ends_with("/versions/1.506.0"))
        .count();
    assert_eq!(puts, 1, "exactly one create");
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_keeps_a_version_a_vm_uses_and_says_so() {
    let h = emulator(1).await;
    let out = cli(
        &h,
        &ensure_args(
            SHA_A,
            "https://bosh.blob.core.windows.net/stemcell/a.vhd",
            "bosh-stemcell-a",
        ),
    );
    assert_eq!(out.status.code(), Some(0));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let raw = Raw::new(&h.arm);
    let vm = format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/director-0");
    let put = raw
        .send(
            "PUT",
            &format!("{vm}?api-version=2024-07-01"),
            Some(json!({"location": LOC, "properties": {"storageProfile": {"imageReference": {"id": id}}}})),
            true,
        )
        .await;
    assert!(put.status == 200 || put.status == 201, "{}", put.text);
    let del = cli(
        &h,
        &[
            "delete",
            "--name",
            NAME,
            "--version",
            "1.506",
            "--reference",
            "bosh-stemcell-a",
        ],
    );
    assert_eq!(
        del.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&del.stderr)
    );
    let doc: Value = serde_json::from_slice(&del.stdout).unwrap();
    assert_eq!(doc["result"], "kept");
    assert!(doc["in_use_by"][0]["id"]
        .as_str()
        .unwrap()
        .ends_with("/director-0"));
    assert_eq!(raw.get(&version_path(NAME)).await.status, 200);
    // Once the VM is gone, deleting removes the version.
    let gone = raw
        .send(
            "DELETE",
            &format!("{vm}?api-version=2024-07-01"),
            None,
            true,
        )
        .await;
    assert!(gone.status < 300);
    let del = cli(&h, &["delete", "--name", NAME, "--version", "1.506"]);
    assert_eq!(
        del.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&del.stderr)
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&del.stdout).unwrap()["result"],
        "deleted"
    );
    assert_eq!(raw.get(&version_path(NAME)).await.status, 404);
    let look = cli(&h, &["lookup", "--name", NAME, "--version", "1.506"]);
    assert_eq!(look.status.code(), Some(3));
}

/// The references of a version as this tool reads them.
fn refs_of(v: &Value) -> Vec<String> {
    let t: std::collections::BTreeMap<String, String> =
        serde_json::from_value(v["tags"].clone()).unwrap();
    tags::references(&t)
}
