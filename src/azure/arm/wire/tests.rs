//! The wire structs on payloads written here in the shapes of the REST spec examples named in
//! `wire` (none is copied).

use super::*;
use crate::stemcell::platform::{Architecture, HyperVGeneration};
use serde_json::{json, Value};

const VERSION_ID: &str = "/subscriptions/s/resourceGroups/r/providers/Microsoft.Compute/galleries/g/images/bosh-ubuntu/versions/1.506.0";
const ACCOUNT: &str =
    "/subscriptions/s/resourceGroups/r/providers/Microsoft.Storage/storageAccounts/a";

fn to_json<T: Serialize>(v: &T) -> Value {
    serde_json::from_slice(&encode(v, "test").unwrap()).unwrap()
}

fn version_spec() -> VersionSpec {
    VersionSpec {
        definition: "bosh-ubuntu".into(),
        version: "1.506.0".into(),
        location: "westeurope".into(),
        source_uri: "https://a.blob.core.windows.net/stemcell/x.vhd".into(),
        storage_account_id: ACCOUNT.into(),
        target_regions: vec![TargetRegion {
            name: "westeurope".into(),
            replicas: Some(3),
            storage_account_type: Some("Standard_ZRS".into()),
            exclude_from_latest: None,
        }],
        replica_count: Some(3),
        exclude_from_latest: false,
        end_of_life: None,
        block_deletion_before_end_of_life: false,
        tags: BTreeMap::from([("image_sha256".to_string(), "ab".to_string())]),
    }
}

// Checked against GalleryImageVersion_Create.json (a VHD source with storageAccountId,
// targetRegions entries with regionalReplicaCount / storageAccountType).
#[test]
fn a_version_put_sends_exactly_what_we_mean() {
    let body = to_json(&version_body(&version_spec()).unwrap());
    assert_eq!(
        body,
        json!({
            "location": "westeurope",
            "tags": {"image_sha256": "ab"},
            "properties": {
                "publishingProfile": {
                    "targetRegions": [{"name": "westeurope", "regionalReplicaCount": 3, "storageAccountType": "Standard_ZRS"}],
                    "replicaCount": 3,
                    "excludeFromLatest": false
                },
                "storageProfile": {"osDiskImage": {
                    "hostCaching": "ReadWrite",
                    "source": {"uri": "https://a.blob.core.windows.net/stemcell/x.vhd", "storageAccountId": ACCOUNT}
                }},
                // Always sent: at api 2026-03-03 leaving it out would block deletion for six
                // months (REFERENCE.md "Today's Azure").
                "safetyProfile": {"blockDeletionBeforeEndOfLife": false}
            }
        })
    );
}

#[test]
fn an_end_of_life_date_is_sent_as_rfc3339_and_anything_else_is_refused() {
    let mut spec = version_spec();
    spec.end_of_life = Some("2030-01-31T00:00:00Z".into());
    let body = to_json(&version_body(&spec).unwrap());
    assert_eq!(
        body.pointer("/properties/publishingProfile/endOfLifeDate"),
        Some(&json!("2030-01-31T00:00:00Z"))
    );
    spec.end_of_life = Some("next year".into());
    assert!(matches!(
        version_body(&spec),
        Err(Error::RequestBuild { message, .. }) if message.contains("next year")
    ));
}

// Checked against GalleryImageVersion_Update.json (a PATCH of publishingProfile.targetRegions;
// storageProfile is required in GalleryImageVersionProperties).
#[test]
fn patches_carry_only_the_tags_or_only_the_target_regions() {
    let tags = BTreeMap::from([("k".to_string(), "v".to_string())]);
    assert_eq!(to_json(&tags_patch(&tags)), json!({"tags": {"k": "v"}}));
    let regions = [TargetRegion {
        name: "northeurope".into(),
        replicas: None,
        storage_account_type: None,
        exclude_from_latest: Some(true),
    }];
    assert_eq!(
        to_json(&regions_patch(&regions)),
        json!({"properties": {
            "publishingProfile": {"targetRegions": [{"name": "northeurope", "excludeFromLatest": true}]},
            "storageProfile": {}
        }})
    );
}

// Checked against GalleryImageVersion_Get_WithVhdAsSource.json and
// GalleryImageVersion_Get_WithReplicationStatus.json (display-name regions, publishedDate,
// replicationStatus.summary with progress); unknown fields (encryption, safetyProfile,
// dataDiskImages) are ignored.
#[test]
fn a_version_is_read_into_the_domain_type() {
    let body = json!({
        "id": VERSION_ID,
        "name": "1.506.0",
        "location": "West Europe",
        "tags": {"image_sha256": "ab"},
        "properties": {
            "publishingProfile": {
                "targetRegions": [
                    {"name": "West Europe", "regionalReplicaCount": 2, "storageAccountType": "Standard_LRS", "encryption": {"osDiskImage": {}}, "excludeFromLatest": false},
                    {"name": "North Europe"}
                ],
                "replicaCount": 2,
                "excludeFromLatest": true,
                "publishedDate": "2026-11-30T10:00:00.1234567+00:00",
                "storageAccountType": "Standard_LRS"
            },
            "storageProfile": {
                "osDiskImage": {"hostCaching": "ReadOnly", "source": {"uri": "https://a.blob.core.windows.net/c/x.vhd", "storageAccountId": ACCOUNT}},
                "dataDiskImages": []
            },
            "safetyProfile": {"allowDeletionOfReplicatedLocations": false},
            "provisioningState": "Succeeded",
            "replicationStatus": {
                "aggregatedState": "InProgress",
                "summary": [{"region": "West Europe", "state": "Replicating", "details": "", "progress": 40}]
            }
        }
    });
    let v: Version = decode(body.to_string().as_bytes(), "read", "v").unwrap();
    let v = version_from(v);
    assert_eq!(v.id, VERSION_ID);
    assert_eq!(v.definition, "bosh-ubuntu");
    assert_eq!(v.version, "1.506.0");
    assert_eq!(v.location, "West Europe");
    assert_eq!(v.provisioning_state, ProvisioningState::Succeeded);
    assert_eq!(v.tags["image_sha256"], "ab");
    assert_eq!(
        v.source_uri.as_deref(),
        Some("https://a.blob.core.windows.net/c/x.vhd")
    );
    assert_eq!(v.storage_account_id.as_deref(), Some(ACCOUNT));
    assert!(v.published_date.is_some());
    assert!(v.exclude_from_latest);
    assert_eq!(v.target_regions.len(), 2);
    assert_eq!(v.target_regions[0].replicas, Some(2));
    assert_eq!(v.target_regions[0].exclude_from_latest, Some(false));
    assert_eq!(v.target_regions[1].name, "North Europe");
    assert_eq!(v.target_regions[1].replicas, None);
    let r = v.replication.unwrap();
    assert_eq!(r.aggregated_state, "InProgress");
    assert_eq!(r.summary[0].progress, Some(40));
    assert_eq!(r.summary[0].state, "Replicating");
}

#[test]
fn a_version_without_properties_or_replication_reads_as_unknown() {
    let v: Version = decode(
        br#"{"id": "x", "name": "1.0.0", "properties": null}"#,
        "read",
        "v",
    )
    .unwrap();
    let v = version_from(v);
    assert_eq!(v.provisioning_state, ProvisioningState::parse("Unknown"));
    assert!(v.replication.is_none());
    assert!(v.target_regions.is_empty());
    assert!(!v.exclude_from_latest);
}

// Checked against GalleryImage_Create.json (identifier, osType, osState, hyperVGeneration;
// features as name/value pairs, architecture).
#[test]
fn a_definition_put_sends_exactly_what_we_mean() {
    let mut spec = DefinitionSpec {
        name: "bosh-ubuntu".into(),
        location: "westeurope".into(),
        publisher: "bosh".into(),
        offer: "ubuntu-jammy".into(),
        sku: "jammy".into(),
        architecture: Architecture::X64,
        generation: HyperVGeneration::V2,
        features: BTreeMap::new(),
        tags: BTreeMap::new(),
    };
    let properties = json!({
        "osType": "Linux",
        "osState": "Generalized",
        "hyperVGeneration": "V2",
        "architecture": "x64",
        "identifier": {"publisher": "bosh", "offer": "ubuntu-jammy", "sku": "jammy"}
    });
    assert_eq!(
        to_json(&definition_body(&spec)),
        json!({"location": "westeurope", "tags": {}, "properties": properties})
    );
    spec.features
        .insert("SecurityType".into(), "TrustedLaunchSupported".into());
    assert_eq!(
        to_json(&definition_body(&spec)).pointer("/properties/features"),
        Some(&json!([{"name": "SecurityType", "value": "TrustedLaunchSupported"}]))
    );
}

// Checked against GalleryImage_Get.json and GalleryImage_ListByGallery.json.
#[test]
fn a_definition_list_page_is_read_into_the_domain_type() {
    let body = json!({
        "value": [{
            "id": "/subscriptions/s/resourceGroups/r/providers/Microsoft.Compute/galleries/g/images/d",
            "name": "d",
            "location": "westeurope",
            "properties": {
                "osType": "Linux", "osState": "Generalized", "hyperVGeneration": "V2",
                "architecture": "Arm64",
                "identifier": {"publisher": "p", "offer": "o", "sku": "s"},
                "features": [{"name": "DiskControllerTypes", "value": "SCSI, NVMe"}, {"value": "nameless"}],
                "recommended": {"vCPUs": {"min": 1}},
                "provisioningState": "Creating"
            }
        }],
        "nextLink": "https://management.azure.com/next?page=2"
    });
    let page: Page<Definition> = decode(body.to_string().as_bytes(), "list", "d").unwrap();
    assert_eq!(
        page.next_link.as_deref(),
        Some("https://management.azure.com/next?page=2")
    );
    let d = definition_from(page.value.into_iter().next().unwrap());
    assert_eq!(d.name, "d");
    assert_eq!(
        (d.publisher.as_str(), d.offer.as_str(), d.sku.as_str()),
        ("p", "o", "s")
    );
    assert_eq!(d.os_type, "Linux");
    assert_eq!(d.os_state, "Generalized");
    assert_eq!(d.architecture.as_deref(), Some("Arm64"));
    assert_eq!(d.generation.as_deref(), Some("V2"));
    assert_eq!(
        d.features,
        BTreeMap::from([("DiskControllerTypes".to_string(), "SCSI, NVMe".to_string())])
    );
    assert_eq!(d.provisioning_state, ProvisioningState::Creating);
    let last: Page<Definition> = decode(br#"{"value": []}"#, "list", "d").unwrap();
    assert!(last.value.is_empty() && last.next_link.is_none());
}

#[test]
fn a_gallery_is_read_for_its_location() {
    let g: Gallery = decode(
        br#"{"id": "/g", "name": "g", "location": "westeurope", "properties": {"identifier": {"uniqueName": "x"}, "provisioningState": "Succeeded"}}"#,
        "read",
        "g",
    )
    .unwrap();
    assert_eq!(g.location.as_deref(), Some("westeurope"));
}

#[test]
fn the_error_body_and_the_operation_status_keep_code_target_and_message() {
    let e = ErrorBody::parse(
        br#"{"error": {"code": "OperationNotAllowed", "message": "no", "target": "x.y", "details": []}}"#,
    );
    assert_eq!(e.code.as_deref(), Some("OperationNotAllowed"));
    assert_eq!(e.target.as_deref(), Some("x.y"));
    assert_eq!(e.describe(), "OperationNotAllowed: no");
    let bare = ErrorBody::parse(br#"{"code": "NotFound", "message": "gone"}"#);
    assert_eq!(bare.code.as_deref(), Some("NotFound"));
    assert_eq!(ErrorBody::parse(b"<html>502</html>"), ErrorBody::default());
    let s: OperationStatus = serde_json::from_slice(
        br#"{"name": "op", "status": "Failed", "startTime": "2026-12-01T00:00:00Z", "error": {"code": "ReplicationSourceNotFound", "message": "missing"}}"#,
    )
    .unwrap();
    assert_eq!(s.status.as_deref(), Some("Failed"));
    assert_eq!(
        s.error.unwrap().describe(),
        "ReplicationSourceNotFound: missing"
    );
}

fn gallery_image(v: &str) -> String {
    format!("/subscriptions/s/resourceGroups/r/providers/Microsoft.Compute/galleries/g/images/d/versions/{v}")
}

// Checked against the ComputeRP 2024-07-01 ImageReference (id, sharedGalleryImageId,
// communityGalleryImageId, read-only exactVersion) and the VM list's shape.
#[test]
fn a_vm_page_yields_its_gallery_image_references_only() {
    let body = json!({"value": [
        {"id": "/vm/1", "location": "westeurope", "properties": {"storageProfile": {
            "imageReference": {"id": gallery_image("latest"), "exactVersion": "1.506.0"},
            "osDisk": {"createOption": "FromImage"}}}},
        {"id": "/vm/2", "properties": {"storageProfile": {"imageReference": {
            "publisher": "Canonical", "offer": "ubuntu", "sku": "22_04-lts", "version": "latest"}}}},
        {"id": "/vm/3", "properties": {"storageProfile": {"imageReference": {
            "sharedGalleryImageId": "/SharedGalleries/unique/Images/d/Versions/1.0.0"}}}},
        {"id": "/vm/4"}
    ]});
    let page: Page<Vm> = decode(body.to_string().as_bytes(), "list", "s").unwrap();
    let mut out = Vec::new();
    for v in &page.value {
        consumers_of(ConsumerKind::VirtualMachine, v, v.image(), &mut out);
    }
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(out[0].id, "/vm/1");
    assert_eq!(out[0].image_id, gallery_image("latest"));
    assert_eq!(out[0].exact_version.as_deref(), Some("1.506.0"));
    assert_eq!(out[0].location.as_deref(), Some("westeurope"));
    assert_eq!(out[1].id, "/vm/3");
    assert_eq!(out[1].location, None);
}

// Checked against VirtualMachineScaleSet_Create_FromAGeneralizedSharedImage.json
// (virtualMachineProfile.storageProfile.imageReference.id) and
// VirtualMachineScaleSetVM_List_MinimumSet_Gen.json.
#[test]
fn a_scale_set_is_read_for_its_model_image_and_orchestration_mode() {
    let body = json!({"value": [
        {"id": "/subscriptions/s/resourceGroups/rg1/providers/Microsoft.Compute/virtualMachineScaleSets/u",
         "name": "u", "location": "westeurope",
         "properties": {"orchestrationMode": "Uniform", "virtualMachineProfile": {"storageProfile": {
            "imageReference": {"id": gallery_image("1.506.0")}}}}},
        {"id": "/f", "name": "f", "properties": {"orchestrationMode": "Flexible"}}
    ]});
    let page: Page<ScaleSet> = decode(body.to_string().as_bytes(), "list", "s").unwrap();
    assert!(!page.value[0].is_flexible());
    assert!(page.value[1].is_flexible());
    assert!(page.value[1].image().is_none());
    let mut out = Vec::new();
    consumers_of(
        ConsumerKind::ScaleSet,
        &page.value[0],
        page.value[0].image(),
        &mut out,
    );
    assert_eq!(out[0].image_id, gallery_image("1.506.0"));
}

// Checked against Disk_Create_FromAnAzureComputeGalleryImage.json
// (creationData.galleryImageReference.id) and Disk_ListBySubscription.json.
#[test]
fn a_disk_is_read_for_both_of_its_image_references() {
    let body = json!({"value": [
        {"id": "/disk/1", "location": "westeurope", "properties": {"creationData": {
            "createOption": "FromImage",
            "galleryImageReference": {"id": gallery_image("1.506.0")},
            "imageReference": {"communityGalleryImageId": "/CommunityGalleries/c/Images/d/Versions/2.0.0", "lun": 0}}}},
        {"id": "/disk/2", "properties": {"creationData": {"createOption": "Empty"}}}
    ]});
    let page: Page<Disk> = decode(body.to_string().as_bytes(), "list", "s").unwrap();
    assert_eq!(page.value[0].images().len(), 2);
    assert!(page.value[1].images().is_empty());
    let mut out = Vec::new();
    for d in &page.value {
        for image in d.images() {
            consumers_of(ConsumerKind::Disk, d, Some(image), &mut out);
        }
    }
    assert_eq!(out.len(), 2);
    assert_eq!(
        out[1].image_id,
        "/CommunityGalleries/c/Images/d/Versions/2.0.0"
    );
}

#[test]
fn a_body_that_is_not_the_document_is_a_failed_read() {
    assert!(matches!(
        decode::<Page<Vm>>(b"<html>", "list virtual machines of", "/subscriptions/s"),
        Err(Error::Transport { message, .. }) if message.contains("could not be read")
    ));
    let accounts: Page<StorageAccount> = decode(
        br#"{"value": [{"id": "/a", "name": "acct", "kind": "StorageV2"}]}"#,
        "list",
        "s",
    )
    .unwrap();
    assert_eq!(accounts.value[0].name.as_deref(), Some("acct"));
}
