//! Plain data describing galleries, image definitions, image versions and their consumers,
//! independent of the SDK's generated models.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// Where a gallery lives.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GalleryRef {
    pub subscription: String,
    pub resource_group: String,
    pub gallery: String,
}

impl GalleryRef {
    pub fn id(&self) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/galleries/{}",
            self.subscription, self.resource_group, self.gallery
        )
    }

    pub fn definition_id(&self, definition: &str) -> String {
        format!("{}/images/{}", self.id(), definition)
    }

    pub fn version_id(&self, definition: &str, version: &str) -> String {
        format!("{}/images/{}/versions/{}", self.id(), definition, version)
    }
}

/// Azure's provisioning states; anything new Azure invents is kept verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProvisioningState {
    Creating,
    Updating,
    Succeeded,
    Failed,
    Deleting,
    Migrating,
    Canceled,
    Other(String),
}

impl ProvisioningState {
    pub fn parse(s: &str) -> Self {
        match s.to_ascii_lowercase().as_str() {
            "creating" => Self::Creating,
            "updating" => Self::Updating,
            "succeeded" => Self::Succeeded,
            "failed" => Self::Failed,
            "deleting" => Self::Deleting,
            "migrating" => Self::Migrating,
            "canceled" | "cancelled" => Self::Canceled,
            _ => Self::Other(s.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Creating => "Creating",
            Self::Updating => "Updating",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
            Self::Deleting => "Deleting",
            Self::Migrating => "Migrating",
            Self::Canceled => "Canceled",
            Self::Other(s) => s,
        }
    }
}

impl std::fmt::Display for ProvisioningState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The platform types are the stemcell's (a stemcell names its architecture and generation).
pub use crate::stemcell::platform::{Architecture, HyperVGeneration};

/// The immutable identity of an image definition, and the properties we create it with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefinitionSpec {
    pub name: String,
    pub location: String,
    pub publisher: String,
    pub offer: String,
    pub sku: String,
    pub architecture: Architecture,
    pub generation: HyperVGeneration,
    /// Gallery image features, e.g. SecurityType=TrustedLaunchSupported.
    pub features: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
}

/// An image definition as read from Azure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageDefinition {
    pub id: String,
    pub name: String,
    pub location: String,
    pub publisher: String,
    pub offer: String,
    pub sku: String,
    pub os_type: String,
    pub os_state: String,
    pub architecture: Option<String>,
    pub generation: Option<String>,
    pub features: BTreeMap<String, String>,
    pub tags: BTreeMap<String, String>,
    pub provisioning_state: ProvisioningState,
}

/// A replication target of a version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetRegion {
    pub name: String,
    pub replicas: Option<u32>,
    /// Standard_LRS, Standard_ZRS or Premium_LRS.
    pub storage_account_type: Option<String>,
    pub exclude_from_latest: Option<bool>,
}

/// The one comparison key of an Azure region name: lower-case, spaces dropped. Azure answers
/// with display names ("West Europe") whatever the request sent ("westeurope"), and refuses two
/// spellings of one region in a request (REFERENCE.md "Regions"), so every comparison of region
/// names goes through this.
pub fn region_key(name: &str) -> String {
    name.chars()
        .filter(|c| !c.is_whitespace())
        .flat_map(char::to_lowercase)
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionReplication {
    pub region: String,
    /// Unknown, Replicating, Completed, Failed.
    pub state: String,
    pub progress: Option<u32>,
    pub details: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicationStatus {
    /// Unknown, InProgress, Completed, Failed.
    pub aggregated_state: String,
    pub summary: Vec<RegionReplication>,
}

/// What to PUT for a new version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionSpec {
    pub definition: String,
    pub version: String,
    pub location: String,
    pub source_uri: String,
    pub storage_account_id: String,
    pub target_regions: Vec<TargetRegion>,
    pub replica_count: Option<u32>,
    pub exclude_from_latest: bool,
    pub end_of_life: Option<String>,
    /// `safetyProfile.blockDeletionBeforeEndOfLife`, always sent so that no api-version's
    /// default decides it (api 2026-03-03 would block deletion for six months).
    pub block_deletion_before_end_of_life: bool,
    pub tags: BTreeMap<String, String>,
}

/// A gallery's soft-delete policy, when it is on: a deleted version stays restorable (and a
/// Failed version cannot be deleted at all; REFERENCE.md "Today's Azure").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoftDelete {
    /// How long a deleted version stays restorable, as the gallery answers it (7 days recorded).
    pub retention_days: Option<u32>,
}

/// A version deleted in a gallery with soft delete on and not yet gone for good (SPEC26
/// `GallerySoftDeletedResource`, listed per definition at api 2024-03-03+; REFERENCE.md "Today's
/// Azure"). Its name stays taken until then, and it can be restored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoftDeletedVersion {
    /// The version's own id (`properties.resourceArmId`).
    pub id: String,
    pub definition: String,
    /// The version key.
    pub version: String,
    #[serde(with = "time::serde::rfc3339::option")]
    pub soft_deleted_time: Option<OffsetDateTime>,
    /// Until when a consumer that names it may still use it (answered from api 2026-03-03).
    #[serde(with = "time::serde::rfc3339::option")]
    pub consumption_end_time: Option<OffsetDateTime>,
    /// When it is gone for good, and its name free (answered from api 2026-03-03).
    #[serde(with = "time::serde::rfc3339::option")]
    pub hard_deletion_target_time: Option<OffsetDateTime>,
}

/// An image version as read from Azure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageVersion {
    pub id: String,
    pub definition: String,
    /// The version key, MAJOR.MINOR.PATCH.
    pub version: String,
    pub location: String,
    pub provisioning_state: ProvisioningState,
    pub tags: BTreeMap<String, String>,
    pub source_uri: Option<String>,
    pub storage_account_id: Option<String>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub published_date: Option<OffsetDateTime>,
    pub target_regions: Vec<TargetRegion>,
    pub exclude_from_latest: bool,
    pub replication: Option<ReplicationStatus>,
    /// What guards it against deletion.
    #[serde(default)]
    pub safety: Safety,
}

/// A version's end of life and whether Azure refuses to delete it before then (api 2024-03-03+;
/// REFERENCE.md "Today's Azure"). Judged only by `gallery::lifecycle`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Safety {
    /// `publishingProfile.endOfLifeDate`.
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub end_of_life: Option<OffsetDateTime>,
    /// `safetyProfile.blockDeletionBeforeEndOfLife`.
    #[serde(default)]
    pub block_deletion_before_end_of_life: bool,
}

/// Something that may run from a gallery image: a VM, a scale set (model or instance), a disk.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConsumerKind {
    VirtualMachine,
    ScaleSet,
    ScaleSetInstance,
    Disk,
}

impl ConsumerKind {
    /// Every kind, in the order the consumer scan lists them.
    pub const ALL: [ConsumerKind; 4] = [
        ConsumerKind::VirtualMachine,
        ConsumerKind::ScaleSet,
        ConsumerKind::ScaleSetInstance,
        ConsumerKind::Disk,
    ];

    /// The ARM resource type (an instance's is under its scale set); the consumer scan needs
    /// `<type>/read` at every scope it lists (`azure::permissions`).
    pub fn resource_type(&self) -> &'static str {
        match self {
            ConsumerKind::VirtualMachine => "Microsoft.Compute/virtualMachines",
            ConsumerKind::ScaleSet => "Microsoft.Compute/virtualMachineScaleSets",
            ConsumerKind::ScaleSetInstance => {
                "Microsoft.Compute/virtualMachineScaleSets/virtualMachines"
            }
            ConsumerKind::Disk => "Microsoft.Compute/disks",
        }
    }

    /// How messages name the kind ("scale-set VM" for an instance, as Azure's docs say).
    pub fn name(&self) -> &'static str {
        match self {
            ConsumerKind::VirtualMachine => "VM",
            ConsumerKind::ScaleSet => "scale set",
            ConsumerKind::ScaleSetInstance => "scale-set VM",
            ConsumerKind::Disk => "disk",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Consumer {
    pub kind: ConsumerKind,
    /// The consumer's own resource id.
    pub id: String,
    /// The image reference it was created from, as Azure records it: an ARM version id, a
    /// definition id (meaning "latest"), a `.../versions/latest` id, or a shared
    /// (`/SharedGalleries/...`) or community (`/CommunityGalleries/...`) gallery image id.
    /// `gallery::latest::ImageRef::parse` reads it; never compare it as a string.
    pub image_id: String,
    /// The consumer's region (`westeurope`), when known: `latest` is resolved per region.
    #[serde(default)]
    pub location: Option<String>,
    /// `imageReference.exactVersion`: the version Azure built it from when it asked for
    /// `latest` (read-only, recorded by Azure), when recorded.
    #[serde(default)]
    pub exact_version: Option<String>,
}

impl Consumer {
    /// A consumer whose region and exact version are not known.
    pub fn new(kind: ConsumerKind, id: impl Into<String>, image_id: impl Into<String>) -> Self {
        Self {
            kind,
            id: id.into(),
            image_id: image_id.into(),
            location: None,
            exact_version: None,
        }
    }
}

/// A long-running operation Azure accepted, to be followed to its end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    pub operation: String,
    pub definition: String,
    pub version: String,
    pub async_operation_url: Option<String>,
    pub location_url: Option<String>,
    pub retry_after_secs: Option<u64>,
}
