//! The gallery's cross-host locks (`gallery::lock::Locks`) over blob leases (`azure::lock`):
//! the adapter the application context plugs into the gallery service.

use std::time::Duration;

use crate::azure::lock::{Claim, LeaseLock};
use crate::gallery::error::{Error, Result};
use crate::gallery::lock::{Handover, Held, Intent, LockHolder, Locks, Withdrawal};

/// Cross-host locks: a blob lease on `locks/<gallery>/<definition>/<version>.lock` in the
/// stemcell container of the configured storage account.
/// With `coalesce`, a writer that finds a version's lock taken hands its reference over as an
/// intent blob `<lock blob>.pending/<uuid>` (see `azure::lock`, "Intents").
pub struct BlobLocks {
    pub container: crate::azure::blob::Container,
    pub wait: Duration,
    pub coalesce: bool,
}

struct BlobHeld {
    guard: crate::azure::lock::LeaseGuard,
    /// Intents claimed by this holder, by id, until finished.
    claims: tokio::sync::Mutex<std::collections::HashMap<String, Claim>>,
    /// Unclaimed intents not refreshed for this long are dropped unapplied (their writer died).
    max_intent_age: Duration,
}

impl BlobHeld {
    fn new(guard: crate::azure::lock::LeaseGuard) -> Self {
        BlobHeld {
            guard,
            claims: Default::default(),
            max_intent_age: crate::azure::lock::INTENT_LIVENESS,
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
        // The claims too: a write must not carry a reference whose waiter may have withdrawn it
        // (a claim that lapsed).
        for c in self.claims.lock().await.values() {
            c.renew().await.map_err(lock_error)?;
        }
        Ok(())
    }
    async fn carried(&self) -> Result<Vec<String>> {
        self.guard.read_carried().await.map_err(lock_error)
    }
    async fn set_carried(&self, refs: &[String]) -> Result<()> {
        self.guard.write_carried(refs).await.map_err(lock_error)
    }
    async fn claim_intents(&self) -> Result<Vec<Intent>> {
        let have: Vec<String> = self.claims.lock().await.keys().cloned().collect();
        let claims = self
            .guard
            .claim_intents(self.max_intent_age, &have)
            .await
            .map_err(lock_error)?;
        let mut out = Vec::new();
        let mut held = self.claims.lock().await;
        for c in claims {
            out.push(Intent {
                id: c.intent.name.clone(),
                reference: c.intent.reference.clone(),
            });
            held.insert(c.intent.name.clone(), c);
        }
        Ok(out)
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
        let guard = LeaseLock::acquire(&self.container, name, self.wait)
            .await
            .map_err(lock_error)?;
        Ok(Box::new(BlobHeld::new(guard)))
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
        Ok(LeaseLock::try_acquire(&self.container, name)
            .await
            .map_err(lock_error)?
            .map(|g| Box::new(BlobHeld::new(g)) as Box<dyn Held>))
    }
    async fn post(&self, name: &str, reference: &str) -> Result<String> {
        crate::azure::lock::post_intent(&self.container, name, reference)
            .await
            .map_err(lock_error)
    }
    async fn refresh(&self, id: &str, reference: &str) -> Result<bool> {
        use crate::azure::lock::IntentState;
        Ok(
            crate::azure::lock::refresh_intent(&self.container, id, reference)
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
}

/// Without a storage account there is no cross-host lock, and so no writes.
pub struct NoLocks;

#[async_trait::async_trait]
impl Locks for NoLocks {
    async fn acquire(&self, _name: &str) -> Result<Box<dyn Held>> {
        Err(Error::NoLockStore)
    }
}
