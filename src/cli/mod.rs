//! Command-line interface: clap definitions, dispatch, and rendering of outcomes and errors.
//!
//! Each command lives in its own file and exposes `run(&GlobalArgs, Args) -> anyhow::Result<Report>`.

use std::io::Write;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::error::Exit;

pub mod cleanup;
pub mod completions;
pub mod connect;
pub mod cpi;
pub mod delete;
pub mod doctor;
pub mod embedded;
pub mod emulator;
pub mod ensure;
pub mod inspect;
pub mod list;
pub mod lookup;
pub mod migrate;
pub mod output;
pub mod references;
pub mod restore;
pub mod seed;
pub mod target;

pub use output::Report;

/// Every environment variable the tool reads, for `--help` (the flags' own fallbacks are also
/// shown beside each flag).
pub const ENVIRONMENT_HELP: &str = "\
Environment:
  Settings (a flag wins over its variable, a variable over the config file):
    STEMCELL_GALLERY_CONFIG        config file (default /etc/stemcell-gallery/config.toml when it exists)
    AZURE_SUBSCRIPTION_ID          --subscription
    STEMCELL_GALLERY_RESOURCE_GROUP, STEMCELL_GALLERY_GALLERY, STEMCELL_GALLERY_LOCATION
    STEMCELL_GALLERY_ARM_ENDPOINT, STEMCELL_GALLERY_BLOB_ENDPOINT, STEMCELL_GALLERY_STORAGE_ACCOUNT
    STEMCELL_GALLERY_AUTH, STEMCELL_GALLERY_CLOUD, STEMCELL_GALLERY_CA_CERT, SSL_CERT_FILE
    STEMCELL_GALLERY_CONSUMER_SUBSCRIPTIONS   comma-separated consumer subscriptions (cleanup)
    STEMCELL_GALLERY_IMDS_ENDPOINT, AZURE_POD_IDENTITY_AUTHORITY_HOST   managed identity endpoint
  Credentials (azure_identity's names):
    AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET, AZURE_FEDERATED_TOKEN_FILE,
    AZURE_AUTHORITY_HOST
  Tuning:
    STEMCELL_GALLERY_ARM_RETRIES, STEMCELL_GALLERY_BLOB_RETRIES   retries of one request (0-20)
    STEMCELL_GALLERY_HTTP_TIMEOUT        seconds one HTTP request may take
    STEMCELL_GALLERY_OPERATION_TIMEOUT   seconds a long-running operation may take (default 3600)
    STEMCELL_GALLERY_LOCK_WAIT           seconds to wait for another process's lock (default 600)
    STEMCELL_GALLERY_COALESCE            0/off: no group commit of reference writes
  Output and logs:
    STEMCELL_GALLERY_COLOR   --color;  NO_COLOR   no colours in auto mode;  RUST_LOG   log filter
  Emulator:
    STEMCELL_GALLERY_EMULATOR_TIMING, STEMCELL_GALLERY_EMULATOR_TIME_SCALE
  CPI front (set by bosh-cli, read to tell create-env from a director):
    BOSH_PACKAGES_DIR, BOSH_JOBS_DIR

Exit codes: 0 success, 1 error, 2 usage or configuration, 3 not found, 4 content conflict,
5 cleanup or prune refused because evidence is incomplete.";

/// Manage BOSH stemcells in an Azure Compute Gallery.
#[derive(Debug, Parser)]
#[command(
    name = "stemcell-gallery",
    version,
    about,
    long_about = None,
    after_help = ENVIRONMENT_HELP
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// When log lines on stderr carry ANSI colours.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum ColorChoice {
    /// Only when stderr is a terminal and NO_COLOR is unset or empty.
    #[default]
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// Whether to colour: `always`/`never` as said; `auto` only on a terminal without a
    /// non-empty `NO_COLOR` (no-color.org).
    pub fn ansi(self, terminal: bool, no_color: Option<&str>) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => terminal && no_color.is_none_or(str::is_empty),
        }
    }

    /// [`ColorChoice::ansi`] for this process's stderr and environment.
    pub fn ansi_on_stderr(self) -> bool {
        use std::io::IsTerminal as _;
        self.ansi(
            std::io::stderr().is_terminal(),
            std::env::var("NO_COLOR").ok().as_deref(),
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum OutputFormat {
    #[default]
    Human,
    Json,
}

/// Flags that every command accepts (DESIGN.md §5).
#[derive(Debug, Clone, Args, Default)]
#[command(next_help_heading = "Global options")]
pub struct GlobalArgs {
    /// Configuration file: our TOML, or the Azure CPI's cpi.json (default:
    /// /etc/stemcell-gallery/config.toml when it exists; '' for none).
    // Not clap's PathBuf parser: it refuses an empty value, and '' (also `--config=` and an empty
    // STEMCELL_GALLERY_CONFIG) is how the default file is turned off (config_file_to_read).
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "STEMCELL_GALLERY_CONFIG",
        value_parser = clap::builder::TypedValueParser::map(
            clap::builder::OsStringValueParser::new(),
            std::path::PathBuf::from
        )
    )]
    pub config: Option<std::path::PathBuf>,
    /// Azure subscription id.
    #[arg(long, global = true, value_name = "ID", env = "AZURE_SUBSCRIPTION_ID")]
    pub subscription: Option<String>,
    /// Resource group holding the gallery.
    #[arg(long, global = true, value_name = "RG")]
    pub resource_group: Option<String>,
    /// Azure Compute Gallery name.
    #[arg(long, global = true, value_name = "NAME")]
    pub gallery: Option<String>,
    /// Azure region of the gallery (and the default replication target).
    #[arg(long, global = true, value_name = "REGION")]
    pub location: Option<String>,
    /// Azure Resource Manager endpoint (default: the cloud's).
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "STEMCELL_GALLERY_ARM_ENDPOINT"
    )]
    pub arm_endpoint: Option<String>,
    /// Storage account URL (https://ACCOUNT.blob.core.windows.net, or path-style for emulators).
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "STEMCELL_GALLERY_BLOB_ENDPOINT"
    )]
    pub blob_endpoint: Option<String>,
    /// PEM bundle of extra CA certificates to trust for ARM, blob storage and token requests
    /// (Azure Stack, TLS-inspecting proxies); config key `ca_cert`.
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "STEMCELL_GALLERY_CA_CERT"
    )]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Start the local Azure emulator in-process and point the command at it.
    #[arg(long, global = true)]
    pub emulator: bool,
    /// How to authenticate: default, secret, workload-identity, managed-identity, azure-cli, emulator.
    #[arg(
        long,
        global = true,
        value_name = "KIND",
        env = "STEMCELL_GALLERY_AUTH"
    )]
    pub auth: Option<String>,
    /// Azure cloud: AzureCloud, AzureChinaCloud, AzureUSGovernment, AzureStack (custom endpoints).
    #[arg(long, global = true, value_name = "NAME")]
    pub cloud: Option<String>,
    /// Output format; json prints one JSON document on stdout, logs go to stderr.
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Human)]
    pub output: OutputFormat,
    /// More log output (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Only errors on stderr.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Colour log lines: auto (only on a terminal, and not when NO_COLOR is set), always, never.
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "WHEN",
        default_value_t = ColorChoice::Auto,
        env = "STEMCELL_GALLERY_COLOR"
    )]
    pub color: ColorChoice,
    /// Consumer subscriptions given on the command line (`cleanup --consumer-subscription`);
    /// not a global flag: the command that has the flag fills this in before connecting.
    #[arg(skip)]
    pub consumer_subscriptions: Vec<String>,
}

/// The global flags as the settings' highest layer (clap has applied their environment
/// fallbacks already).
impl crate::config::ToFlags for GlobalArgs {
    fn to_flags(&self) -> crate::config::Flags {
        crate::config::Flags {
            layer: crate::config::Layer {
                subscription: self.subscription.clone(),
                resource_group: self.resource_group.clone(),
                gallery: self.gallery.clone(),
                location: self.location.clone(),
                arm_endpoint: self.arm_endpoint.clone(),
                blob_endpoint: self.blob_endpoint.clone(),
                ca_cert: self.ca_cert.clone(),
                auth: self.auth.clone(),
                cloud: self.cloud.clone(),
                consumer_subscriptions: (!self.consumer_subscriptions.is_empty())
                    .then(|| self.consumer_subscriptions.clone()),
                ..crate::config::Layer::default()
            },
            config: self.config.clone(),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or reuse the gallery version for an already uploaded VHD.
    #[command(
        after_help = "Exit codes: 0 created, reused or waited; 1 error; 2 usage; 3 the gallery, or the blob --blob-uri names, does not exist (nothing was created); 4 content conflict (the version holds another image)."
    )]
    Ensure(ensure::EnsureArgs),
    /// Print one gallery version (exit 3 when absent).
    Lookup(lookup::LookupArgs),
    /// List image definitions and versions with mode, digest, state and references.
    List(list::ListArgs),
    /// Remove a reference; delete the version only when nothing refers to or uses it.
    Delete(delete::DeleteArgs),
    /// Restore a soft-deleted gallery version (a gallery with soft delete on keeps a deleted
    /// version restorable for its retention period, 7 days by default).
    #[command(
        after_help = "Exit codes: 0 restored (or not soft-deleted and present); 1 error; 2 usage; 3 nothing by that name is restorable (the message names what is)."
    )]
    Restore(restore::RestoreArgs),
    /// Plan (default) or --apply the deletion of gallery versions every evidence source proves unused.
    Cleanup(cleanup::CleanupArgs),
    /// Reference hygiene: `references prune` removes stemcell CIDs no director list or
    /// create-env state holds any more (dry run by default).
    References(references::ReferencesArgs),
    /// Bring a director's pre-gallery stemcells into the gallery: a version made from each
    /// CID's blob `stemcell/<cid>.vhd`, 0 bytes uploaded, the CID recorded (dry run by default).
    #[command(
        after_help = "Exit codes: 0 planned or migrated (skips included); 1 a CID failed (re-run to finish); 2 usage; 4 a version of that stemcell version holds other content."
    )]
    Migrate(migrate::MigrateArgs),
    /// Parse and verify a stemcell (manifest, version key, sha1, sha256, VHD footer, data vs
    /// zeros) without uploading anything.
    Inspect(inspect::InspectArgs),
    /// Print shell completions (bash, zsh, fish, elvish, powershell) or a man page (man).
    Completions(completions::CompletionsArgs),
    /// Read-only preflight: configuration, token, gallery, storage, definitions.
    Doctor(doctor::DoctorArgs),
    /// Serve the local Azure emulator (ARM gallery API + blob subset); prints one JSON line when ready.
    Emulator(emulator::EmulatorArgs),
    /// Upload a stemcell (streaming, sparse, parallel), ensure its gallery version and wait for
    /// replication to every target region. Safe to re-run: a complete blob of the same image is
    /// reused; an interrupted upload starts over.
    #[command(
        after_help = "Exit codes: 0 created, reused or waited; 1 error; 2 usage; 3 the gallery does not exist (checked before anything is uploaded); 4 content conflict (the version holds another image)."
    )]
    Seed(seed::SeedArgs),
    /// BOSH CPI protocol on stdin/stdout: create_stemcell, delete_stemcell and info, passing
    /// every other method to the Azure CPI given with --delegate.
    Cpi(cpi::CpiArgs),
}

/// Parse the command line; clap prints usage errors itself and exits 2.
pub fn parse() -> Cli {
    Cli::parse()
}

/// Run a parsed command line and return the process exit code.
pub fn main(cli: Cli) -> u8 {
    // One process, one async runtime: the adapters share one HTTP client.
    crate::wiring::share_http_clients();
    // The CPI front owns stdout (one response line) and collects its log into the response.
    if let Command::Cpi(args) = cli.command {
        return cpi::main(cli.global, args);
    }
    init_tracing(&cli.global);
    // Waits: a spinner on a terminal (not with --quiet); lines in a log or a pipe.
    {
        use std::io::IsTerminal as _;
        if std::io::stderr().is_terminal() && !cli.global.quiet {
            crate::progress::set_mode(crate::progress::Mode::Terminal);
        }
    }
    let format = cli.global.output;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return Exit::Error.code();
        }
    };
    let result = runtime.block_on(dispatch(cli));
    match result {
        Ok(report) => {
            let code = report.exit.code();
            if let Err(err) = report.print(format) {
                // A closed stdout (e.g. piped into `head`) is not worth a panic.
                if err.kind() != std::io::ErrorKind::BrokenPipe {
                    eprintln!("error: cannot write output: {err}");
                    return Exit::Error.code();
                }
            }
            code
        }
        Err(err) => {
            let exit = exit_for(&err);
            print_error(&err, exit, format);
            exit.code()
        }
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<Report> {
    let mut global = cli.global;
    // `--emulator`: an in-process emulator that lives as long as the command.
    let _emulator = embedded::apply(&mut global).await?;
    match cli.command {
        Command::Ensure(args) => ensure::run(&global, args).await,
        Command::Lookup(args) => lookup::run(&global, args).await,
        Command::List(args) => list::run(&global, args).await,
        Command::Delete(args) => delete::run(&global, args).await,
        Command::Restore(args) => restore::run(&global, args).await,
        Command::Cleanup(args) => cleanup::run(&global, args).await,
        Command::References(args) => references::run(&global, args).await,
        Command::Migrate(args) => migrate::run(&global, args).await,
        Command::Completions(args) => completions::run(&global, args),
        Command::Doctor(args) => doctor::run(&global, args).await,
        Command::Inspect(args) => inspect::run(&global, args),
        Command::Emulator(args) => emulator::run(&global, args).await,
        Command::Seed(args) => seed::run(&global, args).await,
        // `main` serves it before any of this; reaching here means a caller skipped `main`.
        Command::Cpi(_) => Err(anyhow::anyhow!(
            "the cpi command is served by cli::main, which owns stdout for the CPI response"
        )),
    }
}

/// The exit code for an error (its first typed cause's class, read by `wiring::failure`).
pub use crate::wiring::failure::exit_for;

fn print_error(err: &anyhow::Error, exit: Exit, format: OutputFormat) {
    let message = crate::wiring::failure::explain(format!("{err:#}"));
    if format == OutputFormat::Json {
        let doc = serde_json::json!({"error": {"message": message, "exit_code": exit.code()}});
        let _ = writeln!(std::io::stdout(), "{doc}");
    }
    eprintln!("error: {message}");
}

/// Log targets of the Azure SDK that print credentials below INFO: azure_core's transport policy
/// dumps every request with its `Authorization` header (a bearer token or a Shared Key signature)
/// at DEBUG, its custom-headers policy prints header values and azure_storage's authorization
/// policy prints itself at TRACE. Their events below INFO are dropped whatever RUST_LOG asks for;
/// the request line (`performing request GET '…'`, from `azure_core::http_client`) stays.
const CREDENTIAL_BEARING_TARGETS: &[&str] = &[
    "azure_core::policies::transport",
    "azure_core::policies::custom_headers_policy",
    "azure_storage::authorization",
];

/// Whether an event may be logged: not a credential-bearing SDK event below INFO. Every log
/// setup (this one, and the CPI front's) filters with it.
pub(crate) fn loggable(meta: &tracing::Metadata<'_>) -> bool {
    *meta.level() <= tracing::Level::INFO
        || !CREDENTIAL_BEARING_TARGETS
            .iter()
            .any(|t| meta.target().starts_with(t))
}

/// The stderr log filter: RUST_LOG when set, else our own crate at the level `-q`/`-v` choose and
/// dependencies at warn.
pub(crate) fn stderr_filter(global: &GlobalArgs) -> tracing_subscriber::EnvFilter {
    let level = if global.quiet {
        "error"
    } else {
        match global.verbose {
            0 => "info",
            1 => "debug",
            _ => "trace",
        }
    };
    tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!("warn,stemcell_gallery={level}"))
    })
}

fn init_tracing(global: &GlobalArgs) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::{filter, Layer as _};
    let env = stderr_filter(global);
    let layer = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(global.color.ansi_on_stderr())
        .with_target(false)
        .with_filter(env)
        .with_filter(filter::filter_fn(loggable));
    let _ = tracing_subscriber::registry().with(layer).try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// clap's own consistency checks over every command (unique names, valid defaults, ...).
    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// ANSI colours only on a terminal, never with a non-empty NO_COLOR unless asked for.
    #[test]
    fn colour_follows_the_terminal_no_color_and_the_flag() {
        assert!(ColorChoice::Auto.ansi(true, None));
        assert!(ColorChoice::Auto.ansi(true, Some("")));
        assert!(!ColorChoice::Auto.ansi(false, None));
        assert!(!ColorChoice::Auto.ansi(true, Some("1")));
        assert!(ColorChoice::Always.ansi(false, Some("1")));
        assert!(!ColorChoice::Never.ansi(true, None));
        let cli = Cli::try_parse_from(["stemcell-gallery", "--color", "never", "list"]).unwrap();
        assert_eq!(cli.global.color, ColorChoice::Never);
        assert!(Cli::try_parse_from(["stemcell-gallery", "--color", "sometimes", "list"]).is_err());
    }
}
