//! An imported run (see `crate::import`): a closed run rebuilt from a bundle's history, or an
//! open one from the state its Capstan source kept, which then goes on here.

use super::start::{blank_run, StartRun};
use crate::import::{closed_reason_of, closing_of, eligibility, ImportedRun, InFlight};
use crate::refusal::{Reason, Refusal};
use crate::{Cx, RunState, TaskScheduling, WorkflowFailure};
use serde_json::Value;

/// The run a bundle describes, its history copied and re-chained from the bundle's checksum.
/// Refused (`import_rejected`, with the rules broken) when the bundle is not importable.
pub fn import_run(cx: &mut Cx, imported: ImportedRun, in_flight: &InFlight) -> Result<RunState, Refusal> {
    let findings = eligibility(&imported, in_flight, cx.limits.history_events_max as usize);
    if let Some(first) = findings.first() {
        return Err(Refusal::new(Reason::ImportRejected, first.message.clone())
            .with("rule", first.rule.clone())
            .with("errors", serde_json::to_value(&findings).unwrap_or(Value::Null)));
    }
    if imported.status.is_terminal() {
        Ok(closed_run(cx, imported))
    } else {
        Ok(open_run(cx, imported))
    }
}

/// An open run goes on from the state its source kept (checked against the history by
/// `eligibility`): its tasks are written here as they stood, ready, under the fences they had,
/// and its history is re-linked from the bundle's checksum. A source worker's cache means
/// nothing here, so no sticky claim comes along.
fn open_run(cx: &mut Cx, imported: ImportedRun) -> RunState {
    let ImportedRun {
        namespace,
        events,
        stamp,
        carried_state,
        ..
    } = imported;
    let mut run = *carried_state.expect("an eligible open run carries its state");
    let last_progress_at = run.last_progress_at;
    run.namespace = namespace;
    run.document_version = crate::RUN_DOCUMENT_VERSION;
    run.sticky = None;
    run.chain_origin = stamp.bundle_checksum.clone();
    run.last_sequence = 0;
    run.last_hash = String::new();
    run.history_size_bytes = 0;
    run.history_fan_out = 0;
    run.import = Some(stamp);
    for event in events {
        run.append_copied(cx, event);
    }
    run.last_progress_at = last_progress_at;
    let tasks: Vec<_> = run.tasks.keys().cloned().collect();
    cx.effects.touched_tasks.extend(tasks);
    run
}

/// A closed run, its fields taken from the event that closed it.
fn closed_run(cx: &mut Cx, imported: ImportedRun) -> RunState {
    let ImportedRun {
        namespace,
        workflow_id,
        run_id,
        run_number,
        workflow_type,
        task_queue,
        closed_reason,
        input,
        output,
        business_key,
        memo,
        search_attributes,
        compatibility,
        started_at,
        continued_from_run_id,
        events,
        stamp,
        ..
    } = imported;
    let first = events.first().expect("an eligible history is not empty");
    let last = events.last().expect("an eligible history is not empty");
    let (status, closing) = closing_of(last.event_type).expect("an eligible closed history ends with its closing event");
    let reason = closed_reason_of(closed_reason, closing);
    let start = StartRun {
        namespace,
        workflow_id,
        run_id,
        workflow_type,
        task_queue,
        input,
        execution_timeout_seconds: None,
        run_timeout_seconds: None,
        business_key,
        memo,
        search_attributes,
        command_id: first.workflow_command_id.clone().unwrap_or_else(|| cx.id()),
        contract: None,
        compatibility,
        origin_trace: None,
        principal: None,
        scheduling: TaskScheduling::default(),
    };
    let mut run = blank_run(cx, start, run_number, None);
    run.started_at = started_at.unwrap_or(first.recorded_at);
    run.status = status;
    run.closed_reason = Some(reason);
    run.closed_at = Some(last.recorded_at);
    run.output = output;
    run.failure = recorded_failure(&last.payload, last.event_type);
    run.continued_from_run_id = continued_from_run_id;
    run.chain_origin = stamp.bundle_checksum.clone();
    run.import = Some(stamp);
    for event in events {
        run.append_copied(cx, event);
    }
    run
}

/// The failure a run's closing event recorded (a failed or timed-out run's describe shows it).
fn recorded_failure(payload: &serde_json::Map<String, Value>, event_type: crate::EventType) -> Option<WorkflowFailure> {
    use crate::EventType::{WorkflowFailed, WorkflowTimedOut};
    if !matches!(event_type, WorkflowFailed | WorkflowTimedOut) {
        return None;
    }
    let text = |key: &str| payload.get(key).and_then(Value::as_str).map(str::to_string);
    Some(WorkflowFailure {
        message: text("message").unwrap_or_default(),
        exception_type: text("exception_type"),
        exception_class: text("exception_class"),
        exception: payload.get("exception").filter(|v| !v.is_null()).cloned(),
        non_retryable: payload.get("non_retryable").and_then(Value::as_bool).unwrap_or(false),
        boundary: None,
    })
}
