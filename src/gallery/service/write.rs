//! The writes `ensure` makes under a version's lock, after observing again: create the version
//! (and its definition when missing), replace a Failed one of the same content (its references
//! carried durably), settle the carried references, and undo a create that ended Failed.

use std::collections::BTreeMap;

use super::super::content::Content;
use super::super::error::{Error, Result};
use super::super::guarded::{
    delete_guarded, finish_shown, merge_references, observe, save_record, take_for_create, Delta,
    Guarded, Observed, ScanEachTime, Target,
};
use super::super::lock::Held;
use super::super::model::*;
use super::super::record::Record;
use super::super::tags;
use super::ensure::Round;
use super::{EnsureRequest, GalleryService, Mode, StemcellImage};

impl GalleryService {
    /// PUT the version (under the lock), with the references its record carries from a replaced
    /// Failed version of the same content, if any, and those writers of the same content
    /// handed over while this call held the lock (issue 49: a burst of directors uploading one
    /// new stemcell is one create). The record is written first: every reference the new
    /// version will hold is durable before the PUT.
    pub(super) async fn create_locked(
        &self,
        held: &dyn Held,
        req: &EnsureRequest,
        definition: &str,
        content: &Content,
        round: &mut Round,
    ) -> Result<Option<Operation>> {
        let key = req.stemcell.version_key.as_str();
        // The time this call's own reads take is time a burst of writers has to arrive.
        let started = tokio::time::Instant::now();
        let location = self.location().await?;
        if self
            .ensure_definition(&req.stemcell, definition, req.mode, &location)
            .await?
            .is_none()
        {
            return Ok(None);
        }
        let lock_name = self.lock_name(definition, key);
        let target = self.guarded_target(&lock_name, definition, key);
        // Writers of this content that reached the lock while it is held hand their references
        // over; gathered before the read the create is decided on, so that read is fresh.
        let taken = take_for_create(&target, held, started, content).await?;
        let obs = observe(&target, held).await?;
        if obs.raw.is_some() {
            // Created meanwhile (by a holder that lost the lock?): observe again.
            return Ok(None);
        }
        let taken = not_handed_before(taken, &obs);
        // The record belongs to a life of this version that is not there: over, or soft-deleted
        // since this call looked (a restore brings that life back, with its record). Written
        // over, that record would be lost: look at the soft-deleted versions first, and restore
        // (or refuse) as before a create.
        let bound_elsewhere =
            obs.record.is_none() && obs.loaded.record.as_ref().is_some_and(|r| r.life.is_some());
        if bound_elsewhere && self.soft_deleted(definition, key).await?.is_some() {
            tracing::info!(
                definition,
                version = key,
                "the version's name was soft-deleted since it was looked at; deciding again"
            );
            round.soft_deleted_checked = false;
            return Ok(None);
        }
        // What the record carries: references of a replaced Failed version of this content.
        let (base, carried) = record_for_create(held, &obs, &target, content).await?;
        // This create's birth mark, in its PUT and in the record written before it: should
        // this call die before binding the record, the record still belongs to the version it
        // made only (`record::Record::born`).
        let mark = uuid::Uuid::new_v4().to_string();
        let mut tags = self.version_tags(req, definition, &mark)?;
        if !carried.is_empty() {
            // References of the Failed version this one replaces (same content): the directors
            // that recorded them still hold those stemcells.
            tags = with_carried(&tags, &carried, definition, key)?;
            tracing::info!(definition, version = key, carried = ?carried, "creating with the references carried from the replaced Failed version");
            round.carried_applied = true;
        }
        let mut holders: BTreeMap<String, String> = req
            .reference
            .clone()
            .zip(req.holder.clone())
            .into_iter()
            .collect();
        with_handed_over(&mut tags, &mut holders, &taken, definition, key)?;
        let mut next = base
            .after_write(&tags, &holders, &[])
            .before_create(&mark, &carried);
        next.set_content(content);
        if !save_record(held, &obs.loaded, next).await? {
            return Ok(None);
        }
        if obs.loaded.record.is_none() && !carried.is_empty() {
            held.clear_legacy_carried().await?;
        }
        debug_assert!(content.held_by(&tags));
        let created_tags = tags.clone();
        let spec = self.version_spec(req, definition, &location, tags);
        tracing::info!(definition, version = key, source = %crate::redact::uri(&req.source_uri), "creating gallery version");
        held.check().await?;
        match self.api.begin_create_version(&spec).await {
            Ok(op) => {
                round.created = true;
                // Held from its first moment: locked now, under the version's lock, not only
                // once the create settles (`protect::place_on_create`).
                crate::gallery::protect::place_on_create(
                    self.api.as_ref(),
                    definition,
                    key,
                    &created_tags,
                )
                .await;
                if !taken.is_empty() {
                    self.finish_handed_over(held, definition, key, &taken).await;
                }
                Ok(Some(op))
            }
            // Someone else's write is in flight: observe again next round.
            Err(Error::Busy { azure, .. }) => {
                tracing::info!(definition, version = key, code = %azure.code, "create met a concurrent write; observing again");
                round.refused = Some(azure);
                Ok(None)
            }
            // Refused at the PUT (a source Azure will not take: no storageAccountId for the
            // blob, another account's, not a fixed VHD page blob): Azure made nothing, so there
            // is no half-made version to clean up; say so and what to fix.
            Err(Error::Rejected { azure, .. }) => Err(Error::CreateRejected {
                definition: definition.to_string(),
                key: key.to_string(),
                source_uri: crate::redact::uri(&req.source_uri),
                azure,
            }),
            Err(e) => Err(e),
        }
    }

    /// After a create that carried handed-over references: read the version once (being
    /// created, it shows the PUT's tags) and finish the intents it shows, so that their writers
    /// stop waiting on the lock and follow the create instead. Best effort: an intent left
    /// claimed goes back to pending with the lock, and its writer finds its reference itself.
    async fn finish_handed_over(
        &self,
        held: &dyn Held,
        definition: &str,
        key: &str,
        taken: &[crate::gallery::lock::Intent],
    ) {
        let shown = match self.api.get_version(definition, key, false).await {
            Ok(Some(v)) => finish_shown(held, taken, &v).await,
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(e) = shown {
            tracing::warn!(definition, version = key, error = %e, "could not tell the writers that handed their references to this create; each finds its reference on the version itself");
        }
    }

    /// The version to PUT: the request's source and regions (the gallery's location, when it
    /// names none), its safeguards, and `tags`.
    fn version_spec(
        &self,
        req: &EnsureRequest,
        definition: &str,
        location: &str,
        tags: BTreeMap<String, String>,
    ) -> VersionSpec {
        let key = req.stemcell.version_key.as_str();
        VersionSpec {
            definition: definition.to_string(),
            version: key.to_string(),
            location: location.to_string(),
            source_uri: req.source_uri.clone(),
            storage_account_id: req.storage_account_id.clone(),
            target_regions: if req.target_regions.is_empty() {
                vec![TargetRegion {
                    name: location.to_string(),
                    replicas: req.replica_count,
                    storage_account_type: None,
                    exclude_from_latest: None,
                }]
            } else {
                req.target_regions.clone()
            },
            replica_count: req.replica_count,
            exclude_from_latest: req.exclude_from_latest,
            end_of_life: req.safeguards.end_of_life_at(
                self.api
                    .server_time()
                    .unwrap_or_else(time::OffsetDateTime::now_utc),
            ),
            block_deletion_before_end_of_life: req.safeguards.block_deletion_before_end_of_life,
            tags,
        }
    }

    /// Replace a Failed version of the same content: record its references in its reference
    /// record first (the only place they live once it is deleted), then delete it (guarded); the
    /// next create carries them.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn replace_failed(
        &self,
        held: Box<dyn Held>,
        locked_at: tokio::time::Instant,
        definition: &str,
        key: &str,
        content: &Content,
        v: &ImageVersion,
        round: &mut Round,
    ) -> Result<Option<Operation>> {
        tracing::warn!(
            definition,
            version = key,
            "version is {} with this content; deleting it before creating it again",
            v.provisioning_state.as_str()
        );
        let lock_name = self.lock_name(definition, key);
        // Its references (the Azure CPI's too) are noted on its record, to carry into the
        // version this call creates, right before the DELETE (`guarded::Target::carry`).
        let target = crate::gallery::guarded::Target {
            carry: true,
            ..self.guarded_target(&lock_name, definition, key)
        };
        let decided_tags = v.tags.clone();
        let keep_if = move |cur: &ImageVersion| -> Option<String> {
            if !cur.phase().replaceable() {
                return Some(format!(
                    "provisioning state (now {})",
                    cur.provisioning_state
                ));
            }
            if !content.held_by(&cur.tags) {
                return Some(content.what().into());
            }
            if cur.tags != decided_tags {
                return Some("tags".into());
            }
            None
        };
        let consumers = ScanEachTime(self.api.clone());
        let deleted = delete_guarded(&target, held, locked_at, &consumers, &keep_if).await;
        if !matches!(deleted, Ok(Guarded::Deleted)) {
            // Not deleted by this call: nothing is carried (if someone else deleted it, its
            // life is over, and its references with it; `gallery::record`).
            if let Err(e) = self.drop_carried(definition, key).await {
                tracing::warn!(definition, version = key, error = %e, "could not forget the references noted to carry; the next replacement of this version notes them again");
                if deleted.is_ok() {
                    return Err(e);
                }
            }
        }
        match deleted? {
            Guarded::Deleted | Guarded::Gone => {
                round.recreated = true;
                Ok(None)
            }
            Guarded::Changed(_) => Ok(None),
            // A version whose update (not its create) failed may still run VMs: never delete
            // what something uses.
            Guarded::InUse(users) => Err(Error::FailedVersionInUse {
                id: v.id.clone(),
                state: v.provisioning_state.as_str().to_string(),
                users: users.into_iter().map(|c| c.id).collect(),
            }),
            // Not provably unused: never replaced on a guess.
            Guarded::Unproven(why) => Err(Error::FailedVersionUnproven {
                id: v.id.clone(),
                state: v.provisioning_state.as_str().to_string(),
                why,
            }),
            // This tool never lifts another's lock.
            Guarded::Locked(locks) => Err(Error::FailedVersionUnproven {
                id: v.id.clone(),
                state: v.provisioning_state.as_str().to_string(),
                why: format!(
                    "a management lock this tool does not own applies to it ({locks}); once whoever placed it removes it, re-run"
                ),
            }),
            // This tool never lifts another tool's block.
            Guarded::Blocked(until) => Err(Error::FailedVersionUnproven {
                id: v.id.clone(),
                state: v.provisioning_state.as_str().to_string(),
                why: format!(
                    "Azure refuses its deletion {} (safetyProfile.blockDeletionBeforeEndOfLife); once whoever set the block lifts it, re-run",
                    crate::gallery::lifecycle::until_text(until)
                ),
            }),
        }
    }

    /// After a create that carried references from a replaced Failed version: under the lock,
    /// make sure the new version holds every reference its record holds (a merge restores what
    /// is missing). A failure here leaves the record as it is for the next ensure.
    pub(super) async fn settle_carried(
        &self,
        definition: &str,
        key: &str,
    ) -> Result<Option<ImageVersion>> {
        let lock_name = self.lock_name(definition, key);
        let held = self.locks.acquire(&lock_name).await?;
        let target = self.guarded_target(&lock_name, definition, key);
        let r = merge_references(&target, held.as_ref(), &Delta::none()).await;
        held.release().await;
        r
    }

    /// A Failed version whose references were noted to carry was not deleted by this call
    /// (someone else deleted it first, or it is kept, or the call failed): forget the note
    /// unless a DELETE is under way (under the lock) or done: a version that is absent may be
    /// gone by a DELETE of this tool whose answer was lost, or by one another call of this tool
    /// sent before its lease ran out — which cannot be told from someone else's. Forgetting
    /// the note then would lose every reference it carries; kept, the next create of this
    /// version carries them (at worst a leak, never a loss: docs/RELIABILITY.md, "What
    /// remains"). A version made again by someone else never takes the note (it is bound to
    /// the life that ended).
    async fn drop_carried(&self, definition: &str, key: &str) -> Result<()> {
        let lock_name = self.lock_name(definition, key);
        let held = self.locks.acquire(&lock_name).await?;
        let target = self.guarded_target(&lock_name, definition, key);
        let r = async {
            let obs = observe(&target, held.as_ref()).await?;
            let leaving = obs.raw.as_ref().is_some_and(|v| v.phase().leaving());
            if obs.raw.is_none() {
                tracing::info!(definition, version = key, "the Failed version is gone (by a DELETE whose answer was lost, or another's): its references stay noted, for the next create to carry");
                return Ok(());
            }
            match &obs.record {
                Some(rec) if !rec.carried.is_empty() && rec.life.is_some() && !leaving => {
                    tracing::info!(definition, version = key, noted = ?rec.carried, "the Failed version was not deleted by this call; its references are not carried");
                    let next = rec.clone().without_carry_note();
                    save_record(held.as_ref(), &obs.loaded, next).await.map(|_| ())
                }
                _ => Ok(()),
            }
        }
        .await;
        held.release().await;
        r
    }

    /// Our create ended Failed: remove the Failed version (guarded: only while it is still the
    /// Failed version we made) so nothing half-made stays behind. Carried references stay in the
    /// lock's note for the next ensure.
    pub(super) async fn undo_failed_create(
        &self,
        req: &EnsureRequest,
        definition: &str,
        content: &Content,
        cause: Error,
    ) -> Error {
        let key = req.stemcell.version_key.as_str();
        tracing::warn!(definition, version = key, error = %cause, "create failed; removing the failed version");
        let lock_name = self.lock_name(definition, key);
        let held = match self.locks.acquire(&lock_name).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(definition, version = key, error = %e, "could not take the lock to remove the failed version; the next ensure replaces it");
                return cause;
            }
        };
        let target = self.guarded_target(&lock_name, definition, key);
        let source = req.source_uri.clone();
        let keep_if = move |cur: &ImageVersion| -> Option<String> {
            if !cur.phase().replaceable() {
                return Some(format!(
                    "provisioning state (now {})",
                    cur.provisioning_state
                ));
            }
            if !content.held_by(&cur.tags) || cur.source_uri.as_deref() != Some(source.as_str()) {
                return Some("content (another create)".into());
            }
            None
        };
        let consumers = ScanEachTime(self.api.clone());
        let started = tokio::time::Instant::now();
        match delete_guarded(&target, held, started, &consumers, &keep_if).await {
            Ok(Guarded::Deleted) | Ok(Guarded::Gone) => {}
            Ok(other) => {
                tracing::warn!(definition, version = key, outcome = ?other, "the failed version was kept; the next ensure decides again");
            }
            Err(e) => {
                tracing::warn!(definition, version = key, error = %e, "could not remove the failed version; the next ensure replaces it");
            }
        }
        cause
    }

    /// Create the definition when missing; check an existing one can hold this stemcell.
    /// `None`: a create met a 409 and the definition is still not readable (another write in
    /// flight): the caller observes again.
    async fn ensure_definition(
        &self,
        stemcell: &StemcellImage,
        name: &str,
        mode: Mode,
        location: &str,
    ) -> Result<Option<ImageDefinition>> {
        let spec = self.definition_spec(stemcell, name, mode, location);
        let existing = match self.api.get_definition(name).await? {
            Some(d) => d,
            None => match self.api.create_definition(&spec).await {
                Ok(d) => return Ok(Some(d)),
                // Created concurrently by someone else (or our own retried PUT): read it and
                // check it; not readable yet → observe again.
                Err(Error::Busy { azure, .. }) => match self.api.get_definition(name).await? {
                    Some(d) => d,
                    None => {
                        tracing::info!(definition = name, code = %azure.code, "definition create met a concurrent write; observing again");
                        return Ok(None);
                    }
                },
                Err(e) => return Err(e),
            },
        };
        check_definition(&existing, &spec)?;
        Ok(Some(existing))
    }
}

/// Definition properties are immutable in practice: an existing definition must match.
fn check_definition(d: &ImageDefinition, want: &DefinitionSpec) -> Result<()> {
    let mut problems = Vec::new();
    let gen = d.generation.as_deref().unwrap_or("V1");
    if !gen.eq_ignore_ascii_case(want.generation.as_azure()) {
        problems.push(format!(
            "Hyper-V generation {gen} (the stemcell needs {})",
            want.generation.as_azure()
        ));
    }
    let arch = d.architecture.as_deref().unwrap_or("x64");
    if !arch.eq_ignore_ascii_case(want.architecture.as_azure()) {
        // The Azure CPI names definitions without the architecture (compute_gallery_manager.rb
        // `build_image_definition_name`), so x64 and Arm64 stemcells of one name meet here.
        problems.push(format!(
            "architecture {arch} (the stemcell needs {}: an x64 and an Arm64 stemcell of the same name map to the same definition name, as the Azure CPI names them, and must not share it; give one of them its own cloud_properties.name, or use another gallery)",
            want.architecture.as_azure()
        ));
    }
    if !d.os_type.is_empty() && !d.os_type.eq_ignore_ascii_case("Linux") {
        problems.push(format!("OS type {} (the stemcell needs Linux)", d.os_type));
    }
    if !d.os_state.is_empty() && !d.os_state.eq_ignore_ascii_case("Generalized") {
        problems.push(format!(
            "OS state {} (the stemcell needs Generalized)",
            d.os_state
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::DefinitionMismatch {
            id: d.id.clone(),
            problems: problems.join(", "),
        })
    }
}

/// The record a create starts from, and the references it carries: those of a replaced Failed
/// version of this content. A record of other content belongs to a version that is gone for
/// good (its references are not this version's); an earlier release kept carried references
/// in a note. Only a record bound to no life counts here (`record::Record::fits`): one bound
/// to a version that is gone is over, whoever deleted it.
async fn record_for_create(
    held: &dyn Held,
    obs: &Observed,
    target: &Target<'_>,
    content: &Content,
) -> Result<(Record, Vec<String>)> {
    let (definition, key) = (target.definition, target.key);
    Ok(match &obs.loaded.for_create(content) {
        Some(r) if r.is_for(content) => {
            let r = r.carried_to_create();
            let carried = r.references();
            (r, carried)
        }
        Some(r) => {
            if !r.references.is_empty() {
                tracing::warn!(
                    definition,
                    version = key,
                    "the reference record holds references for other content ({}: {}); this version is created without them",
                    r.content_of_kind(content).unwrap_or("unknown"),
                    r.references().join(", ")
                );
            }
            (Record::for_content(&target.binding(), content), Vec::new())
        }
        None => (
            Record::for_content(&target.binding(), content),
            held.legacy_carried().await?,
        ),
    })
}

/// A reference the record of an earlier create of this version names was handed to that create
/// already: its life may have been made and gone since, and a writer that died meanwhile would
/// see its reference ride into a life it never asked for (a life starts with the references of
/// those who asked for it). Not taken again: it stays pending, and a writer still waiting writes
/// it for itself once it holds the lock.
fn not_handed_before(
    taken: Vec<crate::gallery::lock::Intent>,
    obs: &Observed,
) -> Vec<crate::gallery::lock::Intent> {
    let earlier = obs
        .loaded
        .record
        .as_ref()
        .map(Record::references)
        .unwrap_or_default();
    taken
        .into_iter()
        .filter(|i| !earlier.contains(&i.reference))
        .collect()
}

/// The references writers handed to this create (`taken`), added to its PUT's `tags` and their
/// holders to `holders`.
fn with_handed_over(
    tags: &mut BTreeMap<String, String>,
    holders: &mut BTreeMap<String, String>,
    taken: &[crate::gallery::lock::Intent],
    definition: &str,
    key: &str,
) -> Result<()> {
    if taken.is_empty() {
        return Ok(());
    }
    let handed: Vec<String> = taken.iter().map(|i| i.reference.clone()).collect();
    *tags = with_carried(tags, &handed, definition, key)?;
    for i in taken {
        if let Some(h) = &i.holder {
            holders
                .entry(i.reference.clone())
                .or_insert_with(|| h.clone());
        }
    }
    Ok(())
}

/// `tags` with the references `carried` added (after those there).
fn with_carried(
    tags: &BTreeMap<String, String>,
    carried: &[String],
    definition: &str,
    key: &str,
) -> Result<BTreeMap<String, String>> {
    let mut refs = tags::references(tags);
    for r in carried {
        if !refs.contains(r) {
            refs.push(r.clone());
        }
    }
    tags::with_references(tags, &refs, &tags::sentinel(definition, key)).map_err(|e| {
        Error::VersionTags {
            resource: format!("{definition}/{key}"),
            source_error: e,
        }
    })
}
