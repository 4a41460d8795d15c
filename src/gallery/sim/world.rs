//! The simulated world of one run: one or two galleries of the same name (resource groups `rg1`
//! and `rg2` of one subscription, issue 44 item 1: "the default gallery name is the same
//! everywhere"), each an in-memory ARM (`FakeGallery` behind `SimApi`) with the real
//! `GalleryService` over it, their locks and reference records in one storage account or in
//! two; one image definition with two version keys, each of one stemcell content (the same in
//! both galleries: one stemcell published to two environments).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::gallery::fake::FakeGallery;
use crate::gallery::model::*;
use crate::gallery::record::MemoryRecords;
use crate::gallery::service::{
    EnsureRequest, GalleryService, Mode, StemcellImage, DEFAULT_CREATE_ENV_SUFFIX,
};

use super::api::SimApi;
use super::locks::SimLocks;
use super::probe::Probe;
use super::rng::Rng;

pub const SUBSCRIPTION: &str = "5e5e5e5e-0000-4000-8000-000000000044";
pub const GALLERY: &str = "stemcells";
pub const LOCATION: &str = "westeurope";
pub const DEFINITION: &str = "bosh-sim-ubuntu-jammy";
pub const KEYS: [&str; 2] = ["1.1.0", "1.2.0"];

/// The image digest of version key `key` (one stemcell, one content).
pub fn sha_of(key: &str) -> String {
    let seed = key
        .bytes()
        .fold(7u64, |h, b| h.wrapping_mul(31) ^ u64::from(b));
    Rng::new(seed).hex(64)
}

/// Another digest of the same shape (a valid-looking record of other content).
pub const OTHER_SHA: &str = "0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f";

/// One gallery and the service over it.
pub struct Gallery {
    pub gref: GalleryRef,
    pub fake: Arc<FakeGallery>,
    pub locks: Arc<SimLocks>,
    pub svc: Arc<GalleryService>,
}

impl Gallery {
    /// The lock (and record) of version `key`, as the service names it.
    pub fn lock_name(&self, key: &str) -> String {
        self.svc.lock_name(DEFINITION, key)
    }
}

/// The kinds of trouble a run may meet; `SIM_WITHOUT=a,b` leaves some out (to see what the
/// others find, or to check one fix at a time).
pub const FAMILIES: [&str; 10] = [
    "shared", "recreate", "failed", "intent", "tamper", "late", "cpi", "crash", "lease", "storm",
];

/// Which of [`FAMILIES`] a run meets.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pub without: std::collections::BTreeSet<String>,
}

impl Profile {
    pub fn on(&self, family: &str) -> bool {
        debug_assert!(FAMILIES.contains(&family), "{family}");
        !self.without.contains(family)
    }
}

pub struct World {
    pub galleries: Vec<Gallery>,
    /// Whether both galleries' locks and records live in one storage account.
    pub shared_store: bool,
    pub soft_delete: bool,
    pub probe: Arc<Probe>,
    pub profile: Profile,
}

impl World {
    pub fn new(rng: &mut Rng, profile: Profile) -> World {
        let probe = Probe::new();
        let two = rng.percent(70);
        let shared_store = two && rng.percent(70) && profile.on("shared");
        let soft_delete = rng.percent(25);
        let count = if two { 2 } else { 1 };
        let first_locks = Arc::new(SimLocks::new(
            Arc::new(MemoryRecords::default()),
            probe.clone(),
        ));
        let galleries = (0..count)
            .map(|g| {
                let gref = GalleryRef {
                    subscription: SUBSCRIPTION.into(),
                    resource_group: format!("rg{}", g + 1),
                    gallery: GALLERY.into(),
                };
                let fake = Arc::new(FakeGallery::new(gref.clone()));
                fake.add_definition(DEFINITION);
                if soft_delete {
                    fake.set_soft_delete(Some(SoftDelete {
                        retention_days: Some(7),
                    }));
                }
                let locks = if g == 0 || shared_store {
                    first_locks.clone()
                } else {
                    Arc::new(SimLocks::new(
                        Arc::new(MemoryRecords::default()),
                        probe.clone(),
                    ))
                };
                let api = Arc::new(SimApi {
                    g,
                    inner: fake.clone(),
                    probe: probe.clone(),
                });
                let svc = Arc::new(GalleryService::new(
                    api,
                    locks.clone(),
                    gref.clone(),
                    LOCATION,
                ));
                Gallery {
                    gref,
                    fake,
                    locks,
                    svc,
                }
            })
            .collect();
        World {
            galleries,
            shared_store,
            soft_delete,
            probe,
            profile,
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} gallery(ies) named {GALLERY}{}{}",
            self.galleries.len(),
            if self.galleries.len() > 1 {
                if self.shared_store {
                    ", locks and records in ONE storage account"
                } else {
                    ", each with its own storage account"
                }
            } else {
                ""
            },
            if self.soft_delete {
                ", soft delete on"
            } else {
                ""
            }
        )
    }
}

/// What `seed`/`ensure --reference R [--holder H]` (or the CPI front's `create_stemcell`) asks
/// of the service for version `key`: its stemcell already uploaded to a blob (the fake takes any
/// source), `reference` recorded with `holder`.
pub fn ensure_request(key: &str, reference: &str, holder: Option<&str>) -> EnsureRequest {
    EnsureRequest {
        stemcell: StemcellImage {
            name: DEFINITION.into(),
            version: key.trim_end_matches(".0").into(),
            version_key: key.into(),
            definition: DEFINITION.into(),
            architecture: Architecture::X64,
            generation: HyperVGeneration::V1,
            features: BTreeMap::new(),
            content: crate::gallery::Content::image(&sha_of(key)),
            cloud_property_tags: BTreeMap::from([("os_type".to_string(), "linux".to_string())]),
        },
        mode: Mode::Director,
        create_env_suffix: DEFAULT_CREATE_ENV_SUFFIX.into(),
        source_uri: source_uri(key),
        storage_account_id: format!(
            "/subscriptions/{SUBSCRIPTION}/resourceGroups/rg1/providers/Microsoft.Storage/storageAccounts/simstore"
        ),
        target_regions: vec![],
        replica_count: Some(1),
        exclude_from_latest: false,
        safeguards: Default::default(),
        extra_tags: BTreeMap::new(),
        reference: Some(reference.into()),
        holder: holder.map(str::to_string),
        arrival: None,
        soft_deleted_checked: false,
    }
}

/// The blob a version of `key` is made from.
pub fn source_uri(key: &str) -> String {
    format!("https://simstore.blob.core.windows.net/stemcell/{DEFINITION}-{key}.vhd")
}
