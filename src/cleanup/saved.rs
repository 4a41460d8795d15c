//! A saved cleanup plan (`cleanup --output json > plan.json`, then `cleanup --apply --plan
//! plan.json`): the deletions an operator reviewed, each with a fingerprint of the version as it
//! was observed. Applying it plans again from a fresh inventory and fresh evidence and refuses
//! unless exactly the same versions, unchanged, are to be deleted.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::planner::{Plan, Verdict};
use crate::gallery::ImageVersion;

/// A fingerprint of what a version was when planned: its id, state, tags (references, digest,
/// protect tag), publication date and source. Any change to them changes the fingerprint.
pub fn fingerprint(v: &ImageVersion) -> String {
    let doc = serde_json::json!({
        "id": v.id.to_ascii_lowercase(),
        "state": v.provisioning_state.as_str(),
        "tags": v.tags,
        "published": v.published_date.map(|d| d.unix_timestamp()),
        "source": v.source_uri,
    });
    let mut h = Sha256::new();
    h.update(doc.to_string().as_bytes());
    hex::encode(&h.finalize()[..16])
}

/// The deletions of a saved dry run: version id (lower case) → fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedPlan {
    pub deletions: BTreeMap<String, String>,
}

impl SavedPlan {
    /// Read a saved dry run (`cleanup --output json`). `Err` says what is wrong with it.
    pub fn parse(doc: &Value) -> Result<SavedPlan, String> {
        if doc.get("applied") != Some(&Value::Bool(false)) {
            return Err(
                "it is not the JSON of a cleanup dry run (`cleanup --output json` without --apply)"
                    .into(),
            );
        }
        let versions = doc
            .get("versions")
            .and_then(Value::as_array)
            .ok_or("it has no \"versions\" list")?;
        let mut deletions = BTreeMap::new();
        for (i, v) in versions.iter().enumerate() {
            let field = |k: &str| {
                v.get(k)
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("versions[{i}] has no string \"{k}\""))
            };
            if field("verdict")? == Verdict::Delete.as_str() {
                let fp = field("fingerprint").map_err(|e| {
                    format!("{e} (saved by an older release? plan again with this one)")
                })?;
                deletions.insert(field("id")?.to_ascii_lowercase(), fp.to_string());
            }
        }
        Ok(SavedPlan { deletions })
    }

    /// Read and parse `path`.
    pub fn read(path: &Path) -> Result<SavedPlan, String> {
        Self::parse(&read_json(path)?)
    }

    /// How `now` differs from the saved deletions, one line each; empty when the same versions,
    /// unchanged, are to be deleted.
    pub fn changes(&self, now: &Plan) -> Vec<String> {
        let mut out = Vec::new();
        let current: BTreeMap<String, (&ImageVersion, Verdict)> = now
            .entries
            .iter()
            .map(|e| (e.observed.id.to_ascii_lowercase(), (&e.observed, e.verdict)))
            .collect();
        for (id, fp) in &self.deletions {
            match current.get(id) {
                None => out.push(format!("{id} is gone")),
                Some((_, v)) if *v != Verdict::Delete => {
                    out.push(format!("{id} is now to be kept"))
                }
                Some((observed, _)) if &fingerprint(observed) != fp => {
                    out.push(format!("{id} changed (state, tags, references or content)"))
                }
                Some(_) => {}
            }
        }
        for (id, (_, verdict)) in &current {
            if *verdict == Verdict::Delete && !self.deletions.contains_key(id) {
                out.push(format!(
                    "{id} is now to be deleted, and the saved plan does not delete it"
                ));
            }
        }
        out
    }
}

/// A saved dry run's JSON document (cleanup's or `references prune`'s); `Err` says why not.
pub(crate) fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read it: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("it is not JSON: {e}"))
}
