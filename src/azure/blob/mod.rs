//! Blob storage for stemcell VHDs: the storage target (endpoint + credentials), the Azure CPI's
//! naming and metadata for stemcell blobs, the sparse parallel page-blob uploader, and the helpers
//! that make a seed resumable.
//!
//! # Stemcell blobs, the Azure CPI's way
//!
//! A stemcell VHD is the page blob `bosh-stemcell-<uuid>.vhd` in container `stemcell`; its CID is
//! `bosh-stemcell-<uuid>` (see [`new_stemcell_blob_name`]). Its metadata is what the Azure CPI
//! (v53+, `ComputeGalleryManager#create_stemcell_with_gallery`) writes, so a CPI can recover a
//! gallery version from a blob seeded by us (see [`stemcell_blob_metadata`]), plus one key of ours,
//! `upload_state`, that says the upload finished (see [`mark_complete`]).
//!
//! # Resumability
//!
//! 1. `upload_page_blob` creates the blob with `upload_state=uploading` (and no `image_sha256`, so
//!    neither we nor a CPI mistake a partial blob for a stemcell).
//! 2. Only after the last page was written *and* the caller verified the stream (SHA-1 of the image
//!    against `stemcell.MF`), [`mark_complete`] replaces the metadata with the CPI's keys plus
//!    `upload_state=complete` in one Set Blob Metadata request.
//! 3. A re-run asks [`find_complete_stemcell_blob`] first; partial blobs of earlier runs are listed
//!    by [`find_partial_stemcell_blobs`] and deleted with [`delete_blob_if_exists`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use azure_core::error::ErrorKind;
use azure_core::request_options::Metadata;
use azure_core::{ClientOptions, RetryOptions, StatusCode};
use azure_storage::{CloudLocation, StorageCredentials, EMULATOR_ACCOUNT_KEY};
use azure_storage_blobs::prelude::{BlobClient, ClientBuilder, ContainerClient};
use futures::StreamExt;
use serde_json::Value;

use crate::error::{Exit, HasExit};

mod content;
pub mod retry;
mod upload;

pub use content::{content_digest, BlobContent};
pub use retry::{RetryCounter, RetrySettings};
pub use upload::{page_runs_sink, upload_page_blob, PageRun, Progress, UploadOptions, UploadStats};

/// The container the Azure CPI keeps stemcell VHDs in.
pub const STEMCELL_CONTAINER: &str = "stemcell";
/// The prefix of stemcell CIDs and blob names (the Azure CPI's `STEMCELL_PREFIX`).
pub const STEMCELL_PREFIX: &str = "bosh-stemcell";
/// Metadata key holding the SHA-256 of the stemcell's `image` file (shared with the Azure CPI).
pub const META_IMAGE_SHA256: &str = "image_sha256";
/// Our completion marker's key; see the module documentation.
pub const META_UPLOAD_STATE: &str = "upload_state";
/// `upload_state` while pages are being written.
pub const UPLOAD_STATE_UPLOADING: &str = "uploading";
/// `upload_state` once every page is written and the content verified.
pub const UPLOAD_STATE_COMPLETE: &str = "complete";
/// The largest Put Page body Azure accepts.
pub const MAX_PUT_PAGE: usize = 4 * 1024 * 1024;
/// Page blobs are written in 512-byte pages.
pub const PAGE: u64 = 512;

/// How to authenticate to the storage account.
#[derive(Clone)]
pub enum StorageAuth {
    /// Shared key. The key is a secret: it is never logged nor printed by `Debug`.
    AccountKey { account: String, key: String },
    /// An Entra ID token credential (role "Storage Blob Data Contributor" on the account).
    Token(Arc<dyn azure_core::auth::TokenCredential>),
    /// Azurite's and the emulator's well-known development key; loopback endpoints only.
    DevelopmentKey,
}

impl fmt::Debug for StorageAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageAuth::AccountKey { account, .. } => f
                .debug_struct("AccountKey")
                .field("account", account)
                .field("key", &"<redacted>")
                .finish(),
            StorageAuth::Token(_) => f.write_str("Token(<credential>)"),
            StorageAuth::DevelopmentKey => f.write_str("DevelopmentKey"),
        }
    }
}

/// A storage account endpoint plus credentials; hands out SDK clients whose pipeline retries
/// transient failures with our [`RetrySettings`].
#[derive(Clone)]
pub struct StorageTarget {
    account: String,
    /// The endpoint without a trailing slash: `https://acct.blob.core.windows.net` or
    /// `http://127.0.0.1:PORT/devstoreaccount1`.
    base: String,
    service: azure_storage_blobs::prelude::BlobServiceClient,
}

impl fmt::Debug for StorageTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageTarget")
            .field("account", &self.account)
            .field("endpoint", &self.base)
            .finish_non_exhaustive()
    }
}

impl StorageTarget {
    /// Build a target from a blob endpoint URL and credentials, with default retry settings.
    pub fn new(endpoint: &url::Url, auth: StorageAuth) -> Result<StorageTarget, BlobError> {
        Self::with_retry(endpoint, auth, RetrySettings::default())
    }

    /// As [`StorageTarget::new`], with explicit retry settings.
    pub fn with_retry(
        endpoint: &url::Url,
        auth: StorageAuth,
        retry: RetrySettings,
    ) -> Result<StorageTarget, BlobError> {
        Self::with_options(endpoint, auth, retry, &[])
    }

    /// As [`StorageTarget::with_retry`], trusting extra CA certificates too.
    pub fn with_options(
        endpoint: &url::Url,
        auth: StorageAuth,
        retry: RetrySettings,
        ca_bundles: &[crate::azure::tls::CaBundle],
    ) -> Result<StorageTarget, BlobError> {
        let (account, base, loopback) = parse_endpoint(endpoint)?;
        let mut policy = retry::RetryPolicy::new(retry);
        if let StorageAuth::Token(cred) = &auth {
            policy = policy.with_credential(cred.clone());
        }
        let credentials = match auth {
            StorageAuth::AccountKey {
                account: named,
                key,
            } => {
                if named != account {
                    return Err(BlobError::InvalidEndpoint {
                        endpoint: base,
                        reason: format!(
                            "the account key is for account `{named}` but the endpoint names `{account}`; \
                             pass the key of the endpoint's account"
                        ),
                    });
                }
                StorageCredentials::access_key(account.clone(), key)
            }
            StorageAuth::Token(cred) => StorageCredentials::token_credential(cred),
            StorageAuth::DevelopmentKey => {
                if !loopback {
                    return Err(BlobError::InvalidEndpoint {
                        endpoint: base,
                        reason: "the development key is only for Azurite or the emulator on a loopback \
                                 address; use an account key or a token credential for a real account"
                            .into(),
                    });
                }
                StorageCredentials::access_key(account.clone(), EMULATOR_ACCOUNT_KEY)
            }
        };
        let mut options = ClientOptions::default().retry(RetryOptions::none());
        if !ca_bundles.is_empty() {
            let http = crate::azure::tls::http_client(ca_bundles).map_err(|e| {
                BlobError::InvalidEndpoint {
                    endpoint: base.clone(),
                    reason: format!("cannot build the HTTP client with the extra CAs: {e}"),
                }
            })?;
            options = options.transport(azure_core::TransportOptions::new(http));
        }
        options.per_call_policies_mut().push(Arc::new(policy));
        options
            .per_retry_policies_mut()
            .push(Arc::new(retry::RetryAfterProbe));
        let service = ClientBuilder::with_location(
            CloudLocation::Custom {
                account: account.clone(),
                uri: base.clone(),
            },
            credentials,
        )
        .client_options(options)
        .blob_service_client();
        Ok(StorageTarget {
            account,
            base,
            service,
        })
    }

    /// A client for one container of the account.
    pub fn container(&self, name: &str) -> ContainerClient {
        self.service.container_client(name)
    }

    /// The blob's URI without any SAS: what a gallery version's `osDiskImage.source.uri` uses.
    pub fn blob_url(&self, container: &str, blob: &str) -> String {
        match url::Url::parse(&self.base) {
            Ok(mut url) => {
                if let Ok(mut segments) = url.path_segments_mut() {
                    segments.pop_if_empty().push(container);
                    for part in blob.split('/') {
                        segments.push(part);
                    }
                }
                url.to_string()
            }
            // `base` was produced from a parsed URL in `new`, so this cannot happen; stay total.
            Err(_) => format!("{}/{container}/{blob}", self.base),
        }
    }

    /// The storage account's name.
    pub fn account_name(&self) -> &str {
        &self.account
    }

    /// The endpoint as given (normalised, no trailing slash).
    pub fn endpoint(&self) -> &str {
        &self.base
    }
}

/// Split an endpoint into (account, base URI, is-loopback). Path-style (`http://host:port/ACCOUNT`)
/// when the URL has a path segment or its host is an IP address or `localhost`; otherwise the
/// account is the first DNS label (`https://ACCOUNT.blob.core.windows.net`).
/// The storage account a blob endpoint names (`ACCOUNT.blob.HOST`, or the first path segment
/// of a path-style emulator URL), if it names one.
pub fn endpoint_account(endpoint: &url::Url) -> Option<String> {
    parse_endpoint(endpoint).ok().map(|(account, _, _)| account)
}

fn parse_endpoint(endpoint: &url::Url) -> Result<(String, String, bool), BlobError> {
    let mut shown = endpoint.clone();
    shown.set_query(None);
    shown.set_fragment(None);
    let _ = shown.set_password(None);
    let shown_str = shown.as_str().trim_end_matches('/').to_string();
    let invalid = |reason: &str| BlobError::InvalidEndpoint {
        endpoint: shown_str.clone(),
        reason: reason.to_string(),
    };
    if !matches!(endpoint.scheme(), "http" | "https") {
        return Err(invalid(
            "the scheme must be https (or http for a local emulator)",
        ));
    }
    if endpoint.query().is_some() {
        return Err(invalid(
            "the endpoint must not carry a query string (SAS tokens are not accepted here); \
             pass the bare account URL and an account key or token credential",
        ));
    }
    if !endpoint.username().is_empty() || endpoint.password().is_some() {
        return Err(invalid("the endpoint must not carry user info"));
    }
    let host = endpoint
        .host_str()
        .ok_or_else(|| invalid("the endpoint has no host"))?;
    let bare_host = host.trim_start_matches('[').trim_end_matches(']');
    let ip = bare_host.parse::<IpAddr>().ok();
    let loopback = ip.map(|ip| ip.is_loopback()).unwrap_or(false) || host == "localhost";
    let segments: Vec<&str> = endpoint
        .path_segments()
        .map(|s| s.filter(|p| !p.is_empty()).collect())
        .unwrap_or_default();
    let path_style = !segments.is_empty() || ip.is_some() || host == "localhost";
    let mut origin = format!("{}://{}", endpoint.scheme(), host);
    if let Some(port) = endpoint.port() {
        origin.push_str(&format!(":{port}"));
    }
    let (account, base) = if path_style {
        match segments.as_slice() {
            [account] => (account.to_string(), format!("{origin}/{account}")),
            [] => {
                return Err(invalid(
                    "a path-style endpoint needs the account as its path, e.g. http://127.0.0.1:10000/devstoreaccount1",
                ))
            }
            _ => {
                return Err(invalid(
                    "the endpoint must be the account URL only (no container or blob in the path)",
                ))
            }
        }
    } else {
        let account = host.split('.').next().unwrap_or_default().to_string();
        (account, origin)
    };
    let valid_account = (3..=24).contains(&account.len())
        && account
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !valid_account {
        return Err(invalid(&format!(
            "`{account}` is not a storage account name (3-24 lowercase letters and digits)"
        )));
    }
    Ok((account, base, loopback))
}

// ---------------------------------------------------------------------------------------------
// Errors

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
    #[error("{blob} already exists {what}; delete it first (or let the resumable seed replace partial blobs)")]
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
    #[error("the page uploader for {blob} stopped before all runs were handed over (its own error says why)")]
    UploaderGone { blob: String },
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
            ErrorKind::HttpResponse { status, error_code } => {
                (Some(u16::from(*status)), error_code.clone())
            }
            _ => (None, None),
        };
        let remedy = remedy_for(status, code.as_deref(), source.kind());
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
            | BlobError::UploaderGone { .. }
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
            | BlobError::UploaderGone { .. }
            | BlobError::Task { .. }
            | BlobError::Unreadable { .. } => None,
        }
    }

    /// Would the same request plausibly succeed later (throttling, server errors, timeouts,
    /// dropped connections)? These were already retried by the pipeline.
    pub fn is_transient(&self) -> bool {
        match self {
            BlobError::Request { source, .. } => retry::is_transient_azure(source),
            BlobError::InvalidEndpoint { .. }
            | BlobError::InvalidSize { .. }
            | BlobError::InvalidRun { .. }
            | BlobError::Conflicting { .. }
            | BlobError::UploaderGone { .. }
            | BlobError::Task { .. }
            | BlobError::Unreadable { .. } => false,
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
        (Some(s), _) if retry::is_transient_status(StatusCode::try_from(s).unwrap_or(StatusCode::InternalServerError)) => {
            "the storage service kept failing after retries; retry later (a re-run resumes)".into()
        }
        (Some(_), _) => "the storage service refused the request".into(),
        (None, _) => match kind {
            ErrorKind::Io => "the storage endpoint could not be reached, or did not answer in time, after retries; check the URL, DNS, proxy and network (or raise STEMCELL_GALLERY_HTTP_TIMEOUT for a slow link), then re-run".into(),
            ErrorKind::Credential => "cannot get a token for storage; check the credential (az login, managed identity, AZURE_* variables)".into(),
            ErrorKind::HttpResponse { .. }
            | ErrorKind::DataConversion
            | ErrorKind::MockFramework
            | ErrorKind::Other => "unexpected response from the storage endpoint".into(),
        },
    }
}

impl HasExit for BlobError {
    fn exit(&self) -> Exit {
        Exit::Error
    }
}

/// `container/blob`, the way errors and logs name a blob.
pub fn blob_path(blob: &BlobClient) -> String {
    format!(
        "{}/{}",
        blob.container_client().container_name(),
        blob.blob_name()
    )
}

// ---------------------------------------------------------------------------------------------
// Naming and metadata

/// A new stemcell identity: (CID `bosh-stemcell-<uuid>`, blob name `bosh-stemcell-<uuid>.vhd`).
/// Choose it once, before the first request, and reuse it on retries.
pub fn new_stemcell_blob_name() -> (String, String) {
    let cid = format!("{STEMCELL_PREFIX}-{}", uuid::Uuid::new_v4());
    let blob = format!("{cid}.vhd");
    (cid, blob)
}

/// Whether `cid` has the shape of a stemcell CID the Azure CPI (or `publish`) makes,
/// `bosh-stemcell-<uuid>`: only such a CID owns a blob `<cid>.vhd`.
pub fn is_stemcell_cid(cid: &str) -> bool {
    cid.strip_prefix(STEMCELL_PREFIX)
        .and_then(|rest| rest.strip_prefix('-'))
        .is_some_and(|uuid| uuid.len() == 36 && uuid::Uuid::parse_str(uuid).is_ok())
}

/// The metadata the Azure CPI (v53+) puts on a stemcell blob when a compute gallery is enabled,
/// computed the same way, so a CPI can rebuild a gallery version from a blob seeded by us:
///
/// - every key of the stemcell's `cloud_properties` (`name`, `version`, `infrastructure`,
///   `hypervisor`, `disk`, `os_type`, `architecture`, `generation`, …), each value as a string:
///   strings as they are, numbers and booleans in their usual text, `null` as empty, arrays and
///   objects as compact JSON (the CPI's Ruby `to_s` gives `["scsi", "nvme"]`; it reads
///   `disk_controller_types` back with `JSON.parse`, which accepts both);
/// - `image`: JSON `{"publisher":"bosh","offer":<definition>,"sku":<generation, default gen1>,
///   "version":<cloud_properties.version padded to MAJOR.MINOR.PATCH>}`;
/// - `compute_gallery_name`, `compute_gallery_image_definition`, `image_sha256`.
///
/// These override cloud properties of the same name, as in the CPI. Blob metadata names must be
/// C# identifiers and values ASCII header text: an invalid name has its invalid characters
/// replaced by `_` (prefixed with `_` if it starts with a digit; colliding names get a numeric
/// suffix) and non-ASCII or control characters in values are escaped as `\uXXXX` — each change
/// is logged as a warning, nothing is dropped silently. Callers should validate the version key
/// beforehand; this function never truncates a version.
pub fn stemcell_blob_metadata(
    cloud_properties: &serde_json::Map<String, Value>,
    image_sha256: &str,
    gallery: &str,
    definition: &str,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (key, value) in cloud_properties {
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => n.to_string(),
            Value::Array(_) | Value::Object(_) => value.to_string(),
        };
        insert_sanitised(&mut out, key, &text);
    }
    let generation = match cloud_properties.get("generation") {
        Some(Value::String(g)) if !g.is_empty() => g.clone(),
        _ => "gen1".to_string(),
    };
    let version = match cloud_properties.get("version") {
        Some(Value::String(v)) => cpi_semver(v),
        Some(Value::Number(n)) => cpi_semver(&n.to_string()),
        _ => String::new(),
    };
    let json = |s: &str| Value::String(s.to_string()).to_string();
    let image = format!(
        "{{\"publisher\":\"bosh\",\"offer\":{},\"sku\":{},\"version\":{}}}",
        json(definition),
        json(&generation),
        json(&version)
    );
    for (key, value) in [
        ("image", image.as_str()),
        ("compute_gallery_name", gallery),
        ("compute_gallery_image_definition", definition),
        (META_IMAGE_SHA256, image_sha256),
    ] {
        out.insert(key.to_string(), sanitise_value(key, value));
    }
    out
}

/// The CPI's `make_semver_compliant`: pad to three parts with `0`. Unlike the CPI, more than three
/// parts are kept as given (never truncated) with a warning.
fn cpi_semver(version: &str) -> String {
    let parts: Vec<&str> = version.split('.').collect();
    match parts.len() {
        1 => format!("{}.0.0", parts[0]),
        2 => format!("{}.{}.0", parts[0], parts[1]),
        3 => version.to_string(),
        _ => {
            tracing::warn!(
                version,
                "stemcell version has more than three parts; kept as is in blob metadata `image`"
            );
            version.to_string()
        }
    }
}

fn insert_sanitised(out: &mut BTreeMap<String, String>, key: &str, value: &str) {
    let mut name = sanitise_name(key);
    if name != key {
        tracing::warn!(
            original = key,
            sanitised = %name,
            "cloud property name is not a valid blob metadata name; renamed"
        );
    }
    // Metadata names are case-insensitive in Azure: avoid two keys that differ only in case.
    let base = name.clone();
    let mut n = 2;
    while out.keys().any(|k| k.eq_ignore_ascii_case(&name)) {
        name = format!("{base}_{n}");
        n += 1;
    }
    if name != base {
        tracing::warn!(original = key, renamed = %name, "blob metadata name collides with another; renamed");
    }
    let value = sanitise_value(&name, value);
    out.insert(name, value);
}

/// Make `key` a C# identifier: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn sanitise_name(key: &str) -> String {
    let mut name: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

/// Make `value` printable ASCII (header-safe), escaping anything else as `\uXXXX`.
pub fn sanitise_value(key: &str, value: &str) -> String {
    if value.chars().all(|c| (' '..='~').contains(&c)) {
        return value.to_string();
    }
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        if (' '..='~').contains(&c) {
            out.push(c);
        } else {
            let mut buf = [0u16; 2];
            for unit in c.encode_utf16(&mut buf) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    tracing::warn!(
        key,
        "blob metadata value has non-ASCII or control characters; escaped as \\uXXXX"
    );
    out
}

fn to_sdk_metadata(map: &BTreeMap<String, String>) -> Metadata {
    let mut metadata = Metadata::new();
    for (k, v) in map {
        metadata.insert(sanitise_name(k), sanitise_value(k, v));
    }
    metadata
}

// ---------------------------------------------------------------------------------------------
// Resumability helpers

/// A stemcell blob found in a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StemcellBlob {
    pub name: String,
    pub size: u64,
    pub metadata: HashMap<String, String>,
    pub last_modified: time::OffsetDateTime,
}

impl StemcellBlob {
    pub fn is_complete(&self) -> bool {
        self.metadata.get(META_UPLOAD_STATE).map(String::as_str) == Some(UPLOAD_STATE_COMPLETE)
    }
}

/// Every `bosh-stemcell-*` page blob of the container with its metadata (empty when the container
/// does not exist yet).
pub async fn list_stemcell_blobs(
    container: &ContainerClient,
) -> Result<Vec<StemcellBlob>, BlobError> {
    let mut stream = container
        .list_blobs()
        .prefix(STEMCELL_PREFIX.to_string())
        .include_metadata(true)
        .into_stream();
    let mut found = Vec::new();
    while let Some(page) = stream.next().await {
        let page = match page {
            Ok(page) => page,
            Err(err) => {
                let err =
                    BlobError::request("list blobs in container", container.container_name(), err);
                if err.is_not_found() {
                    return Ok(Vec::new());
                }
                return Err(err);
            }
        };
        for blob in page.blobs.blobs() {
            if blob.properties.blob_type != azure_storage_blobs::blob::BlobType::PageBlob {
                continue;
            }
            found.push(StemcellBlob {
                name: blob.name.clone(),
                size: blob.properties.content_length,
                metadata: blob.metadata.clone().unwrap_or_default(),
                last_modified: blob.properties.last_modified,
            });
        }
    }
    Ok(found)
}

/// A complete stemcell blob for this image digest: `image_sha256` matches and `upload_state` is
/// `complete` (blobs a CPI uploaded carry no marker and are not trusted: a crashed CPI upload
/// leaves the same metadata on a partial blob). Returns (blob name, size), newest first.
pub async fn find_complete_stemcell_blob(
    container: &ContainerClient,
    image_sha256: &str,
) -> Result<Option<(String, u64)>, BlobError> {
    let mut candidates: Vec<StemcellBlob> = list_stemcell_blobs(container)
        .await?
        .into_iter()
        .filter(|b| {
            b.is_complete()
                && b.metadata
                    .get(META_IMAGE_SHA256)
                    .is_some_and(|s| s.eq_ignore_ascii_case(image_sha256))
        })
        .collect();
    candidates.sort_by_key(|b| std::cmp::Reverse(b.last_modified));
    Ok(candidates.into_iter().next().map(|b| (b.name, b.size)))
}

/// Partial stemcell blobs left by our own interrupted uploads (`upload_state=uploading`).
/// Delete them only while holding the version's lock, so a concurrent upload is not cut short.
pub async fn find_partial_stemcell_blobs(
    container: &ContainerClient,
) -> Result<Vec<StemcellBlob>, BlobError> {
    Ok(list_stemcell_blobs(container)
        .await?
        .into_iter()
        .filter(|b| {
            b.metadata.get(META_UPLOAD_STATE).map(String::as_str) == Some(UPLOAD_STATE_UPLOADING)
        })
        .collect())
}

/// Record that the upload is complete: replace the blob's metadata with `metadata` (normally
/// [`stemcell_blob_metadata`]) plus `upload_state=complete`, in one request. Call it only after
/// the last page was written and the image's checksum verified.
pub async fn mark_complete(
    blob: &BlobClient,
    metadata: &BTreeMap<String, String>,
) -> Result<(), BlobError> {
    let mut all = metadata.clone();
    all.insert(META_UPLOAD_STATE.into(), UPLOAD_STATE_COMPLETE.into());
    blob.set_metadata()
        .metadata(to_sdk_metadata(&all))
        .await
        .map_err(|e| BlobError::request("set metadata of", blob_path(blob), e))?;
    Ok(())
}

/// Delete a blob (and its snapshots); `Ok(false)` when it was not there.
pub async fn delete_blob_if_exists(blob: &BlobClient) -> Result<bool, BlobError> {
    match blob
        .delete()
        .delete_snapshots_method(azure_storage_blobs::prelude::DeleteSnapshotsMethod::Include)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) => {
            let err = BlobError::request("delete blob", blob_path(blob), e);
            if err.is_not_found() {
                Ok(false)
            } else {
                Err(err)
            }
        }
    }
}

/// Create the container if it is missing ("already exists" is success).
pub async fn ensure_container(container: &ContainerClient) -> Result<(), BlobError> {
    match container.create().await {
        Ok(_) => Ok(()),
        Err(e) => {
            let err = BlobError::request("create container", container.container_name(), e);
            if err.status() == Some(409) {
                Ok(())
            } else {
                Err(err)
            }
        }
    }
}

/// Size and metadata of a blob, `None` when absent.
pub async fn blob_properties(
    blob: &BlobClient,
) -> Result<
    Option<(
        u64,
        HashMap<String, String>,
        azure_storage_blobs::blob::BlobType,
    )>,
    BlobError,
> {
    match blob.get_properties().await {
        Ok(props) => Ok(Some((
            props.blob.properties.content_length,
            props.blob.metadata.unwrap_or_default(),
            props.blob.properties.blob_type,
        ))),
        Err(e) => {
            let err = BlobError::request("get properties of", blob_path(blob), e);
            if err.is_not_found() {
                Ok(None)
            } else {
                Err(err)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn target(url: &str, auth: StorageAuth) -> Result<StorageTarget, BlobError> {
        StorageTarget::new(&url::Url::parse(url).expect("url"), auth)
    }

    #[test]
    fn only_bosh_stemcell_uuid_is_a_stemcell_cid() {
        let (cid, blob) = new_stemcell_blob_name();
        assert!(is_stemcell_cid(&cid), "{cid}");
        assert_eq!(blob, format!("{cid}.vhd"));
        assert!(is_stemcell_cid(
            "bosh-stemcell-0b0e7c1e-7a39-4d4c-9d53-5300aa000001"
        ));
        for not in [
            "bosh-stemcell-aaaa",
            "bosh-stemcell-",
            "ops-pipeline",
            "bosh-stemcell-0b0e7c1e7a394d4c9d535300aa000001",
            "xbosh-stemcell-0b0e7c1e-7a39-4d4c-9d53-5300aa000001",
            "bosh-stemcell-0b0e7c1e-7a39-4d4c-9d53-5300aa000001.vhd",
        ] {
            assert!(!is_stemcell_cid(not), "{not}");
        }
    }

    #[test]
    fn public_endpoint_gives_account_from_host() {
        let t = target(
            "https://mystemcells.blob.core.windows.net/",
            StorageAuth::AccountKey {
                account: "mystemcells".into(),
                key: "a2V5".into(),
            },
        )
        .expect("valid");
        assert_eq!(t.account_name(), "mystemcells");
        assert_eq!(
            t.blob_url("stemcell", "bosh-stemcell-x.vhd"),
            "https://mystemcells.blob.core.windows.net/stemcell/bosh-stemcell-x.vhd"
        );
    }

    #[test]
    fn path_style_endpoint_gives_account_from_path() {
        let t = target(
            "http://127.0.0.1:10000/devstoreaccount1",
            StorageAuth::DevelopmentKey,
        )
        .expect("valid");
        assert_eq!(t.account_name(), "devstoreaccount1");
        assert_eq!(
            t.blob_url("stemcell", "locks/g/d/1.0.0.lock"),
            "http://127.0.0.1:10000/devstoreaccount1/stemcell/locks/g/d/1.0.0.lock"
        );
    }

    #[test]
    fn development_key_is_refused_off_loopback() {
        let err = target(
            "https://acct.blob.core.windows.net",
            StorageAuth::DevelopmentKey,
        )
        .expect_err("must refuse");
        assert!(err.to_string().contains("loopback"), "{err}");
    }

    #[test]
    fn sas_in_endpoint_is_refused_without_echoing_it() {
        let err = target(
            "https://acct.blob.core.windows.net/?sv=2022&sig=SECRETSIG",
            StorageAuth::DevelopmentKey,
        )
        .expect_err("must refuse");
        let text = err.to_string();
        assert!(text.contains("SAS"), "{text}");
        assert!(!text.contains("SECRETSIG"), "{text}");
    }

    #[test]
    fn key_for_another_account_is_refused_and_never_printed() {
        let err = target(
            "https://acct.blob.core.windows.net",
            StorageAuth::AccountKey {
                account: "other".into(),
                key: "VERYSECRETKEY".into(),
            },
        )
        .expect_err("must refuse");
        assert!(!err.to_string().contains("VERYSECRETKEY"));
        let dbg = format!(
            "{:?}",
            StorageAuth::AccountKey {
                account: "a".into(),
                key: "VERYSECRETKEY".into()
            }
        );
        assert!(!dbg.contains("VERYSECRETKEY"), "{dbg}");
    }

    #[test]
    fn endpoint_with_container_path_is_refused() {
        assert!(target(
            "http://127.0.0.1:10000/devstoreaccount1/stemcell",
            StorageAuth::DevelopmentKey
        )
        .is_err());
        assert!(target("http://127.0.0.1:10000/", StorageAuth::DevelopmentKey).is_err());
        assert!(target(
            "ftp://acct.blob.core.windows.net",
            StorageAuth::DevelopmentKey
        )
        .is_err());
    }

    #[test]
    fn stemcell_names_follow_the_cpi() {
        let (cid, blob) = new_stemcell_blob_name();
        assert!(cid.starts_with("bosh-stemcell-"));
        assert_eq!(blob, format!("{cid}.vhd"));
        assert!(uuid::Uuid::parse_str(&cid["bosh-stemcell-".len()..]).is_ok());
        assert_ne!(new_stemcell_blob_name().0, cid);
    }

    #[test]
    fn metadata_matches_the_cpi_keys() {
        let props = json!({
            "name": "bosh-azure-hyperv-ubuntu-jammy-go_agent",
            "version": "1.506",
            "infrastructure": "azure",
            "disk": 5120,
            "generation": "gen2",
            "disk_controller_types": ["scsi", "nvme"],
            "accelerated_networking": true,
            "image_sha256": "stale"
        });
        let m = stemcell_blob_metadata(
            props.as_object().expect("object"),
            "abc123",
            "gal",
            "bosh-azure-hyperv-ubuntu-jammy-go_agent-gen2",
        );
        assert_eq!(m["name"], "bosh-azure-hyperv-ubuntu-jammy-go_agent");
        assert_eq!(m["version"], "1.506");
        assert_eq!(m["disk"], "5120");
        assert_eq!(m["accelerated_networking"], "true");
        assert_eq!(m["disk_controller_types"], r#"["scsi","nvme"]"#);
        assert_eq!(m["compute_gallery_name"], "gal");
        assert_eq!(
            m["compute_gallery_image_definition"],
            "bosh-azure-hyperv-ubuntu-jammy-go_agent-gen2"
        );
        assert_eq!(
            m["image_sha256"], "abc123",
            "ours overrides a stale property"
        );
        let image: Value = serde_json::from_str(&m["image"]).expect("image is JSON");
        assert_eq!(
            image,
            json!({"publisher": "bosh", "offer": "bosh-azure-hyperv-ubuntu-jammy-go_agent-gen2", "sku": "gen2", "version": "1.506.0"})
        );
        assert!(
            m["image"].starts_with(r#"{"publisher":"bosh","offer":"#),
            "the CPI's key order"
        );
    }

    #[test]
    fn metadata_names_and_values_are_sanitised_not_dropped() {
        let props = json!({
            "root-device.name": "/dev/sda1",
            "1st": "x",
            "Name": "upper",
            "name": "lower",
            "note": "caf\u{e9}\nline"
        });
        let m = stemcell_blob_metadata(props.as_object().expect("object"), "s", "g", "d");
        assert_eq!(m["root_device_name"], "/dev/sda1");
        assert_eq!(m["_1st"], "x");
        assert_eq!(m["note"], "caf\\u00e9\\u000aline");
        // `Name` and `name` collide case-insensitively: both survive.
        let names: Vec<&String> = m
            .keys()
            .filter(|k| k.to_ascii_lowercase().starts_with("name"))
            .collect();
        assert_eq!(names.len(), 2, "{m:?}");
        for key in m.keys() {
            assert!(
                key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{key}"
            );
            assert!(!key.starts_with(|c: char| c.is_ascii_digit()), "{key}");
        }
        for value in m.values() {
            assert!(value.chars().all(|c| (' '..='~').contains(&c)), "{value}");
        }
    }

    #[test]
    fn version_padding_never_truncates() {
        assert_eq!(cpi_semver("1"), "1.0.0");
        assert_eq!(cpi_semver("1.2"), "1.2.0");
        assert_eq!(cpi_semver("1.2.3"), "1.2.3");
        assert_eq!(cpi_semver("1.2.3.4"), "1.2.3.4");
    }

    #[test]
    fn blob_error_names_resource_and_remedy_and_classifies() {
        let source = azure_core::Error::new(
            ErrorKind::http_response(
                StatusCode::Forbidden,
                Some("AuthorizationPermissionMismatch".into()),
            ),
            std::io::Error::other("403"),
        );
        let err = BlobError::request("put page to", "stemcell/b.vhd", source);
        let text = err.to_string();
        assert!(text.contains("stemcell/b.vhd"), "{text}");
        assert!(text.contains("Storage Blob Data Contributor"), "{text}");
        assert!(!err.is_transient());
        let busy = BlobError::request(
            "put page to",
            "stemcell/b.vhd",
            azure_core::Error::new(
                ErrorKind::http_response(StatusCode::ServiceUnavailable, Some("ServerBusy".into())),
                std::io::Error::other("503"),
            ),
        );
        assert!(busy.is_transient());
        assert_eq!(busy.exit(), Exit::Error);
    }
}
