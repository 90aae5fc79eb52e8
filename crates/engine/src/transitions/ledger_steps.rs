//! The recovery ledger as the transitions drive it: dispatch entries, unknown outcomes, operator
//! resolutions, late reports, integrity blocks. (The ledger model itself is `crate::ledger`.)

use crate::transitions::{activity_resolved, events, iso8601, mark_outcome_unknown, AttemptRef, NextAttempt, Resolution, ResultClass};
use crate::{
    ActionPin, ActivityAttemptId, ActivityExecution, Cx, EventType, LedgerCheckpoint, LedgerEntry, LedgerState, Millis, Payload, Reason,
    Receipt, RecoveryMode, Refusal, RunState, Task, TaskClosure, TaskDetail, TaskId,
};
use serde_json::{json, Map, Value};

/// The ledger entry of a dispatch: hashes and ids only.
pub(super) fn open_ledger_entry(run: &mut RunState, cx: &mut Cx, task: &Task, execution: &ActivityExecution, pin: &ActionPin, owner: &str) {
    let TaskDetail::Activity {
        attempt_id: Some(attempt_id),
        attempt_number,
        ..
    } = &task.detail
    else {
        return;
    };
    let ledger_key: String = cx.ids.next_id();
    let entry = LedgerEntry {
        ledger_key: ledger_key.clone(),
        namespace: run.namespace.clone(),
        workflow_id: run.workflow_id.clone(),
        run_id: run.run_id.clone(),
        activity_type: execution.activity_type.clone(),
        activity_execution_id: execution.id.clone(),
        activity_attempt_id: attempt_id.clone(),
        attempt_number: *attempt_number,
        fence: task.fence,
        state: LedgerState::Dispatched,
        recovery_mode: pin.recovery_mode,
        definition_hash: pin.definition_hash.clone(),
        definition_version: pin.version,
        input_hash: crate::ledger::digest(execution.arguments.identity()),
        access_context_hash: crate::ledger::digest(&format!("{}\n{}\n{}", run.namespace, owner, execution.queue)),
        idempotency_key_hash: crate::ledger::digest(execution.provider_key()),
        preview_hash: pin.preview_hash.clone(),
        dispatched_at: cx.now,
        updated_at: cx.now,
        unknown_reason: None,
        resolution: None,
        checkpoint_hash: String::new(),
        late_reports: Vec::new(),
        probe: None,
    };
    run.activities.get_mut(&execution.id).expect("open").ledger_key = Some(ledger_key);
    let mut details = obj!(
        "activity_execution_id" => entry.activity_execution_id,
        "activity_attempt_id" => entry.activity_attempt_id,
        "fence" => entry.fence,
        "definition_hash" => entry.definition_hash,
        "input_hash" => entry.input_hash,
        "access_context_hash" => entry.access_context_hash,
        "idempotency_key_hash" => entry.idempotency_key_hash,
    );
    if let Some(preview_hash) = &entry.preview_hash {
        details.insert("preview_hash".into(), json!(preview_hash));
    }
    checkpoint(run, cx, entry, details);
}

/// Records a ledger entry's new state as the next checkpoint of the instance chain. The run
/// keeps only entries still open (dispatched, outcome unknown); settled ones live in the store,
/// so a run with many declared actions does not carry them all in its document.
pub(super) fn checkpoint(run: &mut RunState, cx: &mut Cx, mut entry: LedgerEntry, details: Map<String, Value>) -> LedgerEntry {
    let mut checkpoint = LedgerCheckpoint {
        namespace: run.namespace.clone(),
        workflow_id: run.workflow_id.clone(),
        ledger_key: entry.ledger_key.clone(),
        state: entry.state,
        recorded_at: cx.now,
        details,
        prev_hash: run.ledger_head.clone(),
        hash: String::new(),
    };
    checkpoint.hash = checkpoint.computed_hash();
    run.ledger_head = checkpoint.hash.clone();
    entry.checkpoint_hash = checkpoint.hash.clone();
    entry.updated_at = cx.now;
    cx.effects.checkpoints.push(checkpoint);
    cx.effects.ledger.push(entry.clone());
    if matches!(entry.state, LedgerState::Dispatched | LedgerState::OutcomeUnknown) {
        run.ledger.insert(entry.ledger_key.clone(), entry.clone());
    } else {
        run.ledger.remove(&entry.ledger_key);
    }
    entry
}

/// The dispatch of a declared action ended without a conclusive result: its outcome is
/// unknown. No retry, no history event: the execution waits, blocked, for an operator.
pub(super) fn ledger_outcome_unknown(
    run: &mut RunState,
    cx: &mut Cx,
    task: &Task,
    execution: &ActivityExecution,
    reason: Value,
) -> Option<Receipt> {
    let key = execution.ledger_key.clone()?;
    let entry = run.ledger.get(&key).filter(|e| e.state == LedgerState::Dispatched)?.clone();
    run.close_task(cx, &task.id, TaskClosure::Failed);
    let stored = run.activities.get_mut(&execution.id).expect("open execution");
    stored.ledger_key = None;
    stored.blocked_by = Some(key.clone());
    mark_outcome_unknown(run, cx, entry, execution, reason);
    Some(Receipt {
        run_status: run.status,
        created_task_ids: vec![],
        next_task_id: None,
        retained: false,
    })
}

/// How a ledgered attempt's result is to be taken (`None`: not a ledgered dispatch, or
/// nothing to check). A result that must be read but cannot be decoded is in doubt.
pub(super) fn classify_ledgered_result(cx: &Cx, execution: &ActivityExecution, result: &Payload) -> Option<ResultClass> {
    execution.ledger_key.as_ref()?;
    let pin = execution.action.as_ref()?;
    if pin.verification.is_none() && pin.pending.is_none() && pin.recovery_mode != RecoveryMode::LinkedRun {
        return None;
    }
    let decoded = match cx.memo.map(|codec| codec.to_json(result)) {
        Some(Ok(decoded)) => decoded,
        Some(Err(error)) => {
            return Some(ResultClass::Unknown(
                json!({"kind": "invalid_result", "problems": [format!("the result could not be decoded: {error}")]}),
            ))
        }
        None => {
            return Some(ResultClass::Unknown(
                json!({"kind": "invalid_result", "problems": ["the result could not be decoded here"]}),
            ))
        }
    };
    Some(crate::ledger::classify_result(pin, &decoded))
}

/// A pending provider result: the entry becomes a visible `pending` handoff and the next poll
/// is a new attempt after the interval (its dispatch opens a new entry, same idempotency key).
pub(super) fn ledger_poll_again(
    run: &mut RunState,
    cx: &mut Cx,
    task: &Task,
    execution: &ActivityExecution,
    interval_seconds: i64,
    result: &Payload,
) -> Receipt {
    if let Some(mut entry) = execution.ledger_key.as_ref().and_then(|key| run.ledger.get(key)).cloned() {
        entry.state = LedgerState::Pending;
        checkpoint(
            run,
            cx,
            entry,
            obj!("result_hash" => crate::ledger::digest(result.identity()), "poll_after_seconds" => interval_seconds),
        );
    }
    run.close_task(cx, &task.id, TaskClosure::Completed);
    let poll_at = cx.now + interval_seconds * 1000;
    let poll_task = super::next_attempt_task(run, cx, execution, poll_at);
    let stored = run.activities.get_mut(&execution.id).expect("open execution");
    stored.task_id = poll_task.clone();
    stored.ledger_key = None;
    let attempt_id = match &task.detail {
        TaskDetail::Activity { attempt_id, .. } => attempt_id.clone(),
        _ => None,
    };
    let payload = events::activity_retry_scheduled(events::Retry::LedgerPending {
        attempt: AttemptRef {
            execution,
            attempt_id: attempt_id.as_ref(),
            number: execution.attempt_count,
        },
        next: NextAttempt {
            task_id: &poll_task,
            available_at: poll_at,
            backoff_seconds: interval_seconds,
        },
    });
    run.append(cx, EventType::ActivityRetryScheduled, payload, None, None);
    Receipt {
        run_status: run.status,
        created_task_ids: vec![poll_task],
        next_task_id: None,
        retained: false,
    }
}

pub(super) fn integrity_refusal(run: &RunState) -> Result<(), Refusal> {
    match &run.integrity_incident {
        Some(incident) => Err(Refusal::new(
            Reason::IntegrityIncidentOpen,
            "The run's ledger chain failed verification: it is blocked until an operator closes the integrity incident.",
        )
        .with("incident_id", incident.clone())),
        None => Ok(()),
    }
}

/// The ledger chain the run extends failed verification: stop the run (its tasks are no longer
/// offered) until an operator has investigated.
pub fn block_for_integrity(run: &mut RunState, cx: &mut Cx, incident_id: &str) {
    run.integrity_incident = Some(incident_id.to_string());
    let ids: Vec<TaskId> = run.tasks.keys().cloned().collect();
    for id in ids {
        run.task_mut(cx, &id);
    }
}

/// The operator closed the incident (after the chain verified again): the run's tasks are
/// offered again.
pub fn clear_integrity_block(run: &mut RunState, cx: &mut Cx) {
    run.integrity_incident = None;
    let ids: Vec<TaskId> = run.tasks.keys().cloned().collect();
    for id in ids {
        run.task_mut(cx, &id);
    }
}

/// An operator's decision on an entry whose outcome was unknown.
#[derive(Clone, Debug, PartialEq)]
pub enum LedgerDecision {
    /// The effect happened: the activity completes with `result` (an Avro null without one),
    /// and the provider is not invoked again.
    EffectConfirmed { result: Payload },
    /// It did not: one deliberate new attempt, under a new ledger entry with the same
    /// idempotency key (the worker sees the same `activity_execution_id`).
    EffectAbsent,
}

/// Who settled an unknown outcome, as a confirmed completion's `resolved_by` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resolver {
    Operator,
    Probe,
}

/// Records an operator's resolution of an `outcome_unknown` entry with its evidence and
/// principal. On an open run the blocked step continues (completed, or retried once); on a
/// closed run only the evidence is recorded.
pub fn resolve_ledger_entry(
    run: &mut RunState,
    cx: &mut Cx,
    ledger_key: &str,
    decision: LedgerDecision,
    evidence: Value,
    principal: &str,
) -> Result<LedgerEntry, Refusal> {
    resolve_entry_as(run, cx, ledger_key, decision, evidence, principal, Resolver::Operator)
}

/// [`resolve_ledger_entry`], by `resolver`.
pub(crate) fn resolve_entry_as(
    run: &mut RunState,
    cx: &mut Cx,
    ledger_key: &str,
    decision: LedgerDecision,
    evidence: Value,
    principal: &str,
    resolver: Resolver,
) -> Result<LedgerEntry, Refusal> {
    integrity_refusal(run)?;
    let Some(entry) = run.ledger.get(ledger_key).cloned() else {
        return Err(Refusal::new(Reason::LedgerEntryNotFound, "No such ledger entry on this run.").with("ledger_key", ledger_key));
    };
    let (entry, decision_name) = settle(entry, &decision, evidence, principal, cx.now)?;
    let execution = run
        .activities
        .values()
        .find(|a| a.blocked_by.as_deref() == Some(ledger_key))
        .cloned()
        .filter(|_| !run.is_closed());
    let resolved = checkpoint_resolution(run, cx, entry.clone(), decision_name, principal);
    let Some(execution) = execution else {
        return Ok(resolved);
    };
    let attempt = AttemptRef {
        execution: &execution,
        attempt_id: Some(&entry.activity_attempt_id),
        number: execution.attempt_count,
    };
    match decision {
        LedgerDecision::EffectConfirmed { result } => {
            let payload = events::activity_completed(events::Completed::Confirmed {
                attempt,
                ledger_key,
                result: &result,
                resolver,
            });
            run.append(cx, EventType::ActivityCompleted, payload, None, None);
            run.activities.remove(&execution.id);
            activity_resolved(run, cx, &execution, Resolution::Completed(&result));
        }
        LedgerDecision::EffectAbsent => {
            let now = cx.now;
            let retry_task = super::next_attempt_task(run, cx, &execution, now);
            let stored = run.activities.get_mut(&execution.id).expect("open execution");
            stored.task_id = retry_task.clone();
            stored.blocked_by = None;
            let payload = events::activity_retry_scheduled(events::Retry::LedgerEffectAbsent {
                attempt,
                ledger_key,
                next: NextAttempt {
                    task_id: &retry_task,
                    available_at: cx.now,
                    backoff_seconds: 0,
                },
            });
            run.append(cx, EventType::ActivityRetryScheduled, payload, None, None);
        }
    }
    Ok(resolved)
}

/// The entry with the operator's decision recorded; refused unless its outcome is unknown.
fn settle(
    mut entry: LedgerEntry,
    decision: &LedgerDecision,
    evidence: Value,
    principal: &str,
    now: Millis,
) -> Result<(LedgerEntry, &'static str), Refusal> {
    if entry.state != LedgerState::OutcomeUnknown {
        return Err(Refusal::new(
            Reason::LedgerEntryNotUnknown,
            "Only an entry whose outcome is unknown can be resolved.",
        )
        .with("ledger_key", entry.ledger_key.as_str())
        .with("state", entry.state.as_str()));
    }
    let decision_name = match decision {
        LedgerDecision::EffectConfirmed { .. } => "effect_confirmed",
        LedgerDecision::EffectAbsent => "effect_absent",
    };
    entry.state = match decision {
        LedgerDecision::EffectConfirmed { .. } => LedgerState::EffectConfirmed,
        LedgerDecision::EffectAbsent => LedgerState::EffectAbsent,
    };
    entry.resolution = Some(json!({"decision": decision_name, "evidence": evidence, "principal": principal, "resolved_at": iso8601(now)}));
    Ok((entry, decision_name))
}

fn checkpoint_resolution(run: &mut RunState, cx: &mut Cx, entry: LedgerEntry, decision_name: &str, principal: &str) -> LedgerEntry {
    let evidence = entry
        .resolution
        .as_ref()
        .map(|r| crate::canonical::to_string(&r["evidence"]))
        .unwrap_or_default();
    let evidence_hash = crate::ledger::digest(&evidence);
    checkpoint(
        run,
        cx,
        entry,
        obj!("decision" => decision_name, "principal" => principal, "evidence_hash" => evidence_hash),
    )
}

/// Resolves an entry left `outcome_unknown` by an earlier, closed run of this instance (`run`
/// is the instance's current run). The instance's checkpoint chain is only ever extended through
/// its current run, so it stays one line; the earlier run cannot continue, so the decision is
/// recorded and nothing runs. `stored` is the entry as the store holds it.
pub fn resolve_earlier_run_entry(
    run: &mut RunState,
    cx: &mut Cx,
    stored: LedgerEntry,
    decision: LedgerDecision,
    evidence: Value,
    principal: &str,
) -> Result<LedgerEntry, Refusal> {
    integrity_refusal(run)?;
    if stored.workflow_id != run.workflow_id || stored.run_id == run.run_id {
        return Err(Refusal::new(
            Reason::LedgerEntryNotFound,
            "The entry does not belong to an earlier run of this instance.",
        )
        .with("ledger_key", stored.ledger_key.as_str()));
    }
    let (entry, decision_name) = settle(stored, &decision, evidence, principal, cx.now)?;
    Ok(checkpoint_resolution(run, cx, entry, decision_name, principal))
}

/// A report from an attempt whose dispatch is already `outcome_unknown` (it lost its lease,
/// timed out…): the workflow refused it, but it is what an operator needs to decide, so it is
/// attached to the entry. Returns whether such an entry exists.
pub fn attach_late_report(run: &mut RunState, cx: &mut Cx, attempt_id: &ActivityAttemptId, report: Value) -> Result<bool, Refusal> {
    let Some(mut entry) = run
        .ledger
        .values()
        .find(|e| &e.activity_attempt_id == attempt_id && e.state == LedgerState::OutcomeUnknown)
        .cloned()
    else {
        return Ok(false);
    };
    let mut report = report;
    report["received_at"] = json!(iso8601(cx.now));
    entry.late_reports.push(report.clone());
    checkpoint(run, cx, entry, obj!("late_report" => report));
    Ok(true)
}

/// A late report for an entry of an earlier, closed run of this instance (`run` is the current
/// run, the only one that extends the instance's chain). `stored` is the entry as last known.
pub fn attach_earlier_late_report(run: &mut RunState, cx: &mut Cx, stored: LedgerEntry, report: Value) -> Result<bool, Refusal> {
    if stored.workflow_id != run.workflow_id || stored.run_id == run.run_id || stored.state != LedgerState::OutcomeUnknown {
        return Ok(false);
    }
    let mut entry = stored;
    let mut report = report;
    report["received_at"] = json!(iso8601(cx.now));
    entry.late_reports.push(report.clone());
    checkpoint(run, cx, entry, obj!("late_report" => report));
    Ok(true)
}

/// The entry blocking this run, if any: it refuses every operation that would re-run a step.
pub fn unresolved_ledger_entry(run: &RunState) -> Option<&LedgerEntry> {
    run.ledger.values().find(|e| e.state == LedgerState::OutcomeUnknown)
}
