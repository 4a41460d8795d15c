//! The content digest of a VHD: what two copies of one disk have in common however they were
//! written (sparse or not).
//!
//! A page blob reads as zeros wherever nothing was written, and our uploader skips all-zero
//! ranges while the Azure CPI (v52–v53) writes every page; SHA-256 of the stored bytes would
//! still agree, but reading the whole blob costs the whole disk. The content digest is defined
//! so that only data needs to be read: SHA-256 over a fixed label, then, for every 512-byte
//! sector holding a non-zero byte, in increasing offset order, the sector's byte offset (u64
//! big-endian) followed by its 512 bytes; then the disk's size in bytes (u64 big-endian, the VHD
//! file size including its footer). All-zero sectors contribute nothing, wherever they come
//! from (skipped, never written, or written as zeros), so the digest of a blob read through Get
//! Page Ranges equals the digest of the `root.vhd` it was uploaded from. The one definition,
//! used for the stemcell's side and for the blob's side.

use sha2::{Digest, Sha256};

use super::archive::VhdSink;
use super::vhd::SECTOR;

/// Domain label mixed in first, so this digest is never mistaken for a plain SHA-256.
const LABEL: &[u8] = b"stemcell-gallery vhd content v1\0";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ContentError {
    #[error("VHD data at offset {offset} is not 512-byte aligned")]
    Unaligned { offset: u64 },
    #[error("VHD data at offset {offset} came after data up to offset {seen}; the content digest needs increasing offsets")]
    OutOfOrder { offset: u64, seen: u64 },
    #[error("VHD data ends at offset {end}, beyond the disk size {size}")]
    BeyondSize { end: u64, size: u64 },
}

/// The disk's data is what it is: the same on every retry.
impl crate::error::Classified for ContentError {
    fn class(&self) -> crate::error::Class {
        crate::error::Class::Permanent
    }
}

/// Streams a disk's data into its content digest. Feed it pieces in increasing offset order;
/// pieces may leave gaps (gaps read as zeros) and may contain zeros.
#[derive(Clone)]
pub struct ContentHasher {
    sha: Sha256,
    /// End of the data seen so far.
    next: u64,
}

impl Default for ContentHasher {
    fn default() -> Self {
        Self::new()
    }
}

impl ContentHasher {
    pub fn new() -> Self {
        let mut sha = Sha256::new();
        sha.update(LABEL);
        Self { sha, next: 0 }
    }

    /// The bytes at `offset..offset + data.len()`.
    pub fn update(&mut self, offset: u64, data: &[u8]) -> Result<(), ContentError> {
        if !offset.is_multiple_of(SECTOR as u64) {
            return Err(ContentError::Unaligned { offset });
        }
        if offset < self.next {
            return Err(ContentError::OutOfOrder {
                offset,
                seen: self.next,
            });
        }
        let mut at = offset;
        for sector in data.chunks(SECTOR) {
            if sector.iter().any(|&b| b != 0) {
                self.sha.update(at.to_be_bytes());
                self.sha.update(sector);
                // A final partial sector is hashed as if padded with zeros, as storage reads it.
                if sector.len() < SECTOR {
                    self.sha.update(&[0u8; SECTOR][..SECTOR - sector.len()]);
                }
            }
            at += sector.len() as u64;
        }
        self.next = at;
        Ok(())
    }

    /// The digest (lower-case hex) of a disk of `size` bytes.
    pub fn finish(mut self, size: u64) -> Result<String, ContentError> {
        if self.next > size.div_ceil(SECTOR as u64) * SECTOR as u64 {
            return Err(ContentError::BeyondSize {
                end: self.next,
                size,
            });
        }
        self.sha.update(size.to_be_bytes());
        Ok(hex::encode(self.sha.finalize()))
    }
}

/// A [`VhdSink`] computing the content digest of the `root.vhd` the archive reader streams.
#[derive(Default)]
pub struct ContentSink {
    hasher: ContentHasher,
    size: u64,
    digest: Option<String>,
}

impl ContentSink {
    pub fn new() -> Self {
        Self::default()
    }

    /// The digest, once the reader has called `finish` (everything verified).
    pub fn digest(&self) -> Option<&str> {
        self.digest.as_deref()
    }
}

impl VhdSink for ContentSink {
    fn start(&mut self, vhd_size: u64) -> anyhow::Result<()> {
        self.size = vhd_size;
        Ok(())
    }
    fn chunk(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<()> {
        self.hasher.update(offset, data)?;
        Ok(())
    }
    fn finish(&mut self) -> anyhow::Result<()> {
        let hasher = std::mem::take(&mut self.hasher);
        self.digest = Some(hasher.finish(self.size)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk() -> Vec<u8> {
        let mut d = vec![0u8; 64 * 1024];
        d[1000] = 7;
        d[40_000..40_100].fill(9);
        let n = d.len();
        d[n - 512..n - 504].copy_from_slice(b"conectix");
        d
    }

    fn whole(d: &[u8]) -> String {
        let mut h = ContentHasher::new();
        h.update(0, d).unwrap();
        h.finish(d.len() as u64).unwrap()
    }

    #[test]
    fn sparse_and_full_copies_of_one_disk_have_one_digest() {
        let d = disk();
        let full = whole(&d);
        // Only the non-zero sectors, as Get Page Ranges of a sparse upload returns them.
        let mut h = ContentHasher::new();
        h.update(512, &d[512..1024]).unwrap();
        h.update(39_936, &d[39_936..40_448]).unwrap();
        h.update(d.len() as u64 - 512, &d[d.len() - 512..]).unwrap();
        assert_eq!(h.finish(d.len() as u64).unwrap(), full);
        // In pieces with written zeros between.
        let mut h = ContentHasher::new();
        for (i, piece) in d.chunks(4096).enumerate() {
            h.update(i as u64 * 4096, piece).unwrap();
        }
        assert_eq!(h.finish(d.len() as u64).unwrap(), full);
    }

    #[test]
    fn a_changed_byte_a_moved_sector_or_another_size_changes_the_digest() {
        let d = disk();
        let full = whole(&d);
        let mut changed = d.clone();
        changed[1001] = 1;
        assert_ne!(whole(&changed), full);
        let mut moved = vec![0u8; d.len()];
        moved[1512] = 7;
        moved[40_000..40_100].fill(9);
        let n = moved.len();
        moved[n - 512..n - 504].copy_from_slice(b"conectix");
        assert_ne!(whole(&moved), full);
        let mut h = ContentHasher::new();
        h.update(0, &d).unwrap();
        assert_ne!(h.finish(d.len() as u64 + 1024 * 1024).unwrap(), full);
    }

    #[test]
    fn out_of_order_or_unaligned_data_is_refused() {
        let mut h = ContentHasher::new();
        h.update(1024, &[1u8; 512]).unwrap();
        assert!(matches!(
            h.update(512, &[1u8; 512]),
            Err(ContentError::OutOfOrder { .. })
        ));
        assert!(matches!(
            h.update(2000, &[1u8; 512]),
            Err(ContentError::Unaligned { .. })
        ));
    }
}
