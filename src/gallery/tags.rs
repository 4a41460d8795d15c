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

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

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
pub const CREATED_BY: &str = "created_by";
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

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    #[error("reference {0:?} is not valid: use 1 to 128 characters from A-Z a-z 0-9 . _ - : @ / (no commas or spaces), not starting with {SENTINEL_PREFIX:?}")]
    BadReference(String),
    #[error("the version would need {needed} tags to hold its {references} references, but Azure allows {MAX_TAGS}; remove stale references (`stemcell-gallery delete`) first")]
    TooManyReferences { needed: usize, references: usize },
    #[error("stemcell_references is full ({used} of {MAX_TAG_VALUE} characters, {cids} CIDs the Azure CPI may hold and resolve) and has no room for the sentinel that protects further references; delete unused stemcells on the directors that use this version (`bosh clean-up`), then retry")]
    CpiTagFull { used: usize, cids: usize },
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

fn split_list(v: &str) -> impl Iterator<Item = &str> {
    v.split(',').map(str::trim).filter(|s| !s.is_empty())
}

fn push_unique(out: &mut Vec<String>, r: &str) {
    if !out.iter().any(|x| x == r) {
        out.push(r.to_string());
    }
}

fn chunk_values<'a>(tags: &'a BTreeMap<String, String>, prefix: &str) -> Vec<&'a str> {
    // BTreeMap iteration orders <prefix>00 < <prefix>01 < ... (two digits, at most 50 chunks).
    tags.range(prefix.to_string()..)
        .take_while(|(k, _)| k.starts_with(prefix))
        .flat_map(|(_, v)| split_list(v))
        .collect()
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

/// Where a reference was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The Azure CPI's `stemcell_references` (either tool may have written it there).
    StemcellReferences,
    /// This tool's overflow tags `sg_overflow_refs_NN`.
    Overflow,
    /// The previous format's `sg_refs_NN`, not yet rewritten.
    PreviousFormat,
    /// The Azure CPI's legacy `stemcell_name` (a CID, from Azure CPI v52).
    LegacyStemcellName,
}

impl Source {
    /// The tag the reference lives in, as an operator would look for it.
    pub fn tag(self) -> &'static str {
        match self {
            Source::StemcellReferences => CPI_REFERENCES,
            Source::Overflow => "sg_overflow_refs_*",
            Source::PreviousFormat => "sg_refs_*",
            Source::LegacyStemcellName => STEMCELL_NAME,
        }
    }

    /// Which tool recorded a reference found there.
    pub fn recorded_by(self) -> &'static str {
        match self {
            Source::StemcellReferences | Source::LegacyStemcellName => "azure-cpi",
            Source::Overflow | Source::PreviousFormat => "stemcell-gallery",
        }
    }
}

/// The ledger as read from one version's tags.
#[derive(Debug, Clone, Default)]
struct Ledger {
    /// The references in `stemcell_references`, in tag order.
    visible: Vec<String>,
    /// The references only this tool holds, with where each was read.
    overflow: Vec<(String, Source)>,
    /// The legacy `stemcell_name` CID, when it still counts.
    legacy: Option<String>,
    /// Entries of `visible` that may move to the overflow when the sentinel needs room.
    demotable: Vec<String>,
}

/// The previous format's choice of what to mirror into `stemcell_references`: the newest
/// entries of the complete list that fit (kept exactly, to tell which entries it had mirrored).
fn previous_format_mirror(refs: &[&str]) -> Vec<String> {
    let mut picked: Vec<String> = Vec::new();
    let mut len = 0;
    for r in refs.iter().rev() {
        let add = r.len() + usize::from(!picked.is_empty());
        if len + add > MAX_TAG_VALUE {
            break;
        }
        len += add;
        picked.push(r.to_string());
    }
    picked.reverse();
    picked
}

impl Ledger {
    fn read(tags: &BTreeMap<String, String>) -> Ledger {
        // Values this tool once wrote as the stemcell's name, which the CPI copied as a CID.
        let phantom =
            |r: &str| !is_cid(r) && stemcell_name(tags).is_some_and(|n| n.eq_ignore_ascii_case(r));
        let mut l = Ledger::default();
        let cpi_tag = tags.get(CPI_REFERENCES);
        for r in cpi_tag.map(|v| split_list(v)).into_iter().flatten() {
            if !r.starts_with(SENTINEL_PREFIX) && !phantom(r) {
                push_unique(&mut l.visible, r);
                if !is_cid(r) {
                    l.demotable.push(r.to_string());
                }
            }
        }
        let in_visible = |l: &Ledger, r: &str| l.visible.iter().any(|x| x == r);
        let in_overflow = |l: &Ledger, r: &str| l.overflow.iter().any(|(x, _)| x == r);
        for r in chunk_values(tags, OVERFLOW_PREFIX) {
            if !in_visible(&l, r) && !in_overflow(&l, r) {
                l.overflow.push((r.to_string(), Source::Overflow));
            }
        }
        let previous = chunk_values(tags, LEGACY_CHUNK_PREFIX);
        if !previous.is_empty() {
            // Without the CPI's tag at all nothing says what was mirrored (the previous release
            // always wrote it, and the CPI never removes it): every entry still counts.
            let mirrored = if cpi_tag.is_some() {
                previous_format_mirror(&previous)
            } else {
                Vec::new()
            };
            for r in previous {
                if phantom(r) || r.starts_with(SENTINEL_PREFIX) {
                    continue;
                }
                if mirrored.iter().any(|m| m == r) {
                    // Mirrored: the CPI's tag decides (absent there = the CPI removed it).
                    if in_visible(&l, r) && !l.demotable.iter().any(|d| d == r) {
                        l.demotable.push(r.to_string());
                    }
                } else if !in_visible(&l, r) && !in_overflow(&l, r) {
                    l.overflow.push((r.to_string(), Source::PreviousFormat));
                }
            }
        }
        if cpi_tag.is_none() {
            if let Some(n) = tags.get(STEMCELL_NAME).map(|n| n.trim()) {
                if is_cid(n) && !in_visible(&l, n) && !in_overflow(&l, n) {
                    l.legacy = Some(n.to_string());
                }
            }
        }
        l
    }

    fn all(&self) -> Vec<(String, Source)> {
        let mut out: Vec<(String, Source)> = self
            .visible
            .iter()
            .map(|r| (r.clone(), Source::StemcellReferences))
            .collect();
        out.extend(self.overflow.iter().cloned());
        if let Some(l) = &self.legacy {
            out.push((l.clone(), Source::LegacyStemcellName));
        }
        out
    }
}

/// Every reference recorded on a version: `stemcell_references` first (tag order), then the
/// overflow, then the legacy `stemcell_name`.
pub fn references(tags: &BTreeMap<String, String>) -> Vec<String> {
    Ledger::read(tags)
        .all()
        .into_iter()
        .map(|(r, _)| r)
        .collect()
}

/// [`references`], each with the tag it was read from.
pub fn sourced_references(tags: &BTreeMap<String, String>) -> Vec<(String, Source)> {
    Ledger::read(tags).all()
}

/// The sentinel in a version's `stemcell_references`, if there is one.
pub fn sentinel_in(tags: &BTreeMap<String, String>) -> Option<String> {
    tags.get(CPI_REFERENCES).and_then(|v| {
        split_list(v)
            .find(|r| r.starts_with(SENTINEL_PREFIX))
            .map(str::to_string)
    })
}

/// Whether the Azure CPI resolves `cid` to this version by itself (it is in `stemcell_references`,
/// or is the legacy `stemcell_name` the CPI also matches).
pub fn cpi_resolves(tags: &BTreeMap<String, String>, cid: &str) -> bool {
    tags.get(STEMCELL_NAME).is_some_and(|n| n.trim() == cid)
        || tags
            .get(CPI_REFERENCES)
            .is_some_and(|v| split_list(v).any(|r| r == cid))
}

fn joined_len(entries: &[String]) -> usize {
    entries.iter().map(String::len).sum::<usize>() + entries.len().saturating_sub(1)
}

/// Rewrite the reference tags of `tags` to hold exactly `refs` (in order), as the ledger above
/// describes. `sentinel` is [`sentinel`] of this version. Other tags are kept, except the values
/// earlier releases wrote (`stemcell_name`, `sg_refs_NN`). Fails, changing nothing, when Azure's
/// tag limits cannot hold them.
pub fn with_references(
    tags: &BTreeMap<String, String>,
    refs: &[String],
    sentinel: &str,
) -> Result<BTreeMap<String, String>, TagError> {
    for r in refs {
        validate_reference(r)?;
    }
    let current = Ledger::read(tags);
    let wanted = |r: &str| refs.iter().any(|x| x == r);
    // What the CPI's side holds stays there (a plain CPI holds it, resolves it and removes it
    // there); the legacy `stemcell_name` CID joins it, as the CPI itself would fold it in.
    let mut visible: Vec<String> = current
        .visible
        .iter()
        .chain(current.legacy.iter())
        .filter(|r| wanted(r))
        .cloned()
        .collect();
    // Everything this tool holds lives in the overflow.
    let mut overflow: Vec<String> = refs
        .iter()
        .filter(|r| !visible.contains(r))
        .cloned()
        .collect();
    if !overflow.is_empty() {
        // Make room for the sentinel within Azure's limit, moving out only what may move.
        for d in &current.demotable {
            if joined_len(&visible) + 1 + sentinel.len() <= MAX_TAG_VALUE {
                break;
            }
            if let Some(i) = visible.iter().position(|v| v == d) {
                overflow.insert(0, visible.remove(i));
            }
        }
        let used = joined_len(&visible);
        if used + usize::from(!visible.is_empty()) + sentinel.len() > MAX_TAG_VALUE {
            return Err(TagError::CpiTagFull {
                used,
                cids: visible.iter().filter(|r| is_cid(r)).count(),
            });
        }
        visible.insert(0, sentinel.to_string());
    }
    let mut out: BTreeMap<String, String> = tags
        .iter()
        .filter(|(k, _)| {
            !k.starts_with(OVERFLOW_PREFIX)
                && !k.starts_with(LEGACY_CHUNK_PREFIX)
                && k.as_str() != CPI_REFERENCES
                && k.as_str() != STEMCELL_NAME
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // The legacy tag goes on every write: a CID there is in the list now (or was removed), and
    // the CPI would copy it back on its next reuse; our old stemcell name moves to its own key.
    if let Some(name) = stemcell_name(tags) {
        out.entry(STEMCELL.to_string())
            .or_insert_with(|| name.to_string());
    }
    let chunks = chunk(&overflow);
    let needed = out.len() + chunks.len() + 1;
    if needed > MAX_TAGS {
        return Err(TagError::TooManyReferences {
            needed,
            references: refs.len(),
        });
    }
    for (i, c) in chunks.into_iter().enumerate() {
        out.insert(format!("{OVERFLOW_PREFIX}{i:02}"), c);
    }
    out.insert(CPI_REFERENCES.to_string(), visible.join(","));
    Ok(out)
}

/// Whether rewriting the tags would change them (earlier formats, our old `stemcell_name`, a
/// phantom entry or a missing sentinel): a reference write should then happen even when the
/// references are already right.
pub fn needs_rewrite(tags: &BTreeMap<String, String>, sentinel: &str) -> bool {
    match with_references(tags, &references(tags), sentinel) {
        Ok(out) => &out != tags,
        Err(_) => false,
    }
}

/// Whether `name` is a tag this module owns (never a cloud property's tag).
pub fn is_reference_tag(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    n.starts_with(OVERFLOW_PREFIX)
        || n.starts_with(LEGACY_CHUNK_PREFIX)
        || n == CPI_REFERENCES
        || n == STEMCELL_NAME
}

/// Pack references into comma-separated values of at most 256 characters.
fn chunk(refs: &[String]) -> Vec<String> {
    let mut chunks = Vec::new();
    let mut cur = String::new();
    for r in refs {
        if !cur.is_empty() && cur.len() + 1 + r.len() > MAX_TAG_VALUE {
            chunks.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(',');
        }
        cur.push_str(r);
    }
    if !cur.is_empty() {
        chunks.push(cur);
    }
    chunks
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

/// Whether `tags` holds a tag named `name`. Azure tag names are case-insensitive (REFERENCE.md
/// "Tags"; Azure Resource Manager docs, "Use tags to organize your Azure resources": "Tag names
/// are case-insensitive for operations"), so `Stemcell_Gallery_Protect` is `stemcell_gallery_protect`.
pub fn has(tags: &BTreeMap<String, String>, name: &str) -> bool {
    get(tags, name).is_some()
}

/// The value of the tag named `name`, whatever the casing of its name (see [`has`]).
pub fn get<'a>(tags: &'a BTreeMap<String, String>, name: &str) -> Option<&'a String> {
    tags.get(name).or_else(|| {
        tags.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

/// `tags` with the names this tool and the Azure CPI read spelled as they define them (so a tag
/// another client wrote as `Stemcell_References` or `SG_REFS_00` is still read). Other names are
/// kept as they are.
pub fn canonical_names(tags: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    const KNOWN: [&str; 11] = [
        IMAGE_SHA256,
        GALLERY_NAME,
        IMAGE_DEFINITION,
        CPI_REFERENCES,
        STEMCELL_NAME,
        STEMCELL,
        MODE,
        STEMCELL_VERSION,
        SOURCE_BLOB,
        CREATED_BY,
        PROTECT,
    ];
    tags.iter()
        .map(|(k, v)| {
            let name = KNOWN
                .iter()
                .find(|n| n.eq_ignore_ascii_case(k))
                .map(|n| n.to_string())
                .or_else(|| {
                    [OVERFLOW_PREFIX, LEGACY_CHUNK_PREFIX]
                        .iter()
                        .find_map(|prefix| {
                            let head = k.get(..prefix.len())?;
                            head.eq_ignore_ascii_case(prefix)
                                .then(|| format!("{prefix}{}", &k[prefix.len()..]))
                        })
                })
                .unwrap_or_else(|| k.clone());
            (name, v.clone())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SENT: &str = "sg-held-0123456789ab";

    fn cid(i: usize) -> String {
        format!("bosh-stemcell-{:08x}-1111-2222-3333-444455556666", i)
    }

    fn base() -> BTreeMap<String, String> {
        let mut t = BTreeMap::new();
        t.insert(MODE.into(), "director".into());
        t.insert(IMAGE_SHA256.into(), "ab".repeat(32));
        for i in 0..14 {
            t.insert(format!("cloud_prop_{i}"), "x".repeat(40));
        }
        t
    }

    fn write(t: &BTreeMap<String, String>, refs: &[String]) -> BTreeMap<String, String> {
        with_references(t, refs, SENT).unwrap()
    }

    /// The Azure CPI's create_stemcell on an existing version (compute_gallery_manager.rb
    /// `build_updated_tags`): split stemcell_references, append stemcell_name if absent, append
    /// the CID, keep every other tag. `None`: Azure refuses the 257th character.
    fn cpi_create(t: &BTreeMap<String, String>, cid: &str) -> Option<BTreeMap<String, String>> {
        let mut t = t.clone();
        let mut list: Vec<String> = t
            .get(CPI_REFERENCES)
            .map(|v| split_list(v).map(str::to_string).collect())
            .unwrap_or_default();
        if let Some(n) = t.get(STEMCELL_NAME).cloned() {
            if !list.contains(&n) {
                list.push(n);
            }
        }
        if !list.iter().any(|r| r == cid) {
            list.push(cid.to_string());
        }
        let v = list.join(",");
        if v.len() > MAX_TAG_VALUE {
            return None;
        }
        t.insert(CPI_REFERENCES.into(), v);
        Some(t)
    }

    /// The Azure CPI's delete_stemcell (`delete_gallery_image`): `Err(())` = it DELETEs the version.
    fn cpi_delete(t: &BTreeMap<String, String>, cid: &str) -> Result<BTreeMap<String, String>, ()> {
        let mut t = t.clone();
        let mut list: Vec<String> = t
            .get(CPI_REFERENCES)
            .map(|v| split_list(v).map(str::to_string).collect())
            .unwrap_or_default();
        let by_name = t.get(STEMCELL_NAME).is_some_and(|n| n == cid);
        let in_list = list.iter().any(|r| r == cid);
        if !(by_name || in_list) {
            return Ok(t);
        }
        list.retain(|r| r != cid);
        if list.is_empty() {
            return Err(());
        }
        t.insert(CPI_REFERENCES.into(), list.join(","));
        Ok(t)
    }

    #[test]
    fn cids_have_one_shape() {
        assert!(is_cid(&cid(7)));
        assert!(is_cid("bosh-stemcell-0b1c2d3e-aaaa-bbbb-cccc-ddddeeeeffff"));
        for s in [
            "bosh-azure-hyperv-ubuntu-jammy-go_agent",
            "bosh-stemcell-123",
            "create-env:my-director",
            "bosh-stemcell-0b1c2d3e-aaaa-bbbb-cccc-ddddeeeeffzz",
        ] {
            assert!(!is_cid(s), "{s}");
        }
        assert_eq!(cid(1).len(), CID_LEN);
    }

    #[test]
    fn the_sentinel_is_per_version_stable_and_never_a_reference() {
        let a = sentinel("bosh-azure-hyperv-ubuntu-jammy-go_agent", "1.506.0");
        assert_eq!(
            a,
            sentinel("BOSH-azure-hyperv-ubuntu-jammy-go_agent", "1.506.0")
        );
        assert_ne!(
            a,
            sentinel("bosh-azure-hyperv-ubuntu-jammy-go_agent", "1.507.0")
        );
        assert!(a.starts_with(SENTINEL_PREFIX) && a.len() == 20);
        assert!(validate_reference(&a).is_err());
    }

    #[test]
    fn tag_names_are_read_case_insensitively() {
        let tags: BTreeMap<String, String> = [
            ("Stemcell_Gallery_Protect", "yes"),
            ("STEMCELL_REFERENCES", "bosh-stemcell-a"),
            ("SG_Overflow_Refs_00", "bosh-stemcell-b"),
            ("Other", "x"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert!(has(&tags, PROTECT));
        assert_eq!(get(&tags, "other").map(String::as_str), Some("x"));
        let canon = canonical_names(&tags);
        assert!(canon.contains_key(PROTECT) && canon.contains_key("Other"));
        assert_eq!(
            references(&canon),
            vec!["bosh-stemcell-a", "bosh-stemcell-b"]
        );
    }

    #[test]
    fn forty_references_survive_on_one_version() {
        let refs: Vec<String> = (0..40).map(cid).collect();
        let tags = write(&base(), &refs);
        assert!(tags.len() <= MAX_TAGS);
        assert!(tags.values().all(|v| v.len() <= MAX_TAG_VALUE));
        let mut got = references(&tags);
        got.sort();
        assert_eq!(got, refs);
    }

    #[test]
    fn no_entry_has_two_homes() {
        let refs: Vec<String> = (0..12).map(cid).collect();
        let tags = write(&base(), &refs);
        let sourced = sourced_references(&tags);
        assert_eq!(sourced.len(), 12);
        for (r, src) in &sourced {
            let in_cpi = cpi_resolves(&tags, r);
            assert_eq!(in_cpi, *src == Source::StemcellReferences, "{r}");
        }
    }

    #[test]
    fn our_references_leave_the_cpi_tag_to_plain_cpis_but_for_the_sentinel() {
        let ours: Vec<String> = (0..7).map(cid).collect();
        let tags = write(&base(), &ours);
        assert_eq!(tags[CPI_REFERENCES], SENT);
        assert!(sourced_references(&tags)
            .iter()
            .all(|(_, s)| *s == Source::Overflow));
        // Four plain CPIs on other directors can still append their CIDs; a fifth is refused by
        // Azure as it would be without this tool (five CIDs and commas fill 256 characters).
        let mut t = tags;
        for i in 0..4 {
            t = cpi_create(&t, &cid(100 + i)).expect("room for a plain CPI");
        }
        assert!(cpi_create(&t, &cid(104)).is_none());
        assert_eq!(references(&t).len(), 11);
    }

    #[test]
    fn a_cid_the_cpi_removed_stays_removed() {
        let ours: Vec<String> = (0..3).map(cid).collect();
        let mut t = write(&base(), &ours);
        let theirs: Vec<String> = (100..103).map(cid).collect();
        for c in &theirs {
            t = cpi_create(&t, c).unwrap();
        }
        assert_eq!(references(&t).len(), 6);
        // The plain CPIs delete every CID they hold: the sentinel keeps the version.
        for c in &theirs {
            t = cpi_delete(&t, c).expect("the sentinel keeps the CPI from deleting the version");
        }
        assert_eq!(references(&t), ours);
        // And our next write does not bring them back.
        let mut more = ours.clone();
        more.push(cid(50));
        let t2 = write(&t, &more);
        assert_eq!(references(&t2), more);
    }

    #[test]
    fn a_plain_cpi_deleting_the_last_cid_still_deletes_a_version_only_it_holds() {
        let mut t = base();
        t.insert(CPI_REFERENCES.into(), cid(100));
        assert!(cpi_delete(&t, &cid(100)).is_err());
        // Once we hold a reference too, it cannot.
        let t = write(&t, &[cid(100), cid(1)]);
        let t = cpi_delete(&t, &cid(100)).expect("kept for our reference");
        assert_eq!(references(&t), vec![cid(1)]);
        // Our last reference gone, the sentinel goes too.
        let t = write(&t, &[]);
        assert_eq!(t[CPI_REFERENCES], "");
    }

    #[test]
    fn no_references_still_writes_the_cpi_tag_so_the_cpi_can_reuse_the_version() {
        let tags = write(&base(), &[]);
        assert_eq!(tags[CPI_REFERENCES], "");
        assert!(references(&tags).is_empty());
        let t = cpi_create(&tags, &cid(3)).unwrap();
        assert_eq!(references(&t), vec![cid(3)]);
    }

    #[test]
    fn a_version_made_by_the_azure_cpi_is_understood() {
        let mut t = BTreeMap::new();
        t.insert(CPI_REFERENCES.into(), format!("{}, {}", cid(1), cid(2)));
        assert_eq!(references(&t), vec![cid(1), cid(2)]);
        let out = write(&t, &[cid(1), cid(2), cid(3)]);
        assert_eq!(
            out[CPI_REFERENCES],
            format!("{SENT},{},{}", cid(1), cid(2)),
            "the CPI's CIDs stay where it resolves them; ours goes to the overflow"
        );
        assert_eq!(references(&out), vec![cid(1), cid(2), cid(3)]);
    }

    #[test]
    fn the_cpi_v52_legacy_name_counts_only_until_the_cpi_tag_exists() {
        let mut v52 = BTreeMap::new();
        v52.insert(STEMCELL_NAME.into(), cid(1));
        assert_eq!(
            sourced_references(&v52),
            vec![(cid(1), Source::LegacyStemcellName)]
        );
        // Our write folds it into the CPI's list and drops the tag (the CPI would copy it back).
        let out = write(&v52, &[cid(1), cid(2)]);
        assert!(!out.contains_key(STEMCELL_NAME));
        assert!(cpi_resolves(&out, &cid(1)));
        assert_eq!(references(&out), vec![cid(1), cid(2)]);
        // The CPI folded it, then removed it: stemcell_name still names it, but it is gone.
        let mut removed = v52.clone();
        removed.insert(CPI_REFERENCES.into(), cid(2));
        assert_eq!(references(&removed), vec![cid(2)]);
        // Not a CID: never a reference.
        let mut odd = BTreeMap::new();
        odd.insert(STEMCELL_NAME.into(), "some-name".to_string());
        assert!(references(&odd).is_empty());
    }

    #[test]
    fn our_old_stemcell_name_and_its_phantom_copy_are_not_references_and_are_cleaned() {
        let name = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
        let mut t = base();
        t.insert(STEMCELL_NAME.into(), name.into());
        // The previous release's format: the complete list, mirrored into the CPI's tag.
        t.insert(LEGACY_CHUNK_PREFIX.to_string() + "00", cid(1));
        t.insert(CPI_REFERENCES.into(), cid(1));
        assert!(needs_rewrite(&t, SENT));
        // The CPI reused our version: it copied the name in as a CID, then added its own.
        let t = cpi_create(&t, &cid(2)).unwrap();
        assert!(t[CPI_REFERENCES].contains(name));
        assert_eq!(references(&t), vec![cid(1), cid(2)]);
        // Both real CIDs go: no reference is left (the version is an orphan, not kept forever).
        let t1 = cpi_delete(&t, &cid(2)).unwrap();
        let t1 = write(&t1, &[]);
        assert!(references(&t1).is_empty());
        // Our rewrite removes the phantom and the old tag, and keeps the name under our key.
        let out = write(&t, &references(&t));
        assert!(!out.contains_key(STEMCELL_NAME));
        assert!(!out[CPI_REFERENCES].contains(name));
        assert_eq!(out[STEMCELL], name);
        assert_eq!(stemcell_name(&out), Some(name));
        assert!(!needs_rewrite(&out, SENT));
    }

    #[test]
    fn the_previous_format_is_read_once_and_the_cpi_decides_what_it_mirrored() {
        // The previous release: the complete list in sg_refs_NN, its newest five mirrored.
        let refs: Vec<String> = (0..8).map(cid).collect();
        let mut t = base();
        t.insert(format!("{LEGACY_CHUNK_PREFIX}00"), refs[..5].join(","));
        t.insert(format!("{LEGACY_CHUNK_PREFIX}01"), refs[5..].join(","));
        t.insert(CPI_REFERENCES.into(), refs[3..].join(","));
        assert_eq!(references(&t).len(), 8);
        // Then the CPI removed one it could see.
        let t = cpi_delete(&t, &refs[6]).unwrap();
        let got = references(&t);
        assert_eq!(got.len(), 7);
        assert!(!got.contains(&refs[6]));
        assert!(sourced_references(&t)
            .iter()
            .any(|(r, s)| r == &refs[0] && *s == Source::PreviousFormat));
        // Rewritten: the old tags are gone, nothing is lost, the sentinel guards the overflow.
        let out = write(&t, &got);
        assert!(!out.keys().any(|k| k.starts_with(LEGACY_CHUNK_PREFIX)));
        let mut a = references(&out);
        let mut b = got.clone();
        a.sort();
        b.sort();
        assert_eq!(a, b);
        assert!(out[CPI_REFERENCES].starts_with(SENT));
    }

    #[test]
    fn a_cpi_tag_full_of_plain_cpi_cids_is_an_error_not_a_demotion() {
        let mut t = BTreeMap::new();
        let five: Vec<String> = (0..5).map(cid).collect();
        t.insert(CPI_REFERENCES.into(), five.join(","));
        let mut want = five.clone();
        want.push(cid(5));
        assert!(matches!(
            with_references(&t, &want, SENT),
            Err(TagError::CpiTagFull { cids: 5, .. })
        ));
        // A free-form reference in the CPI's tag (put there by hand or by an older tool) may move
        // out to make room.
        let mut t2 = BTreeMap::new();
        let mut mixed: Vec<String> = (0..4).map(cid).collect();
        mixed.insert(0, "create-env:director-one".into());
        t2.insert(CPI_REFERENCES.into(), mixed.join(","));
        let mut want = mixed.clone();
        want.push(cid(9));
        let out = with_references(&t2, &want, SENT).unwrap();
        assert!(out[CPI_REFERENCES].starts_with(SENT));
        for c in (0..4).map(cid) {
            assert!(
                cpi_resolves(&out, &c),
                "a CID the CPI holds stays resolvable"
            );
        }
        assert_eq!(references(&out).len(), 6);
    }

    #[test]
    fn too_many_references_is_an_error_not_a_loss() {
        let refs: Vec<String> = (0..400).map(cid).collect();
        assert!(matches!(
            with_references(&base(), &refs, SENT),
            Err(TagError::TooManyReferences { .. })
        ));
    }

    #[test]
    fn bad_references_are_refused() {
        for r in ["", "a,b", "with space", &"x".repeat(200), SENT] {
            assert!(validate_reference(r).is_err(), "{r:?}");
        }
    }

    proptest! {
        /// Any interleaving of our writes and a plain CPI's creates and deletes: the ledger holds
        /// exactly the references that were added and not removed since (by either tool), the
        /// CPI never deletes a version we still hold, and every CID the CPI added stays
        /// resolvable by the CPI.
        #[test]
        fn the_ledger_agrees_with_both_tools(ops in proptest::collection::vec((0u8..4, 0usize..30), 1..60)) {
            let mut t = base();
            let mut model: Vec<String> = Vec::new();
            let mut cpi_held: Vec<String> = Vec::new();
            for (op, i) in ops {
                match op {
                    // We add a reference.
                    0 => {
                        let r = cid(i);
                        if cpi_held.contains(&r) { continue; }
                        let mut want = references(&t);
                        if !want.contains(&r) { want.push(r.clone()); }
                        match with_references(&t, &want, SENT) {
                            Ok(out) => { t = out; if !model.contains(&r) { model.push(r); } }
                            Err(TagError::CpiTagFull { .. }) => {}
                            Err(e) => prop_assert!(false, "{e}"),
                        }
                    }
                    // We remove one of ours.
                    1 => {
                        let r = cid(i);
                        if cpi_held.contains(&r) || !model.contains(&r) { continue; }
                        let want: Vec<String> = references(&t).into_iter().filter(|x| x != &r).collect();
                        t = with_references(&t, &want, SENT).unwrap();
                        model.retain(|x| x != &r);
                    }
                    // A plain CPI adds a CID of its own.
                    2 => {
                        let r = cid(100 + i);
                        if model.contains(&r) { continue; }
                        if let Some(out) = cpi_create(&t, &r) {
                            t = out;
                            model.push(r.clone());
                            if !cpi_held.contains(&r) { cpi_held.push(r); }
                        }
                    }
                    // A plain CPI deletes one of its CIDs.
                    _ => {
                        if cpi_held.is_empty() { continue; }
                        let r = cpi_held.remove(i % cpi_held.len());
                        model.retain(|x| x != &r);
                        match cpi_delete(&t, &r) {
                            Ok(out) => t = out,
                            Err(()) => { prop_assert!(model.is_empty(), "the CPI deleted a version still holding {model:?}"); t = write(&base(), &[]); }
                        }
                    }
                }
                let mut got = references(&t);
                got.sort();
                let mut want = model.clone();
                want.sort();
                prop_assert_eq!(got, want);
                for r in &cpi_held { prop_assert!(cpi_resolves(&t, r), "the CPI lost {r}"); }
                prop_assert!(t.values().all(|v| v.len() <= MAX_TAG_VALUE));
                prop_assert!(t.len() <= MAX_TAGS);
            }
        }

        #[test]
        fn references_round_trip(n in 0usize..60, extra in 0usize..20) {
            let mut t = base();
            for i in 0..extra { t.insert(format!("e{i}"), "v".into()); }
            let refs: Vec<String> = (0..n).map(cid).collect();
            match with_references(&t, &refs, SENT) {
                Ok(out) => {
                    prop_assert!(out.len() <= MAX_TAGS);
                    prop_assert!(out.values().all(|v| v.len() <= MAX_TAG_VALUE));
                    let mut got = references(&out);
                    got.sort();
                    prop_assert_eq!(got, refs);
                    for (k, v) in &t { prop_assert_eq!(out.get(k), Some(v)); }
                    prop_assert!(!needs_rewrite(&out, SENT));
                }
                Err(TagError::TooManyReferences { needed, .. }) => prop_assert!(needed > MAX_TAGS),
                Err(e) => prop_assert!(false, "{e}"),
            }
        }
    }
}
