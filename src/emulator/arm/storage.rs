//! Storage accounts as ARM lists them (the world's, or the development account behind the
//! emulator's own blob listener), and the parts of a storage account resource id.

use axum::response::Response;
use serde_json::{json, Value};

use super::eq;
use super::read::page;
use super::render::ArmError;
use super::router::Ctx;
use crate::devstore::DEV_ACCOUNT;
use crate::emulator::store::{Data, DEV_ACCOUNT_RESOURCE_GROUP};
use crate::emulator::State;

/// `(subscription, resource group, name)` of a storage account resource id
/// (`/subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Storage/storageAccounts/{name}`).
pub(crate) fn storage_account_parts(id: &str) -> Option<(String, String, String)> {
    let segs: Vec<&str> = id.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        [s, sub, r, rg, p, ns, t, name]
            if eq(s, "subscriptions")
                && eq(r, "resourceGroups")
                && eq(p, "providers")
                && eq(ns, "Microsoft.Storage")
                && eq(t, "storageAccounts") =>
        {
            Some((sub.to_string(), rg.to_string(), name.to_string()))
        }
        _ => None,
    }
}

/// The storage accounts served in subscription `sub` (lower-cased id `/subscriptions/{s}`):
/// the world's, or by default the development account in [`DEV_ACCOUNT_RESOURCE_GROUP`].
pub(super) fn storage_accounts_in(state: &State, data: &Data, sub: &str) -> Vec<Value> {
    let sub_name = sub.trim_start_matches("/subscriptions/");
    if data.storage_accounts.is_empty() {
        return vec![json!({
            "id": format!("/subscriptions/{sub_name}/resourceGroups/{DEV_ACCOUNT_RESOURCE_GROUP}/providers/Microsoft.Storage/storageAccounts/{}", DEV_ACCOUNT),
            "name": DEV_ACCOUNT,
            "type": "Microsoft.Storage/storageAccounts",
        })]
        .into_iter()
        .map(|a| storage_account_body(state, a))
        .collect();
    }
    data.storage_accounts
        .iter()
        .filter(|a| {
            a.get("id")
                .and_then(Value::as_str)
                .and_then(storage_account_parts)
                .is_some_and(|(s, _, _)| eq(&s, sub_name))
        })
        .map(|a| storage_account_body(state, a.clone()))
        .collect()
}

/// A storage account as `Storage Accounts - List` answers it (api-version 2023-05-01): id, name,
/// type, location, kind, sku and the primary blob endpoint (the emulator's own, path-style, for
/// the development account).
fn storage_account_body(state: &State, mut a: Value) -> Value {
    let name = a
        .get("name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if a.get("location").is_none() {
        a["location"] = json!("westeurope");
    }
    if a.get("kind").is_none() {
        a["kind"] = json!("StorageV2");
    }
    if a.get("sku").is_none() {
        a["sku"] = json!({"name": "Standard_LRS", "tier": "Standard"});
    }
    let blob = if name == DEV_ACCOUNT {
        crate::emulator::lock(&state.0.blob_hosts)
            .first()
            .map(|h| format!("http://{h}/{name}/"))
            .unwrap_or_default()
    } else {
        format!("https://{name}.blob.core.windows.net/")
    };
    if a.get("properties").is_none_or(|p| !p.is_object()) {
        a["properties"] = json!({});
    }
    a["properties"]["provisioningState"] = json!("Succeeded");
    a["properties"]["primaryEndpoints"] = json!({"blob": blob});
    a
}

/// Storage Accounts - List (`GET /subscriptions/{s}/providers/Microsoft.Storage/storageAccounts`,
/// azure-rest-api-specs storage `StorageAccountList.json`): `{"value": [...]}`, paged with
/// `nextLink` like every list here.
pub(super) fn list_storage_accounts(ctx: &Ctx, sub: &str) -> Result<Response, ArmError> {
    let data = ctx.state.data();
    let items = storage_accounts_in(&ctx.state, &data, sub);
    page(ctx, &items, Value::clone)
}
