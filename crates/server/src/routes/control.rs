//! The control plane: start, describe, list, history, signal, cancel, terminate.

use super::worker::after_change;
use super::Namespace;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::wire::{self, Fields};
use crate::{now_ms, render, AppState, Shared};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_engine::*;
use capstan_store::{
    intent_hash, CommandKey, DuplicatePolicy, KeyedReceipt, ListCursor, ListFilter, RunLocator, RunSummary, StartOutcome, Store, StoreError,
};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

fn control_plane(operation: &str, workflow_id: &str) -> Value {
    json!({"operation": operation, "workflow_id": workflow_id})
}

/// Adds `control_plane.operation` to an error so the SDKs can route it (signal vs query…).
fn in_operation(mut error: ApiError, operation: &str, workflow_id: &str) -> ApiError {
    error
        .fields
        .entry("control_plane")
        .or_insert_with(|| control_plane(operation, workflow_id));
    error.fields.entry("workflow_id").or_insert_with(|| json!(workflow_id));
    error
}

/// Applies a control-plane command to a run and renders its receipt. With a `key` the command is
/// idempotent: a retry with the same key and intent answers the body stored with the first, marked
/// `retained: true` (the second value is then `true` too).
pub(crate) async fn apply_command<S, T, F, R>(
    state: &AppState<S>,
    namespace: &str,
    locator: RunLocator,
    key: Option<CommandKey>,
    transition: F,
    render: R,
) -> Result<(Value, bool), StoreError>
where
    S: Store,
    T: Send + 'static,
    F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    R: Fn(&T, &RunState) -> Value + Clone + Send + 'static,
{
    let now = now_ms();
    let (value, run) = match key {
        Some(key) => match state
            .store
            .mutate_run_keyed(namespace, locator, key, now, transition, render.clone())
            .await?
        {
            (KeyedReceipt::Retained(mut stored), _) => {
                stored["retained"] = json!(true);
                return Ok((stored, true));
            }
            (KeyedReceipt::Fresh(value), run) => (value, run.expect("fresh receipts come with the run")),
        },
        None => state.store.mutate_run(namespace, locator, now, transition).await?,
    };
    after_change(state, &run);
    Ok((render(&value, &run), false))
}

const SEARCH_ATTRIBUTES_MAX: usize = 100;
const SEARCH_ATTRIBUTE_KEY_MAX: usize = 128;
const SEARCH_ATTRIBUTE_VALUE_BYTES_MAX: usize = 2048;

const REJECTED_START_FIELDS: &[&str] = &[
    "workflow_execution_timeout",
    "workflow_run_timeout",
    "workflow_task_timeout",
    "retry_policy",
    "idempotency_key",
    "request_id",
];

pub async fn start<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let f = Fields::new(&body);
    for field in REJECTED_START_FIELDS {
        if body.contains_key(*field) {
            return Err(ApiError::validation(field, format!("The {field} field is not supported on start.")));
        }
    }
    let workflow_type = f.req_str("workflow_type", 255)?;
    let workflow_id = match f.opt_str("workflow_id", 128)? {
        Some(id) if wire::valid_workflow_id(&id) => id,
        Some(_) => {
            return Err(ApiError::validation(
                "workflow_id",
                "The workflow_id may only contain letters, digits, '.', '_', ':' and '-'.",
            ))
        }
        None => ulid::Ulid::new().to_string(),
    };
    let task_queue = f
        .opt_str("task_queue", 255)?
        .filter(|q| !q.is_empty())
        .unwrap_or_else(|| "default".into());
    let input = f
        .opt_payload("input", &state.config.limits)?
        .unwrap_or_else(|| Payload::avro(crate::avro::empty_arguments_blob()));
    let max = state.config.limits.delay_seconds_max;
    let execution_timeout_seconds = f.opt_int("execution_timeout_seconds", 1, max)?;
    let run_timeout_seconds = f.opt_int("run_timeout_seconds", 1, max)?;
    if let (Some(run), Some(execution)) = (run_timeout_seconds, execution_timeout_seconds) {
        if run > execution {
            return Err(ApiError::validation(
                "run_timeout_seconds",
                "run_timeout_seconds must not exceed execution_timeout_seconds.",
            ));
        }
    }
    let policy = match f.opt_str("duplicate_policy", 32)?.as_deref() {
        None | Some("fail") => DuplicatePolicy::Fail,
        Some("use-existing") => DuplicatePolicy::UseExisting,
        Some(other) => {
            return Err(ApiError::validation(
                "duplicate_policy",
                format!("duplicate_policy must be \"fail\" or \"use-existing\", not {other:?}."),
            ))
        }
    };
    let memo = f.opt_object("memo")?.cloned().unwrap_or_default();
    if serde_json::to_string(&memo).map(|s| s.len()).unwrap_or(0) > 262_144 {
        return Err(ApiError::validation("memo", "The memo must be at most 262144 bytes of JSON."));
    }
    let search_attributes = f.opt_object("search_attributes")?.cloned().unwrap_or_default();
    if search_attributes.len() > SEARCH_ATTRIBUTES_MAX {
        return Err(ApiError::validation(
            "search_attributes",
            format!("At most {SEARCH_ATTRIBUTES_MAX} search attributes."),
        ));
    }
    for (key, value) in &search_attributes {
        if key.is_empty() || key.len() > SEARCH_ATTRIBUTE_KEY_MAX {
            return Err(ApiError::validation(
                "search_attributes",
                format!("Search attribute keys are 1 to {SEARCH_ATTRIBUTE_KEY_MAX} characters."),
            ));
        }
        if value.as_str().is_some_and(|v| v.len() > SEARCH_ATTRIBUTE_VALUE_BYTES_MAX) || value.is_object() {
            return Err(ApiError::validation(
                "search_attributes",
                format!("Search attribute {key:?} must be a scalar or a list, strings at most {SEARCH_ATTRIBUTE_VALUE_BYTES_MAX} bytes."),
            ));
        }
    }
    super::search_attributes::check(&state, &namespace, "search_attributes", &search_attributes).await?;
    let start = StartRun {
        namespace: namespace.clone(),
        workflow_id: WorkflowId(workflow_id.clone()),
        run_id: RunId(ulid::Ulid::new().to_string()),
        workflow_type,
        task_queue,
        input,
        execution_timeout_seconds,
        run_timeout_seconds,
        business_key: f.opt_str("business_key", 255)?,
        memo,
        search_attributes,
        command_id: CommandId(ulid::Ulid::new().to_string()),
        contract: None,
        // `build_id` wins over its SDK-neutral alias `compatibility`.
        compatibility: match f.opt_str("build_id", 255)? {
            Some(build) => Some(build),
            None => f.opt_str("compatibility", 255)?,
        }
        .filter(|b| !b.is_empty()),
    };
    let contract = crate::contracts::registered(&state.store, &namespace, &start.task_queue, &start.workflow_type)
        .await
        .map_err(|e| in_operation(e.into(), "start", &workflow_id))?;
    // A start that names no build runs on the queue's promoted build, if one was promoted.
    let compatibility = match start.compatibility.clone() {
        Some(build) => Some(build),
        None => super::fleet::promoted_build(&state, &namespace, &start.task_queue).await?,
    };
    let start = StartRun {
        contract,
        compatibility,
        ..start
    };
    let (outcome, run) = state
        .store
        .start_workflow(start, policy, now_ms())
        .await
        .map_err(|e| in_operation(e.into(), "start", &workflow_id))?;
    let (status, outcome) = match outcome {
        StartOutcome::StartedNew => {
            after_change(&state, &run);
            tracing::info!(namespace, workflow_id, run_id = %run.run_id, workflow_type = %run.workflow_type, "workflow started");
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
        "control_plane": control_plane("start", &workflow_id),
    });
    Ok((status, Json(body)).into_response())
}

async fn describe_at<S: Store>(state: &Shared<S>, namespace: &str, locator: RunLocator, workflow_id: &str) -> ApiResult<Json<Value>> {
    let run = state
        .store
        .load_run(namespace, locator.clone())
        .await?
        .ok_or_else(|| match &locator {
            RunLocator::Run(_, run_id) => ApiError::new(StatusCode::NOT_FOUND, "run_not_found", "Workflow run not found.")
                .with("workflow_id", workflow_id)
                .with("run_id", run_id.as_str()),
            _ => ApiError::new(StatusCode::NOT_FOUND, "instance_not_found", "Workflow not found.").with("workflow_id", workflow_id),
        })?;
    let runs = state.store.runs_of(namespace, &run.workflow_id).await?;
    let current = runs.last().map(|r| r.run_id.clone()).unwrap_or_else(|| run.run_id.clone());
    let mut body = render::describe(&run, runs.len(), &current);
    body["control_plane"] = control_plane("describe", workflow_id);
    Ok(Json(body))
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
        return Err(ApiError::new(StatusCode::NOT_FOUND, "instance_not_found", "Workflow not found.").with("workflow_id", workflow_id));
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
    let page_size = match query.get("page_size") {
        None => 50,
        Some(raw) => raw
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=LIST_PAGE_MAX).contains(n))
            .ok_or_else(|| ApiError::validation("page_size", format!("page_size must be between 1 and {LIST_PAGE_MAX}.")))?,
    };
    let status_bucket = match query.get("status").map(String::as_str) {
        None | Some("") => None,
        Some(s @ ("running" | "completed" | "failed")) => Some(s.to_string()),
        Some(_) => return Err(ApiError::validation("status", "status must be running, completed or failed.")),
    };
    // Page tokens name the last row returned (keyset paging, so a deep page costs what the
    // first one does); a bare number is an offset, as older tokens were.
    let (offset, after) = match query.get("next_page_token").filter(|t| !t.is_empty()) {
        None => (0, None),
        Some(token) => parse_list_token(token)
            .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "invalid_page_token", "The page token is not valid."))?,
    };
    let mut filter = list_filter(&state, &namespace, &query).await?;
    filter.status_bucket = status_bucket;
    filter.after = after;
    let (rows, more) = state.store.list_runs(&namespace, filter, offset, page_size).await?;
    let workflows: Vec<Value> = rows.iter().map(render::summary).collect();
    let next_page_token = match rows.last() {
        Some(last) if more => Some(list_token(last)),
        _ => None,
    };
    Ok(Json(json!({
        "workflows": workflows,
        "workflow_count": workflows.len(),
        "next_page_token": next_page_token,
    })))
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
        "total": counts.running + counts.completed + counts.failed,
    })))
}

/// The filters a listing and its counts share: `workflow_type`, `task_queue` and `query` (a
/// visibility filter, or free text matched against workflow ids and business keys).
async fn list_filter<S: Store>(state: &Shared<S>, namespace: &str, query: &HashMap<String, String>) -> ApiResult<ListFilter> {
    let mut filter = ListFilter {
        workflow_type: query.get("workflow_type").filter(|s| !s.is_empty()).cloned(),
        task_queue: query.get("task_queue").filter(|s| !s.is_empty()).cloned(),
        ..ListFilter::default()
    };
    if let Some(text) = query.get("query").filter(|s| !s.trim().is_empty()) {
        if capstan_engine::visibility::looks_like_filter(text) {
            let schema = state.store.search_attribute_definitions(namespace).await?;
            let parsed = capstan_engine::visibility::parse_filter(text, &schema)
                .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.reason, e.message).with("field", "query"))?;
            filter.filter = Some(parsed);
        } else {
            // Free text (no operator): a substring of the workflow id or business key, as in DW.
            filter.query = Some(text.clone());
        }
    }
    Ok(filter)
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
        ApiError::new(StatusCode::NOT_FOUND, "run_not_found", "Workflow run not found.")
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
            .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "invalid_page_token", "The page token is not valid."))?,
    };
    let locator = RunLocator::Run(WorkflowId(workflow_id.clone()), RunId(run_id.clone()));
    let wait_new_event = matches!(query.get("wait_new_event").map(String::as_str), Some("1" | "true"));
    let deadline = now_ms() + 30_000;
    loop {
        let run = state.store.load_run(&namespace, locator.clone()).await?.ok_or_else(|| {
            ApiError::new(StatusCode::NOT_FOUND, "run_not_found", "Workflow run not found.")
                .with("workflow_id", workflow_id.clone())
                .with("run_id", run_id.clone())
        })?;
        if wait_new_event && run.last_sequence <= after && !run.is_closed() && now_ms() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            continue;
        }
        let events = state.store.history(&run.run_id, after, run.last_sequence, page_size).await?;
        let last = events.last().map(|e| e.sequence).unwrap_or(after);
        let rows: Vec<Value> = events.iter().map(render::control_event).collect();
        return Ok(Json(json!({
            "workflow_id": workflow_id,
            "run_id": run_id,
            "events": rows,
            "next_page_token": (last < run.last_sequence).then(|| render::page_token(last)),
        })));
    }
}

// ------------------------------------------------------------------------------------------
// Signal, cancel, terminate

/// A command on a run: the current one, or a named run that must still be current.
fn target(workflow_id: &str, run_id: Option<String>) -> (RunLocator, Option<RunId>) {
    (RunLocator::Current(WorkflowId(workflow_id.to_string())), run_id.map(RunId))
}

pub(crate) fn check_target(run: &RunState, wanted: &Option<RunId>) -> Result<(), Refusal> {
    match wanted {
        Some(run_id) if *run_id != run.run_id => Err(Refusal::new(
            Reason::RunNotCurrent,
            "The targeted run is not the current run of this workflow.",
        )
        .with("run_id", run_id.as_str())
        .with("current_run_id", run.run_id.as_str())),
        _ => Ok(()),
    }
}

pub(crate) async fn signal_impl<S: Store>(
    state: Shared<S>,
    namespace: String,
    workflow_id: String,
    run_id: Option<String>,
    signal_name: String,
    body: Map<String, Value>,
) -> ApiResult<Response> {
    let f = Fields::new(&body);
    let input = f
        .opt_payload("input", &state.config.limits)
        .map_err(|e| in_operation(e, "signal", &workflow_id))?;
    let request_id = f
        .opt_str("request_id", 255)
        .map_err(|e| in_operation(e, "signal", &workflow_id))?
        .filter(|s| !s.is_empty());
    if signal_name.is_empty() || signal_name.len() > 255 {
        return Err(in_operation(
            ApiError::validation("signal_name", "The signal name must be 1 to 255 characters."),
            "signal",
            &workflow_id,
        ));
    }
    let arguments = input.unwrap_or_else(|| Payload::avro(crate::avro::empty_arguments_blob()));
    let (locator, wanted) = target(&workflow_id, run_id.clone());
    let command_id = CommandId(ulid::Ulid::new().to_string());
    let name = signal_name.clone();
    let args = arguments.clone();
    let fallback = crate::contracts::fallback_for(&state.store, &namespace, &locator)
        .await
        .map_err(|e| in_operation(e.into(), "signal", &workflow_id))?;
    let transition = move |run: &mut RunState, cx: &mut Cx| {
        check_target(run, &wanted)?;
        admit_signal(run, &name, fallback.for_run(run))?;
        capstan_engine::signal(run, cx, &name, args, command_id)
    };
    let receipt_body = {
        let workflow_id = workflow_id.clone();
        let signal_name = signal_name.clone();
        let request_id = request_id.clone();
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
    let key = request_id.map(|request_id| CommandKey {
        command_type: "signal".into(),
        intent_hash: intent_hash(&[&signal_name, &arguments.codec, &arguments.blob, run_id.as_deref().unwrap_or("")]),
        request_id,
    });
    let (mut body, retained) = apply_command(&state, &namespace, locator, key, transition, receipt_body)
        .await
        .map_err(|e| in_operation(e.into(), "signal", &workflow_id))?;
    if retained {
        body["intent_verified"] = json!(true);
    }
    tracing::info!(namespace, workflow_id, signal_name, "signal received");
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

pub async fn signal<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, signal_name)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    signal_impl(state, namespace, workflow_id, None, signal_name, body).await
}

pub async fn signal_run<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id, signal_name)): Path<(String, String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    signal_impl(state, namespace, workflow_id, Some(run_id), signal_name, body).await
}

async fn close_impl<S: Store>(
    state: Shared<S>,
    namespace: String,
    workflow_id: String,
    run_id: Option<String>,
    kind: CloseCommand,
    body: Map<String, Value>,
) -> ApiResult<Json<Value>> {
    let operation = match kind {
        CloseCommand::Cancel => "cancel",
        CloseCommand::Terminate => "terminate",
    };
    let outcome = match kind {
        CloseCommand::Cancel => "cancelled",
        CloseCommand::Terminate => "terminated",
    };
    let f = Fields::new(&body);
    let reason = f.opt_str("reason", 1000).map_err(|e| in_operation(e, operation, &workflow_id))?;
    let request_id = f
        .opt_str("request_id", 255)
        .map_err(|e| in_operation(e, operation, &workflow_id))?
        .filter(|s| !s.is_empty());
    let (locator, wanted) = target(&workflow_id, run_id.clone());
    let command_id = CommandId(ulid::Ulid::new().to_string());
    let why = reason.clone();
    let transition = move |run: &mut RunState, cx: &mut Cx| {
        check_target(run, &wanted)?;
        capstan_engine::close_by_command(run, cx, kind, why, command_id)
    };
    let render_receipt = {
        let workflow_id = workflow_id.clone();
        let reason = reason.clone();
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
    let key = request_id.clone().map(|request_id| CommandKey {
        command_type: operation.into(),
        intent_hash: intent_hash(&[reason.as_deref().unwrap_or(""), run_id.as_deref().unwrap_or("")]),
        request_id,
    });
    let (mut body, retained) = apply_command(&state, &namespace, locator, key, transition, render_receipt)
        .await
        .map_err(|e| in_operation(e.into(), operation, &workflow_id))?;
    if let (Some(request_id), false) = (&request_id, retained) {
        body["request_id"] = json!(request_id);
    }
    tracing::info!(namespace, workflow_id, operation, "workflow closed by command");
    Ok(Json(body))
}

pub async fn cancel<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(workflow_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    close_impl(state, namespace, workflow_id, None, CloseCommand::Cancel, body).await
}

pub async fn cancel_run<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    close_impl(state, namespace, workflow_id, Some(run_id), CloseCommand::Cancel, body).await
}

pub async fn terminate<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(workflow_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    close_impl(state, namespace, workflow_id, None, CloseCommand::Terminate, body).await
}

pub async fn terminate_run<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    close_impl(state, namespace, workflow_id, Some(run_id), CloseCommand::Terminate, body).await
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
    let history: Vec<Value> = events
        .iter()
        .map(|e| {
            let mut event = render::worker_event(&namespace, e);
            event["type"] = json!(e.event_type.as_str());
            event
        })
        .collect();
    let envelope = |payload: Option<&Payload>| match payload {
        Some(p) => json!({"available": true, "data": render::envelope(p)}),
        None => json!({"available": false, "data": null}),
    };
    let mut bundle = json!({
        "schema": "durable-workflow.v2.history-export",
        "schema_version": 1,
        "exported_at": render::time(now_ms()),
        "dedupe_key": format!("{}:{}:{}", run.run_id, run.last_sequence, run.last_hash),
        "history_complete": run.is_closed(),
        "workflow": {
            "instance_id": run.workflow_id,
            "run_id": run.run_id,
            "run_number": run.run_number,
            "is_current_run": run.run_id == current,
            "current_run_id": current,
            "workflow_type": run.workflow_type,
            "business_key": run.business_key,
            "memo": run.memo,
            "search_attributes": run.search_attributes,
            "status": run.status.as_str(),
            "status_bucket": run.status.bucket(),
            "closed_reason": run.closed_reason.map(|r| r.as_str()),
            "last_history_sequence": run.last_sequence,
            "history_chain_origin": run.chain_origin,
            "history_head_hash": run.last_hash,
        },
        "payloads": {"codec": payload::AVRO_CODEC, "arguments": envelope(Some(&run.input)), "output": envelope(run.output.as_ref())},
        "history_events": history,
        "commands": [], "signals": [],
        "updates": run.updates.iter().map(|(id, update)| render::update_export(id, update)).collect::<Vec<_>>(),
        "tasks": [], "activities": [], "timers": [], "failures": [],
        "links": {"continued_from_run_id": run.continued_from_run_id, "parent_workflow_id": run.parent.as_ref().map(|p| p.workflow_id.clone())},
        "redaction": {"applied": false, "paths": []},
        "codec_schemas": {},
        "payload_manifest": {"version": 1, "entries": []},
    });
    let checksum = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(crate::canonical::canonical_json(&bundle).as_bytes()))
    };
    bundle["integrity"] =
        json!({"canonicalization": "json-recursive-ksort-v1", "checksum_algorithm": "sha256", "checksum": checksum, "signature": null});
    Ok(Json(bundle))
}

/// `POST /workflows/{id}/repair`: offer a stuck run's workflow task again (see `engine::repair`).
pub async fn repair<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(workflow_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let f = Fields::new(&body);
    let request_id = f
        .opt_str("request_id", 255)
        .map_err(|e| in_operation(e, "repair", &workflow_id))?
        .filter(|s| !s.is_empty());
    let command_id = CommandId(ulid::Ulid::new().to_string());
    let locator = RunLocator::Current(WorkflowId(workflow_id.clone()));
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
    let key = request_id.map(|request_id| CommandKey {
        command_type: "repair".into(),
        intent_hash: intent_hash(&["repair"]),
        request_id,
    });
    let transition = move |run: &mut RunState, cx: &mut Cx| capstan_engine::repair(run, cx, command_id);
    let (body, _) = apply_command(&state, &namespace, locator, key, transition, render_receipt)
        .await
        .map_err(|e| in_operation(e.into(), "repair", &workflow_id))?;
    tracing::info!(namespace, workflow_id, outcome = %body["outcome"], "repair requested");
    Ok(Json(body))
}

/// `POST /workflows/{id}/archive`: archive the closed current run (read-only from then on).
pub async fn archive<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(workflow_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let f = Fields::new(&body);
    let reason = f.opt_str("reason", 1000).map_err(|e| in_operation(e, "archive", &workflow_id))?;
    let request_id = f
        .opt_str("request_id", 255)
        .map_err(|e| in_operation(e, "archive", &workflow_id))?
        .filter(|s| !s.is_empty());
    let command_id = CommandId(ulid::Ulid::new().to_string());
    let locator = RunLocator::Current(WorkflowId(workflow_id.clone()));
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
    let why = reason.clone();
    let transition = move |run: &mut RunState, cx: &mut Cx| capstan_engine::archive(run, cx, why, command_id);
    let key = request_id.map(|request_id| CommandKey {
        command_type: "archive".into(),
        intent_hash: intent_hash(&[reason.as_deref().unwrap_or("")]),
        request_id,
    });
    let (body, _) = apply_command(&state, &namespace, locator, key, transition, render_receipt)
        .await
        .map_err(|e| in_operation(e.into(), "archive", &workflow_id))?;
    tracing::info!(namespace, workflow_id, outcome = %body["outcome"], "archive requested");
    Ok(Json(body))
}
