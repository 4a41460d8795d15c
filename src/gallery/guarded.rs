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
//!   right before its write — gathering for a short bounded window first, so that writers
//!   reaching the version a moment after the holder are in its write too (`lock::Gather`) — and
//!   records them all in that one write, then deletes them once verified. A waiter is done
//!   when a fresh read shows its reference. Invariants: an intent is deleted only after the
//!   version was read holding its reference, or when it is dropped on purpose (its reference is
//!   being removed under the lock; its waiter stopped refreshing it, i.e. died, before any holder
//!   claimed it; its waiter withdrew it, which a holder's claim refuses) — so nothing handed over
//!   is lost, and a waiter that gave up or died before its reference was claimed leaves no
//!   reference behind.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use std::collections::BTreeMap;

use super::content::Content;
use super::error::{Error, Result};
use super::latest::users_of;
use super::lifecycle::DeleteNow;
use super::lock::{Ask, Carrying, Claimed, Held, Intent, LockError, Locks, Withdrawal};
use super::model::{Consumer, ImageVersion};
use super::protect;
use super::record::{self, Binding, Loaded, Record, Saved};
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
    /// Kept: Azure refuses its deletion before its end of life (the date, when the version
    /// names one).
    Blocked(Option<time::OffsetDateTime>),
    /// Kept: a management lock this tool does not own applies to it (which, and where).
    Locked(String),
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

/// Where one guarded write happens: a version, its lock and its record.
pub struct Target<'a> {
    pub api: &'a dyn GalleryApi,
    pub locks: &'a dyn Locks,
    pub lock_name: &'a str,
    /// The gallery, by its full identity (the record is bound to it).
    pub gallery: &'a super::GalleryRef,
    pub definition: &'a str,
    pub key: &'a str,
    /// The delete replaces a Failed version: right before its DELETE (after every check), its
    /// references are noted on its record to carry into the version created next
    /// (`record::Record::carried`), so a replacement that never sends its DELETE carries
    /// nothing into a version someone else makes.
    pub carry: bool,
}

impl Target<'_> {
    /// The version the record beside this lock must belong to.
    pub fn binding(&self) -> Binding {
        Binding::new(self.gallery, self.definition, self.key)
    }
}

/// A version as read under its lock: what Azure's tags say, and what its reference record
/// makes of them. Every decision is made on `healed` (see `gallery::record`).
#[derive(Debug, Clone)]
pub struct Observed {
    /// The version as Azure answered (`None`: it does not exist).
    pub raw: Option<ImageVersion>,
    /// The version with its references merged with the record's.
    pub healed: Option<ImageVersion>,
    /// The record as read (both copies), to write over.
    pub loaded: Loaded,
    /// The record, when it applies to the version (recorded for its content; for an absent
    /// version, whatever it holds).
    pub record: Option<Record>,
}

/// Read the version and its record under the lock `held`.
pub async fn observe(t: &Target<'_>, held: &dyn Held) -> Result<Observed> {
    let raw = t.api.get_version(t.definition, t.key, false).await?;
    let loaded = record::load(held.records(), held.name(), &t.binding()).await?;
    let record = loaded.applicable(raw.as_ref());
    let healed = raw.as_ref().map(|v| record::healed(v, record.as_ref()));
    if let (Some(r), Some(h)) = (&raw, &healed) {
        if r.tags != h.tags {
            let (tagged, kept) = (tags::references(&r.tags), tags::references(&h.tags));
            if kept.iter().any(|k| !tagged.contains(k)) {
                tracing::warn!(
                    version = %r.id,
                    "the version's tags lost references its record holds (a tag write that landed late?): deciding on {kept:?}; the next write restores them",
                );
            } else {
                // Tags still carrying a reference the record has removed: a removal recorded
                // before its tag write (as `delete` does before deleting the version), or a
                // late write that brought it back. Either way the record decides; not news.
                tracing::debug!(
                    version = %r.id,
                    "the version's tags still carry references its record removed: deciding on {kept:?}",
                );
            }
        }
    }
    Ok(Observed {
        raw,
        healed,
        loaded,
        record,
    })
}

/// A change to a version's references: what to add (with who holds each) and what to remove.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    pub add: Vec<String>,
    pub remove: Vec<String>,
    /// Who holds each added reference, when known.
    pub holders: BTreeMap<String, String>,
    /// References this tool holds to hand back to plain Azure CPIs: moved into
    /// `stemcell_references` (and out of the record), where a plain CPI finds and removes them.
    pub hand_back: Vec<String>,
}

impl Delta {
    /// Add `reference`, held by `holder`.
    pub fn add(reference: &str, holder: Option<&str>) -> Self {
        let mut d = Delta {
            add: vec![reference.to_string()],
            ..Delta::default()
        };
        if let Some(h) = holder {
            d.holders.insert(reference.to_string(), h.to_string());
        }
        d
    }

    /// Add each of `references` (holders unknown or already recorded).
    pub fn add_all(references: &[String]) -> Self {
        Delta {
            add: references.to_vec(),
            ..Delta::default()
        }
    }

    /// Remove `references`.
    pub fn remove(references: &[String]) -> Self {
        Delta {
            remove: references.to_vec(),
            ..Delta::default()
        }
    }

    /// No change: make Azure's tags hold what the record says (restore what a stale write
    /// erased) and nothing else.
    pub fn none() -> Self {
        Delta::default()
    }

    /// Hand `references` back to plain CPIs (see [`Delta::hand_back`]).
    pub fn hand_back(references: &[String]) -> Self {
        Delta {
            hand_back: references.to_vec(),
            ..Delta::default()
        }
    }

    fn is_empty(&self) -> bool {
        self.add.is_empty() && self.remove.is_empty() && self.hand_back.is_empty()
    }
}

/// Write `next` over the record `loaded` (under the lock `held`, its lease checked first).
/// `false`: another writer changed the record since it was read (nothing written).
pub async fn save_record(held: &dyn Held, loaded: &Loaded, next: Record) -> Result<bool> {
    held.check().await?;
    Ok(matches!(
        record::save(held.records(), loaded, next).await?,
        Saved::Written(_)
    ))
}

/// How long to wait before observing again: Azure's `Retry-After` when it said, else a short
/// exponential backoff.
fn wait_before_retry(e: &Error, attempt: u32) -> Duration {
    if let Some(after) = e.retry_after() {
        return after.min(Duration::from_secs(60));
    }
    crate::backoff::Backoff::new(Duration::from_millis(500), Duration::from_secs(15))
        .ceiling(attempt)
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
    // Decided on the version as its record says it is: a reference a late tag write erased
    // still keeps it.
    let obs = match observe(t, held).await {
        Ok(obs) => obs,
        Err(e) => return Attempt::Done(Err(e)),
    };
    let Some(v) = obs.healed.clone() else {
        return Attempt::Done(Ok(if sent {
            Guarded::Deleted
        } else {
            Guarded::Gone
        }));
    };
    let raw_refs = obs
        .raw
        .as_ref()
        .map(|r| tags::references(&r.tags))
        .unwrap_or_default();
    if v.phase().delete_now() == DeleteNow::AfterItSettles {
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
    // The listing was read after the version: a writer that takes no lock (a plain Azure CPI
    // appending its CID) may have recorded a reference since. The later read decides.
    if let Some(now) = siblings
        .iter()
        .find(|s| s.version.eq_ignore_ascii_case(&v.version))
    {
        let appeared: Vec<String> = tags::references(&now.tags)
            .into_iter()
            .filter(|r| !raw_refs.contains(r))
            .collect();
        if !appeared.is_empty() {
            tracing::info!(version = %v.id, "not deleting: {} recorded meanwhile", appeared.join(", "));
            return Attempt::Done(Ok(Guarded::Changed("references".into())));
        }
        // A replacement carries what the version holds when it goes: a CID a plain CPI
        // removed since the read must not be noted (it would come back on the new version).
        let now_refs = tags::references(&now.tags);
        if t.carry && raw_refs.iter().any(|r| !now_refs.contains(r)) {
            tracing::info!(version = %v.id, "not replacing yet: its references changed meanwhile");
            return Attempt::Done(Ok(Guarded::Changed("references".into())));
        }
    }
    let users = users_of(&v, &listed, &siblings);
    if !users.is_empty() {
        for c in &users {
            tracing::info!(version = %v.id, consumer = %c.id, kind = ?c.kind, "version kept: still in use");
        }
        return Attempt::Done(Ok(Guarded::InUse(users)));
    }
    // After the last re-check: another's lock keeps the version; ours is lifted, and put back
    // if the DELETE does not go through (`gallery::protect`).
    let lifted = match protect::lift_for_delete(t.api, &v).await {
        Ok(protect::Lift::Others(locks)) => {
            tracing::info!(version = %v.id, "version kept: a management lock this tool does not own applies to it: {locks}");
            return Attempt::Done(Ok(Guarded::Locked(locks)));
        }
        Ok(lift) => lift == protect::Lift::Lifted,
        Err(e) => return Attempt::Done(Err(e)),
    };
    let attempt = send_delete(t, held, &obs, &v).await;
    if lifted && !matches!(attempt, Attempt::Done(Ok(Guarded::Deleted))) {
        protect::put_back(t.api, &v).await;
    }
    attempt
}

/// The record note and the DELETE of [`delete_attempt`], once every check has passed.
async fn send_delete(t: &Target<'_>, held: &dyn Held, obs: &Observed, v: &ImageVersion) -> Attempt {
    // The record written right before the DELETE: a replacement's note of what it carries,
    // or, for any other delete, a note to carry left from a life before this one voided (it
    // must not outlive the version). `false`: the record changed meanwhile.
    let noted = if t.carry {
        note_carried(t, held, obs, v).await
    } else if obs.record.is_none() && obs.loaded.notes_carry_past(v) {
        let sha = tags::get(&v.tags, tags::IMAGE_SHA256).map(|s| s.trim().to_ascii_lowercase());
        let fresh = Record::new(&t.binding(), sha.as_deref()).bound_to(v);
        save_record(held, &obs.loaded, fresh).await
    } else {
        Ok(true)
    };
    match noted {
        Ok(true) => {}
        Ok(false) => return Attempt::Done(Ok(Guarded::Changed("reference record".into()))),
        Err(e) => return Attempt::Done(Err(e)),
    }
    if let Err(e) = held.check().await {
        return Attempt::Done(Err(e));
    }
    tracing::info!(version = %v.id, "deleting");
    match t.api.delete_version(t.definition, t.key).await {
        Ok(()) => Attempt::Done(Ok(Guarded::Deleted)),
        Err(Error::DeletionBlocked { .. }) => {
            tracing::info!(version = %v.id, "Azure refuses its deletion before its end of life: kept");
            Attempt::Done(Ok(Guarded::Blocked(v.safety.end_of_life)))
        }
        // A lock this tool could not see (no read permission) or placed since the look.
        Err(Error::ScopeLocked { azure, .. }) => {
            tracing::info!(version = %v.id, "Azure refuses its deletion under a management lock: kept");
            Attempt::Done(Ok(Guarded::Locked(azure.message.clone())))
        }
        Err(e) if e.worth_observing_again() => Attempt::Failed(e),
        Err(e) => Attempt::Done(Err(e)),
    }
}

/// The longest pause between a waiter's looks at its intent and the lock (two blob requests).
const POLL_MAX: Duration = Duration::from_secs(2);

/// What [`acquire_or_hand_over`] got.
pub enum Acquired {
    /// The lock: write yourself.
    Held(Box<dyn Held>),
    /// The reference was recorded by the lock's holder (a fresh read shows it).
    HandedOver,
}

/// Whether the version `v` holds `reference` on `content`: what a hand-over is done on (a
/// version being created counts: its PUT was accepted holding it, and the record before).
pub(super) fn shows(v: &ImageVersion, reference: &str, content: &Content) -> bool {
    content.held_by(&v.tags) && tags::references(&v.tags).iter().any(|r| r == reference)
}

/// Whether a fresh read of the version [`shows`] `ask.reference` on the content it was asked
/// for.
async fn recorded(
    api: &dyn GalleryApi,
    definition: &str,
    key: &str,
    ask: &Ask<'_>,
) -> Result<bool> {
    Ok(api
        .get_version(definition, key, false)
        .await?
        .is_some_and(|v| shows(&v, ask.reference, ask.content)))
}

/// Take the version's lock to add `ask.reference`, or hand the reference to the process holding
/// it (group commit; see the module documentation): to a holder writing the version's
/// references, or, when `ask.to_create`, to the one creating it (its PUT carries the
/// reference). Only a holder whose write is for `ask.content` takes it (`Intent::fits`).
/// Without hand-over support, plain `acquire`. `arrival`: this writer's announcement
/// ([`Handover::arrive`](super::lock::Handover::arrive)), removed once it holds the lock
/// (before it claims, so it does not wait for itself) or has handed its reference over (after
/// posting the intent, so a holder always sees one of them).
pub async fn acquire_or_hand_over(
    api: &dyn GalleryApi,
    locks: &dyn Locks,
    lock_name: &str,
    definition: &str,
    key: &str,
    ask: &Ask<'_>,
    arrival: Option<String>,
) -> Result<Acquired> {
    let reference = ask.reference;
    let Some(ho) = locks.handover() else {
        return Ok(Acquired::Held(locks.acquire(lock_name).await?));
    };
    let tried = ho.try_acquire(lock_name).await;
    if !matches!(tried, Ok(None)) {
        if let Some(a) = &arrival {
            ho.leave(a).await;
        }
    }
    if let Some(h) = tried? {
        return Ok(Acquired::Held(h));
    }
    let posted = ho.post(lock_name, ask).await;
    if let Some(a) = &arrival {
        ho.leave(a).await;
    }
    let id = posted?;
    tracing::info!(
        definition,
        version = key,
        reference,
        "another process holds the version's lock: handed the reference to it, waiting for its write"
    );
    let deadline = Instant::now() + ho.wait();
    let pace = crate::backoff::Backoff::new(Duration::from_millis(250), POLL_MAX);
    let mut step = 0u32;
    loop {
        // Not jittered: a waiter's looks are blob requests (no herd to spread on ARM), and the
        // ledger simulator replays a seed only when every wait is the same each time.
        tokio::time::sleep(pace.ceiling(step)).await;
        step = step.saturating_add(1);
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
        if !ho.refresh(&id, ask).await? {
            if recorded(api, definition, key, ask).await? {
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
                    if recorded(api, definition, key, ask).await? {
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

/// Whether a handed-over intent is one this tool writes: a valid reference, and a valid holder
/// label when it names one. `Ok` gives the holder as the record keeps it.
fn valid_intent(i: &Intent) -> std::result::Result<Option<String>, String> {
    tags::validate_reference(&i.reference)
        .map_err(|e| format!("reference {:?}: {e}", i.reference))?;
    i.holder.as_deref().map(record::holder_label).transpose()
}

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

/// Claim the intents pending on `held` for the write about to be made, gathering a burst of
/// writers as `held` says ([`Gather`](super::lock::Gather)). A holder that finds neither an
/// intent nor a writer arriving writes at once (a lone writer waits nothing). Otherwise it
/// gathers for at least `first`, while announced writers have not handed over yet, and `quiet`
/// longer after each claim that finds new intents; never longer than `max` in all. The windows
/// count from `started`, when the holder began this write: the time its own reads took is time
/// the burst had to arrive. Only intents that fit the write (`carrying`) are claimed. Returns
/// the intents claimed, and whether it waited.
pub(super) async fn gather_intents(
    held: &dyn Held,
    started: Instant,
    carrying: &Carrying<'_>,
) -> Result<(Vec<Intent>, bool)> {
    let Claimed {
        mut intents,
        mut arriving,
    } = held.claim_intents(carrying).await?;
    let Some(g) = held.gather() else {
        return Ok((intents, false));
    };
    if intents.is_empty() && arriving == 0 {
        // Nobody is coming: write at once.
        return Ok((intents, false));
    }
    let limit = started + g.max;
    let mut until = started + g.first;
    if !intents.is_empty() {
        until = until.max(Instant::now() + g.quiet);
    }
    let mut waited = false;
    loop {
        // Writers that announced themselves and have not handed over yet are waited for, up
        // to `max`.
        let end = if arriving > 0 {
            limit
        } else {
            until.min(limit)
        };
        let now = Instant::now();
        if now >= end {
            break;
        }
        tokio::time::sleep(g.step.min(end - now)).await;
        waited = true;
        let more = held.claim_intents(carrying).await?;
        arriving = more.arriving;
        if !more.intents.is_empty() {
            until = until.max(Instant::now() + g.quiet);
            intents.extend(more.intents);
        }
    }
    Ok((intents, waited))
}

/// Apply a reference delta to the version under `held`: read the version and its record, add
/// `delta.add`, remove `delta.remove`, write the record (conditionally) and then the tags, each
/// right after checking the lease, and verify on the next read; repeat until both hold it.
/// Returns the version as last read (`None` when it does not exist: a removal then still
/// applies to the record, which may carry references for a re-create). Also records every
/// reference handed over by writers waiting for the lock (intents claimed right before
/// writing), except one this call removes (a pending add of a reference being removed is
/// dropped, not applied); the intents are deleted once the version is read holding them.
///
/// Built from a fresh read merged with the record, so every reference there now that this call
/// does not remove is written back: one another process recorded is kept, one a late tag write
/// erased is restored, one the Azure CPI removed from `stemcell_references` stays removed. The
/// record is written before the tags, so a reference is durable before any tag write carries it
/// (and before the caller acknowledges it).
pub async fn merge_references(
    t: &Target<'_>,
    held: &dyn Held,
    delta: &Delta,
) -> Result<Option<ImageVersion>> {
    let (definition, key) = (t.definition, t.key);
    let mut last_error: Option<Error> = None;
    let mut delta = delta.clone();
    let mut claimed: Vec<String> = Vec::new();
    let mut collected = false;
    // The life (`publishedDate`) this call last sent a tag write to, and the references of
    // that write it did not add itself.
    let mut wrote: Option<(Option<String>, Vec<String>)> = None;
    let started = Instant::now();
    // Whether the delete lock was settled (`gallery::protect`) before the latest read.
    let mut settled = false;
    // One more read than writes: the last write is verified too.
    for attempt in 0..=ATTEMPTS {
        let mut obs = observe(t, held).await?;
        if !collected && obs.raw.is_some() {
            collected = true;
            claimed = merge::take_handed_over(t, held, started, &mut obs, &mut delta).await?;
        }
        let Some(raw) = obs.raw.clone() else {
            if !delta.remove.is_empty() {
                forget_in_record(t, held, None, &delta.remove).await?;
            }
            return Ok(None);
        };
        let merge::Write {
            want,
            new_tags,
            tags_ok,
            next,
            record_ok,
        } = merge::write_for(t, &obs, &raw, &delta, &wrote)?;
        if tags_ok && record_ok {
            // Verified: the handed-over references are on the version, and in its record.
            // Held means locked: placed (or lifted, when only the CPI's CIDs hold it) under
            // the lock. After this call's own tag write it was settled before the read that
            // verified it; with nothing written, it is settled now and the version read once
            // more, so that no write of another tool (a plain CPI's stale whole-tags PATCH)
            // lands unseen between the verifying read and the return.
            if !settled && attempt < ATTEMPTS {
                settled = true;
                protect::settle(t.api, &raw).await;
                continue;
            }
            if let Err(e) = held.finish_intents(&claimed).await {
                tracing::warn!(definition, version = key, error = %e, "could not delete applied intents; their waiters or the next holder do");
            }
            if !delta.add.is_empty() {
                warn_low_reference_room(&raw);
            }
            return Ok(Some(raw));
        }
        if attempt == ATTEMPTS {
            break;
        }
        // The record first: durable, and fenced (a holder whose view is stale writes nothing).
        if !record_ok && !save_record(held, &obs.loaded, next).await? {
            tracing::info!(
                definition,
                version = key,
                "the reference record changed since it was read; reading again"
            );
            last_error = Some(Error::Record(record::RecordError::Contended {
                blob: record::copy_names(held.name())[0].clone(),
                attempts: attempt + 1,
            }));
            continue;
        }
        if tags_ok {
            continue;
        }
        // Locked before held: a write that makes the version held (its sentinel appears) is
        // preceded by the lock, so a caller interrupted between its write and the settle after
        // it leaves a held version locked (its re-run reuses without writing). A lift waits for
        // the write, as before: unlocked never comes before unheld.
        protect::place_before_hold(t.api, &raw, &new_tags).await;
        // The lease right before the write: a stalled process that lost it writes nothing.
        held.check().await?;
        wrote = Some((
            record::life_of(&raw),
            want.iter()
                .filter(|r| !delta.add.contains(r))
                .cloned()
                .collect(),
        ));
        match t.api.set_version_tags(definition, key, &new_tags).await {
            // Verified by the next round's fresh read, which the lock's settling comes before.
            Ok(written) => {
                settled = true;
                protect::settle(t.api, &written).await;
            }
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

mod carry;
mod forget;
mod merge;
use carry::note_carried;
pub use forget::forget_in_record;
pub use merge::{finish_shown, take_for_create};

#[cfg(test)]
mod gather_tests;
