//! The rules of a stemcell's tarballs that every pass applies: which entries count (`./`
//! prefixes, traversal, regular files only), one manifest and one image, entries read to the size
//! their header gives, the gzip trailer checked, and a gzip failure told apart from tar's own
//! errors. Also the manifest-only read, which needs nothing else.

use std::cell::RefCell;
use std::io::{self, BufRead, BufReader, Read};
use std::rc::Rc;

use flate2::bufread::MultiGzDecoder;

use super::{ArchiveError, BLOCK, MAX_MANIFEST, OUTER};
use crate::stemcell::manifest::{Checksum, Manifest};

/// The first error of the gzip decoder under a tar reader (see [`Tap`]).
pub(super) type Failed = Rc<RefCell<Option<String>>>;

/// A tar reader over the gzip stream `r`, with the record of the decoder's first error.
pub(super) fn gz_archive<R: BufRead>(r: R) -> (tar::Archive<Tap<MultiGzDecoder<R>>>, Failed) {
    let tap = Tap::new(MultiGzDecoder::new(r));
    let failed = tap.failed.clone();
    (tar::Archive::new(tap), failed)
}

/// Read only `stemcell.MF`, stopping as soon as it has been read (early when it precedes `image`).
/// Light stemcells are returned too (check [`Manifest::is_light`] / [`Manifest::require_heavy`]);
/// nothing else is verified.
pub fn read_manifest_only<R: Read>(r: R) -> Result<Manifest, ArchiveError> {
    let (mut archive, failed) = gz_archive(BufReader::with_capacity(BLOCK, r));
    let entries = archive.entries().map_err(|e| io_err(e, &failed, OUTER))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| io_err(e, &failed, OUTER))?;
        if key_entry(&entry, &["stemcell.MF"], OUTER)?.is_some() {
            return read_manifest_entry(&mut entry, &failed);
        }
    }
    Err(missing_manifest())
}

pub(super) fn missing_manifest() -> ArchiveError {
    ArchiveError::Missing {
        what: OUTER,
        entry: "stemcell.MF",
        remedy: "this is not a BOSH stemcell, or it is incomplete; download it again",
    }
}

pub(super) fn missing_image() -> ArchiveError {
    ArchiveError::Missing {
        what: OUTER,
        entry: "image",
        remedy: "a heavy stemcell carries its disk image there; download the stemcell again",
    }
}

pub(super) fn verify_checksum(
    expected: &Checksum,
    sha1: &str,
    sha256: &str,
) -> Result<(), ArchiveError> {
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

/// Walk the outer tarball to its end: the manifest is read (one, heavy) and the one `image`
/// entry (with its size) is handed to `on_image`; entries are checked for traversal and kind,
/// and the gzip trailer is verified. Whether both were found is the caller's to judge.
pub(super) fn walk_outer<R: Read, T>(
    r: R,
    mut on_image: impl FnMut(&mut dyn Read, u64) -> Result<T, ArchiveError>,
) -> Result<(Option<Manifest>, Option<T>), ArchiveError> {
    let (mut archive, failed) = gz_archive(BufReader::with_capacity(BLOCK, r));
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

/// An entry read to its end must have held the size its tar header gave.
pub(super) fn read_all(
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

pub(super) fn read_manifest_entry<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    failed: &Failed,
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

/// Classify an entry: `Some(key)` when its path is one of `keys` (after `./` prefixes),
/// refusing traversal anywhere and non-regular key entries.
pub(super) fn key_entry<R: Read>(
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

pub(super) fn dup(what: &'static str, entry: &str) -> ArchiveError {
    ArchiveError::Duplicate {
        what,
        entry: entry.to_string(),
    }
}

/// Read to the end of a decompressed stream so the gzip trailer (CRC, size) is checked.
pub(super) fn drain<R: Read>(
    mut r: R,
    failed: &Failed,
    what: &'static str,
) -> Result<(), ArchiveError> {
    io::copy(&mut r, &mut io::sink())
        .map(|_| ())
        .map_err(|e| io_err(e, failed, what))
}

/// An I/O error surfaced through tar: a gzip failure if the decompressor reported one.
pub(super) fn io_err(e: io::Error, failed: &Failed, what: &'static str) -> ArchiveError {
    if let Some(detail) = failed.borrow().clone() {
        return ArchiveError::Gzip { what, detail };
    }
    ArchiveError::Tar {
        what,
        detail: e.to_string(),
    }
}

fn retag(e: ArchiveError, failed: &Failed, what: &'static str) -> ArchiveError {
    match e {
        ArchiveError::Io { source, .. } => io_err(source, failed, what),
        other => other,
    }
}

pub(super) fn read_full<R: Read + ?Sized>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
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
pub(super) struct Tap<R> {
    inner: R,
    failed: Failed,
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
