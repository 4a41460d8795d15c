//! Reads: GET of one resource (a status poll of its operation, as Azure's GETs are) and the
//! paged lists (`$skiptoken`, `nextLink` on the host the client used) at subscription, group or
//! parent scope.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::lro::{advance, settle, settle_all};
use super::paths::{Addr, Scope};
use super::render::{bad, not_found, render, ArmError};
use super::router::Ctx;
use super::{eq, str_at};
use crate::emulator::store::{Kind, Resource};

fn expand_replication(ctx: &Ctx) -> bool {
    ctx.query
        .iter()
        .any(|(k, v)| eq(k, "$expand") && v.to_lowercase().contains("replicationstatus"))
}

pub(super) fn get_item(ctx: &Ctx, a: &Addr) -> Result<Response, ArmError> {
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
    let body = render(
        &ctx.state,
        &data,
        r,
        &ctx.api_version,
        expand_replication(ctx),
    );
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

/// One page of a list as ARM answers it, `{"value": [...], "nextLink"?}`: `Options::page_size`
/// items from the request's `$skiptoken` on, each rendered by `item`.
pub(super) fn page<T>(
    ctx: &Ctx,
    items: &[T],
    item: impl Fn(&T) -> Value,
) -> Result<Response, ArmError> {
    let skip = skip_token(ctx)?;
    let size = ctx.state.0.page_size;
    let value: Vec<Value> = items.iter().skip(skip).take(size).map(item).collect();
    let mut body = json!({ "value": value });
    if let Some(next) = next_link(ctx, skip, size, items.len()) {
        body["nextLink"] = json!(next);
    }
    Ok((StatusCode::OK, axum::Json(body)).into_response())
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

pub(super) fn list(ctx: &Ctx, kind: Kind, scope: &Scope) -> Result<Response, ArmError> {
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
    page(ctx, &items, |r| {
        render(&ctx.state, &data, r, &ctx.api_version, false)
    })
}
