//! `create_stemcell` through the binary against the emulator: the create-env → director upload
//! story that used to end in `409 PropertyChangeNotAllowed`.

use crate::support::azure_cpi;
use crate::support::emulated;

use std::io::Read;
use std::path::{Path, PathBuf};

use azure_cpi::{CpiDelete, PlainCpi};
use emulated::*;
use serde_json::{json, Value};
use stemcell_gallery::emulator::Handle;
use stemcell_gallery::gallery::tags;

const GALLERY: &str = "bosh_gallery";

/// What bosh hands the CPI: the extracted `image` file and stemcell.MF's cloud_properties.
fn unpack(stemcell: &str, dir: &Path) -> (PathBuf, Value) {
    let f = std::fs::File::open(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/stemcells")
            .join(stemcell),
    )
    .unwrap();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(f));
    let mut manifest = None;
    let image = dir.join("image");
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        let name = entry
            .path()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches("./")
            .to_string();
        if name == "image" {
            entry.unpack(&image).unwrap();
        } else if name == "stemcell.MF" {
            let mut s = String::new();
            entry.read_to_string(&mut s).unwrap();
            manifest = Some(s);
        }
    }
    let mf: serde_yaml_ng::Value = serde_yaml_ng::from_str(&manifest.unwrap()).unwrap();
    let cloud: Value = serde_json::to_value(&mf["cloud_properties"]).unwrap();
    (image, cloud)
}

async fn cpi(handle: &Handle, request: Value, env: &[(&str, &str)]) -> Value {
    let (code, response) = cpi_with(handle, &[], request, env).await;
    assert_eq!(code, Some(0), "{response}");
    response
}

/// Run `stemcell-gallery cpi` with extra arguments after `cpi` (e.g. `--delegate PATH`): its
/// exit code (a delegate's is relayed) and its one response line.
async fn cpi_with(
    handle: &Handle,
    cpi_args: &[&str],
    request: Value,
    env: &[(&str, &str)],
) -> (Option<i32>, Value) {
    run_cpi(
        &handle.arm,
        &handle.blob,
        GALLERY,
        &[],
        cpi_args,
        request.to_string(),
        env,
    )
    .await
}

async fn versions(handle: &Handle) -> Vec<(String, String, Value)> {
    let raw = Raw::new(&handle.arm);
    let defs = raw.get(&format!("{}/images", gallery_path(GALLERY))).await;
    let mut out = Vec::new();
    for d in defs.body["value"].as_array().unwrap() {
        let name = d["name"].as_str().unwrap().to_string();
        let vs = raw
            .get(&format!("{}/images/{name}/versions", gallery_path(GALLERY)))
            .await;
        for v in vs.body["value"].as_array().unwrap() {
            out.push((
                name.clone(),
                v["name"].as_str().unwrap().to_string(),
                v["tags"].clone(),
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_env_then_director_upload_no_409() {
    let w = shared().await;
    let handle = &w.handle;
    let (image, cloud) = (w.image.as_str(), &w.cloud);

    // bosh create-env: no request_id, BOSH_PACKAGES_DIR set.
    let create_env = cpi(
        handle,
        json!({"method": "create_stemcell", "arguments": [image, cloud],
               "context": {"director_uuid": "d-1"}, "api_version": 2}),
        &[(
            "BOSH_PACKAGES_DIR",
            "/home/ci/.bosh/installations/x/packages",
        )],
    )
    .await;
    assert_eq!(create_env["error"], Value::Null, "{create_env}");
    let cid1 = create_env["result"].as_str().unwrap().to_string();
    assert!(cid1.starts_with("bosh-stemcell-"), "{cid1}");
    let log = create_env["log"].as_str().unwrap();
    assert!(
        log.contains("create-env mode") && log.contains("request_id"),
        "{log}"
    );

    // The director uploads the same stemcell later.
    let director = cpi(
        handle,
        json!({"method": "create_stemcell", "arguments": [image, cloud, {"tags": {}}],
               "context": {"director_uuid": "d-1", "request_id": "cpi-987654"}, "api_version": 2}),
        &[],
    )
    .await;
    assert_eq!(director["error"], Value::Null, "no 409: {director}");
    let cid2 = director["result"].as_str().unwrap().to_string();
    assert_ne!(cid1, cid2);
    let log = director["log"].as_str().unwrap();
    assert!(log.contains("director mode"), "{log}");
    // The director's version is new, made from the blob create-env uploaded: the log says so,
    // not that the definition already held the image.
    assert!(
        log.contains("reused the complete blob") && log.contains("created gallery version"),
        "{log}"
    );
    assert!(!log.contains("already holds this image"), "{log}");

    let vs = versions(handle).await;
    assert_eq!(vs.len(), 2, "two versions: {vs:?}");
    assert_ne!(vs[0].0, vs[1].0, "in two definitions: {vs:?}");
    assert!(vs[1].0.ends_with("-create-env"), "{vs:?}");
    assert_eq!(vs[0].1, vs[1].1, "same version key");
    let refs = |t: &Value| {
        let map: std::collections::BTreeMap<String, String> =
            serde_json::from_value(t.clone()).unwrap();
        tags::references(&map)
    };
    assert_eq!(refs(&vs[0].2), vec![cid2.clone()]);
    assert_eq!(refs(&vs[1].2), vec![cid1.clone()]);

    // The director later deletes its stemcell: only its version goes.
    let del = cpi(
        handle,
        json!({"method": "delete_stemcell", "arguments": [cid2],
               "context": {"request_id": "cpi-1"}}),
        &[],
    )
    .await;
    assert_eq!(del["error"], Value::Null, "{del}");
    let vs = versions(handle).await;
    assert_eq!(vs.len(), 1, "{vs:?}");
    assert!(vs[0].0.ends_with("-create-env"));
}

// ---------------------------------------------------------------------------------------------
// One reference ledger with the unmodified Azure CPI (issue 15): requests shaped as the CPI sends
// them (tests/emulator_support/azure_cpi.rs), side by side with the front.

const NAME: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";
const KEY: &str = "1.506.0";

fn cid(i: u32) -> String {
    format!("bosh-stemcell-{i:08x}-5a5a-4b4b-8c8c-0123456789ab")
}

/// A gallery, the stemcell as bosh hands it to a CPI, and the image's SHA-256 (the CPI's digest).
struct Shared {
    handle: Handle,
    _dir: tempfile::TempDir,
    image: String,
    cloud: Value,
    sha: String,
    plain: PlainCpi,
}

async fn shared() -> Shared {
    let handle = start_default().await;
    let raw = Raw::new(&handle.arm);
    assert_eq!(
        raw.put(&gallery_path(GALLERY), json!({"location": LOC}))
            .await
            .status,
        201
    );
    let dir = tempfile::tempdir().unwrap();
    let (image, cloud) = unpack("gen1-x86_64.tgz", dir.path());
    let sha = sha256_hex(&image);
    let plain = PlainCpi::new(&handle.arm, GALLERY);
    Shared {
        image: image.to_str().unwrap().to_string(),
        handle,
        _dir: dir,
        cloud,
        sha,
        plain,
    }
}

impl Shared {
    /// A director with the front uploads the stemcell: its CID.
    async fn front_create(&self) -> String {
        let r = cpi(
            &self.handle,
            json!({"method": "create_stemcell", "arguments": [self.image, self.cloud],
                   "context": {"director_uuid": "d", "request_id": "cpi-1"}, "api_version": 2}),
            &[],
        )
        .await;
        assert_eq!(r["error"], Value::Null, "{r}");
        r["result"].as_str().unwrap().to_string()
    }

    async fn front_delete(&self, cid: &str) -> Value {
        let r = cpi(
            &self.handle,
            json!({"method": "delete_stemcell", "arguments": [cid],
                   "context": {"director_uuid": "d", "request_id": "cpi-2"}, "api_version": 2}),
            &[],
        )
        .await;
        assert_eq!(r["error"], Value::Null, "{r}");
        r
    }

    /// The front's create_vm for `stemcell_cid`: the stemcell CID the delegate CPI was handed.
    async fn front_create_vm(&self, stemcell_cid: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("stdin");
        let delegate =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/cpi/fake-delegate.sh");
        let (code, r) = cpi_with(
            &self.handle,
            &["--delegate", delegate.to_str().unwrap()],
            json!({"method": "create_vm", "arguments": ["agent-1", stemcell_cid, {"instance_type": "Standard_D2s_v3"}, {}, [], {}],
                   "context": {"director_uuid": "d", "request_id": "cpi-3"}, "api_version": 2}),
            &[("FAKE_CPI_STDIN", seen.to_str().unwrap())],
        )
        .await;
        assert_eq!(
            (code, &r["result"]),
            (Some(3), &json!("from-the-delegate")),
            "the delegate's answer, relayed: {r}"
        );
        let sent: Value = serde_json::from_slice(&std::fs::read(&seen).unwrap()).unwrap();
        sent["arguments"][1].as_str().unwrap().to_string()
    }

    /// A Succeeded version `KEY` made by another writer from page blob `blob_name`, with `tags`.
    async fn existing_version(&self, blob_name: &str, tags: Value) {
        let raw = Raw::new(&self.handle.arm);
        gallery_and_definition_in(&raw, GALLERY, NAME).await;
        let container = blobs(&self.handle).container("stemcell");
        let _ = container.create().await;
        put_fixed_vhd(&container, blob_name, 1).await;
        let mut body = version_body(&format!("{}/stemcell/{blob_name}", self.handle.blob));
        body["tags"] = tags;
        let r = raw
            .put(
                &format!("{}/images/{NAME}/versions/{KEY}", gallery_path(GALLERY)),
                body,
            )
            .await;
        assert!(r.status < 300, "{}", r.text);
        until_settled(
            &raw,
            &format!("{}/images/{NAME}/versions/{KEY}", gallery_path(GALLERY)),
        )
        .await;
    }

    async fn version(&self) -> Option<Value> {
        let r = Raw::new(&self.handle.arm)
            .get(&format!(
                "{}/images/{NAME}/versions/{KEY}",
                gallery_path(GALLERY)
            ))
            .await;
        (r.status == 200).then_some(r.body)
    }

    /// The references as this tool reads them, sorted.
    async fn references(&self) -> Vec<String> {
        let v = self.version().await.expect("the version exists");
        let map: std::collections::BTreeMap<String, String> =
            serde_json::from_value(v["tags"].clone()).unwrap();
        let mut refs = tags::references(&map);
        refs.sort();
        refs
    }

    /// Every CID resolves to the version in the CPI's own create_vm: plain CPIs' directly, the
    /// front's through the CID the front hands its delegate.
    async fn assert_resolvable(&self, plain: &[String], front: &[String]) {
        let id = self.version().await.expect("the version exists")["id"]
            .as_str()
            .unwrap()
            .to_string();
        for c in plain {
            assert_eq!(
                self.plain.create_vm(c).await.as_deref(),
                Some(id.as_str()),
                "plain CPI's {c}"
            );
        }
        for c in front {
            let handed = self.front_create_vm(c).await;
            assert_eq!(
                self.plain.create_vm(&handed).await.as_deref(),
                Some(id.as_str()),
                "the front's {c}, handed to the CPI as {handed}"
            );
        }
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_cpi_reuses_our_version_and_each_tool_deletes_only_its_own_cids() {
    let w = shared().await;
    let ours = w.front_create().await;
    let v = w.version().await.unwrap();
    assert!(
        v["tags"].get("stemcell_name").is_none(),
        "never written: the CPI reads it as a CID: {}",
        v["tags"]
    );
    // A director without the front uploads the same stemcell: the CPI reuses our version.
    let theirs = cid(1);
    w.plain.reuse(NAME, KEY, &theirs, &w.sha).await.unwrap();
    assert_eq!(
        w.references().await,
        sorted(vec![ours.clone(), theirs.clone()]),
        "no phantom reference"
    );
    w.assert_resolvable(std::slice::from_ref(&theirs), std::slice::from_ref(&ours))
        .await;

    // The plain CPI deletes its stemcell first: our reference keeps the version.
    assert_eq!(w.plain.delete(&theirs).await, CpiDelete::Updated);
    assert_eq!(w.references().await, vec![ours.clone()]);
    // Then ours: nothing holds it, nothing uses it, it goes.
    w.front_delete(&ours).await;
    assert!(w.version().await.is_none());
}

/// Issue 30 item 4: in a gallery with soft delete on, a director deletes its stemcell and
/// uploads it again within the week. Azure keeps the version's name taken (a create under it is
/// refused), so the front restores the version instead of failing the upload, and records the
/// new CID where the CPI resolves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stemcell_deleted_and_uploaded_again_in_a_soft_delete_gallery_is_restored() {
    let w = shared().await;
    let first = w.front_create().await;
    set_soft_delete(&Raw::new(&w.handle.arm), GALLERY, true).await;
    let deleted = w.front_delete(&first).await;
    assert!(
        deleted["log"]
            .as_str()
            .unwrap()
            .contains("soft-deleted, restorable until"),
        "{deleted}"
    );
    assert!(w.version().await.is_none());

    let r = cpi(
        &w.handle,
        json!({"method": "create_stemcell", "arguments": [w.image, w.cloud],
               "context": {"director_uuid": "d", "request_id": "cpi-4"}, "api_version": 2}),
        &[],
    )
    .await;
    assert_eq!(r["error"], Value::Null, "{r}");
    let log = r["log"].as_str().unwrap();
    assert!(log.contains("restored gallery version"), "{log}");
    let second = r["result"].as_str().unwrap().to_string();
    assert_ne!(first, second);
    let v = w.version().await.expect("restored");
    assert_eq!(v["properties"]["provisioningState"], "Succeeded");
    assert_eq!(w.references().await, vec![second.clone()]);
    w.assert_resolvable(&[], std::slice::from_ref(&second))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_front_reuses_a_version_the_plain_cpi_made() {
    let w = shared().await;
    // The CPI made the version (its tags: the cloud properties, its references, its digest).
    w.existing_version(
        &format!("{}.vhd", cid(7)),
        json!({"stemcell_references": cid(7), "image_sha256": w.sha,
            "compute_gallery_name": GALLERY, "compute_gallery_image_definition": NAME,
            "name": NAME, "version": "1.506", "os_type": "linux"}),
    )
    .await;

    let ours = w.front_create().await;
    assert_eq!(w.references().await, sorted(vec![cid(7), ours.clone()]));
    w.assert_resolvable(&[cid(7)], std::slice::from_ref(&ours))
        .await;
    // The front deletes its CID: the CPI's still holds the version, and the CPI can still
    // resolve and delete it; being the last, that DELETEs the version.
    w.front_delete(&ours).await;
    assert_eq!(w.references().await, vec![cid(7)]);
    assert_eq!(w.plain.delete(&cid(7)).await, CpiDelete::DeletedVersion);
}

/// A version as the previous release tagged it: `stemcell_name` holding the stemcell's *name*
/// (which the CPI copies into `stemcell_references` as if it were a CID), the complete list in
/// `sg_refs_00`, mirrored into the CPI's tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_release_stemcell_name_never_keeps_a_version_forever() {
    let w = shared().await;
    let ours = cid(1);
    w.existing_version(
        "sha256-old.vhd",
        json!({"stemcell_gallery_mode": "director", "stemcell_name": NAME,
            "stemcell_version": "1.506", "sg_refs_00": ours, "stemcell_references": ours,
            "image_sha256": w.sha, "compute_gallery_name": GALLERY,
            "compute_gallery_image_definition": NAME}),
    )
    .await;

    // A plain CPI reuses it: it copies the name in as a CID, then its own CID.
    let theirs = cid(2);
    w.plain.reuse(NAME, KEY, &theirs, &w.sha).await.unwrap();
    let tag = w.version().await.unwrap()["tags"]["stemcell_references"].clone();
    assert!(tag.as_str().unwrap().contains(NAME), "{tag}");
    assert_eq!(
        w.references().await,
        sorted(vec![ours.clone(), theirs.clone()]),
        "the name is not a reference"
    );

    // Both directors delete their stemcells: the version goes (before: kept by the name forever).
    assert_eq!(w.plain.delete(&theirs).await, CpiDelete::Updated);
    w.front_delete(&ours).await;
    assert!(w.version().await.is_none(), "{:?}", w.version().await);
}

/// Six directors on one version, three with the front and three without, interleaved; then they
/// delete their stemcells one by one: the version is there until the last one goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_directors_with_mixed_fronts_share_one_version() {
    let w = shared().await;
    let mut front = Vec::new();
    let mut plain = Vec::new();
    for i in 0..3 {
        front.push(w.front_create().await);
        let c = cid(10 + i);
        w.plain.reuse(NAME, KEY, &c, &w.sha).await.unwrap();
        plain.push(c);
    }
    let all = sorted(front.iter().chain(plain.iter()).cloned().collect());
    assert_eq!(w.references().await, all);
    w.assert_resolvable(&plain, &front).await;

    let mut left = all.clone();
    for (i, (p, f)) in plain.iter().zip(front.iter()).enumerate() {
        assert_ne!(
            w.plain.delete(p).await,
            CpiDelete::DeletedVersion,
            "the CPI deleted a version the front still holds"
        );
        left.retain(|x| x != p);
        assert_eq!(w.references().await, left);
        w.front_delete(f).await;
        left.retain(|x| x != f);
        if i < 2 {
            assert_eq!(w.references().await, left);
        }
    }
    assert!(
        w.version().await.is_none(),
        "the last stemcell gone, the version goes"
    );
}

/// Forty directors: thirty-six with the front, four plain CPIs (the CPI's tag holds the sentinel
/// and four CIDs). No reference is lost, every CID resolves, the version outlives all but the last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_directors_on_one_version_lose_nothing() {
    let w = shared().await;
    let mut front = Vec::new();
    let mut plain = Vec::new();
    for i in 0..40u32 {
        if i % 10 == 3 {
            let c = cid(100 + i);
            w.plain.reuse(NAME, KEY, &c, &w.sha).await.unwrap();
            plain.push(c);
        } else {
            front.push(w.front_create().await);
        }
    }
    let all = sorted(front.iter().chain(plain.iter()).cloned().collect());
    assert_eq!(w.references().await, all);
    let v = w.version().await.unwrap();
    assert!(v["tags"].as_object().unwrap().len() <= 50);
    // A fifth plain CPI is refused by Azure, as without this tool: its tag is full.
    assert!(w.plain.reuse(NAME, KEY, &cid(999), &w.sha).await.is_err());
    assert_eq!(w.references().await, all);
    w.assert_resolvable(&plain, &front[30..]).await;

    for p in &plain {
        assert_eq!(w.plain.delete(p).await, CpiDelete::Updated);
    }
    let (last, rest) = front.split_last().unwrap();
    for f in rest {
        w.front_delete(f).await;
    }
    assert_eq!(w.references().await, vec![last.clone()]);
    w.front_delete(last).await;
    assert!(w.version().await.is_none());
}

// Versions made by Azure CPI v52.0.1-v53.0.0: no image_sha256 (issue 15, item 3).

/// root.vhd inside an `image` file (gzip(tar(root.vhd))).
fn root_vhd(image: &Path) -> Vec<u8> {
    let f = std::fs::File::open(image).unwrap();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(f));
    for entry in tar.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry
            .path()
            .unwrap()
            .to_string_lossy()
            .ends_with("root.vhd")
        {
            let mut v = Vec::new();
            entry.read_to_end(&mut v).unwrap();
            return v;
        }
    }
    panic!("no root.vhd in {}", image.display());
}

fn sha256_hex(path: &Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

/// `make_semver_compliant`, as the CPI pads a stemcell version.
fn version_key(v: &str) -> String {
    let mut parts: Vec<&str> = v.split('.').collect();
    while parts.len() < 3 {
        parts.push("0");
    }
    parts.join(".")
}

/// What Azure CPI v53.0.0 left behind for stemcell `cloud`: the page blob `stemcell/<cid>.vhd`
/// holding `vhd` written whole (every page, zeros too: that CPI did not upload sparsely), and a
/// Succeeded gallery version made from it whose tags are the cloud properties, `stemcell_name=<cid>`
/// (its single reference; tag v53.0.0 `_create_gallery_image`), `compute_gallery_name`,
/// `compute_gallery_image_definition` and `image` — and no `image_sha256`. Returns (definition,
/// version key, the version's path).
async fn cpi_v53_version(
    handle: &Handle,
    cid: &str,
    cloud: &Value,
    vhd: &[u8],
) -> (String, String, String) {
    let raw = Raw::new(&handle.arm);
    let g = gallery_path(GALLERY);
    let r = raw.put(&g, json!({"location": LOC})).await;
    assert!(r.status == 201 || r.status == 200, "{}", r.text);
    let definition = cloud["name"].as_str().unwrap().to_string();
    gallery_and_definition_in(&raw, GALLERY, &definition).await;

    let container = blobs(handle).container("stemcell");
    let _ = container.create().await;
    let blob = container.blob_client(format!("{cid}.vhd"));
    blob.put_page_blob(vhd.len() as u64, &[]).await.unwrap();
    for (i, piece) in vhd.chunks(4 * 1024 * 1024).enumerate() {
        let start = (i * 4 * 1024 * 1024) as u64;
        blob.put_page(start, start + piece.len() as u64 - 1, piece.to_vec())
            .await
            .unwrap();
    }

    let key = version_key(cloud["version"].as_str().unwrap());
    // The cloud properties as that CPI sent them: numbers stay numbers (`"disk": 5120`), as
    // stemcell.MF has them; Azure stores them as strings (REFERENCE.md "Tags").
    let mut tags = serde_json::Map::new();
    for (k, v) in cloud.as_object().unwrap() {
        tags.insert(k.clone(), v.clone());
    }
    tags.insert("stemcell_name".into(), json!(cid));
    tags.insert("compute_gallery_name".into(), json!(GALLERY));
    tags.insert("compute_gallery_image_definition".into(), json!(definition));
    tags.insert(
        "image".into(),
        json!(
            json!({"publisher": "bosh", "offer": definition, "sku": "gen1", "version": key})
                .to_string()
        ),
    );
    let path = format!("{g}/images/{definition}/versions/{key}");
    let r = raw
        .put(
            &path,
            json!({"location": LOC, "tags": tags, "properties": {
                "publishingProfile": {"replicaCount": 3, "targetRegions": [{"name": LOC}]},
                "storageProfile": {"osDiskImage": {"source": {
                    "uri": format!("{}/stemcell/{cid}.vhd", handle.blob),
                    "storageAccountId": format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Storage/storageAccounts/devstoreaccount1")
                }}}}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    for _ in 0..500 {
        if raw.get(&path).await.body["properties"]["provisioningState"] == "Succeeded" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let v = raw.get(&path).await;
    assert_eq!(v.body["properties"]["provisioningState"], "Succeeded");
    assert!(v.body["tags"].get("image_sha256").is_none(), "{}", v.text);
    (definition, key, path)
}

fn tag_map(t: &Value) -> std::collections::BTreeMap<String, String> {
    serde_json::from_value(t.clone()).unwrap()
}

const V53_CID: &str = "bosh-stemcell-0b0e7c1e-7a39-4d4c-9d53-5300aa000001";

/// An emulator holding what Azure CPI v53.0.0 left for the fixture stemcell, and that stemcell as
/// bosh hands it over: (emulator, temp dir, `image` path, cloud properties, the version's path).
async fn v53_world() -> (Handle, tempfile::TempDir, PathBuf, Value, String) {
    let handle = start_default().await;
    let dir = tempfile::tempdir().unwrap();
    let (image, cloud) = unpack("gen1-x86_64.tgz", dir.path());
    let (_, _, path) = cpi_v53_version(&handle, V53_CID, &cloud, &root_vhd(&image)).await;
    (handle, dir, image, cloud, path)
}

/// [`v53_world`], and a front director (`d-1`) that uploads the same stemcell, adopting the
/// version: (emulator, temp dir, the version's path, the front director's CID).
async fn v53_world_adopted_by_a_front() -> (Handle, tempfile::TempDir, String, String) {
    let (handle, dir, image, cloud, path) = v53_world().await;
    let r = cpi(
        &handle,
        json!({"method": "create_stemcell", "arguments": [image.to_str().unwrap(), cloud],
               "context": {"director_uuid": "d-1", "request_id": "cpi-1"}, "api_version": 2}),
        &[],
    )
    .await;
    assert_eq!(r["error"], Value::Null, "{r}");
    let ours = r["result"].as_str().unwrap().to_string();
    (handle, dir, path, ours)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_made_by_azure_cpi_v53_0_0_without_image_sha256_is_adopted_when_its_blob_holds_the_same_vhd(
) {
    let (handle, _dir, image, cloud, path) = v53_world().await;

    let r = cpi(
        &handle,
        json!({"method": "create_stemcell", "arguments": [image.to_str().unwrap(), cloud],
               "context": {"director_uuid": "d-1", "request_id": "cpi-53"}, "api_version": 2}),
        &[],
    )
    .await;
    assert_eq!(r["error"], Value::Null, "adopted, not refused: {r}");
    let cid = r["result"].as_str().unwrap().to_string();
    let log = r["log"].as_str().unwrap();
    assert!(
        log.contains("adopted") && log.contains("content digest"),
        "{log}"
    );

    let v = Raw::new(&handle.arm).get(&path).await;
    let t = tag_map(&v.body["tags"]);
    assert_eq!(
        t.get("image_sha256").map(String::as_str),
        Some(sha256_hex(&image).as_str()),
        "the stemcell's image_sha256 is recorded: {t:?}"
    );
    assert_eq!(
        tags::references(&t),
        vec![V53_CID.to_string(), cid.clone()],
        "the CPI's CID kept, ours added: {t:?}"
    );
    // Nothing uploaded, nothing re-created: one version, the CPI's source.
    assert_eq!(versions(&handle).await.len(), 1);
    assert!(
        v.body["properties"]["storageProfile"]["osDiskImage"]["source"]["uri"]
            .as_str()
            .unwrap()
            .ends_with(&format!("{V53_CID}.vhd")),
        "{}",
        v.text
    );
    // Adopted once: the next upload of the same stemcell is an ordinary reuse.
    let again = cpi(
        &handle,
        json!({"method": "create_stemcell", "arguments": [image.to_str().unwrap(), cloud],
               "context": {"director_uuid": "d-2", "request_id": "cpi-54"}, "api_version": 2}),
        &[],
    )
    .await;
    assert_eq!(again["error"], Value::Null, "{again}");
    assert!(
        !again["log"].as_str().unwrap().contains("adopted"),
        "{again}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_made_by_azure_cpi_v53_0_0_holding_different_content_is_refused_naming_both_digests(
) {
    let handle = start_default().await;
    let dir = tempfile::tempdir().unwrap();
    let (image, cloud) = unpack("gen1-x86_64.tgz", dir.path());
    let mut other = root_vhd(&image);
    other[4096] ^= 0x5a;
    let (_, _, path) = cpi_v53_version(&handle, V53_CID, &cloud, &other).await;
    let before = Raw::new(&handle.arm).get(&path).await.body["tags"].clone();

    let r = cpi(
        &handle,
        json!({"method": "create_stemcell", "arguments": [image.to_str().unwrap(), cloud],
               "context": {"director_uuid": "d-1", "request_id": "cpi-53"}, "api_version": 2}),
        &[],
    )
    .await;
    let msg = r["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(msg.contains("different content"), "{r}");
    assert!(
        msg.contains("1.506.0") || msg.contains(&path),
        "names the version: {msg}"
    );
    let digests: Vec<&str> = msg
        .split(|c: char| !c.is_ascii_hexdigit())
        .filter(|w| w.len() == 64)
        .collect();
    assert_eq!(digests.len(), 2, "both content digests: {msg}");
    assert_ne!(digests[0], digests[1], "{msg}");
    assert_eq!(r["error"]["ok_to_retry"], false, "{r}");
    assert_eq!(
        Raw::new(&handle.arm).get(&path).await.body["tags"],
        before,
        "nothing written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_made_by_azure_cpi_v53_0_0_whose_source_blob_is_gone_is_refused_naming_adopt_unverified_and_adopted_with_it(
) {
    let (handle, dir, image, cloud, path) = v53_world().await;
    // A Succeeded version does not need its source blob: it was deleted (by hand, or by a CPI
    // deleting a CID whose version other CIDs kept).
    blobs(&handle)
        .container("stemcell")
        .blob_client(format!("{V53_CID}.vhd"))
        .delete()
        .await
        .unwrap();
    let request = json!({"method": "create_stemcell", "arguments": [image.to_str().unwrap(), cloud],
           "context": {"director_uuid": "d-1", "request_id": "cpi-53"}, "api_version": 2});

    let r = cpi(&handle, request.clone(), &[]).await;
    let msg = r["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        msg.contains("--adopt-unverified")
            && msg.contains("stemcell_gallery_adopt_unverified")
            && msg.contains("gone"),
        "{r}"
    );
    let t = tag_map(&Raw::new(&handle.arm).get(&path).await.body["tags"]);
    assert!(!t.contains_key("image_sha256"), "nothing written: {t:?}");

    // The operator's override in cpi.json.
    let config = dir.path().join("cpi.json");
    std::fs::write(
        &config,
        json!({"cloud": {"plugin": "azure", "properties": {"azure": {
            "stemcell_gallery_adopt_unverified": true}}}})
        .to_string(),
    )
    .unwrap();
    let r = cpi(
        &handle,
        request,
        &[("STEMCELL_GALLERY_CONFIG", config.to_str().unwrap())],
    )
    .await;
    assert_eq!(r["error"], Value::Null, "{r}");
    let cid = r["result"].as_str().unwrap().to_string();
    let log = r["log"].as_str().unwrap();
    assert!(log.contains("WITHOUT proof"), "says so: {log}");
    let t = tag_map(&Raw::new(&handle.arm).get(&path).await.body["tags"]);
    assert_eq!(
        t.get("image_sha256").map(String::as_str),
        Some(sha256_hex(&image).as_str())
    );
    assert_eq!(tags::references(&t), vec![V53_CID.to_string(), cid]);
}

/// Issue 17 (found with issue 16): the version lock's typed error was flattened into a string
/// the service always called transient, so a lock container the identity may not write (403)
/// reached BOSH as `ok_to_retry: true` and the director retried a request that cannot succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_lock_the_identity_may_not_take_is_not_worth_retrying() {
    let s = shared().await;
    s.front_create().await;
    // Every lease on a version lock is refused as Azure Storage refuses a missing data action.
    let r = admin(
        &s.handle,
        "POST",
        "/_emulator/faults",
        Some(
            json!({"method": "PUT", "path": "*/galleries/*", "status": 403,
                    "code": "AuthorizationPermissionMismatch", "count": 1000}),
        ),
    )
    .await;
    assert!(r.status < 300, "{}", r.text);
    let r = cpi(
        &s.handle,
        json!({"method": "create_stemcell", "arguments": [s.image, s.cloud],
               "context": {"director_uuid": "d", "request_id": "cpi-403"}, "api_version": 2}),
        &[("STEMCELL_GALLERY_BLOB_RETRIES", "0")],
    )
    .await;
    assert_eq!(r["error"]["type"], "Bosh::Clouds::CloudError", "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("AuthorizationPermissionMismatch"),
        "names Azure's refusal: {r}"
    );
    assert_eq!(r["error"]["ok_to_retry"], false, "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_made_by_azure_cpi_v53_0_0_whose_blob_storage_is_throttled_is_a_retryable_error_not_a_call_for_adopt_unverified(
) {
    let (handle, _dir, image, cloud, path) = v53_world().await;
    let r = admin(
        &handle,
        "POST",
        "/_emulator/faults",
        Some(
            json!({"method": "GET", "path": "*.vhd", "query": "comp=pagelist",
                    "status": 503, "code": "ServerBusy", "count": 100}),
        ),
    )
    .await;
    assert!(r.status < 300, "{}", r.text);

    let r = cpi(
        &handle,
        json!({"method": "create_stemcell", "arguments": [image.to_str().unwrap(), cloud],
               "context": {"director_uuid": "d-1", "request_id": "cpi-53"}, "api_version": 2}),
        &[("STEMCELL_GALLERY_BLOB_RETRIES", "0")],
    )
    .await;
    assert_eq!(r["error"]["ok_to_retry"], true, "{r}");
    let msg = r["error"]["message"].as_str().unwrap_or_default();
    assert!(!msg.contains("--adopt-unverified"), "{msg}");
    let t = tag_map(&Raw::new(&handle.arm).get(&path).await.body["tags"]);
    assert!(!t.contains_key("image_sha256"), "nothing written: {t:?}");
}

// ---------------------------------------------------------------------------------------------
// Multi-CPI directors (issue 19 part 2): the CPI-config properties in the request context.

/// Run `stemcell-gallery --config CPI_JSON cpi` (no gallery flag: the file and the context
/// decide) against the emulator, with `request` on stdin: the one response line.
async fn cpi_with_config(handle: &Handle, cpi_json: &Path, request: Value) -> Value {
    let mut c = crate::support::binary::command();
    c.args([
        "--arm-endpoint",
        &handle.arm,
        "--blob-endpoint",
        &handle.blob,
    ])
    .args(["--auth", "emulator", "--config"])
    .arg(cpi_json)
    .arg("cpi")
    .stdin(std::process::Stdio::piped())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    let out = tokio::task::spawn_blocking(move || {
        let mut child = c.spawn().expect("the binary starts");
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin is piped");
            let _ = stdin.write_all(request.to_string().as_bytes());
        }
        child.wait_with_output().expect("the binary finishes")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "one response line ({e}): {stdout} stderr {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// A director with a cpi-config of two Azure CPIs runs one job (one cpi.json) and tells each
/// request which CPI it is for through the context: the front publishes to, and deletes from,
/// the gallery the context names — as the Azure CPI merges the context over its cpi.json.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_cpi_director_publishes_to_the_gallery_its_context_names() {
    const SECOND: &str = "second_gallery";
    let handle = start_default().await;
    let raw = Raw::new(&handle.arm);
    for g in [GALLERY, SECOND] {
        assert_eq!(
            raw.put(&gallery_path(g), json!({"location": LOC}))
                .await
                .status,
            201
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let (image, cloud) = unpack("gen1-x86_64.tgz", dir.path());
    let cpi_json = dir.path().join("cpi.json");
    std::fs::write(
        &cpi_json,
        json!({"cloud": {"plugin": "azure", "properties": {"azure": {
            "environment": "AzureCloud", "subscription_id": crate::support::SUB,
            "resource_group_name": crate::support::RG, "compute_gallery_name": GALLERY,
            "location": LOC}}}})
        .to_string(),
    )
    .unwrap();
    let context = json!({"director_uuid": "d", "request_id": "cpi-1",
        "compute_gallery_name": SECOND, "location": LOC});
    let created = cpi_with_config(
        &handle,
        &cpi_json,
        json!({"method": "create_stemcell", "arguments": [image, cloud],
               "context": context, "api_version": 2}),
    )
    .await;
    assert_eq!(created["error"], Value::Null, "{created}");
    let cid = created["result"].as_str().unwrap().to_string();
    let log = created["log"].as_str().unwrap();
    assert!(
        log.contains("compute_gallery_name") && log.contains("request context"),
        "{log}"
    );
    let count = |g: &'static str| {
        let raw = Raw::new(&handle.arm);
        async move {
            let defs = raw.get(&format!("{}/images", gallery_path(g))).await;
            let mut n = 0;
            for d in defs.body["value"].as_array().cloned().unwrap_or_default() {
                let name = d["name"].as_str().unwrap().to_string();
                let vs = raw
                    .get(&format!("{}/images/{name}/versions", gallery_path(g)))
                    .await;
                n += vs.body["value"].as_array().map_or(0, Vec::len);
            }
            n
        }
    };
    assert_eq!(count(SECOND).await, 1, "published to the context's gallery");
    assert_eq!(count(GALLERY).await, 0, "not to cpi.json's");

    // delete_stemcell with the same context finds and deletes it there.
    let deleted = cpi_with_config(
        &handle,
        &cpi_json,
        json!({"method": "delete_stemcell", "arguments": [cid], "context": context}),
    )
    .await;
    assert_eq!(deleted["error"], Value::Null, "{deleted}");
    assert_eq!(count(SECOND).await, 0);

    // A context value of the wrong type is a CloudError naming the key, not a guess.
    let bad = cpi_with_config(
        &handle,
        &cpi_json,
        json!({"method": "create_stemcell", "arguments": [image, cloud],
               "context": {"director_uuid": "d", "request_id": "cpi-2", "compute_gallery_name": 7}}),
    )
    .await;
    let msg = bad["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("compute_gallery_name"), "{bad}");
}

/// Issue 28 item 8: a version Azure CPI v53.0.0 made (its CID in `stemcell_name` only), adopted
/// by a front director. The v53.0.0 director still finds its CID (its create_vm and
/// delete_stemcell look only at `stemcell_name`), and once both have deleted their stemcells
/// nothing is left. (Before: adoption removed `stemcell_name`, so v53.0.0's create_vm could not
/// find the version, and after both deletes the version leaked with the v53 CID in
/// `stemcell_references`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v53_0_0_director_keeps_its_cid_after_the_front_adopts_and_the_last_delete_leaves_nothing(
) {
    let (handle, _dir, path, ours) = v53_world_adopted_by_a_front().await;
    let v53 = crate::support::azure_cpi::CpiV53::new(&handle.arm);
    let t = tag_map(&Raw::new(&handle.arm).get(&path).await.body["tags"]);
    assert_eq!(t.get("stemcell_name"), Some(&V53_CID.to_string()), "{t:?}");
    assert!(
        v53.create_vm(V53_CID)
            .await
            .is_some_and(|id| id.eq_ignore_ascii_case(&path)),
        "v53.0.0's create_vm finds its version"
    );

    // The front's director deletes its stemcell: the v53.0.0 director still holds the version.
    let d = cpi(
        &handle,
        json!({"method": "delete_stemcell", "arguments": [ours], "context": {"director_uuid": "d-1"}, "api_version": 2}),
        &[],
    )
    .await;
    assert_eq!(d["error"], Value::Null, "{d}");
    assert_eq!(versions(&handle).await.len(), 1);
    assert!(v53.create_vm(V53_CID).await.is_some());

    // The v53.0.0 director deletes its own: the version goes, nothing is left.
    assert!(v53.delete(V53_CID).await, "v53.0.0 finds what to delete");
    for _ in 0..200 {
        if versions(&handle).await.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(versions(&handle).await.is_empty(), "nothing leaks");
}

/// Issue 46, "Done when": a front director adopts a version Azure CPI v53.0.0 made; the v53.0.0
/// director's `delete_stemcell` of its own CID (its exact requests: the resource list by
/// `stemcell_name`, a GET, a DELETE) is refused by Azure under the delete lock (409
/// `ScopeLocked`), and the version the front still holds stays, resolvable for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v53_0_0_delete_stemcell_of_its_adopted_cid_leaves_the_version_the_front_holds() {
    let (handle, _dir, path, ours) = v53_world_adopted_by_a_front().await;
    let v53 = crate::support::azure_cpi::CpiV53::new(&handle.arm);
    let (status, text) = v53
        .try_delete(V53_CID)
        .await
        .expect("v53.0.0 finds its version");
    assert_eq!(status, 409, "{text}");
    assert!(text.contains("ScopeLocked"), "{text}");
    assert_eq!(versions(&handle).await.len(), 1, "the version stays");
    assert!(v53.create_vm(V53_CID).await.is_some());
    let t = tag_map(&Raw::new(&handle.arm).get(&path).await.body["tags"]);
    assert!(
        tags::references(&t).contains(&ours),
        "the front's CID is kept: {t:?}"
    );
}

/// Issue 28 item 9, leaving the front: two directors with the front (d-1, d-2) share a version;
/// d-1 is taken back to the plain Azure CPI. Before, its CID lived in this tool's overflow: the
/// plain CPI's create_vm could not resolve it. `references hand-back --holder d-1 --apply` moves
/// it into `stemcell_references`; then the plain CPI resolves it and its delete_stemcell removes
/// it (the version stays for d-2), and it stays removed. Where the CPI's tag has no room (four
/// plain directors fill it), the hand-back is refused, naming what to delete first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_director_leaving_the_front_gets_its_cids_where_the_plain_cpi_resolves_and_deletes_them()
{
    const D1: &str = "d1d1d1d1-0000-4000-8000-000000000001";
    const D2: &str = "d2d2d2d2-0000-4000-8000-000000000002";
    let w = shared().await;
    let create = |uuid: &'static str| {
        let w = &w;
        async move {
            let r = cpi(
                &w.handle,
                json!({"method": "create_stemcell", "arguments": [w.image, w.cloud],
                       "context": {"director_uuid": uuid, "request_id": "cpi-9"}, "api_version": 2}),
                &[],
            )
            .await;
            assert_eq!(r["error"], Value::Null, "{r}");
            r["result"].as_str().unwrap().to_string()
        }
    };
    let c1 = create(D1).await;
    let c2 = create(D2).await;
    assert_eq!(
        w.plain.create_vm(&c1).await,
        None,
        "in the overflow, the plain CPI cannot resolve it"
    );
    let hand_back = |extra: &[&str]| {
        let mut cmd = crate::support::binary::command();
        cmd.args(crate::support::binary::global_args(
            &w.handle.arm,
            &w.handle.blob,
            GALLERY,
        ))
        .args(["references", "hand-back", "--holder", D1])
        .args(extra);
        cmd
    };
    let plan = hand_back(&[]).output().unwrap();
    let doc: Value = serde_json::from_slice(&plan.stdout).unwrap();
    assert_eq!(plan.status.code(), Some(0), "{doc}");
    assert_eq!(doc["versions"][0]["cids"], json!([c1]), "{doc}");
    assert_eq!(doc["versions"][0]["result"], "hand-back", "{doc}");
    assert_eq!(
        w.plain.create_vm(&c1).await,
        None,
        "a dry run moves nothing"
    );

    let done = hand_back(&["--apply"]).output().unwrap();
    let doc: Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(done.status.code(), Some(0), "{doc}");
    assert_eq!(doc["versions"][0]["result"], "handed-back", "{doc}");
    assert!(
        w.plain.create_vm(&c1).await.is_some(),
        "resolved by the plain CPI"
    );
    assert_eq!(w.plain.delete(&c1).await, CpiDelete::Updated);
    assert_eq!(
        w.references().await,
        vec![c2.clone()],
        "removed, and stays removed"
    );
    // The front writes again (d-2 uploads once more): c1 does not come back.
    create(D2).await;
    assert!(!w.references().await.contains(&c1));

    // Four plain directors fill stemcell_references: d-2's CIDs have no room there.
    for i in 1..=4 {
        w.plain.reuse(NAME, KEY, &cid(i), &w.sha).await.unwrap();
    }
    let refused = {
        let mut cmd = crate::support::binary::command();
        cmd.args(crate::support::binary::global_args(
            &w.handle.arm,
            &w.handle.blob,
            GALLERY,
        ))
        .args(["references", "hand-back", "--holder", D2, "--apply"]);
        cmd.output().unwrap()
    };
    let doc: Value = serde_json::from_slice(&refused.stdout).unwrap();
    assert_eq!(refused.status.code(), Some(1), "{doc}");
    assert_eq!(doc["versions"][0]["result"], "no-room", "{doc}");
    let detail = doc["versions"][0]["detail"].as_str().unwrap();
    assert!(
        detail.contains(&cid(1)) && detail.contains("delete"),
        "{detail}"
    );
    assert!(
        w.references().await.contains(&c2),
        "nothing moved on a refusal"
    );
}
