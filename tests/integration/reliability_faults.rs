//! The fault matrix (issue #9): every kind of request `seed`, `ensure`, `lookup` and `cleanup`
//! make, under every kind of fault the emulator can inject, with the outcome asserted:
//! - a transient fault (429 with Retry-After, 500, 503, a dropped connection, a response lost
//!   after the request took effect, a response slower than the client's timeout, a 401 whose token
//!   must be refreshed, a 409 "operation in progress") is absorbed: exit 0 and the converged state
//!   (one Succeeded version with every reference, a complete source blob, no partial upload);
//! - a persistent fault, a long-running operation that ends Failed or never ends, gives a clear
//!   error with exit 1 (5 for cleanup's evidence), nothing duplicated, and a re-run without the
//!   fault converges.
//!
//! Run with `--nocapture` to print the table (request kind × fault → outcome).

use crate::support::reliability;

use std::time::Duration;

use reliability::*;
use serde_json::{json, Value};
use stemcell_gallery::azure::blob::list_stemcell_blobs;
use stemcell_gallery::emulator::Handle;

/// Which command a cell runs, from which starting state.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Scenario {
    /// `seed --reference r1` into an empty gallery.
    SeedFresh,
    /// `seed --reference r2` of a stemcell already published with r1 (tags-only update).
    SeedAddReference,
    /// `ensure --reference r1` over a version left Failed (delete, then create).
    EnsureOverFailed,
    /// `lookup` of a published version.
    Lookup,
    /// `cleanup` (dry run) with a published version.
    Cleanup,
}

struct Kind {
    name: &'static str,
    scenario: Scenario,
    selector: Value,
    /// An ARM write that starts a long-running operation (409 / LRO faults apply).
    lro: bool,
}

fn kinds() -> Vec<Kind> {
    let k = |name, scenario, selector, lro| Kind {
        name,
        scenario,
        selector,
        lro,
    };
    let def = format!("*/images/{DEFINITION}");
    vec![
        k(
            "ARM GET version",
            Scenario::SeedFresh,
            json!({"method": "GET", "path": "*/versions/1.506.0"}),
            false,
        ),
        k(
            "ARM GET definition",
            Scenario::SeedFresh,
            json!({"method": "GET", "path": def}),
            false,
        ),
        k(
            "ARM PUT definition",
            Scenario::SeedFresh,
            json!({"method": "PUT", "path": def}),
            true,
        ),
        k(
            "ARM PUT version",
            Scenario::SeedFresh,
            json!({"method": "PUT", "path": "*/versions/1.506.0"}),
            true,
        ),
        k(
            "ARM GET operation (LRO poll)",
            Scenario::SeedFresh,
            json!({"method": "GET", "path": "*/operations/*"}),
            false,
        ),
        k(
            "ARM PATCH version (tag update)",
            Scenario::SeedAddReference,
            json!({"method": "PATCH", "path": "*/versions/1.506.0"}),
            true,
        ),
        k(
            "ARM DELETE version (replace Failed)",
            Scenario::EnsureOverFailed,
            json!({"method": "DELETE", "path": "*/versions/1.506.0"}),
            true,
        ),
        k(
            "ARM GET version (lookup)",
            Scenario::Lookup,
            json!({"method": "GET", "path": "*/versions/1.506.0"}),
            false,
        ),
        k(
            "ARM list VMs (cleanup)",
            Scenario::Cleanup,
            json!({"method": "GET", "path": "*/virtualMachines"}),
            false,
        ),
        k(
            "ARM list VMSS (cleanup)",
            Scenario::Cleanup,
            json!({"method": "GET", "path": "*/virtualMachineScaleSets"}),
            false,
        ),
        k(
            "ARM list disks (cleanup)",
            Scenario::Cleanup,
            json!({"method": "GET", "path": "*/disks"}),
            false,
        ),
        k(
            "ARM list versions (cleanup)",
            Scenario::Cleanup,
            json!({"method": "GET", "path": "*/versions"}),
            false,
        ),
        k(
            "blob create container",
            Scenario::SeedFresh,
            json!({"method": "PUT", "path": "/devstoreaccount1/stemcell", "query": "restype=container"}),
            false,
        ),
        k(
            "blob lease (lock blob)",
            Scenario::SeedFresh,
            json!({"method": "PUT", "path": "*.lock", "query": "comp=lease"}),
            false,
        ),
        k(
            "blob list",
            Scenario::SeedFresh,
            json!({"method": "GET", "path": "/devstoreaccount1/stemcell", "query": "comp=list"}),
            false,
        ),
        k(
            "blob put blob (create page blob)",
            Scenario::SeedFresh,
            json!({"method": "PUT", "path": "*/bosh-stemcell-*.vhd"}),
            false,
        ),
        k(
            "blob get properties",
            Scenario::SeedFresh,
            json!({"method": "HEAD", "path": "*/bosh-stemcell-*.vhd"}),
            false,
        ),
        k(
            "blob put page",
            Scenario::SeedFresh,
            json!({"method": "PUT", "path": "*/bosh-stemcell-*.vhd", "query": "comp=page"}),
            false,
        ),
        k(
            "blob set metadata",
            Scenario::SeedFresh,
            json!({"method": "PUT", "path": "*/bosh-stemcell-*.vhd", "query": "comp=metadata"}),
            false,
        ),
    ]
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    /// Absorbed: exit 0, converged.
    Success,
    /// A clear error with this exit code; a re-run without the fault converges.
    Error(i32),
}

struct FaultKind {
    name: &'static str,
    fault: Value,
    /// Only for ARM writes that start a long-running operation.
    lro_only: bool,
}

fn faults() -> Vec<FaultKind> {
    let f = |name, fault, lro_only| FaultKind {
        name,
        fault,
        lro_only,
    };
    vec![
        f(
            "429 + Retry-After: 1",
            json!({"status": 429, "retry_after": 1}),
            false,
        ),
        f("500", json!({"status": 500}), false),
        f("503", json!({"status": 503}), false),
        f("dropped connection", json!({"drop": true}), false),
        f(
            "response lost after the request took effect",
            json!({"hold_after": true, "drop": true}),
            false,
        ),
        f(
            "response slower than the 1 s timeout",
            json!({"delay_ms": 2500}),
            false,
        ),
        f(
            "401 (token refreshed, retried)",
            json!({"status": 401, "code": "ExpiredAuthenticationToken", "message": "The access token expired."}),
            false,
        ),
        f(
            "503 persisting past the retry budget",
            json!({"status": 503, "count": 50}),
            false,
        ),
        f(
            "409 OperationNotAllowed (operation in progress)",
            json!({"status": 409, "code": "OperationNotAllowed", "message": "Operation 'Update' is not allowed since another operation is in progress. Retry after the operation completes."}),
            true,
        ),
        f(
            "LRO ends Failed",
            json!({"operation": "failed", "code": "InternalExecutionError", "message": "Replication failed in westeurope."}),
            true,
        ),
        f("LRO never ends", json!({"operation": "never"}), true),
    ]
}

fn expected(kind: &Kind, fault: &FaultKind) -> Expect {
    let persistent = fault.name.contains("persisting")
        || fault.name.starts_with("LRO ends")
        || fault.name.starts_with("LRO never");
    if !persistent {
        return Expect::Success;
    }
    if kind.scenario == Scenario::Cleanup && !kind.name.contains("versions") {
        // An evidence source that cannot be read: nothing deleted, exit 5. (The inventory itself,
        // the versions list, is not evidence: failing to read it is a plain error, exit 1.)
        return Expect::Error(5);
    }
    Expect::Error(1)
}

struct Cell {
    kind: &'static str,
    fault: &'static str,
    outcome: String,
    problem: Option<String>,
}

const R1: &str = "bosh-stemcell-r1";
const R2: &str = "bosh-stemcell-r2";

/// Bring the emulator to the scenario's starting state (no faults active afterwards).
async fn setup(h: &Handle, scenario: Scenario, stemcell: &[String], sha: &str) {
    match scenario {
        Scenario::SeedFresh => {}
        Scenario::SeedAddReference | Scenario::Lookup | Scenario::Cleanup => {
            let mut args = stemcell.to_vec();
            args.push("--reference".into());
            args.push(R1.into());
            let r = run(h, &args, &[]).await;
            assert_eq!(r.code, 0, "setup seed: {}", r.stderr);
        }
        Scenario::EnsureOverFailed => {
            // A create that ends Failed, whose clean-up delete is refused: a Failed version stays.
            add_fault(
                h,
                json!({"method": "PUT", "path": "*/versions/1.506.0", "operation": "failed"}),
            )
            .await;
            add_fault(h, json!({"method": "DELETE", "path": "*/versions/1.506.0", "status": 400, "count": 5})).await;
            let r = run(h, &ensure_args("1.506", sha, "setup", R1), &[]).await;
            assert_eq!(r.code, 1, "setup ensure: {}", r.stderr);
            clear_faults(h).await;
            let v = versions(h, DEFINITION).await;
            assert_eq!(v.len(), 1);
            assert_eq!(state_of(&v[0]), "Failed");
        }
    }
}

fn command(scenario: Scenario, stemcell: &[String], sha: &str) -> (Vec<String>, Vec<&'static str>) {
    let with_ref = |r: &str| {
        let mut a = stemcell.to_vec();
        a.push("--reference".into());
        a.push(r.into());
        a
    };
    match scenario {
        Scenario::SeedFresh => (with_ref(R1), vec![R1]),
        Scenario::SeedAddReference => (with_ref(R2), vec![R1, R2]),
        Scenario::EnsureOverFailed => (ensure_args("1.506", sha, "b1", R1), vec![R1]),
        Scenario::Lookup => (
            ["lookup", "--name", DEFINITION, "--version", "1.506"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            vec![R1],
        ),
        Scenario::Cleanup => (vec!["cleanup".to_string()], vec![R1]),
    }
}

async fn run_cell(kind: &Kind, fault: &FaultKind, stemcell: &[String], sha: &str) -> Cell {
    let h = start().await;
    setup(&h, kind.scenario, stemcell, sha).await;
    let mut f = kind.selector.clone();
    for (k, v) in fault.fault.as_object().unwrap() {
        f[k] = v.clone();
    }
    f["name"] = json!(fault.name);
    add_fault(&h, f).await;
    let (args, refs) = command(kind.scenario, stemcell, sha);
    let first = run(&h, &args, &[]).await;
    let fired = fired(&h).await.len();
    let expect = expected(kind, fault);
    let mut problem = None;
    let outcome = match first.code {
        0 => format!("exit 0 ({:.1} s)", first.seconds),
        c => format!(
            "exit {c} ({:.1} s): {}",
            first.seconds,
            shorten(&first.error())
        ),
    };
    if fired == 0 {
        problem = Some("the fault never fired: this request kind was not made".to_string());
    }
    match expect {
        Expect::Success => {
            if first.code != 0 {
                problem = Some(format!("expected success, got {outcome}\n{}", first.stderr));
            } else if let Err(e) = converged(&h, kind.scenario, &refs).await {
                problem = Some(format!("exit 0 but not converged: {e}"));
            }
        }
        Expect::Error(code) => {
            let msg = first.error();
            if first.code != code {
                problem = Some(format!(
                    "expected exit {code}, got {outcome}\n{}",
                    first.stderr
                ));
            } else if msg.len() < 20 {
                problem = Some(format!("the error says too little: {msg:?}"));
            }
            if fault.name.starts_with("LRO ends") && !msg.contains("InternalExecutionError") {
                problem = Some(format!("the error does not carry Azure's: {msg}"));
            }
            if fault.name.starts_with("LRO never") && !msg.contains("did not finish within") {
                problem = Some(format!("the error does not say it timed out: {msg}"));
            }
            let dup = versions(&h, DEFINITION).await;
            if dup.len() > 1 {
                problem = Some(format!("duplicate versions: {dup:?}"));
            }
        }
    }
    // Whatever happened, a re-run without the fault converges (leases of the failed run expired).
    clear_faults(&h).await;
    expire_leases(&h).await;
    let again = run(&h, &args, &[]).await;
    let ok_code = 0;
    if again.code != ok_code {
        problem.get_or_insert(format!(
            "the re-run without faults failed with exit {}: {}",
            again.code, again.stderr
        ));
    } else if let Err(e) = converged(&h, kind.scenario, &refs).await {
        problem.get_or_insert(format!("the re-run did not converge: {e}"));
    }
    Cell {
        kind: kind.name,
        fault: fault.name,
        outcome: match (&problem, expect) {
            (None, Expect::Success) => format!("absorbed, {outcome}"),
            (None, Expect::Error(_)) => format!("clear error, {outcome}; re-run converges"),
            (Some(_), _) => format!("FAILED: {outcome}"),
        },
        problem,
    }
}

async fn converged(h: &Handle, scenario: Scenario, refs: &[&str]) -> Result<(), String> {
    check_converged(h, "1.506.0", refs).await?;
    if scenario == Scenario::Cleanup {
        // A dry run deletes nothing.
        return Ok(());
    }
    Ok(())
}

fn shorten(s: &str) -> String {
    let s = s.replace('\n', " ");
    let s = s.replace(
        &format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/galleries/{GALLERY}"),
        "…",
    );
    if s.len() > 160 {
        format!(
            "{}…",
            &s[..s.char_indices().nth(160).map(|(i, _)| i).unwrap_or(s.len())]
        )
    } else {
        s
    }
}

async fn matrix(filter: impl Fn(&Kind) -> bool) {
    let dir = tempfile::tempdir().unwrap();
    let (path, sha) = stemcell(dir.path(), "1.506", 7, 4);
    let stemcell_args = vec!["seed".to_string(), path.display().to_string()];
    let mut cells = Vec::new();
    for kind in kinds().iter().filter(|k| filter(k)) {
        for fault in faults() {
            if fault.lro_only && !kind.lro {
                continue;
            }
            cells.push(run_cell(kind, &fault, &stemcell_args, &sha).await);
        }
    }
    let mut failures = Vec::new();
    for c in &cells {
        println!("| {} | {} | {} |", c.kind, c.fault, c.outcome);
        if let Some(p) = &c.problem {
            failures.push(format!("{} × {}: {p}", c.kind, c.fault));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cells failed:\n{}",
        failures.len(),
        cells.len(),
        failures.join("\n\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arm_gallery_requests_under_every_fault() {
    matrix(|k| {
        k.name.starts_with("ARM") && !k.name.contains("cleanup") && !k.name.contains("lookup")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blob_requests_under_every_fault() {
    matrix(|k| k.name.starts_with("blob")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_and_cleanup_reads_under_every_fault() {
    matrix(|k| k.name.contains("cleanup") || k.name.contains("lookup")).await;
}

/// The emulator's operation faults, directly: a PUT whose operation ends Failed leaves the version
/// Failed and the operation carries the error; one that never ends stays InProgress until the
/// faults are cleared; `skip` lets the first matches through; `fired` reports arrivals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emulator_operation_faults_fail_or_hang_the_operation() {
    let h = start().await;
    let raw = reqwest::Client::new();
    let gallery = format!(
        "{}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/galleries/{GALLERY}",
        h.arm
    );
    let def = format!("{gallery}/images/d1");
    let put = |url: String, body: Value| {
        let raw = raw.clone();
        async move {
            raw.put(format!("{url}?api-version=2023-07-03"))
                .bearer_auth("t")
                .json(&body)
                .send()
                .await
                .unwrap()
        }
    };
    let get = |url: String| {
        let raw = raw.clone();
        async move {
            let sep = if url.contains('?') { '&' } else { '?' };
            raw.get(format!("{url}{sep}api-version=2023-07-03"))
                .bearer_auth("t")
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let r = put(
        def.clone(),
        json!({"location": LOC, "properties": {"osType": "Linux", "osState": "Generalized",
            "hyperVGeneration": "V1", "identifier": {"publisher": "bosh", "offer": "d1", "sku": "gen1"}}}),
    )
    .await;
    assert_eq!(r.status(), 201);
    get(def.clone()).await;
    let body = |uri: &str| {
        json!({"location": LOC, "tags": {"image_sha256": "abc"}, "properties": {
            "publishingProfile": {"targetRegions": [{"name": LOC}]},
            "storageProfile": {"osDiskImage": {"source": {"uri": uri, "storageAccountId": ACCOUNT_ID}}}}})
    };
    // skip 1: the first version PUT is untouched, the second one's operation fails.
    add_fault(&h, json!({"method": "PUT", "path": "*/versions/*", "skip": 1, "operation": "failed", "code": "QuotaExceeded", "message": "No quota."})).await;
    let v1 = format!("{def}/versions/1.0.0");
    let r = put(
        v1.clone(),
        body("https://bosh.blob.core.windows.net/s/a.vhd"),
    )
    .await;
    assert_eq!(r.status(), 201);
    assert_eq!(
        get(v1.clone()).await["properties"]["provisioningState"],
        "Succeeded"
    );
    assert!(fired(&h).await.is_empty(), "skipped matches do not fire");
    let v2 = format!("{def}/versions/2.0.0");
    let r = put(
        v2.clone(),
        body("https://bosh.blob.core.windows.net/s/b.vhd"),
    )
    .await;
    let op = r.headers()["azure-asyncoperation"]
        .to_str()
        .unwrap()
        .to_string();
    let status = get(op.clone()).await;
    assert_eq!(status["status"], "Failed");
    assert_eq!(status["error"]["code"], "QuotaExceeded");
    assert_eq!(
        get(v2.clone()).await["properties"]["provisioningState"],
        "Failed"
    );
    assert_eq!(fired(&h).await.len(), 1);

    // never: InProgress however often it is polled, until the faults are cleared.
    add_fault(
        &h,
        json!({"method": "PUT", "path": "*/versions/*", "operation": "never"}),
    )
    .await;
    let v3 = format!("{def}/versions/3.0.0");
    let r = put(
        v3.clone(),
        body("https://bosh.blob.core.windows.net/s/c.vhd"),
    )
    .await;
    let op = r.headers()["azure-asyncoperation"]
        .to_str()
        .unwrap()
        .to_string();
    for _ in 0..5 {
        assert_eq!(get(op.clone()).await["status"], "InProgress");
    }
    assert_eq!(
        get(v3.clone()).await["properties"]["provisioningState"],
        "Creating"
    );
    clear_faults(&h).await;
    assert_eq!(get(op.clone()).await["status"], "Succeeded");
    assert_eq!(
        get(v3.clone()).await["properties"]["provisioningState"],
        "Succeeded"
    );

    // hold_after: the write takes effect, then the response is held.
    add_fault(&h, json!({"method": "PUT", "path": "*/versions/4.0.0", "hold_after": true, "delay_ms": 60000, "drop": true})).await;
    let v4 = format!("{def}/versions/4.0.0");
    let put4 = tokio::spawn(put(
        v4.clone(),
        body("https://bosh.blob.core.windows.net/s/d.vhd"),
    ));
    assert!(
        wait_until(Duration::from_secs(5), || async {
            fired(&h).await.iter().any(|f| f.2 == "served")
        })
        .await
    );
    assert_eq!(
        get(v4.clone()).await["name"],
        "4.0.0",
        "served before the response"
    );
    put4.abort();

    // Bad documents are refused.
    let bad = raw
        .post(format!("{}/_emulator/faults", h.arm))
        .json(&json!({"operation": "sometimes"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

/// What a counting credential saw: tokens handed out and cache clears.
#[derive(Debug, Default)]
struct CountingCredential {
    tokens: std::sync::atomic::AtomicUsize,
    clears: std::sync::atomic::AtomicUsize,
    builds: std::sync::atomic::AtomicUsize,
}

/// One build of the counting credential: it hands out `token-<generation>`, a new token after
/// each clear (as a real one does after a refresh).
#[derive(Debug)]
struct CountingToken {
    counts: std::sync::Arc<CountingCredential>,
    generation: usize,
}

#[async_trait::async_trait]
impl azure_core::credentials::TokenCredential for CountingToken {
    async fn get_token(
        &self,
        _: &[&str],
        _: Option<azure_core::credentials::TokenRequestOptions<'_>>,
    ) -> azure_core::Result<azure_core::credentials::AccessToken> {
        self.counts
            .tokens
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(azure_core::credentials::AccessToken::new(
            azure_core::credentials::Secret::new(format!("token-{}", self.generation)),
            time::OffsetDateTime::now_utc() + time::Duration::hours(1),
        ))
    }
}

/// The tool's 1.x credential over a [`CountingToken`], rebuilt (a clear) by `clear_cache`.
fn counting_credential() -> (
    stemcell_gallery::azure::credential::Credential,
    std::sync::Arc<CountingCredential>,
) {
    use std::sync::atomic::Ordering;
    let counts = std::sync::Arc::new(CountingCredential::default());
    let c = counts.clone();
    let credential = stemcell_gallery::azure::credential::Credential::rebuilt_by(move || {
        let generation = c.builds.fetch_add(1, Ordering::SeqCst);
        if generation > 0 {
            c.clears.fetch_add(1, Ordering::SeqCst);
        }
        Ok(std::sync::Arc::new(CountingToken {
            counts: c.clone(),
            generation,
        })
            as std::sync::Arc<
                dyn azure_core::credentials::TokenCredential,
            >)
    })
    .expect("the counting credential builds");
    (credential, counts)
}

/// A 401 mid-run drops the cached token and retries once with a fresh one (ARM requests, LRO
/// polls and blob requests); a second 401 in a row is an error naming the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_401_refreshes_the_token_and_retries_once() {
    use std::sync::atomic::Ordering;
    use stemcell_gallery::azure::arm::{ArmGallery, ArmOptions};
    use stemcell_gallery::gallery::{GalleryApi, GalleryRef};

    let h = start().await;
    let (credential, cred) = counting_credential();
    let api = ArmGallery::new(
        &url::Url::parse(&h.arm).unwrap(),
        credential.clone(),
        GalleryRef {
            subscription: SUB.into(),
            resource_group: RG.into(),
            gallery: GALLERY.into(),
        },
        ArmOptions {
            max_retries: 0,
            poll_interval: Duration::from_millis(20),
            ..ArmOptions::default()
        },
    )
    .unwrap();
    let expired = json!({"status": 401, "code": "ExpiredAuthenticationToken", "message": "The access token expired."});
    let mut f = expired.clone();
    f["path"] = json!(format!("*/galleries/{GALLERY}"));
    add_fault(&h, f).await;
    assert!(api.gallery_exists().await.unwrap(), "retried after the 401");
    assert_eq!(
        cred.clears.load(Ordering::SeqCst),
        1,
        "the cached token was dropped"
    );
    assert!(
        cred.tokens.load(Ordering::SeqCst) >= 2,
        "a fresh token was asked for"
    );

    // Two in a row: the retry is not repeated; the error names the request and Azure's code.
    let mut f = expired.clone();
    f["path"] = json!(format!("*/galleries/{GALLERY}"));
    f["count"] = json!(2);
    add_fault(&h, f).await;
    let err = api.gallery_exists().await.unwrap_err().to_string();
    assert!(
        err.contains("401") && err.contains("ExpiredAuthenticationToken"),
        "{err}"
    );
    assert!(err.contains(GALLERY), "{err}");
    assert_eq!(cred.clears.load(Ordering::SeqCst), 2);
    clear_faults(&h).await;

    // Blob storage with a token credential: the same once-only refresh.
    let storage = stemcell_gallery::azure::blob::StorageTarget::new(
        &url::Url::parse(&h.blob).unwrap(),
        stemcell_gallery::azure::blob::StorageAuth::Token(credential.clone()),
    )
    .unwrap();
    let mut f = expired.clone();
    f["path"] = json!("*/stemcell");
    f["query"] = json!("comp=list");
    add_fault(&h, f).await;
    let blobs = list_stemcell_blobs(&storage.container("stemcell")).await;
    assert!(blobs.is_ok(), "{blobs:?}");
    assert_eq!(
        cred.clears.load(Ordering::SeqCst),
        3,
        "blob 401 dropped the token"
    );
    assert_eq!(fired(&h).await.len(), 4, "1 + 2 ARM 401s, 1 blob 401");
}

/// A response slower than the per-request timeout, every time: a clear error naming the request,
/// the timeout and its knob, exit 1; nothing half-made (the re-run converges).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_never_answer_in_time_give_a_clear_timeout_error() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = stemcell(dir.path(), "1.506", 7, 4);
    for (what, fault) in [
        (
            "ARM PUT version",
            json!({"method": "PUT", "path": "*/versions/1.506.0", "delay_ms": 30_000, "drop": true, "count": 50}),
        ),
        (
            "blob put page",
            json!({"method": "PUT", "path": "*/bosh-stemcell-*.vhd", "query": "comp=page", "delay_ms": 30_000, "drop": true, "count": 500}),
        ),
    ] {
        let h = start().await;
        add_fault(&h, fault).await;
        let args = seed_args(&path, "bosh-stemcell-r1");
        let env = [
            ("STEMCELL_GALLERY_ARM_RETRIES", "1"),
            ("STEMCELL_GALLERY_BLOB_RETRIES", "1"),
        ];
        let r = run(&h, &args, &env).await;
        assert_eq!(r.code, 1, "{what}: {}", r.stderr);
        let msg = r.error();
        assert!(
            msg.contains("no response within 1") && msg.contains("STEMCELL_GALLERY_HTTP_TIMEOUT"),
            "{what}: {msg}"
        );
        println!(
            "| {what} | no response within the timeout, every attempt | exit 1 ({:.1} s): {} |",
            r.seconds,
            shorten(&msg)
        );
        assert!(versions(&h, DEFINITION).await.len() <= 1);
        clear_faults(&h).await;
        expire_leases(&h).await;
        let again = run(&h, &args, &[]).await;
        assert_eq!(again.code, 0, "{what} re-run: {}", again.stderr);
        check_converged(&h, "1.506.0", &["bosh-stemcell-r1"])
            .await
            .unwrap();
    }
}

// ---- issue 14: deletes and reference writes under the lock, Failed versions, lost leases ----

/// `ensure` without a reference: a version nothing references (a cleanup candidate).
fn ensure_unreferenced(version: &str, sha: &str, blob: &str) -> Vec<String> {
    let mut a = ensure_args(version, sha, blob, "x");
    a.truncate(a.len() - 2);
    a
}

/// The binary, started in the background (stdout/stderr captured).
fn spawn(h: &Handle, args: &[String], env: &[(&str, &str)]) -> std::process::Child {
    let mut cmd = binary(h);
    cmd.args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("the binary starts")
}

async fn finish(child: std::process::Child) -> Run {
    let started = std::time::Instant::now();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().expect("it ends"))
        .await
        .unwrap();
    run_output(out, started)
}

/// Wait until a fault on `method` fires (in `phase`) beyond the `before` that had already.
async fn wait_fired(h: &Handle, method: &str, phase: &str, before: usize) {
    let reached = wait_until(Duration::from_secs(20), || async {
        fired_count(h, method, phase).await > before
    })
    .await;
    assert!(reached, "the {method} fault never fired ({phase})");
}

async fn fired_count(h: &Handle, method: &str, phase: &str) -> usize {
    fired(h)
        .await
        .iter()
        .filter(|f| f.0 == method && f.2 == phase)
        .count()
}

/// Issue 14 item 1: `cleanup --apply` plans a version for deletion; its DELETE is throttled (429,
/// Retry-After 3 s); during the wait `ensure --reference` records a reference on that version.
/// The DELETE is not re-sent blindly: cleanup re-reads under the version lock, sees the new
/// reference, keeps the version and reports it skipped (changed since planning).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_delete_throttled_while_ensure_records_a_reference_keeps_the_version() {
    let h = start().await;
    let setup = run(&h, &ensure_unreferenced("1.506", SHA_A, "b1"), &[]).await;
    assert_eq!(setup.code, 0, "setup: {}", setup.stderr);
    assert!(references_of(&versions(&h, DEFINITION).await[0]).is_empty());
    let before = fired_count(&h, "DELETE", "arrived").await;
    add_fault(
        &h,
        json!({"method": "DELETE", "path": "*/versions/1.506.0", "status": 429, "retry_after": 3}),
    )
    .await;
    let cleanup = spawn(
        &h,
        &[
            "cleanup".into(),
            "--apply".into(),
            "--min-age".into(),
            "0s".into(),
            "--keep-latest".into(),
            "0".into(),
        ],
        &[],
    );
    wait_fired(&h, "DELETE", "arrived", before).await;
    let ensure = run(&h, &ensure_args("1.506", SHA_A, "b1", R1), &[]).await;
    assert_eq!(
        ensure.code, 0,
        "ensure during the throttled delete: {}",
        ensure.stderr
    );
    let cleanup = finish(cleanup).await;

    let all = versions(&h, DEFINITION).await;
    assert_eq!(
        all.len(),
        1,
        "the version survives; cleanup: {}",
        cleanup.stderr
    );
    assert_eq!(state_of(&all[0]), "Succeeded");
    assert_eq!(references_of(&all[0]), vec![R1.to_string()]);
    assert_eq!(cleanup.code, 0, "{}", cleanup.stderr);
    let outcome = cleanup.json["versions"][0]["outcome"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        outcome.contains("changed since planning") && outcome.contains("tags"),
        "cleanup reports the version skipped: {}",
        cleanup.json
    );
}

/// Issue 14 item 1: a DELETE that met a 503 is sent again only after the version was read again
/// (under the lock): the request log shows a GET of the version between the two DELETEs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_retried_after_a_503_reads_the_version_again_first() {
    let h = start().await;
    let setup = run(&h, &ensure_unreferenced("1.506", SHA_A, "b1"), &[]).await;
    assert_eq!(setup.code, 0, "setup: {}", setup.stderr);
    h.state.reset_log();
    add_fault(
        &h,
        json!({"method": "DELETE", "path": "*/versions/1.506.0", "status": 503}),
    )
    .await;
    let r = run(
        &h,
        &[
            "delete".into(),
            "--name".into(),
            DEFINITION.into(),
            "--version".into(),
            "1.506".into(),
        ],
        &[],
    )
    .await;
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        versions(&h, DEFINITION).await.is_empty(),
        "deleted in the end"
    );
    let on_version: Vec<(String, u16)> = h
        .state
        .requests()
        .into_iter()
        .filter(|q| q.service == "arm" && q.path.ends_with("/versions/1.506.0"))
        .map(|q| (q.method, q.status))
        .collect();
    let deletes: Vec<usize> = on_version
        .iter()
        .enumerate()
        .filter(|(_, (m, _))| m == "DELETE")
        .map(|(i, _)| i)
        .collect();
    assert!(deletes.len() >= 2, "{on_version:?}");
    assert_eq!(on_version[deletes[0]].1, 503, "{on_version:?}");
    assert!(
        on_version[deletes[0] + 1..deletes[1]]
            .iter()
            .any(|(m, _)| m == "GET"),
        "the version is read again before the DELETE is re-sent: {on_version:?}"
    );
}

/// A Failed version carrying `R1` and holding `sha` (its create failed, its clean-up refused).
async fn failed_version_with_r1(h: &Handle, sha: &str) {
    add_fault(
        h,
        json!({"method": "PUT", "path": "*/versions/1.506.0", "operation": "failed"}),
    )
    .await;
    add_fault(
        h,
        json!({"method": "DELETE", "path": "*/versions/1.506.0", "status": 400, "count": 5}),
    )
    .await;
    let r = run(h, &ensure_args("1.506", sha, "setup", R1), &[]).await;
    assert_eq!(r.code, 1, "setup ensure: {}", r.stderr);
    clear_faults(h).await;
    expire_leases(h).await;
    let v = versions(h, DEFINITION).await;
    assert_eq!(v.len(), 1);
    assert_eq!(state_of(&v[0]), "Failed");
    assert_eq!(references_of(&v[0]), vec![R1.to_string()]);
}

/// Issue 14 item 5: a Failed version holding another image (a failed *update* may still serve
/// it) is not replaced: exit 4 naming both digests, and the version stays as it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_version_holding_another_image_is_not_replaced_exit_4() {
    let h = start().await;
    failed_version_with_r1(&h, SHA_A).await;
    let other = "b".repeat(64);
    let r = run(&h, &ensure_args("1.506", &other, "b2", R2), &[]).await;
    assert_eq!(r.code, 4, "{}", r.stderr);
    let msg = r.error();
    assert!(msg.contains(SHA_A) && msg.contains(&other), "{msg}");
    let v = versions(&h, DEFINITION).await;
    assert_eq!(v.len(), 1);
    assert_eq!(state_of(&v[0]), "Failed");
    assert_eq!(references_of(&v[0]), vec![R1.to_string()]);
}

/// Issue 14 item 5: the references of a Failed version replaced by the same content are kept
/// durably (the lock's note) before it is deleted: when the re-create fails too, the next ensure
/// still records them on the new version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn references_of_a_replaced_failed_version_survive_a_failed_re_create() {
    let h = start().await;
    failed_version_with_r1(&h, SHA_A).await;
    add_fault(
        &h,
        json!({"method": "PUT", "path": "*/versions/1.506.0", "operation": "failed"}),
    )
    .await;
    let failed = run(&h, &ensure_args("1.506", SHA_A, "b1", R2), &[]).await;
    assert_eq!(failed.code, 1, "the re-create fails: {}", failed.stderr);
    clear_faults(&h).await;
    expire_leases(&h).await;
    let again = run(&h, &ensure_args("1.506", SHA_A, "b1", R2), &[]).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    check_converged(&h, "1.506.0", &[R1, R2]).await.unwrap();
}

/// Issue 14 item 6: writer 1's tag write takes effect but its answer is held past its lease (and
/// then the connection drops); meanwhile writer 2 takes the expired lock and records its
/// reference. Writer 1 does not re-send its stale tag set: it reads again and merges. Both
/// references are there at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_stalled_past_its_lease_does_not_erase_the_reference_recorded_meanwhile() {
    let h = start().await;
    let setup = run(&h, &ensure_args("1.506", SHA_A, "b1", R1), &[]).await;
    assert_eq!(setup.code, 0, "setup: {}", setup.stderr);
    let before = fired_count(&h, "PATCH", "served").await;
    add_fault(
        &h,
        json!({"method": "PATCH", "path": "*/versions/1.506.0", "hold_after": true, "delay_ms": 5000, "drop": true}),
    )
    .await;
    // Writer 1's own timeout is longer than the hold: what it sees is the dropped connection.
    let writer1 = spawn(
        &h,
        &ensure_args("1.506", SHA_A, "b1", "bosh-stemcell-w1"),
        &[("STEMCELL_GALLERY_HTTP_TIMEOUT", "30")],
    );
    wait_fired(&h, "PATCH", "served", before).await;
    expire_leases(&h).await;
    let writer2 = run(
        &h,
        &ensure_args("1.506", SHA_A, "b1", "bosh-stemcell-w2"),
        &[],
    )
    .await;
    assert_eq!(writer2.code, 0, "writer 2: {}", writer2.stderr);
    assert!(
        references_of(&versions(&h, DEFINITION).await[0]).contains(&"bosh-stemcell-w2".to_string()),
        "writer 2 finished before writer 1's answer came"
    );
    let writer1 = finish(writer1).await;
    assert_eq!(writer1.code, 0, "writer 1: {}", writer1.stderr);
    check_converged(&h, "1.506.0", &[R1, "bosh-stemcell-w1", "bosh-stemcell-w2"])
        .await
        .unwrap();
}

/// Send a signal to a child (`STOP` / `CONT`): a host that stalls (a paused VM) and resumes.
fn signal(child: &std::process::Child, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([format!("-{sig}"), child.id().to_string()])
        .status()
        .expect("kill runs")
        .success();
    assert!(ok, "kill -{sig} {}", child.id());
}

/// Issue 28 item 3 (docs/RELIABILITY.md's former "known limit"): writer A's tag PATCH is held
/// by the service before it takes effect, and A stalls (SIGSTOP) past its lease; writer B takes
/// the lock, records its reference and exits 0; then A's PATCH lands, carrying A's view from
/// before B, and B's reference is gone from the tags. B's reference was written first to the
/// version's reference record (conditional blob writes), so every reader that decides merges it
/// back: deleting every other reference keeps the version for B, and the next write puts B's
/// reference back on the tags. (Before the record: the last delete deleted the version B uses.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_tag_write_landing_after_another_writer_cannot_erase_its_reference() {
    const W1: &str = "bosh-stemcell-a1a1a1a1-0000-4000-8000-000000000001";
    const W2: &str = "bosh-stemcell-b2b2b2b2-0000-4000-8000-000000000002";
    let h = start().await;
    let setup = run(&h, &ensure_args("1.506", SHA_A, "b1", R1), &[]).await;
    assert_eq!(setup.code, 0, "setup: {}", setup.stderr);
    let before = fired_count(&h, "PATCH", "arrived").await;
    // The service takes 6 s before A's tag write takes effect.
    add_fault(
        &h,
        json!({"method": "PATCH", "path": "*/versions/1.506.0", "delay_ms": 6000}),
    )
    .await;
    let a = spawn(
        &h,
        &ensure_args("1.506", SHA_A, "b1", W1),
        &[("STEMCELL_GALLERY_HTTP_TIMEOUT", "60")],
    );
    wait_fired(&h, "PATCH", "arrived", before).await;
    signal(&a, "STOP");
    expire_leases(&h).await;
    let b = run(&h, &ensure_args("1.506", SHA_A, "b1", W2), &[]).await;
    assert_eq!(b.code, 0, "writer B: {}", b.stderr);
    // A's stale write lands: the tags lose B's reference (the attack happened).
    let landed = wait_until(Duration::from_secs(20), || async {
        let refs = references_of(&versions(&h, DEFINITION).await[0]);
        refs.contains(&W1.to_string()) && !refs.contains(&W2.to_string())
    })
    .await;
    assert!(
        landed,
        "A's delayed PATCH never erased B's reference from the tags: {:?}",
        references_of(&versions(&h, DEFINITION).await[0])
    );
    signal(&a, "CONT");
    let a = finish(a).await;
    assert_eq!(a.code, 0, "writer A: {}", a.stderr);
    // Every delete decides on the merged view: B still holds the version.
    let delete = |r: &str| {
        vec![
            "delete".to_string(),
            "--name".into(),
            DEFINITION.into(),
            "--version".into(),
            "1.506".into(),
            "--reference".into(),
            r.to_string(),
        ]
    };
    for r in [R1, W1] {
        let d = run(&h, &delete(r), &[]).await;
        assert_eq!(d.code, 0, "delete {r}: {}", d.stderr);
        assert_eq!(d.json["result"], "kept", "delete {r}: {}", d.json);
    }
    let left = versions(&h, DEFINITION).await;
    assert_eq!(left.len(), 1, "the version B uses was deleted");
    assert_eq!(
        references_of(&left[0]),
        vec![W2.to_string()],
        "B's reference is back on the tags"
    );
}

/// Issue 28 item 3, for cleanup: a late tag write (another tool's, or a stalled writer's) left a
/// version's tags without the one reference this tool recorded. Cleanup plans and applies on
/// the version as its reference record says it is: kept, for that reference. (Before: planned
/// `delete` and deleted, exit 0.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_keeps_a_version_whose_reference_a_late_tag_write_erased() {
    let h = start().await;
    let setup = run(&h, &ensure_args("1.506", SHA_A, "b1", R1), &[]).await;
    assert_eq!(setup.code, 0, "setup: {}", setup.stderr);
    // The late write: the version's tags as they were before R1 (no reference at all).
    let v = versions(&h, DEFINITION).await.remove(0);
    let mut tags = v["tags"].as_object().cloned().unwrap();
    tags.retain(|k, _| !k.starts_with("sg_overflow_refs_"));
    tags.insert("stemcell_references".into(), json!(""));
    let path = format!(
        "{}/images/{DEFINITION}/versions/1.506.0",
        crate::support::emulated::gallery_path(GALLERY)
    );
    let r = crate::support::emulated::Raw::new(&h.arm)
        .patch(&path, json!({"tags": tags}))
        .await;
    assert!(r.status < 300, "{}", r.text);
    assert!(references_of(&versions(&h, DEFINITION).await[0]).is_empty());

    let args: Vec<String> = [
        "cleanup",
        "--apply",
        "--min-age",
        "0s",
        "--keep-latest",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let cleanup = run(&h, &args, &[]).await;
    assert_eq!(cleanup.code, 0, "{}", cleanup.stderr);
    let left = versions(&h, DEFINITION).await;
    assert_eq!(left.len(), 1, "kept: {}", cleanup.json);
    let planned = &cleanup.json["versions"][0];
    assert_eq!(planned["verdict"], "keep", "{planned}");
    assert!(planned.to_string().contains(R1), "kept for R1: {planned}");
}

/// Requests wait for the slow answers below (not the fault runs' 1 s, which would send them
/// again).
const PATIENT: &[(&str, &str)] = &[("STEMCELL_GALLERY_HTTP_TIMEOUT", "30")];

/// Issue 44 (ledger simulator, seed 4482): a host stalls between its last lease check and its
/// create PUT until its lease runs out; a second host takes the lock, sees no version and
/// creates it too. The first PUT lands, then the second replaces it (a version PUT is
/// create-or-update; versions have no conditional write). The first host's PUT alone proves
/// nothing: its lease was not its own when it landed, so it observes again under the lock and
/// records its reference on the version that stands. Both references are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_landed_after_its_lease_ran_out_is_checked_before_it_is_reported() {
    let h = start().await;
    let before = fired_count(&h, "PUT", "arrived").await;
    add_fault(
        &h,
        json!({"method": "PUT", "path": "*/versions/1.506.0", "delay_ms": 3000, "name": "stalled-create"}),
    )
    .await;
    let first = spawn(&h, &ensure_args("1.506", SHA_A, "b1", R1), PATIENT);
    wait_fired(&h, "PUT", "arrived", before).await;
    expire_leases(&h).await;
    // The second host's create lands after the first's.
    add_fault(
        &h,
        json!({"method": "PUT", "path": "*/versions/1.506.0", "delay_ms": 6000, "name": "second-create"}),
    )
    .await;
    let second = spawn(&h, &ensure_args("1.506", SHA_A, "b1", R2), PATIENT);
    let (first, second) = (finish(first).await, finish(second).await);
    assert_eq!(first.code, 0, "the stalled host: {}", first.stderr);
    assert_eq!(second.code, 0, "the second host: {}", second.stderr);
    check_converged(&h, "1.506.0", &[R1, R2]).await.unwrap();
}
