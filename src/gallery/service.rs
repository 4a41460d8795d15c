//! The gallery service: ensure, lookup, list, references and deletion.
//!
//! `ensure` is a reconcile loop: observe the version (one GET), decide with the pure
//! `decide::decide`, apply one step, observe again. Writes happen under a cross-host lock and are
//! preceded by a fresh observation under that lock, so any number of processes on any number of
//! hosts converge on one version that carries every caller's reference.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::adopt::{self, Adopted, Adoption};
use super::decide::{decide, Action};
use super::error::{AzureError, Error, Result};
use super::guarded::{self, delete_guarded, merge_references, Guarded, ScanEachTime};
use super::lock::{version_lock_name, Held, Locks};
use super::model::*;
use super::tags;
use super::GalleryApi;

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

pub const DEFAULT_CREATE_ENV_SUFFIX: &str = "-create-env";

/// What the service needs to know of a stemcell.
#[derive(Debug, Clone)]
pub struct StemcellImage {
    /// The stemcell's name (stemcell.MF `name`).
    pub name: String,
    /// The stemcell's version as given (`1.506`).
    pub version: String,
    /// The gallery version key (`1.506.0`), from `stemcell::version::VersionKey`.
    pub version_key: String,
    /// The director-mode definition name (cloud_properties.name, `-gen2` appended for gen2).
    pub definition: String,
    pub architecture: Architecture,
    pub generation: HyperVGeneration,
    /// Definition features to create it with (e.g. SecurityType for gen2).
    pub features: BTreeMap<String, String>,
    /// SHA-256 of the stemcell's `image` file: the content identity.
    pub image_sha256: String,
    /// Cloud properties as tags (already flattened to strings).
    pub cloud_property_tags: BTreeMap<String, String>,
}

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
    pub end_of_life: Option<String>,
    pub extra_tags: BTreeMap<String, String>,
    pub reference: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Created,
    Reused,
    Waited,
    Recreated,
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
    /// The version does not exist.
    NotFound,
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

const MAX_ROUNDS: usize = 12;

/// What the rounds of one `ensure` did so far.
#[derive(Debug, Default)]
struct Round {
    created: bool,
    recreated: bool,
    /// The version was created with references carried from a replaced Failed version (kept
    /// durably in the lock's note until they are on the new version): clear the note once the
    /// new version is Succeeded and holds them.
    carried_applied: bool,
    /// The last create refused with 409 (see [`GalleryService::create_locked`]); cleared when a
    /// later observation finds the version.
    refused: Option<AzureError>,
    /// Creates refused in a row while the version stayed absent.
    refusals: u32,
}

/// Creates refused in a row (409 while GET says the version is absent) before giving up: with
/// the backoff below, about 30 s, past the ~10–20 s Azure takes to forget a deleted child
/// (REFERENCE.md "After a DELETE completes").
const MAX_REFUSED_CREATES: u32 = 6;

/// The wait before creating again after a refused create: Azure's `Retry-After` when it gave
/// one (at least 50 ms), else 1 s doubling to 8 s.
fn refused_create_backoff(refusals: u32, azure: &AzureError) -> std::time::Duration {
    match azure.retry_after_secs {
        Some(s) => {
            std::time::Duration::from_secs(u64::from(s)).max(std::time::Duration::from_millis(50))
        }
        None => std::time::Duration::from_secs(1u64 << refusals.saturating_sub(1).min(3)),
    }
}
/// Cloud properties recorded as tags, leaving room for ours and for references.
const MAX_CLOUD_PROPERTY_TAGS: usize = 20;

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

    fn lock_name(&self, definition: &str, key: &str) -> String {
        version_lock_name(&self.gallery.gallery, definition, key)
    }

    /// Where a guarded delete of `definition`/`key` happens (this service's API and locks).
    fn guarded_target<'a>(
        &'a self,
        lock_name: &'a str,
        definition: &'a str,
        key: &'a str,
    ) -> guarded::Target<'a> {
        guarded::Target {
            api: self.api.as_ref(),
            locks: self.locks.as_ref(),
            lock_name,
            definition,
            key,
        }
    }

    /// The definition a mode writes to.
    pub fn definition_name(stemcell: &StemcellImage, mode: Mode, suffix: &str) -> String {
        match mode {
            Mode::Director => stemcell.definition.clone(),
            Mode::CreateEnv => format!("{}{}", stemcell.definition, suffix),
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

    /// Tags of a new version: the Azure CPI's, ours, extra, and the reference.
    pub fn version_tags(
        &self,
        req: &EnsureRequest,
        definition: &str,
    ) -> Result<BTreeMap<String, String>> {
        let s = &req.stemcell;
        let mut t = BTreeMap::new();
        for (k, v) in &s.cloud_property_tags {
            t.insert(k.clone(), tags::fit_value(v));
        }
        for (k, v) in &req.extra_tags {
            t.insert(k.clone(), tags::fit_value(v));
        }
        t.insert(
            tags::IMAGE_SHA256.into(),
            s.image_sha256.to_ascii_lowercase(),
        );
        t.insert(tags::GALLERY_NAME.into(), self.gallery.gallery.clone());
        t.insert(tags::IMAGE_DEFINITION.into(), definition.to_string());
        t.insert(tags::MODE.into(), req.mode.as_str().into());
        t.insert(tags::STEMCELL.into(), tags::fit_value(&s.name));
        t.insert(tags::STEMCELL_VERSION.into(), tags::fit_value(&s.version));
        t.insert(tags::SOURCE_BLOB.into(), tags::fit_value(&req.source_uri));
        t.insert(tags::CREATED_BY.into(), created_by());
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

    /// [`GalleryService::ensure`], adopting a Succeeded version without `image_sha256` (made by
    /// Azure CPI v52.0.1–v53.0.0) when `adoption` proves its content (see [`super::adopt`]).
    pub async fn ensure_adopting(
        &self,
        req: &EnsureRequest,
        adoption: Option<Adoption<'_>>,
    ) -> Result<Ensured> {
        if let Some(r) = &req.reference {
            tags::validate_reference(r).map_err(Error::BadReference)?;
        }
        let definition = Self::definition_name(&req.stemcell, req.mode, &req.create_env_suffix);
        let key = req.stemcell.version_key.as_str();
        let sha = req.stemcell.image_sha256.to_ascii_lowercase();
        let reference = req.reference.as_deref();
        let mut waited = false;
        let mut round = Round::default();
        let mut lock_failures = 0;
        // The verdict on a version without image_sha256, by the source it was reached for (the
        // proof reads both VHDs: it is not repeated when a round has to observe again).
        let mut adopted: Option<(Option<String>, Adopted)> = None;

        for _ in 0..MAX_ROUNDS {
            let mut observed = self.api.get_version(&definition, key, false).await?;
            // A create was refused (409) and the version is still absent: Azure is not done
            // with a version of this name (right after we deleted a Failed one, Azure can still
            // count it for a while; REFERENCE.md "After a DELETE completes"). Back off as Azure
            // asks, then create again; give up with a clear error if it never clears.
            if let Some(azure) = round.refused.take() {
                if observed.is_some() {
                    round.refusals = 0;
                } else {
                    round.refusals += 1;
                    if round.refusals >= MAX_REFUSED_CREATES {
                        return Err(Error::CreateRefused {
                            definition,
                            key: key.to_string(),
                            refusals: round.refusals,
                            azure,
                        });
                    }
                    let wait = refused_create_backoff(round.refusals, &azure);
                    tracing::info!(definition, version = key, code = %azure.code, wait_ms = wait.as_millis() as u64, "create refused while the version is absent; backing off before creating again");
                    tokio::time::sleep(wait).await;
                    observed = self.api.get_version(&definition, key, false).await?;
                }
            }
            match decide(observed.as_ref(), &sha, reference) {
                Action::Reuse => {
                    let outcome = if round.recreated {
                        Outcome::Recreated
                    } else if round.created {
                        Outcome::Created
                    } else if waited {
                        Outcome::Waited
                    } else {
                        Outcome::Reused
                    };
                    let Some(mut version) = observed else {
                        continue;
                    };
                    if round.carried_applied {
                        if let Some(v) = self.settle_carried(&definition, key).await? {
                            version = v;
                        }
                    }
                    return Ok(Ensured {
                        outcome,
                        mode: req.mode,
                        definition,
                        version,
                        adopted: adopted.map(|(_, a)| a),
                    });
                }
                Action::Conflict {
                    existing_digest: None,
                } if adoption.is_some() && observed.is_some() => {
                    let (Some(adoption), Some(v)) = (adoption, observed.as_ref()) else {
                        continue;
                    };
                    waited |= self
                        .adopt_round(req, &definition, v, adoption, &mut adopted)
                        .await?;
                }
                Action::Conflict { existing_digest } => {
                    return Err(self.conflict(req, &definition, observed.as_ref(), existing_digest))
                }
                Action::Wait | Action::WaitForDeletion => {
                    waited = true;
                    tracing::info!(
                        definition,
                        version = key,
                        "version is busy in Azure; waiting for it to settle"
                    );
                    self.api.wait_version_settled(&definition, key).await?;
                }
                action @ (Action::Create | Action::Replace | Action::AddReference) => {
                    let lock_name = self.lock_name(&definition, key);
                    let held = match (action, reference) {
                        // Only adding a reference: hand it to the lock's holder if there is one
                        // (group commit), else write it ourselves.
                        (Action::AddReference, Some(r)) => {
                            match guarded::acquire_or_hand_over(
                                self.api.as_ref(),
                                self.locks.as_ref(),
                                &lock_name,
                                &definition,
                                key,
                                r,
                            )
                            .await?
                            {
                                guarded::Acquired::Held(h) => h,
                                // Recorded by the holder: observe again (Reuse).
                                guarded::Acquired::HandedOver => continue,
                            }
                        }
                        _ => self.locks.acquire(&lock_name).await?,
                    };
                    let locked_at = tokio::time::Instant::now();
                    // The step releases the lock. The create's long-running operation is
                    // followed after that, so other callers can wait on the version rather
                    // than on the lock.
                    let pending = match self
                        .write_step(
                            held,
                            locked_at,
                            req,
                            &definition,
                            &sha,
                            reference,
                            &mut round,
                        )
                        .await
                    {
                        Ok(p) => p,
                        // The lease was lost (a stall past it): nothing was written after that;
                        // observe again under a new lock.
                        Err(Error::Lock(e)) if lock_failures < 2 => {
                            lock_failures += 1;
                            tracing::warn!(definition, version = key, "{e}; observing again");
                            continue;
                        }
                        Err(e) => return Err(e),
                    };
                    if let Some(op) = pending {
                        if let Err(e) = self.api.wait(&op).await {
                            return Err(self.undo_failed_create(req, &definition, &sha, e).await);
                        }
                    }
                }
            }
        }
        Err(Error::EnsureUnsettled {
            definition,
            key: key.to_string(),
            rounds: MAX_ROUNDS,
        })
    }

    /// One write, under the lock `held` (released before returning), after observing again.
    /// Returns a create operation to follow. A 409 (another write in flight, e.g. our own
    /// retried request that did reach Azure) is not an error: the loop observes again.
    #[allow(clippy::too_many_arguments)]
    async fn write_step(
        &self,
        held: Box<dyn Held>,
        locked_at: tokio::time::Instant,
        req: &EnsureRequest,
        definition: &str,
        sha: &str,
        reference: Option<&str>,
        round: &mut Round,
    ) -> Result<Option<Operation>> {
        let key = req.stemcell.version_key.as_str();
        let observed = match self.api.get_version(definition, key, false).await {
            Ok(v) => v,
            Err(e) => {
                held.release().await;
                return Err(e);
            }
        };
        match decide(observed.as_ref(), sha, reference) {
            Action::Create => {
                let r = self
                    .create_locked(held.as_ref(), req, definition, sha, round)
                    .await;
                held.release().await;
                r
            }
            Action::Replace => {
                let Some(v) = observed else {
                    held.release().await;
                    return Ok(None);
                };
                self.replace_failed(held, locked_at, definition, key, sha, &v, round)
                    .await
            }
            Action::AddReference => {
                let refs: Vec<String> = reference.iter().map(|r| r.to_string()).collect();
                tracing::info!(
                    definition,
                    version = key,
                    reference,
                    "recording reference on existing version"
                );
                let r = merge_references(
                    self.api.as_ref(),
                    held.as_ref(),
                    definition,
                    key,
                    &refs,
                    &[],
                )
                .await
                .map(|_| None);
                held.release().await;
                r
            }
            // The world changed between the two observations: the loop decides again.
            Action::Reuse | Action::Wait | Action::WaitForDeletion | Action::Conflict { .. } => {
                held.release().await;
                Ok(None)
            }
        }
    }

    /// PUT the version (under the lock), with the references carried durably from a replaced
    /// Failed version of the same content, if any.
    async fn create_locked(
        &self,
        held: &dyn Held,
        req: &EnsureRequest,
        definition: &str,
        sha: &str,
        round: &mut Round,
    ) -> Result<Option<Operation>> {
        let key = req.stemcell.version_key.as_str();
        let location = self.location().await?;
        if self
            .ensure_definition(&req.stemcell, definition, req.mode, &location)
            .await?
            .is_none()
        {
            return Ok(None);
        }
        let mut tags = self.version_tags(req, definition)?;
        let carried = held.carried().await?;
        if !carried.is_empty() {
            // References of the Failed version this one replaces (same content: the note is
            // written only for a Failed version holding this digest): the directors that
            // recorded them still hold those stemcells.
            let mut refs = tags::references(&tags);
            for r in &carried {
                if !refs.contains(r) {
                    refs.push(r.clone());
                }
            }
            tags = tags::with_references(&tags, &refs, &tags::sentinel(definition, key)).map_err(
                |e| Error::VersionTags {
                    resource: format!("{definition}/{key}"),
                    source_error: e,
                },
            )?;
            tracing::info!(definition, version = key, carried = ?carried, "creating with the references carried from the replaced Failed version");
            round.carried_applied = true;
        }
        debug_assert_eq!(tags.get(tags::IMAGE_SHA256).map(String::as_str), Some(sha));
        let spec = VersionSpec {
            definition: definition.to_string(),
            version: key.to_string(),
            location: location.clone(),
            source_uri: req.source_uri.clone(),
            storage_account_id: req.storage_account_id.clone(),
            target_regions: if req.target_regions.is_empty() {
                vec![TargetRegion {
                    name: location.clone(),
                    replicas: req.replica_count,
                    storage_account_type: None,
                    exclude_from_latest: None,
                }]
            } else {
                req.target_regions.clone()
            },
            replica_count: req.replica_count,
            exclude_from_latest: req.exclude_from_latest,
            end_of_life: req.end_of_life.clone(),
            tags,
        };
        tracing::info!(definition, version = key, source = %crate::redact::uri(&req.source_uri), "creating gallery version");
        held.check().await?;
        match self.api.begin_create_version(&spec).await {
            Ok(op) => {
                round.created = true;
                Ok(Some(op))
            }
            // Someone else's write is in flight: observe again next round.
            Err(Error::Busy { azure, .. }) => {
                tracing::info!(definition, version = key, code = %azure.code, "create met a concurrent write; observing again");
                round.refused = Some(azure);
                Ok(None)
            }
            // Refused at the PUT (a source Azure will not take: no storageAccountId for the
            // blob, another account's, not a fixed VHD page blob): Azure made nothing, so there
            // is no half-made version to clean up; say so and what to fix.
            Err(Error::Rejected { azure, .. }) => Err(Error::CreateRejected {
                definition: definition.to_string(),
                key: key.to_string(),
                source_uri: crate::redact::uri(&req.source_uri),
                azure,
            }),
            Err(e) => Err(e),
        }
    }

    /// Replace a Failed version of the same content: record its references durably in the
    /// lock's note first, then delete it (guarded); the next create carries them.
    #[allow(clippy::too_many_arguments)]
    async fn replace_failed(
        &self,
        held: Box<dyn Held>,
        locked_at: tokio::time::Instant,
        definition: &str,
        key: &str,
        sha: &str,
        v: &ImageVersion,
        round: &mut Round,
    ) -> Result<Option<Operation>> {
        tracing::warn!(
            definition,
            version = key,
            "version is {} with this content; deleting it before creating it again",
            v.provisioning_state.as_str()
        );
        let noted = async {
            let mut note = held.carried().await?;
            let before = note.len();
            for r in tags::references(&v.tags) {
                if !note.contains(&r) {
                    note.push(r);
                }
            }
            if note.len() != before {
                held.set_carried(&note).await?;
            }
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = noted {
            held.release().await;
            return Err(e);
        }
        let lock_name = self.lock_name(definition, key);
        let target = self.guarded_target(&lock_name, definition, key);
        let decided_tags = v.tags.clone();
        let keep_if = move |cur: &ImageVersion| -> Option<String> {
            if !matches!(
                cur.provisioning_state,
                ProvisioningState::Failed | ProvisioningState::Canceled
            ) {
                return Some(format!(
                    "provisioning state (now {})",
                    cur.provisioning_state
                ));
            }
            if !same_digest(cur, sha) {
                return Some("image_sha256".into());
            }
            if cur.tags != decided_tags {
                return Some("tags".into());
            }
            None
        };
        let consumers = ScanEachTime(self.api.clone());
        match delete_guarded(&target, held, locked_at, &consumers, &keep_if).await? {
            Guarded::Deleted | Guarded::Gone => {
                round.recreated = true;
                Ok(None)
            }
            Guarded::Changed(_) => Ok(None),
            // A version whose update (not its create) failed may still run VMs: never delete
            // what something uses.
            Guarded::InUse(users) => Err(Error::FailedVersionInUse {
                id: v.id.clone(),
                state: v.provisioning_state.as_str().to_string(),
                users: users.into_iter().map(|c| c.id).collect(),
            }),
            // Not provably unused: never replaced on a guess.
            Guarded::Unproven(why) => Err(Error::FailedVersionUnproven {
                id: v.id.clone(),
                state: v.provisioning_state.as_str().to_string(),
                why,
            }),
        }
    }

    /// After a create that carried references from a replaced Failed version: under the lock,
    /// make sure every carried reference is on the new version (merge what is missing), then
    /// clear the note. A failure here leaves the note for the next ensure (it is re-applied).
    async fn settle_carried(&self, definition: &str, key: &str) -> Result<Option<ImageVersion>> {
        let held = self.locks.acquire(&self.lock_name(definition, key)).await?;
        let r = async {
            let note = held.carried().await?;
            if note.is_empty() {
                return Ok(None);
            }
            let v = merge_references(
                self.api.as_ref(),
                held.as_ref(),
                definition,
                key,
                &note,
                &[],
            )
            .await?;
            if let Some(v) = &v {
                let refs = tags::references(&v.tags);
                if note.iter().all(|r| refs.contains(r))
                    && v.provisioning_state == ProvisioningState::Succeeded
                {
                    held.set_carried(&[]).await?;
                }
            }
            Ok(v)
        }
        .await;
        held.release().await;
        r
    }

    /// Our create ended Failed: remove the Failed version (guarded: only while it is still the
    /// Failed version we made) so nothing half-made stays behind. Carried references stay in the
    /// lock's note for the next ensure.
    async fn undo_failed_create(
        &self,
        req: &EnsureRequest,
        definition: &str,
        sha: &str,
        cause: Error,
    ) -> Error {
        let key = req.stemcell.version_key.as_str();
        tracing::warn!(definition, version = key, error = %cause, "create failed; removing the failed version");
        let lock_name = self.lock_name(definition, key);
        let held = match self.locks.acquire(&lock_name).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(definition, version = key, error = %e, "could not take the lock to remove the failed version; the next ensure replaces it");
                return cause;
            }
        };
        let target = self.guarded_target(&lock_name, definition, key);
        let source = req.source_uri.clone();
        let keep_if = move |cur: &ImageVersion| -> Option<String> {
            if !matches!(
                cur.provisioning_state,
                ProvisioningState::Failed | ProvisioningState::Canceled
            ) {
                return Some(format!(
                    "provisioning state (now {})",
                    cur.provisioning_state
                ));
            }
            if !same_digest(cur, sha) || cur.source_uri.as_deref() != Some(source.as_str()) {
                return Some("content (another create)".into());
            }
            None
        };
        let consumers = ScanEachTime(self.api.clone());
        let started = tokio::time::Instant::now();
        match delete_guarded(&target, held, started, &consumers, &keep_if).await {
            Ok(Guarded::Deleted) | Ok(Guarded::Gone) => {}
            Ok(other) => {
                tracing::warn!(definition, version = key, outcome = ?other, "the failed version was kept; the next ensure decides again");
            }
            Err(e) => {
                tracing::warn!(definition, version = key, error = %e, "could not remove the failed version; the next ensure replaces it");
            }
        }
        cause
    }

    /// One round of `ensure` on `v`, a version without image_sha256: wait while it is busy;
    /// refuse it Failed; else prove its content (once per source; `adopted` remembers the
    /// verdict) and record this stemcell's image_sha256 and the reference under the lock. The
    /// caller observes again. `true` when it waited.
    async fn adopt_round(
        &self,
        req: &EnsureRequest,
        definition: &str,
        v: &ImageVersion,
        adoption: Adoption<'_>,
        adopted: &mut Option<(Option<String>, Adopted)>,
    ) -> Result<bool> {
        let key = req.stemcell.version_key.as_str();
        let sha = req.stemcell.image_sha256.to_ascii_lowercase();
        match &v.provisioning_state {
            ProvisioningState::Succeeded => {}
            ProvisioningState::Creating
            | ProvisioningState::Updating
            | ProvisioningState::Migrating
            | ProvisioningState::Deleting
            | ProvisioningState::Other(_) => {
                self.api.wait_version_settled(definition, key).await?;
                return Ok(true);
            }
            // A Failed version without a digest may still serve other content.
            ProvisioningState::Failed | ProvisioningState::Canceled => {
                return Err(self.conflict(req, definition, Some(v), None));
            }
        }
        let verdict = match adopted.as_ref() {
            Some((uri, a)) if *uri == v.source_uri => a.clone(),
            _ => {
                let a = self.prove(adoption, v, &sha).await?;
                *adopted = Some((v.source_uri.clone(), a.clone()));
                a
            }
        };
        let held = self.locks.acquire(&self.lock_name(definition, key)).await?;
        let r = adopt::record(
            self.api.as_ref(),
            held.as_ref(),
            definition,
            key,
            v.source_uri.as_deref(),
            &sha,
            req.reference.as_deref(),
        )
        .await;
        held.release().await;
        if r? {
            match &verdict {
                Adopted::Unverified { .. } => {
                    tracing::warn!(definition, version = key, "{}", verdict.describe(&v.id))
                }
                Adopted::ContentMatched { .. } => {
                    tracing::info!(definition, version = key, "{}", verdict.describe(&v.id))
                }
            }
        }
        Ok(false)
    }

    /// Read both sides of the content proof of `v` (a Succeeded version without image_sha256)
    /// and judge them: adopted, or the conflict to answer.
    async fn prove(&self, adoption: Adoption<'_>, v: &ImageVersion, sha: &str) -> Result<Adopted> {
        tracing::info!(
            version = %v.id,
            "version has no image_sha256 (made by Azure CPI v52.0.1-v53.0.0?): comparing the content of its source blob with this stemcell's VHD"
        );
        let source = match v.source_uri.as_deref() {
            Some(uri) => adoption.proof.source_digest(uri).await?,
            None => adopt::SourceContent::Gone,
        };
        // The local side only when the other side was read (it costs a pass over the stemcell).
        let local = match &source {
            adopt::SourceContent::Digest(_) => adoption.proof.local_digest().await?,
            adopt::SourceContent::Gone | adopt::SourceContent::Unreadable(_) => String::new(),
        };
        let verdict = adopt::judge(
            &v.id,
            v.source_uri.as_deref(),
            &local,
            &source,
            adoption.unverified,
        )?;
        tracing::debug!(version = %v.id, image_sha256 = sha, "content proof: {verdict:?}");
        Ok(verdict)
    }

    fn conflict(
        &self,
        req: &EnsureRequest,
        definition: &str,
        existing: Option<&ImageVersion>,
        existing_digest: Option<String>,
    ) -> Error {
        let key = &req.stemcell.version_key;
        // Another pipeline may have made the version from a URL carrying a SAS token.
        let existing_source = existing
            .and_then(|v| crate::redact::opt_uri(v.source_uri.as_deref()))
            .unwrap_or_else(|| "unknown".into());
        let existing_mode = existing
            .and_then(|v| v.tags.get(tags::MODE).cloned())
            .unwrap_or_else(|| "not recorded (made by another tool)".into());
        let remedy = match req.mode {
            Mode::Director => format!(
                "if that version was published by `bosh create-env`, publish create-env stemcells with the create-env hint mode (they go to `{definition}{}`); otherwise, once nothing uses it, remove it with `stemcell-gallery delete --name {} --version {}`, or build the stemcell with a new version",
                req.create_env_suffix, req.stemcell.name, req.stemcell.version
            ),
            Mode::CreateEnv => format!(
                "this is a different build of stemcell {} {}; once nothing uses the old one, remove it with `stemcell-gallery delete --create-env --name {} --version {}`",
                req.stemcell.name, req.stemcell.version, req.stemcell.name, req.stemcell.version
            ),
        };
        Error::Conflict(format!(
            "gallery version {}/{}/{key} already holds different content: existing image_sha256 {} (source {existing_source}, mode {existing_mode}), this stemcell's image_sha256 {} (source {}). Nothing was changed. Remedy: {remedy}",
            self.gallery.gallery,
            definition,
            existing_digest.as_deref().unwrap_or("absent"),
            req.stemcell.image_sha256,
            crate::redact::uri(&req.source_uri),
        ))
    }

    /// Create the definition when missing; check an existing one can hold this stemcell.
    /// `None`: a create met a 409 and the definition is still not readable (another write in
    /// flight): the caller observes again.
    async fn ensure_definition(
        &self,
        stemcell: &StemcellImage,
        name: &str,
        mode: Mode,
        location: &str,
    ) -> Result<Option<ImageDefinition>> {
        let spec = self.definition_spec(stemcell, name, mode, location);
        let existing = match self.api.get_definition(name).await? {
            Some(d) => d,
            None => match self.api.create_definition(&spec).await {
                Ok(d) => return Ok(Some(d)),
                // Created concurrently by someone else (or our own retried PUT): read it and
                // check it; not readable yet → observe again.
                Err(Error::Busy { azure, .. }) => match self.api.get_definition(name).await? {
                    Some(d) => d,
                    None => {
                        tracing::info!(definition = name, code = %azure.code, "definition create met a concurrent write; observing again");
                        return Ok(None);
                    }
                },
                Err(e) => return Err(e),
            },
        };
        check_definition(&existing, &spec)?;
        Ok(Some(existing))
    }

    /// One version by definition and key.
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

    /// The stemcell CID the delegate Azure CPI's `create_vm` resolves to the version holding
    /// `cid`: `cid` itself when it is in `stemcell_references`, else that version's sentinel (the
    /// reference lives in the overflow, which the CPI does not read). `None` when no version
    /// records `cid` (not ours: the delegate decides). A version still in an earlier ledger format
    /// is rewritten first, under its lock, so its sentinel exists.
    pub async fn cpi_resolvable(&self, cid: &str) -> Result<Option<String>> {
        let Some(v) = self.lookup_by_reference(cid).await? else {
            return Ok(None);
        };
        if tags::cpi_resolves(&v.tags, cid) {
            return Ok(Some(cid.to_string()));
        }
        let sentinel = tags::sentinel(&v.definition, &v.version);
        if tags::sentinel_in(&v.tags).as_deref() == Some(sentinel.as_str()) {
            return Ok(Some(sentinel));
        }
        let held = self
            .locks
            .acquire(&self.lock_name(&v.definition, &v.version))
            .await?;
        let r = merge_references(
            self.api.as_ref(),
            held.as_ref(),
            &v.definition,
            &v.version,
            &[cid.to_string()],
            &[],
        )
        .await;
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

    /// Every definition with its versions.
    pub async fn list(&self) -> Result<Vec<(ImageDefinition, Vec<ImageVersion>)>> {
        let mut out = Vec::new();
        for d in self.api.list_definitions().await? {
            let versions = self.api.list_versions(&d.name).await?;
            out.push((d, versions));
        }
        Ok(out)
    }

    /// Remove a reference; delete the version only when no reference remains and no VM, scale set
    /// or disk uses it. `reference: None` asks to delete a version that has no references at all.
    pub async fn remove_reference(
        &self,
        definition: &str,
        key: &str,
        reference: Option<&str>,
    ) -> Result<Removal> {
        Ok(self
            .remove_reference_observed(definition, key, reference)
            .await?
            .0)
    }

    /// [`GalleryService::remove_reference`], also returning the version as read under the lock
    /// (`None` when it did not exist): after `Removal::Deleted`, what was deleted (its source blob).
    pub async fn remove_reference_observed(
        &self,
        definition: &str,
        key: &str,
        reference: Option<&str>,
    ) -> Result<(Removal, Option<ImageVersion>)> {
        // A version that gains a reference while it is being deleted is kept; the removal is then
        // done again on what it is now (bounded).
        let mut last = None;
        for _ in 0..4 {
            match self
                .remove_reference_once(definition, key, reference)
                .await?
            {
                Removed::Done(removal, v) => return Ok((removal, v)),
                Removed::Changed(why, v) => {
                    tracing::info!(
                        definition,
                        version = key,
                        "{why} changed while deleting; removing the reference again"
                    );
                    last = Some(v);
                }
            }
        }
        let v = last.unwrap_or_default();
        Ok((
            Removal::ReferenceRemoved {
                remaining: v
                    .as_ref()
                    .map(|v| tags::references(&v.tags))
                    .unwrap_or_default(),
            },
            v,
        ))
    }

    async fn remove_reference_once(
        &self,
        definition: &str,
        key: &str,
        reference: Option<&str>,
    ) -> Result<Removed> {
        let lock_name = self.lock_name(definition, key);
        let held = self.locks.acquire(&lock_name).await?;
        let locked_at = tokio::time::Instant::now();
        let v = match self.api.get_version(definition, key, false).await {
            Ok(Some(v)) => v,
            Ok(None) => {
                let r = self.forget_carried(held.as_ref(), reference).await;
                held.release().await;
                return r.map(|_| Removed::Done(Removal::NotFound, None));
            }
            Err(e) => {
                held.release().await;
                return Err(e);
            }
        };
        if let Err(e) = self.forget_carried(held.as_ref(), reference).await {
            held.release().await;
            return Err(e);
        }
        let removed: Vec<String> = reference.iter().map(|r| r.to_string()).collect();
        let before = tags::references(&v.tags);
        let remaining: Vec<String> = before
            .iter()
            .filter(|r| Some(r.as_str()) != reference)
            .cloned()
            .collect();
        if !remaining.is_empty() {
            let r = if remaining.len() != before.len() {
                merge_references(
                    self.api.as_ref(),
                    held.as_ref(),
                    definition,
                    key,
                    &[],
                    &removed,
                )
                .await
            } else {
                Ok(Some(v.clone()))
            };
            held.release().await;
            let now = r?;
            let remaining = now
                .as_ref()
                .map(|n| tags::references(&n.tags))
                .unwrap_or(remaining);
            return Ok(Removed::Done(
                Removal::ReferenceRemoved { remaining },
                Some(v),
            ));
        }
        let consumers = guarded::SharedScan::new(self.api.clone());
        let in_use = async {
            let listed = guarded::ConsumerView::consumers_since(&consumers, locked_at).await?;
            let siblings = self.api.list_versions(definition).await?;
            Ok::<_, Error>(users_of(&v, &listed, &siblings))
        }
        .await;
        // Kept because something uses it, or because a list the identity may not see whole
        // proves nothing (never an error: bosh-cli fails a whole create-env on one, #619). Either
        // way the reference goes and the version stays.
        let kept = match in_use {
            Ok(u) if u.is_empty() => None,
            Ok(consumers) => Some(Removal::KeptInUse { consumers }),
            Err(e @ Error::PartialView { .. }) => {
                Some(Removal::KeptUnproven { why: e.to_string() })
            }
            Err(e) => {
                held.release().await;
                return Err(e);
            }
        };
        if let Some(removal) = kept {
            let r = if before.len() != remaining.len() {
                merge_references(
                    self.api.as_ref(),
                    held.as_ref(),
                    definition,
                    key,
                    &[],
                    &removed,
                )
                .await
                .map(|_| ())
            } else {
                Ok(())
            };
            held.release().await;
            r?;
            match &removal {
                Removal::KeptInUse { consumers } => {
                    for c in consumers {
                        tracing::info!(version = %v.id, consumer = %c.id, kind = ?c.kind, "version kept: still in use");
                    }
                }
                Removal::KeptUnproven { why } => {
                    tracing::warn!(version = %v.id, "version kept: {why}")
                }
                _ => {}
            }
            return Ok(Removed::Done(removal, Some(v)));
        }
        // No reference remains but the one removed now, and nothing uses it: delete, guarded —
        // kept if a reference appeared or its content changed meanwhile.
        let target = self.guarded_target(&lock_name, definition, key);
        let decided = v.clone();
        let reference_owned = reference.map(str::to_string);
        let keep_if = move |cur: &ImageVersion| -> Option<String> {
            let others = tags::references(&cur.tags)
                .into_iter()
                .any(|r| Some(&r) != reference_owned.as_ref());
            if others {
                return Some("references".into());
            }
            if cur.tags.get(tags::IMAGE_SHA256) != decided.tags.get(tags::IMAGE_SHA256)
                || cur.source_uri != decided.source_uri
                || cur.published_date != decided.published_date
            {
                return Some("content (re-created)".into());
            }
            None
        };
        tracing::info!(version = %v.id, "no reference remains and nothing uses it: deleting");
        Ok(
            match delete_guarded(&target, held, locked_at, &consumers, &keep_if).await? {
                Guarded::Deleted => Removed::Done(Removal::Deleted, Some(v)),
                Guarded::Gone => Removed::Done(Removal::NotFound, None),
                Guarded::InUse(consumers) => {
                    Removed::Done(Removal::KeptInUse { consumers }, Some(v))
                }
                Guarded::Changed(why) => Removed::Changed(why, Some(v)),
                Guarded::Unproven(why) => Removed::Done(Removal::KeptUnproven { why }, Some(v)),
            },
        )
    }

    /// A removed reference is removed from the lock's carried-references note too, so a later
    /// replacement does not bring it back.
    async fn forget_carried(&self, held: &dyn Held, reference: Option<&str>) -> Result<()> {
        let Some(r) = reference else {
            return Ok(());
        };
        // A pending hand-over of the same reference must not bring it back either.
        held.drop_intents_of(r).await?;
        let note = held.carried().await?;
        if note.iter().any(|x| x == r) {
            let rest: Vec<String> = note.into_iter().filter(|x| x != r).collect();
            held.set_carried(&rest).await?;
        }
        Ok(())
    }

    /// Add a replication region to an existing version when it is missing.
    pub async fn ensure_target_region(
        &self,
        definition: &str,
        key: &str,
        region: TargetRegion,
    ) -> Result<ImageVersion> {
        let lock_name = version_lock_name(&self.gallery.gallery, definition, key);
        let held = self.locks.acquire(&lock_name).await?;
        let r = async {
            let v = self
                .api
                .get_version(definition, key, false)
                .await?
                .ok_or_else(|| {
                    Error::NotFound(format!(
                        "gallery version {} does not exist",
                        self.gallery.version_id(definition, key)
                    ))
                })?;
            if v.target_regions
                .iter()
                .any(|r| region_key(&r.name) == region_key(&region.name))
            {
                return Ok(v);
            }
            let mut regions = v.target_regions.clone();
            regions.push(region);
            held.check().await?;
            self.api.set_target_regions(definition, key, &regions).await
        }
        .await;
        held.release().await;
        r
    }
}

/// The consumers that use version `v`: by naming it (an ARM, shared or community gallery id), by
/// running it (`exactVersion`), or because `latest` could resolve to it for them — the one rule of
/// [`super::latest`], over `siblings` (the versions of `v`'s definition; `v` is added if missing).
pub fn users_of(
    v: &ImageVersion,
    consumers: &[Consumer],
    siblings: &[ImageVersion],
) -> Vec<Consumer> {
    consumers
        .iter()
        .filter(|c| super::latest::consumer_protects(c, v, siblings))
        .cloned()
        .collect()
}

/// Whether the version's `image_sha256` tag is `sha` (case-insensitive).
fn same_digest(v: &ImageVersion, sha: &str) -> bool {
    v.tags
        .get(tags::IMAGE_SHA256)
        .is_some_and(|d| d.trim().eq_ignore_ascii_case(sha))
}

/// One pass of a reference removal.
enum Removed {
    Done(Removal, Option<ImageVersion>),
    /// The guarded delete found the version changed: do the removal again.
    Changed(String, Option<ImageVersion>),
}

fn created_by() -> String {
    format!("stemcell-gallery/{}", env!("CARGO_PKG_VERSION"))
}

/// Definition properties are immutable in practice: an existing definition must match.
fn check_definition(d: &ImageDefinition, want: &DefinitionSpec) -> Result<()> {
    let mut problems = Vec::new();
    let gen = d.generation.as_deref().unwrap_or("V1");
    if !gen.eq_ignore_ascii_case(want.generation.as_azure()) {
        problems.push(format!(
            "Hyper-V generation {gen} (the stemcell needs {})",
            want.generation.as_azure()
        ));
    }
    let arch = d.architecture.as_deref().unwrap_or("x64");
    if !arch.eq_ignore_ascii_case(want.architecture.as_azure()) {
        problems.push(format!(
            "architecture {arch} (the stemcell needs {})",
            want.architecture.as_azure()
        ));
    }
    if !d.os_type.is_empty() && !d.os_type.eq_ignore_ascii_case("Linux") {
        problems.push(format!("OS type {} (the stemcell needs Linux)", d.os_type));
    }
    if !d.os_state.is_empty() && !d.os_state.eq_ignore_ascii_case("Generalized") {
        problems.push(format!(
            "OS state {} (the stemcell needs Generalized)",
            d.os_state
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::DefinitionMismatch {
            id: d.id.clone(),
            problems: problems.join(", "),
        })
    }
}

impl StemcellImage {
    /// Describe a stemcell from its cloud properties (stemcell.MF's, or the CPI request's),
    /// with the gallery version key already checked by `stemcell::version::VersionKey`.
    pub fn from_cloud_properties(
        stemcell_name: &str,
        stemcell_version: &str,
        version_key: &crate::stemcell::version::VersionKey,
        cloud: &crate::stemcell::manifest::CloudProperties,
        image_sha256: &str,
    ) -> StemcellImage {
        let generation = cloud.hyperv_generation();
        let mut features = BTreeMap::new();
        if generation == HyperVGeneration::V2 {
            features.insert(
                "SecurityType".to_string(),
                cloud
                    .security_type
                    .clone()
                    .unwrap_or_else(|| "TrustedLaunchSupported".into()),
            );
        }
        if let Some(types) = &cloud.disk_controller_types {
            if !types.is_empty() {
                let names: Vec<String> = types
                    .iter()
                    .map(|t| match t.to_ascii_lowercase().as_str() {
                        "scsi" => "SCSI".to_string(),
                        "nvme" => "NVMe".to_string(),
                        _ => t.clone(),
                    })
                    .collect();
                features.insert("DiskControllerTypes".to_string(), names.join(", "));
            }
        }
        if cloud.accelerated_networking == Some(true) {
            features.insert(
                "IsAcceleratedNetworkSupported".to_string(),
                "True".to_string(),
            );
        }
        // The Azure CPI records the cloud properties as tags too. Keys must be valid tag names,
        // and the references need room within Azure's 50 tags: at most 20 properties are kept,
        // and any left out are named in the log (they stay in the stemcell; only tags are short).
        let mut cloud_property_tags = BTreeMap::new();
        let mut skipped = Vec::new();
        for (k, v) in cloud.to_json() {
            let valid_key = !k.is_empty()
                && k.len() <= 64
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                && !tags::is_reference_tag(&k);
            if !valid_key || cloud_property_tags.len() >= MAX_CLOUD_PROPERTY_TAGS {
                skipped.push(k);
                continue;
            }
            let s = match v {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            cloud_property_tags.insert(k, s);
        }
        if !skipped.is_empty() {
            tracing::warn!(skipped = ?skipped, "cloud properties not recorded as version tags (invalid tag names or over the tag budget)");
        }
        StemcellImage {
            name: stemcell_name.to_string(),
            version: stemcell_version.to_string(),
            version_key: version_key.to_string(),
            definition: cloud.definition_name_for(stemcell_name),
            architecture: cloud.cpu_architecture(),
            generation,
            features,
            image_sha256: image_sha256.to_ascii_lowercase(),
            cloud_property_tags,
        }
    }

    /// Describe a stemcell from its manifest.
    pub fn from_manifest(
        manifest: &crate::stemcell::manifest::Manifest,
        version_key: &crate::stemcell::version::VersionKey,
        image_sha256: &str,
    ) -> StemcellImage {
        Self::from_cloud_properties(
            &manifest.name,
            &manifest.version,
            version_key,
            &manifest.cloud_properties,
            image_sha256,
        )
    }
}
