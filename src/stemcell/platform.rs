//! What a stemcell's image runs on: its CPU architecture and Hyper-V generation, spelled as
//! Azure spells them. The gallery's definitions are keyed by these.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Architecture {
    X64,
    Arm64,
}

impl Architecture {
    pub fn as_azure(&self) -> &'static str {
        match self {
            Self::X64 => "x64",
            Self::Arm64 => "Arm64",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HyperVGeneration {
    V1,
    V2,
}

impl HyperVGeneration {
    pub fn as_azure(&self) -> &'static str {
        match self {
            Self::V1 => "V1",
            Self::V2 => "V2",
        }
    }
}
