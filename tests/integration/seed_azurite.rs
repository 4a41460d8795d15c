//! `seed` with Microsoft's storage emulator (Azurite) holding the blobs and the local emulator
//! answering ARM: the blob equals the VHD, and a second seed sends nothing.

use crate::support::azurite;
use crate::support::seeding;

use seeding::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_to_azurite_writes_exactly_the_vhd_and_reuses_on_rerun() {
    let az = azurite::Azurite::start();
    let mut world = World::start().await;
    world.blob_endpoint = az
        .blob_endpoint()
        .to_string()
        .trim_end_matches('/')
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let spec = small_spec("'1.506'", 21, 6);
    let (path, generated) = write_stemcell(dir.path(), "a.tgz", &spec);
    let vhd = vhd_bytes(&spec);

    let first = world.seed(&path, &["--concurrency", "4"]).await;
    let j = first.assert_ok();
    assert_eq!(j["outcome"], "created");
    assert_eq!(j["bytes_sent"], generated.data_bytes);
    let uri = j["blob_uri"].as_str().unwrap();
    assert!(uri.starts_with(&world.blob_endpoint), "{uri}");
    let blobs = world.stemcell_blobs().await;
    assert_eq!(blobs.len(), 1);
    assert!(blobs[0].is_complete());
    assert_eq!(blobs[0].metadata["image_sha256"], generated.image_sha256);
    assert_blob_is_vhd(&world.container(), &blobs[0].name, &vhd).await;

    let again = world.seed(&path, &[]).await;
    let j = again.assert_ok();
    assert_eq!(j["outcome"], "reused");
    assert_eq!(j["bytes_sent"], 0);
    assert_eq!(j["uploaded"], false);
    assert_eq!(world.stemcell_blobs().await.len(), 1);
}
