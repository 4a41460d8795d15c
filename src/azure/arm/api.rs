//! The `GalleryApi` implementation: one method per gallery call, each a REST request sent
//! through the transport's retry loop, its body typed by `wire`, and its long-running operation
//! followed by `lro`. Also the gallery's own region (`GalleryLocation`).

use std::collections::BTreeMap;

use azure_core::http::Method;
use time::OffsetDateTime;

use super::lro::operation_from;
use super::transport::Resend;
use super::wire::{self, GALLERY_API_VERSION};
use super::ArmGallery;
use crate::gallery::error::{Error, Result};
use crate::gallery::model::*;
use crate::gallery::GalleryApi;

/// The REST paths of the gallery's resources (GalleryRP).
impl ArmGallery {
    fn gallery_url(&self) -> String {
        self.url(&self.gallery.id(), GALLERY_API_VERSION, &[])
    }

    fn definitions_url(&self) -> String {
        self.url(
            &format!("{}/images", self.gallery.id()),
            GALLERY_API_VERSION,
            &[],
        )
    }

    fn definition_url(&self, name: &str) -> String {
        self.url(&self.gallery.definition_id(name), GALLERY_API_VERSION, &[])
    }

    fn versions_url(&self, definition: &str) -> String {
        self.url(
            &format!("{}/versions", self.gallery.definition_id(definition)),
            GALLERY_API_VERSION,
            &[],
        )
    }

    fn version_url(&self, definition: &str, version: &str, expand: Option<&str>) -> String {
        let query: Vec<(&str, &str)> = expand.map(|e| ("$expand", e)).into_iter().collect();
        self.url(
            &self.gallery.version_id(definition, version),
            GALLERY_API_VERSION,
            &query,
        )
    }
}

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
        Ok(self.gallery_region().await?.is_some())
    }

    async fn soft_delete(&self) -> Result<Option<SoftDelete>> {
        let g: Option<wire::Gallery> = self
            .get_one(&self.gallery_url(), "read", &self.gallery.id())
            .await?;
        Ok(g.as_ref().and_then(wire::soft_delete_from))
    }

    async fn get_definition(&self, name: &str) -> Result<Option<ImageDefinition>> {
        let id = self.gallery.definition_id(name);
        let d: Option<wire::Definition> = self
            .get_one(&self.definition_url(name), "read", &id)
            .await?;
        Ok(d.map(wire::definition_from))
    }

    async fn list_definitions(&self) -> Result<Vec<ImageDefinition>> {
        let resource = format!("{}/images", self.gallery.id());
        let all: Vec<wire::Definition> = self
            .list_all(
                self.definitions_url(),
                GALLERY_API_VERSION,
                "list",
                &resource,
            )
            .await?;
        Ok(all.into_iter().map(wire::definition_from).collect())
    }

    async fn create_definition(&self, spec: &DefinitionSpec) -> Result<ImageDefinition> {
        let id = self.gallery.definition_id(&spec.name);
        let body = wire::encode(&wire::definition_body(spec), "image definition")?;
        let reply = self
            .write(
                Method::Put,
                &self.definition_url(&spec.name),
                Some(body),
                "create",
                &id,
                Resend::AfterTransientFailure,
            )
            .await?;
        let op = operation_from("create", &spec.name, "", &reply);
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
        let id = self.gallery.version_id(definition, version);
        let url = self.version_url(
            definition,
            version,
            with_replication.then_some("ReplicationStatus"),
        );
        let v: Option<wire::Version> = self.get_one(&url, "read", &id).await?;
        Ok(v.map(wire::version_from))
    }

    async fn list_versions(&self, definition: &str) -> Result<Vec<ImageVersion>> {
        let resource = format!("{}/versions", self.gallery.definition_id(definition));
        let all: Vec<wire::Version> = self
            .list_all(
                self.versions_url(definition),
                GALLERY_API_VERSION,
                "list",
                &resource,
            )
            .await?;
        Ok(all.into_iter().map(wire::version_from).collect())
    }

    async fn begin_create_version(&self, spec: &VersionSpec) -> Result<Operation> {
        let id = self.gallery.version_id(&spec.definition, &spec.version);
        let body = wire::encode(&wire::version_body(spec)?, "image version")?;
        // Re-sent only after a transient failure. A PUT that did reach Azure and is re-sent meets
        // either "operation in progress" (409), which the caller resolves by observing again, or
        // the identical body, which changes nothing.
        let reply = self
            .write(
                Method::Put,
                &self.version_url(&spec.definition, &spec.version, None),
                Some(body),
                "create",
                &id,
                Resend::AfterTransientFailure,
            )
            .await?;
        Ok(operation_from(
            "create",
            &spec.definition,
            &spec.version,
            &reply,
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
        let body = wire::encode(&wire::tags_patch(tags), "tag update")?;
        self.patch_version(definition, version, body, "tag update", Resend::Never)
            .await
    }

    async fn set_target_regions(
        &self,
        definition: &str,
        version: &str,
        regions: &[TargetRegion],
    ) -> Result<ImageVersion> {
        let body = wire::encode(&wire::regions_patch(regions), "target region update")?;
        self.patch_version(
            definition,
            version,
            body,
            "target region update",
            Resend::AfterTransientFailure,
        )
        .await
    }

    async fn delete_version(&self, definition: &str, version: &str) -> Result<()> {
        let id = self.gallery.version_id(definition, version);
        // Sent once: after a 429, 5xx, timeout or dropped connection the DELETE may or may not
        // have reached Azure, and the version may have gained a reference meanwhile. The caller
        // (gallery::service::delete_guarded) re-reads the version under its lock and decides
        // again before sending another.
        let reply = self
            .write(
                Method::Delete,
                &self.version_url(definition, version, None),
                None,
                "delete",
                &id,
                Resend::Never,
            )
            .await?;
        if reply.status == 404 {
            return Ok(());
        }
        let op = operation_from("delete", definition, version, &reply);
        self.wait_operation("delete", &id, &op, || async {
            Ok(self
                .get_version(definition, version, false)
                .await?
                .map(|v| v.provisioning_state))
        })
        .await?;
        self.until_gone(definition, version).await
    }

    async fn list_soft_deleted(&self, definition: &str) -> Result<Vec<SoftDeletedVersion>> {
        let resource = format!(
            "{}/softDeletedArtifactTypes/Images/artifacts/{definition}/versions",
            self.gallery.id()
        );
        let url = self.url(&resource, GALLERY_API_VERSION, &[]);
        match self
            .list_all::<wire::SoftDeletedItem>(url, GALLERY_API_VERSION, "list", &resource)
            .await
        {
            Ok(all) => Ok(all
                .into_iter()
                .map(|i| wire::soft_deleted_from(definition, i))
                .collect()),
            // The definition does not exist (ParentResourceNotFound): it holds none.
            Err(e) if e.is_not_found() => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    async fn restore_version(
        &self,
        definition: &str,
        version: &str,
    ) -> Result<Option<ImageVersion>> {
        let id = self.gallery.version_id(definition, version);
        let body = wire::encode(&wire::restore_patch(), "restore")?;
        // Sent once: a restore that did reach Azure and is re-sent finds nothing to restore.
        let reply = match self
            .write(
                Method::Patch,
                &self.version_url(definition, version, None),
                Some(body),
                "restore",
                &id,
                Resend::Never,
            )
            .await
        {
            Ok(r) => r,
            // Not soft-deleted (any more): restored by another caller, or gone for good. What
            // Azure answers then is not recorded (the emulator: 400, or 404 past its hard
            // deletion); the version's GET says which.
            Err(e) if matches!(e, Error::Rejected { .. }) || e.is_not_found() => {
                return self.settle_version(definition, version).await;
            }
            Err(e) => return Err(e),
        };
        let op = operation_from("update", definition, version, &reply);
        self.wait_operation("restore", &id, &op, || async {
            Ok(self
                .get_version(definition, version, false)
                .await?
                .map(|v| v.provisioning_state))
        })
        .await?;
        self.get_version(definition, version, false).await
    }

    fn protection(&self) -> &crate::gallery::protect::Protection {
        &self.protection
    }

    async fn version_locks(
        &self,
        definition: &str,
        version: &str,
    ) -> Result<Vec<crate::gallery::protect::ManagementLock>> {
        let id = self.gallery.version_id(definition, version);
        let mut locks = self.locks_at(&id).await?;
        locks.retain(|l| l.covers(&id));
        Ok(locks)
    }

    async fn gallery_locks(&self) -> Result<Vec<crate::gallery::protect::ManagementLock>> {
        self.locks_at(&self.gallery.id()).await
    }

    async fn put_version_lock(
        &self,
        definition: &str,
        version: &str,
        name: &str,
        notes: &str,
    ) -> Result<()> {
        self.put_lock(&self.gallery.version_id(definition, version), name, notes)
            .await
    }

    async fn delete_version_lock(&self, definition: &str, version: &str, name: &str) -> Result<()> {
        self.delete_lock(&self.gallery.version_id(definition, version), name)
            .await
    }

    async fn managed_images(&self) -> Result<Vec<String>> {
        self.managed_images_in_group().await
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
        body: Vec<u8>,
        what: &'static str,
        resend: Resend,
    ) -> Result<ImageVersion> {
        let id = self.gallery.version_id(definition, version);
        let reply = self
            .write(
                Method::Patch,
                &self.version_url(definition, version, None),
                Some(body),
                "update",
                &id,
                resend,
            )
            .await?;
        let op = operation_from("update", definition, version, &reply);
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

    /// The gallery's own region: `Ok(None)` when the gallery does not exist, `Ok(Some(None))` when
    /// it reports none. One GET of the gallery, with the same retries, token refresh and timeout
    /// as every call.
    pub async fn gallery_region(&self) -> Result<Option<Option<String>>> {
        let g: Option<wire::Gallery> = self
            .get_one(&self.gallery_url(), "read", &self.gallery.id())
            .await?;
        Ok(g.map(|g| {
            g.location
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
        }))
    }
}
