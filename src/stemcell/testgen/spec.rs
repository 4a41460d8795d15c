//! The shape of a generated stemcell ([`StemcellSpec`]): its manifest, its image and the outer
//! tarball, in memory or streamed to a file, and what was generated.

use std::fs::File;
use std::io::{self, BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

use sha1::{Digest, Sha1};
use sha2::Sha256;

use super::tgz::{write_tgz, TarEntry};
use super::vhd::VhdSpec;

/// Entry order in the outer tarball.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    ManifestFirst,
    ImageFirst,
}

/// How the manifest's `sha1` field is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShaField {
    /// Plain SHA-1 hex of the image.
    Sha1,
    /// `sha1:<hex>`.
    Sha1Prefixed,
    /// `sha256:<hex>`.
    Sha256Prefixed,
    /// This literal value (e.g. a wrong digest).
    Literal(String),
}

/// Shape of a generated stemcell.
#[derive(Debug, Clone)]
pub struct StemcellSpec {
    pub name: String,
    /// The version as written in YAML (quote it yourself for a string: `'1.506'`).
    pub version_yaml: String,
    pub gen2: bool,
    pub arm64: bool,
    pub order: Order,
    pub dot_prefix: bool,
    pub sha: ShaField,
    pub vhd: VhdSpec,
    /// Name of the VHD inside the image.
    pub vhd_name: String,
    pub level: u32,
}

impl Default for StemcellSpec {
    fn default() -> Self {
        StemcellSpec {
            name: "bosh-azure-hyperv-ubuntu-jammy-go_agent".into(),
            version_yaml: "'1.506'".into(),
            gen2: false,
            arm64: false,
            order: Order::ManifestFirst,
            dot_prefix: false,
            sha: ShaField::Sha1,
            vhd: VhdSpec::default(),
            vhd_name: "root.vhd".into(),
            level: 6,
        }
    }
}

/// What was generated.
#[derive(Debug, Clone)]
pub struct Generated {
    pub image_sha1: String,
    pub image_sha256: String,
    pub image_size: u64,
    pub vhd_file_size: u64,
    pub data_bytes: u64,
    pub zero_bytes: u64,
}

impl StemcellSpec {
    /// The stemcell.MF text, given the digests of the image.
    pub fn manifest(&self, sha1: &str, sha256: &str) -> String {
        let sha = match &self.sha {
            ShaField::Sha1 => sha1.to_string(),
            ShaField::Sha1Prefixed => format!("sha1:{sha1}"),
            ShaField::Sha256Prefixed => format!("sha256:{sha256}"),
            ShaField::Literal(s) => s.clone(),
        };
        let mut cloud = format!(
            "  name: {name}\n  version: {v}\n  infrastructure: azure\n  hypervisor: hyperv\n  disk: 5120\n  disk_format: vhd\n  container_format: bare\n  os_type: linux\n  os_distro: ubuntu\n  architecture: {arch}\n  root_device_name: /dev/sda1\n",
            name = self.name,
            v = self.version_yaml,
            arch = if self.arm64 { "arm64" } else { "x86_64" },
        );
        if self.gen2 {
            cloud.push_str("  generation: gen2\n  disk_controller_types: [scsi, nvme]\n  security_type: TrustedLaunchSupported\n  accelerated_networking: true\n");
        }
        format!(
            "---\nname: {name}\nversion: {v}\nbosh_protocol: 1\napi_version: 3\nsha1: {sha}\noperating_system: ubuntu-jammy\nstemcell_formats:\n- azure-vhd\ncloud_properties:\n{cloud}",
            name = self.name,
            v = self.version_yaml,
        )
    }

    fn entry_name(&self, name: &str) -> String {
        if self.dot_prefix {
            format!("./{name}")
        } else {
            name.to_string()
        }
    }

    fn image_entries(&self) -> Vec<TarEntry> {
        vec![TarEntry::Stream {
            path: self.entry_name(&self.vhd_name),
            size: self.vhd.file_size(),
            reader: Box::new(self.vhd.reader()),
        }]
    }

    fn generated(&self, sha1: String, sha256: String, image_size: u64) -> Generated {
        let data = self.vhd.expected_data_bytes();
        Generated {
            image_sha1: sha1,
            image_sha256: sha256,
            image_size,
            vhd_file_size: self.vhd.file_size(),
            data_bytes: data,
            zero_bytes: self.vhd.file_size() - data,
        }
    }

    /// The image file (gzip(tar(root.vhd))) in memory; for small VHDs.
    pub fn image_bytes(&self) -> io::Result<Vec<u8>> {
        write_tgz(Vec::new(), self.image_entries(), self.level)
    }

    /// The outer tarball's entries around a given image.
    pub fn outer_entries(&self, manifest: String, image: TarEntry) -> Vec<TarEntry> {
        let mf = TarEntry::File {
            path: self.entry_name("stemcell.MF"),
            data: manifest.into_bytes(),
        };
        let pkgs = TarEntry::File {
            path: self.entry_name("packages.txt"),
            data: b"ii  openssl 3.0.2\n".to_vec(),
        };
        match self.order {
            Order::ManifestFirst => vec![mf, pkgs, image],
            Order::ImageFirst => vec![image, pkgs, mf],
        }
    }

    /// The whole stemcell in memory; for small VHDs.
    pub fn stemcell_bytes(&self) -> io::Result<(Vec<u8>, Generated)> {
        let image = self.image_bytes()?;
        let sha1 = hex::encode(Sha1::digest(&image));
        let sha256 = hex::encode(Sha256::digest(&image));
        let manifest = self.manifest(&sha1, &sha256);
        let gen = self.generated(sha1, sha256, image.len() as u64);
        let entry = TarEntry::File {
            path: self.entry_name("image"),
            data: image,
        };
        let bytes = write_tgz(Vec::new(), self.outer_entries(manifest, entry), self.level)?;
        Ok((bytes, gen))
    }

    /// Write the stemcell to `path`, streaming (any VHD size); the image is staged in
    /// `<path>.image.tmp` and removed afterwards.
    pub fn write_to(&self, path: &Path) -> io::Result<Generated> {
        let tmp = path.with_extension("image.tmp");
        let result = self.write_via(path, &tmp);
        let _ = std::fs::remove_file(&tmp);
        result
    }

    fn write_via(&self, path: &Path, tmp: &Path) -> io::Result<Generated> {
        let staged = File::options()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(tmp)?;
        let hashing = HashWriter::new(BufWriter::with_capacity(1 << 20, staged));
        let hashing = write_tgz(hashing, self.image_entries(), self.level)?;
        let (w, sha1, sha256, size) = hashing.finish();
        let mut staged = w.into_inner().map_err(|e| e.into_error())?;
        staged.seek(SeekFrom::Start(0))?;
        let manifest = self.manifest(&sha1, &sha256);
        let gen = self.generated(sha1, sha256, size);
        let entry = TarEntry::Stream {
            path: self.entry_name("image"),
            size,
            reader: Box::new(io::BufReader::with_capacity(1 << 20, staged)),
        };
        let out = BufWriter::with_capacity(1 << 20, File::create(path)?);
        let mut out = write_tgz(out, self.outer_entries(manifest, entry), self.level)?;
        out.flush()?;
        Ok(gen)
    }
}

struct HashWriter<W> {
    inner: W,
    sha1: Sha1,
    sha256: Sha256,
    size: u64,
}

impl<W: Write> HashWriter<W> {
    fn new(inner: W) -> Self {
        HashWriter {
            inner,
            sha1: Sha1::new(),
            sha256: Sha256::new(),
            size: 0,
        }
    }

    fn finish(self) -> (W, String, String, u64) {
        (
            self.inner,
            hex::encode(self.sha1.finalize()),
            hex::encode(self.sha256.finalize()),
            self.size,
        )
    }
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.sha1.update(&buf[..n]);
        self.sha256.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}
