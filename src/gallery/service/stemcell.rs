//! What the service needs to know of a stemcell, described from its cloud properties (stemcell.MF's
//! or a CPI request's): definition name and features, content identity, cloud properties as tags.

use std::collections::BTreeMap;

use super::super::content::Content;
use super::super::model::*;
use super::super::tags;

/// What the service needs to know of a stemcell.
#[derive(Debug, Clone)]
pub struct StemcellImage {
    /// The stemcell's name (stemcell.MF `name`).
    pub name: String,
    /// The stemcell's version as given (`1.506`).
    pub version: String,
    /// The gallery version key (`1.506.0`), from `stemcell::version::VersionKey`.
    pub version_key: String,
    /// The director-mode definition name (cloud_properties.name, `-gen2` appended for gen2).
    pub definition: String,
    pub architecture: Architecture,
    pub generation: HyperVGeneration,
    /// Definition features to create it with (e.g. SecurityType for gen2).
    pub features: BTreeMap<String, String>,
    /// The content identity: the SHA-256 of the stemcell's `image` file, or, for a version made
    /// from a VHD already in storage (`migrate`), the VHD's content digest (`gallery::content`).
    pub content: Content,
    /// Cloud properties as tags (already flattened to strings).
    pub cloud_property_tags: BTreeMap<String, String>,
}

/// Cloud properties recorded as tags, leaving room for ours and for references.
const MAX_CLOUD_PROPERTY_TAGS: usize = 20;

impl StemcellImage {
    /// Describe a stemcell from its cloud properties (stemcell.MF's, or the CPI request's),
    /// with the gallery version key already checked by `stemcell::version::VersionKey`.
    pub fn from_cloud_properties(
        stemcell_name: &str,
        stemcell_version: &str,
        version_key: &crate::stemcell::version::VersionKey,
        cloud: &crate::stemcell::manifest::CloudProperties,
        image_sha256: &str,
    ) -> StemcellImage {
        let generation = cloud.hyperv_generation();
        let mut features = BTreeMap::new();
        if generation == HyperVGeneration::V2 {
            features.insert(
                "SecurityType".to_string(),
                cloud
                    .security_type
                    .clone()
                    .unwrap_or_else(|| "TrustedLaunchSupported".into()),
            );
        }
        if let Some(types) = &cloud.disk_controller_types {
            if !types.is_empty() {
                let names: Vec<String> = types
                    .iter()
                    .map(|t| match t.to_ascii_lowercase().as_str() {
                        "scsi" => "SCSI".to_string(),
                        "nvme" => "NVMe".to_string(),
                        _ => t.clone(),
                    })
                    .collect();
                features.insert("DiskControllerTypes".to_string(), names.join(", "));
            }
        }
        if cloud.accelerated_networking == Some(true) {
            features.insert(
                "IsAcceleratedNetworkSupported".to_string(),
                "True".to_string(),
            );
        }
        // The Azure CPI records the cloud properties as tags too. Keys must be valid tag names,
        // and the references need room within Azure's 50 tags: at most 20 properties are kept,
        // and any left out are named in the log (they stay in the stemcell; only tags are short).
        let mut cloud_property_tags = BTreeMap::new();
        let mut skipped = Vec::new();
        for (k, v) in cloud.to_json() {
            let valid_key = !k.is_empty()
                && k.len() <= 64
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
                && !tags::is_reference_tag(&k);
            if !valid_key || cloud_property_tags.len() >= MAX_CLOUD_PROPERTY_TAGS {
                skipped.push(k);
                continue;
            }
            let s = match v {
                serde_json::Value::String(s) => s,
                other => other.to_string(),
            };
            cloud_property_tags.insert(k, s);
        }
        if !skipped.is_empty() {
            tracing::warn!(skipped = ?skipped, "cloud properties not recorded as version tags (invalid tag names or over the tag budget)");
        }
        StemcellImage {
            name: stemcell_name.to_string(),
            version: stemcell_version.to_string(),
            version_key: version_key.to_string(),
            definition: cloud.definition_name_for(stemcell_name),
            architecture: cloud.cpu_architecture(),
            generation,
            features,
            content: Content::image(image_sha256),
            cloud_property_tags,
        }
    }

    /// Describe a stemcell from its manifest.
    pub fn from_manifest(
        manifest: &crate::stemcell::manifest::Manifest,
        version_key: &crate::stemcell::version::VersionKey,
        image_sha256: &str,
    ) -> StemcellImage {
        Self::from_cloud_properties(
            &manifest.name,
            &manifest.version,
            version_key,
            &manifest.cloud_properties,
            image_sha256,
        )
    }
}
