//! Prepared local activities (see `crate::local_activity`): admission (`prepare`, `recover`,
//! `checkpoint`), supervision (`control`, `heartbeat`) and outcomes. Every operation names the
//! workflow task claim it runs under (task, owner, `workflow_task_attempt`) and is refused on any
//! other; an attempt is bound to the claim that prepared it.

use crate::transitions::commands::ensure_history_room;
use crate::transitions::commands::take_step_of;
use crate::transitions::{events, integrity_refusal, iso8601, min_opt};
use crate::{check_workflow_lease, EventType, Millis, Payload, Reason, Refusal};
use crate::{
    ActivityAttemptId, ActivityExecutionId, CleanupView, Cx, EventId, LocalDescriptor, LocalReceipt, LocalReceiptKey, LocalRecord,
    PreparedAttempt, PreparedLocal, RunState, StepKind, TaskId,
};
use events::{PreparedFailure, PreparedRetry, Provenance};

mod admission;
mod checkpoint;
mod supervision;

pub use admission::*;
pub use checkpoint::*;
pub(super) use supervision::stop_prepared_attempt;
pub use supervision::*;

/// The workflow task claim a prepared operation comes on.
#[derive(Clone, Copy, Debug)]
pub struct LocalClaim<'a> {
    pub task_id: &'a TaskId,
    pub owner: &'a str,
    pub attempt: u64,
}

/// Checks the claim is live and the run may still make progress; answers the lease's expiry.
fn check_claim(run: &RunState, now: Millis, claim: LocalClaim) -> Result<Millis, Refusal> {
    integrity_refusal(run)?;
    let task = check_workflow_lease(run, now, claim.task_id, claim.owner, claim.attempt)?;
    if let Some(deadline) = min_opt(run.execution_deadline_at, run.run_deadline_at).filter(|d| *d <= now) {
        return Err(Refusal::new(Reason::RunTimedOut, "The workflow run is past its deadline.")
            .with("task_id", claim.task_id.as_str())
            .with("deadline_at", iso8601(deadline)));
    }
    Ok(task.lease().expect("checked").expires_at)
}

/// The step whose running attempt is `attempt_id`, if it runs under `claim`.
fn running_step(run: &RunState, claim: LocalClaim, attempt_id: &ActivityAttemptId) -> Result<u32, Refusal> {
    let found = run
        .prepared_locals
        .values()
        .find(|l| l.attempt.as_ref().is_some_and(|a| &a.attempt_id == attempt_id));
    match found {
        Some(local) => {
            let attempt = local.attempt.as_ref().expect("found by it");
            if &attempt.task_id == claim.task_id && attempt.task_attempt == claim.attempt && attempt.lease_owner == claim.owner {
                Ok(local.step)
            } else {
                Err(stale_attempt(attempt_id).with("workflow_task_id", attempt.task_id.as_str()))
            }
        }
        None => Err(stale_attempt(attempt_id)),
    }
}

fn stale_attempt(attempt_id: &ActivityAttemptId) -> Refusal {
    Refusal::new(
        Reason::StaleActivityAttempt,
        "The attempt is not running under this workflow task claim.",
    )
    .with("activity_attempt_id", attempt_id.as_str())
}

/// The cleanup authority of a cleanup call: it must name the run's delivered cancellation.
fn cleanup_view(run: &RunState, descriptor: &LocalDescriptor) -> Result<Option<CleanupView>, Refusal> {
    let Some(cleanup) = &descriptor.cleanup else {
        return Ok(None);
    };
    let delivered = run.cancellation.as_ref().and_then(|r| {
        let delivery = r.delivery.as_ref()?;
        Some((r, delivery.delivery_event_id.as_ref()?))
    });
    match delivered {
        Some((request, event_id))
            if request.request_id.as_str() == cleanup.request_id && event_id.as_str() == cleanup.delivery_history_event_id =>
        {
            Ok(Some(CleanupView {
                request_id: cleanup.request_id.clone(),
                delivery_history_event_id: cleanup.delivery_history_event_id.clone(),
                cleanup_deadline_at: request.cleanup_deadline_at,
            }))
        }
        _ => Err(Refusal::new(
            Reason::LocalActivityCleanupAuthorityMismatch,
            "cancellation_cleanup does not name the run's delivered cancellation.",
        )),
    }
}

/// Records a new prepared call at the run's next step (`ActivityScheduled`, no attempt yet),
/// from a `prepare` or as a member of the group `checkpoint-group` admits. The step is taken
/// as a command's is (its parallel-group tags must name it); answers it and the call's id.
fn schedule_call(
    run: &mut RunState,
    cx: &mut Cx,
    claim: LocalClaim,
    descriptor: LocalDescriptor,
    group_checkpoint: Option<&str>,
) -> Result<(u32, ActivityExecutionId), Refusal> {
    // Scheduled and started: the two events a call opens with.
    ensure_history_room(run, cx, 2)?;
    let kind = StepKind::Activity(descriptor.activity_type.clone());
    let Some(step) = take_step_of(run, kind, &descriptor.tags)? else {
        return Err(Refusal::new(
            Reason::LocalActivityPreparationMismatch,
            "Another call is recorded at this sequence.",
        ));
    };
    let local = PreparedLocal {
        execution_id: cx.id(),
        step,
        descriptor,
        scheduled_at: cx.now,
        attempt_count: 0,
        attempt: None,
        retry_due_at: None,
    };
    let payload = match group_checkpoint {
        Some(checkpoint_id) => events::prepared_group_scheduled(&local, claim.task_id, claim.attempt, checkpoint_id),
        None => events::prepared_scheduled(&local, claim.task_id, claim.attempt),
    };
    run.append(cx, EventType::ActivityScheduled, payload, Some(claim.task_id), None);
    let execution_id = local.execution_id.clone();
    run.prepared_locals.insert(step, local);
    Ok((step, execution_id))
}

fn cleanup_deadline(cleanup: &Option<CleanupView>) -> Option<Millis> {
    cleanup.as_ref().map(|c| c.cleanup_deadline_at)
}

/// How an attempt ends: its result, or a failure or timeout the retry policy decides on.
enum LocalEnd<'a> {
    Completed(&'a Payload),
    Ended(PreparedFailure<'a>),
}

/// Ends the running attempt of `step`: its result, or a failure that the retry policy turns into
/// a retry (the claim `by` names is released and the run's next workflow task comes when the
/// retry is due) or into the activity's end. `release` also releases the claim on a final end
/// (the server ended the attempt and its worker abandons the claim).
fn end_attempt(run: &mut RunState, cx: &mut Cx, step: u32, end: LocalEnd, by: Provenance, release: bool) -> LocalRecord {
    let mut local = run.prepared_locals.remove(&step).expect("an open prepared local activity");
    let attempt = local.attempt.take().expect("a running attempt");
    let claim_task = by.claim().0.clone();
    let failure = match end {
        LocalEnd::Completed(result) => {
            let payload = events::prepared_completed(&local, &attempt, result, &by);
            let event_id = run.append(cx, EventType::ActivityCompleted, payload, Some(&claim_task), None);
            return finish(
                run,
                cx,
                &local,
                &attempt,
                (event_id, EventType::ActivityCompleted),
                &by,
                None,
                release,
            );
        }
        LocalEnd::Ended(failure) => failure,
    };
    let failure_id: String = cx.ids.next_id();
    if let Some((due, backoff_seconds)) = retry_after(&local, &attempt, &failure, cx.now) {
        local.retry_due_at = Some(due);
        run.prepared_locals.insert(step, local.clone());
        let retry_task = release_claim(run, cx, &claim_task).expect("a retry pending: the run wants a workflow task");
        let retry = PreparedRetry {
            task_id: &retry_task,
            retry_of_task_id: &claim_task,
            available_at: due,
            backoff_seconds,
        };
        let payload = events::prepared_retry_scheduled(&local, &attempt, &failure, &failure_id, retry, &by);
        let event_id = run.append(cx, EventType::ActivityRetryScheduled, payload, Some(&claim_task), None);
        return finish(
            run,
            cx,
            &local,
            &attempt,
            (event_id, EventType::ActivityRetryScheduled),
            &by,
            Some(retry_task),
            false,
        );
    }
    let event_type = match failure {
        PreparedFailure::Failed { .. } => EventType::ActivityFailed,
        PreparedFailure::TimedOut { .. } => EventType::ActivityTimedOut,
    };
    let payload = events::prepared_ended(&local, &attempt, &failure, &failure_id, &by);
    let event_id = run.append(cx, event_type, payload, Some(&claim_task), None);
    finish(run, cx, &local, &attempt, (event_id, event_type), &by, None, release)
}

/// When a failed attempt is retried: never after a non-retryable failure or a schedule-to-close
/// timeout; otherwise as the policy says ([`RetryPolicy::retry_after`]).
fn retry_after(local: &PreparedLocal, attempt: &PreparedAttempt, failure: &PreparedFailure, now: Millis) -> Option<(Millis, i64)> {
    let policy = local.retry_policy();
    let retryable = match failure {
        PreparedFailure::Failed {
            exception_type,
            non_retryable,
            ..
        } => !non_retryable && !policy.never_retries(*exception_type),
        PreparedFailure::TimedOut { kind } => *kind != "schedule_to_close",
    };
    policy.retry_after(attempt.number, retryable, now, local.schedule_to_close_deadline())
}

/// Ends workflow task `task_id` without a completion (its worker stops replaying) and asks for
/// the next one; answers it (held until a pending retry is due).
fn release_claim(run: &mut RunState, cx: &mut Cx, task_id: &TaskId) -> Option<TaskId> {
    run.release_workflow_task(cx, task_id);
    run.workflow_task_wanted = true;
    run.follow_up_workflow_task(cx)
}

/// Records the receipt of an ended attempt (and releases the claim when asked to).
#[allow(clippy::too_many_arguments)]
fn finish(
    run: &mut RunState,
    cx: &mut Cx,
    local: &PreparedLocal,
    attempt: &PreparedAttempt,
    (event_id, event_type): (EventId, EventType),
    by: &Provenance,
    retry_task_id: Option<TaskId>,
    release: bool,
) -> LocalRecord {
    let key = match by {
        Provenance::Outcome { fingerprint, .. } => LocalReceiptKey::Outcome {
            fingerprint: fingerprint.to_string(),
        },
        Provenance::Deadline { .. } => LocalReceiptKey::Deadline,
        Provenance::Recovery { .. } => LocalReceiptKey::Recovery,
    };
    let (task_id, task_attempt, owner) = by.claim();
    let record = LocalRecord {
        execution_id: local.execution_id.clone(),
        attempt_id: attempt.attempt_id.clone(),
        worker_attempt_id: attempt.worker_attempt_id.clone(),
        step: local.step,
        event_id,
        event_type: event_type.as_str().to_string(),
        recorded_at: cx.now,
        task_id: task_id.clone(),
        task_attempt,
        lease_owner: owner.to_string(),
        retry_task_id,
    };
    if release {
        release_claim(run, cx, task_id);
    } else {
        run.extend_leased_history(cx);
    }
    run.local_receipts.push_back(LocalReceipt {
        key,
        record: record.clone(),
    });
    while run.local_receipts.len() > cx.limits.closed_task_receipts_max {
        run.local_receipts.pop_front();
    }
    record
}
