//! The blob front door: which paths are blob paths, the route template for the counters, the
//! request as every handler sees it ([`Req`]: method, headers, query, container, blob, body), and
//! the dispatch of method, `restype` and `comp` to the handlers. Every error leaves as a
//! [`StorageError`].

use std::collections::BTreeMap;

use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use super::auth::{authorize, HostStyle};
use super::blobs::{
    delete_blob, get_blob, get_metadata, page_ranges, put_blob, put_page, set_metadata,
};
use super::containers::{
    container_metadata, container_properties, create_container, delete_container, list_blobs,
    list_containers,
};
use super::http::{common_headers, err, StorageError};
use super::leases::lease;
use super::throttle::throttle_page_write;
use crate::devstore::DEV_ACCOUNT;
use crate::emulator::State;

const MAX_PUT_BLOB: usize = 256 * 1024 * 1024;

pub(crate) fn is_blob_path(path: &str) -> bool {
    let rest = path.strip_prefix('/').unwrap_or(path);
    rest == DEV_ACCOUNT || rest.starts_with(&format!("{DEV_ACCOUNT}/"))
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

/// One blob request, as every handler sees it.
pub(super) struct Req {
    pub(super) method: Method,
    pub(super) headers: HeaderMap,
    pub(super) query: BTreeMap<String, String>,
    pub(super) container: Option<String>,
    pub(super) blob: Option<String>,
    pub(super) host: String,
    pub(super) body: bytes::Bytes,
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
}
