//! Our retry policy for every Blob storage request, plugged into the SDK's pipeline.
//!
//! Why not the SDK's own: azure_core 0.21's retry policies cannot count retries per operation,
//! have no per-attempt timeout (a hung connection would hang the upload forever), and their
//! exponential policy has no jitter. So the pipeline gets `RetryOptions::none()` and this policy as a
//! per-call policy in front of it. A second, per-retry policy (`RetryAfterProbe`, next to the
//! transport) reads `Retry-After` / `x-ms-retry-after-ms` from each raw 429/503 response, because
//! the SDK's error value keeps the status but does not expose the response headers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use azure_core_legacy::error::ErrorKind;
use azure_core_legacy::headers::{HeaderName, RETRY_AFTER, RETRY_AFTER_MS, X_MS_RETRY_AFTER_MS};
use azure_core_legacy::{Context, Policy, PolicyResult, Request, StatusCode};
use rand::Rng;

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
        let exp = self
            .base_delay
            .saturating_mul(1u32 << retry.saturating_sub(1).min(16));
        let capped = exp.min(self.max_delay);
        let jitter = rand::thread_rng().gen_range(0.5..=1.0);
        capped.mul_f64(jitter)
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

/// Where the probe leaves the server's requested delay for the attempt in flight.
#[derive(Debug, Default)]
struct RetryAfterSlot(Mutex<Option<Duration>>);

/// Is this SDK error worth another attempt? 408, 429, 500, 502, 503, 504 and I/O (connection)
/// errors are; everything else (auth, not found, conflicts, bad requests) is not.
pub fn is_transient_azure(err: &azure_core_legacy::Error) -> bool {
    match err.kind() {
        ErrorKind::HttpResponse { status, .. } => is_transient_status(*status),
        // A certificate the client does not trust fails the same way on every retry.
        ErrorKind::Io => !crate::azure::tls::is_certificate_failure(&chain_text(err)),
        ErrorKind::DataConversion
        | ErrorKind::Credential
        | ErrorKind::MockFramework
        | ErrorKind::Other => false,
    }
}

/// The error and its sources, as one line.
pub fn chain_text(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

pub fn is_transient_status(status: StatusCode) -> bool {
    matches!(u16::from(status), 408 | 429 | 500 | 502 | 503 | 504)
}

/// The per-call retry policy (see the module comment).
#[derive(Debug)]
pub struct RetryPolicy {
    settings: RetrySettings,
    /// The token credential, when storage is reached with one: a 401 drops its cached token.
    credential: Option<Arc<dyn azure_core_legacy::auth::TokenCredential>>,
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
    pub fn with_credential(
        mut self,
        credential: Arc<dyn azure_core_legacy::auth::TokenCredential>,
    ) -> Self {
        self.credential = Some(credential);
        self
    }
}

fn is_unauthorized(err: &azure_core_legacy::Error) -> bool {
    matches!(err.kind(), ErrorKind::HttpResponse { status, .. } if u16::from(*status) == 401)
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
            .get::<RetryBudget>()
            .map(|b| b.0)
            .unwrap_or(self.settings.max_retries);
        let mut retry = 0u32;
        let mut token_refreshed = false;
        loop {
            // Our bodies are always `Body::Bytes` (cheap clones, nothing to rewind).
            let slot = Arc::new(RetryAfterSlot::default());
            let mut attempt_ctx = ctx.clone();
            attempt_ctx.insert(slot.clone());
            let outcome = tokio::time::timeout(
                self.settings.attempt_timeout,
                next[0].send(&attempt_ctx, request, &next[1..]),
            )
            .await;
            let err = match outcome {
                Ok(Ok(response)) => return Ok(response),
                Ok(Err(err)) => err,
                Err(_elapsed) => {
                    let limit = self.settings.attempt_timeout;
                    azure_core_legacy::Error::with_message(ErrorKind::Io, move || {
                        format!(
                            "no response within {:.1} s (the per-request timeout; set STEMCELL_GALLERY_HTTP_TIMEOUT to change it)",
                            limit.as_secs_f64()
                        )
                    })
                }
            };
            if is_unauthorized(&err) && !token_refreshed {
                // Once per request: get a fresh token (the next attempt's authorization policy
                // asks the credential again) and retry at once.
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
                continue;
            }
            if !is_transient_azure(&err) || retry >= max_retries {
                return Err(err);
            }
            retry += 1;
            if let Some(counter) = ctx.get::<RetryCounter>() {
                counter.0.fetch_add(1, Ordering::Relaxed);
            }
            let requested = slot
                .0
                .lock()
                .ok()
                .and_then(|g| *g)
                .map(|d| d.min(self.settings.max_retry_after));
            let delay = match requested {
                Some(server) => server.max(self.settings.backoff(retry)),
                None => self.settings.backoff(retry),
            };
            tracing::debug!(
                method = %request.method(),
                path = request.url().path(),
                retry,
                max_retries,
                ?delay,
                "transient storage error, retrying: {err}"
            );
            tokio::time::sleep(delay).await;
        }
    }
}

/// The per-retry probe that records a 429/503's requested delay (see the module comment).
#[derive(Debug, Default)]
pub struct RetryAfterProbe;

fn header_delay(headers: &azure_core_legacy::headers::Headers) -> Option<Duration> {
    let ms = |name: &HeaderName| {
        headers
            .get_optional_str(name)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_millis)
    };
    ms(&RETRY_AFTER_MS)
        .or_else(|| ms(&X_MS_RETRY_AFTER_MS))
        .or_else(|| {
            // Seconds; the HTTP-date form is rare for storage and falls back to our backoff.
            headers
                .get_optional_str(&RETRY_AFTER)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs)
        })
}

#[async_trait::async_trait]
impl Policy for RetryAfterProbe {
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> PolicyResult {
        let result = next[0].send(ctx, request, &next[1..]).await;
        if let Ok(response) = &result {
            if matches!(u16::from(response.status()), 429 | 503) {
                if let (Some(slot), Some(delay)) = (
                    ctx.get::<Arc<RetryAfterSlot>>(),
                    header_delay(response.headers()),
                ) {
                    if let Ok(mut g) = slot.0.lock() {
                        *g = Some(delay);
                    }
                }
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use azure_core_legacy::headers::Headers;
    use azure_core_legacy::{Method, Response, Url};
    use std::sync::atomic::AtomicUsize;

    /// A transport stand-in answering from a script of statuses (with optional Retry-After).
    #[derive(Debug)]
    struct Scripted {
        script: Vec<(u16, Option<&'static str>)>,
        calls: AtomicUsize,
    }

    #[async_trait::async_trait]
    impl Policy for Scripted {
        async fn send(&self, _: &Context, _: &mut Request, _: &[Arc<dyn Policy>]) -> PolicyResult {
            let i = self.calls.fetch_add(1, Ordering::SeqCst);
            let (status, retry_after) = self.script[i.min(self.script.len() - 1)];
            let mut headers = Headers::new();
            if let Some(v) = retry_after {
                headers.insert(RETRY_AFTER, v);
            }
            let status = StatusCode::try_from(status).expect("valid status");
            let body = Box::pin(futures::stream::empty::<
                azure_core_legacy::Result<bytes::Bytes>,
            >());
            let response = Response::new(status, headers, body);
            if response.status().is_success() {
                Ok(response)
            } else {
                Err(azure_core_legacy::Error::new(
                    ErrorKind::http_response(status, None),
                    std::io::Error::other("scripted"),
                ))
            }
        }
    }

    /// Our policy in front of a scripted transport that already turns error statuses into errors.
    fn pipeline(script: Vec<(u16, Option<&'static str>)>) -> (RetryPolicy, Vec<Arc<dyn Policy>>) {
        let settings = RetrySettings {
            max_retries: 3,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            max_retry_after: Duration::from_secs(60),
            attempt_timeout: Duration::from_secs(5),
        };
        let scripted: Arc<dyn Policy> = Arc::new(Scripted {
            script,
            calls: AtomicUsize::new(0),
        });
        (RetryPolicy::new(settings), vec![scripted])
    }

    fn request() -> Request {
        Request::new(
            Url::parse("http://127.0.0.1:1/devstoreaccount1/c/b").expect("url"),
            Method::Put,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn throttled_put_is_retried_then_succeeds_and_counted() {
        let (policy, next) = pipeline(vec![(503, None), (429, None), (201, None)]);
        let counter = RetryCounter::default();
        let mut ctx = Context::new();
        ctx.insert(counter.clone());
        let result = policy.send(&ctx, &mut request(), &next).await;
        assert!(result.is_ok());
        assert_eq!(counter.get(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_bounded() {
        let (policy, next) = pipeline(vec![(500, None)]);
        let counter = RetryCounter::default();
        let mut ctx = Context::new();
        ctx.insert(counter.clone());
        let err = policy
            .send(&ctx, &mut request(), &next)
            .await
            .expect_err("500 forever must fail");
        assert!(is_transient_azure(&err));
        assert_eq!(counter.get(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn permanent_errors_are_not_retried() {
        let (policy, next) = pipeline(vec![(403, None), (201, None)]);
        let counter = RetryCounter::default();
        let mut ctx = Context::new();
        ctx.insert(counter.clone());
        assert!(policy.send(&ctx, &mut request(), &next).await.is_err());
        assert_eq!(counter.get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_honoured() {
        // The probe sees the raw 429 with Retry-After: 7 and the policy waits at least that long.
        #[derive(Debug)]
        struct RawThenOk(AtomicUsize);
        #[async_trait::async_trait]
        impl Policy for RawThenOk {
            async fn send(
                &self,
                _: &Context,
                _: &mut Request,
                _: &[Arc<dyn Policy>],
            ) -> PolicyResult {
                let first = self.0.fetch_add(1, Ordering::SeqCst) == 0;
                let mut headers = Headers::new();
                let status = if first {
                    headers.insert(RETRY_AFTER, "7");
                    StatusCode::TooManyRequests
                } else {
                    StatusCode::Created
                };
                let body = Box::pin(futures::stream::empty::<
                    azure_core_legacy::Result<bytes::Bytes>,
                >());
                Ok(Response::new(status, headers, body))
            }
        }
        /// Turns an error response into an error, like the SDK's NoRetryPolicy.
        #[derive(Debug)]
        struct ErrorOnStatus;
        #[async_trait::async_trait]
        impl Policy for ErrorOnStatus {
            async fn send(
                &self,
                ctx: &Context,
                req: &mut Request,
                next: &[Arc<dyn Policy>],
            ) -> PolicyResult {
                let response = next[0].send(ctx, req, &next[1..]).await?;
                if response.status().is_success() {
                    Ok(response)
                } else {
                    Err(azure_core_legacy::Error::new(
                        ErrorKind::http_response(response.status(), None),
                        std::io::Error::other("status"),
                    ))
                }
            }
        }
        let policy = RetryPolicy::new(RetrySettings {
            base_delay: Duration::from_millis(10),
            ..RetrySettings::default()
        });
        let next: Vec<Arc<dyn Policy>> = vec![
            Arc::new(ErrorOnStatus),
            Arc::new(RetryAfterProbe),
            Arc::new(RawThenOk(AtomicUsize::new(0))),
        ];
        let start = tokio::time::Instant::now();
        let result = policy.send(&Context::new(), &mut request(), &next).await;
        assert!(result.is_ok());
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
