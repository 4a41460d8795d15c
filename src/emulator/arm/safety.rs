//! A version's safety profile as today's Azure keeps it (REFERENCE.md "Today's Azure"): deletion
//! blocked before end of life, the api-versions that see it, and the 2026-03-03 create defaults.
//!
//! Sources (REFERENCE.md names them): the flag `safetyProfile.blockDeletionBeforeEndOfLife`
//! exists from api-version 2024-03-03 (GalleryRP.json 2024-03-03 and later); a DELETE before the
//! version's `publishingProfile.endOfLifeDate` is refused with
//! `DeleteGalleryImageVersionBlockedBeforeEndOfLife` and TSDOC's message; an end of life set in
//! the past is refused with "EndOfLifeDate must be set to a future date" (TSDOC); a version created
//! at 2026-03-03 without the fields gets an end of life six months after publishing and the block
//! (azure-cli #32375, from the gallery team).
//!
//! Not found in any source, so the harsher reading is modelled: the refusal's HTTP status (409,
//! refused at the DELETE itself, before any operation starts); a block with no end of life (400,
//! as the block can never end); a field the api-version's schema lacks is ignored on write (ARM
//! drops unknown properties) and never answered.

use serde_json::{json, Value};
use time::OffsetDateTime;

use super::render::{bad, conflict, ArmError};
use super::{api_at_least, str_at};

/// The first api-version whose schema has `blockDeletionBeforeEndOfLife`.
pub(super) const SAFETY_API: &str = "2024-03-03";
/// The first api-version that blocks deletion of a new version unless told otherwise.
pub(super) const BLOCK_BY_DEFAULT_API: &str = "2026-03-03";

const BLOCK: &str = "blockDeletionBeforeEndOfLife";

fn parse(at: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(at.trim(), &time::format_description::well_known::Rfc3339).ok()
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// `at` plus six calendar months, the day clamped to the month's last.
fn six_months_after(at: OffsetDateTime) -> OffsetDateTime {
    let month0 = at.month() as u8 - 1 + 6;
    let year = at.year() + i32::from(month0 / 12);
    let month = time::Month::try_from(month0 % 12 + 1).unwrap_or(time::Month::January);
    let day = at.day().min(month.length(year));
    time::Date::from_calendar_date(year, month, day)
        .map(|d| at.replace_date(d))
        .unwrap_or(at)
}

/// The version's properties after a PUT or PATCH (a create when there is no `old`): `sent` is
/// the safety profile the request carried; `props` already holds the merged publishing profile,
/// `old` the properties before. The profile keeps what the request leaves out; the block is set
/// only where the api-version has it; a 2026-03-03 create gets its defaults; a block needs a
/// future end of life.
pub(super) fn on_write(
    api_version: &str,
    sent: Option<&Value>,
    props: &mut Value,
    old: Option<&Value>,
    now: OffsetDateTime,
) -> Result<(), ArmError> {
    let mut profile = old
        .and_then(|o| o.get("safetyProfile"))
        .cloned()
        .filter(Value::is_object)
        .unwrap_or_else(|| {
            json!({"allowDeletionOfReplicatedLocations": false, "reportedForPolicyViolation": false})
        });
    let sees_block = api_at_least(api_version, SAFETY_API);
    if let Some(sent) = sent.and_then(Value::as_object) {
        for (k, v) in sent {
            if k == "reportedForPolicyViolation" || (k == BLOCK && !sees_block) {
                continue; // read only; or not in this api-version's schema
            }
            profile[k] = v.clone();
        }
    }
    let new = old.is_none();
    let sent_block = sent.and_then(|s| s.get(BLOCK)).is_some() && sees_block;
    if new && api_at_least(api_version, BLOCK_BY_DEFAULT_API) {
        if !sent_block {
            profile[BLOCK] = json!(true);
        }
        if str_at(props, "/publishingProfile/endOfLifeDate").is_none() {
            let published = str_at(props, "/publishingProfile/publishedDate")
                .and_then(parse)
                .unwrap_or(now);
            props["publishingProfile"]["endOfLifeDate"] =
                json!(rfc3339(six_months_after(published)));
        }
    }
    let eol_now = str_at(props, "/publishingProfile/endOfLifeDate").map(str::to_string);
    let eol_before = old.and_then(|o| str_at(o, "/publishingProfile/endOfLifeDate"));
    if let Some(eol) = &eol_now {
        let Some(at) = parse(eol) else {
            return Err(bad(
                "InvalidParameter",
                &format!("The end of life date '{eol}' is not a valid date-time."),
            )
            .target("galleryImageVersion.properties.publishingProfile.endOfLifeDate"));
        };
        if eol_before != Some(eol.as_str()) && at <= now {
            return Err(bad(
                "InvalidParameter",
                "EndOfLifeDate must be set to a future date.",
            )
            .target("galleryImageVersion.properties.publishingProfile.endOfLifeDate"));
        }
    }
    if profile.get(BLOCK).and_then(Value::as_bool) == Some(true) && eol_now.is_none() {
        return Err(bad(
            "InvalidParameter",
            "blockDeletionBeforeEndOfLife requires publishingProfile.endOfLifeDate to be set to a future date.",
        )
        .target("galleryImageVersion.properties.safetyProfile.blockDeletionBeforeEndOfLife"));
    }
    props["safetyProfile"] = profile;
    Ok(())
}

/// The refusal of a DELETE of a version whose deletion is blocked until its end of life.
pub(super) fn refuse_delete(body: &Value, now: OffsetDateTime) -> Result<(), ArmError> {
    let blocked = body
        .pointer(&format!("/properties/safetyProfile/{BLOCK}"))
        .and_then(Value::as_bool)
        == Some(true);
    let until = str_at(body, "/properties/publishingProfile/endOfLifeDate").and_then(parse);
    match until {
        Some(until) if blocked && until > now => Err(conflict(
            "DeleteGalleryImageVersionBlockedBeforeEndOfLife",
            "Deletion of Gallery image version is not allowed because the image is enabled for blockDeletionBeforeEndOfLife and its endOfLifeDate has not reached yet.",
        )),
        _ => Ok(()),
    }
}

/// The body as `api_version` answers it: without the fields its schema lacks.
pub(super) fn answer_at(api_version: &str, body: &mut Value) {
    if !api_at_least(api_version, SAFETY_API) {
        if let Some(p) = body
            .pointer_mut("/properties/safetyProfile")
            .and_then(Value::as_object_mut)
        {
            p.remove(BLOCK);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn six_months_clamps_the_day_and_carries_the_year() {
        assert_eq!(
            six_months_after(datetime!(2026-08-31 10:00 UTC)),
            datetime!(2027-02-28 10:00 UTC)
        );
        assert_eq!(
            six_months_after(datetime!(2026-03-03 00:00 UTC)),
            datetime!(2026-09-03 00:00 UTC)
        );
    }
}
