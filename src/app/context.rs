//! The application context: the settings and the ports every use case runs over (the gallery
//! service over `GalleryApi` and the locks, the `BlobStore`, the `StorageAccounts` lookup, the
//! clock). Every use case, whichever front end calls it (the CLI, the CPI, the tests), is
//! `app::<case>(&Context, request)`: the one [`Context`], built by `wiring::connect` over Azure
//! (or the emulator), or by [`Context::in_memory`] over in-memory fakes of the ports (unit tests
//! and the fake-backed scenarios). Nothing here names an adapter.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{AuthKind, Settings};
use crate::gallery::api::StorageAccounts;
use crate::gallery::blob_store::BlobStore;
use crate::gallery::service::GalleryService;

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

    /// A context over a gallery API alone (a fake, in-process locks, no storage account), the
    /// gallery `stemcells` of resource group `bosh-rg`, with the clock at `now`: cleanup's
    /// scenarios over a fake gallery.
    pub fn over_gallery_api(
        api: Arc<dyn crate::gallery::GalleryApi>,
        now: time::OffsetDateTime,
    ) -> anyhow::Result<Context> {
        let gallery = crate::gallery::GalleryRef {
            subscription: "00000000-0000-0000-0000-000000000000".into(),
            resource_group: "bosh-rg".into(),
            gallery: "stemcells".into(),
        };
        let service = GalleryService::new(
            api,
            Arc::new(crate::gallery::lock::LocalLocks::default()),
            gallery,
            "westeurope",
        );
        Context::in_memory(service, None, Clock::Fixed(now), None)
    }

    /// A context over the ports the composition root (`wiring::connect`) built: ages on Azure's
    /// clock, the storage account's id looked up through `accounts` once when needed.
    pub fn over(
        settings: Settings,
        service: GalleryService,
        accounts: Arc<dyn StorageAccounts>,
        store: Option<Arc<dyn BlobStore>>,
    ) -> Context {
        Context {
            settings,
            service,
            clock: Clock::Azure,
            accounts: Some(accounts),
            storage_account_id: tokio::sync::OnceCell::new(),
            store,
        }
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
