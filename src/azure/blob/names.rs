//! Stemcell blob names and metadata, the Azure CPI's way: `bosh-stemcell-<uuid>.vhd`, the CPI's
//! metadata keys (sanitised, never dropped), and the SDK's metadata type.

use std::collections::BTreeMap;

use std::collections::HashMap;

use serde_json::Value;

use super::target::Blob;

use super::META_IMAGE_SHA256;

/// `container/blob`, the way errors and logs name a blob.
pub fn blob_path(blob: &Blob) -> String {
    format!(
        "{}/{}",
        blob.container_client().container_name(),
        blob.blob_name()
    )
}

/// The metadata the Azure CPI (v53+) puts on a stemcell blob when a compute gallery is enabled,
/// computed the same way, so a CPI can rebuild a gallery version from a blob seeded by us:
///
/// - every key of the stemcell's `cloud_properties` (`name`, `version`, `infrastructure`,
///   `hypervisor`, `disk`, `os_type`, `architecture`, `generation`, …), each value as a string:
///   strings as they are, numbers and booleans in their usual text, `null` as empty, arrays and
///   objects as compact JSON (the CPI's Ruby `to_s` gives `["scsi", "nvme"]`; it reads
///   `disk_controller_types` back with `JSON.parse`, which accepts both);
/// - `image`: JSON `{"publisher":"bosh","offer":<definition>,"sku":<generation, default gen1>,
///   "version":<cloud_properties.version padded to MAJOR.MINOR.PATCH>}`;
/// - `compute_gallery_name`, `compute_gallery_image_definition`, `image_sha256`.
///
/// These override cloud properties of the same name, as in the CPI. Blob metadata names must be
/// C# identifiers and values ASCII header text: an invalid name has its invalid characters
/// replaced by `_` (prefixed with `_` if it starts with a digit; colliding names get a numeric
/// suffix) and non-ASCII or control characters in values are escaped as `\uXXXX` — each change
/// is logged as a warning, nothing is dropped silently. Callers should validate the version key
/// beforehand; this function never truncates a version.
pub fn stemcell_blob_metadata(
    cloud_properties: &serde_json::Map<String, Value>,
    image_sha256: &str,
    gallery: &str,
    definition: &str,
) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (key, value) in cloud_properties {
        let text = match value {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => n.to_string(),
            Value::Array(_) | Value::Object(_) => value.to_string(),
        };
        insert_sanitised(&mut out, key, &text);
    }
    let generation = match cloud_properties.get("generation") {
        Some(Value::String(g)) if !g.is_empty() => g.clone(),
        _ => "gen1".to_string(),
    };
    let version = match cloud_properties.get("version") {
        Some(Value::String(v)) => cpi_semver(v),
        Some(Value::Number(n)) => cpi_semver(&n.to_string()),
        _ => String::new(),
    };
    let json = |s: &str| Value::String(s.to_string()).to_string();
    let image = format!(
        "{{\"publisher\":\"bosh\",\"offer\":{},\"sku\":{},\"version\":{}}}",
        json(definition),
        json(&generation),
        json(&version)
    );
    for (key, value) in [
        ("image", image.as_str()),
        ("compute_gallery_name", gallery),
        ("compute_gallery_image_definition", definition),
        (META_IMAGE_SHA256, image_sha256),
    ] {
        out.insert(key.to_string(), sanitise_value(key, value));
    }
    out
}

/// The CPI's `make_semver_compliant`: pad to three parts with `0`. Unlike the CPI, more than three
/// parts are kept as given (never truncated) with a warning.
fn cpi_semver(version: &str) -> String {
    let parts: Vec<&str> = version.split('.').collect();
    match parts.len() {
        1 => format!("{}.0.0", parts[0]),
        2 => format!("{}.{}.0", parts[0], parts[1]),
        3 => version.to_string(),
        _ => {
            tracing::warn!(
                version,
                "stemcell version has more than three parts; kept as is in blob metadata `image`"
            );
            version.to_string()
        }
    }
}

fn insert_sanitised(out: &mut BTreeMap<String, String>, key: &str, value: &str) {
    let mut name = sanitise_name(key);
    if name != key {
        tracing::warn!(
            original = key,
            sanitised = %name,
            "cloud property name is not a valid blob metadata name; renamed"
        );
    }
    // Metadata names are case-insensitive in Azure: avoid two keys that differ only in case.
    let base = name.clone();
    let mut n = 2;
    while out.keys().any(|k| k.eq_ignore_ascii_case(&name)) {
        name = format!("{base}_{n}");
        n += 1;
    }
    if name != base {
        tracing::warn!(original = key, renamed = %name, "blob metadata name collides with another; renamed");
    }
    let value = sanitise_value(&name, value);
    out.insert(name, value);
}

/// Make `key` a C# identifier: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn sanitise_name(key: &str) -> String {
    let mut name: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, '_');
    }
    name
}

/// Make `value` printable ASCII (header-safe), escaping anything else as `\uXXXX`.
pub fn sanitise_value(key: &str, value: &str) -> String {
    if value.chars().all(|c| (' '..='~').contains(&c)) {
        return value.to_string();
    }
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        if (' '..='~').contains(&c) {
            out.push(c);
        } else {
            let mut buf = [0u16; 2];
            for unit in c.encode_utf16(&mut buf) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        }
    }
    tracing::warn!(
        key,
        "blob metadata value has non-ASCII or control characters; escaped as \\uXXXX"
    );
    out
}

pub(crate) fn to_sdk_metadata(map: &BTreeMap<String, String>) -> HashMap<String, String> {
    map.iter()
        .map(|(k, v)| (sanitise_name(k), sanitise_value(k, v)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::{is_stemcell_cid, new_stemcell_blob_name};
    use serde_json::json;

    #[test]
    fn only_bosh_stemcell_uuid_is_a_stemcell_cid() {
        let (cid, blob) = new_stemcell_blob_name();
        assert!(is_stemcell_cid(&cid), "{cid}");
        assert_eq!(blob, format!("{cid}.vhd"));
        assert!(is_stemcell_cid(
            "bosh-stemcell-0b0e7c1e-7a39-4d4c-9d53-5300aa000001"
        ));
        for not in [
            "bosh-stemcell-aaaa",
            "bosh-stemcell-",
            "ops-pipeline",
            "bosh-stemcell-0b0e7c1e7a394d4c9d535300aa000001",
            "xbosh-stemcell-0b0e7c1e-7a39-4d4c-9d53-5300aa000001",
            "bosh-stemcell-0b0e7c1e-7a39-4d4c-9d53-5300aa000001.vhd",
        ] {
            assert!(!is_stemcell_cid(not), "{not}");
        }
    }

    #[test]
    fn stemcell_names_follow_the_cpi() {
        let (cid, blob) = new_stemcell_blob_name();
        assert!(cid.starts_with("bosh-stemcell-"));
        assert_eq!(blob, format!("{cid}.vhd"));
        assert!(uuid::Uuid::parse_str(&cid["bosh-stemcell-".len()..]).is_ok());
        assert_ne!(new_stemcell_blob_name().0, cid);
    }

    #[test]
    fn metadata_matches_the_cpi_keys() {
        let props = json!({
            "name": "bosh-azure-hyperv-ubuntu-jammy-go_agent",
            "version": "1.506",
            "infrastructure": "azure",
            "disk": 5120,
            "generation": "gen2",
            "disk_controller_types": ["scsi", "nvme"],
            "accelerated_networking": true,
            "image_sha256": "stale"
        });
        let m = stemcell_blob_metadata(
            props.as_object().expect("object"),
            "abc123",
            "gal",
            "bosh-azure-hyperv-ubuntu-jammy-go_agent-gen2",
        );
        assert_eq!(m["name"], "bosh-azure-hyperv-ubuntu-jammy-go_agent");
        assert_eq!(m["version"], "1.506");
        assert_eq!(m["disk"], "5120");
        assert_eq!(m["accelerated_networking"], "true");
        assert_eq!(m["disk_controller_types"], r#"["scsi","nvme"]"#);
        assert_eq!(m["compute_gallery_name"], "gal");
        assert_eq!(
            m["compute_gallery_image_definition"],
            "bosh-azure-hyperv-ubuntu-jammy-go_agent-gen2"
        );
        assert_eq!(
            m["image_sha256"], "abc123",
            "ours overrides a stale property"
        );
        let image: Value = serde_json::from_str(&m["image"]).expect("image is JSON");
        assert_eq!(
            image,
            json!({"publisher": "bosh", "offer": "bosh-azure-hyperv-ubuntu-jammy-go_agent-gen2", "sku": "gen2", "version": "1.506.0"})
        );
        assert!(
            m["image"].starts_with(r#"{"publisher":"bosh","offer":"#),
            "the CPI's key order"
        );
    }

    #[test]
    fn metadata_names_and_values_are_sanitised_not_dropped() {
        let props = json!({
            "root-device.name": "/dev/sda1",
            "1st": "x",
            "Name": "upper",
            "name": "lower",
            "note": "caf\u{e9}\nline"
        });
        let m = stemcell_blob_metadata(props.as_object().expect("object"), "s", "g", "d");
        assert_eq!(m["root_device_name"], "/dev/sda1");
        assert_eq!(m["_1st"], "x");
        assert_eq!(m["note"], "caf\\u00e9\\u000aline");
        // `Name` and `name` collide case-insensitively: both survive.
        let names: Vec<&String> = m
            .keys()
            .filter(|k| k.to_ascii_lowercase().starts_with("name"))
            .collect();
        assert_eq!(names.len(), 2, "{m:?}");
        for key in m.keys() {
            assert!(
                key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{key}"
            );
            assert!(!key.starts_with(|c: char| c.is_ascii_digit()), "{key}");
        }
        for value in m.values() {
            assert!(value.chars().all(|c| (' '..='~').contains(&c)), "{value}");
        }
    }

    #[test]
    fn version_padding_never_truncates() {
        assert_eq!(cpi_semver("1"), "1.0.0");
        assert_eq!(cpi_semver("1.2"), "1.2.0");
        assert_eq!(cpi_semver("1.2.3"), "1.2.3");
        assert_eq!(cpi_semver("1.2.3.4"), "1.2.3.4");
    }
}
