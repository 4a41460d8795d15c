//! The consumers of gallery images: virtual machines, scale sets and their instances, managed
//! disks (stored as sent, answered at once, no long-running operation), and Resources - List By
//! Resource Group with a tag filter, how the Azure CPI finds a stemcell's version.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::lro::settle_all;
use super::paths::Addr;
use super::read::page;
use super::render::{bad, ArmError};
use super::router::Ctx;
use super::{eq, str_at, strip_nulls};
use crate::emulator::store::{Kind, Resource};

/// Build a stored consumer resource from a client body (also used for world files).
pub(crate) fn consumer_body(a: &Addr, input: Value) -> Value {
    let mut body = input;
    if !body.is_object() {
        body = json!({});
    }
    body["id"] = json!(a.id);
    body["name"] = json!(a.name);
    body["type"] = json!(a.kind.arm_type());
    if body.get("properties").is_none_or(|p| !p.is_object()) {
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

pub(super) fn put_consumer(
    ctx: &Ctx,
    a: &Addr,
    body: Map<String, Value>,
) -> Result<Response, ArmError> {
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
    } else if str_at(&input, "/location").is_none_or(|l| l.trim().is_empty()) {
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

pub(super) fn delete_consumer(ctx: &Ctx, a: &Addr) -> Result<Response, ArmError> {
    let mut data = ctx.state.data();
    if data.resources.remove(&a.key).is_none() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    // A scale set takes its instances with it, and each its locks.
    data.resources.retain(|_, r| r.parent != a.key);
    super::locks::drop_orphans(&mut data);
    drop(data);
    ctx.state.changed();
    Ok(StatusCode::OK.into_response())
}

/// Resources - List By Resource Group (Microsoft.Resources, api-version 2021-04-01; REFERENCE.md
/// "List resources by tag"): `{"value": [{id, name, type, location, tags}]}` for every resource of
/// the group, or with `$filter=tagName eq 'N' and tagValue eq 'V'` those carrying that tag (the
/// Azure CPI maps a stemcell CID to its version this way). Tag names compare case-insensitively
/// (Azure tags are); values exactly, which is unverified for Azure and the stricter reading. Any
/// other `$filter` is refused, as Azure refuses filters it cannot parse. Paged like every list
/// here (`nextLink`); the Azure CPI reads the first page only.
pub(super) fn resources_by_tag(ctx: &Ctx, rg: &str) -> Result<Response, ArmError> {
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
    page(ctx, &items, Value::clone)
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
