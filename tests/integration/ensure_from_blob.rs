//! `ensure --blob-uri`: the version from a VHD already in storage (issue 28 items 5 and 6).
//! A blob that cannot be a version's source is refused before any write (no version PUT, no
//! lock blob); a reuse whose reference is already recorded costs one ARM request.

use crate::support::blobsdk::{BlobExt, ContainerExt};
use crate::support::emulated::put_fixed_vhd;
use crate::support::seeding;

use seeding::{small_spec, write_stemcell, World, DEFINITION};

const SHA: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

fn ensure_args<'a>(uri: &'a str, reference: &'a str) -> Vec<&'a str> {
    vec![
        "ensure",
        "--blob-uri",
        uri,
        "--name",
        DEFINITION,
        "--version",
        "1.506",
        "--sha256",
        SHA,
        "--reference",
        reference,
    ]
}

/// A blob that does not exist is exit 3, and so is nothing else written: no version PUT, no
/// lock blob, nothing in the container. A block blob, or a page blob that is no fixed VHD, is
/// exit 1 the same way. (Before: the lock taken, the version PUT, waited for until it failed,
/// deleted, exit 1, the lock blob left.)
#[tokio::test(flavor = "multi_thread")]
async fn ensure_from_a_blob_that_cannot_be_a_source_writes_nothing() {
    let world = World::start().await;
    let container = world.container();
    let _ = container.create().await;
    let missing = format!("{}/stemcell/missing.vhd", world.blob_endpoint);
    let r = world.run(&ensure_args(&missing, "r1")).await;
    assert_eq!(r.code, 3, "{}\n{}", r.json, r.stderr);
    assert!(r.stderr.contains("does not exist"), "{}", r.stderr);

    container
        .blob_client("block.vhd")
        .put_block_blob(vec![0; 1024], false, None, &[])
        .await
        .unwrap();
    let page = container.blob_client("not-a-vhd.vhd");
    page.put_page_blob(2 << 20, &[]).await.unwrap();
    let before = world.writes();
    for (name, why) in [("block.vhd", "page blob"), ("not-a-vhd.vhd", "not a VHD")] {
        let uri = format!("{}/stemcell/{name}", world.blob_endpoint);
        let r = world.run(&ensure_args(&uri, "r1")).await;
        assert_eq!(r.code, 1, "{name}: {}\n{}", r.json, r.stderr);
        assert!(r.stderr.contains(why), "{name}: {}", r.stderr);
    }
    assert_eq!(world.writes(), before, "nothing written");
    let names: Vec<String> = container
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("locks/") || n.starts_with("galleries/")),
        "no lock blob: {names:?}"
    );
    assert!(world.version(DEFINITION, "1.506.0").await.is_none());

    // A fixed VHD is taken.
    put_fixed_vhd(&container, "good.vhd", 2).await;
    let good = format!("{}/stemcell/good.vhd", world.blob_endpoint);
    let r = world.run(&ensure_args(&good, "r1")).await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    assert_eq!(r.json["outcome"], "created");
}

/// A reuse whose reference is already recorded is one ARM request: the version GET (no
/// subscription-wide storage account list, bench/README's budget). (Before: two.)
#[tokio::test(flavor = "multi_thread")]
async fn ensure_reusing_a_version_that_holds_its_reference_is_one_arm_request() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 2));
    let seeded = world.seed(&path, &["--reference", "r1"]).await;
    let doc = seeded.assert_ok().clone();
    let uri = doc["blob_uri"].as_str().unwrap().to_string();
    let sha = doc["image_sha256"].as_str().unwrap().to_string();
    world.emulator.state.reset_log();
    let args = [
        "ensure",
        "--blob-uri",
        &uri,
        "--name",
        DEFINITION,
        "--version",
        "1.506",
        "--sha256",
        &sha,
        "--reference",
        "r1",
    ];
    let r = world.run(&args).await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    assert_eq!(r.json["outcome"], "reused");
    let arm: Vec<String> = world
        .emulator
        .state
        .requests()
        .into_iter()
        .filter(|r| r.path.starts_with("/subscriptions/"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(arm.len(), 1, "{arm:?}");
    assert!(arm[0].starts_with("GET ") && arm[0].ends_with("/versions/1.506.0"));
}
