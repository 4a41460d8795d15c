//! Configuration layers: our TOML file, the Azure CPI's cpi.json, the environment, the flags.
//!
//! Each source becomes a [`Layer`] of optional values; `Settings::resolve` merges them
//! (flags > environment > TOML > cpi.json) and validates the result.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{ConfigError, SecretString};
use crate::config::cloud::{azure_stack_endpoints, CloudEndpoints};

/// One source of settings. The TOML file is exactly this shape (unknown keys are an error);
/// every other source is mapped onto it.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    pub subscription: Option<String>,
    pub resource_group: Option<String>,
    pub gallery: Option<String>,
    pub location: Option<String>,
    pub arm_endpoint: Option<String>,
    pub blob_endpoint: Option<String>,
    pub storage_account: Option<String>,
    pub storage_account_resource_group: Option<String>,
    pub auth: Option<String>,
    pub cloud: Option<String>,
    pub tenant_id: Option<String>,
    pub client_id: Option<String>,
    /// A file holding the client secret (preferred over putting the secret in the file).
    pub client_secret_file: Option<PathBuf>,
    /// The client secret inline (cpi.json carries it this way; prefer `client_secret_file`).
    #[serde(default, deserialize_with = "de_secret")]
    pub client_secret: Option<SecretString>,
    pub federated_token_file: Option<PathBuf>,
    pub managed_identity_client_id: Option<String>,
    pub managed_identity_resource_id: Option<String>,
    pub authority_host: Option<String>,
    pub token_audience: Option<String>,
    pub storage_suffix: Option<String>,
    pub imds_endpoint: Option<String>,
    pub replicas: Option<u32>,
    pub create_env: Option<bool>,
    /// Adopt versions without image_sha256 whose source blob cannot be read, without proof
    /// (cpi.json `stemcell_gallery_adopt_unverified`; `--adopt-unverified` on seed).
    pub adopt_unverified: Option<bool>,
    pub create_env_suffix: Option<String>,
    /// The end of life of new versions: a date or a span after publishing (cpi.json
    /// `stemcell_gallery_end_of_life`; `--end-of-life`).
    pub end_of_life: Option<String>,
    /// Ask Azure to refuse deletion of new versions before their end of life (cpi.json
    /// `stemcell_gallery_block_deletion_before_end_of_life`).
    pub block_deletion_before_end_of_life: Option<bool>,
    /// Keep a `CanNotDelete` management lock on every version this tool holds (default on;
    /// cpi.json `stemcell_gallery_protect_held_versions`; `gallery::protect`).
    pub protect_held_versions: Option<bool>,
    /// A cpi.json to read underneath this file (its values lose to this file's).
    pub cpi_config: Option<PathBuf>,
    /// Subscriptions, besides the gallery's, whose VMs, scale sets and disks are read as
    /// consumers. Every layer's list counts (a union, not an override): reading more scopes can
    /// only keep more.
    pub consumer_subscriptions: Option<Vec<String>>,
    /// A PEM bundle of extra CA certificates to trust (relative to this file).
    pub ca_cert: Option<PathBuf>,
    /// The tuning knobs (`[tuning]`: retries, timeouts, lock_wait, coalesce); the environment's
    /// `STEMCELL_GALLERY_*` variables win over them.
    pub tuning: Option<super::tuning::FileTuning>,
    /// PEM text of extra CAs from cpi.json (`azure.azure_stack.ca_cert`, or the
    /// `azure_stack_ca_cert.pem` the Azure CPI job renders beside cpi.json); not a TOML key.
    #[serde(skip)]
    pub ca_cert_pem: Option<(String, String)>,
    /// `SSL_CERT_FILE` (environment only); not a TOML key.
    #[serde(skip)]
    pub ssl_cert_file: Option<PathBuf>,
    /// Endpoints a cloud section brings (Azure Stack from cpi.json); not a TOML key.
    #[serde(skip)]
    pub cloud_endpoints: Option<CloudEndpoints>,
    /// cpi.json `credentials_source: managed_identity` (or the legacy
    /// `managed_service_identity.enabled`); not a TOML key.
    #[serde(skip)]
    pub managed_identity: bool,
    /// The cpi.json names a client certificate; not supported here. Not a TOML key.
    #[serde(skip)]
    pub client_certificate: bool,
}

/// Deserialize a secret string. serde's own type errors quote the value they got, so every
/// non-string is refused here with a message that does not.
fn de_secret<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<SecretString>, D::Error> {
    struct SecretVisitor;
    fn refuse<E: serde::de::Error>() -> E {
        E::custom("client_secret must be a string (its value is not shown)")
    }
    impl<'de> serde::de::Visitor<'de> for SecretVisitor {
        type Value = Option<SecretString>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(SecretString::new(v)))
        }
        fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
            Ok(Some(SecretString::new(v)))
        }
        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Err(refuse())
        }
        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Err(refuse())
        }
        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Err(refuse())
        }
        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Err(refuse())
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(refuse())
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
            Err(refuse())
        }
    }
    d.deserialize_any(SecretVisitor)
}

macro_rules! merge_fields {
    ($hi:expr, $lo:expr, $($f:ident),*) => {
        Layer { $($f: $hi.$f.or($lo.$f),)*
            consumer_subscriptions: union($hi.consumer_subscriptions, $lo.consumer_subscriptions),
            managed_identity: $hi.managed_identity || $lo.managed_identity,
            client_certificate: $hi.client_certificate || $lo.client_certificate,
        }
    };
}

/// Both lists, `hi`'s first (duplicates are removed when the settings are validated).
fn union(hi: Option<Vec<String>>, lo: Option<Vec<String>>) -> Option<Vec<String>> {
    match (hi, lo) {
        (None, None) => None,
        (a, b) => Some(a.into_iter().chain(b).flatten().collect()),
    }
}

impl Layer {
    /// `self` wins over `lower` field by field (`consumer_subscriptions`: both count).
    pub fn over(self, lower: Layer) -> Layer {
        merge_fields!(
            self,
            lower,
            subscription,
            resource_group,
            gallery,
            location,
            arm_endpoint,
            blob_endpoint,
            storage_account,
            storage_account_resource_group,
            auth,
            cloud,
            tenant_id,
            client_id,
            client_secret_file,
            client_secret,
            federated_token_file,
            managed_identity_client_id,
            managed_identity_resource_id,
            authority_host,
            token_audience,
            storage_suffix,
            imds_endpoint,
            replicas,
            create_env,
            adopt_unverified,
            create_env_suffix,
            end_of_life,
            block_deletion_before_end_of_life,
            protect_held_versions,
            cpi_config,
            cloud_endpoints,
            ca_cert,
            ca_cert_pem,
            ssl_cert_file,
            tuning
        )
    }

    /// The environment's layer, read through `env` (the process environment in production).
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Layer {
        let get = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let imds = get("STEMCELL_GALLERY_IMDS_ENDPOINT").or_else(|| {
            get("AZURE_POD_IDENTITY_AUTHORITY_HOST").map(|host| {
                format!(
                    "{}/metadata/identity/oauth2/token",
                    host.trim_end_matches('/')
                )
            })
        });
        Layer {
            subscription: get("AZURE_SUBSCRIPTION_ID"),
            resource_group: get("STEMCELL_GALLERY_RESOURCE_GROUP"),
            gallery: get("STEMCELL_GALLERY_GALLERY"),
            location: get("STEMCELL_GALLERY_LOCATION"),
            arm_endpoint: get("STEMCELL_GALLERY_ARM_ENDPOINT"),
            blob_endpoint: get("STEMCELL_GALLERY_BLOB_ENDPOINT"),
            storage_account: get("STEMCELL_GALLERY_STORAGE_ACCOUNT"),
            auth: get("STEMCELL_GALLERY_AUTH"),
            cloud: get("STEMCELL_GALLERY_CLOUD"),
            tenant_id: get("AZURE_TENANT_ID"),
            client_id: get("AZURE_CLIENT_ID"),
            client_secret: get("AZURE_CLIENT_SECRET").map(SecretString::new),
            federated_token_file: get("AZURE_FEDERATED_TOKEN_FILE").map(PathBuf::from),
            authority_host: get("AZURE_AUTHORITY_HOST"),
            imds_endpoint: imds,
            ca_cert: get("STEMCELL_GALLERY_CA_CERT").map(PathBuf::from),
            ssl_cert_file: get("SSL_CERT_FILE").map(PathBuf::from),
            // Comma-separated subscription ids.
            consumer_subscriptions: get("STEMCELL_GALLERY_CONSUMER_SUBSCRIPTIONS")
                .map(|v| v.split(',').map(|s| s.trim().to_string()).collect()),
            ..Layer::default()
        }
    }
}

/// The bare key of the `key = value` line holding byte `at`, if that line is one.
fn key_of_line(text: &str, at: usize) -> Option<&str> {
    let start = text.get(..at)?.rfind('\n').map_or(0, |i| i + 1);
    let line = text.get(start..)?.lines().next()?;
    let key = line.split_once('=')?.0.trim();
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    bare.then_some(key)
}

/// Read `--config FILE`: the Azure CPI's cpi.json when the content is JSON with
/// `cloud.properties.azure`, our TOML otherwise. A TOML's `cpi_config` is read underneath it.
pub fn load(path: &Path) -> Result<Layer, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
        path: path.to_path_buf(),
        reason: format!("cannot read it: {e}"),
    })?;
    if text.trim_start().starts_with('{') {
        return parse_cpi_json(path, &text);
    }
    let layer: Layer = toml::from_str(&text).map_err(|e| {
        // toml's message names the unknown key and the expected ones. Its Display would also
        // quote the offending line, which may hold a secret, so only the line number is kept.
        // A type error alone does not say which setting is wrong; its span starts at the value,
        // on the key's line, so the key is named. Only for type errors: a syntax error may sit
        // inside a multi-line string, whose lines are not keys (and may hold a secret).
        let at = e.span().map(|span| span.start.min(text.len()));
        let line = at.map(|at| text[..at].matches('\n').count() + 1);
        let type_error = ["invalid type", "invalid value", "invalid length"]
            .iter()
            .any(|p| e.message().starts_with(p));
        let key = at
            .filter(|_| type_error)
            .and_then(|at| key_of_line(&text, at));
        ConfigError::File {
            path: path.to_path_buf(),
            reason: match (line, key) {
                (Some(line), Some(key)) => {
                    format!("line {line}, key `{key}`: {}", e.message().trim())
                }
                (Some(line), None) => format!("line {line}: {}", e.message().trim()),
                _ => e.message().trim().to_string(),
            },
        }
    })?;
    let base = path.parent().unwrap_or(Path::new("."));
    let relative = |p: Option<PathBuf>| p.map(|p| if p.is_relative() { base.join(p) } else { p });
    let mut layer = Layer {
        client_secret_file: relative(layer.client_secret_file.clone()),
        federated_token_file: relative(layer.federated_token_file.clone()),
        cpi_config: relative(layer.cpi_config.clone()),
        ca_cert: relative(layer.ca_cert.clone()),
        ..layer
    };
    if let Some(cpi) = layer.cpi_config.take() {
        let cpi_text = std::fs::read_to_string(&cpi).map_err(|e| ConfigError::File {
            path: cpi.clone(),
            reason: format!(
                "cannot read it (named by cpi_config in {}): {e}",
                path.display()
            ),
        })?;
        let lower = parse_cpi_json(&cpi, &cpi_text)?;
        layer = layer.over(lower);
    }
    Ok(layer)
}

/// Map the Azure CPI's `cloud.properties.azure` section onto a layer. Keys we do not use are
/// ignored (the CPI's file carries many).
pub fn parse_cpi_json(path: &Path, text: &str) -> Result<Layer, ConfigError> {
    let bad = |reason: String| ConfigError::File {
        path: path.to_path_buf(),
        reason,
    };
    let doc: serde_json::Value =
        serde_json::from_str(text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let azure = doc
        .pointer("/cloud/properties/azure")
        .and_then(|v| v.as_object())
        .ok_or_else(|| {
            bad("a JSON config must be the Azure CPI's cpi.json, with a cloud.properties.azure section"
                .into())
        })?;
    parse_azure_section(path, azure, Some(path.parent().unwrap_or(Path::new("."))))
}

/// The keys of a CPI request's `context` that are BOSH's own, not CPI-config properties.
const BOSH_CONTEXT_KEYS: &[&str] = &["director_uuid", "request_id", "vm"];

/// The cpi.json keys a request context may override that this tool reads (the rest of the
/// Azure CPI's properties are ignored here, as in cpi.json).
const CONTEXT_KEYS: &[&str] = &[
    "subscription_id",
    "resource_group_name",
    "compute_gallery_name",
    "location",
    "storage_account_name",
    "environment",
    "tenant_id",
    "client_id",
    "client_secret",
    "certificate",
    "credentials_source",
    "managed_service_identity",
    "managed_identity_resource_id",
    "azure_stack",
    "compute_gallery_replicas",
    "stemcell_gallery_create_env",
    "stemcell_gallery_adopt_unverified",
    "stemcell_gallery_create_env_suffix",
    "stemcell_gallery_consumer_subscriptions",
    "stemcell_gallery_end_of_life",
    "stemcell_gallery_block_deletion_before_end_of_life",
    "stemcell_gallery_protect_held_versions",
];

/// What a director's request context says, as a settings layer.
///
/// A director with a CPI config (`bosh update-cpi-config`, several CPIs of one type) runs the
/// same job for every CPI and sends each CPI's `properties` in every request's `context`, at its
/// top level beside `director_uuid` and `request_id`. The Azure CPI merges that context over its
/// cpi.json's `azure` section key by key (`src/bosh_azure_cpi/bin/azure_cpi` in
/// cloudfoundry/bosh-azure-cpi-release: `cloud_properties['azure'].merge!(context)`), so the same
/// key names apply, and the front reads them the same way: the gallery, subscription, resource
/// group, storage account and credentials of that CPI.
#[derive(Debug, Clone, Default)]
pub struct ContextLayer {
    pub layer: Layer,
    /// The context's keys this tool read (for the log; never values).
    pub keys: Vec<String>,
}

impl ContextLayer {
    /// The context over `lower` (the configuration file's layers), key by key as the Azure CPI
    /// merges it, keeping what belongs together: a storage account from the context replaces
    /// the file's blob endpoint and account resource group; static credentials from the context
    /// replace a managed identity, and a client secret replaces the file's secret file.
    pub fn over(&self, mut lower: Layer) -> Layer {
        let has = |k: &str| self.keys.iter().any(|x| x == k);
        if has("storage_account_name") {
            lower.blob_endpoint = None;
            lower.storage_account_resource_group = None;
        }
        if has("client_secret") || has("certificate") {
            lower.client_secret_file = None;
        }
        if has("credentials_source") && !self.layer.managed_identity {
            lower.managed_identity = false;
        }
        self.layer.clone().over(lower)
    }
}

/// Read the CPI-config properties of a request context (`None`: it carries none this tool reads;
/// BOSH's own keys do not count). Values are checked as cpi.json's are.
pub fn context_layer(
    context: &serde_json::Map<String, serde_json::Value>,
) -> Result<Option<ContextLayer>, ConfigError> {
    let azure: serde_json::Map<String, serde_json::Value> = context
        .iter()
        .filter(|(k, _)| !BOSH_CONTEXT_KEYS.contains(&k.as_str()))
        .filter(|(k, v)| CONTEXT_KEYS.contains(&k.as_str()) && !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if azure.is_empty() {
        return Ok(None);
    }
    let label = Path::new("the CPI-config properties in the request context");
    let layer = parse_azure_section(label, &azure, None)?;
    Ok(Some(ContextLayer {
        layer,
        keys: azure.keys().cloned().collect(),
    }))
}

/// Map an Azure CPI `azure` section (cpi.json's, or a request context's) onto a layer. `path`
/// names it in errors; `sibling_dir`: where the CPI job renders `azure_stack_ca_cert.pem`.
fn parse_azure_section(
    path: &Path,
    azure: &serde_json::Map<String, serde_json::Value>,
    sibling_dir: Option<&Path>,
) -> Result<Layer, ConfigError> {
    let section = Section { path, azure };
    let string = |key: &str| section.string(key);
    let boolean = |key: &str| section.boolean(key);
    let replicas = section.replicas()?;
    let managed_identity = section.managed_identity()?;
    let environment = string("environment")?;
    let cloud_endpoints = section.cloud_endpoints(environment.as_deref())?;
    let client_certificate = string("certificate")?.is_some();
    let ca_cert_pem = section.ca_cert_pem(sibling_dir)?;
    let consumer_subscriptions = section.consumer_subscriptions()?;
    Ok(Layer {
        subscription: string("subscription_id")?,
        resource_group: string("resource_group_name")?,
        gallery: string("compute_gallery_name")?,
        location: string("location")?,
        storage_account: string("storage_account_name")?,
        cloud: environment,
        tenant_id: string("tenant_id")?,
        client_id: string("client_id")?,
        client_secret: string("client_secret")?.map(SecretString::new),
        managed_identity_resource_id: string("managed_identity_resource_id")?,
        replicas,
        create_env: boolean("stemcell_gallery_create_env")?,
        // Our key (the Azure CPI ignores it): see gallery::adopt.
        adopt_unverified: boolean("stemcell_gallery_adopt_unverified")?,
        create_env_suffix: string("stemcell_gallery_create_env_suffix")?,
        // Our keys (the Azure CPI sends neither field): see crate::safeguards.
        end_of_life: string("stemcell_gallery_end_of_life")?,
        protect_held_versions: boolean("stemcell_gallery_protect_held_versions")?,
        block_deletion_before_end_of_life: boolean(
            "stemcell_gallery_block_deletion_before_end_of_life",
        )?,
        consumer_subscriptions,
        cloud_endpoints,
        managed_identity,
        client_certificate,
        ca_cert_pem,
        ..Layer::default()
    })
}

/// An Azure CPI `azure` section being read; `path` names it in errors.
struct Section<'a> {
    path: &'a Path,
    azure: &'a serde_json::Map<String, serde_json::Value>,
}

impl Section<'_> {
    /// The section's error, naming its file.
    fn bad(&self, reason: String) -> ConfigError {
        ConfigError::File {
            path: self.path.to_path_buf(),
            reason,
        }
    }

    /// A string key (absent, null and blank are all unset).
    fn string(&self, key: &str) -> Result<Option<String>, ConfigError> {
        match self.azure.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.bad(format!("azure.{key} must be a string"))),
        }
    }

    /// A boolean key (absent and null are unset).
    fn boolean(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.azure.get(key) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.bad(format!("azure.{key} must be true or false"))),
        }
    }

    /// `compute_gallery_replicas`: a positive whole number.
    fn replicas(&self) -> Result<Option<u32>, ConfigError> {
        Ok(match self.azure.get("compute_gallery_replicas") {
            None | Some(serde_json::Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| {
                        self.bad(
                            "azure.compute_gallery_replicas must be a positive whole number".into(),
                        )
                    })?,
            ),
        })
    }

    /// Whether the CPI authenticates as a managed identity: `credentials_source`, or the legacy
    /// `managed_service_identity.enabled`.
    fn managed_identity(&self) -> Result<bool, ConfigError> {
        let credentials_source = self.string("credentials_source")?;
        Ok(match credentials_source.as_deref() {
            None | Some("static") => false,
            Some("managed_identity") => true,
            Some(other) => {
                return Err(self.bad(format!(
                    "azure.credentials_source {other:?} is not one of: static, managed_identity"
                )))
            }
        } || self
            .azure
            .get("managed_service_identity")
            .and_then(|m| m.get("enabled"))
            .and_then(|e| e.as_bool())
            .unwrap_or(false))
    }

    /// The endpoints of an Azure Stack `environment` (from `azure_stack`); `None` for the others.
    fn cloud_endpoints(
        &self,
        environment: Option<&str>,
    ) -> Result<Option<CloudEndpoints>, ConfigError> {
        Ok(match environment {
            Some(env) if env.eq_ignore_ascii_case("AzureStack") => {
                let stack = self.azure.get("azure_stack").and_then(|s| s.as_object());
                let field = |k: &str| {
                    stack
                        .and_then(|s| s.get(k))
                        .and_then(|v| v.as_str())
                        .filter(|s| !s.is_empty())
                };
                let domain = field("domain").ok_or_else(|| {
                    self.bad("environment AzureStack needs azure.azure_stack.domain".into())
                })?;
                Some(azure_stack_endpoints(
                    domain,
                    field("endpoint_prefix"),
                    field("authentication"),
                    field("resource"),
                ))
            }
            _ => None,
        })
    }

    /// Extra CAs for Azure Stack, as (where they came from, PEM text).
    fn ca_cert_pem(
        &self,
        sibling_dir: Option<&Path>,
    ) -> Result<Option<(String, String)>, ConfigError> {
        // The Azure CPI release's manifest property `azure.azure_stack.ca_cert` is PEM text; its
        // job renders it to config/azure_stack_ca_cert.pem beside cpi.json (jobs/azure_cpi/
        // templates/azure_stack_ca_cert.pem.erb, cloudfoundry/bosh-azure-cpi-release), and its
        // cpi.json.erb does not copy it into cpi.json. Both shapes are read: PEM text under
        // azure.azure_stack.ca_cert in the JSON, else that sibling file when it is not empty.
        Ok(
            match self.azure.get("azure_stack").and_then(|s| s.get("ca_cert")) {
                Some(serde_json::Value::String(pem)) if !pem.trim().is_empty() => Some((
                    format!("{} azure.azure_stack.ca_cert", self.path.display()),
                    pem.clone(),
                )),
                Some(serde_json::Value::String(_)) | Some(serde_json::Value::Null) | None => {
                    match sibling_dir.map(|d| d.join("azure_stack_ca_cert.pem")) {
                        Some(sibling) => match std::fs::read_to_string(&sibling) {
                            Ok(pem) if !pem.trim().is_empty() => {
                                Some((sibling.display().to_string(), pem))
                            }
                            _ => None,
                        },
                        None => None,
                    }
                }
                Some(_) => {
                    return Err(self.bad(
                        "azure.azure_stack.ca_cert must be PEM text (the CA certificates)".into(),
                    ))
                }
            },
        )
    }

    /// Consumer subscriptions for the CPI's delete_stemcell (our key; the Azure CPI ignores it).
    fn consumer_subscriptions(&self) -> Result<Option<Vec<String>>, ConfigError> {
        Ok(match self.azure.get("stemcell_gallery_consumer_subscriptions") {
            None | Some(serde_json::Value::Null) => None,
            Some(serde_json::Value::Array(items)) => Some(
                items
                    .iter()
                    .map(|i| i.as_str().map(str::to_string))
                    .collect::<Option<Vec<String>>>()
                    .ok_or_else(|| {
                        self.bad("azure.stemcell_gallery_consumer_subscriptions must be a list of subscription ids".into())
                    })?,
            ),
            Some(_) => {
                return Err(self.bad(
                    "azure.stemcell_gallery_consumer_subscriptions must be a list of subscription ids"
                        .into(),
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by tests/integration/bad_input.rs: a wrong type said only "line 4: invalid type: string "yes",
    /// expected a boolean", not which setting.
    #[test]
    fn a_wrong_type_names_the_key_but_not_other_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "gallery = \"g\"\ncreate_env = \"yes\"\n").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(
            err.contains("line 2, key `create_env`") && err.contains("expected a boolean"),
            "{err}"
        );
        std::fs::write(&path, "client_secret = \"hunter2\"\nreplicas = [\n").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{err}");
        // A syntax error inside a multi-line string: its `word=` line is not a key.
        std::fs::write(&path, "client_secret = \"\"\"\nhunter2=\\q\n\"\"\"\n").unwrap();
        let err = load(&path).unwrap_err().to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn key_of_line_takes_bare_keys_only() {
        let text = "a = 1\n  replicas = \"x\"\n\"quoted key\" = 2\nnot a key line\n";
        assert_eq!(key_of_line(text, 0), Some("a"));
        assert_eq!(
            key_of_line(text, text.find("\"x\"").unwrap()),
            Some("replicas")
        );
        assert_eq!(key_of_line(text, text.find("2").unwrap()), None);
        assert_eq!(key_of_line(text, text.find("not").unwrap()), None);
        assert_eq!(key_of_line(text, text.len()), None);
        assert_eq!(key_of_line("", 0), None);
    }
}
