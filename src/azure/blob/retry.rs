//! Our retry policy for every Blob storage request, a per-call step of the azure_core 1.x
//! pipeline (the SDK's own retry is off: `RetryOptions::none()`).
//!
//! Why not the SDK's: azure_core's retry policies cannot count retries per operation (upload
//! statistics), have no per-attempt timeout (a hung connection would hang the upload forever),
//! and do not clear a token credential's cache after a 401. The 1.x pipeline hands every policy
//! the raw response, whatever its status (the client turns an error status into an error after
//! the pipeline), so this step sees each attempt's status and `Retry-After` headers itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use azure_core::error::ErrorKind;
use azure_core::http::headers::{HeaderName, Headers};
use azure_core::http::policies::{Policy, PolicyResult};
use azure_core::http::{Context, Request, StatusCode};

use crate::azure::credential::Credential;

/// Bounded exponential backoff with jitter, plus a client-side timeout for each attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetrySettings {
    /// Retries after the first attempt (0 = try once).
    pub max_retries: u32,
    /// Delay before the first retry; doubles each retry, with full jitter in [delay/2, delay].
    pub base_delay: Duration,
    /// Upper bound of a computed delay.
    pub max_delay: Duration,
    /// Upper bound of a server-requested `Retry-After`.
    pub max_retry_after: Duration,
    /// An attempt with no complete response within this time is abandoned and retried.
    pub attempt_timeout: Duration,
}

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            max_retries: 6,
            base_delay: Duration::from_millis(400),
            max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(120),
            // The Azure CPI gives each blob operation 120 s; a 4 MiB Put Page needs far less.
            attempt_timeout: Duration::from_secs(120),
        }
    }
}

impl RetrySettings {
    /// The delay before retry number `retry` (1-based), before any `Retry-After`.
    pub fn backoff(&self, retry: u32) -> Duration {
        crate::backoff::Backoff::new(self.base_delay, self.max_delay).delay(retry.saturating_sub(1))
    }
}

/// Put into a request's `Context` to count the retries made on its behalf (upload statistics).
#[derive(Debug, Clone, Default)]
pub struct RetryCounter(pub Arc<AtomicU64>);

impl RetryCounter {
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Put into a request's `Context` to override the target's `max_retries` for that request.
#[derive(Debug, Clone, Copy)]
pub struct RetryBudget(pub u32);

/// Is this SDK error worth another attempt? 408, 429, 500, 502, 503, 504 and I/O (connection)
/// errors are; everything else (auth, not found, conflicts, bad requests) is not.
pub fn is_transient_azure(err: &azure_core::Error) -> bool {
    match err.kind() {
        ErrorKind::HttpResponse { status, .. } => is_transient_status(*status),
        // A certificate the client does not trust fails the same way on every retry (the HTTP
        // client answers it as `Other` already; this guards a transport that does not).
        ErrorKind::Io | ErrorKind::Connection => {
            crate::azure::tls::refused_certificate(err).is_none()
        }
        ErrorKind::DataConversion | ErrorKind::Credential | ErrorKind::Other => false,
    }
}

/// Whether the pipeline re-sends a request storage answered with `status` (the one status table,
/// blob's column).
pub fn is_transient_status(status: StatusCode) -> bool {
    crate::error::class_of_status(crate::error::Service::Blob, u16::from(status)).resend()
}

/// The per-call retry policy (see the module comment).
#[derive(Debug)]
pub struct RetryPolicy {
    settings: RetrySettings,
    /// The token credential, when storage is reached with one: a 401 drops its cached token.
    credential: Option<Credential>,
}

impl RetryPolicy {
    pub fn new(settings: RetrySettings) -> Self {
        Self {
            settings,
            credential: None,
        }
    }

    /// On a 401 (an expired or revoked token), clear this credential's cache before the one
    /// retry a 401 gets.
    pub fn with_credential(mut self, credential: Credential) -> Self {
        self.credential = Some(credential);
        self
    }
}

/// What one attempt gave: a response (any status) or an error before one.
enum Attempt {
    Done(PolicyResult),
    Retry {
        why: String,
        requested: Option<Duration>,
        last: PolicyResult,
    },
    Unauthorized(PolicyResult),
}

#[async_trait::async_trait]
impl Policy for RetryPolicy {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        let max_retries = ctx
            .value::<RetryBudget>()
            .map(|b| b.0)
            .unwrap_or(self.settings.max_retries);
        let mut retry = 0u32;
        let mut token_refreshed = false;
        loop {
            let outcome = tokio::time::timeout(
                self.settings.attempt_timeout,
                next[0].send(ctx, request, &next[1..]),
            )
            .await;
            let attempt = match outcome {
                Ok(Ok(response)) => {
                    let status = response.status();
                    if u16::from(status) == 401 {
                        Attempt::Unauthorized(Ok(response))
                    } else if is_transient_status(status) {
                        Attempt::Retry {
                            why: format!("status {}", u16::from(status)),
                            requested: header_delay(response.headers()),
                            last: Ok(response),
                        }
                    } else {
                        Attempt::Done(Ok(response))
                    }
                }
                Ok(Err(err)) if is_transient_azure(&err) => Attempt::Retry {
                    why: err.to_string(),
                    requested: None,
                    last: Err(err),
                },
                Ok(Err(err)) => Attempt::Done(Err(err)),
                Err(_elapsed) => {
                    let limit = self.settings.attempt_timeout;
                    let err = azure_core::Error::with_message(
                        ErrorKind::Io,
                        format!(
                            "no response within {:.1} s (the per-request timeout; set STEMCELL_GALLERY_HTTP_TIMEOUT to change it)",
                            limit.as_secs_f64()
                        ),
                    );
                    Attempt::Retry {
                        why: err.to_string(),
                        requested: None,
                        last: Err(err),
                    }
                }
            };
            match attempt {
                Attempt::Done(result) => return result,
                Attempt::Unauthorized(result) => {
                    if token_refreshed {
                        return result;
                    }
                    // Once per request: get a fresh token (the next attempt's bearer step asks
                    // the credential again) and retry at once.
                    token_refreshed = true;
                    tracing::info!(
                        method = %request.method(),
                        path = request.url().path(),
                        "storage answered 401; getting a fresh token and retrying once"
                    );
                    if let Some(cred) = &self.credential {
                        if let Err(e) = cred.clear_cache().await {
                            tracing::warn!(error = %e, "could not clear the cached token");
                        }
                    }
                    request.body_mut().reset().await?;
                }
                Attempt::Retry {
                    why,
                    requested,
                    last,
                } => {
                    if retry >= max_retries {
                        return last;
                    }
                    drop(last);
                    retry += 1;
                    if let Some(counter) = ctx.value::<RetryCounter>() {
                        counter.0.fetch_add(1, Ordering::Relaxed);
                    }
                    let backoff = self.settings.backoff(retry);
                    let delay = match requested.map(|d| d.min(self.settings.max_retry_after)) {
                        Some(server) => server.max(backoff),
                        None => backoff,
                    };
                    tracing::debug!(
                        method = %request.method(),
                        path = request.url().path(),
                        retry,
                        max_retries,
                        ?delay,
                        "transient storage error, retrying: {why}"
                    );
                    tokio::time::sleep(delay).await;
                    request.body_mut().reset().await?;
                }
            }
        }
    }
}

/// The server's requested delay on a 429/503: `retry-after-ms`, `x-ms-retry-after-ms`, or
/// `Retry-After` in seconds (the HTTP-date form is rare for storage and falls back to our backoff).
fn header_delay(headers: &Headers) -> Option<Duration> {
    crate::backoff::retry_after(|name| headers.get_optional_str(&HeaderName::from_static(name)))
}

/// Sets `x-ms-date` on each try (a Shared Key signature covers it; with a token it dates the
/// request the same way). Before the authorization step.
#[derive(Debug, Default)]
pub struct XmsDate;

#[async_trait::async_trait]
impl Policy for XmsDate {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        request.insert_header(
            "x-ms-date",
            azure_core::time::to_rfc7231(&time::OffsetDateTime::now_utc()),
        );
        next[0].send(ctx, request, &next[1..]).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use azure_core::http::{AsyncRawResponse, Method, Url};
    use std::sync::atomic::AtomicUsize;

    /// A transport stand-in answering from a script of statuses (with optional Retry-After).
    #[derive(Debug)]
    struct Scripted {
        script: Vec<(u16, Option<&'static str>)>,
        calls: Arc<AtomicUsize>,
    }

    #[async_trait::async_trait]
    impl Policy for Scripted {
        async fn send(&self, _: &Context, _: &mut Request, _: &[Arc<dyn Policy>]) -> PolicyResult {
            let i = self.calls.fetch_add(1, Ordering::SeqCst);
            let (status, retry_after) = self.script[i.min(self.script.len() - 1)];
            let mut headers = Headers::new();
            if let Some(v) = retry_after {
                headers.insert(azure_core::http::headers::RETRY_AFTER, v);
            }
            Ok(AsyncRawResponse::from_bytes(
                StatusCode::from(status),
                headers,
                bytes::Bytes::new(),
            ))
        }
    }

    /// Fails like a dropped connection.
    #[derive(Debug)]
    struct Refused(Arc<AtomicUsize>);

    #[async_trait::async_trait]
    impl Policy for Refused {
        async fn send(&self, _: &Context, _: &mut Request, _: &[Arc<dyn Policy>]) -> PolicyResult {
            self.0.fetch_add(1, Ordering::SeqCst);
            Err(azure_core::Error::with_message(
                ErrorKind::Io,
                "connection reset by peer",
            ))
        }
    }

    fn settings() -> RetrySettings {
        RetrySettings {
            max_retries: 3,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            max_retry_after: Duration::from_secs(60),
            attempt_timeout: Duration::from_secs(5),
        }
    }

    /// Our policy in front of a scripted transport.
    fn pipeline(
        script: Vec<(u16, Option<&'static str>)>,
    ) -> (RetryPolicy, Vec<Arc<dyn Policy>>, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let scripted: Arc<dyn Policy> = Arc::new(Scripted {
            script,
            calls: calls.clone(),
        });
        (RetryPolicy::new(settings()), vec![scripted], calls)
    }

    fn request() -> Request {
        Request::new(
            Url::parse("http://127.0.0.1:1/devstoreaccount1/c/b").expect("url"),
            Method::Put,
        )
    }

    fn status_of(result: &PolicyResult) -> Option<u16> {
        result.as_ref().ok().map(|r| u16::from(r.status()))
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_put_is_retried_then_succeeds_and_counted() {
        let (policy, next, _) = pipeline(vec![(503, None), (429, None), (201, None)]);
        let counter = RetryCounter::default();
        let ctx = Context::new().with_value(counter.clone());
        let result = policy.send(&ctx, &mut request(), &next).await;
        assert_eq!(status_of(&result), Some(201));
        assert_eq!(counter.get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_bounded() {
        let (policy, next, calls) = pipeline(vec![(500, None)]);
        let counter = RetryCounter::default();
        let ctx = Context::new().with_value(counter.clone());
        let result = policy.send(&ctx, &mut request(), &next).await;
        // The last answer goes up for the client to turn into its error.
        assert_eq!(status_of(&result), Some(500), "500 forever must fail");
        assert!(is_transient_status(StatusCode::from(500)));
        assert_eq!(counter.get(), 3);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn connection_errors_are_retried_and_bounded() {
        let calls = Arc::new(AtomicUsize::new(0));
        let next: Vec<Arc<dyn Policy>> = vec![Arc::new(Refused(calls.clone()))];
        let counter = RetryCounter::default();
        let ctx = Context::new().with_value(counter.clone());
        let err = RetryPolicy::new(settings())
            .send(&ctx, &mut request(), &next)
            .await
            .expect_err("a refused connection forever must fail");
        assert!(is_transient_azure(&err));
        assert_eq!(counter.get(), 3);
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_budget_in_the_context_overrides_the_settings() {
        let (policy, next, calls) = pipeline(vec![(503, None)]);
        let ctx = Context::new().with_value(RetryBudget(1));
        let result = policy.send(&ctx, &mut request(), &next).await;
        assert_eq!(status_of(&result), Some(503));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_errors_are_not_retried() {
        let (policy, next, calls) = pipeline(vec![(403, None), (201, None)]);
        let counter = RetryCounter::default();
        let ctx = Context::new().with_value(counter.clone());
        let result = policy.send(&ctx, &mut request(), &next).await;
        assert_eq!(status_of(&result), Some(403));
        assert_eq!(counter.get(), 0);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[derive(Debug)]
    struct AnyToken;

    #[async_trait::async_trait]
    impl azure_core::credentials::TokenCredential for AnyToken {
        async fn get_token(
            &self,
            _: &[&str],
            _: Option<azure_core::credentials::TokenRequestOptions<'_>>,
        ) -> azure_core::Result<azure_core::credentials::AccessToken> {
            Ok(azure_core::credentials::AccessToken::new(
                "t",
                time::OffsetDateTime::now_utc() + time::Duration::hours(1),
            ))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_401_clears_the_token_cache_and_is_retried_once_only() {
        let builds = Arc::new(AtomicUsize::new(0));
        let counted = builds.clone();
        let cred = Credential::rebuilt_by(move || {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(AnyToken) as Arc<dyn azure_core::credentials::TokenCredential>)
        })
        .expect("credential");
        let (policy, next, calls) = pipeline(vec![(401, None), (401, None), (201, None)]);
        let policy = policy.with_credential(cred);
        let result = policy.send(&Context::new(), &mut request(), &next).await;
        assert_eq!(status_of(&result), Some(401));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        assert_eq!(builds.load(Ordering::SeqCst), 2, "built once, rebuilt once");
        // A 401 then success: the fresh token's attempt goes through.
        let (policy, next, _) = pipeline(vec![(401, None), (201, None)]);
        let result = policy.send(&Context::new(), &mut request(), &next).await;
        assert_eq!(status_of(&result), Some(201));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_honoured() {
        // The raw 429 carries Retry-After: 7 and the policy waits at least that long.
        let (_, next, _) = pipeline(vec![(429, Some("7")), (201, None)]);
        let policy = RetryPolicy::new(RetrySettings {
            base_delay: Duration::from_millis(10),
            ..RetrySettings::default()
        });
        let start = tokio::time::Instant::now();
        let result = policy.send(&Context::new(), &mut request(), &next).await;
        assert_eq!(status_of(&result), Some(201));
        assert!(start.elapsed() >= Duration::from_secs(7));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let s = RetrySettings::default();
        for retry in 1..40 {
            let d = s.backoff(retry);
            assert!(d <= s.max_delay, "retry {retry}: {d:?}");
            let full = s
                .base_delay
                .saturating_mul(1u32 << (retry - 1).min(16))
                .min(s.max_delay);
            assert!(d >= full / 2, "retry {retry}: {d:?} < half of {full:?}");
        }
    }
}
