//! `list`: definitions and versions with mode, digest, state and references.

use clap::Args;
use serde_json::json;

use super::connect::connect;
use super::target::version_json;
use super::{GlobalArgs, Report};
use crate::gallery::tags;

#[derive(Debug, Args)]
pub struct ListArgs {}

pub async fn run(global: &GlobalArgs, _args: ListArgs) -> anyhow::Result<Report> {
    let conn = connect(global)?;
    let gallery = conn.settings.gallery.clone();
    let all = conn.service.list().await?;
    let mut defs = Vec::new();
    let mut warnings = Vec::new();
    let mut rows = vec![[
        "DEFINITION".to_string(),
        "VERSION".into(),
        "MODE".into(),
        "STATE".into(),
        "IMAGE_SHA256".into(),
        "REFERENCES".into(),
    ]];
    for (d, mut versions) in all {
        versions.sort_by(|a, b| {
            let k = |v: &str| semver::Version::parse(v).ok();
            k(&a.version).cmp(&k(&b.version))
        });
        for v in &versions {
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
            ]);
        }
        defs.push(json!({
            "name": d.name,
            "id": d.id,
            "publisher": d.publisher, "offer": d.offer, "sku": d.sku,
            "architecture": d.architecture, "generation": d.generation,
            "versions": versions.iter().map(|v| version_json(&gallery, v)).collect::<Vec<_>>(),
        }));
    }
    let mut human = if rows.len() == 1 {
        format!("gallery {gallery} holds no image versions")
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
