//! The storage account: its endpoint (public or path-style), how to authenticate, and the SDK
//! clients built from them with our retry settings.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use azure_core_legacy::{ClientOptions, RetryOptions};
use azure_storage::{CloudLocation, StorageCredentials, EMULATOR_ACCOUNT_KEY};
use azure_storage_blobs::prelude::{ClientBuilder, ContainerClient};

use super::{retry, BlobError, RetrySettings};

/// How to authenticate to the storage account.
#[derive(Clone)]
pub enum StorageAuth {
    /// Shared key. The key is a secret: it is never logged nor printed by `Debug`.
    AccountKey { account: String, key: String },
    /// An Entra ID token credential (role "Storage Blob Data Contributor" on the account).
    Token(Arc<dyn azure_core_legacy::auth::TokenCredential>),
    /// Azurite's and the emulator's well-known development key; loopback endpoints only.
    DevelopmentKey,
}

impl fmt::Debug for StorageAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StorageAuth::AccountKey { account, .. } => f
                .debug_struct("AccountKey")
                .field("account", account)
                .field("key", &"<redacted>")
                .finish(),
            StorageAuth::Token(_) => f.write_str("Token(<credential>)"),
            StorageAuth::DevelopmentKey => f.write_str("DevelopmentKey"),
        }
    }
}

/// A storage account endpoint plus credentials; hands out SDK clients whose pipeline retries
/// transient failures with our [`RetrySettings`].
#[derive(Clone)]
pub struct StorageTarget {
    account: String,
    /// The endpoint without a trailing slash: `https://acct.blob.core.windows.net` or
    /// `http://127.0.0.1:PORT/devstoreaccount1`.
    base: String,
    service: azure_storage_blobs::prelude::BlobServiceClient,
}

impl fmt::Debug for StorageTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageTarget")
            .field("account", &self.account)
            .field("endpoint", &self.base)
            .finish_non_exhaustive()
    }
}

impl StorageTarget {
    /// Build a target from a blob endpoint URL and credentials, with default retry settings.
    pub fn new(endpoint: &url::Url, auth: StorageAuth) -> Result<StorageTarget, BlobError> {
        Self::with_retry(endpoint, auth, RetrySettings::default())
    }

    /// As [`StorageTarget::new`], with explicit retry settings.
    pub fn with_retry(
        endpoint: &url::Url,
        auth: StorageAuth,
        retry: RetrySettings,
    ) -> Result<StorageTarget, BlobError> {
        Self::with_options(endpoint, auth, retry, &[])
    }

    /// As [`StorageTarget::with_retry`], trusting extra CA certificates too.
    pub fn with_options(
        endpoint: &url::Url,
        auth: StorageAuth,
        retry: RetrySettings,
        ca_bundles: &[crate::azure::tls::CaBundle],
    ) -> Result<StorageTarget, BlobError> {
        let (account, base, loopback) = parse_endpoint(endpoint)?;
        let mut policy = retry::RetryPolicy::new(retry);
        if let StorageAuth::Token(cred) = &auth {
            policy = policy.with_credential(cred.clone());
        }
        let credentials = match auth {
            StorageAuth::AccountKey {
                account: named,
                key,
            } => {
                if named != account {
                    return Err(BlobError::InvalidEndpoint {
                        endpoint: base,
                        reason: format!(
                            "the account key is for account `{named}` but the endpoint names `{account}`; \
                             pass the key of the endpoint's account"
                        ),
                    });
                }
                StorageCredentials::access_key(account.clone(), key)
            }
            StorageAuth::Token(cred) => StorageCredentials::token_credential(cred),
            StorageAuth::DevelopmentKey => {
                if !loopback {
                    return Err(BlobError::InvalidEndpoint {
                        endpoint: base,
                        reason: "the development key is only for Azurite or the emulator on a loopback \
                                 address; use an account key or a token credential for a real account"
                            .into(),
                    });
                }
                StorageCredentials::access_key(account.clone(), EMULATOR_ACCOUNT_KEY)
            }
        };
        let mut options = ClientOptions::default().retry(RetryOptions::none());
        if !ca_bundles.is_empty() {
            let http = crate::azure::tls::http_client_legacy(ca_bundles).map_err(|e| {
                BlobError::InvalidEndpoint {
                    endpoint: base.clone(),
                    reason: format!("cannot build the HTTP client with the extra CAs: {e}"),
                }
            })?;
            options = options.transport(azure_core_legacy::TransportOptions::new(http));
        }
        options.per_call_policies_mut().push(Arc::new(policy));
        options
            .per_retry_policies_mut()
            .push(Arc::new(retry::RetryAfterProbe));
        let service = ClientBuilder::with_location(
            CloudLocation::Custom {
                account: account.clone(),
                uri: base.clone(),
            },
            credentials,
        )
        .client_options(options)
        .blob_service_client();
        Ok(StorageTarget {
            account,
            base,
            service,
        })
    }

    /// A client for one container of the account.
    pub fn container(&self, name: &str) -> ContainerClient {
        self.service.container_client(name)
    }

    /// The blob's URI without any SAS: what a gallery version's `osDiskImage.source.uri` uses.
    pub fn blob_url(&self, container: &str, blob: &str) -> String {
        match url::Url::parse(&self.base) {
            Ok(mut url) => {
                if let Ok(mut segments) = url.path_segments_mut() {
                    segments.pop_if_empty().push(container);
                    for part in blob.split('/') {
                        segments.push(part);
                    }
                }
                url.to_string()
            }
            // `base` was produced from a parsed URL in `new`, so this cannot happen; stay total.
            Err(_) => format!("{}/{container}/{blob}", self.base),
        }
    }

    /// The storage account's name.
    pub fn account_name(&self) -> &str {
        &self.account
    }

    /// The endpoint as given (normalised, no trailing slash).
    pub fn endpoint(&self) -> &str {
        &self.base
    }
}

/// Split an endpoint into (account, base URI, is-loopback). Path-style (`http://host:port/ACCOUNT`)
/// when the URL has a path segment or its host is an IP address or `localhost`; otherwise the
/// account is the first DNS label (`https://ACCOUNT.blob.core.windows.net`).
/// The storage account a blob endpoint names (`ACCOUNT.blob.HOST`, or the first path segment
/// of a path-style emulator URL), if it names one.
pub fn endpoint_account(endpoint: &url::Url) -> Option<String> {
    parse_endpoint(endpoint).ok().map(|(account, _, _)| account)
}

fn parse_endpoint(endpoint: &url::Url) -> Result<(String, String, bool), BlobError> {
    let mut shown = endpoint.clone();
    shown.set_query(None);
    shown.set_fragment(None);
    let _ = shown.set_password(None);
    let shown_str = shown.as_str().trim_end_matches('/').to_string();
    let invalid = |reason: &str| BlobError::InvalidEndpoint {
        endpoint: shown_str.clone(),
        reason: reason.to_string(),
    };
    if !matches!(endpoint.scheme(), "http" | "https") {
        return Err(invalid(
            "the scheme must be https (or http for a local emulator)",
        ));
    }
    if endpoint.query().is_some() {
        return Err(invalid(
            "the endpoint must not carry a query string (SAS tokens are not accepted here); \
             pass the bare account URL and an account key or token credential",
        ));
    }
    if !endpoint.username().is_empty() || endpoint.password().is_some() {
        return Err(invalid("the endpoint must not carry user info"));
    }
    let host = endpoint
        .host_str()
        .ok_or_else(|| invalid("the endpoint has no host"))?;
    let bare_host = host.trim_start_matches('[').trim_end_matches(']');
    let ip = bare_host.parse::<IpAddr>().ok();
    let loopback = ip.map(|ip| ip.is_loopback()).unwrap_or(false) || host == "localhost";
    let segments: Vec<&str> = endpoint
        .path_segments()
        .map(|s| s.filter(|p| !p.is_empty()).collect())
        .unwrap_or_default();
    let path_style = !segments.is_empty() || ip.is_some() || host == "localhost";
    let mut origin = format!("{}://{}", endpoint.scheme(), host);
    if let Some(port) = endpoint.port() {
        origin.push_str(&format!(":{port}"));
    }
    let (account, base) = if path_style {
        match segments.as_slice() {
            [account] => (account.to_string(), format!("{origin}/{account}")),
            [] => {
                return Err(invalid(
                    "a path-style endpoint needs the account as its path, e.g. http://127.0.0.1:10000/devstoreaccount1",
                ))
            }
            _ => {
                return Err(invalid(
                    "the endpoint must be the account URL only (no container or blob in the path)",
                ))
            }
        }
    } else {
        let account = host.split('.').next().unwrap_or_default().to_string();
        (account, origin)
    };
    let valid_account = (3..=24).contains(&account.len())
        && account
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !valid_account {
        return Err(invalid(&format!(
            "`{account}` is not a storage account name (3-24 lowercase letters and digits)"
        )));
    }
    Ok((account, base, loopback))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str, auth: StorageAuth) -> Result<StorageTarget, BlobError> {
        StorageTarget::new(&url::Url::parse(url).expect("url"), auth)
    }

    #[test]
    fn public_endpoint_gives_account_from_host() {
        let t = target(
            "https://mystemcells.blob.core.windows.net/",
            StorageAuth::AccountKey {
                account: "mystemcells".into(),
                key: "a2V5".into(),
            },
        )
        .expect("valid");
        assert_eq!(t.account_name(), "mystemcells");
        assert_eq!(
            t.blob_url("stemcell", "bosh-stemcell-x.vhd"),
            "https://mystemcells.blob.core.windows.net/stemcell/bosh-stemcell-x.vhd"
        );
    }

    #[test]
    fn path_style_endpoint_gives_account_from_path() {
        let t = target(
            "http://127.0.0.1:10000/devstoreaccount1",
            StorageAuth::DevelopmentKey,
        )
        .expect("valid");
        assert_eq!(t.account_name(), "devstoreaccount1");
        assert_eq!(
            t.blob_url("stemcell", "locks/g/d/1.0.0.lock"),
            "http://127.0.0.1:10000/devstoreaccount1/stemcell/locks/g/d/1.0.0.lock"
        );
    }

    #[test]
    fn development_key_is_refused_off_loopback() {
        let err = target(
            "https://acct.blob.core.windows.net",
            StorageAuth::DevelopmentKey,
        )
        .expect_err("must refuse");
        assert!(err.to_string().contains("loopback"), "{err}");
    }

    #[test]
    fn sas_in_endpoint_is_refused_without_echoing_it() {
        let err = target(
            "https://acct.blob.core.windows.net/?sv=2022&sig=SECRETSIG",
            StorageAuth::DevelopmentKey,
        )
        .expect_err("must refuse");
        let text = err.to_string();
        assert!(text.contains("SAS"), "{text}");
        assert!(!text.contains("SECRETSIG"), "{text}");
    }

    #[test]
    fn key_for_another_account_is_refused_and_never_printed() {
        let err = target(
            "https://acct.blob.core.windows.net",
            StorageAuth::AccountKey {
                account: "other".into(),
                key: "VERYSECRETKEY".into(),
            },
        )
        .expect_err("must refuse");
        assert!(!err.to_string().contains("VERYSECRETKEY"));
        let dbg = format!(
            "{:?}",
            StorageAuth::AccountKey {
                account: "a".into(),
                key: "VERYSECRETKEY".into()
            }
        );
        assert!(!dbg.contains("VERYSECRETKEY"), "{dbg}");
    }

    #[test]
    fn endpoint_with_container_path_is_refused() {
        assert!(target(
            "http://127.0.0.1:10000/devstoreaccount1/stemcell",
            StorageAuth::DevelopmentKey
        )
        .is_err());
        assert!(target("http://127.0.0.1:10000/", StorageAuth::DevelopmentKey).is_err());
        assert!(target(
            "ftp://acct.blob.core.windows.net",
            StorageAuth::DevelopmentKey
        )
        .is_err());
    }
}
