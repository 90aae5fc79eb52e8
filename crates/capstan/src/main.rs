//! `capstan`: a durable workflow server, wire-compatible with Durable Workflow v2.
//!
//! This binary is glue: it parses flags, sets up logging, opens the store and runs the server
//! library until SIGINT or SIGTERM.

mod backup;
mod batch;
mod cli;
mod config;
mod credentials;
mod exposure;
mod import;
mod ops;
mod owner;

use capstan_server::telemetry::{OtlpSettings, Telemetry};
use capstan_server::{AuthConfig, ServerConfig};
use capstan_store::{SharedStore, SqliteStore};
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "capstan",
    version,
    about = "A durable workflow server, wire-compatible with Durable Workflow v2"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (embedded SQLite in ./capstan-data by default).
    Serve(ServeArgs),
    /// Check every history and ledger chain in the database, offline. Exit code 0: intact;
    /// 1: something is broken (each problem is printed); 2: the database could not be read.
    Verify(VerifyArgs),
    /// Declare and inspect consequential actions (the recovery ledger's definitions).
    Actions {
        #[command(flatten)]
        connection: cli::Connection,
        #[command(subcommand)]
        command: cli::ActionsCommand,
    },
    /// Inspect recovery-ledger entries and resolve unknown outcomes.
    Ledger {
        #[command(flatten)]
        connection: cli::Connection,
        #[command(subcommand)]
        command: cli::LedgerCommand,
    },
    /// Start, list, inspect, signal, query, update, cancel and terminate workflows.
    Workflow {
        #[command(flatten)]
        connection: cli::Connection,
        #[command(subcommand)]
        command: ops::WorkflowCommand,
    },
    /// Batch operations: one action on every run a query selects, followed with a progress bar.
    Batch {
        #[command(flatten)]
        connection: cli::Connection,
        #[command(subcommand)]
        command: batch::BatchCommand,
    },
    /// Registered workers.
    Worker {
        #[command(flatten)]
        connection: cli::Connection,
        #[command(subcommand)]
        command: ops::WorkerCommand,
    },
    /// Task queues: backlog, pollers, leases, diagnostics.
    TaskQueue {
        #[command(flatten)]
        connection: cli::Connection,
        #[command(subcommand)]
        command: ops::TaskQueueCommand,
    },
    /// Cron and interval schedules.
    Schedule {
        #[command(flatten)]
        connection: cli::Connection,
        #[command(subcommand)]
        command: ops::ScheduleCommand,
    },
    /// The server's health and cluster info.
    Server {
        #[command(flatten)]
        connection: cli::Connection,
        #[command(subcommand)]
        command: ops::ServerCommand,
    },
    /// Import history bundles (DW's embedded-v2 import): files, directories of them, or every
    /// run of a running DW or Capstan server (`--from URL`). Exit 1 if any bundle was refused.
    Import {
        #[command(flatten)]
        connection: cli::Connection,
        #[command(flatten)]
        args: import::ImportArgs,
    },
    /// Back up an embedded (SQLite) server, running or not: an online, consistent snapshot of
    /// its database and its external payload directory (docs/backup.md).
    Backup(backup::BackupArgs),
    /// Restore a backup directory or a continuous replica (to a point in time) into a new data
    /// directory, then verify it. Exit 2: nothing restored; 1: restored but broken.
    Restore(backup::RestoreArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion { shell: clap_complete::Shell },
    /// Named credentials: how a secret is written in a credentials file; those an admin
    /// manages over the API (list, create, grant, rotate, delete).
    Credentials {
        #[command(flatten)]
        connection: cli::Connection,
        #[command(subcommand)]
        command: credentials::CredentialsCommand,
    },
}

#[derive(Parser)]
struct VerifyArgs {
    /// Directory of the embedded database.
    #[arg(long, env = "CAPSTAN_DATA_DIR", default_value = "./capstan-data")]
    data_dir: PathBuf,
    /// Database URL (as for `serve`).
    #[arg(long, env = "CAPSTAN_DATABASE")]
    database: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AuthMode {
    None,
    Token,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Human,
    Json,
}

#[derive(Parser)]
struct ServeArgs {
    /// A TOML file of settings: any flag below by its long name in snake case (`listen`,
    /// `data_dir`, …). Flags and environment variables override it.
    #[arg(long, env = "CAPSTAN_CONFIG")]
    config: Option<PathBuf>,
    /// Check the configuration (flags, environment, config file), print the effective settings
    /// and exit: 0 when it would start, 2 when it would be refused. Opens no database.
    #[arg(long)]
    check_config: bool,
    /// Address to listen on.
    #[arg(long, env = "CAPSTAN_LISTEN", default_value = "127.0.0.1:8080")]
    listen: String,
    /// Directory for the embedded database.
    #[arg(long, env = "CAPSTAN_DATA_DIR", default_value = "./capstan-data")]
    data_dir: PathBuf,
    /// Database URL: `sqlite://PATH` (default: DATA_DIR/capstan.db), or `postgres://…` or
    /// `mysql://…` (MySQL 8, MariaDB 10.11+) to share one database between several nodes.
    #[arg(long, env = "CAPSTAN_DATABASE")]
    database: Option<String>,
    /// Authentication: `none`, or `token` (bearer tokens below).
    #[arg(long, env = "CAPSTAN_AUTH", value_enum, default_value = "none")]
    auth: AuthMode,
    /// Serve HTTPS with this certificate chain (PEM), read again when the file changes.
    #[arg(long, env = "CAPSTAN_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of `--tls-cert` (PEM), read again when the file changes.
    #[arg(long, env = "CAPSTAN_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require a client certificate signed by one of these CAs (PEM); with `--auth token`, a
    /// credential whose `client_certificates` names the certificate authenticates its requests.
    #[arg(long, env = "CAPSTAN_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Serve with `--auth none` on an address other machines can reach, when a proxy in front
    /// authenticates every request. Without it such a server refuses to start.
    #[arg(long, env = "CAPSTAN_ALLOW_UNAUTHENTICATED_NETWORK", default_value_t = false, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    allow_unauthenticated_network: bool,
    /// Shared token, valid for every role.
    #[arg(long, env = "CAPSTAN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Token for the worker role (worker plane and cluster info).
    #[arg(long, env = "CAPSTAN_WORKER_TOKEN", hide_env_values = true)]
    worker_token: Option<String>,
    /// Token for the operator role (control plane).
    #[arg(long, env = "CAPSTAN_OPERATOR_TOKEN", hide_env_values = true)]
    operator_token: Option<String>,
    /// Token for the admin role (control plane, admin routes).
    #[arg(long, env = "CAPSTAN_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Named credentials (TOML: principal, roles, namespaces, hashed secrets; see
    /// docs/principals.md). Read again when the file changes, so secrets rotate without a
    /// restart.
    #[arg(long, env = "CAPSTAN_CREDENTIALS_FILE")]
    credentials_file: Option<PathBuf>,
    /// Workflow task lease length.
    #[arg(long, env = "CAPSTAN_WORKFLOW_TASK_LEASE_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(i64).range(1..=3600))]
    workflow_task_lease_seconds: i64,
    /// Activity attempt lease length (heartbeats extend it).
    #[arg(long, env = "CAPSTAN_ACTIVITY_TASK_LEASE_SECONDS", default_value_t = 300, value_parser = clap::value_parser!(i64).range(1..=86400))]
    activity_task_lease_seconds: i64,
    /// Largest payload blob accepted, in bytes.
    #[arg(long, env = "CAPSTAN_MAX_PAYLOAD_BYTES", default_value_t = 2 * 1024 * 1024)]
    max_payload_bytes: usize,
    /// Where a namespace's `local` external payload storage keeps objects when its policy names
    /// no directory (one directory per namespace below; default: DATA_DIR/external-payloads).
    /// Nodes sharing a PostgreSQL database need a shared directory here, or an `s3` policy.
    #[arg(long, env = "CAPSTAN_EXTERNAL_PAYLOAD_DIR")]
    external_payload_dir: Option<PathBuf>,
    /// Largest payload the external payload transport takes, in bytes.
    #[arg(long, env = "CAPSTAN_MAX_EXTERNAL_PAYLOAD_BYTES", default_value_t = 64 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1..=1024 * 1024 * 1024))]
    max_external_payload_bytes: u64,
    /// Payloads above this size go to external storage, for a namespace that has it and whose
    /// policy sets no threshold of its own.
    #[arg(long, env = "CAPSTAN_EXTERNAL_PAYLOAD_THRESHOLD_BYTES", default_value_t = 256 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    external_payload_threshold_bytes: u64,
    /// A task queue's flow-control limits, set at start (repeatable): JSON with `task_queue`,
    /// `kind` (workflow or activity), optionally `namespace`, and the limits as
    /// `PUT /api/task-queues/{queue}/limits/{kind}` takes them. In the config file:
    /// `task_queue_limits = [{ task_queue = "orders", kind = "activity", max_leased_tasks = 10 }]`.
    #[arg(long = "task-queue-limit", value_name = "JSON")]
    task_queue_limits: Vec<String>,
    /// Most history events one run may hold.
    #[arg(long, env = "CAPSTAN_MAX_HISTORY_EVENTS", default_value_t = 50_000)]
    max_history_events: u64,
    /// How long a node holds a claimed background duty (timer, timeout) before another node may
    /// take it over, if the first died.
    #[arg(long, env = "CAPSTAN_DUTY_LEASE_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(i64).range(1..=3600))]
    duty_lease_seconds: i64,
    /// Schedule occurrences missed while no node was running still fire, one by one, when they
    /// are at most this old; older ones are skipped (and counted in the schedule's history).
    #[arg(long, env = "CAPSTAN_SCHEDULE_CATCHUP_WINDOW_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(i64).range(0..=86400))]
    schedule_catchup_window_seconds: i64,
    /// Memory for rendered history events served to workers that replay from the first event
    /// (least recently used runs leave first; 0 turns it off).
    #[arg(long, env = "CAPSTAN_HISTORY_CACHE_MIB", default_value_t = 32, value_parser = clap::value_parser!(u64).range(0..=65536))]
    history_cache_mib: u64,
    /// Overload: when writes stand in line longer than this, new work (starts, signals,
    /// updates) is refused with 503 and Retry-After; polls are shed at half of it, worker
    /// reports at twice it (docs/reliability.md, Overload). 0 turns refusals off.
    #[arg(long, env = "CAPSTAN_OVERLOAD_QUEUE_DELAY_MS", default_value_t = 100, value_parser = clap::value_parser!(u64).range(0..=60_000))]
    overload_queue_delay_ms: u64,
    /// Long polls this node holds at most; more are refused with 429 and Retry-After.
    #[arg(long, env = "CAPSTAN_MAX_PARKED_POLLS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_parked_polls: u64,
    /// Log format.
    #[arg(long, env = "CAPSTAN_LOG_FORMAT", value_enum, default_value = "human")]
    log_format: LogFormat,
    #[command(flatten)]
    replica: backup::ReplicaArgs,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CAPSTAN_LOG").unwrap_or_else(|_| "info".into());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Human => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

#[derive(Debug)]
enum Database {
    Sqlite(PathBuf),
    /// A database server several nodes share: PostgreSQL, MySQL or MariaDB.
    Shared(String),
}

fn database(args: &ServeArgs) -> Result<Database, StartupError> {
    database_at(&args.database, &args.data_dir)
}

const DATABASE_FORMS: &str = "a file path, sqlite://PATH, postgres://…, postgresql://…, mysql://… or mariadb://…";

/// The database `--database` names. A value with any other scheme is refused: a typo or a
/// database Capstan does not speak must never quietly become a local SQLite file.
fn database_at(database: &Option<String>, data_dir: &std::path::Path) -> Result<Database, StartupError> {
    let Some(value) = database else {
        return Ok(Database::Sqlite(data_dir.join("capstan.db")));
    };
    if ["postgres://", "postgresql://", "mysql://", "mariadb://"]
        .iter()
        .any(|scheme| value.starts_with(scheme))
    {
        return Ok(Database::Shared(value.clone()));
    }
    let refuse = |why: String| StartupError::new(format!("--database {}: {why}; accepted: {DATABASE_FORMS}", redacted(value)));
    if let Some(path) = value.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err(refuse("sqlite:// names no file".into()));
        }
        return Ok(Database::Sqlite(PathBuf::from(path)));
    }
    if value.trim().is_empty() {
        return Err(refuse("empty value".into()));
    }
    if let Some(scheme) = url_scheme(value) {
        return Err(refuse(format!("unknown scheme {scheme:?}")));
    }
    Ok(Database::Sqlite(PathBuf::from(value)))
}

/// The scheme of a URL-looking value (`mysql://…`, `postgress://…`, `mysql:host`); a Windows
/// drive letter (`C:\…`) is a path, not a scheme.
fn url_scheme(value: &str) -> Option<&str> {
    let (scheme, _) = value.split_once(':')?;
    let url_like = scheme.len() > 1
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    url_like.then_some(scheme)
}

/// `value` with any password in it masked, for messages and logs.
fn redacted(value: &str) -> String {
    let Some((scheme, rest)) = value.split_once("://") else {
        return value.to_string();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => value.to_string(),
    }
}

/// A configuration `capstan serve` refuses before it touches anything (exit code 2).
struct StartupError(String);

impl StartupError {
    fn new(message: String) -> Self {
        Self(message)
    }
}

impl From<String> for StartupError {
    fn from(message: String) -> Self {
        Self(message)
    }
}

fn auth_config(args: &ServeArgs) -> Result<AuthConfig, String> {
    match args.auth {
        AuthMode::None => Ok(AuthConfig::None),
        AuthMode::Token => {
            let credentials = match &args.credentials_file {
                Some(path) => capstan_server::auth::Credentials::from_file(path)?,
                None => Default::default(),
            };
            let config = AuthConfig::Token {
                shared: args.token.clone(),
                worker: args.worker_token.clone(),
                operator: args.operator_token.clone(),
                admin: args.admin_token.clone(),
                credentials,
            };
            Ok(config)
        }
    }
}

/// `--auth token` with neither a token flag nor a credentials file: only the credentials admins
/// made over the API (kept in the database) can let anyone in.
fn only_stored_credentials(args: &ServeArgs) -> bool {
    args.auth == AuthMode::Token
        && args.token.is_none()
        && args.worker_token.is_none()
        && args.operator_token.is_none()
        && args.admin_token.is_none()
        && args.credentials_file.is_none()
}

const NO_WAY_IN: &str = "--auth token needs at least one of --token, --worker-token, --operator-token, --admin-token, \
                         --credentials-file, or an admin credential bound to no namespace made over the API";

/// With [`only_stored_credentials`], the database must hold an admin credential bound to no
/// namespace that authenticates (a record this build cannot read does not): without one nobody
/// could manage the server, nor ever make a credential again.
async fn require_stored_admin<S: capstan_store::Store>(store: &S) -> Result<(), Stopped> {
    let stored = store.credentials().await.map_err(|e| format!("read the stored credentials: {e}"))?;
    let mut usable = stored.iter().filter_map(capstan_server::auth::Credential::from_record);
    if usable.any(|credential| credential.manages_credentials()) {
        tracing::info!(
            credentials = stored.len(),
            "authenticating with the credentials stored in the database only"
        );
        return Ok(());
    }
    Err(Stopped::Refused(format!(
        "{NO_WAY_IN}; the database holds {} stored credential(s), none of them such an admin",
        stored.len()
    )))
}

async fn shutdown_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("install the SIGTERM handler");
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = interrupt.await;
    tracing::info!("shutting down");
}

/// Why `serve` stopped: refused at start-up (exit 2) or failed while running (exit 1).
enum Stopped {
    Refused(String),
    Failed(String),
}

impl From<String> for Stopped {
    fn from(message: String) -> Self {
        Stopped::Failed(message)
    }
}

impl From<StartupError> for Stopped {
    fn from(error: StartupError) -> Self {
        Stopped::Refused(error.0)
    }
}

/// The addresses `--listen` names, and what serving there demands (`exposure`): refused, or
/// started with these warnings.
fn listening(args: &ServeArgs) -> Result<(Vec<std::net::SocketAddr>, Vec<exposure::Warning>), Stopped> {
    use std::net::ToSocketAddrs as _;
    let addresses: Vec<_> = args
        .listen
        .to_socket_addrs()
        .map_err(|e| Stopped::Refused(format!("--listen {}: {e}", args.listen)))?
        .collect();
    if addresses.is_empty() {
        return Err(Stopped::Refused(format!("--listen {}: names no address", args.listen)));
    }
    let warnings = exposure::assess(&exposure::Listening {
        listen: &args.listen,
        addresses: &addresses,
        // A required client certificate lets in only those a trusted CA vouched for.
        unauthenticated: args.auth == AuthMode::None && args.tls_client_ca.is_none(),
        tls: args.tls_cert.is_some(),
        allow_unauthenticated: args.allow_unauthenticated_network,
    })
    .map_err(Stopped::Refused)?;
    Ok((addresses, warnings))
}

/// `--tls-cert`, `--tls-key` and `--tls-client-ca`, loaded: a start that could not serve them is
/// refused.
fn tls_certificates(args: &ServeArgs) -> Result<Option<std::sync::Arc<capstan_server::tls::Certificates>>, Stopped> {
    let (Some(cert_path), Some(key_path)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    let settings = capstan_server::tls::TlsSettings {
        cert_path: cert_path.clone(),
        key_path: key_path.clone(),
        client_ca_path: args.tls_client_ca.clone(),
    };
    capstan_server::tls::Certificates::load(settings)
        .map(Some)
        .map_err(Stopped::Refused)
}

/// `--check-config`: what `serve` would refuse, refused the same way; else the settings.
fn check_config(args: &ServeArgs, effective: &str) -> Result<(), Stopped> {
    auth_config(args).map_err(Stopped::Refused)?;
    tls_certificates(args)?;
    let database = database(args)?;
    args.replica.check().map_err(Stopped::Refused)?;
    if matches!(database, Database::Shared(_)) && args.replica.replicate_to.is_some() {
        return Err(Stopped::Refused(backup::SHARED_REPLICA.into()));
    }
    configured_limits(args).map_err(Stopped::Refused)?;
    let (_, warnings) = listening(args)?;
    if let Some(otlp) = OtlpSettings::from_env(|name| std::env::var(name).ok()) {
        Telemetry::otlp(&otlp).map_err(Stopped::Refused)?;
    }
    print!("{effective}");
    for warning in &warnings {
        eprintln!("capstan: warning: {}", warning.message);
    }
    if only_stored_credentials(args) {
        eprintln!("capstan: note: {NO_WAY_IN}: serve starts only if the database holds such an admin");
    }
    eprintln!("capstan: configuration ok");
    Ok(())
}

/// The `--task-queue-limit` settings, each read and checked.
fn configured_limits(args: &ServeArgs) -> Result<Vec<capstan_app::queue_limits::ConfiguredLimit>, String> {
    args.task_queue_limits
        .iter()
        .map(|text| capstan_app::queue_limits::configured(text).map_err(|e| format!("--task-queue-limit {e}")))
        .collect()
}

/// A setting as `--check-config` shows it: secrets masked, a database URL's password hidden.
fn masked(id: &str, value: &str) -> String {
    match id {
        "token" | "worker_token" | "operator_token" | "admin_token" => "***".into(),
        "database" => redacted(value),
        _ => value.to_string(),
    }
}

async fn serve(args: ServeArgs) -> Result<(), Stopped> {
    let paused_at = capstan_pause::arm_from_env().map_err(Stopped::Refused)?;
    if !paused_at.is_empty() {
        tracing::warn!(points = ?paused_at, "fault test: pause points armed ({})", capstan_pause::ENV);
    }
    let auth = auth_config(&args).map_err(Stopped::Refused)?;
    let database = database(&args)?;
    let queue_limits = configured_limits(&args).map_err(Stopped::Refused)?;
    let tls = tls_certificates(&args)?;
    let (addresses, warnings) = listening(&args)?;
    for warning in &warnings {
        tracing::warn!(code = warning.code, "{}", warning.message);
    }
    let mut config = ServerConfig {
        tls,
        queue_limits,
        diagnostics: warnings
            .iter()
            .map(|w| capstan_server::Diagnostic {
                code: w.code.to_string(),
                message: w.message.clone(),
            })
            .collect(),
        auth,
        workflow_task_lease_ms: args.workflow_task_lease_seconds * 1000,
        activity_task_lease_ms: args.activity_task_lease_seconds * 1000,
        duty_lease_ms: args.duty_lease_seconds * 1000,
        schedule_catchup_window_ms: args.schedule_catchup_window_seconds * 1000,
        history_cache_bytes: (args.history_cache_mib as usize) << 20,
        admission: capstan_server::admission::AdmissionSettings {
            queue_delay_target: std::time::Duration::from_millis(args.overload_queue_delay_ms),
            max_parked_polls: args.max_parked_polls as usize,
        },
        ..ServerConfig::default()
    };
    config.limits.payload_bytes_max = args.max_payload_bytes;
    config.limits.history_events_max = args.max_history_events;
    config.payloads.default_root = args
        .external_payload_dir
        .clone()
        .unwrap_or_else(|| args.data_dir.join("external-payloads"));
    config.payloads.former_roots = capstan_backup::snapshot::former_roots(&config.payloads.default_root);
    config.payloads.max_bytes = args.max_external_payload_bytes;
    config.payloads.default_threshold_bytes = args.external_payload_threshold_bytes.min(args.max_external_payload_bytes);
    if let Some(otlp) = OtlpSettings::from_env(|name| std::env::var(name).ok()) {
        config.telemetry = Telemetry::otlp(&otlp).map_err(Stopped::Refused)?;
        tracing::info!(endpoint = %otlp.traces_endpoint, service = %otlp.service_name, "exporting the server's spans over OTLP");
    }
    let now = config.sources.now_ms();
    let listener = tokio::net::TcpListener::bind(addresses.as_slice())
        .await
        .map_err(|e| format!("listen on {}: {e}", args.listen))?;
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    match database {
        Database::Sqlite(path) => {
            // Held for the life of the process: a second process on this file is refused.
            let _owner = owner::claim(&path, &config.server_id, now)?;
            let store = SqliteStore::open(&path, config.limits.clone(), now)
                .map_err(|e| format!("open {}: {e}", path.display()))?
                .with_sources(config.sources.clone());
            if only_stored_credentials(&args) {
                require_stored_admin(&store).await?;
            }
            let replica = backup::start_replica(&store, &args.replica, config.sources.clone())
                .await
                .map_err(Stopped::Refused)?;
            if let Some(replica) = &replica {
                config
                    .reporters
                    .push(std::sync::Arc::new(backup::ReplicaReadings(replica.status.clone())));
            }
            let opened = std::fs::canonicalize(&path).unwrap_or(path);
            tracing::info!(%address, tls = config.tls.is_some(), database = %opened.display(), node = %config.server_id, "capstan serving (SQLite)");
            let served = capstan_server::serve(listener, store, config, shutdown_signal()).await;
            if let Some(replica) = replica {
                replica.finish().await;
            }
            Ok(served.map_err(|e| e.to_string())?)
        }
        Database::Shared(_) if args.replica.replicate_to.is_some() => Err(Stopped::Refused(
            "--replicate-to replicates the embedded SQLite database; a shared database is replicated by its own tools (docs/backup.md)"
                .into(),
        )),
        Database::Shared(url) => {
            let store = SharedStore::connect(&url, config.limits.clone(), now)
                .await
                .map_err(|e| format!("connect to {}: {e}", redacted(&url)))?
                .with_sources(config.sources.clone());
            match store.durability().await {
                Ok(durability) => {
                    for risk in durability.risks() {
                        tracing::error!("database setting {risk}; Capstan's guarantee that a 2xx survives a crash does not hold");
                    }
                }
                Err(error) => tracing::warn!(%error, "could not read the database's durability settings"),
            }
            if only_stored_credentials(&args) {
                require_stored_admin(&store).await?;
            }
            tracing::info!(%address, tls = config.tls.is_some(), database = %redacted(&url), node = %config.server_id, "capstan serving (shared database)");
            Ok(capstan_server::serve(listener, store, config, shutdown_signal())
                .await
                .map_err(|e| e.to_string())?)
        }
    }
}

async fn verify(args: VerifyArgs) -> Result<capstan_server::integrity::IntegrityReport, String> {
    let ServerConfig { limits, sources, .. } = ServerConfig::default();
    let now = sources.now_ms();
    match database_at(&args.database, &args.data_dir).map_err(|e| e.0)? {
        Database::Sqlite(path) => {
            if !path.exists() {
                return Err(format!("no database at {}", path.display()));
            }
            let store = SqliteStore::open(&path, limits, now).map_err(|e| format!("open {}: {e}", path.display()))?;
            capstan_server::integrity::verify(&store).await.map_err(|e| e.to_string())
        }
        Database::Shared(url) => {
            let store = SharedStore::connect(&url, limits, now)
                .await
                .map_err(|e| format!("connect to {}: {e}", redacted(&url)))?;
            capstan_server::integrity::verify(&store).await.map_err(|e| e.to_string())
        }
    }
}

fn main() -> ExitCode {
    let (argv, from_file) = match config::with_file_settings(Cli::command(), std::env::args_os().collect()) {
        Ok(parsed) => parsed,
        Err(message) => {
            eprintln!("capstan: {message}");
            return ExitCode::from(2);
        }
    };
    let matches = Cli::command().get_matches_from(argv);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    match cli.command {
        Command::Actions { connection, command } => cli::actions(connection, command),
        Command::Ledger { connection, command } => cli::ledger(connection, command),
        Command::Workflow { connection, command } => ops::workflow(connection, command),
        Command::Batch { connection, command } => batch::batch(connection, command),
        Command::Worker { connection, command } => ops::worker(connection, command),
        Command::TaskQueue { connection, command } => ops::task_queue(connection, command),
        Command::Schedule { connection, command } => ops::schedule(connection, command),
        Command::Server { connection, command } => ops::server(connection, command),
        Command::Import { connection, args } => import::run(connection, args),
        Command::Credentials { connection, command } => credentials::run(connection, command),
        Command::Backup(args) => backup::backup(args),
        Command::Restore(args) => backup::restore(args),
        Command::Completion { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "capstan", &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Command::Verify(args) => {
            let json = args.json;
            let runtime = tokio::runtime::Runtime::new().expect("start the tokio runtime");
            match runtime.block_on(verify(args)) {
                Ok(report) => {
                    if json {
                        println!("{}", serde_json::to_string_pretty(&report).expect("a report serializes"));
                    } else {
                        for problem in &report.problems {
                            println!("BROKEN  {problem}");
                        }
                        println!(
                            "{} runs ({} events) and {} ledger chains ({} checkpoints) checked: {}",
                            report.runs_checked,
                            report.events_checked,
                            report.ledger_instances_checked,
                            report.checkpoints_checked,
                            if report.ok() {
                                "intact".to_string()
                            } else {
                                format!("{} broken", report.problems.len())
                            }
                        );
                    }
                    if report.ok() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    }
                }
                Err(message) => {
                    eprintln!("capstan verify: {message}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Serve(args) if args.check_config => {
            let serve = Cli::command().find_subcommand("serve").expect("serve").clone();
            let serve_matches = matches.subcommand_matches("serve").expect("serve matches");
            let effective = config::effective(&serve, serve_matches, &from_file, masked);
            match check_config(&args, &effective) {
                Ok(()) => ExitCode::SUCCESS,
                Err(Stopped::Refused(message) | Stopped::Failed(message)) => {
                    eprintln!("capstan: {message}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Serve(args) => {
            init_logging(args.log_format);
            // Payload decoding recurses per nesting level (up to `avro::MAX_DEPTH`): room for it
            // even in a debug build, whose frames are many times larger.
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_stack_size(capstan_server::STACK_BYTES)
                .build()
                .expect("start the tokio runtime");
            match runtime.block_on(serve(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(Stopped::Refused(message)) => {
                    tracing::error!(%message, "capstan refused to start");
                    eprintln!("capstan: {message}");
                    ExitCode::from(2)
                }
                Err(Stopped::Failed(message)) => {
                    tracing::error!(%message, "capstan stopped");
                    eprintln!("capstan: {message}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(value: &str) -> Result<Database, String> {
        database_at(&Some(value.to_string()), std::path::Path::new("data")).map_err(|e| e.0)
    }

    #[test]
    fn the_database_value_selects_only_what_it_names() {
        assert!(
            matches!(database_at(&None, std::path::Path::new("d")), Ok(Database::Sqlite(p)) if p == std::path::Path::new("d/capstan.db"))
        );
        assert!(
            matches!(named("sqlite:///var/lib/capstan.db"), Ok(Database::Sqlite(p)) if p == std::path::Path::new("/var/lib/capstan.db"))
        );
        assert!(matches!(named("./here.db"), Ok(Database::Sqlite(p)) if p == std::path::Path::new("./here.db")));
        for shared in ["postgres://u@h/db", "postgresql://u@h/db", "mysql://u@h/db", "mariadb://u@h/db"] {
            assert!(matches!(named(shared), Ok(Database::Shared(_))), "{shared}");
        }
        for refused in [
            "mysqll://capstan:secret@127.0.0.1:3306/capstan",
            "postgress://u@h/db",
            "mysql:host",
            "sqlite://",
            " ",
        ] {
            let message = named(refused).err().unwrap_or_else(|| panic!("{refused:?} must be refused"));
            assert!(message.contains("accepted: a file path, sqlite://PATH"), "{message}");
            assert!(!message.contains("secret"), "a password is never echoed: {message}");
        }
        assert!(named("postgress://u@h/db").unwrap_err().contains("unknown scheme \"postgress\""));
    }

    fn stored(principal: &str, roles: &[&str], namespaces: Option<Vec<String>>, digest: &str) -> capstan_store::CredentialRecord {
        capstan_store::CredentialRecord {
            principal: principal.into(),
            roles: roles.iter().map(|role| role.to_string()).collect(),
            namespaces,
            secrets: vec![capstan_store::CredentialSecret {
                secret_id: format!("{principal}-1"),
                digest: digest.into(),
                created_at: 0,
                created_by: None,
            }],
            created_at: 0,
            created_by: None,
            updated_at: 0,
            updated_by: None,
        }
    }

    /// Only a stored admin that would authenticate, bound to no namespace, lets a server start
    /// with no token flag and no file.
    #[tokio::test]
    async fn only_a_usable_unbound_admin_in_the_database_lets_token_auth_start_without_flags() {
        use capstan_store::AdminStore as _;
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("capstan.db"), Default::default(), 0).unwrap();
        let refused = |result: Result<(), Stopped>| matches!(result, Err(Stopped::Refused(_)));
        assert!(refused(require_stored_admin(&store).await), "an empty database");
        let digest = capstan_server::auth::stored_form("a-secret-of-some-length");
        store
            .create_credential(stored("bound", &["admin"], Some(vec!["default".into()]), &digest))
            .await
            .unwrap();
        store.create_credential(stored("worker", &["worker"], None, &digest)).await.unwrap();
        store
            .create_credential(stored("unreadable", &["admin"], None, "sha256:not-hex"))
            .await
            .unwrap();
        assert!(refused(require_stored_admin(&store).await), "bound, not admin, or not usable");
        store.create_credential(stored("root", &["admin"], None, &digest)).await.unwrap();
        assert!(require_stored_admin(&store).await.is_ok());
    }
}
