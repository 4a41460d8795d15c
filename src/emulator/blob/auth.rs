//! Who may call: Shared Key verified against the well-known development key (the 2009-09-19+
//! string-to-sign, over the path as the client sent it, path-style or host-style), or any
//! non-empty bearer token; and the rewrite of host-style requests to the path-style form the
//! rest of the emulator serves.

use std::collections::BTreeMap;

use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode};
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};

use super::http::{err, header_str, StorageError};
use crate::devstore::{DEV_ACCOUNT, DEV_ACCOUNT_KEY};

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

type HmacSha256 = Hmac<sha2::Sha256>;

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

pub(super) fn authorize(
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

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

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
