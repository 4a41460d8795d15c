//! `delete`: remove a reference; delete the version only when no reference remains and no VM,
//! scale set or disk uses it, and then its source blob unless another version is made from it
//! (the rules of `delete_stemcell`).

use clap::Args;
use serde_json::json;

use super::connect::connect;
use super::target::StemcellSelector;
use super::{GlobalArgs, Report};
use crate::app::delete::{BlobOutcome, Deletion, Outcome, Request};
use crate::error::{Coded, Exit};
use crate::gallery::service::Removal;

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

pub async fn run(global: &GlobalArgs, args: DeleteArgs) -> anyhow::Result<Report> {
    for r in args.reference.iter().chain(args.cid.iter()) {
        crate::gallery::tags::validate_reference(r)
            .map_err(|e| Coded::new(Exit::Usage, e.to_string()))?;
    }
    let ctx = connect(global)?;
    let request = match &args.cid {
        Some(cid) => Request::Cid(cid.clone()),
        None => {
            let sel = args.stemcell.resolve_named(
                ctx.settings.create_env_definition_suffix(),
                "name the version: --name N --version V, or --cid CID",
            )?;
            Request::Version {
                key: sel.key.to_string(),
                definition: sel.definition,
                mode: sel.mode.as_str().to_string(),
                references: args.reference.clone(),
            }
        }
    };
    let d = match crate::app::delete::delete(&ctx, request).await? {
        Outcome::Done(d) => d,
        Outcome::NoSuchCid => {
            return Err(Coded::new(
                Exit::NotFound,
                format!(
                    "no version of gallery {} records stemcell CID {} (look for it with `list --output json`, or it was already removed)",
                    ctx.settings.gallery,
                    args.cid.as_deref().unwrap_or_default()
                ),
            )
            .into())
        }
    };
    render(&ctx.settings.gallery, &d)
}

/// The report of a delete: a sentence (and the blobs' fate) for people, the JSON document.
fn render(gallery: &str, d: &Deletion) -> anyhow::Result<Report> {
    let (id, key, removed, not_recorded) = (&d.id, &d.key, &d.removed, &d.not_recorded);
    if removed.is_empty() && not_recorded.is_empty() && !d.already_removed.is_empty() {
        return Ok(already_removed(gallery, d));
    }
    if removed.is_empty() && !not_recorded.is_empty() {
        return Err(none_recorded(d));
    }
    let (result, human, json_extra) = removal_outcome(d)?;
    let mut doc = json!({"id": id, "gallery": gallery, "definition": d.definition, "version": key, "mode": d.mode, "result": result, "removed_references": removed, "not_recorded": not_recorded, "already_removed": d.already_removed});
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
    // A removed stemcell CID's own blob `<cid>.vhd` (the rule of delete_stemcell). With
    // several, `cid_blob` is the last CID's and `cid_blobs` lists each.
    let mut cid_blobs = Vec::new();
    for blob in &d.cid_blobs {
        let entry = json!({"uri": crate::redact::uri(blob.uri().unwrap_or_default()), "result": blob.result(), "detail": blob.describe()});
        doc["cid_blob"] = entry.clone();
        cid_blobs.push(entry);
        human = format!("{human}\n  the stemcell's own {}", blob.describe());
    }
    if removed.len() > 1 {
        doc["cid_blobs"] = json!(cid_blobs);
    }
    // People read short ids; the JSON keeps the full ones.
    Ok(Report::new(doc, super::output::shorten_ids(&human)))
}

/// The report of a re-run of a removal that was done (automation retries): done, exit 0.
fn already_removed(gallery: &str, d: &Deletion) -> Report {
    let (id, key, removed, not_recorded) = (&d.id, &d.key, &d.removed, &d.not_recorded);
    let removal = &d.removal;
    let remaining = match removal {
        Removal::NotRecorded { references, .. } => references.clone(),
        _ => Vec::new(),
    };
    let doc = json!({"id": id, "gallery": gallery, "definition": d.definition, "version": key, "mode": d.mode,
        "result": "already-removed", "removed_references": removed, "not_recorded": not_recorded,
        "already_removed": d.already_removed, "remaining_references": remaining});
    let human = format!(
        "{} already removed from gallery version {id} (its reference record says so); nothing more to do{}",
        d.already_removed.join(", "),
        if remaining.is_empty() {
            String::new()
        } else {
            format!("; still referenced by {}", remaining.join(", "))
        }
    );
    Report::new(doc, super::output::shorten_ids(&human))
}

/// The error when nothing this call named is recorded: nothing removed, nothing deleted.
fn none_recorded(d: &Deletion) -> anyhow::Error {
    let (id, not_recorded) = (&d.id, &d.not_recorded);
    let removal = &d.removal;
    let held = match removal {
        Removal::NotRecorded { references, .. } if !references.is_empty() => {
            format!("it records {}", references.join(", "))
        }
        _ => "it records no reference".to_string(),
    };
    Coded::new(
        Exit::NotFound,
        format!(
            "{} not recorded on gallery version {} ({held}); nothing was removed or deleted",
            not_recorded.join(", "),
            super::output::short_id(id)
        ),
    )
    .into()
}

/// What the removal did: the JSON `result`, the sentence for people, and the JSON fields that
/// say more (an error when the version does not exist).
fn removal_outcome(d: &Deletion) -> anyhow::Result<(&'static str, String, serde_json::Value)> {
    let (id, removed) = (&d.id, &d.removed);
    let removal = &d.removal;
    Ok(match (removal, &d.observed) {
        (Removal::Deleted, Some(_)) => {
            let blob = d.source_blob.as_ref().unwrap_or(&BlobOutcome::NoneRecorded);
            let how = d.deleted_how.unwrap_or(crate::gallery::lifecycle::Deleted::Unknown);
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
        (Removal::KeptLocked { locks }, _) => (
            "kept",
            format!(
                "kept {id}: no reference remains, but a management lock this tool does not own applies to it: {locks}; whoever placed it removes it if the version should go"
            ),
            json!({"kept_because": "locked", "locks": locks}),
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
                format!(
                    "gallery version {} does not exist",
                    super::output::short_id(id)
                ),
            )
            .into())
        }
    })
}
