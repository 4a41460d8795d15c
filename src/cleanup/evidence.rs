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
                // Tag names are case-insensitive in Azure (`Stemcell_References` counts).
                let refs = tags::references(&tags::canonical_names(&v.tags));
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

/// The JSON type of a value, for "expected X, found Y".
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A strict reader of one evidence document: every complaint names the path inside the document
/// (`Tables[0].Rows[2].version`) and what was expected there.
struct Strict<'a> {
    file: &'a Path,
    what: &'static str,
}

impl Strict<'_> {
    fn bad(&self, at: &str, message: impl std::fmt::Display) -> SourceError {
        SourceError::Malformed {
            path: self.file.to_path_buf(),
            what: self.what,
            message: format!("{at}: {message}"),
        }
    }

    fn object<'v>(
        &self,
        v: &'v Value,
        at: &str,
    ) -> Result<&'v serde_json::Map<String, Value>, SourceError> {
        v.as_object()
            .ok_or_else(|| self.bad(at, format!("expected an object, found {}", kind(v))))
    }

    /// The keys of `obj` must all be in `known` (the fields bosh writes there).
    fn only_keys(
        &self,
        obj: &serde_json::Map<String, Value>,
        at: &str,
        known: &[&str],
    ) -> Result<(), SourceError> {
        match obj.keys().find(|k| !known.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) => Err(self.bad(
                &join(at, k),
                format!(
                    "unexpected field (bosh writes only {} here)",
                    known.join(", ")
                ),
            )),
        }
    }

    fn required<'v>(
        &self,
        obj: &'v serde_json::Map<String, Value>,
        at: &str,
        key: &str,
        expected: &str,
    ) -> Result<&'v Value, SourceError> {
        obj.get(key)
            .ok_or_else(|| self.bad(&join(at, key), format!("missing; expected {expected}")))
    }

    fn string<'v>(&self, v: &'v Value, at: &str) -> Result<&'v str, SourceError> {
        v.as_str()
            .ok_or_else(|| self.bad(at, format!("expected a string, found {}", kind(v))))
    }

    /// `null` or a list of strings (Go marshals a nil slice as `null`).
    fn strings_or_null(&self, v: Option<&Value>, at: &str) -> Result<(), SourceError> {
        match v {
            None | Some(Value::Null) => Ok(()),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .try_for_each(|(i, item)| self.string(item, &format!("{at}[{i}]")).map(|_| ())),
            Some(other) => Err(self.bad(
                at,
                format!("expected a list of strings or null, found {}", kind(other)),
            )),
        }
    }
}

fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

/// A director's stemcell list: the JSON `bosh stemcells --json` prints. Every row counts as held
/// by the director, marked in use (`*`) or not.
///
/// Read strictly, as bosh-cli writes it (`cmd/stemcells.go` builds one table with
/// `Content: "stemcells"`; `ui/json_ui.go` renders `{"Tables": [{"Content", "Header", "Rows",
/// "Notes"}], "Blocks", "Lines"}`, `Rows` a list of string-to-string maps keyed by the lower-cased
/// column titles, never `null`): exactly one `stemcells` table with a `Rows` list, every row with
/// string `name`, `version` and `cid`. A director with no stemcells prints that table with
/// `"Rows": []`, the only empty list. Anything else is unreadable evidence.
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
        let s = Strict {
            file: path,
            what: Self::WHAT,
        };
        let root = s.object(doc, "the document")?;
        s.only_keys(root, "", &["Tables", "Blocks", "Lines"])?;
        let tables = s.required(root, "", "Tables", "the list of tables")?;
        let tables = tables.as_array().ok_or_else(|| {
            s.bad(
                "Tables",
                format!("expected a list of tables, found {}", kind(tables)),
            )
        })?;
        s.strings_or_null(root.get("Blocks"), "Blocks")?;
        s.strings_or_null(root.get("Lines"), "Lines")?;
        if tables.len() != 1 {
            return Err(s.bad(
                "Tables",
                format!(
                    "expected exactly one table (`bosh stemcells --json` prints one, with \"Rows\": [] when the director holds no stemcell), found {}",
                    tables.len()
                ),
            ));
        }
        let at = "Tables[0]";
        let table = s.object(&tables[0], at)?;
        let content = s.required(table, at, "Content", "\"stemcells\"")?;
        let content = s.string(content, &join(at, "Content"))?;
        if content != "stemcells" {
            return Err(s.bad(
                &join(at, "Content"),
                format!("expected \"stemcells\", found {content:?} (was another bosh command's output saved?)"),
            ));
        }
        let header = s.required(table, at, "Header", "the column titles")?;
        let header = s.object(header, &join(at, "Header"))?;
        for (k, v) in header {
            s.string(v, &join(&join(at, "Header"), k))?;
        }
        s.strings_or_null(table.get("Notes"), &join(at, "Notes"))?;
        let rows = s.required(
            table,
            at,
            "Rows",
            "the list of stemcells ([] when there is none)",
        )?;
        let rows = rows.as_array().ok_or_else(|| {
            s.bad(
                &join(at, "Rows"),
                format!("expected a list of stemcells, found {}", kind(rows)),
            )
        })?;
        s.only_keys(table, at, &["Content", "Header", "Rows", "Notes"])?;
        let mut rows_out = Vec::with_capacity(rows.len());
        for (r, row) in rows.iter().enumerate() {
            let at = format!("Tables[0].Rows[{r}]");
            let row = s.object(row, &at)?;
            // Every cell is a string (newer CLIs may add columns; they are strings too).
            for (k, v) in row {
                s.string(v, &join(&at, k))?;
            }
            let cell = |key: &str, what: &str| -> Result<&str, SourceError> {
                let v = s.required(row, &at, key, what)?;
                Ok(s.string(v, &join(&at, key))?.trim())
            };
            let name = cell("name", "the stemcell's name")?;
            let raw_version = cell("version", "the stemcell's version")?;
            let cid = cell("cid", "the stemcell's CID")?;
            // `1.506*` marks a stemcell in use; newer CLIs may add other marks.
            let version = raw_version.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
            if name.is_empty() {
                return Err(s.bad(&join(&at, "name"), "expected a stemcell name, found \"\""));
            }
            if version.is_empty() {
                return Err(s.bad(
                    &join(&at, "version"),
                    format!(
                        "expected a stemcell version such as \"1.506*\", found {raw_version:?}"
                    ),
                ));
            }
            rows_out.push((name.to_string(), version.to_string(), cid.to_string()));
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
        format!("create-env state {}", self.path.display())
    }

    async fn collect(&self) -> Result<Evidence, SourceError> {
        let doc = read_json(&self.path, Self::WHAT).await?;
        let (records, current) = Self::parse(&self.path, &doc)?;
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
            let held = if cid.is_empty() {
                format!("{name} {version}")
            } else {
                format!("{cid} ({name} {version})")
            };
            let reason = format!("create-env state {file} holds stemcell {held}; {pointer}");
            let basis = Basis::CreateEnvState {
                file: file.clone(),
                name: name.clone(),
                version: version.clone(),
                cid: cid.clone(),
            };
            claims.push(Claim {
                target: ClaimTarget::StemcellNameVersion { name, version },
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

    fn table(rows: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"Tables": [{"Content": "stemcells",
            "Header": {"name": "Name", "version": "Version", "os": "OS", "cpi": "CPI", "cid": "CID"},
            "Rows": rows, "Notes": ["(*) Currently deployed"]}],
            "Blocks": null, "Lines": ["Succeeded"]})
    }

    #[test]
    fn director_rows_marked_or_not_all_count_and_extra_columns_are_tolerated() {
        let rows = parse_rows(table(serde_json::json!([
            {"name": "s", "version": "1.506*", "os": "ubuntu-jammy", "cpi": "", "cid": "c1", "new_column": "x"},
            {"name": "s", "version": " 1.480 ", "os": "", "cpi": "", "cid": ""},
            {"name": "s", "version": "1.2.3*+", "os": "", "cpi": "", "cid": "c3"}
        ])))
        .unwrap();
        assert_eq!(
            rows,
            vec![
                ("s".into(), "1.506".into(), "c1".into()),
                ("s".into(), "1.480".into(), "".into()),
                ("s".into(), "1.2.3".into(), "c3".into()),
            ]
        );
        // What bosh-cli prints for a director with no stemcells: the only empty list.
        assert_eq!(parse_rows(table(serde_json::json!([]))).unwrap(), vec![]);
    }

    #[test]
    fn director_documents_that_are_not_stemcell_lists_are_errors_naming_the_file_and_path() {
        let row =
            serde_json::json!({"name": "s", "version": "1.506*", "os": "", "cpi": "", "cid": "c"});
        let mut no_rows = table(serde_json::json!([]));
        no_rows["Tables"][0].as_object_mut().unwrap().remove("Rows");
        let mut lower_rows = no_rows.clone();
        lower_rows["Tables"][0]["rows"] = serde_json::json!([row.clone()]);
        let mut two_tables = table(serde_json::json!([row.clone()]));
        two_tables["Tables"] = serde_json::json!([
            two_tables["Tables"][0].clone(),
            two_tables["Tables"][0].clone()
        ]);
        let mut other_content = table(serde_json::json!([]));
        other_content["Tables"][0]["Content"] = serde_json::json!("deployments");
        for (doc, at) in [
            (
                serde_json::json!({"tables": []}),
                "tables: unexpected field",
            ),
            (
                serde_json::json!({"Tables": "x"}),
                "Tables: expected a list of tables",
            ),
            (
                serde_json::json!({"Tables": []}),
                "Tables: expected exactly one table",
            ),
            (
                serde_json::json!({"Tables": [{}]}),
                "Tables[0].Content: missing",
            ),
            (two_tables, "Tables: expected exactly one table"),
            (no_rows, "Tables[0].Rows: missing"),
            (lower_rows, "Tables[0].Rows: missing"),
            (
                table(serde_json::Value::Null),
                "Tables[0].Rows: expected a list",
            ),
            (
                table(serde_json::json!({})),
                "Tables[0].Rows: expected a list",
            ),
            (other_content, "Tables[0].Content: expected \"stemcells\""),
            (
                table(
                    serde_json::json!([row.clone(), {"name": "s", "os": "", "cpi": "", "cid": "c"}]),
                ),
                "Tables[0].Rows[1].version: missing",
            ),
            (
                table(
                    serde_json::json!([row.clone(), row.clone(), {"name": "s", "version": 1.506, "os": "", "cpi": "", "cid": "c"}]),
                ),
                "Tables[0].Rows[2].version: expected a string, found a number",
            ),
            (
                table(
                    serde_json::json!([{"name": "s", "version": "*", "os": "", "cpi": "", "cid": "c"}]),
                ),
                "Tables[0].Rows[0].version: expected a stemcell version",
            ),
            (
                table(serde_json::json!([{"name": "s", "version": "1", "os": "", "cpi": ""}])),
                "Tables[0].Rows[0].cid: missing",
            ),
            (
                table(serde_json::json!(["s"])),
                "Tables[0].Rows[0]: expected an object",
            ),
        ] {
            let err = parse_rows(doc.clone()).unwrap_err().to_string();
            assert!(
                err.starts_with(&format!(
                    "d.json is not the output of `bosh stemcells --json`: {at}"
                )),
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
