//! `lookup`: print one version; exit 3 when it does not exist.

use clap::Args;

use super::connect::connect;
use super::target::{sourced_with_holders, version_json_with, StemcellSelector};
use super::{GlobalArgs, Report};
use crate::app::inspect::{Absence, Looked, Lookup};
use crate::error::{Coded, Exit};

#[derive(Debug, Args)]
pub struct LookupArgs {
    #[command(flatten)]
    pub stemcell: StemcellSelector,
    /// Find the version a stemcell CID refers to (through its tags, as the Azure CPI does).
    #[arg(long, value_name = "CID", conflicts_with_all = ["name", "version"])]
    pub cid: Option<String>,
}

pub async fn run(global: &GlobalArgs, args: LookupArgs) -> anyhow::Result<Report> {
    if let Some(cid) = &args.cid {
        crate::gallery::tags::validate_reference(cid)
            .map_err(|e| Coded::new(Exit::Usage, e.to_string()))?;
    }
    let conn = connect(global)?;
    let (request, mut what) = if let Some(cid) = &args.cid {
        (
            Lookup::Cid(cid.clone()),
            format!("no gallery version refers to {cid}"),
        )
    } else {
        let sel = args.stemcell.resolve_named(
            conn.settings.create_env_definition_suffix(),
            "name the version: --name N --version V, or --cid CID",
        )?;
        let key = sel.key.to_string();
        let what = format!(
            "gallery version {}/{}/{key} does not exist",
            conn.settings.gallery, sel.definition
        );
        (
            Lookup::Version {
                definition: sel.definition,
                key,
            },
            what,
        )
    };
    // The resolved gallery (flag, environment or config file), not only the --gallery flag.
    let gallery = conn.settings.gallery.clone();
    let found = match crate::app::inspect::lookup(&conn, request).await? {
        Looked::Found(found) => Some(*found),
        Looked::Absent { soft_deleted } => {
            if let Some(a) = soft_deleted {
                what.push_str(&soft_deleted_text(&a));
            }
            None
        }
    };
    match found {
        Some((v, record)) => {
            let doc = version_json_with(&gallery, &v, record.as_ref());
            // A version `migrate` made knows its VHD's content digest, not its image's.
            let vhd = v
                .tags
                .get(crate::gallery::tags::VHD_CONTENT)
                .map(|d| format!("\n  vhd_content: {d} (migrated from a pre-gallery blob)"))
                .unwrap_or_default();
            let human = format!(
                "{}/{} {} {}\n  id: {}\n  image_sha256: {}{vhd}\n  references: {}\n  source: {}",
                v.definition,
                v.version,
                v.tags
                    .get(crate::gallery::tags::MODE)
                    .map(String::as_str)
                    .unwrap_or("unknown"),
                v.provisioning_state,
                v.id,
                v.tags
                    .get(crate::gallery::tags::IMAGE_SHA256)
                    .map(String::as_str)
                    .unwrap_or("-"),
                references_by_source(&sourced_with_holders(&v, record.as_ref())),
                crate::redact::opt_uri(v.source_uri.as_deref()).unwrap_or_else(|| "-".into())
            );
            Ok(Report::new(doc, human))
        }
        None => Err(Coded::new(Exit::NotFound, what).into()),
    }
}

/// `a, b (azure-cpi, stemcell_references); c [held by director:1b4f…] (stemcell-gallery,
/// sg_overflow_refs_*)`, or `-`.
fn references_by_source(
    sourced: &[(String, &'static str, &'static str, Option<String>)],
) -> String {
    let mut groups: Vec<((&str, &str), Vec<String>)> = Vec::new();
    for (r, tag, by, holder) in sourced {
        let shown = match holder {
            Some(h) => format!("{r} [held by {h}]"),
            None => r.clone(),
        };
        match groups.iter_mut().find(|(k, _)| *k == (*by, *tag)) {
            Some((_, refs)) => refs.push(shown),
            None => groups.push(((by, tag), vec![shown])),
        }
    }
    if groups.is_empty() {
        return "-".into();
    }
    groups
        .iter()
        .map(|((by, tag), refs)| format!("{} ({by}, {tag})", refs.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// For an absent version whose name is soft-deleted: until when it can be restored, how, and
/// which consumers still use it (they name it or run it; a soft-deleted version is never
/// `latest`). Informative: what could not be read is left out.
fn soft_deleted_text(a: &Absence) -> String {
    use crate::gallery::lifecycle::until_rfc3339;
    let until = until_rfc3339(a.restorable_until).unwrap_or_else(|| "unknown".into());
    let mut text = format!(
        ": it is soft-deleted, restorable until {until} (`stemcell-gallery restore` with the same flags brings it back)"
    );
    match &a.users {
        Some(users) if users.is_empty() => text.push_str("; no consumer names or runs it"),
        Some(users) => text.push_str(&format!(
            "; still used by {} (they name or run it, until {})",
            users
                .iter()
                .map(|c| c.id.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            until_rfc3339(a.consumable_until).unwrap_or_else(|| "unknown".into())
        )),
        None => {}
    }
    text
}
