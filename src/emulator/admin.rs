//! `/_emulator/`: request log, counters, faults, world, clock. Admin requests are not logged.

use std::collections::BTreeMap;

use axum::extract::State as AxState;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{lock, State};

/// One served request, as `GET /_emulator/requests` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct LoggedRequest {
    pub method: String,
    /// The path without the query string.
    pub path: String,
    /// The raw query string ("" when none).
    pub query: String,
    /// The status sent; 0 when a fault dropped the connection.
    pub status: u16,
    /// "arm" or "blob".
    pub service: String,
    /// The local port the request came in on (absent when driven without a listener).
    pub port: Option<u16>,
    /// The route template, e.g. `PUT /subscriptions/{s}/.../versions/{v}`.
    pub route: String,
}

#[derive(Debug, Default)]
pub(crate) struct Log {
    pub requests: Vec<LoggedRequest>,
    pub counters: BTreeMap<String, u64>,
    /// Faults that fired, oldest first (when the request arrived, before any delay or hold).
    pub fired: Vec<FiredFault>,
}

/// One use of a fault, as `GET /_emulator/faults` lists it under `fired`: lets a test see that a
/// held request has arrived before it acts (e.g. kills the client).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct FiredFault {
    pub method: String,
    pub path: String,
    /// The fault's `name`, when it has one.
    pub name: Option<String>,
    /// "arrived" when the request came in; a `hold_after` fault adds "served" once the request
    /// has taken effect (its response is then held).
    pub phase: String,
}

/// A fault for the next `count` requests whose method and path match.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fault {
    /// HTTP method, or "*" for any.
    #[serde(default = "star")]
    pub method: String,
    /// A substring of the path, or, when it has a `*`, a glob over the whole path (`*` matches any
    /// run of characters, e.g. `*/versions/*`). Case-insensitive.
    #[serde(default = "star")]
    pub path: String,
    /// A substring the raw query string must contain (e.g. `comp=page`). Case-insensitive.
    #[serde(default)]
    pub query: Option<String>,
    #[serde(default = "one")]
    pub count: u32,
    /// Respond with this status and Azure's error body instead of serving the request.
    #[serde(default)]
    pub status: Option<u16>,
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    /// Seconds for the `Retry-After` header.
    #[serde(default)]
    pub retry_after: Option<u32>,
    /// Wait this long before answering (or before serving the request normally).
    #[serde(default)]
    pub delay_ms: u64,
    /// Close the connection without any response.
    #[serde(default)]
    pub drop: bool,
    /// Let the first `skip` matching requests through untouched; the fault applies from the next.
    #[serde(default)]
    pub skip: u32,
    /// Serve the request first (its effect happens), then wait `delay_ms`, then answer (or drop
    /// the connection with `drop`): a response that is late or lost after the write was applied.
    #[serde(default)]
    pub hold_after: bool,
    /// Serve the request normally, but make the long-running operation it starts (a PUT, PATCH or
    /// DELETE of a gallery resource) end `"failed"` (with `code`/`message`), or `"never"` end.
    #[serde(default)]
    pub operation: Option<String>,
    /// A label echoed in the `fired` log.
    #[serde(default)]
    pub name: Option<String>,
}

impl Default for Fault {
    /// A fault on any request, once, that does nothing until a field says what (as the JSON
    /// document's defaults).
    fn default() -> Self {
        Fault {
            method: star(),
            path: star(),
            query: None,
            count: 1,
            status: None,
            code: None,
            message: None,
            retry_after: None,
            delay_ms: 0,
            drop: false,
            skip: 0,
            hold_after: false,
            operation: None,
            name: None,
        }
    }
}

fn star() -> String {
    "*".into()
}
fn one() -> u32 {
    1
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters (case as given).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut rest = text;
    for (i, part) in parts.iter().enumerate() {
        if i == 0 {
            match rest.strip_prefix(part) {
                Some(r) => rest = r,
                None => return false,
            }
        } else if i == parts.len() - 1 {
            return rest.ends_with(part);
        } else {
            match rest.find(part) {
                Some(pos) => rest = &rest[pos + part.len()..],
                None => return false,
            }
        }
    }
    rest.is_empty()
}

impl Fault {
    fn matches(&self, method: &str, path: &str, query: &str) -> bool {
        let query_ok = match &self.query {
            Some(q) => query.to_lowercase().contains(&q.to_lowercase()),
            None => true,
        };
        query_ok && self.matches_path(method, path)
    }

    fn matches_path(&self, method: &str, path: &str) -> bool {
        let method_ok = self.method == "*" || self.method.eq_ignore_ascii_case(method);
        let path_ok = if self.path.contains('*') {
            glob_match(&self.path.to_lowercase(), &path.to_lowercase())
        } else {
            path.to_lowercase().contains(&self.path.to_lowercase())
        };
        method_ok && path_ok
    }
}

/// Take one use of the first fault matching this request. A fault still skipping lets the
/// request through (and counts it).
pub(crate) fn take_fault(state: &State, method: &str, path: &str, query: &str) -> Option<Fault> {
    let mut faults = lock(&state.0.faults);
    let idx = faults.iter().position(|f| f.matches(method, path, query))?;
    if faults[idx].skip > 0 {
        faults[idx].skip -= 1;
        return None;
    }
    let fault = faults[idx].clone();
    if faults[idx].count <= 1 {
        faults.remove(idx);
    } else {
        faults[idx].count -= 1;
    }
    drop(faults);
    fired(state, method, path, &fault, "arrived");
    Some(fault)
}

fn fired(state: &State, method: &str, path: &str, fault: &Fault, phase: &str) {
    lock(&state.0.log).fired.push(FiredFault {
        method: method.to_string(),
        path: path.to_string(),
        name: fault.name.clone(),
        phase: phase.to_string(),
    });
}

/// The connection was closed without a response (a `drop` fault).
pub(crate) struct Dropped;

/// Serve a request under a fault: delay, error response, drop, serve-then-hold, or mark the
/// long-running operation the request starts.
pub(crate) async fn serve_with_fault(
    state: &State,
    f: &Fault,
    conn: Option<&super::net::Conn>,
    service: &str,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Result<Response, Dropped> {
    let delay = std::time::Duration::from_millis(f.delay_ms);
    let kill = || {
        if let Some(c) = conn {
            c.kill();
        }
    };
    if f.hold_after || f.operation.is_some() {
        let method = req.method().to_string();
        let path = req.uri().path().to_string();
        let response = super::serve_in_role(state, req, next).await;
        if let Some(outcome) = &f.operation {
            mark_operation(state, f, outcome, &response);
        }
        if f.hold_after {
            fired(state, &method, &path, f, "served");
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        }
        if f.drop {
            kill();
            return Err(Dropped);
        }
        return Ok(response);
    }
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if f.drop {
        kill();
        return Err(Dropped);
    }
    Ok(match f.status {
        Some(status) => fault_response(f, status, service),
        None => super::serve_in_role(state, req, next).await,
    })
}

/// Mark the operation named by the response's `Azure-AsyncOperation` header to end as asked.
fn mark_operation(state: &State, f: &Fault, outcome: &str, response: &Response) {
    let Some(op_id) = response
        .headers()
        .get("azure-asyncoperation")
        .and_then(|v| v.to_str().ok())
        .and_then(|u| u.split('?').next())
        .and_then(|u| u.rsplit('/').next())
        .map(str::to_string)
    else {
        return;
    };
    let fault = match outcome {
        "never" => super::store::OpFault::Never,
        _ => super::store::OpFault::Failed {
            code: f
                .code
                .clone()
                .unwrap_or_else(|| "InternalOperationError".into()),
            message: f
                .message
                .clone()
                .unwrap_or_else(|| "Injected fault: the long-running operation failed.".into()),
        },
    };
    if let Some(op) = state.data().operations.get_mut(&op_id) {
        op.fault = Some(fault);
    }
}

/// The error response a fault asks for, in the service's error format.
pub(crate) fn fault_response(f: &Fault, status: u16, service: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let code = f.code.clone().unwrap_or_else(|| match status.as_u16() {
        429 => "TooManyRequests".into(),
        500 => "InternalServerError".into(),
        503 => "ServerBusy".into(),
        _ => status
            .canonical_reason()
            .unwrap_or("Error")
            .replace(' ', ""),
    });
    let message = f
        .message
        .clone()
        .unwrap_or_else(|| format!("Injected fault: {code}."));
    let mut resp = if service == "blob" {
        super::blob::StorageError::new(status, &code, &message).into_response()
    } else {
        super::arm::ArmError::new(status, &code, &message).into_response()
    };
    if let Some(secs) = f.retry_after {
        if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
            resp.headers_mut().insert("retry-after", v);
        }
    }
    resp
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn record(
    state: &State,
    method: &str,
    path: &str,
    query: &str,
    status: u16,
    service: &str,
    port: Option<u16>,
    route: &str,
) {
    let mut log = lock(&state.0.log);
    *log.counters.entry(route.to_string()).or_default() += 1;
    log.requests.push(LoggedRequest {
        method: method.to_string(),
        path: path.to_string(),
        query: query.to_string(),
        status,
        service: service.to_string(),
        port,
        route: route.to_string(),
    });
}

pub(crate) async fn requests(AxState(state): AxState<State>) -> Json<Value> {
    let log = lock(&state.0.log);
    Json(json!({"total": log.requests.len(), "requests": log.requests}))
}

pub(crate) async fn counters(AxState(state): AxState<State>) -> Json<Value> {
    let log = lock(&state.0.log);
    let total: u64 = log.counters.values().sum();
    Json(json!({"total": total, "counters": log.counters}))
}

pub(crate) async fn reset(AxState(state): AxState<State>) -> StatusCode {
    state.reset_log();
    StatusCode::NO_CONTENT
}

fn bad_request(message: String) -> Response {
    super::arm::ArmError::new(StatusCode::BAD_REQUEST, "InvalidRequestContent", &message)
        .into_response()
}

pub(crate) async fn add_fault(AxState(state): AxState<State>, body: axum::body::Bytes) -> Response {
    let fault: Fault = match serde_json::from_slice(&body) {
        Ok(f) => f,
        Err(e) => return bad_request(format!("The fault document is invalid: {e}")),
    };
    if fault.count == 0 {
        return bad_request("The fault count must be at least 1.".into());
    }
    if let Some(s) = fault.status {
        if !(100..=599).contains(&s) {
            return bad_request(format!("The fault status {s} is not an HTTP status."));
        }
    }
    if let Some(op) = &fault.operation {
        if op != "failed" && op != "never" {
            return bad_request(format!(
                "The fault operation {op:?} is not \"failed\" or \"never\"."
            ));
        }
        if fault.status.is_some() {
            return bad_request(
                "A fault with an operation outcome serves the request; it takes no status.".into(),
            );
        }
    } else if fault.status.is_none() && !fault.drop && fault.delay_ms == 0 {
        return bad_request(
            "A fault needs a status, drop: true, a delay_ms, or an operation outcome.".into(),
        );
    }
    if fault.hold_after && fault.status.is_some() {
        return bad_request(
            "A hold_after fault serves the request; it takes no status (use drop or delay_ms)."
                .into(),
        );
    }
    state.add_fault(fault.clone());
    (StatusCode::CREATED, Json(json!(fault))).into_response()
}

/// Remove every queued fault, and release operations a fault holds: one told to never end, or to
/// fail, that is still running now completes normally.
pub(crate) async fn clear_faults(AxState(state): AxState<State>) -> StatusCode {
    lock(&state.0.faults).clear();
    for op in state.data().operations.values_mut() {
        if op.status == "InProgress" {
            op.fault = None;
        }
    }
    StatusCode::NO_CONTENT
}

pub(crate) async fn list_faults(AxState(state): AxState<State>) -> Json<Value> {
    let faults = lock(&state.0.faults).clone();
    let fired = lock(&state.0.log).fired.clone();
    Json(json!({"faults": faults, "fired": fired}))
}

pub(crate) async fn get_world(AxState(state): AxState<State>) -> Json<Value> {
    let world = super::World::snapshot(&state.data());
    Json(json!(world))
}

/// Replace the consumer resources (VMs, scale sets, instances, disks) with the document's;
/// gallery resources in the document are added or replaced, others kept.
pub(crate) async fn put_world(AxState(state): AxState<State>, body: axum::body::Bytes) -> Response {
    let world: super::World = match serde_json::from_slice(&body) {
        Ok(w) => w,
        Err(e) => return bad_request(format!("The world document is invalid: {e}")),
    };
    let result = {
        let mut data = state.data();
        world.apply(&mut data, true)
    };
    match result {
        Ok(()) => {
            state.changed();
            let world = super::World::snapshot(&state.data());
            Json(json!(world)).into_response()
        }
        Err(e) => bad_request(format!("{e:#}")),
    }
}

#[derive(Deserialize)]
struct ClockAdvance {
    advance_secs: i64,
}

/// `POST /_emulator/clock {"advance_secs": N}`: move the emulator's clock by N seconds — forward
/// (lease expiry), or backward (negative N: Azure's clock behind the host's, for tests of whose
/// clock an age is measured on).
pub(crate) async fn advance_clock(
    AxState(state): AxState<State>,
    body: axum::body::Bytes,
) -> Response {
    let req: ClockAdvance = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(format!("Expected {{\"advance_secs\": N}}: {e}")),
    };
    let offset = state
        .0
        .clock_offset
        .fetch_add(req.advance_secs, std::sync::atomic::Ordering::SeqCst)
        + req.advance_secs;
    Json(json!({"offset_secs": offset})).into_response()
}

pub use super::timing::Timing;

/// `GET /_emulator/timing`: the current [`Timing`].
pub(crate) async fn get_timing(AxState(state): AxState<State>) -> Json<Value> {
    Json(serde_json::to_value(state.timing()).unwrap_or(Value::Null))
}

/// `PUT /_emulator/timing`: replace the [`Timing`] (operations already started keep theirs).
/// `{"version_write_ms": N}` (version writes last at least N ms), `{"profile": "azure",
/// "time_scale": N}` (Azure's recorded durations / N), and any field of [`Timing`] on top.
pub(crate) async fn put_timing(
    AxState(state): AxState<State>,
    body: axum::body::Bytes,
) -> Response {
    let doc: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("Expected a timing document: {e}")),
    };
    let t = match Timing::from_document(&doc) {
        Ok(t) => t,
        Err(e) => {
            return bad_request(format!(
                "Expected {{\"version_write_ms\": N}}, {{\"profile\": \"azure\", \"time_scale\": N}} or fields of the timing: {e}"
            ))
        }
    };
    *super::lock(&state.0.timing) = t;
    Json(serde_json::to_value(t).unwrap_or(Value::Null)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_substrings_match_paths() {
        assert!(glob_match(
            "/subscriptions/*/versions/*",
            "/subscriptions/s/x/versions/1.0.0"
        ));
        assert!(!glob_match(
            "/subscriptions/*/versions",
            "/subscriptions/s/versions/1"
        ));
        assert!(glob_match("*", "/anything"));
        let f = Fault {
            method: "PUT".into(),
            path: "/versions/".into(),
            status: Some(429),
            ..Fault::default()
        };
        assert!(f.matches("put", "/a/versions/1.0.0", ""));
        assert!(!f.matches("GET", "/a/versions/1.0.0", ""));
        let f = Fault {
            query: Some("COMP=page".into()),
            ..f
        };
        assert!(f.matches("PUT", "/a/versions/1.0.0", "comp=page"));
        assert!(!f.matches("PUT", "/a/versions/1.0.0", "comp=metadata"));
    }
}
