//! The `BlobStore` port (DESIGN.md §3), beside the domain's other ports (`GalleryApi`, `Locks`,
//! the record store), so the adapter that implements it imports no application floor: everything
//! the publish use case needs of blob storage,
//! as one object — stemcell blobs (create, write pages, find, delete), partial-blob cleanup,
//! completion marks and the upload lock. The Azure adapter is
//! [`crate::azure::stemcell_store::StemcellStore`]; unit tests use the in-memory [`fake`].
//!
//! No SDK type appears here; the port's plain data (page runs, how progress shows, what an
//! upload did) is its own, and the adapter's uploader uses it. Errors are `anyhow` errors whose cause chain carries the adapter's
//! typed error unchanged (`BlobError`, `LockError`), so the one failure table
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

/// Blob storage as the publish use case sees it: one storage account, containers of stemcell
/// page blobs named `bosh-stemcell-<uuid>.vhd`.
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
