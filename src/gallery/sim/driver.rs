//! One simulated run: the seed's world, its commands interleaved with the plain CPI's writes,
//! outside changes and faults, every step checked (`check`), then a quiet end where every fault
//! is lifted, every held write lands, and every command that failed or crashed is run again and
//! must converge.

use std::collections::{BTreeMap, BTreeSet};

use crate::gallery::service::Removal;
use crate::gallery::tags;

use super::check::{self, Findings};
use super::commands::{self, Cmd, Done, GalleryShared, Outcome};
use super::model::{Model, Running};
use super::probe::{Event, OpId, VersionAt};
use super::rng::Rng;
use super::sched::{wait_for_wake, DriverWake, Polled, Task};
use super::world::{Profile, World, DEFINITION};

/// Steps of one run before its quiet end.
pub const STEPS: u32 = 500;

/// What one run found, and what it did.
#[derive(Debug, Default)]
pub struct RunReport {
    pub seed: u64,
    pub trace: Vec<String>,
    pub violations: Vec<String>,
    pub known: BTreeMap<&'static str, u64>,
    /// Commands by kind: started, ok, failed, crashed.
    pub commands: BTreeMap<&'static str, [u64; 4]>,
    pub faults: BTreeMap<&'static str, u64>,
    pub polls: u64,
}

pub struct Run {
    pub rng: Rng,
    pub world: World,
    pub model: Model,
    pub report: RunReport,
    pub tasks: Vec<Task<Outcome>>,
    pub driver: std::sync::Arc<DriverWake>,
    pub next_op: OpId,
    /// Commands that failed or crashed, to run again (with the command they re-run).
    pub reruns: Vec<(OpId, Cmd)>,
    pub max_running: usize,
    /// The two copies of a record both damaged, as they were (for the operator's repair).
    pub damaged: BTreeMap<VersionAt, [Option<Vec<u8>>; 2]>,
    /// Plain CPI writes read but not yet written (read-modify-write: see `steps`).
    pub cpi_pending: Vec<super::outside::CpiPending>,
    /// Known limits already counted (each once per run and subject).
    known_seen: BTreeSet<(&'static str, String)>,
    step: u32,
}

impl Run {
    pub fn new(seed: u64, profile: Profile) -> Run {
        let mut rng = Rng::new(seed);
        let world = World::new(&mut rng, profile);
        let max_running = rng.between(1, 3) as usize;
        let mut report = RunReport {
            seed,
            ..RunReport::default()
        };
        report.trace.push(format!(
            "seed {seed}: {}, up to {max_running} commands at once",
            world.describe()
        ));
        Run {
            rng,
            world,
            model: Model::default(),
            report,
            tasks: Vec::new(),
            driver: Default::default(),
            next_op: 1,
            reruns: Vec::new(),
            max_running,
            damaged: BTreeMap::new(),
            cpi_pending: Vec::new(),
            known_seen: BTreeSet::new(),
            step: 0,
        }
    }

    pub fn trace(&mut self, line: String) {
        let line = format!("{:>4} {line}", self.step);
        // Replayed with the tool's log (`SIM_LOG=1`): each step beside the log lines it caused.
        tracing::info!(target: "sim", "{line}");
        self.report.trace.push(line);
    }

    pub fn fault(&mut self, kind: &'static str, line: String) {
        *self.report.faults.entry(kind).or_default() += 1;
        self.trace(format!("FAULT {kind}: {line}"));
    }

    pub fn violated(&self) -> bool {
        !self.report.violations.is_empty()
    }

    /// A known limit hit (docs/RELIABILITY.md "What remains"): counted, not a violation.
    pub fn known(&mut self, limit: &'static str, what: String) {
        self.absorb(Findings {
            violations: vec![],
            known: vec![(limit, what)],
        });
    }

    pub fn absorb(&mut self, f: Findings) {
        for (k, what) in f.known {
            if self.known_seen.insert((k, what.clone())) {
                *self.report.known.entry(k).or_default() += 1;
                self.trace(format!("known limit: {k} ({what})"));
            }
        }
        for v in f.violations {
            self.trace(format!("VIOLATION {v}"));
            if self.report.violations.is_empty() {
                self.report.trace.extend(check::dump(&self.world));
            }
            self.report.violations.push(v);
        }
    }

    /// Start `cmd` (crashing after `crash_after` polls, if given).
    pub fn start(&mut self, cmd: Cmd, rerun_of: Option<OpId>, crash_after: Option<u32>) -> OpId {
        let id = self.next_op;
        self.next_op += 1;
        let g = cmd.gallery();
        let mut running = Running {
            cmd: cmd.clone(),
            rerun_of,
            was_acked: BTreeMap::new(),
            was_cpi: BTreeMap::new(),
            saw_damage: self.model.versions.values().any(|v| v.record_broken),
            holders_cids: BTreeMap::new(),
            life_changed_under: Default::default(),
            suspended_under: self
                .model
                .versions
                .iter()
                .filter(|(at, vm)| at.0 == g && vm.suspended)
                .map(|(at, _)| at.clone())
                .collect(),
        };
        if let Cmd::Ensure {
            reference,
            holder: Some(h),
            ..
        } = &cmd
        {
            self.model
                .holders_asked
                .entry((g, reference.clone()))
                .or_default()
                .insert(h.clone());
        }
        for r in cmd.touches() {
            self.model.note_used(g, &r);
            let at_list = match &cmd {
                Cmd::Ensure { key, .. } | Cmd::DeleteRef { key, .. } | Cmd::Prune { key, .. } => {
                    vec![(g, DEFINITION.to_string(), key.clone())]
                }
                _ => self.model.versions_holding(g, &r),
            };
            for at in at_list {
                let vm = self.model.version(&at);
                if let Some(h) = vm.acked.remove(&r) {
                    running
                        .was_acked
                        .entry(at.clone())
                        .or_default()
                        .insert(r.clone(), h);
                }
                if vm.cpi.remove(&r) {
                    running
                        .was_cpi
                        .entry(at.clone())
                        .or_default()
                        .insert(r.clone());
                }
                vm.maybe.insert(r.clone());
            }
        }
        if let Cmd::HandBack { holder, .. } = &cmd {
            for (at, vm) in &self.model.versions {
                if at.0 != g {
                    continue;
                }
                let cids: BTreeSet<String> = vm
                    .acked
                    .iter()
                    .filter(|(r, h)| h.as_deref() == Some(holder.as_str()) && tags::is_cid(r))
                    .map(|(r, _)| r.clone())
                    .collect();
                if !cids.is_empty() {
                    running.holders_cids.insert(at.clone(), cids);
                }
            }
        }
        self.report.commands.entry(cmd.kind()).or_default()[0] += 1;
        self.trace(format!(
            "op{id} start {}{}{}",
            cmd.describe(),
            rerun_of
                .map(|o| format!(" (re-run of op{o})"))
                .unwrap_or_default(),
            crash_after
                .map(|k| format!(" [crashes after {k} polls]"))
                .unwrap_or_default()
        ));
        let shared = GalleryShared::of(&self.world.galleries[g]);
        self.model.running.insert(id, running);
        self.tasks.push(Task::new(
            id,
            commands::run(shared, cmd),
            &self.driver,
            crash_after,
        ));
        id
    }

    /// Poll one runnable command (chosen by the seed); wait for one when none is.
    pub async fn poll_one(&mut self) {
        if self.tasks.is_empty() {
            return;
        }
        if !self.tasks.iter().any(Task::woken) && !wait_for_wake(&self.driver, &self.tasks).await {
            let stuck: Vec<String> = self.tasks.iter().map(|t| format!("op{}", t.id)).collect();
            self.absorb(Findings {
                violations: vec![format!(
                    "STUCK: {} made no progress for {:?} of simulated time",
                    stuck.join(", "),
                    super::sched::STUCK
                )],
                known: vec![],
            });
            return;
        }
        let woken: Vec<usize> = (0..self.tasks.len())
            .filter(|&i| self.tasks[i].woken())
            .collect();
        let i = *self.rng.pick(&woken);
        if self.tasks[i].due_to_crash() {
            // Killed at this await point: the future is dropped (its lock with it).
            let id = self.tasks.remove(i).id;
            self.finished(id, None);
            return;
        }
        self.report.polls += 1;
        let polled = self.tasks[i].poll(&self.world.probe);
        self.events();
        match polled {
            Polled::Pending => {}
            Polled::Done(outcome) => {
                let id = self.tasks.remove(i).id;
                self.finished(id, Some(outcome));
            }
            Polled::Panicked(msg) => {
                let id = self.tasks.remove(i).id;
                let cmd = self.model.running.get(&id).map(|r| r.cmd.describe());
                self.absorb(Findings {
                    violations: vec![format!("PANIC in op{id} {cmd:?}: {msg}")],
                    known: vec![],
                });
                self.finished(id, None);
            }
        }
    }

    /// Check the writes the last poll made.
    pub fn events(&mut self) {
        for e in self.world.probe.take_events() {
            self.event(e);
        }
    }

    fn event(&mut self, e: Event) {
        match e {
            Event::TagWrite {
                at,
                op,
                before,
                after,
                blind,
                late,
            } => {
                let asked = op
                    .and_then(|o| self.model.running.get(&o))
                    .map(|r| r.cmd.touches())
                    .unwrap_or_default();
                let f =
                    check::cpi_cids_kept(&self.model, &at, &before, &after, &asked, blind, late);
                if late || blind {
                    // Lost in a known window: no one holds them any more.
                    let (was, now) = (check::cpi_list(&before), check::cpi_list(&after));
                    let lost: Vec<String> = self
                        .model
                        .cpi_held(&at)
                        .iter()
                        .filter(|c| was.contains(*c) && !now.contains(*c) && !asked.contains(*c))
                        .cloned()
                        .collect();
                    for c in lost {
                        self.model.cpi_lost(&at, &c);
                    }
                    // A CID a hand-back moved to `stemcell_references` is the plain CPIs' and
                    // no longer in the record: a stale write taking it out loses it the same way.
                    let gone: Vec<String> = was
                        .iter()
                        .filter(|c| !now.contains(*c) && !asked.contains(*c))
                        .filter(|c| {
                            self.model
                                .get(&at)
                                .is_some_and(|vm| vm.acked.contains_key(*c))
                        })
                        .cloned()
                        .collect();
                    let view = check::view_of(&self.world, &at)
                        .map(|v| v.refs)
                        .unwrap_or_default();
                    for c in gone.into_iter().filter(|c| !view.contains(c)) {
                        let what = format!("g{} {} {c}", at.0, at.2);
                        self.model.cpi_lost(&at, &c);
                        self.known(
                            "a stale tag write took out a CID a hand-back had moved to stemcell_references",
                            what,
                        );
                    }
                }
                self.absorb(f);
                let sentinel = tags::sentinel(&at.1, &at.2);
                let had = check::cpi_list(&before).contains(&sentinel);
                let has = check::cpi_list(&after).contains(&sentinel);
                let vm = self.model.version(&at);
                vm.stale_tags |= late || blind;
                // Whatever it held then: a reference being added (acknowledged only when
                // its command returns) lost the sentinel it was written with.
                if late && had && !has {
                    vm.stale_sentinel = true;
                } else if !late {
                    vm.stale_sentinel = false;
                }
                if late {
                    self.trace(format!(
                        "a late tag write of op{} landed on g{} {}: stemcell_references {:?}, references {:?}",
                        op.unwrap_or(0),
                        at.0,
                        at.2,
                        check::cpi_list(&after),
                        tags::references(&after)
                    ));
                }
            }
            Event::Created { at, op } => {
                let by_ensure = matches!(
                    self.model.running.get(&op).map(|r| &r.cmd),
                    Some(Cmd::Ensure { .. })
                );
                let running = self.model.running_refs(at.0);
                let vm = self.model.version(&at);
                if by_ensure && vm.carry_pending {
                    vm.carry_pending = false;
                } else {
                    let noted = std::mem::take(&mut vm.carried_unknowingly);
                    vm.new_life(&running);
                    if by_ensure && !noted.is_empty() {
                        vm.maybe.extend(noted.iter().cloned());
                        self.known(
                            "a Failed version deleted by someone else after the tool noted its references to carry, before its DELETE: they are carried",
                            format!("g{} {} {noted:?}", at.0, at.2),
                        );
                    }
                    self.model.life_changed(&at);
                }
                // The life it created is the one it writes to.
                if let Some(r) = self.model.running.get_mut(&op) {
                    r.life_changed_under.remove(&at);
                }
                let life = self.model.version(&at).life;
                self.trace(format!("op{op} created g{} {} (life {life})", at.0, at.2));
            }
            Event::Deleted {
                at,
                op,
                before,
                blind,
                listed,
                crossed,
            } => {
                let cmd = self.model.running.get(&op).map(|r| r.cmd.clone());
                // A replacement that noted the Failed version's references and whose DELETE
                // landed on a version made again by someone else meanwhile (no conditional
                // DELETE): its note is carried (window (3) of docs/RELIABILITY.md).
                let noted_across = (crossed && matches!(cmd, Some(Cmd::Ensure { .. })))
                    .then(|| super::outside::noted_to_carry(self, &at));
                let replacing =
                    matches!(cmd, Some(Cmd::Ensure { .. })) && before.phase().replaceable();
                self.trace(format!(
                    "op{op} deleted g{} {}{}",
                    at.0,
                    at.2,
                    if replacing { " (replacing it)" } else { "" }
                ));
                if replacing {
                    self.model.version(&at).carry_pending = true;
                    return;
                }
                let asked = cmd.map(|c| c.touches()).unwrap_or_default();
                let by = if listed {
                    format!("op{op} (its GET predates a write its later list_versions showed)")
                } else {
                    format!("op{op}")
                };
                let how = if blind { Gone::ToolBlind } else { Gone::Tool };
                self.version_gone(&at, &by, &asked, how);
                if let Some(noted) = noted_across.filter(|n| !n.is_empty()) {
                    self.model
                        .version(&at)
                        .carried_unknowingly
                        .extend(noted.iter().cloned());
                }
            }
            Event::DeletedNothing { at, op } => {
                let replacing = matches!(
                    self.model.running.get(&op).map(|r| &r.cmd),
                    Some(Cmd::Ensure { .. })
                );
                if replacing {
                    // What the Failed version held when it was deleted (its life is over), and
                    // what the note holds of an earlier life still (the replacement read a life
                    // that someone else deleted, made again and deleted once more).
                    let noted = super::outside::noted_to_carry(self, &at);
                    let vm = self.model.version(&at);
                    let mut last: Vec<String> = vm.last_life.iter().cloned().collect();
                    last.extend(noted.into_iter().filter(|r| vm.past.contains(r)));
                    vm.carried_unknowingly.extend(last);
                    self.trace(format!(
                        "op{op} sent its DELETE of g{} {} after someone else had deleted it",
                        at.0, at.2
                    ));
                }
            }
            Event::CrossedLives { at, op, refs } => {
                let vm = self.model.version(&at);
                let old: Vec<String> = refs
                    .into_iter()
                    .filter(|r| !vm.allowed(r) && !vm.removed.contains(r) && vm.past.contains(r))
                    .collect();
                if !old.is_empty() {
                    vm.maybe.extend(old.iter().cloned());
                    self.known(
                        "a tool tag write built on an earlier life of the version landed on the new one with that life's references (no conditional write); the writer takes them off at its next read unless it dies first",
                        format!("g{} {} op{op} {old:?}", at.0, at.2),
                    );
                }
            }
            Event::Restored { at, op } => {
                self.model.version(&at).suspended = false;
                self.trace(format!("op{op} restored g{} {}", at.0, at.2));
            }
        }
    }

    /// Version `at` was deleted by `by` (`how`): invariant C, then its life ends (a soft
    /// delete only suspends it: a restore brings the same life back).
    pub fn version_gone(&mut self, at: &VersionAt, by: &str, asked: &[String], how: Gone) {
        let soft = self.world.soft_delete;
        let vm = self.model.version(at);
        let held: Vec<String> = vm
            .acked
            .keys()
            .chain(vm.cpi.iter())
            .filter(|r| !asked.contains(r))
            .cloned()
            .collect();
        let stale = vm.stale_sentinel;
        let life = vm.life;
        if !held.is_empty() && how != Gone::Outside {
            let known = match how {
                Gone::CpiStaleRead => {
                    Some("a plain CPI deleted a version on a read older than the sentinel")
                }
                Gone::Cpi if stale => {
                    Some("a plain CPI deleted a version whose sentinel a stale write had dropped")
                }
                Gone::ToolBlind => Some(
                    "a guarded DELETE was sent after a plain CPI recorded a CID it had not read",
                ),
                _ => None,
            };
            if let Some(k) = known {
                self.known(k, format!("g{} {} life {life}", at.0, at.2));
            } else {
                self.absorb(Findings {
                    violations: vec![format!(
                        "DELETED WHILE REFERENCED: {by} deleted g{} {} (life {life}) while it held {held:?}",
                        at.0, at.2
                    )],
                    known: vec![],
                });
            }
        }
        if soft {
            self.model.version(at).suspended = true;
            self.model.suspended(at);
        } else {
            let running = self.model.running_refs(at.0);
            self.model.version(at).end_life(&running);
            self.model.life_changed(at);
        }
    }

    /// Command `id` ended: `None` when it crashed (dropped) or panicked.
    fn finished(&mut self, id: OpId, outcome: Option<Outcome>) {
        let Some(running) = self.model.running.remove(&id) else {
            return;
        };
        let kind = running.cmd.kind();
        let slot = match &outcome {
            Some(Ok(_)) => 1,
            Some(Err(_)) => 2,
            None => 3,
        };
        self.report.commands.entry(kind).or_default()[slot] += 1;
        if outcome.is_none() && running.cmd.removes() {
            self.model.removal_unanswered.extend(running.cmd.touches());
        }
        match &outcome {
            None => self.trace(format!("op{id} CRASHED ({})", running.cmd.describe())),
            Some(Ok(done)) => self.trace(format!("op{id} ok: {}", brief(done))),
            Some(Err(e)) => self.trace(format!("op{id} failed ({:?}): {}", e.class, e.text)),
        }
        super::settle::settle(self, &running, outcome.as_ref());
        let failed = match &outcome {
            Some(Err(e)) if e.refusal => false,
            None | Some(Err(_)) => true,
            Some(Ok(Done::HandBack(entries))) => {
                entries.iter().any(|e| e.outcome.is_err() && !e.no_room)
            }
            Some(Ok(_)) => false,
        };
        if failed {
            self.reruns
                .push((running.rerun_of.unwrap_or(id), running.cmd));
        }
    }

    /// The steps of the run, then its quiet end.
    pub async fn run(&mut self) {
        for step in 0..STEPS {
            self.step = step;
            super::steps::step(self).await;
            if self.violated() {
                return;
            }
            let f = check::views(&self.world, &self.model);
            self.absorb(f);
            if self.violated() {
                return;
            }
        }
        self.step = STEPS;
        super::steps::quiet_end(self).await;
    }
}

/// Who deleted a version, for invariant C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gone {
    /// A command of the tool.
    Tool,
    /// A command of the tool, whose DELETE went out after someone else wrote the version it
    /// last read (ARM has no conditional DELETE: the window no design closes).
    ToolBlind,
    /// A plain CPI, deciding on the tags as they are.
    Cpi,
    /// A plain CPI, deciding on tags it read before others wrote (its read-modify-write window).
    CpiStaleRead,
    /// Someone outside the tool (no promise: the operator's act).
    Outside,
}

/// One line for a command's result.
pub fn brief(done: &Done) -> String {
    match done {
        Done::Ensured => "ensured".into(),
        Done::Removed(r) => removal(r),
        Done::Cid(None) => "no version records the CID".into(),
        Done::Cid(Some((key, r))) => format!("{key}: {}", removal(r)),
        Done::HandBack(entries) => entries
            .iter()
            .map(|e| {
                format!(
                    "{} {:?}: {}",
                    e.key,
                    e.cids,
                    match &e.outcome {
                        Ok(m) => format!("handed back {m:?}"),
                        Err(x) => format!("FAILED {x}"),
                    }
                )
            })
            .collect::<Vec<_>>()
            .join("; "),
        Done::Pruned(r) => format!("pruned {r:?}"),
        Done::Cleanup(m) => format!("{m:?}"),
        Done::Restored(s) => s.clone(),
    }
}

fn removal(r: &Removal) -> String {
    match r {
        Removal::ReferenceRemoved { remaining } => format!("removed; remaining {remaining:?}"),
        Removal::NotRecorded { .. } => "NOT RECORDED (exit 3)".into(),
        other => format!("{other:?}"),
    }
}
