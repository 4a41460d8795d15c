//! Adopting a version that carries no `image_sha256`: the Azure CPI v52.0.1–v53.0.0 made its
//! gallery versions without it (REFERENCE.md, "How the Azure CPI uses a compute gallery":
//! v53.0.1 added the tag). Such a version is reused only when its content is proven: the
//! content digest ([`crate::stemcell::content`]) of its source blob equals the stemcell's. Then
//! the stemcell's `image_sha256` is recorded on it, with the caller's reference, in one tags
//! write under the version's lock, and `ensure` goes on as for any version of the same content.
//! A source blob that is gone or cannot be read proves nothing: refused, unless the operator
//! said `--adopt-unverified` / `stemcell_gallery_adopt_unverified` (then adopted without proof,
//! and the output says so).

use std::collections::BTreeMap;

use super::content::Content;
use super::error::{Error, Result};
use super::guarded::{observe, save_record, Target};
use super::lock::Held;
use super::record::Record;
use super::tags;

/// The override that adopts a version whose source cannot be read, named in every refusal.
pub const OVERRIDE: &str = "--adopt-unverified (cpi.json: azure.stemcell_gallery_adopt_unverified: true; config file: adopt_unverified = true)";

/// What the version's source blob holds, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceContent {
    /// Its content digest.
    Digest(String),
    /// The blob does not exist (404).
    Gone,
    /// It could not be read (why).
    Unreadable(String),
}

/// Reads the two sides of the proof (implemented outside the domain: the stemcell archive and
/// the blob store).
#[async_trait::async_trait]
pub trait ContentProof: Send + Sync {
    /// The content digest of the stemcell being ensured (its `root.vhd`).
    async fn local_digest(&self) -> Result<String>;
    /// The content digest of the blob at `uri`. `Err` only for a failure worth retrying
    /// (throttling, server errors, no answer): that is no evidence the blob is unreadable.
    async fn source_digest(&self, uri: &str) -> Result<SourceContent>;
}

/// How `ensure` treats a version without `image_sha256`.
#[derive(Clone, Copy)]
pub struct Adoption<'a> {
    pub proof: &'a dyn ContentProof,
    /// Adopt without proof when the source blob is gone or unreadable.
    pub unverified: bool,
}

/// How a version without `image_sha256` came to carry this stemcell's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "proof", rename_all = "kebab-case")]
pub enum Adopted {
    /// Its source blob holds the stemcell's VHD (both content digests are `content_digest`).
    ContentMatched { content_digest: String },
    /// Adopted without proof, as the operator asked; `why` the proof was impossible.
    Unverified { why: String },
}

impl Adopted {
    /// One sentence for logs and human output.
    pub fn describe(&self, version_id: &str) -> String {
        match self {
            Adopted::ContentMatched { content_digest } => format!(
                "adopted {version_id} (made without image_sha256, e.g. by Azure CPI v52.0.1-v53.0.0): its source blob holds this stemcell's VHD (content digest {content_digest})"
            ),
            Adopted::Unverified { why } => format!(
                "adopted {version_id} WITHOUT proof of its content, as asked by --adopt-unverified: {why}"
            ),
        }
    }
}

/// The pure judgement: the two digests (or what became of the source) and the operator's
/// override → adopted, or a conflict (exit 4) naming what was compared and what to do.
pub fn judge(
    version_id: &str,
    source_uri: Option<&str>,
    local: &str,
    source: &SourceContent,
    unverified: bool,
) -> Result<Adopted> {
    let shown = source_uri
        .map(crate::redact::uri)
        .unwrap_or_else(|| "none recorded".into());
    let unprovable = |why: String| {
        if unverified {
            Ok(Adopted::Unverified { why })
        } else {
            Err(Error::Conflict(format!(
                "gallery version {version_id} has no image_sha256 (made by Azure CPI v52.0.1-v53.0.0?) and its content cannot be proven: {why}. Nothing was changed. If you know it holds this stemcell, re-run with {OVERRIDE} to record this stemcell's image_sha256 on it without proof; otherwise remove it once nothing uses it, or build the stemcell with a new version"
            )))
        }
    };
    match source {
        SourceContent::Digest(d) if d.eq_ignore_ascii_case(local) => {
            Ok(Adopted::ContentMatched {
                content_digest: local.to_ascii_lowercase(),
            })
        }
        SourceContent::Digest(d) => Err(Error::Conflict(format!(
            "gallery version {version_id} has no image_sha256 and holds different content: the content digest of its source blob {shown} is {d}, this stemcell's VHD's is {local}. Nothing was changed. Remedy: once nothing uses that version, remove it (stemcell-gallery delete), or build the stemcell with a new version"
        ))),
        SourceContent::Gone if source_uri.is_none() => {
            unprovable("the version records no source blob".into())
        }
        SourceContent::Gone => unprovable(format!("its source blob {shown} is gone")),
        SourceContent::Unreadable(why) => {
            unprovable(format!("its source blob {shown} cannot be read ({why})"))
        }
    }
}

/// Under the version's lock `held`: record `content` (its digest, in the tag of its kind: the
/// stemcell's `image_sha256`, or the VHD content digest `migrate` knows) together with
/// `reference` (added to the references there now, held by `holder`) in one tags write — only
/// while the version is still the one proven: Succeeded, without that tag, made from
/// `source_uri`. `false` when it changed (nothing written; the caller observes again and decides
/// anew). The reference record is written first, as for every reference write. The write is
/// verified by the caller's next observation, as every reference write is (a missing reference
/// is then merged by the ordinary path).
pub async fn record(
    t: &Target<'_>,
    held: &dyn Held,
    source_uri: Option<&str>,
    content: &Content,
    reference: Option<&str>,
    holder: Option<&str>,
) -> Result<bool> {
    let obs = observe(t, held).await?;
    let (Some(raw), Some(v)) = (&obs.raw, &obs.healed) else {
        return Ok(false);
    };
    if tags::has(&raw.tags, content.tag())
        || raw.source_uri.as_deref() != source_uri
        || !raw.phase().serves_image()
    {
        return Ok(false);
    }
    let mut refs = tags::references(&v.tags);
    if let Some(r) = reference {
        if !refs.iter().any(|x| x == r) {
            refs.push(r.to_string());
        }
    }
    let mut with_digest = tags::canonical_names(&raw.tags);
    with_digest.insert(content.tag().to_string(), content.digest().to_string());
    let new_tags = tags::with_references(&with_digest, &refs, &tags::sentinel(t.definition, t.key))
        .map_err(|e| Error::VersionTags {
            resource: raw.id.clone(),
            source_error: e,
        })?;
    let holders: BTreeMap<String, String> = reference
        .zip(holder)
        .map(|(r, h)| (r.to_string(), h.to_string()))
        .into_iter()
        .collect();
    let mut next = obs
        .record
        .clone()
        .unwrap_or_else(|| Record::for_content(&t.binding(), content))
        .after_write(&new_tags, &holders, &[])
        .bound_to(raw);
    next.set_content(content);
    if !save_record(held, &obs.loaded, next).await? {
        return Ok(false);
    }
    held.check().await?;
    match t.api.set_version_tags(t.definition, t.key, &new_tags).await {
        // Adopted holding this reference: held means locked, under the lock, as after every
        // reference write (`guarded::merge_references`).
        Ok(written) => {
            super::protect::settle(t.api, &written).await;
            Ok(true)
        }
        // Another write in flight: observe again.
        Err(Error::Busy { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "/subscriptions/s/.../versions/1.506.0";

    #[test]
    fn equal_digests_adopt() {
        let r = judge(
            ID,
            Some("u"),
            "AB",
            &SourceContent::Digest("ab".into()),
            false,
        );
        assert_eq!(
            r.unwrap(),
            Adopted::ContentMatched {
                content_digest: "ab".into()
            }
        );
    }

    #[test]
    fn different_digests_are_a_conflict_naming_both_even_with_the_override() {
        for unverified in [false, true] {
            let e = judge(
                ID,
                Some("u"),
                "aa",
                &SourceContent::Digest("bb".into()),
                unverified,
            )
            .unwrap_err();
            let m = e.to_string();
            assert!(matches!(e, Error::Conflict(_)));
            assert!(
                m.contains("aa") && m.contains("bb") && m.contains(ID),
                "{m}"
            );
        }
    }

    #[test]
    fn a_gone_or_unreadable_source_names_the_override_and_is_adopted_with_it() {
        for s in [SourceContent::Gone, SourceContent::Unreadable("403".into())] {
            let m = judge(ID, Some("u"), "aa", &s, false)
                .unwrap_err()
                .to_string();
            assert!(m.contains("--adopt-unverified") && m.contains(ID), "{m}");
            assert!(matches!(
                judge(ID, Some("u"), "aa", &s, true).unwrap(),
                Adopted::Unverified { .. }
            ));
        }
    }
}
