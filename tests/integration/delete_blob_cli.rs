//! CLI `delete` follows delete_stemcell's rules for the source blob: once the version is deleted,
//! its blob goes too, unless another version is made from it; the output says which.

use crate::support::seeding;

use seeding::{small_spec, vhd_bytes, write_stemcell, World, DEFINITION};
use serde_json::Value;

async fn delete(world: &World, extra: &[&str]) -> (i32, Value, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_stemcell-gallery"));
    for var in [
        "STEMCELL_GALLERY_CONFIG",
        "STEMCELL_GALLERY_ARM_ENDPOINT",
        "STEMCELL_GALLERY_BLOB_ENDPOINT",
        "STEMCELL_GALLERY_AUTH",
        "AZURE_SUBSCRIPTION_ID",
    ] {
        cmd.env_remove(var);
    }
    cmd.args(world.global_args())
        .args(["delete", "--name", DEFINITION, "--version", "1.506"])
        .args(extra);
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap())
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_removes_the_source_blob_once_no_version_is_made_from_it() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 2));
    // create-env uploads the blob; the director's version is made from the same blob.
    // `seed` records a reference only when asked (issue 15 item 2): record each one as its
    // director would.
    let ce_cid = "bosh-stemcell-create-env-a".to_string();
    let ce = world
        .seed(&path, &["--create-env", "--reference", &ce_cid])
        .await;
    assert_eq!(ce.assert_ok()["reference"], ce_cid.as_str());
    let blob_uri = ce.json["blob_uri"].as_str().unwrap().to_string();
    let director_cid = "bosh-stemcell-director-a".to_string();
    let director = world.seed(&path, &["--reference", &director_cid]).await;
    assert_eq!(director.assert_ok()["reference"], director_cid.as_str());
    assert_eq!(director.json["blob_uri"], blob_uri.as_str());
    assert_eq!(world.stemcell_blobs().await.len(), 1);

    // The director's version goes; the blob stays for the create-env version.
    let (code, doc, stderr) = delete(&world, &["--reference", &director_cid]).await;
    assert_eq!(code, 0, "{doc}\n{stderr}");
    assert_eq!(doc["result"], "deleted", "{doc}");
    assert_eq!(doc["blob"]["result"], "kept", "{doc}");
    assert_eq!(doc["blob"]["uri"], blob_uri.as_str(), "{doc}");
    assert_eq!(world.stemcell_blobs().await.len(), 1);

    // The last version made from it goes: so does the blob.
    let (code, doc, stderr) = delete(&world, &["--create-env", "--reference", &ce_cid]).await;
    assert_eq!(code, 0, "{doc}\n{stderr}");
    assert_eq!(doc["result"], "deleted", "{doc}");
    assert_eq!(doc["blob"]["result"], "deleted", "{doc}");
    assert!(
        world.stemcell_blobs().await.is_empty(),
        "{:?}",
        world
            .stemcell_blobs()
            .await
            .iter()
            .map(|b| b.name.clone())
            .collect::<Vec<_>>()
    );
    assert!(world
        .version(&format!("{DEFINITION}-create-env"), "1.506.0")
        .await
        .is_none());
}

/// A version the Azure CPI made records no `source_blob`; deleting its CID through `delete`
/// still removes that CID's own blob `<cid>.vhd`, as the CPI's delete_stemcell does.
#[tokio::test(flavor = "multi_thread")]
async fn delete_of_a_cpi_made_cid_removes_the_cids_own_blob() {
    let world = World::start().await;
    let cid = "bosh-stemcell-de1e7e00-0000-4000-8000-000000000001";
    world
        // A fixed VHD: Azure (and the emulator) refuse a source that is not one.
        .cpi_v53_version(cid, "1.506", &vhd_bytes(&small_spec("'1.506'", 3, 1)))
        .await;
    assert_eq!(world.stemcell_blobs().await.len(), 1);

    let (code, doc, stderr) = delete(&world, &["--reference", cid]).await;
    assert_eq!(code, 0, "{doc}\n{stderr}");
    assert_eq!(doc["result"], "deleted", "{doc}");
    assert_eq!(doc["blob"]["result"], "none", "{doc}");
    assert_eq!(doc["cid_blob"]["result"], "deleted", "{doc}");
    assert!(world.stemcell_blobs().await.is_empty());
}

/// Issue 28 item 7: after `seed` (no reference recorded), `delete --reference <the seed's CID>`
/// names a reference the version does not record. It says so (exit 3), removes nothing, deletes
/// neither the version nor any blob — the CID's blob is the version's source blob here. Before:
/// exit 0, "removed", and the source blob of the version it kept deleted.
#[tokio::test(flavor = "multi_thread")]
async fn delete_of_a_reference_the_version_does_not_record_deletes_nothing() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 2));
    let seeded = world.seed(&path, &[]).await;
    let doc = seeded.assert_ok().clone();
    let cid = doc["cid"].as_str().unwrap().to_string();
    assert!(doc["reference"].is_null(), "seed records nothing: {doc}");
    let blobs = world.stemcell_blobs().await.len();
    assert_eq!(blobs, 1);

    let (code, out, stderr) = delete(&world, &["--reference", &cid]).await;
    assert_eq!(code, 3, "{out}\n{stderr}");
    let message = out["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&cid) && message.contains("not recorded"),
        "{out}"
    );
    assert!(world.version(DEFINITION, "1.506.0").await.is_some());
    assert_eq!(world.stemcell_blobs().await.len(), blobs, "no blob deleted");

    // One recorded and one not: the recorded one goes, the other is reported, exit 0.
    let (held, other) = ("held-by-director-a", "held-by-director-b");
    for r in [held, other] {
        assert_eq!(world.seed(&path, &["--reference", r]).await.code, 0);
    }
    let (code, out, stderr) = delete(&world, &["--reference", &cid, "--reference", held]).await;
    assert_eq!(code, 0, "{out}\n{stderr}");
    assert_eq!(out["result"], "kept", "{out}");
    assert_eq!(
        out["removed_references"],
        serde_json::json!([held]),
        "{out}"
    );
    assert_eq!(out["not_recorded"], serde_json::json!([cid]), "{out}");
    assert!(out.get("cid_blob").is_none(), "{out}");
    assert_eq!(world.stemcell_blobs().await.len(), blobs, "no blob deleted");
}

/// Issue 44 item 7: automation retries. `delete --reference a` that removed `a` and was killed
/// before it could say so, run again, is done: `already-removed`, exit 0 (the record shows the
/// removal); a reference never recorded is still exit 3.
#[tokio::test(flavor = "multi_thread")]
async fn a_rerun_of_a_removal_that_was_done_is_already_removed_not_an_error() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 2));
    world
        .seed(&path, &["--reference", "ref-a"])
        .await
        .assert_ok();
    world
        .seed(&path, &["--reference", "ref-b"])
        .await
        .assert_ok();
    let (code, doc, stderr) = delete(&world, &["--reference", "ref-a"]).await;
    assert_eq!(code, 0, "{doc}\n{stderr}");
    assert_eq!(doc["result"], "kept", "{doc}");
    // The re-run.
    let (code, doc, stderr) = delete(&world, &["--reference", "ref-a"]).await;
    assert_eq!(code, 0, "{doc}\n{stderr}");
    assert_eq!(doc["result"], "already-removed", "{doc}");
    assert_eq!(
        doc["already_removed"],
        serde_json::json!(["ref-a"]),
        "{doc}"
    );
    assert_eq!(
        doc["remaining_references"],
        serde_json::json!(["ref-b"]),
        "{doc}"
    );
    // Never recorded: not found, as before.
    let (code, doc, _) = delete(&world, &["--reference", "ref-never"]).await;
    assert_eq!(code, 3, "{doc}");
    assert!(world.version(DEFINITION, "1.506.0").await.is_some());
}
