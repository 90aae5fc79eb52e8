//! `POST /worker/workflow-tasks/{task}/local-activities/…` (capability
//! `prepared_local_activities`): the worker holding a workflow task asks before it runs a
//! local activity (`prepare`), supervises the attempt (`{attempt}/control`, `{attempt}/heartbeat`),
//! reports its end (`{attempt}/outcome`), acknowledges a cancellation's stop
//! (`{attempt}/acknowledge-cancellation`), recovers an attempt a lost claim left unfinished
//! (`recover`), commits the authored commands before a call (`checkpoint`) and admits a
//! parallel group with local members at once (`checkpoint-group`). Every reply
//! carries `history_refresh_page_token`: the worker reloads history from the first event and
//! replays on the same claim, finding the events just recorded.

mod parse;

use super::worker::{refused, workflow_claim, workflow_lease};
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::{render, wire, Shared};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use capstan_app::local_activities;
use capstan_engine::*;
use capstan_store::Store;
use serde_json::{json, Map, Value};

pub async fn prepare<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    parse::check_fields(&body, parse::PREPARE_FIELDS, "local activity preparations")?;
    let claim = workflow_claim(&body)?;
    let sequence = parse::sequence(&body, "sequence")?;
    let nonce = wire::Fields::new(&body).req_str("worker_attempt_id", 255)?;
    let descriptor = parse::descriptor(&body, &state.config.limits)?;
    let lease = workflow_lease(&namespace, &task_id, &claim);
    let (admission, run) = local_activities::prepare(&*state, lease, sequence, nonce, descriptor)
        .await
        .map_err(|e| refused(e, &task_id))?;
    // Read after the transition: the deadlines it set count from its own instant, and the SDK
    // checks each against `server_time` plus its timeout.
    let server_time = state.now();
    if !admission.duplicate {
        state.run_changed(&run);
    }
    let attempt = &admission.attempt;
    let mut reply = identity(&task_id, claim.attempt, &admission.execution_id, attempt);
    reply.extend(timing(
        admission.lease_expires_at,
        &admission.deadlines,
        &admission.cleanup,
        server_time,
    ));
    reply.extend(obj([
        ("prepared", json!(true)),
        ("duplicate", json!(admission.duplicate)),
        ("reason", Value::Null),
        ("worker_attempt_id", json!(attempt.worker_attempt_id)),
        ("attempt_number", json!(attempt.number)),
        ("workflow_run_id", json!(run.run_id)),
    ]));
    Ok(Json(Value::Object(reply)))
}

pub async fn control<S: Store>(
    state: State<Shared<S>>,
    namespace: Extension<Namespace>,
    path: Path<(String, String)>,
    body: JsonObject,
) -> ApiResult<Json<Value>> {
    supervise(state, namespace, path, body, Supervision::Control).await
}

pub async fn heartbeat<S: Store>(
    state: State<Shared<S>>,
    namespace: Extension<Namespace>,
    path: Path<(String, String)>,
    body: JsonObject,
) -> ApiResult<Json<Value>> {
    supervise(state, namespace, path, body, Supervision::Heartbeat).await
}

/// The two supervision calls: `control` renews the claim, `heartbeat` records progress.
enum Supervision {
    Control,
    Heartbeat,
}

async fn supervise<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((task_id, attempt_id)): Path<(String, String)>,
    JsonObject(body): JsonObject,
    kind: Supervision,
) -> ApiResult<Json<Value>> {
    let claim = workflow_claim(&body)?;
    let lease = workflow_lease(&namespace, &task_id, &claim);
    let attempt = ActivityAttemptId(attempt_id.clone());
    let supervised = match kind {
        Supervision::Control => {
            parse::check_fields(&body, parse::CONTROL_FIELDS, "local activity supervision")?;
            let renew = wire::Fields::new(&body).opt_bool("renew_lease")?.unwrap_or(true);
            let lease_ms = if renew { state.config.workflow_task_lease_ms } else { 0 };
            local_activities::control(&*state, lease, attempt, lease_ms).await
        }
        Supervision::Heartbeat => {
            parse::check_fields(&body, parse::HEARTBEAT_FIELDS, "local activity heartbeats")?;
            let progress = parse::progress(&body)?;
            let beat = local_activities::heartbeat(&*state, lease, attempt, progress).await;
            beat.map(|(supervised, run)| (supervised, run, true))
        }
    };
    let (supervised, run, written) = supervised.map_err(|e| refused(e, &task_id))?;
    // After the transition, as for `prepare`: a heartbeat's new deadline counts from it.
    let server_time = state.now();
    if written {
        state.run_changed(&run);
    }
    supervision_reply(&task_id, claim.attempt, &attempt_id, supervised, &run, server_time)
}

pub async fn outcome<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((task_id, attempt_id)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    parse::check_fields(&body, parse::OUTCOME_FIELDS, "local activity outcomes")?;
    let claim = workflow_claim(&body)?;
    let (report, fingerprint) = parse::report(&body, &state.config.limits)?;
    let lease = workflow_lease(&namespace, &task_id, &claim);
    let (receipt, run) = local_activities::outcome(&*state, lease, ActivityAttemptId(attempt_id), report, fingerprint)
        .await
        .map_err(|e| refused(e, &task_id))?;
    if !receipt.duplicate {
        state.run_changed(&run);
    }
    let mut reply = record_reply(&receipt, &run);
    reply.insert("recorded".into(), json!(true));
    reply.insert("lease_owner".into(), json!(claim.owner));
    Ok(Json(Value::Object(reply)))
}

pub async fn recover<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    parse::check_fields(&body, parse::RECOVER_FIELDS, "local activity recoveries")?;
    let claim = workflow_claim(&body)?;
    let sequence = parse::sequence(&body, "sequence")?;
    let descriptor = parse::descriptor(&body, &state.config.limits)?;
    let lease = workflow_lease(&namespace, &task_id, &claim);
    let (receipt, run) = local_activities::recover(&*state, lease, sequence, descriptor)
        .await
        .map_err(|e| refused(e, &task_id))?;
    if !receipt.duplicate {
        state.run_changed(&run);
    }
    let mut reply = record_reply(&receipt, &run);
    reply.insert("recovered".into(), json!(true));
    reply.insert("callback_stop_state".into(), json!("unknown"));
    Ok(Json(Value::Object(reply)))
}

pub async fn checkpoint<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    parse::check_fields(&body, parse::CHECKPOINT_FIELDS, "local activity checkpoints")?;
    let claim = workflow_claim(&body)?;
    let checkpoint_id = wire::Fields::new(&body).req_str("checkpoint_id", 255)?;
    let start = parse::sequence(&body, "start_sequence")?;
    let commands = wire::parse_commands(body.get("commands"), &state.config.limits)?;
    if !commands.iter().all(checkpoint_admits) {
        return Err(ApiError::validation(
            "commands",
            "A checkpoint carries record_side_effect, record_version_marker, upsert_memo and upsert_search_attributes only.",
        ));
    }
    let lease = workflow_lease(&namespace, &task_id, &claim);
    let (receipt, run) = local_activities::checkpoint(&*state, lease, checkpoint_id, start, commands)
        .await
        .map_err(|e| refused(e, &task_id))?;
    if !receipt.duplicate {
        state.run_changed(&run);
    }
    Ok(Json(Value::Object(checkpoint_reply(&task_id, &receipt, &run))))
}

/// `{attempt}/acknowledge-cancellation`: the worker has stopped the callback of an attempt a
/// cooperative cancellation stopped; recorded once (`ActivityCancellationAcknowledged`).
pub async fn acknowledge<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((task_id, attempt_id)): Path<(String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    parse::check_fields(&body, parse::ACKNOWLEDGE_FIELDS, "local activity stop acknowledgements")?;
    let claim = workflow_claim(&body)?;
    let request_id = wire::Fields::new(&body).req_str("request_id", 255)?;
    let attempt_id = ActivityAttemptId(attempt_id);
    let lease = workflow_lease(&namespace, &task_id, &claim);
    let (receipt, run) = local_activities::acknowledge_stop(&*state, lease, attempt_id.clone(), request_id)
        .await
        .map_err(|e| refused(e, &task_id))?;
    if !receipt.duplicate {
        state.run_changed(&run);
    }
    Ok(Json(json!({
        "acknowledged": true,
        "duplicate": receipt.duplicate,
        "reason": null,
        "history_event_id": receipt.acknowledgement.id,
        "received_after_deadline": receipt.acknowledgement.received_after_deadline,
        "workflow_task_id": task_id,
        "activity_attempt_id": attempt_id,
    })))
}

/// `checkpoint-group`: a parallel group with local members admitted at once; the reply names
/// each local member's execution id.
pub async fn checkpoint_group<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(task_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    parse::check_fields(&body, parse::CHECKPOINT_FIELDS, "local activity group checkpoints")?;
    let claim = workflow_claim(&body)?;
    let checkpoint_id = wire::Fields::new(&body).req_str("checkpoint_id", 255)?;
    let start = parse::sequence(&body, "start_sequence")?;
    let members = parse::group_members(&body, &state.config.limits)?;
    if !members
        .iter()
        .all(|m| matches!(m, GroupMember::Local(_)) || matches!(m, GroupMember::Command(c) if group_admits(c)))
    {
        return Err(ApiError::validation(
            "commands",
            "A group's leaves are prepare_local_activity, schedule_activity, start_timer and start_child_workflow.",
        ));
    }
    let lease = workflow_lease(&namespace, &task_id, &claim);
    let (receipt, run) = local_activities::checkpoint_group(&*state, lease, checkpoint_id, start, members)
        .await
        .map_err(|e| refused(e, &task_id))?;
    if !receipt.duplicate {
        state.run_changed(&run);
    }
    let mut reply = checkpoint_reply(&task_id, &receipt, &run);
    let locals: Vec<Value> = receipt
        .checkpoint
        .locals
        .iter()
        .map(|(sequence, execution_id)| json!({"sequence": sequence, "activity_execution_id": execution_id}))
        .collect();
    reply.insert("local_activities".into(), json!(locals));
    Ok(Json(Value::Object(reply)))
}

fn checkpoint_reply(task_id: &str, receipt: &CheckpointReceipt, run: &RunState) -> Map<String, Value> {
    let c = &receipt.checkpoint;
    obj([
        ("checkpointed", json!(true)),
        ("duplicate", json!(receipt.duplicate)),
        ("checkpoint_id", json!(c.checkpoint_id)),
        ("task_id", json!(task_id)),
        ("workflow_run_id", json!(run.run_id)),
        ("workflow_task_attempt", json!(c.task_attempt)),
        ("lease_owner", json!(c.lease_owner)),
        ("start_sequence", json!(c.start_sequence)),
        ("next_sequence", json!(c.next_sequence)),
        ("reason", Value::Null),
        ("history_refresh_page_token", json!(render::page_token(0))),
    ])
}

/// A running attempt's reply, or the refusal of one the server ended past a deadline.
fn supervision_reply(
    task_id: &str,
    task_attempt: u64,
    attempt_id: &str,
    supervised: Supervised,
    run: &RunState,
    server_time: Millis,
) -> ApiResult<Json<Value>> {
    match supervised {
        Supervised::Active(view) => {
            let mut reply = identity(task_id, task_attempt, &view.execution_id, &view.attempt);
            reply.extend(timing(view.lease_expires_at, &view.deadlines, &view.cleanup, server_time));
            reply.extend(obj([
                ("active", json!(true)),
                ("renewed", json!(view.renewed)),
                ("stop_required", json!(false)),
                ("reason", Value::Null),
                ("heartbeat_recorded", json!(view.heartbeat_event_id.is_some())),
                ("heartbeat_history_event_id", json!(view.heartbeat_event_id)),
                ("run_status", json!(run.status.as_str())),
                ("task_status", json!("leased")),
            ]));
            Ok(Json(Value::Object(reply)))
        }
        Supervised::Stopped(stop) => {
            let view = &stop.view;
            let mut reply = identity(task_id, task_attempt, &view.execution_id, &view.attempt);
            reply.extend(timing(view.lease_expires_at, &view.deadlines, &view.cleanup, server_time));
            reply.extend(obj([
                ("active", json!(false)),
                ("renewed", json!(false)),
                ("stop_required", json!(true)),
                ("reason", json!("cancellation_requested")),
                ("cancellation_request", stop.request.context(&run.workflow_id, &run.run_id)),
                ("fenced", json!(true)),
                ("cancellation_history_event_id", json!(stop.cancellation_event_id)),
                ("heartbeat_recorded", json!(false)),
                ("heartbeat_history_event_id", Value::Null),
                ("run_status", json!(run.status.as_str())),
                (
                    "task_status",
                    json!(if run.tasks.contains_key(&TaskId(task_id.to_string())) {
                        "leased"
                    } else {
                        "completed"
                    }),
                ),
            ]));
            Ok(Json(Value::Object(reply)))
        }
        Supervised::Ended { timeout_kind, record } => {
            let mut error = ApiError::new(
                StatusCode::CONFLICT,
                Reason::LocalActivityDeadlineExpired,
                "The attempt is past a deadline: its timeout is recorded and the claim released.",
            );
            for (key, value) in [
                ("task_id", json!(task_id)),
                ("activity_attempt_id", json!(attempt_id)),
                ("active", json!(false)),
                ("stop_required", json!(true)),
                ("timeout_kind", json!(timeout_kind)),
                ("event_id", json!(record.event_id)),
                ("event_type", json!(record.event_type)),
                ("claim_released", json!(true)),
            ] {
                error.fields.insert(key.into(), value);
            }
            Err(error)
        }
    }
}

/// The attempt's identity, under the names the SDK checks.
fn identity(task_id: &str, task_attempt: u64, execution_id: &ActivityExecutionId, attempt: &PreparedAttempt) -> Map<String, Value> {
    obj([
        ("workflow_task_id", json!(task_id)),
        ("workflow_task_attempt", json!(task_attempt)),
        ("lease_owner", json!(attempt.lease_owner)),
        ("activity_execution_id", json!(execution_id)),
        ("activity_attempt_id", json!(attempt.attempt_id)),
    ])
}

/// The lease, the deadlines (each key present, null when unbounded), the cleanup authority of a
/// cleanup call, the server's time and the history cursor.
fn timing(lease_expires_at: Millis, deadlines: &LocalDeadlines, cleanup: &Option<CleanupView>, server_time: Millis) -> Map<String, Value> {
    let at = |ms: Option<Millis>| ms.map(render::time).unwrap_or(Value::Null);
    obj([
        ("lease_expires_at", render::time(lease_expires_at)),
        ("workflow_lease_expires_at", render::time(lease_expires_at)),
        ("start_to_close_deadline_at", at(deadlines.start_to_close)),
        ("schedule_to_close_deadline_at", at(deadlines.schedule_to_close)),
        ("heartbeat_deadline_at", at(deadlines.heartbeat)),
        (
            "cancellation_cleanup",
            cleanup.as_ref().map_or(Value::Null, |c| {
                json!({
                    "request_id": c.request_id,
                    "root_request_id": c.request_id,
                    "delivery_history_event_id": c.delivery_history_event_id,
                    "cleanup_deadline_at": render::time(c.cleanup_deadline_at),
                })
            }),
        ),
        ("server_time", render::time(server_time)),
        ("history_refresh_page_token", json!(render::page_token(0))),
    ])
}

/// The receipt of an ended attempt (`outcome`, `recover`).
fn record_reply(receipt: &LocalRecordReceipt, run: &RunState) -> Map<String, Value> {
    let r = &receipt.record;
    obj([
        ("duplicate", json!(receipt.duplicate)),
        ("reason", Value::Null),
        ("event_id", json!(r.event_id)),
        ("event_type", json!(r.event_type)),
        ("workflow_run_id", json!(run.run_id)),
        ("workflow_task_id", json!(r.task_id)),
        ("workflow_task_attempt", json!(r.task_attempt)),
        ("activity_execution_id", json!(r.execution_id)),
        ("activity_attempt_id", json!(r.attempt_id)),
        ("worker_attempt_id", json!(r.worker_attempt_id)),
        ("recorded_at", render::time(r.recorded_at)),
        ("claim_released", json!(r.retry_task_id.is_some())),
        ("created_task_ids", json!(r.retry_task_id.iter().collect::<Vec<_>>())),
        ("history_refresh_page_token", json!(render::page_token(0))),
    ])
}

fn obj<const N: usize>(entries: [(&str, Value); N]) -> Map<String, Value> {
    entries.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}
