//! The unmodified Azure CPI's gallery calls, request for request, against the emulator: what a
//! director without the stemcell-gallery front does to the versions this tool shares with it.
//! Modelled on cloudfoundry/bosh-azure-cpi-release master (2026-08),
//! `lib/cloud/azure/stemcell/compute_gallery_manager.rb` and `restapi/azure_client.rb`
//! (REFERENCE.md, "How the Azure CPI uses a compute gallery"): no lock shared with us, no ETag,
//! tags read, changed and PUT back whole.

use serde_json::{json, Value};

use super::emulated::{timed_run, Raw, RawResponse};
use super::{RG, SUB};

/// The CPI's PUT api-version (v53.1.3 and later); GET and DELETE use 2023-07-03.
const PUT_API: &str = "2025-03-03";

pub struct PlainCpi {
    raw: Raw,
    gallery: String,
}

/// What the CPI's delete_stemcell did.
#[derive(Debug, PartialEq, Eq)]
pub enum CpiDelete {
    /// No version records the CID (the CPI then goes on to its blob and managed-image paths).
    NotFound,
    /// The CID was removed and the remaining tags PUT back.
    Updated,
    /// The CID was the last entry of `stemcell_references`: the version was DELETEd.
    DeletedVersion,
}

fn split(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_str)
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

impl PlainCpi {
    pub fn new(arm: &str, gallery: &str) -> PlainCpi {
        PlainCpi {
            raw: Raw::new(arm),
            gallery: gallery.to_string(),
        }
    }

    /// The CPI follows each write's long-running operation to its end (`azure_client.rb`
    /// `check_completion`). Under the instant timing the next request completes it anyway, so
    /// only timed runs (`STEMCELL_GALLERY_TEST_TIMING`) poll, keeping the instant run's request
    /// log as it was.
    async fn completed(&self, r: &RawResponse) {
        if !timed_run() {
            return;
        }
        let Some(op) = r.header("azure-asyncoperation") else {
            return;
        };
        let started = std::time::Instant::now();
        while self.raw.send("GET", &op, None, true).await.body["status"] == "InProgress" {
            assert!(
                started.elapsed().as_secs() < 120,
                "the CPI's operation ends"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    fn version_path(&self, definition: &str, version: &str) -> String {
        format!(
            "/subscriptions/{SUB}/resourceGroups/{RG}/providers/Microsoft.Compute/galleries/{}/images/{definition}/versions/{version}",
            self.gallery
        )
    }

    /// `get_gallery_image_version_by_stemcell_name`: the resources of the group carrying the
    /// gallery's tag, first page only, then the first version whose `stemcell_name` is the CID or
    /// whose `stemcell_references` lists it. Its id.
    pub async fn find(&self, cid: &str) -> Option<String> {
        let path = format!(
            "/subscriptions/{SUB}/resourceGroups/{RG}/resources?$filter=tagName eq 'compute_gallery_name' and tagValue eq '{}'&api-version=2021-04-01",
            self.gallery
        );
        let r = self.raw.get(&path).await;
        assert_eq!(r.status, 200, "the CPI's resource list: {}", r.text);
        r.body["value"].as_array()?.iter().find_map(|res| {
            if res["type"] != "Microsoft.Compute/galleries/images/versions" {
                return None;
            }
            let id = res["id"].as_str()?;
            let in_gallery = id
                .split('/')
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| w[0].eq_ignore_ascii_case("galleries") && w[1] == self.gallery);
            if !in_gallery {
                return None;
            }
            let tags = &res["tags"];
            let hit = tags["stemcell_name"].as_str() == Some(cid)
                || split(tags.get("stemcell_references"))
                    .iter()
                    .any(|r| r == cid);
            hit.then(|| id.to_string())
        })
    }

    /// `create_stemcell` when the version already exists (`handle_existing_gallery_image`):
    /// digest check, "not created by BOSH CPI" check, then `PUT {location, tags}` with the CID
    /// appended. `Err` carries what the CPI would raise (Azure's answer included).
    pub async fn reuse(
        &self,
        definition: &str,
        version: &str,
        cid: &str,
        image_sha256: &str,
    ) -> Result<(), String> {
        let path = self.version_path(definition, version);
        let got = self.raw.get(&path).await;
        if got.status != 200 {
            return Err(format!("GET {path}: {}", got.text));
        }
        let mut tags = got.body["tags"].as_object().cloned().unwrap_or_default();
        if let Some(existing) = tags.get("image_sha256").and_then(Value::as_str) {
            if existing != image_sha256 {
                return Err(format!("SHA256 mismatch: {existing} != {image_sha256}"));
            }
        }
        if !tags.contains_key("stemcell_references") && !tags.contains_key("stemcell_name") {
            return Err("already exists but was not created by BOSH CPI".into());
        }
        let mut list = split(tags.get("stemcell_references"));
        if let Some(name) = tags.get("stemcell_name").and_then(Value::as_str) {
            if !list.iter().any(|r| r == name) {
                list.push(name.to_string());
            }
        }
        if !list.iter().any(|r| r == cid) {
            list.push(cid.to_string());
        }
        tags.insert("stemcell_references".into(), json!(list.join(",")));
        tags.entry("image_sha256")
            .or_insert_with(|| json!(image_sha256));
        let r = self
            .raw
            .put(
                &format!("{path}?api-version={PUT_API}"),
                json!({"location": got.body["location"], "tags": tags}),
            )
            .await;
        if r.status >= 300 {
            return Err(format!("PUT {path}: {} {}", r.status, r.text));
        }
        self.completed(&r).await;
        Ok(())
    }

    /// `delete_stemcell` (`delete_gallery_image`): remove the CID from `stemcell_references`;
    /// nothing left → DELETE the version; else PUT the other tags back unchanged. No check of
    /// VMs, scale sets or disks.
    pub async fn delete(&self, cid: &str) -> CpiDelete {
        let Some(id) = self.find(cid).await else {
            return CpiDelete::NotFound;
        };
        let got = self.raw.get(&id).await;
        assert_eq!(got.status, 200, "{}", got.text);
        let mut tags = got.body["tags"].as_object().cloned().unwrap_or_default();
        let by_name = tags.get("stemcell_name").and_then(Value::as_str) == Some(cid);
        let mut list = split(tags.get("stemcell_references"));
        let in_list = list.iter().any(|r| r == cid);
        if !by_name && !in_list {
            return CpiDelete::NotFound;
        }
        list.retain(|r| r != cid);
        if list.is_empty() {
            let r = self.raw.delete(&id).await;
            assert!(r.status < 300, "{}", r.text);
            self.completed(&r).await;
            return CpiDelete::DeletedVersion;
        }
        tags.insert("stemcell_references".into(), json!(list.join(",")));
        let r = self
            .raw
            .put(
                &format!("{id}?api-version={PUT_API}"),
                json!({"location": got.body["location"], "tags": tags}),
            )
            .await;
        assert!(r.status < 300, "{}", r.text);
        self.completed(&r).await;
        CpiDelete::Updated
    }

    /// `create_vm`'s stemcell lookup: the version id its `imageReference.id` would name, `None`
    /// when the CPI falls back to the blob and managed-image paths.
    pub async fn create_vm(&self, cid: &str) -> Option<String> {
        self.find(cid).await
    }
}

/// Azure CPI v52.0.1–v53.0.0's gallery calls (tag v53.0.0, `stemcell/stemcell_manager2.rb` and
/// `restapi/azure_client.rb`): a stemcell's version carries its CID in the single tag
/// `stemcell_name` (no `stemcell_references`, no `image_sha256`), and both `create_vm` and
/// `delete_stemcell` find the version by that tag only
/// (`get_gallery_image_version_by_tags({'stemcell_name' => cid})`: the resources of the group
/// with `$filter=tagName eq 'stemcell_name' and tagValue eq '<cid>'`, first page, the first
/// gallery image version). Its `delete_stemcell` DELETEs that version, with no reference
/// counting.
pub struct CpiV53 {
    raw: Raw,
}

impl CpiV53 {
    pub fn new(arm: &str) -> CpiV53 {
        CpiV53 { raw: Raw::new(arm) }
    }

    /// The version v53.0.0 finds for `cid`: its id, then a GET of it.
    pub async fn find(&self, cid: &str) -> Option<Value> {
        let path = format!(
            "/subscriptions/{SUB}/resourceGroups/{RG}/resources?$filter=tagName eq 'stemcell_name' and tagValue eq '{cid}'&api-version=2021-04-01"
        );
        let r = self.raw.get(&path).await;
        assert_eq!(r.status, 200, "v53.0.0's resource list: {}", r.text);
        let id = r.body["value"]
            .as_array()?
            .iter()
            .find(|res| res["type"] == "Microsoft.Compute/galleries/images/versions")?["id"]
            .as_str()?
            .to_string();
        let got = self.raw.get(&id).await;
        (got.status == 200).then_some(got.body)
    }

    /// `create_vm`'s stemcell lookup: the version's id (`None`: v53.0.0 falls back to rebuilding
    /// the version from the blob's metadata, a full PUT).
    pub async fn create_vm(&self, cid: &str) -> Option<String> {
        self.find(cid)
            .await
            .and_then(|v| v["id"].as_str().map(str::to_string))
    }

    /// `delete_stemcell`: the version found by `stemcell_name` is DELETEd; `false` when none is.
    pub async fn delete(&self, cid: &str) -> bool {
        match self.try_delete(cid).await {
            None => false,
            Some((status, text)) => {
                assert!(status < 300, "{text}");
                true
            }
        }
    }

    /// `delete_stemcell` as sent: the DELETE's status and body (`None`: nothing found), the
    /// operation followed to its end when Azure accepted it.
    pub async fn try_delete(&self, cid: &str) -> Option<(u16, String)> {
        let v = self.find(cid).await?;
        let r = self.raw.delete(v["id"].as_str().unwrap()).await;
        if r.status >= 300 {
            return Some((r.status, r.text));
        }
        // `http_delete` follows the operation to its end (`check_completion`).
        if let Some(op) = r.header("azure-asyncoperation") {
            let started = std::time::Instant::now();
            while self.raw.send("GET", &op, None, true).await.body["status"] == "InProgress" {
                assert!(started.elapsed().as_secs() < 120, "the delete ends");
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
        Some((r.status, r.text))
    }
}
