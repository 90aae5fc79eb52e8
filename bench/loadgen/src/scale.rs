//! The `scale` workload: W1 workflows started and completed up to each checkpoint (10k, 100k,
//! 1M), and at each one what a grown database costs: starts and completions per second for the
//! stretch, bytes on disk per closed run, the server's RSS, and the latency of the first page,
//! a status filter, an attribute filter and the counts. Then, with `--retention-seconds`,
//! whether retention keeps pace: the namespace keeps closed runs one day, every closed run is
//! aged past it (as if a day had passed) and the load goes on, ageing what closes every ten
//! seconds; the closed runs held must stay bounded while the completions grow.

use crate::{activity_worker, avro, percentile, workflow_worker, Api, Ledger, Workload};
use serde_json::{json, Map, Value};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

const DAY_MS: i64 = 86_400_000;
/// The steady phase ages what closed this often: the retention period it simulates.
const AGE_EVERY: Duration = Duration::from_secs(10);

/// Where the server keeps its data: what the bench measures on disk and ages.
pub enum Database {
    Sqlite(PathBuf),
    Postgres(String),
    /// Neither is reachable from here (a server the bench did not spawn, or MySQL).
    Unknown,
}

impl Database {
    /// The database of a spawned server, from its data dir and `--database` argument.
    pub fn of(data_dir: Option<PathBuf>, server_args: Option<&str>) -> Self {
        let mut args = server_args.unwrap_or_default().split_whitespace();
        let url = std::iter::from_fn(|| args.next()).skip_while(|a| *a != "--database").nth(1);
        match (url, data_dir) {
            (Some(url), _) if url.starts_with("postgres") => Database::Postgres(url.to_string()),
            (Some(_), _) | (None, None) => Database::Unknown,
            (None, Some(dir)) => Database::Sqlite(dir.join("capstan.db")),
        }
    }

    /// Bytes on disk: the SQLite file and its WAL, or PostgreSQL's database size.
    async fn bytes(&self) -> Option<u64> {
        match self {
            Database::Sqlite(path) => {
                let files = ["", "-wal"].map(|suffix| PathBuf::from(format!("{}{suffix}", path.display())));
                Some(files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum())
            }
            Database::Postgres(url) => {
                let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.ok()?;
                tokio::spawn(connection);
                let row = client.query_one("SELECT pg_database_size(current_database())", &[]).await.ok()?;
                Some(row.get::<_, i64>(0) as u64)
            }
            Database::Unknown => None,
        }
    }

    /// Moves every closed run's close two days back, as if that much time had passed since.
    async fn age_closed_runs(&self, now_ms: i64) -> Result<u64, String> {
        let cutoff = now_ms - 2 * DAY_MS;
        match self {
            Database::Sqlite(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || {
                    let db = rusqlite::Connection::open(&path).map_err(|e| e.to_string())?;
                    db.busy_timeout(Duration::from_secs(30)).map_err(|e| e.to_string())?;
                    let sql = "UPDATE runs SET closed_at = ?1 WHERE closed_at IS NOT NULL AND closed_at > ?1";
                    db.execute(sql, [cutoff]).map(|n| n as u64).map_err(|e| e.to_string())
                })
                .await
                .map_err(|e| e.to_string())?
            }
            Database::Postgres(url) => {
                let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(connection);
                let sql = "UPDATE runs SET closed_at = $1 WHERE closed_at IS NOT NULL AND closed_at > $1";
                client.execute(sql, &[&cutoff]).await.map_err(|e| e.to_string())
            }
            Database::Unknown => Err("the bench cannot reach this server's database".into()),
        }
    }
}

pub struct Setup {
    pub load: Load,
    pub database: Database,
    pub checkpoints: Vec<usize>,
    pub workers: usize,
    pub payload_bytes: usize,
    pub retention_seconds: f64,
}

/// Who starts the workflows, where, how many at once.
#[derive(Clone)]
pub struct Load {
    pub api: Arc<Api>,
    pub queue: String,
    pub concurrency: usize,
}

/// Starts W1 workflows `from..to`, `concurrency` in flight, until every one completed.
async fn drive(load: &Load, ledger: &Arc<Ledger>, input: &str, from: usize, to: usize) {
    let gate = Arc::new(Semaphore::new(load.concurrency));
    let mut starters = Vec::new();
    for i in from..to {
        let permit = gate.clone().acquire_owned().await.expect("semaphore");
        let (api, ledger, queue, input) = (load.api.clone(), ledger.clone(), load.queue.clone(), input.to_string());
        starters.push(tokio::spawn(async move {
            let id = format!("{queue}-{i}");
            let (finished, finished_rx) = tokio::sync::oneshot::channel();
            ledger.started.lock().unwrap().insert(id.clone(), (Instant::now(), finished));
            let body = json!({"workflow_type": "bench", "workflow_id": id, "task_queue": queue,
                "input": {"codec": "avro", "blob": input}, "search_attributes": {"Bucket": (i % 100).to_string()}});
            let (status, response) = api.control(reqwest::Method::POST, "/workflows", Some(body)).await.expect("start");
            assert_eq!(status, 201, "start refused: {response}");
            let _ = finished_rx.await;
            drop(permit);
        }));
        // Keep the handles of a million starts from piling up: reap the finished ones.
        if starters.len() >= 4 * load.concurrency {
            starters.retain(|s| !s.is_finished());
        }
    }
    for starter in starters {
        starter.await.expect("starter");
    }
}

/// p50/p99 of 20 reads of each path.
async fn read_latencies(api: &Api) -> Value {
    let mut measured = Map::new();
    for (name, path) in [
        ("first_page", "/workflows?page_size=50"),
        ("status_completed", "/workflows?page_size=50&status=completed"),
        ("attribute_filter", "/workflows?page_size=50&query=Bucket%20%3D%20%2242%22"),
        ("counts", "/workflow-counts"),
        ("counts_attribute_filter", "/workflow-counts?query=Bucket%20%3D%20%2242%22"),
    ] {
        let mut times = Vec::new();
        let mut last = Value::Null;
        for _ in 0..20 {
            let start = Instant::now();
            let (status, body) = api.control(reqwest::Method::GET, path, None).await.expect("read");
            assert_eq!(status, 200, "{name} failed: {body}");
            times.push(start.elapsed().as_micros() as u64);
            last = body;
        }
        times.sort_unstable();
        let mut figures = json!({"p50_ms": percentile(&times, 0.5), "p99_ms": percentile(&times, 0.99)});
        if name.starts_with("counts") {
            figures["answer"] = last;
        }
        measured.insert(name.into(), figures);
    }
    Value::Object(measured)
}

async fn closed_runs(api: &Api) -> u64 {
    let (_, counts) = api.control(reqwest::Method::GET, "/workflow-counts", None).await.expect("counts");
    counts["completed"].as_u64().unwrap_or(0)
}

pub async fn run(setup: Setup, spawned: Option<&crate::proc_stats::SpawnedServer>) -> Value {
    let api = setup.load.api.clone();
    crate::define_bucket(&api).await;
    let payload = "x".repeat(setup.payload_bytes);
    let input = avro::argument_list_of_string(&payload);
    let ledger = Arc::new(Ledger {
        started: Mutex::new(Default::default()),
        latencies_us: Mutex::new(Vec::new()),
        completed: AtomicU64::new(0),
        activities: AtomicU64::new(0),
        done: AtomicBool::new(false),
        expected_result: avro::string_value(&payload),
    });
    let mut workers = Vec::new();
    for i in 0..setup.workers {
        let (api, ledger, queue) = (api.clone(), ledger.clone(), setup.load.queue.clone());
        workers.push(tokio::spawn(workflow_worker(
            api.clone(),
            ledger.clone(),
            Workload::W1,
            1,
            i,
            queue.clone(),
        )));
        workers.push(tokio::spawn(activity_worker(api, ledger, i, queue)));
    }
    let bytes_empty = setup.database.bytes().await;
    let mut checkpoints = Vec::new();
    let (mut done, mut bytes_before) = (0, bytes_empty);
    for &target in &setup.checkpoints {
        let began = Instant::now();
        drive(&setup.load, &ledger, &input, done, target).await;
        let seconds = began.elapsed().as_secs_f64();
        let bytes = setup.database.bytes().await;
        let per_run = match (bytes, bytes_before) {
            (Some(now), Some(before)) => Some(now.saturating_sub(before) as f64 / (target - done) as f64),
            _ => None,
        };
        let report = json!({
            "runs": target,
            "workflows_per_s": (target - done) as f64 / seconds,
            "database_bytes": bytes,
            "bytes_per_closed_run": per_run,
            "server_rss_mib": spawned.map(|s| s.current_rss_mib()),
            "reads": read_latencies(&api).await,
        });
        eprintln!("{report}");
        checkpoints.push(report);
        (done, bytes_before) = (target, bytes);
    }
    let retention = if setup.retention_seconds > 0.0 {
        Some(steady_retention(&setup, &ledger, &input, done).await)
    } else {
        None
    };
    ledger.done.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = tokio::time::timeout(Duration::from_secs(5), worker).await;
    }
    json!({"workload": "scale", "checkpoints": checkpoints, "retention": retention, "bytes_empty": bytes_empty})
}

/// Retention under a steady load: the namespace keeps closed runs a day; every closed run is
/// aged past it at the start and then every [`AGE_EVERY`]; the load goes on meanwhile.
async fn steady_retention(setup: &Setup, ledger: &Arc<Ledger>, input: &str, from: usize) -> Value {
    let api = &setup.load.api;
    let (status, body) = api
        .control(reqwest::Method::PUT, "/namespaces/default", Some(json!({"retention_days": 1})))
        .await
        .expect("set retention");
    assert_eq!(status, 200, "setting the retention failed: {body}");
    let backlog = closed_runs(api).await;
    let began = Instant::now();
    let completed_before = ledger.completed.load(Ordering::Relaxed);
    let load = {
        let (load, ledger, input) = (setup.load.clone(), ledger.clone(), input.to_string());
        let seconds = Duration::from_secs_f64(setup.retention_seconds);
        // More starts than the phase lasts for; the phase's end stops them (those in flight finish).
        tokio::spawn(async move {
            let _ = tokio::time::timeout(seconds, drive(&load, &ledger, &input, from, usize::MAX / 2)).await;
        })
    };
    let mut samples = Vec::new();
    let mut aged_at = Instant::now() - AGE_EVERY;
    while began.elapsed().as_secs_f64() < setup.retention_seconds {
        if aged_at.elapsed() >= AGE_EVERY {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            setup.database.age_closed_runs(now_ms).await.expect("age the closed runs");
            aged_at = Instant::now();
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        samples.push(
            json!({"at_s": began.elapsed().as_secs(), "closed_runs_held": closed_runs(api).await,
            "completed_since": ledger.completed.load(Ordering::Relaxed) - completed_before}),
        );
    }
    let _ = load.await;
    let completed = ledger.completed.load(Ordering::Relaxed) - completed_before;
    // Removed between two samples: what was held, plus what closed since, less what is held.
    let held = |s: &Value| s["closed_runs_held"].as_i64().unwrap_or(0);
    let mut purged_rates = Vec::new();
    let mut previous = json!({"at_s": 0, "closed_runs_held": backlog, "completed_since": 0});
    for sample in &samples {
        let closed = sample["completed_since"].as_i64().unwrap_or(0) - previous["completed_since"].as_i64().unwrap_or(0);
        let seconds = (sample["at_s"].as_f64().unwrap_or(0.0) - previous["at_s"].as_f64().unwrap_or(0.0)).max(1.0);
        purged_rates.push((held(&previous) + closed - held(sample)) as f64 / seconds);
        previous = sample.clone();
    }
    json!({
        "backlog_aged": backlog,
        "seconds": setup.retention_seconds,
        "completed_meanwhile": completed,
        "workflows_per_s_meanwhile": completed as f64 / setup.retention_seconds,
        "purged_meanwhile": backlog as i64 + completed as i64 - held(&previous),
        "purged_per_s_peak": purged_rates.iter().cloned().fold(0.0, f64::max),
        "closed_runs_held_max": samples.iter().map(held).max(),
        "closed_runs_held_at_end": held(&previous),
        "samples": samples,
    })
}
