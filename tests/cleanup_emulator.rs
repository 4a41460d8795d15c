//! `cleanup` end to end: the binary against the emulator (real ARM adapter, real evidence files).

mod emulator_support;

use emulator_support::{admin, Raw, LOC, RG, SUB};
use serde_json::{json, Value};
use stemcell_gallery::emulator::{Handle, Options, World};

const GALLERY: &str = "bosh_stemcells";
const NAME: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";

async fn emulator_with(world: Option<World>) -> Handle {
    let h = emulator_support::start(Options {
        world,
        ..Options::default()
    })
    .await;
    h.state.ensure_gallery(SUB, RG, GALLERY, LOC).unwrap();
    h.state.ensure_container("stemcell").unwrap();
    h
}

fn cli(h: &Handle, args: &[&str]) -> std::process::Output {
    emulator_support::binary_against(h, GALLERY)
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
    let vm = format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/bosh-director");
    let put = raw
        .send(
            "PUT",
            &format!("{vm}?api-version=2024-07-01"),
            Some(json!({"location": LOC, "properties": {"storageProfile": {"imageReference": {"id": live}}}})),
            true,
        )
        .await;
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

    let out = cli(
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
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
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
    println!(
        "cleanup plan over 1,000 definitions / 10,000 versions: {} ARM requests in {secs:.2} s (debug build); a per-version consumer check would need >= 10,000",
        reqs.len()
    );
    assert!(reqs.len() < 1200, "{}", reqs.len());
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
    let _ = raw.get(&id).await;
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
    let out = cli(
        &h,
        &[
            "cleanup",
            "--apply",
            "--min-age",
            "0s",
            "--keep-latest",
            "0",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
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
    let out = cli(
        &h,
        &[
            "cleanup",
            "--apply",
            "--min-age",
            "0s",
            "--keep-latest",
            "0",
            "--protect-tag",
            "KEEP-ME",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
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
    let out = cli(
        &h,
        &[
            "cleanup",
            "--apply",
            "--min-age",
            "1d",
            "--keep-latest",
            "0",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
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
