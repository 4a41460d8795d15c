//! The emulator world: an emulator started on port 0 (the tool's least-privilege role, the
//! suite's timing), the SDK clients and a raw HTTP client pointed at it, ARM bodies, admin calls,
//! and the binary pointed at it.

use serde_json::Value;
pub use stemcell_gallery::azure::blob::{Container, RetrySettings, StorageAuth, StorageTarget};

pub use super::blobsdk::{code_of, BlobExt, ContainerExt};
use stemcell_gallery::emulator::{self, Handle, Options};

use super::binary;
pub use super::stemcells::fixed_vhd_footer;
pub use super::{LOC, RG, SUB};

/// Start an emulator that holds the tool's identity (the development token and key) to the
/// least-privilege role in deploy/azure, as every tool-facing test runs; other bearer tokens
/// (the `Raw` helper's) act as the subscription's Owner for test setup.
pub async fn start(mut opts: Options) -> Handle {
    if opts.role.is_none() {
        opts.role = Some(least_privilege());
    }
    start_unrestricted(opts).await
}

/// Start an emulator without a role: for tests of the emulator itself that drive it through the
/// SDK clients below (which authenticate with the tool's development token) as the Owner would.
pub async fn start_unrestricted(mut opts: Options) -> Handle {
    if opts.timing == emulator::Timing::instant() {
        opts.timing = test_timing();
    }
    emulator::start(opts).await.expect("the emulator starts")
}

/// The suite's timing: `STEMCELL_GALLERY_TEST_TIMING=azure:N` runs it under Azure's recorded
/// durations divided by N (scripts/test.sh runs the gallery, CPI and cleanup scenarios a second
/// time so); unset, the instant default.
pub fn test_timing() -> emulator::Timing {
    match std::env::var("STEMCELL_GALLERY_TEST_TIMING") {
        Ok(v) if !v.trim().is_empty() => {
            let (profile, scale) = v.split_once(':').unwrap_or((v.as_str(), "1"));
            let profile: emulator::TimingProfile = profile
                .parse()
                .expect("STEMCELL_GALLERY_TEST_TIMING=azure:N");
            let scale: f64 = scale
                .parse()
                .expect("STEMCELL_GALLERY_TEST_TIMING=azure:N with a number N");
            emulator::Timing::of(profile, scale).expect("a valid test timing")
        }
        _ => emulator::Timing::instant(),
    }
}

/// Whether the suite runs under a timing profile (see [`test_timing`]).
pub fn timed_run() -> bool {
    test_timing() != emulator::Timing::instant()
}

/// The least-privilege role shipped in deploy/azure/role-definition.json.
pub fn least_privilege() -> emulator::Role {
    stemcell_gallery::cli::embedded::least_privilege_role()
}

pub async fn start_default() -> Handle {
    start(Options::default()).await
}

/// Raw HTTP to the emulator's ARM endpoint with the tool's own development token (as the
/// tool's identity; the [`Raw`] default token acts as the subscription's Owner).
pub fn arm(handle: &Handle) -> Raw {
    Raw {
        token: stemcell_gallery::config::EMULATOR_TOKEN.to_string(),
        ..Raw::new(&handle.arm)
    }
}

/// The project's blob clients (azure_storage_blob 1.x through `StorageTarget`) with the
/// development account and key, without retries (each test sees every answer).
pub fn blobs(handle: &Handle) -> StorageTarget {
    blobs_with(handle, StorageAuth::DevelopmentKey)
}

pub fn blobs_with(handle: &Handle, auth: StorageAuth) -> StorageTarget {
    StorageTarget::with_retry(
        &url::Url::parse(&handle.blob).expect("the emulator's blob endpoint parses"),
        auth,
        RetrySettings {
            max_retries: 0,
            ..RetrySettings::default()
        },
    )
    .expect("the blob clients build")
}

pub fn gallery_path(gallery: &str) -> String {
    format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/galleries/{gallery}"
    )
}

/// A raw HTTP client (status, headers, error bodies), with the bearer token it sends.
pub struct Raw {
    pub base: String,
    pub http: reqwest::Client,
    pub token: String,
}

pub struct RawResponse {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub text: String,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    }
    pub fn code(&self) -> String {
        self.body["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_string()
    }
}

impl Raw {
    pub fn new(base: &str) -> Raw {
        Raw {
            base: base.to_string(),
            http: reqwest::Client::new(),
            token: "test-token".to_string(),
        }
    }

    pub async fn send(
        &self,
        method: &str,
        path_and_query: &str,
        body: Option<Value>,
        token: bool,
    ) -> RawResponse {
        let url = if path_and_query.starts_with("http") {
            path_and_query.to_string()
        } else {
            format!("{}{}", self.base, path_and_query)
        };
        let mut req = self
            .http
            .request(reqwest::Method::from_bytes(method.as_bytes()).unwrap(), url);
        if token {
            req = req.bearer_auth(&self.token);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("the emulator answers");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        RawResponse {
            status,
            headers,
            body,
            text,
        }
    }

    /// A VM `name` in `SUB`/`RG` created from `image_id` (its `imageReference.id`): its id, and
    /// the answer to its PUT.
    pub async fn put_vm(&self, name: &str, image_id: &str) -> (String, RawResponse) {
        let vm = format!(
            "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/{name}"
        );
        let put = self
            .send(
                "PUT",
                &format!("{vm}?api-version=2024-07-01"),
                Some(serde_json::json!({"location": LOC, "properties": {"storageProfile": {"imageReference": {"id": image_id}}}})),
                true,
            )
            .await;
        (vm, put)
    }

    pub async fn put(&self, path: &str, body: Value) -> RawResponse {
        self.send("PUT", &with_api(path), Some(body), true).await
    }
    pub async fn get(&self, path: &str) -> RawResponse {
        self.send("GET", &with_api(path), None, true).await
    }
    pub async fn patch(&self, path: &str, body: Value) -> RawResponse {
        self.send("PATCH", &with_api(path), Some(body), true).await
    }
    pub async fn delete(&self, path: &str) -> RawResponse {
        self.send("DELETE", &with_api(path), None, true).await
    }

    /// Every item of a list, following each page's absolute `nextLink` (each page must be a
    /// 200); also the number of pages.
    pub async fn list_all(&self, path_and_query: &str) -> (Vec<Value>, usize) {
        let mut items = Vec::new();
        let mut pages = 0;
        let mut url = path_and_query.to_string();
        loop {
            let page = self.send("GET", &url, None, true).await;
            assert_eq!(page.status, 200, "{url}: {}", page.text);
            pages += 1;
            items.extend(page.body["value"].as_array().expect("a list page").clone());
            match page.body["nextLink"].as_str() {
                Some(next) if !next.is_empty() => url = next.to_string(),
                _ => return (items, pages),
            }
        }
    }
}

pub fn with_api(path: &str) -> String {
    if path.contains("api-version=") || path.starts_with("/_emulator") {
        path.to_string()
    } else if path.contains('?') {
        format!("{path}&api-version=2023-07-03")
    } else {
        format!("{path}?api-version=2023-07-03")
    }
}

/// Gallery + definition through raw PUTs, each followed until it settles (one poll under the
/// instant timing).
pub async fn gallery_and_definition(raw: &Raw, gallery: &str, image: &str) {
    let g = gallery_path(gallery);
    assert_eq!(
        raw.put(&g, serde_json::json!({"location": LOC}))
            .await
            .status,
        201
    );
    until_settled(raw, &g).await;
    assert_eq!(
        raw.get(&g).await.body["properties"]["provisioningState"],
        "Succeeded"
    );
    let (i, r) = put_definition(raw, gallery, image).await;
    assert_eq!(r.status, 201, "{}", r.text);
    until_settled(raw, &i).await;
    assert_eq!(
        raw.get(&i).await.body["properties"]["provisioningState"],
        "Succeeded"
    );
}

/// A version from the VHD at `uri`, its `storageAccountId` naming the uri's account (Azure
/// checks they match): `https://ACCOUNT.blob...` host-style, the path's first segment for the
/// emulator's path-style URLs (`devstoreaccount1`, which the emulator keeps in resource group
/// `RG` unless told otherwise).
pub fn version_body(uri: &str) -> Value {
    let url = url::Url::parse(uri).expect("a blob URL");
    let host = url.host_str().unwrap_or_default();
    let account = match host.split_once(".blob.") {
        Some((account, _)) => account.to_string(),
        None => url
            .path_segments()
            .and_then(|mut s| s.next().map(String::from))
            .unwrap_or_default(),
    };
    serde_json::json!({
        "location": LOC,
        "tags": {"image_sha256": "abc"},
        "properties": {
            "publishingProfile": {"replicaCount": 1, "targetRegions": [{"name": LOC}]},
            "storageProfile": {"osDiskImage": {"source": {
                "uri": uri,
                "storageAccountId": format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Storage/storageAccounts/{account}")
            }}}
        }
    })
}

/// Poll until the resource is no longer Creating/Updating/Deleting: at once under the instant
/// timing, after the operation's duration under `STEMCELL_GALLERY_TEST_TIMING=azure:N`.
pub async fn until_settled(raw: &Raw, path: &str) {
    let started = std::time::Instant::now();
    loop {
        let b = raw.get(path).await.body;
        let st = b["properties"]["provisioningState"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if !matches!(st.as_str(), "Creating" | "Updating" | "Deleting") {
            return;
        }
        assert!(started.elapsed().as_secs() < 120, "{path} settles");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Block the deletion of the version at `path` until `eol` (RFC 3339), as another tool (az CLI
/// `--block-deletion-before-end-of-life`, or any create at api 2026-03-03) would: a PATCH at
/// api 2024-03-03, settled.
pub async fn block_deletion(raw: &Raw, path: &str, eol: &str) {
    let patched = raw
        .send(
            "PATCH",
            &format!("{path}?api-version=2024-03-03"),
            Some(serde_json::json!({"properties": {
                "publishingProfile": {"endOfLifeDate": eol},
                "safetyProfile": {"blockDeletionBeforeEndOfLife": true},
                "storageProfile": {}}})),
            true,
        )
        .await;
    assert_eq!(patched.status, 200, "{}", patched.text);
    until_settled(raw, path).await;
}

/// Admin requests (never logged).
pub async fn admin(handle: &Handle, method: &str, path: &str, body: Option<Value>) -> RawResponse {
    Raw::new(&handle.arm).send(method, path, body, false).await
}

/// A definition (gen1, x64, publisher bosh) in an existing gallery, completed by one poll.
pub async fn gallery_and_definition_in(raw: &Raw, gallery: &str, image: &str) {
    let (i, r) = put_definition(raw, gallery, image).await;
    assert!(r.status == 201 || r.status == 200, "{}", r.text);
    let _ = raw.get(&i).await;
}

/// PUT a gen1 x64 definition (publisher bosh, offer = the definition's name): its path and the
/// answer.
async fn put_definition(raw: &Raw, gallery: &str, image: &str) -> (String, RawResponse) {
    let i = format!("{}/images/{image}", gallery_path(gallery));
    let r = raw
        .put(
            &i,
            serde_json::json!({"location": LOC, "properties": {
            "osType": "Linux", "osState": "Generalized", "hyperVGeneration": "V1",
            "identifier": {"publisher": "bosh", "offer": image, "sku": "gen1"}}}),
        )
        .await;
    (i, r)
}

/// The binary pointed at `handle` for `gallery`, JSON output, with the emulator's credentials.
/// Callers add the command, its flags and any environment.
pub fn binary_against(handle: &Handle, gallery: &str) -> std::process::Command {
    let mut cmd = binary::command();
    cmd.args(binary::global_args(&handle.arm, &handle.blob, gallery));
    cmd
}

/// Run `stemcell-gallery [GLOBAL] cpi [CPI_ARGS]` against these endpoints for gallery `gallery`
/// with `request` on stdin and `env` set, nothing from the caller's environment pointing it
/// elsewhere: its exit code (a delegate's is relayed) and its one response line.
pub async fn run_cpi(
    arm: &str,
    blob: &str,
    gallery: &str,
    global: &[&str],
    cpi_args: &[&str],
    request: String,
    env: &[(&str, &str)],
) -> (Option<i32>, Value) {
    let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (global, cpi_args) = (own(global), own(cpi_args));
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let (arm, blob, gallery) = (arm.to_string(), blob.to_string(), gallery.to_string());
    let out = tokio::task::spawn_blocking(move || {
        let mut c = binary::command();
        c.args(["--arm-endpoint", &arm, "--blob-endpoint", &blob])
            .args(["--auth", "emulator", "--subscription", SUB])
            .args(["--resource-group", RG, "--gallery", &gallery])
            .args(&global)
            .arg("cpi")
            .args(&cpi_args)
            .envs(env)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().expect("the binary starts");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin is piped");
            let _ = stdin.write_all(request.as_bytes());
        }
        child.wait_with_output().expect("the binary finishes")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.lines().count(),
        1,
        "one response line: {stdout} stderr {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        out.status.code(),
        serde_json::from_str(stdout.trim()).unwrap(),
    )
}

/// A page blob holding an empty fixed VHD of `mib` MiB (`mib` MiB of zeros, then the footer):
/// what a gallery version's source must be (Azure refuses other blobs with `InvalidVhd`).
pub async fn put_fixed_vhd(container: &Container, name: &str, mib: u64) {
    let size = (mib << 20) + 512;
    let blob = container.blob_client(name);
    blob.put_page_blob(size, &[])
        .await
        .expect("page blob created");
    blob.put_page(size - 512, size - 1, fixed_vhd_footer())
        .await
        .expect("footer written");
}

/// Turn soft delete on or off on gallery `gallery` (REC: a PATCH of
/// `properties.softDeletePolicy.isSoftDeleteEnabled`, answered 200).
pub async fn set_soft_delete(raw: &Raw, gallery: &str, on: bool) {
    let r = raw
        .patch(
            &gallery_path(gallery),
            serde_json::json!({"properties": {"softDeletePolicy": {"isSoftDeleteEnabled": on}}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
}
