//! From global flags to live clients: settings, credential, the ARM adapter, storage, the
//! cross-host lock and the gallery service. Every command that talks to Azure starts here.

use std::sync::Arc;
use std::time::Duration;

use azure_core::auth::TokenCredential;

use crate::azure::arm::{ArmGallery, ArmOptions};
use crate::azure::blob::{RetrySettings, StorageAuth, StorageTarget, STEMCELL_CONTAINER};
use crate::azure::lock::{Claim, LeaseLock};
use crate::cli::GlobalArgs;
use crate::config::{AuthKind, Settings};
use crate::gallery::error::{Error, Result};
use crate::gallery::lock::{Handover, Held, Intent, Locks, Withdrawal};
use crate::gallery::service::{GalleryService, Location};
use crate::gallery::GalleryRef;

/// Environment variable: retries of one blob request (default 6).
pub use crate::config::BLOB_RETRIES_ENV;

/// How long a writer waits for another host's lock on the same version (or upload) before
/// giving up, unless [`LOCK_WAIT_ENV`] says otherwise.
pub const LOCK_WAIT: Duration = Duration::from_secs(600);

/// Environment variable: seconds a writer waits for another process's lock (default 600).
pub const LOCK_WAIT_ENV: &str = "STEMCELL_GALLERY_LOCK_WAIT";

/// Environment variable: `0` (or `off`) turns off the group commit of reference writes (every
/// writer then takes the version's lock and writes itself, as before issue 15); for comparison.
pub const COALESCE_ENV: &str = "STEMCELL_GALLERY_COALESCE";

/// The lock wait: [`LOCK_WAIT_ENV`], else [`LOCK_WAIT`].
pub fn lock_wait() -> anyhow::Result<Duration> {
    Ok(crate::azure::arm::env_seconds(LOCK_WAIT_ENV)?.unwrap_or(LOCK_WAIT))
}

/// Whether reference writes are coalesced ([`COALESCE_ENV`]; on unless `0`/`off`/`false`).
pub fn coalesce_from_env() -> anyhow::Result<bool> {
    match std::env::var(COALESCE_ENV) {
        Err(_) => Ok(true),
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "1" | "on" | "true" => Ok(true),
            "0" | "off" | "false" => Ok(false),
            _ => anyhow::bail!("{COALESCE_ENV}={v:?} is not on or off (1/0)"),
        },
    }
}

pub struct Connected {
    pub settings: Settings,
    pub credential: Arc<dyn TokenCredential>,
    pub api: Arc<ArmGallery>,
    pub storage: Option<StorageTarget>,
    pub service: GalleryService,
    /// How long a writer waits for another process's lock.
    pub lock_wait: Duration,
    /// The storage account's resource id once resolved (one lookup per process).
    storage_account_id: tokio::sync::OnceCell<String>,
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

    /// The storage account's resource id, as a gallery version's source names it (Azure checks
    /// it names the uri's account, REFERENCE.md "Source of a version from a VHD"). Configured
    /// (`storage_account` with `storage_account_resource_group`): used as is. Otherwise the
    /// account is looked up in the gallery's subscription through ARM — never assumed to be in
    /// the gallery's resource group — once per process. `None` without a storage account.
    pub async fn storage_account_id(&self) -> anyhow::Result<Option<String>> {
        // The account the blobs go to (the blob endpoint's), else the configured name.
        let Some(account) = self
            .storage
            .as_ref()
            .map(|s| s.account_name().to_string())
            .or_else(|| self.settings.storage_account.clone())
        else {
            return Ok(None);
        };
        let subscription = self.settings.subscription.clone();
        if let Some(rg) = &self.settings.storage_account_resource_group {
            return Ok(Some(format!(
                "/subscriptions/{subscription}/resourceGroups/{rg}/providers/Microsoft.Storage/storageAccounts/{account}"
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
        token_scope: Some(crate::azure::auth::arm_scope(&settings).to_string()),
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
    let lock_wait = lock_wait()?;
    let coalesce = coalesce_from_env()?;
    let locks: Arc<dyn Locks> = match &storage {
        Some(s) => Arc::new(BlobLocks {
            container: s.container(STEMCELL_CONTAINER),
            wait: lock_wait,
            coalesce,
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
        lock_wait,
        storage_account_id: tokio::sync::OnceCell::new(),
    })
}

/// Cross-host locks: a blob lease on `locks/<gallery>/<definition>/<version>.lock` in the
/// stemcell container of the configured storage account.
/// With `coalesce`, a writer that finds a version's lock taken hands its reference over as an
/// intent blob `<lock blob>.pending/<uuid>` (see `azure::lock`, "Intents").
pub struct BlobLocks {
    pub container: azure_storage_blobs::prelude::ContainerClient,
    pub wait: Duration,
    pub coalesce: bool,
}

struct BlobHeld {
    guard: crate::azure::lock::LeaseGuard,
    /// Intents claimed by this holder, by id, until finished.
    claims: tokio::sync::Mutex<std::collections::HashMap<String, Claim>>,
    /// Unclaimed intents not refreshed for this long are dropped unapplied (their writer died).
    max_intent_age: Duration,
}

impl BlobHeld {
    fn new(guard: crate::azure::lock::LeaseGuard) -> Self {
        BlobHeld {
            guard,
            claims: Default::default(),
            max_intent_age: crate::azure::lock::INTENT_LIVENESS,
        }
    }
}

/// The lock layer's error as the service's, kept typed (see `azure::lock`'s `From`).
fn lock_error(e: crate::azure::lock::LockError) -> Error {
    e.into()
}

fn lock_container_error(e: crate::azure::blob::BlobError) -> Error {
    crate::azure::lock::LockError::Container {
        source: Box::new(e),
    }
    .into()
}

#[async_trait::async_trait]
impl Held for BlobHeld {
    async fn check(&self) -> Result<()> {
        self.guard.renew_now().await.map_err(lock_error)?;
        // The claims too: a write must not carry a reference whose waiter may have withdrawn it
        // (a claim that lapsed).
        for c in self.claims.lock().await.values() {
            c.renew().await.map_err(lock_error)?;
        }
        Ok(())
    }
    async fn carried(&self) -> Result<Vec<String>> {
        self.guard.read_carried().await.map_err(lock_error)
    }
    async fn set_carried(&self, refs: &[String]) -> Result<()> {
        self.guard.write_carried(refs).await.map_err(lock_error)
    }
    async fn claim_intents(&self) -> Result<Vec<Intent>> {
        let have: Vec<String> = self.claims.lock().await.keys().cloned().collect();
        let claims = self
            .guard
            .claim_intents(self.max_intent_age, &have)
            .await
            .map_err(lock_error)?;
        let mut out = Vec::new();
        let mut held = self.claims.lock().await;
        for c in claims {
            out.push(Intent {
                id: c.intent.name.clone(),
                reference: c.intent.reference.clone(),
            });
            held.insert(c.intent.name.clone(), c);
        }
        Ok(out)
    }
    async fn finish_intents(&self, ids: &[String]) -> Result<()> {
        let taken: Vec<Claim> = {
            let mut held = self.claims.lock().await;
            ids.iter().filter_map(|id| held.remove(id)).collect()
        };
        for c in taken {
            c.finish().await.map_err(lock_error)?;
        }
        Ok(())
    }
    async fn drop_intents_of(&self, reference: &str) -> Result<()> {
        self.guard
            .drop_intents_of(reference)
            .await
            .map_err(lock_error)
    }
    async fn discard_intent(&self, id: &str) -> Result<()> {
        self.guard.discard_intent(id).await.map_err(lock_error)
    }
    async fn release(self: Box<Self>) {
        let this = *self;
        // Unfinished claims are released with their guards (or simply expire).
        drop(this.claims);
        if let Err(e) = this.guard.release().await {
            tracing::warn!(error = %e, "could not release the lock; its lease expires by itself");
        }
    }
}

#[async_trait::async_trait]
impl Locks for BlobLocks {
    async fn acquire(&self, name: &str) -> Result<Box<dyn Held>> {
        crate::azure::blob::ensure_container(&self.container)
            .await
            .map_err(lock_container_error)?;
        let guard = LeaseLock::acquire(&self.container, name, self.wait)
            .await
            .map_err(lock_error)?;
        Ok(Box::new(BlobHeld::new(guard)))
    }

    fn handover(&self) -> Option<&dyn Handover> {
        self.coalesce.then_some(self as &dyn Handover)
    }
}

#[async_trait::async_trait]
impl Handover for BlobLocks {
    async fn try_acquire(&self, name: &str) -> Result<Option<Box<dyn Held>>> {
        crate::azure::blob::ensure_container(&self.container)
            .await
            .map_err(lock_container_error)?;
        Ok(LeaseLock::try_acquire(&self.container, name)
            .await
            .map_err(lock_error)?
            .map(|g| Box::new(BlobHeld::new(g)) as Box<dyn Held>))
    }
    async fn post(&self, name: &str, reference: &str) -> Result<String> {
        crate::azure::lock::post_intent(&self.container, name, reference)
            .await
            .map_err(lock_error)
    }
    async fn refresh(&self, id: &str, reference: &str) -> Result<bool> {
        use crate::azure::lock::IntentState;
        Ok(
            crate::azure::lock::refresh_intent(&self.container, id, reference)
                .await
                .map_err(lock_error)?
                != IntentState::Gone,
        )
    }
    async fn withdraw(&self, id: &str) -> Result<Withdrawal> {
        use crate::azure::lock::Withdrawal as W;
        Ok(
            match crate::azure::lock::withdraw_intent(&self.container, id)
                .await
                .map_err(lock_error)?
            {
                W::Withdrawn => Withdrawal::Withdrawn,
                W::Gone => Withdrawal::Gone,
                W::Claimed => Withdrawal::Claimed,
            },
        )
    }
    fn wait(&self) -> Duration {
        self.wait
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
