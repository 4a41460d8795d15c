//! Settings: resolved from flags > environment > a config file, validated before any I/O.
//!
//! Sources, highest first: the global flags (with clap's environment fallbacks), the other
//! environment variables (`AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET`,
//! `AZURE_FEDERATED_TOKEN_FILE`, `AZURE_AUTHORITY_HOST`, `STEMCELL_GALLERY_*`), `--config FILE`
//! (our TOML, whose keys mirror the flags, or the Azure CPI's cpi.json), and a cpi.json named by
//! the TOML's `cpi_config`. Secrets are held in [`SecretString`] and never printed.

pub use crate::devstore::{DEV_ACCOUNT, DEV_ACCOUNT_KEY, EMULATOR_TOKEN};

pub mod cloud;
mod derive;
mod file;
pub mod resource;
mod tuning;

/// The values the adapters take are the ground floor's (`crate::access`); the settings resolve
/// them and name them here too.
pub use crate::access::{is_loopback, AuthKind, CredentialSettings, ManagedIdentity, SecretString};
pub use file::{context_layer, ContextLayer, Layer};
pub use tuning::{
    FileTuning, Tuning, ARM_RETRIES_ENV, BLOB_RETRIES_ENV, COALESCE_ENV, HTTP_TIMEOUT_ENV,
    LOCK_WAIT, LOCK_WAIT_ENV, MAX_RETRIES, OPERATION_TIMEOUT_ENV,
};

use std::path::PathBuf;

use crate::config::cloud::CloudName;
use crate::names;

/// The IMDS token endpoint on every Azure VM (plain http to a link-local address, by design).
pub const DEFAULT_IMDS_ENDPOINT: &str = "http://169.254.169.254/metadata/identity/oauth2/token";

/// Everything a command needs to reach Azure (or the emulator), already validated.
/// `Debug` is safe to log: the client secret prints as `***`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Extra CA certificates trusted for every HTTPS request (ARM, blob, tokens), validated.
    pub ca_bundles: Vec<crate::access::CaBundle>,
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
    /// Keep a `CanNotDelete` management lock on every version this tool holds (default on;
    /// `protect_held_versions`, cpi.json `stemcell_gallery_protect_held_versions`;
    /// `gallery::protect`).
    pub protect_held_versions: bool,
    /// The guards new versions are created with (`end_of_life`,
    /// `block_deletion_before_end_of_life`; cpi.json `stemcell_gallery_*`).
    pub safeguards: crate::safeguards::Safeguards,
    /// Suffix of create-env definitions (default `-create-env`).
    pub create_env_suffix: Option<String>,
    /// Subscriptions besides the gallery's whose VMs, scale sets and disks every delete path
    /// reads as consumers (`--consumer-subscription`, `consumer_subscriptions`,
    /// `STEMCELL_GALLERY_CONSUMER_SUBSCRIPTIONS`; all of them count). Validated GUIDs, lower
    /// case, each once, never the gallery's own (which is always read).
    pub consumer_subscriptions: Vec<String>,
    /// The configuration file the settings were read from, if any.
    pub config_file: Option<PathBuf>,
    /// Retries, timeouts and waits (`STEMCELL_GALLERY_*` tuning variables), validated.
    pub tuning: Tuning,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{what} is not set; pass {flag} or set it in the config file")]
    Missing {
        what: &'static str,
        flag: &'static str,
    },
    /// Every setting that names the gallery and is missing, at once (not one per run).
    #[error("{}. Or try the tool without Azure: --emulator (docs/configure.md)", not_set_text(.0))]
    NotSet(Vec<NotSet>),
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

/// Settings that cannot be resolved are a usage error (exit 2).
impl crate::error::Classified for ConfigError {
    fn class(&self) -> crate::error::Class {
        crate::error::Class::Usage
    }
}

pub const DEFAULT_ARM_ENDPOINT: &str = "https://management.azure.com";

/// The extra CAs the layer names, each parsed now: a bad bundle is a config error before any
/// request. `ca_cert` (flag, environment or file), the cpi.json's Azure Stack CA, and
/// `SSL_CERT_FILE` all count.
fn ca_bundles(l: &Layer) -> Result<Vec<crate::access::CaBundle>, ConfigError> {
    use crate::access::CaBundle;
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

/// The command line's part of the settings: the global flags' values as the highest layer
/// (clap has already applied their environment fallbacks) and `--config FILE`.
#[derive(Debug, Clone, Default)]
pub struct Flags {
    pub layer: Layer,
    pub config: Option<PathBuf>,
}

/// Whatever carries the command line's flags: the CLI's global arguments, or [`Flags`] itself.
/// (`config` knows no front end; each one says how its flags become a layer.)
pub trait ToFlags {
    fn to_flags(&self) -> Flags;
}

impl ToFlags for Flags {
    fn to_flags(&self) -> Flags {
        self.clone()
    }
}

/// The configuration file read when neither `--config` nor `STEMCELL_GALLERY_CONFIG` names one,
/// if it exists (where deploy/ installs it).
pub const DEFAULT_CONFIG_FILE: &str = "/etc/stemcell-gallery/config.toml";

/// Which configuration file to read: the one named (`--config`, `STEMCELL_GALLERY_CONFIG`), none
/// when the name is empty (`--config ''` turns the default off), else `default` when it exists.
pub fn config_file_to_read(named: Option<PathBuf>, default: &std::path::Path) -> Option<PathBuf> {
    match named {
        Some(p) if p.as_os_str().is_empty() => None,
        Some(p) => Some(p),
        None => default.is_file().then(|| default.to_path_buf()),
    }
}

impl Settings {
    /// What the credential is made from.
    pub fn credentials(&self) -> CredentialSettings {
        CredentialSettings {
            auth: self.auth,
            tenant_id: self.tenant_id.clone(),
            client_id: self.client_id.clone(),
            client_secret: self.client_secret.clone(),
            federated_token_file: self.federated_token_file.clone(),
            managed_identity: self.managed_identity.clone(),
            imds_endpoint: self.imds_endpoint.clone(),
            authority_host: self.authority_host.clone(),
            ca_bundles: self.ca_bundles.clone(),
            token_scope: self.token_scope.clone(),
        }
    }

    /// Resolve settings from the global flags, the process environment and `--config FILE`
    /// (flags > environment > TOML > cpi.json).
    pub fn resolve<F: ToFlags + ?Sized>(flags: &F) -> Result<Settings, ConfigError> {
        Self::resolve_with_env(flags, &|k| std::env::var(k).ok())
    }

    /// [`Settings::resolve`] with the environment read through `env` (tests pass a map).
    pub fn resolve_with_env<F: ToFlags + ?Sized>(
        flags: &F,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, ConfigError> {
        Self::resolve_with_context(flags, env, None)
    }

    /// [`Settings::resolve_with_env`] with a director's CPI-config properties from a CPI
    /// request's context between the environment and the file (flags > environment > context >
    /// TOML > cpi.json): what the director says for this CPI wins over the job's file, as in
    /// the Azure CPI (see [`ContextLayer`]).
    pub fn resolve_with_context<F: ToFlags + ?Sized>(
        flags: &F,
        env: &dyn Fn(&str) -> Option<String>,
        context: Option<&ContextLayer>,
    ) -> Result<Settings, ConfigError> {
        let Flags {
            layer: flags,
            config,
        } = flags.to_flags();
        let config_path = config_file_to_read(
            config.or_else(|| env("STEMCELL_GALLERY_CONFIG").map(PathBuf::from)),
            std::path::Path::new(DEFAULT_CONFIG_FILE),
        );
        let from_file = match &config_path {
            Some(path) => file::load(path)?,
            None => Layer::default(),
        };
        let from_file = match context {
            Some(c) => c.over(from_file),
            None => from_file,
        };
        let merged = flags.over(Layer::from_env(env)).over(from_file);
        let file_tuning = merged.tuning.clone().unwrap_or_default();
        let mut settings = Self::from_layer(merged, config_path)?;
        settings.tuning = Tuning::from_env_and_file(env, &file_tuning)?;
        Ok(settings)
    }

    /// Validate a merged layer into settings. No network I/O (secret files are read).
    pub fn from_layer(l: Layer, config_file: Option<PathBuf>) -> Result<Settings, ConfigError> {
        let (subscription, resource_group, gallery) = gallery_identity(&l)?;
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

        let client_secret = derive::client_secret(&l)?;
        let (auth, managed_identity) = derive::auth_and_identity(&l, &client_secret)?;
        let derive::Endpoints {
            cloud,
            arm_endpoint,
            authority_host,
            token_scope,
            storage_suffix,
            blob_endpoint,
        } = derive::endpoints(&l, auth)?;
        let imds_endpoint =
            check_imds(l.imds_endpoint.as_deref().unwrap_or(DEFAULT_IMDS_ENDPOINT))?;
        derive::check_credentials(&l, auth, &client_secret)?;

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
            protect_held_versions: l.protect_held_versions.unwrap_or(true),
            create_env_suffix: check_create_env_suffix(l.create_env_suffix.clone())?,
            safeguards: derive::safeguards(&l)?,
            consumer_subscriptions,
            config_file,
            tuning: Tuning::default(),
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
    /// `storageAccountId` names another account); `app::Context::storage_account_id` looks it up.
    pub fn storage_account_id(&self) -> Option<String> {
        let account = self.storage_account.as_deref()?;
        let rg = self.storage_account_resource_group.as_deref()?;
        Some(names::storage_account_id(&self.subscription, rg, account))
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
    if !names::is_definition_name_part(s) {
        return Err(ConfigError::Invalid(format!(
            "create_env_suffix {s:?} cannot be part of an image definition name: use letters, digits, '.', '_' or '-' (such as -create-env)"
        )));
    }
    Ok(Some(raw))
}

/// A configured create-env suffix, else the default `-create-env` (an empty value counts as unset).
pub use crate::stemcell::naming::suffix_or_default as create_env_suffix_or_default;

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
    if names::is_subscription_segment(id) {
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
        if !names::is_guid(id) {
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

/// Azure resource group names: 1 to 90 letters, digits, `_`, `-`, `.`, `(`, `)`; not ending in `.`.
fn check_resource_group(rg: &str) -> Result<(), ConfigError> {
    if names::is_resource_group(rg) {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "the resource group name {rg:?} is not valid: use 1 to 90 letters, digits, '_', '-', '.', '(' or ')', not ending with '.'"
        )))
    }
}

/// Azure regions: `westeurope`, or a display name such as `West Europe`.
fn check_location(location: &str) -> Result<(), ConfigError> {
    if names::is_location(location) {
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
    if names::is_gallery_name(gallery) {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "the gallery name {gallery:?} is not valid: use 1 to 80 letters, digits, '_' or '.', starting and ending with a letter or digit (Azure allows no '-' in gallery names)"
        )))
    }
}

fn check_account_name(account: &str) -> Result<(), ConfigError> {
    if names::is_storage_account(account) {
        Ok(())
    } else {
        Err(ConfigError::Invalid(format!(
            "storage account name {account:?} is not valid: 3 to 24 lowercase letters and digits"
        )))
    }
}

/// One setting that is not set, with every way to set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotSet {
    pub what: &'static str,
    pub flag: &'static str,
    pub env: &'static str,
    pub key: &'static str,
}

impl std::fmt::Display for NotSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, environment variable {}, config key `{}`)",
            self.what, self.flag, self.env, self.key
        )
    }
}

/// "the gallery name is not set (…)" for one, "these settings are not set: …; …" for more.
fn not_set_text(missing: &[NotSet]) -> String {
    match missing {
        [one] => format!(
            "{} is not set ({}, environment variable {}, config key `{}`)",
            one.what, one.flag, one.env, one.key
        ),
        many => format!(
            "these settings are not set: {}",
            many.iter()
                .map(|m| m.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

/// The subscription, resource group and gallery name: each must be set, and one given empty
/// (`--gallery ''`) is refused rather than taken as unset. Every missing one is named at once.
fn gallery_identity(l: &Layer) -> Result<(String, String, String), ConfigError> {
    let settings = [
        (
            &l.subscription,
            NotSet {
                what: "the subscription id",
                flag: "--subscription",
                env: "AZURE_SUBSCRIPTION_ID",
                key: "subscription",
            },
        ),
        (
            &l.resource_group,
            NotSet {
                what: "the resource group",
                flag: "--resource-group",
                env: "STEMCELL_GALLERY_RESOURCE_GROUP",
                key: "resource_group",
            },
        ),
        (
            &l.gallery,
            NotSet {
                what: "the gallery name",
                flag: "--gallery",
                env: "STEMCELL_GALLERY_GALLERY",
                key: "gallery",
            },
        ),
    ];
    let mut values = Vec::new();
    let mut missing = Vec::new();
    for (value, how) in settings {
        match value.as_deref().map(str::trim) {
            Some("") => {
                return Err(ConfigError::Invalid(format!(
                    "{} is empty ({} ''); name it, or leave {} out to take it from {} or the config key `{}`",
                    how.what, how.flag, how.flag, how.env, how.key
                )))
            }
            Some(v) => values.push(v.to_string()),
            None => missing.push(how),
        }
    }
    match (missing.is_empty(), values.as_slice()) {
        (true, [s, r, g]) => Ok((s.clone(), r.clone(), g.clone())),
        _ => Err(ConfigError::NotSet(missing)),
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
mod tests;
