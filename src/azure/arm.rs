//! `GalleryApi` over azure_mgmt_compute 0.21.
//!
//! Every request goes through the SDK's generated builders with `.send()` (never the builders'
//! own long-running-operation loop, which re-sends PUTs and misreads provisioning states; see
//! REFERENCE.md). On top of that this adapter adds, in one place each:
//! - the retry policy (`Retry::decide`): 429, 408, 5xx and connection failures, bounded exponential
//!   backoff with jitter, honouring `Retry-After`;
//! - long-running operations: a write is sent once, then `Azure-AsyncOperation` is polled, else
//!   `Location`, else the resource's own `provisioningState`, within an overall timeout;
//! - error mapping that keeps Azure's code, target and message. The SDK's `HttpError` exposes code
//!   and message but not `target` nor `Retry-After`, so the transport (`CapturingTransport`) records
//!   the last error response of the current task before handing it on to the SDK.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use azure_core::auth::TokenCredential;
use azure_mgmt_compute::package_2024_07_01::{models, Client, ClientBuilder};
use futures::StreamExt;
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::error::error_chain;
use crate::gallery::error::{AzureError, Error, Result};
use crate::gallery::latest::ImageRef;
use crate::gallery::model::*;
use crate::gallery::GalleryApi;

/// Knobs for retries and waiting.
#[derive(Debug, Clone)]
pub struct ArmOptions {
    /// Retries of one request on transient failures.
    pub max_retries: u32,
    /// First backoff; doubles per retry, with jitter, capped at `max_backoff`.
    pub base_backoff: Duration,
    pub max_backoff: Duration,
    /// Timeout of one HTTP request.
    pub request_timeout: Duration,
    /// Overall time a long-running operation may take (replication can take an hour).
    pub operation_timeout: Duration,
    /// Poll interval when Azure gives no Retry-After.
    pub poll_interval: Duration,
    /// Extra CA certificates to trust (settings `ca_bundles`).
    pub ca_bundles: Vec<crate::azure::tls::CaBundle>,
    /// The scope ARM tokens are asked for: the settings' `token_scope` (the configured cloud's
    /// audience, e.g. Azure Stack's `https://management.adfs.azurestack.local/<id>`, which is not
    /// the ARM endpoint). `None` only where no settings exist (tests): the endpoint's `.default`.
    pub token_scope: Option<String>,
}

impl Default for ArmOptions {
    fn default() -> Self {
        Self {
            max_retries: 6,
            base_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            operation_timeout: Duration::from_secs(60 * 60),
            poll_interval: Duration::from_secs(5),
            ca_bundles: Vec::new(),
            token_scope: None,
        }
    }
}

/// What the transport saw of the last error response in this task.
#[derive(Debug, Clone, Default)]
struct Captured {
    status: u16,
    code: Option<String>,
    message: Option<String>,
    target: Option<String>,
    retry_after: Option<Duration>,
}

tokio::task_local! {
    static CAPTURE: RefCell<Option<Captured>>;
}

/// Azure's clock as its answers show it: every ARM response carries a `Date` header (RFC 9110
/// §6.6.1; present in every response of the recorded SDK sessions REFERENCE.md draws on). The
/// latest one seen, with the local instant it was seen at, so `now()` advances with the
/// monotonic clock rather than the (possibly skewed) wall clock.
#[derive(Debug, Default)]
pub(crate) struct ServerClock {
    seen: std::sync::Mutex<Option<(OffsetDateTime, std::time::Instant)>>,
}

impl ServerClock {
    fn observe(&self, date: Option<&str>) {
        let Some(date) = date.and_then(|d| azure_core::date::parse_rfc1123(d.trim()).ok()) else {
            return;
        };
        if let Ok(mut seen) = self.seen.lock() {
            *seen = Some((date, std::time::Instant::now()));
        }
    }

    fn now(&self) -> Option<OffsetDateTime> {
        let seen = *self.seen.lock().ok()?;
        seen.map(|(date, at)| date + at.elapsed())
    }
}

/// A transport that delegates to reqwest and records error responses for the caller.
#[derive(Debug)]
struct CapturingTransport {
    inner: reqwest::Client,
    /// No response headers within this time: the attempt fails (and is retried as transient).
    timeout: Duration,
    /// Where the `Date` header of every response goes.
    clock: Arc<ServerClock>,
}

/// The error of a request that got no response in time.
fn timed_out(timeout: Duration) -> String {
    format!(
        "no response within {} (the per-request timeout; set {HTTP_TIMEOUT_ENV} to change it)",
        seconds(timeout)
    )
}

fn seconds(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// Environment variable: seconds one HTTP request (ARM, or one blob attempt) may take.
pub const HTTP_TIMEOUT_ENV: &str = "STEMCELL_GALLERY_HTTP_TIMEOUT";
/// Environment variable: seconds a long-running operation (and replication) may take.
pub const OPERATION_TIMEOUT_ENV: &str = "STEMCELL_GALLERY_OPERATION_TIMEOUT";

/// A duration in seconds (decimals allowed) from the environment; `None` when unset. A value that
/// is not a positive number is refused rather than ignored.
pub fn env_seconds(name: &str) -> anyhow::Result<Option<Duration>> {
    let Ok(v) = std::env::var(name) else {
        return Ok(None);
    };
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 7.0 * 24.0 * 3600.0 => {
            Ok(Some(Duration::from_secs_f64(s)))
        }
        _ => anyhow::bail!("{name}={v:?} is not a number of seconds (e.g. 60 or 0.5)"),
    }
}

#[async_trait::async_trait]
impl azure_core::HttpClient for CapturingTransport {
    async fn execute_request(
        &self,
        request: &azure_core::Request,
    ) -> azure_core::Result<azure_core::Response> {
        let timeout = self.timeout;
        let response = tokio::time::timeout(timeout, self.inner.execute_request(request))
            .await
            .map_err(|_| {
                azure_core::Error::with_message(azure_core::error::ErrorKind::Io, move || {
                    timed_out(timeout)
                })
            })??;
        self.clock.observe(
            response
                .headers()
                .get_optional_str(&azure_core::headers::DATE),
        );
        let status: u16 = response.status().into();
        if status < 400 {
            return Ok(response);
        }
        let (status_code, headers, body) = response.deconstruct();
        let bytes = tokio::time::timeout(timeout, body.collect())
            .await
            .map_err(|_| {
                azure_core::Error::with_message(azure_core::error::ErrorKind::Io, move || {
                    timed_out(timeout)
                })
            })??;
        let mut captured = parse_error_body(status, &bytes);
        captured.retry_after = headers
            .get_optional_str(&azure_core::headers::RETRY_AFTER)
            .and_then(parse_retry_after);
        let _ = CAPTURE.try_with(|c| *c.borrow_mut() = Some(captured));
        let stream: std::pin::Pin<
            Box<dyn futures::Stream<Item = azure_core::Result<bytes::Bytes>> + Send + Sync>,
        > = Box::pin(futures::stream::once(async move { Ok(bytes) }));
        Ok(azure_core::Response::new(status_code, headers, stream))
    }
}

fn parse_error_body(status: u16, bytes: &[u8]) -> Captured {
    let v: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
    let e = v.get("error").unwrap_or(&v);
    let s = |k: &str| e.get(k).and_then(Value::as_str).map(str::to_string);
    Captured {
        status,
        code: s("code"),
        message: s("message"),
        target: s("target"),
        retry_after: None,
    }
}

fn parse_retry_after(v: &str) -> Option<Duration> {
    v.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// The retry policy, one function: what to do after a failed attempt.
enum Retry {
    After(Duration),
    GiveUp,
}

impl Retry {
    fn decide(failure: &Failure, attempt: u32, opts: &ArmOptions) -> Retry {
        if attempt >= opts.max_retries {
            return Retry::GiveUp;
        }
        let transient = match failure {
            Failure::Http(c) => c.status == 429 || c.status == 408 || c.status >= 500,
            // A certificate the client does not trust fails the same way every time.
            Failure::Transport(m) => !crate::azure::tls::is_certificate_failure(m),
        };
        if !transient {
            return Retry::GiveUp;
        }
        let backoff = backoff(attempt, opts);
        let wait = match failure {
            Failure::Http(Captured {
                retry_after: Some(ra),
                ..
            }) => (*ra).max(backoff / 4),
            _ => backoff,
        };
        Retry::After(wait.min(opts.max_backoff.max(Duration::from_secs(1))))
    }
}

fn backoff(attempt: u32, opts: &ArmOptions) -> Duration {
    let exp = opts
        .base_backoff
        .saturating_mul(1u32 << attempt.min(16))
        .min(opts.max_backoff);
    // Full jitter in [exp/2, exp].
    let half = exp / 2;
    half + half.mul_f64(rand::random::<f64>())
}

/// Whether the transport may re-send a request after a transient failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resend {
    AfterTransientFailure,
    Never,
}

enum Failure {
    Http(Captured),
    Transport(String),
}

/// The ARM adapter for one gallery.
pub struct ArmGallery {
    client: Client,
    /// The ARM endpoint (for calls made without the SDK, such as the permissions list).
    endpoint: url::Url,
    http: reqwest::Client,
    credential: Arc<dyn TokenCredential>,
    scopes: Vec<String>,
    gallery: GalleryRef,
    opts: ArmOptions,
    /// Subscriptions besides the gallery's whose consumers are read.
    consumer_subscriptions: Vec<String>,
    /// Azure's clock, from the `Date` headers the transport and `raw_get` see.
    clock: Arc<ServerClock>,
}

impl ArmGallery {
    pub fn new(
        endpoint: &url::Url,
        credential: Arc<dyn TokenCredential>,
        gallery: GalleryRef,
        opts: ArmOptions,
    ) -> anyhow::Result<Self> {
        // The transport's own timeout says what happened; reqwest's (a little longer) also bounds
        // reading a body that stalls after the headers.
        let http = crate::azure::tls::with_roots(reqwest::Client::builder(), &opts.ca_bundles)
            .timeout(opts.request_timeout + opts.request_timeout / 2)
            .connect_timeout(Duration::from_secs(15).min(opts.request_timeout))
            .build()?;
        let clock = Arc::new(ServerClock::default());
        let transport = azure_core::TransportOptions::new(Arc::new(CapturingTransport {
            inner: http.clone(),
            timeout: opts.request_timeout,
            clock: clock.clone(),
        }));
        // The configured audience's scope (issue 16: deriving it from the endpoint made every
        // command 401 on Azure Stack while doctor, which asked for the configured one, passed).
        let scope = opts
            .token_scope
            .clone()
            .unwrap_or_else(|| crate::azure::cloud::scope_for(endpoint.as_str()));
        let client = ClientBuilder::new(credential.clone())
            .endpoint(endpoint.clone())
            .scopes(&[scope.as_str()])
            .retry(azure_core::RetryOptions::none())
            .transport(transport)
            .build()?;
        Ok(Self {
            client,
            endpoint: endpoint.clone(),
            http,
            credential,
            scopes: vec![scope],
            gallery,
            opts,
            consumer_subscriptions: Vec::new(),
            clock,
        })
    }

    pub fn gallery(&self) -> &GalleryRef {
        &self.gallery
    }

    /// Run one SDK request with the retry policy. `f` builds and sends the request afresh.
    async fn call<T, F, Fut>(&self, operation: &'static str, resource: &str, f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = azure_core::Result<T>>,
    {
        self.call_resending(operation, resource, Resend::AfterTransientFailure, f)
            .await
    }

    /// Run one SDK request; after a transient failure (429, 408, 5xx, timeout, dropped
    /// connection) it is re-sent only when `resend` says so. A write whose effect depends on what
    /// was read before it (a DELETE decided on a version's state, a tag write that replaces the
    /// whole tag set) is sent with `Resend::Never`: the failure goes back to the caller, which
    /// observes again under its lock before sending anything (a 401 is still retried once with a
    /// fresh token: Azure did not act on it).
    async fn call_resending<T, F, Fut>(
        &self,
        operation: &'static str,
        resource: &str,
        resend: Resend,
        f: F,
    ) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = azure_core::Result<T>>,
    {
        let mut attempt = 0;
        let mut token_refreshed = false;
        loop {
            let (result, captured) = CAPTURE
                .scope(RefCell::new(None), async {
                    let r = f().await;
                    (r, CAPTURE.with(|c| c.borrow_mut().take()))
                })
                .await;
            let err = match result {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            let failure = match (err.kind(), captured) {
                (azure_core::error::ErrorKind::HttpResponse { .. }, Some(c)) => Failure::Http(c),
                (azure_core::error::ErrorKind::HttpResponse { status, error_code }, None) => {
                    Failure::Http(Captured {
                        status: (*status).into(),
                        code: error_code.clone(),
                        ..Default::default()
                    })
                }
                _ => Failure::Transport(error_chain(&err)),
            };
            if is_unauthorized(&failure) && !token_refreshed {
                token_refreshed = true;
                self.refresh_token(operation, resource).await;
                continue;
            }
            match Retry::decide(&failure, attempt, &self.opts) {
                Retry::After(_) if resend == Resend::Never => {
                    tracing::debug!(
                        operation,
                        resource,
                        "transient failure of a request that is not re-sent blindly; the caller observes again"
                    );
                    return Err(to_error(operation, resource, failure));
                }
                Retry::After(wait) => {
                    tracing::debug!(
                        operation,
                        resource,
                        attempt,
                        ?wait,
                        "transient failure, retrying"
                    );
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Retry::GiveUp => return Err(to_error(operation, resource, failure)),
            }
        }
    }

    /// Whether an error is a 404 (the resource is absent).
    fn is_not_found(e: &Error) -> bool {
        matches!(e, Error::Azure { azure, .. } if azure.status == 404)
    }

    /// A 401: the cached token may have expired or been revoked. Drop it so the next request
    /// asks the identity provider for a fresh one (done once per request).
    async fn refresh_token(&self, operation: &'static str, resource: &str) {
        tracing::info!(
            operation,
            resource,
            "Azure answered 401; getting a fresh token and retrying once"
        );
        if let Err(e) = self.credential.clear_cache().await {
            tracing::warn!(error = %e, "could not clear the cached token");
        }
    }

    async fn raw_get(
        &self,
        url: &str,
        operation: &'static str,
        resource: &str,
    ) -> Result<(u16, Value, Option<Duration>)> {
        let mut attempt = 0;
        let mut token_refreshed = false;
        loop {
            let token = self
                .credential
                .get_token(&self.scopes.iter().map(String::as_str).collect::<Vec<_>>())
                .await
                .map_err(|e| Error::Transport {
                    operation,
                    resource: resource.to_string(),
                    message: crate::azure::tls::explain(format!(
                        "could not get a token: {}",
                        error_chain(&e)
                    )),
                })?;
            let timeout = self.opts.request_timeout;
            let sent = tokio::time::timeout(timeout, async {
                let resp = self
                    .http
                    .get(url)
                    .bearer_auth(token.token.secret())
                    .send()
                    .await?;
                let status = resp.status().as_u16();
                self.clock.observe(
                    resp.headers()
                        .get(reqwest::header::DATE)
                        .and_then(|v| v.to_str().ok()),
                );
                let retry_after = resp
                    .headers()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .and_then(parse_retry_after);
                let bytes = resp.bytes().await?;
                Ok::<_, reqwest::Error>((status, retry_after, bytes))
            })
            .await;
            let failure = match sent {
                Ok(Ok((status, retry_after, bytes))) => {
                    if status < 400 || status == 404 {
                        let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                        return Ok((status, v, retry_after));
                    }
                    let mut c = parse_error_body(status, &bytes);
                    c.retry_after = retry_after;
                    Failure::Http(c)
                }
                Ok(Err(e)) => Failure::Transport(error_chain(&e)),
                Err(_) => Failure::Transport(timed_out(timeout)),
            };
            if is_unauthorized(&failure) && !token_refreshed {
                token_refreshed = true;
                self.refresh_token(operation, resource).await;
                continue;
            }
            match Retry::decide(&failure, attempt, &self.opts) {
                Retry::After(wait) => {
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                Retry::GiveUp => return Err(to_error(operation, resource, failure)),
            }
        }
    }

    fn poll_wait(&self, retry_after: Option<Duration>) -> Duration {
        match retry_after {
            Some(d) => d.max(Duration::from_millis(20)),
            None => self.opts.poll_interval,
        }
    }

    /// Follow a long-running operation to its end: Azure-AsyncOperation, else Location, else the
    /// resource's provisioningState (read by `get_state`).
    async fn wait_operation<G, GFut>(
        &self,
        operation: &'static str,
        resource: &str,
        op: &Operation,
        get_state: G,
    ) -> Result<()>
    where
        G: Fn() -> GFut,
        GFut: std::future::Future<Output = Result<Option<ProvisioningState>>>,
    {
        let started = tokio::time::Instant::now();
        let async_op = op.async_operation_url.clone();
        let location = op.location_url.clone();
        let mut retry_after = op.retry_after_secs.map(Duration::from_secs);
        let mut last = "InProgress".to_string();
        loop {
            if started.elapsed() > self.opts.operation_timeout {
                return Err(Error::Timeout {
                    operation,
                    resource: resource.to_string(),
                    seconds: self.opts.operation_timeout.as_secs(),
                    state: last,
                });
            }
            tokio::time::sleep(self.poll_wait(retry_after)).await;
            if let Some(url) = &async_op {
                let (status, body, ra) = self.raw_get(url, operation, resource).await?;
                retry_after = ra;
                let st = body.get("status").and_then(Value::as_str).unwrap_or("");
                last = st.to_string();
                match st.to_ascii_lowercase().as_str() {
                    "succeeded" => return Ok(()),
                    "failed" | "canceled" | "cancelled" => {
                        let e = body.get("error").cloned().unwrap_or(Value::Null);
                        return Err(Error::OperationFailed {
                            operation,
                            resource: resource.to_string(),
                            state: st.to_string(),
                            message: describe_error_value(&e),
                        });
                    }
                    _ if status == 404 => return Ok(()),
                    _ => continue,
                }
            } else if let Some(url) = &location {
                let (status, _, ra) = self.raw_get(url, operation, resource).await?;
                retry_after = ra;
                if status != 202 {
                    return Ok(());
                }
            } else {
                match get_state().await? {
                    None => return Ok(()),
                    Some(ProvisioningState::Creating)
                    | Some(ProvisioningState::Updating)
                    | Some(ProvisioningState::Deleting)
                    | Some(ProvisioningState::Migrating) => continue,
                    Some(_) => return Ok(()),
                }
            }
        }
    }
}

fn is_unauthorized(f: &Failure) -> bool {
    matches!(f, Failure::Http(c) if c.status == 401)
}

fn operation_from(
    operation: &str,
    definition: &str,
    version: &str,
    headers: &azure_core::headers::Headers,
) -> Operation {
    Operation {
        operation: operation.to_string(),
        definition: definition.to_string(),
        version: version.to_string(),
        async_operation_url: headers
            .get_optional_str(&azure_core::headers::HeaderName::from_static(
                "azure-asyncoperation",
            ))
            .map(str::to_string),
        location_url: headers
            .get_optional_str(&azure_core::headers::LOCATION)
            .map(str::to_string),
        retry_after_secs: headers
            .get_optional_str(&azure_core::headers::RETRY_AFTER)
            .and_then(|v| v.trim().parse().ok()),
    }
}

fn to_error(operation: &'static str, resource: &str, failure: Failure) -> Error {
    match failure {
        Failure::Http(c) => Error::azure(
            operation,
            resource,
            AzureError {
                status: c.status,
                code: c.code.unwrap_or_else(|| "Unknown".into()),
                message: c.message.unwrap_or_default(),
                target: c.target,
                retry_after_secs: c
                    .retry_after
                    .map(|d| u16::try_from(d.as_secs()).unwrap_or(u16::MAX)),
            },
        ),
        Failure::Transport(message) => Error::Transport {
            operation,
            resource: resource.to_string(),
            message: crate::azure::tls::explain(message),
        },
    }
}

fn describe_error_value(e: &Value) -> String {
    let code = e.get("code").and_then(Value::as_str).unwrap_or("Unknown");
    let msg = e.get("message").and_then(Value::as_str).unwrap_or("");
    format!("{code}: {msg}")
}

fn sdk_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// Every item of a paged SDK list (following `nextLink`), as JSON.
async fn all_pages<P, T: serde::Serialize>(
    mut pages: azure_core::Pageable<P, azure_core::Error>,
    items: fn(P) -> Vec<T>,
) -> azure_core::Result<Vec<Value>> {
    let mut out = Vec::new();
    while let Some(page) = pages.next().await {
        out.extend(items(page?).iter().map(sdk_json));
    }
    Ok(out)
}

async fn body_json(resp: azure_core::Response) -> azure_core::Result<Value> {
    let bytes = resp.into_body().collect().await?;
    Ok(serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str()
}

fn tags_of(v: &Value) -> BTreeMap<String, String> {
    v.get("tags")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// Map an image version's JSON (as Azure returns it) to the domain type.
pub fn version_from_json(v: &Value) -> ImageVersion {
    let id = str_at(v, &["id"]).unwrap_or_default().to_string();
    let definition = id
        .split("/images/")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap_or_default()
        .to_string();
    let p = v.get("properties").cloned().unwrap_or(Value::Null);
    let pp = p.get("publishingProfile").cloned().unwrap_or(Value::Null);
    let src = p
        .pointer("/storageProfile/osDiskImage/source")
        .cloned()
        .unwrap_or(Value::Null);
    let target_regions = pp
        .get("targetRegions")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|r| TargetRegion {
                    name: str_at(r, &["name"]).unwrap_or_default().to_string(),
                    replicas: r
                        .get("regionalReplicaCount")
                        .and_then(Value::as_u64)
                        .map(|n| n as u32),
                    storage_account_type: str_at(r, &["storageAccountType"]).map(str::to_string),
                    exclude_from_latest: r.get("excludeFromLatest").and_then(Value::as_bool),
                })
                .collect()
        })
        .unwrap_or_default();
    let replication = p.get("replicationStatus").map(|r| ReplicationStatus {
        aggregated_state: str_at(r, &["aggregatedState"])
            .unwrap_or("Unknown")
            .to_string(),
        summary: r
            .get("summary")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|s| RegionReplication {
                        region: str_at(s, &["region"]).unwrap_or_default().to_string(),
                        state: str_at(s, &["state"]).unwrap_or("Unknown").to_string(),
                        progress: s.get("progress").and_then(Value::as_u64).map(|n| n as u32),
                        details: str_at(s, &["details"]).map(str::to_string),
                    })
                    .collect()
            })
            .unwrap_or_default(),
    });
    ImageVersion {
        version: str_at(v, &["name"]).unwrap_or_default().to_string(),
        definition,
        id,
        location: str_at(v, &["location"]).unwrap_or_default().to_string(),
        provisioning_state: ProvisioningState::parse(
            str_at(&p, &["provisioningState"]).unwrap_or("Unknown"),
        ),
        tags: tags_of(v),
        source_uri: str_at(&src, &["uri"]).map(str::to_string),
        storage_account_id: str_at(&src, &["storageAccountId"]).map(str::to_string),
        published_date: str_at(&pp, &["publishedDate"]).and_then(|s| {
            OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
        }),
        target_regions,
        exclude_from_latest: pp
            .get("excludeFromLatest")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        replication,
    }
}

/// Map an image definition's JSON to the domain type.
pub fn definition_from_json(v: &Value) -> ImageDefinition {
    let p = v.get("properties").cloned().unwrap_or(Value::Null);
    let features = p
        .get("features")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| {
                    Some((
                        str_at(f, &["name"])?.to_string(),
                        str_at(f, &["value"]).unwrap_or_default().to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    ImageDefinition {
        id: str_at(v, &["id"]).unwrap_or_default().to_string(),
        name: str_at(v, &["name"]).unwrap_or_default().to_string(),
        location: str_at(v, &["location"]).unwrap_or_default().to_string(),
        publisher: str_at(&p, &["identifier", "publisher"])
            .unwrap_or_default()
            .to_string(),
        offer: str_at(&p, &["identifier", "offer"])
            .unwrap_or_default()
            .to_string(),
        sku: str_at(&p, &["identifier", "sku"])
            .unwrap_or_default()
            .to_string(),
        os_type: str_at(&p, &["osType"]).unwrap_or_default().to_string(),
        os_state: str_at(&p, &["osState"]).unwrap_or_default().to_string(),
        architecture: str_at(&p, &["architecture"]).map(str::to_string),
        generation: str_at(&p, &["hyperVGeneration"]).map(str::to_string),
        features,
        tags: tags_of(v),
        provisioning_state: ProvisioningState::parse(
            str_at(&p, &["provisioningState"]).unwrap_or("Unknown"),
        ),
    }
}

/// One `publishingProfile.targetRegions` entry (the REST shape).
fn region_json(r: &TargetRegion) -> Value {
    let mut o = json!({"name": r.name});
    if let Some(n) = r.replicas {
        o["regionalReplicaCount"] = json!(n);
    }
    if let Some(t) = &r.storage_account_type {
        o["storageAccountType"] = json!(t);
    }
    if let Some(x) = r.exclude_from_latest {
        o["excludeFromLatest"] = json!(x);
    }
    o
}

/// The JSON body of a new image version (the REST shape).
pub fn version_body(spec: &VersionSpec) -> Value {
    let regions: Vec<Value> = spec.target_regions.iter().map(region_json).collect();
    let mut publishing = json!({
        "targetRegions": regions,
        "excludeFromLatest": spec.exclude_from_latest,
    });
    if let Some(n) = spec.replica_count {
        publishing["replicaCount"] = json!(n);
    }
    if let Some(eol) = &spec.end_of_life {
        publishing["endOfLifeDate"] = json!(eol);
    }
    json!({
        "location": spec.location,
        "tags": spec.tags,
        "properties": {
            "publishingProfile": publishing,
            "storageProfile": {
                "osDiskImage": {
                    "hostCaching": "ReadWrite",
                    "source": {"uri": spec.source_uri, "storageAccountId": spec.storage_account_id}
                }
            }
        }
    })
}

/// The JSON body of a new image definition.
pub fn definition_body(spec: &DefinitionSpec) -> Value {
    let features: Vec<Value> = spec
        .features
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    json!({
        "location": spec.location,
        "tags": spec.tags,
        "properties": {
            "osType": "Linux",
            "osState": "Generalized",
            "hyperVGeneration": spec.generation.as_azure(),
            "architecture": spec.architecture.as_azure(),
            "identifier": {"publisher": spec.publisher, "offer": spec.offer, "sku": spec.sku},
            "features": features,
        }
    })
}

fn from_value<T: serde::de::DeserializeOwned>(v: Value, what: &str) -> Result<T> {
    serde_json::from_value(v)
        .map_err(|e| Error::RequestBuild {
            what: what.to_string(),
            message: e.to_string(),
        })
}

/// The gallery image references a consumer records at `base` (an `imageReference` or a disk's
/// `creationData.galleryImageReference` / `creationData.imageReference`): `id` (a version, a
/// definition for `latest`, `.../versions/latest`), `sharedGalleryImageId` and
/// `communityGalleryImageId` — the three forms of ComputeRP's `ImageReference` and DiskRP's
/// `ImageDiskReference` (azure-rest-api-specs, api 2024-07-01; `azure_mgmt_compute` 0.21 models).
/// `exactVersion` is read-only and set by Azure when `latest` was asked for (ComputeRP
/// `ImageReference.exactVersion`). Anything that is not a gallery image (a managed or Marketplace
/// image) is skipped.
fn consumers_at(kind: ConsumerKind, v: &Value, base: &str, out: &mut Vec<Consumer>) {
    let Some(reference) = v.pointer(base) else {
        return;
    };
    let id = str_at(v, &["id"]).unwrap_or_default();
    let location = str_at(v, &["location"])
        .map(str::to_string)
        .filter(|l| !l.trim().is_empty());
    let exact_version = reference
        .get("exactVersion")
        .and_then(Value::as_str)
        .map(str::to_string)
        .filter(|e| !e.trim().is_empty());
    for field in ["id", "sharedGalleryImageId", "communityGalleryImageId"] {
        let Some(image) = reference.get(field).and_then(Value::as_str) else {
            continue;
        };
        if ImageRef::parse(image).is_none() {
            continue;
        }
        out.push(Consumer {
            kind: kind.clone(),
            id: id.to_string(),
            image_id: image.to_string(),
            location: location.clone(),
            exact_version: exact_version.clone(),
        });
    }
}

impl ArmGallery {
    /// The gallery's own region: `Ok(None)` when the gallery does not exist, `Ok(Some(None))` when
    /// it reports none. One GET of the gallery, with the same retries, token refresh and timeout
    /// as every call.
    pub async fn gallery_region(&self) -> Result<Option<Option<String>>> {
        let g = &self.gallery;
        let r = self
            .call("read", &g.id(), || async {
                let resp = self
                    .client
                    .galleries_client()
                    .get(&g.subscription, &g.resource_group, &g.gallery)
                    .send()
                    .await?;
                body_json(resp.into_raw_response()).await
            })
            .await;
        match r {
            Ok(v) => Ok(Some(
                str_at(&v, &["location"])
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_string),
            )),
            Err(e) if Self::is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl ArmGallery {
    /// Prove the identity sees every consumer of `subscription`: its effective permissions at the
    /// subscription scope must grant every read the consumer scan makes (see `azure::permissions`).
    /// Anything else — fewer permissions, a 403 on the permissions list, a body that is not the
    /// permissions document — is [`Error::PartialView`].
    pub async fn check_consumer_view(&self, subscription: &str) -> Result<()> {
        use super::permissions::{self as perms, CONSUMER_READ_ACTIONS, PERMISSIONS_API_VERSION};
        let scope = format!("/subscriptions/{subscription}");
        let needed = CONSUMER_READ_ACTIONS.join(", ");
        let partial = |why: String| Error::PartialView {
            scope: scope.clone(),
            why,
            needed: needed.clone(),
        };
        let mut url = format!(
            "{}{scope}/providers/Microsoft.Authorization/permissions?api-version={PERMISSIONS_API_VERSION}",
            self.endpoint.as_str().trim_end_matches('/')
        );
        let mut all = Vec::new();
        for _page in 0..100 {
            let (status, body) = match self.raw_get(&url, "read permissions at", &scope).await {
                Ok((status, body, _)) => (status, body),
                Err(Error::Azure { azure, .. }) if azure.status == 403 => {
                    return Err(partial(format!(
                        "the identity may not read its own permissions there ({})",
                        azure.code
                    )))
                }
                Err(e) => return Err(e),
            };
            if status == 404 {
                return Err(partial(
                    "the permissions list of that scope was not found".into(),
                ));
            }
            let page = perms::parse(&body).ok_or_else(|| {
                partial("the permissions list of that scope could not be read".into())
            })?;
            all.extend(page);
            match body.get("nextLink").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => url = next.to_string(),
                _ => {
                    let missing = perms::missing_consumer_reads(&all);
                    if missing.is_empty() {
                        return Ok(());
                    }
                    return Err(partial(format!(
                        "the identity's permissions at that scope lack {}",
                        missing.join(", ")
                    )));
                }
            }
        }
        Err(partial(
            "the permissions list of that scope did not end after 100 pages".into(),
        ))
    }
}

/// The api-version of `Microsoft.Storage` calls (Storage Accounts - List).
pub const STORAGE_API_VERSION: &str = "2023-05-01";

impl ArmGallery {
    /// The resource id of storage account `name` in `subscription`, as Azure has it
    /// (`Storage Accounts - List`, `GET /subscriptions/{s}/providers/Microsoft.Storage/
    /// storageAccounts`, every page; names compare case-insensitively). `None` when no account of
    /// that name is visible there: ARM filters the list to what the identity may read
    /// (`Microsoft.Storage/storageAccounts/read`, in deploy/azure/role-definition.json).
    pub async fn find_storage_account(
        &self,
        subscription: &str,
        name: &str,
    ) -> Result<Option<String>> {
        let scope = format!("/subscriptions/{subscription}");
        let mut url = format!(
            "{}{scope}/providers/Microsoft.Storage/storageAccounts?api-version={STORAGE_API_VERSION}",
            self.endpoint.as_str().trim_end_matches('/')
        );
        for _page in 0..100 {
            let (status, body, _) = self
                .raw_get(&url, "list the storage accounts of", &scope)
                .await?;
            if status == 404 {
                return Ok(None);
            }
            let found = body
                .get("value")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|a| str_at(a, &["name"]).is_some_and(|n| n.eq_ignore_ascii_case(name)))
                .and_then(|a| str_at(a, &["id"]).map(str::to_string));
            if found.is_some() {
                return Ok(found);
            }
            match body.get("nextLink").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => url = next.to_string(),
                _ => return Ok(None),
            }
        }
        Ok(None)
    }
}

#[async_trait::async_trait]
impl crate::gallery::service::GalleryLocation for ArmGallery {
    async fn gallery_location(&self) -> Result<String> {
        let id = self.gallery.id();
        match self.gallery_region().await? {
            Some(Some(l)) => Ok(l),
            None => Err(Error::NotFound(format!(
                "gallery {id} does not exist: create it (az sig create), or fix --subscription/--resource-group/--gallery"
            ))),
            Some(None) => Err(Error::GalleryWithoutLocation { gallery: id }),
        }
    }
}

#[async_trait::async_trait]
impl GalleryApi for ArmGallery {
    fn server_time(&self) -> Option<OffsetDateTime> {
        self.clock.now()
    }

    async fn gallery_exists(&self) -> Result<bool> {
        let g = &self.gallery;
        let r = self
            .call("read", &g.id(), || {
                self.client
                    .galleries_client()
                    .get(&g.subscription, &g.resource_group, &g.gallery)
                    .send()
            })
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if Self::is_not_found(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn get_definition(&self, name: &str) -> Result<Option<ImageDefinition>> {
        let g = &self.gallery;
        let id = g.definition_id(name);
        let r = self
            .call("read", &id, || async {
                let resp = self
                    .client
                    .gallery_images_client()
                    .get(&g.subscription, &g.resource_group, &g.gallery, name)
                    .send()
                    .await?;
                body_json(resp.into_raw_response()).await
            })
            .await;
        match r {
            Ok(v) => Ok(Some(definition_from_json(&v))),
            Err(e) if Self::is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list_definitions(&self) -> Result<Vec<ImageDefinition>> {
        let g = &self.gallery;
        self.call("list", &format!("{}/images", g.id()), || async {
            let mut out = Vec::new();
            let mut pages = self
                .client
                .gallery_images_client()
                .list_by_gallery(&g.subscription, &g.resource_group, &g.gallery)
                .into_stream();
            while let Some(page) = pages.next().await {
                for d in page?.value {
                    out.push(definition_from_json(&sdk_json(&d)));
                }
            }
            Ok(out)
        })
        .await
    }

    async fn create_definition(&self, spec: &DefinitionSpec) -> Result<ImageDefinition> {
        let g = &self.gallery;
        let id = g.definition_id(&spec.name);
        let model: models::GalleryImage = from_value(definition_body(spec), "image definition")?;
        let resp = self
            .call("create", &id, || {
                self.client
                    .gallery_images_client()
                    .create_or_update(
                        &g.subscription,
                        &g.resource_group,
                        &g.gallery,
                        &spec.name,
                        model.clone(),
                    )
                    .send()
            })
            .await?;
        let op = operation_from("create", &spec.name, "", resp.as_raw_response().headers());
        self.wait_operation("create", &id, &op, || async {
            Ok(self
                .get_definition(&spec.name)
                .await?
                .map(|d| d.provisioning_state))
        })
        .await?;
        self.get_definition(&spec.name).await?.ok_or_else(|| {
            Error::NotFound(format!(
                "image definition {id} vanished right after it was created"
            ))
        })
    }

    async fn get_version(
        &self,
        definition: &str,
        version: &str,
        with_replication: bool,
    ) -> Result<Option<ImageVersion>> {
        let g = &self.gallery;
        let id = g.version_id(definition, version);
        let r = self
            .call("read", &id, || async {
                let mut b = self.client.gallery_image_versions_client().get(
                    &g.subscription,
                    &g.resource_group,
                    &g.gallery,
                    definition,
                    version,
                );
                if with_replication {
                    b = b.expand("ReplicationStatus");
                }
                body_json(b.send().await?.into_raw_response()).await
            })
            .await;
        match r {
            Ok(v) => Ok(Some(version_from_json(&v))),
            Err(e) if Self::is_not_found(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list_versions(&self, definition: &str) -> Result<Vec<ImageVersion>> {
        let g = &self.gallery;
        self.call(
            "list",
            &format!("{}/versions", g.definition_id(definition)),
            || async {
                let mut out = Vec::new();
                let mut pages = self
                    .client
                    .gallery_image_versions_client()
                    .list_by_gallery_image(
                        &g.subscription,
                        &g.resource_group,
                        &g.gallery,
                        definition,
                    )
                    .into_stream();
                while let Some(page) = pages.next().await {
                    for v in page?.value {
                        out.push(version_from_json(&sdk_json(&v)));
                    }
                }
                Ok(out)
            },
        )
        .await
    }

    async fn begin_create_version(&self, spec: &VersionSpec) -> Result<Operation> {
        let g = &self.gallery;
        let id = g.version_id(&spec.definition, &spec.version);
        let model: models::GalleryImageVersion = from_value(version_body(spec), "image version")?;
        // Re-sent only after a transient failure. A PUT that did reach Azure and is re-sent meets
        // either "operation in progress" (409), which the caller resolves by observing again, or
        // the identical body, which changes nothing.
        let resp = self
            .call("create", &id, || {
                self.client
                    .gallery_image_versions_client()
                    .create_or_update(
                        &g.subscription,
                        &g.resource_group,
                        &g.gallery,
                        &spec.definition,
                        &spec.version,
                        model.clone(),
                    )
                    .send()
            })
            .await?;
        Ok(operation_from(
            "create",
            &spec.definition,
            &spec.version,
            resp.as_raw_response().headers(),
        ))
    }

    async fn wait(&self, op: &Operation) -> Result<()> {
        let id = self.gallery.version_id(&op.definition, &op.version);
        let operation = match op.operation.as_str() {
            "delete" => "delete",
            "update" => "update",
            _ => "create",
        };
        self.wait_operation(operation, &id, op, || async {
            Ok(self
                .get_version(&op.definition, &op.version, false)
                .await?
                .map(|v| v.provisioning_state))
        })
        .await
    }

    async fn wait_version_settled(
        &self,
        definition: &str,
        version: &str,
    ) -> Result<Option<ImageVersion>> {
        let id = self.gallery.version_id(definition, version);
        let started = tokio::time::Instant::now();
        let mut delay = Duration::from_millis(50).min(self.opts.poll_interval);
        loop {
            let v = self.get_version(definition, version, true).await?;
            match &v {
                Some(x)
                    if matches!(
                        x.provisioning_state,
                        ProvisioningState::Creating
                            | ProvisioningState::Updating
                            | ProvisioningState::Deleting
                            | ProvisioningState::Migrating
                    ) =>
                {
                    if started.elapsed() > self.opts.operation_timeout {
                        return Err(Error::Timeout {
                            operation: "wait for",
                            resource: id,
                            seconds: self.opts.operation_timeout.as_secs(),
                            state: x.provisioning_state.to_string(),
                        });
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(self.opts.poll_interval);
                }
                _ => return Ok(v),
            }
        }
    }

    async fn set_version_tags(
        &self,
        definition: &str,
        version: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<ImageVersion> {
        // A tags PATCH replaces the whole tag set, references included. Re-sent after a lost
        // response it would overwrite what another writer recorded meanwhile, so it is sent once
        // and the caller (gallery::service) re-reads and re-applies its change under its lock.
        //
        // No ETag either: GalleryImageVersion carries no `etag` property and neither
        // GalleryImageVersions_Update nor _CreateOrUpdate takes an `If-Match` header in the
        // Compute gallery REST spec (azure-rest-api-specs, specification/compute/resource-manager/
        // Microsoft.Compute/GalleryRP/stable/2024-03-03/GalleryRP.json and its examples
        // GalleryImageVersion_Get.json / GalleryImageVersion_Update.json; the same in 2023-07-03),
        // so there is no conditional write to use; the emulator ignores If-Match as Azure would.
        self.patch_version(
            definition,
            version,
            json!({"tags": tags}),
            "tag update",
            Resend::Never,
        )
        .await
    }

    async fn set_target_regions(
        &self,
        definition: &str,
        version: &str,
        regions: &[TargetRegion],
    ) -> Result<ImageVersion> {
        let spec_regions: Vec<Value> = regions.iter().map(region_json).collect();
        self.patch_version(
            definition,
            version,
            json!({"properties": {"publishingProfile": {"targetRegions": spec_regions}, "storageProfile": {}}}),
            "target region update",
            Resend::AfterTransientFailure,
        )
        .await
    }

    async fn delete_version(&self, definition: &str, version: &str) -> Result<()> {
        let g = &self.gallery;
        let id = g.version_id(definition, version);
        // Sent once: after a 429, 5xx, timeout or dropped connection the DELETE may or may not
        // have reached Azure, and the version may have gained a reference meanwhile. The caller
        // (gallery::service::delete_guarded) re-reads the version under its lock and decides
        // again before sending another.
        let r = self
            .call_resending("delete", &id, Resend::Never, || {
                self.client
                    .gallery_image_versions_client()
                    .delete(
                        &g.subscription,
                        &g.resource_group,
                        &g.gallery,
                        definition,
                        version,
                    )
                    .send()
            })
            .await;
        let resp = match r {
            Ok(resp) => resp,
            Err(e) if Self::is_not_found(&e) => return Ok(()),
            Err(e) => return Err(e),
        };
        let op = operation_from(
            "delete",
            definition,
            version,
            resp.as_raw_response().headers(),
        );
        self.wait_operation("delete", &id, &op, || async {
            Ok(self
                .get_version(definition, version, false)
                .await?
                .map(|v| v.provisioning_state))
        })
        .await?;
        // Done only when a GET says 404.
        let started = tokio::time::Instant::now();
        loop {
            match self.get_version(definition, version, false).await? {
                None => return Ok(()),
                Some(v) if v.provisioning_state == ProvisioningState::Failed => {
                    return Err(Error::OperationFailed {
                        operation: "delete",
                        resource: id,
                        state: "Failed".into(),
                        message: "the version is still present and Failed after its deletion"
                            .into(),
                    })
                }
                Some(v) => {
                    if started.elapsed() > self.opts.operation_timeout {
                        return Err(Error::Timeout {
                            operation: "delete",
                            resource: id,
                            seconds: self.opts.operation_timeout.as_secs(),
                            state: v.provisioning_state.to_string(),
                        });
                    }
                    tokio::time::sleep(self.poll_wait(None).min(Duration::from_secs(2))).await;
                }
            }
        }
    }

    async fn list_consumers(&self) -> Result<Vec<Consumer>> {
        // The gallery's own subscription, then every configured consumer subscription
        // (`--consumer-subscription`, `consumer_subscriptions`): only these scopes are read, and
        // each only once the identity is proven to see all of it (a list the identity may not
        // see whole is no evidence).
        let mut out = Vec::new();
        for s in self.consumer_scopes() {
            self.check_consumer_view(&s).await?;
            self.list_consumers_in(&s, &mut out).await?;
        }
        Ok(out)
    }

    fn consumer_scopes(&self) -> Vec<String> {
        ArmGallery::consumer_scopes(self)
    }
}

impl ArmGallery {
    /// Set the subscriptions, besides the gallery's own, whose VMs, scale sets and disks are
    /// read as consumers (validated subscription ids, from `Settings`).
    pub fn with_consumer_subscriptions(mut self, subscriptions: Vec<String>) -> Self {
        self.consumer_subscriptions = subscriptions;
        self
    }

    /// The gallery's subscription first, then the configured ones, each once.
    pub fn consumer_scopes(&self) -> Vec<String> {
        let mut scopes = vec![self.gallery.subscription.clone()];
        for s in &self.consumer_subscriptions {
            if !scopes.iter().any(|x| x.eq_ignore_ascii_case(s)) {
                scopes.push(s.clone());
            }
        }
        scopes
    }

    async fn list_consumers_in(&self, s: &str, out: &mut Vec<Consumer>) -> Result<()> {
        let scope = format!("/subscriptions/{s}");
        let vms = self
            .call("list virtual machines of", &scope, || async {
                all_pages(
                    self.client
                        .virtual_machines_client()
                        .list_all(s)
                        .into_stream(),
                    |p| p.value,
                )
                .await
            })
            .await?;
        for v in &vms {
            consumers_at(
                ConsumerKind::VirtualMachine,
                v,
                "/properties/storageProfile/imageReference",
                out,
            );
        }
        let sets = self
            .call("list scale sets of", &scope, || async {
                all_pages(
                    self.client
                        .virtual_machine_scale_sets_client()
                        .list_all(s)
                        .into_stream(),
                    |p| p.value,
                )
                .await
            })
            .await?;
        for ss in &sets {
            consumers_at(
                ConsumerKind::ScaleSet,
                ss,
                "/properties/virtualMachineProfile/storageProfile/imageReference",
                out,
            );
            // A Flexible scale set's instances are ordinary VMs in the VM list (read above), and
            // Azure refuses to list them as scale-set VMs with 400 BadRequest (REFERENCE.md,
            // "Flexible scale sets").
            if str_at(ss, &["properties", "orchestrationMode"])
                .is_some_and(|m| m.eq_ignore_ascii_case("Flexible"))
            {
                continue;
            }
            let (Some(id), Some(name)) = (str_at(ss, &["id"]), str_at(ss, &["name"])) else {
                continue;
            };
            let rg = id.split('/').nth(4).unwrap_or_default().to_string();
            let instances = self
                .call("list instances of", id, || async {
                    all_pages(
                        self.client
                            .virtual_machine_scale_set_v_ms_client()
                            .list(&rg, name, s)
                            .into_stream(),
                        |p| p.value,
                    )
                    .await
                })
                .await?;
            for v in &instances {
                consumers_at(
                    ConsumerKind::ScaleSetInstance,
                    v,
                    "/properties/storageProfile/imageReference",
                    out,
                );
            }
        }
        let disks = self
            .call("list disks of", &scope, || async {
                all_pages(self.client.disks_client().list(s).into_stream(), |p| {
                    p.value
                })
                .await
            })
            .await?;
        for d in &disks {
            for p in [
                "/properties/creationData/galleryImageReference",
                "/properties/creationData/imageReference",
            ] {
                consumers_at(ConsumerKind::Disk, d, p, out);
            }
        }
        Ok(())
    }
}

impl ArmGallery {
    async fn patch_version(
        &self,
        definition: &str,
        version: &str,
        body: Value,
        what: &'static str,
        resend: Resend,
    ) -> Result<ImageVersion> {
        let g = &self.gallery;
        let id = g.version_id(definition, version);
        let model: models::GalleryImageVersionUpdate = from_value(body, what)?;
        let resp = self
            .call_resending("update", &id, resend, || {
                self.client
                    .gallery_image_versions_client()
                    .update(
                        &g.subscription,
                        &g.resource_group,
                        &g.gallery,
                        definition,
                        version,
                        model.clone(),
                    )
                    .send()
            })
            .await?;
        let op = operation_from(
            "update",
            definition,
            version,
            resp.as_raw_response().headers(),
        );
        self.wait_operation("update", &id, &op, || async {
            Ok(self
                .get_version(definition, version, false)
                .await?
                .map(|v| v.provisioning_state))
        })
        .await?;
        self.get_version(definition, version, true)
            .await?
            .ok_or_else(|| {
                Error::NotFound(format!("image version {id} vanished during its {what}"))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_policy_retries_only_transient_failures() {
        let opts = ArmOptions::default();
        let http = |status| {
            Failure::Http(Captured {
                status,
                ..Default::default()
            })
        };
        for s in [429, 500, 502, 503, 504, 408] {
            assert!(
                matches!(Retry::decide(&http(s), 0, &opts), Retry::After(_)),
                "{s}"
            );
        }
        for s in [400, 401, 403, 404, 409, 412] {
            assert!(
                matches!(Retry::decide(&http(s), 0, &opts), Retry::GiveUp),
                "{s}"
            );
        }
        assert!(matches!(
            Retry::decide(&Failure::Transport("reset".into()), 0, &opts),
            Retry::After(_)
        ));
        assert!(matches!(
            Retry::decide(&http(503), opts.max_retries, &opts),
            Retry::GiveUp
        ));
    }

    #[test]
    fn azures_clock_is_the_latest_date_header_advanced_by_elapsed_time() {
        let clock = ServerClock::default();
        assert_eq!(clock.now(), None, "no Date seen: no clock");
        clock.observe(Some("not a date"));
        assert_eq!(clock.now(), None);
        clock.observe(Some("Tue, 01 Dec 2026 08:22:08 GMT"));
        let seen = time::macros::datetime!(2026-12-01 08:22:08 UTC);
        let now = clock.now().unwrap();
        assert!(
            now >= seen && now - seen < time::Duration::seconds(5),
            "{now}"
        );
    }

    #[test]
    fn retry_after_is_honoured() {
        let opts = ArmOptions::default();
        let f = Failure::Http(Captured {
            status: 429,
            retry_after: Some(Duration::from_secs(7)),
            ..Default::default()
        });
        match Retry::decide(&f, 0, &opts) {
            Retry::After(d) => assert!(d >= Duration::from_secs(7), "{d:?}"),
            Retry::GiveUp => panic!("should retry"),
        }
    }

    #[test]
    fn error_body_keeps_code_target_and_message() {
        let body = br#"{"error":{"code":"PropertyChangeNotAllowed","message":"Changing property 'x' is not allowed.","target":"galleryImageVersion.properties.storageProfile.osDiskImage.source.uri"}}"#;
        let c = parse_error_body(409, body);
        assert_eq!(c.code.as_deref(), Some("PropertyChangeNotAllowed"));
        assert_eq!(
            c.target.as_deref(),
            Some("galleryImageVersion.properties.storageProfile.osDiskImage.source.uri")
        );
        assert!(c.message.unwrap().contains("not allowed"));
    }

    #[test]
    fn version_body_round_trips_through_the_sdk_model() {
        let spec = VersionSpec {
            definition: "d".into(),
            version: "1.506.0".into(),
            location: "westeurope".into(),
            source_uri: "https://a.blob.core.windows.net/stemcell/x.vhd".into(),
            storage_account_id:
                "/subscriptions/s/resourceGroups/r/providers/Microsoft.Storage/storageAccounts/a"
                    .into(),
            target_regions: vec![TargetRegion {
                name: "westeurope".into(),
                replicas: Some(3),
                storage_account_type: Some("Standard_ZRS".into()),
                exclude_from_latest: None,
            }],
            replica_count: Some(3),
            exclude_from_latest: false,
            end_of_life: None,
            tags: BTreeMap::from([("image_sha256".to_string(), "ab".to_string())]),
        };
        let model: models::GalleryImageVersion = from_value(version_body(&spec), "v").unwrap();
        let back = sdk_json(&model);
        assert_eq!(
            back.pointer("/properties/storageProfile/osDiskImage/source/uri"),
            Some(&json!(spec.source_uri))
        );
        assert_eq!(
            back.pointer("/properties/publishingProfile/targetRegions/0/storageAccountType"),
            Some(&json!("Standard_ZRS"))
        );
        assert_eq!(back.pointer("/tags/image_sha256"), Some(&json!("ab")));
    }
}
