//! `list`: definitions and versions with mode, digest, state and references.

use clap::Args;
use serde_json::json;

use super::connect::connect;
use super::target::{sourced_with_holders, version_json_with};
use super::{GlobalArgs, Report};
use crate::app::inspect::ListedDefinition;
use crate::gallery::tags;

#[derive(Debug, Args)]
pub struct ListArgs {
    /// List the soft-deleted versions instead (restorable with `restore` until the date shown).
    #[arg(long)]
    pub soft_deleted: bool,
}

pub async fn run(global: &GlobalArgs, args: ListArgs) -> anyhow::Result<Report> {
    let conn = connect(global)?;
    if args.soft_deleted {
        return soft_deleted(&conn).await;
    }
    let gallery = conn.settings.gallery.clone();
    let all = crate::app::inspect::list(&conn).await?;
    let mut defs = Vec::new();
    let mut warnings = Vec::new();
    let mut rows = vec![[
        "DEFINITION".to_string(),
        "VERSION".into(),
        "MODE".into(),
        "STATE".into(),
        "IMAGE_SHA256".into(),
        "REFERENCES".into(),
        "HOLDERS".into(),
    ]];
    for ListedDefinition {
        definition: d,
        versions,
    } in all
    {
        if versions.is_empty() {
            // A definition without versions is still the gallery's (issue 31: it was hidden).
            rows.push([
                d.name.clone(),
                "-".into(),
                "-".into(),
                "no versions".into(),
                "-".into(),
                "-".into(),
                "-".into(),
            ]);
        }
        for (v, record) in &versions {
            let room = tags::reference_room(&v.tags);
            if room < tags::REFERENCE_ROOM_WARNING {
                warnings.push(format!(
                    "warning: {} {} has room for only {room} more stemcell references (Azure allows 50 tags); remove references nothing holds with `references prune`",
                    d.name, v.version
                ));
            }
            let digest = v
                .tags
                .get(tags::IMAGE_SHA256)
                .cloned()
                .unwrap_or_else(|| "-".into());
            rows.push([
                d.name.clone(),
                v.version.clone(),
                v.tags
                    .get(tags::MODE)
                    .cloned()
                    .unwrap_or_else(|| "-".into()),
                v.provisioning_state.to_string(),
                digest.chars().take(12).collect(),
                reference_count(&v.tags),
                holders(&sourced_with_holders(v, record.as_ref())),
            ]);
        }
        defs.push(json!({
            "name": d.name,
            "id": d.id,
            "publisher": d.publisher, "offer": d.offer, "sku": d.sku,
            "architecture": d.architecture, "generation": d.generation,
            "versions": versions.iter().map(|(v, r)| version_json_with(&gallery, v, r.as_ref())).collect::<Vec<_>>(),
        }));
    }
    let mut human = if rows.len() == 1 {
        format!("gallery {gallery} holds no image definitions")
    } else {
        table(&rows)
    };
    for w in warnings {
        human.push_str(&w);
        human.push('\n');
    }
    Ok(Report::new(
        json!({"gallery": gallery, "definitions": defs}),
        human,
    ))
}

/// `list --soft-deleted`: every definition's soft-deleted versions, with until when each can be
/// restored and the content this tool recorded for it.
async fn soft_deleted(conn: &crate::app::context::Context) -> anyhow::Result<Report> {
    use crate::gallery::lifecycle::until_rfc3339;
    let gallery = conn.settings.gallery.clone();
    let listed = crate::app::inspect::list_soft_deleted(conn).await?;
    let mut rows = vec![[
        "DEFINITION".to_string(),
        "VERSION".into(),
        "SOFT_DELETED".into(),
        "RESTORABLE_UNTIL".into(),
        "IMAGE_SHA256".into(),
    ]];
    let mut items = Vec::new();
    for row in listed.rows {
        let s = &row.version;
        let digest = row.image_sha256;
        let deleted = until_rfc3339(s.soft_deleted_time);
        let until = until_rfc3339(row.restorable_until);
        rows.push([
            row.definition.clone(),
            s.version.clone(),
            deleted.clone().unwrap_or_else(|| "-".into()),
            until.clone().unwrap_or_else(|| "-".into()),
            digest
                .as_deref()
                .map(|d| d.chars().take(12).collect())
                .unwrap_or_else(|| "-".into()),
        ]);
        items.push(json!({
            "id": s.id,
            "gallery": gallery,
            "definition": row.definition,
            "version": s.version,
            "soft_deleted_time": deleted,
            "restorable_until": until,
            // A consumer that names it exactly may use it until then (SPEC26).
            "consumable_until": until_rfc3339(row.consumable_until),
            // What this tool recorded when it created it (null: made by another tool).
            "image_sha256": digest,
        }));
    }
    let on = listed.soft_delete_on;
    let human = if rows.len() == 1 {
        format!(
            "gallery {gallery} holds no soft-deleted versions (soft delete is {})\n",
            if on { "on" } else { "off" }
        )
    } else {
        table(&rows)
    };
    Ok(Report::new(
        json!({"gallery": gallery, "soft_delete": on, "soft_deleted": items}),
        human,
    ))
}

/// `0`, or `3 (1 azure-cpi, 2 stemcell-gallery)`: how many references, and who recorded them.
fn reference_count(t: &std::collections::BTreeMap<String, String>) -> String {
    let sourced = tags::sourced_references(t);
    if sourced.is_empty() {
        return "0".into();
    }
    let cpi = sourced
        .iter()
        .filter(|(_, s)| s.recorded_by() == "azure-cpi")
        .count();
    format!(
        "{} ({cpi} azure-cpi, {} stemcell-gallery)",
        sourced.len(),
        sourced.len() - cpi
    )
}

/// Who holds the references, each once with how many it holds (`director:1b4f0b7e (2), ci`),
/// UUIDs cut to their first group (the JSON has them whole); `-` when no holder is known.
fn holders(sourced: &[(String, &'static str, &'static str, Option<String>)]) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for h in sourced.iter().filter_map(|(_, _, _, h)| h.as_ref()) {
        let short = match h.strip_prefix("director:") {
            Some(uuid) => format!("director:{}", uuid.split('-').next().unwrap_or(uuid)),
            None => h.clone(),
        };
        match counts.iter_mut().find(|(k, _)| *k == short) {
            Some((_, n)) => *n += 1,
            None => counts.push((short, 1)),
        }
    }
    if counts.is_empty() {
        return "-".into();
    }
    counts
        .iter()
        .map(|(h, n)| {
            if *n > 1 {
                format!("{h} ({n})")
            } else {
                h.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Left-aligned columns separated by two spaces.
pub fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<w$}", w = widths[i]))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}
