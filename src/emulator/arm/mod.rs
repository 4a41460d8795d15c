//! Azure Resource Manager, as the emulator serves it: galleries, image definitions, image
//! versions (long-running operations with provisioning and replication states), the consumers
//! (VMs, scale sets and their instances, managed disks, resources by tag) and storage accounts.
//!
//! One file per seam: [`router`] (dispatch and request checks), [`paths`] (ARM paths to
//! resource addresses), [`lro`] (the one long-running-operation engine every write goes
//! through), [`gallery`] and [`version`] (gallery resources), [`consumers`], [`storage`] (storage
//! accounts), [`read`] (GET of one resource and paged lists) and [`render`] (error and resource
//! bodies); [`safety`] and [`soft_delete`] hold today's Azure's deletion rules for versions;
//! [`locks`] holds the management locks of every scope and the refusals they cause.

use serde_json::Value;

use super::State;

mod consumers;
mod gallery;
mod locks;
mod lro;
mod paths;
mod read;
mod render;
mod router;
mod safety;
mod soft_delete;
mod storage;
mod version;

pub(crate) use consumers::{consumer_body, resource_for};
pub(crate) use locks::drop_orphans as drop_orphan_locks;
pub(crate) use paths::{parse_target, route_template, Scope, Target};
pub use render::ArmError;
pub(crate) use router::handle;
pub(crate) use storage::storage_account_parts;

/// ARM compares names and path segments case-insensitively.
/// Whether a request's api-version (`YYYY-MM-DD`, perhaps with `-preview`) is `date` or later:
/// what a resource answers and defaults depends on it.
pub(super) fn api_at_least(api_version: &str, date: &str) -> bool {
    api_version.get(..10).is_some_and(|d| d >= date)
}

pub(super) fn eq(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

pub(super) fn str_at<'a>(v: &'a Value, ptr: &str) -> Option<&'a str> {
    v.pointer(ptr).and_then(Value::as_str)
}

/// Drop JSON nulls from objects (the Rust SDK sends `"publishedDate": null` and the like).
pub(super) fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

pub(super) fn now_rfc3339(state: &State) -> String {
    state
        .now_dt()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// A location as ARM compares it: `West Europe` and `westeurope` are one.
pub(super) fn norm_location(loc: &str) -> String {
    loc.chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_lowercase()
}
