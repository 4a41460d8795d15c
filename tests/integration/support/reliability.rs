//! Shared helpers of the reliability suites (faults, crashes, concurrency): an emulator with the
//! gallery and the stemcell container, the binary pointed at it with short retry budgets and
//! timeouts, fault injection, and one check of "converged": exactly one Succeeded version carrying
//! every expected reference, made from a complete blob, with no partial upload left behind.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stemcell_gallery::azure::blob::{list_stemcell_blobs, StorageAuth, StorageTarget};
use stemcell_gallery::emulator::{self, Handle, Options};

#[path = "../emulator_support/mod.rs"]
mod emulator_support;
use stemcell_gallery::gallery::tags;
use stemcell_gallery::stemcell::testgen::{StemcellSpec, VhdSpec};

pub const SUB: &str = "11111111-2222-3333-4444-555555555555";
pub const RG: &str = "bosh-rg";
pub const GALLERY: &str = "reliability";
pub const LOC: &str = "westeurope";
pub const DEFINITION: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
pub const SHA_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
pub const ACCOUNT_ID: &str = "/subscriptions/11111111-2222-3333-4444-555555555555/resourceGroups/bosh-rg/providers/Microsoft.Storage/storageAccounts/bosh";

/// Knobs that keep fault runs short: small retry budgets, a 1 s request timeout, a 4 s bound on
/// long-running operations.
pub const FAST_ENV: [(&str, &str); 4] = [
    ("STEMCELL_GALLERY_ARM_RETRIES", "3"),
    ("STEMCELL_GALLERY_BLOB_RETRIES", "3"),
    ("STEMCELL_GALLERY_HTTP_TIMEOUT", "1"),
    ("STEMCELL_GALLERY_OPERATION_TIMEOUT", "4"),
];

pub async fn start() -> Handle {
    start_with(Options::default()).await
}

/// An emulator holding the tool's identity to the least-privilege role (as every tool-facing test
/// runs), with the gallery and the stemcell container.
pub async fn start_with(mut opts: Options) -> Handle {
    if opts.role.is_none() {
        opts.role = Some(stemcell_gallery::cli::embedded::least_privilege_role());
    }
    let h = emulator::start(opts).await.expect("the emulator starts");
    h.state.ensure_gallery(SUB, RG, GALLERY, LOC).unwrap();
    h.state.ensure_container("stemcell").unwrap();
    h
}

/// A small stemcell (`mib` MiB disk, a quarter data) with this version, in `dir`.
pub fn stemcell(dir: &Path, version: &str, seed: u64, mib: u64) -> (PathBuf, String) {
    let spec = StemcellSpec {
        version_yaml: format!("'{version}'"),
        vhd: VhdSpec {
            mib,
            data_fraction: 0.25,
            block: 64 * 1024,
            seed,
            ..VhdSpec::default()
        },
        level: 1,
        ..StemcellSpec::default()
    };
    let path = dir.join(format!("stemcell-{version}-{seed}.tgz"));
    let generated = spec.write_to(&path).expect("the stemcell is generated");
    (path, generated.image_sha256)
}

/// The binary pointed at the emulator, JSON output, fast knobs.
pub fn binary(h: &Handle) -> Command {
    let mut cmd = emulator_support::binary_against(h, GALLERY);
    for (k, v) in FAST_ENV {
        cmd.env(k, v);
    }
    cmd
}

pub fn seed_args(stemcell: &Path, reference: &str) -> Vec<String> {
    vec![
        "seed".into(),
        stemcell.display().to_string(),
        "--reference".into(),
        reference.into(),
    ]
}

pub fn ensure_args(version: &str, sha: &str, blob: &str, reference: &str) -> Vec<String> {
    [
        "ensure",
        "--blob-uri",
        &format!("https://bosh.blob.core.windows.net/stemcell/{blob}.vhd"),
        "--storage-account-id",
        ACCOUNT_ID,
        "--name",
        DEFINITION,
        "--version",
        version,
        "--sha256",
        sha,
        "--reference",
        reference,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// What one run printed.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub json: Value,
    pub stderr: String,
    pub seconds: f64,
}

impl Run {
    pub fn error(&self) -> String {
        self.json["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

pub fn run_output(out: Output, started: Instant) -> Run {
    Run {
        code: out.status.code().unwrap_or(-1),
        json: serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Run the binary to its end, off the runtime (which keeps serving the emulator).
pub async fn run(h: &Handle, args: &[String], env: &[(&str, &str)]) -> Run {
    let mut cmd = binary(h);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let started = Instant::now();
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("the binary runs"))
        .await
        .unwrap();
    run_output(out, started)
}

pub async fn admin(h: &Handle, method: &str, path: &str, body: Option<Value>) -> Value {
    let client = reqwest::Client::new();
    let mut req = client.request(
        reqwest::Method::from_bytes(method.as_bytes()).unwrap(),
        format!("{}{path}", h.arm),
    );
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("the emulator answers");
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    assert!(status.is_success(), "{method} {path}: {status} {text}");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

pub async fn add_fault(h: &Handle, fault: Value) {
    admin(h, "POST", "/_emulator/faults", Some(fault)).await;
}

pub async fn clear_faults(h: &Handle) {
    admin(h, "DELETE", "/_emulator/faults", None).await;
}

/// Faults that fired so far, `(method, path, phase)`.
pub async fn fired(h: &Handle) -> Vec<(String, String, String)> {
    let v = admin(h, "GET", "/_emulator/faults", None).await;
    v["fired"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|f| {
            (
                f["method"].as_str().unwrap_or_default().to_string(),
                f["path"].as_str().unwrap_or_default().to_string(),
                f["phase"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// Move the emulator's clock past every lease a killed process may have left (60 s at most).
pub async fn expire_leases(h: &Handle) {
    admin(
        h,
        "POST",
        "/_emulator/clock",
        Some(json!({"advance_secs": 61})),
    )
    .await;
}

fn versions_path(definition: &str) -> String {
    format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/galleries/{GALLERY}/images/{definition}/versions"
    )
}

async fn arm_get(h: &Handle, path: &str) -> (u16, Value) {
    let resp = reqwest::Client::new()
        .get(format!("{}{path}?api-version=2023-07-03", h.arm))
        .bearer_auth("test-token")
        .send()
        .await
        .expect("the emulator answers");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// Every version of the definition, as ARM lists them (empty when the definition is absent).
pub async fn versions(h: &Handle, definition: &str) -> Vec<Value> {
    let (status, body) = arm_get(h, &versions_path(definition)).await;
    if status == 404 {
        return Vec::new();
    }
    body["value"].as_array().cloned().unwrap_or_default()
}

pub fn state_of(v: &Value) -> String {
    v["properties"]["provisioningState"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

pub fn references_of(v: &Value) -> Vec<String> {
    let t: BTreeMap<String, String> = serde_json::from_value(v["tags"].clone()).unwrap_or_default();
    let mut refs = tags::references(&t);
    refs.sort();
    refs
}

pub fn storage(h: &Handle) -> StorageTarget {
    StorageTarget::new(
        &url::Url::parse(&h.blob).unwrap(),
        StorageAuth::DevelopmentKey,
    )
    .unwrap()
}

/// The state after a successful run: one Succeeded version with every reference in `refs`, whose
/// source blob (when it is in the emulator) is complete, and no partial upload left. Returns a
/// description of what is wrong, if anything.
pub async fn check_converged(h: &Handle, version: &str, refs: &[&str]) -> Result<(), String> {
    let all = versions(h, DEFINITION).await;
    let mine: Vec<&Value> = all.iter().filter(|v| v["name"] == version).collect();
    if all.len() != 1 || mine.len() != 1 {
        return Err(format!(
            "expected exactly one version {version}, found {:?}",
            all.iter().map(|v| &v["name"]).collect::<Vec<_>>()
        ));
    }
    let v = mine[0];
    if state_of(v) != "Succeeded" {
        return Err(format!("version {version} is {}", state_of(v)));
    }
    let have = references_of(v);
    for r in refs {
        if !have.iter().any(|x| x == r) {
            return Err(format!("reference {r} lost: the version has {have:?}"));
        }
    }
    check_blobs(h, v).await
}

/// No partial (uploading) stemcell blob is left, and a source blob in the emulator is complete.
pub async fn check_blobs(h: &Handle, v: &Value) -> Result<(), String> {
    let blobs = list_stemcell_blobs(&storage(h).container("stemcell"))
        .await
        .map_err(|e| format!("list blobs: {e}"))?;
    if let Some(partial) = blobs.iter().find(|b| !b.is_complete()) {
        return Err(format!("a partial blob is left: {}", partial.name));
    }
    let source = v["properties"]["storageProfile"]["osDiskImage"]["source"]["uri"]
        .as_str()
        .unwrap_or_default();
    if source.starts_with(&h.blob) {
        let name = source.rsplit('/').next().unwrap_or_default();
        if !blobs.iter().any(|b| b.name == name && b.is_complete()) {
            return Err(format!("the version's source blob {name} is not complete"));
        }
        if blobs.len() != 1 {
            return Err(format!(
                "stray stemcell blobs besides the source: {:?}",
                blobs.iter().map(|b| &b.name).collect::<Vec<_>>()
            ));
        }
    }
    Ok(())
}

/// Wait until `cond` holds, polling every 10 ms, up to `limit`.
pub async fn wait_until<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while started.elapsed() < limit {
        if cond().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}
