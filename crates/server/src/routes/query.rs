//! Queries: the client's question becomes a query task on the run's task queue; a worker that
//! registered the `query_tasks` capability leases it, replays the committed history and answers.
//! Nothing here writes history.

use crate::auth::Caller;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::long_poll::{poll_request, PollRequest};
use crate::long_poll::{wait_for_work, Look};
use crate::metrics::PollTimer;
use crate::planes::Namespace;
use crate::wait;
use crate::wire::{self, Fields};
use crate::{render, AppState, Shared};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use capstan_app::queries;
use capstan_engine::*;
use capstan_store::{QueryAnswer, QueryClaim, Store};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

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
    Extension(caller): Extension<Caller>,
    Path((workflow_id, query_name)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let target = Asked {
        namespace,
        workflow_id,
        run_id: None,
        query_name,
    };
    ask(state, target, caller, body).await
}

pub async fn query_run<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path((workflow_id, run_id, query_name)): Path<(String, String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let target = Asked {
        namespace,
        workflow_id,
        run_id: Some(run_id),
        query_name,
    };
    ask(state, target, caller, body).await
}

/// What a query asks, of which run.
struct Asked {
    namespace: String,
    workflow_id: String,
    run_id: Option<String>,
    query_name: String,
}

async fn ask<S: Store>(state: Shared<S>, target: Asked, caller: Caller, body: Map<String, Value>) -> ApiResult<Json<Value>> {
    let Asked {
        namespace,
        workflow_id,
        run_id,
        query_name,
    } = target;
    let fail = |error: ApiError| query_error(error, &workflow_id, &query_name);
    let arguments = Fields::new(&body).opt_payload("input", &state.config.limits).map_err(fail)?;
    let request = queries::QueryRequest {
        namespace: namespace.clone(),
        workflow_id: workflow_id.clone(),
        run_id: run_id.clone(),
        query_name: query_name.clone(),
        arguments,
        wait_ms: state.config.query_wait_ms,
        principal: Some(caller.principal),
    };
    let (task, run) = queries::put_query(&*state, request).await.map_err(|e| fail(e.into()))?;
    state.hub.wake(&namespace, TaskKind::Query, &task.task_queue);
    let outcome = match await_answer(&state, &task).await? {
        Ok(outcome) => outcome,
        Err(Some(QueryState::Leased { .. })) => {
            return Err(fail(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                Reason::QueryWorkerTimeout,
                "The worker did not answer the query in time.",
            )));
        }
        Err(_) => {
            return Err(fail(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                Reason::QueryTaskNotClaimed,
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
            Reason::QueryRejected,
            "The worker answered the query with an update verdict.",
        ))),
        QueryOutcome::Failed {
            reason,
            message,
            failure_type,
            stack_trace,
        } => {
            let (status, reason) = match reason.as_deref() {
                Some("rejected_unknown_query") => (StatusCode::NOT_FOUND, Reason::RejectedUnknownQuery),
                Some("invalid_query_arguments") => (StatusCode::UNPROCESSABLE_ENTITY, Reason::InvalidQueryArguments),
                _ => (StatusCode::CONFLICT, Reason::QueryRejected),
            };
            Err(fail(
                ApiError::new(status, reason, message)
                    .with("failure_type", failure_type)
                    .with("stack_trace", stack_trace),
            ))
        }
    }
}

/// Waits for a worker's answer to `task` (a query or a validation) until its deadline, then
/// forgets the task, answered or not: the answer, or the task's last state (`None`: gone). The
/// wait looks before it sleeps, so an answer that came before it began is not missed.
pub(crate) async fn await_answer<S: Store>(state: &AppState<S>, task: &QueryTask) -> ApiResult<Result<QueryOutcome, Option<QueryState>>> {
    let (namespace, id) = (task.namespace.as_str(), task.id.as_str());
    let answered = state.query_answers.channel(id);
    let until = wait::Until::Clock(task.deadline_at);
    let outcome = wait::settle(
        || state.now(),
        until,
        wait::ANSWER_RECHECK,
        Some(&answered),
        || async {
            Ok(match state.store.get_query_task(namespace, id).await?.map(|t| t.state) {
                Some(QueryState::Answered(outcome)) => wait::Look::Settled(Ok(outcome)),
                other => wait::Look::Pending(Err(other)),
            })
        },
    )
    .await?
    .unwrap_or_else(|pending| pending);
    state.query_answers.forget(id);
    queries::forget_query(state, namespace, id).await?;
    Ok(outcome)
}

// ------------------------------------------------------------------------------------------
// Worker side

pub async fn poll_query_task<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    JsonObject(body): JsonObject,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let timer = PollTimer::start("query");
    let mut request = poll_request(&state, &namespace, &body).await?;
    if let Some(shed) = crate::admission::shed_poll(&state, "query_task", &request.queue, request.poll_request_id.as_deref()) {
        return Ok(shed);
    }
    let parking_full = crate::admission::parking_full(&state);
    if parking_full {
        request.wait_ms = 0;
    }
    let found = long_poll_query(&state, &namespace, &request).await?;
    timer.answered(&state.metrics, found.is_some());
    match found {
        Some(task) => Ok(Json(json!({"task": render_query_task(&state, &task).await?, "poll_status": "leased"})).into_response()),
        None if parking_full => Ok(crate::admission::parking_refused(
            &state,
            "query_task",
            &request.queue,
            request.poll_request_id.as_deref(),
        )),
        None => Ok(Json(json!({"task": null, "poll_status": "empty"})).into_response()),
    }
}

async fn long_poll_query<S: Store>(state: &AppState<S>, namespace: &str, request: &PollRequest) -> ApiResult<Option<QueryTask>> {
    let notify = state.hub.channel(namespace, TaskKind::Query, &request.queue);
    let owner = request.worker.worker_id.as_str();
    wait_for_work(&notify, request.wait_ms, None, || async move {
        let claim = QueryClaim {
            namespace: namespace.to_string(),
            queue: request.queue.clone(),
            kind: QueryKind::Query,
            owner: owner.to_string(),
            lease_ms: queries::QUERY_LEASE_MS,
        };
        let claimed = queries::claim_task(state, claim).await?;
        // Any poller of the queue may take any of its query tasks: none claimed, none ready.
        Ok(match claimed {
            Some(task) => {
                tracing::info!(namespace, workflow_id = %task.workflow_id, query_task_id = %task.id, attempt = task.attempt, "query task leased");
                Look::Found(task)
            }
            None => Look::Idle,
        })
    })
    .await
}

/// The run a query or validation task asks about and its committed history, rendered for the
/// worker's replay.
pub(crate) async fn replay_snapshot<S: Store>(state: &AppState<S>, task: &QueryTask) -> ApiResult<(RunState, Vec<Value>)> {
    let max_events = state.config.limits.history_events_max as usize;
    let (run, events) = queries::replay_snapshot(state, task, max_events).await?;
    let history = events.iter().map(|e| render::worker_event(&task.namespace, e)).collect();
    Ok((run, history))
}

async fn render_query_task<S: Store>(state: &AppState<S>, task: &QueryTask) -> ApiResult<Value> {
    let (run, history) = replay_snapshot(state, task).await?;
    let QueryState::Leased { owner, expires_at } = &task.state else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            Reason::QueryTaskNotLeased,
            "The query task is not leased.",
        ));
    };
    let mut body = json!({
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
        "query_admitted_at": render::time(task.created_at),
        "query_deadline_at": render::time(task.deadline_at),
        "server_time": render::time(state.now()),
    });
    if let Some(origin) = &run.origin_trace {
        body["observability_context"] = origin.envelope();
    }
    Ok(body)
}

/// `GET /worker/query-tasks/{id}/status?lease_owner=&query_task_attempt=`: whether the caller
/// still holds the query task's lease (the query-task authority the SDKs check while they
/// replay). It renews nothing; the times are the task's own, as the poll gave them.
pub async fn query_task_status<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(task_id): Path<String>,
    Query(params): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let owner = params
        .get("lease_owner")
        .filter(|o| !o.is_empty())
        .ok_or_else(|| ApiError::validation("lease_owner", "The lease_owner query parameter is required."))?;
    let attempt = params
        .get("query_task_attempt")
        .and_then(|a| a.parse::<u32>().ok())
        .filter(|a| *a >= 1)
        .ok_or_else(|| {
            ApiError::validation(
                "query_task_attempt",
                "The query_task_attempt query parameter must be a positive integer.",
            )
        })?;
    let task = state
        .store
        .get_query_task(&namespace, &task_id)
        .await?
        .filter(|t| t.kind == QueryKind::Query)
        .ok_or_else(|| {
            ApiError::new(StatusCode::NOT_FOUND, Reason::QueryTaskNotFound, "Query task not found.").with("query_task_id", task_id.clone())
        })?;
    let now = state.now();
    let expires_at = task.check_authority(owner, attempt, now)?;
    Ok(Json(json!({
        "query_task_id": task.id,
        "query_task_attempt": attempt,
        "lease_owner": owner,
        "lease_expires_at": render::time(expires_at),
        "query_admitted_at": render::time(task.created_at),
        "query_deadline_at": render::time(task.deadline_at),
        "can_continue": true,
        "query_task_status": "leased",
        "reason": null,
        "server_time": render::time(now),
    })))
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
    let answer = QueryAnswer {
        namespace: namespace.to_string(),
        task_id: id.to_string(),
        owner: owner.to_string(),
        attempt,
        outcome,
    };
    queries::answer_task(state, answer).await.map_err(|error| {
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
    wire::refuse_unknown_fields(
        &failure,
        &[&["message", "reason", "type", "stack_trace"]],
        "failure.",
        "query task failures",
    )?;
    let f = Fields::nested(&failure, "failure.".into());
    let outcome = QueryOutcome::Failed {
        reason: f.opt_str("reason", 255)?,
        message: f.opt_str("message", 1_000_000)?.unwrap_or_else(|| "The query failed.".into()),
        failure_type: f.opt_str("type", 1000)?,
        stack_trace: f.opt_str("stack_trace", 1_000_000)?,
    };
    answer(&state, &namespace, &id, &owner, attempt, outcome).await
}
