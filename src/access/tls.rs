//! A validated bundle of extra CA certificates (`ca_cert`, the cpi.json's Azure Stack CA,
//! `SSL_CERT_FILE`), parsed when the settings are resolved so a bad bundle is a configuration
//! error before any request. The clients that trust it are built in `azure::tls`.

use std::fmt;

/// A validated PEM bundle of CA certificates and where it came from.
#[derive(Clone, PartialEq, Eq)]
pub struct CaBundle {
    /// `ca_cert /path`, `SSL_CERT_FILE /path`, or the cpi.json key.
    pub source: String,
    pem: Vec<u8>,
    /// Certificates in the bundle.
    pub count: usize,
}

impl fmt::Debug for CaBundle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CaBundle")
            .field("source", &self.source)
            .field("count", &self.count)
            .finish()
    }
}

impl CaBundle {
    /// Parse a PEM bundle; refused when it holds no certificate or one does not parse.
    pub fn parse(source: impl Into<String>, pem: &[u8]) -> Result<CaBundle, String> {
        let source = source.into();
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| format!("{source}: not a PEM certificate bundle ({e})"))?;
        if certs.is_empty() {
            return Err(format!(
                "{source}: holds no PEM certificate (expected -----BEGIN CERTIFICATE----- blocks)"
            ));
        }
        // Each one must also be accepted as a root (a DER that rustls refuses fails here,
        // not at the first request).
        let mut builder = reqwest::Client::builder();
        for c in certs.iter().cloned() {
            builder = builder.add_root_certificate(c);
        }
        builder
            .build()
            .map_err(|e| format!("{source}: a certificate cannot be used as a CA ({e})"))?;
        Ok(CaBundle {
            source,
            pem: pem.to_vec(),
            count: certs.len(),
        })
    }

    /// The bundle's certificates, for a client's roots.
    pub fn certificates(&self) -> Vec<reqwest::Certificate> {
        reqwest::Certificate::from_pem_bundle(&self.pem).unwrap_or_default()
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
}
