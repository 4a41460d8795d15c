//! Soft-deleted versions (REFERENCE.md "Today's Azure"): finding the one that holds a name
//! `ensure` wants, deciding on it (`decide::decide_soft_deleted`), and restoring one.
//!
//! In a gallery with soft delete on, a deleted version's name stays taken until it is gone for
//! good (7 days by default): a create under it is refused. The soft-deleted list shows no
//! content, so what this tool recorded when it created the version (the digest in its reference
//! record, kept after the delete) decides: the same content is restored and nothing is
//! uploaded; other or unrecorded content is a conflict that names the version and the remedies.

use super::super::content::Content;
use super::super::decide::{decide_soft_deleted, SoftDeletedAction};
use super::super::error::{Error, Result, SoftDeletedName};
use super::super::lifecycle::until_rfc3339;
use super::super::model::*;
use super::super::record::{self, Binding};
use super::{EnsureRequest, GalleryService, Mode};

/// What a restore found.
#[derive(Debug, Clone)]
pub enum Restore {
    /// Restored by this call (`was`: how it was listed while soft-deleted).
    Restored {
        version: ImageVersion,
        was: SoftDeletedVersion,
    },
    /// Not soft-deleted: it is there (restored by another caller meanwhile, or never deleted).
    Present(ImageVersion),
    /// Neither soft-deleted nor there: these are the definition's soft-deleted versions.
    NothingRestorable { restorable: Vec<SoftDeletedVersion> },
}

impl GalleryService {
    /// The definition's soft-deleted versions.
    pub async fn soft_deleted_of(&self, definition: &str) -> Result<Vec<SoftDeletedVersion>> {
        self.api.list_soft_deleted(definition).await
    }

    /// [`GalleryService::soft_deleted_of`] for a create's check: an identity that may not list
    /// them (403) answers none, with a warning — a create under a soft-deleted name is then
    /// refused by Azure itself; an Azure without the list (400: the preview feature not
    /// registered, an older cloud) answers none.
    async fn soft_deleted_for_create(&self, definition: &str) -> Result<Vec<SoftDeletedVersion>> {
        match self.api.list_soft_deleted(definition).await {
            Ok(all) => Ok(all),
            Err(e) => {
                let status = e.azure_answer().map(|a| a.status);
                if status == Some(400) {
                    // An Azure without the list (the preview feature not registered, an older
                    // cloud) holds no soft-deleted versions either.
                    tracing::debug!(definition, "soft-deleted versions are not listed here: {e}");
                    Ok(Vec::new())
                } else if status == Some(403) {
                    tracing::warn!(
                        definition,
                        "cannot list the definition's soft-deleted versions ({e}); a version name that is soft-deleted is not recognised. Grant Microsoft.Compute/galleries/softDeletedArtifactTypes/artifacts/versions/read (deploy/azure/role-definition.json)"
                    );
                    Ok(Vec::new())
                } else {
                    Err(e)
                }
            }
        }
    }

    /// The consumers that still use the soft-deleted version `sd`: they name it or run it
    /// (`latest::uses_soft_deleted`; never through `latest`).
    pub async fn soft_deleted_users(&self, sd: &SoftDeletedVersion) -> Result<Vec<Consumer>> {
        Ok(self
            .api
            .list_consumers()
            .await?
            .into_iter()
            .filter(|c| super::super::latest::uses_soft_deleted(c, sd))
            .collect())
    }

    /// The soft-deleted version `definition`/`key`, if there is one (as a create checks it:
    /// none when the list cannot be read).
    pub async fn soft_deleted(
        &self,
        definition: &str,
        key: &str,
    ) -> Result<Option<SoftDeletedVersion>> {
        Ok(self
            .soft_deleted_for_create(definition)
            .await?
            .into_iter()
            .find(|s| s.version.eq_ignore_ascii_case(key)))
    }

    /// The content this tool recorded for `definition`/`key` when it created it (its reference
    /// record's digest, kept after a delete): `want` (if given) when either copy of the record names it
    /// (one copy overwritten by another record does not hide the other; the restored version's
    /// own `image_sha256` is checked before it is used), else the newest copy's. `None`: no
    /// record (made by another tool), or no storage account to read records from.
    pub async fn recorded_digest(
        &self,
        definition: &str,
        key: &str,
        want: Option<&Content>,
    ) -> Result<Option<String>> {
        let Some(store) = self.locks.records() else {
            return Ok(None);
        };
        let binding = Binding::new(&self.gallery, definition, key);
        let loaded = record::load(store, &self.lock_name(definition, key), &binding).await?;
        let contents = match want {
            Some(w) => loaded.contents_like(w),
            None => loaded.contents(),
        };
        Ok(contents
            .iter()
            .find(|d| want.is_some_and(|w| d.eq_ignore_ascii_case(w.digest())))
            .or(contents.first())
            .cloned())
    }

    /// `ensure`'s check before it creates `definition`/`key`: `Ok(true)` when the name was
    /// soft-deleted with this content and is restored now (the caller observes again),
    /// `Ok(false)` when the name is free, `Err(SoftDeletedConflict)` otherwise.
    pub(super) async fn restore_before_create(
        &self,
        req: &EnsureRequest,
        definition: &str,
        content: &Content,
    ) -> Result<bool> {
        let key = req.stemcell.version_key.as_str();
        let Some(sd) = self.soft_deleted(definition, key).await? else {
            return Ok(false);
        };
        let recorded = self.recorded_digest(definition, key, Some(content)).await?;
        match decide_soft_deleted(recorded.as_deref(), content.digest()) {
            SoftDeletedAction::Restore => {
                tracing::info!(
                    definition,
                    version = key,
                    "the version's name is soft-deleted, with this very image: restoring it (nothing is uploaded)"
                );
                // Restored now or meanwhile by another host: observe it again. Gone for good
                // in between (its retention ran out, or it was purged): the name is free.
                Ok(!matches!(
                    self.restore(definition, key).await?,
                    Restore::NothingRestorable { .. }
                ))
            }
            SoftDeletedAction::Conflict { recorded_digest } => {
                let policy = self.api.soft_delete().await.unwrap_or(None);
                Err(Error::SoftDeletedConflict(Box::new(SoftDeletedName {
                    id: sd.id.clone(),
                    content: match recorded_digest {
                        Some(d) => format!("it was created with {} {d}", content.what()),
                        None => {
                            "this tool recorded no content for it (another tool made it)".into()
                        }
                    },
                    want: content.describe(),
                    until: until_rfc3339(sd.restorable_until(policy))
                        .unwrap_or_else(|| "the end of the gallery's retention period".into()),
                    name: req.stemcell.name.clone(),
                    version: req.stemcell.version.clone(),
                    flags: selector_flags(&req.stemcell, req.mode),
                })))
            }
        }
    }

    /// Restore the soft-deleted version `definition`/`key` under its lock (two hosts restoring
    /// at once restore it once), and follow it until it settles. References its tags held when
    /// it was deleted come back with it.
    pub async fn restore(&self, definition: &str, key: &str) -> Result<Restore> {
        let lock_name = self.lock_name(definition, key);
        let held = self.locks.acquire(&lock_name).await?;
        let r = self.restore_locked(definition, key).await;
        if let Ok(Restore::Restored { version, .. }) = &r {
            if let Err(e) = self
                .rebind_restored(held.as_ref(), &lock_name, version)
                .await
            {
                held.release().await;
                return Err(e);
            }
        }
        held.release().await;
        r
    }

    /// A restore brings back the same life of a version, with its reference record. Whether
    /// Azure keeps `publishedDate` across a soft delete and a restore was found in no source
    /// (REFERENCE.md "Today's Azure"; the emulator keeps it): should it not, the record, bound
    /// to the date it had, would read as another life's. Right after this tool's own restore,
    /// under the lock, the record of that content is bound to the version as restored.
    async fn rebind_restored(
        &self,
        held: &dyn super::super::lock::Held,
        lock_name: &str,
        version: &super::super::ImageVersion,
    ) -> Result<()> {
        let binding = Binding::new(&self.gallery, &version.definition, &version.version);
        let loaded = record::load(held.records(), lock_name, &binding).await?;
        if loaded.applicable(Some(version)).is_some() {
            return Ok(());
        }
        let Some(rec) = loaded.record.clone() else {
            return Ok(());
        };
        let same_content = super::super::tags::get(&version.tags, super::super::tags::IMAGE_SHA256)
            .is_some_and(|sha| rec.is_for(&Content::image(sha)));
        if !same_content {
            return Ok(());
        }
        tracing::info!(version = %version.id, "the restored version's publishedDate changed: its reference record is bound to it again");
        super::super::guarded::save_record(held, &loaded, rec.bound_to(version)).await?;
        Ok(())
    }

    async fn restore_locked(&self, definition: &str, key: &str) -> Result<Restore> {
        let all = self.soft_deleted_of(definition).await?;
        let Some(was) = all
            .iter()
            .find(|s| s.version.eq_ignore_ascii_case(key))
            .cloned()
        else {
            return Ok(match self.api.get_version(definition, key, false).await? {
                Some(v) => Restore::Present(v),
                None => Restore::NothingRestorable { restorable: all },
            });
        };
        match self.api.restore_version(definition, key).await? {
            Some(version) => {
                tracing::info!(version = %version.id, state = %version.provisioning_state, "restored");
                // Restored with the references it held: held means locked.
                crate::gallery::protect::settle(self.api.as_ref(), &version).await;
                Ok(Restore::Restored { version, was })
            }
            None => Ok(Restore::NothingRestorable {
                restorable: self.soft_deleted_of(definition).await?,
            }),
        }
    }
}

/// The flags that name this stemcell's definition to `restore`, beyond `--name` and `--version`
/// (their defaults are gen1, x86_64 and the director definition).
fn selector_flags(stemcell: &super::StemcellImage, mode: Mode) -> String {
    let mut flags = String::new();
    if stemcell.generation == HyperVGeneration::V2 {
        flags.push_str(" --generation gen2");
    }
    if stemcell.architecture == Architecture::Arm64 {
        flags.push_str(" --architecture arm64");
    }
    if mode == Mode::CreateEnv {
        flags.push_str(" --create-env");
    }
    flags
}
