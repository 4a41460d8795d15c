//! The content digest ([`crate::stemcell::content`]) of a page blob, read through Get Page
//! Ranges and ranged reads of those ranges only: a sparse 5 GiB stemcell costs its data, not its
//! size, and nothing is held in memory beyond one read of at most 4 MiB.

use std::num::NonZero;

use azure_storage_blob::models::{BlobClientDownloadOptions, BlobType, HttpRange};
use futures::StreamExt;

use super::target::Blob;
use super::{blob_path, blob_properties, BlobError, MAX_PUT_PAGE};
use crate::stemcell::content::ContentHasher;

/// What a blob holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobContent {
    /// The content digest (lower-case hex).
    pub digest: String,
    /// The blob's size in bytes.
    pub size: u64,
    /// Bytes read (the written page ranges).
    pub bytes_read: u64,
}

/// The content digest of page blob `blob`; `Ok(None)` when the blob (or its container) does not
/// exist. A block or append blob cannot hold a VHD a gallery version was made from, and is
/// refused as unreadable.
pub async fn content_digest(blob: &Blob) -> Result<Option<BlobContent>, BlobError> {
    let path = blob_path(blob);
    let Some((size, _, kind)) = blob_properties(blob).await? else {
        return Ok(None);
    };
    if kind != BlobType::PageBlob {
        return Err(BlobError::Unreadable {
            blob: path,
            reason: format!("it is a {kind:?}, not a page blob"),
        });
    }
    // Get Page Ranges answers the written ranges, `End` inclusive (Azure Storage REST "Get Page
    // Ranges"), page by page with continuation markers.
    let fail = |e| BlobError::request("get page ranges of", path.clone(), e);
    let mut pages = match blob.page_blob().list_page_ranges(None) {
        Ok(p) => p,
        Err(e) => return Err(fail(e)),
    };
    let mut ranges = Vec::new();
    while let Some(page) = pages.next().await {
        let page = match page {
            Ok(p) => p,
            Err(e) => {
                let err = fail(e);
                return if err.is_not_found() {
                    Ok(None)
                } else {
                    Err(err)
                };
            }
        };
        ranges.extend(page.into_model().map_err(fail)?.page_ranges);
    }
    let mut hasher = ContentHasher::new();
    let mut bytes_read = 0u64;
    let unreadable = |reason: String| BlobError::Unreadable {
        blob: blob_path(blob),
        reason,
    };
    let mut spans: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for range in ranges {
        let (Some(first), Some(last)) = (range.start, range.end) else {
            return Err(unreadable("Get Page Ranges answered an open range".into()));
        };
        let (Ok(start), Ok(last)) = (u64::try_from(first), u64::try_from(last)) else {
            return Err(unreadable(format!(
                "Get Page Ranges answered the negative range {first}-{last}"
            )));
        };
        let end = last.saturating_add(1);
        if end > size || start >= end || spans.last().is_some_and(|l| start < l.1) {
            return Err(unreadable(format!(
                "Get Page Ranges answered bytes {start}-{last} of a {size}-byte blob, out of order or out of bounds"
            )));
        }
        spans.push((start, end));
    }
    for (start, end) in coalesce(&spans) {
        let mut at = start;
        while at < end {
            let piece_end = end.min(at + MAX_PUT_PAGE as u64);
            // One ranged Get Blob per piece (at most 4 MiB: one partition, no parallel reads).
            let read = blob
                .client()
                .download(Some(BlobClientDownloadOptions {
                    range: Some(HttpRange::new(at, piece_end - at)),
                    parallel: NonZero::new(1),
                    partition_size: NonZero::new(MAX_PUT_PAGE),
                    ..Default::default()
                }))
                .await
                .map_err(|e| BlobError::request("read", blob_path(blob), e))?;
            // The download stream hands back chunks of whatever size the connection delivers,
            // not sectors: the piece (at most 4 MiB) is gathered whole, then hashed from its
            // 512-aligned start.
            let want = usize::try_from(piece_end - at).unwrap_or(MAX_PUT_PAGE);
            let mut piece = Vec::with_capacity(want);
            let mut body = read.body;
            while let Some(data) = body.next().await {
                let data = data.map_err(|e| BlobError::request("read", blob_path(blob), e))?;
                if piece.len() + data.len() > want {
                    return Err(unreadable(format!(
                        "a read of bytes {at}-{} returned more than {want} bytes",
                        piece_end - 1
                    )));
                }
                piece.extend_from_slice(&data);
            }
            if piece.len() != want {
                return Err(unreadable(format!(
                    "a read of bytes {at}-{} returned {} bytes",
                    piece_end - 1,
                    piece.len()
                )));
            }
            hasher
                .update(at, &piece)
                .map_err(|e| unreadable(e.to_string()))?;
            bytes_read += piece.len() as u64;
            at = piece_end;
        }
    }
    let digest = hasher.finish(size).map_err(|e| unreadable(e.to_string()))?;
    Ok(Some(BlobContent {
        digest,
        size,
        bytes_read,
    }))
}

/// Ranges close to each other are read together: the unwritten pages between them read as zeros,
/// which add nothing to the content digest, and a sparse upload's thousands of small ranges then
/// cost a few hundred reads instead of thousands. Half-open `(start, end)`, sorted, disjoint.
fn coalesce(spans: &[(u64, u64)]) -> Vec<(u64, u64)> {
    /// Read through gaps of at most this many zero bytes.
    const GAP: u64 = 256 * 1024;
    let mut out: Vec<(u64, u64)> = Vec::new();
    for &(s, e) in spans {
        match out.last_mut() {
            Some(last) if s - last.1 <= GAP && e - last.0 <= MAX_PUT_PAGE as u64 => last.1 = e,
            _ => out.push((s, e)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::coalesce;

    #[test]
    fn near_ranges_are_read_together_and_far_ones_apart() {
        let m = 1024 * 1024;
        assert_eq!(
            coalesce(&[(0, 512), (1024, 2048), (m, m + 512), (10 * m, 12 * m)]),
            vec![(0, 2048), (m, m + 512), (10 * m, 12 * m)]
        );
        // Never one read of more than 4 MiB.
        assert_eq!(
            coalesce(&[(0, 3 * m), (3 * m, 5 * m)]),
            vec![(0, 3 * m), (3 * m, 5 * m)]
        );
    }
}
