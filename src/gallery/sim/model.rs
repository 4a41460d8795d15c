//! The model: what was acknowledged, per gallery, version and life of that version. The
//! promises it holds the code to are docs/references.md's and issue 44's:
//!
//! - a reference a command acknowledged (it returned `Ok`) is held until a removal of it is
//!   acknowledged (`acked`); one whose command failed, crashed or is still running may or may not
//!   be (`maybe`);
//! - the CIDs plain Azure CPIs hold live in `stemcell_references` (`cpi`): appended by the
//!   simulated CPI, or handed back to it;
//! - a version has lives: one ends when the version is deleted by anyone (but the tool's own
//!   replacement of a Failed version, which carries its references on purpose, and a soft delete,
//!   which a restore undoes); a new life starts with no references.

use std::collections::{BTreeMap, BTreeSet};

use super::commands::Cmd;
use super::probe::{OpId, VersionAt};

/// One version of one gallery, in its current life.
#[derive(Debug, Clone, Default)]
pub struct VersionModel {
    pub life: u32,
    /// Acknowledged references this tool holds, with their holder.
    pub acked: BTreeMap<String, Option<String>>,
    /// CIDs plain Azure CPIs hold (in `stemcell_references`).
    pub cpi: BTreeSet<String>,
    /// References that may or may not be held (a command on them failed, crashed, or runs).
    pub maybe: BTreeSet<String>,
    /// References whose removal was acknowledged in this life.
    pub removed: BTreeSet<String>,
    /// References of earlier lives (to name where an invented one came from).
    pub past: BTreeSet<String>,
    /// References of the life that ended last.
    pub last_life: BTreeSet<String>,
    /// A tool `ensure` deleted this Failed version to make it again: its next create by the
    /// tool continues this life.
    pub carry_pending: bool,
    /// A tool `ensure` replacing this Failed version sent its DELETE after someone else had
    /// deleted it (in the instant between its note and its DELETE; Azure answers a DELETE of
    /// a missing version as a success): what it noted may be carried into the version it
    /// creates next (the known window of docs/RELIABILITY.md).
    pub carried_unknowingly: BTreeSet<String>,
    /// Both record copies damaged (until the operator repairs them): decisions must refuse.
    pub record_broken: bool,
    /// A stale write (a late tool write, or a plain CPI's read-modify-write) dropped the
    /// sentinel; the next tool write puts it back (docs/RELIABILITY.md's remaining window (1)).
    pub stale_sentinel: bool,
    /// CIDs a plain CPI removed in this life (they stay removed: docs/references.md).
    pub cpi_gone: BTreeSet<String>,
    /// A tag write over tags its writer had not read (late, or blind) reached this life: what
    /// it brings back of a plain CPI's removals is the known window, not a violation.
    pub stale_tags: bool,
    /// Soft-deleted now (until a restore): listed by Azure without its tags.
    pub suspended: bool,
}

impl VersionModel {
    /// A new life starts (the version was created): nothing of the old one is held. What
    /// commands that failed or crashed since the last life ended may have recorded stays
    /// possible (a create records its reference before the PUT).
    pub fn new_life(&mut self, running: &BTreeSet<String>) {
        let maybe = std::mem::take(&mut self.maybe);
        self.end_life(running);
        self.maybe = maybe;
        self.life += 1;
    }

    /// The life ends (the version was deleted for good): nothing of it is held any more.
    pub fn end_life(&mut self, running: &BTreeSet<String>) {
        let old: Vec<String> = self
            .acked
            .keys()
            .cloned()
            .chain(self.cpi.iter().cloned())
            .chain(self.removed.iter().cloned())
            .chain(self.maybe.iter().cloned())
            // A plain CPI's removed CID a stale write may have put back (the known window).
            .chain(self.cpi_gone.iter().cloned())
            .collect();
        self.last_life = old.iter().cloned().collect();
        self.past.extend(old);
        self.acked.clear();
        self.cpi.clear();
        self.removed.clear();
        self.maybe.retain(|r| running.contains(r));
        self.cpi_gone.clear();
        self.carry_pending = false;
        self.carried_unknowingly.clear();
        self.stale_sentinel = false;
        self.stale_tags = false;
        self.suspended = false;
    }

    /// Every reference of this life that may legitimately show.
    pub fn allowed(&self, r: &str) -> bool {
        self.acked.contains_key(r) || self.cpi.contains(r) || self.maybe.contains(r)
    }
}

/// A command running, and what it started from.
#[derive(Debug, Clone)]
pub struct Running {
    pub cmd: Cmd,
    /// The command it re-runs (after that one failed or crashed).
    pub rerun_of: Option<OpId>,
    /// For a removal: the references it removes that were acknowledged when it started (and
    /// their holders), per version.
    pub was_acked: BTreeMap<VersionAt, BTreeMap<String, Option<String>>>,
    /// For a removal: the CIDs it removes that plain CPIs held when it started, per version.
    pub was_cpi: BTreeMap<VersionAt, BTreeSet<String>>,
    /// A record had both copies damaged while it ran.
    pub saw_damage: bool,
    /// For a hand-back: the CIDs of its holder acknowledged when it started, per version.
    pub holders_cids: BTreeMap<VersionAt, BTreeSet<String>>,
    /// Versions whose life ended or began (by someone else) while it ran: what it
    /// acknowledges there may have gone with the life it wrote to.
    pub life_changed_under: BTreeSet<VersionAt>,
    /// Versions soft-deleted (by anyone) while it ran: Azure lists them without their tags, so
    /// a search by CID cannot see what they hold until they are restored.
    pub suspended_under: BTreeSet<VersionAt>,
}

#[derive(Default)]
pub struct Model {
    pub versions: BTreeMap<VersionAt, VersionModel>,
    pub running: BTreeMap<OpId, Running>,
    /// References only an injected (invalid) intent named: never acknowledged by anyone.
    pub injected: BTreeSet<String>,
    /// References whose removal a command asked for and then ended unanswered (it crashed):
    /// its removal, recorded before its tag write, may be applied by any later write.
    pub removal_unanswered: BTreeSet<String>,
    /// Every reference ever used per gallery (to name another gallery's reference).
    pub used: BTreeMap<usize, BTreeSet<String>>,
    /// Every holder a command asked for a reference, per gallery: when two ask different
    /// holders at once, the first recorded stays (a recorded holder is not replaced).
    pub holders_asked: BTreeMap<(usize, String), BTreeSet<String>>,
}

impl Model {
    pub fn version(&mut self, at: &VersionAt) -> &mut VersionModel {
        self.versions.entry(at.clone()).or_default()
    }

    pub fn get(&self, at: &VersionAt) -> Option<&VersionModel> {
        self.versions.get(at)
    }

    /// The references the running commands of gallery `g` decide.
    pub fn running_refs(&self, g: usize) -> BTreeSet<String> {
        self.running
            .values()
            .filter(|r| r.cmd.gallery() == g)
            .flat_map(|r| r.cmd.touches())
            .collect()
    }

    /// Whether a command of gallery `g` runs.
    pub fn busy(&self, g: usize) -> bool {
        self.running.values().any(|r| r.cmd.gallery() == g)
    }

    /// The versions of gallery `g` (as modelled) that hold `r` in any way this life.
    pub fn versions_holding(&self, g: usize, r: &str) -> Vec<VersionAt> {
        self.versions
            .iter()
            .filter(|(at, vm)| at.0 == g && vm.allowed(r))
            .map(|(at, _)| at.clone())
            .collect()
    }

    /// Where an unexpected reference `r` seen on `at` came from, for the violation's text.
    pub fn provenance(&self, at: &VersionAt, r: &str) -> String {
        let mut why = Vec::new();
        if self.injected.contains(r) {
            why.push("only an injected invalid intent named it".to_string());
        }
        if self.get(at).is_some_and(|vm| vm.past.contains(r)) {
            why.push("it was held in an earlier life of this version".to_string());
        }
        if self.get(at).is_some_and(|vm| vm.removed.contains(r)) {
            why.push("its removal was acknowledged".to_string());
        }
        for (g, used) in &self.used {
            if *g != at.0 && used.contains(r) {
                why.push(format!("it is a reference of gallery g{g}"));
            }
        }
        if why.is_empty() {
            "never acknowledged".into()
        } else {
            why.join("; ")
        }
    }

    /// CID `c`, held by a plain CPI on `at`, was lost by a write the tool cannot be blamed for
    /// (another plain CPI's stale write, or a known window): no one holds it any more.
    pub fn cpi_lost(&mut self, at: &VersionAt, c: &str) {
        let vm = self.version(at);
        vm.cpi.remove(c);
        vm.cpi_gone.insert(c.to_string());
        // A CID of the tool's that a hand-back not yet acknowledged moved there.
        if vm.acked.remove(c).is_some() {
            vm.maybe.insert(c.to_string());
        }
        for r in self.running.values_mut() {
            if let Some(set) = r.was_cpi.get_mut(at) {
                set.remove(c);
            }
        }
    }

    /// The life of `at` ended or a new one began: what running commands held there when they
    /// started is not held any more (nothing of it is restored when they end).
    pub fn life_changed(&mut self, at: &VersionAt) {
        for r in self.running.values_mut() {
            r.was_acked.remove(at);
            r.was_cpi.remove(at);
            r.holders_cids.remove(at);
            r.life_changed_under.insert(at.clone());
        }
    }

    /// Version `at` was soft-deleted: running commands may not see what it holds.
    pub fn suspended(&mut self, at: &VersionAt) {
        for r in self.running.values_mut() {
            r.suspended_under.insert(at.clone());
        }
    }

    /// The CIDs plain CPIs hold on `at`, those a running command is removing included.
    pub fn cpi_held(&self, at: &VersionAt) -> BTreeSet<String> {
        let mut held: BTreeSet<String> = self.get(at).map(|vm| vm.cpi.clone()).unwrap_or_default();
        for r in self.running.values() {
            held.extend(r.was_cpi.get(at).into_iter().flatten().cloned());
        }
        held
    }

    /// Whether any record had both copies damaged while a command ran (it may have failed for
    /// that, and legitimately).
    pub fn note_damage(&mut self) {
        for r in self.running.values_mut() {
            r.saw_damage = true;
        }
    }

    pub fn note_used(&mut self, g: usize, r: &str) {
        self.used.entry(g).or_default().insert(r.to_string());
    }
}
