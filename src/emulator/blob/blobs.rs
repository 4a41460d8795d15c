//! Blobs: Put Blob (page blobs created empty, block blobs in one request), Put Page (update and
//! clear), Get Page Ranges, ranged reads, properties, Get/Set Blob Metadata, delete.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::http::{
    blob_headers, blob_not_found, checked_metadata, container_not_found, err, header_str,
    invalid_header_value, new_etag, parse_range, rfc1123, set, xml_response, StorageError,
};
use super::leases::{check_read_lease, check_write_lease};
use super::router::Req;
use crate::emulator::store::{Blob, Content, Data, PAGE};
use crate::emulator::State;

const MAX_PAGE_WRITE: u64 = 4 * 1024 * 1024;
/// The largest page blob Azure stores: 8 TiB.
const MAX_PAGE_BLOB: u64 = 8 << 40;

pub(super) fn put_blob(
    state: &State,
    container: &str,
    name: &str,
    r: &Req,
) -> Result<Response, StorageError> {
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
            // A page blob is a multiple of 512 bytes and at most 8 TiB (Azure Storage docs,
            // "Understanding block blobs, append blobs, and page blobs"; issue 28 item 11).
            if !size.is_multiple_of(PAGE) || size > MAX_PAGE_BLOB {
                return Err(invalid_header_value("x-ms-blob-content-length", len_text));
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

pub(super) fn put_page(
    state: &State,
    container: &str,
    name: &str,
    r: &Req,
) -> Result<Response, StorageError> {
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

pub(super) fn page_ranges(
    state: &State,
    container: &str,
    name: &str,
    r: &Req,
) -> Result<Response, StorageError> {
    let now = state.now();
    let data = state.data();
    let b = find_blob(&data, container, name)?;
    check_read_lease(b, now, r)?;
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

/// The blob `name` in `container`: 404 ContainerNotFound or BlobNotFound as Azure answers.
fn find_blob<'a>(data: &'a Data, container: &str, name: &str) -> Result<&'a Blob, StorageError> {
    data.containers
        .get(container)
        .ok_or_else(container_not_found)?
        .blobs
        .get(name)
        .ok_or_else(blob_not_found)
}

pub(super) fn find_blob_mut<'a>(
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

pub(super) fn get_blob(
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
pub(super) fn get_metadata(
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

pub(super) fn set_metadata(
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

pub(super) fn delete_blob(
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
