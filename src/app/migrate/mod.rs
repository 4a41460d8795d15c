//! The `migrate` use case (issue 47): bring a director's pre-gallery stemcells into the gallery
//! without uploading anything. Without a compute gallery the Azure CPI kept each stemcell as the
//! page blob `stemcell/<cid>.vhd` in its default storage account, the stemcell's cloud
//! properties as the blob's metadata (REFERENCE.md "Pre-gallery stemcells"). A gallery version
//! can be made from that blob as it is.
//!
//! For every row of the director lists given (`bosh stemcells --json`), the plan ([`plan`])
//! reads, and changes nothing: whether the CID is already in the gallery, the blob's metadata
//! (the definition, generation and architecture the CPI derives from it), whether it is a fixed
//! VHD, and the VHD's content digest (its data pages only). A migrated version has no image
//! file, so no `image_sha256`: its content is known by that digest (`gallery::content`). The
//! plan names, per CID, what applying does: create the version from the blob, record the CID
//! on a version already holding the same content, skip, or a conflict (a version of that
//! stemcell version with other content, exit 4).
//!
//! Applying ([`apply`]) runs `ensure` for each planned CID (`gallery::service`): the same
//! reconcile, lock and ledger as every upload, so a re-run after a crash at any step converges,
//! two hosts migrating the same lists make one version, a CID is recorded once, and each held
//! version is locked (`gallery::protect`). Nothing here deletes a blob or a version.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use crate::app::Context;
use crate::cleanup::evidence::{DirectorStemcellsFile, EvidenceFile};
use crate::gallery::adopt::{ContentProof, SourceContent};
use crate::gallery::blob_store::{BlobStore, VhdSource};
use crate::gallery::service::{GalleryService, Mode, StemcellImage};
use crate::gallery::{tags, Content};

mod apply;
mod metadata;
#[cfg(test)]
mod tests;

pub use apply::{apply, Applied};

/// Where a migrated CID is recorded, so the director's CPI finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordFor {
    /// The director runs this tool's CPI front: the CID is recorded as the front records it
    /// (this tool's side of the ledger, with its holder).
    Front,
    /// The director runs the plain Azure CPI (v53.1+): the CID goes into
    /// `stemcell_references`, where that CPI's `create_vm` finds it and its `delete_stemcell`
    /// removes it (as `references hand-back` moves it).
    AzureCpi,
}

impl RecordFor {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordFor::Front => "front",
            RecordFor::AzureCpi => "azure-cpi",
        }
    }
}

/// What to migrate.
#[derive(Debug, Clone)]
pub struct MigrateRequest {
    /// The director lists (`bosh stemcells --json`), each with its director when the operator
    /// said (`HOLDER=FILE`).
    pub lists: Vec<EvidenceFile>,
    pub apply: bool,
    pub record_for: RecordFor,
    /// Stemcells read or migrated at once (at least 1).
    pub parallel: usize,
}

/// One row of a director list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub list: PathBuf,
    pub holder: Option<String>,
    pub name: String,
    /// As the list shows it, without the `*` of a deployed stemcell.
    pub version: String,
    pub cid: String,
}

/// Why a CID is left as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// A light stemcell: a Marketplace image, no blob, never in a gallery.
    Light,
    /// Not a CID of the Azure CPI's (`bosh-stemcell-<uuid>`).
    NotACid,
    /// A gallery version records it already.
    InGallery { version_id: String },
    /// Its blob `stemcell/<cid>.vhd` is not in the storage account.
    BlobGone,
    /// The blob cannot be a version's source (why).
    NotFixedVhd(String),
    /// Its metadata names no stemcell this tool can map (why).
    Unmappable(String),
    /// The same CID came earlier in the lists given.
    Repeated,
}

impl Skip {
    pub fn kind(&self) -> &'static str {
        match self {
            Skip::Light => "light",
            Skip::NotACid => "not-a-cid",
            Skip::InGallery { .. } => "in-gallery",
            Skip::BlobGone => "blob-gone",
            Skip::NotFixedVhd(_) => "not-a-fixed-vhd",
            Skip::Unmappable(_) => "unmappable",
            Skip::Repeated => "repeated",
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Skip::Light => {
                "a light stemcell (a Marketplace image): it has no blob and never enters a gallery"
                    .into()
            }
            Skip::NotACid => "not an Azure CPI stemcell CID (bosh-stemcell-<uuid>)".into(),
            Skip::InGallery { version_id } => format!("already in the gallery: {version_id}"),
            Skip::BlobGone => "its blob is not in the storage account (deleted, or another account's): nothing to make a version from".into(),
            Skip::NotFixedVhd(why) => format!("its blob cannot be a version's source: {why}"),
            Skip::Unmappable(why) => why.clone(),
            Skip::Repeated => "named earlier in the lists given".into(),
        }
    }
}

/// What applying does (or did not) with one CID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Create the version from the CID's blob.
    Create,
    /// Record the CID on a version of the same content: there already (`version_id`), or made
    /// in this run for an earlier CID (`with_cid`).
    Record {
        version_id: Option<String>,
        with_cid: Option<String>,
    },
    Skip(Skip),
    /// A version of that stemcell version holds other content, or content that cannot be
    /// proven the same (exit 4).
    Conflict(String),
}

impl Verdict {
    pub fn kind(&self) -> &'static str {
        match self {
            Verdict::Create => "create",
            Verdict::Record { .. } => "record",
            Verdict::Skip(_) => "skip",
            Verdict::Conflict(_) => "conflict",
        }
    }
}

/// One CID's plan: what was read, and the verdict.
#[derive(Debug, Clone)]
pub struct Entry {
    pub row: Row,
    /// The blob's URI (no SAS).
    pub blob: Option<String>,
    pub stemcell: Option<StemcellImage>,
    pub definition: Option<String>,
    /// The VHD content digest.
    pub digest: Option<String>,
    pub verdict: Verdict,
    /// The managed images the Azure CPI made from this CID's blob (`<cid>-<type>-<location>`):
    /// no longer needed for new VMs once the CID is in the gallery; reported, never deleted.
    pub managed_images: Vec<String>,
}

impl Entry {
    fn skipped(row: Row, skip: Skip) -> Entry {
        Entry {
            row,
            blob: None,
            stemcell: None,
            definition: None,
            digest: None,
            verdict: Verdict::Skip(skip),
            managed_images: Vec::new(),
        }
    }

    /// The gallery version key (`1.506.0`).
    pub fn key(&self) -> Option<&str> {
        self.stemcell.as_ref().map(|s| s.version_key.as_str())
    }

    /// `definition/key` of the version it maps to, when its blob was read.
    pub fn version(&self) -> Option<String> {
        self.definition
            .as_ref()
            .zip(self.key())
            .map(|(d, k)| format!("{d}/{k}"))
    }
}

/// Read every list given: its rows, in order, with their holders.
pub async fn read_lists(lists: &[EvidenceFile]) -> anyhow::Result<Vec<Row>> {
    let mut rows = Vec::new();
    for l in lists {
        let file = DirectorStemcellsFile::new(&l.path).with_holder(l.holder.clone());
        for (name, version, cid) in file.rows().await? {
            rows.push(Row {
                list: l.path.clone(),
                holder: l.holder.clone(),
                name,
                version: version.trim_end_matches('*').trim().to_string(),
                cid,
            });
        }
    }
    Ok(rows)
}

/// The plan of a run: one entry per row of the lists, in their order.
#[derive(Debug, Clone)]
pub struct Plan {
    pub entries: Vec<Entry>,
    /// Why the resource group's managed images could not be listed (`None`: they were).
    pub images_unread: Option<String>,
}

/// The plan: for every row, read what applying needs, in parallel (`parallel` at once), and
/// decide; and the managed images the CPI made from each CID's blob. Writes nothing.
pub async fn plan(conn: &Context, rows: Vec<Row>, parallel: usize) -> anyhow::Result<Plan> {
    let mut entries = read_all(conn, rows, parallel).await?;
    // One list of the group's managed images; one that cannot be read (a role without
    // Microsoft.Compute/images/read) only leaves them unreported.
    let images_unread = match conn.service.api().managed_images().await {
        Ok(images) => {
            for e in entries.iter_mut() {
                let prefix = format!("{}-", e.row.cid);
                e.managed_images = images
                    .iter()
                    .filter(|n| n.starts_with(&prefix))
                    .cloned()
                    .collect();
            }
            None
        }
        Err(err) => {
            tracing::warn!("the managed images of the resource group were not listed: {err}");
            Some(err.to_string())
        }
    };
    Ok(Plan {
        entries,
        images_unread,
    })
}

/// Read and decide every row (see [`plan`]).
async fn read_all(conn: &Context, rows: Vec<Row>, parallel: usize) -> anyhow::Result<Vec<Entry>> {
    use futures::StreamExt;
    let store = conn.blob_store("reading the director's stemcell blobs (stemcell/<cid>.vhd)")?;
    // One listing of the gallery tells every CID it records (as the Azure CPI finds a CID).
    // Only a version that serves its image counts: one still being written (a tags write whose
    // writer was killed before it saw the answer) goes through `ensure`, which waits for it.
    let mut in_gallery: HashMap<String, String> = HashMap::new();
    for (_, versions) in conn.service.list().await? {
        for v in versions.into_iter().filter(|v| v.phase().serves_image()) {
            for r in tags::references(&v.tags) {
                in_gallery.entry(r).or_insert_with(|| v.id.clone());
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    let mut firsts = Vec::new();
    let mut repeated = Vec::new();
    for (i, row) in rows.into_iter().enumerate() {
        if seen.insert(row.cid.clone()) {
            firsts.push((i, row));
        } else {
            repeated.push((i, Entry::skipped(row, Skip::Repeated)));
        }
    }
    let suffix = conn.settings.create_env_definition_suffix().to_string();
    let read = futures::stream::iter(firsts.into_iter().map(|(i, row)| {
        let in_gallery = &in_gallery;
        let suffix = &suffix;
        async move { (i, read_one(conn, store, in_gallery, suffix, row).await) }
    }))
    .buffer_unordered(parallel.max(1))
    .collect::<Vec<_>>()
    .await;
    let mut entries: Vec<(usize, Entry)> = repeated;
    for (i, e) in read {
        entries.push((i, e?));
    }
    entries.sort_by_key(|(i, _)| *i);
    let mut entries: Vec<Entry> = entries.into_iter().map(|(_, e)| e).collect();
    decide_within_run(&mut entries);
    Ok(entries)
}

/// Read one row's blob and the version it maps to, and decide on it alone.
async fn read_one(
    conn: &Context,
    store: &dyn BlobStore,
    in_gallery: &HashMap<String, String>,
    suffix: &str,
    row: Row,
) -> anyhow::Result<Entry> {
    if row.cid.starts_with("bosh-light-stemcell-") {
        return Ok(Entry::skipped(row, Skip::Light));
    }
    if !tags::is_cid(&row.cid) {
        return Ok(Entry::skipped(row, Skip::NotACid));
    }
    if let Some(id) = in_gallery.get(&row.cid) {
        let version_id = id.clone();
        return Ok(Entry::skipped(row, Skip::InGallery { version_id }));
    }
    let container = crate::names::STEMCELL_CONTAINER;
    let name = format!("{}.vhd", row.cid);
    let Some(meta) = store.metadata(container, &name).await? else {
        return Ok(Entry::skipped(row, Skip::BlobGone));
    };
    match store.check_vhd(container, &name).await? {
        VhdSource::Fixed { .. } => {}
        VhdSource::Missing => return Ok(Entry::skipped(row, Skip::BlobGone)),
        VhdSource::Unfit(why) => return Ok(Entry::skipped(row, Skip::NotFixedVhd(why))),
    }
    let blob = store.blob_url(container, &name);
    let stemcell = match metadata::stemcell_of(&row, &meta) {
        Ok(s) => s,
        Err(skip) => return Ok(Entry::skipped(row, skip)),
    };
    let definition = GalleryService::definition_name(&stemcell, Mode::Director, suffix);
    tracing::info!(cid = %row.cid, blob = %name, "reading the data pages of the blob for its content digest");
    let digest = match crate::progress::while_waiting(
        || format!("the content digest of {container}/{name} (its data pages)"),
        store.content(&blob),
    )
    .await?
    {
        SourceContent::Digest(d) => d,
        SourceContent::Gone => return Ok(Entry::skipped(row, Skip::BlobGone)),
        SourceContent::Unreadable(why) => return Ok(Entry::skipped(row, Skip::NotFixedVhd(why))),
    };
    let content = Content::vhd(&digest);
    let stemcell = StemcellImage {
        content: content.clone(),
        ..stemcell
    };
    let observed = conn
        .service
        .api()
        .get_version(&definition, &stemcell.version_key, false)
        .await?;
    let verdict = match &observed {
        None => Verdict::Create,
        Some(v) => judge_existing(store, v, &content, &blob).await?,
    };
    Ok(Entry {
        row,
        blob: Some(blob),
        stemcell: Some(stemcell),
        definition: Some(definition),
        digest: Some(digest),
        verdict,
        managed_images: Vec::new(),
    })
}

/// A version of the stemcell's version is there: the same content (recorded, or proven from
/// its source blob, as `ensure` adopts), or a conflict naming both.
async fn judge_existing(
    store: &dyn BlobStore,
    v: &crate::gallery::ImageVersion,
    content: &Content,
    blob: &str,
) -> anyhow::Result<Verdict> {
    let record = || Verdict::Record {
        version_id: Some(v.id.clone()),
        with_cid: None,
    };
    if content.held_by(&v.tags) {
        return Ok(record());
    }
    let shown = crate::redact::uri(blob);
    if let Some(other) = content.recorded(&v.tags) {
        return Ok(Verdict::Conflict(format!(
            "{} holds other content (VHD content digest {other}) than the blob {shown} ({})",
            v.id,
            content.digest()
        )));
    }
    let source = match v.source_uri.as_deref() {
        Some(uri) => store.content(uri).await?,
        None => SourceContent::Gone,
    };
    Ok(match source {
        SourceContent::Digest(d) if d.eq_ignore_ascii_case(content.digest()) => record(),
        SourceContent::Digest(d) => Verdict::Conflict(format!(
            "{} holds other content: its source blob's VHD content digest is {d}, the blob {shown}'s is {}",
            v.id,
            content.digest()
        )),
        SourceContent::Gone | SourceContent::Unreadable(_) => Verdict::Conflict(format!(
            "{} has no VHD content digest and its source blob {} cannot be read, so nothing proves it holds the blob {shown}",
            v.id,
            v.source_uri.as_deref().map(crate::redact::uri).unwrap_or_else(|| "(none recorded)".into())
        )),
    })
}

/// Two CIDs of one stemcell version in this run: the first to create makes it; a later one of
/// the same content is recorded on it, one of other content is a conflict naming both.
fn decide_within_run(entries: &mut [Entry]) {
    let mut first: BTreeMap<(String, String), (String, String)> = BTreeMap::new();
    for e in entries.iter_mut() {
        if !matches!(e.verdict, Verdict::Create) {
            continue;
        }
        let (Some(d), Some(k), Some(digest)) = (e.definition.clone(), e.key(), e.digest.clone())
        else {
            continue;
        };
        match first.get(&(d.clone(), k.to_string())) {
            None => {
                first.insert((d, k.to_string()), (e.row.cid.clone(), digest));
            }
            Some((cid, theirs)) if *theirs == digest => {
                e.verdict = Verdict::Record {
                    version_id: None,
                    with_cid: Some(cid.clone()),
                };
            }
            Some((cid, theirs)) => {
                e.verdict = Verdict::Conflict(format!(
                    "{cid} maps to the same version {d}/{k} with other content (VHD content digest {theirs}, this blob's {digest})"
                ));
            }
        }
    }
}

/// The migrated side of the content proof: the blob's digest, already read, and the source
/// blob of a version already there (`ensure` adopts a version without the digest's tag when
/// its source holds the same VHD).
pub(crate) struct BlobProof<'a> {
    pub digest: String,
    pub store: &'a dyn BlobStore,
}

#[async_trait::async_trait]
impl ContentProof for BlobProof<'_> {
    async fn local_digest(&self) -> crate::gallery::error::Result<String> {
        Ok(self.digest.clone())
    }

    async fn source_digest(&self, uri: &str) -> crate::gallery::error::Result<SourceContent> {
        self.store.content(uri).await
    }
}

/// The stemcell a blob's metadata describes, as the Azure CPI derives it: its Hyper-V
/// generation and architecture (for the CLI's dry-run lines and JSON).
pub fn generation_and_architecture(s: &StemcellImage) -> (&'static str, &'static str) {
    use crate::gallery::{Architecture, HyperVGeneration};
    (
        match s.generation {
            HyperVGeneration::V1 => "gen1",
            HyperVGeneration::V2 => "gen2",
        },
        match s.architecture {
            Architecture::X64 => "x64",
            Architecture::Arm64 => "arm64",
        },
    )
}
