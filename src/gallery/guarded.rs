//! The two writes that can lose something, done one way by every caller:
//!
//! - [`delete_guarded`]: every DELETE of a version (cleanup, `delete`, `delete_stemcell`,
//!   replacing a Failed version, undoing a failed create) happens under the version's lock, right
//!   after re-reading the version and re-checking its consumers, and is sent once: after a
//!   retryable failure (429, 5xx, timeout, dropped connection) the lock is released for the wait
//!   (a writer may record a reference meanwhile), taken again, and the version read and checked
//!   again before another DELETE is sent.
//! - [`merge_references`]: every write of the reference tags re-reads the version, applies this
//!   call's delta (add ours, remove only what this call removes) to what is there now, checks the
//!   lease right before the write, verifies after it, and repeats (bounded) until the version holds
//!   every reference this call wanted and every one it did not remove. Tag PATCHes replace the
//!   whole tag set and gallery image versions offer no ETag / If-Match (see `azure::arm`
//!   `set_version_tags`), so the merge is what keeps concurrent writers from erasing each other.
//! - [`acquire_or_hand_over`]: group commit. A version write takes minutes in Azure (a tags-only
//!   PATCH 2.5 min, REFERENCE.md "Durations"), so writers adding a reference do not queue one
//!   write each behind the lock: one that finds the lock taken posts its reference as an intent
//!   next to the lock and waits; [`merge_references`] (the holder) claims the pending intents
//!   right before its write and records them all in that one write, then deletes them once
//!   verified. A waiter is done when a fresh read shows its reference. Invariants: an intent is
//!   deleted only after the version was read holding its reference, or when it is dropped on
//!   purpose (its reference is being removed under the lock; its waiter stopped refreshing it,
//!   i.e. died, before any holder claimed it; its waiter withdrew it, which a holder's claim
//!   refuses) — so nothing handed over is lost, and a waiter that gave up or died before its
//!   reference was claimed leaves no reference behind.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::error::{Error, Result};
use super::lock::{Held, LockError, Locks, Withdrawal};
use super::model::{Consumer, ImageVersion, ProvisioningState};
use super::service::users_of;
use super::tags;
use super::GalleryApi;

/// Attempts at one delete or one reference write before giving up (the waits between them honour
/// `Retry-After`, else 0.5 s, 1 s, 2 s).
pub const ATTEMPTS: u32 = 4;

/// What a guarded delete did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Guarded {
    /// The version is gone, by this call's DELETE.
    Deleted,
    /// The version was already gone when read.
    Gone,
    /// Kept: it changed since the caller decided (what changed).
    Changed(String),
    /// Kept: these consumers use it.
    InUse(Vec<Consumer>),
    /// Kept: the identity cannot see every consumer, so non-use is unproven (why).
    Unproven(String),
}

/// Consumer lists fresh enough for a delete under a lock: listed after the lock was taken.
#[async_trait::async_trait]
pub trait ConsumerView: Send + Sync {
    async fn consumers_since(&self, since: Instant) -> Result<Arc<Vec<Consumer>>>;
}

/// Lists the consumers again for every delete.
pub struct ScanEachTime(pub Arc<dyn GalleryApi>);

#[async_trait::async_trait]
impl ConsumerView for ScanEachTime {
    async fn consumers_since(&self, _since: Instant) -> Result<Arc<Vec<Consumer>>> {
        Ok(Arc::new(self.0.list_consumers().await?))
    }
}

/// One scan shared by concurrent deletes: a scan that started after a delete's lock was taken
/// serves that delete; otherwise a new one is made. (Cleanup of thousands of versions does not
/// list every VM thousands of times, and no delete trusts a list older than its lock.)
pub struct SharedScan {
    api: Arc<dyn GalleryApi>,
    last: tokio::sync::Mutex<Option<(Instant, Arc<Vec<Consumer>>)>>,
}

impl SharedScan {
    pub fn new(api: Arc<dyn GalleryApi>) -> Self {
        Self {
            api,
            last: tokio::sync::Mutex::new(None),
        }
    }
}

#[async_trait::async_trait]
impl ConsumerView for SharedScan {
    async fn consumers_since(&self, since: Instant) -> Result<Arc<Vec<Consumer>>> {
        let mut last = self.last.lock().await;
        if let Some((at, list)) = last.as_ref() {
            if *at >= since {
                return Ok(list.clone());
            }
        }
        let started = Instant::now();
        let list = Arc::new(self.api.list_consumers().await?);
        *last = Some((started, list.clone()));
        Ok(list)
    }
}

/// A reason to keep the version as now read, or `None` to go on deleting it.
pub type KeepIf<'a> = &'a (dyn Fn(&ImageVersion) -> Option<String> + Send + Sync);

/// Where one guarded delete happens.
pub struct Target<'a> {
    pub api: &'a dyn GalleryApi,
    pub locks: &'a dyn Locks,
    pub lock_name: &'a str,
    pub definition: &'a str,
    pub key: &'a str,
}

/// How long to wait before observing again: Azure's `Retry-After` when it said, else a short
/// exponential backoff.
fn wait_before_retry(e: &Error, attempt: u32) -> Duration {
    if let Some(after) = e.retry_after() {
        return after.min(Duration::from_secs(60));
    }
    Duration::from_millis(500u64.saturating_mul(1 << attempt.min(6))).min(Duration::from_secs(15))
}

/// Delete the version under its lock, `held` (taken at `locked_at`; released before returning).
/// Every attempt re-reads the version, asks `keep_if`, re-checks consumers listed after the lock
/// was taken, checks the lease, and only then sends one DELETE.
pub async fn delete_guarded(
    t: &Target<'_>,
    held: Box<dyn Held>,
    locked_at: Instant,
    consumers: &dyn ConsumerView,
    keep_if: KeepIf<'_>,
) -> Result<Guarded> {
    let mut held = Some(held);
    let mut locked_at = locked_at;
    let mut sent = false;
    let mut last_error: Option<Error> = None;
    for attempt in 0..ATTEMPTS {
        let h = match held.take() {
            Some(h) => h,
            None => {
                let h = t.locks.acquire(t.lock_name).await?;
                locked_at = Instant::now();
                h
            }
        };
        let step = delete_attempt(t, h.as_ref(), locked_at, consumers, keep_if, sent).await;
        match step {
            Attempt::Done(r) => {
                h.release().await;
                return r;
            }
            Attempt::Settling => {
                // A DELETE is under way (ours, whose answer was lost, or someone else's):
                // follow it without holding the lock, then look again.
                h.release().await;
                if t.api
                    .wait_version_settled(t.definition, t.key)
                    .await?
                    .is_none()
                {
                    return Ok(if sent {
                        Guarded::Deleted
                    } else {
                        Guarded::Gone
                    });
                }
            }
            Attempt::Failed(e) => {
                sent = true;
                h.release().await;
                let wait = wait_before_retry(&e, attempt);
                tracing::info!(
                    definition = t.definition,
                    version = t.key,
                    error = %e,
                    ?wait,
                    "delete not confirmed; the version is read again under the lock before any other DELETE"
                );
                last_error = Some(e);
                tokio::time::sleep(wait).await;
            }
        }
    }
    Err(last_error.unwrap_or_else(|| Error::DeleteUnsettled {
        definition: t.definition.to_string(),
        key: t.key.to_string(),
    }))
}

enum Attempt {
    Done(Result<Guarded>),
    Settling,
    Failed(Error),
}

async fn delete_attempt(
    t: &Target<'_>,
    held: &dyn Held,
    locked_at: Instant,
    consumers: &dyn ConsumerView,
    keep_if: KeepIf<'_>,
    sent: bool,
) -> Attempt {
    let v = match t.api.get_version(t.definition, t.key, false).await {
        Ok(Some(v)) => v,
        Ok(None) => {
            return Attempt::Done(Ok(if sent {
                Guarded::Deleted
            } else {
                Guarded::Gone
            }))
        }
        Err(e) => return Attempt::Done(Err(e)),
    };
    if v.provisioning_state == ProvisioningState::Deleting {
        return Attempt::Settling;
    }
    if let Some(why) = keep_if(&v) {
        tracing::info!(version = %v.id, "not deleting: {why} changed since it was decided");
        return Attempt::Done(Ok(Guarded::Changed(why)));
    }
    let listed = match consumers.consumers_since(locked_at).await {
        Ok(c) => c,
        Err(e @ Error::PartialView { .. }) => {
            tracing::warn!(version = %v.id, "not deleting: {e}");
            return Attempt::Done(Ok(Guarded::Unproven(e.to_string())));
        }
        Err(e) => return Attempt::Done(Err(e)),
    };
    let siblings = match t.api.list_versions(t.definition).await {
        Ok(s) => s,
        Err(e) => return Attempt::Done(Err(e)),
    };
    let users = users_of(&v, &listed, &siblings);
    if !users.is_empty() {
        for c in &users {
            tracing::info!(version = %v.id, consumer = %c.id, kind = ?c.kind, "version kept: still in use");
        }
        return Attempt::Done(Ok(Guarded::InUse(users)));
    }
    if let Err(e) = held.check().await {
        return Attempt::Done(Err(e));
    }
    tracing::info!(version = %v.id, "deleting");
    match t.api.delete_version(t.definition, t.key).await {
        Ok(()) => Attempt::Done(Ok(Guarded::Deleted)),
        Err(e) if e.worth_observing_again() => Attempt::Failed(e),
        Err(e) => Attempt::Done(Err(e)),
    }
}

/// How long a holder that found references handed over waits for more before writing.
const GATHER: Duration = Duration::from_millis(500);

/// The longest pause between a waiter's looks at its intent and the lock (two blob requests).
const POLL_MAX: Duration = Duration::from_secs(2);

/// What [`acquire_or_hand_over`] got.
pub enum Acquired {
    /// The lock: write yourself.
    Held(Box<dyn Held>),
    /// The reference was recorded by the lock's holder (a fresh read shows it).
    HandedOver,
}

/// Whether a fresh read of the version shows `reference`.
async fn recorded(
    api: &dyn GalleryApi,
    definition: &str,
    key: &str,
    reference: &str,
) -> Result<bool> {
    Ok(api
        .get_version(definition, key, false)
        .await?
        .is_some_and(|v| tags::references(&v.tags).iter().any(|r| r == reference)))
}

/// Take the version's lock to add `reference`, or hand the reference to the process holding it
/// (group commit; see the module documentation). Without hand-over support, plain `acquire`.
pub async fn acquire_or_hand_over(
    api: &dyn GalleryApi,
    locks: &dyn Locks,
    lock_name: &str,
    definition: &str,
    key: &str,
    reference: &str,
) -> Result<Acquired> {
    let Some(ho) = locks.handover() else {
        return Ok(Acquired::Held(locks.acquire(lock_name).await?));
    };
    if let Some(h) = ho.try_acquire(lock_name).await? {
        return Ok(Acquired::Held(h));
    }
    let id = ho.post(lock_name, reference).await?;
    tracing::info!(
        definition,
        version = key,
        reference,
        "another process holds the version's lock: handed the reference to it, waiting for its write"
    );
    let deadline = Instant::now() + ho.wait();
    let mut delay = Duration::from_millis(250);
    loop {
        let jittered = delay.mul_f64(rand::Rng::gen_range(&mut rand::thread_rng(), 0.5..=1.0));
        tokio::time::sleep(jittered).await;
        delay = (delay * 2).min(POLL_MAX);
        if let Some(h) = ho.try_acquire(lock_name).await? {
            // Writing ourselves now: take our intent back (breaking a claim of a holder that
            // lost the lock). The write re-reads the version first.
            if let Err(e) = h.discard_intent(&id).await {
                h.release().await;
                return Err(e);
            }
            return Ok(Acquired::Held(h));
        }
        let expired = Instant::now() >= deadline;
        // Polled on the intent (a blob request, which also shows we are alive), not on the
        // version (an ARM read, throttled per subscription): a holder deletes an intent only
        // after reading its reference back.
        if !ho.refresh(&id, reference).await? {
            if recorded(api, definition, key, reference).await? {
                tracing::info!(
                    definition,
                    version = key,
                    reference,
                    "reference recorded by the lock's holder"
                );
                return Ok(Acquired::HandedOver);
            }
            if expired {
                return Err(gave_up(lock_name, ho.wait()));
            }
            // Dropped unrecorded by a holder: the reference is being removed (a removal drops
            // pending adds of it, so that it is not brought back), or this process stalled so
            // long its intent looked dead — not handed over again.
            return Err(LockError::ReferenceDropped {
                reference: reference.to_string(),
                definition: definition.to_string(),
                key: key.to_string(),
            }
            .into());
        }
        if expired {
            match ho.withdraw(&id).await? {
                Withdrawal::Withdrawn | Withdrawal::Gone => {
                    // A holder that wrote it and died before deleting it: recorded after all.
                    if recorded(api, definition, key, reference).await? {
                        return Ok(Acquired::HandedOver);
                    }
                    return Err(gave_up(lock_name, ho.wait()));
                }
                // A holder is writing it: its result decides, not our clock.
                Withdrawal::Claimed => {
                    tracing::info!(
                        definition,
                        version = key,
                        reference,
                        "lock wait over, but the holder claimed the reference: waiting for its write"
                    );
                }
            }
        }
    }
}

fn gave_up(lock_name: &str, waited: Duration) -> Error {
    LockError::HandoverTimedOut {
        lock: lock_name.to_string(),
        waited,
    }
    .into()
}

/// Apply a reference delta to the version under `held`: re-read, add `add`, remove `remove`,
/// check the lease, write, verify; repeat until it holds. Returns the version as last read
/// (`None` when it does not exist). Also records every reference handed over by writers waiting
/// for the lock (intents claimed right before writing), except one this call removes (a pending
/// add of a reference being removed is dropped, not applied); the intents are deleted once the
/// version is read holding them.
/// Warn, long before Azure's 50-tag limit stops a reference write, when a version has room for
/// fewer than [`tags::REFERENCE_ROOM_WARNING`] more stemcell CIDs.
pub fn warn_low_reference_room(v: &ImageVersion) {
    let room = tags::reference_room(&v.tags);
    if room < tags::REFERENCE_ROOM_WARNING {
        tracing::warn!(
            version = %v.id,
            room,
            "version {} has room for only {room} more stemcell references (Azure allows 50 tags); remove references no director or create-env holds any more with `references prune` (or `delete --reference`)",
            v.id
        );
    }
}

pub async fn merge_references(
    api: &dyn GalleryApi,
    held: &dyn Held,
    definition: &str,
    key: &str,
    add: &[String],
    remove: &[String],
) -> Result<Option<ImageVersion>> {
    let mut last_error: Option<Error> = None;
    let mut add: Vec<String> = add.to_vec();
    let mut claimed: Vec<String> = Vec::new();
    let mut collected = false;
    // One more read than writes: the last write is verified too.
    for attempt in 0..=ATTEMPTS {
        let Some(v) = api.get_version(definition, key, false).await? else {
            return Ok(None);
        };
        if !collected {
            collected = true;
            let mut intents = held.claim_intents().await?;
            if !intents.is_empty() {
                // Writers are queueing on this version: give the ones arriving right now (woken
                // by the same state change) a moment to hand over too; a write takes minutes.
                tokio::time::sleep(GATHER).await;
                intents.extend(held.claim_intents().await?);
            }
            let mut dropped = Vec::new();
            for i in intents {
                if remove.contains(&i.reference) {
                    dropped.push(i.id);
                    continue;
                }
                if !add.contains(&i.reference) {
                    add.push(i.reference.clone());
                }
                claimed.push(i.id);
            }
            held.finish_intents(&dropped).await?;
            if !claimed.is_empty() {
                tracing::info!(
                    definition,
                    version = key,
                    handed_over = claimed.len(),
                    "recording the references handed over by waiting writers in this write"
                );
            }
        }
        // Built from this fresh read, so every reference there now that this call does not
        // remove is written back (a reference another process recorded is kept; one the Azure
        // CPI removed stays removed).
        let current = tags::references(&v.tags);
        let missing = add.iter().any(|r| !current.contains(r));
        let extra = current.iter().any(|r| remove.contains(r));
        let sentinel = tags::sentinel(definition, key);
        // Earlier formats (our old `stemcell_name`, `sg_refs_NN`, a phantom entry) are rewritten
        // by the first reference write that meets them, even when the references are right.
        let untidy =
            (!add.is_empty() || !remove.is_empty()) && tags::needs_rewrite(&v.tags, &sentinel);
        if !missing && !extra && !untidy {
            // Verified: the handed-over references are on the version.
            if let Err(e) = held.finish_intents(&claimed).await {
                tracing::warn!(definition, version = key, error = %e, "could not delete applied intents; their waiters or the next holder do");
            }
            if !add.is_empty() {
                warn_low_reference_room(&v);
            }
            return Ok(Some(v));
        }
        if attempt == ATTEMPTS {
            break;
        }
        let mut want: Vec<String> = current
            .iter()
            .filter(|r| !remove.contains(r))
            .cloned()
            .collect();
        for r in &add {
            if !want.contains(r) {
                want.push(r.clone());
            }
        }
        let new_tags =
            tags::with_references(&v.tags, &want, &sentinel).map_err(|e| Error::VersionTags {
                resource: v.id.clone(),
                source_error: e,
            })?;
        // The lease right before the write: a stalled process that lost it writes nothing.
        held.check().await?;
        match api.set_version_tags(definition, key, &new_tags).await {
            // Verified by the next round's fresh read.
            Ok(_) => {}
            Err(e) if e.worth_observing_again() => {
                let wait = wait_before_retry(&e, attempt);
                tracing::info!(definition, version = key, error = %e, ?wait, "reference write not confirmed; reading the version again before another");
                last_error = Some(e);
                tokio::time::sleep(wait).await;
            }
            Err(e) => return Err(e),
        }
    }
    Err(last_error.unwrap_or_else(|| Error::ReferencesUnsettled {
        definition: definition.to_string(),
        key: key.to_string(),
        attempts: ATTEMPTS,
    }))
}
