//! `capstan backup`, `capstan restore` and `serve --replicate-to`: the binary's side of
//! `capstan-backup` (flags, the database they act on, what is printed). docs/backup.md.

use capstan_backup::{replicate, restore, snapshot, target::Target};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

pub const SHARED_REPLICA: &str =
    "--replicate-to replicates the embedded SQLite database; a shared database is replicated by its own tools (docs/backup.md)";

/// The continuous replica's settings on `serve`.
#[derive(clap::Args, Clone)]
pub struct ReplicaArgs {
    /// Replicate the embedded database continuously: its WAL shipped as it commits to a
    /// directory (`file:///DIR` or a path) or S3-compatible storage
    /// (`s3://BUCKET/PREFIX[?endpoint=URL&region=NAME]`, credentials from `AWS_*`). Restore
    /// with `capstan restore --from` the same location.
    #[arg(long, env = "CAPSTAN_REPLICATE_TO")]
    pub replicate_to: Option<String>,
    /// How often committed transactions are shipped: the recovery point while the target
    /// answers.
    #[arg(long, env = "CAPSTAN_REPLICA_INTERVAL_MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=600_000))]
    pub replica_interval_ms: u64,
    /// How often the replica starts a new generation from a fresh snapshot.
    #[arg(long, env = "CAPSTAN_REPLICA_SNAPSHOT_INTERVAL_SECONDS", default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..))]
    pub replica_snapshot_interval_seconds: u64,
    /// How far back a restore can go; older generations are deleted.
    #[arg(long, env = "CAPSTAN_REPLICA_RETENTION_SECONDS", default_value_t = 259_200, value_parser = clap::value_parser!(u64).range(1..))]
    pub replica_retention_seconds: u64,
}

impl ReplicaArgs {
    /// Whether the replica's location is well formed, touching nothing (`--check-config`).
    pub fn check(&self) -> Result<(), String> {
        match &self.replicate_to {
            Some(location) => Target::check(location).map_err(|e| format!("--replicate-to: {e}")),
            None => Ok(()),
        }
    }

    /// The replica's settings, or `None` when none was asked for.
    pub fn settings(&self) -> Result<Option<replicate::Settings>, String> {
        let Some(location) = &self.replicate_to else { return Ok(None) };
        let target = Target::create(location).map_err(|e| format!("--replicate-to: {e}"))?;
        Ok(Some(replicate::Settings {
            target,
            interval: Duration::from_millis(self.replica_interval_ms),
            snapshot_interval: Duration::from_secs(self.replica_snapshot_interval_seconds),
            retention: Duration::from_secs(self.replica_retention_seconds),
            checkpoint_frames: 1000,
            pending_bytes_max: 256 << 20,
        }))
    }
}

#[derive(clap::Args)]
pub struct BackupArgs {
    /// A new (or empty) directory for the backup; it has the layout of a data directory, so
    /// `capstan verify --data-dir` checks it.
    #[arg(long)]
    pub to: PathBuf,
    /// Data directory of the server to back up (running or not).
    #[arg(long, env = "CAPSTAN_DATA_DIR", default_value = "./capstan-data")]
    pub data_dir: PathBuf,
    /// Its database, when not DATA_DIR/capstan.db (`sqlite://PATH` or a path).
    #[arg(long, env = "CAPSTAN_DATABASE")]
    pub database: Option<String>,
    /// Its external payload directory, when not DATA_DIR/external-payloads.
    #[arg(long, env = "CAPSTAN_EXTERNAL_PAYLOAD_DIR")]
    pub external_payload_dir: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// A backup directory (`capstan backup --to`), or a replica (`serve --replicate-to`).
    #[arg(long)]
    pub from: String,
    /// The new data directory to restore into (its database must not exist yet).
    #[arg(long, env = "CAPSTAN_DATA_DIR", default_value = "./capstan-data")]
    pub data_dir: PathBuf,
    /// From a replica: the point in time (RFC 3339, or Unix milliseconds); the newest by
    /// default.
    #[arg(long)]
    pub at: Option<String>,
    /// From a replica: list its generations (the points a restore can reach) and exit.
    #[arg(long)]
    pub list: bool,
}

fn sqlite_path(database: &Option<String>, data_dir: &Path) -> Result<PathBuf, String> {
    match crate::database_at(database, data_dir).map_err(|e| e.0)? {
        crate::Database::Sqlite(path) => Ok(path),
        crate::Database::Shared(_) => {
            Err("a shared database is backed up with its own tools (pg_basebackup, pg_dump, mariadb-backup); see docs/backup.md".into())
        }
    }
}

pub fn backup(args: BackupArgs) -> ExitCode {
    let run = || -> Result<snapshot::BackupManifest, String> {
        let database = sqlite_path(&args.database, &args.data_dir)?;
        let payloads = args
            .external_payload_dir
            .clone()
            .unwrap_or_else(|| args.data_dir.join("external-payloads"));
        let now = capstan_store::Sources::system().now_ms();
        snapshot::backup(&database, &payloads, &args.to, now).map_err(|e| e.to_string())
    };
    match run() {
        Ok(manifest) => {
            println!(
                "backed up {} ({} bytes) and {} payload files ({} bytes) to {}",
                manifest.source,
                manifest.database_bytes,
                manifest.payload_files,
                manifest.payload_bytes,
                args.to.display()
            );
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("capstan backup: {message}");
            ExitCode::from(2)
        }
    }
}

pub fn restore(args: RestoreArgs) -> ExitCode {
    let runtime = tokio::runtime::Runtime::new().expect("start the tokio runtime");
    match runtime.block_on(run_restore(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => {
            eprintln!("capstan restore: {message}");
            ExitCode::from(code)
        }
    }
}

/// Exit 2: nothing restored; 1: restored, but `verify` found it broken.
async fn run_restore(args: &RestoreArgs) -> Result<(), (u8, String)> {
    let refused = |message: String| (2, message);
    let database = args.data_dir.join(snapshot::DATABASE);
    let backup_dir = Path::new(&args.from);
    if backup_dir.join(snapshot::MANIFEST).exists() {
        if args.at.is_some() || args.list {
            return Err(refused("--at and --list are for a replica; this is a backup directory".into()));
        }
        let manifest =
            snapshot::restore(backup_dir, &database, &args.data_dir.join(snapshot::PAYLOADS)).map_err(|e| refused(e.to_string()))?;
        println!(
            "restored the backup of {} taken at {} into {}",
            manifest.source,
            shown_time(manifest.created_at_ms),
            args.data_dir.display()
        );
    } else {
        let target = Target::existing(&args.from).map_err(|e| refused(e.to_string()))?;
        if args.list {
            let generations = restore::generations(&target).await.map_err(|e| refused(e.to_string()))?;
            for generation in &generations {
                println!(
                    "{}  {} → {}  ({} segments)",
                    generation.id,
                    shown_time(generation.manifest.started_at_ms),
                    shown_time(generation.last_shipped_at_ms),
                    generation.segments.len()
                );
            }
            return Ok(());
        }
        let at = args.at.as_deref().map(parse_time).transpose().map_err(refused)?;
        let made = !args.data_dir.exists();
        std::fs::create_dir_all(&args.data_dir).map_err(|e| refused(format!("create {}: {e}", args.data_dir.display())))?;
        let restored = restore::restore(&target, &database, at).await.map_err(|e| {
            if made {
                // Only if still empty: nothing of anyone else's is removed.
                let _ = std::fs::remove_dir(&args.data_dir);
            }
            refused(e.to_string())
        })?;
        println!(
            "restored generation {} through {} ({} transactions in {} segments after its snapshot) into {}",
            restored.generation,
            shown_time(restored.restored_through_ms),
            restored.transactions,
            restored.segments,
            args.data_dir.display()
        );
    }
    let report = crate::verify(crate::VerifyArgs {
        data_dir: args.data_dir.clone(),
        database: None,
        json: false,
    })
    .await
    .map_err(|message| (1, format!("the restored database could not be verified: {message}")))?;
    if !report.ok() {
        for problem in &report.problems {
            println!("BROKEN  {problem}");
        }
        return Err((1, format!("the restored database has {} broken chains", report.problems.len())));
    }
    println!(
        "verified: {} runs and {} ledger chains intact",
        report.runs_checked, report.ledger_instances_checked
    );
    Ok(())
}

fn shown_time(ms: capstan_engine::Millis) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(|| ms.to_string(), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
}

fn parse_time(value: &str) -> Result<capstan_engine::Millis, String> {
    if let Ok(ms) = value.parse::<i64>() {
        return Ok(ms);
    }
    chrono::DateTime::parse_from_rfc3339(value)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("--at {value:?}: {e} (RFC 3339, e.g. 2026-12-07T09:30:00Z, or Unix milliseconds)"))
}

/// The replica's figures on `/metrics` (docs/metrics.md).
#[derive(Debug)]
pub struct ReplicaReadings(pub std::sync::Arc<replicate::Status>);

impl capstan_server::metrics::Reporter for ReplicaReadings {
    fn readings(&self, now: capstan_engine::Millis) -> Vec<capstan_server::metrics::Reading> {
        use capstan_server::metrics::Reading;
        use std::sync::atomic::Ordering::Relaxed;
        let status = &self.0;
        let through = status.replicated_through_ms.load(Relaxed);
        let count = |value: u64| value.min(i64::MAX as u64) as i64;
        let reading = |name, help, counter, value| Reading {
            name,
            help,
            counter,
            value,
        };
        let lag = if through == 0 { 0 } else { ((now - through) / 1000).max(0) };
        vec![
            reading(
                "capstan_replica_lag_seconds",
                "How far the continuous replica is behind: seconds since the newest point whose every commit it holds (the recovery point if the disk were lost now).",
                false,
                lag,
            ),
            reading(
                "capstan_replica_pending_bytes",
                "Compressed WAL read but not yet uploaded to the replica's target.",
                false,
                count(status.pending_bytes.load(Relaxed)),
            ),
            reading(
                "capstan_replica_segments_total",
                "WAL segments uploaded to the replica's target.",
                true,
                count(status.segments.load(Relaxed)),
            ),
            reading(
                "capstan_replica_shipped_bytes_total",
                "Compressed bytes of WAL segments uploaded to the replica's target.",
                true,
                count(status.bytes.load(Relaxed)),
            ),
            reading(
                "capstan_replica_generations_total",
                "Generations (snapshots) the replica began: at start, every snapshot interval, and when its chain broke.",
                true,
                count(status.generations.load(Relaxed)),
            ),
            reading(
                "capstan_replica_failures_total",
                "Replica rounds that failed (the target unreachable, a checkpoint kept from completing); it keeps trying.",
                true,
                count(status.failures.load(Relaxed)),
            ),
        ]
    }
}

/// Starts the replica of a SQLite server's store when one was asked for.
pub async fn start_replica(
    store: &capstan_store::SqliteStore,
    args: &ReplicaArgs,
    sources: capstan_store::Sources,
) -> Result<Option<replicate::Replica>, String> {
    let Some(settings) = args.settings()? else { return Ok(None) };
    let shown = settings.target.shown.clone();
    let replica = replicate::start(store.replication(), settings, sources)
        .await
        .map_err(|e| format!("--replicate-to {shown}: {e}"))?;
    tracing::info!(target = %shown, interval_ms = args.replica_interval_ms, "replicating the database continuously");
    Ok(Some(replica))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_in_time_is_rfc3339_with_any_offset_or_unix_milliseconds() {
        assert_eq!(parse_time("2026-12-07T09:30:00Z"), Ok(1_796_635_800_000));
        assert_eq!(parse_time("2026-12-07T10:30:00.250+01:00"), Ok(1_796_635_800_250));
        assert_eq!(parse_time("1796635800000"), Ok(1_796_635_800_000));
        let refused = parse_time("yesterday").unwrap_err();
        assert!(refused.contains("--at \"yesterday\"") && refused.contains("RFC 3339"), "{refused}");
        assert_eq!(shown_time(1_796_635_800_250), "2026-12-07T09:30:00.250Z");
    }
}
