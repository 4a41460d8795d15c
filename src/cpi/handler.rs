//! Request handling: a pure plan (which method, which arguments, delegate or answer) made before
//! any Azure client exists, then the stemcell methods against the gallery service.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::protocol::{arg_object, arg_str, CpiError, ErrorType, Request};
use crate::cli::connect::Connected;
use crate::gallery::model::{ConsumerKind, ImageVersion, ProvisioningState};
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
        crate::azure::tls::explain(format!("{context}: {err:#}")),
        is_transient(err),
    )
}

/// Whether any typed error in the chain says a retry may succeed.
pub fn is_transient(err: &anyhow::Error) -> bool {
    // A certificate verification failure is never transient, whichever layer reports it.
    if crate::azure::tls::is_certificate_failure(&format!("{err:#}")) {
        return false;
    }
    err.chain().any(|cause| {
        if let Some(e) = cause.downcast_ref::<crate::gallery::Error>() {
            return e.is_transient();
        }
        if let Some(e) = cause.downcast_ref::<crate::azure::blob::BlobError>() {
            return e.is_transient();
        }
        if let Some(e) = cause.downcast_ref::<crate::azure::lock::LockError>() {
            return e.is_transient();
        }
        false
    })
}

/// The request bytes for the delegate's `create_vm`: unchanged when the delegate resolves
/// `stemcell_cid` itself or no gallery version records it, else with argument 1 replaced by the
/// CID the delegate resolves (REFERENCE.md: the Azure CPI looks the CID up in
/// `stemcell_references` only).
pub async fn create_vm_request(
    conn: &Connected,
    input: &[u8],
    stemcell_cid: &str,
) -> Result<Option<Vec<u8>>, CpiError> {
    let resolvable = conn
        .service
        .cpi_resolvable(stemcell_cid)
        .await
        .map_err(|e| {
            cloud_error(
                &format!("create_vm: cannot look up stemcell {stemcell_cid} in the gallery"),
                &e.into(),
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

/// `delete_stemcell(cid)`: remove the reference; the version goes only when nothing uses it; its
/// blob goes only when the version went and no other version is made from that blob.
pub async fn delete_stemcell(
    conn: &Connected,
    cid: &str,
    delegating: bool,
) -> Result<Deleted, CpiError> {
    let version = conn
        .service
        .lookup_by_reference(cid)
        .await
        .map_err(|e| cloud_error("delete_stemcell: cannot search the gallery", &e.into()))?;
    let Some(version) = version else {
        if delegating {
            tracing::info!(cid, "no gallery version records stemcell {cid}; handing delete_stemcell to the delegate CPI");
            return Ok(Deleted::NotOurs);
        }
        return Err(CpiError::new(
            ErrorType::StemcellNotFound,
            format!(
                "stemcell {cid} not found: no version in gallery {} records it in its {} tag",
                conn.settings.gallery,
                tags::CPI_REFERENCES
            ),
            false,
        ));
    };
    tracing::info!(cid, version = %version.id, "stemcell {cid} is gallery version {}", version.id);
    let removal = conn
        .service
        .remove_reference(&version.definition, &version.version, Some(cid))
        .await
        .map_err(|e| cloud_error("delete_stemcell", &e.into()))?;
    match &removal {
        Removal::ReferenceRemoved { remaining } => tracing::info!(
            cid,
            "reference {cid} removed; version {} stays for its other references: {}",
            version.id,
            remaining.join(", ")
        ),
        Removal::KeptInUse { consumers } => {
            for c in consumers {
                tracing::info!(
                    cid,
                    consumer = %c.id,
                    "version {} kept: {} {} was created from it and still uses it (deleting it would make that {} impossible to recreate)",
                    version.id,
                    kind_name(&c.kind),
                    c.id,
                    kind_name(&c.kind)
                );
            }
        }
        Removal::Deleted => {
            tracing::info!(
                cid,
                "version {} deleted: no reference remains and no VM, scale set or disk uses it",
                version.id
            );
            delete_source_blob(conn, &version).await.map_err(|e| {
                cloud_error(
                    "delete_stemcell: the version was deleted, but not its blob",
                    &e,
                )
            })?;
        }
        Removal::KeptUnproven { why } => tracing::warn!(
            cid,
            "reference {cid} removed; version {} kept because non-use cannot be proven: {why}",
            version.id
        ),
        Removal::NotFound => {
            tracing::info!(
                cid,
                "version {} disappeared meanwhile; nothing left to delete",
                version.id
            )
        }
    }
    // Last, as the Azure CPI does: the CID's own blob (the reference is already removed).
    delete_cid_blob(conn, cid).await;
    Ok(Deleted::Done(removal))
}

/// The Azure CPI's last step of delete_stemcell: delete the CID's own blob `<cid>.vhd` in the
/// `stemcell` container (REFERENCE.md, "How the Azure CPI uses a compute gallery": "Then
/// deletes blob `<cid>.vhd`"; a Succeeded gallery version does not need its source blob). Only
/// for a CID of the shape `bosh-stemcell-<uuid>`, and never while a version of the gallery that
/// is not Succeeded (Creating, Updating, Failed, ...) names that blob as its source. Never fails
/// the caller: the reference is already removed; a failure is logged as a warning. `None` when
/// nothing was attempted (not a CID, or no storage account).
pub async fn delete_cid_blob(conn: &Connected, cid: &str) -> Option<BlobOutcome> {
    use crate::azure::blob::{is_stemcell_cid, STEMCELL_CONTAINER};
    if !is_stemcell_cid(cid) {
        return None;
    }
    let Some(storage) = conn.storage.as_ref() else {
        tracing::warn!(
            cid,
            "no storage account configured: the blob {cid}.vhd (if any) was left in place"
        );
        return None;
    };
    let name = format!("{cid}.vhd");
    let uri = storage.blob_url(STEMCELL_CONTAINER, &name);
    let names_it = |u: &str| {
        split_blob_uri(storage.endpoint(), u)
            .is_some_and(|(c, b)| c == STEMCELL_CONTAINER && b == name)
    };
    let listed = match conn.service.list().await {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(cid, error = %e, "cannot list the gallery's versions to check that none is being made from {name}; the blob was kept");
            return None;
        }
    };
    let users: Vec<String> = listed
        .into_iter()
        .flat_map(|(_, versions)| versions)
        .filter(|v| v.provisioning_state != ProvisioningState::Succeeded)
        .filter(|v| {
            v.source_uri.as_deref().is_some_and(names_it)
                || v.tags.get(tags::SOURCE_BLOB).is_some_and(|u| names_it(u))
        })
        .map(|v| format!("{} ({})", v.id, v.provisioning_state.as_str()))
        .collect();
    let outcome = if !users.is_empty() {
        BlobOutcome::KeptForVersions {
            uri,
            versions: users,
        }
    } else {
        let client = storage.container(STEMCELL_CONTAINER).blob_client(&name);
        match crate::azure::blob::delete_blob_if_exists(&client).await {
            Ok(true) => BlobOutcome::Deleted { uri },
            Ok(false) => BlobOutcome::AlreadyGone { uri },
            Err(e) => {
                tracing::warn!(cid, error = %e, "could not delete the stemcell's blob {name}; it was left in place (delete it by hand once no version is being made from it)");
                return None;
            }
        }
    };
    tracing::info!(cid, "the stemcell's own {}", outcome.describe());
    Some(outcome)
}

fn kind_name(k: &ConsumerKind) -> &'static str {
    match k {
        ConsumerKind::VirtualMachine => "VM",
        ConsumerKind::ScaleSet => "scale set",
        ConsumerKind::ScaleSetInstance => "scale-set VM",
        ConsumerKind::Disk => "disk",
    }
}

/// What became of a deleted version's source blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobOutcome {
    /// The version recorded no `source_blob`.
    NoneRecorded,
    /// No storage account is configured: the blob was left in place.
    NoStorage {
        uri: String,
    },
    /// The blob is not in the configured storage account: left in place.
    OtherAccount {
        uri: String,
    },
    /// Other versions are made from it: kept.
    KeptForVersions {
        uri: String,
        versions: Vec<String>,
    },
    Deleted {
        uri: String,
    },
    AlreadyGone {
        uri: String,
    },
}

impl BlobOutcome {
    /// `deleted`, `kept`, `already-gone`, `left` (not ours to delete) or `none`.
    pub fn result(&self) -> &'static str {
        match self {
            BlobOutcome::NoneRecorded => "none",
            BlobOutcome::NoStorage { .. } | BlobOutcome::OtherAccount { .. } => "left",
            BlobOutcome::KeptForVersions { .. } => "kept",
            BlobOutcome::Deleted { .. } => "deleted",
            BlobOutcome::AlreadyGone { .. } => "already-gone",
        }
    }

    pub fn uri(&self) -> Option<&str> {
        match self {
            BlobOutcome::NoneRecorded => None,
            BlobOutcome::NoStorage { uri }
            | BlobOutcome::OtherAccount { uri }
            | BlobOutcome::KeptForVersions { uri, .. }
            | BlobOutcome::Deleted { uri }
            | BlobOutcome::AlreadyGone { uri } => Some(uri),
        }
    }

    /// One sentence for logs and human output (the blob's URI with any query redacted).
    pub fn describe(&self) -> String {
        let shown = self.uri().map(crate::redact::uri).unwrap_or_default();
        match self {
            BlobOutcome::NoneRecorded => {
                "the version records no source_blob; no blob deleted".into()
            }
            BlobOutcome::NoStorage { .. } => {
                format!("no storage account configured; the blob {shown} was left in place")
            }
            BlobOutcome::OtherAccount { .. } => {
                format!("the blob {shown} is not in the configured storage account; left in place")
            }
            BlobOutcome::KeptForVersions { versions, .. } => format!(
                "blob {shown} kept: versions {} are made from it",
                versions.join(", ")
            ),
            BlobOutcome::Deleted { .. } => format!("blob {shown} deleted"),
            BlobOutcome::AlreadyGone { .. } => format!("blob {shown} was already gone"),
        }
    }
}

/// Delete the deleted version's blob (its `source_blob` tag) unless another version is made from
/// it: the rule of `delete_stemcell`, shared with the CLI's `delete`.
pub async fn delete_source_blob(
    conn: &Connected,
    deleted: &ImageVersion,
) -> anyhow::Result<BlobOutcome> {
    let outcome = source_blob_outcome(conn, deleted).await?;
    match &outcome {
        BlobOutcome::NoStorage { .. } | BlobOutcome::OtherAccount { .. } => {
            tracing::warn!(version = %deleted.id, "{}", outcome.describe())
        }
        _ => tracing::info!(version = %deleted.id, "{}", outcome.describe()),
    }
    Ok(outcome)
}

async fn source_blob_outcome(
    conn: &Connected,
    deleted: &ImageVersion,
) -> anyhow::Result<BlobOutcome> {
    let Some(uri) = deleted.tags.get(tags::SOURCE_BLOB).cloned() else {
        return Ok(BlobOutcome::NoneRecorded);
    };
    let Some(storage) = conn.storage.as_ref() else {
        return Ok(BlobOutcome::NoStorage { uri });
    };
    let Some((container, blob)) = split_blob_uri(storage.endpoint(), &uri) else {
        return Ok(BlobOutcome::OtherAccount { uri });
    };
    let users: Vec<String> = conn
        .service
        .list()
        .await?
        .into_iter()
        .flat_map(|(_, versions)| versions)
        .filter(|v| v.id != deleted.id)
        .filter(|v| {
            v.tags.get(tags::SOURCE_BLOB).map(String::as_str) == Some(uri.as_str())
                || v.source_uri.as_deref() == Some(uri.as_str())
        })
        .map(|v| v.id)
        .collect();
    if !users.is_empty() {
        return Ok(BlobOutcome::KeptForVersions {
            uri,
            versions: users,
        });
    }
    let client = storage.container(&container).blob_client(&blob);
    if crate::azure::blob::delete_blob_if_exists(&client).await? {
        Ok(BlobOutcome::Deleted { uri })
    } else {
        Ok(BlobOutcome::AlreadyGone { uri })
    }
}

/// `(container, blob)` of a blob URI in the account at `endpoint`.
pub fn split_blob_uri(endpoint: &str, uri: &str) -> Option<(String, String)> {
    let base = endpoint.trim_end_matches('/');
    let rest = uri.strip_prefix(base)?.strip_prefix('/')?;
    let rest = rest.split(['?', '#']).next()?;
    let (container, blob) = rest.split_once('/')?;
    if container.is_empty() || blob.is_empty() {
        return None;
    }
    let blob = percent_decode(blob)?;
    Some((container.to_string(), blob))
}

/// Decode `%XX` sequences (blob names from other tools may be escaped in a URI).
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
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
    fn blob_uris_split_into_container_and_name() {
        let ep = "http://127.0.0.1:10000/devstoreaccount1";
        assert_eq!(
            split_blob_uri(ep, &format!("{ep}/stemcell/bosh-stemcell-1.vhd")),
            Some(("stemcell".into(), "bosh-stemcell-1.vhd".into()))
        );
        assert_eq!(
            split_blob_uri(ep, "https://other.blob.core.windows.net/stemcell/x.vhd"),
            None
        );
        assert_eq!(split_blob_uri(ep, &format!("{ep}/stemcell")), None);
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
