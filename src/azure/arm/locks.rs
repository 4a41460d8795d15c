//! Management locks (`Microsoft.Authorization/locks`) on the gallery's versions: list, create or
//! update, delete, at api-version 2016-09-01 (REFERENCE.md "Management locks"; learn.microsoft.com
//! REST "Management Locks": create-or-update-by-scope, delete-by-scope, list-by-scope). Locks
//! are a Microsoft.Authorization resource, answered at once: no long-running operation.

use azure_core::http::Method;
use serde::{Deserialize, Serialize};

use super::transport::Resend;
use super::ArmGallery;
use crate::gallery::error::Result;
use crate::gallery::protect::{lock_id, LockLevel, ManagementLock, LOCKS_PATH};

/// The api-version of `Microsoft.Authorization/locks` this tool sends (2020-05-01 has the same
/// shape for what is read and sent here).
pub(super) const LOCKS_API_VERSION: &str = "2016-09-01";

/// A lock as listed or returned.
#[derive(Debug, Deserialize)]
struct LockItem {
    #[serde(default)]
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    properties: LockProperties,
}

#[derive(Debug, Default, Deserialize, Serialize)]
struct LockProperties {
    #[serde(default)]
    level: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    notes: Option<String>,
}

#[derive(Debug, Serialize)]
struct LockBody {
    properties: LockProperties,
}

fn lock_from(i: LockItem) -> ManagementLock {
    ManagementLock {
        id: i.id,
        name: i.name,
        level: LockLevel::parse(&i.properties.level),
        notes: i.properties.notes,
    }
}

impl ArmGallery {
    /// Every lock a list at `scope` returns: at the scope, above it and below it.
    pub(super) async fn locks_at(&self, scope: &str) -> Result<Vec<ManagementLock>> {
        let resource = format!("{scope}{LOCKS_PATH}");
        let url = self.url(&resource, LOCKS_API_VERSION, &[]);
        match self
            .list_all::<LockItem>(url, LOCKS_API_VERSION, "lock list", &resource)
            .await
        {
            Ok(all) => Ok(all.into_iter().map(lock_from).collect()),
            // The scope is gone: nothing there is locked.
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// PUT the `CanNotDelete` lock `name` at `scope`. Idempotent, so re-sent after a transient
    /// failure.
    pub(super) async fn put_lock(&self, scope: &str, name: &str, notes: &str) -> Result<()> {
        let resource = lock_id(scope, name);
        let body = super::wire::encode(
            &LockBody {
                properties: LockProperties {
                    level: LockLevel::CanNotDelete.as_str().to_string(),
                    notes: Some(notes.to_string()),
                },
            },
            "lock",
        )?;
        self.write(
            Method::Put,
            &self.url(&resource, LOCKS_API_VERSION, &[]),
            Some(body),
            "lock",
            &resource,
            Resend::AfterTransientFailure,
        )
        .await?;
        Ok(())
    }

    /// DELETE the lock `name` at `scope` (200, or 204 when there was none). Idempotent.
    pub(super) async fn delete_lock(&self, scope: &str, name: &str) -> Result<()> {
        let resource = lock_id(scope, name);
        self.write(
            Method::Delete,
            &self.url(&resource, LOCKS_API_VERSION, &[]),
            None,
            "unlock",
            &resource,
            Resend::AfterTransientFailure,
        )
        .await?;
        Ok(())
    }
}

impl ArmGallery {
    /// The lock actions (`gallery::protect::LOCK_ACTIONS`) the identity lacks at the gallery's
    /// resource group, by its effective permissions there (`Permissions - List For Resource
    /// Group`, which `azure::permissions` reads for the consumer scan too). Read only.
    pub async fn missing_lock_actions(&self) -> Result<Vec<String>> {
        use crate::azure::permissions as perms;
        let scope = format!(
            "/subscriptions/{}/resourceGroups/{}",
            self.gallery.subscription, self.gallery.resource_group
        );
        let all = match self.permissions_at(&scope).await? {
            Ok(all) => all,
            Err(super::consumers::Unread::Denied(e)) => return Err(e),
            Err(u) => {
                return Err(crate::gallery::Error::NotFound(format!(
                    "the identity's permissions at {scope} could not be read: {}",
                    u.why()
                )))
            }
        };
        Ok(["read", "write", "delete"]
            .iter()
            .map(|verb| format!("Microsoft.Authorization/locks/{verb}"))
            .filter(|a| !perms::grants(&all, a))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listed_lock_keeps_its_scope_level_and_notes() {
        let item: LockItem = serde_json::from_str(
            r#"{"id":"/subscriptions/s/resourceGroups/rg/providers/Microsoft.Authorization/locks/keep","type":"Microsoft.Authorization/locks","name":"keep","properties":{"level":"ReadOnly","notes":"do not touch"}}"#,
        )
        .unwrap();
        let l = lock_from(item);
        assert_eq!(l.level, LockLevel::ReadOnly);
        assert_eq!(l.scope(), "/subscriptions/s/resourceGroups/rg");
        assert_eq!(l.notes.as_deref(), Some("do not touch"));
        assert!(l.covers("/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/images/d/versions/1.2.3"));
        assert!(!l.covers("/subscriptions/s/resourceGroups/rg2"));
    }

    #[test]
    fn the_lock_sent_is_can_not_delete_with_its_notes() {
        let body = serde_json::to_value(LockBody {
            properties: LockProperties {
                level: LockLevel::CanNotDelete.as_str().into(),
                notes: Some("n".into()),
            },
        })
        .unwrap();
        assert_eq!(
            body,
            serde_json::json!({"properties": {"level": "CanNotDelete", "notes": "n"}})
        );
    }
}
