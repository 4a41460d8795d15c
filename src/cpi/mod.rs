//! The BOSH CPI front: `create_stemcell`, `delete_stemcell` and `info`, delegating every other
//! method to the real Azure CPI.

pub mod delegate;
pub mod mode;
pub mod protocol;
