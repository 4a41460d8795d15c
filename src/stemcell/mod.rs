//! Stemcells: the manifest (`stemcell.MF`), the gallery version key, the streaming tarball
//! reader, and fixed-VHD checks. Pure but for the readers; no Azure here.

pub mod archive;
pub mod content;
pub mod manifest;
pub mod naming;
pub mod platform;
#[cfg(any(test, feature = "test-support"))]
pub mod testgen;
pub mod version;
pub mod vhd;

pub use archive::{
    open_input, read_image, read_manifest_only, read_stemcell, ArchiveError, NullSink, VhdSink,
};
pub use manifest::{Checksum, CloudProperties, Manifest, ManifestError};
pub use platform::{Architecture, HyperVGeneration};
pub use version::{VersionError, VersionKey};
