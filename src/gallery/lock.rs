//! Cross-host serialisation of writes to one version. The real implementation is a blob lease on
//! a lock blob in the configured storage account (`azure::lock`); `LocalLocks` serialises tasks of
//! one process only and exists for unit tests with in-memory fakes.
//!
//! A held lock also keeps one small durable note for its version: the references carried from a
//! Failed version that is being replaced (see [`Held::carried`]). It lives next to the lock (for
//! the blob lease: the blob `<lock blob>.carried`), is written only by the lock's holder, and
//! survives the process: a re-run after a failed re-create or a SIGKILL finds it.

use std::collections::HashMap;
use std::sync::Arc;

use super::error::Result;

#[async_trait::async_trait]
pub trait Locks: Send + Sync {
    /// Take the named lock, waiting a bounded time.
    async fn acquire(&self, name: &str) -> Result<Box<dyn Held>>;
}

#[async_trait::async_trait]
pub trait Held: Send + Sync {
    /// Make sure the lock is still ours right now (the lease is renewed): call right before every
    /// write it guards. `Err(Error::Lock)` once another holder took it (a stalled process whose
    /// lease ran out): the caller must not write, and observes again under a new lock.
    async fn check(&self) -> Result<()>;
    /// The references carried from a replaced Failed version of this lock's version, recorded
    /// durably before that version was deleted (empty when none).
    async fn carried(&self) -> Result<Vec<String>>;
    /// Replace the carried references (empty: remove the note).
    async fn set_carried(&self, refs: &[String]) -> Result<()>;
    /// Release the lock (best effort: an unreleased lease simply expires).
    async fn release(self: Box<Self>);
}

type Notes = Arc<std::sync::Mutex<HashMap<String, Vec<String>>>>;

/// In-process locks (tests only: not safe across processes or hosts).
#[derive(Default)]
pub struct LocalLocks {
    map: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    notes: Notes,
}

struct LocalHeld {
    _guard: tokio::sync::OwnedMutexGuard<()>,
    name: String,
    notes: Notes,
}

#[async_trait::async_trait]
impl Held for LocalHeld {
    async fn check(&self) -> Result<()> {
        Ok(())
    }
    async fn carried(&self) -> Result<Vec<String>> {
        let notes = self.notes.lock().unwrap_or_else(|p| p.into_inner());
        Ok(notes.get(&self.name).cloned().unwrap_or_default())
    }
    async fn set_carried(&self, refs: &[String]) -> Result<()> {
        let mut notes = self.notes.lock().unwrap_or_else(|p| p.into_inner());
        if refs.is_empty() {
            notes.remove(&self.name);
        } else {
            notes.insert(self.name.clone(), refs.to_vec());
        }
        Ok(())
    }
    async fn release(self: Box<Self>) {}
}

#[async_trait::async_trait]
impl Locks for LocalLocks {
    async fn acquire(&self, name: &str) -> Result<Box<dyn Held>> {
        let m = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(name.to_string()).or_default().clone()
        };
        Ok(Box::new(LocalHeld {
            _guard: m.lock_owned().await,
            name: name.to_string(),
            notes: self.notes.clone(),
        }))
    }
}

/// The lock name for one version key of one definition.
pub fn version_lock_name(gallery: &str, definition: &str, version: &str) -> String {
    format!("locks/{gallery}/{definition}/{version}.lock")
}
