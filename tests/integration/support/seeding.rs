//! The `seed` world: an emulator with the gallery created, the binary pointed at it (and
//! optionally at Azurite for blobs), and readers of what ended up in storage and the gallery.
//! Generated stemcells and the VHD readers live in [`super::stemcells`] (re-exported here).

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use stemcell_gallery::azure::blob::{
    list_stemcell_blobs, StemcellBlob, StorageAuth, StorageTarget,
};
use stemcell_gallery::emulator::{self, Handle, Options};

use super::binary;
pub use super::blobsdk::{BlobExt, ContainerExt};
use super::emulated::{gallery_path, with_api, Raw};
pub use super::stemcells::*;
pub use super::{DEFINITION, LOC, RG, SUB};

pub const GALLERY: &str = "seed_gallery";

/// An emulator with the gallery created; blobs go to `blob_endpoint` (the emulator's own blob
/// store unless a test points it at Azurite).
pub struct World {
    pub emulator: Handle,
    pub blob_endpoint: String,
}

impl World {
    pub async fn start() -> World {
        Self::start_with(Options::default()).await
    }

    /// An emulator whose storage account (the development account) lives in resource group `rg`
    /// of the gallery's subscription, not necessarily the gallery's.
    pub async fn start_with_storage_account_in(rg: &str) -> World {
        Self::start_with(Options {
            world: Some(emulator::World {
                resources: vec![serde_json::json!({
                    "id": format!("/subscriptions/{SUB}/resourceGroups/{rg}/providers/Microsoft.Storage/storageAccounts/devstoreaccount1"),
                    "location": LOC,
                })],
            }),
            ..Options::default()
        })
        .await
    }

    pub async fn start_with(opts: Options) -> World {
        Self::start_with_role(
            opts,
            stemcell_gallery::cli::embedded::least_privilege_role(),
        )
        .await
    }

    /// [`World::start_with`], the tool's identity held to `role` (the least-privilege role and
    /// an optional action, say).
    pub async fn start_with_role(opts: Options, role: emulator::Role) -> World {
        let emulator = emulator::start(Options {
            role: Some(role),
            ..opts
        })
        .await
        .expect("the emulator starts");
        emulator
            .state
            .ensure_gallery(SUB, RG, GALLERY, LOC)
            .expect("the gallery is created");
        let blob_endpoint = emulator.blob.clone();
        World {
            emulator,
            blob_endpoint,
        }
    }

    /// The global flags pointing the binary at this world.
    pub fn global_args(&self) -> Vec<String> {
        self.global_args_in(GALLERY)
    }

    /// The global flags pointing the binary at this world's emulator and `gallery`.
    pub fn global_args_in(&self, gallery: &str) -> Vec<String> {
        binary::global_args(&self.emulator.arm, &self.blob_endpoint, gallery)
    }

    /// `stemcell-gallery <global flags> <args...>`, ready to run, with no ambient setting of this
    /// shell reaching it.
    pub fn command(&self, args: &[&str]) -> Command {
        self.command_in(GALLERY, args)
    }

    /// [`World::command`] against another gallery of this world's emulator.
    pub fn command_in(&self, gallery: &str, args: &[&str]) -> Command {
        let mut cmd = binary::command();
        cmd.args(self.global_args_in(gallery)).args(args);
        cmd
    }

    /// [`World::command`] printing for people (`--output human`) instead of JSON.
    pub fn human_command(&self, args: &[&str]) -> Command {
        let mut global = self.global_args();
        let last = global.len() - 1;
        assert_eq!(
            global[last], "json",
            "the global flags end with --output json"
        );
        global[last] = "human".into();
        let mut cmd = binary::command();
        cmd.args(global).args(args);
        cmd
    }

    /// `stemcell-gallery <global flags> seed <stemcell> <extra...>`, ready to run.
    pub fn seed_command(&self, stemcell: &Path, extra: &[&str]) -> Command {
        let mut cmd = self.command(&["seed"]);
        cmd.arg(stemcell).args(extra);
        cmd
    }

    /// Run `stemcell-gallery <global flags> <args...>` to its end (off the async runtime).
    pub async fn run(&self, args: &[&str]) -> Seeded {
        run_to_end(self.command(args)).await
    }

    /// Run `seed` to its end (off the async runtime, which keeps serving the emulator).
    pub async fn seed(&self, stemcell: &Path, extra: &[&str]) -> Seeded {
        run_to_end(self.seed_command(stemcell, extra)).await
    }

    pub fn storage(&self) -> StorageTarget {
        StorageTarget::new(
            &url::Url::parse(&self.blob_endpoint).expect("blob endpoint parses"),
            StorageAuth::DevelopmentKey,
        )
        .expect("storage target")
    }

    pub fn container(&self) -> stemcell_gallery::azure::blob::Container {
        self.storage().container("stemcell")
    }

    pub async fn stemcell_blobs(&self) -> Vec<StemcellBlob> {
        list_stemcell_blobs(&self.container())
            .await
            .expect("list stemcell blobs")
    }

    /// The version as ARM shows it (`None` on 404).
    pub async fn version(&self, definition: &str, key: &str) -> Option<Value> {
        let path = format!(
            "{}/images/{definition}/versions/{key}",
            gallery_path(GALLERY)
        );
        let resp = Raw::new(&self.emulator.arm).get(&path).await;
        if resp.status == 404 {
            return None;
        }
        assert!(
            (200..300).contains(&resp.status),
            "GET version: {} {}",
            resp.status,
            resp.text
        );
        Some(resp.body)
    }

    /// Requests that changed something (anything but GET/HEAD), as `METHOD path?query`.
    pub fn writes(&self) -> Vec<String> {
        self.emulator
            .state
            .requests()
            .into_iter()
            .filter(|r| r.method != "GET" && r.method != "HEAD")
            .map(|r| format!("{} {}?{}", r.method, r.path, r.query))
            .collect()
    }
}

/// What one run of `seed` printed.
pub struct Seeded {
    pub code: i32,
    pub json: Value,
    pub stderr: String,
}

impl From<Output> for Seeded {
    fn from(out: Output) -> Seeded {
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        Seeded {
            code: out.status.code().unwrap_or(-1),
            json: serde_json::from_str(stdout.trim()).unwrap_or(Value::Null),
            stderr: String::from_utf8_lossy(&out.stderr).to_string(),
        }
    }
}

impl Seeded {
    pub fn assert_ok(&self) -> &Value {
        assert_eq!(self.code, 0, "seed failed: {}\n{}", self.json, self.stderr);
        &self.json
    }
}

/// Run `cmd` to its end on a blocking thread, so the async runtime keeps serving the emulator.
pub async fn run_to_end(mut cmd: Command) -> Seeded {
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("the binary runs"))
        .await
        .expect("the runner thread finishes");
    Seeded::from(out)
}

impl World {
    /// ARM as the subscription's Owner (test setup), `path` under the gallery.
    async fn owner(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("{}{path}", gallery_path(GALLERY));
        let resp = Raw::new(&self.emulator.arm)
            .send(method, &with_api(&path), body, true)
            .await;
        assert!(
            (200..300).contains(&resp.status),
            "{path}: {} {}",
            resp.status,
            resp.text
        );
        resp.body
    }

    /// What Azure CPI v53.0.0 left behind for stemcell `name`/`version` (director mode): the
    /// page blob `stemcell/<cid>.vhd` holding `vhd` written whole (every page, zeros too), and a
    /// Succeeded version made from it tagged with the cloud properties, `stemcell_name=<cid>` (its
    /// single reference), `compute_gallery_name`, `compute_gallery_image_definition` and `image`,
    /// without `image_sha256`.
    pub async fn cpi_v53_version(&self, cid: &str, version: &str, vhd: &[u8]) {
        let container = self.container();
        let _ = container.create().await;
        let blob = container.blob_client(format!("{cid}.vhd"));
        blob.put_page_blob(vhd.len() as u64, &[])
            .await
            .expect("page blob");
        for (i, piece) in vhd.chunks(4 * 1024 * 1024).enumerate() {
            let start = (i * 4 * 1024 * 1024) as u64;
            blob.put_page(start, start + piece.len() as u64 - 1, piece.to_vec())
                .await
                .expect("put page");
        }
        let def = format!("/images/{DEFINITION}");
        self.owner(
            "PUT",
            &def,
            Some(serde_json::json!({"location": LOC, "properties": {
                "osType": "Linux", "osState": "Generalized", "hyperVGeneration": "V1",
                "identifier": {"publisher": "bosh", "offer": DEFINITION, "sku": "gen1"}}})),
        )
        .await;
        self.owner("GET", &def, None).await;
        let key = format!("{version}.0");
        let path = format!("{def}/versions/{key}");
        self.owner(
            "PUT",
            &path,
            Some(serde_json::json!({"location": LOC,
                "tags": {
                    "name": DEFINITION, "version": version, "os_type": "linux",
                    "stemcell_name": cid,
                    "compute_gallery_name": GALLERY,
                    "compute_gallery_image_definition": DEFINITION,
                    "image": serde_json::json!({"publisher": "bosh", "offer": DEFINITION, "sku": "gen1", "version": key}).to_string(),
                },
                "properties": {
                    "publishingProfile": {"replicaCount": 3, "targetRegions": [{"name": LOC}]},
                    "storageProfile": {"osDiskImage": {"source": {
                        "uri": format!("{}/stemcell/{cid}.vhd", self.blob_endpoint),
                        "storageAccountId": format!("/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Storage/storageAccounts/devstoreaccount1")
                    }}}}})),
        )
        .await;
        for _ in 0..50 {
            let v = self.owner("GET", &path, None).await;
            if v["properties"]["provisioningState"] == "Succeeded" {
                assert!(v["tags"].get("image_sha256").is_none(), "{v}");
                return;
            }
        }
        panic!("the v53.0.0-era version did not succeed");
    }
}
