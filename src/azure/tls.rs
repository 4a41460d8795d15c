//! Extra CA certificates trusted for every HTTPS request: ARM, blob storage and the token
//! endpoints (Azure Stack, TLS-inspecting proxies and other private CAs). reqwest's rustls
//! roots are the bundled Mozilla set, so a private CA is only trusted when named here:
//! `ca_cert` (config key, `--ca-cert FILE`, `STEMCELL_GALLERY_CA_CERT`), the Azure CPI's
//! `azure.azure_stack.ca_cert` PEM text, and `SSL_CERT_FILE`.

use std::sync::Arc;

/// Where operators put a CA to trust; named by every certificate-verification error.
pub const CA_CERT_HINT: &str = "the server's certificate is not signed by a trusted CA; \
     trust the CA that signed it with the ca_cert setting (config key `ca_cert`, flag \
     `--ca-cert FILE` or STEMCELL_GALLERY_CA_CERT; a PEM bundle), or SSL_CERT_FILE; retrying \
     does not help";

pub use crate::config::tls::CaBundle;

/// `builder` trusting the bundles' CAs as well as the built-in roots.
pub fn with_roots(builder: reqwest::ClientBuilder, bundles: &[CaBundle]) -> reqwest::ClientBuilder {
    bundles
        .iter()
        .flat_map(CaBundle::certificates)
        .fold(builder, |b, c| b.add_root_certificate(c))
}

/// An azure_core HTTP client (blob storage, azure_identity's token requests) trusting the bundles.
pub fn http_client(bundles: &[CaBundle]) -> anyhow::Result<Arc<dyn azure_core::HttpClient>> {
    Ok(Arc::new(
        with_roots(reqwest::Client::builder(), bundles).build()?,
    ))
}

/// Whether an error's text (its whole chain) is a TLS certificate-verification failure
/// (rustls: "invalid peer certificate: UnknownIssuer", "...: BadSignature", ...). Not transient:
/// the same certificate fails the same way on every retry.
pub fn is_certificate_failure(text: &str) -> bool {
    let t = text.to_ascii_lowercase();
    t.contains("invalid peer certificate")
        || t.contains("unknownissuer")
        || t.contains("certificate verify failed")
}

/// The message with [`CA_CERT_HINT`] appended when it is a certificate failure.
pub fn explain(message: String) -> String {
    if is_certificate_failure(&message) && !message.contains("ca_cert") {
        format!("{message} ({CA_CERT_HINT})")
    } else {
        message
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_empty_bundles_are_refused() {
        assert!(CaBundle::parse("ca_cert x", b"not a pem").is_err());
        assert!(CaBundle::parse("ca_cert x", b"").is_err());
        let bad = b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n";
        assert!(CaBundle::parse("ca_cert x", bad).is_err());
    }

    #[test]
    fn certificate_failures_are_recognised_and_explained() {
        let m = "error sending request: invalid peer certificate: UnknownIssuer".to_string();
        assert!(is_certificate_failure(&m));
        assert!(explain(m).contains("ca_cert"));
        assert!(!is_certificate_failure("connection reset by peer"));
    }
}
