//! Cooperative cancellation (worker protocol 1.20): `request-cancellation` asks a run to stop
//! while leaving it open; a capable worker delivers the request to workflow code at one authored
//! call (`deliver-cancellation`), the code cleans up, and the run ends cancelled. `/cancel` stays
//! the immediate close it always was.

use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::Fields;
use crate::{render, Shared};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_engine::*;
use capstan_store::{RunLocator, Store};
use serde_json::{json, Map, Value};

const CLEANUP_TIMEOUT_DEFAULT_SECONDS: i64 = 600;
const CLEANUP_TIMEOUT_MAX_SECONDS: i64 = 3600;

fn in_request(mut error: ApiError, workflow_id: &str) -> ApiError {
    error
        .fields
        .entry("control_plane")
        .or_insert_with(|| json!({"operation": "request_cancellation", "workflow_id": workflow_id}));
    error.fields.entry("workflow_id").or_insert_with(|| json!(workflow_id));
    error
}

pub async fn request<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<crate::auth::Caller>,
    Path(workflow_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    request_impl(state, caller, (namespace, workflow_id, None), body).await
}

pub async fn request_run<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<crate::auth::Caller>,
    Path((workflow_id, run_id)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    request_impl(state, caller, (namespace, workflow_id, Some(run_id)), body).await
}

async fn request_impl<S: Store>(
    state: Shared<S>,
    caller: crate::auth::Caller,
    (namespace, workflow_id, run_id): (String, String, Option<String>),
    body: Map<String, Value>,
) -> ApiResult<Response> {
    let fail = |e: ApiError| in_request(e, &workflow_id);
    let f = Fields::new(&body);
    let reason = f.opt_str("reason", 1000).map_err(fail)?;
    let timeout = f
        .opt_int("cleanup_timeout_seconds", 1, CLEANUP_TIMEOUT_MAX_SECONDS)
        .map_err(fail)?
        .unwrap_or(CLEANUP_TIMEOUT_DEFAULT_SECONDS);
    let target = capstan_app::control::Target {
        namespace: namespace.clone(),
        workflow_id: workflow_id.clone(),
        run_id,
    };
    let (outcome, run) = capstan_app::cancellation::request(&*state, target, reason, timeout, Some(caller.principal))
        .await
        .map_err(|e| fail(e.into()))?;
    let status = if outcome.duplicate {
        StatusCode::OK
    } else {
        state.run_changed(&run);
        tracing::info!(namespace, workflow_id, run_id = %run.run_id, request_id = %outcome.request.request_id, "cooperative cancellation requested");
        StatusCode::ACCEPTED
    };
    let body = json!({
        "workflow_id": workflow_id,
        "run_id": run.run_id,
        "accepted": true,
        "duplicate": outcome.duplicate,
        "run_status": run.status.as_str(),
        "cancellation_request": render::cancellation_request(&outcome.request),
        "reason": null,
        "control_plane": {"operation": "request_cancellation", "workflow_id": workflow_id},
    });
    Ok((status, Json(body)).into_response())
}

/// `POST /worker/workflow-tasks/{task}/deliver-cancellation`: commit the delivery on the lease.
pub async fn deliver<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let f = Fields::new(&body);
    let owner = f.req_str("lease_owner", 255)?;
    let attempt = f.req_int("workflow_task_attempt", 1, i64::MAX)? as u64;
    let max = u32::MAX as i64;
    let delivery = DeliveryRequest {
        request_id: f.req_str("request_id", 255)?,
        sequence: f.req_int("sequence", 1, max)? as u32,
        call_kind: f.req_str("call_kind", 64)?,
        sequence_span: f.opt_int("sequence_span", 1, 1000)?.unwrap_or(1) as u32,
        operation_sequence: f.opt_int("operation_sequence", 1, max)?.map(|o| o as u32),
        operation_sequence_span: f.opt_int("operation_sequence_span", 1, 1000)?.unwrap_or(1) as u32,
    };
    let lease = capstan_app::reports::WorkflowLease {
        namespace: namespace.clone(),
        task_id: TaskId(task_id.clone()),
        owner,
        attempt,
        principal: None,
    };
    let (outcome, run) = capstan_app::cancellation::deliver(&*state, lease, delivery).await.map_err(|e| {
        let mut error = ApiError::from(e);
        error.fields.insert("task_id".into(), json!(task_id));
        error.fields.insert("workflow_task_attempt".into(), json!(attempt));
        error.fields.entry("delivered").or_insert(json!(false));
        error
    })?;
    state.run_changed(&run);
    let done = match outcome {
        DeliveryOutcome::Delivered(done) => done,
        // DW's "claim released" reply: the worker neither completes nor fails the task; the
        // run's next task comes once the stopped activities' workers have acknowledged.
        DeliveryOutcome::Waiting(reason) => {
            return Ok(Json(json!({
                "delivered": false,
                "reason": reason.as_str(),
                "claim_released": true,
                "task_id": task_id,
                "workflow_run_id": run.run_id,
            })))
        }
    };
    Ok(Json(json!({
        "delivered": true,
        "task_id": task_id,
        "workflow_run_id": run.run_id,
        "request_id": run.cancellation.as_ref().map(|r| r.request_id.clone()),
        "sequence": done.sequence,
        "call_kind": done.call_kind,
        "sequence_span": done.sequence_span,
        "operation_sequence": done.operation_sequence,
        "operation_sequence_span": done.operation_sequence_span,
        "reason": null,
    })))
}

/// `POST /worker/activity-tasks/{task}/status`: whether an activity attempt still holds its
/// claim, without recording a heartbeat (cooperative Python workers ask about once a second).
pub async fn activity_status<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let f = Fields::new(&body);
    let attempt_id = f.req_str("activity_attempt_id", 255)?;
    let owner = f.req_str("lease_owner", 255)?;
    let id = TaskId(task_id.clone());
    let run = state
        .store
        .load_run(&namespace, RunLocator::Task(id.clone()))
        .await?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, Reason::TaskNotFound, "Task not found.").with("task_id", task_id.clone()))?;
    let now = state.now();
    let live = run.tasks.get(&id).and_then(|task| match (&task.detail, task.lease()) {
        (
            TaskDetail::Activity {
                attempt_id: Some(current), ..
            },
            Some(lease),
        ) if current.as_str() == attempt_id && lease.owner == owner && lease.expires_at > now => Some(lease.expires_at),
        _ => None,
    });
    // An attempt a delivered cancellation stopped: its holder gets the stop receipt.
    let stopped = stopped_attempt(&run, &id, &ActivityAttemptId(attempt_id.clone())).filter(|s| s.lease_owner == owner);
    let reason = match (live, run.is_closed()) {
        (Some(_), _) => None,
        (None, _) if stopped.is_some() => Some(Reason::ActivityCancelled.as_str()),
        (None, true) => Some(match run.closed_reason {
            Some(ClosedReason::Cancelled) => "run_cancelled",
            Some(ClosedReason::Terminated) => "run_terminated",
            _ => "run_closed",
        }),
        (None, false) => Some("attempt_closed"),
    };
    // What the Rust SDK's cooperative observer checks before and while it runs the attempt.
    let task_status = match run.tasks.get(&id) {
        Some(_) if live.is_some() => "leased",
        Some(task) if task.is_ready() => "ready",
        Some(_) => "leased",
        None => "closed",
    };
    let activity_open = run.tasks.get(&id).is_some_and(|task| match &task.detail {
        TaskDetail::Activity { execution_id, .. } => run.activities.contains_key(execution_id),
        _ => false,
    });
    let mut reply = json!({
        "task_id": task_id,
        "task_status": task_status,
        "attempt_status": if live.is_some() { "running" } else { "closed" },
        "activity_status": if activity_open { "running" } else { "closed" },
        "activity_attempt_id": attempt_id,
        "lease_owner": owner,
        "can_continue": live.is_some(),
        "cancel_requested": live.is_none() && (run.is_closed() || stopped.is_some()),
        "heartbeat_recorded": false,
        "reason": reason,
        "lease_expires_at": live.map(render::time),
        "run_status": run.status.as_str(),
    });
    if let Some(stopped) = stopped {
        reply["cancellation_acknowledgement"] = stopped.receipt_view();
    }
    if let Some(session) = super::worker::session_view(&state, &run, &id).await? {
        reply["worker_session"] = session;
    }
    Ok(Json(reply))
}

/// The fields an acknowledgement takes (both SDKs send exactly these).
const ACKNOWLEDGEMENT_FIELDS: &[&str] = &["activity_attempt_id", "lease_owner", "request_id"];

/// `POST /worker/activity-tasks/{task}/acknowledge-cancellation`: the worker of an attempt a
/// cooperative cancellation stopped says its callback has stopped. Accepted after the attempt
/// (and its run) ended, which is when it comes; a repeat gets the first receipt.
pub async fn acknowledge<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    crate::wire::refuse_unknown_fields(&body, &[ACKNOWLEDGEMENT_FIELDS], "", "activity cancellation acknowledgements")?;
    let (attempt_id, owner) = super::worker::activity_claim(&body)?;
    let request_id = Fields::new(&body).req_str("request_id", 255)?;
    let lease = super::worker::attempt_lease(&namespace, &task_id, &attempt_id, owner.clone());
    let (receipt, run) = capstan_app::cancellation::acknowledge_stop(&*state, lease, request_id.clone())
        .await
        .map_err(|e| {
            let mut error: ApiError = e.into();
            error.fields.entry("task_id").or_insert_with(|| json!(task_id));
            error.fields.entry("activity_attempt_id").or_insert_with(|| json!(attempt_id));
            error.fields.insert("acknowledged".into(), json!(false));
            error
        })?;
    let ack = &receipt.acknowledgement;
    if !receipt.duplicate {
        tracing::info!(namespace, workflow_id = %run.workflow_id, task_id, activity_attempt_id = %attempt_id,
            in_history = ack.in_history, "activity callback stop acknowledged");
    }
    Ok(Json(json!({
        "task_id": task_id,
        "activity_attempt_id": attempt_id,
        "lease_owner": owner,
        "request_id": request_id,
        "acknowledged": true,
        "duplicate": receipt.duplicate,
        "reason": null,
        "heartbeat_recorded": false,
        "history_event_id": ack.id,
        "recorded_in_history": ack.in_history,
        "received_after_deadline": ack.received_after_deadline,
    })))
}
