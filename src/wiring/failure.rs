//! How a command's error chain is read: the exit code it ends with (DESIGN.md §5) and whether a
//! retry may succeed (the CPI's `ok_to_retry`). Each typed error says its class once
//! ([`crate::error::Classified`]); the exit code and the retry answer follow from the class
//! ([`Class::exit`], [`Class::retryable`]). Both front ends read it: the CLI's exit code and the
//! CPI's error come from the same classes.
//!
//! An `anyhow` chain holds its causes as `dyn Error`, so the one list below (`classified_types!`)
//! names every typed error of the library to downcast a cause to. The architecture test
//! (`tests/integration/architecture.rs`) fails when a `thiserror` type is defined anywhere in
//! `src/` (outside the emulator) without a row here, and a row whose type does not implement
//! `Classified` does not compile, so no error is silently exit 1.
//!
//! The application floor knows no front end: the CPI's own error (`cpi::protocol::CpiError`) is
//! the CPI's answer, built from a chain read here, and the CPI reads it itself.

use crate::error::{Class, Classified, Exit};

macro_rules! classified_types {
    ($($ty:ty),* $(,)?) => {
        /// The class of `cause` when it is one of the library's typed errors.
        pub fn class_of(cause: &(dyn std::error::Error + 'static)) -> Option<Class> {
            $(
                if let Some(e) = cause.downcast_ref::<$ty>() {
                    return Some(Classified::class(e));
                }
            )*
            None
        }

        /// The type names the list classifies (the architecture test checks every error type
        /// of `src/` is among them).
        pub const CLASSIFIED: &[&str] = &[$(stringify!($ty)),*];
    };
}

classified_types! {
    crate::error::Coded,
    crate::config::ConfigError,
    crate::cleanup::CleanupError,
    crate::cleanup::SourceError,
    crate::gallery::Error,
    crate::gallery::tags::TagError,
    crate::gallery::blob_store::SinkError,
    crate::stemcell::ArchiveError,
    crate::stemcell::ManifestError,
    crate::stemcell::VersionError,
    crate::stemcell::vhd::VhdError,
    crate::stemcell::content::ContentError,
    crate::azure::blob::BlobError,
    crate::azure::blob::shared_key::InvalidKey,
    crate::azure::lock::LockError,
    crate::gallery::lock::LockError,
    crate::gallery::record::RecordError,
    crate::app::context::StorageAccountNotFound,
    crate::error::UntrustedCertificate,
}

/// The exit code for an error: the class of the first typed error in its cause chain; exit 1
/// for an error no row knows (one from a library, such as an I/O error with no context of ours).
pub fn exit_for(err: &anyhow::Error) -> Exit {
    err.chain()
        .find_map(class_of)
        .map_or(Exit::Error, Class::exit)
}

/// Whether a retry may succeed: some typed error in the chain is of a retryable class, and no
/// cause is a refused TLS certificate ([`refuses_a_certificate`]).
pub fn is_transient(err: &anyhow::Error) -> bool {
    !refuses_a_certificate(err) && err.chain().filter_map(class_of).any(Class::retryable)
}

/// Whether some cause of `err` is a refused TLS certificate, which fails the same way on every
/// attempt whichever layer reports it (and whatever class that layer says): by type where the
/// cause is typed ([`crate::azure::tls::refused_certificate`]: our own requests and rustls'
/// handshake; a gallery error that decided it where `az`'s words arrived), by its words only
/// for a cause no row of the table types (the output of `az` or of a delegate CPI carried in a
/// message, a library's error).
pub fn refuses_a_certificate(err: &anyhow::Error) -> bool {
    err.chain().any(|c| {
        crate::azure::tls::refused_certificate(c).is_some()
            || c.downcast_ref::<crate::gallery::Error>()
                .is_some_and(crate::gallery::Error::refuses_a_certificate)
            || (class_of(c).is_none() && crate::azure::tls::is_certificate_failure(&c.to_string()))
    })
}

/// An error's message for the operator: `message` (an error chain, as `{err:#}` prints it) with
/// the remedy for a refused TLS certificate added when that is its cause.
pub fn explain(message: String) -> String {
    crate::azure::tls::explain(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_keeps_its_exit_code_through_context() {
        let usage = anyhow::Error::new(crate::error::Coded::new(Exit::Usage, "bad"))
            .context("while doing x");
        assert_eq!(exit_for(&usage), Exit::Usage);
        let plain = anyhow::anyhow!("no typed cause");
        assert_eq!(exit_for(&plain), Exit::Error);
        assert!(!is_transient(&plain));
    }

    /// The typed cause decides, through the layers above it: a transient gallery error under
    /// context is worth a retry, a conflict is exit 4, an inventory failure is its cause's, and
    /// a refused certificate is never worth a retry, under any class.
    #[test]
    fn the_typed_cause_decides_through_context() {
        let throttled = crate::gallery::Error::azure(
            "read",
            "v",
            crate::gallery::error::AzureError {
                status: 429,
                code: "TooManyRequests".into(),
                message: String::new(),
                target: None,
                retry_after_secs: None,
            },
        );
        let err = anyhow::Error::new(throttled).context("while listing the gallery");
        assert!(is_transient(&err));
        assert_eq!(exit_for(&err), Exit::Error);

        let conflict = anyhow::Error::new(crate::gallery::Error::Conflict("different".into()))
            .context("while ensuring");
        assert_eq!(exit_for(&conflict), Exit::Conflict);
        assert!(!is_transient(&conflict));

        let inventory = |cause| crate::cleanup::CleanupError::Inventory {
            gallery: "g".into(),
            cause,
        };
        let timed_out = anyhow::Error::new(inventory(crate::gallery::Error::Timeout {
            operation: "list",
            resource: "g".into(),
            seconds: 1,
            state: "Running".into(),
        }));
        assert!(is_transient(&timed_out));
        let missing = anyhow::Error::new(inventory(crate::gallery::Error::NotFound("g".into())));
        assert_eq!(exit_for(&missing), Exit::NotFound);
        assert!(!is_transient(&missing));

        let url = url::Url::parse("https://login.example/tenant").unwrap();
        let cert =
            crate::error::UntrustedCertificate::new(&url, rustls::CertificateError::UnknownIssuer);
        // Under a lock timeout, a class that is otherwise worth a retry.
        let err = anyhow::Error::new(cert).context(crate::azure::lock::LockError::Timeout {
            blob: "locks/g".into(),
            waited: std::time::Duration::from_secs(1),
            lease: std::time::Duration::from_secs(30),
        });
        assert!(!is_transient(&err));
        assert_eq!(exit_for(&err), Exit::Error);
    }
}
