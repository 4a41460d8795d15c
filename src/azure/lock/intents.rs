//! Intents: references handed to the lock's holder (group commit of reference writes)
//!
//! A writer that finds the lock taken posts `<lock blob>.pending/<uuid>`, an empty block blob
//! whose metadata says `op=add` and `reference=<the reference>`, and keeps waiting. The holder,
//! right before its write, claims every pending intent with a blob lease (renewed while it
//! writes), records them all in its one write, verifies, and deletes the intents with its leases.
//! A waiter withdraws its intent by deleting it without a lease id: Azure refuses to delete a
//! leased blob without its lease id (Delete Blob: 412 `LeaseIdMissing`, "There is currently a
//! lease on the blob and no lease ID was specified in the request."), so a withdrawal can never
//! race a holder that already claimed the intent; it means "claimed: wait for the holder's
//! result". A claim whose holder died expires with its lease.
//!
//! Arrivals (issue 33): a writer about to add a reference to a version that is there announces
//! itself as soon as it has read the version, before it asks for the lock, with `<lock blob>.pending/<uuid>` whose metadata says `op=arrive`, and removes it
//! once it has handed its reference over or taken the lock itself. Writers started together
//! reach the lock tens of milliseconds apart; the holder, seeing others' arrivals in the listing
//! it claims from, keeps gathering until they have handed over (bounded), while a holder that
//! sees nobody arriving writes at once. An arrival carries no reference: it only decides how long
//! a holder gathers, never what is written. Builds before it list only `op=add` and leave
//! arrivals alone.

use std::time::Duration;

use std::collections::HashMap;

use azure_storage_blob::models::{BlockBlobClientUploadOptions, LeaseState};

use super::super::blob::{blob_path, list_blobs, metadata_of, Blob, BlobError, Container};
use super::{acquire, break_now, LeaseGuard, LockError};

/// How long a holder's claim on an intent lasts between renewals (renewed at a third of it).
pub const INTENT_LEASE: Duration = Duration::from_secs(60);

/// A waiting writer refreshes its intent (Set Blob Metadata) at every look, every 2 s at most;
/// an unclaimed intent not refreshed for this long belongs to a writer that died (SIGKILL, a lost
/// host) and is dropped unapplied: its reference was never returned to anyone.
pub const INTENT_LIVENESS: Duration = Duration::from_secs(60);
const META_OP: &str = "op";
const META_REFERENCE: &str = "reference";
/// Who holds the reference (`gallery::record`), when the writer said.
const META_HOLDER: &str = "reference_holder";
/// The content the reference is for (`gallery::content::Content::token`), issue 49.
const META_CONTENT: &str = "content";
/// The life (`publishedDate`) of the version the writer read, issue 49.
const META_LIFE: &str = "life";
const OP_ADD: &str = "add";
/// A reference for a version its writer found absent, handed to the writer creating it (issue
/// 49). An op of its own: builds before it list only `op=add` and so never put such a
/// reference on a version of other content (they do not compare content).
const OP_ADD_TO_NEW: &str = "add-to-new";
const OP_ARRIVE: &str = "arrive";

/// An arrival older than this (on the service's clock) is not waited for: its writer is not
/// one started with the holder (it died, or waits for something else, such as a version to
/// settle). Older than [`INTENT_LIVENESS`], the holder deletes it.
pub const ARRIVAL_LIVENESS: Duration = Duration::from_secs(10);

/// The blob prefix of the intents pending on lock `name`.
pub fn intent_prefix(lock: &str) -> String {
    format!("{lock}.pending/")
}

/// An intent pending next to a lock, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingIntent {
    /// The intent blob's name.
    pub name: String,
    /// The reference it asks to add.
    pub reference: String,
    /// Who holds it, when its writer said.
    pub holder: Option<String>,
    /// The content the reference is for, as its writer named it (`Content::token`); `None` for
    /// an intent of a build before issue 49.
    pub content: Option<String>,
    /// Handed to the writer creating the version (`op=add-to-new`).
    pub to_create: bool,
    /// The life of the version its writer read, when it names one.
    pub life: Option<String>,
    /// How long ago its waiter last refreshed it, on the storage service's clock (Last-Modified
    /// against the listing's `Date`).
    pub age: Duration,
    /// A claim (lease) was on it when listed.
    pub claimed: bool,
}

/// What a waiter's refresh of its intent found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntentState {
    /// Pending, refreshed.
    Pending,
    /// Claimed by a holder (a leased blob cannot be written without the lease: 412).
    Claimed,
    /// Gone: applied and deleted, or dropped.
    Gone,
}

/// What a waiter's withdrawal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    /// Deleted: no holder will apply it.
    Withdrawn,
    /// Already gone (applied and deleted by a holder, or dropped).
    Gone,
    /// A holder claimed it (its lease is on it) and is writing it: wait for its result.
    Claimed,
}

fn storage_error(blob: &Blob, what: &'static str, e: azure_core::Error) -> LockError {
    let path = blob_path(blob);
    LockError::Storage {
        blob: path.clone(),
        source: Box::new(BlobError::request(what, path, e)),
    }
}

/// What an intent asks, as its blob's metadata carries it.
#[derive(Debug, Clone, Copy)]
pub struct IntentAsk<'a> {
    pub reference: &'a str,
    pub holder: Option<&'a str>,
    /// `Content::token` of the content the reference is for.
    pub content: &'a str,
    /// For a version its writer found absent (`op=add-to-new`).
    pub to_create: bool,
    /// The life of the version the writer read.
    pub life: Option<&'a str>,
}

fn intent_metadata(ask: &IntentAsk<'_>) -> HashMap<String, String> {
    let op = if ask.to_create { OP_ADD_TO_NEW } else { OP_ADD };
    let mut m = HashMap::from([
        (META_OP.to_string(), op.to_string()),
        (META_REFERENCE.to_string(), ask.reference.to_string()),
        (META_CONTENT.to_string(), ask.content.to_string()),
    ]);
    if let Some(h) = ask.holder {
        m.insert(META_HOLDER.to_string(), h.to_string());
    }
    if let Some(l) = ask.life {
        m.insert(META_LIFE.to_string(), l.to_string());
    }
    m
}

/// Post an intent asking `ask` next to lock `lock`; returns the intent blob's name.
pub async fn post_intent(
    container: &Container,
    lock: &str,
    ask: &IntentAsk<'_>,
) -> Result<String, LockError> {
    post_marker(container, lock, intent_metadata(ask), "post intent").await
}

/// Announce a writer about to add a reference to the version behind lock `lock` (see the module
/// documentation); returns the arrival blob's name, for [`remove_arrival`].
pub async fn post_arrival(container: &Container, lock: &str) -> Result<String, LockError> {
    let metadata = HashMap::from([(META_OP.to_string(), OP_ARRIVE.to_string())]);
    post_marker(container, lock, metadata, "announce arrival").await
}

/// Write an empty blob with `metadata` under lock `lock`'s intent prefix; returns its name.
async fn post_marker(
    container: &Container,
    lock: &str,
    metadata: HashMap<String, String>,
    what: &'static str,
) -> Result<String, LockError> {
    let name = format!("{}{}", intent_prefix(lock), uuid::Uuid::new_v4());
    let blob = container.blob_client(&name);
    blob.block_blob()
        .upload(
            bytes::Bytes::new().into(),
            Some(BlockBlobClientUploadOptions {
                metadata: Some(metadata),
                ..Default::default()
            }),
        )
        .await
        .map_err(|e| storage_error(&blob, what, e))?;
    Ok(name)
}

/// Remove the arrival blob `name` (already gone is fine).
pub async fn remove_arrival(container: &Container, name: &str) -> Result<(), LockError> {
    match withdraw_intent(container, name).await? {
        // Nobody leases an arrival; a lease on it would be a bug elsewhere: it simply ages out.
        Withdrawal::Withdrawn | Withdrawal::Gone | Withdrawal::Claimed => Ok(()),
    }
}

/// Refresh the intent blob `name` (asking `ask`), to show its waiter is alive.
pub async fn refresh_intent(
    container: &Container,
    name: &str,
    ask: &IntentAsk<'_>,
) -> Result<IntentState, LockError> {
    let blob = container.blob_client(name);
    match blob
        .client()
        .set_metadata(&intent_metadata(ask), None)
        .await
    {
        Ok(_) => Ok(IntentState::Pending),
        Err(e) => {
            let err = BlobError::request("refresh intent", blob_path(&blob), e);
            match err.status() {
                Some(404) => Ok(IntentState::Gone),
                Some(412) => Ok(IntentState::Claimed),
                _ => Err(LockError::Storage {
                    blob: blob_path(&blob),
                    source: Box::new(err),
                }),
            }
        }
    }
}

/// Withdraw the intent blob `name` (a waiter, without the lock): delete it unless claimed.
pub async fn withdraw_intent(container: &Container, name: &str) -> Result<Withdrawal, LockError> {
    let blob = container.blob_client(name);
    match blob.client().delete(None).await {
        Ok(_) => Ok(Withdrawal::Withdrawn),
        Err(e) => {
            let err = BlobError::request("withdraw intent", blob_path(&blob), e);
            match err.status() {
                Some(404) => Ok(Withdrawal::Gone),
                Some(412) => Ok(Withdrawal::Claimed),
                _ => Err(LockError::Storage {
                    blob: blob_path(&blob),
                    source: Box::new(err),
                }),
            }
        }
    }
}

/// An arrival next to a lock, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// The arrival blob's name.
    pub name: String,
    /// How long ago it was posted, on the service's clock.
    pub age: Duration,
}

/// What is pending next to a lock: intents (oldest first) and arrivals.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    pub intents: Vec<PendingIntent>,
    pub arrivals: Vec<Arrival>,
}

/// The intents pending on lock `lock`, oldest first. Intents of an unknown `op` (a newer tool)
/// are left out and left alone.
pub async fn list_intents(
    container: &Container,
    lock: &str,
) -> Result<Vec<PendingIntent>, LockError> {
    Ok(list_pending(container, lock).await?.intents)
}

/// The intents and the arrivals pending on lock `lock` (one listing).
pub async fn list_pending(container: &Container, lock: &str) -> Result<Pending, LockError> {
    let pages = match list_blobs(container, &intent_prefix(lock)).await {
        Ok(pages) => pages,
        Err(err) if err.is_not_found() => return Ok(Pending::default()),
        Err(err) => {
            return Err(LockError::Storage {
                blob: lock.to_string(),
                source: Box::new(err),
            })
        }
    };
    let mut out = Vec::new();
    let mut arrivals = Vec::new();
    for (date, items) in pages {
        // Ages are on the service's clock: the listing's `Date` against each Last-Modified.
        let now = date.unwrap_or_else(time::OffsetDateTime::now_utc);
        for b in items {
            let meta = metadata_of(&b);
            let (Some(name), Some(props)) = (b.name.clone(), b.properties.as_ref()) else {
                continue;
            };
            let last_modified = props.last_modified.unwrap_or(now);
            let age = (now - last_modified).max(time::Duration::ZERO);
            let to_create = match meta.get(META_OP).map(String::as_str) {
                Some(OP_ADD) => false,
                Some(OP_ADD_TO_NEW) => true,
                Some(OP_ARRIVE) => {
                    arrivals.push(Arrival {
                        name,
                        age: age.try_into().unwrap_or_default(),
                    });
                    continue;
                }
                _ => continue,
            };
            let Some(reference) = meta.get(META_REFERENCE).cloned() else {
                continue;
            };
            let content = meta.get(META_CONTENT).cloned();
            if to_create && content.is_none() {
                // A hand-over to a create names its content, always: not one of ours.
                continue;
            }
            let claimed = matches!(
                props.lease_state,
                Some(LeaseState::Leased | LeaseState::Breaking)
            );
            out.push(PendingIntent {
                name,
                reference,
                holder: meta.get(META_HOLDER).cloned(),
                content,
                to_create,
                life: meta.get(META_LIFE).cloned(),
                age: age.try_into().unwrap_or_default(),
                claimed,
            });
        }
    }
    out.sort_by_key(|i| std::cmp::Reverse(i.age));
    Ok(Pending {
        intents: out,
        arrivals,
    })
}

/// An intent claimed by the lock's holder: its lease is renewed until [`Claim::finish`] deletes
/// it (or the claim is dropped and the lease released).
#[derive(Debug)]
pub struct Claim {
    pub intent: PendingIntent,
    guard: LeaseGuard,
}

impl Claim {
    /// Renew the claim now (right before the write that records it): `Err` when it was lost.
    pub async fn renew(&self) -> Result<(), LockError> {
        self.guard.renew_now().await
    }

    /// Delete the claimed intent (applied, or dropped) with the claim's lease.
    pub async fn finish(self) -> Result<(), LockError> {
        self.guard.delete_leased().await
    }
}

/// Lease an intent blob for a claim, taking over a stale claim (the caller holds the lock).
/// `None` when the intent is gone.
async fn claim(blob: &Blob) -> Result<Option<LeaseGuard>, LockError> {
    let path = blob_path(blob);
    for _ in 0..3 {
        match acquire(blob, INTENT_LEASE, None).await {
            Ok(lease_id) => {
                return Ok(Some(LeaseGuard::new(
                    blob.clone(),
                    lease_id,
                    INTENT_LEASE,
                    path,
                )))
            }
            Err(err) => match err.status() {
                Some(404) => return Ok(None),
                Some(409) => break_claim(blob).await?,
                _ => {
                    return Err(LockError::Storage {
                        blob: path,
                        source: Box::new(err),
                    })
                }
            },
        }
    }
    Err(LockError::Lost { blob: path })
}

/// Break a claim on an intent at once.
async fn break_claim(blob: &Blob) -> Result<(), LockError> {
    match break_now(blob).await {
        Ok(_) => Ok(()),
        Err(e) => {
            let err = BlobError::request("break claim on", blob_path(blob), e);
            if matches!(err.status(), Some(404) | Some(409)) {
                Ok(())
            } else {
                Err(LockError::Storage {
                    blob: blob_path(blob),
                    source: Box::new(err),
                })
            }
        }
    }
}

impl LeaseGuard {
    /// Claim every intent pending on this lock with a lease of its own. The caller holds the
    /// lock, so a claim still on an intent belongs to a holder that lost the lock: it is broken
    /// and taken over (its waiter was alive when it was claimed). An unclaimed intent not
    /// refreshed for `max_age` is deleted unapplied (its waiter died: nobody holds that
    /// reference). An intent withdrawn meanwhile is skipped, and so are those named in `have`
    /// (claimed already).
    pub async fn claim_intents(
        &self,
        max_age: Duration,
        have: &[String],
    ) -> Result<Vec<Claim>, LockError> {
        Ok(self.claim_pending(max_age, have, &|_| true).await?.0)
    }

    /// [`LeaseGuard::claim_intents`] of the intents `fits` accepts (the others are left
    /// pending, unless they are stale), and how many writers announced their arrival (within
    /// [`ARRIVAL_LIVENESS`]) without having handed over yet, from the same listing. Arrivals
    /// older than `max_age` are deleted (their writers died).
    pub async fn claim_pending(
        &self,
        max_age: Duration,
        have: &[String],
        fits: &(dyn Fn(&PendingIntent) -> bool + Sync),
    ) -> Result<(Vec<Claim>, usize), LockError> {
        self.renew_now().await?;
        let container = self.blob.container_client();
        let lock = self.blob.blob_name().to_string();
        let pending = list_pending(container, &lock).await?;
        let mut arriving = 0;
        for a in pending.arrivals {
            if a.age <= ARRIVAL_LIVENESS {
                arriving += 1;
            } else if a.age > max_age {
                remove_arrival(container, &a.name).await?;
            }
        }
        let mut claims = Vec::new();
        for intent in pending.intents {
            if have.contains(&intent.name) {
                continue;
            }
            let blob = container.blob_client(&intent.name);
            if !intent.claimed && intent.age > max_age {
                tracing::info!(intent = %intent.name, reference = %intent.reference, age = ?intent.age, "dropping an intent its writer stopped refreshing (it died)");
                self.delete_intent(&blob).await?;
                continue;
            }
            if !fits(&intent) {
                // For other content (or a kind of write this one is not): its writer decides
                // for itself once it holds the lock.
                continue;
            }
            if let Some(guard) = claim(&blob).await? {
                claims.push(Claim { intent, guard });
            }
        }
        Ok((claims, arriving))
    }

    /// Delete the pending intents to add `reference` (it is being removed: a pending add must not
    /// bring it back). The caller holds the lock.
    pub async fn drop_intents_of(&self, reference: &str) -> Result<(), LockError> {
        let container = self.blob.container_client();
        let lock = self.blob.blob_name().to_string();
        for intent in list_intents(container, &lock).await? {
            if intent.reference == reference {
                tracing::info!(intent = %intent.name, reference, "dropping a pending add of a reference being removed");
                self.delete_intent(&container.blob_client(&intent.name))
                    .await?;
            }
        }
        Ok(())
    }

    /// Delete the intent blob `name` (the caller's own, now that it holds the lock).
    pub async fn discard_intent(&self, name: &str) -> Result<(), LockError> {
        let blob = self.blob.container_client().blob_client(name);
        self.delete_intent(&blob).await
    }

    /// Delete an intent under the lock, breaking a stale claim on it if there is one.
    async fn delete_intent(&self, blob: &Blob) -> Result<(), LockError> {
        for _ in 0..3 {
            match withdraw_intent(self.blob.container_client(), blob.blob_name()).await? {
                Withdrawal::Withdrawn | Withdrawal::Gone => return Ok(()),
                Withdrawal::Claimed => break_claim(blob).await?,
            }
        }
        Err(LockError::Lost {
            blob: blob_path(blob),
        })
    }
}
