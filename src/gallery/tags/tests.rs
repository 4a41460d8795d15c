//! The ledger against a model of the Azure CPI's own tag handling, and the tag rules.

use std::collections::BTreeMap;

use super::ledger::split_list;
use super::*;
use proptest::prelude::*;

const SENT: &str = "sg-held-0123456789ab";

fn cid(i: usize) -> String {
    format!("bosh-stemcell-{:08x}-1111-2222-3333-444455556666", i)
}

fn base() -> BTreeMap<String, String> {
    let mut t = BTreeMap::new();
    t.insert(MODE.into(), "director".into());
    t.insert(IMAGE_SHA256.into(), "ab".repeat(32));
    for i in 0..14 {
        t.insert(format!("cloud_prop_{i}"), "x".repeat(40));
    }
    t
}

fn write(t: &BTreeMap<String, String>, refs: &[String]) -> BTreeMap<String, String> {
    with_references(t, refs, SENT).unwrap()
}

/// The Azure CPI's create_stemcell on an existing version (compute_gallery_manager.rb
/// `build_updated_tags`): split stemcell_references, append stemcell_name if absent, append
/// the CID, keep every other tag. `None`: Azure refuses the 257th character.
fn cpi_create(t: &BTreeMap<String, String>, cid: &str) -> Option<BTreeMap<String, String>> {
    let mut t = t.clone();
    let mut list: Vec<String> = t
        .get(CPI_REFERENCES)
        .map(|v| split_list(v).map(str::to_string).collect())
        .unwrap_or_default();
    if let Some(n) = t.get(STEMCELL_NAME).cloned() {
        if !list.contains(&n) {
            list.push(n);
        }
    }
    if !list.iter().any(|r| r == cid) {
        list.push(cid.to_string());
    }
    let v = list.join(",");
    if v.len() > MAX_TAG_VALUE {
        return None;
    }
    t.insert(CPI_REFERENCES.into(), v);
    Some(t)
}

/// The Azure CPI's delete_stemcell (`delete_gallery_image`): `Err(())` = it DELETEs the version.
fn cpi_delete(t: &BTreeMap<String, String>, cid: &str) -> Result<BTreeMap<String, String>, ()> {
    let mut t = t.clone();
    let mut list: Vec<String> = t
        .get(CPI_REFERENCES)
        .map(|v| split_list(v).map(str::to_string).collect())
        .unwrap_or_default();
    let by_name = t.get(STEMCELL_NAME).is_some_and(|n| n == cid);
    let in_list = list.iter().any(|r| r == cid);
    if !(by_name || in_list) {
        return Ok(t);
    }
    list.retain(|r| r != cid);
    if list.is_empty() {
        return Err(());
    }
    t.insert(CPI_REFERENCES.into(), list.join(","));
    Ok(t)
}

#[test]
fn cids_have_one_shape() {
    assert!(is_cid(&cid(7)));
    assert!(is_cid("bosh-stemcell-0b1c2d3e-aaaa-bbbb-cccc-ddddeeeeffff"));
    for s in [
        "bosh-azure-hyperv-ubuntu-jammy-go_agent",
        "bosh-stemcell-123",
        "create-env:my-director",
        "bosh-stemcell-0b1c2d3e-aaaa-bbbb-cccc-ddddeeeeffzz",
    ] {
        assert!(!is_cid(s), "{s}");
    }
    assert_eq!(cid(1).len(), CID_LEN);
}

#[test]
fn the_sentinel_is_per_version_stable_and_never_a_reference() {
    let a = sentinel("bosh-azure-hyperv-ubuntu-jammy-go_agent", "1.506.0");
    assert_eq!(
        a,
        sentinel("BOSH-azure-hyperv-ubuntu-jammy-go_agent", "1.506.0")
    );
    assert_ne!(
        a,
        sentinel("bosh-azure-hyperv-ubuntu-jammy-go_agent", "1.507.0")
    );
    assert!(a.starts_with(SENTINEL_PREFIX) && a.len() == 20);
    assert!(validate_reference(&a).is_err());
}

#[test]
fn tag_names_are_read_case_insensitively() {
    let tags: BTreeMap<String, String> = [
        ("Stemcell_Gallery_Protect", "yes"),
        ("STEMCELL_REFERENCES", "bosh-stemcell-a"),
        ("SG_Overflow_Refs_00", "bosh-stemcell-b"),
        ("Other", "x"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert!(has(&tags, PROTECT));
    assert_eq!(get(&tags, "other").map(String::as_str), Some("x"));
    let canon = canonical_names(&tags);
    assert!(canon.contains_key(PROTECT) && canon.contains_key("Other"));
    assert_eq!(
        references(&canon),
        vec!["bosh-stemcell-a", "bosh-stemcell-b"]
    );
}

#[test]
fn forty_references_survive_on_one_version() {
    let refs: Vec<String> = (0..40).map(cid).collect();
    let tags = write(&base(), &refs);
    assert!(tags.len() <= MAX_TAGS);
    assert!(tags.values().all(|v| v.len() <= MAX_TAG_VALUE));
    let mut got = references(&tags);
    got.sort();
    assert_eq!(got, refs);
}

#[test]
fn no_entry_has_two_homes() {
    let refs: Vec<String> = (0..12).map(cid).collect();
    let tags = write(&base(), &refs);
    let sourced = sourced_references(&tags);
    assert_eq!(sourced.len(), 12);
    for (r, src) in &sourced {
        let in_cpi = cpi_resolves(&tags, r);
        assert_eq!(in_cpi, *src == Source::StemcellReferences, "{r}");
    }
}

#[test]
fn our_references_leave_the_cpi_tag_to_plain_cpis_but_for_the_sentinel() {
    let ours: Vec<String> = (0..7).map(cid).collect();
    let tags = write(&base(), &ours);
    assert_eq!(tags[CPI_REFERENCES], SENT);
    assert!(sourced_references(&tags)
        .iter()
        .all(|(_, s)| *s == Source::Overflow));
    // Four plain CPIs on other directors can still append their CIDs; a fifth is refused by
    // Azure as it would be without this tool (five CIDs and commas fill 256 characters).
    let mut t = tags;
    for i in 0..4 {
        t = cpi_create(&t, &cid(100 + i)).expect("room for a plain CPI");
    }
    assert!(cpi_create(&t, &cid(104)).is_none());
    assert_eq!(references(&t).len(), 11);
}

#[test]
fn a_cid_the_cpi_removed_stays_removed() {
    let ours: Vec<String> = (0..3).map(cid).collect();
    let mut t = write(&base(), &ours);
    let theirs: Vec<String> = (100..103).map(cid).collect();
    for c in &theirs {
        t = cpi_create(&t, c).unwrap();
    }
    assert_eq!(references(&t).len(), 6);
    // The plain CPIs delete every CID they hold: the sentinel keeps the version.
    for c in &theirs {
        t = cpi_delete(&t, c).expect("the sentinel keeps the CPI from deleting the version");
    }
    assert_eq!(references(&t), ours);
    // And our next write does not bring them back.
    let mut more = ours.clone();
    more.push(cid(50));
    let t2 = write(&t, &more);
    assert_eq!(references(&t2), more);
}

#[test]
fn a_plain_cpi_deleting_the_last_cid_still_deletes_a_version_only_it_holds() {
    let mut t = base();
    t.insert(CPI_REFERENCES.into(), cid(100));
    assert!(cpi_delete(&t, &cid(100)).is_err());
    // Once we hold a reference too, it cannot.
    let t = write(&t, &[cid(100), cid(1)]);
    let t = cpi_delete(&t, &cid(100)).expect("kept for our reference");
    assert_eq!(references(&t), vec![cid(1)]);
    // Our last reference gone, the sentinel goes too.
    let t = write(&t, &[]);
    assert_eq!(t[CPI_REFERENCES], "");
}

#[test]
fn no_references_still_writes_the_cpi_tag_so_the_cpi_can_reuse_the_version() {
    let tags = write(&base(), &[]);
    assert_eq!(tags[CPI_REFERENCES], "");
    assert!(references(&tags).is_empty());
    let t = cpi_create(&tags, &cid(3)).unwrap();
    assert_eq!(references(&t), vec![cid(3)]);
}

#[test]
fn a_version_made_by_the_azure_cpi_is_understood() {
    let mut t = BTreeMap::new();
    t.insert(CPI_REFERENCES.into(), format!("{}, {}", cid(1), cid(2)));
    assert_eq!(references(&t), vec![cid(1), cid(2)]);
    let out = write(&t, &[cid(1), cid(2), cid(3)]);
    assert_eq!(
        out[CPI_REFERENCES],
        format!("{SENT},{},{}", cid(1), cid(2)),
        "the CPI's CIDs stay where it resolves them; ours goes to the overflow"
    );
    assert_eq!(references(&out), vec![cid(1), cid(2), cid(3)]);
}

#[test]
fn the_cpi_v52_legacy_name_counts_only_until_the_cpi_tag_exists() {
    let mut v52 = BTreeMap::new();
    v52.insert(STEMCELL_NAME.into(), cid(1));
    assert_eq!(
        sourced_references(&v52),
        vec![(cid(1), Source::LegacyStemcellName)]
    );
    // Our write folds it into the CPI's list and keeps the tag while the CID is held: Azure CPI
    // v52.0.1-v53.0.0 find their CID by `stemcell_name` only (issue 28 item 8).
    let out = write(&v52, &[cid(1), cid(2)]);
    assert_eq!(out.get(STEMCELL_NAME), Some(&cid(1)));
    assert!(cpi_resolves(&out, &cid(1)));
    assert_eq!(references(&out), vec![cid(1), cid(2)]);
    // Once the CID is removed, the tag goes with it: nothing is left that finds the version by it.
    let gone = write(&out, &[cid(2)]);
    assert!(!gone.contains_key(STEMCELL_NAME));
    assert_eq!(references(&gone), vec![cid(2)]);
    // The CPI folded it, then removed it: stemcell_name still names it, but it is gone.
    let mut removed = v52.clone();
    removed.insert(CPI_REFERENCES.into(), cid(2));
    assert_eq!(references(&removed), vec![cid(2)]);
    // Not a CID: never a reference.
    let mut odd = BTreeMap::new();
    odd.insert(STEMCELL_NAME.into(), "some-name".to_string());
    assert!(references(&odd).is_empty());
}

#[test]
fn our_old_stemcell_name_and_its_phantom_copy_are_not_references_and_are_cleaned() {
    let name = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
    let mut t = base();
    t.insert(STEMCELL_NAME.into(), name.into());
    // The previous release's format: the complete list, mirrored into the CPI's tag.
    t.insert(LEGACY_CHUNK_PREFIX.to_string() + "00", cid(1));
    t.insert(CPI_REFERENCES.into(), cid(1));
    assert!(needs_rewrite(&t, SENT));
    // The CPI reused our version: it copied the name in as a CID, then added its own.
    let t = cpi_create(&t, &cid(2)).unwrap();
    assert!(t[CPI_REFERENCES].contains(name));
    assert_eq!(references(&t), vec![cid(1), cid(2)]);
    // Both real CIDs go: no reference is left (the version is an orphan, not kept forever).
    let t1 = cpi_delete(&t, &cid(2)).unwrap();
    let t1 = write(&t1, &[]);
    assert!(references(&t1).is_empty());
    // Our rewrite removes the phantom and the old tag, and keeps the name under our key.
    let out = write(&t, &references(&t));
    assert!(!out.contains_key(STEMCELL_NAME));
    assert!(!out[CPI_REFERENCES].contains(name));
    assert_eq!(out[STEMCELL], name);
    assert_eq!(stemcell_name(&out), Some(name));
    assert!(!needs_rewrite(&out, SENT));
}

#[test]
fn the_previous_format_is_read_once_and_the_cpi_decides_what_it_mirrored() {
    // The previous release: the complete list in sg_refs_NN, its newest five mirrored.
    let refs: Vec<String> = (0..8).map(cid).collect();
    let mut t = base();
    t.insert(format!("{LEGACY_CHUNK_PREFIX}00"), refs[..5].join(","));
    t.insert(format!("{LEGACY_CHUNK_PREFIX}01"), refs[5..].join(","));
    t.insert(CPI_REFERENCES.into(), refs[3..].join(","));
    assert_eq!(references(&t).len(), 8);
    // Then the CPI removed one it could see.
    let t = cpi_delete(&t, &refs[6]).unwrap();
    let got = references(&t);
    assert_eq!(got.len(), 7);
    assert!(!got.contains(&refs[6]));
    assert!(sourced_references(&t)
        .iter()
        .any(|(r, s)| r == &refs[0] && *s == Source::PreviousFormat));
    // Rewritten: the old tags are gone, nothing is lost, the sentinel guards the overflow.
    let out = write(&t, &got);
    assert!(!out.keys().any(|k| k.starts_with(LEGACY_CHUNK_PREFIX)));
    let mut a = references(&out);
    let mut b = got.clone();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    assert!(out[CPI_REFERENCES].starts_with(SENT));
}

#[test]
fn a_cpi_tag_full_of_plain_cpi_cids_is_an_error_not_a_demotion() {
    let mut t = BTreeMap::new();
    let five: Vec<String> = (0..5).map(cid).collect();
    t.insert(CPI_REFERENCES.into(), five.join(","));
    let mut want = five.clone();
    want.push(cid(5));
    assert!(matches!(
        with_references(&t, &want, SENT),
        Err(TagError::CpiTagFull { cids: 5, .. })
    ));
    // A free-form reference in the CPI's tag (put there by hand or by an older tool) may move
    // out to make room.
    let mut t2 = BTreeMap::new();
    let mut mixed: Vec<String> = (0..4).map(cid).collect();
    mixed.insert(0, "create-env:director-one".into());
    t2.insert(CPI_REFERENCES.into(), mixed.join(","));
    let mut want = mixed.clone();
    want.push(cid(9));
    let out = with_references(&t2, &want, SENT).unwrap();
    assert!(out[CPI_REFERENCES].starts_with(SENT));
    for c in (0..4).map(cid) {
        assert!(
            cpi_resolves(&out, &c),
            "a CID the CPI holds stays resolvable"
        );
    }
    assert_eq!(references(&out).len(), 6);
}

#[test]
fn too_many_references_is_an_error_not_a_loss() {
    let refs: Vec<String> = (0..400).map(cid).collect();
    assert!(matches!(
        with_references(&base(), &refs, SENT),
        Err(TagError::TooManyReferences { .. })
    ));
}

#[test]
fn bad_references_are_refused() {
    for r in ["", "a,b", "with space", &"x".repeat(200), SENT] {
        assert!(validate_reference(r).is_err(), "{r:?}");
    }
}

proptest! {
    /// Any interleaving of our writes and a plain CPI's creates and deletes: the ledger holds
    /// exactly the references that were added and not removed since (by either tool), the
    /// CPI never deletes a version we still hold, and every CID the CPI added stays
    /// resolvable by the CPI.
    #[test]
    fn the_ledger_agrees_with_both_tools(ops in proptest::collection::vec((0u8..4, 0usize..30), 1..60)) {
        let mut t = base();
        let mut model: Vec<String> = Vec::new();
        let mut cpi_held: Vec<String> = Vec::new();
        for (op, i) in ops {
            match op {
                // We add a reference.
                0 => {
                    let r = cid(i);
                    if cpi_held.contains(&r) { continue; }
                    let mut want = references(&t);
                    if !want.contains(&r) { want.push(r.clone()); }
                    match with_references(&t, &want, SENT) {
                        Ok(out) => { t = out; if !model.contains(&r) { model.push(r); } }
                        Err(TagError::CpiTagFull { .. }) => {}
                        Err(e) => prop_assert!(false, "{e}"),
                    }
                }
                // We remove one of ours.
                1 => {
                    let r = cid(i);
                    if cpi_held.contains(&r) || !model.contains(&r) { continue; }
                    let want: Vec<String> = references(&t).into_iter().filter(|x| x != &r).collect();
                    t = with_references(&t, &want, SENT).unwrap();
                    model.retain(|x| x != &r);
                }
                // A plain CPI adds a CID of its own.
                2 => {
                    let r = cid(100 + i);
                    if model.contains(&r) { continue; }
                    if let Some(out) = cpi_create(&t, &r) {
                        t = out;
                        model.push(r.clone());
                        if !cpi_held.contains(&r) { cpi_held.push(r); }
                    }
                }
                // A plain CPI deletes one of its CIDs.
                _ => {
                    if cpi_held.is_empty() { continue; }
                    let r = cpi_held.remove(i % cpi_held.len());
                    model.retain(|x| x != &r);
                    match cpi_delete(&t, &r) {
                        Ok(out) => t = out,
                        Err(()) => { prop_assert!(model.is_empty(), "the CPI deleted a version still holding {model:?}"); t = write(&base(), &[]); }
                    }
                }
            }
            let mut got = references(&t);
            got.sort();
            let mut want = model.clone();
            want.sort();
            prop_assert_eq!(got, want);
            for r in &cpi_held { prop_assert!(cpi_resolves(&t, r), "the CPI lost {r}"); }
            prop_assert!(t.values().all(|v| v.len() <= MAX_TAG_VALUE));
            prop_assert!(t.len() <= MAX_TAGS);
        }
    }

    #[test]
    fn references_round_trip(n in 0usize..60, extra in 0usize..20) {
        let mut t = base();
        for i in 0..extra { t.insert(format!("e{i}"), "v".into()); }
        let refs: Vec<String> = (0..n).map(cid).collect();
        match with_references(&t, &refs, SENT) {
            Ok(out) => {
                prop_assert!(out.len() <= MAX_TAGS);
                prop_assert!(out.values().all(|v| v.len() <= MAX_TAG_VALUE));
                let mut got = references(&out);
                got.sort();
                prop_assert_eq!(got, refs);
                for (k, v) in &t { prop_assert_eq!(out.get(k), Some(v)); }
                prop_assert!(!needs_rewrite(&out, SENT));
            }
            Err(TagError::TooManyReferences { needed, .. }) => prop_assert!(needed > MAX_TAGS),
            Err(e) => prop_assert!(false, "{e}"),
        }
    }
}

/// The room left is exact: that many more CIDs can be written and one more is refused, and it
/// drops below the warning threshold long before the last write fails.
#[test]
fn reference_room_counts_the_cids_that_still_fit() {
    let t = base();
    let room = reference_room(&t);
    assert!(room > REFERENCE_ROOM_WARNING * 4, "{room}");
    let all: Vec<String> = (0..room).map(cid).collect();
    let full = write(&t, &all);
    assert_eq!(reference_room(&full), 0);
    let mut one_more = all.clone();
    one_more.push(cid(room));
    assert!(with_references(&t, &one_more, SENT).is_err());
    let nearly: Vec<String> = (0..room - REFERENCE_ROOM_WARNING + 1).map(cid).collect();
    let nearly_full = write(&t, &nearly);
    assert_eq!(reference_room(&nearly_full), REFERENCE_ROOM_WARNING - 1);
}
