//! Blob storage for stemcell VHDs: the storage target (endpoint + credentials), the Azure CPI's
//! naming and metadata for stemcell blobs, the sparse parallel page-blob uploader, and the helpers
//! that let a re-run tell a complete stemcell blob from an interrupted one.
//!
//! # Stemcell blobs, the Azure CPI's way
//!
//! A stemcell VHD is the page blob `bosh-stemcell-<uuid>.vhd` in container `stemcell`; its CID is
//! `bosh-stemcell-<uuid>` (see [`new_stemcell_blob_name`]). Its metadata is what the Azure CPI
//! (v53+, `ComputeGalleryManager#create_stemcell_with_gallery`) writes, so a CPI can recover a
//! gallery version from a blob seeded by us (see [`stemcell_blob_metadata`]), plus one key of ours,
//! `upload_state`, that says the upload finished (see [`mark_complete`]).
//!
//! # Interrupted uploads
//!
//! 1. `upload_page_blob` creates the blob with `upload_state=uploading` (and no `image_sha256`, so
//!    neither we nor a CPI mistake a partial blob for a stemcell).
//! 2. Only after the last page was written *and* the caller verified the stream (SHA-1 of the image
//!    against `stemcell.MF`), [`mark_complete`] replaces the metadata with the CPI's keys plus
//!    `upload_state=complete` in one Set Blob Metadata request.
//! 3. A re-run asks [`find_complete_stemcell_blob`] first; partial blobs of earlier runs are listed
//!    by [`find_partial_stemcell_blobs`] and deleted with [`delete_blob_if_exists`].

//! # Layout
//!
//! [`target`]: the storage account (endpoint, credentials, SDK clients); [`error`]: the typed
//! storage error with its remedy; [`names`]: stemcell blob names and the CPI's metadata;
//! [`stemcells`]: listing, completion marks and deletion of stemcell blobs; [`upload`]: the
//! uploader; [`content`]: a blob's content digest; [`retry`]: the storage retry policy;
//! [`shared_key`]: the Shared Key signature (account keys, the emulator, Azurite).

mod content;
mod error;
mod names;
pub mod retry;
pub mod shared_key;
mod stemcells;
mod target;
mod upload;

pub use crate::gallery::blob_store::VhdSource;
pub use content::{content_digest, BlobContent};
pub use error::BlobError;
pub use names::{blob_path, sanitise_name, sanitise_value, stemcell_blob_metadata};
pub use retry::{RetryCounter, RetrySettings};
pub use stemcells::{
    blob_properties, check_vhd_source, delete_blob_if_exists, ensure_container,
    find_complete_stemcell_blob, find_partial_stemcell_blobs, list_stemcell_blobs, mark_complete,
    StemcellBlob,
};
pub(crate) use stemcells::{list_blobs, metadata_of};
pub use target::{endpoint_account, Blob, Container, StorageAuth, StorageTarget, STORAGE_SCOPE};
pub use upload::{upload_page_blob, PageRun, Progress, UploadOptions, UploadStats};

use names::to_sdk_metadata;

/// The stemcell blob names and the CPI's digest key are the ground floor's (the port's users
/// name them too).
pub use crate::names::{
    is_stemcell_cid, new_stemcell_blob_name, META_IMAGE_SHA256, STEMCELL_CONTAINER, STEMCELL_PREFIX,
};
/// Metadata key holding the SHA-1 of the stemcell's `image` file (ours: what `stemcell.MF`
/// declares, so a re-run recognises its blobs before it has read the image).
pub const META_IMAGE_SHA1: &str = "image_sha1";
/// Our completion marker's key; see the module documentation.
pub const META_UPLOAD_STATE: &str = "upload_state";
/// `upload_state` while pages are being written.
pub const UPLOAD_STATE_UPLOADING: &str = "uploading";
/// `upload_state` once every page is written and the content verified.
pub const UPLOAD_STATE_COMPLETE: &str = "complete";
/// The largest Put Page body Azure accepts.
pub const MAX_PUT_PAGE: usize = 4 * 1024 * 1024;
/// Page blobs are written in 512-byte pages.
pub const PAGE: u64 = 512;
