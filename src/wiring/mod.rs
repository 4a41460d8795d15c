//! The composition root, above the application floor: from resolved settings to the adapters
//! that implement the ports (`connect`), the preflight checks of those adapters (`doctor`), and
//! the reading of an error chain, whose table names every typed error, the adapters' included
//! (`failure`). The front ends call it; the application floor and the domain never do, so they
//! name no adapter (the architecture test checks it).

pub mod doctor;
pub mod failure;

use std::sync::Arc;
use std::time::Duration;

use crate::app::Context;
use crate::azure::arm::{ArmGallery, ArmOptions};
use crate::azure::blob::{RetrySettings, StorageAuth, StorageTarget, STEMCELL_CONTAINER};
use crate::azure::gallery_locks::{BlobLocks, NoLocks};
use crate::azure::stemcell_store::StemcellStore;
use crate::config::{AuthKind, Settings};
use crate::gallery::blob_store::BlobStore;
use crate::gallery::lock::{Locks, LoggedLocks};
use crate::gallery::service::{GalleryService, Location};
use crate::gallery::GalleryRef;

/// One process, one async runtime (the binary): the adapters share one HTTP client per set of
/// trusted certificates from now on.
pub fn share_http_clients() {
    crate::azure::tls::share_clients();
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
        .with_consumer_subscriptions(settings.consumer_subscriptions.clone())
        .with_protection(settings.protect_held_versions),
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
    let store = storage.map(|s| Arc::new(StemcellStore::new(s)) as Arc<dyn BlobStore>);
    Ok(Context::over(settings, service, api, store))
}
