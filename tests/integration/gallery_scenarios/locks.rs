//! Issue 46, "held means locked": the delete lock this tool keeps on every version it holds, so
//! that Azure itself refuses a DELETE from clients that do not read the ledger (the Azure CPI
//! v52.0.1–v53.0.0 deleting by `stemcell_name`, the portal, `az`, Terraform), while this tool's
//! own deletes still go through once nothing holds or uses the version.

use stemcell_gallery::gallery::protect::LOCK_NAME;
use stemcell_gallery::gallery::service::*;
use stemcell_gallery::gallery::{tags, Error};

use super::{request, Backend, KEY, NAME, SHA_A};

/// Whether the version carries this tool's delete lock, as a list of its locks shows.
async fn locked_by_us(svc: &GalleryService) -> bool {
    let id = svc.gallery().version_id(NAME, KEY);
    svc.api()
        .version_locks(NAME, KEY)
        .await
        .expect("the version's locks are listed")
        .iter()
        .any(|l| l.is_ours_on(&id))
}

/// Another client (not this tool) DELETEs the version, as the Azure CPI v53.0.0 does on its
/// `delete_stemcell` of a CID it finds by `stemcell_name`.
async fn another_client_deletes(svc: &GalleryService) -> Result<(), Error> {
    svc.api().delete_version(NAME, KEY).await
}

/// A director uploads a stemcell: the version it creates holds its CID and carries the delete
/// lock. Another client's DELETE is refused by Azure (409 ScopeLocked) and the version stays;
/// the director's own delete of its last reference lifts the lock and deletes the version.
pub(super) async fn a_held_version_is_refused_to_other_deleters_and_deleted_by_its_last_reference<
    B: Backend,
>(
    b: B,
) {
    let svc = b.service();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    assert!(
        locked_by_us(&svc).await,
        "created holding a reference: locked"
    );
    let refused = another_client_deletes(&svc).await.unwrap_err();
    assert!(matches!(refused, Error::ScopeLocked { .. }), "{refused}");
    assert!(
        b.stored(NAME).await.is_some(),
        "the version the tool holds stays"
    );
    let r = svc
        .remove_reference(NAME, KEY, Some("bosh-stemcell-a"))
        .await
        .unwrap();
    assert_eq!(r, Removal::Deleted);
    assert!(b.stored(NAME).await.is_none());
}

/// The platform team locks a version this tool no longer holds: removing the last reference keeps
/// the version with reason `locked`, naming the lock, and neither lock is lifted.
pub(super) async fn a_lock_of_another_keeps_the_version_with_reason_locked<B: Backend>(b: B) {
    let svc = b.service();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    svc.api()
        .put_version_lock(NAME, KEY, "platform-keep", "placed by the platform team")
        .await
        .unwrap();
    let r = svc
        .remove_reference(NAME, KEY, Some("bosh-stemcell-a"))
        .await
        .unwrap();
    let Removal::KeptLocked { locks } = r else {
        panic!("kept for its lock, got {r:?}");
    };
    assert!(locks.contains("platform-keep"), "{locks}");
    assert!(b.stored(NAME).await.is_some());
    let names: Vec<String> = svc
        .api()
        .version_locks(NAME, KEY)
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.name)
        .collect();
    assert!(names.iter().any(|n| n == "platform-keep"), "{names:?}");
}

/// A plain Azure CPI shares the version; when this tool's last reference goes, only the CPI's
/// CID holds it: the lock is lifted, so the CPI's own `delete_stemcell` (a DELETE once its list
/// is empty) keeps working.
pub(super) async fn a_version_only_the_azure_cpi_holds_is_left_unlocked_for_it<B: Backend>(b: B) {
    let svc = b.service();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    // The plain CPI appends its CID to stemcell_references (a whole-tags PATCH, no lock).
    let mut t = b.stored(NAME).await.unwrap().tags;
    let list = t.get(tags::CPI_REFERENCES).cloned().unwrap_or_default();
    t.insert(
        tags::CPI_REFERENCES.into(),
        format!("{list},bosh-stemcell-cpi"),
    );
    svc.api().set_version_tags(NAME, KEY, &t).await.unwrap();
    let r = svc
        .remove_reference(NAME, KEY, Some("bosh-stemcell-a"))
        .await
        .unwrap();
    assert_eq!(
        r,
        Removal::ReferenceRemoved {
            remaining: vec!["bosh-stemcell-cpi".into()]
        }
    );
    assert!(
        !locked_by_us(&svc).await,
        "the CPI's alone to delete: unlocked"
    );
    another_client_deletes(&svc)
        .await
        .expect("the plain CPI's delete goes through");
}

/// An operator removes the lock by hand (or a lock PUT failed, or the process died before it):
/// the next reference write puts it back.
pub(super) async fn a_delete_lock_removed_by_hand_comes_back_with_the_next_reference<B: Backend>(
    b: B,
) {
    let svc = b.service();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    svc.api()
        .delete_version_lock(NAME, KEY, LOCK_NAME)
        .await
        .unwrap();
    assert!(!locked_by_us(&svc).await);
    svc.ensure(&request(SHA_A, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .unwrap();
    assert!(locked_by_us(&svc).await, "repaired by the next write");
}
