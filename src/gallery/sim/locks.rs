//! The lock store of the simulation: the `Locks` port over in-process mutexes and a record store
//! in memory (`record::MemoryRecords`), as `lock::LocalLocks` is, with what the simulation needs
//! of blob storage:
//!
//! - every lock and record request is a scheduling point (`probe::yield_point`);
//! - a lease can expire under its holder (`SimLocks::expire`): the lock is free for the next
//!   writer at once, and the old holder learns it only at its next `Held::check` (as a stalled
//!   process whose blob lease ran out: `azure::gallery_locks`); what it already sent still lands;
//! - group commit as the blob leases do it (`lock::Handover`, `azure::lock` "Intents"): a writer
//!   that finds the lock taken posts an intent and waits; the holder claims those that fit its
//!   write (`lock::Intent::fits`: a reference write, or a create carrying them in its PUT,
//!   issue 49), gathering while writers announced themselves; a claim lasts as long as its
//!   holder's lease; an intent its waiter stopped refreshing (it crashed) is dropped;
//! - a lock's holder can be handed an intent blob written by someone else (`SimLocks::inject`):
//!   the intents of group commit (`<lock>.pending/<id>`, docs/references.md) are input another
//!   process wrote, and can hold anything.
//!
//! Two galleries whose locks live in one storage account share one `SimLocks` (one record store,
//! and one lease per blob name), as they share the blobs on Azure.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use crate::error::{Class, Classified};
use crate::gallery::error::{Error, LockError, LockStoreError, Result};
use crate::gallery::lock::{
    Ask, Carrying, Claimed, Gather, Handover, Held, Intent, Locks, Withdrawal, GATHER,
};
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

/// An intent beside a lock: who claimed it (a claim lasts as long as its holder's lease), and
/// when its waiter last showed it was alive (`None`: injected, never stale).
struct Posted {
    intent: Intent,
    claim: Option<Weak<Lease>>,
    refreshed: Option<tokio::time::Instant>,
}

impl Posted {
    /// Claimed by a holder whose lease still stands.
    fn claimed_by_live(&self) -> Option<Arc<Lease>> {
        let lease = self.claim.as_ref()?.upgrade()?;
        let live = !lease.lost.load(std::sync::atomic::Ordering::SeqCst)
            && lease
                .guard
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some();
        live.then_some(lease)
    }
}

/// What lies beside the locks: intents by lock name, and arrivals by id (lock, when posted).
#[derive(Default)]
struct Board {
    intents: BTreeMap<String, Vec<Posted>>,
    arrivals: BTreeMap<String, (String, tokio::time::Instant)>,
    next: u64,
}

type Intents = Arc<Mutex<Board>>;

/// A waiter's intent not refreshed for this long is its dead writer's (as `INTENT_LIVENESS`).
const LIVENESS: Duration = Duration::from_secs(60);
/// An arrival older than this is not waited for (as `ARRIVAL_LIVENESS`).
const ARRIVING: Duration = Duration::from_secs(10);
/// How long a writer waits for the lock before giving up.
const WAIT: Duration = Duration::from_secs(600);

pub struct SimLocks {
    /// References writers handed to a create (`Ask::to_create`), for the checker.
    to_create: Mutex<std::collections::BTreeSet<String>>,
    mutexes: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
    leases: Mutex<BTreeMap<String, Weak<Lease>>>,
    intents: Intents,
    pub records: Arc<SimRecords>,
    probe: Arc<Probe>,
}

impl SimLocks {
    pub fn new(store: Arc<MemoryRecords>, probe: Arc<Probe>) -> Self {
        SimLocks {
            to_create: Mutex::default(),
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
        self.board()
            .intents
            .entry(name.to_string())
            .or_default()
            .push(Posted {
                intent,
                claim: None,
                refreshed: None,
            });
    }

    /// Whether a writer handed reference `r` to a create (posted an intent for one).
    pub fn handed_to_create(&self, r: &str) -> bool {
        self.to_create
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(r)
    }

    /// Remove every intent not claimed yet (the end of a run: an operator cleaned up).
    pub fn clear_intents(&self) {
        self.board().intents.clear();
    }

    fn board(&self) -> std::sync::MutexGuard<'_, Board> {
        self.intents.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn holding(&self, name: &str, guard: tokio::sync::OwnedMutexGuard<()>) -> Box<dyn Held> {
        let lease = Arc::new(Lease {
            guard: Mutex::new(Some(guard)),
            lost: Default::default(),
            op: self.probe.current(),
        });
        self.leases
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), Arc::downgrade(&lease));
        Box::new(SimHeld {
            name: name.to_string(),
            lease,
            records: self.records.clone(),
            probe: self.probe.clone(),
            intents: self.intents.clone(),
        })
    }

    fn mutex(&self, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut map = self.mutexes.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(name.to_string()).or_default().clone()
    }
}

#[async_trait::async_trait]
impl Locks for SimLocks {
    async fn acquire(&self, name: &str) -> Result<Box<dyn Held>> {
        yield_point(&self.probe).await;
        self.probe.count("blob:lease");
        let guard = self.mutex(name).lock_owned().await;
        Ok(self.holding(name, guard))
    }

    fn records(&self) -> Option<&dyn RecordStore> {
        Some(self.records.as_ref())
    }

    fn handover(&self) -> Option<&dyn Handover> {
        if std::env::var_os("SIM_NO_HANDOVER").is_some() {
            return None;
        }
        Some(self)
    }
}

#[async_trait::async_trait]
impl Handover for SimLocks {
    async fn try_acquire(&self, name: &str) -> Result<Option<Box<dyn Held>>> {
        yield_point(&self.probe).await;
        self.probe.count("blob:lease");
        Ok(self
            .mutex(name)
            .try_lock_owned()
            .ok()
            .map(|g| self.holding(name, g)))
    }

    async fn post(&self, name: &str, ask: &Ask<'_>) -> Result<String> {
        yield_point(&self.probe).await;
        self.probe.count("blob:put");
        if ask.to_create {
            self.to_create
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(ask.reference.to_string());
        }
        let mut board = self.board();
        board.next += 1;
        let id = format!("{name}.pending/{}", board.next);
        board
            .intents
            .entry(name.to_string())
            .or_default()
            .push(Posted {
                intent: Intent {
                    id: id.clone(),
                    reference: ask.reference.to_string(),
                    holder: ask.holder.map(str::to_string),
                    content: Some(ask.content.clone()),
                    to_create: ask.to_create,
                    life: ask.life.map(str::to_string),
                    age: Duration::ZERO,
                },
                claim: None,
                refreshed: Some(tokio::time::Instant::now()),
            });
        Ok(id)
    }

    async fn refresh(&self, id: &str, _ask: &Ask<'_>) -> Result<bool> {
        yield_point(&self.probe).await;
        self.probe.count("blob:put");
        let mut board = self.board();
        let found = board
            .intents
            .values_mut()
            .flat_map(|v| v.iter_mut())
            .find(|p| p.intent.id == id);
        Ok(match found {
            Some(p) => {
                if p.claimed_by_live().is_none() {
                    p.refreshed = Some(tokio::time::Instant::now());
                }
                true
            }
            None => false,
        })
    }

    async fn withdraw(&self, id: &str) -> Result<Withdrawal> {
        yield_point(&self.probe).await;
        self.probe.count("blob:delete");
        let mut board = self.board();
        for pending in board.intents.values_mut() {
            if let Some(at) = pending.iter().position(|p| p.intent.id == id) {
                if pending[at].claimed_by_live().is_some() {
                    return Ok(Withdrawal::Claimed);
                }
                pending.remove(at);
                return Ok(Withdrawal::Withdrawn);
            }
        }
        Ok(Withdrawal::Gone)
    }

    fn wait(&self) -> Duration {
        WAIT
    }

    async fn arrive(&self, name: &str) -> Result<String> {
        yield_point(&self.probe).await;
        self.probe.count("blob:put");
        let mut board = self.board();
        board.next += 1;
        let id = format!("{name}.pending/arrival-{}", board.next);
        board
            .arrivals
            .insert(id.clone(), (name.to_string(), tokio::time::Instant::now()));
        Ok(id)
    }

    async fn leave(&self, id: &str) {
        yield_point(&self.probe).await;
        self.probe.count("blob:delete");
        self.board().arrivals.remove(id);
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

impl SimHeld {
    /// Keep the intents beside this lock that `keep` accepts; delete the rest.
    fn keep_pending(&self, keep: impl Fn(&Intent) -> bool) {
        let mut board = self.intents.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pending) = board.intents.get_mut(&self.name) {
            pending.retain(|p| keep(&p.intent));
        }
    }
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

    fn gather(&self) -> Option<Gather> {
        Some(GATHER)
    }

    /// The intents pending beside this lock that fit the write (a claim runs out with its
    /// holder: one claimed and not finished is claimed again by the next holder); those whose
    /// waiters stopped refreshing them are dropped, those for other content left.
    async fn claim_intents(&self, carrying: &Carrying<'_>) -> Result<Claimed> {
        yield_point(&self.probe).await;
        self.probe.count("blob:list");
        let now = tokio::time::Instant::now();
        let mut board = self.intents.lock().unwrap_or_else(|p| p.into_inner());
        let arriving = board
            .arrivals
            .values()
            .filter(|(lock, at)| *lock == self.name && now.duration_since(*at) <= ARRIVING)
            .count();
        let mut intents = Vec::new();
        if let Some(pending) = board.intents.get_mut(&self.name) {
            pending.retain(|p| {
                p.claimed_by_live().is_some()
                    || p.refreshed
                        .is_none_or(|at| now.duration_since(at) <= LIVENESS)
            });
            for p in pending.iter_mut() {
                let mine = p
                    .claimed_by_live()
                    .is_some_and(|l| Arc::ptr_eq(&l, &self.lease));
                p.intent.age = p
                    .refreshed
                    .map(|at| now.duration_since(at))
                    .unwrap_or_default();
                if mine || !p.intent.fits(carrying) {
                    continue;
                }
                p.claim = Some(Arc::downgrade(&self.lease));
                intents.push(p.intent.clone());
            }
        }
        Ok(Claimed { intents, arriving })
    }

    async fn finish_intents(&self, ids: &[String]) -> Result<()> {
        self.keep_pending(|i| !ids.contains(&i.id));
        Ok(())
    }

    async fn drop_intents_of(&self, reference: &str) -> Result<()> {
        self.keep_pending(|i| i.reference != reference);
        Ok(())
    }

    async fn discard_intent(&self, id: &str) -> Result<()> {
        yield_point(&self.probe).await;
        self.keep_pending(|i| i.id != id);
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
