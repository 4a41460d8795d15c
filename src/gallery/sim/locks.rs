//! The lock store of the simulation: the `Locks` port over in-process mutexes and a record store
//! in memory (`record::MemoryRecords`), as `lock::LocalLocks` is, with what the simulation needs
//! of blob storage:
//!
//! - every lock and record request is a scheduling point (`probe::yield_point`);
//! - a lease can expire under its holder (`SimLocks::expire`): the lock is free for the next
//!   writer at once, and the old holder learns it only at its next `Held::check` (as a stalled
//!   process whose blob lease ran out: `azure::gallery_locks`); what it already sent still lands;
//! - a lock's holder can be handed an intent blob written by someone else (`SimLocks::inject`):
//!   the intents of group commit (`<lock>.pending/<id>`, docs/references.md) are input another
//!   process wrote, and can hold anything.
//!
//! Two galleries whose locks live in one storage account share one `SimLocks` (one record store,
//! and one lease per blob name), as they share the blobs on Azure.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use crate::error::{Class, Classified};
use crate::gallery::error::{Error, LockError, LockStoreError, Result};
use crate::gallery::lock::{Claimed, Held, Intent, Locks};
use crate::gallery::record::{MemoryRecords, RecordStore, Stored};

use super::probe::{yield_point, OpId, Probe};

/// The records in memory, each request a scheduling point.
pub struct SimRecords {
    pub inner: Arc<MemoryRecords>,
    pub probe: Arc<Probe>,
}

#[async_trait::async_trait]
impl RecordStore for SimRecords {
    async fn get(&self, name: &str) -> Result<Option<Stored>> {
        yield_point(&self.probe).await;
        self.probe.count("blob:get");
        self.inner.get(name).await
    }

    async fn put_if(
        &self,
        name: &str,
        body: &[u8],
        expect: Option<&str>,
    ) -> Result<Option<String>> {
        yield_point(&self.probe).await;
        self.probe.count("blob:put_if");
        self.inner.put_if(name, body, expect).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        yield_point(&self.probe).await;
        self.probe.count("blob:list");
        self.inner.list(prefix).await
    }
}

/// The lease of one holder: dropped with its holder (a crashed process's lease is free at once,
/// the fastest a blob lease can expire), or taken away by [`SimLocks::expire`].
struct Lease {
    guard: Mutex<Option<tokio::sync::OwnedMutexGuard<()>>>,
    lost: std::sync::atomic::AtomicBool,
    op: Option<OpId>,
}

/// Intents left beside locks, by lock name, until a holder claims them.
type Intents = Arc<Mutex<BTreeMap<String, Vec<Intent>>>>;

pub struct SimLocks {
    mutexes: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
    leases: Mutex<BTreeMap<String, Weak<Lease>>>,
    intents: Intents,
    pub records: Arc<SimRecords>,
    probe: Arc<Probe>,
}

impl SimLocks {
    pub fn new(store: Arc<MemoryRecords>, probe: Arc<Probe>) -> Self {
        SimLocks {
            mutexes: Mutex::default(),
            leases: Mutex::default(),
            intents: Intents::default(),
            records: Arc::new(SimRecords {
                inner: store,
                probe: probe.clone(),
            }),
            probe,
        }
    }

    pub fn store(&self) -> &Arc<MemoryRecords> {
        &self.records.inner
    }

    /// The locks held now, by name, with the operation holding each.
    pub fn held(&self) -> Vec<(String, Option<OpId>)> {
        let leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
        leases
            .iter()
            .filter_map(|(n, w)| {
                let l = w.upgrade()?;
                let live = l.guard.lock().unwrap_or_else(|p| p.into_inner()).is_some();
                live.then(|| (n.clone(), l.op))
            })
            .collect()
    }

    /// Let the lease of lock `name` run out under its holder. `false` when nobody holds it.
    pub fn expire(&self, name: &str) -> bool {
        let lease = {
            let leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
            leases.get(name).and_then(Weak::upgrade)
        };
        let Some(lease) = lease else {
            return false;
        };
        lease.lost.store(true, std::sync::atomic::Ordering::SeqCst);
        let guard = lease.guard.lock().unwrap_or_else(|p| p.into_inner()).take();
        guard.is_some()
    }

    /// Leave `intent` pending beside lock `name`, for its next holder to claim.
    pub fn inject(&self, name: &str, intent: Intent) {
        self.intents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(name.to_string())
            .or_default()
            .push(intent);
    }

    /// Remove every injected intent not claimed yet (the end of a run: an operator cleaned up).
    pub fn clear_intents(&self) {
        self.intents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

#[async_trait::async_trait]
impl Locks for SimLocks {
    async fn acquire(&self, name: &str) -> Result<Box<dyn Held>> {
        yield_point(&self.probe).await;
        self.probe.count("blob:lease");
        let m = {
            let mut map = self.mutexes.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(name.to_string()).or_default().clone()
        };
        let guard = m.lock_owned().await;
        let lease = Arc::new(Lease {
            guard: Mutex::new(Some(guard)),
            lost: Default::default(),
            op: self.probe.current(),
        });
        self.leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), Arc::downgrade(&lease));
        Ok(Box::new(SimHeld {
            name: name.to_string(),
            lease,
            records: self.records.clone(),
            probe: self.probe.clone(),
            intents: self.intents.clone(),
        }))
    }

    fn records(&self) -> Option<&dyn RecordStore> {
        Some(self.records.as_ref())
    }
}

struct SimHeld {
    name: String,
    lease: Arc<Lease>,
    records: Arc<SimRecords>,
    probe: Arc<Probe>,
    /// Intents someone left beside the locks (this lock's are claimed by its holder).
    intents: Intents,
}

#[async_trait::async_trait]
impl Held for SimHeld {
    async fn check(&self) -> Result<()> {
        yield_point(&self.probe).await;
        if self.lease.lost.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Error::Lock(LockError::Store(Box::new(LeaseLost {
                lock: self.name.clone(),
            }))));
        }
        Ok(())
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn records(&self) -> &dyn RecordStore {
        self.records.as_ref()
    }

    /// Every intent pending beside this lock (a claim runs out with its holder: one claimed
    /// and not finished is claimed again by the next holder).
    async fn claim_intents(&self) -> Result<Claimed> {
        let intents = self
            .intents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&self.name)
            .cloned()
            .unwrap_or_default();
        if !intents.is_empty() {
            yield_point(&self.probe).await;
        }
        Ok(Claimed {
            intents,
            arriving: 0,
        })
    }

    async fn finish_intents(&self, ids: &[String]) -> Result<()> {
        if let Some(pending) = self
            .intents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&self.name)
        {
            pending.retain(|i| !ids.contains(&i.id));
        }
        Ok(())
    }

    async fn drop_intents_of(&self, reference: &str) -> Result<()> {
        if let Some(pending) = self
            .intents
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&self.name)
        {
            pending.retain(|i| i.reference != reference);
        }
        Ok(())
    }

    async fn release(self: Box<Self>) {
        self.lease
            .guard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }
}

/// The store's answer to a holder whose lease ran out (the blob lease's 409 LeaseIdMismatch).
#[derive(Debug)]
pub struct LeaseLost {
    pub lock: String,
}

impl std::fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "simulated: the lease on {} ran out and another writer may hold it",
            self.lock
        )
    }
}

impl std::error::Error for LeaseLost {}

impl Classified for LeaseLost {
    fn class(&self) -> Class {
        Class::Transient
    }
}

impl LockStoreError for LeaseLost {}
