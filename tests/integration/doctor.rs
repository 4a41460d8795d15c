//! `doctor` with each check made to fail in turn, without the emulator: a local token server
//! and a tiny read-only ARM stand-in. (Emulator-backed doctor tests come with the emulator.)

use crate::support::token_server;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use assert_cmd::Command;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use stemcell_gallery::cli::doctor::{run_checks, DoctorOptions, Status, StorageProbe};
use stemcell_gallery::cli::GlobalArgs;
use token_server::TokenServer;

const GALLERY: &str =
    "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Compute/galleries/bosh_gallery";

/// Serves the gallery and its (empty) definition list, for bearer tokens from our token server.
async fn fake_arm(gallery_exists: bool) -> String {
    let exists = Arc::new(AtomicBool::new(gallery_exists));
    async fn gallery(State(exists): State<Arc<AtomicBool>>, h: HeaderMap) -> impl IntoResponse {
        if !authorized(&h) {
            return (
                StatusCode::UNAUTHORIZED,
                Json(
                    serde_json::json!({"error": {"code": "InvalidAuthenticationToken", "message": "bad token"}}),
                ),
            );
        }
        if !exists.load(Ordering::SeqCst) {
            return (
                StatusCode::NOT_FOUND,
                Json(
                    serde_json::json!({"error": {"code": "ResourceNotFound", "message": "The Resource 'Microsoft.Compute/galleries/bosh_gallery' was not found."}}),
                ),
            );
        }
        (
            StatusCode::OK,
            Json(serde_json::json!({
                "id": GALLERY, "name": "bosh_gallery", "type": "Microsoft.Compute/galleries",
                "location": "westeurope", "properties": {"provisioningState": "Succeeded"}
            })),
        )
    }
    async fn images(h: HeaderMap) -> impl IntoResponse {
        if !authorized(&h) {
            return (
                StatusCode::UNAUTHORIZED,
                Json(
                    serde_json::json!({"error": {"code": "InvalidAuthenticationToken", "message": "bad token"}}),
                ),
            );
        }
        (StatusCode::OK, Json(serde_json::json!({"value": []})))
    }
    fn authorized(h: &HeaderMap) -> bool {
        h.get("authorization")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("Bearer entra-"))
    }
    async fn permissions(h: HeaderMap) -> impl IntoResponse {
        if !authorized(&h) {
            return (
                StatusCode::UNAUTHORIZED,
                Json(
                    serde_json::json!({"error": {"code": "InvalidAuthenticationToken", "message": "bad token"}}),
                ),
            );
        }
        (
            StatusCode::OK,
            Json(serde_json::json!({"value": [{"actions": ["*/read"], "notActions": []}]})),
        )
    }
    // The lock actions where the role is assigned (the resource group), and the gallery's
    // management locks (none): doctor's protection check.
    async fn rg_permissions(h: HeaderMap) -> impl IntoResponse {
        if !authorized(&h) {
            return (StatusCode::UNAUTHORIZED, Json(serde_json::json!({})));
        }
        (
            StatusCode::OK,
            Json(
                serde_json::json!({"value": [{"actions": ["*/read", "Microsoft.Authorization/locks/*"], "notActions": []}]}),
            ),
        )
    }
    async fn locks(h: HeaderMap) -> impl IntoResponse {
        if !authorized(&h) {
            return (StatusCode::UNAUTHORIZED, Json(serde_json::json!({})));
        }
        (StatusCode::OK, Json(serde_json::json!({"value": []})))
    }
    let app = Router::new()
        .route(GALLERY, get(gallery))
        .route(
            "/subscriptions/sub/providers/Microsoft.Authorization/permissions",
            get(permissions),
        )
        .route(
            "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.Authorization/permissions",
            get(rg_permissions),
        )
        .route(
            &format!("{GALLERY}/providers/Microsoft.Authorization/locks"),
            get(locks),
        )
        .route(&format!("{GALLERY}/images"), get(images))
        .with_state(exists);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A config file for the service principal that the token server knows.
fn config(
    dir: &std::path::Path,
    tokens: &TokenServer,
    arm: &str,
    extra: &str,
) -> std::path::PathBuf {
    let (authority, ca) = (&tokens.authority, &tokens.ca_cert);
    std::fs::write(dir.join("secret"), "s3cr3t-Value-never-printed\n").unwrap();
    let path = dir.join("sg.toml");
    std::fs::write(
        &path,
        format!(
            "subscription = \"sub\"\nresource_group = \"rg\"\ngallery = \"bosh_gallery\"\n\
             auth = \"secret\"\ntenant_id = \"tenant-1\"\nclient_id = \"client-1\"\n\
             client_secret_file = \"secret\"\nauthority_host = \"{authority}\"\n\
             ca_cert = \"{ca}\"\narm_endpoint = \"{arm}\"\n{extra}"
        ),
    )
    .unwrap();
    path
}

fn statuses(checks: &[stemcell_gallery::cli::doctor::Check]) -> Vec<(&'static str, Status)> {
    checks.iter().map(|c| (c.name, c.status)).collect()
}

/// A closed port on loopback: bind, note the port, drop the listener.
fn closed_port_url() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}")
}

#[tokio::test]
async fn all_checks_pass_against_a_reachable_gallery() {
    let tokens = TokenServer::standard().await;
    let arm = fake_arm(true).await;
    let dir = tempfile::tempdir().unwrap();
    let global = GlobalArgs {
        config: Some(config(dir.path(), &tokens, &arm, "")),
        ..Default::default()
    };
    let checks = run_checks(&global, &DoctorOptions::default()).await;
    assert_eq!(
        statuses(&checks),
        vec![
            ("configuration", Status::Pass),
            ("token", Status::Pass),
            ("gallery", Status::Pass),
            ("storage", Status::Skip),
            ("definitions", Status::Pass),
            ("protection", Status::Pass),
            ("consumers", Status::Pass),
        ],
        "{checks:#?}"
    );
    assert_eq!(checks[3].detail, "skipped: no blob endpoint configured");
}

#[tokio::test]
async fn missing_configuration_fails_first_and_skips_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sg.toml");
    std::fs::write(&path, "subscription = \"sub\"\nresource_group = \"rg\"\n").unwrap();
    let global = GlobalArgs {
        config: Some(path),
        ..Default::default()
    };
    let checks = run_checks(&global, &DoctorOptions::default()).await;
    assert_eq!(checks[0].status, Status::Fail);
    assert!(
        checks[0].detail.contains("--gallery"),
        "{}",
        checks[0].detail
    );
    assert!(checks[0].fix.is_some());
    assert!(checks[1..].iter().all(|c| c.status == Status::Skip));
}

#[tokio::test]
async fn rejected_credentials_fail_the_token_check() {
    let tokens = TokenServer::standard().await;
    tokens.reject_all(true);
    let arm = fake_arm(true).await;
    let dir = tempfile::tempdir().unwrap();
    let global = GlobalArgs {
        config: Some(config(dir.path(), &tokens, &arm, "")),
        ..Default::default()
    };
    let checks = run_checks(&global, &DoctorOptions::default()).await;
    assert_eq!(
        statuses(&checks)[..2],
        [("configuration", Status::Pass), ("token", Status::Fail)]
    );
    assert!(checks[1].fix.as_deref().unwrap().contains("client secret"));
    assert!(checks[2..].iter().all(|c| c.status == Status::Skip));
    let all = format!("{checks:?}");
    assert!(!all.contains("s3cr3t-Value-never-printed"), "{all}");
}

#[tokio::test]
async fn unreachable_arm_fails_the_gallery_check() {
    let tokens = TokenServer::standard().await;
    let dir = tempfile::tempdir().unwrap();
    let global = GlobalArgs {
        config: Some(config(dir.path(), &tokens, &closed_port_url(), "")),
        ..Default::default()
    };
    let mut opts = DoctorOptions::default();
    opts.arm.max_retries = 0;
    let checks = run_checks(&global, &opts).await;
    assert_eq!(
        statuses(&checks),
        vec![
            ("configuration", Status::Pass),
            ("token", Status::Pass),
            ("gallery", Status::Fail),
            ("storage", Status::Skip),
            ("definitions", Status::Skip),
            ("protection", Status::Skip),
            ("consumers", Status::Skip),
        ],
        "{checks:#?}"
    );
}

#[tokio::test]
async fn missing_gallery_fails_with_how_to_create_it() {
    let tokens = TokenServer::standard().await;
    let arm = fake_arm(false).await;
    let dir = tempfile::tempdir().unwrap();
    let global = GlobalArgs {
        config: Some(config(dir.path(), &tokens, &arm, "")),
        ..Default::default()
    };
    let checks = run_checks(&global, &DoctorOptions::default()).await;
    assert_eq!(checks[2].status, Status::Fail, "{checks:#?}");
    assert!(checks[2].detail.contains("does not exist"));
    assert!(checks[2].fix.as_deref().unwrap().contains("az sig create"));
}

struct ReadOnlyStorage;

#[async_trait::async_trait]
impl StorageProbe for ReadOnlyStorage {
    async fn check_writable(&self) -> anyhow::Result<()> {
        anyhow::bail!("HTTP 403 AuthorizationPermissionMismatch")
    }
}

#[tokio::test]
async fn unwritable_storage_fails_the_storage_check() {
    let tokens = TokenServer::standard().await;
    let arm = fake_arm(true).await;
    let dir = tempfile::tempdir().unwrap();
    let global = GlobalArgs {
        config: Some(config(
            dir.path(),
            &tokens,
            &arm,
            "storage_account = \"boshstemcells01\"\n",
        )),
        ..Default::default()
    };
    let opts = DoctorOptions {
        storage: Some(Arc::new(|_s: &stemcell_gallery::config::Settings| {
            Ok(Some(Arc::new(ReadOnlyStorage) as Arc<dyn StorageProbe>))
        })),
        ..DoctorOptions::default()
    };
    let checks = run_checks(&global, &opts).await;
    assert_eq!(checks[3].name, "storage");
    assert_eq!(checks[3].status, Status::Fail, "{checks:#?}");
    assert!(checks[3]
        .detail
        .contains("https://boshstemcells01.blob.core.windows.net/"));
    assert!(checks[3]
        .fix
        .as_deref()
        .unwrap()
        .contains("Storage Blob Data Contributor"));
    assert_eq!(checks[4].status, Status::Pass);
}

#[tokio::test]
async fn cli_prints_json_checks_and_exits_1_on_failure() {
    let tokens = TokenServer::standard().await;
    tokens.reject_all(true);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), &tokens, "http://127.0.0.1:9", "");
    let out = tokio::task::spawn_blocking(move || {
        Command::cargo_bin("stemcell-gallery")
            .unwrap()
            .env_clear()
            .args(["--output", "json", "doctor", "--config"])
            .arg(cfg)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], false);
    let checks = doc["checks"].as_array().unwrap();
    let names: Vec<_> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "configuration",
            "token",
            "gallery",
            "storage",
            "definitions",
            "protection",
            "consumers"
        ]
    );
    assert_eq!(checks[0]["status"], "pass");
    assert_eq!(checks[1]["status"], "fail");
    assert!(checks[1]["fix"].is_string());
    assert_eq!(checks[2]["status"], "skip");
}

#[tokio::test]
async fn human_report_shows_each_check_with_its_fix() {
    let tokens = TokenServer::standard().await;
    tokens.reject_all(true);
    let dir = tempfile::tempdir().unwrap();
    let global = GlobalArgs {
        config: Some(config(dir.path(), &tokens, "http://127.0.0.1:9", "")),
        ..Default::default()
    };
    let checks = run_checks(&global, &DoctorOptions::default()).await;
    let report = stemcell_gallery::cli::doctor::report(&checks);
    assert_eq!(report.exit, stemcell_gallery::error::Exit::Error);
    let lines: Vec<&str> = report.human.lines().collect();
    assert!(
        lines[0].starts_with(
            "PASS  configuration subscription sub, resource group rg, gallery bosh_gallery"
        ),
        "{}",
        report.human
    );
    assert!(
        lines[1]
            .starts_with("FAIL  token         no token for https://management.azure.com/.default"),
        "{}",
        report.human
    );
    assert!(
        lines[2]
            .trim_start()
            .starts_with("fix: check the tenant id, client id and client secret"),
        "{}",
        report.human
    );
    assert_eq!(lines[3], "SKIP  gallery       skipped: no token");
    assert_eq!(lines[4], "SKIP  storage       skipped: no token");
    assert_eq!(lines[5], "SKIP  definitions   skipped: no token");
    assert_eq!(lines[6], "SKIP  protection    skipped: no token");
    assert_eq!(lines[7], "SKIP  consumers     skipped: no token");
    assert_eq!(lines[8], "some checks failed");
}

/// Issue 31: a token endpoint that never answers took doctor 30 s of silence, then it suggested
/// fixing the client secret. Silence is the way there, not the credential: it now says so.
#[tokio::test]
async fn a_token_endpoint_that_never_answers_is_named_as_a_network_problem() {
    let tokens = TokenServer::standard().await;
    // Accepts connections (the kernel's backlog) and never answers a byte.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let arm = fake_arm(true).await;
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), &tokens, &arm, "");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        &format!("authority_host = \"{}\"", tokens.authority),
        &format!("authority_host = \"https://127.0.0.1:{port}\""),
    );
    std::fs::write(&path, text).unwrap();
    let global = GlobalArgs {
        config: Some(path),
        ..Default::default()
    };
    let opts = DoctorOptions {
        token_timeout: std::time::Duration::from_secs(1),
        ..DoctorOptions::default()
    };
    let checks = run_checks(&global, &opts).await;
    assert_eq!(
        statuses(&checks)[..2],
        [("configuration", Status::Pass), ("token", Status::Fail)]
    );
    let (detail, fix) = (&checks[1].detail, checks[1].fix.as_deref().unwrap());
    assert!(
        detail.contains("did not answer") && detail.contains("not a wrong credential"),
        "{detail}"
    );
    assert!(detail.contains(&port.to_string()), "{detail}");
    assert!(
        fix.contains("HTTPS_PROXY") && !fix.contains("client secret"),
        "{fix}"
    );
    assert!(
        !detail.contains("  ") && !fix.contains("  "),
        "one line each, no gaps: {detail:?} {fix:?}"
    );
    drop(silent);
}
