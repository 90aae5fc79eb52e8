//! Commands that end the run: complete, fail, continue as new.

use crate::transitions::close::{close_run, relink};
use crate::transitions::commands::At;
use crate::transitions::{continued_run, events, retry_failed_child, NextRun};
use crate::{ClosedReason, Cx, EventType, Payload, RunState, RunStatus, StepTags, WorkflowFailure};

/// `WorkflowCompleted` with the workflow's result.
pub(super) fn complete_workflow(run: &mut RunState, cx: &mut Cx, at: At, result: Payload) {
    let wt = at.task;
    let payload = events::workflow_completed(&result);
    run.output = Some(result);
    close_run(run, cx, RunStatus::Completed, ClosedReason::Completed);
    run.append(cx, EventType::WorkflowCompleted, payload, wt, None);
}

/// `WorkflowFailed`; a child with a retry policy may be retried as its instance's next run.
pub(super) fn fail_workflow(run: &mut RunState, cx: &mut Cx, at: At, failure: WorkflowFailure) {
    let wt = at.task;
    let failure_id: String = cx.ids.next_id();
    let payload = events::workflow_failed(run, &failure_id, &failure);
    run.failure = Some(failure);
    close_run(run, cx, RunStatus::Failed, ClosedReason::Failed);
    run.append(cx, EventType::WorkflowFailed, payload, wt, None);
    retry_failed_child(run, cx);
}

/// Closes this run and builds the next run of the instance, whose chain continues this one.
pub(super) fn continue_as_new(run: &mut RunState, cx: &mut Cx, at: At, next_run: NextRun, tags: StepTags) {
    let At { step, task: wt } = at;
    // An operator's hold is on the instance's work: the next run starts held too.
    let held = run.paused.clone();
    close_run(run, cx, RunStatus::Completed, ClosedReason::Continued);
    // The successor is built with its own effects; its events belong to its own run.
    let (successor, successor_effects) = {
        let mut next = Cx::new(cx.now, &mut *cx.ids, cx.limits);
        next.memo = cx.memo;
        let successor = continued_run(&mut next, run, next_run);
        (successor, next.effects)
    };
    let payload = events::workflow_continued_as_new(step, &successor, &tags);
    run.append(cx, EventType::WorkflowContinuedAsNew, payload, wt, None);
    // Link the chains: the successor's first event follows this run's last.
    let mut successor = successor;
    successor.paused = held;
    let mut successor_effects = successor_effects;
    relink(&mut successor, &mut successor_effects, &run.last_hash);
    cx.effects.successor = Some(Box::new((successor, successor_effects)));
}
