//! How the tool reaches Azure, as plain values on the ground floor: the credential kind and its
//! material ([`AuthKind`], [`ManagedIdentity`], [`CredentialSettings`], secrets as
//! [`SecretString`]), the CA bundles to trust ([`CaBundle`]), and the pure rules both sides
//! apply to endpoints ([`is_loopback`], [`scope_for`], [`blob_in_account`]). The settings
//! (`config`) resolve these values; the adapters (`azure`) take them (issue 45 item 3: adapters
//! take plain values, not `config` items), so neither imports the other for them.

use std::path::PathBuf;

mod secret;
mod tls;

pub use secret::SecretString;
pub use tls::CaBundle;

/// How to get tokens for Azure Resource Manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthKind {
    /// The default chain (environment, managed identity, Azure CLI), composed in `azure::auth`.
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

/// What a credential is made from: the part of the settings the identity adapter takes (a
/// value; no adapter takes the settings tree).
#[derive(Debug, Clone)]
pub struct CredentialSettings {
    pub auth: AuthKind,
    pub tenant_id: Option<String>,
    pub client_id: Option<String>,
    pub client_secret: Option<SecretString>,
    pub federated_token_file: Option<PathBuf>,
    pub managed_identity: ManagedIdentity,
    pub imds_endpoint: url::Url,
    pub authority_host: url::Url,
    pub ca_bundles: Vec<CaBundle>,
    /// The scope ARM tokens are asked for.
    pub token_scope: String,
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

/// The `.default` scope for a token audience: `https://management.azure.com/` →
/// `https://management.azure.com/.default`; a value already ending in `/.default` is kept.
pub fn scope_for(audience: &str) -> String {
    if audience.ends_with("/.default") {
        audience.to_string()
    } else {
        format!("{}/.default", audience.trim_end_matches('/'))
    }
}

/// `(container, blob)` of a blob URI in the storage account at `endpoint` (the account's blob
/// endpoint, path-style for an emulator: `http://127.0.0.1:10000/devstoreaccount1`); `None` when
/// the URI is in another account or names no container and blob. Scheme, host (any case) and
/// port must be the endpoint's; a query (a SAS token) or fragment is ignored; the blob name is
/// percent-decoded (other tools may write escaped names). The one parser every delete, cleanup
/// and metadata read uses, so all of them agree on which blob a URI names.
pub fn blob_in_account(endpoint: &str, uri: &str) -> Option<(String, String)> {
    let base = url::Url::parse(endpoint).ok()?;
    let url = url::Url::parse(uri).ok()?;
    let same_account = url.scheme() == base.scheme()
        && url
            .host_str()
            .zip(base.host_str())
            .is_some_and(|(a, b)| a.eq_ignore_ascii_case(b))
        && url.port_or_known_default() == base.port_or_known_default();
    if !same_account {
        return None;
    }
    let rest = url
        .path()
        .strip_prefix(base.path().trim_end_matches('/'))?
        .strip_prefix('/')?;
    let (container, blob) = rest.split_once('/')?;
    if container.is_empty() || blob.is_empty() {
        return None;
    }
    Some((container.to_string(), percent_decode(blob)?))
}

/// Decode `%XX` sequences; `None` for a broken escape or a name that is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Environment variable: seconds one HTTP request (ARM, or one blob attempt) may take.
pub const HTTP_TIMEOUT_ENV: &str = "STEMCELL_GALLERY_HTTP_TIMEOUT";
