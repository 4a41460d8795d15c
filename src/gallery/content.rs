//! What identifies a version's content: the SHA-256 of the stemcell's `image` file
//! (`image_sha256`, the Azure CPI's tag, what every upload knows), or, for a version made from a
//! VHD already in storage whose image file nobody has any more (`migrate`: the page blobs the
//! Azure CPI left before the gallery), the VHD's content digest ([`crate::stemcell::content`],
//! tag [`tags::VHD_CONTENT`]).
//!
//! A version is the stemcell's when the tag of the stemcell's identity holds the same digest;
//! present and different is a conflict; absent is unknown, and `ensure` proves it the way it
//! adopts a version without `image_sha256` (`adopt`). A migrated version never carries an
//! `image_sha256` it cannot know: the Azure CPI compares that tag with the image it uploads
//! (REFERENCE.md, "How the Azure CPI uses a compute gallery"), and a made-up value would refuse
//! the real one.

use std::collections::BTreeMap;

use super::tags;

/// The digest a stemcell's content is known by, and which tag holds it on a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// SHA-256 of the stemcell's `image` file, lower case.
    Image(String),
    /// The content digest of its VHD, lower case.
    Vhd(String),
}

impl Content {
    pub fn image(sha256: &str) -> Self {
        Content::Image(sha256.trim().to_ascii_lowercase())
    }

    pub fn vhd(digest: &str) -> Self {
        Content::Vhd(digest.trim().to_ascii_lowercase())
    }

    /// The version tag this digest lives in.
    pub fn tag(&self) -> &'static str {
        match self {
            Content::Image(_) => tags::IMAGE_SHA256,
            Content::Vhd(_) => tags::VHD_CONTENT,
        }
    }

    /// The digest (lower case).
    pub fn digest(&self) -> &str {
        match self {
            Content::Image(d) | Content::Vhd(d) => d,
        }
    }

    /// The image's SHA-256, when that is what identifies it.
    pub fn image_sha256(&self) -> Option<&str> {
        match self {
            Content::Image(d) => Some(d),
            Content::Vhd(_) => None,
        }
    }

    /// The VHD's content digest, when that is what identifies it.
    pub fn vhd_content(&self) -> Option<&str> {
        match self {
            Content::Vhd(d) => Some(d),
            Content::Image(_) => None,
        }
    }

    /// What a version's tags record under this identity's tag (trimmed, lower case).
    pub fn recorded(&self, version_tags: &BTreeMap<String, String>) -> Option<String> {
        tags::get(version_tags, self.tag()).map(|d| d.trim().to_ascii_lowercase())
    }

    /// Whether a version with `version_tags` records this very content.
    pub fn held_by(&self, version_tags: &BTreeMap<String, String>) -> bool {
        self.recorded(version_tags).as_deref() == Some(self.digest())
    }

    /// `image_sha256 <hex>` or `VHD content digest <hex>`, for messages.
    pub fn describe(&self) -> String {
        format!("{} {}", self.what(), self.digest())
    }

    /// `image_sha256:<hex>` or `vhd_content:<hex>`: how a hand-over intent names the content
    /// its reference is for (`lock::Intent`), read back by [`Content::from_token`].
    pub fn token(&self) -> String {
        let kind = match self {
            Content::Image(_) => "image_sha256",
            Content::Vhd(_) => "vhd_content",
        };
        format!("{kind}:{}", self.digest())
    }

    /// The content a [`Content::token`] names; `None` for anything else (a token this build
    /// does not know, or not one at all).
    pub fn from_token(token: &str) -> Option<Self> {
        let (kind, digest) = token.split_once(':')?;
        let digest = digest.trim();
        if digest.is_empty() || !digest.chars().all(|c| c.is_ascii_hexdigit()) {
            return None;
        }
        match kind {
            "image_sha256" => Some(Content::image(digest)),
            "vhd_content" => Some(Content::vhd(digest)),
            _ => None,
        }
    }

    /// What the digest is, for messages.
    pub fn what(&self) -> &'static str {
        match self {
            Content::Image(_) => "image_sha256",
            Content::Vhd(_) => "VHD content digest",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_kind_and_reads_back() {
        for c in [Content::image("AB12"), Content::vhd("cd34")] {
            assert_eq!(Content::from_token(&c.token()), Some(c.clone()));
        }
        assert_eq!(Content::image("ab").token(), "image_sha256:ab");
        for bad in [
            "",
            "ab",
            "image_sha256:",
            "image_sha256:xyz",
            "md5:ab",
            "vhd_content:a b",
        ] {
            assert_eq!(Content::from_token(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn each_identity_reads_its_own_tag_only() {
        let t = BTreeMap::from([
            ("image_sha256".to_string(), " AB ".to_string()),
            (tags::VHD_CONTENT.to_string(), "cd".to_string()),
        ]);
        assert!(Content::image("ab").held_by(&t));
        assert!(!Content::image("cd").held_by(&t));
        assert!(Content::vhd("CD").held_by(&t));
        assert!(!Content::vhd("ab").held_by(&t));
        assert!(!Content::vhd("cd").held_by(&BTreeMap::from([(
            "image_sha256".to_string(),
            "cd".to_string()
        )])));
    }
}
