//! Adapters from the domain's traits to Azure (and the emulator, which speaks the same HTTP).

pub mod auth;
pub mod blob;
pub mod lock;
