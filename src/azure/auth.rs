//! Credentials over azure_identity 1.x, a hand-written IMDS credential for managed identity
//! (see `imds`), the default chain composed by hand (1.x has none that matches what the tool
//! documents), and the emulator's fixed development token.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use azure_core::cloud::{CloudConfiguration, CustomConfiguration};
use azure_core::credentials::{AccessToken, Secret, TokenCredential, TokenRequestOptions};
use azure_core::error::ErrorKind;
use azure_core::http::ClientMethodOptions;
use azure_core::http::{ClientOptions, Transport};
use azure_identity::{
    AzureCliCredential, ClientAssertion, ClientAssertionCredential,
    ClientAssertionCredentialOptions, ClientSecretCredential, ClientSecretCredentialOptions,
};

use crate::access::{AuthKind, CredentialSettings};
pub use crate::azure::credential::Credential;
use crate::devstore::EMULATOR_TOKEN;

/// The emulator's credential: a fixed development token, valid for a day from each request.
#[derive(Debug, Clone, Default)]
pub struct EmulatorCredential;

#[async_trait::async_trait]
impl TokenCredential for EmulatorCredential {
    async fn get_token(
        &self,
        _scopes: &[&str],
        _options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        Ok(AccessToken::new(
            Secret::new(EMULATOR_TOKEN),
            time::OffsetDateTime::now_utc() + time::Duration::days(1),
        ))
    }
}

/// The scope to ask for ARM tokens in the configured cloud.
pub fn arm_scope(creds: &CredentialSettings) -> &str {
    &creds.token_scope
}

/// What every azure_identity credential is built with: the HTTP client trusting the settings'
/// extra CAs (token requests trust the same CAs as ARM and blob requests) and the configured
/// authority host.
#[derive(Clone)]
struct IdentityOptions {
    http: Arc<dyn azure_core::http::HttpClient>,
    authority: url::Url,
}

impl std::fmt::Debug for IdentityOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdentityOptions")
            .field("authority", &self.authority.as_str())
            .finish_non_exhaustive()
    }
}

impl IdentityOptions {
    fn client_options(&self) -> ClientOptions {
        // The authority host as configured (a named cloud's, or a custom one such as Azure
        // Stack's ADFS). azure_identity 1.x refuses one that is not https.
        let mut cloud = CustomConfiguration::default();
        cloud.authority_host = self.authority.as_str().trim_end_matches('/').to_string();
        ClientOptions {
            transport: Some(Transport::new(self.http.clone())),
            cloud: Some(Arc::new(CloudConfiguration::Custom(cloud))),
            ..ClientOptions::default()
        }
    }
}

/// Build the credential the settings ask for. Nothing is requested yet; the first
/// `get_token` talks to the identity provider. Every credential caches its tokens and
/// refreshes them 5 minutes before they expire (azure_identity 1.x's window, and ours).
pub fn credential(creds: &CredentialSettings) -> anyhow::Result<Credential> {
    // For the credentials that ask Entra ID. `az` (azure-cli) runs its own Python client: it
    // reads REQUESTS_CA_BUNDLE, not these creds.
    let options = || -> anyhow::Result<IdentityOptions> {
        if creds.authority_host.scheme() != "https" {
            anyhow::bail!(
                "the authority host {} is not https; azure_identity sends tokens only over \
                 https: set authority_host (or AZURE_AUTHORITY_HOST) to an https URL",
                creds.authority_host
            );
        }
        Ok(IdentityOptions {
            http: crate::azure::tls::http_client(&creds.ca_bundles)?,
            authority: creds.authority_host.clone(),
        })
    };
    let need = |v: &Option<String>, what: &str| -> anyhow::Result<String> {
        v.clone()
            .with_context(|| format!("--auth {} needs {what}", creds.auth.as_str()))
    };
    Ok(match creds.auth {
        AuthKind::Emulator => Credential::fixed(Arc::new(EmulatorCredential)),
        AuthKind::Default => default_chain(creds, &options()?)?,
        AuthKind::Secret => {
            let secret = creds
                .client_secret
                .as_ref()
                .context("--auth secret needs the client secret")?
                .expose()
                .to_string();
            let tenant = need(&creds.tenant_id, "the tenant id")?;
            let client = need(&creds.client_id, "the client id")?;
            secret_credential(tenant, client, secret, options()?)?
        }
        AuthKind::WorkloadIdentity => {
            let path = creds
                .federated_token_file
                .as_ref()
                .context("--auth workload-identity needs the federated token file")?;
            let tenant = need(&creds.tenant_id, "the tenant id")?;
            let client = need(&creds.client_id, "the client id")?;
            workload_credential(tenant, client, path.clone(), options()?)?
        }
        AuthKind::ManagedIdentity => managed_identity_credential(creds)?,
        AuthKind::AzureCli => cli_credential()?,
    })
}

fn secret_credential(
    tenant: String,
    client: String,
    secret: String,
    options: IdentityOptions,
) -> anyhow::Result<Credential> {
    let make = move || -> azure_core::Result<Arc<dyn TokenCredential>> {
        Ok(ClientSecretCredential::new(
            &tenant,
            client.clone(),
            Secret::new(secret.clone()),
            Some(ClientSecretCredentialOptions {
                client_options: options.client_options(),
            }),
        )?)
    };
    Credential::rebuilt_by(make).context("setting up the client secret credential")
}

fn workload_credential(
    tenant_id: String,
    client_id: String,
    token_file: PathBuf,
    options: IdentityOptions,
) -> anyhow::Result<Credential> {
    let make = move || -> azure_core::Result<Arc<dyn TokenCredential>> {
        Ok(ClientAssertionCredential::new(
            tenant_id.clone(),
            client_id.clone(),
            FederatedTokenFile {
                path: token_file.clone(),
            },
            Some(ClientAssertionCredentialOptions {
                client_options: options.client_options(),
            }),
        )?)
    };
    Credential::rebuilt_by(make).context("setting up the workload identity credential")
}

fn managed_identity_credential(creds: &CredentialSettings) -> anyhow::Result<Credential> {
    let endpoint = creds.imds_endpoint.clone();
    let identity = creds.managed_identity.clone();
    let bundles = creds.ca_bundles.clone();
    let make = move || -> azure_core::Result<Arc<dyn TokenCredential>> {
        let imds = crate::azure::imds::ImdsCredential::trusting(
            endpoint.clone(),
            identity.clone(),
            &bundles,
        )
        .map_err(|e| azure_core::Error::with_message(ErrorKind::Credential, e.to_string()))?;
        Ok(Arc::new(imds))
    };
    // IMDS keeps no tokens itself: this is its cache.
    Credential::cached(make).context("setting up the managed identity credential")
}

fn cli_credential() -> anyhow::Result<Credential> {
    let make =
        || -> azure_core::Result<Arc<dyn TokenCredential>> { Ok(AzureCliCredential::new(None)?) };
    Credential::cached(make).context("setting up the Azure CLI credential")
}

/// The default chain, as the tool documents it and azure_identity 0.21 ran it: the environment
/// (a client secret, else a federated token file, from the settings: flags, config, `AZURE_*`),
/// then managed identity over IMDS, then the Azure CLI. azure_identity 1.x has no such chain
/// (its `DeveloperToolsCredential` holds only the developer tools), so it is composed here.
fn default_chain(
    creds: &CredentialSettings,
    options: &IdentityOptions,
) -> anyhow::Result<Credential> {
    let mut links: Vec<(&'static str, Credential)> = Vec::new();
    match (
        &creds.tenant_id,
        &creds.client_id,
        &creds.client_secret,
        &creds.federated_token_file,
    ) {
        (Some(tenant), Some(client), Some(secret), _) => links.push((
            "environment (client secret)",
            secret_credential(
                tenant.clone(),
                client.clone(),
                secret.expose().to_string(),
                options.clone(),
            )?,
        )),
        (Some(tenant), Some(client), None, Some(file)) => links.push((
            "environment (workload identity)",
            workload_credential(
                tenant.clone(),
                client.clone(),
                file.clone(),
                options.clone(),
            )?,
        )),
        _ => {}
    }
    links.push(("managed identity", managed_identity_credential(creds)?));
    links.push(("Azure CLI", cli_credential()?));
    Ok(Credential::chain(links))
}

/// Workload identity's client assertion: the federated token file, read afresh each time a new
/// access token is needed. Kubernetes rotates the projected service-account token (it lives an
/// hour by default on AKS), and a `seed` waiting for replication can outlive one;
/// azure_identity 1.x's `WorkloadIdentityCredential` re-reads the file only every 10 minutes (its
/// `TIMEOUT`) and sends its content untrimmed (a trailing newline, as a hand-written file or a
/// secret mount has, makes Entra refuse the assertion). `ClientAssertionCredential` caches the
/// access tokens and asks for an assertion only when it fetches one.
#[derive(Debug)]
struct FederatedTokenFile {
    path: PathBuf,
}

#[async_trait::async_trait]
impl ClientAssertion for FederatedTokenFile {
    async fn secret(&self, _: Option<ClientMethodOptions<'_>>) -> azure_core::Result<String> {
        let text = tokio::fs::read_to_string(&self.path).await.map_err(|e| {
            azure_core::Error::with_message(
                ErrorKind::Credential,
                format!(
                    "cannot read the federated token file {}: {e}",
                    self.path.display()
                ),
            )
        })?;
        Ok(text.trim().to_string())
    }
}
