//! The one lifecycle model (DESIGN.md §3 "Rules of the house"): where a version is in its life,
//! and what that allows. Every decision that depends on a provisioning state asks here, through
//! `Phase` and its methods; nowhere else names a state (tests/integration/architecture.rs checks).
//! A state Azure adds is one arm of `ProvisioningState::phase`, and every method below is an
//! exhaustive match, so the compiler names each answer it must give.

use time::OffsetDateTime;

use super::model::{ImageVersion, ProvisioningState, SoftDelete, SoftDeletedVersion};

/// A provisioning state as the decisions read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Succeeded: the image is whole and serves consumers.
    Serving,
    /// Creating, Updating or Migrating: Azure is working on it.
    Working,
    /// Deleting: on its way out; its source blob may be going too.
    Leaving,
    /// Failed: the last operation failed; the image may be partial.
    Failed,
    /// Canceled: the last operation stopped part-way.
    Canceled,
    /// A state this tool does not know (Azure added it since): nothing is decided on it.
    Unknown,
}

impl ProvisioningState {
    /// The one place a provisioning state is classified.
    pub fn phase(&self) -> Phase {
        match self {
            Self::Succeeded => Phase::Serving,
            Self::Creating | Self::Updating | Self::Migrating => Phase::Working,
            Self::Deleting => Phase::Leaving,
            Self::Failed => Phase::Failed,
            Self::Canceled => Phase::Canceled,
            Self::Other(_) => Phase::Unknown,
        }
    }
}

impl Phase {
    /// Its image is whole: consumers can run from it, it may be `latest`, it ranks among the
    /// newest, it can be reused or referenced.
    pub fn serves_image(self) -> bool {
        match self {
            Phase::Serving => true,
            Phase::Working | Phase::Leaving | Phase::Failed | Phase::Canceled | Phase::Unknown => {
                false
            }
        }
    }

    /// Azure is still working on it (a long-running operation's poll goes on; cleanup keeps it
    /// as in progress).
    pub fn operation_under_way(self) -> bool {
        match self {
            Phase::Working | Phase::Leaving => true,
            Phase::Serving | Phase::Failed | Phase::Canceled | Phase::Unknown => false,
        }
    }

    /// Its last operation did not finish, so it is replaced from a new upload (same content) or
    /// refused (other content), never reused.
    pub fn replaceable(self) -> bool {
        match self {
            Phase::Failed | Phase::Canceled => true,
            Phase::Serving | Phase::Working | Phase::Leaving | Phase::Unknown => false,
        }
    }

    /// On its way out: wait for it to go before anything else.
    pub fn leaving(self) -> bool {
        match self {
            Phase::Leaving => true,
            Phase::Serving | Phase::Working | Phase::Failed | Phase::Canceled | Phase::Unknown => {
                false
            }
        }
    }

    /// Its last operation failed.
    pub fn failed(self) -> bool {
        match self {
            Phase::Failed => true,
            Phase::Serving | Phase::Working | Phase::Leaving | Phase::Canceled | Phase::Unknown => {
                false
            }
        }
    }

    /// Azure cannot delete it while its gallery has soft delete on: a Failed version "can't be
    /// deleted" (SDDOC); a Canceled one is not found in any source, so the harsher reading is
    /// taken and it is kept too. Every delete path and `ensure`'s replacement ask here.
    pub fn undeletable_under_soft_delete(self) -> bool {
        match self {
            Phase::Failed | Phase::Canceled => true,
            Phase::Serving | Phase::Working | Phase::Leaving | Phase::Unknown => false,
        }
    }

    /// What `ensure` (and an adoption) does with a version of its own content in this phase
    /// (DESIGN.md §4): use it, wait for Azure, wait for it to go, or replace it.
    pub fn ensure_step(self) -> EnsureStep {
        match self {
            Phase::Serving => EnsureStep::Use,
            Phase::Working | Phase::Unknown => EnsureStep::Wait,
            Phase::Leaving => EnsureStep::WaitForDeletion,
            Phase::Failed | Phase::Canceled => EnsureStep::Replace,
        }
    }

    /// A version in this phase can be reused, waited for or refused without a new upload: all
    /// but a replaceable one and one on its way out.
    pub fn stays(self) -> bool {
        match self {
            Phase::Serving | Phase::Working | Phase::Unknown => true,
            Phase::Failed | Phase::Canceled | Phase::Leaving => false,
        }
    }

    /// Why cleanup's plan keeps a version in this phase whatever else holds; `None`: the plan
    /// may decide on it (a serving or a failed version).
    pub fn cleanup_hold(self) -> Option<CleanupHold> {
        match self {
            Phase::Serving | Phase::Failed => None,
            Phase::Working | Phase::Leaving => Some(CleanupHold::InProgress),
            Phase::Canceled | Phase::Unknown => Some(CleanupHold::UnknownState),
        }
    }

    /// Where it stands when Azure resolves a definition's `latest` (its highest version not
    /// excluded): a serving version settles it (nothing below can be picked); any other may
    /// still be picked, so it counts as possibly `latest` and the search goes on below it.
    pub fn latest(self) -> Latest {
        match self {
            Phase::Serving => Latest::Settles,
            Phase::Working | Phase::Leaving | Phase::Failed | Phase::Canceled | Phase::Unknown => {
                Latest::MayBe
            }
        }
    }

    /// Whether the one guarded delete gate may send its DELETE now, or waits for the version
    /// to settle (one already on its way out).
    pub fn delete_now(self) -> DeleteNow {
        match self {
            Phase::Leaving => DeleteNow::AfterItSettles,
            Phase::Serving | Phase::Working | Phase::Failed | Phase::Canceled | Phase::Unknown => {
                DeleteNow::Yes
            }
        }
    }
}

/// [`Phase::ensure_step`]'s answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnsureStep {
    /// Reuse it (recording the reference when it is missing).
    Use,
    /// Azure is working on it, or it is in a state no rule knows: wait, then decide again.
    Wait,
    /// On its way out: wait until it is gone, then create.
    WaitForDeletion,
    /// Its last operation did not finish: replace it (same content), never reuse it.
    Replace,
}

/// [`Phase::cleanup_hold`]'s answers: the plan's reasons to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CleanupHold {
    /// An operation is in progress.
    InProgress,
    /// A state cleanup does not decide on (Canceled, or one Azure added since).
    UnknownState,
}

/// [`Phase::latest`]'s answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latest {
    /// Azure may resolve `latest` to it, and to nothing below it.
    Settles,
    /// Azure may resolve `latest` to it, or to one below it.
    MayBe,
}

/// [`Phase::delete_now`]'s answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteNow {
    Yes,
    AfterItSettles,
}

impl ImageVersion {
    /// Where this version is in its life.
    pub fn phase(&self) -> Phase {
        self.provisioning_state.phase()
    }

    /// Whether Azure refuses to delete it at `now` (Azure's clock): it blocks deletion before an
    /// end of life still ahead, or names none (a block that cannot end). `Some(until)`: refused,
    /// until that date (`None` inside: no end of life named). Unknown clock: the block is taken
    /// as still in force.
    pub fn deletion_blocked(&self, now: Option<OffsetDateTime>) -> Option<Option<OffsetDateTime>> {
        if !self.safety.block_deletion_before_end_of_life {
            return None;
        }
        match (self.safety.end_of_life, now) {
            (Some(eol), Some(now)) if eol <= now => None,
            (eol, _) => Some(eol),
        }
    }
}

/// A deletion block's end as outputs give it (`blocked_until`): RFC 3339, `None` when the
/// version names no end of life.
pub fn until_rfc3339(until: Option<OffsetDateTime>) -> Option<String> {
    until.and_then(|u| {
        u.format(&time::format_description::well_known::Rfc3339)
            .ok()
    })
}

/// "until its end of life 2027-06-03T00:00:00Z" or "(it names no end of life)", for messages.
pub fn until_text(until: Option<OffsetDateTime>) -> String {
    match until_rfc3339(until) {
        Some(at) => format!("until its end of life {at}"),
        None => "(it names no end of life)".into(),
    }
}

/// How long a soft-deleted version stays restorable when the gallery's policy names no period
/// (REC: galleries answer `retentionPeriodInDays: 7`; SDDOC: "a 7 day retention period").
pub const DEFAULT_RETENTION_DAYS: u32 = 7;

/// What a completed DELETE did to a version, as outputs report it (`soft_deleted`,
/// `restorable_until`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// Gone for good: the gallery has no soft delete.
    ForGood,
    /// Soft-deleted: restorable until then (`None`: Azure's clock is unknown).
    Soft {
        restorable_until: Option<OffsetDateTime>,
    },
    /// The gallery's policy could not be read after the delete.
    Unknown,
}

impl Deleted {
    /// A delete at `at` (Azure's clock) in a gallery with soft-delete `policy`.
    pub fn after(policy: Option<SoftDelete>, at: Option<OffsetDateTime>) -> Self {
        match policy {
            None => Deleted::ForGood,
            Some(p) => {
                let days = p.retention_days.unwrap_or(DEFAULT_RETENTION_DAYS);
                Deleted::Soft {
                    restorable_until: at.map(|t| t + time::Duration::days(i64::from(days))),
                }
            }
        }
    }

    /// `soft_deleted` as outputs give it: `None` when unknown.
    pub fn soft_deleted(&self) -> Option<bool> {
        match self {
            Deleted::ForGood => Some(false),
            Deleted::Soft { .. } => Some(true),
            Deleted::Unknown => None,
        }
    }

    /// `restorable_until` as outputs give it (RFC 3339).
    pub fn restorable_until(&self) -> Option<String> {
        match self {
            Deleted::Soft { restorable_until } => until_rfc3339(*restorable_until),
            Deleted::ForGood | Deleted::Unknown => None,
        }
    }

    /// "" or " (soft-deleted, restorable until …)", for messages after "deleted X".
    pub fn text(&self) -> String {
        match (self, self.restorable_until()) {
            (Deleted::Soft { .. }, Some(at)) => format!(" (soft-deleted, restorable until {at})"),
            (Deleted::Soft { .. }, None) => format!(
                " (soft-deleted, restorable for the gallery's retention period, {DEFAULT_RETENTION_DAYS} days unless it says otherwise)"
            ),
            (Deleted::ForGood | Deleted::Unknown, _) => String::new(),
        }
    }
}

impl SoftDeletedVersion {
    /// The retention that applies to it: the gallery's policy when it names one, else 7 days
    /// (also when soft delete was turned off since: what was soft-deleted stays so).
    fn retention(policy: Option<SoftDelete>) -> time::Duration {
        let days = policy
            .and_then(|p| p.retention_days)
            .unwrap_or(DEFAULT_RETENTION_DAYS);
        time::Duration::days(i64::from(days))
    }

    /// Until when it can be restored, and its name stays taken: Azure's
    /// `hardDeletionTargetTime` when it answers one (api 2026-03-03), else its soft-delete time
    /// plus the retention (SPEC26, SDDOC). `None`: not known.
    pub fn restorable_until(&self, policy: Option<SoftDelete>) -> Option<OffsetDateTime> {
        self.hard_deletion_target_time
            .or(self.consumption_end_time)
            .or_else(|| self.soft_deleted_time.map(|t| t + Self::retention(policy)))
    }

    /// Until when a consumer that names it exactly may still use it (SPEC26 `SoftDeleted`:
    /// "available for use only when a specific version is requested" until
    /// `consumptionEndTime`, the soft-delete time plus the retention). `None`: not known.
    pub fn consumable_until(&self, policy: Option<SoftDelete>) -> Option<OffsetDateTime> {
        self.consumption_end_time
            .or_else(|| self.soft_deleted_time.map(|t| t + Self::retention(policy)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_state() -> Vec<ProvisioningState> {
        use ProvisioningState::*;
        vec![
            Creating,
            Updating,
            Succeeded,
            Failed,
            Deleting,
            Migrating,
            Canceled,
            Other("Restoring".into()),
        ]
    }

    /// The table every decision reads, in one place: a change here is a change of behaviour.
    #[test]
    fn each_state_answers_each_question() {
        let table: Vec<(String, [bool; 6])> = every_state()
            .into_iter()
            .map(|s| {
                let p = s.phase();
                (
                    s.to_string(),
                    [
                        p.serves_image(),
                        p.operation_under_way(),
                        p.replaceable(),
                        matches!(
                            p.ensure_step(),
                            EnsureStep::Wait | EnsureStep::WaitForDeletion
                        ),
                        p.stays(),
                        p.cleanup_hold().is_none(),
                    ],
                )
            })
            .collect();
        let want: Vec<(String, [bool; 6])> = vec![
            ("Creating".into(), [false, true, false, true, true, false]),
            ("Updating".into(), [false, true, false, true, true, false]),
            ("Succeeded".into(), [true, false, false, false, true, true]),
            ("Failed".into(), [false, false, true, false, false, true]),
            ("Deleting".into(), [false, true, false, true, false, false]),
            ("Migrating".into(), [false, true, false, true, true, false]),
            ("Canceled".into(), [false, false, true, false, false, false]),
            ("Restoring".into(), [false, false, false, true, true, false]),
        ];
        assert_eq!(table, want);
    }

    /// The answers that are more than yes or no, per state: what ensure does, why cleanup keeps
    /// it, where it stands for `latest`, and whether the delete gate sends a DELETE now.
    #[test]
    fn each_state_answers_each_step() {
        use CleanupHold::*;
        use EnsureStep::*;
        let table: Vec<_> = every_state()
            .into_iter()
            .map(|s| {
                let p = s.phase();
                let gate = p.delete_now() == DeleteNow::Yes;
                (
                    s.to_string(),
                    p.ensure_step(),
                    p.cleanup_hold(),
                    p.latest(),
                    gate,
                )
            })
            .collect();
        let want = vec![
            (
                "Creating".into(),
                Wait,
                Some(InProgress),
                Latest::MayBe,
                true,
            ),
            (
                "Updating".into(),
                Wait,
                Some(InProgress),
                Latest::MayBe,
                true,
            ),
            ("Succeeded".into(), Use, None, Latest::Settles, true),
            ("Failed".into(), Replace, None, Latest::MayBe, true),
            (
                "Deleting".into(),
                WaitForDeletion,
                Some(InProgress),
                Latest::MayBe,
                false,
            ),
            (
                "Migrating".into(),
                Wait,
                Some(InProgress),
                Latest::MayBe,
                true,
            ),
            (
                "Canceled".into(),
                Replace,
                Some(UnknownState),
                Latest::MayBe,
                true,
            ),
            (
                "Restoring".into(),
                Wait,
                Some(UnknownState),
                Latest::MayBe,
                true,
            ),
        ];
        assert_eq!(table, want);
    }

    /// Azure refuses a DELETE before the end of life of a version that blocks it (REFERENCE.md
    /// "Today's Azure"); by Azure's clock, and in force while that clock is unknown.
    #[test]
    fn deletion_is_blocked_until_the_end_of_life_by_azures_clock() {
        use time::macros::datetime;
        let mut v = crate::gallery::fake::FakeGallery::new(crate::gallery::GalleryRef {
            subscription: "s".into(),
            resource_group: "rg".into(),
            gallery: "g".into(),
        })
        .add_version(
            "d",
            "1.0.0",
            ProvisioningState::Succeeded,
            datetime!(2026-01-01 00:00 UTC),
            Default::default(),
        );
        let eol = datetime!(2027-01-01 00:00 UTC);
        v.safety.end_of_life = Some(eol);
        assert_eq!(
            v.deletion_blocked(Some(datetime!(2026-12-03 00:00 UTC))),
            None,
            "no block asked"
        );
        v.safety.block_deletion_before_end_of_life = true;
        assert_eq!(
            v.deletion_blocked(Some(datetime!(2026-12-03 00:00 UTC))),
            Some(Some(eol))
        );
        assert_eq!(
            v.deletion_blocked(None),
            Some(Some(eol)),
            "unknown clock: in force"
        );
        assert_eq!(
            v.deletion_blocked(Some(eol)),
            None,
            "ends at the end of life"
        );
        v.safety.end_of_life = None;
        assert_eq!(
            v.deletion_blocked(Some(eol)),
            Some(None),
            "a block with no end never ends"
        );
    }

    #[test]
    fn a_state_azure_adds_is_never_served_nor_deleted_on_its_own() {
        let p = ProvisioningState::parse("SomethingNew").phase();
        assert_eq!(p, Phase::Unknown);
        assert!(!p.serves_image() && p.cleanup_hold().is_some() && !p.replaceable());
    }

    /// Issue 30 item 4: a delete in a soft-delete gallery is reported restorable for the
    /// gallery's retention (7 days when it names none), by Azure's clock.
    #[test]
    fn a_delete_in_a_soft_delete_gallery_is_restorable_for_its_retention() {
        let at = time::macros::datetime!(2026-12-04 10:00:00 UTC);
        assert_eq!(Deleted::after(None, Some(at)), Deleted::ForGood);
        assert_eq!(Deleted::ForGood.soft_deleted(), Some(false));
        let seven = Deleted::after(
            Some(SoftDelete {
                retention_days: None,
            }),
            Some(at),
        );
        assert_eq!(seven.soft_deleted(), Some(true));
        assert_eq!(
            seven.restorable_until().as_deref(),
            Some("2026-12-11T10:00:00Z")
        );
        assert!(seven
            .text()
            .contains("restorable until 2026-12-11T10:00:00Z"));
        let three = Deleted::after(
            Some(SoftDelete {
                retention_days: Some(3),
            }),
            Some(at),
        );
        assert_eq!(
            three.restorable_until().as_deref(),
            Some("2026-12-07T10:00:00Z")
        );
        let no_clock = Deleted::after(
            Some(SoftDelete {
                retention_days: None,
            }),
            None,
        );
        assert_eq!(no_clock.restorable_until(), None);
        assert!(no_clock.text().contains("soft-deleted"));
        assert_eq!(Deleted::Unknown.soft_deleted(), None);
    }
}
