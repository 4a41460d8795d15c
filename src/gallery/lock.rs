//! Cross-host serialisation of writes to one version. The real implementation is a blob lease on
//! a lock blob in the configured storage account (`azure::lock`); `LocalLocks` serialises tasks of
//! one process only and exists for unit tests with in-memory fakes.
//!
//! Beside each lock lives the version's reference record (`gallery::record`): every reference
//! this tool holds on the version, written conditionally by the lock's holder before any tag
//! write ([`Held::records`]; for the blob lease, the blobs `<lock blob>.refs` and
//! `<lock blob>.refs.copy`). It survives the process and the version: a re-run after a failed
//! re-create of a Failed version or a SIGKILL finds the references there.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub use super::blob_names::{
    gallery_lock_prefix, legacy_lock_of, legacy_version_lock_name, parse_version_lock_name,
    version_lock_name,
};
pub use super::error::{LockError, LockStoreError};

use super::content::Content;
use super::error::Result;
use super::record::{MemoryRecords, RecordStore};

#[async_trait::async_trait]
pub trait Locks: Send + Sync {
    /// Take the named lock, waiting a bounded time.
    async fn acquire(&self, name: &str) -> Result<Box<dyn Held>>;
    /// Group commit of reference writes, when these locks support it: a writer that cannot get
    /// the lock hands its reference to the holder instead of queueing one more slow write
    /// (see `guarded::acquire_or_hand_over`). `None`: every writer takes the lock itself.
    fn handover(&self) -> Option<&dyn Handover> {
        None
    }
    /// Who holds lock `name` right now, as its holder recorded it when it took the lock (for a
    /// waiter's log line); `None` when nobody holds it or the store cannot tell.
    async fn holder(&self, _name: &str) -> Option<LockHolder> {
        None
    }
    /// Where the versions' reference records live (read without the lock by `lookup`, `list`,
    /// cleanup and `references prune`); `None` without a store (no storage account).
    fn records(&self) -> Option<&dyn RecordStore> {
        None
    }
}

/// A lock's current holder, as the holder described itself when it took the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockHolder {
    /// Host and process (`host build-7, process 4242`), or why it is not known.
    pub who: String,
    /// How long it has held the lock, by the lock store's clock.
    pub held_for: Option<Duration>,
}

impl LockHolder {
    /// "host h, process 7 holds it (for 12s)".
    pub fn describe(&self) -> String {
        match self.held_for {
            Some(d) => format!("{} holds it (for {}s)", self.who, d.as_secs()),
            None => format!("{} holds it", self.who),
        }
    }
}

/// The waiter's side of group commit: intents posted next to a lock, for its holder to apply.
#[async_trait::async_trait]
pub trait Handover: Send + Sync {
    /// One attempt at the lock, without waiting: `None` while another process holds it.
    async fn try_acquire(&self, name: &str) -> Result<Option<Box<dyn Held>>>;
    /// Post an intent to add `ask.reference` (held by `ask.holder`) to the version of
    /// `ask.content` behind lock `name`; returns the intent's id.
    async fn post(&self, name: &str, ask: &Ask<'_>) -> Result<String>;
    /// Show that this waiter is alive (an intent not refreshed for a while is dropped as its
    /// writer's, who died) and whether it is still pending (or claimed): `false` when gone.
    async fn refresh(&self, id: &str, ask: &Ask<'_>) -> Result<bool>;
    /// Withdraw the intent (without the lock). Never races a holder that claimed it: that is
    /// `Withdrawal::Claimed`, and the waiter then waits for the holder's result.
    async fn withdraw(&self, id: &str) -> Result<Withdrawal>;
    /// How long a writer waits for the lock before giving up.
    fn wait(&self) -> Duration;
    /// Announce a writer about to add a reference to the version behind lock `name`, once it has
    /// read the version and before it asks for the lock (see [`Gather`]); returns the arrival's
    /// id for [`Handover::leave`].
    async fn arrive(&self, name: &str) -> Result<String>;
    /// Remove an arrival: its writer handed its reference over, took the lock, or went another
    /// way (best effort: a forgotten arrival ages out).
    async fn leave(&self, id: &str);
}

/// What withdrawing an intent found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Withdrawal {
    /// Withdrawn: no holder will apply it.
    Withdrawn,
    /// Already gone: applied and deleted by a holder, or dropped (its reference was being
    /// removed, or it outlived the lock wait).
    Gone,
    /// A holder claimed it and is writing it.
    Claimed,
}

/// How a holder gathers the references other writers hand over before its one write (group
/// commit; `guarded::merge_references`). Writers that reach a version at the same moment (a
/// pipeline uploading one stemcell to many directors) do not reach its lock at the same moment:
/// the first takes it a little ahead of the rest, and a write it sent at once would leave the
/// others a whole second write to wait for (minutes on Azure, where a tags-only write was recorded
/// at 2.5 min). So every writer about to add a reference to a version that is there
/// announces its arrival as soon as it has read it, before it asks for the lock
/// ([`Handover::arrive`]), and a holder that finds others arriving or handing over gathers: for
/// at least `first`, as long as announced writers have not handed over yet, and `quiet` longer
/// after each claim that finds new intents, never longer than `max` in all. A holder that finds
/// nobody arriving writes at once, so a lone writer pays nothing. The bounds are set against the
/// cost of one write: a burst saves every write after the first. Writers started together were
/// seen reaching the lock within 50 ms of each other on two loaded cores (bench/burst.sh).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gather {
    /// How long a holder gathers at least, once others arrive or hand over.
    pub first: Duration,
    /// How much longer it gathers after each claim that found new intents.
    pub quiet: Duration,
    /// The longest it gathers in all.
    pub max: Duration,
    /// The pause between two claims (each a blob listing and a lease per new intent).
    pub step: Duration,
}

/// The gathering of blob-lease holders (see [`Gather`]).
pub const GATHER: Gather = Gather {
    first: Duration::from_millis(150),
    quiet: Duration::from_millis(200),
    max: Duration::from_millis(1500),
    step: Duration::from_millis(50),
};

/// What one claim found: the intents it claimed, and how many writers announced their arrival
/// and have not handed over yet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Claimed {
    pub intents: Vec<Intent>,
    pub arriving: usize,
}

/// An intent the holder claimed: another writer's reference to add in the holder's write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    pub id: String,
    pub reference: String,
    /// Who holds the reference, when its writer said.
    pub holder: Option<String>,
    /// The content its writer wants the reference on (`None`: an intent of a build before
    /// issue 49, which only ever handed a reference to a version that was there).
    pub content: Option<Content>,
    /// Posted by a writer that found the version absent, for the create under way.
    pub to_create: bool,
    /// The life of the version (`record::life_of`) its writer read and hands the reference
    /// to; `None` for a create's intent, or one of a build before issue 49.
    pub life: Option<String>,
    /// How long ago its waiter last showed it was alive (refreshed it), when claimed.
    pub age: Duration,
}

/// A create takes only intents whose waiters showed they were alive this recently (a waiter
/// refreshes its intent every 2 s at most while it is not claimed): a writer that died must not
/// see its reference ride into a version made after it died, which it never asked for.
pub const CREATE_TAKES_WITHIN: Duration = Duration::from_secs(10);

impl Intent {
    /// Whether a holder's write of `carrying` may record this intent's reference. A reference
    /// is a director's promise that its VMs boot *this* image: one handed over for other
    /// content (another build of the same stemcell version, seen absent by both writers) is
    /// never put on this version; it stays pending, and its writer, once it holds the lock,
    /// decides for itself (a conflict). A create takes only intents posted for a create: a
    /// writer that read the version there handed its reference to *that* life of it, and, should
    /// it have died meanwhile, its reference must not ride into a version made again (a life
    /// starts with the references of those who asked for it, issue 44). An intent without
    /// content is only ever taken by a write to a version that is there, as builds before
    /// issue 49 did.
    pub fn fits(&self, carrying: &Carrying<'_>) -> bool {
        let Some(c) = &self.content else {
            return !carrying.create;
        };
        if !c.held_by(carrying.tags) || self.to_create != carrying.create {
            return false;
        }
        if carrying.create && self.age > CREATE_TAKES_WITHIN {
            return false;
        }
        // A reference handed to one life of the version is that life's only.
        match (&self.life, carrying.life) {
            (Some(mine), Some(its)) => super::record::same_instant(mine, its),
            (Some(_), None) => false,
            (None, _) => true,
        }
    }
}

/// What a writer hands over: its reference, who holds it, and the content it is for.
#[derive(Debug, Clone, Copy)]
pub struct Ask<'a> {
    pub reference: &'a str,
    pub holder: Option<&'a str>,
    /// The content the writer wants the reference on (the version it read, or the one it was
    /// about to create).
    pub content: &'a Content,
    /// The writer found the version absent: the reference is for the create under way (an
    /// intent of its own kind, which builds before issue 49 never take).
    pub to_create: bool,
    /// The life of the version the writer read (`record::life_of`), when it read one.
    pub life: Option<&'a str>,
}

/// The write a holder claims intents for: the tags the version has (a reference write) or is
/// created with (a create), which say its content.
#[derive(Debug, Clone, Copy)]
pub struct Carrying<'a> {
    pub tags: &'a std::collections::BTreeMap<String, String>,
    /// The write creates the version (the intents it takes ride in the create's PUT).
    pub create: bool,
    /// The life of the version written (`record::life_of`); `None` for a create.
    pub life: Option<&'a str>,
}

#[async_trait::async_trait]
pub trait Held: Send + Sync {
    /// Make sure the lock is still ours right now (the lease is renewed): call right before every
    /// write it guards. `Err(Error::Lock)` once another holder took it (a stalled process whose
    /// lease ran out): the caller must not write, and observes again under a new lock.
    async fn check(&self) -> Result<()>;
    /// The lock's name (`version_lock_name`): its version's record lives beside it.
    fn name(&self) -> &str;
    /// Where this lock's version keeps its reference record (`gallery::record`), written only
    /// under the lock, conditionally.
    fn records(&self) -> &dyn RecordStore;
    /// The references an earlier release carried from a replaced Failed version in its note
    /// `<lock blob>.carried` (empty when there is none). Read once, when the version is created
    /// again; the record holds them from then on.
    async fn legacy_carried(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
    /// Remove an earlier release's note, once its references are in the record.
    async fn clear_legacy_carried(&self) -> Result<()> {
        Ok(())
    }
    /// How this holder gathers handed-over references before a write ([`Gather`]); `None`:
    /// nobody hands references over to it, so it claims once and waits for nothing.
    fn gather(&self) -> Option<Gather> {
        None
    }
    /// Claim the intents pending on this lock that fit the write about to be made
    /// ([`Intent::fits`]: other writers' references for the content `carrying` holds; stale
    /// ones are dropped, those for other content left pending), and count the writers still
    /// arriving. Each intent stays claimed until [`Held::finish_intents`] or the claim runs
    /// out (the holder died).
    async fn claim_intents(&self, _carrying: &Carrying<'_>) -> Result<Claimed> {
        Ok(Claimed::default())
    }
    /// Delete claimed intents: applied (verified on the version) or dropped.
    async fn finish_intents(&self, _ids: &[String]) -> Result<()> {
        Ok(())
    }
    /// Delete the pending intents that would add `reference` (it is being removed).
    async fn drop_intents_of(&self, _reference: &str) -> Result<()> {
        Ok(())
    }
    /// Delete this process's own intent `id`, now that it holds the lock and writes itself.
    async fn discard_intent(&self, _id: &str) -> Result<()> {
        Ok(())
    }
    /// Release the lock (best effort: an unreleased lease simply expires).
    async fn release(self: Box<Self>);
}

/// In-process locks (tests only: not safe across processes or hosts), with records in memory.
#[derive(Default)]
pub struct LocalLocks {
    map: std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    records: Arc<MemoryRecords>,
}

impl LocalLocks {
    /// Locks of their own over the record store `records` (tests: two galleries, or two hosts,
    /// sharing one storage account).
    pub fn sharing(records: Arc<MemoryRecords>) -> Self {
        LocalLocks {
            map: Default::default(),
            records,
        }
    }

    /// The records these locks keep (tests: read or damage them).
    pub fn memory_records(&self) -> &Arc<MemoryRecords> {
        &self.records
    }
}

struct LocalHeld {
    _guard: tokio::sync::OwnedMutexGuard<()>,
    name: String,
    records: Arc<MemoryRecords>,
}

#[async_trait::async_trait]
impl Held for LocalHeld {
    async fn check(&self) -> Result<()> {
        Ok(())
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn records(&self) -> &dyn RecordStore {
        self.records.as_ref()
    }
    async fn release(self: Box<Self>) {}
}

#[async_trait::async_trait]
impl Locks for LocalLocks {
    async fn acquire(&self, name: &str) -> Result<Box<dyn Held>> {
        let m = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            map.entry(name.to_string()).or_default().clone()
        };
        Ok(Box::new(LocalHeld {
            _guard: m.lock_owned().await,
            name: name.to_string(),
            records: self.records.clone(),
        }))
    }

    fn records(&self) -> Option<&dyn RecordStore> {
        Some(self.records.as_ref())
    }
}

/// The upload lock of one content in one container, keyed by one digest of the stemcell's `image`
/// file: `uploads/sha1/<hex>.lock` or `uploads/sha256/<hex>.lock`.
///
/// "This upload" has one identity, the image in this container: the lock is keyed by it, and so
/// is what the holder may clean up (partial blobs recording that digest) and reuse (a complete
/// blob with the same `image_sha256`). A writer takes the lock of every digest it knows before
/// the upload, SHA-1 first: `seed` knows the SHA-1 `stemcell.MF` declares (or the SHA-256, when
/// the manifest declares that), a CPI's `create_stemcell` both after its digest pass, and builds
/// before issue 32 the SHA-256 alone. Two writers of one image therefore share a lock (but for a
/// `seed` knowing only the SHA-1 beside such an older build, or two manifests declaring the same
/// image by different algorithms; then the image may be uploaded twice, still one version): a
/// director publish and a create-env publish of the same stemcell (two image definitions) take
/// the same one, and the second waits, then reuses the first's blob, instead of deleting its
/// upload in flight as a leftover.
pub fn upload_lock_name(digest: &crate::stemcell::manifest::Checksum) -> String {
    let hex: String = digest
        .hex()
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("uploads/{}/{hex}.lock", digest.algorithm())
}

/// What a lock wait reports, for [`LoggedLocks`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitEvent {
    /// Still waiting for `lock` after `waited` (of at most `limit`).
    Waiting {
        lock: String,
        waited: Duration,
        limit: Duration,
        /// Who holds it, when the lock store can tell.
        holder: Option<LockHolder>,
    },
    /// Got `lock` after waiting `waited`.
    Acquired { lock: String, waited: Duration },
}

impl WaitEvent {
    /// One log line.
    pub fn describe(&self) -> String {
        match self {
            WaitEvent::Waiting {
                lock,
                waited,
                limit,
                holder,
            } => format!(
                "waiting for the lock {lock}: {} while it writes the same gallery version; waited {}s so far, giving up after {}s (STEMCELL_GALLERY_LOCK_WAIT, config lock_wait)",
                holder
                    .as_ref()
                    .map(LockHolder::describe)
                    .unwrap_or_else(|| "another process (or host) holds it".into()),
                waited.as_secs(),
                limit.as_secs()
            ),
            WaitEvent::Acquired { lock, waited } => format!(
                "got the lock {lock} after waiting {:.1}s for its other holder",
                waited.as_secs_f64()
            ),
        }
    }
}

/// Locks whose waits are reported, so an operator sees why a command stands still: a first line
/// after [`LoggedLocks::FIRST`] of waiting, then one every [`LoggedLocks::EVERY`], and one when
/// the lock is finally taken (all at INFO). A lock taken at once says nothing.
pub struct LoggedLocks {
    inner: Arc<dyn Locks>,
    limit: Duration,
    report: Arc<dyn Fn(WaitEvent) + Send + Sync>,
}

impl LoggedLocks {
    pub const FIRST: Duration = Duration::from_secs(2);
    /// A line every few seconds (issue 31 item 2), as every other wait.
    pub const EVERY: Duration = crate::progress::REPORT_EVERY;

    /// `limit`: the lock wait configured for `inner` (for the message).
    pub fn new(inner: Arc<dyn Locks>, limit: Duration) -> Self {
        Self::with_report(
            inner,
            limit,
            Arc::new(|e: WaitEvent| tracing::info!("{}", e.describe())),
        )
    }

    /// As [`LoggedLocks::new`], reporting to `report` (tests).
    pub fn with_report(
        inner: Arc<dyn Locks>,
        limit: Duration,
        report: Arc<dyn Fn(WaitEvent) + Send + Sync>,
    ) -> Self {
        LoggedLocks {
            inner,
            limit,
            report,
        }
    }
}

#[async_trait::async_trait]
impl Locks for LoggedLocks {
    async fn acquire(&self, name: &str) -> Result<Box<dyn Held>> {
        let started = tokio::time::Instant::now();
        let acquire = self.inner.acquire(name);
        tokio::pin!(acquire);
        let mut next = Self::FIRST;
        let mut reported = false;
        loop {
            tokio::select! {
                r = &mut acquire => {
                    if reported && r.is_ok() {
                        (self.report)(WaitEvent::Acquired { lock: name.to_string(), waited: started.elapsed() });
                    }
                    return r;
                }
                _ = tokio::time::sleep_until(started + next) => {
                    reported = true;
                    let holder = self.inner.holder(name).await;
                    (self.report)(WaitEvent::Waiting { lock: name.to_string(), waited: started.elapsed(), limit: self.limit, holder });
                    next += Self::EVERY;
                }
            }
        }
    }

    fn handover(&self) -> Option<&dyn Handover> {
        self.inner.handover()
    }

    async fn holder(&self, name: &str) -> Option<LockHolder> {
        self.inner.holder(name).await
    }

    fn records(&self) -> Option<&dyn RecordStore> {
        self.inner.records()
    }
}

#[cfg(test)]
mod logged_tests {
    use super::*;
    use std::sync::Mutex;

    #[tokio::test(start_paused = true)]
    async fn a_lock_wait_is_reported_while_it_lasts_and_when_it_ends() {
        let inner: Arc<dyn Locks> = Arc::new(LocalLocks::default());
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let locks = Arc::new(LoggedLocks::with_report(
            inner.clone(),
            Duration::from_secs(600),
            Arc::new(move |e| sink.lock().unwrap().push(e)),
        ));
        // Taken at once: nothing said.
        let held = locks.acquire("v").await.unwrap();
        assert!(events.lock().unwrap().is_empty());
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move { locks.acquire("v").await.map(|_| ()) })
        };
        tokio::time::sleep(Duration::from_secs(65)).await;
        held.release().await;
        waiter.await.unwrap().unwrap();
        let got = events.lock().unwrap().clone();
        let waits: Vec<u64> = got
            .iter()
            .filter_map(|e| match e {
                WaitEvent::Waiting { waited, .. } => Some(waited.as_secs()),
                _ => None,
            })
            .collect();
        assert_eq!(
            waits,
            (0..13).map(|i| 2 + 5 * i).collect::<Vec<u64>>(),
            "a line every 5 s: {got:?}"
        );
        match got.last() {
            Some(WaitEvent::Acquired { lock, waited }) => {
                assert_eq!(lock, "v");
                assert_eq!(waited.as_secs(), 65);
            }
            other => panic!("{other:?}"),
        }
        assert!(got[0].describe().contains("giving up after 600s"));
        assert!(
            got[0]
                .describe()
                .contains("another process (or host) holds it"),
            "a store that cannot tell says so: {got:?}"
        );
    }

    /// Locks whose holder is known (as the blob lease records it).
    struct Named(Arc<dyn Locks>);

    #[async_trait::async_trait]
    impl Locks for Named {
        async fn acquire(&self, name: &str) -> Result<Box<dyn Held>> {
            self.0.acquire(name).await
        }
        async fn holder(&self, _name: &str) -> Option<LockHolder> {
            Some(LockHolder {
                who: "host build-7, process 4242".into(),
                held_for: Some(Duration::from_secs(12)),
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_wait_names_the_holder_and_how_long_it_has_held_the_lock() {
        let inner: Arc<dyn Locks> = Arc::new(Named(Arc::new(LocalLocks::default())));
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let locks = Arc::new(LoggedLocks::with_report(
            inner,
            Duration::from_secs(600),
            Arc::new(move |e| sink.lock().unwrap().push(e)),
        ));
        let held = locks.acquire("v").await.unwrap();
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move { locks.acquire("v").await.map(|_| ()) })
        };
        tokio::time::sleep(Duration::from_secs(3)).await;
        held.release().await;
        waiter.await.unwrap().unwrap();
        let line = events.lock().unwrap()[0].describe();
        assert!(
            line.contains("host build-7, process 4242 holds it (for 12s)"),
            "{line}"
        );
    }
}

#[cfg(test)]
mod fits_tests {
    use super::*;
    use std::collections::BTreeMap;

    fn intent(content: Option<Content>, to_create: bool, life: Option<&str>, age_s: u64) -> Intent {
        Intent {
            id: "i".into(),
            reference: "bosh-stemcell-1".into(),
            holder: None,
            content,
            to_create,
            life: life.map(str::to_string),
            age: Duration::from_secs(age_s),
        }
    }

    fn tags(sha: &str) -> BTreeMap<String, String> {
        BTreeMap::from([("image_sha256".to_string(), sha.to_string())])
    }

    const LIFE: &str = "2026-12-07T03:00:00Z";

    /// Issue 49: a reference is a director's promise that its VMs boot this image. Two builds of
    /// one stemcell version both see it absent: the one creating it never takes the other's.
    #[test]
    fn a_create_takes_only_fresh_hand_overs_for_its_own_content() {
        let ours = tags("aa");
        let create = Carrying {
            tags: &ours,
            create: true,
            life: None,
        };
        assert!(intent(Some(Content::image("aa")), true, None, 1).fits(&create));
        assert!(
            !intent(Some(Content::image("bb")), true, None, 1).fits(&create),
            "another build of the same version"
        );
        assert!(
            !intent(Some(Content::vhd("aa")), true, None, 1).fits(&create),
            "a digest of another kind"
        );
        assert!(
            !intent(Some(Content::image("aa")), false, Some(LIFE), 1).fits(&create),
            "handed to a life that was there, not to a create"
        );
        assert!(
            !intent(Some(Content::image("aa")), true, None, 11).fits(&create),
            "its waiter has not shown it is alive for 11 s"
        );
        assert!(
            !intent(None, false, None, 1).fits(&create),
            "an intent of an earlier build names no content"
        );
    }

    /// A reference write takes hand-overs to the life it writes, for its content; an earlier
    /// build's intents (no content, no life) as before.
    #[test]
    fn a_reference_write_takes_hand_overs_to_its_life_and_content() {
        let ours = tags("aa");
        let write = Carrying {
            tags: &ours,
            create: false,
            life: Some(LIFE),
        };
        assert!(intent(Some(Content::image("aa")), false, Some(LIFE), 30).fits(&write));
        assert!(
            intent(
                Some(Content::image("aa")),
                false,
                Some("2026-12-07T03:00:00.000+00:00"),
                1
            )
            .fits(&write),
            "the same instant written another way"
        );
        assert!(
            !intent(
                Some(Content::image("aa")),
                false,
                Some("2026-12-07T04:00:00Z"),
                1
            )
            .fits(&write),
            "handed to an earlier life of the version"
        );
        assert!(!intent(Some(Content::image("bb")), false, Some(LIFE), 1).fits(&write));
        assert!(
            !intent(Some(Content::image("aa")), true, None, 1).fits(&write),
            "a hand-over to a create is a create's only"
        );
        assert!(
            intent(None, false, None, 1).fits(&write),
            "an earlier build's"
        );
    }
}
