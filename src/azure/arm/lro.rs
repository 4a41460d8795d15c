//! Long-running operations: ONE poll loop ([`ArmGallery::poll`]) under one overall timeout
//! (`ArmOptions::operation_timeout`), used to follow a write (`Azure-AsyncOperation`, else
//! `Location`, else the resource's own `provisioningState`), to wait for a version to settle, and
//! to wait for a deleted version to be gone (404).
//!
//! A write is sent once (see `transport`); what follows is only reads. Azure's long-running
//! operation protocol as the gallery API uses it: a 201/202 with `Azure-AsyncOperation` (an
//! operation status `{status: InProgress|Succeeded|Failed|Canceled, error}`), `Location` (202
//! while running) and `Retry-After` (azure-rest-api-specs, GalleryRP 2023-07-03
//! GalleryImageVersions_CreateOrUpdate / _Delete, `x-ms-long-running-operation`).

use std::time::Duration;

use super::transport::Reply;
use super::wire::OperationStatus;
use super::ArmGallery;
use crate::gallery::error::{Error, Result};
use crate::gallery::model::{ImageVersion, Operation, ProvisioningState};
use crate::gallery::GalleryApi;

/// One look at an operation.
pub(super) enum Poll<T> {
    /// Finished: the loop returns this.
    Ready(T),
    /// Still running; `state` is what to report if the wait runs out (`None`: unchanged),
    /// `retry_after` what Azure asked to wait.
    Pending {
        state: Option<String>,
        retry_after: Option<Duration>,
    },
}

/// How long to pause between looks.
#[derive(Debug, Clone, Copy)]
pub(super) enum Pacing {
    /// Azure's `Retry-After` when it gave one (at least 20 ms), else the poll interval; also
    /// before the first look (`first` is the write's own `Retry-After`).
    AsAzureSays { first: Option<Duration> },
    /// First look at once, then 50 ms doubling up to the poll interval.
    Doubling,
    /// First look at once, then the poll interval, at most 2 s.
    Steady,
}

/// Whether a provisioning state means Azure is still working on the resource.
pub(super) fn busy(state: &ProvisioningState) -> bool {
    state.phase().operation_under_way()
}

impl ArmGallery {
    fn poll_wait(&self, retry_after: Option<Duration>) -> Duration {
        match retry_after {
            Some(d) => d.max(Duration::from_millis(20)),
            None => self.opts.poll_interval,
        }
    }

    /// The poll loop, the only one: look with `step` until it is ready, pausing as `pacing`
    /// says; past the operation timeout, [`Error::Timeout`] names the last state seen
    /// (`initial` until a look says otherwise).
    pub(super) async fn poll<T, F, Fut>(
        &self,
        operation: &'static str,
        resource: &str,
        pacing: Pacing,
        initial: &str,
        mut step: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<Poll<T>>>,
    {
        let started = tokio::time::Instant::now();
        let mut last = initial.to_string();
        // A wait Azure takes minutes over says what it waits for as it goes.
        let mut wait = crate::progress::Wait::new(format!(
            "Azure ({operation}) of {} (gives up after {} s)",
            crate::redact::uri(resource),
            self.opts.operation_timeout.as_secs()
        ));
        let mut doubling = Duration::from_millis(50).min(self.opts.poll_interval);
        let mut pause = match pacing {
            Pacing::AsAzureSays { first } => Some(self.poll_wait(first)),
            Pacing::Doubling | Pacing::Steady => None,
        };
        loop {
            if let Some(p) = pause {
                tokio::time::sleep(p).await;
            }
            let (state, retry_after) = match step().await? {
                Poll::Ready(v) => return Ok(v),
                Poll::Pending { state, retry_after } => (state, retry_after),
            };
            if let Some(s) = state {
                last = s;
            }
            wait.note(if last.is_empty() { "busy" } else { &last });
            if started.elapsed() > self.opts.operation_timeout {
                return Err(Error::Timeout {
                    operation,
                    resource: resource.to_string(),
                    seconds: self.opts.operation_timeout.as_secs(),
                    state: last,
                });
            }
            pause = Some(match pacing {
                Pacing::AsAzureSays { .. } => self.poll_wait(retry_after),
                Pacing::Doubling => {
                    let d = doubling;
                    doubling = (doubling * 2).min(self.opts.poll_interval);
                    d
                }
                Pacing::Steady => self.poll_wait(None).min(Duration::from_secs(2)),
            });
        }
    }

    /// Follow a long-running operation to its end: Azure-AsyncOperation, else Location, else the
    /// resource's provisioningState (read by `get_state`).
    pub(super) async fn wait_operation<G, GFut>(
        &self,
        operation: &'static str,
        resource: &str,
        op: &Operation,
        get_state: G,
    ) -> Result<()>
    where
        G: Fn() -> GFut,
        GFut: std::future::Future<Output = Result<Option<ProvisioningState>>>,
    {
        let first = op.retry_after_secs.map(Duration::from_secs);
        let get_state = &get_state;
        self.poll(
            operation,
            resource,
            Pacing::AsAzureSays { first },
            "InProgress",
            move || async move {
                if let Some(url) = &op.async_operation_url {
                    let reply = self.transport.get_raw(url, operation, resource).await?;
                    let ra = retry_after(&reply);
                    // An unreadable status body is no news: look again (a 404 ends the wait).
                    let body: OperationStatus =
                        serde_json::from_slice(&reply.body).unwrap_or_default();
                    let st = body.status.unwrap_or_default();
                    match st.to_ascii_lowercase().as_str() {
                        "succeeded" => Ok(Poll::Ready(())),
                        "failed" | "canceled" | "cancelled" => {
                            let error = body.error.unwrap_or_default();
                            // A refusal Azure reports in the operation rather than at the
                            // DELETE is the same refusal (where it comes is not documented).
                            let azure = error.as_azure(reply.status);
                            if azure.blocks_deletion() {
                                return Err(Error::DeletionBlocked {
                                    resource: resource.to_string(),
                                    azure: Box::new(azure),
                                });
                            }
                            Err(Error::OperationFailed {
                                operation,
                                resource: resource.to_string(),
                                state: st.clone(),
                                message: error.describe(),
                            })
                        }
                        _ if reply.status == 404 => Ok(Poll::Ready(())),
                        _ => Ok(Poll::Pending {
                            state: Some(st),
                            retry_after: ra,
                        }),
                    }
                } else if let Some(url) = &op.location_url {
                    let reply = self.transport.get_raw(url, operation, resource).await?;
                    let ra = retry_after(&reply);
                    Ok(if reply.status != 202 {
                        Poll::Ready(())
                    } else {
                        Poll::Pending {
                            state: None,
                            retry_after: ra,
                        }
                    })
                } else {
                    Ok(match get_state().await? {
                        Some(s) if busy(&s) => Poll::Pending {
                            state: None,
                            retry_after: None,
                        },
                        None | Some(_) => Poll::Ready(()),
                    })
                }
            },
        )
        .await
    }

    /// Look at the version until it is no longer Creating/Updating/Deleting/Migrating (or gone).
    pub(super) async fn settle_version(
        &self,
        definition: &str,
        version: &str,
    ) -> Result<Option<ImageVersion>> {
        let id = self.gallery.version_id(definition, version);
        self.poll("wait for", &id, Pacing::Doubling, "", || async {
            let v = self.get_version(definition, version, true).await?;
            Ok(match v {
                Some(x) if busy(&x.provisioning_state) => Poll::Pending {
                    state: Some(x.provisioning_state.to_string()),
                    retry_after: None,
                },
                v => Poll::Ready(v),
            })
        })
        .await
    }

    /// After a DELETE's operation ended: done only when a GET says 404. Still there and Failed
    /// is the delete's failure.
    pub(super) async fn until_gone(&self, definition: &str, version: &str) -> Result<()> {
        let id = self.gallery.version_id(definition, version);
        self.poll("delete", &id, Pacing::Steady, "", || async {
            match self.get_version(definition, version, false).await? {
                None => Ok(Poll::Ready(())),
                Some(v) if v.phase().failed() => Err(Error::OperationFailed {
                    operation: "delete",
                    resource: id.clone(),
                    state: "Failed".into(),
                    message: "the version is still present and Failed after its deletion".into(),
                }),
                Some(v) => Ok(Poll::Pending {
                    state: Some(v.provisioning_state.to_string()),
                    retry_after: None,
                }),
            }
        })
        .await
    }
}

/// The operation a write's answer started, from its headers.
pub(super) fn operation_from(
    operation: &str,
    definition: &str,
    version: &str,
    reply: &Reply,
) -> Operation {
    Operation {
        operation: operation.to_string(),
        definition: definition.to_string(),
        version: version.to_string(),
        async_operation_url: reply.header("azure-asyncoperation").map(str::to_string),
        location_url: reply.header("location").map(str::to_string),
        retry_after_secs: retry_after(reply).map(|d| d.as_secs()),
    }
}

fn retry_after(reply: &Reply) -> Option<Duration> {
    crate::backoff::retry_after(|name| reply.header(name))
}
