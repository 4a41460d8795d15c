//! Progress on waits (issue 31 item 2; the standard "long work shows progress, and says what it
//! is waiting for"): a spinner on a terminal, an INFO line every few seconds otherwise (a log, a
//! CPI response's log, a pipe). A wait shorter than [`QUIET_FOR`] shows nothing.
//!
//! The front end says once how this process reports ([`set_mode`]); library code only says
//! what it waits for ([`Wait`], [`while_waiting`]). Uploads have their own bar (bytes and rate:
//! `azure::blob::upload`).

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// How waits are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A spinner on stderr, which is a terminal.
    Terminal,
    /// An INFO line every [`REPORT_EVERY`] (the default: logs, the CPI, tests).
    Log,
}

static MODE: AtomicU8 = AtomicU8::new(0);

/// Set how this process shows its waits (the CLI: a spinner when stderr is a terminal and the
/// command is not `--quiet`; the CPI: lines into its response's log).
pub fn set_mode(mode: Mode) {
    MODE.store(
        match mode {
            Mode::Log => 0,
            Mode::Terminal => 1,
        },
        Ordering::Relaxed,
    );
}

fn mode() -> Mode {
    match MODE.load(Ordering::Relaxed) {
        1 => Mode::Terminal,
        _ => Mode::Log,
    }
}

/// A wait shorter than this shows nothing.
pub const QUIET_FOR: Duration = Duration::from_secs(2);
/// How often a line is logged while a wait goes on (after the first, at [`QUIET_FOR`]).
pub const REPORT_EVERY: Duration = Duration::from_secs(5);

/// One wait, reported as it goes: what is waited for, the state last seen, and for how long.
pub struct Wait {
    what: String,
    started: Instant,
    next_line: Instant,
    state: String,
    spinner: Option<indicatif::ProgressBar>,
}

impl Wait {
    /// A wait for `what` ("Azure to create gallery version …", "a token from …"), starting now.
    pub fn new(what: impl Into<String>) -> Self {
        let started = Instant::now();
        Wait {
            what: what.into(),
            started,
            next_line: started + QUIET_FOR,
            state: String::new(),
            spinner: None,
        }
    }

    /// How long it has waited.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Note what it is waiting on now (a provisioning state, a lock's holder; "" for nothing
    /// new) and report when due: the spinner's text at once, a log line every
    /// [`REPORT_EVERY`].
    pub fn note(&mut self, state: &str) {
        if !state.is_empty() {
            self.state = state.to_string();
        }
        if self.elapsed() < QUIET_FOR {
            return;
        }
        let line = self.line();
        match mode() {
            Mode::Terminal => {
                let spinner = self.spinner.get_or_insert_with(|| {
                    let s = indicatif::ProgressBar::new_spinner();
                    s.enable_steady_tick(Duration::from_millis(120));
                    s
                });
                spinner.set_message(line);
            }
            Mode::Log => {
                let now = Instant::now();
                if now >= self.next_line {
                    self.next_line = now + REPORT_EVERY;
                    tracing::info!("{line}");
                }
            }
        }
    }

    /// "still waiting for …: <state>, N s so far".
    fn line(&self) -> String {
        let secs = self.elapsed().as_secs();
        if self.state.is_empty() {
            format!("still waiting for {}: {secs} s so far", self.what)
        } else {
            format!(
                "still waiting for {}: {}, {secs} s so far",
                self.what, self.state
            )
        }
    }
}

impl Drop for Wait {
    fn drop(&mut self) {
        if let Some(s) = self.spinner.take() {
            s.finish_and_clear();
        }
    }
}

/// Run `fut`, reporting the wait for `what` while it takes longer than [`QUIET_FOR`]. Costs
/// one timer for a future that ends sooner.
pub async fn while_waiting<F: Future>(what: impl FnOnce() -> String, fut: F) -> F::Output {
    let began = Instant::now();
    tokio::pin!(fut);
    tokio::select! {
        out = &mut fut => return out,
        _ = tokio::time::sleep(QUIET_FOR) => {}
    }
    let mut wait = Wait::new(what());
    wait.started = began;
    wait.next_line = Instant::now();
    let tick = match mode() {
        Mode::Terminal => Duration::from_millis(250),
        Mode::Log => Duration::from_millis(500),
    };
    loop {
        wait.note("");
        tokio::select! {
            out = &mut fut => return out,
            _ = tokio::time::sleep(tick) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_says_what_it_waits_for_its_state_and_for_how_long() {
        let mut w = Wait::new("Azure to create gallery version d/1.0.0");
        assert_eq!(
            w.line(),
            "still waiting for Azure to create gallery version d/1.0.0: 0 s so far"
        );
        tokio::time::advance(Duration::from_secs(7)).await;
        w.note("Creating");
        assert_eq!(
            w.line(),
            "still waiting for Azure to create gallery version d/1.0.0: Creating, 7 s so far"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_wait_is_quiet_and_a_long_one_ends_with_its_future() {
        assert_eq!(while_waiting(|| "x".into(), async { 1 }).await, 1);
        let slow = async {
            tokio::time::sleep(Duration::from_secs(12)).await;
            2
        };
        assert_eq!(while_waiting(|| "x".into(), slow).await, 2);
    }
}
