//! What of the code under test changed shape while the simulator was written (issue 44): the
//! two calls of the cleanup glue (`commands::cleanup`), which name a gallery by its full identity
//! since the records are keyed by it, and the `already_removed` answer of a removal. Running the
//! simulator on an older commit (09c2c3c, before issue 44) needs only this file changed: pass
//! `&gallery.gallery` to both calls, and answer `false` in [`already_removed`].

use std::sync::Arc;

use crate::cleanup::{CleanupError, Executor, Inventory};
use crate::gallery::lock::Locks;
use crate::gallery::record::RecordStore;
use crate::gallery::service::Removal;
use crate::gallery::GalleryRef;

/// `Inventory::read_records` of gallery `gallery`.
pub async fn read_records(
    inventory: &mut Inventory,
    store: &dyn RecordStore,
    gallery: &GalleryRef,
) -> Result<(), CleanupError> {
    inventory.read_records(store, gallery).await
}

/// Whether a removal that found `reference` not recorded found it removed before (a retry:
/// `already-removed`, exit 0).
pub fn already_removed(removal: &Removal) -> bool {
    matches!(
        removal,
        Removal::NotRecorded {
            already_removed: true,
            ..
        }
    )
}

/// `Executor::with_locks` for gallery `gallery`.
pub fn with_locks(executor: Executor, locks: Arc<dyn Locks>, gallery: &GalleryRef) -> Executor {
    executor.with_locks(locks, gallery)
}
