//! Director or create-env? Explicit configuration wins; otherwise the request tells.
//!
//! bosh-cli (create-env) sends a context with `director_uuid` and no `request_id`, and runs the
//! CPI with `BOSH_PACKAGES_DIR` / `BOSH_JOBS_DIR` set; a director always sends `request_id`.

use serde_json::{Map, Value};

use crate::gallery::service::Mode;

/// The decision and the signal it came from, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeDecision {
    pub mode: Mode,
    pub signal: String,
}

pub fn detect(
    configured: Option<bool>,
    context: &Map<String, Value>,
    env: &dyn Fn(&str) -> Option<String>,
) -> ModeDecision {
    if let Some(create_env) = configured {
        let mode = if create_env {
            Mode::CreateEnv
        } else {
            Mode::Director
        };
        return ModeDecision {
            mode,
            signal: format!("configured explicitly (stemcell_gallery_create_env = {create_env})"),
        };
    }
    let request_id = context
        .get("request_id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty());
    if let Some(id) = request_id {
        return ModeDecision {
            mode: Mode::Director,
            signal: format!(
                "the request context carries request_id {id:?}, which only a director sends"
            ),
        };
    }
    let bosh_cli_env: Vec<&str> = ["BOSH_PACKAGES_DIR", "BOSH_JOBS_DIR"]
        .into_iter()
        .filter(|k| env(k).is_some())
        .collect();
    let signal = if bosh_cli_env.is_empty() {
        "the request context has no request_id (bosh-cli create-env sends none; a director always does)".to_string()
    } else {
        format!(
            "the request context has no request_id and {} is set, as bosh-cli create-env does",
            bosh_cli_env.join(" and ")
        )
    };
    ModeDecision {
        mode: Mode::CreateEnv,
        signal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ctx(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn a_director_request_is_director_mode() {
        let d = detect(
            None,
            &ctx(json!({"director_uuid":"u","request_id":"cpi-123"})),
            &|_| None,
        );
        assert_eq!(d.mode, Mode::Director);
        assert!(d.signal.contains("cpi-123"));
    }

    #[test]
    fn a_bosh_cli_request_is_create_env_mode() {
        let d = detect(None, &ctx(json!({"director_uuid":"u"})), &|k| {
            (k == "BOSH_PACKAGES_DIR").then(|| "/x".to_string())
        });
        assert_eq!(d.mode, Mode::CreateEnv);
        assert!(d.signal.contains("BOSH_PACKAGES_DIR"), "{}", d.signal);
    }

    #[test]
    fn configuration_wins_over_the_request() {
        let d = detect(Some(false), &ctx(json!({"director_uuid":"u"})), &|_| None);
        assert_eq!(d.mode, Mode::Director);
        let d = detect(Some(true), &ctx(json!({"request_id":"cpi-1"})), &|_| None);
        assert_eq!(d.mode, Mode::CreateEnv);
        assert!(d.signal.contains("explicitly"));
    }
}
