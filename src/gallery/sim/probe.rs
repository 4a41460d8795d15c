//! What the simulator sees of the code under test while it runs: which operation is being
//! polled, every call it makes to ARM and to blob storage (each a point where the scheduler may
//! switch to another operation), and the writes that matter to the ledger (tag writes, creates,
//! deletes), as events the driver checks after each poll. Also the armed and pending late tag
//! writes (see `api`).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use crate::gallery::ImageVersion;

/// An operation of the simulated run (a command), numbered in the order it started.
pub type OpId = u32;

/// One version of one gallery: (gallery index, definition, version key).
pub type VersionAt = (usize, String, String);

/// A write to a version the checker weighs.
#[derive(Debug, Clone)]
pub enum Event {
    /// Tags replaced. `op`: the tool's operation that sent it (`None`: a late write landing, or
    /// the simulated CPI). `blind`: another write reached the version since that operation last
    /// read it (gallery versions have no ETag: a write over one it did not see is the window
    /// docs/references.md accepts). `late`: a held write landing after its writer went on.
    TagWrite {
        at: VersionAt,
        op: Option<OpId>,
        before: BTreeMap<String, String>,
        after: BTreeMap<String, String>,
        blind: bool,
        late: bool,
    },
    /// The version was deleted by a tool operation (the version as it was). `blind`: someone
    /// wrote it after that operation last read it; `listed`: that operation saw the write only
    /// in a listing, made after the GET it decided on.
    Deleted {
        at: VersionAt,
        op: OpId,
        before: Box<ImageVersion>,
        blind: bool,
        listed: bool,
        /// The operation last read the version in a life that ended before its DELETE landed
        /// (deleted and made again by someone else meanwhile).
        crossed: bool,
    },
    /// A DELETE of a tool operation found the version already gone (someone else deleted it
    /// after the operation's last look): Azure answers it as a success all the same.
    DeletedNothing { at: VersionAt, op: OpId },
    /// The version was created by a tool operation (it was absent).
    Created { at: VersionAt, op: OpId },
    /// A soft-deleted version was restored by a tool operation.
    Restored { at: VersionAt, op: OpId },
    /// A tool tag write built on a read of an earlier life of the version landed on the life
    /// there now (no conditional write on versions), with these references.
    CrossedLives {
        at: VersionAt,
        op: OpId,
        refs: Vec<String>,
    },
}

/// How a late tag write arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LateKind {
    /// The writer's request times out (504) and the service applies the PATCH later.
    LostAnswer,
    /// Applied at once, and the same PATCH applied again later (a duplicate the service
    /// delivered late, as a retried request can be).
    Duplicate,
}

/// A tag write held back, to land later.
#[derive(Debug, Clone)]
pub struct LateWrite {
    pub at: VersionAt,
    pub tags: BTreeMap<String, String>,
    /// The life of the version it was sent to (it lands only on that life).
    pub born: u64,
    pub kind: LateKind,
    pub op: Option<OpId>,
    /// Its writer built it on a read of an earlier life of the version (`Event::CrossedLives`).
    pub crossed: bool,
}

#[derive(Default)]
pub struct ProbeState {
    /// The operation being polled now.
    pub current: Option<OpId>,
    /// Reads by the checker: no scheduling point, nothing counted.
    pub quiet: bool,
    /// Writes per version (tool, CPI, outside), for `Event::TagWrite::blind`.
    pub epoch: BTreeMap<VersionAt, u64>,
    /// The epoch each operation last read each version at.
    pub read_at: BTreeMap<(OpId, VersionAt), u64>,
    /// The epoch each operation last read each version at by itself (a GET), not in a listing.
    pub got_at: BTreeMap<(OpId, VersionAt), u64>,
    /// Creations per version: a late write lands only on the life it was sent to.
    pub born: BTreeMap<VersionAt, u64>,
    /// The life (creations) each operation last read each version in.
    pub read_life: BTreeMap<(OpId, VersionAt), u64>,
    /// Late writes armed per gallery: the next tool tag write there is late.
    pub armed: BTreeMap<usize, Vec<LateKind>>,
    pub held: Vec<LateWrite>,
    pub events: Vec<Event>,
    /// Calls by the code under test, by `service:method`.
    pub calls: BTreeMap<String, u64>,
    /// Versions a DELETE of the tool is under way on (Azure shows them `Deleting`: a DELETE
    /// by anyone else meanwhile lands on a version that is already going, the tool's).
    pub deleting: BTreeMap<VersionAt, u32>,
}

/// Shared by the adapters, the locks and the driver of one simulated run.
#[derive(Default)]
pub struct Probe {
    st: Mutex<ProbeState>,
}

impl Probe {
    pub fn new() -> Arc<Self> {
        Arc::new(Probe::default())
    }

    pub fn lock(&self) -> MutexGuard<'_, ProbeState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn quiet(&self) -> bool {
        self.lock().quiet
    }

    pub fn set_quiet(&self, quiet: bool) {
        self.lock().quiet = quiet;
    }

    pub fn set_current(&self, op: Option<OpId>) {
        self.lock().current = op;
    }

    pub fn current(&self) -> Option<OpId> {
        self.lock().current
    }

    /// Count a call of the code under test (not the checker's).
    pub fn count(&self, what: &str) {
        let mut st = self.lock();
        if !st.quiet {
            *st.calls.entry(what.to_string()).or_default() += 1;
        }
    }

    /// A write reached `at` (anyone's).
    pub fn touched(&self, at: &VersionAt) {
        *self.lock().epoch.entry(at.clone()).or_default() += 1;
    }

    /// `at` was created (a new life, unless the model says the tool carried it).
    pub fn born(&self, at: &VersionAt) {
        let mut st = self.lock();
        *st.born.entry(at.clone()).or_default() += 1;
        *st.epoch.entry(at.clone()).or_default() += 1;
    }

    pub fn life(&self, at: &VersionAt) -> u64 {
        self.lock().born.get(at).copied().unwrap_or(0)
    }

    /// The current operation read `at` (`listed`: in a listing of its definition).
    pub fn read(&self, at: &VersionAt, listed: bool) {
        let mut st = self.lock();
        if let Some(op) = st.current {
            let e = st.epoch.get(at).copied().unwrap_or(0);
            st.read_at.insert((op, at.clone()), e);
            let life = st.born.get(at).copied().unwrap_or(0);
            st.read_life.insert((op, at.clone()), life);
            if !listed {
                st.got_at.insert((op, at.clone()), e);
            }
        }
    }

    /// Whether the current operation last read `at` in a life that has ended since (the
    /// version was made again after that read).
    pub fn read_earlier_life(&self, at: &VersionAt) -> bool {
        let st = self.lock();
        let Some(op) = st.current else {
            return false;
        };
        let now = st.born.get(at).copied().unwrap_or(0);
        st.read_life
            .get(&(op, at.clone()))
            .is_some_and(|&l| l != now)
    }

    /// How many writes reached `at` so far.
    pub fn epoch(&self, at: &VersionAt) -> u64 {
        self.lock().epoch.get(at).copied().unwrap_or(0)
    }

    /// Whether the current operation's last GET of `at` is older than its last listing of it
    /// (it has seen, in a listing only, a write its GET did not show).
    pub fn seen_only_listed(&self, at: &VersionAt) -> bool {
        let st = self.lock();
        let Some(op) = st.current else {
            return false;
        };
        let key = (op, at.clone());
        st.got_at.get(&key) != st.read_at.get(&key)
    }

    /// Whether a write by the current operation to `at` would be blind (see `Event::TagWrite`).
    pub fn blind(&self, at: &VersionAt) -> bool {
        let st = self.lock();
        let Some(op) = st.current else {
            return false;
        };
        let now = st.epoch.get(at).copied().unwrap_or(0);
        st.read_at.get(&(op, at.clone())).copied() != Some(now)
    }

    pub fn push(&self, e: Event) {
        self.lock().events.push(e);
    }

    pub fn take_events(&self) -> Vec<Event> {
        std::mem::take(&mut self.lock().events)
    }

    /// The next tool tag write in gallery `g` is late, of `kind`.
    pub fn arm_late(&self, g: usize, kind: LateKind) {
        self.lock().armed.entry(g).or_default().push(kind);
    }

    /// Take an armed late write for gallery `g`, if any.
    pub fn take_armed(&self, g: usize) -> Option<LateKind> {
        let mut st = self.lock();
        let list = st.armed.get_mut(&g)?;
        if list.is_empty() {
            None
        } else {
            Some(list.remove(0))
        }
    }

    pub fn hold(&self, w: LateWrite) {
        self.lock().held.push(w);
    }

    /// Take the held write `i` (in the order they were held).
    pub fn take_held(&self, i: usize) -> Option<LateWrite> {
        let mut st = self.lock();
        (i < st.held.len()).then(|| st.held.remove(i))
    }

    pub fn held_count(&self) -> usize {
        self.lock().held.len()
    }

    pub fn disarm_all(&self) {
        self.lock().armed.clear();
    }
}

/// A scheduling point: the first poll returns `Pending` (waking itself at once), so the
/// scheduler may poll another operation before this one goes on. None for the checker.
pub fn yield_point(probe: &Probe) -> YieldPoint {
    YieldPoint {
        done: probe.quiet(),
    }
}

pub struct YieldPoint {
    done: bool,
}

impl Future for YieldPoint {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.done {
            return Poll::Ready(());
        }
        self.done = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
