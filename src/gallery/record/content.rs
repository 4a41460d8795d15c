//! What a record's references were recorded for: the content of the version
//! (`gallery::content`), in the field of its kind.

use super::Record;
use super::{Binding, Content, Loaded};

impl Record {
    /// An empty record of `binding`, for a version of `content`.
    pub fn for_content(binding: &Binding, content: &Content) -> Self {
        let mut r = Record::new(binding, None);
        r.set_content(content);
        r
    }

    /// Record `content` as what the references are for (its digest in the field of its kind).
    pub fn set_content(&mut self, content: &Content) {
        match content {
            Content::Image(d) => self.image_sha256 = Some(d.clone()),
            Content::Vhd(d) => self.vhd_content = Some(d.clone()),
        }
    }

    /// The digest of `content`'s kind this record was written for.
    pub fn content_of_kind(&self, content: &Content) -> Option<&str> {
        match content {
            Content::Image(_) => self.image_sha256.as_deref(),
            Content::Vhd(_) => self.vhd_content.as_deref(),
        }
    }

    /// Whether the record was written for `content`.
    pub fn is_for(&self, content: &Content) -> bool {
        self.content_of_kind(content)
            .is_some_and(|s| s.eq_ignore_ascii_case(content.digest()))
    }
}

impl Loaded {
    /// The contents (`image_sha256`) the valid copies name, highest generation first: a copy
    /// overwritten by another record does not hide what the other copy says.
    pub fn contents(&self) -> Vec<String> {
        self.contents_like(&Content::image(""))
    }

    /// The digests of `like`'s kind (image or VHD content) the valid copies name, highest
    /// generation first.
    pub fn contents_like(&self, like: &Content) -> Vec<String> {
        let mut valid: Vec<&Record> = self.valid().collect();
        valid.sort_by_key(|r| std::cmp::Reverse(r.generation));
        let mut out: Vec<String> = Vec::new();
        for d in valid
            .iter()
            .filter_map(|r| r.content_of_kind(like).map(str::to_string))
        {
            if !out.contains(&d) {
                out.push(d);
            }
        }
        out
    }
}
