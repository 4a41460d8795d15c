//! The emulator's admin side (`/_emulator/`), persistence, worlds, the `emulator` command and the
//! global `--emulator` flag.

use crate::support::emulated;

use std::io::BufRead;
use std::process::{Command, Stdio};

use serde_json::json;
use stemcell_gallery::emulator::{Options, World};

use emulated::*;

#[tokio::test]
async fn faults_answer_with_azures_error_body_then_clear() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    let g = gallery_path("g");
    let f = admin(
        &h,
        "POST",
        "/_emulator/faults",
        Some(json!({
        "method": "PUT", "path": "*/galleries/*", "count": 2, "status": 429,
        "code": "TooManyRequests", "message": "Slow down", "retry_after": 7})),
    )
    .await;
    assert_eq!(f.status, 201, "{}", f.text);
    for _ in 0..2 {
        let throttled = r.put(&g, json!({"location": LOC})).await;
        assert_eq!(
            (throttled.status, throttled.code()),
            (429, "TooManyRequests".into())
        );
        assert_eq!(throttled.body["error"]["message"], "Slow down");
        assert_eq!(throttled.header("retry-after").as_deref(), Some("7"));
    }
    assert_eq!(
        r.put(&g, json!({"location": LOC})).await.status,
        201,
        "the fault was used up"
    );

    // Blob faults use the storage error format.
    admin(
        &h,
        "POST",
        "/_emulator/faults",
        Some(json!({"method": "*", "path": "/devstoreaccount1/", "status": 503})),
    )
    .await;
    let resp = reqwest::Client::new()
        .get(format!("{}/c?restype=container", h.blob))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(resp.headers()["x-ms-error-code"], "ServerBusy");

    admin(
        &h,
        "POST",
        "/_emulator/faults",
        Some(json!({"path": "/galleries/", "status": 500, "count": 5})),
    )
    .await;
    assert_eq!(
        admin(&h, "DELETE", "/_emulator/faults", None).await.status,
        204
    );
    assert_eq!(r.get(&g).await.status, 200, "faults cleared");
}

#[tokio::test]
async fn a_drop_fault_closes_the_connection_without_a_response() {
    let h = start_default().await;
    admin(
        &h,
        "POST",
        "/_emulator/faults",
        Some(json!({"method": "GET", "path": "/galleries/g", "drop": true})),
    )
    .await;
    let err = reqwest::Client::new()
        .get(format!(
            "{}{}?api-version=2023-07-03",
            h.arm,
            gallery_path("g")
        ))
        .bearer_auth("t")
        .send()
        .await
        .expect_err("no response");
    assert!(
        err.is_request() || err.is_connect() || err.is_body(),
        "{err:?}"
    );
    let log = admin(&h, "GET", "/_emulator/requests", None).await;
    assert_eq!(log.body["requests"][0]["status"], 0, "logged as dropped");
    let ok = Raw::new(&h.arm).get(&gallery_path("g")).await;
    assert_eq!(ok.status, 404, "the next request is served");
}

#[tokio::test]
async fn the_request_log_lists_calls_in_order_and_reset_clears_it() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    let g = gallery_path("g");
    r.put(&g, json!({"location": LOC})).await;
    r.get(&format!("{g}?$expand=x")).await;
    reqwest::Client::new()
        .get(format!("{}?comp=list", h.blob))
        .send()
        .await
        .unwrap();
    let log = admin(&h, "GET", "/_emulator/requests", None).await;
    assert_eq!(log.body["total"], 3);
    let reqs = log.body["requests"].as_array().unwrap();
    assert_eq!(
        (
            reqs[0]["method"].as_str(),
            reqs[0]["path"].as_str(),
            reqs[0]["status"].as_u64()
        ),
        (Some("PUT"), Some(g.as_str()), Some(201))
    );
    assert_eq!(reqs[1]["query"], "$expand=x&api-version=2023-07-03");
    assert_eq!(reqs[0]["service"], "arm");
    assert_eq!(reqs[2]["service"], "blob");
    assert_eq!(reqs[2]["port"], h.blob_addr.port());
    assert_eq!(reqs[0]["port"], h.arm_addr.port());
    let counters = admin(&h, "GET", "/_emulator/counters", None).await;
    assert_eq!(
        counters.body["counters"]["PUT /subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/galleries/{gallery}"],
        1
    );
    assert_eq!(
        admin(&h, "POST", "/_emulator/reset", None).await.status,
        204
    );
    let log = admin(&h, "GET", "/_emulator/requests", None).await;
    assert_eq!(log.body["total"], 0);
    assert_eq!(r.get(&g).await.status, 200, "reset keeps the state");
}

#[tokio::test]
async fn state_survives_a_restart_with_a_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("emulator.json");
    let h = start(Options {
        state_file: Some(file.clone()),
        ..Default::default()
    })
    .await;
    let r = Raw::new(&h.arm);
    gallery_and_definition(&r, "g", "d").await;
    let c = blobs(&h).container("stemcell");
    c.create().await.unwrap();
    c.blob_client("a.vhd")
        .put_page_blob(1024, &[])
        .await
        .unwrap();
    h.shutdown().await.unwrap();

    let h2 = start(Options {
        state_file: Some(file.clone()),
        ..Default::default()
    })
    .await;
    let r2 = Raw::new(&h2.arm);
    let got = r2.get(&format!("{}/images/d", gallery_path("g"))).await;
    assert_eq!(got.body["properties"]["provisioningState"], "Succeeded");
    let props = blobs(&h2)
        .container("stemcell")
        .blob_client("a.vhd")
        .properties()
        .await
        .unwrap();
    assert_eq!(props.content_length, 1024);
}

#[tokio::test]
async fn a_world_file_seeds_consumers_and_can_be_replaced() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/worlds/consumers.json");
    let world = World::load(&path).expect("the sample world loads");
    let h = start(Options {
        world: Some(world),
        ..Default::default()
    })
    .await;
    let r = Raw::new(&h.arm);
    let sub = "00000000-0000-0000-0000-000000000000";
    let vms = r.send("GET", &format!("/subscriptions/{sub}/providers/Microsoft.Compute/virtualMachines?api-version=2024-07-01"), None, true).await;
    assert_eq!(vms.body["value"][0]["name"], "director-0");
    assert!(
        vms.body["value"][0]["properties"]["storageProfile"]["imageReference"]["id"]
            .as_str()
            .unwrap()
            .ends_with("/versions/1.506.0")
    );
    let insts = r.send("GET", &format!("/subscriptions/{sub}/resourceGroups/bosh-rg/providers/Microsoft.Compute/virtualMachineScaleSets/router/virtualMachines?api-version=2024-07-01"), None, true).await;
    assert_eq!(insts.body["value"][0]["instanceId"], "0");

    let put = admin(&h, "PUT", "/_emulator/world", Some(json!({"resources": [
        {"id": format!("/subscriptions/{sub}/resourceGroups/bosh-rg/providers/Microsoft.Compute/disks/only"), "location": LOC}
    ]}))).await;
    assert_eq!(put.status, 200, "{}", put.text);
    let world = admin(&h, "GET", "/_emulator/world", None).await;
    let ids: Vec<&str> = world.body["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"only") && ids.contains(&"bosh_stemcells"),
        "{ids:?}"
    );
    assert!(!ids.contains(&"director-0"), "consumers replaced: {ids:?}");
    let bad = admin(
        &h,
        "PUT",
        "/_emulator/world",
        Some(json!({"resources": [{"id": "/nope"}]})),
    )
    .await;
    assert_eq!(bad.status, 400);
}

#[test]
fn the_emulator_command_prints_its_endpoints_as_one_json_line() {
    let mut child = Command::new(assert_cmd::cargo::cargo_bin("stemcell-gallery"))
        .args(["emulator", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the emulator");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("a ready line");
    let ready: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    let arm = ready["arm"].as_str().unwrap().to_string();
    assert!(arm.starts_with("http://127.0.0.1:"), "{line}");
    assert!(
        ready["blob"]
            .as_str()
            .unwrap()
            .ends_with("/devstoreaccount1"),
        "{line}"
    );
    assert_eq!(ready["account"], "devstoreaccount1");
    assert_eq!(ready["pid"].as_u64(), Some(u64::from(child.id())));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = rt.block_on(async {
        reqwest::Client::new()
            .get(format!("{arm}/subscriptions/s/providers/Microsoft.Compute/galleries?api-version=2023-07-03"))
            .bearer_auth("t")
            .send()
            .await
            .unwrap()
            .status()
    });
    assert_eq!(status.as_u16(), 200);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test]
async fn the_global_emulator_flag_points_the_command_at_a_ready_gallery() {
    let mut global = stemcell_gallery::cli::GlobalArgs {
        emulator: true,
        ..Default::default()
    };
    let handle = stemcell_gallery::cli::embedded::apply(&mut global)
        .await
        .unwrap()
        .expect("started");
    assert_eq!(global.arm_endpoint.as_deref(), Some(handle.arm.as_str()));
    assert_eq!(global.blob_endpoint.as_deref(), Some(handle.blob.as_str()));
    assert_eq!(global.auth.as_deref(), Some("emulator"));
    let settings = stemcell_gallery::config::Settings::resolve(&global).expect("settings resolve");
    assert_eq!(
        (settings.resource_group.as_str(), settings.gallery.as_str()),
        ("bosh-rg", "bosh_stemcells")
    );
    let r = Raw::new(&handle.arm);
    let g = r.get(&format!("/subscriptions/{}/resourceGroups/bosh-rg/providers/Microsoft.Compute/galleries/bosh_stemcells", settings.subscription)).await;
    assert_eq!(g.body["properties"]["provisioningState"], "Succeeded");
    blobs(&handle)
        .container("stemcell")
        .properties()
        .await
        .expect("the stemcell container exists");

    let mut off = stemcell_gallery::cli::GlobalArgs::default();
    assert!(stemcell_gallery::cli::embedded::apply(&mut off)
        .await
        .unwrap()
        .is_none());
}

/// `PUT /_emulator/timing {"version_write_ms": N}`: a version PUT/PATCH stays `Creating` /
/// `Updating` for N ms however often it is polled (Azure's take minutes), then completes; other
/// gallery resources are not slowed; bad documents are refused.
#[tokio::test]
async fn timing_makes_version_writes_last_at_least_the_set_duration() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    gallery_and_definition(&r, "g", "img").await;
    let t = admin(
        &h,
        "PUT",
        "/_emulator/timing",
        Some(json!({"version_write_ms": 600})),
    )
    .await;
    assert_eq!(t.status, 200, "{}", t.text);
    assert_eq!(
        admin(&h, "GET", "/_emulator/timing", None).await.body["version_write_ms"],
        600
    );
    let bad = admin(
        &h,
        "PUT",
        "/_emulator/timing",
        Some(json!({"version_ms": 1})),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.text);

    let v = format!("{}/images/img/versions/1.0.0", gallery_path("g"));
    let started = std::time::Instant::now();
    let put = r
        .put(
            &v,
            version_body("https://bosh.blob.core.windows.net/stemcell/x.vhd"),
        )
        .await;
    assert_eq!(put.status, 201, "{}", put.text);
    let state = |b: &serde_json::Value| b["properties"]["provisioningState"].clone();
    for _ in 0..3 {
        assert_eq!(state(&r.get(&v).await.body), "Creating");
    }
    while state(&r.get(&v).await.body) != "Succeeded" {
        assert!(started.elapsed().as_secs() < 10, "it completes");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(started.elapsed().as_millis() >= 600);

    let started = std::time::Instant::now();
    let patch = r.patch(&v, json!({"tags": {"a": "b"}})).await;
    assert_eq!(patch.status, 200, "{}", patch.text);
    assert_eq!(state(&r.get(&v).await.body), "Updating");
    while state(&r.get(&v).await.body) != "Succeeded" {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(started.elapsed().as_millis() >= 600);

    // A gallery update is not a version write.
    let g = r.put(&gallery_path("g"), json!({"location": LOC})).await;
    assert_eq!(g.status, 200, "{}", g.text);
    assert_eq!(state(&r.get(&gallery_path("g")).await.body), "Succeeded");
}

/// `emulator --timing azure --time-scale N` (and `--timing` alone refused without azure for a
/// scale): the ready line names the timing; the admin endpoint reports its figures.
#[test]
fn the_emulator_command_takes_the_azure_timing_with_a_time_scale() {
    let bin = assert_cmd::cargo::cargo_bin("stemcell-gallery");
    let mut child = Command::new(&bin)
        .args([
            "emulator",
            "--listen",
            "127.0.0.1:0",
            "--timing",
            "azure",
            "--time-scale",
            "60",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the emulator");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("a ready line");
    let ready: serde_json::Value = serde_json::from_str(&line).expect("JSON");
    assert_eq!(
        (&ready["timing"], &ready["time_scale"]),
        (&json!("azure"), &json!(60.0)),
        "{line}"
    );
    let arm = ready["arm"].as_str().unwrap().to_string();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let t: serde_json::Value = rt.block_on(async {
        reqwest::Client::new()
            .get(format!("{arm}/_emulator/timing"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(t["version_create_ms"], 7_500, "7.5 min / 60: {t}");
    assert_eq!(t["version_retry_after_s"], 1, "60 s / 60: {t}");

    let refused = Command::new(&bin)
        .args(["emulator", "--time-scale", "60"])
        .output()
        .expect("run");
    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--timing azure"),
        "a scale without the azure timing is refused, saying why: {refused:?}"
    );
}

/// The azure timing profile (REFERENCE.md "Durations", "Write status and LRO headers"): a
/// version create takes 7.5 min (the only recorded create: a version from a 200 GB snapshot), a
/// tags-only update 2.5 min, a DELETE 1.5 min, gallery and definition writes ~0.1 s, all / N;
/// version writes and their polls say `Retry-After` (60 s recorded; / N in whole seconds, at
/// least 1). `PUT /_emulator/timing {"profile": "azure", "time_scale": N}` switches to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_azure_timing_takes_the_recorded_durations_divided_by_the_time_scale() {
    use std::time::{Duration, Instant};
    let timing = stemcell_gallery::emulator::Timing::azure(600.0).unwrap();
    let h = start_unrestricted(Options {
        timing,
        ..Default::default()
    })
    .await;
    let r = Raw::new(&h.arm);
    gallery_and_definition(&r, "g", "img").await;
    let v = format!("{}/images/img/versions/1.0.0", gallery_path("g"));
    let state = |b: &serde_json::Value| b["properties"]["provisioningState"].clone();

    // Poll the operation as a client does, until it ends; how long it took.
    async fn follow(r: &Raw, op: &str) -> Duration {
        let started = Instant::now();
        loop {
            let o = r.send("GET", op, None, true).await;
            if o.body["status"] != "InProgress" {
                assert_eq!(o.body["status"], "Succeeded", "{}", o.text);
                return started.elapsed();
            }
            assert_eq!(
                o.header("retry-after").as_deref(),
                Some("1"),
                "{:?}",
                o.headers
            );
            assert!(started.elapsed() < Duration::from_secs(10), "it ends");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    let started = Instant::now();
    let put = r
        .put(
            &v,
            version_body("https://bosh.blob.core.windows.net/stemcell/x.vhd"),
        )
        .await;
    assert_eq!(put.status, 201, "{}", put.text);
    assert_eq!(put.header("retry-after").as_deref(), Some("1"));
    assert_eq!(state(&r.get(&v).await.body), "Creating");
    follow(&r, &put.header("azure-asyncoperation").unwrap()).await;
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(750), "450 s / 600: {took:?}");

    let started = Instant::now();
    let patch = r.patch(&v, json!({"tags": {"a": "b"}})).await;
    assert_eq!(patch.status, 200, "{}", patch.text);
    follow(&r, &patch.header("azure-asyncoperation").unwrap()).await;
    let took = started.elapsed();
    assert!(
        (Duration::from_millis(250)..Duration::from_millis(740)).contains(&took),
        "150 s / 600: {took:?}"
    );

    let started = Instant::now();
    let del = r.delete(&v).await;
    assert_eq!(del.status, 202, "{}", del.text);
    assert_eq!(del.header("retry-after").as_deref(), Some("1"));
    follow(&r, &del.header("azure-asyncoperation").unwrap()).await;
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "90 s / 600"
    );

    // An operation nobody polls still ends at its duration (Azure does not wait for clients).
    let put = r
        .put(
            &v,
            version_body("https://bosh.blob.core.windows.net/stemcell/x.vhd"),
        )
        .await;
    assert_eq!(put.status, 201, "{}", put.text);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let listed = r
        .get(&format!("{}/images/img/versions", gallery_path("g")))
        .await;
    assert_eq!(
        listed.body["value"][0]["properties"]["provisioningState"], "Succeeded",
        "{}",
        listed.text
    );

    // The admin endpoint switches profiles: at scale 1, Azure's own figures.
    let t = admin(
        &h,
        "PUT",
        "/_emulator/timing",
        Some(json!({"profile": "azure", "time_scale": 1})),
    )
    .await;
    assert_eq!(t.status, 200, "{}", t.text);
    assert_eq!(t.body["version_create_ms"], 450_000);
    assert_eq!(t.body["version_retry_after_s"], 60);
    let v2 = format!("{}/images/img/versions/2.0.0", gallery_path("g"));
    let put = r
        .put(
            &v2,
            version_body("https://bosh.blob.core.windows.net/stemcell/x.vhd"),
        )
        .await;
    assert_eq!(put.header("retry-after").as_deref(), Some("60"));
    assert_eq!(state(&r.get(&v2).await.body), "Creating");
}
