//! Which life of a version a record belongs to (its `publishedDate`), and saying so when a
//! record is not the version's.

use super::{tags, ImageVersion, Record};

/// A version's life as a record keeps it: its `publishedDate` in RFC 3339.
pub fn life_of(v: &ImageVersion) -> Option<String> {
    v.published_date.and_then(|d| {
        d.format(&time::format_description::well_known::Rfc3339)
            .ok()
    })
}

pub(super) fn same_instant(a: &str, b: &str) -> bool {
    let parse = |s: &str| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
    };
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Say, once, why a record that exists is not the version's (so an operator reading the log
/// knows why references it held are not counted).
pub(super) fn warn_not_this_life(rec: &Record, v: Option<&ImageVersion>) {
    if rec.references.is_empty() {
        return;
    }
    let why = match v {
        None => "the version it was written for is gone (deleted)".to_string(),
        Some(v) => match (tags::get(&v.tags, tags::IMAGE_SHA256), &rec.image_sha256) {
            (Some(vs), Some(rs)) if !rec.is_for_content(vs) => {
                format!("it was written for content {rs} but the version holds {vs}")
            }
            _ => format!(
                "it was written for the version published at {}, and the version now there was published at {} (deleted and made again)",
                rec.life.as_deref().unwrap_or("?"),
                life_of(v).unwrap_or_else(|| "?".into())
            ),
        },
    };
    tracing::warn!(
        definition = %rec.definition,
        version = %rec.version,
        "the reference record is not this version's ({why}); its references ({}) are not counted, and the next write replaces it",
        rec.references().join(", ")
    );
}
