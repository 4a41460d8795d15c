//! The emulator as today's Azure (REFERENCE.md "Today's Azure", issue 30): soft delete, deletion blocked before
//! end of life, which api-versions see it, and the 2026-03-03 create defaults. Each test names
//! its source; where no source settled a fact, the emulator models the harsher reading
//! (src/emulator/arm/safety.rs says which).

use crate::support::emulated;

use serde_json::json;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use emulated::*;

fn at(path: &str, api: &str) -> String {
    format!("{path}?api-version={api}")
}

fn in_days(days: i64) -> String {
    (OffsetDateTime::now_utc() + time::Duration::days(days))
        .format(&Rfc3339)
        .unwrap()
}

fn blocked_version(eol: &str) -> serde_json::Value {
    let mut body = version_body("https://a.blob.core.windows.net/c/one.vhd");
    body["properties"]["publishingProfile"]["endOfLifeDate"] = json!(eol);
    body["properties"]["safetyProfile"] = json!({"blockDeletionBeforeEndOfLife": true});
    body
}

/// TSDOC ("Troubleshoot shared images"): a DELETE before the end of life of a version that blocks
/// it is refused with `DeleteGalleryImageVersionBlockedBeforeEndOfLife`; the remedy is to PATCH
/// the flag off. GalleryRP 2024-03-03 has the flag; 2023-07-03 does not, and never answers it.
#[tokio::test]
async fn a_version_that_blocks_its_deletion_refuses_a_delete_until_the_flag_is_lifted() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    gallery_and_definition(&r, "g", "d").await;
    let v = format!("{}/images/d/versions/1.0.0", gallery_path("g"));
    let created = r
        .put(&at(&v, "2024-03-03"), blocked_version(&in_days(30)))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    until_settled(&r, &v).await;

    let seen = r.get(&at(&v, "2024-03-03")).await.body;
    assert_eq!(
        seen["properties"]["safetyProfile"]["blockDeletionBeforeEndOfLife"], true,
        "{seen}"
    );
    let old = r.get(&at(&v, "2023-07-03")).await.body;
    assert!(
        old["properties"]["safetyProfile"]
            .get("blockDeletionBeforeEndOfLife")
            .is_none(),
        "2023-07-03 has no such field: {old}"
    );

    let refused = r.send("DELETE", &at(&v, "2024-03-03"), None, true).await;
    assert_eq!(
        (refused.status, refused.code()),
        (
            409,
            "DeleteGalleryImageVersionBlockedBeforeEndOfLife".into()
        ),
        "{}",
        refused.text
    );
    assert!(refused.text.contains("endOfLifeDate has not reached yet"));
    // The same refusal whatever api-version the DELETE names.
    let old_delete = r.send("DELETE", &at(&v, "2023-07-03"), None, true).await;
    assert_eq!(old_delete.status, 409, "{}", old_delete.text);
    assert_eq!(r.get(&v).await.status, 200, "still there");

    let lift = r
        .patch(
            &at(&v, "2024-03-03"),
            json!({"properties": {"safetyProfile": {"blockDeletionBeforeEndOfLife": false},
                "storageProfile": {}}}),
        )
        .await;
    assert_eq!(lift.status, 200, "{}", lift.text);
    until_settled(&r, &v).await;
    let deleted = r.send("DELETE", &at(&v, "2024-03-03"), None, true).await;
    assert_eq!(deleted.status, 202, "{}", deleted.text);
}

/// The block ends at the end of life, by Azure's clock.
#[tokio::test]
async fn a_block_ends_at_the_end_of_life() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    gallery_and_definition(&r, "g", "d").await;
    let v = format!("{}/images/d/versions/1.0.0", gallery_path("g"));
    let created = r
        .put(&at(&v, "2024-03-03"), blocked_version(&in_days(1)))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    until_settled(&r, &v).await;
    assert_eq!(
        r.send("DELETE", &with_api(&v), None, true).await.status,
        409
    );
    admin(
        &h,
        "POST",
        "/_emulator/clock",
        Some(json!({"advance_secs": 2 * 86_400})),
    )
    .await;
    let deleted = r.send("DELETE", &with_api(&v), None, true).await;
    assert_eq!(deleted.status, 202, "{}", deleted.text);
}

/// TSDOC: "EndOfLifeDate must be set to a future date". A block with no end of life could never
/// end: refused (no source says what Azure answers; the harsher reading).
#[tokio::test]
async fn a_past_end_of_life_or_a_block_without_one_is_refused() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    gallery_and_definition(&r, "g", "d").await;
    let v = format!("{}/images/d/versions/1.0.0", gallery_path("g"));
    let past = r
        .put(&at(&v, "2024-03-03"), blocked_version(&in_days(-1)))
        .await;
    assert_eq!((past.status, past.code()), (400, "InvalidParameter".into()));
    assert!(
        past.text
            .contains("EndOfLifeDate must be set to a future date"),
        "{}",
        past.text
    );
    let mut no_eol = version_body("https://a.blob.core.windows.net/c/one.vhd");
    no_eol["properties"]["safetyProfile"] = json!({"blockDeletionBeforeEndOfLife": true});
    let refused = r.put(&at(&v, "2024-03-03"), no_eol).await;
    assert_eq!(refused.status, 400, "{}", refused.text);
    assert_eq!(r.get(&v).await.status, 404, "nothing was made");
}

/// azure-cli #32375 (the gallery team): a version created at 2026-03-03 without the fields gets
/// an end of life six months after it is published and blocks its deletion until then; one
/// created at 2024-03-03 does not; a create that sends the fields keeps them.
#[tokio::test]
async fn a_create_at_2026_03_03_blocks_deletion_for_six_months_unless_told_otherwise() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    gallery_and_definition(&r, "g", "d").await;
    let base = format!("{}/images/d/versions", gallery_path("g"));
    let uri = "https://a.blob.core.windows.net/c/one.vhd";
    for (version, api, body, blocked) in [
        ("1.0.0", "2026-03-03", version_body(uri), true),
        ("2.0.0", "2024-03-03", version_body(uri), false),
        (
            "3.0.0",
            "2026-03-03",
            {
                let mut b = version_body(uri);
                b["properties"]["safetyProfile"] = json!({"blockDeletionBeforeEndOfLife": false});
                b
            },
            false,
        ),
    ] {
        let v = format!("{base}/{version}");
        let created = r.put(&at(&v, api), body).await;
        assert_eq!(created.status, 201, "{}", created.text);
        until_settled(&r, &v).await;
        let got = r.get(&at(&v, "2026-03-03")).await.body;
        let pp = &got["properties"]["publishingProfile"];
        assert_eq!(
            got["properties"]["safetyProfile"]["blockDeletionBeforeEndOfLife"].as_bool(),
            (api != "2024-03-03").then_some(blocked),
            "{version} at {api}: {got}"
        );
        if version == "1.0.0" {
            let published =
                OffsetDateTime::parse(pp["publishedDate"].as_str().unwrap(), &Rfc3339).unwrap();
            let eol =
                OffsetDateTime::parse(pp["endOfLifeDate"].as_str().unwrap(), &Rfc3339).unwrap();
            let days = (eol - published).whole_days();
            assert!((181..=184).contains(&days), "six months: {days} days");
        } else {
            assert!(
                pp.get("endOfLifeDate").is_none() || version == "3.0.0",
                "{got}"
            );
        }
        let delete = r.send("DELETE", &at(&v, api), None, true).await;
        assert_eq!(
            delete.status,
            if blocked { 409 } else { 202 },
            "{version}: {}",
            delete.text
        );
    }
}

// Soft delete (issue 30 item 1; src/emulator/arm/soft_delete.rs names the sources and the
// harsher readings).

/// The list of a definition's soft-deleted versions (SPEC26).
fn soft_deleted(g: &str, d: &str, api: &str) -> String {
    at(
        &format!(
            "{}/softDeletedArtifactTypes/Images/artifacts/{d}/versions",
            gallery_path(g)
        ),
        api,
    )
}

/// A gallery `g` with soft delete on (REC: a gallery PUT with the policy), definition `d`.
async fn soft_delete_gallery(r: &Raw, g: &str, d: &str) {
    gallery_and_definition(r, g, d).await;
    let on = r
        .put(
            &gallery_path(g),
            json!({"location": LOC, "properties": {"softDeletePolicy": {"isSoftDeleteEnabled": true}}}),
        )
        .await;
    assert_eq!(on.status, 200, "{}", on.text);
}

/// A Succeeded version at `v` from a VHD elsewhere, made at 2024-03-03.
async fn made(r: &Raw, v: &str) {
    let created = r
        .put(
            &at(v, "2024-03-03"),
            version_body("https://a.blob.core.windows.net/c/one.vhd"),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    until_settled(r, v).await;
}

/// DELETE at `api` (the query may add `&bypassSoftDelete=true`), answered 202 and completed.
async fn deleted(r: &Raw, v: &str, api: &str) {
    let delete = r.send("DELETE", &at(v, api), None, true).await;
    assert_eq!(delete.status, 202, "{}", delete.text);
    until_settled(r, v).await;
    assert_eq!(r.get(v).await.status, 404);
}

/// REC: `softDeletePolicy.isSoftDeleteEnabled` turned on and off on an existing gallery (PUT and
/// PATCH), answered with `retentionPeriodInDays: 7` even at 2023-07-03; SPEC26: at 2026-03-03 the
/// retention and grace periods are settable (grace answered at 2026-03-03 only). Off by default.
#[tokio::test]
async fn a_gallery_turns_soft_delete_on_and_off_and_answers_a_seven_day_retention() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    gallery_and_definition(&r, "g", "d").await;
    let g = gallery_path("g");
    let plain = r.get(&g).await.body;
    assert!(
        plain["properties"].get("softDeletePolicy").is_none(),
        "{plain}"
    );
    let on = r
        .put(
            &g,
            json!({"location": LOC, "properties": {"softDeletePolicy": {"isSoftDeleteEnabled": true}}}),
        )
        .await;
    assert_eq!(on.status, 200, "{}", on.text);
    assert_eq!(
        on.body["properties"]["softDeletePolicy"],
        json!({"isSoftDeleteEnabled": true, "retentionPeriodInDays": 7})
    );
    let off = r
        .put(
            &g,
            json!({"location": LOC, "properties": {"softDeletePolicy": {"isSoftDeleteEnabled": false}}}),
        )
        .await;
    assert_eq!(off.status, 200, "{}", off.text);
    assert_eq!(
        r.get(&g).await.body["properties"]["softDeletePolicy"]["isSoftDeleteEnabled"],
        false
    );
    let patched = r
        .patch(
            &g,
            json!({"properties": {"softDeletePolicy": {"isSoftDeleteEnabled": true}}}),
        )
        .await;
    assert_eq!(patched.status, 200, "{}", patched.text);
    // A PUT without the policy keeps it (not found: the harsher reading).
    assert_eq!(r.put(&g, json!({"location": LOC})).await.status, 200);
    assert_eq!(
        r.get(&g).await.body["properties"]["softDeletePolicy"],
        json!({"isSoftDeleteEnabled": true, "retentionPeriodInDays": 7})
    );
    // Retention and grace settable at 2026-03-03 only.
    let old = r
        .send(
            "PATCH",
            &at(&g, "2024-03-03"),
            Some(json!({"properties": {"softDeletePolicy": {"retentionPeriodInDays": 3}}})),
            true,
        )
        .await;
    assert_eq!(
        old.body["properties"]["softDeletePolicy"]["retentionPeriodInDays"],
        7
    );
    let new = r
        .send(
            "PATCH",
            &at(&g, "2026-03-03"),
            Some(json!({"properties": {"softDeletePolicy": {
                "retentionPeriodInDays": 3, "gracePeriodInDays": 2}}})),
            true,
        )
        .await;
    assert_eq!(new.status, 200, "{}", new.text);
    assert_eq!(
        new.body["properties"]["softDeletePolicy"],
        json!({"isSoftDeleteEnabled": true, "retentionPeriodInDays": 3, "gracePeriodInDays": 2})
    );
    assert_eq!(
        r.get(&at(&g, "2024-03-03")).await.body["properties"]["softDeletePolicy"],
        json!({"isSoftDeleteEnabled": true, "retentionPeriodInDays": 3})
    );
}

/// SPEC26: a DELETE with soft delete on makes the version `SoftDeleted` until `consumptionEndTime`
/// (soft-delete time + 7 days), listed under `softDeletedArtifactTypes/Images/artifacts/{d}/versions`
/// (2024-03-03+; the times from 2026-03-03). Not found, the harsher reading: GET answers 404 and
/// the version list leaves it out; `hardDeletionTargetTime` = `consumptionEndTime`, after which it
/// is gone for good; the list at 2023-07-03 is refused.
#[tokio::test]
async fn a_delete_in_a_soft_delete_gallery_keeps_the_version_restorable_for_seven_days() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    soft_delete_gallery(&r, "g", "d").await;
    let v = format!("{}/images/d/versions/1.0.0", gallery_path("g"));
    made(&r, &v).await;
    deleted(&r, &v, "2024-03-03").await;
    let (versions, _) = r
        .list_all(&with_api(&format!(
            "{}/images/d/versions",
            gallery_path("g")
        )))
        .await;
    assert!(versions.is_empty(), "{versions:?}");

    let (items, _) = r.list_all(&soft_deleted("g", "d", "2026-03-03")).await;
    assert_eq!(items.len(), 1, "{items:?}");
    let p = &items[0]["properties"];
    assert_eq!(items[0]["name"], "1.0.0");
    assert!(p["resourceArmId"]
        .as_str()
        .unwrap()
        .eq_ignore_ascii_case(&v));
    assert_eq!(p["softDeletedArtifactType"], "Images");
    let time = |f: &str| OffsetDateTime::parse(p[f].as_str().unwrap(), &Rfc3339).unwrap();
    assert_eq!(
        time("consumptionEndTime") - time("softDeletedTime"),
        time::Duration::days(7)
    );
    assert_eq!(time("hardDeletionTargetTime"), time("consumptionEndTime"));
    let (older, _) = r.list_all(&soft_deleted("g", "d", "2024-03-03")).await;
    assert!(older[0]["properties"].get("consumptionEndTime").is_none());
    assert!(older[0]["properties"].get("softDeletedTime").is_some());
    let refused = r
        .send("GET", &soft_deleted("g", "d", "2023-07-03"), None, true)
        .await;
    assert_eq!(
        (refused.status, refused.code()),
        (400, "NoRegisteredProviderFound".into())
    );

    // Past its hard deletion it is gone for good: not listed, not restorable.
    admin(
        &h,
        "POST",
        "/_emulator/clock",
        Some(json!({"advance_secs": 7 * 86_400 + 60})),
    )
    .await;
    let (after, _) = r.list_all(&soft_deleted("g", "d", "2026-03-03")).await;
    assert!(after.is_empty(), "{after:?}");
    let restore = r
        .send(
            "PATCH",
            &at(&v, "2024-03-03"),
            Some(json!({"properties": {"restore": true, "storageProfile": {}}})),
            true,
        )
        .await;
    assert_eq!(restore.status, 404, "{}", restore.text);
}

/// EX24 / EX26: `PATCH {"properties": {"restore": true, "storageProfile": {}}}` answers 200
/// `Updating`; the version comes back Succeeded as it was (tags, profiles). A restore of a version
/// that is not soft-deleted: not found, the harsher reading (400).
#[tokio::test]
async fn a_soft_deleted_version_is_restored_by_patch_as_it_was() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    soft_delete_gallery(&r, "g", "d").await;
    let v = format!("{}/images/d/versions/1.0.0", gallery_path("g"));
    made(&r, &v).await;
    let before = r.get(&at(&v, "2024-03-03")).await.body;
    let restore = json!({"properties": {"restore": true, "storageProfile": {}}});
    let alive = r
        .send("PATCH", &at(&v, "2024-03-03"), Some(restore.clone()), true)
        .await;
    assert_eq!(alive.status, 400, "{}", alive.text);
    deleted(&r, &v, "2024-03-03").await;

    let restored = r
        .send("PATCH", &at(&v, "2024-03-03"), Some(restore), true)
        .await;
    assert_eq!(restored.status, 200, "{}", restored.text);
    assert_eq!(restored.body["properties"]["provisioningState"], "Updating");
    assert!(restored.header("azure-asyncoperation").is_some());
    until_settled(&r, &v).await;
    let after = r.get(&at(&v, "2024-03-03")).await.body;
    assert_eq!(after, before, "back as it was");
    let (items, _) = r.list_all(&soft_deleted("g", "d", "2024-03-03")).await;
    assert!(items.is_empty(), "{items:?}");
}

/// SDDOC: a PUT with the home `location` restores a soft-deleted version. A PUT of that name
/// with another source: not found, the harsher reading (409 `Conflict` naming the soft-deleted
/// version, restore or purge first).
#[tokio::test]
async fn a_put_of_a_soft_deleted_name_restores_it_and_another_source_is_refused() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    soft_delete_gallery(&r, "g", "d").await;
    let v = format!("{}/images/d/versions/1.0.0", gallery_path("g"));
    made(&r, &v).await;
    deleted(&r, &v, "2024-03-03").await;

    let other = r
        .put(
            &at(&v, "2024-03-03"),
            version_body("https://a.blob.core.windows.net/c/two.vhd"),
        )
        .await;
    assert_eq!((other.status, other.code()), (409, "Conflict".into()));
    assert!(other.text.contains("soft-deleted"), "{}", other.text);
    assert!(other.text.contains("1.0.0"), "{}", other.text);

    let back = r.put(&at(&v, "2024-03-03"), json!({"location": LOC})).await;
    assert_eq!(back.status, 200, "{}", back.text);
    until_settled(&r, &v).await;
    let got = r.get(&v).await.body;
    assert_eq!(got["properties"]["provisioningState"], "Succeeded");
    assert_eq!(
        got["properties"]["storageProfile"]["osDiskImage"]["source"]["uri"],
        "https://a.blob.core.windows.net/c/one.vhd"
    );
    assert_eq!(got["tags"], json!({"image_sha256": "abc"}));
}

/// PR #46100: `DELETE …?api-version=2026-03-03&bypassSoftDelete=true` deletes for good whatever
/// the policy, a soft-deleted version too (it leaves the list). Not found, the harsher reading:
/// `bypassSoftDelete` before 2026-03-03 is ignored (the DELETE soft-deletes), and a DELETE of a
/// soft-deleted version without it answers 204 and purges nothing.
#[tokio::test]
async fn a_purge_deletes_for_good_at_2026_03_03_and_is_ignored_before() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    soft_delete_gallery(&r, "g", "d").await;
    let base = format!("{}/images/d/versions", gallery_path("g"));
    let (one, two) = (format!("{base}/1.0.0"), format!("{base}/2.0.0"));
    made(&r, &one).await;
    made(&r, &two).await;

    deleted(&r, &one, "2026-03-03&bypassSoftDelete=true").await;
    deleted(&r, &two, "2024-03-03&bypassSoftDelete=true").await;
    let names = |items: Vec<serde_json::Value>| -> Vec<String> {
        items
            .iter()
            .map(|i| i["name"].as_str().unwrap().to_string())
            .collect()
    };
    let (items, _) = r.list_all(&soft_deleted("g", "d", "2026-03-03")).await;
    assert_eq!(names(items), vec!["2.0.0"]);

    let again = r.send("DELETE", &at(&two, "2026-03-03"), None, true).await;
    assert_eq!(again.status, 204, "{}", again.text);
    let (items, _) = r.list_all(&soft_deleted("g", "d", "2026-03-03")).await;
    assert_eq!(names(items), vec!["2.0.0"], "nothing purged");

    let purge = r
        .send(
            "DELETE",
            &at(&two, "2026-03-03&bypassSoftDelete=true"),
            None,
            true,
        )
        .await;
    assert_eq!(purge.status, 200, "{}", purge.text);
    let (items, _) = r.list_all(&soft_deleted("g", "d", "2026-03-03")).await;
    assert!(items.is_empty(), "{items:?}");
    // The name is free again.
    made(&r, &two).await;
}

/// SDDOC: a Failed version in a soft-delete gallery can't be deleted; the workaround is to turn
/// soft delete off, delete, and turn it on again. The refusal's code and status are not recorded:
/// 409 `OperationNotAllowed` (the harsher reading), also with `bypassSoftDelete`.
#[tokio::test]
async fn a_failed_version_in_a_soft_delete_gallery_cannot_be_deleted_until_soft_delete_is_off() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    soft_delete_gallery(&r, "g", "d").await;
    let v = format!("{}/images/d/versions/1.0.0", gallery_path("g"));
    let put = r
        .put(
            &at(&v, "2024-03-03"),
            version_body(&format!("{}/stemcell/nothing-here.vhd", h.blob)),
        )
        .await;
    assert_eq!(put.status, 201, "{}", put.text);
    until_settled(&r, &v).await;
    assert_eq!(
        r.get(&v).await.body["properties"]["provisioningState"],
        "Failed"
    );
    for api in ["2024-03-03", "2026-03-03&bypassSoftDelete=true"] {
        let refused = r.send("DELETE", &at(&v, api), None, true).await;
        assert_eq!(
            (refused.status, refused.code()),
            (409, "OperationNotAllowed".into()),
            "{api}: {}",
            refused.text
        );
        assert!(refused.text.contains("soft delete"), "{}", refused.text);
    }
    let g = gallery_path("g");
    let policy =
        |on: bool| json!({"properties": {"softDeletePolicy": {"isSoftDeleteEnabled": on}}});
    assert_eq!(r.patch(&g, policy(false)).await.status, 200);
    deleted(&r, &v, "2024-03-03").await;
    assert_eq!(r.patch(&g, policy(true)).await.status, 200);
    let (items, _) = r.list_all(&soft_deleted("g", "d", "2024-03-03")).await;
    assert!(items.is_empty(), "deleted for good: {items:?}");
}

/// SDDOC: a definition or gallery holding soft-deleted versions cannot be deleted. The code is not
/// recorded: 409 `CannotDeleteResource`, as for nested resources (the harsher reading). Purged,
/// the definition goes.
#[tokio::test]
async fn a_definition_holding_soft_deleted_versions_cannot_be_deleted() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    soft_delete_gallery(&r, "g", "d").await;
    let d = format!("{}/images/d", gallery_path("g"));
    let v = format!("{d}/versions/1.0.0");
    made(&r, &v).await;
    deleted(&r, &v, "2024-03-03").await;
    for parent in [d.clone(), gallery_path("g")] {
        let refused = r.delete(&parent).await;
        assert_eq!(
            (refused.status, refused.code()),
            (409, "CannotDeleteResource".into()),
            "{parent}: {}",
            refused.text
        );
    }
    let refused = r.delete(&d).await;
    assert!(refused.text.contains("versions/1.0.0"), "{}", refused.text);
    let purge = r
        .send(
            "DELETE",
            &at(&v, "2026-03-03&bypassSoftDelete=true"),
            None,
            true,
        )
        .await;
    assert_eq!(purge.status, 200, "{}", purge.text);
    assert_eq!(r.delete(&d).await.status, 202);
}

/// TSDOC: a write to a version while its DELETE runs: "Operation 'Update Gallery Image Version'
/// is not allowed on <version>; since it is marked for deletion" (409 `OperationNotAllowed`).
#[tokio::test]
async fn a_write_while_a_version_is_being_deleted_is_refused_as_marked_for_deletion() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    soft_delete_gallery(&r, "g", "d").await;
    let v = format!("{}/images/d/versions/1.0.0", gallery_path("g"));
    made(&r, &v).await;
    let delete = r.send("DELETE", &at(&v, "2024-03-03"), None, true).await;
    assert_eq!(delete.status, 202, "{}", delete.text);
    let patch = r
        .patch(
            &v,
            json!({"tags": {"a": "b"}, "properties": {"storageProfile": {}}}),
        )
        .await;
    assert_eq!(
        (patch.status, patch.code()),
        (409, "OperationNotAllowed".into()),
        "{}",
        patch.text
    );
    assert!(
        patch
            .text
            .contains("Operation 'Update Gallery Image Version' is not allowed on 1.0.0; since it is marked for deletion"),
        "{}",
        patch.text
    );
    let put = r
        .put(
            &at(&v, "2024-03-03"),
            version_body("https://a.blob.core.windows.net/c/one.vhd"),
        )
        .await;
    assert_eq!(put.status, 409, "{}", put.text);
}

/// Safety first (TSDOC, and not found which Azure checks first: the harsher reading): a version
/// that blocks its deletion before its end of life refuses the DELETE with soft delete on, and a
/// purge too.
#[tokio::test]
async fn a_version_blocked_before_end_of_life_refuses_soft_delete_and_purge() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    soft_delete_gallery(&r, "g", "d").await;
    let v = format!("{}/images/d/versions/1.0.0", gallery_path("g"));
    let created = r
        .put(&at(&v, "2024-03-03"), blocked_version(&in_days(30)))
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    until_settled(&r, &v).await;
    for api in ["2024-03-03", "2026-03-03&bypassSoftDelete=true"] {
        let refused = r.send("DELETE", &at(&v, api), None, true).await;
        assert_eq!(
            (refused.status, refused.code()),
            (
                409,
                "DeleteGalleryImageVersionBlockedBeforeEndOfLife".into()
            ),
            "{api}: {}",
            refused.text
        );
    }
    let (items, _) = r.list_all(&soft_deleted("g", "d", "2024-03-03")).await;
    assert!(items.is_empty(), "{items:?}");
    assert_eq!(r.get(&v).await.status, 200);
}
