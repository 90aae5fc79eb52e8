//! The fleet as operators see it: registered workers (list, describe, remove) and task queues
//! (list, describe with pollers, backlog and current leases). Reads need the operator role (the
//! control-plane middleware); removing a worker needs admin.

use super::Namespace;
use crate::auth::Role;
use crate::error::{ApiError, ApiResult};
use crate::{now_ms, render, Shared};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use capstan_engine::Millis;
use capstan_store::{Store, WorkerRecord};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// How often workers are asked to heartbeat (also answered on register and heartbeat).
pub const HEARTBEAT_INTERVAL_SECONDS: i64 = 60;
/// A worker silent for longer than this is reported `stale`.
pub const STALE_AFTER_SECONDS: i64 = 120;
/// Most current leases a task-queue describe lists.
const LEASES_SHOWN: usize = 100;

fn status_of(worker: &WorkerRecord, now: Millis) -> &str {
    if now - worker.last_heartbeat_at > STALE_AFTER_SECONDS * 1000 {
        "stale"
    } else {
        &worker.status
    }
}

fn worker_json(worker: &WorkerRecord, now: Millis) -> Value {
    let doc = &worker.document;
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
        "task_slots": doc.get("task_slots"),
        "process_metrics": doc.get("process_metrics"),
        "capabilities": doc.get("capabilities"),
        "status": status_of(worker, now),
        "last_heartbeat_at": render::time(worker.last_heartbeat_at),
        "registered_at": render::time(worker.registered_at),
        "updated_at": render::time(worker.last_heartbeat_at.max(worker.registered_at)),
        "heartbeat_interval_seconds": HEARTBEAT_INTERVAL_SECONDS,
    })
}

fn worker_not_found(worker_id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "worker_not_found",
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
    let now = now_ms();
    let workers: Vec<Value> = state
        .store
        .workers(&namespace)
        .await?
        .iter()
        .filter(|w| params.get("task_queue").is_none_or(|q| &w.task_queue == q))
        .filter(|w| status.is_none_or(|s| status_of(w, now) == s))
        .map(|w| worker_json(w, now))
        .collect();
    Ok(Json(
        json!({"namespace": namespace, "stale_after_seconds": STALE_AFTER_SECONDS, "workers": workers}),
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
    Ok(Json(worker_json(&worker, now_ms())))
}

/// Operator removal: the registration goes, and the worker's leased workflow tasks are handed
/// back at once (as when a worker deregisters itself).
pub async fn delete_worker<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    Path(worker_id): Path<String>,
) -> ApiResult<Json<Value>> {
    state.config.auth.require(&headers, &[Role::Admin])?;
    let Json(mut body) = super::worker::deregister(State(state), Extension(Namespace(namespace)), Path(worker_id)).await?;
    body["deleted"] = json!(true);
    body["outcome"] = json!("deleted");
    Ok(Json(body))
}

pub async fn list_task_queues<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
) -> ApiResult<Json<Value>> {
    let mut queues = Vec::new();
    for name in state.store.task_queue_names(&namespace).await? {
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
    let now = now_ms();
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
        json!({"status": "open", "budget_source": "worker_slots", "active_worker_count": live.len(),
               "ready_count": ready, "leased_count": leased})
    };
    let mut diagnostics = Vec::new();
    if backlog > 0 && live.is_empty() {
        diagnostics.push(json!({"reason": "no_live_worker",
            "message": format!("{backlog} task(s) wait on this queue and no worker has heartbeated within {STALE_AFTER_SECONDS} s.")}));
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
            "task_slots": w.document.get("task_slots"),
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
