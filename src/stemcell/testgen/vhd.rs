//! Generated root.vhd files: seeded pseudo-random (or corpus) data in an evenly spread fraction of
//! blocks, zeros elsewhere, and a fixed-VHD footer (or a deliberately broken one), produced on the
//! fly by [`VhdReader`].

use std::io::{self, Read};

use crate::stemcell::vhd::{build_footer, FOOTER_LEN, MIB};

/// Shape of a generated root.vhd.
#[derive(Debug, Clone)]
pub struct VhdSpec {
    /// Virtual size in MiB (the file is this plus a 512-byte footer).
    pub mib: u64,
    /// Fraction of blocks filled with pseudo-random data (0.0..=1.0).
    pub data_fraction: f64,
    /// Size of a data block in bytes (a multiple of 512); 1 MiB by default.
    pub block: u64,
    pub seed: u64,
    /// 2 = fixed; 3 = dynamic (a footer copy is also written at the start); 4 = differencing.
    pub disk_type: u32,
    /// Flip a footer byte after computing its checksum.
    pub corrupt_footer_checksum: bool,
    /// Footer `current_size` = real size + this (0 for a valid VHD).
    pub footer_size_delta: i64,
    /// Extra bytes appended to the virtual disk (breaks the whole-MiB rule when not a MiB multiple).
    pub extra_bytes: u64,
    /// Fill data blocks from these bytes instead of pseudo-random data (which does not compress):
    /// e.g. files of a real root file system, so the stemcell compresses like a real one.
    pub corpus: Option<Corpus>,
}

/// Bytes that data blocks are cut from, cycled: block `i` starts at `i × block` modulo the length.
/// Made of whole non-zero 512-byte sectors (a zero sector gets one byte set), so a data block
/// holds no zero sector and [`VhdSpec::expected_data_bytes`] stays exact.
#[derive(Clone)]
pub struct Corpus(std::sync::Arc<Vec<u8>>);

impl Corpus {
    /// `None` when `bytes` holds less than one sector.
    pub fn new(mut bytes: Vec<u8>) -> Option<Corpus> {
        bytes.truncate(bytes.len() / 512 * 512);
        if bytes.is_empty() {
            return None;
        }
        for sector in bytes.chunks_exact_mut(512) {
            if sector.iter().all(|b| *b == 0) {
                sector[0] = 1;
            }
        }
        Some(Corpus(std::sync::Arc::new(bytes)))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn fill(&self, out: &mut [u8], start: u64) {
        let data = &self.0;
        let mut at = (start % data.len() as u64) as usize;
        let mut done = 0;
        while done < out.len() {
            let n = (data.len() - at).min(out.len() - done);
            out[done..done + n].copy_from_slice(&data[at..at + n]);
            done += n;
            at = 0;
        }
    }
}

impl std::fmt::Debug for Corpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Corpus({} bytes)", self.0.len())
    }
}

impl Default for VhdSpec {
    fn default() -> Self {
        VhdSpec {
            mib: 1,
            data_fraction: 0.0,
            block: MIB,
            seed: 1,
            disk_type: 2,
            corrupt_footer_checksum: false,
            footer_size_delta: 0,
            extra_bytes: 0,
            corpus: None,
        }
    }
}

impl VhdSpec {
    pub fn disk_size(&self) -> u64 {
        self.mib * MIB + self.extra_bytes
    }

    pub fn file_size(&self) -> u64 {
        self.disk_size() + FOOTER_LEN as u64
    }

    fn blocks(&self) -> u64 {
        self.disk_size().div_ceil(self.block)
    }

    /// Block `i` holds data when the running count of data blocks steps up at it: exactly
    /// round-down(fraction × blocks) blocks, evenly spread.
    fn is_data_block(&self, i: u64) -> bool {
        let f = self.data_fraction.clamp(0.0, 1.0);
        ((i + 1) as f64 * f).floor() > (i as f64 * f).floor()
    }

    /// Bytes of root.vhd in non-zero 512-byte sectors (data blocks plus the footer).
    pub fn expected_data_bytes(&self) -> u64 {
        let disk = self.disk_size();
        let mut n = 0;
        for i in 0..self.blocks() {
            if self.is_data_block(i) {
                let start = i * self.block;
                n += (start + self.block).min(disk) - start;
            }
        }
        n + FOOTER_LEN as u64
    }

    /// A reader producing the whole root.vhd file.
    pub fn reader(&self) -> VhdReader {
        let disk_size = self.disk_size();
        let current = (disk_size as i64 + self.footer_size_delta).max(0) as u64;
        let mut footer = build_footer(current, uid(self.seed), self.disk_type);
        if self.corrupt_footer_checksum {
            footer[200] ^= 0x5a;
        }
        VhdReader {
            spec: self.clone(),
            disk_size,
            footer,
            pos: 0,
            block_buf: Vec::new(),
            block_idx: u64::MAX,
        }
    }
}

fn uid(seed: u64) -> [u8; 16] {
    let mut s = seed ^ 0x5151_5151;
    let mut out = [0u8; 16];
    for c in out.chunks_exact_mut(8) {
        c.copy_from_slice(&splitmix(&mut s).to_le_bytes());
    }
    out
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Generates root.vhd bytes on the fly.
pub struct VhdReader {
    spec: VhdSpec,
    disk_size: u64,
    footer: [u8; FOOTER_LEN],
    pos: u64,
    block_buf: Vec<u8>,
    block_idx: u64,
}

impl VhdReader {
    fn fill_block(&mut self, idx: u64) {
        let len = self.spec.block as usize;
        self.block_buf.resize(len, 0);
        if let Some(corpus) = &self.spec.corpus {
            corpus.fill(&mut self.block_buf, idx * self.spec.block);
            self.block_idx = idx;
            return;
        }
        let mut state = self.spec.seed ^ idx.wrapping_mul(0xA24B_AED4_963E_E407);
        for w in self.block_buf.chunks_exact_mut(8) {
            w.copy_from_slice(&splitmix(&mut state).to_le_bytes());
        }
        self.block_idx = idx;
    }
}

impl Read for VhdReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let total = self.disk_size + FOOTER_LEN as u64;
        if self.pos >= total || out.is_empty() {
            return Ok(0);
        }
        if self.pos >= self.disk_size {
            let at = (self.pos - self.disk_size) as usize;
            let n = (FOOTER_LEN - at).min(out.len());
            out[..n].copy_from_slice(&self.footer[at..at + n]);
            self.pos += n as u64;
            return Ok(n);
        }
        let block = self.spec.block;
        let idx = self.pos / block;
        let within = (self.pos % block) as usize;
        let block_end = ((idx + 1) * block).min(self.disk_size);
        let n = ((block_end - self.pos) as usize).min(out.len());
        if idx == 0 && self.spec.disk_type != 2 && self.pos < FOOTER_LEN as u64 {
            // Dynamic and differencing disks start with a copy of the footer.
            let m = (FOOTER_LEN - within).min(out.len());
            out[..m].copy_from_slice(&self.footer[within..within + m]);
            self.pos += m as u64;
            return Ok(m);
        }
        if self.spec.is_data_block(idx) {
            if self.block_idx != idx {
                self.fill_block(idx);
            }
            out[..n].copy_from_slice(&self.block_buf[within..within + n]);
        } else {
            out[..n].fill(0);
        }
        self.pos += n as u64;
        Ok(n)
    }
}
