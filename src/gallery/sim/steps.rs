//! What the seed makes of each step: poll a command, start one (or re-run one that failed or
//! crashed), let a plain CPI or the outside world act, inject a fault, or land something held
//! back; and the quiet end of a run, where every fault is lifted and everything must converge.

use futures::FutureExt;

use super::commands::Cmd;
use super::driver::Run;
use super::faults::fault_step;
use super::outside::{cpi_pending_step, cpi_step, land_one, outside_step, repair_one};
use super::world::{DEFINITION, KEYS};

/// Who holds references: two directors (as a CPI request names them) and an operator's label.
pub const HOLDERS: [&str; 3] = [
    "director:0b1d2c3e-4f50-4a6b-8c7d-9e0f1a2b3c4d",
    "director:7a6b5c4d-3e2f-4a1b-8c9d-0e1f2a3b4c5d",
    "pipeline-main",
];

pub async fn step(run: &mut Run) {
    let can_start = run.tasks.len() < run.max_running;
    match run.rng.weighted(&[58, 16, 8, 2, 9, 7]) {
        1 if can_start => start_one(run),
        2 if run.world.profile.on("cpi") => cpi_step(run).await,
        3 => outside_step(run).await,
        4 => fault_step(run),
        5 => {
            if !land_one(run) {
                if run.cpi_pending.is_empty() {
                    repair_one(run);
                } else {
                    cpi_pending_step(run).await;
                }
            }
        }
        _ if run.tasks.is_empty() => start_one(run),
        _ => run.poll_one().await,
    }
    run.events();
}

/// Start a command, or re-run one that failed or crashed.
fn start_one(run: &mut Run) {
    if !run.reruns.is_empty() && run.rng.percent(30) {
        let i = run.rng.below(run.reruns.len());
        let (of, cmd) = run.reruns[i].clone();
        let running = run.model.running_refs(cmd.gallery());
        if cmd.touches().iter().all(|r| !running.contains(r)) && !hand_back_running(run, &cmd) {
            run.reruns.remove(i);
            let crash = crash_point(run);
            run.start(cmd, Some(of), crash);
        }
        return;
    }
    let Some(cmd) = choose(run) else {
        return;
    };
    let crash = crash_point(run);
    run.start(cmd, None, crash);
}

fn crash_point(run: &mut Run) -> Option<u32> {
    (run.rng.percent(10) && run.world.profile.on("crash")).then(|| run.rng.between(1, 40))
}

fn hand_back_running(run: &Run, cmd: &Cmd) -> bool {
    matches!(cmd, Cmd::HandBack { .. })
        && run
            .model
            .running
            .values()
            .any(|r| matches!(r.cmd, Cmd::HandBack { .. }) && r.cmd.gallery() == cmd.gallery())
}

/// A command the seed chooses, on references no running command decides.
fn choose(run: &mut Run) -> Option<Cmd> {
    let g = run.rng.below(run.world.galleries.len());
    let key = run.rng.pick(&KEYS).to_string();
    let at = (g, DEFINITION.to_string(), key.clone());
    let mut running = run.model.running_refs(g);
    // A CID a plain CPI is about to remove is that director's: not deleted twice at once.
    for p in &run.cpi_pending {
        if let super::outside::CpiAction::Remove(c) = &p.action {
            running.insert(c.clone());
        }
    }
    let vm = run.model.version(&at).clone();
    let free = |r: &String| !running.contains(r);
    let acked: Vec<String> = vm.acked.keys().filter(|r| free(r)).cloned().collect();
    let cpi: Vec<String> = vm.cpi.iter().filter(|r| free(r)).cloned().collect();
    let removed: Vec<String> = vm.removed.iter().filter(|r| free(r)).cloned().collect();
    let restore = if run.world.soft_delete { 3 } else { 0 };
    let cmd = match run.rng.weighted(&[36, 20, 12, 6, 5, 6, restore]) {
        0 => {
            let mut holder = (!run.rng.percent(30)).then(|| run.rng.pick(&HOLDERS).to_string());
            let reference = if !acked.is_empty() && run.rng.percent(12) {
                // Recorded again by its holder (or, recorded without one, now with one).
                let r = run.rng.pick(&acked).clone();
                if let Some(Some(h)) = vm.acked.get(&r) {
                    holder = Some(h.clone());
                }
                r
            } else if run.rng.percent(70) {
                run.rng.cid()
            } else {
                format!("g{g}-ref-{}", run.next_op)
            };
            Cmd::Ensure {
                g,
                key,
                reference,
                holder,
            }
        }
        1 => {
            let reference = match run.rng.weighted(&[70, 15, 5, 10]) {
                0 if !acked.is_empty() => run.rng.pick(&acked).clone(),
                1 if !removed.is_empty() => run.rng.pick(&removed).clone(),
                2 if !cpi.is_empty() => run.rng.pick(&cpi).clone(),
                _ => format!("g{g}-never-{}", run.next_op),
            };
            Cmd::DeleteRef { g, key, reference }
        }
        2 => {
            let cids: Vec<String> = acked
                .iter()
                .chain(cpi.iter())
                .filter(|r| crate::gallery::tags::is_cid(r))
                .cloned()
                .collect();
            let cid = if !cids.is_empty() && run.rng.percent(90) {
                run.rng.pick(&cids).clone()
            } else {
                run.rng.cid()
            };
            Cmd::DeleteCid { g, cid }
        }
        3 => Cmd::HandBack {
            g,
            holder: run.rng.pick(&HOLDERS).to_string(),
        },
        4 if !acked.is_empty() => {
            let n = run.rng.between(1, 2) as usize;
            let refs: Vec<String> = (0..n).map(|_| run.rng.pick(&acked).clone()).collect();
            let mut refs = refs;
            refs.dedup();
            Cmd::Prune { g, key, refs }
        }
        5 => Cmd::Cleanup { g },
        6 => Cmd::Restore { g, key },
        _ => return None,
    };
    let clash = cmd.touches().iter().any(|r| running.contains(r)) || hand_back_running(run, &cmd);
    (!clash).then_some(cmd)
}

/// The quiet end: lift every fault, land every held write, let the running commands finish,
/// run again every command that failed or crashed (each must now succeed), and check.
pub async fn quiet_end(run: &mut Run) {
    run.trace("quiet end: faults lifted, held writes land, failed commands re-run".into());
    run.world.probe.disarm_all();
    for g in &run.world.galleries {
        g.fake.clear_faults();
        g.locks.clear_intents();
    }
    while land_one(run) {}
    while !run.cpi_pending.is_empty() {
        cpi_pending_step(run).await;
    }
    while repair_one(run) {}
    for t in &mut run.tasks {
        t.crash_after = None;
    }
    while !run.tasks.is_empty() && !run.violated() {
        run.poll_one().await;
        run.events();
    }
    converge(run).await;
    if !run.violated() {
        let f = super::check::views(&run.world, &run.model);
        run.absorb(f);
    }
    if !run.violated() {
        findable(run).await;
    }
}

/// Every command that failed or crashed, run again alone: it must succeed.
async fn converge(run: &mut Run) {
    let mut seen = std::collections::BTreeSet::new();
    let mut todo: Vec<_> = std::mem::take(&mut run.reruns)
        .into_iter()
        .filter(|(of, _)| seen.insert(*of))
        .collect();
    while !todo.is_empty() && !run.violated() {
        let (of, cmd) = todo.remove(0);
        let described = cmd.describe();
        let id = run.start(cmd, Some(of), None);
        while run.tasks.iter().any(|t| t.id == id) && !run.violated() {
            run.poll_one().await;
            run.events();
        }
        if run.reruns.iter().any(|(o, _)| *o == of) {
            let why = run
                .report
                .trace
                .iter()
                .rev()
                .find(|l| l.contains(&format!("op{id} ")))
                .cloned()
                .unwrap_or_default();
            run.absorb(super::check::Findings {
                violations: vec![format!(
                    "NO CONVERGENCE: {described}, re-run of op{of} with every fault lifted, did not succeed: {}",
                    why.trim()
                )],
                known: vec![],
            });
        }
    }
}

/// Every acknowledged reference is found as `delete --cid` and the CPI front find one
/// (`GalleryService::find_reference`), with every fault lifted.
async fn findable(run: &mut Run) {
    let mut missing = Vec::new();
    for (at, vm) in &run.model.versions {
        if run.world.galleries[at.0]
            .fake
            .version(&at.1, &at.2)
            .is_none()
        {
            continue;
        }
        for r in vm.acked.keys() {
            let svc = run.world.galleries[at.0].svc.clone();
            run.world.probe.set_quiet(true);
            let found = svc.find_reference(r).now_or_never();
            run.world.probe.set_quiet(false);
            match found {
                Some(Ok(Some(_))) => {}
                other => missing.push(format!(
                    "g{} {} {r}: {:?}",
                    at.0,
                    at.2,
                    other.map(|o| o.map(|f| f.is_some()).map_err(|e| e.to_string()))
                )),
            }
        }
    }
    if !missing.is_empty() {
        run.absorb(super::check::Findings {
            violations: vec![format!(
                "NOT FINDABLE: acknowledged references that find_reference (delete --cid, the CPI front) does not find: {}",
                missing.join("; ")
            )],
            known: vec![],
        });
    }
}
