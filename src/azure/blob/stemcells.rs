//! Stemcell blobs in a container: listing with metadata, finding a complete or partial upload,
//! the completion mark, deletion, container creation and blob properties (what makes a seed
//! resumable; see the module documentation of `azure::blob`).

use std::collections::{BTreeMap, HashMap};

use azure_storage_blobs::prelude::{BlobClient, ContainerClient};
use futures::StreamExt;

use super::{
    blob_path, to_sdk_metadata, BlobError, META_IMAGE_SHA256, META_UPLOAD_STATE, STEMCELL_PREFIX,
    UPLOAD_STATE_COMPLETE, UPLOAD_STATE_UPLOADING,
};

/// A stemcell blob found in a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StemcellBlob {
    pub name: String,
    pub size: u64,
    pub metadata: HashMap<String, String>,
    pub last_modified: time::OffsetDateTime,
}

impl StemcellBlob {
    pub fn is_complete(&self) -> bool {
        self.metadata.get(META_UPLOAD_STATE).map(String::as_str) == Some(UPLOAD_STATE_COMPLETE)
    }
}

/// Every `bosh-stemcell-*` page blob of the container with its metadata (empty when the container
/// does not exist yet).
pub async fn list_stemcell_blobs(
    container: &ContainerClient,
) -> Result<Vec<StemcellBlob>, BlobError> {
    let mut stream = container
        .list_blobs()
        .prefix(STEMCELL_PREFIX.to_string())
        .include_metadata(true)
        .into_stream();
    let mut found = Vec::new();
    while let Some(page) = stream.next().await {
        let page = match page {
            Ok(page) => page,
            Err(err) => {
                let err =
                    BlobError::request("list blobs in container", container.container_name(), err);
                if err.is_not_found() {
                    return Ok(Vec::new());
                }
                return Err(err);
            }
        };
        for blob in page.blobs.blobs() {
            if blob.properties.blob_type != azure_storage_blobs::blob::BlobType::PageBlob {
                continue;
            }
            found.push(StemcellBlob {
                name: blob.name.clone(),
                size: blob.properties.content_length,
                metadata: blob.metadata.clone().unwrap_or_default(),
                last_modified: blob.properties.last_modified,
            });
        }
    }
    Ok(found)
}

/// A complete stemcell blob for this image digest: `image_sha256` matches and `upload_state` is
/// `complete` (blobs a CPI uploaded carry no marker and are not trusted: a crashed CPI upload
/// leaves the same metadata on a partial blob). Returns (blob name, size), newest first.
pub async fn find_complete_stemcell_blob(
    container: &ContainerClient,
    image_sha256: &str,
) -> Result<Option<(String, u64)>, BlobError> {
    let mut candidates: Vec<StemcellBlob> = list_stemcell_blobs(container)
        .await?
        .into_iter()
        .filter(|b| {
            b.is_complete()
                && b.metadata
                    .get(META_IMAGE_SHA256)
                    .is_some_and(|s| s.eq_ignore_ascii_case(image_sha256))
        })
        .collect();
    candidates.sort_by_key(|b| std::cmp::Reverse(b.last_modified));
    Ok(candidates.into_iter().next().map(|b| (b.name, b.size)))
}

/// Partial stemcell blobs left by our own interrupted uploads (`upload_state=uploading`).
/// Delete them only while holding the version's lock, so a concurrent upload is not cut short.
pub async fn find_partial_stemcell_blobs(
    container: &ContainerClient,
) -> Result<Vec<StemcellBlob>, BlobError> {
    Ok(list_stemcell_blobs(container)
        .await?
        .into_iter()
        .filter(|b| {
            b.metadata.get(META_UPLOAD_STATE).map(String::as_str) == Some(UPLOAD_STATE_UPLOADING)
        })
        .collect())
}

/// Record that the upload is complete: replace the blob's metadata with `metadata` (normally
/// [`stemcell_blob_metadata`]) plus `upload_state=complete`, in one request. Call it only after
/// the last page was written and the image's checksum verified.
pub async fn mark_complete(
    blob: &BlobClient,
    metadata: &BTreeMap<String, String>,
) -> Result<(), BlobError> {
    let mut all = metadata.clone();
    all.insert(META_UPLOAD_STATE.into(), UPLOAD_STATE_COMPLETE.into());
    blob.set_metadata()
        .metadata(to_sdk_metadata(&all))
        .await
        .map_err(|e| BlobError::request("set metadata of", blob_path(blob), e))?;
    Ok(())
}

/// Delete a blob (and its snapshots); `Ok(false)` when it was not there.
pub async fn delete_blob_if_exists(blob: &BlobClient) -> Result<bool, BlobError> {
    match blob
        .delete()
        .delete_snapshots_method(azure_storage_blobs::prelude::DeleteSnapshotsMethod::Include)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) => {
            let err = BlobError::request("delete blob", blob_path(blob), e);
            if err.is_not_found() {
                Ok(false)
            } else {
                Err(err)
            }
        }
    }
}

/// Create the container if it is missing ("already exists" is success).
pub async fn ensure_container(container: &ContainerClient) -> Result<(), BlobError> {
    match container.create().await {
        Ok(_) => Ok(()),
        Err(e) => {
            let err = BlobError::request("create container", container.container_name(), e);
            if err.status() == Some(409) {
                Ok(())
            } else {
                Err(err)
            }
        }
    }
}

/// Size and metadata of a blob, `None` when absent.
pub async fn blob_properties(
    blob: &BlobClient,
) -> Result<
    Option<(
        u64,
        HashMap<String, String>,
        azure_storage_blobs::blob::BlobType,
    )>,
    BlobError,
> {
    match blob.get_properties().await {
        Ok(props) => Ok(Some((
            props.blob.properties.content_length,
            props.blob.metadata.unwrap_or_default(),
            props.blob.properties.blob_type,
        ))),
        Err(e) => {
            let err = BlobError::request("get properties of", blob_path(blob), e);
            if err.is_not_found() {
                Ok(None)
            } else {
                Err(err)
            }
        }
    }
}
