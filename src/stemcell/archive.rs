//! One streaming pass over a stemcell tarball (or over its inner `image` file alone).
//!
//! Layout: `STEMCELL.tgz` = gzip(tar(`stemcell.MF`, `image`, ...)), `image` = gzip(tar(`root.vhd`)).
//! The outer tarball is inflated, walked and hashed (SHA-1 and SHA-256 of `image`) on a helper
//! thread; the inner image is inflated and walked on the calling thread, which hands `root.vhd` to
//! the caller's [`VhdSink`] in chunks of at most 4 MiB, counts zero sectors and checks the
//! fixed-VHD footer. Memory is bounded (a few MiB of buffers) whatever the VHD size; nothing is
//! written to disk.

use std::cell::RefCell;
use std::io::{self, BufRead, BufReader, Read};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};

use flate2::bufread::MultiGzDecoder;
use sha1::{Digest, Sha1};
use sha2::Sha256;

use super::manifest::{Checksum, Manifest, ManifestError};
use super::vhd::{self, Footer, VhdError, FOOTER_LEN};

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

impl crate::error::HasExit for ArchiveError {
    fn exit(&self) -> crate::error::Exit {
        crate::error::Exit::Error
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

#[derive(Debug)]
struct VhdStats {
    vhd: VhdInfo,
    vhd_bytes: u64,
    data_bytes: u64,
}

enum Msg {
    Start,
    Data(Vec<u8>, usize),
    End,
}

/// Read a stemcell tarball in one pass, streaming `root.vhd` into `sink`.
///
/// Entries may come in any order and with `./` prefixes. The manifest's checksum is verified
/// after the image has been read; `sink.finish()` is called only when everything checked out.
pub fn read_stemcell<R: Read + Send>(
    r: R,
    sink: &mut dyn VhdSink,
) -> Result<Summary, ArchiveError> {
    let (tx, rx) = sync_channel::<Msg>(IN_FLIGHT);
    let (pool_tx, pool_rx) = channel::<Vec<u8>>();
    let (outer, inner) = std::thread::scope(|s| {
        let handle = s.spawn(move || outer_pass(r, tx, pool_rx));
        let inner = match rx.recv() {
            Ok(Msg::Start) => Some(read_inner(ChannelReader::new(&rx, pool_tx), sink)),
            _ => None,
        };
        // Keep the outer pass going to its end whatever happened here (it may yet find the
        // manifest that explains a failure, e.g. a light stemcell).
        while rx.recv().is_ok() {}
        (handle.join(), inner)
    });
    let outer = outer.map_err(|_| ArchiveError::Internal)??;
    let manifest = outer.manifest.ok_or_else(missing_manifest)?;
    manifest.require_heavy()?;
    let (sha1, sha256, image_size) = outer.image.ok_or_else(missing_image)?;
    let stats = match inner {
        Some(result) => result?,
        None => return Err(ArchiveError::Internal),
    };
    verify_checksum(&manifest.sha1, &sha1, &sha256)?;
    sink.finish().map_err(ArchiveError::Sink)?;
    Ok(Summary {
        manifest,
        sha1,
        image_sha256: sha256,
        image_size,
        vhd_bytes: stats.vhd_bytes,
        data_bytes: stats.data_bytes,
        zero_bytes: stats.vhd_bytes - stats.data_bytes,
        vhd: stats.vhd,
    })
}

/// Read an `image` file alone (gzip(tar(root.vhd))), hashing it and streaming root.vhd to `sink`.
pub fn read_image<R: Read + Send>(
    r: R,
    sink: &mut dyn VhdSink,
) -> Result<ImageSummary, ArchiveError> {
    let (tx, rx) = sync_channel::<Msg>(IN_FLIGHT);
    let (pool_tx, pool_rx) = channel::<Vec<u8>>();
    // Set when the image turned out not to be gzip(tar(root.vhd)): the hashing side stops reading
    // instead of hashing the rest of a file that may never end (`/dev/zero`, a FIFO).
    let abandon = AtomicBool::new(false);
    let (hashed, inner) = std::thread::scope(|s| {
        let abandon = &abandon;
        let handle = s.spawn(move || {
            let _ = tx.send(Msg::Start);
            let result = stream_blocks(r, &tx, &pool_rx, None, IMAGE, "image", Some(abandon));
            let _ = tx.send(Msg::End);
            result
        });
        let inner = match rx.recv() {
            Ok(Msg::Start) => read_inner(ChannelReader::new(&rx, pool_tx), sink),
            _ => Err(ArchiveError::Internal),
        };
        if inner.is_err() {
            abandon.store(true, Ordering::SeqCst);
        }
        while rx.recv().is_ok() {}
        (handle.join(), inner)
    });
    let hashed = hashed.map_err(|_| ArchiveError::Internal)?;
    let ((sha1, sha256, image_size), stats) = match (hashed, inner) {
        (Ok(h), Ok(stats)) => (h, stats),
        // The hashing was abandoned because the image was bad: that is the error.
        (Err(_), Err(e)) if abandon.load(Ordering::SeqCst) => return Err(e),
        // Reading the file itself failed: that comes first.
        (Err(e), _) => return Err(e),
        (Ok(_), Err(e)) => return Err(e),
    };
    sink.finish().map_err(ArchiveError::Sink)?;
    Ok(ImageSummary {
        image_sha1: sha1,
        image_sha256: sha256,
        image_size,
        vhd_bytes: stats.vhd_bytes,
        data_bytes: stats.data_bytes,
        zero_bytes: stats.vhd_bytes - stats.data_bytes,
        vhd: stats.vhd,
    })
}

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
        if (size - FOOTER_LEN as u64) % vhd::MIB != 0 {
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

/// Read only `stemcell.MF`, stopping as soon as it has been read (early when it precedes `image`).
/// Light stemcells are returned too (check [`Manifest::is_light`] / [`Manifest::require_heavy`]);
/// nothing else is verified.
pub fn read_manifest_only<R: Read>(r: R) -> Result<Manifest, ArchiveError> {
    let tap = Tap::new(MultiGzDecoder::new(BufReader::with_capacity(BLOCK, r)));
    let failed = tap.failed.clone();
    let mut archive = tar::Archive::new(tap);
    let entries = archive.entries().map_err(|e| io_err(e, &failed, OUTER))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| io_err(e, &failed, OUTER))?;
        if key_entry(&entry, &["stemcell.MF"], OUTER)?.is_some() {
            return read_manifest_entry(&mut entry, &failed);
        }
    }
    Err(missing_manifest())
}

fn missing_manifest() -> ArchiveError {
    ArchiveError::Missing {
        what: OUTER,
        entry: "stemcell.MF",
        remedy: "this is not a BOSH stemcell, or it is incomplete; download it again",
    }
}

fn missing_image() -> ArchiveError {
    ArchiveError::Missing {
        what: OUTER,
        entry: "image",
        remedy: "a heavy stemcell carries its disk image there; download the stemcell again",
    }
}

fn verify_checksum(expected: &Checksum, sha1: &str, sha256: &str) -> Result<(), ArchiveError> {
    let actual = match expected {
        Checksum::Sha1(_) => sha1,
        Checksum::Sha256(_) => sha256,
    };
    if actual.eq_ignore_ascii_case(expected.hex()) {
        Ok(())
    } else {
        Err(ArchiveError::ChecksumMismatch {
            algorithm: expected.algorithm(),
            expected: expected.hex().to_string(),
            actual: actual.to_string(),
        })
    }
}

struct OuterResult {
    manifest: Option<Manifest>,
    image: Option<(String, String, u64)>,
}

fn outer_pass<R: Read>(
    r: R,
    tx: SyncSender<Msg>,
    pool: Receiver<Vec<u8>>,
) -> Result<OuterResult, ArchiveError> {
    let mut tx = Some(tx);
    let (manifest, image) = walk_outer(r, |image, size| {
        // Called once: a second image is refused by the walk.
        let sender = tx.take().ok_or(ArchiveError::Internal)?;
        let _ = sender.send(Msg::Start);
        let hashed = stream_blocks(image, &sender, &pool, Some(size), OUTER, "image", None)?;
        let _ = sender.send(Msg::End);
        Ok(hashed)
    })?;
    Ok(OuterResult { manifest, image })
}

/// Walk the outer tarball to its end: the manifest is read (one, heavy) and the one `image`
/// entry (with its size) is handed to `on_image`; entries are checked for traversal and kind,
/// and the gzip trailer is verified. Whether both were found is the caller's to judge.
fn walk_outer<R: Read, T>(
    r: R,
    mut on_image: impl FnMut(&mut dyn Read, u64) -> Result<T, ArchiveError>,
) -> Result<(Option<Manifest>, Option<T>), ArchiveError> {
    let tap = Tap::new(MultiGzDecoder::new(BufReader::with_capacity(BLOCK, r)));
    let failed = tap.failed.clone();
    let mut archive = tar::Archive::new(tap);
    let mut manifest: Option<Manifest> = None;
    let mut image: Option<T> = None;
    {
        let entries = archive.entries().map_err(|e| io_err(e, &failed, OUTER))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| io_err(e, &failed, OUTER))?;
            match key_entry(&entry, &["stemcell.MF", "image"], OUTER)? {
                Some("stemcell.MF") => {
                    if manifest.is_some() {
                        return Err(dup(OUTER, "stemcell.MF"));
                    }
                    let m = read_manifest_entry(&mut entry, &failed)?;
                    // A light stemcell has nothing to stream: say so now.
                    m.require_heavy()?;
                    manifest = Some(m);
                }
                Some(_) => {
                    if image.is_some() {
                        return Err(dup(OUTER, "image"));
                    }
                    let size = entry.size();
                    image = Some(on_image(&mut entry, size).map_err(|e| retag(e, &failed, OUTER))?);
                }
                None => {}
            }
        }
    }
    drain(archive.into_inner(), &failed, OUTER)?;
    Ok((manifest, image))
}

/// Read `r` in blocks, hash them, and pass them on. Returns (sha1, sha256, size).
fn stream_blocks<R: Read>(
    mut r: R,
    tx: &SyncSender<Msg>,
    pool: &Receiver<Vec<u8>>,
    expected: Option<u64>,
    what: &'static str,
    entry: &str,
    abandon: Option<&AtomicBool>,
) -> Result<(String, String, u64), ArchiveError> {
    let mut sha1 = Sha1::new();
    let mut sha256 = Sha256::new();
    let mut total = 0u64;
    let mut receiver_gone = false;
    loop {
        if abandon.is_some_and(|a| a.load(Ordering::SeqCst)) {
            // The reader of the image already failed; its error is the one reported.
            return Err(ArchiveError::Internal);
        }
        let mut buf = pool.try_recv().unwrap_or_default();
        buf.resize(BLOCK, 0);
        let n = read_full(&mut r, &mut buf).map_err(|source| ArchiveError::Io { what, source })?;
        if n == 0 {
            break;
        }
        sha1.update(&buf[..n]);
        sha256.update(&buf[..n]);
        total += n as u64;
        if !receiver_gone && tx.send(Msg::Data(buf, n)).is_err() {
            receiver_gone = true;
        }
    }
    read_all(expected, total, what, entry)?;
    Ok((
        hex::encode(sha1.finalize()),
        hex::encode(sha256.finalize()),
        total,
    ))
}

/// An entry read to its end must have held the size its tar header gave.
fn read_all(
    expected: Option<u64>,
    total: u64,
    what: &'static str,
    entry: &str,
) -> Result<(), ArchiveError> {
    match expected {
        Some(size) if total != size => Err(ArchiveError::Truncated {
            what,
            entry: entry.to_string(),
            read: total,
            size,
        }),
        _ => Ok(()),
    }
}

fn read_manifest_entry<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    failed: &Rc<RefCell<Option<String>>>,
) -> Result<Manifest, ArchiveError> {
    let size = entry.size();
    if size > MAX_MANIFEST {
        return Err(ArchiveError::ManifestTooLarge { size });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    entry
        .take(MAX_MANIFEST + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_err(e, failed, OUTER))?;
    if bytes.len() as u64 != size {
        return Err(ArchiveError::Truncated {
            what: OUTER,
            entry: "stemcell.MF".into(),
            read: bytes.len() as u64,
            size,
        });
    }
    Ok(Manifest::parse(&bytes)?)
}

/// Inflate and walk the image, streaming root.vhd into the sink.
fn read_inner<B: BufRead>(src: B, sink: &mut dyn VhdSink) -> Result<VhdStats, ArchiveError> {
    let tap = Tap::new(MultiGzDecoder::new(src));
    let failed = tap.failed.clone();
    let mut archive = tar::Archive::new(tap);
    let mut found: Option<VhdStats> = None;
    {
        let entries = archive.entries().map_err(|e| io_err(e, &failed, IMAGE))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| io_err(e, &failed, IMAGE))?;
            if key_entry(&entry, &["root.vhd"], IMAGE)?.is_none() {
                continue;
            }
            if found.is_some() {
                return Err(dup(IMAGE, "root.vhd"));
            }
            found = Some(stream_vhd(&mut entry, sink, &failed)?);
        }
    }
    drain(archive.into_inner(), &failed, IMAGE)?;
    found.ok_or(ArchiveError::Missing {
        what: IMAGE,
        entry: "root.vhd",
        remedy: "an Azure heavy stemcell's image holds root.vhd; download the stemcell again",
    })
}

fn stream_vhd<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    sink: &mut dyn VhdSink,
    failed: &Rc<RefCell<Option<String>>>,
) -> Result<VhdStats, ArchiveError> {
    let size = entry.size();
    vhd::check_file_size(size)?;
    sink.start(size).map_err(ArchiveError::Sink)?;
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    let mut data_bytes = 0u64;
    let mut footer = [0u8; FOOTER_LEN];
    while offset < size {
        let want = (size - offset).min(CHUNK as u64) as usize;
        let n = read_full(&mut *entry, &mut buf[..want]).map_err(|e| io_err(e, failed, IMAGE))?;
        if n < want {
            return Err(ArchiveError::Truncated {
                what: IMAGE,
                entry: "root.vhd".into(),
                read: offset + n as u64,
                size,
            });
        }
        let chunk = &buf[..n];
        if offset == 0 {
            vhd::check_first_sector(chunk)?;
        }
        data_bytes += vhd::data_bytes(chunk);
        if offset + n as u64 == size {
            // Chunks start on 512-byte boundaries, so the footer is inside the last chunk.
            footer.copy_from_slice(&chunk[n - FOOTER_LEN..]);
        }
        sink.chunk(offset, chunk).map_err(ArchiveError::Sink)?;
        offset += n as u64;
    }
    let parsed = Footer::parse(&footer)?;
    parsed.verify_file_size(size)?;
    Ok(VhdStats {
        vhd: VhdInfo {
            file_size: size,
            virtual_size: parsed.virtual_size(),
            footer: parsed,
        },
        vhd_bytes: size,
        data_bytes,
    })
}

/// Classify an entry: `Some(key)` when its path is one of `keys` (after `./` prefixes),
/// refusing traversal anywhere and non-regular key entries.
fn key_entry<R: Read>(
    entry: &tar::Entry<'_, R>,
    keys: &[&'static str],
    what: &'static str,
) -> Result<Option<&'static str>, ArchiveError> {
    let raw = entry.path_bytes();
    let path = String::from_utf8_lossy(&raw).into_owned();
    let comps: Vec<&str> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if path.starts_with('/') || comps.contains(&"..") {
        return Err(ArchiveError::PathTraversal { what, entry: path });
    }
    let [single] = comps.as_slice() else {
        return Ok(None);
    };
    let Some(key) = keys.iter().copied().find(|k| k == single) else {
        return Ok(None);
    };
    let kind = entry.header().entry_type();
    if !(kind.is_file() || kind == tar::EntryType::Continuous) {
        let kind = match kind {
            tar::EntryType::Symlink => "symbolic link".to_string(),
            tar::EntryType::Link => "hard link".to_string(),
            tar::EntryType::Directory => "directory".to_string(),
            other => format!("{other:?} entry"),
        };
        return Err(ArchiveError::NotRegular {
            what,
            entry: path,
            kind,
        });
    }
    Ok(Some(key))
}

fn dup(what: &'static str, entry: &str) -> ArchiveError {
    ArchiveError::Duplicate {
        what,
        entry: entry.to_string(),
    }
}

/// Read to the end of a decompressed stream so the gzip trailer (CRC, size) is checked.
fn drain<R: Read>(
    mut r: R,
    failed: &Rc<RefCell<Option<String>>>,
    what: &'static str,
) -> Result<(), ArchiveError> {
    io::copy(&mut r, &mut io::sink())
        .map(|_| ())
        .map_err(|e| io_err(e, failed, what))
}

/// An I/O error surfaced through tar: a gzip failure if the decompressor reported one.
fn io_err(e: io::Error, failed: &Rc<RefCell<Option<String>>>, what: &'static str) -> ArchiveError {
    if let Some(detail) = failed.borrow().clone() {
        return ArchiveError::Gzip { what, detail };
    }
    ArchiveError::Tar {
        what,
        detail: e.to_string(),
    }
}

fn retag(
    e: ArchiveError,
    failed: &Rc<RefCell<Option<String>>>,
    what: &'static str,
) -> ArchiveError {
    match e {
        ArchiveError::Io { source, .. } => io_err(source, failed, what),
        other => other,
    }
}

fn read_full<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Records the first error of the reader it wraps (the gzip decoder), so errors that tar passes
/// on can be told apart from tar's own.
struct Tap<R> {
    inner: R,
    failed: Rc<RefCell<Option<String>>>,
}

impl<R> Tap<R> {
    fn new(inner: R) -> Self {
        Tap {
            inner,
            failed: Rc::new(RefCell::new(None)),
        }
    }
}

impl<R: Read> Read for Tap<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).inspect_err(|e| {
            self.failed
                .borrow_mut()
                .get_or_insert_with(|| e.to_string());
        })
    }
}

/// The image bytes coming from the outer reader thread, as a `BufRead` (no extra copy).
struct ChannelReader<'a> {
    rx: &'a Receiver<Msg>,
    pool: Sender<Vec<u8>>,
    buf: Vec<u8>,
    len: usize,
    pos: usize,
    done: bool,
}

impl<'a> ChannelReader<'a> {
    fn new(rx: &'a Receiver<Msg>, pool: Sender<Vec<u8>>) -> Self {
        ChannelReader {
            rx,
            pool,
            buf: Vec::new(),
            len: 0,
            pos: 0,
            done: false,
        }
    }
}

impl Read for ChannelReader<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let avail = self.fill_buf()?;
        let n = avail.len().min(out.len());
        out[..n].copy_from_slice(&avail[..n]);
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for ChannelReader<'_> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.pos >= self.len && !self.done {
            match self.rx.recv() {
                Ok(Msg::Data(buf, len)) => {
                    let old = std::mem::replace(&mut self.buf, buf);
                    if old.capacity() > 0 {
                        let _ = self.pool.send(old);
                    }
                    self.len = len;
                    self.pos = 0;
                }
                Ok(Msg::End) => self.done = true,
                Ok(Msg::Start) => {}
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the image entry ended early",
                    ))
                }
            }
        }
        Ok(&self.buf[self.pos..self.len])
    }

    fn consume(&mut self, amt: usize) {
        self.pos = (self.pos + amt).min(self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stemcell::testgen::{self, Expect, Order, StemcellSpec, VhdSpec};

    /// Records what a consumer of root.vhd would see.
    #[derive(Default)]
    struct Recorder {
        size: Option<u64>,
        next: u64,
        max_chunk: usize,
        sha256: Sha256,
        finished: bool,
    }

    impl VhdSink for Recorder {
        fn start(&mut self, vhd_size: u64) -> anyhow::Result<()> {
            self.size = Some(vhd_size);
            Ok(())
        }
        fn chunk(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<()> {
            assert_eq!(offset, self.next, "chunks arrive in order, without gaps");
            assert_eq!(offset % 512, 0);
            self.next += data.len() as u64;
            self.max_chunk = self.max_chunk.max(data.len());
            self.sha256.update(data);
            Ok(())
        }
        fn finish(&mut self) -> anyhow::Result<()> {
            self.finished = true;
            Ok(())
        }
    }

    fn vhd_sha256(spec: &VhdSpec) -> String {
        let mut h = Sha256::new();
        io::copy(&mut spec.reader(), &mut HashSink(&mut h)).unwrap();
        hex::encode(h.finalize())
    }

    struct HashSink<'a>(&'a mut Sha256);
    impl io::Write for HashSink<'_> {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.update(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn spec(order: Order, mib: u64) -> StemcellSpec {
        StemcellSpec {
            order,
            vhd: VhdSpec {
                mib,
                data_fraction: 0.3,
                block: 64 * 1024,
                seed: 42,
                ..VhdSpec::default()
            },
            ..StemcellSpec::default()
        }
    }

    #[test]
    fn sink_gets_the_whole_vhd_in_order_in_either_entry_order() {
        for order in [Order::ManifestFirst, Order::ImageFirst] {
            let s = spec(order, 9);
            let (bytes, gen) = s.stemcell_bytes().unwrap();
            let mut rec = Recorder::default();
            let summary = read_stemcell(bytes.as_slice(), &mut rec).unwrap();
            assert_eq!(rec.size, Some(9 * vhd::MIB + 512));
            assert_eq!(rec.next, 9 * vhd::MIB + 512);
            assert!(rec.max_chunk <= CHUNK);
            assert!(rec.finished);
            assert_eq!(
                hex::encode(rec.sha256.clone().finalize()),
                vhd_sha256(&s.vhd)
            );
            assert_eq!(summary.sha1, gen.image_sha1);
            assert_eq!(summary.image_sha256, gen.image_sha256);
            assert_eq!(summary.image_size, gen.image_size);
            assert_eq!(summary.vhd.virtual_size, 9 * vhd::MIB);
            assert_eq!(summary.data_bytes, gen.data_bytes);
            assert_eq!(summary.zero_bytes, gen.zero_bytes);
            assert_eq!(summary.data_bytes + summary.zero_bytes, summary.vhd_bytes);
            assert_eq!(summary.manifest.version, "1.506");
        }
    }

    #[test]
    fn image_alone_gives_the_same_digest_and_vhd() {
        let s = spec(Order::ManifestFirst, 3);
        let image = s.image_bytes().unwrap();
        let mut rec = Recorder::default();
        let summary = read_image(image.as_slice(), &mut rec).unwrap();
        assert_eq!(summary.image_sha256, hex::encode(Sha256::digest(&image)));
        assert_eq!(summary.image_sha1, hex::encode(Sha1::digest(&image)));
        assert_eq!(summary.image_size, image.len() as u64);
        assert_eq!(summary.data_bytes, s.vhd.expected_data_bytes());
        assert_eq!(
            hex::encode(rec.sha256.clone().finalize()),
            vhd_sha256(&s.vhd)
        );
        assert!(rec.finished);
        let err = read_image(&b"nope"[..], &mut NullSink).unwrap_err();
        assert!(matches!(err, ArchiveError::Gzip { .. }), "{err}");
    }

    #[test]
    fn manifest_only_stops_early_and_handles_either_order() {
        for order in [Order::ManifestFirst, Order::ImageFirst] {
            let (bytes, _) = spec(order, 1).stemcell_bytes().unwrap();
            let m = read_manifest_only(bytes.as_slice()).unwrap();
            assert_eq!(m.name, "bosh-azure-hyperv-ubuntu-jammy-go_agent");
        }
        // Manifest first: the rest of the file is never needed, so a truncated tail is fine.
        let (mut bytes, _) = spec(Order::ManifestFirst, 4).stemcell_bytes().unwrap();
        bytes.truncate(bytes.len() / 2);
        assert!(read_manifest_only(bytes.as_slice()).is_ok());
    }

    #[test]
    fn every_broken_fixture_fails_with_its_own_error_and_no_finish() {
        let mut seen = std::collections::HashSet::new();
        for f in testgen::fixtures().unwrap() {
            let mut rec = Recorder::default();
            let result = read_stemcell(f.bytes.as_slice(), &mut rec);
            match f.expect {
                Expect::Valid { generated, .. } => {
                    let s = result.unwrap_or_else(|e| panic!("{}: {e}", f.file));
                    assert_eq!(s.image_sha256, generated.image_sha256, "{}", f.file);
                    assert!(rec.finished);
                }
                Expect::Broken(needle) => {
                    let msg = match result {
                        Err(e) => e.to_string(),
                        // Integrity is fine; the version key is what is wrong.
                        Ok(s) => s.manifest.version_key().unwrap_err().to_string(),
                    };
                    assert!(msg.contains(needle), "{}: {msg:?} lacks {needle:?}", f.file);
                    assert!(
                        seen.insert(needle),
                        "{}: needle {needle} not distinct",
                        f.file
                    );
                    if f.file != "four-part-version.tgz" {
                        assert!(
                            !rec.finished,
                            "{}: sink finished on a broken stemcell",
                            f.file
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_digest_pass_agrees_with_the_full_pass_without_inflating_the_image() {
        for order in [Order::ManifestFirst, Order::ImageFirst] {
            let s = spec(order, 5);
            let (bytes, gen) = s.stemcell_bytes().unwrap();
            let d = digest_stemcell(bytes.as_slice()).unwrap();
            let full = read_stemcell(bytes.as_slice(), &mut NullSink).unwrap();
            assert_eq!(d.sha1, full.sha1);
            assert_eq!(d.image_sha256, gen.image_sha256);
            assert_eq!(d.image_size, full.image_size);
            assert_eq!(d.manifest.as_ref().unwrap().version, "1.506");
            assert_eq!(
                d.vhd,
                Some(VhdHead {
                    file_size: full.vhd.file_size
                })
            );
            let image = s.image_bytes().unwrap();
            let di = digest_image(image.as_slice()).unwrap();
            assert_eq!(di.image_sha256, gen.image_sha256);
            assert_eq!(di.vhd, d.vhd);
        }
    }

    /// What the digest pass refuses, what it leaves to the full pass (`vhd: None` makes the
    /// caller verify everything before writing), and what only the full pass can see.
    #[test]
    fn the_digest_pass_refuses_what_the_outer_tarball_shows_and_defers_the_rest() {
        for f in testgen::fixtures().unwrap() {
            let Expect::Broken(needle) = f.expect else {
                let d = digest_stemcell(f.bytes.as_slice()).unwrap();
                assert!(
                    d.vhd.is_some(),
                    "{}: a valid stemcell's VHD is settled",
                    f.file
                );
                continue;
            };
            let full = read_stemcell(f.bytes.as_slice(), &mut NullSink);
            match digest_stemcell(f.bytes.as_slice()) {
                // Refused by the digest pass: the same error the full pass gives.
                Err(e) => assert!(
                    e.to_string().contains(needle),
                    "{}: {e} lacks {needle:?}",
                    f.file
                ),
                // Passed: only what needs the inflated VHD (or the version key) is wrong.
                Ok(d) => {
                    let image_level = [
                        "dynamic-vhd.tgz",
                        "vhd-not-whole-mib.tgz",
                        "image-without-root-vhd.tgz",
                        "image-not-gzip.tgz",
                        "hardlink-root-vhd.tgz",
                    ];
                    // These are the `writes_then_cleans` cases of the bad-input corpus.
                    let footer_level = [
                        "vhd-bad-checksum.tgz",
                        "vhd-size-mismatch.tgz",
                        "vhd-no-footer.tgz",
                    ];
                    if image_level.contains(&f.file) {
                        assert_eq!(d.vhd, None, "{}: left to the full pass", f.file);
                    } else if footer_level.contains(&f.file) {
                        assert!(d.vhd.is_some(), "{}: seen only at the footer", f.file);
                    } else {
                        assert_eq!(f.file, "four-part-version.tgz");
                    }
                    if f.file != "four-part-version.tgz" {
                        assert!(full.is_err(), "{}: the full pass refuses it", f.file);
                    }
                }
            }
        }
    }

    #[test]
    fn gzip_truncated_at_any_point_is_an_error_never_a_panic() {
        let (bytes, _) = spec(Order::ImageFirst, 2).stemcell_bytes().unwrap();
        for cut in (1..bytes.len()).step_by(bytes.len() / 37 + 1) {
            let err = read_stemcell(&bytes[..cut], &mut NullSink).unwrap_err();
            assert!(
                matches!(
                    err,
                    ArchiveError::Gzip { .. }
                        | ArchiveError::Truncated { .. }
                        | ArchiveError::Tar { .. }
                        | ArchiveError::Missing { .. }
                ),
                "cut {cut}: {err}"
            );
        }
    }

    #[test]
    fn corrupt_bytes_anywhere_are_an_error_never_a_panic() {
        let (bytes, _) = spec(Order::ManifestFirst, 1).stemcell_bytes().unwrap();
        for at in (0..bytes.len()).step_by(bytes.len() / 29 + 1) {
            let mut b = bytes.clone();
            b[at] ^= 0xff;
            // Either rejected or (if the flip hit something ignorable) accepted; never a panic.
            let _ = read_stemcell(b.as_slice(), &mut NullSink);
        }
    }

    #[test]
    fn a_failing_sink_stops_the_read_with_its_error() {
        struct Failing;
        impl VhdSink for Failing {
            fn start(&mut self, _: u64) -> anyhow::Result<()> {
                Ok(())
            }
            fn chunk(&mut self, _: u64, _: &[u8]) -> anyhow::Result<()> {
                anyhow::bail!("upload refused")
            }
            fn finish(&mut self) -> anyhow::Result<()> {
                Ok(())
            }
        }
        let (bytes, _) = spec(Order::ManifestFirst, 2).stemcell_bytes().unwrap();
        let err = read_stemcell(bytes.as_slice(), &mut Failing).unwrap_err();
        assert!(err.to_string().contains("upload refused"), "{err}");
    }
}
