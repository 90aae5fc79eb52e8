//! Queries: the client's question becomes a query task on the run's task queue; a worker that
//! registered the `query_tasks` capability leases it, replays the committed history and answers.
//! Nothing here writes history.

use super::worker::{poll_request, wait_for_work, PollRequest};
use super::Namespace;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::wire::Fields;
use crate::{now_ms, render, AppState, Shared};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use capstan_engine::*;
use capstan_store::{RunLocator, Store};
use serde_json::{json, Map, Value};
use std::time::Duration;

/// A registration heard from within this window counts as a live query worker.
const WORKER_FRESH_MS: i64 = 180_000;
/// Lease of one query attempt.
const QUERY_LEASE_MS: i64 = 10_000;
/// Cross-node answers are noticed by re-reading the task this often.
const ANSWER_RECHECK_MS: u64 = 50;

fn query_error(error: ApiError, workflow_id: &str, query_name: &str) -> ApiError {
    let mut error = error;
    error
        .fields
        .entry("control_plane")
        .or_insert_with(|| json!({"operation": "query", "workflow_id": workflow_id, "operation_name": query_name}));
    error.fields.entry("workflow_id").or_insert_with(|| json!(workflow_id));
    error.fields.entry("query_name").or_insert_with(|| json!(query_name));
    error
}

pub async fn query<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, query_name)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    ask(state, namespace, workflow_id, None, query_name, body).await
}

pub async fn query_run<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id, query_name)): Path<(String, String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    ask(state, namespace, workflow_id, Some(run_id), query_name, body).await
}

async fn ask<S: Store>(
    state: Shared<S>,
    namespace: String,
    workflow_id: String,
    run_id: Option<String>,
    query_name: String,
    body: Map<String, Value>,
) -> ApiResult<Json<Value>> {
    let fail = |error: ApiError| query_error(error, &workflow_id, &query_name);
    let arguments = Fields::new(&body).opt_payload("input", &state.config.limits).map_err(fail)?;
    if query_name.is_empty() || query_name.len() > 255 {
        return Err(fail(ApiError::validation(
            "query_name",
            "The query name must be 1 to 255 characters.",
        )));
    }
    let locator = match &run_id {
        Some(run_id) => RunLocator::Run(WorkflowId(workflow_id.clone()), RunId(run_id.clone())),
        None => RunLocator::Current(WorkflowId(workflow_id.clone())),
    };
    let run = state.store.load_run(&namespace, locator).await?.ok_or_else(|| {
        fail(match &run_id {
            Some(run_id) => ApiError::new(StatusCode::NOT_FOUND, "run_not_found", "Workflow run not found.").with("run_id", run_id.clone()),
            None => ApiError::new(StatusCode::NOT_FOUND, "instance_not_found", "Workflow not found."),
        })
    })?;
    let now = now_ms();
    let live_workers = state
        .store
        .queue_workers(&namespace, &run.task_queue)
        .await?
        .into_iter()
        .filter(|w| {
            let capable = w
                .document
                .get("capabilities")
                .and_then(Value::as_array)
                .is_some_and(|c| c.iter().any(|c| c == "query_tasks"));
            capable && now - w.last_heartbeat_at <= WORKER_FRESH_MS
        });
    if live_workers.count() == 0 {
        return Err(fail(ApiError::new(
            StatusCode::CONFLICT,
            "query_worker_unavailable",
            format!("No live worker on task queue {:?} answers queries.", run.task_queue),
        )));
    }
    let task = QueryTask {
        id: ulid::Ulid::new().to_string(),
        kind: QueryKind::Query,
        namespace: namespace.clone(),
        task_queue: run.task_queue.clone(),
        workflow_id: workflow_id.clone(),
        run_id: run.run_id.to_string(),
        workflow_type: run.workflow_type.clone(),
        query_name: query_name.clone(),
        arguments,
        state: QueryState::Ready,
        attempt: 0,
        created_at: now,
        deadline_at: now + state.config.query_wait_ms,
    };
    let id = task.id.clone();
    let answered = state.query_answers.channel(&id);
    state.store.create_query_task(task.clone()).await?;
    state.hub.wake(&namespace, TaskKind::Query, &task.task_queue);
    let outcome = loop {
        let woken = answered.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let current = state.store.get_query_task(&namespace, &id).await?;
        match current.map(|t| t.state) {
            Some(QueryState::Answered(outcome)) => break Ok(outcome),
            other if now_ms() >= task.deadline_at => break Err(other),
            _ => {}
        }
        tokio::select! {
            _ = &mut woken => {}
            _ = tokio::time::sleep(Duration::from_millis(ANSWER_RECHECK_MS)) => {}
        }
    };
    state.query_answers.forget(&id);
    state.store.delete_query_task(&namespace, &id).await?;
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(Some(QueryState::Leased { .. })) => {
            return Err(fail(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "query_worker_timeout",
                "The worker did not answer the query in time.",
            )));
        }
        Err(_) => {
            return Err(fail(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "query_task_not_claimed",
                "No worker picked the query up in time.",
            )));
        }
    };
    match outcome {
        QueryOutcome::Result(payload) => Ok(Json(json!({
            "workflow_id": workflow_id,
            "run_id": run.run_id,
            "query_name": query_name,
            "result": null,
            "result_envelope": render::envelope(&payload),
            "reason": null,
            "target_scope": if run_id.is_some() { "run" } else { "instance" },
            "control_plane": {"operation": "query", "workflow_id": workflow_id, "operation_name": query_name},
        }))),
        QueryOutcome::Approved | QueryOutcome::Rejected { .. } => Err(fail(ApiError::new(
            StatusCode::CONFLICT,
            "query_rejected",
            "The worker answered the query with an update verdict.",
        ))),
        QueryOutcome::Failed {
            reason,
            message,
            failure_type,
        } => {
            let (status, reason) = match reason.as_deref() {
                Some("rejected_unknown_query") => (StatusCode::NOT_FOUND, "rejected_unknown_query"),
                Some("invalid_query_arguments") => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_query_arguments"),
                _ => (StatusCode::CONFLICT, "query_rejected"),
            };
            Err(fail(ApiError::new(status, reason, message).with("failure_type", failure_type)))
        }
    }
}

// ------------------------------------------------------------------------------------------
// Worker side

pub async fn poll_query_task<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let request = poll_request(&state, &namespace, &body).await?;
    match long_poll_query(&state, &namespace, &request).await? {
        Some(task) => Ok(Json(
            json!({"task": render_query_task(&state, &task).await?, "poll_status": "leased"}),
        )),
        None => Ok(Json(json!({"task": null, "poll_status": "empty"}))),
    }
}

async fn long_poll_query<S: Store>(state: &AppState<S>, namespace: &str, request: &PollRequest) -> ApiResult<Option<QueryTask>> {
    let notify = state.hub.channel(namespace, TaskKind::Query, &request.queue);
    let owner = request.worker.worker_id.as_str();
    wait_for_work(&notify, request.wait_ms, || async move {
        let claimed = state
            .store
            .claim_query_task(namespace, &request.queue, QueryKind::Query, owner, QUERY_LEASE_MS, now_ms())
            .await?;
        if let Some(task) = &claimed {
            tracing::info!(namespace, workflow_id = %task.workflow_id, query_task_id = %task.id, attempt = task.attempt, "query task leased");
        }
        Ok(claimed)
    })
    .await
}

/// The run a query or validation task asks about and its committed history (everything up to
/// the run's current last event), which the worker replays before answering.
pub(crate) async fn replay_snapshot<S: Store>(state: &AppState<S>, task: &QueryTask) -> ApiResult<(RunState, Vec<Value>)> {
    let run = state
        .store
        .load_run(
            &task.namespace,
            RunLocator::Run(WorkflowId(task.workflow_id.clone()), RunId(task.run_id.clone())),
        )
        .await?
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "run_not_found", "The run is gone."))?;
    let events = state
        .store
        .history(&run.run_id, 0, run.last_sequence, state.config.limits.history_events_max as usize)
        .await?;
    let history = events.iter().map(|e| render::worker_event(&task.namespace, e)).collect();
    Ok((run, history))
}

async fn render_query_task<S: Store>(state: &AppState<S>, task: &QueryTask) -> ApiResult<Value> {
    let (run, history) = replay_snapshot(state, task).await?;
    let QueryState::Leased { owner, expires_at } = &task.state else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "query_task_not_leased",
            "The query task is not leased.",
        ));
    };
    Ok(json!({
        "query_task_id": task.id,
        "query_task_attempt": task.attempt,
        "lease_owner": owner,
        "lease_expires_at": render::time(*expires_at),
        "namespace": task.namespace,
        "task_queue": task.task_queue,
        "workflow_id": task.workflow_id,
        "run_id": task.run_id,
        "workflow_type": task.workflow_type,
        "query_name": task.query_name,
        "payload_codec": payload::AVRO_CODEC,
        "workflow_arguments": render::envelope(&run.input),
        "query_arguments": task.arguments.as_ref().map(render::envelope),
        "history_events": history,
        "run_status": run.status.as_str(),
        "last_history_sequence": run.last_sequence,
        "total_history_events": run.last_sequence,
    }))
}

fn claim(body: &Map<String, Value>) -> ApiResult<(String, u32)> {
    let f = Fields::new(body);
    Ok((
        f.req_str("lease_owner", 255)?,
        f.req_int("query_task_attempt", 1, u32::MAX as i64)? as u32,
    ))
}

async fn answer<S: Store>(
    state: &AppState<S>,
    namespace: &str,
    id: &str,
    owner: &str,
    attempt: u32,
    outcome: QueryOutcome,
) -> ApiResult<Json<Value>> {
    let completed = matches!(outcome, QueryOutcome::Result(_));
    state
        .store
        .answer_query_task(namespace, id, owner, attempt, outcome, now_ms())
        .await
        .map_err(|error| {
            let mut error = ApiError::from(error);
            error.fields.entry("query_task_id").or_insert_with(|| json!(id));
            error.fields.entry("recorded").or_insert(json!(false));
            error
        })?;
    state.query_answers.wake(id);
    Ok(Json(json!({
        "query_task_id": id,
        "query_task_attempt": attempt,
        "outcome": if completed { "completed" } else { "failed" },
        "recorded": true,
        "reason": null,
    })))
}

pub async fn complete_query_task<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let (owner, attempt) = claim(&body)?;
    let f = Fields::new(&body);
    let limits = &state.config.limits;
    // Python sends both the raw JSON `result` and the envelope: the envelope is the answer.
    let payload = match f.opt_payload("result_envelope", limits)? {
        Some(payload) => payload,
        None => match body.get("result") {
            Some(Value::Object(_)) | Some(Value::String(_)) => f.opt_payload("result", limits)?.expect("present"),
            _ => Payload::avro(crate::avro::null_blob()),
        },
    };
    answer(&state, &namespace, &id, &owner, attempt, QueryOutcome::Result(payload)).await
}

pub async fn fail_query_task<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let (owner, attempt) = claim(&body)?;
    let failure = Fields::new(&body).opt_object("failure")?.cloned().unwrap_or_default();
    let f = Fields::nested(&failure, "failure.".into());
    let outcome = QueryOutcome::Failed {
        reason: f.opt_str("reason", 255)?,
        message: f.opt_str("message", 1_000_000)?.unwrap_or_else(|| "The query failed.".into()),
        failure_type: f.opt_str("type", 1000)?,
    };
    answer(&state, &namespace, &id, &owner, attempt, outcome).await
}
