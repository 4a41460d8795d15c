//! Deleting a stemcell's blobs after its version went: the rules `delete_stemcell` (the CPI)
//! and `delete` (the CLI) share. A blob goes only when no other version is made from it, and
//! only inside the configured storage account.

use crate::app::Connected;
use crate::config::resource::blob_in_account;
use crate::gallery::{tags, ImageVersion};

/// The Azure CPI's last step of delete_stemcell: delete the CID's own blob `<cid>.vhd` in the
/// `stemcell` container (REFERENCE.md, "How the Azure CPI uses a compute gallery": "Then
/// deletes blob `<cid>.vhd`"; a Succeeded gallery version does not need its source blob). Only
/// for a CID of the shape `bosh-stemcell-<uuid>`, and never while a version of the gallery that
/// is not Succeeded (Creating, Updating, Failed, ...) names that blob as its source. Never fails
/// the caller: the reference is already removed; a failure is logged as a warning. `None` when
/// nothing was attempted (not a CID, or no storage account).
pub async fn delete_cid_blob(conn: &Connected, cid: &str) -> Option<BlobOutcome> {
    use crate::azure::blob::{is_stemcell_cid, STEMCELL_CONTAINER};
    if !is_stemcell_cid(cid) {
        return None;
    }
    let Some(storage) = conn.storage() else {
        tracing::warn!(
            cid,
            "no storage account configured: the blob {cid}.vhd (if any) was left in place"
        );
        return None;
    };
    let name = format!("{cid}.vhd");
    let uri = storage.blob_url(STEMCELL_CONTAINER, &name);
    let names_it = |u: &str| {
        blob_in_account(storage.endpoint(), u)
            .is_some_and(|(c, b)| c == STEMCELL_CONTAINER && b == name)
    };
    let listed = match conn.service.list().await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(cid, error = %e, "cannot list the gallery's versions to check that none is being made from {name}; the blob was kept");
            return None;
        }
    };
    let users: Vec<String> = listed
        .into_iter()
        .flat_map(|(_, versions)| versions)
        .filter(|v| !v.phase().serves_image())
        .filter(|v| {
            v.source_uri.as_deref().is_some_and(names_it)
                || v.tags.get(tags::SOURCE_BLOB).is_some_and(|u| names_it(u))
        })
        .map(|v| format!("{} ({})", v.id, v.provisioning_state.as_str()))
        .collect();
    let outcome = if !users.is_empty() {
        BlobOutcome::KeptForVersions {
            uri,
            versions: users,
        }
    } else {
        let client = storage.container(STEMCELL_CONTAINER).blob_client(&name);
        match crate::azure::blob::delete_blob_if_exists(&client).await {
            Ok(true) => BlobOutcome::Deleted { uri },
            Ok(false) => BlobOutcome::AlreadyGone { uri },
            Err(e) => {
                tracing::warn!(cid, error = %e, "could not delete the stemcell's blob {name}; it was left in place (delete it by hand once no version is being made from it)");
                return None;
            }
        }
    };
    tracing::info!(cid, "the stemcell's own {}", outcome.describe());
    Some(outcome)
}

/// What became of a deleted version's source blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobOutcome {
    /// The version recorded no `source_blob`.
    NoneRecorded,
    /// No storage account is configured: the blob was left in place.
    NoStorage {
        uri: String,
    },
    /// The blob is not in the configured storage account: left in place.
    OtherAccount {
        uri: String,
    },
    /// Other versions are made from it: kept.
    KeptForVersions {
        uri: String,
        versions: Vec<String>,
    },
    Deleted {
        uri: String,
    },
    AlreadyGone {
        uri: String,
    },
}

impl BlobOutcome {
    /// `deleted`, `kept`, `already-gone`, `left` (not ours to delete) or `none`.
    pub fn result(&self) -> &'static str {
        match self {
            BlobOutcome::NoneRecorded => "none",
            BlobOutcome::NoStorage { .. } | BlobOutcome::OtherAccount { .. } => "left",
            BlobOutcome::KeptForVersions { .. } => "kept",
            BlobOutcome::Deleted { .. } => "deleted",
            BlobOutcome::AlreadyGone { .. } => "already-gone",
        }
    }

    pub fn uri(&self) -> Option<&str> {
        match self {
            BlobOutcome::NoneRecorded => None,
            BlobOutcome::NoStorage { uri }
            | BlobOutcome::OtherAccount { uri }
            | BlobOutcome::KeptForVersions { uri, .. }
            | BlobOutcome::Deleted { uri }
            | BlobOutcome::AlreadyGone { uri } => Some(uri),
        }
    }

    /// One sentence for logs and human output (the blob's URI with any query redacted).
    pub fn describe(&self) -> String {
        let shown = self.uri().map(crate::redact::uri).unwrap_or_default();
        match self {
            BlobOutcome::NoneRecorded => {
                "the version records no source_blob; no blob deleted".into()
            }
            BlobOutcome::NoStorage { .. } => {
                format!("no storage account configured; the blob {shown} was left in place")
            }
            BlobOutcome::OtherAccount { .. } => {
                format!("the blob {shown} is not in the configured storage account; left in place")
            }
            BlobOutcome::KeptForVersions { versions, .. } => format!(
                "blob {shown} kept: versions {} are made from it",
                versions.join(", ")
            ),
            BlobOutcome::Deleted { .. } => format!("blob {shown} deleted"),
            BlobOutcome::AlreadyGone { .. } => format!("blob {shown} was already gone"),
        }
    }
}

/// Delete the deleted version's blob (its `source_blob` tag) unless another version is made from
/// it: the rule of `delete_stemcell`, shared with the CLI's `delete`.
pub async fn delete_source_blob(
    conn: &Connected,
    deleted: &ImageVersion,
) -> anyhow::Result<BlobOutcome> {
    let outcome = source_blob_outcome(conn, deleted).await?;
    match &outcome {
        BlobOutcome::NoStorage { .. } | BlobOutcome::OtherAccount { .. } => {
            tracing::warn!(version = %deleted.id, "{}", outcome.describe())
        }
        _ => tracing::info!(version = %deleted.id, "{}", outcome.describe()),
    }
    Ok(outcome)
}

async fn source_blob_outcome(
    conn: &Connected,
    deleted: &ImageVersion,
) -> anyhow::Result<BlobOutcome> {
    let Some(uri) = deleted.tags.get(tags::SOURCE_BLOB).cloned() else {
        return Ok(BlobOutcome::NoneRecorded);
    };
    let Some(storage) = conn.storage() else {
        return Ok(BlobOutcome::NoStorage { uri });
    };
    let Some((container, blob)) = blob_in_account(storage.endpoint(), &uri) else {
        return Ok(BlobOutcome::OtherAccount { uri });
    };
    let users: Vec<String> = conn
        .service
        .list()
        .await?
        .into_iter()
        .flat_map(|(_, versions)| versions)
        .filter(|v| v.id != deleted.id)
        .filter(|v| {
            v.tags.get(tags::SOURCE_BLOB).map(String::as_str) == Some(uri.as_str())
                || v.source_uri.as_deref() == Some(uri.as_str())
        })
        .map(|v| v.id)
        .collect();
    if !users.is_empty() {
        return Ok(BlobOutcome::KeptForVersions {
            uri,
            versions: users,
        });
    }
    let client = storage.container(&container).blob_client(&blob);
    if crate::azure::blob::delete_blob_if_exists(&client).await? {
        Ok(BlobOutcome::Deleted { uri })
    } else {
        Ok(BlobOutcome::AlreadyGone { uri })
    }
}
