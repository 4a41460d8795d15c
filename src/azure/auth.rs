//! Credentials over azure_identity 0.21, a hand-written IMDS credential for managed identity
//! (see `imds`), and the emulator's fixed development token.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use azure_core_legacy::auth::{AccessToken, Secret, TokenCredential};
use azure_identity_legacy::{
    AzureCliCredential, ClientSecretCredential, DefaultAzureCredentialBuilder,
    TokenCredentialOptions, WorkloadIdentityCredential,
};

use crate::config::{AuthKind, Settings, EMULATOR_TOKEN};

/// The emulator's credential: a fixed development token, valid for a day from each request.
#[derive(Debug, Clone, Default)]
pub struct EmulatorCredential;

#[async_trait::async_trait]
impl TokenCredential for EmulatorCredential {
    async fn get_token(&self, _scopes: &[&str]) -> azure_core_legacy::Result<AccessToken> {
        Ok(AccessToken::new(
            Secret::new(EMULATOR_TOKEN),
            time::OffsetDateTime::now_utc() + time::Duration::days(1),
        ))
    }

    async fn clear_cache(&self) -> azure_core_legacy::Result<()> {
        Ok(())
    }
}

/// The scope to ask for ARM tokens in the configured cloud.
pub fn arm_scope(settings: &Settings) -> &str {
    &settings.token_scope
}

/// Build the credential the settings ask for. Nothing is requested yet; the first
/// `get_token` talks to the identity provider. Every credential caches its tokens and
/// refreshes them before they expire (azure_identity's 20 s ahead, ours 5 minutes ahead).
/// A credential as the rest of the tool holds it (the SDK's type stays in `azure`).
pub type Credential = Arc<dyn TokenCredential>;

pub fn credential(settings: &Settings) -> anyhow::Result<Credential> {
    // Token requests trust the same extra CAs as ARM and blob requests; azure_identity takes
    // the HTTP client through its options (client secret, workload identity, and the default
    // chain's environment, workload and managed identity credentials). `az` (azure-cli) runs
    // its own Python client: it reads REQUESTS_CA_BUNDLE, not these settings.
    let mut options =
        TokenCredentialOptions::from(crate::azure::tls::http_client_legacy(&settings.ca_bundles)?);
    options.set_authority_host(settings.authority_host.to_string());
    let http = options.http_client();
    let authority = settings.authority_host.clone();
    let need = |v: &Option<String>, what: &str| -> anyhow::Result<String> {
        v.clone()
            .with_context(|| format!("--auth {} needs {what}", settings.auth.as_str()))
    };
    Ok(match settings.auth {
        AuthKind::Emulator => Arc::new(EmulatorCredential),
        AuthKind::Default => Arc::new(
            DefaultAzureCredentialBuilder::new()
                .with_options(options)
                .build()
                .context("setting up the default credential chain")?,
        ),
        AuthKind::Secret => {
            let secret = settings
                .client_secret
                .as_ref()
                .context("--auth secret needs the client secret")?;
            Arc::new(ClientSecretCredential::new(
                http,
                authority,
                need(&settings.tenant_id, "the tenant id")?,
                need(&settings.client_id, "the client id")?,
                secret.expose().to_string(),
            ))
        }
        AuthKind::WorkloadIdentity => {
            let path = settings
                .federated_token_file
                .as_ref()
                .context("--auth workload-identity needs the federated token file")?;
            Arc::new(FederatedTokenFileCredential {
                http,
                authority,
                tenant_id: need(&settings.tenant_id, "the tenant id")?,
                client_id: need(&settings.client_id, "the client id")?,
                token_file: path.clone(),
                cache: tokio::sync::Mutex::new(HashMap::new()),
            })
        }
        AuthKind::ManagedIdentity => Arc::new(crate::azure::imds::ImdsCredential::new(
            settings.imds_endpoint.clone(),
            settings.managed_identity.clone(),
        )?),
        AuthKind::AzureCli => Arc::new(AzureCliCredential::new()),
    })
}

/// Workload identity that re-reads the federated token file whenever it needs a new access
/// token. Kubernetes rotates the projected service-account token (it lives an hour by default
/// on AKS), and a `seed` waiting for replication can outlive one; azure_identity's
/// `WorkloadIdentityCredential` reads the file once, so each refresh builds a fresh one from
/// the file's current content.
#[derive(Debug)]
struct FederatedTokenFileCredential {
    http: Arc<dyn azure_core_legacy::HttpClient>,
    authority: url::Url,
    tenant_id: String,
    client_id: String,
    token_file: PathBuf,
    cache: tokio::sync::Mutex<HashMap<Vec<String>, AccessToken>>,
}

#[async_trait::async_trait]
impl TokenCredential for FederatedTokenFileCredential {
    async fn get_token(&self, scopes: &[&str]) -> azure_core_legacy::Result<AccessToken> {
        let key: Vec<String> = scopes.iter().map(|s| s.to_string()).collect();
        let mut cache = self.cache.lock().await;
        if let Some(token) = cache.get(&key) {
            if token.expires_on
                > time::OffsetDateTime::now_utc() + crate::azure::imds::REFRESH_BEFORE
            {
                return Ok(token.clone());
            }
        }
        let assertion = std::fs::read_to_string(&self.token_file).map_err(|e| {
            azure_core_legacy::error::Error::message(
                azure_core_legacy::error::ErrorKind::Credential,
                format!(
                    "cannot read the federated token file {}: {e}",
                    self.token_file.display()
                ),
            )
        })?;
        let token = WorkloadIdentityCredential::new(
            self.http.clone(),
            self.authority.clone(),
            self.tenant_id.clone(),
            self.client_id.clone(),
            Secret::new(assertion.trim().to_string()),
        )
        .get_token(scopes)
        .await?;
        cache.insert(key, token.clone());
        Ok(token)
    }

    async fn clear_cache(&self) -> azure_core_legacy::Result<()> {
        self.cache.lock().await.clear();
        Ok(())
    }
}
