//! Reading the stemcell for publish: the digest pass (before any request), the full pass
//! (inflate and verify everything, streaming root.vhd into a sink) and what they established.

use std::fs::File;
use std::io::BufReader;

use anyhow::Context;

use super::Source;
use crate::gallery::service::StemcellImage;
use crate::stemcell::archive::{
    digest_image, digest_stemcell, read_image, read_manifest_only, read_stemcell, NullSink, VhdSink,
};
use crate::stemcell::manifest::CloudProperties;
use crate::stemcell::version::VersionKey;

/// What the digest pass (and the full verification pass, when it ran) established.
#[derive(Debug, Clone)]
pub(super) struct Checked {
    pub(super) stemcell: StemcellImage,
    pub(super) cloud: CloudProperties,
    /// root.vhd's size: from the image's first bytes, or from the full pass.
    pub(super) vhd_file_size: u64,
    /// `Some` once the whole stemcell has been read and verified (footer and data).
    pub(super) full: Option<FullRead>,
}

impl Checked {
    /// Bytes of root.vhd a full pass of this call read (0 when none ran).
    pub(super) fn bytes_read(&self) -> u64 {
        self.full.map_or(0, |f| f.vhd_bytes)
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct FullRead {
    pub(super) vhd_bytes: u64,
    pub(super) zero_bytes: u64,
}

/// Whether the reader failed because its sink (the uploader) did.
pub(super) fn is_sink_error(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<crate::stemcell::archive::ArchiveError>(),
        Some(crate::stemcell::archive::ArchiveError::Sink(_))
    )
}

pub(super) struct UploadSink<F> {
    /// The size the page blob was created with.
    pub(super) size: u64,
    pub(super) send: F,
}

impl<F, E> VhdSink for UploadSink<F>
where
    F: FnMut(u64, &[u8]) -> Result<(), E>,
    E: std::error::Error + Send + Sync + 'static,
{
    fn start(&mut self, vhd_size: u64) -> anyhow::Result<()> {
        if vhd_size != self.size {
            anyhow::bail!(
                "root.vhd is {vhd_size} bytes, but the digest pass read {} from the same file; is the file being rewritten?",
                self.size
            );
        }
        Ok(())
    }
    fn chunk(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<()> {
        (self.send)(offset, data)?;
        Ok(())
    }
    fn finish(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

fn open(path: &std::path::Path) -> anyhow::Result<BufReader<File>> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    Ok(BufReader::with_capacity(1 << 20, file))
}

/// The digest pass (see the documentation of `app::publish`): everything the outer tarball and the
/// image's first bytes can show, found before any request. `vhd_file_size` is 0 when those bytes
/// do not settle root.vhd; the caller then verifies in full before writing.
pub(super) async fn check(source: Source) -> anyhow::Result<Checked> {
    tokio::task::spawn_blocking(move || check_blocking(&source))
        .await
        .map_err(|e| anyhow::anyhow!("the stemcell reader stopped: {e}"))?
}

fn check_blocking(source: &Source) -> anyhow::Result<Checked> {
    match source {
        Source::Stemcell(path) => {
            let shown = path.display();
            // Cheap checks first (the manifest usually precedes the image).
            let manifest = read_manifest_only(open(path)?)
                .with_context(|| format!("stemcell {shown} is not usable"))?;
            manifest
                .require_heavy()
                .with_context(|| format!("stemcell {shown} cannot be published to a gallery"))?;
            manifest
                .version_key()
                .with_context(|| format!("stemcell {shown} has no gallery version key"))?;
            let digests = digest_stemcell(open(path)?)
                .with_context(|| format!("stemcell {shown} is not usable"))?;
            let manifest = digests
                .manifest
                .as_ref()
                .ok_or_else(|| anyhow::anyhow!("stemcell {shown} has no stemcell.MF"))?;
            let key = manifest
                .version_key()
                .with_context(|| format!("stemcell {shown} has no gallery version key"))?;
            Ok(Checked {
                stemcell: StemcellImage::from_manifest(manifest, &key, &digests.image_sha256),
                cloud: manifest.cloud_properties.clone(),
                vhd_file_size: digests.vhd.map_or(0, |v| v.file_size),
                full: None,
            })
        }
        Source::Image {
            path,
            name,
            version,
            cloud_properties,
        } => {
            let key = VersionKey::parse(version)
                .with_context(|| format!("stemcell {name} {version} has no gallery version key"))?;
            let digests = digest_image(open(path)?)
                .with_context(|| format!("image {} is not usable", path.display()))?;
            Ok(Checked {
                stemcell: StemcellImage::from_cloud_properties(
                    name,
                    version,
                    &key,
                    cloud_properties,
                    &digests.image_sha256,
                ),
                cloud: cloud_properties.clone(),
                vhd_file_size: digests.vhd.map_or(0, |v| v.file_size),
                full: None,
            })
        }
    }
}

/// Read and verify the whole stemcell (footer, data) without writing anything, once per call:
/// before refusing a conflict or adopting, and when the digest pass could not settle root.vhd.
/// The digest must be the digest pass's (the same file).
pub(super) async fn verify_fully(source: &Source, checked: &mut Checked) -> anyhow::Result<()> {
    if checked.full.is_some() {
        return Ok(());
    }
    let source = source.clone();
    let pass = tokio::task::spawn_blocking(move || full_pass(&source, &mut NullSink))
        .await
        .map_err(|e| anyhow::anyhow!("the stemcell reader stopped: {e}"))??;
    let expected = &checked.stemcell.image_sha256;
    if !pass.image_sha256.eq_ignore_ascii_case(expected) {
        anyhow::bail!(
            "the image changed between the digest pass and the verification (SHA-256 {expected} then {}); is the file being rewritten?",
            pass.image_sha256
        );
    }
    checked.vhd_file_size = pass.vhd_file_size;
    checked.full = Some(pass.read);
    Ok(())
}

/// What one full pass over the source read.
pub(super) struct FullPass {
    pub(super) image_sha256: String,
    pub(super) vhd_file_size: u64,
    pub(super) read: FullRead,
}

/// One full pass over the source (inflate, verify everything, stream root.vhd into `sink`).
pub(super) fn full_pass(source: &Source, sink: &mut dyn VhdSink) -> anyhow::Result<FullPass> {
    let (image_sha256, vhd, vhd_bytes, zero_bytes) = match source {
        Source::Stemcell(path) => {
            let s = read_stemcell(open(path)?, sink)
                .with_context(|| format!("stemcell {} is not usable", path.display()))?;
            (s.image_sha256, s.vhd, s.vhd_bytes, s.zero_bytes)
        }
        Source::Image { path, .. } => {
            let s = read_image(open(path)?, sink)
                .with_context(|| format!("image {} is not usable", path.display()))?;
            (s.image_sha256, s.vhd, s.vhd_bytes, s.zero_bytes)
        }
    };
    Ok(FullPass {
        image_sha256,
        vhd_file_size: vhd.file_size,
        read: FullRead {
            vhd_bytes,
            zero_bytes,
        },
    })
}
