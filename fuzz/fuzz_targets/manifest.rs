//! stemcell.MF parser: any bytes must give a manifest or a ManifestError, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stemcell_gallery::stemcell::Manifest;

fuzz_target!(|data: &[u8]| {
    let Ok(m) = Manifest::parse(data) else {
        return;
    };
    // What inspect, seed and ensure do with a parsed manifest next.
    let _ = m.require_heavy();
    let _ = m.version_key();
    let _ = m.definition_name();
    let _ = m.create_env_definition_name("-create-env");
    let _ = m.architecture();
    let _ = m.cloud_properties.to_json();
    let _ = m.sha1.to_string();
});
