//! Applying a migration plan: `ensure` for every CID the plan creates or records, with the
//! version made from the CID's own blob (0 bytes uploaded), then, for a director on the plain
//! Azure CPI, the CID handed into `stemcell_references`.
//!
//! CIDs of one version run one after the other (the second finds the version the first made
//! and records itself on it, one tags write); versions run `parallel` at once. Every step is
//! `ensure`'s: idempotent, under the version's lock, safe to kill and repeat.

use std::collections::BTreeMap;

use super::{BlobProof, Entry, RecordFor, Verdict};
use crate::app::Context;
use crate::gallery::adopt::Adoption;
use crate::gallery::blob_store::BlobStore;
use crate::gallery::service::{EnsureRequest, Mode, Outcome};

/// What applying did with one CID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The version was made from the CID's blob, holding the CID.
    Created { version_id: String },
    /// The CID was recorded on the version (it was there, or made for an earlier CID).
    Recorded { version_id: String },
    /// A version of that stemcell version holds other content (exit 4).
    Conflict(String),
    /// It failed (exit 1); a re-run picks it up.
    Failed(String),
}

impl Applied {
    pub fn kind(&self) -> &'static str {
        match self {
            Applied::Created { .. } => "created",
            Applied::Recorded { .. } => "recorded",
            Applied::Conflict(_) => "conflict",
            Applied::Failed(_) => "failed",
        }
    }
}

/// Apply the plan: what each entry's application did (`None`: nothing to do for it).
pub async fn apply(
    conn: &Context,
    entries: &[Entry],
    record_for: RecordFor,
    parallel: usize,
) -> anyhow::Result<Vec<Option<Applied>>> {
    use futures::StreamExt;
    let store = conn.blob_store("making versions from the director's stemcell blobs")?;
    let acts = |e: &Entry| matches!(e.verdict, Verdict::Create | Verdict::Record { .. });
    // The storage account's resource id: a version's source names it (asked once).
    let account_id = if entries.iter().any(acts) {
        conn.storage_account_id().await?.unwrap_or_default()
    } else {
        String::new()
    };
    let mut groups: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for (i, e) in entries.iter().enumerate().filter(|(_, e)| acts(e)) {
        if let (Some(d), Some(k)) = (&e.definition, e.key()) {
            groups
                .entry((d.clone(), k.to_string()))
                .or_default()
                .push(i);
        }
    }
    let done = futures::stream::iter(groups.into_values().map(|group| {
        let account_id = &account_id;
        async move {
            let mut out = Vec::new();
            for i in group {
                let applied = apply_one(conn, store, &entries[i], record_for, account_id).await;
                out.push((i, applied));
            }
            out
        }
    }))
    .buffer_unordered(parallel.max(1))
    .collect::<Vec<_>>()
    .await;
    let mut results = vec![None; entries.len()];
    for (i, applied) in done.into_iter().flatten() {
        results[i] = Some(applied);
    }
    Ok(results)
}

/// `ensure` one CID: the version made from its blob, or found holding the same VHD, with the
/// CID recorded for its holder; then handed to the plain CPI when asked.
async fn apply_one(
    conn: &Context,
    store: &dyn BlobStore,
    e: &Entry,
    record_for: RecordFor,
    account_id: &str,
) -> Applied {
    let (Some(stemcell), Some(definition), Some(blob), Some(digest)) =
        (&e.stemcell, &e.definition, &e.blob, &e.digest)
    else {
        return Applied::Failed("the plan read no blob for it".into());
    };
    let cid = e.row.cid.as_str();
    let key = stemcell.version_key.as_str();
    tracing::info!(
        cid,
        definition,
        version = key,
        "migrating: the version from the blob, recording the CID"
    );
    let observed = match conn.service.api().get_version(definition, key, false).await {
        Ok(v) => v,
        Err(err) => return Applied::Failed(err.to_string()),
    };
    let arrival = conn.service.arrive(observed.as_ref(), Some(cid)).await;
    let req = EnsureRequest {
        stemcell: stemcell.clone(),
        mode: Mode::Director,
        create_env_suffix: conn.settings.create_env_definition_suffix().to_string(),
        source_uri: blob.clone(),
        storage_account_id: account_id.to_string(),
        target_regions: vec![],
        replica_count: conn.settings.replicas,
        exclude_from_latest: false,
        safeguards: conn.settings.safeguards,
        extra_tags: Default::default(),
        reference: Some(cid.to_string()),
        holder: e.row.holder.clone(),
        arrival,
        soft_deleted_checked: false,
    };
    let proof = BlobProof {
        digest: digest.clone(),
        store,
    };
    let adoption = Adoption {
        proof: &proof,
        unverified: false,
    };
    let ensured = match conn
        .service
        .ensure_observed(&req, Some(adoption), observed)
        .await
    {
        Ok(x) => x,
        Err(crate::gallery::Error::Conflict(m)) => return Applied::Conflict(m),
        Err(err) => return Applied::Failed(err.to_string()),
    };
    let version_id = ensured.version.id.clone();
    if record_for == RecordFor::AzureCpi {
        if let Err(err) = conn
            .service
            .hand_back(definition, key, &[cid.to_string()])
            .await
        {
            return Applied::Failed(format!(
                "recorded on {version_id} for the CPI front, but not handed to the plain Azure CPI: {err}. Nothing else changed; re-run `migrate --apply` once that is fixed"
            ));
        }
    }
    match ensured.outcome {
        Outcome::Created | Outcome::Recreated => Applied::Created { version_id },
        _ => Applied::Recorded { version_id },
    }
}
