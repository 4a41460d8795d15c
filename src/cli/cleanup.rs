//! `cleanup`: plan (default) or `--apply` the deletion of gallery versions nothing uses.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use time::OffsetDateTime;

use crate::app::cleanup::Request;
use crate::app::Context;
use crate::cleanup::evidence::{EvidenceFiles, FileKind};
use crate::cleanup::planner::human_age;
use crate::cleanup::{ApplyOutcome, DeleteOutcome, Plan, PlanEntry, Policy, Verdict};
use crate::error::Exit;
use crate::gallery::{tags, GalleryApi};

use super::Report;

#[derive(Debug, Clone, Args)]
pub struct CleanupArgs {
    /// Delete the versions the plan marks `delete` (default: only print the plan).
    #[arg(long)]
    pub apply: bool,
    /// Director stemcell lists: files holding the output of `bosh stemcells --json`.
    #[arg(long, value_name = "FILE", num_args = 1.., action = clap::ArgAction::Append)]
    pub director_stemcells: Vec<PathBuf>,
    /// bosh create-env state files (bosh-state.json); every stemcell record in them is kept.
    #[arg(long, value_name = "FILE", num_args = 1.., action = clap::ArgAction::Append)]
    pub create_env_state: Vec<PathBuf>,
    /// Keep the newest N Succeeded versions of every image definition.
    #[arg(long, value_name = "N", default_value_t = Policy::DEFAULT_KEEP_LATEST)]
    pub keep_latest: usize,
    /// Grace period: keep versions published less than this long ago (e.g. 24h, 7d, 90m).
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_duration)]
    pub min_age: Duration,
    /// Keep versions carrying this tag (any value).
    #[arg(long, value_name = "TAG", default_value = tags::PROTECT)]
    pub protect_tag: String,
    /// Deletions running at once (1-32).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=32))]
    pub concurrency: u16,
    /// Also read the VMs, scale sets and disks of this subscription as consumers (repeatable;
    /// the gallery's own subscription is always read). Adds to `consumer_subscriptions` in the
    /// config file and STEMCELL_GALLERY_CONSUMER_SUBSCRIPTIONS. Only listed scopes are read.
    #[arg(long, value_name = "ID", num_args = 1.., action = clap::ArgAction::Append)]
    pub consumer_subscription: Vec<String>,
    /// With --apply, also delete the source blobs (in the configured storage account) of the
    /// deleted versions that no remaining version uses.
    #[arg(long)]
    pub blobs: bool,
    /// With --apply: the reviewed dry run (`cleanup --output json > FILE`). The plan is made
    /// again from fresh evidence and nothing is deleted unless exactly the versions FILE deletes,
    /// unchanged, are to be deleted now.
    #[arg(long, value_name = "FILE", requires = "apply")]
    pub plan: Option<PathBuf>,
}

/// `stemcell-gallery cleanup`: connect, plan, and apply when asked.
pub async fn run(global: &super::GlobalArgs, args: CleanupArgs) -> anyhow::Result<Report> {
    let mut global = global.clone();
    global
        .consumer_subscriptions
        .extend(args.consumer_subscription.iter().cloned());
    let ctx = super::connect::connect(&global)?;
    run_in(&ctx, args).await
}

/// The cleanup of `ctx`'s gallery the flags ask for, rendered.
pub async fn run_in(ctx: &Context, args: CleanupArgs) -> anyhow::Result<Report> {
    let saved = saved_plan(&args)?;
    let mut request = request(args, ctx.settings.create_env_definition_suffix());
    request.saved_plan = saved;
    let done = crate::app::cleanup::run(ctx, &request).await?;
    Ok(render(&done.plan, done.applied.as_ref()))
}

/// The saved plan `--plan FILE` names, read before anything else (a usage error when it is not
/// a cleanup dry run's JSON).
fn saved_plan(args: &CleanupArgs) -> anyhow::Result<Option<crate::cleanup::saved::SavedPlan>> {
    let Some(path) = &args.plan else {
        return Ok(None);
    };
    crate::cleanup::saved::SavedPlan::read(path)
        .map(Some)
        .map_err(|why| {
            crate::error::Coded::new(
                Exit::Usage,
                format!(
                    "--plan {}: {why}; save a plan with `cleanup --output json > FILE` (no --apply)",
                    path.display()
                ),
            )
            .into()
        })
}

/// The use case's request from the flags (`create_env_suffix`: the configured one).
fn request(args: CleanupArgs, create_env_suffix: &str) -> Request {
    Request {
        saved_plan: None,
        apply: args.apply,
        blobs: args.blobs,
        evidence: EvidenceFiles::default()
            .with(FileKind::DirectorStemcells, args.director_stemcells)
            .with(FileKind::CreateEnvState, args.create_env_state),
        policy: Policy {
            min_age: args.min_age,
            keep_latest: args.keep_latest,
            protect_tag: args.protect_tag,
            now: None,
            create_env_suffix: create_env_suffix.to_string(),
        },
        concurrency: usize::from(args.concurrency),
    }
}

pub use crate::app::Clock;

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim())
        .map_err(|e| format!("{e} (write a duration such as 24h, 7d or 90m)"))
}

/// Run a cleanup against `api` (a fake of the gallery, in-process locks, no storage account)
/// with the clock at `now`.
pub async fn run_with(
    api: Arc<dyn GalleryApi>,
    args: CleanupArgs,
    now: OffsetDateTime,
) -> anyhow::Result<Report> {
    run_in(&Context::over_gallery_api(api, now)?, args).await
}

/// The report: a table (definition, version, mode, age, verdict, reasons) and the JSON document.
pub fn render(planned: &Plan, applied: Option<&ApplyOutcome>) -> Report {
    let shown = applied.map(|a| &a.plan).unwrap_or(planned);

    let mut rows: Vec<[String; 6]> = Vec::new();
    let mut versions = Vec::new();
    for e in &shown.entries {
        rows.push(row(e, applied));
        versions.push(version_json(e, applied));
    }

    let (deleted, skipped, failed) = applied
        .map(|a| (a.deleted(), a.skipped(), a.failed()))
        .unwrap_or((0, 0, 0));
    let summary = serde_json::json!({
        "total": shown.entries.len(),
        "delete": shown.count(Verdict::Delete),
        "keep": shown.count(Verdict::Keep),
        "deleted": deleted,
        "skipped": skipped,
        "failed": failed,
    });
    let mut json = serde_json::json!({
        "applied": applied.is_some(),
        "sources": shown.sources,
        "versions": versions,
        "summary": summary,
    });
    // Held means locked (docs/references.md, "The delete lock"): what a dry run would repair,
    // and what --apply repaired.
    json["lock_repairs"] = serde_json::json!(shown.lock_repairs);
    if let Some(a) = applied {
        json["locks_repaired"] = serde_json::json!(a.locks_repaired);
        if !a.blobs.is_empty() {
            json["blobs"] = serde_json::Value::Array(
                a.blobs
                    .iter()
                    .map(|b| serde_json::json!({"uri": crate::redact::uri(&b.uri), "error": b.result.as_ref().err()}))
                    .collect(),
            );
        }
    }

    let mut human = table(
        ["DEFINITION", "VERSION", "MODE", "AGE", "VERDICT", "REASONS"],
        &rows,
    );
    write_summary(&mut human, shown, applied);
    let report = Report::new(json, human);
    if failed > 0 {
        report.with_exit(Exit::Error)
    } else {
        report
    }
}

/// The outcome of the deletion of version `id`, when one was applied.
fn outcome_of<'a>(applied: Option<&'a ApplyOutcome>, id: &str) -> Option<&'a DeleteOutcome> {
    applied.and_then(|a| a.results.get(id))
}

/// One version's table row: the verdict (or what the deletion did) and the reasons.
fn row(e: &PlanEntry, applied: Option<&ApplyOutcome>) -> [String; 6] {
    let v = &e.observed;
    let age = e.age.map(human_age).unwrap_or_else(|| "?".into());
    let mut verdict = e.verdict.as_str().to_string();
    if let Some(o) = outcome_of(applied, &v.id) {
        verdict = match (o, applied.and_then(|a| a.deleted_how)) {
            (DeleteOutcome::Deleted, Some(crate::gallery::lifecycle::Deleted::Soft { .. })) => {
                "soft-deleted".into()
            }
            (DeleteOutcome::Deleted, _) => "deleted".into(),
            (DeleteOutcome::Failed(_), _) => "FAILED".into(),
            _ => "skipped".into(),
        };
    }
    let mut reasons: Vec<String> = e.reasons.iter().map(|r| r.detail()).collect();
    if let Some(o) = outcome_of(applied, &v.id) {
        match (o, applied.and_then(|a| a.deleted_how)) {
            (DeleteOutcome::Deleted, Some(how)) => {
                let said = how.text();
                let said = said.trim().trim_start_matches('(').trim_end_matches(')');
                if !said.is_empty() {
                    reasons.push(said.to_string());
                }
            }
            (DeleteOutcome::Deleted, None) => {}
            _ => reasons.push(o.describe()),
        }
    }
    [
        v.definition.clone(),
        v.version.clone(),
        e.mode.clone(),
        age,
        verdict,
        // The table is read by a person: ARM ids as `rg/type/name` (JSON keeps them whole).
        crate::cli::output::shorten_ids(&reasons.join("; ")),
    ]
}

/// One version's JSON document: the plan's entry, and the deletion's outcome when applied.
fn version_json(e: &PlanEntry, applied: Option<&ApplyOutcome>) -> serde_json::Value {
    let v = &e.observed;
    let mut doc = serde_json::json!({
        "definition": v.definition,
        "version": v.version,
        "id": v.id,
        "mode": e.mode,
        "state": v.provisioning_state.as_str(),
        "age_seconds": e.age.map(|a| a.as_secs()),
        "verdict": e.verdict.as_str(),
        // What `--apply --plan FILE` compares: the version as it was when planned.
        "fingerprint": crate::cleanup::saved::fingerprint(v),
        "reasons": e.reasons.iter().map(|r| serde_json::json!({"kind": r.kind(), "detail": r.detail()})).collect::<Vec<_>>(),
    });
    let blocked_until = e.reasons.iter().find_map(|r| match r {
        crate::cleanup::planner::Reason::BlockedBeforeEndOfLife { until } => Some(*until),
        _ => None,
    });
    if let Some(until) = blocked_until {
        doc["blocked_until"] = serde_json::json!(crate::gallery::lifecycle::until_rfc3339(until));
    }
    if let Some(o) = outcome_of(applied, &v.id) {
        doc["outcome"] = serde_json::Value::String(o.describe());
        if let (DeleteOutcome::Deleted, Some(how)) = (o, applied.and_then(|a| a.deleted_how)) {
            doc["soft_deleted"] = serde_json::json!(how.soft_deleted());
            doc["restorable_until"] = serde_json::json!(how.restorable_until());
        }
    }
    doc
}

/// The lines under the table: the counts and the evidence read, then what a dry run would do
/// or what the deletions and the blob deletions did.
fn write_summary(human: &mut String, shown: &Plan, applied: Option<&ApplyOutcome>) {
    let (deleted, skipped, failed) = applied
        .map(|a| (a.deleted(), a.skipped(), a.failed()))
        .unwrap_or((0, 0, 0));
    let count = super::output::count;
    let _ = writeln!(
        human,
        "\n{}: {} to delete, {} to keep (evidence read from {}: {}).",
        count(shown.entries.len(), "version"),
        shown.count(Verdict::Delete),
        shown.count(Verdict::Keep),
        count(shown.sources.len(), "source"),
        shown.sources.join("; ")
    );
    match (applied, shown.lock_repairs.len()) {
        (_, 0) => {}
        (None, n) => {
            let _ = writeln!(
                human,
                "The delete lock of {} is out of line with its references (held without it, or held by the Azure CPI alone and still locked); --apply repairs it: {}",
                count(n, "version"),
                shown
                    .lock_repairs
                    .iter()
                    .map(|id| super::output::short_id(id))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        (Some(a), _) => {
            let _ = writeln!(
                human,
                "Repaired the delete lock of {}.",
                count(a.locks_repaired.len(), "version")
            );
        }
    }
    match (applied, shown.count(Verdict::Delete)) {
        (None, 0) => {
            let _ = writeln!(
                human,
                "Dry run: nothing was deleted, and no version is marked delete."
            );
        }
        (None, n) => {
            let _ = writeln!(
                human,
                "Dry run: nothing was deleted. Re-run with --apply to delete the {} marked delete.",
                count(n, "version")
            );
        }
        (Some(a), _) => {
            let _ = writeln!(
                human,
                "Applied: {deleted} deleted, {skipped} skipped, {failed} failed."
            );
            for b in &a.blobs {
                match &b.result {
                    Ok(()) => {
                        let _ =
                            writeln!(human, "deleted source blob {}", crate::redact::uri(&b.uri));
                    }
                    Err(e) => {
                        let _ = writeln!(
                            human,
                            "FAILED to delete source blob {}: {e}",
                            crate::redact::uri(&b.uri)
                        );
                    }
                }
            }
        }
    }
}

fn table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let mut width = header.map(|h| h.chars().count());
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == N {
                l.push_str(c);
            } else {
                let pad = width[i] - c.chars().count();
                l.push_str(c);
                l.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrap {
        #[command(flatten)]
        args: CleanupArgs,
    }

    fn parse(argv: &[&str]) -> Result<CleanupArgs, clap::Error> {
        let mut full = vec!["cleanup"];
        full.extend_from_slice(argv);
        Wrap::try_parse_from(full).map(|w| w.args)
    }

    #[test]
    fn defaults_are_a_dry_run_with_24h_grace_and_keep_latest_2() {
        let a = parse(&[]).unwrap();
        assert!(!a.apply);
        assert_eq!(a.min_age, Duration::from_secs(24 * 3600));
        assert_eq!(a.keep_latest, 2);
        assert_eq!(a.protect_tag, tags::PROTECT);
        assert_eq!(a.concurrency, 4);
    }

    #[test]
    fn files_repeat_and_durations_are_human() {
        let a = parse(&[
            "--director-stemcells",
            "a.json",
            "b.json",
            "--director-stemcells",
            "c.json",
            "--create-env-state",
            "bosh-state.json",
            "--min-age",
            "7d",
            "--keep-latest",
            "0",
            "--apply",
        ])
        .unwrap();
        assert_eq!(a.director_stemcells.len(), 3);
        assert_eq!(a.create_env_state, vec![PathBuf::from("bosh-state.json")]);
        assert_eq!(a.min_age, Duration::from_secs(7 * 86_400));
        assert_eq!(a.keep_latest, 0);
        assert!(a.apply);
    }

    #[test]
    fn bad_values_are_usage_errors_naming_the_remedy() {
        let err = parse(&["--min-age", "soon"]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("24h, 7d or 90m"), "{err}");
        assert_eq!(parse(&["--concurrency", "0"]).unwrap_err().exit_code(), 2);
        assert_eq!(parse(&["--keep-latest", "-1"]).unwrap_err().exit_code(), 2);
    }
}
