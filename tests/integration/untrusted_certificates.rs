//! A TLS certificate the tool does not trust (a private CA not named by `ca_cert`) fails at the
//! first attempt, whichever endpoint presents it (the token endpoint, IMDS over https, ARM, blob
//! storage): the same certificate fails the same way on every retry (docs/configure.md "Trusting a
//! private CA"). The error names the remedy, a command exits 1, the CPI answers `ok_to_retry: false`.
//! Issue 28 item 10: a token endpoint behind an untrusted CA took 82 s to fail (9 attempts, the
//! SDK's own retries), even with `STEMCELL_GALLERY_ARM_RETRIES=0`.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::emulated::start_default;
use crate::support::token_server::TokenServer;
use crate::support::{binary, tls_front, LOC, RG, SUB};

/// How long a refusal of an untrusted certificate may take: one attempt, no backoff (the
/// handshake itself takes milliseconds; the rest is the binary starting).
const FAST: Duration = Duration::from_secs(10);

/// A private CA, and an https front it signed before `target` counting its handshakes. The CA
/// file is returned for the runs that trust it.
async fn untrusted_front(
    dir: &std::path::Path,
    target: &str,
) -> (
    String,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    std::path::PathBuf,
) {
    let (ca, cert, key) = tls_front::private_ca(dir);
    let (url, handshakes) = tls_front::tls_front_counted(target, &cert, &key).await;
    (url, handshakes, ca)
}

/// Run the binary with `args` (stdin `input` when given) and `env`; exit code, stdout, stderr
/// and how long it took.
async fn run(
    args: Vec<String>,
    env: Vec<(String, String)>,
    input: Option<String>,
) -> (Option<i32>, String, String, Duration) {
    tokio::task::spawn_blocking(move || {
        let mut cmd = binary::command();
        cmd.args(&args)
            .envs(env)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let started = Instant::now();
        let mut child = cmd.spawn().expect("the binary starts");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin is piped");
            if let Some(input) = input {
                let _ = stdin.write_all(input.as_bytes());
            }
        }
        let out = child.wait_with_output().expect("the binary finishes");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            started.elapsed(),
        )
    })
    .await
    .unwrap()
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The target flags with `--auth secret` (the service principal comes from the environment).
fn secret_args(arm: &str, blob: &str) -> Vec<String> {
    strings(&[
        "--arm-endpoint",
        arm,
        "--blob-endpoint",
        blob,
        "--auth",
        "secret",
        "--subscription",
        SUB,
        "--resource-group",
        RG,
        "--gallery",
        "g",
        "--location",
        LOC,
    ])
}

fn service_principal(authority: &str) -> Vec<(String, String)> {
    [
        ("AZURE_AUTHORITY_HOST", authority),
        ("AZURE_TENANT_ID", "tenant-1"),
        ("AZURE_CLIENT_ID", "client-1"),
        ("AZURE_CLIENT_SECRET", "s3cr3t-Value-never-printed"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The remedy every certificate refusal names: the `ca_cert` setting and where docs/configure.md explains it.
fn names_the_remedy(text: &str) -> bool {
    text.contains("ca_cert") && text.contains("Trusting a private CA")
}

fn cpi_request() -> String {
    json!({"method": "delete_stemcell",
           "arguments": ["bosh-stemcell-5b0c7e1a-9d2f-4c3b-8a1e-6f7d8c9b0a1e"],
           "context": {"director_uuid": "d"}, "api_version": 2})
    .to_string()
}

/// Item 10's measurement: `list` with a service principal whose token endpoint (Entra ID, here
/// the test's token server) presents a certificate of a CA nobody configured. Before: 82 s and
/// 9 handshakes (azure_identity's pipeline retried the connection error 8 times).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_token_endpoint_is_untrusted_fails_at_the_first_attempt_naming_ca_cert() {
    let server = TokenServer::standard().await;
    let handle = start_default().await;
    handle.state.ensure_gallery(SUB, RG, "g", LOC).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (authority, handshakes, ca) = untrusted_front(dir.path(), &server.url).await;

    let mut args = secret_args(&handle.arm, &handle.blob);
    args.extend(strings(&["list"]));
    let (code, _, stderr, took) = run(args.clone(), service_principal(&authority), None).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(took < FAST, "failed after {took:?}: {stderr}");
    assert_eq!(
        handshakes.load(Ordering::SeqCst),
        1,
        "one attempt: {stderr}"
    );
    assert_eq!(server.count(), 0, "no token request got through");
    assert!(names_the_remedy(&stderr), "{stderr}");
    assert!(
        stderr.contains("a token"),
        "says it was the token request: {stderr}"
    );
    assert!(!stderr.contains("s3cr3t-Value-never-printed"), "{stderr}");

    // Trusting the CA: the same command gets its token and lists.
    let mut env = service_principal(&authority);
    env.push(("STEMCELL_GALLERY_CA_CERT".into(), ca.display().to_string()));
    let (code, _, stderr, _) = run(args, env, None).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(server.count(), 1);
}

/// The CPI front with the same untrusted token endpoint: BOSH must not retry it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cpi_answers_an_untrusted_token_endpoint_with_ok_to_retry_false_at_once() {
    let server = TokenServer::standard().await;
    let handle = start_default().await;
    let dir = tempfile::tempdir().unwrap();
    let (authority, handshakes, _) = untrusted_front(dir.path(), &server.url).await;

    let mut args = secret_args(&handle.arm, &handle.blob);
    args.push("cpi".into());
    let (code, stdout, stderr, took) =
        run(args, service_principal(&authority), Some(cpi_request())).await;
    assert_eq!(code, Some(0), "{stderr}");
    let r: Value = serde_json::from_str(stdout.trim()).expect("one JSON response");
    assert_eq!(r["error"]["type"], "Bosh::Clouds::CloudError", "{r}");
    assert_eq!(r["error"]["ok_to_retry"], false, "{r}");
    assert!(
        names_the_remedy(r["error"]["message"].as_str().unwrap_or("")),
        "{r}"
    );
    assert!(took < FAST, "answered after {took:?}");
    assert_eq!(handshakes.load(Ordering::SeqCst), 1);
}

/// ARM behind the untrusted CA (the emulator's development token, no token request): the CPI
/// answers after one handshake with `ok_to_retry: false`, naming the remedy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_arm_endpoint_behind_an_untrusted_ca_fails_the_cpi_at_the_first_attempt() {
    let handle = start_default().await;
    handle.state.ensure_gallery(SUB, RG, "g", LOC).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (arm, handshakes, _) = untrusted_front(dir.path(), &handle.arm).await;
    let mut args = binary::global_args(&arm, &handle.blob, "g");
    args.push("cpi".into());
    let (code, stdout, stderr, took) = run(args, Vec::new(), Some(cpi_request())).await;
    assert_eq!(code, Some(0), "{stderr}");
    let r: Value = serde_json::from_str(stdout.trim()).expect("one JSON response");
    assert_eq!(r["error"]["ok_to_retry"], false, "{r}");
    assert!(
        names_the_remedy(r["error"]["message"].as_str().unwrap_or("")),
        "{r}"
    );
    assert!(took < FAST, "answered after {took:?}");
    assert_eq!(handshakes.load(Ordering::SeqCst), 1, "{r}");
}

/// Blob storage behind the untrusted CA (ARM trusted): `seed` fails at its first blob request,
/// exit 1, naming the remedy; nothing is retried (the default blob retries are 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_endpoint_behind_an_untrusted_ca_fails_seed_at_the_first_attempt() {
    let handle = start_default().await;
    handle.state.ensure_gallery(SUB, RG, "g", LOC).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let blob_url = url::Url::parse(&handle.blob).unwrap();
    let origin = format!(
        "http://{}:{}",
        blob_url.host_str().unwrap(),
        blob_url.port().unwrap()
    );
    let (front, handshakes, _) = untrusted_front(dir.path(), &origin).await;
    let blob = format!("{front}{}", blob_url.path());
    let (stemcell, _) = crate::support::stemcells::stemcell(dir.path(), "1.506", 5, 2);
    let mut args = binary::global_args(&handle.arm, &blob, "g");
    args.extend(["seed".to_string(), stemcell.display().to_string()]);
    let (code, _, stderr, took) = run(args, Vec::new(), None).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(names_the_remedy(&stderr), "{stderr}");
    assert!(took < FAST, "failed after {took:?}: {stderr}");
    assert_eq!(handshakes.load(Ordering::SeqCst), 1, "{stderr}");
}

/// Managed identity whose token endpoint is https (`imds_endpoint`, AAD Pod Identity): a
/// private CA is trusted through `ca_cert` as for every other token request, and until it is,
/// the error names the remedy after one attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_imds_endpoint_behind_a_private_ca_names_ca_cert_and_works_once_trusted() {
    let server = TokenServer::standard().await;
    let handle = start_default().await;
    handle.state.ensure_gallery(SUB, RG, "g", LOC).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (front, handshakes, ca) = untrusted_front(dir.path(), &server.url).await;
    let imds = format!("{front}/metadata/identity/oauth2/token");
    let mut args = binary::global_args(&handle.arm, &handle.blob, "g");
    let auth = args.iter().position(|a| a == "emulator").unwrap();
    args[auth] = "managed-identity".into();
    args.push("list".into());
    let env = vec![("STEMCELL_GALLERY_IMDS_ENDPOINT".to_string(), imds.clone())];

    let (code, _, stderr, took) = run(args.clone(), env.clone(), None).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(names_the_remedy(&stderr), "{stderr}");
    assert!(took < FAST, "failed after {took:?}");
    assert_eq!(handshakes.load(Ordering::SeqCst), 1);
    assert_eq!(server.count(), 0);

    let mut env = env;
    env.push(("STEMCELL_GALLERY_CA_CERT".into(), ca.display().to_string()));
    let (code, _, stderr, _) = run(args, env, None).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(server.count(), 1);
}
