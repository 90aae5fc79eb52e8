//! A run as DW's `durable-workflow.v2.history-export` bundle, sealed with the
//! `json-recursive-ksort-v1` SHA-256 checksum DW's verifiers recompute. An open run's bundle
//! also lists its open tasks, activities and timers in DW's sections (so an importer sees what
//! is leased or running) and carries Capstan's own run state (`capstan_run_state`), from which
//! another Capstan continues the run (`docs/import.md`).

use crate::render;
use crate::wire::bundle_sections;
use crate::wire::history_bundle::{checksum, CANONICALIZATION, CARRIED_STATE};
use capstan_engine::import::{OpenRunSections, PendingResume};
use capstan_engine::*;
use serde_json::{json, Value};

pub fn bundle(namespace: &str, run: &RunState, current_run_id: &RunId, events: &[HistoryEvent], now: Millis) -> Value {
    let history: Vec<Value> = events
        .iter()
        .map(|e| {
            let mut event = render::worker_event(namespace, e);
            event["type"] = json!(e.event_type.as_str());
            event
        })
        .collect();
    let envelope = |payload: Option<&Payload>| match payload {
        Some(p) => json!({"available": true, "data": render::envelope(p)}),
        None => json!({"available": false, "data": null}),
    };
    let sections = OpenRunSections::of(run);
    let mut bundle = json!({
        "schema": capstan_engine::import::BUNDLE_SCHEMA,
        "schema_version": 1,
        "exported_at": render::time(now),
        "dedupe_key": format!("{}:{}:{}", run.run_id, run.last_sequence, run.last_hash),
        "history_complete": run.is_closed(),
        "workflow": {
            "instance_id": run.workflow_id,
            "run_id": run.run_id,
            "run_number": run.run_number,
            "is_current_run": &run.run_id == current_run_id,
            "current_run_id": current_run_id,
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
            "source_runtime": "capstan",
            "namespace": namespace,
            "queue": run.task_queue,
            "compatibility": run.compatibility,
            "started_at": render::time(run.started_at),
            "closed_at": render::opt_time(run.closed_at),
            "last_progress_at": render::time(run.last_progress_at),
        },
        "payloads": {"codec": payload::AVRO_CODEC, "arguments": envelope(Some(&run.input)), "output": envelope(run.output.as_ref())},
        "history_events": history,
        "commands": [],
        "signals": signals(events, &sections),
        "updates": run.updates.iter().map(|(id, update)| render::update_export(id, update)).collect::<Vec<_>>(),
        "tasks": run.tasks.values().filter_map(|t| task(run, t, &sections)).collect::<Vec<_>>(),
        "activities": run.activities.values().map(|a| activity(run, a)).collect::<Vec<_>>(),
        "timers": run.timers.values().map(timer).collect::<Vec<_>>(),
        "failures": [],
        "links": {"continued_from_run_id": run.continued_from_run_id, "parent_workflow_id": run.parent.as_ref().map(|p| p.workflow_id.clone())},
        "redaction": {"applied": false, "paths": []},
        "codec_schemas": {},
        "payload_manifest": {"version": 1, "entries": []},
    });
    if !run.is_closed() {
        bundle[CARRIED_STATE] = serde_json::to_value(run).expect("a run state serializes");
    }
    let sealed = checksum(bundle.as_object().expect("an object"));
    bundle["integrity"] =
        json!({"canonicalization": CANONICALIZATION, "checksum_algorithm": "sha256", "checksum": sealed, "signature": null});
    bundle
}

fn task_status(task: &Task) -> &'static str {
    if task.is_ready() {
        "ready"
    } else {
        "leased"
    }
}

/// Every signal the run received, `received` while the workflow has yet to see it (DW's
/// statuses), else `applied`.
fn signals(events: &[HistoryEvent], sections: &OpenRunSections) -> Vec<Value> {
    let current = sections.workflow_task.iter().filter_map(|task| task.resume.as_ref());
    let pending: Vec<&PendingResume> = current.chain(&sections.resumes).collect();
    events
        .iter()
        .filter(|e| e.event_type == EventType::SignalReceived)
        .map(|e| {
            let id = e.payload.get("signal_id").and_then(Value::as_str).unwrap_or_default();
            let received = pending.contains(&&PendingResume::Signal(id.to_string()));
            json!({
                "id": id,
                "command_id": e.payload.get("workflow_command_id"),
                "name": e.payload.get("signal_name"),
                "status": if received { "received" } else { "applied" },
                "received_at": render::time(e.recorded_at),
            })
        })
        .collect()
}

/// An open worker task in DW's `tasks` shape (timers are listed under `timers`); the workflow
/// task's payload lists what the workflow is still to be woken for.
fn task(run: &RunState, task: &Task, sections: &OpenRunSections) -> Option<Value> {
    let kind = match task.kind {
        TaskKind::Workflow => "workflow",
        TaskKind::Activity => "activity",
        _ => return None,
    };
    let lease = task.lease();
    Some(json!({
        "id": task.id,
        "type": kind,
        "status": task_status(task),
        "queue": task.queue,
        "attempt_count": task.fence,
        "available_at": render::time(task.available_at),
        "lease_owner": lease.map(|l| l.owner.clone()),
        "lease_expires_at": lease.map(|l| render::time(l.expires_at)),
        "created_at": render::time(task.created_at),
        "payload": if run.workflow_task.as_ref() == Some(&task.id) { bundle_sections::workflow_task_payload(sections) } else { json!({}) },
    }))
}

/// An open activity execution in DW's `activities` shape: its attempt is `running` while a
/// worker holds its task.
fn activity(run: &RunState, execution: &ActivityExecution) -> Value {
    let task = run.tasks.get(&execution.task_id);
    let running = task.is_some_and(|t| !t.is_ready());
    let attempt = match task.map(|t| &t.detail) {
        Some(TaskDetail::Activity { attempt_id, .. }) => attempt_id.clone(),
        _ => None,
    };
    json!({
        "id": execution.id,
        "sequence": execution.step,
        "activity_type": execution.activity_type,
        "status": if running { "running" } else { "pending" },
        "queue": execution.queue,
        "attempt_count": execution.attempt_count,
        "arguments": render::envelope(&execution.arguments),
        "retry_policy": execution.retry_policy.to_json(),
        "current_attempt_id": attempt,
        "attempts": attempt.iter().map(|id| json!({"id": id, "status": if running { "running" } else { "pending" }})).collect::<Vec<_>>(),
    })
}

/// A pending timer in DW's `timers` shape.
fn timer(timer: &TimerState) -> Value {
    json!({
        "id": timer.id,
        "sequence": timer.step,
        "status": "pending",
        "delay_seconds": timer.delay_seconds,
        "fire_at": render::time(timer.fire_at),
        "timer_kind": match timer.purpose {
            TimerPurpose::User => "timer",
            TimerPurpose::ConditionTimeout(_) => "condition_timeout",
            TimerPurpose::SignalTimeout(_) => "signal_timeout",
        },
    })
}
