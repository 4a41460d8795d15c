//! A director's stemcell list, as `bosh stemcells --json` prints it.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::strict::{join, kind, read_json, Strict};
use super::{Evidence, FileKind, HeldStemcell, SourceError, UsageSource};

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
    /// Whose list it is, when the operator said (`--director-stemcells HOLDER=FILE`).
    pub holder: Option<String>,
}

impl DirectorStemcellsFile {
    const WHAT: &'static str = "the output of `bosh stemcells --json`";

    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            holder: None,
        }
    }

    /// The list of `holder`'s stemcells.
    pub fn with_holder(mut self, holder: Option<String>) -> Self {
        self.holder = holder;
        self
    }

    /// Read the list: `(name, version, cid)` per row, as `bosh stemcells --json` wrote them
    /// (the version keeps its `*` mark when deployed).
    pub async fn rows(&self) -> Result<Vec<(String, String, String)>, SourceError> {
        let doc = read_json(&self.path, Self::WHAT).await?;
        Self::parse(&self.path, &doc)
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
        FileKind::DirectorStemcells.source_name(&self.path, self.holder.as_deref())
    }

    async fn collect(&self) -> Result<Evidence, SourceError> {
        let doc = read_json(&self.path, Self::WHAT).await?;
        let file = self.path.display().to_string();
        let mut claims = Vec::new();
        for (name, version, cid) in Self::parse(&self.path, &doc)? {
            let held = HeldStemcell { name, version, cid };
            claims.extend(FileKind::DirectorStemcells.claims(&self.name(), &file, held, None));
        }
        Ok(Evidence {
            source: self.name(),
            claims,
            holder: self.holder.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
