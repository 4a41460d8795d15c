//! The note a replacement of a Failed version leaves on its record right before its DELETE
//! (`Target::carry`; `record::Record::carried`).

use std::collections::BTreeMap;

use super::super::error::Result;
use super::super::lock::Held;
use super::super::model::ImageVersion;
use super::super::record::Record;
use super::super::tags;
use super::{save_record, Observed, Target};

/// Before the DELETE of a Failed version this tool replaces: note every reference it holds
/// (the Azure CPI's too: the new version carries them all) on its record, to carry into the
/// version created next (see [`Target::carry`]). `false`: the record changed meanwhile.
pub(super) async fn note_carried(
    t: &Target<'_>,
    held: &dyn Held,
    obs: &Observed,
    v: &ImageVersion,
) -> Result<bool> {
    let refs = tags::references(&v.tags);
    let sha = tags::get(&v.tags, tags::IMAGE_SHA256).map(|s| s.trim().to_ascii_lowercase());
    let base = obs
        .record
        .clone()
        .unwrap_or_else(|| Record::new(&t.binding(), sha.as_deref()));
    let mut next = base
        .with_references(&refs, &BTreeMap::new(), &[])
        .carrying_from(v, &refs);
    if sha.is_some() {
        next.image_sha256 = sha;
    }
    if obs.loaded.holds_exactly(&next) {
        return Ok(true);
    }
    save_record(held, &obs.loaded, next).await
}
