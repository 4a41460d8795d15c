//! Issue 30 item 4: a gallery with soft delete on keeps a deleted version's name taken, and
//! restorable, for its retention period. What an operator lives through: a stemcell deleted and
//! uploaded again within the week (restored, nothing uploaded), a rebuilt stemcell of the same
//! version (refused, naming the soft-deleted version and the remedies, nothing written),
//! `list --soft-deleted` and `restore`.

use crate::support::emulated::{admin, set_soft_delete, Raw, LOC, RG, SUB};
use crate::support::seeding::*;
use crate::support::DEFINITION;

use serde_json::Value;

const KEY: &str = "1.506.0";

/// A world whose gallery has soft delete on, and one stemcell (`seed` chooses its content).
async fn soft_delete_world() -> World {
    let world = World::start().await;
    set_soft_delete(&Raw::new(&world.emulator.arm), GALLERY, true).await;
    world
}

/// `delete --reference r` of the version (without one: of an unreferenced version): the last
/// reference, so the version is soft-deleted.
async fn delete_last_reference(world: &World, reference: Option<&str>) -> Value {
    let mut args = vec!["delete", "--name", DEFINITION, "--version", "1.506"];
    if let Some(r) = reference {
        args.extend(["--reference", r]);
    }
    let out = world.run(&args).await;
    assert_eq!(out.code, 0, "{}\n{}", out.json, out.stderr);
    assert_eq!(out.json["result"], "deleted", "{}", out.json);
    assert_eq!(out.json["soft_deleted"], true, "{}", out.json);
    out.json.clone()
}

fn references(version: &Value) -> Vec<String> {
    let tags: std::collections::BTreeMap<String, String> =
        serde_json::from_value(version["tags"].clone()).unwrap();
    stemcell_gallery::gallery::tags::references(&tags)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stemcell_deleted_and_seeded_again_within_the_week_is_restored_uploading_nothing() {
    let world = soft_delete_world().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, generated) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 7, 4));
    let first = world.seed(&path, &["--reference", "r1"]).await;
    assert_eq!(first.assert_ok()["outcome"], "created");
    delete_last_reference(&world, Some("r1")).await;
    assert!(world.version(DEFINITION, KEY).await.is_none());

    // `list --soft-deleted` shows it, with until when it can be restored and its content.
    let listed = world.run(&["list", "--soft-deleted"]).await;
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let items = listed.json["soft_deleted"].as_array().unwrap().clone();
    assert_eq!(items.len(), 1, "{}", listed.json);
    assert_eq!(items[0]["version"], KEY);
    assert_eq!(items[0]["definition"], DEFINITION);
    assert_eq!(items[0]["image_sha256"], generated.image_sha256);
    assert!(
        items[0]["restorable_until"].as_str().is_some(),
        "{}",
        listed.json
    );

    // `lookup` says it is soft-deleted, until when, and who still uses it: a VM built from it by
    // name while it was soft-deleted (Azure allows that until its consumption end).
    let lookup = ["lookup", "--name", DEFINITION, "--version", "1.506"];
    let absent = world.run(&lookup).await;
    let text = format!("{}{}", absent.json, absent.stderr);
    assert_eq!(absent.code, 3, "{text}");
    assert!(
        text.contains("it is soft-deleted, restorable until")
            && text.contains("no consumer names or runs it"),
        "{text}"
    );
    let vm = format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/virtualMachines/late-vm"
    );
    let world_file = serde_json::json!({"resources": [{
        "id": vm, "location": LOC,
        "properties": {"storageProfile": {"imageReference": {"id": items[0]["id"]}}}
    }]});
    let r = admin(&world.emulator, "PUT", "/_emulator/world", Some(world_file)).await;
    assert!(r.status < 300, "{}", r.text);
    let absent = world.run(&lookup).await;
    let text = format!("{}{}", absent.json, absent.stderr);
    assert!(
        text.contains("still used by") && text.contains("late-vm"),
        "{text}"
    );

    // Seeded again: the version comes back, nothing is uploaded, the new reference is recorded.
    world.emulator.state.reset_log();
    let again = world.seed(&path, &["--reference", "r2"]).await;
    let j = again.assert_ok();
    assert_eq!(j["outcome"], "restored", "{j}");
    assert_eq!(j["uploaded"], false, "{j}");
    assert_eq!(j["bytes_sent"], 0, "{j}");
    // `delete` removed the version's source blob (a gallery version does not need it once
    // made); the restore needs none either, and makes none.
    assert_eq!(world.stemcell_blobs().await.len(), 0, "no blob uploaded");
    let writes = world.writes();
    assert!(
        !writes
            .iter()
            .any(|w| w.contains("/stemcell/bosh-stemcell-")),
        "no stemcell blob written: {writes:?}"
    );
    assert!(
        !writes.iter().any(|w| w.starts_with("PUT ")
                && w.contains("/versions/")
                // The delete lock of a held version is not a version write.
                && !w.contains("/Microsoft.Authorization/locks")),
        "no version created: {writes:?}"
    );
    let v = world.version(DEFINITION, KEY).await.expect("restored");
    assert_eq!(v["properties"]["provisioningState"], "Succeeded");
    assert_eq!(references(&v), vec!["r2".to_string()], "{v}");
    let listed = world.run(&["list", "--soft-deleted"]).await;
    assert_eq!(listed.json["soft_deleted"], serde_json::json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_stemcell_under_a_soft_deleted_name_is_refused_naming_it_and_nothing_is_written()
{
    let world = soft_delete_world().await;
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = write_stemcell(dir.path(), "old.tgz", &small_spec("'1.506'", 7, 4));
    let (rebuilt, _) = write_stemcell(dir.path(), "new.tgz", &small_spec("'1.506'", 8, 4));
    world.seed(&old, &["--reference", "r1"]).await.assert_ok();
    delete_last_reference(&world, Some("r1")).await;

    world.emulator.state.reset_log();
    let refused = world.seed(&rebuilt, &["--reference", "r2"]).await;
    assert_eq!(refused.code, 4, "{}\n{}", refused.json, refused.stderr);
    let text = format!("{}{}", refused.json, refused.stderr);
    for needle in [
        "is soft-deleted",
        "restorable until",
        "stemcell-gallery restore --name",
        "bypassSoftDelete=true",
        "Nothing was uploaded",
    ] {
        assert!(text.contains(needle), "says {needle:?}: {text}");
    }
    assert_eq!(world.writes(), Vec::<String>::new(), "nothing written");
    assert!(world.version(DEFINITION, KEY).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_brings_a_version_back_once_and_names_what_is_restorable_otherwise() {
    let world = soft_delete_world().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, generated) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 7, 4));
    world.seed(&path, &["--reference", "r1"]).await.assert_ok();
    delete_last_reference(&world, Some("r1")).await;

    let restore = ["restore", "--name", DEFINITION, "--version", "1.506"];
    let restored = world.run(&restore).await;
    assert_eq!(restored.code, 0, "{}\n{}", restored.json, restored.stderr);
    assert_eq!(restored.json["outcome"], "restored");
    assert_eq!(restored.json["provisioning_state"], "Succeeded");
    assert_eq!(restored.json["image_sha256"], generated.image_sha256);
    assert_eq!(
        restored.json["used_while_soft_deleted_by"],
        serde_json::json!([])
    );
    assert!(world.version(DEFINITION, KEY).await.is_some());

    // Again: it is there, nothing to do.
    let again = world.run(&restore).await;
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.json["outcome"], "present");

    // A name nothing holds: exit 3, naming what is restorable.
    let other = ["restore", "--name", DEFINITION, "--version", "9.9"];
    let missing = world.run(&other).await;
    assert_eq!(missing.code, 3, "{}\n{}", missing.json, missing.stderr);
    let text = format!("{}{}", missing.json, missing.stderr);
    assert!(
        text.contains("nothing to restore") && text.contains("holds no soft-deleted versions"),
        "{text}"
    );
    delete_last_reference(&world, None).await;
    let missing = world.run(&other).await;
    let text = format!("{}{}", missing.json, missing.stderr);
    assert_eq!(missing.code, 3, "{text}");
    assert!(text.contains("1.506.0 (until "), "names what is: {text}");
}

/// A version another tool made (Azure CPI v53.0.0: no `image_sha256`, no reference record) and
/// deleted in a soft-delete gallery: its content is unknown, so a seed under its name is refused
/// (exit 4) rather than restoring a version that may hold another image. Once the operator
/// restores it, the seed adopts it as it adopts any v53.0.0 version (its blob holds the VHD).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tools_soft_deleted_version_is_refused_until_restored_then_adopted() {
    let world = soft_delete_world().await;
    let dir = tempfile::tempdir().unwrap();
    let spec = small_spec("'1.506'", 7, 4);
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &spec);
    let cid = "bosh-stemcell-3c3c3c3c-1111-2222-3333-444455556666";
    world.cpi_v53_version(cid, "1.506", &vhd_bytes(&spec)).await;
    let version = format!(
        "{}/images/{DEFINITION}/versions/{KEY}",
        crate::support::emulated::gallery_path(GALLERY)
    );
    let raw = Raw::new(&world.emulator.arm);
    let deleted = raw.delete(&version).await;
    assert!(deleted.status < 300, "{}", deleted.text);
    crate::support::emulated::until_settled(&raw, &version).await;
    assert!(world.version(DEFINITION, KEY).await.is_none());

    world.emulator.state.reset_log();
    let refused = world.seed(&path, &["--reference", "r1"]).await;
    let text = format!("{}{}", refused.json, refused.stderr);
    assert_eq!(refused.code, 4, "{text}");
    assert!(text.contains("recorded no content for it"), "{text}");
    assert_eq!(world.writes(), Vec::<String>::new(), "nothing written");

    let restored = world
        .run(&["restore", "--name", DEFINITION, "--version", "1.506"])
        .await;
    assert_eq!(restored.code, 0, "{}", restored.stderr);
    assert_eq!(restored.json["image_sha256"], Value::Null);
    let adopted = world.seed(&path, &["--reference", "r1"]).await;
    let j = adopted.assert_ok();
    assert_eq!(j["outcome"], "reused", "{j}");
    let v = world.version(DEFINITION, KEY).await.unwrap();
    assert!(references(&v).contains(&"r1".to_string()), "{v}");
}

/// Two hosts seed the same stemcell under a soft-deleted name at once: the version is restored
/// once (under its lock, the second finds it back), both references are recorded, nothing is
/// created and nothing uploaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hosts_seeding_a_soft_deleted_stemcell_at_once_both_keep_their_reference() {
    let world = soft_delete_world().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 7, 4));
    world.seed(&path, &["--reference", "r1"]).await.assert_ok();
    delete_last_reference(&world, Some("r1")).await;

    world.emulator.state.reset_log();
    let (a, b) = tokio::join!(
        world.seed(&path, &["--reference", "r2"]),
        world.seed(&path, &["--reference", "r3"])
    );
    for s in [&a, &b] {
        let j = s.assert_ok();
        assert_eq!(j["uploaded"], false, "{j}");
        assert!(
            j["outcome"] == "restored" || j["outcome"] == "reused",
            "{j}"
        );
    }
    let v = world.version(DEFINITION, KEY).await.expect("restored");
    let mut refs = references(&v);
    refs.sort();
    assert_eq!(refs, vec!["r2".to_string(), "r3".to_string()], "{v}");
    let writes = world.writes();
    assert!(
        !writes.iter().any(|w| w.starts_with("PUT ")
                && w.contains("/versions/")
                // The delete lock of a held version is not a version write.
                && !w.contains("/Microsoft.Authorization/locks")),
        "no version created: {writes:?}"
    );
    assert!(
        !writes
            .iter()
            .any(|w| w.contains("/stemcell/bosh-stemcell-")),
        "nothing uploaded: {writes:?}"
    );
}
