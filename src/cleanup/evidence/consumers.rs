//! The gallery's consumers: VMs, scale sets (model and instances) and managed disks created from
//! its images.

use std::sync::Arc;

use super::{Basis, Claim, ClaimTarget, Evidence, SourceError, UsageSource};
use crate::gallery::latest::{ImageRef, VersionSel};
use crate::gallery::{Consumer, GalleryApi};

/// VMs, scale sets (model and instances) and managed disks created from gallery images, listed
/// once through [`GalleryApi::list_consumers`].
pub struct ConsumersSource {
    api: Arc<dyn GalleryApi>,
}

impl ConsumersSource {
    pub const NAME: &'static str = "gallery consumers (VMs, scale sets, disks)";

    pub fn new(api: Arc<dyn GalleryApi>) -> Self {
        Self { api }
    }
}

/// What a consumer's image reference claims, if it is a gallery image (ARM id, shared or
/// community gallery id; segment names compared case-insensitively).
fn consumer_target(c: &Consumer) -> Option<ClaimTarget> {
    ImageRef::parse(&c.image_id)?;
    Some(ClaimTarget::ConsumerImage(c.clone()))
}

#[async_trait::async_trait]
impl UsageSource for ConsumersSource {
    /// Names the subscriptions read, when the adapter says: only those scopes are read.
    fn name(&self) -> String {
        let scopes = self.api.consumer_scopes();
        if scopes.is_empty() {
            Self::NAME.to_string()
        } else {
            format!("{} in subscriptions {}", Self::NAME, scopes.join(", "))
        }
    }

    async fn collect(&self) -> Result<Evidence, SourceError> {
        let consumers = self.api.list_consumers().await?;
        let claims = consumers
            .into_iter()
            .filter_map(|c| {
                let target = consumer_target(&c)?;
                let latest =
                    ImageRef::parse(&c.image_id).is_some_and(|r| r.version == VersionSel::Latest);
                let reason = if latest {
                    format!(
                        "{} {} was created from the latest version of {}",
                        c.kind.name(),
                        c.id,
                        c.image_id
                    )
                } else {
                    format!("{} {} was created from it", c.kind.name(), c.id)
                };
                Some(Claim {
                    target,
                    basis: Basis::Consumer {
                        kind: c.kind,
                        id: c.id,
                        image_id: c.image_id,
                    },
                    reason,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gallery::ConsumerKind;

    #[test]
    fn consumer_image_references_of_every_gallery_form_are_claims() {
        let def =
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/images/d";
        for image in [
            format!("{def}/versions/1.2.0"),
            format!("{def}/versions/LATEST"),
            def.to_string(),
            "/SharedGalleries/uniq-G/Images/d/Versions/1.2.0".to_string(),
            "/communitygalleries/pub-1/images/d/versions/latest".to_string(),
        ] {
            let c = Consumer::new(ConsumerKind::VirtualMachine, "vm", image.clone());
            assert_eq!(
                consumer_target(&c),
                Some(ClaimTarget::ConsumerImage(c.clone())),
                "{image}"
            );
        }
        for image in [
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/images/managed",
            "",
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g",
        ] {
            let c = Consumer::new(ConsumerKind::Disk, "d", image);
            assert_eq!(consumer_target(&c), None, "{image}");
        }
    }
}
