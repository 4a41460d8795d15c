//! Stemcells for the tests: generated specs (small, sparse, seeded), the VHD they hold, and
//! readers that check a page blob holds exactly that VHD.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use stemcell_gallery::azure::blob::{Blob, Container};

use super::blobsdk::BlobExt;
use stemcell_gallery::stemcell::testgen::{Generated, StemcellSpec, VhdSpec};

/// A small heavy stemcell with scattered data: `mib` MiB of disk, 25% in 64 KiB blocks.
pub fn small_spec(version_yaml: &str, seed: u64, mib: u64) -> StemcellSpec {
    StemcellSpec {
        version_yaml: version_yaml.into(),
        vhd: VhdSpec {
            mib,
            data_fraction: 0.25,
            block: 64 * 1024,
            seed,
            ..VhdSpec::default()
        },
        level: 1,
        ..StemcellSpec::default()
    }
}

pub fn write_stemcell(dir: &Path, name: &str, spec: &StemcellSpec) -> (PathBuf, Generated) {
    let path = dir.join(name);
    let generated = spec.write_to(&path).expect("the stemcell is generated");
    (path, generated)
}

/// The whole root.vhd of a spec (small VHDs only).
pub fn vhd_bytes(spec: &StemcellSpec) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut spec.vhd.reader(), &mut out).expect("read generated VHD");
    out
}

/// Non-zero 512-byte sectors of `buf` as merged inclusive byte ranges.
pub fn nonzero_ranges(buf: &[u8]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (i, sector) in buf.chunks(512).enumerate() {
        if sector.iter().any(|&b| b != 0) {
            let start = (i * 512) as u64;
            let end = start + 511;
            match out.last_mut() {
                Some(last) if last.1 + 1 == start => last.1 = end,
                _ => out.push((start, end)),
            }
        }
    }
    out
}

/// The blob's page ranges, merged where adjacent (inclusive ends, as the service reports them).
pub async fn page_ranges(blob: &Blob) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = blob.raw_page_ranges().await.expect("get page ranges");
    ranges.sort();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in ranges {
        match merged.last_mut() {
            Some(last) if last.1 + 1 == s => last.1 = e,
            _ => merged.push((s, e)),
        }
    }
    merged
}

pub fn sha256_hex(buf: &[u8]) -> String {
    hex::encode(Sha256::digest(buf))
}

pub async fn download_sha256(blob: &Blob) -> (String, u64) {
    let data = blob.read(None).await.expect("download");
    (hex::encode(Sha256::digest(&data)), data.len() as u64)
}

/// Check the blob `name` holds exactly the VHD: page ranges = non-zero sectors, bytes hash equal.
pub async fn assert_blob_is_vhd(container: &Container, name: &str, vhd: &[u8]) {
    let blob = container.blob_client(name);
    assert_eq!(
        page_ranges(&blob).await,
        nonzero_ranges(vhd),
        "the blob's page ranges are the VHD's non-zero sectors"
    );
    let (digest, len) = download_sha256(&blob).await;
    assert_eq!(len, vhd.len() as u64, "blob size");
    assert_eq!(digest, sha256_hex(vhd), "the blob's bytes are the VHD's");
}

/// A small stemcell of this version (`mib` MiB disk, a quarter data) written to `dir` as
/// `stemcell-<version>-<seed>.tgz`: its path and its image's SHA-256.
pub fn stemcell(dir: &Path, version: &str, seed: u64, mib: u64) -> (PathBuf, String) {
    let spec = small_spec(&format!("'{version}'"), seed, mib);
    let (path, generated) = write_stemcell(dir, &format!("stemcell-{version}-{seed}.tgz"), &spec);
    (path, generated.image_sha256)
}

/// The 512-byte footer of a fixed VHD: cookie `conectix`, disk type 2 (fixed).
pub fn fixed_vhd_footer() -> Vec<u8> {
    let mut f = vec![0u8; 512];
    f[..8].copy_from_slice(b"conectix");
    f[60..64].copy_from_slice(&2u32.to_be_bytes());
    f
}
