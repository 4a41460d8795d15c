//! Deterministic gzipped tarballs (mtimes 0, raw names so a test can write `../image`).

use std::io::{self, Read, Write};

use flate2::write::GzEncoder;
use flate2::Compression;

/// One entry of a generated tarball.
pub enum TarEntry {
    File {
        path: String,
        data: Vec<u8>,
    },
    Stream {
        path: String,
        size: u64,
        reader: Box<dyn Read>,
    },
    Symlink {
        path: String,
        target: String,
    },
    HardLink {
        path: String,
        target: String,
    },
    Dir {
        path: String,
    },
}

fn header(path: &str, kind: tar::EntryType, size: u64, mode: u32) -> io::Result<tar::Header> {
    let mut h = tar::Header::new_gnu();
    let bytes = path.as_bytes();
    if bytes.len() > 100 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path over 100 bytes",
        ));
    }
    // Written raw, so tests can create `../image` (tar's set_path refuses it).
    h.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    Ok(h)
}

/// Write a gzipped tar of `entries` (deterministic).
pub fn write_tgz<W: Write>(out: W, entries: Vec<TarEntry>, level: u32) -> io::Result<W> {
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(out, Compression::new(level));
    let mut b = tar::Builder::new(gz);
    for e in entries {
        match e {
            TarEntry::File { path, data } => {
                let mut h = header(&path, tar::EntryType::Regular, data.len() as u64, 0o644)?;
                h.set_cksum();
                b.append(&h, data.as_slice())?;
            }
            TarEntry::Stream { path, size, reader } => {
                let mut h = header(&path, tar::EntryType::Regular, size, 0o644)?;
                h.set_cksum();
                b.append(&h, reader)?;
            }
            TarEntry::Symlink { path, target } => {
                let mut h = header(&path, tar::EntryType::Symlink, 0, 0o777)?;
                h.set_link_name(&target)?;
                h.set_cksum();
                b.append(&h, io::empty())?;
            }
            TarEntry::HardLink { path, target } => {
                let mut h = header(&path, tar::EntryType::Link, 0, 0o644)?;
                h.set_link_name(&target)?;
                h.set_cksum();
                b.append(&h, io::empty())?;
            }
            TarEntry::Dir { path } => {
                let mut h = header(&path, tar::EntryType::Directory, 0, 0o755)?;
                h.set_cksum();
                b.append(&h, io::empty())?;
            }
        }
    }
    let gz: GzEncoder<W> = b.into_inner()?;
    gz.finish()
}
