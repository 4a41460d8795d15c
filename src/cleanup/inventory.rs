//! What is in the gallery: every image definition and every version, with tags, state and
//! published date.

use std::collections::BTreeMap;

use crate::gallery::lock::{gallery_lock_prefix, version_lock_name};
use crate::gallery::model::SoftDelete;
use crate::gallery::record::{self, Binding, Record, RecordStore};
use crate::gallery::{GalleryApi, GalleryRef, ImageDefinition, ImageVersion};

use super::{CleanupError, SourceError};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Where the inventory was read (for messages).
    pub gallery: String,
    pub definitions: Vec<ImageDefinition>,
    /// The versions, as their reference records say they are once [`Inventory::read_records`]
    /// ran (a reference a late tag write erased still counts).
    pub versions: Vec<ImageVersion>,
    /// The versions' reference records (who holds each reference), by version id in lower case.
    pub records: BTreeMap<String, Record>,
    /// Whether the records were read (they live in the storage account that holds the locks).
    pub records_read: bool,
    /// The gallery's soft-delete policy when it is on (where Azure cannot delete a Failed
    /// version).
    pub soft_delete: Option<SoftDelete>,
    /// The management locks at the gallery, above it and below it (`gallery::protect`).
    pub locks: Vec<crate::gallery::protect::ManagementLock>,
    /// Whether `locks` was read (protection on, and the identity may read locks).
    pub locks_read: bool,
}

impl Inventory {
    /// List the gallery: one call for the definitions, one per definition for its versions.
    /// Any failure fails the whole inventory (a partial one would misjudge `latest`).
    pub async fn gather(api: &dyn GalleryApi, gallery: &str) -> Result<Self, CleanupError> {
        let wrap = |cause| CleanupError::Inventory {
            gallery: gallery.to_string(),
            cause,
        };
        let mut definitions = api.list_definitions().await.map_err(wrap)?;
        definitions.sort_by(|a, b| a.name.cmp(&b.name));
        let mut versions = Vec::new();
        for def in &definitions {
            versions.extend(api.list_versions(&def.name).await.map_err(wrap)?);
        }
        // Read only when there is a version soft delete would keep to judge (one gallery GET).
        let soft_delete = if versions
            .iter()
            .any(|v| v.phase().undeletable_under_soft_delete())
        {
            api.soft_delete().await.map_err(wrap)?
        } else {
            None
        };
        // Locks are no evidence of use: read best effort (a DELETE under a lock not seen here
        // is refused by Azure, and the version kept all the same).
        let locks = crate::gallery::protect::gallery_locks(api).await;
        Ok(Self {
            gallery: gallery.to_string(),
            definitions,
            versions,
            records: BTreeMap::new(),
            records_read: false,
            soft_delete,
            locks_read: locks.is_some(),
            locks: locks.unwrap_or_default(),
        })
    }

    /// Read every version's reference record from `store` (of `gallery`, by its full identity,
    /// as the locks name it: one listing, then one read per record that exists) and take each version
    /// as its record says it is (`gallery::record::healed`). A record that cannot be used
    /// refuses the run: what it holds is evidence of use.
    pub async fn read_records(
        &mut self,
        store: &dyn RecordStore,
        gallery: &GalleryRef,
    ) -> Result<(), CleanupError> {
        let wanted: Vec<(String, Binding, Option<ImageVersion>)> = self
            .versions
            .iter()
            .map(|v| {
                (
                    version_lock_name(gallery, &v.definition, &v.version),
                    Binding::new(gallery, &v.definition, &v.version),
                    Some(v.clone()),
                )
            })
            .collect();
        let loads = record::load_many(store, &gallery_lock_prefix(gallery), &wanted)
            .await
            .map_err(|e| CleanupError::EvidenceIncomplete {
                source_name: format!("the reference records of gallery {}", gallery.gallery),
                cause: SourceError::Gallery(e),
                also_failed: vec![],
            })?;
        for (v, loaded) in self.versions.iter_mut().zip(loads) {
            let rec = loaded.map_err(|e| CleanupError::EvidenceIncomplete {
                source_name: format!("reference record of {}", v.id),
                cause: SourceError::Gallery(e),
                also_failed: vec![],
            })?;
            if let Some(r) = rec {
                *v = record::healed(v, Some(&r));
                self.records.insert(v.id.to_ascii_lowercase(), r);
            }
        }
        self.records_read = true;
        Ok(())
    }

    /// Who holds `reference` on version `id`, as its record says (`None`: not recorded by this
    /// tool with a holder, or the records were not read).
    pub fn holder_of(&self, id: &str, reference: &str) -> Option<&str> {
        self.records
            .get(&id.to_ascii_lowercase())
            .and_then(|r| r.entry(reference))
            .and_then(|e| e.holder.as_deref())
    }
}
