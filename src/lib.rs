//! stemcell-gallery: manage BOSH stemcells in an Azure Compute Gallery.
//!
//! Front ends on top (`cli`, and the CPI protocol in `cpi`), the application floor under them
//! (`app`: the context and the use cases), the domain in the middle (`stemcell`, `gallery`,
//! `cleanup`), Azure at the edges (`azure`), pure rules and settings on the ground (`names`,
//! `config`, `devstore`), and a local Azure emulator (`emulator`) that links nothing of the tool but
//! the development constants. docs/architecture.md "Architecture" has one line per module.

pub mod access;
pub mod app;
pub mod azure;
pub mod backoff;
pub mod cleanup;
pub mod cli;
pub mod config;
pub mod cpi;
pub mod devstore;
pub mod emulator;
pub mod error;
pub mod gallery;
pub mod names;
pub mod progress;
pub mod redact;
pub mod safeguards;
pub mod stemcell;
pub mod wiring;
