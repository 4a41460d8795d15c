//! Wire mapping: the JSON bodies this adapter sends (definition and version creates, target
//! regions) and the fields it reads back from Azure's answers (definitions, versions with their
//! replication status, consumers' image references). Exactly the fields we send or read; the
//! REST shapes are those of the Compute gallery spec (api 2023-07-03) and ComputeRP/DiskRP
//! (api 2024-07-01) as `azure_mgmt_compute` 0.21 models them.

use std::collections::BTreeMap;

use futures::StreamExt;
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::gallery::error::{Error, Result};
use crate::gallery::latest::ImageRef;
use crate::gallery::model::*;

pub(super) fn sdk_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// Every item of a paged SDK list (following `nextLink`), as JSON.
pub(super) async fn all_pages<P, T: serde::Serialize>(
    mut pages: azure_core_legacy::Pageable<P, azure_core_legacy::Error>,
    items: fn(P) -> Vec<T>,
) -> azure_core_legacy::Result<Vec<Value>> {
    let mut out = Vec::new();
    while let Some(page) = pages.next().await {
        out.extend(items(page?).iter().map(sdk_json));
    }
    Ok(out)
}

pub(super) async fn body_json(
    resp: azure_core_legacy::Response,
) -> azure_core_legacy::Result<Value> {
    let bytes = resp.into_body().collect().await?;
    Ok(serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

pub(super) fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str()
}

pub(super) fn tags_of(v: &Value) -> BTreeMap<String, String> {
    v.get("tags")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// Map an image version's JSON (as Azure returns it) to the domain type.
pub fn version_from_json(v: &Value) -> ImageVersion {
    let id = str_at(v, &["id"]).unwrap_or_default().to_string();
    let definition = id
        .split("/images/")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap_or_default()
        .to_string();
    let p = v.get("properties").cloned().unwrap_or(Value::Null);
    let pp = p.get("publishingProfile").cloned().unwrap_or(Value::Null);
    let src = p
        .pointer("/storageProfile/osDiskImage/source")
        .cloned()
        .unwrap_or(Value::Null);
    let target_regions = pp
        .get("targetRegions")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|r| TargetRegion {
                    name: str_at(r, &["name"]).unwrap_or_default().to_string(),
                    replicas: r
                        .get("regionalReplicaCount")
                        .and_then(Value::as_u64)
                        .map(|n| n as u32),
                    storage_account_type: str_at(r, &["storageAccountType"]).map(str::to_string),
                    exclude_from_latest: r.get("excludeFromLatest").and_then(Value::as_bool),
                })
                .collect()
        })
        .unwrap_or_default();
    let replication = p.get("replicationStatus").map(|r| ReplicationStatus {
        aggregated_state: str_at(r, &["aggregatedState"])
            .unwrap_or("Unknown")
            .to_string(),
        summary: r
            .get("summary")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .map(|s| RegionReplication {
                        region: str_at(s, &["region"]).unwrap_or_default().to_string(),
                        state: str_at(s, &["state"]).unwrap_or("Unknown").to_string(),
                        progress: s.get("progress").and_then(Value::as_u64).map(|n| n as u32),
                        details: str_at(s, &["details"]).map(str::to_string),
                    })
                    .collect()
            })
            .unwrap_or_default(),
    });
    ImageVersion {
        version: str_at(v, &["name"]).unwrap_or_default().to_string(),
        definition,
        id,
        location: str_at(v, &["location"]).unwrap_or_default().to_string(),
        provisioning_state: ProvisioningState::parse(
            str_at(&p, &["provisioningState"]).unwrap_or("Unknown"),
        ),
        tags: tags_of(v),
        source_uri: str_at(&src, &["uri"]).map(str::to_string),
        storage_account_id: str_at(&src, &["storageAccountId"]).map(str::to_string),
        published_date: str_at(&pp, &["publishedDate"]).and_then(|s| {
            OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
        }),
        target_regions,
        exclude_from_latest: pp
            .get("excludeFromLatest")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        replication,
    }
}

/// Map an image definition's JSON to the domain type.
pub fn definition_from_json(v: &Value) -> ImageDefinition {
    let p = v.get("properties").cloned().unwrap_or(Value::Null);
    let features = p
        .get("features")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| {
                    Some((
                        str_at(f, &["name"])?.to_string(),
                        str_at(f, &["value"]).unwrap_or_default().to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    ImageDefinition {
        id: str_at(v, &["id"]).unwrap_or_default().to_string(),
        name: str_at(v, &["name"]).unwrap_or_default().to_string(),
        location: str_at(v, &["location"]).unwrap_or_default().to_string(),
        publisher: str_at(&p, &["identifier", "publisher"])
            .unwrap_or_default()
            .to_string(),
        offer: str_at(&p, &["identifier", "offer"])
            .unwrap_or_default()
            .to_string(),
        sku: str_at(&p, &["identifier", "sku"])
            .unwrap_or_default()
            .to_string(),
        os_type: str_at(&p, &["osType"]).unwrap_or_default().to_string(),
        os_state: str_at(&p, &["osState"]).unwrap_or_default().to_string(),
        architecture: str_at(&p, &["architecture"]).map(str::to_string),
        generation: str_at(&p, &["hyperVGeneration"]).map(str::to_string),
        features,
        tags: tags_of(v),
        provisioning_state: ProvisioningState::parse(
            str_at(&p, &["provisioningState"]).unwrap_or("Unknown"),
        ),
    }
}

/// One `publishingProfile.targetRegions` entry (the REST shape).
pub(super) fn region_json(r: &TargetRegion) -> Value {
    let mut o = json!({"name": r.name});
    if let Some(n) = r.replicas {
        o["regionalReplicaCount"] = json!(n);
    }
    if let Some(t) = &r.storage_account_type {
        o["storageAccountType"] = json!(t);
    }
    if let Some(x) = r.exclude_from_latest {
        o["excludeFromLatest"] = json!(x);
    }
    o
}

/// The JSON body of a new image version (the REST shape).
pub fn version_body(spec: &VersionSpec) -> Value {
    let regions: Vec<Value> = spec.target_regions.iter().map(region_json).collect();
    let mut publishing = json!({
        "targetRegions": regions,
        "excludeFromLatest": spec.exclude_from_latest,
    });
    if let Some(n) = spec.replica_count {
        publishing["replicaCount"] = json!(n);
    }
    if let Some(eol) = &spec.end_of_life {
        publishing["endOfLifeDate"] = json!(eol);
    }
    json!({
        "location": spec.location,
        "tags": spec.tags,
        "properties": {
            "publishingProfile": publishing,
            "storageProfile": {
                "osDiskImage": {
                    "hostCaching": "ReadWrite",
                    "source": {"uri": spec.source_uri, "storageAccountId": spec.storage_account_id}
                }
            }
        }
    })
}

/// The JSON body of a new image definition.
pub fn definition_body(spec: &DefinitionSpec) -> Value {
    let features: Vec<Value> = spec
        .features
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    json!({
        "location": spec.location,
        "tags": spec.tags,
        "properties": {
            "osType": "Linux",
            "osState": "Generalized",
            "hyperVGeneration": spec.generation.as_azure(),
            "architecture": spec.architecture.as_azure(),
            "identifier": {"publisher": spec.publisher, "offer": spec.offer, "sku": spec.sku},
            "features": features,
        }
    })
}

pub(super) fn from_value<T: serde::de::DeserializeOwned>(v: Value, what: &str) -> Result<T> {
    serde_json::from_value(v).map_err(|e| Error::RequestBuild {
        what: what.to_string(),
        message: e.to_string(),
    })
}

/// The gallery image references a consumer records at `base` (an `imageReference` or a disk's
/// `creationData.galleryImageReference` / `creationData.imageReference`): `id` (a version, a
/// definition for `latest`, `.../versions/latest`), `sharedGalleryImageId` and
/// `communityGalleryImageId` — the three forms of ComputeRP's `ImageReference` and DiskRP's
/// `ImageDiskReference` (azure-rest-api-specs, api 2024-07-01; `azure_mgmt_compute` 0.21 models).
/// `exactVersion` is read-only and set by Azure when `latest` was asked for (ComputeRP
/// `ImageReference.exactVersion`). Anything that is not a gallery image (a managed or Marketplace
/// image) is skipped.
pub(super) fn consumers_at(kind: ConsumerKind, v: &Value, base: &str, out: &mut Vec<Consumer>) {
    let Some(reference) = v.pointer(base) else {
        return;
    };
    let id = str_at(v, &["id"]).unwrap_or_default();
    let location = str_at(v, &["location"])
        .map(str::to_string)
        .filter(|l| !l.trim().is_empty());
    let exact_version = reference
        .get("exactVersion")
        .and_then(Value::as_str)
        .map(str::to_string)
        .filter(|e| !e.trim().is_empty());
    for field in ["id", "sharedGalleryImageId", "communityGalleryImageId"] {
        let Some(image) = reference.get(field).and_then(Value::as_str) else {
            continue;
        };
        if ImageRef::parse(image).is_none() {
            continue;
        }
        out.push(Consumer {
            kind: kind.clone(),
            id: id.to_string(),
            image_id: image.to_string(),
            location: location.clone(),
            exact_version: exact_version.clone(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use azure_mgmt_compute::package_2024_07_01::models;

    #[test]
    fn version_body_round_trips_through_the_sdk_model() {
        let spec = VersionSpec {
            definition: "d".into(),
            version: "1.506.0".into(),
            location: "westeurope".into(),
            source_uri: "https://a.blob.core.windows.net/stemcell/x.vhd".into(),
            storage_account_id:
                "/subscriptions/s/resourceGroups/r/providers/Microsoft.Storage/storageAccounts/a"
                    .into(),
            target_regions: vec![TargetRegion {
                name: "westeurope".into(),
                replicas: Some(3),
                storage_account_type: Some("Standard_ZRS".into()),
                exclude_from_latest: None,
            }],
            replica_count: Some(3),
            exclude_from_latest: false,
            end_of_life: None,
            tags: BTreeMap::from([("image_sha256".to_string(), "ab".to_string())]),
        };
        let model: models::GalleryImageVersion = from_value(version_body(&spec), "v").unwrap();
        let back = sdk_json(&model);
        assert_eq!(
            back.pointer("/properties/storageProfile/osDiskImage/source/uri"),
            Some(&json!(spec.source_uri))
        );
        assert_eq!(
            back.pointer("/properties/publishingProfile/targetRegions/0/storageAccountType"),
            Some(&json!("Standard_ZRS"))
        );
        assert_eq!(back.pointer("/tags/image_sha256"), Some(&json!("ab")));
    }
}
