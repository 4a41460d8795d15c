//! The Blob storage subset, path-style like Azurite (`/devstoreaccount1/{container}/{blob}`) or
//! host-style as on Azure (`Host: devstoreaccount1.blob.<anything>`, `/{container}/{blob}`):
//! containers, page blobs (create, Put Page update/clear, Get Page Ranges), block blobs via a
//! single Put Blob, ranged reads, properties and metadata (Get/Set Blob Metadata), leases,
//! delete, list.
//!
//! Requests are authorised by Shared Key (verified against the well-known development key, the
//! 2009-09-19+ string-to-sign) or by any non-empty bearer token.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use hmac::{Hmac, Mac};

use super::store::{Blob, Container, Content, Data, LeaseState, PAGE};
use super::State;
use crate::devstore::{DEV_ACCOUNT, DEV_ACCOUNT_KEY};

const MAX_PAGE_WRITE: u64 = 4 * 1024 * 1024;
const MAX_PUT_BLOB: usize = 256 * 1024 * 1024;
const SERVICE_VERSION: &str = "2021-12-02";

/// Marks a request that came host-style (`Host: devstoreaccount1.blob.<anything>`, path
/// `/{container}/{blob}`) and was rewritten to the path-style path the rest of the emulator
/// serves; Shared Key is checked against the path as the client sent it.
#[derive(Debug, Clone)]
pub(crate) struct HostStyle {
    /// The path as sent (`/{container}/{blob}`).
    pub original_path: String,
}

/// Serve host-style blob URLs (`https://{account}.blob.core.windows.net/{container}/{blob}`, the
/// form the tool uses on Azure) as well as path-style ones: a request whose `Host` is
/// `devstoreaccount1.blob.<anything>` gets the account prepended to its path (so routing, roles,
/// faults and the log see one form) and a [`HostStyle`] mark for the signature check.
pub(crate) fn host_style_to_path_style(mut req: Request) -> Request {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let host = host.rsplit_once(':').map_or(host.as_str(), |(h, port)| {
        if port.chars().all(|c| c.is_ascii_digit()) {
            h
        } else {
            host.as_str()
        }
    });
    if !host.starts_with(&format!("{DEV_ACCOUNT}.blob.")) {
        return req;
    }
    let original_path = req.uri().path().to_string();
    let path_and_query = match req.uri().query() {
        Some(q) => format!("/{DEV_ACCOUNT}{original_path}?{q}"),
        None => format!("/{DEV_ACCOUNT}{original_path}"),
    };
    let Ok(pq) = axum::http::uri::PathAndQuery::try_from(path_and_query) else {
        return req;
    };
    let mut parts = req.uri().clone().into_parts();
    parts.path_and_query = Some(pq);
    if let Ok(uri) = axum::http::Uri::from_parts(parts) {
        *req.uri_mut() = uri;
        req.extensions_mut().insert(HostStyle { original_path });
    }
    req
}

pub(crate) fn is_blob_path(path: &str) -> bool {
    let rest = path.strip_prefix('/').unwrap_or(path);
    rest == DEV_ACCOUNT || rest.starts_with(&format!("{DEV_ACCOUNT}/"))
}

/// A storage error: XML body `<Error><Code/><Message/></Error>` and `x-ms-error-code`.
#[derive(Debug, Clone)]
pub struct StorageError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
}

impl StorageError {
    pub fn new(status: StatusCode, code: &str, message: &str) -> Self {
        StorageError {
            status,
            code: code.into(),
            message: message.into(),
        }
    }
}

impl IntoResponse for StorageError {
    fn into_response(self) -> Response {
        let request_id = uuid::Uuid::new_v4();
        let body = format!(
            "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>{}</Code><Message>{}\nRequestId:{request_id}\nTime:{}</Message></Error>",
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

fn err(status: StatusCode, code: &str, message: &str) -> StorageError {
    StorageError::new(status, code, message)
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&apos;")
}

pub(crate) fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = |c: u8| (c as char).to_digit(16);
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The route template of a blob request, for counters.
pub(crate) fn route_template(path: &str, query: &str) -> String {
    let rest = path
        .strip_prefix('/')
        .and_then(|p| p.strip_prefix(DEV_ACCOUNT))
        .unwrap_or("");
    let depth = rest.split('/').filter(|s| !s.is_empty()).count().min(2);
    let base = match depth {
        0 => format!("/{DEV_ACCOUNT}"),
        1 => format!("/{DEV_ACCOUNT}/{{container}}"),
        _ => format!("/{DEV_ACCOUNT}/{{container}}/{{blob}}"),
    };
    let comp = url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "comp")
        .map(|(_, v)| v.into_owned());
    match comp {
        Some(c) => format!("{base}?comp={c}"),
        None => base,
    }
}

// ---------------------------------------------------------------------------------------------
// Shared Key

type HmacSha256 = Hmac<sha2::Sha256>;

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

/// Candidate strings-to-sign for a request (Content-Length "0" is signed as "" from 2015-02-21,
/// as "0" by older clients).
fn strings_to_sign(method: &Method, h: &HeaderMap, raw_path: &str, query: &str) -> Vec<String> {
    let mut ms: Vec<(String, String)> = h
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("x-ms-"))
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                v.to_str().unwrap_or("").trim().to_string(),
            )
        })
        .collect();
    ms.sort();
    let canon_headers: String = ms.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let mut params: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        params
            .entry(k.to_lowercase())
            .or_default()
            .push(v.into_owned());
    }
    let mut resource = format!("/{DEV_ACCOUNT}{raw_path}");
    for (k, mut vs) in params {
        vs.sort();
        resource.push_str(&format!("\n{k}:{}", vs.join(",")));
    }
    let length = header_str(h, "content-length");
    let lengths: Vec<&str> = if length == "0" {
        vec!["", "0"]
    } else {
        vec![length]
    };
    lengths
        .into_iter()
        .map(|len| {
            format!(
                "{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}{}",
                method.as_str(),
                header_str(h, "content-encoding"),
                header_str(h, "content-language"),
                len,
                header_str(h, "content-md5"),
                header_str(h, "content-type"),
                header_str(h, "date"),
                header_str(h, "if-modified-since"),
                header_str(h, "if-match"),
                header_str(h, "if-none-match"),
                header_str(h, "if-unmodified-since"),
                header_str(h, "range"),
                canon_headers,
                resource
            )
        })
        .collect()
}

fn authorize(
    method: &Method,
    h: &HeaderMap,
    raw_path: &str,
    query: &str,
) -> Result<(), StorageError> {
    let auth = header_str(h, "authorization");
    if auth.is_empty() {
        return Err(err(
            StatusCode::UNAUTHORIZED,
            "NoAuthenticationInformation",
            "Server failed to authenticate the request. Please refer to the information in the www-authenticate header.",
        ));
    }
    if let Some(token) = auth.strip_prefix("Bearer ") {
        if !token.trim().is_empty() {
            return Ok(());
        }
    }
    let failed = || {
        err(
            StatusCode::FORBIDDEN,
            "AuthenticationFailed",
            "Server failed to authenticate the request. Make sure the value of Authorization header is formed correctly including the signature.",
        )
    };
    let Some(cred) = auth.strip_prefix("SharedKey ") else {
        return Err(failed());
    };
    let (account, signature) = cred.split_once(':').ok_or_else(failed)?;
    if account != DEV_ACCOUNT {
        return Err(failed());
    }
    let signature = base64::engine::general_purpose::STANDARD
        .decode(signature.trim())
        .map_err(|_| failed())?;
    let key = base64::engine::general_purpose::STANDARD
        .decode(DEV_ACCOUNT_KEY)
        .map_err(|_| failed())?;
    for candidate in strings_to_sign(method, h, raw_path, query) {
        let mut mac = HmacSha256::new_from_slice(&key).map_err(|_| failed())?;
        mac.update(candidate.as_bytes());
        if mac.verify_slice(&signature).is_ok() {
            return Ok(());
        }
    }
    Err(failed())
}

// ---------------------------------------------------------------------------------------------
// Helpers

fn rfc1123(unix: i64) -> String {
    let t =
        time::OffsetDateTime::from_unix_timestamp(unix).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let fmt = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    t.format(&fmt).unwrap_or_default()
}

fn new_etag() -> String {
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
fn checked_metadata(h: &HeaderMap) -> Result<BTreeMap<String, String>, StorageError> {
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
fn parse_range(h: &HeaderMap) -> Result<Option<(u64, Option<u64>)>, StorageError> {
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

fn set(h: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(name, v);
    }
}

fn common_headers(resp: &mut Response, now: i64) {
    let h = resp.headers_mut();
    set(h, "x-ms-request-id", &uuid::Uuid::new_v4().to_string());
    set(h, "x-ms-version", SERVICE_VERSION);
    // Azure sends it on every response, and the SDK's Set Blob Metadata insists on it.
    set(h, "server", "Windows-Azure-Blob/1.0 Microsoft-HTTPAPI/2.0");
    // On the emulator's clock, like Last-Modified and Creation-Time (Azure's are one clock).
    set(h, "date", &rfc1123(now));
}

fn blob_headers(h: &mut HeaderMap, b: &Blob, now: i64) {
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

fn lease_view(b: &Blob, now: i64) -> (&'static str, &'static str, Option<&'static str>) {
    match b.lease.state(now) {
        LeaseState::Available => ("unlocked", "available", None),
        LeaseState::Leased { .. } => (
            "locked",
            "leased",
            Some(if b.lease.infinite {
                "infinite"
            } else {
                "fixed"
            }),
        ),
        LeaseState::Breaking { .. } => ("locked", "breaking", None),
        LeaseState::Broken => ("unlocked", "broken", None),
        LeaseState::Expired => ("unlocked", "expired", None),
    }
}

/// Writes to a leased blob need its lease id.
fn check_write_lease(b: &Blob, h: &HeaderMap, now: i64) -> Result<(), StorageError> {
    let given = h.get("x-ms-lease-id").and_then(|v| v.to_str().ok());
    match (b.lease.state(now), given) {
        (LeaseState::Leased { id } | LeaseState::Breaking { id }, Some(g)) => {
            if id.eq_ignore_ascii_case(g) {
                Ok(())
            } else {
                Err(err(
                    StatusCode::PRECONDITION_FAILED,
                    "LeaseIdMismatchWithBlobOperation",
                    "The lease ID specified did not match the lease ID for the blob.",
                ))
            }
        }
        (LeaseState::Leased { .. } | LeaseState::Breaking { .. }, None) => Err(err(
            StatusCode::PRECONDITION_FAILED,
            "LeaseIdMissing",
            "There is currently a lease on the blob and no lease ID was specified in the request.",
        )),
        (_, Some(_)) => Err(err(
            StatusCode::PRECONDITION_FAILED,
            "LeaseNotPresentWithBlobOperation",
            "There is currently no lease on the blob.",
        )),
        (_, None) => Ok(()),
    }
}

fn container_not_found() -> StorageError {
    err(
        StatusCode::NOT_FOUND,
        "ContainerNotFound",
        "The specified container does not exist.",
    )
}

fn blob_not_found() -> StorageError {
    err(
        StatusCode::NOT_FOUND,
        "BlobNotFound",
        "The specified blob does not exist.",
    )
}

fn xml_response(status: StatusCode, body: String) -> Response {
    let mut resp = (status, body).into_response();
    set(resp.headers_mut(), "content-type", "application/xml");
    resp
}

// ---------------------------------------------------------------------------------------------
// Dispatch

struct Req {
    method: Method,
    headers: HeaderMap,
    query: BTreeMap<String, String>,
    container: Option<String>,
    blob: Option<String>,
    host: String,
    body: bytes::Bytes,
}

pub(crate) async fn handle(state: State, req: Request) -> Response {
    let mut resp = match handle_inner(state.clone(), req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    common_headers(&mut resp, state.now());
    resp
}

async fn handle_inner(state: State, req: Request) -> Result<Response, StorageError> {
    let (parts, body) = req.into_parts();
    let raw_path = parts.uri.path().to_string();
    let raw_query = parts.uri.query().unwrap_or("").to_string();
    // The canonicalized resource is `/{account}` + the path as sent: host-style
    // `/{account}/{container}/{blob}`, path-style `/{account}/{account}/{container}/{blob}`
    // (Authorize with Shared Key; REFERENCE.md "Azure Storage targets").
    let signed_path = parts
        .extensions
        .get::<HostStyle>()
        .map_or(raw_path.as_str(), |h| h.original_path.as_str());
    authorize(&parts.method, &parts.headers, signed_path, &raw_query)?;
    let query: BTreeMap<String, String> = url::form_urlencoded::parse(raw_query.as_bytes())
        .map(|(k, v)| (k.to_lowercase(), v.into_owned()))
        .collect();
    let rest = raw_path
        .strip_prefix(&format!("/{DEV_ACCOUNT}"))
        .unwrap_or("")
        .trim_start_matches('/');
    let (container, blob) = match rest.split_once('/') {
        Some((c, b)) if !b.is_empty() => (Some(percent_decode(c)), Some(percent_decode(b))),
        Some((c, _)) => (Some(percent_decode(c)), None),
        None if !rest.is_empty() => (Some(percent_decode(rest)), None),
        None => (None, None),
    };
    let limit = if blob.is_some() {
        MAX_PUT_BLOB
    } else {
        1 << 20
    };
    let body = axum::body::to_bytes(body, limit).await.map_err(|_| {
        err(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestBodyTooLarge",
            "The request body is too large and exceeds the maximum permissible limit.",
        )
    })?;
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_string();
    let r = Req {
        method: parts.method,
        headers: parts.headers,
        query,
        container,
        blob,
        host,
        body,
    };
    let comp = r.query.get("comp").cloned().unwrap_or_default();
    let restype = r.query.get("restype").cloned().unwrap_or_default();
    match (&r.container, &r.blob) {
        (None, _) => match (r.method.clone(), comp.as_str()) {
            (Method::GET, "list") => list_containers(&state, &r),
            _ => Err(unsupported(&r)),
        },
        (Some(c), None) => match (r.method.clone(), restype.as_str(), comp.as_str()) {
            (Method::PUT, "container", "") => create_container(&state, c, &r),
            (Method::DELETE, "container", "") => delete_container(&state, c),
            (Method::GET | Method::HEAD, "container", "") => container_properties(&state, c),
            (Method::PUT, "container", "metadata") => container_metadata(&state, c, &r),
            (Method::GET, "container", "list") => list_blobs(&state, c, &r),
            _ => Err(unsupported(&r)),
        },
        (Some(c), Some(b)) => match (r.method.clone(), comp.as_str()) {
            (Method::PUT, "") => put_blob(&state, c, b, &r),
            (Method::PUT, "page") => {
                throttle_page_write(&state, c, b, r.body.len() as u64).await?;
                put_page(&state, c, b, &r)
            }
            (Method::GET, "pagelist") => page_ranges(&state, c, b, &r),
            (Method::GET, "") => get_blob(&state, c, b, &r, false),
            (Method::HEAD, "") => get_blob(&state, c, b, &r, true),
            (Method::PUT, "metadata") => set_metadata(&state, c, b, &r),
            (Method::GET | Method::HEAD, "metadata") => get_metadata(&state, c, b, &r),
            (Method::PUT, "lease") => lease(&state, c, b, &r),
            (Method::DELETE, "") => delete_blob(&state, c, b, &r),
            _ => Err(unsupported(&r)),
        },
    }
}

/// Azure Storage's per-page-blob targets (REFERENCE.md "Azure Storage targets": 60 MiB/s and
/// 500 requests/s per blob; beyond them 503 ServerBusy or 500 OperationTimedOut), when the timing
/// sets them (`--timing azure`): a write waits its turn at the blob's rate (a blob does not take
/// data faster than its target), and one that would queue more than the backlog (a second's
/// worth, scaled) is refused with 503 ServerBusy, body and `x-ms-error-code` as Azure sends them
/// (buckets/application #830 records `<Code>ServerBusy</Code><Message>Egress is over the account
/// limit.`; dotnet/performance #2937 "Operations per second is over the account limit."; the
/// ingress twin is the documented message for writes). Azure sends no `Retry-After` there.
async fn throttle_page_write(
    state: &State,
    container: &str,
    blob: &str,
    bytes: u64,
) -> Result<(), StorageError> {
    match state.admit_page_write(&format!("{container}/{blob}"), bytes) {
        Ok(wait) => {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            Ok(())
        }
        Err(super::timing::Admit::OverOperations) => Err(err(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServerBusy",
            "Operations per second is over the account limit.",
        )),
        Err(_) => Err(err(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServerBusy",
            "Ingress is over the account limit.",
        )),
    }
}

fn unsupported(r: &Req) -> StorageError {
    err(
        StatusCode::BAD_REQUEST,
        "UnsupportedHttpVerb",
        &format!(
            "The emulator does not support {} with these query parameters ({}).",
            r.method,
            r.query
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("&")
        ),
    )
}

// ---------------------------------------------------------------------------------------------
// Containers

pub(crate) fn valid_container_name(name: &str) -> bool {
    (3..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

fn create_container(state: &State, name: &str, r: &Req) -> Result<Response, StorageError> {
    if !valid_container_name(name) {
        return Err(err(
            StatusCode::BAD_REQUEST,
            "InvalidResourceName",
            "The specified resource name contains invalid characters.",
        ));
    }
    let now = state.now();
    let mut data = state.data();
    if data.containers.contains_key(name) {
        return Err(err(
            StatusCode::CONFLICT,
            "ContainerAlreadyExists",
            "The specified container already exists.",
        ));
    }
    let etag = new_etag();
    data.containers.insert(
        name.to_string(),
        Container {
            name: name.to_string(),
            metadata: checked_metadata(&r.headers)?,
            etag: etag.clone(),
            last_modified: now,
            blobs: BTreeMap::new(),
        },
    );
    drop(data);
    state.changed();
    let mut resp = StatusCode::CREATED.into_response();
    set(resp.headers_mut(), "etag", &etag);
    set(resp.headers_mut(), "last-modified", &rfc1123(now));
    Ok(resp)
}

fn delete_container(state: &State, name: &str) -> Result<Response, StorageError> {
    let mut data = state.data();
    if data.containers.remove(name).is_none() {
        return Err(container_not_found());
    }
    drop(data);
    state.changed();
    Ok(StatusCode::ACCEPTED.into_response())
}

fn container_properties(state: &State, name: &str) -> Result<Response, StorageError> {
    let data = state.data();
    let c = data.containers.get(name).ok_or_else(container_not_found)?;
    let mut resp = StatusCode::OK.into_response();
    let h = resp.headers_mut();
    set(h, "etag", &c.etag);
    set(h, "last-modified", &rfc1123(c.last_modified));
    set(h, "x-ms-lease-status", "unlocked");
    set(h, "x-ms-lease-state", "available");
    set(h, "x-ms-has-immutability-policy", "false");
    set(h, "x-ms-has-legal-hold", "false");
    for (k, v) in &c.metadata {
        if let (Ok(n), Ok(v)) = (
            axum::http::HeaderName::from_bytes(format!("x-ms-meta-{k}").as_bytes()),
            HeaderValue::from_str(v),
        ) {
            h.insert(n, v);
        }
    }
    Ok(resp)
}

fn container_metadata(state: &State, name: &str, r: &Req) -> Result<Response, StorageError> {
    let now = state.now();
    let mut data = state.data();
    let c = data
        .containers
        .get_mut(name)
        .ok_or_else(container_not_found)?;
    c.metadata = checked_metadata(&r.headers)?;
    c.etag = new_etag();
    c.last_modified = now;
    let etag = c.etag.clone();
    drop(data);
    state.changed();
    let mut resp = StatusCode::OK.into_response();
    set(resp.headers_mut(), "etag", &etag);
    Ok(resp)
}

fn list_containers(state: &State, r: &Req) -> Result<Response, StorageError> {
    let data = state.data();
    let prefix = r.query.get("prefix").cloned().unwrap_or_default();
    let mut out = format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?><EnumerationResults ServiceEndpoint=\"http://{}/{DEV_ACCOUNT}/\">",
        xml(&r.host)
    );
    if !prefix.is_empty() {
        out.push_str(&format!("<Prefix>{}</Prefix>", xml(&prefix)));
    }
    out.push_str("<Containers>");
    for c in data
        .containers
        .values()
        .filter(|c| c.name.starts_with(&prefix))
    {
        out.push_str(&format!(
            "<Container><Name>{}</Name><Properties><Last-Modified>{}</Last-Modified><Etag>{}</Etag><LeaseStatus>unlocked</LeaseStatus><LeaseState>available</LeaseState><HasImmutabilityPolicy>false</HasImmutabilityPolicy><HasLegalHold>false</HasLegalHold></Properties>",
            xml(&c.name),
            rfc1123(c.last_modified),
            xml(&c.etag)
        ));
        if r.query
            .get("include")
            .is_some_and(|i| i.contains("metadata"))
        {
            out.push_str("<Metadata>");
            for (k, v) in &c.metadata {
                out.push_str(&format!("<{k}>{}</{k}>", xml(v)));
            }
            out.push_str("</Metadata>");
        }
        out.push_str("</Container>");
    }
    out.push_str("</Containers><NextMarker /></EnumerationResults>");
    Ok(xml_response(StatusCode::OK, out))
}

fn list_blobs(state: &State, container: &str, r: &Req) -> Result<Response, StorageError> {
    let now = state.now();
    let data = state.data();
    let c = data
        .containers
        .get(container)
        .ok_or_else(container_not_found)?;
    let prefix = r.query.get("prefix").cloned().unwrap_or_default();
    let marker = r.query.get("marker").cloned().unwrap_or_default();
    let max: usize = match r.query.get("maxresults") {
        Some(m) => m.parse().ok().filter(|n| *n > 0).ok_or_else(|| {
            err(
                StatusCode::BAD_REQUEST,
                "OutOfRangeQueryParameterValue",
                "maxresults must be a positive integer.",
            )
        })?,
        None => 5000,
    };
    let with_meta = r
        .query
        .get("include")
        .is_some_and(|i| i.contains("metadata"));
    let names: Vec<&String> = c
        .blobs
        .keys()
        .filter(|n| n.starts_with(&prefix) && n.as_str() >= marker.as_str())
        .collect();
    let mut out = format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?><EnumerationResults ServiceEndpoint=\"http://{}/{DEV_ACCOUNT}/\" ContainerName=\"{}\">",
        xml(&r.host),
        xml(container)
    );
    if !prefix.is_empty() {
        out.push_str(&format!("<Prefix>{}</Prefix>", xml(&prefix)));
    }
    if !marker.is_empty() {
        out.push_str(&format!("<Marker>{}</Marker>", xml(&marker)));
    }
    if r.query.contains_key("maxresults") {
        out.push_str(&format!("<MaxResults>{max}</MaxResults>"));
    }
    out.push_str("<Blobs>");
    for name in names.iter().take(max) {
        let b = &c.blobs[*name];
        let (status, lstate, duration) = lease_view(b, now);
        let (blob_type, extra) = match &b.content {
            Content::Page { .. } => (
                "PageBlob",
                format!(
                    "<x-ms-blob-sequence-number>{}</x-ms-blob-sequence-number>",
                    b.sequence_number
                ),
            ),
            Content::Block { .. } => (
                "BlockBlob",
                "<AccessTier>Hot</AccessTier><AccessTierInferred>true</AccessTierInferred>"
                    .to_string(),
            ),
        };
        out.push_str(&format!(
            "<Blob><Name>{}</Name><Properties><Creation-Time>{}</Creation-Time><Last-Modified>{}</Last-Modified><Etag>{}</Etag><Content-Length>{}</Content-Length><Content-Type>{}</Content-Type>{extra}<BlobType>{blob_type}</BlobType><LeaseStatus>{status}</LeaseStatus><LeaseState>{lstate}</LeaseState>{}<ServerEncrypted>true</ServerEncrypted></Properties>",
            xml(name),
            rfc1123(b.created),
            rfc1123(b.last_modified),
            xml(&b.etag),
            b.content.len(),
            xml(&b.content_type),
            duration.map(|d| format!("<LeaseDuration>{d}</LeaseDuration>")).unwrap_or_default(),
        ));
        if with_meta {
            out.push_str("<Metadata>");
            for (k, v) in &b.metadata {
                out.push_str(&format!("<{k}>{}</{k}>", xml(v)));
            }
            out.push_str("</Metadata>");
        }
        out.push_str("</Blob>");
    }
    out.push_str("</Blobs>");
    match names.get(max) {
        Some(next) => out.push_str(&format!("<NextMarker>{}</NextMarker>", xml(next))),
        None => out.push_str("<NextMarker />"),
    }
    out.push_str("</EnumerationResults>");
    Ok(xml_response(StatusCode::OK, out))
}

// ---------------------------------------------------------------------------------------------
// Blobs

fn put_blob(state: &State, container: &str, name: &str, r: &Req) -> Result<Response, StorageError> {
    let now = state.now();
    let blob_type = header_str(&r.headers, "x-ms-blob-type");
    let content = match blob_type {
        "PageBlob" => {
            let len_text = header_str(&r.headers, "x-ms-blob-content-length");
            let size: u64 = len_text.parse().map_err(|_| {
                err(
                    StatusCode::BAD_REQUEST,
                    "MissingRequiredHeader",
                    "An HTTP header that's mandatory for this request is not specified: x-ms-blob-content-length.",
                )
            })?;
            if size % PAGE != 0 {
                return Err(err(
                    StatusCode::BAD_REQUEST,
                    "InvalidHeaderValue",
                    &format!("The value for one of the HTTP headers is not in the correct format: x-ms-blob-content-length {size} is not a multiple of 512."),
                ));
            }
            if !r.body.is_empty() {
                return Err(err(
                    StatusCode::BAD_REQUEST,
                    "InvalidInput",
                    "A page blob is created empty; write pages with Put Page.",
                ));
            }
            Content::Page {
                size,
                chunks: BTreeMap::new(),
            }
        }
        "BlockBlob" => Content::Block {
            data: r.body.to_vec(),
        },
        "" => return Err(err(
            StatusCode::BAD_REQUEST,
            "MissingRequiredHeader",
            "An HTTP header that's mandatory for this request is not specified: x-ms-blob-type.",
        )),
        other => {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "InvalidHeaderValue",
                &format!("The emulator supports PageBlob and BlockBlob, not {other}."),
            ))
        }
    };
    let content_type = [
        header_str(&r.headers, "x-ms-blob-content-type"),
        if blob_type == "BlockBlob" {
            header_str(&r.headers, "content-type")
        } else {
            ""
        },
    ]
    .into_iter()
    .find(|s| !s.is_empty())
    .unwrap_or("application/octet-stream")
    .to_string();
    let mut data = state.data();
    let c = data
        .containers
        .get_mut(container)
        .ok_or_else(container_not_found)?;
    let metadata = checked_metadata(&r.headers)?;
    let (lease, created) = match c.blobs.get(name) {
        Some(old) => {
            // Put Blob with `If-None-Match: *` on an existing blob (REFERENCE.md, Azure Storage
            // docs "Specifying conditional headers for Blob service operations").
            if header_str(&r.headers, "if-none-match").trim() == "*" {
                return Err(err(
                    StatusCode::CONFLICT,
                    "BlobAlreadyExists",
                    "The specified blob already exists.",
                ));
            }
            check_write_lease(old, &r.headers, now)?;
            (old.lease.clone(), old.created)
        }
        None => {
            if r.headers.contains_key("x-ms-lease-id") {
                return Err(blob_not_found());
            }
            (Default::default(), now)
        }
    };
    let etag = new_etag();
    c.blobs.insert(
        name.to_string(),
        Blob {
            content,
            metadata,
            content_type,
            etag: etag.clone(),
            created,
            last_modified: now,
            sequence_number: header_str(&r.headers, "x-ms-blob-sequence-number")
                .parse()
                .unwrap_or(0),
            lease,
        },
    );
    drop(data);
    state.changed();
    let mut resp = StatusCode::CREATED.into_response();
    let h = resp.headers_mut();
    set(h, "etag", &etag);
    set(h, "last-modified", &rfc1123(now));
    set(h, "x-ms-request-server-encrypted", "true");
    Ok(resp)
}

fn put_page(state: &State, container: &str, name: &str, r: &Req) -> Result<Response, StorageError> {
    let now = state.now();
    let action = header_str(&r.headers, "x-ms-page-write").to_lowercase();
    let range = parse_range(&r.headers)?.ok_or_else(|| {
        err(
            StatusCode::BAD_REQUEST,
            "MissingRequiredHeader",
            "An HTTP header that's mandatory for this request is not specified: x-ms-range.",
        )
    })?;
    let (start, end) = match range {
        (s, Some(e)) => (s, e),
        _ => {
            return Err(err(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "InvalidPageRange",
                "The page range specified is invalid: an end offset is required.",
            ))
        }
    };
    if start % PAGE != 0 || (end + 1) % PAGE != 0 {
        return Err(err(
            StatusCode::RANGE_NOT_SATISFIABLE,
            "InvalidPageRange",
            &format!("The page range specified is invalid: bytes={start}-{end} is not aligned to 512-byte pages."),
        ));
    }
    let len = end - start + 1;
    let mut data = state.data();
    let b = find_blob_mut(&mut data, container, name)?;
    check_write_lease(b, &r.headers, now)?;
    let Content::Page { size, chunks } = &mut b.content else {
        return Err(err(
            StatusCode::CONFLICT,
            "InvalidBlobType",
            "The blob type is invalid for this operation: Put Page needs a page blob.",
        ));
    };
    if end >= *size {
        return Err(err(
            StatusCode::RANGE_NOT_SATISFIABLE,
            "InvalidPageRange",
            &format!("The page range specified is invalid: bytes={start}-{end} is beyond the blob size {size}."),
        ));
    }
    match action.as_str() {
        "update" => {
            if len > MAX_PAGE_WRITE {
                return Err(err(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "RequestBodyTooLarge",
                    "The request body is too large: Put Page writes at most 4 MiB.",
                ));
            }
            if r.body.len() as u64 != len {
                return Err(err(
                    StatusCode::BAD_REQUEST,
                    "InvalidHeaderValue",
                    &format!(
                        "The range bytes={start}-{end} covers {len} bytes but the body has {}.",
                        r.body.len()
                    ),
                ));
            }
            Content::write_pages(chunks, start, &r.body);
        }
        "clear" => {
            if !r.body.is_empty() {
                return Err(err(
                    StatusCode::BAD_REQUEST,
                    "InvalidInput",
                    "A clear request must not have a body.",
                ));
            }
            Content::clear_pages(chunks, start, len);
        }
        _ => {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "InvalidHeaderValue",
                "x-ms-page-write must be update or clear.",
            ))
        }
    }
    b.etag = new_etag();
    b.last_modified = now;
    let (etag, seq) = (b.etag.clone(), b.sequence_number);
    drop(data);
    state.changed();
    let mut resp = StatusCode::CREATED.into_response();
    let h = resp.headers_mut();
    set(h, "etag", &etag);
    set(h, "last-modified", &rfc1123(now));
    set(h, "x-ms-blob-sequence-number", &seq.to_string());
    set(h, "x-ms-request-server-encrypted", "true");
    Ok(resp)
}

fn page_ranges(
    state: &State,
    container: &str,
    name: &str,
    r: &Req,
) -> Result<Response, StorageError> {
    let data = state.data();
    let b = find_blob(&data, container, name)?;
    let (lo, hi) = match parse_range(&r.headers)? {
        Some((s, e)) => (s, e.unwrap_or(u64::MAX)),
        None => (0, u64::MAX),
    };
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?><PageList>");
    for (s, e) in b.content.page_ranges(lo, hi) {
        out.push_str(&format!(
            "<PageRange><Start>{s}</Start><End>{e}</End></PageRange>"
        ));
    }
    out.push_str("</PageList>");
    let mut resp = xml_response(StatusCode::OK, out);
    let h = resp.headers_mut();
    set(h, "etag", &b.etag);
    set(h, "last-modified", &rfc1123(b.last_modified));
    set(h, "x-ms-blob-content-length", &b.content.len().to_string());
    Ok(resp)
}

/// A read that names a lease (`x-ms-lease-id`) must name the blob's active lease.
fn check_read_lease(b: &Blob, now: i64, r: &Req) -> Result<(), StorageError> {
    if let Some(given) = r.headers.get("x-ms-lease-id").and_then(|v| v.to_str().ok()) {
        match b.lease.state(now) {
            LeaseState::Leased { id } | LeaseState::Breaking { id }
                if id.eq_ignore_ascii_case(given) => {}
            _ => {
                return Err(err(
                    StatusCode::PRECONDITION_FAILED,
                    "LeaseIdMismatchWithBlobOperation",
                    "The lease ID specified did not match the lease ID for the blob.",
                ))
            }
        }
    }
    Ok(())
}

/// The blob `name` in `container`: 404 ContainerNotFound or BlobNotFound as Azure answers.
fn find_blob<'a>(data: &'a Data, container: &str, name: &str) -> Result<&'a Blob, StorageError> {
    data.containers
        .get(container)
        .ok_or_else(container_not_found)?
        .blobs
        .get(name)
        .ok_or_else(blob_not_found)
}

fn find_blob_mut<'a>(
    data: &'a mut Data,
    container: &str,
    name: &str,
) -> Result<&'a mut Blob, StorageError> {
    data.containers
        .get_mut(container)
        .ok_or_else(container_not_found)?
        .blobs
        .get_mut(name)
        .ok_or_else(blob_not_found)
}

fn get_blob(
    state: &State,
    container: &str,
    name: &str,
    r: &Req,
    head: bool,
) -> Result<Response, StorageError> {
    let now = state.now();
    let data = state.data();
    let b = find_blob(&data, container, name)?;
    check_read_lease(b, now, r)?;
    let total = b.content.len();
    let range = if head { None } else { parse_range(&r.headers)? };
    let (status, start, end) = match range {
        None => (StatusCode::OK, 0, total.saturating_sub(1)),
        Some((s, e)) => {
            if s >= total {
                return Err(err(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    "InvalidRange",
                    "The range specified is invalid for the current size of the resource.",
                ));
            }
            (
                StatusCode::PARTIAL_CONTENT,
                s,
                e.unwrap_or(total - 1).min(total - 1),
            )
        }
    };
    let bytes = if head || total == 0 {
        Vec::new()
    } else {
        b.content.read(start, end)
    };
    let length = if head || total == 0 {
        total
    } else {
        end - start + 1
    };
    let mut resp = if head {
        Response::new(Body::empty())
    } else {
        Response::new(Body::from(bytes))
    };
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    blob_headers(h, b, now);
    set(h, "content-length", &length.to_string());
    if status == StatusCode::PARTIAL_CONTENT {
        set(h, "content-range", &format!("bytes {start}-{end}/{total}"));
    }
    Ok(resp)
}

/// Get Blob Metadata (`GET`/`HEAD ?comp=metadata`): the user-defined metadata as `x-ms-meta-*`
/// headers with the blob's ETag and Last-Modified, and no body; `404 BlobNotFound` when the blob
/// is not there; a given lease id must be the active lease's
/// (learn.microsoft.com/rest/api/storageservices/get-blob-metadata).
fn get_metadata(
    state: &State,
    container: &str,
    name: &str,
    r: &Req,
) -> Result<Response, StorageError> {
    let now = state.now();
    let data = state.data();
    let b = find_blob(&data, container, name)?;
    check_read_lease(b, now, r)?;
    let mut resp = Response::new(Body::empty());
    let h = resp.headers_mut();
    set(h, "etag", &b.etag);
    set(h, "last-modified", &rfc1123(b.last_modified));
    set(h, "x-ms-server-encrypted", "true");
    for (k, v) in &b.metadata {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(format!("x-ms-meta-{k}").as_bytes()),
            HeaderValue::from_str(v),
        ) {
            h.insert(name, value);
        }
    }
    set(h, "content-length", "0");
    Ok(resp)
}

fn set_metadata(
    state: &State,
    container: &str,
    name: &str,
    r: &Req,
) -> Result<Response, StorageError> {
    let now = state.now();
    let mut data = state.data();
    let b = find_blob_mut(&mut data, container, name)?;
    check_write_lease(b, &r.headers, now)?;
    b.metadata = checked_metadata(&r.headers)?;
    b.etag = new_etag();
    b.last_modified = now;
    let etag = b.etag.clone();
    drop(data);
    state.changed();
    let mut resp = StatusCode::OK.into_response();
    set(resp.headers_mut(), "etag", &etag);
    set(resp.headers_mut(), "last-modified", &rfc1123(now));
    Ok(resp)
}

fn delete_blob(
    state: &State,
    container: &str,
    name: &str,
    r: &Req,
) -> Result<Response, StorageError> {
    let now = state.now();
    let mut data = state.data();
    let c = data
        .containers
        .get_mut(container)
        .ok_or_else(container_not_found)?;
    let b = c.blobs.get(name).ok_or_else(blob_not_found)?;
    check_write_lease(b, &r.headers, now)?;
    c.blobs.remove(name);
    drop(data);
    state.changed();
    let mut resp = StatusCode::ACCEPTED.into_response();
    set(resp.headers_mut(), "x-ms-delete-type-permanent", "true");
    Ok(resp)
}

fn lease(state: &State, container: &str, name: &str, r: &Req) -> Result<Response, StorageError> {
    let now = state.now();
    let action = header_str(&r.headers, "x-ms-lease-action").to_lowercase();
    let given = r
        .headers
        .get("x-ms-lease-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let proposed = r
        .headers
        .get("x-ms-proposed-lease-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let mut data = state.data();
    let b = find_blob_mut(&mut data, container, name)?;
    let current = b.lease.state(now);
    let mismatch = || {
        err(
            StatusCode::CONFLICT,
            "LeaseIdMismatchWithLeaseOperation",
            "The lease ID specified did not match the lease ID for the blob.",
        )
    };
    let not_present = || {
        err(
            StatusCode::CONFLICT,
            "LeaseNotPresentWithLeaseOperation",
            "There is currently no lease on the blob.",
        )
    };
    let need_id = || {
        err(
            StatusCode::BAD_REQUEST,
            "MissingRequiredHeader",
            "An HTTP header that's mandatory for this request is not specified: x-ms-lease-id.",
        )
    };
    let lease_id_of = |l: &LeaseState| match l {
        LeaseState::Leased { id } | LeaseState::Breaking { id } => Some(id.clone()),
        _ => None,
    };
    let mut status = StatusCode::OK;
    let mut out_id: Option<String> = None;
    let mut lease_time: Option<i64> = None;
    match action.as_str() {
        "acquire" => {
            let dur: i64 = header_str(&r.headers, "x-ms-lease-duration")
                .parse()
                .map_err(|_| {
                    err(
                        StatusCode::BAD_REQUEST,
                        "InvalidHeaderValue",
                        "x-ms-lease-duration must be -1 (infinite) or 15 to 60 seconds.",
                    )
                })?;
            if dur != -1 && !(15..=60).contains(&dur) {
                return Err(err(
                    StatusCode::BAD_REQUEST,
                    "InvalidHeaderValue",
                    &format!("x-ms-lease-duration {dur} is invalid: use -1 (infinite) or 15 to 60 seconds."),
                ));
            }
            let id = proposed.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            match &current {
                LeaseState::Leased { id: cur } if !cur.eq_ignore_ascii_case(&id) => {
                    return Err(err(
                        StatusCode::CONFLICT,
                        "LeaseAlreadyPresent",
                        "There is already a lease present.",
                    ))
                }
                LeaseState::Breaking { .. } => {
                    return Err(err(
                        StatusCode::CONFLICT,
                        "LeaseIsBreakingAndCannotBeAcquired",
                        "There is already a breaking lease present.",
                    ))
                }
                _ => {}
            }
            b.lease = super::store::Lease {
                id: Some(id.clone()),
                expires: (dur != -1).then_some(now + dur),
                infinite: dur == -1,
                duration: dur,
                ..Default::default()
            };
            status = StatusCode::CREATED;
            out_id = Some(id);
        }
        "renew" => {
            let g = given.ok_or_else(need_id)?;
            let same = b
                .lease
                .id
                .as_deref()
                .is_some_and(|id| id.eq_ignore_ascii_case(&g));
            match &current {
                LeaseState::Breaking { .. } | LeaseState::Broken => {
                    return Err(err(
                        StatusCode::CONFLICT,
                        "LeaseIsBrokenAndCannotBeRenewed",
                        "The lease ID matched, but the lease has been broken explicitly and cannot be renewed.",
                    ))
                }
                LeaseState::Available => return Err(not_present()),
                _ if !same => return Err(mismatch()),
                _ => {}
            }
            // A renewal restarts the lease for the duration it was acquired with.
            b.lease.expires = (!b.lease.infinite).then_some(now + b.lease.duration);
            b.lease.expired = false;
            out_id = Some(g);
        }
        "release" => {
            let g = given.ok_or_else(need_id)?;
            let same = b
                .lease
                .id
                .as_deref()
                .is_some_and(|id| id.eq_ignore_ascii_case(&g));
            if b.lease.id.is_none() {
                return Err(not_present());
            }
            if !same {
                return Err(mismatch());
            }
            b.lease = Default::default();
        }
        "change" => {
            let g = given.ok_or_else(need_id)?;
            let new_id = proposed.ok_or_else(|| {
                err(
                    StatusCode::BAD_REQUEST,
                    "MissingRequiredHeader",
                    "An HTTP header that's mandatory for this request is not specified: x-ms-proposed-lease-id.",
                )
            })?;
            match lease_id_of(&current) {
                Some(cur) if matches!(current, LeaseState::Leased { .. }) => {
                    if !cur.eq_ignore_ascii_case(&g) && !cur.eq_ignore_ascii_case(&new_id) {
                        return Err(mismatch());
                    }
                }
                _ => return Err(not_present()),
            }
            b.lease.id = Some(new_id.clone());
            out_id = Some(new_id);
        }
        "break" => {
            let period: Option<i64> = match r.headers.get("x-ms-lease-break-period") {
                Some(v) => {
                    let p = v
                        .to_str()
                        .ok()
                        .and_then(|s| s.parse::<i64>().ok())
                        .filter(|p| (0..=60).contains(p));
                    Some(p.ok_or_else(|| {
                        err(
                            StatusCode::BAD_REQUEST,
                            "InvalidHeaderValue",
                            "x-ms-lease-break-period must be 0 to 60 seconds.",
                        )
                    })?)
                }
                None => None,
            };
            match &current {
                LeaseState::Available => return Err(not_present()),
                LeaseState::Broken | LeaseState::Expired => {
                    b.lease = super::store::Lease {
                        broken: true,
                        ..Default::default()
                    };
                    lease_time = Some(0);
                }
                LeaseState::Breaking { .. } => {
                    lease_time = Some(b.lease.breaking_until.unwrap_or(now) - now);
                }
                LeaseState::Leased { .. } => {
                    let remaining = match b.lease.expires {
                        Some(exp) => exp - now,
                        None => 0,
                    };
                    let wait = match period {
                        Some(p) if b.lease.infinite => p,
                        Some(p) => p.min(remaining),
                        None => remaining,
                    };
                    if wait <= 0 {
                        b.lease = super::store::Lease {
                            broken: true,
                            ..Default::default()
                        };
                        lease_time = Some(0);
                    } else {
                        b.lease.breaking_until = Some(now + wait);
                        lease_time = Some(wait);
                    }
                }
            }
            status = StatusCode::ACCEPTED;
        }
        _ => {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "InvalidHeaderValue",
                "x-ms-lease-action must be acquire, renew, release, change or break.",
            ))
        }
    }
    let (etag, lm) = (b.etag.clone(), b.last_modified);
    drop(data);
    state.changed();
    let mut resp = status.into_response();
    let h = resp.headers_mut();
    set(h, "etag", &etag);
    set(h, "last-modified", &rfc1123(lm));
    if let Some(id) = out_id {
        set(h, "x-ms-lease-id", &id);
    }
    if let Some(t) = lease_time {
        set(h, "x-ms-lease-time", &t.max(0).to_string());
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding_handles_escapes_and_plain_text() {
        assert_eq!(percent_decode("a%20b"), "a b");
        assert_eq!(percent_decode("dir%2Ffile.vhd"), "dir/file.vhd");
        assert_eq!(percent_decode("plain"), "plain");
        assert_eq!(percent_decode("trailing%2"), "trailing%2");
    }

    #[test]
    fn the_signed_resource_is_account_then_path_then_sorted_query() {
        let mut h = HeaderMap::new();
        h.insert("x-ms-version", HeaderValue::from_static("2022-11-02"));
        h.insert(
            "x-ms-date",
            HeaderValue::from_static("Sun, 29 Nov 2026 18:00:00 GMT"),
        );
        let s = strings_to_sign(
            &Method::GET,
            &h,
            "/devstoreaccount1/c",
            "restype=container&comp=list",
        );
        assert_eq!(
            s[0],
            "GET\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:Sun, 29 Nov 2026 18:00:00 GMT\nx-ms-version:2022-11-02\n/devstoreaccount1/devstoreaccount1/c\ncomp:list\nrestype:container"
        );
    }
}
