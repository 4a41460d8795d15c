//! The gallery service: ensure, lookup, list, references and deletion.
//!
//! `ensure` is a reconcile loop: observe the version (one GET), decide with the pure
//! `decide::decide`, apply one step, observe again. Writes happen under a cross-host lock and are
//! preceded by a fresh observation under that lock, so any number of processes on any number of
//! hosts converge on one version that carries every caller's reference.
//!
//! This file holds the service's types, its construction and its reads; the children hold
//! `ensure`'s loop ([`ensure`]), the writes it makes under the lock ([`write`]), removing a
//! reference ([`remove`]), and describing a stemcell ([`stemcell`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::adopt::Adopted;
use super::error::{Error, Result};
use super::guarded::{self, merge_references, Delta};
use super::lock::{gallery_lock_prefix, parse_version_lock_name, version_lock_name, Locks};
use super::model::*;
use super::tags;
use super::GalleryApi;

mod ensure;
mod remove;
mod restore;
mod stemcell;
mod write;

pub use restore::Restore;
pub use stemcell::StemcellImage;

/// Which image definition a version belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Director,
    CreateEnv,
}

impl Mode {
    pub fn as_str(&self) -> &'static str {
        match self {
            Mode::Director => "director",
            Mode::CreateEnv => "create-env",
        }
    }
}

pub use crate::stemcell::naming::DEFAULT_CREATE_ENV_SUFFIX;

#[derive(Debug, Clone)]
pub struct EnsureRequest {
    pub stemcell: StemcellImage,
    pub mode: Mode,
    pub create_env_suffix: String,
    pub source_uri: String,
    pub storage_account_id: String,
    /// Empty means the gallery's location with Azure's defaults.
    pub target_regions: Vec<TargetRegion>,
    pub replica_count: Option<u32>,
    pub exclude_from_latest: bool,
    /// The end of life (a span counts from the create, by Azure's clock) and deletion block a
    /// version this request creates gets; checked by the front before anything is written.
    pub safeguards: crate::safeguards::Safeguards,
    pub extra_tags: BTreeMap<String, String>,
    pub reference: Option<String>,
    /// Who holds `reference` (`gallery::record::holder_label`): the director UUID of a CPI
    /// request, an operator's `--holder`.
    pub holder: Option<String>,
    /// This writer's announcement to the version's lock ([`GalleryService::arrive`]), made
    /// once it read the version and before it asks for the lock: `ensure` removes it once the reference is handed over or
    /// the lock taken, and on every other way out.
    pub arrival: Option<String>,
    /// The caller listed the definition's soft-deleted versions just before (`seed` and the CPI,
    /// before their upload) and none holds this name: `ensure`'s first create does not list
    /// them again (a refused create lists them again all the same).
    pub soft_deleted_checked: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Created,
    Reused,
    Waited,
    Recreated,
    /// The version's name was soft-deleted, with this content: restored, nothing uploaded.
    Restored,
}

#[derive(Debug, Clone)]
pub struct Ensured {
    pub outcome: Outcome,
    pub mode: Mode,
    pub definition: String,
    pub version: ImageVersion,
    /// The version had no `image_sha256` and was adopted by this call (see [`super::adopt`]).
    pub adopted: Option<Adopted>,
}

/// What removing a reference did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removal {
    /// The reference was removed; other references keep the version.
    ReferenceRemoved { remaining: Vec<String> },
    /// No reference remains and nothing uses it: the version was deleted.
    Deleted,
    /// No reference remains but these consumers still use the version: it stays.
    KeptInUse { consumers: Vec<Consumer> },
    /// No reference remains, but the identity cannot see every consumer (a scope it may not read
    /// whole, `Error::PartialView`), so non-use is unproven: the version stays, and `why` says so.
    KeptUnproven { why: String },
    /// No reference remains, but Azure refuses to delete the version before its end of life
    /// (`until`, when it names one): it stays, and this tool never lifts the block.
    KeptBlocked { until: Option<time::OffsetDateTime> },
    /// No reference remains, but a management lock this tool does not own applies to the
    /// version (`locks`: which, and at what scope): it stays, and this tool never lifts it.
    KeptLocked { locks: String },
    /// No reference remains, but the version is Failed in a gallery with soft delete on, where
    /// Azure cannot delete it: it stays (`error::FAILED_IN_SOFT_DELETE_REMEDY` says what to do).
    KeptFailedInSoftDeleteGallery,
    /// The version does not exist.
    NotFound,
    /// The version exists but does not record the reference: nothing was removed or deleted
    /// (`references`: what it does record).
    NotRecorded {
        reference: String,
        references: Vec<String>,
        /// The version's record shows this tool removed it (a re-run of a removal that was
        /// done, or a removal done meanwhile by another call): nothing left to do.
        already_removed: bool,
    },
    /// The version does not exist, but its reference record carried the reference (for the
    /// re-create of a Failed version being replaced): removed there (`remaining` stay carried).
    CarriedRemoved { remaining: Vec<String> },
}

/// Where a reference was found ([`GalleryService::find_reference`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// On this version's tags.
    Version(Box<ImageVersion>),
    /// Only in the reference record of `definition`/`key` (the version may be gone).
    Record { definition: String, key: String },
}

/// Reads the region of the gallery itself (one GET of the gallery). New image definitions and
/// versions go there when no location is configured.
#[async_trait::async_trait]
pub trait GalleryLocation: Send + Sync {
    async fn gallery_location(&self) -> Result<String>;
}

/// Where new definitions and versions are created.
#[derive(Clone)]
pub enum Location {
    /// Configured (`--location`, `STEMCELL_GALLERY_LOCATION`, `location` in the config file).
    Configured(String),
    /// Not configured: the gallery's own region, read once, when the first write needs it.
    OfGallery(Arc<dyn GalleryLocation>),
}

pub struct GalleryService {
    api: Arc<dyn GalleryApi>,
    locks: Arc<dyn Locks>,
    gallery: GalleryRef,
    location: Location,
    resolved_location: tokio::sync::OnceCell<String>,
}

impl GalleryService {
    pub fn new(
        api: Arc<dyn GalleryApi>,
        locks: Arc<dyn Locks>,
        gallery: GalleryRef,
        location: impl Into<String>,
    ) -> Self {
        Self::with_location(api, locks, gallery, Location::Configured(location.into()))
    }

    /// A service whose location is configured, or read from the gallery when first needed.
    pub fn with_location(
        api: Arc<dyn GalleryApi>,
        locks: Arc<dyn Locks>,
        gallery: GalleryRef,
        location: Location,
    ) -> Self {
        Self {
            api,
            locks,
            gallery,
            location,
            resolved_location: tokio::sync::OnceCell::new(),
        }
    }

    /// The region new definitions and versions are created in: the configured one, else the
    /// gallery's own (one GET of the gallery, only when a write needs it, then remembered).
    pub async fn location(&self) -> Result<String> {
        match &self.location {
            Location::Configured(l) => Ok(l.clone()),
            Location::OfGallery(source) => self
                .resolved_location
                .get_or_try_init(|| async {
                    let l = source.gallery_location().await?;
                    tracing::info!(
                        location = %l,
                        "no location configured: creating in the gallery's location {l}"
                    );
                    Ok::<_, Error>(l)
                })
                .await
                .cloned(),
        }
    }

    pub fn api(&self) -> &Arc<dyn GalleryApi> {
        &self.api
    }

    pub fn gallery(&self) -> &GalleryRef {
        &self.gallery
    }

    /// The cross-host locks every write and delete of a version takes.
    pub fn locks(&self) -> &Arc<dyn Locks> {
        &self.locks
    }

    pub(crate) fn lock_name(&self, definition: &str, key: &str) -> String {
        version_lock_name(&self.gallery, definition, key)
    }

    /// Announce a writer that observed `observed` and will add `reference` to it (see
    /// [`super::decide::announces`]), so that the lock's holder gathers its reference into the
    /// same write (group commit; `lock::Gather`). Best effort: `None` when there is nothing to
    /// announce, without hand-over support, or when the announcement failed (the writer is then
    /// only not waited for).
    pub async fn arrive(
        &self,
        observed: Option<&ImageVersion>,
        reference: Option<&str>,
    ) -> Option<String> {
        if !super::decide::announces(observed, reference) {
            return None;
        }
        let (definition, key) = observed.map(|v| (v.definition.as_str(), v.version.as_str()))?;
        self.announce(definition, key).await
    }

    /// Announce a writer about to create the version `definition/key` with `reference` (issue
    /// 49), once its input was checked and before its upload: writers of a burst pass the upload
    /// lock one after another, and the first, about to create, gathers the references of those
    /// announced into its PUT (`lock::Gather`). Best effort, as [`GalleryService::arrive`].
    pub async fn arrive_to_create(
        &self,
        definition: &str,
        key: &str,
        reference: Option<&str>,
    ) -> Option<String> {
        reference?;
        self.announce(definition, key).await
    }

    /// Post this writer's arrival beside the lock of `definition/key` (best effort).
    async fn announce(&self, definition: &str, key: &str) -> Option<String> {
        let ho = self.locks.handover()?;
        match ho.arrive(&self.lock_name(definition, key)).await {
            Ok(id) => Some(id),
            Err(e) => {
                tracing::debug!(definition, version = key, error = %e, "could not announce this writer to the version's lock");
                None
            }
        }
    }

    /// Remove an arrival [`GalleryService::arrive`] made (best effort).
    pub async fn leave(&self, arrival: Option<String>) {
        if let (Some(id), Some(ho)) = (arrival, self.locks.handover()) {
            ho.leave(&id).await;
        }
    }

    /// Bring the version's delete lock in line with its references (`gallery::protect`), under
    /// its lock on a fresh read: `cleanup --apply`'s repair of a lock a crash, a refused PUT or
    /// an operator's hand left out of line. `true` when the lock was placed or lifted; a
    /// failure is logged (the next write or cleanup tries again).
    pub async fn repair_lock(&self, definition: &str, key: &str) -> bool {
        let lock_name = self.lock_name(definition, key);
        let held = match self.locks.acquire(&lock_name).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(definition, version = key, error = %e, "could not take the version's lock to repair its delete lock");
                return false;
            }
        };
        let repaired = match self.api.get_version(definition, key, false).await {
            Ok(Some(v)) => super::protect::settle(self.api.as_ref(), &v).await,
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(definition, version = key, error = %e, "could not read the version to repair its delete lock");
                false
            }
        };
        held.release().await;
        repaired
    }

    /// Where a guarded delete of `definition`/`key` happens (this service's API and locks).
    pub(crate) fn guarded_target<'a>(
        &'a self,
        lock_name: &'a str,
        definition: &'a str,
        key: &'a str,
    ) -> guarded::Target<'a> {
        guarded::Target {
            api: self.api.as_ref(),
            locks: self.locks.as_ref(),
            lock_name,
            gallery: &self.gallery,
            definition,
            key,
            carry: false,
        }
    }

    /// The definition a mode writes to.
    pub fn definition_name(stemcell: &StemcellImage, mode: Mode, suffix: &str) -> String {
        match mode {
            Mode::Director => stemcell.definition.clone(),
            Mode::CreateEnv => {
                crate::stemcell::naming::create_env_definition(&stemcell.definition, suffix)
            }
        }
    }

    /// The definition to create when missing: the Azure CPI's identifier scheme (publisher
    /// `bosh`, offer = definition name, sku gen1/gen2), so both tools share definitions.
    pub fn definition_spec(
        &self,
        stemcell: &StemcellImage,
        name: &str,
        mode: Mode,
        location: &str,
    ) -> DefinitionSpec {
        DefinitionSpec {
            name: name.to_string(),
            location: location.to_string(),
            publisher: "bosh".into(),
            offer: name.to_string(),
            sku: match stemcell.generation {
                HyperVGeneration::V1 => "gen1".into(),
                HyperVGeneration::V2 => "gen2".into(),
            },
            architecture: stemcell.architecture,
            generation: stemcell.generation,
            features: stemcell.features.clone(),
            tags: BTreeMap::from([
                (tags::MODE.to_string(), mode.as_str().to_string()),
                (tags::CREATED_BY.to_string(), created_by()),
            ]),
        }
    }

    /// Tags of a new version: the Azure CPI's, ours (with the create's birth mark `mark`),
    /// extra, and the reference.
    pub fn version_tags(
        &self,
        req: &EnsureRequest,
        definition: &str,
        mark: &str,
    ) -> Result<BTreeMap<String, String>> {
        let s = &req.stemcell;
        let mut t = BTreeMap::new();
        for (k, v) in &s.cloud_property_tags {
            t.insert(k.clone(), tags::fit_value(v));
        }
        for (k, v) in &req.extra_tags {
            t.insert(k.clone(), tags::fit_value(v));
        }
        t.insert(s.content.tag().into(), s.content.digest().to_string());
        t.insert(tags::GALLERY_NAME.into(), self.gallery.gallery.clone());
        t.insert(tags::IMAGE_DEFINITION.into(), definition.to_string());
        t.insert(tags::MODE.into(), req.mode.as_str().into());
        t.insert(tags::STEMCELL.into(), tags::fit_value(&s.name));
        t.insert(tags::STEMCELL_VERSION.into(), tags::fit_value(&s.version));
        t.insert(tags::SOURCE_BLOB.into(), tags::fit_value(&req.source_uri));
        t.insert(tags::CREATED_BY.into(), created_by());
        t.insert(tags::BIRTH_MARK.into(), mark.to_string());
        let refs: Vec<String> = req.reference.iter().cloned().collect();
        let key = req.stemcell.version_key.as_str();
        tags::with_references(&t, &refs, &tags::sentinel(definition, key))
            .map_err(Error::NewVersionTags)
    }

    /// Ensure the version for this stemcell exists with this content and carries the reference.
    /// A version without `image_sha256` is refused (exit 4); see [`GalleryService::ensure_adopting`].
    pub async fn ensure(&self, req: &EnsureRequest) -> Result<Ensured> {
        self.ensure_adopting(req, None).await
    }

    pub async fn lookup(&self, definition: &str, key: &str) -> Result<Option<ImageVersion>> {
        self.api.get_version(definition, key, true).await
    }

    /// Find the version a stemcell CID refers to, as the Azure CPI does (through the tags).
    pub async fn lookup_by_reference(&self, reference: &str) -> Result<Option<ImageVersion>> {
        for d in self.api.list_definitions().await? {
            for v in self.api.list_versions(&d.name).await? {
                if tags::references(&v.tags).iter().any(|r| r == reference) {
                    return Ok(Some(v));
                }
            }
        }
        Ok(None)
    }

    /// Find where `reference` is held: on a version's tags (as the Azure CPI finds a CID), else
    /// in a version's reference record only — a version whose tags lost it to a late write, or
    /// a Failed version being replaced (gone, its references carried in the record). Records are
    /// searched only when no version's tags hold it (one listing of the lock container, then one
    /// read per record). A record no copy of which is usable is an error (it may hold
    /// `reference`): a decision must not take "not found" for an answer.
    pub async fn find_reference(&self, reference: &str) -> Result<Option<Found>> {
        self.find_reference_in(reference, true).await
    }

    /// [`GalleryService::find_reference`]; `strict: false` skips (and logs) an unusable record
    /// instead, for a caller that only routes (the CPI's `create_vm`, which the delegate then
    /// answers for a CID that is not found).
    async fn find_reference_in(&self, reference: &str, strict: bool) -> Result<Option<Found>> {
        if let Some(v) = self.lookup_by_reference(reference).await? {
            return Ok(Some(Found::Version(Box::new(v))));
        }
        let Some(store) = self.locks.records() else {
            return Ok(None);
        };
        let prefix = gallery_lock_prefix(&self.gallery);
        let mut locks: Vec<String> = store
            .list(&prefix)
            .await?
            .iter()
            .filter_map(|name| super::record::lock_of_copy(name).map(str::to_string))
            .collect();
        locks.dedup();
        for lock in &locks {
            let Some((definition, key)) = parse_version_lock_name(&prefix, lock) else {
                continue;
            };
            let binding = super::record::Binding::new(&self.gallery, definition, key);
            // A record no copy of which is usable may hold `reference`: whoever asks (a
            // delete, the CPI's delete_stemcell, a lookup) must not take "not found" for an
            // answer it cannot give. The error names the version and the repair.
            let loaded = match super::record::load(store, lock, &binding).await {
                Ok(l) => l,
                Err(e) if !strict => {
                    tracing::warn!("cannot read the reference record beside {lock}: {e}");
                    continue;
                }
                Err(e) => return Err(e),
            };
            // The record of the version there now (or carried to the next one); with no
            // version there, the record of its last life too: a soft-deleted version (listed
            // without its tags) still holds what its record holds, and a removal must reach it
            // before a restore brings it back.
            let current = self.api.get_version(definition, key, false).await?;
            if loaded.holds(current.as_ref(), reference) {
                return Ok(Some(Found::Record {
                    definition: definition.to_string(),
                    key: key.to_string(),
                }));
            }
        }
        Ok(None)
    }

    /// The stemcell CID the delegate Azure CPI's `create_vm` resolves to the version holding
    /// `cid`: `cid` itself when it is in `stemcell_references`, else that version's sentinel (the
    /// reference lives in the overflow, which the CPI does not read). `None` when no version
    /// records `cid` (not ours: the delegate decides). A version still in an earlier ledger format
    /// is rewritten first, under its lock, so its sentinel exists.
    pub async fn cpi_resolvable(&self, cid: &str) -> Result<Option<String>> {
        let v = match self.find_reference_in(cid, false).await? {
            None => return Ok(None),
            Some(Found::Version(v)) => *v,
            // Held in a record only: the version's tags lost it to a late write (or the version
            // is gone). Restore the tags under the lock first; the CPI reads nothing else.
            Some(Found::Record { definition, key }) => {
                let lock_name = self.lock_name(&definition, &key);
                let held = self.locks.acquire(&lock_name).await?;
                let target = self.guarded_target(&lock_name, &definition, &key);
                let r = merge_references(&target, held.as_ref(), &Delta::none()).await;
                held.release().await;
                match r? {
                    Some(v) => v,
                    None => return Ok(None),
                }
            }
        };
        if tags::cpi_resolves(&v.tags, cid) {
            return Ok(Some(cid.to_string()));
        }
        let sentinel = tags::sentinel(&v.definition, &v.version);
        if tags::sentinel_in(&v.tags).as_deref() == Some(sentinel.as_str()) {
            return Ok(Some(sentinel));
        }
        let lock_name = self.lock_name(&v.definition, &v.version);
        let held = self.locks.acquire(&lock_name).await?;
        let target = self.guarded_target(&lock_name, &v.definition, &v.version);
        let r = merge_references(&target, held.as_ref(), &Delta::add_all(&[cid.to_string()])).await;
        held.release().await;
        let Some(v) = r? else {
            return Ok(None);
        };
        if tags::cpi_resolves(&v.tags, cid) {
            return Ok(Some(cid.to_string()));
        }
        if tags::sentinel_in(&v.tags).as_deref() == Some(sentinel.as_str()) {
            return Ok(Some(sentinel));
        }
        Err(Error::NoSentinel {
            id: v.id,
            cid: cid.to_string(),
            sentinel,
        })
    }

    /// The reference records of `versions` (who holds each reference, what a late tag write
    /// erased), read without the lock; `None` for a version without one, or when no storage
    /// account holds them. For display: a record that cannot be read is logged, not fatal.
    pub async fn records_of(
        &self,
        versions: &[ImageVersion],
    ) -> Vec<Option<super::record::Record>> {
        match self.load_records(versions).await {
            Ok(loads) => versions
                .iter()
                .zip(loads)
                .map(|(v, l)| match l {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::warn!(version = %v.id, "cannot read its reference record (holders not shown): {e}");
                        None
                    }
                })
                .collect(),
            Err(e) => {
                tracing::warn!("cannot list the reference records (holders not shown): {e}");
                vec![None; versions.len()]
            }
        }
    }

    /// The reference records of `versions` for a decision (`references hand-back`): as
    /// [`GalleryService::records_of`], but a record that exists and cannot be used is an error
    /// naming the version and the repair, never a version without references.
    pub async fn records_of_checked(
        &self,
        versions: &[ImageVersion],
    ) -> Result<Vec<Option<super::record::Record>>> {
        self.load_records(versions).await?.into_iter().collect()
    }

    /// Each version's record (`record::load_many`: the listings, then one read per record that
    /// exists); none without a storage account, and no request for no versions.
    async fn load_records(
        &self,
        versions: &[ImageVersion],
    ) -> Result<Vec<Result<Option<super::record::Record>>>> {
        let Some(store) = self.locks.records() else {
            return Ok(versions.iter().map(|_| Ok(None)).collect());
        };
        if versions.is_empty() {
            return Ok(Vec::new());
        }
        let wanted: Vec<(String, super::record::Binding, Option<ImageVersion>)> = versions
            .iter()
            .map(|v| {
                (
                    self.lock_name(&v.definition, &v.version),
                    super::record::Binding::new(&self.gallery, &v.definition, &v.version),
                    Some(v.clone()),
                )
            })
            .collect();
        super::record::load_many(store, &gallery_lock_prefix(&self.gallery), &wanted).await
    }

    /// The reference record of one version, as [`GalleryService::records_of`] reads it.
    pub async fn record_of(&self, v: &ImageVersion) -> Option<super::record::Record> {
        self.records_of(std::slice::from_ref(v))
            .await
            .pop()
            .flatten()
    }

    /// Every definition with its versions.
    pub async fn list(&self) -> Result<Vec<(ImageDefinition, Vec<ImageVersion>)>> {
        let mut out = Vec::new();
        for d in self.api.list_definitions().await? {
            let versions = self.api.list_versions(&d.name).await?;
            out.push((d, versions));
        }
        Ok(out)
    }
}

fn created_by() -> String {
    format!("stemcell-gallery/{}", env!("CARGO_PKG_VERSION"))
}
