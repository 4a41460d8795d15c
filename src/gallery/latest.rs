//! One rule for `latest`, and for what a consumer's image reference protects.
//!
//! Every delete path (cleanup's planner, `delete`, CPI `delete_stemcell`, the replacement of a
//! Failed version) asks this module, and only this module, which versions a VM, scale set
//! (model or instance) or disk may need. The answer errs towards keeping: a version is left out
//! only when Azure's documented rules say `latest` cannot resolve to it for that consumer.
//!
//! # What Azure says
//!
//! - A consumer asks for `latest` by naming the image definition in `imageReference.id` (no
//!   version), or `.../versions/latest`; shared and community galleries use
//!   `sharedGalleryImageId` (`/SharedGalleries/{uniqueName}/Images/{def}/Versions/{v|latest}`) and
//!   `communityGalleryImageId` (`/CommunityGalleries/{publicName}/Images/...`). Source: the
//!   Compute REST spec, `ImageReference.id`/`.version`/`.sharedGalleryImageId`/
//!   `.communityGalleryImageId` (Azure/azure-rest-api-specs ComputeRP `computeRPCommon.json`,
//!   also in the descriptions of `azure_mgmt_compute` 0.21's generated models: "to use 'latest'
//!   version of gallery image, just set '/subscriptions/.../galleries/{galleryName}/images/
//!   {imageName}' in the 'id' field without version input"); managed disks carry the same three
//!   forms in `creationData.galleryImageReference` and `creationData.imageReference`
//!   (`ImageDiskReference`, DiskRP).
//! - `latest` is the highest `MAJOR.MINOR.PATCH` (Azure docs, "Create a VM from a generalized
//!   image in a gallery": "the highest MajorVersion, then MinorVersion and then Patch").
//! - `publishingProfile.excludeFromLatest`: "If set to true, Virtual Machines deployed from the
//!   latest version of the Image Definition won't use this Image Version"; per region,
//!   `publishingProfile.targetRegions[].excludeFromLatest`: "the flag setting to hide an image
//!   when users specify version='latest'" (GalleryRP 2023-07-03 `galleryRPCommon.json`,
//!   `GalleryArtifactPublishingProfileBase` and `TargetRegion`). A VM can only be created in a
//!   region the version is replicated to (its `targetRegions`).
//! - `imageReference.exactVersion` is read-only and "differs from 'version' only if the value
//!   specified in 'version' field is 'latest'" (ComputeRP `ImageReference.exactVersion`): what a
//!   VM or scale-set instance created from `latest` was actually built from.
//!
//! # The rule
//!
//! For a consumer in region R, `latest` could resolve to, walking the definition's versions from
//! the highest version number down:
//! - skip a version excluded from latest globally, or in R's target region entry, or (when its
//!   target regions are known) not replicated to R at all;
//! - count every other version, and stop after the first one that is `Succeeded` — a version
//!   above it that is Creating, Updating, Failed, Deleting, Migrating, Canceled or in a state we
//!   do not know may be (or become) what `latest` serves, so it counts too;
//! - a version whose name is not `MAJOR.MINOR.PATCH` cannot be ranked: it always counts.
//!
//! When R is unknown, or names no region any version is replicated to, every region's answer
//! counts (the union over every region named by any version, plus the answer ignoring the
//! per-region flags).
//!
//! What a consumer protects ([`uses`]):
//! - a reference to one version: that version ([`Use::Named`]);
//! - a reference to `latest`: every version `latest` could resolve to for it now
//!   ([`Use::Latest`]: a scale-out or re-create gets that), plus what it runs: the recorded
//!   `exactVersion` ([`Use::Runs`]); when Azure recorded none, every version of the definition,
//!   since any of them may have been `latest` when it was created ([`Use::MayRun`]). A scale
//!   set's model runs nothing itself (its instances are listed on their own), so without an
//!   `exactVersion` it protects only what `latest` could resolve to.
//!
//! Shared and community ids name neither the subscription nor the resource group, and the
//! gallery's `identifier.uniqueName` / community public names are not read, so they are matched
//! to our definitions by definition name (and version) only: keeping too much is safe.

use std::collections::{BTreeMap, BTreeSet};

use super::lifecycle::Latest;
use super::model::{Consumer, ConsumerKind, ImageVersion, SoftDeletedVersion};

/// The gallery an image reference names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum GalleryName {
    /// `/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/galleries/{g}`.
    Arm {
        subscription: String,
        resource_group: String,
        gallery: String,
    },
    /// `/SharedGalleries/{uniqueName}` (direct shared gallery).
    Shared(String),
    /// `/CommunityGalleries/{publicName}`.
    Community(String),
}

/// Which version a reference asks for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VersionSel {
    Latest,
    Exact(String),
}

/// A gallery image reference, parsed (segment names compared case-insensitively).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ImageRef {
    pub gallery: GalleryName,
    pub definition: String,
    pub version: VersionSel,
}

impl ImageRef {
    /// Parse any of the three forms; `None` for anything that is not a gallery image
    /// (a managed image, a Marketplace image, garbage).
    pub fn parse(s: &str) -> Option<ImageRef> {
        let segs: Vec<&str> = s.trim().split('/').filter(|p| !p.is_empty()).collect();
        let eq = |i: usize, want: &str| segs.get(i).is_some_and(|p| p.eq_ignore_ascii_case(want));
        let (gallery, rest) = if eq(0, "subscriptions")
            && eq(2, "resourceGroups")
            && eq(4, "providers")
            && eq(5, "Microsoft.Compute")
            && eq(6, "galleries")
            && segs.len() > 7
        {
            (
                GalleryName::Arm {
                    subscription: segs[1].to_string(),
                    resource_group: segs[3].to_string(),
                    gallery: segs[7].to_string(),
                },
                8,
            )
        } else if eq(0, "SharedGalleries") && segs.len() > 1 {
            (GalleryName::Shared(segs[1].to_string()), 2)
        } else if eq(0, "CommunityGalleries") && segs.len() > 1 {
            (GalleryName::Community(segs[1].to_string()), 2)
        } else {
            return None;
        };
        if !eq(rest, "images") {
            return None;
        }
        let definition = segs.get(rest + 1)?.to_string();
        let version = match segs.len() - rest {
            2 => VersionSel::Latest,
            4 if eq(rest + 2, "versions") => {
                let v = segs[rest + 3];
                if v.eq_ignore_ascii_case("latest") {
                    VersionSel::Latest
                } else {
                    VersionSel::Exact(v.to_string())
                }
            }
            _ => return None,
        };
        Some(ImageRef {
            gallery,
            definition,
            version,
        })
    }

    /// Whether this reference may name the definition of `ours` (one of our versions' ids,
    /// parsed). ARM ids compare every segment case-insensitively; shared and community ids,
    /// which name no subscription or resource group, match by definition name alone.
    pub fn may_name_definition_of(&self, ours: &ImageRef) -> bool {
        if !self.definition.eq_ignore_ascii_case(&ours.definition) {
            return false;
        }
        match (&self.gallery, &ours.gallery) {
            (
                GalleryName::Arm {
                    subscription: s1,
                    resource_group: r1,
                    gallery: g1,
                },
                GalleryName::Arm {
                    subscription: s2,
                    resource_group: r2,
                    gallery: g2,
                },
            ) => {
                s1.eq_ignore_ascii_case(s2)
                    && r1.eq_ignore_ascii_case(r2)
                    && g1.eq_ignore_ascii_case(g2)
            }
            (GalleryName::Arm { .. }, _) => false,
            (GalleryName::Shared(_) | GalleryName::Community(_), _) => true,
        }
    }
}

/// Why a consumer protects a version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Use {
    /// Its reference names this version.
    Named,
    /// Created from `latest`; Azure records that it runs this version (`exactVersion`).
    Runs,
    /// `latest` could resolve to this version for it now (scale-out, re-create).
    Latest,
    /// Created from `latest` and Azure records no version: it may run this one.
    MayRun,
}

/// Whether a gallery version name is `name` (numerically when both are `MAJOR.MINOR.PATCH`).
pub fn same_version_name(a: &str, b: &str) -> bool {
    match (rank_key(a), rank_key(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a.trim().eq_ignore_ascii_case(b.trim()),
    }
}

fn rank_key(v: &str) -> Option<semver::Version> {
    semver::Version::parse(v.trim()).ok()
}

/// `West Europe` and `westeurope` are one region.
fn norm_region(r: &str) -> String {
    super::model::region_key(r)
}

/// Every version among `versions` (all of one definition) that `latest` could resolve to for a
/// consumer in `region` (`None`: unknown), as indices into `versions`, ascending. See the module
/// documentation for the rule.
pub fn latest_candidates(versions: &[&ImageVersion], region: Option<&str>) -> Vec<usize> {
    let known: BTreeSet<String> = versions
        .iter()
        .flat_map(|v| v.target_regions.iter().map(|t| norm_region(&t.name)))
        .collect();
    let region = region.map(norm_region).filter(|r| known.contains(r));
    let mut out: BTreeSet<usize> = BTreeSet::new();
    match region {
        Some(r) => out.extend(candidates_in(versions, Some(&r))),
        None => {
            out.extend(candidates_in(versions, None));
            for r in &known {
                out.extend(candidates_in(versions, Some(r)));
            }
        }
    }
    out.into_iter().collect()
}

/// The answer in one region (`None`: ignoring per-region flags and replication).
fn candidates_in(versions: &[&ImageVersion], region: Option<&str>) -> Vec<usize> {
    let mut out = Vec::new();
    let mut ranked: Vec<(semver::Version, usize)> = Vec::with_capacity(versions.len());
    for (i, v) in versions.iter().enumerate() {
        match rank_key(&v.version) {
            Some(k) => ranked.push((k, i)),
            // Cannot be ranked against the others: it could be the highest.
            None => out.push(i),
        }
    }
    ranked.sort_by(|a, b| b.cmp(a));
    for (_, i) in ranked {
        let v = versions[i];
        if v.exclude_from_latest {
            continue;
        }
        if let Some(r) = region {
            if !v.target_regions.is_empty() {
                match v.target_regions.iter().find(|t| norm_region(&t.name) == r) {
                    // Not replicated there: no VM in that region can be built from it.
                    None => continue,
                    Some(t) if t.exclude_from_latest == Some(true) => continue,
                    Some(_) => {}
                }
            }
        }
        out.push(i);
        match v.phase().latest() {
            Latest::Settles => break,
            Latest::MayBe => {}
        }
    }
    out
}

/// What `consumer` protects among `versions` (every version of the one definition `reference`
/// names), as indices into `versions` with the reason. `reference` is the consumer's parsed
/// `image_id`.
pub fn uses(
    consumer: &Consumer,
    reference: &ImageRef,
    versions: &[&ImageVersion],
) -> Vec<(usize, Use)> {
    let mut out: BTreeMap<usize, Use> = BTreeMap::new();
    match &reference.version {
        VersionSel::Exact(name) => {
            for (i, v) in versions.iter().enumerate() {
                if same_version_name(&v.version, name) {
                    out.insert(i, Use::Named);
                }
            }
        }
        VersionSel::Latest => {
            for i in latest_candidates(versions, consumer.location.as_deref()) {
                out.insert(i, Use::Latest);
            }
            match consumer
                .exact_version
                .as_deref()
                .map(str::trim)
                .filter(|e| !e.is_empty())
            {
                Some(exact) => {
                    for (i, v) in versions.iter().enumerate() {
                        if same_version_name(&v.version, exact) {
                            out.insert(i, Use::Runs);
                        }
                    }
                }
                None if consumer.kind != ConsumerKind::ScaleSet => {
                    for i in 0..versions.len() {
                        out.entry(i).or_insert(Use::MayRun);
                    }
                }
                None => {}
            }
        }
    }
    out.into_iter().collect()
}

/// Whether `consumer` protects `version`, given every version of its definition (`siblings`;
/// `version` is added when missing). The check behind every delete path.
pub fn consumer_protects(
    consumer: &Consumer,
    version: &ImageVersion,
    siblings: &[ImageVersion],
) -> bool {
    let Some(ours) = ImageRef::parse(&version.id) else {
        // Not a gallery version id we can parse: only an exact id match can be judged.
        return consumer
            .image_id
            .trim()
            .eq_ignore_ascii_case(version.id.trim());
    };
    let Some(theirs) = ImageRef::parse(&consumer.image_id) else {
        return false;
    };
    if !theirs.may_name_definition_of(&ours) {
        return false;
    }
    let mut vs: Vec<&ImageVersion> = siblings
        .iter()
        .filter(|s| {
            ImageRef::parse(&s.id).is_some_and(|r| {
                r.may_name_definition_of(&ours) && matches!(r.gallery, GalleryName::Arm { .. })
            })
        })
        .collect();
    let me = match vs
        .iter()
        .position(|s| s.id.eq_ignore_ascii_case(&version.id))
    {
        Some(i) => i,
        None => {
            vs.push(version);
            vs.len() - 1
        }
    };
    uses(consumer, &theirs, &vs).iter().any(|(i, _)| *i == me)
}

/// Whether `consumer` still uses the soft-deleted version `sd`: it names it exactly, or runs it
/// (`exactVersion`, recorded when it was built from `latest`). Never through `latest`: a
/// soft-deleted version "will not be resolved as the latest version" (SPEC26
/// `GalleryImageVersionState`), and it serves a consumer that names it only until its
/// consumption end (REFERENCE.md "Today's Azure").
pub fn uses_soft_deleted(consumer: &Consumer, sd: &SoftDeletedVersion) -> bool {
    let (Some(ours), Some(theirs)) = (ImageRef::parse(&sd.id), ImageRef::parse(&consumer.image_id))
    else {
        return consumer.image_id.trim().eq_ignore_ascii_case(sd.id.trim());
    };
    if !theirs.may_name_definition_of(&ours) {
        return false;
    }
    match &theirs.version {
        VersionSel::Exact(name) => same_version_name(&sd.version, name),
        VersionSel::Latest => consumer
            .exact_version
            .as_deref()
            .is_some_and(|e| same_version_name(&sd.version, e)),
    }
}

/// The consumers that use version `v`: by naming it (an ARM, shared or community gallery id), by
/// running it (`exactVersion`), or because `latest` could resolve to it for them — the one rule of
/// this module, over `siblings` (the versions of `v`'s definition; `v` is added if missing).
pub fn users_of(
    v: &ImageVersion,
    consumers: &[Consumer],
    siblings: &[ImageVersion],
) -> Vec<Consumer> {
    consumers
        .iter()
        .filter(|c| consumer_protects(c, v, siblings))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gallery::model::{ProvisioningState, TargetRegion};

    const DEF: &str =
        "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/galleries/G/images/d";

    fn version(name: &str, state: ProvisioningState) -> ImageVersion {
        ImageVersion {
            id: format!("{DEF}/versions/{name}"),
            definition: "d".into(),
            version: name.into(),
            location: "westeurope".into(),
            provisioning_state: state,
            tags: Default::default(),
            source_uri: None,
            storage_account_id: None,
            published_date: None,
            target_regions: vec![],
            exclude_from_latest: false,
            replication: None,
            safety: Default::default(),
        }
    }

    /// Issue 30 item 5: a consumer that names a soft-deleted version, or runs it, still uses
    /// it; one that asks for `latest` without running it does not (never `latest`).
    #[test]
    fn a_soft_deleted_version_is_used_by_who_names_or_runs_it_never_through_latest() {
        let sd = SoftDeletedVersion {
            id: format!("{DEF}/versions/1.506.0"),
            definition: "d".into(),
            version: "1.506.0".into(),
            soft_deleted_time: None,
            consumption_end_time: None,
            hard_deletion_target_time: None,
        };
        let named = Consumer::new(ConsumerKind::VirtualMachine, "vm-1", sd.id.to_uppercase());
        assert!(uses_soft_deleted(&named, &sd));
        let other = Consumer::new(
            ConsumerKind::VirtualMachine,
            "vm-2",
            format!("{DEF}/versions/1.507.0"),
        );
        assert!(!uses_soft_deleted(&other, &sd));
        let mut latest = Consumer::new(ConsumerKind::ScaleSet, "ss", DEF.to_string());
        assert!(!uses_soft_deleted(&latest, &sd), "never through latest");
        latest.exact_version = Some("1.506.0".into());
        assert!(uses_soft_deleted(&latest, &sd), "runs it");
    }

    fn region(name: &str, excluded: Option<bool>) -> TargetRegion {
        TargetRegion {
            name: name.into(),
            replicas: Some(1),
            storage_account_type: None,
            exclude_from_latest: excluded,
        }
    }

    fn names(vs: &[ImageVersion], idx: Vec<usize>) -> Vec<String> {
        idx.into_iter().map(|i| vs[i].version.clone()).collect()
    }

    /// Every state and flag of the newer version 1.1.0, over an older Succeeded 1.0.0: which
    /// versions `latest` could resolve to (for a consumer in westeurope, and region unknown).
    #[test]
    fn latest_candidates_for_every_state_and_flag_of_the_newer_version() {
        use ProvisioningState::*;
        // (story, state of 1.1.0, global exclude, westeurope entry's flag (None = no entry when
        // Some(regions) is given), expected in westeurope, expected with region unknown)
        type Case = (
            &'static str,
            ProvisioningState,
            bool,
            Option<Vec<TargetRegion>>,
            &'static [&'static str],
            &'static [&'static str],
        );
        let cases: Vec<Case> = vec![
            (
                "succeeded newer is latest",
                Succeeded,
                false,
                None,
                &["1.1.0"],
                &["1.1.0"],
            ),
            (
                "creating newer: both",
                Creating,
                false,
                None,
                &["1.0.0", "1.1.0"],
                &["1.0.0", "1.1.0"],
            ),
            (
                "updating newer: both",
                Updating,
                false,
                None,
                &["1.0.0", "1.1.0"],
                &["1.0.0", "1.1.0"],
            ),
            (
                "failed newer: both",
                Failed,
                false,
                None,
                &["1.0.0", "1.1.0"],
                &["1.0.0", "1.1.0"],
            ),
            (
                "deleting newer: both",
                Deleting,
                false,
                None,
                &["1.0.0", "1.1.0"],
                &["1.0.0", "1.1.0"],
            ),
            (
                "migrating newer: both",
                Migrating,
                false,
                None,
                &["1.0.0", "1.1.0"],
                &["1.0.0", "1.1.0"],
            ),
            (
                "canceled newer: both",
                Canceled,
                false,
                None,
                &["1.0.0", "1.1.0"],
                &["1.0.0", "1.1.0"],
            ),
            (
                "unknown state newer: both",
                Other("Repairing".into()),
                false,
                None,
                &["1.0.0", "1.1.0"],
                &["1.0.0", "1.1.0"],
            ),
            (
                "globally excluded newer: skipped",
                Succeeded,
                true,
                None,
                &["1.0.0"],
                &["1.0.0"],
            ),
            (
                "excluded in westeurope only",
                Succeeded,
                false,
                Some(vec![
                    region("West Europe", Some(true)),
                    region("North Europe", None),
                ]),
                &["1.0.0"],
                &["1.0.0", "1.1.0"],
            ),
            (
                "explicitly not excluded in westeurope",
                Succeeded,
                false,
                Some(vec![region("westeurope", Some(false))]),
                &["1.1.0"],
                &["1.1.0"],
            ),
            (
                "not replicated to westeurope",
                Succeeded,
                false,
                Some(vec![region("North Europe", None)]),
                &["1.0.0"],
                &["1.0.0", "1.1.0"],
            ),
        ];
        for (story, state, global, regions, in_region, unknown) in cases {
            let mut older = version("1.0.0", Succeeded);
            older.target_regions = vec![region("West Europe", None)];
            let mut newer = version("1.1.0", state);
            newer.exclude_from_latest = global;
            newer.target_regions = regions.unwrap_or_else(|| vec![region("West Europe", None)]);
            let vs = vec![older, newer];
            let refs: Vec<&ImageVersion> = vs.iter().collect();
            assert_eq!(
                names(&vs, latest_candidates(&refs, Some("westeurope"))),
                in_region.to_vec(),
                "{story}: in westeurope"
            );
            assert_eq!(
                names(&vs, latest_candidates(&refs, None)),
                unknown.to_vec(),
                "{story}: region unknown"
            );
        }
    }

    #[test]
    fn unparseable_names_always_count_and_older_succeeded_versions_do_not() {
        use ProvisioningState::*;
        let vs = vec![
            version("1.0.0", Succeeded),
            version("1.2.0", Succeeded),
            version("weird-1", Succeeded),
            version("1.10.0", Failed),
        ];
        let refs: Vec<&ImageVersion> = vs.iter().collect();
        assert_eq!(
            names(&vs, latest_candidates(&refs, None)),
            vec!["1.2.0", "weird-1", "1.10.0"]
        );
        // A region no version is replicated to: every region's answer counts.
        assert_eq!(
            names(&vs, latest_candidates(&refs, Some("mars"))),
            vec!["1.2.0", "weird-1", "1.10.0"]
        );
    }

    #[test]
    fn image_references_of_every_form_parse_case_insensitively() {
        let arm = ImageRef::parse(&format!("{DEF}/versions/1.2.0")).unwrap();
        assert_eq!(arm.version, VersionSel::Exact("1.2.0".into()));
        let upper = ImageRef::parse(&DEF.to_uppercase()).unwrap();
        assert_eq!(upper.version, VersionSel::Latest);
        assert!(upper.may_name_definition_of(&arm));
        assert_eq!(
            ImageRef::parse(&format!("{DEF}/Versions/LATEST"))
                .unwrap()
                .version,
            VersionSel::Latest
        );
        let shared = ImageRef::parse("/SharedGalleries/u-G/Images/D/Versions/1.2.0").unwrap();
        assert_eq!(shared.gallery, GalleryName::Shared("u-G".into()));
        assert!(shared.may_name_definition_of(&arm));
        let community = ImageRef::parse("/communitygalleries/p/images/d").unwrap();
        assert_eq!(community.version, VersionSel::Latest);
        assert!(community.may_name_definition_of(&arm));
        let other_gallery = ImageRef::parse(&DEF.replace("/G/", "/H/")).unwrap();
        assert!(!other_gallery.may_name_definition_of(&arm));
        let other_def = ImageRef::parse("/SharedGalleries/u/Images/e/Versions/1.2.0").unwrap();
        assert!(!other_def.may_name_definition_of(&arm));
        for bad in [
            "",
            "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/images/managed",
            "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/galleries/G",
            &format!("{DEF}/versions/1.2.0/extra"),
            "/SharedGalleries/u/Images",
        ] {
            assert_eq!(ImageRef::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn what_a_consumer_protects_by_kind_reference_and_recorded_version() {
        use ProvisioningState::*;
        let vs = [
            version("1.0.0", Succeeded),
            version("1.1.0", Succeeded),
            version("1.2.0", Succeeded),
        ];
        let on = |kind: ConsumerKind, image: &str, exact: Option<&str>| {
            let mut c = Consumer::new(kind, "c", image);
            c.exact_version = exact.map(str::to_string);
            let reference = ImageRef::parse(image).unwrap();
            let refs: Vec<&ImageVersion> = vs.iter().collect();
            uses(&c, &reference, &refs)
                .into_iter()
                .map(|(i, u)| (vs[i].version.clone(), u))
                .collect::<Vec<_>>()
        };
        let s = |v: &str, u: Use| (v.to_string(), u);
        assert_eq!(
            on(
                ConsumerKind::VirtualMachine,
                &format!("{DEF}/versions/1.1.0"),
                None
            ),
            vec![s("1.1.0", Use::Named)]
        );
        assert_eq!(
            on(ConsumerKind::ScaleSetInstance, DEF, Some("1.0.0")),
            vec![s("1.0.0", Use::Runs), s("1.2.0", Use::Latest)]
        );
        assert_eq!(
            on(ConsumerKind::ScaleSet, DEF, None),
            vec![s("1.2.0", Use::Latest)]
        );
        assert_eq!(
            on(
                ConsumerKind::VirtualMachine,
                &format!("{DEF}/versions/latest"),
                None
            ),
            vec![
                s("1.0.0", Use::MayRun),
                s("1.1.0", Use::MayRun),
                s("1.2.0", Use::Latest)
            ]
        );
        assert_eq!(
            on(
                ConsumerKind::Disk,
                "/SharedGalleries/x/Images/d/Versions/1.2.0",
                None
            ),
            vec![s("1.2.0", Use::Named)]
        );
    }

    #[test]
    fn consumer_protects_adds_the_version_when_siblings_lack_it() {
        let v = version("1.3.0", ProvisioningState::Succeeded);
        let c = Consumer::new(ConsumerKind::ScaleSet, "ss", DEF.to_lowercase());
        assert!(consumer_protects(&c, &v, &[]));
        let older = version("1.0.0", ProvisioningState::Succeeded);
        assert!(!consumer_protects(&c, &older, std::slice::from_ref(&v)));
    }
}
