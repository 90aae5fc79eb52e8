//! Everyday operator commands over HTTP, mirroring `dw`: workflows, workers, task queues,
//! schedules and the server itself. Arguments and results are JSON for people; the CLI turns
//! them into (and out of) the Avro envelopes the wire carries.

use crate::cli::{finish, parse_json, print, print_task_failure, Client, Connection, Output};
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Map, Value};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum WorkflowCommand {
    /// Start a workflow.
    Start {
        workflow_type: String,
        #[arg(long)]
        task_queue: String,
        #[arg(long)]
        workflow_id: Option<String>,
        /// Arguments as a JSON list (or one JSON value: the single argument).
        #[arg(long)]
        input: Option<String>,
        #[arg(long)]
        business_key: Option<String>,
        /// Pin the run to a worker build.
        #[arg(long)]
        build_id: Option<String>,
        #[arg(long)]
        execution_timeout_seconds: Option<i64>,
        /// 0 (most urgent) to 9; 5 when not given.
        #[arg(long)]
        priority: Option<i64>,
        /// The fairness class (a tenant, say) that shares dispatch within a priority.
        #[arg(long)]
        fairness_key: Option<String>,
        /// The class's share of dispatch, 1 to 1000 (default 1).
        #[arg(long)]
        fairness_weight: Option<i64>,
    },
    /// List workflows (newest first).
    List {
        /// running, completed, failed or paused.
        #[arg(long)]
        status: Option<String>,
        #[arg(long = "type")]
        workflow_type: Option<String>,
        /// A visibility query (`Amount > 10 AND Tier = "gold"`) or free text.
        #[arg(long)]
        query: Option<String>,
        #[arg(long, default_value_t = 50)]
        page_size: usize,
    },
    /// Describe a workflow's current run.
    Describe { workflow_id: String },
    /// Print a run's history; `--follow` waits for new events until the run closes.
    History {
        workflow_id: String,
        #[arg(long)]
        run_id: Option<String>,
        #[arg(long)]
        follow: bool,
    },
    /// Who queried a workflow (queries write no history): its audit trail, newest first.
    Audit {
        workflow_id: String,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Send a signal.
    Signal {
        workflow_id: String,
        name: String,
        #[arg(long)]
        input: Option<String>,
    },
    /// Ask a query (a worker answers).
    Query {
        workflow_id: String,
        name: String,
        #[arg(long)]
        input: Option<String>,
    },
    /// Send an update and wait for its result.
    Update {
        workflow_id: String,
        name: String,
        #[arg(long)]
        input: Option<String>,
        /// accepted or completed.
        #[arg(long, default_value = "completed")]
        wait_for: String,
    },
    Cancel {
        workflow_id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    Terminate {
        workflow_id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Hold a running workflow: none of its workflow or activity tasks goes to a worker until it
    /// is resumed (timers, signals and timeouts go on).
    Pause {
        workflow_id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Let a paused workflow go on.
    Resume {
        workflow_id: String,
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum WorkerCommand {
    /// Registered workers (with stale and draining status).
    List {
        #[arg(long)]
        task_queue: Option<String>,
    },
    Describe {
        worker_id: String,
    },
}

#[derive(Subcommand)]
pub enum TaskQueueCommand {
    /// Task queues with backlog and pollers.
    List,
    /// One queue: counts, pollers, current leases, diagnostics.
    Describe { task_queue: String },
    /// One queue's ready tasks by priority and fairness class, with each class's recent dispatch.
    Shares { task_queue: String },
    /// The flow-control limits set on a queue, per task kind.
    Limits { task_queue: String },
    /// Set (or with --clear, remove) a queue's flow-control limits for one task kind, live.
    Limit {
        task_queue: String,
        /// workflow or activity.
        #[arg(long)]
        kind: String,
        /// Leases per second, on average.
        #[arg(long)]
        rate: Option<f64>,
        /// Leases allowed at once after a quiet spell (default: the rate rounded up).
        #[arg(long)]
        burst: Option<u32>,
        /// Tasks leased at once, at most.
        #[arg(long)]
        max_leased: Option<u32>,
        /// Every fairness key's leases per second, on average (unless it has its own).
        #[arg(long)]
        key_rate: Option<f64>,
        /// Every fairness key's burst.
        #[arg(long)]
        key_burst: Option<u32>,
        /// Every fairness key's tasks leased at once, at most.
        #[arg(long)]
        key_max_leased: Option<u32>,
        /// One fairness key's own limits, e.g. "tenant-a:rate=5,burst=10,max_leased=3"
        /// (repeatable; "tenant-a:" alone frees the key from the default).
        #[arg(long = "key-limit")]
        key_limits: Vec<String>,
        /// One fairness key's weight, e.g. "tenant-a=3" (repeatable).
        #[arg(long = "weight")]
        weights: Vec<String>,
        /// Remove the kind's limits.
        #[arg(long, conflicts_with_all = ["rate", "burst", "max_leased", "key_rate", "key_burst", "key_max_leased", "key_limits", "weights"])]
        clear: bool,
    },
    /// Pause a queue's workflow or activity tasks (both without --kind): none goes to a worker
    /// until they are resumed; the backlog stays.
    Pause {
        task_queue: String,
        /// workflow or activity.
        #[arg(long)]
        kind: Option<String>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Let a paused queue's tasks go to workers again.
    Resume {
        task_queue: String,
        /// workflow or activity.
        #[arg(long)]
        kind: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum ScheduleCommand {
    /// Create a schedule (give --cron and/or --every).
    Create {
        schedule_id: String,
        #[arg(long = "type")]
        workflow_type: String,
        #[arg(long)]
        task_queue: String,
        /// Cron expression (repeatable), e.g. "0 3 * * *" or "@hourly".
        #[arg(long)]
        cron: Vec<String>,
        /// Interval (repeatable), e.g. PT30S, PT1H, 1d.
        #[arg(long)]
        every: Vec<String>,
        #[arg(long)]
        timezone: Option<String>,
        #[arg(long)]
        input: Option<String>,
        /// skip, buffer_one, buffer_all, cancel_other, terminate_other or allow_all.
        #[arg(long)]
        overlap_policy: Option<String>,
        #[arg(long)]
        paused: bool,
    },
    List,
    Describe {
        schedule_id: String,
    },
    Pause {
        schedule_id: String,
        #[arg(long)]
        note: Option<String>,
    },
    Resume {
        schedule_id: String,
        #[arg(long)]
        note: Option<String>,
    },
    /// Fire now.
    Trigger {
        schedule_id: String,
    },
    Delete {
        schedule_id: String,
    },
    /// The schedule's audit history.
    History {
        schedule_id: String,
    },
}

#[derive(Subcommand)]
pub enum ServerCommand {
    /// Liveness and the database check.
    Health,
    /// The cluster-info document (versions, capabilities, limits).
    Info,
}

/// JSON from the command line as the arguments envelope: a list is the argument list, anything
/// else the single argument.
pub(crate) fn arguments(input: Option<&str>) -> Result<Value, String> {
    let list = match input {
        None => Vec::new(),
        Some(text) => match parse_json("input", text)? {
            Value::Array(items) => items,
            other => vec![other],
        },
    };
    Ok(capstan_server::arguments_envelope(&list))
}

/// Replaces every `{"codec", "blob"}` envelope in `value` with its decoded JSON, for people. The
/// server leaves wire fields such as `input` or `result` null and carries the payload beside them
/// as `input_envelope`; the decoded value is copied under the plain name.
fn decoded(mut value: Value) -> Value {
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) if map.contains_key("blob") && map.contains_key("codec") => {
                if let Some(json) = capstan_server::decode_envelope(value) {
                    *value = json;
                }
            }
            Value::Object(map) => {
                map.values_mut().for_each(walk);
                let pairs: Vec<(String, Value)> = map
                    .iter()
                    .filter_map(|(key, decoded)| Some((key.strip_suffix("_envelope")?.to_string(), decoded.clone())))
                    .collect();
                for (plain, decoded) in pairs {
                    if map.get(&plain).is_none_or(Value::is_null) {
                        map.insert(plain, decoded);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut value);
    value
}

/// A path segment or query value, percent-encoded (ids and tokens may hold `/`, `+`, `=`).
pub(crate) fn encode(segment: &str) -> String {
    percent_encoding::utf8_percent_encode(segment, percent_encoding::NON_ALPHANUMERIC).to_string()
}

pub(crate) fn run(body: impl std::future::Future<Output = Result<(), String>>) -> ExitCode {
    let runtime = tokio::runtime::Runtime::new().expect("start the tokio runtime");
    finish(runtime.block_on(body))
}

pub fn workflow(connection: Connection, command: WorkflowCommand) -> ExitCode {
    let output = connection.output;
    let client = Client::new(connection);
    let columns = [
        "workflow_id",
        "run_id",
        "workflow_type",
        "status",
        "paused",
        "task_queue",
        "started_at",
        "workflow_task_failing",
        "history_budget_pressure",
    ];
    let is_pause = matches!(command, WorkflowCommand::Pause { .. });
    run(async move {
        match command {
            WorkflowCommand::Start {
                workflow_type,
                task_queue,
                workflow_id,
                input,
                business_key,
                build_id,
                execution_timeout_seconds,
                priority,
                fairness_key,
                fairness_weight,
            } => {
                // A field left out goes as null: the server reads null as not given.
                let body = json!({
                    "workflow_type": workflow_type, "task_queue": task_queue, "input": arguments(input.as_deref())?,
                    "workflow_id": workflow_id, "business_key": business_key, "build_id": build_id,
                    "execution_timeout_seconds": execution_timeout_seconds,
                    "priority": priority, "fairness_key": fairness_key, "fairness_weight": fairness_weight,
                });
                let started = client.call(Method::POST, "/workflows", Some(body)).await?;
                print(output, &started, &["workflow_id", "run_id", "workflow_type", "outcome"], None);
            }
            WorkflowCommand::List {
                status,
                workflow_type,
                query,
                page_size,
            } => {
                let mut params = vec![format!("page_size={page_size}")];
                for (key, value) in [("status", status), ("workflow_type", workflow_type), ("query", query)] {
                    if let Some(value) = value {
                        params.push(format!("{key}={}", encode(&value)));
                    }
                }
                let listed = client.call(Method::GET, &format!("/workflows?{}", params.join("&")), None).await?;
                print(output, &listed, &columns, Some("workflows"));
            }
            WorkflowCommand::Describe { workflow_id } => {
                let described = decoded(
                    client
                        .call(Method::GET, &format!("/workflows/{}", encode(&workflow_id)), None)
                        .await?,
                );
                match output {
                    Output::Json => print(output, &described, &columns, None),
                    Output::Table => {
                        print_task_failure(&described["workflow_task_failure"]);
                        print(output, &described, &columns, None);
                        println!("started_by: {}", who(&described["started_by"]));
                        for key in ["input", "output", "closed_reason", "compatibility", "blocked_by"] {
                            if !described[key].is_null() {
                                println!("{key}: {}", described[key]);
                            }
                        }
                        if let Some(runtime) = described["import_source_runtime"].as_str() {
                            println!(
                                "imported: from {runtime} at {} (import {}, bundle checksum {})",
                                described["imported_at"].as_str().unwrap_or("-"),
                                described["import_id"].as_str().unwrap_or("-"),
                                described["import_bundle_checksum"].as_str().unwrap_or("-")
                            );
                        }
                    }
                }
            }
            WorkflowCommand::History {
                workflow_id,
                run_id,
                follow,
            } => print_history(&client, output, &workflow_id, run_id, follow).await?,
            WorkflowCommand::Audit { workflow_id, limit } => print_audit(&client, output, &workflow_id, limit).await?,
            WorkflowCommand::Signal { workflow_id, name, input } => {
                let body = json!({"input": arguments(input.as_deref())?});
                let sent = client
                    .call(
                        Method::POST,
                        &format!("/workflows/{}/signal/{}", encode(&workflow_id), encode(&name)),
                        Some(body),
                    )
                    .await?;
                print(output, &sent, &["workflow_id", "outcome", "command_id"], None);
            }
            WorkflowCommand::Query { workflow_id, name, input } => {
                let body = json!({"input": arguments(input.as_deref())?});
                let answer = decoded(
                    client
                        .call(
                            Method::POST,
                            &format!("/workflows/{}/query/{}", encode(&workflow_id), encode(&name)),
                            Some(body),
                        )
                        .await?,
                );
                match output {
                    Output::Json => println!("{}", serde_json::to_string_pretty(&answer).expect("JSON prints")),
                    Output::Table => println!("{}", answer["result"]),
                }
            }
            WorkflowCommand::Update {
                workflow_id,
                name,
                input,
                wait_for,
            } => {
                let body = json!({"input": arguments(input.as_deref())?, "wait_for": wait_for});
                let answer = decoded(
                    client
                        .call(
                            Method::POST,
                            &format!("/workflows/{}/update/{}", encode(&workflow_id), encode(&name)),
                            Some(body),
                        )
                        .await?,
                );
                print(output, &answer, &["update_id", "update_status", "outcome", "result"], None);
            }
            WorkflowCommand::Cancel { workflow_id, reason } => {
                let closed = client
                    .call(
                        Method::POST,
                        &format!("/workflows/{}/cancel", encode(&workflow_id)),
                        Some(json!({"reason": reason})),
                    )
                    .await?;
                print(output, &closed, &["workflow_id", "run_id", "outcome"], None);
            }
            WorkflowCommand::Terminate { workflow_id, reason } => {
                let closed = client
                    .call(
                        Method::POST,
                        &format!("/workflows/{}/terminate", encode(&workflow_id)),
                        Some(json!({"reason": reason})),
                    )
                    .await?;
                print(output, &closed, &["workflow_id", "run_id", "outcome"], None);
            }
            WorkflowCommand::Pause { workflow_id, reason } | WorkflowCommand::Resume { workflow_id, reason } => {
                let operation = if is_pause { "pause" } else { "resume" };
                let held = client
                    .call(
                        Method::POST,
                        &format!("/workflows/{}/{operation}", encode(&workflow_id)),
                        Some(json!({"reason": reason})),
                    )
                    .await?;
                print(output, &held, &["workflow_id", "run_id", "outcome"], None);
            }
        }
        Ok(())
    })
}

/// Prints a run's history page by page (the current run's unless one is named); with `follow`,
/// waits for new events until the run closes.
/// Who an event or audit entry names: the principal's id, or `server` for what the server did
/// on its own.
fn who(principal: &Value) -> String {
    principal["id"].as_str().map_or_else(|| "server".to_string(), str::to_string)
}

/// An instance's audit trail (queries: who asked what), newest first.
async fn print_audit(client: &Client, output: Output, workflow_id: &str, limit: usize) -> Result<(), String> {
    let path = format!("/workflows/{}/audit-events?limit={limit}", encode(workflow_id));
    let trail = client.call(Method::GET, &path, None).await?;
    match output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&trail).expect("JSON prints")),
        Output::Table => {
            for event in trail["events"].as_array().into_iter().flatten() {
                println!(
                    "{}  {:<16}  by {:<24}  {}",
                    event["recorded_at"].as_str().unwrap_or("-"),
                    event["action"].as_str().unwrap_or("?"),
                    who(&event["principal"]),
                    event["detail"]["query_name"].as_str().unwrap_or("")
                );
            }
        }
    }
    Ok(())
}

async fn print_history(client: &Client, output: Output, workflow_id: &str, run_id: Option<String>, follow: bool) -> Result<(), String> {
    let run_id = match run_id {
        Some(run_id) => run_id,
        None => client
            .call(Method::GET, &format!("/workflows/{}", encode(workflow_id)), None)
            .await?["run_id"]
            .as_str()
            .ok_or("the workflow has no run")?
            .to_string(),
    };
    let mut token: Option<String> = None;
    let mut failure_shown = Value::Null;
    loop {
        let mut path = format!("/workflows/{}/runs/{}/history?page_size=1000", encode(workflow_id), encode(&run_id));
        if let Some(token) = &token {
            path.push_str(&format!("&next_page_token={}", encode(token)));
        }
        if follow {
            path.push_str("&wait_new_event=true");
        }
        let page = client.call(Method::GET, &path, None).await?;
        for event in page["events"].as_array().into_iter().flatten() {
            match output {
                Output::Json => println!("{}", decoded(event.clone())),
                Output::Table => println!(
                    "{:>5}  {}  {:<34}  by {}",
                    event["sequence"],
                    event["timestamp"].as_str().or(event["recorded_at"].as_str()).unwrap_or("-"),
                    event["event_type"].as_str().unwrap_or("?"),
                    who(&event["principal"])
                ),
            }
        }
        let closed = page["events"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| matches!(e["event_type"].as_str(), Some(t) if t.starts_with("Workflow") && t != "WorkflowStarted"));
        let failure = &page["workflow_task_failure"];
        if output == Output::Table && page["next_page_token"].is_null() && failure["failed_at"] != failure_shown["failed_at"] {
            print_task_failure(failure);
            failure_shown = failure.clone();
        }
        match page["next_page_token"].as_str() {
            Some(next) => token = Some(next.to_string()),
            None if follow && !closed => {}
            None => break,
        }
    }
    Ok(())
}

pub fn worker(connection: Connection, command: WorkerCommand) -> ExitCode {
    let output = connection.output;
    let client = Client::new(connection);
    let columns = ["worker_id", "task_queue", "build_id", "runtime", "status", "last_heartbeat_at"];
    run(async move {
        match command {
            WorkerCommand::List { task_queue } => {
                let path = match task_queue {
                    Some(queue) => format!("/workers?task_queue={}", encode(&queue)),
                    None => "/workers".into(),
                };
                print(output, &client.call(Method::GET, &path, None).await?, &columns, Some("workers"));
            }
            WorkerCommand::Describe { worker_id } => {
                print(
                    output,
                    &client.call(Method::GET, &format!("/workers/{}", encode(&worker_id)), None).await?,
                    &columns,
                    None,
                );
            }
        }
        Ok(())
    })
}

pub fn task_queue(connection: Connection, command: TaskQueueCommand) -> ExitCode {
    let output = connection.output;
    let client = Client::new(connection);
    run(async move {
        let flatten = |queue: &Value| {
            json!({
                "name": queue["name"],
                "backlog": queue["stats"]["backlog"],
                "pollers": queue["stats"]["poller_count"],
                "workflow_ready": queue["stats"]["workflow_tasks"]["ready_count"],
                "activity_ready": queue["stats"]["activity_tasks"]["ready_count"],
                "diagnostics": queue["diagnostics"].as_array().map(|d| d.iter().filter_map(|x| x["reason"].as_str()).collect::<Vec<_>>().join(",")),
            })
        };
        let columns = ["name", "backlog", "pollers", "workflow_ready", "activity_ready", "diagnostics"];
        match command {
            TaskQueueCommand::List => {
                let listed = client.call(Method::GET, "/task-queues", None).await?;
                match output {
                    Output::Json => print(output, &listed, &columns, None),
                    Output::Table => {
                        let rows: Vec<Value> = listed["task_queues"].as_array().into_iter().flatten().map(flatten).collect();
                        print(output, &json!({"rows": rows}), &columns, Some("rows"));
                    }
                }
            }
            TaskQueueCommand::Describe { task_queue } => {
                let described = client
                    .call(Method::GET, &format!("/task-queues/{}", encode(&task_queue)), None)
                    .await?;
                match output {
                    Output::Json => print(output, &described, &columns, None),
                    Output::Table => {
                        print(output, &flatten(&described), &columns, None);
                        for diagnostic in described["diagnostics"].as_array().into_iter().flatten() {
                            println!("! {}", diagnostic["message"].as_str().unwrap_or(""));
                        }
                    }
                }
            }
            TaskQueueCommand::Pause { task_queue, kind, reason } => {
                let path = format!("/task-queues/{}/pause", encode(&task_queue));
                let held = client
                    .call(Method::POST, &path, Some(json!({"kind": kind, "reason": reason})))
                    .await?;
                print_pauses(output, &held);
            }
            TaskQueueCommand::Resume { task_queue, kind } => {
                let path = format!("/task-queues/{}/resume", encode(&task_queue));
                let held = client.call(Method::POST, &path, Some(json!({"kind": kind}))).await?;
                print_pauses(output, &held);
            }
            TaskQueueCommand::Limits { task_queue } => {
                let limits = client
                    .call(Method::GET, &format!("/task-queues/{}/limits", encode(&task_queue)), None)
                    .await?;
                print_limits(output, &limits);
            }
            TaskQueueCommand::Limit {
                task_queue,
                kind,
                rate,
                burst,
                max_leased,
                key_rate,
                key_burst,
                key_max_leased,
                key_limits,
                weights,
                clear,
            } => {
                let path = format!("/task-queues/{}/limits/{}", encode(&task_queue), encode(&kind));
                let limits = if clear {
                    client.call(Method::DELETE, &path, None).await?
                } else {
                    let key_default = (key_rate.is_some() || key_burst.is_some() || key_max_leased.is_some()).then(
                        || json!({"dispatch_rate_per_second": key_rate, "dispatch_burst": key_burst, "max_leased_tasks": key_max_leased}),
                    );
                    let overrides = key_limits.iter().map(|spec| key_limit(spec)).collect::<Result<Map<_, _>, _>>()?;
                    let weights = weights.iter().map(|spec| key_weight(spec)).collect::<Result<Map<_, _>, _>>()?;
                    let body = json!({
                        "dispatch_rate_per_second": rate,
                        "dispatch_burst": burst,
                        "max_leased_tasks": max_leased,
                        "fairness_key_limits": key_default,
                        "fairness_key_overrides": overrides,
                        "fairness_weights": weights,
                    });
                    client.call(Method::PUT, &path, Some(body)).await?
                };
                print_limits(output, &limits);
            }
            TaskQueueCommand::Shares { task_queue } => {
                let shares = client
                    .call(
                        Method::GET,
                        &format!("/task-queues/{}/priority-fairness", encode(&task_queue)),
                        None,
                    )
                    .await?;
                let columns = ["kind", "priority", "fairness_key", "fairness_weight", "ready", "recent_dispatch"];
                match output {
                    Output::Json => print(output, &shares, &columns, None),
                    Output::Table => print(output, &json!({"rows": share_rows(&shares)}), &columns, Some("rows")),
                }
            }
        }
        Ok(())
    })
}

/// A queue's limits: one row per task kind that has any.
fn print_limits(output: Output, limits: &Value) {
    let columns = [
        "kind",
        "dispatch_rate_per_second",
        "dispatch_burst",
        "max_leased_tasks",
        "leased_tasks",
        "available_tokens",
        "fairness_key_limits",
        "fairness_key_overrides",
        "fairness_weights",
    ];
    if output == Output::Json {
        return print(output, limits, &columns, None);
    }
    let rows: Vec<Value> = [("workflow", "workflow_task"), ("activity", "activity_task")]
        .into_iter()
        .filter(|(_, key)| limits[key].is_object())
        .map(|(kind, key)| {
            let mut row = limits[key].clone();
            row["kind"] = json!(kind);
            row
        })
        .collect();
    print(output, &json!({"rows": rows}), &columns, Some("rows"));
}

/// One row per kind, priority and fairness class of a queue's priority-fairness view.
fn share_rows(shares: &Value) -> Vec<Value> {
    let mut rows = Vec::new();
    for (kind, surface) in [("workflow", &shares["workflow_task"]), ("activity", &shares["activity_task"])] {
        let recent = surface["recent_dispatch"].as_array().cloned().unwrap_or_default();
        for tier in surface["priority_tiers"].as_array().into_iter().flatten() {
            for class in tier["classes"].as_array().into_iter().flatten() {
                let score = recent
                    .iter()
                    .find(|r| r["fairness_key"] == class["fairness_key"])
                    .map(|r| r["score"].clone());
                rows.push(json!({
                    "kind": kind,
                    "priority": tier["priority"],
                    "fairness_key": class["fairness_key"].as_str().unwrap_or("(default)"),
                    "fairness_weight": class["fairness_weight"],
                    "ready": class["count"],
                    "recent_dispatch": score.and_then(|s| s.as_f64()).map(|s| format!("{s:.2}")),
                }));
            }
        }
    }
    rows
}

pub fn schedule(connection: Connection, command: ScheduleCommand) -> ExitCode {
    let output = connection.output;
    let client = Client::new(connection);
    let columns = [
        "schedule_id",
        "status",
        "workflow_type",
        "overlap_policy",
        "next_fire_at",
        "fires_count",
    ];
    run(async move {
        match command {
            ScheduleCommand::Create {
                schedule_id,
                workflow_type,
                task_queue,
                cron,
                every,
                timezone,
                input,
                overlap_policy,
                paused,
            } => {
                let mut spec = json!({});
                if !cron.is_empty() {
                    spec["cron_expressions"] = json!(cron);
                }
                if !every.is_empty() {
                    spec["intervals"] = json!(every.iter().map(|e| json!({"every": e})).collect::<Vec<_>>());
                }
                if let Some(zone) = timezone {
                    spec["timezone"] = json!(zone);
                }
                let mut body = json!({
                    "schedule_id": schedule_id, "spec": spec, "paused": paused,
                    "action": {"workflow_type": workflow_type, "task_queue": task_queue, "input": arguments(input.as_deref())?},
                });
                if let Some(policy) = overlap_policy {
                    body["overlap_policy"] = json!(policy);
                }
                print(
                    output,
                    &client.call(Method::POST, "/schedules", Some(body)).await?,
                    &["schedule_id", "outcome"],
                    None,
                );
            }
            ScheduleCommand::List => print(
                output,
                &client.call(Method::GET, "/schedules", None).await?,
                &columns,
                Some("schedules"),
            ),
            ScheduleCommand::Describe { schedule_id } => print(
                output,
                &client
                    .call(Method::GET, &format!("/schedules/{}", encode(&schedule_id)), None)
                    .await?,
                &columns,
                None,
            ),
            ScheduleCommand::Pause { schedule_id, note } => {
                let path = format!("/schedules/{}/pause", encode(&schedule_id));
                print(
                    output,
                    &client.call(Method::POST, &path, Some(json!({"note": note}))).await?,
                    &["schedule_id", "outcome"],
                    None,
                );
            }
            ScheduleCommand::Resume { schedule_id, note } => {
                let path = format!("/schedules/{}/resume", encode(&schedule_id));
                print(
                    output,
                    &client.call(Method::POST, &path, Some(json!({"note": note}))).await?,
                    &["schedule_id", "outcome"],
                    None,
                );
            }
            ScheduleCommand::Trigger { schedule_id } => {
                let path = format!("/schedules/{}/trigger", encode(&schedule_id));
                print(
                    output,
                    &client.call(Method::POST, &path, Some(json!({}))).await?,
                    &["schedule_id", "outcome", "workflow_id", "reason"],
                    None,
                );
            }
            ScheduleCommand::Delete { schedule_id } => {
                let path = format!("/schedules/{}", encode(&schedule_id));
                print(
                    output,
                    &client.call(Method::DELETE, &path, None).await?,
                    &["schedule_id", "outcome"],
                    None,
                );
            }
            ScheduleCommand::History { schedule_id } => {
                let path = format!("/schedules/{}/history?limit=500", encode(&schedule_id));
                print(
                    output,
                    &client.call(Method::GET, &path, None).await?,
                    &["sequence", "event_type", "recorded_at", "workflow_instance_id"],
                    Some("events"),
                );
            }
        }
        Ok(())
    })
}

pub fn server(connection: Connection, command: ServerCommand) -> ExitCode {
    let output = connection.output;
    let client = Client::new(connection);
    run(async move {
        match command {
            ServerCommand::Health => {
                let health = client.call(Method::GET, "/health", None).await?;
                print(
                    output,
                    &json!({"status": health["status"], "database": health["checks"]["database"], "timestamp": health["timestamp"]}),
                    &["status", "database", "timestamp"],
                    None,
                );
            }
            ServerCommand::Info => {
                let info = client.call(Method::GET, "/cluster/info", None).await?;
                match output {
                    Output::Json => print(output, &info, &[], None),
                    Output::Table => print(
                        output,
                        &json!({"server_id": info["server_id"], "version": info["version"],
                                "worker_protocol": info["worker_protocol"]["version"], "control_plane": info["control_plane"]["version"]}),
                        &["server_id", "version", "worker_protocol", "control_plane"],
                        None,
                    ),
                }
            }
        }
        Ok(())
    })
}

/// `--key-limit "KEY:rate=R,burst=B,max_leased=N"` as the API's `fairness_key_overrides` entry.
fn key_limit(spec: &str) -> Result<(String, Value), String> {
    let (key, settings) = spec
        .split_once(':')
        .ok_or_else(|| format!("--key-limit {spec:?}: write KEY:rate=R,burst=B,max_leased=N"))?;
    let mut limits = Map::new();
    for setting in settings.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, value) = setting
            .split_once('=')
            .ok_or_else(|| format!("--key-limit {spec:?}: {setting:?} is not name=value"))?;
        let field = match name.trim() {
            "rate" => "dispatch_rate_per_second",
            "burst" => "dispatch_burst",
            "max_leased" => "max_leased_tasks",
            other => return Err(format!("--key-limit {spec:?}: {other:?} is not rate, burst or max_leased")),
        };
        let number: f64 = value
            .trim()
            .parse()
            .map_err(|_| format!("--key-limit {spec:?}: {name} must be a number"))?;
        let value = if field == "dispatch_rate_per_second" {
            json!(number)
        } else {
            json!(number as u64)
        };
        limits.insert(field.to_string(), value);
    }
    Ok((key.trim().to_string(), Value::Object(limits)))
}

/// `--weight "KEY=W"` as the API's `fairness_weights` entry.
fn key_weight(spec: &str) -> Result<(String, Value), String> {
    let (key, weight) = spec.split_once('=').ok_or_else(|| format!("--weight {spec:?}: write KEY=WEIGHT"))?;
    let weight: u64 = weight
        .trim()
        .parse()
        .map_err(|_| format!("--weight {spec:?}: the weight must be a whole number"))?;
    Ok((key.trim().to_string(), json!(weight)))
}

/// A queue's holds per task kind: paused or not, since when and why.
fn print_pauses(output: Output, held: &Value) {
    let rows: Vec<Value> = ["workflow", "activity"]
        .iter()
        .map(|kind| {
            let of_kind = &held["kinds"][kind];
            json!({"kind": kind, "paused": of_kind["paused"], "paused_at": of_kind["pause"]["paused_at"],
                   "reason": of_kind["pause"]["reason"]})
        })
        .collect();
    match output {
        Output::Json => print(output, held, &[], None),
        Output::Table => print(
            output,
            &json!({"kinds": rows}),
            &["kind", "paused", "paused_at", "reason"],
            Some("kinds"),
        ),
    }
}
