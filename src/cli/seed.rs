//! `seed STEMCELL.tgz`: verify, upload (sparse, parallel), ensure the gallery version, then wait
//! for replication to every target region. Safe to re-run: a complete blob of the same image is
//! reused (nothing sent), a partial one left by an interrupted run is deleted and the upload starts
//! over (an interrupted upload is not resumed from the pages it had written).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::json;

use super::{GlobalArgs, OutputFormat, Report};
use crate::app::publish::{seed, PublishOptions, Published, RecordReference, Source};
use crate::config::Settings;
use crate::error::{Coded, Exit};
use crate::gallery::blob_store::Progress;
use crate::gallery::model::{ImageVersion, TargetRegion};
use crate::gallery::service::Mode;
use crate::names::STEMCELL_CONTAINER;

#[derive(Debug, Args)]
pub struct SeedArgs {
    /// The stemcell tarball to publish.
    #[arg(value_name = "STEMCELL.tgz")]
    pub stemcell: PathBuf,
    /// Storage account name; the blob endpoint becomes https://NAME.blob.<cloud suffix> unless
    /// --blob-endpoint is given.
    #[arg(long, value_name = "NAME")]
    pub storage_account: Option<String>,
    /// Blob container for the VHD (the Azure CPI's is `stemcell`).
    #[arg(long, value_name = "NAME", default_value = STEMCELL_CONTAINER, value_parser = parse_container)]
    pub container: String,
    /// Replicate to this region: NAME[=REPLICAS[=STORAGE_TYPE]] (Standard_LRS, Standard_ZRS,
    /// Premium_LRS); repeatable. Default: the gallery's location.
    #[arg(long = "target-region", value_name = "NAME[=REPLICAS[=STORAGE_TYPE]]", value_parser = parse_target_region)]
    pub target_regions: Vec<TargetRegion>,
    /// Publish for `bosh create-env` (to the `<definition>-create-env` image definition).
    #[arg(long)]
    pub create_env: bool,
    /// Reference to record on the version (default: none, so a version nobody adopts stays an
    /// orphan for cleanup; a director's `create_stemcell` records its own CID).
    #[arg(long, value_name = "REF")]
    pub reference: Option<String>,
    /// Who holds --reference (an environment, a pipeline, a director UUID): shown by `lookup`
    /// and `list`; `references prune` keeps a holder's references unless its stemcell list is
    /// given.
    #[arg(long, value_name = "NAME", requires = "reference", value_parser = parse_holder)]
    pub holder: Option<String>,
    /// Adopt an existing version without image_sha256 (made by Azure CPI v52.0.1-v53.0.0) whose
    /// source blob is gone or unreadable, without proof of its content: this stemcell's
    /// image_sha256 is recorded on it. Without this flag such a version is adopted only when
    /// its source blob holds this stemcell's VHD.
    #[arg(long)]
    pub adopt_unverified: bool,
    /// Put Page requests in flight.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub concurrency: u16,
    /// Replica count of the version (per region unless a region sets its own), 1..=100.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100))]
    pub replicas: Option<u32>,
    #[command(flatten)]
    pub safeguards: SafeguardArgs,
}

/// `--end-of-life` and `--block-deletion-before-end-of-life`, on `seed` and `ensure`; over the
/// configured `end_of_life` / `block_deletion_before_end_of_life`.
#[derive(Debug, Clone, Default, Args)]
pub struct SafeguardArgs {
    /// End of life of a version this run creates: a date (2027-06-30), an RFC 3339 date-time, or
    /// a span after publishing (180days). Informational unless
    /// --block-deletion-before-end-of-life.
    #[arg(long, value_name = "WHEN", value_parser = parse_end_of_life)]
    pub end_of_life: Option<crate::safeguards::EndOfLife>,
    /// Ask Azure to refuse deletion of a version this run creates before its end of life (needs
    /// an end of life). cleanup, delete and the CPI then keep it and say until when; this tool
    /// never lifts the block.
    #[arg(long)]
    pub block_deletion_before_end_of_life: bool,
}

fn parse_end_of_life(s: &str) -> Result<crate::safeguards::EndOfLife, String> {
    s.parse()
}

impl SafeguardArgs {
    /// The flags over the configured guards, checked: a past end of life, or a block with
    /// none, is a usage error before anything is read or written.
    pub fn over(
        &self,
        configured: crate::safeguards::Safeguards,
    ) -> Result<crate::safeguards::Safeguards, Coded> {
        let s = crate::safeguards::Safeguards {
            end_of_life: self.end_of_life.or(configured.end_of_life),
            block_deletion_before_end_of_life: self.block_deletion_before_end_of_life
                || configured.block_deletion_before_end_of_life,
        };
        s.check(time::OffsetDateTime::now_utc())
            .map_err(|m| Coded::new(Exit::Usage, m))?;
        Ok(s)
    }
}

/// `--holder`: a label the reference record keeps (`gallery::record::holder_label`).
pub fn parse_holder(s: &str) -> Result<String, String> {
    crate::gallery::record::holder_label(s)
}

const STORAGE_TYPES: [&str; 3] = ["Standard_LRS", "Standard_ZRS", "Premium_LRS"];
const MIB: f64 = 1024.0 * 1024.0;

/// Blob container names: 3 to 63 lower-case letters, digits and single hyphens, starting and
/// ending with a letter or digit (checked here, so nothing is sent for a name storage refuses).
pub fn parse_container(value: &str) -> Result<String, String> {
    let ok = (3..=63).contains(&value.len())
        && value
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-')
        && !value.contains("--");
    if ok {
        Ok(value.to_string())
    } else {
        Err(format!(
            "{value:?} is not a blob container name: use 3 to 63 lower-case letters, digits and single hyphens, starting and ending with a letter or digit"
        ))
    }
}

/// `NAME[=REPLICAS[=STORAGE_TYPE]]`.
pub fn parse_target_region(value: &str) -> Result<TargetRegion, String> {
    let mut parts = value.split('=');
    let name = parts.next().unwrap_or_default().trim();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ' ')
    {
        return Err(format!(
            "{value:?}: the region name must be an Azure region such as westeurope (form NAME[=REPLICAS[=STORAGE_TYPE]])"
        ));
    }
    let replicas = match parts.next() {
        None => None,
        Some(r) => match r.trim().parse::<u32>() {
            Ok(n) if (1..=100).contains(&n) => Some(n),
            _ => {
                return Err(format!(
                    "{value:?}: replicas must be a whole number from 1 to 100, not {r:?}"
                ))
            }
        },
    };
    let storage_account_type = match parts.next() {
        None => None,
        Some(t) => match STORAGE_TYPES
            .iter()
            .find(|s| s.eq_ignore_ascii_case(t.trim()))
        {
            Some(s) => Some(s.to_string()),
            None => {
                return Err(format!(
                    "{value:?}: storage type must be one of {}, not {t:?}",
                    STORAGE_TYPES.join(", ")
                ))
            }
        },
    };
    if parts.next().is_some() {
        return Err(format!(
            "{value:?}: too many `=`; the form is NAME[=REPLICAS[=STORAGE_TYPE]]"
        ));
    }
    Ok(TargetRegion {
        name: name.to_string(),
        replicas,
        storage_account_type,
        exclude_from_latest: None,
    })
}

/// Two `--target-region`s naming one region (in any casing or spelling: `westeurope` and
/// `West Europe`): Azure refuses the version with 400 "Duplicate regions are not allowed"
/// (REFERENCE.md "Regions") — after the whole VHD was uploaded. Refuse before.
pub fn check_distinct_regions(regions: &[TargetRegion]) -> Result<(), String> {
    use crate::gallery::model::region_key;
    for (i, r) in regions.iter().enumerate() {
        if let Some(first) = regions[..i]
            .iter()
            .find(|o| region_key(&o.name) == region_key(&r.name))
        {
            return Err(format!(
                "--target-region {:?} names the same region as {:?}; give each region once (with its replica count and storage type)",
                r.name, first.name
            ));
        }
    }
    Ok(())
}

pub async fn run(global: &GlobalArgs, args: SeedArgs) -> anyhow::Result<Report> {
    // A usage error (exit 2) like delete's and lookup's, before anything is read or sent.
    if let Some(r) = &args.reference {
        crate::gallery::tags::validate_reference(r)
            .map_err(|e| Coded::new(Exit::Usage, e.to_string()))?;
    }
    check_distinct_regions(&args.target_regions).map_err(|m| Coded::new(Exit::Usage, m))?;
    // `--storage-account NAME` is the settings' storage account (the endpoint is built from it
    // and the cloud's storage suffix, and the name is checked, where every other source of it is).
    let mut flags = crate::config::ToFlags::to_flags(global);
    if flags.layer.blob_endpoint.is_none() && args.storage_account.is_some() {
        flags.layer.storage_account = args.storage_account.clone();
    }
    let conn = crate::wiring::connect(Settings::resolve(&flags)?)?;
    let safeguards = args.safeguards.over(conn.settings.safeguards)?;
    let opts = PublishOptions {
        safeguards,
        mode: if args.create_env {
            Mode::CreateEnv
        } else {
            Mode::Director
        },
        create_env_suffix: conn.settings.create_env_definition_suffix().to_string(),
        reference: match &args.reference {
            Some(r) => RecordReference::Given(r.clone()),
            None => RecordReference::Nothing,
        },
        holder: args.holder.clone(),
        target_regions: args.target_regions.clone(),
        replica_count: args.replicas.or(conn.settings.replicas),
        concurrency: usize::from(args.concurrency),
        adopt_unverified: args.adopt_unverified || conn.settings.adopt_unverified,
        progress: if global.quiet {
            Progress::None
        } else if global.output == OutputFormat::Json {
            Progress::Log {
                every: Duration::from_secs(10),
            }
        } else {
            Progress::Tty
        },
        container: args.container.clone(),
    };
    let (published, version) = seed(&conn, Source::Stemcell(args.stemcell.clone()), &opts).await?;
    let seconds = published.seconds.max(f64::EPSILON);
    Ok(render(
        &published,
        &version,
        &conn.settings.gallery,
        seconds,
    ))
}

fn render(p: &Published, v: &ImageVersion, gallery: &str, seconds: f64) -> Report {
    let mib_per_s = p.bytes_read as f64 / MIB / seconds;
    let e = &p.ensured;
    let json = json!({
        "outcome": e.outcome,
        "id": v.id,
        "gallery": gallery,
        "definition": e.definition,
        "version": v.version,
        "mode": e.mode.as_str(),
        "provisioning_state": v.provisioning_state.as_str(),
        "image_sha256": p.image_sha256,
        "cid": p.cid,
        "reference": p.reference,
        "blob_uri": crate::redact::opt_uri(p.blob_uri.as_deref()),
        "uploaded": p.uploaded,
        "bytes_read": p.bytes_read,
        "bytes_sent": p.bytes_sent,
        "zero_bytes_skipped": p.zero_bytes_skipped,
        "seconds": round3(seconds),
        "mib_per_s": round3(mib_per_s),
        "replication": v.replication.as_ref().map(|r| r.aggregated_state.clone()),
        // A version without image_sha256 adopted by this call: how its content was proven.
        "adopted": e.adopted,
    });
    let outcome = serde_json::to_value(e.outcome)
        .ok()
        .and_then(|o| o.as_str().map(String::from))
        .unwrap_or_default();
    let transfer = if p.uploaded {
        format!(
            "uploaded {} of data, skipped {} of zeros",
            size(p.bytes_sent),
            size(p.zero_bytes_skipped)
        )
    } else {
        format!(
            "nothing uploaded (0 bytes sent): {}",
            if p.blob_name.is_some() {
                "a complete blob with the same image_sha256 was reused"
            } else {
                "the gallery already holds this content"
            }
        )
    };
    // A reuse decided from the image's digest inflates nothing: no rate to speak of.
    let rate = if p.bytes_read > 0 {
        format!(" ({mib_per_s:.0} MiB/s of root.vhd)")
    } else {
        String::new()
    };
    let human = format!(
        "{outcome} {gallery}/{}/{} ({}, {})\n  id:           {}\n  image_sha256: {}\n  source:       {}\n  cid:          {}{}\n  reference:    {}\n  transfer:     {transfer}\n  time:         {seconds:.1} s{rate}\n",
        e.definition,
        v.version,
        e.mode.as_str(),
        v.provisioning_state,
        v.id,
        p.image_sha256,
        crate::redact::opt_uri(p.blob_uri.as_deref()).unwrap_or_else(|| "unknown".into()),
        p.cid,
        // Issue 31: a CID nothing records must not pass for one a director could use.
        if p.reference.as_deref() == Some(p.cid.as_str()) {
            ""
        } else {
            " (not recorded: no version refers to it)"
        },
        p.reference.as_deref().unwrap_or("none recorded"),
    );
    let human = match &e.adopted {
        Some(a) => format!("{human}  adopted:      {}\n", a.describe(&v.id)),
        None => human,
    };
    Report::new(json, human)
}

/// Bytes for people: KiB below 1 MiB, MiB below 1 GiB, GiB above.
fn size(bytes: u64) -> String {
    let b = bytes as f64;
    if b < MIB {
        format!("{:.1} KiB", b / 1024.0)
    } else if b < 1024.0 * MIB {
        format!("{:.1} MiB", b / MIB)
    } else {
        format!("{:.2} GiB", b / MIB / 1024.0)
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_region_forms() {
        let r = parse_target_region("westeurope").unwrap();
        assert_eq!(
            (r.name.as_str(), r.replicas, r.storage_account_type),
            ("westeurope", None, None)
        );
        let r = parse_target_region("eastus=3").unwrap();
        assert_eq!(r.replicas, Some(3));
        let r = parse_target_region("eastus=2=standard_zrs").unwrap();
        assert_eq!(r.storage_account_type.as_deref(), Some("Standard_ZRS"));
    }

    /// Found by tests/integration/bad_input.rs: `--container Stemcells` or `stemcell/../x` was sent to storage.
    #[test]
    fn container_names_are_checked_before_anything_is_sent() {
        for good in ["stemcell", "abc", "a-b-1", &"a".repeat(63)] {
            assert_eq!(parse_container(good).as_deref(), Ok(good));
        }
        for bad in [
            "Stemcells",
            "stemcell/../x",
            "ab",
            "-abc",
            "abc-",
            "a--b",
            &"a".repeat(64),
        ] {
            let err = parse_container(bad).unwrap_err();
            assert!(err.contains("blob container name"), "{bad}: {err}");
        }
    }

    #[test]
    fn target_region_refusals_name_the_problem() {
        for (bad, says) in [
            ("", "region name"),
            ("eastus=0", "1 to 100"),
            ("eastus=101", "1 to 100"),
            ("eastus=x", "1 to 100"),
            ("eastus=1=Ultra_LRS", "Standard_LRS"),
            ("eastus=1=Standard_LRS=x", "too many"),
        ] {
            let err = parse_target_region(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
