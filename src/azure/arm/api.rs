//! The `GalleryApi` implementation: one method per gallery call, each an SDK request sent through
//! the transport's retry loop, its JSON read by `wire`, and its long-running operation followed
//! by `lro`. Also the gallery's own region (`GalleryLocation`).

use std::collections::BTreeMap;

use azure_mgmt_compute::package_2024_07_01::models;
use futures::StreamExt;
use serde_json::{json, Value};
use time::OffsetDateTime;

use super::lro::operation_from;
use super::transport::Resend;
use super::wire::{
    body_json, definition_body, definition_from_json, from_value, region_json, sdk_json, str_at,
    version_body, version_from_json,
};
use super::ArmGallery;
use crate::gallery::error::{Error, Result};
use crate::gallery::model::*;
use crate::gallery::GalleryApi;

#[async_trait::async_trait]
impl crate::gallery::service::GalleryLocation for ArmGallery {
    async fn gallery_location(&self) -> Result<String> {
        let id = self.gallery.id();
        match self.gallery_region().await? {
            Some(Some(l)) => Ok(l),
            None => Err(Error::NotFound(format!(
                "gallery {id} does not exist: create it (az sig create), or fix --subscription/--resource-group/--gallery"
            ))),
            Some(None) => Err(Error::GalleryWithoutLocation { gallery: id }),
        }
    }
}

#[async_trait::async_trait]
impl GalleryApi for ArmGallery {
    fn server_time(&self) -> Option<OffsetDateTime> {
        self.transport.clock.now()
    }

    async fn gallery_exists(&self) -> Result<bool> {
        let g = &self.gallery;
        let r = self
            .call("read", &g.id(), || {
                self.client
                    .galleries_client()
                    .get(&g.subscription, &g.resource_group, &g.gallery)
                    .send()
            })
            .await;
        match r {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn get_definition(&self, name: &str) -> Result<Option<ImageDefinition>> {
        let g = &self.gallery;
        let id = g.definition_id(name);
        let r = self
            .call("read", &id, || async {
                let resp = self
                    .client
                    .gallery_images_client()
                    .get(&g.subscription, &g.resource_group, &g.gallery, name)
                    .send()
                    .await?;
                body_json(resp.into_raw_response()).await
            })
            .await;
        match r {
            Ok(v) => Ok(Some(definition_from_json(&v))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list_definitions(&self) -> Result<Vec<ImageDefinition>> {
        let g = &self.gallery;
        self.call("list", &format!("{}/images", g.id()), || async {
            let mut out = Vec::new();
            let mut pages = self
                .client
                .gallery_images_client()
                .list_by_gallery(&g.subscription, &g.resource_group, &g.gallery)
                .into_stream();
            while let Some(page) = pages.next().await {
                for d in page?.value {
                    out.push(definition_from_json(&sdk_json(&d)));
                }
            }
            Ok(out)
        })
        .await
    }

    async fn create_definition(&self, spec: &DefinitionSpec) -> Result<ImageDefinition> {
        let g = &self.gallery;
        let id = g.definition_id(&spec.name);
        let model: models::GalleryImage = from_value(definition_body(spec), "image definition")?;
        let resp = self
            .call("create", &id, || {
                self.client
                    .gallery_images_client()
                    .create_or_update(
                        &g.subscription,
                        &g.resource_group,
                        &g.gallery,
                        &spec.name,
                        model.clone(),
                    )
                    .send()
            })
            .await?;
        let op = operation_from("create", &spec.name, "", resp.as_raw_response().headers());
        self.wait_operation("create", &id, &op, || async {
            Ok(self
                .get_definition(&spec.name)
                .await?
                .map(|d| d.provisioning_state))
        })
        .await?;
        self.get_definition(&spec.name).await?.ok_or_else(|| {
            Error::NotFound(format!(
                "image definition {id} vanished right after it was created"
            ))
        })
    }

    async fn get_version(
        &self,
        definition: &str,
        version: &str,
        with_replication: bool,
    ) -> Result<Option<ImageVersion>> {
        let g = &self.gallery;
        let id = g.version_id(definition, version);
        let r = self
            .call("read", &id, || async {
                let mut b = self.client.gallery_image_versions_client().get(
                    &g.subscription,
                    &g.resource_group,
                    &g.gallery,
                    definition,
                    version,
                );
                if with_replication {
                    b = b.expand("ReplicationStatus");
                }
                body_json(b.send().await?.into_raw_response()).await
            })
            .await;
        match r {
            Ok(v) => Ok(Some(version_from_json(&v))),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn list_versions(&self, definition: &str) -> Result<Vec<ImageVersion>> {
        let g = &self.gallery;
        self.call(
            "list",
            &format!("{}/versions", g.definition_id(definition)),
            || async {
                let mut out = Vec::new();
                let mut pages = self
                    .client
                    .gallery_image_versions_client()
                    .list_by_gallery_image(
                        &g.subscription,
                        &g.resource_group,
                        &g.gallery,
                        definition,
                    )
                    .into_stream();
                while let Some(page) = pages.next().await {
                    for v in page?.value {
                        out.push(version_from_json(&sdk_json(&v)));
                    }
                }
                Ok(out)
            },
        )
        .await
    }

    async fn begin_create_version(&self, spec: &VersionSpec) -> Result<Operation> {
        let g = &self.gallery;
        let id = g.version_id(&spec.definition, &spec.version);
        let model: models::GalleryImageVersion = from_value(version_body(spec), "image version")?;
        // Re-sent only after a transient failure. A PUT that did reach Azure and is re-sent meets
        // either "operation in progress" (409), which the caller resolves by observing again, or
        // the identical body, which changes nothing.
        let resp = self
            .call("create", &id, || {
                self.client
                    .gallery_image_versions_client()
                    .create_or_update(
                        &g.subscription,
                        &g.resource_group,
                        &g.gallery,
                        &spec.definition,
                        &spec.version,
                        model.clone(),
                    )
                    .send()
            })
            .await?;
        Ok(operation_from(
            "create",
            &spec.definition,
            &spec.version,
            resp.as_raw_response().headers(),
        ))
    }

    async fn wait(&self, op: &Operation) -> Result<()> {
        let id = self.gallery.version_id(&op.definition, &op.version);
        let operation = match op.operation.as_str() {
            "delete" => "delete",
            "update" => "update",
            _ => "create",
        };
        self.wait_operation(operation, &id, op, || async {
            Ok(self
                .get_version(&op.definition, &op.version, false)
                .await?
                .map(|v| v.provisioning_state))
        })
        .await
    }

    async fn wait_version_settled(
        &self,
        definition: &str,
        version: &str,
    ) -> Result<Option<ImageVersion>> {
        self.settle_version(definition, version).await
    }

    async fn set_version_tags(
        &self,
        definition: &str,
        version: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<ImageVersion> {
        // A tags PATCH replaces the whole tag set, references included. Re-sent after a lost
        // response it would overwrite what another writer recorded meanwhile, so it is sent once
        // and the caller (gallery::service) re-reads and re-applies its change under its lock.
        //
        // No ETag either: GalleryImageVersion carries no `etag` property and neither
        // GalleryImageVersions_Update nor _CreateOrUpdate takes an `If-Match` header in the
        // Compute gallery REST spec (azure-rest-api-specs, specification/compute/resource-manager/
        // Microsoft.Compute/GalleryRP/stable/2024-03-03/GalleryRP.json and its examples
        // GalleryImageVersion_Get.json / GalleryImageVersion_Update.json; the same in 2023-07-03),
        // so there is no conditional write to use; the emulator ignores If-Match as Azure would.
        self.patch_version(
            definition,
            version,
            json!({"tags": tags}),
            "tag update",
            Resend::Never,
        )
        .await
    }

    async fn set_target_regions(
        &self,
        definition: &str,
        version: &str,
        regions: &[TargetRegion],
    ) -> Result<ImageVersion> {
        let spec_regions: Vec<Value> = regions.iter().map(region_json).collect();
        self.patch_version(
            definition,
            version,
            json!({"properties": {"publishingProfile": {"targetRegions": spec_regions}, "storageProfile": {}}}),
            "target region update",
            Resend::AfterTransientFailure,
        )
        .await
    }

    async fn delete_version(&self, definition: &str, version: &str) -> Result<()> {
        let g = &self.gallery;
        let id = g.version_id(definition, version);
        // Sent once: after a 429, 5xx, timeout or dropped connection the DELETE may or may not
        // have reached Azure, and the version may have gained a reference meanwhile. The caller
        // (gallery::service::delete_guarded) re-reads the version under its lock and decides
        // again before sending another.
        let r = self
            .transport
            .call("delete", &id, Resend::Never, || {
                self.client
                    .gallery_image_versions_client()
                    .delete(
                        &g.subscription,
                        &g.resource_group,
                        &g.gallery,
                        definition,
                        version,
                    )
                    .send()
            })
            .await;
        let resp = match r {
            Ok(resp) => resp,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        let op = operation_from(
            "delete",
            definition,
            version,
            resp.as_raw_response().headers(),
        );
        self.wait_operation("delete", &id, &op, || async {
            Ok(self
                .get_version(definition, version, false)
                .await?
                .map(|v| v.provisioning_state))
        })
        .await?;
        self.until_gone(definition, version).await
    }

    async fn list_consumers(&self) -> Result<Vec<Consumer>> {
        // The gallery's own subscription, then every configured consumer subscription
        // (`--consumer-subscription`, `consumer_subscriptions`): only these scopes are read, and
        // each only once the identity is proven to see all of it (a list the identity may not
        // see whole is no evidence).
        let mut out = Vec::new();
        for s in self.consumer_scopes() {
            self.check_consumer_view(&s).await?;
            self.list_consumers_in(&s, &mut out).await?;
        }
        Ok(out)
    }

    fn consumer_scopes(&self) -> Vec<String> {
        ArmGallery::consumer_scopes(self)
    }
}

impl ArmGallery {
    async fn patch_version(
        &self,
        definition: &str,
        version: &str,
        body: Value,
        what: &'static str,
        resend: Resend,
    ) -> Result<ImageVersion> {
        let g = &self.gallery;
        let id = g.version_id(definition, version);
        let model: models::GalleryImageVersionUpdate = from_value(body, what)?;
        let resp = self
            .transport
            .call("update", &id, resend, || {
                self.client
                    .gallery_image_versions_client()
                    .update(
                        &g.subscription,
                        &g.resource_group,
                        &g.gallery,
                        definition,
                        version,
                        model.clone(),
                    )
                    .send()
            })
            .await?;
        let op = operation_from(
            "update",
            definition,
            version,
            resp.as_raw_response().headers(),
        );
        self.wait_operation("update", &id, &op, || async {
            Ok(self
                .get_version(definition, version, false)
                .await?
                .map(|v| v.provisioning_state))
        })
        .await?;
        self.get_version(definition, version, true)
            .await?
            .ok_or_else(|| {
                Error::NotFound(format!("image version {id} vanished during its {what}"))
            })
    }
}

impl ArmGallery {
    /// The gallery's own region: `Ok(None)` when the gallery does not exist, `Ok(Some(None))` when
    /// it reports none. One GET of the gallery, with the same retries, token refresh and timeout
    /// as every call.
    pub async fn gallery_region(&self) -> Result<Option<Option<String>>> {
        let g = &self.gallery;
        let r = self
            .call("read", &g.id(), || async {
                let resp = self
                    .client
                    .galleries_client()
                    .get(&g.subscription, &g.resource_group, &g.gallery)
                    .send()
                    .await?;
                body_json(resp.into_raw_response()).await
            })
            .await;
        match r {
            Ok(v) => Ok(Some(
                str_at(&v, &["location"])
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_string),
            )),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }
}
