//! `delete`: remove a reference; delete the version only when no reference remains and no VM,
//! scale set or disk uses it, and then its source blob unless another version is made from it
//! (the rules of `delete_stemcell`).

use clap::Args;
use serde_json::json;

use super::connect::connect;
use super::target::StemcellSelector;
use super::{GlobalArgs, Report};
use crate::app::delete::{delete_cid_blob, delete_source_blob};
use crate::error::{Coded, Exit};
use crate::gallery::service::{Found, Removal};

#[derive(Debug, Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    pub stemcell: StemcellSelector,
    /// A reference to remove (e.g. a stemcell CID); repeat it to remove several at once. Without
    /// it, the version is deleted only if it has no references at all.
    #[arg(long, value_name = "REF", action = clap::ArgAction::Append)]
    pub reference: Vec<String>,
    /// Delete by stemcell CID, as the director's delete_stemcell does: the version recording the
    /// CID is found through the tags (no --name/--version needed) and the CID is removed from it.
    #[arg(
        long,
        value_name = "CID",
        conflicts_with_all = ["name", "version", "reference", "create_env"]
    )]
    pub cid: Option<String>,
}

/// Where a delete acts: the definition, version key and mode.
struct Target {
    definition: String,
    key: String,
    mode: String,
}

pub async fn run(global: &GlobalArgs, args: DeleteArgs) -> anyhow::Result<Report> {
    for r in args.reference.iter().chain(args.cid.iter()) {
        crate::gallery::tags::validate_reference(r)
            .map_err(|e| Coded::new(Exit::Usage, e.to_string()))?;
    }
    let conn = connect(global)?;
    let (target, references) = match &args.cid {
        Some(cid) => {
            let Some(found) = conn.service.find_reference(cid).await? else {
                return Err(Coded::new(
                    Exit::NotFound,
                    format!(
                        "no version of gallery {} records stemcell CID {cid} (look for it with `list --output json`, or it was already removed)",
                        conn.settings.gallery
                    ),
                )
                .into());
            };
            let target = match found {
                Found::Version(v) => Target {
                    mode: v
                        .tags
                        .get(crate::gallery::tags::MODE)
                        .cloned()
                        .unwrap_or_else(|| "unknown".into()),
                    definition: v.definition,
                    key: v.version,
                },
                Found::Record { definition, key } => Target {
                    mode: "unknown".into(),
                    definition,
                    key,
                },
            };
            (target, vec![cid.clone()])
        }
        None => {
            let sel = args.stemcell.resolve_named(
                conn.settings.create_env_definition_suffix(),
                "name the version: --name N --version V, or --cid CID",
            )?;
            (
                Target {
                    key: sel.key.to_string(),
                    definition: sel.definition,
                    mode: sel.mode.as_str().to_string(),
                },
                args.reference.clone(),
            )
        }
    };
    let key = target.key.clone();
    let id = conn.service.gallery().version_id(&target.definition, &key);
    let (removal, observed, removed, not_recorded) =
        remove_all(&conn.service, &target.definition, &key, &references).await?;
    if removed.is_empty() && !not_recorded.is_empty() {
        // Nothing this call named is recorded: nothing removed, nothing deleted.
        let held = match &removal {
            Removal::NotRecorded { references, .. } if !references.is_empty() => {
                format!("it records {}", references.join(", "))
            }
            _ => "it records no reference".to_string(),
        };
        return Err(Coded::new(
            Exit::NotFound,
            format!(
                "{} not recorded on gallery version {id} ({held}); nothing was removed or deleted",
                not_recorded.join(", ")
            ),
        )
        .into());
    }
    let (result, human, json_extra) = match (&removal, &observed) {
        (Removal::Deleted, Some(version)) => {
            // The rule of delete_stemcell: the blob goes when no other version is made from it.
            let blob = delete_source_blob(&conn, version).await.map_err(|e| {
                e.context(format!(
                    "deleted {id}, but could not delete its source blob"
                ))
            })?;
            // A gallery with soft delete on keeps it restorable (REFERENCE.md "Today's Azure").
            let how = conn.service.api().deleted_how().await;
            (
                "deleted",
                format!(
                    "deleted {id}{}: no reference remained and nothing uses it\n  {}",
                    how.text(),
                    blob.describe()
                ),
                json!({
                    "soft_deleted": how.soft_deleted(),
                    "restorable_until": how.restorable_until(),
                    "blob": {"uri": crate::redact::opt_uri(blob.uri()), "result": blob.result(), "detail": blob.describe()},
                }),
            )
        }
        (Removal::Deleted, None) => (
            "deleted",
            format!("deleted {id}: no reference remained and nothing uses it"),
            json!({}),
        ),
        (Removal::ReferenceRemoved { remaining }, _) => (
            "kept",
            format!("kept {id}: still referenced by {}", remaining.join(", ")),
            json!({"remaining_references": remaining}),
        ),
        (Removal::KeptInUse { consumers }, _) => (
            "kept",
            format!(
                "kept {id}: no reference remains, but it is still in use by {}",
                consumers
                    .iter()
                    .map(|c| format!("{:?} {}", c.kind, c.id))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            json!({"in_use_by": consumers.iter().map(|c| json!({"kind": format!("{:?}", c.kind), "id": c.id})).collect::<Vec<_>>()}),
        ),
        (Removal::KeptBlocked { until }, _) => (
            "kept",
            format!(
                "kept {id}: no reference remains, but Azure refuses its deletion {} (blockDeletionBeforeEndOfLife); delete it after that date",
                crate::gallery::lifecycle::until_text(*until)
            ),
            json!({"kept_because": "blocked_before_end_of_life", "blocked_until": crate::gallery::lifecycle::until_rfc3339(*until)}),
        ),
        (Removal::KeptFailedInSoftDeleteGallery, _) => (
            "kept",
            format!(
                "kept {id}: no reference remains, but it is Failed and the gallery has soft delete on, where Azure cannot delete it; {}",
                crate::gallery::error::FAILED_IN_SOFT_DELETE_REMEDY
            ),
            json!({"kept_because": "failed_in_soft_delete_gallery"}),
        ),
        (Removal::KeptUnproven { why }, _) => (
            "kept",
            format!("kept {id}: no reference remains, but {why}"),
            json!({"kept_because": why}),
        ),
        (Removal::CarriedRemoved { remaining }, _) => (
            "removed-from-record",
            format!(
                "{id} does not exist (a Failed version being replaced?): removed {} from the references its record carries for the re-create{}",
                removed.join(", "),
                if remaining.is_empty() {
                    String::new()
                } else {
                    format!("; still carried: {}", remaining.join(", "))
                }
            ),
            json!({"remaining_references": remaining}),
        ),
        (Removal::NotRecorded { references, .. }, _) => (
            "kept",
            format!("kept {id}: still referenced by {}", references.join(", ")),
            json!({"remaining_references": references}),
        ),
        (Removal::NotFound, _) => {
            return Err(Coded::new(
                Exit::NotFound,
                format!("gallery version {id} does not exist"),
            )
            .into())
        }
    };
    let mut doc = json!({"id": id, "gallery": conn.settings.gallery, "definition": target.definition, "version": key, "mode": target.mode, "result": result, "removed_references": removed, "not_recorded": not_recorded});
    let mut human = human;
    if !not_recorded.is_empty() {
        human = format!(
            "{human}\n  not recorded on it, so not removed: {}",
            not_recorded.join(", ")
        );
    }
    if let (Some(o), Some(extra)) = (doc.as_object_mut(), json_extra.as_object()) {
        o.extend(extra.clone());
    }
    // The rule of delete_stemcell: a stemcell CID's own blob `<cid>.vhd` goes with the CID —
    // only a CID this call removed (a reference that was not recorded deletes nothing).
    // With several, `cid_blob` is the last CID's and `cid_blobs` lists each.
    let mut cid_blobs = Vec::new();
    for cid in &removed {
        if let Some(blob) = delete_cid_blob(&conn, cid).await {
            let entry = json!({"uri": crate::redact::uri(blob.uri().unwrap_or_default()), "result": blob.result(), "detail": blob.describe()});
            doc["cid_blob"] = entry.clone();
            cid_blobs.push(entry);
            human = format!("{human}\n  the stemcell's own {}", blob.describe());
        }
    }
    if removed.len() > 1 {
        doc["cid_blobs"] = json!(cid_blobs);
    }
    // People read short ids; the JSON keeps the full ones.
    Ok(Report::new(doc, super::output::shorten_ids(&human)))
}

/// What removing the references did: the last pass that found the version, the version as
/// read, the references removed, and those the version did not record.
type RemovedAll = (
    Removal,
    Option<crate::gallery::ImageVersion>,
    Vec<String>,
    Vec<String>,
);

/// Remove each reference in turn (none: one pass that deletes a version without references).
/// The result is the last pass that found the version; a version that went with an earlier
/// reference leaves nothing for the later ones. A reference the version does not record is
/// reported, and removes and deletes nothing.
async fn remove_all(
    service: &crate::gallery::service::GalleryService,
    definition: &str,
    key: &str,
    references: &[String],
) -> anyhow::Result<RemovedAll> {
    if references.is_empty() {
        let (r, v) = service
            .remove_reference_observed(definition, key, None)
            .await?;
        return Ok((r, v, Vec::new(), Vec::new()));
    }
    let mut last: Option<(Removal, Option<crate::gallery::ImageVersion>)> = None;
    let mut removed = Vec::new();
    let mut not_recorded = Vec::new();
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
    Ok((removal, v, removed, not_recorded))
}
