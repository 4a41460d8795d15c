//! The gallery's cross-host locks (`gallery::lock::Locks`) over blob leases (`azure::lock`):
//! the adapter the application context plugs into the gallery service.

use std::time::Duration;

use azure_core::http::Etag;
use azure_storage_blob::models::BlockBlobClientUploadOptions;

use crate::azure::blob::{blob_path, BlobError, Container};
use crate::azure::lock::{Claim, IntentAsk, LeaseLock, LockError, PendingIntent};
use crate::gallery::content::Content;
use crate::gallery::error::{Error, Result};
use crate::gallery::lock::{
    Ask, Carrying, Claimed, Gather, Handover, Held, Intent, LockHolder, Locks, Withdrawal, GATHER,
};
use crate::gallery::record::{RecordError, RecordStore, Stored};

/// Cross-host locks: a blob lease on the version's lock blob
/// (`galleries/<subscription>/<resource group>/<gallery>/<definition>/<version>.lock`,
/// `gallery::lock::version_lock_name`) in the stemcell container of the configured storage
/// account — and, while hosts of the previous release may still write the same version, one on
/// the lock blob that release takes (`locks/<gallery>/<definition>/<version>.lock`), taken
/// second, so that the two releases exclude each other during an upgrade.
/// With `coalesce`, a writer that finds a version's lock taken hands its reference over as an
/// intent blob `<lock blob>.pending/<uuid>` (see `azure::lock`, "Intents").
pub struct BlobLocks {
    pub container: crate::azure::blob::Container,
    pub wait: Duration,
    pub coalesce: bool,
    /// The versions' reference records, in the same container.
    pub records: BlobRecords,
    /// The gallery's name as configured, for the previous release's lock of each version (see
    /// [`BlobLocks::with_legacy_gallery`]); `None`: that lock is not taken.
    pub legacy_gallery: Option<String>,
}

impl BlobLocks {
    /// Locks (and records) in `container`.
    pub fn new(container: Container, wait: Duration, coalesce: bool) -> Self {
        BlobLocks {
            records: BlobRecords {
                container: container.clone(),
            },
            container,
            wait,
            coalesce,
            legacy_gallery: None,
        }
    }

    /// Also take the previous release's lock of each version, named for the gallery as
    /// configured (`gallery::lock::legacy_lock_of`): a host of that release writing the same
    /// version meanwhile waits, and is waited for.
    pub fn with_legacy_gallery(mut self, gallery: &str) -> Self {
        self.legacy_gallery = Some(gallery.to_string());
        self
    }

    fn legacy_of(&self, name: &str) -> Option<String> {
        crate::gallery::lock::legacy_lock_of(name, self.legacy_gallery.as_deref()?)
    }
}

/// The versions' reference records (`gallery::record`) as small block blobs beside the lock
/// blobs, written with `If-Match` on the ETag read (or `If-None-Match: *` when absent): Azure
/// refuses a write whose blob changed since with 412 `ConditionNotMet` (or 409
/// `BlobAlreadyExists`), so a writer working on a stale read writes nothing.
#[derive(Clone)]
pub struct BlobRecords {
    pub container: Container,
}

fn record_store_error(blob: String, source: BlobError) -> Error {
    Error::Record(RecordError::Store(Box::new(LockError::Storage {
        blob,
        source: Box::new(source),
    })))
}

#[async_trait::async_trait]
impl RecordStore for BlobRecords {
    async fn get(&self, name: &str) -> Result<Option<Stored>> {
        let blob = self.container.blob_client(name);
        let path = blob_path(&blob);
        let fail = |e| BlobError::request("read the reference record", path.clone(), e);
        let resp = match blob.client().download(None).await {
            Ok(r) => r,
            Err(e) => {
                let err = fail(e);
                // The blob, or the whole container, is not there: no record.
                return if err.status() == Some(404) {
                    Ok(None)
                } else {
                    Err(record_store_error(path, err))
                };
            }
        };
        let etag = resp.properties.etag.clone().map(String::from);
        let body = resp
            .body
            .collect()
            .await
            .map_err(|e| record_store_error(path.clone(), fail(e)))?;
        let Some(etag) = etag else {
            return Err(record_store_error(
                path.clone(),
                BlobError::Unreadable {
                    blob: path,
                    reason: "the service answered no ETag".into(),
                },
            ));
        };
        Ok(Some(Stored {
            body: body.to_vec(),
            etag,
        }))
    }

    async fn put_if(
        &self,
        name: &str,
        body: &[u8],
        expect: Option<&str>,
    ) -> Result<Option<String>> {
        let blob = self.container.blob_client(name);
        let path = blob_path(&blob);
        let block = blob.block_blob();
        let put = || {
            let options = BlockBlobClientUploadOptions {
                if_match: expect.map(Etag::from),
                if_none_match: expect.is_none().then(|| Etag::from("*")),
                ..Default::default()
            };
            block.upload(bytes::Bytes::copy_from_slice(body).into(), Some(options))
        };
        let wrap = |e| BlobError::request("write the reference record", path.clone(), e);
        let mut result = put().await.map_err(wrap);
        if matches!(&result, Err(err) if err.code() == Some("ContainerNotFound")) {
            crate::azure::blob::ensure_container(&self.container)
                .await
                .map_err(|e| record_store_error(path.clone(), e))?;
            result = put().await.map_err(wrap);
        }
        match result {
            Ok(r) => Ok(Some(r.etag.map(String::from).unwrap_or_default())),
            // Changed since it was read (412), or created meanwhile (409).
            Err(err) if matches!(err.status(), Some(412) | Some(409)) => Ok(None),
            Err(err) => Err(record_store_error(path, err)),
        }
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let pages = crate::azure::blob::list_blobs(&self.container, prefix)
            .await
            .map_err(|e| record_store_error(prefix.to_string(), e))?;
        Ok(pages
            .into_iter()
            .flat_map(|(_, items)| items)
            .filter_map(|item| item.name)
            .collect())
    }
}

struct BlobHeld {
    name: String,
    records: BlobRecords,
    guard: crate::azure::lock::LeaseGuard,
    /// The previous release's lock of the same version, held with it (see [`BlobLocks`]).
    legacy: Option<crate::azure::lock::LeaseGuard>,
    /// Intents claimed by this holder, by id, until finished.
    claims: tokio::sync::Mutex<std::collections::HashMap<String, Claim>>,
    /// Unclaimed intents not refreshed for this long are dropped unapplied (their writer died).
    max_intent_age: Duration,
    /// Group commit is on: gather hand-overs before a write.
    coalesce: bool,
}

impl BlobHeld {
    fn new(
        name: &str,
        records: BlobRecords,
        guard: crate::azure::lock::LeaseGuard,
        legacy: Option<crate::azure::lock::LeaseGuard>,
        coalesce: bool,
    ) -> Self {
        BlobHeld {
            name: name.to_string(),
            records,
            guard,
            legacy,
            claims: Default::default(),
            max_intent_age: crate::azure::lock::INTENT_LIVENESS,
            coalesce,
        }
    }
}

/// The lock layer's error as the service's: typed, so whether a retry may succeed is kept (a
/// 403 on the lock container must not reach BOSH as `ok_to_retry: true`).
fn lock_error(e: crate::azure::lock::LockError) -> Error {
    e.into()
}

fn lock_container_error(e: crate::azure::blob::BlobError) -> Error {
    crate::azure::lock::LockError::Container {
        source: Box::new(e),
    }
    .into()
}

#[async_trait::async_trait]
impl Held for BlobHeld {
    async fn check(&self) -> Result<()> {
        self.guard.renew_now().await.map_err(lock_error)?;
        if let Some(l) = &self.legacy {
            l.renew_now().await.map_err(lock_error)?;
        }
        // The claims too: a write must not carry a reference whose waiter may have withdrawn it
        // (a claim that lapsed).
        for c in self.claims.lock().await.values() {
            c.renew().await.map_err(lock_error)?;
        }
        Ok(())
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn records(&self) -> &dyn RecordStore {
        &self.records
    }
    async fn legacy_carried(&self) -> Result<Vec<String>> {
        self.guard.read_carried().await.map_err(lock_error)
    }
    async fn clear_legacy_carried(&self) -> Result<()> {
        self.guard.write_carried(&[]).await.map_err(lock_error)
    }
    fn gather(&self) -> Option<Gather> {
        self.coalesce.then_some(GATHER)
    }
    async fn claim_intents(&self, carrying: &Carrying<'_>) -> Result<Claimed> {
        let have: Vec<String> = self.claims.lock().await.keys().cloned().collect();
        let fits = |p: &PendingIntent| intent_of(p).is_some_and(|i| i.fits(carrying));
        let (claims, arriving) = self
            .guard
            .claim_pending(self.max_intent_age, &have, &fits)
            .await
            .map_err(lock_error)?;
        let mut out = Vec::new();
        let mut held = self.claims.lock().await;
        for c in claims {
            if let Some(i) = intent_of(&c.intent) {
                out.push(i);
            }
            held.insert(c.intent.name.clone(), c);
        }
        Ok(Claimed {
            intents: out,
            arriving,
        })
    }
    async fn finish_intents(&self, ids: &[String]) -> Result<()> {
        let taken: Vec<Claim> = {
            let mut held = self.claims.lock().await;
            ids.iter().filter_map(|id| held.remove(id)).collect()
        };
        for c in taken {
            c.finish().await.map_err(lock_error)?;
        }
        Ok(())
    }
    async fn drop_intents_of(&self, reference: &str) -> Result<()> {
        self.guard
            .drop_intents_of(reference)
            .await
            .map_err(lock_error)
    }
    async fn discard_intent(&self, id: &str) -> Result<()> {
        self.guard.discard_intent(id).await.map_err(lock_error)
    }
    async fn release(self: Box<Self>) {
        let this = *self;
        // Unfinished claims are released with their guards (or simply expire).
        drop(this.claims);
        if let Some(l) = this.legacy {
            if let Err(e) = l.release().await {
                tracing::warn!(error = %e, "could not release the previous release's lock; its lease expires by itself");
            }
        }
        if let Err(e) = this.guard.release().await {
            tracing::warn!(error = %e, "could not release the lock; its lease expires by itself");
        }
    }
}

#[async_trait::async_trait]
impl Locks for BlobLocks {
    async fn acquire(&self, name: &str) -> Result<Box<dyn Held>> {
        crate::azure::blob::ensure_container(&self.container)
            .await
            .map_err(lock_container_error)?;
        let started = tokio::time::Instant::now();
        let guard = LeaseLock::acquire(&self.container, name, self.wait)
            .await
            .map_err(lock_error)?;
        let legacy = match self.legacy_of(name) {
            None => None,
            Some(legacy) => {
                let left = self.wait.saturating_sub(started.elapsed());
                match LeaseLock::acquire(&self.container, &legacy, left).await {
                    Ok(g) => Some(g),
                    Err(e) => {
                        let _ = guard.release().await;
                        return Err(lock_error(e));
                    }
                }
            }
        };
        Ok(Box::new(BlobHeld::new(
            name,
            self.records.clone(),
            guard,
            legacy,
            self.coalesce,
        )))
    }

    fn records(&self) -> Option<&dyn RecordStore> {
        Some(&self.records)
    }

    fn handover(&self) -> Option<&dyn Handover> {
        self.coalesce.then_some(self as &dyn Handover)
    }

    async fn holder(&self, name: &str) -> Option<LockHolder> {
        match crate::azure::lock::holder(&self.container, name).await {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!("cannot tell who holds the lock {name}: {e}");
                None
            }
        }
    }
}

#[async_trait::async_trait]
impl Handover for BlobLocks {
    async fn try_acquire(&self, name: &str) -> Result<Option<Box<dyn Held>>> {
        crate::azure::blob::ensure_container(&self.container)
            .await
            .map_err(lock_container_error)?;
        let Some(guard) = LeaseLock::try_acquire(&self.container, name)
            .await
            .map_err(lock_error)?
        else {
            return Ok(None);
        };
        let legacy = match self.legacy_of(name) {
            None => None,
            Some(legacy) => match LeaseLock::try_acquire(&self.container, &legacy).await {
                Ok(Some(g)) => Some(g),
                // A host of the previous release writes the version: not ours yet.
                Ok(None) => {
                    let _ = guard.release().await;
                    return Ok(None);
                }
                Err(e) => {
                    let _ = guard.release().await;
                    return Err(lock_error(e));
                }
            },
        };
        Ok(Some(Box::new(BlobHeld::new(
            name,
            self.records.clone(),
            guard,
            legacy,
            self.coalesce,
        ))))
    }
    async fn post(&self, name: &str, ask: &Ask<'_>) -> Result<String> {
        let token = ask.content.token();
        crate::azure::lock::post_intent(&self.container, name, &intent_ask(ask, &token))
            .await
            .map_err(lock_error)
    }
    async fn refresh(&self, id: &str, ask: &Ask<'_>) -> Result<bool> {
        use crate::azure::lock::IntentState;
        let token = ask.content.token();
        Ok(
            crate::azure::lock::refresh_intent(&self.container, id, &intent_ask(ask, &token))
                .await
                .map_err(lock_error)?
                != IntentState::Gone,
        )
    }
    async fn withdraw(&self, id: &str) -> Result<Withdrawal> {
        use crate::azure::lock::Withdrawal as W;
        Ok(
            match crate::azure::lock::withdraw_intent(&self.container, id)
                .await
                .map_err(lock_error)?
            {
                W::Withdrawn => Withdrawal::Withdrawn,
                W::Gone => Withdrawal::Gone,
                W::Claimed => Withdrawal::Claimed,
            },
        )
    }
    fn wait(&self) -> Duration {
        self.wait
    }
    async fn arrive(&self, name: &str) -> Result<String> {
        crate::azure::blob::ensure_container(&self.container)
            .await
            .map_err(lock_container_error)?;
        crate::azure::lock::post_arrival(&self.container, name)
            .await
            .map_err(lock_error)
    }
    async fn leave(&self, id: &str) {
        if let Err(e) = crate::azure::lock::remove_arrival(&self.container, id).await {
            tracing::debug!(arrival = id, error = %e, "could not remove this writer's arrival; it ages out");
        }
    }
}

/// An intent blob as the gallery layer reads it. `None`: one naming content this build cannot
/// read (a newer tool's): never claimed, left alone (it ages out if its writer dies).
fn intent_of(p: &PendingIntent) -> Option<Intent> {
    let content = match &p.content {
        Some(token) => Some(Content::from_token(token)?),
        None => None,
    };
    Some(Intent {
        id: p.name.clone(),
        reference: p.reference.clone(),
        holder: p.holder.clone(),
        content,
        to_create: p.to_create,
        life: p.life.clone(),
        age: p.age,
    })
}

/// A writer's ask as its intent blob carries it (`token`: its content's).
fn intent_ask<'a>(ask: &Ask<'a>, token: &'a str) -> IntentAsk<'a> {
    IntentAsk {
        reference: ask.reference,
        holder: ask.holder,
        content: token,
        to_create: ask.to_create,
        life: ask.life,
    }
}

/// Without a storage account there is no cross-host lock, and so no writes.
pub struct NoLocks;

#[async_trait::async_trait]
impl Locks for NoLocks {
    async fn acquire(&self, _name: &str) -> Result<Box<dyn Held>> {
        Err(Error::NoLockStore)
    }
}
