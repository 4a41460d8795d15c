//! The gallery domain: image definitions and versions, the `GalleryApi` trait the Azure adapter
//! implements, and (in later modules) naming, tags, the ensure decision table and the service.

pub mod api;
pub mod error;
pub mod fake;
pub mod model;
pub mod tags;

pub use api::GalleryApi;
pub use error::Error;
pub use model::*;
