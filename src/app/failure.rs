//! The one table of the tool's typed errors: for each, the exit code it ends a command with
//! (DESIGN.md §5) and whether a retry may succeed (the CPI's `ok_to_retry`). Both front ends read
//! it: the CLI's exit code and the CPI's error come from the same row.
//!
//! Every error type the library defines is a row (`failure_table!` below). Adding a variant to
//! the table without saying its exit code and retryability does not compile (both matches are
//! exhaustive, no wildcard), and the architecture test (`tests/integration/architecture.rs`)
//! fails when a `thiserror` type is defined anywhere in `src/` (outside the emulator) without a
//! row here, so no error is silently exit 1.

use crate::error::{Exit, HasExit};

macro_rules! failure_table {
    ($($variant:ident => $ty:ty),* $(,)?) => {
        /// A typed error found in a cause chain, by kind.
        #[derive(Debug, Clone, Copy)]
        pub enum Failure<'a> {
            $($variant(&'a $ty)),*
        }

        impl<'a> Failure<'a> {
            /// `cause` as one of the table's types, if it is one.
            pub fn of(cause: &'a (dyn std::error::Error + 'static)) -> Option<Failure<'a>> {
                $(
                    if let Some(e) = cause.downcast_ref::<$ty>() {
                        return Some(Failure::$variant(e));
                    }
                )*
                None
            }
        }

        /// The type names the table classifies (the architecture test checks every error type
        /// of `src/` is among them).
        pub const CLASSIFIED: &[&str] = &[$(stringify!($ty)),*];
    };
}

failure_table! {
    Coded => crate::error::Coded,
    Config => crate::config::ConfigError,
    Cleanup => crate::cleanup::CleanupError,
    Evidence => crate::cleanup::evidence::SourceError,
    Gallery => crate::gallery::Error,
    Tag => crate::gallery::tags::TagError,
    Archive => crate::stemcell::ArchiveError,
    Manifest => crate::stemcell::ManifestError,
    Version => crate::stemcell::VersionError,
    Vhd => crate::stemcell::vhd::VhdError,
    Content => crate::stemcell::content::ContentError,
    Blob => crate::azure::blob::BlobError,
    AccountKey => crate::azure::blob::shared_key::InvalidKey,
    Lock => crate::azure::lock::LockError,
    GalleryLock => crate::gallery::lock::LockError,
    Record => crate::gallery::record::RecordError,
    StorageAccountNotFound => crate::app::context::StorageAccountNotFound,
    Cpi => crate::cpi::protocol::CpiError,
    Certificate => crate::error::UntrustedCertificate,
}

impl Failure<'_> {
    /// The exit code a command ends with.
    pub fn exit(self) -> Exit {
        match self {
            Failure::Coded(e) => e.exit(),
            // Settings that cannot be resolved: a usage error (exit 2).
            Failure::Config(e) => e.exit(),
            // Incomplete evidence is exit 5; an inventory failure is its cause's.
            Failure::Cleanup(e) => e.exit(),
            // Not found 3, conflict 4, else 1.
            Failure::Gallery(e) => e.exit(),
            Failure::Archive(e) => e.exit(),
            Failure::Manifest(e) => e.exit(),
            Failure::Version(e) => e.exit(),
            Failure::Vhd(e) => e.exit(),
            Failure::Blob(e) => e.exit(),
            Failure::Lock(e) => e.exit(),
            Failure::GalleryLock(_) | Failure::Record(_) => Exit::Error,
            Failure::Evidence(_)
            | Failure::Tag(_)
            | Failure::Content(_)
            | Failure::AccountKey(_)
            | Failure::StorageAccountNotFound(_)
            | Failure::Cpi(_)
            | Failure::Certificate(_) => Exit::Error,
        }
    }

    /// Whether the same request may succeed when retried (throttling, a timeout, a busy lock).
    pub fn transient(self) -> bool {
        match self {
            Failure::Gallery(e) => e.is_transient(),
            Failure::Blob(e) => e.is_transient(),
            Failure::Lock(e) => e.is_transient(),
            Failure::GalleryLock(e) => e.is_transient(),
            Failure::Record(e) => e.is_transient(),
            Failure::Cpi(e) => e.ok_to_retry,
            // An inventory read that failed transiently (throttled, timed out) may pass next time.
            Failure::Cleanup(crate::cleanup::CleanupError::Inventory { cause, .. }) => {
                cause.is_transient()
            }
            Failure::Cleanup(crate::cleanup::CleanupError::EvidenceIncomplete { .. }) => false,
            // Input, settings and content are the same on every retry.
            Failure::Coded(_)
            | Failure::Config(_)
            | Failure::Evidence(_)
            | Failure::Tag(_)
            | Failure::Archive(_)
            | Failure::Manifest(_)
            | Failure::Version(_)
            | Failure::Vhd(_)
            | Failure::Content(_)
            | Failure::AccountKey(_)
            | Failure::StorageAccountNotFound(_) => false,
            // The same certificate fails the same way on every attempt.
            Failure::Certificate(_) => false,
        }
    }
}

/// The exit code for an error: the first typed error in its cause chain; exit 1 for an error no
/// row knows (one from a library, such as an I/O error with no context of ours).
pub fn exit_for(err: &anyhow::Error) -> Exit {
    err.chain()
        .find_map(Failure::of)
        .map_or(Exit::Error, Failure::exit)
}

/// Whether a retry may succeed: some typed error in the chain says so, and no cause is a
/// refused TLS certificate (the same certificate fails the same way every time, whichever layer
/// reports it): typed ([`crate::azure::tls::refused_certificate`]), or, for a cause known only as
/// text (the output of `az` or of a delegate CPI), its words.
pub fn is_transient(err: &anyhow::Error) -> bool {
    let refused = err
        .chain()
        .any(|c| crate::azure::tls::refused_certificate(c).is_some());
    if refused || crate::azure::tls::is_certificate_failure(&format!("{err:#}")) {
        return false;
    }
    err.chain().filter_map(Failure::of).any(|f| f.transient())
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

    #[test]
    fn a_transient_lock_error_is_worth_retrying_and_a_certificate_failure_never() {
        let cpi = crate::cpi::protocol::CpiError::new(
            crate::cpi::protocol::ErrorType::CloudError,
            "busy",
            true,
        );
        assert!(is_transient(&anyhow::Error::new(cpi)));
        let cert = crate::cpi::protocol::CpiError::new(
            crate::cpi::protocol::ErrorType::CloudError,
            "invalid peer certificate: UnknownIssuer",
            true,
        );
        assert!(!is_transient(&anyhow::Error::new(cert)));
    }

    #[test]
    fn a_refused_certificate_is_exit_1_and_never_transient_whatever_wraps_it() {
        let url = url::Url::parse("https://login.example/tenant").unwrap();
        let cert =
            crate::error::UntrustedCertificate::new(&url, rustls::CertificateError::UnknownIssuer);
        // Under a layer that would otherwise be worth retrying (a transient lock error).
        let err = anyhow::Error::new(cert).context(crate::cpi::protocol::CpiError::new(
            crate::cpi::protocol::ErrorType::CloudError,
            "delete_stemcell",
            true,
        ));
        assert!(!is_transient(&err));
        assert_eq!(exit_for(&err), Exit::Error);
    }
}
