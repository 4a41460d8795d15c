//! Fixed VHD: footer parsing and checks, and fast zero detection at 512-byte granularity.

use std::ops::Range;

pub const SECTOR: usize = 512;
pub const FOOTER_LEN: usize = 512;
pub const MIB: u64 = 1024 * 1024;
const COOKIE: &[u8; 8] = b"conectix";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VhdError {
    #[error("root.vhd is {size} bytes, too small to hold a VHD footer (512 bytes); the image is damaged, download the stemcell again")]
    TooSmall { size: u64 },
    #[error("root.vhd is {size} bytes, not a multiple of 512; a fixed VHD is whole sectors plus a 512-byte footer, so the file is truncated or not a VHD")]
    NotSectorAligned { size: u64 },
    #[error("root.vhd has no VHD footer (cookie {found:?} instead of \"conectix\" in its last 512 bytes); the file is truncated or not a VHD")]
    BadCookie { found: String },
    #[error("root.vhd footer checksum is {stored:#010x} but the footer sums to {computed:#010x}; the footer is corrupt, download the stemcell again")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("root.vhd is a {kind} VHD (disk type {disk_type}); Azure needs a fixed VHD, convert it with `qemu-img convert -O vpc -o subformat=fixed,force_size` or `Convert-VHD -VHDType Fixed`")]
    NotFixed { disk_type: u32, kind: &'static str },
    #[error("root.vhd footer says the disk is {current} bytes but the file holds {data} bytes before the footer; the file is truncated or padded")]
    SizeMismatch { current: u64, data: u64 },
    #[error("root.vhd virtual size {current} bytes is not a whole number of MiB, which Azure requires; resize the VHD to a MiB boundary")]
    NotWholeMib { current: u64 },
}

/// The stemcell is what it is: the same on every retry.
impl crate::error::Classified for VhdError {
    fn class(&self) -> crate::error::Class {
        crate::error::Class::Permanent
    }
}

/// The decoded 512-byte VHD footer (all integers big-endian on disk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Footer {
    pub features: u32,
    pub format_version: u32,
    pub data_offset: u64,
    pub timestamp: u32,
    pub creator_application: [u8; 4],
    pub creator_version: u32,
    pub creator_host_os: u32,
    pub original_size: u64,
    pub current_size: u64,
    pub geometry: (u16, u8, u8),
    pub disk_type: u32,
    pub checksum: u32,
    pub unique_id: [u8; 16],
    pub saved_state: u8,
}

fn be32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

/// One's complement of the byte sum of the footer, with the checksum field (64..68) taken as zero.
pub fn footer_checksum(raw: &[u8; FOOTER_LEN]) -> u32 {
    let sum = raw
        .iter()
        .enumerate()
        .filter(|(i, _)| !(64..68).contains(i))
        .fold(0u32, |acc, (_, b)| acc.wrapping_add(u32::from(*b)));
    !sum
}

impl Footer {
    /// Decode and check a footer: cookie, checksum, and fixed disk type.
    pub fn parse(raw: &[u8; FOOTER_LEN]) -> Result<Footer, VhdError> {
        if &raw[0..8] != COOKIE {
            return Err(VhdError::BadCookie {
                found: String::from_utf8_lossy(&raw[0..8]).into_owned(),
            });
        }
        let stored = be32(raw, 64);
        let computed = footer_checksum(raw);
        if stored != computed {
            return Err(VhdError::BadChecksum { stored, computed });
        }
        let disk_type = be32(raw, 60);
        if disk_type != 2 {
            let kind = match disk_type {
                3 => "dynamic",
                4 => "differencing",
                _ => "unknown-type",
            };
            return Err(VhdError::NotFixed { disk_type, kind });
        }
        let mut creator_application = [0u8; 4];
        creator_application.copy_from_slice(&raw[28..32]);
        let mut unique_id = [0u8; 16];
        unique_id.copy_from_slice(&raw[68..84]);
        Ok(Footer {
            features: be32(raw, 8),
            format_version: be32(raw, 12),
            data_offset: be64(raw, 16),
            timestamp: be32(raw, 24),
            creator_application,
            creator_version: be32(raw, 32),
            creator_host_os: be32(raw, 36),
            original_size: be64(raw, 40),
            current_size: be64(raw, 48),
            geometry: (u16::from_be_bytes([raw[56], raw[57]]), raw[58], raw[59]),
            disk_type,
            checksum: stored,
            unique_id,
            saved_state: raw[84],
        })
    }

    /// Check the footer against the size of the whole file: current size = file size - 512,
    /// and a whole number of MiB (Azure's requirement).
    pub fn verify_file_size(&self, file_size: u64) -> Result<(), VhdError> {
        let data = file_size.saturating_sub(FOOTER_LEN as u64);
        if self.current_size != data {
            return Err(VhdError::SizeMismatch {
                current: self.current_size,
                data,
            });
        }
        if !self.current_size.is_multiple_of(MIB) {
            return Err(VhdError::NotWholeMib {
                current: self.current_size,
            });
        }
        Ok(())
    }

    /// The virtual disk size in bytes.
    pub fn virtual_size(&self) -> u64 {
        self.current_size
    }
}

/// Check that a file size can be a fixed VHD at all (before streaming it).
pub fn check_file_size(size: u64) -> Result<(), VhdError> {
    if size < FOOTER_LEN as u64 {
        return Err(VhdError::TooSmall { size });
    }
    if !size.is_multiple_of(SECTOR as u64) {
        return Err(VhdError::NotSectorAligned { size });
    }
    Ok(())
}

/// If the first sector of a file is a VHD footer copy (dynamic and differencing disks start with
/// one), refuse early: a fixed VHD starts with disk data instead.
pub fn check_first_sector(first: &[u8]) -> Result<(), VhdError> {
    if first.len() < FOOTER_LEN || &first[0..8] != COOKIE {
        return Ok(());
    }
    let mut raw = [0u8; FOOTER_LEN];
    raw.copy_from_slice(&first[..FOOTER_LEN]);
    let disk_type = be32(&raw, 60);
    if footer_checksum(&raw) == be32(&raw, 64) && (disk_type == 3 || disk_type == 4) {
        return Err(VhdError::NotFixed {
            disk_type,
            kind: if disk_type == 3 {
                "dynamic"
            } else {
                "differencing"
            },
        });
    }
    Ok(())
}

/// Build a valid fixed-VHD footer for a disk of `current_size` bytes (generators and tests).
pub fn build_footer(current_size: u64, unique_id: [u8; 16], disk_type: u32) -> [u8; FOOTER_LEN] {
    let mut f = [0u8; FOOTER_LEN];
    f[0..8].copy_from_slice(COOKIE);
    f[8..12].copy_from_slice(&2u32.to_be_bytes()); // features: reserved bit
    f[12..16].copy_from_slice(&0x0001_0000u32.to_be_bytes());
    let data_offset = if disk_type == 2 { u64::MAX } else { 512 };
    f[16..24].copy_from_slice(&data_offset.to_be_bytes());
    f[28..32].copy_from_slice(b"scg ");
    f[32..36].copy_from_slice(&0x0001_0000u32.to_be_bytes());
    f[36..40].copy_from_slice(b"Wi2k");
    f[40..48].copy_from_slice(&current_size.to_be_bytes());
    f[48..56].copy_from_slice(&current_size.to_be_bytes());
    // CHS geometry per the VHD spec's algorithm.
    let (c, h, s) = chs(current_size / SECTOR as u64);
    f[56..58].copy_from_slice(&c.to_be_bytes());
    f[58] = h;
    f[59] = s;
    f[60..64].copy_from_slice(&disk_type.to_be_bytes());
    f[68..84].copy_from_slice(&unique_id);
    let sum = footer_checksum(&f);
    f[64..68].copy_from_slice(&sum.to_be_bytes());
    f
}

fn chs(total_sectors: u64) -> (u16, u8, u8) {
    let total = total_sectors.min(65535 * 16 * 255);
    let (mut spt, mut heads, mut cyl_x_heads);
    if total >= 65535 * 16 * 63 {
        spt = 255;
        heads = 16;
        cyl_x_heads = total / spt;
    } else {
        spt = 17;
        cyl_x_heads = total / spt;
        heads = cyl_x_heads.div_ceil(1024);
        if heads < 4 {
            heads = 4;
        }
        if cyl_x_heads >= heads * 1024 || heads > 16 {
            spt = 31;
            heads = 16;
            cyl_x_heads = total / spt;
        }
        if cyl_x_heads >= heads * 1024 {
            spt = 63;
            heads = 16;
            cyl_x_heads = total / spt;
        }
    }
    let cyl = cyl_x_heads / heads;
    (cyl.min(65535) as u16, heads as u8, spt as u8)
}

/// True when every byte is zero. Word-at-a-time: ORs 16-byte lanes (vectorised by the compiler),
/// checking each 512-byte sector so long data regions exit early.
#[inline]
pub fn is_zero(buf: &[u8]) -> bool {
    let mut sectors = buf.chunks_exact(SECTOR);
    for sector in &mut sectors {
        if !sector_is_zero(sector) {
            return false;
        }
    }
    sectors.remainder().iter().all(|&b| b == 0)
}

#[inline]
fn sector_is_zero(sector: &[u8]) -> bool {
    let mut acc = 0u128;
    for lane in sector.chunks_exact(16) {
        let mut a = [0u8; 16];
        a.copy_from_slice(lane);
        acc |= u128::from_ne_bytes(a);
    }
    acc == 0
}

/// Maximal runs of 512-byte sectors that are not all zero, as absolute byte ranges
/// (`base_offset` is the offset of `chunk[0]`). A final partial sector counts as a sector.
pub fn nonzero_runs(chunk: &[u8], base_offset: u64) -> impl Iterator<Item = Range<u64>> + '_ {
    NonzeroRuns {
        chunk,
        pos: 0,
        base: base_offset,
    }
}

struct NonzeroRuns<'a> {
    chunk: &'a [u8],
    pos: usize,
    base: u64,
}

impl NonzeroRuns<'_> {
    fn sector_zero(&self, at: usize) -> bool {
        let end = (at + SECTOR).min(self.chunk.len());
        let s = &self.chunk[at..end];
        if s.len() == SECTOR {
            sector_is_zero(s)
        } else {
            s.iter().all(|&b| b == 0)
        }
    }
}

impl Iterator for NonzeroRuns<'_> {
    type Item = Range<u64>;
    fn next(&mut self) -> Option<Range<u64>> {
        let len = self.chunk.len();
        while self.pos < len && self.sector_zero(self.pos) {
            self.pos += SECTOR;
        }
        if self.pos >= len {
            return None;
        }
        let start = self.pos;
        while self.pos < len && !self.sector_zero(self.pos) {
            self.pos += SECTOR;
        }
        let end = self.pos.min(len);
        Some(self.base + start as u64..self.base + end as u64)
    }
}

/// Count the bytes in non-zero sectors of `chunk` (the rest are zero bytes).
pub fn data_bytes(chunk: &[u8]) -> u64 {
    let mut n = 0u64;
    let mut sectors = chunk.chunks_exact(SECTOR);
    for s in &mut sectors {
        if !sector_is_zero(s) {
            n += SECTOR as u64;
        }
    }
    let rem = sectors.remainder();
    if !rem.iter().all(|&b| b == 0) {
        n += rem.len() as u64;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn built_footer_round_trips() {
        let raw = build_footer(3 * MIB, [7; 16], 2);
        let f = Footer::parse(&raw).unwrap();
        assert_eq!(f.current_size, 3 * MIB);
        assert_eq!(f.virtual_size(), 3 * MIB);
        assert_eq!(f.disk_type, 2);
        assert_eq!(f.unique_id, [7; 16]);
        f.verify_file_size(3 * MIB + 512).unwrap();
    }

    #[test]
    fn footer_faults_are_named() {
        let mut raw = build_footer(MIB, [1; 16], 2);
        raw[100] ^= 1;
        assert!(matches!(
            Footer::parse(&raw),
            Err(VhdError::BadChecksum { .. })
        ));
        let mut raw = build_footer(MIB, [1; 16], 2);
        raw[0] = b'X';
        assert!(matches!(
            Footer::parse(&raw),
            Err(VhdError::BadCookie { .. })
        ));
        let raw = build_footer(MIB, [1; 16], 3);
        let err = Footer::parse(&raw).unwrap_err();
        assert!(err.to_string().contains("dynamic"), "{err}");
        assert!(check_first_sector(&raw).is_err());
        assert!(check_first_sector(&[0u8; 512]).is_ok());
        let raw = build_footer(MIB, [1; 16], 4);
        assert!(Footer::parse(&raw)
            .unwrap_err()
            .to_string()
            .contains("differencing"));
        let f = Footer::parse(&build_footer(MIB, [1; 16], 2)).unwrap();
        assert!(matches!(
            f.verify_file_size(MIB),
            Err(VhdError::SizeMismatch { .. })
        ));
        let f = Footer::parse(&build_footer(MIB + 512, [1; 16], 2)).unwrap();
        assert!(matches!(
            f.verify_file_size(MIB + 1024),
            Err(VhdError::NotWholeMib { .. })
        ));
        assert!(check_file_size(100).is_err());
        assert!(check_file_size(MIB + 100).is_err());
    }

    #[test]
    fn runs_are_sector_aligned_and_maximal() {
        let mut buf = vec![0u8; 8 * 512];
        buf[0] = 1; // sector 0
        buf[512 + 511] = 1; // sector 1
        buf[4 * 512 + 3] = 9; // sector 4
        buf[7 * 512] = 1; // sector 7
        let runs: Vec<_> = nonzero_runs(&buf, 1 << 20).collect();
        let b = 1u64 << 20;
        assert_eq!(
            runs,
            vec![b..b + 1024, b + 2048..b + 2560, b + 3584..b + 4096]
        );
        assert_eq!(data_bytes(&buf), 4 * 512);
        assert!(!is_zero(&buf));
        assert!(is_zero(&vec![0u8; 4096 + 7]));
        assert!(!is_zero(&[0, 0, 0, 1]));
        assert_eq!(nonzero_runs(&[], 0).count(), 0);
    }

    proptest! {
        #[test]
        fn runs_match_a_naive_oracle(marks in proptest::collection::vec((0usize..64, 0usize..512), 0..20), sectors in 1usize..64) {
            let mut buf = vec![0u8; sectors * 512];
            for (s, o) in marks {
                if s < sectors { buf[s * 512 + o] = 0xAB; }
            }
            let naive: Vec<bool> = buf.chunks(512).map(|c| c.iter().any(|&b| b != 0)).collect();
            let mut expected = Vec::new();
            let mut i = 0;
            while i < naive.len() {
                if naive[i] {
                    let start = i;
                    while i < naive.len() && naive[i] { i += 1; }
                    expected.push((start * 512) as u64..(i * 512) as u64);
                } else { i += 1; }
            }
            let runs: Vec<_> = nonzero_runs(&buf, 0).collect();
            prop_assert_eq!(runs, expected);
            prop_assert_eq!(is_zero(&buf), naive.iter().all(|x| !x));
            prop_assert_eq!(data_bytes(&buf), naive.iter().filter(|x| **x).count() as u64 * 512);
        }
    }
}
