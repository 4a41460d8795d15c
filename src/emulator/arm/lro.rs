//! The long-running-operation engine every gallery write goes through: an operation per PUT,
//! PATCH or DELETE, its `Azure-AsyncOperation` / `Location` / `Retry-After` headers, its status
//! polls (both flavours), its completion after enough polls and its minimum duration (the timing
//! profile), an injected fault, and the parent's memory of a child just deleted.

use std::sync::MutexGuard;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::paths::Addr;
use super::render::{nested_id, render, resource_id, ArmError};
use super::router::Ctx;
use super::version::missing_source_blob;
use super::{norm_location, now_rfc3339, str_at};
use crate::emulator::store::{Data, DeletedChild, Kind, OpAction, OpFault, Operation, Resource};
use crate::emulator::State;

/// Start `action` on the resource at `a.key` (already stored as the write leaves it) and answer
/// as Azure does: `status` with the resource body for a PUT or PATCH, an empty one for a DELETE,
/// and the operation's headers. The state lock is released and the change recorded before the
/// answer leaves.
pub(super) fn begin(
    ctx: &Ctx,
    data: MutexGuard<'_, Data>,
    a: &Addr,
    location: &str,
    action: OpAction,
    status: StatusCode,
) -> Response {
    begin_with(ctx, data, a, location, action, status, false)
}

/// [`begin`], for a DELETE that soft-deletes (`soft_delete`): its completion keeps the version
/// soft-deleted ([`super::soft_delete::keep`]) instead of dropping it.
pub(super) fn begin_with(
    ctx: &Ctx,
    mut data: MutexGuard<'_, Data>,
    a: &Addr,
    location: &str,
    action: OpAction,
    status: StatusCode,
    soft_delete: bool,
) -> Response {
    let op = new_operation(&mut data, &ctx.state, &a.key, action);
    if let Some(o) = data.operations.get_mut(&op) {
        o.soft_delete = soft_delete;
    }
    let body = (action == OpAction::Put).then(|| {
        data.resources
            .get(&a.key)
            .map(|r| render(&ctx.state, &data, r, &ctx.api_version, false))
            .unwrap_or_default()
    });
    let retry_after = op_retry_after(&ctx.state, &data, &op);
    drop(data);
    ctx.state.changed();
    let mut resp = match body {
        Some(body) => (status, axum::Json(body)).into_response(),
        None => status.into_response(),
    };
    lro_headers(&mut resp, ctx, a, location, &op, action, retry_after);
    resp
}

/// The answer to a DELETE of a resource already being deleted: 202 with the running
/// operation's headers (no second operation).
pub(super) fn deleting(ctx: &Ctx, data: &Data, a: &Addr, location: &str, op_id: &str) -> Response {
    let mut resp = StatusCode::ACCEPTED.into_response();
    let retry_after = op_retry_after(&ctx.state, data, op_id);
    lro_headers(
        &mut resp,
        ctx,
        a,
        location,
        op_id,
        OpAction::Delete,
        retry_after,
    );
    resp
}

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
    // A write stored already Succeeded (a gallery's update, REFERENCE.md "Azure as recorded",
    // "Write status and LRO headers") has nothing left to run: its operation is born done.
    let done = action == OpAction::Put
        && data
            .resources
            .get(key)
            .is_some_and(|r| str_at(&r.body, "/properties/provisioningState") == Some("Succeeded"));
    let now = now_rfc3339(state);
    data.operations.insert(
        id.clone(),
        Operation {
            id: id.clone(),
            resource: key.to_string(),
            action,
            status: if done { "Succeeded" } else { "InProgress" }.into(),
            start_time: now.clone(),
            end_time: done.then_some(now),
            error: None,
            polls: 0,
            started_ms: now_ms(),
            min_ms,
            fault: None,
            retry_after,
            soft_delete: false,
        },
    );
    if let Some(r) = data.resources.get_mut(key) {
        r.op = (!done).then(|| id.clone());
    }
    id
}

pub(super) fn op_in_progress(data: &Data, r: &Resource) -> Option<Operation> {
    let id = r.op.as_ref()?;
    data.operations
        .get(id)
        .filter(|o| o.status == "InProgress")
        .cloned()
}

pub(super) fn now_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// One status poll of an operation: count it, and complete the operation after enough polls.
/// A poll of a parent's DELETE that waits for its children's DELETEs counts as a poll of theirs
/// (see [`Children`]).
pub(super) fn advance(state: &State, data: &mut Data, op_id: &str) {
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
    let (resource, action) = (op.resource.clone(), op.action);
    if action == OpAction::Delete {
        for child_op in Children::of(data, &resource).going_ops {
            advance(state, data, &child_op);
        }
    }
    let Some(op) = data.operations.get(op_id) else {
        return;
    };
    if op.polls < needed || !op_min_elapsed(op) {
        return;
    }
    complete(state, data, op_id);
}

/// The children of a resource, as a DELETE of it sees them: those being deleted (their DELETE
/// running, not a soft delete, which would leave them behind) and the others ("live").
///
/// Azure accepts the DELETE of a definition whose last versions' DELETEs still run: 202 with
/// `Azure-AsyncOperation` and `Location` (the recorded sessions, issue 46 item 5; REFERENCE.md
/// "Write status and LRO headers"), and the definition goes once they are gone. So a parent's
/// DELETE with only children being deleted is accepted, its operation ends after theirs, and it
/// fails with `CannotDeleteResource` (the parent staying) if a live child has appeared
/// meanwhile. A parent with a live child, or one whose child finished its DELETE a moment ago
/// (the delete lag, [`remember_deleted_child`]), is refused at once, as before. Azure runs the
/// children's DELETEs on its own; here a poll of the parent's operation is also a poll of
/// theirs, so a client that follows only the parent's operation sees it end.
pub(super) struct Children {
    /// Nested ids (`Microsoft.Compute/galleries/…`) of the children that are not going.
    pub(super) live: Vec<String>,
    /// Nested ids of the children being deleted.
    pub(super) going: Vec<String>,
    /// The operations deleting them.
    pub(super) going_ops: Vec<String>,
}

impl Children {
    pub(super) fn of(data: &Data, key: &str) -> Children {
        let mut children = Children {
            live: Vec::new(),
            going: Vec::new(),
            going_ops: Vec::new(),
        };
        for c in data.resources.values().filter(|c| c.parent == key) {
            let id = nested_id(&resource_id(c));
            match op_in_progress(data, c) {
                Some(op) if op.action == OpAction::Delete && !op.soft_delete => {
                    children.going.push(id);
                    children.going_ops.push(op.id);
                }
                _ => children.live.push(id),
            }
        }
        children
    }

    /// Every child's key, to bring their operations up to date first.
    pub(super) fn keys(data: &Data, key: &str) -> Vec<String> {
        data.resources
            .iter()
            .filter(|(_, c)| c.parent == key)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

/// Azure's message for a parent refused because of nested resources (its current wording:
/// gardenlinux #2036, 2024; jenkins-infra/azure #1544, 2026), naming some of them.
pub(super) fn nested_resources_message(ids: &[String]) -> String {
    format!(
        "Cannot delete resource while nested resources exist. Some existing nested resource IDs include: '{}'. Please delete all nested resources before deleting this resource.",
        ids.join(", ")
    )
}

/// Whether the operation has run at least its minimum duration (`min_ms`). Both instants are
/// whole milliseconds, truncated: a difference of exactly `min_ms` may be up to 1 ms short of
/// it, so a timed operation needs one more (it must never end before its duration; CI once saw
/// a 450 s / 600 create end after 749.8 ms).
fn op_min_elapsed(op: &Operation) -> bool {
    let elapsed = now_ms() - op.started_ms;
    op.min_ms == 0 || elapsed > op.min_ms as i64
}

/// Complete the resource's operation if it has run longer than `complete_after`.
pub(super) fn settle(state: &State, data: &mut Data, key: &str) {
    let Some(op_id) = data.resources.get(key).and_then(|r| r.op.clone()) else {
        return;
    };
    let deleting = data
        .operations
        .get(&op_id)
        .is_some_and(|o| o.action == OpAction::Delete && o.status == "InProgress");
    if deleting {
        for child in Children::keys(data, key) {
            settle(state, data, &child);
        }
    }
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
            let children = Children::of(data, &op.resource);
            if !children.live.is_empty() {
                fail_parent_delete(state, data, &op, &children.live);
                return;
            }
            if !children.going.is_empty() {
                return; // it ends once they are gone
            }
            if let Some(r) = data.resources.remove(&op.resource) {
                if op.soft_delete {
                    super::soft_delete::keep(state, data, r);
                } else {
                    remember_deleted_child(state, data, &r);
                }
                // Its locks go with it (none can be left below it: see `locks`).
                super::locks::drop_orphans(data);
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

/// A parent's DELETE that waited for its children's and found a live one: the operation ends
/// Failed with `CannotDeleteResource` and the parent stays, `Succeeded` (see [`Children`]).
fn fail_parent_delete(state: &State, data: &mut Data, op: &Operation, live: &[String]) {
    if let Some(r) = data.resources.get_mut(&op.resource) {
        r.body["properties"]["provisioningState"] = json!("Succeeded");
        r.op = None;
    }
    if let Some(o) = data.operations.get_mut(&op.id) {
        o.status = "Failed".into();
        o.end_time = Some(now_rfc3339(state));
        o.error = Some(
            json!({"code": "CannotDeleteResource", "message": nested_resources_message(live)}),
        );
    }
    state.changed();
}

/// Bring every resource with an operation in flight up to date (a list shows them as they are now).
pub(super) fn settle_all(state: &State, data: &mut Data) {
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

pub(super) fn operation_status(ctx: &Ctx, id: &str) -> Result<Response, ArmError> {
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
                HeaderValue::from(op_retry_after(&ctx.state, &data, id)),
            );
            return Ok(resp);
        }
        if op.action == OpAction::Put && op.status == "Succeeded" {
            if let Some(r) = data.resources.get(&op.resource) {
                let body = render(&ctx.state, &data, r, &ctx.api_version, false);
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
    data.deleted_children.push(DeletedChild {
        parent: r.parent.clone(),
        id: nested_id(&resource_id(r)),
        until_ms: now + lag as i64,
    });
}
