//! The reference ledger (described in the parent module): reading every reference a version's
//! tags hold, with where each was read, and rewriting the reference tags to hold exactly a given
//! list within Azure's limits.

use std::collections::BTreeMap;

use super::{
    is_cid, stemcell_name, validate_reference, TagError, CPI_REFERENCES, LEGACY_CHUNK_PREFIX,
    MAX_TAGS, MAX_TAG_VALUE, OVERFLOW_PREFIX, SENTINEL_PREFIX, STEMCELL, STEMCELL_NAME,
};

pub(super) fn split_list(v: &str) -> impl Iterator<Item = &str> {
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

/// Rewrite the reference tags of `tags` to hold exactly `refs` (in order), as the ledger (the parent
/// module) describes. `sentinel` is [`super::sentinel`] of this version. Other tags are kept, except the values
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
    rewrite(tags, refs, sentinel, &[], true)
}

/// [`with_references`], with the references in `hand_back` moved to `stemcell_references`,
/// where a plain Azure CPI finds and removes them (a director leaving the front). Fails, changing
/// nothing, when that tag has no room for them (`TagError::NoRoomToHandBack`).
pub fn with_references_handing_back(
    tags: &BTreeMap<String, String>,
    refs: &[String],
    sentinel: &str,
    hand_back: &[String],
) -> Result<BTreeMap<String, String>, TagError> {
    for r in refs {
        validate_reference(r)?;
    }
    rewrite(tags, refs, sentinel, hand_back, true)
}

/// [`with_references`] without Azure's limits: the tags as a view to decide on (a version's
/// tags merged with its reference record, `gallery::record::healed`), never to be written.
pub fn with_references_unchecked(
    tags: &BTreeMap<String, String>,
    refs: &[String],
    sentinel: &str,
) -> BTreeMap<String, String> {
    match rewrite(tags, refs, sentinel, &[], false) {
        Ok(t) => t,
        // Unreachable without the limits; keep the tags rather than panic.
        Err(_) => tags.clone(),
    }
}

fn rewrite(
    tags: &BTreeMap<String, String>,
    refs: &[String],
    sentinel: &str,
    hand_back: &[String],
    limits: bool,
) -> Result<BTreeMap<String, String>, TagError> {
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
    // References handed back to plain CPIs join their side, after what is there.
    for r in hand_back {
        if wanted(r) && !visible.contains(r) {
            visible.push(r.clone());
        }
    }
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
        if limits && used + usize::from(!visible.is_empty()) + sentinel.len() > MAX_TAG_VALUE {
            return Err(TagError::CpiTagFull {
                used,
                cids: visible.iter().filter(|r| is_cid(r)).count(),
            });
        }
        visible.insert(0, sentinel.to_string());
    }
    if limits && !hand_back.is_empty() && joined_len(&visible) > MAX_TAG_VALUE {
        let held_there: Vec<String> = visible
            .iter()
            .filter(|r| !r.starts_with(SENTINEL_PREFIX) && !hand_back.contains(r))
            .cloned()
            .collect();
        return Err(TagError::NoRoomToHandBack {
            handing: hand_back.to_vec(),
            held_there,
        });
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
    // Our old stemcell name moves to its own key. A CID in the legacy tag is in the list now
    // (or was removed); it stays only while that CID is held: Azure CPI v52.0.1-v53.0.0 find a
    // stemcell only by `stemcell_name` (their create_vm and delete_stemcell filter resources by
    // that tag, tag v53.0.0 `stemcell_manager2.rb`), so a director still on one keeps resolving
    // its own CID; once the CID goes, the tag goes with it.
    if let Some(name) = stemcell_name(tags) {
        out.entry(STEMCELL.to_string())
            .or_insert_with(|| name.to_string());
    }
    if let Some(n) = tags.get(STEMCELL_NAME).map(|n| n.trim()) {
        if is_cid(n) && wanted(n) {
            out.insert(STEMCELL_NAME.to_string(), n.to_string());
        }
    }
    let chunks = chunk(&overflow);
    let needed = out.len() + chunks.len() + 1;
    if limits && needed > MAX_TAGS {
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

/// How many more stemcell CIDs (50 characters each) this tool could still record on a version
/// with these tags before Azure's tag limits refuse the write (capped at 1,000).
pub fn reference_room(tags: &BTreeMap<String, String>) -> usize {
    let mut refs = references(tags);
    let base = refs.len();
    // Any sentinel: they all have the same length.
    let sentinel = super::sentinel("d", "0.0.0");
    let fits = |refs: &mut Vec<String>, extra: usize| {
        refs.truncate(base);
        refs.extend((0..extra).map(|i| format!("bosh-stemcell-00000000-0000-4000-8000-{i:012}")));
        with_references(tags, refs, &sentinel).is_ok()
    };
    if !fits(&mut refs, 0) {
        return 0;
    }
    // The largest n in [0, 1000] that fits (fitting is monotonic in n).
    let (mut lo, mut hi) = (0usize, 1000usize);
    if fits(&mut refs, hi) {
        return hi;
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fits(&mut refs, mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}
