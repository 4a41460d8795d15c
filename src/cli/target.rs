//! Which stemcell and definition a command means: `--name/--version` (+ generation and
//! architecture) or a manifest, and director or create-env mode. Shared by ensure, lookup, delete.

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use crate::error::{Coded, Exit};
use crate::gallery::service::{GalleryService, Mode};
use crate::stemcell::manifest::{CloudProperties, Manifest};
use crate::stemcell::version::VersionKey;

#[derive(Debug, Clone, Args)]
pub struct StemcellSelector {
    /// Stemcell name (stemcell.MF `name`, or `cloud_properties.name`).
    #[arg(long, value_name = "N")]
    pub name: Option<String>,
    /// Stemcell version (`1.506`, mapped to the gallery version `1.506.0`).
    #[arg(long, value_name = "V")]
    pub version: Option<String>,
    /// Hyper-V generation of the stemcell when given by --name (gen1 or gen2).
    #[arg(long, value_name = "GEN", default_value = "gen1")]
    pub generation: String,
    /// CPU architecture of the stemcell when given by --name (x86_64 or arm64).
    #[arg(long, value_name = "ARCH", default_value = "x86_64")]
    pub architecture: String,
    /// Use the create-env image definition (`<definition>-create-env`, or the configured
    /// create_env_suffix).
    #[arg(long)]
    pub create_env: bool,
}

/// A resolved stemcell identity.
#[derive(Debug, Clone)]
pub struct Selected {
    pub name: String,
    pub version: String,
    pub key: VersionKey,
    pub cloud: CloudProperties,
    pub mode: Mode,
    pub definition: String,
}

fn usage(msg: impl Into<String>) -> anyhow::Error {
    Coded::new(Exit::Usage, msg).into()
}

impl StemcellSelector {
    pub fn mode(&self) -> Mode {
        if self.create_env {
            Mode::CreateEnv
        } else {
            Mode::Director
        }
    }

    /// Resolve from --name/--version, or from a manifest file when given. `suffix` names the
    /// create-env definition: pass [`crate::config::Settings::create_env_definition_suffix`].
    pub fn resolve(&self, manifest: Option<&PathBuf>, suffix: &str) -> anyhow::Result<Selected> {
        self.resolve_or(
            manifest,
            suffix,
            "name the stemcell: --name N --version V (or --manifest FILE)",
        )
    }

    /// As [`Self::resolve`], for a command that takes no manifest: `missing` is the usage hint
    /// when no stemcell is named, naming only flags that command takes.
    pub fn resolve_named(&self, suffix: &str, missing: &str) -> anyhow::Result<Selected> {
        self.resolve_or(None, suffix, missing)
    }

    fn resolve_or(
        &self,
        manifest: Option<&PathBuf>,
        suffix: &str,
        missing: &str,
    ) -> anyhow::Result<Selected> {
        let (name, version, cloud) = match (manifest, &self.name, &self.version) {
            (Some(path), None, None) => {
                let bytes = std::fs::read(path).map_err(|e| {
                    anyhow::anyhow!("cannot read the manifest {}: {e}", path.display())
                })?;
                let m = Manifest::parse(&bytes)
                    .map_err(|e| anyhow::anyhow!("manifest {}: {e}", path.display()))?;
                m.require_heavy()?;
                (
                    m.name.clone(),
                    m.version.clone(),
                    m.cloud_properties.clone(),
                )
            }
            (Some(_), _, _) => {
                return Err(usage(
                    "give either --manifest or --name and --version, not both",
                ))
            }
            (None, Some(n), Some(v)) => {
                if n.trim().is_empty() {
                    return Err(usage("--name must not be empty"));
                }
                let cloud = CloudProperties::parse_json(json!({
                    "name": n,
                    "generation": self.generation,
                    "architecture": self.architecture,
                }))
                .map_err(|e| usage(e.to_string()))?;
                (n.clone(), v.clone(), cloud)
            }
            _ => return Err(usage(missing)),
        };
        let key = VersionKey::parse(&version).map_err(|e| usage(e.to_string()))?;
        let director = cloud.definition_name_for(&name);
        let mode = self.mode();
        let definition = match mode {
            Mode::Director => director,
            Mode::CreateEnv => crate::stemcell::naming::create_env_definition(&director, suffix),
        };
        validate_definition_name(&definition)?;
        Ok(Selected {
            name,
            version,
            key,
            cloud,
            mode,
            definition,
        })
    }
}

/// An image definition name Azure accepts (`names::is_definition_name`), else a usage error.
pub fn validate_definition_name(name: &str) -> anyhow::Result<()> {
    if crate::names::is_definition_name(name) {
        Ok(())
    } else {
        Err(usage(format!(
            "{name:?} cannot be an image definition name: use {}",
            crate::names::DEFINITION_NAME_RULE
        )))
    }
}

/// The JSON of a version, as every command prints it.
pub fn version_json(gallery: &str, v: &crate::gallery::ImageVersion) -> serde_json::Value {
    version_json_with(gallery, v, None)
}

/// Every reference of a version as the tool decides on it (its tags merged with its reference
/// record), with where it lives, which tool recorded it, and who holds it when the record says.
pub fn sourced_with_holders(
    v: &crate::gallery::ImageVersion,
    record: Option<&crate::gallery::record::Record>,
) -> Vec<(String, &'static str, &'static str, Option<String>)> {
    use crate::gallery::{record, tags};
    let sourced = tags::sourced_references(&tags::canonical_names(&v.tags));
    record::merged(&v.tags, record)
        .into_iter()
        .map(|r| {
            let holder = record
                .and_then(|rec| rec.entry(&r))
                .and_then(|e| e.holder.clone());
            match sourced.iter().find(|(x, _)| *x == r) {
                Some((_, src)) => (r, src.tag(), src.recorded_by(), holder),
                // Held by the record only: a late tag write erased it; the next write restores it.
                None => (r, "reference record", "stemcell-gallery", holder),
            }
        })
        .collect()
}

/// [`version_json`] with the version's reference record (who holds each reference).
pub fn version_json_with(
    gallery: &str,
    v: &crate::gallery::ImageVersion,
    record: Option<&crate::gallery::record::Record>,
) -> serde_json::Value {
    use crate::gallery::tags;
    let sourced = sourced_with_holders(v, record);
    json!({
        "id": v.id,
        "gallery": gallery,
        "definition": v.definition,
        "version": v.version,
        "mode": v.tags.get(tags::MODE).cloned().unwrap_or_else(|| "unknown".into()),
        "provisioning_state": v.provisioning_state.as_str(),
        "image_sha256": v.tags.get(tags::IMAGE_SHA256),
        "references": sourced.iter().map(|(r, ..)| r.clone()).collect::<Vec<_>>(),
        // Where each reference lives: `stemcell_references` (what plain Azure CPIs recorded and
        // resolve), this tool's overflow, or a format not yet rewritten; and who holds it (the
        // reference record's holder: `director:<uuid>` or an operator's label; null: unknown).
        "reference_sources": sourced
            .iter()
            .map(|(r, tag, by, holder)| json!({"reference": r, "tag": tag, "recorded_by": by, "holder": holder}))
            .collect::<Vec<_>>(),
        "source_uri": crate::redact::opt_uri(v.source_uri.as_deref()),
        "published_date": v.published_date.and_then(|d| d.format(&time::format_description::well_known::Rfc3339).ok()),
        "target_regions": v.target_regions.iter().map(|r| r.name.clone()).collect::<Vec<_>>(),
        "replication": v.replication.as_ref().map(|r| r.aggregated_state.clone()),
        // How many more stemcell CIDs fit before Azure's tag limits refuse a reference write.
        "reference_room": tags::reference_room(&v.tags),
    })
}

/// Same definition naming as the service, exposed for the commands.
pub fn definition_for(
    stemcell: &crate::gallery::service::StemcellImage,
    mode: Mode,
    suffix: &str,
) -> String {
    GalleryService::definition_name(stemcell, mode, suffix)
}
