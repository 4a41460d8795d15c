//! Cleanup scenarios an operator meets, run against the in-memory `FakeGallery`.
//! (The emulator-backed CLI tests exercise the same code through the real Azure adapter.)

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stemcell_gallery::cleanup::evidence::{
    ConsumersSource, CreateEnvStateFile, DirectorStemcellsFile, ReferencesSource,
};
use stemcell_gallery::cleanup::executor::BlobCleaner;
use stemcell_gallery::cleanup::{
    collect_all, plan, CleanupError, DeleteOutcome, Executor, Inventory, Policy, Reason,
    UsageSource, Verdict,
};
use stemcell_gallery::cli::cleanup::{run_with, CleanupArgs};
use stemcell_gallery::cli::exit_for;
use stemcell_gallery::error::Exit;
use stemcell_gallery::gallery::fake::{FakeGallery, Fault};
use stemcell_gallery::gallery::{tags, ConsumerKind, ProvisioningState};
use time::macros::datetime;
use time::OffsetDateTime;

const STEMCELL: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
const NOW: OffsetDateTime = datetime!(2026-03-01 12:00 UTC);

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/cleanup")
        .join(name)
}

fn days_ago(d: i64) -> OffsetDateTime {
    NOW - time::Duration::days(d)
}

fn tags_of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn ours(mode: &str, version: &str) -> BTreeMap<String, String> {
    tags_of(&[
        (tags::MODE, mode),
        (tags::STEMCELL, STEMCELL),
        (tags::STEMCELL_VERSION, version),
    ])
}

fn args() -> CleanupArgs {
    CleanupArgs {
        apply: false,
        director_stemcells: vec![],
        create_env_state: vec![],
        keep_latest: 2,
        min_age: Duration::from_secs(24 * 3600),
        protect_tag: tags::PROTECT.to_string(),
        concurrency: 4,
        blobs: false,
        consumer_subscription: vec![],
        plan: None,
    }
}

fn reason_kinds(doc: &serde_json::Value, version_id: &str) -> Vec<String> {
    let v = doc["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == version_id)
        .unwrap_or_else(|| panic!("{version_id} not in the report"));
    v["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap().to_string())
        .collect()
}

fn verdict_of(doc: &serde_json::Value, version_id: &str) -> String {
    doc["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == version_id)
        .unwrap()["verdict"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The story behind the project: create-env's recreate failed half-way, leaving
/// `current_stemcell_id: ""`. The director VM still runs from the image. Cleanup keeps it, and
/// says both why (the state record and the VM) — while an unrelated orphan is deleted.
#[tokio::test]
async fn failed_recreate_with_empty_current_stemcell_id_keeps_the_live_directors_image() {
    let fake = Arc::new(FakeGallery::default());
    let def = format!("{STEMCELL}-create-env");
    let live = fake.add_version(
        &def,
        "1.506.0",
        ProvisioningState::Succeeded,
        days_ago(30),
        ours("create-env", "1.506"),
    );
    let orphan = fake.add_version(
        &def,
        "1.400.0",
        ProvisioningState::Succeeded,
        days_ago(90),
        ours("create-env", "1.400"),
    );
    fake.add_consumer(
        ConsumerKind::VirtualMachine,
        "/subscriptions/s/resourceGroups/bosh-rg/providers/Microsoft.Compute/virtualMachines/vm-3f1e2d4c",
        &live.id,
    );

    let mut a = args();
    a.apply = true;
    a.keep_latest = 0; // so that keep-latest cannot be what saves it
    a.create_env_state = vec![fixture("bosh-state-failed-recreate.json")];
    let report = run_with(fake.clone(), a, NOW).await.unwrap();

    assert_eq!(report.exit, Exit::Success);
    assert!(
        fake.version(&def, "1.506.0").is_some(),
        "the live image must survive"
    );
    assert!(
        fake.version(&def, "1.400.0").is_none(),
        "the orphan is deleted"
    );
    assert_eq!(verdict_of(&report.json, &live.id), "keep");
    assert_eq!(
        reason_kinds(&report.json, &live.id),
        vec!["create_env_holds", "used_by_consumer"]
    );
    assert!(report
        .human
        .contains("current_stemcell_id is empty — an empty pointer is not evidence of non-use"));
    // The table names the VM the short way; the JSON reason keeps the whole ARM id.
    assert!(
        report
            .human
            .contains("VM bosh-rg/virtualMachines/vm-3f1e2d4c was created from it"),
        "{}",
        report.human
    );
    assert!(
        !report.human.contains("/subscriptions/"),
        "{}",
        report.human
    );
    let detail = report.json["versions"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["id"] == live.id.as_str()))
        .map(|v| v["reasons"].to_string())
        .unwrap_or_default();
    assert!(
        detail.contains("/subscriptions/s/resourceGroups/bosh-rg/providers/Microsoft.Compute/virtualMachines/vm-3f1e2d4c"),
        "{detail}"
    );
    assert_eq!(reason_kinds(&report.json, &orphan.id), vec!["unused"]);
    assert_eq!(report.json["summary"]["deleted"], 1);
    assert_eq!(fake.calls("delete_version"), 1);
}

/// A world where everything not protected by policy would be deleted.
fn deletable_world() -> Arc<FakeGallery> {
    let fake = Arc::new(FakeGallery::default());
    for v in ["1.400.0", "1.450.0", "1.480.0", "1.490.0"] {
        fake.add_version(
            STEMCELL,
            v,
            ProvisioningState::Succeeded,
            days_ago(60),
            BTreeMap::new(),
        );
    }
    fake
}

/// Each evidence source failing in turn → exit 5, the source named, not one deletion attempted.
#[tokio::test]
async fn any_unreadable_evidence_source_refuses_with_exit_5_and_deletes_nothing() {
    let good_director = fixture("director-stemcells.json");
    let good_state = fixture("bosh-state-failed-recreate.json");
    let missing = fixture("no-such-file.json");
    /// (story, director lists, create-env states, consumers listing fails, what the error names)
    type Case = (&'static str, Vec<PathBuf>, Vec<PathBuf>, bool, String);
    let cases: Vec<Case> = vec![
        (
            "consumers listing throttled",
            vec![good_director.clone()],
            vec![good_state.clone()],
            true,
            ConsumersSource::NAME.to_string(),
        ),
        (
            "director list missing",
            vec![good_director.clone(), missing.clone()],
            vec![good_state.clone()],
            false,
            missing.display().to_string(),
        ),
        (
            "director list truncated",
            vec![fixture("director-stemcells-truncated.json")],
            vec![],
            false,
            "director-stemcells-truncated.json".into(),
        ),
        (
            "director list is another command's output",
            vec![fixture("director-vms-not-stemcells.json")],
            vec![],
            false,
            "director-vms-not-stemcells.json".into(),
        ),
        (
            "create-env state missing",
            vec![],
            vec![missing.clone()],
            false,
            missing.display().to_string(),
        ),
        (
            "create-env state without stemcells",
            vec![],
            vec![fixture("bosh-state-no-stemcells-field.json")],
            false,
            "bosh-state-no-stemcells-field.json".into(),
        ),
        (
            "create-env state is a director list",
            vec![],
            vec![good_director.clone()],
            false,
            "director-stemcells.json".into(),
        ),
    ];
    for (story, director, state, consumers_fail, named) in cases {
        let fake = deletable_world();
        if consumers_fail {
            fake.fail("list_consumers", Fault::always(429, "TooManyRequests"));
        }
        let mut a = args();
        a.apply = true;
        a.keep_latest = 0;
        a.director_stemcells = director;
        a.create_env_state = state;
        let err = run_with(fake.clone(), a, NOW).await.expect_err(story);
        let message = format!("{err:#}");
        eprintln!("{story}: {message}");
        assert_eq!(
            exit_for(&err),
            Exit::EvidenceIncomplete,
            "{story}: {message}"
        );
        assert!(message.contains(&named), "{story}: {message}");
        assert!(
            message.contains("nothing was deleted"),
            "{story}: {message}"
        );
        assert_eq!(fake.calls("delete_version"), 0, "{story}");
        assert_eq!(fake.calls("get_version"), 0, "{story}");
        assert_eq!(fake.versions().len(), 4, "{story}");
    }
}

#[tokio::test]
async fn every_failing_source_is_named_not_only_the_first() {
    let fake = deletable_world();
    fake.fail("list_consumers", Fault::always(403, "AuthorizationFailed"));
    let sources: Vec<Box<dyn UsageSource>> = vec![
        Box::new(DirectorStemcellsFile::new(fixture("missing-a.json"))),
        Box::new(ConsumersSource::new(fake.clone())),
    ];
    let err = collect_all(&sources).await.unwrap_err();
    let CleanupError::EvidenceIncomplete {
        source_name,
        also_failed,
        ..
    } = &err
    else {
        panic!("{err}")
    };
    assert!(source_name.ends_with("missing-a.json"));
    assert_eq!(also_failed, &vec![ConsumersSource::NAME.to_string()]);
    assert_eq!(
        fake.calls("list_consumers"),
        1,
        "every source is still read"
    );
}

/// A consumer listing that fails during apply's re-scan also refuses, before any deletion.
#[tokio::test]
async fn consumer_rescan_failure_during_apply_deletes_nothing() {
    let fake = deletable_world();
    let (inventory, evidence, policy) = observe(&fake, &[], &[], 0).await;
    let planned = plan(&inventory, &evidence, &policy);
    assert_eq!(planned.count(Verdict::Delete), 4);
    fake.fail("list_consumers", Fault::always(503, "ServiceUnavailable"));
    let err = Executor::new(fake.clone(), 4)
        .apply(&inventory, &evidence, &planned, &policy)
        .await
        .unwrap_err();
    assert!(matches!(err, CleanupError::EvidenceIncomplete { .. }));
    assert_eq!(fake.calls("delete_version"), 0);
}

async fn observe(
    fake: &Arc<FakeGallery>,
    director: &[PathBuf],
    state: &[PathBuf],
    keep_latest: usize,
) -> (
    Arc<Inventory>,
    Vec<stemcell_gallery::cleanup::Evidence>,
    Policy,
) {
    let inventory = Arc::new(Inventory::gather(fake.as_ref(), "test").await.unwrap());
    let mut sources: Vec<Box<dyn UsageSource>> =
        vec![Box::new(ReferencesSource::new(inventory.clone()))];
    for p in director {
        sources.push(Box::new(DirectorStemcellsFile::new(p)));
    }
    for p in state {
        sources.push(Box::new(CreateEnvStateFile::new(p)));
    }
    sources.push(Box::new(ConsumersSource::new(fake.clone())));
    let evidence = collect_all(&sources).await.unwrap();
    let mut policy = Policy::new(NOW);
    policy.keep_latest = keep_latest;
    (inventory, evidence, policy)
}

/// Between planning and deleting, the CPI recorded a new reference on one version and another
/// went into Updating: both are skipped, the rest are deleted; each deletion re-read first.
#[tokio::test]
async fn versions_changed_since_planning_are_skipped() {
    let fake = deletable_world();
    let (inventory, evidence, policy) = observe(&fake, &[], &[], 0).await;
    let planned = plan(&inventory, &evidence, &policy);
    assert_eq!(planned.count(Verdict::Delete), 4);

    fake.modify_version(STEMCELL, "1.450.0", |v| {
        v.tags
            .insert(tags::CPI_REFERENCES.into(), "bosh-stemcell-new".into());
    });
    fake.modify_version(STEMCELL, "1.480.0", |v| {
        v.provisioning_state = ProvisioningState::Updating;
    });
    fake.reset_calls();
    let out = Executor::new(fake.clone(), 4)
        .apply(&inventory, &evidence, &planned, &policy)
        .await
        .unwrap();
    let id = |v: &str| fake.gallery().version_id(STEMCELL, v);
    assert_eq!(out.results[&id("1.400.0")], DeleteOutcome::Deleted);
    assert_eq!(
        out.results[&id("1.450.0")],
        DeleteOutcome::SkippedChanged("tags".into())
    );
    assert_eq!(
        out.results[&id("1.480.0")],
        DeleteOutcome::SkippedChanged("provisioning state".into())
    );
    assert_eq!(out.results[&id("1.490.0")], DeleteOutcome::Deleted);
    assert_eq!((out.deleted(), out.skipped(), out.failed()), (2, 2, 0));
    assert_eq!(
        fake.calls("list_consumers"),
        2,
        "consumers re-scanned once, and once more after the deletions' locks were taken"
    );
    assert_eq!(fake.calls("get_version"), 4, "each deletion re-read first");
    assert_eq!(fake.calls("delete_version"), 2);
    assert!(fake.version(STEMCELL, "1.450.0").is_some());
    assert!(fake.version(STEMCELL, "1.480.0").is_some());
}

/// A VM created from a version after planning is found by the re-scan: the version is kept.
#[tokio::test]
async fn a_vm_created_after_planning_keeps_its_version() {
    let fake = deletable_world();
    let (inventory, evidence, policy) = observe(&fake, &[], &[], 0).await;
    let planned = plan(&inventory, &evidence, &policy);
    let target = fake.gallery().version_id(STEMCELL, "1.490.0");
    fake.add_consumer(ConsumerKind::VirtualMachine, "vm-new", &target);
    let out = Executor::new(fake.clone(), 4)
        .apply(&inventory, &evidence, &planned, &policy)
        .await
        .unwrap();
    assert_eq!(out.results[&target], DeleteOutcome::SkippedNowInUse);
    let entry = out
        .plan
        .entries
        .iter()
        .find(|e| e.observed.id == target)
        .unwrap();
    assert_eq!(entry.verdict, Verdict::Keep);
    assert!(entry.reasons.contains(&Reason::UsedByConsumer {
        kind: ConsumerKind::VirtualMachine,
        id: "vm-new".into()
    }));
    assert_eq!(out.deleted(), 3);
    assert!(fake.version(STEMCELL, "1.490.0").is_some());
}

/// One deletion failing does not stop the others; the command exits 1 and says which.
#[tokio::test]
async fn one_failed_delete_does_not_stop_the_others_and_exits_1() {
    let fake = deletable_world();
    fake.fail(
        &format!("delete_version {STEMCELL}/1.450.0"),
        Fault::always(409, "OperationNotAllowed"),
    );
    let mut a = args();
    a.apply = true;
    a.keep_latest = 0;
    let report = run_with(fake.clone(), a, NOW).await.unwrap();
    assert_eq!(report.exit, Exit::Error);
    assert_eq!(report.json["summary"]["deleted"], 3);
    assert_eq!(report.json["summary"]["failed"], 1);
    assert_eq!(fake.versions().len(), 1);
    assert!(report.human.contains("FAILED"));
    assert!(report.human.contains("OperationNotAllowed"));
}

#[tokio::test]
async fn deletions_run_concurrently_but_bounded() {
    let fake = Arc::new(FakeGallery::default());
    for i in 0..20 {
        fake.add_version(
            STEMCELL,
            &format!("1.{i}.0"),
            ProvisioningState::Succeeded,
            days_ago(60),
            BTreeMap::new(),
        );
    }
    let mut a = args();
    a.apply = true;
    a.keep_latest = 0;
    a.concurrency = 3;
    let report = run_with(fake.clone(), a, NOW).await.unwrap();
    assert_eq!(report.json["summary"]["deleted"], 20);
    assert_eq!(fake.max_concurrent_deletes(), 3);
}

/// Keep-latest counts Succeeded versions per definition, newest first; a young version is kept
/// by the grace period; both reasons are shown when both apply.
#[tokio::test]
async fn keep_latest_and_min_age() {
    let fake = Arc::new(FakeGallery::default());
    for v in ["1.1.0", "1.2.0", "1.3.0", "1.10.0"] {
        fake.add_version(
            STEMCELL,
            v,
            ProvisioningState::Succeeded,
            days_ago(10),
            BTreeMap::new(),
        );
    }
    fake.add_version(
        STEMCELL,
        "1.11.0",
        ProvisioningState::Succeeded,
        NOW - time::Duration::hours(1),
        BTreeMap::new(),
    );
    let report = run_with(fake.clone(), args(), NOW).await.unwrap();
    let id = |v: &str| fake.gallery().version_id(STEMCELL, v);
    assert_eq!(
        reason_kinds(&report.json, &id("1.11.0")),
        vec!["too_young", "keep_latest"]
    );
    assert_eq!(
        reason_kinds(&report.json, &id("1.10.0")),
        vec!["keep_latest"]
    );
    for v in ["1.1.0", "1.2.0", "1.3.0"] {
        assert_eq!(verdict_of(&report.json, &id(v)), "delete", "{v}");
    }
    assert!(report
        .human
        .contains("newest Succeeded version #2 of its definition (keep-latest 2)"));
    assert_eq!(report.json["applied"], false);
    assert_eq!(fake.calls("delete_version"), 0, "dry run by default");

    // Grace of 30 minutes, keep-latest 1: 1.10.0 becomes a candidate.
    let mut a = args();
    a.min_age = Duration::from_secs(30 * 60);
    a.keep_latest = 1;
    let report = run_with(fake.clone(), a, NOW).await.unwrap();
    assert_eq!(
        reason_kinds(&report.json, &id("1.11.0")),
        vec!["keep_latest"]
    );
    assert_eq!(verdict_of(&report.json, &id("1.10.0")), "delete");
}

/// Failed versions past the grace period are candidates (still subject to evidence); in-progress
/// ones never are; a Failed version does not take a keep-latest slot.
#[tokio::test]
async fn failed_and_in_progress_versions() {
    let fake = Arc::new(FakeGallery::default());
    fake.add_version(
        STEMCELL,
        "1.1.0",
        ProvisioningState::Succeeded,
        days_ago(10),
        BTreeMap::new(),
    );
    fake.add_version(
        STEMCELL,
        "1.2.0",
        ProvisioningState::Failed,
        days_ago(3),
        BTreeMap::new(),
    );
    fake.add_version(
        STEMCELL,
        "1.3.0",
        ProvisioningState::Failed,
        NOW - time::Duration::hours(2),
        BTreeMap::new(),
    );
    fake.add_version(
        STEMCELL,
        "1.4.0",
        ProvisioningState::Failed,
        days_ago(3),
        tags_of(&[(tags::CPI_REFERENCES, "bosh-stemcell-held")]),
    );
    fake.add_version(
        STEMCELL,
        "1.5.0",
        ProvisioningState::Creating,
        days_ago(3),
        BTreeMap::new(),
    );
    fake.add_version(
        STEMCELL,
        "1.6.0",
        ProvisioningState::Deleting,
        days_ago(3),
        BTreeMap::new(),
    );
    fake.add_version(
        STEMCELL,
        "1.7.0",
        ProvisioningState::Migrating,
        days_ago(3),
        BTreeMap::new(),
    );
    let mut a = args();
    a.keep_latest = 1;
    let report = run_with(fake.clone(), a, NOW).await.unwrap();
    let id = |v: &str| fake.gallery().version_id(STEMCELL, v);
    assert_eq!(
        reason_kinds(&report.json, &id("1.1.0")),
        vec!["keep_latest"]
    );
    assert_eq!(
        reason_kinds(&report.json, &id("1.2.0")),
        vec!["unused", "failed_past_grace"]
    );
    assert_eq!(verdict_of(&report.json, &id("1.2.0")), "delete");
    assert_eq!(reason_kinds(&report.json, &id("1.3.0")), vec!["too_young"]);
    assert_eq!(reason_kinds(&report.json, &id("1.4.0")), vec!["referenced"]);
    for v in ["1.5.0", "1.6.0", "1.7.0"] {
        assert_eq!(
            reason_kinds(&report.json, &id(v)),
            vec!["in_progress"],
            "{v}"
        );
    }
}

/// A scale set pointing at a definition (or `latest`) protects every version `latest` could
/// resolve to (the newest Succeeded, not-excluded version, and the newer Failed one, which may be
/// what `latest` serves if only its update failed) — and whatever version its instances run.
/// A disk made from `latest` records no version: it may hold any of them.
#[tokio::test]
async fn scale_sets_on_latest_protect_what_latest_can_resolve_to_and_what_instances_run() {
    let fake = Arc::new(FakeGallery::default());
    let gen2 = format!("{STEMCELL}-gen2");
    for v in ["1.1.0", "1.2.0", "1.3.0"] {
        fake.add_version(
            &gen2,
            v,
            ProvisioningState::Succeeded,
            days_ago(10),
            BTreeMap::new(),
        );
    }
    let mut excluded = fake.add_version(
        &gen2,
        "1.9.0",
        ProvisioningState::Succeeded,
        days_ago(10),
        BTreeMap::new(),
    );
    excluded.exclude_from_latest = true;
    fake.put_version(excluded);
    fake.add_version(
        &gen2,
        "1.8.0",
        ProvisioningState::Failed,
        days_ago(10),
        BTreeMap::new(),
    );
    let def_id = fake.gallery().definition_id(&gen2);
    fake.add_consumer(ConsumerKind::ScaleSet, "vmss-web", &def_id);
    fake.add_consumer(
        ConsumerKind::ScaleSetInstance,
        "vmss-web/0",
        &fake.gallery().version_id(&gen2, "1.1.0"),
    );
    let mut a = args();
    a.keep_latest = 0;
    let report = run_with(fake.clone(), a.clone(), NOW).await.unwrap();
    let id = |v: &str| fake.gallery().version_id(&gen2, v);
    for v in ["1.3.0", "1.8.0"] {
        assert_eq!(
            reason_kinds(&report.json, &id(v)),
            vec!["latest_of_definition_used_by"],
            "{v}"
        );
    }
    assert_eq!(
        reason_kinds(&report.json, &id("1.1.0")),
        vec!["used_by_consumer"]
    );
    assert_eq!(verdict_of(&report.json, &id("1.2.0")), "delete");
    assert_eq!(verdict_of(&report.json, &id("1.9.0")), "delete");

    fake.add_consumer(
        ConsumerKind::Disk,
        "disk-x",
        &format!("{def_id}/versions/latest"),
    );
    let report = run_with(fake.clone(), a, NOW).await.unwrap();
    for v in ["1.2.0", "1.9.0"] {
        assert_eq!(
            reason_kinds(&report.json, &id(v)),
            vec!["may_run_from_latest"],
            "{v}"
        );
    }
    assert_eq!(
        reason_kinds(&report.json, &id("1.3.0")),
        vec![
            "latest_of_definition_used_by",
            "latest_of_definition_used_by"
        ]
    );
}

/// A director's list protects its stemcells by name and version in every definition made for
/// that stemcell (director, gen2, create-env), and by CID wherever the CID is recorded.
#[tokio::test]
async fn director_list_protects_by_name_version_and_cid() {
    let fake = Arc::new(FakeGallery::default());
    let create_env = format!("{STEMCELL}-create-env");
    let held = fake.add_version(
        STEMCELL,
        "1.506.0",
        ProvisioningState::Succeeded,
        days_ago(10),
        BTreeMap::new(),
    );
    let held_ce = fake.add_version(
        &create_env,
        "1.506.0",
        ProvisioningState::Succeeded,
        days_ago(10),
        BTreeMap::new(),
    );
    let unmarked = fake.add_version(
        STEMCELL,
        "1.480.0",
        ProvisioningState::Succeeded,
        days_ago(10),
        BTreeMap::new(),
    );
    // Named differently (a custom cloud_properties.name) but carrying the director's CID.
    let by_cid = fake.add_version(
        "custom-image",
        "7.0.0",
        ProvisioningState::Succeeded,
        days_ago(10),
        tags_of(&[(
            tags::CPI_REFERENCES,
            "bosh-stemcell-5e7c1a3e-2f0b-4a57-9d0e-3c1f6f1b2a01",
        )]),
    );
    let other = fake.add_version(
        "bosh-azure-hyperv-ubuntu-noble-go_agent",
        "1.506.0",
        ProvisioningState::Succeeded,
        days_ago(10),
        BTreeMap::new(),
    );
    let mut a = args();
    a.keep_latest = 0;
    a.director_stemcells = vec![fixture("director-stemcells.json")];
    let report = run_with(fake.clone(), a, NOW).await.unwrap();
    assert_eq!(reason_kinds(&report.json, &held.id), vec!["director_holds"]);
    assert_eq!(
        reason_kinds(&report.json, &held_ce.id),
        vec!["director_holds"]
    );
    assert_eq!(
        reason_kinds(&report.json, &unmarked.id),
        vec!["director_holds"],
        "rows without * count too"
    );
    assert_eq!(
        reason_kinds(&report.json, &by_cid.id),
        vec!["referenced", "director_holds"]
    );
    assert_eq!(verdict_of(&report.json, &other.id), "delete");
}

#[derive(Default)]
struct RecordingBlobs {
    deleted: Mutex<Vec<String>>,
}

#[async_trait::async_trait]
impl BlobCleaner for RecordingBlobs {
    async fn delete_blob(&self, uri: &str) -> Result<(), String> {
        self.deleted.lock().unwrap().push(uri.to_string());
        Ok(())
    }
}

/// Source blobs go only when no remaining version uses them.
#[tokio::test]
async fn blob_hook_gets_only_blobs_nothing_references_any_more() {
    let fake = deletable_world();
    // 1.490.0 is kept (referenced) and shares its blob with 1.480.0.
    let shared = fake
        .version(STEMCELL, "1.490.0")
        .unwrap()
        .source_uri
        .unwrap();
    fake.modify_version(STEMCELL, "1.480.0", |v| v.source_uri = Some(shared.clone()));
    fake.modify_version(STEMCELL, "1.490.0", |v| {
        v.tags
            .insert(tags::CPI_REFERENCES.into(), "bosh-stemcell-x".into());
    });
    let (inventory, evidence, policy) = observe(&fake, &[], &[], 0).await;
    let planned = plan(&inventory, &evidence, &policy);
    let blobs = Arc::new(RecordingBlobs::default());
    let out = Executor::new(fake.clone(), 2)
        .with_blob_cleaner(blobs.clone())
        .apply(&inventory, &evidence, &planned, &policy)
        .await
        .unwrap();
    assert_eq!(out.deleted(), 3);
    let deleted = blobs.deleted.lock().unwrap().clone();
    assert_eq!(
        deleted,
        vec![
            format!("https://bosh.blob.core.windows.net/stemcell/{STEMCELL}-1.400.0.vhd"),
            format!("https://bosh.blob.core.windows.net/stemcell/{STEMCELL}-1.450.0.vhd"),
        ]
    );
}

/// The plan an operator reads, for one fixed world.
#[tokio::test]
async fn human_plan_table_snapshot() {
    let fake = Arc::new(FakeGallery::default());
    let ce = format!("{STEMCELL}-create-env");
    fake.add_version(
        STEMCELL,
        "1.400.0",
        ProvisioningState::Succeeded,
        days_ago(40),
        BTreeMap::new(),
    );
    fake.add_version(
        STEMCELL,
        "1.480.0",
        ProvisioningState::Succeeded,
        days_ago(20),
        tags_of(&[(
            tags::CPI_REFERENCES,
            "bosh-stemcell-0b9e55d2-6a41-4c1e-8f3a-77d0c2e4b902",
        )]),
    );
    fake.add_version(
        STEMCELL,
        "1.490.0",
        ProvisioningState::Failed,
        days_ago(3),
        BTreeMap::new(),
    );
    fake.add_version(
        STEMCELL,
        "1.495.0",
        ProvisioningState::Succeeded,
        days_ago(5),
        tags_of(&[(tags::PROTECT, "pinned by ops")]),
    );
    fake.add_version(
        STEMCELL,
        "1.506.0",
        ProvisioningState::Succeeded,
        NOW - time::Duration::hours(5),
        BTreeMap::new(),
    );
    let live = fake.add_version(
        &ce,
        "1.506.0",
        ProvisioningState::Succeeded,
        days_ago(2),
        ours("create-env", "1.506"),
    );
    fake.add_consumer(ConsumerKind::VirtualMachine, "bosh-director", &live.id);

    let mut a = args();
    a.keep_latest = 1;
    a.create_env_state = vec![PathBuf::from(
        "fixtures/cleanup/bosh-state-failed-recreate.json",
    )];
    // A relative path, as an operator types it (cargo runs tests from the crate root).
    let report = run_with(fake.clone(), a, NOW).await.unwrap();
    let expected = "\
DEFINITION                                          VERSION  MODE        AGE    VERDICT  REASONS
bosh-azure-hyperv-ubuntu-jammy-go_agent             1.400.0  director    40d0h  delete   no use found in any of 3 evidence sources
bosh-azure-hyperv-ubuntu-jammy-go_agent             1.480.0  director    20d0h  keep     referenced by bosh-stemcell-0b9e55d2-6a41-4c1e-8f3a-77d0c2e4b902
bosh-azure-hyperv-ubuntu-jammy-go_agent             1.490.0  director    3d0h   delete   no use found in any of 3 evidence sources; Failed version past the grace period
bosh-azure-hyperv-ubuntu-jammy-go_agent             1.495.0  director    5d0h   keep     carries the protect tag stemcell_gallery_protect
bosh-azure-hyperv-ubuntu-jammy-go_agent             1.506.0  director    5h0m   keep     create-env state fixtures/cleanup/bosh-state-failed-recreate.json holds stemcell bosh-stemcell-abc (bosh-azure-hyperv-ubuntu-jammy-go_agent 1.506); current_stemcell_id is empty — an empty pointer is not evidence of non-use; 5h0m old, younger than the grace period of 1d0h; newest Succeeded version #1 of its definition (keep-latest 1)
bosh-azure-hyperv-ubuntu-jammy-go_agent-create-env  1.506.0  create-env  2d0h   keep     create-env state fixtures/cleanup/bosh-state-failed-recreate.json holds stemcell bosh-stemcell-abc (bosh-azure-hyperv-ubuntu-jammy-go_agent 1.506); current_stemcell_id is empty — an empty pointer is not evidence of non-use; VM bosh-director was created from it; newest Succeeded version #1 of its definition (keep-latest 1)

6 versions: 2 to delete, 4 to keep (evidence read from 3 sources: references recorded on the versions; create-env state fixtures/cleanup/bosh-state-failed-recreate.json; gallery consumers (VMs, scale sets, disks)).
Dry run: nothing was deleted. Re-run with --apply to delete the 2 versions marked delete.
";
    assert_eq!(report.human, expected, "\n--- got ---\n{}", report.human);
    assert_eq!(fake.calls("delete_version"), 0);
}

#[tokio::test]
async fn json_document_has_the_contract_fields() {
    let fake = deletable_world();
    let mut a = args();
    a.keep_latest = 3;
    let report = run_with(fake.clone(), a, NOW).await.unwrap();
    let doc = &report.json;
    assert_eq!(doc["applied"], false);
    assert_eq!(
        doc["summary"],
        serde_json::json!({"total": 4, "delete": 1, "keep": 3, "deleted": 0, "skipped": 0, "failed": 0})
    );
    let v = &doc["versions"][0];
    for key in [
        "definition",
        "version",
        "id",
        "mode",
        "state",
        "age_seconds",
        "verdict",
        "reasons",
    ] {
        assert!(v.get(key).is_some(), "{key} missing in {v}");
    }
    assert_eq!(v["version"], "1.400.0");
    assert_eq!(v["state"], "Succeeded");
    assert_eq!(v["age_seconds"], 60 * 86_400);
    assert_eq!(v["reasons"][0]["kind"], "unused");
}

/// Issue 19: `cleanup --apply --plan FILE` applies the reviewed dry run only while the world is
/// as it was: a version that gained a reference (or became deletable) since refuses the whole
/// apply and deletes nothing; an unchanged world deletes exactly the saved deletions.
#[tokio::test]
async fn apply_with_a_saved_plan_refuses_when_the_world_changed() {
    let dir = tempfile::tempdir().unwrap();
    let fake = deletable_world();
    let mut a = args();
    a.keep_latest = 1;
    let dry = run_with(fake.clone(), a.clone(), NOW).await.unwrap();
    assert_eq!(dry.json["summary"]["delete"], 3, "{}", dry.json);
    let saved = dir.path().join("plan.json");
    std::fs::write(&saved, dry.json.to_string()).unwrap();

    // A director records a reference on a planned deletion after the review.
    fake.modify_version(STEMCELL, "1.450.0", |v| {
        v.tags.insert(
            tags::CPI_REFERENCES.into(),
            "bosh-stemcell-0b9e55d2-6a41-4c1e-8f3a-77d0c2e4b902".into(),
        );
    });
    let mut apply = a.clone();
    apply.apply = true;
    apply.plan = Some(saved.clone());
    let err = run_with(fake.clone(), apply.clone(), NOW)
        .await
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains("changed since the saved plan") && msg.contains("1.450.0"),
        "{msg}"
    );
    assert_eq!(fake.calls("delete_version"), 0);

    // Back as it was: the saved plan applies, deleting exactly what it lists.
    fake.modify_version(STEMCELL, "1.450.0", |v| {
        v.tags.remove(tags::CPI_REFERENCES);
    });
    let done = run_with(fake.clone(), apply, NOW).await.unwrap();
    assert_eq!(done.json["summary"]["deleted"], 3, "{}", done.json);
    assert!(fake.version(STEMCELL, "1.490.0").is_some());

    // A file that is not a dry run's JSON is a usage error before anything is read.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"applied": true, "versions": []}"#).unwrap();
    let mut wrong = a.clone();
    wrong.apply = true;
    wrong.plan = Some(bad);
    let err = run_with(fake.clone(), wrong, NOW).await.unwrap_err();
    assert_eq!(exit_for(&err), Exit::Usage, "{err:#}");
}
