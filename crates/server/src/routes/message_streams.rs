//! Message streams: `POST /workflows/{id}/message-streams/{name}/messages` (an append, once per
//! `message_id`) and the diagnostics `GET /workflows/{id}/message-streams[/{name}]`.

use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::{self, Fields};
use crate::Shared;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::message_streams::{self, AppendOutcome, AppendRequest};
use capstan_engine::{Reason, RunState, WorkflowId};
use capstan_store::{RunLocator, Store};
use serde_json::{json, Value};

pub async fn append<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, stream_name)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let control_plane = json!({"operation": "message_stream_append", "workflow_id": workflow_id, "operation_name": stream_name});
    let in_operation = |mut error: ApiError| {
        error.fields.entry("control_plane").or_insert_with(|| control_plane.clone());
        error.fields.entry("workflow_id").or_insert_with(|| json!(workflow_id));
        error
    };
    // The message id is the append's idempotency key: no `request_id` beside it.
    let parsed = wire::refuse_unknown_fields(&body, &[&["message_id", "input"]], "", "message stream appends").and_then(|()| {
        let f = Fields::new(&body);
        Ok((f.req_str("message_id", 191)?, f.opt_payload("input", &state.config.limits)?))
    });
    let (message_id, input) = parsed.map_err(in_operation)?;
    let request = AppendRequest {
        namespace: namespace.clone(),
        workflow_id: workflow_id.clone(),
        stream_name: stream_name.clone(),
        message_id: message_id.clone(),
        input,
    };
    let (outcome, run) = message_streams::append(&*state, request)
        .await
        .map_err(|e| in_operation(e.into()))?;
    if let Some(run) = &run {
        state.run_changed(run);
    }
    let (status, body) = match outcome {
        AppendOutcome::Accepted(body) => {
            tracing::info!(namespace, workflow_id, stream_name, message_id, position = %body["position"], "stream message appended");
            (StatusCode::ACCEPTED, body)
        }
        AppendOutcome::Duplicate(body) => (StatusCode::OK, body),
    };
    Ok((status, Json(body)).into_response())
}

async fn current_run<S: Store>(state: &Shared<S>, namespace: &str, workflow_id: &str) -> ApiResult<RunState> {
    state
        .store
        .load_run(namespace, RunLocator::Current(WorkflowId(workflow_id.to_string())))
        .await?
        .ok_or_else(|| {
            ApiError::new(StatusCode::NOT_FOUND, Reason::InstanceNotFound, "Workflow instance not found.").with("workflow_id", workflow_id)
        })
}

pub async fn list<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(workflow_id): Path<String>,
) -> ApiResult<Json<Value>> {
    let run = current_run(&state, &namespace, &workflow_id).await?;
    let streams: Vec<Value> = run
        .message_streams
        .iter()
        .map(|(name, stream)| message_streams::describe_stream(&run, name, stream))
        .collect();
    Ok(Json(json!({"workflow_id": workflow_id, "run_id": run.run_id, "streams": streams})))
}

pub async fn describe<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, stream_name)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let run = current_run(&state, &namespace, &workflow_id).await?;
    let stream = run.message_streams.get(&stream_name).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            Reason::MessageStreamNotFound,
            "No message stream of this name.",
        )
        .with("workflow_id", workflow_id.as_str())
        .with("stream_name", stream_name.as_str())
    })?;
    Ok(Json(
        json!({"stream": message_streams::describe_stream(&run, &stream_name, stream)}),
    ))
}
