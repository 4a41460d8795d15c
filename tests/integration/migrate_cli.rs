//! `migrate` (issue 47): a director that ran before the gallery was enabled holds stemcells
//! whose CIDs name page blobs `stemcell/<cid>.vhd`, the cloud properties as blob metadata
//! (REFERENCE.md "Pre-gallery stemcells"). The dry run changes nothing; `--apply` makes the
//! versions from those blobs, uploading nothing, and records each CID where the director's CPI
//! looks for it.

use std::path::Path;

use crate::support::azure_cpi::PlainCpi;
use crate::support::blobsdk::{BlobExt, ContainerExt};
use crate::support::emulated::Raw;
use crate::support::seeding::{Seeded, World, DEFINITION, GALLERY, RG, SUB};
use crate::support::stemcells::fixed_vhd_footer;
use serde_json::{json, Value};

const DIRECTOR: &str = "0d1e2c3b-4a59-4687-8a9b-0c1d2e3f4a5b";
const HEAVY: &str = "bosh-stemcell-a1000000-0000-4000-8000-00000000000a";
const TWIN: &str = "bosh-stemcell-a2000000-0000-4000-8000-00000000000b";
const NEWER: &str = "bosh-stemcell-a3000000-0000-4000-8000-00000000000c";
const GONE: &str = "bosh-stemcell-a4000000-0000-4000-8000-00000000000d";
const LIGHT: &str = "bosh-light-stemcell-a5000000-0000-4000-8000-00000000000e";

/// What the plain Azure CPI left without a gallery: a fixed VHD page blob `<cid>.vhd` of 2 MiB
/// whose first sector is `fill`, the stemcell's cloud properties as its metadata.
async fn pre_gallery_blob(world: &World, cid: &str, version: &str, fill: u8) {
    let container = world.container();
    let _ = container.create().await;
    let size = (2u64 << 20) + 512;
    let blob = container.blob_client(format!("{cid}.vhd"));
    let meta = [
        ("name", DEFINITION),
        ("version", version),
        ("infrastructure", "azure"),
        ("hypervisor", "hyperv"),
        ("disk", "3072"),
        ("os_type", "linux"),
        ("os_distro", "ubuntu"),
        ("architecture", "x86_64"),
    ];
    blob.put_page_blob(size, &meta).await.unwrap();
    blob.put_page(0, 511, vec![fill; 512]).await.unwrap();
    blob.put_page(size - 512, size - 1, fixed_vhd_footer())
        .await
        .unwrap();
}

/// The director's three heavy stemcells: HEAVY and its twin TWIN (1.506, the same VHD) and
/// NEWER (1.507).
async fn heavy_twin_newer(world: &World) {
    pre_gallery_blob(world, HEAVY, "1.506", 0x11).await;
    pre_gallery_blob(world, TWIN, "1.506", 0x11).await;
    pre_gallery_blob(world, NEWER, "1.507", 0x22).await;
}

fn director_list(dir: &Path, rows: &[(&str, &str)]) -> String {
    let rows: Vec<Value> = rows
        .iter()
        .map(|(v, c)| json!({"name": DEFINITION, "version": v, "os": "ubuntu-jammy", "cpi": "", "cid": c}))
        .collect();
    let doc = json!({"Tables": [{"Content": "stemcells",
        "Header": {"name": "Name", "version": "Version", "os": "OS", "cpi": "CPI", "cid": "CID"},
        "Rows": rows, "Notes": ["(*) Currently deployed"]}], "Blocks": null, "Lines": ["Succeeded"]});
    let path = dir.join("director.json");
    std::fs::write(&path, doc.to_string()).unwrap();
    format!("{DIRECTOR}={}", path.display())
}

/// `migrate --director-stemcells LIST EXTRA...` run to its end.
async fn migrate(world: &World, list: &str, extra: &[&str]) -> Seeded {
    let mut args = vec!["migrate", "--director-stemcells", list];
    args.extend_from_slice(extra);
    world.run(&args).await
}

fn by_cid<'a>(out: &'a Value, cid: &str) -> &'a Value {
    out["stemcells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["cid"] == cid)
        .unwrap_or_else(|| panic!("{cid} in {out}"))
}

/// The `.vhd` blobs of the world's stemcell container, sorted.
async fn blob_names(world: &World) -> Vec<String> {
    let mut n: Vec<String> = world
        .container()
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.name)
        .filter(|n| n.ends_with(".vhd"))
        .collect();
    n.sort();
    n
}

/// The done-when: a heavy stemcell, a twin CID of the same version and content, a
/// newer stemcell, a CID whose blob is gone and a light stemcell. The dry run writes nothing;
/// `--apply` makes two versions from the blobs (0 bytes uploaded: no blob is written or made),
/// records every CID with holder `director:<uuid>`, locks them, and `lookup --cid` finds each;
/// a second `--apply` changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_directors_pre_gallery_stemcells_become_versions_made_from_their_own_blobs() {
    // The shipped role, and the optional read of managed images (deploy/azure/README.md).
    let mut role = stemcell_gallery::cli::embedded::least_privilege_role();
    role.actions.push("Microsoft.Compute/images/read".into());
    let world = World::start_with_role(Default::default(), role).await;
    heavy_twin_newer(&world).await;
    let dir = tempfile::tempdir().unwrap();
    let list = director_list(
        dir.path(),
        &[
            ("1.506*", HEAVY),
            ("1.506", TWIN),
            ("1.507", NEWER),
            ("1.505", GONE),
            ("1.506", LIGHT),
        ],
    );
    // The managed image the plain CPI made from HEAVY's blob for a VM (`<cid>-<type>-<location>`).
    let image = format!("{HEAVY}-Standard_LRS-westeurope");
    let image_path = format!(
        "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/images/{image}?api-version=2024-07-01"
    );
    let raw = Raw::new(&world.emulator.arm);
    let put = raw
        .put(&image_path, json!({"location": "westeurope"}))
        .await;
    assert!(put.status < 300, "{}", put.text);
    let blobs_before = blob_names(&world).await;

    let writes = world.writes().len();
    let dry = migrate(&world, &list, &[]).await;
    assert_eq!(dry.code, 0, "{}\n{}", dry.json, dry.stderr);
    assert_eq!(
        world.writes().len(),
        writes,
        "the dry run writes nothing: {:?}",
        &world.writes()[writes..]
    );
    assert_eq!(by_cid(&dry.json, HEAVY)["plan"], "create");
    assert_eq!(
        by_cid(&dry.json, HEAVY)["version"],
        format!("{DEFINITION}/1.506.0")
    );
    assert_eq!(by_cid(&dry.json, TWIN)["plan"], "record", "{}", dry.json);
    assert_eq!(by_cid(&dry.json, NEWER)["plan"], "create");
    assert_eq!(by_cid(&dry.json, GONE)["skip"], "blob-gone");
    assert_eq!(by_cid(&dry.json, LIGHT)["skip"], "light");
    assert_eq!(
        by_cid(&dry.json, HEAVY)["managed_images"],
        json!([image]),
        "reported"
    );
    assert_eq!(by_cid(&dry.json, TWIN)["managed_images"], json!([]));
    assert!(world.version(DEFINITION, "1.506.0").await.is_none());

    let applied = migrate(&world, &list, &["--apply"]).await;
    assert_eq!(applied.code, 0, "{}\n{}", applied.json, applied.stderr);
    assert_eq!(applied.json["bytes_uploaded"], 0);
    assert_eq!(by_cid(&applied.json, HEAVY)["result"], "created");
    assert_eq!(by_cid(&applied.json, TWIN)["result"], "recorded");
    assert_eq!(by_cid(&applied.json, NEWER)["result"], "created");
    let after = blob_names(&world).await;
    assert_eq!(after, blobs_before, "no blob made or deleted");

    for (key, cid, fill_blob) in [("1.506.0", HEAVY, HEAVY), ("1.507.0", NEWER, NEWER)] {
        let v = world.version(DEFINITION, key).await.expect("made");
        let source = v["properties"]["storageProfile"]["osDiskImage"]["source"]["uri"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            source.ends_with(&format!("/stemcell/{fill_blob}.vhd")),
            "{source}"
        );
        let tags = &v["tags"];
        assert!(
            tags.get("image_sha256").is_none(),
            "no made-up image_sha256: {tags}"
        );
        assert_eq!(
            tags["stemcell_gallery_vhd_content"].as_str().unwrap().len(),
            64,
            "{tags}"
        );
        let found = world.run(&["lookup", "--cid", cid]).await;
        assert_eq!(found.code, 0, "{}\n{}", found.json, found.stderr);
        assert_eq!(found.json["version"], key, "{}", found.json);
        // Held means locked (the ledger's delete lock).
        let locks = Raw::new(&world.emulator.arm)
            .get(&format!(
                "{}/providers/Microsoft.Authorization/locks?api-version=2016-09-01",
                v["id"].as_str().unwrap()
            ))
            .await;
        assert!(
            locks.text.contains("stemcell-gallery-held"),
            "{}",
            locks.text
        );
    }
    assert_eq!(
        raw.get(&image_path).await.status,
        200,
        "the managed image is not deleted"
    );
    let twin = world.run(&["lookup", "--cid", TWIN]).await;
    assert_eq!(twin.json["version"], "1.506.0", "{}", twin.json);
    // The director's create_vm through the front: the front hands the delegate Azure CPI the
    // version's sentinel for a CID it records (docs/cpi.md), and the CPI's own lookup (its exact
    // request: the group's resources filtered by the gallery tag, first page) finds the version.
    let v = world.version(DEFINITION, "1.506.0").await.unwrap();
    let sentinel = v["tags"]["stemcell_references"]
        .as_str()
        .unwrap()
        .split(',')
        .find(|s| s.starts_with("sg-held-"))
        .expect("the sentinel")
        .to_string();
    let cpi = PlainCpi::new(&world.emulator.arm, GALLERY);
    assert_eq!(
        cpi.create_vm(&sentinel).await.as_deref(),
        v["id"].as_str(),
        "the plain CPI resolves what the front hands it"
    );
    let listed = world.run(&["list"]).await;
    assert!(
        listed
            .json
            .to_string()
            .contains(&format!("director:{DIRECTOR}")),
        "holders recorded: {}",
        listed.json
    );

    let writes = world.writes().len();
    let again = migrate(&world, &list, &["--apply"]).await;
    assert_eq!(again.code, 0, "{}\n{}", again.json, again.stderr);
    for cid in [HEAVY, TWIN, NEWER] {
        assert_eq!(
            by_cid(&again.json, cid)["skip"],
            "in-gallery",
            "{}",
            again.json
        );
    }
    assert_eq!(world.writes().len(), writes, "a re-run writes nothing");
}

/// A director on the plain Azure CPI (v53.1+): the CID goes into `stemcell_references`, where
/// that CPI's own `create_vm` lookup (its exact request: the resource list filtered by the
/// gallery tag, first page) resolves it to the version.
#[tokio::test(flavor = "multi_thread")]
async fn for_the_plain_azure_cpi_its_create_vm_lookup_finds_each_migrated_cid() {
    let world = World::start().await;
    pre_gallery_blob(&world, HEAVY, "1.506", 0x11).await;
    pre_gallery_blob(&world, NEWER, "1.507", 0x22).await;
    let dir = tempfile::tempdir().unwrap();
    let list = director_list(dir.path(), &[("1.506", HEAVY), ("1.507", NEWER)]);
    let cpi = PlainCpi::new(&world.emulator.arm, GALLERY);
    assert_eq!(
        cpi.create_vm(HEAVY).await,
        None,
        "not in the gallery before"
    );
    let r = migrate(&world, &list, &["--apply", "--record-for", "azure-cpi"]).await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    for (cid, key) in [(HEAVY, "1.506.0"), (NEWER, "1.507.0")] {
        let id = cpi
            .create_vm(cid)
            .await
            .unwrap_or_else(|| panic!("{cid} resolves"));
        assert!(id.ends_with(&format!("/versions/{key}")), "{id}");
        let v = world.version(DEFINITION, key).await.unwrap();
        assert!(
            v["tags"]["stemcell_references"]
                .as_str()
                .unwrap()
                .contains(cid),
            "{}",
            v["tags"]
        );
    }
}

/// A version of that stemcell version already holds other content: exit 4 naming both, in the
/// dry run and in `--apply`, and nothing is changed.
#[tokio::test(flavor = "multi_thread")]
async fn a_version_of_other_content_is_a_conflict_naming_both() {
    let world = World::start().await;
    pre_gallery_blob(&world, HEAVY, "1.506", 0x11).await;
    // Another build of 1.506, already in the gallery (made from its own blob).
    pre_gallery_blob(&world, TWIN, "1.506", 0x33).await;
    let dir = tempfile::tempdir().unwrap();
    let first = director_list(dir.path(), &[("1.506", TWIN)]);
    let r = migrate(&world, &first, &["--apply"]).await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);

    let list = director_list(dir.path(), &[("1.506", HEAVY)]);
    let writes = world.writes().len();
    for extra in [&[][..], &["--apply"][..]] {
        let r = migrate(&world, &list, extra).await;
        assert_eq!(r.code, 4, "{extra:?}: {}\n{}", r.json, r.stderr);
        let detail = by_cid(&r.json, HEAVY)["detail"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            detail.contains("1.506.0") && detail.contains(&format!("{HEAVY}.vhd")),
            "{detail}"
        );
    }
    assert_eq!(world.writes().len(), writes, "nothing changed");
}

/// A migrated version is adopted by the first upload of the same stemcell: `seed` compares its
/// VHD with the version's recorded content digest (the source blob is not needed), records the
/// stemcell's `image_sha256` on it and uploads nothing; the migrated CID stays held.
#[tokio::test(flavor = "multi_thread")]
async fn the_first_upload_of_a_migrated_stemcell_adopts_its_version_uploading_nothing() {
    let world = World::start().await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixture = root.join("fixtures/stemcells/gen1-x86_64.tgz");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "tar -xzOf {} image | tar -xzO root.vhd",
            fixture.display()
        ))
        .output()
        .unwrap();
    let vhd = out.stdout;
    assert_eq!(vhd.len(), (2 << 20) + 512, "the fixture's root.vhd");
    let container = world.container();
    let _ = container.create().await;
    let blob = container.blob_client(format!("{HEAVY}.vhd"));
    let meta = [
        ("name", DEFINITION),
        ("version", "1.506"),
        ("os_type", "linux"),
        ("architecture", "x86_64"),
    ];
    blob.put_page_blob(vhd.len() as u64, &meta).await.unwrap();
    blob.put_page(0, vhd.len() as u64 - 1, vhd).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let list = director_list(dir.path(), &[("1.506", HEAVY)]);
    let r = migrate(&world, &list, &["--apply"]).await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    // The director deletes nothing, but the blob could be gone: the tag is the proof.
    blob.delete().await.unwrap();

    let seeded = world.seed(&fixture, &["--reference", "pipeline-a"]).await;
    assert_eq!(seeded.code, 0, "{}\n{}", seeded.json, seeded.stderr);
    assert_eq!(seeded.json["bytes_sent"], 0, "{}", seeded.json);
    assert_eq!(seeded.json["uploaded"], false, "{}", seeded.json);
    assert_eq!(
        seeded.json["adopted"]["proof"], "content-matched",
        "{}",
        seeded.json
    );
    let v = world.version(DEFINITION, "1.506.0").await.unwrap();
    let sha = v["tags"]["image_sha256"].as_str().unwrap_or_default();
    assert_eq!(
        sha.len(),
        64,
        "the stemcell's image_sha256 recorded: {}",
        v["tags"]
    );
    let found = world.run(&["lookup", "--cid", HEAVY]).await;
    assert_eq!(
        found.json["version"], "1.506.0",
        "the migrated CID stays held: {}",
        found.json
    );
}

/// Two hosts migrating the same list at once (issue 47 item 2): one version per stemcell
/// version, each CID recorded once, both runs exit 0.
#[tokio::test(flavor = "multi_thread")]
async fn two_hosts_migrating_the_same_list_at_once_make_one_version_each() {
    let world = World::start().await;
    heavy_twin_newer(&world).await;
    let dir = tempfile::tempdir().unwrap();
    let list = director_list(
        dir.path(),
        &[("1.506", HEAVY), ("1.506", TWIN), ("1.507", NEWER)],
    );
    let args = ["migrate", "--director-stemcells", list.as_str(), "--apply"];
    let (a, b) = tokio::join!(world.run(&args), world.run(&args));
    assert_eq!(a.code, 0, "{}\n{}", a.json, a.stderr);
    assert_eq!(b.code, 0, "{}\n{}", b.json, b.stderr);
    for (key, cids) in [("1.506.0", vec![HEAVY, TWIN]), ("1.507.0", vec![NEWER])] {
        let v = world.version(DEFINITION, key).await.expect("one version");
        let tags = v["tags"].as_object().unwrap();
        for cid in cids {
            // The reference tags: this tool's overflow and the CPI's list.
            let held: usize = tags
                .iter()
                .filter(|(k, _)| k.starts_with("sg_overflow_refs_") || *k == "stemcell_references")
                .map(|(_, t)| t.as_str().unwrap_or_default().matches(cid).count())
                .sum();
            assert_eq!(held, 1, "{cid} recorded once on {key}: {tags:?}");
        }
    }
    assert!(world.version(DEFINITION, "1.505.0").await.is_none());
}

/// Under the shipped role (no `Microsoft.Compute/images/read`) the managed images are not
/// listed: the run says so, names the action, and migrates all the same.
#[tokio::test(flavor = "multi_thread")]
async fn without_the_right_to_read_managed_images_the_report_says_so_and_migrates() {
    let world = World::start().await;
    pre_gallery_blob(&world, HEAVY, "1.506", 0x11).await;
    let dir = tempfile::tempdir().unwrap();
    let list = director_list(dir.path(), &[("1.506", HEAVY)]);
    let r = migrate(&world, &list, &["--apply"]).await;
    assert_eq!(r.code, 0, "{}\n{}", r.json, r.stderr);
    assert_eq!(by_cid(&r.json, HEAVY)["result"], "created");
    let why = r.json["managed_images_unread"].as_str().unwrap_or_default();
    assert!(
        why.contains("403") || why.contains("Authorization"),
        "{}",
        r.json
    );
    let out = world
        .human_command(&["migrate", "--director-stemcells", &list])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Microsoft.Compute/images/read"), "{text}");
}

/// `--record-for azure-cpi` where `stemcell_references` (256 characters, about five CIDs) has no
/// room for them all: each CID that does not fit is refused on its row (exit 1), saying what to
/// delete first, and nothing half-made is left for it; the ones that fit are the plain CPI's.
#[tokio::test(flavor = "multi_thread")]
async fn for_the_plain_cpi_a_cid_that_does_not_fit_is_refused_and_nothing_is_half_made() {
    let world = World::start().await;
    let cids: Vec<String> = (1..=6)
        .map(|i| format!("bosh-stemcell-b{i}000000-0000-4000-8000-00000000000{i}"))
        .collect();
    for c in &cids {
        pre_gallery_blob(&world, c, "1.506", 0x11).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let rows: Vec<(&str, &str)> = cids.iter().map(|c| ("1.506", c.as_str())).collect();
    let list = director_list(dir.path(), &rows);
    let r = migrate(&world, &list, &["--apply", "--record-for", "azure-cpi"]).await;
    assert_eq!(r.code, 1, "{}\n{}", r.json, r.stderr);
    let cpi = PlainCpi::new(&world.emulator.arm, GALLERY);
    let (mut fit, mut refused) = (0, 0);
    for c in &cids {
        let e = by_cid(&r.json, c);
        if e["result"] == "failed" {
            refused += 1;
            let detail = e["detail"].as_str().unwrap();
            assert!(
                detail.contains("stemcell_references")
                    && (detail.contains("no room") || detail.contains("is full")),
                "{detail}"
            );
            // Recorded on this tool's side but not handed back, or (no room even for the
            // sentinel) not recorded at all: never half-made.
            let found = world.run(&["lookup", "--cid", c]).await;
            if detail.contains("not handed to the plain Azure CPI") {
                assert_eq!(found.json["version"], "1.506.0", "{c} kept: {}", found.json);
            } else {
                assert_eq!(found.code, 3, "{c} not recorded: {}", found.json);
            }
        } else {
            fit += 1;
            assert!(cpi.create_vm(c).await.is_some(), "{c} is the plain CPI's");
        }
    }
    assert!(
        fit >= 4 && refused >= 1,
        "{fit} fit, {refused} refused: {}",
        r.json
    );
}
