//! Held means locked: while this tool holds anything on a version (its sentinel is in
//! `stemcell_references`), the version carries a `CanNotDelete` management lock this tool owns,
//! so that clients who do not read the ledger (Azure CPI v52.0.1–v53.0.0 deleting by
//! `stemcell_name`, the portal, `az sig image-version delete`, Terraform) are refused by Azure
//! itself (409 `ScopeLocked`; REFERENCE.md "Management locks").
//!
//! The rules, each applied under the version's lock (the cross-host lease every writer takes):
//! - a reference write that leaves the version held places the lock ([`settle`]), and so do a
//!   create, an adoption, a restore, every later write and `cleanup --apply` (through
//!   [`lock_repairs`] and `GalleryService::repair_lock`): a crash between the reference and its
//!   lock, a refused lock PUT or a lock removed by hand is repaired by the next of them;
//! - a reference write that leaves the version held by the Azure CPI's own CIDs only lifts the
//!   lock: the version is then the CPI's to delete, and a plain CPI's `delete_stemcell` must
//!   keep working;
//! - a guarded delete lifts the lock right before its DELETE, after its last re-check, and puts
//!   it back when Azure refuses the DELETE ([`lift_for_delete`], [`put_back`]);
//! - a lock this tool does not own (another name, or any lock at the definition, gallery,
//!   resource group or subscription) is never lifted: the version is kept, naming it
//!   ([`others`]).
//!
//! Without `Microsoft.Authorization/locks/*` the tool works as before and says once per run that
//! held versions are not protected; `protect_held_versions = false` turns protection off on
//! purpose ([`Protection`]).

use std::sync::atomic::{AtomicBool, Ordering};

use super::error::{Error, Result};
use super::model::ImageVersion;
use super::tags;
use super::GalleryApi;

/// The name of the lock this tool places on a version it holds. Fixed: every host and release
/// finds the same lock, and an operator can name it (`az lock delete --name stemcell-gallery-held`).
pub const LOCK_NAME: &str = "stemcell-gallery-held";

/// A management lock's level (REFERENCE.md "Management locks").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockLevel {
    CanNotDelete,
    ReadOnly,
    /// A level this release does not know, kept verbatim (it is treated as restricting).
    Other(String),
}

impl LockLevel {
    pub fn parse(s: &str) -> Self {
        if s.eq_ignore_ascii_case("CanNotDelete") {
            LockLevel::CanNotDelete
        } else if s.eq_ignore_ascii_case("ReadOnly") {
            LockLevel::ReadOnly
        } else {
            LockLevel::Other(s.to_string())
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            LockLevel::CanNotDelete => "CanNotDelete",
            LockLevel::ReadOnly => "ReadOnly",
            LockLevel::Other(s) => s,
        }
    }
}

/// What follows a scope in the id of a lock at it (and in the path of the list there).
pub const LOCKS_PATH: &str = "/providers/Microsoft.Authorization/locks";

/// The id of lock `name` at `scope` (any resource id, resource group or subscription).
pub fn lock_id(scope: &str, name: &str) -> String {
    format!("{scope}{LOCKS_PATH}/{name}")
}

/// One management lock as Azure lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagementLock {
    /// [`lock_id`] of its scope and name.
    pub id: String,
    pub name: String,
    pub level: LockLevel,
    pub notes: Option<String>,
}

impl ManagementLock {
    /// The scope the lock lives at: its id without the `/providers/Microsoft.Authorization/locks/…`
    /// suffix.
    pub fn scope(&self) -> &str {
        let lower = self.id.to_ascii_lowercase();
        match lower.rfind(&format!("{}/", LOCKS_PATH.to_ascii_lowercase())) {
            Some(i) => &self.id[..i],
            None => &self.id,
        }
    }

    /// Whether this is the lock this tool owns on the version `version_id`.
    pub fn is_ours_on(&self, version_id: &str) -> bool {
        self.name.eq_ignore_ascii_case(LOCK_NAME) && self.scope().eq_ignore_ascii_case(version_id)
    }

    /// Whether it applies to `resource_id`: it lives there or at a scope above it.
    pub fn covers(&self, resource_id: &str) -> bool {
        let scope = self.scope().trim_end_matches('/').to_ascii_lowercase();
        let id = resource_id.to_ascii_lowercase();
        id == scope || id.starts_with(&format!("{scope}/"))
    }

    /// "`name` (CanNotDelete) at `scope`", for reasons and reports.
    pub fn describe(&self) -> String {
        format!(
            "{} ({}) at {}",
            self.name,
            self.level.as_str(),
            self.scope()
        )
    }
}

/// The notes of this tool's lock: who holds it and how to release it (Azure allows 512
/// characters; this stays well under).
pub fn notes(definition: &str, version: &str) -> String {
    format!(
        "stemcell-gallery holds references on {definition}/{version} (its sentinel is in stemcell_references) and lifts this lock itself when the last goes. Release: stemcell-gallery delete --name <stemcell> --version {version} (or references prune --apply). Removed by hand, it comes back on the next write or cleanup."
    )
}

/// Whether this tool holds anything on the version: its sentinel is in `stemcell_references`.
pub fn is_held(v: &ImageVersion) -> bool {
    tags::sentinel_in(&tags::canonical_names(&v.tags)).is_some()
}

/// Whether the Azure CPI's own CIDs (anything in `stemcell_references` besides a sentinel, or a
/// legacy `stemcell_name` CID) hold the version.
pub fn cpi_holds(v: &ImageVersion) -> bool {
    tags::sourced_references(&tags::canonical_names(&v.tags))
        .iter()
        .any(|(r, s)| {
            matches!(
                s,
                tags::Source::StemcellReferences | tags::Source::LegacyStemcellName
            ) && !r.starts_with(tags::SENTINEL_PREFIX)
        })
}

/// What the version's lock needs, given whether this tool's lock is on it: the one rule
/// [`settle`] applies and [`lock_repairs`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// Held by this tool without its lock.
    Place,
    /// Held by the Azure CPI's own CIDs alone, and still locked: the CPI's to delete.
    Lift,
}

fn change(v: &ImageVersion, ours: bool) -> Option<Change> {
    match (is_held(v), ours) {
        (true, false) => Some(Change::Place),
        (false, true) if cpi_holds(v) => Some(Change::Lift),
        _ => None,
    }
}

/// A version this call has just created holding references (its create PUT accepted, the
/// version Creating): PUT the lock at once, still under the version's lock, without listing the
/// locks first (a new version has none: a lock goes with its resource). A caller interrupted
/// before its create settles leaves a re-run that reuses the version without writing, and so
/// without settling; placed here, the version is locked all the same (the ledger simulator's
/// seeds with a crash or a failed poll after the create found it held and unlocked). The settle
/// after the create checks it again; best effort as every placement.
pub async fn place_on_create(
    api: &dyn GalleryApi,
    definition: &str,
    version: &str,
    version_tags: &std::collections::BTreeMap<String, String>,
) -> bool {
    place_early(
        api,
        definition,
        version,
        version_tags,
        "held from its create",
    )
    .await
}

/// PUT the lock of a version about to be held (`version_tags` carry the sentinel), without
/// listing first; `when` says which write it goes before, for the log.
async fn place_early(
    api: &dyn GalleryApi,
    definition: &str,
    version: &str,
    version_tags: &std::collections::BTreeMap<String, String>,
    when: &str,
) -> bool {
    let protection = api.protection();
    if !protection.on() || tags::sentinel_in(&tags::canonical_names(version_tags)).is_none() {
        return false;
    }
    match place(api, definition, version).await {
        Ok(()) => {
            tracing::info!(
                definition,
                version,
                lock = LOCK_NAME,
                "{when}: delete lock placed"
            );
            true
        }
        Err(e) => {
            if !protection.note_denied(&e) {
                tracing::warn!(definition, version, error = %e, "{when}: could not place the delete lock; the settle after the write tries again");
            }
            false
        }
    }
}

/// Before a tags write that makes `v` held (`new_tags` carry the sentinel, its tags now do not):
/// PUT the lock first, without listing (a version not held carries none of ours, or one the
/// settle after the write finds in line). Best effort: the settle after the write tries again.
pub async fn place_before_hold(
    api: &dyn GalleryApi,
    v: &ImageVersion,
    new_tags: &std::collections::BTreeMap<String, String>,
) -> bool {
    if is_held(v) {
        return false;
    }
    place_early(
        api,
        &v.definition,
        &v.version,
        new_tags,
        "held by this tag write (locked first)",
    )
    .await
}

/// PUT this tool's lock on the version.
async fn place(api: &dyn GalleryApi, definition: &str, version: &str) -> Result<()> {
    api.put_version_lock(definition, version, LOCK_NAME, &notes(definition, version))
        .await
}

/// The locks of `locks` that apply to `version_id` and are not this tool's own lock on it.
pub fn others<'a>(locks: &'a [ManagementLock], version_id: &str) -> Vec<&'a ManagementLock> {
    locks
        .iter()
        .filter(|l| l.covers(version_id) && !l.is_ours_on(version_id))
        .collect()
}

/// "lock a (CanNotDelete) at …; lock b (ReadOnly) at …", the reason a version is kept.
pub fn describe_all(locks: &[&ManagementLock]) -> String {
    locks
        .iter()
        .map(|l| l.describe())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Whether held versions are protected in this run: on unless configured off, and off for the
/// rest of the run once Azure refused the identity the lock actions (said once).
#[derive(Debug)]
pub struct Protection {
    configured: bool,
    denied: AtomicBool,
}

impl Default for Protection {
    fn default() -> Self {
        Self::new(true)
    }
}

/// The permissions the lock needs, for messages.
pub const LOCK_ACTIONS: &str =
    "Microsoft.Authorization/locks/read, Microsoft.Authorization/locks/write and Microsoft.Authorization/locks/delete";

impl Protection {
    /// `configured`: the `protect_held_versions` setting (true by default).
    pub fn new(configured: bool) -> Self {
        Self {
            configured,
            denied: AtomicBool::new(false),
        }
    }

    /// Whether to read, place and lift locks now.
    pub fn on(&self) -> bool {
        self.configured && !self.denied.load(Ordering::Relaxed)
    }

    pub fn configured(&self) -> bool {
        self.configured
    }

    /// Whether an error of a lock request is Azure refusing the identity the lock actions: then
    /// protection is off for the rest of the run, said once. Returns whether it was.
    fn note_denied(&self, e: &Error) -> bool {
        if !is_denied(e) {
            return false;
        }
        if !self.denied.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "held versions are not protected by a delete lock in this run: the identity may not manage management locks ({e}). Clients that do not read the reference ledger (Azure CPI v52.0.1–v53.0.0, the portal, az, Terraform) can delete a version this tool still holds. Remedy: grant {LOCK_ACTIONS} (deploy/azure/role-definition.json has them), or set protect_held_versions = false to turn protection off on purpose"
            );
        }
        true
    }
}

/// A 403 from Azure: the identity lacks the action (ARM's `AuthorizationFailed`).
pub fn is_denied(e: &Error) -> bool {
    e.azure_answer().is_some_and(|a| a.status == 403)
}

/// Bring the lock in line with the version just verified under its lock: place it when the
/// version is held and has none, lift it when the Azure CPI's own CIDs alone hold the version.
/// Best effort: the references are durable already, and a failure here is repaired by the next
/// write or `cleanup` (it is logged, never returned). `true` when it placed or lifted the lock.
pub async fn settle(api: &dyn GalleryApi, v: &ImageVersion) -> bool {
    let protection = api.protection();
    if !protection.on() {
        return false;
    }
    if !is_held(v) && !cpi_holds(v) {
        // Nothing holds it: its delete (which lifts the lock itself) follows, or cleanup's.
        return false;
    }
    let r = async {
        let locks = api.version_locks(&v.definition, &v.version).await?;
        let ours = locks.iter().any(|l| l.is_ours_on(&v.id));
        match change(v, ours) {
            Some(Change::Place) => {
                place(api, &v.definition, &v.version).await?;
                tracing::info!(version = %v.id, lock = LOCK_NAME, "held: delete lock placed");
            }
            Some(Change::Lift) => {
                api.delete_version_lock(&v.definition, &v.version, LOCK_NAME)
                    .await?;
                tracing::info!(version = %v.id, lock = LOCK_NAME, "only the Azure CPI's CIDs hold it now: delete lock lifted, the version is the CPI's to delete");
            }
            None => return Ok(false),
        }
        Ok::<_, Error>(true)
    }
    .await;
    r.unwrap_or_else(|e| {
        if !protection.note_denied(&e) {
            tracing::warn!(version = %v.id, error = %e, "could not bring the version's delete lock in line with its references; the next write or cleanup does");
        }
        false
    })
}

/// Every lock at the gallery, above it and below it; `None` when protection is off or the list
/// could not be read (said in the log).
pub async fn gallery_locks(api: &dyn GalleryApi) -> Option<Vec<ManagementLock>> {
    let protection = api.protection();
    if !protection.on() {
        return None;
    }
    match api.gallery_locks().await {
        Ok(l) => Some(l),
        Err(e) => {
            if !protection.note_denied(&e) {
                tracing::warn!(error = %e, "could not list the gallery's management locks; a version under a lock is still kept when Azure refuses its DELETE");
            }
            None
        }
    }
}

/// The ids of the versions whose lock is out of line with their references: held by this tool
/// without its lock, or held by the Azure CPI alone and still carrying it (what [`settle`]
/// changes).
pub fn lock_repairs(versions: &[ImageVersion], locks: &[ManagementLock]) -> Vec<String> {
    versions
        .iter()
        .filter(|v| change(v, locks.iter().any(|l| l.is_ours_on(&v.id))).is_some())
        .map(|v| v.id.clone())
        .collect()
}

/// What [`lift_for_delete`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Lift {
    /// Nothing of ours to lift (or protection is off): go on.
    Nothing,
    /// This tool's lock was lifted: put it back if the DELETE does not go through.
    Lifted,
    /// Locks this tool does not own apply: keep the version (their description).
    Others(String),
}

/// Right before a guarded DELETE (under the version's lock, after the last re-check): keep the
/// version when another's lock applies, else lift ours. Lifting refused (or any lock request
/// failing) is an error: nothing is deleted.
pub async fn lift_for_delete(api: &dyn GalleryApi, v: &ImageVersion) -> Result<Lift> {
    let protection = api.protection();
    if !protection.on() {
        return Ok(Lift::Nothing);
    }
    let locks = match api.version_locks(&v.definition, &v.version).await {
        Ok(l) => l,
        // Without the permission the DELETE goes as before: Azure still refuses it under a
        // lock (409 ScopeLocked), which keeps the version.
        Err(e) if protection.note_denied(&e) => return Ok(Lift::Nothing),
        Err(e) => return Err(e),
    };
    let others = others(&locks, &v.id);
    if !others.is_empty() {
        return Ok(Lift::Others(describe_all(&others)));
    }
    if !locks.iter().any(|l| l.is_ours_on(&v.id)) {
        return Ok(Lift::Nothing);
    }
    match api
        .delete_version_lock(&v.definition, &v.version, LOCK_NAME)
        .await
    {
        Ok(()) => {
            tracing::info!(version = %v.id, lock = LOCK_NAME, "delete lock lifted for this tool's own delete");
            Ok(Lift::Lifted)
        }
        Err(e) if protection.note_denied(&e) => Ok(Lift::Nothing),
        Err(e) => Err(e),
    }
}

/// The DELETE after [`lift_for_delete`] did not go through and the version may still be there:
/// put the lock back (best effort; the next write or cleanup repairs it otherwise).
pub async fn put_back(api: &dyn GalleryApi, v: &ImageVersion) {
    let protection = api.protection();
    match place(api, &v.definition, &v.version).await {
        Ok(()) => {
            tracing::info!(version = %v.id, lock = LOCK_NAME, "the delete did not go through: delete lock put back")
        }
        // Gone meanwhile after all: nothing to protect.
        Err(e) if e.is_not_found() => {}
        Err(e) => {
            if !protection.note_denied(&e) {
                tracing::warn!(version = %v.id, error = %e, "the delete did not go through and its delete lock could not be put back; the next write or cleanup does");
            }
        }
    }
}

#[cfg(test)]
mod tests;
