//! Reads beside the gallery: the consumers of gallery images (VMs, scale sets and their
//! instances, disks) in every consumer scope, the proof that the identity sees all of a scope
//! (its effective permissions), and storage account ids.

use super::wire::{
    self, consumers_of, Disk, ScaleSet, StorageAccount, Vm, COMPUTE_API_VERSION, DISK_API_VERSION,
};
use super::ArmGallery;
use crate::gallery::error::{Error, Result};
use crate::gallery::model::*;

/// One item of Images - List By Resource Group: only its name is read.
#[derive(serde::Deserialize)]
struct Named {
    name: String,
}

impl ArmGallery {
    /// Images - List By Resource Group (Microsoft.Compute, paged): the managed images' names.
    pub(super) async fn managed_images_in_group(&self) -> Result<Vec<String>> {
        let resource = format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/images",
            self.gallery.subscription, self.gallery.resource_group
        );
        let all: Vec<Named> = self
            .list_all(
                self.url(&resource, COMPUTE_API_VERSION, &[]),
                COMPUTE_API_VERSION,
                "list managed images of",
                &resource,
            )
            .await?;
        Ok(all.into_iter().map(|n| n.name).collect())
    }

    pub(super) async fn list_consumers_in(&self, s: &str, out: &mut Vec<Consumer>) -> Result<()> {
        let scope = format!("/subscriptions/{s}");
        let vms: Vec<Vm> = self
            .list_all(
                self.url(
                    &format!("{scope}/providers/Microsoft.Compute/virtualMachines"),
                    COMPUTE_API_VERSION,
                    &[],
                ),
                COMPUTE_API_VERSION,
                "list virtual machines of",
                &scope,
            )
            .await?;
        for v in &vms {
            consumers_of(ConsumerKind::VirtualMachine, v, v.image(), out);
        }
        let sets: Vec<ScaleSet> = self
            .list_all(
                self.url(
                    &format!("{scope}/providers/Microsoft.Compute/virtualMachineScaleSets"),
                    COMPUTE_API_VERSION,
                    &[],
                ),
                COMPUTE_API_VERSION,
                "list scale sets of",
                &scope,
            )
            .await?;
        for ss in &sets {
            consumers_of(ConsumerKind::ScaleSet, ss, ss.image(), out);
            // A Flexible scale set's instances are ordinary VMs in the VM list (read above), and
            // Azure refuses to list them as scale-set VMs with 400 BadRequest (REFERENCE.md,
            // "Flexible scale sets").
            if ss.is_flexible() {
                continue;
            }
            let (Some(id), Some(name)) = (ss.id.as_deref(), ss.name.as_deref()) else {
                continue;
            };
            let rg = id.split('/').nth(4).unwrap_or_default();
            let instances: Vec<Vm> = self
                .list_all(
                    self.url(
                        &format!(
                            "{scope}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{name}/virtualMachines"
                        ),
                        COMPUTE_API_VERSION,
                        &[],
                    ),
                    COMPUTE_API_VERSION,
                    "list instances of",
                    id,
                )
                .await?;
            for v in &instances {
                consumers_of(ConsumerKind::ScaleSetInstance, v, v.image(), out);
            }
        }
        let disks: Vec<Disk> = self
            .list_all(
                self.url(
                    &format!("{scope}/providers/Microsoft.Compute/disks"),
                    DISK_API_VERSION,
                    &[],
                ),
                DISK_API_VERSION,
                "list disks of",
                &scope,
            )
            .await?;
        for d in &disks {
            for image in d.images() {
                consumers_of(ConsumerKind::Disk, d, Some(image), out);
            }
        }
        Ok(())
    }
}

/// Why the identity's permissions at a scope could not be read whole.
pub(super) enum Unread {
    /// Azure refused the list (403): its answer.
    Denied(Error),
    /// The scope's permissions list was not found (404).
    NotFound,
    /// A page that is not the permissions document.
    Unreadable,
    /// The list did not end after 100 pages.
    Endless,
}

impl Unread {
    /// "the identity may not read its own permissions there (…)", and the like.
    pub(super) fn why(&self) -> String {
        match self {
            Unread::Denied(e) => format!(
                "the identity may not read its own permissions there ({})",
                e.azure_answer()
                    .map(|a| a.code.as_str())
                    .unwrap_or("refused")
            ),
            Unread::NotFound => "the permissions list of that scope was not found".into(),
            Unread::Unreadable => "the permissions list of that scope could not be read".into(),
            Unread::Endless => {
                "the permissions list of that scope did not end after 100 pages".into()
            }
        }
    }
}

impl ArmGallery {
    /// The identity's effective permissions at `scope` (`GET {scope}/providers/
    /// Microsoft.Authorization/permissions`, every page): what the consumer scan's proof and
    /// doctor's lock check read. `Ok(Err(_))`: Azure answered, but not with the whole list.
    pub(super) async fn permissions_at(
        &self,
        scope: &str,
    ) -> Result<std::result::Result<Vec<crate::azure::permissions::Permission>, Unread>> {
        use crate::azure::permissions::{self as perms, PERMISSIONS_API_VERSION};
        let resource = format!("{scope}/providers/Microsoft.Authorization/permissions");
        let mut url = self.url(&resource, PERMISSIONS_API_VERSION, &[]);
        let mut all = Vec::new();
        for _page in 0..100 {
            let reply = match self
                .transport
                .get_raw(&url, "read permissions at", scope)
                .await
            {
                Ok(reply) => reply,
                Err(e @ Error::Azure { .. })
                    if e.azure_answer().is_some_and(|a| a.status == 403) =>
                {
                    return Ok(Err(Unread::Denied(e)))
                }
                Err(e) => return Err(e),
            };
            if reply.status == 404 {
                return Ok(Err(Unread::NotFound));
            }
            let Some(page) = perms::parse(&reply.body) else {
                return Ok(Err(Unread::Unreadable));
            };
            all.extend(page.value);
            match page.next_link.filter(|n| !n.is_empty()) {
                Some(next) => url = next,
                None => return Ok(Ok(all)),
            }
        }
        Ok(Err(Unread::Endless))
    }

    /// Prove the identity sees every consumer of `subscription`: its effective permissions at the
    /// subscription scope must grant every read the consumer scan makes (see `azure::permissions`).
    /// Anything else — fewer permissions, a 403 on the permissions list, a body that is not the
    /// permissions document — is [`Error::PartialView`].
    pub async fn check_consumer_view(&self, subscription: &str) -> Result<()> {
        use crate::azure::permissions as perms;
        let scope = format!("/subscriptions/{subscription}");
        let partial = |why: String| Error::PartialView {
            scope: scope.clone(),
            why,
            needed: perms::consumer_read_actions().join(", "),
        };
        let all = self
            .permissions_at(&scope)
            .await?
            .map_err(|u| partial(u.why()))?;
        let missing = perms::missing_consumer_reads(&all);
        if missing.is_empty() {
            return Ok(());
        }
        Err(partial(format!(
            "the identity's permissions at that scope lack {}",
            missing.join(", ")
        )))
    }
}

/// The api-version of `Microsoft.Storage` calls (Storage Accounts - List).
pub const STORAGE_API_VERSION: &str = "2023-05-01";

#[async_trait::async_trait]
impl crate::gallery::api::StorageAccounts for ArmGallery {
    /// The resource id of storage account `name` in `subscription`, as Azure has it
    /// (`Storage Accounts - List`, `GET /subscriptions/{s}/providers/Microsoft.Storage/
    /// storageAccounts`, every page; names compare case-insensitively). `None` when no account of
    /// that name is visible there: ARM filters the list to what the identity may read
    /// (`Microsoft.Storage/storageAccounts/read`, in deploy/azure/role-definition.json).
    async fn find_storage_account(&self, subscription: &str, name: &str) -> Result<Option<String>> {
        let scope = format!("/subscriptions/{subscription}");
        let mut url = format!(
            "{}{scope}/providers/Microsoft.Storage/storageAccounts?api-version={STORAGE_API_VERSION}",
            self.endpoint.as_str().trim_end_matches('/')
        );
        for _page in 0..100 {
            let reply = self
                .transport
                .get_raw(&url, "list the storage accounts of", &scope)
                .await?;
            if reply.status == 404 {
                return Ok(None);
            }
            let page: wire::Page<StorageAccount> =
                wire::decode(&reply.body, "list the storage accounts of", &scope)?;
            let found = page
                .value
                .into_iter()
                .find(|a| {
                    a.name
                        .as_deref()
                        .is_some_and(|n| n.eq_ignore_ascii_case(name))
                })
                .and_then(|a| a.id);
            if found.is_some() {
                return Ok(found);
            }
            match page.next_link.as_deref() {
                Some(next) if !next.is_empty() => url = next.to_string(),
                _ => return Ok(None),
            }
        }
        Ok(None)
    }
}
