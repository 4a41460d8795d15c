//! The committed fixture corpus under fixtures/stemcells/: every valid and broken stemcell, with
//! what inspecting each must give.

use std::io;
use std::path::Path;

use sha1::{Digest, Sha1};
use sha2::Sha256;

use super::spec::{Generated, Order, ShaField, StemcellSpec};
use super::tgz::{write_tgz, TarEntry};
use super::vhd::VhdSpec;
use crate::stemcell::vhd::MIB;

/// What inspecting a fixture must give.
#[derive(Debug, Clone)]
pub enum Expect {
    Valid {
        name: &'static str,
        version: &'static str,
        version_key: &'static str,
        definition: &'static str,
        architecture: &'static str,
        generation: &'static str,
        generated: Generated,
    },
    /// Inspect fails with exit 1 and a message containing this text.
    Broken(&'static str),
}

/// A named fixture: its file name, its bytes, and what inspecting it must give.
pub struct Fixture {
    pub file: &'static str,
    pub bytes: Vec<u8>,
    pub expect: Expect,
}

fn small(vhd_mib: u64) -> VhdSpec {
    VhdSpec {
        mib: vhd_mib,
        data_fraction: 0.01,
        block: 4096,
        seed: vhd_mib * 7 + 3,
        ..VhdSpec::default()
    }
}

fn valid(
    file: &'static str,
    spec: StemcellSpec,
    version: &'static str,
    version_key: &'static str,
    definition: &'static str,
) -> io::Result<Fixture> {
    let (bytes, generated) = spec.stemcell_bytes()?;
    Ok(Fixture {
        file,
        bytes,
        expect: Expect::Valid {
            name: "bosh-azure-hyperv-ubuntu-jammy-go_agent",
            version,
            version_key,
            definition,
            architecture: if spec.arm64 { "Arm64" } else { "x64" },
            generation: if spec.gen2 { "V2" } else { "V1" },
            generated,
        },
    })
}

fn broken(file: &'static str, bytes: Vec<u8>, needle: &'static str) -> Fixture {
    Fixture {
        file,
        bytes,
        expect: Expect::Broken(needle),
    }
}

/// A broken stemcell whose VHD is altered by `f`.
fn with_vhd(f: impl FnOnce(&mut VhdSpec)) -> io::Result<Vec<u8>> {
    let mut spec = StemcellSpec {
        vhd: VhdSpec::default(),
        ..StemcellSpec::default()
    };
    f(&mut spec.vhd);
    Ok(spec.stemcell_bytes()?.0)
}

/// A stemcell assembled from explicit outer entries (manifest digest matches `image`).
fn assemble(
    image: Vec<u8>,
    build: impl FnOnce(String, Vec<u8>) -> Vec<TarEntry>,
) -> io::Result<Vec<u8>> {
    let spec = StemcellSpec::default();
    let manifest = spec.manifest(
        &hex::encode(Sha1::digest(&image)),
        &hex::encode(Sha256::digest(&image)),
    );
    write_tgz(Vec::new(), build(manifest, image), 6)
}

/// A stemcell of the manifest and `image` (the manifest's digest matches it).
fn around(image: Vec<u8>) -> io::Result<Vec<u8>> {
    assemble(image, |mf, img| {
        vec![file("stemcell.MF", mf.into_bytes()), file("image", img)]
    })
}

/// A stemcell whose image is gzip(tar(`entries`)) instead of a valid gzip(tar(root.vhd)).
fn with_image_entries(entries: Vec<TarEntry>) -> io::Result<Vec<u8>> {
    around(write_tgz(Vec::new(), entries, 6)?)
}

fn file(path: &str, data: Vec<u8>) -> TarEntry {
    TarEntry::File {
        path: path.into(),
        data,
    }
}

/// Every committed fixture under fixtures/stemcells/, valid and broken.
pub fn fixtures() -> io::Result<Vec<Fixture>> {
    const NAME: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
    let base = StemcellSpec {
        vhd: small(2),
        ..StemcellSpec::default()
    };
    let image = StemcellSpec::default().image_bytes()?;
    let mut out = vec![
        valid("gen1-x86_64.tgz", base.clone(), "1.506", "1.506.0", NAME)?,
        valid(
            "gen2-arm64.tgz",
            StemcellSpec {
                gen2: true,
                arm64: true,
                version_yaml: "'1.507.2'".into(),
                vhd: small(3),
                ..base.clone()
            },
            "1.507.2",
            "1.507.2",
            "bosh-azure-hyperv-ubuntu-jammy-go_agent-gen2",
        )?,
        valid(
            "numeric-version.tgz",
            StemcellSpec {
                version_yaml: "1.10".into(),
                vhd: small(1),
                ..base.clone()
            },
            "1.10",
            "1.10.0",
            NAME,
        )?,
        valid(
            "dot-prefix.tgz",
            StemcellSpec {
                dot_prefix: true,
                vhd: small(1),
                ..base.clone()
            },
            "1.506",
            "1.506.0",
            NAME,
        )?,
        valid(
            "image-first.tgz",
            StemcellSpec {
                order: Order::ImageFirst,
                vhd: small(1),
                ..base.clone()
            },
            "1.506",
            "1.506.0",
            NAME,
        )?,
        valid(
            "sha256-prefixed.tgz",
            StemcellSpec {
                sha: ShaField::Sha256Prefixed,
                version_yaml: "'2'".into(),
                vhd: small(1),
                ..base.clone()
            },
            "2",
            "2.0.0",
            NAME,
        )?,
    ];
    let mut full = StemcellSpec::default().stemcell_bytes()?.0;
    full.truncate(full.len() / 2);
    out.push(broken("truncated-gzip.tgz", full, "truncated"));
    out.push(broken(
        "not-gzip.tgz",
        b"this is not a stemcell\n".to_vec(),
        "not a valid gzip",
    ));
    out.push(broken(
        "missing-manifest.tgz",
        write_tgz(Vec::new(), vec![file("image", image.clone())], 6)?,
        "no \"stemcell.MF\"",
    ));
    out.push(broken(
        "missing-image.tgz",
        assemble(image.clone(), |mf, _| {
            vec![file("stemcell.MF", mf.into_bytes())]
        })?,
        "no \"image\"",
    ));
    out.push(broken(
        "duplicate-manifest.tgz",
        assemble(image.clone(), |mf, img| {
            vec![
                file("stemcell.MF", mf.clone().into_bytes()),
                file("./stemcell.MF", mf.into_bytes()),
                file("image", img),
            ]
        })?,
        "contains \"stemcell.MF\" more than once",
    ));
    out.push(broken(
        "duplicate-image.tgz",
        assemble(image.clone(), |mf, img| {
            vec![
                file("stemcell.MF", mf.into_bytes()),
                file("image", img.clone()),
                file("./image", img),
            ]
        })?,
        "contains \"image\" more than once",
    ));
    out.push(broken(
        "path-traversal.tgz",
        assemble(image.clone(), |mf, img| {
            vec![file("stemcell.MF", mf.into_bytes()), file("../image", img)]
        })?,
        "escapes the archive",
    ));
    out.push(broken(
        "symlink-image.tgz",
        assemble(image.clone(), |mf, _| {
            vec![
                file("stemcell.MF", mf.into_bytes()),
                TarEntry::Symlink {
                    path: "image".into(),
                    target: "/etc/passwd".into(),
                },
            ]
        })?,
        "symbolic link",
    ));
    out.push(broken(
        "hardlink-root-vhd.tgz",
        with_image_entries(vec![TarEntry::HardLink {
            path: "root.vhd".into(),
            target: "other.vhd".into(),
        }])?,
        "hard link",
    ));
    out.push(broken(
        "manifest-too-large.tgz",
        assemble(image.clone(), |mf, img| {
            let mut big = mf.into_bytes();
            big.extend_from_slice(b"# ");
            big.extend_from_slice(&vec![b' '; (MIB + 16) as usize]);
            big.push(b'\n');
            vec![file("stemcell.MF", big), file("image", img)]
        })?,
        "over the 1048576-byte limit",
    ));
    out.push(broken(
        "sha1-mismatch.tgz",
        StemcellSpec {
            sha: ShaField::Literal("0000000000000000000000000000000000000000".into()),
            ..StemcellSpec::default()
        }
        .stemcell_bytes()?
        .0,
        "sha1 is",
    ));
    out.push(broken(
        "dynamic-vhd.tgz",
        with_vhd(|v| v.disk_type = 3)?,
        "dynamic VHD",
    ));
    out.push(broken(
        "vhd-bad-checksum.tgz",
        with_vhd(|v| v.corrupt_footer_checksum = true)?,
        "footer checksum",
    ));
    out.push(broken(
        "vhd-size-mismatch.tgz",
        with_vhd(|v| v.footer_size_delta = 1024 * 1024)?,
        "the file holds",
    ));
    out.push(broken(
        "vhd-not-whole-mib.tgz",
        with_vhd(|v| v.extra_bytes = 512)?,
        "not a whole number of MiB",
    ));
    out.push(broken(
        "vhd-no-footer.tgz",
        with_image_entries(vec![file("root.vhd", vec![0u8; MIB as usize + 512])])?,
        "no VHD footer",
    ));
    out.push(broken(
        "image-without-root-vhd.tgz",
        with_image_entries(vec![file("disk.raw", vec![0u8; 1024])])?,
        "no \"root.vhd\"",
    ));
    out.push(broken(
        "image-not-gzip.tgz",
        around(b"plain bytes, not gzip".to_vec())?,
        "the image file is not a valid gzip",
    ));
    out.push(broken(
        "light-stemcell.tgz",
        {
            let spec = StemcellSpec::default();
            let mf = spec
                .manifest(
                    "da39a3ee5e6b4b0d3255bfef95601890afd80709",
                    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                )
                .replace("- azure-vhd", "- azure-light")
                + "  image:\n    publisher: pivotal\n    offer: bosh-ubuntu-jammy\n    sku: '1.506'\n    version: 1.506.0\n";
            write_tgz(
                Vec::new(),
                vec![file("stemcell.MF", mf.into_bytes()), file("image", Vec::new())],
                6,
            )?
        },
        "never needs a gallery",
    ));
    out.push(broken(
        "four-part-version.tgz",
        StemcellSpec {
            version_yaml: "'1.2.3.4'".into(),
            ..StemcellSpec::default()
        }
        .stemcell_bytes()?
        .0,
        "never dropped",
    ));
    out.push(broken(
        "manifest-not-yaml.tgz",
        assemble(image.clone(), |_, img| {
            vec![
                file("stemcell.MF", b"name: [unclosed\n".to_vec()),
                file("image", img),
            ]
        })?,
        "not a valid YAML",
    ));
    Ok(out)
}

/// Write every fixture into `dir`.
pub fn write_fixtures(dir: &Path) -> io::Result<Vec<&'static str>> {
    std::fs::create_dir_all(dir)?;
    let mut names = Vec::new();
    for f in fixtures()? {
        std::fs::write(dir.join(f.file), &f.bytes)?;
        names.push(f.file);
    }
    Ok(names)
}
