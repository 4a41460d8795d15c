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
