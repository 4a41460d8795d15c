//! Containers: create (name rules), delete, properties, metadata, and the two lists (containers
//! of the account, blobs of a container with prefix, marker and `maxresults`).

use std::collections::BTreeMap;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::http::{
    checked_metadata, container_not_found, err, new_etag, rfc1123, set, xml, xml_response,
    StorageError,
};
use super::leases::lease_view;
use super::router::Req;
use crate::devstore::DEV_ACCOUNT;
use crate::emulator::store::{Container, Content};
use crate::emulator::State;

pub(crate) fn valid_container_name(name: &str) -> bool {
    (3..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}

pub(super) fn create_container(
    state: &State,
    name: &str,
    r: &Req,
) -> Result<Response, StorageError> {
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

pub(super) fn delete_container(state: &State, name: &str) -> Result<Response, StorageError> {
    let mut data = state.data();
    if data.containers.remove(name).is_none() {
        return Err(container_not_found());
    }
    drop(data);
    state.changed();
    Ok(StatusCode::ACCEPTED.into_response())
}

pub(super) fn container_properties(state: &State, name: &str) -> Result<Response, StorageError> {
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

pub(super) fn container_metadata(
    state: &State,
    name: &str,
    r: &Req,
) -> Result<Response, StorageError> {
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

pub(super) fn list_containers(state: &State, r: &Req) -> Result<Response, StorageError> {
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

pub(super) fn list_blobs(
    state: &State,
    container: &str,
    r: &Req,
) -> Result<Response, StorageError> {
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
