//! The application floor, between the front ends (`cli`, `cpi`) and the domain (`stemcell`,
//! `gallery`, `cleanup`): the context built from resolved settings, and the use cases every
//! front end and the tests call alike. Nothing here knows a command line.

pub mod cleanup;
pub mod context;
pub mod delete;
pub mod ensure;
pub mod inspect;
pub mod migrate;
pub mod publish;
pub mod references;
pub mod replication;

pub use context::{Clock, Context};
