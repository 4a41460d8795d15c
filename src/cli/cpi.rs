//! `stemcell-gallery cpi`: one BOSH CPI request on stdin, one JSON response line on stdout.
//!
//! Logs go to stderr and, for our own crate at info level, into the response's `log` too.
//! Malformed requests get an `InvalidCall` response and exit 0 (bosh reads the response, not the
//! status). Delegated requests relay the delegate's stdout and exit status unchanged.
//! `info` builds no Azure client and resolves no credential: it must start fast.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::Args;

use crate::cli::GlobalArgs;
use crate::cpi::delegate;
use crate::cpi::handler::{self, Deleted, Plan};
use crate::cpi::protocol::{self, CpiError, ErrorType, Request, Response, MAX_REQUEST_BYTES};

#[derive(Debug, Clone, Args)]
pub struct CpiArgs {
    /// The real Azure CPI (its bin/cpi): every other method, light stemcells and CIDs no gallery
    /// version records are handed to it with the same stdin bytes.
    #[arg(long, value_name = "PATH")]
    pub delegate: Option<PathBuf>,
    /// Publish every create_stemcell as a `bosh create-env` upload (the `-create-env` definition).
    #[arg(long, conflicts_with = "director")]
    pub create_env: bool,
    /// Publish every create_stemcell as a director upload, whatever the request looks like.
    #[arg(long)]
    pub director: bool,
}

impl CpiArgs {
    /// The mode forced by a flag, if any.
    pub fn forced_create_env(&self) -> Option<bool> {
        if self.create_env {
            Some(true)
        } else if self.director {
            Some(false)
        } else {
            None
        }
    }
}

/// The log lines of this request, collected for the response's `log`.
#[derive(Clone, Default)]
struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    fn text(&self) -> String {
        match self.0.lock() {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(p) => String::from_utf8_lossy(&p.into_inner()).into_owned(),
        }
    }
}

impl Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Ok(mut b) = self.0.lock() {
            b.extend_from_slice(buf);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn init_tracing(global: &GlobalArgs, buffer: LogBuffer) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::Layer as _;
    let stderr_filter = super::stderr_filter(global);
    // The response log holds what an operator reads in `bosh task --cpi`: our own info lines.
    let response_filter = EnvFilter::new("warn,stemcell_gallery=info");
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(global.color.ansi_on_stderr())
        .with_target(false)
        .with_filter(stderr_filter)
        .with_filter(tracing_subscriber::filter::filter_fn(super::loggable));
    let collected = tracing_subscriber::fmt::layer()
        .with_writer(move || buffer.clone())
        .with_ansi(false)
        .with_target(false)
        .with_filter(response_filter);
    let _ = tracing_subscriber::registry()
        .with(stderr)
        .with(collected)
        .try_init();
}

/// Serve one request; returns the process exit code.
pub fn main(global: GlobalArgs, args: CpiArgs) -> u8 {
    let buffer = LogBuffer::default();
    init_tracing(&global, buffer.clone());
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin()
        .lock()
        .take(MAX_REQUEST_BYTES as u64 + 1)
        .read_to_end(&mut input)
    {
        let err = CpiError::invalid(format!("cannot read the request from stdin: {e}"));
        return respond(Err(err), &buffer);
    }
    let request = match protocol::parse_request(&input) {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("{e}");
            return respond(Err(e), &buffer);
        }
    };
    match handler::plan(&request, args.delegate.is_some()) {
        Plan::Info => respond(Ok(handler::info()), &buffer),
        Plan::Refuse(e) => {
            tracing::error!("{e}");
            respond(Err(e), &buffer)
        }
        Plan::Delegate { reason } => run_delegate(&args, &request, &input, &reason, &buffer),
        Plan::CreateStemcell(create) => {
            let r = serve_azure(global, &args, &request, AzureWork::Create(create));
            finish(r, &args, &request, &input, &buffer)
        }
        Plan::DeleteStemcell { cid } => {
            let r = serve_azure(global, &args, &request, AzureWork::Delete(cid));
            finish(r, &args, &request, &input, &buffer)
        }
        Plan::CreateVm { stemcell_cid } => {
            let r = serve_azure(
                global,
                &args,
                &request,
                AzureWork::CreateVm {
                    stemcell_cid,
                    input: input.clone(),
                },
            );
            finish(r, &args, &request, &input, &buffer)
        }
    }
}

enum AzureWork {
    Create(Box<handler::CreateArgs>),
    Delete(String),
    CreateVm {
        stemcell_cid: String,
        input: Vec<u8>,
    },
}

enum Served {
    Answer(serde_json::Value),
    Delegate(String),
    /// Delegate these bytes instead of the request as read.
    DelegateRewritten {
        input: Vec<u8>,
        reason: String,
    },
}

/// Build the runtime and the clients (only the stemcell methods need them), then serve.
fn serve_azure(
    mut global: GlobalArgs,
    args: &CpiArgs,
    request: &Request,
    work: AzureWork,
) -> Result<Served, CpiError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| {
            CpiError::new(
                ErrorType::CloudError,
                format!("cannot start the async runtime: {e}"),
                true,
            )
        })?;
    runtime.block_on(async move {
        let _emulator = crate::cli::embedded::apply(&mut global)
            .await
            .map_err(|e| handler::cloud_error("cannot start the in-process emulator", &e))?;
        let conn = match crate::cli::connect::connect_for_request(&global, &request.context) {
            Ok(conn) => conn,
            // A front with no gallery configured has recorded no reference: create_vm's CID is
            // the delegate's as it stands.
            Err(e) if matches!(work, AzureWork::CreateVm { .. }) => {
                tracing::warn!("create_vm: the stemcell CID is passed on unchanged, because stemcell-gallery is not configured: {e:#}");
                return Ok(Served::Delegate("create_vm is not a stemcell method".into()));
            }
            Err(e) => return Err(handler::cloud_error("stemcell-gallery is not configured", &e)),
        };
        match work {
            AzureWork::Create(create) => crate::cpi::create::create_stemcell(
                &conn,
                *create,
                &request.context,
                args.forced_create_env(),
                &|k| std::env::var(k).ok(),
            )
            .await
            .map(Served::Answer),
            AzureWork::Delete(cid) => {
                match handler::delete_stemcell(&conn, &cid, args.delegate.is_some()).await? {
                    Deleted::Done(_) => Ok(Served::Answer(serde_json::Value::Null)),
                    Deleted::NotOurs => Ok(Served::Delegate(format!(
                        "no gallery version records stemcell {cid}"
                    ))),
                }
            }
            AzureWork::CreateVm {
                stemcell_cid,
                input,
            } => match handler::create_vm_request(&conn, &input, &stemcell_cid).await? {
                Some(input) => Ok(Served::DelegateRewritten {
                    input,
                    reason: "create_vm is a VM method; its stemcell CID is translated".into(),
                }),
                None => Ok(Served::Delegate("create_vm is not a stemcell method".into())),
            },
        }
    })
}

fn finish(
    r: Result<Served, CpiError>,
    args: &CpiArgs,
    request: &Request,
    input: &[u8],
    buffer: &LogBuffer,
) -> u8 {
    match r {
        Ok(Served::Answer(v)) => respond(Ok(v), buffer),
        Ok(Served::Delegate(reason)) => run_delegate(args, request, input, &reason, buffer),
        Ok(Served::DelegateRewritten { input, reason }) => {
            run_delegate(args, request, &input, &reason, buffer)
        }
        Err(e) => {
            tracing::error!("{e}");
            respond(Err(e), buffer)
        }
    }
}

fn run_delegate(
    args: &CpiArgs,
    request: &Request,
    input: &[u8],
    reason: &str,
    buffer: &LogBuffer,
) -> u8 {
    let Some(path) = &args.delegate else {
        // plan() only delegates with --delegate; answer rather than panic if that ever changes.
        let e = CpiError::new(
            ErrorType::NotImplemented,
            format!(
                "{} needs a delegate CPI: pass --delegate PATH",
                request.method
            ),
            false,
        );
        return respond(Err(e), buffer);
    };
    tracing::info!(method = %request.method, delegate = %path.display(), "delegating: {reason}");
    match delegate::run(path, input) {
        Ok(code) => u8::try_from(code.clamp(0, 255)).unwrap_or(1),
        Err(e) => {
            let e = handler::cloud_error("delegating to the Azure CPI failed", &e);
            tracing::error!("{e}");
            respond(Err(e), buffer)
        }
    }
}

/// Write the one response line; exit 0 whatever the outcome (bosh reads the response).
fn respond(result: Result<serde_json::Value, CpiError>, buffer: &LogBuffer) -> u8 {
    let log = buffer.text();
    let response = match result {
        Ok(v) => Response::ok(v, log),
        Err(e) => Response::err(&e, log),
    };
    let line = match serde_json::to_string(&response) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: cannot encode the CPI response: {e}");
            return 1;
        }
    };
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{line}").and_then(|_| out.flush()) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("error: cannot write the CPI response: {e}");
        }
        return 1;
    }
    0
}
