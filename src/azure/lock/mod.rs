//! A cross-host lock: a blob lease on a small lock blob in the configured storage account.
//!
//! Several hosts may ensure or seed the same gallery version at once; a local file lock (what the
//! Azure CPI uses) does not see the others. [`LeaseLock::acquire`] creates the lock blob if needed,
//! takes a lease on it (retrying with jittered backoff while another holder has it, up to a bounded
//! wait), and renews it in the background at a third of its duration while the [`LeaseGuard`] is
//! alive. [`LeaseGuard::release`] gives it back; dropping the guard releases it on a best-effort
//! basis; a holder that dies without releasing loses the lease when it expires (30 s by default).
//!
//! The lock serialises *work*, it does not fence it: a holder that stalls longer than the lease
//! (a paused VM) can lose it while still acting. So callers verify after writing (read the
//! version back), as DESIGN.md §4 asks, and can ask [`LeaseGuard::check`] before each write.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use azure_core::http::{ClientMethodOptions, Context, Etag};
use azure_storage_blob::models::{
    BlobClientAcquireLeaseOptions, BlobClientAcquireLeaseResultHeaders,
    BlobClientBreakLeaseOptions, BlobClientDeleteOptions, BlobClientGetPropertiesResultHeaders,
    BlobClientSetMetadataOptions, BlockBlobClientUploadOptions, LeaseState,
};

use super::blob::retry::RetryBudget;
use super::blob::{blob_path, ensure_container, Blob, BlobError, Container};
use crate::error::{Class, Classified};

mod intents;

pub use intents::{
    intent_prefix, list_intents, list_pending, post_arrival, post_intent, refresh_intent,
    remove_arrival, withdraw_intent, Arrival, Claim, IntentAsk, IntentState, Pending,
    PendingIntent, Withdrawal, ARRIVAL_LIVENESS, INTENT_LEASE, INTENT_LIVENESS,
};

/// The lease duration used by [`LeaseLock::acquire`].
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Why a lock could not be taken or kept.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("timed out after {waited:?} waiting for the lock {blob}: another process holds its lease. \
             Wait for it to finish and re-run (the wait for a lock is fixed); if its holder crashed the lease \
             expires within {lease:?} by itself (to force it: `az storage blob lease break` on that blob)")]
    Timeout {
        blob: String,
        waited: Duration,
        lease: Duration,
    },
    #[error(
        "lost the lock {blob}: its lease could not be renewed (another process may now hold it); \
             stop, re-read the state and re-run"
    )]
    Lost { blob: String },
    #[error("the carried-references note {blob} is unreadable: {message}; repair or delete it (it lists the references of a replaced Failed version, to be recorded on its replacement)")]
    Note { blob: String, message: String },
    #[error("invalid lease duration {0:?}: Azure accepts 15 to 60 seconds")]
    InvalidLease(Duration),
    #[error("lock {blob}")]
    Storage {
        blob: String,
        #[source]
        source: Box<BlobError>,
    },
    /// The container that holds the lock blobs could not be made ready.
    #[error("cannot prepare the lock container")]
    Container {
        #[source]
        source: Box<BlobError>,
    },
}

/// Worth retrying later: a timeout; a storage failure is the storage error's to classify.
impl Classified for LockError {
    fn class(&self) -> Class {
        match self {
            LockError::Timeout { .. } => Class::Later,
            LockError::Lost { .. } | LockError::InvalidLease(_) | LockError::Note { .. } => {
                Class::Permanent
            }
            LockError::Storage { source, .. } | LockError::Container { source } => source.class(),
        }
    }
}

impl crate::gallery::lock::LockStoreError for LockError {}

/// The blob-lease lock's failure as the gallery domain's: kept typed, with its own verdict on
/// retrying (a 403 on the lock container must not reach BOSH as `ok_to_retry: true`).
impl From<LockError> for crate::gallery::Error {
    fn from(e: LockError) -> Self {
        crate::gallery::Error::Lock(crate::gallery::lock::LockError::Store(Box::new(e)))
    }
}

/// Entry point of the cross-host lock.
pub struct LeaseLock;

impl LeaseLock {
    /// Take the lock `name` (a blob in `container`), waiting up to `wait` for another holder,
    /// with the default 30 s lease.
    pub async fn acquire(
        container: &Container,
        name: &str,
        wait: Duration,
    ) -> Result<LeaseGuard, LockError> {
        Self::acquire_with_lease(container, name, wait, DEFAULT_LEASE).await
    }

    /// As [`LeaseLock::acquire`] with an explicit lease duration (15–60 s).
    pub async fn acquire_with_lease(
        container: &Container,
        name: &str,
        wait: Duration,
        lease: Duration,
    ) -> Result<LeaseGuard, LockError> {
        if !(15..=60).contains(&lease.as_secs()) || lease.subsec_nanos() != 0 {
            return Err(LockError::InvalidLease(lease));
        }
        let blob = container.blob_client(name);
        let path = blob_path(&blob);
        let storage = |source: BlobError| LockError::Storage {
            blob: path.clone(),
            source: Box::new(source),
        };
        let deadline = tokio::time::Instant::now() + wait;
        let pace = crate::backoff::Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
        let mut step = 0u32;
        let mut created = false;
        // Our own lease id, proposed on every attempt: if an acquire succeeded on the service but
        // its response was lost (and the pipeline retried), re-acquiring with the same id succeeds
        // instead of waiting a whole lease for ourselves.
        let proposed = uuid::Uuid::new_v4().to_string();
        loop {
            match acquire(&blob, lease, Some(&proposed)).await {
                Ok(lease_id) => {
                    tracing::debug!(lock = %path, "lock acquired");
                    record_holder(&blob, &lease_id).await;
                    return Ok(LeaseGuard::new(blob, lease_id, lease, path));
                }
                Err(err) => match (err.status(), created) {
                    (Some(404), false) => {
                        create_lock_blob(container, &blob).await.map_err(storage)?;
                        created = true;
                        continue;
                    }
                    (Some(409), _) => {
                        let now = tokio::time::Instant::now();
                        if now >= deadline {
                            return Err(LockError::Timeout {
                                blob: path,
                                waited: wait,
                                lease,
                            });
                        }
                        tracing::debug!(lock = %path, "lock held elsewhere; waiting");
                        tokio::time::sleep(pace.delay(step).min(deadline - now)).await;
                        step = step.saturating_add(1);
                    }
                    _ => return Err(storage(err)),
                },
            }
        }
    }

    /// One attempt at the lock `name` (default lease), no waiting: `None` while another process
    /// holds it.
    pub async fn try_acquire(
        container: &Container,
        name: &str,
    ) -> Result<Option<LeaseGuard>, LockError> {
        let blob = container.blob_client(name);
        let path = blob_path(&blob);
        let proposed = uuid::Uuid::new_v4().to_string();
        let mut created = false;
        loop {
            match acquire(&blob, DEFAULT_LEASE, Some(&proposed)).await {
                Ok(lease_id) => {
                    record_holder(&blob, &lease_id).await;
                    return Ok(Some(LeaseGuard::new(blob, lease_id, DEFAULT_LEASE, path)));
                }
                Err(err) => match (err.status(), created) {
                    (Some(404), false) => {
                        create_lock_blob(container, &blob).await.map_err(|source| {
                            LockError::Storage {
                                blob: path.clone(),
                                source: Box::new(source),
                            }
                        })?;
                        created = true;
                    }
                    (Some(409), _) => return Ok(None),
                    _ => {
                        return Err(LockError::Storage {
                            blob: path,
                            source: Box::new(err),
                        })
                    }
                },
            }
        }
    }

    /// Break the lease on lock `name` at once (an operator's escape hatch after a crash).
    pub async fn break_lock(container: &Container, name: &str) -> Result<(), LockError> {
        let blob = container.blob_client(name);
        let path = blob_path(&blob);
        match break_now(&blob).await {
            Ok(_) => Ok(()),
            Err(e) => {
                let err = BlobError::request("break lease on", path.clone(), e);
                // Not found, or no lease to break: nothing to do.
                if matches!(err.status(), Some(404) | Some(409)) {
                    Ok(())
                } else {
                    Err(LockError::Storage {
                        blob: path,
                        source: Box::new(err),
                    })
                }
            }
        }
    }
}

/// The lock blob's metadata key naming its holder (host and process), written by each holder
/// right after it takes the lease, under that lease: a waiter reads it to say whom it waits for.
pub const META_HOLDER: &str = "holder";

/// This process as a lock holder: `host NAME, process PID`.
pub fn this_holder() -> String {
    // Linux keeps the host name here; elsewhere the process id alone still tells two apart.
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty());
    let pid = std::process::id();
    match host {
        Some(h) => super::blob::sanitise_value(META_HOLDER, &format!("host {h}, process {pid}")),
        None => format!("process {pid}"),
    }
}

/// Write [`META_HOLDER`] on the lock blob we just leased. Best effort: the lock is held either
/// way, and a waiter that finds no name says so. Set Blob Metadata also moves the blob's
/// Last-Modified, which is how long the holder has held the lock by storage's clock.
/// One attempt, bounded by [`RECORD_HOLDER_WITHIN`]: the lease's renewal starts only after it,
/// so a slow storage account must not hold it up longer than a fraction of the lease.
async fn record_holder(blob: &Blob, lease_id: &str) {
    let metadata = std::collections::HashMap::from([(META_HOLDER.to_string(), this_holder())]);
    let options = BlobClientSetMetadataOptions {
        lease_id: Some(lease_id.to_string()),
        method_options: ClientMethodOptions {
            context: Context::new().with_value(RetryBudget(0)),
        },
        ..Default::default()
    };
    let write = blob.client().set_metadata(&metadata, Some(options));
    match tokio::time::timeout(RECORD_HOLDER_WITHIN, write).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            let err = BlobError::request("record the holder on", blob_path(blob), e);
            tracing::debug!("{err} (waiters will not see who holds the lock)");
        }
        Err(_) => tracing::debug!(
            lock = %blob_path(blob),
            "recording the holder took over {}s; waiters will not see who holds the lock",
            RECORD_HOLDER_WITHIN.as_secs()
        ),
    }
}

/// How long [`record_holder`] may take (a third of the shortest lease, 15 s).
const RECORD_HOLDER_WITHIN: Duration = Duration::from_secs(5);

/// Who holds lock `name` now: `None` when its lease is not held (or the blob is absent).
pub async fn holder(
    container: &Container,
    name: &str,
) -> Result<Option<crate::gallery::lock::LockHolder>, BlobError> {
    let blob = container.blob_client(name);
    let path = blob_path(&blob);
    let props = match blob.client().get_properties(None).await {
        Ok(p) => p,
        Err(e) => {
            let err = BlobError::request("get properties of", path, e);
            return if err.is_not_found() {
                Ok(None)
            } else {
                Err(err)
            };
        }
    };
    let bad = |e| BlobError::request("read the properties of", path.clone(), e);
    if props.lease_state().map_err(bad)? != Some(LeaseState::Leased) {
        return Ok(None);
    }
    let who = props
        .metadata()
        .map_err(bad)?
        .into_iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(META_HOLDER))
        .map(|(_, v)| v)
        .unwrap_or_else(|| "a holder that did not name itself (an older stemcell-gallery, or it is just taking the lock)".into());
    // Both instants by storage's clock: Last-Modified (the holder's metadata write) and the
    // response's Date.
    let since = props.last_modified().map_err(bad)?;
    let now = props
        .headers()
        .get_optional_str(&azure_core::http::headers::HeaderName::from_static("date"))
        .and_then(crate::azure::parse_http_date);
    let held_for = match (since, now) {
        (Some(since), Some(now)) if now >= since => Some((now - since).unsigned_abs()),
        _ => None,
    };
    Ok(Some(crate::gallery::lock::LockHolder { who, held_for }))
}

/// Acquire Lease on `blob` for `lease` (whole seconds, 15-60), proposing `proposed` as the id;
/// the lease id the service answered.
pub(super) async fn acquire(
    blob: &Blob,
    lease: Duration,
    proposed: Option<&str>,
) -> Result<String, BlobError> {
    let path = blob_path(blob);
    let secs = i32::try_from(lease.as_secs()).unwrap_or(60);
    let resp = blob
        .client()
        .acquire_lease(
            secs,
            Some(BlobClientAcquireLeaseOptions {
                proposed_lease_id: proposed.map(str::to_string),
                ..Default::default()
            }),
        )
        .await
        .map_err(|e| BlobError::request("acquire lease on", path.clone(), e))?;
    match resp.lease_id() {
        Ok(Some(id)) => Ok(id),
        Ok(None) => Err(BlobError::Unreadable {
            blob: path,
            reason: "Acquire Lease answered no x-ms-lease-id".into(),
        }),
        Err(e) => Err(BlobError::request("acquire lease on", path, e)),
    }
}

/// The whole content of a (small) blob.
async fn read_all(blob: &Blob) -> azure_core::Result<bytes::Bytes> {
    blob.client().download(None).await?.body.collect().await
}

/// Break Lease with a zero break period: the lease ends at once.
pub(super) async fn break_now(blob: &Blob) -> azure_core::Result<()> {
    blob.client()
        .break_lease(Some(BlobClientBreakLeaseOptions {
            break_period: Some(0),
            ..Default::default()
        }))
        .await
        .map(|_| ())
}

/// Create the 0-byte lock blob (and its container). Racing another host is fine: "already exists"
/// (409) and "leased" (412, a holder got there first) both mean the blob is there.
async fn create_lock_blob(container: &Container, blob: &Blob) -> Result<(), BlobError> {
    let put = |blob: Blob| async move {
        blob.block_blob()
            .upload(
                bytes::Bytes::new().into(),
                Some(BlockBlobClientUploadOptions {
                    if_none_match: Some(Etag::from("*")),
                    ..Default::default()
                }),
            )
            .await
    };
    let first = put(blob.clone()).await;
    let result = match first {
        Err(e) => {
            let err = BlobError::request("create lock blob", blob_path(blob), e);
            if err.code() == Some("ContainerNotFound") {
                ensure_container(container).await?;
                put(blob.clone())
                    .await
                    .map(|_| ())
                    .map_err(|e| BlobError::request("create lock blob", blob_path(blob), e))
            } else {
                Err(err)
            }
        }
        Ok(_) => Ok(()),
    };
    match result {
        Err(err) if matches!(err.status(), Some(409) | Some(412)) => Ok(()),
        other => other,
    }
}

/// A held lock. Renewed in the background; call [`LeaseGuard::release`] when done.
pub struct LeaseGuard {
    blob: Blob,
    lease_id: String,
    path: String,
    lost: Arc<AtomicBool>,
    renewer: Option<tokio::task::JoinHandle<()>>,
    released: bool,
}

impl std::fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("blob", &self.path)
            .field("lost", &self.lost.load(Ordering::Relaxed))
            .finish()
    }
}

impl LeaseGuard {
    fn new(blob: Blob, lease_id: String, lease: Duration, path: String) -> Self {
        let lost = Arc::new(AtomicBool::new(false));
        let renewer = {
            let client = blob.clone();
            let lease_id = lease_id.clone();
            let lost = lost.clone();
            let path = path.clone();
            tokio::spawn(async move {
                let period = lease / 3;
                loop {
                    tokio::time::sleep(period).await;
                    match client.client().renew_lease(lease_id.clone(), None).await {
                        Ok(_) => tracing::trace!(lock = %path, "lease renewed"),
                        Err(e) => {
                            let err = BlobError::request("renew lease on", path.clone(), e);
                            if err.class().retryable() {
                                // The pipeline already retried; try again next period while the
                                // lease (3 periods) has not run out.
                                tracing::warn!(lock = %path, "cannot renew the lock's lease yet: {err}");
                                continue;
                            }
                            tracing::warn!(lock = %path, "lost the lock's lease: {err}");
                            lost.store(true, Ordering::SeqCst);
                            return;
                        }
                    }
                }
            })
        };
        Self {
            blob,
            lease_id,
            path,
            lost,
            renewer: Some(renewer),
            released: false,
        }
    }

    /// The lock blob, as `container/blob`.
    pub fn blob(&self) -> &str {
        &self.path
    }

    /// `Err(Lost)` when renewal failed; call before each guarded write.
    pub fn check(&self) -> Result<(), LockError> {
        if self.lost.load(Ordering::SeqCst) {
            Err(LockError::Lost {
                blob: self.path.clone(),
            })
        } else {
            Ok(())
        }
    }

    /// Renew the lease now: `Err(Lost)` when another holder took the lock since (a renewal fails
    /// once the blob was leased again), so the caller must not send the write it guards. Call
    /// right before every guarded write; the background renewal alone cannot see a stall.
    pub async fn renew_now(&self) -> Result<(), LockError> {
        self.check()?;
        match self
            .blob
            .client()
            .renew_lease(self.lease_id.clone(), None)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) => {
                let err = BlobError::request("renew lease on", self.path.clone(), e);
                if err.class().retryable() {
                    // Not known to be lost, but not known to be held either: do not write.
                    return Err(LockError::Storage {
                        blob: self.path.clone(),
                        source: Box::new(err),
                    });
                }
                tracing::warn!(lock = %self.path, "lost the lock's lease: {err}");
                self.lost.store(true, Ordering::SeqCst);
                Err(LockError::Lost {
                    blob: self.path.clone(),
                })
            }
        }
    }

    /// Delete the blob this guard leases (an intent's claim), with the lease.
    async fn delete_leased(mut self) -> Result<(), LockError> {
        self.released = true;
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
        let options = BlobClientDeleteOptions {
            lease_id: Some(self.lease_id.clone()),
            ..Default::default()
        };
        match self.blob.client().delete(Some(options)).await {
            Ok(_) => Ok(()),
            Err(e) => {
                let err = BlobError::request("delete", self.path.clone(), e);
                if err.status() == Some(404) {
                    Ok(())
                } else {
                    Err(LockError::Storage {
                        blob: self.path.clone(),
                        source: Box::new(err),
                    })
                }
            }
        }
    }

    /// The note blob kept next to the lock blob: `<lock blob>.carried`, a JSON list of the
    /// references carried from a replaced Failed version of this lock's version.
    fn note_blob(&self) -> Blob {
        let name = format!("{}.carried", self.blob.blob_name());
        self.blob.container_client().blob_client(&name)
    }

    /// The references recorded in the note (empty when there is none).
    pub async fn read_carried(&self) -> Result<Vec<String>, LockError> {
        let note = self.note_blob();
        let path = blob_path(&note);
        match read_all(&note).await {
            Ok(bytes) => {
                serde_json::from_slice::<Vec<String>>(&bytes).map_err(|e| LockError::Note {
                    blob: path,
                    message: format!("it does not hold a JSON list of references: {e}"),
                })
            }
            Err(e) => {
                let err = BlobError::request("read", path.clone(), e);
                if err.status() == Some(404) {
                    Ok(Vec::new())
                } else {
                    Err(LockError::Storage {
                        blob: path,
                        source: Box::new(err),
                    })
                }
            }
        }
    }

    /// Replace the note (an empty list deletes it). The caller holds the lock.
    pub async fn write_carried(&self, refs: &[String]) -> Result<(), LockError> {
        self.renew_now().await?;
        let note = self.note_blob();
        let path = blob_path(&note);
        if refs.is_empty() {
            return super::blob::delete_blob_if_exists(&note)
                .await
                .map(|_| ())
                .map_err(|source| LockError::Storage {
                    blob: path,
                    source: Box::new(source),
                });
        }
        let body = serde_json::to_vec(refs).unwrap_or_default();
        note.block_blob()
            .upload(bytes::Bytes::from(body).into(), None)
            .await
            .map(|_| ())
            .map_err(|e| LockError::Storage {
                blob: path.clone(),
                source: Box::new(BlobError::request("write", path, e)),
            })
    }

    /// Give the lock back.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.released = true;
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
        let result = self
            .blob
            .client()
            .release_lease(self.lease_id.clone(), None)
            .await;
        match result {
            Ok(_) => {
                tracing::debug!(lock = %self.path, "lock released");
                Ok(())
            }
            Err(e) => {
                let err = BlobError::request("release lease on", self.path.clone(), e);
                // 409: the lease already expired or was taken over; nothing left to release.
                if err.status() == Some(409) {
                    self.check()
                } else {
                    Err(LockError::Storage {
                        blob: self.path.clone(),
                        source: Box::new(err),
                    })
                }
            }
        }
    }

    /// Stop renewing and walk away without releasing, as a crashed process would: the lease
    /// expires by itself. For tests and for handing a lock's fate to its expiry on purpose.
    pub fn abandon(mut self) {
        self.released = true;
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Some(r) = self.renewer.take() {
            r.abort();
        }
        if self.released {
            return;
        }
        // Best effort: release from a spawned task if a runtime is still around; otherwise the
        // lease simply expires.
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let client = self.blob.clone();
            let lease_id = self.lease_id.clone();
            let path = self.path.clone();
            handle.spawn(async move {
                if let Err(e) = client.client().release_lease(lease_id, None).await {
                    tracing::debug!(lock = %path, "best-effort lease release failed (it will expire): {e}");
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Exit;

    #[test]
    fn a_lock_timeout_says_re_run_and_asks_to_raise_nothing() {
        let lock = LockError::Timeout {
            blob: "locks/g/d/1.0.0.lock".into(),
            waited: std::time::Duration::from_secs(600),
            lease: std::time::Duration::from_secs(30),
        }
        .to_string();
        assert!(!lock.contains("raise"), "{lock}");
        assert!(lock.contains("re-run"), "{lock}");
    }

    #[test]
    fn timeout_names_the_blob_and_the_remedy() {
        let err = LockError::Timeout {
            blob: "stemcell/locks/g/d/1.0.0.lock".into(),
            waited: Duration::from_secs(5),
            lease: DEFAULT_LEASE,
        };
        let text = err.to_string();
        assert!(text.contains("stemcell/locks/g/d/1.0.0.lock"));
        assert!(text.contains("lease break"));
        assert!(err.class().retryable());
        assert_eq!(err.class().exit(), Exit::Error);
    }
}
