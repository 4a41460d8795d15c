//! Blob leases: Lease Blob (acquire, renew, release, change, break, with Azure's durations and
//! break periods), the lease as a blob's properties show it, and the lease rules of writes and
//! reads.

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::blobs::find_blob_mut;
use super::http::{err, header_str, rfc1123, set, StorageError};
use super::router::Req;
use crate::emulator::store::{Blob, Lease, LeaseState};
use crate::emulator::State;

pub(super) fn lease_view(b: &Blob, now: i64) -> (&'static str, &'static str, Option<&'static str>) {
    match b.lease.state(now) {
        LeaseState::Available => ("unlocked", "available", None),
        LeaseState::Leased { .. } => (
            "locked",
            "leased",
            Some(if b.lease.infinite {
                "infinite"
            } else {
                "fixed"
            }),
        ),
        LeaseState::Breaking { .. } => ("locked", "breaking", None),
        LeaseState::Broken => ("unlocked", "broken", None),
        LeaseState::Expired => ("unlocked", "expired", None),
    }
}

/// Writes to a leased blob need its lease id.
pub(super) fn check_write_lease(b: &Blob, h: &HeaderMap, now: i64) -> Result<(), StorageError> {
    let given = h.get("x-ms-lease-id").and_then(|v| v.to_str().ok());
    match (b.lease.state(now), given) {
        (LeaseState::Leased { id } | LeaseState::Breaking { id }, Some(g)) => {
            if id.eq_ignore_ascii_case(g) {
                Ok(())
            } else {
                Err(err(
                    StatusCode::PRECONDITION_FAILED,
                    "LeaseIdMismatchWithBlobOperation",
                    "The lease ID specified did not match the lease ID for the blob.",
                ))
            }
        }
        (LeaseState::Leased { .. } | LeaseState::Breaking { .. }, None) => Err(err(
            StatusCode::PRECONDITION_FAILED,
            "LeaseIdMissing",
            "There is currently a lease on the blob and no lease ID was specified in the request.",
        )),
        (_, Some(_)) => Err(lease_not_present()),
        (_, None) => Ok(()),
    }
}

/// A blob operation that names a lease (`x-ms-lease-id`) on a blob with no active lease (never
/// leased, released, broken or expired): 412 `LeaseNotPresentWithBlobOperation`, "There is
/// currently no lease on the blob." (learn.microsoft.com/rest/api/storageservices/
/// blob-service-error-codes), for reads and writes alike: Azure/azure-sdk-for-net
/// `Services/Storage/Test/Unit/DotNetCommon/Blob/LeaseTests.cs` (`BlobLeasedReadTests`,
/// `BlobLeasedWriteTests`, `PageBlobLeasedWriteTests`, run against the cloud) expects it for
/// Get Blob, snapshots, Set Metadata, Set Properties, Delete, Put Blob and Put Page "using a
/// lease when no lease is held". `LeaseIdMismatchWithBlobOperation` is for a blob whose active
/// lease is another one.
fn lease_not_present() -> StorageError {
    err(
        StatusCode::PRECONDITION_FAILED,
        "LeaseNotPresentWithBlobOperation",
        "There is currently no lease on the blob.",
    )
}

/// A read that names a lease (`x-ms-lease-id`) must name the blob's active lease: another
/// one is `LeaseIdMismatchWithBlobOperation`, none at all [`lease_not_present`] (Get Blob, Get
/// Blob Properties, Get Blob Metadata, Get Page Ranges).
pub(super) fn check_read_lease(b: &Blob, now: i64, r: &Req) -> Result<(), StorageError> {
    if let Some(given) = r.headers.get("x-ms-lease-id").and_then(|v| v.to_str().ok()) {
        match b.lease.state(now) {
            LeaseState::Leased { id } | LeaseState::Breaking { id }
                if id.eq_ignore_ascii_case(given) => {}
            LeaseState::Leased { .. } | LeaseState::Breaking { .. } => {
                return Err(err(
                    StatusCode::PRECONDITION_FAILED,
                    "LeaseIdMismatchWithBlobOperation",
                    "The lease ID specified did not match the lease ID for the blob.",
                ))
            }
            LeaseState::Available | LeaseState::Broken | LeaseState::Expired => {
                return Err(lease_not_present())
            }
        }
    }
    Ok(())
}

pub(super) fn lease(
    state: &State,
    container: &str,
    name: &str,
    r: &Req,
) -> Result<Response, StorageError> {
    let now = state.now();
    let action = header_str(&r.headers, "x-ms-lease-action").to_lowercase();
    let given = r
        .headers
        .get("x-ms-lease-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let proposed = r
        .headers
        .get("x-ms-proposed-lease-id")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let mut data = state.data();
    let b = find_blob_mut(&mut data, container, name)?;
    let current = b.lease.state(now);
    let mismatch = || {
        err(
            StatusCode::CONFLICT,
            "LeaseIdMismatchWithLeaseOperation",
            "The lease ID specified did not match the lease ID for the blob.",
        )
    };
    let not_present = || {
        err(
            StatusCode::CONFLICT,
            "LeaseNotPresentWithLeaseOperation",
            "There is currently no lease on the blob.",
        )
    };
    let need_id = || {
        err(
            StatusCode::BAD_REQUEST,
            "MissingRequiredHeader",
            "An HTTP header that's mandatory for this request is not specified: x-ms-lease-id.",
        )
    };
    let lease_id_of = |l: &LeaseState| match l {
        LeaseState::Leased { id } | LeaseState::Breaking { id } => Some(id.clone()),
        _ => None,
    };
    let mut status = StatusCode::OK;
    let mut out_id: Option<String> = None;
    let mut lease_time: Option<i64> = None;
    match action.as_str() {
        "acquire" => {
            let dur: i64 = header_str(&r.headers, "x-ms-lease-duration")
                .parse()
                .map_err(|_| {
                    err(
                        StatusCode::BAD_REQUEST,
                        "InvalidHeaderValue",
                        "x-ms-lease-duration must be -1 (infinite) or 15 to 60 seconds.",
                    )
                })?;
            if dur != -1 && !(15..=60).contains(&dur) {
                return Err(err(
                    StatusCode::BAD_REQUEST,
                    "InvalidHeaderValue",
                    &format!("x-ms-lease-duration {dur} is invalid: use -1 (infinite) or 15 to 60 seconds."),
                ));
            }
            let id = proposed.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            match &current {
                LeaseState::Leased { id: cur } if !cur.eq_ignore_ascii_case(&id) => {
                    return Err(err(
                        StatusCode::CONFLICT,
                        "LeaseAlreadyPresent",
                        "There is already a lease present.",
                    ))
                }
                LeaseState::Breaking { .. } => {
                    return Err(err(
                        StatusCode::CONFLICT,
                        "LeaseIsBreakingAndCannotBeAcquired",
                        "There is already a breaking lease present.",
                    ))
                }
                _ => {}
            }
            b.lease = Lease {
                id: Some(id.clone()),
                expires: (dur != -1).then_some(now + dur),
                infinite: dur == -1,
                duration: dur,
                ..Default::default()
            };
            status = StatusCode::CREATED;
            out_id = Some(id);
        }
        "renew" => {
            let g = given.ok_or_else(need_id)?;
            let same = b
                .lease
                .id
                .as_deref()
                .is_some_and(|id| id.eq_ignore_ascii_case(&g));
            match &current {
                LeaseState::Breaking { .. } | LeaseState::Broken => {
                    return Err(err(
                        StatusCode::CONFLICT,
                        "LeaseIsBrokenAndCannotBeRenewed",
                        "The lease ID matched, but the lease has been broken explicitly and cannot be renewed.",
                    ))
                }
                LeaseState::Available => return Err(not_present()),
                _ if !same => return Err(mismatch()),
                _ => {}
            }
            // A renewal restarts the lease for the duration it was acquired with.
            b.lease.expires = (!b.lease.infinite).then_some(now + b.lease.duration);
            b.lease.expired = false;
            out_id = Some(g);
        }
        "release" => {
            let g = given.ok_or_else(need_id)?;
            let same = b
                .lease
                .id
                .as_deref()
                .is_some_and(|id| id.eq_ignore_ascii_case(&g));
            if b.lease.id.is_none() {
                return Err(not_present());
            }
            if !same {
                return Err(mismatch());
            }
            b.lease = Default::default();
        }
        "change" => {
            let g = given.ok_or_else(need_id)?;
            let new_id = proposed.ok_or_else(|| {
                err(
                    StatusCode::BAD_REQUEST,
                    "MissingRequiredHeader",
                    "An HTTP header that's mandatory for this request is not specified: x-ms-proposed-lease-id.",
                )
            })?;
            match lease_id_of(&current) {
                Some(cur) if matches!(current, LeaseState::Leased { .. }) => {
                    if !cur.eq_ignore_ascii_case(&g) && !cur.eq_ignore_ascii_case(&new_id) {
                        return Err(mismatch());
                    }
                }
                _ => return Err(not_present()),
            }
            b.lease.id = Some(new_id.clone());
            out_id = Some(new_id);
        }
        "break" => {
            let period: Option<i64> = match r.headers.get("x-ms-lease-break-period") {
                Some(v) => {
                    let p = v
                        .to_str()
                        .ok()
                        .and_then(|s| s.parse::<i64>().ok())
                        .filter(|p| (0..=60).contains(p));
                    Some(p.ok_or_else(|| {
                        err(
                            StatusCode::BAD_REQUEST,
                            "InvalidHeaderValue",
                            "x-ms-lease-break-period must be 0 to 60 seconds.",
                        )
                    })?)
                }
                None => None,
            };
            match &current {
                LeaseState::Available => return Err(not_present()),
                LeaseState::Broken | LeaseState::Expired => {
                    b.lease = Lease {
                        broken: true,
                        ..Default::default()
                    };
                    lease_time = Some(0);
                }
                LeaseState::Breaking { .. } => {
                    lease_time = Some(b.lease.breaking_until.unwrap_or(now) - now);
                }
                LeaseState::Leased { .. } => {
                    let remaining = match b.lease.expires {
                        Some(exp) => exp - now,
                        None => 0,
                    };
                    let wait = match period {
                        Some(p) if b.lease.infinite => p,
                        Some(p) => p.min(remaining),
                        None => remaining,
                    };
                    if wait <= 0 {
                        b.lease = Lease {
                            broken: true,
                            ..Default::default()
                        };
                        lease_time = Some(0);
                    } else {
                        b.lease.breaking_until = Some(now + wait);
                        lease_time = Some(wait);
                    }
                }
            }
            status = StatusCode::ACCEPTED;
        }
        _ => {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "InvalidHeaderValue",
                "x-ms-lease-action must be acquire, renew, release, change or break.",
            ))
        }
    }
    let (etag, lm) = (b.etag.clone(), b.last_modified);
    drop(data);
    state.changed();
    let mut resp = status.into_response();
    let h = resp.headers_mut();
    set(h, "etag", &etag);
    set(h, "last-modified", &rfc1123(lm));
    if let Some(id) = out_id {
        set(h, "x-ms-lease-id", &id);
    }
    if let Some(t) = lease_time {
        set(h, "x-ms-lease-time", &t.max(0).to_string());
    }
    Ok(resp)
}
