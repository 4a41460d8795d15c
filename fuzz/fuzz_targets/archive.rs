//! The stemcell archive reader `inspect` uses (`read_stemcell` with a discarding sink): any bytes
//! as a .tgz give a summary or an ArchiveError, never a panic, a hang or unbounded memory.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stemcell_gallery::stemcell::{read_stemcell, NullSink};

fuzz_target!(|data: &[u8]| {
    let mut sink = NullSink;
    if let Ok(summary) = read_stemcell(data, &mut sink) {
        assert_eq!(
            summary.vhd_bytes,
            summary.data_bytes + summary.zero_bytes,
            "data + zeros must cover root.vhd"
        );
        assert_eq!(summary.vhd.file_size, summary.vhd_bytes);
    }
});
