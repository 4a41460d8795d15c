//! `doctor` against the emulator: all checks pass on a prepared gallery; each failing in turn.

use std::process::Command;

use serde_json::Value;
use stemcell_gallery::emulator::{self, Options};

const BIN: &str = env!("CARGO_BIN_EXE_stemcell-gallery");
const SUB: &str = "11111111-2222-3333-4444-555555555555";

fn doctor(arm: &str, blob: &str, gallery: &str) -> (Option<i32>, Value) {
    let out = Command::new(BIN)
        .args([
            "--arm-endpoint",
            arm,
            "--blob-endpoint",
            blob,
            "--auth",
            "emulator",
            "--subscription",
            SUB,
            "--resource-group",
            "bosh-rg",
            "--gallery",
            gallery,
            "--output",
            "json",
            "doctor",
        ])
        .env_remove("AZURE_SUBSCRIPTION_ID")
        .env("STEMCELL_GALLERY_ARM_RETRIES", "0")
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), doc)
}

/// One check of doctor's JSON (`Null` when absent).
fn check<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["checks"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .unwrap_or(&Value::Null)
}

fn detail<'a>(doc: &'a Value, name: &str) -> &'a str {
    check(doc, name)["detail"].as_str().unwrap_or("missing")
}

/// Issue 16 item 3: seed and ensure look the storage account's resource id up through ARM (unless
/// storage_account_resource_group is set), which needs Microsoft.Storage/storageAccounts/read.
/// Without it doctor passed and the first seed failed after its upload.
#[tokio::test(flavor = "multi_thread")]
async fn doctor_fails_when_the_storage_account_id_cannot_be_looked_up() {
    let h = emulator::start(Options {
        role: Some(
            stemcell_gallery::cli::embedded::least_privilege_role()
                .without("Microsoft.Storage/storageAccounts/read"),
        ),
        ..Options::default()
    })
    .await
    .unwrap();
    h.state
        .ensure_gallery(SUB, "bosh-rg", "g", "westeurope")
        .unwrap();
    h.state.ensure_container("stemcell").unwrap();
    let (code, doc) = doctor(&h.arm, &h.blob, "g");
    assert_eq!(code, Some(1), "{doc}");
    assert_eq!(status(&doc, "storage"), "fail", "{doc}");
    let storage = check(&doc, "storage");
    assert!(
        storage["fix"]
            .as_str()
            .unwrap()
            .contains("Microsoft.Storage/storageAccounts/read"),
        "{storage}"
    );
}

fn status<'a>(doc: &'a Value, name: &str) -> &'a str {
    check(doc, name)["status"].as_str().unwrap_or("missing")
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_passes_on_a_prepared_gallery_and_names_each_failure() {
    let h = emulator::start(Options {
        role: Some(stemcell_gallery::cli::embedded::least_privilege_role()),
        ..Options::default()
    })
    .await
    .unwrap();
    h.state
        .ensure_gallery(SUB, "bosh-rg", "g", "westeurope")
        .unwrap();
    // No stemcell container yet: the storage check fails, the others pass.
    let (code, doc) = doctor(&h.arm, &h.blob, "g");
    assert_eq!(code, Some(1), "{doc}");
    assert_eq!(status(&doc, "gallery"), "pass");
    assert_eq!(status(&doc, "storage"), "fail", "{doc}");
    // The fix matches the failure: create the container (granting a role would not help).
    let storage = check(&doc, "storage");
    assert!(
        storage["detail"]
            .as_str()
            .unwrap()
            .contains("container stemcell does not exist"),
        "{storage}"
    );
    let fix = storage["fix"].as_str().unwrap();
    assert!(
        fix.contains("az storage container create --name stemcell"),
        "{fix}"
    );
    assert!(!fix.contains("Storage Blob Data Contributor"), "{fix}");
    h.state.ensure_container("stemcell").unwrap();
    let (code, doc) = doctor(&h.arm, &h.blob, "g");
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(doc["ok"], true);
    // The storage account's resource id (what a new version's source names) was looked up.
    assert!(
        detail(&doc, "storage").contains(&format!(
            "/subscriptions/{SUB}/resourceGroups/bosh-rg/providers/Microsoft.Storage/storageAccounts/devstoreaccount1"
        )),
        "{doc}"
    );
    // A gallery that does not exist.
    let (code, doc) = doctor(&h.arm, &h.blob, "missing");
    assert_eq!(code, Some(1));
    assert_eq!(status(&doc, "gallery"), "fail");
    // Nothing was written by any of these runs.
    assert!(
        h.state
            .requests()
            .iter()
            .all(|r| r.method == "GET" || r.method == "HEAD"),
        "{:?}",
        h.state.requests()
    );
}

/// Issue 30 item 7: doctor reports the gallery's soft-delete policy and how many versions block
/// their deletion before their end of life, and until when (by Azure's clock).
#[tokio::test(flavor = "multi_thread")]
async fn doctor_reports_soft_delete_and_the_versions_that_block_their_deletion() {
    use crate::support::emulated::{self, Raw};
    let h = emulator::start(Options {
        role: Some(stemcell_gallery::cli::embedded::least_privilege_role()),
        ..Options::default()
    })
    .await
    .unwrap();
    h.state.ensure_container("stemcell").unwrap();
    let raw = Raw::new(&h.arm);
    emulated::gallery_and_definition(&raw, "g", "d").await;
    let (code, doc) = doctor(&h.arm, &h.blob, "g");
    assert_eq!(code, Some(0), "{doc}");
    assert!(
        detail(&doc, "gallery").ends_with("; soft delete is off"),
        "{doc}"
    );
    assert!(
        detail(&doc, "definitions").contains("1 image definition(s) and 0 version(s)")
            && detail(&doc, "definitions").contains("none blocks its deletion"),
        "{doc}"
    );

    let v = format!("{}/images/d/versions/1.0.0", emulated::gallery_path("g"));
    let created = raw
        .put(
            &format!("{v}?api-version=2024-03-03"),
            emulated::version_body("https://a.blob.core.windows.net/c/one.vhd"),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    emulated::until_settled(&raw, &v).await;
    emulated::block_deletion(&raw, &v, "2099-01-01T00:00:00Z").await;
    emulated::set_soft_delete(&raw, "g", true).await;
    let (code, doc) = doctor(&h.arm, &h.blob, "g");
    assert_eq!(code, Some(0), "{doc}");
    assert!(
        detail(&doc, "gallery")
            .contains("soft delete is on: a deleted version stays restorable for 7 days"),
        "{doc}"
    );
    assert!(
        detail(&doc, "definitions").contains(
            "1 block their deletion before their end of life, the last until 2099-01-01T00:00:00Z"
        ),
        "{doc}"
    );
}
