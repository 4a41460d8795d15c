//! Tags on gallery image versions: the Azure CPI's, ours, and the reference ledger.
//!
//! # References: one ledger shared with the Azure CPI
//!
//! A *reference* is one holder of a version: a stemcell CID (`bosh-stemcell-<uuid>`) of a director
//! or of create-env, or a free-form `--reference`. The unmodified Azure CPI (REFERENCE.md, "How the
//! Azure CPI uses a compute gallery") reads and writes only `stemcell_references` (comma-joined
//! CIDs, at most 256 characters, so at most five CIDs) and the legacy single `stemcell_name`; it
//! appends on create_stemcell, removes on delete_stemcell, DELETEs the version when the last entry
//! goes, and resolves create_vm's CID by looking for it in that tag. It takes no lock and keeps
//! every other tag as it read it. The ledger is therefore split so no entry has two homes:
//!
//! - `stemcell_references` — what plain Azure CPIs recorded, and the truth for it: an entry the CPI
//!   removed is gone, because no other tag holds it. This tool never adds its own references there
//!   (so the room stays for plain CPIs: four CIDs beside the sentinel) and never moves an entry
//!   out, except free-form references and entries the previous format had put there, when room is
//!   needed for the sentinel.
//! - `sg_overflow_refs_00`, `_01`, ... — every reference this tool recorded (the CPI never sees or
//!   changes them). Each value at most 256 characters; with the CPI's tags and ~15 cloud
//!   properties more than 150 CIDs fit.
//! - the sentinel `sg-held-<12 hex>` — in `stemcell_references` whenever the overflow is not empty.
//!   No director holds it, so a plain CPI removing every CID it sees never empties the tag (and so
//!   never DELETEs the version) while this tool still holds references. It is unique per version,
//!   so the CPI front hands the delegate CPI's create_vm the sentinel for a CID of the overflow,
//!   and the CPI resolves it to the right version.
//! - `stemcell_name` — the CPI's legacy single reference: a reference only when it has the CID
//!   shape and the version has no `stemcell_references` yet (the CPI folds it into that tag on its
//!   first reuse and never removes the tag afterwards, so a CID missing from the list was removed).
//!   Earlier releases of this tool wrote the stemcell's *name* there, which the CPI copied into
//!   `stemcell_references` as a CID; those values are not references, and every write removes them
//!   (the name moves to `stemcell_gallery_stemcell`).
//! - `sg_refs_NN` — the previous format (the complete list, with its newest entries mirrored into
//!   `stemcell_references`). Read once: entries it had mirrored count only if still in the CPI's tag,
//!   the rest are carried into the overflow; every write removes the old tags.
//!
//! `stemcell_references` is always written on our versions, empty when no reference is held: the
//! CPI refuses to reuse a version with neither of its reference tags ("not created by BOSH CPI").
//!
//! Here: the tag names, Azure's limits, reference syntax, CID shape and the sentinel; the ledger
//! itself (reading and rewriting the reference tags) is in `ledger`; case-insensitive tag names
//! in `names`.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

mod ledger;
mod names;
#[cfg(test)]
mod tests;

pub use ledger::{
    cpi_resolves, is_reference_tag, needs_rewrite, reference_room, references, sentinel_in,
    sourced_references, with_references, with_references_handing_back, with_references_unchecked,
    Source,
};
pub use names::{canonical_names, get, has};

pub const IMAGE_SHA256: &str = "image_sha256";
pub const GALLERY_NAME: &str = "compute_gallery_name";
pub const IMAGE_DEFINITION: &str = "compute_gallery_image_definition";
pub const CPI_REFERENCES: &str = "stemcell_references";
/// The CPI's legacy single-reference tag (a CID). Never written by this tool any more.
pub const STEMCELL_NAME: &str = "stemcell_name";
/// The stemcell's name, under a key the Azure CPI does not read.
pub const STEMCELL: &str = "stemcell_gallery_stemcell";
pub const MODE: &str = "stemcell_gallery_mode";
pub const STEMCELL_VERSION: &str = "stemcell_version";
pub const SOURCE_BLOB: &str = "source_blob";
/// The content digest of the VHD a version was made from (`crate::stemcell::content`), recorded
/// by `migrate` on the versions it makes from the Azure CPI's pre-gallery blobs, whose image file
/// (and so `image_sha256`) nobody has any more (`gallery::content`).
pub const VHD_CONTENT: &str = "stemcell_gallery_vhd_content";
pub const CREATED_BY: &str = "created_by";
/// A mark unique to one create of a version by this tool, set in the create's PUT and kept by
/// every tag write: the reference record written before that create belongs to the version
/// carrying it (`record::Record::born`), not to one deleted and made again by anyone else.
pub const BIRTH_MARK: &str = "stemcell_gallery_birth";
/// Versions carrying this tag (any value) are never deleted by cleanup.
pub const PROTECT: &str = "stemcell_gallery_protect";
/// The overflow: references `stemcell_references` cannot hold.
pub const OVERFLOW_PREFIX: &str = "sg_overflow_refs_";
/// The previous format's complete list (read for migration, removed on every write).
pub const LEGACY_CHUNK_PREFIX: &str = "sg_refs_";
/// Every value starting with this in `stemcell_references` is a sentinel, not a reference.
pub const SENTINEL_PREFIX: &str = "sg-held-";

pub const MAX_TAGS: usize = 50;
pub const MAX_TAG_NAME: usize = 512;
pub const MAX_TAG_VALUE: usize = 256;
pub const MAX_REFERENCE_LEN: usize = 128;
/// The length of a CPI stemcell CID (`bosh-stemcell-` and a UUID).
pub const CID_LEN: usize = 50;
/// Fewer CIDs than this still fitting on a version: every reference write warns, and `list`
/// shows it (Azure allows 50 tags; with typical cloud-property tags about 150 CIDs fit).
pub const REFERENCE_ROOM_WARNING: usize = 25;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    #[error("reference {0:?} is not valid: use 1 to 128 characters from A-Z a-z 0-9 . _ - : @ / (no commas or spaces), not starting with {SENTINEL_PREFIX:?}")]
    BadReference(String),
    #[error("the version would need {needed} tags to hold its {references} references, but Azure allows {MAX_TAGS}; remove stale references (`stemcell-gallery delete`) first")]
    TooManyReferences { needed: usize, references: usize },
    #[error("stemcell_references is full ({used} of {MAX_TAG_VALUE} characters, {cids} CIDs the Azure CPI may hold and resolve) and has no room for the sentinel that protects further references; delete unused stemcells on the directors that use this version (`bosh clean-up`), then retry")]
    CpiTagFull { used: usize, cids: usize },
    #[error("stemcell_references ({MAX_TAG_VALUE} characters at most) has no room for {}: it holds {}; delete stemcells there first (`bosh delete-stemcell` / `bosh clean-up` on the directors holding them), or hand back fewer", .handing.join(", "), if .held_there.is_empty() { "nothing else".to_string() } else { .held_there.join(", ") })]
    NoRoomToHandBack {
        handing: Vec<String>,
        held_there: Vec<String>,
    },
}

/// A reference that cannot be stored, or tags without room, are the same on every retry.
impl crate::error::Classified for TagError {
    fn class(&self) -> crate::error::Class {
        crate::error::Class::Permanent
    }
}

/// Check a reference can be stored and read back unambiguously.
pub fn validate_reference(r: &str) -> Result<(), TagError> {
    let ok = !r.is_empty()
        && r.len() <= MAX_REFERENCE_LEN
        && !r.starts_with(SENTINEL_PREFIX)
        && r.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '@' | '/'));
    if ok {
        Ok(())
    } else {
        Err(TagError::BadReference(r.to_string()))
    }
}

/// Whether `s` has the shape of an Azure CPI stemcell CID: `bosh-stemcell-` and a UUID.
pub fn is_cid(s: &str) -> bool {
    let Some(uuid) = s.strip_prefix("bosh-stemcell-") else {
        return false;
    };
    let groups: Vec<&str> = uuid.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The sentinel of one version: unique per definition and version within a gallery (the scope of
/// the Azure CPI's CID lookup), the same whoever computes it.
pub fn sentinel(definition: &str, version: &str) -> String {
    let digest = Sha256::digest(
        format!(
            "{}/{}",
            definition.to_ascii_lowercase(),
            version.to_ascii_lowercase()
        )
        .as_bytes(),
    );
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("{SENTINEL_PREFIX}{hex}")
}

/// Whether the version was made by this tool.
pub fn is_ours(tags: &BTreeMap<String, String>) -> bool {
    tags.contains_key(MODE)
}

/// The stemcell name this tool recorded on one of its versions (the current tag, or the value
/// earlier releases wrote to `stemcell_name`).
pub fn stemcell_name(tags: &BTreeMap<String, String>) -> Option<&str> {
    if let Some(n) = tags.get(STEMCELL) {
        return Some(n.trim());
    }
    tags.get(STEMCELL_NAME)
        .map(|n| n.trim())
        .filter(|n| is_ours(tags) && !is_cid(n))
}

/// Make a string safe as a tag value: at most 256 characters (cut on a char boundary).
/// Only for descriptive tags (cloud properties); references and digests are never cut.
pub fn fit_value(v: &str) -> String {
    if v.len() <= MAX_TAG_VALUE {
        return v.to_string();
    }
    let mut end = MAX_TAG_VALUE;
    while !v.is_char_boundary(end) {
        end -= 1;
    }
    v[..end].to_string()
}
