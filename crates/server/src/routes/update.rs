//! Updates: `UpdateAccepted` is recorded at once, a dedicated workflow task runs the handler,
//! and the request waits (up to its budget) for `UpdateCompleted`.

use super::control::{apply_command, check_target};
use super::Namespace;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::wire::Fields;
use crate::{now_ms, render, AppState, Shared};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use capstan_engine::*;
use capstan_store::{intent_hash, CommandKey, RunLocator, Store};
use serde_json::{json, Map, Value};
use std::time::Duration;

/// Longest a request waits for `completed` unless it asks for less.
const UPDATE_WAIT_DEFAULT_SECONDS: i64 = 30;
const UPDATE_WAIT_MAX_SECONDS: i64 = 300;
const SETTLE_RECHECK_MS: u64 = 25;

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
    Path((workflow_id, update_name)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    run_update(state, namespace, workflow_id, None, update_name, body).await
}

pub async fn update_run<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id, update_name)): Path<(String, String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    run_update(state, namespace, workflow_id, Some(run_id), update_name, body).await
}

async fn run_update<S: Store>(
    state: Shared<S>,
    namespace: String,
    workflow_id: String,
    run_id: Option<String>,
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
        .opt_int("wait_timeout_seconds", 1, UPDATE_WAIT_MAX_SECONDS)
        .map_err(fail)?
        .unwrap_or(UPDATE_WAIT_DEFAULT_SECONDS);
    if update_name.is_empty() || update_name.len() > 255 {
        return Err(fail(ApiError::validation(
            "update_name",
            "The update name must be 1 to 255 characters.",
        )));
    }

    let wanted = run_id.clone().map(RunId);
    let name = update_name.clone();
    let args = arguments.clone();
    let command_id = CommandId(ulid::Ulid::new().to_string());
    let locator = RunLocator::Current(WorkflowId(workflow_id.clone()));
    let key = request_id.clone().map(|request_id| CommandKey {
        command_type: "update".into(),
        intent_hash: intent_hash(&[&update_name, &arguments.codec, &arguments.blob, run_id.as_deref().unwrap_or("")]),
        request_id,
    });
    // A retry of a request already decided gets that decision from its receipt, unvalidated.
    let decided = match &key {
        Some(key) => state
            .store
            .retained_command(&namespace, &WorkflowId(workflow_id.clone()), &key.command_type, &key.request_id)
            .await?
            .is_some(),
        None => false,
    };
    let current = state.store.load_run(&namespace, locator.clone()).await?;
    let fallback = crate::contracts::fallback_for(&state.store, &namespace, &locator)
        .await
        .map_err(|e| fail(e.into()))?;
    // An update with a declared validator is put to a worker first (see `validation`).
    let verdict = match &current {
        Some(run) if !decided && !run.is_closed() && check_target(run, &wanted).is_ok() => {
            match admission_contract(run, fallback.for_run(run)) {
                Some(contract) if contract.validates_update(&update_name) => Some((
                    run.run_id.clone(),
                    super::validation::validate(&state, run, &update_name, &arguments)
                        .await
                        .map_err(fail)?,
                )),
                _ => None,
            }
        }
        _ => None,
    };
    let transition = move |run: &mut RunState, cx: &mut Cx| {
        check_target(run, &wanted)?;
        admit_update(run, &name, fallback.for_run(run))?;
        match verdict {
            None => accept_update(run, cx, &name, args, command_id),
            Some((validated_run, _)) if validated_run != run.run_id => Err(Refusal::new(
                Reason::StaleValidation,
                "The run changed while the update was being validated; send it again.",
            )
            .with("validated_run_id", validated_run.as_str())
            .with("retryable", true)),
            Some((_, super::validation::Verdict::Approved)) => accept_update(run, cx, &name, args, command_id),
            Some((_, super::validation::Verdict::Rejected(rejection))) => reject_update(run, cx, &name, args, rejection, command_id),
        }
    };
    let receipt = |(update_id, receipt): &(String, CommandReceipt), run: &RunState| json!({"update_id": update_id, "run_id": run.run_id, "command_id": receipt.command_id, "command_sequence": receipt.command_sequence});
    let (accepted, retained) = apply_command(&state, &namespace, locator, key, transition, receipt)
        .await
        .map_err(|e| fail(e.into()))?;
    let update_id = accepted["update_id"].as_str().unwrap_or_default().to_string();
    let run_id = accepted["run_id"].as_str().unwrap_or_default().to_string();
    tracing::info!(namespace, workflow_id, update_name, update_id, retained, "update accepted");

    let deadline = now_ms() + wait_seconds * 1000;
    let record = loop {
        let run = state
            .store
            .load_run(&namespace, RunLocator::Run(WorkflowId(workflow_id.clone()), RunId(run_id.clone())))
            .await?;
        let record = run.and_then(|run| run.updates.get(&update_id).cloned());
        match record {
            Some(record) if wait_for == "accepted" || record.status != UpdateStatus::Accepted || now_ms() >= deadline => break record,
            None => {
                return Err(fail(ApiError::new(
                    StatusCode::NOT_FOUND,
                    "update_not_found",
                    "The update is gone.",
                )))
            }
            _ => tokio::time::sleep(Duration::from_millis(SETTLE_RECHECK_MS)).await,
        }
    };
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
            body["reason"] = json!("update_validator_rejected");
            body["rejection_reason"] = json!("update_validator_rejected");
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
            body["reason"] = json!("update_failed");
            body["message"] = json!(message);
            body["error"] = json!(message);
            body["failure_message"] = json!(message);
            Ok((StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response())
        }
    }
}
