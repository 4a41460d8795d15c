//! Gallery image versions: the properties a PUT gives (storage profile and its source,
//! publishing profile and target regions with Azure's defaults, what may not change), the
//! check of the source's storage account, and what the create's completion finds wrong with a
//! source blob in the emulator's own store.

use serde_json::{json, Value};

use super::render::{bad, conflict, ArmError};
use super::router::Ctx;
use super::storage::{storage_account_parts, storage_accounts_in};
use super::{eq, norm_location, now_rfc3339, str_at};
use crate::devstore::DEV_ACCOUNT;
use crate::emulator::store::{Content, Data, Resource};
use crate::emulator::State;

pub(super) fn valid_version_name(name: &str) -> bool {
    let parts: Vec<&str> = name.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<i32>().is_ok()
        })
}

/// Where a version's source is named (a VHD's uri and account, a managed image or snapshot).
const SOURCES: [&str; 5] = [
    "/storageProfile/osDiskImage/source/uri",
    "/storageProfile/osDiskImage/source/storageAccountId",
    "/storageProfile/osDiskImage/source/id",
    "/storageProfile/source/id",
    "/storageProfile/source/virtualMachineId",
];

pub(super) fn version_properties(
    ctx: &Ctx,
    data: &Data,
    mut props: Value,
    location: &str,
    existing: Option<&Resource>,
) -> Result<Value, ArmError> {
    let old = existing.and_then(|r| r.body.get("properties").cloned());
    // Storage profile: required when new; an update may omit it or send one that names no
    // source (kept: the Azure CPI's `create_vm` sends `storageProfile: {}`, REFERENCE.md "Azure
    // as recorded", "Tags"), but may not change it.
    let names_a_source = |sp: &Value| {
        SOURCES
            .iter()
            .any(|ptr| sp.pointer(&ptr["/storageProfile".len()..]).is_some())
    };
    if !props.get("storageProfile").is_some_and(names_a_source) {
        match &old {
            Some(o) => props["storageProfile"] = o["storageProfile"].clone(),
            None if props.get("storageProfile").is_some() => {}
            None => {
                return Err(bad(
                    "InvalidParameter",
                    "Required parameter 'storageProfile' is missing (null).",
                )
                .target("galleryImageVersion.properties.storageProfile"))
            }
        }
    }
    let src_uri = str_at(&props, "/storageProfile/osDiskImage/source/uri").map(String::from);
    let has_source = src_uri.is_some()
        || str_at(&props, "/storageProfile/osDiskImage/source/id").is_some()
        || str_at(&props, "/storageProfile/source/id").is_some()
        || str_at(&props, "/storageProfile/source/virtualMachineId").is_some();
    if !has_source {
        return Err(bad(
            "InvalidParameter",
            "The gallery image version needs a source: storageProfile.osDiskImage.source.uri (a VHD) or storageProfile.source.id.",
        )
        .target("galleryImageVersion.properties.storageProfile"));
    }
    if let Some(uri) = &src_uri {
        if url::Url::parse(uri).is_err() {
            return Err(bad(
                "InvalidParameter",
                &format!("The source uri '{uri}' is not a valid URL."),
            )
            .target("galleryImageVersion.properties.storageProfile.osDiskImage.source.uri"));
        }
    }
    if let (Some(uri), None) = (&src_uri, &old) {
        check_source_account(&ctx.state, data, &props, uri)?;
    }
    if let Some(o) = &old {
        for (ptr, target, ci) in [
            (
                SOURCES[0],
                "galleryImageVersion.properties.storageProfile.osDiskImage.source.uri",
                false,
            ),
            (
                SOURCES[1],
                "galleryImageVersion.properties.storageProfile.osDiskImage.source.uri",
                true,
            ),
            (
                SOURCES[2],
                "galleryImageVersion.properties.storageProfile.osDiskImage.source.id",
                true,
            ),
            (
                SOURCES[3],
                "galleryImageVersion.properties.storageProfile.source.id",
                true,
            ),
        ] {
            let before = str_at(o, ptr).unwrap_or("");
            let after = str_at(&props, ptr).unwrap_or("");
            let same = if ci {
                before.eq_ignore_ascii_case(after)
            } else {
                before == after
            };
            if !same {
                return Err(conflict(
                    "PropertyChangeNotAllowed",
                    &format!("Changing property '{target}' is not allowed."),
                )
                .target(target));
            }
        }
    }
    // Publishing profile with Azure's defaults. An update keeps what it does not send: a PUT
    // without `publishingProfile`, or with one that leaves out `replicaCount` or
    // `targetRegions`, keeps the replicas and regions (REFERENCE.md "Azure as recorded",
    // "Tags": the Azure CPI's reuse sends `PUT {location, tags}` and relies on them staying).
    let mut pp = props
        .get("publishingProfile")
        .cloned()
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    if let Some(kept) = old
        .as_ref()
        .and_then(|o| o.get("publishingProfile"))
        .and_then(Value::as_object)
    {
        for (k, v) in kept {
            if pp.get(k).is_none() {
                pp[k] = v.clone();
            }
        }
    }
    let replicas = pp.get("replicaCount").and_then(Value::as_i64).unwrap_or(1);
    if !(1..=100).contains(&replicas) {
        return Err(bad(
            "InvalidParameter",
            "The replica count must be between 1 and 100.",
        )
        .target("galleryImageVersion.properties.publishingProfile.replicaCount"));
    }
    let sat = str_at(&pp, "/storageAccountType")
        .unwrap_or("Standard_LRS")
        .to_string();
    pp["replicaCount"] = json!(replicas);
    pp["storageAccountType"] = json!(sat);
    if pp.get("excludeFromLatest").is_none() {
        pp["excludeFromLatest"] = json!(false);
    }
    if pp.get("replicationMode").is_none() {
        pp["replicationMode"] = json!("Full");
    }
    let mut regions = pp
        .get("targetRegions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if regions.is_empty() {
        regions.push(json!({"name": location}));
    }
    target_regions(&mut regions, &json!(replicas), &sat)?;
    pp["targetRegions"] = json!(regions);
    let published = old
        .as_ref()
        .and_then(|o| o.pointer("/publishingProfile/publishedDate").cloned())
        .unwrap_or_else(|| json!(now_rfc3339(&ctx.state)));
    pp["publishedDate"] = published;
    if let Some(o) = &old {
        let before = str_at(o, "/publishingProfile/replicationMode").unwrap_or("Full");
        let after = str_at(&pp, "/replicationMode").unwrap_or("Full");
        if !before.eq_ignore_ascii_case(after) {
            return Err(conflict(
                "PropertyChangeNotAllowed",
                "Changing property 'galleryImageVersion.properties.publishingProfile.replicationMode' is not allowed.",
            )
            .target("galleryImageVersion.properties.publishingProfile.replicationMode"));
        }
    }
    props["publishingProfile"] = pp;
    let sent = props.get("safetyProfile").cloned();
    super::safety::on_write(
        &ctx.api_version,
        sent.as_ref(),
        &mut props,
        old.as_ref(),
        ctx.state.now_dt(),
    )?;
    if let Some(os) = props.pointer_mut("/storageProfile/osDiskImage") {
        if os.get("hostCaching").is_none() {
            os["hostCaching"] = json!("ReadWrite");
        }
        if os.get("sizeInGB").is_none() {
            if let Some(size) = source_blob_size_gb(&ctx.state, data, src_uri.as_deref()) {
                os["sizeInGB"] = json!(size);
            }
        }
    }
    props.as_object_mut().map(|m| m.remove("replicationStatus"));
    Ok(props)
}

/// The size in GiB (rounded up) of a source blob in this emulator's blob store, if it is there:
/// only for a uri on this emulator's own blob listener (another host's blob with the same path is
/// not the emulator's to measure).
fn source_blob_size_gb(state: &State, data: &Data, uri: Option<&str>) -> Option<u64> {
    let (account, container, blob) = own_blob(state, uri?)?;
    if account != DEV_ACCOUNT {
        return None;
    }
    let len = data
        .containers
        .get(&container)?
        .blobs
        .get(&blob)?
        .content
        .len();
    Some(len.div_ceil(1 << 30).max(1))
}

/// Check and complete a version's target regions as Azure does (REFERENCE.md "Regions"): every
/// region answered by its display name whatever the request spelled ("westeurope" → "West
/// Europe"; recorded SDK sessions of azure-libraries-for-net/-java and azure-sdk-for-python), two
/// spellings of one region refused with 400 `InvalidParameter` (terraform-provider-azurerm #7751,
/// #12332), Azure's defaults for what a region leaves out. A name missing from [`REGIONS`] is kept
/// as sent: what Azure answers for an unknown region here is unverified.
pub(super) fn target_regions(
    regions: &mut [Value],
    replicas: &Value,
    sat: &str,
) -> Result<(), ArmError> {
    let target = "galleryImageVersion.properties.publishingProfile.targetRegions";
    let mut seen: Vec<String> = Vec::new();
    for r in regions.iter_mut() {
        let Some(name) = str_at(r, "/name").map(str::to_string) else {
            return Err(bad("InvalidParameter", "Every target region needs a name.").target(target));
        };
        let key = norm_location(&name);
        if seen.contains(&key) {
            return Err(bad(
                "InvalidParameter",
                "Duplicate regions are not allowed in target publishing regions.",
            )
            .target(target));
        }
        seen.push(key.clone());
        if let Some((_, display)) = REGIONS.iter().find(|(k, _)| *k == key) {
            r["name"] = json!(display);
        }
        if r.get("regionalReplicaCount").is_none() {
            r["regionalReplicaCount"] = replicas.clone();
        }
        if r.get("storageAccountType").is_none() {
            r["storageAccountType"] = json!(sat);
        }
        if r.get("excludeFromLatest").is_none() {
            r["excludeFromLatest"] = json!(false);
        }
    }
    Ok(())
}

/// Azure public regions: the name ARM accepts and the display name it answers with
/// (`az account list-locations`).
const REGIONS: &[(&str, &str)] = &[
    ("eastus", "East US"),
    ("eastus2", "East US 2"),
    ("southcentralus", "South Central US"),
    ("westus2", "West US 2"),
    ("westus3", "West US 3"),
    ("australiaeast", "Australia East"),
    ("southeastasia", "Southeast Asia"),
    ("northeurope", "North Europe"),
    ("swedencentral", "Sweden Central"),
    ("uksouth", "UK South"),
    ("westeurope", "West Europe"),
    ("centralus", "Central US"),
    ("southafricanorth", "South Africa North"),
    ("centralindia", "Central India"),
    ("eastasia", "East Asia"),
    ("japaneast", "Japan East"),
    ("koreacentral", "Korea Central"),
    ("canadacentral", "Canada Central"),
    ("francecentral", "France Central"),
    ("germanywestcentral", "Germany West Central"),
    ("italynorth", "Italy North"),
    ("norwayeast", "Norway East"),
    ("polandcentral", "Poland Central"),
    ("spaincentral", "Spain Central"),
    ("switzerlandnorth", "Switzerland North"),
    ("uaenorth", "UAE North"),
    ("brazilsouth", "Brazil South"),
    ("israelcentral", "Israel Central"),
    ("qatarcentral", "Qatar Central"),
    ("northcentralus", "North Central US"),
    ("westus", "West US"),
    ("westcentralus", "West Central US"),
    ("japanwest", "Japan West"),
    ("koreasouth", "Korea South"),
    ("australiasoutheast", "Australia Southeast"),
    ("australiacentral", "Australia Central"),
    ("canadaeast", "Canada East"),
    ("ukwest", "UK West"),
    ("francesouth", "France South"),
    ("germanynorth", "Germany North"),
    ("norwaywest", "Norway West"),
    ("switzerlandwest", "Switzerland West"),
    ("southindia", "South India"),
    ("westindia", "West India"),
    ("mexicocentral", "Mexico Central"),
    ("newzealandnorth", "New Zealand North"),
];

/// `(account, container, blob)` of a URL into this emulator's own blob store (its blob
/// listener, path-style), `None` for any other URL.
fn own_blob(state: &State, uri: &str) -> Option<(String, String, String)> {
    let url = url::Url::parse(uri).ok()?;
    let host_port = format!("{}:{}", url.host_str()?, url.port_or_known_default()?);
    let ours = crate::emulator::lock(&state.0.blob_hosts)
        .iter()
        .any(|h| h.eq_ignore_ascii_case(&host_port));
    if !ours {
        return None;
    }
    let mut segs = url.path_segments()?;
    let account = segs.next()?.to_string();
    let container = segs.next().unwrap_or("").to_string();
    let blob: Vec<&str> = segs.collect();
    Some((
        account,
        container,
        crate::emulator::blob::percent_decode(&blob.join("/")),
    ))
}

/// What is wrong with a version's source blob in this emulator's own store, as the create
/// operation reports it (`None`: nothing, or a blob elsewhere, which the emulator cannot see):
/// the blob is missing; or it is not a fixed VHD in a page blob — a block blob, a last 512 bytes
/// without the `conectix` cookie, a disk type other than fixed (2), or a size that is not a whole
/// number of MiB plus the footer, refused with `InvalidVhd` (REFERENCE.md "Source of a version
/// from a VHD": "...Disk is expected to have cookie value 'conectix'", "...must be a multiple of
/// MiB"). Whether Azure refuses these at the PUT or in the operation is unverified for gallery
/// versions (it is synchronous for managed images), so they are checked at the same moment as
/// the missing blob: when the create completes, leaving the version Failed.
pub(super) fn missing_source_blob(state: &State, data: &Data, body: &Value) -> Option<Value> {
    let uri = body
        .pointer("/properties/storageProfile/osDiskImage/source/uri")?
        .as_str()?;
    let (account, container, blob) = own_blob(state, uri)?;
    let target = "galleryImageVersion.properties.storageProfile.osDiskImage.source.uri";
    let found = (account == DEV_ACCOUNT)
        .then(|| data.containers.get(&container)?.blobs.get(&blob))
        .flatten();
    let Some(found) = found else {
        return Some(json!({
            "code": "InvalidParameter",
            "message": format!("The source blob {uri} is not accessible. Make sure the blob exists and the storage account allows access from the gallery."),
            "target": target
        }));
    };
    let invalid =
        |message: String| Some(json!({"code": "InvalidVhd", "message": message, "target": target}));
    let size = match &found.content {
        Content::Block { .. } => {
            return invalid(format!(
                "The source blob {uri} is a block blob. A gallery image version needs a fixed VHD uploaded as a page blob."
            ))
        }
        Content::Page { size, .. } => *size,
    };
    if size < 512 {
        return invalid(format!(
            "The source blob {uri} is too small ({size} bytes) to be a VHD: Disk is expected to have cookie value 'conectix'."
        ));
    }
    let footer = found.content.read(size - 512, size - 1);
    if footer.get(..8) != Some(b"conectix".as_slice()) {
        return invalid(format!(
            "The source blob {uri} is not a VHD: Disk is expected to have cookie value 'conectix' in its footer."
        ));
    }
    let disk_type = footer
        .get(60..64)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(0);
    if disk_type != 2 {
        return invalid(format!(
            "The VHD {uri} is not a fixed VHD (disk type {disk_type}); only fixed VHDs are supported."
        ));
    }
    let virtual_size = size - 512;
    if virtual_size % (1 << 20) != 0 {
        return invalid(format!(
            "The VHD {uri} has an unsupported virtual size of {virtual_size} bytes. The size must be a multiple of MiB (1048576 bytes)."
        ));
    }
    None
}

/// A VHD source names its storage account: `storageAccountId` is required with a blob `uri`, and
/// must name the account the uri points into (azure-rest-api-specs PR #10466, the gallery team on
/// `CreateOrUpdateASimpleGalleryImageVersionWithVHD.json`: "both the storage account resource ID
/// and the vhd uri will have to be provided ... validate the storage accounts match";
/// ansible-collections/azure #2113/#2114: blob sources need `storageAccountId` + `uri`, Azure
/// answers `InvalidParameter` otherwise). An account this emulator serves (the development
/// account behind its own blob URLs, or one the world names) must be named by its real id — its
/// resource group included — as Azure resolves the id to the account. The exact messages are
/// unverified (no public recording quotes them); the code is `InvalidParameter`.
fn check_source_account(
    state: &State,
    data: &Data,
    props: &Value,
    uri: &str,
) -> Result<(), ArmError> {
    let target =
        "galleryImageVersion.properties.storageProfile.osDiskImage.source.storageAccountId";
    let given = str_at(props, "/storageProfile/osDiskImage/source/storageAccountId")
        .map(str::trim)
        .filter(|s| !s.is_empty());
    let Some(given) = given else {
        return Err(bad(
            "InvalidParameter",
            "Required parameter 'storageAccountId' is missing (null). A source blob uri needs the resource id of its storage account.",
        )
        .target(target));
    };
    let Some((sub, _, name)) = storage_account_parts(given) else {
        return Err(bad(
            "InvalidParameter",
            &format!("'{given}' is not a valid storage account resource id (/subscriptions/{{s}}/resourceGroups/{{rg}}/providers/Microsoft.Storage/storageAccounts/{{name}})."),
        )
        .target(target));
    };
    let own = own_blob(state, uri);
    let uri_account = match &own {
        Some((account, _, _)) => Some(account.clone()),
        None => url::Url::parse(uri).ok().and_then(|u| {
            u.host_str()?
                .split_once(".blob.")
                .map(|(a, _)| a.to_string())
        }),
    };
    if let Some(uri_account) = &uri_account {
        if !eq(uri_account, &name) {
            return Err(bad(
                "InvalidParameter",
                &format!("The storage account '{name}' named by storageAccountId is not the storage account '{uri_account}' of the source uri {uri}."),
            )
            .target(target));
        }
        let served: Vec<String> = storage_accounts_in(
            state,
            data,
            &format!("/subscriptions/{}", sub.to_lowercase()),
        )
        .iter()
        .filter_map(|a| a.get("id").and_then(Value::as_str).map(String::from))
        .filter(|id| storage_account_parts(id).is_some_and(|(_, _, n)| eq(&n, uri_account)))
        .collect();
        let known = own.is_some()
            || data.storage_accounts.iter().any(|a| {
                a.get("name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| eq(n, uri_account))
            });
        if known && !served.iter().any(|id| eq(id, given)) {
            return Err(bad(
                "InvalidParameter",
                &format!("The storage account '{given}' was not found. Make sure storageAccountId is the resource id of the storage account holding {uri}."),
            )
            .target(target));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_names_are_three_int32_parts() {
        assert!(valid_version_name("1.506.0"));
        assert!(valid_version_name("2147483647.0.0"));
        assert!(!valid_version_name("2147483648.0.0"));
        assert!(!valid_version_name("1.2"));
        assert!(!valid_version_name("1.2.3.4"));
        assert!(!valid_version_name("1.2.x"));
        assert!(!valid_version_name("-1.2.3"));
    }
}
