//! Settings: resolved from flags > environment > a config file, validated before any I/O.
//!
//! This is the minimal resolution the first commands need; the configuration issue extends it
//! (TOML files, the Azure CPI's cpi.json, clouds, credential kinds) without changing the fields.

use crate::cli::GlobalArgs;

/// Well-known development bearer token the emulator accepts (`--auth emulator`).
pub const EMULATOR_TOKEN: &str = "stemcell-gallery-emulator-dev-token";
/// Azurite's well-known development account and key (public, documented by Microsoft).
pub const DEV_ACCOUNT: &str = "devstoreaccount1";
pub const DEV_ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthKind {
    /// azure_identity's default chain.
    Default,
    /// The emulator's fixed development token and storage key; loopback endpoints only.
    Emulator,
}

/// Everything a command needs to reach Azure (or the emulator), already validated.
#[derive(Debug, Clone)]
pub struct Settings {
    pub subscription: String,
    pub resource_group: String,
    pub gallery: String,
    pub location: String,
    pub arm_endpoint: url::Url,
    pub blob_endpoint: Option<url::Url>,
    pub auth: AuthKind,
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
    #[error("unknown --auth kind {0:?}; use one of: default, emulator")]
    UnknownAuth(String),
}

impl crate::error::HasExit for ConfigError {
    fn exit(&self) -> crate::error::Exit {
        crate::error::Exit::Usage
    }
}

pub const DEFAULT_ARM_ENDPOINT: &str = "https://management.azure.com";

impl Settings {
    /// Resolve settings from the global flags (and their environment fallbacks).
    pub fn resolve(global: &GlobalArgs) -> Result<Settings, ConfigError> {
        let auth = match global.auth.as_deref() {
            None | Some("default") => AuthKind::Default,
            Some("emulator") => AuthKind::Emulator,
            Some(other) => return Err(ConfigError::UnknownAuth(other.to_string())),
        };
        let subscription = required(
            &global.subscription,
            "the subscription id",
            "--subscription",
        )?;
        let resource_group = required(
            &global.resource_group,
            "the resource group",
            "--resource-group",
        )?;
        let gallery = required(&global.gallery, "the gallery name", "--gallery")?;
        let location = global
            .location
            .clone()
            .unwrap_or_else(|| "westeurope".into());
        let arm_endpoint = parse_endpoint(
            "the ARM endpoint",
            global
                .arm_endpoint
                .as_deref()
                .unwrap_or(DEFAULT_ARM_ENDPOINT),
            &auth,
        )?;
        let blob_endpoint = global
            .blob_endpoint
            .as_deref()
            .map(|v| parse_endpoint("the blob endpoint", v, &auth))
            .transpose()?;
        Ok(Settings {
            subscription,
            resource_group,
            gallery,
            location,
            arm_endpoint,
            blob_endpoint,
            auth,
        })
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
    if *auth == AuthKind::Emulator && !is_loopback(&url) {
        return Err(ConfigError::EmulatorAuthRemote {
            what,
            value: value.to_string(),
        });
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> GlobalArgs {
        GlobalArgs {
            subscription: Some("sub".into()),
            resource_group: Some("rg".into()),
            gallery: Some("g".into()),
            ..Default::default()
        }
    }

    #[test]
    fn plain_http_is_refused_unless_loopback() {
        let mut g = args();
        g.arm_endpoint = Some("http://example.com".into());
        assert!(matches!(
            Settings::resolve(&g),
            Err(ConfigError::InsecureUrl { .. })
        ));
        g.arm_endpoint = Some("http://127.0.0.1:9999".into());
        assert!(Settings::resolve(&g).is_ok());
    }

    #[test]
    fn emulator_auth_is_refused_for_remote_endpoints() {
        let mut g = args();
        g.auth = Some("emulator".into());
        assert!(matches!(
            Settings::resolve(&g),
            Err(ConfigError::EmulatorAuthRemote { .. })
        ));
        g.arm_endpoint = Some("http://localhost:1".into());
        assert!(Settings::resolve(&g).is_ok());
    }

    #[test]
    fn missing_gallery_names_the_flag() {
        let mut g = args();
        g.gallery = None;
        let err = Settings::resolve(&g).unwrap_err().to_string();
        assert!(err.contains("--gallery"), "{err}");
    }
}
