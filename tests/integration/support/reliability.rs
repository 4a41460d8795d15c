//! Shared helpers of the reliability suites (faults, crashes, concurrency): an emulator with the
//! gallery and the stemcell container, the binary pointed at it with short retry budgets and
//! timeouts, fault injection, and one check of "converged": exactly one Succeeded version carrying
//! every expected reference, made from a complete blob, with no partial upload left behind.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stemcell_gallery::azure::blob::{list_stemcell_blobs, StorageAuth, StorageTarget};
use stemcell_gallery::emulator::{self, Handle, Options};
use stemcell_gallery::gallery::tags;

use super::emulated::{self, gallery_path, Raw};
pub use super::stemcells::stemcell;
pub use super::{DEFINITION, LOC, RG, SUB};

pub const GALLERY: &str = "reliability";
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
        opts.role = Some(emulated::least_privilege());
    }
    let h = emulator::start(opts).await.expect("the emulator starts");
    h.state.ensure_gallery(SUB, RG, GALLERY, LOC).unwrap();
    h.state.ensure_container("stemcell").unwrap();
    h
}

/// The binary pointed at the emulator, JSON output, fast knobs.
pub fn binary(h: &Handle) -> Command {
    let mut cmd = emulated::binary_against(h, GALLERY);
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

/// An admin request (`/_emulator/...`) that must succeed: its JSON answer.
pub async fn admin(h: &Handle, method: &str, path: &str, body: Option<Value>) -> Value {
    let resp = emulated::admin(h, method, path, body).await;
    assert!(
        (200..300).contains(&resp.status),
        "{method} {path}: {} {}",
        resp.status,
        resp.text
    );
    resp.body
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

/// Every version of the definition, as ARM lists them (empty when the definition is absent).
pub async fn versions(h: &Handle, definition: &str) -> Vec<Value> {
    let path = format!("{}/images/{definition}/versions", gallery_path(GALLERY));
    let resp = Raw::new(&h.arm).get(&path).await;
    if resp.status == 404 {
        return Vec::new();
    }
    resp.body["value"].as_array().cloned().unwrap_or_default()
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

/// The lock of version 1.506.0 of the reliability gallery's definition (the writers' name: the
/// gallery by its full identity, `gallery::lock::version_lock_name`).
pub const LOCK: &str = "galleries/11111111-2222-3333-4444-555555555555/bosh-rg/reliability/bosh-azure-hyperv-ubuntu-jammy-go_agent/1.506.0.lock";

/// The lock the previous release takes for the same version (`locks/<gallery>/…`), which this
/// release takes too while it holds [`LOCK`].
pub const LEGACY_LOCK: &str =
    "locks/reliability/bosh-azure-hyperv-ubuntu-jammy-go_agent/1.506.0.lock";

/// Create the version with one reference (fast writes), then hold its lock from the test.
pub async fn version_with_lock_held(h: &Handle) -> stemcell_gallery::azure::lock::LeaseGuard {
    let first = run(
        h,
        &ensure_args("1.506.0", SHA_A, "bosh-stemcell-first", "r-first"),
        &[("STEMCELL_GALLERY_OPERATION_TIMEOUT", "60")],
    )
    .await;
    assert_eq!(first.code, 0, "{}", first.stderr);
    stemcell_gallery::azure::lock::LeaseLock::acquire(
        &storage(h).container("stemcell"),
        LOCK,
        Duration::from_secs(5),
    )
    .await
    .expect("the test takes the version's lock")
}
