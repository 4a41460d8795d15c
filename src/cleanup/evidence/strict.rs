//! A strict reader of the JSON documents bosh writes: every complaint names the file, what it
//! should have been, the path inside it and what was expected there.

use std::path::Path;

use serde_json::Value;

use super::SourceError;

pub(super) async fn read_json(path: &Path, what: &'static str) -> Result<Value, SourceError> {
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
pub(super) fn kind(v: &Value) -> &'static str {
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
pub(super) struct Strict<'a> {
    pub(super) file: &'a Path,
    pub(super) what: &'static str,
}

impl Strict<'_> {
    pub(super) fn bad(&self, at: &str, message: impl std::fmt::Display) -> SourceError {
        SourceError::Malformed {
            path: self.file.to_path_buf(),
            what: self.what,
            message: format!("{at}: {message}"),
        }
    }

    pub(super) fn object<'v>(
        &self,
        v: &'v Value,
        at: &str,
    ) -> Result<&'v serde_json::Map<String, Value>, SourceError> {
        v.as_object()
            .ok_or_else(|| self.bad(at, format!("expected an object, found {}", kind(v))))
    }

    /// The keys of `obj` must all be in `known` (the fields bosh writes there).
    pub(super) fn only_keys(
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

    pub(super) fn required<'v>(
        &self,
        obj: &'v serde_json::Map<String, Value>,
        at: &str,
        key: &str,
        expected: &str,
    ) -> Result<&'v Value, SourceError> {
        obj.get(key)
            .ok_or_else(|| self.bad(&join(at, key), format!("missing; expected {expected}")))
    }

    pub(super) fn string<'v>(&self, v: &'v Value, at: &str) -> Result<&'v str, SourceError> {
        v.as_str()
            .ok_or_else(|| self.bad(at, format!("expected a string, found {}", kind(v))))
    }

    /// `null` or a list of strings (Go marshals a nil slice as `null`).
    pub(super) fn strings_or_null(&self, v: Option<&Value>, at: &str) -> Result<(), SourceError> {
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

pub(super) fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}
