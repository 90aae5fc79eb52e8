//! Matching workloads: how dispatch is shared and held, not how fast (issue 42's goals).
//!
//! - `fairness`: two tenants' standing backlogs, started weighted 3:1, drained for `--seconds`:
//!   each tenant's share of the workflow-task dispatches, per 10 s window and overall, while
//!   both still had work waiting.
//! - `priority`: one priority-1 start behind `--workflows` priority-5 starts: its place in the
//!   order the backlog is dispatched in.
//! - `limits`: a backlog drained for `--seconds` under `--rate-limit` dispatches per second
//!   and/or `--max-leased` tasks leased at once, by workers spread over every `--server` node:
//!   dispatches per second per window, and the most tasks leased at once, read from the
//!   database (the queue's limits route) every 50 ms.
//!
//! Every workflow finishes in its one workflow task (after `--think-ms`), so a dispatch is a
//! workflow task leased to a worker.

use crate::{register, Api};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// What a matching run is given.
pub struct Setup {
    /// The first node takes the starts and the limits; workers poll every node in turn.
    pub nodes: Vec<Arc<Api>>,
    pub queue: String,
    pub workflows: usize,
    pub concurrency: usize,
    pub workers: usize,
    pub seconds: f64,
    pub think_ms: u64,
    pub rate_limit: Option<f64>,
    pub max_leased: Option<u64>,
}

/// Dispatches as they happened: seconds since the drain began, and the workflow id.
type Dispatches = Arc<Mutex<Vec<(f64, String)>>>;

pub async fn fairness(setup: &Setup) -> Value {
    let tenants = [("heavy", 3), ("light", 1)];
    let mut starts = Vec::new();
    for (tenant, weight) in tenants {
        for i in 0..setup.workflows {
            starts.push((format!("{tenant}-{i}"), json!({"fairness_key": tenant, "fairness_weight": weight})));
        }
    }
    start_all(setup, starts).await;
    let dispatches = drain(setup, 2 * setup.workflows, |_| false).await;
    let waiting_until = tenants
        .iter()
        .map(|(tenant, _)| {
            // A tenant's backlog stood until its last workflow was dispatched.
            let of_tenant: Vec<f64> = dispatches.iter().filter(|(_, id)| id.starts_with(tenant)).map(|d| d.0).collect();
            if of_tenant.len() == setup.workflows {
                of_tenant.last().copied().unwrap_or(0.0)
            } else {
                f64::MAX
            }
        })
        .fold(f64::MAX, f64::min);
    let standing: Vec<&(f64, String)> = dispatches.iter().filter(|d| d.0 <= waiting_until).collect();
    let share = |of: &[&(f64, String)]| {
        let heavy = of.iter().filter(|d| d.1.starts_with("heavy")).count();
        json!({"dispatches": of.len(), "heavy_share": heavy as f64 / of.len().max(1) as f64})
    };
    let windows: Vec<Value> = (0..)
        .map(|w| w as f64 * 10.0)
        .take_while(|from| *from < setup.seconds)
        .map(|from| {
            let window: Vec<&(f64, String)> = standing.iter().copied().filter(|d| d.0 >= from && d.0 < from + 10.0).collect();
            json!({"from_s": from, "share": share(&window)})
        })
        .collect();
    json!({
        "workload": "fairness",
        "weights": {"heavy": 3, "light": 1},
        "backlog_per_tenant": setup.workflows,
        "both_waiting_for_s": if waiting_until == f64::MAX { setup.seconds } else { waiting_until },
        "overall": share(&standing),
        "windows": windows,
    })
}

pub async fn priority(setup: &Setup) -> Value {
    let mut starts: Vec<(String, Value)> = (0..setup.workflows)
        .map(|i| (format!("bulk-{i}"), json!({"priority": 5})))
        .collect();
    starts.push(("urgent".to_string(), json!({"priority": 1})));
    start_all(setup, starts).await;
    let dispatches = drain(setup, setup.workflows + 1, |dispatched| {
        dispatched.iter().any(|d| d.1.starts_with("urgent"))
    })
    .await;
    let place = dispatches.iter().position(|d| d.1.starts_with("urgent")).map(|at| at + 1);
    json!({
        "workload": "priority",
        "queued_ahead_at_priority_5": setup.workflows,
        "workers": setup.workers,
        "urgent_dispatched_as": place,
    })
}

pub async fn limits(setup: &Setup) -> Value {
    let mut limits = serde_json::Map::new();
    if let Some(rate) = setup.rate_limit {
        limits.insert("dispatch_rate_per_second".into(), json!(rate));
    }
    if let Some(cap) = setup.max_leased {
        limits.insert("max_leased_tasks".into(), json!(cap));
    }
    let path = format!("/task-queues/{}/limits/workflow", setup.queue);
    let (status, body) = setup.nodes[0]
        .control(reqwest::Method::PUT, &path, Some(Value::Object(limits)))
        .await
        .expect("set the limits");
    assert_eq!(status, 200, "setting the limits failed: {body}");
    let starts = (0..setup.workflows).map(|i| (format!("limited-{i}"), json!({}))).collect();
    start_all(setup, starts).await;

    let sampling = Arc::new(AtomicBool::new(true));
    let (most_leased, samples) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sampler = tokio::spawn({
        let (api, queue) = (setup.nodes[0].clone(), setup.queue.clone());
        let (sampling, most_leased, samples) = (sampling.clone(), most_leased.clone(), samples.clone());
        async move {
            let mut tick = tokio::time::interval(Duration::from_millis(50));
            while sampling.load(Ordering::Relaxed) {
                tick.tick().await;
                let path = format!("/task-queues/{queue}/limits");
                if let Ok((200, body)) = api.control(reqwest::Method::GET, &path, None).await {
                    let leased = body["workflow_task"]["leased_tasks"].as_u64().unwrap_or(0);
                    most_leased.fetch_max(leased, Ordering::Relaxed);
                    samples.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    });
    let dispatches = drain(setup, setup.workflows, |_| false).await;
    sampling.store(false, Ordering::Relaxed);
    sampler.await.expect("sampler");
    let per_second = |from: f64, to: f64| dispatches.iter().filter(|d| d.0 >= from && d.0 < to).count() as f64 / (to - from);
    let end = dispatches.last().map_or(0.0, |d| d.0).min(setup.seconds);
    let windows: Vec<Value> = (0..)
        .map(|w| w as f64 * 10.0)
        .take_while(|from| from + 10.0 <= end)
        .map(|from| json!({"from_s": from, "dispatches_per_s": per_second(from, from + 10.0)}))
        .collect();
    json!({
        "workload": "limits",
        "nodes": setup.nodes.len(),
        "rate_limit": setup.rate_limit,
        "max_leased": setup.max_leased,
        "dispatches": dispatches.len(),
        // The first second spends the burst; the rate is what follows.
        "dispatches_per_s_after_the_first_second": if end > 1.0 { per_second(1.0, end) } else { 0.0 },
        "windows": windows,
        "most_leased_sampled": most_leased.load(Ordering::Relaxed),
        "leased_samples": samples.load(Ordering::Relaxed),
    })
}

/// Starts every `(name, options)` on the first node, `concurrency` at a time, before any worker
/// polls: the backlog.
async fn start_all(setup: &Setup, starts: Vec<(String, Value)>) {
    let gate = Arc::new(Semaphore::new(setup.concurrency));
    let mut started = Vec::new();
    for (name, options) in starts {
        let permit = gate.clone().acquire_owned().await.expect("semaphore");
        let (api, queue) = (setup.nodes[0].clone(), setup.queue.clone());
        started.push(tokio::spawn(async move {
            let mut body = json!({"workflow_type": "bench-matching", "workflow_id": format!("{name}-{queue}"), "task_queue": queue});
            body.as_object_mut()
                .expect("object")
                .extend(options.as_object().cloned().unwrap_or_default());
            let (status, response) = api.control(reqwest::Method::POST, "/workflows", Some(body)).await.expect("start");
            assert_eq!(status, 201, "start refused: {response}");
            drop(permit);
        }));
    }
    for start in started {
        start.await.expect("start");
    }
}

/// Runs the workers until `--seconds` pass, the `backlog` started is all dispatched, or `enough`
/// says so; every dispatch in order.
async fn drain(setup: &Setup, backlog: usize, enough: impl Fn(&[(f64, String)]) -> bool) -> Vec<(f64, String)> {
    let dispatches: Dispatches = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let began = Instant::now();
    let mut workers = Vec::new();
    for index in 0..setup.workers {
        let api = setup.nodes[index % setup.nodes.len()].clone();
        let (queue, think) = (setup.queue.clone(), Duration::from_millis(setup.think_ms));
        let (dispatches, stop) = (dispatches.clone(), stop.clone());
        workers.push(tokio::spawn(async move {
            let worker_id = format!("matching-{index}");
            register(&api, &worker_id, &queue).await;
            while !stop.load(Ordering::Relaxed) {
                let poll = json!({"worker_id": worker_id, "task_queue": queue, "timeout_seconds": 1, "history_page_size": 1});
                let Ok((200, body)) = api.worker("/worker/workflow-tasks/poll", poll).await else {
                    continue;
                };
                let task = &body["task"];
                if task.is_null() {
                    continue;
                }
                let workflow_id = task["workflow_id"].as_str().unwrap_or_default().to_string();
                dispatches.lock().unwrap().push((began.elapsed().as_secs_f64(), workflow_id));
                tokio::time::sleep(think).await;
                let path = format!("/worker/workflow-tasks/{}/complete", task["task_id"].as_str().unwrap_or_default());
                let commands = json!([{"type": "complete_workflow", "result": null}]);
                let report =
                    json!({"lease_owner": worker_id, "workflow_task_attempt": task["workflow_task_attempt"], "commands": commands});
                let (status, response) = api.worker(&path, report).await.expect("report");
                assert_eq!(status, 200, "workflow task report refused: {response}");
            }
        }));
    }
    loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let done = {
            let seen = dispatches.lock().unwrap();
            began.elapsed().as_secs_f64() >= setup.seconds || enough(&seen) || seen.len() >= backlog
        };
        if done {
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        let _ = worker.await;
    }
    let mut all = std::mem::take(&mut *dispatches.lock().unwrap());
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    all
}
