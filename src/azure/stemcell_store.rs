//! The Azure adapter of the `BlobStore` port ([`crate::gallery::blob_store`]): stemcell page blobs,
//! their metadata marks and the upload lease lock, in one storage account, over the page-blob
//! functions of [`crate::azure::blob`] and the lease lock of [`crate::azure::lock`].

use std::time::Duration;

use azure_storage_blob::models::PageBlobClientCreateOptions;
use tokio::sync::mpsc;

use crate::access::blob_in_account;
use crate::azure::blob::{
    self, content_digest, BlobError, StorageTarget, UploadOptions, META_IMAGE_SHA1,
    META_IMAGE_SHA256, META_UPLOAD_STATE, UPLOAD_STATE_UPLOADING,
};
use crate::azure::lock::{LeaseGuard, LeaseLock};
use crate::error::Classified;
use crate::gallery::adopt::SourceContent;
use crate::gallery::blob_store::{
    BlobStore, CompletionMarks, ImageDigests, PageRun, StemcellBlob, UploadLock, UploadStats,
    WriteOptions,
};

/// Stemcell blobs in one storage account.
#[derive(Debug, Clone)]
pub struct StemcellStore {
    target: StorageTarget,
}

impl StemcellStore {
    pub fn new(target: StorageTarget) -> Self {
        Self { target }
    }

    /// The storage account it writes to.
    pub fn target(&self) -> &StorageTarget {
        &self.target
    }
}

struct Lease(LeaseGuard);

#[async_trait::async_trait]
impl UploadLock for Lease {
    async fn release(self: Box<Self>) -> anyhow::Result<()> {
        Ok(self.0.release().await?)
    }
}

#[async_trait::async_trait]
impl BlobStore for StemcellStore {
    fn blob_url(&self, container: &str, name: &str) -> String {
        self.target.blob_url(container, name)
    }

    fn endpoint(&self) -> &str {
        self.target.endpoint()
    }

    fn account(&self) -> &str {
        self.target.account_name()
    }

    async fn metadata(
        &self,
        container: &str,
        name: &str,
    ) -> anyhow::Result<Option<std::collections::HashMap<String, String>>> {
        let client = self.target.container(container).blob_client(name);
        Ok(blob::blob_properties(&client).await?.map(|(_, m, _)| m))
    }

    async fn check_vhd(
        &self,
        container: &str,
        name: &str,
    ) -> anyhow::Result<crate::gallery::blob_store::VhdSource> {
        let client = self.target.container(container).blob_client(name);
        Ok(blob::check_vhd_source(&client).await?)
    }

    async fn ensure_container(&self, container: &str) -> anyhow::Result<()> {
        Ok(blob::ensure_container(&self.target.container(container)).await?)
    }

    async fn lock(
        &self,
        container: &str,
        name: &str,
        wait: Duration,
        lease: Duration,
    ) -> anyhow::Result<Box<dyn UploadLock>> {
        let container = self.target.container(container);
        let guard = LeaseLock::acquire_with_lease(&container, name, wait, lease).await?;
        Ok(Box::new(Lease(guard)))
    }

    async fn stemcell_blobs(&self, container: &str) -> anyhow::Result<Vec<StemcellBlob>> {
        let found = blob::list_stemcell_blobs(&self.target.container(container)).await?;
        Ok(found
            .into_iter()
            .map(|b| StemcellBlob {
                complete: b.is_complete(),
                image_sha1: b.metadata.get(META_IMAGE_SHA1).cloned(),
                image_sha256: b.metadata.get(META_IMAGE_SHA256).cloned(),
                version: b.metadata.get("version").cloned(),
                size: b.size,
                last_modified: b.last_modified,
                name: b.name,
            })
            .collect())
    }

    async fn delete(&self, container: &str, name: &str) -> anyhow::Result<bool> {
        let client = self.target.container(container).blob_client(name);
        Ok(blob::delete_blob_if_exists(&client).await?)
    }

    async fn create(
        &self,
        container: &str,
        name: &str,
        size: u64,
        digests: ImageDigests<'_>,
    ) -> anyhow::Result<()> {
        let client = self.target.container(container).blob_client(name);
        let mut metadata = std::collections::HashMap::from([(
            META_UPLOAD_STATE.to_string(),
            UPLOAD_STATE_UPLOADING.to_string(),
        )]);
        for (key, digest) in [
            (META_IMAGE_SHA1, digests.sha1),
            (META_IMAGE_SHA256, digests.sha256),
        ] {
            if let Some(digest) = digest {
                metadata.insert(key.to_string(), digest.to_string());
            }
        }
        client
            .page_blob()
            .create(
                size,
                Some(PageBlobClientCreateOptions {
                    metadata: Some(metadata),
                    ..Default::default()
                }),
            )
            .await
            .map_err(|e| BlobError::request("create page blob", blob::blob_path(&client), e))?;
        Ok(())
    }

    async fn write_pages(
        &self,
        container: &str,
        name: &str,
        size: u64,
        runs: mpsc::Receiver<PageRun>,
        opts: &WriteOptions,
    ) -> anyhow::Result<UploadStats> {
        let client = self.target.container(container).blob_client(name);
        let upload = UploadOptions {
            concurrency: opts.concurrency.max(1),
            progress: opts.progress.clone(),
            ..UploadOptions::default()
        };
        Ok(blob::upload_page_blob(&client, size, runs, &upload).await?)
    }

    async fn mark_complete(
        &self,
        container: &str,
        name: &str,
        marks: &CompletionMarks<'_>,
    ) -> anyhow::Result<()> {
        let client = self.target.container(container).blob_client(name);
        let mut metadata = blob::stemcell_blob_metadata(
            &marks.cloud_properties.to_json(),
            marks.image_sha256,
            marks.gallery,
            marks.definition,
        );
        // Ours beside the CPI's keys: what a later upload of the same stemcell, knowing only the
        // SHA-1 its manifest declares, recognises this blob by.
        metadata.insert(META_IMAGE_SHA1.to_string(), marks.image_sha1.to_string());
        Ok(blob::mark_complete(&client, &metadata).await?)
    }

    async fn content(&self, uri: &str) -> crate::gallery::error::Result<SourceContent> {
        content_at(&self.target, uri).await
    }
}

/// The content digest of the blob at `uri` in storage account `storage` (its data pages only),
/// or what stood in the way. A transient failure (already retried by the pipeline) is an error
/// worth retrying, not evidence that the blob cannot be read.
pub async fn content_at(
    storage: &StorageTarget,
    uri: &str,
) -> crate::gallery::error::Result<SourceContent> {
    let Some((container, name)) = blob_in_account(storage.endpoint(), uri) else {
        return Ok(SourceContent::Unreadable(format!(
            "it is not in the configured storage account {}",
            storage.account_name()
        )));
    };
    let client = storage.container(&container).blob_client(&name);
    match content_digest(&client).await {
        Ok(Some(c)) => {
            tracing::info!(blob = %blob::blob_path(&client), bytes_read = c.bytes_read, size = c.size, "read the data pages of the blob for its content digest");
            Ok(SourceContent::Digest(c.digest))
        }
        Ok(None) => Ok(SourceContent::Gone),
        Err(e) if e.class().retryable() => Err(crate::gallery::Error::Transport {
            operation: "reading the content",
            resource: blob::blob_path(&client),
            message: e.to_string(),
        }),
        Err(e) => Ok(SourceContent::Unreadable(e.to_string())),
    }
}
