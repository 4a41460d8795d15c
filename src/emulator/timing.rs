//! How long the emulator takes: instant by default (tests stay fast), or Azure's recorded
//! durations (`--timing azure`), all divided by a time scale N (rates multiplied by N) so a suite
//! can run against Azure's shape in seconds.
//!
//! Figures, from REFERENCE.md "Azure as recorded" ("Durations", "Write status and LRO headers",
//! "After a DELETE completes", "Azure Storage targets"):
//! - gallery and image definition writes ~0.1 s (recorded SDK sessions);
//! - a version create: 7.5 min, the only recorded create (a version from a 200 GB snapshot). A
//!   stemcell's VHD is smaller, but the create's operation ends only when replication to every
//!   target region has finished, which takes minutes for any image; the recorded figure is the one
//!   we have, and a longer create is never kinder than Azure;
//! - a tags-only or no-op PATCH/PUT of an existing version 2.5 min; a version DELETE 1.5 min;
//! - `Retry-After: 60` on version writes and their polls;
//! - after a child's DELETE completes, deleting its parent is refused for ~10–20 s: we take 20 s
//!   (the upper end; never kinder);
//! - a page blob takes up to 60 MiB/s and 500 requests/s; beyond them 503 `ServerBusy`.
//!
//! `Retry-After` stays whole seconds, as Azure sends it, and at least 1 under a profile: Azure
//! never sends 0, and Microsoft's Python SDK reads 0 as "no Retry-After" and falls back to its
//! own 30 s polling interval (the tool itself treats 0 as "poll again soon").

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which durations the emulator imposes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// Operations complete as fast as clients poll (today's behaviour, the default).
    #[default]
    Instant,
    /// Azure's recorded durations, divided by the time scale.
    Azure,
}

impl std::str::FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "instant" => Ok(Profile::Instant),
            "azure" => Ok(Profile::Azure),
            other => Err(format!(
                "unknown emulator timing {other:?}: expected instant or azure"
            )),
        }
    }
}

impl std::fmt::Display for Profile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Profile::Instant => "instant",
            Profile::Azure => "azure",
        })
    }
}

/// The delete-lag window under the default (instant) timing: short, so tests stay fast, but
/// present, so a tool that deletes a parent right after its child meets it as on Azure.
pub const DEFAULT_DELETE_LAG_MS: u64 = 300;

/// The durations and rates in force (already divided / multiplied by the time scale). Set at
/// start (`--timing`, `--time-scale`) and replaced by `PUT /_emulator/timing`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timing {
    /// The profile these figures came from (informational once fields are overridden).
    pub profile: Profile,
    /// N: durations were divided, rates multiplied by it.
    pub time_scale: f64,
    /// A version PUT or PATCH (create or update) takes at least this long, however often it is
    /// polled: the original admin knob (bench/coalesce.sh, reliability tests); combined with the
    /// two below by taking the longer.
    pub version_write_ms: u64,
    /// A version create (PUT of a new version) takes this long.
    pub version_create_ms: u64,
    /// An update (PUT/PATCH of an existing version, e.g. tags only) takes this long.
    pub version_update_ms: u64,
    /// A version DELETE takes this long.
    pub version_delete_ms: u64,
    /// A gallery or image definition write (PUT or DELETE) takes this long.
    pub gallery_write_ms: u64,
    /// After a child's DELETE completes, its parent's DELETE is refused this long.
    pub delete_lag_ms: u64,
    /// `Retry-After` seconds on version writes and their polls; 0: the `Options` value.
    pub version_retry_after_s: u32,
    /// Bytes per second one page blob takes (Put Page bodies); 0: unlimited.
    pub page_blob_bytes_per_s: u64,
    /// Requests per second one page blob takes (Put Page, update or clear); 0: unlimited.
    pub page_blob_requests_per_s: u64,
    /// How far ahead one page blob queues work before it answers 503 ServerBusy (the targets
    /// are per second: one second's worth, scaled).
    pub page_blob_backlog_ms: u64,
    /// An operation nobody polls completes at its duration (Azure does not wait for clients);
    /// false: also only after `Options::complete_after` (the instant profile's rule).
    pub complete_unpolled: bool,
}

impl Default for Timing {
    fn default() -> Self {
        Timing::instant()
    }
}

const MIB: f64 = 1024.0 * 1024.0;

impl Timing {
    /// Today's behaviour: no minimum durations, no throttling, a short delete lag.
    pub fn instant() -> Timing {
        Timing {
            profile: Profile::Instant,
            time_scale: 1.0,
            version_write_ms: 0,
            version_create_ms: 0,
            version_update_ms: 0,
            version_delete_ms: 0,
            gallery_write_ms: 0,
            delete_lag_ms: DEFAULT_DELETE_LAG_MS,
            version_retry_after_s: 0,
            page_blob_bytes_per_s: 0,
            page_blob_requests_per_s: 0,
            page_blob_backlog_ms: 0,
            complete_unpolled: false,
        }
    }

    /// Azure's recorded durations divided by `scale` (rates multiplied by it).
    pub fn azure(scale: f64) -> Result<Timing, String> {
        if !(scale.is_finite() && scale > 0.0) {
            return Err(format!(
                "the time scale must be a positive number, not {scale}"
            ));
        }
        let ms = |secs: f64| (secs * 1000.0 / scale).round() as u64;
        Ok(Timing {
            profile: Profile::Azure,
            time_scale: scale,
            version_write_ms: 0,
            version_create_ms: ms(450.0),
            version_update_ms: ms(150.0),
            version_delete_ms: ms(90.0),
            gallery_write_ms: ms(0.1),
            delete_lag_ms: ms(20.0),
            version_retry_after_s: ((60.0 / scale).round() as u32).max(1),
            page_blob_bytes_per_s: (60.0 * MIB * scale).round() as u64,
            page_blob_requests_per_s: (500.0 * scale).round().max(1.0) as u64,
            page_blob_backlog_ms: ms(1.0).max(1),
            complete_unpolled: true,
        })
    }

    /// The profile's figures.
    pub fn of(profile: Profile, scale: f64) -> Result<Timing, String> {
        match profile {
            Profile::Instant if scale == 1.0 => Ok(Timing::instant()),
            Profile::Instant => Err("--time-scale applies to --timing azure only".into()),
            Profile::Azure => Timing::azure(scale),
        }
    }

    /// A `PUT /_emulator/timing` document: `{"profile", "time_scale"}` picks the base (default:
    /// instant), any other field overrides it (`{"version_write_ms": N}` alone keeps working).
    pub fn from_document(doc: &Value) -> Result<Timing, String> {
        let Some(obj) = doc.as_object() else {
            return Err("expected a JSON object".into());
        };
        let mut obj = obj.clone();
        let profile = match obj.remove("profile") {
            None => Profile::Instant,
            Some(v) => serde_json::from_value(v).map_err(|e| format!("profile: {e}"))?,
        };
        let scale = match obj.remove("time_scale") {
            None => 1.0,
            Some(v) => v
                .as_f64()
                .ok_or_else(|| "time_scale must be a number".to_string())?,
        };
        let base = Timing::of(profile, scale)?;
        let mut merged = serde_json::to_value(base).map_err(|e| e.to_string())?;
        for (k, v) in obj {
            merged[k] = v;
        }
        serde_json::from_value(merged).map_err(|e| e.to_string())
    }

    /// Minimum duration of a version create.
    pub fn version_create(&self) -> u64 {
        self.version_create_ms.max(self.version_write_ms)
    }

    /// Minimum duration of a version update.
    pub fn version_update(&self) -> u64 {
        self.version_update_ms.max(self.version_write_ms)
    }

    /// Whether page blobs are throttled.
    pub fn throttles(&self) -> bool {
        self.page_blob_bytes_per_s > 0 || self.page_blob_requests_per_s > 0
    }
}

/// What one page blob's throttle decided for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Serve it after this many milliseconds (its turn, at the blob's rate).
    After(u64),
    /// Refuse it: 503 ServerBusy, over the bandwidth target.
    OverIngress,
    /// Refuse it: 503 ServerBusy, over the request-rate target.
    OverOperations,
}

/// One page blob's pacing: when it is free to take the next request (ms on a monotonic clock).
/// A request occupies the blob for its bytes at the bandwidth target or one request slot,
/// whichever is longer; a request that would start more than the backlog ahead is refused.
pub fn admit(timing: &Timing, next_free_ms: &mut f64, now_ms: f64, bytes: u64) -> Admit {
    let by_bytes = if timing.page_blob_bytes_per_s > 0 {
        bytes as f64 * 1000.0 / timing.page_blob_bytes_per_s as f64
    } else {
        0.0
    };
    let by_requests = if timing.page_blob_requests_per_s > 0 {
        1000.0 / timing.page_blob_requests_per_s as f64
    } else {
        0.0
    };
    let start = next_free_ms.max(now_ms);
    if start - now_ms > timing.page_blob_backlog_ms as f64 {
        return if by_bytes >= by_requests {
            Admit::OverIngress
        } else {
            Admit::OverOperations
        };
    }
    let done = start + by_bytes.max(by_requests);
    *next_free_ms = done;
    Admit::After((done - now_ms).max(0.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_azure_profile_divides_durations_and_multiplies_rates() {
        let t = Timing::azure(100.0).unwrap();
        assert_eq!(t.version_create_ms, 4_500);
        assert_eq!(t.version_update_ms, 1_500);
        assert_eq!(t.version_delete_ms, 900);
        assert_eq!(t.gallery_write_ms, 1);
        assert_eq!(t.delete_lag_ms, 200);
        assert_eq!(
            t.version_retry_after_s, 1,
            "60 s / 100 rounds to 1, never 0"
        );
        assert_eq!(t.page_blob_bytes_per_s, 6000 * 1024 * 1024);
        assert_eq!(t.page_blob_requests_per_s, 50_000);
        let real = Timing::azure(1.0).unwrap();
        assert_eq!(real.version_retry_after_s, 60);
        assert_eq!(real.version_create_ms, 450_000);
        assert!(Timing::azure(0.0).is_err());
        assert!(Timing::of(Profile::Instant, 2.0).is_err());
    }

    #[test]
    fn the_admin_document_keeps_the_old_knob_and_takes_a_profile() {
        let t = Timing::from_document(&serde_json::json!({"version_write_ms": 600})).unwrap();
        assert_eq!(t.version_create(), 600);
        assert_eq!(t.version_update(), 600);
        assert_eq!(t.profile, Profile::Instant);
        let t = Timing::from_document(
            &serde_json::json!({"profile": "azure", "time_scale": 10, "delete_lag_ms": 5}),
        )
        .unwrap();
        assert_eq!(t.version_create_ms, 45_000);
        assert_eq!(t.delete_lag_ms, 5);
        assert!(Timing::from_document(&serde_json::json!({"version_ms": 1})).is_err());
    }

    #[test]
    fn a_page_blob_is_paced_at_its_target_and_refuses_beyond_a_second_of_backlog() {
        let t = Timing::azure(1.0).unwrap();
        let mut free = 0.0;
        let four_mib = 4 * 1024 * 1024;
        // 60 MiB/s: a 4 MiB write takes 1000/15 ms.
        assert_eq!(admit(&t, &mut free, 0.0, four_mib), Admit::After(67));
        // Fifteen of them queue within the second; more are refused.
        for _ in 0..14 {
            assert!(matches!(
                admit(&t, &mut free, 0.0, four_mib),
                Admit::After(_)
            ));
        }
        assert!(matches!(
            admit(&t, &mut free, 0.0, four_mib),
            Admit::After(_)
        ));
        assert_eq!(admit(&t, &mut free, 0.0, four_mib), Admit::OverIngress);
        // Tiny writes are bounded by 500 requests/s instead.
        let mut free = 0.0;
        for _ in 0..501 {
            assert!(matches!(admit(&t, &mut free, 0.0, 512), Admit::After(_)));
        }
        assert_eq!(admit(&t, &mut free, 0.0, 512), Admit::OverOperations);
    }
}
