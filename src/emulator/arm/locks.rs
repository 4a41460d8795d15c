//! Management locks (`Microsoft.Authorization/locks`), an extension resource of any scope the
//! emulator knows — a subscription, a resource group, a gallery, definition, version, VM, scale
//! set (and instance) or disk — and the refusals they cause.
//!
//! Sources (REFERENCE.md "Management locks"): learn.microsoft.com REST "Management Locks"
//! (Create Or Update By Scope / At Resource Level, Delete, Get, List), "Lock your resources to
//! protect your infrastructure", the Azure SDK docs ("Lists management locks associated with the
//! specified resource, its resource group and any resources below the resource"), and
//! azure-powershell `Get-AzResourceLock` (`-AtScope`: "all locks at or above the specified scope";
//! without it "at, above, or below the scope").
//!
//! - `PUT {scope}/providers/Microsoft.Authorization/locks/{name}` with
//!   `{"properties": {"level": "CanNotDelete" | "ReadOnly", "notes"?, "owners"?}}`: 201 when new,
//!   200 when it replaces a lock of that name (names compare case-insensitively; the first PUT's
//!   spelling stays). `GET` one (at exactly that scope), `DELETE` one (200, or 204 when absent),
//!   and the list `GET {scope}/providers/Microsoft.Authorization/locks` (locks at, above and below
//!   the scope; `$filter=atScope()`: at and above), paged like every list here.
//! - A DELETE of a resource with a lock at it, above it or below it (deleting it would delete
//!   what is below), and a PUT or PATCH of one with a `ReadOnly` lock at or above it, are refused
//!   with 409 `ScopeLocked` ([`refuse_if_locked`], from the router, before the resource's own
//!   handler). Reads never are; lock requests never are.
//! - A lock at a resource goes with the resource ([`drop_orphans`]).
//!
//! What Azure answers, where a public source shows it:
//! - api-versions: 2016-09-01 and 2020-05-01 here. Azure also serves 2015-01-01 and 2017-04-01
//!   (fewer here: the stricter reading); any other is refused with 400 `NoRegisteredProviderFound`
//!   "No registered resource provider found for location '…' and API version '…' for type
//!   'locks'. The supported api-versions are '…'. The supported locations are ''."
//!   (azure-sdk-for-go #18835, azure-cli #2695; the location of a subscription or group lock is
//!   not recorded: `global` here). 2020-05-01 was refused in some regions in 2022 (bicep #7495);
//!   Microsoft's own Azure Verified Modules deploy locks at 2020-05-01 today.
//! - A body member the lock does not have: 400 `InvalidRequestContent` "… Could not find member
//!   'level' on object of type 'ManagementLockDefinition' …" (azure-sdk-for-net #2542, a body
//!   without `properties`). The same for members of `properties` is by analogy (unverified).
//! - A lock on a resource group that does not exist: 404 `ResourceGroupNotFound` (pulumi #3891);
//!   the emulator does not model groups (no other request here checks one), so it never answers
//!   that. A lock on a resource that does not exist: 404, Azure's `ResourceNotFound` for the
//!   resource (unverified for locks; terraform-provider-azurerm deletes locks expecting a 404
//!   "in case the parent is gone").
//! - A lock with `owners` belongs to those applications: deleting it as anyone else is refused
//!   with 401 `UnauthorizedApplicationId` "The management lock '…' is owned by system
//!   application(s) '…'. Please see https://aka.ms/arm-lock for detail." (MicrosoftDocs/azure-docs
//!   #22411). No caller of the emulator presents an application id, so an owned lock can never be
//!   deleted here; replacing it by PUT is refused the same way (unverified: the harsher reading).
//! - Lock names: the REST reference allows up to 260 characters without `<>%&:\?/` or control
//!   characters; the template reference (and the naming-rules page) 1–90 alphanumerics, periods,
//!   underscores, hyphens and parentheses, not ending in a period. Both hold here.
//! - Unverified codes (no public answer found): 400 `InvalidLockName` for a bad name, 400
//!   `InvalidRequestContent` for a missing or unknown level, notes over 512 characters or
//!   malformed owners, 404 `LockNotFound` for a GET of a lock that is not there, and how
//!   ScopeLocked lists several locked scopes (`'a', 'b'` here).
//! - Left out: Azure's eventual consistency (terraform-provider-azurerm polls a lock's GET after
//!   its PUT and DELETE), `systemData` at 2020-05-01, locks at management-group or tenant scope.

use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use super::lro::settle;
use super::paths::{Addr, LockScope};
use super::read::page;
use super::render::{bad, conflict, not_found, ArmError};
use super::router::Ctx;
use super::{eq, strip_nulls};
use crate::emulator::store::{Data, Lock};
use crate::emulator::State;

const API_VERSIONS: [&str; 2] = ["2016-09-01", "2020-05-01"];
const TYPE: &str = "Microsoft.Authorization/locks";
const CAN_NOT_DELETE: &str = "CanNotDelete";
const READ_ONLY: &str = "ReadOnly";
const NOTES_MAX: usize = 512;
const NAME_MAX: usize = 90;

/// Serve a lock request (GET, PUT or DELETE of one lock, GET of the list); `None` for any other
/// method, which the router refuses as it refuses unknown methods.
pub(super) fn handle(
    ctx: &Ctx,
    method: &Method,
    scope: &LockScope,
    name: Option<&str>,
    bytes: &[u8],
) -> Option<Result<Response, ArmError>> {
    let served = matches!(
        (method, name),
        (&Method::GET, _) | (&Method::PUT | &Method::DELETE, Some(_))
    );
    if !served {
        return None;
    }
    Some(check_api_version(ctx, scope).and_then(|()| match name {
        None => list(ctx, scope),
        Some(n) if *method == Method::GET => get(ctx, scope, n),
        Some(n) if *method == Method::PUT => put(ctx, scope, n, bytes),
        Some(n) => delete(ctx, scope, n),
    }))
}

fn check_api_version(ctx: &Ctx, scope: &LockScope) -> Result<(), ArmError> {
    if API_VERSIONS.contains(&ctx.api_version.as_str()) {
        return Ok(());
    }
    let location = match scope {
        LockScope::Resource(a) => ctx
            .state
            .data()
            .resources
            .get(&a.key)
            .and_then(|r| r.body.get("location").and_then(Value::as_str))
            .map(super::norm_location)
            .unwrap_or_else(|| "global".into()),
        _ => "global".into(),
    };
    Err(bad(
        "NoRegisteredProviderFound",
        &format!(
            "No registered resource provider found for location '{location}' and API version '{}' for type 'locks'. The supported api-versions are '{}'. The supported locations are ''.",
            ctx.api_version,
            API_VERSIONS.join(", ")
        ),
    ))
}

/// The lower-cased id of lock `name` at `scope`: its key in [`Data::locks`].
fn lock_key(scope_key: &str, name: &str) -> String {
    format!(
        "{scope_key}/providers/microsoft.authorization/locks/{}",
        name.to_lowercase()
    )
}

/// Whether `key` is `scope` or lies below it (both lower-cased ids).
fn within(key: &str, scope: &str) -> bool {
    key == scope
        || key
            .strip_prefix(scope)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The lock as Azure answers it: `{id, type, name, properties: {level, notes?, owners?}}`.
fn render(l: &Lock) -> Value {
    let mut props = json!({ "level": l.level });
    if let Some(notes) = &l.notes {
        props["notes"] = json!(notes);
    }
    if let Some(owners) = &l.owners {
        props["owners"] = owners.clone();
    }
    json!({
        "id": format!("{}/providers/{TYPE}/{}", l.scope, l.name),
        "type": TYPE,
        "name": l.name,
        "properties": props,
    })
}

/// Bring the scope's resource up to date (an overdue DELETE completes, taking its locks) and
/// check it exists; subscriptions and groups always do here.
fn check_scope(ctx: &Ctx, data: &mut Data, scope: &LockScope) -> Result<(), ArmError> {
    if let LockScope::Resource(a) = scope {
        settle(&ctx.state, data, &a.key);
        if !data.resources.contains_key(&a.key) {
            return Err(not_found(a));
        }
    }
    Ok(())
}

fn list(ctx: &Ctx, scope: &LockScope) -> Result<Response, ArmError> {
    let at_scope = match ctx.query.get("$filter") {
        None => false,
        Some(f) if eq(&f.replace(' ', ""), "atScope()") => true,
        Some(f) => {
            return Err(bad(
                "InvalidFilterInQueryString",
                &format!("Invalid $filter '{f}' specified in the query string."),
            ))
        }
    };
    let mut data = ctx.state.data();
    check_scope(ctx, &mut data, scope)?;
    let key = scope.key();
    let items: Vec<&Lock> = data
        .locks
        .values()
        .filter(|l| {
            let at = l.scope.to_lowercase();
            within(&key, &at) || (!at_scope && within(&at, &key))
        })
        .collect();
    page(ctx, &items, |l| render(l))
}

fn lock_not_found(name: &str) -> ArmError {
    ArmError::new(
        StatusCode::NOT_FOUND,
        "LockNotFound",
        &format!("The lock '{name}' could not be found."),
    )
}

fn get(ctx: &Ctx, scope: &LockScope, name: &str) -> Result<Response, ArmError> {
    let mut data = ctx.state.data();
    check_scope(ctx, &mut data, scope)?;
    let lock = data
        .locks
        .get(&lock_key(&scope.key(), name))
        .ok_or_else(|| lock_not_found(name))?;
    Ok((StatusCode::OK, axum::Json(render(lock))).into_response())
}

fn put(ctx: &Ctx, scope: &LockScope, name: &str, bytes: &[u8]) -> Result<Response, ArmError> {
    check_name(name)?;
    let (level, notes, owners) = lock_properties(bytes)?;
    let mut data = ctx.state.data();
    check_scope(ctx, &mut data, scope)?;
    let key = lock_key(&scope.key(), name);
    let old = data.locks.get(&key).cloned();
    if let Some(owned) = old.as_ref().and_then(owned_refusal) {
        return Ok(owned);
    }
    let lock = Lock {
        scope: old
            .as_ref()
            .map(|l| l.scope.clone())
            .unwrap_or_else(|| scope.id().to_string()),
        at_resource: matches!(scope, LockScope::Resource(_)),
        name: old
            .as_ref()
            .map(|l| l.name.clone())
            .unwrap_or_else(|| name.to_string()),
        level,
        notes,
        owners,
    };
    let body = render(&lock);
    data.locks.insert(key, lock);
    drop(data);
    ctx.state.changed();
    let status = if old.is_some() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, axum::Json(body)).into_response())
}

fn delete(ctx: &Ctx, scope: &LockScope, name: &str) -> Result<Response, ArmError> {
    let mut data = ctx.state.data();
    check_scope(ctx, &mut data, scope)?;
    let key = lock_key(&scope.key(), name);
    let Some(lock) = data.locks.get(&key) else {
        return Ok(StatusCode::NO_CONTENT.into_response());
    };
    if let Some(owned) = owned_refusal(lock) {
        return Ok(owned);
    }
    data.locks.remove(&key);
    drop(data);
    ctx.state.changed();
    Ok(StatusCode::OK.into_response())
}

/// The 401 for changing a lock that names owners (MicrosoftDocs/azure-docs #22411); `None` for a
/// lock without. Sent without `WWW-Authenticate`: the caller's token is fine, its application is
/// not the lock's.
fn owned_refusal(lock: &Lock) -> Option<Response> {
    let apps: Vec<&str> = lock
        .owners
        .as_ref()
        .and_then(Value::as_array)?
        .iter()
        .filter_map(|o| o.get("applicationId").and_then(Value::as_str))
        .collect();
    if apps.is_empty() {
        return None;
    }
    let mut resp = ArmError::new(
        StatusCode::UNAUTHORIZED,
        "UnauthorizedApplicationId",
        &format!(
            "The management lock '{}' is owned by system application(s) '{}'. Please see https://aka.ms/arm-lock for detail.",
            lock.name,
            apps.join(", ")
        ),
    )
    .into_response();
    resp.headers_mut()
        .remove(axum::http::header::WWW_AUTHENTICATE);
    resp.headers_mut().insert(
        "x-ms-failure-cause",
        axum::http::HeaderValue::from_static("service"),
    );
    Some(resp)
}

/// A lock name both documented rules allow (see the module doc).
fn check_name(name: &str) -> Result<(), ArmError> {
    let len = name.chars().count();
    let ok = (1..=NAME_MAX).contains(&len)
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-()".contains(c))
        && !name.ends_with('.');
    if ok {
        return Ok(());
    }
    Err(bad(
        "InvalidLockName",
        &format!(
            "The lock name '{name}' is invalid. It must be 1 to {NAME_MAX} characters of letters, digits, periods, underscores, hyphens and parentheses, and must not end with a period."
        ),
    ))
}

fn invalid_content(detail: &str) -> ArmError {
    bad(
        "InvalidRequestContent",
        &format!("The request content was invalid and could not be deserialized: '{detail}'."),
    )
}

/// Members of `m` outside `known`, refused as Azure's deserializer refuses them.
fn only_members(m: &Map<String, Value>, known: &[&str], type_name: &str) -> Result<(), ArmError> {
    match m.keys().find(|k| !known.iter().any(|n| eq(n, k))) {
        Some(k) => Err(invalid_content(&format!(
            "Could not find member '{k}' on object of type '{type_name}'. Path '{k}'"
        ))),
        None => Ok(()),
    }
}

/// The level (canonical), notes and owners of a PUT body.
fn lock_properties(bytes: &[u8]) -> Result<(String, Option<String>, Option<Value>), ArmError> {
    let mut body: Value =
        serde_json::from_slice(bytes).map_err(|e| invalid_content(&e.to_string()))?;
    strip_nulls(&mut body);
    let top = body
        .as_object()
        .ok_or_else(|| invalid_content("The request content must be a JSON object"))?;
    only_members(
        top,
        &["id", "name", "type", "properties"],
        "ManagementLockDefinition",
    )?;
    let empty = Map::new();
    let props = match top.get("properties") {
        None => &empty,
        Some(Value::Object(p)) => p,
        Some(_) => return Err(invalid_content("'properties' must be an object")),
    };
    only_members(
        props,
        &["level", "notes", "owners"],
        "ManagementLockProperties",
    )?;
    let level = match props.get("level").and_then(Value::as_str) {
        Some(l) if eq(l, CAN_NOT_DELETE) => CAN_NOT_DELETE,
        Some(l) if eq(l, READ_ONLY) => READ_ONLY,
        Some(l) => return Err(invalid_content(&format!(
            "The lock level '{l}' is not supported: 'properties.level' must be 'CanNotDelete' or 'ReadOnly'"
        ))),
        None => return Err(invalid_content(
            "'properties.level' is required: 'CanNotDelete' or 'ReadOnly'",
        )),
    };
    let notes = match props.get("notes") {
        None => None,
        Some(Value::String(n)) if n.chars().count() <= NOTES_MAX => Some(n.clone()),
        Some(Value::String(_)) => {
            return Err(invalid_content(&format!(
                "'properties.notes' must be at most {NOTES_MAX} characters"
            )))
        }
        Some(_) => return Err(invalid_content("'properties.notes' must be a string")),
    };
    let owners = match props.get("owners") {
        None => None,
        Some(o) => Some(checked_owners(o)?),
    };
    Ok((level.to_string(), notes, owners))
}

/// `owners`: an array of `{"applicationId": "..."}`.
fn checked_owners(owners: &Value) -> Result<Value, ArmError> {
    let list = owners
        .as_array()
        .ok_or_else(|| invalid_content("'properties.owners' must be an array"))?;
    for owner in list {
        let m = owner
            .as_object()
            .ok_or_else(|| invalid_content("each of 'properties.owners' must be an object"))?;
        only_members(m, &["applicationId"], "ManagementLockOwner")?;
        if m.get("applicationId").is_some_and(|a| !a.is_string()) {
            return Err(invalid_content(
                "'properties.owners[].applicationId' must be a string",
            ));
        }
    }
    Ok(owners.clone())
}

/// 409 `ScopeLocked` for a request that a lock forbids: a DELETE of `a` while a lock is at it,
/// above it or below it; a PUT or PATCH of `a` while a `ReadOnly` lock is at or above it. Azure's
/// message (REFERENCE.md "Management locks"; quoted in Azure/azure-cli #20232, Azure/apiops #606,
/// Azure-Player/azure.datafactory.devops #183) names the resource and the locked scopes.
pub(super) fn refuse_if_locked(state: &State, method: &Method, a: &Addr) -> Result<(), ArmError> {
    let delete = *method == Method::DELETE;
    if !delete && !matches!(*method, Method::PUT | Method::PATCH) {
        return Ok(());
    }
    let data = state.data();
    let mut scopes: Vec<String> = Vec::new();
    for l in data.locks.values() {
        let at = l.scope.to_lowercase();
        let refuses = if delete {
            within(&a.key, &at) || within(&at, &a.key)
        } else {
            l.level == READ_ONLY && within(&a.key, &at)
        };
        if refuses && !scopes.iter().any(|s| eq(s, &l.scope)) {
            scopes.push(l.scope.clone());
        }
    }
    if scopes.is_empty() {
        return Ok(());
    }
    let operation = if delete { "delete" } else { "write" };
    Err(conflict(
        "ScopeLocked",
        &format!(
            "The scope '{}' cannot perform {operation} operation because following scope(s) are locked: '{}'. Please remove the lock and try again.",
            a.id,
            scopes.join("', '")
        ),
    ))
}

/// Forget the locks of resources that are gone (a DELETE completed, a world replaced the
/// consumers): a lock lives and dies with its scope.
pub(crate) fn drop_orphans(data: &mut Data) {
    let Data {
        resources, locks, ..
    } = data;
    locks.retain(|_, l| !l.at_resource || resources.contains_key(&l.scope.to_lowercase()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(scope: &str, level: &str) -> Lock {
        Lock {
            scope: scope.into(),
            at_resource: scope.contains("/providers/"),
            name: "l".into(),
            level: level.into(),
            notes: None,
            owners: None,
        }
    }

    #[test]
    fn a_scope_covers_what_lies_below_it_at_a_segment_boundary() {
        assert!(within(
            "/subscriptions/s/resourcegroups/rg/x",
            "/subscriptions/s/resourcegroups/rg"
        ));
        assert!(within("/subscriptions/s", "/subscriptions/s"));
        assert!(!within(
            "/subscriptions/s/resourcegroups/rg2",
            "/subscriptions/s/resourcegroups/rg"
        ));
        assert!(!within(
            "/subscriptions/s",
            "/subscriptions/s/resourcegroups/rg"
        ));
    }

    #[test]
    fn lock_names_follow_both_documented_rules() {
        for good in ["keep", "Keep-1", "a_b.c", "(stemcells)", &"a".repeat(90)] {
            assert!(check_name(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "ends.",
            "a b",
            "a:b",
            "a%b",
            "a&b",
            "a<b",
            "ü",
            &"a".repeat(91),
        ] {
            assert_eq!(
                check_name(bad).unwrap_err().code,
                "InvalidLockName",
                "{bad}"
            );
        }
    }

    #[test]
    fn a_lock_body_needs_a_known_level_and_nothing_azure_does_not_know() {
        let ok = |b: Value| lock_properties(b.to_string().as_bytes());
        let (level, notes, owners) =
            ok(json!({"properties": {"level": "cannotdelete", "notes": "n", "owners": [{"applicationId": "a"}]}}))
                .unwrap();
        assert_eq!(
            (level.as_str(), notes.as_deref()),
            ("CanNotDelete", Some("n"))
        );
        assert_eq!(owners, Some(json!([{"applicationId": "a"}])));
        let (level, notes, owners) =
            ok(json!({"properties": {"level": "ReadOnly", "notes": null}})).unwrap();
        assert_eq!((level.as_str(), notes, owners), ("ReadOnly", None, None));
        for bad in [
            json!({"level": "CanNotDelete"}),
            json!({"properties": {}}),
            json!({"properties": {"level": "NotSpecified"}}),
            json!({"properties": {"level": "ReadOnly", "notes": "x".repeat(513)}}),
            json!({"properties": {"level": "ReadOnly", "owners": "a"}}),
            json!({"properties": {"level": "ReadOnly", "extra": 1}}),
            json!([]),
        ] {
            let err = ok(bad.clone()).unwrap_err();
            assert_eq!(
                (err.status, err.code.as_str()),
                (StatusCode::BAD_REQUEST, "InvalidRequestContent"),
                "{bad}"
            );
        }
        assert!(ok(json!({"properties": {"level": "ReadOnly", "notes": "x".repeat(512)}})).is_ok());
    }

    #[test]
    fn a_lock_renders_with_the_id_of_its_own_scope() {
        let mut l = lock("/subscriptions/S/resourceGroups/RG", READ_ONLY);
        l.name = "Keep".into();
        assert_eq!(
            render(&l),
            json!({"id": "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Authorization/locks/Keep",
                   "type": "Microsoft.Authorization/locks", "name": "Keep",
                   "properties": {"level": "ReadOnly"}})
        );
    }

    #[test]
    fn locks_of_gone_resources_go_and_group_locks_stay() {
        let mut data = Data::default();
        let gone = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/d";
        data.locks.insert("a".into(), lock(gone, CAN_NOT_DELETE));
        data.locks.insert(
            "b".into(),
            lock("/subscriptions/s/resourceGroups/rg", CAN_NOT_DELETE),
        );
        drop_orphans(&mut data);
        assert_eq!(data.locks.keys().collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn a_delete_meets_locks_above_and_below_a_write_only_read_only_ones_above() {
        let state = State::new(&crate::emulator::Options::default()).unwrap();
        let rg = "/subscriptions/S/resourceGroups/RG";
        let gallery = format!("{rg}/providers/Microsoft.Compute/galleries/g");
        let version = format!("{gallery}/images/d/versions/1.0.0");
        state
            .data()
            .locks
            .insert("1".into(), lock(&version, CAN_NOT_DELETE));
        let addr = |id: &str| match super::super::paths::parse_target(id) {
            Ok(super::super::Target::Item(a)) => a,
            _ => panic!("{id}"),
        };
        let refused = refuse_if_locked(&state, &Method::DELETE, &addr(&gallery)).unwrap_err();
        assert_eq!(
            (refused.status, refused.code.as_str()),
            (StatusCode::CONFLICT, "ScopeLocked")
        );
        assert_eq!(
            refused.message,
            format!("The scope '{gallery}' cannot perform delete operation because following scope(s) are locked: '{version}'. Please remove the lock and try again.")
        );
        assert!(refuse_if_locked(&state, &Method::PATCH, &addr(&version)).is_ok());
        assert!(refuse_if_locked(&state, &Method::GET, &addr(&version)).is_ok());
        state.data().locks.insert("2".into(), lock(rg, READ_ONLY));
        let write = refuse_if_locked(&state, &Method::PUT, &addr(&version)).unwrap_err();
        assert!(
            write.message.contains("cannot perform write operation"),
            "{}",
            write.message
        );
        assert!(write.message.ends_with(&format!(
            "locked: '{rg}'. Please remove the lock and try again."
        )));
        let both = refuse_if_locked(&state, &Method::DELETE, &addr(&version)).unwrap_err();
        assert!(
            both.message.contains(&format!("'{version}', '{rg}'"))
                || both.message.contains(&format!("'{rg}', '{version}'")),
            "{}",
            both.message
        );
    }

    #[test]
    fn an_owned_lock_refuses_whoever_asks() {
        let mut l = lock("/subscriptions/s", CAN_NOT_DELETE);
        assert!(owned_refusal(&l).is_none());
        l.owners = Some(json!([{"applicationId": "app-1"}]));
        let resp = owned_refusal(&l).unwrap();
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        assert!(resp.headers().get("www-authenticate").is_none());
    }
}
