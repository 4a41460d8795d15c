//! The gallery domain: image definitions and versions, the `GalleryApi` trait the Azure adapter
//! implements, tags, the ensure decision table, the cross-host lock and the service.

pub mod adopt;
pub mod api;
pub mod blob_names;
pub mod blob_store;
pub mod content;
pub mod decide;
pub mod error;
#[cfg(any(test, feature = "test-support"))]
pub mod fake;
pub mod guarded;
pub mod latest;
pub mod lifecycle;
pub mod lock;
pub mod model;
pub mod protect;
pub mod record;
pub mod service;
#[cfg(test)]
mod sim;
pub mod tags;

pub use api::GalleryApi;
pub use content::Content;
pub use error::Error;
pub use lifecycle::Phase;
pub use model::*;
