use crate::error::Classified;
use std::collections::BTreeMap;

use super::*;
use crate::gallery::{ImageVersion, ProvisioningState};

const A: &str = "bosh-stemcell-aaaaaaaa-aaaa-4aaa-8aaa-aaaaaaaaaaaa";
const B: &str = "bosh-stemcell-bbbbbbbb-bbbb-4bbb-8bbb-bbbbbbbbbbbb";
const C: &str = "bosh-stemcell-cccccccc-cccc-4ccc-8ccc-cccccccccccc";
const LOCK: &str = "galleries/s/rg1/g/d/1.0.0.lock";

fn gallery_in(rg: &str) -> GalleryRef {
    GalleryRef {
        subscription: "s".into(),
        resource_group: rg.into(),
        gallery: "g".into(),
    }
}

fn binding() -> Binding {
    Binding::new(&gallery_in("rg1"), "d", "1.0.0")
}

fn version(tag_set: BTreeMap<String, String>) -> ImageVersion {
    ImageVersion {
        id: "/s/x/galleries/g/images/d/versions/1.0.0".into(),
        definition: "d".into(),
        version: "1.0.0".into(),
        location: "westeurope".into(),
        provisioning_state: ProvisioningState::Succeeded,
        tags: tag_set,
        source_uri: None,
        storage_account_id: None,
        published_date: None,
        target_regions: vec![],
        exclude_from_latest: false,
        replication: None,
        safety: Default::default(),
    }
}

/// Tags holding `refs` as this tool writes them (all in the overflow).
fn ours(refs: &[&str]) -> BTreeMap<String, String> {
    let refs: Vec<String> = refs.iter().map(|r| r.to_string()).collect();
    tags::with_references(&BTreeMap::new(), &refs, &tags::sentinel("d", "1.0.0")).unwrap()
}

fn record_holding(refs: &[&str]) -> Record {
    let refs: Vec<String> = refs.iter().map(|r| r.to_string()).collect();
    Record::new(&binding(), Some("ab")).with_references(&refs, &BTreeMap::new(), &[])
}

#[test]
fn a_reference_a_late_tag_write_erased_is_still_a_reference() {
    // Writer A's stale PATCH (holding only A) landed after B recorded B: the tags lost B, the
    // record (written conditionally before B's tag write) holds both.
    let stale = ours(&[A]);
    let rec = record_holding(&[A, B]);
    assert_eq!(
        merged(&stale, Some(&rec)),
        vec![A.to_string(), B.to_string()]
    );
    let healed = healed(&version(stale.clone()), Some(&rec));
    assert_eq!(
        tags::references(&healed.tags),
        vec![A.to_string(), B.to_string()]
    );
    // Without the record, the erased view is all there is.
    assert_eq!(merged(&stale, None), vec![A.to_string()]);
}

#[test]
fn a_reference_this_tool_removed_does_not_come_back_with_a_late_write() {
    // B was removed (a tombstone); a stale write still carrying B landed afterwards.
    let stale = ours(&[A, B]);
    let rec = record_holding(&[A, B]).with_references(
        &[A.to_string()],
        &BTreeMap::new(),
        &[B.to_string()],
    );
    assert!(rec.removed(B));
    assert_eq!(merged(&stale, Some(&rec)), vec![A.to_string()]);
    // Recorded again: no longer removed.
    let again = rec.with_references(&[A.to_string(), B.to_string()], &BTreeMap::new(), &[]);
    assert!(!again.removed(B) && again.holds(B));
    assert!(again.removed.is_empty());
}

#[test]
fn what_the_azure_cpi_recorded_is_never_kept_by_the_record() {
    // The CPI's own CID C lives in stemcell_references; the record holds only this tool's.
    let mut t = ours(&[A]);
    let cpi = t.get(tags::CPI_REFERENCES).cloned().unwrap();
    t.insert(tags::CPI_REFERENCES.into(), format!("{cpi},{C}"));
    let rec = Record::new(&binding(), Some("ab")).after_write(&t, &BTreeMap::new(), &[]);
    assert_eq!(rec.references(), vec![A.to_string()]);
    // The CPI removes C: it stays removed.
    let after_cpi = ours(&[A]);
    assert_eq!(merged(&after_cpi, Some(&rec)), vec![A.to_string()]);
}

#[test]
fn holders_are_kept_and_a_new_reference_gets_its_own() {
    let holders = BTreeMap::from([(A.to_string(), "director:1111".to_string())]);
    let rec = Record::new(&binding(), None).with_references(&[A.to_string()], &holders, &[]);
    assert_eq!(
        rec.entry(A).unwrap().holder.as_deref(),
        Some("director:1111")
    );
    let other = BTreeMap::from([
        (A.to_string(), "someone-else".to_string()),
        (B.to_string(), "ci".to_string()),
    ]);
    let rec = rec.with_references(&[A.to_string(), B.to_string()], &other, &[]);
    assert_eq!(
        rec.entry(A).unwrap().holder.as_deref(),
        Some("director:1111"),
        "a recorded holder is not replaced"
    );
    assert_eq!(rec.entry(B).unwrap().holder.as_deref(), Some("ci"));
}

#[test]
fn removals_are_kept_while_a_late_write_can_land_whatever_their_number() {
    // One `delete` with 300 `--reference` flags: every removal is young, every one is kept.
    let mut rec = Record::new(&binding(), None);
    let many: Vec<String> = (0..300).map(|i| format!("r{i}")).collect();
    rec = rec.with_references(&[], &BTreeMap::new(), &many);
    assert_eq!(rec.removed.len(), 300);
    assert!(many.iter().all(|r| rec.removed(r)));
    // A late write bringing the oldest back does not bring it back.
    let stale = ours(&["r0", "r1"]);
    assert!(merged(&stale, Some(&rec)).is_empty());
}

#[test]
fn old_removals_are_bounded() {
    let old = (time::OffsetDateTime::now_utc() - TOMBSTONE_RETENTION - time::Duration::hours(1))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let mut rec = Record::new(&binding(), None);
    rec.removed = (0..(TOMBSTONES + 10))
        .map(|i| Removed {
            reference: format!("old{i}"),
            removed_at: Some(old.clone()),
        })
        .collect();
    let rec = rec.with_references(&[], &BTreeMap::new(), &["new".to_string()]);
    assert_eq!(rec.removed.len(), TOMBSTONES);
    assert_eq!(rec.removed[0].reference, "new");
}

#[test]
fn holder_labels_name_directors_by_uuid() {
    assert_eq!(
        holder_label("1B4F0B7E-0000-4000-8000-000000000001").unwrap(),
        "director:1b4f0b7e-0000-4000-8000-000000000001"
    );
    assert_eq!(holder_label("ci-pipeline").unwrap(), "ci-pipeline");
    assert!(holder_label("").is_err());
    assert!(holder_label("a b").is_err());
    assert!(holder_label(&"x".repeat(MAX_HOLDER_LEN + 1)).is_err());
}

async fn write(store: &MemoryRecords, refs: &[&str]) -> Record {
    let loaded = load(store, LOCK, &binding()).await.unwrap();
    let refs: Vec<String> = refs.iter().map(|r| r.to_string()).collect();
    let next = loaded
        .or_new(None, Some("ab"))
        .with_references(&refs, &BTreeMap::new(), &[]);
    match save(store, &loaded, next).await.unwrap() {
        Saved::Written(l) => l.record.unwrap(),
        Saved::Changed => panic!("changed"),
    }
}

#[tokio::test]
async fn both_copies_are_written_and_the_newest_is_read() {
    let store = MemoryRecords::default();
    assert!(load(&store, LOCK, &binding())
        .await
        .unwrap()
        .record
        .is_none());
    let first = write(&store, &[A]).await;
    assert_eq!(first.generation, 1);
    let second = write(&store, &[A, B]).await;
    assert_eq!(second.generation, 2);
    let [p, c] = copy_names(LOCK);
    assert!(store.body(&p).is_some() && store.body(&c).is_some());
    // An older copy (a write interrupted between the two) loses to the newer one.
    store.tamper(&c, Some(&serde_json::to_vec(&first).unwrap()));
    let l = load(&store, LOCK, &binding()).await.unwrap();
    assert_eq!(l.record.unwrap().references(), vec![A, B]);
}

#[tokio::test]
async fn one_deleted_emptied_or_foreign_copy_loses_nothing_and_is_repaired() {
    let [p, c] = copy_names(LOCK);
    let foreign = {
        let mut r = record_holding(&[C]);
        r.version = "9.9.9".into();
        serde_json::to_vec(&r).unwrap()
    };
    for damage in [
        None,
        Some(b"".to_vec()),
        Some(b"[]".to_vec()),
        Some(foreign),
    ] {
        for victim in [&p, &c] {
            let store = MemoryRecords::default();
            write(&store, &[A, B]).await;
            store.tamper(victim, damage.as_deref());
            let l = load(&store, LOCK, &binding()).await.unwrap();
            assert_eq!(
                l.record.as_ref().unwrap().references(),
                vec![A, B],
                "{victim} damaged ({damage:?})"
            );
            assert!(l.needs_repair());
            // The next write repairs it.
            write(&store, &[A, B]).await;
            let l = load(&store, LOCK, &binding()).await.unwrap();
            assert!(!l.needs_repair());
        }
    }
}

#[tokio::test]
async fn no_usable_copy_refuses_every_decision_naming_both() {
    let [p, c] = copy_names(LOCK);
    let store = MemoryRecords::default();
    write(&store, &[A]).await;
    let mut other = record_holding(&[C]);
    other.definition = "other-definition".into();
    store.tamper(&p, Some(&serde_json::to_vec(&other).unwrap()));
    store.tamper(&c, Some(b"not json"));
    let e = load(&store, LOCK, &binding()).await.unwrap_err();
    let m = e.to_string();
    assert!(m.contains(&p) && m.contains(&c), "{m}");
    assert!(m.contains("other-definition"), "{m}");
    assert!(!e.class().retryable());
}

#[tokio::test]
async fn a_write_over_a_stale_read_writes_nothing() {
    let store = MemoryRecords::default();
    write(&store, &[A]).await;
    // Writer 1 reads; writer 2 writes meanwhile; writer 1's write is refused.
    let stale = load(&store, LOCK, &binding()).await.unwrap();
    write(&store, &[A, B]).await;
    let next = stale.or_new(None, None).with_references(
        &[A.to_string()],
        &BTreeMap::new(),
        &[B.to_string()],
    );
    assert!(matches!(
        save(&store, &stale, next).await.unwrap(),
        Saved::Changed
    ));
    let l = load(&store, LOCK, &binding()).await.unwrap();
    assert_eq!(l.record.unwrap().references(), vec![A, B]);
}

#[tokio::test]
async fn a_newer_format_is_not_read_as_this_one() {
    let store = MemoryRecords::default();
    let mut r = record_holding(&[A]);
    r.format = FORMAT + 1;
    for name in copy_names(LOCK) {
        store.tamper(&name, Some(&serde_json::to_vec(&r).unwrap()));
    }
    let m = load(&store, LOCK, &binding())
        .await
        .unwrap_err()
        .to_string();
    assert!(m.contains("newer release"), "{m}");
}

fn published(v: ImageVersion, at: &str) -> ImageVersion {
    let mut v = v;
    v.published_date = Some(
        time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).unwrap(),
    );
    v
}

fn of_content(sha: &str, refs: &[&str]) -> ImageVersion {
    let mut t = ours(refs);
    t.insert(tags::IMAGE_SHA256.into(), sha.into());
    version(t)
}

#[tokio::test]
async fn a_copy_of_other_content_with_a_higher_generation_never_hides_the_good_copy() {
    // One copy valid for the version (content ab, holding A); the other a valid-looking record
    // of other content with a higher generation. The version is held by A.
    let store = MemoryRecords::default();
    write(&store, &[A]).await;
    let [p, _] = copy_names(LOCK);
    let mut other = Record::new(&binding(), Some("ff")).with_references(
        &[C.to_string()],
        &BTreeMap::new(),
        &[],
    );
    other.generation = 99;
    store.tamper(&p, Some(&serde_json::to_vec(&other).unwrap()));
    let l = load(&store, LOCK, &binding()).await.unwrap();
    let v = of_content("ab", &[]);
    let rec = l.applicable(Some(&v)).expect("the good copy");
    assert_eq!(rec.references(), vec![A]);
    assert_eq!(merged(&v.tags, Some(&rec)), vec![A.to_string()]);
    // And a write over it repairs the other copy (both hold exactly what is written).
    assert!(!l.holds_exactly(&rec));
    // With the version soft-deleted, what content the tool recorded for it is not hidden
    // either: a restore of this content is not refused for the overwritten copy's.
    assert_eq!(l.contents(), vec!["ff".to_string(), "ab".to_string()]);
    // With the version absent (replaced after a Failed create), the create of content ab
    // starts from the good copy, not the other content's.
    assert_eq!(
        l.for_create(&crate::gallery::Content::image("ab"))
            .unwrap()
            .references(),
        vec![A]
    );
}

#[tokio::test]
async fn two_galleries_of_one_name_sharing_a_store_never_share_a_record() {
    let store = MemoryRecords::default();
    write(&store, &[A]).await;
    // rg2's gallery of the same name: its own lock, so its own record.
    let rg2 = Binding::new(&gallery_in("rg2"), "d", "1.0.0");
    let lock2 = crate::gallery::blob_names::version_lock_name(&gallery_in("rg2"), "d", "1.0.0");
    assert_ne!(
        lock2,
        crate::gallery::blob_names::version_lock_name(&gallery_in("rg1"), "d", "1.0.0")
    );
    let l = load(&store, &lock2, &rg2).await.unwrap();
    assert!(l.record.is_none());
    assert!(l.applicable(Some(&of_content("ab", &[]))).is_none());
    // rg1's record copied under rg2's name (a store mixed up by hand) is not rg2's.
    for name in copy_names(&lock2) {
        store.tamper(&name, store.body(&copy_names(LOCK)[0]).as_deref());
    }
    let m = load(&store, &lock2, &rg2).await.unwrap_err().to_string();
    assert!(m.contains("rg1") && m.contains("rg2"), "{m}");
    // ARM compares identities case-insensitively: the same gallery, the same record.
    let upper = Binding::new(
        &GalleryRef {
            subscription: "S".into(),
            resource_group: "RG1".into(),
            gallery: "G".into(),
        },
        "d",
        "1.0.0",
    );
    assert_eq!(
        load(&store, LOCK, &upper)
            .await
            .unwrap()
            .record
            .unwrap()
            .references(),
        vec![A]
    );
}

#[tokio::test]
async fn a_version_made_again_after_an_outside_delete_starts_empty() {
    let store = MemoryRecords::default();
    // Written over the version published at t1.
    let first = published(of_content("ab", &[A]), "2026-01-01T00:00:00Z");
    let loaded = load(&store, LOCK, &binding()).await.unwrap();
    let next = loaded
        .or_new(Some(&first), Some("ab"))
        .with_references(&[A.to_string()], &BTreeMap::new(), &[])
        .bound_to(&first);
    assert!(matches!(
        save(&store, &loaded, next).await.unwrap(),
        Saved::Written(_)
    ));
    let l = load(&store, LOCK, &binding()).await.unwrap();
    assert_eq!(l.applicable(Some(&first)).unwrap().references(), vec![A]);
    // Deleted by someone else: absent, the record's life is over.
    assert!(l.applicable(None).is_none());
    // Created again (same content, a new publishedDate): it starts with no references.
    let again = published(of_content("ab", &[]), "2026-02-01T00:00:00Z");
    assert!(l.applicable(Some(&again)).is_none());
    // Restored from soft delete, the same life: the record is its.
    let restored = published(of_content("ab", &[]), "2026-01-01T00:00:00.0000000Z");
    assert_eq!(l.applicable(Some(&restored)).unwrap().references(), vec![A]);
    // A record of an earlier release, bound to no life and written by no create, applies to
    // the version of its content that is there.
    let mut unbound = l.applicable(Some(&first)).unwrap();
    unbound.life = None;
    assert!(unbound.fits(None) && unbound.fits(Some(&again)));
}

fn marked(mut v: ImageVersion, mark: &str) -> ImageVersion {
    v.tags
        .insert(tags::BIRTH_MARK.to_string(), mark.to_string());
    v
}

#[test]
fn a_creator_that_died_before_binding_leaves_nothing_to_a_version_made_again_outside() {
    // Written before this tool's create, whose PUT carried the mark m1; the creator died before
    // binding the record to the version's publishedDate.
    let rec = record_holding(&[A]).before_create("m1", &[]);
    let made = published(marked(of_content("ab", &[A]), "m1"), "2026-01-01T00:00:00Z");
    assert!(rec.fits(Some(&made)), "the version that create made");
    // Deleted outside and made again (portal, az, an older CPI): no mark, or another's.
    let again = published(of_content("ab", &[]), "2026-02-01T00:00:00Z");
    assert!(!rec.fits(Some(&again)));
    assert!(!rec.fits(Some(&marked(again.clone(), "m2"))));
    // Absent: the next create of this tool carries nothing of it (no replaced Failed version).
    assert!(rec.fits(None));
    assert!(rec.carried_to_create().references().is_empty());
}

#[test]
fn a_failed_versions_references_are_carried_only_past_this_tools_own_delete() {
    let failed = published(of_content("ab", &[A, B]), "2026-01-01T00:00:00Z");
    let noted = record_holding(&[A, B]).carrying_from(&failed, &[A.to_string(), B.to_string()]);
    // While the Failed version is there, the note is its record.
    assert!(noted.fits(Some(&failed)));
    // Made again by someone else: not this life.
    let again = published(of_content("ab", &[]), "2026-02-01T00:00:00Z");
    assert!(!noted.fits(Some(&again)));
    // Absent after the delete: the create carries exactly the noted references, and writes
    // them before its own create under its own mark.
    assert!(noted.fits(None));
    let base = noted.carried_to_create();
    assert_eq!(base.references(), vec![A, B]);
    let carried = base.references();
    let before = base.before_create("m2", &carried);
    // That create's caller dies; the version is absent again: still carried.
    assert_eq!(before.carried_to_create().references(), vec![A, B]);
    // Forgotten (the version was deleted by someone else): the record's life is over.
    let mut forgotten = noted.clone();
    forgotten.carried.clear();
    assert!(!forgotten.fits(None));
}

#[test]
fn a_cid_the_cpi_removes_from_a_failed_version_being_replaced_is_not_shown_by_its_note() {
    // A Failed version held by this tool's A and the Azure CPI's C (in stemcell_references).
    let mut failed = published(of_content("ab", &[A]), "2026-01-01T00:00:00Z");
    let sentinel = tags::sentinel("d", "1.0.0");
    failed
        .tags
        .insert(tags::CPI_REFERENCES.into(), format!("{sentinel},{C}"));
    let all = [A.to_string(), C.to_string()];
    let noted = record_holding(&[A, C]).carrying_from(&failed, &all);
    assert_eq!(noted.carried_cpi, vec![C.to_string()]);
    assert_eq!(merged(&failed.tags, Some(&noted)), vec![C, A]);
    // The plain CPI removes its own CID (it never reads the record), and a stale write erases
    // A from the tags: C is gone, A still counts.
    let mut after = failed.clone();
    after
        .tags
        .insert(tags::CPI_REFERENCES.into(), sentinel.clone());
    after.tags.retain(|k, _| !k.starts_with("sg_overflow"));
    assert_eq!(merged(&after.tags, Some(&noted)), vec![A]);
    // Absent after the DELETE: the create still carries both, C still marked the CPI's.
    let before = noted.carried_to_create().before_create("m1", &all);
    assert_eq!(before.references(), vec![A, C]);
    assert_eq!(before.carried_cpi, vec![C.to_string()]);
    // The note forgotten (the version stays): the CPI's CID goes with it, A stays.
    assert_eq!(noted.without_carry_note().references(), vec![A]);
}

#[tokio::test]
async fn the_previous_releases_record_gives_only_holders_of_what_the_tags_show() {
    let store = MemoryRecords::default();
    let legacy_lock = binding().legacy_lock();
    assert_eq!(legacy_lock, "locks/g/d/1.0.0.lock");
    // Format 1, by name: it may be another gallery's (rg2 recorded C and removed A there).
    let mut old = Record::new(&binding(), Some("ab")).with_references(
        &[B.to_string(), C.to_string()],
        &BTreeMap::from([(B.to_string(), "director:1111".to_string())]),
        &[A.to_string()],
    );
    old.format = LEGACY_FORMAT;
    old.subscription.clear();
    old.resource_group.clear();
    for name in copy_names(&legacy_lock) {
        store.tamper(&name, Some(&serde_json::to_vec(&old).unwrap()));
    }
    let l = load(&store, LOCK, &binding()).await.unwrap();
    // This gallery's version shows A and B: B's holder is carried; C is not invented, and A's
    // removal (maybe another gallery's) does not hide A.
    let v = of_content("ab", &[A, B]);
    let rec = l.applicable(Some(&v)).unwrap();
    assert_eq!(rec.references(), vec![B]);
    assert_eq!(
        rec.entry(B).unwrap().holder.as_deref(),
        Some("director:1111")
    );
    assert_eq!(
        merged(&v.tags, Some(&rec)),
        vec![A.to_string(), B.to_string()]
    );
    // Once this gallery has its own record, the previous one is not read again.
    write(&store, &[A]).await;
    let l = load(&store, LOCK, &binding()).await.unwrap();
    assert_eq!(l.applicable(Some(&v)).unwrap().references(), vec![A]);
}
