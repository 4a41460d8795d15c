//! The cleanup planner: a pure, deterministic function from inventory + evidence + policy to a
//! plan. Every version gets a verdict and every reason that applies; a version is planned for
//! deletion only when no keep reason applies.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::gallery::latest::{self, ImageRef, Use};
use crate::gallery::lifecycle::CleanupHold;
use crate::gallery::protect;
use crate::gallery::{tags, ConsumerKind, ImageVersion, ProvisioningState};

use super::evidence::{Basis, Claim, ClaimTarget, Evidence, FileKind};
use super::inventory::Inventory;
use super::policy::Policy;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    Delete,
    Keep,
}

impl Verdict {
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Delete => "delete",
            Verdict::Keep => "keep",
        }
    }
}

/// Why a version is kept (or, for the last two, why it may be deleted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// References recorded on the version.
    Referenced { refs: Vec<String> },
    /// A stemcell record of an evidence file holds it (a director's stemcell list, a create-env
    /// state file; `kind` says which, and gives the JSON `kind`).
    FileHolds {
        kind: FileKind,
        file: String,
        name: String,
        version: String,
        cid: String,
        detail: String,
    },
    /// A VM, scale set (instance) or disk was created from this version.
    UsedByConsumer { kind: ConsumerKind, id: String },
    /// A consumer refers to the definition (or `latest`), and `latest` could resolve to this
    /// version for it (`gallery::latest`: the one rule).
    LatestOfDefinitionUsedBy {
        kind: ConsumerKind,
        id: String,
        image_id: String,
    },
    /// A consumer was created from `latest` and Azure records no exact version: it may run any
    /// version of the definition.
    MayRunFromLatest {
        kind: ConsumerKind,
        id: String,
        image_id: String,
    },
    /// Carries the protect tag.
    Protected { tag: String },
    /// Younger than the grace period.
    TooYoung { age: Duration, min_age: Duration },
    /// Among the newest Succeeded versions of its definition.
    KeepLatest { rank: usize, keep: usize },
    /// Creating, Updating, Deleting or Migrating: never touched.
    InProgress { state: ProvisioningState },
    /// A state we do not know how to judge.
    UnknownState { state: ProvisioningState },
    /// Azure refuses its deletion before its end of life (`until`; `None`: it names none).
    BlockedBeforeEndOfLife { until: Option<time::OffsetDateTime> },
    /// Failed in a gallery with soft delete on, where Azure cannot delete it (SDDOC).
    FailedInSoftDeleteGallery,
    /// A management lock this tool does not own applies to it (which, and at what scope):
    /// Azure refuses its deletion, and this tool never lifts another's lock.
    Locked { locks: String },
    /// No published date: its age cannot be proven.
    UnknownAge,
    /// Azure's clock is unknown (no answer carried a `Date` header): no age can be proven.
    UnknownClock,
    /// The version name is not MAJOR.MINOR.PATCH, so keep-latest cannot rank it.
    UnparseableVersion,
    /// No evidence source was given at all.
    NoEvidenceRead,
    /// Delete: no source shows use, and no policy keeps it.
    Unused { sources: Vec<String> },
    /// Delete (informational): a Failed version past the grace period.
    FailedPastGrace,
}

impl Reason {
    /// Whether this reason keeps the version. Exhaustive on purpose: a new reason forces a choice.
    pub fn keeps(&self) -> bool {
        match self {
            Reason::Referenced { .. }
            | Reason::FileHolds { .. }
            | Reason::UsedByConsumer { .. }
            | Reason::LatestOfDefinitionUsedBy { .. }
            | Reason::MayRunFromLatest { .. }
            | Reason::Protected { .. }
            | Reason::TooYoung { .. }
            | Reason::KeepLatest { .. }
            | Reason::InProgress { .. }
            | Reason::UnknownState { .. }
            | Reason::BlockedBeforeEndOfLife { .. }
            | Reason::FailedInSoftDeleteGallery
            | Reason::Locked { .. }
            | Reason::UnknownAge
            | Reason::UnknownClock
            | Reason::UnparseableVersion
            | Reason::NoEvidenceRead => true,
            Reason::Unused { .. } | Reason::FailedPastGrace => false,
        }
    }

    /// A stable machine name (the JSON `kind`).
    pub fn kind(&self) -> &'static str {
        match self {
            Reason::Referenced { .. } => "referenced",
            Reason::FileHolds { kind, .. } => kind.reason_kind(),
            Reason::UsedByConsumer { .. } => "used_by_consumer",
            Reason::LatestOfDefinitionUsedBy { .. } => "latest_of_definition_used_by",
            Reason::MayRunFromLatest { .. } => "may_run_from_latest",
            Reason::Protected { .. } => "protected",
            Reason::TooYoung { .. } => "too_young",
            Reason::KeepLatest { .. } => "keep_latest",
            Reason::InProgress { .. } => "in_progress",
            Reason::UnknownState { .. } => "unknown_state",
            Reason::BlockedBeforeEndOfLife { .. } => "blocked_before_end_of_life",
            Reason::FailedInSoftDeleteGallery => "failed_in_soft_delete_gallery",
            Reason::Locked { .. } => "locked",
            Reason::UnknownAge => "unknown_age",
            Reason::UnknownClock => "unknown_clock",
            Reason::UnparseableVersion => "unparseable_version",
            Reason::NoEvidenceRead => "no_evidence_read",
            Reason::Unused { .. } => "unused",
            Reason::FailedPastGrace => "failed_past_grace",
        }
    }

    /// One line for the operator.
    pub fn detail(&self) -> String {
        match self {
            Reason::Referenced { refs } => format!("referenced by {}", refs.join(", ")),
            Reason::FileHolds { detail, .. } => detail.clone(),
            Reason::UsedByConsumer { kind, id } => {
                format!("{} {id} was created from it", kind.name())
            }
            Reason::LatestOfDefinitionUsedBy { kind, id, image_id } => format!(
                "`latest` can resolve to it for {} {id}, which uses {image_id}",
                kind.name()
            ),
            Reason::MayRunFromLatest { kind, id, image_id } => format!(
                "{} {id} was created from {image_id} and Azure records no exact version, so it may run this one",
                kind.name()
            ),
            Reason::Protected { tag } => format!("carries the protect tag {tag}"),
            Reason::TooYoung { age, min_age } => format!(
                "{} old, younger than the grace period of {}",
                human_age(*age),
                human_age(*min_age)
            ),
            Reason::KeepLatest { rank, keep } => {
                format!("newest Succeeded version #{rank} of its definition (keep-latest {keep})")
            }
            Reason::InProgress { state } => format!("{state}: an operation is in progress"),
            Reason::UnknownState { state } => {
                format!("provisioning state {state} is not understood, so it is kept")
            }
            Reason::BlockedBeforeEndOfLife { until } => format!(
                "Azure refuses its deletion {} (blockDeletionBeforeEndOfLife)",
                crate::gallery::lifecycle::until_text(*until)
            ),
            Reason::FailedInSoftDeleteGallery => format!(
                "Failed, and Azure cannot delete a Failed version while the gallery has soft delete on: {}",
                crate::gallery::error::FAILED_IN_SOFT_DELETE_REMEDY
            ),
            Reason::Locked { locks } => format!(
                "a management lock this tool does not own applies to it: {locks}; whoever placed it removes it if the version should go"
            ),
            Reason::UnknownAge => "no published date, so its age cannot be proven".into(),
            Reason::UnknownClock => "Azure's answers carried no Date header, so its age by Azure's clock cannot be proven (the host's clock is not trusted)".into(),
            Reason::UnparseableVersion => {
                "version name is not MAJOR.MINOR.PATCH, so keep-latest cannot rank it".into()
            }
            Reason::NoEvidenceRead => "no evidence source was read".into(),
            Reason::Unused { sources } => {
                format!("no use found in any of {} evidence sources", sources.len())
            }
            Reason::FailedPastGrace => "Failed version past the grace period".into(),
        }
    }
}

/// Compact age: `3d4h`, `5h12m`, `7m`, `12s`.
pub fn human_age(d: Duration) -> String {
    let s = d.as_secs();
    let (days, hours, mins) = (s / 86_400, (s % 86_400) / 3600, (s % 3600) / 60);
    if days > 0 {
        format!("{days}d{hours}h")
    } else if hours > 0 {
        format!("{hours}h{mins}m")
    } else if mins > 0 {
        format!("{mins}m")
    } else {
        format!("{s}s")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanEntry {
    /// The version as observed when planning (the executor compares against it).
    pub observed: ImageVersion,
    /// `director` or `create-env`.
    pub mode: String,
    pub age: Option<Duration>,
    pub verdict: Verdict,
    pub reasons: Vec<Reason>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Ordered by definition, then version (numeric order).
    pub entries: Vec<PlanEntry>,
    /// The evidence sources that were read.
    pub sources: Vec<String>,
    /// Versions whose delete lock is out of line with their references (`gallery::protect`):
    /// held without this tool's lock, or held by the Azure CPI alone and still locked. Empty
    /// when the locks were not read. `--apply` repairs them.
    pub lock_repairs: Vec<String>,
}

impl Plan {
    pub fn count(&self, verdict: Verdict) -> usize {
        self.entries.iter().filter(|e| e.verdict == verdict).count()
    }

    pub fn deletions(&self) -> impl Iterator<Item = &PlanEntry> {
        self.entries.iter().filter(|e| e.verdict == Verdict::Delete)
    }
}

/// Numeric key of a version name (`N`, `N.M`, `N.M.P` → three numbers). Used both for gallery
/// versions and for stemcell versions in evidence.
// TODO(merge): swap to stemcell::version::VersionKey::parse once both branches are merged.
fn numeric_key(v: &str) -> Option<(u64, u64, u64)> {
    let parts: Vec<&str> = v.trim().split('.').collect();
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let mut n = [0u64; 3];
    for (i, p) in parts.iter().enumerate() {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        n[i] = p.parse().ok()?;
    }
    Some((n[0], n[1], n[2]))
}

/// Whether a stemcell version (as BOSH spells it) names this gallery version. Conservative:
/// numeric equality (`1.506` = `1.506.0`), or the same string when either is not numeric.
fn same_version(stemcell_version: &str, gallery_version: &str) -> bool {
    match (numeric_key(stemcell_version), numeric_key(gallery_version)) {
        (Some(a), Some(b)) => a == b,
        _ => stemcell_version.trim() == gallery_version.trim(),
    }
}

fn definition_id_of(version_id: &str) -> &str {
    let lower = version_id.to_ascii_lowercase();
    match lower.rfind("/versions/") {
        Some(pos) => &version_id[..pos],
        None => version_id,
    }
}

fn norm(id: &str) -> String {
    id.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// `director` or `create-env`: our tag, else inferred from the definition name and the
/// configured create-env suffix.
pub fn mode_of(v: &ImageVersion, create_env_suffix: &str) -> String {
    match tags::get(&v.tags, tags::MODE) {
        Some(m) if !m.trim().is_empty() => m.trim().to_string(),
        _ if crate::stemcell::naming::is_create_env_definition(
            &v.definition,
            create_env_suffix,
        ) =>
        {
            "create-env".into()
        }
        _ => "director".into(),
    }
}

fn reason_from(claim: &Claim, usage: Option<Use>) -> Reason {
    match &claim.basis {
        Basis::Reference { refs } => Reason::Referenced { refs: refs.clone() },
        Basis::FileRecord {
            kind,
            file,
            name,
            version,
            cid,
        } => Reason::FileHolds {
            kind: *kind,
            file: file.clone(),
            name: name.clone(),
            version: version.clone(),
            cid: cid.clone(),
            detail: claim.reason.clone(),
        },
        Basis::Consumer { kind, id, image_id } => match usage {
            Some(Use::Latest) => Reason::LatestOfDefinitionUsedBy {
                kind: kind.clone(),
                id: id.clone(),
                image_id: image_id.clone(),
            },
            Some(Use::MayRun) => Reason::MayRunFromLatest {
                kind: kind.clone(),
                id: id.clone(),
                image_id: image_id.clone(),
            },
            Some(Use::Named) | Some(Use::Runs) | None => Reason::UsedByConsumer {
                kind: kind.clone(),
                id: id.clone(),
            },
        },
    }
}

/// Plan the cleanup. Pure and deterministic: the same inputs give the same plan.
pub fn plan(inventory: &Inventory, evidence: &[Evidence], policy: &Policy) -> Plan {
    let versions = &inventory.versions;
    let n = versions.len();
    let index = Index::of(versions);
    let mut reasons = evidence_reasons(versions, evidence, &index);
    let rank = keep_latest_ranks(versions, &index.by_definition);

    let sources: Vec<String> = evidence.iter().map(|e| e.source.clone()).collect();
    let mut entries: Vec<PlanEntry> = Vec::with_capacity(n);
    for (i, v) in versions.iter().enumerate() {
        let rs = std::mem::take(&mut reasons[i]);
        entries.push(judge(v, rs, rank[i], inventory, policy, &sources));
    }
    entries.sort_by(|a, b| {
        (
            &a.observed.definition,
            numeric_key(&a.observed.version),
            &a.observed.version,
        )
            .cmp(&(
                &b.observed.definition,
                numeric_key(&b.observed.version),
                &b.observed.version,
            ))
    });
    let lock_repairs = if inventory.locks_read {
        protect::lock_repairs(versions, &inventory.locks)
    } else {
        Vec::new()
    };
    Plan {
        entries,
        sources,
        lock_repairs,
    }
}

/// Indexes over the inventory (positions in `inventory.versions`).
struct Index {
    by_id: HashMap<String, Vec<usize>>,
    by_cid: HashMap<String, Vec<usize>>,
    by_definition: BTreeMap<String, Vec<usize>>,
    /// Each version's tags under their canonical names.
    canon: Vec<BTreeMap<String, String>>,
    /// Definitions by name, for consumers' references (an ARM id names one; a shared or
    /// community id, by definition name, may name several): the parsed id of one version, and
    /// the versions.
    definitions_named: HashMap<String, Vec<(ImageRef, Vec<usize>)>>,
}

impl Index {
    fn of(versions: &[ImageVersion]) -> Index {
        let mut by_id: HashMap<String, Vec<usize>> = HashMap::new();
        let mut by_cid: HashMap<String, Vec<usize>> = HashMap::new();
        let mut by_definition: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        // Azure tag names are case-insensitive: read `Stemcell_References`, `SG_REFS_00`, ...
        // under the names the rules below look up.
        let canon: Vec<BTreeMap<String, String>> = versions
            .iter()
            .map(|v| tags::canonical_names(&v.tags))
            .collect();
        for (i, v) in versions.iter().enumerate() {
            by_id.entry(norm(&v.id)).or_default().push(i);
            for r in tags::references(&canon[i]) {
                by_cid.entry(r.to_ascii_lowercase()).or_default().push(i);
            }
            by_definition
                .entry(norm(definition_id_of(&v.id)))
                .or_default()
                .push(i);
        }
        let mut definitions_named: HashMap<String, Vec<(ImageRef, Vec<usize>)>> = HashMap::new();
        for idx in by_definition.values() {
            let Some(parsed) = idx.first().and_then(|&i| ImageRef::parse(&versions[i].id)) else {
                continue;
            };
            definitions_named
                .entry(parsed.definition.to_ascii_lowercase())
                .or_default()
                .push((parsed, idx.clone()));
        }
        Index {
            by_id,
            by_cid,
            by_definition,
            canon,
            definitions_named,
        }
    }
}

/// The reasons the evidence gives each version, in source order (`NoEvidenceRead` for all when
/// there is none).
fn evidence_reasons(
    versions: &[ImageVersion],
    evidence: &[Evidence],
    index: &Index,
) -> Vec<Vec<Reason>> {
    let n = versions.len();
    let mut reasons: Vec<Vec<Reason>> = vec![Vec::new(); n];
    let mut add = |i: usize, r: Reason| {
        if !reasons[i].contains(&r) {
            reasons[i].push(r);
        }
    };

    // Evidence, in source order.
    for ev in evidence {
        for claim in &ev.claims {
            if let ClaimTarget::ConsumerImage(consumer) = &claim.target {
                // The one rule for what a consumer protects (`gallery::latest`).
                let Some(reference) = ImageRef::parse(&consumer.image_id) else {
                    continue;
                };
                let candidates = index
                    .definitions_named
                    .get(&reference.definition.to_ascii_lowercase())
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                for (ours, idx) in candidates {
                    if !reference.may_name_definition_of(ours) {
                        continue;
                    }
                    let vs: Vec<&ImageVersion> = idx.iter().map(|&i| &versions[i]).collect();
                    for (k, usage) in latest::uses(consumer, &reference, &vs) {
                        add(idx[k], reason_from(claim, Some(usage)));
                    }
                }
                continue;
            }
            for i in claim_hits(versions, &claim.target, index) {
                add(i, reason_from(claim, None));
            }
        }
    }
    if evidence.is_empty() {
        for i in 0..n {
            add(i, Reason::NoEvidenceRead);
        }
    }
    reasons
}

/// The versions a claim names by version id, cid, or stemcell name and version (a consumer's
/// image is judged by [`evidence_reasons`]).
fn claim_hits(versions: &[ImageVersion], target: &ClaimTarget, index: &Index) -> Vec<usize> {
    let n = versions.len();
    let canon = &index.canon;
    match target {
        ClaimTarget::VersionId(id) => index.by_id.get(&norm(id)).cloned().unwrap_or_default(),
        ClaimTarget::Cid(cid) => index
            .by_cid
            .get(&cid.trim().to_ascii_lowercase())
            .cloned()
            .unwrap_or_default(),
        // Judged in evidence_reasons, never passed here.
        ClaimTarget::ConsumerImage(_) => Vec::new(),
        ClaimTarget::StemcellNameVersion { name, version } => {
            let name_l = name.trim().to_ascii_lowercase();
            (0..n)
                .filter(|&i| {
                    let v = &versions[i];
                    let by_definition = v.definition.to_ascii_lowercase().starts_with(&name_l)
                        && same_version(version, &v.version);
                    let t = &canon[i];
                    let by_tags = tags::is_ours(t)
                        && tags::stemcell_name(t)
                            .is_some_and(|t| t.eq_ignore_ascii_case(name.trim()))
                        && t.get(tags::STEMCELL_VERSION)
                            .is_some_and(|t| same_version(version, t));
                    by_definition || by_tags
                })
                .collect()
        }
    }
}

/// Keep-latest: rank Succeeded versions per definition, newest first (1 is the newest).
fn keep_latest_ranks(
    versions: &[ImageVersion],
    by_definition: &BTreeMap<String, Vec<usize>>,
) -> Vec<Option<usize>> {
    let mut rank: Vec<Option<usize>> = vec![None; versions.len()];
    for idx in by_definition.values() {
        let mut ok: Vec<((u64, u64, u64), usize)> = idx
            .iter()
            .copied()
            .filter(|&i| versions[i].phase().serves_image())
            .filter_map(|i| numeric_key(&versions[i].version).map(|k| (k, i)))
            .collect();
        ok.sort_by(|a, b| b.cmp(a));
        for (r, (_, i)) in ok.into_iter().enumerate() {
            rank[i] = Some(r + 1);
        }
    }
    rank
}

/// One version's entry: the evidence's reasons `rs` and the policy's, and the verdict (delete
/// only when no reason keeps it).
fn judge(
    v: &ImageVersion,
    mut rs: Vec<Reason>,
    rank: Option<usize>,
    inventory: &Inventory,
    policy: &Policy,
    sources: &[String],
) -> PlanEntry {
    let mut push = |r: Reason| {
        if !rs.contains(&r) {
            rs.push(r);
        }
    };
    // Azure tag names are case-insensitive: `Stemcell_Gallery_Protect` protects too.
    if tags::has(&v.tags, &policy.protect_tag) {
        push(Reason::Protected {
            tag: policy.protect_tag.clone(),
        });
    }
    // Ages by Azure's clock (its `Date` header), never the host's.
    let age = match (policy.now, v.published_date) {
        (Some(now), Some(p)) => {
            let secs = (now - p).whole_seconds();
            Some(Duration::from_secs(u64::try_from(secs).unwrap_or(0)))
        }
        _ => None,
    };
    match (age, policy.now) {
        (Some(age), _) if age < policy.min_age => push(Reason::TooYoung {
            age,
            min_age: policy.min_age,
        }),
        (Some(_), _) => {}
        (None, None) => push(Reason::UnknownClock),
        (None, Some(_)) => push(Reason::UnknownAge),
    }
    match v.phase().cleanup_hold() {
        Some(CleanupHold::InProgress) => push(Reason::InProgress {
            state: v.provisioning_state.clone(),
        }),
        Some(CleanupHold::UnknownState) => push(Reason::UnknownState {
            state: v.provisioning_state.clone(),
        }),
        None => {}
    }
    if let Some(until) = v.deletion_blocked(policy.now) {
        push(Reason::BlockedBeforeEndOfLife { until });
    }
    if v.phase().undeletable_under_soft_delete() && inventory.soft_delete.is_some() {
        push(Reason::FailedInSoftDeleteGallery);
    }
    let others = protect::others(&inventory.locks, &v.id);
    if !others.is_empty() {
        push(Reason::Locked {
            locks: protect::describe_all(&others),
        });
    }
    if numeric_key(&v.version).is_none() {
        push(Reason::UnparseableVersion);
    }
    if let Some(r) = rank {
        if r <= policy.keep_latest {
            push(Reason::KeepLatest {
                rank: r,
                keep: policy.keep_latest,
            });
        }
    }
    let verdict = if rs.iter().any(Reason::keeps) {
        Verdict::Keep
    } else {
        rs.push(Reason::Unused {
            sources: sources.to_vec(),
        });
        if v.phase().failed() {
            rs.push(Reason::FailedPastGrace);
        }
        Verdict::Delete
    };
    PlanEntry {
        observed: v.clone(),
        mode: mode_of(v, &policy.create_env_suffix),
        age,
        verdict,
        reasons: rs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stemcell_versions_match_gallery_keys_numerically() {
        assert!(same_version("1.506", "1.506.0"));
        assert!(same_version("621", "621.0.0"));
        assert!(same_version("1.2.3", "1.2.3"));
        assert!(!same_version("1.506", "1.507.0"));
        assert!(!same_version("1.2.3.4", "1.2.3"));
        assert!(same_version("1.2.3.4", "1.2.3.4"));
    }

    /// A Succeeded, untagged version 1.0.0 of `definition` in gallery `g`.
    fn version_in(definition: &str, published: Option<time::OffsetDateTime>) -> ImageVersion {
        ImageVersion {
            id: format!("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/images/{definition}/versions/1.0.0"),
            definition: definition.into(),
            version: "1.0.0".into(),
            location: "westeurope".into(),
            provisioning_state: ProvisioningState::Succeeded,
            tags: BTreeMap::new(),
            source_uri: None,
            storage_account_id: None,
            published_date: published,
            target_regions: vec![],
            exclude_from_latest: false,
            replication: None,
            safety: Default::default(),
        }
    }

    const LONG_AGO: time::OffsetDateTime = time::macros::datetime!(2020-01-01 00:00:00 UTC);

    /// `v` alone in the inventory, one evidence source that shows no use, and a policy 400 days
    /// after [`LONG_AGO`] that keeps no latest: nothing but `v`'s own state keeps it.
    fn old_and_unused(v: ImageVersion) -> (Inventory, Vec<Evidence>, Policy) {
        let inventory = Inventory {
            gallery: "g".into(),
            versions: vec![v],
            ..Inventory::default()
        };
        let evidence = vec![Evidence {
            source: "s".into(),
            claims: vec![],
            holder: None,
        }];
        let mut policy = Policy::new(LONG_AGO + time::Duration::days(400));
        policy.keep_latest = 0;
        (inventory, evidence, policy)
    }

    /// Issue 30 item 4: Azure cannot delete a Failed version while the gallery has soft delete
    /// on, so an unused one is kept there (with the remedy), and deleted where it is off.
    #[test]
    fn an_unused_failed_version_is_kept_only_where_soft_delete_is_on() {
        let mut v = version_in("d", Some(LONG_AGO));
        v.provisioning_state = ProvisioningState::Failed;
        let (mut inventory, evidence, policy) = old_and_unused(v);
        assert_eq!(
            plan(&inventory, &evidence, &policy).entries[0].verdict,
            Verdict::Delete
        );
        inventory.soft_delete = Some(crate::gallery::model::SoftDelete {
            retention_days: Some(7),
        });
        let planned = plan(&inventory, &evidence, &policy);
        assert_eq!(planned.entries[0].verdict, Verdict::Keep);
        assert_eq!(
            planned.entries[0].reasons,
            vec![Reason::FailedInSoftDeleteGallery]
        );
    }

    #[test]
    fn without_azures_clock_no_version_is_old_enough_to_delete() {
        let (inventory, evidence, mut policy) = old_and_unused(version_in("d", Some(LONG_AGO)));
        assert_eq!(
            plan(&inventory, &evidence, &policy).entries[0].verdict,
            Verdict::Delete
        );
        policy.now = None;
        let planned = plan(&inventory, &evidence, &policy);
        assert_eq!(planned.entries[0].verdict, Verdict::Keep);
        assert_eq!(planned.entries[0].reasons, vec![Reason::UnknownClock]);
    }

    #[test]
    fn ages_render_compactly() {
        assert_eq!(
            human_age(Duration::from_secs(3 * 86_400 + 4 * 3600)),
            "3d4h"
        );
        assert_eq!(human_age(Duration::from_secs(5 * 3600 + 720)), "5h12m");
        assert_eq!(human_age(Duration::from_secs(59)), "59s");
    }

    #[test]
    fn an_untagged_version_in_a_definition_with_the_configured_suffix_is_shown_as_create_env() {
        let mut v = version_in("x-gen2-ce", None);
        assert_eq!(mode_of(&v, "-ce"), "create-env");
        assert_eq!(mode_of(&v, "-create-env"), "director");
        v.definition = "x-gen2-create-env".into();
        assert_eq!(mode_of(&v, "-create-env"), "create-env");
    }
}
