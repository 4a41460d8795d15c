//! `migrate`: bring a director's pre-gallery stemcells into the gallery, uploading nothing
//! (`app::migrate`). A dry run by default.

use std::fmt::Write as _;

use clap::{Args, ValueEnum};
use serde_json::json;

use super::{GlobalArgs, Report};
use crate::app::migrate::{self, Applied, Entry, MigrateRequest, Plan, RecordFor, Verdict};
use crate::cleanup::evidence::{EvidenceFile, FileKind};
use crate::error::{Coded, Exit};

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Director stemcell lists: files holding the output of `bosh stemcells --json`, each as
    /// HOLDER=FILE with the director's UUID (`bosh env --json`), so every CID is recorded as
    /// held by `director:<uuid>`. Repeatable.
    #[arg(
        long = "director-stemcells",
        value_name = "[HOLDER=]FILE",
        required = true
    )]
    pub director_stemcells: Vec<String>,
    /// Make the versions and record the CIDs (default: only print the plan).
    #[arg(long)]
    pub apply: bool,
    /// Where the director's CPI looks for a CID: `front` (it runs stemcell-gallery's CPI
    /// front) or `azure-cpi` (the plain Azure CPI v53.1+: the CID goes into
    /// stemcell_references, at most about 5 CIDs a version).
    #[arg(long = "record-for", value_enum, default_value = "front")]
    pub record_for: RecordForArg,
    /// Stemcells read or migrated at once (1-32).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub parallel: u16,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RecordForArg {
    Front,
    AzureCpi,
}

pub async fn run(global: &GlobalArgs, args: MigrateArgs) -> anyhow::Result<Report> {
    let lists: Vec<EvidenceFile> = args
        .director_stemcells
        .iter()
        .map(|a| EvidenceFile::parse(FileKind::DirectorStemcells, a))
        .collect();
    let request = MigrateRequest {
        lists,
        apply: args.apply,
        record_for: match args.record_for {
            RecordForArg::Front => RecordFor::Front,
            RecordForArg::AzureCpi => RecordFor::AzureCpi,
        },
        parallel: usize::from(args.parallel),
    };
    // A list that cannot be read is a usage error, before anything is asked of Azure.
    let rows = migrate::read_lists(&request.lists)
        .await
        .map_err(|e| Coded::new(Exit::Usage, format!("{e:#}")))?;
    let conn = super::connect::connect(global)?;
    let plan = migrate::plan(&conn, rows, request.parallel).await?;
    let applied = if request.apply {
        Some(migrate::apply(&conn, &plan.entries, request.record_for, request.parallel).await?)
    } else {
        None
    };
    Ok(render(&request, &plan, applied.as_deref()))
}

/// The table (one line per CID), the summary, and the JSON document; exit 4 on a conflict,
/// 1 on a failure.
pub fn render(
    request: &MigrateRequest,
    plan: &Plan,
    applied: Option<&[Option<Applied>]>,
) -> Report {
    let entries = &plan.entries;
    let mut rows = vec![[
        "CID".to_string(),
        "HOLDER".into(),
        "STEMCELL".into(),
        "PLAN".into(),
        "RESULT".into(),
        "DETAIL".into(),
    ]];
    let mut docs = Vec::new();
    let mut count: std::collections::BTreeMap<&str, usize> = Default::default();
    for (i, e) in entries.iter().enumerate() {
        let done = applied.and_then(|a| a[i].as_ref());
        let detail = detail(e, done);
        let result =
            done.map(Applied::kind)
                .unwrap_or(if applied.is_some() { "-" } else { "planned" });
        *count
            .entry(done.map(Applied::kind).unwrap_or(e.verdict.kind()))
            .or_default() += 1;
        let version = e.version();
        let platform = e
            .stemcell
            .as_ref()
            .map(migrate::generation_and_architecture);
        rows.push([
            e.row.cid.clone(),
            e.row.holder.clone().unwrap_or_else(|| "-".into()),
            format!("{} {}", e.row.name, e.row.version),
            e.verdict.kind().to_string(),
            result.to_string(),
            detail.clone(),
        ]);
        docs.push(json!({
            "cid": e.row.cid, "holder": e.row.holder, "list": e.row.list.display().to_string(),
            "stemcell": e.row.name, "stemcell_version": e.row.version,
            "version": version, "blob": e.blob.as_deref().map(crate::redact::uri),
            "vhd_content": e.digest,
            "generation": platform.map(|p| p.0),
            "architecture": platform.map(|p| p.1),
            "plan": e.verdict.kind(),
            "skip": match &e.verdict { Verdict::Skip(s) => Some(s.kind()), _ => None },
            "result": done.map(Applied::kind), "detail": detail,
            "managed_images": e.managed_images,
        }));
    }
    let conflicts = count.get("conflict").copied().unwrap_or(0);
    let failed = count.get("failed").copied().unwrap_or(0);
    let mut human = if entries.is_empty() {
        "the lists name no stemcell: nothing to migrate\n".to_string()
    } else {
        super::list::table(&rows)
    };
    let summary: Vec<String> = count.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let _ = writeln!(
        human,
        "\n{}: {}. 0 bytes uploaded. {}",
        super::output::count(entries.len(), "stemcell"),
        summary.join(", "),
        if applied.is_some() {
            "Blobs are never deleted: the director's CPI deletes each with its stemcell."
        } else {
            "Dry run: nothing was changed; run with --apply to migrate."
        }
    );
    let images: Vec<&String> = entries.iter().flat_map(|e| &e.managed_images).collect();
    if !images.is_empty() {
        let names: Vec<&str> = images.iter().map(|s| s.as_str()).collect();
        let _ = writeln!(
            human,
            "{} the Azure CPI made from these blobs: {}. New VMs of a migrated CID use its gallery version; migrate deletes none of them (`az image delete` once no VM runs from one).",
            super::output::count(images.len(), "managed image"),
            names.join(", ")
        );
    }
    if let Some(why) = &plan.images_unread {
        let _ = writeln!(
            human,
            "The resource group's managed images were not listed ({why}); grant Microsoft.Compute/images/read to see which the CPI made from these blobs."
        );
    }
    let report = Report::new(
        json!({"applied": request.apply, "record_for": request.record_for.as_str(),
               "stemcells": docs, "bytes_uploaded": 0, "summary": count,
               "managed_images_unread": plan.images_unread}),
        human,
    );
    if conflicts > 0 {
        report.with_exit(Exit::Conflict)
    } else if failed > 0 {
        report.with_exit(Exit::Error)
    } else {
        report
    }
}

fn detail(e: &Entry, done: Option<&Applied>) -> String {
    let version = e.version().unwrap_or_default();
    match (done, &e.verdict) {
        (Some(Applied::Created { .. }), _) => format!("{version} made from its blob"),
        (Some(Applied::Recorded { .. }), _) => format!("recorded on {version}"),
        (Some(Applied::Conflict(m) | Applied::Failed(m)), _) => m.clone(),
        (None, Verdict::Create) => {
            let (generation, arch) = e
                .stemcell
                .as_ref()
                .map(migrate::generation_and_architecture)
                .unwrap_or_default();
            format!(
                "create {version} ({generation}, {arch}) from {}",
                e.blob.as_deref().map(crate::redact::uri).unwrap_or_default()
            )
        }
        (None, Verdict::Record { version_id: Some(_), .. }) => {
            format!("same content: record on {version}")
        }
        (None, Verdict::Record { with_cid, .. }) => format!(
            "same content as {}: record on {version} once made",
            with_cid.as_deref().unwrap_or("an earlier CID")
        ),
        (None, Verdict::Skip(s)) => s.describe(),
        (None, Verdict::Conflict(m)) => format!("{m}; nothing is changed for it. Remedy: once nothing uses that version, remove it (stemcell-gallery delete), or leave this stemcell to the director's CPI"),
    }
}
