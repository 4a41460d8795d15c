//! Ensure a version from a blob already in storage (`ensure --blob-uri`): the image digest the
//! blob's metadata records (as the Azure CPI and `seed` record it).

use crate::app::Connected;
use crate::azure::blob::META_IMAGE_SHA256;
use crate::error::{Coded, Exit};

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
pub async fn digest_from_blob(conn: &Connected, uri: &url::Url) -> anyhow::Result<String> {
    let storage =
        conn.require_storage("reading the blob's image_sha256 metadata (or pass --sha256)")?;
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
    let client = storage.container(&container).blob_client(&blob);
    let props = crate::azure::blob::blob_properties(&client).await?;
    let (_, metadata, _) = props.ok_or_else(|| {
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
pub async fn check_source(conn: &Connected, uri: &url::Url) -> anyhow::Result<()> {
    use crate::azure::blob::{check_vhd_source, VhdSource};
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
    let client = storage.container(&container).blob_client(&blob);
    match check_vhd_source(&client).await? {
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
