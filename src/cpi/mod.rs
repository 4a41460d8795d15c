//! The BOSH CPI front: `create_stemcell`, `delete_stemcell` and `info`, delegating every other
//! method to the real Azure CPI.

pub mod create;
pub mod delegate;
pub mod handler;
pub mod mode;
pub mod protocol;
