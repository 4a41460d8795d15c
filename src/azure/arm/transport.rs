//! The ARM transport: HTTP send (through the SDK's builders or a plain GET), the bearer token,
//! and the ONE retry loop ([`Transport::send`]) with bounded exponential backoff and jitter,
//! honouring `Retry-After`, a token refresh after a 401, and the per-request timeout.
//!
//! The SDK's `HttpError` exposes code and message but not `target` nor `Retry-After`, so the
//! transport under the SDK (`CapturingTransport`) records the last error response of the current
//! task before handing it on to the SDK, and the retry loop reads it back. Whether a failure is
//! retried is decided by the gallery error's one classification (`Error::retryability`).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::Duration;

use azure_core_legacy::auth::TokenCredential;
use azure_mgmt_compute::package_2024_07_01::{Client, ClientBuilder};
use serde_json::Value;
use time::OffsetDateTime;

use super::{ArmOptions, HTTP_TIMEOUT_ENV};
use crate::error::error_chain;
use crate::gallery::error::{AzureError, Error, Result, Retryability};

/// What the transport saw of the last error response in this task.
#[derive(Debug, Clone, Default)]
pub(super) struct Captured {
    pub(super) status: u16,
    pub(super) code: Option<String>,
    pub(super) message: Option<String>,
    pub(super) target: Option<String>,
    pub(super) retry_after: Option<Duration>,
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
        let Some(date) = date.and_then(|d| azure_core_legacy::date::parse_rfc1123(d.trim()).ok())
        else {
            return;
        };
        if let Ok(mut seen) = self.seen.lock() {
            *seen = Some((date, std::time::Instant::now()));
        }
    }

    pub(super) fn now(&self) -> Option<OffsetDateTime> {
        let seen = *self.seen.lock().ok()?;
        seen.map(|(date, at)| date + at.elapsed())
    }
}

/// A transport that delegates to reqwest and records error responses for the caller.
#[derive(Debug)]
struct CapturingTransport {
    inner: reqwest_legacy::Client,
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

#[async_trait::async_trait]
impl azure_core_legacy::HttpClient for CapturingTransport {
    async fn execute_request(
        &self,
        request: &azure_core_legacy::Request,
    ) -> azure_core_legacy::Result<azure_core_legacy::Response> {
        let timeout = self.timeout;
        let response = tokio::time::timeout(timeout, self.inner.execute_request(request))
            .await
            .map_err(|_| {
                azure_core_legacy::Error::with_message(
                    azure_core_legacy::error::ErrorKind::Io,
                    move || timed_out(timeout),
                )
            })??;
        self.clock.observe(
            response
                .headers()
                .get_optional_str(&azure_core_legacy::headers::DATE),
        );
        let status: u16 = response.status().into();
        if status < 400 {
            return Ok(response);
        }
        let (status_code, headers, body) = response.deconstruct();
        let bytes = tokio::time::timeout(timeout, body.collect())
            .await
            .map_err(|_| {
                azure_core_legacy::Error::with_message(
                    azure_core_legacy::error::ErrorKind::Io,
                    move || timed_out(timeout),
                )
            })??;
        let mut captured = parse_error_body(status, &bytes);
        captured.retry_after = headers
            .get_optional_str(&azure_core_legacy::headers::RETRY_AFTER)
            .and_then(parse_retry_after);
        let _ = CAPTURE.try_with(|c| *c.borrow_mut() = Some(captured));
        let stream: std::pin::Pin<
            Box<dyn futures::Stream<Item = azure_core_legacy::Result<bytes::Bytes>> + Send + Sync>,
        > = Box::pin(futures::stream::once(async move { Ok(bytes) }));
        Ok(azure_core_legacy::Response::new(
            status_code,
            headers,
            stream,
        ))
    }
}

/// Azure's error body `{"error": {"code", "message", "target"}}` (or the bare object).
pub(super) fn parse_error_body(status: u16, bytes: &[u8]) -> Captured {
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
#[derive(Debug)]
pub(super) enum Retry {
    After(Duration),
    GiveUp,
}

impl Retry {
    /// After attempt `attempt` (0-based) failed with `error`: re-send only what
    /// [`Error::retryability`] calls transient, within `max_retries`, waiting the backoff or
    /// Azure's `Retry-After` (at least a quarter of the backoff), capped.
    pub(super) fn decide(error: &Error, attempt: u32, opts: &ArmOptions) -> Retry {
        if attempt >= opts.max_retries {
            return Retry::GiveUp;
        }
        match error.retryability() {
            Retryability::Transient => {}
            Retryability::ObserveAgain | Retryability::Later | Retryability::Never => {
                return Retry::GiveUp
            }
        }
        let backoff = backoff(attempt, opts);
        let wait = match error.retry_after() {
            Some(ra) => ra.max(backoff / 4),
            None => backoff,
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
pub(super) enum Resend {
    AfterTransientFailure,
    Never,
}

/// One failed attempt, before it becomes the gallery's error.
pub(super) enum Failure {
    Http(Captured),
    Transport(String),
}

impl Failure {
    fn is_unauthorized(&self) -> bool {
        matches!(self, Failure::Http(c) if c.status == 401)
    }

    fn into_error(self, operation: &'static str, resource: &str) -> Error {
        match self {
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
}

/// HTTP to ARM for one adapter: the reqwest client, the credential and its scope, the knobs,
/// and Azure's clock.
pub(super) struct Transport {
    http: reqwest_legacy::Client,
    credential: Arc<dyn TokenCredential>,
    scopes: Vec<String>,
    opts: ArmOptions,
    pub(super) clock: Arc<ServerClock>,
}

impl Transport {
    /// The transport and the SDK client that sends through it (the SDK's own retries off).
    pub(super) fn new(
        endpoint: &url::Url,
        credential: Arc<dyn TokenCredential>,
        opts: &ArmOptions,
    ) -> anyhow::Result<(Transport, Client)> {
        // The transport's own timeout says what happened; reqwest's (a little longer) also bounds
        // reading a body that stalls after the headers.
        let http = crate::azure::tls::with_roots_legacy(
            reqwest_legacy::Client::builder(),
            &opts.ca_bundles,
        )
        .timeout(opts.request_timeout + opts.request_timeout / 2)
        .connect_timeout(Duration::from_secs(15).min(opts.request_timeout))
        .build()?;
        let clock = Arc::new(ServerClock::default());
        let capturing = azure_core_legacy::TransportOptions::new(Arc::new(CapturingTransport {
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
            .retry(azure_core_legacy::RetryOptions::none())
            .transport(capturing)
            .build()?;
        Ok((
            Transport {
                http,
                credential,
                scopes: vec![scope],
                opts: opts.clone(),
                clock,
            },
            client,
        ))
    }

    /// The retry loop, the only one: run `attempt` until it succeeds, fails for good, or the
    /// retries run out. A 401 is retried once with a fresh token (Azure did not act on it).
    /// After a transient failure (429, 408, 5xx, timeout, dropped connection) the request is
    /// re-sent only when `resend` says so. A write whose effect depends on what was read before
    /// it (a DELETE decided on a version's state, a tag write that replaces the whole tag set) is
    /// sent with `Resend::Never`: the failure goes back to the caller, which observes again
    /// under its lock before sending anything. `attempt` answers `Err` for an error no retry can
    /// change (no token).
    async fn send<T, F, Fut>(
        &self,
        operation: &'static str,
        resource: &str,
        resend: Resend,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<std::result::Result<T, Failure>>>,
    {
        let mut retries = 0;
        let mut token_refreshed = false;
        loop {
            let failure = match attempt().await? {
                Ok(v) => return Ok(v),
                Err(f) => f,
            };
            if failure.is_unauthorized() && !token_refreshed {
                token_refreshed = true;
                self.refresh_token(operation, resource).await;
                continue;
            }
            let error = failure.into_error(operation, resource);
            match Retry::decide(&error, retries, &self.opts) {
                Retry::After(_) if resend == Resend::Never => {
                    tracing::debug!(
                        operation,
                        resource,
                        "transient failure of a request that is not re-sent blindly; the caller observes again"
                    );
                    return Err(error);
                }
                Retry::After(wait) => {
                    tracing::debug!(
                        operation,
                        resource,
                        attempt = retries,
                        ?wait,
                        "transient failure, retrying"
                    );
                    tokio::time::sleep(wait).await;
                    retries += 1;
                }
                Retry::GiveUp => return Err(error),
            }
        }
    }

    /// One SDK request through [`Transport::send`]; `f` builds and sends the request afresh.
    pub(super) async fn call<T, F, Fut>(
        &self,
        operation: &'static str,
        resource: &str,
        resend: Resend,
        f: F,
    ) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = azure_core_legacy::Result<T>>,
    {
        let f = &f;
        self.send(operation, resource, resend, move || async move {
            let (result, captured) = CAPTURE
                .scope(RefCell::new(None), async {
                    let r = f().await;
                    (r, CAPTURE.with(|c| c.borrow_mut().take()))
                })
                .await;
            let err = match result {
                Ok(v) => return Ok(Ok(v)),
                Err(e) => e,
            };
            Ok(Err(match (err.kind(), captured) {
                (azure_core_legacy::error::ErrorKind::HttpResponse { .. }, Some(c)) => {
                    Failure::Http(c)
                }
                (
                    azure_core_legacy::error::ErrorKind::HttpResponse { status, error_code },
                    None,
                ) => Failure::Http(Captured {
                    status: (*status).into(),
                    code: error_code.clone(),
                    ..Default::default()
                }),
                _ => Failure::Transport(error_chain(&err)),
            }))
        })
        .await
    }

    /// A plain GET of an absolute ARM URL (operation status, `Location`, lists the SDK does not
    /// cover) through [`Transport::send`]: the status, the JSON body, and `Retry-After`. A 404 is
    /// an answer, not an error.
    pub(super) async fn raw_get(
        &self,
        url: &str,
        operation: &'static str,
        resource: &str,
    ) -> Result<(u16, Value, Option<Duration>)> {
        self.send(
            operation,
            resource,
            Resend::AfterTransientFailure,
            || async move {
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
                            .get(reqwest_legacy::header::DATE)
                            .and_then(|v| v.to_str().ok()),
                    );
                    let retry_after = resp
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(parse_retry_after);
                    let bytes = resp.bytes().await?;
                    Ok::<_, reqwest_legacy::Error>((status, retry_after, bytes))
                })
                .await;
                Ok(match sent {
                    Ok(Ok((status, retry_after, bytes))) => {
                        if status < 400 || status == 404 {
                            let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                            return Ok(Ok((status, v, retry_after)));
                        }
                        let mut c = parse_error_body(status, &bytes);
                        c.retry_after = retry_after;
                        Err(Failure::Http(c))
                    }
                    Ok(Err(e)) => Err(Failure::Transport(error_chain(&e))),
                    Err(_) => Err(Failure::Transport(timed_out(timeout))),
                })
            },
        )
        .await
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(status: u16) -> Error {
        Failure::Http(Captured {
            status,
            ..Default::default()
        })
        .into_error("read", "r")
    }

    #[test]
    fn retry_policy_retries_only_transient_failures() {
        let opts = ArmOptions::default();
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
        let reset = Failure::Transport("reset".into()).into_error("read", "r");
        assert!(matches!(Retry::decide(&reset, 0, &opts), Retry::After(_)));
        let untrusted = Failure::Transport("invalid peer certificate: UnknownIssuer".into())
            .into_error("read", "r");
        assert!(matches!(Retry::decide(&untrusted, 0, &opts), Retry::GiveUp));
        assert!(matches!(
            Retry::decide(&http(503), opts.max_retries, &opts),
            Retry::GiveUp
        ));
    }

    #[test]
    fn a_409_is_busy_and_a_400_rejected() {
        assert!(matches!(http(409), Error::Busy { .. }));
        assert!(matches!(http(400), Error::Rejected { .. }));
        assert!(matches!(http(403), Error::Azure { .. }));
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
        let e = Failure::Http(Captured {
            status: 429,
            retry_after: Some(Duration::from_secs(7)),
            ..Default::default()
        })
        .into_error("read", "r");
        match Retry::decide(&e, 0, &opts) {
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
}
