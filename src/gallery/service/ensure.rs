//! `ensure`'s reconcile loop, in named steps: observe (backing off after a refused create),
//! decide, then reuse, adopt, refuse, wait, or take the lock and make one write (`write_step`),
//! and follow a create to its end (undoing it if it ended Failed).

use super::super::adopt::{self, Adopted, Adoption};
use super::super::content::Content;
use super::super::decide::{decide, Action};
use super::super::error::{AzureError, Error, Result};
use super::super::guarded::{self, merge_references, Delta};
use super::super::lifecycle::EnsureStep;
use super::super::lock::{Ask, Held};
use super::super::model::*;
use super::super::record;
use super::super::tags;
use super::{EnsureRequest, Ensured, GalleryService, Mode, Outcome};

const MAX_ROUNDS: usize = 12;

/// What the rounds of one `ensure` did so far.
#[derive(Debug, Default)]
pub(super) struct Round {
    pub(super) created: bool,
    pub(super) recreated: bool,
    /// The version was created with references carried from a replaced Failed version (kept
    /// in its reference record): make sure the new version holds them once it is Succeeded.
    pub(super) carried_applied: bool,
    /// A soft-deleted version of this name and content was restored (nothing created).
    restored: bool,
    /// The soft-deleted list was read since the last refused create (a create under a
    /// soft-deleted name is refused by Azure: read it again after a refusal).
    pub(super) soft_deleted_checked: bool,
    /// The last create refused with 409 (see [`GalleryService::create_locked`]); cleared when a
    /// later observation finds the version.
    pub(super) refused: Option<Box<AzureError>>,
    /// Creates refused in a row while the version stayed absent.
    refusals: u32,
    /// A caller with nothing to create from looked at the version once more before giving up.
    looked_again: bool,
    /// This call's lease ran out while it wrote: whoever took the lock meanwhile decided on the
    /// version as it was before that write, and may still be writing. The version is not reused
    /// on what it shows until that writer is done (the lock taken once more).
    lock_lost: bool,
}

impl Round {
    /// What the call did, as reported once the version is reused.
    fn outcome(&self, waited: bool) -> Outcome {
        if self.recreated {
            Outcome::Recreated
        } else if self.restored {
            Outcome::Restored
        } else if self.created {
            Outcome::Created
        } else if waited {
            Outcome::Waited
        } else {
            Outcome::Reused
        }
    }
}

/// What one `ensure` call is for, the same in every round.
#[derive(Clone, Copy)]
struct Call<'a> {
    req: &'a EnsureRequest,
    definition: &'a str,
    key: &'a str,
    /// The image's SHA-256, lowercase.
    content: &'a Content,
    reference: Option<&'a str>,
    /// The life (`record::life_of`) of the version this round decided on: a reference handed
    /// over is for that life only (`lock::Intent::fits`).
    life: Option<&'a str>,
}

/// Creates refused in a row (409 while GET says the version is absent) before giving up: with
/// the backoff below, about 30 s, past the ~10–20 s Azure takes to forget a deleted child
/// (REFERENCE.md "After a DELETE completes").
const MAX_REFUSED_CREATES: u32 = 6;

/// The wait before creating again after a refused create: Azure's `Retry-After` when it gave
/// one (at least 50 ms), else 1 s doubling to 8 s.
fn refused_create_backoff(refusals: u32, azure: &AzureError) -> std::time::Duration {
    match azure.retry_after_secs {
        Some(s) => {
            std::time::Duration::from_secs(u64::from(s)).max(std::time::Duration::from_millis(50))
        }
        None => std::time::Duration::from_secs(1u64 << refusals.saturating_sub(1).min(3)),
    }
}

impl GalleryService {
    /// [`GalleryService::ensure`], adopting a Succeeded version without `image_sha256` (made by
    /// Azure CPI v52.0.1–v53.0.0) when `adoption` proves its content (see [`adopt`]).
    pub async fn ensure_adopting(
        &self,
        req: &EnsureRequest,
        adoption: Option<Adoption<'_>>,
    ) -> Result<Ensured> {
        self.ensure_observed(req, adoption, None).await
    }

    /// [`GalleryService::ensure_adopting`] from a version the caller has just observed (one GET
    /// it made before deciding to upload nothing): the first round decides on `observed` instead
    /// of asking Azure again; every later round observes for itself.
    pub async fn ensure_observed(
        &self,
        req: &EnsureRequest,
        adoption: Option<Adoption<'_>>,
        observed: Option<ImageVersion>,
    ) -> Result<Ensured> {
        // The writer's arrival goes with its first hand-over or lock; any way out before that
        // removes it here.
        let mut arrival = req.arrival.clone();
        let ensured = self
            .ensure_rounds(req, adoption, observed, &mut arrival)
            .await;
        self.leave(arrival).await;
        ensured
    }

    async fn ensure_rounds(
        &self,
        req: &EnsureRequest,
        adoption: Option<Adoption<'_>>,
        observed: Option<ImageVersion>,
        arrival: &mut Option<String>,
    ) -> Result<Ensured> {
        let mut first = observed;
        if let Some(r) = &req.reference {
            tags::validate_reference(r).map_err(Error::BadReference)?;
        }
        let definition = Self::definition_name(&req.stemcell, req.mode, &req.create_env_suffix);
        let key = req.stemcell.version_key.as_str();
        let content = &req.stemcell.content;
        let reference = req.reference.as_deref();
        let mut waited = false;
        let mut round = Round {
            soft_deleted_checked: req.soft_deleted_checked,
            ..Round::default()
        };
        let mut lock_failures: u32 = 0;
        // The verdict on a version without image_sha256, by the source it was reached for (the
        // proof reads both VHDs: it is not repeated when a round has to observe again).
        let mut adopted: Option<(Option<String>, Adopted)> = None;

        for _ in 0..MAX_ROUNDS {
            let observed = match first.take() {
                Some(v) => Some(v),
                None => self.observe(&definition, key, &mut round).await?,
            };
            match decide(observed.as_ref(), content, reference) {
                Action::Reuse => {
                    let Some(version) = observed else {
                        continue;
                    };
                    if round.lock_lost {
                        // A create PUT of the other writer replaces this call's tags (seed
                        // 4482): wait for it (the lock, taken and given back), then observe.
                        round.lock_lost = false;
                        let lock_name = self.lock_name(&definition, key);
                        self.locks.acquire(&lock_name).await?.release().await;
                        continue;
                    }
                    let adopted = adopted.map(|(_, a)| a);
                    return self
                        .reused(req, definition, version, &round, waited, adopted)
                        .await;
                }
                Action::Conflict {
                    existing_digest: None,
                } if adoption.is_some() && observed.is_some() => {
                    let (Some(adoption), Some(v)) = (adoption, observed.as_ref()) else {
                        continue;
                    };
                    waited |= self
                        .adopt_round(req, &definition, v, adoption, &mut adopted)
                        .await?;
                }
                Action::Conflict { existing_digest } => {
                    return Err(self.conflict(req, &definition, observed.as_ref(), existing_digest))
                }
                Action::Wait | Action::WaitForDeletion => {
                    waited = true;
                    tracing::info!(
                        definition,
                        version = key,
                        "version is busy in Azure; waiting for it to settle"
                    );
                    self.api.wait_version_settled(&definition, key).await?;
                }
                action @ (Action::Create | Action::Replace | Action::AddReference) => {
                    let life = observed.as_ref().and_then(record::life_of);
                    let call = Call {
                        req,
                        definition: &definition,
                        key,
                        content,
                        reference,
                        life: life.as_deref(),
                    };
                    self.write_round(&call, action, &mut round, &mut lock_failures, arrival)
                        .await?;
                }
            }
        }
        Err(Error::EnsureUnsettled {
            definition,
            key: key.to_string(),
            rounds: MAX_ROUNDS,
        })
    }

    /// A round that writes (create, replace, or add the reference): a soft-deleted version of
    /// this content is restored first, a caller with nothing to create from refused; else the
    /// lock is taken (or the reference handed over), the write made, and a create followed to
    /// its end. `Ok(())`: observe again.
    async fn write_round(
        &self,
        call: &Call<'_>,
        action: Action,
        round: &mut Round,
        lock_failures: &mut u32,
        arrival: &mut Option<String>,
    ) -> Result<()> {
        let Call {
            req,
            definition,
            key,
            content,
            reference,
            ..
        } = *call;
        if action == Action::Create && !round.soft_deleted_checked {
            // A soft-deleted version may hold the name: restored when it has this
            // content (then observed again), refused otherwise, before any write.
            round.soft_deleted_checked = true;
            if self.restore_before_create(req, definition, content).await? {
                round.restored = true;
                return Ok(());
            }
        }
        let only_reference = action == Action::AddReference;
        if !only_reference
            && (req.source_uri.trim().is_empty() || req.storage_account_id.trim().is_empty())
        {
            // The caller uploaded nothing (it came to reuse, restore or compare an
            // existing version). Another host may have restored the soft-deleted
            // version between this call's read and its look at the soft-deleted list
            // (the list no longer names it, the read did not show it yet): look once
            // more before saying there is nothing to create from.
            if round.soft_deleted_checked && !round.looked_again {
                round.looked_again = true;
                return Ok(());
            }
            return Err(Error::NothingToCreateFrom {
                definition: definition.to_string(),
                key: key.to_string(),
            });
        }
        let Some(held) = self.lock_for_write(action, call, arrival).await? else {
            // Recorded by the lock's holder: observe again (Reuse).
            return Ok(());
        };
        let locked_at = tokio::time::Instant::now();
        // The step releases the lock. The create's long-running operation is
        // followed after that, so other callers can wait on the version rather
        // than on the lock.
        let pending = match self
            .write_step(held, locked_at, req, definition, content, reference, round)
            .await
        {
            Ok(p) => p,
            // The lease was lost (a stall past it): nothing was written after that;
            // observe again under a new lock.
            Err(Error::Lock(e)) if *lock_failures < 2 => {
                *lock_failures += 1;
                round.lock_lost = true;
                tracing::warn!(definition, version = key, "{e}; observing again");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if let Some(op) = pending {
            self.follow_create(req, definition, content, &op).await?;
        }
        Ok(())
    }

    /// Observe the version (one GET). After a create refused with 409 while the version was
    /// absent, Azure is not done with a version of this name (right after we deleted a Failed
    /// one, Azure can still count it for a while; REFERENCE.md "After a DELETE completes"):
    /// back off as Azure asks and observe again; give up with a clear error if it never clears.
    async fn observe(
        &self,
        definition: &str,
        key: &str,
        round: &mut Round,
    ) -> Result<Option<ImageVersion>> {
        let observed = self.api.get_version(definition, key, false).await?;
        let Some(azure) = round.refused.take() else {
            return Ok(observed);
        };
        if observed.is_some() {
            round.refusals = 0;
            return Ok(observed);
        }
        round.refusals += 1;
        round.soft_deleted_checked = false;
        if round.refusals >= MAX_REFUSED_CREATES {
            return Err(Error::CreateRefused {
                definition: definition.to_string(),
                key: key.to_string(),
                refusals: round.refusals,
                azure,
            });
        }
        let wait = refused_create_backoff(round.refusals, &azure);
        tracing::info!(definition, version = key, code = %azure.code, wait_ms = wait.as_millis() as u64, "create refused while the version is absent; backing off before creating again");
        tokio::time::sleep(wait).await;
        self.api.get_version(definition, key, false).await
    }

    /// The version is there with this content and reference: report what this call did, after
    /// making sure the references carried from a replaced Failed version are on it.
    async fn reused(
        &self,
        req: &EnsureRequest,
        definition: String,
        mut version: ImageVersion,
        round: &Round,
        waited: bool,
        adopted: Option<Adopted>,
    ) -> Result<Ensured> {
        if round.carried_applied {
            let key = req.stemcell.version_key.as_str();
            if let Some(v) = self.settle_carried(&definition, key).await? {
                version = v;
            }
        }
        if round.created || round.recreated {
            self.bind_created(&version).await;
            // Created holding its references: held means locked (a reuse with nothing to
            // write stays one GET; the next write repairs a lock that is missing).
            crate::gallery::protect::settle(self.api.as_ref(), &version).await;
        }
        if let Some(v) = self.record_missing_holder(req, &version).await? {
            version = v;
        }
        Ok(Ensured {
            outcome: round.outcome(waited),
            mode: req.mode,
            definition,
            version,
            adopted,
        })
    }

    /// Bind the record this call wrote before its create (bound to no life then: the version did
    /// not exist) to the version it created (`gallery::record`, "Whose record it is"): should the
    /// version be deleted and made again by someone else, the new one starts empty. Blob
    /// requests only, under the lock; best effort (unbound, the record still applies to a
    /// version of its content).
    async fn bind_created(&self, version: &ImageVersion) {
        let bound = async {
            let Some(store) = self.locks.records() else {
                return Ok(());
            };
            let lock_name = self.lock_name(&version.definition, &version.version);
            let binding = super::super::record::Binding::new(
                &self.gallery,
                &version.definition,
                &version.version,
            );
            // Nothing to bind (no record, or bound already): no lock taken.
            let loaded = super::super::record::load(store, &lock_name, &binding).await?;
            if loaded
                .applicable(Some(version))
                .is_none_or(|r| r.life.is_some())
            {
                return Ok(());
            }
            let held = self.locks.acquire(&lock_name).await?;
            let r = async {
                let loaded =
                    super::super::record::load(held.records(), &lock_name, &binding).await?;
                if let Some(rec) = loaded.applicable(Some(version)) {
                    if rec.life.is_none() {
                        guarded::save_record(held.as_ref(), &loaded, rec.bound_to(version)).await?;
                    }
                }
                Ok::<_, Error>(())
            }
            .await;
            held.release().await;
            r
        }
        .await;
        if let Err(e) = bound {
            tracing::warn!(version = %version.id, error = %e, "could not bind the reference record to the version just created; the next write binds it");
        }
    }

    /// A reference already recorded on this tool's side without a holder (by an earlier release,
    /// or by a call that named none), asked for again with one: record who holds it (a record
    /// write under the lock; the tags do not change). `None` when there is nothing to record.
    /// Read only when the request names a holder.
    async fn record_missing_holder(
        &self,
        req: &EnsureRequest,
        version: &ImageVersion,
    ) -> Result<Option<ImageVersion>> {
        let (Some(reference), Some(holder)) = (req.reference.as_deref(), req.holder.as_deref())
        else {
            return Ok(None);
        };
        let Some(store) = self.locks.records() else {
            return Ok(None);
        };
        let ours = tags::sourced_references(&tags::canonical_names(&version.tags))
            .into_iter()
            .any(|(r, s)| r == reference && s != tags::Source::StemcellReferences);
        if !ours {
            // The Azure CPI's own list: the record holds nothing of it.
            return Ok(None);
        }
        let lock_name = self.lock_name(&version.definition, &version.version);
        let binding = super::super::record::Binding::new(
            &self.gallery,
            &version.definition,
            &version.version,
        );
        let known = super::super::record::load(store, &lock_name, &binding)
            .await?
            .applicable(Some(version))
            .and_then(|r| r.entry(reference).and_then(|e| e.holder.clone()));
        if known.is_some() {
            return Ok(None);
        }
        tracing::info!(
            definition = %version.definition,
            version = %version.version,
            reference,
            holder,
            "recording who holds a reference recorded without a holder"
        );
        let held = self.locks.acquire(&lock_name).await?;
        let target = self.guarded_target(&lock_name, &version.definition, &version.version);
        let r =
            merge_references(&target, held.as_ref(), &Delta::add(reference, Some(holder))).await;
        held.release().await;
        r
    }

    /// The version's lock for one write. Adding a reference, or creating the version with one:
    /// hand it to the lock's holder if there is one (group commit: a holder writing the
    /// version's references, or one creating it with this content, issue 49), else write it
    /// ourselves. `None`: handed over and shown on the version by the holder (the caller
    /// observes again; only a version that is there with the reference, Succeeded, is reused).
    /// `arrival` (this writer's announcement) is taken by the hand-over, which removes it.
    async fn lock_for_write(
        &self,
        action: Action,
        call: &Call<'_>,
        arrival: &mut Option<String>,
    ) -> Result<Option<Box<dyn Held>>> {
        let lock_name = self.lock_name(call.definition, call.key);
        let to_create = match action {
            Action::AddReference => false,
            Action::Create => true,
            _ => return Ok(Some(self.locks.acquire(&lock_name).await?)),
        };
        let Some(reference) = call.reference else {
            return Ok(Some(self.locks.acquire(&lock_name).await?));
        };
        let ask = Ask {
            reference,
            holder: call.req.holder.as_deref(),
            content: call.content,
            to_create,
            life: if to_create { None } else { call.life },
        };
        Ok(
            match guarded::acquire_or_hand_over(
                self.api.as_ref(),
                self.locks.as_ref(),
                &lock_name,
                call.definition,
                call.key,
                &ask,
                arrival.take(),
            )
            .await?
            {
                guarded::Acquired::Held(h) => Some(h),
                guarded::Acquired::HandedOver => None,
            },
        )
    }

    /// One write, under the lock `held` (released before returning), after observing again.
    /// Returns a create operation to follow. A 409 (another write in flight, e.g. our own
    /// retried request that did reach Azure) is not an error: the loop observes again.
    #[allow(clippy::too_many_arguments)]
    async fn write_step(
        &self,
        held: Box<dyn Held>,
        locked_at: tokio::time::Instant,
        req: &EnsureRequest,
        definition: &str,
        content: &Content,
        reference: Option<&str>,
        round: &mut Round,
    ) -> Result<Option<Operation>> {
        let key = req.stemcell.version_key.as_str();
        // Decided on the version as its record says it is (a reference a late tag write erased
        // still counts).
        let lock_name = self.lock_name(definition, key);
        let target = self.guarded_target(&lock_name, definition, key);
        let (observed, stale_tags) = match guarded::observe(&target, held.as_ref()).await {
            Ok(o) => {
                let stale = matches!((&o.raw, &o.healed), (Some(r), Some(h)) if r.tags != h.tags);
                (o.healed, stale)
            }
            Err(e) => {
                held.release().await;
                return Err(e);
            }
        };
        let mut action = decide(observed.as_ref(), content, reference);
        if action == Action::Reuse && stale_tags {
            // The record holds the reference, Azure's tags do not (a write that failed after the
            // record, or a late write that erased it): write the tags now; observing again
            // without the lock would only see the same tags.
            action = Action::AddReference;
        }
        match action {
            Action::Create => {
                let mut r = self
                    .create_locked(held.as_ref(), req, definition, content, round)
                    .await;
                if r.is_ok() {
                    // A stall between the last check and the PUT can outlast the lease: another
                    // writer then took the lock, saw no version, and creates too, and its PUT
                    // (create-or-update: versions have no conditional write) replaces this
                    // create's tags and record. Only a lease still ours after the PUT proves
                    // nobody decided on the version meanwhile; else the loop observes again
                    // under a new lock (seed 4482).
                    if let Err(e) = held.check().await {
                        r = Err(e);
                    }
                }
                held.release().await;
                r
            }
            Action::Replace => {
                let Some(v) = observed else {
                    held.release().await;
                    return Ok(None);
                };
                // With soft delete on, Azure refuses to delete a Failed version: refuse before
                // any DELETE, never a DELETE-then-PUT loop (one gallery read, on this way only).
                debug_assert!(v.phase().undeletable_under_soft_delete());
                match self.api.soft_delete().await {
                    Ok(None) => {}
                    Ok(Some(_)) => {
                        held.release().await;
                        return Err(Error::FailedVersionSoftDeleteGallery {
                            id: v.id.clone(),
                            state: v.provisioning_state.as_str().to_string(),
                            gallery: self.gallery.gallery.clone(),
                        });
                    }
                    Err(e) => {
                        held.release().await;
                        return Err(e);
                    }
                }
                self.replace_failed(held, locked_at, definition, key, content, &v, round)
                    .await
            }
            Action::AddReference => {
                let r = self
                    .add_reference_locked(
                        held.as_ref(),
                        definition,
                        key,
                        reference,
                        req.holder.as_deref(),
                    )
                    .await;
                held.release().await;
                r.map(|_| None)
            }
            // The world changed between the two observations: the loop decides again.
            Action::Reuse | Action::Wait | Action::WaitForDeletion | Action::Conflict { .. } => {
                held.release().await;
                Ok(None)
            }
        }
    }

    /// Record the reference on the existing version (a tags-only write, merged), under `held`.
    async fn add_reference_locked(
        &self,
        held: &dyn Held,
        definition: &str,
        key: &str,
        reference: Option<&str>,
        holder: Option<&str>,
    ) -> Result<Option<ImageVersion>> {
        tracing::info!(
            definition,
            version = key,
            reference,
            holder,
            "recording reference on existing version"
        );
        let delta = match reference {
            Some(r) => Delta::add(r, holder),
            None => Delta::none(),
        };
        let lock_name = self.lock_name(definition, key);
        let target = self.guarded_target(&lock_name, definition, key);
        merge_references(&target, held, &delta).await
    }

    /// Follow our create to its end; if it ended Failed, remove what it left (see
    /// [`GalleryService::undo_failed_create`]) and return why.
    async fn follow_create(
        &self,
        req: &EnsureRequest,
        definition: &str,
        content: &Content,
        op: &Operation,
    ) -> Result<()> {
        match self.api.wait(op).await {
            Ok(()) => Ok(()),
            Err(e) => Err(self.undo_failed_create(req, definition, content, e).await),
        }
    }

    /// One round of `ensure` on `v`, a version without image_sha256: wait while it is busy;
    /// refuse it Failed; else prove its content (once per source; `adopted` remembers the
    /// verdict) and record this stemcell's image_sha256 and the reference under the lock. The
    /// caller observes again. `true` when it waited.
    async fn adopt_round(
        &self,
        req: &EnsureRequest,
        definition: &str,
        v: &ImageVersion,
        adoption: Adoption<'_>,
        adopted: &mut Option<(Option<String>, Adopted)>,
    ) -> Result<bool> {
        let key = req.stemcell.version_key.as_str();
        let content = &req.stemcell.content;
        match v.phase().ensure_step() {
            EnsureStep::Use => {}
            EnsureStep::Wait | EnsureStep::WaitForDeletion => {
                self.api.wait_version_settled(definition, key).await?;
                return Ok(true);
            }
            // A Failed version without a digest may still serve other content.
            EnsureStep::Replace => {
                return Err(self.conflict(req, definition, Some(v), None));
            }
        }
        let verdict = match adopted.as_ref() {
            Some((uri, a)) if *uri == v.source_uri => a.clone(),
            _ => {
                let a = self.prove(adoption, v, content).await?;
                *adopted = Some((v.source_uri.clone(), a.clone()));
                a
            }
        };
        let lock_name = self.lock_name(definition, key);
        let held = self.locks.acquire(&lock_name).await?;
        let target = self.guarded_target(&lock_name, definition, key);
        let r = adopt::record(
            &target,
            held.as_ref(),
            v.source_uri.as_deref(),
            content,
            req.reference.as_deref(),
            req.holder.as_deref(),
        )
        .await;
        held.release().await;
        if r? {
            match &verdict {
                Adopted::Unverified { .. } => {
                    tracing::warn!(definition, version = key, "{}", verdict.describe(&v.id))
                }
                Adopted::ContentMatched { .. } => {
                    tracing::info!(definition, version = key, "{}", verdict.describe(&v.id))
                }
            }
        }
        Ok(false)
    }

    /// Read both sides of the content proof of `v` (a Succeeded version without image_sha256)
    /// and judge them: adopted, or the conflict to answer.
    async fn prove(
        &self,
        adoption: Adoption<'_>,
        v: &ImageVersion,
        content: &Content,
    ) -> Result<Adopted> {
        // A version `migrate` made records its VHD's content digest (`gallery::content`): that
        // is its side of the proof, read from the tags as `image_sha256` would be, without
        // reading a source blob the Azure CPI may have deleted since.
        let recorded = match content {
            Content::Image(_) => tags::get(&v.tags, tags::VHD_CONTENT)
                .map(|d| adopt::SourceContent::Digest(d.trim().to_ascii_lowercase())),
            Content::Vhd(_) => None,
        };
        tracing::info!(
            version = %v.id,
            "version has no {} (made by {}): comparing the content of its {} with this stemcell's VHD",
            content.tag(),
            match content {
                Content::Image(_) => "Azure CPI v52.0.1-v53.0.0, or migrated by stemcell-gallery?",
                Content::Vhd(_) => "an upload",
            },
            if recorded.is_some() { "recorded VHD content digest" } else { "source blob" }
        );
        let source = match (recorded, v.source_uri.as_deref()) {
            (Some(r), _) => r,
            (None, Some(uri)) => adoption.proof.source_digest(uri).await?,
            (None, None) => adopt::SourceContent::Gone,
        };
        // The local side only when the other side was read (it costs a pass over the stemcell).
        let local = match &source {
            adopt::SourceContent::Digest(_) => adoption.proof.local_digest().await?,
            adopt::SourceContent::Gone | adopt::SourceContent::Unreadable(_) => String::new(),
        };
        let verdict = adopt::judge(
            &v.id,
            v.source_uri.as_deref(),
            &local,
            &source,
            adoption.unverified,
        )?;
        tracing::debug!(version = %v.id, content = %content.describe(), "content proof: {verdict:?}");
        Ok(verdict)
    }

    fn conflict(
        &self,
        req: &EnsureRequest,
        definition: &str,
        existing: Option<&ImageVersion>,
        existing_digest: Option<String>,
    ) -> Error {
        let key = &req.stemcell.version_key;
        // Another pipeline may have made the version from a URL carrying a SAS token.
        let existing_source = existing
            .and_then(|v| crate::redact::opt_uri(v.source_uri.as_deref()))
            .unwrap_or_else(|| "unknown".into());
        let existing_mode = existing
            .and_then(|v| v.tags.get(tags::MODE).cloned())
            .unwrap_or_else(|| "not recorded (made by another tool)".into());
        let remedy = match req.mode {
            Mode::Director => format!(
                "if that version was published by `bosh create-env`, publish create-env stemcells with the create-env hint mode (they go to `{definition}{}`); otherwise, once nothing uses it, remove it with `stemcell-gallery delete --name {} --version {}`, or build the stemcell with a new version",
                req.create_env_suffix, req.stemcell.name, req.stemcell.version
            ),
            Mode::CreateEnv => format!(
                "this is a different build of stemcell {} {}; once nothing uses the old one, remove it with `stemcell-gallery delete --create-env --name {} --version {}`",
                req.stemcell.name, req.stemcell.version, req.stemcell.name, req.stemcell.version
            ),
        };
        let what = req.stemcell.content.tag();
        Error::Conflict(format!(
            "gallery version {}/{}/{key} already holds different content: existing {what} {} (source {existing_source}, mode {existing_mode}), this stemcell's {} (source {}). Nothing was changed. Remedy: {remedy}",
            self.gallery.gallery,
            definition,
            existing_digest.as_deref().unwrap_or("absent"),
            req.stemcell.content.describe(),
            if req.source_uri.trim().is_empty() {
                "none: nothing was uploaded".to_string()
            } else {
                crate::redact::uri(&req.source_uri)
            },
        ))
    }
}
