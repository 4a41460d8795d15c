//! Tags on gallery image versions: the Azure CPI's, ours, and the reference scheme.
//!
//! # References
//!
//! A *reference* is one holder of a version: a stemcell CID (`bosh-stemcell-<uuid>`) of a director
//! or of create-env, or a free-form `--reference`. Azure allows 50 tags per resource and 256
//! characters per tag value, so a single comma-separated tag holds only five CIDs. We keep:
//!
//! - `sg_refs_00`, `sg_refs_01`, ... — the complete list, in the order references were added,
//!   comma-separated, each value at most 256 characters. This is the source of truth.
//! - `stemcell_references` — the Azure CPI's tag, kept correct while every reference fits in 256
//!   characters; past that it holds the most recently added references that fit, so the Azure CPI
//!   can still resolve the newest CIDs (its `create_vm` looks versions up through this tag).
//! - `stemcell_name` — the Azure CPI's legacy single reference; on versions the CPI made it names a
//!   CID, on ours (tagged `stemcell_gallery_mode`) it is the stemcell's name and not a reference.
//!
//! Reading takes the union of all three, so versions made by either tool are understood by both.
//! A version with the Azure CPI tags and ~15 others still has room for more than 150 CIDs.

use std::collections::BTreeMap;

pub const IMAGE_SHA256: &str = "image_sha256";
pub const GALLERY_NAME: &str = "compute_gallery_name";
pub const IMAGE_DEFINITION: &str = "compute_gallery_image_definition";
pub const CPI_REFERENCES: &str = "stemcell_references";
/// The CPI's legacy single-reference tag; ours uses the same key for the stemcell's name.
pub const STEMCELL_NAME: &str = "stemcell_name";
pub const MODE: &str = "stemcell_gallery_mode";
pub const STEMCELL_VERSION: &str = "stemcell_version";
pub const SOURCE_BLOB: &str = "source_blob";
pub const CREATED_BY: &str = "created_by";
/// Versions carrying this tag (any value) are never deleted by cleanup.
pub const PROTECT: &str = "stemcell_gallery_protect";
pub const REF_CHUNK_PREFIX: &str = "sg_refs_";

pub const MAX_TAGS: usize = 50;
pub const MAX_TAG_NAME: usize = 512;
pub const MAX_TAG_VALUE: usize = 256;
pub const MAX_REFERENCE_LEN: usize = 128;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TagError {
    #[error("reference {0:?} is not valid: use 1 to 128 characters from A-Z a-z 0-9 . _ - : @ / (no commas or spaces)")]
    BadReference(String),
    #[error("the version would need {needed} tags to hold its {references} references, but Azure allows {MAX_TAGS}; remove stale references (`stemcell-gallery delete`) first")]
    TooManyReferences { needed: usize, references: usize },
}

/// Check a reference can be stored and read back unambiguously.
pub fn validate_reference(r: &str) -> Result<(), TagError> {
    let ok = !r.is_empty()
        && r.len() <= MAX_REFERENCE_LEN
        && r.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '@' | '/'));
    if ok {
        Ok(())
    } else {
        Err(TagError::BadReference(r.to_string()))
    }
}

fn split_list(v: &str) -> impl Iterator<Item = &str> {
    v.split(',').map(str::trim).filter(|s| !s.is_empty())
}

fn push_unique(out: &mut Vec<String>, r: &str) {
    if !out.iter().any(|x| x == r) {
        out.push(r.to_string());
    }
}

/// Whether the version was made by this tool.
pub fn is_ours(tags: &BTreeMap<String, String>) -> bool {
    tags.contains_key(MODE)
}

/// Every reference recorded on a version, in the order they were added (ours first, then any the
/// Azure CPI added that we have not recorded, then the CPI's legacy `stemcell_name`).
pub fn references(tags: &BTreeMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    // BTreeMap iteration orders sg_refs_00 < sg_refs_01 < ... (two digits, at most 50 chunks).
    for (k, v) in tags.range(REF_CHUNK_PREFIX.to_string()..) {
        if !k.starts_with(REF_CHUNK_PREFIX) {
            break;
        }
        for r in split_list(v) {
            push_unique(&mut out, r);
        }
    }
    if let Some(v) = tags.get(CPI_REFERENCES) {
        for r in split_list(v) {
            push_unique(&mut out, r);
        }
    }
    if !is_ours(tags) {
        if let Some(v) = tags.get(STEMCELL_NAME) {
            let v = v.trim();
            if !v.is_empty() {
                push_unique(&mut out, v);
            }
        }
    }
    out
}

/// Rewrite the reference tags of `tags` to hold exactly `refs` (in order). Other tags are kept.
/// Fails, changing nothing, when Azure's tag limits cannot hold them.
pub fn with_references(
    tags: &BTreeMap<String, String>,
    refs: &[String],
) -> Result<BTreeMap<String, String>, TagError> {
    for r in refs {
        validate_reference(r)?;
    }
    let mut out: BTreeMap<String, String> = tags
        .iter()
        .filter(|(k, _)| !k.starts_with(REF_CHUNK_PREFIX) && k.as_str() != CPI_REFERENCES)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    // The legacy single reference is folded into the list (the CPI reads both).
    if !is_ours(tags) {
        out.remove(STEMCELL_NAME);
    }
    let chunks = chunk(refs);
    let needed = out.len() + chunks.len() + usize::from(!refs.is_empty());
    if needed > MAX_TAGS {
        return Err(TagError::TooManyReferences {
            needed,
            references: refs.len(),
        });
    }
    for (i, c) in chunks.into_iter().enumerate() {
        out.insert(format!("{REF_CHUNK_PREFIX}{i:02}"), c);
    }
    if !refs.is_empty() {
        out.insert(CPI_REFERENCES.to_string(), cpi_references_value(refs));
    }
    Ok(out)
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

/// The CPI's tag: all references if they fit, else the newest ones that fit (oldest first).
fn cpi_references_value(refs: &[String]) -> String {
    let mut picked: Vec<&str> = Vec::new();
    let mut len = 0;
    for r in refs.iter().rev() {
        let add = r.len() + usize::from(!picked.is_empty());
        if len + add > MAX_TAG_VALUE {
            break;
        }
        len += add;
        picked.push(r);
    }
    picked.reverse();
    picked.join(",")
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
    const KNOWN: [&str; 10] = [
        IMAGE_SHA256,
        GALLERY_NAME,
        IMAGE_DEFINITION,
        CPI_REFERENCES,
        STEMCELL_NAME,
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
                    let prefix = k.get(..REF_CHUNK_PREFIX.len())?;
                    prefix
                        .eq_ignore_ascii_case(REF_CHUNK_PREFIX)
                        .then(|| format!("{REF_CHUNK_PREFIX}{}", &k[REF_CHUNK_PREFIX.len()..]))
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

    #[test]
    fn tag_names_are_read_case_insensitively() {
        let tags: BTreeMap<String, String> = [
            ("Stemcell_Gallery_Protect", "yes"),
            ("STEMCELL_REFERENCES", "bosh-stemcell-a"),
            ("SG_Refs_00", "bosh-stemcell-b"),
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
            vec!["bosh-stemcell-b", "bosh-stemcell-a"]
        );
    }

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

    #[test]
    fn forty_references_survive_on_one_version() {
        let refs: Vec<String> = (0..40).map(cid).collect();
        let tags = with_references(&base(), &refs).unwrap();
        assert!(tags.len() <= MAX_TAGS);
        assert!(tags.values().all(|v| v.len() <= MAX_TAG_VALUE));
        assert_eq!(references(&tags), refs);
    }

    #[test]
    fn cpi_tag_is_exact_while_it_fits_and_newest_after() {
        let few: Vec<String> = (0..4).map(cid).collect();
        let tags = with_references(&base(), &few).unwrap();
        assert_eq!(tags[CPI_REFERENCES], few.join(","));
        let many: Vec<String> = (0..12).map(cid).collect();
        let tags = with_references(&base(), &many).unwrap();
        let cpi: Vec<&str> = tags[CPI_REFERENCES].split(',').collect();
        assert!(tags[CPI_REFERENCES].len() <= MAX_TAG_VALUE);
        assert_eq!(*cpi.last().unwrap(), cid(11));
        assert!(cpi.len() < 12);
    }

    #[test]
    fn a_version_made_by_the_azure_cpi_is_understood() {
        let mut t = BTreeMap::new();
        t.insert(
            CPI_REFERENCES.into(),
            "bosh-stemcell-a, bosh-stemcell-b".into(),
        );
        t.insert(STEMCELL_NAME.into(), "bosh-stemcell-legacy".into());
        assert_eq!(
            references(&t),
            vec!["bosh-stemcell-a", "bosh-stemcell-b", "bosh-stemcell-legacy"]
        );
        // Rewriting folds the legacy tag into the list.
        let refs = references(&t);
        let out = with_references(&t, &refs).unwrap();
        assert!(!out.contains_key(STEMCELL_NAME));
        assert_eq!(references(&out), refs);
    }

    #[test]
    fn our_stemcell_name_tag_is_not_a_reference() {
        let mut t = base();
        t.insert(
            STEMCELL_NAME.into(),
            "bosh-azure-hyperv-ubuntu-jammy-go_agent".into(),
        );
        assert!(references(&t).is_empty());
        let out = with_references(&t, &[cid(1)]).unwrap();
        assert_eq!(
            out[STEMCELL_NAME],
            "bosh-azure-hyperv-ubuntu-jammy-go_agent"
        );
    }

    #[test]
    fn too_many_references_is_an_error_not_a_loss() {
        let refs: Vec<String> = (0..400).map(cid).collect();
        assert!(matches!(
            with_references(&base(), &refs),
            Err(TagError::TooManyReferences { .. })
        ));
    }

    #[test]
    fn bad_references_are_refused() {
        for r in ["", "a,b", "with space", &"x".repeat(200)] {
            assert!(validate_reference(r).is_err(), "{r:?}");
        }
    }

    proptest! {
        #[test]
        fn references_round_trip(n in 0usize..60, extra in 0usize..20) {
            let mut t = base();
            for i in 0..extra { t.insert(format!("e{i}"), "v".into()); }
            let refs: Vec<String> = (0..n).map(cid).collect();
            match with_references(&t, &refs) {
                Ok(out) => {
                    prop_assert!(out.len() <= MAX_TAGS);
                    prop_assert!(out.values().all(|v| v.len() <= MAX_TAG_VALUE));
                    prop_assert_eq!(references(&out), refs);
                    for (k, v) in &t { prop_assert_eq!(out.get(k), Some(v)); }
                }
                Err(TagError::TooManyReferences { needed, .. }) => prop_assert!(needed > MAX_TAGS),
                Err(e) => prop_assert!(false, "{e}"),
            }
        }
    }
}
