//! `FakeStore`: an in-memory test double of the [`BlobStore`] port, for unit tests of the use
//! cases over it (not an Azure implementation: no leases expire, nothing is persisted). It keeps
//! each blob's size, metadata and bytes written, a log of the calls made, and can refuse page
//! writes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use super::{
    BlobStore, CompletionMarks, ImageDigests, PageRun, StemcellBlob, UploadLock, UploadStats,
    VhdSource, WriteOptions,
};
use crate::gallery::adopt::SourceContent;

const UPLOAD_STATE: &str = "upload_state";
const IMAGE_SHA256: &str = "image_sha256";
const IMAGE_SHA1: &str = "image_sha1";

/// One blob of the fake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FakeBlob {
    pub size: u64,
    pub metadata: BTreeMap<String, String>,
    /// Page bytes written.
    pub written: u64,
    /// Order of the last change (higher: newer).
    pub modified: u64,
}

impl FakeBlob {
    pub fn is_complete(&self) -> bool {
        self.metadata.get(UPLOAD_STATE).map(String::as_str) == Some("complete")
    }
}

#[derive(Default)]
struct State {
    blobs: BTreeMap<(String, String), FakeBlob>,
    clock: u64,
    calls: Vec<String>,
    fail_writes: bool,
    /// Run on the blobs when the next page write begins (another writer acting meanwhile).
    on_write: Option<Box<Blobs>>,
}

type Blobs = dyn FnOnce(&mut BTreeMap<(String, String), FakeBlob>) + Send;

#[derive(Default)]
pub(crate) struct FakeStore {
    state: Mutex<State>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl FakeStore {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn call(&self, what: String) {
        self.state().calls.push(what);
    }

    /// Add a stemcell blob as an earlier run left it: complete (marked) or partial, recording
    /// `metadata` (e.g. `image_sha256`, `image_sha1`, `version`).
    pub fn put(
        &self,
        container: &str,
        name: &str,
        size: u64,
        complete: bool,
        metadata: &[(&str, &str)],
    ) {
        let mut st = self.state();
        st.clock += 1;
        let mut all = BTreeMap::from([(
            UPLOAD_STATE.to_string(),
            if complete { "complete" } else { "uploading" }.to_string(),
        )]);
        for (k, v) in metadata {
            all.insert(k.to_string(), v.to_string());
        }
        let modified = st.clock;
        st.blobs.insert(
            (container.to_string(), name.to_string()),
            FakeBlob {
                size,
                metadata: all,
                written: 0,
                modified,
            },
        );
    }

    /// Every blob, by (container, name).
    pub fn blobs(&self) -> BTreeMap<(String, String), FakeBlob> {
        self.state().blobs.clone()
    }

    /// The calls made, oldest first (`create container/name`, `delete container/name`, …).
    pub fn calls(&self) -> Vec<String> {
        self.state().calls.clone()
    }

    /// Change the blobs when the next page write begins, as another writer would meanwhile.
    pub fn when_writing(
        &self,
        change: impl FnOnce(&mut BTreeMap<(String, String), FakeBlob>) + Send + 'static,
    ) {
        self.state().on_write = Some(Box::new(change));
    }

    /// Refuse every page write from now on (the uploader fails after taking one run).
    pub fn fail_writes(&self) {
        self.state().fail_writes = true;
    }
}

struct FakeLock(#[allow(dead_code)] tokio::sync::OwnedMutexGuard<()>);

#[async_trait::async_trait]
impl UploadLock for FakeLock {
    async fn release(self: Box<Self>) -> anyhow::Result<()> {
        Ok(())
    }
}

#[async_trait::async_trait]
impl BlobStore for FakeStore {
    fn blob_url(&self, container: &str, name: &str) -> String {
        format!("https://fake.blob.core.windows.net/{container}/{name}")
    }

    fn endpoint(&self) -> &str {
        "https://fake.blob.core.windows.net/"
    }

    fn account(&self) -> &str {
        "fake"
    }

    async fn metadata(
        &self,
        container: &str,
        name: &str,
    ) -> anyhow::Result<Option<HashMap<String, String>>> {
        self.call(format!("metadata {container}/{name}"));
        let key = (container.to_string(), name.to_string());
        Ok(self
            .state()
            .blobs
            .get(&key)
            .map(|b| b.metadata.clone().into_iter().collect()))
    }

    /// The fake keeps no bytes: a blob that exists is a fixed VHD of its size.
    async fn check_vhd(&self, container: &str, name: &str) -> anyhow::Result<VhdSource> {
        self.call(format!("check_vhd {container}/{name}"));
        let key = (container.to_string(), name.to_string());
        Ok(match self.state().blobs.get(&key) {
            Some(b) => VhdSource::Fixed { size: b.size },
            None => VhdSource::Missing,
        })
    }

    async fn ensure_container(&self, container: &str) -> anyhow::Result<()> {
        self.call(format!("ensure_container {container}"));
        Ok(())
    }

    async fn lock(
        &self,
        container: &str,
        name: &str,
        wait: Duration,
        _lease: Duration,
    ) -> anyhow::Result<Box<dyn UploadLock>> {
        self.call(format!("lock {container}/{name}"));
        let m = {
            let mut map = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(format!("{container}/{name}"))
                .or_default()
                .clone()
        };
        match tokio::time::timeout(wait, m.lock_owned()).await {
            Ok(guard) => Ok(Box::new(FakeLock(guard))),
            Err(_) => anyhow::bail!("fake: lock {container}/{name} is held"),
        }
    }

    async fn stemcell_blobs(&self, container: &str) -> anyhow::Result<Vec<StemcellBlob>> {
        self.call(format!("stemcell_blobs {container}"));
        let st = self.state();
        Ok(st
            .blobs
            .iter()
            .filter(|((c, _), _)| c == container)
            .map(|((_, name), b)| StemcellBlob {
                name: name.clone(),
                size: b.size,
                complete: b.is_complete(),
                image_sha1: b.metadata.get(IMAGE_SHA1).cloned(),
                image_sha256: b.metadata.get(IMAGE_SHA256).cloned(),
                version: b.metadata.get("version").cloned(),
                last_modified: time::OffsetDateTime::UNIX_EPOCH
                    + time::Duration::seconds(b.modified as i64),
            })
            .collect())
    }

    async fn delete(&self, container: &str, name: &str) -> anyhow::Result<bool> {
        self.call(format!("delete {container}/{name}"));
        let key = (container.to_string(), name.to_string());
        Ok(self.state().blobs.remove(&key).is_some())
    }

    async fn create(
        &self,
        container: &str,
        name: &str,
        size: u64,
        digests: ImageDigests<'_>,
    ) -> anyhow::Result<()> {
        self.call(format!("create {container}/{name}"));
        let mut metadata = Vec::new();
        if let Some(d) = digests.sha1 {
            metadata.push((IMAGE_SHA1, d));
        }
        if let Some(d) = digests.sha256 {
            metadata.push((IMAGE_SHA256, d));
        }
        self.put(container, name, size, false, &metadata);
        Ok(())
    }

    async fn write_pages(
        &self,
        container: &str,
        name: &str,
        size: u64,
        mut runs: mpsc::Receiver<PageRun>,
        _opts: &WriteOptions,
    ) -> anyhow::Result<UploadStats> {
        self.call(format!("write_pages {container}/{name}"));
        let key = (container.to_string(), name.to_string());
        let mut stats = UploadStats::default();
        {
            let mut st = self.state();
            if let Some(change) = st.on_write.take() {
                change(&mut st.blobs);
            }
        }
        while let Some(run) = runs.recv().await {
            let mut st = self.state();
            if st.fail_writes {
                anyhow::bail!("fake: Put Page on {container}/{name} refused");
            }
            let Some(blob) = st.blobs.get_mut(&key) else {
                anyhow::bail!("fake: {container}/{name} does not exist");
            };
            if blob.size != size || run.offset + run.data.len() as u64 > size {
                anyhow::bail!("fake: run at {} outside {container}/{name}", run.offset);
            }
            blob.written += run.data.len() as u64;
            stats.bytes_sent += run.data.len() as u64;
            stats.requests += 1;
        }
        Ok(stats)
    }

    async fn mark_complete(
        &self,
        container: &str,
        name: &str,
        marks: &CompletionMarks<'_>,
    ) -> anyhow::Result<()> {
        self.call(format!("mark_complete {container}/{name}"));
        let mut st = self.state();
        st.clock += 1;
        let modified = st.clock;
        let Some(blob) = st.blobs.get_mut(&(container.to_string(), name.to_string())) else {
            anyhow::bail!("fake: {container}/{name} does not exist");
        };
        blob.metadata = BTreeMap::from([
            (UPLOAD_STATE.to_string(), "complete".to_string()),
            (IMAGE_SHA256.to_string(), marks.image_sha256.to_string()),
            (IMAGE_SHA1.to_string(), marks.image_sha1.to_string()),
            (
                "version".to_string(),
                marks.cloud_properties.version.clone().unwrap_or_default(),
            ),
            (
                "compute_gallery_image_definition".to_string(),
                marks.definition.to_string(),
            ),
        ]);
        blob.modified = modified;
        Ok(())
    }

    async fn content(&self, uri: &str) -> crate::gallery::error::Result<SourceContent> {
        self.call(format!("content {uri}"));
        let Some(rest) = uri.strip_prefix("https://fake.blob.core.windows.net/") else {
            return Ok(SourceContent::Unreadable("not in the fake account".into()));
        };
        let Some((container, name)) = rest.split_once('/') else {
            return Ok(SourceContent::Gone);
        };
        let key = (container.to_string(), name.to_string());
        Ok(match self.state().blobs.get(&key) {
            Some(_) => SourceContent::Unreadable("the fake keeps no content".into()),
            None => SourceContent::Gone,
        })
    }
}
