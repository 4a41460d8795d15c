//! The holder's gathering of handed-over references, on virtual time (`start_paused`): a
//! scripted holder whose waiters' intents arrive at set instants after the holder took the
//! lock. Waiters announce their arrival when they start (as every writer of this build does),
//! unless a test says they did not (an older build's).

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
const LOCK: &str = "galleries/00000000-0000-0000-0000-000000000000/bosh-rg/stemcells/bosh-azure-hyperv-ubuntu-jammy-go_agent/1.506.0.lock";

/// A lock held by the test, with waiters' intents arriving `after` the lock was taken.
struct Scripted {
    records: Arc<MemoryRecords>,
    taken: Instant,
    arrivals: Mutex<Vec<(Duration, Intent)>>,
    /// The waiters announced themselves at the start: each counts as arriving until its intent
    /// is due.
    announced: bool,
    /// Writers that announced themselves and never hand over (they died on the way).
    silent: usize,
    /// Intents claimed (by id), and those finished.
    claimed: Mutex<Vec<String>>,
    finished: Mutex<Vec<String>>,
}

impl Scripted {
    fn new(arrivals: &[(u64, &str)]) -> Self {
        Scripted {
            announced: true,
            silent: 0,
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
                                content: None,
                                to_create: false,
                                life: None,
                                age: std::time::Duration::ZERO,
                            },
                        )
                    })
                    .collect(),
            ),
            claimed: Mutex::default(),
            finished: Mutex::default(),
        }
    }

    /// Waiters that did not announce themselves (a build before arrivals).
    fn unannounced(arrivals: &[(u64, &str)]) -> Self {
        Scripted {
            announced: false,
            ..Scripted::new(arrivals)
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
    async fn claim_intents(
        &self,
        _carrying: &crate::gallery::lock::Carrying<'_>,
    ) -> Result<Claimed> {
        let now = self.taken.elapsed();
        let mut pending = self.arrivals.lock().unwrap();
        let (due, later): (Vec<_>, Vec<_>) = pending.drain(..).partition(|(at, _)| *at <= now);
        *pending = later;
        let due: Vec<Intent> = due.into_iter().map(|(_, i)| i).collect();
        self.claimed
            .lock()
            .unwrap()
            .extend(due.iter().map(|i| i.id.clone()));
        let arriving = if self.announced {
            pending.len() + self.silent
        } else {
            0
        };
        Ok(Claimed {
            intents: due,
            arriving,
        })
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
        gallery: api.gallery(),
        definition: DEFINITION,
        key: KEY,
        carry: false,
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

/// What gathering costs a writer alone (issue 33: no slower than before gathering): nobody
/// arrives and nothing is pending, so an add and a removal alike write at once.
#[tokio::test(start_paused = true)]
async fn a_lone_add_and_a_lone_removal_write_at_once() {
    let api = gallery();
    let held = Scripted::new(&[]);
    let started = Instant::now();
    hold_and_add(&api, &held, "r-holder").await;
    assert_eq!(started.elapsed(), Duration::ZERO);
    let locks = LocalLocks::default();
    let t = Target {
        api: &api,
        locks: &locks,
        lock_name: LOCK,
        gallery: api.gallery(),
        definition: DEFINITION,
        key: KEY,
        carry: false,
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
    let tags = std::collections::BTreeMap::new();
    let carrying = crate::gallery::lock::Carrying {
        tags: &tags,
        create: false,
        life: None,
    };
    let (intents, waited) = super::gather_intents(&held, began, &carrying)
        .await
        .unwrap();
    assert!(intents.is_empty());
    assert!(!waited, "no read again");
    assert_eq!(at.elapsed(), Duration::ZERO);
}

/// A writer started with the holder but slower to reach the lock (its reads took longer) hands
/// over well after `first` and `quiet`: it announced itself, so the holder waits for it, within
/// `max`, and the burst is still one write.
#[tokio::test(start_paused = true)]
async fn an_announced_writer_slower_than_the_first_window_is_still_in_the_same_write() {
    let api = gallery();
    let held = Scripted::new(&[(40, "r-quick"), (900, "r-slow")]);
    let refs = hold_and_add(&api, &held, "r-holder").await;
    assert_eq!(refs, vec!["r-holder", "r-quick", "r-slow"]);
    assert_eq!(api.calls("set_version_tags"), 1, "one write");
}

/// A writer that announced itself and died before handing over holds the holder back no longer
/// than `max`; the holder's own reference is written.
#[tokio::test(start_paused = true)]
async fn an_announced_writer_that_never_hands_over_delays_the_write_at_most_max() {
    let api = gallery();
    let held = Scripted {
        silent: 1,
        ..Scripted::new(&[])
    };
    let started = Instant::now();
    let refs = hold_and_add(&api, &held, "r-holder").await;
    assert_eq!(refs, vec!["r-holder"]);
    let waited = started.elapsed();
    let max = crate::gallery::lock::GATHER.max;
    assert!(
        waited >= max && waited <= max + crate::gallery::lock::GATHER.step,
        "{waited:?}"
    );
}

/// A writer that did not announce itself (a build before arrivals) and hands over after a lone
/// holder's claim is not waited for: its intent stays pending for the next holder (nothing is
/// lost; it costs that writer a second write, as before gathering).
#[tokio::test(start_paused = true)]
async fn an_unannounced_late_intent_is_left_pending_for_the_next_write() {
    let api = gallery();
    let held = Scripted::unannounced(&[(50, "r-old-build")]);
    let refs = hold_and_add(&api, &held, "r-holder").await;
    assert_eq!(refs, vec!["r-holder"]);
    assert_eq!(held.arrivals.lock().unwrap().len(), 1, "still pending");
    assert!(held.claimed.lock().unwrap().is_empty());
}

/// Issue 44 item 3: an intent is input like any other. One whose reference (`x,y`) or holder
/// (`a b`) this tool would not have written is reported and removed, and never reaches the
/// record, so later decisions on the version are not stopped by a record the tool refuses.
#[tokio::test(start_paused = true)]
async fn an_invalid_handed_over_intent_never_reaches_the_record() {
    let api = gallery();
    let held = Scripted::new(&[(0, "x,y"), (0, "r-good"), (0, "r-bad-holder")]);
    {
        let mut arrivals = held.arrivals.lock().unwrap();
        for (_, i) in arrivals.iter_mut() {
            if i.reference == "r-bad-holder" {
                i.holder = Some("a b".into());
            }
            if i.reference == "r-good" {
                i.holder = Some("1B4F0B7E-0000-4000-8000-000000000001".into());
            }
        }
    }
    let refs = hold_and_add(&api, &held, "r-holder").await;
    assert_eq!(refs, vec!["r-good", "r-holder"]);
    let mut finished = held.finished.lock().unwrap().clone();
    finished.sort();
    assert_eq!(
        finished,
        vec!["intent-r-bad-holder", "intent-r-good", "intent-x,y"],
        "every intent is removed: the valid one applied, the others dropped"
    );
    // The record holds the valid one, its holder in the record's form, and is usable.
    let binding = crate::gallery::record::Binding::new(api.gallery(), DEFINITION, KEY);
    let loaded = crate::gallery::record::load(held.records.as_ref(), LOCK, &binding)
        .await
        .expect("a usable record");
    let rec = loaded.record.unwrap();
    assert_eq!(rec.references(), vec!["r-holder", "r-good"]);
    assert_eq!(
        rec.entry("r-good").unwrap().holder.as_deref(),
        Some("director:1b4f0b7e-0000-4000-8000-000000000001")
    );
}
