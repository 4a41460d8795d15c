//! Managed identity over the Azure Instance Metadata Service (IMDS), written by hand.
//!
//! azure_identity 1.x's `ManagedIdentityCredential` names a user-assigned identity by client,
//! object or resource id, but its IMDS endpoint is a constant
//! (`virtual_machine_managed_identity_credential.rs`: `ENDPOINT`), and the tool lets the
//! endpoint be configured (`imds_endpoint`, `AZURE_POD_IDENTITY_AUTHORITY_HOST` for AAD Pod
//! Identity), which its tests use to point it at a local server. So this credential stays,
//! serving both system- and user-assigned identities.
//!
//! It keeps no tokens: `azure::auth` wraps it in `Credential::cached`, the one token cache of the
//! tool's credentials (per scope, refreshed five minutes ahead of expiry).

use std::time::Duration;

use azure_core::credentials::{AccessToken, Secret, TokenCredential, TokenRequestOptions};
use azure_core::error::{Error, ErrorKind};
use serde::Deserialize;
use time::OffsetDateTime;

use crate::access::ManagedIdentity;

/// IMDS API version (supports `client_id`, `object_id`, `msi_res_id`).
pub const API_VERSION: &str = "2018-02-01";
/// Retries of a token request IMDS answered with a status worth re-sending (429, 5xx, 404: the
/// status table's IMDS column, `crate::error::class_of_status`).
pub const RETRIES: u32 = 3;
/// How long a token request IMDS answers 410 (IMDS is being updated) is retried, in first
/// backoffs: 140 × 500 ms = the 70 s the managed-identity guidance asks for (azure-identity for
/// Python retries 410 "for at least 70 seconds total duration as required by Azure IMDS
/// documentation", 1.24.0; @azure/identity's `imdsRetryPolicy` likewise).
const UPDATING_WINDOW_BACKOFFS: u32 = 140;
/// The longest wait between two attempts, in first backoffs (16 s).
const MAX_BACKOFFS: u32 = 32;

#[derive(Debug)]
pub struct ImdsCredential {
    http: reqwest::Client,
    endpoint: url::Url,
    identity: ManagedIdentity,
    first_backoff: Duration,
}

impl ImdsCredential {
    /// `endpoint` is the full token URL (`http://169.254.169.254/metadata/identity/oauth2/token`
    /// on a VM); `config` has already refused plain http to anything but IMDS or loopback.
    pub fn new(endpoint: url::Url, identity: ManagedIdentity) -> anyhow::Result<Self> {
        Self::trusting(endpoint, identity, &[])
    }

    /// [`ImdsCredential::new`] trusting the `ca_cert` bundles too, for an https token endpoint
    /// (`imds_endpoint`, AAD Pod Identity) whose certificate a private CA signed: token requests
    /// trust the same CAs as ARM and blob requests.
    pub fn trusting(
        endpoint: url::Url,
        identity: ManagedIdentity,
        bundles: &[crate::access::CaBundle],
    ) -> anyhow::Result<Self> {
        let http = crate::azure::tls::with_roots(reqwest::Client::builder(), bundles)
            .timeout(Duration::from_secs(30))
            .connect_timeout(Duration::from_secs(5))
            // IMDS must be reached directly, never through a proxy.
            .no_proxy()
            .build()?;
        Ok(Self {
            http,
            endpoint,
            identity,
            first_backoff: Duration::from_millis(500),
        })
    }

    /// The first retry's delay (doubles per retry); tests shorten it.
    pub fn with_retry_backoff(mut self, first: Duration) -> Self {
        self.first_backoff = first;
        self
    }

    /// Ask IMDS for a token; an answer the status table calls transient (429, 5xx, or 404 while
    /// the identity is being set up) is retried [`RETRIES`] times with a doubling backoff, and
    /// 410 (IMDS being updated) for as long as the guidance asks (70 s).
    async fn fetch(&self, resource: &str) -> azure_core::Result<AccessToken> {
        let started = std::time::Instant::now();
        let updating_window = self.first_backoff * UPDATING_WINDOW_BACKOFFS;
        let mut backoff = self.first_backoff;
        let mut attempt = 0;
        loop {
            let (err, status) = match self.fetch_once(resource).await {
                Ok(token) => return Ok(token),
                Err(failure) => failure,
            };
            let again = match status {
                Some(410) => started.elapsed() + backoff <= updating_window,
                Some(s) => {
                    attempt < RETRIES
                        && crate::error::class_of_status(crate::error::Service::Imds, s).resend()
                }
                // No answer, or an answer that is not a token: the same on a retry.
                None => false,
            };
            if !again {
                return Err(err);
            }
            tracing::debug!("managed identity: retrying after {err}");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(self.first_backoff * MAX_BACKOFFS);
            attempt += 1;
        }
    }

    /// One token request; a failure carries the status IMDS answered with, when it answered.
    async fn fetch_once(&self, resource: &str) -> Result<AccessToken, (Error, Option<u16>)> {
        let mut url = self.endpoint.clone();
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("api-version", API_VERSION);
            q.append_pair("resource", resource);
            match &self.identity {
                ManagedIdentity::SystemAssigned => {}
                ManagedIdentity::ClientId(id) => {
                    q.append_pair("client_id", id);
                }
                ManagedIdentity::ResourceId(id) => {
                    q.append_pair("msi_res_id", id);
                }
            }
        }
        let credential_err = |msg: String| (Error::with_message(ErrorKind::Credential, msg), None);
        let response = self
            .http
            .get(url)
            .header("Metadata", "true")
            .send()
            .await
            .map_err(|e| {
                let what = format!("managed identity: cannot reach IMDS at {}", self.endpoint);
                // A refused certificate keeps its type (never retried, the remedy named); other
                // send errors keep their whole chain (reqwest's own text omits the cause).
                match crate::azure::tls::untrusted_in(&e, &self.endpoint) {
                    Some(cause) => (Error::with_error(ErrorKind::Credential, cause, what), None),
                    None => credential_err(format!("{what}: {}", crate::error::error_chain(&e))),
                }
            })?;
        let status = response.status();
        let body = response.text().await.map_err(|e| {
            credential_err(format!("managed identity: reading the IMDS response: {e}"))
        })?;
        if !status.is_success() {
            // IMDS error bodies carry `error` and `error_description`, never a token.
            let detail: String = serde_json::from_str::<ImdsError>(&body)
                .map(|e| format!("{}: {}", e.error, e.error_description.unwrap_or_default()))
                .unwrap_or_else(|_| format!("HTTP {status}"));
            let (err, _) = credential_err(format!(
                "managed identity ({}) token request to {} failed with {status}: {detail}",
                self.describe_identity(),
                self.endpoint
            ));
            return Err((err, Some(status.as_u16())));
        }
        let token: ImdsToken = serde_json::from_str(&body).map_err(|e| {
            credential_err(format!(
                "managed identity: unexpected IMDS token response: {e}"
            ))
        })?;
        let expires_on = match (token.expires_on, token.expires_in) {
            (Some(on), _) => OffsetDateTime::from_unix_timestamp(
                on.as_i64().map_err(|e| (e, None))?,
            )
            .map_err(|e| {
                credential_err(format!(
                    "managed identity: bad expires_on in IMDS response: {e}"
                ))
            })?,
            (None, Some(secs)) => {
                OffsetDateTime::now_utc()
                    + time::Duration::seconds(secs.as_i64().map_err(|e| (e, None))?)
            }
            (None, None) => {
                return Err(credential_err(
                    "managed identity: IMDS response has neither expires_on nor expires_in".into(),
                ))
            }
        };
        Ok(AccessToken::new(
            Secret::new(token.access_token),
            expires_on,
        ))
    }

    fn describe_identity(&self) -> String {
        match &self.identity {
            ManagedIdentity::SystemAssigned => "system-assigned".into(),
            ManagedIdentity::ClientId(id) => format!("client id {id}"),
            ManagedIdentity::ResourceId(id) => format!("resource id {id}"),
        }
    }
}

#[async_trait::async_trait]
impl TokenCredential for ImdsCredential {
    async fn get_token(
        &self,
        scopes: &[&str],
        _options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let [scope] = scopes else {
            return Err(Error::with_message(
                ErrorKind::Credential,
                "managed identity tokens are for exactly one scope",
            ));
        };
        // IMDS speaks the v1 `resource`, not the v2 `.default` scope.
        let resource = scope.strip_suffix("/.default").unwrap_or(scope);
        self.fetch(resource).await
    }
}

#[derive(Deserialize)]
struct ImdsToken {
    access_token: String,
    expires_on: Option<NumOrString>,
    expires_in: Option<NumOrString>,
}

#[derive(Deserialize)]
struct ImdsError {
    error: String,
    error_description: Option<String>,
}

/// IMDS sends numbers as strings; App Service-style endpoints send numbers.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrString {
    Num(i64),
    Str(String),
}

impl NumOrString {
    fn as_i64(&self) -> azure_core::Result<i64> {
        match self {
            NumOrString::Num(n) => Ok(*n),
            NumOrString::Str(s) => s.trim().parse().map_err(|_| {
                Error::with_message(
                    ErrorKind::Credential,
                    format!("managed identity: {s:?} in the IMDS response is not a number"),
                )
            }),
        }
    }
}
