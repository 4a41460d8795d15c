//! `references prune`: which references recorded on the gallery's versions no BOSH record holds
//! any more. A pure planner (inventory + evidence → plan), like the cleanup planner; the use case
//! in `app::references` reads the evidence and applies the plan.
//!
//! Only a stemcell CID (`bosh-stemcell-<uuid>`) can be pruned: that is what a director's stemcell
//! list and a create-env `bosh-state.json` record, so only for a CID can the evidence say "no one
//! holds it". A free-form reference (`seed --reference pipeline-x`) is held by whoever recorded it
//! and is removed with `delete --reference`. Only Succeeded versions are pruned: a version being
//! created or updated is gaining its reference right now, and a Failed one hands its references to
//! its replacement.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::evidence::{Basis, ClaimTarget, Evidence, EvidenceFile, FileKind};
use super::inventory::Inventory;
use crate::gallery::{tags, ImageVersion};

/// Why a reference stays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keep {
    /// A director list or create-env state holds the CID (`why` names the file and the stemcell).
    Held { why: String },
    /// Not a stemcell CID: no BOSH record can show it held or not.
    NotACid,
    /// The version is not Succeeded (being created, updated, or Failed).
    NotSettled { state: String },
    /// `--apply` with a saved plan: the plan did not see this reference on the version, so it
    /// may have been recorded after the director lists were queried.
    NotInSavedPlan,
    /// Its holder (who recorded it, `gallery::record`) gave no list of its own: another
    /// director's list cannot show it let go of its stemcell.
    HolderNotGiven { holder: String },
}

impl Keep {
    pub fn kind(&self) -> &'static str {
        match self {
            Keep::Held { .. } => "held",
            Keep::NotACid => "not-a-cid",
            Keep::NotSettled { .. } => "not-settled",
            Keep::NotInSavedPlan => "not-in-saved-plan",
            Keep::HolderNotGiven { .. } => "holder-not-given",
        }
    }

    pub fn detail(&self) -> String {
        match self {
            Keep::Held { why } => why.clone(),
            Keep::NotACid => "not a stemcell CID: no director list or create-env state can show it unused (remove it with `delete --reference`)".into(),
            Keep::NotSettled { state } => format!(
                "the version is {state}: its references are changing right now; prune again once it is Succeeded"
            ),
            Keep::NotInSavedPlan => "recorded after the saved plan was made (or not in it): the director lists may not show it yet; plan again and save the lists after the plan to prune it".into(),
            Keep::HolderNotGiven { holder } => format!(
                "held by {holder}, whose stemcell list was not given: give it as --director-stemcells {}=FILE (or its create-env state) to prune its references",
                holder.strip_prefix("director:").unwrap_or(holder)
            ),
        }
    }
}

/// One reference's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefVerdict {
    Keep(Keep),
    /// No evidence holds it: remove it.
    Prune,
}

impl RefVerdict {
    pub fn as_str(&self) -> &'static str {
        match self {
            RefVerdict::Keep(_) => "keep",
            RefVerdict::Prune => "prune",
        }
    }

    pub fn detail(&self) -> String {
        match self {
            RefVerdict::Keep(k) => k.detail(),
            RefVerdict::Prune => {
                "no director list or create-env state given holds this stemcell CID".into()
            }
        }
    }
}

/// One version and the verdict on each of its references.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneEntry {
    pub observed: ImageVersion,
    pub references: Vec<(String, RefVerdict)>,
    /// Who holds each reference, as the version's record says (absent: not known).
    pub holders: BTreeMap<String, String>,
}

impl PruneEntry {
    /// The references to remove.
    pub fn to_prune(&self) -> Vec<String> {
        self.references
            .iter()
            .filter(|(_, v)| *v == RefVerdict::Prune)
            .map(|(r, _)| r.clone())
            .collect()
    }
}

/// Every referenced version, with a verdict per reference.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PrunePlan {
    pub entries: Vec<PruneEntry>,
    /// The evidence sources read.
    pub sources: Vec<String>,
}

impl PrunePlan {
    pub fn references(&self) -> usize {
        self.entries.iter().map(|e| e.references.len()).sum()
    }

    pub fn prune_count(&self) -> usize {
        self.entries.iter().map(|e| e.to_prune().len()).sum()
    }
}

/// Plan a prune: every reference of every version, kept when a director list or create-env state
/// holds its CID (compared case-insensitively, erring towards keeping), when it is not a CID, or
/// when the version is not Succeeded; pruned otherwise. Claims other than CIDs (stemcell name and
/// version, consumers, the references themselves) say nothing about who holds a CID and are
/// ignored here: cleanup weighs them before deleting a version.
pub fn plan_prune(inventory: &Inventory, evidence: &[Evidence]) -> PrunePlan {
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    // Holders whose own list (or create-env state) was given: only for them can the records
    // show a reference let go.
    let covered: BTreeSet<&str> = evidence
        .iter()
        .filter_map(|e| e.holder.as_deref())
        .collect();
    for e in evidence {
        for c in &e.claims {
            let from_bosh = matches!(c.basis, Basis::FileRecord { .. });
            if let (ClaimTarget::Cid(cid), true) = (&c.target, from_bosh) {
                held.entry(cid.to_ascii_lowercase())
                    .or_insert_with(|| c.reason.clone());
            }
        }
    }
    let mut entries = Vec::new();
    for v in &inventory.versions {
        // Tag names are case-insensitive in Azure (`Stemcell_References` counts).
        let refs = tags::references(&tags::canonical_names(&v.tags));
        if refs.is_empty() {
            continue;
        }
        let settled = v.phase().serves_image();
        let mut holders = BTreeMap::new();
        let references = refs
            .into_iter()
            .map(|r| {
                let holder = inventory.holder_of(&v.id, &r);
                if let Some(h) = holder {
                    holders.insert(r.clone(), h.to_string());
                }
                let verdict = if let Some(why) = held.get(&r.to_ascii_lowercase()) {
                    RefVerdict::Keep(Keep::Held { why: why.clone() })
                } else if !tags::is_cid(&r) {
                    RefVerdict::Keep(Keep::NotACid)
                } else if !settled {
                    RefVerdict::Keep(Keep::NotSettled {
                        state: v.provisioning_state.as_str().to_string(),
                    })
                } else if let Some(h) = holder.filter(|h| !covered.contains(h)) {
                    RefVerdict::Keep(Keep::HolderNotGiven {
                        holder: h.to_string(),
                    })
                } else {
                    RefVerdict::Prune
                };
                (r, verdict)
            })
            .collect();
        entries.push(PruneEntry {
            observed: v.clone(),
            references,
            holders,
        });
    }
    entries.sort_by(|a, b| {
        (&a.observed.definition, version_order(&a.observed.version))
            .cmp(&(&b.observed.definition, version_order(&b.observed.version)))
    });
    PrunePlan {
        entries,
        sources: evidence.iter().map(|e| e.source.clone()).collect(),
    }
}

/// How long after a saved plan a director list must have been saved. A CID appears on a version
/// (the CPI's tags write) a moment before the director records the stemcell in its database (when
/// the CPI call returns); a list queried in between would not show it. The version is Creating or
/// Updating during the write itself (never pruned), so the moment is the CPI's exit and the
/// director's insert: seconds. A minute bounds it with room to spare.
pub const PLAN_TO_LIST_GAP: Duration = Duration::from_secs(60);

/// A saved dry run of `references prune` (`--output json`): when it was planned, and which
/// references it saw on which version. Applying with it prunes only references the plan saw,
/// against director lists saved at least [`PLAN_TO_LIST_GAP`] after it: a stemcell uploaded
/// after a list was queried is then either not in the plan (kept) or in a list saved after it
/// (held). Without a plan nothing tells a CID the director deleted from one it recorded after its
/// list was saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedPrune {
    /// When the saved run started, before it read the gallery (this host's clock, the clock
    /// director list files are dated by).
    pub planned_at: SystemTime,
    /// Version id (lower case) → references seen on it (lower case).
    pub seen: BTreeMap<String, BTreeSet<String>>,
    /// The BOSH records the plan read: an apply must be given every one of them again.
    pub inputs: Vec<PruneInput>,
}

/// One BOSH record a prune read.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct PruneInput {
    /// The flag that gave it ([`FileKind::flag`]): `director-stemcells`, `create-env-state`.
    pub kind: String,
    /// The file, as an absolute path when it could be resolved.
    pub path: String,
    /// Whose records it holds, when given (`--director-stemcells HOLDER=FILE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

impl PruneInput {
    /// The input `file` (its path resolved to an absolute path when it exists).
    pub fn new(file: &EvidenceFile) -> Self {
        let path = std::fs::canonicalize(&file.path)
            .unwrap_or_else(|_| file.path.clone())
            .display()
            .to_string();
        PruneInput {
            kind: file.kind.flag().to_string(),
            path,
            holder: file.holder.clone(),
        }
    }

    /// How an operator gives it: `--director-stemcells [HOLDER=]FILE`, `--create-env-state FILE`.
    pub fn describe(&self) -> String {
        let takes_holder = FileKind::from_flag(&self.kind).is_some_and(FileKind::takes_holder);
        match &self.holder {
            Some(h) if takes_holder => format!(
                "--{} {}={}",
                self.kind,
                h.strip_prefix("director:").unwrap_or(h),
                self.path
            ),
            _ => format!("--{} {}", self.kind, self.path),
        }
    }
}

impl SavedPrune {
    /// Read a saved dry run. `Err` says what is wrong with it.
    pub fn parse(doc: &Value) -> Result<SavedPrune, String> {
        if doc.get("applied") != Some(&Value::Bool(false)) {
            return Err("it is not the JSON of a references prune dry run (`references prune --output json` without --apply)".into());
        }
        let planned_at = doc.get("planned_at").and_then(Value::as_str).ok_or(
            "it has no \"planned_at\" (saved by an older release? plan again with this one)",
        )?;
        let planned_at =
            time::OffsetDateTime::parse(planned_at, &time::format_description::well_known::Rfc3339)
                .map_err(|e| {
                    format!("its \"planned_at\" {planned_at:?} is not an RFC 3339 time: {e}")
                })?;
        let versions = doc
            .get("versions")
            .and_then(Value::as_array)
            .ok_or("it has no \"versions\" list")?;
        let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (i, v) in versions.iter().enumerate() {
            let id = v
                .get("id")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("versions[{i}] has no string \"id\""))?;
            let refs = v
                .get("references")
                .and_then(Value::as_array)
                .ok_or_else(|| format!("versions[{i}] has no \"references\" list"))?;
            let mut set = BTreeSet::new();
            for (j, r) in refs.iter().enumerate() {
                let r = r.get("reference").and_then(Value::as_str).ok_or_else(|| {
                    format!("versions[{i}].references[{j}] has no string \"reference\"")
                })?;
                set.insert(r.to_ascii_lowercase());
            }
            seen.entry(id.to_ascii_lowercase()).or_default().extend(set);
        }
        let inputs = doc
            .get("inputs")
            .ok_or("it has no \"inputs\" (saved by an older release? plan again with this one)")?;
        let inputs: Vec<PruneInput> = serde_json::from_value(inputs.clone())
            .map_err(|e| format!("its \"inputs\" are not a list of records read: {e}"))?;
        Ok(SavedPrune {
            planned_at: planned_at.into(),
            seen,
            inputs,
        })
    }

    /// Read and parse `path`.
    pub fn read(path: &Path) -> Result<SavedPrune, String> {
        Self::parse(&super::saved::read_json(path)?)
    }

    /// Whether `t` is at least [`PLAN_TO_LIST_GAP`] after the plan: when a director list saved
    /// then may be weighed against it, and when the plan may be applied.
    pub fn at_least_gap_after(&self, t: SystemTime) -> bool {
        t >= self.planned_at + PLAN_TO_LIST_GAP
    }

    /// The records this plan read that `given` lacks (an apply must read every one again: a
    /// list left out would let its director's references look unheld).
    pub fn missing_inputs(&self, given: &[PruneInput]) -> Vec<&PruneInput> {
        self.inputs.iter().filter(|i| !given.contains(i)).collect()
    }

    /// Keep every reference `plan` would prune that this saved plan did not see on its version.
    pub fn restrict(&self, plan: &mut PrunePlan) {
        for e in &mut plan.entries {
            let seen = self.seen.get(&e.observed.id.to_ascii_lowercase());
            for (r, verdict) in &mut e.references {
                let was_seen = seen.is_some_and(|s| s.contains(&r.to_ascii_lowercase()));
                if *verdict == RefVerdict::Prune && !was_seen {
                    *verdict = RefVerdict::Keep(Keep::NotInSavedPlan);
                }
            }
        }
    }
}

fn version_order(v: &str) -> (Option<semver::Version>, String) {
    (semver::Version::parse(v).ok(), v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cleanup::evidence::Claim;
    use crate::gallery::ProvisioningState;

    const HELD: &str = "bosh-stemcell-11111111-1111-4111-8111-111111111111";
    const GONE: &str = "bosh-stemcell-22222222-2222-4222-8222-222222222222";
    const CE: &str = "bosh-stemcell-33333333-3333-4333-8333-333333333333";

    fn version(key: &str, state: ProvisioningState, refs: &[&str]) -> ImageVersion {
        let mut tags = BTreeMap::new();
        tags.insert(tags::CPI_REFERENCES.to_string(), refs.join(","));
        ImageVersion {
            id: format!("/x/images/d/versions/{key}"),
            definition: "d".into(),
            version: key.into(),
            location: "westeurope".into(),
            provisioning_state: state,
            tags,
            source_uri: None,
            storage_account_id: None,
            published_date: None,
            target_regions: vec![],
            exclude_from_latest: false,
            replication: None,
            safety: Default::default(),
        }
    }

    fn claim(cid: &str, basis: Basis) -> Claim {
        Claim {
            target: ClaimTarget::Cid(cid.into()),
            basis,
            reason: format!("holds {cid}"),
            source: "s".into(),
        }
    }

    fn director(cid: &str) -> Claim {
        claim(
            cid,
            Basis::FileRecord {
                kind: FileKind::DirectorStemcells,
                file: "d.json".into(),
                name: "n".into(),
                version: "1".into(),
                cid: cid.into(),
            },
        )
    }

    fn inventory(versions: Vec<ImageVersion>) -> Inventory {
        Inventory {
            gallery: "g".into(),
            versions,
            ..Inventory::default()
        }
    }

    fn evidence(claims: Vec<Claim>) -> Vec<Evidence> {
        vec![Evidence {
            source: "s".into(),
            claims,
            holder: None,
        }]
    }

    #[test]
    fn a_cid_no_evidence_holds_is_pruned_and_a_held_one_kept() {
        let inv = inventory(vec![version(
            "1.0.0",
            ProvisioningState::Succeeded,
            &[HELD, GONE],
        )]);
        let upper = HELD
            .to_ascii_uppercase()
            .replace("BOSH-STEMCELL-", "bosh-stemcell-");
        let p = plan_prune(&inv, &evidence(vec![director(&upper)]));
        assert_eq!(p.entries.len(), 1);
        assert_eq!(p.entries[0].to_prune(), vec![GONE.to_string()]);
        assert_eq!(p.prune_count(), 1);
        assert_eq!(p.references(), 2);
        assert!(matches!(
            p.entries[0].references[0].1,
            RefVerdict::Keep(Keep::Held { .. })
        ));
    }

    #[test]
    fn create_env_state_holds_too_and_other_claims_do_not() {
        let inv = inventory(vec![version(
            "1.0.0",
            ProvisioningState::Succeeded,
            &[CE, GONE],
        )]);
        let ce = claim(
            CE,
            Basis::FileRecord {
                kind: FileKind::CreateEnvState,
                file: "bosh-state.json".into(),
                name: "n".into(),
                version: "1".into(),
                cid: CE.into(),
            },
        );
        // A claim on the CID from the references themselves is no BOSH record.
        let own = claim(
            GONE,
            Basis::Reference {
                refs: vec![GONE.into()],
            },
        );
        let p = plan_prune(&inv, &evidence(vec![ce, own]));
        assert_eq!(p.entries[0].to_prune(), vec![GONE.to_string()]);
    }

    #[test]
    fn free_form_references_and_unsettled_versions_are_never_pruned() {
        let inv = inventory(vec![
            version("1.0.0", ProvisioningState::Succeeded, &["pipeline-x"]),
            version("2.0.0", ProvisioningState::Creating, &[GONE]),
            version("3.0.0", ProvisioningState::Failed, &[GONE]),
            version("4.0.0", ProvisioningState::Succeeded, &[]),
        ]);
        let p = plan_prune(&inv, &evidence(vec![]));
        assert_eq!(p.prune_count(), 0);
        assert_eq!(
            p.entries.len(),
            3,
            "a version without references is not listed"
        );
        let kinds: Vec<&str> = p
            .entries
            .iter()
            .map(|e| match &e.references[0].1 {
                RefVerdict::Keep(k) => k.kind(),
                RefVerdict::Prune => "prune",
            })
            .collect();
        assert_eq!(kinds, vec!["not-a-cid", "not-settled", "not-settled"]);
    }

    /// The dry run's JSON as `references prune --output json` prints it (the fields read back).
    fn saved(planned_at: &str, versions: &[(&str, &[&str])]) -> Value {
        serde_json::json!({
            "applied": false,
            "inputs": [],
            "planned_at": planned_at,
            "versions": versions.iter().map(|(id, refs)| serde_json::json!({
                "id": id,
                "references": refs.iter().map(|r| serde_json::json!({"reference": r, "verdict": "prune"})).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })
    }

    #[test]
    fn with_a_saved_plan_only_references_it_saw_are_pruned() {
        // The director uploaded LATE after its list was saved: the tags have it, the list does
        // not. The saved plan (made before the list) did not see it, so it stays.
        const LATE: &str = "bosh-stemcell-44444444-4444-4444-8444-444444444444";
        let inv = inventory(vec![version(
            "1.0.0",
            ProvisioningState::Succeeded,
            &[HELD, GONE, LATE],
        )]);
        let mut p = plan_prune(&inv, &evidence(vec![director(HELD)]));
        assert_eq!(p.prune_count(), 2, "without a plan LATE would go");
        let doc = saved(
            "2026-12-02T08:00:00Z",
            &[(
                "/X/images/d/versions/1.0.0",
                &[HELD, &GONE.to_ascii_uppercase()],
            )],
        );
        let s = SavedPrune::parse(&doc).unwrap();
        s.restrict(&mut p);
        assert_eq!(p.entries[0].to_prune(), vec![GONE.to_string()]);
        let late = &p.entries[0]
            .references
            .iter()
            .find(|(r, _)| r == LATE)
            .unwrap()
            .1;
        assert_eq!(late, &RefVerdict::Keep(Keep::NotInSavedPlan));
        // A version the plan never saw keeps everything.
        let mut p = plan_prune(&inv, &evidence(vec![]));
        SavedPrune::parse(&saved("2026-12-02T08:00:00Z", &[]))
            .unwrap()
            .restrict(&mut p);
        assert_eq!(p.prune_count(), 0);
    }

    #[test]
    fn a_list_counts_only_when_saved_a_minute_after_the_plan() {
        let s = SavedPrune::parse(&saved("2026-12-02T08:00:00Z", &[])).unwrap();
        let at = |secs: u64| s.planned_at + Duration::from_secs(secs);
        assert!(!s.at_least_gap_after(s.planned_at - Duration::from_secs(1)));
        assert!(!s.at_least_gap_after(at(59)));
        assert!(s.at_least_gap_after(at(60)));
        assert!(s.at_least_gap_after(at(3600)));
    }

    #[test]
    fn a_saved_plan_that_is_not_a_dry_run_of_this_release_is_refused_with_the_reason() {
        let mut applied = saved("2026-12-02T08:00:00Z", &[]);
        applied["applied"] = Value::Bool(true);
        assert!(SavedPrune::parse(&applied).unwrap_err().contains("dry run"));
        let mut old = saved("2026-12-02T08:00:00Z", &[]);
        old.as_object_mut().unwrap().remove("planned_at");
        assert!(SavedPrune::parse(&old).unwrap_err().contains("planned_at"));
        let bad = saved("yesterday", &[]);
        assert!(SavedPrune::parse(&bad).unwrap_err().contains("RFC 3339"));
        let mut no_refs = saved("2026-12-02T08:00:00Z", &[("/x", &[])]);
        no_refs["versions"][0]
            .as_object_mut()
            .unwrap()
            .remove("references");
        assert!(SavedPrune::parse(&no_refs)
            .unwrap_err()
            .contains("references"));
    }
}
