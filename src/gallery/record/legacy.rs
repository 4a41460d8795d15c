//! Reading the previous release's record (format 1, kept beside the lock by gallery name).

use super::super::error::Result;
use super::{copy_names, parse_copy, Binding, Record, RecordStore, LEGACY_FORMAT};

/// The previous release's record of `binding` (its first usable copy), if any. An unusable one
/// is not this release's to judge: it is left to that release, and ignored here. `listed`: the
/// blobs a listing found (only those are read), or `None` to try both copies.
pub(super) async fn load_legacy(
    store: &dyn RecordStore,
    binding: &Binding,
    listed: Option<&std::collections::BTreeSet<String>>,
) -> Result<Option<Record>> {
    for name in copy_names(&binding.legacy_lock()) {
        if listed.is_some_and(|l| !l.contains(&name)) {
            continue;
        }
        let Some(stored) = store.get(&name).await? else {
            continue;
        };
        match parse_copy(&stored, binding, LEGACY_FORMAT) {
            Ok(r) => return Ok(Some(r)),
            Err(why) => {
                tracing::debug!(blob = %name, "the previous release's reference record is not read: {why}")
            }
        }
    }
    Ok(None)
}
