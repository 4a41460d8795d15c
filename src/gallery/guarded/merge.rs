//! The two steps of [`merge_references`](super::merge_references) before its writes: taking
//! over the references that writers waiting for the lock hand over, and building the write a
//! fresh read calls for.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::super::error::{Error, Result};
use super::super::lock::{Carrying, Held, Intent};
use super::super::model::ImageVersion;
use super::super::record::{self, Record};
use super::super::tags;
use super::{gather_intents, observe, shows, valid_intent, Delta, Observed, Target};

/// Take the references that writers reaching the version with this one hand over into `delta`
/// (gathered as `held` says, see `lock::Gather`); `obs` is read again if the gathering waited.
/// Returns the ids of the intents taken, to delete once a read shows them applied.
pub(super) async fn take_handed_over(
    t: &Target<'_>,
    held: &dyn Held,
    started: Instant,
    obs: &mut Observed,
    delta: &mut Delta,
) -> Result<Vec<String>> {
    let (definition, key) = (t.definition, t.key);
    let mut claimed: Vec<String> = Vec::new();
    // Writers reaching the version with this one hand their references over now: gather
    // them into this write (see `lock::Gather`).
    let version_tags = obs.raw.as_ref().map(|v| v.tags.clone()).unwrap_or_default();
    let life = obs.raw.as_ref().and_then(record::life_of);
    let carrying = Carrying {
        tags: &version_tags,
        create: false,
        life: life.as_deref(),
    };
    let (intents, waited) = gather_intents(held, started, &carrying).await?;
    if waited {
        // The write is built on a read made after the gathering.
        *obs = observe(t, held).await?;
    }
    let mut dropped = Vec::new();
    for i in valid_only(t, held, intents).await? {
        if delta.remove.contains(&i.reference) {
            dropped.push(i.id);
            continue;
        }
        if !delta.add.contains(&i.reference) {
            delta.add.push(i.reference.clone());
        }
        if let Some(h) = &i.holder {
            delta
                .holders
                .entry(i.reference.clone())
                .or_insert_with(|| h.clone());
        }
        claimed.push(i.id);
    }
    held.finish_intents(&dropped).await?;
    if !claimed.is_empty() {
        tracing::info!(
            definition,
            version = key,
            handed_over = claimed.len(),
            "recording the references handed over by waiting writers in this write"
        );
    }
    Ok(claimed)
}

/// The intents among `intents` this tool would have written, their holders as the record keeps
/// them. An intent is input like any other (a blob anyone with access to the container can
/// write): one that is not valid never reaches the record; it is reported and removed (its
/// writer is told it was not recorded).
async fn valid_only(t: &Target<'_>, held: &dyn Held, intents: Vec<Intent>) -> Result<Vec<Intent>> {
    let mut valid = Vec::new();
    let mut dropped = Vec::new();
    for mut i in intents {
        match valid_intent(&i) {
            Ok(holder) => {
                i.holder = holder;
                valid.push(i);
            }
            Err(why) => {
                tracing::warn!(
                    definition = t.definition,
                    version = t.key,
                    intent = %i.id,
                    "ignoring and removing a handed-over reference that is not valid ({why}); its writer is told it was not recorded"
                );
                dropped.push(i.id);
            }
        }
    }
    held.finish_intents(&dropped).await?;
    Ok(valid)
}

/// Issue 49: the references writers hand to a create, gathered right before its PUT (as a
/// reference write gathers, `lock::Gather`, from `started`): the valid ones for the create's
/// `content`, to ride in the PUT and in the record written before it. Each stays claimed until
/// [`finish_shown`] sees it on the version.
pub async fn take_for_create(
    t: &Target<'_>,
    held: &dyn Held,
    started: Instant,
    content: &super::super::content::Content,
) -> Result<Vec<Intent>> {
    let put_tags = BTreeMap::from([(content.tag().to_string(), content.digest().to_string())]);
    let carrying = Carrying {
        tags: &put_tags,
        create: true,
        life: None,
    };
    let (intents, _) = gather_intents(held, started, &carrying).await?;
    // Two intents of one reference (a retried request) make one entry; both are finished.
    let taken = valid_only(t, held, intents).await?;
    if !taken.is_empty() {
        tracing::info!(
            definition = t.definition,
            version = t.key,
            handed_over = taken.len(),
            "creating the version with the references handed over by writers that arrived while it was being made"
        );
    }
    Ok(taken)
}

/// Finish the intents among `taken` whose reference `v` (a read of the version, after the
/// create's PUT was accepted) shows, for the content it holds: their waiters, seeing them
/// gone, read the version and find their reference. Those it does not show stay claimed until
/// the lock is released, then pending again for their writers (or the next holder).
pub async fn finish_shown(held: &dyn Held, taken: &[Intent], v: &ImageVersion) -> Result<()> {
    let done: Vec<String> = taken
        .iter()
        .filter(|i| {
            i.content
                .as_ref()
                .is_some_and(|c| shows(v, &i.reference, c))
        })
        .map(|i| i.id.clone())
        .collect();
    held.finish_intents(&done).await
}

/// The write a fresh read of the version calls for, and whether each half is already done.
pub(super) struct Write {
    /// The references the version is to hold.
    pub want: Vec<String>,
    /// The version's tags carrying `want`.
    pub new_tags: BTreeMap<String, String>,
    /// The tags already say it.
    pub tags_ok: bool,
    /// The record to write.
    pub next: Record,
    /// The record already holds exactly `next`.
    pub record_ok: bool,
}

/// The write that applies `delta` to the version `raw` as `obs` read it: every reference there
/// now (tags merged with the record) that `delta` does not remove, plus `delta.add`. `wrote`:
/// the life (`publishedDate`) this call last sent a tag write to, and the references of that
/// write it did not add itself.
pub(super) fn write_for(
    t: &Target<'_>,
    obs: &Observed,
    raw: &ImageVersion,
    delta: &Delta,
    wrote: &Option<(Option<String>, Vec<String>)>,
) -> Result<Write> {
    let (definition, key) = (t.definition, t.key);
    let raw_tags = tags::canonical_names(&raw.tags);
    let current = record::merged(&raw_tags, obs.record.as_ref());
    let mut want: Vec<String> = current
        .iter()
        .filter(|r| !delta.remove.contains(r))
        .cloned()
        .collect();
    // Made again (by someone else) since this call's last tag write was built: that write,
    // which no condition can hold back (no If-Match on versions), may have landed on the
    // new life with the old one's references. They are not the new life's: off again.
    if let Some((life, written)) = wrote {
        if *life != record::life_of(raw) {
            let carried: Vec<&String> = want.iter().filter(|r| written.contains(r)).collect();
            if !carried.is_empty() {
                tracing::warn!(definition, version = key, references = ?carried, "the version was made again while this call's tag write was under way; the references that write carried from the version before are taken off the new one");
            }
            want.retain(|r| !written.contains(r));
        }
    }
    for r in &delta.add {
        if !want.contains(r) {
            want.push(r.clone());
        }
    }
    let sentinel = tags::sentinel(definition, key);
    let new_tags =
        tags::with_references_handing_back(&raw_tags, &want, &sentinel, &delta.hand_back).map_err(
            |e| Error::VersionTags {
                resource: raw.id.clone(),
                source_error: e,
            },
        )?;
    // Earlier formats (our old `stemcell_name`, `sg_refs_NN`, a phantom entry) are rewritten
    // by the first reference write that meets them, even when the references are right.
    let tags_ok = if delta.is_empty() {
        tags::references(&raw_tags) == want
    } else {
        new_tags == raw_tags
    };
    let version_sha = tags::get(&raw_tags, tags::IMAGE_SHA256).cloned();
    let base = match &obs.record {
        Some(r) => r.clone(),
        // No record yet, or one of other content: this write starts it (over the old one).
        None => Record::new(&t.binding(), version_sha.as_deref()),
    };
    // References handed back keep their entries (holders) until a read shows them in
    // `stemcell_references` (an interrupted hand-back loses nothing; its re-run finds them).
    let landed: Vec<String> = tags::sourced_references(&raw_tags)
        .into_iter()
        .filter(|(_, s)| *s == tags::Source::StemcellReferences)
        .map(|(r, _)| r)
        .collect();
    let mut next = base
        .handing_back_now(&delta.hand_back, &landed)
        .after_write(&new_tags, &delta.holders, &delta.remove)
        .bound_to(raw);
    if next.image_sha256.is_none() {
        next.image_sha256 = version_sha.map(|s| s.trim().to_ascii_lowercase());
    }
    let record_ok = obs.loaded.holds_exactly(&next);
    Ok(Write {
        want,
        new_tags,
        tags_ok,
        next,
        record_ok,
    })
}
