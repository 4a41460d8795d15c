//! What the stemcell blobs of a container mean for one upload (a pure decision, taken under the
//! upload locks; see the documentation of `app::publish`).

use super::passes::Checked;
use crate::gallery::blob_store::StemcellBlob;
use crate::stemcell::manifest::Checksum;

/// What the stemcell blobs of the container mean for this upload (decided under its locks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct UploadPlan {
    pub(super) found: Found,
    /// Partial blobs an interrupted upload of this image left: deleted before the upload.
    pub(super) leftovers: Vec<String>,
    /// Partial blobs recording only a digest not known before the upload (an older build's
    /// upload recorded the SHA-256 alone): once the upload pass computed it, one equal to ours
    /// is deleted under that digest's lock, if it is free (see `Upload::late_leftovers`).
    pub(super) unknown: Vec<(String, Checksum)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Found {
    /// A complete blob of this image (its SHA-256, computed from this file, and root.vhd's size):
    /// reused, nothing is sent.
    Reuse(String),
    /// A complete blob that may hold this image (the same SHA-1, or written before blobs recorded
    /// it and of the same stemcell version and size): only the SHA-256 can tell.
    MayHold(String),
    Nothing,
}

/// Decide on the stemcell blobs of the container for an upload of root.vhd (`size` bytes) of
/// the image `checked` describes, holding the upload locks of every digest it knows.
///
/// A complete blob is reused only for the same SHA-256 computed from this file (never for a
/// digest a manifest merely declares: the file might not hold it) and the same size. A partial
/// blob is deleted only when it records a digest whose lock is held (its writer held that lock:
/// it is not running, its upload was interrupted); another image's upload is never touched.
pub(super) fn plan_upload(blobs: &[StemcellBlob], checked: &Checked, size: u64) -> UploadPlan {
    let same = |a: &Option<String>, b: &Option<String>| match (a, b) {
        (Some(a), Some(b)) => a.trim().eq_ignore_ascii_case(b.trim()),
        _ => false,
    };
    let mut complete: Vec<&StemcellBlob> = blobs.iter().filter(|b| b.complete).collect();
    complete.sort_by_key(|b| std::cmp::Reverse(b.last_modified));
    let found = match (&checked.sha256, checked.computed) {
        (Some(_), true) => match complete
            .iter()
            .find(|b| same(&b.image_sha256, &checked.sha256))
        {
            Some(b) if b.size == size => Found::Reuse(b.name.clone()),
            Some(b) => {
                tracing::warn!(blob = %b.name, size = b.size, expected = size, "a complete blob with this image_sha256 has another size; not reusing it");
                Found::Nothing
            }
            None => Found::Nothing,
        },
        _ => {
            let ours = checked.cloud.version.as_deref().map(str::trim);
            complete
                .iter()
                .find(|b| {
                    same(&b.image_sha1, &checked.sha1)
                        || same(&b.image_sha256, &checked.sha256)
                        || (b.image_sha1.is_none()
                            && b.size == size
                            && match (b.version.as_deref().map(str::trim), ours) {
                                (Some(theirs), Some(ours)) => theirs == ours,
                                _ => true,
                            })
                })
                .map_or(Found::Nothing, |b| Found::MayHold(b.name.clone()))
        }
    };
    let mut leftovers = Vec::new();
    let mut unknown = Vec::new();
    for b in blobs.iter().filter(|b| !b.complete) {
        if same(&b.image_sha1, &checked.sha1) || same(&b.image_sha256, &checked.sha256) {
            leftovers.push(b.name.clone());
        } else if let (Some(d), None) = (&b.image_sha256, &checked.sha256) {
            unknown.push((
                b.name.clone(),
                Checksum::Sha256(d.trim().to_ascii_lowercase()),
            ));
        } else if let (Some(d), None) = (&b.image_sha1, &checked.sha1) {
            unknown.push((
                b.name.clone(),
                Checksum::Sha1(d.trim().to_ascii_lowercase()),
            ));
        }
    }
    UploadPlan {
        found,
        leftovers,
        unknown,
    }
}
