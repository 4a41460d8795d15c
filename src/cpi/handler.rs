//! Request handling: a pure plan (which method, which arguments, delegate or answer) made before
//! any Azure client exists, then the stemcell methods against the gallery service.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::protocol::{arg_object, arg_str, CpiError, ErrorType, Request};
use crate::app::context::Context;
use crate::app::delete::{Outcome as DeleteOutcome, Request as DeleteRequest};
use crate::gallery::service::Removal;
use crate::gallery::tags;
use crate::stemcell::manifest::CloudProperties;

/// The stemcell formats the Azure CPI announces; `info` answers the same when not delegating.
pub const STEMCELL_FORMATS: [&str; 2] = ["azure-vhd", "azure-light"];
/// The CPI API version spoken.
pub const API_VERSION: u64 = 2;

/// `info`'s result.
pub fn info() -> Value {
    json!({"stemcell_formats": STEMCELL_FORMATS, "api_version": API_VERSION})
}

/// A heavy stemcell to publish.
#[derive(Debug, Clone)]
pub struct CreateArgs {
    /// The extracted `image` file (the inner tgz holding root.vhd).
    pub image_path: PathBuf,
    pub name: String,
    pub version: String,
    pub cloud_properties: CloudProperties,
}

/// What to do with a request, decided without any I/O.
#[derive(Debug)]
pub enum Plan {
    /// Answer `info` ourselves.
    Info,
    CreateStemcell(Box<CreateArgs>),
    DeleteStemcell {
        cid: String,
    },
    /// `create_vm` for the delegate, with its stemcell CID first made one the delegate resolves
    /// (a CID that lives in the ledger's overflow becomes its version's sentinel).
    CreateVm {
        stemcell_cid: String,
    },
    /// Hand the request, byte for byte, to the delegate CPI.
    Delegate {
        reason: String,
    },
    /// Answer with this error.
    Refuse(CpiError),
}

/// Decide how to serve `req`. `delegating`: whether `--delegate` was given.
pub fn plan(req: &Request, delegating: bool) -> Plan {
    match req.method.as_str() {
        // With a delegate, its answer is the truth: the formats and API version of the real CPI.
        "info" if delegating => Plan::Delegate {
            reason: "info is answered by the delegate CPI, so the formats match the real CPI"
                .into(),
        },
        "info" => Plan::Info,
        "create_stemcell" => match create_args(req) {
            Ok(Some(args)) => Plan::CreateStemcell(Box::new(args)),
            Ok(None) if delegating => Plan::Delegate {
                reason: "light stemcell (a Marketplace image): no gallery is involved".into(),
            },
            Ok(None) => Plan::Refuse(CpiError::new(
                ErrorType::CloudError,
                "this is a light stemcell (cloud_properties.image names a Marketplace image): light stemcells never need a compute gallery. Run stemcell-gallery cpi with --delegate pointing at the Azure CPI's bin/cpi so the Azure CPI handles it",
                false,
            )),
            Err(e) => Plan::Refuse(e),
        },
        "delete_stemcell" => match arg_str(req, 0, "stemcell_cid") {
            Ok(cid) => Plan::DeleteStemcell {
                cid: cid.to_string(),
            },
            Err(e) => Plan::Refuse(e),
        },
        // Only a CPI-shaped CID can be one this tool recorded; anything else (a light stemcell's
        // CID, a malformed request) is the delegate's to answer.
        "create_vm" if delegating => match arg_str(req, 1, "stemcell_cid") {
            Ok(cid) if tags::is_cid(cid) => Plan::CreateVm {
                stemcell_cid: cid.to_string(),
            },
            _ => Plan::Delegate {
                reason: "create_vm is not a stemcell method".into(),
            },
        },
        other if delegating => Plan::Delegate {
            reason: format!("{other} is not a stemcell method"),
        },
        other => Plan::Refuse(CpiError::new(
            ErrorType::NotImplemented,
            format!(
                "method {other:?} is not handled by stemcell-gallery, which serves info, create_stemcell and delete_stemcell; run it with --delegate PATH (the Azure CPI's bin/cpi) to pass every other method through"
            ),
            false,
        )),
    }
}

/// The arguments of `create_stemcell`; `None` for a light stemcell.
fn create_args(req: &Request) -> Result<Option<CreateArgs>, CpiError> {
    let image_path = arg_str(req, 0, "image_path")?;
    let raw = arg_object(req, 1, "cloud_properties")?;
    // A third argument (directors at CPI API >= 3: {"tags": {...}}) must be an object when given.
    if req.arguments.get(2).is_some_and(|v| !v.is_null()) {
        arg_object(req, 2, "env")?;
    }
    let props = CloudProperties::parse_json(Value::Object(raw.clone())).map_err(|e| {
        CpiError::new(
            ErrorType::CloudError,
            format!("create_stemcell: invalid cloud_properties: {e}"),
            false,
        )
    })?;
    let light_format = raw
        .get("stemcell_formats")
        .and_then(Value::as_array)
        .is_some_and(|f| {
            f.iter()
                .any(|f| f.as_str().is_some_and(|f| f.ends_with("-light")))
        });
    if props.image.is_some() || light_format {
        return Ok(None);
    }
    let missing = |what: &str| {
        CpiError::new(
            ErrorType::CloudError,
            format!("create_stemcell: cloud_properties has no `{what}`; a heavy Azure stemcell's stemcell.MF carries cloud_properties.name and cloud_properties.version"),
            false,
        )
    };
    let name = props.name.clone().ok_or_else(|| missing("name"))?;
    let version = props.version.clone().ok_or_else(|| missing("version"))?;
    Ok(Some(CreateArgs {
        image_path: PathBuf::from(image_path),
        name,
        version,
        cloud_properties: props,
    }))
}

/// Map a failure to a CPI error: `ok_to_retry` only for transient Azure, storage or lock errors.
pub fn cloud_error(context: &str, err: &anyhow::Error) -> CpiError {
    CpiError::new(
        ErrorType::CloudError,
        crate::wiring::failure::explain(format!("{context}: {err:#}")),
        is_transient(err),
    )
}

/// Whether a retry may succeed (the classes `wiring::failure` reads, and a CPI error's own answer).
pub use super::protocol::is_transient;

/// The request bytes for the delegate's `create_vm`: unchanged when the delegate resolves
/// `stemcell_cid` itself or no gallery version records it, else with argument 1 replaced by the
/// CID the delegate resolves (REFERENCE.md: the Azure CPI looks the CID up in
/// `stemcell_references` only).
pub async fn create_vm_request(
    conn: &Context,
    input: &[u8],
    stemcell_cid: &str,
) -> Result<Option<Vec<u8>>, CpiError> {
    let resolvable = crate::app::inspect::delegate_cid(conn, stemcell_cid)
        .await
        .map_err(|e| {
            cloud_error(
                &format!("create_vm: cannot look up stemcell {stemcell_cid} in the gallery"),
                &e,
            )
        })?;
    match resolvable {
        Some(cid) if cid != stemcell_cid => {
            let mut raw: Value = serde_json::from_slice(input).map_err(|e| {
                CpiError::invalid(format!("create_vm: the request is not JSON: {e}"))
            })?;
            let Some(slot) = raw.get_mut("arguments").and_then(|a| a.get_mut(1)) else {
                return Err(CpiError::invalid("create_vm: no stemcell_cid argument"));
            };
            *slot = Value::String(cid.clone());
            tracing::info!(stemcell_cid, resolves_as = %cid, "stemcell {stemcell_cid} is held in the gallery's overflow tags; the delegate CPI resolves it as {cid}");
            serde_json::to_vec(&raw).map(Some).map_err(|e| {
                CpiError::invalid(format!("create_vm: cannot encode the request: {e}"))
            })
        }
        _ => Ok(None),
    }
}

/// What `delete_stemcell` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Deleted {
    /// Handled here (reference removed, version deleted, or kept because something uses it).
    Done(Removal),
    /// No gallery version records this CID: not ours, so the delegate CPI should handle it.
    NotOurs,
}

/// `delete_stemcell(cid)`: the delete use case by CID (`app::delete`), its outcome logged for
/// the director's debug log.
pub async fn delete_stemcell(
    conn: &Context,
    cid: &str,
    delegating: bool,
) -> Result<Deleted, CpiError> {
    let outcome = crate::app::delete::delete(conn, DeleteRequest::Cid(cid.to_string()))
        .await
        .map_err(|e| cloud_error("delete_stemcell", &e))?;
    let d = match outcome {
        DeleteOutcome::Done(d) => d,
        DeleteOutcome::NoSuchCid if delegating => {
            tracing::info!(cid, "no gallery version records stemcell {cid}; handing delete_stemcell to the delegate CPI");
            return Ok(Deleted::NotOurs);
        }
        DeleteOutcome::NoSuchCid => {
            return Err(CpiError::new(
                ErrorType::StemcellNotFound,
                format!(
                    "stemcell {cid} not found: no version in gallery {} records it (in {}, or among the references this tool keeps)",
                    conn.settings.gallery,
                    tags::CPI_REFERENCES
                ),
                false,
            ))
        }
    };
    Ok(Deleted::Done(d.removal))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpi::protocol::parse_request;

    fn req(s: &str) -> Request {
        parse_request(s.as_bytes()).unwrap()
    }

    #[test]
    fn info_is_ours_without_a_delegate_and_the_delegates_with_one() {
        assert!(matches!(
            plan(&req(r#"{"method":"info"}"#), false),
            Plan::Info
        ));
        assert!(matches!(
            plan(&req(r#"{"method":"info"}"#), true),
            Plan::Delegate { .. }
        ));
        assert_eq!(info()["stemcell_formats"][1], "azure-light");
    }

    #[test]
    fn light_stemcells_go_to_the_delegate_or_are_refused_with_the_remedy() {
        let r = req(
            r#"{"method":"create_stemcell","arguments":["/tmp/image",{"name":"bosh-azure-light","version":"1.5","image":{"publisher":"p","offer":"o","sku":"s","version":"1"}}]}"#,
        );
        assert!(matches!(plan(&r, true), Plan::Delegate { .. }));
        match plan(&r, false) {
            Plan::Refuse(e) => {
                assert_eq!(e.kind, ErrorType::CloudError);
                assert!(e.message.contains("--delegate"), "{}", e.message);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn heavy_create_needs_name_and_version() {
        let r = req(r#"{"method":"create_stemcell","arguments":["/tmp/image",{"name":"n"}]}"#);
        match plan(&r, false) {
            Plan::Refuse(e) => assert!(e.message.contains("`version`"), "{}", e.message),
            other => panic!("{other:?}"),
        }
        let r = req(
            r#"{"method":"create_stemcell","arguments":["/tmp/image",{"name":"n","version":"1.506"},{"tags":{}}]}"#,
        );
        match plan(&r, false) {
            Plan::CreateStemcell(a) => {
                assert_eq!(a.version, "1.506");
                assert_eq!(a.image_path, PathBuf::from("/tmp/image"));
            }
            other => panic!("{other:?}"),
        }
        let r = req(
            r#"{"method":"create_stemcell","arguments":["/tmp/image",{"name":"n","version":"1"},"x"]}"#,
        );
        assert!(matches!(plan(&r, false), Plan::Refuse(e) if e.kind == ErrorType::InvalidCall));
    }

    #[test]
    fn other_methods_are_delegated_or_not_implemented() {
        let r = req(r#"{"method":"create_vm","arguments":[]}"#);
        assert!(matches!(plan(&r, true), Plan::Delegate { .. }));
        assert!(matches!(plan(&r, false), Plan::Refuse(e) if e.kind == ErrorType::NotImplemented));
    }

    #[test]
    fn only_transient_failures_may_be_retried() {
        let e: anyhow::Error = crate::gallery::Error::Transport {
            operation: "get",
            resource: "v".into(),
            message: "reset".into(),
        }
        .into();
        assert!(cloud_error("x", &e).ok_to_retry);
        let e: anyhow::Error = crate::gallery::Error::Conflict("different".into()).into();
        assert!(!cloud_error("x", &e).ok_to_retry);
        assert!(!cloud_error("x", &anyhow::anyhow!("plain")).ok_to_retry);
    }
}
