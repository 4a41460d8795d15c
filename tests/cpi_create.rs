//! `create_stemcell` through the binary against the emulator: the create-env → director upload
//! story that used to end in `409 PropertyChangeNotAllowed`.

#[path = "emulator_support/mod.rs"]
mod emulator_support;

use std::io::Read;
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use emulator_support::*;
use serde_json::{json, Value};
use stemcell_gallery::emulator::Handle;
use stemcell_gallery::gallery::tags;

const GALLERY: &str = "bosh_gallery";

/// What bosh hands the CPI: the extracted `image` file and stemcell.MF's cloud_properties.
fn unpack(stemcell: &str, dir: &Path) -> (PathBuf, Value) {
    let f = std::fs::File::open(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/stemcells")
            .join(stemcell),
    )
    .unwrap();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let mut manifest = None;
    let image = dir.join("image");
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry
            .path()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        if name == "image" {
            entry.unpack(&image).unwrap();
        } else if name == "stemcell.MF" {
            let mut s = String::new();
            entry.read_to_string(&mut s).unwrap();
            manifest = Some(s);
        }
    }
    let mf: serde_yaml_ng::Value = serde_yaml_ng::from_str(&manifest.unwrap()).unwrap();
    let cloud: Value = serde_json::to_value(&mf["cloud_properties"]).unwrap();
    (image, cloud)
}

async fn cpi(handle: &Handle, request: Value, env: &[(&str, &str)]) -> Value {
    let (arm, blob) = (handle.arm.clone(), handle.blob.clone());
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let out = tokio::task::spawn_blocking(move || {
        let mut c = Command::cargo_bin("stemcell-gallery").unwrap();
        c.env_remove("STEMCELL_GALLERY_CONFIG")
            .env_remove("BOSH_PACKAGES_DIR")
            .env_remove("BOSH_JOBS_DIR")
            .args([
                "--arm-endpoint",
                &arm,
                "--blob-endpoint",
                &blob,
                "--auth",
                "emulator",
            ])
            .args([
                "--subscription",
                SUB,
                "--resource-group",
                RG,
                "--gallery",
                GALLERY,
            ])
            .arg("cpi")
            .write_stdin(request.to_string());
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout {stdout} stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout.lines().count(), 1, "one response line: {stdout}");
    serde_json::from_str(stdout.trim()).unwrap()
}

async fn versions(handle: &Handle) -> Vec<(String, String, Value)> {
    let raw = Raw::new(&handle.arm);
    let defs = raw.get(&format!("{}/images", gallery_path(GALLERY))).await;
    let mut out = Vec::new();
    for d in defs.body["value"].as_array().unwrap() {
        let name = d["name"].as_str().unwrap().to_string();
        let vs = raw
            .get(&format!("{}/images/{name}/versions", gallery_path(GALLERY)))
            .await;
        for v in vs.body["value"].as_array().unwrap() {
            out.push((
                name.clone(),
                v["name"].as_str().unwrap().to_string(),
                v["tags"].clone(),
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_env_then_director_upload_no_409() {
    let handle = start_default().await;
    let raw = Raw::new(&handle.arm);
    assert_eq!(
        raw.put(&gallery_path(GALLERY), json!({"location": LOC}))
            .await
            .status,
        201
    );
    let dir = tempfile::tempdir().unwrap();
    let (image, cloud) = unpack("gen1-x86_64.tgz", dir.path());
    let image = image.to_str().unwrap();

    // bosh create-env: no request_id, BOSH_PACKAGES_DIR set.
    let create_env = cpi(
        &handle,
        json!({"method": "create_stemcell", "arguments": [image, cloud],
               "context": {"director_uuid": "d-1"}, "api_version": 2}),
        &[(
            "BOSH_PACKAGES_DIR",
            "/home/ci/.bosh/installations/x/packages",
        )],
    )
    .await;
    assert_eq!(create_env["error"], Value::Null, "{create_env}");
    let cid1 = create_env["result"].as_str().unwrap().to_string();
    assert!(cid1.starts_with("bosh-stemcell-"), "{cid1}");
    let log = create_env["log"].as_str().unwrap();
    assert!(
        log.contains("create-env mode") && log.contains("request_id"),
        "{log}"
    );

    // The director uploads the same stemcell later.
    let director = cpi(
        &handle,
        json!({"method": "create_stemcell", "arguments": [image, cloud, {"tags": {}}],
               "context": {"director_uuid": "d-1", "request_id": "cpi-987654"}, "api_version": 2}),
        &[],
    )
    .await;
    assert_eq!(director["error"], Value::Null, "no 409: {director}");
    let cid2 = director["result"].as_str().unwrap().to_string();
    assert_ne!(cid1, cid2);
    let log = director["log"].as_str().unwrap();
    assert!(log.contains("director mode"), "{log}");
    // The director's version is new, made from the blob create-env uploaded: the log says so,
    // not that the definition already held the image.
    assert!(
        log.contains("reused the complete blob") && log.contains("created gallery version"),
        "{log}"
    );
    assert!(!log.contains("already holds this image"), "{log}");

    let vs = versions(&handle).await;
    assert_eq!(vs.len(), 2, "two versions: {vs:?}");
    assert_ne!(vs[0].0, vs[1].0, "in two definitions: {vs:?}");
    assert!(vs[1].0.ends_with("-create-env"), "{vs:?}");
    assert_eq!(vs[0].1, vs[1].1, "same version key");
    let refs = |t: &Value| {
        let map: std::collections::BTreeMap<String, String> =
            serde_json::from_value(t.clone()).unwrap();
        tags::references(&map)
    };
    assert_eq!(refs(&vs[0].2), vec![cid2.clone()]);
    assert_eq!(refs(&vs[1].2), vec![cid1.clone()]);

    // The director later deletes its stemcell: only its version goes.
    let del = cpi(
        &handle,
        json!({"method": "delete_stemcell", "arguments": [cid2],
               "context": {"request_id": "cpi-1"}}),
        &[],
    )
    .await;
    assert_eq!(del["error"], Value::Null, "{del}");
    let vs = versions(&handle).await;
    assert_eq!(vs.len(), 1, "{vs:?}");
    assert!(vs[0].0.ends_with("-create-env"));
}
