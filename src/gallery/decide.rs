//! The ensure decision table of DESIGN.md §4, as a pure function of what was observed.

use super::content::Content;
use super::lifecycle::EnsureStep;
use super::model::ImageVersion;
use super::tags;

/// What `ensure` does next for one target definition and version key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Absent: create the definition if missing, PUT the version, follow it to Succeeded.
    Create,
    /// Present, same content, Succeeded, reference already recorded (or none asked for).
    Reuse,
    /// Present, same content, Succeeded, but our reference is missing: tags-only update.
    AddReference,
    /// Present, same content, still Creating/Updating/Migrating: wait for it, then decide again.
    Wait,
    /// Being deleted (by a cleanup, say): wait until it is gone, then create.
    WaitForDeletion,
    /// Present, Failed (or Canceled), holding this very content: delete it (its references
    /// carried durably), then create. A Failed version holding other or unknown content is a
    /// conflict: a failed *update* may still serve that other image.
    Replace,
    /// Present with different or unknown content: refuse.
    Conflict { existing_digest: Option<String> },
}

/// Decide the next step. `want` is the stemcell's content identity (`gallery::content`): the
/// SHA-256 of its `image`, or the content digest of its VHD.
pub fn decide(observed: Option<&ImageVersion>, want: &Content, reference: Option<&str>) -> Action {
    let Some(v) = observed else {
        return Action::Create;
    };
    let step = v.phase().ensure_step();
    if step == EnsureStep::WaitForDeletion {
        return Action::WaitForDeletion;
    }
    let existing = want.recorded(&v.tags);
    if existing.as_deref() != Some(want.digest()) {
        // Whatever the state: a Failed update may still serve the other image (DESIGN.md §4).
        return Action::Conflict {
            existing_digest: existing,
        };
    }
    match step {
        EnsureStep::Replace => Action::Replace,
        EnsureStep::Use => match reference {
            // Also when the tags are in an earlier format: the reference write rewrites them once.
            Some(r)
                if !tags::references(&v.tags).iter().any(|x| x == r)
                    || tags::needs_rewrite(&v.tags, &tags::sentinel(&v.definition, &v.version)) =>
            {
                Action::AddReference
            }
            _ => Action::Reuse,
        },
        EnsureStep::Wait => Action::Wait,
        EnsureStep::WaitForDeletion => Action::WaitForDeletion,
    }
}

/// Whether a writer that observed `observed` and wants `reference` recorded will add it to a
/// version that is there to stay (Succeeded, or busy and settling), so that it announces its
/// arrival to the version's lock (`lock::Gather`). Not for a replace or a reference already held
/// (such a writer hands nothing over), nor yet for a create: a creator announces itself once its
/// input was checked, right before its upload (`GalleryService::arrive_to_create`, issue 49), so a
/// refused input writes nothing at all.
pub fn announces(observed: Option<&ImageVersion>, reference: Option<&str>) -> bool {
    match (observed, reference) {
        (Some(v), Some(r)) => {
            v.phase().stays() && !tags::references(&v.tags).iter().any(|x| x == r)
        }
        _ => false,
    }
}

/// What `ensure` does with a version name that is soft-deleted (REFERENCE.md "Today's Azure":
/// the name stays taken until the version is gone for good, and a restore brings it back as it
/// was). The soft-deleted list does not show content, so the digest this tool recorded when it
/// created the version (its reference record) decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SoftDeletedAction {
    /// It was made from this very content: restore it and upload nothing.
    Restore,
    /// Other content, or content this tool never recorded: refuse, naming it.
    Conflict { recorded_digest: Option<String> },
}

/// Decide on a soft-deleted version of the key `ensure` wants, from the digest its reference
/// record says it was created with (`None`: no record, or one without a digest).
pub fn decide_soft_deleted(recorded_digest: Option<&str>, want_digest: &str) -> SoftDeletedAction {
    match recorded_digest.map(|d| d.trim().to_ascii_lowercase()) {
        Some(d) if d == want_digest.trim().to_ascii_lowercase() => SoftDeletedAction::Restore,
        recorded => SoftDeletedAction::Conflict {
            recorded_digest: recorded,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gallery::model::ProvisioningState;
    use std::collections::BTreeMap;

    const SHA: &str = "aaaa";

    fn version(state: ProvisioningState, digest: Option<&str>, refs: &[&str]) -> ImageVersion {
        let mut t = BTreeMap::new();
        if let Some(d) = digest {
            t.insert(tags::IMAGE_SHA256.to_string(), d.to_string());
        }
        t.insert(tags::MODE.to_string(), "director".to_string());
        let refs: Vec<String> = refs.iter().map(|s| s.to_string()).collect();
        let t = tags::with_references(&t, &refs, &tags::sentinel("d", "1.506.0")).unwrap();
        ImageVersion {
            id: "id".into(),
            definition: "d".into(),
            version: "1.506.0".into(),
            location: "westeurope".into(),
            provisioning_state: state,
            tags: t,
            source_uri: None,
            storage_account_id: None,
            published_date: None,
            target_regions: vec![],
            exclude_from_latest: false,
            replication: None,
            safety: Default::default(),
        }
    }

    use ProvisioningState::*;

    #[test]
    fn absent_is_created() {
        assert_eq!(
            decide(None, &Content::image(SHA), Some("r")),
            Action::Create
        );
    }

    #[test]
    fn same_content_succeeded_with_reference_is_reused() {
        let v = version(Succeeded, Some(SHA), &["r"]);
        assert_eq!(
            decide(Some(&v), &Content::image(SHA), Some("r")),
            Action::Reuse
        );
        assert_eq!(decide(Some(&v), &Content::image(SHA), None), Action::Reuse);
    }

    #[test]
    fn a_recorded_reference_in_an_earlier_format_is_rewritten_once() {
        // The previous release: the stemcell's name in stemcell_name, the list in sg_refs_00.
        let mut v = version(Succeeded, Some(SHA), &[]);
        v.tags.insert(
            tags::STEMCELL_NAME.into(),
            "bosh-azure-hyperv-ubuntu-jammy-go_agent".into(),
        );
        v.tags
            .insert(format!("{}00", tags::LEGACY_CHUNK_PREFIX), "r".into());
        assert_eq!(
            decide(Some(&v), &Content::image(SHA), Some("r")),
            Action::AddReference
        );
        // Without a reference to record nothing is written.
        assert_eq!(decide(Some(&v), &Content::image(SHA), None), Action::Reuse);
        // Once rewritten, a reuse is one GET again.
        let sentinel = tags::sentinel(&v.definition, &v.version);
        v.tags = tags::with_references(&v.tags, &["r".to_string()], &sentinel).unwrap();
        assert_eq!(
            decide(Some(&v), &Content::image(SHA), Some("r")),
            Action::Reuse
        );
    }

    #[test]
    fn a_vhd_identity_is_judged_by_its_own_tag_and_unknown_without_it() {
        // A version `migrate` made: its VHD's content digest, no image_sha256.
        let mut v = version(Succeeded, None, &["r"]);
        v.tags.insert(tags::VHD_CONTENT.into(), "cccc".into());
        assert_eq!(
            decide(Some(&v), &Content::vhd("CCCC"), Some("r")),
            Action::Reuse
        );
        assert_eq!(
            decide(Some(&v), &Content::vhd("dddd"), Some("r")),
            Action::Conflict {
                existing_digest: Some("cccc".into())
            }
        );
        // An upload of the stemcell knows only its image: unknown, proven by `adopt`.
        assert_eq!(
            decide(Some(&v), &Content::image(SHA), Some("r")),
            Action::Conflict {
                existing_digest: None
            }
        );
        // A version an upload made, to `migrate`: unknown too, never the image's digest.
        let up = version(Succeeded, Some(SHA), &["r"]);
        assert_eq!(
            decide(Some(&up), &Content::vhd(SHA), Some("r")),
            Action::Conflict {
                existing_digest: None
            }
        );
    }

    #[test]
    fn same_content_digest_compare_ignores_case() {
        let v = version(Succeeded, Some("AAAA"), &["r"]);
        assert_eq!(
            decide(Some(&v), &Content::image(SHA), Some("r")),
            Action::Reuse
        );
    }

    #[test]
    fn same_content_without_our_reference_adds_it() {
        let v = version(Succeeded, Some(SHA), &["other"]);
        assert_eq!(
            decide(Some(&v), &Content::image(SHA), Some("r")),
            Action::AddReference
        );
    }

    #[test]
    fn same_content_in_progress_is_waited_for() {
        for s in [Creating, Updating, Migrating] {
            let v = version(s.clone(), Some(SHA), &[]);
            assert_eq!(
                decide(Some(&v), &Content::image(SHA), Some("r")),
                Action::Wait,
                "{s}"
            );
        }
    }

    #[test]
    fn failed_with_the_same_content_is_replaced() {
        let v = version(Failed, Some(SHA), &["r"]);
        assert_eq!(
            decide(Some(&v), &Content::image(SHA), Some("r")),
            Action::Replace
        );
        let v = version(Failed, Some("AAAA"), &[]);
        assert_eq!(
            decide(Some(&v), &Content::image(SHA), None),
            Action::Replace
        );
        assert_eq!(
            decide(
                Some(&version(Canceled, Some(SHA), &[])),
                &Content::image(SHA),
                None
            ),
            Action::Replace
        );
    }

    #[test]
    fn failed_with_other_or_unknown_content_is_a_conflict() {
        for s in [Failed, Canceled] {
            let v = version(s.clone(), Some("bbbb"), &["r"]);
            assert_eq!(
                decide(Some(&v), &Content::image(SHA), Some("r")),
                Action::Conflict {
                    existing_digest: Some("bbbb".into())
                },
                "{s}"
            );
            let v = version(s.clone(), None, &[]);
            assert_eq!(
                decide(Some(&v), &Content::image(SHA), None),
                Action::Conflict {
                    existing_digest: None
                },
                "{s}"
            );
        }
    }

    #[test]
    fn different_or_unknown_content_is_a_conflict_in_any_state() {
        for s in [Succeeded, Creating, Updating, Failed, Canceled] {
            let v = version(s.clone(), Some("bbbb"), &[]);
            assert_eq!(
                decide(Some(&v), &Content::image(SHA), Some("r")),
                Action::Conflict {
                    existing_digest: Some("bbbb".into())
                }
            );
            let v = version(s, None, &[]);
            assert_eq!(
                decide(Some(&v), &Content::image(SHA), Some("r")),
                Action::Conflict {
                    existing_digest: None
                }
            );
        }
    }

    #[test]
    fn deleting_is_waited_out_then_recreated() {
        let v = version(Deleting, Some(SHA), &[]);
        assert_eq!(
            decide(Some(&v), &Content::image(SHA), None),
            Action::WaitForDeletion
        );
    }

    /// Issue 30: a soft-deleted name is restored only for the content this tool recorded for
    /// it; other or unrecorded content is a conflict.
    #[test]
    fn a_soft_deleted_name_is_restored_only_for_the_content_recorded_for_it() {
        assert_eq!(
            decide_soft_deleted(Some("AAAA "), SHA),
            SoftDeletedAction::Restore
        );
        assert_eq!(
            decide_soft_deleted(Some("bbbb"), SHA),
            SoftDeletedAction::Conflict {
                recorded_digest: Some("bbbb".into())
            }
        );
        assert_eq!(
            decide_soft_deleted(None, SHA),
            SoftDeletedAction::Conflict {
                recorded_digest: None
            }
        );
    }

    /// Issue 33: only a writer about to add its reference to a version that stays announces
    /// itself; a create, a replace, a version being deleted or a reference already held writes
    /// no arrival (a refused input then writes nothing at all).
    #[test]
    fn a_writer_announces_itself_only_when_it_will_add_to_a_version_that_stays() {
        let serving = version(Succeeded, Some(SHA), &["r1"]);
        assert!(announces(Some(&serving), Some("r2")));
        assert!(!announces(Some(&serving), Some("r1")), "already held");
        assert!(!announces(Some(&serving), None), "no reference");
        assert!(!announces(None, Some("r2")), "a create");
        for busy in [Creating, Updating] {
            assert!(announces(Some(&version(busy, Some(SHA), &[])), Some("r2")));
        }
        for gone in [Failed, Deleting] {
            assert!(!announces(Some(&version(gone, Some(SHA), &[])), Some("r2")));
        }
    }
}
