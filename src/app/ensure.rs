//! The ensure-from-blob use case (`ensure --blob-uri`): a version for a VHD already in storage,
//! its content the digest given or the one the blob's metadata records (as the Azure CPI and
//! `seed` record it); the blob checked before a version is created from it.

use crate::app::Context;
use crate::config::resource::{BlobUrl, StorageAccountId};
use crate::error::{Coded, Exit};
use crate::gallery::adopt::{Adoption, ContentProof, SourceContent};
use crate::gallery::blob_store::{BlobStore, VhdSource};
use crate::gallery::decide::{decide, Action};
use crate::gallery::service::{EnsureRequest, Ensured, GalleryService, Mode, StemcellImage};
use crate::names::META_IMAGE_SHA256;
use crate::safeguards::Safeguards;
use crate::stemcell::manifest::CloudProperties;
use crate::stemcell::version::VersionKey;

/// What to ensure from a blob: the blob (checked: https, a container and a blob, no query), the
/// stemcell it holds, and how the version is recorded.
#[derive(Debug, Clone)]
pub struct FromBlob {
    pub blob: BlobUrl,
    /// The blob's URI as given (the version's source, unchanged).
    pub blob_uri: String,
    /// The storage account's resource id (`--storage-account-id`); `None`: the configured one.
    pub storage_account_id: Option<String>,
    /// The image's SHA-256 as given (`--sha256`); `None`: the blob's `image_sha256` metadata.
    pub sha256: Option<String>,
    pub name: String,
    pub version: String,
    pub key: VersionKey,
    pub cloud: CloudProperties,
    pub mode: Mode,
    pub reference: Option<String>,
    pub holder: Option<String>,
    /// Adopt a version without `image_sha256` without proof of its content.
    pub adopt_unverified: bool,
    /// The guards a new version is created with.
    pub safeguards: Safeguards,
}

/// Ensure the version for the blob the request names: reuse, wait for, adopt or create it (the
/// service's decision table). Returns what the service did and the image's SHA-256.
pub async fn from_blob(conn: &Context, request: FromBlob) -> anyhow::Result<(Ensured, String)> {
    let suffix = conn.settings.create_env_definition_suffix().to_string();
    let blob = &request.blob;
    // The account --storage-account-id names must hold the blob (Azure checks a version's
    // source uri and storageAccountId name the same account, REFERENCE.md "Source of a version
    // from a VHD"): said before anything is read or written.
    let given_account = match &request.storage_account_id {
        Some(id) => {
            let account = StorageAccountId::parse(id)
                .map_err(|m| Coded::new(Exit::Usage, format!("--storage-account-id {m}")))?;
            same_account(blob, &account.name, "--storage-account-id")?;
            Some(id.clone())
        }
        None => None,
    };
    let blob_uri = blob.url.clone();
    let sha256 = match &request.sha256 {
        Some(s) => normalise_sha256(s)?,
        None => digest_from_blob(conn, &blob_uri).await?,
    };
    let stemcell = StemcellImage::from_cloud_properties(
        &request.name,
        &request.version,
        &request.key,
        &request.cloud,
        &sha256,
    );
    // One GET: a version that is there with this content is reused without anything else
    // (bench/README: a reuse costs one ARM request). Only a create reads the blob and the
    // storage account's id.
    let definition = GalleryService::definition_name(&stemcell, request.mode, &suffix);
    let key = request.key.to_string();
    let observed = conn
        .service
        .api()
        .get_version(&definition, &key, false)
        .await?;
    let action = decide(
        observed.as_ref(),
        &stemcell.content,
        request.reference.as_deref(),
    );
    let creates = matches!(action, Action::Create | Action::Replace);
    // A version already holding the --sha256 image does not need the blob, so a missing one is
    // not exit 3 (docs/commands.md "Exit codes"): the digest is the content's identity, nothing
    // is created from the blob, and a re-run after the blob went (the Azure CPI and `delete`
    // remove `<cid>.vhd` while the version stays) must still reuse the version and record its
    // reference. A missing blob is named all the same, in case the URI has a typo.
    let reuses = matches!(action, Action::Reuse | Action::AddReference | Action::Wait);
    if reuses && request.sha256.is_some() {
        warn_unneeded_missing_blob(conn, &blob_uri, &definition, &key, &sha256).await;
    }
    // About to add its reference to a version that is there, this writer announces itself to
    // the version's lock (group commit; `gallery::lock::Gather`); a create, once its source is
    // checked (below).
    let mut arrival = conn
        .service
        .arrive(observed.as_ref(), request.reference.as_deref())
        .await;
    let storage_account_id = source_account(conn, blob, given_account, creates).await?;
    if creates && observed.is_none() {
        // About to create, its source checked: writers of a burst that find it being created
        // hand their references to its PUT (issue 49), and its creator waits for those
        // announced. The service removes the arrival on every way out.
        arrival = conn
            .service
            .arrive_to_create(&definition, &key, request.reference.as_deref())
            .await;
    }
    let req = EnsureRequest {
        stemcell,
        mode: request.mode,
        create_env_suffix: suffix,
        source_uri: request.blob_uri.clone(),
        storage_account_id,
        target_regions: vec![],
        replica_count: conn.settings.replicas,
        exclude_from_latest: false,
        safeguards: request.safeguards,
        extra_tags: Default::default(),
        reference: request.reference.clone(),
        holder: request.holder.clone(),
        arrival,
        soft_deleted_checked: false,
    };
    let proof = BlobProof {
        storage: conn.storage(),
        local_uri: request.blob_uri.clone(),
    };
    let adoption = Adoption {
        proof: &proof,
        unverified: request.adopt_unverified || conn.settings.adopt_unverified,
    };
    let ensured = conn
        .service
        .ensure_observed(&req, Some(adoption), observed)
        .await?;
    if let Some(a) = &ensured.adopted {
        tracing::info!("{}", a.describe(&ensured.version.id));
    }
    Ok((ensured, sha256))
}

/// The storage account id a create names beside its source (checked: the blob exists, and the
/// account holds it); empty when nothing is created from the blob.
async fn source_account(
    conn: &Context,
    blob: &BlobUrl,
    given_account: Option<String>,
    creates: bool,
) -> anyhow::Result<String> {
    if !creates {
        // Nothing is created from the blob (a reuse, a reference, a wait, an adoption): a round
        // that finds the version gone after all says so, and a re-run creates it.
        return Ok(String::new());
    }
    check_source(conn, &blob.url).await?;
    if let Some(id) = given_account {
        return Ok(id);
    }
    let id = conn.storage_account_id().await?.ok_or_else(|| {
        Coded::new(
            Exit::Usage,
            "pass --storage-account-id (the resource id of the storage account holding the blob)",
        )
    })?;
    let account = StorageAccountId::parse(&id)
        .map_err(|m| Coded::new(Exit::Usage, format!("the configured storage account: {m}")))?;
    same_account(blob, &account.name, "the configured storage account")?;
    Ok(id)
}

/// Say so when the blob of an `ensure` that reuses a version holding its image does not exist
/// (see `from_blob`). A blob outside the configured storage account, or one that cannot be read,
/// is not checked: it is not needed.
async fn warn_unneeded_missing_blob(
    conn: &Context,
    uri: &url::Url,
    definition: &str,
    key: &str,
    sha256: &str,
) {
    let Some(storage) = conn.storage() else {
        return;
    };
    let Some((container, blob)) =
        crate::config::resource::blob_in_account(storage.endpoint(), uri.as_str())
    else {
        return;
    };
    if let Ok(None) = storage.metadata(&container, &blob).await {
        tracing::warn!(
            "blob {} does not exist; it is not needed: gallery version {definition}/{key} already holds image_sha256 {sha256} and is reused (check --blob-uri if you expected the blob there)",
            crate::redact::uri(uri.as_str())
        );
    }
}

/// The blob's host account (`https://ACCOUNT.blob...`) must be the account `named_by` names.
fn same_account(blob: &BlobUrl, account: &str, named_by: &str) -> anyhow::Result<()> {
    match &blob.host_account {
        Some(host) if !host.eq_ignore_ascii_case(account) => Err(Coded::new(
            Exit::Usage,
            format!(
                "the blob is in storage account {host}, but {named_by} names {account}; pass --storage-account-id with the resource id of storage account {host}"
            ),
        )
        .into()),
        _ => Ok(()),
    }
}

/// `ensure`'s content proof: the VHD it was given is the blob at --blob-uri.
struct BlobProof<'a> {
    storage: Option<&'a dyn BlobStore>,
    local_uri: String,
}

#[async_trait::async_trait]
impl ContentProof for BlobProof<'_> {
    async fn local_digest(&self) -> crate::gallery::error::Result<String> {
        let content = match self.storage {
            Some(storage) => storage.content(&self.local_uri).await?,
            None => SourceContent::Unreadable("no storage account is configured".into()),
        };
        match content {
            SourceContent::Digest(d) => Ok(d),
            SourceContent::Gone => Err(crate::gallery::Error::ContentGone {
                subject: format!("--blob-uri {}", crate::redact::uri(&self.local_uri)),
            }),
            SourceContent::Unreadable(reason) => Err(crate::gallery::Error::ContentUnreadable {
                subject: format!("--blob-uri {}", crate::redact::uri(&self.local_uri)),
                reason,
            }),
        }
    }

    async fn source_digest(&self, uri: &str) -> crate::gallery::error::Result<SourceContent> {
        match self.storage {
            Some(storage) => storage.content(uri).await,
            None => Ok(SourceContent::Unreadable(
                "no storage account is configured".into(),
            )),
        }
    }
}

/// `--sha256` (or a blob's `image_sha256`): 64 hex digits, an optional `sha256:` prefix.
pub fn normalise_sha256(s: &str) -> anyhow::Result<String> {
    let s = s
        .trim()
        .strip_prefix("sha256:")
        .unwrap_or(s.trim())
        .to_ascii_lowercase();
    if s.len() == 64 && s.chars().all(|c| c.is_ascii_hexdigit()) {
        Ok(s)
    } else {
        Err(Coded::new(
            Exit::Usage,
            format!("--sha256 {s:?} is not a SHA-256 digest (64 hex characters)"),
        )
        .into())
    }
}

/// The digest recorded on the blob (as the Azure CPI and `seed` record it).
pub async fn digest_from_blob(conn: &Context, uri: &url::Url) -> anyhow::Result<String> {
    let storage = conn.blob_store("reading the blob's image_sha256 metadata (or pass --sha256)")?;
    let (container, blob) =
        crate::config::resource::blob_in_account(storage.endpoint(), uri.as_str()).ok_or_else(
            || {
                Coded::new(
                    Exit::Usage,
                    format!(
                        "the blob {uri} is not in the configured storage account {} (or names no container and blob); pass --sha256",
                        storage.endpoint()
                    ),
                )
            },
        )?;
    let metadata = storage.metadata(&container, &blob).await?.ok_or_else(|| {
        Coded::new(
            Exit::NotFound,
            format!("blob {uri} does not exist; upload it first (or use `seed`)"),
        )
    })?;
    let digest = metadata.get(META_IMAGE_SHA256).ok_or_else(|| {
        Coded::new(
            Exit::Usage,
            format!("blob {uri} has no image_sha256 metadata; pass --sha256"),
        )
    })?;
    normalise_sha256(digest)
}

/// Before a version is created from the blob `uri`: it must exist (else exit 3) and be a fixed
/// VHD page blob of a whole number of MiB (else exit 1), checked with reads only, so a bad
/// source leaves nothing behind in the gallery (Azure would accept the PUT, then fail the
/// version). A blob outside the configured storage account cannot be read here: it is not
/// checked, and the log says so.
pub async fn check_source(conn: &Context, uri: &url::Url) -> anyhow::Result<()> {
    let shown = crate::redact::uri(uri.as_str());
    let Some(storage) = conn.storage() else {
        tracing::warn!("no storage account is configured: the blob {shown} is not checked before the version is created from it");
        return Ok(());
    };
    let Some((container, blob)) =
        crate::config::resource::blob_in_account(storage.endpoint(), uri.as_str())
    else {
        tracing::warn!(
            "the blob {shown} is not in the configured storage account {}: it is not checked before the version is created from it",
            storage.endpoint()
        );
        return Ok(());
    };
    match storage.check_vhd(&container, &blob).await? {
        VhdSource::Fixed { .. } => Ok(()),
        VhdSource::Missing => Err(Coded::new(
            Exit::NotFound,
            format!("blob {shown} does not exist; nothing was created. Upload the VHD first (or publish the stemcell with `seed`)"),
        )
        .into()),
        VhdSource::Unfit(why) => Err(Coded::new(
            Exit::Error,
            format!("blob {shown} cannot be the source of a gallery version: {why}; nothing was created"),
        )
        .into()),
    }
}
