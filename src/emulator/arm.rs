//! Azure Resource Manager routes: galleries, image definitions, image versions (long-running
//! operations with provisioning and replication states), and the consumers (VMs, scale sets and
//! their instances, managed disks).

use std::collections::BTreeMap;

use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::store::{
    Content, Data, Kind, OpAction, OpFault, Operation, Resource, DEV_ACCOUNT_RESOURCE_GROUP,
};
use super::State;

/// An ARM error response: `{"error": {"code", "message", "target"?}}`.
#[derive(Debug, Clone)]
pub struct ArmError {
    pub status: StatusCode,
    pub code: String,
    pub message: String,
    pub target: Option<String>,
}

impl ArmError {
    pub fn new(status: StatusCode, code: &str, message: &str) -> Self {
        ArmError {
            status,
            code: code.to_string(),
            message: message.to_string(),
            target: None,
        }
    }

    fn target(mut self, target: &str) -> Self {
        self.target = Some(target.to_string());
        self
    }

    fn body(&self) -> Value {
        let mut err = json!({"code": self.code, "message": self.message});
        if let Some(t) = &self.target {
            err["target"] = json!(t);
        }
        json!({ "error": err })
    }
}

impl IntoResponse for ArmError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        resp.headers_mut().insert(
            "x-ms-failure-cause",
            HeaderValue::from_static(if self.status == StatusCode::UNAUTHORIZED {
                "gateway"
            } else {
                "service"
            }),
        );
        if self.status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static(
                    "Bearer authorization_uri=\"https://login.microsoftonline.com/common\", error=\"invalid_token\", error_description=\"The authentication failed because of missing 'Authorization' header.\"",
                ),
            );
        }
        resp
    }
}

fn bad(code: &str, message: &str) -> ArmError {
    ArmError::new(StatusCode::BAD_REQUEST, code, message)
}

fn conflict(code: &str, message: &str) -> ArmError {
    ArmError::new(StatusCode::CONFLICT, code, message)
}

// ---------------------------------------------------------------------------------------------
// Paths

/// A resource address parsed from an ARM path.
#[derive(Debug, Clone)]
pub(crate) struct Addr {
    pub kind: Kind,
    /// Canonical-cased id.
    pub id: String,
    pub key: String,
    pub name: String,
    pub rg_name: String,
    pub parent: Option<(Kind, String, String)>, // kind, key, name
    pub rg: String,
    pub sub: String,
    pub sub_name: String,
}

#[derive(Debug, Clone)]
pub(crate) enum Scope {
    Sub(String),
    Rg(String),
    Parent(Kind, String, String),
}

#[derive(Debug, Clone)]
pub(crate) enum Target {
    Item(Addr),
    List {
        kind: Kind,
        scope: Scope,
    },
    Operation {
        id: String,
    },
    /// `GET /subscriptions/{s}/resourceGroups/{rg}/resources` (Microsoft.Resources): every
    /// resource of the group, optionally filtered by one tag; `rg` is the lower-cased group id.
    Resources {
        rg: String,
    },
    /// `GET /subscriptions/{s}/providers/Microsoft.Storage/storageAccounts` (Storage Accounts -
    /// List); `sub` is the lower-cased subscription id.
    StorageAccounts {
        sub: String,
    },
}

/// `(subscription, resource group, name)` of a storage account resource id
/// (`/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Storage/storageAccounts/{name}`).
pub(crate) fn storage_account_parts(id: &str) -> Option<(String, String, String)> {
    let segs: Vec<&str> = id.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        [s, sub, r, rg, p, ns, t, name]
            if eq(s, "subscriptions")
                && eq(r, "resourceGroups")
                && eq(p, "providers")
                && eq(ns, "Microsoft.Storage")
                && eq(t, "storageAccounts") =>
        {
            Some((sub.to_string(), rg.to_string(), name.to_string()))
        }
        _ => None,
    }
}

fn eq(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

fn top_kind(seg: &str) -> Option<Kind> {
    [
        ("galleries", Kind::Gallery),
        ("virtualMachines", Kind::VirtualMachine),
        ("virtualMachineScaleSets", Kind::ScaleSet),
        ("disks", Kind::Disk),
    ]
    .into_iter()
    .find(|(s, _)| eq(s, seg))
    .map(|(_, k)| k)
}

fn child_of(kind: Kind) -> Option<(&'static str, Kind)> {
    match kind {
        Kind::Gallery => Some(("images", Kind::Image)),
        Kind::Image => Some(("versions", Kind::Version)),
        Kind::ScaleSet => Some(("virtualMachines", Kind::ScaleSetVm)),
        _ => None,
    }
}

fn segment(kind: Kind) -> &'static str {
    match kind {
        Kind::Gallery => "galleries",
        Kind::Image => "images",
        Kind::Version => "versions",
        Kind::VirtualMachine => "virtualMachines",
        Kind::ScaleSet => "virtualMachineScaleSets",
        Kind::ScaleSetVm => "virtualMachines",
        Kind::Disk => "disks",
    }
}

fn placeholder(kind: Kind) -> &'static str {
    match kind {
        Kind::Gallery => "{gallery}",
        Kind::Image => "{image}",
        Kind::Version => "{version}",
        Kind::VirtualMachine => "{vm}",
        Kind::ScaleSet => "{vmss}",
        Kind::ScaleSetVm => "{instance}",
        Kind::Disk => "{disk}",
    }
}

fn unknown_path(path: &str) -> ArmError {
    ArmError::new(
        StatusCode::NOT_FOUND,
        "InvalidResourceType",
        &format!("The resource type for path '{path}' could not be found in the namespace 'Microsoft.Compute'."),
    )
}

pub(crate) fn parse_target(path: &str) -> Result<Target, ArmError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if segs.len() < 4 || !eq(segs[0], "subscriptions") {
        return Err(unknown_path(path));
    }
    let sub_name = segs[1];
    let sub = format!("/subscriptions/{}", sub_name.to_lowercase());
    if segs.len() == 5
        && eq(segs[2], "providers")
        && eq(segs[3], "Microsoft.Storage")
        && eq(segs[4], "storageAccounts")
    {
        return Ok(Target::StorageAccounts { sub });
    }
    if eq(segs[2], "providers") {
        if !eq(segs[3], "Microsoft.Compute") {
            return Err(unknown_path(path));
        }
        return match &segs[4..] {
            [k] => match top_kind(k) {
                Some(kind) => Ok(Target::List {
                    kind,
                    scope: Scope::Sub(sub),
                }),
                None => Err(unknown_path(path)),
            },
            [l, _loc, o, id] if eq(l, "locations") && eq(o, "operations") => {
                Ok(Target::Operation { id: id.to_string() })
            }
            _ => Err(unknown_path(path)),
        };
    }
    if segs.len() == 5 && eq(segs[2], "resourceGroups") && eq(segs[4], "resources") {
        return Ok(Target::Resources {
            rg: format!("{sub}/resourcegroups/{}", segs[3].to_lowercase()),
        });
    }
    if segs.len() < 7
        || !eq(segs[2], "resourceGroups")
        || !eq(segs[4], "providers")
        || !eq(segs[5], "Microsoft.Compute")
    {
        return Err(unknown_path(path));
    }
    let rg_name = segs[3];
    let rg = format!("{sub}/resourcegroups/{}", rg_name.to_lowercase());
    let base =
        format!("/subscriptions/{sub_name}/resourceGroups/{rg_name}/providers/Microsoft.Compute");
    let rest = &segs[6..];
    let top = top_kind(rest[0]).ok_or_else(|| unknown_path(path))?;
    if rest.len() == 1 {
        return Ok(Target::List {
            kind: top,
            scope: Scope::Rg(rg),
        });
    }
    let mut kind = top;
    let mut name = rest[1].to_string();
    let mut id = format!("{base}/{}/{}", segment(top), name);
    let mut parent = None;
    let mut i = 2;
    loop {
        if i == rest.len() {
            return Ok(Target::Item(Addr {
                kind,
                key: id.to_lowercase(),
                id,
                name,
                rg_name: rg_name.to_string(),
                parent,
                rg,
                sub,
                sub_name: sub_name.to_string(),
            }));
        }
        let (seg, child) = child_of(kind).ok_or_else(|| unknown_path(path))?;
        if !eq(rest[i], seg) {
            return Err(unknown_path(path));
        }
        if i + 1 == rest.len() {
            return Ok(Target::List {
                kind: child,
                scope: Scope::Parent(kind, id.to_lowercase(), name),
            });
        }
        parent = Some((kind, id.to_lowercase(), name.clone()));
        name = rest[i + 1].to_string();
        id = format!("{id}/{seg}/{name}");
        kind = child;
        i += 2;
    }
}

/// The route template of an ARM path, for counters (`/subscriptions/{s}/.../versions/{version}`).
pub(crate) fn route_template(path: &str) -> String {
    let base_rg = "/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute";
    let chain = |kind: Kind| -> Vec<Kind> {
        let mut v = vec![kind];
        let mut k = kind;
        loop {
            let parent = [Kind::Gallery, Kind::Image, Kind::ScaleSet]
                .into_iter()
                .find(|p| child_of(*p).map(|c| c.1) == Some(k));
            match parent {
                Some(p) => {
                    v.insert(0, p);
                    k = p;
                }
                None => return v,
            }
        }
    };
    let items = |kinds: &[Kind]| -> String {
        kinds
            .iter()
            .map(|k| format!("/{}/{}", segment(*k), placeholder(*k)))
            .collect()
    };
    match parse_target(path) {
        Ok(Target::Item(a)) => format!("{base_rg}{}", items(&chain(a.kind))),
        Ok(Target::List { kind, scope }) => {
            let c = chain(kind);
            let prefix = items(&c[..c.len() - 1]);
            match scope {
                Scope::Sub(_) => format!(
                    "/subscriptions/{{s}}/providers/Microsoft.Compute/{}",
                    segment(kind)
                ),
                _ => format!("{base_rg}{prefix}/{}", segment(kind)),
            }
        }
        Ok(Target::Operation { .. }) => {
            "/subscriptions/{s}/providers/Microsoft.Compute/locations/{location}/operations/{id}"
                .into()
        }
        Ok(Target::Resources { .. }) => "/subscriptions/{s}/resourceGroups/{rg}/resources".into(),
        Ok(Target::StorageAccounts { .. }) => {
            "/subscriptions/{s}/providers/Microsoft.Storage/storageAccounts".into()
        }
        Err(_) => path.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Request handling

struct Ctx {
    state: State,
    /// `scheme://host[:port]` the client addressed: absolute URLs we answer with (operation
    /// URLs, `nextLink`) are built on it.
    origin: String,
    api_version: String,
    query: BTreeMap<String, String>,
    path: String,
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
    match (parts.method.clone(), target) {
        (Method::GET, Target::Operation { id }) => operation_status(&ctx, &id),
        (Method::GET, Target::Item(a)) => get_item(&ctx, &a),
        (Method::GET, Target::List { kind, scope }) => list(&ctx, kind, &scope),
        (Method::GET, Target::Resources { rg }) => resources_by_tag(&ctx, &rg),
        (Method::GET, Target::StorageAccounts { sub }) => list_storage_accounts(&ctx, &sub),
        (Method::PUT, Target::Item(a)) => {
            let body = parse_body(&bytes)?;
            if a.kind.is_gallery_kind() {
                put_gallery_kind(&ctx, &a, body)
            } else {
                put_consumer(&ctx, &a, body)
            }
        }
        (Method::PATCH, Target::Item(a)) if a.kind.is_gallery_kind() => {
            let body = parse_body(&bytes)?;
            patch_gallery_kind(&ctx, &a, body)
        }
        (Method::DELETE, Target::Item(a)) => {
            if a.kind.is_gallery_kind() {
                delete_gallery_kind(&ctx, &a)
            } else {
                delete_consumer(&ctx, &a)
            }
        }
        (m, _) => Err(ArmError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "HttpMethodNotSupported",
            &format!("The HTTP method '{m}' is not supported for this resource."),
        )),
    }
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

fn not_found(a: &Addr) -> ArmError {
    let rel =
        a.id.split_once("/providers/")
            .map(|(_, r)| r)
            .unwrap_or(&a.id);
    ArmError::new(
        StatusCode::NOT_FOUND,
        "ResourceNotFound",
        &format!(
            "The Resource '{rel}' under resource group '{}' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix",
            a.rg_name
        ),
    )
}

fn now_rfc3339(state: &State) -> String {
    state
        .now_dt()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

fn norm_location(loc: &str) -> String {
    loc.chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_lowercase()
}

// ---------------------------------------------------------------------------------------------
// Long-running operations

fn op_urls(ctx: &Ctx, sub_name: &str, location: &str, op_id: &str) -> (String, String) {
    let base = format!(
        "{}/subscriptions/{sub_name}/providers/Microsoft.Compute/locations/{}/operations/{op_id}",
        ctx.origin,
        norm_location(location)
    );
    (
        format!("{base}?api-version={}", ctx.api_version),
        format!("{base}?monitor=true&api-version={}", ctx.api_version),
    )
}

/// The long-running-operation headers as Azure sends them (REFERENCE.md "Write status and LRO
/// headers", from the recorded gallery sessions): a PUT or PATCH carries `Azure-AsyncOperation`
/// only; a DELETE carries it and `Location`.
fn lro_headers(
    resp: &mut Response,
    ctx: &Ctx,
    a: &Addr,
    location: &str,
    op_id: &str,
    action: OpAction,
    retry_after: u32,
) {
    let (async_op, loc) = op_urls(ctx, &a.sub_name, location, op_id);
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&async_op) {
        h.insert("azure-asyncoperation", v);
    }
    if action == OpAction::Delete {
        if let Ok(v) = HeaderValue::from_str(&loc) {
            h.insert(header::LOCATION, v);
        }
    }
    h.insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
}

/// `Retry-After` seconds for an operation's answers: the timing's figure for version writes
/// (Azure sent 60 s on version writes and their polls, REFERENCE.md "Write status and LRO
/// headers"), else the emulator's `Options::retry_after`.
fn op_retry_after(state: &State, data: &Data, op_id: &str) -> u32 {
    data.operations
        .get(op_id)
        .and_then(|o| o.retry_after)
        .unwrap_or(state.0.retry_after)
}

fn new_operation(data: &mut Data, state: &State, key: &str, action: OpAction) -> String {
    let id = uuid::Uuid::new_v4().to_string();
    // How long the operation takes at least, however often it is polled (REFERENCE.md
    // "Durations": gallery and definition writes ~0.1 s, a version create 7.5 min, a tags-only
    // or no-op update 2.5 min, a version DELETE 1.5 min; see `Timing`).
    let timing = state.timing();
    let (kind, creating) = data
        .resources
        .get(key)
        .map(|r| {
            (
                Some(r.kind),
                str_at(&r.body, "/properties/provisioningState") == Some("Creating"),
            )
        })
        .unwrap_or((None, false));
    let min_ms = match (kind, action) {
        (Some(Kind::Version), OpAction::Put) if creating => timing.version_create(),
        (Some(Kind::Version), OpAction::Put) => timing.version_update(),
        (Some(Kind::Version), OpAction::Delete) => timing.version_delete_ms,
        (Some(Kind::Gallery | Kind::Image), _) => timing.gallery_write_ms,
        _ => 0,
    };
    let retry_after = (kind == Some(Kind::Version) && timing.version_retry_after_s > 0)
        .then_some(timing.version_retry_after_s);
    data.operations.insert(
        id.clone(),
        Operation {
            id: id.clone(),
            resource: key.to_string(),
            action,
            status: "InProgress".into(),
            start_time: now_rfc3339(state),
            end_time: None,
            error: None,
            polls: 0,
            started_ms: now_ms(),
            min_ms,
            fault: None,
            retry_after,
        },
    );
    if let Some(r) = data.resources.get_mut(key) {
        r.op = Some(id.clone());
    }
    id
}

fn op_in_progress(data: &Data, r: &Resource) -> Option<Operation> {
    let id = r.op.as_ref()?;
    data.operations
        .get(id)
        .filter(|o| o.status == "InProgress")
        .cloned()
}

fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// One status poll of an operation: count it, and complete the operation after enough polls.
fn advance(state: &State, data: &mut Data, op_id: &str) {
    let needed = state.0.polls_to_complete;
    let Some(op) = data.operations.get_mut(op_id) else {
        return;
    };
    if op.status != "InProgress" {
        return;
    }
    op.polls += 1;
    if op.fault == Some(OpFault::Never) {
        return;
    }
    if op.polls < needed || !op_min_elapsed(op) {
        return;
    }
    complete(state, data, op_id);
}

/// Whether the operation has run at least its minimum duration (`min_ms`).
fn op_min_elapsed(op: &Operation) -> bool {
    now_ms() - op.started_ms >= op.min_ms as i64
}

/// Complete the resource's operation if it has run longer than `complete_after`.
fn settle(state: &State, data: &mut Data, key: &str) {
    let Some(op_id) = data.resources.get(key).and_then(|r| r.op.clone()) else {
        return;
    };
    // Under a timing profile an operation ends at its duration whoever polls (Azure does not
    // wait for clients); the instant timing also waits `complete_after` for unpolled ones.
    let unpolled_ok = state.timing().complete_unpolled;
    let due = data.operations.get(&op_id).is_some_and(|o| {
        o.status == "InProgress"
            && o.fault != Some(OpFault::Never)
            && op_min_elapsed(o)
            && (unpolled_ok || now_ms() - o.started_ms >= state.0.complete_after.as_millis() as i64)
    });
    if due {
        complete(state, data, &op_id);
    }
}

fn complete(state: &State, data: &mut Data, op_id: &str) {
    let Some(op) = data.operations.get(op_id).cloned() else {
        return;
    };
    let now = now_rfc3339(state);
    let mut error = None;
    if let Some(OpFault::Failed { code, message }) = &op.fault {
        // An injected failure: the resource is left Failed (a PUT's half-made version, or a
        // DELETE that did not go through), the operation reports Azure's error.
        if let Some(r) = data.resources.get_mut(&op.resource) {
            r.body["properties"]["provisioningState"] = json!("Failed");
            r.op = None;
        }
        if let Some(o) = data.operations.get_mut(op_id) {
            o.status = "Failed".into();
            o.end_time = Some(now);
            o.error = Some(json!({"code": code, "message": message}));
        }
        state.changed();
        return;
    }
    match op.action {
        OpAction::Delete => {
            if let Some(r) = data.resources.remove(&op.resource) {
                remember_deleted_child(state, data, &r);
            }
        }
        OpAction::Put => {
            if let Some(r) = data.resources.get(&op.resource) {
                // Only the create reads the source blob: a Succeeded version no longer depends
                // on it. The Azure CPI deletes `<cid>.vhd` while other CIDs keep the version and
                // later updates that version's tags (REFERENCE.md, "How the Azure CPI uses a
                // compute gallery": delete_stemcell, and the tags-only PUT of create_stemcell).
                let creating = str_at(&r.body, "/properties/provisioningState") == Some("Creating");
                if r.kind == Kind::Version && creating {
                    error = missing_source_blob(state, data, &r.body);
                }
            }
            if let Some(r) = data.resources.get_mut(&op.resource) {
                r.body["properties"]["provisioningState"] = json!(if error.is_some() {
                    "Failed"
                } else {
                    "Succeeded"
                });
                r.op = None;
            }
        }
    }
    if let Some(o) = data.operations.get_mut(op_id) {
        o.status = if error.is_some() {
            "Failed".into()
        } else {
            "Succeeded".into()
        };
        o.end_time = Some(now);
        o.error = error;
    }
    state.changed();
}

/// `(account, container, blob)` of a URL into this emulator's own blob store (its blob
/// listener, path-style), `None` for any other URL.
fn own_blob(state: &State, uri: &str) -> Option<(String, String, String)> {
    let url = url::Url::parse(uri).ok()?;
    let host_port = format!("{}:{}", url.host_str()?, url.port_or_known_default()?);
    let ours = super::lock(&state.0.blob_hosts)
        .iter()
        .any(|h| h.eq_ignore_ascii_case(&host_port));
    if !ours {
        return None;
    }
    let mut segs = url.path_segments()?;
    let account = segs.next()?.to_string();
    let container = segs.next().unwrap_or("").to_string();
    let blob: Vec<&str> = segs.collect();
    Some((
        account,
        container,
        super::blob::percent_decode(&blob.join("/")),
    ))
}

/// What is wrong with a version's source blob in this emulator's own store, as the create
/// operation reports it (`None`: nothing, or a blob elsewhere, which the emulator cannot see):
/// the blob is missing; or it is not a fixed VHD in a page blob — a block blob, a last 512 bytes
/// without the `conectix` cookie, a disk type other than fixed (2), or a size that is not a whole
/// number of MiB plus the footer, refused with `InvalidVhd` (REFERENCE.md "Source of a version
/// from a VHD": "...Disk is expected to have cookie value 'conectix'", "...must be a multiple of
/// MiB"). Whether Azure refuses these at the PUT or in the operation is unverified for gallery
/// versions (it is synchronous for managed images), so they are checked at the same moment as
/// the missing blob: when the create completes, leaving the version Failed.
fn missing_source_blob(state: &State, data: &Data, body: &Value) -> Option<Value> {
    let uri = body
        .pointer("/properties/storageProfile/osDiskImage/source/uri")?
        .as_str()?;
    let (account, container, blob) = own_blob(state, uri)?;
    let target = "galleryImageVersion.properties.storageProfile.osDiskImage.source.uri";
    let found = (account == crate::devstore::DEV_ACCOUNT)
        .then(|| data.containers.get(&container)?.blobs.get(&blob))
        .flatten();
    let Some(found) = found else {
        return Some(json!({
            "code": "InvalidParameter",
            "message": format!("The source blob {uri} is not accessible. Make sure the blob exists and the storage account allows access from the gallery."),
            "target": target
        }));
    };
    let invalid =
        |message: String| Some(json!({"code": "InvalidVhd", "message": message, "target": target}));
    let size = match &found.content {
        Content::Block { .. } => {
            return invalid(format!(
                "The source blob {uri} is a block blob. A gallery image version needs a fixed VHD uploaded as a page blob."
            ))
        }
        Content::Page { size, .. } => *size,
    };
    if size < 512 {
        return invalid(format!(
            "The source blob {uri} is too small ({size} bytes) to be a VHD: Disk is expected to have cookie value 'conectix'."
        ));
    }
    let footer = found.content.read(size - 512, size - 1);
    if footer.get(..8) != Some(b"conectix".as_slice()) {
        return invalid(format!(
            "The source blob {uri} is not a VHD: Disk is expected to have cookie value 'conectix' in its footer."
        ));
    }
    let disk_type = footer
        .get(60..64)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(0);
    if disk_type != 2 {
        return invalid(format!(
            "The VHD {uri} is not a fixed VHD (disk type {disk_type}); only fixed VHDs are supported."
        ));
    }
    let virtual_size = size - 512;
    if virtual_size % (1 << 20) != 0 {
        return invalid(format!(
            "The VHD {uri} has an unsupported virtual size of {virtual_size} bytes. The size must be a multiple of MiB (1048576 bytes)."
        ));
    }
    None
}

/// A VHD source names its storage account: `storageAccountId` is required with a blob `uri`, and
/// must name the account the uri points into (azure-rest-api-specs PR #10466, the gallery team on
/// `CreateOrUpdateASimpleGalleryImageVersionWithVHD.json`: "both the storage account resource ID
/// and the vhd uri will have to be provided ... validate the storage accounts match";
/// ansible-collections/azure #2113/#2114: blob sources need `storageAccountId` + `uri`, Azure
/// answers `InvalidParameter` otherwise). An account this emulator serves (the development
/// account behind its own blob URLs, or one the world names) must be named by its real id — its
/// resource group included — as Azure resolves the id to the account. The exact messages are
/// unverified (no public recording quotes them); the code is `InvalidParameter`.
fn check_source_account(
    state: &State,
    data: &Data,
    props: &Value,
    uri: &str,
) -> Result<(), ArmError> {
    let target =
        "galleryImageVersion.properties.storageProfile.osDiskImage.source.storageAccountId";
    let given = str_at(props, "/storageProfile/osDiskImage/source/storageAccountId")
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let Some(given) = given else {
        return Err(bad(
            "InvalidParameter",
            "Required parameter 'storageAccountId' is missing (null). A source blob uri needs the resource id of its storage account.",
        )
        .target(target));
    };
    let Some((sub, _, name)) = storage_account_parts(given) else {
        return Err(bad(
            "InvalidParameter",
            &format!("'{given}' is not a valid storage account resource id (/subscriptions/{{s}}/resourceGroups/{{rg}}/providers/Microsoft.Storage/storageAccounts/{{name}})."),
        )
        .target(target));
    };
    let own = own_blob(state, uri);
    let uri_account = match &own {
        Some((account, _, _)) => Some(account.clone()),
        None => url::Url::parse(uri).ok().and_then(|u| {
            u.host_str()?
                .split_once(".blob.")
                .map(|(a, _)| a.to_string())
        }),
    };
    if let Some(uri_account) = &uri_account {
        if !eq(uri_account, &name) {
            return Err(bad(
                "InvalidParameter",
                &format!("The storage account '{name}' named by storageAccountId is not the storage account '{uri_account}' of the source uri {uri}."),
            )
            .target(target));
        }
        let served: Vec<String> = storage_accounts_in(
            state,
            data,
            &format!("/subscriptions/{}", sub.to_lowercase()),
        )
        .iter()
        .filter_map(|a| a.get("id").and_then(Value::as_str).map(String::from))
        .filter(|id| storage_account_parts(id).is_some_and(|(_, _, n)| eq(&n, uri_account)))
        .collect();
        let known = own.is_some()
            || data.storage_accounts.iter().any(|a| {
                a.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| eq(n, uri_account))
            });
        if known && !served.iter().any(|id| eq(id, given)) {
            return Err(bad(
                "InvalidParameter",
                &format!("The storage account '{given}' was not found. Make sure storageAccountId is the resource id of the storage account holding {uri}."),
            )
            .target(target));
        }
    }
    Ok(())
}

fn operation_status(ctx: &Ctx, id: &str) -> Result<Response, ArmError> {
    let mut data = ctx.state.data();
    if !data.operations.contains_key(id) {
        return Err(ArmError::new(
            StatusCode::NOT_FOUND,
            "ResourceNotFound",
            &format!("The operation '{id}' was not found."),
        ));
    }
    advance(&ctx.state, &mut data, id);
    let key = data
        .operations
        .get(id)
        .map(|o| o.resource.clone())
        .unwrap_or_default();
    settle(&ctx.state, &mut data, &key);
    let op = data.operations.get(id).cloned().ok_or_else(|| {
        ArmError::new(
            StatusCode::NOT_FOUND,
            "ResourceNotFound",
            "operation vanished",
        )
    })?;
    let monitor = ctx.query.get("monitor").is_some_and(|v| v == "true");
    if monitor {
        // The `Location` flavour: 202 while running, then the resource (PUT) or an empty 200
        // (DELETE).
        if op.status == "InProgress" {
            let mut resp = StatusCode::ACCEPTED.into_response();
            if let Ok(v) = HeaderValue::from_str(&format!(
                "{}{}?monitor=true&api-version={}",
                ctx.origin, ctx.path, ctx.api_version
            )) {
                resp.headers_mut().insert(header::LOCATION, v);
            }
            resp.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from(op.retry_after.unwrap_or(ctx.state.0.retry_after)),
            );
            return Ok(resp);
        }
        if op.action == OpAction::Put && op.status == "Succeeded" {
            if let Some(r) = data.resources.get(&op.resource) {
                let body = render(&ctx.state, &data, r, false);
                return Ok((StatusCode::OK, axum::Json(body)).into_response());
            }
        }
        // A DELETE's Location answers 200 with an empty body once done (recorded sessions).
        if op.action == OpAction::Delete && op.status == "Succeeded" {
            return Ok(StatusCode::OK.into_response());
        }
    }
    let mut body = json!({"name": op.id, "status": op.status, "startTime": op.start_time});
    if let Some(end) = &op.end_time {
        body["endTime"] = json!(end);
    }
    if let Some(err) = &op.error {
        body["error"] = err.clone();
    }
    let mut resp = (StatusCode::OK, axum::Json(body)).into_response();
    // Polls of a version write carry Retry-After while it runs (recorded: 60 s).
    if let (Some(secs), "InProgress") = (op.retry_after, op.status.as_str()) {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    Ok(resp)
}

/// After a child's DELETE completes, GET answers 404 at once but its parent still counts it as
/// a nested resource for a while: deleting the parent is refused with 409 CannotDeleteResource
/// for ~10–20 s (azure-sdk-for-net #30258, azure-sdk-for-python #25506: a definition deleted
/// right after its version; azure-rest-api-specs #19686: ~20 s for a gallery application after
/// its version; azure-sdk-for-go #8314: a gallery after its image). Only the parent's DELETE is
/// recorded as affected: re-creating the same child name right away is not recorded as refused
/// (hashicorp/packer-plugin-azure #397 deletes a version and creates it again), so a PUT is not.
fn remember_deleted_child(state: &State, data: &mut Data, r: &Resource) {
    let lag = state.timing().delete_lag_ms;
    if lag == 0 || r.parent.is_empty() {
        return;
    }
    let now = now_ms();
    data.deleted_children.retain(|d| d.until_ms > now);
    data.deleted_children
        .push(crate::emulator::store::DeletedChild {
            parent: r.parent.clone(),
            id: nested_id(&resource_id(r)),
            until_ms: now + lag as i64,
        });
}

/// The resource's id as its body spells it.
fn resource_id(r: &Resource) -> String {
    r.body
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// A nested resource as Azure names it in CannotDeleteResource: from the provider on,
/// `Microsoft.Compute/galleries/g/images/i/versions/v`.
fn nested_id(id: &str) -> String {
    match id.find("/providers/") {
        Some(i) => id[i + "/providers/".len()..].to_string(),
        None => id.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Rendering

fn render(state: &State, data: &Data, r: &Resource, expand_replication: bool) -> Value {
    let mut body = r.body.clone();
    if r.kind == Kind::Version && expand_replication {
        let pstate = body
            .pointer("/properties/provisioningState")
            .and_then(Value::as_str)
            .unwrap_or("Unknown")
            .to_string();
        let needed = state.0.polls_to_complete.max(1);
        let running = op_in_progress(data, r);
        let polls = running.as_ref().map(|o| o.polls).unwrap_or(0);
        // Progress by time when the operation has a duration, else by polls.
        let progress_now = match &running {
            Some(o) if o.min_ms > 0 => {
                ((now_ms() - o.started_ms).max(0) as u64 * 100 / o.min_ms).min(99) as u32
            }
            _ => (polls * 100 / needed).min(99),
        };
        let regions: Vec<String> = body
            .pointer("/properties/publishingProfile/targetRegions")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|t| t.get("name").and_then(Value::as_str).map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let (aggregated, state_name, progress, details) = match pstate.as_str() {
            "Succeeded" => ("Completed", "Completed", 100, String::new()),
            "Failed" => {
                let msg = data
                    .operations
                    .values()
                    .rfind(|o| o.resource == r_key(r) && o.error.is_some())
                    .and_then(|o| o.error.as_ref())
                    .and_then(|e| e.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or("Replication failed.")
                    .to_string();
                ("Failed", "Failed", 0, msg)
            }
            "Creating" | "Updating" => ("InProgress", "Replicating", progress_now, String::new()),
            _ => ("Unknown", "Unknown", 0, String::new()),
        };
        let summary: Vec<Value> = regions
            .iter()
            .map(|reg| {
                json!({"region": reg, "state": state_name, "details": details, "progress": progress})
            })
            .collect();
        body["properties"]["replicationStatus"] =
            json!({"aggregatedState": aggregated, "summary": summary});
    }
    body
}

fn r_key(r: &Resource) -> String {
    resource_id(r).to_lowercase()
}

fn expand_replication(ctx: &Ctx) -> bool {
    ctx.query
        .iter()
        .any(|(k, v)| eq(k, "$expand") && v.to_lowercase().contains("replicationstatus"))
}

fn get_item(ctx: &Ctx, a: &Addr) -> Result<Response, ArmError> {
    let mut data = ctx.state.data();
    settle(&ctx.state, &mut data, &a.key);
    let op = data
        .resources
        .get(&a.key)
        .ok_or_else(|| not_found(a))?
        .op
        .clone();
    if let Some(op) = op {
        advance(&ctx.state, &mut data, &op);
    }
    let r = data.resources.get(&a.key).ok_or_else(|| not_found(a))?;
    let body = render(&ctx.state, &data, r, expand_replication(ctx));
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

/// Resources - List By Resource Group (Microsoft.Resources, api-version 2021-04-01; REFERENCE.md
/// "List resources by tag"): `{"value": [{id, name, type, location, tags}]}` for every resource of
/// the group, or with `$filter=tagName eq 'N' and tagValue eq 'V'` those carrying that tag (the
/// Azure CPI maps a stemcell CID to its version this way). Tag names compare case-insensitively
/// (Azure tags are); values exactly, which is unverified for Azure and the stricter reading. Any
/// other `$filter` is refused, as Azure refuses filters it cannot parse. Paged like every list
/// here (`nextLink`); the Azure CPI reads the first page only.
fn resources_by_tag(ctx: &Ctx, rg: &str) -> Result<Response, ArmError> {
    let filter = match ctx.query.get("$filter") {
        None => None,
        Some(f) => Some(parse_tag_filter(f).ok_or_else(|| {
            bad(
                "InvalidFilterInQueryString",
                &format!("Invalid $filter '{f}' specified in the query string."),
            )
        })?),
    };
    let mut data = ctx.state.data();
    settle_all(&ctx.state, &mut data);
    let skip = skip_token(ctx)?;
    let items: Vec<Value> = data
        .resources
        .values()
        // Scale-set instances are not resources of the group (they list under their scale set).
        .filter(|r| r.rg == rg && r.kind != Kind::ScaleSetVm)
        .filter(|r| {
            let Some((name, value)) = &filter else {
                return true;
            };
            r.body
                .get("tags")
                .and_then(Value::as_object)
                .is_some_and(|t| {
                    t.iter()
                        .any(|(k, v)| eq(k, name) && v.as_str() == Some(value.as_str()))
                })
        })
        .map(|r| {
            json!({
                "id": r.body.get("id").cloned().unwrap_or(Value::Null),
                "name": r.body.get("name").cloned().unwrap_or(Value::Null),
                "type": r.kind.arm_type(),
                "location": r.body.get("location").cloned().unwrap_or(Value::Null),
                "tags": r.body.get("tags").cloned().unwrap_or_else(|| json!({})),
            })
        })
        .collect();
    let page = ctx.state.0.page_size;
    let mut body =
        json!({ "value": items.iter().skip(skip).take(page).cloned().collect::<Vec<_>>() });
    if let Some(next) = next_link(ctx, skip, page, items.len()) {
        body["nextLink"] = json!(next);
    }
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

/// The storage accounts served in subscription `sub` (lower-cased id `/subscriptions/{s}`):
/// the world's, or by default the development account in [`DEV_ACCOUNT_RESOURCE_GROUP`].
fn storage_accounts_in(state: &State, data: &Data, sub: &str) -> Vec<Value> {
    let sub_name = sub.trim_start_matches("/subscriptions/");
    if data.storage_accounts.is_empty() {
        return vec![json!({
            "id": format!("/subscriptions/{sub_name}/resourceGroups/{DEV_ACCOUNT_RESOURCE_GROUP}/providers/Microsoft.Storage/storageAccounts/{}", crate::devstore::DEV_ACCOUNT),
            "name": crate::devstore::DEV_ACCOUNT,
            "type": "Microsoft.Storage/storageAccounts",
        })]
        .into_iter()
        .map(|a| storage_account_body(state, a))
        .collect();
    }
    data.storage_accounts
        .iter()
        .filter(|a| {
            a.get("id")
                .and_then(Value::as_str)
                .and_then(storage_account_parts)
                .is_some_and(|(s, _, _)| eq(&s, sub_name))
        })
        .map(|a| storage_account_body(state, a.clone()))
        .collect()
}

/// A storage account as `Storage Accounts - List` answers it (api-version 2023-05-01): id, name,
/// type, location, kind, sku and the primary blob endpoint (the emulator's own, path-style, for
/// the development account).
fn storage_account_body(state: &State, mut a: Value) -> Value {
    let name = a
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if a.get("location").is_none() {
        a["location"] = json!("westeurope");
    }
    if a.get("kind").is_none() {
        a["kind"] = json!("StorageV2");
    }
    if a.get("sku").is_none() {
        a["sku"] = json!({"name": "Standard_LRS", "tier": "Standard"});
    }
    let blob = if name == crate::devstore::DEV_ACCOUNT {
        super::lock(&state.0.blob_hosts)
            .first()
            .map(|h| format!("http://{h}/{name}/"))
            .unwrap_or_default()
    } else {
        format!("https://{name}.blob.core.windows.net/")
    };
    if a.get("properties").map_or(true, |p| !p.is_object()) {
        a["properties"] = json!({});
    }
    a["properties"]["provisioningState"] = json!("Succeeded");
    a["properties"]["primaryEndpoints"] = json!({"blob": blob});
    a
}

/// Storage Accounts - List (`GET /subscriptions/{s}/providers/Microsoft.Storage/storageAccounts`,
/// azure-rest-api-specs storage `StorageAccountList.json`): `{"value": [...]}`, paged with
/// `nextLink` like every list here.
fn list_storage_accounts(ctx: &Ctx, sub: &str) -> Result<Response, ArmError> {
    let data = ctx.state.data();
    let items = storage_accounts_in(&ctx.state, &data, sub);
    let skip = skip_token(ctx)?;
    let page = ctx.state.0.page_size;
    let mut body =
        json!({ "value": items.iter().skip(skip).take(page).cloned().collect::<Vec<_>>() });
    if let Some(next) = next_link(ctx, skip, page, items.len()) {
        body["nextLink"] = json!(next);
    }
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

/// Bring every resource with an operation in flight up to date (a list shows them as they are now).
fn settle_all(state: &State, data: &mut Data) {
    let busy: Vec<String> = data
        .resources
        .iter()
        .filter(|(_, r)| r.op.is_some())
        .map(|(k, _)| k.clone())
        .collect();
    for key in busy {
        settle(state, data, &key);
    }
}

/// Where a list page starts: its `$skiptoken` (0 without one).
fn skip_token(ctx: &Ctx) -> Result<usize, ArmError> {
    match ctx.query.get("$skiptoken") {
        Some(t) => t.parse().map_err(|_| {
            bad(
                "InvalidParameter",
                &format!("The $skiptoken '{t}' is invalid."),
            )
        }),
        None => Ok(0),
    }
}

/// The `nextLink` of a list page that starts at `skip`, when more items follow.
fn next_link(ctx: &Ctx, skip: usize, page: usize, total: usize) -> Option<String> {
    if skip + page >= total {
        return None;
    }
    let mut ser = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in &ctx.query {
        if k != "$skiptoken" {
            ser.append_pair(k, v);
        }
    }
    ser.append_pair("$skiptoken", &(skip + page).to_string());
    Some(format!("{}{}?{}", ctx.origin, ctx.path, ser.finish()))
}

/// `tagName eq 'N' and tagValue eq 'V'` (quotes doubled inside values, as OData escapes them).
fn parse_tag_filter(f: &str) -> Option<(String, String)> {
    fn quoted(s: &str) -> Option<(String, &str)> {
        let mut rest = s.trim_start().strip_prefix('\'')?;
        let mut out = String::new();
        loop {
            let i = rest.find('\'')?;
            out.push_str(&rest[..i]);
            rest = &rest[i + 1..];
            match rest.strip_prefix('\'') {
                Some(r) => {
                    out.push('\'');
                    rest = r;
                }
                None => return Some((out, rest)),
            }
        }
    }
    let rest = f.trim_start();
    let rest = rest
        .strip_prefix("tagName")?
        .trim_start()
        .strip_prefix("eq")?;
    let (name, rest) = quoted(rest)?;
    let rest = rest.trim_start().strip_prefix("and")?.trim_start();
    let rest = rest
        .strip_prefix("tagValue")?
        .trim_start()
        .strip_prefix("eq")?;
    let (value, rest) = quoted(rest)?;
    rest.trim().is_empty().then_some((name, value))
}

fn list(ctx: &Ctx, kind: Kind, scope: &Scope) -> Result<Response, ArmError> {
    let mut data = ctx.state.data();
    settle_all(&ctx.state, &mut data);
    if let Scope::Parent(pkind, pkey, pname) = scope {
        // A Flexible scale set's instances are ordinary VMs (they appear in the VM list with a
        // `virtualMachineScaleSet` reference); Azure refuses to list them as scale-set VMs
        // (REFERENCE.md "Flexible scale sets": 400 BadRequest, quoted in public issues).
        let flexible = *pkind == Kind::ScaleSet
            && data.resources.get(pkey).is_some_and(|r| {
                str_at(&r.body, "/properties/orchestrationMode")
                    .is_some_and(|m| m.eq_ignore_ascii_case("Flexible"))
            });
        if flexible {
            return Err(bad(
                "BadRequest",
                &format!("Operation 'VirtualMachineScaleSets.virtualMachines.GET' is not allowed on Virtual Machine Scale Set '{pname}'."),
            ));
        }
        if !data.resources.contains_key(pkey) {
            return Err(ArmError::new(
                StatusCode::NOT_FOUND,
                if *pkind == Kind::ScaleSet {
                    "ResourceNotFound"
                } else {
                    "ParentResourceNotFound"
                },
                &format!("Can not perform requested operation on nested resource. Parent resource '{pname}' not found."),
            ));
        }
    }
    let skip = skip_token(ctx)?;
    let items: Vec<&Resource> = data
        .resources
        .values()
        .filter(|r| r.kind == kind)
        .filter(|r| match scope {
            Scope::Sub(s) => &r.sub == s,
            Scope::Rg(rg) => &r.rg == rg,
            Scope::Parent(_, p, _) => &r.parent == p,
        })
        .collect();
    let page = ctx.state.0.page_size;
    let value: Vec<Value> = items
        .iter()
        .skip(skip)
        .take(page)
        .map(|r| render(&ctx.state, &data, r, false))
        .collect();
    let mut body = json!({ "value": value });
    if let Some(next) = next_link(ctx, skip, page, items.len()) {
        body["nextLink"] = json!(next);
    }
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

// ---------------------------------------------------------------------------------------------
// Gallery resources

fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

/// Check and complete a version's target regions as Azure does (REFERENCE.md "Regions"): every
/// region answered by its display name whatever the request spelled ("westeurope" → "West
/// Europe"; recorded SDK sessions of azure-libraries-for-net/-java and azure-sdk-for-python), two
/// spellings of one region refused with 400 `InvalidParameter` (terraform-provider-azurerm #7751,
/// #12332), Azure's defaults for what a region leaves out. A name missing from [`REGIONS`] is kept
/// as sent: what Azure answers for an unknown region here is unverified.
fn target_regions(regions: &mut [Value], replicas: &Value, sat: &str) -> Result<(), ArmError> {
    let target = "galleryImageVersion.properties.publishingProfile.targetRegions";
    let mut seen: Vec<String> = Vec::new();
    for r in regions.iter_mut() {
        let Some(name) = str_at(r, "/name").map(str::to_string) else {
            return Err(bad("InvalidParameter", "Every target region needs a name.").target(target));
        };
        let key = norm_location(&name);
        if seen.contains(&key) {
            return Err(bad(
                "InvalidParameter",
                "Duplicate regions are not allowed in target publishing regions.",
            )
            .target(target));
        }
        seen.push(key.clone());
        if let Some((_, display)) = REGIONS.iter().find(|(k, _)| *k == key) {
            r["name"] = json!(display);
        }
        if r.get("regionalReplicaCount").is_none() {
            r["regionalReplicaCount"] = replicas.clone();
        }
        if r.get("storageAccountType").is_none() {
            r["storageAccountType"] = json!(sat);
        }
        if r.get("excludeFromLatest").is_none() {
            r["excludeFromLatest"] = json!(false);
        }
    }
    Ok(())
}

/// Azure public regions: the name ARM accepts and the display name it answers with
/// (`az account list-locations`).
const REGIONS: &[(&str, &str)] = &[
    ("eastus", "East US"),
    ("eastus2", "East US 2"),
    ("southcentralus", "South Central US"),
    ("westus2", "West US 2"),
    ("westus3", "West US 3"),
    ("australiaeast", "Australia East"),
    ("southeastasia", "Southeast Asia"),
    ("northeurope", "North Europe"),
    ("swedencentral", "Sweden Central"),
    ("uksouth", "UK South"),
    ("westeurope", "West Europe"),
    ("centralus", "Central US"),
    ("southafricanorth", "South Africa North"),
    ("centralindia", "Central India"),
    ("eastasia", "East Asia"),
    ("japaneast", "Japan East"),
    ("koreacentral", "Korea Central"),
    ("canadacentral", "Canada Central"),
    ("francecentral", "France Central"),
    ("germanywestcentral", "Germany West Central"),
    ("italynorth", "Italy North"),
    ("norwayeast", "Norway East"),
    ("polandcentral", "Poland Central"),
    ("spaincentral", "Spain Central"),
    ("switzerlandnorth", "Switzerland North"),
    ("uaenorth", "UAE North"),
    ("brazilsouth", "Brazil South"),
    ("israelcentral", "Israel Central"),
    ("qatarcentral", "Qatar Central"),
    ("northcentralus", "North Central US"),
    ("westus", "West US"),
    ("westcentralus", "West Central US"),
    ("japanwest", "Japan West"),
    ("koreasouth", "Korea South"),
    ("australiasoutheast", "Australia Southeast"),
    ("australiacentral", "Australia Central"),
    ("canadaeast", "Canada East"),
    ("ukwest", "UK West"),
    ("francesouth", "France South"),
    ("germanynorth", "Germany North"),
    ("norwaywest", "Norway West"),
    ("switzerlandwest", "Switzerland West"),
    ("southindia", "South India"),
    ("westindia", "West India"),
    ("mexicocentral", "Mexico Central"),
    ("newzealandnorth", "New Zealand North"),
];

/// Azure's tag limits, refused with 400 before anything changes (REFERENCE.md "Tags"; Azure
/// Resource Manager docs, "Use tags to organize your Azure resources", Limitations: 50 tags per
/// resource, names at most 512 characters without `<>%&\?/`, values at most 256 characters, empty
/// values allowed). The codes and wording are ARM's as Azure PowerShell's Az.Migrate module
/// reproduces them client-side (`InvalidTags`, `InvalidTagName`, `InvalidTagNameCharacters`,
/// `InvalidTagValueLength`).
fn check_tags(tags: &Value) -> Result<(), ArmError> {
    let Some(map) = tags.as_object() else {
        return Err(bad("InvalidParameter", "'tags' must be an object of strings.").target("tags"));
    };
    if map.len() > 50 {
        return Err(bad(
            "InvalidTags",
            &format!("Too many tags specified. Requested tag count - '{}'. Maximum number of tags allowed - '50'.", map.len()),
        ));
    }
    for (k, v) in map {
        if k.trim().is_empty() {
            return Err(bad("InvalidTagName", "The tag name must be non-null, non-empty and non-whitespace only. Please provide an actual value."));
        }
        if k.chars().count() > 512 {
            return Err(bad("InvalidTagName", &format!("Tag key too large. Following tag name '{k}' exceeded the maximum length. Maximum allowed length for tag name - '512' characters.")));
        }
        if k.chars().any(|c| "<>%&\\?/".contains(c) || c.is_control()) {
            return Err(bad("InvalidTagNameCharacters", &format!("The tag names '{k}' have reserved characters '<,>,%,&,\\,?,/' or control characters.")));
        }
        let Some(v) = v.as_str() else {
            return Err(bad(
                "InvalidParameter",
                &format!("The value of tag '{k}' must be a string."),
            )
            .target("tags"));
        };
        if v.chars().count() > 256 {
            return Err(bad("InvalidTagValueLength", &format!("Tag value too large. Following tag value '{v}' exceeded the maximum length. Maximum allowed length for tag value - '256' characters.")));
        }
    }
    Ok(())
}

/// Drop JSON nulls from objects (the Rust SDK sends `"publishedDate": null` and the like).
fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

fn valid_version_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<i32>().is_ok()
        })
}

fn validate_gallery_name(a: &Addr) -> Result<(), ArmError> {
    let ok = match a.kind {
        Kind::Gallery => {
            !a.name.is_empty()
                && a.name.len() <= 80
                && a.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
                && !a.name.starts_with('.')
                && !a.name.ends_with('.')
        }
        Kind::Image => {
            !a.name.is_empty()
                && a.name.len() <= 80
                && a.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.' || c == '-')
        }
        Kind::Version => valid_version_name(&a.name),
        _ => true,
    };
    if ok {
        return Ok(());
    }
    let (what, target) = match a.kind {
        Kind::Gallery => ("gallery name", "galleryName"),
        Kind::Image => ("gallery image name", "galleryImageName"),
        _ => ("gallery image version name", "galleryImageVersionName"),
    };
    let rule = if a.kind == Kind::Version {
        "Version names must be of the form Major.Minor.Patch, each a 32-bit integer"
    } else {
        "Names may contain letters, digits, underscores and periods"
    };
    Err(bad(
        "InvalidParameter",
        &format!("The {what} '{}' is invalid. {rule}.", a.name),
    )
    .target(target))
}

fn check_not_busy(data: &Data, r: &Resource, a: &Addr, what: &str) -> Result<(), ArmError> {
    if let Some(op) = op_in_progress(data, r) {
        let pstate = str_at(&r.body, "/properties/provisioningState").unwrap_or("InProgress");
        let verb = if op.action == OpAction::Delete {
            "deleting"
        } else {
            "updating"
        };
        return Err(conflict(
            "OperationNotAllowed",
            &format!(
                "Operation '{what}' is not allowed on {} '{}' since it is {verb} (provisioning state '{pstate}'). Retry after the operation completes.",
                kind_label(a.kind), a.name
            ),
        ));
    }
    Ok(())
}

fn kind_label(kind: Kind) -> &'static str {
    match kind {
        Kind::Gallery => "Gallery",
        Kind::Image => "Gallery Image",
        Kind::Version => "Gallery Image Version",
        Kind::VirtualMachine => "Virtual Machine",
        Kind::ScaleSet => "Virtual Machine Scale Set",
        Kind::ScaleSetVm => "Virtual Machine Scale Set VM",
        Kind::Disk => "Disk",
    }
}

fn put_gallery_kind(
    ctx: &Ctx,
    a: &Addr,
    mut body: Map<String, Value>,
) -> Result<Response, ArmError> {
    validate_gallery_name(a)?;
    let mut input = Value::Object(std::mem::take(&mut body));
    strip_nulls(&mut input);
    let location = str_at(&input, "/location")
        .filter(|l| !l.trim().is_empty())
        .ok_or_else(|| {
            bad(
                "LocationRequired",
                "The location property is required for this definition.",
            )
        })?
        .to_string();
    let mut data = ctx.state.data();
    // Parent must exist, in the same location.
    if let Some((_, pkey, pname)) = &a.parent {
        let parent = data.resources.get(pkey).ok_or_else(|| {
            ArmError::new(
                StatusCode::NOT_FOUND,
                "ParentResourceNotFound",
                &format!("Can not perform requested operation on nested resource. Parent resource '{pname}' not found."),
            )
        })?;
        let ploc = str_at(&parent.body, "/location").unwrap_or("");
        if norm_location(ploc) != norm_location(&location) {
            return Err(bad(
                "InvalidParameter",
                &format!("The resource location '{location}' must match the location '{ploc}' of its parent '{pname}'."),
            )
            .target("location"));
        }
    }
    settle(&ctx.state, &mut data, &a.key);
    let existing = data.resources.get(&a.key).cloned();
    if let Some(r) = &existing {
        check_not_busy(&data, r, a, "PUT")?;
        if norm_location(str_at(&r.body, "/location").unwrap_or("")) != norm_location(&location) {
            return Err(conflict(
                "PropertyChangeNotAllowed",
                "Changing property 'location' is not allowed.",
            )
            .target("location"));
        }
    }
    let properties = input
        .get("properties")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if !properties.is_object() {
        return Err(bad("InvalidParameter", "'properties' must be an object.").target("properties"));
    }
    let props = match a.kind {
        Kind::Gallery => gallery_properties(a, properties),
        Kind::Image => image_properties(&data, a, properties, existing.as_ref())?,
        _ => version_properties(ctx, &data, properties, &location, existing.as_ref())?,
    };
    let mut props = props;
    let new = existing.is_none();
    props["provisioningState"] = json!(if new { "Creating" } else { "Updating" });
    let mut stored = json!({
        "id": existing.as_ref().and_then(|r| r.body.get("id").cloned()).unwrap_or(json!(a.id)),
        "name": existing.as_ref().and_then(|r| r.body.get("name").cloned()).unwrap_or(json!(a.name)),
        "type": a.kind.arm_type(),
        "location": existing.as_ref().and_then(|r| r.body.get("location").cloned()).unwrap_or(json!(location)),
        "properties": props,
    });
    if let Some(tags) = input.get("tags") {
        check_tags(tags)?;
        stored["tags"] = tags.clone();
    }
    data.resources.insert(
        a.key.clone(),
        Resource {
            kind: a.kind,
            parent: a.parent.as_ref().map(|p| p.1.clone()).unwrap_or_default(),
            rg: a.rg.clone(),
            sub: a.sub.clone(),
            body: stored,
            op: None,
        },
    );
    let op = new_operation(&mut data, &ctx.state, &a.key, OpAction::Put);
    let body = data
        .resources
        .get(&a.key)
        .map(|r| render(&ctx.state, &data, r, false))
        .unwrap_or_default();
    let ra = op_retry_after(&ctx.state, &data, &op);
    drop(data);
    ctx.state.changed();
    let status = if new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut resp = (status, axum::Json(body)).into_response();
    lro_headers(&mut resp, ctx, a, &location, &op, OpAction::Put, ra);
    Ok(resp)
}

fn gallery_properties(a: &Addr, mut props: Value) -> Value {
    props["identifier"] = json!({
        "uniqueName": format!("{}-{}", a.sub_name.to_uppercase(), a.name.to_uppercase())
    });
    props
}

fn image_properties(
    data: &Data,
    a: &Addr,
    props: Value,
    existing: Option<&Resource>,
) -> Result<Value, ArmError> {
    for (field, target) in [
        ("/osType", "galleryImage.properties.osType"),
        ("/osState", "galleryImage.properties.osState"),
        (
            "/identifier/publisher",
            "galleryImage.properties.identifier.publisher",
        ),
        (
            "/identifier/offer",
            "galleryImage.properties.identifier.offer",
        ),
        ("/identifier/sku", "galleryImage.properties.identifier.sku"),
    ] {
        if str_at(&props, field).map_or(true, |s| s.trim().is_empty()) {
            return Err(bad(
                "InvalidParameter",
                &format!(
                    "Required parameter '{}' is missing (null).",
                    &target["galleryImage.".len()..]
                ),
            )
            .target(target));
        }
    }
    let ident = |v: &Value| -> (String, String, String) {
        let g = |f: &str| str_at(v, f).unwrap_or("").to_lowercase();
        (
            g("/identifier/publisher"),
            g("/identifier/offer"),
            g("/identifier/sku"),
        )
    };
    let mine = ident(&props);
    let parent = a.parent.as_ref().map(|p| p.1.as_str()).unwrap_or("");
    if let Some(other) = data.resources.iter().find(|(k, r)| {
        r.kind == Kind::Image
            && r.parent == parent
            && *k != &a.key
            && r.body.get("properties").map(ident).as_ref() == Some(&mine)
    }) {
        return Err(bad(
            "InvalidParameter",
            &format!(
                "The gallery image identifier (publisher '{}', offer '{}', sku '{}') is already used by the gallery image '{}'. Identifiers must be unique within a gallery.",
                mine.0, mine.1, mine.2,
                other.1.body.get("name").and_then(Value::as_str).unwrap_or("")
            ),
        )
        .target("galleryImage.properties.identifier"));
    }
    if let Some(r) = existing {
        let old = r.body.get("properties").cloned().unwrap_or_default();
        let norm = |v: &Value, f: &str, default: &str| -> String {
            match v.pointer(f) {
                Some(Value::String(s)) => s.to_lowercase(),
                Some(other) if !other.is_null() => {
                    let mut items: Vec<String> = other
                        .as_array()
                        .map(|a| a.iter().map(|x| x.to_string().to_lowercase()).collect())
                        .unwrap_or_else(|| vec![other.to_string().to_lowercase()]);
                    items.sort();
                    items.join(",")
                }
                _ => default.to_string(),
            }
        };
        for (field, name, default) in [
            ("/osType", "osType", ""),
            ("/osState", "osState", ""),
            ("/identifier/publisher", "identifier.publisher", ""),
            ("/identifier/offer", "identifier.offer", ""),
            ("/identifier/sku", "identifier.sku", ""),
            ("/hyperVGeneration", "hyperVGeneration", "v1"),
            ("/architecture", "architecture", "x64"),
            ("/features", "features", ""),
        ] {
            if norm(&old, field, default) != norm(&props, field, default) {
                return Err(conflict(
                    "PropertyChangeNotAllowed",
                    &format!("Changing property 'galleryImage.properties.{name}' is not allowed."),
                )
                .target(&format!("galleryImage.properties.{name}")));
            }
        }
    }
    let mut props = props;
    if props.get("hyperVGeneration").is_none() {
        props["hyperVGeneration"] = json!("V1");
    }
    if props.get("architecture").is_none() {
        props["architecture"] = json!("x64");
    }
    Ok(props)
}

fn version_properties(
    ctx: &Ctx,
    data: &Data,
    mut props: Value,
    location: &str,
    existing: Option<&Resource>,
) -> Result<Value, ArmError> {
    let old = existing.and_then(|r| r.body.get("properties").cloned());
    // Storage profile: required when new; an update may omit it (kept), but may not change it.
    if props.get("storageProfile").is_none() {
        match &old {
            Some(o) => props["storageProfile"] = o["storageProfile"].clone(),
            None => {
                return Err(bad(
                    "InvalidParameter",
                    "Required parameter 'storageProfile' is missing (null).",
                )
                .target("galleryImageVersion.properties.storageProfile"))
            }
        }
    }
    let src_uri = str_at(&props, "/storageProfile/osDiskImage/source/uri").map(String::from);
    let has_source = src_uri.is_some()
        || str_at(&props, "/storageProfile/osDiskImage/source/id").is_some()
        || str_at(&props, "/storageProfile/source/id").is_some()
        || str_at(&props, "/storageProfile/source/virtualMachineId").is_some();
    if !has_source {
        return Err(bad(
            "InvalidParameter",
            "The gallery image version needs a source: storageProfile.osDiskImage.source.uri (a VHD) or storageProfile.source.id.",
        )
        .target("galleryImageVersion.properties.storageProfile"));
    }
    if let Some(uri) = &src_uri {
        if url::Url::parse(uri).is_err() {
            return Err(bad(
                "InvalidParameter",
                &format!("The source uri '{uri}' is not a valid URL."),
            )
            .target("galleryImageVersion.properties.storageProfile.osDiskImage.source.uri"));
        }
    }
    if let (Some(uri), None) = (&src_uri, &old) {
        check_source_account(&ctx.state, data, &props, uri)?;
    }
    if let Some(o) = &old {
        for (ptr, target, ci) in [
            (
                "/storageProfile/osDiskImage/source/uri",
                "galleryImageVersion.properties.storageProfile.osDiskImage.source.uri",
                false,
            ),
            (
                "/storageProfile/osDiskImage/source/storageAccountId",
                "galleryImageVersion.properties.storageProfile.osDiskImage.source.uri",
                true,
            ),
            (
                "/storageProfile/osDiskImage/source/id",
                "galleryImageVersion.properties.storageProfile.osDiskImage.source.id",
                true,
            ),
            (
                "/storageProfile/source/id",
                "galleryImageVersion.properties.storageProfile.source.id",
                true,
            ),
        ] {
            let before = str_at(o, ptr).unwrap_or("");
            let after = str_at(&props, ptr).unwrap_or("");
            let same = if ci {
                before.eq_ignore_ascii_case(after)
            } else {
                before == after
            };
            if !same {
                return Err(conflict(
                    "PropertyChangeNotAllowed",
                    &format!("Changing property '{target}' is not allowed."),
                )
                .target(target));
            }
        }
    }
    // Publishing profile with Azure's defaults.
    let mut pp = props
        .get("publishingProfile")
        .cloned()
        .unwrap_or_else(|| json!({}));
    if !pp.is_object() {
        pp = json!({});
    }
    let replicas = pp.get("replicaCount").and_then(Value::as_i64).unwrap_or(1);
    if !(1..=100).contains(&replicas) {
        return Err(bad(
            "InvalidParameter",
            "The replica count must be between 1 and 100.",
        )
        .target("galleryImageVersion.properties.publishingProfile.replicaCount"));
    }
    let sat = str_at(&pp, "/storageAccountType")
        .unwrap_or("Standard_LRS")
        .to_string();
    pp["replicaCount"] = json!(replicas);
    pp["storageAccountType"] = json!(sat);
    if pp.get("excludeFromLatest").is_none() {
        pp["excludeFromLatest"] = json!(false);
    }
    if pp.get("replicationMode").is_none() {
        pp["replicationMode"] = json!("Full");
    }
    let mut regions = pp
        .get("targetRegions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if regions.is_empty() {
        regions.push(json!({"name": location}));
    }
    target_regions(&mut regions, &json!(replicas), &sat)?;
    pp["targetRegions"] = json!(regions);
    let published = old
        .as_ref()
        .and_then(|o| o.pointer("/publishingProfile/publishedDate").cloned())
        .unwrap_or_else(|| json!(now_rfc3339(&ctx.state)));
    pp["publishedDate"] = published;
    if let Some(o) = &old {
        let before = str_at(o, "/publishingProfile/replicationMode").unwrap_or("Full");
        let after = str_at(&pp, "/replicationMode").unwrap_or("Full");
        if !before.eq_ignore_ascii_case(after) {
            return Err(conflict(
                "PropertyChangeNotAllowed",
                "Changing property 'galleryImageVersion.properties.publishingProfile.replicationMode' is not allowed.",
            )
            .target("galleryImageVersion.properties.publishingProfile.replicationMode"));
        }
    }
    props["publishingProfile"] = pp;
    if props.get("safetyProfile").is_none() {
        props["safetyProfile"] = json!({
            "allowDeletionOfReplicatedLocations": false,
            "reportedForPolicyViolation": false
        });
    }
    if let Some(os) = props.pointer_mut("/storageProfile/osDiskImage") {
        if os.get("hostCaching").is_none() {
            os["hostCaching"] = json!("ReadWrite");
        }
        if os.get("sizeInGB").is_none() {
            if let Some(size) = source_blob_size_gb(data, src_uri.as_deref()) {
                os["sizeInGB"] = json!(size);
            }
        }
    }
    props.as_object_mut().map(|m| m.remove("replicationStatus"));
    Ok(props)
}

/// The size in GiB (rounded up) of a source blob in this emulator's blob store, if it is there.
fn source_blob_size_gb(data: &Data, uri: Option<&str>) -> Option<u64> {
    let url = url::Url::parse(uri?).ok()?;
    let mut segs = url.path_segments()?;
    if segs.next()? != crate::devstore::DEV_ACCOUNT {
        return None;
    }
    let container = segs.next()?;
    let blob = super::blob::percent_decode(&segs.collect::<Vec<_>>().join("/"));
    let len = data
        .containers
        .get(container)?
        .blobs
        .get(&blob)?
        .content
        .len();
    Some(len.div_ceil(1 << 30).max(1))
}

fn patch_gallery_kind(ctx: &Ctx, a: &Addr, body: Map<String, Value>) -> Result<Response, ArmError> {
    let mut patch = Value::Object(body);
    strip_nulls(&mut patch);
    let mut data = ctx.state.data();
    settle(&ctx.state, &mut data, &a.key);
    let r = data
        .resources
        .get(&a.key)
        .cloned()
        .ok_or_else(|| not_found(a))?;
    check_not_busy(&data, &r, a, "PATCH")?;
    let mut stored = r.body.clone();
    // No conditional write: an `If-Match` header is ignored, as Azure's gallery image versions
    // have no `etag` and their Update/CreateOrUpdate take no If-Match (azure-rest-api-specs,
    // specification/compute/resource-manager/Microsoft.Compute/GalleryRP/stable/2024-03-03/
    // GalleryRP.json, examples GalleryImageVersion_Get.json and GalleryImageVersion_Update.json).
    // The tags of a PATCH replace the whole tag set, as ARM's do.
    if let Some(tags) = patch.get("tags") {
        check_tags(tags)?;
        stored["tags"] = tags.clone();
    }
    if let Some(pp) = patch
        .pointer("/properties/publishingProfile")
        .and_then(Value::as_object)
    {
        if a.kind == Kind::Version {
            if let Some(mode) = pp.get("replicationMode").and_then(Value::as_str) {
                let before = str_at(&stored, "/properties/publishingProfile/replicationMode")
                    .unwrap_or("Full");
                if !before.eq_ignore_ascii_case(mode) {
                    return Err(conflict(
                        "PropertyChangeNotAllowed",
                        "Changing property 'galleryImageVersion.properties.publishingProfile.replicationMode' is not allowed.",
                    )
                    .target("galleryImageVersion.properties.publishingProfile.replicationMode"));
                }
            }
            for (k, v) in pp {
                if k != "publishedDate" {
                    stored["properties"]["publishingProfile"][k] = v.clone();
                }
            }
            // A region added by PATCH gets Azure's defaults, and is checked like a PUT's.
            let profile = &stored["properties"]["publishingProfile"];
            let replicas = profile.get("replicaCount").cloned().unwrap_or(json!(1));
            let sat = str_at(profile, "/storageAccountType")
                .unwrap_or("Standard_LRS")
                .to_string();
            if let Some(mut regions) = profile
                .get("targetRegions")
                .and_then(Value::as_array)
                .cloned()
            {
                target_regions(&mut regions, &replicas, &sat)?;
                stored["properties"]["publishingProfile"]["targetRegions"] = json!(regions);
            }
        }
    }
    if let Some(uri) = patch
        .pointer("/properties/storageProfile/osDiskImage/source/uri")
        .and_then(Value::as_str)
    {
        if Some(uri) != str_at(&stored, "/properties/storageProfile/osDiskImage/source/uri") {
            let t = "galleryImageVersion.properties.storageProfile.osDiskImage.source.uri";
            return Err(conflict(
                "PropertyChangeNotAllowed",
                &format!("Changing property '{t}' is not allowed."),
            )
            .target(t));
        }
    }
    stored["properties"]["provisioningState"] = json!("Updating");
    let location = str_at(&stored, "/location").unwrap_or("").to_string();
    if let Some(res) = data.resources.get_mut(&a.key) {
        res.body = stored;
    }
    let op = new_operation(&mut data, &ctx.state, &a.key, OpAction::Put);
    let body = data
        .resources
        .get(&a.key)
        .map(|r| render(&ctx.state, &data, r, false))
        .unwrap_or_default();
    let ra = op_retry_after(&ctx.state, &data, &op);
    drop(data);
    ctx.state.changed();
    let mut resp = (StatusCode::OK, axum::Json(body)).into_response();
    lro_headers(&mut resp, ctx, a, &location, &op, OpAction::Put, ra);
    Ok(resp)
}

fn delete_gallery_kind(ctx: &Ctx, a: &Addr) -> Result<Response, ArmError> {
    let mut data = ctx.state.data();
    settle(&ctx.state, &mut data, &a.key);
    let Some(r) = data.resources.get(&a.key).cloned() else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let location = str_at(&r.body, "/location").unwrap_or("").to_string();
    if let Some(op) = op_in_progress(&data, &r) {
        if op.action == OpAction::Delete {
            let mut resp = StatusCode::ACCEPTED.into_response();
            let ra = op_retry_after(&ctx.state, &data, &op.id);
            lro_headers(&mut resp, ctx, a, &location, &op.id, OpAction::Delete, ra);
            return Ok(resp);
        }
        check_not_busy(&data, &r, a, "DELETE")?;
    }
    // Nested resources: the children that exist, and those deleted within the delete lag
    // (see `remember_deleted_child`). The message is Azure's current one (gardenlinux #2036,
    // 2024; jenkins-infra/azure #1544, 2026): it names some nested resource ids.
    let now = now_ms();
    let mut children: Vec<String> = data
        .resources
        .values()
        .filter(|c| c.parent == a.key)
        .map(|c| nested_id(&resource_id(c)))
        .collect();
    children.extend(
        data.deleted_children
            .iter()
            .filter(|d| d.parent == a.key && d.until_ms > now)
            .map(|d| d.id.clone()),
    );
    if !children.is_empty() {
        return Err(conflict(
            "CannotDeleteResource",
            &format!(
                "Cannot delete resource while nested resources exist. Some existing nested resource IDs include: '{}'. Please delete all nested resources before deleting this resource.",
                children.join(", ")
            ),
        ));
    }
    if let Some(res) = data.resources.get_mut(&a.key) {
        res.body["properties"]["provisioningState"] = json!("Deleting");
    }
    let op = new_operation(&mut data, &ctx.state, &a.key, OpAction::Delete);
    let ra = op_retry_after(&ctx.state, &data, &op);
    drop(data);
    ctx.state.changed();
    let mut resp = StatusCode::ACCEPTED.into_response();
    lro_headers(&mut resp, ctx, a, &location, &op, OpAction::Delete, ra);
    Ok(resp)
}

// ---------------------------------------------------------------------------------------------
// Consumers

/// Build a stored consumer resource from a client body (also used for world files).
pub(crate) fn consumer_body(a: &Addr, input: Value) -> Value {
    let mut body = input;
    if !body.is_object() {
        body = json!({});
    }
    body["id"] = json!(a.id);
    body["name"] = json!(a.name);
    body["type"] = json!(a.kind.arm_type());
    if body.get("properties").map_or(true, |p| !p.is_object()) {
        body["properties"] = json!({});
    }
    if body.pointer("/properties/provisioningState").is_none() {
        body["properties"]["provisioningState"] = json!("Succeeded");
    }
    match a.kind {
        Kind::VirtualMachine if body.pointer("/properties/vmId").is_none() => {
            body["properties"]["vmId"] = json!(uuid::Uuid::new_v4().to_string());
        }
        Kind::ScaleSet if body.pointer("/properties/uniqueId").is_none() => {
            body["properties"]["uniqueId"] = json!(uuid::Uuid::new_v4().to_string());
        }
        Kind::ScaleSetVm => {
            body["instanceId"] = json!(a.name);
        }
        Kind::Disk if body.pointer("/properties/diskState").is_none() => {
            body["properties"]["diskState"] = json!("Unattached");
        }
        _ => {}
    }
    body
}

pub(crate) fn resource_for(a: &Addr, body: Value) -> Resource {
    Resource {
        kind: a.kind,
        parent: a.parent.as_ref().map(|p| p.1.clone()).unwrap_or_default(),
        rg: a.rg.clone(),
        sub: a.sub.clone(),
        body,
        op: None,
    }
}

fn put_consumer(ctx: &Ctx, a: &Addr, body: Map<String, Value>) -> Result<Response, ArmError> {
    let mut input = Value::Object(body);
    strip_nulls(&mut input);
    let mut data = ctx.state.data();
    if let Some((_, pkey, pname)) = &a.parent {
        if !data.resources.contains_key(pkey) {
            return Err(ArmError::new(
                StatusCode::NOT_FOUND,
                "ParentResourceNotFound",
                &format!("Can not perform requested operation on nested resource. Parent resource '{pname}' not found."),
            ));
        }
    } else if str_at(&input, "/location").map_or(true, |l| l.trim().is_empty()) {
        return Err(bad(
            "LocationRequired",
            "The location property is required for this definition.",
        ));
    }
    let new = !data.resources.contains_key(&a.key);
    let stored = consumer_body(a, input);
    data.resources
        .insert(a.key.clone(), resource_for(a, stored.clone()));
    drop(data);
    ctx.state.changed();
    let status = if new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(stored)).into_response())
}

fn delete_consumer(ctx: &Ctx, a: &Addr) -> Result<Response, ArmError> {
    let mut data = ctx.state.data();
    if data.resources.remove(&a.key).is_none() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    // A scale set takes its instances with it.
    data.resources.retain(|_, r| r.parent != a.key);
    drop(data);
    ctx.state.changed();
    Ok(StatusCode::OK.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_names_are_three_int32_parts() {
        assert!(valid_version_name("1.506.0"));
        assert!(valid_version_name("2147483647.0.0"));
        assert!(!valid_version_name("2147483648.0.0"));
        assert!(!valid_version_name("1.2"));
        assert!(!valid_version_name("1.2.3.4"));
        assert!(!valid_version_name("1.2.x"));
        assert!(!valid_version_name("-1.2.3"));
    }

    #[test]
    fn paths_parse_case_insensitively_into_ids_and_keys() {
        let t = parse_target("/SUBSCRIPTIONS/s1/resourcegroups/RG/Providers/microsoft.compute/Galleries/g/IMAGES/i/versions/1.0.0").unwrap();
        let Target::Item(a) = t else {
            panic!("item expected")
        };
        assert_eq!(a.kind, Kind::Version);
        assert_eq!(
            a.id,
            "/subscriptions/s1/resourceGroups/RG/providers/Microsoft.Compute/galleries/g/images/i/versions/1.0.0"
        );
        assert_eq!(a.parent.as_ref().map(|p| p.0), Some(Kind::Image));
        assert!(matches!(
            parse_target("/subscriptions/s/providers/Microsoft.Compute/virtualMachines"),
            Ok(Target::List {
                kind: Kind::VirtualMachine,
                scope: Scope::Sub(_)
            })
        ));
        assert!(parse_target(
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/bogus"
        )
        .is_err());
    }

    #[test]
    fn route_templates_name_the_parameters() {
        assert_eq!(
            route_template("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/images/i/versions"),
            "/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/galleries/{gallery}/images/{image}/versions"
        );
        assert_eq!(
            route_template("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/x/virtualMachines/0"),
            "/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{vmss}/virtualMachines/{instance}"
        );
    }
}
