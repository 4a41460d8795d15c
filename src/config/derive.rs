//! The steps of [`Settings::from_layer`](super::Settings::from_layer) that derive one group of
//! settings from a merged layer: the client secret, the credential kind, the endpoints, the
//! credential material each kind needs, and the safeguards.

use super::{
    check_account_name, check_url, need, parse_endpoint, AuthKind, ConfigError, Layer,
    ManagedIdentity, SecretString,
};
use crate::config::cloud::{scope_for, CloudEndpoints, CloudName};

/// The client secret: inline, or read from its file (which wins).
pub(super) fn client_secret(l: &Layer) -> Result<Option<SecretString>, ConfigError> {
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
    Ok(client_secret)
}

/// The credential kind (`auth`, else what the configured credential material says) and the
/// managed identity to use if it is one.
pub(super) fn auth_and_identity(
    l: &Layer,
    client_secret: &Option<SecretString>,
) -> Result<(AuthKind, ManagedIdentity), ConfigError> {
    let explicit_auth = match l.auth.as_deref() {
        None => None,
        Some(v) => Some(AuthKind::parse(v).ok_or_else(|| ConfigError::UnknownAuth(v.into()))?),
    };
    let managed_identity = match (
        l.managed_identity_client_id.as_deref(),
        l.managed_identity_resource_id.as_deref(),
    ) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::Invalid(
                "set only one of managed_identity_client_id and managed_identity_resource_id"
                    .into(),
            ))
        }
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
    Ok((auth, managed_identity))
}

/// The cloud and its endpoints, as [`endpoints`] derives them.
pub(super) struct Endpoints {
    pub cloud: CloudName,
    pub arm_endpoint: url::Url,
    pub authority_host: url::Url,
    pub token_scope: String,
    pub storage_suffix: Option<String>,
    pub blob_endpoint: Option<url::Url>,
}

/// Cloud endpoints: the named cloud's, then the config's custom section, then explicit keys.
pub(super) fn endpoints(l: &Layer, auth: AuthKind) -> Result<Endpoints, ConfigError> {
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
    Ok(Endpoints {
        cloud,
        arm_endpoint,
        authority_host,
        token_scope,
        storage_suffix,
        blob_endpoint,
    })
}

/// The tenant and the client a secret or a workload identity names.
fn need_tenant_and_client(l: &Layer, auth: AuthKind) -> Result<(), ConfigError> {
    need(
        &l.tenant_id,
        "the tenant id (AZURE_TENANT_ID, tenant_id)",
        auth,
    )?;
    need(
        &l.client_id,
        "the client id (AZURE_CLIENT_ID, client_id)",
        auth,
    )
}

/// Whether the credential kind has the material it needs (a secret needs the tenant, the client
/// and the secret; workload identity the tenant, the client and the token file).
pub(super) fn check_credentials(
    l: &Layer,
    auth: AuthKind,
    client_secret: &Option<SecretString>,
) -> Result<(), ConfigError> {
    match auth {
        AuthKind::Secret => {
            need_tenant_and_client(l, auth)?;
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
            need_tenant_and_client(l, auth)?;
            if l.federated_token_file.is_none() {
                return Err(ConfigError::Invalid(
                    "--auth workload-identity needs the federated token file \
                     (AZURE_FEDERATED_TOKEN_FILE, federated_token_file)"
                        .into(),
                ));
            }
        }
        AuthKind::Default | AuthKind::ManagedIdentity | AuthKind::AzureCli | AuthKind::Emulator => {
        }
    }
    Ok(())
}

/// The end of life of new versions and whether Azure is to refuse their deletion before it.
pub(super) fn safeguards(l: &Layer) -> Result<crate::safeguards::Safeguards, ConfigError> {
    Ok(crate::safeguards::Safeguards {
        end_of_life: match l.end_of_life.as_deref().map(str::trim) {
            None | Some("") => None,
            Some(s) => Some(
                s.parse()
                    .map_err(|e: String| ConfigError::Invalid(format!("end_of_life: {e}")))?,
            ),
        },
        block_deletion_before_end_of_life: l.block_deletion_before_end_of_life.unwrap_or(false),
    })
}
