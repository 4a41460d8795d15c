//! A removal that reaches a version's record (`forget_in_record`): the version gone, or about
//! to be deleted.

use super::super::error::{Error, Result};
use super::super::lock::Held;
use super::super::model::ImageVersion;
use super::super::record::{self, Record};
use super::super::tags;
use super::{save_record, Target};

/// Remove `references` from the record of the version as read (`v`), under the lock `held`:
/// a version that is gone (references carried for its re-create), or one about to be deleted
/// (the removal is remembered first). Returns the references it still holds.
pub async fn forget_in_record(
    t: &Target<'_>,
    held: &dyn Held,
    v: Option<&ImageVersion>,
    references: &[String],
) -> Result<Vec<String>> {
    for _ in 0..record::SAVE_ATTEMPTS {
        let loaded = record::load(held.records(), held.name(), &t.binding()).await?;
        // A version that is gone has a record bound to no life (carried to the next), or the
        // record of the life that ended or is suspended (soft-deleted: a restore brings its
        // removals back with it). One
        // about to be deleted gets a record if it has none: its removals must outlive a
        // soft delete, whoever recorded the reference (a plain Azure CPI's CID too), or a
        // restore brings them back with its tags.
        let rec = match (loaded.holding(v), v) {
            (Some(r), _) => r,
            // Copies that disagree, the version absent: each takes the removal.
            (None, None) if loaded.has_valid_copy() => {
                if record::forget_in_each_copy(held.records(), &loaded, references).await? {
                    return Ok(Vec::new());
                }
                continue;
            }
            (None, Some(ver)) => Record::new(
                &t.binding(),
                tags::get(&ver.tags, tags::IMAGE_SHA256).map(String::as_str),
            )
            .bound_to(ver),
            (None, None) => return Ok(Vec::new()),
        };
        let rec = &rec;
        // A record bound to a life (the version soft-deleted: its tags, which only a restore
        // shows again, may hold what the record does not, a plain CPI's CID) keeps every
        // removal; one carried to a create only drops what it carries.
        let done = match v {
            None if rec.life.is_none() => !references.iter().any(|r| rec.holds(r)),
            _ => references.iter().all(|r| rec.removed(r)),
        };
        if done {
            return Ok(rec.references());
        }
        let next = rec.forgetting(references);
        let keep = next.references();
        if save_record(held, &loaded, next).await? {
            return Ok(keep);
        }
    }
    Err(Error::Record(record::RecordError::Contended {
        blob: record::copy_names(held.name())[0].clone(),
        attempts: record::SAVE_ATTEMPTS,
    }))
}
