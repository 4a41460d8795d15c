//! Adapters from the domain's traits to Azure (and the emulator, which speaks the same HTTP).

pub mod arm;
pub mod auth;
pub mod bearer;
pub mod blob;
pub mod cloud;
pub mod credential;
pub mod gallery_locks;
pub mod imds;
pub mod lock;
pub mod permissions;
pub mod stemcell_store;
pub mod tls;
