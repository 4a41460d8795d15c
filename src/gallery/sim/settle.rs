//! What a finished command means for the model, and the checks on its answer:
//!
//! - an `ensure` that returned `Ok` acknowledged its reference; given `--holder H` for a
//!   reference recorded without one, the record names H (issue 44 item 7);
//! - a removal that answered "not recorded" (exit 3) for a reference that was acknowledged is a
//!   lost reference; for one a removal already took (the record says removed), a retry must
//!   answer already-removed, exit 0 (item 7);
//! - `delete --cid` that finds no version for an acknowledged CID (exit 3; the CPI answers
//!   `StemcellNotFound`, which bosh takes as deleted) loses it (item 5);
//! - a hand-back that ended without a failure moved every CID of its holder it saw to
//!   `stemcell_references` (item 4), and did not skip a version it could not read (item 5);
//! - a record refused as unusable where no record had both copies damaged is a record the tool
//!   itself made unusable (items 2, 3).

use crate::gallery::service::Removal;

use super::check::{self, Findings};
use super::commands::{Cmd, Done, Outcome};
use super::compat;
use super::driver::Run;
use super::model::Running;
use super::probe::VersionAt;
use super::world::DEFINITION;

/// Command `running` ended with `outcome` (`None`: it crashed).
pub fn settle(run: &mut Run, running: &Running, outcome: Option<&Outcome>) {
    let g = running.cmd.gallery();
    let at = |key: &str| -> VersionAt { (g, DEFINITION.to_string(), key.to_string()) };
    let mut f = Findings::default();
    match (&running.cmd, outcome) {
        (
            Cmd::Ensure {
                key,
                reference,
                holder,
                ..
            },
            Some(Ok(Done::Ensured)),
        ) => {
            let at = at(key);
            let before = running
                .was_acked
                .get(&at)
                .and_then(|m| m.get(reference))
                .cloned();
            // The version's life changed under it (deleted and made again by someone else
            // after its write): its reference may have gone with the life it was written to.
            if running.life_changed_under.contains(&at) {
                let vm = run.model.version(&at);
                if !vm.acked.contains_key(reference) {
                    vm.maybe.insert(reference.clone());
                }
                run.absorb(f);
                return;
            }
            let vm = run.model.version(&at);
            // Both copies damaged now (until the operator restores them): who holds what
            // cannot be read back, only after the repair.
            let unreadable = vm.record_broken;
            vm.maybe.remove(reference);
            vm.removed.remove(reference);
            let kept = before.clone().flatten().or_else(|| holder.clone());
            vm.acked.insert(reference.clone(), kept);
            if let Some(h) = holder {
                let was = before.flatten();
                let view = check::view_of(&run.world, &at);
                // A CID handed back to plain CPIs is theirs: no holder is recorded for it.
                let theirs = view
                    .as_ref()
                    .is_some_and(|v| check::cpi_list(&v.tags).contains(reference));
                // (A version gone meanwhile, deleted outside, has no view to check.)
                if view.is_some()
                    && !theirs
                    && !unreadable
                    && (was.is_none() || was.as_ref() == Some(h))
                {
                    let recorded = view
                        .and_then(|v| v.record)
                        .and_then(|r| r.entry(reference).and_then(|e| e.holder.clone()));
                    // Another command asked another holder for it: whichever was recorded
                    // first stays.
                    let asked_by_another = recorded.as_ref().is_some_and(|r| {
                        run.model
                            .holders_asked
                            .get(&(g, reference.clone()))
                            .is_some_and(|hs| hs.contains(r))
                    });
                    if recorded.as_ref() != Some(h) && !asked_by_another {
                        f.violations.push(format!(
                            "HOLDER NOT RECORDED: {} returned ok, but the record names {recorded:?} as the holder of {reference}",
                            running.cmd.describe()
                        ));
                    }
                }
            }
        }
        (Cmd::DeleteRef { key, reference, .. }, Some(Ok(Done::Removed(removal)))) => {
            removed(run, running, &at(key), reference, removal, &mut f);
        }
        (Cmd::DeleteCid { cid, .. }, Some(Ok(Done::Cid(found)))) => {
            let mut held_on = Vec::new();
            for (v, m) in &running.was_acked {
                if m.contains_key(cid) {
                    held_on.push(v.clone());
                }
            }
            for (v, m) in &running.was_cpi {
                if m.contains(cid) {
                    held_on.push(v.clone());
                }
            }
            match found {
                None => {
                    for v in &held_on {
                        if run.world.galleries[g].fake.version(&v.1, &v.2).is_none() {
                            continue;
                        }
                        let broken = run.model.version(v).record_broken;
                        let tags_only = !running
                            .was_acked
                            .get(v)
                            .is_some_and(|m| m.contains_key(cid));
                        if running.suspended_under.contains(v) && tags_only && !broken {
                            // Azure lists a soft-deleted version without its tags (REFERENCE.md
                            // "Listing soft-deleted versions"): a CID only its tags held cannot
                            // be found until it is restored. A management lock on every held
                            // version (issue 46) makes Azure refuse that soft delete.
                            f.known.push((
                                "a CID on a version soft-deleted while delete --cid searched was not found",
                                format!("g{g} {} {cid}", v.2),
                            ));
                            continue;
                        }
                        f.violations.push(format!(
                            "NOT FOUND: {} found no version (exit 3; StemcellNotFound to bosh) while g{g} {} held it{}",
                            running.cmd.describe(),
                            v.2,
                            if broken { " in a record that cannot be read (it must refuse, naming the repair)" } else { "" }
                        ));
                    }
                    restore(run, running, cid);
                }
                Some((key, removal)) => {
                    removed(run, running, &at(key), cid, removal, &mut f);
                }
            }
        }
        (Cmd::Prune { key, refs, .. }, Some(Ok(Done::Pruned(gone)))) => {
            let at = at(key);
            for r in refs {
                if gone.contains(r) {
                    let vm = run.model.version(&at);
                    vm.maybe.remove(r);
                    vm.removed.insert(r.clone());
                } else {
                    restore(run, running, r);
                }
            }
        }
        (Cmd::HandBack { holder, .. }, Some(Ok(Done::HandBack(entries)))) => {
            for e in entries {
                if let Ok(moved) = &e.outcome {
                    let vm = run.model.version(&at(&e.key));
                    for c in moved {
                        vm.acked.remove(c);
                        vm.cpi.insert(c.clone());
                    }
                }
            }
            // What an interrupted hand-back already moved is the plain CPIs' too.
            for v in running.holders_cids.keys() {
                let listed = check::view_of(&run.world, v)
                    .map(|view| check::cpi_list(&view.tags))
                    .unwrap_or_default();
                let vm = run.model.version(v);
                for c in listed {
                    if vm
                        .acked
                        .get(&c)
                        .is_some_and(|h| h.as_deref() == Some(holder))
                    {
                        vm.acked.remove(&c);
                        vm.cpi.insert(c);
                    }
                }
            }
            let failed = entries.iter().any(|e| e.outcome.is_err() && !e.no_room);
            if !failed {
                for (v, cids) in &running.holders_cids {
                    if entries.iter().any(|e| e.key == v.2 && e.no_room) {
                        continue;
                    }
                    let running_refs = run.model.running_refs(g);
                    let vm = run.model.version(v);
                    let left: Vec<&String> = cids
                        .iter()
                        .filter(|c| {
                            vm.acked
                                .get(*c)
                                .is_some_and(|h| h.as_deref() == Some(holder))
                                && !running_refs.contains(*c)
                        })
                        .collect();
                    if left.is_empty() || run.world.galleries[g].fake.version(&v.1, &v.2).is_none()
                    {
                        continue;
                    }
                    if running.suspended_under.contains(v) {
                        // Soft-deleted while it ran: Azure lists the version without its tags,
                        // so the hand-back could not see its CIDs (its re-run after the restore
                        // moves them).
                        f.known.push((
                            "a hand-back ran while a version holding the holder's CIDs was soft-deleted (listed without its tags)",
                            format!("g{g} {} {left:?}", v.2),
                        ));
                        continue;
                    }
                    let broken = vm.record_broken;
                    f.violations.push(format!(
                        "HAND-BACK INCOMPLETE: {} ended without a failure (exit 0), but {left:?} of g{g} {} stay on the tool's side{}",
                        running.cmd.describe(),
                        v.2,
                        if broken {
                            " (its record cannot be read: the version must be refused, exit 1, not skipped)"
                        } else {
                            " (its record no longer names the holder?)"
                        }
                    ));
                }
            }
        }
        (cmd, Some(Err(e))) => {
            if e.unusable && !running.saw_damage {
                let any_broken = run
                    .model
                    .versions
                    .iter()
                    .any(|(v, vm)| v.0 == g && vm.record_broken);
                if !any_broken {
                    f.violations.push(format!(
                        "UNUSABLE RECORD: {} was refused for a record no fault damaged beyond repair: {}",
                        cmd.describe(),
                        e.text
                    ));
                }
            }
            if matches!(cmd, Cmd::Ensure { .. }) {
                // An ensure never removes: what it started from is still held.
                for r in cmd.touches() {
                    restore_acked_only(run, running, &r);
                }
            }
        }
        (cmd @ Cmd::Ensure { .. }, None) => {
            for r in cmd.touches() {
                restore_acked_only(run, running, &r);
            }
        }
        _ => {}
    }
    run.absorb(f);
}

/// A removal of `r` from `at` answered `removal`.
fn removed(
    run: &mut Run,
    running: &Running,
    at: &VersionAt,
    r: &str,
    removal: &Removal,
    f: &mut Findings,
) {
    match removal {
        // A retry finding it removed already: done (exit 0).
        done if compat::already_removed(done) => {
            let vm = run.model.version(at);
            vm.maybe.remove(r);
            vm.removed.insert(r.to_string());
        }
        Removal::NotRecorded { references, .. } => {
            let was_held = running.was_acked.get(at).is_some_and(|m| m.contains_key(r))
                || running.was_cpi.get(at).is_some_and(|m| m.contains(r));
            let shows_removed = check::view_of(&run.world, at)
                .and_then(|v| v.record)
                .is_some_and(|rec| rec.removed(r));
            if was_held {
                f.violations.push(format!(
                    "NOT RECORDED: {} answered not recorded (exit 3) for {r}, acknowledged on g{} {}; the version records {references:?}",
                    running.cmd.describe(),
                    at.0,
                    at.2
                ));
            } else if shows_removed {
                f.violations.push(format!(
                    "NOT IDEMPOTENT: {}{} answered not recorded (exit 3), while the record shows {r} removed: a retry must answer already-removed, exit 0",
                    running.cmd.describe(),
                    running
                        .rerun_of
                        .map(|o| format!(" (re-run of op{o})"))
                        .unwrap_or_default()
                ));
            }
            restore(run, running, r);
        }
        Removal::NotFound => {}
        _ => {
            let vm = run.model.version(at);
            vm.maybe.remove(r);
            vm.removed.insert(r.to_string());
            // Asked by name: gone from whichever side held it (a hand-back may have moved it
            // to the plain CPIs' side while the removal ran).
            vm.cpi.remove(r);
        }
    }
}

/// `r` was not removed: it is held as it was when the command started.
fn restore(run: &mut Run, running: &Running, r: &str) {
    for (v, m) in &running.was_acked {
        if let Some(h) = m.get(r) {
            let vm = run.model.version(v);
            vm.maybe.remove(r);
            vm.acked.insert(r.to_string(), h.clone());
        }
    }
    for (v, m) in &running.was_cpi {
        if m.contains(r) {
            let vm = run.model.version(v);
            vm.maybe.remove(r);
            vm.cpi.insert(r.to_string());
        }
    }
}

/// After an `ensure` that failed: what was acknowledged before it still is (it may also have
/// been recorded now: it stays possible).
fn restore_acked_only(run: &mut Run, running: &Running, r: &str) {
    for (v, m) in &running.was_acked {
        if let Some(h) = m.get(r) {
            run.model.version(v).acked.insert(r.to_string(), h.clone());
        }
    }
}
