//! Safe cleanup of orphaned gallery image versions (DESIGN.md §4 "Cleanup").
//!
//! Observe → decide → act → observe:
//! - [`inventory`] lists the gallery's definitions and versions;
//! - [`evidence`] collects claims of use from every [`evidence::UsageSource`]; if any source
//!   cannot be read, cleanup stops with [`CleanupError::EvidenceIncomplete`] (exit 5);
//! - [`planner::plan`] is a pure function from inventory + evidence + [`policy::Policy`] to a
//!   [`planner::Plan`]: every version with its verdict and every reason that applies;
//! - [`executor`] re-scans consumers, re-reads each version right before deleting it, and deletes
//!   with bounded concurrency.

pub mod evidence;
pub mod executor;
pub mod inventory;
pub mod planner;
pub mod policy;
pub mod references;
pub mod saved;

use std::path::PathBuf;

use crate::error::{Class, Classified};

pub use evidence::{collect_all, Claim, ClaimTarget, Evidence, UsageSource};
pub use executor::{ApplyOutcome, BlobCleaner, DeleteOutcome, Executor};
pub use inventory::Inventory;
pub use planner::{plan, Plan, PlanEntry, Reason, Verdict};
pub use policy::Policy;

/// Why an evidence source (or the reference records the inventory reads) could not be read: the
/// cleanup floor's own error, beside [`CleanupError`] which carries it, so the sources
/// (`evidence`) and the inventory both use it without importing each other.
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

#[derive(Debug, thiserror::Error)]
pub enum CleanupError {
    /// An evidence source could not be read: nothing may be deleted.
    #[error(
        "cleanup refused, nothing was deleted: evidence source `{source_name}` could not be read{}, \
         and an unreadable source is not evidence of non-use; fix access to it (or correct the file \
         given on the command line) and re-run",
        also_failed_text(.also_failed)
    )]
    EvidenceIncomplete {
        source_name: String,
        #[source]
        cause: SourceError,
        /// Other sources that failed in the same run.
        also_failed: Vec<String>,
    },
    /// The gallery's definitions and versions could not be listed.
    #[error("cannot list the image definitions and versions of {gallery}")]
    Inventory {
        gallery: String,
        #[source]
        cause: crate::gallery::Error,
    },
}

fn also_failed_text(others: &[String]) -> String {
    if others.is_empty() {
        String::new()
    } else {
        format!(" (also unreadable: {})", others.join(", "))
    }
}

impl Classified for CleanupError {
    fn class(&self) -> Class {
        match self {
            CleanupError::EvidenceIncomplete { .. } => Class::EvidenceIncomplete,
            // An inventory read that failed transiently (throttled, timed out) may pass next
            // time; one that failed for good fails the same way.
            CleanupError::Inventory { cause, .. } => cause.class(),
        }
    }
}

/// An unreadable evidence source is the same on a retry until its file or access is fixed (under
/// [`CleanupError::EvidenceIncomplete`] it refuses the cleanup, exit 5). `Gallery` is
/// transparent: the gallery error it carries is not a cause of its own in a chain.
impl Classified for SourceError {
    fn class(&self) -> Class {
        match self {
            SourceError::Read { .. } | SourceError::Malformed { .. } | SourceError::Gallery(_) => {
                Class::Permanent
            }
        }
    }
}
