//! Engine types → wire JSON.

use capstan_engine::timefmt::iso8601;
use capstan_engine::*;
use capstan_store::{RunSummary, StoredEvent};
use serde_json::{json, Map, Value};
use std::io::Write as _;

pub fn time(ms: Millis) -> Value {
    json!(iso8601(ms))
}

pub fn opt_time(ms: Option<Millis>) -> Value {
    ms.map(time).unwrap_or(Value::Null)
}

pub fn envelope(payload: &Payload) -> Value {
    payload.envelope()
}

/// History event as the worker plane shows it.
pub fn worker_event(namespace: &str, event: &HistoryEvent) -> Value {
    json!({
        "id": event.id,
        "sequence": event.sequence,
        "event_type": event.event_type.as_str(),
        "namespace": namespace,
        "payload": event.payload,
        "workflow_task_id": event.workflow_task_id,
        "workflow_command_id": event.workflow_command_id,
        "recorded_at": time(event.recorded_at),
        "prev_hash": event.prev_hash,
        "hash": event.hash,
    })
}

/// One history event as the worker plane shows it, written from its stored text (the payload
/// is spliced in as stored, not parsed and re-serialized).
pub fn worker_event_json(namespace: &str, event: &StoredEvent) -> String {
    let mut out: Vec<u8> = Vec::with_capacity(event.payload.len() + 400);
    let member = |out: &mut Vec<u8>, key: &str, value: Option<&str>| {
        out.extend_from_slice(key.as_bytes());
        match value {
            Some(text) => serde_json::to_writer(&mut *out, text).expect("a string serializes"),
            None => out.extend_from_slice(b"null"),
        }
    };
    member(&mut out, "{\"id\":", Some(&event.id));
    write!(out, ",\"sequence\":{}", event.sequence).expect("writing to a Vec");
    member(&mut out, ",\"event_type\":", Some(&event.event_type));
    member(&mut out, ",\"namespace\":", Some(namespace));
    out.extend_from_slice(b",\"payload\":");
    out.extend_from_slice(event.payload.as_bytes());
    member(&mut out, ",\"workflow_task_id\":", event.workflow_task_id.as_deref());
    member(&mut out, ",\"workflow_command_id\":", event.workflow_command_id.as_deref());
    // Digits and punctuation only: nothing to escape.
    out.extend_from_slice(b",\"recorded_at\":\"");
    out.extend_from_slice(iso8601(event.recorded_at).as_bytes());
    out.push(b'"');
    member(&mut out, ",\"prev_hash\":", Some(&event.prev_hash));
    member(&mut out, ",\"hash\":", Some(&event.hash));
    out.push(b'}');
    String::from_utf8(out).expect("JSON text of UTF-8 strings")
}

/// `object` written out with one more member whose value is JSON text written already.
pub fn with_raw_member(object: &Value, key: &str, raw: &str) -> String {
    let mut text = object.to_string();
    debug_assert!(text.ends_with('}'), "an object");
    text.pop();
    if text.len() > 1 {
        text.push(',');
    }
    text.push_str(&Value::from(key).to_string());
    text.push(':');
    text.push_str(raw);
    text.push('}');
    text
}

/// A JSON body written by hand (it holds a history page), sent as it is.
pub struct RawJson(pub String);

impl axum::response::IntoResponse for RawJson {
    fn into_response(self) -> axum::response::Response {
        ([(axum::http::header::CONTENT_TYPE, "application/json")], self.0).into_response()
    }
}

/// History event as the control plane shows it.
pub fn control_event(event: &HistoryEvent) -> Value {
    json!({
        "id": event.id,
        "sequence": event.sequence,
        "event_type": event.event_type.as_str(),
        "timestamp": time(event.recorded_at),
        // Who caused it; `null`: the server did.
        "principal": event.payload.get("principal").cloned().unwrap_or(Value::Null),
        "payload": event.payload,
        "workflow_task_id": event.workflow_task_id,
        "workflow_command_id": event.workflow_command_id,
        "prev_hash": event.prev_hash,
        "hash": event.hash,
    })
}

/// History page tokens are base64 of the decimal sequence already returned (DW's encoding;
/// Python sends `MA==` for "from the start").
pub fn page_token(after: u64) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(after.to_string())
}

pub fn parse_page_token(token: &str) -> Option<u64> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD.decode(token.trim()).ok()?;
    std::str::from_utf8(&bytes).ok()?.parse().ok()
}

/// `GET /workflows/{id}` and `/runs/{run}`.
/// DW's run-detail fields of an imported run (`capstan_engine::import`): null on a run that
/// started here, whose `engine_source` is `v2` as in DW.
pub fn import_fields(run: &RunState) -> Map<String, Value> {
    let stamp = run.import.as_ref();
    let fields = json!({
        "engine_source": if stamp.is_some() { capstan_engine::import::ENGINE_SOURCE } else { "v2" },
        "import_source": stamp.map(|s| &s.source),
        "import_id": stamp.map(|s| &s.import_id),
        "import_dedupe_key": stamp.map(|s| &s.dedupe_key),
        "import_contract_version": stamp.map(|s| s.contract_version),
        "imported_at": stamp.map_or(Value::Null, |s| time(s.imported_at)),
        "import_source_runtime": stamp.map(|s| &s.source_runtime),
        "import_source_namespace": stamp.and_then(|s| s.source_namespace.as_ref()),
        "import_bundle_checksum": stamp.map(|s| &s.bundle_checksum),
        "imported_by": stamp.and_then(|s| s.imported_by.as_ref()),
    });
    match fields {
        Value::Object(map) => map,
        _ => unreachable!("an object literal"),
    }
}

pub fn describe(run: &RunState, run_count: usize, current_run_id: &RunId) -> Value {
    let closed = run.is_closed();
    let failure = run.failure.as_ref().map(|f| {
        json!({
            "message": f.message,
            "exception_type": f.exception_type,
            "exception_class": f.exception_class,
            "non_retryable": f.non_retryable,
            "exception": f.exception,
        })
    });
    let open_tasks: Vec<Value> = run
        .tasks
        .values()
        .map(|t| {
            // DW's task view: the workflow task carries its last failure's message.
            let last_error = match (&run.workflow_task_failure, run.workflow_task.as_ref()) {
                (Some(note), Some(current)) if current == &t.id => Some(note.message.clone()),
                _ => None,
            };
            json!({
                "task_id": t.id,
                "kind": t.kind.as_str(),
                "status": if t.is_ready() { "ready" } else { "leased" },
                "queue": t.queue,
                "fence": t.fence,
                "attempt_count": t.fence,
                "available_at": time(t.available_at),
                "lease_owner": t.lease().map(|l| l.owner.clone()),
                "lease_expires_at": opt_time(t.lease().map(|l| l.expires_at)),
                "deadline_at": opt_time(t.deadline_at),
                "last_error": last_error,
            })
        })
        .collect();
    let task_failure = run.workflow_task_failure.as_ref().map(task_failure);
    let mut body = json!({
        "workflow_id": run.workflow_id,
        "run_id": run.run_id,
        "namespace": run.namespace,
        "workflow_type": run.workflow_type,
        "status": run.status.as_str(),
        "status_bucket": run.status.bucket(),
        "is_terminal": closed,
        "archived": run.archived,
        "paused": run.paused.is_some(),
        "pause": pause(run.paused.as_ref()),
        "closed_reason": run.closed_reason.map(|r| r.as_str()),
        "task_queue": run.task_queue,
        "priority": run.scheduling.priority,
        "fairness_key": run.scheduling.fairness_key,
        "fairness_weight": run.scheduling.fairness_weight,
        "business_key": run.business_key,
        "run_number": run.run_number,
        "run_count": run_count,
        "is_current_run": &run.run_id == current_run_id,
        "payload_codec": payload::AVRO_CODEC,
        "execution_timeout_seconds": run.execution_timeout_seconds,
        "run_timeout_seconds": run.run_timeout_seconds,
        "execution_deadline_at": opt_time(run.execution_deadline_at),
        "run_deadline_at": opt_time(run.run_deadline_at),
        "input": Value::Null,
        "output": Value::Null,
        "input_envelope": envelope(&run.input),
        "output_envelope": run.output.as_ref().map(envelope),
        "failure": failure,
        "error": run.failure.as_ref().map(|f| f.message.clone()),
        "started_at": time(run.started_at),
        "closed_at": opt_time(run.closed_at),
        "last_progress_at": time(run.last_progress_at),
        "wait_kind": run.wait_kind(),
        "wait_reason": run.workflow_task_failure.as_ref().filter(|_| !closed).map(|note| format!(
            "The workflow task has failed {} time(s) in a row: {}", note.consecutive, note.message)),
        "workflow_task_failure": task_failure,
        "workflow_task_failing": run.workflow_task_failure.is_some() && !closed,
        "memo": run.memo,
        "search_attributes": run.search_attributes,
        "history_event_count": run.last_sequence,
        "continued_from_run_id": run.continued_from_run_id,
        "resume_step_sequence": run.redriven_from.as_ref().map(|r| r.resume_step_sequence),
        "recovery_kind": run.redriven_from.as_ref().map(|_| "redrive"),
        "redriven_to_run_id": run.redriven_to.as_ref().map(|r| r.successor_run_id.clone()),
        "parent_workflow_id": run.parent.as_ref().map(|p| p.workflow_id.clone()),
        "parent_run_id": run.parent.as_ref().map(|p| p.run_id.clone()),
        "open_child_count": run.children.len(),
        "history_chain_origin": run.chain_origin,
        "history_head_hash": run.last_hash,
        "fence_high_water": run.fence_high_water,
        "compatibility": run.compatibility,
        "sticky": run.sticky.as_ref().map(|a| json!({
            "worker_id": a.worker_id,
            "build_id": a.build_id,
            "claimed_at": time(a.claimed_at),
            "expires_at": time(a.expires_at),
            "metrics": a.metrics,
        })),
        "open_tasks": open_tasks,
        "pending_activity_count": run.activities.len(),
        "pending_timer_count": run.timers.len(),
        "updates": run.updates.iter().map(|(id, update)| update_summary(id, update)).collect::<Vec<_>>(),
        "actions": {
            "can_signal": !closed, "can_query": true, "can_update": !closed,
            "can_cancel": !closed, "can_terminate": !closed, "can_repair": !closed, "can_archive": closed && !run.archived,
            "can_pause": !closed && run.paused.is_none(), "can_resume": !closed && run.paused.is_some(),
        },
    });
    body["pending_activities"] = json!(pending_activities(run));
    body["pending_timers"] = json!(run
        .timers
        .values()
        .map(|timer| json!({
            "timer_id": timer.id,
            "sequence": timer.step,
            "delay_seconds": timer.delay_seconds,
            "fire_at": time(timer.fire_at),
            "purpose": match timer.purpose {
                TimerPurpose::User => "timer",
                TimerPurpose::ConditionTimeout(_) => "condition_timeout",
                TimerPurpose::SignalTimeout(_) => "signal_timeout",
            },
        }))
        .collect::<Vec<_>>());
    body["open_children"] = json!(run
        .children
        .iter()
        .map(|(step, child)| json!({
            "sequence": step,
            "workflow_id": child.workflow_id,
            "run_id": child.run_id,
            "workflow_type": child.workflow_type,
            "parent_close_policy": child.parent_close_policy,
        }))
        .collect::<Vec<_>>());
    let object = body.as_object_mut().expect("an object");
    object.extend(history_budget(run));
    object.extend(history_budget_thresholds());
    object.extend(import_fields(run));
    body["blocked_by"] = blocked_by(run);
    body["integrity_incident"] = json!(run.integrity_incident);
    body["ledger"] = json!(run_entries(run));
    let declared = run.contract.as_ref().map(CommandContract::declared_fields).unwrap_or_default();
    body.as_object_mut().expect("an object").extend(declared);
    body
}

/// DW's history budget of `run` (`history_budget_pressure` and the counters behind it), as the
/// task, history and describe answers carry it.
pub fn history_budget(run: &RunState) -> Map<String, Value> {
    let budget = HistoryBudget::of(run);
    let mut fields = Map::new();
    fields.insert("history_size_bytes".into(), json!(budget.size_bytes));
    fields.insert("history_fan_out".into(), json!(budget.fan_out));
    fields.insert("continue_as_new_recommended".into(), json!(budget.continue_as_new_recommended()));
    fields.insert("history_budget_pressure".into(), json!(budget.pressure.as_str()));
    fields.insert("history_budget_pressure_dimensions".into(), json!(budget.dimensions));
    fields
}

/// The thresholds behind the history budget (DW's run detail shows them to explain the pressure).
pub fn history_budget_thresholds() -> Map<String, Value> {
    use capstan_engine::history_budget::*;
    let mut fields = Map::new();
    for (key, value) in [
        ("history_event_threshold", EVENT_CONTINUE_AS_NEW),
        ("history_event_warning_threshold", EVENT_WARNING),
        ("history_size_bytes_threshold", SIZE_CONTINUE_AS_NEW_BYTES),
        ("history_size_bytes_warning_threshold", SIZE_WARNING_BYTES),
        ("history_fan_out_threshold", FAN_OUT_CONTINUE_AS_NEW),
        ("history_fan_out_warning_threshold", FAN_OUT_WARNING),
    ] {
        fields.insert(key.into(), json!(value));
    }
    fields
}

/// The workflow task's latest failure as its worker reported it (DW's `failure` fields), with
/// the streak it belongs to. Shown on describe and history responses.
pub fn task_failure(note: &TaskFailureNote) -> Value {
    json!({
        "task_id": note.task_id,
        "workflow_task_attempt": note.attempt,
        "lease_owner": note.lease_owner,
        "failed_at": time(note.failed_at),
        "first_failed_at": time(note.first_failed_at),
        "consecutive_failures": note.consecutive,
        "message": note.message,
        "type": note.failure_type,
        "reason": note.reason,
        "sequence": note.sequence,
        "stack_trace": note.stack_trace,
        "truncated_bytes": (!note.truncated.is_empty()).then_some(&note.truncated),
    })
}

/// Open activity executions with their current attempt's task: what an operator looks at when a
/// run seems stuck (who holds the lease, when it last heartbeated, what blocks it).
fn pending_activities(run: &RunState) -> Vec<Value> {
    run.activities
        .values()
        .map(|execution| {
            let task = run.tasks.get(&execution.task_id);
            let (started_at, last_heartbeat_at) = match task.map(|t| &t.detail) {
                Some(TaskDetail::Activity {
                    started_at,
                    last_heartbeat_at,
                    ..
                }) => (*started_at, *last_heartbeat_at),
                _ => (None, None),
            };
            let status = match (task, &execution.blocked_by) {
                (_, Some(_)) => "blocked",
                (Some(t), None) if t.lease().is_some() => "leased",
                _ => "ready",
            };
            json!({
                "activity_execution_id": execution.id,
                "activity_type": execution.activity_type,
                "sequence": execution.step,
                "task_queue": execution.queue,
                "status": status,
                "attempt_count": execution.attempt_count,
                "current_attempt_id": execution.attempt_ids.last(),
                "max_attempts": execution.retry_policy.max_attempts,
                "scheduled_at": time(execution.scheduled_at),
                "started_at": opt_time(started_at),
                "last_heartbeat_at": opt_time(last_heartbeat_at),
                "last_heartbeat_details": execution.last_heartbeat_details,
                "lease_owner": task.and_then(|t| t.lease()).map(|l| l.owner.clone()),
                "lease_expires_at": opt_time(task.and_then(|t| t.lease()).map(|l| l.expires_at)),
                "next_attempt_at": task.filter(|t| t.lease().is_none()).map(|t| time(t.available_at)),
                "fence": task.map(|t| t.fence),
                "ledger_key": execution.ledger_key,
                "blocked_by": execution.blocked_by,
            })
        })
        .collect()
}

pub fn summary(row: &RunSummary) -> Value {
    json!({
        "workflow_id": row.workflow_id,
        "run_id": row.run_id,
        "run_number": row.run_number,
        "workflow_type": row.workflow_type,
        "business_key": row.business_key,
        "status": row.status.as_str(),
        "status_bucket": row.status.bucket(),
        "task_queue": row.task_queue,
        "is_terminal": row.status.is_terminal(),
        "started_at": time(row.started_at),
        "closed_at": opt_time(row.closed_at),
        "search_attributes": row.search_attributes,
        "memo": row.memo,
        "namespace": row.namespace,
        "payload_codec": payload::AVRO_CODEC,
        "history_event_count": row.history_budget.event_count,
        "history_size_bytes": row.history_budget.size_bytes,
        "continue_as_new_recommended": row.history_budget.continue_as_new_recommended(),
        "history_budget_pressure": row.history_budget.pressure.as_str(),
        "workflow_task_failing": row.workflow_task_failing.is_some(),
        "workflow_task_consecutive_failures": row.workflow_task_failing.as_ref().map(|f| f.0),
        "workflow_task_last_error": row.workflow_task_failing.as_ref().map(|f| f.1.clone()),
        "paused": row.paused.is_some(),
        "pause": pause(row.paused.as_ref()),
    })
}

/// An operator's hold on a run (Capstan): when, why and by whom; `null` when it runs free.
pub fn pause(paused: Option<&capstan_engine::PauseRecord>) -> Value {
    paused.map_or(Value::Null, |p| {
        json!({
            "paused_at": time(p.paused_at),
            "reason": p.reason,
            "principal": capstan_engine::principal::recorded(p.principal.as_ref()),
        })
    })
}

/// The task object of an activity poll.
/// The retry policy an activity task carries: the workflow's, when it gave one, with the
/// heartbeat timeout in it (lease-renewing SDKs read the heartbeat interval there).
fn retry_policy_of(execution: &ActivityExecution) -> Value {
    let mut policy = match execution.retry_policy_given {
        true => execution.retry_policy.to_json(),
        false => json!({}),
    };
    if let (Some(hb), Some(map)) = (execution.timeouts.heartbeat_seconds, policy.as_object_mut()) {
        map.insert("heartbeat_timeout".into(), json!(hb));
    }
    match policy.as_object().is_some_and(|m| m.is_empty()) {
        true => Value::Null,
        false => policy,
    }
}

pub fn activity_task(run: &RunState, task: &Task) -> Value {
    let TaskDetail::Activity {
        execution_id,
        activity_type,
        attempt_number,
        attempt_id,
        ..
    } = &task.detail
    else {
        return Value::Null;
    };
    let execution = run.activities.get(execution_id);
    let lease = task.lease();
    let mut body = Map::new();
    let mut put = |key: &str, value: Value| {
        if !value.is_null() {
            body.insert(key.to_string(), value);
        }
    };
    put("task_id", json!(task.id));
    put("namespace", json!(run.namespace));
    put("workflow_id", json!(run.workflow_id));
    put("run_id", json!(run.run_id));
    put("workflow_type", json!(run.workflow_type));
    put("activity_execution_id", json!(execution_id));
    put("activity_attempt_id", json!(attempt_id));
    put("attempt_number", json!(attempt_number));
    put("activity_type", json!(activity_type));
    put("payload_codec", json!(payload::AVRO_CODEC));
    put("arguments", execution.map(|e| envelope(&e.arguments)).unwrap_or(Value::Null));
    put("task_queue", json!(task.queue));
    put("lease_owner", json!(lease.map(|l| l.owner.clone())));
    put("lease_expires_at", opt_time(lease.map(|l| l.expires_at)));
    put("fence", json!(task.fence));
    if let Some(execution) = execution {
        let t = &execution.timeouts;
        put("retry_policy", retry_policy_of(execution));
        let mut deadlines = Map::new();
        let (started_at, last_heartbeat_at) = match &task.detail {
            TaskDetail::Activity {
                started_at,
                last_heartbeat_at,
                ..
            } => (*started_at, *last_heartbeat_at),
            _ => (None, None),
        };
        if let (Some(started), Some(stc)) = (started_at, t.start_to_close_seconds) {
            deadlines.insert("start_to_close".into(), time(started + stc * 1000));
        }
        if let (Some(started), Some(hb)) = (started_at, t.heartbeat_seconds) {
            deadlines.insert("heartbeat".into(), time(last_heartbeat_at.unwrap_or(started) + hb * 1000));
        }
        if let Some(deadline) = execution.schedule_to_close_deadline {
            deadlines.insert("schedule_to_close".into(), time(deadline));
        }
        if !deadlines.is_empty() {
            put("deadlines", Value::Object(deadlines));
        }
        if let Some(hb) = t.heartbeat_seconds {
            put("heartbeat_timeout", json!(hb));
        }
        if let Some(stc) = t.start_to_close_seconds {
            put("start_to_close_timeout", json!(stc));
        }
        if let Some(details) = &execution.last_heartbeat_details {
            put("last_heartbeat_details", details.clone());
        }
    }
    put("observability_context", trace_context(run));
    Value::Object(body)
}

/// The run's origin trace context as tasks carry it (`observability_context`; absent when the
/// run has none: an SDK reads a null as a malformed context).
pub fn trace_context(run: &RunState) -> Value {
    run.origin_trace.as_ref().map_or(Value::Null, TraceContext::envelope)
}

/// The task object of a workflow poll, with the first history page.
/// A leased workflow task, without its history page (the caller adds `history_events`).
pub fn workflow_task(run: &RunState, task: &Task, next_token: Option<String>) -> Value {
    let TaskDetail::Workflow {
        resume,
        history_snapshot,
        replay_mode,
    } = &task.detail
    else {
        return Value::Null;
    };
    let lease = task.lease();
    let mut body = json!({
        "task_kind": "workflow",
        "task_id": task.id,
        "namespace": run.namespace,
        "workflow_id": run.workflow_id,
        "run_id": run.run_id,
        "workflow_type": run.workflow_type,
        "workflow_task_attempt": task.fence,
        "lease_owner": lease.map(|l| l.owner.clone()),
        "lease_expires_at": opt_time(lease.map(|l| l.expires_at)),
        "task_queue": task.queue,
        "payload_codec": payload::AVRO_CODEC,
        "arguments": envelope(&run.input),
        "run_status": run.status.as_str(),
        "last_history_sequence": history_snapshot,
        "total_history_events": history_snapshot,
        "next_history_page_token": next_token,
        "workflow_wait_kind": Value::Null,
        "resume_source_kind": Value::Null,
        "resume_source_id": Value::Null,
        "workflow_signal_id": Value::Null,
        "signal_name": Value::Null,
        "signal_arguments": Value::Null,
        "workflow_update_id": Value::Null,
        "workflow_command_id": Value::Null,
        "cancel_requested": false,
        "fence": task.fence,
        "sticky_replay_mode": replay_mode.unwrap_or(ReplayMode::ColdReplay).as_str(),
    });
    if let Some(ResumeContext::Update {
        update_id,
        update_name,
        command_id,
    }) = resume
    {
        body["resume_source_kind"] = json!("workflow_update");
        body["resume_source_id"] = json!(update_id);
        body["workflow_update_id"] = json!(update_id);
        body["update_name"] = json!(update_name);
        body["workflow_command_id"] = json!(command_id);
    }
    if let Some(ResumeContext::Signal {
        signal_id,
        signal_name,
        arguments,
        command_id,
    }) = resume
    {
        body["resume_source_kind"] = json!("workflow_signal");
        body["resume_source_id"] = json!(signal_id);
        body["workflow_signal_id"] = json!(signal_id);
        body["signal_name"] = json!(signal_name);
        body["signal_arguments"] = envelope(arguments);
        body["workflow_command_id"] = json!(command_id);
        body["workflow_wait_kind"] = json!("signal");
    }
    body.as_object_mut().expect("an object").extend(history_budget(run));
    if let Some(request) = &run.cancellation {
        body["cancellation_request"] = cancellation_request(request);
    }
    if let Some(origin) = &run.origin_trace {
        body["observability_context"] = origin.envelope();
    }
    let target = trace::LinkTarget {
        task_id: task.id.as_str(),
        run_id: run.run_id.as_str(),
        namespace: &run.namespace,
    };
    if let Some(links) = trace::command_links(&target, &run.command_traces, *history_snapshot) {
        body["observability_links"] = links;
    }
    body
}

/// A cooperative cancellation request as workers and clients observe it
/// (`task.cancellation_request`, heartbeat replies, `request-cancellation` receipts).
pub fn cancellation_request(request: &CancellationRequest) -> Value {
    json!({
        "request_id": request.request_id,
        "requested_at": time(request.requested_at),
        "cleanup_deadline_at": time(request.cleanup_deadline_at),
        "delivery_sequence": request.delivery.as_ref().map(|d| d.sequence),
        "delivered_at": request.delivery.as_ref().map(|d| time(d.delivered_at)),
        // Cleanup replay reloads the whole history: from the first event.
        "history_refresh_page_token": page_token(0),
    })
}

pub fn receipt_created(receipt: &Receipt) -> Value {
    json!(receipt.created_task_ids)
}

fn update_outcome(status: UpdateStatus) -> &'static str {
    match status {
        UpdateStatus::Accepted => "update_accepted",
        UpdateStatus::Completed => "update_completed",
        UpdateStatus::Failed => "update_failed",
        UpdateStatus::Rejected => "update_rejected",
    }
}

/// One update on a run's detail: where it stands, without its payloads.
pub fn update_summary(update_id: &str, update: &UpdateRecord) -> Value {
    json!({
        "id": update_id,
        "update_id": update_id,
        "name": update.update_name,
        "status": update.status.as_str(),
        "outcome": update_outcome(update.status),
        "command_id": update.command_id,
        "accepted_at": time(update.accepted_at),
        "closed_at": opt_time(update.closed_at),
        "failure_message": update.failure.as_ref().map(|f| f.message.clone()),
    })
}

/// One update in a history export (DW's shape; payloads as stored).
pub fn update_export(update_id: &str, update: &UpdateRecord) -> Value {
    json!({
        "id": update_id,
        "command_id": update.command_id,
        "name": update.update_name,
        "status": update.status.as_str(),
        "outcome": update_outcome(update.status),
        "rejection_reason": (update.status == UpdateStatus::Rejected).then_some(Reason::UpdateValidatorRejected.as_str()),
        "validation_errors": update.validation_errors,
        "accepted_at": time(update.accepted_at),
        "closed_at": opt_time(update.closed_at),
        "payload_codec": update.arguments.codec,
        "arguments": update.arguments.blob_value(),
        "result": update.result.as_ref().map(Payload::blob_value),
        "failure_message": update.failure.as_ref().map(|f| f.message.clone()),
    })
}

/// What blocks a run, for describe: its unresolved ledger entry, if any.
pub fn blocked_by(run: &RunState) -> Value {
    match unresolved_ledger_entry(run) {
        Some(entry) => json!({
            "reason": Reason::OutcomeUnknownRequiresResolution.as_str(),
            "ledger_key": entry.ledger_key,
            "activity_type": entry.activity_type,
            "activity_execution_id": entry.activity_execution_id,
            "unknown_reason": entry.unknown_reason,
        }),
        None => Value::Null,
    }
}

/// Ledger entries of the run, for describe.
pub fn run_entries(run: &RunState) -> Vec<Map<String, Value>> {
    run.ledger
        .values()
        .map(|e| {
            let mut m = Map::new();
            m.insert("ledger_key".into(), json!(e.ledger_key));
            m.insert("activity_type".into(), json!(e.activity_type));
            m.insert("state".into(), json!(e.state.as_str()));
            m.insert("attempt_number".into(), json!(e.attempt_number));
            m
        })
        .collect()
}

/// A deregistration's answer: the worker and how many of its leased workflow tasks were given
/// back (its activity attempts are left to finish or expire).
pub fn deregistered(worker_id: &str, recovered: usize) -> Value {
    json!({
        "worker_id": worker_id,
        "outcome": "deregistered",
        "deregistered": true,
        "recovered_workflow_task_count": recovered,
        "recovered_activity_task_count": 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events written from their stored text are exactly the events rendered from the engine's.
    #[test]
    fn stored_events_render_as_the_engine_events_do() {
        let mut payload = Map::new();
        payload.insert("sequence".into(), json!(1));
        payload.insert("note".into(), json!("quote \" backslash \\ and ünïcode"));
        let events: Vec<HistoryEvent> = (1..=2)
            .map(|n| HistoryEvent {
                id: EventId(format!("ev-{n}")),
                sequence: n,
                event_type: EventType::ActivityScheduled,
                payload: payload.clone(),
                workflow_task_id: (n == 1).then(|| TaskId("task-1".into())),
                workflow_command_id: None,
                recorded_at: 1_800_000_000_123,
                prev_hash: "0".repeat(64),
                hash: "a".repeat(64),
            })
            .collect();
        let stored: Vec<StoredEvent> = events
            .iter()
            .map(|e| StoredEvent {
                id: e.id.as_str().to_string(),
                sequence: e.sequence,
                event_type: e.event_type.as_str().to_string(),
                payload: serde_json::to_string(&e.payload).unwrap(),
                workflow_task_id: e.workflow_task_id.as_ref().map(|t| t.as_str().to_string()),
                workflow_command_id: None,
                recorded_at: e.recorded_at,
                prev_hash: e.prev_hash.clone(),
                hash: e.hash.clone(),
            })
            .collect();
        for (raw, event) in stored.iter().zip(&events) {
            let written: Value = serde_json::from_str(&worker_event_json("default", raw)).unwrap();
            assert_eq!(written, worker_event("default", event));
        }
        let object = json!({"a": 1});
        let with: Value = serde_json::from_str(&with_raw_member(&object, "h", "[1]")).unwrap();
        assert_eq!(with, json!({"a": 1, "h": [1]}));
        let empty: Value = serde_json::from_str(&with_raw_member(&json!({}), "h", "[]")).unwrap();
        assert_eq!(empty, json!({"h": []}));
    }
}
