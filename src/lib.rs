//! stemcell-gallery: manage BOSH stemcells in an Azure Compute Gallery.
//!
//! Domain in the middle (`stemcell`, `gallery`, `cleanup`, `cpi`), Azure at the edges (`azure`),
//! and a local Azure emulator (`emulator`) that never links to the domain.

pub mod azure;
pub mod cleanup;
pub mod cli;
pub mod config;
pub mod cpi;
pub mod devstore;
pub mod emulator;
pub mod error;
pub mod gallery;
pub mod publish;
pub mod redact;
pub mod stemcell;
