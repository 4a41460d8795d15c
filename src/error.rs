//! Exit codes (DESIGN.md §5) and the one classification of errors: every typed error of the
//! library says its [`Class`] once ([`Classified::class`]), and everything that follows from a
//! failure follows from the class, each in one match: the exit code a command ends with, whether
//! a caller may retry (the CPI's `ok_to_retry`), whether the transport re-sends the request, and
//! whether a guarded write observes again before deciding. How an HTTP status Azure answered with
//! is classified is one table too ([`class_of_status`]), with a column per service where their
//! guidance differs. `wiring::failure` reads a cause chain with them.

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

/// What kind of failure an error is: all a front end needs to end a command (its exit code) or
/// to answer BOSH (`ok_to_retry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The command line or the settings are wrong (a bad flag, an unresolvable config).
    Usage,
    /// The thing asked for does not exist.
    NotFound,
    /// The same version key already holds different content, or Azure refuses the change
    /// (deletion blocked, a soft-deleted name taken by other content).
    Conflict,
    /// Cleanup refused: an evidence source could not be read, so nothing was deleted.
    EvidenceIncomplete,
    /// The same request may succeed when sent again after a backoff (throttled, a server error,
    /// no answer): the transport re-sends it, a guarded write observes again, a caller may retry.
    Transient,
    /// Another operation on the resource is in flight (ARM's 409): observe again before
    /// deciding; nothing is re-sent as it was, and a caller is not told to retry.
    Busy,
    /// Nothing to re-send now, but the whole command may succeed when run again later (a lock
    /// wait or an operation that ran out of time, a contended record, a hand-over that timed out).
    Later,
    /// Fails the same way every time until something changes (input, content, permissions, a
    /// certificate, Azure's verdict).
    Permanent,
}

impl Class {
    /// The exit code a command ends with (DESIGN.md §5).
    pub fn exit(self) -> Exit {
        match self {
            Class::Usage => Exit::Usage,
            Class::NotFound => Exit::NotFound,
            Class::Conflict => Exit::Conflict,
            Class::EvidenceIncomplete => Exit::EvidenceIncomplete,
            Class::Transient | Class::Busy | Class::Later | Class::Permanent => Exit::Error,
        }
    }

    /// Whether the command may succeed when run again (the CPI's `ok_to_retry`).
    pub fn retryable(self) -> bool {
        match self {
            Class::Transient | Class::Later => true,
            Class::Usage
            | Class::NotFound
            | Class::Conflict
            | Class::EvidenceIncomplete
            | Class::Busy
            | Class::Permanent => false,
        }
    }

    /// Whether the transport sends the same request again (after a backoff, honouring
    /// `Retry-After`).
    pub fn resend(self) -> bool {
        matches!(self, Class::Transient)
    }

    /// Whether a guarded write that failed this way observes the version again and decides
    /// anew (the deletes and reference writes of `gallery::guarded`).
    pub fn observe_again(self) -> bool {
        matches!(self, Class::Transient | Class::Busy)
    }

    /// The class of a failure of a store under a guarded write (the cross-host lock, the
    /// reference record): nothing there is re-sent or observed again by the write, so what may
    /// pass on a retry passes only on a re-run ([`Class::Later`]); the rest stays as it is.
    pub fn deferred(self) -> Class {
        match self {
            Class::Transient | Class::Later => Class::Later,
            Class::Busy => Class::Permanent,
            other => other,
        }
    }
}

/// The Azure service that answered: their retry guidance differs in a few statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Azure Resource Manager (the gallery's REST API, operation status, consumer lists).
    Arm,
    /// Blob storage (the pipeline's retry policy, leases, the record copies).
    Blob,
    /// The Instance Metadata Service's token endpoint (managed identity).
    Imds,
}

/// The one status → class table for an error answer of Azure. A status not listed fails the same
/// way every time ([`Class::Permanent`]: 400, 401, 403, 404 and 412 are the callers' to turn into
/// answers or typed errors).
///
/// - 408 and 429 are transient everywhere (Azure's throttling and request timeouts).
/// - ARM: every 5xx is transient (ARM's retry guidance for the REST API), and 409 means another
///   operation on the resource is in flight ([`Class::Busy`]).
/// - Blob: 500, 502, 503 and 504 only (the storage retry policy of the Azure SDKs; 501 and 505
///   say the request itself is not supported); 409 and 412 are the blob's state or lease, which
///   no re-send changes.
/// - IMDS: every 5xx, and 404 and 410, which IMDS answers while the identity is being set up
///   or IMDS itself is being updated (the managed-identity token guidance; @azure/identity's
///   `imdsRetryPolicy` retries both, azure-identity for Python retries 410 for at least 70 s).
pub fn class_of_status(service: Service, status: u16) -> Class {
    match (service, status) {
        (_, 408 | 429) => Class::Transient,
        (Service::Arm | Service::Imds, 500..=599) => Class::Transient,
        (Service::Blob, 500 | 502 | 503 | 504) => Class::Transient,
        (Service::Arm, 409) => Class::Busy,
        (Service::Imds, 404 | 410) => Class::Transient,
        _ => Class::Permanent,
    }
}

/// Implemented by every typed error of the library: its class, said once. A type whose class
/// depends on its cause asks the cause.
pub trait Classified {
    fn class(&self) -> Class;
}

/// An error that ends the process with a specific exit code and a message written for the operator.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Coded {
    pub exit: Exit,
    pub message: String,
}

impl Coded {
    /// `exit` names the class (never `Success`: an error does not end a command with 0).
    pub fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self {
            exit,
            message: message.into(),
        }
    }
}

/// A coded error's class is the one its exit code names; an error never ends a command with 0.
impl Classified for Coded {
    fn class(&self) -> Class {
        match self.exit {
            Exit::Usage => Class::Usage,
            Exit::NotFound => Class::NotFound,
            Exit::Conflict => Class::Conflict,
            Exit::EvidenceIncomplete => Class::EvidenceIncomplete,
            Exit::Error | Exit::Success => Class::Permanent,
        }
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

/// The same certificate fails the same way on every attempt.
impl Classified for UntrustedCertificate {
    fn class(&self) -> Class {
        Class::Permanent
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

    /// One row per status whose class differs between the services, and the shared rows.
    #[test]
    fn a_status_is_classified_by_one_table_with_a_column_per_service() {
        use Service::{Arm, Blob, Imds};
        let t = Class::Transient;
        let p = Class::Permanent;
        let rows: [(u16, [Class; 3]); 12] = [
            (400, [p, p, p]),
            (403, [p, p, p]),
            (404, [p, p, t]),
            (408, [t, t, t]),
            (409, [Class::Busy, p, p]),
            (410, [p, p, t]),
            (412, [p, p, p]),
            (429, [t, t, t]),
            (500, [t, t, t]),
            (501, [t, p, t]),
            (503, [t, t, t]),
            (505, [t, p, t]),
        ];
        for (status, [arm, blob, imds]) in rows {
            assert_eq!(class_of_status(Arm, status), arm, "ARM {status}");
            assert_eq!(class_of_status(Blob, status), blob, "blob {status}");
            assert_eq!(class_of_status(Imds, status), imds, "IMDS {status}");
        }
    }

    #[test]
    fn certificate_failures_are_recognised_and_explained() {
        let m = "error sending request: invalid peer certificate: UnknownIssuer".to_string();
        assert!(is_certificate_failure(&m));
        assert!(explain(m).contains("ca_cert"));
        assert!(!is_certificate_failure("connection reset by peer"));
    }

    /// DESIGN.md §5: 1 error · 2 usage · 3 not found · 4 content conflict · 5 cleanup refused
    /// because evidence is incomplete; only a transient failure is worth a retry.
    #[test]
    fn each_class_has_the_exit_code_and_retry_answer_of_design_section_5() {
        let table = [
            (Class::Usage, 2, false),
            (Class::NotFound, 3, false),
            (Class::Conflict, 4, false),
            (Class::EvidenceIncomplete, 5, false),
            (Class::Transient, 1, true),
            (Class::Busy, 1, false),
            (Class::Later, 1, true),
            (Class::Permanent, 1, false),
        ];
        for (class, code, retry) in table {
            assert_eq!(class.exit().code(), code, "{class:?}");
            assert_eq!(class.retryable(), retry, "{class:?}");
        }
        // Only a transient failure is re-sent as it was; a busy resource is observed again.
        let resent: Vec<Class> = table.iter().map(|r| r.0).filter(|c| c.resend()).collect();
        assert_eq!(resent, [Class::Transient]);
        let observed: Vec<Class> = table
            .iter()
            .map(|r| r.0)
            .filter(|c| c.observe_again())
            .collect();
        assert_eq!(observed, [Class::Transient, Class::Busy]);
        assert_eq!(Exit::Success.code(), 0);
        // A coded error is the class its exit code names.
        for (exit, class) in [
            (Exit::Usage, Class::Usage),
            (Exit::NotFound, Class::NotFound),
            (Exit::Conflict, Class::Conflict),
            (Exit::EvidenceIncomplete, Class::EvidenceIncomplete),
            (Exit::Error, Class::Permanent),
        ] {
            assert_eq!(Coded::new(exit, "m").class(), class);
            assert_eq!(Coded::new(exit, "m").class().exit(), exit);
        }
    }
}
