//! `ensure`: publish (or reuse) the gallery version for an already uploaded VHD.

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use super::connect::connect;
use super::target::{version_json, StemcellSelector};
use super::{GlobalArgs, Report};
use crate::app::ensure::FromBlob;
use crate::config::resource::{BlobUrl, StorageAccountId};
use crate::error::{Coded, Exit};

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
    let ctx = connect(global)?;
    let safeguards = args.safeguards.over(ctx.settings.safeguards)?;
    let suffix = ctx.settings.create_env_definition_suffix().to_string();
    let sel = args.stemcell.resolve(args.manifest.as_ref(), &suffix)?;
    let request = FromBlob {
        blob,
        blob_uri: args.blob_uri.clone(),
        storage_account_id: args.storage_account_id.clone(),
        sha256: args.sha256.clone(),
        name: sel.name,
        version: sel.version,
        key: sel.key,
        cloud: sel.cloud,
        mode: sel.mode,
        reference: args.reference.clone(),
        holder: args.holder.clone(),
        adopt_unverified: args.adopt_unverified,
        safeguards,
    };
    let (ensured, sha256) = crate::app::ensure::from_blob(&ctx, request).await?;
    let conn = &ctx;
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
