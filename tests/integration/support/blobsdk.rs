//! The blob calls the tests make, on azure_storage_blob 1.x through the project's clients
//! ([`Container`], [`Blob`]: our retry, Shared Key and bearer steps), in the shapes the tests
//! use: inclusive page ranges, metadata as pairs, lease ids as strings.

use std::collections::HashMap;
use std::num::NonZero;

use azure_core::http::Etag;
use azure_storage_blob::models::{
    BlobClientAcquireLeaseOptions, BlobClientAcquireLeaseResultHeaders,
    BlobClientBreakLeaseOptions, BlobClientDownloadOptions, BlobClientGetPropertiesResultHeaders,
    BlobContainerClientListBlobsOptions, BlockBlobClientUploadOptions, HttpRange, LeaseState,
    ListBlobsIncludeItem, PageBlobClientCreateOptions,
};
use futures::StreamExt;
use stemcell_gallery::azure::blob::{Blob, Container};

/// An SDK error's status and storage error code (panics on any other error).
pub fn code_of(err: &azure_core::Error) -> (u16, String) {
    match err.kind() {
        azure_core::error::ErrorKind::HttpResponse {
            status, error_code, ..
        } => (u16::from(*status), error_code.clone().unwrap_or_default()),
        other => panic!("expected an HTTP error, got {other:?}: {err}"),
    }
}

/// What Get Blob Properties says.
#[derive(Debug, Clone)]
pub struct Props {
    pub content_length: u64,
    pub metadata: HashMap<String, String>,
    pub lease_state: Option<LeaseState>,
}

/// A listed blob.
#[derive(Debug, Clone)]
pub struct Listed {
    pub name: String,
    pub metadata: HashMap<String, String>,
    pub lease_state: Option<LeaseState>,
}

fn meta(pairs: &[(&str, &str)]) -> Option<HashMap<String, String>> {
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

#[async_trait::async_trait]
pub trait ContainerExt {
    /// Create Container.
    async fn create(&self) -> azure_core::Result<()>;
    /// Get Container Properties (only whether it answers).
    async fn properties(&self) -> azure_core::Result<()>;
    /// List Blobs with metadata, every page.
    async fn list(&self) -> azure_core::Result<Vec<Listed>>;
}

#[async_trait::async_trait]
impl ContainerExt for Container {
    async fn create(&self) -> azure_core::Result<()> {
        self.client().create(None).await.map(|_| ())
    }

    async fn properties(&self) -> azure_core::Result<()> {
        self.client().get_properties(None).await.map(|_| ())
    }

    async fn list(&self) -> azure_core::Result<Vec<Listed>> {
        let mut pages = self
            .client()
            .list_blobs(Some(BlobContainerClientListBlobsOptions {
                include: Some(vec![ListBlobsIncludeItem::Metadata]),
                ..Default::default()
            }))?
            .into_pages();
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            for b in page?.into_model()?.blob_items {
                out.push(Listed {
                    name: b.name.clone().unwrap_or_default(),
                    metadata: b
                        .metadata
                        .as_ref()
                        .and_then(|m| m.values.clone())
                        .unwrap_or_default(),
                    lease_state: b.properties.as_ref().and_then(|p| p.lease_state),
                });
            }
        }
        Ok(out)
    }
}

#[async_trait::async_trait]
pub trait BlobExt {
    /// Create a page blob of `size` bytes with metadata.
    async fn put_page_blob(&self, size: u64, metadata: &[(&str, &str)]) -> azure_core::Result<()>;
    /// Put Page over the inclusive byte range `first..=last`.
    async fn put_page(&self, first: u64, last: u64, data: Vec<u8>) -> azure_core::Result<()>;
    /// Put Page (clear) over the inclusive byte range `first..=last`.
    async fn clear_page(&self, first: u64, last: u64) -> azure_core::Result<()>;
    /// Put Blob (block blob), optionally `If-None-Match: *` and with a lease id.
    async fn put_block_blob(
        &self,
        data: Vec<u8>,
        if_none_match_any: bool,
        lease_id: Option<&str>,
        metadata: &[(&str, &str)],
    ) -> azure_core::Result<()>;
    /// Get Blob Properties.
    async fn properties(&self) -> azure_core::Result<Props>;
    /// Get Page Ranges, every page, inclusive ends as the service reports them.
    async fn raw_page_ranges(&self) -> azure_core::Result<Vec<(u64, u64)>>;
    /// Get Blob over `start..end` (exclusive end), or the whole blob.
    async fn read(&self, range: Option<(u64, u64)>) -> azure_core::Result<Vec<u8>>;
    /// Acquire Lease; the lease id.
    async fn acquire_lease(&self, secs: i32) -> azure_core::Result<String>;
    async fn renew_lease(&self, lease_id: &str) -> azure_core::Result<()>;
    async fn release_lease(&self, lease_id: &str) -> azure_core::Result<()>;
    /// Break Lease with a zero break period.
    async fn break_lease_now(&self) -> azure_core::Result<()>;
    /// Delete Blob.
    async fn delete(&self) -> azure_core::Result<()>;
}

#[async_trait::async_trait]
impl BlobExt for Blob {
    async fn put_page_blob(&self, size: u64, metadata: &[(&str, &str)]) -> azure_core::Result<()> {
        self.page_blob()
            .create(
                size,
                Some(PageBlobClientCreateOptions {
                    metadata: meta(metadata),
                    ..Default::default()
                }),
            )
            .await
            .map(|_| ())
    }

    async fn put_page(&self, first: u64, last: u64, data: Vec<u8>) -> azure_core::Result<()> {
        let len = data.len() as u64;
        self.page_blob()
            .upload_pages(
                bytes::Bytes::from(data).into(),
                len,
                HttpRange::new(first, last + 1 - first),
                None,
            )
            .await
            .map(|_| ())
    }

    async fn clear_page(&self, first: u64, last: u64) -> azure_core::Result<()> {
        self.page_blob()
            .clear_pages(HttpRange::new(first, last + 1 - first), None)
            .await
            .map(|_| ())
    }

    async fn put_block_blob(
        &self,
        data: Vec<u8>,
        if_none_match_any: bool,
        lease_id: Option<&str>,
        metadata: &[(&str, &str)],
    ) -> azure_core::Result<()> {
        self.block_blob()
            .upload(
                bytes::Bytes::from(data).into(),
                Some(BlockBlobClientUploadOptions {
                    if_none_match: if_none_match_any.then(|| Etag::from("*")),
                    lease_id: lease_id.map(str::to_string),
                    metadata: meta(metadata),
                    ..Default::default()
                }),
            )
            .await
            .map(|_| ())
    }

    async fn properties(&self) -> azure_core::Result<Props> {
        let p = self.client().get_properties(None).await?;
        Ok(Props {
            content_length: p.content_length()?.unwrap_or(0),
            metadata: p.metadata()?,
            lease_state: p.lease_state()?,
        })
    }

    async fn raw_page_ranges(&self) -> azure_core::Result<Vec<(u64, u64)>> {
        let mut pages = self.page_blob().list_page_ranges(None)?;
        let mut out = Vec::new();
        while let Some(page) = pages.next().await {
            for r in page?.into_model()?.page_ranges {
                let (Some(s), Some(e)) = (r.start, r.end) else {
                    panic!("unexpected open page range {r:?}");
                };
                out.push((s as u64, e as u64));
            }
        }
        Ok(out)
    }

    async fn read(&self, range: Option<(u64, u64)>) -> azure_core::Result<Vec<u8>> {
        let resp = self
            .client()
            .download(Some(BlobClientDownloadOptions {
                range: range.map(|(s, e)| HttpRange::new(s, e - s)),
                parallel: NonZero::new(1),
                partition_size: NonZero::new(8 * 1024 * 1024),
                ..Default::default()
            }))
            .await?;
        Ok(resp.body.collect().await?.to_vec())
    }

    async fn acquire_lease(&self, secs: i32) -> azure_core::Result<String> {
        let resp = self
            .client()
            .acquire_lease(secs, Some(BlobClientAcquireLeaseOptions::default()))
            .await?;
        Ok(resp
            .lease_id()?
            .expect("Acquire Lease answers the lease id"))
    }

    async fn renew_lease(&self, lease_id: &str) -> azure_core::Result<()> {
        self.client()
            .renew_lease(lease_id.to_string(), None)
            .await
            .map(|_| ())
    }

    async fn release_lease(&self, lease_id: &str) -> azure_core::Result<()> {
        self.client()
            .release_lease(lease_id.to_string(), None)
            .await
            .map(|_| ())
    }

    async fn break_lease_now(&self) -> azure_core::Result<()> {
        self.client()
            .break_lease(Some(BlobClientBreakLeaseOptions {
                break_period: Some(0),
                ..Default::default()
            }))
            .await
            .map(|_| ())
    }

    async fn delete(&self) -> azure_core::Result<()> {
        self.client().delete(None).await.map(|_| ())
    }
}
