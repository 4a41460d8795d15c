//! What is in the gallery: every image definition and every version, with tags, state and
//! published date.

use crate::gallery::{GalleryApi, ImageDefinition, ImageVersion};

use super::CleanupError;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// Where the inventory was read (for messages).
    pub gallery: String,
    pub definitions: Vec<ImageDefinition>,
    pub versions: Vec<ImageVersion>,
}

impl Inventory {
    /// List the gallery: one call for the definitions, one per definition for its versions.
    /// Any failure fails the whole inventory (a partial one would misjudge `latest`).
    pub async fn gather(api: &dyn GalleryApi, gallery: &str) -> Result<Self, CleanupError> {
        let wrap = |cause| CleanupError::Inventory {
            gallery: gallery.to_string(),
            cause,
        };
        let mut definitions = api.list_definitions().await.map_err(wrap)?;
        definitions.sort_by(|a, b| a.name.cmp(&b.name));
        let mut versions = Vec::new();
        for def in &definitions {
            versions.extend(api.list_versions(&def.name).await.map_err(wrap)?);
        }
        Ok(Self {
            gallery: gallery.to_string(),
            definitions,
            versions,
        })
    }
}
