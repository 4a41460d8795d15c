//! The wire: typed request and response bodies for exactly the ARM fields this adapter sends and
//! reads, and their mapping to the domain's types (`crate::gallery::model`). On read every field
//! is optional and unknown fields are ignored (Azure adds properties in every api-version); on
//! write only what we mean is sent (`None` is left out).
//!
//! The shapes were checked against the REST spec examples in Azure/azure-rest-api-specs,
//! specification/compute/resource-manager/Microsoft.Compute/:
//! - gallery resources, api 2023-07-03 (GalleryRP/stable/2023-07-03/examples/galleryExamples/):
//!   `Gallery_Get.json`, `GalleryImage_Create.json`, `GalleryImage_Get.json`,
//!   `GalleryImage_ListByGallery.json`, `GalleryImageVersion_Create.json`,
//!   `GalleryImageVersion_Get_WithVhdAsSource.json`,
//!   `GalleryImageVersion_Get_WithReplicationStatus.json`, `GalleryImageVersion_Update.json`;
//! - VMs, scale sets and scale-set VMs, api 2024-07-01 (ComputeRP/stable/2024-07-01/examples/):
//!   `virtualMachineScaleSetExamples/VirtualMachineScaleSet_Create_FromAGeneralizedSharedImage.json`,
//!   `virtualMachineScaleSetExamples/VirtualMachineScaleSetVM_List_MinimumSet_Gen.json` and the
//!   `ImageReference` definition (`id`, `sharedGalleryImageId`, `communityGalleryImageId`,
//!   read-only `exactVersion`);
//! - disks, api 2024-03-02 (DiskRP/stable/2024-03-02/examples/diskExamples/):
//!   `Disk_Create_FromAnAzureComputeGalleryImage.json` (`creationData.galleryImageReference`),
//!   `Disk_ListBySubscription.json`.
//!
//! The unit tests below use payloads written here in those shapes (no example is copied).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::gallery::error::{AzureError, Error, Result};
use crate::gallery::latest::ImageRef;
use crate::gallery::model::*;

/// The api-version of gallery, image definition and image version calls.
///
/// 2024-03-03: the first whose versions answer `safetyProfile.blockDeletionBeforeEndOfLife`
/// (a version that refuses deletion before its end of life, which cleanup, `delete` and the CPI
/// must see before they try) and that lists soft-deleted versions (REFERENCE.md "Today's
/// Azure"). Not 2026-03-03: its create defaults would decide for us where a field is left out,
/// and nothing this tool decides on needs its extra fields yet; every create sends the safety
/// fields explicitly all the same.
pub(super) const GALLERY_API_VERSION: &str = "2024-03-03";
/// The api-version of VM, scale-set and scale-set VM lists (ComputeRP).
pub(super) const COMPUTE_API_VERSION: &str = "2024-07-01";
/// The api-version of disk lists (DiskRP).
pub(super) const DISK_API_VERSION: &str = "2024-03-02";

// ---------------------------------------------------------------------------------------------
// Common shapes

/// A tracked resource as ARM returns it: what we read of its envelope, and its properties.
#[derive(Debug, Deserialize)]
pub(super) struct Resource<P> {
    pub(super) id: Option<String>,
    pub(super) name: Option<String>,
    pub(super) location: Option<String>,
    pub(super) tags: Option<BTreeMap<String, String>>,
    pub(super) properties: Option<P>,
}

/// One page of a list: its items and the absolute URL of the next page.
#[derive(Debug, Deserialize)]
pub(super) struct Page<T> {
    #[serde(default = "Vec::new")]
    pub(super) value: Vec<T>,
    #[serde(rename = "nextLink", default)]
    pub(super) next_link: Option<String>,
}

/// Azure's error detail: `{"code", "message", "target"}`.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub(super) struct ErrorBody {
    pub(super) code: Option<String>,
    pub(super) message: Option<String>,
    pub(super) target: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ErrorEnvelope {
    error: ErrorBody,
}

impl ErrorBody {
    /// An error response's body: `{"error": {...}}` (ARM's error response), or the bare detail;
    /// anything else is an error without code or message.
    pub(super) fn parse(bytes: &[u8]) -> ErrorBody {
        if let Ok(e) = serde_json::from_slice::<ErrorEnvelope>(bytes) {
            return e.error;
        }
        serde_json::from_slice::<ErrorBody>(bytes).unwrap_or_default()
    }

    /// As the domain's `AzureError`, with the HTTP status it came with.
    pub(super) fn as_azure(&self, status: u16) -> AzureError {
        AzureError {
            status,
            code: self.code.clone().unwrap_or_default(),
            message: self.message.clone().unwrap_or_default(),
            target: self.target.clone(),
            retry_after_secs: None,
        }
    }

    /// `code: message`, for a failed operation's report.
    pub(super) fn describe(&self) -> String {
        format!(
            "{}: {}",
            self.code.as_deref().unwrap_or("Unknown"),
            self.message.as_deref().unwrap_or("")
        )
    }
}

/// The body of an `Azure-AsyncOperation` URL: `{"status": "InProgress" | "Succeeded" |
/// "Failed" | "Canceled", "error": {...}}` (ARM's asynchronous operation protocol).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct OperationStatus {
    pub(super) status: Option<String>,
    pub(super) error: Option<ErrorBody>,
}

/// Decode a success body as `T`; a body that is not that document is a failed read.
pub(super) fn decode<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    operation: &'static str,
    resource: &str,
) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::Transport {
        operation,
        resource: resource.to_string(),
        message: format!("Azure's answer could not be read: {e}"),
    })
}

/// Serialize a request body.
pub(super) fn encode<T: Serialize>(body: &T, what: &str) -> Result<Vec<u8>> {
    serde_json::to_vec(body).map_err(|e| Error::RequestBuild {
        what: what.to_string(),
        message: e.to_string(),
    })
}

// ---------------------------------------------------------------------------------------------
// Gallery

/// A gallery's properties: its soft-delete policy (besides the envelope's `location`).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct GalleryProperties {
    pub(super) soft_delete_policy: Option<SoftDeletePolicy>,
}

/// `properties.softDeletePolicy` (REFERENCE.md "Today's Azure": accepted at 2023-07-03, answered
/// with `retentionPeriodInDays: 7` even then, REC; off when absent).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct SoftDeletePolicy {
    pub(super) is_soft_delete_enabled: Option<bool>,
    pub(super) retention_period_in_days: Option<u32>,
}

/// The domain's view of a gallery's soft-delete policy: `None` when it is off or unset.
pub(super) fn soft_delete_from(g: &Gallery) -> Option<crate::gallery::model::SoftDelete> {
    let p = g.properties.as_ref()?.soft_delete_policy.as_ref()?;
    p.is_soft_delete_enabled
        .unwrap_or(false)
        .then_some(crate::gallery::model::SoftDelete {
            retention_days: p.retention_period_in_days,
        })
}

pub(super) type Gallery = Resource<GalleryProperties>;

// ---------------------------------------------------------------------------------------------
// Image definition

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(super) struct Identifier {
    pub(super) publisher: String,
    pub(super) offer: String,
    pub(super) sku: String,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub(super) struct Feature {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) value: Option<String>,
}

/// An image definition's properties, read and written.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct DefinitionProperties {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) os_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) os_state: Option<String>,
    #[serde(rename = "hyperVGeneration", skip_serializing_if = "Option::is_none")]
    pub(super) hyper_v_generation: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) architecture: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) identifier: Option<Identifier>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) features: Option<Vec<Feature>>,
    /// Read only.
    #[serde(skip_serializing)]
    pub(super) provisioning_state: Option<String>,
}

pub(super) type Definition = Resource<DefinitionProperties>;

/// The body of an image definition PUT.
#[derive(Debug, Serialize)]
pub(super) struct DefinitionPut {
    location: String,
    tags: BTreeMap<String, String>,
    properties: DefinitionProperties,
}

/// The body of a new image definition: a generalized Linux image of the stemcell's
/// architecture and generation. An empty feature list is left out.
pub(super) fn definition_body(spec: &DefinitionSpec) -> DefinitionPut {
    let features: Vec<Feature> = spec
        .features
        .iter()
        .map(|(k, v)| Feature {
            name: Some(k.clone()),
            value: Some(v.clone()),
        })
        .collect();
    DefinitionPut {
        location: spec.location.clone(),
        tags: spec.tags.clone(),
        properties: DefinitionProperties {
            os_type: Some("Linux".into()),
            os_state: Some("Generalized".into()),
            hyper_v_generation: Some(spec.generation.as_azure().into()),
            architecture: Some(spec.architecture.as_azure().into()),
            identifier: Some(Identifier {
                publisher: spec.publisher.clone(),
                offer: spec.offer.clone(),
                sku: spec.sku.clone(),
            }),
            features: (!features.is_empty()).then_some(features),
            provisioning_state: None,
        },
    }
}

fn state_of(s: Option<&str>) -> ProvisioningState {
    ProvisioningState::parse(s.unwrap_or("Unknown"))
}

/// Map an image definition as Azure returns it to the domain type.
pub(super) fn definition_from(d: Definition) -> ImageDefinition {
    let p = d.properties.unwrap_or_default();
    let identifier = p.identifier.unwrap_or_default();
    ImageDefinition {
        id: d.id.unwrap_or_default(),
        name: d.name.unwrap_or_default(),
        location: d.location.unwrap_or_default(),
        publisher: identifier.publisher,
        offer: identifier.offer,
        sku: identifier.sku,
        os_type: p.os_type.unwrap_or_default(),
        os_state: p.os_state.unwrap_or_default(),
        architecture: p.architecture,
        generation: p.hyper_v_generation,
        features: p
            .features
            .unwrap_or_default()
            .into_iter()
            .filter_map(|f| Some((f.name?, f.value.unwrap_or_default())))
            .collect(),
        tags: d.tags.unwrap_or_default(),
        provisioning_state: state_of(p.provisioning_state.as_deref()),
    }
}

// ---------------------------------------------------------------------------------------------
// Image version

/// One `publishingProfile.targetRegions` entry.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct TargetRegionWire {
    pub(super) name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) regional_replica_count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) storage_account_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) exclude_from_latest: Option<bool>,
}

impl From<&TargetRegion> for TargetRegionWire {
    fn from(r: &TargetRegion) -> Self {
        TargetRegionWire {
            name: r.name.clone(),
            regional_replica_count: r.replicas,
            storage_account_type: r.storage_account_type.clone(),
            exclude_from_latest: r.exclude_from_latest,
        }
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct PublishingProfile {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) target_regions: Option<Vec<TargetRegionWire>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) replica_count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) exclude_from_latest: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) end_of_life_date: Option<String>,
    /// Read only.
    #[serde(skip_serializing)]
    pub(super) published_date: Option<String>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct DiskSource {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) uri: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) storage_account_id: Option<String>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct OsDiskImage {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) host_caching: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) source: Option<DiskSource>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct StorageProfile {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) os_disk_image: Option<OsDiskImage>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub(super) struct RegionReplicationWire {
    pub(super) region: Option<String>,
    pub(super) state: Option<String>,
    pub(super) details: Option<String>,
    pub(super) progress: Option<u32>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct ReplicationStatusWire {
    pub(super) aggregated_state: Option<String>,
    pub(super) summary: Option<Vec<RegionReplicationWire>>,
}

/// An image version's properties, read and written. `storageProfile` is required by the spec's
/// `GalleryImageVersionProperties`, so a PATCH of the publishing profile sends it empty (as the
/// 0.21 SDK model did).
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct VersionProperties {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) publishing_profile: Option<PublishingProfile>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) storage_profile: Option<StorageProfile>,
    /// Read only.
    #[serde(skip_serializing)]
    pub(super) provisioning_state: Option<String>,
    /// Read only (`$expand=ReplicationStatus`).
    #[serde(skip_serializing)]
    pub(super) replication_status: Option<ReplicationStatusWire>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) safety_profile: Option<SafetyProfileWire>,
}

/// A version's `safetyProfile` (GalleryRP 2024-03-03 `GalleryImageVersionSafetyProfile`): only
/// the field this tool decides on.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct SafetyProfileWire {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) block_deletion_before_end_of_life: Option<bool>,
}

pub(super) type Version = Resource<VersionProperties>;

/// The body of an image version PUT.
#[derive(Debug, Serialize)]
pub(super) struct VersionPut {
    location: String,
    tags: BTreeMap<String, String>,
    properties: VersionProperties,
}

/// The body of an image version PATCH: the tags, or the properties.
#[derive(Debug, Default, Serialize)]
pub(super) struct VersionPatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    tags: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    properties: Option<VersionProperties>,
}

/// A PATCH that replaces the version's whole tag set.
pub(super) fn tags_patch(tags: &BTreeMap<String, String>) -> VersionPatch {
    VersionPatch {
        tags: Some(tags.clone()),
        properties: None,
    }
}

/// The body of a restore: `{"properties": {"restore": true, "storageProfile": {}}}` (EX24 /
/// EX26 `GalleryImageVersion_Restore`; api 2024-03-03+).
pub(super) fn restore_patch() -> serde_json::Value {
    serde_json::json!({"properties": {"restore": true, "storageProfile": {}}})
}

/// One item of a definition's soft-deleted versions (SPEC26 `GallerySoftDeletedResource`):
/// `resourceArmId` and `softDeletedTime` from 2024-03-03, `consumptionEndTime` and
/// `hardDeletionTargetTime` from 2026-03-03.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub(super) struct SoftDeletedProperties {
    pub(super) resource_arm_id: Option<String>,
    pub(super) soft_deleted_time: Option<String>,
    pub(super) consumption_end_time: Option<String>,
    pub(super) hard_deletion_target_time: Option<String>,
}

pub(super) type SoftDeletedItem = Resource<SoftDeletedProperties>;

/// The domain's view of a soft-deleted version of `definition`: its key is the last segment of
/// `resourceArmId` (the item's own `name` when that is missing).
pub(super) fn soft_deleted_from(definition: &str, item: SoftDeletedItem) -> SoftDeletedVersion {
    let p = item.properties.unwrap_or_default();
    let rfc3339 = |s: Option<String>| {
        s.and_then(|s| {
            OffsetDateTime::parse(s.trim(), &time::format_description::well_known::Rfc3339).ok()
        })
    };
    let id = p.resource_arm_id.clone().or(item.id).unwrap_or_default();
    let version = p
        .resource_arm_id
        .as_deref()
        .and_then(|i| i.rsplit('/').next())
        .map(str::to_string)
        .or(item.name)
        .unwrap_or_default();
    SoftDeletedVersion {
        id,
        definition: definition.to_string(),
        version,
        soft_deleted_time: rfc3339(p.soft_deleted_time),
        consumption_end_time: rfc3339(p.consumption_end_time),
        hard_deletion_target_time: rfc3339(p.hard_deletion_target_time),
    }
}

/// A PATCH that replaces the version's target regions.
pub(super) fn regions_patch(regions: &[TargetRegion]) -> VersionPatch {
    VersionPatch {
        tags: None,
        properties: Some(VersionProperties {
            publishing_profile: Some(PublishingProfile {
                target_regions: Some(regions.iter().map(TargetRegionWire::from).collect()),
                ..Default::default()
            }),
            storage_profile: Some(StorageProfile::default()),
            ..Default::default()
        }),
    }
}

/// The body of a new image version from a VHD in a storage account. An end-of-life date must be
/// RFC 3339 (the spec's `date-time`).
pub(super) fn version_body(spec: &VersionSpec) -> Result<VersionPut> {
    let end_of_life_date = match &spec.end_of_life {
        Some(eol) => {
            let rfc3339 = &time::format_description::well_known::Rfc3339;
            let at =
                OffsetDateTime::parse(eol.trim(), rfc3339).map_err(|e| Error::RequestBuild {
                    what: "image version".into(),
                    message: format!("end of life date {eol:?} is not an RFC 3339 date-time: {e}"),
                })?;
            Some(at.format(rfc3339).map_err(|e| Error::RequestBuild {
                what: "image version".into(),
                message: e.to_string(),
            })?)
        }
        None => None,
    };
    Ok(VersionPut {
        location: spec.location.clone(),
        tags: spec.tags.clone(),
        properties: VersionProperties {
            publishing_profile: Some(PublishingProfile {
                target_regions: Some(
                    spec.target_regions
                        .iter()
                        .map(TargetRegionWire::from)
                        .collect(),
                ),
                replica_count: spec.replica_count,
                exclude_from_latest: Some(spec.exclude_from_latest),
                end_of_life_date,
                published_date: None,
            }),
            storage_profile: Some(StorageProfile {
                os_disk_image: Some(OsDiskImage {
                    host_caching: Some("ReadWrite".into()),
                    source: Some(DiskSource {
                        uri: Some(spec.source_uri.clone()),
                        storage_account_id: Some(spec.storage_account_id.clone()),
                    }),
                }),
            }),
            provisioning_state: None,
            replication_status: None,
            safety_profile: Some(SafetyProfileWire {
                block_deletion_before_end_of_life: Some(spec.block_deletion_before_end_of_life),
            }),
        },
    })
}

/// Map an image version as Azure returns it to the domain type.
pub(super) fn version_from(v: Version) -> ImageVersion {
    let id = v.id.unwrap_or_default();
    let definition = id
        .split("/images/")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap_or_default()
        .to_string();
    let p = v.properties.unwrap_or_default();
    let pp = p.publishing_profile.unwrap_or_default();
    let rfc3339 =
        |s: &str| OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok();
    let safety = Safety {
        end_of_life: pp.end_of_life_date.as_deref().and_then(rfc3339),
        block_deletion_before_end_of_life: p
            .safety_profile
            .and_then(|s| s.block_deletion_before_end_of_life)
            .unwrap_or(false),
    };
    let src = p
        .storage_profile
        .and_then(|s| s.os_disk_image)
        .and_then(|o| o.source)
        .unwrap_or_default();
    let replication = p.replication_status.map(|r| ReplicationStatus {
        aggregated_state: r.aggregated_state.unwrap_or_else(|| "Unknown".into()),
        summary: r
            .summary
            .unwrap_or_default()
            .into_iter()
            .map(|s| RegionReplication {
                region: s.region.unwrap_or_default(),
                state: s.state.unwrap_or_else(|| "Unknown".into()),
                progress: s.progress,
                details: s.details,
            })
            .collect(),
    });
    ImageVersion {
        version: v.name.unwrap_or_default(),
        definition,
        id,
        location: v.location.unwrap_or_default(),
        provisioning_state: state_of(p.provisioning_state.as_deref()),
        tags: v.tags.unwrap_or_default(),
        source_uri: src.uri,
        storage_account_id: src.storage_account_id,
        published_date: pp.published_date.as_deref().and_then(rfc3339),
        target_regions: pp
            .target_regions
            .unwrap_or_default()
            .into_iter()
            .map(|r| TargetRegion {
                name: r.name,
                replicas: r.regional_replica_count,
                storage_account_type: r.storage_account_type,
                exclude_from_latest: r.exclude_from_latest,
            })
            .collect(),
        exclude_from_latest: pp.exclude_from_latest.unwrap_or(false),
        replication,
        safety,
    }
}

// ---------------------------------------------------------------------------------------------
// Consumers: VMs, scale sets, scale-set VMs, disks

/// The image a consumer was made from: ComputeRP's `ImageReference` and DiskRP's
/// `ImageDiskReference`, the gallery forms only (`exactVersion` is read only, set by Azure when
/// `latest` was asked for).
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct ImageReference {
    pub(super) id: Option<String>,
    pub(super) shared_gallery_image_id: Option<String>,
    pub(super) community_gallery_image_id: Option<String>,
    pub(super) exact_version: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct VmStorageProfile {
    pub(super) image_reference: Option<ImageReference>,
}

/// A VM's or a scale-set VM's properties, as far as the consumer scan reads them.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct VmProperties {
    pub(super) storage_profile: Option<VmStorageProfile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct VmProfile {
    pub(super) storage_profile: Option<VmStorageProfile>,
}

/// A scale set's properties: its model's image and its orchestration mode.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct ScaleSetProperties {
    pub(super) orchestration_mode: Option<String>,
    pub(super) virtual_machine_profile: Option<VmProfile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct CreationData {
    pub(super) gallery_image_reference: Option<ImageReference>,
    pub(super) image_reference: Option<ImageReference>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub(super) struct DiskProperties {
    pub(super) creation_data: Option<CreationData>,
}

pub(super) type Vm = Resource<VmProperties>;
pub(super) type ScaleSet = Resource<ScaleSetProperties>;
pub(super) type Disk = Resource<DiskProperties>;

impl Vm {
    pub(super) fn image(&self) -> Option<&ImageReference> {
        self.properties
            .as_ref()?
            .storage_profile
            .as_ref()?
            .image_reference
            .as_ref()
    }
}

impl ScaleSet {
    pub(super) fn image(&self) -> Option<&ImageReference> {
        self.properties
            .as_ref()?
            .virtual_machine_profile
            .as_ref()?
            .storage_profile
            .as_ref()?
            .image_reference
            .as_ref()
    }

    /// A Flexible scale set's instances are ordinary VMs.
    pub(super) fn is_flexible(&self) -> bool {
        self.properties
            .as_ref()
            .and_then(|p| p.orchestration_mode.as_deref())
            .is_some_and(|m| m.eq_ignore_ascii_case("Flexible"))
    }
}

impl Disk {
    pub(super) fn images(&self) -> Vec<&ImageReference> {
        let Some(c) = self
            .properties
            .as_ref()
            .and_then(|p| p.creation_data.as_ref())
        else {
            return Vec::new();
        };
        [&c.gallery_image_reference, &c.image_reference]
            .into_iter()
            .flatten()
            .collect()
    }
}

/// The gallery image references a consumer records: `id` (a version, a definition for
/// `latest`, `.../versions/latest`), `sharedGalleryImageId` and `communityGalleryImageId`.
/// Anything that is not a gallery image (a managed or Marketplace image) is skipped.
pub(super) fn consumers_of<P>(
    kind: ConsumerKind,
    resource: &Resource<P>,
    reference: Option<&ImageReference>,
    out: &mut Vec<Consumer>,
) {
    let Some(reference) = reference else {
        return;
    };
    let id = resource.id.as_deref().unwrap_or_default();
    let location = resource.location.clone().filter(|l| !l.trim().is_empty());
    let exact_version = reference
        .exact_version
        .clone()
        .filter(|e| !e.trim().is_empty());
    for image in [
        &reference.id,
        &reference.shared_gallery_image_id,
        &reference.community_gallery_image_id,
    ]
    .into_iter()
    .flatten()
    {
        if ImageRef::parse(image).is_none() {
            continue;
        }
        out.push(Consumer {
            kind: kind.clone(),
            id: id.to_string(),
            image_id: image.clone(),
            location: location.clone(),
            exact_version: exact_version.clone(),
        });
    }
}

// ---------------------------------------------------------------------------------------------
// Storage accounts (Microsoft.Storage, Storage Accounts - List)

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(super) struct StorageAccount {
    pub(super) id: Option<String>,
    pub(super) name: Option<String>,
}

#[cfg(test)]
mod tests;
