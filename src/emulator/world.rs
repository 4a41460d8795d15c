//! The world: resources the emulator starts with (`--world FILE`) or is given later
//! (`PUT /_emulator/world`), mainly the consumers of gallery images.
//!
//! Format (JSON; a sample is `fixtures/worlds/consumers.json`):
//!
//! ```json
//! {
//!   "resources": [
//!     {"id": "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/vm-1",
//!      "location": "westeurope",
//!      "properties": {"storageProfile": {"imageReference": {"id": "<gallery image version id>"}}}},
//!     {"id": ".../virtualMachineScaleSets/ss-1", "location": "westeurope",
//!      "properties": {"virtualMachineProfile": {"storageProfile": {"imageReference": {"id": "..."}}}}},
//!     {"id": ".../virtualMachineScaleSets/ss-1/virtualMachines/0",
//!      "properties": {"storageProfile": {"imageReference": {"id": "..."}}}},
//!     {"id": ".../disks/d-1", "location": "westeurope",
//!      "properties": {"creationData": {"createOption": "FromImage",
//!                     "galleryImageReference": {"id": "..."}}}}
//!   ]
//! }
//! ```
//!
//! Each resource is an ARM resource body as the real API returns it, with its full `id`; the kind
//! comes from the id (VMs, scale sets, scale-set instances, disks, and also galleries, image
//! definitions and versions, and storage accounts:
//! `{"id": "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Storage/storageAccounts/devstoreaccount1"}`
//! says which resource group the development account lives in — by default `bosh-rg` of every
//! subscription; naming any storage account replaces that default). `name`, `type` and `provisioningState` (Succeeded) are filled in.
//! Loading a world at start adds its resources; `PUT /_emulator/world` replaces every consumer
//! resource with the document's and adds or replaces the gallery resources it names.

use std::path::Path;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::arm::{self, Target};
use super::store::{Data, Kind};

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct World {
    #[serde(default)]
    pub resources: Vec<Value>,
}

impl World {
    /// Read a world file.
    pub fn load(path: &Path) -> anyhow::Result<World> {
        let text = std::fs::read(path)
            .with_context(|| format!("cannot read the world file {}", path.display()))?;
        serde_json::from_slice(&text).with_context(|| {
            format!(
                "the world file {} is not a world document ({{\"resources\": [...]}})",
                path.display()
            )
        })
    }

    /// Every resource in the state, in id order.
    pub fn snapshot(data: &Data) -> World {
        World {
            resources: data
                .resources
                .values()
                .map(|r| r.body.clone())
                .chain(data.storage_accounts.iter().cloned())
                .collect(),
        }
    }

    /// Add the world's resources to `data`; with `replace_consumers`, first remove every consumer.
    pub(crate) fn apply(&self, data: &mut Data, replace_consumers: bool) -> anyhow::Result<()> {
        let mut parsed = Vec::new();
        let mut accounts = Vec::new();
        for (i, res) in self.resources.iter().enumerate() {
            let id = res
                .get("id")
                .and_then(Value::as_str)
                .with_context(|| format!("world resource #{i} has no \"id\""))?;
            // A storage account: where the development account (or another one a version's
            // source names) lives, for `Storage Accounts - List` and the source check.
            if let Some((_, _, name)) = arm::storage_account_parts(id) {
                let mut body = res.clone();
                body["name"] = json!(name);
                body["type"] = json!("Microsoft.Storage/storageAccounts");
                accounts.push(body);
                continue;
            }
            let addr = match arm::parse_target(id) {
                Ok(Target::Item(a)) => a,
                _ => anyhow::bail!(
                    "world resource #{i}: {id:?} is not the id of a gallery, image, version, VM, scale set, scale-set VM or disk"
                ),
            };
            parsed.push((addr, res.clone()));
        }
        if replace_consumers {
            data.resources.retain(|_, r| r.kind.is_gallery_kind());
            // The locks of the consumers removed go with them.
            arm::drop_orphan_locks(data);
        }
        if !accounts.is_empty() {
            data.storage_accounts = accounts;
        }
        for (addr, res) in parsed {
            let body = if addr.kind.is_gallery_kind() {
                let mut body = res;
                body["id"] = json!(addr.id);
                body["name"] = json!(addr.name);
                body["type"] = json!(addr.kind.arm_type());
                if body.get("properties").is_none_or(|p| !p.is_object()) {
                    body["properties"] = json!({});
                }
                if body.pointer("/properties/provisioningState").is_none() {
                    body["properties"]["provisioningState"] = json!("Succeeded");
                }
                if addr.kind == Kind::Version
                    && body
                        .pointer("/properties/publishingProfile/publishedDate")
                        .is_none()
                {
                    let now = time::OffsetDateTime::now_utc()
                        .format(&time::format_description::well_known::Rfc3339)
                        .unwrap_or_default();
                    if body.pointer("/properties/publishingProfile").is_none() {
                        body["properties"]["publishingProfile"] = json!({});
                    }
                    body["properties"]["publishingProfile"]["publishedDate"] = json!(now);
                }
                body
            } else {
                arm::consumer_body(&addr, res)
            };
            data.resources
                .insert(addr.key.clone(), arm::resource_for(&addr, body));
        }
        Ok(())
    }
}
