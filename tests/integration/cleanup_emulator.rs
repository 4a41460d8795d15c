//! `cleanup` end to end: the binary against the emulator (real ARM adapter, real evidence files).

use crate::support::emulated;

use emulated::{admin, block_deletion, until_settled, Raw, LOC, RG, SUB};
use serde_json::{json, Value};
use stemcell_gallery::emulator::{Handle, Options, World};

const GALLERY: &str = "bosh_stemcells";
const NAME: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";

async fn emulator_with(world: Option<World>) -> Handle {
    let h = emulated::start(Options {
        world,
        ..Options::default()
    })
    .await;
    h.state.ensure_gallery(SUB, RG, GALLERY, LOC).unwrap();
    h.state.ensure_container("stemcell").unwrap();
    h
}

fn cli(h: &Handle, args: &[&str]) -> std::process::Output {
    emulated::binary_against(h, GALLERY)
        .args(args)
        // Throttling faults below last past any retry budget; keep the budget small so the
        // suite does not sit in backoff.
        .env("STEMCELL_GALLERY_ARM_RETRIES", "1")
        .output()
        .expect("the binary runs")
}

fn ensure(h: &Handle, version: &str, create_env: bool, reference: &str) -> String {
    let sha = format!("{:0>64}", version.replace('.', ""));
    let blob = format!("https://bosh.blob.core.windows.net/stemcell/{reference}.vhd");
    let mut args = vec![
        "ensure", "--blob-uri", &blob, "--storage-account-id",
        "/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/bosh-rg/providers/Microsoft.Storage/storageAccounts/bosh",
        "--name", NAME, "--version", version, "--sha256", &sha, "--reference", reference,
    ];
    if create_env {
        args.push("--create-env");
    }
    let out = cli(h, &args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Run the binary with `args`, which must exit 0: its JSON document.
fn cli_ok(h: &Handle, args: &[&str]) -> Value {
    let out = cli(h, args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `cleanup --apply --min-age MIN_AGE --keep-latest 0 EXTRA...`, which must exit 0: its JSON.
fn cleanup_applied(h: &Handle, min_age: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "cleanup",
        "--apply",
        "--min-age",
        min_age,
        "--keep-latest",
        "0",
    ];
    args.extend_from_slice(extra);
    cli_ok(h, &args)
}

fn write(dir: &tempfile::TempDir, name: &str, v: Value) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    p.display().to_string()
}

fn bosh_state(cid: &str) -> Value {
    json!({
        "director_id": "d", "installation_id": "i", "current_vm_cid": "vm-cid",
        "current_stemcell_id": "", "current_disk_id": "disk", "current_release_ids": [],
        "current_manifest_sha": "x", "disks": [],
        "stemcells": [{"id": "s-1", "name": NAME, "version": "1.506", "api_version": 3, "cid": cid}],
        "releases": []
    })
}

/// The story that motivated the tool: create-env's recreate failed half-way, so
/// `current_stemcell_id` is "" while the director VM still runs from the stemcell's version.
#[tokio::test(flavor = "multi_thread")]
async fn failed_recreate_keeps_the_live_directors_image_and_deletes_only_the_orphan() {
    let h = emulator_with(None).await;
    let live = ensure(&h, "1.506", true, "bosh-stemcell-live");
    let unreferenced = ensure(&h, "1.402", false, "bosh-stemcell-temp");
    // Strip its reference by hand (as an operator's manual cleanup would), keeping the version.
    let raw = Raw::new(&h.arm);
    let path = format!("{unreferenced}?api-version=2023-07-03");
    let patched = raw
        .send(
            "PATCH",
            &path,
            Some(json!({"tags": {"image_sha256": "x", "stemcell_gallery_mode": "director"}})),
            true,
        )
        .await;
    assert_eq!(patched.status, 200, "{}", patched.text);
    let _ = raw.get(&unreferenced).await;
    // The director VM still runs from the create-env version.
    let (_, put) = raw.put_vm("bosh-director", &live).await;
    assert!(put.status < 300, "{}", put.text);
    let dir = tempfile::tempdir().unwrap();
    let state = write(&dir, "bosh-state.json", bosh_state("bosh-stemcell-live"));
    // Its reference tag is removed too (a delete_stemcell that kept the in-use version did that).
    let del = cli(
        &h,
        &[
            "delete",
            "--create-env",
            "--name",
            NAME,
            "--version",
            "1.506",
            "--reference",
            "bosh-stemcell-live",
        ],
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&del.stdout).unwrap()["result"],
        "kept"
    );

    let doc = cli_ok(
        &h,
        &[
            "cleanup",
            "--apply",
            "--create-env-state",
            &state,
            "--min-age",
            "0s",
            "--keep-latest",
            "0",
        ],
    );
    let versions = doc["versions"].as_array().unwrap();
    let live_entry = versions
        .iter()
        .find(|v| v["id"] == live)
        .expect("the live version is planned");
    assert_eq!(live_entry["verdict"], "keep");
    let kinds: Vec<&str> = live_entry["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"create_env_holds"), "{kinds:?}");
    assert!(kinds.contains(&"used_by_consumer"), "{kinds:?}");
    let orphan_entry = versions.iter().find(|v| v["id"] == unreferenced).unwrap();
    assert_eq!(orphan_entry["verdict"], "delete");
    assert_eq!(raw.get(&live).await.status, 200, "the live image survives");
    assert_eq!(
        raw.get(&unreferenced).await.status,
        404,
        "the orphan is gone"
    );
}

/// Any evidence source that cannot be read: exit 5, and not one DELETE.
#[tokio::test(flavor = "multi_thread")]
async fn each_unreadable_source_stops_the_cleanup_with_exit_5_and_no_delete() {
    let h = emulator_with(None).await;
    let v = ensure(&h, "1.300", false, "bosh-stemcell-x");
    let raw = Raw::new(&h.arm);
    let _ = raw
        .send(
            "PATCH",
            &format!("{v}?api-version=2023-07-03"),
            Some(json!({"tags": {"image_sha256": "x"}})),
            true,
        )
        .await;
    let _ = raw.get(&v).await;
    let dir = tempfile::tempdir().unwrap();
    let good_state = write(&dir, "state.json", bosh_state("bosh-stemcell-other"));
    let bad = dir.path().join("broken.json");
    std::fs::write(&bad, b"{\"Tables\": [").unwrap();
    let bad = bad.display().to_string();
    let missing = dir.path().join("missing.json").display().to_string();

    let base = [
        "cleanup",
        "--apply",
        "--min-age",
        "0s",
        "--keep-latest",
        "0",
    ];
    let cases: Vec<(&str, Vec<String>, Option<Value>)> = vec![
        (
            "virtual machines listing forbidden",
            vec![],
            Some(
                json!({"method": "GET", "path": "*/providers/Microsoft.Compute/virtualMachines", "count": 100, "status": 403, "code": "AuthorizationFailed"}),
            ),
        ),
        (
            "disks listing throttled past retries",
            vec![],
            Some(
                json!({"method": "GET", "path": "*/providers/Microsoft.Compute/disks", "count": 100, "status": 429, "code": "TooManyRequests", "retry_after": 0}),
            ),
        ),
        (
            "scale sets listing failing",
            vec![],
            Some(
                json!({"method": "GET", "path": "*/providers/Microsoft.Compute/virtualMachineScaleSets", "count": 100, "status": 500, "code": "InternalServerError"}),
            ),
        ),
        (
            "a malformed director list",
            vec!["--director-stemcells".into(), bad.clone()],
            None,
        ),
        (
            "a missing create-env state",
            vec!["--create-env-state".into(), missing.clone()],
            None,
        ),
    ];
    for (story, extra, fault) in cases {
        admin(&h, "DELETE", "/_emulator/faults", None).await;
        if let Some(f) = fault {
            let r = admin(&h, "POST", "/_emulator/faults", Some(f)).await;
            assert!(r.status < 300, "{story}: {}", r.text);
        }
        h.state.reset_log();
        let mut args: Vec<String> = base.iter().map(|s| s.to_string()).collect();
        args.extend(["--create-env-state".to_string(), good_state.clone()]);
        args.extend(extra);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = cli(&h, &argv);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(5), "{story}: {stderr}");
        assert!(!stderr.contains("panicked"), "{story}");
        let deletes = h
            .state
            .requests()
            .into_iter()
            .filter(|r| r.method == "DELETE")
            .count();
        assert_eq!(deletes, 0, "{story}: nothing may be deleted");
    }
    admin(&h, "DELETE", "/_emulator/faults", None).await;
    assert_eq!(raw.get(&v).await.status, 200);
}

/// 1,000 definitions holding 10,000 versions: consumers are listed once per subscription, not
/// once per version. Prints the request count and wall time for bench/README.md.
#[tokio::test(flavor = "multi_thread")]
async fn planning_ten_thousand_versions_lists_consumers_once() {
    let g = format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/galleries/{GALLERY}"
    );
    let mut resources = Vec::new();
    for d in 0..1000 {
        let def = format!("stemcell-{d:04}");
        resources.push(
            json!({"id": format!("{g}/images/{def}"), "location": LOC, "properties": {
            "osType": "Linux", "osState": "Generalized", "hyperVGeneration": "V1",
            "identifier": {"publisher": "bosh", "offer": def, "sku": "gen1"}}}),
        );
        for v in 0..10 {
            resources.push(json!({"id": format!("{g}/images/{def}/versions/1.{v}.0"), "location": LOC,
                "tags": {"image_sha256": "ab", "stemcell_gallery_mode": "director"},
                "properties": {"publishingProfile": {"targetRegions": [{"name": LOC}], "publishedDate": "2026-01-01T00:00:00Z"},
                    "storageProfile": {"osDiskImage": {"source": {"uri": format!("https://x.blob.core.windows.net/stemcell/{def}-{v}.vhd")}}}}}));
        }
    }
    let vm = format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/vm-0"
    );
    resources.push(json!({"id": vm, "location": LOC, "properties": {"storageProfile": {"imageReference": {"id": format!("{g}/images/stemcell-0000/versions/1.0.0")}}}}));
    let h = emulator_with(Some(World { resources })).await;
    h.state.reset_log();
    let started = std::time::Instant::now();
    let out = cli(&h, &["cleanup", "--min-age", "1h", "--keep-latest", "2"]);
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["summary"]["total"], 10_000);
    let reqs = h.state.requests();
    let vm_lists = reqs
        .iter()
        .filter(|r| {
            r.path
                .ends_with("/providers/Microsoft.Compute/virtualMachines")
        })
        .count();
    assert_eq!(vm_lists, 1, "consumers are listed once, not per version");
    assert!(reqs.iter().all(|r| r.method == "GET"), "a plan only reads");
    let arm = reqs
        .iter()
        .filter(|r| r.path.starts_with("/subscriptions/"))
        .count();
    // The reference records: one listing of the gallery's locks and one of the previous
    // release's (by the gallery's name), then one read per record that exists (none here:
    // these versions were made without the tool).
    let blob = reqs.len() - arm;
    println!(
        "cleanup plan over 1,000 definitions / 10,000 versions: {arm} ARM requests and {blob} blob requests in {secs:.2} s (debug build); a per-version consumer check would need >= 10,000",
    );
    assert!(arm < 1200, "{arm}");
    assert!(blob <= 2, "{blob}");
}

// ---------------------------------------------------------------------------------------------
// Consumers through every image-reference form, in two subscriptions
// (fixtures/worlds/consumer-forms.json).

const CONSUMER_SUB: &str = "22222222-3333-4444-5555-666666666666";

/// Plan (dry run) a cleanup of the consumer-forms world: version → (verdict, reason kinds),
/// and the evidence sources the plan names.
async fn plan_consumer_forms(
    extra: &[&str],
) -> (
    Value,
    std::collections::BTreeMap<String, (String, Vec<String>)>,
) {
    let world = World::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/worlds/consumer-forms.json"),
    )
    .unwrap();
    let h = emulator_with(Some(world)).await;
    let mut args = vec!["cleanup", "--min-age", "0s", "--keep-latest", "0"];
    args.extend_from_slice(extra);
    let doc = cli_ok(&h, &args);
    let mut by_version = std::collections::BTreeMap::new();
    for v in doc["versions"].as_array().unwrap() {
        let kinds = v["reasons"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["kind"].as_str().unwrap().to_string())
            .collect();
        by_version.insert(
            v["version"].as_str().unwrap().to_string(),
            (v["verdict"].as_str().unwrap().to_string(), kinds),
        );
    }
    (doc, by_version)
}

fn assert_kept_by_consumer(
    plan: &std::collections::BTreeMap<String, (String, Vec<String>)>,
    version: &str,
) {
    let (verdict, kinds) = &plan[version];
    assert_eq!(verdict, "keep", "{version}: {kinds:?}");
    assert!(
        kinds.iter().any(|k| k == "used_by_consumer"),
        "{version}: {kinds:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vm_referring_to_the_version_through_shared_gallery_image_id_keeps_it() {
    let (_, plan) = plan_consumer_forms(&[]).await;
    assert_kept_by_consumer(&plan, "1.400.0");
    // Nothing uses 1.406.0: the same plan deletes it.
    assert_eq!(plan["1.406.0"].0, "delete", "{:?}", plan["1.406.0"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vm_referring_to_the_version_through_community_gallery_image_id_keeps_it() {
    let (_, plan) = plan_consumer_forms(&[]).await;
    assert_kept_by_consumer(&plan, "1.401.0");
}

/// Disks record the image in `creationData.galleryImageReference` (here its
/// `communityGalleryImageId`) or `creationData.imageReference` (here a shared id in another
/// casing).
#[tokio::test(flavor = "multi_thread")]
async fn a_disk_referring_to_the_version_through_any_gallery_form_keeps_it() {
    let (_, plan) = plan_consumer_forms(&[]).await;
    assert_kept_by_consumer(&plan, "1.402.0");
    assert_kept_by_consumer(&plan, "1.403.0");
}

/// The scale set asks for `latest` (the definition id); its instance was built when 1.404.0 was
/// latest, and Azure records that as `exactVersion`. Both what it runs and what `latest` gives a
/// scale-out (1.410.0) are kept.
#[tokio::test(flavor = "multi_thread")]
async fn a_scale_set_instance_created_from_latest_that_runs_an_older_version_keeps_that_version() {
    let (_, plan) = plan_consumer_forms(&[]).await;
    assert_kept_by_consumer(&plan, "1.404.0");
    let (verdict, kinds) = &plan["1.410.0"];
    assert_eq!(verdict, "keep");
    assert!(
        kinds.iter().any(|k| k == "latest_of_definition_used_by"),
        "{kinds:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vm_in_a_consumer_subscription_keeps_the_version() {
    let (doc, plan) = plan_consumer_forms(&["--consumer-subscription", CONSUMER_SUB]).await;
    assert_kept_by_consumer(&plan, "1.405.0");
    let sources = doc.to_string();
    assert!(
        sources.contains(CONSUMER_SUB),
        "the plan names the scopes read: {sources}"
    );
}

/// Only the listed scopes are read: without `--consumer-subscription` (or
/// `consumer_subscriptions` / STEMCELL_GALLERY_CONSUMER_SUBSCRIPTIONS) a VM in another
/// subscription is not seen, and the plan says which subscriptions it read.
#[tokio::test(flavor = "multi_thread")]
async fn without_consumer_subscription_only_the_gallerys_subscription_is_read() {
    let (doc, plan) = plan_consumer_forms(&[]).await;
    assert_eq!(plan["1.405.0"].0, "delete", "{:?}", plan["1.405.0"]);
    let text = doc.to_string();
    assert!(text.contains(&format!("in subscriptions {SUB}")), "{text}");
    assert!(!text.contains(CONSUMER_SUB), "{text}");
}

/// The environment variable is read too, and a bad subscription id is a usage error before any
/// request.
#[tokio::test(flavor = "multi_thread")]
async fn consumer_subscriptions_come_from_the_environment_and_bad_ids_are_refused_before_any_request(
) {
    let world = World::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/worlds/consumer-forms.json"),
    )
    .unwrap();
    let h = emulator_with(Some(world)).await;
    let out = emulated::binary_against(&h, GALLERY)
        .args(["cleanup", "--min-age", "0s", "--keep-latest", "0"])
        .env(
            "STEMCELL_GALLERY_CONSUMER_SUBSCRIPTIONS",
            format!(" {CONSUMER_SUB} ,"),
        )
        .output()
        .unwrap();
    // A trailing empty entry is not a subscription id.
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = admin(&h, "GET", "/_emulator/requests", None).await;
    let out = emulated::binary_against(&h, GALLERY)
        .args(["cleanup", "--min-age", "0s", "--keep-latest", "0"])
        .args(["--consumer-subscription", "not-a-guid"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not-a-guid") && stderr.contains("GUID"),
        "{stderr}"
    );
    let after = admin(&h, "GET", "/_emulator/requests", None).await;
    let total = |r: &emulated::RawResponse| {
        serde_json::from_str::<Value>(&r.text).unwrap()["total"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(
        total(&before),
        total(&after),
        "no request before the usage error"
    );
    let out = emulated::binary_against(&h, GALLERY)
        .args(["cleanup", "--min-age", "0s", "--keep-latest", "0"])
        .env(
            "STEMCELL_GALLERY_CONSUMER_SUBSCRIPTIONS",
            CONSUMER_SUB.to_uppercase(),
        )
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let v = doc["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["version"] == "1.405.0")
        .unwrap()
        .clone();
    assert_eq!(v["verdict"], "keep", "{v}");
}

// ---------------------------------------------------------------------------------------------
// `delete` and `latest`: one rule (gallery::latest) for every delete path.

/// A world with the definition, a newer version 1.507.0 described by `newer` (its `properties`),
/// and a Uniform scale set in westeurope on the definition (`latest`).
fn latest_world(newer: Value) -> World {
    let def = format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/galleries/{GALLERY}/images/{NAME}"
    );
    let mut props = json!({
        "publishingProfile": {"publishedDate": "2026-01-01T00:00:00+00:00", "replicaCount": 1,
                              "targetRegions": [{"name": "West Europe", "regionalReplicaCount": 1}]},
        "storageProfile": {"osDiskImage": {"source": {
            "uri": "https://bosh.blob.core.windows.net/stemcell/bosh-stemcell-newer.vhd",
            "storageAccountId": format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Storage/storageAccounts/bosh")}}}
    });
    for (k, v) in newer.as_object().unwrap() {
        if k == "publishingProfile" {
            for (pk, pv) in v.as_object().unwrap() {
                props["publishingProfile"][pk] = pv.clone();
            }
        } else {
            props[k] = v.clone();
        }
    }
    World {
        resources: vec![
            json!({"id": format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/galleries/{GALLERY}"),
                   "location": LOC, "properties": {}}),
            json!({"id": def, "location": LOC, "properties": {
                "osType": "Linux", "osState": "Generalized", "hyperVGeneration": "V1", "architecture": "x64",
                "identifier": {"publisher": "bosh", "offer": NAME, "sku": "gen1"}}}),
            json!({"id": format!("{def}/versions/1.507.0"), "location": LOC, "properties": props}),
            json!({"id": format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets/web"),
                   "location": LOC, "sku": {"name": "Standard_D2s_v5", "capacity": 2},
                   "properties": {"orchestrationMode": "Uniform",
                                  "virtualMachineProfile": {"storageProfile": {"imageReference": {"id": def}}}}}),
        ],
    }
}

/// `delete` of 1.506's reference `bosh-stemcell-a` answers `kept`.
fn assert_delete_of_reference_a_keeps_1_506(h: &Handle) {
    let doc = cli_ok(
        h,
        &[
            "delete",
            "--name",
            NAME,
            "--version",
            "1.506",
            "--reference",
            "bosh-stemcell-a",
        ],
    );
    assert_eq!(doc["result"], "kept", "{doc}");
}

/// Publish 1.506 (reference `bosh-stemcell-a`), then `delete` that reference: the scale set on
/// the definition may run 1.506.0 (`latest` can resolve to it), so the version must stay.
async fn delete_keeps_what_latest_can_resolve_to(newer: Value) {
    let h = emulator_with(Some(latest_world(newer))).await;
    let id = ensure(&h, "1.506", false, "bosh-stemcell-a");
    assert_delete_of_reference_a_keeps_1_506(&h);
    let raw = Raw::new(&h.arm);
    assert_eq!(
        raw.get(&format!("{id}?api-version=2023-07-03"))
            .await
            .status,
        200
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_does_not_delete_what_a_scale_set_on_the_definition_runs_while_a_newer_version_is_creating(
) {
    delete_keeps_what_latest_can_resolve_to(json!({"provisioningState": "Creating"})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_does_not_delete_what_a_scale_set_on_the_definition_runs_while_a_newer_version_is_failed(
) {
    delete_keeps_what_latest_can_resolve_to(json!({"provisioningState": "Failed"})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_does_not_delete_what_a_scale_set_runs_while_the_newer_version_is_excluded_from_latest_in_its_region(
) {
    delete_keeps_what_latest_can_resolve_to(json!({
        "publishingProfile": {"targetRegions": [
            {"name": "West Europe", "regionalReplicaCount": 1, "excludeFromLatest": true},
            {"name": "North Europe", "regionalReplicaCount": 1}
        ]}
    }))
    .await;
}

/// A Flexible scale set (the default mode for new scale sets) anywhere in the scope: Azure refuses
/// to list its instances as scale-set VMs (400), and they are ordinary VMs in the VM list. Its VM
/// running 1.506.0 keeps that version; the refusal never makes `delete` or `cleanup` fail.
#[tokio::test(flavor = "multi_thread")]
async fn a_flexible_scale_sets_vm_keeps_the_version_and_its_instances_are_never_listed() {
    let def = format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/galleries/{GALLERY}/images/{NAME}"
    );
    let flex = format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachineScaleSets/flex");
    let mut world = latest_world(json!({}));
    world.resources.retain(|r| {
        !r["id"].as_str().unwrap().ends_with("/versions/1.507.0")
            && !r["id"].as_str().unwrap().ends_with("/web")
    });
    world.resources.push(json!({"id": flex, "location": LOC,
        "properties": {"orchestrationMode": "Flexible", "platformFaultDomainCount": 1}}));
    world.resources.push(json!({
        "id": format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/flex_a1b2c3"),
        "location": LOC,
        "properties": {"virtualMachineScaleSet": {"id": flex},
            "storageProfile": {"imageReference": {"id": format!("{def}/versions/1.506.0")}}}}));
    let h = emulator_with(Some(world)).await;
    // The emulator answers as Azure does.
    let r = Raw::new(&h.arm)
        .get(&format!("{flex}/virtualMachines?api-version=2024-07-01"))
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert!(
        r.text
            .contains("is not allowed on Virtual Machine Scale Set 'flex'"),
        "{}",
        r.text
    );

    ensure(&h, "1.506", false, "bosh-stemcell-a");
    let plan = cli_ok(&h, &["cleanup", "--keep-latest", "0", "--min-age", "0s"]);
    assert!(
        plan.to_string().contains("flex_a1b2c3"),
        "the plan names the VM: {plan}"
    );
    assert_delete_of_reference_a_keeps_1_506(&h);
}

/// `delete` reads the same consumer scopes as `cleanup` (here from the environment): a version a
/// VM in a consumer subscription runs is kept; without that subscription it is not seen.
#[tokio::test(flavor = "multi_thread")]
async fn delete_keeps_a_version_a_vm_in_a_consumer_subscription_runs() {
    let world = World::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/worlds/consumer-forms.json"),
    )
    .unwrap();
    let h = emulator_with(Some(world)).await;
    let delete = |version: &str, env: Option<&str>| {
        let mut cmd = emulated::binary_against(&h, GALLERY);
        cmd.args(["delete", "--name", NAME, "--version", version]);
        if let Some(subs) = env {
            cmd.env("STEMCELL_GALLERY_CONSUMER_SUBSCRIPTIONS", subs);
        }
        let out = cmd.output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["result"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(delete("1.405", Some(CONSUMER_SUB)), "kept");
    // The shared-gallery VM keeps 1.400.0 through `delete` too.
    assert_eq!(delete("1.400", None), "kept");
    // Only listed scopes are read.
    assert_eq!(delete("1.405", None), "deleted");
}

/// A version with no reference left (tags rewritten by hand, as an operator's manual cleanup
/// would), plus `extra` tags.
async fn unreferenced(h: &Handle, version: &str, extra: Value) -> String {
    let id = ensure(h, version, false, &format!("bosh-stemcell-{version}"));
    let mut tags = json!({"image_sha256": "x", "stemcell_gallery_mode": "director"});
    for (k, v) in extra.as_object().unwrap() {
        tags[k] = v.clone();
    }
    let raw = Raw::new(&h.arm);
    let patched = raw
        .send(
            "PATCH",
            &format!("{id}?api-version=2023-07-03"),
            Some(json!({ "tags": tags })),
            true,
        )
        .await;
    assert_eq!(patched.status, 200, "{}", patched.text);
    until_settled(&raw, &id).await;
    id
}

fn planned<'a>(doc: &'a Value, id: &str) -> (&'a str, Vec<&'a str>) {
    let entry = doc["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == id)
        .unwrap_or_else(|| panic!("{id} is planned: {doc}"));
    let kinds = entry["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["kind"].as_str().unwrap())
        .collect();
    (entry["verdict"].as_str().unwrap(), kinds)
}

/// Issue 14 item 8: Azure tag names are case-insensitive, so a protect tag written
/// `Stemcell_Gallery_Protect` (or a `--protect-tag` spelled differently) protects the version.
#[tokio::test(flavor = "multi_thread")]
async fn a_protect_tag_in_another_casing_still_protects_the_version() {
    let h = emulator_with(None).await;
    let by_default = unreferenced(&h, "1.401", json!({"Stemcell_Gallery_Protect": "yes"})).await;
    let orphan = unreferenced(&h, "1.403", json!({})).await;
    let doc = cleanup_applied(&h, "0s", &[]);
    let (verdict, kinds) = planned(&doc, &by_default);
    assert_eq!(verdict, "keep", "{kinds:?}");
    assert!(kinds.contains(&"protected"), "{kinds:?}");
    assert_eq!(planned(&doc, &orphan).0, "delete");
    let raw = Raw::new(&h.arm);
    assert_eq!(
        raw.get(&by_default).await.status,
        200,
        "the protected version survives"
    );
    // `--protect-tag KEEP-ME` protects the version tagged `keep-me`.
    let by_flag = unreferenced(&h, "1.402", json!({"keep-me": ""})).await;
    let doc = cleanup_applied(&h, "0s", &["--protect-tag", "KEEP-ME"]);
    let (verdict, kinds) = planned(&doc, &by_flag);
    assert_eq!(verdict, "keep", "{kinds:?}");
    assert_eq!(raw.get(&by_flag).await.status, 200);
}

/// Issue 14 item 12: ages come from Azure's clock (the `Date` header of ARM's answers), not the
/// host's. Azure's clock is three days behind this host's: a version published a minute ago by
/// Azure's clock is three days old by the host's, and must be kept as too young.
#[tokio::test(flavor = "multi_thread")]
async fn a_host_clock_ahead_of_azure_cannot_make_a_young_version_old() {
    let h = emulator_with(None).await;
    let moved = admin(
        &h,
        "POST",
        "/_emulator/clock",
        Some(json!({"advance_secs": -3 * 86_400})),
    )
    .await;
    assert_eq!(moved.status, 200, "{}", moved.text);
    let young = unreferenced(&h, "1.402", json!({})).await;
    let doc = cleanup_applied(&h, "1d", &[]);
    let (verdict, kinds) = planned(&doc, &young);
    assert_eq!(verdict, "keep", "{kinds:?}");
    assert!(kinds.contains(&"too_young"), "{kinds:?}");
    assert_eq!(
        Raw::new(&h.arm).get(&young).await.status,
        200,
        "the young version survives"
    );
}

/// Issue 14 item 7: what `bosh stemcells --json` prints for a director that holds no stemcell
/// (bosh-cli's json UI always writes one `stemcells` table whose `Rows` is `[]`) is read as an
/// empty list, and cleanup goes ahead.
#[tokio::test(flavor = "multi_thread")]
async fn a_director_with_no_stemcells_is_empty_evidence() {
    let h = emulator_with(None).await;
    let orphan = unreferenced(&h, "1.402", json!({})).await;
    let dir = tempfile::tempdir().unwrap();
    let empty = write(
        &dir,
        "stemcells.json",
        json!({"Tables": [{"Content": "stemcells",
            "Header": {"cid": "CID", "cpi": "CPI", "name": "Name", "os": "OS", "version": "Version"},
            "Rows": [], "Notes": ["(*) Currently deployed"]}],
            "Blocks": null, "Lines": ["Using environment '10.0.0.6' as client 'admin'", "Succeeded"]}),
    );
    let out = cli(
        &h,
        &[
            "cleanup",
            "--apply",
            "--min-age",
            "0s",
            "--keep-latest",
            "0",
            "--director-stemcells",
            &empty,
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(Raw::new(&h.arm).get(&orphan).await.status, 404);
}

/// Block `id`'s deletion until `days` from now (`support::emulated::block_deletion`): the end
/// of life as set.
async fn block_deletion_for(h: &Handle, id: &str, days: i64) -> String {
    let eol = (time::OffsetDateTime::now_utc() + time::Duration::days(days))
        .replace_nanosecond(0)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    block_deletion(&Raw::new(&h.arm), id, &eol).await;
    eol
}

/// Issue 30 item 3: an unused version that blocks its deletion until its end of life is planned
/// as kept, with the date; `cleanup --apply` deletes the rest and exits 0, and never lifts the
/// block.
#[tokio::test(flavor = "multi_thread")]
async fn cleanup_keeps_a_version_whose_deletion_is_blocked_and_deletes_the_rest() {
    let h = emulator_with(None).await;
    let blocked = unreferenced(&h, "1.401", json!({})).await;
    let eol = block_deletion_for(&h, &blocked, 30).await;
    let orphan = unreferenced(&h, "1.402", json!({})).await;
    let doc = cleanup_applied(&h, "0s", &[]);
    let (verdict, kinds) = planned(&doc, &blocked);
    assert_eq!(verdict, "keep", "{kinds:?}");
    assert!(kinds.contains(&"blocked_before_end_of_life"), "{kinds:?}");
    let entry = doc["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == blocked)
        .unwrap();
    assert_eq!(entry["blocked_until"], json!(eol), "{entry}");
    assert_eq!(planned(&doc, &orphan).0, "delete");
    let raw = Raw::new(&h.arm);
    assert_eq!(raw.get(&orphan).await.status, 404, "the rest is deleted");
    let kept = raw.get(&format!("{blocked}?api-version=2024-03-03")).await;
    assert_eq!(kept.status, 200);
    assert_eq!(
        kept.body["properties"]["safetyProfile"]["blockDeletionBeforeEndOfLife"], true,
        "the block is never lifted: {}",
        kept.text
    );
}

/// Issue 30 item 3: `delete` of the last reference of a version whose deletion is blocked
/// removes the reference, keeps the version, exits 0 and says until when. The DELETE is
/// refused by Azure (the tool does not guess from its own clock): the refusal is an answer, not
/// an error.
#[tokio::test(flavor = "multi_thread")]
async fn delete_of_the_last_reference_keeps_a_blocked_version_and_says_until_when() {
    let h = emulator_with(None).await;
    let id = ensure(&h, "1.406", false, "bosh-stemcell-blocked");
    let eol = block_deletion_for(&h, &id, 10).await;
    let out = cli(
        &h,
        &[
            "delete",
            "--name",
            NAME,
            "--version",
            "1.406",
            "--reference",
            "bosh-stemcell-blocked",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["result"], "kept", "{doc}");
    assert_eq!(doc["kept_because"], "blocked_before_end_of_life", "{doc}");
    assert_eq!(doc["blocked_until"], json!(eol), "{doc}");
    assert_eq!(
        doc["removed_references"],
        json!(["bosh-stemcell-blocked"]),
        "{doc}"
    );
    let raw = Raw::new(&h.arm);
    let v = raw.get(&id).await;
    assert_eq!(v.status, 200, "the version stays");
    assert_eq!(
        v.body["tags"]["stemcell_references"], "",
        "the reference is gone: {}",
        v.text
    );
}

/// Issue 30 item 4: in a gallery with soft delete on, Azure cannot delete a Failed version
/// (SDDOC; the emulator refuses the DELETE with 409). `cleanup --apply` plans an unused Failed
/// version there as kept, naming why and the remedy, sends it no DELETE, deletes the rest and
/// exits 0; with soft delete off the same cleanup deletes it.
#[tokio::test(flavor = "multi_thread")]
async fn cleanup_keeps_a_failed_version_a_soft_delete_gallery_cannot_delete_and_deletes_the_rest() {
    let h = emulator_with(None).await;
    let orphan = unreferenced(&h, "1.402", json!({})).await;
    let raw = Raw::new(&h.arm);
    let failed = failed_version(
        &h,
        "1.401.0",
        json!({"image_sha256": "x", "stemcell_gallery_mode": "director"}),
    )
    .await;
    emulated::set_soft_delete(&raw, GALLERY, true).await;

    admin(&h, "POST", "/_emulator/reset", None).await;
    let doc = cleanup_applied(&h, "0s", &[]);
    let (verdict, kinds) = planned(&doc, &failed);
    assert_eq!(verdict, "keep", "{kinds:?}");
    assert!(
        kinds.contains(&"failed_in_soft_delete_gallery"),
        "{kinds:?}"
    );
    let entry = doc["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == failed)
        .unwrap();
    let said = entry["reasons"].to_string();
    assert!(said.contains("isSoftDeleteEnabled"), "the remedy: {said}");
    assert_eq!(planned(&doc, &orphan).0, "delete");
    assert_eq!(raw.get(&orphan).await.status, 404, "the rest is deleted");
    let deleted = doc["versions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["id"] == orphan)
        .unwrap();
    assert_eq!(deleted["soft_deleted"], true, "{deleted}");
    assert_restorable_for_seven_days(&deleted["restorable_until"]);
    assert_eq!(
        raw.get(&failed).await.status,
        200,
        "the Failed version stays"
    );
    let log = admin(&h, "GET", "/_emulator/requests", None).await;
    let deletes: Vec<&Value> = log.body["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["method"] == "DELETE" && r["path"].as_str().unwrap_or("").ends_with("/1.401.0")
        })
        .collect();
    assert!(
        deletes.is_empty(),
        "no DELETE of the Failed version: {deletes:?}"
    );

    emulated::set_soft_delete(&raw, GALLERY, false).await;
    let doc = cleanup_applied(&h, "0s", &[]);
    assert_eq!(planned(&doc, &failed).0, "delete", "{doc}");
    assert_eq!(raw.get(&failed).await.status, 404);
}

/// Issue 30 item 4: `delete` of the last reference of a Failed version in a gallery with soft
/// delete on removes the reference, keeps the version (Azure cannot delete it there), sends it no
/// DELETE, exits 0 and names the remedy.
#[tokio::test(flavor = "multi_thread")]
async fn delete_of_the_last_reference_keeps_a_failed_version_a_soft_delete_gallery_cannot_delete() {
    let h = emulator_with(None).await;
    ensure(&h, "1.402", false, "bosh-stemcell-other");
    let raw = Raw::new(&h.arm);
    let failed = failed_version(
        &h,
        "1.407.0",
        json!({
            "image_sha256": "x",
            "stemcell_gallery_mode": "director",
            "stemcell_references": "bosh-stemcell-failed"
        }),
    )
    .await;
    emulated::set_soft_delete(&raw, GALLERY, true).await;

    admin(&h, "POST", "/_emulator/reset", None).await;
    let out = cli(
        &h,
        &[
            "delete",
            "--name",
            NAME,
            "--version",
            "1.407",
            "--reference",
            "bosh-stemcell-failed",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["result"], "kept", "{doc}");
    assert_eq!(
        doc["kept_because"], "failed_in_soft_delete_gallery",
        "{doc}"
    );
    assert_eq!(
        doc["removed_references"],
        json!(["bosh-stemcell-failed"]),
        "{doc}"
    );
    assert!(
        stderr.contains("isSoftDeleteEnabled") || doc.to_string().contains("isSoftDeleteEnabled"),
        "the remedy: {stderr}\n{doc}"
    );
    let v = raw.get(&failed).await;
    assert_eq!(v.status, 200, "the version stays");
    let log = admin(&h, "GET", "/_emulator/requests", None).await;
    let deletes: Vec<&Value> = log.body["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            r["method"] == "DELETE" && r["path"].as_str().unwrap_or("").ends_with("/1.407.0")
        })
        .collect();
    assert!(
        deletes.is_empty(),
        "no DELETE of the Failed version: {deletes:?}"
    );
}

/// `restorable_until` is about seven days from now (the emulator's retention; Azure's clock,
/// which the emulator shares with this host here).
fn assert_restorable_for_seven_days(until: &Value) {
    let at = time::OffsetDateTime::parse(
        until
            .as_str()
            .unwrap_or_else(|| panic!("restorable_until: {until}")),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    let left = at - time::OffsetDateTime::now_utc();
    assert!(
        left > time::Duration::days(7) - time::Duration::minutes(5)
            && left <= time::Duration::days(7) + time::Duration::minutes(1),
        "{until}"
    );
}

/// Issue 30 item 4: a `delete` in a gallery with soft delete on reports the version
/// soft-deleted and until when it can be restored (the emulator lists it as soft-deleted); in a
/// gallery without, `soft_deleted` is false.
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_in_a_soft_delete_gallery_says_the_version_is_restorable_until_when() {
    let h = emulator_with(None).await;
    ensure(&h, "1.408", false, "bosh-stemcell-plain");
    let delete = |reference: &'static str, version: &'static str| {
        cli_ok(
            &h,
            &[
                "delete",
                "--name",
                NAME,
                "--version",
                version,
                "--reference",
                reference,
            ],
        )
    };
    let doc = delete("bosh-stemcell-plain", "1.408");
    assert_eq!(
        (doc["result"].as_str(), doc["soft_deleted"].as_bool()),
        (Some("deleted"), Some(false)),
        "{doc}"
    );
    assert_eq!(doc["restorable_until"], Value::Null, "{doc}");

    ensure(&h, "1.409", false, "bosh-stemcell-soft");
    let raw = Raw::new(&h.arm);
    emulated::set_soft_delete(&raw, GALLERY, true).await;
    let doc = delete("bosh-stemcell-soft", "1.409");
    assert_eq!(doc["result"], "deleted", "{doc}");
    assert_eq!(doc["soft_deleted"], true, "{doc}");
    assert_restorable_for_seven_days(&doc["restorable_until"]);
    let listed = raw
        .get(&format!(
            "{}/softDeletedArtifactTypes/Images/artifacts/{NAME}/versions?api-version=2024-03-03",
            emulated::gallery_path(GALLERY)
        ))
        .await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    assert!(
        listed.text.contains("1.409.0"),
        "listed as soft-deleted: {}",
        listed.text
    );
}

/// A version `key` of NAME that ends Failed (made from a blob that does not exist), tagged
/// `tags`: its id.
async fn failed_version(h: &Handle, key: &str, tags: Value) -> String {
    let raw = Raw::new(&h.arm);
    let failed = format!(
        "{}/images/{NAME}/versions/{key}",
        emulated::gallery_path(GALLERY)
    );
    let mut body = emulated::version_body(&format!("{}/stemcell/missing.vhd", h.blob));
    body["tags"] = tags;
    let put = raw.put(&failed, body).await;
    assert_eq!(put.status, 201, "{}", put.text);
    until_settled(&raw, &failed).await;
    assert_eq!(
        raw.get(&failed).await.body["properties"]["provisioningState"],
        "Failed"
    );
    failed
}
