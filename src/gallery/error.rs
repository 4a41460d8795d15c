//! Errors of the gallery domain and its Azure adapter.

use crate::error::{class_of_status, Class, Classified, Service};

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

impl AzureError {
    /// Azure refused a DELETE because the version blocks its deletion before its end of life,
    /// whether it said so at the DELETE or in the operation.
    pub fn blocks_deletion(&self) -> bool {
        self.code.eq_ignore_ascii_case(DELETION_BLOCKED)
    }
}

/// Azure's error code for a DELETE of a version whose deletion is blocked before its end of life
/// (TSDOC, REFERENCE.md "Today's Azure").
pub const DELETION_BLOCKED: &str = "DeleteGalleryImageVersionBlockedBeforeEndOfLife";

/// Azure's error code for a request refused by a management lock (REFERENCE.md "Management
/// locks": 409 "The scope '…' cannot perform delete operation because following scope(s) are
/// locked: '…'").
pub const SCOPE_LOCKED: &str = "ScopeLocked";

/// What to do about a Failed version in a gallery with soft delete on, which Azure cannot delete
/// (SDDOC's workaround; soft delete is set in the portal or by the REST API only).
pub const FAILED_IN_SOFT_DELETE_REMEDY: &str = "turn soft delete off on the gallery (the portal, or properties.softDeletePolicy.isSoftDeleteEnabled: false by the REST API), re-run, then turn it on again";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Azure answered with an error for a request on `resource` (neither a 409 nor a 400, which
    /// are [`Error::Busy`] and [`Error::Rejected`]; build it with [`Error::azure`]).
    #[error("Azure refused {operation} of {resource}: {azure}")]
    Azure {
        operation: &'static str,
        resource: String,
        azure: Box<AzureError>,
    },
    /// Azure answered 409 Conflict: another operation on the resource is in flight (or the write
    /// conflicts with what is there now). The caller observes again before deciding.
    #[error("Azure refused {operation} of {resource}: {azure}")]
    Busy {
        operation: &'static str,
        resource: String,
        azure: Box<AzureError>,
    },
    /// Azure answered 400 Bad Request: it refused the request as sent and did nothing.
    #[error("Azure refused {operation} of {resource}: {azure}")]
    Rejected {
        operation: &'static str,
        resource: String,
        azure: Box<AzureError>,
    },
    /// Azure refused to delete a version that blocks its deletion until its end of life
    /// (`safetyProfile.blockDeletionBeforeEndOfLife`; REFERENCE.md "Today's Azure"). Callers that
    /// delete (cleanup, `delete`, the CPI) keep the version and say until when; this tool never
    /// lifts another tool's block.
    #[error("Azure refused delete of {resource}: its deletion is blocked until its end of life ({azure}); it can be deleted once the end of life has passed, or after whoever set the block lifts it (safetyProfile.blockDeletionBeforeEndOfLife=false)")]
    DeletionBlocked {
        resource: String,
        azure: Box<AzureError>,
    },
    /// Azure refused a DELETE (or a write) because a management lock applies to the resource or
    /// a scope above it (409 `ScopeLocked`; REFERENCE.md "Management locks"). Deleting callers
    /// keep the version with reason `locked`; this tool never lifts a lock it does not own.
    #[error("Azure refused {operation} of {resource}: a management lock applies ({azure}); it is kept. Whoever placed the lock removes it (az lock list --resource <id>) if the version should go")]
    ScopeLocked {
        operation: &'static str,
        resource: String,
        azure: Box<AzureError>,
    },
    /// No token for the request: the credential was refused, or the identity provider (Entra
    /// ID, IMDS, `az`) did not answer. Not Azure's gallery, and not the network path to ARM.
    #[error("no token for {operation} of {resource}: {message}. The credential, or the way to its identity provider, is the problem (not the gallery): check the auth settings (`doctor` tests them), or that this host reaches the identity provider (HTTPS_PROXY/NO_PROXY, firewall, DNS)")]
    NoToken {
        operation: &'static str,
        resource: String,
        message: String,
        /// The identity provider's certificate was refused, known only by the words of the
        /// tool that reported it (`az`): the same on every attempt. Decided once, where the text
        /// arrives ([`crate::error::is_certificate_failure`]); our own requests carry the typed
        /// cause ([`Error::Untrusted`]).
        certificate_refused: bool,
    },
    /// The request never got an answer (connection, timeout) after retries.
    #[error("could not reach Azure for {operation} of {resource}: {message}")]
    Transport {
        operation: &'static str,
        resource: String,
        message: String,
    },
    /// The endpoint's TLS certificate was not accepted (for the request itself or for its
    /// token): the same on every attempt, so it is never retried.
    #[error("could not reach Azure for {operation} of {resource}{}", if *.for_token { " (getting a token for it)" } else { "" })]
    Untrusted {
        operation: &'static str,
        resource: String,
        /// The certificate was the token endpoint's (Entra ID, IMDS), not ARM's.
        for_token: bool,
        #[source]
        cause: crate::error::UntrustedCertificate,
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
    /// A request body could not be built from the domain's values (the SDK model refused it).
    #[error("cannot build the {what} request: {message}")]
    RequestBuild { what: String, message: String },
    /// The gallery reports no region and none is configured, so nothing can be created.
    #[error("gallery {gallery} reports no location, and none is configured: pass --location REGION (or set location in the config file)")]
    GalleryWithoutLocation { gallery: String },
    /// An existing image definition's immutable properties do not fit the stemcell.
    #[error("image definition {id} exists with {problems}; definitions cannot be changed. Use another definition name (stemcell cloud_properties.name) or remove that definition once it holds no versions")]
    DefinitionMismatch { id: String, problems: String },
    /// The reference asked to be recorded cannot be stored.
    #[error("{0}")]
    BadReference(super::tags::TagError),
    /// The tags of a new version cannot hold its references.
    #[error("{0}")]
    NewVersionTags(super::tags::TagError),
    /// The tags of an existing version (`resource`) cannot hold its references.
    #[error("{resource}: {source_error}")]
    VersionTags {
        resource: String,
        source_error: super::tags::TagError,
    },
    /// Creates kept being refused (409) while a GET said the version is absent: the backoff for
    /// a just-deleted version of the same name ran out.
    #[error("Azure refused to create gallery version {definition}/{key} {refusals} times although it does not exist ({azure}); a version of that name was probably deleted moments ago and Azure has not finished with it. Wait a minute and re-run the command.")]
    CreateRefused {
        definition: String,
        key: String,
        refusals: u32,
        azure: Box<AzureError>,
    },
    /// Azure refused a version create synchronously (400): nothing was made. `source` is the
    /// source blob URI, already redacted.
    #[error("Azure refused to create gallery version {definition}/{key} from {source_uri} ({azure}); nothing was created in the gallery and no reference was recorded. Check that the source is a fixed VHD in a page blob and that its storage account id names the account holding it, then run again")]
    CreateRejected {
        definition: String,
        key: String,
        source_uri: String,
        azure: Box<AzureError>,
    },
    /// A Failed (or Canceled) version of the same content is not replaced: something uses it.
    #[error("{id} is {state} but still used by {}; it is not replaced. Repair it in Azure (az sig image-version update), or delete it once nothing uses it, then re-run", .users.join(", "))]
    FailedVersionInUse {
        id: String,
        state: String,
        users: Vec<String>,
    },
    /// A Failed (or Canceled) version in a gallery with soft delete on: Azure refuses to delete
    /// it (SDDOC, REFERENCE.md "Today's Azure"), so it is not replaced, and nothing is sent.
    #[error("{id} is {state} and gallery {gallery} has soft delete on, where Azure cannot delete a Failed version; it is not replaced: {FAILED_IN_SOFT_DELETE_REMEDY}")]
    FailedVersionSoftDeleteGallery {
        id: String,
        state: String,
        gallery: String,
    },
    /// The version's name is soft-deleted (it stays taken until the version is gone for good)
    /// and the content this tool recorded for it is not this stemcell's, or none was recorded:
    /// nothing is uploaded, restored or created.
    #[error("{0}")]
    SoftDeletedConflict(Box<SoftDeletedName>),
    /// A Failed (or Canceled) version is not replaced: non-use cannot be proven (`why`).
    #[error("{id} is {state} but it is not replaced: {why}")]
    FailedVersionUnproven {
        id: String,
        state: String,
        why: String,
    },
    /// `ensure` observed the version change in every round it had.
    #[error("gallery version {definition}/{key} kept changing while it was being ensured ({rounds} rounds); another tool may be writing to it. Re-run the command.")]
    EnsureUnsettled {
        definition: String,
        key: String,
        rounds: usize,
    },
    /// A guarded delete found the version changed on every attempt.
    #[error("gallery version {definition}/{key} kept changing while it was being deleted; re-run the command")]
    DeleteUnsettled { definition: String, key: String },
    /// A reference write was not confirmed by any of its attempts.
    #[error("the references of gallery version {definition}/{key} kept changing while they were being written ({attempts} attempts); another tool may be writing to them. Re-run the command.")]
    ReferencesUnsettled {
        definition: String,
        key: String,
        attempts: u32,
    },
    /// A version holds a CID only in its overflow tags and has no sentinel the delegate CPI can
    /// resolve, even after a rewrite.
    #[error("gallery version {id} holds stemcell {cid} only in its overflow tags and has no sentinel {sentinel} in stemcell_references after a rewrite; another tool may be rewriting its tags. Retry")]
    NoSentinel {
        id: String,
        cid: String,
        sentinel: String,
    },
    /// The content to compare with an existing version (`--blob-uri`'s blob) does not exist.
    #[error("{subject} does not exist")]
    ContentGone { subject: String },
    /// The content to compare with an existing version cannot be read.
    #[error("cannot read {subject} to compare it with an existing version: {reason}")]
    ContentUnreadable { subject: String, reason: String },
    /// The version was to be reused or compared (nothing was uploaded: the request has no
    /// source), and by the next observation it was gone or Failed: a re-run uploads and creates.
    #[error("gallery version {definition}/{key} went away (or failed) while this stemcell was compared with it, and nothing was uploaded to create it from; re-run to upload the image and create the version")]
    NothingToCreateFrom { definition: String, key: String },
    /// A write needs the cross-host locks, and no storage account (which holds them) is set.
    #[error("writing to the gallery needs the storage account that holds its cross-host locks: pass --blob-endpoint https://ACCOUNT.blob.core.windows.net (or set storage_account in the config file)")]
    NoLockStore,
    /// The cross-host lock could not be taken or kept: timed out, lost, or its storage refused.
    /// The lock error says itself whether a retry may succeed (a 403 on the lock container will
    /// not).
    #[error("{0}")]
    Lock(LockError),
    /// The version's reference record (`gallery::record`) is unusable, kept changing, or its
    /// store failed.
    #[error("{0}")]
    Record(RecordError),
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

/// A soft-deleted version holding the name a create wants, with content other than the
/// create's (or unknown): what [`Error::SoftDeletedConflict`] says.
#[derive(Debug)]
pub struct SoftDeletedName {
    pub id: String,
    /// "it was created with image_sha256 …" or "this tool recorded no content for it".
    pub content: String,
    pub want: String,
    pub until: String,
    pub name: String,
    pub version: String,
    /// The selector flags beyond name and version: " --generation gen2", " --architecture
    /// arm64", " --create-env", or "".
    pub flags: String,
}

impl std::fmt::Display for SoftDeletedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let SoftDeletedName {
            id,
            content,
            want,
            until,
            name,
            version,
            flags,
        } = self;
        write!(
            f,
            "gallery version {id} is soft-deleted (restorable until {until}) and its name stays taken until then; {content}, this stemcell's is {want}. Nothing was uploaded, restored or created. Remedy: if the soft-deleted version is the one you want, restore it with `stemcell-gallery restore --name {name} --version {version}{flags}` and re-run; otherwise purge it (DELETE of the version with bypassSoftDelete=true, api-version 2026-03-03, e.g. `az rest --method delete --url '{id}?api-version=2026-03-03&bypassSoftDelete=true'`) or wait until {until}, then re-run"
        )
    }
}

impl From<LockError> for Error {
    fn from(e: LockError) -> Self {
        Error::Lock(e)
    }
}

impl Error {
    /// An error answer from Azure (or an adapter standing in for it) for `operation` on
    /// `resource`: 409 is [`Error::Busy`], 400 [`Error::Rejected`], anything else
    /// [`Error::Azure`]. Every adapter builds its HTTP errors here, so the domain matches
    /// variants, never status codes.
    pub fn azure(operation: &'static str, resource: impl Into<String>, azure: AzureError) -> Self {
        let resource = resource.into();
        let azure = Box::new(azure);
        if azure.blocks_deletion() {
            return Error::DeletionBlocked { resource, azure };
        }
        if azure.code.eq_ignore_ascii_case(SCOPE_LOCKED) {
            return Error::ScopeLocked {
                operation,
                resource,
                azure,
            };
        }
        match azure.status {
            409 => Error::Busy {
                operation,
                resource,
                azure,
            },
            400 => Error::Rejected {
                operation,
                resource,
                azure,
            },
            _ => Error::Azure {
                operation,
                resource,
                azure,
            },
        }
    }

    /// No token for `operation` on `resource`: `message` is the credential's whole report, in
    /// words (`az` reports its own failures only so). Whether it is a refused certificate is
    /// decided here, once, where the words arrive, and the remedy is added to the message.
    pub fn no_token(operation: &'static str, resource: impl Into<String>, message: String) -> Self {
        Error::NoToken {
            operation,
            resource: resource.into(),
            certificate_refused: crate::error::is_certificate_failure(&message),
            message: crate::error::explain(message),
        }
    }

    /// Azure's answer, for the variants that carry one.
    pub fn azure_answer(&self) -> Option<&AzureError> {
        match self {
            Error::Azure { azure, .. }
            | Error::DeletionBlocked { azure, .. }
            | Error::ScopeLocked { azure, .. }
            | Error::Busy { azure, .. }
            | Error::Rejected { azure, .. } => Some(azure),
            _ => None,
        }
    }

    /// Whether Azure said the resource does not exist (404): adapters turn it into `None`.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Azure { azure, .. } if azure.status == 404)
    }

    /// Whether a write that failed may be tried again after observing again (the guarded
    /// deletes and reference writes): transient, or another operation in flight.
    pub fn worth_observing_again(&self) -> bool {
        self.class().observe_again()
    }

    /// Whether the cause is a refused TLS certificate (typed, or reported by `az` in words).
    pub fn refuses_a_certificate(&self) -> bool {
        matches!(
            self,
            Error::Untrusted { .. }
                | Error::NoToken {
                    certificate_refused: true,
                    ..
                }
        )
    }

    /// How long Azure asked to wait before trying again (`Retry-After`), when it said.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.azure_answer()
            .and_then(|a| a.retry_after_secs)
            .map(|s| std::time::Duration::from_secs(u64::from(s)))
    }
}

/// The one classification of the gallery's errors, exhaustive on purpose: a new variant must
/// decide. Azure's answers by the status table ([`class_of_status`]), 409 by its variant
/// ([`Class::Busy`]); conflicts (exit 4) and absences (exit 3) by variant; a lock's or record's
/// failure is the store's to classify, deferred to a re-run ([`Class::deferred`]).
impl Classified for Error {
    fn class(&self) -> Class {
        match self {
            Error::Azure { azure, .. } => class_of_status(Service::Arm, azure.status),
            Error::Busy { .. } => Class::Busy,
            Error::Conflict(_) | Error::DeletionBlocked { .. } | Error::SoftDeletedConflict(_) => {
                Class::Conflict
            }
            // Refused until someone removes the lock: the same on every attempt, and not a
            // content conflict.
            Error::ScopeLocked { .. } => Class::Permanent,
            Error::NotFound(_) => Class::NotFound,
            // No answer at all: another attempt may get one. A token that did not come may come
            // on a retry (an identity provider that was slow); a refused certificate will not.
            Error::Transport { .. } => Class::Transient,
            Error::NoToken {
                certificate_refused,
                ..
            } => {
                if *certificate_refused {
                    Class::Permanent
                } else {
                    Class::Transient
                }
            }
            // A certificate the client does not trust fails the same way every time.
            Error::Untrusted { .. } => Class::Permanent,
            // It may still finish in Azure; a re-run picks it up.
            Error::Timeout { .. } => Class::Later,
            // A re-run observes the absence first and uploads.
            Error::NothingToCreateFrom { .. } => Class::Later,
            Error::Lock(e) => e.class().deferred(),
            Error::Record(e) => e.class().deferred(),
            Error::Rejected { .. }
            | Error::OperationFailed { .. }
            | Error::RequestBuild { .. }
            | Error::GalleryWithoutLocation { .. }
            | Error::DefinitionMismatch { .. }
            | Error::BadReference(_)
            | Error::NewVersionTags(_)
            | Error::VersionTags { .. }
            | Error::CreateRefused { .. }
            | Error::CreateRejected { .. }
            | Error::FailedVersionInUse { .. }
            | Error::FailedVersionUnproven { .. }
            | Error::FailedVersionSoftDeleteGallery { .. }
            | Error::EnsureUnsettled { .. }
            | Error::DeleteUnsettled { .. }
            | Error::ReferencesUnsettled { .. }
            | Error::NoSentinel { .. }
            | Error::ContentGone { .. }
            | Error::ContentUnreadable { .. }
            | Error::NoLockStore
            | Error::PartialView { .. } => Class::Permanent,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A lock store's own failure (for the blob lease: `azure::lock::LockError`), kept whole: its
/// class says itself whether a retry may succeed.
pub trait LockStoreError: std::error::Error + Classified + Send + Sync + 'static {}

/// Why a version's cross-host lock could not be taken, kept, or handed over.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock store failed (timed out, lost the lease, refused by storage); its message is its
    /// whole cause chain.
    #[error("{}", crate::error::error_chain(.0.as_ref()))]
    Store(Box<dyn LockStoreError>),
    /// A writer handed its reference to the lock's holder and waited the whole lock wait.
    #[error("timed out after {waited:?} waiting for the lock {lock} (another process holds it and did not record this reference); nothing was recorded. Re-run; if its holder crashed, the lease expires within 30 s by itself")]
    HandoverTimedOut {
        lock: String,
        waited: std::time::Duration,
    },
    /// The holder dropped a handed-over reference without recording it.
    #[error("the reference {reference} was dropped unrecorded by the writer holding the lock of gallery version {definition}/{key} (another process removed that reference meanwhile, or this process stalled for over a minute); nothing was recorded. Re-run if the reference is still wanted")]
    ReferenceDropped {
        reference: String,
        definition: String,
        key: String,
    },
}

/// A store failure is the store's to classify; a hand-over that timed out or was dropped may
/// succeed when the command is run again.
impl Classified for LockError {
    fn class(&self) -> Class {
        match self {
            LockError::Store(e) => e.class(),
            LockError::HandoverTimedOut { .. } | LockError::ReferenceDropped { .. } => Class::Later,
        }
    }
}

/// Why a record could not be used or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// No copy is usable, and at least one exists.
    #[error("the reference record of gallery version {version} is unusable, so nothing is decided on that version: {details}. Both copies hold the references this tool recorded (and, while a Failed version is being replaced, the only copy of them). Restore a good copy (storage soft delete or versioning), or, if `lookup --output json` shows every reference the version should hold in its tags, delete both blobs: the next write rebuilds the record from the tags")]
    Unusable { version: String, details: String },
    /// Another writer kept changing the record (its holder lost the lock?).
    #[error("the reference record {blob} kept changing while this process wrote it ({attempts} attempts); another process may hold the version's lock now. Re-run the command")]
    Contended { blob: String, attempts: u32 },
    /// The store failed; it says itself whether a retry may succeed.
    #[error("{}", crate::error::error_chain(.0.as_ref()))]
    Store(Box<dyn LockStoreError>),
}

/// An unusable record stays unusable until repaired; a contended one may settle on a re-run; a
/// store failure is the store's to classify.
impl Classified for RecordError {
    fn class(&self) -> Class {
        match self {
            RecordError::Unusable { .. } => Class::Permanent,
            RecordError::Contended { .. } => Class::Later,
            RecordError::Store(e) => e.class(),
        }
    }
}

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
    }

    /// One classification decides every retry: the transport re-sends only `Transient`, the
    /// guarded writes observe again after `Transient` or `Busy`, and a caller (CPI
    /// `ok_to_retry`) is told to retry after `Transient` or `Later`.
    #[test]
    fn retryability_is_one_table() {
        let azure = |status| {
            Error::azure(
                "create",
                "v",
                AzureError {
                    status,
                    code: "C".into(),
                    message: String::new(),
                    target: None,
                    retry_after_secs: Some(3),
                },
            )
        };
        let busy = azure(409);
        assert!(matches!(busy, Error::Busy { .. }));
        assert_eq!(busy.class(), Class::Busy);
        assert!(busy.worth_observing_again() && !busy.class().retryable());
        assert_eq!(busy.retry_after(), Some(std::time::Duration::from_secs(3)));
        assert!(matches!(azure(400), Error::Rejected { .. }));
        assert_eq!(azure(400).class(), Class::Permanent);
        let throttled = azure(429);
        assert!(throttled.worth_observing_again() && throttled.class().retryable());
        assert!(throttled.class().resend() && !busy.class().resend());
        let timeout = Error::Timeout {
            operation: "create",
            resource: "v".into(),
            seconds: 1,
            state: "Creating".into(),
        };
        assert!(timeout.class().retryable() && !timeout.worth_observing_again());
        // A certificate failure known only by its words (`az`'s output) is decided where the
        // words arrive: never retried.
        let untrusted = Error::no_token(
            "read",
            "v",
            "az: invalid peer certificate: UnknownIssuer".into(),
        );
        assert_eq!(untrusted.class(), Class::Permanent);
        assert!(untrusted.refuses_a_certificate() && untrusted.to_string().contains("ca_cert"));
        let slow = Error::no_token("read", "v", "the identity provider did not answer".into());
        assert!(slow.class().retryable() && !slow.refuses_a_certificate());
        let refused = Error::Untrusted {
            operation: "read",
            resource: "v".into(),
            for_token: true,
            cause: crate::error::UntrustedCertificate::new(
                &url::Url::parse("https://login.example").unwrap(),
                rustls::CertificateError::UnknownIssuer,
            ),
        };
        assert_eq!(refused.class(), Class::Permanent);
        assert!(!refused.class().retryable());
        let handover = Error::from(super::LockError::HandoverTimedOut {
            lock: "locks/g/d/1.0.0.lock".into(),
            waited: std::time::Duration::from_secs(1),
        });
        assert_eq!(handover.class(), Class::Later);
    }
}
