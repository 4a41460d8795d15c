//! Exit codes (DESIGN.md §5) and the classification of errors into them.

/// The process exit codes that other tools rely on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Success = 0,
    Error = 1,
    Usage = 2,
    NotFound = 3,
    Conflict = 4,
    EvidenceIncomplete = 5,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }
}

/// Implemented by every typed error of the library so the top level can pick the exit code
/// without string matching.
pub trait HasExit {
    fn exit(&self) -> Exit;
}

/// An error that ends the process with a specific exit code and a message written for the operator.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Coded {
    pub exit: Exit,
    pub message: String,
}

impl Coded {
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self {
            exit,
            message: message.into(),
        }
    }
}

impl HasExit for Coded {
    fn exit(&self) -> Exit {
        self.exit
    }
}

/// An error and its causes on one line (`a: b: c`), a cause left out when the text before
/// already says it (many errors repeat their source's message).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut msg = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !msg.contains(&text) {
            msg.push_str(": ");
            msg.push_str(&text);
        }
        source = s.source();
    }
    msg
}

/// The server's TLS certificate was not accepted: signed by a CA the client does not trust
/// (the remedy: `ca_cert`), or invalid in itself (expired, for another name). Never transient.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the TLS certificate of {endpoint} was not accepted (invalid peer certificate: {problem:?}): {}", remedy(.problem))]
pub struct UntrustedCertificate {
    /// `scheme://host:port` only: a URL's path and query may hold a SAS token.
    pub endpoint: String,
    /// Boxed: the gallery error that carries this stays small.
    pub problem: Box<rustls::CertificateError>,
}

impl UntrustedCertificate {
    pub fn new(url: &url::Url, problem: rustls::CertificateError) -> Self {
        let endpoint = format!(
            "{}://{}{}",
            url.scheme(),
            url.host_str().unwrap_or(""),
            url.port().map(|p| format!(":{p}")).unwrap_or_default()
        );
        Self {
            endpoint,
            problem: Box::new(problem),
        }
    }

    /// Whether trusting another CA is the remedy (the certificate's issuer is unknown).
    pub fn needs_a_ca(&self) -> bool {
        needs_a_ca(&self.problem)
    }
}

fn needs_a_ca(problem: &rustls::CertificateError) -> bool {
    matches!(
        problem,
        rustls::CertificateError::UnknownIssuer | rustls::CertificateError::BadSignature
    )
}

/// The section of docs/configure.md that explains `ca_cert`, named by every certificate error.
pub const CA_SECTION: &str = "Trusting a private CA";

fn remedy(problem: &rustls::CertificateError) -> String {
    if needs_a_ca(problem) {
        CA_CERT_HINT.to_string()
    } else {
        format!(
            "the certificate itself does not fit this endpoint (expired, not yet valid, revoked or \
             for another name); fix the server's certificate or the endpoint URL (docs/configure.md \
             \"{CA_SECTION}\" for a private CA); retrying does not help"
        )
    }
}

/// Where operators put a CA to trust; named by every certificate-verification error.
pub const CA_CERT_HINT: &str = "the server's certificate is not signed by a trusted CA; \
     trust the CA that signed it with the ca_cert setting (config key `ca_cert`, flag \
     `--ca-cert FILE` or STEMCELL_GALLERY_CA_CERT; a PEM bundle), or SSL_CERT_FILE (docs/configure.md \
     \"Trusting a private CA\"); retrying does not help";

/// Whether an error's text (its whole chain) is a TLS certificate-verification failure
/// (rustls: "invalid peer certificate: UnknownIssuer", "...: BadSignature", ...; Python's
/// "certificate verify failed"). Not transient: the same certificate fails the same way on
/// every retry. Only for causes known as text alone (the output of `az` or of a delegate CPI):
/// our own requests carry the typed `azure::tls::UntrustedCertificate`.
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
    fn certificate_failures_are_recognised_and_explained() {
        let m = "error sending request: invalid peer certificate: UnknownIssuer".to_string();
        assert!(is_certificate_failure(&m));
        assert!(explain(m).contains("ca_cert"));
        assert!(!is_certificate_failure("connection reset by peer"));
    }
}
