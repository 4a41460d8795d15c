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
    let handle = emulator::start(emulator::Options {
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
