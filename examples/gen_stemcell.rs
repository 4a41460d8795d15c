//! Write a synthetic Azure heavy stemcell (any VHD size and data fraction), or the committed
//! fixture set.
//!
//!   cargo run --example gen_stemcell -- --out S.tgz --vhd-mib 2048 --data-fraction 0.25
//!   cargo run --example gen_stemcell -- --out S.tgz --vhd-mib 2048 --data-fraction 0.5 --corpus-dir /usr
//!   cargo run --example gen_stemcell -- --fixtures fixtures/stemcells

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, ValueEnum};
use stemcell_gallery::stemcell::testgen::{write_fixtures, Corpus, Order, StemcellSpec, VhdSpec};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OrderArg {
    ManifestFirst,
    ImageFirst,
}

/// Generate a synthetic stemcell: seeded pseudo-random data in a fraction of the VHD's blocks,
/// zeros elsewhere, a valid fixed-VHD footer, and a manifest whose sha1 matches.
#[derive(Debug, Parser)]
struct Args {
    /// Output stemcell tarball.
    #[arg(long, required_unless_present = "fixtures")]
    out: Option<PathBuf>,
    /// Write the whole committed fixture set (valid and broken) into this directory instead.
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    fixtures: Option<PathBuf>,
    /// Virtual size of root.vhd in MiB.
    #[arg(long, default_value_t = 16)]
    vhd_mib: u64,
    /// Fraction of data blocks holding pseudo-random data (0.0 to 1.0).
    #[arg(long, default_value_t = 0.25)]
    data_fraction: f64,
    /// Data block size in KiB.
    #[arg(long, default_value_t = 1024)]
    block_kib: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value = "bosh-azure-hyperv-ubuntu-jammy-go_agent")]
    name: String,
    /// Version as written in the YAML (quote it for a string, e.g. "'1.506'"; 1.10 stays a number).
    #[arg(long, default_value = "'1.506'")]
    version: String,
    /// Hyper-V generation 2 (adds the CPI's gen2 properties).
    #[arg(long)]
    gen2: bool,
    /// arm64 instead of x86_64.
    #[arg(long)]
    arm64: bool,
    #[arg(long, value_enum, default_value_t = OrderArg::ManifestFirst)]
    order: OrderArg,
    /// Prefix every entry with `./`.
    #[arg(long)]
    dot_prefix: bool,
    /// gzip level (0-9).
    #[arg(long, default_value_t = 6)]
    level: u32,
    /// Fill the data blocks with the bytes of the regular files under this directory (e.g. /usr,
    /// read in sorted order) instead of pseudo-random data: a stemcell that compresses like a
    /// real root file system.
    #[arg(long, value_name = "DIR")]
    corpus_dir: Option<PathBuf>,
    /// MiB read from --corpus-dir (cycled when the data blocks need more).
    #[arg(long, default_value_t = 256, requires = "corpus_dir")]
    corpus_mib: u64,
}

/// Up to `limit` bytes of the regular files under `dir`, depth first in name order; unreadable
/// entries are skipped.
fn read_corpus(dir: &std::path::Path, limit: usize, out: &mut Vec<u8>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for path in paths {
        if out.len() >= limit {
            return;
        }
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            read_corpus(&path, limit, out);
        } else if meta.is_file() {
            if let Ok(bytes) = std::fs::read(&path) {
                let n = bytes.len().min(limit - out.len());
                out.extend_from_slice(&bytes[..n]);
            }
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(dir) = &args.fixtures {
        return match write_fixtures(dir) {
            Ok(names) => {
                eprintln!("wrote {} fixtures into {}", names.len(), dir.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: cannot write fixtures into {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        };
    }
    if !(0.0..=1.0).contains(&args.data_fraction) || args.block_kib == 0 || args.level > 9 {
        eprintln!("error: --data-fraction must be 0..1, --block-kib > 0, --level 0..9");
        return ExitCode::from(2);
    }
    let Some(out) = args.out else {
        return ExitCode::from(2);
    };
    let corpus = match &args.corpus_dir {
        Some(dir) => {
            let mut bytes = Vec::new();
            read_corpus(dir, (args.corpus_mib * 1024 * 1024) as usize, &mut bytes);
            match Corpus::new(bytes) {
                Some(c) => {
                    eprintln!("corpus: {} bytes from {}", c.len(), dir.display());
                    Some(c)
                }
                None => {
                    eprintln!("error: no readable file data under {}", dir.display());
                    return ExitCode::from(2);
                }
            }
        }
        None => None,
    };
    let spec = StemcellSpec {
        name: args.name,
        version_yaml: args.version,
        gen2: args.gen2,
        arm64: args.arm64,
        order: match args.order {
            OrderArg::ManifestFirst => Order::ManifestFirst,
            OrderArg::ImageFirst => Order::ImageFirst,
        },
        dot_prefix: args.dot_prefix,
        vhd: VhdSpec {
            mib: args.vhd_mib,
            data_fraction: args.data_fraction,
            block: args.block_kib * 1024,
            seed: args.seed,
            corpus,
            ..VhdSpec::default()
        },
        level: args.level,
        ..StemcellSpec::default()
    };
    match spec.write_to(&out) {
        Ok(g) => {
            println!(
                "{}",
                serde_json::json!({
                    "path": out, "image_sha1": g.image_sha1, "image_sha256": g.image_sha256,
                    "image_size": g.image_size, "vhd_file_size": g.vhd_file_size,
                    "data_bytes": g.data_bytes, "zero_bytes": g.zero_bytes,
                })
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: cannot write {}: {e}", out.display());
            ExitCode::FAILURE
        }
    }
}
