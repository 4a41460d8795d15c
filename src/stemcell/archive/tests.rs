//! The archive reader against generated stemcells and the committed fixture corpus.

use std::io;

use sha1::{Digest, Sha1};
use sha2::Sha256;

use super::*;
use crate::stemcell::testgen::{self, Expect, Order, StemcellSpec, VhdSpec};
use crate::stemcell::vhd;

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

/// Issue 32: a sink that stops (the uploader failed, or publish no longer wants the VHD) stops
/// the whole read: the outer tarball is not inflated and hashed to its end first.
#[test]
fn a_failing_sink_stops_the_outer_pass_too() {
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
    struct Counting<'a> {
        inner: &'a [u8],
        read: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }
    impl io::Read for Counting<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
            Ok(n)
        }
    }
    let mut s = spec(Order::ManifestFirst, 64);
    s.vhd.data_fraction = 1.0;
    let (bytes, _) = s.stemcell_bytes().unwrap();
    let read = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counting = Counting {
        inner: bytes.as_slice(),
        read: read.clone(),
    };
    let err = read_stemcell(counting, &mut Failing).unwrap_err();
    assert!(err.to_string().contains("upload refused"), "{err}");
    let read = read.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        read < bytes.len() / 2,
        "read {read} of {} bytes after the sink stopped",
        bytes.len()
    );
}
