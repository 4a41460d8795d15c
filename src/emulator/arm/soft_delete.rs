//! Soft delete of gallery image versions as today's Azure keeps it (REFERENCE.md "Today's Azure",
//! issue 30 item 1): the gallery's policy, a DELETE that keeps the version restorable, the list
//! of soft-deleted versions, restore (PATCH or PUT), purge, and what soft-deleted versions refuse.
//!
//! Sources (REFERENCE.md names them): REC (azure-cli recording, 2026-04) for the gallery policy
//! `softDeletePolicy.isSoftDeleteEnabled`, turned on and off on an existing gallery, answered with
//! `retentionPeriodInDays: 7` at every api-version; SPEC26 (GalleryRP 2026-03-03, PRs #44214,
//! #44434) for the `SoftDeleted` state, `consumptionEndTime`, `hardDeletionTargetTime`, the
//! settable `retentionPeriodInDays` / `gracePeriodInDays` and the list
//! `softDeletedArtifactTypes/Images/artifacts/{definition}/versions` (2024-03-03+); EX24 / EX26 for
//! the restore PATCH `{"properties": {"restore": true, "storageProfile": {}}}` → 200 `Updating`;
//! SDDOC for the PUT-based restore, Failed versions that "can't be deleted" and the parents that
//! cannot be deleted while they hold soft-deleted versions; PR #46100 for
//! `bypassSoftDelete=true` (2026-03-03) that deletes permanently whatever the policy.
//!
//! Not found in any source, so the harsher reading is modelled (each place says so again):
//! - a soft-deleted version answers GET with 404 `ResourceNotFound` and is not in the version
//!   list (a tool that looks only there sees it gone), yet its name stays taken;
//! - `hardDeletionTargetTime` = `consumptionEndTime` (the earliest the restore window can end;
//!   `gracePeriodInDays` is kept and answered but extends nothing);
//! - a PUT of that name with another source: 409 `Conflict`, naming the soft-deleted version;
//! - a DELETE without `bypassSoftDelete` of a version already soft-deleted: 204, nothing purged;
//!   `bypassSoftDelete` at api-versions before 2026-03-03: ignored (the DELETE soft-deletes);
//! - a Failed version in a soft-delete gallery: 409 `OperationNotAllowed` (code not recorded),
//!   with or without `bypassSoftDelete`; a Canceled one too (SDDOC names only Failed);
//! - a definition or gallery holding soft-deleted versions: 409 `CannotDeleteResource`, as for
//!   nested resources (code not recorded);
//! - `restore: true` on a version that is not soft-deleted: 400 `InvalidParameter`;
//! - the list at an api-version before 2024-03-03: 400 `NoRegisteredProviderFound`, ARM's answer
//!   for an api-version a resource type lacks (wording approximated);
//! - a gallery PUT without `softDeletePolicy` keeps the policy it had;
//! - the id and type of a soft-deleted list item (not recorded):
//!   `{gallery id}/softDeletedArtifactTypes/Images/artifacts/{definition}/versions/{version}`,
//!   `Microsoft.Compute/galleries/softDeletedArtifactTypes/artifacts/versions`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::lro::begin;
use super::paths::{Addr, Scope};
use super::read::page;
use super::render::{bad, conflict, nested_id, not_found, ArmError};
use super::router::Ctx;
use super::{api_at_least, eq, str_at};
use crate::emulator::store::{Data, Kind, OpAction, Resource, SoftDeleted};
use crate::emulator::State;

/// The first api-version with the soft-deleted list and `restore` (SDDOC, SPEC26).
pub(super) const SOFT_DELETE_API: &str = "2024-03-03";
/// The first api-version with settable retention, `consumptionEndTime` /
/// `hardDeletionTargetTime` in the list, and `bypassSoftDelete` (SPEC26, PR #46100).
pub(super) const LIFECYCLE_API: &str = "2026-03-03";
/// The retention when none is set (REC, SDDOC: 7 days).
const DEFAULT_RETENTION_DAYS: i64 = 7;

const POLICY: &str = "softDeletePolicy";

fn parse(at: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(at.trim(), &Rfc3339).ok()
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_default()
}

/// A gallery's properties after a PUT or PATCH: `sent` is the policy the request carried, `old`
/// the properties before. The policy keeps what the request leaves out (a PUT without it keeps it
/// — not found: the harsher reading); `isSoftDeleteEnabled` is settable at every api-version
/// (REC: accepted at 2023-07-03), the retention and grace periods from 2026-03-03 only (SPEC26;
/// ignored before, as ARM drops properties a schema lacks); a policy answers
/// `retentionPeriodInDays` (7 unless set; REC).
pub(super) fn gallery_on_write(
    api_version: &str,
    sent: Option<&Value>,
    props: &mut Value,
    old: Option<&Value>,
) -> Result<(), ArmError> {
    let mut policy = old.and_then(|o| o.get(POLICY)).cloned();
    if let Some(sent) = sent {
        let Some(sent) = sent.as_object() else {
            return Err(
                bad("InvalidParameter", "'softDeletePolicy' must be an object.")
                    .target("gallery.properties.softDeletePolicy"),
            );
        };
        let p = policy.get_or_insert_with(|| json!({}));
        for (k, v) in sent {
            let field = format!("gallery.properties.softDeletePolicy.{k}");
            match k.as_str() {
                "isSoftDeleteEnabled" if v.is_boolean() => p[k] = v.clone(),
                "isSoftDeleteEnabled" => {
                    return Err(
                        bad("InvalidParameter", &format!("'{field}' must be a boolean."))
                            .target(&field),
                    )
                }
                "retentionPeriodInDays" | "gracePeriodInDays"
                    if api_at_least(api_version, LIFECYCLE_API) =>
                {
                    match v.as_i64() {
                        Some(days) if days >= 1 => p[k] = json!(days),
                        _ => {
                            return Err(bad(
                                "InvalidParameter",
                                &format!("'{field}' must be a whole number of days, at least 1."),
                            )
                            .target(&field))
                        }
                    }
                }
                _ => {} // not in this api-version's schema
            }
        }
    }
    match policy {
        Some(mut p) => {
            if p.get("isSoftDeleteEnabled").is_none() {
                p["isSoftDeleteEnabled"] = json!(false);
            }
            if p.get("retentionPeriodInDays").is_none() {
                p["retentionPeriodInDays"] = json!(DEFAULT_RETENTION_DAYS);
            }
            props[POLICY] = p;
        }
        None => {
            props.as_object_mut().map(|m| m.remove(POLICY));
        }
    }
    Ok(())
}

/// The gallery body as `api_version` answers it: `gracePeriodInDays` from 2026-03-03 only; the
/// retention at every api-version (REC).
pub(super) fn gallery_answer_at(api_version: &str, body: &mut Value) {
    if !api_at_least(api_version, LIFECYCLE_API) {
        if let Some(p) = body
            .pointer_mut(&format!("/properties/{POLICY}"))
            .and_then(Value::as_object_mut)
        {
            p.remove("gracePeriodInDays");
        }
    }
}

/// The lower-cased key of the gallery of a version or definition (`…/galleries/g/images/d…`).
fn gallery_of(version_key: &str) -> String {
    version_key
        .rsplit_once("/images/")
        .map(|(g, _)| g.to_string())
        .unwrap_or_default()
}

fn policy(data: &Data, gallery_key: &str) -> Option<Value> {
    data.resources
        .get(gallery_key)
        .and_then(|g| g.body.pointer(&format!("/properties/{POLICY}")).cloned())
}

fn enabled(data: &Data, gallery_key: &str) -> bool {
    policy(data, gallery_key)
        .and_then(|p| p.get("isSoftDeleteEnabled").and_then(Value::as_bool))
        .unwrap_or(false)
}

/// Forget the soft-deleted versions past their hard deletion, by the emulator's clock: they are
/// gone for good (SPEC26 `hardDeletionTargetTime`).
pub(super) fn expire(state: &State, data: &mut Data) {
    let now = state.now_dt();
    data.soft_deleted
        .retain(|_, s| parse(&s.hard_deletion_target_time).is_some_and(|t| t > now));
}

/// A version whose soft-deleting DELETE completed: kept restorable until its retention ends
/// (SPEC26: `consumptionEndTime` = soft-delete time + retention; `hardDeletionTargetTime` taken
/// as the same instant — not found, the harsher reading).
pub(super) fn keep(state: &State, data: &mut Data, mut r: Resource) {
    let key = r
        .body
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_lowercase();
    let gallery = gallery_of(&key);
    let days = policy(data, &gallery)
        .and_then(|p| p.get("retentionPeriodInDays").and_then(Value::as_i64))
        .unwrap_or(DEFAULT_RETENTION_DAYS);
    let now = state.now_dt();
    let end = now + time::Duration::days(days);
    r.op = None;
    r.body["properties"]["provisioningState"] = json!("Succeeded");
    data.soft_deleted.insert(
        key,
        SoftDeleted {
            resource: r,
            gallery,
            soft_deleted_time: rfc3339(now),
            consumption_end_time: rfc3339(end),
            hard_deletion_target_time: rfc3339(end),
        },
    );
}

/// What a DELETE of an existing version does in its gallery: `Ok(true)` soft-deletes, `Ok(false)`
/// deletes for good (soft delete off, or a purge: `bypassSoftDelete=true` at 2026-03-03, PR
/// #46100 — ignored at older api-versions, not found: the harsher reading). A Failed version in a
/// soft-delete gallery "can't be deleted" (SDDOC): 409 `OperationNotAllowed` (code not recorded),
/// also with `bypassSoftDelete` (not found: the harsher reading). The safety block is checked
/// before this (it refuses first, purge or not).
pub(super) fn on_delete(ctx: &Ctx, data: &Data, a: &Addr, r: &Resource) -> Result<bool, ArmError> {
    let gallery = gallery_of(&a.key);
    if !enabled(data, &gallery) {
        return Ok(false);
    }
    // A Canceled version: not found in any source, so refused like a Failed one (the harsher
    // reading).
    if let Some(state @ ("Failed" | "Canceled")) = str_at(&r.body, "/properties/provisioningState")
    {
        let gallery_name = gallery.rsplit('/').next().unwrap_or("");
        return Err(conflict(
            "OperationNotAllowed",
            &format!(
                "Operation 'Delete Gallery Image Version' is not allowed on Gallery Image Version '{}' since it is in provisioning state '{state}' and soft delete is enabled on gallery '{gallery_name}'. A {state} version can't be deleted while soft delete is on: turn soft delete off on the gallery (properties.softDeletePolicy.isSoftDeleteEnabled: false), delete the version, then turn it on again.",
                a.name
            ),
        ));
    }
    Ok(!purge(ctx))
}

/// Whether the request asks to delete for good: `bypassSoftDelete=true` at 2026-03-03 or later.
fn purge(ctx: &Ctx) -> bool {
    api_at_least(&ctx.api_version, LIFECYCLE_API)
        && ctx
            .query
            .iter()
            .any(|(k, v)| eq(k, "bypassSoftDelete") && eq(v, "true"))
}

/// A DELETE of a version that is not there: `None` if it is not soft-deleted either (the usual
/// 204). A purge (PR #46100) of a soft-deleted version ends it at once: 200, and it leaves the
/// soft-deleted list. Without `bypassSoftDelete` (or before 2026-03-03) nothing is purged and the
/// answer is the 204 of a version that is gone (not found: the harsher reading, a tool sees
/// success and the name stays taken).
pub(super) fn delete_held(
    ctx: &Ctx,
    data: &mut Data,
    a: &Addr,
) -> Option<Result<Response, ArmError>> {
    expire(&ctx.state, data);
    let held = data.soft_deleted.get(&a.key)?;
    if !purge(ctx) {
        return Some(Ok(StatusCode::NO_CONTENT.into_response()));
    }
    if let Err(e) = super::safety::refuse_delete(&held.resource.body, ctx.state.now_dt()) {
        return Some(Err(e));
    }
    data.soft_deleted.remove(&a.key);
    ctx.state.changed();
    Some(Ok(StatusCode::OK.into_response()))
}

/// The soft-deleted versions under a definition (`parent`, lower-cased) or a gallery, as their
/// parent's DELETE names them in its refusal (SDDOC: such a parent cannot be deleted).
pub(super) fn held_under(state: &State, data: &mut Data, parent: &str) -> Vec<String> {
    expire(state, data);
    data.soft_deleted
        .values()
        .filter(|s| s.resource.parent == parent || s.gallery == parent)
        .map(|s| {
            nested_id(
                s.resource
                    .body
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or(""),
            )
        })
        .collect()
}

/// A PUT of a version whose name is soft-deleted: SDDOC's restore (`{"location": home}`, or a
/// body naming no source or the same source) brings it back as it was (its tags and profiles,
/// whatever else the PUT sends), 200 `Updating`; another source is refused with 409 `Conflict`
/// naming the soft-deleted version (not found: the harsher reading). `None`: the name is free.
pub(super) fn put_over(
    ctx: &Ctx,
    data: &mut Data,
    a: &Addr,
    input: &Value,
) -> Option<Result<(), ArmError>> {
    if a.kind != Kind::Version {
        return None;
    }
    expire(&ctx.state, data);
    let held = data.soft_deleted.get(&a.key)?;
    const SOURCES: [&str; 4] = [
        "/properties/storageProfile/osDiskImage/source/uri",
        "/properties/storageProfile/osDiskImage/source/id",
        "/properties/storageProfile/source/id",
        "/properties/storageProfile/source/virtualMachineId",
    ];
    let sent: Vec<(&str, &str)> = SOURCES
        .iter()
        .filter_map(|p| str_at(input, p).map(|v| (*p, v)))
        .collect();
    let same = sent.iter().all(|(p, v)| {
        str_at(&held.resource.body, p).is_some_and(|old| old.eq_ignore_ascii_case(v))
    });
    if !same {
        return Some(Err(conflict(
            "Conflict",
            &format!(
                "Gallery image version '{}' is soft-deleted and its name is still taken. Restore it (PATCH with properties.restore: true) or purge it (DELETE with bypassSoftDelete=true, api-version {LIFECYCLE_API}) before creating another version with that name.",
                held.resource.body.get("id").and_then(Value::as_str).unwrap_or(&a.id)
            ),
        )));
    }
    Some(Ok(()))
}

/// Bring a soft-deleted version back (EX24 / EX26: 200 `Updating`, then `Succeeded` through the
/// operation engine), as it was before its DELETE. 404 `ResourceNotFound` when it is not
/// soft-deleted, or past its hard deletion.
pub(super) fn restore(
    ctx: &Ctx,
    mut data: std::sync::MutexGuard<'_, Data>,
    a: &Addr,
) -> Result<Response, ArmError> {
    expire(&ctx.state, &mut data);
    let Some(held) = data.soft_deleted.remove(&a.key) else {
        return Err(not_found(a));
    };
    let mut r = held.resource;
    r.body["properties"]["provisioningState"] = json!("Updating");
    r.op = None;
    let location = str_at(&r.body, "/location").unwrap_or("").to_string();
    data.resources.insert(a.key.clone(), r);
    Ok(begin(
        ctx,
        data,
        a,
        &location,
        OpAction::Put,
        StatusCode::OK,
    ))
}

/// Whether a PATCH asks to restore: `properties.restore: true` at 2024-03-03 or later (EX24);
/// older api-versions lack the field (ignored).
pub(super) fn restore_requested(api_version: &str, patch: &Value) -> bool {
    api_at_least(api_version, SOFT_DELETE_API)
        && patch
            .pointer("/properties/restore")
            .and_then(Value::as_bool)
            == Some(true)
}

/// `restore: true` on a version that is not soft-deleted: 400 (not found: the harsher reading).
pub(super) fn nothing_to_restore(a: &Addr) -> ArmError {
    bad(
        "InvalidParameter",
        &format!(
            "Gallery image version '{}' is not soft-deleted: there is nothing to restore.",
            a.name
        ),
    )
    .target("galleryImageVersion.properties.restore")
}

/// `GET …/galleries/{g}/softDeletedArtifactTypes/Images/artifacts/{definition}/versions`
/// (SPEC26, 2024-03-03+): the definition's soft-deleted versions, paged like every list.
pub(super) fn list(ctx: &Ctx, scope: &Scope) -> Result<Response, ArmError> {
    let Scope::Parent(_, image_key, image_name) = scope else {
        return Err(bad(
            "InvalidResourceType",
            "The soft-deleted versions are listed per definition.",
        ));
    };
    let mut data = ctx.state.data();
    if !api_at_least(&ctx.api_version, SOFT_DELETE_API) {
        let location = data
            .resources
            .get(&gallery_of(image_key))
            .and_then(|g| str_at(&g.body, "/location"))
            .unwrap_or("")
            .to_string();
        return Err(bad(
            "NoRegisteredProviderFound",
            &format!(
                "No registered resource provider found for location '{location}' and API version '{}' for type 'galleries/softDeletedArtifactTypes/artifacts/versions'. The supported api-versions are '2024-03-03, 2025-03-03, 2026-03-03'.",
                ctx.api_version
            ),
        ));
    }
    if !data.resources.contains_key(image_key) {
        return Err(ArmError::new(
            StatusCode::NOT_FOUND,
            "ParentResourceNotFound",
            &format!("Can not perform requested operation on nested resource. Parent resource '{image_name}' not found."),
        ));
    }
    expire(&ctx.state, &mut data);
    let items: Vec<&SoftDeleted> = data
        .soft_deleted
        .values()
        .filter(|s| &s.resource.parent == image_key)
        .collect();
    let lifecycle = api_at_least(&ctx.api_version, LIFECYCLE_API);
    page(ctx, &items, |s| item(s, lifecycle))
}

/// One item of the soft-deleted list (SPEC26 `GallerySoftDeletedResource`).
fn item(s: &SoftDeleted, lifecycle: bool) -> Value {
    let body = &s.resource.body;
    let id = body.get("id").and_then(Value::as_str).unwrap_or("");
    let name = body.get("name").cloned().unwrap_or(json!(""));
    let (gallery_id, rest) = id.split_once("/images/").unwrap_or((id, ""));
    let definition = rest.split('/').next().unwrap_or("");
    let mut props = Map::new();
    props.insert("resourceArmId".into(), json!(id));
    props.insert("softDeletedArtifactType".into(), json!("Images"));
    props.insert("softDeletedTime".into(), json!(s.soft_deleted_time));
    if lifecycle {
        props.insert("consumptionEndTime".into(), json!(s.consumption_end_time));
        props.insert(
            "hardDeletionTargetTime".into(),
            json!(s.hard_deletion_target_time),
        );
    }
    json!({
        "id": format!(
            "{gallery_id}/softDeletedArtifactTypes/Images/artifacts/{definition}/versions/{}",
            name.as_str().unwrap_or("")
        ),
        "name": name,
        "type": Kind::SoftDeletedVersion.arm_type(),
        "location": body.get("location").cloned().unwrap_or(Value::Null),
        "properties": props,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_keeps_what_a_write_leaves_out_and_retention_is_settable_at_2026_03_03_only() {
        let mut props = json!({});
        let on = json!({"isSoftDeleteEnabled": true, "retentionPeriodInDays": 3});
        gallery_on_write("2024-03-03", Some(&on), &mut props, None).unwrap();
        assert_eq!(
            props[POLICY],
            json!({"isSoftDeleteEnabled": true, "retentionPeriodInDays": 7})
        );
        let old = props.clone();
        let mut kept = json!({});
        gallery_on_write("2023-07-03", None, &mut kept, Some(&old)).unwrap();
        assert_eq!(kept[POLICY], old[POLICY]);
        let mut set = json!({});
        let three = json!({"retentionPeriodInDays": 3});
        gallery_on_write("2026-03-03", Some(&three), &mut set, Some(&old)).unwrap();
        assert_eq!(set[POLICY]["retentionPeriodInDays"], 3);
        let zero = json!({"retentionPeriodInDays": 0});
        assert!(gallery_on_write("2026-03-03", Some(&zero), &mut set, Some(&old)).is_err());
        let mut none = json!({});
        gallery_on_write("2026-03-03", None, &mut none, None).unwrap();
        assert!(none.get(POLICY).is_none(), "off by default: no policy");
    }

    #[test]
    fn a_version_key_names_its_gallery() {
        assert_eq!(
            gallery_of("/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/galleries/g/images/d/versions/1.0.0"),
            "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/galleries/g"
        );
    }
}
