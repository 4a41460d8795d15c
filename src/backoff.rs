//! Ground floor, pure: the one backoff and the one `Retry-After` reader, for ARM requests, blob
//! requests, lock waits and the guarded writes (DESIGN.md §3; issue 29 item 4). A change of
//! retry pacing is a change here.

use std::time::Duration;

/// Exponential backoff: `base × 2^step`, capped at `max`, jittered into `[d/2, d]` so that
/// processes that failed together do not retry together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    pub const fn new(base: Duration, max: Duration) -> Self {
        Self { base, max }
    }

    /// The delay of step `step` (0-based) before jitter: `base × 2^step`, at most `max`.
    pub fn ceiling(&self, step: u32) -> Duration {
        self.base.saturating_mul(1u32 << step.min(16)).min(self.max)
    }

    /// The delay before retry `step` (0-based), jittered.
    pub fn delay(&self, step: u32) -> Duration {
        jitter(self.ceiling(step))
    }
}

/// `d` scaled by a random factor in `[0.5, 1.0]`.
pub fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::random_range(0.5..=1.0))
}

/// How long a server asked to wait, from its headers (`header(name)` reads one, any case):
/// `retry-after-ms` or `x-ms-retry-after-ms` in milliseconds (storage), else `Retry-After` in
/// delta-seconds. The HTTP-date form of `Retry-After` is not read (neither ARM nor storage sends
/// it here): the caller's backoff applies.
pub fn retry_after<'a>(header: impl Fn(&'static str) -> Option<&'a str>) -> Option<Duration> {
    let number = |name| header(name).and_then(|v| v.trim().parse::<u64>().ok());
    number("retry-after-ms")
        .or_else(|| number("x-ms-retry-after-ms"))
        .map(Duration::from_millis)
        .or_else(|| number("retry-after").map(Duration::from_secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_is_capped_and_jittered_into_its_upper_half() {
        let b = Backoff::new(Duration::from_millis(400), Duration::from_secs(30));
        assert_eq!(b.ceiling(0), Duration::from_millis(400));
        assert_eq!(b.ceiling(3), Duration::from_millis(3200));
        assert_eq!(b.ceiling(40), Duration::from_secs(30));
        for step in 0..8 {
            let d = b.delay(step);
            assert!(
                d >= b.ceiling(step) / 2 && d <= b.ceiling(step),
                "{step}: {d:?}"
            );
        }
    }

    #[test]
    fn retry_after_prefers_milliseconds_and_reads_seconds() {
        let headers = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &'static str| {
                pairs
                    .iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .map(|(_, v)| *v)
            }
        };
        assert_eq!(
            retry_after(headers(&[("Retry-After", "3"), ("retry-after-ms", "1500")])),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            retry_after(headers(&[("x-ms-retry-after-ms", "20")])),
            Some(Duration::from_millis(20))
        );
        assert_eq!(
            retry_after(headers(&[("Retry-After", " 7 ")])),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after(headers(&[("Retry-After", "Wed, 21 Oct 2026 07:28:00 GMT")])),
            None
        );
        assert_eq!(retry_after(headers(&[])), None);
    }
}
