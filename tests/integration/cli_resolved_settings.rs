//! The CLI uses the *resolved* settings (flags > environment > config file) everywhere: the
//! gallery printed in JSON, the create-env definition suffix, and the location of what it creates.
//! Each command runs the binary against an emulator that holds the tool to the least-privilege role.

use crate::support::emulated;

use std::process::{Command, Output};

use emulated::{gallery_path, Raw, RG, SUB};
use serde_json::Value;
use stemcell_gallery::emulator::Handle;

const NAME: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
const SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const ACCOUNT_ID: &str = "/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/bosh-rg/providers/Microsoft.Storage/storageAccounts/devstoreaccount1";

/// The binary pointed at the emulator with no gallery, location or config: each test adds them
/// the way it means to (flag, environment or config file).
fn bare(h: &Handle) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stemcell-gallery"));
    cmd.args([
        "--arm-endpoint",
        &h.arm,
        "--blob-endpoint",
        &h.blob,
        "--auth",
        "emulator",
        "--subscription",
        SUB,
        "--resource-group",
        RG,
        "--output",
        "json",
    ]);
    for var in [
        "AZURE_SUBSCRIPTION_ID",
        "STEMCELL_GALLERY_CONFIG",
        "STEMCELL_GALLERY_GALLERY",
        "STEMCELL_GALLERY_LOCATION",
        "STEMCELL_GALLERY_ARM_ENDPOINT",
        "STEMCELL_GALLERY_BLOB_ENDPOINT",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

fn run(mut cmd: Command, args: &[&str]) -> (Output, Value) {
    let out = cmd.args(args).output().expect("the binary runs");
    let doc = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, doc)
}

fn ok(out: &Output, doc: &Value) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{doc}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ensure_args<'a>(blob: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "ensure",
        "--blob-uri",
        blob,
        "--storage-account-id",
        ACCOUNT_ID,
        "--name",
        NAME,
        "--version",
        "1.506",
        "--sha256",
        SHA,
    ];
    v.extend_from_slice(extra);
    v
}

async fn emulator_with_gallery(gallery: &str, location: &str) -> Handle {
    let h = emulated::start_default().await;
    h.state.ensure_gallery(SUB, RG, gallery, location).unwrap();
    h.state.ensure_container("stemcell").unwrap();
    h
}

#[tokio::test(flavor = "multi_thread")]
async fn json_names_the_gallery_from_the_environment() {
    let h = emulator_with_gallery("envgallery", "westeurope").await;
    let with_env = || {
        let mut c = bare(&h);
        c.env("STEMCELL_GALLERY_GALLERY", "envgallery")
            .args(["--location", "westeurope"]);
        c
    };
    let blob = "https://devstoreaccount1.blob.core.windows.net/stemcell/a.vhd";
    let (out, doc) = run(with_env(), &ensure_args(blob, &["--reference", "ref-a"]));
    ok(&out, &doc);
    assert_eq!(doc["gallery"], "envgallery", "ensure: {doc}");
    let (out, doc) = run(
        with_env(),
        &["lookup", "--name", NAME, "--version", "1.506"],
    );
    ok(&out, &doc);
    assert_eq!(doc["gallery"], "envgallery", "lookup: {doc}");
    let (out, doc) = run(with_env(), &["lookup", "--cid", "ref-a"]);
    ok(&out, &doc);
    assert_eq!(doc["gallery"], "envgallery", "lookup --cid: {doc}");
    let (out, doc) = run(with_env(), &["list"]);
    ok(&out, &doc);
    assert_eq!(doc["gallery"], "envgallery", "list: {doc}");
    assert_eq!(
        doc["definitions"][0]["versions"][0]["gallery"], "envgallery",
        "list: {doc}"
    );
    let (out, doc) = run(
        with_env(),
        &[
            "delete",
            "--name",
            NAME,
            "--version",
            "1.506",
            "--reference",
            "ref-a",
        ],
    );
    ok(&out, &doc);
    assert_eq!(doc["gallery"], "envgallery", "delete: {doc}");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_command_uses_the_configured_create_env_suffix() {
    let h = emulator_with_gallery("g", "westeurope").await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "gallery = \"g\"\nlocation = \"westeurope\"\ncreate_env_suffix = \"-bootstrap\"\n",
    )
    .unwrap();
    let with_config = || {
        let mut c = bare(&h);
        c.arg("--config").arg(&config);
        c
    };
    let blob = "https://devstoreaccount1.blob.core.windows.net/stemcell/a.vhd";
    let (out, doc) = run(with_config(), &ensure_args(blob, &["--create-env"]));
    ok(&out, &doc);
    let definition = format!("{NAME}-bootstrap");
    assert_eq!(doc["definition"], definition.as_str(), "ensure: {doc}");

    let (out, doc) = run(
        with_config(),
        &[
            "lookup",
            "--name",
            NAME,
            "--version",
            "1.506",
            "--create-env",
        ],
    );
    ok(&out, &doc);
    assert_eq!(doc["definition"], definition.as_str(), "lookup: {doc}");

    let (out, doc) = run(
        with_config(),
        &[
            "delete",
            "--name",
            NAME,
            "--version",
            "1.506",
            "--create-env",
        ],
    );
    ok(&out, &doc);
    assert_eq!(doc["definition"], definition.as_str(), "delete: {doc}");
    assert_eq!(doc["result"], "deleted", "delete: {doc}");
    let raw = Raw::new(&h.arm);
    let gone = raw
        .get(&format!(
            "{}/images/{definition}/versions/1.506.0",
            gallery_path("g")
        ))
        .await;
    assert_eq!(gone.status, 404, "{}", gone.text);
}

/// A cpi.json like bosh-deployment's azure/cpi.yml renders it: no location.
fn cpi_json_without_location(dir: &std::path::Path, gallery: &str) -> std::path::PathBuf {
    let path = dir.join("cpi.json");
    let doc = serde_json::json!({"cloud": {"plugin": "azure", "properties": {"azure": {
        "environment": "AzureCloud",
        "subscription_id": SUB,
        "resource_group_name": RG,
        "compute_gallery_name": gallery,
        "storage_account_name": "devstoreaccount1",
    }}}});
    std::fs::write(&path, doc.to_string()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_configured_location_definitions_and_versions_go_to_the_gallerys() {
    let h = emulator_with_gallery("g", "eastus").await;
    let dir = tempfile::tempdir().unwrap();
    let config = cpi_json_without_location(dir.path(), "g");
    let with_config = || {
        let mut c = bare(&h);
        c.arg("--config").arg(&config);
        c
    };
    let blob = "https://devstoreaccount1.blob.core.windows.net/stemcell/a.vhd";
    let (out, doc) = run(with_config(), &ensure_args(blob, &[]));
    ok(&out, &doc);
    // The gallery's region, as Azure names it in its answer (REFERENCE.md "Regions").
    assert_eq!(
        doc["target_regions"],
        serde_json::json!(["East US"]),
        "{doc}"
    );
    let raw = Raw::new(&h.arm);
    let definition = raw
        .get(&format!("{}/images/{NAME}", gallery_path("g")))
        .await;
    assert_eq!(definition.body["location"], "eastus", "{}", definition.text);
    let version = raw
        .get(&format!(
            "{}/images/{NAME}/versions/1.506.0",
            gallery_path("g")
        ))
        .await;
    assert_eq!(version.body["location"], "eastus", "{}", version.text);

    // doctor says where things go, and why.
    let (_, doc) = run(with_config(), &["doctor"]);
    let gallery = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "gallery")
        .unwrap()
        .clone();
    assert_eq!(gallery["status"], "pass", "{doc}");
    let detail = gallery["detail"].as_str().unwrap();
    assert!(
        detail.contains("its location is eastus") && detail.contains("no location is configured"),
        "{detail}"
    );

    // An explicit location still wins (doctor reports it rather than the gallery's).
    let mut explicit = with_config();
    explicit.args(["--location", "westus"]);
    let (_, doc) = run(explicit, &["doctor"]);
    assert!(
        doc.to_string().contains("configured location westus"),
        "{doc}"
    );
}
