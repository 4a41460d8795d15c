//! Can the identity see every consumer of a scope? (issue 14, item 4)
//!
//! ARM answers a subscription-wide list (`GET /subscriptions/{s}/providers/Microsoft.Compute/
//! virtualMachines`) with **200 and only the resources the caller may read**: a role assigned at a
//! resource group below the listed scope silently filters the list rather than refusing it
//! (projectkudu/AzureResourceExplorer#254: "the ARM API handles RBAC permissions by simply
//! filtering out resources someone doesn't have access to, which can return empty or incomplete"
//! pages). An empty or short list is therefore no evidence that nothing uses a version.
//!
//! Before a consumer list counts, the caller's effective permissions **at the listed scope** are
//! read with `GET {scope}/providers/Microsoft.Authorization/permissions?api-version=2022-04-01`
//! (`{"value": [{"actions", "notActions", "dataActions", "notDataActions"}]}`, one entry per role
//! assignment at or above the scope; Azure/azure-rest-api-specs
//! specification/authorization/.../stable/2022-04-01, `Permissions_ListForResourceGroup` and
//! `Permissions_ListForResource`; the same path at subscription scope is what the portal and the
//! Azure samples call). Every read action the consumer scan needs must be granted there;
//! otherwise the scan is refused as unreadable evidence.
//!
//! The wildcard matcher is written here (a dozen lines) because no maintained crate implements
//! Azure RBAC's action patterns (`*`, `Microsoft.Compute/*`, `*/read`, case-insensitive).

use serde::Deserialize;

use crate::gallery::ConsumerKind;

/// The read actions the consumer scan needs at every scope it lists: `<type>/read` of every
/// consumer kind.
pub fn consumer_read_actions() -> Vec<String> {
    ConsumerKind::ALL
        .iter()
        .map(|k| format!("{}/read", k.resource_type()))
        .collect()
}

/// The api-version of the permissions list.
pub const PERMISSIONS_API_VERSION: &str = "2022-04-01";

/// One entry of the permissions list: one role assignment's grants at the scope.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Permission {
    #[serde(default)]
    pub actions: Vec<String>,
    #[serde(default, rename = "notActions")]
    pub not_actions: Vec<String>,
}

/// One page of the permissions list: its entries and the absolute URL of the next page.
#[derive(Debug, Deserialize)]
pub struct PermissionList {
    pub value: Vec<Permission>,
    #[serde(rename = "nextLink", default)]
    pub next_link: Option<String>,
}

/// Parse a page of the permissions list; `None` when it is not that document (unreadable
/// evidence).
pub fn parse(body: &[u8]) -> Option<PermissionList> {
    serde_json::from_slice::<PermissionList>(body).ok()
}

/// Azure RBAC action matching: `*` matches any run of characters, case-insensitively.
fn matches(pattern: &str, action: &str) -> bool {
    let p = pattern.trim().to_ascii_lowercase();
    let a = action.to_ascii_lowercase();
    let parts: Vec<&str> = p.split('*').collect();
    if parts.len() == 1 {
        return p == a;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !a.starts_with(first) || a.len() < first.len() + last.len() || !a.ends_with(last) {
        return false;
    }
    let mut rest = &a[first.len()..a.len() - last.len()];
    for mid in &parts[1..parts.len() - 1] {
        match rest.find(mid) {
            Some(i) => rest = &rest[i + mid.len()..],
            None => return false,
        }
    }
    true
}

/// Whether one of the assignments grants `action` (granted by its actions and not removed by
/// the same assignment's notActions).
pub fn grants(permissions: &[Permission], action: &str) -> bool {
    permissions.iter().any(|p| {
        p.actions.iter().any(|g| matches(g, action))
            && !p.not_actions.iter().any(|n| matches(n, action))
    })
}

/// The consumer read actions the permissions do not grant (empty: the scan sees the whole scope).
pub fn missing_consumer_reads(permissions: &[Permission]) -> Vec<String> {
    consumer_read_actions()
        .into_iter()
        .filter(|a| !grants(permissions, a))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scan_needs_the_read_of_every_consumer_kind() {
        assert_eq!(
            consumer_read_actions(),
            vec![
                "Microsoft.Compute/virtualMachines/read",
                "Microsoft.Compute/virtualMachineScaleSets/read",
                "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
                "Microsoft.Compute/disks/read",
            ]
        );
    }

    fn perm(actions: &[&str], not: &[&str]) -> Permission {
        Permission {
            actions: actions.iter().map(|s| s.to_string()).collect(),
            not_actions: not.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn rbac_patterns_match_as_azure_does() {
        assert!(matches("*", "Microsoft.Compute/disks/read"));
        assert!(matches("*/read", "Microsoft.Compute/disks/read"));
        assert!(matches(
            "microsoft.compute/*",
            "Microsoft.Compute/disks/read"
        ));
        assert!(matches(
            "Microsoft.Compute/*/read",
            "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"
        ));
        assert!(!matches("*/write", "Microsoft.Compute/disks/read"));
        assert!(!matches(
            "Microsoft.Compute/virtualMachines/read",
            "Microsoft.Compute/virtualMachineScaleSets/read"
        ));
        assert!(!matches(
            "Microsoft.Storage/*",
            "Microsoft.Compute/disks/read"
        ));
    }

    #[test]
    fn an_identity_sees_the_whole_scope_only_when_every_consumer_read_is_granted() {
        // Reader at the scope.
        assert!(missing_consumer_reads(&[perm(&["*/read"], &[])]).is_empty());
        // Nothing assigned at or above the scope (a role assigned at a resource group below it).
        assert_eq!(missing_consumer_reads(&[]).len(), 4);
        // One action removed by the same assignment's notActions.
        assert_eq!(
            missing_consumer_reads(&[perm(&["*"], &["Microsoft.Compute/disks/read"])]),
            vec!["Microsoft.Compute/disks/read".to_string()]
        );
        // Another assignment may grant what one removes.
        assert!(missing_consumer_reads(&[
            perm(&["*"], &["Microsoft.Compute/disks/*"]),
            perm(&["Microsoft.Compute/disks/read"], &[])
        ])
        .is_empty());
    }

    #[test]
    fn only_the_permissions_document_parses() {
        let ok = br#"{"value": [{"actions": ["*"], "notActions": [], "dataActions": []}]}"#;
        let page = parse(ok).unwrap();
        assert_eq!(page.value, vec![perm(&["*"], &[])]);
        assert_eq!(page.next_link, None);
        let paged = br#"{"value": [], "nextLink": "https://management.azure.com/next"}"#;
        assert_eq!(
            parse(paged).unwrap().next_link.as_deref(),
            Some("https://management.azure.com/next")
        );
        assert!(parse(br#"{"values": []}"#).is_none());
        assert!(parse(b"null").is_none());
        assert!(parse(b"<html>").is_none());
    }
}
