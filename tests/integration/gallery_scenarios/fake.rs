//! The gallery scenarios against the in-memory `FakeGallery` (fast, no HTTP): its calls read as
//! the ARM requests the adapter sends for them; and, below the shared ones, what only the fake
//! can set up.

use std::collections::BTreeMap;
use std::sync::Arc;

use stemcell_gallery::gallery::fake::{FakeGallery, Fault};
use stemcell_gallery::gallery::lock::LocalLocks;
use stemcell_gallery::gallery::model::SoftDelete;
use stemcell_gallery::gallery::service::*;
use stemcell_gallery::gallery::{ConsumerKind, GalleryRef, ProvisioningState};
use time::OffsetDateTime;

use super::{
    request, shared_scenarios, Backend, Request, Stored, Timing, GALLERY, KEY, NAME, SHA_A,
};
use crate::support::{LOC, RG, SUB};

shared_scenarios!(Fake, #[tokio::test(start_paused = true)]);

/// A `FakeGallery` for `GALLERY` in `SUB`/`RG`, with in-process locks.
pub(super) struct Fake {
    fake: Arc<FakeGallery>,
}

impl Backend for Fake {
    const NAME: &'static str = "fake";

    async fn start(_: Timing) -> Self {
        Fake {
            fake: Arc::new(FakeGallery::new(GalleryRef {
                subscription: SUB.into(),
                resource_group: RG.into(),
                gallery: GALLERY.into(),
            })),
        }
    }

    fn service(&self) -> GalleryService {
        GalleryService::new(
            self.fake.clone(),
            Arc::new(LocalLocks::default()),
            self.fake.gallery().clone(),
            LOC,
        )
    }

    fn requests(&self) -> Vec<Request> {
        self.fake
            .call_log()
            .iter()
            .map(|call| as_arm_request(self.fake.gallery(), call))
            .collect()
    }

    fn reset_log(&self) {
        self.fake.reset_calls();
    }

    async fn stored(&self, definition: &str) -> Option<Stored> {
        self.fake.version(definition, KEY).map(|v| Stored {
            id: v.id,
            provisioning_state: v.provisioning_state.as_str().to_string(),
            source_uri: v.source_uri,
            tags: v.tags,
        })
    }

    async fn version_ids(&self) -> Vec<String> {
        self.fake.versions().into_iter().map(|v| v.id).collect()
    }

    async fn someone_elses_version(
        &self,
        definition: &str,
        source_uri: &str,
        tags: BTreeMap<String, String>,
    ) {
        let now = OffsetDateTime::now_utc();
        self.fake
            .add_version(definition, KEY, ProvisioningState::Succeeded, now, tags);
        self.fake.modify_version(definition, KEY, |v| {
            v.source_uri = Some(source_uri.to_string())
        });
    }

    async fn failed_version(&self, sha: &str) {
        let tags = BTreeMap::from([("image_sha256".to_string(), sha.to_string())]);
        let now = OffsetDateTime::now_utc();
        self.fake
            .add_version(NAME, KEY, ProvisioningState::Failed, now, tags);
    }

    async fn make_failed(&self, definition: &str) {
        assert!(self.fake.modify_version(definition, KEY, |v| {
            v.provisioning_state = ProvisioningState::Failed
        }));
    }

    async fn add_vm(&self, name: &str, image_id: &str) -> String {
        let vm = format!(
            "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/{name}"
        );
        self.fake
            .add_consumer(ConsumerKind::VirtualMachine, &vm, image_id);
        vm
    }

    async fn set_soft_delete(&self, on: bool) {
        self.fake.set_soft_delete(on.then_some(SoftDelete {
            retention_days: Some(7),
        }));
    }

    fn refuse_deletes(&self, code: &str) {
        self.fake.fail("delete_version", Fault::always(409, code));
    }
}

/// One of the fake's calls (`"method resource"`) as the ARM request the adapter sends for it; a
/// call this does not know fails the test, so a new `GalleryApi` method gets its request here.
fn as_arm_request(g: &GalleryRef, call: &str) -> Request {
    let (method, resource) = call.split_once(' ').unwrap_or((call, ""));
    let version = || {
        let (definition, key) = resource.split_once('/').expect("DEFINITION/VERSION");
        g.version_id(definition, key)
    };
    let (verb, path) = match method {
        "gallery_exists" | "soft_delete" => ("GET", g.id()),
        "list_definitions" => ("GET", format!("{}/images", g.id())),
        "get_definition" => ("GET", g.definition_id(resource)),
        "create_definition" => ("PUT", g.definition_id(resource)),
        "list_versions" => ("GET", format!("{}/versions", g.definition_id(resource))),
        "get_version" => ("GET", version()),
        // Polls of the version, told apart from the one GET of `get_version`.
        "wait_version_settled" => ("GET", format!("{} (until settled)", version())),
        "begin_create_version" => ("PUT", version()),
        "wait" => ("GET", format!("{} (operation)", version())),
        "set_version_tags" | "set_target_regions" | "restore_version" => ("PATCH", version()),
        "delete_version" => ("DELETE", version()),
        "version_locks" => (
            "GET",
            format!("{}/providers/Microsoft.Authorization/locks", version()),
        ),
        "gallery_locks" => (
            "GET",
            format!("{}/providers/Microsoft.Authorization/locks", g.id()),
        ),
        "put_version_lock" => (
            "PUT",
            format!(
                "{}/providers/Microsoft.Authorization/locks/stemcell-gallery-held",
                version()
            ),
        ),
        "delete_version_lock" => (
            "DELETE",
            format!(
                "{}/providers/Microsoft.Authorization/locks/stemcell-gallery-held",
                version()
            ),
        ),
        "list_soft_deleted" => (
            "GET",
            format!(
                "{}/softDeletedArtifactTypes/Images/artifacts/{resource}/versions",
                g.id()
            ),
        ),
        "list_consumers" => (
            "GET",
            format!(
                "/subscriptions/{}/providers/Microsoft.Compute/virtualMachines",
                g.subscription
            ),
        ),
        other => panic!("the fake's call {other:?} has no ARM request here: add it"),
    };
    Request {
        service: "arm".into(),
        method: verb.into(),
        path,
        status: None,
    }
}

// What only the fake sets up.

/// Issue 30: Azure cannot delete a Failed version while soft delete is on, and a Canceled one is
/// taken the same way (not found in any source: the harsher reading). Removing the last
/// reference of either keeps the version and sends no DELETE.
// Fake only: the emulator cannot leave a version Canceled (its Failed case runs in
// cleanup_emulator::delete_of_the_last_reference_keeps_a_failed_version_a_soft_delete_gallery_cannot_delete).
#[tokio::test]
async fn the_last_reference_of_a_failed_or_canceled_version_in_a_soft_delete_gallery_keeps_it() {
    for state in [ProvisioningState::Failed, ProvisioningState::Canceled] {
        let b = Fake::start(Timing::Instant).await;
        let (fake, svc) = (&b.fake, b.service());
        svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
            .await
            .unwrap();
        fake.modify_version(NAME, "1.506.0", |v| v.provisioning_state = state.clone());
        fake.set_soft_delete(Some(SoftDelete {
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

// Issue 44: whose record it is.

/// The tool's view of version `KEY` of `NAME` in `svc`'s gallery: its tags merged with its
/// reference record, as every decision reads it (`gallery::record`).
async fn view(svc: &GalleryService) -> Vec<String> {
    let v = svc.lookup(NAME, KEY).await.unwrap().expect("the version");
    let rec = svc.record_of(&v).await;
    stemcell_gallery::gallery::record::merged(&v.tags, rec.as_ref())
}

/// A gallery named `GALLERY` in resource group `rg`, its locks and records in `store`.
fn gallery_in(
    rg: &str,
    store: &Arc<stemcell_gallery::gallery::record::MemoryRecords>,
) -> (Arc<FakeGallery>, GalleryService) {
    let fake = Arc::new(FakeGallery::new(GalleryRef {
        subscription: SUB.into(),
        resource_group: rg.into(),
        gallery: GALLERY.into(),
    }));
    let svc = GalleryService::new(
        fake.clone(),
        Arc::new(LocalLocks::sharing(store.clone())),
        fake.gallery().clone(),
        LOC,
    );
    (fake, svc)
}

/// Two galleries of one name (the default name is the same everywhere) in two resource groups,
/// whose locks live in one storage account: a reference recorded in one never appears in the
/// other, and one removed in the other never leaves the first.
#[tokio::test(start_paused = true)]
async fn two_galleries_of_one_name_sharing_a_storage_account_keep_separate_references() {
    let store = Arc::new(stemcell_gallery::gallery::record::MemoryRecords::default());
    let (_, rg1) = gallery_in("rg1", &store);
    let (_, rg2) = gallery_in("rg2", &store);
    rg1.ensure(&request(
        SHA_A,
        Mode::Director,
        "blob-a",
        "bosh-stemcell-c1",
    ))
    .await
    .unwrap();
    // The same stemcell in rg2: created with its own reference only (none carried from rg1).
    rg2.ensure(&request(
        SHA_A,
        Mode::Director,
        "blob-a",
        "bosh-stemcell-c2",
    ))
    .await
    .unwrap();
    assert_eq!(view(&rg2).await, vec!["bosh-stemcell-c2"]);
    // Removing rg1's reference in rg2: not recorded there, and rg1 keeps it.
    let r = rg2
        .remove_reference(NAME, KEY, Some("bosh-stemcell-c1"))
        .await;
    assert!(
        !matches!(
            r,
            Ok(Removal::ReferenceRemoved { .. }) | Ok(Removal::Deleted)
        ),
        "{r:?}"
    );
    assert_eq!(view(&rg1).await, vec!["bosh-stemcell-c1"]);
    assert_eq!(view(&rg2).await, vec!["bosh-stemcell-c2"]);
    // And rg2's last reference going deletes rg2's version only.
    assert_eq!(
        rg2.remove_reference(NAME, KEY, Some("bosh-stemcell-c2"))
            .await
            .unwrap(),
        Removal::Deleted
    );
    assert_eq!(view(&rg1).await, vec!["bosh-stemcell-c1"]);
}

/// A version deleted outside the tool (the portal, `az`, an older CPI) and created again under
/// its name starts with no references from the one that was deleted.
#[tokio::test(start_paused = true)]
async fn a_version_deleted_outside_and_made_again_starts_with_no_references() {
    let b = Fake::start(Timing::Instant).await;
    let (fake, svc) = (&b.fake, b.service());
    svc.ensure(&request(
        SHA_A,
        Mode::Director,
        "blob-a",
        "bosh-stemcell-old",
    ))
    .await
    .unwrap();
    // A later write binds the record to this life of the version (as every write does).
    svc.ensure(&request(
        SHA_A,
        Mode::Director,
        "blob-a",
        "bosh-stemcell-old2",
    ))
    .await
    .unwrap();
    // Deleted by someone else, then made again by another tool, same content, later.
    let gone = fake.version(NAME, KEY).unwrap();
    fake.remove_version(NAME, KEY);
    let later = gone.published_date.unwrap() + time::Duration::minutes(5);
    fake.add_version(
        NAME,
        KEY,
        ProvisioningState::Succeeded,
        later,
        BTreeMap::from([("image_sha256".to_string(), SHA_A.to_string())]),
    );
    assert!(view(&svc).await.is_empty(), "{:?}", view(&svc).await);
    svc.ensure(&request(
        SHA_A,
        Mode::Director,
        "blob-a",
        "bosh-stemcell-new",
    ))
    .await
    .unwrap();
    assert_eq!(view(&svc).await, vec!["bosh-stemcell-new"]);
}

/// Issue 44 item 4: `references hand-back` that fails after its record write (a 503 on every
/// version PATCH) loses neither the CID nor who holds it: the version still counts it, its
/// record still names its holder (so a re-run finds it by holder and a prune keeps it), and
/// the re-run finishes the move into `stemcell_references`.
#[tokio::test(start_paused = true)]
async fn an_interrupted_hand_back_is_finished_by_its_rerun_with_the_holder_kept() {
    let b = Fake::start(Timing::Instant).await;
    let (fake, svc) = (&b.fake, b.service());
    let cid = hand_back_interrupted_after_its_record_write(fake, &svc).await;
    assert_eq!(view(&svc).await, vec![cid]);
    let v = svc.lookup(NAME, KEY).await.unwrap().unwrap();
    let rec = svc.record_of(&v).await.expect("its record");
    assert_eq!(
        rec.entry(cid).and_then(|e| e.holder.as_deref()),
        Some("director:d1"),
        "the holder survives the interrupted hand-back: {rec:?}"
    );
    // The re-run finishes what the first run began.
    let (moved, written) = svc.hand_back(NAME, KEY, &[cid.to_string()]).await.unwrap();
    assert_eq!(moved, vec![cid]);
    let written = written.unwrap();
    assert!(
        written.tags["stemcell_references"].contains(cid),
        "{:?}",
        written.tags
    );
    let rec = svc.record_of(&written).await.expect("its record");
    assert!(
        rec.references.is_empty() && rec.handing_back.is_empty(),
        "handed back: the record holds nothing the CPI holds now: {rec:?}"
    );
}

/// Issue 44 item 7: `seed`/`ensure --holder H` for a reference already recorded without a
/// holder records H (a record write; the tags do not change); a holder already recorded is
/// not replaced.
#[tokio::test(start_paused = true)]
async fn a_holder_given_for_a_reference_recorded_without_one_is_recorded() {
    let b = Fake::start(Timing::Instant).await;
    let (fake, svc) = (&b.fake, b.service());
    let cid = "bosh-stemcell-a";
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", cid))
        .await
        .unwrap();
    let holder_of = |v: &stemcell_gallery::gallery::ImageVersion| {
        let svc = &svc;
        let v = v.clone();
        async move {
            svc.record_of(&v)
                .await
                .and_then(|r| r.entry(cid).and_then(|e| e.holder.clone()))
        }
    };
    let v = fake.version(NAME, KEY).unwrap();
    assert_eq!(holder_of(&v).await, None);
    let tags_before = v.tags.clone();
    for (given, want) in [
        ("ci-pipeline", "ci-pipeline"),
        ("someone-else", "ci-pipeline"),
    ] {
        let mut req = request(SHA_A, Mode::Director, "blob-a", cid);
        req.holder = Some(given.into());
        let r = svc.ensure(&req).await.unwrap();
        assert_eq!(r.outcome, Outcome::Reused);
        let v = fake.version(NAME, KEY).unwrap();
        assert_eq!(holder_of(&v).await.as_deref(), Some(want), "{given}");
        assert_eq!(v.tags, tags_before, "no tag write for a holder");
    }
}

/// Found by the ledger simulator (issue 44): `delete` of a plain Azure CPI's last CID in a
/// gallery with soft delete on soft-deleted the version without remembering the removal (the
/// record holds nothing the CPI recorded), so a restore brought the removed CID back with its
/// tags. The removal is remembered in the version's record before the delete, whoever
/// recorded the reference.
#[tokio::test(start_paused = true)]
async fn a_removed_cpi_cid_does_not_come_back_with_a_restore() {
    let b = Fake::start(Timing::Instant).await;
    let (fake, svc) = (&b.fake, b.service());
    let cid = "bosh-stemcell-11111111-2222-4333-8444-555555555555";
    let tags = BTreeMap::from([
        ("image_sha256".to_string(), SHA_A.to_string()),
        ("stemcell_references".to_string(), cid.to_string()),
    ]);
    fake.add_version(
        NAME,
        KEY,
        ProvisioningState::Succeeded,
        OffsetDateTime::now_utc(),
        tags,
    );
    fake.set_soft_delete(Some(SoftDelete {
        retention_days: Some(7),
    }));
    assert_eq!(
        svc.remove_reference(NAME, KEY, Some(cid)).await.unwrap(),
        Removal::Deleted
    );
    svc.restore(NAME, KEY).await.unwrap();
    assert!(view(&svc).await.is_empty(), "{:?}", view(&svc).await);
}

/// Issue 44 (found by the ledger simulator): a version soft-deleted after an ensure last looked
/// at the soft-deleted list (the CPI and `seed` list it before their upload) keeps its record:
/// the ensure does not write a new life's record over it before its create, and the holders
/// and references recorded on it come back with the version.
#[tokio::test(start_paused = true)]
async fn a_version_soft_deleted_just_before_a_create_comes_back_with_its_record() {
    let b = Fake::start(Timing::Instant).await;
    let (fake, svc) = (&b.fake, b.service());
    fake.set_soft_delete(Some(SoftDelete {
        retention_days: Some(7),
    }));
    let mut first = request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-held");
    first.holder = Some("director:d1".into());
    svc.ensure(&first).await.unwrap();
    // Deleted by someone else (soft): its name stays taken, restorable.
    let gone = fake.remove_version(NAME, KEY).expect("the version");
    fake.put_soft_deleted(gone);
    // A director uploads the same stemcell; it listed the soft-deleted versions before.
    let mut again = request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-new");
    again.soft_deleted_checked = true;
    svc.ensure(&again).await.unwrap();
    let v = svc.lookup(NAME, KEY).await.unwrap().expect("restored");
    let rec = svc.record_of(&v).await.expect("its record");
    assert_eq!(
        rec.entry("bosh-stemcell-held")
            .and_then(|e| e.holder.clone()),
        Some("director:d1".to_string())
    );
    let mut refs = view(&svc).await;
    refs.sort();
    assert_eq!(refs, vec!["bosh-stemcell-held", "bosh-stemcell-new"]);
}

/// `references prune --apply` reaches a version just after someone soft-deleted it: the
/// reference it prunes is removed from the version's record (and said so), so a restore
/// brings the version back without it, and the reference still held stays.
#[tokio::test(start_paused = true)]
async fn a_reference_pruned_while_its_version_is_soft_deleted_stays_pruned_after_the_restore() {
    let b = Fake::start(Timing::Instant).await;
    let (fake, svc) = (&b.fake, b.service());
    fake.set_soft_delete(Some(SoftDelete {
        retention_days: Some(7),
    }));
    let mut first = request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-kept");
    first.holder = Some("director:d1".into());
    svc.ensure(&first).await.unwrap();
    let stale = request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-stale");
    svc.ensure(&stale).await.unwrap();
    // Soft-deleted by someone else between the prune's plan and its apply.
    let gone = fake.remove_version(NAME, KEY).expect("the version");
    fake.put_soft_deleted(gone);
    let (now, pruned) = svc
        .drop_references(NAME, KEY, &["bosh-stemcell-stale".to_string()])
        .await
        .unwrap();
    assert!(now.is_none(), "the version is soft-deleted");
    assert_eq!(pruned, vec!["bosh-stemcell-stale".to_string()]);
    svc.restore(NAME, KEY).await.unwrap();
    assert_eq!(view(&svc).await, vec!["bosh-stemcell-kept"]);
}

/// bosh deletes a stemcell whose version someone soft-deleted a moment before: the CID is found
/// in the version's record and removed there, so a restore brings the version back without it
/// (not found, bosh would forget the CID while the restored version kept it for good).
#[tokio::test(start_paused = true)]
async fn a_cid_deleted_while_its_version_is_soft_deleted_stays_deleted_after_the_restore() {
    let b = Fake::start(Timing::Instant).await;
    let (fake, svc) = (&b.fake, b.service());
    fake.set_soft_delete(Some(SoftDelete {
        retention_days: Some(7),
    }));
    let mut kept = request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-kept");
    kept.holder = Some("director:d1".into());
    svc.ensure(&kept).await.unwrap();
    let mut gone = request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-gone");
    gone.holder = Some("director:d1".into());
    svc.ensure(&gone).await.unwrap();
    let v = fake.remove_version(NAME, KEY).expect("the version");
    fake.put_soft_deleted(v);
    delete_cid_then_restore(&svc, "bosh-stemcell-gone").await;
    assert_eq!(view(&svc).await, vec!["bosh-stemcell-kept"]);
}

/// A hand-back interrupted after its record write (the CID noted as being handed back), then a
/// plain Azure CPI's write from a read older than the tool's takes the CID off the version's
/// tags: the CID is still counted (the record names it), so nothing treats the version as
/// unreferenced; the hand-back's re-run finishes the move.
#[tokio::test(start_paused = true)]
async fn a_cid_being_handed_back_that_a_stale_write_erased_is_still_counted() {
    let b = Fake::start(Timing::Instant).await;
    let (fake, svc) = (&b.fake, b.service());
    let cid = hand_back_interrupted_after_its_record_write(fake, &svc).await;
    // The stale write: tags as they were before the tool's reference was written.
    fake.modify_version(NAME, KEY, |v| {
        v.tags.retain(|k, _| !k.starts_with("sg_overflow_refs"));
    });
    assert_eq!(view(&svc).await, vec![cid]);
    let (moved, written) = svc.hand_back(NAME, KEY, &[cid.to_string()]).await.unwrap();
    assert_eq!(moved, vec![cid]);
    assert!(written.unwrap().tags["stemcell_references"].contains(cid));
}

/// A CID held by `director:d1`, and a hand-back of it that fails after its record write (a 503
/// on every version PATCH).
async fn hand_back_interrupted_after_its_record_write(
    fake: &FakeGallery,
    svc: &GalleryService,
) -> &'static str {
    let cid = "bosh-stemcell-0b1d2c3e-4f50-4a6b-8c7d-9e0f1a2b3c4d";
    let mut req = request(SHA_A, Mode::Director, "blob-a", cid);
    req.holder = Some("director:d1".into());
    svc.ensure(&req).await.unwrap();
    fake.fail("set_version_tags", Fault::always(503, "ServiceUnavailable"));
    assert!(svc.hand_back(NAME, KEY, &[cid.to_string()]).await.is_err());
    fake.clear_faults();
    cid
}

/// Issue 44 (ledger simulator, seed 1897): `delete --cid` of a plain CPI's CID dies after its
/// record write reached one copy only (the other still holds the CID, untombstoned). Its re-run
/// finds the CID removed in the record and must finish the removal (the tags too, and so both
/// copies), not answer "not recorded" and leave it to one copy: that copy lost, the CID the
/// director deleted would be counted again.
#[tokio::test(start_paused = true)]
async fn a_cid_removal_that_died_after_one_record_copy_is_finished_by_its_rerun() {
    let store = Arc::new(stemcell_gallery::gallery::record::MemoryRecords::default());
    let (fake, svc) = gallery_in(RG, &store);
    svc.ensure(&request(
        SHA_A,
        Mode::Director,
        "blob-a",
        "bosh-stemcell-ours",
    ))
    .await
    .unwrap();
    // A plain Azure CPI records its own CID in stemcell_references.
    let cid = "bosh-stemcell-7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d";
    fake.modify_version(NAME, KEY, |v| {
        let cpi = v
            .tags
            .get("stemcell_references")
            .cloned()
            .unwrap_or_default();
        v.tags
            .insert("stemcell_references".into(), format!("{cpi},{cid}"));
    });
    let lock = stemcell_gallery::gallery::blob_names::version_lock_name(fake.gallery(), NAME, KEY);
    let copy = format!("{lock}.refs.copy");
    let before = store.body(&copy).expect("the record's second copy");
    // The removal dies after its record write (its tag write never lands), which reached the
    // first copy only.
    fake.fail("set_version_tags", Fault::always(503, "ServiceUnavailable"));
    assert!(svc.remove_reference(NAME, KEY, Some(cid)).await.is_err());
    fake.clear_faults();
    store.tamper(&copy, Some(&before));
    // The re-run.
    svc.remove_reference(NAME, KEY, Some(cid)).await.unwrap();
    let tags = fake.version(NAME, KEY).unwrap().tags;
    assert!(
        !tags["stemcell_references"].contains(cid),
        "the tags say it too: {tags:?}"
    );
    // Now the first copy is lost: the CID stays removed.
    store.tamper(&format!("{lock}.refs"), Some(b"garbage"));
    assert_eq!(view(&svc).await, vec!["bosh-stemcell-ours"]);
}

/// Issue 44 item 2 (ledger simulator, seeds 4269, 2694): while the version is soft-deleted one
/// record copy is overwritten by a valid-looking record of other content and a higher
/// generation. Nothing tells which copy is the version's until it is back, so bosh's
/// `delete_stemcell` of a CID still finds it, and the removal goes into each copy: restored, the
/// version (chosen by its own content) does not show the CID again. Before, the search answered
/// not found, or the removal reported done having written neither copy.
#[tokio::test(start_paused = true)]
async fn a_cid_deleted_while_its_version_is_soft_deleted_and_one_copy_forged_stays_deleted() {
    let svc = soft_deleted_with_one_copy_forged(["bosh-stemcell-kept", "bosh-stemcell-gone"]).await;
    delete_cid_then_restore(&svc, "bosh-stemcell-gone").await;
    assert_eq!(view(&svc).await, vec!["bosh-stemcell-kept"]);
}

/// `references prune --apply` reaching a version soft-deleted since its plan, one record copy
/// forged: the pruned reference is removed in each copy that holds it, and stays removed once
/// the version is restored. Before, the prune read only the copy `of_absent` chooses (none, as
/// the copies disagree) and pruned nothing: the restore brought the reference back.
#[tokio::test]
async fn a_prune_of_a_version_soft_deleted_since_its_plan_with_one_copy_forged_stays_pruned() {
    let svc =
        soft_deleted_with_one_copy_forged(["bosh-stemcell-kept", "bosh-stemcell-stale"]).await;
    let (now, removed) = svc
        .drop_references(NAME, KEY, &["bosh-stemcell-stale".to_string()])
        .await
        .unwrap();
    assert!(now.is_none(), "the version is soft-deleted");
    assert_eq!(removed, vec!["bosh-stemcell-stale"]);
    svc.restore(NAME, KEY).await.unwrap();
    assert_eq!(view(&svc).await, vec!["bosh-stemcell-kept"]);
}

/// A director's version holding `cids`, soft-deleted, one record copy then overwritten by a
/// valid-looking record of other content and a higher generation (seeds 4269, 2694).
async fn soft_deleted_with_one_copy_forged(cids: [&str; 2]) -> GalleryService {
    let store = Arc::new(stemcell_gallery::gallery::record::MemoryRecords::default());
    let (fake, svc) = gallery_in(RG, &store);
    fake.set_soft_delete(Some(SoftDelete {
        retention_days: Some(7),
    }));
    for cid in cids {
        let mut req = request(SHA_A, Mode::Director, "blob-a", cid);
        req.holder = Some("director:d1".into());
        svc.ensure(&req).await.unwrap();
    }
    let v = fake.remove_version(NAME, KEY).expect("the version");
    fake.put_soft_deleted(v);
    let lock = stemcell_gallery::gallery::blob_names::version_lock_name(fake.gallery(), NAME, KEY);
    let first = format!("{lock}.refs");
    let mut forged: serde_json::Value =
        serde_json::from_slice(&store.body(&first).expect("the first copy")).unwrap();
    forged["image_sha256"] = "0f".repeat(32).into();
    forged["generation"] = 1000.into();
    store.tamper(&first, Some(forged.to_string().as_bytes()));
    svc
}

/// bosh's `delete_stemcell` of `cid` while the version is soft-deleted (as `app::delete` does
/// it: found in the version's record, removed there), then the version restored.
async fn delete_cid_then_restore(svc: &GalleryService, cid: &str) {
    match svc.find_reference(cid).await.unwrap() {
        Some(Found::Record { definition, key }) => {
            assert_eq!((definition.as_str(), key.as_str()), (NAME, KEY));
        }
        other => panic!("the CID is in the soft-deleted version's record: {other:?}"),
    }
    let (removal, _) = svc
        .remove_reference_observed(NAME, KEY, Some(cid))
        .await
        .unwrap();
    assert!(
        matches!(removal, Removal::CarriedRemoved { .. }),
        "{removal:?}"
    );
    svc.restore(NAME, KEY).await.unwrap();
}
