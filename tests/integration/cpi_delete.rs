//! `delete_stemcell` through the binary, against the in-process emulator: what bosh-cli and a
//! director see when they delete a stemcell whose gallery version is still in use, unused or unknown.

use crate::support::emulated;
use crate::support::tls_front;

use std::collections::BTreeMap;

use assert_cmd::Command;
use emulated::*;
use serde_json::{json, Value};
use stemcell_gallery::emulator::Handle;
use stemcell_gallery::gallery::tags;

const GALLERY: &str = "bosh_gallery";
const DEFINITION: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";

fn version_path(key: &str) -> String {
    format!(
        "{}/images/{DEFINITION}/versions/{key}",
        gallery_path(GALLERY)
    )
}

fn blob_uri(handle: &Handle, name: &str) -> String {
    format!("{}/stemcell/{name}", handle.blob)
}

/// A gallery version `key` made from blob `blob` (uploaded to the emulator), referenced by `cid`,
/// tagged as stemcell-gallery tags it.
async fn published_version(handle: &Handle, key: &str, blob: &str, cid: &str) -> String {
    let container = blobs(handle).container("stemcell");
    let _ = container.create().await;
    put_fixed_vhd(&container, blob, 1).await;
    let raw = Raw::new(&handle.arm);
    let uri = blob_uri(handle, blob);
    let base = BTreeMap::from([
        (tags::IMAGE_SHA256.to_string(), "ab".repeat(32)),
        (tags::GALLERY_NAME.to_string(), GALLERY.to_string()),
        (tags::IMAGE_DEFINITION.to_string(), DEFINITION.to_string()),
        (tags::MODE.to_string(), "create-env".to_string()),
        (tags::SOURCE_BLOB.to_string(), uri.clone()),
        (
            tags::CREATED_BY.to_string(),
            "stemcell-gallery/test".to_string(),
        ),
    ]);
    let t =
        tags::with_references(&base, &[cid.to_string()], &tags::sentinel(DEFINITION, key)).unwrap();
    let mut body = version_body(&uri);
    body["tags"] = serde_json::to_value(&t).unwrap();
    let r = raw.put(&version_path(key), body).await;
    assert!(r.status == 200 || r.status == 201, "{}", r.text);
    until_settled(&raw, &version_path(key)).await;
    let got = raw.get(&version_path(key)).await;
    assert_eq!(got.body["properties"]["provisioningState"], "Succeeded");
    got.body["id"].as_str().unwrap().to_string()
}

/// A VM built from the version, as the Azure CPI's create_vm makes it.
async fn vm_using(handle: &Handle, name: &str, version_id: &str) -> String {
    let id = format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/{name}");
    let world = json!({"resources": [{
        "id": id, "location": LOC,
        "properties": {"storageProfile": {"imageReference": {"id": version_id}}}
    }]});
    let r = admin(handle, "PUT", "/_emulator/world", Some(world)).await;
    assert!(r.status < 300, "{}", r.text);
    id
}

/// Run `stemcell-gallery cpi` against the emulator with `request`; the one response line.
async fn cpi(handle: &Handle, request: Value) -> Value {
    cpi_via(&handle.arm, &handle.blob, &[], request).await
}

/// A director's `delete_stemcell` of `cid`: the one response line.
async fn delete_stemcell(handle: &Handle, cid: &str) -> Value {
    cpi(
        handle,
        json!({"method": "delete_stemcell", "arguments": [cid],
               "context": {"director_uuid": "d", "request_id": "cpi-1"}, "api_version": 2}),
    )
    .await
}

async fn setup() -> Handle {
    let handle = start_default().await;
    gallery_and_definition(&Raw::new(&handle.arm), GALLERY, DEFINITION).await;
    handle
}

async fn blob_exists(handle: &Handle, name: &str) -> bool {
    blobs(handle)
        .container("stemcell")
        .blob_client(name)
        .properties()
        .await
        .is_ok()
}

/// bosh-state.json after a failed recreate: `current_stemcell_id` is "" but the stemcell record
/// (and the VM built from it) is still there. bosh-cli's DeleteUnused then deletes that stemcell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_recreate_bosh_cli_delete_keeps_the_version_the_vm_runs_from() {
    let state: Value = serde_json::from_str(include_str!(
        "../../fixtures/cpi/bosh-state-failed-recreate.json"
    ))
    .unwrap();
    assert_eq!(state["current_stemcell_id"], "");
    let cid = state["stemcells"][0]["cid"].as_str().unwrap();
    let handle = setup().await;
    let blob = format!("{cid}.vhd");
    let version_id = published_version(&handle, "1.506.0", &blob, cid).await;
    let vm = vm_using(&handle, "director-vm", &version_id).await;

    // bosh-cli sends no request_id.
    let r = cpi(
        &handle,
        json!({"method": "delete_stemcell", "arguments": [cid],
               "context": {"director_uuid": state["director_id"]}, "api_version": 2}),
    )
    .await;

    assert_eq!(r["error"], Value::Null, "{r}");
    let log = r["log"].as_str().unwrap();
    assert!(log.contains(&vm), "the log names the VM: {log}");
    assert!(log.contains("kept"), "and says the version is kept: {log}");
    let raw = Raw::new(&handle.arm);
    let v = raw.get(&version_path("1.506.0")).await;
    assert_eq!(v.status, 200, "the version survives: {}", v.text);
    // The CID's own blob goes, as the Azure CPI deletes it: the Succeeded version the VM runs
    // from does not need the blob it was made from.
    assert!(!blob_exists(&handle, &blob).await, "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn director_delete_of_an_unused_stemcell_deletes_version_and_blob() {
    let handle = setup().await;
    let cid = "bosh-stemcell-7d1c0a52-3e4f-4a5b-9c8d-1e2f3a4b5c6d";
    let blob = format!("{cid}.vhd");
    published_version(&handle, "1.506.0", &blob, cid).await;

    let r = cpi(
        &handle,
        json!({"method": "delete_stemcell", "arguments": [cid],
               "context": {"director_uuid": "d", "request_id": "cpi-123456"}, "api_version": 2}),
    )
    .await;

    assert_eq!(r["error"], Value::Null, "{r}");
    assert_eq!(r["result"], Value::Null);
    assert_eq!(
        Raw::new(&handle.arm)
            .get(&version_path("1.506.0"))
            .await
            .status,
        404
    );
    assert!(!blob_exists(&handle, &blob).await, "the blob is deleted");
    assert!(r["log"].as_str().unwrap().contains("deleted"), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_another_version_is_made_from_is_kept() {
    let handle = setup().await;
    let blob = "bosh-stemcell-shared.vhd";
    published_version(&handle, "1.506.0", blob, "bosh-stemcell-aaaa").await;
    published_version(&handle, "1.507.0", blob, "bosh-stemcell-bbbb").await;

    let r = cpi(
        &handle,
        json!({"method": "delete_stemcell", "arguments": ["bosh-stemcell-aaaa"],
               "context": {"request_id": "cpi-1"}}),
    )
    .await;

    assert_eq!(r["error"], Value::Null, "{r}");
    let raw = Raw::new(&handle.arm);
    assert_eq!(raw.get(&version_path("1.506.0")).await.status, 404);
    assert_eq!(raw.get(&version_path("1.507.0")).await.status, 200);
    assert!(
        blob_exists(&handle, blob).await,
        "1.507.0 still needs the blob"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_unknown_cid_is_stemcell_not_found() {
    let handle = setup().await;
    published_version(
        &handle,
        "1.506.0",
        "bosh-stemcell-known.vhd",
        "bosh-stemcell-known",
    )
    .await;

    let r = cpi(
        &handle,
        json!({"method": "delete_stemcell", "arguments": ["bosh-stemcell-unknown"],
               "context": {"director_uuid": "d"}}),
    )
    .await;

    assert_eq!(r["error"]["type"], "Bosh::Clouds::StemcellNotFound", "{r}");
    assert_eq!(r["error"]["ok_to_retry"], false);
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .contains("bosh-stemcell-unknown"));
    // Issue 48 item 5: not only the CPI's tag is searched (the tool's own references are too).
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap()
            .contains("or among the references this tool keeps"),
        "{r}"
    );
    assert_eq!(
        Raw::new(&handle.arm)
            .get(&version_path("1.506.0"))
            .await
            .status,
        200,
        "nothing else was touched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_azure_is_a_retryable_cloud_error() {
    let handle = setup().await;
    let arm = handle.arm.clone();
    drop(handle);
    // Port of a stopped emulator: connection refused.
    let out = tokio::task::spawn_blocking(move || {
        Command::cargo_bin("stemcell-gallery")
            .unwrap()
            .env_remove("STEMCELL_GALLERY_CONFIG")
            .args(["--arm-endpoint", &arm, "--auth", "emulator"])
            .args([
                "--subscription",
                SUB,
                "--resource-group",
                RG,
                "--gallery",
                GALLERY,
            ])
            .arg("cpi")
            .write_stdin(
                r#"{"method":"delete_stemcell","arguments":["bosh-stemcell-x"],"context":{}}"#,
            )
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["error"]["type"], "Bosh::Clouds::CloudError", "{r}");
    assert_eq!(r["error"]["ok_to_retry"], true, "{r}");
}

/// `stemcell-gallery cpi` with `request` against these endpoints (e.g. an ARM endpoint whose
/// certificate a private CA signed: Azure Stack, a TLS-inspecting proxy), with `extra` flags; the
/// one response line.
async fn cpi_via(arm: &str, blob: &str, extra: &[&str], request: Value) -> Value {
    let (code, response) = run_cpi(arm, blob, GALLERY, extra, &[], request.to_string(), &[]).await;
    assert_eq!(code, Some(0), "{response}");
    response
}

/// Issue 15 item 6: behind a private CA the front failed "invalid peer certificate:
/// UnknownIssuer" with `ok_to_retry: true` and no way to trust the CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arm_behind_a_private_ca_is_a_non_retryable_error_naming_ca_cert_until_the_ca_is_trusted() {
    let handle = setup().await;
    let cid = "bosh-stemcell-5b0c7e1a-9d2f-4c3b-8a1e-6f7d8c9b0a1e";
    let blob = format!("{cid}.vhd");
    published_version(&handle, "1.506.0", &blob, cid).await;
    let dir = tempfile::tempdir().unwrap();
    let (ca, cert, key) = tls_front::private_ca(dir.path());
    let arm = tls_front::tls_front(&handle.arm, &cert, &key).await;
    let request = json!({"method": "delete_stemcell", "arguments": [cid],
                         "context": {"director_uuid": "d"}, "api_version": 2});

    // Not trusted: a CloudError BOSH does not retry, saying which setting trusts the CA.
    let r = cpi_via(&arm, &handle.blob, &[], request.clone()).await;
    assert_eq!(r["error"]["type"], "Bosh::Clouds::CloudError", "{r}");
    assert_eq!(r["error"]["ok_to_retry"], false, "{r}");
    let message = r["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("ca_cert") && message.contains("--ca-cert"),
        "{message}"
    );
    assert_eq!(
        Raw::new(&handle.arm)
            .get(&version_path("1.506.0"))
            .await
            .status,
        200,
        "nothing was deleted"
    );

    // A bundle that is not PEM: a configuration error before any request.
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let r = cpi_via(
        &arm,
        &handle.blob,
        &["--ca-cert", junk.to_str().unwrap()],
        request.clone(),
    )
    .await;
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("ca_cert") && message.contains("PEM"),
        "{r}"
    );
    assert_eq!(r["error"]["ok_to_retry"], false, "{r}");

    // Trusted with --ca-cert: the same request works.
    let r = cpi_via(
        &arm,
        &handle.blob,
        &["--ca-cert", ca.to_str().unwrap()],
        request,
    )
    .await;
    assert_eq!(r["error"], Value::Null, "{r}");
    assert_eq!(
        Raw::new(&handle.arm)
            .get(&version_path("1.506.0"))
            .await
            .status,
        404
    );
}

// ---------------------------------------------------------------------------------------------
// A CID's own blob `<cid>.vhd` goes with the CID, as the Azure CPI's delete_stemcell does it
// (issue 15, item 4).

/// The page blob `stemcell/<cid>.vhd` the Azure CPI uploads for every create_stemcell.
async fn cid_blob(handle: &Handle, cid: &str) -> String {
    let container = blobs(handle).container("stemcell");
    let _ = container.create().await;
    let name = format!("{cid}.vhd");
    put_fixed_vhd(&container, &name, 1).await;
    name
}

/// A version as the current Azure CPI makes and reuses it: made from the first CID's blob,
/// tags = cloud properties + `compute_gallery_*` + `image_sha256` + `stemcell_references`
/// (comma-joined CIDs); no tag of ours (no `source_blob`).
async fn cpi_made_version(handle: &Handle, key: &str, cids: &[&str]) -> String {
    let raw = Raw::new(&handle.arm);
    let uri = blob_uri(handle, &format!("{}.vhd", cids[0]));
    let mut body = version_body(&uri);
    body["tags"] = json!({
        "name": DEFINITION, "version": "1.506", "os_type": "linux",
        "image_sha256": "cd".repeat(32),
        "compute_gallery_name": GALLERY,
        "compute_gallery_image_definition": DEFINITION,
        "stemcell_references": cids.join(","),
    });
    let r = raw.put(&version_path(key), body).await;
    assert!(r.status == 200 || r.status == 201, "{}", r.text);
    until_settled(&raw, &version_path(key)).await;
    let got = raw.get(&version_path(key)).await;
    assert_eq!(got.body["properties"]["provisioningState"], "Succeeded");
    got.body["id"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cpi_made_the_version_the_director_deletes_the_stemcell_through_the_front_the_cids_blob_goes_too(
) {
    let handle = setup().await;
    let first = "bosh-stemcell-1a2b3c4d-0000-4000-8000-000000000001";
    let second = "bosh-stemcell-1a2b3c4d-0000-4000-8000-000000000002";
    let first_blob = cid_blob(&handle, first).await;
    let second_blob = cid_blob(&handle, second).await;
    cpi_made_version(&handle, "1.506.0", &[first, second]).await;

    // The second CID goes; the first keeps the version (a Succeeded version does not need the
    // blob it was made from, and the second's blob is not even that).
    let r = cpi(
        &handle,
        json!({"method": "delete_stemcell", "arguments": [second],
               "context": {"director_uuid": "d", "request_id": "cpi-1"}, "api_version": 2}),
    )
    .await;
    assert_eq!(r["error"], Value::Null, "{r}");
    let raw = Raw::new(&handle.arm);
    assert_eq!(raw.get(&version_path("1.506.0")).await.status, 200);
    assert!(!blob_exists(&handle, &second_blob).await, "{r}");
    assert!(blob_exists(&handle, &first_blob).await);

    // The last CID goes: the version and that CID's blob (its source) go.
    let r = cpi(
        &handle,
        json!({"method": "delete_stemcell", "arguments": [first],
               "context": {"director_uuid": "d", "request_id": "cpi-2"}, "api_version": 2}),
    )
    .await;
    assert_eq!(r["error"], Value::Null, "{r}");
    assert_eq!(raw.get(&version_path("1.506.0")).await.status, 404);
    assert!(!blob_exists(&handle, &first_blob).await, "{r}");
    let log = r["log"].as_str().unwrap();
    assert!(
        log.contains(&first_blob) && log.contains("deleted"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_that_a_creating_version_is_being_made_from_is_kept() {
    let handle = setup().await;
    let cid = "bosh-stemcell-1a2b3c4d-0000-4000-8000-00000000000c";
    let other = "bosh-stemcell-1a2b3c4d-0000-4000-8000-00000000000d";
    let blob = cid_blob(&handle, cid).await;
    cid_blob(&handle, other).await;
    cpi_made_version(&handle, "1.506.0", &[cid, other]).await;
    // Another version is being made from the CID's blob right now (its create never ends).
    let r = admin(
        &handle,
        "POST",
        "/_emulator/faults",
        Some(json!({"method": "PUT", "path": "*/versions/1.507.0", "operation": "never"})),
    )
    .await;
    assert!(r.status < 300, "{}", r.text);
    let raw = Raw::new(&handle.arm);
    let r = raw
        .put(
            &version_path("1.507.0"),
            version_body(&blob_uri(&handle, &blob)),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(
        raw.get(&version_path("1.507.0")).await.body["properties"]["provisioningState"],
        "Creating"
    );

    let r = delete_stemcell(&handle, cid).await;
    assert_eq!(r["error"], Value::Null, "{r}");
    assert!(
        blob_exists(&handle, &blob).await,
        "1.507.0 is being made from it: {r}"
    );
    let log = r["log"].as_str().unwrap();
    assert!(log.contains("1.507.0") && log.contains("kept"), "{log}");
    let v = raw.get(&version_path("1.506.0")).await;
    let t: BTreeMap<String, String> = serde_json::from_value(v.body["tags"].clone()).unwrap();
    assert_eq!(tags::references(&t), vec![other.to_string()]);
}

/// Issue 30 item 3: a CPI `delete_stemcell` of a stemcell whose version blocks its deletion until
/// its end of life answers success (an error would fail a whole `bosh create-env`, bosh-cli
/// #619): the reference is removed, the version stays, and the log says until when.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_stemcell_of_a_version_blocked_before_its_end_of_life_succeeds_and_keeps_it() {
    let handle = setup().await;
    let cid = "bosh-stemcell-0b0c0d0e-1111-2222-3333-444455556666";
    published_version(&handle, "1.506.0", &format!("{cid}.vhd"), cid).await;
    let raw = Raw::new(&handle.arm);
    let path = version_path("1.506.0");
    block_deletion(&raw, &path, "2099-01-01T00:00:00Z").await;

    let r = delete_stemcell(&handle, cid).await;

    assert_eq!(r["error"], Value::Null, "{r}");
    let log = r["log"].as_str().unwrap();
    assert!(
        log.contains("2099-01-01T00:00:00Z"),
        "says until when: {log}"
    );
    let v = raw.get(&path).await;
    assert_eq!(v.status, 200, "the version stays: {log}");
    assert_eq!(
        v.body["tags"]["stemcell_references"], "",
        "the reference is removed: {}",
        v.text
    );
}

/// Issue 30 item 4: a CPI `delete_stemcell` of a stemcell whose version is Failed in a gallery
/// with soft delete on, where Azure cannot delete it, answers success (bosh-cli #619): the
/// reference is removed, the version stays without a DELETE sent, and the log names the remedy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_stemcell_of_a_failed_version_in_a_soft_delete_gallery_succeeds_and_keeps_it() {
    let handle = setup().await;
    let cid = "bosh-stemcell-0b0c0d0e-1111-2222-3333-444455557777";
    let raw = Raw::new(&handle.arm);
    let path = version_path("1.506.0");
    // Made from a blob that does not exist: the version ends Failed, holding the reference.
    let base = BTreeMap::from([
        (tags::IMAGE_SHA256.to_string(), "ab".repeat(32)),
        (tags::MODE.to_string(), "director".to_string()),
    ]);
    let t = tags::with_references(
        &base,
        &[cid.to_string()],
        &tags::sentinel(DEFINITION, "1.506.0"),
    )
    .unwrap();
    let mut body = version_body(&blob_uri(&handle, "missing.vhd"));
    body["tags"] = serde_json::to_value(&t).unwrap();
    let put = raw.put(&path, body).await;
    assert_eq!(put.status, 201, "{}", put.text);
    until_settled(&raw, &path).await;
    assert_eq!(
        raw.get(&path).await.body["properties"]["provisioningState"],
        "Failed"
    );
    set_soft_delete(&raw, GALLERY, true).await;
    admin(&handle, "POST", "/_emulator/reset", None).await;

    let r = delete_stemcell(&handle, cid).await;

    assert_eq!(r["error"], Value::Null, "{r}");
    let log = r["log"].as_str().unwrap();
    assert!(
        log.contains("isSoftDeleteEnabled"),
        "names the remedy: {log}"
    );
    let v = raw.get(&path).await;
    assert_eq!(v.status, 200, "the version stays: {log}");
    let t: BTreeMap<String, String> = serde_json::from_value(v.body["tags"].clone()).unwrap();
    assert!(
        tags::references(&t).is_empty(),
        "the reference is removed: {}",
        v.text
    );
    let requests = admin(&handle, "GET", "/_emulator/requests", None).await;
    let deletes: Vec<&Value> = requests.body["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| {
            q["method"] == "DELETE" && q["path"].as_str().unwrap_or("").contains("/versions/")
        })
        .collect();
    assert!(deletes.is_empty(), "no DELETE of the version: {deletes:?}");
}

/// Issue 30 item 4: a director's `delete_stemcell` of an unused stemcell in a gallery with soft
/// delete on answers success and logs that the version is soft-deleted and until when it can be
/// restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_stemcell_in_a_soft_delete_gallery_says_until_when_the_version_is_restorable() {
    let handle = setup().await;
    let cid = "bosh-stemcell-0b0c0d0e-1111-2222-3333-444455558888";
    published_version(&handle, "1.506.0", &format!("{cid}.vhd"), cid).await;
    let raw = Raw::new(&handle.arm);
    set_soft_delete(&raw, GALLERY, true).await;

    let r = delete_stemcell(&handle, cid).await;

    assert_eq!(r["error"], Value::Null, "{r}");
    let log = r["log"].as_str().unwrap();
    assert!(
        log.contains("deleted (soft-deleted, restorable until "),
        "says it is restorable: {log}"
    );
    assert_eq!(raw.get(&version_path("1.506.0")).await.status, 404);
}
