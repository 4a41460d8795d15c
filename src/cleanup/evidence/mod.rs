//! Evidence of use: every source that can show a gallery version is still needed.
//!
//! A source yields [`Claim`]s: "this target is in use, because ...". Targets are deliberately
//! coarse where the source is (a stemcell name and version, a CID, a whole definition's `latest`);
//! the planner protects every version a claim can match. Protecting too much is safe, deleting too
//! much is not.
//!
//! One file a source: `references` (the versions' own tags), `director` (`bosh stemcells --json`),
//! `create_env` (`bosh-state.json`), `consumers` (VMs, scale sets, disks); `strict` is the strict
//! JSON reader the two file sources share.

use std::path::PathBuf;

use super::CleanupError;
use crate::gallery::{Consumer, ConsumerKind};

mod consumers;
mod create_env;
mod director;
mod references;
mod strict;

pub use consumers::ConsumersSource;
pub use create_env::{CreateEnvStateFile, StemcellRecord};
pub use director::DirectorStemcellsFile;
pub use references::ReferencesSource;

/// What a claim protects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClaimTarget {
    /// One version, by its resource id (compared case-insensitively).
    VersionId(String),
    /// What a VM, scale set (model or instance) or disk protects through its image reference
    /// (any form), its region and its recorded exact version: the planner asks
    /// `gallery::latest::uses` for every definition the reference may name.
    ConsumerImage(Consumer),
    /// A stemcell by name and version (as BOSH spells it, e.g. `1.506`): protects that version key
    /// in every definition whose name starts with the stemcell name.
    StemcellNameVersion { name: String, version: String },
    /// A stemcell CID: protects every version whose references contain it.
    Cid(String),
}

/// Where a claim comes from, in typed form (the planner turns it into a typed reason).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Basis {
    /// References recorded on the version itself.
    Reference { refs: Vec<String> },
    /// A row of `bosh stemcells --json`.
    DirectorList {
        file: String,
        name: String,
        version: String,
        cid: String,
    },
    /// A stemcell record of a create-env `bosh-state.json`.
    CreateEnvState {
        file: String,
        name: String,
        version: String,
        cid: String,
    },
    /// A VM, scale set (model or instance) or disk created from a gallery image.
    Consumer {
        kind: ConsumerKind,
        id: String,
        image_id: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub target: ClaimTarget,
    pub basis: Basis,
    /// Why, for the operator.
    pub reason: String,
    /// The source's name.
    pub source: String,
}

/// Everything one source said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    pub source: String,
    pub claims: Vec<Claim>,
    /// Whose stemcells the source lists, when it says (`gallery::record::holder_label`): a
    /// create-env state's `director:<director_id>`, a director list given as `HOLDER=FILE`.
    /// `references prune` prunes a holder's references only against its own list.
    pub holder: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        cause: std::io::Error,
    },
    #[error("{} is not {what}: {message}", path.display())]
    Malformed {
        path: PathBuf,
        what: &'static str,
        message: String,
    },
    #[error(transparent)]
    Gallery(#[from] crate::gallery::Error),
}

/// One source of evidence of use.
#[async_trait::async_trait]
pub trait UsageSource: Send + Sync {
    /// A name an operator recognises (it appears in reasons and errors).
    fn name(&self) -> String;
    async fn collect(&self) -> Result<Evidence, SourceError>;
}

/// Read every source (all of them, even after one failed). Any failure → `EvidenceIncomplete`
/// naming the first failed source (and listing the others).
pub async fn collect_all(sources: &[Box<dyn UsageSource>]) -> Result<Vec<Evidence>, CleanupError> {
    let results = futures::future::join_all(sources.iter().map(|s| s.collect())).await;
    let mut out = Vec::with_capacity(results.len());
    let mut failed: Vec<(String, SourceError)> = Vec::new();
    for (source, result) in sources.iter().zip(results) {
        match result {
            Ok(ev) => out.push(ev),
            Err(e) => failed.push((source.name(), e)),
        }
    }
    let mut failed = failed.into_iter();
    match failed.next() {
        None => Ok(out),
        Some((source_name, cause)) => Err(CleanupError::EvidenceIncomplete {
            source_name,
            cause,
            also_failed: failed.map(|(n, _)| n).collect(),
        }),
    }
}

/// A held stemcell as reasons name it: `CID (name version)`, or `name version` without a CID.
fn held_stemcell(name: &str, version: &str, cid: &str) -> String {
    if cid.is_empty() {
        format!("{name} {version}")
    } else {
        format!("{cid} ({name} {version})")
    }
}

/// The claims of one stemcell a director or create-env holds: its name and version, and its CID
/// when it has one, both on the same basis and reason.
fn stemcell_claims(
    source: &str,
    name: String,
    version: String,
    cid: String,
    basis: Basis,
    reason: String,
) -> Vec<Claim> {
    let mut claims = vec![Claim {
        target: ClaimTarget::StemcellNameVersion { name, version },
        basis: basis.clone(),
        reason: reason.clone(),
        source: source.to_string(),
    }];
    if !cid.is_empty() {
        claims.push(Claim {
            target: ClaimTarget::Cid(cid),
            basis,
            reason,
            source: source.to_string(),
        });
    }
    claims
}
