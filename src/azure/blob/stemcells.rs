//! Stemcell blobs in a container: listing with metadata, finding a complete or partial upload,
//! the completion mark, deletion, container creation and blob properties (how a re-run
//! tells a complete upload from an interrupted one; see the module documentation of `azure::blob`).

use std::collections::{BTreeMap, HashMap};

use azure_storage_blob::models::{
    BlobClientDeleteOptions, BlobClientGetPropertiesResultHeaders,
    BlobContainerClientListBlobsOptions, BlobItem, BlobType, DeleteSnapshotsOptionType,
    ListBlobsIncludeItem,
};
use futures::StreamExt;

use super::target::{Blob, Container};
use super::VhdSource;

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
pub async fn list_stemcell_blobs(container: &Container) -> Result<Vec<StemcellBlob>, BlobError> {
    let pages = list_blobs(container, STEMCELL_PREFIX).await;
    let pages = match pages {
        Ok(pages) => pages,
        Err(err) if err.is_not_found() => return Ok(Vec::new()),
        Err(err) => return Err(err),
    };
    let mut found = Vec::new();
    for (_, items) in pages {
        for blob in items {
            let Some(props) = &blob.properties else {
                continue;
            };
            if props.blob_type != Some(BlobType::PageBlob) {
                continue;
            }
            let (Some(name), Some(last_modified)) = (&blob.name, props.last_modified) else {
                continue;
            };
            found.push(StemcellBlob {
                name: name.clone(),
                size: props.content_length.unwrap_or(0),
                metadata: metadata_of(&blob),
                last_modified,
            });
        }
    }
    Ok(found)
}

/// A listed blob's metadata (empty when it has none).
pub(crate) fn metadata_of(blob: &BlobItem) -> HashMap<String, String> {
    blob.metadata
        .as_ref()
        .and_then(|m| m.values.clone())
        .unwrap_or_default()
}

/// Every blob under `prefix` with its metadata, page by page with each page's `Date` (the
/// service's clock), following the continuation markers.
pub(crate) async fn list_blobs(
    container: &Container,
    prefix: &str,
) -> Result<Vec<(Option<time::OffsetDateTime>, Vec<BlobItem>)>, BlobError> {
    let fail = |e| BlobError::request("list blobs in container", container.container_name(), e);
    let mut pages = container
        .client()
        .list_blobs(Some(BlobContainerClientListBlobsOptions {
            prefix: Some(prefix.to_string()),
            include: Some(vec![ListBlobsIncludeItem::Metadata]),
            ..Default::default()
        }))
        .map_err(fail)?
        .into_pages();
    let mut out = Vec::new();
    while let Some(page) = pages.next().await {
        let page = page.map_err(fail)?;
        let date = page
            .headers()
            .get_optional_str(&azure_core::http::headers::HeaderName::from_static("date"))
            .and_then(crate::azure::parse_http_date);
        let body = page.into_model().map_err(fail)?;
        out.push((date, body.blob_items));
    }
    Ok(out)
}

/// A complete stemcell blob for this image digest: `image_sha256` matches and `upload_state` is
/// `complete` (blobs a CPI uploaded carry no marker and are not trusted: a crashed CPI upload
/// leaves the same metadata on a partial blob). Returns (blob name, size), newest first.
pub async fn find_complete_stemcell_blob(
    container: &Container,
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
    container: &Container,
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
    blob: &Blob,
    metadata: &BTreeMap<String, String>,
) -> Result<(), BlobError> {
    let mut all = metadata.clone();
    all.insert(META_UPLOAD_STATE.into(), UPLOAD_STATE_COMPLETE.into());
    blob.client()
        .set_metadata(&to_sdk_metadata(&all), None)
        .await
        .map_err(|e| BlobError::request("set metadata of", blob_path(blob), e))?;
    Ok(())
}

/// Delete a blob (and its snapshots); `Ok(false)` when it was not there.
pub async fn delete_blob_if_exists(blob: &Blob) -> Result<bool, BlobError> {
    match blob
        .client()
        .delete(Some(BlobClientDeleteOptions {
            delete_snapshots: Some(DeleteSnapshotsOptionType::Include),
            ..Default::default()
        }))
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
pub async fn ensure_container(container: &Container) -> Result<(), BlobError> {
    match container.client().create(None).await {
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
    blob: &Blob,
) -> Result<Option<(u64, HashMap<String, String>, BlobType)>, BlobError> {
    let path = blob_path(blob);
    match blob.client().get_properties(None).await {
        Ok(props) => {
            let bad = |e| BlobError::request("read the properties of", path.clone(), e);
            let size = props.content_length().map_err(bad)?.unwrap_or(0);
            let metadata = props.metadata().map_err(bad)?;
            let kind = props
                .blob_type()
                .map_err(bad)?
                .unwrap_or(BlobType::BlockBlob);
            Ok(Some((size, metadata, kind)))
        }
        Err(e) => {
            let err = BlobError::request("get properties of", path, e);
            if err.is_not_found() {
                Ok(None)
            } else {
                Err(err)
            }
        }
    }
}

/// Check the blob a version would be made from: exists, is a page blob, and ends with a fixed
/// VHD footer whose size matches the blob's and is a whole number of MiB. Reads its properties
/// and its last 512 bytes (no write).
pub async fn check_vhd_source(blob: &Blob) -> Result<VhdSource, BlobError> {
    use crate::stemcell::vhd::FOOTER_LEN;
    let Some((size, _, kind)) = blob_properties(blob).await? else {
        return Ok(VhdSource::Missing);
    };
    if kind != BlobType::PageBlob {
        return Ok(VhdSource::Unfit(format!(
            "it is a {kind:?}, not a page blob (upload VHDs as page blobs: `az storage blob upload --type page`)"
        )));
    }
    let footer_len = FOOTER_LEN as u64;
    if size < footer_len {
        return Ok(VhdSource::Unfit(format!(
            "it holds {size} bytes, less than a VHD footer"
        )));
    }
    let read = blob
        .client()
        .download(Some(
            azure_storage_blob::models::BlobClientDownloadOptions {
                range: Some(azure_storage_blob::models::HttpRange::new(
                    size - footer_len,
                    footer_len,
                )),
                parallel: std::num::NonZero::new(1),
                ..Default::default()
            },
        ))
        .await
        .map_err(|e| BlobError::request("read the VHD footer of", blob_path(blob), e))?;
    let mut raw = Vec::with_capacity(FOOTER_LEN);
    let mut body = read.body;
    while let Some(data) = body.next().await {
        let data =
            data.map_err(|e| BlobError::request("read the VHD footer of", blob_path(blob), e))?;
        raw.extend_from_slice(&data);
    }
    let Ok(raw) = <[u8; FOOTER_LEN]>::try_from(raw.as_slice()) else {
        return Ok(VhdSource::Unfit(format!(
            "a read of its last {FOOTER_LEN} bytes returned {}",
            raw.len()
        )));
    };
    // What Azure checks (REFERENCE.md "Source of a version from a VHD": the `conectix` cookie, a
    // fixed disk, a whole number of MiB), no more: a footer checksum Azure does not name is not
    // a reason to refuse here.
    if &raw[0..8] != b"conectix" {
        return Ok(VhdSource::Unfit(
            "it is not a VHD (its last 512 bytes hold no `conectix` footer)".into(),
        ));
    }
    let disk_type = u32::from_be_bytes([raw[60], raw[61], raw[62], raw[63]]);
    if disk_type != 2 {
        return Ok(VhdSource::Unfit(format!(
            "it is not a fixed VHD (disk type {disk_type}); Azure takes fixed VHDs only"
        )));
    }
    let virtual_size = size - footer_len;
    if !virtual_size.is_multiple_of(1 << 20) {
        return Ok(VhdSource::Unfit(format!(
            "its virtual size, {virtual_size} bytes, is not a whole number of MiB"
        )));
    }
    Ok(VhdSource::Fixed { size })
}
