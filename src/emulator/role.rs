//! Role enforcement (`emulator --role FILE`): Azure RBAC for the tool's identity.
//!
//! The role is assigned to the identity the tool uses against the emulator: requests that carry
//! the development bearer token (`--auth emulator`) or a Shared Key signature with the development
//! account key. Every such request needs the action (ARM) or data action (blob) that Azure would
//! check for it; one outside the role is refused with 403 — `AuthorizationFailed` from ARM,
//! `AuthorizationPermissionMismatch` from blob storage — naming the action.
//!
//! Any other bearer token acts as the subscription's Owner, so tests can prepare resources the
//! tool must never create itself (galleries, VMs). Requests without credentials are left to the
//! handlers, which answer 401 as Azure does (authentication is checked before authorization).
//!
//! Where the role is assigned: at every scope by default, or only at the scopes given
//! ([`Role::assigned_at`], `emulator --role-scope SCOPE`). Outside them ARM refuses a request
//! with 403 `AuthorizationFailed`, except a list whose scope lies *above* an assignment (a
//! subscription-wide VM list with the role assigned at one resource group): Azure answers that
//! with 200 and only the resources the caller may read (projectkudu/AzureResourceExplorer#254),
//! so the emulator filters the list the same way. `GET {scope}/providers/Microsoft.Authorization/
//! permissions` answers the role's actions at scopes the assignment covers, `{"value": []}` for
//! the Owner-less remainder (Azure/azure-rest-api-specs authorization 2022-04-01
//! `Permissions_ListForResourceGroup`); whether Azure checks `Microsoft.Authorization/
//! permissions/read` for that call is not documented, so the emulator requires it (stricter).
//!
//! Two deliberate differences from Azure: blob requests are judged by the role alone (the
//! emulator's storage account has no ARM scope), and the account key is held to the
//! role's data actions, whereas Azure lets the account key bypass RBAC. The tool reaches storage
//! with a token in production (`StorageAuth::Token`), so the data actions are what its identity
//! needs there; holding the key to them here proves that on the emulator.

use std::path::Path;

use anyhow::Context as _;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::admin::glob_match;
use super::arm::{self, ArmError, Target};
use super::blob::{self, StorageError};
use crate::devstore::EMULATOR_TOKEN;

/// A custom role: the actions and data actions it grants (wildcards allowed, as in Azure).
#[derive(Debug, Clone, Default)]
pub struct Role {
    pub name: String,
    pub actions: Vec<String>,
    pub not_actions: Vec<String>,
    pub data_actions: Vec<String>,
    pub not_data_actions: Vec<String>,
    /// Where the role is assigned (ARM scopes, compared case-insensitively); empty: everywhere.
    pub scopes: Vec<String>,
}

/// `az role definition create --role-definition` takes PascalCase keys at the top level;
/// `az role definition list` prints camelCase keys under `permissions`. Both are read.
#[derive(Deserialize)]
struct RoleFile {
    #[serde(alias = "Name", alias = "roleName", default)]
    name: String,
    #[serde(flatten)]
    top: Permissions,
    #[serde(default)]
    permissions: Vec<Permissions>,
}

#[derive(Deserialize, Default)]
struct Permissions {
    #[serde(alias = "Actions", default)]
    actions: Vec<String>,
    #[serde(alias = "NotActions", rename = "notActions", default)]
    not_actions: Vec<String>,
    #[serde(alias = "DataActions", rename = "dataActions", default)]
    data_actions: Vec<String>,
    #[serde(alias = "NotDataActions", rename = "notDataActions", default)]
    not_data_actions: Vec<String>,
}

impl Role {
    /// Parse a role definition document.
    pub fn from_json(text: &str) -> anyhow::Result<Role> {
        let file: RoleFile = serde_json::from_str(text).context(
            "not a role definition (expected Azure's JSON with Actions / DataActions, as \
             `az role definition create --role-definition` takes)",
        )?;
        let mut role = Role {
            name: file.name,
            ..Role::default()
        };
        for p in std::iter::once(file.top).chain(file.permissions) {
            role.actions.extend(p.actions);
            role.not_actions.extend(p.not_actions);
            role.data_actions.extend(p.data_actions);
            role.not_data_actions.extend(p.not_data_actions);
        }
        if role.actions.is_empty() && role.data_actions.is_empty() {
            anyhow::bail!("the role grants no actions and no data actions");
        }
        Ok(role)
    }

    /// Read a role definition file.
    pub fn load(path: &Path) -> anyhow::Result<Role> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the role file {}", path.display()))?;
        Role::from_json(&text).with_context(|| format!("in the role file {}", path.display()))
    }

    /// A copy without one action or data action (for proving each is needed).
    pub fn without(&self, action: &str) -> Role {
        let keep = |v: &[String]| {
            v.iter()
                .filter(|a| !a.eq_ignore_ascii_case(action))
                .cloned()
                .collect()
        };
        Role {
            name: self.name.clone(),
            actions: keep(&self.actions),
            not_actions: self.not_actions.clone(),
            data_actions: keep(&self.data_actions),
            not_data_actions: self.not_data_actions.clone(),
            scopes: self.scopes.clone(),
        }
    }

    /// The same role, assigned only at these scopes (e.g. one resource group).
    pub fn assigned_at<S: AsRef<str>>(mut self, scopes: &[S]) -> Role {
        self.scopes = scopes
            .iter()
            .map(|s| normalise_scope(s.as_ref()))
            .filter(|s| !s.is_empty())
            .collect();
        self
    }

    /// Whether an assignment covers `path` (is at or above it).
    pub fn covers(&self, path: &str) -> bool {
        let path = normalise_scope(path);
        self.scopes.is_empty() || self.scopes.iter().any(|s| within(&path, s))
    }

    /// The assignments strictly below `path`: a list at `path` shows only what lies under them.
    fn below(&self, path: &str) -> Vec<String> {
        let path = normalise_scope(path);
        self.scopes
            .iter()
            .filter(|s| within(s, &path) && **s != path)
            .cloned()
            .collect()
    }

    /// Whether the role grants `action` (a data action when `data`).
    pub fn allows(&self, action: &str, data: bool) -> bool {
        let (grants, denies) = if data {
            (&self.data_actions, &self.not_data_actions)
        } else {
            (&self.actions, &self.not_actions)
        };
        let action = action.to_lowercase();
        let hit = |patterns: &[String]| {
            patterns
                .iter()
                .any(|p| glob_match(&p.to_lowercase(), &action))
        };
        hit(grants) && !hit(denies)
    }
}

fn normalise_scope(s: &str) -> String {
    s.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// Whether `path` is `scope` or lies under it (both normalised).
fn within(path: &str, scope: &str) -> bool {
    path == scope || path.starts_with(&format!("{scope}/"))
}

/// The action Azure checks for a request, and whether it is a data action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Required {
    pub action: String,
    pub data: bool,
}

const CONTAINERS: &str = "Microsoft.Storage/storageAccounts/blobServices/containers";

/// The action an ARM request needs, `None` for paths the emulator does not serve (they get their
/// own error from the handler).
pub fn arm_action(method: &Method, path: &str) -> Option<Required> {
    let verb = match *method {
        Method::GET | Method::HEAD => "read",
        Method::PUT | Method::PATCH => "write",
        Method::DELETE => "delete",
        _ => "action",
    };
    let action = match arm::parse_target(path).ok()? {
        Target::Item(addr) => format!("{}/{verb}", addr.kind.arm_type()),
        Target::List { kind, .. } => format!("{}/read", kind.arm_type()),
        Target::Operation { .. } => "Microsoft.Compute/locations/operations/read".into(),
        Target::Resources { .. } => {
            "Microsoft.Resources/subscriptions/resourceGroups/resources/read".into()
        }
        Target::StorageAccounts { .. } => "Microsoft.Storage/storageAccounts/read".into(),
        // Management locks (learn.microsoft.com REST "Management Locks": "you must have access to
        // Microsoft.Authorization/* or Microsoft.Authorization/locks/* actions"): read for a
        // lock or the list, write to create or replace one, delete to remove one.
        Target::Lock { name: Some(_), .. } => format!("Microsoft.Authorization/locks/{verb}"),
        Target::Lock { name: None, .. } => "Microsoft.Authorization/locks/read".into(),
    };
    Some(Required {
        action,
        data: false,
    })
}

/// The permission a blob request needs, after Azure's table "Permissions for calling blob and
/// queue data operations": container create/read are container actions; reading, listing,
/// writing (Put Blob, Put Page, metadata, leases) and deleting blobs are data actions.
pub fn blob_action(method: &Method, path: &str, query: &str) -> Option<Required> {
    let rest = path
        .strip_prefix('/')
        .and_then(|p| p.strip_prefix(crate::devstore::DEV_ACCOUNT))?
        .trim_start_matches('/');
    let has_blob = matches!(rest.split_once('/'), Some((_, b)) if !b.is_empty());
    if rest.is_empty() {
        // Account-level requests (list containers).
        return Some(Required {
            action: format!("{CONTAINERS}/read"),
            data: false,
        });
    }
    let params: Vec<(String, String)> = url::form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.to_lowercase(), v.into_owned()))
        .collect();
    let param = |name: &str| {
        params
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let (action, data) = if !has_blob && param("comp") == Some("list") {
        ("blobs/read", true)
    } else if !has_blob {
        match *method {
            Method::GET | Method::HEAD => ("read", false),
            Method::DELETE => ("delete", false),
            _ => ("write", false),
        }
    } else {
        match *method {
            Method::GET | Method::HEAD => ("blobs/read", true),
            Method::DELETE => ("blobs/delete", true),
            _ => ("blobs/write", true),
        }
    };
    Some(Required {
        action: format!("{CONTAINERS}/{action}"),
        data,
    })
}

/// Whether the request is made as the tool's identity (the identity the role is assigned to).
fn is_tool_identity(headers: &HeaderMap) -> bool {
    let auth = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if let Some(token) = auth
        .strip_prefix("Bearer ")
        .or_else(|| auth.strip_prefix("bearer "))
    {
        return token.trim() == EMULATOR_TOKEN;
    }
    auth.starts_with("SharedKey ")
}

/// The 403 for a request outside the role, `None` when it is allowed (or not the tool's).
pub(crate) fn deny(
    role: &Role,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
) -> Option<Response> {
    if !is_tool_identity(headers) {
        return None;
    }
    if blob::is_blob_path(path) {
        let need = blob_action(method, path, query)?;
        if role.allows(&need.action, need.data) {
            return None;
        }
        let kind = if need.data { "data action" } else { "action" };
        Some(
            StorageError::new(
                StatusCode::FORBIDDEN,
                "AuthorizationPermissionMismatch",
                &format!(
                    "This request is not authorized to perform this operation using this permission. \
                     The role '{}' does not grant the {kind} '{}'.",
                    role.name, need.action
                ),
            )
            .into_response(),
        )
    } else {
        let need = arm_action(method, path)?;
        // Operation status URLs sit at subscription/location level; Azure lets the caller who
        // started the operation poll it whatever scope its role has (every resource-group-scoped
        // service principal follows its own long-running operations).
        let operation = matches!(arm::parse_target(path), Ok(Target::Operation { .. }));
        let in_scope =
            role.covers(path) || operation || list_filter(role, method, path, headers).is_some();
        if in_scope && role.allows(&need.action, false) {
            return None;
        }
        let scope = path
            .split("/providers/Microsoft.Compute/locations/")
            .next()
            .unwrap_or(path);
        deny_action(&need.action, scope)
    }
}

/// For a list the tool's identity may see only part of (its role is assigned below the list's
/// scope): the assignment scopes whose resources the answer keeps. `None`: not such a list.
pub(crate) fn list_filter(
    role: &Role,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> Option<Vec<String>> {
    if !is_tool_identity(headers) || *method != Method::GET || role.covers(path) {
        return None;
    }
    let list_scope = match arm::parse_target(path) {
        Ok(Target::List { scope, .. }) => match scope {
            arm::Scope::Sub(s) | arm::Scope::Rg(s) | arm::Scope::Parent(_, s, _) => s,
        },
        // ARM filters a subscription's storage-account list to the accounts the caller may read.
        Ok(Target::StorageAccounts { sub }) => sub,
        _ => return None,
    };
    let below = role.below(&list_scope);
    (!below.is_empty()).then_some(below)
}

/// Keep only the items of an ARM list body that lie under one of `scopes`.
pub(crate) fn filter_list_body(body: &mut serde_json::Value, scopes: &[String]) {
    if let Some(items) = body.get_mut("value").and_then(|v| v.as_array_mut()) {
        items.retain(|item| {
            let id = item
                .get("id")
                .and_then(|v| v.as_str())
                .map(normalise_scope)
                .unwrap_or_default();
            scopes.iter().any(|s| within(&id, s))
        });
    }
}

/// `GET {scope}/providers/Microsoft.Authorization/permissions`: the caller's permissions at the
/// scope, one entry per assignment at or above it. `None` when `path` is not that call.
pub(crate) fn permissions(
    role: Option<&Role>,
    path: &str,
    headers: &HeaderMap,
) -> Option<Response> {
    const SUFFIX: &str = "/providers/microsoft.authorization/permissions";
    let lower = path.trim_end_matches('/').to_ascii_lowercase();
    let scope = lower.strip_suffix(SUFFIX)?;
    if !scope.starts_with("/subscriptions/") {
        return None;
    }
    let entry = |actions: Vec<String>,
                 not_actions: Vec<String>,
                 data: Vec<String>,
                 not_data: Vec<String>| {
        serde_json::json!({"actions": actions, "notActions": not_actions,
                           "dataActions": data, "notDataActions": not_data})
    };
    let owner = || entry(vec!["*".into()], vec![], vec![], vec![]);
    let value = match role {
        Some(role) if is_tool_identity(headers) => {
            const READ: &str = "Microsoft.Authorization/permissions/read";
            // Assigned only below this scope, nothing holds here: reading one's permissions is
            // itself an action on the scope, so it is refused (stricter than an empty list).
            if !role.covers(scope) || !role.allows(READ, false) {
                return deny_action(READ, scope);
            }
            vec![entry(
                role.actions.clone(),
                role.not_actions.clone(),
                role.data_actions.clone(),
                role.not_data_actions.clone(),
            )]
        }
        _ => vec![owner()],
    };
    Some(axum::Json(serde_json::json!({ "value": value })).into_response())
}

fn deny_action(action: &str, scope: &str) -> Option<Response> {
    Some(
        ArmError::new(
            StatusCode::FORBIDDEN,
            "AuthorizationFailed",
            &format!(
                "The client with object id '00000000-0000-0000-0000-00000000e001' does not have                  authorization to perform action '{action}' over scope '{scope}' or the scope is                  invalid. If access was recently granted, please refresh your credentials."
            ),
        )
        .into_response(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLE: &str = include_str!("../../deploy/azure/role-definition.json");

    fn need(method: Method, path: &str, query: &str) -> String {
        if blob::is_blob_path(path) {
            blob_action(&method, path, query).unwrap().action
        } else {
            arm_action(&method, path).unwrap().action
        }
    }

    #[test]
    fn requests_map_to_the_actions_azure_checks() {
        let g = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g";
        assert_eq!(need(Method::GET, g, ""), "Microsoft.Compute/galleries/read");
        assert_eq!(
            need(Method::PUT, &format!("{g}/images/i"), ""),
            "Microsoft.Compute/galleries/images/write"
        );
        assert_eq!(
            need(Method::GET, &format!("{g}/images"), ""),
            "Microsoft.Compute/galleries/images/read"
        );
        assert_eq!(
            need(Method::DELETE, &format!("{g}/images/i/versions/1.2.3"), ""),
            "Microsoft.Compute/galleries/images/versions/delete"
        );
        assert_eq!(
            need(Method::PATCH, &format!("{g}/images/i/versions/1.2.3"), ""),
            "Microsoft.Compute/galleries/images/versions/write"
        );
        assert_eq!(
            need(
                Method::GET,
                "/subscriptions/s/providers/Microsoft.Compute/locations/westeurope/operations/abc",
                ""
            ),
            "Microsoft.Compute/locations/operations/read"
        );
        assert_eq!(
            need(
                Method::GET,
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines",
                ""
            ),
            "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"
        );
        assert_eq!(
            need(
                Method::GET,
                "/subscriptions/s/providers/Microsoft.Storage/storageAccounts",
                ""
            ),
            "Microsoft.Storage/storageAccounts/read"
        );
        assert_eq!(
            need(
                Method::PUT,
                "/devstoreaccount1/stemcell",
                "restype=container"
            ),
            "Microsoft.Storage/storageAccounts/blobServices/containers/write"
        );
        assert_eq!(
            need(
                Method::GET,
                "/devstoreaccount1/stemcell",
                "restype=container&comp=list"
            ),
            "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/read"
        );
        assert_eq!(
            need(
                Method::PUT,
                "/devstoreaccount1/stemcell/a/b.vhd",
                "comp=page"
            ),
            "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write"
        );
        assert_eq!(
            need(
                Method::PUT,
                "/devstoreaccount1/stemcell/x.lock",
                "comp=lease"
            ),
            "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/write"
        );
        assert_eq!(
            need(Method::DELETE, "/devstoreaccount1/stemcell/x.vhd", ""),
            "Microsoft.Storage/storageAccounts/blobServices/containers/blobs/delete"
        );
        let locks = format!("{g}/images/i/versions/1.2.3/providers/Microsoft.Authorization/locks");
        assert_eq!(
            need(Method::GET, &locks, ""),
            "Microsoft.Authorization/locks/read"
        );
        assert_eq!(
            need(Method::GET, &format!("{locks}/keep"), ""),
            "Microsoft.Authorization/locks/read"
        );
        assert_eq!(
            need(Method::PUT, &format!("{locks}/keep"), ""),
            "Microsoft.Authorization/locks/write"
        );
        assert_eq!(
            need(
                Method::DELETE,
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Authorization/locks/keep",
                ""
            ),
            "Microsoft.Authorization/locks/delete"
        );
        assert_eq!(
            need(
                Method::GET,
                "/subscriptions/s/providers/Microsoft.Authorization/locks",
                ""
            ),
            "Microsoft.Authorization/locks/read"
        );
    }

    /// A role without the lock actions may not touch locks; `Microsoft.Authorization/locks/*`
    /// (as Owner and User Access Administrator have it) may, at the scopes it is assigned to.
    #[test]
    fn lock_requests_need_the_lock_actions() {
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            format!("Bearer {EMULATOR_TOKEN}").parse().unwrap(),
        );
        let lock = "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/galleries/g/providers/Microsoft.Authorization/locks/keep";
        let gallery_only = Role {
            actions: vec!["Microsoft.Compute/galleries/*".into()],
            ..Role::default()
        };
        for m in [Method::GET, Method::PUT, Method::DELETE] {
            let resp = deny(&gallery_only, &m, lock, "", &h).expect("denied");
            assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{m}");
        }
        let locker = Role {
            actions: vec!["Microsoft.Authorization/locks/*".into()],
            ..Role::default()
        };
        for m in [Method::GET, Method::PUT, Method::DELETE] {
            assert!(deny(&locker, &m, lock, "", &h).is_none(), "{m}");
        }
        let reader = Role {
            actions: vec!["Microsoft.Authorization/locks/read".into()],
            ..Role::default()
        };
        assert!(deny(&reader, &Method::GET, lock, "", &h).is_none());
        assert!(deny(&reader, &Method::PUT, lock, "", &h).is_some());
        let elsewhere = locker.assigned_at(&["/subscriptions/S/resourceGroups/other"]);
        assert!(deny(&elsewhere, &Method::GET, lock, "", &h).is_some());
    }

    #[test]
    fn wildcards_and_not_actions_work_as_in_azure() {
        let role = Role {
            actions: vec!["Microsoft.Compute/galleries/*".into()],
            not_actions: vec!["Microsoft.Compute/galleries/images/versions/delete".into()],
            ..Role::default()
        };
        assert!(role.allows("microsoft.compute/galleries/images/write", false));
        assert!(!role.allows("Microsoft.Compute/galleries/images/versions/delete", false));
        assert!(!role.allows("Microsoft.Compute/disks/read", false));
        assert!(!role.allows("Microsoft.Compute/galleries/read", true));
    }

    #[test]
    fn the_shipped_role_parses_and_without_removes_one_action() {
        let role = Role::from_json(ROLE).unwrap();
        assert!(role.allows("Microsoft.Compute/galleries/images/versions/write", false));
        let less = role.without("Microsoft.Compute/galleries/images/versions/write");
        assert!(!less.allows("Microsoft.Compute/galleries/images/versions/write", false));
        assert_eq!(less.actions.len() + 1, role.actions.len());
    }

    #[test]
    fn the_az_cli_list_format_parses_too() {
        let role = Role::from_json(
            r#"{"roleName": "r", "permissions": [{"actions": ["Microsoft.Compute/disks/read"],
                "notActions": [], "dataActions": [], "notDataActions": []}]}"#,
        )
        .unwrap();
        assert!(role.allows("Microsoft.Compute/disks/read", false));
        assert!(Role::from_json(r#"{"Name": "empty"}"#).is_err());
        assert!(Role::from_json("[]").is_err());
    }

    #[test]
    fn only_the_tools_identity_is_held_to_the_role() {
        let role = Role {
            actions: vec!["Microsoft.Compute/galleries/read".into()],
            ..Role::default()
        };
        let path = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g";
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            format!("Bearer {EMULATOR_TOKEN}").parse().unwrap(),
        );
        assert!(deny(&role, &Method::GET, path, "", &h).is_none());
        let resp = deny(&role, &Method::PUT, path, "", &h).expect("denied");
        assert_eq!(resp.status(), StatusCode::FORBIDDEN);
        h.insert("authorization", "Bearer owner-token".parse().unwrap());
        assert!(deny(&role, &Method::PUT, path, "", &h).is_none());
        assert!(deny(&role, &Method::PUT, path, "", &HeaderMap::new()).is_none());
    }

    /// A role assigned at one resource group: inside it the role's actions hold; a list above it is
    /// answered (and filtered); anything else outside it is refused; the permissions list at the
    /// subscription is refused, at the resource group it names the role's actions.
    #[test]
    fn a_role_assigned_at_a_resource_group_holds_only_there() {
        let role = Role::from_json(ROLE)
            .unwrap()
            .assigned_at(&["/subscriptions/S/resourceGroups/RG"]);
        let mut h = HeaderMap::new();
        h.insert(
            "authorization",
            format!("Bearer {EMULATOR_TOKEN}").parse().unwrap(),
        );
        let inside = "/subscriptions/s/resourcegroups/rg/providers/Microsoft.Compute/galleries/g";
        let outside =
            "/subscriptions/S/resourceGroups/other/providers/Microsoft.Compute/virtualMachines/vm";
        let list = "/subscriptions/S/providers/Microsoft.Compute/virtualMachines";
        assert!(deny(&role, &Method::GET, inside, "", &h).is_none());
        assert_eq!(
            deny(&role, &Method::GET, outside, "", &h).map(|r| r.status()),
            Some(StatusCode::FORBIDDEN)
        );
        assert!(deny(&role, &Method::GET, list, "", &h).is_none());
        assert_eq!(
            list_filter(&role, &Method::GET, list, &h),
            Some(vec!["/subscriptions/s/resourcegroups/rg".to_string()])
        );
        assert_eq!(list_filter(&role, &Method::GET, inside, &h), None);
        let mut body = serde_json::json!({"value": [
            {"id": "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/a"},
            {"id": "/subscriptions/S/resourceGroups/RG2/providers/Microsoft.Compute/virtualMachines/b"}
        ]});
        filter_list_body(
            &mut body,
            &["/subscriptions/s/resourcegroups/rg".to_string()],
        );
        assert_eq!(body["value"].as_array().unwrap().len(), 1);
        let sub = permissions(
            Some(&role),
            "/subscriptions/S/providers/Microsoft.Authorization/permissions",
            &h,
        )
        .unwrap();
        assert_eq!(sub.status(), StatusCode::FORBIDDEN);
        let rg = permissions(
            Some(&role),
            "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Authorization/permissions",
            &h,
        )
        .unwrap();
        assert_eq!(rg.status(), StatusCode::OK);
        // Everywhere (the default): the subscription's permissions are the role's.
        let everywhere = Role::from_json(ROLE).unwrap();
        assert_eq!(
            permissions(
                Some(&everywhere),
                "/subscriptions/S/providers/Microsoft.Authorization/permissions",
                &h
            )
            .unwrap()
            .status(),
            StatusCode::OK
        );
        assert!(permissions(
            Some(&everywhere),
            "/subscriptions/S/providers/Microsoft.Compute/disks",
            &h
        )
        .is_none());
    }
}
