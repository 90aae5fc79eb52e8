//! `POST /workflows/{id}/runs/{run}/redrive`: a failed run resumed at its failed step.

use crate::auth::Caller;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::{self, Fields};
use crate::Shared;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::redrive::{self, RedriveRequest};
use capstan_store::Store;
use serde_json::json;

pub async fn redrive<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path((workflow_id, run_id)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    wire::refuse_unknown_fields(&body, &[&["request_id"]], "", "redrive requests")?;
    let request_id = Fields::new(&body).opt_str("request_id", 1024)?;
    let request = RedriveRequest {
        namespace: namespace.clone(),
        workflow_id: workflow_id.clone(),
        run_id,
        request_id,
        principal: Some(caller.principal),
    };
    let control_plane = json!({"operation": "redrive", "workflow_id": workflow_id});
    let outcome = redrive::redrive(&*state, request).await.map_err(|error| {
        let mut error = ApiError::from(error);
        error.fields.entry("control_plane").or_insert_with(|| control_plane.clone());
        error.fields.entry("workflow_id").or_insert_with(|| json!(workflow_id));
        error
    })?;
    let record = outcome.redrive;
    if outcome.fresh {
        tracing::info!(namespace, workflow_id, source = %record.source_run_id, run_id = %record.successor_run_id,
            resume_step_sequence = record.resume_step_sequence, "workflow run redriven");
    }
    let status = if outcome.fresh { StatusCode::ACCEPTED } else { StatusCode::OK };
    let body = json!({
        "workflow_id": workflow_id,
        "run_id": record.successor_run_id,
        "continued_from_run_id": record.source_run_id,
        "resume_step_sequence": record.resume_step_sequence,
        "recovery_kind": "redrive",
        "outcome": "redriven",
        "command_status": "accepted",
        "command_id": record.command_id,
        "request_id": record.request_id,
        "control_plane": control_plane,
    });
    Ok((status, Json(body)).into_response())
}
