//! The application context: from resolved [`Settings`] to live clients (credential, the ARM
//! adapter, storage, the cross-host locks and the gallery service). Every use case, whichever
//! front end calls it (the CLI, the CPI, the tests), is `app::<case>(&Context, request)`: the one
//! [`Context`], built by [`connect`] over Azure (or the emulator), or by [`Context::in_memory`]
//! over in-memory fakes of the ports (unit tests and the fake-backed scenarios).

use std::sync::Arc;
use std::time::Duration;

use crate::azure::arm::{ArmGallery, ArmOptions};
use crate::azure::blob::{RetrySettings, StorageAuth, StorageTarget, STEMCELL_CONTAINER};
use crate::azure::gallery_locks::{BlobLocks, NoLocks};
use crate::azure::stemcell_store::StemcellStore;
use crate::config::{AuthKind, Settings};
use crate::gallery::api::StorageAccounts;
use crate::gallery::blob_store::BlobStore;
use crate::gallery::lock::{Locks, LoggedLocks};
use crate::gallery::service::{GalleryService, Location};
use crate::gallery::GalleryRef;

/// One process, one async runtime (the binary): the adapters share one HTTP client per set of
/// trusted certificates from now on.
pub fn share_http_clients() {
    crate::azure::tls::share_clients();
}

/// Whose clock the grace period of a cleanup is measured on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// Azure's, as the `Date` header of its answers shows it (`GalleryApi::server_time`): a
    /// host whose clock is off cannot make a young version old. No `Date` seen: no age is known.
    Azure,
    /// A fixed instant (tests with in-memory fakes).
    Fixed(time::OffsetDateTime),
}

/// What every use case runs in: the settings, the gallery service (the `GalleryApi` port and the
/// locks), the blob store, and the clock.
pub struct Context {
    pub settings: Settings,
    pub service: GalleryService,
    /// Whose clock ages are measured on.
    pub clock: Clock,
    /// Where the storage account's id is looked up (ARM); `None` in memory.
    accounts: Option<Arc<dyn StorageAccounts>>,
    /// The storage account's resource id once resolved (one lookup per process).
    storage_account_id: tokio::sync::OnceCell<String>,
    /// The stemcell blobs of the storage account (the `BlobStore` port), when one is configured.
    store: Option<Arc<dyn BlobStore>>,
}

impl Context {
    /// A context over in-memory fakes of the ports: `service` over a fake `GalleryApi` and
    /// locks, `store` a fake blob store (or none), ages on `clock`, and the storage account's
    /// id known up front. The settings name the service's gallery (emulator auth, defaults
    /// otherwise); nothing of Azure is reachable from it.
    pub fn in_memory(
        service: GalleryService,
        store: Option<Arc<dyn BlobStore>>,
        clock: Clock,
        storage_account_id: Option<String>,
    ) -> anyhow::Result<Context> {
        let g = service.gallery().clone();
        let settings = Settings::from_layer(
            crate::config::Layer {
                subscription: Some(g.subscription),
                resource_group: Some(g.resource_group),
                gallery: Some(g.gallery),
                auth: Some(AuthKind::Emulator.as_str().to_string()),
                // Loopback, as emulator auth requires; never dialled (no ARM adapter here).
                arm_endpoint: Some("http://127.0.0.1:9".to_string()),
                ..Default::default()
            },
            None,
        )?;
        Ok(Context {
            settings,
            service,
            clock,
            accounts: None,
            storage_account_id: match storage_account_id {
                Some(id) => tokio::sync::OnceCell::new_with(Some(id)),
                None => tokio::sync::OnceCell::new(),
            },
            store,
        })
    }

    /// The stemcell blobs of the storage account (the `BlobStore` port), when one is configured.
    pub fn storage(&self) -> Option<&dyn BlobStore> {
        self.store.as_deref()
    }

    /// The stemcell blob store of the storage account, or an error saying why this command needs
    /// one.
    pub fn blob_store(&self, why: &str) -> anyhow::Result<&dyn BlobStore> {
        self.store.as_deref().ok_or_else(|| needs_storage(why))
    }

    /// [`Context::blob_store`], shared (for a part of a use case that keeps it).
    pub fn blob_store_shared(&self, why: &str) -> anyhow::Result<Arc<dyn BlobStore>> {
        self.store.clone().ok_or_else(|| needs_storage(why))
    }

    /// How long a writer waits for another process's lock.
    pub fn lock_wait(&self) -> Duration {
        self.settings.tuning.lock_wait
    }

    /// The storage account's resource id, as a gallery version's source names it (Azure checks
    /// it names the uri's account, REFERENCE.md "Source of a version from a VHD"). Configured
    /// (`storage_account` with `storage_account_resource_group`): used as is. Otherwise the
    /// account is looked up in the gallery's subscription through ARM — never assumed to be in
    /// the gallery's resource group — once per process. `None` without a storage account.
    pub async fn storage_account_id(&self) -> anyhow::Result<Option<String>> {
        // Known already: looked up once before, or given up front (in memory).
        if let Some(id) = self.storage_account_id.get() {
            return Ok(Some(id.clone()));
        }
        // The account the blobs go to (the blob endpoint's), else the configured name.
        let Some(account) = self
            .storage()
            .map(|s| s.account().to_string())
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
        let Some(accounts) = &self.accounts else {
            return Ok(None);
        };
        let id = self
            .storage_account_id
            .get_or_try_init(|| async {
                match accounts.find_storage_account(&subscription, &account).await {
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

fn needs_storage(why: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{why} needs a storage account: pass --blob-endpoint https://ACCOUNT.blob.core.windows.net (or set storage_account in the config file)"
    )
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

/// Exit 1 (not 3: the command's subject is not what is missing); the same until the settings or
/// the role change.
impl crate::error::Classified for StorageAccountNotFound {
    fn class(&self) -> crate::error::Class {
        crate::error::Class::Permanent
    }
}

/// Build every client from resolved settings. No request is sent here.
pub fn connect(settings: Settings) -> anyhow::Result<Context> {
    let credential = crate::azure::auth::credential(&settings.credentials())?;
    let gallery = GalleryRef {
        subscription: settings.subscription.clone(),
        resource_group: settings.resource_group.clone(),
        gallery: settings.gallery.clone(),
    };
    let mut opts = ArmOptions {
        ca_bundles: settings.ca_bundles.clone(),
        token_scope: Some(settings.token_scope.clone()),
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
            Arc::new(
                BlobLocks::new(
                    s.container(STEMCELL_CONTAINER),
                    tuning.lock_wait,
                    tuning.coalesce,
                )
                .with_legacy_gallery(&gallery.gallery),
            ),
            tuning.lock_wait,
        )),
        None => Arc::new(NoLocks),
    };
    let location = match &settings.location {
        Some(l) => Location::Configured(l.clone()),
        None => Location::OfGallery(api.clone()),
    };
    let service = GalleryService::with_location(api.clone(), locks, gallery, location);
    Ok(Context {
        settings,
        service,
        clock: Clock::Azure,
        accounts: Some(api),
        storage_account_id: tokio::sync::OnceCell::new(),
        store: storage.map(|s| Arc::new(StemcellStore::new(s)) as Arc<dyn BlobStore>),
    })
}
