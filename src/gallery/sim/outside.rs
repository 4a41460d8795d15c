//! What happens to the galleries outside the tool's commands:
//!
//! - the plain Azure CPI's own writes of `stemcell_references` (docs/references.md: it takes no
//!   lock, appends its CID on `create_stemcell` to a version that is there, removes it on
//!   `delete_stemcell`, DELETEs the version when its list becomes empty, and PUTs the whole tag
//!   set it read): at once, or read now and written some steps later (its read-modify-write
//!   window, [`CpiPending`]);
//! - a version deleted outside the tool (portal, `az`), made again under its name from the same
//!   image, or marked Failed by Azure;
//! - late tag writes landing, and an operator repairing a record both of whose copies were
//!   damaged.

use std::collections::BTreeMap;

use crate::gallery::model::ProvisioningState;
use crate::gallery::{tags, GalleryApi, Phase};

use super::check::cpi_list;
use super::driver::{Gone, Run};
use super::probe::{Event, VersionAt};
use super::world::{sha_of, DEFINITION, KEYS};

/// The longest `stemcell_references` Azure takes (a tag value).
const TAG_VALUE_MAX: usize = 256;

#[derive(Debug, Clone)]
pub enum CpiAction {
    Append(String),
    Remove(String),
}

/// A plain CPI's write it has read for and not yet sent.
#[derive(Debug, Clone)]
pub struct CpiPending {
    pub at: VersionAt,
    pub life: u32,
    pub tags: BTreeMap<String, String>,
    pub action: CpiAction,
}

/// One plain CPI request: `create_stemcell` reusing a version, or `delete_stemcell` of a CID a
/// plain CPI holds.
pub async fn cpi_step(run: &mut Run) {
    let g = run.rng.below(run.world.galleries.len());
    let key = *run.rng.pick(&KEYS);
    let at: VersionAt = (g, DEFINITION.to_string(), key.to_string());
    let Some(v) = run.world.galleries[g].fake.version(DEFINITION, key) else {
        return;
    };
    // The plain CPI reuses only a version with one of its reference tags ("not created by
    // BOSH CPI" otherwise).
    if v.phase() != Phase::Serving
        || !(tags::has(&v.tags, tags::CPI_REFERENCES) || tags::has(&v.tags, tags::STEMCELL_NAME))
    {
        return;
    }
    let listed = cpi_list(&v.tags);
    let running = run.model.running_refs(g);
    let held: Vec<String> = run
        .model
        .version(&at)
        .cpi
        .iter()
        .filter(|c| listed.contains(c) && !running.contains(*c))
        .cloned()
        .collect();
    let action = if !held.is_empty() && run.rng.percent(45) {
        CpiAction::Remove(run.rng.pick(&held).clone())
    } else {
        let cid = run.rng.cid();
        run.model.note_used(g, &cid);
        CpiAction::Append(cid)
    };
    if run.rng.percent(35) {
        let life = run.model.version(&at).life;
        run.trace(format!("plain CPI g{g} reads {key} for {action:?}"));
        run.cpi_pending.push(CpiPending {
            at,
            life,
            tags: v.tags,
            action,
        });
        return;
    }
    cpi_write(run, &at, v.tags, action).await;
}

/// Send a plain CPI's write built on `read` (the tags as it read them).
pub async fn cpi_write(
    run: &mut Run,
    at: &VersionAt,
    read: BTreeMap<String, String>,
    action: CpiAction,
) {
    let (g, key) = (at.0, at.2.clone());
    let fake = run.world.galleries[g].fake.clone();
    let Some(current) = fake.version(DEFINITION, &key) else {
        run.trace(format!("plain CPI g{g} {key}: the version is gone (404)"));
        return;
    };
    let mut list = cpi_list(&read);
    let cid = match &action {
        CpiAction::Append(c) => {
            // A fifth plain CID would leave no room for the tool's sentinel, which the tool
            // then refuses clearly ("stemcell_references is full", docs/references.md): not
            // simulated, so that the tool's commands stay possible.
            if list.len() >= 4
                || list.iter().map(|x| x.len() + 1).sum::<usize>() + c.len() > TAG_VALUE_MAX
            {
                run.trace(format!(
                    "plain CPI g{g} {key}: create_stemcell refused, stemcell_references is full"
                ));
                return;
            }
            list.push(c.clone());
            c.clone()
        }
        CpiAction::Remove(c) => {
            list.retain(|x| x != c);
            c.clone()
        }
    };
    let stale = cpi_list(&read) != cpi_list(&current.tags);
    if list.is_empty() {
        // delete_stemcell of its last CID: DELETE.
        match fake.delete_version(DEFINITION, &key).await {
            Ok(()) => {
                run.world.probe.touched(at);
                run.trace(format!(
                    "plain CPI g{g} delete_stemcell {cid}: list empty{}, DELETEd {key}",
                    if stale { " (on a stale read)" } else { "" }
                ));
                let soft = run.world.soft_delete;
                let vm = run.model.version(at);
                vm.cpi.remove(&cid);
                if soft {
                    // Soft-deleted with the tags it had: a restore brings its last CID back
                    // ("References its tags held when it was deleted come back with it").
                    vm.maybe.insert(cid.clone());
                }
                let how = if stale { Gone::CpiStaleRead } else { Gone::Cpi };
                run.version_gone(at, "a plain CPI", &[cid], how);
            }
            Err(e) => run.trace(format!("plain CPI g{g} DELETE {key} failed: {e}")),
        }
        return;
    }
    let mut next = read.clone();
    next.retain(|k, _| !k.eq_ignore_ascii_case(tags::CPI_REFERENCES));
    next.insert(tags::CPI_REFERENCES.to_string(), list.join(","));
    let (was, now) = (cpi_list(&current.tags), cpi_list(&next));
    let sentinel = tags::sentinel(DEFINITION, &key);
    let vm = run.model.version(at);
    if was.contains(&sentinel) && !now.contains(&sentinel) && !vm.acked.is_empty() {
        vm.stale_sentinel = true;
    }
    // Another plain CPI's CID its stale read did not have: that CPI's loss, not the tool's.
    let lost: Vec<String> = was
        .iter()
        .filter(|c| !now.contains(*c) && **c != cid && tags::is_cid(c))
        .cloned()
        .collect();
    for c in &lost {
        run.model.cpi_lost(at, c);
    }
    let vm = run.model.version(at);
    // And one a plain CPI removed that its stale read still had: held by a plain CPI again.
    let back: Vec<String> = now
        .iter()
        .filter(|c| vm.cpi_gone.contains(*c) && !was.contains(*c))
        // Not one the tool was asked to remove (its record says removed: it stays removed).
        .filter(|c| !vm.maybe.contains(*c) && !vm.removed.contains(*c))
        .cloned()
        .collect();
    for c in &back {
        vm.cpi_gone.remove(c);
        vm.cpi.insert(c.clone());
    }
    vm.stale_tags |= stale;
    match &action {
        CpiAction::Append(c) => {
            vm.cpi.insert(c.clone());
        }
        CpiAction::Remove(c) => {
            vm.cpi.remove(c);
            vm.cpi_gone.insert(c.clone());
        }
    }
    fake.modify_version(DEFINITION, &key, |v| v.tags = next);
    run.world.probe.touched(at);
    run.trace(format!(
        "plain CPI g{g} {key}: {action:?}; stemcell_references now {now:?}{}",
        if lost.is_empty() {
            String::new()
        } else {
            format!(" (its stale read dropped {lost:?})")
        }
    ));
}

/// Send one plain CPI write read earlier (only to the life it read).
pub async fn cpi_pending_step(run: &mut Run) {
    if run.cpi_pending.is_empty() {
        return;
    }
    let i = run.rng.below(run.cpi_pending.len());
    let p = run.cpi_pending.remove(i);
    if run.model.version(&p.at).life != p.life {
        return;
    }
    cpi_write(run, &p.at, p.tags, p.action).await;
}

/// A change made outside the tool: a version deleted, made again from the same image, or
/// marked Failed by Azure.
pub async fn outside_step(run: &mut Run) {
    let g = run.rng.below(run.world.galleries.len());
    let key = *run.rng.pick(&KEYS);
    let at: VersionAt = (g, DEFINITION.to_string(), key.to_string());
    let fake = run.world.galleries[g].fake.clone();
    let exists = fake.version(DEFINITION, key).is_some();
    let (recreate, failed) = (
        run.world.profile.on("recreate"),
        run.world.profile.on("failed"),
    );
    match run.rng.weighted(&[40, 40, 20]) {
        0 if exists && recreate => delete_outside(run, &at).await,
        1 if !exists && !run.world.soft_delete && recreate => {
            let tag_set = BTreeMap::from([(tags::IMAGE_SHA256.to_string(), sha_of(key))]);
            // Azure stamps `publishedDate` when it creates a version: each life its own.
            let next_life = i64::from(run.model.version(&at).life) + 1;
            fake.add_version(
                DEFINITION,
                key,
                ProvisioningState::parse("Succeeded"),
                time::macros::datetime!(2026-01-01 0:00 UTC) + time::Duration::hours(next_life),
                tag_set,
            );
            run.world.probe.born(&at);
            let running = run.model.running_refs(g);
            let vm = run.model.version(&at);
            // A replacement's note outlives a life made and deleted by someone else before the
            // replacement's DELETE lands (window (3) of docs/RELIABILITY.md).
            let noted = std::mem::take(&mut vm.carried_unknowingly);
            vm.new_life(&running);
            vm.carried_unknowingly = noted;
            run.model.life_changed(&at);
            let life = run.model.version(&at).life;
            run.fault(
                "outside re-create",
                format!("g{g} {key} made again outside the tool from the same image (life {life})"),
            );
        }
        2 if exists && !run.world.soft_delete && failed => {
            fake.modify_version(DEFINITION, key, |v| {
                v.provisioning_state = ProvisioningState::parse("Failed")
            });
            run.world.probe.touched(&at);
            run.fault(
                "version failed",
                format!("g{g} {key} marked Failed by Azure"),
            );
        }
        _ => {}
    }
}

/// Version `at` deleted outside the tool (portal, `az`, an older CPI).
async fn delete_outside(run: &mut Run, at: &VersionAt) {
    // A DELETE of the tool is under way: the version is `Deleting` on Azure, and it is the
    // tool's DELETE that removes it (another DELETE changes nothing).
    if run.world.probe.lock().deleting.contains_key(at) {
        return;
    }
    let fake = run.world.galleries[at.0].fake.clone();
    if fake.delete_version(&at.1, &at.2).await.is_ok() {
        run.world.probe.touched(at);
        run.fault(
            "outside delete",
            format!("g{} {} deleted outside the tool", at.0, at.2),
        );
        // What an earlier outside delete left to be carried unknowingly stays so past this one
        // (a life made and deleted again outside before the replacement's DELETE lands).
        let earlier = std::mem::take(&mut run.model.version(at).carried_unknowingly);
        run.version_gone(at, "outside", &[], Gone::Outside);
        run.model.version(at).carried_unknowingly = earlier;
        // A replacement of this Failed version noted its references and has not sent its
        // DELETE (it died, or is about to): the tool cannot tell this delete from its own.
        let noted = noted_to_carry(run, at);
        if !noted.is_empty() && !run.world.soft_delete {
            run.model.version(at).carried_unknowingly.extend(noted);
        }
    }
}

/// Land one held late tag write (only on the life it was sent to; a version gone takes none).
pub fn land_one(run: &mut Run) -> bool {
    let n = run.world.probe.held_count();
    if n == 0 {
        return false;
    }
    let Some(w) = run.world.probe.take_held(run.rng.below(n)) else {
        return false;
    };
    let fake = run.world.galleries[w.at.0].fake.clone();
    let Some(before) = fake.version(&w.at.1, &w.at.2) else {
        return true;
    };
    if run.world.probe.life(&w.at) != w.born {
        return true;
    }
    run.trace(format!("landing a {:?} tag write", w.kind));
    fake.modify_version(&w.at.1, &w.at.2, |v| v.tags = w.tags.clone());
    run.world.probe.touched(&w.at);
    if let (true, Some(op)) = (w.crossed, w.op) {
        run.world.probe.push(Event::CrossedLives {
            at: w.at.clone(),
            op,
            refs: crate::gallery::tags::references(&w.tags),
        });
    }
    run.world.probe.push(Event::TagWrite {
        at: w.at.clone(),
        op: w.op,
        before: before.tags,
        after: w.tags,
        blind: true,
        late: true,
    });
    run.events();
    true
}

/// The operator restores both copies of a record damaged by [`super::faults`] (as the
/// refusal's message says: from storage soft delete or versioning).
pub fn repair_one(run: &mut Run) -> bool {
    let Some(at) = run.damaged.keys().next().cloned() else {
        return false;
    };
    let Some(saved) = run.damaged.remove(&at) else {
        return false;
    };
    let g = &run.world.galleries[at.0];
    let names = crate::gallery::record::copy_names(&g.lock_name(&at.2));
    for (name, body) in names.iter().zip(saved) {
        g.locks.store().tamper(name, body.as_deref());
    }
    run.model.version(&at).record_broken = false;
    run.trace(format!(
        "operator restored both record copies of g{} {}",
        at.0, at.2
    ));
    // Restored while the version is gone (deleted outside meanwhile): a note to carry it holds
    // is window (3) again, as if the delete had come after the repair.
    let absent = run.world.galleries[at.0]
        .fake
        .version(&at.1, &at.2)
        .is_none();
    if absent && !run.world.soft_delete {
        let noted = noted_to_carry(run, &at);
        let vm = run.model.version(&at);
        let earlier: Vec<String> = noted
            .into_iter()
            .filter(|r| vm.past.contains(r) || vm.last_life.contains(r))
            .collect();
        vm.carried_unknowingly.extend(earlier);
    }
    true
}

/// The references a replacement of `at` noted to carry (`record::Record::carried`), as its
/// record's copies hold them now.
pub(super) fn noted_to_carry(run: &Run, at: &VersionAt) -> Vec<String> {
    let g = &run.world.galleries[at.0];
    crate::gallery::record::copy_names(&g.lock_name(&at.2))
        .iter()
        .filter_map(|name| g.locks.store().body(name))
        .filter_map(|body| serde_json::from_slice::<crate::gallery::record::Record>(&body).ok())
        .flat_map(|r| r.carried)
        .collect()
}
