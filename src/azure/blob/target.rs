//! The storage account: its endpoint (public or path-style), how to authenticate, and the SDK
//! clients built from them with our retry settings.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use azure_core::http::policies::Policy;
use azure_core::http::{ClientOptions, RetryOptions, Transport};
use azure_storage_blob::{
    BlobClient, BlobClientOptions, BlobContainerClient, BlobServiceClient,
    BlobServiceClientOptions, BlockBlobClient, PageBlobClient,
};

use super::shared_key::{SharedKey, SharedKeyPolicy};
use super::{retry, BlobError, RetrySettings};
use crate::azure::bearer::BearerPolicy;
use crate::azure::credential::Credential;

/// The token scope of Azure Storage's data plane (the same in every public cloud; Azure Stack
/// Hub's storage takes account keys).
pub const STORAGE_SCOPE: &str = "https://storage.azure.com/.default";

/// How to authenticate to the storage account.
#[derive(Clone)]
pub enum StorageAuth {
    /// Shared key. The key is a secret: it is never logged nor printed by `Debug`.
    AccountKey { account: String, key: String },
    /// An Entra ID token credential (role "Storage Blob Data Contributor" on the account).
    Token(Credential),
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

/// A storage account endpoint plus credentials; hands out azure_storage_blob 1.x clients whose
/// pipeline retries transient failures with our [`RetrySettings`] (the SDK's retry is off) and
/// authorizes each try with our Shared Key or bearer step.
#[derive(Clone)]
pub struct StorageTarget {
    account: String,
    /// The endpoint without a trailing slash: `https://acct.blob.core.windows.net` or
    /// `http://127.0.0.1:PORT/devstoreaccount1`.
    base: String,
    /// The client options every client of this target is built with.
    options: ClientOptions,
    /// The SDK's clients are not `Clone`; ours share them.
    service: Arc<BlobServiceClient>,
}

impl fmt::Debug for StorageTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageTarget")
            .field("account", &self.account)
            .field("endpoint", &self.base)
            .finish_non_exhaustive()
    }
}

/// A container of the target's account: its name and the 1.x client for it.
#[derive(Clone)]
pub struct Container {
    target: StorageTarget,
    name: String,
    client: Arc<BlobContainerClient>,
}

impl fmt::Debug for Container {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Container")
            .field("account", &self.target.account)
            .field("name", &self.name)
            .finish()
    }
}

impl Container {
    /// The container's name.
    pub fn container_name(&self) -> &str {
        &self.name
    }

    /// The azure_storage_blob client for the container.
    pub fn client(&self) -> &BlobContainerClient {
        &self.client
    }

    /// A blob of this container (`name` may contain `/`).
    pub fn blob_client(&self, name: impl AsRef<str>) -> Blob {
        let name = name.as_ref();
        // Built from the URL with `/` kept as the path separator (the SDK's `blob_client` would
        // send it as %2F), the same URL `blob_url` gives a gallery version.
        let options = BlobClientOptions {
            client_options: self.target.options.clone(),
            ..BlobClientOptions::default()
        };
        let client = url::Url::parse(&self.target.blob_url(&self.name, name))
            .ok()
            .and_then(|url| BlobClient::new(url, None, Some(options)).ok())
            // `new` refuses only a URL that cannot be a base (ours is http(s) with a host, as
            // checked when the target was built): same blob, with `/` escaped.
            .unwrap_or_else(|| self.client.blob_client(name));
        let client = Arc::new(client);
        Blob {
            container: self.clone(),
            name: name.to_string(),
            client,
        }
    }

    /// The storage target it belongs to.
    pub fn target(&self) -> &StorageTarget {
        &self.target
    }

    /// Whether the container exists (Get Container Properties).
    pub async fn exists(&self) -> Result<bool, BlobError> {
        match self.client.get_properties(None).await {
            Ok(_) => Ok(true),
            Err(e) => {
                let err = BlobError::request("get properties of container", self.name.clone(), e);
                if err.is_not_found() {
                    Ok(false)
                } else {
                    Err(err)
                }
            }
        }
    }
}

/// A blob: its container, name and the 1.x clients for it.
#[derive(Clone)]
pub struct Blob {
    container: Container,
    name: String,
    client: Arc<BlobClient>,
}

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Blob")
            .field("container", &self.container.name)
            .field("name", &self.name)
            .finish()
    }
}

impl Blob {
    /// The blob's name.
    pub fn blob_name(&self) -> &str {
        &self.name
    }

    /// Its container.
    pub fn container_client(&self) -> &Container {
        &self.container
    }

    /// The azure_storage_blob client for the blob.
    pub fn client(&self) -> &BlobClient {
        &self.client
    }

    /// The page-blob operations on it.
    pub fn page_blob(&self) -> PageBlobClient {
        self.client.page_blob_client()
    }

    /// The block-blob operations on it.
    pub fn block_blob(&self) -> BlockBlobClient {
        self.client.block_blob_client()
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
        ca_bundles: &[crate::access::CaBundle],
    ) -> Result<StorageTarget, BlobError> {
        let (account, base, loopback) = parse_endpoint(endpoint)?;
        let mut policy = retry::RetryPolicy::new(retry);
        if let StorageAuth::Token(cred) = &auth {
            policy = policy.with_credential(cred.clone());
        }
        let per_try: Vec<Arc<dyn Policy>> = match auth {
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
                let key = SharedKey::new(account.clone(), &key).map_err(|e| {
                    BlobError::InvalidEndpoint {
                        endpoint: base.clone(),
                        reason: e.to_string(),
                    }
                })?;
                vec![Arc::new(SharedKeyPolicy::new(key))]
            }
            StorageAuth::Token(cred) => {
                if !crate::azure::bearer::may_carry_token(endpoint) {
                    return Err(BlobError::InvalidEndpoint {
                        endpoint: base,
                        reason:
                            "a token is only sent over https (plain http is only for the emulator \
                                 or Azurite on a loopback address)"
                                .into(),
                    });
                }
                vec![
                    Arc::new(retry::XmsDate),
                    Arc::new(BearerPolicy::new(cred, STORAGE_SCOPE)),
                ]
            }
            StorageAuth::DevelopmentKey => {
                if !loopback {
                    return Err(BlobError::InvalidEndpoint {
                        endpoint: base,
                        reason: "the development key is only for Azurite or the emulator on a loopback \
                                 address; use an account key or a token credential for a real account"
                            .into(),
                    });
                }
                let key = SharedKey::new(account.clone(), crate::devstore::DEV_ACCOUNT_KEY)
                    .map_err(|e| BlobError::InvalidEndpoint {
                        endpoint: base.clone(),
                        reason: e.to_string(),
                    })?;
                vec![Arc::new(SharedKeyPolicy::new(key))]
            }
        };
        let http =
            crate::azure::tls::http_client(ca_bundles).map_err(|e| BlobError::InvalidEndpoint {
                endpoint: base.clone(),
                reason: format!("cannot build the HTTP client: {e}"),
            })?;
        let options = ClientOptions {
            // Our policy retries (see `retry`); the SDK's would retry again behind it.
            retry: RetryOptions::none(),
            transport: Some(Transport::new(http)),
            per_call_policies: vec![Arc::new(policy)],
            // The authorization step is the last before the transport: a Shared Key signature
            // covers every header set before it (and dates the request itself).
            per_try_policies: per_try,
            ..ClientOptions::default()
        };
        // No trailing slash: the SDK appends the container name as one more path segment.
        let service_url = url::Url::parse(&base).map_err(|e| BlobError::InvalidEndpoint {
            endpoint: base.clone(),
            reason: e.to_string(),
        })?;
        let service = BlobServiceClient::new(
            service_url,
            None,
            Some(BlobServiceClientOptions {
                client_options: options.clone(),
                ..BlobServiceClientOptions::default()
            }),
        )
        .map_err(|e| BlobError::InvalidEndpoint {
            endpoint: base.clone(),
            reason: e.to_string(),
        })?;
        Ok(StorageTarget {
            account,
            base,
            options,
            service: Arc::new(service),
        })
    }

    /// A client for one container of the account.
    pub fn container(&self, name: &str) -> Container {
        Container {
            target: self.clone(),
            name: name.to_string(),
            client: Arc::new(self.service.blob_container_client(name)),
        }
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
