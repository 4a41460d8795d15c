//! The commands a simulated run issues, each the real service code a command line or a CPI
//! request runs. The domain may not import the application floor (tests/integration/
//! architecture.rs), so the thin glue of three use cases is written out here, step for step as
//! the application floor does it, over the same service calls:
//!
//! - `delete --cid C` / the front's `delete_stemcell`: `app::delete::delete` with
//!   `Request::Cid` (find the version holding C on its tags or in its record, then remove C);
//! - `references hand-back --holder H --apply`: `app::references::hand_back` (every version
//!   holding H's CIDs on this tool's side, whether they fit, then `GalleryService::hand_back`);
//! - `cleanup --apply` without evidence files, no grace period and no keep-latest (every version
//!   no reference and no consumer holds is deleted): `app::cleanup::run`.
//!
//! The others are one service call each: `ensure`/`seed`/the front's `create_stemcell` are
//! `GalleryService::ensure`, `delete --reference R` is `remove_reference_observed`, `references
//! prune --apply` removes through `drop_references`, `restore` is `GalleryService::restore`.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::cleanup::evidence::{ConsumersSource, ReferencesSource};
use crate::cleanup::{collect_all, plan, Executor, Inventory, Policy, UsageSource};
use crate::error::{Class, Classified};
use crate::gallery::error::{Error, RecordError};
use crate::gallery::service::{Found, GalleryService, Removal, Restore};
use crate::gallery::tags::TagError;
use crate::gallery::{record, tags};

use super::compat;
use super::world::{ensure_request, Gallery, DEFINITION};

/// A command of the simulated run, in gallery `g`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cmd {
    /// `seed`/`ensure --reference R [--holder H]`, the front's `create_stemcell`.
    Ensure {
        g: usize,
        key: String,
        reference: String,
        holder: Option<String>,
    },
    /// `delete --reference R` on version `key`.
    DeleteRef {
        g: usize,
        key: String,
        reference: String,
    },
    /// `delete --cid C`, the front's `delete_stemcell`.
    DeleteCid { g: usize, cid: String },
    /// `references hand-back --holder H --apply`.
    HandBack { g: usize, holder: String },
    /// `references prune --apply` removing `refs` from version `key`.
    Prune {
        g: usize,
        key: String,
        refs: Vec<String>,
    },
    /// `cleanup --apply`.
    Cleanup { g: usize },
    /// `restore` of version `key`.
    Restore { g: usize, key: String },
}

impl Cmd {
    pub fn gallery(&self) -> usize {
        match self {
            Cmd::Ensure { g, .. }
            | Cmd::DeleteRef { g, .. }
            | Cmd::DeleteCid { g, .. }
            | Cmd::HandBack { g, .. }
            | Cmd::Prune { g, .. }
            | Cmd::Cleanup { g }
            | Cmd::Restore { g, .. } => *g,
        }
    }

    /// The name the statistics count it under.
    pub fn kind(&self) -> &'static str {
        match self {
            Cmd::Ensure { .. } => "ensure",
            Cmd::DeleteRef { .. } => "delete --reference",
            Cmd::DeleteCid { .. } => "delete --cid",
            Cmd::HandBack { .. } => "hand-back",
            Cmd::Prune { .. } => "prune",
            Cmd::Cleanup { .. } => "cleanup",
            Cmd::Restore { .. } => "restore",
        }
    }

    /// The references whose fate this command decides (they may or may not be there while it
    /// runs, and after it failed).
    /// Whether it removes the references it touches.
    pub fn removes(&self) -> bool {
        matches!(
            self,
            Cmd::DeleteRef { .. } | Cmd::DeleteCid { .. } | Cmd::Prune { .. }
        )
    }

    pub fn touches(&self) -> Vec<String> {
        match self {
            Cmd::Ensure { reference, .. } | Cmd::DeleteRef { reference, .. } => {
                vec![reference.clone()]
            }
            Cmd::DeleteCid { cid, .. } => vec![cid.clone()],
            Cmd::Prune { refs, .. } => refs.clone(),
            Cmd::HandBack { .. } | Cmd::Cleanup { .. } | Cmd::Restore { .. } => Vec::new(),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Cmd::Ensure {
                g,
                key,
                reference,
                holder,
            } => format!(
                "g{g} ensure {key} --reference {reference}{}",
                holder
                    .as_deref()
                    .map(|h| format!(" --holder {h}"))
                    .unwrap_or_default()
            ),
            Cmd::DeleteRef { g, key, reference } => {
                format!("g{g} delete {key} --reference {reference}")
            }
            Cmd::DeleteCid { g, cid } => format!("g{g} delete --cid {cid}"),
            Cmd::HandBack { g, holder } => {
                format!("g{g} references hand-back --holder {holder} --apply")
            }
            Cmd::Prune { g, key, refs } => {
                format!("g{g} references prune --apply ({key}: {})", refs.join(","))
            }
            Cmd::Cleanup { g } => format!("g{g} cleanup --apply"),
            Cmd::Restore { g, key } => format!("g{g} restore {key}"),
        }
    }
}

/// One version's part of a hand-back (as `app::references::HandBackEntry`).
#[derive(Debug, Clone)]
pub struct HandedBack {
    pub key: String,
    pub cids: Vec<String>,
    pub outcome: Result<Vec<String>, String>,
    /// Refused: `stemcell_references` has no room (exit 1 naming what to delete).
    pub no_room: bool,
}

/// What a command that ended without an error did.
#[derive(Debug, Clone)]
pub enum Done {
    Ensured,
    Removed(Removal),
    /// `delete --cid`: the version it was found on and what the removal did; `None`: no version
    /// records the CID (exit 3; the CPI answers `StemcellNotFound`).
    Cid(Option<(String, Removal)>),
    HandBack(Vec<HandedBack>),
    Pruned(Vec<String>),
    /// Per version key, what cleanup did.
    Cleanup(BTreeMap<String, String>),
    Restored(String),
}

/// A command's error, as the exit code and `ok_to_retry` read it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub class: Class,
    pub text: String,
    /// A reference record was refused as unusable (`RecordError::Unusable`).
    pub unusable: bool,
    /// A documented refusal a re-run repeats until an operator acts: plain CPIs filled
    /// `stemcell_references` and there is no room for the sentinel (docs/references.md "Plain
    /// CPIs keep their room").
    pub refusal: bool,
}

impl Failure {
    fn of(e: &Error) -> Self {
        let full = |t: &TagError| matches!(t, TagError::CpiTagFull { .. });
        Failure {
            class: e.class(),
            text: e.to_string(),
            unusable: matches!(e, Error::Record(RecordError::Unusable { .. })),
            refusal: match e {
                Error::NewVersionTags(t) => full(t),
                Error::VersionTags { source_error, .. } => full(source_error),
                _ => false,
            },
        }
    }
}

pub type Outcome = Result<Done, Failure>;

/// Run `cmd` in its gallery.
pub async fn run(gallery: Arc<GalleryShared>, cmd: Cmd) -> Outcome {
    let svc = &gallery.svc;
    match cmd {
        Cmd::Ensure {
            key,
            reference,
            holder,
            ..
        } => svc
            .ensure(&ensure_request(&key, &reference, holder.as_deref()))
            .await
            .map(|_| Done::Ensured)
            .map_err(|e| Failure::of(&e)),
        Cmd::DeleteRef { key, reference, .. } => svc
            .remove_reference_observed(DEFINITION, &key, Some(&reference))
            .await
            .map(|(r, _)| Done::Removed(r))
            .map_err(|e| Failure::of(&e)),
        Cmd::DeleteCid { cid, .. } => delete_cid(svc, &cid).await.map_err(|e| Failure::of(&e)),
        Cmd::HandBack { holder, .. } => hand_back(svc, &holder)
            .await
            .map(Done::HandBack)
            .map_err(|e| Failure::of(&e)),
        Cmd::Prune { key, refs, .. } => svc
            .drop_references(DEFINITION, &key, &refs)
            .await
            .map(|(_, removed)| Done::Pruned(removed))
            .map_err(|e| Failure::of(&e)),
        Cmd::Cleanup { .. } => cleanup(&gallery).await,
        Cmd::Restore { key, .. } => svc
            .restore(DEFINITION, &key)
            .await
            .map(|r| {
                Done::Restored(match r {
                    Restore::Restored { .. } => "restored".into(),
                    Restore::Present(_) => "present".into(),
                    Restore::NothingRestorable { .. } => "nothing restorable".into(),
                })
            })
            .map_err(|e| Failure::of(&e)),
    }
}

/// What a command needs of its gallery (shared with the driver).
pub struct GalleryShared {
    pub svc: Arc<GalleryService>,
    pub gref: crate::gallery::GalleryRef,
    pub locks: Arc<dyn crate::gallery::lock::Locks>,
}

impl GalleryShared {
    pub fn of(g: &Gallery) -> Arc<Self> {
        Arc::new(GalleryShared {
            svc: g.svc.clone(),
            gref: g.gref.clone(),
            locks: g.locks.clone(),
        })
    }
}

/// `app::delete::delete` with `Request::Cid`.
async fn delete_cid(svc: &GalleryService, cid: &str) -> Result<Done, Error> {
    let (definition, key) = match svc.find_reference(cid).await? {
        None => return Ok(Done::Cid(None)),
        Some(Found::Version(v)) => (v.definition, v.version),
        Some(Found::Record { definition, key }) => (definition, key),
    };
    let (removal, _) = svc
        .remove_reference_observed(&definition, &key, Some(cid))
        .await?;
    Ok(Done::Cid(Some((key, removal))))
}

/// `app::references::hand_back` with `apply`.
async fn hand_back(svc: &GalleryService, holder: &str) -> Result<Vec<HandedBack>, Error> {
    let mut versions: Vec<crate::gallery::ImageVersion> =
        svc.list().await?.into_iter().flat_map(|(_, v)| v).collect();
    versions.sort_by(|a, b| (&a.definition, &a.version).cmp(&(&b.definition, &b.version)));
    // As the app does: a record that cannot be used refuses the hand-back.
    let records = svc.records_of_checked(&versions).await?;
    let mut out = Vec::new();
    for (v, rec) in versions.iter().zip(&records) {
        let healed = record::healed(v, rec.as_ref());
        let tag_set = tags::canonical_names(&healed.tags);
        let cids: Vec<String> = tags::sourced_references(&tag_set)
            .into_iter()
            .filter(|(r, s)| *s != tags::Source::StemcellReferences && tags::is_cid(r))
            .map(|(r, _)| r)
            .filter(|r| {
                rec.as_ref()
                    .and_then(|rec| rec.entry(r))
                    .and_then(|e| e.holder.as_deref())
                    == Some(holder)
            })
            .collect();
        if cids.is_empty() {
            continue;
        }
        let fits = tags::with_references_handing_back(
            &tag_set,
            &tags::references(&tag_set),
            &tags::sentinel(&v.definition, &v.version),
            &cids,
        );
        let (outcome, no_room) = match fits {
            Err(e) => (Err(e.to_string()), true),
            Ok(_) => match svc.hand_back(&v.definition, &v.version, &cids).await {
                Ok((moved, _)) => (Ok(moved), false),
                // No room left for the sentinel beside what stays: the documented refusal.
                Err(e) => (Err(e.to_string()), Failure::of(&e).refusal),
            },
        };
        out.push(HandedBack {
            key: v.version.clone(),
            cids,
            outcome,
            no_room,
        });
    }
    Ok(out)
}

/// When cleanup runs: every version is past its grace period.
pub fn cleanup_policy() -> Policy {
    Policy {
        min_age: std::time::Duration::ZERO,
        keep_latest: 0,
        protect_tag: tags::PROTECT.to_string(),
        now: Some(time::macros::datetime!(2100-01-01 0:00 UTC)),
        create_env_suffix: crate::stemcell::naming::DEFAULT_CREATE_ENV_SUFFIX.to_string(),
    }
}

/// `app::cleanup::run` with `apply`, no evidence files, [`cleanup_policy`].
async fn cleanup(gallery: &GalleryShared) -> Outcome {
    let fail = |e: &dyn Classified, text: String| Failure {
        class: e.class(),
        unusable: text.contains("unusable"),
        refusal: false,
        text,
    };
    let api = gallery.svc.api().clone();
    let name = format!("gallery {}", gallery.gref.gallery);
    let mut inventory = Inventory::gather(api.as_ref(), &name)
        .await
        .map_err(|e| fail(&e, crate::error::error_chain(&e)))?;
    if let Some(store) = gallery.locks.records() {
        compat::read_records(&mut inventory, store, &gallery.gref)
            .await
            .map_err(|e| fail(&e, crate::error::error_chain(&e)))?;
    }
    let inventory = Arc::new(inventory);
    let policy = cleanup_policy();
    let sources: Vec<Box<dyn UsageSource>> = vec![
        Box::new(ReferencesSource::new(inventory.clone())),
        Box::new(ConsumersSource::new(api.clone())),
    ];
    let evidence = collect_all(&sources)
        .await
        .map_err(|e| fail(&e, crate::error::error_chain(&e)))?;
    let planned = plan(&inventory, &evidence, &policy);
    let executor = compat::with_locks(Executor::new(api, 2), gallery.locks.clone(), &gallery.gref);
    let applied = executor
        .apply(&inventory, &evidence, &planned, &policy)
        .await
        .map_err(|e| fail(&e, crate::error::error_chain(&e)))?;
    let versions: BTreeMap<String, String> = applied
        .results
        .iter()
        .map(|(id, o)| {
            let key = id.rsplit('/').next().unwrap_or(id).to_string();
            (key, o.describe())
        })
        .collect();
    Ok(Done::Cleanup(versions))
}
