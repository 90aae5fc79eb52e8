//! Standalone activities: `POST /activities`, `GET /activities/{id}`, `GET /activities`.
//! Cancel and terminate are the workflow commands on the host run (`/workflows/{id}/cancel`).

use super::control::{list_page, ListPage};
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::render::{envelope, opt_time, time};
use crate::wire::{self, Fields};
use crate::{AppState, Shared};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::standalone::{self, StartActivityRequest};
use capstan_engine::*;
use capstan_store::{RunLocator, Store};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// Every field `Client.start_activity` sends; anything else is refused, not dropped.
const START_FIELDS: &[&str] = &[
    "activity_id",
    "activity_type",
    "activity_class",
    "task_queue",
    "business_key",
    "input",
    "retry_policy",
    "start_to_close_timeout_seconds",
    "schedule_to_start_timeout_seconds",
    "schedule_to_close_timeout_seconds",
    "heartbeat_timeout_seconds",
];

fn start_request(state: &AppState<impl Store>, namespace: &str, body: &Map<String, Value>) -> ApiResult<StartActivityRequest> {
    wire::refuse_unknown_fields(body, &[START_FIELDS], "", "standalone activity starts")?;
    let f = Fields::new(body);
    let max_delay = state.config.limits.delay_seconds_max;
    let retry_policy = match f.opt_object("retry_policy")? {
        None => None,
        Some(policy) => {
            wire::refuse_unknown_fields(policy, &[wire::RETRY_POLICY_FIELDS], "retry_policy.", "retry policies")?;
            Some(wire::parse_retry_policy_at(policy, "retry_policy", max_delay)?)
        }
    };
    let timeout = |key: &str| f.opt_int(key, 1, max_delay);
    let timeouts = ActivityTimeouts {
        start_to_close_seconds: timeout("start_to_close_timeout_seconds")?,
        schedule_to_start_seconds: timeout("schedule_to_start_timeout_seconds")?,
        schedule_to_close_seconds: timeout("schedule_to_close_timeout_seconds")?,
        heartbeat_seconds: timeout("heartbeat_timeout_seconds")?,
    };
    Ok(StartActivityRequest {
        namespace: namespace.to_string(),
        activity_id: f.opt_str("activity_id", 128)?,
        activity_type: f.req_str("activity_type", 255)?,
        activity_class: f.opt_str("activity_class", 255)?,
        task_queue: f.task_queue()?,
        input: f.arguments("input", &state.config.limits)?,
        business_key: f.opt_str("business_key", 255)?,
        retry_policy,
        timeouts,
        principal: None,
    })
}

pub async fn start<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<crate::auth::Caller>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let mut request = start_request(&state, &namespace, &body)?;
    request.principal = Some(caller.principal);
    let run = standalone::start_activity(&*state, request).await.map_err(ApiError::from)?;
    state.run_changed(&run);
    tracing::info!(namespace, activity_id = %run.workflow_id, run_id = %run.run_id, "standalone activity started");
    let mut view = activity_view(&run);
    view["command_status"] = json!("accepted");
    view["command_source"] = json!("control_plane");
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

pub async fn describe<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(activity_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let locator = RunLocator::Current(WorkflowId(activity_id.clone()));
    let run = state.store.load_run(&namespace, locator).await?;
    match run.filter(|run| run.standalone.is_some()) {
        Some(run) => Ok(Json(activity_view(&run))),
        None => Err(
            ApiError::new(StatusCode::NOT_FOUND, Reason::ActivityNotFound, "Standalone activity not found.")
                .with("activity_id", activity_id),
        ),
    }
}

pub async fn list<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let asked = capstan_app::listing::ListQuery {
        workflow_type: Some(STANDALONE_ACTIVITY_TYPE.to_string()),
        status: query.get("status").cloned(),
        ..Default::default()
    };
    let filter = capstan_app::listing::filter(&*state, &namespace, &asked).await?;
    let ListPage { rows, next_page_token } = list_page(&state, &namespace, &query, filter).await?;
    let mut activities = Vec::with_capacity(rows.len());
    for row in &rows {
        let locator = RunLocator::Run(row.workflow_id.clone(), row.run_id.clone());
        // A run deleted between the listing and this read is left out of the page.
        if let Some(run) = state.store.load_run(&namespace, locator).await? {
            let mut view = activity_view(&run);
            view["status_bucket"] = json!(run.status.bucket());
            view.as_object_mut().expect("an object").remove("result");
            activities.push(view);
        }
    }
    Ok(Json(json!({
        "activities": activities,
        "activity_count": activities.len(),
        "next_page_token": next_page_token,
    })))
}

/// A host run as DW's activity endpoints show it. `result` is the activity's result once it
/// completed; `failure` (a Capstan addition) says how it failed.
fn activity_view(run: &RunState) -> Value {
    let Some(activity) = &run.standalone else {
        return Value::Null;
    };
    let execution = run.activities.get(&activity.execution_id);
    let attempt_count = execution.map_or(activity.attempt_count, |e| e.attempt_count);
    let activity_status = match (&activity.outcome, execution) {
        (Some(outcome), _) => outcome.as_str(),
        (None, Some(e)) if e.attempt_count > 0 => "running",
        (None, _) => "pending",
    };
    let task = execution.and_then(|e| run.tasks.get(&e.task_id));
    let last_heartbeat_at = task.and_then(|t| match &t.detail {
        TaskDetail::Activity { last_heartbeat_at, .. } => *last_heartbeat_at,
        _ => None,
    });
    let result = match (activity.outcome.as_deref(), &run.output) {
        (Some("completed"), Some(output)) => envelope(output),
        _ => Value::Null,
    };
    let failure = run
        .failure
        .as_ref()
        .map(|f| json!({"message": f.message, "exception_type": f.exception_type, "exception_class": f.exception_class}));
    json!({
        "activity_id": run.workflow_id,
        "workflow_id": run.workflow_id,
        "workflow_run_id": run.run_id,
        "run_number": run.run_number,
        "activity_execution_id": activity.execution_id,
        "workflow_type": run.workflow_type,
        "activity_type": activity.activity_type,
        "activity_class": activity.activity_class,
        "task_queue": run.task_queue,
        "namespace": run.namespace,
        "business_key": run.business_key,
        "status": run.status.as_str(),
        "activity_status": activity_status,
        "closed_reason": run.closed_reason.map(ClosedReason::as_str),
        "attempt_count": attempt_count,
        "current_attempt_id": execution.and_then(|e| e.attempt_ids.last()),
        "payload_codec": payload::AVRO_CODEC,
        "started_at": time(run.started_at),
        "closed_at": opt_time(run.closed_at),
        "last_progress_at": time(run.last_progress_at),
        "last_heartbeat_at": opt_time(last_heartbeat_at),
        "schedule_to_start_deadline_at": opt_time(activity.schedule_to_start_deadline_at),
        "schedule_to_close_deadline_at": opt_time(activity.schedule_to_close_deadline_at),
        "result": result,
        "failure": failure,
    })
}
