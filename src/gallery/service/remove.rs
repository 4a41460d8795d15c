//! Removing a reference (`delete_stemcell`, `delete`): under the version's lock, the reference
//! goes; the version is deleted only when no reference remains and nothing uses it (a guarded
//! delete). Also adding a replication region to an existing version.

use super::super::error::{Error, Result};
use super::super::guarded::{
    self, delete_guarded, forget_in_record, merge_references, observe, Delta, Guarded,
};
use super::super::latest::users_of;
use super::super::lock::{version_lock_name, Held};
use super::super::model::*;
use super::super::tags;
use super::{GalleryService, Removal};

impl GalleryService {
    /// Remove a reference; delete the version only when no reference remains and no VM, scale set
    /// or disk uses it. `reference: None` asks to delete a version that has no references at all.
    pub async fn remove_reference(
        &self,
        definition: &str,
        key: &str,
        reference: Option<&str>,
    ) -> Result<Removal> {
        Ok(self
            .remove_reference_observed(definition, key, reference)
            .await?
            .0)
    }

    /// [`GalleryService::remove_reference`], also returning the version as read under the lock
    /// (`None` when it did not exist): after `Removal::Deleted`, what was deleted (its source blob).
    pub async fn remove_reference_observed(
        &self,
        definition: &str,
        key: &str,
        reference: Option<&str>,
    ) -> Result<(Removal, Option<ImageVersion>)> {
        // A version that gains a reference while it is being deleted is kept; the removal is then
        // done again on what it is now (bounded).
        let mut last = None;
        for _ in 0..4 {
            match self
                .remove_reference_once(definition, key, reference)
                .await?
            {
                // An earlier pass of this call removed it (a pass meets a change only after its
                // removal was written), then met a change: removed by this call, not before it
                // — also when the change was a new life of the version (a Failed one replaced
                // meanwhile), whose record no longer remembers the removal.
                Removed::Done(Removal::NotRecorded { references, .. }, v) if last.is_some() => {
                    return Ok((
                        Removal::ReferenceRemoved {
                            remaining: references,
                        },
                        v,
                    ))
                }
                Removed::Done(removal, v) => return Ok((removal, v)),
                Removed::Changed(why, v) => {
                    tracing::info!(
                        definition,
                        version = key,
                        "{why} changed while deleting; removing the reference again"
                    );
                    last = Some(v);
                }
            }
        }
        let v = last.unwrap_or_default();
        Ok((
            Removal::ReferenceRemoved {
                remaining: v
                    .as_ref()
                    .map(|v| tags::references(&v.tags))
                    .unwrap_or_default(),
            },
            v,
        ))
    }

    /// One pass, under the version's lock: observe (the version and its record), drop the
    /// reference (and its pending hand-overs), then keep the version if references remain or
    /// something uses it, else delete it, guarded.
    async fn remove_reference_once(
        &self,
        definition: &str,
        key: &str,
        reference: Option<&str>,
    ) -> Result<Removed> {
        let lock_name = self.lock_name(definition, key);
        let held = self.locks.acquire(&lock_name).await?;
        let locked_at = tokio::time::Instant::now();
        let target = self.guarded_target(&lock_name, definition, key);
        let observed = async {
            // A pending hand-over of the reference must not bring it back.
            if let Some(r) = reference {
                held.drop_intents_of(r).await?;
            }
            observe(&target, held.as_ref()).await
        }
        .await;
        let obs = match observed {
            Ok(o) => o,
            Err(e) => {
                held.release().await;
                return Err(e);
            }
        };
        let Some(v) = obs.healed.clone() else {
            // The version is gone; its record may still carry the reference (a Failed version
            // being replaced): the removal applies there, so the re-create does not bring it
            // back.
            let r = match reference {
                Some(r) if obs.loaded.holds(None, r) => {
                    forget_in_record(&target, held.as_ref(), None, &[r.to_string()])
                        .await
                        .map(|remaining| Removal::CarriedRemoved { remaining })
                }
                _ => Ok(Removal::NotFound),
            };
            held.release().await;
            return Ok(Removed::Done(r?, None));
        };
        let removed: Vec<String> = reference.iter().map(|r| r.to_string()).collect();
        let before = tags::references(&v.tags);
        let remaining: Vec<String> = before
            .iter()
            .filter(|r| Some(r.as_str()) != reference)
            .cloned()
            .collect();
        let holds_it = remaining.len() != before.len();
        if let (Some(r), false) = (reference, holds_it) {
            // Not recorded here: nothing to remove, and nothing is deleted on its account. A
            // removal only the record says (a run that died before its tag write) is finished
            // first: the tags and both record copies then say it, not one copy alone (seed 1897).
            let unfinished = obs
                .raw
                .as_ref()
                .is_some_and(|raw| tags::references(&raw.tags).iter().any(|x| x == r));
            if unfinished {
                if let Err(e) = self
                    .drop_reference(held.as_ref(), definition, key, &v, &removed, true)
                    .await
                {
                    held.release().await;
                    return Err(e);
                }
            }
            held.release().await;
            return Ok(Removed::Done(
                Removal::NotRecorded {
                    reference: r.to_string(),
                    references: before,
                    already_removed: obs.record.as_ref().is_some_and(|rec| rec.removed(r)),
                },
                Some(v),
            ));
        }
        if !remaining.is_empty() {
            let r = self
                .drop_reference(held.as_ref(), definition, key, &v, &removed, holds_it)
                .await;
            held.release().await;
            let remaining = r?
                .as_ref()
                .map(|n| tags::references(&n.tags))
                .unwrap_or(remaining);
            return Ok(Removed::Done(
                Removal::ReferenceRemoved { remaining },
                Some(v),
            ));
        }
        let consumers = guarded::SharedScan::new(self.api.clone());
        let kept = match self
            .kept_for_use(&v, definition, &consumers, locked_at)
            .await
        {
            Ok(k) => k,
            Err(e) => {
                held.release().await;
                return Err(e);
            }
        };
        if let Some(removal) = kept {
            let r = self
                .drop_reference(held.as_ref(), definition, key, &v, &removed, holds_it)
                .await;
            held.release().await;
            r?;
            log_kept(&v, &removal);
            return Ok(Removed::Done(removal, Some(v)));
        }
        // The removal is recorded before the version goes: a version made again from the same
        // content later must not carry this reference back.
        if let Err(e) = forget_in_record(&target, held.as_ref(), obs.raw.as_ref(), &removed).await {
            held.release().await;
            return Err(e);
        }
        self.delete_unreferenced(
            held, &lock_name, definition, key, v, reference, locked_at, &consumers,
        )
        .await
    }

    /// Write the version's references without `removed` (merged), when it holds it
    /// (`holds_it`); otherwise nothing to write. Returns the version as last read.
    async fn drop_reference(
        &self,
        held: &dyn Held,
        definition: &str,
        key: &str,
        v: &ImageVersion,
        removed: &[String],
        holds_it: bool,
    ) -> Result<Option<ImageVersion>> {
        if !holds_it {
            return Ok(Some(v.clone()));
        }
        let lock_name = self.lock_name(definition, key);
        let target = self.guarded_target(&lock_name, definition, key);
        merge_references(&target, held, &Delta::remove(removed)).await
    }

    /// Whether the version, about to lose its last reference, must stay: Azure refuses its
    /// deletion before its end of life, something uses it, or a
    /// list the identity may not see whole proves nothing (never an error: bosh-cli fails a
    /// whole create-env on one, #619). Either way the reference goes and the version stays.
    async fn kept_for_use(
        &self,
        v: &ImageVersion,
        definition: &str,
        consumers: &guarded::SharedScan,
        locked_at: tokio::time::Instant,
    ) -> Result<Option<Removal>> {
        // Azure would refuse the DELETE (by its clock): keep it and say until when. This tool
        // never lifts another tool's block.
        if let Some(until) = v.deletion_blocked(self.api.server_time()) {
            return Ok(Some(Removal::KeptBlocked { until }));
        }
        // Azure cannot delete a Failed (or Canceled) version while the gallery has soft delete
        // on (SDDOC): no DELETE to be refused (one gallery read, for such a version only).
        if v.phase().undeletable_under_soft_delete() && self.api.soft_delete().await?.is_some() {
            return Ok(Some(Removal::KeptFailedInSoftDeleteGallery));
        }
        let in_use = async {
            let listed = guarded::ConsumerView::consumers_since(consumers, locked_at).await?;
            let siblings = self.api.list_versions(definition).await?;
            Ok::<_, Error>(users_of(v, &listed, &siblings))
        }
        .await;
        match in_use {
            Ok(u) if u.is_empty() => Ok(None),
            Ok(consumers) => Ok(Some(Removal::KeptInUse { consumers })),
            Err(e @ Error::PartialView { .. }) => {
                Ok(Some(Removal::KeptUnproven { why: e.to_string() }))
            }
            Err(e) => Err(e),
        }
    }

    /// No reference remains but the one removed now, and nothing uses it: delete, guarded —
    /// kept if a reference appeared or its content changed meanwhile.
    #[allow(clippy::too_many_arguments)]
    async fn delete_unreferenced(
        &self,
        held: Box<dyn Held>,
        lock_name: &str,
        definition: &str,
        key: &str,
        v: ImageVersion,
        reference: Option<&str>,
        locked_at: tokio::time::Instant,
        consumers: &guarded::SharedScan,
    ) -> Result<Removed> {
        let target = self.guarded_target(lock_name, definition, key);
        let decided = v.clone();
        let reference_owned = reference.map(str::to_string);
        let keep_if = move |cur: &ImageVersion| -> Option<String> {
            let others = tags::references(&cur.tags)
                .into_iter()
                .any(|r| Some(&r) != reference_owned.as_ref());
            if others {
                return Some("references".into());
            }
            if cur.tags.get(tags::IMAGE_SHA256) != decided.tags.get(tags::IMAGE_SHA256)
                || cur.source_uri != decided.source_uri
                || cur.published_date != decided.published_date
            {
                return Some("content (re-created)".into());
            }
            None
        };
        tracing::info!(version = %v.id, "no reference remains and nothing uses it: deleting");
        Ok(
            match delete_guarded(&target, held, locked_at, consumers, &keep_if).await? {
                Guarded::Deleted => Removed::Done(Removal::Deleted, Some(v)),
                Guarded::Gone => Removed::Done(Removal::NotFound, None),
                Guarded::InUse(consumers) => {
                    Removed::Done(Removal::KeptInUse { consumers }, Some(v))
                }
                Guarded::Changed(why) => Removed::Changed(why, Some(v)),
                Guarded::Unproven(why) => Removed::Done(Removal::KeptUnproven { why }, Some(v)),
                // The block came after the version was read (or Azure's clock differs): the
                // reference is already removed from the record, whose view every reader takes;
                // the tags follow at the next write.
                Guarded::Blocked(until) => Removed::Done(Removal::KeptBlocked { until }, Some(v)),
                // Likewise: a lock this tool does not own keeps it.
                Guarded::Locked(locks) => Removed::Done(Removal::KeptLocked { locks }, Some(v)),
            },
        )
    }

    /// Remove `references` from a version, under its lock, and never delete the version, even
    /// when no reference remains (`references prune`: deleting an unreferenced version is
    /// `cleanup`'s job, with its grace period, keep-latest and evidence). Only references still
    /// recorded when the lock is held are removed (one recorded since is not in `references`
    /// unless the caller named it). Returns the version as written (`None`: it is gone) and the
    /// references actually removed. A version that is gone (soft-deleted, or a Failed version
    /// being replaced) may still hold them in its record: they are removed there (a restore or
    /// the re-create would bring them back otherwise), and returned.
    pub async fn drop_references(
        &self,
        definition: &str,
        key: &str,
        references: &[String],
    ) -> Result<(Option<ImageVersion>, Vec<String>)> {
        let lock_name = self.lock_name(definition, key);
        let held = self.locks.acquire(&lock_name).await?;
        let target = self.guarded_target(&lock_name, definition, key);
        let r = async {
            for r in references {
                held.drop_intents_of(r).await?;
            }
            let obs = observe(&target, held.as_ref()).await?;
            let Some(v) = obs.healed else {
                // The record the removal applies to, or, when its copies disagree, any copy
                // (`forget_in_record` then removes in each that holds it), as `delete --cid`.
                let in_record: Vec<String> = references
                    .iter()
                    .filter(|r| obs.loaded.holds(None, r))
                    .cloned()
                    .collect();
                if !in_record.is_empty() {
                    forget_in_record(&target, held.as_ref(), None, &in_record).await?;
                }
                return Ok((None, in_record));
            };
            let before = tags::references(&v.tags);
            let removed: Vec<String> = references
                .iter()
                .filter(|r| before.contains(r))
                .cloned()
                .collect();
            if removed.is_empty() {
                return Ok((Some(v), removed));
            }
            let written =
                merge_references(&target, held.as_ref(), &Delta::remove(&removed)).await?;
            Ok((written, removed))
        }
        .await;
        held.release().await;
        r
    }

    /// Hand `cids` back to plain Azure CPIs (a director leaving the front): under the version's
    /// lock, move each that this tool holds (its overflow) into `stemcell_references`, where the
    /// CPI's `create_vm` finds it and its `delete_stemcell` removes it; they leave the record.
    /// Returns the CIDs handed back (those the version holds on this tool's side) and the version
    /// as written. Changes nothing when the CPI's tag has no room for them all
    /// (`TagError::NoRoomToHandBack`, naming what to delete first).
    pub async fn hand_back(
        &self,
        definition: &str,
        key: &str,
        cids: &[String],
    ) -> Result<(Vec<String>, Option<ImageVersion>)> {
        let lock_name = self.lock_name(definition, key);
        let held = self.locks.acquire(&lock_name).await?;
        let target = self.guarded_target(&lock_name, definition, key);
        let r = async {
            let obs = observe(&target, held.as_ref()).await?;
            let Some(v) = obs.healed else {
                return Ok((Vec::new(), None));
            };
            let ours: Vec<String> = tags::sourced_references(&v.tags)
                .into_iter()
                .filter(|(r, s)| *s != tags::Source::StemcellReferences && cids.contains(r))
                .map(|(r, _)| r)
                .collect();
            if ours.is_empty() {
                return Ok((ours, Some(v)));
            }
            // A CID only the record holds (a stale write took it off the tags) is put back on
            // the tags first: once the record names it as being handed back, the tags alone
            // count it, and a hand-back interrupted before its tag write must not leave it
            // counted nowhere.
            let on_tags = obs
                .raw
                .as_ref()
                .map(|raw| tags::references(&raw.tags))
                .unwrap_or_default();
            if ours.iter().any(|c| !on_tags.contains(c)) {
                merge_references(&target, held.as_ref(), &Delta::none()).await?;
            }
            let written =
                merge_references(&target, held.as_ref(), &Delta::hand_back(&ours)).await?;
            Ok((ours, written))
        }
        .await;
        held.release().await;
        r
    }

    /// Add a replication region to an existing version when it is missing.
    pub async fn ensure_target_region(
        &self,
        definition: &str,
        key: &str,
        region: TargetRegion,
    ) -> Result<ImageVersion> {
        let lock_name = version_lock_name(&self.gallery, definition, key);
        let held = self.locks.acquire(&lock_name).await?;
        let r = async {
            let v = self
                .api
                .get_version(definition, key, false)
                .await?
                .ok_or_else(|| {
                    Error::NotFound(format!(
                        "gallery version {} does not exist",
                        self.gallery.version_id(definition, key)
                    ))
                })?;
            if v.target_regions
                .iter()
                .any(|r| region_key(&r.name) == region_key(&region.name))
            {
                return Ok(v);
            }
            let mut regions = v.target_regions.clone();
            regions.push(region);
            held.check().await?;
            self.api.set_target_regions(definition, key, &regions).await
        }
        .await;
        held.release().await;
        r
    }
}

/// One pass of a reference removal.
enum Removed {
    Done(Removal, Option<ImageVersion>),
    /// The guarded delete found the version changed: do the removal again.
    Changed(String, Option<ImageVersion>),
}

/// Say why a version that lost its last reference stays.
fn log_kept(v: &ImageVersion, removal: &Removal) {
    match removal {
        Removal::KeptInUse { consumers } => {
            for c in consumers {
                tracing::info!(version = %v.id, consumer = %c.id, kind = ?c.kind, "version kept: still in use");
            }
        }
        Removal::KeptUnproven { why } => {
            tracing::warn!(version = %v.id, "version kept: {why}")
        }
        Removal::KeptBlocked { until } => tracing::info!(
            version = %v.id,
            "version kept: Azure refuses its deletion {}",
            crate::gallery::lifecycle::until_text(*until)
        ),
        Removal::KeptLocked { locks } => tracing::info!(
            version = %v.id,
            "version kept: a management lock this tool does not own applies to it: {locks}"
        ),
        Removal::KeptFailedInSoftDeleteGallery => tracing::warn!(
            version = %v.id,
            "version kept: it is Failed and the gallery has soft delete on, where Azure cannot delete it; {}",
            crate::gallery::error::FAILED_IN_SOFT_DELETE_REMEDY
        ),
        Removal::ReferenceRemoved { .. }
        | Removal::Deleted
        | Removal::NotFound
        | Removal::NotRecorded { .. }
        | Removal::CarriedRemoved { .. } => {}
    }
}
