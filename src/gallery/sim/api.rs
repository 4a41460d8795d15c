//! `SimApi`: the ARM port (`GalleryApi`) the simulated commands talk to. It delegates to the
//! in-memory `FakeGallery` and adds what the simulation needs of Azure:
//!
//! - every call is a scheduling point (`probe::yield_point`): the scheduler may run another
//!   command between any two requests, as concurrent processes interleave on Azure;
//! - a tag write can land late (docs/references.md "The reference record": "a tag write the
//!   service delays can land after another writer's"): armed per gallery, the next tool tag
//!   write is held and applied at a later step, after its writer returned (`LateKind`);
//! - the writes that matter to the ledger are reported as `probe::Event`s (tag writes with what
//!   they replaced, creates, deletes, restores), each with the operation that sent it.
//!
//! 429/503 storms are the fake's own fault injection (`FakeGallery::fail`), set by the driver.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::gallery::error::{AzureError, Error, Result};
use crate::gallery::fake::FakeGallery;
use crate::gallery::model::*;
use crate::gallery::GalleryApi;

use super::probe::{yield_point, Event, LateKind, LateWrite, Probe, VersionAt};

pub struct SimApi {
    pub g: usize,
    pub inner: Arc<FakeGallery>,
    pub probe: Arc<Probe>,
}

impl SimApi {
    fn at(&self, definition: &str, version: &str) -> VersionAt {
        (self.g, definition.to_string(), version.to_string())
    }

    /// Whether `definition`/`version` is soft-deleted now (read as the simulator, not counted
    /// against the fake's faults).
    async fn soft_deleted(&self, definition: &str, version: &str) -> bool {
        let was = self.probe.quiet();
        self.probe.set_quiet(true);
        let listed = self.inner.list_soft_deleted(definition).await;
        self.probe.set_quiet(was);
        listed.is_ok_and(|l| l.iter().any(|s| s.version == version))
    }

    async fn enter(&self, method: &str) {
        yield_point(&self.probe).await;
        self.probe.count(&format!("arm:{method}"));
    }
}

#[async_trait::async_trait]
impl GalleryApi for SimApi {
    fn protection(&self) -> &crate::gallery::protect::Protection {
        self.inner.protection()
    }

    // Management locks (`gallery::protect`) are not scheduling points: they read and write no
    // tag, record, intent or lease the ledger's invariants judge, and a yield there only deals
    // the schedules again (the seeds that reach the open windows docs/RELIABILITY.md lists move;
    // measured in the issue 46 note). Counted, never yielded on; the lock's own rules (placed
    // when held, lifted only for this tool's delete and put back, another's lock kept, repairs)
    // are proven by tests/integration/gallery_scenarios/{locks,fake_locks}.rs and
    // emulator_locks.rs. The fake refuses a DELETE under a lock, so the simulation's deleters
    // meet it.
    async fn version_locks(
        &self,
        definition: &str,
        version: &str,
    ) -> Result<Vec<crate::gallery::protect::ManagementLock>> {
        self.probe.count("arm:version_locks");
        self.inner.version_locks(definition, version).await
    }

    async fn gallery_locks(&self) -> Result<Vec<crate::gallery::protect::ManagementLock>> {
        self.probe.count("arm:gallery_locks");
        self.inner.gallery_locks().await
    }

    async fn put_version_lock(
        &self,
        definition: &str,
        version: &str,
        name: &str,
        notes: &str,
    ) -> Result<()> {
        self.probe.count("arm:put_version_lock");
        self.inner
            .put_version_lock(definition, version, name, notes)
            .await
    }

    async fn delete_version_lock(&self, definition: &str, version: &str, name: &str) -> Result<()> {
        self.probe.count("arm:delete_version_lock");
        self.inner
            .delete_version_lock(definition, version, name)
            .await
    }

    async fn gallery_exists(&self) -> Result<bool> {
        self.enter("gallery_exists").await;
        self.inner.gallery_exists().await
    }

    async fn soft_delete(&self) -> Result<Option<SoftDelete>> {
        self.enter("soft_delete").await;
        self.inner.soft_delete().await
    }

    async fn get_definition(&self, name: &str) -> Result<Option<ImageDefinition>> {
        self.enter("get_definition").await;
        self.inner.get_definition(name).await
    }

    async fn list_definitions(&self) -> Result<Vec<ImageDefinition>> {
        self.enter("list_definitions").await;
        self.inner.list_definitions().await
    }

    async fn create_definition(&self, spec: &DefinitionSpec) -> Result<ImageDefinition> {
        self.enter("create_definition").await;
        self.inner.create_definition(spec).await
    }

    async fn get_version(
        &self,
        definition: &str,
        version: &str,
        with_replication: bool,
    ) -> Result<Option<ImageVersion>> {
        self.enter("get_version").await;
        let r = self
            .inner
            .get_version(definition, version, with_replication)
            .await;
        if r.is_ok() {
            self.probe.read(&self.at(definition, version), false);
        }
        r
    }

    async fn list_versions(&self, definition: &str) -> Result<Vec<ImageVersion>> {
        self.enter("list_versions").await;
        let r = self.inner.list_versions(definition).await;
        if let Ok(vs) = &r {
            for v in vs {
                self.probe.read(&self.at(definition, &v.version), true);
            }
        }
        r
    }

    async fn begin_create_version(&self, spec: &VersionSpec) -> Result<Operation> {
        self.enter("begin_create_version").await;
        let at = self.at(&spec.definition, &spec.version);
        let before = self.inner.version(&spec.definition, &spec.version);
        if before.is_none() && self.soft_deleted(&spec.definition, &spec.version).await {
            // Azure keeps a soft-deleted version's name taken (the fake does not).
            return Err(Error::azure(
                "begin_create_version",
                self.inner
                    .gallery()
                    .version_id(&spec.definition, &spec.version),
                AzureError {
                    status: 409,
                    code: "Conflict".into(),
                    message: "simulated: a soft-deleted version holds this name".into(),
                    target: None,
                    retry_after_secs: None,
                },
            ));
        }
        let r = self.inner.begin_create_version(spec).await;
        if r.is_ok() {
            if before.is_none() {
                self.probe.born(&at);
                if let Some(op) = self.probe.current() {
                    self.probe.push(Event::Created { at: at.clone(), op });
                }
            } else {
                self.probe.touched(&at);
            }
            self.probe.read(&at, false);
        }
        r
    }

    async fn wait(&self, op: &Operation) -> Result<()> {
        self.enter("wait").await;
        self.inner.wait(op).await
    }

    async fn wait_version_settled(
        &self,
        definition: &str,
        version: &str,
    ) -> Result<Option<ImageVersion>> {
        self.enter("wait_version_settled").await;
        let r = self.inner.wait_version_settled(definition, version).await;
        if r.is_ok() {
            self.probe.read(&self.at(definition, version), false);
        }
        r
    }

    async fn set_version_tags(
        &self,
        definition: &str,
        version: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<ImageVersion> {
        self.enter("set_version_tags").await;
        let at = self.at(definition, version);
        let op = self.probe.current();
        // Built on a read of a life that ended since: so are its late landings.
        let crossed = self.probe.read_earlier_life(&at);
        let late = if self.inner.version(definition, version).is_some() {
            self.probe.take_armed(self.g)
        } else {
            None
        };
        if late == Some(LateKind::LostAnswer) {
            // Counted as the fake counts a call, then held: the writer sees a timeout.
            self.probe.hold(LateWrite {
                at: at.clone(),
                tags: tags.clone(),
                born: self.probe.life(&at),
                kind: LateKind::LostAnswer,
                op,
                crossed,
            });
            return Err(Error::azure(
                "set_version_tags",
                self.inner.gallery().version_id(definition, version),
                AzureError {
                    status: 504,
                    code: "GatewayTimeout".into(),
                    message: "simulated: the answer was lost; the PATCH lands later".into(),
                    target: None,
                    retry_after_secs: None,
                },
            ));
        }
        let before = self.inner.version(definition, version).map(|v| v.tags);
        let blind = self.probe.blind(&at);
        let r = self.inner.set_version_tags(definition, version, tags).await;
        if let (Ok(v), Some(before)) = (&r, before) {
            self.probe.touched(&at);
            self.probe.read(&at, false);
            if let (true, Some(op)) = (crossed, op) {
                self.probe.push(Event::CrossedLives {
                    at: at.clone(),
                    op,
                    refs: crate::gallery::tags::references(tags),
                });
            }
            self.probe.push(Event::TagWrite {
                at: at.clone(),
                op,
                before,
                after: v.tags.clone(),
                blind,
                late: false,
            });
            if late == Some(LateKind::Duplicate) {
                self.probe.hold(LateWrite {
                    at,
                    tags: tags.clone(),
                    born: self
                        .probe
                        .life(&(self.g, definition.into(), version.into())),
                    kind: LateKind::Duplicate,
                    op,
                    crossed,
                });
            }
        }
        r
    }

    async fn set_target_regions(
        &self,
        definition: &str,
        version: &str,
        regions: &[TargetRegion],
    ) -> Result<ImageVersion> {
        self.enter("set_target_regions").await;
        self.probe.touched(&self.at(definition, version));
        self.inner
            .set_target_regions(definition, version, regions)
            .await
    }

    async fn delete_version(&self, definition: &str, version: &str) -> Result<()> {
        self.enter("delete_version").await;
        let at = self.at(definition, version);
        let op = self.probe.current();
        let before = self.inner.version(definition, version);
        let mut blind = self.probe.blind(&at);
        let listed = self.probe.seen_only_listed(&at);
        let crossed = self.probe.read_earlier_life(&at);
        let epoch = self.probe.epoch(&at);
        if before.is_some() {
            *self.probe.lock().deleting.entry(at.clone()).or_default() += 1;
        }
        let r = self.inner.delete_version(definition, version).await;
        if before.is_some() {
            let mut st = self.probe.lock();
            if let Some(n) = st.deleting.get_mut(&at) {
                *n -= 1;
                if *n == 0 {
                    st.deleting.remove(&at);
                }
            }
        }
        // Someone wrote the version while the DELETE was under way (it is a long-running
        // operation): the DELETE still wins, as on Azure.
        blind |= self.probe.epoch(&at) != epoch;
        if r.is_ok() && before.is_none() {
            if let Some(op) = op {
                self.probe
                    .push(Event::DeletedNothing { at: at.clone(), op });
            }
        }
        if r.is_ok() {
            if let (Some(before), None) = (before, self.inner.version(definition, version)) {
                self.probe.touched(&at);
                if let Some(op) = op {
                    self.probe.push(Event::Deleted {
                        at,
                        op,
                        before: Box::new(before),
                        blind,
                        listed,
                        crossed,
                    });
                }
            }
        }
        r
    }

    async fn list_soft_deleted(&self, definition: &str) -> Result<Vec<SoftDeletedVersion>> {
        self.enter("list_soft_deleted").await;
        self.inner.list_soft_deleted(definition).await
    }

    async fn restore_version(
        &self,
        definition: &str,
        version: &str,
    ) -> Result<Option<ImageVersion>> {
        self.enter("restore_version").await;
        let at = self.at(definition, version);
        let before = self.inner.version(definition, version);
        let r = self.inner.restore_version(definition, version).await;
        if let (Ok(Some(_)), None) = (&r, before) {
            self.probe.touched(&at);
            if let Some(op) = self.probe.current() {
                self.probe.push(Event::Restored { at, op });
            }
        }
        r
    }

    async fn list_consumers(&self) -> Result<Vec<Consumer>> {
        self.enter("list_consumers").await;
        self.inner.list_consumers().await
    }

    fn consumer_scopes(&self) -> Vec<String> {
        self.inner.consumer_scopes()
    }

    async fn managed_images(&self) -> Result<Vec<String>> {
        self.enter("managed_images").await;
        self.inner.managed_images().await
    }

    fn server_time(&self) -> Option<time::OffsetDateTime> {
        self.inner.server_time()
    }
}
