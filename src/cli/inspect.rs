//! `inspect STEMCELL.tgz`: read and verify a stemcell without uploading anything.

use std::io::BufReader;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;
use serde_json::json;

use super::{GlobalArgs, Report};
use crate::stemcell::archive::{read_stemcell, NullSink, Summary};

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The stemcell tarball (e.g. bosh-stemcell-1.506-azure-hyperv-ubuntu-jammy-go_agent.tgz).
    #[arg(value_name = "STEMCELL.tgz")]
    pub stemcell: PathBuf,
}

const MIB: f64 = 1024.0 * 1024.0;

pub fn run(global: &GlobalArgs, args: InspectArgs) -> anyhow::Result<Report> {
    // Inspect needs no Azure settings; when they resolve, the create-env definition it names uses
    // the configured suffix, as ensure, seed, lookup, delete and the CPI do.
    let settings = crate::config::Settings::resolve(global).ok();
    let suffix = crate::config::create_env_suffix_or_default(
        settings
            .as_ref()
            .and_then(|s| s.create_env_suffix.as_deref()),
    )
    .to_string();
    let path = &args.stemcell;
    let file = crate::stemcell::open_input("the stemcell", path)?;
    let file_size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let started = Instant::now();
    let summary = read_stemcell(BufReader::with_capacity(1 << 20, file), &mut NullSink)
        .with_context(|| format!("stemcell {} is not usable", path.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    let key = summary
        .manifest
        .version_key()
        .with_context(|| format!("stemcell {} has no gallery version key", path.display()))?;
    Ok(render(
        &summary,
        &key.to_string(),
        &suffix,
        file_size,
        seconds,
    ))
}

fn render(s: &Summary, key: &str, suffix: &str, file_size: u64, seconds: f64) -> Report {
    let m = &s.manifest;
    let director = m.definition_name();
    let create_env = m.create_env_definition_name(suffix);
    let mib_per_s = if seconds > 0.0 {
        s.vhd_bytes as f64 / MIB / seconds
    } else {
        0.0
    };
    let sha_check = format!(
        "stemcell.MF's {} verified against the image",
        m.sha1.algorithm()
    );
    let json = json!({
        "name": m.name,
        "version": m.version,
        "version_key": key,
        "operating_system": m.operating_system,
        "api_version": m.api_version,
        "formats": m.stemcell_formats,
        "director_definition": director,
        "create_env_definition": create_env,
        "architecture": m.architecture().as_azure(),
        "generation": m.generation().as_azure(),
        "sha1": s.sha1,
        "manifest_checksum": m.sha1.to_string(),
        "checksum_verified": true,
        "image_sha256": s.image_sha256,
        "image_size": s.image_size,
        "stemcell_size": file_size,
        "vhd_virtual_size": s.vhd.virtual_size,
        "vhd_file_size": s.vhd.file_size,
        "data_bytes": s.data_bytes,
        "zero_bytes": s.zero_bytes,
        "seconds": seconds,
        "mib_per_s": mib_per_s,
        "cloud_properties": m.cloud_properties.to_json(),
    });
    let pct = if s.vhd_bytes > 0 {
        100.0 * s.data_bytes as f64 / s.vhd_bytes as f64
    } else {
        0.0
    };
    let human = format!(
        "Stemcell            {name} {version} ({os})\n\
         Formats             {formats}\n\
         Gallery version     {key}\n\
         Definition          {director} (director), {create_env} (create-env)\n\
         Architecture        {arch}, Hyper-V {gen}\n\
         Checksum            {sha_check}\n\
         SHA-1 of image      {sha1}\n\
         SHA-256 of image    {sha256}\n\
         Image               {image} compressed\n\
         VHD                 fixed, {virt_mib:.0} MiB virtual\n\
         Data / zeros        {data} data ({pct:.1}%), {zeros} zeros\n\
         Read in             {seconds:.2} s ({mib_per_s:.0} MiB/s of VHD)\n",
        name = m.name,
        version = m.version,
        os = m.operating_system.as_deref().unwrap_or("unknown OS"),
        formats = m.stemcell_formats.join(", "),
        arch = m.architecture().as_azure(),
        gen = m.generation().as_azure(),
        sha1 = s.sha1,
        sha256 = s.image_sha256,
        image = size(s.image_size),
        virt_mib = s.vhd.virtual_size as f64 / MIB,
        data = size(s.data_bytes),
        zeros = size(s.zero_bytes),
    );
    Report::new(json, human)
}

/// Bytes for people: KiB below 1 MiB, MiB above.
fn size(bytes: u64) -> String {
    if (bytes as f64) < MIB {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB)
    }
}
