//! Galleries and image definitions, and the writes every gallery resource shares: PUT (names,
//! parent and location, tags, what may not change), PATCH and DELETE (nested resources), each
//! started as a long-running operation through [`super::lro`].

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::lro::{
    begin, begin_with, deleting, nested_resources_message, now_ms, op_in_progress, settle, Children,
};
use super::paths::Addr;
use super::render::{bad, conflict, not_found, ArmError};
use super::router::Ctx;
use super::soft_delete;
use super::version::{target_regions, valid_version_name, version_properties};
use super::{norm_location, str_at, strip_nulls};
use crate::emulator::store::{Data, Kind, OpAction, Resource};

pub(super) fn put_gallery_kind(
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
    // A version name that is soft-deleted: restored by a PUT of the same source, else refused.
    if let Some(verdict) = soft_delete::put_over(ctx, &mut data, a, &input) {
        verdict?;
        return soft_delete::restore(ctx, data, a);
    }
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
        Kind::Gallery => {
            let mut props = gallery_properties(a, properties);
            soft_delete::gallery_on_write(
                &ctx.api_version,
                input.pointer("/properties/softDeletePolicy"),
                &mut props,
                existing.as_ref().and_then(|r| r.body.get("properties")),
            )?;
            props
        }
        Kind::Image => image_properties(&data, a, &ctx.api_version, properties, existing.as_ref())?,
        _ => version_properties(ctx, &data, properties, &location, existing.as_ref())?,
    };
    let mut props = props;
    let new = existing.is_none();
    props["provisioningState"] = json!(write_state(a.kind, new));
    let mut stored = json!({
        "id": existing.as_ref().and_then(|r| r.body.get("id").cloned()).unwrap_or(json!(a.id)),
        "name": existing.as_ref().and_then(|r| r.body.get("name").cloned()).unwrap_or(json!(a.name)),
        "type": a.kind.arm_type(),
        "location": existing.as_ref().and_then(|r| r.body.get("location").cloned()).unwrap_or(json!(location)),
        "properties": props,
    });
    // A PUT that sends `tags` replaces the whole set; one that omits them keeps the existing
    // set (REFERENCE.md "Azure as recorded", "Tags": the Azure CPI's `create_vm` PUT sends no
    // tags and its own Azure integration test then finds the version by them).
    match (
        input.get("tags"),
        existing.as_ref().and_then(|r| r.body.get("tags")),
    ) {
        (Some(tags), _) => stored["tags"] = checked_tags(tags)?,
        (None, Some(kept)) => stored["tags"] = kept.clone(),
        (None, None) => {}
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
    let status = if new {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(begin(ctx, data, a, &location, OpAction::Put, status))
}

/// The provisioning state a PUT or PATCH answers with: `Creating` for a new resource,
/// `Updating` for an update — except a gallery's update, which comes back already `Succeeded`
/// (REFERENCE.md "Azure as recorded", "Write status and LRO headers"); its operation is created
/// complete ([`super::lro::begin`]).
fn write_state(kind: Kind, new: bool) -> &'static str {
    match (kind, new) {
        (_, true) => "Creating",
        (Kind::Gallery, false) => "Succeeded",
        (_, false) => "Updating",
    }
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
    api_version: &str,
    mut props: Value,
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
        if str_at(&props, field).is_none_or(|s| s.trim().is_empty()) {
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
    security_type_default(api_version, &mut props);
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
    if props.get("hyperVGeneration").is_none() {
        props["hyperVGeneration"] = json!("V1");
    }
    if props.get("architecture").is_none() {
        props["architecture"] = json!("x64");
    }
    Ok(props)
}

/// From api-version 2025-03-03 a definition without a `SecurityType` feature is made Gen2 (when
/// it names no generation) with `SecurityType=TrustedLaunchSupported` (REFERENCE.md "Gallery API
/// versions"). A V1 definition cannot be Trusted Launch and is left as sent. Applied to every PUT
/// at those versions, so the same PUT twice is no change; whether Azure adds it to a re-PUT of a
/// definition made without it at an older version is unverified (here: yes, and the change of
/// features is refused).
fn security_type_default(api_version: &str, props: &mut Value) {
    if !super::api_at_least(api_version, "2025-03-03") {
        return;
    }
    let has_security_type = props
        .get("features")
        .and_then(Value::as_array)
        .is_some_and(|fs| {
            fs.iter()
                .any(|f| str_at(f, "/name").is_some_and(|n| n.eq_ignore_ascii_case("SecurityType")))
        });
    if has_security_type {
        return;
    }
    match str_at(props, "/hyperVGeneration") {
        None => props["hyperVGeneration"] = json!("V2"),
        Some(g) if g.eq_ignore_ascii_case("V2") => {}
        Some(_) => return,
    }
    let feature = json!({"name": "SecurityType", "value": "TrustedLaunchSupported"});
    match props.get_mut("features").and_then(Value::as_array_mut) {
        Some(features) => features.push(feature),
        None => props["features"] = json!([feature]),
    }
}

pub(super) fn patch_gallery_kind(
    ctx: &Ctx,
    a: &Addr,
    body: Map<String, Value>,
) -> Result<Response, ArmError> {
    let mut patch = Value::Object(body);
    strip_nulls(&mut patch);
    let mut data = ctx.state.data();
    settle(&ctx.state, &mut data, &a.key);
    let restoring =
        a.kind == Kind::Version && soft_delete::restore_requested(&ctx.api_version, &patch);
    if restoring && !data.resources.contains_key(&a.key) {
        return soft_delete::restore(ctx, data, a);
    }
    let r = data
        .resources
        .get(&a.key)
        .cloned()
        .ok_or_else(|| not_found(a))?;
    check_not_busy(&data, &r, a, "PATCH")?;
    if restoring {
        return Err(soft_delete::nothing_to_restore(a));
    }
    let mut stored = r.body.clone();
    if a.kind == Kind::Gallery {
        soft_delete::gallery_on_write(
            &ctx.api_version,
            patch.pointer("/properties/softDeletePolicy"),
            &mut stored["properties"],
            r.body.get("properties"),
        )?;
    }
    // No conditional write: an `If-Match` header is ignored, as Azure's gallery image versions
    // have no `etag` and their Update/CreateOrUpdate take no If-Match (azure-rest-api-specs,
    // specification/compute/resource-manager/Microsoft.Compute/GalleryRP/stable/2024-03-03/
    // GalleryRP.json, examples GalleryImageVersion_Get.json and GalleryImageVersion_Update.json).
    // The tags of a PATCH replace the whole tag set, as ARM's do.
    if let Some(tags) = patch.get("tags") {
        stored["tags"] = checked_tags(tags)?;
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
    if a.kind == Kind::Version {
        super::safety::on_write(
            &ctx.api_version,
            patch.pointer("/properties/safetyProfile"),
            &mut stored["properties"],
            r.body.get("properties"),
            ctx.state.now_dt(),
        )?;
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
    stored["properties"]["provisioningState"] = json!(write_state(a.kind, false));
    let location = str_at(&stored, "/location").unwrap_or("").to_string();
    if let Some(res) = data.resources.get_mut(&a.key) {
        res.body = stored;
    }
    Ok(begin(
        ctx,
        data,
        a,
        &location,
        OpAction::Put,
        StatusCode::OK,
    ))
}

pub(super) fn delete_gallery_kind(ctx: &Ctx, a: &Addr) -> Result<Response, ArmError> {
    let mut data = ctx.state.data();
    settle(&ctx.state, &mut data, &a.key);
    let Some(r) = data.resources.get(&a.key).cloned() else {
        if a.kind == Kind::Version {
            if let Some(answer) = soft_delete::delete_held(ctx, &mut data, a) {
                return answer;
            }
        }
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    let location = str_at(&r.body, "/location").unwrap_or("").to_string();
    if let Some(op) = op_in_progress(&data, &r) {
        if op.action == OpAction::Delete {
            return Ok(deleting(ctx, &data, a, &location, &op.id));
        }
        check_not_busy(&data, &r, a, "DELETE")?;
    }
    // The safety block refuses first, soft delete or purge (issue 30 item 1; not found which
    // check Azure makes first: the harsher reading).
    let mut soft = false;
    if a.kind == Kind::Version {
        super::safety::refuse_delete(&r.body, ctx.state.now_dt())?;
        soft = soft_delete::on_delete(ctx, &data, a, &r)?;
    }
    // Nested resources: the children that exist and are not being deleted, and those deleted
    // within the delete lag (see `remember_deleted_child`), refuse the DELETE; children whose
    // DELETE still runs do not: the parent's operation ends after theirs (see `Children`).
    for child in Children::keys(&data, &a.key) {
        settle(&ctx.state, &mut data, &child);
    }
    let now = now_ms();
    let mut children = Children::of(&data, &a.key).live;
    children.extend(
        data.deleted_children
            .iter()
            .filter(|d| d.parent == a.key && d.until_ms > now)
            .map(|d| d.id.clone()),
    );
    if !children.is_empty() {
        return Err(conflict(
            "CannotDeleteResource",
            &nested_resources_message(&children),
        ));
    }
    // A definition or gallery holding soft-deleted versions cannot be deleted (SDDOC); the code
    // is not recorded: Azure's for nested resources (the harsher reading).
    let held = soft_delete::held_under(&ctx.state, &mut data, &a.key);
    if !held.is_empty() {
        return Err(conflict(
            "CannotDeleteResource",
            &format!(
                "Cannot delete resource while nested resources exist. Some existing nested resource IDs include: '{}'. They are soft-deleted gallery image versions: purge them (DELETE with bypassSoftDelete=true, api-version 2026-03-03) or wait for their hardDeletionTargetTime.",
                held.join(", ")
            ),
        ));
    }
    if let Some(res) = data.resources.get_mut(&a.key) {
        res.body["properties"]["provisioningState"] = json!("Deleting");
    }
    Ok(begin_with(
        ctx,
        data,
        a,
        &location,
        OpAction::Delete,
        StatusCode::ACCEPTED,
        soft,
    ))
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
        // A write to a version while its DELETE runs: TSDOC's wording.
        if a.kind == Kind::Version && op.action == OpAction::Delete {
            return Err(conflict(
                "OperationNotAllowed",
                &format!(
                    "Operation 'Update Gallery Image Version' is not allowed on {}; since it is marked for deletion.",
                    a.name
                ),
            ));
        }
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
        Kind::ManagedImage => "Image",
        Kind::SoftDeletedVersion => "Soft-deleted Gallery Image Version",
    }
}

/// Azure's tag limits, refused with 400 before anything changes (REFERENCE.md "Tags"; Azure
/// Resource Manager docs, "Use tags to organize your Azure resources", Limitations: 50 tags per
/// resource, names at most 512 characters without `<>%&\?/`, values at most 256 characters, empty
/// values allowed). The codes and wording are ARM's as Azure PowerShell's Az.Migrate module
/// reproduces them client-side (`InvalidTags`, `InvalidTagName`, `InvalidTagNameCharacters`,
/// `InvalidTagValueLength`). The tags as stored: a number or boolean value becomes its text, as
/// Azure accepted `"disk": 5120` from Azure CPI v52.0.1–v53.0.0 in 2025 (REFERENCE.md "Azure as
/// recorded", "Tags"); an object or array value stays refused.
fn checked_tags(tags: &Value) -> Result<Value, ArmError> {
    check_tags(tags)?;
    let mut stored = tags.clone();
    if let Some(map) = stored.as_object_mut() {
        for v in map.values_mut() {
            if v.is_number() || v.is_boolean() {
                *v = Value::String(v.to_string());
            }
        }
    }
    Ok(stored)
}

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
        let text = match v {
            Value::String(text) => text.clone(),
            Value::Number(_) | Value::Bool(_) => v.to_string(),
            Value::Null | Value::Array(_) | Value::Object(_) => {
                return Err(bad(
                    "InvalidParameter",
                    &format!("The value of tag '{k}' must be a string."),
                )
                .target("tags"))
            }
        };
        let v = text.as_str();
        if v.chars().count() > 256 {
            return Err(bad("InvalidTagValueLength", &format!("Tag value too large. Following tag value '{v}' exceeded the maximum length. Maximum allowed length for tag value - '256' characters.")));
        }
    }
    Ok(())
}
