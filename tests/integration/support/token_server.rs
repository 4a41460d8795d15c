//! A local stand-in for the identity endpoints, on 127.0.0.1 port 0:
//! - Entra ID's token endpoint `POST /{tenant}/oauth2/v2.0/token` (client credentials with a
//!   client secret, or with a federated `client_assertion`), and
//! - IMDS `GET /metadata/identity/oauth2/token` (requires `Metadata: true`; `client_id`,
//!   `msi_res_id` or `mi_res_id` pick a user-assigned identity).
//!
//! It issues numbered tokens (`entra-1`, `imds-2`, ...) with a configurable lifetime, checks
//! credentials, can be told to answer 401, and records every request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// "entra" or "imds".
    pub endpoint: &'static str,
    pub tenant: Option<String>,
    pub grant_type: Option<String>,
    pub client_id: Option<String>,
    /// "secret" or "assertion" for Entra requests.
    pub proof: Option<&'static str>,
    pub scope: Option<String>,
    /// The federated assertion presented (test tokens only).
    pub assertion: Option<String>,
    pub resource: Option<String>,
    pub msi_res_id: Option<String>,
    pub mi_res_id: Option<String>,
}

#[derive(Default)]
pub struct Config {
    pub tenant: String,
    pub client_id: String,
    pub client_secret: String,
    /// Accepted federated assertions start with this.
    pub federated_token: String,
    /// User-assigned identities IMDS knows (client ids or resource ids); system-assigned
    /// always works.
    pub identities: Vec<String>,
}

struct Inner {
    config: Config,
    /// Lifetime of issued tokens, seconds (may be 0 or negative: already expired).
    expires_in: AtomicI64,
    counter: AtomicU64,
    reject: AtomicBool,
    /// Answer this many next requests with `fail_status` (then recover).
    fail_next: AtomicU64,
    /// The status of those answers (500 unless a test says otherwise).
    fail_status: std::sync::atomic::AtomicU16,
    /// Hold every Entra answer this long (a slow proxy or identity provider), milliseconds.
    delay_ms: AtomicU64,
    log: Mutex<Vec<Recorded>>,
}

#[derive(Clone)]
pub struct TokenServer {
    /// Plain http: the IMDS endpoint's base (IMDS is http).
    pub url: String,
    /// The same server behind TLS signed by a private CA: the authority host (azure_identity
    /// 1.x sends token requests only to an https authority).
    pub authority: String,
    /// The private CA's PEM file, for `ca_cert` / `STEMCELL_GALLERY_CA_CERT`.
    pub ca_cert: String,
    _ca_dir: Arc<tempfile::TempDir>,
    inner: Arc<Inner>,
}

impl TokenServer {
    pub async fn start(config: Config) -> TokenServer {
        let inner = Arc::new(Inner {
            config,
            expires_in: AtomicI64::new(3600),
            counter: AtomicU64::new(0),
            reject: AtomicBool::new(false),
            fail_next: AtomicU64::new(0),
            fail_status: std::sync::atomic::AtomicU16::new(500),
            delay_ms: AtomicU64::new(0),
            log: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/{tenant}/oauth2/v2.0/token", post(entra))
            .route("/metadata/identity/oauth2/token", get(imds))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        let url = format!("http://{addr}");
        let ca_dir = tempfile::tempdir().unwrap();
        let (ca, cert, key) = super::tls_front::private_ca(ca_dir.path());
        let authority = super::tls_front::tls_front(&url, &cert, &key).await;
        TokenServer {
            url,
            authority,
            ca_cert: ca.display().to_string(),
            _ca_dir: Arc::new(ca_dir),
            inner,
        }
    }

    /// A server with the usual test identities.
    pub async fn standard() -> TokenServer {
        Self::start(Config {
            tenant: "tenant-1".into(),
            client_id: "client-1".into(),
            client_secret: "s3cr3t-Value-never-printed".into(),
            federated_token: "federated-jwt-from-kubelet".into(),
            identities: vec![
                "uami-client-id".into(),
                "/subscriptions/sub/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/uami".into(),
            ],
        })
        .await
    }

    /// Lifetime of tokens issued from now on.
    pub fn set_expires_in(&self, seconds: i64) {
        self.inner.expires_in.store(seconds, Ordering::SeqCst);
    }

    /// Answer every token request with 401 from now on.
    pub fn reject_all(&self, reject: bool) {
        self.inner.reject.store(reject, Ordering::SeqCst);
    }

    /// Answer the next `n` IMDS requests with 500 Internal Server Error.
    pub fn fail_next(&self, n: u64) {
        self.fail_next_with(n, 500);
    }

    /// Answer the next `n` IMDS requests with `status` (404 while an identity is being set up,
    /// 410 while IMDS is being updated, as the managed-identity guidance describes).
    pub fn fail_next_with(&self, n: u64, status: u16) {
        self.inner.fail_status.store(status, Ordering::SeqCst);
        self.inner.fail_next.store(n, Ordering::SeqCst);
    }

    /// Hold every Entra answer `ms` milliseconds from now on.
    pub fn delay(&self, ms: u64) {
        self.inner.delay_ms.store(ms, Ordering::SeqCst);
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.inner.log.lock().unwrap().clone()
    }

    pub fn count(&self) -> usize {
        self.inner.log.lock().unwrap().len()
    }
}

fn error(status: StatusCode, code: &str, description: &str) -> Response {
    (
        status,
        Json(serde_json::json!({"error": code, "error_description": description})),
    )
        .into_response()
}

async fn entra(
    State(s): State<Arc<Inner>>,
    Path(tenant): Path<String>,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    let proof = if form.contains_key("client_assertion") {
        Some("assertion")
    } else if form.contains_key("client_secret") {
        Some("secret")
    } else {
        None
    };
    s.log.lock().unwrap().push(Recorded {
        endpoint: "entra",
        tenant: Some(tenant.clone()),
        grant_type: form.get("grant_type").cloned(),
        client_id: form.get("client_id").cloned(),
        proof,
        scope: form.get("scope").cloned(),
        assertion: form.get("client_assertion").cloned(),
        resource: None,
        msi_res_id: None,
        mi_res_id: None,
    });
    let delay = s.delay_ms.load(Ordering::SeqCst);
    if delay > 0 {
        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
    }
    if s.reject.load(Ordering::SeqCst) {
        return error(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            "AADSTS7000215: Invalid client secret provided.",
        );
    }
    if tenant != s.config.tenant {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "AADSTS90002: Tenant not found.",
        );
    }
    if form.get("grant_type").map(String::as_str) != Some("client_credentials")
        || form.get("client_id") != Some(&s.config.client_id)
    {
        return error(
            StatusCode::BAD_REQUEST,
            "unauthorized_client",
            "AADSTS700016: Application not found.",
        );
    }
    let ok = match proof {
        Some("secret") => form.get("client_secret") == Some(&s.config.client_secret),
        Some(_) => {
            // A rotated token file keeps the prefix the test configured.
            form.get("client_assertion").is_some_and(|a| {
                !s.config.federated_token.is_empty() && a.starts_with(&s.config.federated_token)
            }) && form.get("client_assertion_type").map(String::as_str)
                == Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
        }
        None => false,
    };
    if !ok {
        return error(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            "AADSTS7000215: Invalid client secret provided.",
        );
    }
    let n = s.counter.fetch_add(1, Ordering::SeqCst) + 1;
    let expires_in = s.expires_in.load(Ordering::SeqCst).max(0);
    Json(serde_json::json!({
        "token_type": "Bearer",
        "expires_in": expires_in,
        "ext_expires_in": expires_in,
        "access_token": format!("entra-{n}"),
    }))
    .into_response()
}

async fn imds(
    State(s): State<Arc<Inner>>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    s.log.lock().unwrap().push(Recorded {
        endpoint: "imds",
        tenant: None,
        grant_type: None,
        client_id: q.get("client_id").cloned(),
        proof: None,
        scope: None,
        assertion: None,
        resource: q.get("resource").cloned(),
        msi_res_id: q.get("msi_res_id").cloned(),
        mi_res_id: q.get("mi_res_id").cloned(),
    });
    if headers.get("metadata").and_then(|v| v.to_str().ok()) != Some("true") {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "Required metadata header not specified",
        );
    }
    if s.fail_next
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
    {
        let status = StatusCode::from_u16(s.fail_status.load(Ordering::SeqCst))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        return error(status, "unknown", "IMDS is warming up");
    }
    if s.reject.load(Ordering::SeqCst) {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "rejected by the test",
        );
    }
    let Some(resource) = q.get("resource") else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "resource is required",
        );
    };
    let wanted = q
        .get("client_id")
        .or_else(|| q.get("msi_res_id"))
        .or_else(|| q.get("mi_res_id"));
    if let Some(id) = wanted {
        if !s.config.identities.contains(id) {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "Identity not found",
            );
        }
    }
    let n = s.counter.fetch_add(1, Ordering::SeqCst) + 1;
    let expires_in = s.expires_in.load(Ordering::SeqCst);
    let expires_on = time::OffsetDateTime::now_utc().unix_timestamp() + expires_in;
    Json(serde_json::json!({
        "access_token": format!("imds-{n}"),
        "expires_in": expires_in.max(0).to_string(),
        "expires_on": expires_on.to_string(),
        "resource": resource,
        "token_type": "Bearer",
    }))
    .into_response()
}
