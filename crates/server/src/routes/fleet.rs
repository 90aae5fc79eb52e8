//! The fleet as operators see it: registered workers (list, describe, remove) and task queues
//! (list, describe with pollers, backlog and current leases). Reads need the operator role (the
//! control-plane middleware); removing a worker needs admin.

use crate::auth::Role;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::worker_report;
use crate::{render, AppState, Shared};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use capstan_app::workers;
use capstan_engine::Millis;
use capstan_engine::Reason;
use capstan_store::{BuildIdRollout, Store, WorkerRecord};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// Most current leases a task-queue describe lists.
const LEASES_SHOWN: usize = 100;

fn status_of(worker: &WorkerRecord, now: Millis) -> &str {
    if workers::Cadence::of(&worker.document).stale(worker.last_heartbeat_at, now) {
        "stale"
    } else {
        &worker.status
    }
}

/// How long a node trusts its copy of a queue's drain intents: a drain or resume takes effect on
/// every node within this.
/// The drain intents of a queue's cohorts (cached briefly).
pub(crate) async fn rollouts<S: Store>(state: &AppState<S>, namespace: &str, queue: &str) -> ApiResult<Vec<BuildIdRollout>> {
    Ok(capstan_app::Services::rollouts(state, namespace, queue).await?)
}

/// A worker's status with its cohort's drain intent applied.
fn effective_status<'a>(worker: &'a WorkerRecord, rollouts: &[BuildIdRollout], now: Millis) -> &'a str {
    match status_of(worker, now) {
        "stale" => "stale",
        _ if workers::draining_in(rollouts, worker.build_id.as_deref()) => "draining",
        status => status,
    }
}

fn worker_json(worker: &WorkerRecord, now: Millis) -> Value {
    let doc = &worker.document;
    let cadence = workers::Cadence::of(doc);
    json!({
        "worker_id": worker.worker_id,
        "namespace": worker.namespace,
        "task_queue": worker.task_queue,
        "runtime": worker.runtime,
        "sdk_version": worker.sdk_version,
        "build_id": worker.build_id,
        "supported_workflow_types": worker.supported_workflow_types,
        "supported_activity_types": worker.supported_activity_types,
        "workflow_definition_fingerprints": worker.workflow_definition_fingerprints,
        "max_concurrent_workflow_tasks": doc.get("max_concurrent_workflow_tasks"),
        "max_concurrent_activity_tasks": doc.get("max_concurrent_activity_tasks"),
        "task_slots": worker_report::shown_task_slots(doc),
        "process_metrics": doc.get("process_metrics"),
        "capabilities": doc.get("capabilities"),
        "status": status_of(worker, now),
        "last_heartbeat_at": render::time(worker.last_heartbeat_at),
        "registered_at": render::time(worker.registered_at),
        "updated_at": render::time(worker.last_heartbeat_at.max(worker.registered_at)),
        "heartbeat_interval_seconds": cadence.interval_seconds,
        "stale_after_seconds": cadence.stale_after_seconds,
    })
}

fn worker_not_found(worker_id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        Reason::WorkerNotFound,
        "No worker with this id is registered in this namespace.",
    )
    .with("worker_id", worker_id)
}

pub async fn list_workers<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let status = params.get("status").map(String::as_str);
    if status.is_some_and(|s| !matches!(s, "active" | "stale" | "draining")) {
        return Err(ApiError::validation("status", "status must be active, stale or draining."));
    }
    let now = state.now();
    let mut workers = Vec::new();
    for worker in state.store.workers(&namespace).await? {
        if params.get("task_queue").is_some_and(|q| &worker.task_queue != q) {
            continue;
        }
        let rollouts = rollouts(&state, &namespace, &worker.task_queue).await?;
        let effective = effective_status(&worker, &rollouts, now).to_string();
        if status.is_some_and(|s| s != effective) {
            continue;
        }
        let mut body = worker_json(&worker, now);
        body["status"] = json!(effective);
        workers.push(body);
    }
    Ok(Json(
        json!({"namespace": namespace, "stale_after_seconds": workers::STALE_AFTER_SECONDS, "workers": workers}),
    ))
}

pub async fn describe_worker<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(worker_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let worker = state
        .store
        .get_worker(&namespace, &worker_id)
        .await?
        .ok_or_else(|| worker_not_found(&worker_id))?;
    Ok(Json(worker_json(&worker, state.now())))
}

/// Operator removal: the registration goes, and the worker's leased workflow tasks are handed
/// back at once (as when a worker deregisters itself).
pub async fn delete_worker<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    Path(worker_id): Path<String>,
) -> ApiResult<Json<Value>> {
    state.config.auth.require_in(&headers, &[Role::Admin], &namespace)?;
    let Some(released) = workers::deregister(&*state, &namespace, &worker_id).await? else {
        return Err(
            ApiError::new(StatusCode::NOT_FOUND, Reason::WorkerNotFound, "The worker is not registered.").with("worker_id", worker_id),
        );
    };
    for run in &released {
        state.run_changed(run);
    }
    tracing::info!(namespace, worker_id, recovered = released.len(), "worker removed by an operator");
    let mut body = render::deregistered(&worker_id, released.len());
    body["deleted"] = json!(true);
    body["outcome"] = json!("deleted");
    Ok(Json(body))
}

pub async fn list_task_queues<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
) -> ApiResult<Json<Value>> {
    let mut queues = Vec::new();
    // Server-internal tasks (timers, run deadlines) have no queue: no worker polls them.
    for name in state
        .store
        .task_queue_names(&namespace)
        .await?
        .into_iter()
        .filter(|name| !name.is_empty())
    {
        queues.push(queue_json(&state, &namespace, &name, false).await?);
    }
    Ok(Json(json!({"namespace": namespace, "task_queues": queues})))
}

pub async fn describe_task_queue<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(queue): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(queue_json(&state, &namespace, &queue, true).await?))
}

/// The queue object: counts per task kind, pollers (registered workers) and, in detail, the
/// current leases. `diagnostics` names what keeps work from moving (no live worker, or none
/// that supports a waiting type).
async fn queue_json<S: Store>(state: &Shared<S>, namespace: &str, queue: &str, detail: bool) -> ApiResult<Value> {
    let now = state.now();
    let snapshot = state
        .store
        .task_queue_snapshot(namespace, queue, if detail { LEASES_SHOWN } else { 0 })
        .await?;
    let workers = state.store.queue_workers(namespace, queue).await?;
    let live: Vec<&WorkerRecord> = workers.iter().filter(|w| status_of(w, now) == "active").collect();
    let mut stats = Map::new();
    let mut backlog = 0;
    for kind in ["workflow", "activity"] {
        let count = |status: &str| {
            snapshot
                .counts
                .iter()
                .filter(|c| c.0 == kind && c.1 == status)
                .map(|c| c.2)
                .sum::<i64>()
        };
        let oldest = snapshot
            .counts
            .iter()
            .filter(|c| c.0 == kind && c.1 == "ready")
            .filter_map(|c| c.3)
            .min();
        backlog += count("ready");
        stats.insert(
            format!("{kind}_tasks"),
            json!({
                "ready_count": count("ready"),
                "leased_count": count("leased"),
                "oldest_ready_age_seconds": oldest.map(|at| ((now - at).max(0)) / 1000),
            }),
        );
    }
    stats.insert("backlog".into(), json!(backlog));
    stats.insert("poller_count".into(), json!(live.len()));
    // An operator's holds on the queue (`docs/pause.md`): its backlog stays shown.
    let paused: Vec<(String, capstan_engine::PauseRecord)> = capstan_app::queue_limits::of_queue(&**state, namespace, queue)
        .await?
        .into_iter()
        .filter_map(|s| s.limits.paused.map(|p| (s.kind.as_str().to_string(), p)))
        .collect();
    let admission = |kind: &str| {
        let ready = snapshot
            .counts
            .iter()
            .filter(|c| c.0 == kind && c.1 == "ready")
            .map(|c| c.2)
            .sum::<i64>();
        let leased = snapshot
            .counts
            .iter()
            .filter(|c| c.0 == kind && c.1 == "leased")
            .map(|c| c.2)
            .sum::<i64>();
        let pause = paused.iter().find(|(k, _)| k.as_str() == kind).map(|(_, p)| p);
        json!({"status": if pause.is_some() { "paused" } else { "open" }, "budget_source": "worker_slots",
               "active_worker_count": live.len(), "ready_count": ready, "leased_count": leased,
               "pause": render::pause(pause)})
    };
    let rollouts = rollouts(state, namespace, queue).await?;
    let undrained = live
        .iter()
        .filter(|w| !workers::draining_in(&rollouts, w.build_id.as_deref()))
        .count();
    let mut diagnostics = Vec::new();
    if backlog > 0 && !live.is_empty() && undrained == 0 {
        diagnostics.push(json!({"reason": "no_compatible_worker",
            "message": format!("{backlog} task(s) wait on this queue and every live worker's build id is draining.")}));
    }
    for (build, count) in &snapshot.pinned {
        let serving = live
            .iter()
            .any(|w| w.build_id.as_deref() == Some(build.as_str()) && !workers::draining_in(&rollouts, Some(build)));
        if !serving {
            diagnostics.push(json!({"reason": "no_compatible_worker", "build_id": build,
                "message": format!("{count} workflow task(s) of runs pinned to build {build} wait and no live, undrained worker has that build.")}));
        }
    }
    for (kind, pause) in &paused {
        diagnostics.push(json!({"reason": "task_queue_paused", "kind": kind,
            "message": format!("The queue's {kind} tasks are paused{}: none goes to a worker until they are resumed.",
                pause.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default())}));
    }
    if backlog > 0 && live.is_empty() {
        diagnostics.push(json!({"reason": "no_live_worker",
            "message": format!("{backlog} task(s) wait on this queue and no worker has heartbeated within {} s.", workers::STALE_AFTER_SECONDS)}));
    }
    let mut body = json!({
        "name": queue,
        "namespace": namespace,
        "stats": stats,
        "admission": {"workflow_tasks": admission("workflow"), "activity_tasks": admission("activity"),
                      "query_tasks": {"status": "open", "budget_source": "server"}},
        "pollers": workers.iter().map(|w| json!({
            "worker_id": w.worker_id, "runtime": w.runtime, "sdk_version": w.sdk_version, "build_id": w.build_id,
            "status": status_of(w, now), "last_heartbeat_at": render::time(w.last_heartbeat_at),
            "task_slots": worker_report::shown_task_slots(&w.document),
            "process_metrics": w.document.get("process_metrics"),
        })).collect::<Vec<_>>(),
        "current_leases": snapshot.leases.iter().map(|l| json!({
            "task_id": l.task_id, "task_kind": l.kind, "type": l.type_name, "workflow_id": l.workflow_id,
            "run_id": l.run_id, "lease_owner": l.lease_owner, "lease_expires_at": render::opt_time(l.lease_expires_at),
        })).collect::<Vec<_>>(),
        "diagnostics": diagnostics,
    });
    if !detail {
        body.as_object_mut().expect("object").remove("current_leases");
    }
    Ok(body)
}

/// `GET /task-queues/{q}/build-ids`: the queue's cohorts (registered build ids, and any with a
/// recorded intent), with worker counts and the drain intent.
pub async fn build_ids<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(queue): Path<String>,
) -> ApiResult<Json<Value>> {
    let now = state.now();
    let workers = state.store.queue_workers(&namespace, &queue).await?;
    let rollouts = state.store.build_id_rollouts(&namespace, &queue).await?;
    let mut cohorts: std::collections::BTreeMap<Option<String>, Vec<&WorkerRecord>> = Default::default();
    for worker in &workers {
        cohorts.entry(worker.build_id.clone()).or_default().push(worker);
    }
    for rollout in &rollouts {
        cohorts.entry(rollout.build_id.clone()).or_default();
    }
    let body: Vec<Value> = cohorts
        .iter()
        .map(|(build_id, members)| {
            let rollout = rollouts.iter().find(|r| &r.build_id == build_id);
            let intent = rollout.map(|r| r.drain_intent.as_str()).unwrap_or("active");
            let count = |status: &str| members.iter().filter(|w| effective_status(w, &rollouts, now) == status).count();
            let mut runtimes: Vec<&str> = members.iter().map(|w| w.runtime.as_str()).collect();
            runtimes.sort();
            runtimes.dedup();
            let mut sdk_versions: Vec<&str> = members.iter().filter_map(|w| w.sdk_version.as_deref()).collect();
            sdk_versions.sort();
            sdk_versions.dedup();
            let fingerprints: std::collections::BTreeSet<String> = members
                .iter()
                .flat_map(|w| w.workflow_definition_fingerprints.values().map(|v| v.to_string()))
                .collect();
            json!({
                "build_id": build_id,
                "rollout_status": intent,
                "drain_intent": intent,
                "drained_at": render::opt_time(rollout.and_then(|r| r.drained_at)),
                "active_worker_count": count("active"),
                "draining_worker_count": count("draining"),
                "stale_worker_count": count("stale"),
                "total_worker_count": members.len(),
                "runtimes": runtimes,
                "sdk_versions": sdk_versions,
                "first_seen_at": render::opt_time(members.iter().map(|w| w.registered_at).min()),
                "last_heartbeat_at": render::opt_time(members.iter().map(|w| w.last_heartbeat_at).max()),
                "new_start_selected": rollout.is_some_and(|r| r.promoted_at.is_some()),
                "promoted_at": render::opt_time(rollout.and_then(|r| r.promoted_at)),
                "workflow_definition_fingerprint_count": fingerprints.len(),
            })
        })
        .collect();
    Ok(Json(
        json!({"namespace": namespace, "task_queue": queue, "stale_after_seconds": workers::STALE_AFTER_SECONDS, "build_ids": body}),
    ))
}

async fn set_drain<S: Store>(
    state: Shared<S>,
    namespace: String,
    headers: HeaderMap,
    queue: String,
    body: Map<String, Value>,
    draining: bool,
) -> ApiResult<Json<Value>> {
    state.config.auth.require(&headers, &[Role::Operator, Role::Admin])?;
    let build_id = build_id_of(&body)?;
    let rollout = capstan_app::workers::set_build_id_drain(&*state, &namespace, &queue, build_id, draining).await?;
    state.rollouts.lock().expect("rollouts").remove(&(namespace.clone(), queue.clone()));
    tracing::info!(namespace, task_queue = queue, build_id = ?rollout.build_id, intent = rollout.drain_intent, "build-id rollout changed");
    Ok(Json(rollout_state(&namespace, &queue, &rollout)))
}

/// Marks a cohort draining: its workers finish what they hold and get no new tasks.
pub async fn drain_build_id<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    set_drain(state, namespace, headers, queue, body, true).await
}

pub async fn resume_build_id<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    set_drain(state, namespace, headers, queue, body, false).await
}

/// Promotes a cohort: new starts on the queue that name no build are pinned to it.
pub async fn promote_build_id<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    Path(queue): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    state.config.auth.require_in(&headers, &[Role::Operator, Role::Admin], &namespace)?;
    let build_id = build_id_of(&body)?;
    let rollout = capstan_app::workers::promote_build_id(&*state, &namespace, &queue, build_id).await?;
    state.rollouts.lock().expect("rollouts").remove(&(namespace.clone(), queue.clone()));
    tracing::info!(namespace, task_queue = queue, build_id = ?rollout.build_id, "build id promoted for new starts");
    Ok(Json(rollout_state(&namespace, &queue, &rollout)))
}

fn build_id_of(body: &Map<String, Value>) -> ApiResult<Option<String>> {
    match body.get("build_id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(id)) if !id.is_empty() && id.len() <= 255 => Ok(Some(id.clone())),
        Some(_) => Err(ApiError::validation(
            "build_id",
            "build_id must be a string of 1 to 255 characters, or null.",
        )),
    }
}

fn rollout_state(namespace: &str, queue: &str, rollout: &BuildIdRollout) -> Value {
    json!({
        "namespace": namespace,
        "task_queue": queue,
        "build_id": rollout.build_id,
        "drain_intent": rollout.drain_intent,
        "drained_at": render::opt_time(rollout.drained_at),
        "promoted_at": render::opt_time(rollout.promoted_at),
        "new_start_selected": rollout.promoted_at.is_some(),
    })
}
