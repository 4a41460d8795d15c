//! Extra CA certificates trusted for every HTTPS request: ARM, blob storage and the token
//! endpoints (Azure Stack, TLS-inspecting proxies and other private CAs). reqwest's rustls
//! roots are the bundled Mozilla set, so a private CA is only trusted when named here:
//! `ca_cert` (config key, `--ca-cert FILE`, `STEMCELL_GALLERY_CA_CERT`), the Azure CPI's
//! `azure.azure_stack.ca_cert` PEM text, and `SSL_CERT_FILE`.
//!
//! A certificate the client does not accept is a typed cause, [`UntrustedCertificate`], put in
//! the error chain by the HTTP client every adapter uses ([`http_client`]), as an error no retry
//! policy re-sends: the same certificate fails the same way on every attempt.

use std::sync::Arc;

use azure_core::error::ErrorKind;
use azure_core::http::{AsyncRawResponse, HttpClient, Request};

use crate::access::CaBundle;

/// `builder` trusting the bundles' CAs as well as the built-in roots.
pub fn with_roots(builder: reqwest::ClientBuilder, bundles: &[CaBundle]) -> reqwest::ClientBuilder {
    bundles
        .iter()
        .flat_map(CaBundle::certificates)
        .fold(builder, |b, c| b.add_root_certificate(c))
}

/// An azure_core HTTP client (ARM, blob storage, azure_identity's token requests) trusting the
/// bundles: the SDK's own reqwest transport, built by us so it carries the extra roots, and
/// answering a refused certificate with [`UntrustedCertificate`] (see [`Checked`]).
///
/// In the binary ([`share_clients`]) one client is built per set of bundles and shared by
/// every adapter (a clone shares the connection pool): building one loads the system's root
/// certificates, a few milliseconds of CPU each, and a process used to build three before its
/// first request, so eight processes started at once on two cores reached the gallery tens of
/// milliseconds apart (issue 33: a burst's holder wrote before the others had announced
/// themselves). Not shared otherwise: a reqwest client's pooled connections belong to the
/// tokio runtime that opened them, and in-process callers (tests) run many runtimes.
pub fn http_client(bundles: &[CaBundle]) -> anyhow::Result<Arc<dyn HttpClient>> {
    let build = || -> anyhow::Result<Arc<dyn HttpClient>> {
        Ok(Arc::new(Checked(
            with_roots(reqwest::Client::builder(), bundles).build()?,
        )))
    };
    if !SHARED.load(std::sync::atomic::Ordering::Relaxed) {
        return build();
    }
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, c)) = built.iter().find(|(b, _)| b.as_slice() == bundles) {
        return Ok(c.clone());
    }
    let client = build()?;
    built.push((bundles.to_vec(), client.clone()));
    Ok(client)
}

static SHARED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
#[allow(clippy::type_complexity)]
static BUILT: std::sync::Mutex<Vec<(Vec<CaBundle>, Arc<dyn HttpClient>)>> =
    std::sync::Mutex::new(Vec::new());

/// Share one HTTP client per set of bundles from now on: for a process with one async runtime
/// (the binary's `cli::main`), see [`http_client`].
pub fn share_clients() {
    SHARED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The reqwest transport, with a refused server certificate turned into an error of kind
/// `Other` holding [`UntrustedCertificate`]. azure_core's retry policy re-sends `Io` and
/// `Connection` errors (which reqwest's are) up to 8 times with backoff: azure_identity's token
/// requests, whose pipeline keeps that policy, took 82 s to give up on a private CA's
/// certificate (issue 28 item 10). An `Other` error is never re-sent, by the SDK's policy or by
/// ours (`arm::transport`, `blob::retry`).
#[derive(Debug)]
struct Checked(reqwest::Client);

#[async_trait::async_trait]
impl HttpClient for Checked {
    async fn execute_request(&self, request: &Request) -> azure_core::Result<AsyncRawResponse> {
        self.0
            .execute_request(request)
            .await
            .map_err(|e| match refused_certificate(&e) {
                Some(problem) => azure_core::Error::with_error(
                    ErrorKind::Other,
                    UntrustedCertificate::new(request.url(), problem.clone()),
                    "the TLS handshake failed",
                ),
                None => e,
            })
    }
}

/// The certificate problem behind `err`, when some cause in its chain is a refused server
/// certificate: our [`UntrustedCertificate`], or rustls' own error (which reaches us inside
/// an `io::Error` from the TLS handshake, whose `source()` skips it: its `get_ref` does not).
pub fn refused_certificate<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::CertificateError> {
    let mut cause = Some(err);
    while let Some(c) = cause {
        if let Some(u) = c.downcast_ref::<UntrustedCertificate>() {
            return Some(&u.problem);
        }
        if let Some(rustls::Error::InvalidCertificate(problem)) = c.downcast_ref::<rustls::Error>()
        {
            return Some(problem);
        }
        if let Some(inner) = c
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            if let Some(problem) = refused_certificate(inner) {
                return Some(problem);
            }
        }
        cause = c.source();
    }
    None
}

/// The [`UntrustedCertificate`] in `err`'s chain, if the cause is one (built from rustls' error
/// for `url` when the chain holds only that).
pub fn untrusted_in(
    err: &(dyn std::error::Error + 'static),
    url: &url::Url,
) -> Option<UntrustedCertificate> {
    let mut cause = Some(err);
    while let Some(c) = cause {
        if let Some(u) = c.downcast_ref::<UntrustedCertificate>() {
            return Some(u.clone());
        }
        cause = c.source();
    }
    refused_certificate(err).map(|p| UntrustedCertificate::new(url, p.clone()))
}

/// The typed cause (in `crate::error`, so the domain's errors can carry it), and how a
/// certificate failure known only as text (the output of `az`, of a delegate CPI) is recognised
/// and explained (pure text rules).
pub use crate::error::{
    explain, is_certificate_failure, UntrustedCertificate, CA_CERT_HINT, CA_SECTION,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_certificate_is_found_behind_the_io_error_of_the_handshake() {
        let handshake = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
        );
        let sdk = azure_core::Error::with_error(
            ErrorKind::Connection,
            handshake,
            "failed to execute `reqwest` request",
        );
        assert_eq!(
            refused_certificate(&sdk),
            Some(&rustls::CertificateError::UnknownIssuer)
        );
        let url = url::Url::parse("https://acct.blob.core.windows.net/c/b?sig=SECRET").unwrap();
        let u = untrusted_in(&sdk, &url).unwrap();
        assert_eq!(u.endpoint, "https://acct.blob.core.windows.net");
        let text = u.to_string();
        assert!(
            text.contains("ca_cert") && text.contains(CA_SECTION) && !text.contains("SECRET"),
            "{text}"
        );

        let reset = azure_core::Error::with_error(
            ErrorKind::Io,
            std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer"),
            "failed",
        );
        assert_eq!(refused_certificate(&reset), None);
    }

    #[test]
    fn an_expired_certificate_is_refused_without_sending_for_a_ca() {
        let url = url::Url::parse("https://127.0.0.1:8443/x").unwrap();
        let u = UntrustedCertificate::new(&url, rustls::CertificateError::Expired);
        assert!(!u.needs_a_ca());
        assert!(u.to_string().contains("expired"), "{u}");
        assert_eq!(u.endpoint, "https://127.0.0.1:8443");
    }
}
