//! Reading the stemcell for publish: what is known before the image is read (the manifest alone,
//! or the digest pass), the full pass (inflate and verify everything, streaming root.vhd into a
//! sink) and what they established.

use std::fs::File;
use std::io::BufReader;
use std::time::Instant;

use anyhow::Context;
use tokio::sync::oneshot;

use super::Source;
use crate::gallery::service::StemcellImage;
use crate::stemcell::archive::{
    digest_image, digest_stemcell, read_image, read_manifest_only, read_stemcell, NullSink, VhdSink,
};
use crate::stemcell::manifest::{Checksum, CloudProperties, Manifest};
use crate::stemcell::version::VersionKey;
use crate::stemcell::vhd::{FOOTER_LEN, MIB};

/// What is known of the stemcell: before its image is read (the manifest, and the digest it
/// declares), after the digest pass (both digests, computed), after a full pass (everything).
#[derive(Debug, Clone)]
pub(super) struct Checked {
    /// Its `image_sha256` is empty until the SHA-256 is known ([`Checked::sha256`]).
    pub(super) stemcell: StemcellImage,
    pub(super) cloud: CloudProperties,
    /// The manifest read first (a stemcell tarball): every later pass must read the same one.
    pub(super) manifest: Option<Manifest>,
    /// The image's SHA-1: declared by the manifest, or computed.
    pub(super) sha1: Option<String>,
    /// The image's SHA-256: declared by the manifest (`sha256:...`), or computed.
    pub(super) sha256: Option<String>,
    /// Both digests were computed from the file (a digest pass or a full pass), and the manifest's
    /// checksum verified against them.
    pub(super) computed: bool,
    /// root.vhd's size: from the image's first bytes or a full pass; 0 when not known.
    pub(super) vhd_file_size: u64,
    /// `Some` once the whole stemcell has been read and verified (footer and data).
    pub(super) full: Option<FullRead>,
}

impl Checked {
    /// Bytes of root.vhd a full pass of this call read (0 when none ran).
    pub(super) fn bytes_read(&self) -> u64 {
        self.full.map_or(0, |f| f.vhd_bytes)
    }

    /// The digests known now, SHA-1 first: the upload locks to take, and what a partial blob
    /// records.
    pub(super) fn digests(&self) -> Vec<Checksum> {
        let mut out = Vec::new();
        if let Some(d) = &self.sha1 {
            out.push(Checksum::Sha1(d.to_ascii_lowercase()));
        }
        if let Some(d) = &self.sha256 {
            out.push(Checksum::Sha256(d.to_ascii_lowercase()));
        }
        out
    }

    fn set_sha256(&mut self, sha256: &str) {
        self.sha256 = Some(sha256.to_string());
        self.stemcell.content = crate::gallery::Content::image(sha256);
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

/// The VHD consumer of the upload pass. Nothing is written before root.vhd's first chunk: its
/// tar header gave the size and its first sector was checked. Then the sink asks the uploader to
/// begin (`begin`: the size) and waits for its answer (`go`): on with the upload, or stop (the
/// version or a reusable blob turned up under the upload lock; the read ends with a sink error).
/// A root.vhd that cannot become a page blob (not a whole number of MiB) is read to its end
/// without asking: the footer check then says what is wrong.
pub(super) struct UploadSink<F> {
    /// The size the digest pass read from the same file, if it ran.
    expected: Option<u64>,
    size: u64,
    uploadable: bool,
    begin: Option<oneshot::Sender<u64>>,
    go: Option<oneshot::Receiver<()>>,
    send: F,
}

impl<F> UploadSink<F> {
    pub(super) fn new(
        expected: Option<u64>,
        begin: oneshot::Sender<u64>,
        go: oneshot::Receiver<()>,
        send: F,
    ) -> Self {
        UploadSink {
            expected,
            size: 0,
            uploadable: false,
            begin: Some(begin),
            go: Some(go),
            send,
        }
    }
}

/// The uploader did not want the VHD after all (see [`UploadSink`]): the read ends with this sink
/// error, which the uploader's side explains.
fn stopped() -> anyhow::Error {
    anyhow::anyhow!("the upload stopped before its first page")
}

impl<F, E> VhdSink for UploadSink<F>
where
    F: FnMut(u64, &[u8]) -> Result<(), E>,
    E: std::error::Error + Send + Sync + 'static,
{
    fn start(&mut self, vhd_size: u64) -> anyhow::Result<()> {
        if let Some(expected) = self.expected.filter(|&e| e != vhd_size) {
            anyhow::bail!(
                "root.vhd is {vhd_size} bytes, but the digest pass read {expected} from the same file; is the file being rewritten?"
            );
        }
        self.size = vhd_size;
        self.uploadable =
            vhd_size > FOOTER_LEN as u64 && (vhd_size - FOOTER_LEN as u64).is_multiple_of(MIB);
        Ok(())
    }
    fn chunk(&mut self, offset: u64, data: &[u8]) -> anyhow::Result<()> {
        if !self.uploadable {
            return Ok(());
        }
        if let Some(begin) = self.begin.take() {
            begin.send(self.size).map_err(|_| stopped())?;
            let go = self.go.take().ok_or_else(stopped)?;
            go.blocking_recv().map_err(|_| stopped())?;
        }
        (self.send)(offset, data)?;
        Ok(())
    }
    fn finish(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

fn open(what: &'static str, path: &std::path::Path) -> anyhow::Result<BufReader<File>> {
    let file = crate::stemcell::open_input(what, path)?;
    Ok(BufReader::with_capacity(1 << 20, file))
}

/// What can be known before the image is read: for a stemcell tarball its manifest (read up to
/// `stemcell.MF` only, the image neither inflated nor hashed: light stemcells, the version key and
/// the declared checksum); for an `image` file alone, which declares nothing, the digest pass.
/// Bad input found here causes no request at all.
pub(super) async fn describe(source: Source) -> anyhow::Result<Checked> {
    tokio::task::spawn_blocking(move || describe_blocking(&source))
        .await
        .map_err(|e| anyhow::anyhow!("the stemcell reader stopped: {e}"))?
}

fn describe_blocking(source: &Source) -> anyhow::Result<Checked> {
    match source {
        Source::Stemcell(path) => {
            let shown = path.display();
            let manifest = read_manifest_only(open("the stemcell", path)?)
                .with_context(|| format!("stemcell {shown} is not usable"))?;
            manifest
                .require_heavy()
                .with_context(|| format!("stemcell {shown} cannot be published to a gallery"))?;
            let key = manifest
                .version_key()
                .with_context(|| format!("stemcell {shown} has no gallery version key"))?;
            let (sha1, sha256) = match &manifest.sha1 {
                Checksum::Sha1(d) => (Some(d.clone()), None),
                Checksum::Sha256(d) => (None, Some(d.clone())),
            };
            let stemcell =
                StemcellImage::from_manifest(&manifest, &key, sha256.as_deref().unwrap_or(""));
            Ok(Checked {
                stemcell,
                cloud: manifest.cloud_properties.clone(),
                manifest: Some(manifest),
                sha1,
                sha256,
                computed: false,
                vhd_file_size: 0,
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
            let digests = digest_image(open("the image", path)?)
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
                manifest: None,
                sha1: Some(digests.sha1),
                sha256: Some(digests.image_sha256),
                computed: true,
                vhd_file_size: digests.vhd.map_or(0, |v| v.file_size),
                full: None,
            })
        }
    }
}

/// The digest pass (see the documentation of `app::publish`), unless the digests were computed
/// already: inflates the outer tarball only, hashes the image (SHA-1 against the manifest, and its
/// SHA-256) and reads root.vhd's size from the image's first bytes. Writes nothing. The manifest
/// must be the one [`describe`] read.
pub(super) async fn digest(source: &Source, checked: &mut Checked) -> anyhow::Result<()> {
    if checked.computed {
        return Ok(());
    }
    let Source::Stemcell(path) = source.clone() else {
        // An image file alone is digested when described.
        anyhow::bail!("the image file was not digested; this is a bug, please report it");
    };
    let digests = tokio::task::spawn_blocking(move || {
        digest_stemcell(open("the stemcell", &path)?)
            .with_context(|| format!("stemcell {} is not usable", path.display()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("the stemcell reader stopped: {e}"))??;
    same_manifest(source, checked, digests.manifest.as_ref())?;
    checked.sha1 = Some(digests.sha1);
    checked.set_sha256(&digests.image_sha256);
    checked.computed = true;
    if checked.vhd_file_size == 0 {
        checked.vhd_file_size = digests.vhd.map_or(0, |v| v.file_size);
    }
    Ok(())
}

/// The digest pass, timed in the debug log.
pub(super) async fn digest_pass(source: &Source, checked: &mut Checked) -> anyhow::Result<()> {
    if checked.computed {
        return Ok(());
    }
    let at = Instant::now();
    digest(source, checked).await?;
    tracing::debug!(
        seconds = at.elapsed().as_secs_f64(),
        image_sha256 = %checked.stemcell.content.digest(),
        "digest pass done"
    );
    Ok(())
}

/// A later pass read `seen` where [`describe`] read `checked.manifest`: they must be the same.
fn same_manifest(
    source: &Source,
    checked: &Checked,
    seen: Option<&Manifest>,
) -> anyhow::Result<()> {
    if checked.manifest.as_ref() != seen {
        let shown = match source {
            Source::Stemcell(p) | Source::Image { path: p, .. } => p.display().to_string(),
        };
        anyhow::bail!(
            "stemcell {shown} changed while it was being read (its stemcell.MF is not the one read first); is the file being rewritten?"
        );
    }
    Ok(())
}

/// Record what a full pass of the same file read, after checking it is the file read before:
/// the same manifest, and the digests known so far.
pub(super) fn settle(
    source: &Source,
    checked: &mut Checked,
    pass: &FullPass,
) -> anyhow::Result<()> {
    if let Source::Stemcell(_) = source {
        same_manifest(source, checked, pass.manifest.as_ref())?;
    }
    for (algorithm, known, read) in [
        ("SHA-1", &checked.sha1, &pass.sha1),
        ("SHA-256", &checked.sha256, &pass.image_sha256),
    ] {
        if let Some(known) = known.as_deref().filter(|k| !k.eq_ignore_ascii_case(read)) {
            anyhow::bail!(
                "the image changed while it was being read ({algorithm} {known} then {read}); is the file being rewritten?"
            );
        }
    }
    if checked.vhd_file_size > 0 && checked.vhd_file_size != pass.vhd_file_size {
        anyhow::bail!(
            "root.vhd is {} bytes, but an earlier pass read {} from the same file; is the file being rewritten?",
            pass.vhd_file_size,
            checked.vhd_file_size
        );
    }
    checked.sha1 = Some(pass.sha1.clone());
    checked.set_sha256(&pass.image_sha256);
    checked.computed = true;
    checked.vhd_file_size = pass.vhd_file_size;
    checked.full = Some(pass.read);
    Ok(())
}

/// Read and verify the whole stemcell (footer, data) without writing anything, once per call:
/// before refusing a conflict or adopting. The digests must be the ones read before (the same
/// file).
pub(super) async fn verify_fully(source: &Source, checked: &mut Checked) -> anyhow::Result<()> {
    if checked.full.is_some() {
        return Ok(());
    }
    let pass = {
        let source = source.clone();
        tokio::task::spawn_blocking(move || full_pass(&source, &mut NullSink))
            .await
            .map_err(|e| anyhow::anyhow!("the stemcell reader stopped: {e}"))??
    };
    settle(source, checked, &pass)
}

/// What one full pass over the source read.
pub(super) struct FullPass {
    /// The manifest it read (a stemcell tarball).
    pub(super) manifest: Option<Manifest>,
    pub(super) sha1: String,
    pub(super) image_sha256: String,
    pub(super) vhd_file_size: u64,
    pub(super) read: FullRead,
}

/// One full pass over the source (inflate, verify everything, stream root.vhd into `sink`). For
/// a stemcell tarball the image's checksum is verified against the manifest this pass reads.
pub(super) fn full_pass(source: &Source, sink: &mut dyn VhdSink) -> anyhow::Result<FullPass> {
    match source {
        Source::Stemcell(path) => {
            let s = read_stemcell(open("the stemcell", path)?, sink)
                .with_context(|| format!("stemcell {} is not usable", path.display()))?;
            Ok(FullPass {
                manifest: Some(s.manifest),
                sha1: s.sha1,
                image_sha256: s.image_sha256,
                vhd_file_size: s.vhd.file_size,
                read: FullRead {
                    vhd_bytes: s.vhd_bytes,
                    zero_bytes: s.zero_bytes,
                },
            })
        }
        Source::Image { path, .. } => {
            let s = read_image(open("the image", path)?, sink)
                .with_context(|| format!("image {} is not usable", path.display()))?;
            Ok(FullPass {
                manifest: None,
                sha1: s.image_sha1,
                image_sha256: s.image_sha256,
                vhd_file_size: s.vhd.file_size,
                read: FullRead {
                    vhd_bytes: s.vhd_bytes,
                    zero_bytes: s.zero_bytes,
                },
            })
        }
    }
}
