//! Updates: `UpdateAccepted` is recorded at once, a dedicated workflow task runs the handler,
//! and the request waits (up to its budget) for `UpdateCompleted`.

use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wait;
use crate::wire::Fields;
use crate::{render, AppState, Shared};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use capstan_app::{control, updates};
use capstan_engine::*;
use capstan_store::{RunLocator, Store};
use serde_json::{json, Map, Value};

fn control(workflow_id: &str, update_name: &str) -> Value {
    json!({"operation": "update", "workflow_id": workflow_id, "operation_name": update_name})
}

fn in_update(mut error: ApiError, workflow_id: &str, update_name: &str) -> ApiError {
    error
        .fields
        .entry("control_plane")
        .or_insert_with(|| control(workflow_id, update_name));
    error.fields.entry("workflow_id").or_insert_with(|| json!(workflow_id));
    error
}

pub async fn update<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<crate::auth::Caller>,
    Path((workflow_id, update_name)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    run_update(state, caller, (namespace, workflow_id, None), update_name, body).await
}

pub async fn update_run<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<crate::auth::Caller>,
    Path((workflow_id, run_id, update_name)): Path<(String, String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    run_update(state, caller, (namespace, workflow_id, Some(run_id)), update_name, body).await
}

async fn run_update<S: Store>(
    state: Shared<S>,
    caller: crate::auth::Caller,
    (namespace, workflow_id, run_id): (String, String, Option<String>),
    update_name: String,
    body: Map<String, Value>,
) -> ApiResult<Response> {
    let fail = |error: ApiError| in_update(error, &workflow_id, &update_name);
    if body.contains_key("wait_policy") {
        return Err(fail(ApiError::validation(
            "wait_policy",
            "wait_policy is not supported; use wait_for.",
        )));
    }
    let f = Fields::new(&body);
    let arguments = f
        .opt_payload("input", &state.config.limits)
        .map_err(fail)?
        .unwrap_or_else(|| Payload::avro(crate::avro::empty_arguments_blob()));
    let request_id = f.opt_str("request_id", 255).map_err(fail)?.filter(|s| !s.is_empty());
    let trace = f.opt_trace("observability_context").map_err(fail)?;
    let wait_for = match f.opt_str("wait_for", 32).map_err(fail)?.as_deref() {
        None | Some("completed") => "completed",
        Some("accepted") => "accepted",
        Some(_) => {
            return Err(fail(ApiError::validation(
                "wait_for",
                "wait_for must be \"accepted\" or \"completed\".",
            )))
        }
    };
    let wait_seconds = f
        .opt_int("wait_timeout_seconds", 1, wait::UPDATE_WAIT_MAX_SECONDS)
        .map_err(fail)?
        .unwrap_or(wait::UPDATE_WAIT_DEFAULT_SECONDS);
    if update_name.is_empty() || update_name.len() > 255 {
        return Err(fail(ApiError::validation(
            "update_name",
            "The update name must be 1 to 255 characters.",
        )));
    }

    let request = updates::UpdateRequest {
        target: control::Target {
            namespace: namespace.clone(),
            workflow_id: workflow_id.clone(),
            run_id,
        },
        update_name: update_name.clone(),
        input: arguments.clone(),
        request_id: request_id.clone(),
        trace,
        principal: Some(caller.principal),
    };
    // An update with a declared validator is put to a worker first (see `validation`).
    let validate = |run: RunState| {
        let state = state.clone();
        let (update_name, arguments) = (update_name.clone(), arguments.clone());
        async move { super::validation::validate(&state, &run, &update_name, &arguments).await }
    };
    let admitted = updates::update(&*state, request, validate).await.map_err(fail)?;
    if let Some(run) = &admitted.run {
        state.run_changed(run);
    }
    let updates::Admitted {
        update_id,
        run_id,
        retained,
        ..
    } = admitted;
    tracing::info!(namespace, workflow_id, update_name, update_id, retained, "update accepted");

    let locator = RunLocator::Run(WorkflowId(workflow_id.clone()), RunId(run_id.clone()));
    let until = wait::Until::Clock(state.now() + wait_seconds * 1000);
    let looked = wait::settle(
        || state.now(),
        until,
        wait::UPDATE_RECHECK,
        None,
        || async {
            let run = state.store.load_run(&namespace, locator.clone()).await?;
            match run.and_then(|run| run.updates.get(&update_id).cloned()) {
                Some(record) if wait_for == "accepted" || record.status != UpdateStatus::Accepted => Ok(wait::Look::Settled(record)),
                Some(record) => Ok(wait::Look::Pending(record)),
                None => Err(fail(ApiError::new(
                    StatusCode::NOT_FOUND,
                    Reason::UpdateNotFound,
                    "The update is gone.",
                ))),
            }
        },
    )
    .await?;
    let record = looked.unwrap_or_else(|pending| pending);
    respond(
        &state,
        &workflow_id,
        &run_id,
        &update_name,
        &update_id,
        wait_for,
        request_id.as_deref(),
        retained,
        record,
    )
}

#[allow(clippy::too_many_arguments)]
fn respond<S: Store>(
    _state: &AppState<S>,
    workflow_id: &str,
    run_id: &str,
    update_name: &str,
    update_id: &str,
    wait_for: &str,
    request_id: Option<&str>,
    retained: bool,
    record: UpdateRecord,
) -> ApiResult<Response> {
    let mut body = json!({
        "workflow_id": workflow_id,
        "run_id": run_id,
        "update_name": update_name,
        "update_id": update_id,
        "update_status": record.status.as_str(),
        "wait_for": wait_for,
        "command_id": record.command_id,
        "request_id": request_id,
        "retained": retained,
        "result": null,
        "result_envelope": record.result.as_ref().map(render::envelope),
        "control_plane": control(workflow_id, update_name),
    });
    match record.status {
        UpdateStatus::Completed => {
            body["outcome"] = json!("update_completed");
            Ok(Json(body).into_response())
        }
        UpdateStatus::Accepted => {
            body["outcome"] = json!("update_accepted");
            body["wait_timed_out"] = json!(wait_for == "completed");
            Ok(Json(body).into_response())
        }
        UpdateStatus::Rejected => {
            let message = record
                .failure
                .as_ref()
                .map(|f| f.message.clone())
                .unwrap_or_else(|| "The update was rejected.".into());
            body["outcome"] = json!("rejected_invalid_arguments");
            body["reason"] = json!(Reason::UpdateValidatorRejected.as_str());
            body["rejection_reason"] = json!(Reason::UpdateValidatorRejected.as_str());
            body["message"] = json!(message);
            body["error"] = json!(message);
            body["accepted"] = json!(false);
            body["command_status"] = json!("rejected");
            body["retryable"] = json!(false);
            body["failure_type"] = json!(record.failure.as_ref().and_then(|f| f.exception_type.clone()));
            if let Some(errors) = &record.validation_errors {
                body["validation_errors"] = errors.clone();
            }
            Ok((StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response())
        }
        UpdateStatus::Failed => {
            let message = record.failure.map(|f| f.message).unwrap_or_else(|| "The update failed.".into());
            body["outcome"] = json!("update_failed");
            body["reason"] = json!(Reason::UpdateFailed.as_str());
            body["message"] = json!(message);
            body["error"] = json!(message);
            body["failure_message"] = json!(message);
            Ok((StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response())
        }
    }
}
