//! A `bosh create-env` state file (`bosh-state.json`).

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::strict::{join, kind, read_json, Strict};
use super::{Evidence, FileKind, HeldStemcell, SourceError, UsageSource};

/// A `bosh create-env` state file. Every stemcell record counts as in use, whatever
/// `current_stemcell_id` says — an empty pointer (left by a failed recreate) is not evidence of
/// non-use.
///
/// Read strictly, as bosh-cli writes it (`config/deployment_state_service.go`: `stemcells` is a
/// list of `{id, name, version, api_version, cid}` with string fields and an integer
/// `api_version`, `null` when create-env never saved one; `config/stemcell_repo.go` only ever sets
/// `current_stemcell_id` to `""` or the id of a saved record). Anything else is unreadable.
pub struct CreateEnvStateFile {
    pub path: PathBuf,
}

/// One stemcell record of a bosh-state.json.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StemcellRecord {
    pub id: String,
    pub name: String,
    pub version: String,
    pub cid: String,
}

impl CreateEnvStateFile {
    const WHAT: &'static str = "a bosh create-env state file (bosh-state.json)";

    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// Parse the document: its stemcell records and `current_stemcell_id` (`""` when unset).
    pub fn parse(path: &Path, doc: &Value) -> Result<(Vec<StemcellRecord>, String), SourceError> {
        let s = Strict {
            file: path,
            what: Self::WHAT,
        };
        let root = s.object(doc, "the document")?;
        for key in [
            "director_id",
            "installation_id",
            "current_vm_cid",
            "current_disk_id",
            "current_manifest_sha",
            "current_manifest_sha1",
        ] {
            if let Some(v) = root.get(key) {
                s.string(v, key)?;
            }
        }
        s.strings_or_null(root.get("current_release_ids"), "current_release_ids")?;
        for key in ["disks", "releases"] {
            match root.get(key) {
                None | Some(Value::Null) | Some(Value::Array(_)) => {}
                Some(other) => {
                    return Err(s.bad(
                        key,
                        format!("expected a list or null, found {}", kind(other)),
                    ))
                }
            }
        }
        let current = match root.get("current_stemcell_id") {
            None => String::new(),
            Some(v) => s.string(v, "current_stemcell_id")?.trim().to_string(),
        };
        let records = s.required(
            root,
            "",
            "stemcells",
            "the list of stemcell records (or null)",
        )?;
        let records: &[Value] = match records {
            Value::Null => &[],
            Value::Array(a) => a,
            other => {
                return Err(s.bad(
                    "stemcells",
                    format!("expected a list of stemcell records, found {}", kind(other)),
                ))
            }
        };
        let mut out = Vec::with_capacity(records.len());
        for (i, rec) in records.iter().enumerate() {
            let at = format!("stemcells[{i}]");
            let obj = s.object(rec, &at)?;
            let field = |key: &str, what: &str| -> Result<String, SourceError> {
                let v = s.required(obj, &at, key, what)?;
                Ok(s.string(v, &join(&at, key))?.trim().to_string())
            };
            let record = StemcellRecord {
                id: field("id", "the record's id")?,
                name: field("name", "the stemcell's name")?,
                version: field(
                    "version",
                    "the stemcell's version as a string, e.g. \"1.506\"",
                )?,
                cid: field("cid", "the stemcell's CID")?,
            };
            if let Some(v) = obj.get("api_version") {
                if !(v.is_u64() || v.is_null()) {
                    return Err(s.bad(
                        &join(&at, "api_version"),
                        format!("expected a whole number, found {}", kind(v)),
                    ));
                }
            }
            for (key, value) in [
                ("id", &record.id),
                ("name", &record.name),
                ("version", &record.version),
            ] {
                if value.is_empty() {
                    return Err(s.bad(&join(&at, key), "expected a value, found \"\""));
                }
            }
            out.push(record);
        }
        if !current.is_empty() && !out.iter().any(|r| r.id == current) {
            return Err(s.bad(
                "current_stemcell_id",
                format!(
                    "{current:?} names no stemcell record (create-env only points it at a saved record; the ids here are: {})",
                    if out.is_empty() {
                        "none".to_string()
                    } else {
                        out.iter().map(|r| r.id.as_str()).collect::<Vec<_>>().join(", ")
                    }
                ),
            ));
        }
        Ok((out, current))
    }
}

#[async_trait::async_trait]
impl UsageSource for CreateEnvStateFile {
    fn name(&self) -> String {
        FileKind::CreateEnvState.source_name(&self.path, None)
    }

    async fn collect(&self) -> Result<Evidence, SourceError> {
        let doc = read_json(&self.path, Self::WHAT).await?;
        let (records, current) = Self::parse(&self.path, &doc)?;
        // The director it deployed holds its stemcells: bosh-cli sends this id as the CPI
        // context's director_uuid, the holder the front records.
        let holder = doc
            .get("director_id")
            .and_then(serde_json::Value::as_str)
            .map(str::trim)
            .filter(|id| !id.is_empty())
            .and_then(|id| crate::gallery::record::holder_label(id).ok());
        let file = self.path.display().to_string();
        let mut claims = Vec::new();
        for rec in records {
            let StemcellRecord {
                id,
                name,
                version,
                cid,
            } = rec;
            let pointer = if current.is_empty() {
                "current_stemcell_id is empty — an empty pointer is not evidence of non-use"
                    .to_string()
            } else if current == id {
                "it is the current stemcell".to_string()
            } else {
                format!(
                    "current_stemcell_id is {current}, but every stemcell record counts until create-env deletes it"
                )
            };
            let held = HeldStemcell { name, version, cid };
            claims.extend(FileKind::CreateEnvState.claims(
                &self.name(),
                &file,
                held,
                Some(&pointer),
            ));
        }
        Ok(Evidence {
            source: self.name(),
            claims,
            holder,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn state_reasons(doc: serde_json::Value) -> Result<Vec<String>, SourceError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bosh-state.json");
        std::fs::write(&path, doc.to_string()).unwrap();
        let ev = CreateEnvStateFile::new(&path).collect().await?;
        Ok(ev
            .claims
            .into_iter()
            .map(|c| c.reason.replace(&path.display().to_string(), "F"))
            .collect())
    }

    #[tokio::test]
    async fn every_create_env_record_counts_whatever_the_pointer_says() {
        let rec = |id: &str| serde_json::json!({"id": id, "name": "s", "version": "1.506", "cid": format!("cid-{id}")});
        let reasons = state_reasons(serde_json::json!({
            "current_stemcell_id": "a", "stemcells": [rec("a"), rec("b")]
        }))
        .await
        .unwrap();
        assert_eq!(
            reasons,
            vec![
                "create-env state F holds stemcell cid-a (s 1.506); it is the current stemcell",
                "create-env state F holds stemcell cid-a (s 1.506); it is the current stemcell",
                "create-env state F holds stemcell cid-b (s 1.506); current_stemcell_id is a, but every stemcell record counts until create-env deletes it",
                "create-env state F holds stemcell cid-b (s 1.506); current_stemcell_id is a, but every stemcell record counts until create-env deletes it",
            ]
        );
        let reasons = state_reasons(serde_json::json!({"stemcells": [rec("a")]}))
            .await
            .unwrap();
        assert!(reasons[0].ends_with(
            "current_stemcell_id is empty — an empty pointer is not evidence of non-use"
        ));
        assert!(state_reasons(serde_json::json!({"stemcells": null}))
            .await
            .unwrap()
            .is_empty());
        for (bad, at) in [
            (serde_json::json!([]), "the document: expected an object"),
            (
                serde_json::json!({"current_stemcell_id": ""}),
                "stemcells: missing",
            ),
            (
                serde_json::json!({"stemcells": [{"id": "x"}]}),
                "stemcells[0].name: missing",
            ),
            (
                serde_json::json!({"stemcells": [], "current_stemcell_id": 7}),
                "current_stemcell_id: expected a string",
            ),
            (
                serde_json::json!({"stemcells": "none"}),
                "stemcells: expected a list",
            ),
            (
                serde_json::json!({"current_stemcell_id": "a", "stemcells": [{"id": "a", "name": "s", "version": 1.506, "cid": "c"}]}),
                "stemcells[0].version: expected a string, found a number",
            ),
            (
                serde_json::json!({"current_stemcell_id": "z", "stemcells": [rec("a")]}),
                "current_stemcell_id: \"z\" names no stemcell record",
            ),
            (
                serde_json::json!({"current_stemcell_id": "z", "stemcells": null}),
                "current_stemcell_id: \"z\" names no stemcell record",
            ),
            (
                serde_json::json!({"stemcells": [{"id": "a", "name": "s", "version": "1", "cid": "c", "api_version": "3"}]}),
                "stemcells[0].api_version: expected a whole number",
            ),
        ] {
            let err = state_reasons(bad.clone()).await.unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "is not a bosh create-env state file (bosh-state.json): {at}"
                )),
                "{bad}: {err}"
            );
        }
    }
}
