//! Helpers for the `seed` scenarios: generated stemcells, the binary pointed at an emulator (and
//! optionally at Azurite for blobs), and readers of what ended up in storage and the gallery.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use azure_storage_blobs::prelude::{BlobClient, ContainerClient};
use futures::StreamExt;
use serde_json::Value;
use sha2::{Digest, Sha256};
use stemcell_gallery::azure::blob::{
    list_stemcell_blobs, StemcellBlob, StorageAuth, StorageTarget,
};
use stemcell_gallery::emulator::{self, Handle, Options};
use stemcell_gallery::stemcell::testgen::{Generated, StemcellSpec, VhdSpec};

pub const SUB: &str = "11111111-2222-3333-4444-555555555555";
pub const RG: &str = "bosh-rg";
pub const GALLERY: &str = "seed_gallery";
pub const LOC: &str = "westeurope";
pub const DEFINITION: &str = "bosh-azure-hyperv-ubuntu-jammy-go_agent";

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
        // The tool's identity is held to the least-privilege role, as in every tool-facing test.
        let emulator = emulator::start(Options {
            role: Some(stemcell_gallery::cli::embedded::least_privilege_role()),
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
        [
            "--arm-endpoint",
            &self.emulator.arm,
            "--blob-endpoint",
            &self.blob_endpoint,
            "--auth",
            "emulator",
            "--subscription",
            SUB,
            "--resource-group",
            RG,
            "--gallery",
            gallery,
            "--location",
            LOC,
            "--output",
            "json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// `stemcell-gallery <global flags> <args...>`, ready to run, with no ambient setting of this
    /// shell reaching it.
    pub fn command(&self, args: &[&str]) -> Command {
        self.command_in(GALLERY, args)
    }

    /// [`World::command`] against another gallery of this world's emulator.
    pub fn command_in(&self, gallery: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_stemcell-gallery"));
        for var in [
            "STEMCELL_GALLERY_CONFIG",
            "STEMCELL_GALLERY_ARM_ENDPOINT",
            "STEMCELL_GALLERY_BLOB_ENDPOINT",
            "STEMCELL_GALLERY_AUTH",
            "STEMCELL_GALLERY_STORAGE_ACCOUNT",
            "AZURE_SUBSCRIPTION_ID",
        ] {
            cmd.env_remove(var);
        }
        cmd.args(self.global_args_in(gallery)).args(args);
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

    pub fn container(&self) -> ContainerClient {
        self.storage().container("stemcell")
    }

    pub async fn stemcell_blobs(&self) -> Vec<StemcellBlob> {
        list_stemcell_blobs(&self.container())
            .await
            .expect("list stemcell blobs")
    }

    /// The version as ARM shows it (`None` on 404).
    pub async fn version(&self, definition: &str, key: &str) -> Option<Value> {
        let url = format!(
            "{}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/galleries/{GALLERY}/images/{definition}/versions/{key}?api-version=2023-07-03",
            self.emulator.arm
        );
        let resp = reqwest::Client::new()
            .get(url)
            .bearer_auth("test-token")
            .send()
            .await
            .expect("the emulator answers");
        if resp.status().as_u16() == 404 {
            return None;
        }
        assert!(resp.status().is_success(), "GET version: {}", resp.status());
        Some(resp.json().await.expect("version JSON"))
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

/// A small heavy stemcell with scattered data: `mib` MiB of disk, 25% in 64 KiB blocks.
pub fn small_spec(version_yaml: &str, seed: u64, mib: u64) -> StemcellSpec {
    StemcellSpec {
        version_yaml: version_yaml.into(),
        vhd: VhdSpec {
            mib,
            data_fraction: 0.25,
            block: 64 * 1024,
            seed,
            ..VhdSpec::default()
        },
        level: 1,
        ..StemcellSpec::default()
    }
}

pub fn write_stemcell(dir: &Path, name: &str, spec: &StemcellSpec) -> (PathBuf, Generated) {
    let path = dir.join(name);
    let generated = spec.write_to(&path).expect("the stemcell is generated");
    (path, generated)
}

/// The whole root.vhd of a spec (small VHDs only).
pub fn vhd_bytes(spec: &StemcellSpec) -> Vec<u8> {
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut spec.vhd.reader(), &mut out).expect("read generated VHD");
    out
}

/// Non-zero 512-byte sectors of `buf` as merged inclusive byte ranges.
pub fn nonzero_ranges(buf: &[u8]) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (i, sector) in buf.chunks(512).enumerate() {
        if sector.iter().any(|&b| b != 0) {
            let start = (i * 512) as u64;
            let end = start + 511;
            match out.last_mut() {
                Some(last) if last.1 + 1 == start => last.1 = end,
                _ => out.push((start, end)),
            }
        }
    }
    out
}

/// The blob's page ranges, merged where adjacent (inclusive ends, as the service reports them).
pub async fn page_ranges(blob: &BlobClient) -> Vec<(u64, u64)> {
    let resp = blob.get_page_ranges().await.expect("get page ranges");
    let mut ranges: Vec<(u64, u64)> = resp
        .page_list
        .ranges
        .iter()
        .map(|r| match r {
            azure_core::request_options::Range::Range(r) => (r.start, r.end),
            other => panic!("unexpected open page range {other:?}"),
        })
        .collect();
    ranges.sort();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (s, e) in ranges {
        match merged.last_mut() {
            Some(last) if last.1 + 1 == s => last.1 = e,
            _ => merged.push((s, e)),
        }
    }
    merged
}

pub fn sha256_hex(buf: &[u8]) -> String {
    hex::encode(Sha256::digest(buf))
}

pub async fn download_sha256(blob: &BlobClient) -> (String, u64) {
    let mut hasher = Sha256::new();
    let mut len = 0u64;
    let mut stream = blob.get().chunk_size(8 * 1024 * 1024u64).into_stream();
    while let Some(part) = stream.next().await {
        let part = part.expect("download chunk");
        let data = part.data.collect().await.expect("chunk body");
        len += data.len() as u64;
        hasher.update(&data);
    }
    (hex::encode(hasher.finalize()), len)
}

/// Check the blob `name` holds exactly the VHD: page ranges = non-zero sectors, bytes hash equal.
pub async fn assert_blob_is_vhd(container: &ContainerClient, name: &str, vhd: &[u8]) {
    let blob = container.blob_client(name);
    assert_eq!(
        page_ranges(&blob).await,
        nonzero_ranges(vhd),
        "the blob's page ranges are the VHD's non-zero sectors"
    );
    let (digest, len) = download_sha256(&blob).await;
    assert_eq!(len, vhd.len() as u64, "blob size");
    assert_eq!(digest, sha256_hex(vhd), "the blob's bytes are the VHD's");
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
    async fn owner(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!(
            "{}/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/galleries/{GALLERY}{path}?api-version=2023-07-03",
            self.emulator.arm
        );
        let mut req = reqwest::Client::new()
            .request(method, url)
            .bearer_auth("test-token");
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("the emulator answers");
        assert!(resp.status().is_success(), "{path}: {}", resp.status());
        resp.json().await.unwrap_or(Value::Null)
    }

    /// What Azure CPI v53.0.0 left behind for stemcell `name`/`version` (director mode): the
    /// page blob `stemcell/<cid>.vhd` holding `vhd` written whole (every page, zeros too), and a
    /// Succeeded version made from it tagged with the cloud properties, `stemcell_references=<cid>`,
    /// `compute_gallery_name`, `compute_gallery_image_definition` and `image`, without
    /// `image_sha256`.
    pub async fn cpi_v53_version(&self, cid: &str, version: &str, vhd: &[u8]) {
        let container = self.container();
        let _ = container.create().await;
        let blob = container.blob_client(format!("{cid}.vhd"));
        blob.put_page_blob(vhd.len() as u128)
            .await
            .expect("page blob");
        for (i, piece) in vhd.chunks(4 * 1024 * 1024).enumerate() {
            let start = (i * 4 * 1024 * 1024) as u64;
            let range = azure_storage_blobs::prelude::BA512Range::new(
                start,
                start + piece.len() as u64 - 1,
            )
            .expect("aligned");
            blob.put_page(range, piece.to_vec())
                .await
                .expect("put page");
        }
        let def = format!("/images/{DEFINITION}");
        self.owner(
            reqwest::Method::PUT,
            &def,
            Some(serde_json::json!({"location": LOC, "properties": {
                "osType": "Linux", "osState": "Generalized", "hyperVGeneration": "V1",
                "identifier": {"publisher": "bosh", "offer": DEFINITION, "sku": "gen1"}}})),
        )
        .await;
        self.owner(reqwest::Method::GET, &def, None).await;
        let key = format!("{version}.0");
        let path = format!("{def}/versions/{key}");
        self.owner(
            reqwest::Method::PUT,
            &path,
            Some(serde_json::json!({"location": LOC,
                "tags": {
                    "name": DEFINITION, "version": version, "os_type": "linux",
                    "stemcell_references": cid,
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
            let v = self.owner(reqwest::Method::GET, &path, None).await;
            if v["properties"]["provisioningState"] == "Succeeded" {
                assert!(v["tags"].get("image_sha256").is_none(), "{v}");
                return;
            }
        }
        panic!("the v53.0.0-era version did not succeed");
    }
}
