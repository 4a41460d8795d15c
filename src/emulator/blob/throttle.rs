//! The per-page-blob throughput and request-rate targets of a timing profile, applied to Put
//! Page before it runs.

use axum::http::StatusCode;

use super::http::{err, StorageError};
use crate::emulator::timing::Admit;
use crate::emulator::State;

/// Azure Storage's per-page-blob targets (REFERENCE.md "Azure Storage targets": 60 MiB/s and
/// 500 requests/s per blob; beyond them 503 ServerBusy or 500 OperationTimedOut), when the timing
/// sets them (`--timing azure`): a write waits its turn at the blob's rate (a blob does not take
/// data faster than its target), and one that would queue more than the backlog (a second's
/// worth, scaled) is refused with 503 ServerBusy, body and `x-ms-error-code` as Azure sends them
/// (buckets/application #830 records `<Code>ServerBusy</Code><Message>Egress is over the account
/// limit.`; dotnet/performance #2937 "Operations per second is over the account limit."; the
/// ingress twin is the documented message for writes). Azure sends no `Retry-After` there.
pub(super) async fn throttle_page_write(
    state: &State,
    container: &str,
    blob: &str,
    bytes: u64,
) -> Result<(), StorageError> {
    match state.admit_page_write(&format!("{container}/{blob}"), bytes) {
        Ok(wait) => {
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
            }
            Ok(())
        }
        Err(Admit::OverOperations) => Err(err(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServerBusy",
            "Operations per second is over the account limit.",
        )),
        Err(_) => Err(err(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServerBusy",
            "Ingress is over the account limit.",
        )),
    }
}
