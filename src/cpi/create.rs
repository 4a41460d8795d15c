//! `create_stemcell`: publish a heavy stemcell's image to the gallery through `publish`, in the
//! mode the configuration or the request calls for, and return the CID recorded on the version.

use serde_json::{Map, Value};

use super::handler::{cloud_error, CreateArgs};
use super::mode;
use super::protocol::CpiError;
use crate::app::context::Context;
use crate::app::publish::{publish, PublishOptions, Published, RecordReference, Source};
use crate::gallery::blob_store::Progress;
use crate::gallery::service::Outcome;

/// What a publish did, in one log line: whether pages were sent, an existing blob was reused, or
/// an existing version was reused; and what happened to the gallery version.
pub fn describe(p: &Published) -> String {
    let e = &p.ensured;
    let version = match e.outcome {
        Outcome::Created => format!("created gallery version {}", e.version.id),
        Outcome::Recreated => format!(
            "recreated gallery version {} (the previous one had Failed)",
            e.version.id
        ),
        Outcome::Reused => format!("reused gallery version {}", e.version.id),
        Outcome::Waited => format!(
            "waited for gallery version {} (being created by another caller) and reused it",
            e.version.id
        ),
        Outcome::Restored => format!(
            "restored gallery version {} (it was soft-deleted, with this very image)",
            e.version.id
        ),
    };
    // The version may have been made by another pipeline from a URL carrying a SAS token.
    let blob = crate::redact::opt_uri(p.blob_uri.as_deref()).unwrap_or_else(|| "the image".into());
    if p.uploaded {
        format!(
            "uploaded {blob} ({} bytes sent, {} zero bytes skipped) and {version}",
            p.bytes_sent, p.zero_bytes_skipped
        )
    } else if p.blob_name.is_some() {
        format!(
            "reused the complete blob {blob} already uploaded with this image (image_sha256 {}): \
             nothing uploaded; {version} in definition {} from it",
            p.image_sha256, e.definition
        )
    } else {
        format!(
            "definition {} already holds this image (image_sha256 {}): nothing uploaded; {version}",
            e.definition, p.image_sha256
        )
    }
}

/// Who holds the CID a `create_stemcell` records: the director, by the `director_uuid` of the
/// request's context (bosh-cli's create-env sends bosh-state.json's `director_id` there), as
/// `director:<uuid>`. `None` when the context names none (or something that is no label).
pub fn holder_of(context: &Map<String, Value>) -> Option<String> {
    let uuid = context.get("director_uuid")?.as_str()?.trim();
    if uuid.is_empty() {
        return None;
    }
    match crate::gallery::record::holder_label(uuid) {
        Ok(h) => Some(h),
        Err(e) => {
            tracing::warn!(
                "the request's director_uuid cannot name the holder of its stemcell: {e}"
            );
            None
        }
    }
}

/// Publish `args` and return the stemcell CID (`bosh-stemcell-<uuid>`).
/// `forced`: `--create-env` (true) / `--director` (false); otherwise cpi.json's
/// `stemcell_gallery_create_env`; otherwise the request's context (and `env`, the process
/// environment bosh-cli ran the CPI in) decides.
pub async fn create_stemcell(
    conn: &Context,
    args: CreateArgs,
    context: &Map<String, Value>,
    forced: Option<bool>,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Value, CpiError> {
    // A past end of life, or a block with none, is refused before anything is uploaded.
    conn.settings
        .safeguards
        .check(time::OffsetDateTime::now_utc())
        .map_err(|m| {
            CpiError::new(
                super::protocol::ErrorType::CloudError,
                format!("create_stemcell: stemcell_gallery_end_of_life / stemcell_gallery_block_deletion_before_end_of_life: {m}"),
                false,
            )
        })?;
    let configured = forced.or(conn.settings.create_env);
    let decision = mode::detect(configured, context, env);
    tracing::info!(
        mode = decision.mode.as_str(),
        "publishing stemcell {} {} in {} mode: {}",
        args.name,
        args.version,
        decision.mode.as_str(),
        decision.signal
    );
    let opts = PublishOptions {
        mode: decision.mode,
        create_env_suffix: conn.settings.create_env_definition_suffix().to_string(),
        reference: RecordReference::Cid,
        holder: holder_of(context),
        replica_count: conn.settings.replicas,
        adopt_unverified: conn.settings.adopt_unverified,
        safeguards: conn.settings.safeguards,
        // stdout carries the CPI response: progress only as log lines.
        progress: Progress::Log {
            every: std::time::Duration::from_secs(30),
        },
        ..PublishOptions::default()
    };
    let source = Source::Image {
        path: args.image_path.clone(),
        name: args.name.clone(),
        version: args.version.clone(),
        cloud_properties: args.cloud_properties,
    };
    let published = publish(conn, source, &opts).await.map_err(|e| {
        cloud_error(
            &format!(
                "create_stemcell: cannot publish {} {} from {}",
                args.name,
                args.version,
                args.image_path.display()
            ),
            &e,
        )
    })?;
    let v = &published.ensured.version;
    tracing::info!("{}", describe(&published));
    if let Some(a) = &published.ensured.adopted {
        tracing::info!("{}", a.describe(&v.id));
    }
    tracing::info!("stemcell CID {} recorded on {}", published.cid, v.id);
    Ok(Value::String(published.cid))
}
