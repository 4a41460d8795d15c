//! Scale: planning a gallery of 1,000 definitions × 10 versions lists consumers once — not once
//! per version (a per-version check would need at least 10,000 calls).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use stemcell_gallery::cli::cleanup::{run_with, CleanupArgs};
use stemcell_gallery::gallery::fake::FakeGallery;
use stemcell_gallery::gallery::{tags, ConsumerKind, ProvisioningState};
use time::macros::datetime;

#[tokio::test]
async fn planning_1000_definitions_by_10_versions_lists_consumers_once() {
    let now = datetime!(2026-03-01 12:00 UTC);
    let fake = Arc::new(FakeGallery::default());
    for d in 0..1000 {
        let def = format!("bosh-azure-hyperv-ubuntu-jammy-go_agent-{d:04}");
        for v in 0..10 {
            fake.add_version(
                &def,
                &format!("1.{v}.0"),
                ProvisioningState::Succeeded,
                now - time::Duration::days(30),
                BTreeMap::new(),
            );
        }
        // Every tenth definition has a VM on its oldest version.
        if d % 10 == 0 {
            let id = fake.gallery().version_id(&def, "1.0.0");
            fake.add_consumer(ConsumerKind::VirtualMachine, &format!("vm-{d}"), &id);
        }
    }
    fake.reset_calls();
    let args = CleanupArgs {
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
    };
    let report = run_with(fake.clone(), args, now).await.unwrap();
    let counts = fake.call_counts();
    eprintln!(
        "calls for a 1,000 × 10 plan: {counts:?} (per-version consumer checks would need >= 10000)"
    );
    assert_eq!(fake.calls("list_consumers"), 1);
    assert_eq!(fake.calls("list_definitions"), 1);
    assert_eq!(fake.calls("list_versions"), 1000);
    assert_eq!(fake.calls("get_version"), 0);
    assert_eq!(fake.calls("delete_version"), 0);
    // One list of the gallery's management locks, whatever the number of versions.
    assert_eq!(fake.calls("gallery_locks"), 1);
    assert_eq!(counts.values().sum::<usize>(), 1003);
    assert_eq!(report.json["summary"]["total"], 10_000);
    // 2 kept per definition by keep-latest, plus the 100 versions with a VM.
    assert_eq!(report.json["summary"]["keep"], 2_100);
    assert_eq!(report.json["summary"]["delete"], 7_900);
}

/// Applying at that scale: consumers are listed for the plan, once more before deleting, and once
/// per batch of deletions under their locks; each deletion costs one re-read and one DELETE —
/// nothing per kept version.
#[tokio::test]
async fn applying_at_scale_rescans_consumers_once_and_rereads_only_deletions() {
    let now = datetime!(2026-03-01 12:00 UTC);
    let fake = Arc::new(FakeGallery::default());
    for d in 0..1000 {
        let def = format!("bosh-azure-hyperv-ubuntu-jammy-go_agent-{d:04}");
        for v in 0..10 {
            fake.add_version(
                &def,
                &format!("1.{v}.0"),
                ProvisioningState::Succeeded,
                now - time::Duration::days(30),
                BTreeMap::new(),
            );
        }
    }
    fake.reset_calls();
    let args = CleanupArgs {
        apply: true,
        director_stemcells: vec![],
        create_env_state: vec![],
        keep_latest: 2,
        min_age: Duration::from_secs(24 * 3600),
        protect_tag: tags::PROTECT.to_string(),
        concurrency: 4,
        blobs: false,
        consumer_subscription: vec![],
        plan: None,
    };
    let started = std::time::Instant::now();
    let report = run_with(fake.clone(), args, now).await.unwrap();
    eprintln!(
        "apply 1,000 × 10 (8,000 deletions) against the in-memory fake: {:?} in {:?}",
        fake.call_counts(),
        started.elapsed()
    );
    // Plan, re-scan, and one scan per batch of 32 deletions made after the batch's locks were
    // taken (issue 14: consumers are re-checked under the lock).
    assert_eq!(fake.calls("list_consumers"), 2 + 8_000 / 32);
    assert_eq!(fake.calls("get_version"), 8_000);
    assert_eq!(fake.calls("delete_version"), 8_000);
    assert_eq!(report.json["summary"]["deleted"], 8_000);
    assert_eq!(fake.versions().len(), 2_000);
    assert_eq!(fake.max_concurrent_deletes(), 4);
}
