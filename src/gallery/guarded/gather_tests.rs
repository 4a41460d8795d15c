//! The holder's gathering of handed-over references, on virtual time (`start_paused`): a
//! scripted holder whose waiters' intents arrive at set instants after the holder took the
//! lock.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use time::OffsetDateTime;

use super::*;
use crate::gallery::fake::FakeGallery;
use crate::gallery::lock::{Intent, LocalLocks};
use crate::gallery::record::{MemoryRecords, RecordStore};
use crate::gallery::ProvisioningState;

const DEFINITION: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
const KEY: &str = "1.506.0";
const LOCK: &str = "locks/stemcells/bosh-azure-hyperv-ubuntu-jammy-go_agent/1.506.0.lock";

/// A lock held by the test, with waiters' intents arriving `after` the lock was taken.
struct Scripted {
    records: Arc<MemoryRecords>,
    taken: Instant,
    arrivals: Mutex<Vec<(Duration, Intent)>>,
    /// Intents claimed (by id), and those finished.
    claimed: Mutex<Vec<String>>,
    finished: Mutex<Vec<String>>,
}

impl Scripted {
    fn new(arrivals: &[(u64, &str)]) -> Self {
        Scripted {
            records: Arc::new(MemoryRecords::default()),
            taken: Instant::now(),
            arrivals: Mutex::new(
                arrivals
                    .iter()
                    .map(|(ms, r)| {
                        (
                            Duration::from_millis(*ms),
                            Intent {
                                id: format!("intent-{r}"),
                                reference: r.to_string(),
                                holder: None,
                            },
                        )
                    })
                    .collect(),
            ),
            claimed: Mutex::default(),
            finished: Mutex::default(),
        }
    }
}

#[async_trait::async_trait]
impl Held for Scripted {
    async fn check(&self) -> Result<()> {
        Ok(())
    }
    fn name(&self) -> &str {
        LOCK
    }
    fn records(&self) -> &dyn RecordStore {
        self.records.as_ref()
    }
    fn gather(&self) -> Option<crate::gallery::lock::Gather> {
        Some(crate::gallery::lock::GATHER)
    }
    async fn claim_intents(&self) -> Result<Vec<Intent>> {
        let now = self.taken.elapsed();
        let mut pending = self.arrivals.lock().unwrap();
        let (due, later): (Vec<_>, Vec<_>) = pending.drain(..).partition(|(at, _)| *at <= now);
        *pending = later;
        let due: Vec<Intent> = due.into_iter().map(|(_, i)| i).collect();
        self.claimed
            .lock()
            .unwrap()
            .extend(due.iter().map(|i| i.id.clone()));
        Ok(due)
    }
    async fn finish_intents(&self, ids: &[String]) -> Result<()> {
        self.finished.lock().unwrap().extend(ids.iter().cloned());
        Ok(())
    }
    async fn release(self: Box<Self>) {}
}

fn gallery() -> FakeGallery {
    let g = FakeGallery::default();
    g.add_version(
        DEFINITION,
        KEY,
        ProvisioningState::Succeeded,
        OffsetDateTime::now_utc(),
        BTreeMap::from([(tags::IMAGE_SHA256.to_string(), "ab".repeat(32))]),
    );
    g
}

/// Record `reference` as the holder, the waiters' intents arriving as `held` says.
async fn hold_and_add(api: &FakeGallery, held: &Scripted, reference: &str) -> Vec<String> {
    let locks = LocalLocks::default();
    let t = Target {
        api,
        locks: &locks,
        lock_name: LOCK,
        gallery: "stemcells",
        definition: DEFINITION,
        key: KEY,
    };
    let v = merge_references(&t, held, &Delta::add(reference, None))
        .await
        .unwrap()
        .expect("the version exists");
    let mut refs = tags::references(&v.tags);
    refs.sort();
    refs
}

/// The case: the holder found nothing pending when it first looked, and a writer
/// started at the same moment handed its reference over just after: the holder's one write
/// records both.
#[tokio::test(start_paused = true)]
async fn an_intent_arriving_just_after_the_first_claim_is_in_the_same_write() {
    let api = gallery();
    let held = Scripted::new(&[(50, "r-late")]);
    let refs = hold_and_add(&api, &held, "r-holder").await;
    assert_eq!(refs, vec!["r-holder".to_string(), "r-late".to_string()]);
    assert_eq!(api.calls("set_version_tags"), 1, "one write");
    assert_eq!(*held.finished.lock().unwrap(), vec!["intent-r-late"]);
}

/// Writers arriving one after another, each soon after the last, all go into one write.
#[tokio::test(start_paused = true)]
async fn a_burst_arriving_over_a_few_hundred_milliseconds_is_one_write() {
    let api = gallery();
    let held = Scripted::new(&[(0, "r-0"), (120, "r-1"), (280, "r-2"), (440, "r-3")]);
    let refs = hold_and_add(&api, &held, "r-holder").await;
    assert_eq!(refs, vec!["r-0", "r-1", "r-2", "r-3", "r-holder"]);
    assert_eq!(api.calls("set_version_tags"), 1, "one write");
}

/// Writers that keep arriving do not hold the write back for ever: the holder stops
/// gathering after `max` and writes; the later intents stay pending (unclaimed), for the
/// next holder.
#[tokio::test(start_paused = true)]
async fn gathering_ends_after_its_bound_and_leaves_later_intents_pending() {
    let api = gallery();
    let arrivals: Vec<(u64, String)> = (0..40).map(|i| (i * 100, format!("r-{i:02}"))).collect();
    let script: Vec<(u64, &str)> = arrivals.iter().map(|(t, r)| (*t, r.as_str())).collect();
    let held = Scripted::new(&script);
    let refs = hold_and_add(&api, &held, "r-holder").await;
    assert_eq!(api.calls("set_version_tags"), 1, "one write");
    let max = crate::gallery::lock::GATHER.max.as_millis() as u64;
    let claimed = held.claimed.lock().unwrap().clone();
    assert!(
        !claimed.is_empty() && claimed.len() as u64 <= max / 100 + 1,
        "{claimed:?}"
    );
    assert_eq!(refs.len(), claimed.len() + 1, "{refs:?}");
    let left = held.arrivals.lock().unwrap().len();
    assert_eq!(left + claimed.len(), 40, "the rest is still pending");
}

/// What gathering costs a writer alone: an add waits `first` and no more; a removal (no
/// writer of a burst) with nothing pending waits nothing.
#[tokio::test(start_paused = true)]
async fn a_lone_add_waits_the_first_window_and_a_lone_removal_nothing() {
    let api = gallery();
    let held = Scripted::new(&[]);
    let started = Instant::now();
    hold_and_add(&api, &held, "r-holder").await;
    assert_eq!(started.elapsed(), crate::gallery::lock::GATHER.first);
    let locks = LocalLocks::default();
    let t = Target {
        api: &api,
        locks: &locks,
        lock_name: LOCK,
        gallery: "stemcells",
        definition: DEFINITION,
        key: KEY,
    };
    let started = Instant::now();
    let v = merge_references(&t, &held, &Delta::remove(&["r-holder".to_string()]))
        .await
        .unwrap()
        .unwrap();
    assert!(tags::references(&v.tags).is_empty());
    assert_eq!(started.elapsed(), Duration::ZERO);
}

/// The window counts from when the holder began its write: a holder whose own reads took as
/// long as `first` (a version read on Azure does) waits nothing more, and reads nothing again.
#[tokio::test(start_paused = true)]
async fn a_lone_add_whose_reads_outlasted_the_first_window_waits_nothing_more() {
    let held = Scripted::new(&[]);
    let began = Instant::now();
    tokio::time::advance(crate::gallery::lock::GATHER.first).await;
    let at = Instant::now();
    let (intents, waited) = super::gather_intents(&held, true, began).await.unwrap();
    assert!(intents.is_empty());
    assert!(!waited, "no read again");
    assert_eq!(at.elapsed(), Duration::ZERO);
}
