//! The narrow interface the domain uses to talk to the gallery API. `azure::arm` implements it
//! over ARM's REST API; unit tests may use in-memory fakes.

use std::collections::BTreeMap;

use super::error::Result;
use super::model::*;

/// Finding a storage account's resource id by its name (a version's source names the account by
/// id; REFERENCE.md "Source of a version from a VHD"). The ARM adapter implements it.
#[async_trait::async_trait]
pub trait StorageAccounts: Send + Sync {
    /// The id of storage account `name` in `subscription`; `None` when no account of that name
    /// is visible there (ARM filters the list to what the identity may read).
    async fn find_storage_account(
        &self,
        subscription: &str,
        name: &str,
    ) -> super::error::Result<Option<String>>;
}

#[async_trait::async_trait]
pub trait GalleryApi: Send + Sync {
    /// The gallery itself; `None` when it does not exist.
    async fn gallery_exists(&self) -> Result<bool>;
    /// The gallery's soft-delete policy when it is on; `None` when off (or no gallery).
    async fn soft_delete(&self) -> Result<Option<SoftDelete>>;

    /// What a DELETE that just completed did: gone for good, or soft-deleted and restorable until
    /// when (by Azure's clock). Never an error: the delete is done, and a policy that cannot be
    /// read is reported as unknown.
    async fn deleted_how(&self) -> super::lifecycle::Deleted {
        match self.soft_delete().await {
            Ok(policy) => super::lifecycle::Deleted::after(policy, self.server_time()),
            Err(e) => {
                tracing::warn!("the version was deleted, but the gallery's soft-delete policy could not be read, so whether it can be restored is unknown: {e}");
                super::lifecycle::Deleted::Unknown
            }
        }
    }

    async fn get_definition(&self, name: &str) -> Result<Option<ImageDefinition>>;
    async fn list_definitions(&self) -> Result<Vec<ImageDefinition>>;
    /// Create a definition and wait until it is Succeeded.
    async fn create_definition(&self, spec: &DefinitionSpec) -> Result<ImageDefinition>;

    /// One GET of a version; `None` on 404.
    async fn get_version(
        &self,
        definition: &str,
        version: &str,
        with_replication: bool,
    ) -> Result<Option<ImageVersion>>;
    async fn list_versions(&self, definition: &str) -> Result<Vec<ImageVersion>>;
    /// PUT a new version (sent once; re-sent only after a transient failure) and return the
    /// long-running operation to follow with `wait`.
    async fn begin_create_version(&self, spec: &VersionSpec) -> Result<Operation>;
    /// Follow a long-running operation to its end (Azure-AsyncOperation, Location, or the
    /// resource's provisioningState).
    async fn wait(&self, op: &Operation) -> Result<()>;
    /// Poll a version until it is no longer Creating/Updating/Deleting/Migrating (or gone).
    async fn wait_version_settled(
        &self,
        definition: &str,
        version: &str,
    ) -> Result<Option<ImageVersion>>;
    /// Replace a version's tags with a tags-only PATCH (immutable properties are not re-sent).
    /// Sent once: a transient failure is returned, never re-sent blindly (the caller re-reads
    /// and re-applies its change; see `gallery::guarded::merge_references`).
    async fn set_version_tags(
        &self,
        definition: &str,
        version: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<ImageVersion>;
    /// Replace the target regions (PATCH of publishingProfile.targetRegions).
    async fn set_target_regions(
        &self,
        definition: &str,
        version: &str,
        regions: &[TargetRegion],
    ) -> Result<ImageVersion>;
    /// DELETE a version and poll until it is gone (404). Already gone is success. The DELETE is
    /// sent once: after a transient failure the error is returned and the caller re-reads the
    /// version under its lock before sending another (`gallery::guarded::delete_guarded`).
    async fn delete_version(&self, definition: &str, version: &str) -> Result<()>;

    /// The definition's soft-deleted versions (api 2024-03-03+; REFERENCE.md "Today's Azure").
    /// A definition that does not exist holds none.
    async fn list_soft_deleted(&self, definition: &str) -> Result<Vec<SoftDeletedVersion>>;
    /// Restore a soft-deleted version (PATCH `properties.restore: true`, sent once) and follow
    /// it until it settles. `None`: it is neither soft-deleted nor there (gone for good).
    /// Restored meanwhile by another caller: that version.
    async fn restore_version(
        &self,
        definition: &str,
        version: &str,
    ) -> Result<Option<ImageVersion>>;

    /// Whether held versions are protected by a delete lock in this run (the setting, and
    /// what Azure said of the identity's lock permissions so far).
    fn protection(&self) -> &super::protect::Protection;
    /// Every management lock that applies to the version: at the version itself and at each
    /// scope above it (definition, gallery, resource group, subscription), each with the id of
    /// the scope it lives at (REFERENCE.md "Management locks": a list at a resource's scope
    /// names its resource group's locks too). A 403 means the identity may not read locks.
    async fn version_locks(
        &self,
        definition: &str,
        version: &str,
    ) -> Result<Vec<super::protect::ManagementLock>>;
    /// Every management lock at the gallery, above it and below it (its definitions and
    /// versions): one list for `cleanup` and `doctor`.
    async fn gallery_locks(&self) -> Result<Vec<super::protect::ManagementLock>>;
    /// Create or update the `CanNotDelete` lock `name` on the version (idempotent). A version
    /// that is not there is an error (404).
    async fn put_version_lock(
        &self,
        definition: &str,
        version: &str,
        name: &str,
        notes: &str,
    ) -> Result<()>;
    /// Delete the lock `name` on the version; already gone is success.
    async fn delete_version_lock(&self, definition: &str, version: &str, name: &str) -> Result<()>;

    /// VMs, scale sets (and their instances) and disks of the subscription that were created from
    /// a gallery image.
    async fn list_consumers(&self) -> Result<Vec<Consumer>>;

    /// The names of the managed images (`Microsoft.Compute/images`) of the gallery's resource
    /// group: the Azure CPI made one per stemcell, storage account type and location before the
    /// gallery (`<cid>-<type>-<location>`), which `migrate` reports.
    async fn managed_images(&self) -> Result<Vec<String>>;

    /// The subscriptions [`GalleryApi::list_consumers`] reads, for reports (empty: not said).
    fn consumer_scopes(&self) -> Vec<String> {
        Vec::new()
    }

    /// Azure's clock: the `Date` header of the latest answer, advanced by the time elapsed since
    /// (so ages are measured on the clock that stamped `publishedDate`, not the host's). `None`
    /// when no answer carried one; then nothing may be judged old.
    fn server_time(&self) -> Option<time::OffsetDateTime> {
        None
    }
}
