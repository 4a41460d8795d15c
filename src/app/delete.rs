//! The delete use case, one for the CLI's `delete` and the CPI's `delete_stemcell`: remove a
//! reference (a stemcell CID, or references named on a version); delete the version only when no
//! reference remains and nothing uses it; then its source blob unless another version is made
//! from it, and a removed CID's own blob `<cid>.vhd`. A blob goes only inside the configured
//! storage account. The fronts render what it returns.

use anyhow::Context as _;

use crate::app::Context;
use crate::config::resource::blob_in_account;
use crate::gallery::lifecycle::Deleted as DeletedHow;
use crate::gallery::service::{Found, GalleryService, Removal};
use crate::gallery::{tags, ImageVersion};

/// What to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// By stemcell CID, as the director's `delete_stemcell`: the version recording the CID (on
    /// its tags, or only in its reference record) is found, and the CID removed from it.
    Cid(String),
    /// A named version: remove each of `references` (none: delete the version only when it has
    /// no reference at all).
    Version {
        definition: String,
        key: String,
        /// The mode the version was named in (`director`, `create-env`), as shown.
        mode: String,
        references: Vec<String>,
    },
}

/// What a delete did.
#[derive(Debug)]
pub enum Outcome {
    /// No version of the gallery records the CID (a `Request::Cid` only): nothing was done.
    NoSuchCid,
    Done(Box<Deletion>),
}

/// A delete that found its version (or its record).
#[derive(Debug)]
pub struct Deletion {
    pub id: String,
    pub definition: String,
    pub key: String,
    /// `director`, `create-env`, or `unknown` (a CID held only in a record, or no mode tag).
    pub mode: String,
    /// The CID was found only in the version's reference record, not on its tags.
    pub in_record_only: bool,
    /// The last removal pass that found the version (see [`remove_all`]).
    pub removal: Removal,
    /// The version as that pass read it.
    pub observed: Option<ImageVersion>,
    /// The references removed, and those the version did not record (removed nothing).
    pub removed: Vec<String>,
    pub not_recorded: Vec<String>,
    /// The references this tool had already removed (its record says so): a re-run of a
    /// removal that was done is done, not an error.
    pub already_removed: Vec<String>,
    /// Whether the deleted version is restorable (soft delete), when it was deleted.
    pub deleted_how: Option<DeletedHow>,
    /// The deleted version's source blob.
    pub source_blob: Option<BlobOutcome>,
    /// The removed CIDs' own blobs, in order.
    pub cid_blobs: Vec<BlobOutcome>,
}

/// Delete as `request` says; see the module documentation. A failure after the version went
/// (its source blob) says the version was deleted.
pub async fn delete(ctx: &Context, request: Request) -> anyhow::Result<Outcome> {
    let by_cid = matches!(request, Request::Cid(_));
    let (definition, key, mode, references, in_record_only) = match request {
        Request::Cid(cid) => {
            let Some(found) = ctx
                .service
                .find_reference(&cid)
                .await
                .context("cannot search the gallery")?
            else {
                return Ok(Outcome::NoSuchCid);
            };
            let (definition, key, mode, in_record) = match found {
                Found::Version(v) => (
                    v.definition,
                    v.version,
                    v.tags
                        .get(tags::MODE)
                        .cloned()
                        .unwrap_or_else(|| "unknown".into()),
                    false,
                ),
                Found::Record { definition, key } => (definition, key, "unknown".into(), true),
            };
            let id = ctx.service.gallery().version_id(&definition, &key);
            if in_record {
                tracing::info!(
                    cid,
                    version = %id,
                    "stemcell {cid} is held in the reference record of gallery version {id} (not on its tags)"
                );
            } else {
                tracing::info!(cid, version = %id, "stemcell {cid} is gallery version {id}");
            }
            (definition, key, mode, vec![cid], in_record)
        }
        Request::Version {
            definition,
            key,
            mode,
            references,
        } => (definition, key, mode, references, false),
    };
    let id = ctx.service.gallery().version_id(&definition, &key);
    let RemovedAll {
        removal,
        observed,
        removed,
        not_recorded,
        already_removed,
    } = remove_all(&ctx.service, &definition, &key, &references).await?;
    let mut deletion = Deletion {
        id: id.clone(),
        definition,
        key,
        mode,
        in_record_only,
        removal,
        observed,
        removed,
        not_recorded,
        already_removed,
        deleted_how: None,
        source_blob: None,
        cid_blobs: Vec::new(),
    };
    if deletion.removal == Removal::Deleted {
        // A gallery with soft delete on keeps it restorable (REFERENCE.md "Today's Azure").
        deletion.deleted_how = Some(ctx.service.api().deleted_how().await);
    }
    if by_cid {
        // What happened to the version, in the director's debug log (before the blobs go).
        log_removal(&references[0], &deletion);
    }
    if deletion.removal == Removal::Deleted {
        if let Some(version) = &deletion.observed {
            // The rule of delete_stemcell: the blob goes when no other version is made from it.
            deletion.source_blob =
                Some(delete_source_blob(ctx, version).await.with_context(|| {
                    format!("deleted {id}, but could not delete its source blob")
                })?);
        }
    }
    // Last, as the Azure CPI does: a stemcell CID's own blob `<cid>.vhd` goes with the CID —
    // only a CID this call removed (a reference that was not recorded deletes nothing), or,
    // deleting by CID, one whose version went meanwhile (gone, as bosh asked).
    let mut gone = deletion.removed.clone();
    if by_cid && deletion.removal == Removal::NotFound && gone.is_empty() {
        gone = references;
    }
    for cid in &gone {
        if let Some(blob) = delete_cid_blob(ctx, cid).await {
            deletion.cid_blobs.push(blob);
        }
    }
    Ok(Outcome::Done(Box::new(deletion)))
}

/// The Azure CPI's last step of delete_stemcell: delete the CID's own blob `<cid>.vhd` in the
/// `stemcell` container (REFERENCE.md, "How the Azure CPI uses a compute gallery": "Then
/// deletes blob `<cid>.vhd`"; a Succeeded gallery version does not need its source blob). Only
/// for a CID of the shape `bosh-stemcell-<uuid>`, and never while a version of the gallery that
/// is not Succeeded (Creating, Updating, Failed, ...) names that blob as its source. Never fails
/// the caller: the reference is already removed; a failure is logged as a warning. `None` when
/// nothing was attempted (not a CID, or no storage account).
async fn delete_cid_blob(conn: &Context, cid: &str) -> Option<BlobOutcome> {
    use crate::names::{is_stemcell_cid, STEMCELL_CONTAINER};
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
        match storage.delete(STEMCELL_CONTAINER, &name).await {
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
async fn delete_source_blob(conn: &Context, deleted: &ImageVersion) -> anyhow::Result<BlobOutcome> {
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
    conn: &Context,
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
    if storage.delete(&container, &blob).await? {
        Ok(BlobOutcome::Deleted { uri })
    } else {
        Ok(BlobOutcome::AlreadyGone { uri })
    }
}

/// What removing the references did: the last pass that found the version, the version as
/// read, the references removed, and those the version did not record.
/// What [`remove_all`] did: the last pass that found the version, the version as it read it,
/// and the references removed, not recorded, and already removed before this call.
struct RemovedAll {
    removal: Removal,
    observed: Option<ImageVersion>,
    removed: Vec<String>,
    not_recorded: Vec<String>,
    already_removed: Vec<String>,
}

/// Remove each reference in turn (none: one pass that deletes a version without references).
/// The result is the last pass that found the version; a version that went with an earlier
/// reference leaves nothing for the later ones. A reference the version does not record is
/// reported, and removes and deletes nothing.
async fn remove_all(
    service: &GalleryService,
    definition: &str,
    key: &str,
    references: &[String],
) -> anyhow::Result<RemovedAll> {
    if references.is_empty() {
        let (r, v) = service
            .remove_reference_observed(definition, key, None)
            .await?;
        return Ok(RemovedAll {
            removal: r,
            observed: v,
            removed: Vec::new(),
            not_recorded: Vec::new(),
            already_removed: Vec::new(),
        });
    }
    let mut last: Option<(Removal, Option<ImageVersion>)> = None;
    let mut removed = Vec::new();
    let mut not_recorded = Vec::new();
    let mut already_removed = Vec::new();
    for r in references {
        let (removal, v) = service
            .remove_reference_observed(definition, key, Some(r))
            .await?;
        match &removal {
            Removal::NotFound => {
                // Gone with an earlier reference (or never there): keep what that pass said.
                if last.is_none() {
                    last = Some((removal, v));
                }
                break;
            }
            Removal::NotRecorded {
                already_removed: true,
                ..
            } => {
                already_removed.push(r.clone());
                if removed.is_empty() {
                    last = Some((removal, v));
                }
                continue;
            }
            Removal::NotRecorded { .. } => {
                not_recorded.push(r.clone());
                // What a pass that removed something said stands.
                if removed.is_empty() {
                    last = Some((removal, v));
                }
                continue;
            }
            _ => {}
        }
        removed.push(r.clone());
        let done = removal == Removal::Deleted;
        last = Some((removal, v));
        if done {
            break;
        }
    }
    let (removal, v) = last.unwrap_or((Removal::NotFound, None));
    Ok(RemovedAll {
        removal,
        observed: v,
        removed,
        not_recorded,
        already_removed,
    })
}

/// What `delete_stemcell` did to the version, in the director's debug log.
fn log_removal(cid: &str, d: &Deletion) {
    let id = &d.id;
    match &d.removal {
        Removal::ReferenceRemoved { remaining } => tracing::info!(
            cid,
            "reference {cid} removed; version {} stays for its other references: {}",
            id,
            remaining.join(", ")
        ),
        Removal::KeptInUse { consumers } => {
            for c in consumers {
                tracing::info!(
                    cid,
                    consumer = %c.id,
                    "version {} kept: {} {} was created from it and still uses it (deleting it would make that {} impossible to recreate)",
                    id,
                    c.kind.name(),
                    c.id,
                    c.kind.name()
                );
            }
        }
        Removal::Deleted => {
            let how = d.deleted_how.unwrap_or(DeletedHow::Unknown);
            tracing::info!(
                cid,
                "version {} deleted{}: no reference remains and no VM, scale set or disk uses it",
                id,
                how.text()
            );
        }
        Removal::KeptBlocked { until } => tracing::info!(
            cid,
            "reference {cid} removed; version {} kept: Azure refuses its deletion {}",
            id,
            crate::gallery::lifecycle::until_text(*until)
        ),
        Removal::KeptLocked { locks } => tracing::info!(
            cid,
            "reference {cid} removed; version {} kept: a management lock this tool does not own applies to it: {locks}",
            id
        ),
        Removal::KeptFailedInSoftDeleteGallery => tracing::warn!(
            cid,
            "reference {cid} removed; version {} kept: it is Failed and the gallery has soft delete on, where Azure cannot delete it; {}",
            id,
            crate::gallery::error::FAILED_IN_SOFT_DELETE_REMEDY
        ),
        Removal::KeptUnproven { why } => tracing::warn!(
            cid,
            "reference {cid} removed; version {} kept because non-use cannot be proven: {why}",
            id
        ),
        Removal::NotFound => {
            tracing::info!(
                cid,
                "version {} disappeared meanwhile; nothing left to delete",
                id
            )
        }
        Removal::CarriedRemoved { remaining } => tracing::info!(
            cid,
            "version {} does not exist (a Failed version being replaced); {cid} removed from the references its record carries for the re-create (still carried: {})",
            id,
            remaining.join(", ")
        ),
        // Removed by another call meanwhile: gone, as bosh asked; its blob is that call's.
        Removal::NotRecorded { .. } => tracing::info!(
            cid,
            "version {} no longer records {cid} (removed meanwhile); nothing to do",
            id
        ),
    }
}
