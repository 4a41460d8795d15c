//! The built `stemcell-gallery` binary, launched from a test with nothing of the caller's
//! environment reaching it (every test runs in one process, and the developer's shell may hold
//! real Azure settings), and the global flags that point it at an emulator.

use std::process::Command;

/// Prefixes of the variables the binary, its credentials or the CPI protocol read: none of the
/// caller's may reach a test's run. A test sets what it means with `Command::env`.
const SCRUBBED_PREFIXES: [&str; 6] = [
    "STEMCELL_GALLERY_",
    "AZURE_",
    "BOSH_",
    "SSL_CERT_",
    "IDENTITY_",
    "MSI_",
];

/// `stemcell-gallery` with no arguments and the caller's settings removed from its environment.
pub fn command() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stemcell-gallery"));
    for (name, _) in std::env::vars_os() {
        let scrubbed = name
            .to_str()
            .is_some_and(|n| SCRUBBED_PREFIXES.iter().any(|p| n.starts_with(p)));
        if scrubbed {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// The global flags for the emulator at `arm`/`blob`, `gallery` in the suite's subscription,
/// resource group and location, the emulator's credentials, JSON output.
pub fn global_args(arm: &str, blob: &str, gallery: &str) -> Vec<String> {
    [
        "--arm-endpoint",
        arm,
        "--blob-endpoint",
        blob,
        "--auth",
        "emulator",
        "--subscription",
        super::SUB,
        "--resource-group",
        super::RG,
        "--gallery",
        gallery,
        "--location",
        super::LOC,
        "--output",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}
