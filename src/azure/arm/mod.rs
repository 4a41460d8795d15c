//! `GalleryApi` over azure_mgmt_compute 0.21, in four parts:
//! - [`transport`]: HTTP send, the bearer token, and the one retry loop (429, 408, 5xx and
//!   connection failures, bounded exponential backoff with jitter, honouring `Retry-After`;
//!   what is retried is `gallery::Error::retryability`'s call);
//! - [`lro`]: the one poll loop for long-running operations: a write is sent once, then
//!   `Azure-AsyncOperation` is polled, else `Location`, else the resource's own
//!   `provisioningState`, within an overall timeout;
//! - [`wire`]: the JSON we send and the fields we read back;
//! - [`api`]: the `GalleryApi` implementation, and [`consumers`]: the consumer scan, the
//!   permissions proof and storage account ids.
//!
//! Every request goes through the SDK's generated builders with `.send()` (never the builders'
//! own long-running-operation loop, which re-sends PUTs and misreads provisioning states; see
//! REFERENCE.md). Errors keep Azure's code, target and message; a 409 becomes
//! `gallery::Error::Busy` and a 400 `gallery::Error::Rejected`.

use std::sync::Arc;
use std::time::Duration;

use azure_core_legacy::auth::TokenCredential;
use azure_mgmt_compute::package_2024_07_01::Client;

use crate::gallery::error::Result;
use crate::gallery::model::GalleryRef;

mod api;
mod consumers;
mod lro;
mod transport;
mod wire;

pub use consumers::STORAGE_API_VERSION;
pub use wire::{definition_body, definition_from_json, version_body, version_from_json};

/// Knobs for retries and waiting.
#[derive(Debug, Clone)]
pub struct ArmOptions {
    /// Retries of one request on transient failures.
    pub max_retries: u32,
    /// First backoff; doubles per retry, with jitter, capped at `max_backoff`.
    pub base_backoff: Duration,
    pub max_backoff: Duration,
    /// Timeout of one HTTP request.
    pub request_timeout: Duration,
    /// Overall time a long-running operation may take (replication can take an hour).
    pub operation_timeout: Duration,
    /// Poll interval when Azure gives no Retry-After.
    pub poll_interval: Duration,
    /// Extra CA certificates to trust (settings `ca_bundles`).
    pub ca_bundles: Vec<crate::azure::tls::CaBundle>,
    /// The scope ARM tokens are asked for: the settings' `token_scope` (the configured cloud's
    /// audience, e.g. Azure Stack's `https://management.adfs.azurestack.local/<id>`, which is not
    /// the ARM endpoint). `None` only where no settings exist (tests): the endpoint's `.default`.
    pub token_scope: Option<String>,
}

impl Default for ArmOptions {
    fn default() -> Self {
        Self {
            max_retries: 6,
            base_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            request_timeout: Duration::from_secs(60),
            operation_timeout: Duration::from_secs(60 * 60),
            poll_interval: Duration::from_secs(5),
            ca_bundles: Vec::new(),
            token_scope: None,
        }
    }
}

/// The knobs' variables live with the settings (`config::Tuning`); named here in messages.
pub use crate::config::{HTTP_TIMEOUT_ENV, OPERATION_TIMEOUT_ENV};

/// The ARM adapter for one gallery.
pub struct ArmGallery {
    client: Client,
    /// The ARM endpoint (for calls made without the SDK, such as the permissions list).
    endpoint: url::Url,
    transport: transport::Transport,
    gallery: GalleryRef,
    opts: ArmOptions,
    /// Subscriptions besides the gallery's whose consumers are read.
    consumer_subscriptions: Vec<String>,
}

impl ArmGallery {
    pub fn new(
        endpoint: &url::Url,
        credential: Arc<dyn TokenCredential>,
        gallery: GalleryRef,
        opts: ArmOptions,
    ) -> anyhow::Result<Self> {
        let (transport, client) = transport::Transport::new(endpoint, credential, &opts)?;
        Ok(Self {
            client,
            endpoint: endpoint.clone(),
            transport,
            gallery,
            opts,
            consumer_subscriptions: Vec::new(),
        })
    }

    pub fn gallery(&self) -> &GalleryRef {
        &self.gallery
    }

    /// Set the subscriptions, besides the gallery's own, whose VMs, scale sets and disks are
    /// read as consumers (validated subscription ids, from `Settings`).
    pub fn with_consumer_subscriptions(mut self, subscriptions: Vec<String>) -> Self {
        self.consumer_subscriptions = subscriptions;
        self
    }

    /// The gallery's subscription first, then the configured ones, each once.
    pub fn consumer_scopes(&self) -> Vec<String> {
        let mut scopes = vec![self.gallery.subscription.clone()];
        for s in &self.consumer_subscriptions {
            if !scopes.iter().any(|x| x.eq_ignore_ascii_case(s)) {
                scopes.push(s.clone());
            }
        }
        scopes
    }

    /// One SDK request with the retry policy, re-sent after a transient failure. `f` builds and
    /// sends the request afresh.
    async fn call<T, F, Fut>(&self, operation: &'static str, resource: &str, f: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = azure_core_legacy::Result<T>>,
    {
        self.transport
            .call(
                operation,
                resource,
                transport::Resend::AfterTransientFailure,
                f,
            )
            .await
    }
}
