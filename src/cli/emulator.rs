//! `emulator`: serve the local Azure emulator until SIGINT/SIGTERM.
//!
//! When both listeners are ready it prints one JSON line on stdout (flushed), for scripts and
//! other processes to wait for:
//! `{"arm": "http://127.0.0.1:PORT", "blob": "http://127.0.0.1:PORT2/devstoreaccount1", "account": "devstoreaccount1", "pid": N}`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use super::{GlobalArgs, Report};
use crate::emulator;

#[derive(Debug, Args)]
pub struct EmulatorArgs {
    /// Address of the ARM endpoint (port 0 picks a free port).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Address of the blob endpoint (default: the ARM address's IP, a free port).
    #[arg(long, value_name = "ADDR")]
    pub blob_listen: Option<SocketAddr>,
    /// Keep the state in this JSON file (loaded at start, written on change).
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// Seed resources (VMs, scale sets, disks, galleries) from this JSON world file.
    #[arg(long, value_name = "FILE")]
    pub world: Option<PathBuf>,
    /// Status polls a gallery operation takes to complete.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub polls_to_complete: u32,
    /// Items per page of ARM lists.
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub page_size: u64,
    /// Enforce this Azure custom role (JSON, e.g. deploy/azure/role-definition.json) on the tool's
    /// identity (the development token and key): a request outside it gets 403
    /// AuthorizationFailed. Other bearer tokens act as the subscription's Owner.
    #[arg(long, value_name = "FILE")]
    pub role: Option<PathBuf>,
    /// Where the --role is assigned (repeatable), e.g. /subscriptions/S/resourceGroups/RG; default:
    /// every scope. Outside these scopes requests are refused, and subscription-wide lists show
    /// only what lies under them, as Azure does for a role assigned below the listed scope.
    #[arg(long, value_name = "SCOPE", requires = "role")]
    pub role_scope: Vec<String>,
    /// How long operations take: instant (default: as fast as clients poll), or azure (Azure's
    /// recorded durations, Retry-After, delete lag and page-blob throttling; see --time-scale).
    #[arg(long, value_name = "instant|azure", env = TIMING_ENV)]
    pub timing: Option<String>,
    /// Divide the azure timing's durations by N (and multiply its rates by N), e.g. 60.
    #[arg(long, value_name = "N", env = TIME_SCALE_ENV)]
    pub time_scale: Option<f64>,
}

/// Environment fallback of `--timing`, also read by the global `--emulator`.
pub const TIMING_ENV: &str = "STEMCELL_GALLERY_EMULATOR_TIMING";
/// Environment fallback of `--time-scale`, also read by the global `--emulator`.
pub const TIME_SCALE_ENV: &str = "STEMCELL_GALLERY_EMULATOR_TIME_SCALE";

/// The emulator's timing from `--timing` / `--time-scale` (or their environment variables).
pub fn timing(profile: Option<&str>, scale: Option<f64>) -> anyhow::Result<emulator::Timing> {
    let profile: emulator::TimingProfile = match profile {
        None => emulator::TimingProfile::Instant,
        Some(p) => p.parse().map_err(anyhow::Error::msg)?,
    };
    if scale.is_some() && profile == emulator::TimingProfile::Instant {
        anyhow::bail!("--time-scale ({TIME_SCALE_ENV}) needs --timing azure ({TIMING_ENV}=azure)");
    }
    emulator::Timing::of(profile, scale.unwrap_or(1.0)).map_err(anyhow::Error::msg)
}

/// [`timing`] from the environment alone (for the global `--emulator`).
pub fn timing_from_env() -> anyhow::Result<emulator::Timing> {
    let profile = std::env::var(TIMING_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty());
    let scale =
        match std::env::var(TIME_SCALE_ENV) {
            Ok(v) if !v.trim().is_empty() => Some(v.trim().parse::<f64>().map_err(|_| {
                anyhow::anyhow!("{TIME_SCALE_ENV}={v:?} is not a number (e.g. 60)")
            })?),
            _ => None,
        };
    timing(profile.as_deref(), scale)
}

pub async fn run(_global: &GlobalArgs, args: EmulatorArgs) -> anyhow::Result<Report> {
    let world = args
        .world
        .as_deref()
        .map(emulator::World::load)
        .transpose()?;
    let role = args
        .role
        .as_deref()
        .map(emulator::Role::load)
        .transpose()?
        .map(|r| r.assigned_at(&args.role_scope));
    let timing = timing(args.timing.as_deref(), args.time_scale)?;
    let handle = emulator::start(emulator::Options {
        timing,
        listen: args.listen,
        blob_listen: args.blob_listen,
        state_file: args.state.clone(),
        world,
        polls_to_complete: args.polls_to_complete,
        page_size: usize::try_from(args.page_size).unwrap_or(usize::MAX),
        role,
        ..Default::default()
    })
    .await?;
    let ready = serde_json::json!({
        "arm": handle.arm,
        "blob": handle.blob,
        "account": crate::config::DEV_ACCOUNT,
        "pid": std::process::id(),
        "timing": timing.profile.to_string(),
        "time_scale": timing.time_scale,
    });
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{ready}")?;
        out.flush()?;
    }
    tracing::info!(arm = %handle.arm, blob = %handle.blob, "emulator ready");
    wait_for_signal().await?;
    tracing::info!("emulator stopping");
    handle.shutdown().await?;
    Ok(Report::new(serde_json::json!({"stopped": true}), ""))
}

async fn wait_for_signal() -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await?;
    Ok(())
}
