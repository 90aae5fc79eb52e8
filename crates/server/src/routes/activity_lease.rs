//! `POST /worker/activity-tasks/{id}/renew-lease` (capability `activity_lease_renewal`): a
//! worker keeps the claim of an attempt it is still running alive without reporting progress.
//! Both SDKs then hold an authority over the attempt and check every reply against it: the
//! identity under DW's names (`workflow_task_id`, `workflow_instance_id`, `workflow_run_id`),
//! a `server_time` that only moves forward, and a lease that never shrinks.

use super::worker::{activity_claim, activity_refused, attempt_lease};
use crate::body::JsonObject;
use crate::error::ApiResult;
use crate::planes::Namespace;
use crate::{render, wire, Shared};
use axum::extract::{Path, State};
use axum::{Extension, Json};
use capstan_app::{reports, sessions};
use capstan_engine::timefmt::iso8601_micros;
use capstan_engine::*;
use capstan_store::Store;
use serde_json::{json, Value};

/// The fields a renewal takes (both SDKs send exactly these).
const RENEWAL_FIELDS: &[&str] = &["activity_attempt_id", "lease_owner"];

pub async fn renew_lease<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    // The reply's `server_time` is the request's arrival: every grant is counted from it.
    let server_time_us = state.server_time_us();
    wire::refuse_unknown_fields(&body, &[RENEWAL_FIELDS], "", "activity lease renewals")?;
    let (attempt_id, owner) = activity_claim(&body)?;
    let lease = attempt_lease(&namespace, &task_id, &attempt_id, owner.clone());
    let lease_ms = state.config.activity_task_lease_ms;
    let (grant, run) = reports::renew_activity_lease(&*state, lease, lease_ms, server_time_us / 1000)
        .await
        .map_err(|e| renewal_refused(e, &task_id, &attempt_id))?;
    if grant.extended {
        state.run_changed(&run);
    }
    let id = TaskId(task_id.clone());
    // A session activity's renewal renews its session too: the worker is alive and in it.
    let session = sessions::renew_for_activity(&*state, &run, &id, &owner)
        .await
        .map_err(|e| renewal_refused(e, &task_id, &attempt_id))?;
    let execution_id = match run.tasks.get(&id).map(|t| &t.detail) {
        Some(TaskDetail::Activity { execution_id, .. }) => Some(execution_id.clone()),
        _ => None,
    };
    let mut reply = json!({
        "task_id": task_id,
        "workflow_task_id": task_id,
        "workflow_instance_id": run.workflow_id,
        "workflow_run_id": run.run_id,
        "activity_execution_id": execution_id,
        "activity_attempt_id": attempt_id,
        "attempt_number": grant.attempt_number,
        "lease_owner": owner,
        "lease_renewed": true,
        "can_continue": true,
        "cancel_requested": false,
        "heartbeat_recorded": false,
        "reason": null,
        "server_time": iso8601_micros(server_time_us),
        "lease_expires_at": render::time(grant.lease.expires_at),
    });
    if let Some(at) = grant.last_heartbeat_at {
        reply["last_heartbeat_at"] = render::time(at);
    }
    if let Some(at) = grant.heartbeat_deadline_at {
        reply["heartbeat_deadline_at"] = render::time(at);
    }
    if let Some(session) = session {
        reply["worker_session"] = session;
    }
    Ok(Json(reply))
}

/// A refused renewal: the attempt's authority is gone, and the body says so.
fn renewal_refused(error: impl Into<crate::error::ApiError>, task_id: &str, attempt_id: &ActivityAttemptId) -> crate::error::ApiError {
    let mut error = activity_refused(error, task_id, attempt_id);
    if error.status.is_client_error() {
        error.fields.insert("lease_renewed".into(), json!(false));
        error.fields.insert("can_continue".into(), json!(false));
    }
    error
}
