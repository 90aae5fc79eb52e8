//! Child workflows from the parent's side: resolution, and the retry of a failed child run.

use crate::transitions::close::relink;
use crate::transitions::{begin_run, blank_run, events};
use crate::{ChildOutcome, ChildRetry, ClosedReason, Cx, EventType, ParentLink, Refusal, RunState, RunStatus, StartRun};

/// A failed (or timed-out) child run whose parent gave a retry policy with attempts left, and
/// whose failure is retryable, is followed by the instance's next run in the same transaction:
/// same type, queue and input, the execution deadline carried, its first workflow task held back
/// by the policy's backoff. The parent's call stays open; it hears of the retry, not the failure.
pub(super) fn retry_failed_child(run: &mut RunState, cx: &mut Cx) {
    let Some(parent) = run.parent.clone() else {
        return;
    };
    let Some(policy) = parent.retry_policy.clone() else {
        return;
    };
    if run.status != RunStatus::Failed || parent.attempt >= policy.max_attempts.unwrap_or(1) {
        return;
    }
    let failure = run.failure.clone().unwrap_or_default();
    let listed = |name: &Option<String>| name.as_ref().is_some_and(|n| policy.non_retryable_error_types.contains(n));
    if failure.non_retryable || listed(&failure.exception_type) || listed(&failure.exception_class) {
        return;
    }
    let index = (parent.attempt as usize - 1).min(policy.backoff_seconds.len().saturating_sub(1));
    let backoff_seconds = policy.backoff_seconds.get(index).copied().unwrap_or(0).max(0);
    let (mut next, mut next_effects) = {
        let mut next_cx = Cx::new(cx.now, &mut *cx.ids, cx.limits);
        let start = StartRun {
            scheduling: run.scheduling.clone(),
            namespace: run.namespace.clone(),
            workflow_id: run.workflow_id.clone(),
            run_id: next_cx.id(),
            workflow_type: run.workflow_type.clone(),
            task_queue: run.task_queue.clone(),
            input: run.input.clone(),
            execution_timeout_seconds: run.execution_timeout_seconds,
            run_timeout_seconds: run.run_timeout_seconds,
            business_key: run.business_key.clone(),
            memo: run.memo.clone(),
            search_attributes: run.search_attributes.clone(),
            command_id: next_cx.id(),
            contract: run.contract.clone(),
            compatibility: run.compatibility.clone(),
            origin_trace: run.origin_trace.clone(),
            principal: cx.principal.clone(),
        };
        super::start::acting_for(&mut next_cx, &start);
        let mut next = blank_run(&next_cx, start, run.run_number + 1, run.execution_deadline_at);
        next.parent = Some(ParentLink {
            attempt: parent.attempt + 1,
            ..parent.clone()
        });
        next.retry_of_run_id = Some(run.run_id.clone());
        next.ledger_head = run.ledger_head.clone();
        next.memo_merged = run.memo_merged.clone();
        let mut next = begin_run(next, &mut next_cx);
        if let Some(task) = next.workflow_task.clone() {
            next.task_mut(&mut next_cx, &task).expect("just created").available_at = cx.now + backoff_seconds * 1000;
        }
        (next, next_cx.effects)
    };
    relink(&mut next, &mut next_effects, &run.last_hash);
    if let Some(notice) = cx.effects.parent_notice.as_mut() {
        notice.retry = Some(ChildRetry {
            run_id: next.run_id.clone(),
            run_number: next.run_number,
            attempt: parent.attempt + 1,
            backoff_seconds,
        });
    }
    cx.effects.successor = Some(Box::new((next, next_effects)));
}

/// A child instance ended: record its resolution on the parent step that started it and wake
/// the parent. A parent that closed meanwhile, or never heard of the child, takes no note.
pub fn resolve_child(run: &mut RunState, cx: &mut Cx, outcome: &ChildOutcome) -> Result<bool, Refusal> {
    if run.is_closed() {
        return Ok(false);
    }
    if let Some(retry) = &outcome.retry {
        // The call stays open on the child's next run; the parent is not woken.
        let Some(link) = run.children.get_mut(&outcome.parent.sequence) else {
            return Ok(false);
        };
        link.run_id = retry.run_id.clone();
        let link = link.clone();
        let payload = events::child_run_started(events::ChildStarted::Retry {
            outcome,
            retry,
            link: &link,
        });
        run.append(cx, EventType::ChildRunStarted, payload, None, None);
        return Ok(true);
    }
    let Some(link) = run.children.remove(&outcome.parent.sequence) else {
        return Ok(false);
    };
    let (event_type, payload) = match outcome.closed_reason {
        Some(ClosedReason::Completed) => (EventType::ChildRunCompleted, events::child_run_completed(outcome, &link)),
        Some(ClosedReason::Cancelled) => (EventType::ChildRunCancelled, events::child_run_cancelled(outcome, &link)),
        Some(ClosedReason::Terminated) => (EventType::ChildRunTerminated, events::child_run_terminated(outcome, &link)),
        // Failed, and timed out.
        _ => (EventType::ChildRunFailed, events::child_run_failed(outcome, &link)),
    };
    run.append(cx, event_type, payload, None, None);
    run.want_workflow_task(cx, None);
    Ok(true)
}
