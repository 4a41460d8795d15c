//! One pipeline from a stemcell (or a CPI's `image` file) to a gallery version: used by `seed`
//! and by the CPI's `create_stemcell`.
//!
//! 1. **Describe, write nothing.** A stemcell tarball is read up to `stemcell.MF` only (the image
//!    neither inflated nor hashed): light stemcells, the version key (four parts, `-rc.1`... are
//!    refused), the definition name and the checksum the manifest declares for the image (its
//!    SHA-1, or a `sha256:` one). An `image` file alone declares nothing: it gets the digest pass
//!    (below) here. Bad input found there causes no request at all.
//! 2. **Check the gallery before the first byte.** One GET of the target version: present → its
//!    `image_sha256` decides, so the **digest pass** runs (`archive::digest_stemcell`: the outer
//!    gzip inflated, the image's SHA-1 checked against the manifest and its SHA-256 computed, the
//!    image not inflated): the same digest → nothing is uploaded or inflated, the version is
//!    reused (the reference recorded); a different one → the stemcell is verified in full (a
//!    broken one says so rather than "conflict"), then the service's conflict error (exit 4),
//!    nothing written. Absent → the gallery itself must exist, else exit 3 before any byte is
//!    sent.
//! 3. **Upload in the one full pass.** The pass that inflates and verifies the stemcell starts at
//!    once; nothing is written before root.vhd's first chunk (its size from its tar header, its
//!    first sector checked). Then, under the upload lease of every digest known (in the stemcell
//!    container, `uploads/sha1/<sha1>.lock` for the SHA-1 the manifest declares, and
//!    `uploads/sha256/<sha256>.lock` once that is known: see [`upload_lock_name`]), the gallery is
//!    observed again, and the container's stemcell blobs decide
//!    ([`plan_upload`](plan::plan_upload)): a complete blob with the image's SHA-256 computed
//!    from this file is reused (0 bytes); one that may
//!    hold the image (the same SHA-1, or an older blob of the same stemcell version and size)
//!    stops the pass, the digest pass decides, and the upload is decided again; partial blobs of
//!    this image left by an interrupted run are deleted. Otherwise the pass streams into a new
//!    sparse page blob, and the image's SHA-256 is computed on the way. What only the whole
//!    stemcell shows (a wrong manifest checksum, a truncated or corrupt tail, root.vhd's footer,
//!    a second `image` or `root.vhd`, a file rewritten meanwhile) fails that pass: the blob is
//!    deleted and no version is created (write-then-clean; fixtures/bad_input/cases.toml marks
//!    those cases). The blob is then marked complete with the Azure CPI's metadata (and the
//!    image's SHA-1) and the version ensured from its URI.
//!
//! So a new stemcell is read once (the outer gzip and the image inflated once each), a reuse of
//! its version reads the outer tarball once and sends nothing, and only a complete blob that may
//! hold the image costs the digest pass on top of a few MiB of the upload pass.
//!
//! Storage is reached through one object, the [`BlobStore`] port (blobs, partial-blob cleanup,
//! completion marks, the upload lock); the gallery through the [`GalleryService`]. Both come
//! from the [`Context`] (over Azure, or [`Context::in_memory`] over fakes: the unit tests in
//! `tests.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::app::context::Context;
use crate::gallery::adopt::{Adoption, ContentProof, SourceContent};
use crate::gallery::blob_store::{BlobStore, Progress};
use crate::gallery::model::{ImageVersion, TargetRegion};
use crate::gallery::service::{
    EnsureRequest, Ensured, GalleryService, Mode, DEFAULT_CREATE_ENV_SUFFIX,
};
use crate::gallery::tags;
use crate::names::{new_stemcell_blob_name, STEMCELL_CONTAINER};
use crate::stemcell::content::ContentSink;
use crate::stemcell::manifest::CloudProperties;

mod passes;
mod plan;
mod upload;
use passes::{describe, digest_pass, full_pass, verify_fully, Checked};
use upload::{settled_or_busy, Attempt, Transfer, Upload};

/// What to publish.
// The field names are the contract the CPI codes against; a Source is built once per call.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Source {
    /// A stemcell tarball (`stemcell.MF` + `image`).
    Stemcell(PathBuf),
    /// An `image` file alone (gzip(tar(root.vhd))), as the CPI's `create_stemcell` receives it,
    /// with the stemcell's name, version and cloud properties.
    Image {
        path: PathBuf,
        name: String,
        version: String,
        cloud_properties: CloudProperties,
    },
}

/// The reference `publish` records on the version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordReference {
    /// The new stemcell CID (`create_stemcell`: the director holds it and deletes it).
    Cid,
    /// This reference (`seed --reference`).
    Given(String),
    /// None: a pre-seeded version nobody adopts stays an orphan for cleanup (DESIGN.md §4,
    /// "`seed` records none unless asked").
    Nothing,
}

#[derive(Debug, Clone)]
pub struct PublishOptions {
    pub mode: Mode,
    pub create_env_suffix: String,
    /// Which reference to record on the version.
    pub reference: RecordReference,
    /// Who holds that reference (`gallery::record::holder_label`): the director UUID of a CPI
    /// request, an operator's `--holder`.
    pub holder: Option<String>,
    /// Empty: the gallery's location with Azure's defaults.
    pub target_regions: Vec<TargetRegion>,
    pub replica_count: Option<u32>,
    /// Put Page requests in flight.
    pub concurrency: usize,
    pub progress: Progress,
    /// Blob container of the stemcell VHDs.
    pub container: String,
    /// Adopt a version without `image_sha256` whose source blob is gone or unreadable, without
    /// proof of its content (`--adopt-unverified`, `stemcell_gallery_adopt_unverified`).
    pub adopt_unverified: bool,
    /// The end of life and deletion block a version this run creates gets (checked by the
    /// front before anything is written).
    pub safeguards: crate::safeguards::Safeguards,
}

impl Default for PublishOptions {
    fn default() -> Self {
        Self {
            mode: Mode::Director,
            create_env_suffix: DEFAULT_CREATE_ENV_SUFFIX.to_string(),
            reference: RecordReference::Cid,
            holder: None,
            target_regions: Vec::new(),
            replica_count: None,
            concurrency: 8,
            progress: Progress::Log {
                every: Duration::from_secs(10),
            },
            container: STEMCELL_CONTAINER.to_string(),
            adopt_unverified: false,
            safeguards: Default::default(),
        }
    }
}

/// What `publish` did.
#[derive(Debug, Clone)]
pub struct Published {
    pub ensured: Ensured,
    /// `bosh-stemcell-<uuid>`: chosen for this call, recorded as the reference only with
    /// `RecordReference::Cid`.
    pub cid: String,
    /// The reference this call recorded (`None`: none was asked for).
    pub reference: Option<String>,
    /// The blob the version was made from by this call (`None` when an existing version was reused).
    pub blob_name: Option<String>,
    /// The version's source URI.
    pub blob_uri: Option<String>,
    /// Whether this call wrote pages.
    pub uploaded: bool,
    /// Bytes of root.vhd inflated by this call's upload (or full verification) pass; 0 when an
    /// existing version or blob was reused without inflating the image.
    pub bytes_read: u64,
    /// Page data sent.
    pub bytes_sent: u64,
    /// All-zero bytes not sent (a new page blob reads as zeros); 0 when nothing was uploaded.
    pub zero_bytes_skipped: u64,
    pub image_sha256: String,
    /// Wall time of the whole call.
    pub seconds: f64,
}

/// Lease of the upload lock: short, so a crashed holder's lock frees itself soon (it is renewed
/// while held).
const UPLOAD_LEASE: Duration = Duration::from_secs(15);
/// Runs queued between the archive reader and the uploader.
const RUN_QUEUE: usize = 16;

/// `seed`: publish the stemcell, then wait until its version has reached every target region
/// (bounded by the operation timeout); the version as it is then.
pub async fn seed(
    ctx: &Context,
    source: Source,
    opts: &PublishOptions,
) -> anyhow::Result<(Published, crate::gallery::ImageVersion)> {
    let published = publish(ctx, source, opts).await?;
    let version = crate::app::replication::wait_for_replication(
        ctx.service.api().as_ref(),
        &published.ensured.definition,
        &published.ensured.version.version,
        ctx.settings.tuning.operation_timeout,
    )
    .await?;
    Ok((published, version))
}

/// Publish a stemcell (or image) as a gallery version; see the module documentation.
pub async fn publish(
    ctx: &Context,
    source: Source,
    opts: &PublishOptions,
) -> anyhow::Result<Published> {
    let service = &ctx.service;
    let started = Instant::now();
    // Identities first: reused by every step of this call.
    let (cid, blob_name) = new_stemcell_blob_name();
    let reference = reference_to_record(opts, &cid)?;
    let call = Call {
        cid: &cid,
        reference: &reference,
        opts,
        started,
    };

    // (1) What is known before the image is read: nothing is sent before this succeeds.
    let described = Instant::now();
    let mut checked = describe(source.clone()).await?;
    tracing::debug!(
        seconds = described.elapsed().as_secs_f64(),
        digests_computed = checked.computed,
        "stemcell described"
    );
    let store = ctx.blob_store("publishing a stemcell")?;
    let definition = definition_name(&checked, opts)?;
    let key = checked.stemcell.version_key.clone();
    // A version without image_sha256 (Azure CPI v52.0.1-v53.0.0) is reused when its source
    // blob holds this stemcell's VHD.
    let proof = PublishProof {
        source: &source,
        store,
    };
    let this = Publishing {
        ctx,
        store,
        call: &call,
        source: &source,
        definition: &definition,
        key: &key,
        blob_name: &blob_name,
        adoption: Some(Adoption {
            proof: &proof,
            unverified: opts.adopt_unverified,
        }),
    };

    // (2) The gallery, before the first byte. A writer about to add its reference to a version
    // that is there announces itself to the version's lock at once, so that a holder a few
    // milliseconds ahead gathers its reference into the same write (group commit;
    // `gallery::lock::Gather`). A create announces itself later, right before its upload (its
    // input is checked first: a refused input writes nothing).
    let observed = service.api().get_version(&definition, &key, false).await?;
    let arrival = service
        .arrive(observed.as_ref(), call.reference.as_deref())
        .await;
    let absent = observed.is_none();
    let existing = match observed.filter(settled_or_busy) {
        Some(v) => v,
        None => return this.without_version(&mut checked, absent, arrival).await,
    };
    this.with_existing(&mut checked, existing, arrival).await
}

/// The reference this call records (`None`: none was asked for), checked before anything is
/// read.
fn reference_to_record(opts: &PublishOptions, cid: &str) -> anyhow::Result<Option<String>> {
    let reference = match &opts.reference {
        RecordReference::Cid => Some(cid.to_string()),
        RecordReference::Given(r) => Some(r.clone()),
        RecordReference::Nothing => None,
    };
    if let Some(reference) = &reference {
        tags::validate_reference(reference)
            .map_err(|e| anyhow::anyhow!("reference {reference:?} cannot be recorded: {e}"))?;
    }
    Ok(reference)
}

/// The image definition the stemcell goes to. With the create-env suffix a valid stemcell name
/// can grow past Azure's limit: refused before anything is uploaded.
fn definition_name(checked: &Checked, opts: &PublishOptions) -> anyhow::Result<String> {
    let definition =
        GalleryService::definition_name(&checked.stemcell, opts.mode, &opts.create_env_suffix);
    crate::stemcell::manifest::check_definition_name(&definition).map_err(|e| {
        crate::error::Coded::new(
            crate::error::Exit::Usage,
            format!("{e} (the stemcell name with the create-env suffix {:?}; set a shorter create_env_suffix)", opts.create_env_suffix),
        )
    })?;
    Ok(definition)
}

/// One publish call once the stemcell is described: where it goes, and what it reports.
struct Publishing<'a> {
    ctx: &'a Context,
    store: &'a dyn BlobStore,
    call: &'a Call<'a>,
    source: &'a Source,
    definition: &'a str,
    key: &'a str,
    blob_name: &'a str,
    adoption: Option<Adoption<'a>>,
}

impl Publishing<'_> {
    /// No version to reuse (absent, or one to replace): restore a soft-deleted one of this
    /// content, or upload and create (or, when another host made the version meanwhile, go on
    /// as [`Publishing::with_existing`] with `arrival`).
    async fn without_version(
        &self,
        checked: &mut Checked,
        absent: bool,
        arrival: Option<String>,
    ) -> anyhow::Result<Published> {
        let (ctx, service, store) = (self.ctx, &self.ctx.service, self.store);
        let (source, call, adoption, opts) =
            (self.source, self.call, self.adoption, self.call.opts);
        let (definition, key) = (self.definition, self.key);
        // Absent: the gallery must exist before the first byte is sent (one GET; a reuse
        // costs none).
        if absent && !service.api().gallery_exists().await? {
            let g = service.gallery();
            return Err(crate::error::Coded::new(
                crate::error::Exit::NotFound,
                format!(
                    "gallery {} does not exist in resource group {} (subscription {}); nothing was uploaded. Create it (az sig create --resource-group {} --gallery-name {}) or name an existing gallery with --gallery",
                    g.gallery, g.resource_group, g.subscription, g.resource_group, g.gallery
                ),
            )
            .into());
        }
        // A soft-deleted version may hold the name (REFERENCE.md "Today's Azure"): the
        // digest decides before anything is sent — the same content is restored, nothing
        // uploaded; other content is refused (a broken stemcell says so first).
        if absent && service.soft_deleted(definition, key).await?.is_some() {
            digest_pass(source, checked).await?;
            let req = call.request(checked, String::new(), String::new());
            let ensured = service.ensure_adopting(&req, adoption).await;
            if let Err(crate::gallery::Error::SoftDeletedConflict(_)) = &ensured {
                verify_fully(source, checked).await?;
            }
            let nothing = Transfer::nothing(checked.bytes_read());
            return Ok(call.result(checked, ensured?, None, nothing));
        }
        // The storage account's id (looked up through ARM unless configured; a reuse needs
        // none): before the first byte.
        let storage_account_id = storage_account_id(ctx).await?;

        // (3) The one pass that reads, verifies and uploads, under the upload lock.
        let upload = Upload {
            service,
            store,
            lock_wait: ctx.lock_wait(),
            definition,
            key,
            blob_name: self.blob_name,
            source,
            opts,
        };
        // About to create: announced to the version's lock before the upload (issue 49), so
        // that the writer of a burst that creates it gathers the others' references into its
        // PUT while they pass the upload lock behind it. Removed on every way out.
        let arrival = match arrival {
            Some(a) => Some(a),
            None if absent => {
                service
                    .arrive_to_create(definition, key, call.reference.as_deref())
                    .await
            }
            None => None,
        };
        let attempt = async {
            let mut attempt = upload.run(checked).await?;
            if let Attempt::NeedDigest = attempt {
                // A complete blob may hold this image: its SHA-256 decides (read without
                // inflating the image), then the upload is decided again under the lock.
                digest_pass(source, checked).await?;
                attempt = upload.run(checked).await?;
            }
            anyhow::Ok(attempt)
        }
        .await;
        let attempt = match attempt {
            Ok(a) => a,
            Err(e) => {
                service.leave(arrival).await;
                return Err(e);
            }
        };
        match attempt {
            // Another host made the version meanwhile.
            Attempt::Version(v) => self.with_existing(checked, *v, arrival).await,
            Attempt::NeedDigest => {
                service.leave(arrival).await;
                anyhow::bail!(
                    "the upload asked for the image's digests twice; this is a bug, please report it"
                )
            }
            Attempt::Blob { name, transfer } => {
                let uri = store.blob_url(&opts.container, &name);
                // The soft-deleted versions were listed before the upload: none holds it.
                let mut req = call.request(checked, uri, storage_account_id);
                req.soft_deleted_checked = absent;
                // The service removes the arrival (with its hand-over or lock, or at the end).
                req.arrival = arrival;
                let ensured = service.ensure_adopting(&req, adoption).await?;
                let transfer = if transfer.uploaded {
                    transfer
                } else {
                    Transfer::nothing(checked.bytes_read())
                };
                Ok(call.result(checked, ensured, Some(name), transfer))
            }
        }
    }

    /// An existing version: reused, adopted or refused by the service, by the image's SHA-256
    /// (read without inflating the image, unless a full pass read it already).
    async fn with_existing(
        &self,
        checked: &mut Checked,
        existing: ImageVersion,
        arrival: Option<String>,
    ) -> anyhow::Result<Published> {
        let (ctx, service) = (self.ctx, &self.ctx.service);
        let (source, call, adoption) = (self.source, self.call, self.adoption);
        let prepared = async {
            digest_pass(source, checked).await?;
            let sha = checked.stemcell.content.digest().to_string();
            if !same_content(&existing, &sha) {
                // Conflict or adoption: a broken stemcell says what is broken first.
                verify_fully(source, checked).await?;
            }
            let account = match existing.storage_account_id.clone() {
                Some(id) => id,
                // Resolved once per process: no second lookup after an upload pass looked it up.
                None => storage_account_id(ctx).await?,
            };
            anyhow::Ok((existing_source(&existing, &sha), account))
        }
        .await;
        let (source_uri, account) = match prepared {
            Ok(p) => p,
            Err(e) => {
                service.leave(arrival).await;
                return Err(e);
            }
        };
        // The service decides on the version observed above (no second GET), and removes the
        // arrival.
        let mut req = call.request(checked, source_uri, account);
        req.arrival = arrival;
        let ensured = service
            .ensure_observed(&req, adoption, Some(existing))
            .await?;
        Ok(call.result(
            checked,
            ensured,
            None,
            Transfer::nothing(checked.bytes_read()),
        ))
    }
}

/// What this call records and reports, whichever way it went.
struct Call<'a> {
    cid: &'a str,
    reference: &'a Option<String>,
    opts: &'a PublishOptions,
    started: Instant,
}

impl Call<'_> {
    /// The ensure request for the stemcell as `checked` knows it (its SHA-256 known by then).
    fn request(&self, checked: &Checked, source_uri: String, account: String) -> EnsureRequest {
        debug_assert!(!checked.stemcell.content.digest().is_empty());
        let opts = self.opts;
        EnsureRequest {
            stemcell: checked.stemcell.clone(),
            mode: opts.mode,
            create_env_suffix: opts.create_env_suffix.clone(),
            source_uri,
            storage_account_id: account,
            target_regions: opts.target_regions.clone(),
            replica_count: opts.replica_count,
            exclude_from_latest: false,
            safeguards: opts.safeguards,
            extra_tags: BTreeMap::new(),
            reference: self.reference.clone(),
            holder: self.reference.as_ref().and(opts.holder.clone()),
            arrival: None,
            soft_deleted_checked: false,
        }
    }

    fn result(
        &self,
        checked: &Checked,
        ensured: Ensured,
        blob: Option<String>,
        transfer: Transfer,
    ) -> Published {
        Published {
            blob_uri: ensured.version.source_uri.clone(),
            ensured,
            cid: self.cid.to_string(),
            reference: self.reference.clone(),
            blob_name: blob,
            uploaded: transfer.uploaded,
            bytes_read: transfer.bytes_read,
            bytes_sent: transfer.bytes_sent,
            zero_bytes_skipped: transfer.zero_bytes_skipped,
            image_sha256: checked.stemcell.content.digest().to_string(),
            seconds: self.started.elapsed().as_secs_f64(),
        }
    }
}

/// The id of the storage account the blobs go to, as a version's source names it.
async fn storage_account_id(ctx: &Context) -> anyhow::Result<String> {
    ctx.storage_account_id().await?.ok_or_else(|| {
        anyhow::anyhow!(
            "the storage account's resource id is unknown; set storage_account in the config file"
        )
    })
}

/// Whether the version records this image's digest.
fn same_content(v: &ImageVersion, sha: &str) -> bool {
    v.tags
        .get(tags::IMAGE_SHA256)
        .is_some_and(|d| d.trim().eq_ignore_ascii_case(sha))
}

pub use crate::gallery::lock::upload_lock_name;

/// The source to ensure an existing version with: its own when the content matches; otherwise
/// none (empty: nothing was uploaded, so the service reuses, adopts or refuses, and never creates
/// from it).
fn existing_source(v: &ImageVersion, sha: &str) -> String {
    match (&v.source_uri, same_content(v, sha)) {
        (Some(uri), true) => uri.clone(),
        _ => String::new(),
    }
}

/// The two sides of the content proof of a version without image_sha256: this stemcell's
/// `root.vhd` (a third pass over the archive, only when the blob side could be read) and the
/// version's source blob in the configured storage account.
struct PublishProof<'a> {
    source: &'a Source,
    store: &'a dyn BlobStore,
}

#[async_trait::async_trait]
impl ContentProof for PublishProof<'_> {
    async fn local_digest(&self) -> crate::gallery::error::Result<String> {
        let source = self.source.clone();
        let read = tokio::task::spawn_blocking(move || -> anyhow::Result<String> {
            let mut sink = ContentSink::new();
            full_pass(&source, &mut sink)?;
            sink.digest()
                .map(str::to_string)
                .ok_or_else(|| anyhow::anyhow!("the reader did not finish the VHD"))
        })
        .await
        .map_err(|e| anyhow::anyhow!("the stemcell reader stopped: {e}"))
        .and_then(|r| r);
        read.map_err(|e| crate::gallery::Error::ContentUnreadable {
            subject: "this stemcell's VHD".into(),
            reason: format!("{e:#}"),
        })
    }

    async fn source_digest(&self, uri: &str) -> crate::gallery::error::Result<SourceContent> {
        self.store.content(uri).await
    }
}

#[cfg(test)]
mod tests;
