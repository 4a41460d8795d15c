//! `ensure`: publish (or reuse) the gallery version for an already uploaded VHD.

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use super::connect::connect;
use super::target::{version_json, StemcellSelector};
use super::{GlobalArgs, Report};
use crate::app::publish::blob_content;
use crate::config::resource::{BlobUrl, StorageAccountId};
use crate::error::{Coded, Exit};
use crate::gallery::adopt::{Adoption, ContentProof, SourceContent};
use crate::gallery::decide::{decide, Action};
use crate::gallery::service::{EnsureRequest, GalleryService, StemcellImage};

#[derive(Debug, Args)]
pub struct EnsureArgs {
    /// URI of the uploaded fixed VHD page blob (no SAS).
    #[arg(long, value_name = "URI")]
    pub blob_uri: String,
    /// Resource id of the storage account holding the blob (default: the configured account).
    #[arg(long, value_name = "ID")]
    pub storage_account_id: Option<String>,
    /// The stemcell's stemcell.MF (instead of --name/--version).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["name", "version"])]
    pub manifest: Option<PathBuf>,
    #[command(flatten)]
    pub stemcell: StemcellSelector,
    /// SHA-256 of the stemcell's `image` file (default: the blob's `image_sha256` metadata).
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<String>,
    /// Reference to record on the version (e.g. a stemcell CID).
    #[arg(long, value_name = "REF")]
    pub reference: Option<String>,
    /// Who holds --reference (an environment, a pipeline, a director UUID): shown by `lookup`
    /// and `list`; `references prune` keeps a holder's references unless its stemcell list is
    /// given.
    #[arg(long, value_name = "NAME", requires = "reference", value_parser = super::seed::parse_holder)]
    pub holder: Option<String>,
    /// Adopt an existing version without image_sha256 (made by Azure CPI v52.0.1-v53.0.0) whose
    /// source blob is gone or unreadable, without proof of its content. Without this flag such a
    /// version is adopted only when its source blob holds the same VHD as --blob-uri.
    #[arg(long)]
    pub adopt_unverified: bool,
    #[command(flatten)]
    pub safeguards: super::seed::SafeguardArgs,
}

/// `ensure`'s content proof: the VHD it was given is the blob at --blob-uri.
struct BlobProof<'a> {
    storage: Option<&'a crate::azure::blob::StorageTarget>,
    local_uri: String,
}

#[async_trait::async_trait]
impl ContentProof for BlobProof<'_> {
    async fn local_digest(&self) -> crate::gallery::error::Result<String> {
        let content = match self.storage {
            Some(storage) => blob_content(storage, &self.local_uri).await?,
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
            Some(storage) => blob_content(storage, uri).await,
            None => Ok(SourceContent::Unreadable(
                "no storage account is configured".into(),
            )),
        }
    }
}

pub async fn run(global: &GlobalArgs, args: EnsureArgs) -> anyhow::Result<Report> {
    // A usage error (exit 2) like delete's and lookup's, before anything is read or sent.
    if let Some(r) = &args.reference {
        crate::gallery::tags::validate_reference(r)
            .map_err(|e| Coded::new(Exit::Usage, e.to_string()))?;
    }
    // The blob URL: https (http only on loopback, for the emulator), naming a container and a
    // blob, and without a query string. Checked before anything is read or sent.
    let blob =
        BlobUrl::parse(&args.blob_uri, "--blob-uri").map_err(|m| Coded::new(Exit::Usage, m))?;
    if !blob.url.query().unwrap_or("").is_empty() {
        return Err(Coded::new(
            Exit::Usage,
            "--blob-uri must not carry a query string (a SAS token): the gallery reads the blob through the storage account id",
        )
        .into());
    }
    if let Some(id) = &args.storage_account_id {
        StorageAccountId::parse(id)
            .map_err(|m| Coded::new(Exit::Usage, format!("--storage-account-id {m}")))?;
    }
    let conn = connect(global)?;
    let safeguards = args.safeguards.over(conn.settings.safeguards)?;
    let suffix = conn.settings.create_env_definition_suffix().to_string();
    let sel = args.stemcell.resolve(args.manifest.as_ref(), &suffix)?;
    // The account --storage-account-id names must hold the blob (Azure checks a version's
    // source uri and storageAccountId name the same account, REFERENCE.md "Source of a version
    // from a VHD"): said before anything is read or written.
    let given_account = match &args.storage_account_id {
        Some(id) => {
            let account = StorageAccountId::parse(id)
                .map_err(|m| Coded::new(Exit::Usage, format!("--storage-account-id {m}")))?;
            same_account(&blob, &account.name, "--storage-account-id")?;
            Some(id.clone())
        }
        None => None,
    };
    let blob_uri = blob.url.clone();
    let sha256 = match &args.sha256 {
        Some(s) => crate::app::ensure::normalise_sha256(s)?,
        None => crate::app::ensure::digest_from_blob(&conn, &blob_uri).await?,
    };
    let stemcell = StemcellImage::from_cloud_properties(
        &sel.name,
        &sel.version,
        &sel.key,
        &sel.cloud,
        &sha256,
    );
    // One GET: a version that is there with this content is reused without anything else
    // (bench/README: a reuse costs one ARM request). Only a create reads the blob and the
    // storage account's id.
    let definition = GalleryService::definition_name(&stemcell, sel.mode, &suffix);
    let key = sel.key.to_string();
    let observed = conn
        .service
        .api()
        .get_version(&definition, &key, false)
        .await?;
    let creates = matches!(
        decide(observed.as_ref(), &sha256, args.reference.as_deref()),
        Action::Create | Action::Replace
    );
    // About to add its reference to a version that is there, this writer announces itself to
    // the version's lock (group commit; `gallery::lock::Gather`); a create announces nothing.
    let arrival = conn
        .service
        .arrive(observed.as_ref(), args.reference.as_deref())
        .await;
    let storage_account_id = if creates {
        crate::app::ensure::check_source(&conn, &blob_uri).await?;
        match given_account {
            Some(id) => id,
            None => {
                let id = conn.storage_account_id().await?.ok_or_else(|| {
                    Coded::new(
                        Exit::Usage,
                        "pass --storage-account-id (the resource id of the storage account holding the blob)",
                    )
                })?;
                let account = StorageAccountId::parse(&id).map_err(|m| {
                    Coded::new(Exit::Usage, format!("the configured storage account: {m}"))
                })?;
                same_account(&blob, &account.name, "the configured storage account")?;
                id
            }
        }
    } else {
        // Nothing is created from the blob (a reuse, a reference, a wait, an adoption): a round
        // that finds the version gone after all says so, and a re-run creates it.
        String::new()
    };
    let req = EnsureRequest {
        stemcell,
        mode: sel.mode,
        create_env_suffix: suffix,
        source_uri: args.blob_uri.clone(),
        storage_account_id,
        target_regions: vec![],
        replica_count: conn.settings.replicas,
        exclude_from_latest: false,
        safeguards,
        extra_tags: Default::default(),
        reference: args.reference.clone(),
        holder: args.holder.clone(),
        arrival,
        soft_deleted_checked: false,
    };
    let proof = BlobProof {
        storage: conn.storage(),
        local_uri: args.blob_uri.clone(),
    };
    let adoption = Adoption {
        proof: &proof,
        unverified: args.adopt_unverified || conn.settings.adopt_unverified,
    };
    let ensured = conn
        .service
        .ensure_observed(&req, Some(adoption), observed)
        .await?;
    if let Some(a) = &ensured.adopted {
        tracing::info!("{}", a.describe(&ensured.version.id));
    }
    let mut doc = version_json(&conn.settings.gallery, &ensured.version);
    doc["outcome"] = json!(ensured.outcome);
    doc["mode"] = json!(ensured.mode.as_str());
    // A version without image_sha256 adopted by this call: how its content was proven.
    doc["adopted"] = json!(ensured.adopted);
    let human = format!(
        "{} {}/{}/{} ({}, {})\n  id: {}\n  image_sha256: {}",
        match ensured.outcome {
            crate::gallery::service::Outcome::Created => "created",
            crate::gallery::service::Outcome::Reused => "reused",
            crate::gallery::service::Outcome::Waited => "waited for",
            crate::gallery::service::Outcome::Recreated => "recreated",
            crate::gallery::service::Outcome::Restored => "restored",
        },
        conn.settings.gallery,
        ensured.definition,
        ensured.version.version,
        ensured.mode.as_str(),
        ensured.version.provisioning_state,
        ensured.version.id,
        sha256
    );
    let human = match &ensured.adopted {
        Some(a) => format!("{human}\n  adopted: {}", a.describe(&ensured.version.id)),
        None => human,
    };
    Ok(Report::new(doc, human))
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
