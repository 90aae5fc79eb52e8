//! Update validation: an update whose workflow type declares a validator is first put to a worker
//! as a validation task. The worker replays the committed history and runs only the validator;
//! its verdict decides whether the update is accepted (`UpdateAccepted`) or rejected
//! (`UpdateRejected`, 422 `update_validator_rejected`). Python workers take these tasks from the
//! workflow-task poll (`task_kinds: ["workflow", "update_validation"]`); the dedicated poll route
//! serves clients that ask for validations alone.

use super::query::{await_answer, replay_snapshot};
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::long_poll::poll_request;
use crate::long_poll::{wait_for_work, Look};
use crate::metrics::PollTimer;
use crate::planes::Namespace;
use crate::wire::Fields;
use crate::{render, AppState, Shared};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use capstan_app::queries;
use capstan_app::updates::{self, NoValidator, VALIDATION_LEASE_MS};
use capstan_engine::*;
use capstan_store::{QueryAnswer, QueryClaim, Store};
use serde_json::{json, Map, Value};

/// What a validator decided.
pub use capstan_app::updates::Verdict;

fn failure(status: StatusCode, reason: Reason, message: impl Into<String>, retryable: bool) -> ApiError {
    ApiError::new(status, reason, message)
        .with("outcome", "update_validation_failed")
        .with("rejection_reason", reason.as_str())
        .with("retryable", retryable)
}

/// Puts `update_name(arguments)` on `run` to a validating worker of its queue and waits for the
/// verdict. Nothing is recorded here; the caller records the outcome.
pub async fn validate<S: Store>(state: &AppState<S>, run: &RunState, update_name: &str, arguments: &Payload) -> ApiResult<Verdict> {
    let namespace = run.namespace.as_str();
    let task = match updates::put_validation(state, run, update_name, arguments).await? {
        Ok(task) => task,
        Err(NoValidator::NoLiveWorker) => {
            return Err(failure(
                StatusCode::CONFLICT,
                Reason::UpdateValidatorWorkerUnavailable,
                format!("No live worker on task queue {:?} can validate the update.", run.task_queue),
                true,
            ))
        }
        Err(NoValidator::CapabilityUnsupported) => {
            return Err(failure(
                StatusCode::CONFLICT,
                Reason::UpdateValidationCapabilityUnsupported,
                format!("No worker on task queue {:?} runs update validators.", run.task_queue),
                false,
            ))
        }
    };
    // Validations ride the workflow-task poll: wake its pollers.
    state.hub.wake(namespace, TaskKind::Workflow, &task.task_queue);
    match await_answer(state, &task).await? {
        Ok(QueryOutcome::Approved) => Ok(Verdict::Approved),
        Ok(QueryOutcome::Rejected {
            message,
            failure_type,
            validation_errors,
        }) => Ok(Verdict::Rejected(UpdateRejection {
            message,
            failure_type,
            validation_errors,
        })),
        Ok(QueryOutcome::Failed { message, .. }) => Err(failure(
            StatusCode::CONFLICT,
            Reason::UpdateValidationWorkerFailed,
            format!("The worker could not validate the update: {message}"),
            false,
        )),
        Ok(QueryOutcome::Result(_)) => Err(failure(
            StatusCode::CONFLICT,
            Reason::UpdateValidationWorkerFailed,
            "The worker answered the validation with a query result.",
            false,
        )),
        Err(Some(QueryState::Leased { .. })) => Err(failure(
            StatusCode::GATEWAY_TIMEOUT,
            Reason::UpdateValidationExecutionTimeout,
            "The worker did not finish validating the update in time.",
            true,
        )),
        Err(_) => Err(failure(
            StatusCode::GATEWAY_TIMEOUT,
            Reason::UpdateValidationTaskNotClaimed,
            "No worker picked the update validation up in time.",
            true,
        )),
    }
}

/// Leases the oldest validation task of `queue` to `owner`, if any.
pub async fn claim<S: Store>(state: &AppState<S>, namespace: &str, queue: &str, owner: &str) -> ApiResult<Option<QueryTask>> {
    let claim = QueryClaim {
        namespace: namespace.to_string(),
        queue: queue.to_string(),
        kind: QueryKind::UpdateValidation,
        owner: owner.to_string(),
        lease_ms: VALIDATION_LEASE_MS,
    };
    let claimed = queries::claim_task(state, claim).await?;
    if let Some(task) = &claimed {
        tracing::info!(namespace, workflow_id = %task.workflow_id, update_validation_task_id = %task.id, attempt = task.attempt, "update validation leased");
    }
    Ok(claimed)
}

/// A leased validation task as the worker sees it: the replay snapshot plus the update.
pub async fn render_task<S: Store>(state: &AppState<S>, task: &QueryTask) -> ApiResult<Value> {
    let (run, history) = replay_snapshot(state, task).await?;
    let QueryState::Leased { owner, expires_at } = &task.state else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            Reason::UpdateValidationTaskNotLeased,
            "The update validation task is not leased.",
        ));
    };
    Ok(json!({
        "task_kind": "update_validation",
        "update_validation_task_id": task.id,
        "update_id": task.id,
        "update_validation_attempt": task.attempt,
        "lease_owner": owner,
        "lease_expires_at": render::time(*expires_at),
        "namespace": task.namespace,
        "task_queue": task.task_queue,
        "workflow_id": task.workflow_id,
        "run_id": task.run_id,
        "workflow_type": task.workflow_type,
        "update_name": task.query_name,
        "payload_codec": payload::AVRO_CODEC,
        "workflow_arguments": render::envelope(&run.input),
        "update_arguments": task.arguments.as_ref().map(render::envelope),
        "history_events": history,
        "run_status": run.status.as_str(),
        "last_history_sequence": run.last_sequence,
        "total_history_events": run.last_sequence,
    }))
}

// ------------------------------------------------------------------------------------------
// Worker routes

/// `POST /worker/update-validation-tasks/poll`: validations alone (the SDK client's call).
pub async fn poll<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let timer = PollTimer::start("update_validation");
    let request = poll_request(&state, &namespace, &body).await?;
    require_capability(&request.worker)?;
    let notify = state.hub.channel(&namespace, TaskKind::Workflow, &request.queue);
    let owner = request.worker.worker_id.as_str();
    // A validation poller shares the workflow queue's wake-ups; what else is ready there it
    // cannot tell, so it hands on what it does not use.
    let found = wait_for_work(&notify, request.wait_ms, None, || async {
        Ok(match claim(&state, &namespace, &request.queue, owner).await? {
            Some(task) => Look::Found(task),
            None => Look::Missed,
        })
    })
    .await?;
    timer.answered(&state.metrics, found.is_some());
    match found {
        Some(task) => Ok(Json(json!({"task": render_task(&state, &task).await?, "poll_status": "leased"}))),
        None => Ok(Json(json!({"task": null, "poll_status": "empty"}))),
    }
}

/// A poll asking for validations needs a registration that advertised running validators.
pub fn require_capability(worker: &capstan_store::WorkerRecord) -> ApiResult<()> {
    if worker.has_capability(updates::VALIDATION_CAPABILITY) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        Reason::UpdateValidationCapabilityNotAdvertised,
        "This worker did not register the update_validation_tasks capability.",
    )
    .with("task", Value::Null)
    .with("poll_status", "unsupported"))
}

fn fence(body: &Map<String, Value>) -> ApiResult<(String, u32)> {
    let f = Fields::new(body);
    Ok((
        f.req_str("lease_owner", 255)?,
        f.req_int("update_validation_attempt", 1, u32::MAX as i64)? as u32,
    ))
}

/// The DW reasons of a refused verdict.
fn refused(error: capstan_app::AppError, id: &str, attempt: u32) -> ApiError {
    let mut error = ApiError::from(error);
    error.reason = match error.reason {
        Reason::QueryTaskNotFound => Reason::UpdateValidationTaskNotFound,
        Reason::QueryTaskNotLeased => Reason::UpdateValidationTaskNotLeased,
        Reason::LeaseOwnerMismatch => Reason::UpdateValidationLeaseOwnerMismatch,
        Reason::QueryTaskAttemptMismatch => Reason::StaleValidation,
        Reason::LeaseExpired => Reason::UpdateValidationLeaseExpired,
        other => other,
    };
    error.fields.remove("query_task_id");
    error.fields.remove("query_task_attempt");
    error.fields.insert("update_validation_task_id".into(), json!(id));
    error.fields.insert("update_validation_attempt".into(), json!(attempt));
    error.fields.insert("outcome".into(), json!("rejected"));
    error
}

async fn record_verdict<S: Store>(
    state: &AppState<S>,
    namespace: &str,
    id: &str,
    body: &Map<String, Value>,
    outcome: QueryOutcome,
) -> ApiResult<Json<Value>> {
    let (owner, attempt) = fence(body)?;
    let (label, reason) = match &outcome {
        QueryOutcome::Approved => ("approved", None),
        QueryOutcome::Rejected { .. } => ("rejected", Some(Reason::UpdateValidatorRejected.as_str())),
        _ => ("failed", Some("update_validation_worker_failed")),
    };
    let answer = QueryAnswer {
        namespace: namespace.to_string(),
        task_id: id.to_string(),
        owner,
        attempt,
        outcome,
    };
    queries::answer_task(state, answer).await.map_err(|e| refused(e, id, attempt))?;
    state.query_answers.wake(id);
    Ok(Json(json!({
        "update_validation_task_id": id,
        "update_id": id,
        "update_validation_attempt": attempt,
        "outcome": label,
        "reason": reason,
        "status": "completed",
    })))
}

pub async fn approve<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    record_verdict(&state, &namespace, &id, &body, QueryOutcome::Approved).await
}

/// The field errors of a rejection: `{field: [message, …]}` or nothing.
fn validation_errors(value: Option<&Value>) -> ApiResult<Option<Value>> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let well_formed = value.as_object().is_some_and(|fields| {
        fields
            .values()
            .all(|messages| messages.as_array().is_some_and(|m| m.iter().all(Value::is_string)))
    });
    if !well_formed {
        return Err(ApiError::validation(
            "failure.validation_errors",
            "validation_errors must map field names to lists of messages.",
        ));
    }
    Ok(Some(value.clone()).filter(|v| v.as_object().is_some_and(|m| !m.is_empty())))
}

pub async fn reject<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let failure = Fields::new(&body)
        .opt_object("failure")?
        .ok_or_else(|| ApiError::validation("failure", "A rejection needs a failure object."))?;
    let f = Fields::nested(failure, "failure.".into());
    let message = f.req_str("message", 1_000_000)?;
    let failure_type = f.opt_str("type", 1000)?;
    let outcome = match f.opt_str("reason", 255)?.as_deref() {
        Some("update_validation_worker_failed") => QueryOutcome::Failed {
            reason: Some("update_validation_worker_failed".into()),
            message,
            failure_type,
            stack_trace: f.opt_str("stack_trace", 1_000_000)?,
        },
        _ => QueryOutcome::Rejected {
            message,
            failure_type,
            validation_errors: validation_errors(failure.get("validation_errors"))?,
        },
    };
    record_verdict(&state, &namespace, &id, &body, outcome).await
}
