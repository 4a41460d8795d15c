//! Extra CA certificates trusted for every HTTPS request: ARM, blob storage and the token
//! endpoints (Azure Stack, TLS-inspecting proxies and other private CAs). reqwest's rustls
//! roots are the bundled Mozilla set, so a private CA is only trusted when named here:
//! `ca_cert` (config key, `--ca-cert FILE`, `STEMCELL_GALLERY_CA_CERT`), the Azure CPI's
//! `azure.azure_stack.ca_cert` PEM text, and `SSL_CERT_FILE`.

use std::sync::Arc;

pub use crate::config::tls::CaBundle;

/// `builder` trusting the bundles' CAs as well as the built-in roots.
pub fn with_roots(builder: reqwest::ClientBuilder, bundles: &[CaBundle]) -> reqwest::ClientBuilder {
    bundles
        .iter()
        .flat_map(CaBundle::certificates)
        .fold(builder, |b, c| b.add_root_certificate(c))
}

/// An azure_core HTTP client (ARM, blob storage, azure_identity's token requests) trusting the
/// bundles: the SDK's own reqwest transport, built by us so it carries the extra roots.
pub fn http_client(bundles: &[CaBundle]) -> anyhow::Result<Arc<dyn azure_core::http::HttpClient>> {
    Ok(Arc::new(
        with_roots(reqwest::Client::builder(), bundles).build()?,
    ))
}

/// How a certificate failure is recognised and explained (pure text rules, in `crate::error`).
pub use crate::error::{explain, is_certificate_failure, CA_CERT_HINT};
