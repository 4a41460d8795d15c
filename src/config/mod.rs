//! Settings: resolved from flags > environment > a config file, validated before any I/O.
//!
//! Sources, highest first: the global flags (with clap's environment fallbacks), the other
//! environment variables (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET`,
//! `AZURE_FEDERATED_TOKEN_FILE`, `AZURE_AUTHORITY_HOST`, `STEMCELL_GALLERY_*`), `--config FILE`
//! (our TOML, whose keys mirror the flags, or the Azure CPI's cpi.json), and a cpi.json named by
//! the TOML's `cpi_config`. Secrets are held in [`SecretString`] and never printed.

use crate::cli::GlobalArgs;

pub use crate::devstore::{DEV_ACCOUNT, DEV_ACCOUNT_KEY, EMULATOR_TOKEN};

mod file;
pub mod resource;
mod secret;

pub use file::Layer;
pub use secret::SecretString;

use std::path::PathBuf;

use crate::azure::cloud::{scope_for, CloudEndpoints, CloudName};

/// How to get tokens for Azure Resource Manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthKind {
    /// azure_identity's default chain (environment, managed identity, Azure CLI).
    Default,
    /// A service principal's client secret (tenant id, client id, secret).
    Secret,
    /// Workload identity: a federated token file exchanged for a token (Kubernetes).
    WorkloadIdentity,
    /// Managed identity over IMDS: system-assigned, or user-assigned by client id or resource id.
    ManagedIdentity,
    /// The Azure CLI's logged-in account (`az account get-access-token`).
    AzureCli,
    /// The emulator's fixed development token and storage key; loopback endpoints only.
    Emulator,
}

impl AuthKind {
    pub const NAMES: &'static str =
        "default, secret, workload-identity, managed-identity, azure-cli, emulator";

    pub fn parse(value: &str) -> Option<AuthKind> {
        Some(match value.trim().to_ascii_lowercase().as_str() {
            "default" => AuthKind::Default,
            "secret" | "client-secret" | "service-principal" => AuthKind::Secret,
            "workload-identity" | "workload" => AuthKind::WorkloadIdentity,
            "managed-identity" | "msi" => AuthKind::ManagedIdentity,
            "azure-cli" | "cli" => AuthKind::AzureCli,
            "emulator" => AuthKind::Emulator,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AuthKind::Default => "default",
            AuthKind::Secret => "secret",
            AuthKind::WorkloadIdentity => "workload-identity",
            AuthKind::ManagedIdentity => "managed-identity",
            AuthKind::AzureCli => "azure-cli",
            AuthKind::Emulator => "emulator",
        }
    }
}

/// Which managed identity to ask IMDS for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManagedIdentity {
    SystemAssigned,
    ClientId(String),
    ResourceId(String),
}

/// The IMDS token endpoint on every Azure VM (plain http to a link-local address, by design).
pub const DEFAULT_IMDS_ENDPOINT: &str = "http://169.254.169.254/metadata/identity/oauth2/token";

/// Everything a command needs to reach Azure (or the emulator), already validated.
/// `Debug` is safe to log: the client secret prints as `***`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Extra CA certificates trusted for every HTTPS request (ARM, blob, tokens), validated.
    pub ca_bundles: Vec<crate::azure::tls::CaBundle>,
    pub subscription: String,
    pub resource_group: String,
    pub gallery: String,
    /// The configured region; `None` means the gallery's own location (read from the gallery).
    pub location: Option<String>,
    pub arm_endpoint: url::Url,
    pub blob_endpoint: Option<url::Url>,
    pub auth: AuthKind,
    /// The cloud the endpoints came from.
    pub cloud: CloudName,
    /// Entra ID authority host (`https://login.microsoftonline.com` in the public cloud).
    pub authority_host: url::Url,
    /// The scope of ARM tokens (`https://management.azure.com/.default` in the public cloud).
    pub token_scope: String,
    /// Storage DNS suffix (`core.windows.net` in the public cloud); `None` for a custom cloud
    /// that did not configure one.
    pub storage_suffix: Option<String>,
    /// Storage account name (for the account's resource id, and the blob endpoint if not given).
    pub storage_account: Option<String>,
    /// Resource group of the storage account when it differs from `resource_group`.
    pub storage_account_resource_group: Option<String>,
    pub tenant_id: Option<String>,
    pub client_id: Option<String>,
    pub client_secret: Option<SecretString>,
    pub federated_token_file: Option<PathBuf>,
    /// Which identity `--auth managed-identity` asks for.
    pub managed_identity: ManagedIdentity,
    /// The IMDS token endpoint (overridable for tests: `STEMCELL_GALLERY_IMDS_ENDPOINT`, or
    /// `AZURE_POD_IDENTITY_AUTHORITY_HOST` as a base URL).
    pub imds_endpoint: url::Url,
    /// Replica count per target region (cpi.json `compute_gallery_replicas`).
    pub replicas: Option<u32>,
    /// Treat uploads as create-env uploads (cpi.json `stemcell_gallery_create_env`).
    pub create_env: Option<bool>,
    /// Adopt a version without `image_sha256` whose source blob is gone or unreadable, without
    /// proof (`adopt_unverified` / cpi.json `stemcell_gallery_adopt_unverified`; see
    /// `gallery::adopt`).
    pub adopt_unverified: bool,
    /// Suffix of create-env definitions (default `-create-env`).
    pub create_env_suffix: Option<String>,
    /// Subscriptions besides the gallery's whose VMs, scale sets and disks every delete path
    /// reads as consumers (`--consumer-subscription`, `consumer_subscriptions`,
    /// `STEMCELL_GALLERY_CONSUMER_SUBSCRIPTIONS`; all of them count). Validated GUIDs, lower
    /// case, each once, never the gallery's own (which is always read).
    pub consumer_subscriptions: Vec<String>,
    /// The configuration file the settings were read from, if any.
    pub config_file: Option<PathBuf>,
    /// Retries of one ARM request (`STEMCELL_GALLERY_ARM_RETRIES`); `None`: the default.
    pub arm_retries: Option<u32>,
    /// Retries of one blob request (`STEMCELL_GALLERY_BLOB_RETRIES`); `None`: the default.
    pub blob_retries: Option<u32>,
}

/// Environment variable: retries of one ARM request on throttling and transient failures.
pub const ARM_RETRIES_ENV: &str = "STEMCELL_GALLERY_ARM_RETRIES";
/// Environment variable: retries of one blob request on throttling and transient failures.
pub const BLOB_RETRIES_ENV: &str = "STEMCELL_GALLERY_BLOB_RETRIES";
/// The most retries a budget may ask for (each can wait up to the backoff cap).
pub const MAX_RETRIES: u32 = 20;

/// A retry budget from the environment: a whole number from 0 to [`MAX_RETRIES`]; `None` when
/// unset. Anything else is refused, never ignored (an operator who set it meant something).
pub fn env_retries(
    env: &dyn Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<u32>, ConfigError> {
    let Some(v) = env(name) else {
        return Ok(None);
    };
    match v.trim().parse::<u32>() {
        Ok(n) if n <= MAX_RETRIES => Ok(Some(n)),
        _ => Err(ConfigError::Invalid(format!(
            "{name}={v:?} is not a retry count: use a whole number from 0 to {MAX_RETRIES}, or unset it for the default"
        ))),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{what} is not set; pass {flag} or set it in the config file")]
    Missing {
        what: &'static str,
        flag: &'static str,
    },
    #[error("{what} {value:?} is not a valid URL: {reason}")]
    BadUrl {
        what: &'static str,
        value: String,
        reason: String,
    },
    #[error("{what} {value} uses plain http to a host that is not loopback; use https")]
    InsecureUrl { what: &'static str, value: String },
    #[error("--auth emulator is only allowed for loopback endpoints, but {what} is {value}")]
    EmulatorAuthRemote { what: &'static str, value: String },
    #[error("unknown --auth kind {0:?}; use one of: default, secret, workload-identity, managed-identity, azure-cli, emulator")]
    UnknownAuth(String),
    #[error("unknown cloud {0:?}; use one of: AzureCloud, AzureChinaCloud, AzureUSGovernment, AzureStack (custom endpoints)")]
    UnknownCloud(String),
    #[error("config file {}: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    #[error("{0}")]
    Invalid(String),
}

impl crate::error::HasExit for ConfigError {
    fn exit(&self) -> crate::error::Exit {
        crate::error::Exit::Usage
    }
}

pub const DEFAULT_ARM_ENDPOINT: &str = "https://management.azure.com";

/// The extra CAs the layer names, each parsed now: a bad bundle is a config error before any
/// request. `ca_cert` (flag, environment or file), the cpi.json's Azure Stack CA, and
/// `SSL_CERT_FILE` all count.
fn ca_bundles(l: &Layer) -> Result<Vec<crate::azure::tls::CaBundle>, ConfigError> {
    use crate::azure::tls::CaBundle;
    let mut out = Vec::new();
    let mut read = |what: &str, path: &PathBuf| -> Result<(), ConfigError> {
        let pem = std::fs::read(path).map_err(|e| {
            ConfigError::Invalid(format!(
                "{what} {}: cannot read it: {e}; give a readable PEM bundle of CA certificates",
                path.display()
            ))
        })?;
        out.push(
            CaBundle::parse(format!("{what} {}", path.display()), &pem).map_err(|e| {
                ConfigError::Invalid(format!("{e}; give a PEM bundle of CA certificates"))
            })?,
        );
        Ok(())
    };
    if let Some(path) = &l.ca_cert {
        read("ca_cert", path)?;
    }
    if let Some(path) = &l.ssl_cert_file {
        read("SSL_CERT_FILE", path)?;
    }
    if let Some((source, pem)) = &l.ca_cert_pem {
        out.push(
            CaBundle::parse(source.clone(), pem.as_bytes()).map_err(|e| {
                ConfigError::Invalid(format!("{e}; give the CA certificates as PEM text"))
            })?,
        );
    }
    Ok(out)
}

impl Settings {
    /// Resolve settings from the global flags, the process environment and `--config FILE`
    /// (flags > environment > TOML > cpi.json).
    pub fn resolve(global: &GlobalArgs) -> Result<Settings, ConfigError> {
        Self::resolve_with_env(global, &|k| std::env::var(k).ok())
    }

    /// [`Settings::resolve`] with the environment read through `env` (tests pass a map).
    /// The fields of `GlobalArgs` already hold clap's environment fallbacks.
    pub fn resolve_with_env(
        global: &GlobalArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        let flags = Layer {
            subscription: global.subscription.clone(),
            resource_group: global.resource_group.clone(),
            gallery: global.gallery.clone(),
            location: global.location.clone(),
            arm_endpoint: global.arm_endpoint.clone(),
            blob_endpoint: global.blob_endpoint.clone(),
            ca_cert: global.ca_cert.clone(),
            auth: global.auth.clone(),
            cloud: global.cloud.clone(),
            consumer_subscriptions: (!global.consumer_subscriptions.is_empty())
                .then(|| global.consumer_subscriptions.clone()),
            ..Layer::default()
        };
        let config_path = global
            .config
            .clone()
            .or_else(|| env("STEMCELL_GALLERY_CONFIG").map(PathBuf::from));
        let from_file = match &config_path {
            Some(path) => file::load(path)?,
            None => Layer::default(),
        };
        let merged = flags.over(Layer::from_env(env)).over(from_file);
        let mut settings = Self::from_layer(merged, config_path)?;
        settings.arm_retries = env_retries(env, ARM_RETRIES_ENV)?;
        settings.blob_retries = env_retries(env, BLOB_RETRIES_ENV)?;
        Ok(settings)
    }

    /// Validate a merged layer into settings. No network I/O (secret files are read).
    pub fn from_layer(l: Layer, config_file: Option<PathBuf>) -> Result<Settings, ConfigError> {
        let missing = |v: &Option<String>, what, flag| required(v, what, flag);
        let subscription = missing(&l.subscription, "the subscription id", "--subscription")?;
        let resource_group = missing(&l.resource_group, "the resource group", "--resource-group")?;
        let gallery = missing(&l.gallery, "the gallery name", "--gallery")?;
        let ca_bundles = ca_bundles(&l)?;
        // They become segments of every ARM path (and of lock blob names): refuse anything Azure
        // would not accept before a request is made, so no value can reach another resource.
        check_subscription(&subscription)?;
        let consumer_subscriptions =
            consumer_subscriptions(&subscription, l.consumer_subscriptions.as_deref())?;
        check_resource_group(&resource_group)?;
        check_gallery_name(&gallery)?;
        // No default region: without one, new definitions and versions go to the gallery's own.
        let location = l
            .location
            .clone()
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty());
        if let Some(location) = &location {
            check_location(location)?;
        }

        let mut client_secret = l.client_secret.clone().filter(|s| !s.is_empty());
        if let Some(path) = &l.client_secret_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                ConfigError::Invalid(format!(
                    "cannot read the client secret file {}: {e}",
                    path.display()
                ))
            })?;
            let text = text.trim_end_matches(['\r', '\n']);
            if text.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "the client secret file {} is empty",
                    path.display()
                )));
            }
            client_secret = Some(SecretString::new(text));
        }

        let explicit_auth = match l.auth.as_deref() {
            None => None,
            Some(v) => Some(AuthKind::parse(v).ok_or_else(|| ConfigError::UnknownAuth(v.into()))?),
        };
        let managed_identity =
            match (
                l.managed_identity_client_id.as_deref(),
                l.managed_identity_resource_id.as_deref(),
            ) {
                (Some(_), Some(_)) => return Err(ConfigError::Invalid(
                    "set only one of managed_identity_client_id and managed_identity_resource_id"
                        .into(),
                )),
                (Some(id), None) => ManagedIdentity::ClientId(id.to_string()),
                (None, Some(id)) => ManagedIdentity::ResourceId(id.to_string()),
                (None, None) => ManagedIdentity::SystemAssigned,
            };
        // Without an explicit choice, the configured credential material decides.
        let auth = explicit_auth.unwrap_or(
            if l.managed_identity || managed_identity != ManagedIdentity::SystemAssigned {
                AuthKind::ManagedIdentity
            } else if client_secret.is_some() || l.client_certificate {
                AuthKind::Secret
            } else if l.federated_token_file.is_some() {
                AuthKind::WorkloadIdentity
            } else {
                AuthKind::Default
            },
        );

        // Cloud endpoints: the named cloud's, then the config's custom section, then explicit keys.
        let cloud = match l.cloud.as_deref() {
            None => CloudName::AzureCloud,
            Some(v) => CloudName::parse(v).ok_or_else(|| ConfigError::UnknownCloud(v.into()))?,
        };
        let builtin: Option<CloudEndpoints> = cloud.endpoints().or(l.cloud_endpoints.clone());
        let arm_value = l
            .arm_endpoint
            .clone()
            .or_else(|| builtin.as_ref().map(|e| e.arm_endpoint.clone()))
            .ok_or(ConfigError::Missing {
                what: "the ARM endpoint of the custom cloud",
                flag: "--arm-endpoint",
            })?;
        let arm_endpoint = parse_endpoint("the ARM endpoint", &arm_value, &auth)?;
        let authority_value = l
            .authority_host
            .clone()
            .or_else(|| builtin.as_ref().map(|e| e.authority_host.clone()));
        let authority_host = match authority_value {
            Some(v) => check_url("the authority host", &v)?,
            None if auth == AuthKind::Emulator => {
                check_url("the authority host", "https://login.microsoftonline.com")?
            }
            None => {
                return Err(ConfigError::Missing {
                    what: "the authority host of the custom cloud",
                    flag: "authority_host",
                })
            }
        };
        let audience = l
            .token_audience
            .clone()
            .or_else(|| builtin.as_ref().map(|e| e.token_audience.clone()))
            .unwrap_or_else(|| arm_endpoint.as_str().to_string());
        let token_scope = scope_for(&audience);
        let storage_suffix = l
            .storage_suffix
            .clone()
            .or_else(|| builtin.as_ref().map(|e| e.storage_suffix.clone()));

        let blob_value = match (&l.blob_endpoint, &l.storage_account) {
            (Some(v), _) => Some(v.clone()),
            (None, Some(account)) if auth != AuthKind::Emulator => {
                check_account_name(account)?;
                let suffix = storage_suffix.as_deref().ok_or(ConfigError::Missing {
                    what: "the storage suffix of the custom cloud (to build the blob endpoint)",
                    flag: "storage_suffix (or --blob-endpoint)",
                })?;
                Some(format!("https://{account}.blob.{suffix}"))
            }
            _ => None,
        };
        let blob_endpoint = blob_value
            .as_deref()
            .map(|v| parse_endpoint("the blob endpoint", v, &auth))
            .transpose()?;

        let imds_endpoint =
            check_imds(l.imds_endpoint.as_deref().unwrap_or(DEFAULT_IMDS_ENDPOINT))?;

        match auth {
            AuthKind::Secret => {
                need(
                    &l.tenant_id,
                    "the tenant id (AZURE_TENANT_ID, tenant_id)",
                    auth,
                )?;
                need(
                    &l.client_id,
                    "the client id (AZURE_CLIENT_ID, client_id)",
                    auth,
                )?;
                if client_secret.is_none() {
                    return Err(ConfigError::Invalid(if l.client_certificate {
                        "the Azure CPI config authenticates with a client certificate, which \
                         this tool does not support; use a client secret, workload identity or \
                         managed identity"
                            .into()
                    } else {
                        "--auth secret needs the client secret (client_secret_file, or \
                         AZURE_CLIENT_SECRET)"
                            .into()
                    }));
                }
            }
            AuthKind::WorkloadIdentity => {
                need(
                    &l.tenant_id,
                    "the tenant id (AZURE_TENANT_ID, tenant_id)",
                    auth,
                )?;
                need(
                    &l.client_id,
                    "the client id (AZURE_CLIENT_ID, client_id)",
                    auth,
                )?;
                if l.federated_token_file.is_none() {
                    return Err(ConfigError::Invalid(
                        "--auth workload-identity needs the federated token file \
                         (AZURE_FEDERATED_TOKEN_FILE, federated_token_file)"
                            .into(),
                    ));
                }
            }
            AuthKind::Default
            | AuthKind::ManagedIdentity
            | AuthKind::AzureCli
            | AuthKind::Emulator => {}
        }

        Ok(Settings {
            subscription,
            resource_group,
            gallery,
            location,
            arm_endpoint,
            blob_endpoint,
            auth,
            cloud,
            authority_host,
            token_scope,
            storage_suffix,
            storage_account: l.storage_account.clone(),
            storage_account_resource_group: l.storage_account_resource_group.clone(),
            tenant_id: l.tenant_id.clone(),
            client_id: l.client_id.clone(),
            client_secret,
            federated_token_file: l.federated_token_file.clone(),
            managed_identity,
            imds_endpoint,
            replicas: l.replicas,
            create_env: l.create_env,
            adopt_unverified: l.adopt_unverified.unwrap_or(false),
            create_env_suffix: check_create_env_suffix(l.create_env_suffix.clone())?,
            consumer_subscriptions,
            config_file,
            arm_retries: None,
            blob_retries: None,
            ca_bundles,
        })
    }

    /// The suffix of create-env image definitions: the configured `create_env_suffix` (TOML) /
    /// `stemcell_gallery_create_env_suffix` (cpi.json), else `-create-env`. Every command that
    /// names a create-env definition (ensure, seed, lookup, delete, inspect, cpi) goes through this.
    pub fn create_env_definition_suffix(&self) -> &str {
        create_env_suffix_or_default(self.create_env_suffix.as_deref())
    }

    /// The storage account's resource id, when the account and its resource group are both
    /// configured:
    /// `/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Storage/storageAccounts/{a}`.
    /// Without `storage_account_resource_group` it is `None`: the account's resource group is
    /// not assumed to be the gallery's (it often is not, and Azure refuses a version whose
    /// `storageAccountId` names another account); `Connected::storage_account_id` looks it up.
    pub fn storage_account_id(&self) -> Option<String> {
        let account = self.storage_account.as_deref()?;
        let rg = self.storage_account_resource_group.as_deref()?;
        Some(format!(
            "/subscriptions/{}/resourceGroups/{rg}/providers/Microsoft.Storage/storageAccounts/{account}",
            self.subscription
        ))
    }
}

/// A configured create-env suffix must keep create-env definitions apart from the director's:
/// director definitions are `<name>` and `<name>-gen2` (the Azure CPI's naming, DESIGN.md §4), so
/// a suffix ending in `-gen<N>` would make `<name><suffix>` another mode's definition (with
/// `-gen2`, the create-env gen1 definition *is* the director's gen2 one). It must also be usable
/// in a definition name (letters, digits, `.`, `_`, `-`).
fn check_create_env_suffix(suffix: Option<String>) -> Result<Option<String>, ConfigError> {
    let Some(raw) = suffix else {
        return Ok(None);
    };
    let s = raw.trim();
    if s.is_empty() {
        return Ok(Some(raw));
    }
    let lower = s.to_ascii_lowercase();
    let generation_like = lower
        .rsplit_once("-gen")
        .is_some_and(|(_, n)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
    if generation_like {
        return Err(ConfigError::Invalid(format!(
            "create_env_suffix {s:?} would make create-env definitions collide with the director's (director definitions end in -gen2 for Hyper-V generation 2); use a suffix such as -create-env"
        )));
    }
    if !s
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        || s.ends_with('.')
    {
        return Err(ConfigError::Invalid(format!(
            "create_env_suffix {s:?} cannot be part of an image definition name: use letters, digits, '.', '_' or '-' (such as -create-env)"
        )));
    }
    Ok(Some(raw))
}

/// A configured create-env suffix, else the default `-create-env` (an empty value counts as unset).
pub fn create_env_suffix_or_default(configured: Option<&str>) -> &str {
    match configured {
        Some(s) if !s.trim().is_empty() => s,
        _ => crate::gallery::service::DEFAULT_CREATE_ENV_SUFFIX,
    }
}

fn need(value: &Option<String>, what: &str, auth: AuthKind) -> Result<(), ConfigError> {
    match value.as_deref().map(str::trim) {
        Some(v) if !v.is_empty() => Ok(()),
        _ => Err(ConfigError::Invalid(format!(
            "--auth {} needs {what}",
            auth.as_str()
        ))),
    }
}

/// Subscription ids are GUIDs; letters, digits and `-` are all a path segment may hold here.
fn check_subscription(id: &str) -> Result<(), ConfigError> {
    if id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "the subscription id {id:?} is not valid: a subscription id is a GUID such as 11111111-2222-3333-4444-555555555555"
        )))
    }
}

/// The consumer subscriptions: each a GUID (`11111111-2222-3333-4444-555555555555`), empty
/// entries refused, duplicates (in any case) and the gallery's own subscription dropped.
fn consumer_subscriptions(
    gallery_subscription: &str,
    given: Option<&[String]>,
) -> Result<Vec<String>, ConfigError> {
    let mut out: Vec<String> = Vec::new();
    for raw in given.unwrap_or_default() {
        let id = raw.trim();
        if !is_guid(id) {
            return Err(ConfigError::Invalid(format!(
                "the consumer subscription {id:?} (--consumer-subscription, consumer_subscriptions \
                 or STEMCELL_GALLERY_CONSUMER_SUBSCRIPTIONS) is not a subscription id: give a GUID \
                 such as 11111111-2222-3333-4444-555555555555"
            )));
        }
        let id = id.to_ascii_lowercase();
        if !id.eq_ignore_ascii_case(gallery_subscription) && !out.contains(&id) {
            out.push(id);
        }
    }
    Ok(out)
}

/// 8-4-4-4-12 hexadecimal digits.
fn is_guid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Azure resource group names: 1 to 90 letters, digits, `_`, `-`, `.`, `(`, `)`; not ending in `.`.
fn check_resource_group(rg: &str) -> Result<(), ConfigError> {
    let ok = rg.chars().count() <= 90
        && rg
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '(' | ')'))
        && !rg.ends_with('.');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "the resource group name {rg:?} is not valid: use 1 to 90 letters, digits, '_', '-', '.', '(' or ')', not ending with '.'"
        )))
    }
}

/// Azure regions: `westeurope`, or a display name such as `West Europe`.
fn check_location(location: &str) -> Result<(), ConfigError> {
    if location
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ' ')
    {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "the location {location:?} is not an Azure region name: use one such as westeurope"
        )))
    }
}

/// Azure Compute Gallery names: 1 to 80 letters, digits, `_` and `.`, starting and ending with a
/// letter or digit (no `-`, unlike image definition names).
fn check_gallery_name(gallery: &str) -> Result<(), ConfigError> {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let ok = gallery.len() <= 80
        && gallery
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'))
        && alnum(gallery.chars().next())
        && alnum(gallery.chars().last());
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "the gallery name {gallery:?} is not valid: use 1 to 80 letters, digits, '_' or '.', starting and ending with a letter or digit (Azure allows no '-' in gallery names)"
        )))
    }
}

fn check_account_name(account: &str) -> Result<(), ConfigError> {
    let ok = (3..=24).contains(&account.len())
        && account
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "storage account name {account:?} is not valid: 3 to 24 lowercase letters and digits"
        )))
    }
}

fn required(
    value: &Option<String>,
    what: &'static str,
    flag: &'static str,
) -> Result<String, ConfigError> {
    match value.as_deref().map(str::trim) {
        Some(v) if !v.is_empty() => Ok(v.to_string()),
        _ => Err(ConfigError::Missing { what, flag }),
    }
}

/// Whether a URL points at this machine.
pub fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

fn parse_endpoint(
    what: &'static str,
    value: &str,
    auth: &AuthKind,
) -> Result<url::Url, ConfigError> {
    let url = check_url(what, value)?;
    if *auth == AuthKind::Emulator && !is_loopback(&url) {
        return Err(ConfigError::EmulatorAuthRemote {
            what,
            value: value.to_string(),
        });
    }
    Ok(url)
}

/// Parse a URL and refuse plain http to anything but loopback.
fn check_url(what: &'static str, value: &str) -> Result<url::Url, ConfigError> {
    let url = url::Url::parse(value).map_err(|e| ConfigError::BadUrl {
        what,
        value: value.to_string(),
        reason: e.to_string(),
    })?;
    if url.scheme() != "https" && url.scheme() != "http" {
        return Err(ConfigError::BadUrl {
            what,
            value: value.to_string(),
            reason: "the scheme must be https (or http for loopback)".into(),
        });
    }
    if url.scheme() == "http" && !is_loopback(&url) {
        return Err(ConfigError::InsecureUrl {
            what,
            value: value.to_string(),
        });
    }
    Ok(url)
}

/// The IMDS endpoint: https anywhere, plain http only to loopback or to exactly the link-local
/// IMDS address 169.254.169.254 (which Azure serves over http by design).
fn check_imds(value: &str) -> Result<url::Url, ConfigError> {
    let what = "the IMDS endpoint";
    match check_url(what, value) {
        Err(ConfigError::InsecureUrl { .. }) => {
            let url = url::Url::parse(value).map_err(|e| ConfigError::BadUrl {
                what,
                value: value.to_string(),
                reason: e.to_string(),
            })?;
            if url.host() == Some(url::Host::Ipv4(std::net::Ipv4Addr::new(169, 254, 169, 254))) {
                Ok(url)
            } else {
                Err(ConfigError::InsecureUrl {
                    what,
                    value: value.to_string(),
                })
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resolve without the process environment, so the tests are hermetic.
    fn resolve(g: &GlobalArgs) -> Result<Settings, ConfigError> {
        Settings::resolve_with_env(g, &|_| None)
    }

    fn args() -> GlobalArgs {
        GlobalArgs {
            subscription: Some("sub".into()),
            resource_group: Some("rg".into()),
            gallery: Some("g".into()),
            ..Default::default()
        }
    }

    /// A throwaway self-signed CA (no key kept), for parsing only.
    const TEST_CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBnjCCAUOgAwIBAgIUFUbTwyISHi+262FpxrLKLO34jScwCgYIKoZIzj0EAwIw\nIzEhMB8GA1UEAwwYc3RlbWNlbGwtZ2FsbGVyeSB0ZXN0IENBMCAXDTI2MTIwMTA5\nNTUwMVoYDzIxMjYxMTA3MDk1NTAxWjAjMSEwHwYDVQQDDBhzdGVtY2VsbC1nYWxs\nZXJ5IHRlc3QgQ0EwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAARVOHF11tVZrv3s\nFruOHRWzlsy3o69BbqsMlI5pCuJdNO3i64L+6QbN02io2shQQDc3fok02lsdrXaA\n25wUO1aPo1MwUTAdBgNVHQ4EFgQUqpOwxnCBJtRkQqESJLglEGGUraswHwYDVR0j\nBBgwFoAUqpOwxnCBJtRkQqESJLglEGGUraswDwYDVR0TAQH/BAUwAwEB/zAKBggq\nhkjOPQQDAgNJADBGAiEA8d3PVJ/2IgxU0Rv22oKRdeOIzQDrtMsSk048mZXZCQkC\nIQCrAD2L52GzJXDtDsTiWpcffYzaPRJ03MgtzySJhESaKQ==\n-----END CERTIFICATE-----\n";

    #[test]
    fn ca_cert_that_is_not_pem_is_a_config_error_naming_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let mut g = args();
        g.ca_cert = Some(junk);
        let err = resolve(&g).unwrap_err().to_string();
        assert!(err.contains("ca_cert") && err.contains("PEM"), "{err}");
        g.ca_cert = Some(dir.path().join("absent.pem"));
        let err = resolve(&g).unwrap_err().to_string();
        assert!(
            err.contains("ca_cert") && err.contains("cannot read"),
            "{err}"
        );
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, TEST_CA).unwrap();
        g.ca_cert = Some(good);
        let s = resolve(&g).unwrap();
        assert_eq!(s.ca_bundles.len(), 1);
        assert_eq!(s.ca_bundles[0].count, 1);
    }

    #[test]
    fn ca_cert_comes_from_the_environment_and_ssl_cert_file() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("ca.pem");
        std::fs::write(&good, TEST_CA).unwrap();
        let path = good.display().to_string();
        let env = |k: &str| {
            matches!(k, "STEMCELL_GALLERY_CA_CERT" | "SSL_CERT_FILE").then(|| path.clone())
        };
        let s = Settings::resolve_with_env(&args(), &env).unwrap();
        let sources: Vec<&str> = s.ca_bundles.iter().map(|b| b.source.as_str()).collect();
        assert!(sources[0].starts_with("ca_cert "), "{sources:?}");
        assert!(sources[1].starts_with("SSL_CERT_FILE "), "{sources:?}");
    }

    /// The Azure CPI job renders `azure.azure_stack.ca_cert` (PEM text) to
    /// azure_stack_ca_cert.pem beside cpi.json; PEM text in cpi.json itself counts too.
    #[test]
    fn cpi_json_azure_stack_ca_cert_is_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let cpi = |stack: serde_json::Value| {
            serde_json::json!({"cloud": {"properties": {"azure": {
                "environment": "AzureStack", "subscription_id": "s", "resource_group_name": "rg",
                "compute_gallery_name": "g", "azure_stack": stack}}}})
            .to_string()
        };
        let path = dir.path().join("cpi.json");
        std::fs::write(&path, cpi(serde_json::json!({"domain": "local.azurestack.external", "resource": "https://management.example/x", "ca_cert": TEST_CA}))).unwrap();
        let g = GlobalArgs {
            config: Some(path.clone()),
            ..Default::default()
        };
        let s = resolve(&g).unwrap();
        assert_eq!(s.ca_bundles.len(), 1, "{:?}", s.ca_bundles);
        assert!(s.ca_bundles[0].source.contains("azure.azure_stack.ca_cert"));

        std::fs::write(&path, cpi(serde_json::json!({"domain": "local.azurestack.external", "resource": "https://management.example/x"}))).unwrap();
        std::fs::write(dir.path().join("azure_stack_ca_cert.pem"), TEST_CA).unwrap();
        let s = resolve(&g).unwrap();
        assert!(
            s.ca_bundles[0].source.ends_with("azure_stack_ca_cert.pem"),
            "{:?}",
            s.ca_bundles
        );

        std::fs::write(dir.path().join("azure_stack_ca_cert.pem"), "garbage").unwrap();
        let err = resolve(&g).unwrap_err().to_string();
        assert!(
            err.contains("azure_stack_ca_cert.pem") && err.contains("PEM"),
            "{err}"
        );
    }

    #[test]
    fn plain_http_is_refused_unless_loopback() {
        let mut g = args();
        g.arm_endpoint = Some("http://example.com".into());
        assert!(matches!(resolve(&g), Err(ConfigError::InsecureUrl { .. })));
        g.arm_endpoint = Some("http://127.0.0.1:9999".into());
        assert!(resolve(&g).is_ok());
    }

    #[test]
    fn emulator_auth_is_refused_for_remote_endpoints() {
        let mut g = args();
        g.auth = Some("emulator".into());
        assert!(matches!(
            resolve(&g),
            Err(ConfigError::EmulatorAuthRemote { .. })
        ));
        g.arm_endpoint = Some("http://localhost:1".into());
        assert!(resolve(&g).is_ok());
    }

    #[test]
    fn missing_gallery_names_the_flag() {
        let mut g = args();
        g.gallery = None;
        let err = resolve(&g).unwrap_err().to_string();
        assert!(err.contains("--gallery"), "{err}");
    }

    /// Found by tests/bad_input.rs: these went into ARM paths and lock blob names unchecked
    /// (`--gallery g/images/x` addressed another resource, and blobs were written first).
    #[test]
    fn names_that_are_arm_path_segments_are_checked_before_any_request() {
        for (field, bad) in [
            ("gallery", "g/images/x"),
            ("gallery", "bosh-gallery"),
            ("gallery", "has space"),
            ("gallery", "_lead"),
            ("gallery", "trail."),
            ("gallery", &"g".repeat(81)),
            ("resource group", "rg/providers/x"),
            ("resource group", "rg."),
            ("resource group", &"r".repeat(91)),
            ("subscription", "sub/resourceGroups/rg"),
            ("subscription", "sub?x=1"),
            ("location", "west/europe?"),
        ] {
            let mut g = args();
            match field {
                "gallery" => g.gallery = Some(bad.to_string()),
                "resource group" => g.resource_group = Some(bad.to_string()),
                "location" => g.location = Some(bad.to_string()),
                _ => g.subscription = Some(bad.to_string()),
            }
            let err = resolve(&g).unwrap_err();
            assert_eq!(crate::error::HasExit::exit(&err), crate::error::Exit::Usage);
            let text = err.to_string();
            assert!(text.contains(field) && text.contains(bad), "{bad}: {text}");
        }
        for (gallery, rg) in [
            ("bosh_gallery", "bosh-rg"),
            ("g.1", "rg_(prod).1"),
            ("G", "Ressourcengruppe-ä"),
        ] {
            let mut g = args();
            g.gallery = Some(gallery.into());
            g.resource_group = Some(rg.into());
            assert!(resolve(&g).is_ok(), "{gallery} {rg}");
        }
    }

    #[test]
    fn loopback_is_this_machine_only() {
        for yes in [
            "http://localhost:1",
            "http://LOCALHOST",
            "http://127.0.0.1",
            "http://127.10.0.3:5",
            "http://[::1]:7",
        ] {
            assert!(is_loopback(&url::Url::parse(yes).unwrap()), "{yes}");
        }
        for no in [
            "http://127.0.0.1.example.com",
            "http://localhost.example.com",
            "http://10.0.0.1",
            "http://169.254.169.254",
            "http://[::2]",
            "http://example.com",
        ] {
            assert!(!is_loopback(&url::Url::parse(no).unwrap()), "{no}");
        }
    }

    #[test]
    fn non_http_schemes_are_refused() {
        let mut g = args();
        g.arm_endpoint = Some("ftp://127.0.0.1".into());
        assert!(matches!(resolve(&g), Err(ConfigError::BadUrl { .. })));
    }

    #[test]
    fn auth_is_inferred_from_the_credential_material() {
        let layer = |f: &dyn Fn(&mut Layer)| {
            let mut l = Layer {
                subscription: Some("s".into()),
                resource_group: Some("rg".into()),
                gallery: Some("g".into()),
                tenant_id: Some("t".into()),
                client_id: Some("c".into()),
                ..Layer::default()
            };
            f(&mut l);
            Settings::from_layer(l, None).map(|s| s.auth)
        };
        assert_eq!(layer(&|_| {}).unwrap(), AuthKind::Default);
        assert_eq!(
            layer(&|l| l.client_secret = Some(SecretString::new("x"))).unwrap(),
            AuthKind::Secret
        );
        assert_eq!(
            layer(&|l| l.federated_token_file = Some("/t".into())).unwrap(),
            AuthKind::WorkloadIdentity
        );
        assert_eq!(
            layer(&|l| l.managed_identity_client_id = Some("id".into())).unwrap(),
            AuthKind::ManagedIdentity
        );
        // An explicit choice wins.
        assert_eq!(
            layer(&|l| {
                l.client_secret = Some(SecretString::new("x"));
                l.auth = Some("azure-cli".into());
            })
            .unwrap(),
            AuthKind::AzureCli
        );
        assert!(layer(&|l| {
            l.managed_identity_client_id = Some("a".into());
            l.managed_identity_resource_id = Some("b".into());
        })
        .is_err());
    }
}
