//! What ARM answers with: the error body `{"error": {"code", "message", "target"?}}` (with
//! `x-ms-failure-cause` and, on 401, `WWW-Authenticate`), the common error constructors, and the
//! resource body as a GET renders it (a version's replication status under
//! `$expand=ReplicationStatus`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::lro::{now_ms, op_in_progress};
use super::paths::Addr;
use crate::emulator::store::{Data, Kind, Resource};
use crate::emulator::State;

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

    pub(super) fn target(mut self, target: &str) -> Self {
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

pub(super) fn bad(code: &str, message: &str) -> ArmError {
    ArmError::new(StatusCode::BAD_REQUEST, code, message)
}

pub(super) fn conflict(code: &str, message: &str) -> ArmError {
    ArmError::new(StatusCode::CONFLICT, code, message)
}

pub(super) fn not_found(a: &Addr) -> ArmError {
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

/// The resource's id as its body spells it.
pub(super) fn resource_id(r: &Resource) -> String {
    r.body
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// A nested resource as Azure names it in CannotDeleteResource: from the provider on,
/// `Microsoft.Compute/galleries/g/images/i/versions/v`.
pub(super) fn nested_id(id: &str) -> String {
    match id.find("/providers/") {
        Some(i) => id[i + "/providers/".len()..].to_string(),
        None => id.to_string(),
    }
}

pub(super) fn render(
    state: &State,
    data: &Data,
    r: &Resource,
    api_version: &str,
    expand_replication: bool,
) -> Value {
    let mut body = r.body.clone();
    if r.kind == Kind::Version {
        super::safety::answer_at(api_version, &mut body);
    }
    if r.kind == Kind::Gallery {
        super::soft_delete::gallery_answer_at(api_version, &mut body);
    }
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
