//! The wire format every blob answer shares: the XML error body with `x-ms-error-code`, the
//! common headers (`x-ms-version`, `x-ms-request-id`, `Server`, `Date` on the emulator's clock),
//! a blob's properties as headers, and the readers of request headers (metadata, ranges).

use std::collections::BTreeMap;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::leases::lease_view;
use crate::emulator::store::{Blob, Content};

const SERVICE_VERSION: &str = "2021-12-02";

/// A storage error: XML body `<Error><Code/><Message/>[details]</Error>` and
/// `x-ms-error-code`. The details are the elements Azure adds after the message for some codes
/// (`<HeaderName>`/`<HeaderValue>` for `InvalidHeaderValue`).
#[derive(Debug, Clone)]
pub struct StorageError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    pub details: Vec<(&'static str, String)>,
}

impl StorageError {
    pub fn new(status: StatusCode, code: &str, message: &str) -> Self {
        StorageError {
            status,
            code: code.into(),
            message: message.into(),
            details: Vec::new(),
        }
    }
}

impl IntoResponse for StorageError {
    fn into_response(self) -> Response {
        let request_id = uuid::Uuid::new_v4();
        let details: String = self
            .details
            .iter()
            .map(|(name, value)| format!("<{name}>{}</{name}>", xml(value)))
            .collect();
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>{}</Code><Message>{}\nRequestId:{request_id}\nTime:{}</Message>{details}</Error>",
            xml(&self.code),
            xml(&self.message),
            time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default()
        );
        let mut resp = (self.status, body).into_response();
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/xml"),
        );
        if let Ok(v) = HeaderValue::from_str(&self.code) {
            h.insert("x-ms-error-code", v);
        }
        if let Ok(v) = HeaderValue::from_str(&request_id.to_string()) {
            h.insert("x-ms-request-id", v);
        }
        h.insert("x-ms-version", HeaderValue::from_static(SERVICE_VERSION));
        resp
    }
}

pub(super) fn err(status: StatusCode, code: &str, message: &str) -> StorageError {
    StorageError::new(status, code, message)
}

/// A header whose value Azure refuses: 400 `InvalidHeaderValue` with its fixed message, the
/// header and the value as `<HeaderName>`/`<HeaderValue>` (Azure's error body for this code, as
/// Azurite's `StorageErrorFactory.getInvalidHeaderValue` reproduces it).
pub(super) fn invalid_header_value(name: &str, value: &str) -> StorageError {
    StorageError {
        details: vec![
            ("HeaderName", name.to_string()),
            ("HeaderValue", value.to_string()),
        ],
        ..err(
            StatusCode::BAD_REQUEST,
            "InvalidHeaderValue",
            "The value for one of the HTTP headers is not in the correct format.",
        )
    }
}

pub(super) fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

pub(super) fn header_str<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

pub(super) fn rfc1123(unix: i64) -> String {
    let t =
        time::OffsetDateTime::from_unix_timestamp(unix).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let fmt = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    t.format(&fmt).unwrap_or_default()
}

pub(super) fn new_etag() -> String {
    let n = uuid::Uuid::new_v4().as_u128() as u64 & 0x0000_FFFF_FFFF_FFFF;
    format!("\"0x8D{n:012X}\"")
}

fn metadata_from(h: &HeaderMap) -> BTreeMap<String, String> {
    h.iter()
        .filter_map(|(k, v)| {
            k.as_str()
                .strip_prefix("x-ms-meta-")
                .map(|name| (name.to_string(), v.to_str().unwrap_or("").to_string()))
        })
        .collect()
}

/// The request's metadata, refused as Azure refuses names that are not C# identifiers (Azure
/// Storage docs, "Setting and retrieving properties and metadata for Blob service resources":
/// names must adhere to the naming rules for C# identifiers; 400 `InvalidMetadata`).
pub(super) fn checked_metadata(h: &HeaderMap) -> Result<BTreeMap<String, String>, StorageError> {
    let metadata = metadata_from(h);
    for name in metadata.keys() {
        let mut chars = name.chars();
        let ok = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "InvalidMetadata",
                "The metadata specified is invalid. It has characters that are not permitted.",
            ));
        }
    }
    Ok(metadata)
}

/// `bytes=START-END` (END inclusive, optional) from `x-ms-range` or `Range`.
pub(super) fn parse_range(h: &HeaderMap) -> Result<Option<(u64, Option<u64>)>, StorageError> {
    let raw = match h.get("x-ms-range").or_else(|| h.get(header::RANGE)) {
        Some(v) => v.to_str().unwrap_or(""),
        None => return Ok(None),
    };
    let bad = || {
        err(
            StatusCode::BAD_REQUEST,
            "InvalidHeaderValue",
            &format!("The value for one of the HTTP headers is not in the correct format: range '{raw}'."),
        )
    };
    let spec = raw.trim().strip_prefix("bytes=").ok_or_else(bad)?;
    let (s, e) = spec.split_once('-').ok_or_else(bad)?;
    let start: u64 = s.trim().parse().map_err(|_| bad())?;
    let end = if e.trim().is_empty() {
        None
    } else {
        Some(e.trim().parse::<u64>().map_err(|_| bad())?)
    };
    if end.is_some_and(|e| e < start) {
        return Err(bad());
    }
    Ok(Some((start, end)))
}

pub(super) fn set(h: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(name, v);
    }
}

pub(super) fn common_headers(resp: &mut Response, now: i64) {
    let h = resp.headers_mut();
    set(h, "x-ms-request-id", &uuid::Uuid::new_v4().to_string());
    set(h, "x-ms-version", SERVICE_VERSION);
    // Azure sends it on every response, and the SDK's Set Blob Metadata insists on it.
    set(h, "server", "Windows-Azure-Blob/1.0 Microsoft-HTTPAPI/2.0");
    // On the emulator's clock, like Last-Modified and Creation-Time (Azure's are one clock).
    set(h, "date", &rfc1123(now));
}

pub(super) fn blob_headers(h: &mut HeaderMap, b: &Blob, now: i64) {
    set(h, "etag", &b.etag);
    set(h, "last-modified", &rfc1123(b.last_modified));
    set(h, "x-ms-creation-time", &rfc1123(b.created));
    set(h, "content-type", &b.content_type);
    set(h, "accept-ranges", "bytes");
    set(h, "x-ms-server-encrypted", "true");
    match &b.content {
        Content::Page { .. } => {
            set(h, "x-ms-blob-type", "PageBlob");
            set(
                h,
                "x-ms-blob-sequence-number",
                &b.sequence_number.to_string(),
            );
        }
        Content::Block { .. } => {
            set(h, "x-ms-blob-type", "BlockBlob");
            set(h, "x-ms-access-tier", "Hot");
            set(h, "x-ms-access-tier-inferred", "true");
        }
    }
    let (status, state, duration) = lease_view(b, now);
    set(h, "x-ms-lease-status", status);
    set(h, "x-ms-lease-state", state);
    if let Some(d) = duration {
        set(h, "x-ms-lease-duration", d);
    }
    for (k, v) in &b.metadata {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(format!("x-ms-meta-{k}").as_bytes()),
            HeaderValue::from_str(v),
        ) {
            h.insert(name, value);
        }
    }
}

pub(super) fn container_not_found() -> StorageError {
    err(
        StatusCode::NOT_FOUND,
        "ContainerNotFound",
        "The specified container does not exist.",
    )
}

pub(super) fn blob_not_found() -> StorageError {
    err(
        StatusCode::NOT_FOUND,
        "BlobNotFound",
        "The specified blob does not exist.",
    )
}

pub(super) fn xml_response(status: StatusCode, body: String) -> Response {
    let mut resp = (status, body).into_response();
    set(resp.headers_mut(), "content-type", "application/xml");
    resp
}
