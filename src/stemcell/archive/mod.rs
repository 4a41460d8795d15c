//! One streaming pass over a stemcell tarball (or over its inner `image` file alone).
//!
//! Layout: `STEMCELL.tgz` = gzip(tar(`stemcell.MF`, `image`, ...)), `image` = gzip(tar(`root.vhd`)).
//! The outer tarball is inflated, walked and hashed (SHA-1 and SHA-256 of `image`) on a helper
//! thread; the inner image is inflated and walked on the calling thread, which hands `root.vhd` to
//! the caller's [`VhdSink`] in chunks of at most 4 MiB, counts zero sectors and checks the
//! fixed-VHD footer. Memory is bounded (a few MiB of buffers) whatever the VHD size; nothing is
//! written to disk.
//!
//! The module is split along its passes: `full` reads everything and streams root.vhd,
//! `digest` hashes without inflating the image, and `tarball` holds the rules of the outer
//! tarball and its entries that every pass applies (which entries count, traversal, duplicates,
//! truncation, the gzip trailer).

use std::io;

use super::manifest::{Manifest, ManifestError};
use super::vhd::{Footer, VhdError};

mod digest;
mod full;
mod tarball;
#[cfg(test)]
mod tests;

pub use digest::{digest_image, digest_stemcell, Digests, VhdHead, HEAD};
pub use full::{read_image, read_stemcell};
pub use tarball::read_manifest_only;

/// Largest chunk handed to a [`VhdSink`] (a page blob's Put Page limit).
pub const CHUNK: usize = 4 * 1024 * 1024;
/// Largest accepted `stemcell.MF`.
pub const MAX_MANIFEST: u64 = 1024 * 1024;
/// Blocks passed from the outer reader thread to the image reader.
const BLOCK: usize = 1024 * 1024;
/// Blocks in flight between the two threads.
const IN_FLIGHT: usize = 4;

const OUTER: &str = "the stemcell tarball";
const IMAGE: &str = "the image file";

/// The consumer of `root.vhd`: `start` once with the file size (virtual size + 512-byte footer),
/// then `chunk` for consecutive pieces of at most [`CHUNK`] bytes covering the whole file in order
/// (offsets are multiples of 512), then `finish` once everything has been verified.
pub trait VhdSink {
    fn start(&mut self, vhd_size: u64) -> anyhow::Result<()>;
    fn chunk(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<()>;
    fn finish(&mut self) -> anyhow::Result<()>;
}

/// A sink that discards the VHD (for `inspect`).
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl VhdSink for NullSink {
    fn start(&mut self, _vhd_size: u64) -> anyhow::Result<()> {
        Ok(())
    }
    fn chunk(&mut self, _offset: u64, _data: &[u8]) -> anyhow::Result<()> {
        Ok(())
    }
    fn finish(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The file given cannot be opened: missing, a directory, or not readable.
    #[error("cannot read {what} {path}: {reason}")]
    Open {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("cannot read {what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("{what} is not a valid gzip stream or is truncated ({detail}); download the stemcell again and check its checksum")]
    Gzip { what: &'static str, detail: String },
    #[error("{what} is not a valid tar archive ({detail}); download the stemcell again and check its checksum")]
    Tar { what: &'static str, detail: String },
    #[error("{what} has an entry {entry:?} whose path escapes the archive (absolute or `..`); refusing a tampered stemcell, get it from its official source")]
    PathTraversal { what: &'static str, entry: String },
    #[error("{what} has {entry:?} as a {kind}, not a regular file; refusing a tampered stemcell, get it from its official source")]
    NotRegular {
        what: &'static str,
        entry: String,
        kind: String,
    },
    #[error("{what} contains {entry:?} more than once, so which one counts is ambiguous; refusing it, rebuild or download the stemcell again")]
    Duplicate { what: &'static str, entry: String },
    #[error("{what} has no {entry:?} entry; {remedy}")]
    Missing {
        what: &'static str,
        entry: &'static str,
        remedy: &'static str,
    },
    #[error("{what}: entry {entry:?} ends after {read} of its {size} bytes; the file is truncated, download the stemcell again")]
    Truncated {
        what: &'static str,
        entry: String,
        read: u64,
        size: u64,
    },
    #[error("stemcell.MF is {size} bytes, over the {MAX_MANIFEST}-byte limit; a stemcell manifest is a few KiB, so this is not one")]
    ManifestTooLarge { size: u64 },
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("the image file's {algorithm} is {actual} but stemcell.MF says {expected}; the download is corrupt or the manifest was altered, download the stemcell again")]
    ChecksumMismatch {
        algorithm: &'static str,
        expected: String,
        actual: String,
    },
    #[error(transparent)]
    Vhd(#[from] VhdError),
    #[error("the consumer of root.vhd failed: {0:#}")]
    Sink(anyhow::Error),
    #[error("the stemcell reader thread stopped unexpectedly; this is a bug, please report it")]
    Internal,
}

/// Open `path`, the file given as `what` ("the stemcell", "the image"), for reading: one
/// wording for every command, with the cause and the remedy (a directory is named as one, not
/// read as a broken gzip stream).
pub fn open_input(
    what: &'static str,
    path: &std::path::Path,
) -> Result<std::fs::File, ArchiveError> {
    let fail = |reason: String| ArchiveError::Open {
        what,
        path: path.display().to_string(),
        reason,
    };
    if path.is_dir() {
        return Err(fail(
            "it is a directory; give the file itself (a stemcell is one .tgz file, as bosh.io serves it)".into(),
        ));
    }
    std::fs::File::open(path).map_err(|e| {
        fail(match e.kind() {
            io::ErrorKind::NotFound => "no such file; check the path".into(),
            io::ErrorKind::PermissionDenied => {
                "permission denied; run as a user who may read it, or copy it where you can".into()
            }
            _ => format!("{e}; check that the file exists and can be read"),
        })
    })
}

/// The stemcell is what it is: the same on every retry.
impl crate::error::Classified for ArchiveError {
    fn class(&self) -> crate::error::Class {
        crate::error::Class::Permanent
    }
}

/// What the fixed VHD's footer says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhdInfo {
    /// Size of root.vhd: virtual size + 512.
    pub file_size: u64,
    pub virtual_size: u64,
    pub footer: Footer,
}

/// The result of reading a whole stemcell tarball.
#[derive(Debug, Clone)]
pub struct Summary {
    pub manifest: Manifest,
    /// SHA-1 of the image file (verified against the manifest when it carries a SHA-1).
    pub sha1: String,
    /// SHA-256 of the image file: the content identity (`image_sha256` tag).
    pub image_sha256: String,
    pub image_size: u64,
    pub vhd: VhdInfo,
    /// Bytes of root.vhd (including the footer) = data_bytes + zero_bytes.
    pub vhd_bytes: u64,
    /// Bytes in 512-byte sectors that hold data (these need uploading).
    pub data_bytes: u64,
    /// Bytes in all-zero sectors (a new page blob already reads as zeros).
    pub zero_bytes: u64,
}

/// The result of reading an `image` file alone (the CPI's `create_stemcell` image_path).
#[derive(Debug, Clone)]
pub struct ImageSummary {
    pub image_sha1: String,
    pub image_sha256: String,
    pub image_size: u64,
    pub vhd: VhdInfo,
    pub vhd_bytes: u64,
    pub data_bytes: u64,
    pub zero_bytes: u64,
}
