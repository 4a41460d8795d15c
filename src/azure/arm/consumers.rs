//! Reads beside the gallery: the consumers of gallery images (VMs, scale sets and their
//! instances, disks) in every consumer scope, the proof that the identity sees all of a scope
//! (its effective permissions), and storage account ids.

use serde_json::Value;

use super::wire::{all_pages, consumers_at, str_at};
use super::ArmGallery;
use crate::gallery::error::{Error, Result};
use crate::gallery::model::*;

impl ArmGallery {
    pub(super) async fn list_consumers_in(&self, s: &str, out: &mut Vec<Consumer>) -> Result<()> {
        let scope = format!("/subscriptions/{s}");
        let vms = self
            .call("list virtual machines of", &scope, || async {
                all_pages(
                    self.client
                        .virtual_machines_client()
                        .list_all(s)
                        .into_stream(),
                    |p| p.value,
                )
                .await
            })
            .await?;
        for v in &vms {
            consumers_at(
                ConsumerKind::VirtualMachine,
                v,
                "/properties/storageProfile/imageReference",
                out,
            );
        }
        let sets = self
            .call("list scale sets of", &scope, || async {
                all_pages(
                    self.client
                        .virtual_machine_scale_sets_client()
                        .list_all(s)
                        .into_stream(),
                    |p| p.value,
                )
                .await
            })
            .await?;
        for ss in &sets {
            consumers_at(
                ConsumerKind::ScaleSet,
                ss,
                "/properties/virtualMachineProfile/storageProfile/imageReference",
                out,
            );
            // A Flexible scale set's instances are ordinary VMs in the VM list (read above), and
            // Azure refuses to list them as scale-set VMs with 400 BadRequest (REFERENCE.md,
            // "Flexible scale sets").
            if str_at(ss, &["properties", "orchestrationMode"])
                .is_some_and(|m| m.eq_ignore_ascii_case("Flexible"))
            {
                continue;
            }
            let (Some(id), Some(name)) = (str_at(ss, &["id"]), str_at(ss, &["name"])) else {
                continue;
            };
            let rg = id.split('/').nth(4).unwrap_or_default().to_string();
            let instances = self
                .call("list instances of", id, || async {
                    all_pages(
                        self.client
                            .virtual_machine_scale_set_v_ms_client()
                            .list(&rg, name, s)
                            .into_stream(),
                        |p| p.value,
                    )
                    .await
                })
                .await?;
            for v in &instances {
                consumers_at(
                    ConsumerKind::ScaleSetInstance,
                    v,
                    "/properties/storageProfile/imageReference",
                    out,
                );
            }
        }
        let disks = self
            .call("list disks of", &scope, || async {
                all_pages(self.client.disks_client().list(s).into_stream(), |p| {
                    p.value
                })
                .await
            })
            .await?;
        for d in &disks {
            for p in [
                "/properties/creationData/galleryImageReference",
                "/properties/creationData/imageReference",
            ] {
                consumers_at(ConsumerKind::Disk, d, p, out);
            }
        }
        Ok(())
    }
}

impl ArmGallery {
    /// Prove the identity sees every consumer of `subscription`: its effective permissions at the
    /// subscription scope must grant every read the consumer scan makes (see `azure::permissions`).
    /// Anything else — fewer permissions, a 403 on the permissions list, a body that is not the
    /// permissions document — is [`Error::PartialView`].
    pub async fn check_consumer_view(&self, subscription: &str) -> Result<()> {
        use crate::azure::permissions::{
            self as perms, CONSUMER_READ_ACTIONS, PERMISSIONS_API_VERSION,
        };
        let scope = format!("/subscriptions/{subscription}");
        let needed = CONSUMER_READ_ACTIONS.join(", ");
        let partial = |why: String| Error::PartialView {
            scope: scope.clone(),
            why,
            needed: needed.clone(),
        };
        let mut url = format!(
            "{}{scope}/providers/Microsoft.Authorization/permissions?api-version={PERMISSIONS_API_VERSION}",
            self.endpoint.as_str().trim_end_matches('/')
        );
        let mut all = Vec::new();
        for _page in 0..100 {
            let (status, body) = match self
                .transport
                .raw_get(&url, "read permissions at", &scope)
                .await
            {
                Ok((status, body, _)) => (status, body),
                Err(Error::Azure { azure, .. }) if azure.status == 403 => {
                    return Err(partial(format!(
                        "the identity may not read its own permissions there ({})",
                        azure.code
                    )))
                }
                Err(e) => return Err(e),
            };
            if status == 404 {
                return Err(partial(
                    "the permissions list of that scope was not found".into(),
                ));
            }
            let page = perms::parse(&body).ok_or_else(|| {
                partial("the permissions list of that scope could not be read".into())
            })?;
            all.extend(page);
            match body.get("nextLink").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => url = next.to_string(),
                _ => {
                    let missing = perms::missing_consumer_reads(&all);
                    if missing.is_empty() {
                        return Ok(());
                    }
                    return Err(partial(format!(
                        "the identity's permissions at that scope lack {}",
                        missing.join(", ")
                    )));
                }
            }
        }
        Err(partial(
            "the permissions list of that scope did not end after 100 pages".into(),
        ))
    }
}

/// The api-version of `Microsoft.Storage` calls (Storage Accounts - List).
pub const STORAGE_API_VERSION: &str = "2023-05-01";

impl ArmGallery {
    /// The resource id of storage account `name` in `subscription`, as Azure has it
    /// (`Storage Accounts - List`, `GET /subscriptions/{s}/providers/Microsoft.Storage/
    /// storageAccounts`, every page; names compare case-insensitively). `None` when no account of
    /// that name is visible there: ARM filters the list to what the identity may read
    /// (`Microsoft.Storage/storageAccounts/read`, in deploy/azure/role-definition.json).
    pub async fn find_storage_account(
        &self,
        subscription: &str,
        name: &str,
    ) -> Result<Option<String>> {
        let scope = format!("/subscriptions/{subscription}");
        let mut url = format!(
            "{}{scope}/providers/Microsoft.Storage/storageAccounts?api-version={STORAGE_API_VERSION}",
            self.endpoint.as_str().trim_end_matches('/')
        );
        for _page in 0..100 {
            let (status, body, _) = self
                .transport
                .raw_get(&url, "list the storage accounts of", &scope)
                .await?;
            if status == 404 {
                return Ok(None);
            }
            let found = body
                .get("value")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|a| str_at(a, &["name"]).is_some_and(|n| n.eq_ignore_ascii_case(name)))
                .and_then(|a| str_at(a, &["id"]).map(str::to_string));
            if found.is_some() {
                return Ok(found);
            }
            match body.get("nextLink").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => url = next.to_string(),
                _ => return Ok(None),
            }
        }
        Ok(None)
    }
}
