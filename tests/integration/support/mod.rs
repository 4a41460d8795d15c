//! The one support module of the integration binary.
//!
//! - [`emulated`]: an emulator started on port 0 (role, timing), the SDK clients and a raw HTTP
//!   client pointed at it, ARM bodies and admin calls;
//! - [`binary`]: the built `stemcell-gallery` binary with the caller's environment scrubbed, and
//!   the global flags that point it at an emulator;
//! - [`stemcells`]: generated stemcell specs and VHD readers;
//! - [`seeding`]: the `seed` world (an emulator with a gallery, blobs optionally on Azurite);
//! - [`reliability`]: the faults/crash/concurrency world and its "converged" check;
//! - [`azure_cpi`]: the unmodified Azure CPI's gallery calls;
//! - [`azurite`], [`tls_front`], [`token_server`]: Azurite, a private-CA TLS front and an
//!   Entra/IMDS token server for one test each.

pub mod azure_cpi;
pub mod azurite;
pub mod binary;
pub mod blobsdk;
pub mod emulated;
pub mod reliability;
pub mod seeding;
pub mod stemcells;
pub mod tls_front;
pub mod token_server;

/// The subscription, resource group and location every test's resources live in.
pub const SUB: &str = "11111111-2222-3333-4444-555555555555";
pub const RG: &str = "bosh-rg";
pub const LOC: &str = "westeurope";
/// The image definition a director makes for the Ubuntu Jammy stemcell (gen1, x64).
pub const DEFINITION: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
