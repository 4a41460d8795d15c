//! The cleanup use case: gather the inventory and every source of evidence, plan, and (when
//! asked) apply the plan under the writers' locks. The planner and executor are `cleanup`'s;
//! this assembles them; the front ends render what it returns.

use std::sync::Arc;

use crate::app::{Clock, Context};
use crate::cleanup::evidence::{ConsumersSource, EvidenceFiles, ReferencesSource};
use crate::cleanup::{
    collect_all, plan, ApplyOutcome, BlobCleaner, Executor, Inventory, Plan, Policy, UsageSource,
};
use crate::gallery::blob_store::BlobStore;

/// What to plan (and apply) with.
#[derive(Debug, Clone)]
pub struct Request {
    /// Delete what the plan marks `delete` (otherwise only plan).
    pub apply: bool,
    /// The evidence files given (director stemcell lists, create-env states).
    pub evidence: EvidenceFiles,
    /// The policy; its `now` is replaced by the clock's.
    pub policy: Policy,
    /// Deletions running at once.
    pub concurrency: usize,
    /// With `apply`: the reviewed dry run; nothing is deleted unless the fresh plan deletes
    /// exactly its versions, unchanged.
    pub saved_plan: Option<crate::cleanup::saved::SavedPlan>,
    /// With `apply`: also delete the source blobs of deleted versions that no remaining version
    /// uses (inside the configured storage account only).
    pub blobs: bool,
}

/// The plan, and what applying it did.
#[derive(Debug)]
pub struct Done {
    pub plan: Plan,
    pub applied: Option<ApplyOutcome>,
}

/// Deletes source blobs, only inside the configured storage account.
pub struct StorageBlobCleaner {
    storage: Arc<dyn BlobStore>,
}

impl StorageBlobCleaner {
    pub fn new(storage: Arc<dyn BlobStore>) -> Self {
        StorageBlobCleaner { storage }
    }
}

#[async_trait::async_trait]
impl BlobCleaner for StorageBlobCleaner {
    async fn delete_blob(&self, uri: &str) -> Result<(), String> {
        let base = self.storage.endpoint();
        let shown = crate::redact::uri(uri);
        let (container, blob) = crate::config::resource::blob_in_account(base, uri).ok_or_else(|| {
            format!("blob {shown} is not in the configured storage account {base} (or names no container and blob); left in place")
        })?;
        self.storage
            .delete(&container, &blob)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// Plan a cleanup of the context's gallery, and apply it when the request says so, under the
/// writers' per-version locks (the context's), with ages on the context's clock.
pub async fn run(ctx: &Context, request: &Request) -> anyhow::Result<Done> {
    let cleaner: Option<Arc<dyn BlobCleaner>> = if request.blobs {
        let storage = ctx.blob_store_shared("cleanup --blobs")?;
        Some(Arc::new(StorageBlobCleaner::new(storage)))
    } else {
        None
    };
    let api = ctx.service.api().clone();
    let gallery = format!("gallery {}", ctx.settings.gallery);
    let gallery = gallery.as_str();
    // The writers' per-version locks, named for the gallery's identity as the writers name them.
    let locks = ctx.service.locks().clone();
    let lock_gallery = ctx.service.gallery();
    let mut inventory = Inventory::gather(api.as_ref(), gallery).await?;
    // The versions as their reference records say they are (a reference a late tag write
    // erased still keeps its version). Without a storage account there are no records.
    if let Some(store) = locks.records() {
        inventory.read_records(store, lock_gallery).await?;
    }
    let inventory = Arc::new(inventory);
    // After the inventory: its answers carried Azure's `Date`.
    let now = match ctx.clock {
        Clock::Azure => api.server_time(),
        Clock::Fixed(t) => Some(t),
    };
    if now.is_none() {
        tracing::warn!(
            "Azure's answers carried no Date header: no version's age can be measured on Azure's clock, so none is old enough to delete"
        );
    }
    let policy = Policy {
        now,
        ..request.policy.clone()
    };

    let mut sources: Vec<Box<dyn UsageSource>> =
        vec![Box::new(ReferencesSource::new(inventory.clone()))];
    sources.extend(request.evidence.sources());
    sources.push(Box::new(ConsumersSource::new(api.clone())));
    let evidence = collect_all(&sources).await?;

    let planned = plan(&inventory, &evidence, &policy);
    if let (true, Some(saved)) = (request.apply, &request.saved_plan) {
        let changes = saved.changes(&planned);
        if !changes.is_empty() {
            return Err(crate::error::Coded::new(
                crate::error::Exit::Error,
                format!(
                    "cleanup refused, nothing was deleted: the gallery or its evidence changed since the saved plan ({}); review a new dry run and apply that",
                    changes.join("; ")
                ),
            )
            .into());
        }
    }
    let applied = if request.apply {
        let mut executor =
            Executor::new(api.clone(), request.concurrency).with_locks(locks, lock_gallery);
        if let Some(c) = cleaner {
            executor = executor.with_blob_cleaner(c);
        }
        let mut outcome = executor
            .apply(&inventory, &evidence, &planned, &policy)
            .await?;
        if outcome.deleted() > 0 {
            outcome.deleted_how = Some(api.deleted_how().await);
        }
        // Held means locked: a lock a crash, a refused PUT or an operator's hand left out of
        // line is repaired here (under each version's lock, on a fresh read).
        for id in &planned.lock_repairs {
            if let Some(v) = inventory.versions.iter().find(|v| &v.id == id) {
                if ctx.service.repair_lock(&v.definition, &v.version).await {
                    outcome.locks_repaired.push(id.clone());
                }
            }
        }
        Some(outcome)
    } else {
        None
    };
    Ok(Done {
        plan: planned,
        applied,
    })
}
