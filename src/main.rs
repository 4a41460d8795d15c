//! The `stemcell-gallery` binary: parse, run, map the outcome to an exit code. Nothing else.

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = stemcell_gallery::cli::parse();
    ExitCode::from(stemcell_gallery::cli::main(cli))
}
