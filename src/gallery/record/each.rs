//! A removal written into each copy of a record whose copies disagree while the version is
//! absent (`Loaded::of_absent` chooses none): nothing tells which copy is the version's until it
//! is back (a restore then chooses by its content), so the removal goes into every copy that
//! holds the reference, each keeping its own content and life. Never one copy written over the
//! other (seed 3637), and never a removal answered as done on neither (seed 4269).

use std::collections::BTreeMap;

use super::{body_of, copy_names, Copy, Loaded, Record, RecordStore};
use crate::gallery::error::Result;

impl Record {
    /// This record without `references`, each remembered as removed.
    pub fn forgetting(&self, references: &[String]) -> Record {
        let keep: Vec<String> = self
            .references()
            .into_iter()
            .filter(|r| !references.contains(r))
            .collect();
        self.with_references(&keep, &BTreeMap::new(), references)
    }
}

/// Tombstone `references` in each valid copy of `loaded` that holds one, under the version's
/// lock. `Ok(false)`: a copy changed since it was read (read again); copies written before it
/// keep the removal, which a repeat finds done.
pub async fn forget_in_each_copy(
    store: &dyn RecordStore,
    loaded: &Loaded,
    references: &[String],
) -> Result<bool> {
    let names = copy_names(&loaded.lock);
    for (i, name) in names.iter().enumerate() {
        let Copy::Valid { etag, record } = &loaded.copies[i] else {
            continue;
        };
        if !references.iter().any(|r| record.holds(r)) {
            continue;
        }
        let mut next = record.forgetting(references);
        next.generation = record.generation + 1;
        if store
            .put_if(name, &body_of(&next)?, Some(etag))
            .await?
            .is_none()
        {
            return Ok(false);
        }
    }
    Ok(true)
}
