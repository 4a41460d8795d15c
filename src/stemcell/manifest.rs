//! `stemcell.MF`: the stemcell's YAML manifest.
//!
//! YAML goes through `serde_yaml_ng`, the maintained continuation of the archived `serde_yaml`
//! (same data model, active releases). Versions are read as the *raw scalar text*, so an unquoted
//! `version: 1.10` stays `"1.10"` instead of becoming the float `1.1`.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::naming;
use super::platform::{Architecture, HyperVGeneration};
use super::version::{VersionError, VersionKey};

/// The create-env definition suffix used when none is configured.
pub use super::naming::DEFAULT_CREATE_ENV_SUFFIX;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("stemcell.MF is not a valid YAML stemcell manifest: {0}; the stemcell is damaged, download it again")]
    Yaml(String),
    #[error("stemcell.MF: {0}")]
    Invalid(String),
    #[error("stemcell.MF has no {field:?}; a stemcell manifest needs name, version, sha1 and cloud_properties")]
    Missing { field: &'static str },
    #[error("stemcell.MF: sha1 {value:?} is not a SHA-1 or SHA-256 hex digest (plain, or prefixed sha1:/sha256:)")]
    Checksum { value: String },
    #[error("stemcell.MF: cloud_properties.architecture {value:?} is not supported; use x86_64 (amd64) or arm64 (aarch64)")]
    Architecture { value: String },
    #[error(
        "stemcell.MF: cloud_properties.generation {value:?} is not supported; use gen1 or gen2"
    )]
    Generation { value: String },
    #[error(
        "{name:?} cannot be an image definition name: use {}",
        crate::names::DEFINITION_NAME_RULE
    )]
    DefinitionName { name: String },
    #[error("stemcell.MF: cloud_properties.architecture is arm64 with generation {generation:?}, but Azure runs Arm64 images only as Hyper-V generation 2 (an Arm64 Gen1 image definition or VM does not exist); an Arm64 stemcell needs generation: gen2 — the stemcell is mislabelled, use the Arm64 gen2 build")]
    Arm64Gen1 { generation: String },
    #[error("{name}/{version} is a light stemcell (formats {formats}): it points at a Marketplace image ({image}) and has no VHD, so it never needs a gallery; upload it to the director as is, or use the heavy stemcell if you want a gallery image")]
    LightStemcell {
        name: String,
        version: String,
        formats: String,
        image: String,
    },
}

/// Azure image definition names: 1 to 80 letters, digits, `.`, `_` and `-`, starting and ending
/// with a letter or digit. The name becomes an ARM path segment and part of blob names, so it is
/// checked when the stemcell is read, before anything is uploaded.
pub fn check_definition_name(name: &str) -> Result<(), ManifestError> {
    if crate::names::is_definition_name(name) {
        Ok(())
    } else {
        Err(ManifestError::DefinitionName {
            name: name.to_string(),
        })
    }
}

/// The stemcell is what it is: the same on every retry.
impl crate::error::Classified for ManifestError {
    fn class(&self) -> crate::error::Class {
        crate::error::Class::Permanent
    }
}

/// The `sha1` field of a manifest: the digest of the `image` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checksum {
    Sha1(String),
    Sha256(String),
}

impl Checksum {
    /// Accept `HEX` (40 hex digits → SHA-1, 64 → SHA-256), `sha1:HEX` or `sha256:HEX`.
    pub fn parse(value: &str) -> Result<Checksum, ManifestError> {
        let bad = || ManifestError::Checksum {
            value: value.to_string(),
        };
        let v = value.trim();
        let (algo, hex) = match v.split_once(':') {
            Some((a, h)) => (Some(a.to_ascii_lowercase()), h),
            None => (None, v),
        };
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad());
        }
        let hex = hex.to_ascii_lowercase();
        match (algo.as_deref(), hex.len()) {
            (None | Some("sha1"), 40) => Ok(Checksum::Sha1(hex)),
            (None | Some("sha256"), 64) => Ok(Checksum::Sha256(hex)),
            _ => Err(bad()),
        }
    }

    pub fn algorithm(&self) -> &'static str {
        match self {
            Checksum::Sha1(_) => "sha1",
            Checksum::Sha256(_) => "sha256",
        }
    }

    pub fn hex(&self) -> &str {
        match self {
            Checksum::Sha1(h) | Checksum::Sha256(h) => h,
        }
    }
}

impl std::fmt::Display for Checksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.algorithm(), self.hex())
    }
}

/// `cloud_properties` of a stemcell: what the CPI receives in `create_stemcell`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CloudProperties {
    pub name: Option<String>,
    pub version: Option<String>,
    pub architecture: Option<String>,
    pub generation: Option<String>,
    pub hypervisor: Option<String>,
    /// Root disk size in MiB.
    pub disk: Option<u64>,
    pub disk_controller_types: Option<Vec<String>>,
    pub security_type: Option<String>,
    pub accelerated_networking: Option<bool>,
    /// Light stemcells: the Marketplace image `{publisher, offer, sku, version}`.
    pub image: Option<Value>,
    /// Every other property, as given.
    pub extra: BTreeMap<String, Value>,
}

fn opt_string(map: &mut Map<String, Value>, key: &str) -> Result<Option<String>, ManifestError> {
    match map.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        // Numbers and booleans given unquoted: keep their text.
        Some(Value::Number(n)) => Ok(Some(n.to_string())),
        Some(Value::Bool(b)) => Ok(Some(b.to_string())),
        Some(other) => Err(ManifestError::Invalid(format!(
            "cloud_properties.{key} must be a string, got {other}"
        ))),
    }
}

impl CloudProperties {
    /// Read cloud properties from JSON (the CPI's `create_stemcell` argument, or the manifest).
    /// Architecture and generation are validated so the accessors cannot fail later.
    pub fn parse_json(value: Value) -> Result<CloudProperties, ManifestError> {
        let mut map = match value {
            Value::Object(m) => m,
            Value::Null => Map::new(),
            other => {
                return Err(ManifestError::Invalid(format!(
                    "cloud_properties must be a mapping, got {other}"
                )))
            }
        };
        let name = opt_string(&mut map, "name")?;
        let version = opt_string(&mut map, "version")?;
        let architecture = opt_string(&mut map, "architecture")?;
        let generation = opt_string(&mut map, "generation")?;
        let hypervisor = opt_string(&mut map, "hypervisor")?;
        let security_type = opt_string(&mut map, "security_type")?;
        let disk = match map.remove("disk") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64(),
            Some(Value::String(s)) if s.parse::<u64>().is_ok() => s.parse().ok(),
            Some(other) => {
                return Err(ManifestError::Invalid(format!(
                    "cloud_properties.disk must be a size in MiB, got {other}"
                )))
            }
        };
        let disk_controller_types = match map.remove("disk_controller_types") {
            None | Some(Value::Null) => None,
            Some(Value::Array(items)) => Some(
                items
                    .into_iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s),
                        other => Err(ManifestError::Invalid(format!(
                            "cloud_properties.disk_controller_types must list strings, got {other}"
                        ))),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(other) => {
                return Err(ManifestError::Invalid(format!(
                    "cloud_properties.disk_controller_types must be a list, got {other}"
                )))
            }
        };
        let accelerated_networking = match map.remove("accelerated_networking") {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(b),
            Some(Value::String(s)) if s.eq_ignore_ascii_case("true") => Some(true),
            Some(Value::String(s)) if s.eq_ignore_ascii_case("false") => Some(false),
            Some(other) => {
                return Err(ManifestError::Invalid(format!(
                    "cloud_properties.accelerated_networking must be true or false, got {other}"
                )))
            }
        };
        let image = match map.remove("image") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        };
        let props = CloudProperties {
            name,
            version,
            architecture,
            generation,
            hypervisor,
            disk,
            disk_controller_types,
            security_type,
            accelerated_networking,
            image,
            extra: map.into_iter().collect(),
        };
        let architecture = props.try_architecture()?;
        let generation = props.try_generation()?;
        // Light stemcells never reach a gallery (the CPI delegates them): their names are theirs.
        let light_format = props
            .extra
            .get("stemcell_formats")
            .and_then(Value::as_array)
            .is_some_and(|f| {
                f.iter()
                    .any(|f| f.as_str().is_some_and(|f| f.ends_with("-light")))
            });
        let heavy = props.image.is_none() && !light_format;
        // Azure runs Arm64 only as Hyper-V generation 2: an Arm64 Gen1 image cannot exist.
        if heavy && architecture == Architecture::Arm64 && generation == HyperVGeneration::V1 {
            return Err(ManifestError::Arm64Gen1 {
                generation: props.generation_name().to_string(),
            });
        }
        if let (Some(definition), true) = (props.definition_name(), heavy) {
            check_definition_name(&definition)?;
        }
        Ok(props)
    }

    /// All cloud properties as given (the CPI stores them as tags/metadata).
    pub fn to_json(&self) -> Map<String, Value> {
        let mut map: Map<String, Value> = self
            .extra
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                map.insert(k.to_string(), v);
            }
        };
        put("name", self.name.clone().map(Value::String));
        put("version", self.version.clone().map(Value::String));
        put("architecture", self.architecture.clone().map(Value::String));
        put("generation", self.generation.clone().map(Value::String));
        put("hypervisor", self.hypervisor.clone().map(Value::String));
        put("disk", self.disk.map(Value::from));
        put(
            "disk_controller_types",
            self.disk_controller_types
                .clone()
                .map(|v| Value::Array(v.into_iter().map(Value::String).collect())),
        );
        put(
            "security_type",
            self.security_type.clone().map(Value::String),
        );
        put(
            "accelerated_networking",
            self.accelerated_networking.map(Value::Bool),
        );
        put("image", self.image.clone());
        map
    }

    /// The generation as written (`gen1` when absent), which is also the definition's sku.
    pub fn generation_name(&self) -> &str {
        self.generation.as_deref().unwrap_or("gen1")
    }

    pub fn try_generation(&self) -> Result<HyperVGeneration, ManifestError> {
        match self.generation_name().to_ascii_lowercase().as_str() {
            "gen1" => Ok(HyperVGeneration::V1),
            "gen2" => Ok(HyperVGeneration::V2),
            _ => Err(ManifestError::Generation {
                value: self.generation_name().to_string(),
            }),
        }
    }

    pub fn try_architecture(&self) -> Result<Architecture, ManifestError> {
        match self
            .architecture
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            None | Some("x86_64") | Some("amd64") | Some("x64") => Ok(Architecture::X64),
            Some("arm64") | Some("aarch64") => Ok(Architecture::Arm64),
            Some(_) => Err(ManifestError::Architecture {
                value: self.architecture.clone().unwrap_or_default(),
            }),
        }
    }

    /// Hyper-V generation; validated at parse time, so an unknown value cannot reach here
    /// (it would read as V1 if a caller built the struct by hand).
    pub fn hyperv_generation(&self) -> HyperVGeneration {
        self.try_generation().unwrap_or(HyperVGeneration::V1)
    }

    /// CPU architecture (x64 when absent); validated at parse time like the generation.
    pub fn cpu_architecture(&self) -> Architecture {
        self.try_architecture().unwrap_or(Architecture::X64)
    }

    /// The director-mode definition name, as the Azure CPI (v53+) names it: the stemcell name,
    /// plus `-<generation>` for any generation other than gen1 (so `-gen2`).
    pub fn definition_name_for(&self, stemcell_name: &str) -> String {
        naming::director_definition(
            self.name.as_deref().unwrap_or(stemcell_name),
            self.generation_name(),
        )
    }

    /// The director-mode definition name when `cloud_properties.name` is present (CPI input).
    pub fn definition_name(&self) -> Option<String> {
        self.name.as_deref().map(|n| self.definition_name_for(n))
    }
}

/// A parsed `stemcell.MF`.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    pub name: String,
    /// The version exactly as written (raw YAML scalar text).
    pub version: String,
    pub sha1: Checksum,
    pub stemcell_formats: Vec<String>,
    pub operating_system: Option<String>,
    pub api_version: Option<u32>,
    pub cloud_properties: CloudProperties,
    /// Every other top-level field, as given.
    pub extra: BTreeMap<String, Value>,
}

/// A scalar read as its raw text (never through a number).
#[derive(Debug)]
struct RawScalar(String);

impl<'de> Deserialize<'de> for RawScalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(RawScalar)
    }
}

#[derive(Debug, Deserialize)]
struct RawCloud {
    version: Option<RawScalar>,
}

#[derive(Debug, Deserialize)]
struct RawTop {
    name: Option<RawScalar>,
    version: Option<RawScalar>,
    sha1: Option<RawScalar>,
    cloud_properties: Option<RawCloud>,
}

impl Manifest {
    pub fn parse(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        let yaml_err = |e: serde_yaml_ng::Error| ManifestError::Yaml(e.to_string());
        let raw: RawTop = serde_yaml_ng::from_slice(bytes).map_err(yaml_err)?;
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_slice(bytes).map_err(yaml_err)?;
        let json = serde_json::to_value(&doc)
            .map_err(|e| ManifestError::Invalid(format!("cannot represent as JSON: {e}")))?;
        let mut top = match json {
            Value::Object(m) => m,
            _ => {
                return Err(ManifestError::Invalid(
                    "the document is not a mapping".into(),
                ))
            }
        };
        for key in ["name", "version", "sha1"] {
            top.remove(key);
        }
        let name = raw.name.ok_or(ManifestError::Missing { field: "name" })?.0;
        let version = raw
            .version
            .ok_or(ManifestError::Missing { field: "version" })?
            .0;
        let sha1 = Checksum::parse(&raw.sha1.ok_or(ManifestError::Missing { field: "sha1" })?.0)?;
        if name.trim().is_empty() {
            return Err(ManifestError::Invalid("name is empty".into()));
        }
        if version.trim().is_empty() {
            return Err(ManifestError::Invalid("version is empty".into()));
        }
        let stemcell_formats = match top.remove("stemcell_formats") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s),
                    other => Err(ManifestError::Invalid(format!(
                        "stemcell_formats must list strings, got {other}"
                    ))),
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(ManifestError::Invalid(format!(
                    "stemcell_formats must be a list, got {other}"
                )))
            }
        };
        let operating_system = match top.remove("operating_system") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s),
            Some(other) => Some(other.to_string()),
        };
        let api_version = match top.remove("api_version") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                    .ok_or_else(|| {
                        ManifestError::Invalid(format!("api_version must be a number, got {v}"))
                    })?,
            ),
        };
        let mut cloud_json = top
            .remove("cloud_properties")
            .ok_or(ManifestError::Missing {
                field: "cloud_properties",
            })?;
        if let (Some(RawCloud { version: Some(v) }), Value::Object(m)) =
            (raw.cloud_properties, &mut cloud_json)
        {
            m.insert("version".into(), Value::String(v.0));
        }
        let cloud_properties = CloudProperties::parse_json(cloud_json)?;
        let manifest = Manifest {
            name,
            version,
            sha1,
            stemcell_formats,
            operating_system,
            api_version,
            cloud_properties,
            extra: top.into_iter().collect(),
        };
        // Without cloud_properties.name the definition is named after the stemcell.
        if !manifest.is_light() {
            check_definition_name(&manifest.definition_name())?;
        }
        Ok(manifest)
    }

    /// A light stemcell points at a Marketplace image and carries no VHD.
    pub fn is_light(&self) -> bool {
        self.stemcell_formats.iter().any(|f| f.ends_with("-light"))
            || self.cloud_properties.image.is_some()
    }

    /// Refuse light stemcells with an explanation (they never need a gallery).
    pub fn require_heavy(&self) -> Result<(), ManifestError> {
        if !self.is_light() {
            return Ok(());
        }
        Err(ManifestError::LightStemcell {
            name: self.name.clone(),
            version: self.version.clone(),
            formats: self.stemcell_formats.join(", "),
            image: self
                .cloud_properties
                .image
                .as_ref()
                .map(|v| v.to_string())
                .unwrap_or_else(|| "no image given".into()),
        })
    }

    pub fn version_key(&self) -> Result<VersionKey, VersionError> {
        VersionKey::parse(&self.version)
    }

    /// Director-mode image definition name (shared with the Azure CPI).
    pub fn definition_name(&self) -> String {
        self.cloud_properties.definition_name_for(&self.name)
    }

    /// Create-env-mode image definition name: the director name plus `suffix`
    /// (normally [`DEFAULT_CREATE_ENV_SUFFIX`]).
    pub fn create_env_definition_name(&self, suffix: &str) -> String {
        naming::create_env_definition(&self.definition_name(), suffix)
    }

    pub fn architecture(&self) -> Architecture {
        self.cloud_properties.cpu_architecture()
    }

    pub fn generation(&self) -> HyperVGeneration {
        self.cloud_properties.hyperv_generation()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    fn mf(version: &str, extra_cloud: &str) -> String {
        format!(
            "name: bosh-azure-hyperv-ubuntu-jammy-go_agent\nversion: {version}\nbosh_protocol: 1\napi_version: 3\nsha1: {SHA}\noperating_system: ubuntu-jammy\nstemcell_formats: [azure-vhd]\ncloud_properties:\n  name: bosh-azure-hyperv-ubuntu-jammy-go_agent\n  version: {version}\n  infrastructure: azure\n  disk: 5120\n  architecture: x86_64\n{extra_cloud}"
        )
    }

    #[test]
    fn quoted_and_unquoted_versions_keep_their_text() {
        for (written, expected) in [
            ("'1.506'", "1.506"),
            ("1.506", "1.506"),
            ("1.10", "1.10"),
            ("\"1.10\"", "1.10"),
            ("1.100", "1.100"),
            ("1", "1"),
            ("1.2.3", "1.2.3"),
        ] {
            let m = Manifest::parse(mf(written, "").as_bytes()).unwrap();
            assert_eq!(m.version, expected, "written {written}");
            assert_eq!(m.cloud_properties.version.as_deref(), Some(expected));
            assert_eq!(m.cloud_properties.to_json()["version"], expected);
        }
        let m = Manifest::parse(mf("1.10", "").as_bytes()).unwrap();
        assert_eq!(m.version_key().unwrap().to_string(), "1.10.0");
    }

    proptest::proptest! {
        /// Whatever digits-and-dots version is written, quoted or not, its text survives exactly
        /// (so 1.10 never becomes 1.1, 1.0 never becomes 1, and 007 keeps its zeros).
        #[test]
        fn version_text_survives_yaml(v in "[0-9]{1,6}(\\.[0-9]{1,6}){0,3}", quote in 0usize..3) {
            let written = match quote { 0 => v.clone(), 1 => format!("'{v}'"), _ => format!("\"{v}\"") };
            let m = Manifest::parse(mf(&written, "").as_bytes()).unwrap();
            proptest::prop_assert_eq!(&m.version, &v);
            proptest::prop_assert_eq!(m.cloud_properties.version.as_deref(), Some(v.as_str()));
            if let Ok(k) = m.version_key() {
                proptest::prop_assert!(k.to_string().starts_with(&v));
            }
        }
    }

    #[test]
    fn typical_manifest_fields_and_unknowns_are_kept() {
        let m = Manifest::parse(mf("'1.506'", "  os_type: linux\n").as_bytes()).unwrap();
        assert_eq!(m.name, "bosh-azure-hyperv-ubuntu-jammy-go_agent");
        assert_eq!(m.sha1, Checksum::Sha1(SHA.into()));
        assert_eq!(m.stemcell_formats, vec!["azure-vhd"]);
        assert_eq!(m.api_version, Some(3));
        assert_eq!(m.operating_system.as_deref(), Some("ubuntu-jammy"));
        assert_eq!(m.extra["bosh_protocol"], 1);
        assert_eq!(m.cloud_properties.disk, Some(5120));
        assert_eq!(m.cloud_properties.extra["os_type"], "linux");
        assert_eq!(m.cloud_properties.to_json()["infrastructure"], "azure");
        assert_eq!(
            m.definition_name(),
            "bosh-azure-hyperv-ubuntu-jammy-go_agent"
        );
        assert_eq!(
            m.create_env_definition_name(DEFAULT_CREATE_ENV_SUFFIX),
            "bosh-azure-hyperv-ubuntu-jammy-go_agent-create-env"
        );
        assert_eq!(m.architecture(), Architecture::X64);
        assert_eq!(m.generation(), HyperVGeneration::V1);
        assert!(!m.is_light());
        m.require_heavy().unwrap();
    }

    #[test]
    fn gen2_arm64_definitions_get_the_generation_suffix_like_the_cpi() {
        let text = mf("'1.506'", "  generation: gen2\n  disk_controller_types: [scsi, nvme]\n  security_type: TrustedLaunchSupported\n  accelerated_networking: true\n")
            .replace("architecture: x86_64", "architecture: arm64");
        let m = Manifest::parse(text.as_bytes()).unwrap();
        assert_eq!(
            m.definition_name(),
            "bosh-azure-hyperv-ubuntu-jammy-go_agent-gen2"
        );
        assert_eq!(
            m.create_env_definition_name("-ce"),
            "bosh-azure-hyperv-ubuntu-jammy-go_agent-gen2-ce"
        );
        assert_eq!(m.architecture(), Architecture::Arm64);
        assert_eq!(m.generation(), HyperVGeneration::V2);
        assert_eq!(
            m.cloud_properties.disk_controller_types,
            Some(vec!["scsi".to_string(), "nvme".to_string()])
        );
        assert_eq!(m.cloud_properties.accelerated_networking, Some(true));
    }

    /// Azure has no Arm64 Gen1 image: such a manifest is refused when it is read (inspect, seed,
    /// the CPI), naming the remedy; an Arm64 light stemcell is not ours to judge.
    #[test]
    fn arm64_gen1_is_refused() {
        let text = mf("'1.506'", "").replace("architecture: x86_64", "architecture: arm64");
        let err = Manifest::parse(text.as_bytes()).unwrap_err();
        assert!(matches!(err, ManifestError::Arm64Gen1 { .. }), "{err}");
        assert!(err.to_string().contains("generation: gen2"), "{err}");
        let explicit = mf("'1.506'", "  generation: gen1\n")
            .replace("architecture: x86_64", "architecture: aarch64");
        assert!(Manifest::parse(explicit.as_bytes()).is_err());
        assert!(CloudProperties::parse_json(
            serde_json::json!({"name": "n", "architecture": "arm64", "generation": "gen1"})
        )
        .is_err());
        let light = CloudProperties::parse_json(serde_json::json!({"name": "n",
            "architecture": "arm64", "image": {"publisher": "p", "offer": "o", "sku": "s", "version": "1"}}));
        assert!(light.is_ok());
    }

    #[test]
    fn definition_name_falls_back_to_the_stemcell_name() {
        let text = mf("'1.5'", "").replace("  name: bosh-azure-hyperv-ubuntu-jammy-go_agent\n", "");
        let m = Manifest::parse(text.as_bytes()).unwrap();
        assert_eq!(m.cloud_properties.name, None);
        assert_eq!(
            m.definition_name(),
            "bosh-azure-hyperv-ubuntu-jammy-go_agent"
        );
    }

    #[test]
    fn cloud_properties_from_cpi_json() {
        let cp = CloudProperties::parse_json(serde_json::json!({
            "name": "bosh-azure-x", "version": "1.10", "generation": "gen2", "architecture": "arm64",
            "infrastructure": "azure", "disk": 3072
        }))
        .unwrap();
        assert_eq!(cp.definition_name().as_deref(), Some("bosh-azure-x-gen2"));
        assert_eq!(cp.cpu_architecture(), Architecture::Arm64);
        assert_eq!(cp.to_json()["infrastructure"], "azure");
        assert_eq!(cp.to_json()["disk"], 3072);
        assert!(CloudProperties::parse_json(serde_json::json!({"generation": "gen3"})).is_err());
        assert!(CloudProperties::parse_json(serde_json::json!({"architecture": "sparc"})).is_err());
        assert!(CloudProperties::parse_json(serde_json::json!([1])).is_err());
    }

    #[test]
    fn checksums_plain_or_prefixed() {
        assert_eq!(Checksum::parse(SHA).unwrap(), Checksum::Sha1(SHA.into()));
        assert_eq!(
            Checksum::parse(&format!("sha1:{}", SHA.to_uppercase())).unwrap(),
            Checksum::Sha1(SHA.into())
        );
        let s256 = "a".repeat(64);
        assert_eq!(
            Checksum::parse(&format!("sha256:{s256}")).unwrap(),
            Checksum::Sha256(s256.clone())
        );
        assert_eq!(
            Checksum::parse(&s256).unwrap(),
            Checksum::Sha256(s256.clone())
        );
        for bad in [
            "",
            "xyz",
            "sha1:abc",
            &format!("sha256:{SHA}"),
            &format!("md5:{SHA}"),
            &format!("{SHA}0"),
        ] {
            assert!(Checksum::parse(bad).is_err(), "{bad}");
        }
        let m = Manifest::parse(
            mf("1", "")
                .replace(SHA, &format!("sha256:{s256}"))
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(m.sha1, Checksum::Sha256(s256));
    }

    #[test]
    fn light_stemcells_are_refused_with_an_explanation() {
        let text = mf("'1.506'", "  image:\n    publisher: pivotal\n    offer: bosh-ubuntu-jammy\n    sku: '1.506'\n    version: 1.506.0\n")
            .replace("[azure-vhd]", "[azure-light]");
        let m = Manifest::parse(text.as_bytes()).unwrap();
        assert!(m.is_light());
        let err = m.require_heavy().unwrap_err().to_string();
        assert!(err.contains("light stemcell"), "{err}");
        assert!(err.contains("never needs a gallery"), "{err}");
        assert!(err.contains("bosh-ubuntu-jammy"), "{err}");
    }

    #[test]
    fn broken_manifests_say_what_is_wrong() {
        let cases = [
            ("name: [unclosed", "not a valid YAML"),
            ("- a\n- b\n", "not a valid YAML"),
            ("version: '1'\nsha1: x\ncloud_properties: {}\n", "\"name\""),
            (
                &mf("'1'", "").replace("version: '1'\nbosh", "bosh"),
                "\"version\"",
            ),
            (
                &mf("'1'", "").replace(&format!("sha1: {SHA}\n"), ""),
                "\"sha1\"",
            ),
            (&mf("'1'", "").replace(SHA, "nothex"), "not a SHA-1"),
            (&mf("'1'", "  generation: gen9\n"), "gen9"),
            (&mf("'1'", "").replace("x86_64", "ppc64le"), "ppc64le"),
            (&mf("'1'", "").replace("disk: 5120", "disk: big"), "disk"),
        ];
        for (text, needle) in cases {
            let err = Manifest::parse(text.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
        let cp = mf("'1'", "")
            .split("cloud_properties")
            .next()
            .unwrap()
            .to_string();
        assert!(Manifest::parse(cp.as_bytes())
            .unwrap_err()
            .to_string()
            .contains("cloud_properties"));
    }

    /// Found by tests/integration/bad_input.rs: a name that cannot be an image definition name went into
    /// blob names and ARM paths (`../../x` addressed another resource) after the VHD upload.
    #[test]
    fn names_that_cannot_be_definition_names_are_refused_when_read() {
        let name = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
        for bad in [
            "bad name!",
            "../../x",
            "a/b",
            "-lead",
            "trail-",
            "",
            &"a".repeat(81),
        ] {
            let quoted = format!("'{bad}'");
            let text =
                mf("'1'", "").replacen(&format!("  name: {name}"), &format!("  name: {quoted}"), 1);
            let err = Manifest::parse(text.as_bytes()).unwrap_err();
            assert!(
                matches!(&err, ManifestError::DefinitionName { name } if name == bad),
                "{bad:?}: {err}"
            );
            let err = CloudProperties::parse_json(serde_json::json!({"name": bad}))
                .unwrap_err()
                .to_string();
            assert!(err.contains("cannot be an image definition name"), "{err}");
        }
        // Without cloud_properties.name, the stemcell name is the definition name.
        let text = mf("'1'", "")
            .replacen(&format!("  name: {name}\n"), "", 1)
            .replacen(&format!("name: {name}"), "name: 'no good'", 1);
        assert!(matches!(
            Manifest::parse(text.as_bytes()),
            Err(ManifestError::DefinitionName { .. })
        ));
        // Light stemcells never reach a gallery: their names are not checked.
        let light = serde_json::json!({"name": "any name", "image": {"offer": "o"}});
        assert!(CloudProperties::parse_json(light).is_ok());
        assert!(check_definition_name(&"a".repeat(80)).is_ok());
        assert!(check_definition_name("x_1.2-gen2").is_ok());
    }
}
