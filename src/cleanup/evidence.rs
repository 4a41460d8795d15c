//! Evidence of use: every source that can show a gallery version is still needed.
//!
//! A source yields [`Claim`]s: "this target is in use, because ...". Targets are deliberately
//! coarse where the source is (a stemcell name and version, a CID, a whole definition's `latest`);
//! the planner protects every version a claim can match. Protecting too much is safe, deleting too
//! much is not.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use super::inventory::Inventory;
use super::CleanupError;
use crate::gallery::latest::{ImageRef, VersionSel};
use crate::gallery::{tags, Consumer, ConsumerKind, GalleryApi};

/// What a claim protects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClaimTarget {
    /// One version, by its resource id (compared case-insensitively).
    VersionId(String),
    /// What a VM, scale set (model or instance) or disk protects through its image reference
    /// (any form), its region and its recorded exact version: the planner asks
    /// `gallery::latest::uses` for every definition the reference may name.
    ConsumerImage(Consumer),
    /// A stemcell by name and version (as BOSH spells it, e.g. `1.506`): protects that version key
    /// in every definition whose name starts with the stemcell name.
    StemcellNameVersion { name: String, version: String },
    /// A stemcell CID: protects every version whose references contain it.
    Cid(String),
}

/// Where a claim comes from, in typed form (the planner turns it into a typed reason).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Basis {
    /// References recorded on the version itself.
    Reference { refs: Vec<String> },
    /// A row of `bosh stemcells --json`.
    DirectorList {
        file: String,
        name: String,
        version: String,
        cid: String,
    },
    /// A stemcell record of a create-env `bosh-state.json`.
    CreateEnvState {
        file: String,
        name: String,
        version: String,
        cid: String,
    },
    /// A VM, scale set (model or instance) or disk created from a gallery image.
    Consumer {
        kind: ConsumerKind,
        id: String,
        image_id: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub target: ClaimTarget,
    pub basis: Basis,
    /// Why, for the operator.
    pub reason: String,
    /// The source's name.
    pub source: String,
}

/// Everything one source said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    pub source: String,
    pub claims: Vec<Claim>,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        cause: std::io::Error,
    },
    #[error("{} is not {what}: {message}", path.display())]
    Malformed {
        path: PathBuf,
        what: &'static str,
        message: String,
    },
    #[error(transparent)]
    Gallery(#[from] crate::gallery::Error),
}

/// One source of evidence of use.
#[async_trait::async_trait]
pub trait UsageSource: Send + Sync {
    /// A name an operator recognises (it appears in reasons and errors).
    fn name(&self) -> String;
    async fn collect(&self) -> Result<Evidence, SourceError>;
}

/// Read every source (all of them, even after one failed). Any failure → `EvidenceIncomplete`
/// naming the first failed source (and listing the others).
pub async fn collect_all(sources: &[Box<dyn UsageSource>]) -> Result<Vec<Evidence>, CleanupError> {
    let results = futures::future::join_all(sources.iter().map(|s| s.collect())).await;
    let mut out = Vec::with_capacity(results.len());
    let mut failed: Vec<(String, SourceError)> = Vec::new();
    for (source, result) in sources.iter().zip(results) {
        match result {
            Ok(ev) => out.push(ev),
            Err(e) => failed.push((source.name(), e)),
        }
    }
    let mut failed = failed.into_iter();
    match failed.next() {
        None => Ok(out),
        Some((source_name, cause)) => Err(CleanupError::EvidenceIncomplete {
            source_name,
            cause,
            also_failed: failed.map(|(n, _)| n).collect(),
        }),
    }
}

// ---------------------------------------------------------------------------------------------

/// References recorded on the versions (ours `sg_refs_*`, the Azure CPI's `stemcell_references`
/// and its legacy `stemcell_name`).
pub struct ReferencesSource {
    inventory: Arc<Inventory>,
}

impl ReferencesSource {
    pub const NAME: &'static str = "references recorded on the versions";

    pub fn new(inventory: Arc<Inventory>) -> Self {
        Self { inventory }
    }
}

#[async_trait::async_trait]
impl UsageSource for ReferencesSource {
    fn name(&self) -> String {
        Self::NAME.to_string()
    }

    async fn collect(&self) -> Result<Evidence, SourceError> {
        let claims = self
            .inventory
            .versions
            .iter()
            .filter_map(|v| {
                let refs = tags::references(&v.tags);
                if refs.is_empty() {
                    return None;
                }
                Some(Claim {
                    target: ClaimTarget::VersionId(v.id.clone()),
                    reason: format!("referenced by {}", refs.join(", ")),
                    basis: Basis::Reference { refs },
                    source: self.name(),
                })
            })
            .collect();
        Ok(Evidence {
            source: self.name(),
            claims,
        })
    }
}

// ---------------------------------------------------------------------------------------------

async fn read_json(path: &Path, what: &'static str) -> Result<Value, SourceError> {
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|cause| SourceError::Read {
            path: path.to_path_buf(),
            cause,
        })?;
    serde_json::from_slice(&bytes).map_err(|e| SourceError::Malformed {
        path: path.to_path_buf(),
        what,
        message: e.to_string(),
    })
}

fn field<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.get(key).and_then(Value::as_str).map(str::trim)
}

/// A director's stemcell list: the JSON `bosh stemcells --json` prints. Every row counts as held
/// by the director, marked in use (`*`) or not.
pub struct DirectorStemcellsFile {
    pub path: PathBuf,
}

impl DirectorStemcellsFile {
    const WHAT: &'static str = "the output of `bosh stemcells --json`";

    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// Parse the document (public for tests and for callers that already hold the text).
    pub fn parse(path: &Path, doc: &Value) -> Result<Vec<(String, String, String)>, SourceError> {
        let bad = |message: String| SourceError::Malformed {
            path: path.to_path_buf(),
            what: Self::WHAT,
            message,
        };
        let tables = doc
            .get("Tables")
            .and_then(Value::as_array)
            .ok_or_else(|| bad("no \"Tables\" list".into()))?;
        let mut rows_out = Vec::new();
        for (t, table) in tables.iter().enumerate() {
            if let Some(content) = field(table, "Content") {
                if !content.is_empty() && content != "stemcells" {
                    return Err(bad(format!(
                        "table {t} holds {content:?}, not stemcells (was another bosh command's output saved?)"
                    )));
                }
            }
            let rows = match table.get("Rows") {
                None | Some(Value::Null) => continue,
                Some(Value::Array(rows)) => rows,
                Some(_) => return Err(bad(format!("table {t}: \"Rows\" is not a list"))),
            };
            for (r, row) in rows.iter().enumerate() {
                let name = field(row, "name").unwrap_or_default();
                let raw_version = field(row, "version").unwrap_or_default();
                // `1.506*` marks a stemcell in use; newer CLIs may add other marks.
                let version = raw_version.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
                if name.is_empty() || version.is_empty() {
                    return Err(bad(format!(
                        "table {t} row {r} has no stemcell name or version: {row}"
                    )));
                }
                let cid = field(row, "cid").unwrap_or_default();
                rows_out.push((name.to_string(), version.to_string(), cid.to_string()));
            }
        }
        Ok(rows_out)
    }
}

#[async_trait::async_trait]
impl UsageSource for DirectorStemcellsFile {
    fn name(&self) -> String {
        format!("director stemcells {}", self.path.display())
    }

    async fn collect(&self) -> Result<Evidence, SourceError> {
        let doc = read_json(&self.path, Self::WHAT).await?;
        let file = self.path.display().to_string();
        let mut claims = Vec::new();
        for (name, version, cid) in Self::parse(&self.path, &doc)? {
            let basis = Basis::DirectorList {
                file: file.clone(),
                name: name.clone(),
                version: version.clone(),
                cid: cid.clone(),
            };
            let reason = if cid.is_empty() {
                format!("director list {file} holds stemcell {name} {version}")
            } else {
                format!("director list {file} holds stemcell {cid} ({name} {version})")
            };
            claims.push(Claim {
                target: ClaimTarget::StemcellNameVersion {
                    name: name.clone(),
                    version: version.clone(),
                },
                basis: basis.clone(),
                reason: reason.clone(),
                source: self.name(),
            });
            if !cid.is_empty() {
                claims.push(Claim {
                    target: ClaimTarget::Cid(cid),
                    basis,
                    reason,
                    source: self.name(),
                });
            }
        }
        Ok(Evidence {
            source: self.name(),
            claims,
        })
    }
}

// ---------------------------------------------------------------------------------------------

/// A `bosh create-env` state file. Every stemcell record counts as in use, whatever
/// `current_stemcell_id` says — an empty pointer (left by a failed recreate) is not evidence of
/// non-use.
pub struct CreateEnvStateFile {
    pub path: PathBuf,
}

impl CreateEnvStateFile {
    const WHAT: &'static str = "a bosh create-env state file (bosh-state.json)";

    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }
}

#[async_trait::async_trait]
impl UsageSource for CreateEnvStateFile {
    fn name(&self) -> String {
        format!("create-env state {}", self.path.display())
    }

    async fn collect(&self) -> Result<Evidence, SourceError> {
        let doc = read_json(&self.path, Self::WHAT).await?;
        let bad = |message: String| SourceError::Malformed {
            path: self.path.clone(),
            what: Self::WHAT,
            message,
        };
        if !doc.is_object() {
            return Err(bad("the document is not a JSON object".into()));
        }
        let records = match doc.get("stemcells") {
            None => return Err(bad("no \"stemcells\" field".into())),
            Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(_) => return Err(bad("\"stemcells\" is not a list".into())),
        };
        let current = match doc.get("current_stemcell_id") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.trim().to_string(),
            Some(_) => return Err(bad("\"current_stemcell_id\" is not a string".into())),
        };
        let file = self.path.display().to_string();
        let mut claims = Vec::new();
        for (i, rec) in records.iter().enumerate() {
            let id = field(rec, "id").unwrap_or_default();
            let name = field(rec, "name").unwrap_or_default();
            let version = field(rec, "version").unwrap_or_default();
            let cid = field(rec, "cid").unwrap_or_default();
            if cid.is_empty() && (name.is_empty() || version.is_empty()) {
                return Err(bad(format!(
                    "stemcell record {i} has neither a cid nor a name and version: {rec}"
                )));
            }
            let pointer = if current.is_empty() {
                "current_stemcell_id is empty — an empty pointer is not evidence of non-use"
                    .to_string()
            } else if !id.is_empty() && current == id {
                "it is the current stemcell".to_string()
            } else {
                format!(
                    "current_stemcell_id is {current}, but every stemcell record counts until create-env deletes it"
                )
            };
            let held = if cid.is_empty() {
                format!("{name} {version}")
            } else if name.is_empty() || version.is_empty() {
                cid.to_string()
            } else {
                format!("{cid} ({name} {version})")
            };
            let reason = format!("create-env state {file} holds stemcell {held}; {pointer}");
            let basis = Basis::CreateEnvState {
                file: file.clone(),
                name: name.to_string(),
                version: version.to_string(),
                cid: cid.to_string(),
            };
            if !name.is_empty() && !version.is_empty() {
                claims.push(Claim {
                    target: ClaimTarget::StemcellNameVersion {
                        name: name.to_string(),
                        version: version.to_string(),
                    },
                    basis: basis.clone(),
                    reason: reason.clone(),
                    source: self.name(),
                });
            }
            if !cid.is_empty() {
                claims.push(Claim {
                    target: ClaimTarget::Cid(cid.to_string()),
                    basis,
                    reason,
                    source: self.name(),
                });
            }
        }
        Ok(Evidence {
            source: self.name(),
            claims,
        })
    }
}

// ---------------------------------------------------------------------------------------------

/// VMs, scale sets (model and instances) and managed disks created from gallery images, listed
/// once through [`GalleryApi::list_consumers`].
pub struct ConsumersSource {
    api: Arc<dyn GalleryApi>,
}

impl ConsumersSource {
    pub const NAME: &'static str = "gallery consumers (VMs, scale sets, disks)";

    pub fn new(api: Arc<dyn GalleryApi>) -> Self {
        Self { api }
    }
}

/// What a consumer's image reference claims, if it is a gallery image (ARM id, shared or
/// community gallery id; segment names compared case-insensitively).
pub(crate) fn consumer_target(c: &Consumer) -> Option<ClaimTarget> {
    ImageRef::parse(&c.image_id)?;
    Some(ClaimTarget::ConsumerImage(c.clone()))
}

pub(crate) fn kind_name(kind: &ConsumerKind) -> &'static str {
    match kind {
        ConsumerKind::VirtualMachine => "VM",
        ConsumerKind::ScaleSet => "scale set",
        ConsumerKind::ScaleSetInstance => "scale set instance",
        ConsumerKind::Disk => "disk",
    }
}

#[async_trait::async_trait]
impl UsageSource for ConsumersSource {
    /// Names the subscriptions read, when the adapter says: only those scopes are read.
    fn name(&self) -> String {
        let scopes = self.api.consumer_scopes();
        if scopes.is_empty() {
            Self::NAME.to_string()
        } else {
            format!("{} in subscriptions {}", Self::NAME, scopes.join(", "))
        }
    }

    async fn collect(&self) -> Result<Evidence, SourceError> {
        let consumers = self.api.list_consumers().await?;
        let claims = consumers
            .into_iter()
            .filter_map(|c| {
                let target = consumer_target(&c)?;
                let latest =
                    ImageRef::parse(&c.image_id).is_some_and(|r| r.version == VersionSel::Latest);
                let reason = if latest {
                    format!(
                        "{} {} was created from the latest version of {}",
                        kind_name(&c.kind),
                        c.id,
                        c.image_id
                    )
                } else {
                    format!("{} {} was created from it", kind_name(&c.kind), c.id)
                };
                Some(Claim {
                    target,
                    basis: Basis::Consumer {
                        kind: c.kind,
                        id: c.id,
                        image_id: c.image_id,
                    },
                    reason,
                    source: self.name(),
                })
            })
            .collect();
        Ok(Evidence {
            source: self.name(),
            claims,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumer_image_references_of_every_gallery_form_are_claims() {
        let def =
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g/images/d";
        for image in [
            format!("{def}/versions/1.2.0"),
            format!("{def}/versions/LATEST"),
            def.to_string(),
            "/SharedGalleries/uniq-G/Images/d/Versions/1.2.0".to_string(),
            "/communitygalleries/pub-1/images/d/versions/latest".to_string(),
        ] {
            let c = Consumer::new(ConsumerKind::VirtualMachine, "vm", image.clone());
            assert_eq!(
                consumer_target(&c),
                Some(ClaimTarget::ConsumerImage(c.clone())),
                "{image}"
            );
        }
        for image in [
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/images/managed",
            "",
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/galleries/g",
        ] {
            let c = Consumer::new(ConsumerKind::Disk, "d", image);
            assert_eq!(consumer_target(&c), None, "{image}");
        }
    }

    fn parse_rows(doc: serde_json::Value) -> Result<Vec<(String, String, String)>, SourceError> {
        DirectorStemcellsFile::parse(Path::new("d.json"), &doc)
    }

    #[test]
    fn director_rows_marked_or_not_all_count_and_extra_columns_are_tolerated() {
        let rows = parse_rows(serde_json::json!({"Tables": [{"Content": "stemcells", "Rows": [
            {"name": "s", "version": "1.506*", "os": "ubuntu-jammy", "cid": "c1", "new_column": "x"},
            {"name": "s", "version": " 1.480 ", "cid": ""},
            {"name": "s", "version": "1.2.3*+"}
        ]}]}))
        .unwrap();
        assert_eq!(
            rows,
            vec![
                ("s".into(), "1.506".into(), "c1".into()),
                ("s".into(), "1.480".into(), "".into()),
                ("s".into(), "1.2.3".into(), "".into()),
            ]
        );
        assert_eq!(
            parse_rows(serde_json::json!({"Tables": [{"Content": "stemcells", "Rows": null}]}))
                .unwrap(),
            vec![]
        );
    }

    #[test]
    fn director_documents_that_are_not_stemcell_lists_are_errors_naming_the_file() {
        for doc in [
            serde_json::json!({"tables": []}),
            serde_json::json!({"Tables": [{"Content": "stemcells", "Rows": [{"name": "s"}]}]}),
            serde_json::json!({"Tables": [{"Content": "stemcells", "Rows": [{"name": "s", "version": "*"}]}]}),
            serde_json::json!({"Tables": [{"Content": "stemcells", "Rows": {}}]}),
            serde_json::json!({"Tables": [{"Content": "deployments", "Rows": []}]}),
        ] {
            let err = parse_rows(doc.clone()).unwrap_err().to_string();
            assert!(
                err.starts_with("d.json is not the output of `bosh stemcells --json`"),
                "{doc}: {err}"
            );
        }
    }

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
        for bad in [
            serde_json::json!([]),
            serde_json::json!({"current_stemcell_id": ""}),
            serde_json::json!({"stemcells": [{"id": "x"}]}),
            serde_json::json!({"stemcells": [], "current_stemcell_id": 7}),
        ] {
            let err = state_reasons(bad.clone()).await.unwrap_err().to_string();
            assert!(
                err.contains("is not a bosh create-env state file"),
                "{bad}: {err}"
            );
        }
    }
}
