//! The ARM front door: the bearer check, the `api-version` check, the origin the client used,
//! the JSON body, and the dispatch of each method and path to its handler. Every error leaves as
//! an [`ArmError`].

use std::collections::BTreeMap;

use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value};

use super::consumers::{delete_consumer, put_consumer, resources_by_tag};
use super::eq;
use super::gallery::{delete_gallery_kind, patch_gallery_kind, put_gallery_kind};
use super::locks;
use super::lro::operation_status;
use super::paths::{parse_target, Target};
use super::read::{get_item, list};
use super::render::{bad, ArmError};
use super::soft_delete;
use super::storage::list_storage_accounts;
use crate::emulator::store::Kind;
use crate::emulator::State;

/// One ARM request, as every handler sees it.
pub(super) struct Ctx {
    pub(super) state: State,
    /// `scheme://host[:port]` the client addressed: absolute URLs we answer with (operation
    /// URLs, `nextLink`) are built on it.
    pub(super) origin: String,
    pub(super) api_version: String,
    pub(super) query: BTreeMap<String, String>,
    pub(super) path: String,
}

pub(crate) async fn handle(state: State, req: Request) -> Response {
    match handle_inner(state, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

fn check_bearer(headers: &HeaderMap) -> Result<(), ArmError> {
    let value = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
        .unwrap_or("");
    if value.is_empty() {
        return Err(ArmError::new(
            StatusCode::UNAUTHORIZED,
            "AuthenticationFailed",
            "Authentication failed. The 'Authorization' header is missing.",
        ));
    }
    if token.is_empty() {
        return Err(ArmError::new(
            StatusCode::UNAUTHORIZED,
            "InvalidAuthenticationToken",
            "The access token is invalid: the 'Authorization' header must be 'Bearer <token>'.",
        ));
    }
    Ok(())
}

fn valid_api_version(v: &str) -> bool {
    let date = v.strip_suffix("-preview").unwrap_or(v);
    let b = date.as_bytes();
    b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit())
}

async fn handle_inner(state: State, req: Request) -> Result<Response, ArmError> {
    let (parts, body) = req.into_parts();
    check_bearer(&parts.headers)?;
    let query: BTreeMap<String, String> =
        url::form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
    let api_version = query
        .iter()
        .find(|(k, _)| eq(k, "api-version"))
        .map(|(_, v)| v.clone())
        .ok_or_else(|| {
            bad(
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            )
        })?;
    if !valid_api_version(&api_version) {
        return Err(bad(
            "InvalidApiVersionParameter",
            &format!("The api-version '{api_version}' is invalid. The supported versions are like '2023-07-03'."),
        ));
    }
    let path = parts.uri.path().to_string();
    let target = parse_target(&path)?;
    let origin = request_origin(&parts.headers);
    let bytes = axum::body::to_bytes(body, 8 * 1024 * 1024)
        .await
        .map_err(|e| {
            bad(
                "InvalidRequestContent",
                &format!("The request content could not be read: {e}"),
            )
        })?;
    let ctx = Ctx {
        state,
        origin,
        api_version,
        query,
        path,
    };
    // Management locks refuse before the resource's handler sees the request, as ARM does
    // before it forwards a request to the resource provider.
    if let Target::Item(a) = &target {
        locks::refuse_if_locked(&ctx.state, &parts.method, a)?;
    }
    dispatch(&ctx, &parts.method, target, &bytes)
}

/// The handler of each method and target.
fn dispatch(
    ctx: &Ctx,
    method: &Method,
    target: Target,
    bytes: &[u8],
) -> Result<Response, ArmError> {
    match (method.clone(), target) {
        (Method::GET, Target::Operation { id }) => operation_status(ctx, &id),
        (Method::GET, Target::Item(a)) => get_item(ctx, &a),
        (
            Method::GET,
            Target::List {
                kind: Kind::SoftDeletedVersion,
                scope,
            },
        ) => soft_delete::list(ctx, &scope),
        (Method::GET, Target::List { kind, scope }) => list(ctx, kind, &scope),
        (Method::GET, Target::Resources { rg }) => resources_by_tag(ctx, &rg),
        (Method::GET, Target::StorageAccounts { sub }) => list_storage_accounts(ctx, &sub),
        (Method::PUT, Target::Item(a)) => {
            let body = parse_body(bytes)?;
            if a.kind.is_gallery_kind() {
                put_gallery_kind(ctx, &a, body)
            } else {
                put_consumer(ctx, &a, body)
            }
        }
        (Method::PATCH, Target::Item(a)) if a.kind.is_gallery_kind() => {
            let body = parse_body(bytes)?;
            patch_gallery_kind(ctx, &a, body)
        }
        (Method::DELETE, Target::Item(a)) => {
            if a.kind.is_gallery_kind() {
                delete_gallery_kind(ctx, &a)
            } else {
                delete_consumer(ctx, &a)
            }
        }
        (m, Target::Lock { scope, name }) => locks::handle(ctx, &m, &scope, name.as_deref(), bytes)
            .unwrap_or_else(|| Err(method_not_supported(&m))),
        (m, _) => Err(method_not_supported(&m)),
    }
}

fn method_not_supported(m: &Method) -> ArmError {
    ArmError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "HttpMethodNotSupported",
        &format!("The HTTP method '{m}' is not supported for this resource."),
    )
}

/// The scheme and host the client used: `X-Forwarded-Proto` / `X-Forwarded-Host` (first value)
/// when a TLS front or proxy set them, else `http` and the `Host` header. Azure answers with
/// absolute operation and `nextLink` URLs on the host the request came to (REFERENCE.md "Write
/// status and LRO headers"; DESIGN.md §5 "built from the request's `Host` header"), and behind
/// a TLS front that host is the front's.
fn request_origin(headers: &HeaderMap) -> String {
    let first = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(String::from)
    };
    let scheme = first("x-forwarded-proto")
        .filter(|p| p.eq_ignore_ascii_case("https") || p.eq_ignore_ascii_case("http"))
        .map(|p| p.to_ascii_lowercase())
        .unwrap_or_else(|| "http".into());
    let host = first("x-forwarded-host")
        .or_else(|| first(header::HOST.as_str()))
        .unwrap_or_else(|| "127.0.0.1".into());
    format!("{scheme}://{host}")
}

fn parse_body(bytes: &[u8]) -> Result<Map<String, Value>, ArmError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        bad(
            "InvalidRequestContent",
            &format!("The request content was invalid and could not be deserialized: {e}"),
        )
    })?;
    match value {
        Value::Object(m) => Ok(m),
        _ => Err(bad(
            "InvalidRequestContent",
            "The request content must be a JSON object.",
        )),
    }
}
