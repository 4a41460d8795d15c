//! `FakeGallery`: an in-memory test double of [`GalleryApi`].
//!
//! It is compiled always (it is small and has no dependencies of its own) so unit tests of the
//! library, integration tests under `tests/` and other crates' tests can all use it. It is **not**
//! an Azure implementation: long-running operations finish at once, there is no replication, and
//! nothing is persisted. What it adds for tests:
//!
//! - per-method call counters and a call log ([`FakeGallery::calls`], [`FakeGallery::call_log`]),
//!   so tests assert the exact calls made (e.g. "zero deletes", "consumers listed once");
//! - fault injection ([`FakeGallery::fail`]) on a method, or on a method for one resource;
//! - the highest number of deletions that were in flight at once
//!   ([`FakeGallery::max_concurrent_deletes`]).

use std::collections::BTreeMap;
use std::sync::Mutex;

use time::OffsetDateTime;

use super::api::GalleryApi;
use super::error::{AzureError, Error, Result};
use super::model::*;
use super::protect::{LockLevel, ManagementLock, Protection};

/// An injected failure: the fake answers as Azure would with `status` and `code`.
#[derive(Debug, Clone)]
pub struct Fault {
    pub status: u16,
    pub code: String,
    pub message: String,
    /// How many calls fail; `None` = every call.
    pub times: Option<usize>,
}

impl Fault {
    /// A permanent failure with this status and Azure error code.
    pub fn always(status: u16, code: &str) -> Self {
        Self {
            status,
            code: code.to_string(),
            message: format!("injected fault {code}"),
            times: None,
        }
    }

    /// Fail only the next `n` calls.
    pub fn times(mut self, n: usize) -> Self {
        self.times = Some(n);
        self
    }
}

#[derive(Debug, Default)]
struct State {
    definitions: BTreeMap<String, ImageDefinition>,
    versions: BTreeMap<String, BTreeMap<String, ImageVersion>>,
    consumers: Vec<Consumer>,
    managed_images: Vec<String>,
    calls: BTreeMap<String, usize>,
    log: Vec<String>,
    faults: BTreeMap<String, Fault>,
    deletes_in_flight: usize,
    max_deletes_in_flight: usize,
    soft_delete: Option<SoftDelete>,
    /// Versions deleted while soft delete was on, by definition and key.
    soft_deleted: BTreeMap<String, BTreeMap<String, ImageVersion>>,
    /// Management locks at any scope (this tool's and others').
    mgmt_locks: Vec<ManagementLock>,
}

/// In-memory gallery for tests. See the module documentation.
#[derive(Debug)]
pub struct FakeGallery {
    gallery: GalleryRef,
    state: Mutex<State>,
    protection: Protection,
}

impl Default for FakeGallery {
    fn default() -> Self {
        Self::new(GalleryRef {
            subscription: "00000000-0000-0000-0000-000000000000".into(),
            resource_group: "bosh-rg".into(),
            gallery: "stemcells".into(),
        })
    }
}

impl FakeGallery {
    pub fn new(gallery: GalleryRef) -> Self {
        Self {
            gallery,
            state: Mutex::new(State::default()),
            protection: Protection::default(),
        }
    }

    /// A fake whose protection setting is `protect_held_versions`.
    pub fn with_protection(mut self, protect_held_versions: bool) -> Self {
        self.protection = Protection::new(protect_held_versions);
        self
    }

    /// Place a management lock at `scope` (any id: the version's, its definition's, the
    /// resource group's), as another tool or an operator would.
    pub fn put_lock(&self, scope: &str, name: &str, level: LockLevel) {
        self.put_lock_with(scope, name, level, None);
    }

    fn put_lock_with(&self, scope: &str, name: &str, level: LockLevel, notes: Option<String>) {
        let id = super::protect::lock_id(scope, name);
        let mut st = self.lock();
        st.mgmt_locks.retain(|l| !l.id.eq_ignore_ascii_case(&id));
        st.mgmt_locks.push(ManagementLock {
            id,
            name: name.to_string(),
            level,
            notes,
        });
    }

    /// Remove every lock named `name` at `scope`, as an operator would by hand.
    pub fn remove_lock(&self, scope: &str, name: &str) {
        let id = super::protect::lock_id(scope, name);
        self.lock()
            .mgmt_locks
            .retain(|l| !l.id.eq_ignore_ascii_case(&id));
    }

    /// Every management lock, at every scope.
    pub fn mgmt_locks(&self) -> Vec<ManagementLock> {
        self.lock().mgmt_locks.clone()
    }

    /// Whether this tool's lock is on the version.
    pub fn held_lock_on(&self, definition: &str, version: &str) -> bool {
        let id = self.gallery.version_id(definition, version);
        self.lock().mgmt_locks.iter().any(|l| l.is_ours_on(&id))
    }

    pub fn gallery(&self) -> &GalleryRef {
        &self.gallery
    }

    /// Turn the gallery's soft-delete policy on (`Some`) or off (`None`), as `soft_delete` answers.
    pub fn set_soft_delete(&self, policy: Option<SoftDelete>) {
        self.lock().soft_delete = policy;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A test that panicked while holding the lock already failed; keep the data readable.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Add (or replace) an image definition with typical Linux/Generalized properties.
    pub fn add_definition(&self, name: &str) -> ImageDefinition {
        let def = ImageDefinition {
            id: self.gallery.definition_id(name),
            name: name.to_string(),
            location: "westeurope".into(),
            publisher: "bosh".into(),
            offer: name.to_string(),
            sku: if name.contains("-gen2") {
                "gen2"
            } else {
                "gen1"
            }
            .into(),
            os_type: "Linux".into(),
            os_state: "Generalized".into(),
            architecture: Some("x64".into()),
            generation: Some(if name.contains("-gen2") { "V2" } else { "V1" }.into()),
            features: BTreeMap::new(),
            tags: BTreeMap::new(),
            provisioning_state: ProvisioningState::Succeeded,
        };
        let mut st = self.lock();
        st.definitions.insert(name.to_string(), def.clone());
        st.versions.entry(name.to_string()).or_default();
        def
    }

    /// Add (or replace) a version, creating its definition when missing.
    pub fn add_version(
        &self,
        definition: &str,
        version: &str,
        state: ProvisioningState,
        published: OffsetDateTime,
        tags: BTreeMap<String, String>,
    ) -> ImageVersion {
        if !self.lock().definitions.contains_key(definition) {
            self.add_definition(definition);
        }
        let v = ImageVersion {
            id: self.gallery.version_id(definition, version),
            definition: definition.to_string(),
            version: version.to_string(),
            location: "westeurope".into(),
            provisioning_state: state,
            tags,
            source_uri: Some(format!(
                "https://bosh.blob.core.windows.net/stemcell/{definition}-{version}.vhd"
            )),
            storage_account_id: Some(format!(
                "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Storage/storageAccounts/bosh",
                self.gallery.subscription, self.gallery.resource_group
            )),
            published_date: Some(published),
            target_regions: vec![TargetRegion {
                name: "westeurope".into(),
                replicas: Some(1),
                storage_account_type: None,
                exclude_from_latest: None,
            }],
            exclude_from_latest: false,
            replication: None,
            safety: Default::default(),
        };
        self.put_version(v.clone());
        v
    }

    /// Remove a version as someone else would (the portal, `az`, another tool): no call is
    /// counted. Returns what was removed.
    pub fn remove_version(&self, definition: &str, version: &str) -> Option<ImageVersion> {
        let mut st = self.lock();
        st.versions
            .get_mut(definition)
            .and_then(|vs| vs.remove(version))
    }

    /// Put `v` among the soft-deleted versions (as a DELETE by someone else leaves it in a
    /// gallery with soft delete on).
    pub fn put_soft_deleted(&self, v: ImageVersion) {
        self.lock()
            .soft_deleted
            .entry(v.definition.clone())
            .or_default()
            .insert(v.version.clone(), v);
    }

    /// Store a version exactly as given (no call is counted).
    pub fn put_version(&self, v: ImageVersion) {
        let mut st = self.lock();
        st.versions
            .entry(v.definition.clone())
            .or_default()
            .insert(v.version.clone(), v);
    }

    /// Change a version behind the caller's back (no call is counted); `false` if it is absent.
    pub fn modify_version(
        &self,
        definition: &str,
        version: &str,
        f: impl FnOnce(&mut ImageVersion),
    ) -> bool {
        let mut st = self.lock();
        match st
            .versions
            .get_mut(definition)
            .and_then(|m| m.get_mut(version))
        {
            Some(v) => {
                f(v);
                true
            }
            None => false,
        }
    }

    /// A version as stored now (no call is counted).
    pub fn version(&self, definition: &str, version: &str) -> Option<ImageVersion> {
        self.lock()
            .versions
            .get(definition)
            .and_then(|m| m.get(version))
            .cloned()
    }

    /// Every stored version (no call is counted), ordered by definition then version string.
    pub fn versions(&self) -> Vec<ImageVersion> {
        self.lock()
            .versions
            .values()
            .flat_map(|m| m.values().cloned())
            .collect()
    }

    /// A managed image of the gallery's resource group, by name.
    pub fn add_managed_image(&self, name: &str) {
        self.lock().managed_images.push(name.to_string());
    }

    pub fn add_consumer(&self, kind: ConsumerKind, id: &str, image_id: &str) {
        self.push_consumer(Consumer::new(kind, id, image_id));
    }

    /// Add a consumer with every field given (region, recorded exact version).
    pub fn push_consumer(&self, consumer: Consumer) {
        self.lock().consumers.push(consumer);
    }

    /// Make calls fail. `key` is a method name (`"list_consumers"`), or a method and a resource
    /// (`"delete_version DEF/VER"`, `"list_versions DEF"`, `"get_version DEF/VER"`).
    pub fn fail(&self, key: &str, fault: Fault) {
        self.lock().faults.insert(key.to_string(), fault);
    }

    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// How many times `method` was called (failed calls included).
    pub fn calls(&self, method: &str) -> usize {
        self.lock().calls.get(method).copied().unwrap_or(0)
    }

    /// All calls counted, by method.
    pub fn call_counts(&self) -> BTreeMap<String, usize> {
        self.lock().calls.clone()
    }

    /// Every call, oldest first, as `"method resource"`.
    pub fn call_log(&self) -> Vec<String> {
        self.lock().log.clone()
    }

    pub fn reset_calls(&self) {
        let mut st = self.lock();
        st.calls.clear();
        st.log.clear();
        st.max_deletes_in_flight = 0;
    }

    /// The most `delete_version` calls that were running at the same time.
    pub fn max_concurrent_deletes(&self) -> usize {
        self.lock().max_deletes_in_flight
    }

    /// Count the call, then answer with an injected fault if one matches.
    fn enter(&self, method: &'static str, resource: &str) -> Result<()> {
        let mut st = self.lock();
        *st.calls.entry(method.to_string()).or_default() += 1;
        st.log.push(if resource.is_empty() {
            method.to_string()
        } else {
            format!("{method} {resource}")
        });
        let specific = format!("{method} {resource}");
        for key in [specific.as_str(), method] {
            let Some(fault) = st.faults.get_mut(key) else {
                continue;
            };
            if fault.times == Some(0) {
                continue;
            }
            if let Some(n) = fault.times.as_mut() {
                *n -= 1;
            }
            let fault = fault.clone();
            return Err(Error::azure(
                method,
                if resource.is_empty() {
                    self.gallery.id()
                } else {
                    resource.to_string()
                },
                AzureError {
                    status: fault.status,
                    code: fault.code,
                    message: fault.message,
                    target: None,
                    retry_after_secs: None,
                },
            ));
        }
        Ok(())
    }

    fn missing_version(&self, definition: &str, version: &str) -> Error {
        Error::NotFound(format!(
            "image version {} does not exist",
            self.gallery.version_id(definition, version)
        ))
    }
}

#[async_trait::async_trait]
impl GalleryApi for FakeGallery {
    async fn gallery_exists(&self) -> Result<bool> {
        self.enter("gallery_exists", "")?;
        Ok(true)
    }

    async fn soft_delete(&self) -> Result<Option<SoftDelete>> {
        self.enter("soft_delete", "")?;
        Ok(self.lock().soft_delete)
    }

    async fn get_definition(&self, name: &str) -> Result<Option<ImageDefinition>> {
        self.enter("get_definition", name)?;
        Ok(self.lock().definitions.get(name).cloned())
    }

    async fn list_definitions(&self) -> Result<Vec<ImageDefinition>> {
        self.enter("list_definitions", "")?;
        Ok(self.lock().definitions.values().cloned().collect())
    }

    async fn create_definition(&self, spec: &DefinitionSpec) -> Result<ImageDefinition> {
        self.enter("create_definition", &spec.name)?;
        let mut def = self.add_definition(&spec.name);
        def.location = spec.location.clone();
        def.publisher = spec.publisher.clone();
        def.offer = spec.offer.clone();
        def.sku = spec.sku.clone();
        def.architecture = Some(spec.architecture.as_azure().into());
        def.generation = Some(spec.generation.as_azure().into());
        def.features = spec.features.clone();
        def.tags = spec.tags.clone();
        self.lock()
            .definitions
            .insert(spec.name.clone(), def.clone());
        Ok(def)
    }

    async fn get_version(
        &self,
        definition: &str,
        version: &str,
        _with_replication: bool,
    ) -> Result<Option<ImageVersion>> {
        self.enter("get_version", &format!("{definition}/{version}"))?;
        Ok(self.version(definition, version))
    }

    async fn list_versions(&self, definition: &str) -> Result<Vec<ImageVersion>> {
        self.enter("list_versions", definition)?;
        let st = self.lock();
        if !st.definitions.contains_key(definition) {
            return Err(Error::NotFound(format!(
                "image definition {} does not exist",
                self.gallery.definition_id(definition)
            )));
        }
        Ok(st
            .versions
            .get(definition)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default())
    }

    /// Creates the version Succeeded at once (the fake has no replication to wait for).
    async fn begin_create_version(&self, spec: &VersionSpec) -> Result<Operation> {
        self.enter(
            "begin_create_version",
            &format!("{}/{}", spec.definition, spec.version),
        )?;
        if !self.lock().definitions.contains_key(&spec.definition) {
            return Err(Error::NotFound(format!(
                "image definition {} does not exist",
                self.gallery.definition_id(&spec.definition)
            )));
        }
        // A name soft-deleted is still taken (as the emulator models it, `emulator::arm::
        // soft_delete::put_over`): a PUT with the same source brings the version back as it
        // was (SDDOC's restore); another source is refused with 409 `Conflict`.
        let held = self
            .lock()
            .soft_deleted
            .get(&spec.definition)
            .and_then(|m| m.get(&spec.version))
            .cloned();
        if let Some(held) = held {
            if held.source_uri.as_deref() != Some(spec.source_uri.as_str()) {
                return Err(Error::azure(
                    "begin_create_version",
                    held.id.clone(),
                    AzureError {
                        status: 409,
                        code: "Conflict".into(),
                        message: format!("Gallery image version '{}' is soft-deleted and its name is still taken.", held.id),
                        target: None,
                        retry_after_secs: None,
                    },
                ));
            }
            let mut st = self.lock();
            if let Some(mut v) = st
                .soft_deleted
                .get_mut(&spec.definition)
                .and_then(|m| m.remove(&spec.version))
            {
                v.provisioning_state = ProvisioningState::Succeeded;
                st.versions
                    .entry(spec.definition.clone())
                    .or_default()
                    .insert(spec.version.clone(), v);
                return Ok(created(spec));
            }
        }
        if let Some(existing) = self.version(&spec.definition, &spec.version) {
            if existing.source_uri.as_deref() != Some(spec.source_uri.as_str()) {
                return Err(Error::azure(
                    "begin_create_version",
                    existing.id,
                    AzureError {
                        status: 409,
                        code: "PropertyChangeNotAllowed".into(),
                        message: "Changing property 'galleryImageVersion.properties.storageProfile.osDiskImage.source.uri' is not allowed.".into(),
                        target: Some("galleryImageVersion.properties.storageProfile.osDiskImage.source.uri".into()),
                        retry_after_secs: None,
                    },
                ));
            }
        }
        let v = ImageVersion {
            id: self.gallery.version_id(&spec.definition, &spec.version),
            definition: spec.definition.clone(),
            version: spec.version.clone(),
            location: spec.location.clone(),
            provisioning_state: ProvisioningState::Succeeded,
            tags: spec.tags.clone(),
            source_uri: Some(spec.source_uri.clone()),
            storage_account_id: Some(spec.storage_account_id.clone()),
            published_date: Some(OffsetDateTime::now_utc()),
            target_regions: spec.target_regions.clone(),
            exclude_from_latest: spec.exclude_from_latest,
            replication: None,
            safety: Default::default(),
        };
        self.put_version(v);
        Ok(created(spec))
    }

    async fn wait(&self, op: &Operation) -> Result<()> {
        self.enter("wait", &format!("{}/{}", op.definition, op.version))?;
        Ok(())
    }

    async fn wait_version_settled(
        &self,
        definition: &str,
        version: &str,
    ) -> Result<Option<ImageVersion>> {
        self.enter("wait_version_settled", &format!("{definition}/{version}"))?;
        Ok(self.version(definition, version))
    }

    async fn set_version_tags(
        &self,
        definition: &str,
        version: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<ImageVersion> {
        self.enter("set_version_tags", &format!("{definition}/{version}"))?;
        let mut out = None;
        self.modify_version(definition, version, |v| {
            v.tags = tags.clone();
            out = Some(v.clone());
        });
        out.ok_or_else(|| self.missing_version(definition, version))
    }

    async fn set_target_regions(
        &self,
        definition: &str,
        version: &str,
        regions: &[TargetRegion],
    ) -> Result<ImageVersion> {
        self.enter("set_target_regions", &format!("{definition}/{version}"))?;
        let mut out = None;
        self.modify_version(definition, version, |v| {
            v.target_regions = regions.to_vec();
            out = Some(v.clone());
        });
        out.ok_or_else(|| self.missing_version(definition, version))
    }

    async fn delete_version(&self, definition: &str, version: &str) -> Result<()> {
        self.enter("delete_version", &format!("{definition}/{version}"))?;
        {
            let mut st = self.lock();
            // Azure refuses the DELETE of a locked resource, whatever lock and level, with 409
            // ScopeLocked (REFERENCE.md "Management locks").
            let id = self.gallery.version_id(definition, version);
            let locked: Vec<String> = st
                .mgmt_locks
                .iter()
                .filter(|l| l.covers(&id))
                .map(|l| l.scope().to_string())
                .collect();
            if !locked.is_empty() {
                return Err(Error::azure(
                    "delete",
                    id.clone(),
                    AzureError {
                        status: 409,
                        code: super::error::SCOPE_LOCKED.into(),
                        message: format!("The scope '{id}' cannot perform delete operation because following scope(s) are locked: '{}'. Please remove the lock and try again.", locked.join("','")),
                        target: None,
                        retry_after_secs: None,
                    },
                ));
            }
            st.deletes_in_flight += 1;
            st.max_deletes_in_flight = st.max_deletes_in_flight.max(st.deletes_in_flight);
        }
        // Let other deletions start, as a real long-running DELETE would.
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        let mut st = self.lock();
        st.deletes_in_flight -= 1;
        let gone = st
            .versions
            .get_mut(definition)
            .and_then(|m| m.remove(version));
        if let (Some(v), Some(_)) = (gone, st.soft_delete) {
            st.soft_deleted
                .entry(definition.to_string())
                .or_default()
                .insert(version.to_string(), v);
        }
        Ok(())
    }

    async fn list_soft_deleted(&self, definition: &str) -> Result<Vec<SoftDeletedVersion>> {
        self.enter("list_soft_deleted", definition)?;
        let st = self.lock();
        Ok(st
            .soft_deleted
            .get(definition)
            .map(|m| {
                m.values()
                    .map(|v| SoftDeletedVersion {
                        id: v.id.clone(),
                        definition: definition.to_string(),
                        version: v.version.clone(),
                        soft_deleted_time: None,
                        consumption_end_time: None,
                        hard_deletion_target_time: None,
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn restore_version(
        &self,
        definition: &str,
        version: &str,
    ) -> Result<Option<ImageVersion>> {
        self.enter("restore_version", &format!("{definition}/{version}"))?;
        let mut st = self.lock();
        let Some(mut v) = st
            .soft_deleted
            .get_mut(definition)
            .and_then(|m| m.remove(version))
        else {
            return Ok(st
                .versions
                .get(definition)
                .and_then(|m| m.get(version))
                .cloned());
        };
        v.provisioning_state = ProvisioningState::Succeeded;
        st.versions
            .entry(definition.to_string())
            .or_default()
            .insert(version.to_string(), v.clone());
        Ok(Some(v))
    }

    fn protection(&self) -> &Protection {
        &self.protection
    }

    async fn version_locks(&self, definition: &str, version: &str) -> Result<Vec<ManagementLock>> {
        self.enter("version_locks", &format!("{definition}/{version}"))?;
        let id = self.gallery.version_id(definition, version);
        Ok(self
            .lock()
            .mgmt_locks
            .iter()
            .filter(|l| l.covers(&id))
            .cloned()
            .collect())
    }

    async fn gallery_locks(&self) -> Result<Vec<ManagementLock>> {
        self.enter("gallery_locks", "")?;
        Ok(self.mgmt_locks())
    }

    async fn put_version_lock(
        &self,
        definition: &str,
        version: &str,
        name: &str,
        notes: &str,
    ) -> Result<()> {
        self.enter("put_version_lock", &format!("{definition}/{version}"))?;
        if self.version(definition, version).is_none() {
            return Err(Error::azure(
                "lock",
                self.gallery.version_id(definition, version),
                AzureError {
                    status: 404,
                    code: "ResourceNotFound".into(),
                    message: "The resource was not found.".into(),
                    target: None,
                    retry_after_secs: None,
                },
            ));
        }
        self.put_lock_with(
            &self.gallery.version_id(definition, version),
            name,
            LockLevel::CanNotDelete,
            Some(notes.to_string()),
        );
        Ok(())
    }

    async fn delete_version_lock(&self, definition: &str, version: &str, name: &str) -> Result<()> {
        self.enter("delete_version_lock", &format!("{definition}/{version}"))?;
        self.remove_lock(&self.gallery.version_id(definition, version), name);
        Ok(())
    }

    async fn list_consumers(&self) -> Result<Vec<Consumer>> {
        self.enter("list_consumers", "")?;
        Ok(self.lock().consumers.clone())
    }

    async fn managed_images(&self) -> Result<Vec<String>> {
        self.enter("managed_images", "")?;
        Ok(self.lock().managed_images.clone())
    }
}

/// The finished operation of a create of `spec` (the fake's creates are done at once).
fn created(spec: &VersionSpec) -> Operation {
    Operation {
        operation: "create".into(),
        definition: spec.definition.clone(),
        version: spec.version.clone(),
        async_operation_url: None,
        location_url: None,
        retry_after_secs: None,
    }
}
