//! Step (3) of [`publish`](super::publish): the one pass that reads, verifies and uploads the
//! stemcell, under the upload locks of its digests (see the module documentation of
//! [`super`]). What one call moved ([`Transfer`]) and which versions stay ([`settled_or_busy`])
//! live here too: the upload decides on them again under its locks.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::sync::{mpsc, oneshot};

use super::passes::{full_pass, is_sink_error, settle, Checked, FullPass, UploadSink};
use super::plan::{plan_upload, Found};
use super::{PublishOptions, Source, RUN_QUEUE, UPLOAD_LEASE};
use crate::gallery::blob_store::{
    page_runs_sink, BlobStore, CompletionMarks, ImageDigests, PageRun, UploadLock, WriteOptions,
};
use crate::gallery::lock::upload_lock_name;
use crate::gallery::model::ImageVersion;
use crate::gallery::service::GalleryService;
use crate::stemcell::manifest::Checksum;

/// What one call moved.
#[derive(Debug, Clone, Copy)]
pub(super) struct Transfer {
    pub(super) uploaded: bool,
    pub(super) bytes_read: u64,
    pub(super) bytes_sent: u64,
    pub(super) zero_bytes_skipped: u64,
}

impl Transfer {
    pub(super) fn nothing(bytes_read: u64) -> Transfer {
        Transfer {
            uploaded: false,
            bytes_read,
            bytes_sent: 0,
            zero_bytes_skipped: 0,
        }
    }
}

/// A version the service can reuse, wait for, or refuse without a new blob: anything but
/// Failed/Canceled (replaced from a new upload) and Deleting (its blob may be going too).
pub(super) fn settled_or_busy(v: &ImageVersion) -> bool {
    v.phase().stays()
}

/// How an upload attempt ended.
pub(super) enum Attempt {
    /// The version appeared meanwhile (another host): ensure from it.
    Version(Box<ImageVersion>),
    /// A complete blob may hold this image, which only its SHA-256 tells: digest, then again.
    NeedDigest,
    /// A complete blob: reused (`transfer.uploaded` false) or written now.
    Blob { name: String, transfer: Transfer },
}

/// Where an upload goes and what it is for.
pub(super) struct Upload<'a> {
    pub(super) service: &'a GalleryService,
    pub(super) store: &'a dyn BlobStore,
    pub(super) lock_wait: Duration,
    pub(super) definition: &'a str,
    pub(super) key: &'a str,
    pub(super) blob_name: &'a str,
    pub(super) source: &'a Source,
    pub(super) opts: &'a PublishOptions,
}

/// The reader of an upload pass, held before its first page until the upload is decided.
struct Reader {
    task: tokio::task::JoinHandle<anyhow::Result<FullPass>>,
    go: oneshot::Sender<()>,
    runs: mpsc::Receiver<PageRun>,
}

impl Reader {
    /// Stop it before it sent anything, and wait for it to end.
    async fn stop(self) {
        let Reader { task, go, runs } = self;
        drop(go);
        drop(runs);
        if let Err(e) = task.await {
            tracing::warn!(error = %e, "the stemcell reader stopped");
        }
    }
}

/// What an upload decided before sending its first page.
enum Prepared {
    /// Nothing to upload: the attempt ends so.
    Done(Attempt),
    /// The blob was created: stream into it. `unknown`: see [`UploadPlan::unknown`].
    Created { unknown: Vec<(String, Checksum)> },
}

impl Upload<'_> {
    /// One upload attempt: the pass that inflates and verifies the stemcell starts at once; at
    /// root.vhd's first chunk (its size known, its first sector checked), the upload locks of
    /// every digest known are taken, the gallery and the blobs observed again, and the pass either
    /// streams into a new page blob or is stopped (the version or a reusable blob exists).
    pub(super) async fn run(&self, checked: &mut Checked) -> anyhow::Result<Attempt> {
        let at = Instant::now();
        let (begin_tx, begin_rx) = oneshot::channel::<u64>();
        let (go_tx, go_rx) = oneshot::channel::<()>();
        let (tx, rx) = mpsc::channel::<PageRun>(RUN_QUEUE);
        let task = {
            let source = self.source.clone();
            let expected = (checked.vhd_file_size > 0).then_some(checked.vhd_file_size);
            tokio::task::spawn_blocking(move || {
                let mut sink = UploadSink::new(expected, begin_tx, go_rx, page_runs_sink(tx));
                full_pass(&source, &mut sink)
            })
        };
        let reader = Reader {
            task,
            go: go_tx,
            runs: rx,
        };
        // Nothing is written before root.vhd's first sector was read and checked.
        let Ok(size) = begin_rx.await else {
            let Reader { task, .. } = reader;
            // The pass ended without asking to upload: its error says why.
            task.await
                .map_err(|e| anyhow::anyhow!("the stemcell reader stopped: {e}"))??;
            anyhow::bail!(
                "root.vhd cannot be uploaded as a page blob; this is a bug, please report it"
            );
        };
        tracing::debug!(
            seconds = at.elapsed().as_secs_f64(),
            bytes = size,
            "root.vhd's first sector read; taking the upload lock"
        );
        let locks = match self.lock(checked).await {
            Ok(locks) => locks,
            Err(e) => {
                reader.stop().await;
                return Err(e);
            }
        };
        let attempt = self.locked(checked, size, reader).await;
        for guard in locks.into_iter().rev() {
            if let Err(e) = guard.release().await {
                tracing::warn!(error = %e, "could not release the upload lock; its lease expires by itself");
            }
        }
        if let Ok(Attempt::Blob { transfer, .. }) = &attempt {
            if transfer.uploaded {
                tracing::debug!(seconds = at.elapsed().as_secs_f64(), "upload pass done");
            }
        }
        attempt
    }

    /// The container, then the upload lock of every digest known, SHA-1 first (see
    /// [`upload_lock_name`]).
    async fn lock(&self, checked: &Checked) -> anyhow::Result<Vec<Box<dyn UploadLock>>> {
        let container = self.opts.container.as_str();
        self.store
            .ensure_container(container)
            .await
            .with_context(|| format!("cannot prepare container {container}"))?;
        let mut held: Vec<Box<dyn UploadLock>> = Vec::new();
        for digest in checked.digests() {
            let name = upload_lock_name(&digest);
            match self
                .store
                .lock(container, &name, self.lock_wait, UPLOAD_LEASE)
                .await
            {
                Ok(guard) => held.push(guard),
                Err(e) => {
                    for guard in held.into_iter().rev() {
                        if let Err(r) = guard.release().await {
                            tracing::warn!(error = %r, "could not release the upload lock; its lease expires by itself");
                        }
                    }
                    return Err(e);
                }
            }
        }
        Ok(held)
    }

    async fn locked(
        &self,
        checked: &mut Checked,
        size: u64,
        reader: Reader,
    ) -> anyhow::Result<Attempt> {
        let container = self.opts.container.as_str();
        let unknown = match self.prepare(checked, size).await {
            Ok(Prepared::Created { unknown }) => unknown,
            Ok(Prepared::Done(attempt)) => {
                reader.stop().await;
                return Ok(attempt);
            }
            Err(e) => {
                reader.stop().await;
                return Err(e);
            }
        };
        let transfer = match self.stream(checked, size, reader).await {
            Ok(t) => t,
            Err(e) => {
                if let Err(d) = self.store.delete(container, self.blob_name).await {
                    tracing::warn!(error = %d, blob = self.blob_name, "could not delete the partial blob; the next run deletes it");
                }
                return Err(e.context(format!(
                    "upload of {} failed; the blob was removed and no gallery version was created",
                    self.blob_name
                )));
            }
        };
        let sha1 = checked.sha1.clone().unwrap_or_default();
        let marks = CompletionMarks {
            cloud_properties: &checked.cloud,
            image_sha1: &sha1,
            image_sha256: checked.stemcell.content.digest(),
            gallery: &self.service.gallery().gallery,
            definition: self.definition,
        };
        self.store
            .mark_complete(container, self.blob_name, &marks)
            .await?;
        self.late_leftovers(checked, unknown).await;
        Ok(Attempt::Blob {
            name: self.blob_name.to_string(),
            transfer,
        })
    }

    /// Under the locks: observe the gallery and the blobs again (another host may have finished
    /// meanwhile), delete this image's leftovers and create the blob.
    async fn prepare(&self, checked: &Checked, size: u64) -> anyhow::Result<Prepared> {
        let container = self.opts.container.as_str();
        if let Some(v) = self
            .service
            .api()
            .get_version(self.definition, self.key, false)
            .await?
        {
            if settled_or_busy(&v) {
                return Ok(Prepared::Done(Attempt::Version(Box::new(v))));
            }
        }
        let blobs = self.store.stemcell_blobs(container).await?;
        let plan = plan_upload(&blobs, checked, size);
        match plan.found {
            Found::Reuse(name) => {
                tracing::info!(blob = %name, "a complete blob with this image_sha256 exists; reusing it (0 bytes sent)");
                return Ok(Prepared::Done(Attempt::Blob {
                    name,
                    transfer: Transfer::nothing(0),
                }));
            }
            Found::MayHold(name) => {
                tracing::info!(blob = %name, "a complete blob may hold this image; reading the image's digests first");
                return Ok(Prepared::Done(Attempt::NeedDigest));
            }
            Found::Nothing => {}
        }
        for partial in &plan.leftovers {
            tracing::info!(blob = %partial, "deleting the partial blob of an interrupted upload");
            self.store.delete(container, partial).await?;
        }
        let path = format!("{container}/{}", self.blob_name);
        let digests = ImageDigests {
            sha1: checked.sha1.as_deref(),
            sha256: checked.sha256.as_deref(),
        };
        self.store
            .create(container, self.blob_name, size, digests)
            .await?;
        tracing::info!(blob = %path, bytes = size, "uploading root.vhd as a sparse page blob");
        Ok(Prepared::Created {
            unknown: plan.unknown,
        })
    }

    /// After the upload pass computed the digests: delete the partial blobs among `unknown` that
    /// record one of them, each under that digest's upload lock taken without waiting (held: its
    /// writer is still running, and its blob stays). Best effort: a failure is logged, and the
    /// blob is left for a later run.
    async fn late_leftovers(&self, checked: &Checked, unknown: Vec<(String, Checksum)>) {
        let container = self.opts.container.as_str();
        let ours = checked.digests();
        for (name, digest) in unknown.into_iter().filter(|(_, d)| ours.contains(d)) {
            let lock = upload_lock_name(&digest);
            match self
                .store
                .lock(container, &lock, Duration::ZERO, UPLOAD_LEASE)
                .await
            {
                Ok(guard) => {
                    // Listed before the upload: its writer may have finished it since (marked it
                    // complete, and a version may be being created from it). Only a blob still
                    // partial under the lock its writer held is a leftover.
                    match self.still_partial(container, &name, &digest).await {
                        Ok(true) => {
                            tracing::info!(blob = %name, "deleting the partial blob of an interrupted upload (an earlier build's)");
                            if let Err(e) = self.store.delete(container, &name).await {
                                tracing::warn!(error = %e, blob = %name, "could not delete the partial blob; a later run deletes it");
                            }
                        }
                        Ok(false) => {
                            tracing::info!(blob = %name, "leaving a blob of this image: it is no longer a partial upload");
                        }
                        Err(e) => {
                            tracing::warn!(error = %format!("{e:#}"), blob = %name, "could not list the stemcell blobs again; leaving the partial blob for a later run");
                        }
                    }
                    if let Err(e) = guard.release().await {
                        tracing::warn!(error = %e, "could not release the upload lock; its lease expires by itself");
                    }
                }
                Err(e) => {
                    tracing::info!(blob = %name, reason = %format!("{e:#}"), "leaving a partial blob of this image: its upload lock is held");
                }
            }
        }
    }

    /// Whether blob `name` is still a partial stemcell blob recording `digest` (listed again).
    async fn still_partial(
        &self,
        container: &str,
        name: &str,
        digest: &Checksum,
    ) -> anyhow::Result<bool> {
        let blobs = self.store.stemcell_blobs(container).await?;
        Ok(blobs.iter().any(|b| {
            b.name == name
                && !b.complete
                && match digest {
                    Checksum::Sha1(_) => b.image_sha1.as_deref(),
                    Checksum::Sha256(_) => b.image_sha256.as_deref(),
                }
                .is_some_and(|r| r.trim().eq_ignore_ascii_case(digest.hex()))
        }))
    }

    /// Let the reader go on into the blob: it inflates and verifies the stemcell and feeds the
    /// uploader through a bounded channel. Succeeds only when both succeeded and the pass read
    /// the file read before (the same manifest, the digests known so far, root.vhd's size).
    async fn stream(
        &self,
        checked: &mut Checked,
        size: u64,
        reader: Reader,
    ) -> anyhow::Result<Transfer> {
        let Reader { task, go, runs } = reader;
        // The reader waits for this; if it is gone, its result says why.
        let _ = go.send(());
        let write = WriteOptions {
            concurrency: self.opts.concurrency.max(1),
            progress: self.opts.progress.clone(),
        };
        let upload =
            self.store
                .write_pages(&self.opts.container, self.blob_name, size, runs, &write);
        let (read, uploaded) = tokio::join!(task, upload);
        let read = read.map_err(|e| anyhow::anyhow!("the stemcell reader stopped: {e}"))?;
        let (pass, stats) = match (read, uploaded) {
            (Ok(r), Ok(stats)) => (r, stats),
            // The uploader's own error explains a reader that stopped because the uploader went
            // away; any other reader error (a broken VHD, a wrong checksum) is the cause.
            (Err(e), Err(u)) if is_sink_error(&e) => return Err(u),
            (Err(e), _) => return Err(e),
            (Ok(_), Err(e)) => return Err(e),
        };
        settle(self.source, checked, &pass)?;
        Ok(Transfer {
            uploaded: true,
            bytes_read: pass.read.vhd_bytes,
            bytes_sent: stats.bytes_sent,
            zero_bytes_skipped: pass.read.zero_bytes,
        })
    }
}
