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

/// `ensure --blob-uri` of a blob that does not exist, with `--sha256` naming the content a version
/// already holds: the blob is not needed (the digest is the content's identity, and nothing is
/// created from the blob), so the version is reused and the reference recorded, exit 0, as
/// docs/commands.md's exit-code table says; the run warns that the blob does not exist, naming it,
/// in case the URI has a typo. Without `--sha256` the blob is needed for its digest (exit 3), and
/// with another digest the version holds other content (exit 4, nothing recorded) (issue 46 item
/// 5).
#[tokio::test(flavor = "multi_thread")]
async fn ensure_with_a_missing_blob_reuses_a_version_that_holds_the_image_and_says_so() {
    let world = World::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = write_stemcell(dir.path(), "a.tgz", &small_spec("'1.506'", 5, 2));
    let doc = world
        .seed(&path, &["--reference", "r1"])
        .await
        .assert_ok()
        .clone();
    let sha = doc["image_sha256"].as_str().unwrap().to_string();
    let missing = format!("{}/stemcell/bosh-stemcell-tpyo.vhd", world.blob_endpoint);
    let args = |sha: Option<&str>, reference: &str| {
        let mut a = vec![
            "ensure".to_string(),
            "--blob-uri".into(),
            missing.clone(),
            "--name".into(),
            DEFINITION.into(),
            "--version".into(),
            "1.506".into(),
            "--reference".into(),
            reference.into(),
        ];
        if let Some(s) = sha {
            a.extend(["--sha256".to_string(), s.to_string()]);
        }
        a
    };
    let world = &world;
    let run = |a: Vec<String>| async move {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        world.run(&a).await
    };
    let r = run(args(Some(&sha), "r2")).await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    assert_eq!(r.json["outcome"], "reused", "{}", r.json);
    assert!(
        r.json["references"]
            .as_array()
            .is_some_and(|refs| refs.iter().any(|x| x == "r2")),
        "{}",
        r.json
    );
    assert!(
        r.stderr.contains("bosh-stemcell-tpyo.vhd")
            && r.stderr.contains("does not exist")
            && r.stderr.contains("not needed"),
        "the missing blob is named: {}",
        r.stderr
    );

    let r = run(args(None, "r3")).await;
    assert_eq!(r.code, 3, "{}\n{}", r.json, r.stderr);
    let other = SHA;
    let r = run(args(Some(other), "r4")).await;
    assert_eq!(r.code, 4, "{}\n{}", r.json, r.stderr);
    let looked = world
        .run(&["lookup", "--name", DEFINITION, "--version", "1.506"])
        .await;
    assert_eq!(looked.code, 0, "{}\n{}", looked.json, looked.stderr);
    assert_eq!(
        looked.json["references"],
        serde_json::json!(["r1", "r2"]),
        "{}",
        looked.json
    );
}
