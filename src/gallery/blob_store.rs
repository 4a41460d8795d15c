//! The `BlobStore` port (DESIGN.md §3), beside the domain's other ports (`GalleryApi`, `Locks`,
//! the record store), so the adapter that implements it imports no application floor. It is
//! everything the use cases need of blob storage, as one object: publish's stemcell blobs
//! (create, write pages, find, delete), partial-blob cleanup, completion marks and the upload
//! lock; and the reads and deletes of `ensure --blob-uri` (content, metadata, the VHD check),
//! `cleanup --blobs` and `delete` (a CID's blob). The Azure adapter is
//! [`crate::azure::stemcell_store::StemcellStore`]; unit tests use the in-memory [`fake`].
//!
//! No SDK type appears here; the port's plain data (page runs and their producer
//! [`page_runs_sink`], how progress shows, what an upload did, what a VHD source is) is its own,
//! and the adapter's uploader uses it. Errors are `anyhow` errors whose cause chain carries the
//! adapter's typed error unchanged (`BlobError`, `LockError`), so the one failure table
//! (`wiring::failure`) still decides exit codes and retryability from them.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::gallery::adopt::SourceContent;
use crate::stemcell::manifest::CloudProperties;

/// A run of data to write at `offset`. Offset and length are multiples of 512; the length may
/// exceed 4 MiB (the uploader splits it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRun {
    pub offset: u64,
    pub data: Bytes,
}

/// How the uploader reports progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// An indicatif bar on stderr (bytes, rate, ETA); falls back to `Log` when stderr is not a TTY.
    Tty,
    /// An info log line every so often.
    Log { every: Duration },
    /// Nothing.
    None,
}

/// What an upload did.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct UploadStats {
    /// Bytes of page data sent (zeros are never sent).
    pub bytes_sent: u64,
    /// Put Page requests that succeeded.
    pub requests: u64,
    /// Retries made by those requests.
    pub retries: u64,
    /// Wall time of the upload.
    pub seconds: f64,
}

/// A stemcell blob of a container, as the upload rules read it (`app::publish`): complete
/// (`upload_state=complete`: written whole and verified) or partial (`uploading`: interrupted, or
/// still in flight in another process), and the digests of the image it records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StemcellBlob {
    pub name: String,
    pub size: u64,
    pub complete: bool,
    /// The SHA-1 of the image it records (`image_sha1`; blobs written before issue 32 have none).
    pub image_sha1: Option<String>,
    /// The SHA-256 of the image it records (`image_sha256`; a partial blob whose writer knew
    /// only the SHA-1 has none).
    pub image_sha256: Option<String>,
    /// The stemcell version a complete blob records (the cloud property `version`).
    pub version: Option<String>,
    pub last_modified: time::OffsetDateTime,
}

/// The digests of the image a stemcell blob is created with: those known before its upload
/// (at least one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageDigests<'a> {
    pub sha1: Option<&'a str>,
    pub sha256: Option<&'a str>,
}

/// How to write the pages of one blob.
#[derive(Debug, Clone)]
pub struct WriteOptions {
    /// Put Page requests in flight (at least 1).
    pub concurrency: usize,
    pub progress: Progress,
}

/// What a complete stemcell blob records (the Azure CPI's metadata, plus the completion mark and
/// the image's SHA-1): the stemcell's cloud properties, its digests, and the gallery and
/// definition it is for.
#[derive(Debug, Clone)]
pub struct CompletionMarks<'a> {
    pub cloud_properties: &'a CloudProperties,
    pub image_sha1: &'a str,
    pub image_sha256: &'a str,
    pub gallery: &'a str,
    pub definition: &'a str,
}

/// A held upload lock: kept alive while held; give it back with [`UploadLock::release`] (a
/// holder that goes away without releasing leaves it to expire by itself).
#[async_trait::async_trait]
pub trait UploadLock: Send {
    async fn release(self: Box<Self>) -> anyhow::Result<()>;
}

/// What a blob is as the source of a gallery version (Azure takes a fixed VHD in a page blob
/// whose virtual size is a whole number of MiB, REFERENCE.md "Fixed VHD"; it refuses anything
/// else with `InvalidVhd`, after the PUT).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VhdSource {
    /// A fixed VHD page blob of this many bytes (virtual size + the 512-byte footer).
    Fixed { size: u64 },
    /// The blob does not exist.
    Missing,
    /// It exists, but is not one (why).
    Unfit(String),
}

/// Blob storage as the use cases see it: one storage account, containers of stemcell page blobs
/// named `bosh-stemcell-<uuid>.vhd`.
#[async_trait::async_trait]
pub trait BlobStore: Send + Sync {
    /// The blob's URI (without any SAS): what a gallery version's source names.
    fn blob_url(&self, container: &str, name: &str) -> String;

    /// The account's blob endpoint (`https://ACCOUNT.blob.core.windows.net/`, or the emulator's
    /// path-style one): what a URI of a blob of this account starts with
    /// (`config::resource::blob_in_account` splits one).
    fn endpoint(&self) -> &str;

    /// The storage account's name.
    fn account(&self) -> &str;

    /// The blob's metadata (the Azure CPI's and this tool's keys), `None` when it does not
    /// exist.
    async fn metadata(
        &self,
        container: &str,
        name: &str,
    ) -> anyhow::Result<Option<std::collections::HashMap<String, String>>>;

    /// What the blob is as the source of a gallery version, read without writing (its
    /// properties and its last 512 bytes).
    async fn check_vhd(&self, container: &str, name: &str) -> anyhow::Result<VhdSource>;

    /// Create the container if it is missing ("already exists" is success).
    async fn ensure_container(&self, container: &str) -> anyhow::Result<()>;

    /// Take the lock `name` in `container`, waiting up to `wait` for another holder; `lease` is
    /// how soon a crashed holder's lock frees itself (15–60 s).
    async fn lock(
        &self,
        container: &str,
        name: &str,
        wait: Duration,
        lease: Duration,
    ) -> anyhow::Result<Box<dyn UploadLock>>;

    /// Every stemcell blob of the container, complete or partial, in one listing (none when the
    /// container does not exist).
    async fn stemcell_blobs(&self, container: &str) -> anyhow::Result<Vec<StemcellBlob>>;

    /// Delete a blob; `false` when it was not there.
    async fn delete(&self, container: &str, name: &str) -> anyhow::Result<bool>;

    /// Create the page blob of `size` bytes, marked `uploading` and with the image's digests known
    /// so far, so an interrupted run's leftover is recognised (and only by a run holding the
    /// upload lock of one of them).
    async fn create(
        &self,
        container: &str,
        name: &str,
        size: u64,
        digests: ImageDigests<'_>,
    ) -> anyhow::Result<()>;

    /// Write every run received until the channel closes. On error `runs` is dropped (the
    /// producer's next send fails) and the partial blob stays for the caller to delete.
    async fn write_pages(
        &self,
        container: &str,
        name: &str,
        size: u64,
        runs: mpsc::Receiver<PageRun>,
        opts: &WriteOptions,
    ) -> anyhow::Result<UploadStats>;

    /// Mark the blob complete with `marks`, in one request; only after the last page was
    /// written and the image verified.
    async fn mark_complete(
        &self,
        container: &str,
        name: &str,
        marks: &CompletionMarks<'_>,
    ) -> anyhow::Result<()>;

    /// The content digest of the blob at `uri` (its data pages only), or what stood in the way:
    /// one side of a content proof (see `gallery::adopt`). `Err` only for a failure worth
    /// retrying.
    async fn content(&self, uri: &str) -> crate::gallery::error::Result<SourceContent>;
}

#[cfg(test)]
pub(crate) mod fake;

/// Why the producer side of an upload stopped ([`page_runs_sink`]).
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// A chunk came at an offset that is not a whole number of 512-byte sectors (a chunk after
    /// a final partial one).
    #[error("page run for the page blob at offset {offset} with {len} bytes is not a non-empty 512-byte-aligned range inside the blob's {size} bytes; this is a bug in the producer of the runs")]
    Unaligned { offset: u64, len: u64, size: u64 },
    /// The uploader (the receiving side) stopped; its own error says why.
    #[error("the page uploader for the page blob stopped before all runs were handed over (its own error says why)")]
    UploaderGone,
}

/// A bug in the producer, or an uploader that stopped for a reason of its own: the same on a
/// retry.
impl crate::error::Classified for SinkError {
    fn class(&self) -> crate::error::Class {
        match self {
            SinkError::Unaligned { .. } | SinkError::UploaderGone => crate::error::Class::Permanent,
        }
    }
}

/// The producer side of [`BlobStore::write_pages`]: a closure `(offset, chunk)` that sends the
/// chunk's non-zero sectors as maximal runs with `blocking_send` (call it from `spawn_blocking`,
/// never from async code). The runs are `stemcell::vhd::nonzero_runs`'s, so a sparse VHD uploads
/// only its data.
///
/// `offset` must be a multiple of 512. A chunk whose length is not a multiple of 512 is treated as
/// the last one: its final partial sector is zero-padded (exact, since a page blob reads as zeros);
/// a further chunk after it would have an unaligned offset and is refused. Fails with
/// [`SinkError::UploaderGone`] when the uploader has stopped (its own error tells why).
pub fn page_runs_sink(
    tx: mpsc::Sender<PageRun>,
) -> impl FnMut(u64, &[u8]) -> Result<(), SinkError> {
    const SECTOR: u64 = 512;
    move |offset: u64, chunk: &[u8]| {
        if !offset.is_multiple_of(SECTOR) {
            return Err(SinkError::Unaligned {
                offset,
                len: chunk.len() as u64,
                size: offset + chunk.len() as u64,
            });
        }
        for run in crate::stemcell::vhd::nonzero_runs(chunk, offset) {
            let (start, end) = ((run.start - offset) as usize, (run.end - offset) as usize);
            let mut data = Vec::with_capacity((end - start).next_multiple_of(SECTOR as usize));
            data.extend_from_slice(&chunk[start..end]);
            data.resize(data.len().next_multiple_of(SECTOR as usize), 0);
            let run = PageRun {
                offset: run.start,
                data: Bytes::from(data),
            };
            if tx.blocking_send(run).is_err() {
                return Err(SinkError::UploaderGone);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_sends_only_nonzero_runs_at_absolute_offsets() {
        let (tx, mut rx) = mpsc::channel(16);
        let mut sink = page_runs_sink(tx);
        let mut chunk = vec![0u8; 4096];
        chunk[512] = 1; // sector 1
        chunk[1024] = 2; // sector 2 (same run)
        chunk[3584] = 3; // sector 7
        sink(1 << 20, &chunk).expect("send");
        // A final unaligned chunk is zero-padded to its sector.
        sink((1 << 20) + 4096, &[9u8; 100]).expect("tail");
        drop(sink);
        let mut got = Vec::new();
        while let Some(run) = rx.blocking_recv() {
            got.push((run.offset, run.data.len(), run.data[0]));
        }
        assert_eq!(
            got,
            vec![
                ((1 << 20) + 512, 1024, 1),
                ((1 << 20) + 3584, 512, 3),
                ((1 << 20) + 4096, 512, 9)
            ]
        );
    }

    #[test]
    fn sink_refuses_unaligned_offsets_and_reports_a_stopped_uploader() {
        let (tx, rx) = mpsc::channel(1);
        let mut sink = page_runs_sink(tx);
        assert!(matches!(
            sink(100, &[1u8; 512]),
            Err(SinkError::Unaligned { .. })
        ));
        drop(rx);
        assert!(matches!(sink(0, &[1u8; 512]), Err(SinkError::UploaderGone)));
        // All-zero chunks need no uploader at all.
        assert!(sink(512, &[0u8; 4096]).is_ok());
    }

    #[test]
    fn zero_check_sees_a_single_bit_anywhere() {
        let runs = |s: &[u8]| crate::stemcell::vhd::nonzero_runs(s, 0).count();
        let mut s = vec![0u8; 512];
        assert_eq!(runs(&s), 0);
        for i in [0, 7, 8, 255, 504, 511] {
            s[i] = 1;
            assert_eq!(runs(&s), 1, "byte {i}");
            s[i] = 0;
        }
        assert_eq!(runs(&[0, 0, 0, 1]), 1);
    }
}
