//! Adapters from the domain's traits to Azure (and the emulator, which speaks the same HTTP).

pub mod arm;
pub mod auth;
pub mod bearer;
pub mod blob;
pub mod cloud;
pub mod credential;
pub mod gallery_locks;
pub mod imds;
pub mod lock;
pub mod permissions;
pub mod stemcell_store;
pub mod tls;

/// An HTTP date, `Tue, 01 Dec 2026 08:22:08 GMT` (RFC 9110 §5.6.7's IMF-fixdate, the RFC 1123
/// form of every `Date` header ARM and Blob storage send): Azure's clock, for the ARM adapter's
/// ages and the lock's "held for".
pub(crate) fn parse_http_date(text: &str) -> Option<time::OffsetDateTime> {
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    time::PrimitiveDateTime::parse(text.trim(), format)
        .ok()
        .map(time::PrimitiveDateTime::assume_utc)
}
