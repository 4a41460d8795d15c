//! The content digest ([`crate::stemcell::content`]) of a page blob, read through Get Page
//! Ranges and ranged reads of those ranges only: a sparse 5 GiB stemcell costs its data, not its
//! size, and nothing is held in memory beyond one read of at most 4 MiB.

use azure_core_legacy::prelude::Range;
use azure_storage_blobs::blob::BlobType;
use azure_storage_blobs::prelude::BlobClient;
use futures::StreamExt;

use super::{blob_path, BlobError, MAX_PUT_PAGE};
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
pub async fn content_digest(blob: &BlobClient) -> Result<Option<BlobContent>, BlobError> {
    let path = blob_path(blob);
    let props = match blob.get_properties().await {
        Ok(p) => p,
        Err(e) => {
            let err = BlobError::request("get properties of", path, e);
            return if err.is_not_found() {
                Ok(None)
            } else {
                Err(err)
            };
        }
    };
    if props.blob.properties.blob_type != BlobType::PageBlob {
        return Err(BlobError::Unreadable {
            blob: path,
            reason: format!(
                "it is a {:?}, not a page blob",
                props.blob.properties.blob_type
            ),
        });
    }
    let size = props.blob.properties.content_length;
    // Get Page Ranges answers the written ranges, `End` inclusive (Azure Storage REST "Get Page
    // Ranges"; the SDK keeps the inclusive end as `Range::Range(start..end)`).
    let ranges = match blob.get_page_ranges().await {
        Ok(r) => r.page_list.ranges,
        Err(e) => {
            let err = BlobError::request("get page ranges of", path, e);
            return if err.is_not_found() {
                Ok(None)
            } else {
                Err(err)
            };
        }
    };
    let mut hasher = ContentHasher::new();
    let mut bytes_read = 0u64;
    let unreadable = |reason: String| BlobError::Unreadable {
        blob: blob_path(blob),
        reason,
    };
    let mut spans: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Range::Range(r) = range else {
            return Err(unreadable("Get Page Ranges answered an open range".into()));
        };
        let (start, end) = (r.start, r.end.saturating_add(1));
        if end > size || start >= end || spans.last().is_some_and(|l| start < l.1) {
            return Err(unreadable(format!(
                "Get Page Ranges answered bytes {start}-{} of a {size}-byte blob, out of order or out of bounds",
                r.end
            )));
        }
        spans.push((start, end));
    }
    for (start, end) in coalesce(&spans) {
        let mut at = start;
        while at < end {
            let piece_end = end.min(at + MAX_PUT_PAGE as u64);
            let mut stream = blob
                .get()
                .range(Range::new(at, piece_end))
                .chunk_size(MAX_PUT_PAGE as u64)
                .into_stream();
            let mut got = at;
            while let Some(resp) = stream.next().await {
                let resp = resp.map_err(|e| BlobError::request("read", blob_path(blob), e))?;
                let data = resp
                    .data
                    .collect()
                    .await
                    .map_err(|e| BlobError::request("read", blob_path(blob), e))?;
                hasher
                    .update(got, &data)
                    .map_err(|e| unreadable(e.to_string()))?;
                got += data.len() as u64;
                bytes_read += data.len() as u64;
            }
            if got != piece_end {
                return Err(unreadable(format!(
                    "a read of bytes {at}-{} returned {} bytes",
                    piece_end - 1,
                    got - at
                )));
            }
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
