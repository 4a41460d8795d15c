//! Records in memory, for tests and the in-process locks.

use std::collections::BTreeMap;

use super::{RecordStore, Stored};
use crate::gallery::error::Result;

/// Records in memory (tests and the in-process locks): ETags are generation counters.
#[derive(Default)]
pub struct MemoryRecords {
    blobs: std::sync::Mutex<BTreeMap<String, (Vec<u8>, u64)>>,
    next: std::sync::atomic::AtomicU64,
}

impl MemoryRecords {
    /// Replace or remove a blob behind the writers' backs (tests: damage, deletion).
    pub fn tamper(&self, name: &str, body: Option<&[u8]>) {
        let mut blobs = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
        match body {
            Some(b) => {
                let n = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                blobs.insert(name.to_string(), (b.to_vec(), 1_000_000 + n));
            }
            None => {
                blobs.remove(name);
            }
        }
    }

    /// The body of blob `name` (tests).
    pub fn body(&self, name: &str) -> Option<Vec<u8>> {
        let blobs = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
        blobs.get(name).map(|(b, _)| b.clone())
    }
}

#[async_trait::async_trait]
impl RecordStore for MemoryRecords {
    async fn get(&self, name: &str) -> Result<Option<Stored>> {
        let blobs = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
        Ok(blobs.get(name).map(|(b, e)| Stored {
            body: b.clone(),
            etag: e.to_string(),
        }))
    }

    async fn put_if(
        &self,
        name: &str,
        body: &[u8],
        expect: Option<&str>,
    ) -> Result<Option<String>> {
        let mut blobs = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
        let current = blobs.get(name).map(|(_, e)| e.to_string());
        if current.as_deref() != expect {
            return Ok(None);
        }
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        blobs.insert(name.to_string(), (body.to_vec(), n));
        Ok(Some(n.to_string()))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let blobs = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
        Ok(blobs
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect())
    }
}
