//! Closing a run: everything open ends with it.

use crate::transitions::{events, mark_outcome_unknown, probe_answer, LinkedRunClosed};
use crate::{
    ActivityExecution, ChildOutcome, CloseCommand, ClosedReason, Cx, Effects, EventType, LedgerState, Millis, RunState, RunStatus,
    TaskClosure, TaskId, UpdateRecord, UpdateStatus, WorkflowFailure,
};
use serde_json::json;
use std::collections::BTreeMap;

/// Closes a run: every open task, timer, wait and activity of it ends with it.
pub(super) fn close_run(run: &mut RunState, cx: &mut Cx, status: RunStatus, reason: ClosedReason) {
    // Accepted signals are facts of this run even if no task will see them: before the close.
    run.record_deferred_signals(cx);
    // No attempt of a prepared local activity runs on, nor is retried, once the run has closed.
    run.prepared_locals.clear();
    // A closed run is held by nothing; the store moves it out of the open (or paused) count.
    cx.effects.reclassed_from = Some(crate::RunClass::of(run));
    run.paused = None;
    run.status = status;
    run.closed_reason = Some(reason);
    run.closed_at = Some(cx.now);
    if reason != ClosedReason::Continued {
        // A child's end reaches its parent in the same transaction (the store applies it).
        if let Some(parent) = run.parent.clone() {
            cx.effects.parent_notice = Some(ChildOutcome {
                parent,
                child_workflow_id: run.workflow_id.clone(),
                child_run_id: run.run_id.clone(),
                status,
                closed_reason: Some(reason),
                output: run.output.clone(),
                failure: run.failure.clone(),
                closed_at: cx.now,
                retry: None,
            });
        }
    }
    // A probe's host run answers with its end, to the action's instance, in this transaction.
    if let Some(target) = run.probe_of.clone() {
        cx.effects.probe_answer = Some(probe_answer(run, cx, target));
    }
    // The service calls this run was started for settle with its end (not a continue-as-new:
    // the next run carries them).
    if reason != ClosedReason::Continued && !run.service_call_ids.is_empty() {
        cx.effects.service_run_closed = Some(LinkedRunClosed {
            service_call_ids: run.service_call_ids.clone(),
            workflow_id: run.workflow_id.clone(),
            run_id: run.run_id.clone(),
            status,
            closed_reason: Some(reason),
            output: run.output.clone(),
            failure: run.failure.clone(),
            closed_at: cx.now,
        });
    }
    run.service_waits.clear();
    // Parent-close policy: open children end with the parent unless abandoned. (A continued run
    // keeps them: they belong to the instance, not the run.)
    if reason != ClosedReason::Continued {
        for child in std::mem::take(&mut run.children).into_values() {
            let command = match child.parent_close_policy.as_str() {
                "terminate" => CloseCommand::Terminate,
                "request_cancel" | "request_cancellation" => CloseCommand::Cancel,
                _ => continue,
            };
            // Before the parent's terminal event (the child's close commits in the same transaction).
            let payload = events::parent_close_policy_applied(&child, reason);
            run.append(cx, EventType::ParentClosePolicyApplied, payload, None, None);
            cx.effects.close_children.push((child.workflow_id, command));
        }
    }
    let current = run.workflow_task.clone();
    // A declared action in flight when the run closes may have acted: its outcome is unknown.
    let dispatched: Vec<ActivityExecution> = run.activities.values().filter(|a| a.ledger_key.is_some()).cloned().collect();
    for execution in dispatched {
        let key = execution.ledger_key.as_deref().unwrap_or_default();
        if let Some(entry) = run.ledger.get(key).filter(|e| e.state == LedgerState::Dispatched).cloned() {
            let reason = json!({"kind": "run_closed", "closed_reason": reason.as_str()});
            mark_outcome_unknown(run, cx, entry, &execution, reason);
        }
    }
    let open: Vec<TaskId> = run.tasks.keys().filter(|id| Some(*id) != current.as_ref()).cloned().collect();
    for id in open {
        run.close_task(cx, &id, TaskClosure::Cancelled);
    }
    if let Some(standalone) = run.standalone.as_mut().filter(|s| s.outcome.is_none()) {
        // Closed from outside (cancel, terminate) while its activity was open.
        if let Some(execution) = run.activities.get(&standalone.execution_id) {
            standalone.attempt_count = execution.attempt_count;
        }
        standalone.outcome = Some("cancelled".into());
    }
    run.activities.clear();
    run.timers.clear();
    run.condition_waits.clear();
    run.signal_waits.clear();
    run.pending_resumes.clear();
    run.pending_updates.clear();
    fail_unapplied_updates(&mut run.updates, cx.now);
    run.workflow_task_wanted = false;
}

/// Updates accepted and never applied fail when their run closes (at `closed_at`): no event
/// records it, so an imported closed run's updates end the same way.
pub(super) fn fail_unapplied_updates(updates: &mut BTreeMap<String, UpdateRecord>, closed_at: Millis) {
    for update in updates.values_mut().filter(|u| u.status == UpdateStatus::Accepted) {
        update.status = UpdateStatus::Failed;
        update.closed_at = Some(closed_at);
        update.failure = Some(WorkflowFailure {
            message: "The workflow run closed before the update was applied.".into(),
            ..Default::default()
        });
    }
}

/// Closes the run's in-flight workflow task too: used by closes that do not come from a
/// workflow task (cancel, terminate, time-out).
pub(super) fn close_run_from_outside(run: &mut RunState, cx: &mut Cx, status: RunStatus, reason: ClosedReason) {
    close_run(run, cx, status, reason);
    if let Some(id) = run.workflow_task.clone() {
        run.close_task(cx, &id, TaskClosure::Cancelled);
    }
}

/// Re-hashes a successor's events so its chain starts at `origin` (the predecessor's final hash,
/// known only after the predecessor's terminal event was appended).
pub(super) fn relink(run: &mut RunState, effects: &mut Effects, origin: &str) {
    run.chain_origin = origin.to_string();
    let mut prev = origin.to_string();
    for event in &mut effects.events {
        event.prev_hash = prev;
        event.hash = crate::history::chain_hash(&event.prev_hash, &event.canonical_json());
        prev = event.hash.clone();
    }
    run.last_hash = prev;
}
