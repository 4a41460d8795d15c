//! The typed storage error: which blob or container, Azure's status and code, and what to do.

use azure_core::error::ErrorKind;
use azure_core::http::StatusCode;

use crate::error::{Class, Classified};

use super::retry;

/// A failed storage operation, naming the blob or container and what to do.
#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    #[error("invalid blob endpoint {endpoint}: {reason}")]
    InvalidEndpoint { endpoint: String, reason: String },
    #[error("invalid page blob size {size} for {blob}: a page blob's size must be a positive multiple of 512 bytes (a fixed VHD is a whole number of MiB plus its 512-byte footer)")]
    InvalidSize { blob: String, size: u64 },
    #[error("page run for {blob} at offset {offset} with {len} bytes is not a non-empty 512-byte-aligned range inside the blob's {size} bytes; this is a bug in the producer of the runs")]
    InvalidRun {
        blob: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("{blob} already exists {what}; delete it first (a re-run of seed deletes partial blobs of its own and starts over)")]
    Conflicting { blob: String, what: String },
    #[error("{op} {resource} failed{}: {remedy}", status_suffix(.status, .code))]
    Request {
        op: &'static str,
        resource: String,
        status: Option<u16>,
        code: Option<String>,
        remedy: String,
        #[source]
        source: Box<azure_core::Error>,
    },
    #[error("upload task for {blob} failed: {message}")]
    Task { blob: String, message: String },
    #[error("cannot read the content of {blob}: {reason}")]
    Unreadable { blob: String, reason: String },
}

fn status_suffix(status: &Option<u16>, code: &Option<String>) -> String {
    match (status, code) {
        (Some(s), Some(c)) => format!(" ({s} {c})"),
        (Some(s), None) => format!(" ({s})"),
        (None, Some(c)) => format!(" ({c})"),
        (None, None) => String::new(),
    }
}

impl BlobError {
    /// Wrap an SDK error for operation `op` on `resource` (e.g. `stemcell/bosh-stemcell-….vhd`).
    pub fn request(
        op: &'static str,
        resource: impl Into<String>,
        source: azure_core::Error,
    ) -> Self {
        let (status, code) = match source.kind() {
            ErrorKind::HttpResponse {
                status, error_code, ..
            } => (Some(u16::from(*status)), error_code.clone()),
            _ => (None, None),
        };
        let remedy = if crate::azure::tls::refused_certificate(&source).is_some() {
            // The cause (below in the chain) says which certificate and what to do.
            "a TLS certificate was not accepted (the storage endpoint's, or its token endpoint's, \
             named below); not retried"
                .into()
        } else {
            remedy_for(status, code.as_deref(), source.kind())
        };
        BlobError::Request {
            op,
            resource: resource.into(),
            status,
            code,
            remedy,
            source: Box::new(source),
        }
    }

    /// The HTTP status of a failed request, if there was a response.
    pub fn status(&self) -> Option<u16> {
        match self {
            BlobError::Request { status, .. } => *status,
            BlobError::InvalidEndpoint { .. }
            | BlobError::InvalidSize { .. }
            | BlobError::InvalidRun { .. }
            | BlobError::Conflicting { .. }
            | BlobError::Task { .. }
            | BlobError::Unreadable { .. } => None,
        }
    }

    /// The storage error code (`BlobNotFound`, `LeaseAlreadyPresent`, …), if any.
    pub fn code(&self) -> Option<&str> {
        match self {
            BlobError::Request { code, .. } => code.as_deref(),
            BlobError::InvalidEndpoint { .. }
            | BlobError::InvalidSize { .. }
            | BlobError::InvalidRun { .. }
            | BlobError::Conflicting { .. }
            | BlobError::Task { .. }
            | BlobError::Unreadable { .. } => None,
        }
    }

    pub(crate) fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }
}

fn remedy_for(status: Option<u16>, code: Option<&str>, kind: &ErrorKind) -> String {
    match (status, code) {
        (_, Some("ContainerNotFound")) => {
            "the container does not exist; create it (or use --container to name an existing one)".into()
        }
        (_, Some("BlobNotFound")) => "the blob does not exist".into(),
        (_, Some("AuthenticationFailed")) => {
            "the storage account rejected the signature; check the account key (or the clock)".into()
        }
        (Some(403), _) => "access denied; check the account key, or grant the identity the \
                            \"Storage Blob Data Contributor\" role on the account"
            .into(),
        (Some(404), _) => "not found; check the account URL and container name".into(),
        (Some(409), _) | (Some(412), _) => {
            "conflict with the blob's current state or lease (another process may hold it); retry later".into()
        }
        (Some(s), _) if retry::is_transient_status(StatusCode::from(s)) => {
            "the storage service kept failing after retries; retry later (a re-run reuses a complete blob and starts an interrupted upload over)".into()
        }
        (Some(_), _) => "the storage service refused the request".into(),
        (None, _) => match kind {
            ErrorKind::Io | ErrorKind::Connection => "the storage endpoint could not be reached, or did not answer in time, after retries; check the URL, DNS, proxy and network (or raise STEMCELL_GALLERY_HTTP_TIMEOUT for a slow link), then re-run".into(),
            ErrorKind::Credential => "cannot get a token for storage; check the credential (az login, managed identity, AZURE_* variables)".into(),
            ErrorKind::HttpResponse { .. } | ErrorKind::DataConversion | ErrorKind::Other => {
                "unexpected response from the storage endpoint".into()
            }
        },
    }
}

/// Transient when the same request would plausibly succeed later (throttling, server errors,
/// timeouts, dropped connections; these were already retried by the pipeline), never for a
/// refused certificate ([`retry::is_transient_azure`] asks the typed cause).
impl Classified for BlobError {
    fn class(&self) -> Class {
        match self {
            BlobError::Request { source, .. } => {
                if retry::is_transient_azure(source) {
                    Class::Transient
                } else {
                    Class::Permanent
                }
            }
            BlobError::InvalidEndpoint { .. }
            | BlobError::InvalidSize { .. }
            | BlobError::InvalidRun { .. }
            | BlobError::Conflicting { .. }
            | BlobError::Task { .. }
            | BlobError::Unreadable { .. } => Class::Permanent,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Exit;

    fn http_error(status: u16, code: &str) -> azure_core::Error {
        ErrorKind::HttpResponse {
            status: StatusCode::from(status),
            error_code: Some(code.into()),
            raw_response: None,
        }
        .into_error()
    }

    #[test]
    fn blob_error_names_resource_and_remedy_and_classifies() {
        let err = BlobError::request(
            "put page to",
            "stemcell/b.vhd",
            http_error(403, "AuthorizationPermissionMismatch"),
        );
        let text = err.to_string();
        assert!(text.contains("stemcell/b.vhd"), "{text}");
        assert!(text.contains("Storage Blob Data Contributor"), "{text}");
        assert!(!err.class().retryable());
        let busy = BlobError::request(
            "put page to",
            "stemcell/b.vhd",
            http_error(503, "ServerBusy"),
        );
        assert!(busy.class().retryable());
        assert_eq!(busy.class().exit(), Exit::Error);
        assert_eq!(busy.status(), Some(503));
        assert_eq!(busy.code(), Some("ServerBusy"));
    }

    #[test]
    fn connection_errors_are_transient_with_the_network_remedy() {
        let err = BlobError::request(
            "put page to",
            "stemcell/b.vhd",
            azure_core::Error::with_message(ErrorKind::Io, "connection refused"),
        );
        assert!(err.class().retryable());
        assert!(err.to_string().contains("could not be reached"), "{err}");
        let cred = BlobError::request(
            "get properties of",
            "stemcell/b.vhd",
            azure_core::Error::with_message(ErrorKind::Credential, "no token"),
        );
        assert!(!cred.class().retryable());
        assert!(cred.to_string().contains("cannot get a token"), "{cred}");
    }
}
