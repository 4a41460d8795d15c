//! From global flags to live clients: settings, credential, the ARM adapter, storage, the
//! cross-host lock and the gallery service. Every command that talks to Azure starts here.

use std::sync::Arc;
use std::time::Duration;

use azure_core::auth::TokenCredential;

use crate::azure::arm::{ArmGallery, ArmOptions};
use crate::azure::blob::{StorageAuth, StorageTarget, STEMCELL_CONTAINER};
use crate::azure::lock::LeaseLock;
use crate::cli::GlobalArgs;
use crate::config::{AuthKind, Settings};
use crate::gallery::error::{Error, Result};
use crate::gallery::lock::{Held, Locks};
use crate::gallery::service::{GalleryLocation, GalleryService, Location};
use crate::gallery::GalleryRef;

/// How long a writer waits for another host's lock on the same version before giving up.
pub const LOCK_WAIT: Duration = Duration::from_secs(600);

pub struct Connected {
    pub settings: Settings,
    pub credential: Arc<dyn TokenCredential>,
    pub api: Arc<ArmGallery>,
    pub storage: Option<StorageTarget>,
    pub service: GalleryService,
}

impl Connected {
    /// The storage account, or an error saying why this command needs one.
    pub fn require_storage(&self, why: &str) -> anyhow::Result<&StorageTarget> {
        self.storage.as_ref().ok_or_else(|| {
            anyhow::anyhow!(
                "{why} needs a storage account: pass --blob-endpoint https://ACCOUNT.blob.core.windows.net (or set storage_account in the config file)"
            )
        })
    }

    /// The storage account's resource id, as a gallery version's source names it.
    pub fn storage_account_id(&self) -> Option<String> {
        self.settings.storage_account_id().or_else(|| {
            self.storage.as_ref().map(|s| {
                format!(
                    "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Storage/storageAccounts/{}",
                    self.settings.subscription,
                    self.settings
                        .storage_account_resource_group
                        .as_deref()
                        .unwrap_or(&self.settings.resource_group),
                    s.account_name()
                )
            })
        })
    }
}

/// Resolve settings and build every client. No request is sent here.
pub fn connect(global: &GlobalArgs) -> anyhow::Result<Connected> {
    let settings = Settings::resolve(global)?;
    let credential = crate::azure::auth::credential(&settings)?;
    let gallery = GalleryRef {
        subscription: settings.subscription.clone(),
        resource_group: settings.resource_group.clone(),
        gallery: settings.gallery.clone(),
    };
    let mut opts = ArmOptions::default();
    // Retries of one ARM request on throttling and transient failures (default 6).
    if let Some(n) = std::env::var("STEMCELL_GALLERY_ARM_RETRIES")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
    {
        opts.max_retries = n.min(20);
    }
    if settings.auth == AuthKind::Emulator {
        // The emulator answers long-running operations in a poll or two and says Retry-After: 0.
        opts.poll_interval = Duration::from_millis(100);
    }
    let api = Arc::new(ArmGallery::new(
        &settings.arm_endpoint,
        credential.clone(),
        gallery.clone(),
        opts,
    )?);
    let storage = match &settings.blob_endpoint {
        Some(url) => {
            let auth = match settings.auth {
                AuthKind::Emulator => StorageAuth::DevelopmentKey,
                _ => StorageAuth::Token(credential.clone()),
            };
            Some(StorageTarget::new(url, auth)?)
        }
        None => None,
    };
    let locks: Arc<dyn Locks> = match &storage {
        Some(s) => Arc::new(BlobLocks {
            container: s.container(STEMCELL_CONTAINER),
            wait: LOCK_WAIT,
        }),
        None => Arc::new(NoLocks),
    };
    let location = match &settings.location {
        Some(l) => Location::Configured(l.clone()),
        None => Location::OfGallery(Arc::new(GalleryReader::new(
            &settings,
            credential.clone(),
            gallery.clone(),
        ))),
    };
    let service = GalleryService::with_location(api.clone(), locks, gallery, location);
    Ok(Connected {
        settings,
        credential,
        api,
        storage,
        service,
    })
}

/// Cross-host locks: a blob lease on `locks/<gallery>/<definition>/<version>.lock` in the
/// stemcell container of the configured storage account.
pub struct BlobLocks {
    pub container: azure_storage_blobs::prelude::ContainerClient,
    pub wait: Duration,
}

struct BlobHeld(crate::azure::lock::LeaseGuard);

#[async_trait::async_trait]
impl Held for BlobHeld {
    async fn release(self: Box<Self>) {
        if let Err(e) = self.0.release().await {
            tracing::warn!(error = %e, "could not release the lock; its lease expires by itself");
        }
    }
}

#[async_trait::async_trait]
impl Locks for BlobLocks {
    async fn acquire(&self, name: &str) -> Result<Box<dyn Held>> {
        crate::azure::blob::ensure_container(&self.container)
            .await
            .map_err(|e| Error::Lock(format!("cannot prepare the lock container: {e}")))?;
        let guard = LeaseLock::acquire(&self.container, name, self.wait)
            .await
            .map_err(|e| Error::Lock(e.to_string()))?;
        Ok(Box::new(BlobHeld(guard)))
    }
}

/// Without a storage account there is no cross-host lock, and so no writes.
struct NoLocks;

#[async_trait::async_trait]
impl Locks for NoLocks {
    async fn acquire(&self, _name: &str) -> Result<Box<dyn Held>> {
        Err(Error::Invalid(
            "writing to the gallery needs the storage account that holds its cross-host locks: pass --blob-endpoint https://ACCOUNT.blob.core.windows.net (or set storage_account in the config file)".into(),
        ))
    }
}

/// Reads the gallery resource itself (one GET, `Microsoft.Compute/galleries/read`): its region is
/// where new definitions and versions go when no location is configured.
pub struct GalleryReader {
    url: String,
    scope: String,
    credential: Arc<dyn TokenCredential>,
    gallery: GalleryRef,
    http: reqwest::Client,
}

/// The gallery API version (DESIGN §5).
const GALLERY_API_VERSION: &str = "2023-07-03";

impl GalleryReader {
    pub fn new(
        settings: &Settings,
        credential: Arc<dyn TokenCredential>,
        gallery: GalleryRef,
    ) -> Self {
        let url = format!(
            "{}{}?api-version={GALLERY_API_VERSION}",
            settings.arm_endpoint.as_str().trim_end_matches('/'),
            gallery.id()
        );
        Self {
            url,
            scope: crate::azure::auth::arm_scope(settings).to_string(),
            credential,
            gallery,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .connect_timeout(Duration::from_secs(15))
                .build()
                .unwrap_or_default(),
        }
    }

    /// The gallery's JSON; `None` when it does not exist. Transient failures (connection, 408,
    /// 429, 5xx) are retried a few times.
    pub async fn read(&self) -> Result<Option<serde_json::Value>> {
        let resource = self.gallery.id();
        let mut attempt = 0u32;
        loop {
            let token = self
                .credential
                .get_token(&[self.scope.as_str()])
                .await
                .map_err(|e| Error::Transport {
                    operation: "read",
                    resource: resource.clone(),
                    message: format!("could not get a token: {e}"),
                })?;
            let sent = self
                .http
                .get(&self.url)
                .bearer_auth(token.token.secret())
                .send()
                .await;
            let err = match sent {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let body: serde_json::Value = resp.json().await.unwrap_or_default();
                    match status {
                        200..=299 => return Ok(Some(body)),
                        404 => return Ok(None),
                        _ => Error::Azure {
                            operation: "read",
                            resource: resource.clone(),
                            azure: crate::gallery::error::AzureError {
                                status,
                                code: body["error"]["code"]
                                    .as_str()
                                    .unwrap_or("Unknown")
                                    .to_string(),
                                message: body["error"]["message"]
                                    .as_str()
                                    .unwrap_or_default()
                                    .to_string(),
                                target: None,
                            },
                        },
                    }
                }
                Err(e) => Error::Transport {
                    operation: "read",
                    resource: resource.clone(),
                    message: e.to_string(),
                },
            };
            if !err.is_transient() || attempt >= 3 {
                return Err(err);
            }
            attempt += 1;
            tokio::time::sleep(Duration::from_millis(500 * 2u64.pow(attempt))).await;
        }
    }
}

#[async_trait::async_trait]
impl GalleryLocation for GalleryReader {
    async fn gallery_location(&self) -> Result<String> {
        let id = self.gallery.id();
        let gallery = self.read().await?.ok_or_else(|| {
            Error::NotFound(format!(
                "gallery {id} does not exist: create it (az sig create), or fix --subscription/--resource-group/--gallery"
            ))
        })?;
        gallery["location"]
            .as_str()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                Error::Invalid(format!(
                    "gallery {id} reports no location, and none is configured: pass --location REGION (or set location in the config file)"
                ))
            })
    }
}
