//! `restore`: bring back a soft-deleted gallery version (REFERENCE.md "Today's Azure"); exit 3
//! when nothing by that name is restorable, naming what is.

use clap::Args;
use serde_json::json;

use super::connect::connect;
use super::target::{version_json_with, StemcellSelector};
use super::{GlobalArgs, Report};
use crate::app::inspect::Restored;
use crate::error::{Coded, Exit};
use crate::gallery::lifecycle::until_rfc3339;

#[derive(Debug, Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub stemcell: StemcellSelector,
}

pub async fn run(global: &GlobalArgs, args: RestoreArgs) -> anyhow::Result<Report> {
    let conn = connect(global)?;
    let sel = args.stemcell.resolve_named(
        conn.settings.create_env_definition_suffix(),
        "name the version to restore: --name N --version V (and --create-env for a create-env version)",
    )?;
    let gallery = conn.settings.gallery.clone();
    let key = sel.key.to_string();
    let (v, record, restored, users) = match crate::app::inspect::restore(
        &conn,
        &sel.definition,
        &key,
    )
    .await?
    {
        Restored::Version {
            version,
            record,
            restored,
            users,
        } => (*version, record.map(|r| *r), restored, users),
        Restored::NothingRestorable { restorable } => {
            let what = if restorable.is_empty() {
                format!(
                    "definition {} holds no soft-deleted versions",
                    sel.definition
                )
            } else {
                let list: Vec<String> = restorable
                    .iter()
                    .map(|(s, until)| match until_rfc3339(*until) {
                        Some(at) => format!("{} (until {at})", s.version),
                        None => s.version.clone(),
                    })
                    .collect();
                format!("restorable in {}: {}", sel.definition, list.join(", "))
            };
            return Err(Coded::new(
                    Exit::NotFound,
                    format!(
                        "gallery version {gallery}/{}/{key} is neither soft-deleted nor present, so there is nothing to restore ({what}). `stemcell-gallery list --soft-deleted` lists every restorable version",
                        sel.definition
                    ),
                )
                .into());
        }
    };
    let (outcome, said) = if restored {
        ("restored", "restored")
    } else {
        (
            "present",
            "nothing to restore, this version is not soft-deleted:",
        )
    };
    let mut doc = version_json_with(&gallery, &v, record.as_ref());
    doc["outcome"] = json!(outcome);
    doc["used_while_soft_deleted_by"] = json!(users
        .as_ref()
        .map(|u| u.iter().map(|c| c.id.clone()).collect::<Vec<_>>()));
    let users_text = match &users {
        Some(u) if u.is_empty() => "\n  used while soft-deleted by: none".to_string(),
        Some(u) => format!(
            "\n  used while soft-deleted by: {}",
            u.iter()
                .map(|c| c.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => String::new(),
    };
    let human = format!(
        "{said} {gallery}/{}/{} ({})\n  id: {}\n  image_sha256: {}\n  references: {}",
        v.definition,
        v.version,
        v.provisioning_state,
        v.id,
        v.tags
            .get(crate::gallery::tags::IMAGE_SHA256)
            .map(String::as_str)
            .unwrap_or("-"),
        references_text(&doc),
    ) + &users_text;
    Ok(Report::new(doc, human))
}

/// The references a restored version came back with, or "none".
fn references_text(doc: &serde_json::Value) -> String {
    let refs: Vec<&str> = doc["references"]
        .as_array()
        .map(|r| r.iter().filter_map(|x| x.as_str()).collect())
        .unwrap_or_default();
    if refs.is_empty() {
        "none".into()
    } else {
        refs.join(", ")
    }
}
