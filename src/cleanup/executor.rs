//! Applying a plan: re-scan consumers once, re-plan, then for each deletion take the version's
//! lock (the same per-version lock every writer takes), re-read the version and skip it if
//! anything changed since planning, re-check its consumers with a list made after the lock was
//! taken, and delete it (`gallery::guarded::delete_guarded`: a DELETE that meets a 429, 5xx,
//! timeout or dropped connection is not re-sent before the version is read and checked again
//! under the lock). Bounded concurrency. One failed deletion does not stop the others; failures
//! are counted and reported.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use futures::stream::{self, StreamExt};

use crate::gallery::guarded::{self, delete_guarded, Guarded, SharedScan};
use crate::gallery::lock::{version_lock_name, LocalLocks, Locks};
use crate::gallery::{GalleryApi, ImageVersion};

use super::evidence::{ConsumersSource, Evidence, UsageSource};
use super::inventory::Inventory;
use super::planner::{plan, Plan, PlanEntry, Verdict};
use super::policy::Policy;
use super::CleanupError;

/// Deletes source blobs (page blobs the versions were made from) once no version uses them.
/// The storage side is implemented by the Azure adapter; the executor decides *which* blobs.
#[async_trait::async_trait]
pub trait BlobCleaner: Send + Sync {
    /// Delete one blob by URI. Already gone is success. Implementations refuse blobs outside the
    /// storage account they manage (return an error naming the URI).
    async fn delete_blob(&self, uri: &str) -> Result<(), String>;
}

/// What happened to one planned deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    /// Not deleted because the version changed since planning (what changed).
    SkippedChanged(String),
    /// Already gone when re-read.
    SkippedGone,
    /// The consumer re-scan found a new use (the re-plan keeps it).
    SkippedNowInUse,
    /// Kept: Azure refuses its deletion before its end of life (the date, when named).
    KeptBlocked(Option<time::OffsetDateTime>),
    /// Kept: a management lock this tool does not own applies to it (which, and where).
    KeptLocked(String),
    Failed(String),
}

impl DeleteOutcome {
    pub fn describe(&self) -> String {
        match self {
            DeleteOutcome::Deleted => "deleted".into(),
            DeleteOutcome::SkippedChanged(what) => {
                format!("skipped: changed since planning ({what})")
            }
            DeleteOutcome::SkippedGone => "skipped: already gone".into(),
            DeleteOutcome::SkippedNowInUse => "skipped: in use according to the re-scan".into(),
            DeleteOutcome::KeptBlocked(until) => format!(
                "kept: Azure refuses its deletion {}",
                crate::gallery::lifecycle::until_text(*until)
            ),
            DeleteOutcome::KeptLocked(locks) => {
                format!("kept: locked by a management lock this tool does not own: {locks}")
            }
            DeleteOutcome::Failed(msg) => format!("failed: {msg}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobOutcome {
    pub uri: String,
    pub result: Result<(), String>,
}

#[derive(Debug, Clone)]
pub struct ApplyOutcome {
    /// The plan after the consumer re-scan (what was actually acted on).
    pub plan: Plan,
    /// By version id, one outcome per deletion that the original plan held.
    pub results: BTreeMap<String, DeleteOutcome>,
    pub blobs: Vec<BlobOutcome>,
    /// What the deletions did, when there were any: gone for good, or soft-deleted and
    /// restorable until when (the gallery's policy, read once after them).
    pub deleted_how: Option<crate::gallery::lifecycle::Deleted>,
    /// The versions whose delete lock was brought in line with their references
    /// (`gallery::protect`).
    pub locks_repaired: Vec<String>,
}

impl ApplyOutcome {
    pub fn deleted(&self) -> usize {
        self.results
            .values()
            .filter(|o| matches!(o, DeleteOutcome::Deleted))
            .count()
    }

    pub fn skipped(&self) -> usize {
        self.results
            .values()
            .filter(|o| {
                matches!(
                    o,
                    DeleteOutcome::SkippedChanged(_)
                        | DeleteOutcome::SkippedGone
                        | DeleteOutcome::SkippedNowInUse
                        | DeleteOutcome::KeptBlocked(_)
                        | DeleteOutcome::KeptLocked(_)
                )
            })
            .count()
    }

    /// Failed version deletions plus failed blob deletions.
    pub fn failed(&self) -> usize {
        self.results
            .values()
            .filter(|o| matches!(o, DeleteOutcome::Failed(_)))
            .count()
            + self.blobs.iter().filter(|b| b.result.is_err()).count()
    }
}

pub struct Executor {
    api: Arc<dyn GalleryApi>,
    concurrency: usize,
    blobs: Option<Arc<dyn BlobCleaner>>,
    locks: Arc<dyn Locks>,
    /// The gallery, by its full identity: the writers' lock names use it.
    gallery: Option<crate::gallery::GalleryRef>,
}

/// What changed between two observations of a version ("" when nothing that matters did).
fn changes(before: &ImageVersion, after: &ImageVersion) -> Vec<&'static str> {
    let mut out = Vec::new();
    if before.tags != after.tags {
        out.push("tags");
    }
    if before.provisioning_state != after.provisioning_state {
        out.push("provisioning state");
    }
    if before.safety != after.safety {
        out.push("end of life or deletion block");
    }
    if before.source_uri != after.source_uri
        || before.storage_account_id != after.storage_account_id
    {
        out.push("source");
    }
    if before.published_date != after.published_date {
        out.push("published date (re-created)");
    }
    if before.target_regions != after.target_regions {
        out.push("target regions");
    }
    if before.exclude_from_latest != after.exclude_from_latest {
        out.push("exclude-from-latest");
    }
    out
}

impl Executor {
    /// An executor with in-process locks only (unit tests with fakes): give it the writers'
    /// cross-host locks with [`Executor::with_locks`] for anything real.
    pub fn new(api: Arc<dyn GalleryApi>, concurrency: usize) -> Self {
        Self {
            api,
            concurrency: concurrency.max(1),
            blobs: None,
            locks: Arc::new(LocalLocks::default()),
            gallery: None,
        }
    }

    /// Delete under these locks (the writers' own), named for `gallery` as the writers name them.
    pub fn with_locks(
        mut self,
        locks: Arc<dyn Locks>,
        gallery: &crate::gallery::GalleryRef,
    ) -> Self {
        self.locks = locks;
        self.gallery = Some(gallery.clone());
        self
    }

    /// Also delete the source blobs of deleted versions that no remaining version uses.
    pub fn with_blob_cleaner(mut self, blobs: Arc<dyn BlobCleaner>) -> Self {
        self.blobs = Some(blobs);
        self
    }

    /// Apply `planned` (made from `inventory` and `evidence` under `policy`).
    pub async fn apply(
        &self,
        inventory: &Inventory,
        evidence: &[Evidence],
        planned: &Plan,
        policy: &Policy,
    ) -> Result<ApplyOutcome, CleanupError> {
        // 1. Re-scan consumers once, and re-plan with the fresh list.
        let consumers = ConsumersSource::new(self.api.clone());
        let fresh =
            consumers
                .collect()
                .await
                .map_err(|cause| CleanupError::EvidenceIncomplete {
                    source_name: consumers.name(),
                    cause,
                    also_failed: Vec::new(),
                })?;
        let mut evidence: Vec<Evidence> = evidence
            .iter()
            .filter(|e| e.source != fresh.source)
            .cloned()
            .collect();
        evidence.push(fresh);
        let replanned = plan(inventory, &evidence, policy);

        // Delete only what both plans delete; what the operator saw kept stays kept.
        let original: HashMap<&str, &PlanEntry> = planned
            .entries
            .iter()
            .map(|e| (e.observed.id.as_str(), e))
            .collect();
        let mut final_plan = replanned;
        for entry in final_plan.entries.iter_mut() {
            if entry.verdict != Verdict::Delete {
                continue;
            }
            if let Some(orig) = original.get(entry.observed.id.as_str()) {
                if orig.verdict != Verdict::Delete {
                    *entry = (*orig).clone();
                }
            }
        }
        let still_delete: BTreeSet<&str> = final_plan
            .deletions()
            .map(|e| e.observed.id.as_str())
            .collect();
        let mut results: BTreeMap<String, DeleteOutcome> = BTreeMap::new();
        let mut todo: Vec<ImageVersion> = Vec::new();
        for e in planned.deletions() {
            if still_delete.contains(e.observed.id.as_str()) {
                todo.push(e.observed.clone());
            } else {
                results.insert(e.observed.id.clone(), DeleteOutcome::SkippedNowInUse);
            }
        }

        // 2. Under each version's lock: re-read, re-check consumers, delete; bounded.
        results.extend(self.delete_under_locks(&todo).await);

        // 3. Source blobs nothing references any more.
        let blobs = self.delete_orphaned_blobs(inventory, &results).await;
        Ok(ApplyOutcome {
            deleted_how: None,
            locks_repaired: Vec::new(),
            plan: final_plan,
            results,
            blobs,
        })
    }

    /// Under each version's lock: re-read, re-check consumers, delete; bounded. The locks of
    /// a batch are taken first, so one consumer scan made after all of them serves the batch
    /// (thousands of deletions do not list every VM thousands of times).
    async fn delete_under_locks(&self, todo: &[ImageVersion]) -> Vec<(String, DeleteOutcome)> {
        let scan = SharedScan::new(self.api.clone());
        let mut outcomes: Vec<(String, DeleteOutcome)> = Vec::new();
        for batch in todo.chunks(LOCK_BATCH.max(self.concurrency)) {
            let mut locked = Vec::new();
            for observed in batch {
                let lock_name = self.lock_name(observed);
                match self.locks.acquire(&lock_name).await {
                    Ok(h) => locked.push((observed, lock_name, h)),
                    Err(e) => {
                        tracing::warn!("not deleting {}: {e}", observed.id);
                        outcomes.push((
                            observed.id.clone(),
                            DeleteOutcome::Failed(format!("taking the version's lock: {e}")),
                        ));
                    }
                }
            }
            let locked_at = tokio::time::Instant::now();
            let done: Vec<(String, DeleteOutcome)> = stream::iter(locked)
                .map(|(observed, lock_name, held)| {
                    let scan = &scan;
                    async move {
                        let outcome = self
                            .delete_one(scan, observed, &lock_name, held, locked_at)
                            .await;
                        (observed.id.clone(), outcome)
                    }
                })
                .buffer_unordered(self.concurrency)
                .collect()
                .await;
            outcomes.extend(done);
        }
        outcomes
    }

    /// The source blobs of the versions deleted (per `results`) that no remaining version uses,
    /// deleted when a blob cleaner is set.
    async fn delete_orphaned_blobs(
        &self,
        inventory: &Inventory,
        results: &BTreeMap<String, DeleteOutcome>,
    ) -> Vec<BlobOutcome> {
        let mut blobs = Vec::new();
        if let Some(cleaner) = &self.blobs {
            let deleted: BTreeSet<&str> = results
                .iter()
                .filter(|(_, o)| matches!(o, DeleteOutcome::Deleted))
                .map(|(id, _)| id.as_str())
                .collect();
            for uri in orphaned_blobs(&inventory.versions, &deleted) {
                let result = cleaner.delete_blob(&uri).await;
                if let Err(e) = &result {
                    tracing::warn!(
                        "could not delete source blob {}: {e}",
                        crate::redact::uri(&uri)
                    );
                }
                blobs.push(BlobOutcome { uri, result });
            }
        }
        blobs
    }
}

/// Source blobs of deleted versions that no remaining version uses (compared without the query
/// string, case-insensitively), sorted.
pub fn orphaned_blobs(versions: &[ImageVersion], deleted_ids: &BTreeSet<&str>) -> Vec<String> {
    let key = |u: &str| {
        u.split('?')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
    };
    let still_used: BTreeSet<String> = versions
        .iter()
        .filter(|v| !deleted_ids.contains(v.id.as_str()))
        .filter_map(|v| v.source_uri.as_deref().map(key))
        .collect();
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for v in versions
        .iter()
        .filter(|v| deleted_ids.contains(v.id.as_str()))
    {
        if let Some(uri) = v.source_uri.as_deref() {
            let k = key(uri);
            if !k.is_empty() && !still_used.contains(&k) {
                out.entry(k).or_insert_with(|| uri.to_string());
            }
        }
    }
    out.into_values().collect()
}

/// Deletions whose locks are taken together before one consumer scan serves them.
const LOCK_BATCH: usize = 32;

impl Executor {
    fn lock_name(&self, observed: &ImageVersion) -> String {
        let gallery = self
            .gallery
            .clone()
            .unwrap_or_else(|| gallery_of(&observed.id));
        version_lock_name(&gallery, &observed.definition, &observed.version)
    }

    async fn delete_one(
        &self,
        scan: &SharedScan,
        observed: &ImageVersion,
        lock_name: &str,
        held: Box<dyn crate::gallery::lock::Held>,
        locked_at: tokio::time::Instant,
    ) -> DeleteOutcome {
        let gallery = self
            .gallery
            .clone()
            .unwrap_or_else(|| gallery_of(&observed.id));
        let target = guarded::Target {
            api: self.api.as_ref(),
            locks: self.locks.as_ref(),
            lock_name,
            gallery: &gallery,
            definition: &observed.definition,
            key: &observed.version,
            carry: false,
        };
        let keep_if = |current: &ImageVersion| -> Option<String> {
            let changed = changes(observed, current);
            (!changed.is_empty()).then(|| changed.join(", "))
        };
        match delete_guarded(&target, held, locked_at, scan, &keep_if).await {
            Ok(Guarded::Deleted) => {
                tracing::info!("deleted {}", observed.id);
                DeleteOutcome::Deleted
            }
            Ok(Guarded::Gone) => DeleteOutcome::SkippedGone,
            Ok(Guarded::Changed(what)) => {
                tracing::info!(
                    "not deleting {}: {what} changed since planning",
                    observed.id
                );
                DeleteOutcome::SkippedChanged(what)
            }
            Ok(Guarded::InUse(_)) => DeleteOutcome::SkippedNowInUse,
            Ok(Guarded::Blocked(until)) => DeleteOutcome::KeptBlocked(until),
            Ok(Guarded::Locked(locks)) => DeleteOutcome::KeptLocked(locks),
            // Kept, and counted as a failure: the run could not prove what it planned.
            Ok(Guarded::Unproven(why)) => DeleteOutcome::Failed(why),
            Err(e) => {
                tracing::warn!("could not delete {}: {e}", observed.id);
                DeleteOutcome::Failed(e.to_string())
            }
        }
    }
}

/// The gallery name inside a version id (`.../galleries/{g}/images/...`), for in-process locks.
fn gallery_of(id: &str) -> crate::gallery::GalleryRef {
    // `/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/galleries/{g}/…`
    let parts: Vec<&str> = id.split('/').collect();
    let after = |key: &str| {
        parts
            .iter()
            .position(|p| p.eq_ignore_ascii_case(key))
            .and_then(|i| parts.get(i + 1))
            .map(|s| s.to_string())
            .unwrap_or_default()
    };
    crate::gallery::GalleryRef {
        subscription: after("subscriptions"),
        resource_group: after("resourceGroups"),
        gallery: after("galleries"),
    }
}
