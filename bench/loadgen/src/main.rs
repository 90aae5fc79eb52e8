//! `capstan-bench`: a load generator that speaks the DW worker protocol and control plane
//! directly. It starts workflows (as fast as possible with N in flight, or at an offered rate),
//! answers their workflow and activity tasks with M worker loops, verifies every result and
//! (optionally) every history, and reports throughput, start→result latency, and the server's
//! CPU seconds per workflow and peak RSS when it spawned the server itself.

mod avro;
mod matching;
mod overload;
mod proc_stats;
mod scale;

use clap::{Parser, ValueEnum};
use reqwest::Client;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq)]
enum Workload {
    /// DW Standard Workflow v1: one echo activity, payload in and out.
    W1,
    /// Ten sequential echo activities (`--steps N`: N of them).
    W10,
    /// Ten echo local activities (`--steps N`: N), run by the workflow worker and recorded with
    /// `record_local_activity` in the task's completion, as the SDKs record theirs.
    Local,
    /// One durable 1 s timer.
    Timer,
    /// Wait for a signal sent by the client right after the start.
    Signal,
    /// Idle long polls held open while /api/health latency is measured.
    IdlePolls,
    /// Start --workflows workflows and leave them open (no workers); report the server's RSS.
    Open,
    /// Two tenants' backlogs (--workflows each), weighted 3:1: their shares of dispatch.
    Fairness,
    /// A priority-1 start behind --workflows priority-5 ones: its place in the dispatch order.
    Priority,
    /// A backlog drained under --rate-limit and/or --max-leased, by workers on every --node.
    Limits,
    /// W1 up to each of --checkpoints (10k, 100k, 1M): per stretch wf/s, bytes per closed run,
    /// RSS, list/count/filter latency; then with --retention-seconds, retention under that load.
    Scale,
    /// Starts offered at --overload-multiple times what the machine sustains, for --seconds:
    /// refusals, the admitted starts' latency against the unloaded one, memory, recovery, and
    /// `capstan verify` against the acknowledged starts. Spawns its own servers (--spawn).
    Overload,
}

#[derive(Parser, Debug)]
#[command(name = "capstan-bench", about = "Load generator for Capstan (DW v2 wire protocol)")]
struct Args {
    /// Workload to run.
    #[arg(long, value_enum, default_value = "w1")]
    workload: Workload,
    /// Server origin to drive. Without it, a `capstan serve` is spawned (see --spawn).
    #[arg(long)]
    server: Option<String>,
    /// capstan binary to spawn when --server is absent.
    #[arg(long, default_value = "target/release/capstan")]
    spawn: String,
    /// Extra `capstan serve` arguments for the spawned server (e.g. "--database postgres://…").
    #[arg(long, allow_hyphen_values = true)]
    server_args: Option<String>,
    /// Workflows to run.
    #[arg(long, default_value_t = 2000)]
    workflows: usize,
    /// Workflows in flight at once (closed-loop mode).
    #[arg(long, default_value_t = 50)]
    concurrency: usize,
    /// Offered start rate per second (open-loop mode); overrides --concurrency pacing.
    #[arg(long)]
    rate: Option<f64>,
    /// Workflow-task worker loops and activity worker loops (each).
    #[arg(long, default_value_t = 16)]
    workers: usize,
    /// Bytes of the string payload passed in and echoed back.
    #[arg(long, default_value_t = 1024)]
    payload_bytes: usize,
    /// Idle long polls to hold (idle-polls workload).
    #[arg(long, default_value_t = 1000)]
    idle_polls: usize,
    /// Check every history's hash chain and event counts after the run (slower).
    #[arg(long)]
    verify_histories: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Sequential activities of a `w10` workflow (W-N): how server cost grows with history.
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Declare the workloads' activity type (`echo`) a consequential action with this recovery
    /// mode first (e.g. `non_atomic`), so every dispatch is ledgered: the ledger's cost.
    #[arg(long)]
    declare_action: Option<String>,
    /// `overload`: the offered load, as a multiple of what the machine sustains.
    #[arg(long, default_value_t = 3.0)]
    overload_multiple: f64,
    /// `overload`: run the spawned servers on this CPU only (run the generator on another with
    /// `taskset -c M`).
    #[arg(long)]
    server_cpu: Option<usize>,
    /// Matching workloads and `overload`: how long to drain the backlog, or to overload.
    #[arg(long, default_value_t = 60.0)]
    seconds: f64,
    /// Matching workloads: how long a worker holds each workflow task before completing it.
    #[arg(long, default_value_t = 0)]
    think_ms: u64,
    /// `limits`: the queue's dispatch rate limit (workflow tasks per second).
    #[arg(long)]
    rate_limit: Option<f64>,
    /// `limits`: the queue's cap on workflow tasks leased at once.
    #[arg(long)]
    max_leased: Option<u64>,
    /// Matching workloads: more nodes of the same cluster; workers poll every node in turn.
    #[arg(long)]
    node: Vec<String>,
    /// `scale`: the run totals to measure at.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    checkpoints: Vec<usize>,
    /// `scale`: seconds of steady load with a retention after the last checkpoint (0: none).
    #[arg(long, default_value_t = 0.0)]
    retention_seconds: f64,
}

const WORKER_HEADERS: [(&str, &str); 2] = [("X-Durable-Workflow-Protocol-Version", "1.20"), ("X-Namespace", "default")];
const CONTROL_HEADERS: [(&str, &str); 2] = [("X-Durable-Workflow-Control-Plane-Version", "2"), ("X-Namespace", "default")];

struct Api {
    http: Client,
    base: String,
    /// Bytes of every worker-plane response body read (what the server served workers).
    served: AtomicU64,
}

impl Api {
    async fn worker(&self, path: &str, body: Value) -> anyhow_lite::Result<(u16, Value)> {
        let mut request = self.http.post(format!("{}/api{path}", self.base)).json(&body);
        for (k, v) in WORKER_HEADERS {
            request = request.header(k, v);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let body = response.bytes().await?;
        self.served.fetch_add(body.len() as u64, Ordering::Relaxed);
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }

    async fn control(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> anyhow_lite::Result<(u16, Value)> {
        let mut request = self.http.request(method, format!("{}/api{path}", self.base));
        for (k, v) in CONTROL_HEADERS {
            request = request.header(k, v);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        Ok((status, response.json().await.unwrap_or(Value::Null)))
    }
}

mod anyhow_lite {
    pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;
}

/// Shared run state: start instants, latencies, counters.
struct Ledger {
    /// In-flight workflows: when each started, and whom to tell when it finished.
    started: Mutex<HashMap<String, (Instant, tokio::sync::oneshot::Sender<()>)>>,
    latencies_us: Mutex<Vec<u64>>,
    completed: AtomicU64,
    activities: AtomicU64,
    done: AtomicBool,
    expected_result: String,
}

fn history_events(task: &Value) -> &[Value] {
    task["history_events"].as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn count(events: &[Value], event_type: &str) -> usize {
    events.iter().filter(|e| e["event_type"] == event_type).count()
}

/// Decides the next commands of a workflow task from its history, per workload.
fn decide(workload: Workload, steps: usize, task: &Value, events: &[Value]) -> Vec<Value> {
    let input = task["arguments"].clone();
    let last_result = events
        .iter()
        .rev()
        .find(|e| e["event_type"] == "ActivityCompleted")
        .map(|e| e["payload"]["result"].clone());
    let activity = |arguments: Value| json!({"type": "schedule_activity", "activity_type": "echo", "arguments": arguments, "start_to_close_timeout": 60});
    match workload {
        Workload::W1 | Workload::W10 => {
            let needed = if workload == Workload::W1 { 1 } else { steps };
            let done = count(events, "ActivityCompleted");
            let scheduled = count(events, "ActivityScheduled");
            if done >= needed {
                vec![json!({"type": "complete_workflow", "result": {"codec": "avro", "blob": last_result.unwrap_or(Value::Null)}})]
            } else if scheduled == done {
                vec![activity(input)]
            } else {
                vec![] // waiting for the running activity: nothing new
            }
        }
        Workload::Timer => {
            if count(events, "TimerFired") > 0 {
                vec![json!({"type": "complete_workflow", "result": input["blob"].clone()})]
            } else if count(events, "TimerScheduled") == 0 {
                vec![json!({"type": "start_timer", "delay_seconds": 1})]
            } else {
                vec![]
            }
        }
        Workload::Signal => {
            if task["signal_name"] == "go" || count(events, "SignalApplied") > 0 {
                vec![json!({"type": "complete_workflow", "result": input["blob"].clone()})]
            } else if count(events, "SignalWaitOpened") == 0 {
                vec![json!({"type": "open_signal_wait", "signal_name": "go"})]
            } else {
                vec![]
            }
        }
        Workload::Local => {
            let record = json!({
                "type": "record_local_activity", "activity_type": "echo", "execution_mode": "local",
                "arguments": input, "outcome": "completed", "result": input,
                "attempts": [{"attempt_number": 1, "outcome": "completed", "duration_ms": 0}],
            });
            let mut commands = vec![record; steps];
            commands.push(json!({"type": "complete_workflow", "result": input}));
            commands
        }
        Workload::IdlePolls
        | Workload::Open
        | Workload::Fairness
        | Workload::Priority
        | Workload::Limits
        | Workload::Overload
        | Workload::Scale => vec![],
    }
}

async fn register(api: &Api, worker_id: &str, queue: &str) {
    let (status, body) = api
        .worker(
            "/worker/register",
            json!({"worker_id": worker_id, "task_queue": queue, "runtime": "rust", "sdk_version": "capstan-bench"}),
        )
        .await
        .expect("register");
    assert!(status < 300, "register failed: {status} {body}");
}

/// The whole history of a polled workflow task: the inline page, then every further page (as a
/// worker replaying from the first event fetches them).
async fn full_history(api: &Api, worker_id: &str, task: &Value) -> Vec<Value> {
    let mut events = history_events(task).to_vec();
    let mut token = task["next_history_page_token"].clone();
    while let Some(next) = token.as_str() {
        let path = format!("/worker/workflow-tasks/{}/history", task["task_id"].as_str().unwrap_or_default());
        let body = json!({"next_history_page_token": next, "lease_owner": worker_id,
                          "workflow_task_attempt": task["workflow_task_attempt"], "history_page_size": 1000});
        let (status, page) = api.worker(&path, body).await.expect("history page");
        assert_eq!(status, 200, "history page refused: {page}");
        events.extend(history_events_of(&page).iter().cloned());
        token = page["next_history_page_token"].clone();
    }
    events
}

fn history_events_of(page: &Value) -> &[Value] {
    page["history_events"].as_array().map(Vec::as_slice).unwrap_or(&[])
}

async fn workflow_worker(api: Arc<Api>, ledger: Arc<Ledger>, workload: Workload, steps: usize, index: usize, queue: String) {
    let worker_id = format!("bench-wf-{index}");
    register(&api, &worker_id, &queue).await;
    let mut polls = 0u64;
    while !ledger.done.load(Ordering::Relaxed) {
        polls += 1;
        let poll = json!({"worker_id": worker_id, "task_queue": queue, "timeout_seconds": 1, "history_page_size": 1000, "poll_request_id": format!("{worker_id}-{polls}")});
        let Ok((200, body)) = api.worker("/worker/workflow-tasks/poll", poll).await else {
            continue;
        };
        let task = &body["task"];
        if task.is_null() {
            continue;
        }
        let task_id = task["task_id"].as_str().expect("task_id").to_string();
        let attempt = task["workflow_task_attempt"].clone();
        let events = full_history(&api, &worker_id, task).await;
        let commands = decide(workload, steps, task, &events);
        let finishing = commands.iter().any(|c| c["type"] == "complete_workflow");
        let (path, request) = if commands.is_empty() {
            (
                format!("/worker/workflow-tasks/{task_id}/fail"),
                json!({"lease_owner": worker_id, "workflow_task_attempt": attempt, "failure": {"message": "waiting", "type": "WorkflowTaskWaitingForHistory"}}),
            )
        } else {
            (
                format!("/worker/workflow-tasks/{task_id}/complete"),
                json!({"lease_owner": worker_id, "workflow_task_attempt": attempt, "commands": commands}),
            )
        };
        let (status, response) = api.worker(&path, request).await.expect("report");
        assert!(status == 200, "workflow task report refused: {status} {response}");
        if workload == Workload::Local {
            ledger.activities.fetch_add(steps as u64, Ordering::Relaxed);
        }
        if finishing {
            let workflow_id = task["workflow_id"].as_str().unwrap_or_default().to_string();
            let finished = ledger.started.lock().unwrap().remove(&workflow_id);
            if let Some((started, waiter)) = finished {
                ledger.latencies_us.lock().unwrap().push(started.elapsed().as_micros() as u64);
                ledger.completed.fetch_add(1, Ordering::Relaxed);
                let _ = waiter.send(());
            }
        }
    }
}

async fn activity_worker(api: Arc<Api>, ledger: Arc<Ledger>, index: usize, queue: String) {
    let worker_id = format!("bench-act-{index}");
    register(&api, &worker_id, &queue).await;
    let mut polls = 0u64;
    while !ledger.done.load(Ordering::Relaxed) {
        polls += 1;
        let poll =
            json!({"worker_id": worker_id, "task_queue": queue, "timeout_seconds": 1, "poll_request_id": format!("{worker_id}-{polls}")});
        let Ok((200, body)) = api.worker("/worker/activity-tasks/poll", poll).await else {
            continue;
        };
        let task = &body["task"];
        if task.is_null() {
            continue;
        }
        // Echo: the result is the first argument.
        let result = avro::first_argument(task["arguments"]["blob"].as_str().unwrap_or_default());
        let request = json!({"activity_attempt_id": task["activity_attempt_id"], "lease_owner": worker_id, "result": {"codec": "avro", "blob": result}});
        let path = format!("/worker/activity-tasks/{}/complete", task["task_id"].as_str().unwrap_or_default());
        let (status, response) = api.worker(&path, request).await.expect("activity report");
        assert!(status == 200, "activity report refused: {status} {response}");
        ledger.activities.fetch_add(1, Ordering::Relaxed);
    }
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index] as f64 / 1000.0
}

async fn idle_polls(api: Arc<Api>, args: &Args, queue: &str) -> Value {
    let worker_id = "bench-idle";
    register(&api, worker_id, queue).await;
    let held = Arc::new(AtomicU64::new(0));
    let mut polls = Vec::new();
    for i in 0..args.idle_polls {
        let api = api.clone();
        let queue = queue.to_string();
        let held = held.clone();
        polls.push(tokio::spawn(async move {
            held.fetch_add(1, Ordering::Relaxed);
            let poll = json!({"worker_id": worker_id, "task_queue": queue, "timeout_seconds": 30, "poll_request_id": format!("idle-{i}")});
            let _ = api.worker("/worker/workflow-tasks/poll", poll).await;
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut latencies = Vec::new();
    for _ in 0..200 {
        let start = Instant::now();
        let (status, _) = api.control(reqwest::Method::GET, "/health", None).await.expect("health");
        assert_eq!(status, 200);
        latencies.push(start.elapsed().as_micros() as u64);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    latencies.sort_unstable();
    for poll in polls {
        poll.abort();
    }
    json!({"idle_polls": args.idle_polls, "health_p50_ms": percentile(&latencies, 0.5), "health_p99_ms": percentile(&latencies, 0.99)})
}

async fn verify(api: &Api, workflow_ids: &[String], expected_blob: &str, workload: Workload, steps: usize, histories: bool) -> usize {
    let mut problems = 0;
    for id in workflow_ids {
        let (status, describe) = api
            .control(reqwest::Method::GET, &format!("/workflows/{id}"), None)
            .await
            .expect("describe");
        let ok = status == 200 && describe["status"] == "completed" && describe["output_envelope"]["blob"] == expected_blob;
        if !ok {
            problems += 1;
            eprintln!("workflow {id}: {status} {}", describe["status"]);
            continue;
        }
        if histories {
            let run = describe["run_id"].as_str().unwrap_or_default();
            let (_, history) = api
                .control(
                    reqwest::Method::GET,
                    &format!("/workflows/{id}/runs/{run}/history?page_size=1000"),
                    None,
                )
                .await
                .expect("history");
            let events = history["events"].as_array().cloned().unwrap_or_default();
            let mut previous = "0".repeat(64);
            for (i, event) in events.iter().enumerate() {
                if event["sequence"] != json!(i + 1) || event["prev_hash"] != json!(previous) {
                    problems += 1;
                    eprintln!("workflow {id}: broken chain at event {}", i + 1);
                    break;
                }
                previous = event["hash"].as_str().unwrap_or_default().to_string();
            }
            let activities = match workload {
                Workload::W1 => 1,
                Workload::W10 | Workload::Local => steps,
                _ => 0,
            };
            if count(&events, "ActivityCompleted") != activities || count(&events, "WorkflowCompleted") != 1 {
                problems += 1;
                eprintln!("workflow {id}: unexpected history shape");
            }
        }
    }
    problems
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if args.workload == Workload::Overload {
        let setup = overload::Setup {
            binary: args.spawn.clone(),
            server_args: args.server_args.clone(),
            server_cpu: args.server_cpu,
            seconds: args.seconds,
            multiple: args.overload_multiple,
        };
        println!("{}", overload::run(&setup).await);
        return;
    }
    let mut spawned = None;
    let base = match &args.server {
        Some(url) => url.trim_end_matches('/').to_string(),
        None => {
            let server = proc_stats::SpawnedServer::start(&args.spawn, args.server_args.as_deref()).await;
            let url = server.url.clone();
            spawned = Some(server);
            url
        }
    };
    let http = Client::builder()
        .pool_max_idle_per_host(1024)
        .timeout(Duration::from_secs(120))
        .build()
        .expect("http client");
    let api = Arc::new(Api {
        http,
        base: base.clone(),
        served: AtomicU64::new(0),
    });
    let queue = format!("bench-{}", std::process::id());
    if let Some(mode) = &args.declare_action {
        let mut request = api
            .http
            .put(format!("{base}/api/action-definitions/echo"))
            .json(&json!({"recovery_mode": mode}));
        for (name, value) in CONTROL_HEADERS {
            request = request.header(name, value);
        }
        let response = request.send().await.expect("declare the action");
        assert!(
            response.status().is_success(),
            "declaring the action failed: {}",
            response.text().await.unwrap_or_default()
        );
    }
    let cpu_before = spawned.as_ref().map(|s| s.cpu_seconds()).unwrap_or(0.0);

    if matches!(args.workload, Workload::Fairness | Workload::Priority | Workload::Limits) {
        let mut nodes = vec![api.clone()];
        nodes.extend(args.node.iter().map(|url| {
            Arc::new(Api {
                http: api.http.clone(),
                base: url.trim_end_matches('/').to_string(),
                served: AtomicU64::new(0),
            })
        }));
        let setup = matching::Setup {
            nodes,
            queue: queue.clone(),
            workflows: args.workflows,
            concurrency: args.concurrency,
            workers: args.workers,
            seconds: args.seconds,
            think_ms: args.think_ms,
            rate_limit: args.rate_limit,
            max_leased: args.max_leased,
        };
        let report = match args.workload {
            Workload::Fairness => matching::fairness(&setup).await,
            Workload::Priority => matching::priority(&setup).await,
            _ => matching::limits(&setup).await,
        };
        println!("{report}");
        return;
    }

    if args.workload == Workload::Scale {
        let setup = scale::Setup {
            load: scale::Load {
                api: api.clone(),
                queue: queue.clone(),
                concurrency: args.concurrency,
            },
            database: scale::Database::of(spawned.as_ref().map(|s| s.data_dir()), args.server_args.as_deref()),
            checkpoints: args.checkpoints.clone(),
            workers: args.workers,
            payload_bytes: args.payload_bytes,
            retention_seconds: args.retention_seconds,
        };
        println!("{}", scale::run(setup, spawned.as_ref()).await);
        return;
    }

    if args.workload == Workload::IdlePolls {
        let report = idle_polls(api.clone(), &args, &queue).await;
        let rss = spawned.as_ref().map(|s| s.peak_rss_mib());
        println!(
            "{}",
            json!({"workload": "idle-polls", "report": report, "server_peak_rss_mib": rss})
        );
        return;
    }

    if args.workload == Workload::Open {
        let input = avro::argument_list_of_string(&"x".repeat(args.payload_bytes));
        let rss_idle = spawned.as_ref().map(|s| s.current_rss_mib());
        define_bucket(&api).await;
        let begin = Instant::now();
        let gate = Arc::new(Semaphore::new(args.concurrency));
        let mut starts = Vec::new();
        for i in 0..args.workflows {
            let permit = gate.clone().acquire_owned().await.expect("semaphore");
            let (api, queue, input) = (api.clone(), queue.clone(), input.clone());
            starts.push(tokio::spawn(async move {
                let body = json!({"workflow_type": "bench", "workflow_id": format!("{queue}-open-{i}"), "task_queue": queue,
                    "input": {"codec": "avro", "blob": input}, "search_attributes": {"Bucket": (i % 100).to_string()}});
                let (status, response) = api.control(reqwest::Method::POST, "/workflows", Some(body)).await.expect("start");
                assert_eq!(status, 201, "start refused: {response}");
                drop(permit);
            }));
        }
        for start in starts {
            start.await.expect("start");
        }
        let elapsed = begin.elapsed().as_secs_f64();
        // Listing at this size: the first page, a status filter, a search-attribute filter, the
        // bucket counts, and a page halfway down, reached by an offset token (what paging cost
        // before keyset tokens; the server still accepts them) and by the keyset token the
        // server hands out there.
        use base64::Engine;
        let halfway = base64::engine::general_purpose::STANDARD.encode((args.workflows / 2).to_string());
        let (status, body) = api
            .control(
                reqwest::Method::GET,
                &format!("/workflows?page_size=50&next_page_token={halfway}"),
                None,
            )
            .await
            .expect("list");
        assert_eq!(status, 200, "list failed: {body}");
        let keyset = body["next_page_token"].as_str().unwrap_or_default().to_string();
        let mut listing = serde_json::Map::new();
        for (name, path) in [
            ("first_page", "/workflows?page_size=50".to_string()),
            ("status_running", "/workflows?page_size=50&status=running".to_string()),
            (
                "attribute_filter",
                "/workflows?page_size=50&query=Bucket%20%3D%20%2242%22".to_string(),
            ),
            ("counts", "/workflow-counts".to_string()),
            (
                "halfway_offset_token",
                format!("/workflows?page_size=50&next_page_token={}", urlencode(&halfway)),
            ),
            (
                "halfway_keyset_token",
                format!("/workflows?page_size=50&next_page_token={}", urlencode(&keyset)),
            ),
        ] {
            let mut times = Vec::new();
            for _ in 0..20 {
                let start = Instant::now();
                let (status, body) = api.control(reqwest::Method::GET, &path, None).await.expect("list");
                assert_eq!(status, 200, "list failed: {body}");
                assert!(
                    name == "counts" || !body["workflows"].as_array().map(Vec::is_empty).unwrap_or(true),
                    "{name} listed nothing"
                );
                times.push(start.elapsed().as_micros() as u64);
            }
            times.sort_unstable();
            listing.insert(
                name.into(),
                json!({"p50_ms": percentile(&times, 0.5), "p99_ms": percentile(&times, 0.99)}),
            );
        }
        let report = json!({
            "workload": "open",
            "list_latency": listing,
            "open_workflows": args.workflows,
            "starts_per_s": args.workflows as f64 / elapsed,
            "server_rss_idle_mib": rss_idle,
            "server_rss_with_open_workflows_mib": spawned.as_ref().map(|s| s.current_rss_mib()),
            "server_peak_rss_mib": spawned.as_ref().map(|s| s.peak_rss_mib()),
        });
        println!("{report}");
        return;
    }

    let payload = "x".repeat(args.payload_bytes);
    let input_blob = avro::argument_list_of_string(&payload);
    let expected_result = avro::string_value(&payload);
    let ledger = Arc::new(Ledger {
        started: Mutex::new(HashMap::new()),
        latencies_us: Mutex::new(Vec::with_capacity(args.workflows)),
        completed: AtomicU64::new(0),
        activities: AtomicU64::new(0),
        done: AtomicBool::new(false),
        expected_result: expected_result.clone(),
    });
    let mut workers = Vec::new();
    for i in 0..args.workers {
        workers.push(tokio::spawn(workflow_worker(
            api.clone(),
            ledger.clone(),
            args.workload,
            args.steps,
            i,
            queue.clone(),
        )));
        if matches!(args.workload, Workload::W1 | Workload::W10) {
            workers.push(tokio::spawn(activity_worker(api.clone(), ledger.clone(), i, queue.clone())));
        }
    }

    let begin = Instant::now();
    let in_flight = Arc::new(Semaphore::new(args.concurrency));
    let mut ids = Vec::with_capacity(args.workflows);
    let mut starters = Vec::new();
    for i in 0..args.workflows {
        let id = format!("{queue}-{i}");
        ids.push(id.clone());
        if let Some(rate) = args.rate {
            let due = begin + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
        let permit = in_flight.clone().acquire_owned().await.expect("semaphore");
        let api = api.clone();
        let ledger = ledger.clone();
        let queue = queue.clone();
        let input = input_blob.clone();
        let workload = args.workload;
        starters.push(tokio::spawn(async move {
            let (finished, finished_rx) = tokio::sync::oneshot::channel();
            ledger.started.lock().unwrap().insert(id.clone(), (Instant::now(), finished));
            let body = json!({"workflow_type": "bench", "workflow_id": id, "task_queue": queue, "input": {"codec": "avro", "blob": input}});
            let (status, response) = api.control(reqwest::Method::POST, "/workflows", Some(body)).await.expect("start");
            assert_eq!(status, 201, "start refused: {response}");
            if workload == Workload::Signal {
                let (status, response) = api
                    .control(
                        reqwest::Method::POST,
                        &format!("/workflows/{id}/signal/go"),
                        Some(json!({"input": {"codec": "avro", "blob": input}})),
                    )
                    .await
                    .expect("signal");
                assert_eq!(status, 202, "signal refused: {response}");
            }
            // Hold the permit until this workflow finished (closed loop).
            let _ = finished_rx.await;
            drop(permit);
        }));
    }
    for starter in starters {
        starter.await.expect("starter");
    }
    let elapsed = begin.elapsed().as_secs_f64();
    ledger.done.store(true, Ordering::Relaxed);
    let cpu = spawned.as_ref().map(|s| s.cpu_seconds() - cpu_before);
    let rss = spawned.as_ref().map(|s| s.peak_rss_mib());
    for worker in workers {
        let _ = tokio::time::timeout(Duration::from_secs(5), worker).await;
    }

    let expected_output = match args.workload {
        Workload::W1 | Workload::W10 => ledger.expected_result.clone(),
        _ => input_blob.clone(),
    };
    let served = api.served.load(Ordering::Relaxed);
    let problems = verify(&api, &ids, &expected_output, args.workload, args.steps, args.verify_histories).await;
    let mut latencies = ledger.latencies_us.lock().unwrap().clone();
    latencies.sort_unstable();
    let completed = ledger.completed.load(Ordering::Relaxed);
    let report = json!({
        "workload": format!("{:?}", args.workload).to_lowercase(),
        "server": if spawned.is_some() { format!("spawned {} {}", args.spawn, args.server_args.clone().unwrap_or_default()) } else { base.clone() },
        "workflows": args.workflows,
        "completed": completed,
        "concurrency": args.concurrency,
        "offered_rate": args.rate,
        "workers": args.workers,
        "payload_bytes": args.payload_bytes,
        "elapsed_s": elapsed,
        "workflows_per_s": completed as f64 / elapsed,
        "activities_per_s": ledger.activities.load(Ordering::Relaxed) as f64 / elapsed,
        "latency_ms": {"p50": percentile(&latencies, 0.5), "p90": percentile(&latencies, 0.9), "p99": percentile(&latencies, 0.99)},
        "server_cpu_s_per_workflow": cpu.map(|c| c / completed.max(1) as f64),
        "steps": if matches!(args.workload, Workload::W10 | Workload::Local) { args.steps } else { 1 },
        "server_cpu_ms_per_step": cpu.map(|c| c * 1000.0 / ledger.activities.load(Ordering::Relaxed).max(1) as f64),
        "worker_bytes_served_per_step": served / ledger.activities.load(Ordering::Relaxed).max(1),
        "server_peak_rss_mib": rss,
        "verification_problems": problems,
    });
    if args.json {
        println!("{report}");
    } else {
        println!("{}", serde_json::to_string_pretty(&report).unwrap());
    }
    drop(spawned);
    if problems > 0 || completed as usize != args.workflows {
        std::process::exit(1);
    }
}

/// Defines the keyword attribute `Bucket` the listing filters use (attributes are typed and
/// defined per namespace; an existing definition is fine).
async fn define_bucket(api: &Api) {
    let definition = json!({"name": "Bucket", "type": "keyword"});
    let (status, body) = api
        .control(reqwest::Method::POST, "/search-attributes", Some(definition))
        .await
        .expect("define Bucket");
    assert!(matches!(status, 200 | 201 | 409), "defining Bucket failed: {body}");
}

/// Percent-encodes a query value (page tokens are base64: `+`, `/` and `=` need it).
fn urlencode(value: &str) -> String {
    percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC).to_string()
}
