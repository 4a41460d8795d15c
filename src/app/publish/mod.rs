//! One pipeline from a stemcell (or a CPI's `image` file) to a gallery version: used by `seed`
//! and by the CPI's `create_stemcell`.
//!
//! 1. **Digest first, write nothing.** The manifest, the version key (four parts, `-rc.1`... are
//!    refused), light stemcells, the outer tarball's entries, the image's SHA-1 against the
//!    manifest and its SHA-256 are checked in a digest pass that inflates the outer gzip only
//!    (`archive::digest_stemcell`; the image is hashed, not inflated), and root.vhd's tar header
//!    and first sector are read from the image's first MiB. Bad input found there causes zero ARM
//!    and zero blob writes. When those first bytes do not settle root.vhd (an odd image), the
//!    whole stemcell is read and verified before anything is written, as before.
//! 2. **Check the gallery before the first byte.** One GET of the target version: present with the
//!    same `image_sha256` → nothing is uploaded or inflated, the version is reused (the reference
//!    recorded); present with a different digest → the stemcell is verified in full (a broken one
//!    says so rather than "conflict"), then the service's conflict error (exit 4), nothing
//!    uploaded. Absent → the gallery itself must exist, else exit 3 before any byte is sent.
//! 3. **Upload in the one full pass.** Under the upload lease of this content in the stemcell
//!    container (`uploads/sha256/<image_sha256>.lock`, distinct from the service's own `locks/...`
//!    names), the gallery is observed again, a complete blob with the same digest is
//!    reused (0 bytes), partial blobs of the same digest left by an interrupted run are deleted,
//!    and the stemcell is read once more, inflated and verified while it streams into a new sparse
//!    page blob. What only the whole VHD shows (its footer, a second root.vhd, a corrupt tail, a
//!    file changed since the digest pass) fails that pass: the blob is deleted and no version is
//!    created (write-then-clean; fixtures/bad_input/cases.toml marks those cases). The blob is
//!    then marked complete with the Azure CPI's metadata and the version ensured from its URI.
//!
//! Storage is reached through one object, the [`BlobStore`] port (blobs, partial-blob cleanup,
//! completion marks, the upload lock); the gallery through the [`GalleryService`]. Both come
//! from a [`PublishContext`] ([`Connected`] in production), so the pipeline also runs over
//! in-memory fakes (the unit tests in `tests.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::mpsc;

use crate::app::blob_store::{BlobStore, CompletionMarks, PageRun, Progress, WriteOptions};
use crate::app::context::Connected;
use crate::azure::blob::{new_stemcell_blob_name, page_runs_sink, STEMCELL_CONTAINER};
use crate::gallery::adopt::{Adoption, ContentProof, SourceContent};
use crate::gallery::model::{ImageVersion, ProvisioningState, TargetRegion};
use crate::gallery::service::{
    EnsureRequest, Ensured, GalleryService, Mode, DEFAULT_CREATE_ENV_SUFFIX,
};
use crate::gallery::tags;
use crate::stemcell::content::ContentSink;
use crate::stemcell::manifest::CloudProperties;

mod passes;
use passes::{check, full_pass, is_sink_error, verify_fully, Checked, FullPass, UploadSink};

/// The content digest of a blob in the configured storage account (`ensure --blob-uri`'s side
/// of a content proof); see [`BlobStore::content`].
pub use crate::azure::stemcell_store::content_at as blob_content;

/// What publish needs of its context: the gallery service, the blob store, how long to wait for
/// a lock, and the storage account's resource id.
#[async_trait::async_trait]
pub trait PublishContext: Sync {
    fn service(&self) -> &GalleryService;
    /// The blob store, or an error saying why `why` needs one.
    fn blob_store(&self, why: &str) -> anyhow::Result<&dyn BlobStore>;
    /// How long a writer waits for another process's lock.
    fn lock_wait(&self) -> Duration;
    /// The storage account's resource id, as a version's source names it (`None`: unknown).
    async fn storage_account_id(&self) -> anyhow::Result<Option<String>>;
}

#[async_trait::async_trait]
impl PublishContext for Connected {
    fn service(&self) -> &GalleryService {
        &self.service
    }
    fn blob_store(&self, why: &str) -> anyhow::Result<&dyn BlobStore> {
        Connected::blob_store(self, why)
    }
    fn lock_wait(&self) -> Duration {
        self.settings.tuning.lock_wait
    }
    async fn storage_account_id(&self) -> anyhow::Result<Option<String>> {
        Connected::storage_account_id(self).await
    }
}

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

/// Publish a stemcell (or image) as a gallery version; see the module documentation.
pub async fn publish(
    conn: &Connected,
    source: Source,
    opts: &PublishOptions,
) -> anyhow::Result<Published> {
    publish_with(conn, source, opts).await
}

/// [`publish`] in any [`PublishContext`] (the production one, or fakes).
pub async fn publish_with(
    ctx: &dyn PublishContext,
    source: Source,
    opts: &PublishOptions,
) -> anyhow::Result<Published> {
    let service = ctx.service();
    let started = Instant::now();
    // Identities first: reused by every step of this call.
    let (cid, blob_name) = new_stemcell_blob_name();
    let reference = match &opts.reference {
        RecordReference::Cid => Some(cid.clone()),
        RecordReference::Given(r) => Some(r.clone()),
        RecordReference::Nothing => None,
    };
    if let Some(reference) = &reference {
        tags::validate_reference(reference)
            .map_err(|e| anyhow::anyhow!("reference {reference:?} cannot be recorded: {e}"))?;
    }

    // (1) Digest pass: nothing is sent before this succeeds.
    let digest_started = Instant::now();
    let mut checked = check(source.clone()).await?;
    tracing::debug!(
        seconds = digest_started.elapsed().as_secs_f64(),
        image_sha256 = %checked.stemcell.image_sha256,
        vhd_settled = checked.vhd_file_size > 0,
        "digest pass done"
    );
    let store = ctx.blob_store("publishing a stemcell")?;
    let stemcell = checked.stemcell.clone();
    let sha = stemcell.image_sha256.clone();
    let definition = GalleryService::definition_name(&stemcell, opts.mode, &opts.create_env_suffix);
    // With the create-env suffix a valid stemcell name can grow past Azure's limit: refuse
    // before anything is uploaded.
    crate::stemcell::manifest::check_definition_name(&definition).map_err(|e| {
        crate::error::Coded::new(
            crate::error::Exit::Usage,
            format!("{e} (the stemcell name with the create-env suffix {:?}; set a shorter create_env_suffix)", opts.create_env_suffix),
        )
    })?;
    let key = stemcell.version_key.clone();
    // A version without image_sha256 (Azure CPI v52.0.1-v53.0.0) is reused when its source
    // blob holds this stemcell's VHD.
    let proof = PublishProof {
        source: &source,
        store,
    };
    let adoption = Some(Adoption {
        proof: &proof,
        unverified: opts.adopt_unverified,
    });
    let request = |source_uri: String, account: String| EnsureRequest {
        stemcell: stemcell.clone(),
        mode: opts.mode,
        create_env_suffix: opts.create_env_suffix.clone(),
        source_uri,
        storage_account_id: account,
        target_regions: opts.target_regions.clone(),
        replica_count: opts.replica_count,
        exclude_from_latest: false,
        end_of_life: None,
        extra_tags: BTreeMap::new(),
        reference: reference.clone(),
        holder: reference.as_ref().and(opts.holder.clone()),
    };
    let result = |ensured: Ensured, blob: Option<String>, transfer: Transfer| Published {
        blob_uri: ensured.version.source_uri.clone(),
        ensured,
        cid: cid.clone(),
        reference: reference.clone(),
        blob_name: blob,
        uploaded: transfer.uploaded,
        bytes_read: transfer.bytes_read,
        bytes_sent: transfer.bytes_sent,
        zero_bytes_skipped: transfer.zero_bytes_skipped,
        image_sha256: sha.clone(),
        seconds: started.elapsed().as_secs_f64(),
    };

    // (2) The gallery, before the first byte.
    let observed = service.api().get_version(&definition, &key, false).await?;
    let absent = observed.is_none();
    let existing = match observed.filter(settled_or_busy) {
        Some(v) => v,
        None => {
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
            if checked.vhd_file_size == 0 {
                // The digest pass could not settle root.vhd from the image's first bytes.
                verify_fully(&source, &mut checked).await?;
            }
            // The storage account's id (looked up through ARM unless configured; a reuse needs
            // none): before the first byte.
            let storage_account_id = storage_account_id(ctx).await?;

            // (3) Upload under the upload lock.
            let container = opts.container.as_str();
            store
                .ensure_container(container)
                .await
                .with_context(|| format!("cannot prepare container {container}"))?;
            let lock_name = upload_lock_name(&sha);
            let guard = store
                .lock(container, &lock_name, ctx.lock_wait(), UPLOAD_LEASE)
                .await?;
            let step = upload_locked(
                service,
                store,
                &definition,
                &key,
                &blob_name,
                &source,
                &checked,
                opts,
            )
            .await;
            if let Err(e) = guard.release().await {
                tracing::warn!(error = %e, "could not release the upload lock; its lease expires by itself");
            }
            match step? {
                // Another host made the version meanwhile.
                Step::UseVersion(v) => *v,
                Step::Blob { name, transfer } => {
                    let uri = store.blob_url(container, &name);
                    let ensured = service
                        .ensure_adopting(&request(uri, storage_account_id), adoption)
                        .await?;
                    let transfer = if transfer.uploaded {
                        transfer
                    } else {
                        Transfer::nothing(checked.bytes_read())
                    };
                    return Ok(result(ensured, Some(name), transfer));
                }
            }
        }
    };

    // An existing version: reused, adopted or refused by the service.
    if !same_content(&existing, &sha) {
        // Conflict or adoption: a broken stemcell says what is broken first.
        verify_fully(&source, &mut checked).await?;
    }
    let account = match existing.storage_account_id.clone() {
        Some(id) => id,
        // Resolved once per process: no second lookup after an upload pass looked it up.
        None => storage_account_id(ctx).await?,
    };
    // The service decides on the version observed above (no second GET).
    let source = existing_source(&existing, &sha);
    let ensured = service
        .ensure_observed(&request(source, account), adoption, Some(existing))
        .await?;
    Ok(result(
        ensured,
        None,
        Transfer::nothing(checked.bytes_read()),
    ))
}

/// The id of the storage account the blobs go to, as a version's source names it.
async fn storage_account_id(ctx: &dyn PublishContext) -> anyhow::Result<String> {
    ctx.storage_account_id().await?.ok_or_else(|| {
        anyhow::anyhow!(
            "the storage account's resource id is unknown; set storage_account in the config file"
        )
    })
}

/// What one call moved.
#[derive(Debug, Clone, Copy)]
struct Transfer {
    uploaded: bool,
    bytes_read: u64,
    bytes_sent: u64,
    zero_bytes_skipped: u64,
}

impl Transfer {
    fn nothing(bytes_read: u64) -> Transfer {
        Transfer {
            uploaded: false,
            bytes_read,
            bytes_sent: 0,
            zero_bytes_skipped: 0,
        }
    }
}

/// Whether the version records this image's digest.
fn same_content(v: &ImageVersion, sha: &str) -> bool {
    v.tags
        .get(tags::IMAGE_SHA256)
        .is_some_and(|d| d.trim().eq_ignore_ascii_case(sha))
}

pub use crate::gallery::lock::upload_lock_name;

/// A version the service can reuse, wait for, or refuse without a new blob: anything but
/// Failed/Canceled (replaced from a new upload) and Deleting (its blob may be going too).
fn settled_or_busy(v: &ImageVersion) -> bool {
    !matches!(
        v.provisioning_state,
        ProvisioningState::Failed | ProvisioningState::Canceled | ProvisioningState::Deleting
    )
}

/// The source to ensure an existing version with: its own when the content matches; otherwise
/// none (empty: nothing was uploaded, so the service reuses, adopts or refuses, and never creates
/// from it).
fn existing_source(v: &ImageVersion, sha: &str) -> String {
    match (&v.source_uri, same_content(v, sha)) {
        (Some(uri), true) => uri.clone(),
        _ => String::new(),
    }
}

enum Step {
    /// The version appeared meanwhile (another host): ensure from it.
    UseVersion(Box<ImageVersion>),
    /// A complete blob: reused (`transfer.uploaded` false) or written now.
    Blob { name: String, transfer: Transfer },
}

#[allow(clippy::too_many_arguments)]
async fn upload_locked(
    service: &GalleryService,
    store: &dyn BlobStore,
    definition: &str,
    key: &str,
    blob_name: &str,
    source: &Source,
    checked: &Checked,
    opts: &PublishOptions,
) -> anyhow::Result<Step> {
    let container = opts.container.as_str();
    let sha = &checked.stemcell.image_sha256;
    // Observe again under the lock: another host may have finished meanwhile.
    if let Some(v) = service.api().get_version(definition, key, false).await? {
        if settled_or_busy(&v) {
            return Ok(Step::UseVersion(Box::new(v)));
        }
    }
    if let Some(found) = store.find_complete(container, sha).await? {
        if found.size == checked.vhd_file_size {
            tracing::info!(blob = %found.name, "a complete blob with this image_sha256 exists; reusing it (0 bytes sent)");
            return Ok(Step::Blob {
                name: found.name,
                transfer: Transfer::nothing(0),
            });
        }
        tracing::warn!(blob = %found.name, size = found.size, expected = checked.vhd_file_size, "a complete blob with this image_sha256 has another size; not reusing it");
    }
    // Partial blobs of this content left by an interrupted run: only ours (same digest, so the
    // same version, whose upload lock we hold) are deleted.
    for partial in store.find_partial(container).await? {
        let same = partial
            .image_sha256
            .as_deref()
            .is_some_and(|d| d.eq_ignore_ascii_case(sha));
        if same {
            tracing::info!(blob = %partial.name, "deleting the partial blob of an interrupted upload");
            store.delete(container, &partial.name).await?;
        }
    }

    let path = format!("{container}/{blob_name}");
    store
        .create(container, blob_name, checked.vhd_file_size, sha)
        .await?;
    tracing::info!(blob = %path, bytes = checked.vhd_file_size, "uploading root.vhd as a sparse page blob");
    let streamed = stream_upload(store, container, blob_name, source, checked, opts).await;
    let transfer = match streamed {
        Ok(n) => n,
        Err(e) => {
            if let Err(d) = store.delete(container, blob_name).await {
                tracing::warn!(error = %d, blob = blob_name, "could not delete the partial blob; the next run deletes it");
            }
            return Err(e.context(format!(
                "upload of {blob_name} failed; the blob was removed and no gallery version was created"
            )));
        }
    };
    let marks = CompletionMarks {
        cloud_properties: &checked.cloud,
        image_sha256: sha,
        gallery: &service.gallery().gallery,
        definition,
    };
    store.mark_complete(container, blob_name, &marks).await?;
    Ok(Step::Blob {
        name: blob_name.to_string(),
        transfer,
    })
}

/// The full pass: the archive reader (blocking thread) inflates and verifies the stemcell and
/// feeds the uploader through a bounded channel. Succeeds only when both succeeded, root.vhd had
/// the size the blob was created with, and the image's digest is the digest pass's.
async fn stream_upload(
    store: &dyn BlobStore,
    container: &str,
    blob_name: &str,
    source: &Source,
    checked: &Checked,
    opts: &PublishOptions,
) -> anyhow::Result<Transfer> {
    let (tx, rx) = mpsc::channel::<PageRun>(RUN_QUEUE);
    let source = source.clone();
    let expected = checked.stemcell.image_sha256.clone();
    let size = checked.vhd_file_size;
    let reader = tokio::task::spawn_blocking(move || -> anyhow::Result<FullPass> {
        let mut sink = UploadSink {
            size,
            send: page_runs_sink(tx),
        };
        full_pass(&source, &mut sink)
    });
    let write = WriteOptions {
        concurrency: opts.concurrency.max(1),
        progress: opts.progress.clone(),
    };
    let upload = store.write_pages(container, blob_name, checked.vhd_file_size, rx, &write);
    let (read, uploaded) = tokio::join!(reader, upload);
    // The uploader's own error explains a reader that stopped because the uploader went away.
    let read = read.map_err(|e| anyhow::anyhow!("the stemcell reader stopped: {e}"))?;
    let (pass, stats) = match (read, uploaded) {
        (Ok(r), Ok(_)) if !r.image_sha256.eq_ignore_ascii_case(&expected) => anyhow::bail!(
            "the image changed between the digest pass and the upload (SHA-256 {expected} then {}); is the file being rewritten?",
            r.image_sha256
        ),
        (Ok(r), Ok(stats)) => (r, stats),
        // The uploader's own error explains a reader that stopped because the uploader went
        // away; any other reader error (a broken VHD) is the cause.
        (Err(e), Err(u)) if is_sink_error(&e) => return Err(u),
        (Err(e), _) => return Err(e),
        (Ok(_), Err(e)) => return Err(e),
    };
    Ok(Transfer {
        uploaded: true,
        bytes_read: pass.read.vhd_bytes,
        bytes_sent: stats.bytes_sent,
        zero_bytes_skipped: pass.read.zero_bytes,
    })
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
