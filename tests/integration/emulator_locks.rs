//! Management locks on the emulator (issue 46 item 4; REFERENCE.md "Management locks";
//! src/emulator/arm/locks.rs names each source): an operator's `CanNotDelete` or `ReadOnly` lock
//! at a version, a definition, a gallery, the resource group or the subscription, and what it
//! refuses — raw HTTP, as Azure's wire has it.

use crate::support::emulated;

use serde_json::{json, Value};
use stemcell_gallery::emulator::{Options, Role, World};

use emulated::*;

const LOCKS: &str = "providers/Microsoft.Authorization/locks";

fn rg_path() -> String {
    format!("/subscriptions/{SUB}/resourceGroups/{RG}")
}

fn version_path(gallery: &str, definition: &str, version: &str) -> String {
    format!(
        "{}/images/{definition}/versions/{version}",
        gallery_path(gallery)
    )
}

/// `{scope}/providers/Microsoft.Authorization/locks[/{name}]?api-version={api}`.
fn lock_url(scope: &str, name: Option<&str>, api: &str) -> String {
    match name {
        Some(n) => format!("{scope}/{LOCKS}/{n}?api-version={api}"),
        None => format!("{scope}/{LOCKS}?api-version={api}"),
    }
}

async fn put_lock(r: &Raw, scope: &str, name: &str, level: &str) -> RawResponse {
    r.send(
        "PUT",
        &lock_url(scope, Some(name), "2016-09-01"),
        Some(json!({"properties": {"level": level, "notes": "an operator's lock"}})),
        true,
    )
    .await
}

async fn delete_lock(r: &Raw, scope: &str, name: &str) -> RawResponse {
    r.send(
        "DELETE",
        &lock_url(scope, Some(name), "2016-09-01"),
        None,
        true,
    )
    .await
}

/// Gallery `g`, definition `d` and version `1.0.0` in it, settled; the version's path.
async fn a_version(r: &Raw) -> String {
    gallery_and_definition(r, "g", "d").await;
    let v = version_path("g", "d", "1.0.0");
    let created = r
        .put(
            &v,
            version_body("https://a.blob.core.windows.net/c/one.vhd"),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    until_settled(r, &v).await;
    v
}

fn scope_locked(resp: &RawResponse, operation: &str, scope: &str, locked: &str) {
    assert_eq!(
        (resp.status, resp.code().as_str()),
        (409, "ScopeLocked"),
        "{}",
        resp.text
    );
    assert_eq!(
        resp.body["error"]["message"],
        format!("The scope '{scope}' cannot perform {operation} operation because following scope(s) are locked: '{locked}'. Please remove the lock and try again."),
    );
}

/// The operator locks a version against deletion: Azure refuses its DELETE at once (409, no
/// long-running operation) and keeps it; tags still change; once the lock is removed the DELETE
/// goes through.
#[tokio::test]
async fn a_delete_lock_on_a_version_keeps_it_until_the_operator_lifts_the_lock() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    let v = a_version(&r).await;

    let locked = put_lock(&r, &v, "keep-stemcell", "CanNotDelete").await;
    assert_eq!(locked.status, 201, "{}", locked.text);
    assert_eq!(
        locked.body,
        json!({"id": format!("{v}/{LOCKS}/keep-stemcell"), "type": "Microsoft.Authorization/locks",
               "name": "keep-stemcell",
               "properties": {"level": "CanNotDelete", "notes": "an operator's lock"}})
    );

    let refused = r.delete(&v).await;
    scope_locked(&refused, "delete", &v, &v);
    assert!(refused.header("azure-asyncoperation").is_none());
    let still = r.get(&v).await;
    assert_eq!(still.status, 200, "{}", still.text);
    assert_eq!(still.body["properties"]["provisioningState"], "Succeeded");

    let tagged = r
        .patch(
            &v,
            json!({"tags": {"image_sha256": "def"}, "properties": {"storageProfile": {}}}),
        )
        .await;
    assert_eq!(
        tagged.status, 200,
        "a delete lock lets writes through: {}",
        tagged.text
    );
    until_settled(&r, &v).await;

    assert_eq!(delete_lock(&r, &v, "keep-stemcell").await.status, 200);
    assert_eq!(delete_lock(&r, &v, "keep-stemcell").await.status, 204);
    let deleted = r.delete(&v).await;
    assert_eq!(deleted.status, 202, "{}", deleted.text);
}

/// A lock at the resource group covers everything in it: neither a version nor its definition
/// nor the gallery can be deleted, and the refusal names the group as the locked scope.
#[tokio::test]
async fn a_lock_on_the_resource_group_refuses_deleting_anything_in_it() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    let v = a_version(&r).await;
    let rg = rg_path();
    assert_eq!(
        put_lock(&r, &rg, "rg-lock", "CanNotDelete").await.status,
        201
    );

    let definition = format!("{}/images/d", gallery_path("g"));
    for target in [&v, &definition, &gallery_path("g")] {
        scope_locked(&r.delete(target).await, "delete", target, &rg);
    }
    assert_eq!(r.get(&v).await.status, 200);
}

/// Deleting a parent would delete what is below it: a lock on the version refuses deleting its
/// definition or gallery, naming the version as the locked scope.
#[tokio::test]
async fn a_lock_below_a_definition_refuses_deleting_the_definition() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    let v = a_version(&r).await;
    put_lock(&r, &v, "keep", "CanNotDelete").await;
    let definition = format!("{}/images/d", gallery_path("g"));
    scope_locked(&r.delete(&definition).await, "delete", &definition, &v);
}

/// A read-only lock on the definition: its versions cannot be changed, nor new ones published
/// under it, nor the definition deleted; everything can still be read.
#[tokio::test]
async fn a_read_only_lock_refuses_changes_but_never_reads() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    let v = a_version(&r).await;
    let definition = format!("{}/images/d", gallery_path("g"));
    assert_eq!(
        put_lock(&r, &definition, "frozen", "ReadOnly").await.status,
        201
    );

    let patch = r
        .patch(
            &v,
            json!({"tags": {"image_sha256": "def"}, "properties": {"storageProfile": {}}}),
        )
        .await;
    scope_locked(&patch, "write", &v, &definition);
    let v2 = version_path("g", "d", "1.0.1");
    let publish = r
        .put(
            &v2,
            version_body("https://a.blob.core.windows.net/c/two.vhd"),
        )
        .await;
    scope_locked(&publish, "write", &v2, &definition);
    scope_locked(&r.delete(&v).await, "delete", &v, &definition);

    assert_eq!(r.get(&v).await.status, 200);
    assert_eq!(r.get(&format!("{definition}/versions")).await.status, 200);
    assert_eq!(r.get(&v2).await.status, 404, "nothing was created");
    // The gallery above is not frozen.
    let gallery = r
        .patch(&gallery_path("g"), json!({"tags": {"team": "bosh"}}))
        .await;
    assert_eq!(gallery.status, 200, "{}", gallery.text);
}

/// The list at a version's scope shows the locks that hold for it — at the version, at each
/// ancestor (gallery, resource group, subscription) — and those below it, each with the id of the
/// scope it lives at; not a sibling's nor another group's. `$filter=atScope()` leaves out those
/// below.
#[tokio::test]
async fn the_list_at_a_version_shows_the_locks_it_inherits_with_their_own_ids() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    let v = a_version(&r).await;
    let sibling = version_path("g", "d", "1.0.1");
    let created = r
        .put(
            &sibling,
            version_body("https://a.blob.core.windows.net/c/two.vhd"),
        )
        .await;
    assert_eq!(created.status, 201, "{}", created.text);
    until_settled(&r, &sibling).await;
    let sub = format!("/subscriptions/{SUB}");
    let other_rg = format!("/subscriptions/{SUB}/resourceGroups/other-rg");
    for (scope, name) in [
        (sub.as_str(), "sub-lock"),
        (rg_path().as_str(), "rg-lock"),
        (gallery_path("g").as_str(), "gallery-lock"),
        (v.as_str(), "version-lock"),
        (sibling.as_str(), "sibling-lock"),
        (other_rg.as_str(), "other-lock"),
    ] {
        assert_eq!(
            put_lock(&r, scope, name, "CanNotDelete").await.status,
            201,
            "{scope}"
        );
    }
    let ids = |items: &[Value]| -> Vec<String> {
        let mut ids: Vec<String> = items
            .iter()
            .map(|l| l["id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    let id = |scope: &str, name: &str| format!("{scope}/{LOCKS}/{name}");
    let mut expected = vec![
        id(&sub, "sub-lock"),
        id(&rg_path(), "rg-lock"),
        id(&gallery_path("g"), "gallery-lock"),
        id(&v, "version-lock"),
    ];
    expected.sort();
    let (at_version, _) = r.list_all(&lock_url(&v, None, "2016-09-01")).await;
    assert_eq!(ids(&at_version), expected);
    let inherited = at_version
        .iter()
        .find(|l| l["name"] == "rg-lock")
        .expect("the group's lock is listed at the version");
    assert_eq!(inherited["properties"]["level"], "CanNotDelete");

    // At the gallery: its own, those above and those below (both versions'), not other-rg's.
    let (at_gallery, _) = r
        .list_all(&lock_url(&gallery_path("g"), None, "2020-05-01"))
        .await;
    assert_eq!(at_gallery.len(), 5, "{at_gallery:?}");
    let (above_only, _) = r
        .list_all(&format!(
            "{}&$filter=atScope()",
            lock_url(&gallery_path("g"), None, "2020-05-01")
        ))
        .await;
    let mut above = vec![
        id(&sub, "sub-lock"),
        id(&rg_path(), "rg-lock"),
        id(&gallery_path("g"), "gallery-lock"),
    ];
    above.sort();
    assert_eq!(ids(&above_only), above);
    // At the subscription: every lock in it.
    let (everything, _) = r.list_all(&lock_url(&sub, None, "2016-09-01")).await;
    assert_eq!(everything.len(), 6);
}

/// Both api-versions the tool may use serve locks; another is refused as Azure refuses an
/// api-version Microsoft.Authorization does not have for locks.
#[tokio::test]
async fn locks_answer_at_both_api_versions_and_refuse_others() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    let v = a_version(&r).await;
    for (api, name) in [("2016-09-01", "old-api"), ("2020-05-01", "new-api")] {
        let put = r
            .send(
                "PUT",
                &lock_url(&v, Some(name), api),
                Some(json!({"properties": {"level": "CanNotDelete"}})),
                true,
            )
            .await;
        assert_eq!(put.status, 201, "{api}: {}", put.text);
        assert!(
            put.body["properties"].get("notes").is_none(),
            "no notes sent, none answered: {}",
            put.text
        );
        let got = r
            .send("GET", &lock_url(&v, Some(name), api), None, true)
            .await;
        assert_eq!(got.status, 200, "{api}: {}", got.text);
        assert_eq!(got.body["id"], format!("{v}/{LOCKS}/{name}"));
    }
    let refused = r
        .send("GET", &lock_url(&v, None, "2023-07-03"), None, true)
        .await;
    assert_eq!(
        (refused.status, refused.code().as_str()),
        (400, "NoRegisteredProviderFound"),
        "{}",
        refused.text
    );
    assert!(
        refused
            .text
            .contains("The supported api-versions are '2016-09-01, 2020-05-01'"),
        "{}",
        refused.text
    );
}

/// A lock's name is one whatever its casing: a second PUT replaces it (200) and keeps the first
/// spelling; a lock that is not there is a 404; bad names, levels and notes are refused; a lock
/// on a resource that does not exist is a 404.
#[tokio::test]
async fn a_lock_is_replaced_by_name_and_bad_locks_are_refused() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    let v = a_version(&r).await;
    assert_eq!(put_lock(&r, &v, "Keep", "CanNotDelete").await.status, 201);
    let again = put_lock(&r, &v, "KEEP", "ReadOnly").await;
    assert_eq!(again.status, 200, "{}", again.text);
    assert_eq!(again.body["name"], "Keep");
    assert_eq!(again.body["properties"]["level"], "ReadOnly");
    let got = r
        .send("GET", &lock_url(&v, Some("keep"), "2016-09-01"), None, true)
        .await;
    assert_eq!(got.body["id"], format!("{v}/{LOCKS}/Keep"));
    let (all, _) = r.list_all(&lock_url(&v, None, "2016-09-01")).await;
    assert_eq!(all.len(), 1);

    let missing = r
        .send("GET", &lock_url(&v, Some("nope"), "2016-09-01"), None, true)
        .await;
    assert_eq!(
        (missing.status, missing.code().as_str()),
        (404, "LockNotFound")
    );

    let send = |name: &'static str, body: Value| {
        let url = lock_url(&v, Some(name), "2016-09-01");
        let r = &r;
        async move { r.send("PUT", &url, Some(body), true).await }
    };
    let bad_name = send("a:b", json!({"properties": {"level": "ReadOnly"}})).await;
    assert_eq!(
        (bad_name.status, bad_name.code().as_str()),
        (400, "InvalidLockName")
    );
    for body in [
        json!({"properties": {}}),
        json!({"properties": {"level": "Frozen"}}),
        json!({"level": "CanNotDelete"}),
        json!({"properties": {"level": "ReadOnly", "notes": "n".repeat(513)}}),
    ] {
        let refused = send("fine", body.clone()).await;
        assert_eq!(
            (refused.status, refused.code().as_str()),
            (400, "InvalidRequestContent"),
            "{body}: {}",
            refused.text
        );
    }
    let nowhere = put_lock(&r, &version_path("g", "d", "9.9.9"), "keep", "CanNotDelete").await;
    assert_eq!(
        (nowhere.status, nowhere.code().as_str()),
        (404, "ResourceNotFound")
    );
}

/// A lock at the subscription protects consumers too; a lock at a VM goes with the VM when the
/// VM goes (here: the world is replaced), so a new VM of that name is not locked.
#[tokio::test]
async fn locks_hold_for_consumers_and_go_with_their_resource() {
    let vm = format!(
        "{}/providers/Microsoft.Compute/virtualMachines/worker-0",
        rg_path()
    );
    let world = || -> World {
        serde_json::from_value(json!({"resources": [{"id": vm, "location": LOC}]})).unwrap()
    };
    let h = start(Options {
        world: Some(world()),
        ..Default::default()
    })
    .await;
    let r = Raw::new(&h.arm);
    let sub = format!("/subscriptions/{SUB}");
    put_lock(&r, &sub, "sub-lock", "CanNotDelete").await;
    let refused = r
        .send(
            "DELETE",
            &format!("{vm}?api-version=2024-07-01"),
            None,
            true,
        )
        .await;
    scope_locked(&refused, "delete", &vm, &sub);
    assert_eq!(delete_lock(&r, &sub, "sub-lock").await.status, 200);

    assert_eq!(
        put_lock(&r, &vm, "vm-lock", "CanNotDelete").await.status,
        201
    );
    let replaced = admin(
        &h,
        "PUT",
        "/_emulator/world",
        Some(json!({"resources": []})),
    )
    .await;
    assert_eq!(replaced.status, 200, "{}", replaced.text);
    let gone = r
        .send(
            "GET",
            &lock_url(&vm, Some("vm-lock"), "2016-09-01"),
            None,
            true,
        )
        .await;
    assert_eq!(
        gone.status, 404,
        "the VM is gone, and its lock: {}",
        gone.text
    );
    let back = admin(
        &h,
        "PUT",
        "/_emulator/world",
        Some(serde_json::to_value(world()).unwrap()),
    )
    .await;
    assert_eq!(back.status, 200);
    let (locks, _) = r.list_all(&lock_url(&vm, None, "2016-09-01")).await;
    assert!(
        locks.is_empty(),
        "a new VM of that name is not locked: {locks:?}"
    );
    let deleted = r
        .send(
            "DELETE",
            &format!("{vm}?api-version=2024-07-01"),
            None,
            true,
        )
        .await;
    assert_eq!(deleted.status, 200, "{}", deleted.text);
}

/// Locks are state like the resources: they survive a restart with a state file.
#[tokio::test]
async fn locks_survive_a_restart_with_a_state_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("emulator.json");
    let opts = || Options {
        state_file: Some(file.clone()),
        ..Default::default()
    };
    let h = start(opts()).await;
    let r = Raw::new(&h.arm);
    let v = a_version(&r).await;
    put_lock(&r, &rg_path(), "rg-lock", "CanNotDelete").await;
    h.shutdown().await.unwrap();

    let h2 = start(opts()).await;
    let r2 = Raw::new(&h2.arm);
    scope_locked(&r2.delete(&v).await, "delete", &v, &rg_path());
}

/// The tool's identity under a role without `Microsoft.Authorization/locks/write` cannot lock
/// (403 `AuthorizationFailed` naming the action), though it may list locks with `locks/read`; a
/// role with `locks/*` may do both, and delete.
#[tokio::test]
async fn a_role_without_locks_write_cannot_lock_a_version() {
    let reader = Role {
        name: "gallery operator, lock reader".into(),
        actions: vec![
            "Microsoft.Compute/*".into(),
            "Microsoft.Authorization/locks/read".into(),
        ],
        ..Role::default()
    };
    let h = start(Options {
        role: Some(reader),
        ..Default::default()
    })
    .await;
    let owner = Raw::new(&h.arm);
    let v = a_version(&owner).await;
    let tool = arm(&h);
    let refused = put_lock(&tool, &v, "keep", "CanNotDelete").await;
    assert_eq!(
        (refused.status, refused.code().as_str()),
        (403, "AuthorizationFailed"),
        "{}",
        refused.text
    );
    assert!(
        refused.text.contains("Microsoft.Authorization/locks/write"),
        "{}",
        refused.text
    );
    let listed = tool
        .send("GET", &lock_url(&v, None, "2016-09-01"), None, true)
        .await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    assert_eq!(owner.get(&v).await.status, 200, "nothing changed");

    let locker = Role {
        name: "gallery operator who locks".into(),
        actions: vec![
            "Microsoft.Compute/*".into(),
            "Microsoft.Authorization/locks/*".into(),
        ],
        ..Role::default()
    };
    let h2 = start(Options {
        role: Some(locker),
        ..Default::default()
    })
    .await;
    let v2 = a_version(&Raw::new(&h2.arm)).await;
    let tool2 = arm(&h2);
    assert_eq!(
        put_lock(&tool2, &v2, "keep", "CanNotDelete").await.status,
        201
    );
    assert_eq!(delete_lock(&tool2, &v2, "keep").await.status, 200);
}

/// The counters name lock routes by template.
#[tokio::test]
async fn lock_requests_are_counted_by_route_template() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    let v = a_version(&r).await;
    put_lock(&r, &v, "keep", "CanNotDelete").await;
    r.send("GET", &lock_url(&rg_path(), None, "2016-09-01"), None, true)
        .await;
    let counters = admin(&h, "GET", "/_emulator/counters", None).await;
    let c = &counters.body["counters"];
    assert_eq!(
        c["PUT /subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Compute/galleries/{gallery}/images/{image}/versions/{version}/providers/Microsoft.Authorization/locks/{name}"],
        1,
        "{c}"
    );
    assert_eq!(
        c["GET /subscriptions/{s}/resourceGroups/{rg}/providers/Microsoft.Authorization/locks"], 1,
        "{c}"
    );
}
