//! `lookup`: print one version; exit 3 when it does not exist.

use clap::Args;

use super::connect::connect;
use super::target::{sourced_with_holders, version_json_with, StemcellSelector};
use super::{GlobalArgs, Report};
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
    let (found, what) = if let Some(cid) = &args.cid {
        (
            conn.service.lookup_by_reference(cid).await?,
            format!("no gallery version refers to {cid}"),
        )
    } else {
        let sel = args.stemcell.resolve_named(
            conn.settings.create_env_definition_suffix(),
            "name the version: --name N --version V, or --cid CID",
        )?;
        let key = sel.key.to_string();
        let v = conn.service.lookup(&sel.definition, &key).await?;
        let mut what = format!(
            "gallery version {}/{}/{key} does not exist",
            conn.settings.gallery, sel.definition
        );
        if v.is_none() {
            what.push_str(&soft_deleted_text(&conn, &sel, &key).await);
        }
        (v, what)
    };
    // The resolved gallery (flag, environment or config file), not only the --gallery flag.
    let gallery = conn.settings.gallery.clone();
    match found {
        Some(v) => {
            let record = conn.service.record_of(&v).await;
            let doc = version_json_with(&gallery, &v, record.as_ref());
            let human = format!(
                "{}/{} {} {}\n  id: {}\n  image_sha256: {}\n  references: {}\n  source: {}",
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

/// For a version that is absent: "" unless its name is soft-deleted, then until when it can be
/// restored, how, and which consumers still use it (they name it or run it; a soft-deleted
/// version is never `latest`). Informative: what cannot be read is left out.
async fn soft_deleted_text(
    conn: &crate::app::context::Context,
    sel: &super::target::Selected,
    key: &str,
) -> String {
    use crate::gallery::lifecycle::until_rfc3339;
    let sd = match conn.service.soft_deleted_of(&sel.definition).await {
        Ok(all) => all
            .into_iter()
            .find(|s| s.version.eq_ignore_ascii_case(key)),
        Err(e) => {
            tracing::debug!("cannot list the soft-deleted versions: {e}");
            None
        }
    };
    let Some(sd) = sd else {
        return String::new();
    };
    let policy = conn.service.api().soft_delete().await.unwrap_or(None);
    let until = until_rfc3339(sd.restorable_until(policy)).unwrap_or_else(|| "unknown".into());
    let mut text = format!(
        ": it is soft-deleted, restorable until {until} (`stemcell-gallery restore` with the same flags brings it back)"
    );
    match conn.service.soft_deleted_users(&sd).await {
        Ok(users) if users.is_empty() => text.push_str("; no consumer names or runs it"),
        Ok(users) => text.push_str(&format!(
            "; still used by {} (they name or run it, until {})",
            users
                .iter()
                .map(|c| c.id.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            until_rfc3339(sd.consumable_until(policy)).unwrap_or_else(|| "unknown".into())
        )),
        Err(e) => tracing::debug!("cannot tell which consumers use it: {e}"),
    }
    text
}
