//! The tuning knobs: retries, timeouts, the lock wait and the group commit switch. Read from the
//! environment once, when the settings are resolved, each validated the same way: a value that
//! does not parse is refused with a configuration error (exit 2) naming the variable, never
//! ignored (an operator who set it meant something).

pub use crate::access::HTTP_TIMEOUT_ENV;
use std::time::Duration;

use super::ConfigError;

/// Environment variable: retries of one ARM request on throttling and transient failures.
pub const ARM_RETRIES_ENV: &str = "STEMCELL_GALLERY_ARM_RETRIES";
/// Environment variable: retries of one blob request on throttling and transient failures.
pub const BLOB_RETRIES_ENV: &str = "STEMCELL_GALLERY_BLOB_RETRIES";
/// The most retries a budget may ask for (each can wait up to the backoff cap).
pub const MAX_RETRIES: u32 = 20;
/// Environment variable: seconds a long-running operation (and replication) may take.
pub const OPERATION_TIMEOUT_ENV: &str = "STEMCELL_GALLERY_OPERATION_TIMEOUT";
/// Environment variable: seconds a writer waits for another process's lock (default 600).
pub const LOCK_WAIT_ENV: &str = "STEMCELL_GALLERY_LOCK_WAIT";
/// Environment variable: `0` (or `off`) turns off the group commit of reference writes (every
/// writer then takes the version's lock and writes itself, as before issue 15); for comparison.
pub const COALESCE_ENV: &str = "STEMCELL_GALLERY_COALESCE";

/// How long a writer waits for another host's lock on the same version (or upload) before
/// giving up, unless [`LOCK_WAIT_ENV`] says otherwise.
pub const LOCK_WAIT: Duration = Duration::from_secs(600);

/// The longest duration a knob accepts (a week).
const MAX_SECONDS: f64 = 7.0 * 24.0 * 3600.0;

/// The knobs' values; `None` means the adapter's own default.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    /// Retries of one ARM request ([`ARM_RETRIES_ENV`]).
    pub arm_retries: Option<u32>,
    /// Retries of one blob request ([`BLOB_RETRIES_ENV`]).
    pub blob_retries: Option<u32>,
    /// One HTTP request's timeout ([`HTTP_TIMEOUT_ENV`]).
    pub http_timeout: Option<Duration>,
    /// How long a long-running operation, and replication, may take ([`OPERATION_TIMEOUT_ENV`]).
    pub operation_timeout: Option<Duration>,
    /// How long a writer waits for another process's lock ([`LOCK_WAIT_ENV`], else [`LOCK_WAIT`]).
    pub lock_wait: Duration,
    /// Whether reference writes are coalesced ([`COALESCE_ENV`]; on unless `0`/`off`/`false`).
    pub coalesce: bool,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            arm_retries: None,
            blob_retries: None,
            http_timeout: None,
            operation_timeout: None,
            lock_wait: LOCK_WAIT,
            coalesce: true,
        }
    }
}

/// The knobs as the configuration file's `[tuning]` table gives them (a CPI run by bosh-cli or
/// a director gets no environment of ours, so its job renders them into the file). Seconds may
/// have decimals. The environment wins over the file.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileTuning {
    pub arm_retries: Option<u32>,
    pub blob_retries: Option<u32>,
    pub http_timeout: Option<f64>,
    pub operation_timeout: Option<f64>,
    pub lock_wait: Option<f64>,
    pub coalesce: Option<bool>,
}

impl Tuning {
    /// Every knob from `env`, validated.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Tuning, ConfigError> {
        Self::from_env_and_file(env, &FileTuning::default())
    }

    /// Every knob from `env`, else from the file's `[tuning]` table, validated the same way (an
    /// error names the variable or the `tuning.KEY` it came from).
    pub fn from_env_and_file(
        env: &dyn Fn(&str) -> Option<String>,
        file: &FileTuning,
    ) -> Result<Tuning, ConfigError> {
        let knob = |name: &'static str, key: &str, from_file: Option<String>| match env(name) {
            Some(v) => (name.to_string(), Some(v)),
            None => (format!("tuning.{key}"), from_file),
        };
        let read = |(label, value): (String, Option<String>)| (label, move |_: &str| value.clone());
        let (n, v) = read(knob(
            ARM_RETRIES_ENV,
            "arm_retries",
            file.arm_retries.map(|x| x.to_string()),
        ));
        let arm_retries = retries(&v, &n)?;
        let (n, v) = read(knob(
            BLOB_RETRIES_ENV,
            "blob_retries",
            file.blob_retries.map(|x| x.to_string()),
        ));
        let blob_retries = retries(&v, &n)?;
        let (n, v) = read(knob(
            HTTP_TIMEOUT_ENV,
            "http_timeout",
            file.http_timeout.map(|x| x.to_string()),
        ));
        let http_timeout = seconds(&v, &n)?;
        let (n, v) = read(knob(
            OPERATION_TIMEOUT_ENV,
            "operation_timeout",
            file.operation_timeout.map(|x| x.to_string()),
        ));
        let operation_timeout = seconds(&v, &n)?;
        let (n, v) = read(knob(
            LOCK_WAIT_ENV,
            "lock_wait",
            file.lock_wait.map(|x| x.to_string()),
        ));
        let lock_wait = seconds(&v, &n)?.unwrap_or(LOCK_WAIT);
        let (n, v) = read(knob(
            COALESCE_ENV,
            "coalesce",
            file.coalesce.map(|x| x.to_string()),
        ));
        let coalesce = switch(&v, &n)?.unwrap_or(true);
        Ok(Tuning {
            arm_retries,
            blob_retries,
            http_timeout,
            operation_timeout,
            lock_wait,
            coalesce,
        })
    }
}

/// A retry budget: a whole number from 0 to [`MAX_RETRIES`]; `None` when unset.
fn retries(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<u32>, ConfigError> {
    let Some(v) = env(name) else {
        return Ok(None);
    };
    match v.trim().parse::<u32>() {
        Ok(n) if n <= MAX_RETRIES => Ok(Some(n)),
        _ => Err(ConfigError::Invalid(format!(
            "{name}={v:?} is not a retry count: use a whole number from 0 to {MAX_RETRIES}, or unset it for the default"
        ))),
    }
}

/// A duration in seconds (decimals allowed), more than 0 and at most a week; `None` when unset.
fn seconds(
    env: &dyn Fn(&str) -> Option<String>,
    name: &str,
) -> Result<Option<Duration>, ConfigError> {
    let Some(v) = env(name) else {
        return Ok(None);
    };
    match v.trim().parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= MAX_SECONDS => {
            Ok(Some(Duration::from_secs_f64(s)))
        }
        _ => Err(ConfigError::Invalid(format!(
            "{name}={v:?} is not a number of seconds (e.g. 60 or 0.5), or unset it for the default"
        ))),
    }
}

/// On or off: `1`/`on`/`true`, `0`/`off`/`false`; `None` when unset.
fn switch(env: &dyn Fn(&str) -> Option<String>, name: &str) -> Result<Option<bool>, ConfigError> {
    let Some(v) = env(name) else {
        return Ok(None);
    };
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "on" | "true" => Ok(Some(true)),
        "0" | "off" | "false" => Ok(Some(false)),
        _ => Err(ConfigError::Invalid(format!(
            "{name}={v:?} is not on or off (1/0)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn unset_knobs_take_the_defaults() {
        assert_eq!(Tuning::from_env(&|_| None).unwrap(), Tuning::default());
    }

    #[test]
    fn every_knob_is_read_and_validated_once() {
        let t = Tuning::from_env(&env(&[
            (ARM_RETRIES_ENV, "3"),
            (BLOB_RETRIES_ENV, "0"),
            (HTTP_TIMEOUT_ENV, "0.5"),
            (OPERATION_TIMEOUT_ENV, "120"),
            (LOCK_WAIT_ENV, "7"),
            (COALESCE_ENV, "off"),
        ]))
        .unwrap();
        assert_eq!(t.arm_retries, Some(3));
        assert_eq!(t.blob_retries, Some(0));
        assert_eq!(t.http_timeout, Some(Duration::from_millis(500)));
        assert_eq!(t.operation_timeout, Some(Duration::from_secs(120)));
        assert_eq!(t.lock_wait, Duration::from_secs(7));
        assert!(!t.coalesce);
    }

    #[test]
    fn a_value_that_does_not_parse_is_a_config_error_naming_the_variable() {
        for (name, value) in [
            (ARM_RETRIES_ENV, "21"),
            (BLOB_RETRIES_ENV, "-1"),
            (HTTP_TIMEOUT_ENV, "0"),
            (OPERATION_TIMEOUT_ENV, "ten"),
            (LOCK_WAIT_ENV, "inf"),
            (COALESCE_ENV, "maybe"),
        ] {
            let e = Tuning::from_env(&env(&[(name, value)])).unwrap_err();
            assert!(e.to_string().contains(name), "{e}");
            assert_eq!(
                crate::error::Classified::class(&e).exit(),
                crate::error::Exit::Usage
            );
        }
    }

    /// A CPI under bosh gets no environment of ours: the knobs come from the file's
    /// `[tuning]` table, the environment still wins, and bad values name `tuning.KEY`.
    #[test]
    fn the_file_gives_the_knobs_and_the_environment_wins() {
        let file = FileTuning {
            arm_retries: Some(2),
            lock_wait: Some(90.0),
            coalesce: Some(false),
            ..FileTuning::default()
        };
        let t = Tuning::from_env_and_file(&|_| None, &file).unwrap();
        assert_eq!(t.arm_retries, Some(2));
        assert_eq!(t.lock_wait, Duration::from_secs(90));
        assert!(!t.coalesce);
        let t = Tuning::from_env_and_file(&env(&[(LOCK_WAIT_ENV, "5")]), &file).unwrap();
        assert_eq!(t.lock_wait, Duration::from_secs(5));
        let bad = FileTuning {
            lock_wait: Some(0.0),
            ..FileTuning::default()
        };
        let e = Tuning::from_env_and_file(&|_| None, &bad).unwrap_err();
        assert!(e.to_string().contains("tuning.lock_wait"), "{e}");
    }
}
