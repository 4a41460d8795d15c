//! The cloud's endpoints live with the settings (`config::cloud`); re-exported here for the
//! adapters.

pub use crate::config::cloud::*;
