//! `references prune`: plan (default) or `--apply` the removal of stemcell CIDs recorded on the
//! gallery's versions that no director list and no create-env state holds any more. Versions are
//! never deleted here; `cleanup` decides that afterwards, with its own evidence and policy.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::json;

use super::{GlobalArgs, Report};
use crate::app::references::{PruneOutcome, PruneRequest, Pruned};
use crate::cleanup::evidence::{EvidenceFile, EvidenceFiles, FileKind};
use crate::cleanup::references::SavedPrune;
use crate::error::Exit;

#[derive(Debug, Args)]
pub struct ReferencesArgs {
    #[command(subcommand)]
    pub command: ReferencesCommand,
}

#[derive(Debug, Subcommand)]
pub enum ReferencesCommand {
    /// Plan (default) or --apply the removal of stemcell CIDs no director list or create-env
    /// state holds any more (dry run first, like cleanup; versions are never deleted here).
    Prune(PruneArgs),
    /// Hand a director's stemcell CIDs back to the plain Azure CPI before taking the front out
    /// of that director: each moves from this tool's overflow tags into `stemcell_references`,
    /// where the CPI's create_vm finds it and its delete_stemcell removes it (dry run first).
    HandBack(HandBackArgs),
}

#[derive(Debug, Clone, Args)]
#[command(group = clap::ArgGroup::new("which").required(true).multiple(true).args(["holder", "cid"]))]
pub struct HandBackArgs {
    /// Every CID this holder holds: the director's UUID (`bosh env --json`), as its requests
    /// recorded it, or an operator's --holder label.
    #[arg(long, value_name = "HOLDER", value_parser = super::seed::parse_holder)]
    pub holder: Option<String>,
    /// This CID (repeatable), for CIDs recorded without a holder.
    #[arg(long, value_name = "CID", action = clap::ArgAction::Append)]
    pub cid: Vec<String>,
    /// Move them (default: only print the plan).
    #[arg(long)]
    pub apply: bool,
}

#[derive(Debug, Clone, Args)]
pub struct PruneArgs {
    /// Remove the references the plan marks `prune` (default: only print the plan).
    #[arg(long)]
    pub apply: bool,
    /// Director stemcell lists: files holding the output of `bosh stemcells --json`, one for
    /// every director sharing the gallery, each as HOLDER=FILE with the director's UUID
    /// (`bosh env --json`) so that its own references can be pruned (a director's references
    /// are kept unless its own list is given).
    #[arg(long, value_name = "[HOLDER=]FILE", num_args = 1.., action = clap::ArgAction::Append)]
    pub director_stemcells: Vec<String>,
    /// bosh create-env state files (bosh-state.json); every stemcell CID in them is held.
    #[arg(long, value_name = "FILE", num_args = 1.., action = clap::ArgAction::Append)]
    pub create_env_state: Vec<PathBuf>,
    /// With --apply, refuse director lists saved (file modification time) longer ago than this:
    /// a stemcell uploaded after the list was saved would lose its reference.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = parse_duration)]
    pub max_list_age: Duration,
    /// With --apply (required): the saved dry run (`references prune --output json > FILE`).
    /// The director lists must be saved at least a minute after it, and only references it saw
    /// on a version are removed: a stemcell uploaded after a list was saved keeps its reference.
    #[arg(long, value_name = "FILE")]
    pub plan: Option<PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e} (write a duration such as 15m, 1h or 90s)"))
}

pub async fn run(global: &GlobalArgs, args: ReferencesArgs) -> anyhow::Result<Report> {
    match args.command {
        ReferencesCommand::Prune(a) => prune(global, a).await,
        ReferencesCommand::HandBack(a) => hand_back(global, a).await,
    }
}

async fn hand_back(global: &GlobalArgs, args: HandBackArgs) -> anyhow::Result<Report> {
    use crate::app::references::{HandBackOutcome, HandBackRequest};
    for c in &args.cid {
        if !crate::gallery::tags::is_cid(c) {
            return Err(crate::error::Coded::new(
                Exit::Usage,
                format!("--cid {c:?} is not a stemcell CID (bosh-stemcell-<uuid>): only CIDs can be handed to the Azure CPI"),
            )
            .into());
        }
    }
    let conn = super::connect::connect(global)?;
    conn.blob_store("handing references back (their holders are in the reference records)")?;
    let request = HandBackRequest {
        holder: args.holder.clone(),
        cids: args.cid.clone(),
        apply: args.apply,
    };
    let entries = crate::app::references::hand_back(&conn, &request).await?;
    let mut rows = vec![[
        "DEFINITION".to_string(),
        "VERSION".into(),
        "CIDS".into(),
        "RESULT".into(),
        "DETAIL".into(),
    ]];
    let mut refused = 0;
    let mut docs = Vec::new();
    for e in &entries {
        let detail = match &e.outcome {
            HandBackOutcome::Planned => "fits in stemcell_references".to_string(),
            HandBackOutcome::HandedBack(_) => {
                "in stemcell_references now: the plain Azure CPI resolves and deletes them".into()
            }
            HandBackOutcome::NoRoom(why) | HandBackOutcome::Failed(why) => {
                refused += 1;
                why.clone()
            }
        };
        rows.push([
            e.definition.clone(),
            e.version.clone(),
            e.cids.join(", "),
            e.outcome.as_str().to_string(),
            detail.clone(),
        ]);
        docs.push(json!({
            "id": e.id, "definition": e.definition, "version": e.version,
            "cids": e.cids, "result": e.outcome.as_str(), "detail": detail,
        }));
    }
    let cids: usize = entries.iter().map(|e| e.cids.len()).sum();
    let mut human = if entries.is_empty() {
        "no version holds such a CID on stemcell-gallery's side: nothing to hand back\n".to_string()
    } else {
        super::list::table(&rows)
    };
    let _ = writeln!(
        human,
        "\n{} on {}, {} refused. {}",
        super::output::count(cids, "CID"),
        super::output::count(entries.len(), "version"),
        super::output::count(refused, "version"),
        if args.apply {
            "Take the front out of the director only once no version is refused."
        } else {
            "Dry run: nothing was changed; run with --apply to move them."
        }
    );
    let report = Report::new(
        json!({"applied": args.apply, "holder": args.holder, "versions": docs,
               "summary": {"versions": entries.len(), "cids": cids, "refused": refused}}),
        human,
    );
    Ok(if refused > 0 && args.apply {
        report.with_exit(Exit::Error)
    } else {
        report
    })
}

async fn prune(global: &GlobalArgs, args: PruneArgs) -> anyhow::Result<Report> {
    let saved_plan = match &args.plan {
        None => None,
        Some(path) => Some((
            path.clone(),
            SavedPrune::read(path).map_err(|why| {
                crate::error::Coded::new(
                    Exit::Usage,
                    format!(
                        "--plan {}: {why}; save a plan with `references prune --output json > FILE` (no --apply)",
                        path.display()
                    ),
                )
            })?,
        )),
    };
    let request = PruneRequest {
        apply: args.apply,
        evidence: args
            .director_stemcells
            .iter()
            .map(|a| EvidenceFile::parse(FileKind::DirectorStemcells, a))
            .collect::<EvidenceFiles>()
            .with(FileKind::CreateEnvState, args.create_env_state),
        max_list_age: args.max_list_age,
        saved_plan,
    };
    // Refuse before connecting when nothing was given (a usage error needs no Azure).
    crate::app::references::check_request(&request)?;
    let ctx = super::connect::connect(global)?;
    let done = crate::app::references::prune(&ctx, &request).await?;
    Ok(render(&done))
}

/// The report: one row per reference (definition, version, reference, verdict, reason) and the
/// JSON document.
pub fn render(done: &Pruned) -> Report {
    let plan = &done.plan;
    let outcome_of = |id: &str| {
        done.applied
            .as_ref()
            .and_then(|a| a.iter().find(|(v, _)| v == id).map(|(_, o)| o))
    };
    let mut rows: Vec<[String; 5]> = Vec::new();
    let mut versions = Vec::new();
    for e in &plan.entries {
        let v = &e.observed;
        let outcome = outcome_of(&v.id);
        for (r, verdict) in &e.references {
            let mut shown = verdict.as_str().to_string();
            if verdict.as_str() == "prune" {
                if let Some(o) = outcome {
                    shown = match o {
                        PruneOutcome::Pruned(rs) if rs.contains(r) => "pruned".into(),
                        PruneOutcome::Failed(_) => "FAILED".into(),
                        _ => "skipped".into(),
                    };
                }
            }
            rows.push([
                v.definition.clone(),
                v.version.clone(),
                r.clone(),
                shown,
                verdict.detail(),
            ]);
        }
        let mut doc = json!({
            "id": v.id,
            "definition": v.definition,
            "version": v.version,
            "state": v.provisioning_state.as_str(),
            "references": e.references.iter().map(|(r, verdict)| json!({
                "reference": r,
                "holder": e.holders.get(r),
                "verdict": verdict.as_str(),
                "reason": verdict.detail(),
            })).collect::<Vec<_>>(),
        });
        if let Some(o) = outcome {
            doc["outcome"] = json!(o.describe());
            if let PruneOutcome::Pruned(rs) = o {
                doc["pruned"] = json!(rs);
            }
        }
        versions.push(doc);
    }
    let failed = done.failed();
    let planned_at = time::OffsetDateTime::from(done.planned_at)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    let json = json!({
        "applied": done.applied.is_some(),
        // What `--apply --plan FILE` reads back: the run started here, before the gallery read.
        "planned_at": planned_at,
        // What `--apply --plan FILE` must be given again: every record this run read.
        "inputs": done.inputs,
        "sources": plan.sources,
        "versions": versions,
        "summary": {
            "versions": plan.entries.len(),
            "references": plan.references(),
            "prune": plan.prune_count(),
            "keep": plan.references() - plan.prune_count(),
            "pruned": done.removed(),
            "failed": failed,
        },
    });
    let mut human = if rows.is_empty() {
        "no version of the gallery records a reference\n".to_string()
    } else {
        let mut all = vec![[
            "DEFINITION".to_string(),
            "VERSION".into(),
            "REFERENCE".into(),
            "VERDICT".into(),
            "REASON".into(),
        ]];
        all.extend(rows);
        super::list::table(&all)
    };
    let _ = writeln!(
        human,
        "\n{} references on {} versions: {} to prune, {} to keep (records read: {}).",
        plan.references(),
        plan.entries.len(),
        plan.prune_count(),
        plan.references() - plan.prune_count(),
        plan.sources.join("; ")
    );
    match &done.applied {
        None => {
            let _ = writeln!(
                human,
                "Dry run: nothing was changed. To remove the {} references marked prune: save this run with --output json > plan.json, save every director's `bosh stemcells --json` again at least {}s later, then run with --apply --plan plan.json and those lists (no version is deleted; run cleanup afterwards).",
                plan.prune_count(),
                crate::cleanup::references::PLAN_TO_LIST_GAP.as_secs()
            );
        }
        Some(_) => {
            let _ = writeln!(
                human,
                "Applied: {} references removed, {failed} versions failed. No version was deleted; `cleanup` decides that.",
                done.removed()
            );
        }
    }
    let report = Report::new(json, human);
    if failed > 0 {
        report.with_exit(Exit::Error)
    } else {
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrap {
        #[command(subcommand)]
        cmd: ReferencesCommand,
    }

    #[test]
    fn prune_is_a_dry_run_by_default_and_files_repeat() {
        let w = Wrap::try_parse_from([
            "references",
            "prune",
            "--director-stemcells",
            "a.json",
            "b.json",
            "--create-env-state",
            "s.json",
        ])
        .unwrap();
        let ReferencesCommand::Prune(a) = w.cmd else {
            panic!("prune");
        };
        assert!(!a.apply);
        assert_eq!(a.director_stemcells.len(), 2);
        assert_eq!(a.max_list_age, Duration::from_secs(3600));
    }
}
