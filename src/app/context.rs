//! The application context: from resolved [`Settings`] to live clients (credential, the ARM
//! adapter, storage, the cross-host locks and the gallery service). Every use case, whichever
//! front end calls it (the CLI, the CPI, the tests), starts from a [`Connected`].

use std::sync::Arc;
use std::time::Duration;

use crate::app::blob_store::BlobStore;
use crate::azure::arm::{ArmGallery, ArmOptions};
use crate::azure::auth::Credential;
use crate::azure::blob::{RetrySettings, StorageAuth, StorageTarget, STEMCELL_CONTAINER};
use crate::azure::gallery_locks::{BlobLocks, NoLocks};
use crate::azure::stemcell_store::StemcellStore;
use crate::config::{AuthKind, Settings};
use crate::gallery::lock::{Locks, LoggedLocks};
use crate::gallery::service::{GalleryService, Location};
use crate::gallery::GalleryRef;

pub struct Connected {
    pub settings: Settings,
    pub credential: Credential,
    pub api: Arc<ArmGallery>,
    pub service: GalleryService,
    /// The storage account's resource id once resolved (one lookup per process).
    storage_account_id: tokio::sync::OnceCell<String>,
    /// The stemcell blobs of the storage account (the `BlobStore` port's adapter, which holds
    /// the account's target), when one is configured.
    store: Option<StemcellStore>,
}

impl Connected {
    /// The storage account, when one is configured.
    pub fn storage(&self) -> Option<&StorageTarget> {
        self.store.as_ref().map(StemcellStore::target)
    }

    /// The stemcell store, or an error saying why this command needs a storage account.
    fn store(&self, why: &str) -> anyhow::Result<&StemcellStore> {
        self.store.as_ref().ok_or_else(|| {
            anyhow::anyhow!(
                "{why} needs a storage account: pass --blob-endpoint https://ACCOUNT.blob.core.windows.net (or set storage_account in the config file)"
            )
        })
    }

    /// The storage account, or an error saying why this command needs one.
    pub fn require_storage(&self, why: &str) -> anyhow::Result<&StorageTarget> {
        Ok(self.store(why)?.target())
    }

    /// The stemcell blob store of the storage account, or an error saying why this command needs
    /// one (as [`Connected::require_storage`]).
    pub fn blob_store(&self, why: &str) -> anyhow::Result<&dyn BlobStore> {
        Ok(self.store(why)?)
    }

    /// The storage account's resource id, as a gallery version's source names it (Azure checks
    /// it names the uri's account, REFERENCE.md "Source of a version from a VHD"). Configured
    /// (`storage_account` with `storage_account_resource_group`): used as is. Otherwise the
    /// account is looked up in the gallery's subscription through ARM — never assumed to be in
    /// the gallery's resource group — once per process. `None` without a storage account.
    pub async fn storage_account_id(&self) -> anyhow::Result<Option<String>> {
        // The account the blobs go to (the blob endpoint's), else the configured name.
        let Some(account) = self
            .storage()
            .map(|s| s.account_name().to_string())
            .or_else(|| self.settings.storage_account.clone())
        else {
            return Ok(None);
        };
        let subscription = self.settings.subscription.clone();
        if let Some(rg) = &self.settings.storage_account_resource_group {
            return Ok(Some(crate::names::storage_account_id(
                &subscription,
                rg,
                &account,
            )));
        }
        let id = self
            .storage_account_id
            .get_or_try_init(|| async {
                match self.api.find_storage_account(&subscription, &account).await {
                    Ok(Some(id)) => Ok(id),
                    Ok(None) => Err(anyhow::Error::new(StorageAccountNotFound {
                        account: account.clone(),
                        subscription: subscription.clone(),
                    })),
                    Err(e) => Err(anyhow::Error::new(e).context(format!(
                        "cannot look up storage account {account} in subscription {subscription} \
                         (set storage_account_resource_group in the config file to skip the lookup)"
                    ))),
                }
            })
            .await?;
        Ok(Some(id.clone()))
    }
}

/// The configured storage account is not in the gallery's subscription (or the identity may not
/// read it there).
#[derive(Debug, thiserror::Error)]
#[error(
    "storage account {account} not found in subscription {subscription}; set \
     storage_account_resource_group in the config file (or pass --storage-account-id to ensure), or \
     grant the identity Microsoft.Storage/storageAccounts/read on the account \
     (deploy/azure/role-definition.json)"
)]
pub struct StorageAccountNotFound {
    pub account: String,
    pub subscription: String,
}

/// Build every client from resolved settings. No request is sent here.
pub fn connect(settings: Settings) -> anyhow::Result<Connected> {
    let credential = crate::azure::auth::credential(&settings)?;
    let gallery = GalleryRef {
        subscription: settings.subscription.clone(),
        resource_group: settings.resource_group.clone(),
        gallery: settings.gallery.clone(),
    };
    let mut opts = ArmOptions {
        ca_bundles: settings.ca_bundles.clone(),
        token_scope: Some(crate::azure::auth::arm_scope(&settings).to_string()),
        ..ArmOptions::default()
    };
    // Retries of one ARM request on throttling and transient failures (default 6), validated
    // with the settings.
    let tuning = &settings.tuning;
    if let Some(n) = tuning.arm_retries {
        opts.max_retries = n;
    }
    // One HTTP request's timeout (ARM requests, and each attempt of a blob request).
    let http_timeout = tuning.http_timeout;
    if let Some(t) = http_timeout {
        opts.request_timeout = t;
    }
    // How long a long-running operation (and replication) may take (default an hour).
    if let Some(t) = tuning.operation_timeout {
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
            if let Some(n) = tuning.blob_retries {
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
        // Waits are reported at INFO while they last, so a command standing still says why.
        Some(s) => Arc::new(LoggedLocks::new(
            Arc::new(BlobLocks::new(
                s.container(STEMCELL_CONTAINER),
                tuning.lock_wait,
                tuning.coalesce,
            )),
            tuning.lock_wait,
        )),
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
        service,
        storage_account_id: tokio::sync::OnceCell::new(),
        store: storage.map(StemcellStore::new),
    })
}
