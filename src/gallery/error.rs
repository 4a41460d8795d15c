//! Errors of the gallery domain and its Azure adapter.

use crate::error::{Exit, HasExit};

/// An error Azure returned, with the parts an operator needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AzureError {
    pub status: u16,
    pub code: String,
    pub message: String,
    pub target: Option<String>,
    /// Seconds Azure asked to wait before trying again (`Retry-After`), when it said.
    pub retry_after_secs: Option<u16>,
}

impl std::fmt::Display for AzureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HTTP {} {}", self.status, self.code)?;
        if let Some(t) = &self.target {
            write!(f, " (target {t})")?;
        }
        if !self.message.is_empty() {
            write!(f, ": {}", self.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for AzureError {}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Azure answered with an error for a request on `resource`.
    #[error("Azure refused {operation} of {resource}: {azure}")]
    Azure {
        operation: &'static str,
        resource: String,
        azure: AzureError,
    },
    /// The request never got an answer (connection, timeout) after retries.
    #[error("could not reach Azure for {operation} of {resource}: {message}")]
    Transport {
        operation: &'static str,
        resource: String,
        message: String,
    },
    /// A long-running operation did not finish in time.
    #[error("{operation} of {resource} did not finish within {seconds} s (last state {state}); it may still complete in Azure: re-run the command to pick it up, or raise the timeout (STEMCELL_GALLERY_OPERATION_TIMEOUT, seconds)")]
    Timeout {
        operation: &'static str,
        resource: String,
        seconds: u64,
        state: String,
    },
    /// A long-running operation ended Failed or Canceled.
    #[error("{operation} of {resource} ended {state}: {message}")]
    OperationFailed {
        operation: &'static str,
        resource: String,
        state: String,
        message: String,
    },
    /// The same version key already holds different content.
    #[error("{0}")]
    Conflict(String),
    /// The thing asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// Input or state that makes the request impossible (e.g. an immutable definition mismatch).
    #[error("{0}")]
    Invalid(String),
    /// The cross-host lock could not be taken or kept: timed out, lost, or its storage refused.
    /// `transient` is the lock layer's verdict (a timeout or a throttled storage request may
    /// succeed on a retry; a 403 on the lock container will not).
    #[error("{message}")]
    Lock { message: String, transient: bool },
    /// The identity may not read every VM, scale set and disk of a scope, so a consumer list of
    /// that scope may silently leave out what uses a version (ARM filters lists by RBAC).
    #[error(
        "cannot prove which VMs, scale sets and disks use gallery images in {scope}: {why}. ARM \
         leaves out of a list whatever the identity may not read, so a short list is not evidence \
         of non-use. Assign a role granting {needed} at {scope} (deploy/azure/README.md, \
         \"Consumer scopes\"), or stop listing that subscription as a consumer subscription"
    )]
    PartialView {
        scope: String,
        why: String,
        needed: String,
    },
}

impl Error {
    /// Transient failures worth retrying by a caller (CPI `ok_to_retry`).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Azure { azure, .. } => {
                azure.status == 429 || azure.status >= 500 || azure.status == 408
            }
            Error::Transport { message, .. } => !crate::azure::tls::is_certificate_failure(message),
            Error::Timeout { .. } => true,
            Error::Lock { transient, .. } => *transient,
            Error::PartialView { .. } => false,
            Error::OperationFailed { .. } => false,
            Error::Conflict(_) => false,
            Error::NotFound(_) => false,
            Error::Invalid(_) => false,
        }
    }
}

impl HasExit for Error {
    fn exit(&self) -> Exit {
        match self {
            Error::Conflict(_) => Exit::Conflict,
            Error::NotFound(_) => Exit::NotFound,
            Error::Azure { .. }
            | Error::Transport { .. }
            | Error::Timeout { .. }
            | Error::OperationFailed { .. }
            | Error::Invalid(_)
            | Error::PartialView { .. }
            | Error::Lock { .. } => Exit::Error,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    /// Timeouts name only what the operator can do: there is no setting to raise these waits.
    #[test]
    fn timeout_messages_name_only_knobs_that_exist() {
        let op = Error::Timeout {
            operation: "create",
            resource: "v".into(),
            seconds: 3600,
            state: "Creating".into(),
        }
        .to_string();
        // The operation wait is tunable: the message names the variable that tunes it.
        assert!(op.contains("STEMCELL_GALLERY_OPERATION_TIMEOUT"), "{op}");
        assert!(op.contains("re-run"), "{op}");
        let lock = crate::azure::lock::LockError::Timeout {
            blob: "locks/g/d/1.0.0.lock".into(),
            waited: std::time::Duration::from_secs(600),
            lease: std::time::Duration::from_secs(30),
        }
        .to_string();
        assert!(!lock.contains("raise"), "{lock}");
        assert!(lock.contains("re-run"), "{lock}");
    }
}
