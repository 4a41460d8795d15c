//! The digest pass: the SHA-1 and SHA-256 of the image (on two threads) with one inflate of the
//! outer gzip and none of the image, and a look at root.vhd's tar header and first sector in the
//! image's first bytes, so a caller can decide before writing anything.

use std::io::{self, Read};
use std::sync::mpsc::sync_channel;

use flate2::bufread::MultiGzDecoder;
use sha1::{Digest, Sha1};
use sha2::Sha256;

use super::tarball::{
    key_entry, missing_image, missing_manifest, read_all, read_full, verify_checksum, walk_outer,
};
use super::{ArchiveError, BLOCK, IMAGE, IN_FLIGHT, OUTER};
use crate::stemcell::manifest::Manifest;
use crate::stemcell::vhd::{self, FOOTER_LEN};

/// What the digest pass over a stemcell (or an image file) established without inflating the
/// image: the manifest and its checksum, the image's identity, and what the image's first bytes
/// say of root.vhd.
#[derive(Debug, Clone)]
pub struct Digests {
    /// `None` for an image file alone.
    pub manifest: Option<Manifest>,
    pub sha1: String,
    pub image_sha256: String,
    pub image_size: u64,
    /// `None` when the first [`HEAD`] bytes of the image do not settle it (root.vhd not among
    /// the first entries, or an image these bytes cannot even begin to inflate): the caller then
    /// reads the whole stemcell before writing anything.
    pub vhd: Option<VhdHead>,
}

/// root.vhd as its tar header and first sector describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VhdHead {
    /// Size of root.vhd (virtual size + 512-byte footer), sector-aligned.
    pub file_size: u64,
}

/// Bytes of the (compressed) image kept by the digest pass to look at root.vhd's header.
pub const HEAD: usize = 1 << 20;

/// The digest pass over a stemcell tarball: one inflate of the outer gzip, no inflate of the
/// image. Checks everything that can be known from the outer tarball (entries, the manifest,
/// heavy vs light, the image's checksum against the manifest) and keeps the image's first bytes
/// for [`Digests::vhd`]. What needs the whole inflated VHD (the footer, the data) is left to a
/// full pass ([`read_stemcell`]), which must then be given the same file.
pub fn digest_stemcell<R: Read>(r: R) -> Result<Digests, ArchiveError> {
    let (manifest, image) = walk_outer(r, |image, size| {
        hash_keeping_head(image, Some(size), OUTER, "image")
    })?;
    let manifest = manifest.ok_or_else(missing_manifest)?;
    let image = image.ok_or_else(missing_image)?;
    verify_checksum(&manifest.sha1, &image.sha1, &image.sha256)?;
    Ok(Digests {
        manifest: Some(manifest),
        vhd: peek_vhd(&image.head),
        sha1: image.sha1,
        image_sha256: image.sha256,
        image_size: image.size,
    })
}

/// The digest pass over an `image` file alone: its SHA-1 and SHA-256 and a look at root.vhd's
/// header; the image is not inflated.
pub fn digest_image<R: Read>(r: R) -> Result<Digests, ArchiveError> {
    let image = hash_keeping_head(r, None, IMAGE, "image")?;

    Ok(Digests {
        manifest: None,
        vhd: peek_vhd(&image.head),
        sha1: image.sha1,
        image_sha256: image.sha256,
        image_size: image.size,
    })
}

struct Hashed {
    sha1: String,
    sha256: String,
    size: u64,
    head: Vec<u8>,
}

fn hash_keeping_head<R: Read>(
    mut r: R,
    expected: Option<u64>,
    what: &'static str,
    entry: &str,
) -> Result<Hashed, ArchiveError> {
    // SHA-1 on a helper thread, SHA-256 (and the read) on this one: the two digests of a
    // stemcell's image cost about as much as inflating it, so on two cores they run side by side.
    let (tx, rx) = sync_channel::<Vec<u8>>(IN_FLIGHT);
    std::thread::scope(|s| {
        let sha1_thread = s.spawn(move || {
            let mut sha1 = Sha1::new();
            for block in rx {
                sha1.update(&block);
            }
            hex::encode(sha1.finalize())
        });
        let mut sha256 = Sha256::new();
        let mut total = 0u64;
        let mut head = Vec::new();
        let result = loop {
            let mut buf = vec![0u8; BLOCK];
            let n = match read_full(&mut r, &mut buf) {
                Ok(n) => n,
                Err(source) => break Err(ArchiveError::Io { what, source }),
            };
            if n == 0 {
                break Ok(());
            }
            if total == 0 {
                // Not even the start of a gzip stream: stop now rather than hash the rest of a
                // file that may never end (`/dev/zero`, a FIFO).
                if let Err(e) = not_gzip(&buf[..n]) {
                    break Err(e);
                }
            }
            buf.truncate(n);
            sha256.update(&buf);
            if head.len() < HEAD {
                let keep = (HEAD - head.len()).min(n);
                head.extend_from_slice(&buf[..keep]);
            }
            total += n as u64;
            if tx.send(buf).is_err() {
                break Err(ArchiveError::Internal);
            }
        };
        drop(tx);
        let sha1 = sha1_thread.join().map_err(|_| ArchiveError::Internal)?;
        result?;
        read_all(expected, total, what, entry)?;
        Ok(Hashed {
            sha1,
            sha256: hex::encode(sha256.finalize()),
            size: total,
            head,
        })
    })
}

/// Refuse `first` (the first bytes of a file that must be gzip) when they cannot begin a gzip
/// stream; running out of input is not a verdict.
fn not_gzip(first: &[u8]) -> Result<(), ArchiveError> {
    let mut probe = [0u8; 512];
    match MultiGzDecoder::new(first).read(&mut probe) {
        Err(e) if e.kind() != io::ErrorKind::UnexpectedEof => Err(ArchiveError::Gzip {
            what: IMAGE,
            detail: e.to_string(),
        }),
        _ => Ok(()),
    }
}

/// root.vhd's size from the first bytes of the image, when they settle it: its tar header is
/// found, names a regular file of an acceptable size, and its first sector is not a dynamic or
/// differencing disk's footer copy. Anything else (including an error) is `None`, not an error:
/// the full pass reports it with its proper message.
fn peek_vhd(head: &[u8]) -> Option<VhdHead> {
    let mut archive = tar::Archive::new(MultiGzDecoder::new(head));
    let entries = archive.entries().ok()?;
    for entry in entries {
        let mut entry = entry.ok()?;
        match key_entry(&entry, &["root.vhd"], IMAGE) {
            Ok(None) => continue,
            Ok(Some(_)) => {}
            Err(_) => return None,
        }
        let size = entry.size();
        vhd::check_file_size(size).ok()?;
        // A valid fixed VHD is a whole number of MiB plus its footer: anything else fails at
        // the footer, so verify it in full (and write nothing) rather than upload it.
        if !(size - FOOTER_LEN as u64).is_multiple_of(vhd::MIB) {
            return None;
        }
        let mut first = [0u8; FOOTER_LEN];
        let n = read_full(&mut entry, &mut first).ok()?;
        if n < FOOTER_LEN.min(size as usize) {
            return None;
        }
        vhd::check_first_sector(&first[..n]).ok()?;
        return Some(VhdHead { file_size: size });
    }
    None
}
