use std::collections::BTreeMap;

use super::*;
use crate::gallery::model::{ImageVersion, ProvisioningState};

const V: &str = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/images/d/versions/1.2.3";

fn lock(scope: &str, name: &str) -> ManagementLock {
    ManagementLock {
        id: format!("{scope}/providers/Microsoft.Authorization/locks/{name}"),
        name: name.into(),
        level: LockLevel::CanNotDelete,
        notes: None,
    }
}

fn version(stemcell_references: Option<&str>) -> ImageVersion {
    let mut tags = BTreeMap::new();
    if let Some(r) = stemcell_references {
        tags.insert("Stemcell_References".to_string(), r.to_string());
    }
    ImageVersion {
        id: V.into(),
        definition: "d".into(),
        version: "1.2.3".into(),
        location: "westeurope".into(),
        provisioning_state: ProvisioningState::Succeeded,
        tags,
        source_uri: None,
        storage_account_id: None,
        published_date: None,
        target_regions: vec![],
        exclude_from_latest: false,
        replication: None,
        safety: Default::default(),
    }
}

#[test]
fn only_our_name_at_the_version_itself_is_ours() {
    assert!(lock(V, LOCK_NAME).is_ours_on(V));
    assert!(
        lock(&V.to_uppercase(), "Stemcell-Gallery-Held").is_ours_on(V),
        "ARM compares ids and names case-insensitively"
    );
    // Our name one scope up is someone's copy of it, not ours to lift.
    let def = V.rsplit_once("/versions/").unwrap().0;
    assert!(!lock(def, LOCK_NAME).is_ours_on(V));
    assert!(!lock(V, "keep").is_ours_on(V));
}

#[test]
fn every_lock_at_or_above_the_version_but_ours_is_another_s() {
    let rg = "/subscriptions/s/resourceGroups/rg";
    let all = vec![
        lock(V, LOCK_NAME),
        lock(rg, "rg-lock"),
        lock("/subscriptions/s/resourceGroups/rg2", "elsewhere"),
        lock(&format!("{V}0"), "a-sibling-version-1.2.30"),
    ];
    let others: Vec<&str> = others(&all, V).iter().map(|l| l.name.as_str()).collect();
    assert_eq!(others, vec!["rg-lock"]);
    assert!(describe_all(&super::others(&all, V))
        .contains("rg-lock (CanNotDelete) at /subscriptions/s/resourceGroups/rg"));
}

#[test]
fn held_is_our_sentinel_and_the_cpi_holds_by_its_own_cids() {
    let sentinel = crate::gallery::tags::sentinel("d", "1.2.3");
    assert!(is_held(&version(Some(&sentinel))));
    assert!(!cpi_holds(&version(Some(&sentinel))));
    let shared = version(Some(&format!(
        "bosh-stemcell-0b1d2c3e-4f50-4a6b-8c7d-9e0f1a2b3c4d,{sentinel}"
    )));
    assert!(is_held(&shared) && cpi_holds(&shared));
    let cpi_only = version(Some("bosh-stemcell-0b1d2c3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"));
    assert!(!is_held(&cpi_only) && cpi_holds(&cpi_only));
    assert!(!is_held(&version(None)) && !cpi_holds(&version(None)));
}

#[test]
fn the_notes_fit_azure_s_512_characters_and_say_how_to_release() {
    let n = notes(&"d".repeat(80), "2147483647.2147483647.2147483647");
    assert!(n.len() <= 512, "{} characters", n.len());
    assert!(n.contains("stemcell-gallery delete"), "{n}");
}

#[test]
fn a_refusal_turns_protection_off_for_the_run_and_the_setting_can_too() {
    let p = Protection::default();
    assert!(p.on());
    let denied = Error::azure(
        "lock",
        V,
        crate::gallery::error::AzureError {
            status: 403,
            code: "AuthorizationFailed".into(),
            message: "no".into(),
            target: None,
            retry_after_secs: None,
        },
    );
    assert!(p.note_denied(&denied));
    assert!(!p.on() && p.configured());
    assert!(!Protection::new(false).on());
}
