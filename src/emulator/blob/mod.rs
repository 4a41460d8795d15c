//! The Blob storage subset, path-style like Azurite (`/devstoreaccount1/{container}/{blob}`) or
//! host-style as on Azure (`Host: devstoreaccount1.blob.<anything>`, `/{container}/{blob}`):
//! containers, page blobs (create, Put Page update/clear, Get Page Ranges), block blobs via a
//! single Put Blob, ranged reads, properties and metadata (Get/Set Blob Metadata), leases,
//! delete, list.
//!
//! Requests are authorised by Shared Key (verified against the well-known development key, the
//! 2009-09-19+ string-to-sign) or by any non-empty bearer token.
//!
//! One file per seam: [`router`] (dispatch, paths, route templates), [`auth`] (Shared Key,
//! path- and host-style, bearer), [`containers`], [`blobs`] (page and block blobs, reads,
//! properties, metadata, delete), [`leases`], [`throttle`] (the per-blob targets of a timing
//! profile) and [`http`] (the error body and the headers every answer shares).

mod auth;
mod blobs;
mod containers;
mod http;
mod leases;
mod router;
mod throttle;

pub(crate) use auth::host_style_to_path_style;
pub(crate) use containers::valid_container_name;
pub use http::StorageError;
pub(crate) use router::{handle, is_blob_path, percent_decode, route_template};
