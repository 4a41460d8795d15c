//! The gallery service's scenarios, each written once and played against two backends: the
//! emulator over HTTP ([`emulator`]: the real ARM adapter, azure_core 1.x, and the real blob-lease
//! lock) and the in-memory `FakeGallery` ([`fake`]: fast, no HTTP). A scenario is an `async fn`
//! over a [`Backend`]; `shared_scenarios!` makes every one of them a test in both modules, so
//! `cargo test --test integration gallery_scenarios::emulator::` runs the emulator half (what
//! scripts/test.sh runs again under the Azure timing profile; which scenarios that run paces, see
//! `shared_scenarios!`) and `gallery_scenarios::fake::` the fake half. A scenario only one backend can play lives in that backend's module and says why.
//!
//! What a scenario observes it reads in ARM's terms on both backends: the requests served since
//! the last reset ([`Request`]: the emulator's request log; the fake's calls, each as the ARM
//! request the adapter sends for it) and a stored version ([`Stored`]: the emulator's JSON as
//! served, the fake's record).

use std::collections::BTreeMap;
use std::sync::Arc;

use stemcell_gallery::error::{Classified, Exit};
use stemcell_gallery::gallery::service::*;
use stemcell_gallery::gallery::{tags, Architecture, HyperVGeneration};

use crate::support::{RG, SUB};

mod emulator;
mod fake;
mod fake_locks;
mod locks;
use locks::*;

const GALLERY: &str = "bosh_stemcells";
const NAME: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
const SHA_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const SHA_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
/// The version key every scenario's stemcell (version 1.506) gets.
const KEY: &str = "1.506.0";

/// Where a scenario plays: a gallery `GALLERY` in `SUB`/`RG`, in `LOC`, and a service over it.
trait Backend: Sized {
    /// The backend's name in printed figures.
    const NAME: &'static str;

    /// An empty gallery (and, on the emulator, the `stemcell` container the lock lives in), its
    /// operations paced by `timing` (the fake has no pace: it finishes every operation at once).
    async fn start(timing: Timing) -> Self;
    /// The gallery service over this backend, as the fronts build it.
    fn service(&self) -> GalleryService;
    /// Every request served since the start or the last [`Backend::reset_log`], oldest first.
    fn requests(&self) -> Vec<Request>;
    fn reset_log(&self);
    /// Version `KEY` of `definition` as stored now; `None` when there is none.
    async fn stored(&self, definition: &str) -> Option<Stored>;
    /// The id of every version in the gallery.
    async fn version_ids(&self) -> Vec<String>;
    /// A settled version of `definition` that another tool made from `source_uri` with `tags`.
    async fn someone_elses_version(
        &self,
        definition: &str,
        source_uri: &str,
        tags: BTreeMap<String, String>,
    );
    /// A version of `NAME` whose create failed, tagged with `sha` (and nothing else).
    async fn failed_version(&self, sha: &str);
    /// The version of `definition` turns Failed after it was made (an update of it failed).
    async fn make_failed(&self, definition: &str);
    /// A VM named `name` in `SUB`/`RG` running from `image_id`; its id.
    async fn add_vm(&self, name: &str, image_id: &str) -> String;
    async fn set_soft_delete(&self, on: bool);
    /// Azure refuses every DELETE of a version with 409 and `code`.
    fn refuse_deletes(&self, code: &str);
}

/// How the emulator paces a scenario's operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timing {
    /// The suite's timing: instant, or the Azure profile `STEMCELL_GALLERY_TEST_TIMING` names
    /// (scripts/test.sh's second run).
    Suite,
    /// Instant whatever the suite's timing: a scenario of the service's own rules, which the
    /// timed run does not replay at Azure's pace (see `shared_scenarios!`).
    Instant,
}

/// One request a backend served, in ARM's terms.
#[derive(Debug, Clone)]
struct Request {
    /// "arm", or "blob" (the emulator's lease lock and reference record).
    service: String,
    method: String,
    path: String,
    /// The status answered (`None`: the fake records none; it answers errors only as injected).
    status: Option<u16>,
}

/// A stored version as a scenario reads it.
#[derive(Debug, Clone)]
struct Stored {
    id: String,
    provisioning_state: String,
    source_uri: Option<String>,
    tags: BTreeMap<String, String>,
}

impl Stored {
    /// The references of the version as this tool reads them.
    fn references(&self) -> Vec<String> {
        tags::references(&self.tags)
    }
}

fn gallery_id() -> String {
    format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/galleries/{GALLERY}"
    )
}

fn version_path(definition: &str) -> String {
    format!("{}/images/{definition}/versions/{KEY}", gallery_id())
}

/// The ARM requests (the lock's blob requests left out).
fn arm(requests: &[Request]) -> Vec<Request> {
    requests
        .iter()
        .filter(|r| r.service == "arm")
        .cloned()
        .collect()
}

/// The ARM requests that are not GETs, as `(method, path)`.
fn writes(requests: &[Request]) -> Vec<(String, String)> {
    arm(requests)
        .into_iter()
        .filter(|r| r.method != "GET")
        .map(|r| (r.method, r.path))
        .collect()
}

/// How many `method` requests were made of version `KEY` of `definition`.
fn count_of(requests: &[Request], method: &str, definition: &str) -> usize {
    requests
        .iter()
        .filter(|r| r.method == method && r.path.eq_ignore_ascii_case(&version_path(definition)))
        .count()
}

fn request(sha: &str, mode: Mode, blob: &str, reference: &str) -> EnsureRequest {
    EnsureRequest {
        stemcell: StemcellImage {
            name: NAME.into(),
            version: "1.506".into(),
            version_key: KEY.into(),
            definition: NAME.into(),
            architecture: Architecture::X64,
            generation: HyperVGeneration::V1,
            features: BTreeMap::new(),
            content: stemcell_gallery::gallery::Content::image(sha),
            cloud_property_tags: BTreeMap::from([("os_type".to_string(), "linux".to_string())]),
        },
        mode,
        create_env_suffix: DEFAULT_CREATE_ENV_SUFFIX.into(),
        source_uri: format!("https://bosh.blob.core.windows.net/stemcell/{blob}.vhd"),
        storage_account_id: format!(
            "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Storage/storageAccounts/bosh"
        ),
        target_regions: vec![],
        replica_count: Some(1),
        exclude_from_latest: false,
        safeguards: Default::default(),
        extra_tags: BTreeMap::new(),
        reference: Some(reference.into()),
        holder: None,
        arrival: None,
        soft_deleted_checked: false,
    }
}

/// Every scenario both backends play, made tests of the module that invokes this with its
/// backend type. A scenario that would wait out Azure's backoff if it regressed runs under
/// `#[$paused]` (the fake: in paused time; the emulator cannot, its HTTP needs the real clock).
///
/// On the emulator, the scenarios of Azure's behaviour play at the suite's timing, so the timed
/// run (scripts/test.sh) replays them at Azure's pace as it did before the suite was one; the
/// service's own rules, which only the fake played before, play at the instant timing in every
/// run: the timed run never replayed them, and doing so added about 20 s to it (2 cores).
macro_rules! shared_scenarios {
    ($backend:ty, #[$paused:meta]) => {
        shared_scenarios!(@tests $backend, #[tokio::test], Suite, [
            create_env_then_director_upload_of_the_same_stemcell_no_409,
            director_then_create_env_upload_of_the_same_stemcell_no_409,
            reuse_with_the_reference_recorded_is_exactly_one_get,
            request_counts_for_a_miss_and_a_lookup_by_cid,
            a_second_director_adds_its_reference_with_a_tags_only_patch,
            a_failed_version_is_deleted_and_created_again,
            a_failed_version_in_a_soft_delete_gallery_is_refused_at_once_with_the_remedy,
            a_failed_version_still_in_use_is_not_replaced,
            a_version_made_the_azure_cpi_way_is_recognised_and_reused,
        ]);
        shared_scenarios!(@tests $backend, #[tokio::test], Instant, [
            different_content_under_the_same_version_is_a_conflict_naming_both,
            a_failed_version_is_replaced_only_when_it_holds_the_same_image,
            eight_concurrent_callers_get_one_version_with_eight_references,
            removing_the_last_reference_keeps_a_version_a_vm_still_runs,
            removing_the_last_unused_reference_deletes_the_version,
            a_version_that_went_away_while_compared_is_not_created_from_no_source,
            x64_and_arm64_gen2_stemcells_of_one_name_never_share_a_definition,
            an_ensure_under_a_soft_deleted_name_restores_the_same_content_and_refuses_other,
            a_held_version_is_refused_to_other_deleters_and_deleted_by_its_last_reference,
            a_lock_of_another_keeps_the_version_with_reason_locked,
            a_version_only_the_azure_cpi_holds_is_left_unlocked_for_it,
            a_delete_lock_removed_by_hand_comes_back_with_the_next_reference,
        ]);
        shared_scenarios!(@tests $backend, #[$paused], Instant, [
            a_delete_azure_refuses_before_the_end_of_life_keeps_the_version_at_once,
        ]);
    };
    (@tests $backend:ty, #[$attr:meta], $timing:ident, [$($name:ident),* $(,)?]) => {
        $(
            #[$attr]
            async fn $name() {
                let backend = <$backend as super::Backend>::start(super::Timing::$timing).await;
                super::$name(backend).await
            }
        )*
    };
}
use shared_scenarios;

async fn create_env_then_director_upload_of_the_same_stemcell_no_409<B: Backend>(b: B) {
    let svc = b.service();
    let ce = svc
        .ensure(&request(
            SHA_A,
            Mode::CreateEnv,
            "blob-a",
            "bosh-stemcell-a",
        ))
        .await
        .unwrap();
    assert_eq!(ce.outcome, Outcome::Created);
    assert_eq!(ce.definition, format!("{NAME}-create-env"));
    let d = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .expect("the director's upload must not meet a 409");
    assert_eq!(d.outcome, Outcome::Created);
    assert_eq!(d.definition, NAME);
    assert_ne!(ce.version.id, d.version.id);
    let requests = b.requests();
    assert!(!arm(&requests).is_empty());
    assert!(
        arm(&requests).iter().all(|r| r.status != Some(409)),
        "no ARM 409 at all"
    );
    assert_eq!(b.version_ids().await.len(), 2);
    // The create-env version is untouched: its source and its single reference.
    let untouched = b.stored(&format!("{NAME}-create-env")).await.unwrap();
    assert_eq!(
        untouched.source_uri.as_deref(),
        Some("https://bosh.blob.core.windows.net/stemcell/blob-a.vhd")
    );
    assert_eq!(untouched.references(), vec!["bosh-stemcell-a"]);
    assert_eq!(untouched.tags[tags::MODE], "create-env");
}

async fn director_then_create_env_upload_of_the_same_stemcell_no_409<B: Backend>(b: B) {
    let svc = b.service();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .unwrap();
    let ce = svc
        .ensure(&request(
            SHA_A,
            Mode::CreateEnv,
            "blob-a",
            "bosh-stemcell-a",
        ))
        .await
        .unwrap();
    assert_eq!(ce.outcome, Outcome::Created);
    assert_eq!(ce.definition, format!("{NAME}-create-env"));
    assert!(arm(&b.requests()).iter().all(|r| r.status != Some(409)));
}

/// The DESIGN budget: a reuse with the reference already recorded is one GET, lock and all,
/// whichever blob the caller uploaded this time.
async fn reuse_with_the_reference_recorded_is_exactly_one_get<B: Backend>(b: B) {
    let svc = b.service();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    for blob in ["blob-a", "blob-other"] {
        b.reset_log();
        let r = svc
            .ensure(&request(SHA_A, Mode::Director, blob, "bosh-stemcell-a"))
            .await
            .unwrap();
        assert_eq!(r.outcome, Outcome::Reused, "{blob}");
        let reqs = b.requests();
        assert_eq!(reqs.len(), 1, "{blob}: {reqs:?}");
        assert_eq!(reqs[0].method, "GET");
        assert!(reqs[0].path.ends_with("/versions/1.506.0"), "{reqs:?}");
    }
}

async fn request_counts_for_a_miss_and_a_lookup_by_cid<B: Backend>(b: B) {
    let svc = b.service();
    b.reset_log();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    let all = b.requests();
    let miss = arm(&all);
    let blob = all.len() - miss.len();
    b.reset_log();
    let found = svc.lookup_by_reference("bosh-stemcell-a").await.unwrap();
    assert!(found.is_some());
    let by_cid = arm(&b.requests());
    // Printed for bench/README.md (run with --nocapture).
    println!(
        "{}: ensure-miss: {} ARM requests ({:?}) + {} blob requests (lock); lookup-by-CID with 1 definition: {} ARM requests",
        B::NAME,
        miss.len(),
        miss.iter().map(|r| r.method.as_str()).collect::<Vec<_>>(),
        blob,
        by_cid.len()
    );
    // 13 under the instant timing (bench/README.md lists them, the definition's soft-deleted
    // versions among them: a create under a soft-deleted name is restored, not refused; and
    // since issue 46 the version's management locks listed and its delete lock PUT, once it
    // holds the reference); under --timing azure a few more operation polls (15 measured).
    assert!(miss.len() <= 16, "{miss:?}");
    assert_eq!(
        by_cid.len(),
        2,
        "list definitions + list versions of the one definition"
    );
}

/// A second director's upload of the same stemcell adds its reference with one tags-only PATCH:
/// nothing created again, the first source kept.
async fn a_second_director_adds_its_reference_with_a_tags_only_patch<B: Backend>(b: B) {
    let svc = b.service();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    let first = b.requests();
    b.reset_log();
    let r = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Reused);
    let second = b.requests();
    let writes = writes(&second);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].0, "PATCH");
    let both: Vec<Request> = first.into_iter().chain(second).collect();
    assert_eq!(count_of(&both, "PUT", NAME), 1, "one create");
    assert_eq!(count_of(&both, "PATCH", NAME), 1, "one tags update");
    let v = b.stored(NAME).await.unwrap();
    assert_eq!(v.references(), vec!["bosh-stemcell-a", "bosh-stemcell-b"]);
    assert_eq!(
        v.source_uri.as_deref(),
        Some("https://bosh.blob.core.windows.net/stemcell/blob-a.vhd")
    );
}

async fn different_content_under_the_same_version_is_a_conflict_naming_both<B: Backend>(b: B) {
    let svc = b.service();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    let err = svc
        .ensure(&request(SHA_B, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .unwrap_err();
    assert_eq!(err.class().exit(), Exit::Conflict);
    let msg = err.to_string();
    for want in [
        SHA_A,
        SHA_B,
        "blob-a.vhd",
        "blob-b.vhd",
        "Remedy",
        "-create-env",
    ] {
        assert!(msg.contains(want), "missing {want:?} in {msg}");
    }
    let v = b.stored(NAME).await.unwrap();
    assert_eq!(v.references(), vec!["bosh-stemcell-a"], "nothing changed");
}

async fn a_failed_version_is_deleted_and_created_again<B: Backend>(b: B) {
    let svc = b.service();
    // The version ends Failed while holding this very content (only then is it replaced).
    b.failed_version(SHA_A).await;
    let r = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Recreated);
    assert_eq!(r.version.provisioning_state.as_str(), "Succeeded");
    assert_eq!(r.version.tags[tags::IMAGE_SHA256], SHA_A);
}

/// Issue 14 item 5: a Failed version holding this content is replaced and keeps its references;
/// one holding another image is a conflict (exit 4) and stays.
async fn a_failed_version_is_replaced_only_when_it_holds_the_same_image<B: Backend>(b: B) {
    let svc = b.service();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    b.make_failed(NAME).await;
    let err = svc
        .ensure(&request(SHA_B, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .expect_err("another image: not replaced");
    assert_eq!(err.class().exit(), Exit::Conflict);
    let text = err.to_string();
    assert!(text.contains(SHA_A) && text.contains(SHA_B), "{text}");
    let v = b.stored(NAME).await.unwrap();
    assert_eq!(v.provisioning_state, "Failed");

    let r = svc
        .ensure(&request(
            SHA_A,
            Mode::Director,
            "blob-a2",
            "bosh-stemcell-b",
        ))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Recreated);
    let v = b.stored(NAME).await.unwrap();
    assert_eq!(v.provisioning_state, "Succeeded");
    assert_eq!(v.tags[tags::IMAGE_SHA256], SHA_A);
    let mut refs = v.references();
    refs.sort();
    assert_eq!(refs, vec!["bosh-stemcell-a", "bosh-stemcell-b"]);
}

/// Issue 30 item 4: in a gallery with soft delete on, Azure cannot delete a Failed version
/// (SDDOC; the emulator refuses the DELETE with 409). `ensure` of the same content stops at once
/// with the remedy — no DELETE sent, no retry until a timeout, the version left as it was — and
/// once soft delete is off the same call replaces it.
async fn a_failed_version_in_a_soft_delete_gallery_is_refused_at_once_with_the_remedy<
    B: Backend,
>(
    b: B,
) {
    let svc = b.service();
    b.failed_version(SHA_A).await;
    b.set_soft_delete(true).await;
    b.reset_log();
    let started = std::time::Instant::now();
    let err = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .expect_err("a Failed version in a soft-delete gallery is not replaced");
    let text = format!("{err:#}");
    assert!(
        text.contains("soft delete on")
            && text.contains("isSoftDeleteEnabled: false")
            && text.contains("re-run"),
        "{text}"
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "refused at once ({:?})",
        started.elapsed()
    );
    let writes: Vec<String> = b
        .requests()
        .iter()
        .filter(|q| q.method != "GET" && q.path.contains("/providers/"))
        .map(|q| format!("{} {}", q.method, q.path))
        .collect();
    assert!(writes.is_empty(), "no gallery write: {writes:?}");
    assert_eq!(b.stored(NAME).await.unwrap().provisioning_state, "Failed");

    b.set_soft_delete(false).await;
    let r = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .expect("replaced once soft delete is off");
    assert_eq!(r.outcome, Outcome::Recreated);
}

/// A Failed version that a VM still runs from (its tag update failed, not its create) is never
/// deleted to be replaced: ensure stops with an error naming the VM, and the version stays.
async fn a_failed_version_still_in_use_is_not_replaced<B: Backend>(b: B) {
    let svc = b.service();
    // Failed while holding this very content (only then is it replaced).
    b.failed_version(SHA_A).await;
    let version = b.stored(NAME).await.unwrap();
    assert_eq!(version.provisioning_state, "Failed");
    b.add_vm("worker-0", &version.id).await;

    let err = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .expect_err("a version in use is not replaced");
    let text = err.to_string();
    assert!(
        text.contains("worker-0") && text.contains("not replaced"),
        "{text}"
    );
    let after = b.stored(NAME).await.expect("the version is still there");
    assert_eq!(after.provisioning_state, "Failed");
}

async fn a_version_made_the_azure_cpi_way_is_recognised_and_reused<B: Backend>(b: B) {
    let svc = b.service();
    b.someone_elses_version(
        NAME,
        "https://bosh.blob.core.windows.net/stemcell/bosh-stemcell-cpi.vhd",
        BTreeMap::from([
            ("image_sha256".to_string(), SHA_A.to_string()),
            (
                "stemcell_references".to_string(),
                "bosh-stemcell-cpi".to_string(),
            ),
            ("compute_gallery_name".to_string(), GALLERY.to_string()),
            (
                "compute_gallery_image_definition".to_string(),
                NAME.to_string(),
            ),
        ]),
    )
    .await;
    let r = svc
        .ensure(&request(
            SHA_A,
            Mode::Director,
            "blob-mine",
            "bosh-stemcell-mine",
        ))
        .await
        .unwrap();
    assert_eq!(r.outcome, Outcome::Reused);
    assert_eq!(
        r.version.source_uri.as_deref(),
        Some("https://bosh.blob.core.windows.net/stemcell/bosh-stemcell-cpi.vhd")
    );
    assert_eq!(
        tags::references(&r.version.tags),
        vec!["bosh-stemcell-cpi", "bosh-stemcell-mine"]
    );
    // The CPI's CID stays in its tag, where its lookup finds it; ours lives in the overflow,
    // guarded by the version's sentinel (which the front hands the CPI's create_vm).
    let v = b.stored(NAME).await.unwrap();
    assert_eq!(
        v.tags["stemcell_references"],
        format!("{},bosh-stemcell-cpi", tags::sentinel(NAME, KEY))
    );
}

async fn eight_concurrent_callers_get_one_version_with_eight_references<B: Backend>(b: B) {
    let svc = Arc::new(b.service());
    let mut tasks = Vec::new();
    for i in 0..8 {
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            svc.ensure(&request(
                SHA_A,
                Mode::Director,
                &format!("blob-{i}"),
                &format!("bosh-stemcell-{i}"),
            ))
            .await
            .unwrap()
            .version
            .id
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1);
    assert_eq!(b.version_ids().await.len(), 1);
    assert_eq!(
        count_of(&b.requests(), "PUT", NAME),
        1,
        "exactly one create"
    );
    let mut refs = b.stored(NAME).await.unwrap().references();
    refs.sort();
    assert_eq!(
        refs,
        (0..8)
            .map(|i| format!("bosh-stemcell-{i}"))
            .collect::<Vec<_>>()
    );
}

async fn removing_the_last_reference_keeps_a_version_a_vm_still_runs<B: Backend>(b: B) {
    let svc = b.service();
    let e = svc
        .ensure(&request(
            SHA_A,
            Mode::CreateEnv,
            "blob-a",
            "bosh-stemcell-a",
        ))
        .await
        .unwrap();
    b.add_vm("director", &e.version.id).await;
    let def = format!("{NAME}-create-env");
    let r = svc
        .remove_reference(&def, KEY, Some("bosh-stemcell-a"))
        .await
        .unwrap();
    match r {
        Removal::KeptInUse { consumers } => assert!(consumers[0].id.ends_with("/director")),
        other => panic!("expected KeptInUse, got {other:?}"),
    }
    assert_eq!(count_of(&b.requests(), "DELETE", &def), 0);
    let kept = b.stored(&def).await.expect("the version stays");
    assert!(kept.references().is_empty());
}

async fn removing_the_last_unused_reference_deletes_the_version<B: Backend>(b: B) {
    let svc = b.service();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .unwrap();
    let r = svc
        .remove_reference(NAME, KEY, Some("bosh-stemcell-a"))
        .await
        .unwrap();
    assert_eq!(
        r,
        Removal::ReferenceRemoved {
            remaining: vec!["bosh-stemcell-b".into()]
        }
    );
    let r = svc
        .remove_reference(NAME, KEY, Some("bosh-stemcell-b"))
        .await
        .unwrap();
    assert_eq!(r, Removal::Deleted);
    assert!(b.stored(NAME).await.is_none());
    let r = svc
        .remove_reference(NAME, KEY, Some("bosh-stemcell-b"))
        .await
        .unwrap();
    assert_eq!(r, Removal::NotFound);
}

/// Issue 30 item 3, the race: the version blocks its deletion only after it was read (or Azure's
/// clock says the end of life is still ahead), so Azure refuses the DELETE with
/// `DeleteGalleryImageVersionBlockedBeforeEndOfLife` (409). That refusal is an answer: the
/// version is kept and the removal says so, at once. (Before, the 409 read as "another operation
/// in flight": observed again and re-sent until the delete gave up unsettled.)
async fn a_delete_azure_refuses_before_the_end_of_life_keeps_the_version_at_once<B: Backend>(b: B) {
    let svc = b.service();
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    b.refuse_deletes("DeleteGalleryImageVersionBlockedBeforeEndOfLife");
    let r = svc
        .remove_reference(NAME, KEY, Some("bosh-stemcell-a"))
        .await
        .unwrap();
    assert_eq!(r, Removal::KeptBlocked { until: None });
    assert_eq!(
        count_of(&b.requests(), "DELETE", NAME),
        1,
        "one DELETE, never re-sent"
    );
    assert!(b.stored(NAME).await.is_some(), "the version stays");
}

/// A caller that uploaded nothing (it came to reuse or compare a version it had just seen) and
/// then finds the version gone gets a clear error: the service never creates a version from a
/// request with no source (before issue 17, publish passed the sentence "none (nothing was
/// uploaded)" as the blob URI, and a create would have been sent with it).
async fn a_version_that_went_away_while_compared_is_not_created_from_no_source<B: Backend>(b: B) {
    let svc = b.service();
    let mut req = request(SHA_A, Mode::Director, "unused", "bosh-stemcell-1");
    req.source_uri = String::new();
    let err = svc.ensure_observed(&req, None, None).await.unwrap_err();
    assert!(
        matches!(
            err,
            stemcell_gallery::gallery::Error::NothingToCreateFrom { .. }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("re-run"), "{err}");
    assert!(
        err.class().retryable(),
        "a re-run uploads and creates: {err}"
    );
    assert!(b.version_ids().await.is_empty(), "nothing created");
}

/// Issue 19: x64 and Arm64 gen2 stemcells that share a name. The Azure CPI names the definition
/// `<name>-gen2` for both (architecture is not in its name) and, finding it present, puts the
/// second architecture's version into it. The service keeps the CPI's name and refuses the
/// second architecture instead: the two never share a definition, and the error names both.
async fn x64_and_arm64_gen2_stemcells_of_one_name_never_share_a_definition<B: Backend>(b: B) {
    let svc = b.service();
    let gen2 = |sha: &str, arch: Architecture, cid: &str| {
        let mut r = request(sha, Mode::Director, cid, cid);
        // Another version, so the definition is what meets the second stemcell.
        if arch == Architecture::Arm64 {
            r.stemcell.version = "1.507".into();
            r.stemcell.version_key = "1.507.0".into();
        }
        r.stemcell.definition = format!("{NAME}-gen2");
        r.stemcell.generation = HyperVGeneration::V2;
        r.stemcell.architecture = arch;
        r
    };
    let x64 = svc
        .ensure(&gen2(SHA_A, Architecture::X64, "bosh-stemcell-x64"))
        .await
        .unwrap();
    assert_eq!(x64.definition, format!("{NAME}-gen2"));
    let err = svc
        .ensure(&gen2(SHA_B, Architecture::Arm64, "bosh-stemcell-arm"))
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("architecture x64") && msg.contains("needs Arm64"),
        "{msg}"
    );
    assert!(msg.contains("cloud_properties.name"), "{msg}");
    let versions = b.version_ids().await;
    assert_eq!(versions.len(), 1, "{versions:?}");
}

/// Issue 30 item 4: a version deleted in a soft-delete gallery is restored by the next ensure of
/// the same content (nothing created), and refused for other content.
async fn an_ensure_under_a_soft_deleted_name_restores_the_same_content_and_refuses_other<
    B: Backend,
>(
    b: B,
) {
    let svc = b.service();
    b.set_soft_delete(true).await;
    svc.ensure(&request(SHA_A, Mode::Director, "blob-a", "bosh-stemcell-a"))
        .await
        .unwrap();
    let r = svc
        .remove_reference(NAME, KEY, Some("bosh-stemcell-a"))
        .await
        .unwrap();
    assert_eq!(r, Removal::Deleted);
    assert!(b.stored(NAME).await.is_none());

    b.reset_log();
    let other = svc
        .ensure(&request(SHA_B, Mode::Director, "blob-b", "bosh-stemcell-b"))
        .await
        .unwrap_err();
    assert_eq!(other.class().exit(), Exit::Conflict, "{other}");
    assert!(other.to_string().contains("is soft-deleted"), "{other}");
    // A restore is a PATCH of the version.
    assert_eq!(
        count_of(&b.requests(), "PATCH", NAME),
        0,
        "nothing restored"
    );

    b.reset_log();
    let e = svc
        .ensure(&request(SHA_A, Mode::Director, "blob-c", "bosh-stemcell-c"))
        .await
        .unwrap();
    assert_eq!(e.outcome, Outcome::Restored);
    assert_eq!(count_of(&b.requests(), "PUT", NAME), 0, "nothing created");
    assert_eq!(
        b.stored(NAME).await.unwrap().references(),
        vec!["bosh-stemcell-c".to_string()]
    );
}
