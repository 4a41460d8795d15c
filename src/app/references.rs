//! The `references prune` use case: read the gallery and every BOSH record given (director
//! stemcell lists, create-env state files), plan which stemcell CIDs no record holds any more
//! (`cleanup::references`), and, when asked, remove them under each version's lock. A version is
//! never deleted here, even when its last reference goes: that is `cleanup`'s decision.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::app::Context;
use crate::cleanup::evidence::EvidenceFiles;
use crate::cleanup::references::{plan_prune, PruneInput, PrunePlan, SavedPrune, PLAN_TO_LIST_GAP};
use crate::cleanup::SourceError;
use crate::cleanup::{collect_all, CleanupError, Inventory};
use crate::error::{Coded, Exit};
use crate::gallery::GalleryApi;

/// What to prune with.
#[derive(Debug, Clone)]
pub struct PruneRequest {
    /// Remove what the plan marks `prune` (otherwise only plan).
    pub apply: bool,
    /// The BOSH records given: director stemcell lists (one per director sharing the gallery,
    /// each with whose list it is when the operator said) and create-env state files.
    pub evidence: EvidenceFiles,
    /// With `apply`: a director list saved longer ago than this is refused (a stemcell uploaded
    /// after it was saved would lose its reference).
    pub max_list_age: Duration,
    /// With `apply` (required): the dry run the director lists were saved after; only the
    /// references it saw are pruned (see [`SavedPrune`]).
    pub saved_plan: Option<(PathBuf, SavedPrune)>,
}

impl PruneRequest {
    /// The records this run reads, as a saved plan names them.
    pub fn inputs(&self) -> Vec<PruneInput> {
        self.evidence.iter().map(PruneInput::new).collect()
    }
}

/// What removing one version's pruned references did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PruneOutcome {
    /// These references were removed.
    Pruned(Vec<String>),
    /// The version disappeared meanwhile.
    Gone,
    /// The planned references were no longer recorded (someone removed them meanwhile).
    AlreadyGone,
    /// The write failed.
    Failed(String),
}

impl PruneOutcome {
    pub fn describe(&self) -> String {
        match self {
            PruneOutcome::Pruned(r) => format!("removed {}", r.join(", ")),
            PruneOutcome::Gone => "the version disappeared meanwhile".into(),
            PruneOutcome::AlreadyGone => "the references were already removed".into(),
            PruneOutcome::Failed(e) => format!("FAILED: {e}"),
        }
    }
}

/// The plan, and per version id what applying it did.
#[derive(Debug)]
pub struct Pruned {
    pub plan: PrunePlan,
    pub applied: Option<Vec<(String, PruneOutcome)>>,
    /// When this run started, before it read the gallery: what a saved dry run records.
    pub planned_at: SystemTime,
    /// The BOSH records this run read (what a saved dry run records for its apply).
    pub inputs: Vec<PruneInput>,
}

impl Pruned {
    pub fn failed(&self) -> usize {
        self.applied
            .iter()
            .flatten()
            .filter(|(_, o)| matches!(o, PruneOutcome::Failed(_)))
            .count()
    }

    pub fn removed(&self) -> usize {
        self.applied
            .iter()
            .flatten()
            .map(|(_, o)| match o {
                PruneOutcome::Pruned(r) => r.len(),
                _ => 0,
            })
            .sum()
    }
}

/// Refuse a request that names no BOSH record (a usage error, exit 2): nothing could show a
/// reference unheld, and pruning against nothing would remove every CID.
pub fn check_request(request: &PruneRequest) -> anyhow::Result<()> {
    if request.evidence.is_empty() {
        return Err(no_evidence());
    }
    if request.apply && request.saved_plan.is_none() {
        return Err(Coded::new(
            Exit::Usage,
            format!(
                "references prune --apply needs --plan FILE: save a dry run first \
                 (`references prune --output json ... > plan.json`), then, at least {}s later, \
                 save every director's `bosh stemcells --json` again and apply with those lists. \
                 A stemcell uploaded after a list was saved is on the version but not in the \
                 list; only a plan made before the lists tells it from one the director deleted",
                PLAN_TO_LIST_GAP.as_secs()
            ),
        )
        .into());
    }
    Ok(())
}

fn no_evidence() -> anyhow::Error {
    Coded::new(
        Exit::Usage,
        "references prune needs the BOSH records that hold references: give the stemcell list of \
         every director sharing the gallery (--director-stemcells FILE, from `bosh stemcells \
         --json`) and every create-env state (--create-env-state bosh-state.json)",
    )
    .into()
}

/// A record that cannot be used refuses the prune (exit 5, as cleanup), in the prune's words.
fn refused(e: CleanupError) -> anyhow::Error {
    match &e {
        CleanupError::EvidenceIncomplete {
            source_name,
            cause,
            also_failed,
        } => {
            let also = if also_failed.is_empty() {
                String::new()
            } else {
                format!(" (also unusable: {})", also_failed.join(", "))
            };
            Coded::new(
                Exit::EvidenceIncomplete,
                format!(
                    "references prune refused, nothing was changed: `{source_name}` cannot be used{also}, and a record that cannot be read is not evidence that a reference is unheld; fix it and re-run: {}",
                    crate::error::error_chain(cause)
                ),
            )
            .into()
        }
        CleanupError::Inventory { .. } => e.into(),
    }
}

/// Refuse a saved answer (a director list, `FileKind::is_saved_answer`) whose modification time
/// cannot be trusted for `--apply`: saved longer than `max` ago (a stemcell uploaded since then
/// holds a reference the list does not show), or, with a saved plan, not at least
/// [`PLAN_TO_LIST_GAP`] after it (it may predate a stemcell the plan saw, and would prune that
/// reference). Each file is looked at once.
fn check_list_times(
    files: &EvidenceFiles,
    max: Duration,
    plan: Option<(&Path, &SavedPrune)>,
    now: SystemTime,
) -> anyhow::Result<()> {
    for file in files.iter().filter(|f| f.kind.is_saved_answer()) {
        let f = &file.path;
        let stale = |what: &'static str, message: String| SourceError::Malformed {
            path: f.clone(),
            what,
            message,
        };
        let cause = match std::fs::metadata(f).and_then(|m| m.modified()) {
            Err(cause) => SourceError::Read {
                path: f.clone(),
                cause,
            },
            Ok(t) => match plan {
                Some((path, saved)) if !saved.at_least_gap_after(t) => stale(
                    "a stemcell list saved after the plan",
                    format!(
                        "it was saved before the plan {} was made, or less than {}s after it: a stemcell uploaded around then may be missing from it and would lose its reference; save `bosh stemcells --json` again now and re-run",
                        path.display(),
                        PLAN_TO_LIST_GAP.as_secs()
                    ),
                ),
                _ => {
                    let age = now.duration_since(t).unwrap_or_default();
                    if age <= max {
                        continue;
                    }
                    stale(
                        "a current stemcell list",
                        format!(
                            "it was saved {} ago, more than --max-list-age {}: a stemcell uploaded since then would lose its reference; save `bosh stemcells --json` again right before pruning",
                            humantime::format_duration(Duration::from_secs(age.as_secs())),
                            humantime::format_duration(max)
                        ),
                    )
                }
            },
        };
        return Err(refused(CleanupError::EvidenceIncomplete {
            source_name: file.kind.source_name(f, None),
            cause,
            also_failed: vec![],
        }));
    }
    Ok(())
}

/// Refuse an apply that is not given every record its plan read (exit 5): with one director's
/// list left out, that director's references would look unheld.
fn check_same_inputs(plan: &Path, saved: &SavedPrune, given: &[PruneInput]) -> anyhow::Result<()> {
    let missing = saved.missing_inputs(given);
    if missing.is_empty() {
        return Ok(());
    }
    Err(Coded::new(
        Exit::EvidenceIncomplete,
        format!(
            "references prune refused, nothing was changed: the plan {} read records this run was not given: {}. An apply weighs every record its plan weighed, saved anew: give each again (the same path; a director list with its holder)",
            plan.display(),
            missing
                .iter()
                .map(|i| i.describe())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    )
    .into())
}

/// Refuse to apply within [`PLAN_TO_LIST_GAP`] of the plan: the create-env state files are read
/// now, and one read right after the plan could predate the state write of a stemcell the plan
/// saw on its version (bosh-cli records it a moment after create_stemcell returns).
fn check_plan_settled(plan: &Path, saved: &SavedPrune, now: SystemTime) -> anyhow::Result<()> {
    if saved.at_least_gap_after(now) {
        return Ok(());
    }
    Err(Coded::new(
        Exit::EvidenceIncomplete,
        format!(
            "references prune refused, nothing was changed: the plan {} was made less than {}s ago; a create-env state read now may not show a stemcell recorded around then. Re-run in a minute",
            plan.display(),
            PLAN_TO_LIST_GAP.as_secs()
        ),
    )
    .into())
}

/// Plan a prune of the context's gallery and apply it when asked. Any record that cannot be
/// read (or, with `apply`, a director list too old) refuses the whole run (exit 5), as cleanup
/// does.
pub async fn prune(ctx: &Context, request: &PruneRequest) -> anyhow::Result<Pruned> {
    let api: Arc<dyn GalleryApi> = ctx.service.api().clone();
    let service = &ctx.service;
    let gallery = format!("gallery {}", ctx.settings.gallery);
    let gallery = gallery.as_str();
    // Before anything is read: a reference recorded after this instant is not in this plan.
    let planned_at = SystemTime::now();
    check_request(request)?;
    if request.apply {
        let plan = request
            .saved_plan
            .as_ref()
            .map(|(path, saved)| (path.as_path(), saved));
        if let Some((path, saved)) = plan {
            check_same_inputs(path, saved, &request.inputs())?;
        }
        check_list_times(&request.evidence, request.max_list_age, plan, planned_at)?;
        if let Some((path, saved)) = plan {
            check_plan_settled(path, saved, planned_at)?;
        }
    }
    let sources = request.evidence.sources();
    // The records first: a refusal must come before anything is read or written.
    let evidence = collect_all(&sources).await.map_err(refused)?;
    let mut inventory = Inventory::gather(api.as_ref(), gallery).await?;
    // Who holds each reference, and what a late tag write erased: the reference records.
    let store = service.locks().records().ok_or_else(|| {
        Coded::new(
            Exit::Usage,
            "references prune needs the storage account that holds the reference records (who holds each reference): pass --blob-endpoint https://ACCOUNT.blob.core.windows.net (or set storage_account in the config file)",
        )
    })?;
    inventory
        .read_records(store, service.gallery())
        .await
        .map_err(refused)?;
    let mut plan = plan_prune(&inventory, &evidence);
    if let Some((_, saved)) = &request.saved_plan {
        saved.restrict(&mut plan);
    }
    let applied = if request.apply {
        let mut out = Vec::new();
        for e in &plan.entries {
            let refs = e.to_prune();
            if refs.is_empty() {
                continue;
            }
            let v = &e.observed;
            let outcome = match service
                .drop_references(&v.definition, &v.version, &refs)
                .await
            {
                Ok((None, removed)) if removed.is_empty() => PruneOutcome::Gone,
                Ok((Some(_), removed)) if removed.is_empty() => PruneOutcome::AlreadyGone,
                Ok((now, removed)) => {
                    let gone = if now.is_none() {
                        " from the record of the version, which is gone meanwhile (soft-deleted, or being replaced): they stay removed if it comes back"
                    } else {
                        ""
                    };
                    tracing::info!(version = %v.id, "pruned references {}{gone}", removed.join(", "));
                    PruneOutcome::Pruned(removed)
                }
                Err(err) => {
                    tracing::warn!(version = %v.id, error = %err, "could not prune references");
                    PruneOutcome::Failed(err.to_string())
                }
            };
            out.push((v.id.clone(), outcome));
        }
        Some(out)
    } else {
        None
    };
    Ok(Pruned {
        plan,
        applied,
        planned_at,
        inputs: request.inputs(),
    })
}

/// What to hand back to plain Azure CPIs (`references hand-back`): a holder's CIDs, or named
/// CIDs, moved from this tool's side of the ledger into `stemcell_references`, so a director
/// taken back to the plain Azure CPI resolves and deletes them itself.
#[derive(Debug, Clone)]
pub struct HandBackRequest {
    /// Every CID this holder holds (`gallery::record::holder_label`).
    pub holder: Option<String>,
    /// These CIDs.
    pub cids: Vec<String>,
    /// Move them (otherwise only plan).
    pub apply: bool,
}

/// One version's part of a hand-back.
#[derive(Debug, Clone)]
pub struct HandBackEntry {
    pub id: String,
    pub definition: String,
    pub version: String,
    /// The CIDs to hand back (held on this tool's side).
    pub cids: Vec<String>,
    pub outcome: HandBackOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandBackOutcome {
    /// Dry run: they fit.
    Planned,
    /// They do not fit in `stemcell_references` (why, naming what to delete first).
    NoRoom(String),
    /// Moved.
    HandedBack(Vec<String>),
    /// The write failed.
    Failed(String),
}

impl HandBackOutcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            HandBackOutcome::Planned => "hand-back",
            HandBackOutcome::NoRoom(_) => "no-room",
            HandBackOutcome::HandedBack(_) => "handed-back",
            HandBackOutcome::Failed(_) => "failed",
        }
    }
}

/// Plan (and, when asked, make) a hand-back: every version holding one of the request's CIDs
/// on this tool's side, whether `stemcell_references` has room for them (the version's tags as
/// its record says they are), and the move under each version's lock.
pub async fn hand_back(
    ctx: &Context,
    request: &HandBackRequest,
) -> anyhow::Result<Vec<HandBackEntry>> {
    let service = &ctx.service;
    use crate::gallery::{record, tags};
    let mut versions: Vec<crate::gallery::ImageVersion> = service
        .list()
        .await?
        .into_iter()
        .flat_map(|(_, v)| v)
        .collect();
    versions.sort_by(|a, b| (&a.definition, &a.version).cmp(&(&b.definition, &b.version)));
    // A record that cannot be used may hold the holder's CIDs: refuse, naming the version and
    // the repair, rather than hand back less than asked and say it was all.
    let records = service.records_of_checked(&versions).await?;
    let mut out = Vec::new();
    for (v, rec) in versions.iter().zip(&records) {
        let healed = record::healed(v, rec.as_ref());
        let tag_set = tags::canonical_names(&healed.tags);
        let cids: Vec<String> = tags::sourced_references(&tag_set)
            .into_iter()
            .filter(|(r, s)| *s != tags::Source::StemcellReferences && tags::is_cid(r))
            .map(|(r, _)| r)
            .filter(|r| {
                request.cids.contains(r)
                    || request.holder.as_deref().is_some_and(|h| {
                        rec.as_ref()
                            .and_then(|rec| rec.entry(r))
                            .and_then(|e| e.holder.as_deref())
                            == Some(h)
                    })
            })
            .collect();
        if cids.is_empty() {
            continue;
        }
        let fits = tags::with_references_handing_back(
            &tag_set,
            &tags::references(&tag_set),
            &tags::sentinel(&v.definition, &v.version),
            &cids,
        );
        let outcome = match (fits, request.apply) {
            (Err(e), _) => HandBackOutcome::NoRoom(e.to_string()),
            (Ok(_), false) => HandBackOutcome::Planned,
            (Ok(_), true) => match service.hand_back(&v.definition, &v.version, &cids).await {
                Ok((moved, _)) => {
                    tracing::info!(version = %v.id, "handed back to the Azure CPI: {}", moved.join(", "));
                    HandBackOutcome::HandedBack(moved)
                }
                Err(e) => HandBackOutcome::Failed(e.to_string()),
            },
        };
        out.push(HandBackEntry {
            id: v.id.clone(),
            definition: v.definition.clone(),
            version: v.version.clone(),
            cids,
            outcome,
        });
    }
    Ok(out)
}
