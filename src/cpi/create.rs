//! `create_stemcell`: publish a heavy stemcell's image to the gallery through `publish`, in the
//! mode the configuration or the request calls for, and return the CID recorded on the version.

use serde_json::{Map, Value};

use super::handler::{cloud_error, CreateArgs};
use super::mode;
use super::protocol::CpiError;
use crate::azure::blob::Progress;
use crate::cli::connect::Connected;
use crate::publish::{publish, PublishOptions, Source};

/// Publish `args` and return the stemcell CID (`bosh-stemcell-<uuid>`).
/// `forced`: `--create-env` (true) / `--director` (false); otherwise cpi.json's
/// `stemcell_gallery_create_env`; otherwise the request's context decides.
pub async fn create_stemcell(
    conn: &Connected,
    args: CreateArgs,
    context: &Map<String, Value>,
    forced: Option<bool>,
) -> Result<Value, CpiError> {
    let configured = forced.or(conn.settings.create_env);
    let decision = mode::detect(configured, context, &|k| std::env::var(k).ok());
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
        reference: None,
        replica_count: conn.settings.replicas,
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
    if published.uploaded {
        tracing::info!(
            "uploaded {} ({} bytes sent, {} zero bytes skipped) and {:?} gallery version {}",
            published.blob_uri.as_deref().unwrap_or("the image"),
            published.bytes_sent,
            published.zero_bytes_skipped,
            published.ensured.outcome,
            v.id
        );
    } else {
        tracing::info!(
            "definition {} already holds this image (image_sha256 {}): nothing uploaded; {:?} gallery version {}",
            published.ensured.definition,
            published.image_sha256,
            published.ensured.outcome,
            v.id
        );
    }
    tracing::info!("stemcell CID {} recorded on {}", published.cid, v.id);
    Ok(Value::String(published.cid))
}
