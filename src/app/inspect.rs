//! The read use cases of the gallery and `restore`: what `list`, `list --soft-deleted`, `lookup`
//! and `restore` show, read through the gallery service and handed to the front to render.

use time::OffsetDateTime;

use crate::app::Context;
use crate::gallery::record::Record;
use crate::gallery::service::{Found, Restore};
use crate::gallery::{Consumer, ImageDefinition, ImageVersion, SoftDeletedVersion};

/// A definition and its versions (by version key), each with its reference record.
pub struct ListedDefinition {
    pub definition: ImageDefinition,
    pub versions: Vec<(ImageVersion, Option<Record>)>,
}

/// Every definition of the gallery with its versions, ordered by version key.
pub async fn list(ctx: &Context) -> anyhow::Result<Vec<ListedDefinition>> {
    let mut out = Vec::new();
    for (definition, mut versions) in ctx.service.list().await? {
        versions.sort_by_key(|v| semver_of(&v.version));
        let records = ctx.service.records_of(&versions).await;
        out.push(ListedDefinition {
            definition,
            versions: versions.into_iter().zip(records).collect(),
        });
    }
    Ok(out)
}

/// A soft-deleted version, with what this tool recorded for it.
pub struct SoftDeletedRow {
    pub definition: String,
    pub version: SoftDeletedVersion,
    /// Until when it can be restored (by the gallery's policy).
    pub restorable_until: Option<OffsetDateTime>,
    /// Until when a consumer that names it exactly may still use it.
    pub consumable_until: Option<OffsetDateTime>,
    /// The image's SHA-256 this tool recorded when it created it (`None`: made by another tool).
    pub image_sha256: Option<String>,
}

/// The gallery's soft-deleted versions, and whether soft delete is on.
pub struct SoftDeleted {
    pub soft_delete_on: bool,
    pub rows: Vec<SoftDeletedRow>,
}

/// Every definition's soft-deleted versions, ordered by version key.
pub async fn list_soft_deleted(ctx: &Context) -> anyhow::Result<SoftDeleted> {
    let policy = ctx.service.api().soft_delete().await?;
    let mut rows = Vec::new();
    for d in ctx.service.api().list_definitions().await? {
        let mut versions = ctx.service.soft_deleted_of(&d.name).await?;
        versions.sort_by_key(|v| semver_of(&v.version));
        for s in versions {
            let image_sha256 = ctx
                .service
                .recorded_digest(&d.name, &s.version, None)
                .await?;
            rows.push(SoftDeletedRow {
                definition: d.name.clone(),
                restorable_until: s.restorable_until(policy),
                consumable_until: s.consumable_until(policy),
                version: s,
                image_sha256,
            });
        }
    }
    Ok(SoftDeleted {
        soft_delete_on: policy.is_some(),
        rows,
    })
}

/// What `lookup` looks for.
pub enum Lookup {
    /// The version whose tags record this stemcell CID (as the Azure CPI finds it).
    Cid(String),
    /// A version by definition and key.
    Version { definition: String, key: String },
}

/// What `lookup` found.
pub enum Looked {
    /// The version, with its reference record.
    Found(Box<(ImageVersion, Option<Record>)>),
    /// No such version; `soft_deleted`: its name is soft-deleted (only looked for by version).
    Absent { soft_deleted: Option<Absence> },
}

/// An absent version whose name is soft-deleted: until when it can be restored, and who still
/// uses it. Informative: what cannot be read is `None`.
pub struct Absence {
    pub restorable_until: Option<OffsetDateTime>,
    pub consumable_until: Option<OffsetDateTime>,
    /// Consumers that name it or run it (a soft-deleted version is never `latest`).
    pub users: Option<Vec<Consumer>>,
}

/// Look a version up.
pub async fn lookup(ctx: &Context, request: Lookup) -> anyhow::Result<Looked> {
    let found = match &request {
        // On a version's tags, or in its reference record only (a late tag write erased it
        // there, and the next write puts it back).
        Lookup::Cid(cid) => match ctx.service.find_reference(cid).await? {
            None => None,
            Some(Found::Version(v)) => Some(*v),
            Some(Found::Record { definition, key }) => {
                ctx.service.lookup(&definition, &key).await?
            }
        },
        Lookup::Version { definition, key } => ctx.service.lookup(definition, key).await?,
    };
    if let Some(v) = found {
        let record = ctx.service.record_of(&v).await;
        return Ok(Looked::Found(Box::new((v, record))));
    }
    let soft_deleted = match &request {
        Lookup::Cid(_) => None,
        Lookup::Version { definition, key } => absence(ctx, definition, key).await,
    };
    Ok(Looked::Absent { soft_deleted })
}

async fn absence(ctx: &Context, definition: &str, key: &str) -> Option<Absence> {
    let sd = match ctx.service.soft_deleted_of(definition).await {
        Ok(all) => all
            .into_iter()
            .find(|s| s.version.eq_ignore_ascii_case(key))?,
        Err(e) => {
            tracing::debug!("cannot list the soft-deleted versions: {e}");
            return None;
        }
    };
    let policy = ctx.service.api().soft_delete().await.unwrap_or(None);
    let users = match ctx.service.soft_deleted_users(&sd).await {
        Ok(users) => Some(users),
        Err(e) => {
            tracing::debug!("cannot tell which consumers use it: {e}");
            None
        }
    };
    Some(Absence {
        restorable_until: sd.restorable_until(policy),
        consumable_until: sd.consumable_until(policy),
        users,
    })
}

/// What `restore` did.
pub enum Restored {
    /// Restored by this call (`users`: consumers that kept using it while it was soft-deleted;
    /// `None` when that could not be read) or already there (`users` `None`).
    Version {
        version: Box<ImageVersion>,
        record: Option<Box<Record>>,
        restored: bool,
        users: Option<Vec<Consumer>>,
    },
    /// Neither soft-deleted nor there: the definition's restorable versions, each with until
    /// when.
    NothingRestorable {
        restorable: Vec<(SoftDeletedVersion, Option<OffsetDateTime>)>,
    },
}

/// Bring back the soft-deleted version `definition`/`key`.
pub async fn restore(ctx: &Context, definition: &str, key: &str) -> anyhow::Result<Restored> {
    let (version, was) = match ctx.service.restore(definition, key).await? {
        Restore::Restored { version, was } => (version, Some(was)),
        Restore::Present(v) => (v, None),
        Restore::NothingRestorable { restorable } => {
            let policy = ctx.service.api().soft_delete().await.unwrap_or(None);
            return Ok(Restored::NothingRestorable {
                restorable: restorable
                    .into_iter()
                    .map(|s| {
                        let until = s.restorable_until(policy);
                        (s, until)
                    })
                    .collect(),
            });
        }
    };
    let record = ctx.service.record_of(&version).await;
    // Who kept using it while it was soft-deleted: consumers that name it or run it (never
    // through `latest`). Informative: a scope that cannot be read whole is said, not fatal.
    let users = match &was {
        Some(sd) => match ctx.service.soft_deleted_users(sd).await {
            Ok(users) => Some(users),
            Err(e) => {
                tracing::warn!("cannot tell which consumers still used it: {e}");
                None
            }
        },
        None => None,
    };
    Ok(Restored::Version {
        version: Box::new(version),
        record: record.map(Box::new),
        restored: was.is_some(),
        users,
    })
}

fn semver_of(v: &str) -> Option<semver::Version> {
    semver::Version::parse(v).ok()
}

/// The stemcell CID the delegate Azure CPI's `create_vm` resolves to the version holding `cid`
/// (`cid` itself, or the version's sentinel when the reference lives in the overflow); `None`
/// when no version records `cid`.
pub async fn delegate_cid(ctx: &Context, cid: &str) -> anyhow::Result<Option<String>> {
    Ok(ctx.service.cpi_resolvable(cid).await?)
}
