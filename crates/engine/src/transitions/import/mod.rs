//! An imported run (see `crate::import`): a closed run rebuilt from a bundle's history, an open
//! one from the state its Capstan source kept, or an open one from DW's embedded runtime rebuilt
//! from its history (`rebuild`); an open run then goes on here.

mod rebuild;

use super::start::{blank_run, StartRun};
use crate::import::{closed_reason_of, closing_event, closing_of, eligibility, is_archived, Finding, ImportedEvent, ImportedRun, InFlight};
use crate::refusal::{Reason, Refusal};
use crate::{Cx, RunState, TaskScheduling, WorkflowFailure};
use serde_json::Value;

/// The run a bundle describes, its history copied and re-chained from the bundle's checksum.
/// Refused (`import_rejected`, with the rules broken) when the bundle is not importable.
pub fn import_run(cx: &mut Cx, imported: ImportedRun, in_flight: &InFlight) -> Result<RunState, Refusal> {
    let findings = eligibility(&imported, in_flight, cx.limits.history_events_max as usize);
    if !findings.is_empty() {
        return Err(rejected(&findings));
    }
    if imported.status.is_terminal() {
        Ok(closed_run(cx, imported))
    } else if imported.carried_state.is_some() {
        Ok(open_run(cx, imported))
    } else {
        rebuilt_run(cx, imported)
    }
}

/// `import_rejected`, naming the first rule broken and listing them all.
fn rejected(findings: &[Finding]) -> Refusal {
    let first = &findings[0];
    Refusal::new(Reason::ImportRejected, first.message.clone())
        .with("rule", first.rule.clone())
        .with("errors", serde_json::to_value(findings).unwrap_or(Value::Null))
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
    let mut run = base_run(cx, &imported);
    let last = closing_event(&imported.events).expect("an eligible history is not empty");
    let (status, closing) = closing_of(last.event_type).expect("an eligible closed history ends with its closing event");
    run.status = status;
    run.closed_reason = Some(closed_reason_of(imported.closed_reason, closing));
    run.closed_at = Some(last.recorded_at);
    run.output = imported.output;
    run.failure = recorded_failure(&last.payload, last.event_type);
    run.archived = is_archived(&imported.events);
    run.updates = rebuild::updates_of(&imported.events);
    super::close::fail_unapplied_updates(&mut run.updates, last.recorded_at);
    copy_history(&mut run, cx, imported.events);
    run
}

/// An open run whose bundle carries no Capstan state (DW's embedded runtime): rebuilt from its
/// history and sections (`rebuild`), then its history copied.
fn rebuilt_run(cx: &mut Cx, imported: ImportedRun) -> Result<RunState, Refusal> {
    let mut run = base_run(cx, &imported);
    run.status = imported.status;
    if let Err(findings) = rebuild::rebuild(&mut run, cx, &imported.events, &imported.sections) {
        return Err(rejected(&findings));
    }
    let last_progress_at = imported.events.last().map_or(run.started_at, |e| e.recorded_at);
    copy_history(&mut run, cx, imported.events);
    run.last_progress_at = last_progress_at;
    Ok(run)
}

/// The run a bundle names, before anything happened in it: its identity, input, memo and
/// attributes, stamped with where it came from, its chain starting from the bundle's checksum.
fn base_run(cx: &mut Cx, imported: &ImportedRun) -> RunState {
    let first = imported.events.first().expect("an eligible history is not empty");
    let start = StartRun {
        namespace: imported.namespace.clone(),
        workflow_id: imported.workflow_id.clone(),
        run_id: imported.run_id.clone(),
        workflow_type: imported.workflow_type.clone(),
        task_queue: imported.task_queue.clone(),
        input: imported.input.clone(),
        execution_timeout_seconds: None,
        run_timeout_seconds: None,
        business_key: imported.business_key.clone(),
        memo: imported.memo.clone(),
        search_attributes: imported.search_attributes.clone(),
        command_id: first.workflow_command_id.clone().unwrap_or_else(|| cx.id()),
        contract: None,
        compatibility: imported.compatibility.clone(),
        origin_trace: None,
        principal: None,
        scheduling: TaskScheduling::default(),
    };
    let mut run = blank_run(cx, start, imported.run_number, None);
    run.started_at = imported.started_at.unwrap_or(first.recorded_at);
    run.continued_from_run_id = imported.continued_from_run_id.clone();
    run.chain_origin = imported.stamp.bundle_checksum.clone();
    run.import = Some(imported.stamp.clone());
    run
}

fn copy_history(run: &mut RunState, cx: &mut Cx, events: Vec<ImportedEvent>) {
    for event in events {
        run.append_copied(cx, event);
    }
}

/// The failure a run's closing event recorded (a failed or timed-out run's describe shows it).
fn recorded_failure(payload: &serde_json::Map<String, Value>, event_type: crate::EventType) -> Option<WorkflowFailure> {
    use crate::EventType::{WorkflowFailed, WorkflowTimedOut};
    if !matches!(event_type, WorkflowFailed | WorkflowTimedOut) {
        return None;
    }
    Some(rebuild::failure_of(payload))
}
