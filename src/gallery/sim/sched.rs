//! The scheduler: the commands of a simulated run are futures the driver polls itself, one poll
//! at a time, in an order the seed chooses, all inside one current-thread tokio runtime whose
//! clock is paused (sleeps and backoffs end when the runtime has nothing else to do, at once and
//! always in the same order). Each command's future has its own waker, so the driver knows which
//! ones can make progress; a command is crashed by dropping its future after a chosen number of
//! polls (a process killed at that await point: its lock is free, what it sent stays sent).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures::FutureExt;

use super::probe::{OpId, Probe};

/// Wakes the driver (the one task the runtime knows).
#[derive(Default)]
pub struct DriverWake {
    waker: Mutex<Option<Waker>>,
}

impl DriverWake {
    fn wake(&self) {
        if let Some(w) = self
            .waker
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            w.wake_by_ref();
        }
    }

    fn register(&self, w: &Waker) {
        *self.waker.lock().unwrap_or_else(|p| p.into_inner()) = Some(w.clone());
    }
}

/// One command's waker: marks it runnable and wakes the driver.
struct TaskWake {
    woken: AtomicBool,
    driver: Arc<DriverWake>,
}

impl Wake for TaskWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.driver.wake();
    }
}

/// What one poll of a command gave.
pub enum Polled<T> {
    Pending,
    Done(T),
    /// The command panicked (a violation: every command ends with a result).
    Panicked(String),
}

/// A running command.
pub struct Task<T> {
    pub id: OpId,
    fut: Pin<Box<dyn Future<Output = std::thread::Result<T>>>>,
    wake: Arc<TaskWake>,
    waker: Waker,
    pub polls: u32,
    /// Dropped (crashed) once it has been polled this many times.
    pub crash_after: Option<u32>,
}

impl<T: 'static> Task<T> {
    pub fn new(
        id: OpId,
        fut: impl Future<Output = T> + 'static,
        driver: &Arc<DriverWake>,
        crash_after: Option<u32>,
    ) -> Self {
        let wake = Arc::new(TaskWake {
            woken: AtomicBool::new(true),
            driver: driver.clone(),
        });
        Task {
            id,
            fut: Box::pin(std::panic::AssertUnwindSafe(fut).catch_unwind()),
            waker: Waker::from(wake.clone()),
            wake,
            polls: 0,
            crash_after,
        }
    }

    /// Whether it can make progress (woken since its last poll).
    pub fn woken(&self) -> bool {
        self.wake.woken.load(Ordering::SeqCst)
    }

    /// Whether its crash point is reached: the driver drops it instead of polling it again.
    pub fn due_to_crash(&self) -> bool {
        self.crash_after.is_some_and(|k| self.polls >= k)
    }

    /// Poll it once, as operation `self.id` for the probe.
    pub fn poll(&mut self, probe: &Probe) -> Polled<T> {
        self.wake.woken.store(false, Ordering::SeqCst);
        self.polls += 1;
        probe.set_current(Some(self.id));
        let mut cx = Context::from_waker(&self.waker);
        let r = self.fut.as_mut().poll(&mut cx);
        probe.set_current(None);
        match r {
            Poll::Pending => Polled::Pending,
            Poll::Ready(Ok(v)) => Polled::Done(v),
            Poll::Ready(Err(panic)) => Polled::Panicked(
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic".into()),
            ),
        }
    }
}

/// How long (simulated) every command may stay blocked before the run is declared stuck.
pub const STUCK: Duration = Duration::from_secs(6 * 3600);

/// Wait until some command is runnable (the paused clock runs to the next timer meanwhile).
/// `false`: none became runnable within [`STUCK`] (a deadlock or a lost wake-up).
pub async fn wait_for_wake<T: 'static>(driver: &Arc<DriverWake>, tasks: &[Task<T>]) -> bool {
    let any = futures::future::poll_fn(|cx| {
        driver.register(cx.waker());
        if tasks.iter().any(Task::woken) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    });
    tokio::time::timeout(STUCK, any).await.is_ok()
}
