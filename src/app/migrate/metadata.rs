//! The stemcell a pre-gallery blob's metadata describes. The Azure CPI wrote each of the
//! stemcell's cloud properties as one metadata value (REFERENCE.md "Pre-gallery stemcells"):
//! strings as they are, lists and maps as JSON text (its Ruby `to_s`; the inverse of
//! `azure::blob::names::stemcell_blob_metadata`). A blob the CPI made with a gallery enabled
//! also carries `image`, `compute_gallery_*` and `image_sha256`, which are not cloud
//! properties; this tool's own marks neither.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::{Row, Skip};
use crate::gallery::service::StemcellImage;
use crate::gallery::tags;
use crate::stemcell::manifest::CloudProperties;
use crate::stemcell::version::VersionKey;

/// Metadata keys that are not the stemcell's cloud properties: the gallery-era CPI's and this
/// tool's (`image_sha1` and `upload_state` are named only inside the blob adapter).
const NOT_CLOUD_PROPERTIES: [&str; 6] = [
    "image",
    tags::GALLERY_NAME,
    tags::IMAGE_DEFINITION,
    crate::names::META_IMAGE_SHA256,
    "image_sha1",
    "upload_state",
];

/// The cloud properties the metadata holds, as the stemcell's manifest gave them.
pub fn cloud_properties(meta: &HashMap<String, String>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in meta {
        let key = k.to_ascii_lowercase();
        if NOT_CLOUD_PROPERTIES.contains(&key.as_str()) {
            continue;
        }
        let t = v.trim();
        let value = if t.starts_with('[') || t.starts_with('{') {
            serde_json::from_str(t).unwrap_or_else(|_| Value::String(v.clone()))
        } else {
            Value::String(v.clone())
        };
        out.insert(key, value);
    }
    out
}

/// The stemcell the blob of `row` holds: name and version from its metadata (the list's when
/// the metadata has none), definition, generation and architecture as the CPI derives them.
/// The content identity is set by the caller, once the blob's digest is read.
pub fn stemcell_of(row: &Row, meta: &HashMap<String, String>) -> Result<StemcellImage, Skip> {
    let props = cloud_properties(meta);
    // A light stemcell has no blob; a blob whose cloud properties still say so is not one
    // this tool can make a version from.
    let light = props
        .get("stemcell_formats")
        .is_some_and(|f| f.to_string().contains("-light"));
    if light {
        return Err(Skip::Light);
    }
    let cloud = CloudProperties::parse_json(Value::Object(props)).map_err(|e| {
        Skip::Unmappable(format!(
            "the blob's metadata are not a stemcell's cloud properties: {e}"
        ))
    })?;
    let name = cloud.name.clone().unwrap_or_else(|| row.name.clone());
    let version = cloud.version.clone().unwrap_or_else(|| row.version.clone());
    if !name.eq_ignore_ascii_case(&row.name) || version != row.version {
        return Err(Skip::Unmappable(format!(
            "the blob's metadata name stemcell {name} {version}, the director's list {} {}: not migrated, as a CID must hold the stemcell the director knows it by",
            row.name, row.version
        )));
    }
    let key = VersionKey::parse(&version).map_err(|e| {
        Skip::Unmappable(format!(
            "version {version:?} cannot be a gallery version: {e}"
        ))
    })?;
    Ok(StemcellImage::from_cloud_properties(
        &name, &version, &key, &cloud, "",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> Row {
        Row {
            list: "d.json".into(),
            holder: None,
            name: "bosh-azure-hyperv-ubuntu-jammy-go_agent".into(),
            version: "1.506".into(),
            cid: "bosh-stemcell-00000000-0000-0000-0000-000000000001".into(),
        }
    }

    fn meta(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_gen2_stemcells_metadata_maps_to_its_gen2_definition() {
        let m = meta(&[
            ("name", "bosh-azure-hyperv-ubuntu-jammy-go_agent"),
            ("version", "1.506"),
            ("os_type", "linux"),
            ("generation", "gen2"),
            ("architecture", "x86_64"),
            ("disk", "3072"),
            ("disk_controller_types", "[\"scsi\", \"nvme\"]"),
        ]);
        let s = stemcell_of(&row(), &m).unwrap();
        assert_eq!(s.definition, "bosh-azure-hyperv-ubuntu-jammy-go_agent-gen2");
        assert_eq!(s.version_key, "1.506.0");
        assert_eq!(
            s.features.get("DiskControllerTypes").map(String::as_str),
            Some("SCSI, NVMe")
        );
    }

    #[test]
    fn metadata_naming_another_stemcell_than_the_list_is_not_migrated() {
        let m = meta(&[
            ("name", "bosh-azure-hyperv-ubuntu-jammy-go_agent"),
            ("version", "1.507"),
        ]);
        assert!(matches!(stemcell_of(&row(), &m), Err(Skip::Unmappable(_))));
    }

    #[test]
    fn gallery_marks_are_not_cloud_properties_and_an_image_is_light() {
        let m = meta(&[
            ("name", "n"),
            ("compute_gallery_name", "g"),
            ("image_sha256", "ab"),
            ("upload_state", "complete"),
        ]);
        assert_eq!(
            cloud_properties(&m).keys().collect::<Vec<_>>(),
            vec!["name"]
        );
        let light = meta(&[("stemcell_formats", "[\"azure-light\"]")]);
        assert_eq!(stemcell_of(&row(), &light).unwrap_err(), Skip::Light);
    }
}
