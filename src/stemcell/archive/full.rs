//! The full pass: the outer tarball is inflated, walked and hashed on a helper thread while the
//! calling thread inflates the image from the blocks it is handed, streams root.vhd to the
//! [`VhdSink`] and checks the fixed-VHD footer. Also the same over an `image` file alone.

use std::io::{self, BufRead, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender, SyncSender};

use sha1::{Digest, Sha1};
use sha2::Sha256;

use super::tarball::{
    drain, dup, gz_archive, io_err, key_entry, missing_image, missing_manifest, read_all,
    read_full, verify_checksum, walk_outer, Failed,
};
use super::{
    ArchiveError, ImageSummary, Summary, VhdInfo, VhdSink, BLOCK, CHUNK, IMAGE, IN_FLIGHT, OUTER,
};
use crate::stemcell::manifest::Manifest;
use crate::stemcell::vhd::{self, Footer, FOOTER_LEN};

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
    // Set when the sink stopped the read: nothing further in the tarball can explain that.
    let abandon = AtomicBool::new(false);
    let (outer, inner) = std::thread::scope(|s| {
        let abandon = &abandon;
        let handle = s.spawn(move || outer_pass(r, tx, pool_rx, abandon));
        let inner = match rx.recv() {
            Ok(Msg::Start) => Some(read_inner(ChannelReader::new(&rx, pool_tx), sink)),
            _ => None,
        };
        if matches!(inner, Some(Err(ArchiveError::Sink(_)))) {
            abandon.store(true, Ordering::SeqCst);
        }
        // Otherwise keep the outer pass going to its end whatever happened here (it may yet find
        // the manifest that explains a failure, e.g. a light stemcell).
        while rx.recv().is_ok() {}
        (handle.join(), inner)
    });
    if let Some(Err(e @ ArchiveError::Sink(_))) = inner {
        // The consumer of root.vhd stopped (e.g. the uploader failed, or it no longer wants the
        // VHD): its error is the one reported, without reading the rest of the tarball.
        return Err(e);
    }
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

struct OuterResult {
    manifest: Option<Manifest>,
    image: Option<(String, String, u64)>,
}

fn outer_pass<R: Read>(
    r: R,
    tx: SyncSender<Msg>,
    pool: Receiver<Vec<u8>>,
    abandon: &AtomicBool,
) -> Result<OuterResult, ArchiveError> {
    let mut tx = Some(tx);
    let (manifest, image) = walk_outer(r, |image, size| {
        // Called once: a second image is refused by the walk.
        let sender = tx.take().ok_or(ArchiveError::Internal)?;
        let _ = sender.send(Msg::Start);
        let hashed = stream_blocks(
            image,
            &sender,
            &pool,
            Some(size),
            OUTER,
            "image",
            Some(abandon),
        )?;
        let _ = sender.send(Msg::End);
        Ok(hashed)
    })?;
    Ok(OuterResult { manifest, image })
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

/// Inflate and walk the image, streaming root.vhd into the sink.
fn read_inner<B: BufRead>(src: B, sink: &mut dyn VhdSink) -> Result<VhdStats, ArchiveError> {
    let (mut archive, failed) = gz_archive(src);
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
    failed: &Failed,
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
