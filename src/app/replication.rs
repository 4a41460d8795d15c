//! Waiting for a new version to reach every target region (seed waits before it reports).

use std::time::{Duration, Instant};

use crate::gallery::api::GalleryApi;
use crate::gallery::ImageVersion;

/// Bound on the wait for replication unless the operation timeout
/// (`STEMCELL_GALLERY_OPERATION_TIMEOUT`) says otherwise.
pub const REPLICATION_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// Poll the version with its replication status until every region has it; fail on Failed.
pub async fn wait_for_replication(
    api: &dyn GalleryApi,
    definition: &str,
    key: &str,
    limit: Option<Duration>,
) -> anyhow::Result<ImageVersion> {
    let limit = limit.unwrap_or(REPLICATION_TIMEOUT);
    let started = Instant::now();
    let mut delay = Duration::from_millis(200);
    let mut wait = crate::progress::Wait::new(format!(
        "gallery version {definition}/{key} to replicate to every target region"
    ));
    loop {
        let v = api
            .get_version(definition, key, true)
            .await?
            .ok_or_else(|| {
                anyhow::anyhow!("gallery version {definition}/{key} disappeared while replicating; something deleted it, re-run seed")
            })?;
        let Some(rep) = &v.replication else {
            // No replication status reported: the provisioning state is all there is.
            return Ok(v);
        };
        let line = rep
            .summary
            .iter()
            .map(|r| {
                format!(
                    "{} {}{}",
                    r.region,
                    r.state,
                    r.progress.map(|p| format!(" {p}%")).unwrap_or_default()
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        match rep.aggregated_state.to_ascii_lowercase().as_str() {
            "completed" => {
                if !line.is_empty() {
                    tracing::info!(version = %v.id, "replicated: {line}");
                }
                return Ok(v);
            }
            "failed" => {
                let details: Vec<String> = rep
                    .summary
                    .iter()
                    .filter(|r| r.state.eq_ignore_ascii_case("failed"))
                    .map(|r| {
                        format!(
                            "{}: {}",
                            r.region,
                            r.details.as_deref().unwrap_or("no details")
                        )
                    })
                    .collect();
                anyhow::bail!(
                    "replication of gallery version {} failed ({}); the version exists, fix the region's quota or storage type and update its target regions, or delete it and seed again",
                    v.id,
                    details.join("; ")
                );
            }
            _ => {}
        }
        // Per region, with its percent (a region can take many minutes).
        wait.note(&line);
        if started.elapsed() > limit {
            anyhow::bail!(
                "gallery version {} is still replicating after {} s ({line}); it continues in Azure, re-run seed later to wait again (or raise {})",
                v.id,
                limit.as_secs(),
                crate::config::OPERATION_TIMEOUT_ENV
            );
        }
        tokio::time::sleep(delay.min(limit)).await;
        delay = (delay * 2).min(Duration::from_secs(15));
    }
}
