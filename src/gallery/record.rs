//! The reference record: every reference this tool holds on one version, with its holder, kept
//! beside the version's lock where writes can be conditional.
//!
//! # Why
//!
//! The tags of a gallery image version are written whole (PUT/PATCH replaces the tag set) and
//! have no ETag / `If-Match` (`azure::arm`), so a tag write the service delays — sent by a
//! writer whose lease then ran out — can land after another writer recorded a reference, and
//! erase it. The lock serialises work but cannot fence a request already in flight. Blobs can be
//! written conditionally, so the references this tool records are also written, **before** any
//! tag write and before the write is acknowledged, to a record beside the version's lock blob,
//! with `If-Match` on the ETag read: a write sent by a holder whose view is stale is refused by
//! storage.
//!
//! # Two copies
//!
//! The record is kept in two blobs, `<lock blob>.refs` and `<lock blob>.refs.copy`, each with a
//! generation number; a reader takes the valid copy with the highest generation, and every
//! write rewrites both (the first write after one was lost or damaged repairs it). While a
//! Failed version is being replaced (deleted, then created again), the record is the only place
//! its references live; with two copies, one deleted, emptied or overwritten copy loses nothing.
//! A copy that is not a record of *this* gallery version (another version's, a newer format,
//! not JSON, empty) is never used. When no copy is usable but one exists, every decision on the
//! version is refused (`RecordError::Unusable`) until an operator repairs or removes them.
//!
//! # Whose record it is
//!
//! A record belongs to one gallery, named by its full identity (subscription, resource group,
//! gallery: its blobs are named after the version's lock, `lock::version_lock_name`, and it says
//! whose it is inside, compared as ARM compares, case-insensitively), and to one *life* of its
//! version: the version's `publishedDate`, which Azure stamps when it creates the version. A
//! record bound to a life that is over (the version was deleted by anyone, and is absent or
//! was created again with another `publishedDate`) is not this version's: the version starts
//! empty, and the next write replaces the record. A record bound to no life yet (written before
//! this tool's create, or by the replacement of a Failed version, which unbinds it on purpose to
//! carry its references into the new version) applies to the version that is there next, if it
//! is of the record's content; the first write binds it.
//!
//! Releases before the identity (format 1) kept the record beside `locks/<gallery>/…`, by name:
//! two galleries of one name shared it. It is read only when this gallery's own record does not
//! exist yet, and only for the holders of references the version's tags still show (a shared
//! record cannot say whose its other entries and removals are).
//!
//! # Merging with the tags
//!
//! Every reader that decides anything (reference writes, the removal of a reference, every
//! guarded delete, cleanup, `references prune`, the replacement of a Failed version) reads the
//! version *and* its record, and works on the merged view ([`merged`], [`healed`]):
//!
//! - a reference the record holds is a reference, whether or not the tags still show it (a stale
//!   tag write erased it): the next tag write puts it back;
//! - a reference the record lists as removed (a tombstone) is not a reference, even if a stale
//!   tag write brought it back into the tags (unless it was recorded again since);
//! - everything else in the tags counts as the tags say — in particular `stemcell_references`,
//!   which the Azure CPI owns: the record never holds what the CPI recorded, so a CID the CPI
//!   removed stays removed.
//!
//! The record mirrors this tool's side of the ledger (the overflow, see `tags`), so it holds
//! exactly the references the tags would hold there, with who recorded each (the director UUID
//! of a CPI request, create-env's director id, or an operator's `--holder` label).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::content::Content;
pub use super::error::RecordError;
use super::error::{Error, Result};
use super::tags;
use super::{GalleryRef, ImageVersion};

/// What a record blob says it is.
pub const KIND: &str = "stemcell-gallery/references";
/// The record format this release reads and writes (2: bound to the gallery's full identity and
/// to a life of its version).
pub const FORMAT: u32 = 2;
/// The format of the previous releases' records (by gallery name, beside the legacy lock).
pub const LEGACY_FORMAT: u32 = 1;
/// Removals remembered per version however old (the newest), so that a stale tag write cannot
/// bring a removed reference back.
pub const TOMBSTONES: usize = 256;
/// Every removal younger than this is remembered, whatever their number: a tag write that
/// lands late lands within minutes (a tags-only write was recorded at 2.5 min); one command can
/// remove hundreds of references in a second, so a bound by count alone would forget removals
/// a late write can still undo.
pub const TOMBSTONE_RETENTION: time::Duration = time::Duration::days(7);
/// The longest holder label.
pub const MAX_HOLDER_LEN: usize = 128;

/// One reference this tool recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub reference: String,
    /// Who holds it: `director:<uuid>` for a CPI request (the director UUID of its context, for
    /// create-env bosh-state.json's `director_id`), else the operator's `--holder` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// When it was recorded (RFC 3339, this host's clock; informative only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_at: Option<String>,
}

/// A reference this tool removed (so a stale tag write does not bring it back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Removed {
    pub reference: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed_at: Option<String>,
}

/// The record of one version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub kind: String,
    pub format: u32,
    /// The gallery's subscription and resource group (format 2; absent in format 1).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subscription: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub resource_group: String,
    pub gallery: String,
    pub definition: String,
    pub version: String,
    /// The content the references were recorded for (a version's `image_sha256`): references
    /// carried across a replaced Failed version go only to a version of the same content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_sha256: Option<String>,
    /// The VHD content digest the references were recorded for, on a version `migrate` made
    /// from a blob without its image (`gallery::content`); such a record has no `image_sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhd_content: Option<String>,
    /// The life of the version the record belongs to: its `publishedDate` (RFC 3339) when the
    /// record was last written over it; `None` while bound to no life yet (see the module
    /// documentation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub life: Option<String>,
    /// The birth mark of the create this record was written before (the value of
    /// `tags::BIRTH_MARK` in that create's PUT): until the record is bound to a life, it is the
    /// record of a version carrying this mark only. A version deleted and made again by anyone
    /// else does not carry it, so a creator that died before binding its record leaves nothing
    /// to the next life. `None`: written by no create (a replaced Failed version's carried
    /// references, or an earlier release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub born: Option<String>,
    /// The references carried from a Failed version this tool replaces: noted on the Failed
    /// version's record before its DELETE (the record stays bound to that life, and applies to
    /// the absent version after it), then kept in the record written before the create that
    /// replaces it (every other reference that record holds came with the create, and goes if
    /// the version is absent again). Empty otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub carried: Vec<String>,
    /// Which of `carried` were the Azure CPI's own CIDs (in `stemcell_references` when noted):
    /// while a version is there they count as its tags show them — the CPI removes its own
    /// without reading this record (seed 44).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub carried_cpi: Vec<String>,
    /// Incremented by every write; the higher of the two copies wins.
    pub generation: u64,
    pub references: Vec<Entry>,
    #[serde(default)]
    pub removed: Vec<Removed>,
    /// References being handed back to plain Azure CPIs (`references hand-back`), kept with
    /// their holders from the record write before the tag write that moves them into
    /// `stemcell_references` until a read shows them there: an interrupted hand-back loses
    /// neither the reference nor who holds it, and its re-run finds them by holder.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub handing_back: Vec<Entry>,
}

/// Which version a record belongs to: a version of one gallery, named by its full identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub gallery: GalleryRef,
    pub definition: String,
    pub version: String,
}

impl Binding {
    pub fn new(gallery: &GalleryRef, definition: &str, version: &str) -> Self {
        Binding {
            gallery: gallery.clone(),
            definition: definition.to_string(),
            version: version.to_string(),
        }
    }

    fn describe(&self) -> String {
        format!(
            "{}/{}/{} (resource group {}, subscription {})",
            self.gallery.gallery,
            self.definition,
            self.version,
            self.gallery.resource_group,
            self.gallery.subscription
        )
    }

    /// The lock the previous releases kept this version's record beside (by gallery name).
    pub fn legacy_lock(&self) -> String {
        super::blob_names::legacy_version_lock_name(
            &self.gallery.gallery,
            &self.definition,
            &self.version,
        )
    }
}

mod holder;
pub use holder::{director_holder, holder_label};
mod content;
mod each;
mod legacy;
mod life;
pub use each::forget_in_each_copy;
use legacy::load_legacy;
pub use life::{life_of, same_instant};

fn now_rfc3339() -> Option<String> {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .ok()
}

impl Record {
    /// An empty record of `binding`.
    pub fn new(binding: &Binding, image_sha256: Option<&str>) -> Self {
        Record {
            kind: KIND.into(),
            format: FORMAT,
            subscription: binding.gallery.subscription.clone(),
            resource_group: binding.gallery.resource_group.clone(),
            gallery: binding.gallery.gallery.clone(),
            definition: binding.definition.clone(),
            version: binding.version.clone(),
            image_sha256: image_sha256.map(|s| s.trim().to_ascii_lowercase()),
            vhd_content: None,
            life: None,
            born: None,
            carried: Vec::new(),
            carried_cpi: Vec::new(),
            generation: 0,
            references: Vec::new(),
            removed: Vec::new(),
            handing_back: Vec::new(),
        }
    }

    /// Whether the record holds `reference`.
    pub fn holds(&self, reference: &str) -> bool {
        self.references.iter().any(|e| e.reference == reference)
    }

    /// The entry of `reference`, when held (or being handed back: who holds it is known).
    pub fn entry(&self, reference: &str) -> Option<&Entry> {
        self.references
            .iter()
            .chain(&self.handing_back)
            .find(|e| e.reference == reference)
    }

    /// This record with `handing` as the references being handed back, of which those `landed`
    /// (the version's `stemcell_references` shows them) are done and leave it.
    pub fn handing_back_now(mut self, handing: &[String], landed: &[String]) -> Record {
        let mut next: Vec<Entry> = Vec::new();
        for r in self
            .handing_back
            .iter()
            .map(|e| e.reference.clone())
            .chain(handing.iter().cloned())
        {
            if landed.contains(&r) || next.iter().any(|e| e.reference == r) {
                continue;
            }
            let entry = self.entry(&r).cloned().unwrap_or(Entry {
                reference: r.clone(),
                holder: None,
                recorded_at: None,
            });
            next.push(entry);
        }
        self.handing_back = next;
        self
    }

    /// Whether this tool removed `reference` (and has not recorded it again since).
    pub fn removed(&self, reference: &str) -> bool {
        !self.holds(reference) && self.removed.iter().any(|r| r.reference == reference)
    }

    /// The references held, in record order.
    pub fn references(&self) -> Vec<String> {
        self.references
            .iter()
            .map(|e| e.reference.clone())
            .collect()
    }

    /// Check the record belongs to `binding` and is well formed (`format`: the format expected
    /// where it was read). `Err` says why not.
    fn check(&self, binding: &Binding, format: u32) -> std::result::Result<(), String> {
        if self.kind != KIND {
            return Err(format!("its kind is {:?}, not {KIND:?}", self.kind));
        }
        if self.format != format {
            return Err(format!(
                "it has format {} (this release reads format {format} there; a newer release wrote it?)",
                self.format
            ));
        }
        let same = |a: &str, b: &str| a.eq_ignore_ascii_case(b);
        let identity_ok = format == LEGACY_FORMAT
            || (same(&self.subscription, &binding.gallery.subscription)
                && same(&self.resource_group, &binding.gallery.resource_group));
        if !identity_ok
            || !same(&self.gallery, &binding.gallery.gallery)
            || !same(&self.definition, &binding.definition)
            || !same(&self.version, &binding.version)
        {
            return Err(format!(
                "it is the record of {}/{}/{} (resource group {:?}, subscription {:?}), not of {}",
                self.gallery,
                self.definition,
                self.version,
                self.resource_group,
                self.subscription,
                binding.describe()
            ));
        }
        for (i, e) in self.references.iter().enumerate() {
            tags::validate_reference(&e.reference)
                .map_err(|err| format!("references[{i}]: {err}"))?;
            if let Some(h) = &e.holder {
                holder_label(h).map_err(|err| format!("references[{i}]: {err}"))?;
            }
            if self.references[..i]
                .iter()
                .any(|x| x.reference == e.reference)
            {
                return Err(format!("references[{i}] {} is listed twice", e.reference));
            }
        }
        Ok(())
    }

    /// This record after a reference write that left the version's tags as `new_tags` (the
    /// overflow is what this tool holds), `holders` saying who holds references added now, and
    /// `removed_now` removed by it. Entries keep their holder and time; removed ones become
    /// tombstones.
    pub fn after_write(
        &self,
        new_tags: &BTreeMap<String, String>,
        holders: &BTreeMap<String, String>,
        removed_now: &[String],
    ) -> Record {
        let ours: Vec<String> = tags::sourced_references(new_tags)
            .into_iter()
            .filter(|(_, s)| *s != tags::Source::StemcellReferences)
            .map(|(r, _)| r)
            .collect();
        self.with_references(&ours, holders, removed_now)
    }

    /// This record holding exactly `ours` (in order), with the holders `holders` names for
    /// references that have none yet, and `removed_now` remembered as removed.
    pub fn with_references(
        &self,
        ours: &[String],
        holders: &BTreeMap<String, String>,
        removed_now: &[String],
    ) -> Record {
        let stamp = now_rfc3339();
        let mut next = self.clone();
        next.references = ours
            .iter()
            .map(|r| match self.entry(r) {
                Some(e) => {
                    let mut e = e.clone();
                    if e.holder.is_none() {
                        e.holder = holders.get(r).cloned();
                    }
                    e
                }
                None => Entry {
                    reference: r.clone(),
                    holder: holders.get(r).cloned(),
                    recorded_at: stamp.clone(),
                },
            })
            .collect();
        // A reference recorded again is no longer removed; one removed now is remembered.
        next.removed.retain(|t| !ours.contains(&t.reference));
        for r in removed_now {
            if ours.contains(r) || next.removed.iter().any(|t| &t.reference == r) {
                continue;
            }
            next.removed.insert(
                0,
                Removed {
                    reference: r.clone(),
                    removed_at: stamp.clone(),
                },
            );
        }
        let now = time::OffsetDateTime::now_utc();
        let young = |t: &Removed| {
            t.removed_at
                .as_deref()
                .and_then(|at| {
                    time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
                        .ok()
                })
                .is_some_and(|at| now - at < TOMBSTONE_RETENTION)
        };
        let mut i = 0;
        next.removed.retain(|t| {
            i += 1;
            i <= TOMBSTONES || young(t)
        });
        next
    }
}

/// The references of a version whose tags are `tags` and whose record is `record`: the tags'
/// without what the record says this tool removed, then every reference the record holds that
/// the tags lost (see the module documentation), but for the CPI's own (`Record::carried_cpi`).
pub fn merged(tag_set: &BTreeMap<String, String>, record: Option<&Record>) -> Vec<String> {
    let canonical = tags::canonical_names(tag_set);
    let from_tags = tags::references(&canonical);
    let Some(rec) = record else {
        return from_tags;
    };
    let mut out: Vec<String> = from_tags.into_iter().filter(|r| !rec.removed(r)).collect();
    // A reference being handed back counts as the tags say (on this tool's side until the move
    // lands, on the CPI's after) — and, when the tags show it nowhere, as held: a stale write
    // that erased it before the move landed must not lose it (a CID the CPI removed right after
    // the move is kept instead: a leak, never a loss).
    let handing = rec
        .handing_back
        .iter()
        .filter(|e| !rec.removed(&e.reference));
    for e in rec.references.iter().chain(handing) {
        if !out.contains(&e.reference) && !rec.carried_cpi.contains(&e.reference) {
            out.push(e.reference.clone());
        }
    }
    out
}

/// Say, once, why a record that exists is not the version's (so an operator reading the log
/// knows why references it held are not counted).
fn warn_not_this_life(rec: &Record, v: Option<&ImageVersion>) {
    if rec.references.is_empty() {
        return;
    }
    let why = match v {
        None => "the version it was written for is gone (deleted)".to_string(),
        Some(v) => match (tags::get(&v.tags, tags::IMAGE_SHA256), &rec.image_sha256) {
            (Some(vs), Some(rs)) if !rec.is_for(&Content::image(vs)) => {
                format!("it was written for content {rs} but the version holds {vs}")
            }
            _ => format!(
                "it was written for the version published at {}, and the version now there was published at {} (deleted and made again)",
                rec.life.as_deref().unwrap_or("?"),
                life_of(v).unwrap_or_else(|| "?".into())
            ),
        },
    };
    tracing::warn!(
        definition = %rec.definition,
        version = %rec.version,
        "the reference record is not this version's ({why}); its references ({}) are not counted, and the next write replaces it",
        rec.references().join(", ")
    );
}

/// `v` as its record says it is: its tags rewritten (in memory only) so that their references
/// are [`merged`]. Unchanged when they already are. Every decision on a version is made on this
/// view; the next tag write makes Azure's tags the same.
pub fn healed(v: &ImageVersion, record: Option<&Record>) -> ImageVersion {
    let Some(rec) = record else {
        return v.clone();
    };
    let want = merged(&v.tags, Some(rec));
    let canonical = tags::canonical_names(&v.tags);
    if tags::references(&canonical) == want {
        return v.clone();
    }
    let mut out = v.clone();
    out.tags = tags::with_references_unchecked(
        &canonical,
        &want,
        &tags::sentinel(&v.definition, &v.version),
    );
    out
}

/// The stored bytes of one blob and its ETag.
#[derive(Debug, Clone)]
pub struct Stored {
    pub body: Vec<u8>,
    pub etag: String,
}

/// Where records live: small blobs beside the version locks, written conditionally.
#[async_trait::async_trait]
pub trait RecordStore: Send + Sync {
    /// The blob `name`; `None` when absent.
    async fn get(&self, name: &str) -> Result<Option<Stored>>;
    /// Write `body` to `name` only if it is as last read: with ETag `expect`, or absent when
    /// `None`. `Ok(Some(etag))`: written, now with that ETag; `Ok(None)`: it changed since (a
    /// precondition failed) and nothing was written.
    async fn put_if(&self, name: &str, body: &[u8], expect: Option<&str>)
        -> Result<Option<String>>;
    /// The names of the blobs under `prefix`.
    async fn list(&self, prefix: &str) -> Result<Vec<String>>;
}

/// The names of a record's two copies beside lock blob `lock`.
pub fn copy_names(lock: &str) -> [String; 2] {
    [format!("{lock}.refs"), format!("{lock}.refs.copy")]
}

/// The lock blob a record copy belongs to (`None` for another blob).
pub fn lock_of_copy(name: &str) -> Option<&str> {
    name.strip_suffix(".refs")
        .or_else(|| name.strip_suffix(".refs.copy"))
}

#[derive(Debug, Clone)]
enum Copy {
    Absent,
    Valid { etag: String, record: Box<Record> },
    Broken { etag: String, why: String },
}

/// A record as read from its two copies: what a write must replace.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The valid copy with the highest generation, whatever version it fits; `None` when
    /// neither copy exists. Decisions use [`Loaded::applicable`].
    pub record: Option<Record>,
    lock: String,
    binding: Binding,
    copies: [Copy; 2],
    /// The previous release's record (format 1, by gallery name), read only when neither copy
    /// of this gallery's own record exists.
    legacy: Option<Record>,
}

impl Loaded {
    /// Whether a copy is missing or unusable while the other is good (the next write repairs
    /// it).
    pub fn needs_repair(&self) -> bool {
        self.record.is_some() && self.copies.iter().any(|c| !matches!(c, Copy::Valid { .. }))
    }

    /// Whether both copies hold exactly `record` (nothing to write).
    pub fn holds_exactly(&self, record: &Record) -> bool {
        self.copies
            .iter()
            .all(|c| matches!(c, Copy::Valid { record: r, .. } if r.as_ref() == record))
    }

    /// The binding the record was read for.
    pub fn binding(&self) -> &Binding {
        &self.binding
    }

    /// The copies that are valid records of this version's binding.
    fn valid(&self) -> impl Iterator<Item = &Record> {
        self.copies.iter().filter_map(|c| match c {
            Copy::Valid { record, .. } => Some(record.as_ref()),
            _ => None,
        })
    }

    /// The record of the version as now read (`None`: absent): of the valid copies, those that
    /// [`Record::fits`] it, then the highest generation among them — a copy of other content or
    /// of a life that is over is never chosen over one that fits, whatever its generation.
    /// Without any copy of this gallery's own record, the previous release's record gives the
    /// holders of the references the version's tags show (and nothing else: it may be another
    /// gallery's of the same name).
    pub fn applicable(&self, v: Option<&ImageVersion>) -> Option<Record> {
        let valid: Vec<&Record> = self.valid().collect();
        let best = valid
            .iter()
            .filter(|r| r.fits(v))
            .max_by_key(|r| r.generation)
            .map(|r| (*r).clone());
        if best.is_none() {
            if let Some(r) = valid.iter().max_by_key(|r| r.generation) {
                warn_not_this_life(r, v);
            }
        }
        if best.is_some() || self.copies.iter().any(|c| !matches!(c, Copy::Absent)) {
            return best;
        }
        self.migrated_legacy(v)
    }

    /// The record a create of the absent version starts from: as [`Loaded::applicable`], but
    /// a copy of content `sha` is chosen over one of other content whatever their generations
    /// (with no version to compare, only the create knows the content).
    pub fn for_create(&self, content: &Content) -> Option<Record> {
        self.valid()
            .filter(|r| r.fits(None) && r.is_for(content))
            .max_by_key(|r| r.generation)
            .cloned()
            .or_else(|| self.applicable(None))
    }

    /// The previous release's record, for `v`: the entries whose references the version's
    /// tags show (this version's for sure), with their holders; its removals and any other
    /// entry are left (a record by name may be another gallery's).
    fn migrated_legacy(&self, v: Option<&ImageVersion>) -> Option<Record> {
        let (legacy, v) = (self.legacy.as_ref()?, v?);
        if let (Some(vs), Some(_)) = (tags::get(&v.tags, tags::IMAGE_SHA256), &legacy.image_sha256)
        {
            if !legacy.is_for(&Content::image(vs)) {
                return None;
            }
        }
        let shown = tags::references(&tags::canonical_names(&v.tags));
        let mut rec = Record::new(&self.binding, legacy.image_sha256.as_deref());
        rec.references = legacy
            .references
            .iter()
            .filter(|e| shown.contains(&e.reference))
            .cloned()
            .collect();
        if rec.references.is_empty() {
            return None;
        }
        Some(rec)
    }

    /// The record of `v` ([`Loaded::applicable`]), or a new empty one for content `sha`.
    pub fn or_new(&self, v: Option<&ImageVersion>, sha: Option<&str>) -> Record {
        self.applicable(v)
            .unwrap_or_else(|| Record::new(&self.binding, sha))
    }
}

fn parse_copy(
    stored: &Stored,
    binding: &Binding,
    format: u32,
) -> std::result::Result<Record, String> {
    if stored.body.iter().all(u8::is_ascii_whitespace) {
        return Err("it is empty".into());
    }
    let r: Record =
        serde_json::from_slice(&stored.body).map_err(|e| format!("it is not a record: {e}"))?;
    r.check(binding, format)?;
    Ok(r)
}

/// Read the record of `binding` beside lock blob `lock` (both copies; the previous release's,
/// beside its lock, when neither exists).
pub async fn load(store: &dyn RecordStore, lock: &str, binding: &Binding) -> Result<Loaded> {
    let names = copy_names(lock);
    let mut copies = [Copy::Absent, Copy::Absent];
    let mut best: Option<Record> = None;
    let mut broken = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let Some(stored) = store.get(name).await? else {
            continue;
        };
        match parse_copy(&stored, binding, FORMAT) {
            Ok(r) => {
                if best.as_ref().is_none_or(|b| r.generation > b.generation) {
                    best = Some(r.clone());
                }
                copies[i] = Copy::Valid {
                    etag: stored.etag,
                    record: Box::new(r),
                };
            }
            Err(why) => {
                broken.push(format!("{name}: {why}"));
                copies[i] = Copy::Broken {
                    etag: stored.etag,
                    why,
                };
            }
        }
    }
    if best.is_none() && !broken.is_empty() {
        return Err(Error::Record(RecordError::Unusable {
            version: binding.describe(),
            details: broken.join("; "),
        }));
    }
    if !broken.is_empty() {
        tracing::warn!(
            version = %binding.describe(),
            "one copy of the reference record is unusable ({}); the other is used, and the next write repairs it",
            broken.join("; ")
        );
    }
    let legacy = if copies.iter().all(|c| matches!(c, Copy::Absent)) {
        load_legacy(store, binding, None).await?
    } else {
        None
    };
    Ok(Loaded {
        record: best,
        lock: lock.to_string(),
        binding: binding.clone(),
        copies,
        legacy,
    })
}

/// The records of many versions for reading (planning, display; never for a write): one
/// listing of `prefix` (the gallery's locks) to find which records exist, then a read of the
/// first copy (which every write updates first), and of the second when the first is missing,
/// unusable or not of the version as read ([`Loaded::applicable`]'s rule). `wanted`: each
/// version's lock blob, binding and the version as read. `Err` for a version whose record
/// exists but no copy of which is usable.
pub async fn load_many(
    store: &dyn RecordStore,
    prefix: &str,
    wanted: &[(String, Binding, Option<ImageVersion>)],
) -> Result<Vec<std::result::Result<Option<Record>, Error>>> {
    use futures::StreamExt;
    let listed: std::collections::BTreeSet<String> =
        store.list(prefix).await?.into_iter().collect();
    let listed = &listed;
    // The previous release's records of this gallery (by its name), for versions without one
    // of their own: one more listing, then a read only of those it shows.
    let legacy: std::collections::BTreeSet<String> = match wanted.first() {
        Some((_, b, _)) => store
            .list(&super::blob_names::legacy_gallery_lock_prefix(
                &b.gallery.gallery,
            ))
            .await?
            .into_iter()
            .collect(),
        None => Default::default(),
    };
    let legacy = &legacy;
    Ok(
        futures::stream::iter(wanted.iter().map(|(lock, binding, v)| async move {
            let mut broken = Vec::new();
            let mut found = 0;
            for name in copy_names(lock) {
                if !listed.contains(&name) {
                    continue;
                }
                let Some(stored) = store.get(&name).await? else {
                    continue;
                };
                found += 1;
                match parse_copy(&stored, binding, FORMAT) {
                    Ok(r) if r.fits(v.as_ref()) => return Ok(Some(r)),
                    Ok(r) => warn_not_this_life(&r, v.as_ref()),
                    Err(why) => broken.push(format!("{name}: {why}")),
                }
            }
            if found > 0 && broken.len() == found {
                return Err(Error::Record(RecordError::Unusable {
                    version: binding.describe(),
                    details: broken.join("; "),
                }));
            }
            if found > 0 {
                return Ok(None);
            }
            // Not in this gallery's store yet: the previous release's record, as `load` reads it.
            let loaded = Loaded {
                record: None,
                lock: lock.clone(),
                binding: binding.clone(),
                copies: [Copy::Absent, Copy::Absent],
                legacy: load_legacy(store, binding, Some(legacy)).await?,
            };
            Ok(loaded.applicable(v.as_ref()))
        }))
        .buffered(16)
        .collect()
        .await,
    )
}

/// What [`save`] did.
#[derive(Debug)]
pub enum Saved {
    /// Both copies hold `record` now; the state to write over next.
    Written(Box<Loaded>),
    /// A copy changed since it was read (another writer): nothing more was written. Read again.
    Changed,
}

/// Write `record` over `loaded` (both copies, each only if unchanged since it was read), with
/// the next generation.
pub async fn save(store: &dyn RecordStore, loaded: &Loaded, record: Record) -> Result<Saved> {
    let names = copy_names(&loaded.lock);
    let top = loaded
        .copies
        .iter()
        .map(|c| match c {
            Copy::Valid { record, .. } => record.generation,
            Copy::Absent | Copy::Broken { .. } => 0,
        })
        .max()
        .unwrap_or(0);
    let mut record = record;
    record.generation = top + 1;
    let body = body_of(&record)?;
    let mut copies = loaded.copies.clone();
    for (i, name) in names.iter().enumerate() {
        let expect = match &loaded.copies[i] {
            Copy::Absent => None,
            Copy::Valid { etag, .. } | Copy::Broken { etag, .. } => Some(etag.as_str()),
        };
        if let Copy::Broken { why, .. } = &loaded.copies[i] {
            tracing::info!(blob = %name, "repairing the reference record copy ({why})");
        }
        let Some(etag) = store.put_if(name, &body, expect).await? else {
            return Ok(Saved::Changed);
        };
        copies[i] = Copy::Valid {
            etag,
            record: Box::new(record.clone()),
        };
    }
    Ok(Saved::Written(Box::new(Loaded {
        record: Some(record),
        lock: loaded.lock.clone(),
        binding: loaded.binding.clone(),
        copies,
        legacy: None,
    })))
}

/// A record as its copies store it.
fn body_of(record: &Record) -> Result<Vec<u8>> {
    serde_json::to_vec_pretty(record).map_err(|e| Error::RequestBuild {
        what: "reference record".into(),
        message: e.to_string(),
    })
}

/// How many times a record write is tried against a changing record before giving up.
pub const SAVE_ATTEMPTS: u32 = 4;

/// Read, change with `change` and write the record of `binding`, again on every concurrent
/// change (bounded). `change` returns `None` to write nothing. Returns the record as written
/// (or as read, when nothing was written).
pub async fn update<F>(
    store: &dyn RecordStore,
    lock: &str,
    binding: &Binding,
    mut change: F,
) -> Result<Option<Record>>
where
    F: FnMut(&Loaded) -> Result<Option<Record>>,
{
    for _ in 0..SAVE_ATTEMPTS {
        let loaded = load(store, lock, binding).await?;
        let Some(next) = change(&loaded)? else {
            return Ok(loaded.record);
        };
        match save(store, &loaded, next).await? {
            Saved::Written(l) => return Ok(l.record),
            Saved::Changed => continue,
        }
    }
    Err(Error::Record(RecordError::Contended {
        blob: copy_names(lock)[0].clone(),
        attempts: SAVE_ATTEMPTS,
    }))
}

mod memory;
pub use memory::MemoryRecords;

#[cfg(test)]
mod tests;
