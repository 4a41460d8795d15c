//! The knobs of a cleanup run that are not evidence: grace period, keep-latest, protect tag.

use std::time::Duration;

use time::OffsetDateTime;

use crate::gallery::tags;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Versions younger than this (by published date) are kept.
    pub min_age: Duration,
    /// The newest N Succeeded versions of each definition are kept.
    pub keep_latest: usize,
    /// Versions carrying this tag (any value) are kept.
    pub protect_tag: String,
    /// The planner's clock (passed in so planning stays pure): Azure's clock, as the `Date`
    /// header of its answers showed it. `None` when no answer carried one: then no version is
    /// old enough to delete (a host clock that is off must never make a young version old).
    pub now: Option<OffsetDateTime>,
    /// The suffix of create-env definitions (the configured one, else `-create-env`): a version
    /// without our mode tag is shown as create-env when its definition ends with it.
    pub create_env_suffix: String,
}

impl Policy {
    pub const DEFAULT_MIN_AGE: Duration = Duration::from_secs(24 * 3600);
    pub const DEFAULT_KEEP_LATEST: usize = 2;

    /// The defaults: 24 h grace, keep the latest 2, protect tag `stemcell_gallery_protect`.
    pub fn new(now: OffsetDateTime) -> Self {
        Self {
            min_age: Self::DEFAULT_MIN_AGE,
            keep_latest: Self::DEFAULT_KEEP_LATEST,
            protect_tag: tags::PROTECT.to_string(),
            now: Some(now),
            create_env_suffix: crate::stemcell::naming::DEFAULT_CREATE_ENV_SUFFIX.to_string(),
        }
    }
}
