//! The ARM transport: every request goes through one azure_core 1.x [`Pipeline`] (the tool's
//! reqwest transport with the extra CA roots, [`BearerPolicy`] for the token, the SDK's own
//! retries off), and the ONE retry loop ([`Transport::send`]) with bounded exponential backoff
//! and jitter, honouring `Retry-After`, a token refresh after a 401, and the per-request timeout.
//!
//! The pipeline is sent with its success check skipped, so the retry loop reads the status,
//! headers and error body (`code`, `target`, `message`, `Retry-After`) straight from the raw
//! response. Whether a failure is retried is decided by the gallery error's one classification
//! (`Error::retryability`).

use std::sync::Arc;
use std::time::Duration;

use azure_core::http::headers::{HeaderName, Headers, CONTENT_TYPE};
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{
    ClientOptions, Context, Method, Pipeline, PipelineSendOptions, Request, RetryOptions,
};
use time::OffsetDateTime;

use super::wire::ErrorBody;
use super::ArmOptions;
use crate::access::HTTP_TIMEOUT_ENV;
use crate::azure::bearer::BearerPolicy;
use crate::azure::credential::Credential;
use crate::error::error_chain;
use crate::error::Classified;
use crate::gallery::error::{AzureError, Error, Result};

/// What the transport read of an error response.
#[derive(Debug, Clone, Default)]
pub(super) struct Captured {
    pub(super) status: u16,
    pub(super) code: Option<String>,
    pub(super) message: Option<String>,
    pub(super) target: Option<String>,
    pub(super) retry_after: Option<Duration>,
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
        let Some(date) = date.and_then(crate::azure::parse_http_date) else {
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

/// The last per-try step of the pipeline, right before the HTTP transport: bounds one exchange
/// (headers and the whole body, which the pipeline buffers) by the per-request timeout, and
/// records every response's `Date` in [`ServerClock`]. It runs after [`BearerPolicy`], so the
/// time to get a token does not count against the request.
#[derive(Debug)]
struct Exchange {
    timeout: Duration,
    clock: Arc<ServerClock>,
}

const DATE: HeaderName = HeaderName::from_static("date");

#[async_trait::async_trait]
impl Policy for Exchange {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        let timeout = self.timeout;
        let response = tokio::time::timeout(timeout, next[0].send(ctx, request, &next[1..]))
            .await
            .map_err(|_| {
                azure_core::Error::with_message(
                    azure_core::error::ErrorKind::Io,
                    timed_out(timeout),
                )
            })??;
        self.clock
            .observe(response.headers().get_optional_str(&DATE));
        Ok(response)
    }
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

/// Azure's error body `{"error": {"code", "message", "target"}}` (or the bare object).
pub(super) fn parse_error_body(status: u16, bytes: &[u8]) -> Captured {
    let e = ErrorBody::parse(bytes);
    Captured {
        status,
        code: e.code,
        message: e.message,
        target: e.target,
        retry_after: None,
    }
}

/// The retry policy, one function: what to do after a failed attempt.
#[derive(Debug)]
pub(super) enum Retry {
    After(Duration),
    GiveUp,
}

impl Retry {
    /// After attempt `attempt` (0-based) failed with `error`: re-send only what
    /// the error's class re-sends ([`crate::error::Class::resend`]), within `max_retries`, waiting the backoff or
    /// Azure's `Retry-After` (at least a quarter of the backoff), capped.
    pub(super) fn decide(error: &Error, attempt: u32, opts: &ArmOptions) -> Retry {
        if attempt >= opts.max_retries {
            return Retry::GiveUp;
        }
        if !error.class().resend() {
            return Retry::GiveUp;
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
    crate::backoff::Backoff::new(opts.base_backoff, opts.max_backoff).delay(attempt)
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
                message,
            },
        }
    }
}

/// An answer Azure gave: the status, the headers and the (buffered) body.
#[derive(Debug)]
pub(super) struct Reply {
    pub(super) status: u16,
    pub(super) headers: Headers,
    pub(super) body: bytes::Bytes,
}

impl Reply {
    /// A header's value, when present (`name` in lower case).
    pub(super) fn header(&self, name: &'static str) -> Option<&str> {
        self.headers
            .get_optional_str(&HeaderName::from_static(name))
    }
}

/// HTTP to ARM for one adapter: the pipeline, the credential (for its cache after a 401), the
/// knobs, and Azure's clock.
pub(super) struct Transport {
    pipeline: Pipeline,
    credential: Credential,
    opts: ArmOptions,
    pub(super) clock: Arc<ServerClock>,
}

impl Transport {
    /// The pipeline: the tool's HTTP client (extra CA roots), no retries of the SDK's own (the
    /// loop below is the only one), the bearer token for the configured scope, and the
    /// per-request timeout with the `Date` observer.
    pub(super) fn new(
        endpoint: &url::Url,
        credential: Credential,
        opts: &ArmOptions,
    ) -> anyhow::Result<Transport> {
        // The configured audience's scope (issue 16: deriving it from the endpoint made every
        // command 401 on Azure Stack while doctor, which asked for the configured one, passed).
        let scope = opts
            .token_scope
            .clone()
            .unwrap_or_else(|| crate::access::scope_for(endpoint.as_str()));
        let clock = Arc::new(ServerClock::default());
        let http = crate::azure::tls::http_client(&opts.ca_bundles)?;
        let options = ClientOptions {
            transport: Some(azure_core::http::Transport::new(http)),
            retry: RetryOptions::none(),
            ..Default::default()
        };
        let per_try: Vec<Arc<dyn Policy>> = vec![
            BearerPolicy::new(credential.clone(), scope).into_policy(),
            Arc::new(Exchange {
                timeout: opts.request_timeout,
                clock: clock.clone(),
            }),
        ];
        let pipeline = Pipeline::new(
            Some(env!("CARGO_PKG_NAME")),
            Some(env!("CARGO_PKG_VERSION")),
            options,
            Vec::new(),
            per_try,
            None,
        );
        Ok(Transport {
            pipeline,
            credential,
            opts: opts.clone(),
            clock,
        })
    }

    /// The retry loop, the only one: run `attempt` until it succeeds, fails for good, or the
    /// retries run out. A 401 is retried once with a fresh token (Azure did not act on it).
    /// After a transient failure (429, 408, 5xx, timeout, dropped connection) the request is
    /// re-sent only when `resend` says so. A write whose effect depends on what was read before
    /// it (a DELETE decided on a version's state, a tag write that replaces the whole tag set) is
    /// sent with `Resend::Never`: the failure goes back to the caller, which observes again
    /// under its lock before sending anything. `attempt` answers `Err` for an error no retry can
    /// change (no token).
    async fn retrying<T, F, Fut>(
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

    /// One request through the pipeline, under [`Transport::retrying`]: `method` on the absolute
    /// `url`, with `body` as JSON when given. An answer below 400 is the reply; so is a 404 when
    /// `not_found` is [`NotFound::IsAnAnswer`]; every other status is Azure's error (a 409
    /// [`Error::Busy`], a 400 [`Error::Rejected`], else [`Error::Azure`], a 404 among them).
    pub(super) async fn send(
        &self,
        request: Call<'_>,
        operation: &'static str,
        resource: &str,
        resend: Resend,
    ) -> Result<Reply> {
        let url = url::Url::parse(request.url).map_err(|e| Error::RequestBuild {
            what: format!("{operation} of {resource}"),
            message: format!("{}: {e}", request.url),
        })?;
        let Call {
            method,
            body,
            not_found,
            ..
        } = request;
        let (url, body) = (&url, &body);
        self.retrying(operation, resource, resend, || async move {
            let mut req = Request::new(url.clone(), method);
            if let Some(b) = body {
                req.insert_header(CONTENT_TYPE, "application/json");
                req.set_body(b.clone());
            }
            let sent = self
                .pipeline
                .send(
                    &Context::new(),
                    &mut req,
                    Some(PipelineSendOptions {
                        skip_checks: true,
                        ..Default::default()
                    }),
                )
                .await;
            let response = match sent {
                Ok(r) => r,
                Err(e) => return Self::failed(e, url, operation, resource),
            };
            let (status, headers, body) = response.deconstruct();
            let status = u16::from(status);
            let body = bytes::Bytes::copy_from_slice(&body);
            if status < 400 || (status == 404 && not_found == NotFound::IsAnAnswer) {
                return Ok(Ok(Reply {
                    status,
                    headers,
                    body,
                }));
            }
            let mut c = parse_error_body(status, &body);
            c.retry_after = crate::backoff::retry_after(|name| {
                headers.get_optional_str(&HeaderName::from_static(name))
            });
            Ok(Err(Failure::Http(c)))
        })
        .await
    }

    /// What a pipeline error means: a refused TLS certificate (of ARM, or of the token endpoint
    /// behind the credential) is final, and so is no token (or a URL a token may not go to);
    /// anything else (connection, timeout) is a transport failure the loop classifies.
    fn failed<T>(
        e: azure_core::Error,
        url: &url::Url,
        operation: &'static str,
        resource: &str,
    ) -> Result<std::result::Result<T, Failure>> {
        if let Some(cause) = crate::azure::tls::untrusted_in(&e, url) {
            return Err(Error::Untrusted {
                operation,
                resource: resource.to_string(),
                for_token: matches!(e.kind(), azure_core::error::ErrorKind::Credential),
                cause,
            });
        }
        match e.kind() {
            // `az` reports its own certificate failures as text: explained by their words.
            azure_core::error::ErrorKind::Credential => {
                Err(Error::no_token(operation, resource, error_chain(&e)))
            }
            azure_core::error::ErrorKind::Other => Err(Error::Transport {
                operation,
                resource: resource.to_string(),
                message: error_chain(&e),
            }),
            _ => Ok(Err(Failure::Transport(error_chain(&e)))),
        }
    }

    /// A GET of an absolute ARM URL (operation status, `Location`, a list's `nextLink`) that may
    /// be re-sent after a transient failure; a 404 is an answer, not an error.
    pub(super) async fn get_raw(
        &self,
        url: &str,
        operation: &'static str,
        resource: &str,
    ) -> Result<Reply> {
        self.send(
            Call {
                method: Method::Get,
                url,
                body: None,
                not_found: NotFound::IsAnAnswer,
            },
            operation,
            resource,
            Resend::AfterTransientFailure,
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

/// Whether a 404 is an answer (a GET that asks whether something exists) or Azure's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NotFound {
    IsAnAnswer,
    IsAnError,
}

/// One request: method, absolute URL (with its `api-version`), JSON body.
pub(super) struct Call<'a> {
    pub(super) method: Method,
    pub(super) url: &'a str,
    /// The JSON body, serialized from a `wire` struct.
    pub(super) body: Option<Vec<u8>>,
    pub(super) not_found: NotFound,
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
        // A refused certificate is known by its type where the pipeline's error arrives (behind
        // the handshake's I/O error), never re-sent.
        let handshake = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let sdk = azure_core::Error::with_error(
            azure_core::error::ErrorKind::Connection,
            handshake,
            "failed to execute `reqwest` request",
        );
        let url = url::Url::parse("https://management.azure.com/x").unwrap();
        let Err(untrusted) = Transport::failed::<()>(sdk, &url, "read", "r") else {
            panic!("a refused certificate is final")
        };
        assert!(matches!(untrusted, Error::Untrusted { .. }));
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
