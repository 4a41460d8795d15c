//! The references recorded on the versions themselves.

use std::sync::Arc;

use super::{Basis, Claim, ClaimTarget, Evidence, SourceError, UsageSource};
use crate::cleanup::inventory::Inventory;
use crate::gallery::tags;

/// References recorded on the versions (ours `sg_refs_*`, the Azure CPI's `stemcell_references`
/// and its legacy `stemcell_name`).
pub struct ReferencesSource {
    inventory: Arc<Inventory>,
}

impl ReferencesSource {
    pub const NAME: &'static str = "references recorded on the versions";

    pub fn new(inventory: Arc<Inventory>) -> Self {
        Self { inventory }
    }
}

#[async_trait::async_trait]
impl UsageSource for ReferencesSource {
    fn name(&self) -> String {
        Self::NAME.to_string()
    }

    async fn collect(&self) -> Result<Evidence, SourceError> {
        let claims = self
            .inventory
            .versions
            .iter()
            .filter_map(|v| {
                // Tag names are case-insensitive in Azure (`Stemcell_References` counts).
                let refs = tags::references(&tags::canonical_names(&v.tags));
                if refs.is_empty() {
                    return None;
                }
                Some(Claim {
                    target: ClaimTarget::VersionId(v.id.clone()),
                    reason: format!("referenced by {}", refs.join(", ")),
                    basis: Basis::Reference { refs },
                    source: self.name(),
                })
            })
            .collect();
        Ok(Evidence {
            source: self.name(),
            claims,
            holder: None,
        })
    }
}
