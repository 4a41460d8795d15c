//! The sparse, parallel page-blob uploader and the producer-side sink that feeds it.
//!
//! Pipeline: the synchronous archive reader (in `spawn_blocking`) calls the sink from
//! `gallery::blob_store::page_runs_sink` (the port's) with each chunk; the sink finds the non-zero 512-byte sectors, groups them
//! into maximal runs and `blocking_send`s them into a bounded channel; [`upload_page_blob`] splits
//! each run into Put Page requests of at most 4 MiB and keeps up to `concurrency` in flight.
//! Contiguous runs are coalesced into 4 MiB requests, so the request size does not depend on the
//! reader's chunk size. Memory is bounded by (channel depth × chunk size) + (concurrency + 1) × 4 MiB,
//! whatever the VHD size (2 GiB VHD, 64 KiB chunks, concurrency 8: 16 MiB peak RSS in total).

use std::collections::VecDeque;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use azure_core::http::{ClientMethodOptions, Context};
use azure_storage_blob::models::{
    BlobType, HttpRange, PageBlobClientCreateOptions, PageBlobClientUploadPagesOptions,
};
use bytes::BytesMut;
use futures::TryStreamExt;
use tokio::sync::mpsc;

pub use crate::gallery::blob_store::{PageRun, Progress, UploadStats};

use super::retry::{RetryBudget, RetryCounter};
use super::target::Blob;
use super::{
    blob_path, blob_properties, to_sdk_metadata, BlobError, MAX_PUT_PAGE, META_UPLOAD_STATE, PAGE,
    UPLOAD_STATE_COMPLETE, UPLOAD_STATE_UPLOADING,
};

#[derive(Debug, Clone)]
pub struct UploadOptions {
    /// Put Page requests in flight (default 8, at least 1).
    pub concurrency: usize,
    /// Retries per request on 408/429/5xx, timeouts and connection errors; `None`: the storage
    /// target's budget (its `RetrySettings`, e.g. from `STEMCELL_GALLERY_BLOB_RETRIES`).
    pub max_retries: Option<u32>,
    pub progress: Progress,
}

impl Default for UploadOptions {
    fn default() -> Self {
        Self {
            concurrency: 8,
            max_retries: None,
            progress: Progress::Log {
                every: Duration::from_secs(10),
            },
        }
    }
}

/// Create the page blob at `size` (unless it already exists with that size — e.g. created by the
/// caller), then write every run received from `runs` until the channel closes. The blob carries
/// `upload_state=uploading` until [`super::mark_complete`]; the caller decides whether the stream
/// was whole (e.g. the image's SHA-1 matched) before marking it complete.
///
/// On error, in-flight requests are abandoned and `runs` is dropped, so the producer's next send
/// fails; the partial blob stays (without marker) for the caller to delete or a re-run to replace.
pub async fn upload_page_blob(
    blob: &Blob,
    size: u64,
    runs: mpsc::Receiver<PageRun>,
    opts: &UploadOptions,
) -> Result<UploadStats, BlobError> {
    let path = blob_path(blob);
    if size == 0 || !size.is_multiple_of(PAGE) {
        return Err(BlobError::InvalidSize { blob: path, size });
    }
    let started = Instant::now();
    prepare_blob(blob, size, &path).await?;

    let counter = RetryCounter::default();
    let sent = Arc::new(AtomicU64::new(0));
    let position = Arc::new(AtomicU64::new(0));
    let requests = Arc::new(AtomicU64::new(0));
    let reporter =
        ProgressReporter::start(&opts.progress, size, sent.clone(), position.clone(), &path);

    let concurrency = opts.concurrency.max(1);
    let pieces = put_page_bodies(runs, size, &path, &position);

    let pages = blob.page_blob();
    let result = pieces
        .map_ok(|piece| {
            let counter = counter.clone();
            let sent = sent.clone();
            let requests = requests.clone();
            let path = &path;
            let pages = &pages;
            async move {
                let len = piece.data.len() as u64;
                // Validated: 512-aligned, non-empty, inside the blob (`validate`).
                let range = HttpRange::new(piece.offset, len);
                let mut ctx = Context::new().with_value(counter);
                if let Some(n) = opts.max_retries {
                    ctx = ctx.with_value(RetryBudget(n));
                }
                let options = PageBlobClientUploadPagesOptions {
                    method_options: ClientMethodOptions { context: ctx },
                    ..Default::default()
                };
                pages
                    .upload_pages(piece.data.into(), len, range, Some(options))
                    .await
                    .map_err(|e| {
                        BlobError::request(
                            "put page to",
                            format!("{path} at offset {}", piece.offset),
                            e,
                        )
                    })?;
                sent.fetch_add(len, Ordering::Relaxed);
                requests.fetch_add(1, Ordering::Relaxed);
                Ok::<(), BlobError>(())
            }
        })
        .try_buffer_unordered(concurrency)
        .try_collect::<()>()
        .await;
    reporter.finish(result.is_ok());
    result?;
    let stats = UploadStats {
        bytes_sent: sent.load(Ordering::Relaxed),
        requests: requests.load(Ordering::Relaxed),
        retries: counter.get(),
        seconds: started.elapsed().as_secs_f64(),
    };
    tracing::info!(
        blob = %path,
        bytes_sent = stats.bytes_sent,
        requests = stats.requests,
        retries = stats.retries,
        seconds = format!("{:.1}", stats.seconds),
        "page blob upload finished"
    );
    Ok(stats)
}

/// Validated runs, split and coalesced into Put Page bodies of at most 4 MiB: contiguous runs
/// from successive chunks are merged, so request size does not depend on the reader's chunk size.
/// `position`: the furthest byte received so far (for the progress report).
fn put_page_bodies(
    runs: mpsc::Receiver<PageRun>,
    size: u64,
    path: &str,
    position: &Arc<AtomicU64>,
) -> impl futures::Stream<Item = Result<PageRun, BlobError>> {
    let path = path.to_string();
    let position = position.clone();
    futures::stream::unfold(
        (runs, Coalescer::default(), VecDeque::new(), false),
        move |(mut rx, mut co, mut queue, mut done)| {
            let path = path.clone();
            let position = position.clone();
            async move {
                loop {
                    if let Some(piece) = queue.pop_front() {
                        return Some((Ok(piece), (rx, co, queue, done)));
                    }
                    if done {
                        return None;
                    }
                    match rx.recv().await {
                        Some(run) => match validate(run, size, &path) {
                            Ok(run) => {
                                position.fetch_max(
                                    run.offset + run.data.len() as u64,
                                    Ordering::Relaxed,
                                );
                                co.push(run, &mut queue);
                            }
                            Err(e) => {
                                done = true;
                                queue.clear();
                                return Some((Err(e), (rx, co, queue, done)));
                            }
                        },
                        None => {
                            done = true;
                            queue.extend(co.finish());
                        }
                    }
                }
            }
        },
    )
}

async fn prepare_blob(blob: &Blob, size: u64, path: &str) -> Result<(), BlobError> {
    match blob_properties(blob).await? {
        None => {
            let mut metadata = std::collections::BTreeMap::new();
            metadata.insert(
                META_UPLOAD_STATE.to_string(),
                UPLOAD_STATE_UPLOADING.to_string(),
            );
            blob.page_blob()
                .create(
                    size,
                    Some(PageBlobClientCreateOptions {
                        metadata: Some(to_sdk_metadata(&metadata)),
                        ..Default::default()
                    }),
                )
                .await
                .map_err(|e| BlobError::request("create page blob", path.to_string(), e))?;
            Ok(())
        }
        Some((existing, metadata, kind)) => {
            if kind != BlobType::PageBlob {
                return Err(BlobError::Conflicting {
                    blob: path.to_string(),
                    what: format!("as a {kind:?}, not a page blob"),
                });
            }
            if existing != size {
                return Err(BlobError::Conflicting {
                    blob: path.to_string(),
                    what: format!("with {existing} bytes, not the VHD's {size}"),
                });
            }
            if metadata.get(META_UPLOAD_STATE).map(String::as_str) == Some(UPLOAD_STATE_COMPLETE) {
                return Err(BlobError::Conflicting {
                    blob: path.to_string(),
                    what: "as a complete upload (reuse it instead of writing it again)".to_string(),
                });
            }
            Ok(())
        }
    }
}

fn validate(run: PageRun, size: u64, path: &str) -> Result<PageRun, BlobError> {
    let len = run.data.len() as u64;
    let ok = len > 0
        && run.offset.is_multiple_of(PAGE)
        && len.is_multiple_of(PAGE)
        && run.offset.checked_add(len).is_some_and(|end| end <= size);
    if ok {
        Ok(run)
    } else {
        Err(BlobError::InvalidRun {
            blob: path.to_string(),
            offset: run.offset,
            len,
            size,
        })
    }
}

/// Merges contiguous runs into pieces of exactly 4 MiB where it can (the last piece of a stretch
/// may be shorter). Runs that need no merging pass through as zero-copy slices.
#[derive(Default)]
struct Coalescer {
    pending: Option<Pending>,
}

enum Pending {
    Shared(PageRun),
    Owned { offset: u64, buf: BytesMut },
}

impl Pending {
    fn end(&self) -> u64 {
        match self {
            Pending::Shared(r) => r.offset + r.data.len() as u64,
            Pending::Owned { offset, buf } => offset + buf.len() as u64,
        }
    }
    fn len(&self) -> usize {
        match self {
            Pending::Shared(r) => r.data.len(),
            Pending::Owned { buf, .. } => buf.len(),
        }
    }
    fn append(self, more: &[u8]) -> Pending {
        match self {
            Pending::Shared(r) => {
                let mut buf = BytesMut::with_capacity(MAX_PUT_PAGE);
                buf.extend_from_slice(&r.data);
                buf.extend_from_slice(more);
                Pending::Owned {
                    offset: r.offset,
                    buf,
                }
            }
            Pending::Owned { offset, mut buf } => {
                buf.extend_from_slice(more);
                Pending::Owned { offset, buf }
            }
        }
    }
    fn into_run(self) -> PageRun {
        match self {
            Pending::Shared(r) => r,
            Pending::Owned { offset, buf } => PageRun {
                offset,
                data: buf.freeze(),
            },
        }
    }
}

impl Coalescer {
    /// Take a validated run; complete pieces are appended to `out`.
    fn push(&mut self, mut run: PageRun, out: &mut VecDeque<PageRun>) {
        loop {
            match self.pending.take() {
                None => {
                    let mut pieces = split_run(run);
                    if let Some(last) = pieces.pop() {
                        out.extend(pieces);
                        if last.data.len() == MAX_PUT_PAGE {
                            out.push_back(last);
                        } else {
                            self.pending = Some(Pending::Shared(last));
                        }
                    }
                    return;
                }
                Some(p) if p.end() == run.offset => {
                    let take = (MAX_PUT_PAGE - p.len()).min(run.data.len());
                    let p = p.append(&run.data[..take]);
                    if p.len() == MAX_PUT_PAGE {
                        out.push_back(p.into_run());
                    } else {
                        self.pending = Some(p);
                    }
                    if take == run.data.len() {
                        return;
                    }
                    run = PageRun {
                        offset: run.offset + take as u64,
                        data: run.data.slice(take..),
                    };
                }
                Some(p) => out.push_back(p.into_run()),
            }
        }
    }

    fn finish(&mut self) -> Option<PageRun> {
        self.pending.take().map(Pending::into_run)
    }
}

/// Split a run into pieces of at most 4 MiB (zero-copy slices).
fn split_run(run: PageRun) -> Vec<PageRun> {
    let mut pieces = Vec::with_capacity(run.data.len().div_ceil(MAX_PUT_PAGE));
    let mut at = 0usize;
    while at < run.data.len() {
        let end = (at + MAX_PUT_PAGE).min(run.data.len());
        pieces.push(PageRun {
            offset: run.offset + at as u64,
            data: run.data.slice(at..end),
        });
        at = end;
    }
    pieces
}

/// Progress: an indicatif bar on a TTY, periodic log lines otherwise. Position is the furthest
/// VHD offset handed over (zeros included); the message shows the bytes actually sent.
struct ProgressReporter {
    bar: Option<indicatif::ProgressBar>,
    ticker: Option<tokio::task::JoinHandle<()>>,
}

impl ProgressReporter {
    fn start(
        mode: &Progress,
        size: u64,
        sent: Arc<AtomicU64>,
        position: Arc<AtomicU64>,
        path: &str,
    ) -> Self {
        let mode = match mode {
            Progress::Tty if !std::io::stderr().is_terminal() => Progress::Log {
                every: Duration::from_secs(10),
            },
            other => other.clone(),
        };
        match mode {
            Progress::None => Self {
                bar: None,
                ticker: None,
            },
            Progress::Tty => {
                let bar = indicatif::ProgressBar::new(size);
                let style = indicatif::ProgressStyle::with_template(
                    "{spinner} {bytes}/{total_bytes} of the VHD [{wide_bar}] {binary_bytes_per_sec} ETA {eta} · {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
                bar.set_style(style);
                let b = bar.clone();
                let ticker = tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_millis(200));
                    loop {
                        tick.tick().await;
                        b.set_position(position.load(Ordering::Relaxed));
                        b.set_message(format!(
                            "{:.1} MiB sent",
                            sent.load(Ordering::Relaxed) as f64 / 1_048_576.0
                        ));
                    }
                });
                Self {
                    bar: Some(bar),
                    ticker: Some(ticker),
                }
            }
            Progress::Log { every } => {
                let path = path.to_string();
                let every = every.max(Duration::from_millis(100));
                let ticker = tokio::spawn(async move {
                    let started = Instant::now();
                    let mut tick = tokio::time::interval(every);
                    tick.tick().await;
                    loop {
                        tick.tick().await;
                        let pos = position.load(Ordering::Relaxed);
                        let sent = sent.load(Ordering::Relaxed);
                        let secs = started.elapsed().as_secs_f64().max(0.001);
                        tracing::info!(
                            blob = %path,
                            "upload: {:.0}% of the VHD read ({} of {} MiB), {:.1} MiB sent, {:.1} MiB/s",
                            pos as f64 * 100.0 / size as f64,
                            pos / 1_048_576,
                            size / 1_048_576,
                            sent as f64 / 1_048_576.0,
                            pos as f64 / 1_048_576.0 / secs
                        );
                    }
                });
                Self {
                    bar: None,
                    ticker: Some(ticker),
                }
            }
        }
    }

    fn finish(self, ok: bool) {
        if let Some(t) = &self.ticker {
            t.abort();
        }
        if let Some(bar) = &self.bar {
            if ok {
                bar.finish_with_message("done");
            } else {
                bar.abandon_with_message("failed");
            }
        }
    }
}

impl Drop for ProgressReporter {
    fn drop(&mut self) {
        if let Some(t) = &self.ticker {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use proptest::prelude::*;

    fn sectors_nonzero(buf: &[u8]) -> Vec<bool> {
        buf.chunks(512).map(|s| s.iter().any(|&b| b != 0)).collect()
    }

    proptest! {
        /// The runs cover exactly the non-zero sectors, are maximal and ordered.
        #[test]
        fn runs_cover_exactly_the_nonzero_sectors(
            pattern in proptest::collection::vec((any::<bool>(), 0usize..512, any::<u8>()), 0..64),
            tail in 0usize..512,
        ) {
            let mut buf = Vec::new();
            for (nonzero, pos, byte) in &pattern {
                let mut sector = vec![0u8; 512];
                if *nonzero { sector[*pos] = byte.max(&1).to_owned(); }
                buf.extend_from_slice(&sector);
            }
            buf.extend(std::iter::repeat_n(7u8, tail));
            // The runs the upload sends (`gallery::blob_store::page_runs_sink`).
            let runs: Vec<(usize, usize)> = crate::stemcell::vhd::nonzero_runs(&buf, 0)
                .map(|r| (r.start as usize, r.end as usize))
                .collect();
            let mut covered = vec![false; buf.len().div_ceil(512)];
            let mut last_end = None;
            for &(start, end) in &runs {
                prop_assert_eq!(start % 512, 0);
                prop_assert!(end == buf.len() || end % 512 == 0);
                prop_assert!(start < end);
                if let Some(prev) = last_end { prop_assert!(start > prev, "runs must be maximal and ordered"); }
                last_end = Some(end);
                covered[start / 512..end.div_ceil(512)].iter_mut().for_each(|c| *c = true);
            }
            prop_assert_eq!(covered, sectors_nonzero(&buf));
        }

        /// Splitting keeps every byte, in order, in pieces of at most 4 MiB at aligned offsets.
        #[test]
        fn split_preserves_bytes(sectors in 1usize..20_000, offset_sectors in 0u64..1000) {
            let data: Vec<u8> = (0..sectors * 512).map(|i| (i % 251) as u8).collect();
            let run = PageRun { offset: offset_sectors * 512, data: Bytes::from(data.clone()) };
            let pieces = split_run(run);
            let mut joined = Vec::new();
            let mut expect_offset = offset_sectors * 512;
            for p in &pieces {
                prop_assert!(p.data.len() <= MAX_PUT_PAGE);
                prop_assert_eq!(p.offset, expect_offset);
                prop_assert_eq!(p.data.len() % 512, 0);
                expect_offset += p.data.len() as u64;
                joined.extend_from_slice(&p.data);
            }
            prop_assert_eq!(joined, data);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Coalescing keeps every byte at its offset, never exceeds 4 MiB, and merges contiguous
        /// runs: no two consecutive pieces are contiguous unless the first is a full 4 MiB.
        #[test]
        fn coalescing_preserves_bytes_and_fills_pieces(
            runs in proptest::collection::vec((0u64..3, 1usize..5000), 1..12),
        ) {
            let mut offset = 0u64;
            let mut input = Vec::new();
            for (i, (gap, sectors)) in runs.iter().enumerate() {
                offset += gap * 512;
                let data: Vec<u8> = (0..sectors * 512).map(|b| (b % 253) as u8 ^ i as u8).collect();
                input.push(PageRun { offset, data: Bytes::from(data) });
                offset += (*sectors as u64) * 512;
            }
            let mut expect: Vec<Option<u8>> = vec![None; offset as usize];
            for r in &input {
                for (i, b) in r.data.iter().enumerate() { expect[r.offset as usize + i] = Some(*b); }
            }
            let mut co = Coalescer::default();
            let mut out = VecDeque::new();
            for run in input { co.push(run, &mut out); }
            out.extend(co.finish());
            let pieces: Vec<PageRun> = out.into_iter().collect();
            let mut got: Vec<Option<u8>> = vec![None; offset as usize];
            for (i, p) in pieces.iter().enumerate() {
                prop_assert!(p.data.len() <= MAX_PUT_PAGE && !p.data.is_empty());
                prop_assert_eq!(p.offset % 512, 0);
                if let Some(next) = pieces.get(i + 1) {
                    prop_assert!(next.offset >= p.offset + p.data.len() as u64);
                    if next.offset == p.offset + p.data.len() as u64 {
                        prop_assert_eq!(p.data.len(), MAX_PUT_PAGE);
                    }
                }
                for (j, b) in p.data.iter().enumerate() { got[p.offset as usize + j] = Some(*b); }
            }
            prop_assert!(got == expect, "bytes differ after coalescing");
        }
    }

    #[test]
    fn runs_are_validated_against_the_blob() {
        let ok = PageRun {
            offset: 512,
            data: Bytes::from(vec![1u8; 512]),
        };
        assert!(validate(ok, 1024, "c/b").is_ok());
        for (offset, len) in [(0u64, 0usize), (1, 512), (0, 500), (512, 1024)] {
            let run = PageRun {
                offset,
                data: Bytes::from(vec![1u8; len]),
            };
            assert!(
                validate(run, 1024, "c/b").is_err(),
                "offset {offset} len {len}"
            );
        }
    }
}
