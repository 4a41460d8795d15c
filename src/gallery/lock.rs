//! Cross-host serialisation of writes to one version. The real implementation is a blob lease on
//! a lock blob in the configured storage account (`azure::lock`); `LocalLocks` serialises tasks of
//! one process only and exists for unit tests with in-memory fakes.

use std::collections::HashMap;
use std::sync::Arc;

use super::error::Result;

#[async_trait::async_trait]
pub trait Locks: Send + Sync {
    /// Take the named lock, waiting a bounded time.
    async fn acquire(&self, name: &str) -> Result<Box<dyn Held>>;
}

#[async_trait::async_trait]
pub trait Held: Send {
    /// Release the lock (best effort: an unreleased lease simply expires).
    async fn release(self: Box<Self>);
}

/// In-process locks (tests only: not safe across processes or hosts).
#[derive(Default)]
pub struct LocalLocks {
    map: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

struct LocalHeld(#[allow(dead_code)] tokio::sync::OwnedMutexGuard<()>);

#[async_trait::async_trait]
impl Held for LocalHeld {
    async fn release(self: Box<Self>) {}
}

#[async_trait::async_trait]
impl Locks for LocalLocks {
    async fn acquire(&self, name: &str) -> Result<Box<dyn Held>> {
        let m = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(name.to_string()).or_default().clone()
        };
        Ok(Box::new(LocalHeld(m.lock_owned().await)))
    }
}

/// The lock name for one version key of one definition.
pub fn version_lock_name(gallery: &str, definition: &str, version: &str) -> String {
    format!("locks/{gallery}/{definition}/{version}.lock")
}
