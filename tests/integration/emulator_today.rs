//! The emulator as today's Azure (REFERENCE.md "Today's Azure", issue 30): deletion blocked before
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
