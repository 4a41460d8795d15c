//! From global flags to live clients: settings, credential, the ARM adapter, storage, the
//! cross-host lock and the gallery service. Every command that talks to Azure starts here.

use std::sync::Arc;
use std::time::Duration;

use azure_core::auth::TokenCredential;

use crate::azure::arm::{ArmGallery, ArmOptions};
use crate::azure::blob::{RetrySettings, StorageAuth, StorageTarget, STEMCELL_CONTAINER};
use crate::azure::lock::LeaseLock;
use crate::cli::GlobalArgs;
use crate::config::{AuthKind, Settings};
use crate::gallery::error::{Error, Result};
use crate::gallery::lock::{Held, Locks};
use crate::gallery::service::{GalleryService, Location};
use crate::gallery::GalleryRef;

/// Environment variable: retries of one blob request (default 6).
pub use crate::config::BLOB_RETRIES_ENV;

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
    let mut opts = ArmOptions {
        ca_bundles: settings.ca_bundles.clone(),
        ..ArmOptions::default()
    };
    // Retries of one ARM request on throttling and transient failures (default 6), validated
    // with the settings.
    if let Some(n) = settings.arm_retries {
        opts.max_retries = n;
    }
    // One HTTP request's timeout (ARM requests, and each attempt of a blob request).
    let http_timeout = crate::azure::arm::env_seconds(crate::azure::arm::HTTP_TIMEOUT_ENV)?;
    if let Some(t) = http_timeout {
        opts.request_timeout = t;
    }
    // How long a long-running operation (and replication) may take (default an hour).
    if let Some(t) = crate::azure::arm::env_seconds(crate::azure::arm::OPERATION_TIMEOUT_ENV)? {
        opts.operation_timeout = t;
    }
    if settings.auth == AuthKind::Emulator {
        // The emulator answers long-running operations in a poll or two and says Retry-After: 0.
        opts.poll_interval = Duration::from_millis(100);
    }
    let api = Arc::new(
        ArmGallery::new(
            &settings.arm_endpoint,
            credential.clone(),
            gallery.clone(),
            opts,
        )?
        .with_consumer_subscriptions(settings.consumer_subscriptions.clone()),
    );
    let storage = match &settings.blob_endpoint {
        Some(url) => {
            let auth = match settings.auth {
                AuthKind::Emulator => StorageAuth::DevelopmentKey,
                _ => StorageAuth::Token(credential.clone()),
            };
            let mut retry = RetrySettings::default();
            // Retries of one blob request on throttling and transient failures (default 6).
            if let Some(n) = settings.blob_retries {
                retry.max_retries = n;
            }
            if let Some(t) = http_timeout {
                retry.attempt_timeout = t;
            }
            Some(StorageTarget::with_options(
                url,
                auth,
                retry,
                &settings.ca_bundles,
            )?)
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
        None => Location::OfGallery(api.clone()),
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
    async fn check(&self) -> Result<()> {
        self.0
            .renew_now()
            .await
            .map_err(|e| Error::Lock(e.to_string()))
    }
    async fn carried(&self) -> Result<Vec<String>> {
        self.0
            .read_carried()
            .await
            .map_err(|e| Error::Lock(e.to_string()))
    }
    async fn set_carried(&self, refs: &[String]) -> Result<()> {
        self.0
            .write_carried(refs)
            .await
            .map_err(|e| Error::Lock(e.to_string()))
    }
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
