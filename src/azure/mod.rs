//! Adapters from the domain's traits to Azure (and the emulator, which speaks the same HTTP).

pub mod arm;
pub mod auth;
pub mod bearer;
pub mod blob;
pub mod credential;
pub mod gallery_locks;
pub mod imds;
pub mod lock;
pub mod permissions;
pub mod stemcell_store;
pub mod tls;

/// An HTTP date, `Tue, 01 Dec 2026 08:22:08 GMT` (the IMF-fixdate of every `Date` header ARM and
/// Blob storage send): Azure's clock, for the ARM adapter's ages, blob listings and the lock's
/// "held for". azure_core's own parser, as the blob listing uses it.
pub(crate) fn parse_http_date(text: &str) -> Option<time::OffsetDateTime> {
    azure_core::time::parse_rfc7231(text.trim()).ok()
}
