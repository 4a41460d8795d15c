//! `GalleryApi` over ARM's REST API, sent through an azure_core 1.x pipeline, in four parts:
//! - [`transport`]: the pipeline (HTTP send, the bearer token), and the one retry loop (429, 408, 5xx and
//!   connection failures, bounded exponential backoff with jitter, honouring `Retry-After`;
//!   what is retried is `gallery::Error::retryability`'s call);
//! - [`lro`]: the one poll loop for long-running operations: a write is sent once, then
//!   `Azure-AsyncOperation` is polled, else `Location`, else the resource's own
//!   `provisioningState`, within an overall timeout;
//! - [`wire`]: typed bodies for exactly the fields we send and read, and the api-versions;
//! - [`api`]: the `GalleryApi` implementation, and [`consumers`]: the consumer scan, the
//!   permissions proof and storage account ids.
//!
//! There is no supported compute-management crate on the 1.x line yet
//! (`azure_resourcemanager_compute` is a placeholder), so the calls are written here against
//! the REST spec; that crate replaces `wire` once Microsoft publishes it. A write is sent once
//! and followed by `lro` (never a generic long-running-operation loop, which re-sends PUTs and
//! misreads provisioning states; see REFERENCE.md). Errors keep Azure's code, target and
//! message; a 409 becomes `gallery::Error::Busy` and a 400 `gallery::Error::Rejected`.

use std::time::Duration;

use azure_core::http::Method;
use serde::de::DeserializeOwned;

use crate::azure::credential::Credential;
use crate::gallery::error::Result;
use crate::gallery::model::GalleryRef;
use transport::{Call, NotFound, Reply, Resend};

mod api;
mod consumers;
mod locks;
mod lro;
mod transport;
mod wire;

pub use consumers::STORAGE_API_VERSION;

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
    pub ca_bundles: Vec<crate::access::CaBundle>,
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

/// The ARM adapter for one gallery.
pub struct ArmGallery {
    /// The ARM endpoint.
    endpoint: url::Url,
    transport: transport::Transport,
    gallery: GalleryRef,
    opts: ArmOptions,
    /// Subscriptions besides the gallery's whose consumers are read.
    consumer_subscriptions: Vec<String>,
    /// Whether held versions get a delete lock in this run (`gallery::protect`).
    protection: crate::gallery::protect::Protection,
}

impl ArmGallery {
    pub fn new(
        endpoint: &url::Url,
        credential: Credential,
        gallery: GalleryRef,
        opts: ArmOptions,
    ) -> anyhow::Result<Self> {
        let transport = transport::Transport::new(endpoint, credential, &opts)?;
        Ok(Self {
            endpoint: endpoint.clone(),
            transport,
            gallery,
            opts,
            consumer_subscriptions: Vec::new(),
            protection: crate::gallery::protect::Protection::default(),
        })
    }

    /// Whether held versions get a delete lock (the `protect_held_versions` setting; on by
    /// default).
    pub fn with_protection(mut self, protect_held_versions: bool) -> Self {
        self.protection = crate::gallery::protect::Protection::new(protect_held_versions);
        self
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

    /// The absolute URL of `path` on the ARM endpoint with `api-version` and `query` (built as
    /// the 0.21 SDK built it: the endpoint's path replaced, the query form-encoded).
    fn url(&self, path: &str, api_version: &str, query: &[(&str, &str)]) -> String {
        let mut url = self.endpoint.clone();
        url.set_path(path);
        {
            let mut pairs = url.query_pairs_mut();
            for (k, v) in query {
                pairs.append_pair(k, v);
            }
            pairs.append_pair("api-version", api_version);
        }
        url.to_string()
    }

    /// GET one resource: `None` when Azure says 404.
    async fn get_one<T: DeserializeOwned>(
        &self,
        url: &str,
        operation: &'static str,
        resource: &str,
    ) -> Result<Option<T>> {
        let reply = self.transport.get_raw(url, operation, resource).await?;
        if reply.status == 404 {
            return Ok(None);
        }
        wire::decode(&reply.body, operation, resource).map(Some)
    }

    /// Every item of a list, following each page's absolute `nextLink` (the `api-version` of
    /// the first page is added when a link carries none, as the 0.21 SDK did). A 404 is an
    /// error here: a list's scope exists.
    async fn list_all<T: DeserializeOwned>(
        &self,
        first: String,
        api_version: &str,
        operation: &'static str,
        resource: &str,
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        let mut url = first;
        // A list of many pages says how far it got.
        let mut wait =
            crate::progress::Wait::new(format!("Azure to list {}", crate::redact::uri(resource)));
        loop {
            let reply = self
                .transport
                .send(
                    Call {
                        method: Method::Get,
                        url: &url,
                        body: None,
                        not_found: NotFound::IsAnError,
                    },
                    operation,
                    resource,
                    Resend::AfterTransientFailure,
                )
                .await?;
            let page: wire::Page<T> = wire::decode(&reply.body, operation, resource)?;
            out.extend(page.value);
            wait.note(&format!("{} items read", out.len()));
            match page.next_link.filter(|n| !n.trim().is_empty()) {
                Some(next) if next != url => url = with_api_version(next, api_version),
                _ => return Ok(out),
            }
        }
    }

    /// A write (PUT, PATCH, DELETE) with its JSON body; the reply carries the operation's
    /// headers. A 404 is an answer only for a DELETE (nothing to delete).
    async fn write(
        &self,
        method: Method,
        url: &str,
        body: Option<Vec<u8>>,
        operation: &'static str,
        resource: &str,
        resend: Resend,
    ) -> Result<Reply> {
        let not_found = if method == Method::Delete {
            NotFound::IsAnAnswer
        } else {
            NotFound::IsAnError
        };
        self.transport
            .send(
                Call {
                    method,
                    url,
                    body,
                    not_found,
                },
                operation,
                resource,
                resend,
            )
            .await
    }
}

/// `url` with `api-version` added when it has none.
fn with_api_version(url: String, api_version: &str) -> String {
    match url::Url::parse(&url) {
        Ok(mut u) if !u.query_pairs().any(|(k, _)| k == "api-version") => {
            u.query_pairs_mut().append_pair("api-version", api_version);
            u.to_string()
        }
        _ => url,
    }
}
