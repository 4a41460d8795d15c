//! Property tests of the cleanup planner over random worlds, against a brute-force oracle:
//! - it never plans the deletion of a version with any evidence of use, a protect tag, too young,
//!   in progress (or in an unknown state), or within keep-latest;
//! - with all evidence read, it plans the deletion of every version with none of those;
//! - more evidence never means more deletions.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use stemcell_gallery::cleanup::evidence::{
    Basis, ConsumersSource, FileKind, ReferencesSource, UsageSource,
};
use stemcell_gallery::cleanup::{plan, Claim, ClaimTarget, Evidence, Inventory, Policy, Verdict};
use stemcell_gallery::gallery::fake::FakeGallery;
use stemcell_gallery::gallery::{tags, ConsumerKind, ImageVersion, ProvisioningState};
use time::macros::datetime;
use time::OffsetDateTime;

const NOW: OffsetDateTime = datetime!(2026-03-01 12:00 UTC);
const STEMS: [&str; 2] = ["stemA", "stemB"];
const DEFS: [&str; 5] = [
    "stemA",
    "stemA-gen2",
    "stemA-create-env",
    "stemB",
    "stemB-create-env",
];

#[derive(Debug, Clone)]
struct GenVersion {
    def: usize,
    minor: u32,
    patch: u32,
    state: ProvisioningState,
    age_hours: i64,
    protect: bool,
    has_ref: bool,
    exclude_from_latest: bool,
    /// 0 none, 1 VM, 2 disk, 3 scale-set instance.
    consumer: u8,
}

#[derive(Debug, Clone)]
struct World {
    versions: Vec<GenVersion>,
    /// (stem, minor, patch, cid of version index or none)
    director_rows: Vec<(usize, u32, u32, Option<usize>)>,
    create_env_rows: Vec<(usize, u32, u32, Option<usize>)>,
    /// Definitions used via `latest` (0) or the definition id (1).
    latest_users: Vec<(usize, bool)>,
    keep_latest: usize,
    min_age_hours: u64,
}

fn state() -> impl Strategy<Value = ProvisioningState> {
    prop_oneof![
        6 => Just(ProvisioningState::Succeeded),
        2 => Just(ProvisioningState::Failed),
        1 => Just(ProvisioningState::Creating),
        1 => Just(ProvisioningState::Updating),
        1 => Just(ProvisioningState::Deleting),
        1 => Just(ProvisioningState::Migrating),
        1 => Just(ProvisioningState::Canceled),
    ]
}

fn version() -> impl Strategy<Value = GenVersion> {
    (
        0..DEFS.len(),
        0u32..8,
        0u32..2,
        state(),
        0i64..400,
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
        prop_oneof![6 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)],
    )
        .prop_map(
            |(
                def,
                minor,
                patch,
                state,
                age_hours,
                protect,
                has_ref,
                exclude_from_latest,
                consumer,
            )| {
                GenVersion {
                    def,
                    minor,
                    patch,
                    state,
                    age_hours,
                    protect,
                    has_ref,
                    exclude_from_latest,
                    consumer,
                }
            },
        )
}

fn row() -> impl Strategy<Value = (usize, u32, u32, Option<usize>)> {
    (
        0..STEMS.len(),
        0u32..8,
        0u32..2,
        prop::option::of(0usize..40),
    )
}

fn world() -> impl Strategy<Value = World> {
    (
        prop::collection::vec(version(), 0..40),
        prop::collection::vec(row(), 0..4),
        prop::collection::vec(row(), 0..3),
        prop::collection::vec((0..DEFS.len(), any::<bool>()), 0..3),
        0usize..4,
        prop_oneof![Just(0u64), Just(24), Just(72)],
    )
        .prop_map(
            |(
                versions,
                director_rows,
                create_env_rows,
                latest_users,
                keep_latest,
                min_age_hours,
            )| {
                World {
                    versions,
                    director_rows,
                    create_env_rows,
                    latest_users,
                    keep_latest,
                    min_age_hours,
                }
            },
        )
}

fn cid(i: usize) -> String {
    format!("bosh-stemcell-{i:04}")
}

fn key(v: &GenVersion) -> String {
    format!("1.{}.{}", v.minor, v.patch)
}

/// BOSH spells `1.3.0` as `1.3`.
fn bosh_version(minor: u32, patch: u32) -> String {
    if patch == 0 {
        format!("1.{minor}")
    } else {
        format!("1.{minor}.{patch}")
    }
}

struct Built {
    fake: Arc<FakeGallery>,
    /// Generated versions after de-duplication of (definition, version).
    versions: Vec<GenVersion>,
    inventory: Arc<Inventory>,
    evidence: Vec<Evidence>,
    policy: Policy,
}

fn build(w: &World) -> Built {
    let fake = Arc::new(FakeGallery::default());
    let mut seen = BTreeSet::new();
    let mut versions = Vec::new();
    for v in &w.versions {
        if seen.insert((v.def, key(v))) {
            versions.push(v.clone());
        }
    }
    for (i, v) in versions.iter().enumerate() {
        let mut t = BTreeMap::new();
        if v.protect {
            t.insert(tags::PROTECT.to_string(), "yes".to_string());
        }
        if v.has_ref {
            t.insert(tags::CPI_REFERENCES.to_string(), cid(i));
        }
        let mut iv = fake.add_version(
            DEFS[v.def],
            &key(v),
            v.state.clone(),
            NOW - time::Duration::hours(v.age_hours),
            t,
        );
        iv.exclude_from_latest = v.exclude_from_latest;
        fake.put_version(iv.clone());
        let kind = match v.consumer {
            1 => Some(ConsumerKind::VirtualMachine),
            2 => Some(ConsumerKind::Disk),
            3 => Some(ConsumerKind::ScaleSetInstance),
            _ => None,
        };
        if let Some(kind) = kind {
            fake.add_consumer(kind, &format!("consumer-{i}"), &iv.id);
        }
    }
    for (n, (d, by_definition_id)) in w.latest_users.iter().enumerate() {
        let def_id = fake.gallery().definition_id(DEFS[*d]);
        let image = if *by_definition_id {
            def_id
        } else {
            format!("{def_id}/versions/latest")
        };
        fake.add_consumer(ConsumerKind::ScaleSet, &format!("vmss-{n}"), &image);
    }

    let inventory =
        Arc::new(futures::executor::block_on(Inventory::gather(fake.as_ref(), "g")).unwrap());
    let mut evidence =
        vec![
            futures::executor::block_on(ReferencesSource::new(inventory.clone()).collect())
                .unwrap(),
        ];
    for (name, rows, director) in [
        ("director stemcells d.json", &w.director_rows, true),
        ("create-env state s.json", &w.create_env_rows, false),
    ] {
        let mut claims = Vec::new();
        for (stem, minor, patch, c) in rows {
            let version = bosh_version(*minor, *patch);
            let cid = c.map(cid).unwrap_or_default();
            let basis = if director {
                Basis::FileRecord {
                    kind: FileKind::DirectorStemcells,
                    file: "d.json".into(),
                    name: STEMS[*stem].into(),
                    version: version.clone(),
                    cid: cid.clone(),
                }
            } else {
                Basis::FileRecord {
                    kind: FileKind::CreateEnvState,
                    file: "s.json".into(),
                    name: STEMS[*stem].into(),
                    version: version.clone(),
                    cid: cid.clone(),
                }
            };
            claims.push(Claim {
                target: ClaimTarget::StemcellNameVersion {
                    name: STEMS[*stem].into(),
                    version,
                },
                basis: basis.clone(),
                reason: "held".into(),
                source: name.into(),
            });
            if !cid.is_empty() {
                claims.push(Claim {
                    target: ClaimTarget::Cid(cid),
                    basis,
                    reason: "held".into(),
                    source: name.into(),
                });
            }
        }
        evidence.push(Evidence {
            source: name.into(),
            claims,
            holder: None,
        });
    }
    evidence
        .push(futures::executor::block_on(ConsumersSource::new(fake.clone()).collect()).unwrap());
    let mut policy = Policy::new(NOW);
    policy.keep_latest = w.keep_latest;
    policy.min_age = Duration::from_secs(w.min_age_hours * 3600);
    Built {
        fake,
        versions,
        inventory,
        evidence,
        policy,
    }
}

fn numeric(v: &GenVersion) -> (u32, u32) {
    (v.minor, v.patch)
}

/// Brute force: why must version `i` be kept? (empty = it may be deleted)
fn oracle(w: &World, b: &Built, i: usize) -> Vec<&'static str> {
    let v = &b.versions[i];
    let vs = &b.versions;
    let mut why = Vec::new();
    if v.has_ref {
        why.push("reference");
    }
    if v.consumer != 0 {
        why.push("consumer");
    }
    // `latest` could resolve to any version not excluded from latest that no newer, not excluded,
    // Succeeded version of its definition outranks (a newer Creating, Failed, ... one may be, or
    // become, what it serves). A scale set's model runs nothing itself: only that counts.
    for (d, _) in &w.latest_users {
        let outranked = (0..vs.len()).any(|j| {
            vs[j].def == *d
                && vs[j].state == ProvisioningState::Succeeded
                && !vs[j].exclude_from_latest
                && numeric(&vs[j]) > numeric(v)
        });
        if v.def == *d && !v.exclude_from_latest && !outranked {
            why.push("latest could resolve to it");
        }
    }
    for (stem, minor, patch, c) in w.director_rows.iter().chain(&w.create_env_rows) {
        if DEFS[v.def].starts_with(STEMS[*stem]) && (v.minor, v.patch) == (*minor, *patch) {
            why.push("held by name and version");
        }
        if c.is_some_and(|c| c == i && v.has_ref) {
            why.push("held by cid");
        }
    }
    if v.protect {
        why.push("protected");
    }
    if (v.age_hours as u64) * 3600 < b.policy.min_age.as_secs() {
        why.push("too young");
    }
    if !matches!(
        v.state,
        ProvisioningState::Succeeded | ProvisioningState::Failed
    ) {
        why.push("in progress or unknown");
    }
    if v.state == ProvisioningState::Succeeded {
        let newer = vs
            .iter()
            .filter(|o| {
                o.def == v.def && o.state == ProvisioningState::Succeeded && numeric(o) > numeric(v)
            })
            .count();
        if newer < w.keep_latest {
            why.push("keep latest");
        }
    }
    why
}

fn verdicts(
    inventory: &Inventory,
    evidence: &[Evidence],
    policy: &Policy,
) -> BTreeMap<String, Verdict> {
    plan(inventory, evidence, policy)
        .entries
        .into_iter()
        .map(|e| (e.observed.id, e.verdict))
        .collect()
}

fn id_of(b: &Built, i: usize) -> String {
    let v = &b.versions[i];
    b.fake.gallery().version_id(DEFS[v.def], &key(v))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn planner_deletes_exactly_the_versions_without_any_evidence_or_policy_keep(w in world()) {
        let b = build(&w);
        let got = verdicts(&b.inventory, &b.evidence, &b.policy);
        prop_assert_eq!(got.len(), b.versions.len());
        for i in 0..b.versions.len() {
            let why = oracle(&w, &b, i);
            let verdict = got[&id_of(&b, i)];
            if why.is_empty() {
                prop_assert_eq!(verdict, Verdict::Delete, "version {:?} has no evidence", b.versions[i]);
            } else {
                prop_assert_eq!(verdict, Verdict::Keep, "version {:?} must be kept: {:?}", b.versions[i], why);
            }
        }
    }

    #[test]
    fn less_evidence_never_deletes_fewer_more_evidence_never_deletes_more(w in world(), drop in 0usize..4) {
        let b = build(&w);
        let full = verdicts(&b.inventory, &b.evidence, &b.policy);
        let mut partial_ev = b.evidence.clone();
        partial_ev.remove(drop);
        let partial = verdicts(&b.inventory, &partial_ev, &b.policy);
        for (id, v) in &full {
            if *v == Verdict::Delete {
                prop_assert_eq!(partial[id], Verdict::Delete, "{}", id);
            }
        }
    }

    #[test]
    fn every_kept_version_says_why_and_every_deleted_one_has_no_keep_reason(w in world()) {
        let b = build(&w);
        let p = plan(&b.inventory, &b.evidence, &b.policy);
        for e in &p.entries {
            prop_assert!(!e.reasons.is_empty());
            let keeps = e.reasons.iter().any(|r| r.keeps());
            prop_assert_eq!(keeps, e.verdict == Verdict::Keep, "{:?}", e.reasons);
        }
        // Deterministic: the same inputs give the same plan.
        prop_assert_eq!(p, plan(&b.inventory, &b.evidence, &b.policy));
    }
}

#[test]
fn with_no_evidence_sources_nothing_is_deleted() {
    let w = World {
        versions: vec![GenVersion {
            def: 0,
            minor: 1,
            patch: 0,
            state: ProvisioningState::Succeeded,
            age_hours: 1000,
            protect: false,
            has_ref: false,
            exclude_from_latest: false,
            consumer: 0,
        }],
        director_rows: vec![],
        create_env_rows: vec![],
        latest_users: vec![],
        keep_latest: 0,
        min_age_hours: 0,
    };
    let b = build(&w);
    let _: &ImageVersion = &b.inventory.versions[0];
    assert_eq!(
        verdicts(&b.inventory, &b.evidence, &b.policy)[&id_of(&b, 0)],
        Verdict::Delete
    );
    assert_eq!(
        verdicts(&b.inventory, &[], &b.policy)[&id_of(&b, 0)],
        Verdict::Keep
    );
}
