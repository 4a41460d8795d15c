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
use crate::gallery::service::Removal;

#[derive(Debug, Args)]
pub struct DeleteArgs {
    #[command(flatten)]
    pub stemcell: StemcellSelector,
    /// The reference to remove (e.g. a stemcell CID). Without it, the version is deleted only if
    /// it has no references at all.
    #[arg(long, value_name = "REF")]
    pub reference: Option<String>,
}

pub async fn run(global: &GlobalArgs, args: DeleteArgs) -> anyhow::Result<Report> {
    if let Some(r) = &args.reference {
        crate::gallery::tags::validate_reference(r)
            .map_err(|e| Coded::new(Exit::Usage, e.to_string()))?;
    }
    let conn = connect(global)?;
    let sel = args
        .stemcell
        .resolve(None, conn.settings.create_env_definition_suffix())?;
    let key = sel.key.to_string();
    let id = conn.service.gallery().version_id(&sel.definition, &key);
    let (removal, observed) = conn
        .service
        .remove_reference_observed(&sel.definition, &key, args.reference.as_deref())
        .await?;
    let (result, human, json_extra) = match (&removal, &observed) {
        (Removal::Deleted, Some(version)) => {
            // The rule of delete_stemcell: the blob goes when no other version is made from it.
            let blob = delete_source_blob(&conn, version).await.map_err(|e| {
                e.context(format!(
                    "deleted {id}, but could not delete its source blob"
                ))
            })?;
            (
                "deleted",
                format!(
                    "deleted {id}: no reference remained and nothing uses it\n  {}",
                    blob.describe()
                ),
                json!({"blob": {"uri": crate::redact::opt_uri(blob.uri()), "result": blob.result(), "detail": blob.describe()}}),
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
        (Removal::KeptUnproven { why }, _) => (
            "kept",
            format!("kept {id}: no reference remains, but {why}"),
            json!({"kept_because": why}),
        ),
        (Removal::NotFound, _) => {
            return Err(Coded::new(
                Exit::NotFound,
                format!("gallery version {id} does not exist"),
            )
            .into())
        }
    };
    let mut doc = json!({"id": id, "gallery": conn.settings.gallery, "definition": sel.definition, "version": key, "mode": sel.mode.as_str(), "result": result});
    if let (Some(o), Some(extra)) = (doc.as_object_mut(), json_extra.as_object()) {
        o.extend(extra.clone());
    }
    // The rule of delete_stemcell: a stemcell CID's own blob `<cid>.vhd` goes with the CID.
    let mut human = human;
    if let Some(cid) = &args.reference {
        if let Some(blob) = delete_cid_blob(&conn, cid).await {
            doc["cid_blob"] = json!({"uri": crate::redact::uri(blob.uri().unwrap_or_default()), "result": blob.result(), "detail": blob.describe()});
            human = format!("{human}\n  the stemcell's own {}", blob.describe());
        }
    }
    Ok(Report::new(doc, human))
}
