//! The worker plane: registration, long polls, and fenced task reports.

use super::validation;
use crate::admission;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::long_poll::{poll_request, wait_for_work, Look, Parking, PollRequest};
use crate::metrics::PollTimer;
use crate::planes::Namespace;
use crate::wire::{self, Fields};
use crate::{render, AppState, Shared};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::{polls, reports, workers};
use capstan_engine::*;
use capstan_store::{RunLocator, Store, StoreError};
use serde_json::{json, Map, Value};
use std::time::Duration;

use crate::body::JsonObject;

/// A refused worker report: the DW body with `recorded: false` and the task identity.
pub(super) fn refused(error: impl Into<ApiError>, task_id: &str) -> ApiError {
    let mut error: ApiError = error.into();
    if error.status.is_client_error() {
        error.fields.entry("task_id").or_insert_with(|| json!(task_id));
        error.fields.entry("recorded").or_insert(json!(false));
        error.fields.entry("outcome").or_insert(json!("rejected"));
        tracing::warn!(task_id, reason = %error.reason, "worker report refused");
    }
    error
}

// ------------------------------------------------------------------------------------------
// Registration

pub async fn register<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let f = Fields::new(&body);
    let worker_id = f.opt_str("worker_id", 255)?.filter(|s| !s.is_empty());
    let task_queue = f.req_str("task_queue", 255)?;
    let runtime = f.req_str("runtime", 64)?;
    let fingerprints = f.opt_object("workflow_definition_fingerprints")?.cloned().unwrap_or_default();
    let mut document = wire::worker_report::worker_report(&f)?;
    for key in [
        "capabilities",
        "capability_manifest",
        "workflow_command_contracts",
        "max_concurrent_workflow_tasks",
        "max_concurrent_activity_tasks",
        "max_concurrent_worker_sessions",
    ] {
        if let Some(value) = f.raw(key) {
            document.insert(key.to_string(), value.clone());
        }
    }
    let cadence = workers::Cadence::of(&document);
    let registration = workers::Registration {
        namespace: namespace.clone(),
        worker_id,
        task_queue,
        runtime,
        sdk_version: f.opt_str("sdk_version", 64)?,
        build_id: f.opt_str("build_id", 255)?,
        workflow_types: f.string_list("supported_workflow_types")?,
        activity_types: f.string_list("supported_activity_types")?,
        fingerprints,
        document,
    };
    let workers::Registered {
        record,
        registration_token,
    } = workers::register(&*state, registration).await?;
    tracing::info!(namespace, worker_id = record.worker_id, task_queue = record.task_queue, runtime = %record.runtime, "worker registered");
    let body = json!({
        "worker_id": record.worker_id,
        "registered": true,
        "namespace": namespace,
        "task_queue": record.task_queue,
        "runtime": record.runtime,
        "build_id": record.build_id,
        "status": record.status,
        "heartbeat_interval_seconds": cadence.interval_seconds,
        "stale_after_seconds": cadence.stale_after_seconds,
        "capabilities": body.get("capabilities").cloned().unwrap_or(json!([])),
        "capability_manifest": body.get("capability_manifest").cloned().unwrap_or(json!({})),
        "registration_token": registration_token,
    });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// What a worker heartbeat may carry (both SDKs send a subset).
const HEARTBEAT_FIELDS: &[&str] = &["worker_id", "task_slots", "process_metrics", "heartbeat_interval_seconds"];

pub async fn heartbeat<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    wire::refuse_unknown_fields(&body, &[HEARTBEAT_FIELDS], "", "worker heartbeats")?;
    let f = Fields::new(&body);
    let worker_id = f.req_str("worker_id", 255)?;
    let reported = wire::worker_report::worker_report(&f)?;
    match workers::heartbeat(&*state, &namespace, &worker_id, reported).await? {
        Some(worker) => {
            let cadence = workers::Cadence::of(&worker.document);
            Ok(Json(json!({"worker_id": worker_id, "acknowledged": true,
                "heartbeat_interval_seconds": cadence.interval_seconds, "stale_after_seconds": cadence.stale_after_seconds})))
        }
        None => Err(not_registered(&worker_id)),
    }
}

fn not_registered(worker_id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, Reason::WorkerNotRegistered, "The worker is not registered.").with("worker_id", worker_id)
}

pub async fn deregister<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(worker_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let Some(released) = workers::deregister(&*state, &namespace, &worker_id).await? else {
        return Err(
            ApiError::new(StatusCode::NOT_FOUND, Reason::WorkerNotFound, "The worker is not registered.").with("worker_id", worker_id),
        );
    };
    let recovered = released_workflow_tasks(&state, &released);
    tracing::info!(namespace, worker_id, recovered, "worker deregistered");
    Ok(Json(render::deregistered(&worker_id, recovered)))
}

/// `POST /worker/registrations/{id}/deregister` with the registration's `registration_token`:
/// the registration goes only if the token is still its own, and a retry (a lost reply) gets
/// the same receipt for `receipt_retention_seconds`.
pub async fn deregister_fenced<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(worker_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    wire::refuse_unknown_fields(&body, &[&["registration_token"]], "", "fenced deregistrations")?;
    let token = Fields::new(&body).req_str("registration_token", 64)?;
    let (receipt, released) = workers::deregister_fenced(&*state, &namespace, &worker_id, &token).await?;
    if let Some(released) = released {
        let recovered = released_workflow_tasks(&state, &released);
        tracing::info!(namespace, worker_id, recovered, "worker deregistered (fenced)");
    }
    Ok(Json(receipt))
}

/// Wakes the clock for each run whose workflow task a departed worker held and gave back; how
/// many there were.
fn released_workflow_tasks<S: Store>(state: &Shared<S>, released: &[RunState]) -> usize {
    for run in released {
        state.run_changed(run);
    }
    released.len()
}

// ------------------------------------------------------------------------------------------
// Polls

/// The long poll shared by workflow and activity tasks: answer a retried `poll_request_id`
/// with its earlier lease, else lease the oldest ready task, waiting up to the poll timeout.
async fn long_poll<S: Store>(
    state: &AppState<S>,
    namespace: &str,
    request: &PollRequest,
    kind: TaskKind,
) -> ApiResult<Option<(Task, RunState)>> {
    long_poll_with_wait(state, namespace, request, kind, request.wait_ms).await
}

/// [`long_poll`] waiting at most `wait_ms` (0: one look).
async fn long_poll_with_wait<S: Store>(
    state: &AppState<S>,
    namespace: &str,
    request: &PollRequest,
    kind: TaskKind,
    wait_ms: i64,
) -> ApiResult<Option<(Task, RunState)>> {
    let poll = poll_of(state, namespace, request, kind);
    let _turn = turn(state, &poll).await;
    let notify = state.hub.channel(namespace, kind, &request.queue);
    let poll = &poll;
    let park = || polls::park(state, poll);
    let parking = Parking {
        park: &park,
        found: |handed| (handed.task, handed.run),
    };
    wait_for_work(&notify, wait_ms, Some(parking), || async move {
        Ok(claim_counted(state, poll).await?.into())
    })
    .await
}

fn poll_of<S: Store>(state: &AppState<S>, namespace: &str, request: &PollRequest, kind: TaskKind) -> polls::Poll {
    polls::Poll {
        namespace: namespace.to_string(),
        worker: request.worker.clone(),
        kind,
        poll_request_id: request.poll_request_id.clone(),
        lease_ms: match kind {
            TaskKind::Workflow => state.config.workflow_task_lease_ms,
            _ => state.config.activity_task_lease_ms,
        },
    }
}

/// A concurrent duplicate of a poll (a client retry) waits for the first to answer, then gets
/// the same lease from the memo.
async fn turn<S: Store>(state: &AppState<S>, poll: &polls::Poll) -> Option<capstan_sync::KeyedGuard> {
    let key = poll.key()?;
    let name = format!(
        "{}|{}|{}|{}|{}",
        key.namespace,
        key.task_queue,
        key.worker_id,
        key.kind.as_str(),
        key.poll_request_id
    );
    Some(state.poll_requests.lock(&name).await)
}

/// One look of a poll: a retried poll's earlier lease, else a claim (both `polls::claim`).
async fn look_for_task<S: Store>(state: &AppState<S>, poll: &polls::Poll) -> ApiResult<Look<(Task, RunState)>> {
    let _turn = turn(state, poll).await;
    Ok(claim_counted(state, poll).await?.into())
}

/// A claim, with a look its queue's limits held back counted.
async fn claim_counted<S: Store>(state: &AppState<S>, poll: &polls::Poll) -> ApiResult<polls::Claim> {
    let claim = polls::claim(state, poll).await?;
    if let polls::Claim::Throttled { held_by, .. } = &claim {
        state
            .metrics
            .throttled(&poll.namespace, poll.kind, &poll.worker.task_queue, held_by);
    }
    Ok(claim)
}

enum Leased {
    Workflow(Box<(Task, RunState)>),
    Validation(Box<QueryTask>),
}

/// A workflow poll that also takes update validations: a waiting validation goes first (a client
/// request is blocked on it), then workflow tasks. A retried `poll_request_id` gets its earlier
/// workflow-task lease back; a validation lease lost with its response runs out and is re-offered.
async fn multiplexed_poll<S: Store>(
    state: &AppState<S>,
    namespace: &str,
    request: &PollRequest,
    kinds: PollKinds,
) -> ApiResult<Option<Leased>> {
    if kinds.workflow {
        if let Some(recalled) = long_poll_with_wait(state, namespace, request, TaskKind::Workflow, 0).await? {
            return Ok(Some(Leased::Workflow(Box::new(recalled))));
        }
    }
    let notify = state.hub.channel(namespace, TaskKind::Workflow, &request.queue);
    let owner = request.worker.worker_id.as_str();
    let poll = &poll_of(state, namespace, request, TaskKind::Workflow);
    let park = || polls::park(state, poll);
    let parking = kinds.workflow.then_some(Parking {
        park: &park,
        found: |handed| Leased::Workflow(Box::new((handed.task, handed.run))),
    });
    wait_for_work(&notify, request.wait_ms, parking, || async move {
        if let Some(task) = validation::claim(state, namespace, &request.queue, owner).await? {
            return Ok(Look::Found(Leased::Validation(Box::new(task))));
        }
        if !kinds.workflow {
            // Whether workflow work it does not take is ready, this poll cannot tell: hand on.
            return Ok(Look::Missed);
        }
        Ok(match look_for_task(state, poll).await? {
            Look::Found(leased) => Look::Found(Leased::Workflow(Box::new(leased))),
            Look::Missed => Look::Missed,
            Look::Idle => Look::Idle,
            Look::Throttled(ms) => Look::Throttled(ms),
            Look::Ended => Look::Ended,
        })
    })
    .await
}

/// A worker whose build-id cohort is draining gets no new work: its poll is held (so it does
/// not spin) and answered empty with `poll_status: draining`. If the cohort is resumed while the
/// poll waits, the poll goes on normally.
async fn hold_if_draining<S: Store>(state: &Shared<S>, request: &mut PollRequest) -> ApiResult<Option<Json<Value>>> {
    let deadline = state.now() + request.wait_ms;
    let mut draining = workers::is_draining(&**state, &request.worker).await?;
    while draining {
        let left = deadline - state.now();
        if left <= 0 {
            return Ok(Some(Json(json!({"task": null, "poll_status": "draining"}))));
        }
        tokio::time::sleep(Duration::from_millis(left.min(500) as u64)).await;
        draining = workers::is_draining(&**state, &request.worker).await?;
    }
    // Whatever was spent held counts against the poll's wait.
    request.wait_ms = (deadline - state.now()).max(0).min(request.wait_ms);
    Ok(None)
}

fn empty_poll() -> Json<Value> {
    Json(json!({"task": null, "poll_status": "timeout"}))
}

/// Which kinds of work a workflow-task poll takes (`task_kinds`; default: workflow tasks only).
#[derive(Clone, Copy)]
struct PollKinds {
    workflow: bool,
    update_validation: bool,
}

fn poll_kinds(body: &Map<String, Value>) -> ApiResult<PollKinds> {
    let Some(value) = body.get("task_kinds").filter(|v| !v.is_null()) else {
        return Ok(PollKinds {
            workflow: true,
            update_validation: false,
        });
    };
    let invalid = || {
        ApiError::validation(
            "task_kinds",
            "task_kinds must list one or both of \"workflow\" and \"update_validation\", each once.",
        )
    };
    let kinds = value.as_array().ok_or_else(invalid)?;
    let mut chosen = PollKinds {
        workflow: false,
        update_validation: false,
    };
    for kind in kinds {
        let slot = match kind.as_str() {
            Some("workflow") => &mut chosen.workflow,
            Some("update_validation") => &mut chosen.update_validation,
            _ => return Err(invalid()),
        };
        if *slot {
            return Err(invalid());
        }
        *slot = true;
    }
    if kinds.is_empty() {
        return Err(invalid());
    }
    Ok(chosen)
}

pub async fn poll_workflow_task<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let timer = PollTimer::start("workflow");
    let kinds = poll_kinds(&body)?;
    let mut request = poll_request(&state, &namespace, &body).await?;
    if let Some(shed) = admission::shed_poll(&state, "workflow_task", &request.queue, request.poll_request_id.as_deref()) {
        return Ok(shed);
    }
    let parking_full = admission::parking_full(&state);
    if parking_full {
        request.wait_ms = 0;
    }
    if let Some(drained) = hold_if_draining(&state, &mut request).await? {
        return Ok(drained.into_response());
    }
    if kinds.update_validation {
        validation::require_capability(&request.worker)?;
    }
    let leased = if kinds.update_validation {
        multiplexed_poll(&state, &namespace, &request, kinds).await?
    } else {
        long_poll(&state, &namespace, &request, TaskKind::Workflow)
            .await?
            .map(|leased| Leased::Workflow(Box::new(leased)))
    };
    let (task, run) = match leased {
        None if parking_full => {
            return Ok(admission::parking_refused(
                &state,
                "workflow_task",
                &request.queue,
                request.poll_request_id.as_deref(),
            ));
        }
        None => {
            timer.answered(&state.metrics, false);
            return Ok(empty_poll().into_response());
        }
        Some(Leased::Validation(task)) => {
            PollTimer::answered(timer, &state.metrics, true);
            let reply = json!({"task": validation::render_task(&state, &task).await?, "poll_status": "leased"});
            return Ok(Json(reply).into_response());
        }
        Some(Leased::Workflow(leased)) => {
            timer.answered(&state.metrics, true);
            state.metrics.dispatched(TaskKind::Workflow, leased.0.fence);
            *leased
        }
    };
    let snapshot = match &task.detail {
        TaskDetail::Workflow { history_snapshot, .. } => *history_snapshot,
        _ => 0,
    };
    let page = state
        .history
        .page(&state.store, &run.namespace, &run.run_id, 0, snapshot, request.history_page_size)
        .await?;
    let last = page.last.unwrap_or(0);
    let next = (last < snapshot).then(|| render::page_token(last));
    let mut rendered = render::workflow_task(&run, &task, next);
    if let Some(dispatch) = state.config.telemetry.dispatched(&run, &task, state.now()) {
        rendered["dispatch_observability_context"] = dispatch;
    }
    let task = render::with_raw_member(&rendered, "history_events", &page.json);
    Ok(render::RawJson(format!("{{\"task\":{task}}}")).into_response())
}

pub async fn poll_activity_task<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let timer = PollTimer::start("activity");
    let mut request = poll_request(&state, &namespace, &body).await?;
    if let Some(shed) = admission::shed_poll(&state, "activity_task", &request.queue, request.poll_request_id.as_deref()) {
        return Ok(shed);
    }
    let parking_full = admission::parking_full(&state);
    if parking_full {
        request.wait_ms = 0;
    }
    if let Some(drained) = hold_if_draining(&state, &mut request).await? {
        return Ok(drained.into_response());
    }
    let leased = long_poll(&state, &namespace, &request, TaskKind::Activity).await?;
    timer.answered(&state.metrics, leased.is_some());
    match leased {
        Some((task, run)) => {
            state.metrics.dispatched(TaskKind::Activity, task.fence);
            let mut rendered = render::activity_task(&run, &task);
            if let Some(dispatch) = state.config.telemetry.dispatched(&run, &task, state.now()) {
                rendered["dispatch_observability_context"] = dispatch;
            }
            if let Some(session) = session_view(&state, &run, &task.id).await? {
                rendered["worker_session"] = session;
            }
            // Lease-renewing SDKs count the claim's lease from this instant.
            let server_time = capstan_engine::timefmt::iso8601_micros(state.server_time_us());
            Ok(Json(json!({"task": rendered, "server_time": server_time})).into_response())
        }
        None if parking_full => Ok(admission::parking_refused(
            &state,
            "activity_task",
            &request.queue,
            request.poll_request_id.as_deref(),
        )),
        None => Ok(empty_poll().into_response()),
    }
}

/// What a session activity's task, heartbeat and status replies carry: the session's options
/// as the workflow gave them, its queue, and its live state.
pub(crate) async fn session_view<S: Store>(state: &AppState<S>, run: &RunState, task_id: &TaskId) -> ApiResult<Option<Value>> {
    let Some(requirement) = capstan_app::sessions::session_of_task(run, task_id) else {
        return Ok(None);
    };
    let session = state.store.get_session(&run.namespace, &requirement.options.session_id).await?;
    Ok(session.map(|s| s.task_view(&requirement.as_sent)))
}

// ------------------------------------------------------------------------------------------
// Workflow task reports

pub(super) struct WorkflowLeaseClaim {
    pub owner: String,
    pub attempt: u64,
}

pub(super) fn workflow_claim(body: &Map<String, Value>) -> ApiResult<WorkflowLeaseClaim> {
    let f = Fields::new(body);
    Ok(WorkflowLeaseClaim {
        owner: f.req_str("lease_owner", 255)?,
        attempt: f.req_int("workflow_task_attempt", 1, i64::MAX)? as u64,
    })
}

pub async fn workflow_task_history<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<render::RawJson> {
    let claim = workflow_claim(&body)?;
    let f = Fields::new(&body);
    let token = f.req_str("next_history_page_token", 64)?;
    let page_size = f.opt_int("history_page_size", 1, 1000)?.unwrap_or(500) as usize;
    let task_id = TaskId(task_id);
    let run = state
        .store
        .load_run(&namespace, RunLocator::Task(task_id.clone()))
        .await?
        .ok_or_else(|| {
            refused(
                StoreError::Refused(Refusal::new(Reason::TaskNotFound, "Task not found.")),
                task_id.as_str(),
            )
        })?;
    let task = capstan_engine::check_workflow_lease(&run, state.now(), &task_id, &claim.owner, claim.attempt)
        .map_err(|r| refused(r, task_id.as_str()))?;
    let snapshot = match &task.detail {
        TaskDetail::Workflow { history_snapshot, .. } => *history_snapshot,
        _ => 0,
    };
    let after = render::parse_page_token(&token).filter(|after| *after <= snapshot).ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            Reason::InvalidPageToken,
            "The history page token is not valid for this task.",
        )
    })?;
    let events = state
        .history
        .page(&state.store, &namespace, &run.run_id, after, snapshot, page_size)
        .await?;
    let last = events.last.unwrap_or(after);
    let next = (last < snapshot).then(|| render::page_token(last));
    let mut page = json!({
        "task_id": task_id,
        "workflow_task_attempt": claim.attempt,
        "total_history_events": snapshot,
        "next_history_page_token": next,
    });
    page.as_object_mut().expect("an object").extend(render::history_budget(&run));
    Ok(render::RawJson(render::with_raw_member(&page, "history_events", &events.json)))
}

pub async fn heartbeat_workflow_task<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let claim = workflow_claim(&body)?;
    let lease_ms = state.config.workflow_task_lease_ms;
    let lease = workflow_lease(&namespace, &task_id, &claim);
    let (lease, run) = reports::heartbeat_workflow_task(&*state, lease, lease_ms)
        .await
        .map_err(|e| refused(e, &task_id))?;
    let mut reply = json!({
        "task_id": task_id,
        "workflow_task_attempt": claim.attempt,
        "lease_owner": lease.owner,
        "renewed": true,
        "lease_expires_at": render::time(lease.expires_at),
        "run_status": run.status.as_str(),
        "task_status": "leased",
        "reason": null,
    });
    if let Some(request) = &run.cancellation {
        reply["cancellation_request"] = render::cancellation_request(request);
    }
    Ok(Json(reply))
}

/// What a workflow task completion may carry.
const COMPLETION_FIELDS: &[&str] = &[
    "lease_owner",
    "workflow_task_attempt",
    "commands",
    "sticky_cache",
    "message_stream_cursors",
    "message_stream_waits",
];

pub async fn complete_workflow_task<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let claim = workflow_claim(&body)?;
    let parsed = wire::refuse_unknown_fields(&body, &[COMPLETION_FIELDS], "", "workflow task completions")
        .and_then(|()| wire::parse_commands(body.get("commands"), &state.config.limits))
        .and_then(|commands| Ok((commands, wire::parse_sticky_claim(&body)?, wire::parse_stream_progress(&body)?)));
    let (commands, sticky, streams) = parsed.map_err(|mut e| {
        e.fields.insert("task_id".into(), json!(task_id));
        e.fields.insert("workflow_task_attempt".into(), json!(claim.attempt));
        e
    })?;
    let mut lease = workflow_lease(&namespace, &task_id, &claim);
    lease.principal = Some(caller.principal);
    let stream_names: Vec<String> = commands
        .iter()
        .filter_map(|c| match c {
            WorkflowCommand::RecordSideEffect { stream: Some(d), .. } => Some(d.stream_name.clone()),
            _ => None,
        })
        .collect();
    let (receipt, run) = reports::complete_workflow_task(&*state, lease, commands, sticky, streams)
        .await
        .map_err(|e| refused(e, &task_id))?;
    state.run_changed(&run);
    for name in &stream_names {
        state
            .stream_appends
            .wake(&super::workflow_streams::wake_key(run.run_id.as_str(), name));
    }
    tracing::info!(namespace, workflow_id = %run.workflow_id, run_id = %run.run_id, task_id, fence = claim.attempt,
        run_status = run.status.as_str(), retained = receipt.retained, "workflow task completed");
    Ok(Json(json!({
        "task_id": task_id,
        "workflow_task_attempt": claim.attempt,
        "outcome": "completed",
        "recorded": true,
        "retained": receipt.retained,
        "run_id": run.run_id,
        "run_status": receipt.run_status.as_str(),
        "created_task_ids": render::receipt_created(&receipt),
        "reason": null,
    })))
}

pub async fn fail_workflow_task<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let claim = workflow_claim(&body)?;
    let failure = workflow_task_failure(&body)?;
    let benign = failure.failure_type.as_deref() == Some(WAITING_FOR_HISTORY_FAILURE);
    let message = failure.message.clone();
    let mut lease = workflow_lease(&namespace, &task_id, &claim);
    lease.principal = Some(caller.principal);
    let (receipt, run) = reports::fail_workflow_task(&*state, lease, failure)
        .await
        .map_err(|e| refused(e, &task_id))?;
    state.run_changed(&run);
    if benign {
        tracing::debug!(namespace, workflow_id = %run.workflow_id, task_id, "workflow task closed: waiting for history");
    } else {
        tracing::warn!(namespace, workflow_id = %run.workflow_id, run_id = %run.run_id, task_id, fence = claim.attempt, %message, "workflow task failed; offered again after backoff");
    }
    Ok(Json(json!({
        "task_id": task_id,
        "workflow_task_attempt": claim.attempt,
        "outcome": "failed",
        "recorded": true,
        "retained": receipt.retained,
        "reason": null,
        "next_task_id": receipt.created_task_ids.first(),
    })))
}

/// The fields of DW's workflow-task `failure` object; others are refused by name.
const WORKFLOW_TASK_FAILURE_FIELDS: &[&str] = &["message", "type", "reason", "sequence", "stack_trace"];

/// A workflow-task failure report's `failure`, every field kept (message and stack trace are
/// bounded on the run, see `capstan_engine::task_failure`).
fn workflow_task_failure(body: &Map<String, Value>) -> ApiResult<WorkflowTaskFailure> {
    let failure_map = Fields::new(body).opt_object("failure")?.cloned().unwrap_or_default();
    wire::refuse_unknown_fields(&failure_map, &[WORKFLOW_TASK_FAILURE_FIELDS], "failure.", "workflow task failures")?;
    let ff = Fields::nested(&failure_map, "failure.".into());
    Ok(WorkflowTaskFailure {
        message: ff.opt_str("message", 1_000_000)?.unwrap_or_default(),
        failure_type: ff.opt_str("type", 1000)?,
        reason: ff.opt_str("reason", 1000)?,
        sequence: ff.opt_int("sequence", 0, i64::MAX)?.map(|s| s as u64),
        stack_trace: ff.opt_str("stack_trace", 1_000_000)?,
    })
}

pub(super) fn workflow_lease(namespace: &str, task_id: &str, claim: &WorkflowLeaseClaim) -> reports::WorkflowLease {
    reports::WorkflowLease {
        namespace: namespace.to_string(),
        task_id: TaskId(task_id.to_string()),
        owner: claim.owner.clone(),
        attempt: claim.attempt,
        principal: None,
    }
}

pub(super) fn attempt_lease(namespace: &str, task_id: &str, attempt_id: &ActivityAttemptId, owner: String) -> reports::AttemptLease {
    reports::AttemptLease {
        namespace: namespace.to_string(),
        task_id: TaskId(task_id.to_string()),
        attempt_id: attempt_id.clone(),
        owner,
        principal: None,
    }
}

// ------------------------------------------------------------------------------------------
// Activity task reports

pub(super) fn activity_claim(body: &Map<String, Value>) -> ApiResult<(ActivityAttemptId, String)> {
    let f = Fields::new(body);
    let attempt = f
        .opt_str("activity_attempt_id", 255)?
        .or(f.opt_str("attempt_id", 255)?)
        .filter(|s| !s.is_empty());
    let attempt = attempt.ok_or_else(|| ApiError::validation("activity_attempt_id", "The activity_attempt_id field is required."))?;
    Ok((ActivityAttemptId(attempt), f.req_str("lease_owner", 255)?))
}

pub(super) fn activity_refused(error: impl Into<ApiError>, task_id: &str, attempt_id: &ActivityAttemptId) -> ApiError {
    let mut error = refused(error, task_id);
    error.fields.entry("activity_attempt_id").or_insert_with(|| json!(attempt_id));
    if matches!(error.reason, Reason::RunCancelled | Reason::RunTerminated | Reason::RunClosed) {
        error.fields.insert("outcome".into(), json!("ignored"));
    }
    error
}

pub async fn complete_activity_task<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let (attempt_id, owner) = activity_claim(&body)?;
    let result = Fields::new(&body)
        .opt_payload("result", &state.config.limits)?
        .unwrap_or_else(|| Payload::avro(crate::avro::null_blob()));
    let mut lease = attempt_lease(&namespace, &task_id, &attempt_id, owner);
    lease.principal = Some(caller.principal);
    let (receipt, run) = reports::complete_activity(&*state, lease, result)
        .await
        .map_err(|e| activity_refused(e, &task_id, &attempt_id))?;
    state.run_changed(&run);
    tracing::info!(namespace, workflow_id = %run.workflow_id, run_id = %run.run_id, task_id, activity_attempt_id = %attempt_id, retained = receipt.retained, "activity completed");
    Ok(Json(json!({
        "task_id": task_id,
        "activity_attempt_id": attempt_id,
        "outcome": "completed",
        "recorded": true,
        "retained": receipt.retained,
        "reason": null,
        "next_task_id": receipt.next_task_id,
    })))
}

pub async fn fail_activity_task<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let (attempt_id, owner) = activity_claim(&body)?;
    let failure_map = Fields::new(&body).opt_object("failure")?.cloned().unwrap_or_default();
    let failure = wire::parse_activity_failure(&failure_map, &state.config.limits)?;
    let mut lease = attempt_lease(&namespace, &task_id, &attempt_id, owner);
    lease.principal = Some(caller.principal);
    let (receipt, run) = reports::fail_activity(&*state, lease, failure)
        .await
        .map_err(|e| activity_refused(e, &task_id, &attempt_id))?;
    state.run_changed(&run);
    tracing::info!(namespace, workflow_id = %run.workflow_id, run_id = %run.run_id, task_id, activity_attempt_id = %attempt_id,
        retry_task = ?receipt.created_task_ids.first(), "activity attempt failed");
    Ok(Json(json!({
        "task_id": task_id,
        "activity_attempt_id": attempt_id,
        "outcome": "failed",
        "recorded": true,
        "retained": receipt.retained,
        "reason": null,
        "next_task_id": receipt.next_task_id.or(receipt.created_task_ids.first().cloned()),
    })))
}

pub async fn heartbeat_activity_task<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let (attempt_id, owner) = activity_claim(&body)?;
    let owner_echo = owner.clone();
    let lease_ms = state.config.activity_task_lease_ms;
    let details = body.get("details").cloned().filter(|d| !d.is_null());
    let lease = attempt_lease(&namespace, &task_id, &attempt_id, owner);
    let (beat, run) = reports::heartbeat_activity(&*state, lease, lease_ms, details)
        .await
        .map_err(|e| activity_refused(e, &task_id, &attempt_id))?;
    // A session activity's heartbeat renews its session; one the worker no longer holds ends
    // the activity's right to go on.
    let session = match capstan_app::sessions::renew_for_activity(&*state, &run, &TaskId(task_id.clone()), &owner_echo).await {
        Ok(view) => view,
        Err(error) => {
            let mut error = activity_refused(error, &task_id, &attempt_id);
            error.fields.insert("can_continue".into(), json!(false));
            error.fields.insert("heartbeat_recorded".into(), json!(false));
            return Err(error);
        }
    };
    let mut reply = json!({
        "task_id": task_id,
        "activity_attempt_id": attempt_id,
        "lease_owner": owner_echo,
        "cancel_requested": beat.cancel_requested,
        "can_continue": beat.can_continue,
        "reason": beat.reason,
        "heartbeat_recorded": beat.lease.is_some(),
        "lease_expires_at": render::opt_time(beat.lease.as_ref().map(|l| l.expires_at)),
        "last_heartbeat_at": render::time(state.now()),
    });
    if let Some(session) = session {
        reply["worker_session"] = session;
    }
    Ok(Json(reply))
}
