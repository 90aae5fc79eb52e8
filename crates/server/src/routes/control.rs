//! The control plane: start, describe, list, history, signal, cancel, terminate.

use crate::auth::Caller;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wait;
use crate::wire::{self, Fields};
use crate::{render, AppState, Shared};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::control;
use capstan_engine::*;
use capstan_store::{DuplicatePolicy, ListCursor, ListFilter, RunLocator, RunSummary, StartOutcome, Store};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

fn control_plane(operation: &str, workflow_id: &str) -> Value {
    json!({"operation": operation, "workflow_id": workflow_id})
}

/// Adds `control_plane.operation` to an error so the SDKs can route it (signal vs query…).
pub(super) fn in_operation(mut error: ApiError, operation: &str, workflow_id: &str) -> ApiError {
    error
        .fields
        .entry("control_plane")
        .or_insert_with(|| control_plane(operation, workflow_id));
    error.fields.entry("workflow_id").or_insert_with(|| json!(workflow_id));
    error
}

const REJECTED_START_FIELDS: &[&str] = &[
    "workflow_execution_timeout",
    "workflow_run_timeout",
    "workflow_task_timeout",
    "retry_policy",
    "idempotency_key",
    "request_id",
];

fn start_request(state: &AppState<impl Store>, namespace: &str, body: &Map<String, Value>) -> ApiResult<control::StartRequest> {
    let f = Fields::new(body);
    for field in REJECTED_START_FIELDS {
        if body.contains_key(*field) {
            return Err(ApiError::validation(field, format!("The {field} field is not supported on start.")));
        }
    }
    let workflow_type = f.req_str("workflow_type", 255)?;
    let workflow_id = match f.opt_str("workflow_id", 128)? {
        Some(id) if !wire::valid_workflow_id(&id) => {
            return Err(ApiError::validation(
                "workflow_id",
                "The workflow_id may only contain letters, digits, '.', '_', ':' and '-'.",
            ))
        }
        id => id,
    };
    let max = state.config.limits.delay_seconds_max;
    let duplicate_policy = match f.opt_str("duplicate_policy", 32)?.as_deref() {
        None | Some("fail") => DuplicatePolicy::Fail,
        Some("use-existing") => DuplicatePolicy::UseExisting,
        Some(other) => {
            return Err(ApiError::validation(
                "duplicate_policy",
                format!("duplicate_policy must be \"fail\" or \"use-existing\", not {other:?}."),
            ))
        }
    };
    Ok(control::StartRequest {
        namespace: namespace.to_string(),
        workflow_id,
        workflow_type,
        task_queue: f.task_queue()?,
        input: f.arguments("input", &state.config.limits)?,
        execution_timeout_seconds: f.opt_int("execution_timeout_seconds", 1, max)?,
        run_timeout_seconds: f.opt_int("run_timeout_seconds", 1, max)?,
        business_key: f.opt_str("business_key", 255)?,
        memo: f.opt_object("memo")?.cloned().unwrap_or_default(),
        search_attributes: f.opt_object("search_attributes")?.cloned().unwrap_or_default(),
        // `build_id` wins over its SDK-neutral alias `compatibility`.
        build_id: match f.opt_str("build_id", 255)? {
            Some(build) => Some(build),
            None => f.opt_str("compatibility", 255)?,
        },
        duplicate_policy,
        origin_trace: f.opt_trace("observability_context")?,
        principal: None,
        priority: f.opt_int("priority", i64::MIN, i64::MAX)?,
        fairness_key: f.opt_str("fairness_key", 255)?,
        fairness_weight: f.opt_int("fairness_weight", i64::MIN, i64::MAX)?,
    })
}

pub async fn start<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let mut request = start_request(&state, &namespace, &body)?;
    request.principal = Some(caller.principal);
    let workflow_id = request.workflow_id.clone().unwrap_or_default();
    let control::Started { outcome, run } = control::start(&*state, request)
        .await
        .map_err(|e| in_operation(e.into(), "start", &workflow_id))?;
    let (status, outcome) = match outcome {
        StartOutcome::StartedNew => {
            state.run_changed(&run);
            tracing::info!(namespace, workflow_id = %run.workflow_id, run_id = %run.run_id, workflow_type = %run.workflow_type, "workflow started");
            (StatusCode::CREATED, "started_new")
        }
        StartOutcome::ReturnedExistingActive => (StatusCode::OK, "returned_existing_active"),
    };
    let body = json!({
        "workflow_id": run.workflow_id,
        "run_id": run.run_id,
        "workflow_type": run.workflow_type,
        "namespace": namespace,
        "status": run.status.as_str(),
        "business_key": run.business_key,
        "payload_codec": payload::AVRO_CODEC,
        "task_queue": run.task_queue,
        "outcome": outcome,
        "command_id": run.start_command_id,
        "control_plane": control_plane("start", run.workflow_id.as_str()),
    });
    Ok((status, Json(body)).into_response())
}

/// Wakes the clock for a fresh application's new deadlines.
pub(super) fn applied<S: Store>(state: &AppState<S>, receipt: control::Receipt) -> (Value, bool) {
    if let Some(run) = &receipt.run {
        state.run_changed(run);
    }
    (receipt.body, receipt.retained)
}

async fn describe_at<S: Store>(state: &Shared<S>, namespace: &str, locator: RunLocator, workflow_id: &str) -> ApiResult<Json<Value>> {
    let run = state
        .store
        .load_run(namespace, locator.clone())
        .await?
        .ok_or_else(|| match &locator {
            RunLocator::Run(_, run_id) => ApiError::new(StatusCode::NOT_FOUND, Reason::RunNotFound, "Workflow run not found.")
                .with("workflow_id", workflow_id)
                .with("run_id", run_id.as_str()),
            _ => ApiError::new(StatusCode::NOT_FOUND, Reason::InstanceNotFound, "Workflow not found.").with("workflow_id", workflow_id),
        })?;
    let runs = state.store.runs_of(namespace, &run.workflow_id).await?;
    let current = runs.last().map(|r| r.run_id.clone()).unwrap_or_else(|| run.run_id.clone());
    let mut body = render::describe(&run, runs.len(), &current);
    body["started_by"] = started_by(state, &run).await?;
    body["control_plane"] = control_plane("describe", workflow_id);
    Ok(Json(body))
}

/// Who started the run: the principal its `WorkflowStarted` records (`null`: the server, e.g.
/// a schedule's own firing), read from the run's first events.
async fn started_by<S: Store>(state: &Shared<S>, run: &RunState) -> ApiResult<Value> {
    let first = state.store.history(&run.run_id, 0, run.last_sequence.min(3), 3).await?;
    Ok(first
        .iter()
        .find(|event| event.event_type == EventType::WorkflowStarted)
        .and_then(|event| event.payload.get("principal").cloned())
        .unwrap_or(Value::Null))
}

pub async fn describe<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(workflow_id): Path<String>,
) -> ApiResult<Json<Value>> {
    describe_at(
        &state,
        &namespace,
        RunLocator::Current(WorkflowId(workflow_id.clone())),
        &workflow_id,
    )
    .await
}

pub async fn describe_run<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    describe_at(
        &state,
        &namespace,
        RunLocator::Run(WorkflowId(workflow_id.clone()), RunId(run_id)),
        &workflow_id,
    )
    .await
}

pub async fn runs<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(workflow_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let runs = state.store.runs_of(&namespace, &WorkflowId(workflow_id.clone())).await?;
    if runs.is_empty() {
        return Err(ApiError::new(StatusCode::NOT_FOUND, Reason::InstanceNotFound, "Workflow not found.").with("workflow_id", workflow_id));
    }
    let rows: Vec<Value> = runs.iter().map(render::summary).collect();
    Ok(Json(json!({"workflow_id": workflow_id, "run_count": rows.len(), "runs": rows})))
}

const LIST_PAGE_MAX: usize = 200;

pub async fn list<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let filter = list_filter(&state, &namespace, &query).await?;
    let ListPage { rows, next_page_token } = list_page(&state, &namespace, &query, filter).await?;
    let workflows: Vec<Value> = rows.iter().map(render::summary).collect();
    Ok(Json(json!({
        "workflows": workflows,
        "workflow_count": workflows.len(),
        "next_page_token": next_page_token,
    })))
}

/// One page of a run listing and the token of the next.
pub(super) struct ListPage {
    pub rows: Vec<RunSummary>,
    pub next_page_token: Option<String>,
}

/// The page `query` asks for (`page_size`, `status`, `next_page_token`) of the runs `filter`
/// selects, newest first.
pub(super) async fn list_page<S: Store>(
    state: &Shared<S>,
    namespace: &str,
    query: &HashMap<String, String>,
    mut filter: ListFilter,
) -> ApiResult<ListPage> {
    let page_size = match query.get("page_size") {
        None => 50,
        Some(raw) => raw
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=LIST_PAGE_MAX).contains(n))
            .ok_or_else(|| ApiError::validation("page_size", format!("page_size must be between 1 and {LIST_PAGE_MAX}.")))?,
    };
    // Page tokens name the last row returned (keyset paging, so a deep page costs what the
    // first one does); a bare number is an offset, as older tokens were.
    let (offset, after) = match query.get("next_page_token").filter(|t| !t.is_empty()) {
        None => (0, None),
        Some(token) => parse_list_token(token)
            .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, Reason::InvalidPageToken, "The page token is not valid."))?,
    };
    filter.after = after;
    let (rows, more) = state.store.list_runs(namespace, filter, offset, page_size).await?;
    let next_page_token = match rows.last() {
        Some(last) if more => Some(list_token(last)),
        _ => None,
    };
    Ok(ListPage { rows, next_page_token })
}

/// `GET /api/workflow-counts`: current runs per status bucket under the list filters (without
/// `status`), for the bucket tabs of a listing.
pub async fn counts<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let filter = list_filter(&state, &namespace, &query).await?;
    let counts = state.store.count_runs(&namespace, filter).await?;
    Ok(Json(json!({
        "namespace": namespace,
        "running": counts.running,
        "completed": counts.completed,
        "failed": counts.failed,
        "paused": counts.paused,
        "total": counts.running + counts.completed + counts.failed,
        // false: the filter matched more runs than a count goes through (`COUNT_SCAN_MAX`),
        // and each figure is a lower bound.
        "exact": !counts.at_least,
    })))
}

/// The filters a listing and its counts share: `workflow_type`, `task_queue`, `status` (a
/// bucket; counts ignore it) and `query` (a visibility filter, or free text matched against
/// workflow ids and business keys).
async fn list_filter<S: Store>(state: &Shared<S>, namespace: &str, query: &HashMap<String, String>) -> ApiResult<ListFilter> {
    let asked = capstan_app::listing::ListQuery {
        workflow_type: query.get("workflow_type").cloned(),
        task_queue: query.get("task_queue").cloned(),
        status: query.get("status").cloned(),
        query: query.get("query").cloned(),
    };
    Ok(capstan_app::listing::filter(&**state, namespace, &asked).await?)
}

fn list_token(last: &RunSummary) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", last.started_at, last.run_id.as_str()))
}

fn parse_list_token(token: &str) -> Option<(usize, Option<ListCursor>)> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD.decode(token.trim()).ok()?;
    let text = String::from_utf8(bytes).ok()?;
    match text.split_once(':') {
        Some((started_at, run_id)) if !run_id.is_empty() => Some((
            0,
            Some(ListCursor {
                started_at: started_at.parse().ok()?,
                run_id: run_id.to_string(),
            }),
        )),
        Some(_) => None,
        None => Some((text.parse().ok()?, None)),
    }
}

const HISTORY_PAGE_MAX: usize = 1000;

/// A run by workflow id and run id, or `404 run_not_found`.
async fn named_run<S: Store>(state: &Shared<S>, namespace: &str, workflow_id: &str, run_id: &str) -> ApiResult<RunState> {
    let locator = RunLocator::Run(WorkflowId(workflow_id.to_string()), RunId(run_id.to_string()));
    state.store.load_run(namespace, locator).await?.ok_or_else(|| {
        ApiError::new(StatusCode::NOT_FOUND, Reason::RunNotFound, "Workflow run not found.")
            .with("workflow_id", workflow_id)
            .with("run_id", run_id)
    })
}

/// `GET /api/workflows/{id}/runs/{run}/integrity`: re-walks the run's history hash chain from its
/// origin and says where it breaks, if it does.
pub async fn integrity<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let run = named_run(&state, &namespace, &workflow_id, &run_id).await?;
    let events = state
        .store
        .history(&run.run_id, 0, run.last_sequence, run.last_sequence as usize)
        .await?;
    let broken_at = capstan_engine::history::verify_chain_from(&run.chain_origin, &events).err();
    Ok(Json(json!({
        "workflow_id": workflow_id,
        "run_id": run_id,
        "event_count": events.len(),
        "chain_origin": run.chain_origin,
        "head_hash": run.last_hash,
        "chain_verified": broken_at.is_none() && events.len() as u64 == run.last_sequence,
        "broken_at_sequence": broken_at,
        "integrity_incident": run.integrity_incident,
    })))
}

pub async fn history<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id)): Path<(String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let page_size = match query.get("page_size") {
        None => 100,
        Some(raw) => raw
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=HISTORY_PAGE_MAX).contains(n))
            .ok_or_else(|| ApiError::validation("page_size", format!("page_size must be between 1 and {HISTORY_PAGE_MAX}.")))?,
    };
    let after = match query.get("next_page_token").filter(|t| !t.is_empty()) {
        None => 0,
        Some(token) => render::parse_page_token(token)
            .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, Reason::InvalidPageToken, "The page token is not valid."))?,
    };
    let locator = RunLocator::Run(WorkflowId(workflow_id.clone()), RunId(run_id.clone()));
    let wait_new_event = matches!(query.get("wait_new_event").map(String::as_str), Some("1" | "true"));
    let until = wait::Until::Clock(state.now() + wait::HISTORY_WAIT_MS);
    let looked = wait::settle(
        || state.now(),
        until,
        wait::HISTORY_RECHECK,
        None,
        || async {
            let run = state.store.load_run(&namespace, locator.clone()).await?.ok_or_else(|| {
                ApiError::new(StatusCode::NOT_FOUND, Reason::RunNotFound, "Workflow run not found.")
                    .with("workflow_id", workflow_id.clone())
                    .with("run_id", run_id.clone())
            })?;
            Ok(if wait_new_event && run.last_sequence <= after && !run.is_closed() {
                wait::Look::Pending(run)
            } else {
                wait::Look::Settled(run)
            })
        },
    )
    .await?;
    let run = looked.unwrap_or_else(|pending| pending);
    let events = state.store.history(&run.run_id, after, run.last_sequence, page_size).await?;
    let last = events.last().map(|e| e.sequence).unwrap_or(after);
    let rows: Vec<Value> = events.iter().map(render::control_event).collect();
    let mut body = json!({
        "workflow_id": workflow_id,
        "run_id": run_id,
        "events": rows,
        "next_page_token": (last < run.last_sequence).then(|| render::page_token(last)),
        // A failing workflow task writes no event; its cause is shown beside the history.
        "workflow_task_failure": run.workflow_task_failure.as_ref().map(render::task_failure),
    });
    body.as_object_mut().expect("an object").extend(render::history_budget(&run));
    Ok(Json(body))
}

// ------------------------------------------------------------------------------------------
// Signal, cancel, terminate

pub(super) fn target(namespace: &str, workflow_id: &str, run_id: Option<String>) -> control::Target {
    control::Target {
        namespace: namespace.to_string(),
        workflow_id: workflow_id.to_string(),
        run_id,
    }
}

pub(crate) async fn signal_impl<S: Store>(
    state: Shared<S>,
    caller: Caller,
    (namespace, workflow_id, run_id): (String, String, Option<String>),
    signal_name: String,
    body: Map<String, Value>,
) -> ApiResult<Response> {
    let fail = |e: ApiError| in_operation(e, "signal", &workflow_id);
    let f = Fields::new(&body);
    let input = f.opt_payload("input", &state.config.limits).map_err(fail)?;
    let request_id = f.opt_str("request_id", 255).map_err(fail)?.filter(|s| !s.is_empty());
    let trace = f.opt_trace("observability_context").map_err(fail)?;
    let request = control::SignalRequest {
        target: target(&namespace, &workflow_id, run_id),
        signal_name: signal_name.clone(),
        input: input.unwrap_or_else(|| Payload::avro(crate::avro::empty_arguments_blob())),
        request_id: request_id.clone(),
        trace,
        principal: Some(caller.principal),
    };
    let receipt_body = {
        let (workflow_id, signal_name) = (workflow_id.clone(), signal_name.clone());
        move |receipt: &CommandReceipt, run: &RunState| {
            json!({
                "workflow_id": workflow_id,
                "run_id": run.run_id,
                "signal_name": signal_name,
                "signal_id": receipt.signal_id,
                "outcome": "signal_received",
                "command_id": receipt.command_id,
                "command_sequence": receipt.command_sequence,
                "command_status": "accepted",
                "request_id": request_id,
                "control_plane": {"operation": "signal", "workflow_id": workflow_id, "operation_name": signal_name},
            })
        }
    };
    let receipt = control::signal(&*state, request, receipt_body).await.map_err(|e| fail(e.into()))?;
    let (mut body, retained) = applied(&state, receipt);
    if retained {
        body["intent_verified"] = json!(true);
    }
    tracing::info!(namespace, workflow_id, signal_name, "signal received");
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

pub async fn signal<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path((workflow_id, signal_name)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    signal_impl(state, caller, (namespace, workflow_id, None), signal_name, body).await
}

pub async fn signal_run<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path((workflow_id, run_id, signal_name)): Path<(String, String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    signal_impl(state, caller, (namespace, workflow_id, Some(run_id)), signal_name, body).await
}

async fn close_impl<S: Store>(
    state: Shared<S>,
    caller: Caller,
    (namespace, workflow_id, run_id): (String, String, Option<String>),
    kind: CloseCommand,
    body: Map<String, Value>,
) -> ApiResult<Json<Value>> {
    let outcome = match kind {
        CloseCommand::Cancel => "cancelled",
        CloseCommand::Terminate => "terminated",
    };
    let mut request = control::CloseRequest {
        target: target(&namespace, &workflow_id, run_id),
        kind,
        reason: None,
        request_id: None,
        trace: None,
        principal: Some(caller.principal),
    };
    let operation = request.operation();
    let f = Fields::new(&body);
    request.trace = f
        .opt_trace("observability_context")
        .map_err(|e| in_operation(e, operation, &workflow_id))?;
    request.reason = f.opt_str("reason", 1000).map_err(|e| in_operation(e, operation, &workflow_id))?;
    request.request_id = f
        .opt_str("request_id", 255)
        .map_err(|e| in_operation(e, operation, &workflow_id))?
        .filter(|s| !s.is_empty());
    let request_id = request.request_id.clone();
    let render_receipt = {
        let (workflow_id, reason) = (workflow_id.clone(), request.reason.clone());
        move |receipt: &CommandReceipt, run: &RunState| {
            json!({
                "workflow_id": workflow_id,
                "run_id": run.run_id,
                "outcome": outcome,
                "command_id": receipt.command_id,
                "command_sequence": receipt.command_sequence,
                "command_status": "accepted",
                "reason": reason,
                "control_plane": {"operation": operation, "workflow_id": workflow_id},
            })
        }
    };
    let receipt = control::close(&*state, request, render_receipt)
        .await
        .map_err(|e| in_operation(e.into(), operation, &workflow_id))?;
    let (mut body, retained) = applied(&state, receipt);
    if let (Some(request_id), false) = (&request_id, retained) {
        body["request_id"] = json!(request_id);
    }
    tracing::info!(namespace, workflow_id, operation, "workflow closed by command");
    Ok(Json(body))
}

pub async fn cancel<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(workflow_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    close_impl(state, caller, (namespace, workflow_id, None), CloseCommand::Cancel, body).await
}

pub async fn cancel_run<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path((workflow_id, run_id)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    close_impl(state, caller, (namespace, workflow_id, Some(run_id)), CloseCommand::Cancel, body).await
}

pub async fn terminate<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(workflow_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    close_impl(state, caller, (namespace, workflow_id, None), CloseCommand::Terminate, body).await
}

pub async fn terminate_run<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path((workflow_id, run_id)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    close_impl(state, caller, (namespace, workflow_id, Some(run_id)), CloseCommand::Terminate, body).await
}

// ------------------------------------------------------------------------------------------
// History export

/// `GET /workflows/{id}/runs/{run}/history/export`: the run's history and metadata as a DW
/// `durable-workflow.v2.history-export` bundle with a `json-recursive-ksort-v1` SHA-256 checksum.
pub async fn export_history<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let run = named_run(&state, &namespace, &workflow_id, &run_id).await?;
    let runs = state.store.runs_of(&namespace, &run.workflow_id).await?;
    let current = runs.last().map(|r| r.run_id.clone()).unwrap_or_else(|| run.run_id.clone());
    let events = state
        .store
        .history(&run.run_id, 0, run.last_sequence, state.config.limits.history_events_max as usize)
        .await?;
    Ok(Json(crate::history_export::bundle(
        &namespace,
        &run,
        &current,
        &events,
        state.now(),
    )))
}

/// `POST /workflows/{id}/repair`: offer a stuck run's workflow task again (see `engine::repair`).
pub async fn repair<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(workflow_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let f = Fields::new(&body);
    let request_id = f
        .opt_str("request_id", 255)
        .map_err(|e| in_operation(e, "repair", &workflow_id))?
        .filter(|s| !s.is_empty());
    let render_receipt = {
        let workflow_id = workflow_id.clone();
        move |outcome: &RepairOutcome, run: &RunState| {
            json!({
                "workflow_id": workflow_id,
                "run_id": run.run_id,
                "outcome": if outcome.dispatched { "repair_dispatched" } else { "repair_not_needed" },
                "task_id": outcome.task_id,
                "command_id": outcome.command.command_id,
                "command_sequence": outcome.command.command_sequence,
                "command_status": "accepted",
                "reason": null,
                "control_plane": {"operation": "repair", "workflow_id": workflow_id},
            })
        }
    };
    let receipt = control::repair(
        &*state,
        target(&namespace, &workflow_id, None),
        request_id,
        Some(caller.principal),
        render_receipt,
    )
    .await
    .map_err(|e| in_operation(e.into(), "repair", &workflow_id))?;
    let (body, _) = applied(&state, receipt);
    tracing::info!(namespace, workflow_id, outcome = %body["outcome"], "repair requested");
    Ok(Json(body))
}

/// `POST /workflows/{id}/archive`: archive the closed current run (read-only from then on).
pub async fn archive<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(workflow_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let f = Fields::new(&body);
    let reason = f.opt_str("reason", 1000).map_err(|e| in_operation(e, "archive", &workflow_id))?;
    let request_id = f
        .opt_str("request_id", 255)
        .map_err(|e| in_operation(e, "archive", &workflow_id))?
        .filter(|s| !s.is_empty());
    let render_receipt = {
        let workflow_id = workflow_id.clone();
        move |(archived, receipt): &(bool, CommandReceipt), run: &RunState| {
            json!({
                "workflow_id": workflow_id,
                "run_id": run.run_id,
                "outcome": if *archived { "archived" } else { "archive_not_needed" },
                "command_id": receipt.command_id,
                "command_status": "accepted",
                "reason": null,
                "control_plane": {"operation": "archive", "workflow_id": workflow_id},
            })
        }
    };
    let receipt = control::archive(
        &*state,
        target(&namespace, &workflow_id, None),
        reason,
        request_id,
        Some(caller.principal),
        render_receipt,
    )
    .await
    .map_err(|e| in_operation(e.into(), "archive", &workflow_id))?;
    let (body, _) = applied(&state, receipt);
    tracing::info!(namespace, workflow_id, outcome = %body["outcome"], "archive requested");
    Ok(Json(body))
}
