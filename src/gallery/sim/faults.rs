//! The faults a run injects, each at a step the seed chooses:
//!
//! - a 429/503 storm on one ARM method (`FakeGallery::fail`, a few calls);
//! - a late tag write (`probe::LateKind`: the answer lost and the PATCH applied later, or a
//!   duplicate applied again later);
//! - a lease running out under its holder mid-command (`locks::SimLocks::expire`);
//! - a crash of a running command at its next await point (see also `steps`: a crash point
//!   chosen when a command starts);
//! - one record copy deleted, emptied, garbled, replaced by another version's record, or by a
//!   valid-looking record of other content with a higher generation (issue 44 item 2) — only
//!   while the other copy is good: one damaged copy must lose nothing (docs/references.md);
//! - rarely, both copies garbled (decisions must refuse until the operator repairs them,
//!   `outside::repair_one`);
//! - an invalid intent beside a version's lock (a reference `x,y`, or a holder with a space:
//!   issue 44 item 3): input another process wrote.

use crate::gallery::fake::Fault;
use crate::gallery::lock::Intent;
use crate::gallery::record;

use super::driver::Run;
use super::probe::{LateKind, VersionAt};
use super::world::{sha_of, DEFINITION, KEYS, OTHER_SHA};

/// The ARM methods a storm hits.
const STORM_METHODS: [&str; 6] = [
    "get_version",
    "set_version_tags",
    "delete_version",
    "list_versions",
    "list_consumers",
    "list_definitions",
];

pub fn fault_step(run: &mut Run) {
    let g = run.rng.below(run.world.galleries.len());
    let key = *run.rng.pick(&KEYS);
    let at: VersionAt = (g, DEFINITION.to_string(), key.to_string());
    let kind = run.rng.weighted(&[22, 20, 10, 12, 22, 3, 6]);
    let family = [
        "storm", "late", "lease", "crash", "tamper", "tamper", "intent",
    ][kind];
    if !run.world.profile.on(family) {
        return;
    }
    match kind {
        0 => storm(run, g),
        1 => {
            let kind = if run.rng.percent(60) {
                LateKind::LostAnswer
            } else {
                LateKind::Duplicate
            };
            run.world.probe.arm_late(g, kind);
            run.fault(
                "late tag write",
                format!("g{g}: the next tag write is {kind:?}"),
            );
        }
        2 => expire(run, g),
        3 => crash_now(run),
        4 => tamper(run, &at),
        5 => damage_both(run, &at),
        _ => bad_intent(run, &at),
    }
}

fn storm(run: &mut Run, g: usize) {
    let method = *run.rng.pick(&STORM_METHODS);
    let (status, code) = if run.rng.percent(50) {
        (429, "TooManyRequests")
    } else {
        (503, "ServiceUnavailable")
    };
    let n = run.rng.between(1, 5) as usize;
    run.world.galleries[g]
        .fake
        .fail(method, Fault::always(status, code).times(n));
    run.fault(
        "429/503 storm",
        format!("g{g} {method}: the next {n} calls answer {status}"),
    );
}

fn expire(run: &mut Run, g: usize) {
    let held = run.world.galleries[g].locks.held();
    if held.is_empty() {
        return;
    }
    let (name, op) = run.rng.pick(&held).clone();
    if run.world.galleries[g].locks.expire(&name) {
        run.fault(
            "lease expiry",
            format!("the lease of op{} on {name} ran out", op.unwrap_or(0)),
        );
    }
}

fn crash_now(run: &mut Run) {
    if run.tasks.is_empty() {
        return;
    }
    let i = run.rng.below(run.tasks.len());
    let extra = run.rng.between(0, 2);
    let t = &mut run.tasks[i];
    t.crash_after = Some(t.polls + extra);
    let id = t.id;
    run.fault("crash", format!("op{id} is killed {extra} polls from now"));
}

/// Whether `body` is a record copy the loader would use for version `key`.
fn good_copy(body: Option<&[u8]>, key: &str) -> bool {
    let Some(v) = body.and_then(|b| serde_json::from_slice::<serde_json::Value>(b).ok()) else {
        return false;
    };
    v["kind"] == record::KIND
        && v["definition"] == DEFINITION
        && v["version"] == key
        && (v["image_sha256"].is_null() || v["image_sha256"] == sha_of(key).as_str())
}

/// The versions whose record lives in blobs `names` of gallery `g`'s store (two galleries of
/// one name share one when the store is shared and the names carry no identity).
fn sharing(run: &Run, g: usize, key: &str) -> Vec<VersionAt> {
    let lock = run.world.galleries[g].lock_name(key);
    run.world
        .galleries
        .iter()
        .enumerate()
        .filter(|(h, other)| {
            *h == g
                || (std::sync::Arc::ptr_eq(&other.locks, &run.world.galleries[g].locks)
                    && other.lock_name(key) == lock)
        })
        .map(|(h, _)| (h, DEFINITION.to_string(), key.to_string()))
        .collect()
}

fn tamper(run: &mut Run, at: &VersionAt) {
    let g = &run.world.galleries[at.0];
    let names = record::copy_names(&g.lock_name(&at.2));
    let store = g.locks.store().clone();
    let i = run.rng.below(2);
    let other = store.body(&names[1 - i]);
    if !good_copy(other.as_deref(), &at.2) || run.damaged.contains_key(at) {
        return;
    }
    let mut doc: serde_json::Value =
        serde_json::from_slice(other.as_deref().unwrap_or_default()).unwrap_or_default();
    let (what, body): (&str, Option<Vec<u8>>) = match run.rng.below(5) {
        0 => ("deleted", None),
        1 => ("emptied", Some(Vec::new())),
        2 => (
            "garbled",
            Some(br#"{"kind": "stemcell-gallery/refer"#.to_vec()),
        ),
        3 => {
            let other_key = KEYS
                .iter()
                .find(|k| **k != at.2)
                .copied()
                .unwrap_or("9.9.9");
            doc["version"] = other_key.into();
            (
                "replaced by another version's record",
                Some(doc.to_string().into_bytes()),
            )
        }
        _ => {
            doc["image_sha256"] = OTHER_SHA.into();
            let gen = doc["generation"].as_u64().unwrap_or(0);
            doc["generation"] = (gen + 1000).into();
            (
                "replaced by a valid-looking record of other content, 1000 generations ahead",
                Some(doc.to_string().into_bytes()),
            )
        }
    };
    store.tamper(&names[i], body.as_deref());
    run.fault(
        "record copy damaged",
        format!("g{} {} copy {} ({}) {what}", at.0, at.2, i, names[i]),
    );
}

fn damage_both(run: &mut Run, at: &VersionAt) {
    let g = &run.world.galleries[at.0];
    let names = record::copy_names(&g.lock_name(&at.2));
    let store = g.locks.store().clone();
    let saved = [store.body(&names[0]), store.body(&names[1])];
    if saved.iter().any(Option::is_none) || run.damaged.contains_key(at) {
        return;
    }
    for n in &names {
        store.tamper(n, Some(b"not a record"));
    }
    for v in sharing(run, at.0, &at.2) {
        run.model.version(&v).record_broken = true;
    }
    run.model.note_damage();
    run.damaged.insert(at.clone(), saved);
    run.fault(
        "both record copies damaged",
        format!("g{} {}: both copies garbled", at.0, at.2),
    );
}

fn bad_intent(run: &mut Run, at: &VersionAt) {
    let n = run.next_op;
    let (reference, holder, parts) = if run.rng.percent(50) {
        let r = format!("g{}-bad{n},x{n}", at.0);
        let parts = vec![format!("g{}-bad{n}", at.0), format!("x{n}"), r.clone()];
        (r, None, parts)
    } else {
        let r = run.rng.cid();
        (r.clone(), Some("a b".to_string()), vec![r])
    };
    let g = &run.world.galleries[at.0];
    g.locks.inject(
        &g.lock_name(&at.2),
        Intent {
            id: format!("sim-intent-{n}"),
            reference: reference.clone(),
            holder: holder.clone(),
            content: None,
            to_create: false,
            life: None,
            age: std::time::Duration::ZERO,
        },
    );
    run.model.injected.extend(parts);
    run.fault(
        "invalid intent",
        format!(
            "g{} {}: an intent blob naming reference {reference:?} held by {holder:?}",
            at.0, at.2
        ),
    );
}
