//! The gallery service's rules, exercised against the in-memory `FakeGallery` (fast, no HTTP).
//! The same scenarios run over HTTP against the emulator in `gallery_emulator.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use stemcell_gallery::error::{Classified, Exit};
use stemcell_gallery::gallery::fake::FakeGallery;
use stemcell_gallery::gallery::lock::LocalLocks;
use stemcell_gallery::gallery::service::*;
use stemcell_gallery::gallery::{
    tags, Architecture, ConsumerKind, HyperVGeneration, ProvisioningState,
};

const NAME: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";

fn stemcell(sha: &str) -> StemcellImage {
    StemcellImage {
        name: NAME.into(),
        version: "1.506".into(),
        version_key: "1.506.0".into(),
        definition: NAME.into(),
        architecture: Architecture::X64,
        generation: HyperVGeneration::V1,
        features: BTreeMap::new(),
        image_sha256: sha.into(),
        cloud_property_tags: BTreeMap::new(),
    }
}

fn request(sha: &str, mode: Mode, blob: &str, reference: &str) -> EnsureRequest {
    EnsureRequest {
        stemcell: stemcell(sha),
        mode,
        create_env_suffix: DEFAULT_CREATE_ENV_SUFFIX.into(),
        source_uri: format!("https://bosh.blob.core.windows.net/stemcell/{blob}.vhd"),
        storage_account_id:
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Storage/storageAccounts/bosh"
                .into(),
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

fn service(fake: &Arc<FakeGallery>) -> GalleryService {
    GalleryService::new(
        fake.clone(),
        Arc::new(LocalLocks::default()),
        fake.gallery().clone(),
        "westeurope",
    )
}

const SHA_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const SHA_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";

#[tokio::test]
async fn create_env_then_director_upload_of_the_same_stemcell_no_409() {
    let fake = Arc::new(FakeGallery::default());
    let svc = service(&fake);
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
    let d = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .unwrap();
    assert_eq!(d.outcome, Outcome::Created);
    assert_eq!(d.definition, NAME);
    assert_eq!(fake.versions().len(), 2);
    let untouched = fake
        .version(&format!("{NAME}-create-env"), "1.506.0")
        .unwrap();
    assert_eq!(
        untouched.source_uri.as_deref(),
        Some("https://bosh.blob.core.windows.net/stemcell/blob-a.vhd")
    );
    assert_eq!(tags::references(&untouched.tags), vec!["bosh-stemcell-a"]);
    assert_eq!(untouched.tags[tags::MODE], "create-env");
}

#[tokio::test]
async fn reuse_with_the_reference_recorded_costs_one_get() {
    let fake = Arc::new(FakeGallery::default());
    let svc = service(&fake);
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    fake.reset_calls();
    let r = svc
        .ensure(&request(
            SHA_A,
            Mode::Director,
            "blob-other",
            "bosh-stemcell-a",
        ))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Reused);
    assert_eq!(fake.call_log().len(), 1, "{:?}", fake.call_log());
    assert_eq!(fake.calls("get_version"), 1);
}

#[tokio::test]
async fn a_second_director_adds_its_reference_with_a_tags_only_update() {
    let fake = Arc::new(FakeGallery::default());
    let svc = service(&fake);
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    let r = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Reused);
    assert_eq!(fake.calls("begin_create_version"), 1);
    assert_eq!(fake.calls("set_version_tags"), 1);
    let v = fake.version(NAME, "1.506.0").unwrap();
    assert_eq!(
        tags::references(&v.tags),
        vec!["bosh-stemcell-a", "bosh-stemcell-b"]
    );
    assert_eq!(
        v.source_uri.as_deref(),
        Some("https://bosh.blob.core.windows.net/stemcell/blob-a.vhd")
    );
}

#[tokio::test]
async fn different_content_under_the_same_version_is_a_conflict_naming_both() {
    let fake = Arc::new(FakeGallery::default());
    let svc = service(&fake);
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    let err = svc
        .ensure(&request(SHA_B, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .unwrap_err();
    assert_eq!(err.class().exit(), Exit::Conflict);
    let msg = err.to_string();
    for want in [
        SHA_A,
        SHA_B,
        "blob-a.vhd",
        "blob-b.vhd",
        "Remedy",
        "-create-env",
    ] {
        assert!(msg.contains(want), "missing {want:?} in {msg}");
    }
    let v = fake.version(NAME, "1.506.0").unwrap();
    assert_eq!(
        tags::references(&v.tags),
        vec!["bosh-stemcell-a"],
        "nothing changed"
    );
}

/// Issue 14 item 5: a Failed version holding this content is replaced and keeps its references;
/// one holding another image is a conflict (exit 4) and stays.
#[tokio::test]
async fn a_failed_version_is_replaced_only_when_it_holds_the_same_image() {
    let fake = Arc::new(FakeGallery::default());
    let svc = service(&fake);
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    fake.modify_version(NAME, "1.506.0", |v| {
        v.provisioning_state = ProvisioningState::Failed
    });
    let err = svc
        .ensure(&request(SHA_B, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .expect_err("another image: not replaced");
    assert_eq!(
        stemcell_gallery::error::Classified::class(&err).exit(),
        stemcell_gallery::error::Exit::Conflict
    );
    let text = err.to_string();
    assert!(text.contains(SHA_A) && text.contains(SHA_B), "{text}");
    let v = fake.version(NAME, "1.506.0").unwrap();
    assert_eq!(v.provisioning_state, ProvisioningState::Failed);

    let r = svc
        .ensure(&request(
            SHA_A,
            Mode::Director,
            "blob-a2",
            "bosh-stemcell-b",
        ))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Recreated);
    let v = fake.version(NAME, "1.506.0").unwrap();
    assert_eq!(v.provisioning_state, ProvisioningState::Succeeded);
    assert_eq!(v.tags[tags::IMAGE_SHA256], SHA_A);
    let mut refs = tags::references(&v.tags);
    refs.sort();
    assert_eq!(refs, vec!["bosh-stemcell-a", "bosh-stemcell-b"]);
}

#[tokio::test]
async fn eight_concurrent_callers_get_one_version_with_eight_references() {
    let fake = Arc::new(FakeGallery::default());
    let svc = Arc::new(service(&fake));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            svc.ensure(&request(
                SHA_A,
                Mode::Director,
                &format!("blob-{i}"),
                &format!("bosh-stemcell-{i}"),
            ))
            .await
            .unwrap()
            .version
            .id
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1);
    assert_eq!(fake.versions().len(), 1);
    assert_eq!(fake.calls("begin_create_version"), 1);
    let mut refs = tags::references(&fake.version(NAME, "1.506.0").unwrap().tags);
    refs.sort();
    assert_eq!(
        refs,
        (0..8)
            .map(|i| format!("bosh-stemcell-{i}"))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn removing_the_last_reference_keeps_a_version_a_vm_still_runs() {
    let fake = Arc::new(FakeGallery::default());
    let svc = service(&fake);
    let e = svc
        .ensure(&request(
            SHA_A,
            Mode::CreateEnv,
            "blob-a",
            "bosh-stemcell-a",
        ))
        .await
        .unwrap();
    fake.add_consumer(
        ConsumerKind::VirtualMachine,
        "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/director",
        &e.version.id,
    );
    let def = format!("{NAME}-create-env");
    let r = svc
        .remove_reference(&def, "1.506.0", Some("bosh-stemcell-a"))
        .await
        .unwrap();
    match r {
        Removal::KeptInUse { consumers } => assert!(consumers[0].id.ends_with("/director")),
        other => panic!("expected KeptInUse, got {other:?}"),
    }
    assert!(fake.version(&def, "1.506.0").is_some());
    assert_eq!(fake.calls("delete_version"), 0);
    assert!(tags::references(&fake.version(&def, "1.506.0").unwrap().tags).is_empty());
}

#[tokio::test]
async fn removing_the_last_unused_reference_deletes_the_version() {
    let fake = Arc::new(FakeGallery::default());
    let svc = service(&fake);
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .unwrap();
    let r = svc
        .remove_reference(NAME, "1.506.0", Some("bosh-stemcell-a"))
        .await
        .unwrap();
    assert_eq!(
        r,
        Removal::ReferenceRemoved {
            remaining: vec!["bosh-stemcell-b".into()]
        }
    );
    let r = svc
        .remove_reference(NAME, "1.506.0", Some("bosh-stemcell-b"))
        .await
        .unwrap();
    assert_eq!(r, Removal::Deleted);
    assert!(fake.version(NAME, "1.506.0").is_none());
    let r = svc
        .remove_reference(NAME, "1.506.0", Some("bosh-stemcell-b"))
        .await
        .unwrap();
    assert_eq!(r, Removal::NotFound);
}

/// Issue 30 item 3, the race: the version blocks its deletion only after it was read (or Azure's
/// clock says the end of life is still ahead), so Azure refuses the DELETE with
/// `DeleteGalleryImageVersionBlockedBeforeEndOfLife` (409). That refusal is an answer: the
/// version is kept and the removal says so, at once. (Before, the 409 read as "another operation
/// in flight": observed again and re-sent until the delete gave up unsettled.)
#[tokio::test(start_paused = true)]
async fn a_delete_azure_refuses_before_the_end_of_life_keeps_the_version_at_once() {
    let fake = Arc::new(FakeGallery::default());
    let svc = service(&fake);
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    fake.fail(
        "delete_version",
        stemcell_gallery::gallery::fake::Fault::always(
            409,
            "DeleteGalleryImageVersionBlockedBeforeEndOfLife",
        ),
    );
    let r = svc
        .remove_reference(NAME, "1.506.0", Some("bosh-stemcell-a"))
        .await
        .unwrap();
    assert_eq!(r, Removal::KeptBlocked { until: None });
    assert_eq!(fake.calls("delete_version"), 1, "one DELETE, never re-sent");
    assert!(fake.version(NAME, "1.506.0").is_some(), "the version stays");
}

/// A caller that uploaded nothing (it came to reuse or compare a version it had just seen) and
/// then finds the version gone gets a clear error: the service never creates a version from a
/// request with no source (before issue 17, publish passed the sentence "none (nothing was
/// uploaded)" as the blob URI, and a create would have been sent with it).
#[tokio::test]
async fn a_version_that_went_away_while_compared_is_not_created_from_no_source() {
    let fake = Arc::new(FakeGallery::default());
    let svc = service(&fake);
    let mut req = request(SHA_A, Mode::Director, "unused", "bosh-stemcell-1");
    req.source_uri = String::new();
    let err = svc.ensure_observed(&req, None, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            stemcell_gallery::gallery::Error::NothingToCreateFrom { .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("re-run"), "{err}");
    assert!(
        err.class().retryable(),
        "a re-run uploads and creates: {err}"
    );
    assert!(fake.versions().is_empty(), "nothing created");
}

/// Issue 19: x64 and Arm64 gen2 stemcells that share a name. The Azure CPI names the definition
/// `<name>-gen2` for both (architecture is not in its name) and, finding it present, puts the
/// second architecture's version into it. The service keeps the CPI's name and refuses the
/// second architecture instead: the two never share a definition, and the error names both.
#[tokio::test]
async fn x64_and_arm64_gen2_stemcells_of_one_name_never_share_a_definition() {
    let fake = Arc::new(FakeGallery::default());
    let svc = service(&fake);
    let gen2 = |sha: &str, arch: Architecture, cid: &str| {
        let mut r = request(sha, Mode::Director, cid, cid);
        // Another version, so the definition is what meets the second stemcell.
        if arch == Architecture::Arm64 {
            r.stemcell.version = "1.507".into();
            r.stemcell.version_key = "1.507.0".into();
        }
        r.stemcell.definition = format!("{NAME}-gen2");
        r.stemcell.generation = HyperVGeneration::V2;
        r.stemcell.architecture = arch;
        r
    };
    let x64 = svc
        .ensure(&gen2(SHA_A, Architecture::X64, "bosh-stemcell-x64"))
        .await
        .unwrap();
    assert_eq!(x64.definition, format!("{NAME}-gen2"));
    let err = svc
        .ensure(&gen2(SHA_B, Architecture::Arm64, "bosh-stemcell-arm"))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("architecture x64") && msg.contains("needs Arm64"),
        "{msg}"
    );
    assert!(msg.contains("cloud_properties.name"), "{msg}");
    let versions: Vec<String> = fake.versions().into_iter().map(|v| v.id).collect();
    assert_eq!(versions.len(), 1, "{versions:?}");
}

/// Issue 30: Azure cannot delete a Failed version while soft delete is on, and a Canceled one is
/// taken the same way (not found in any source: the harsher reading). Removing the last
/// reference of either keeps the version and sends no DELETE.
#[tokio::test]
async fn the_last_reference_of_a_failed_or_canceled_version_in_a_soft_delete_gallery_keeps_it() {
    for state in [ProvisioningState::Failed, ProvisioningState::Canceled] {
        let fake = Arc::new(FakeGallery::default());
        let svc = service(&fake);
        svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
            .await
            .unwrap();
        fake.modify_version(NAME, "1.506.0", |v| v.provisioning_state = state.clone());
        fake.set_soft_delete(Some(stemcell_gallery::gallery::model::SoftDelete {
            retention_days: Some(7),
        }));
        let r = svc
            .remove_reference(NAME, "1.506.0", Some("bosh-stemcell-a"))
            .await
            .unwrap();
        assert_eq!(r, Removal::KeptFailedInSoftDeleteGallery, "{state}");
        assert_eq!(fake.calls("delete_version"), 0, "{state}");
        assert!(fake.version(NAME, "1.506.0").is_some(), "{state}");
    }
}

/// Issue 30 item 4 over the fake: a version deleted in a soft-delete gallery is restored by the
/// next ensure of the same content (nothing created), and refused for other content.
#[tokio::test]
async fn an_ensure_under_a_soft_deleted_name_restores_the_same_content_and_refuses_other() {
    let fake = Arc::new(FakeGallery::default());
    let svc = service(&fake);
    fake.set_soft_delete(Some(stemcell_gallery::gallery::model::SoftDelete {
        retention_days: Some(7),
    }));
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    let r = svc
        .remove_reference(NAME, "1.506.0", Some("bosh-stemcell-a"))
        .await
        .unwrap();
    assert_eq!(r, Removal::Deleted);
    assert!(fake.version(NAME, "1.506.0").is_none());

    let other = svc
        .ensure(&request(SHA_B, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .unwrap_err();
    assert_eq!(other.class().exit(), Exit::Conflict, "{other}");
    assert!(other.to_string().contains("is soft-deleted"), "{other}");
    assert_eq!(fake.calls("restore_version"), 0);

    let creates = fake.calls("begin_create_version");
    let e = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-c", "bosh-stemcell-c"))
        .await
        .unwrap();
    assert_eq!(e.outcome, Outcome::Restored);
    assert_eq!(
        fake.calls("begin_create_version"),
        creates,
        "nothing created"
    );
    assert_eq!(
        tags::references(&fake.version(NAME, "1.506.0").unwrap().tags),
        vec!["bosh-stemcell-c".to_string()]
    );
}
