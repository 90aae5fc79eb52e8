//! Activity tasks: lease, completion, failure and retry, heartbeat.

use crate::transitions::{
    activity_resolved, checkpoint, classify_ledgered_result, events, integrity_refusal, iso8601, ledger_outcome_unknown, ledger_poll_again,
    min_opt, open_ledger_entry, retained_receipt, AttemptRef, NextAttempt, Resolution, ResultClass,
};
use crate::{run_closed_refusal, ActionDefinition, ActionPin, ClosedReason, EventType, LedgerState, Millis, Payload, Reason, Refusal};
use crate::{
    ActivityAttemptId, ActivityExecution, ActivityFailure, ClosedTaskReceipt, Cx, Lease, Receipt, ReportKind, RunState, Task, TaskClosure,
    TaskDetail, TaskId, TaskKind, TaskState,
};
use serde_json::{json, Map, Value};

/// The internal task queue of atomic actions: only the server's atomic executor claims it.
pub const ATOMIC_QUEUE: &str = "__capstan_atomic";

/// The deadline of a ready activity task made at `readied_at`: schedule-to-start from when it
/// may first be leased, or the execution's schedule-to-close, whichever comes first.
pub(super) fn set_ready_activity_deadline(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    execution: &ActivityExecution,
    readied_at: Millis,
) {
    let task = run.task_mut(cx, task_id).expect("open activity task");
    let schedule_to_start = execution
        .timeouts
        .schedule_to_start_seconds
        .map(|s| task.available_at.max(readied_at) + s * 1000);
    task.deadline_at = min_opt(schedule_to_start, execution.schedule_to_close_deadline);
}

/// The ready task of `execution`'s next attempt (after the `attempt_count` that started), first
/// leasable at `available_at`.
pub(super) fn next_attempt_task(run: &mut RunState, cx: &mut Cx, execution: &ActivityExecution, available_at: Millis) -> TaskId {
    let task_id = run.new_task(
        cx,
        TaskKind::Activity,
        &execution.queue,
        TaskDetail::Activity {
            execution_id: execution.id.clone(),
            activity_type: execution.activity_type.clone(),
            attempt_number: execution.attempt_count + 1,
            attempt_id: None,
            last_heartbeat_at: None,
            started_at: None,
        },
    );
    run.task_mut(cx, &task_id).expect("just created").available_at = available_at;
    task_id
}

pub(super) fn execution_of<'r>(run: &'r RunState, task: &Task) -> Option<&'r ActivityExecution> {
    match &task.detail {
        TaskDetail::Activity { execution_id, .. } => run.activities.get(execution_id),
        _ => None,
    }
}

/// Leases a ready activity task: a new attempt with a new `activity_attempt_id` and fence.
pub fn lease_activity_task(run: &mut RunState, cx: &mut Cx, task_id: &TaskId, owner: &str, lease_ms: i64) -> Result<Task, Refusal> {
    lease_activity_task_with(run, cx, task_id, owner, lease_ms, None)?
        .ok_or_else(|| Refusal::new(Reason::TaskNotLeased, "The activity was not dispatched."))
}

/// Leases an activity task whose type may be a declared action: `current` is the definition
/// the store read in this same transaction. A declared action is checked against what its
/// scheduling pinned (a definition changed since is refused: the activity fails without
/// dispatch, and `Ok(None)` says nothing was leased), and its dispatch gets a ledger entry
/// committed with the lease, before any worker sees the task.
pub fn lease_activity_task_with(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    owner: &str,
    lease_ms: i64,
    current: Option<&ActionDefinition>,
) -> Result<Option<Task>, Refusal> {
    integrity_refusal(run)?;
    if let Some(task) = run.tasks.get(task_id).filter(|t| t.kind == TaskKind::Activity && t.is_ready()) {
        let execution = execution_of(run, task).expect("open activity task has an execution").clone();
        // A definition declared after scheduling applies at the claim.
        let pin = execution.action.clone().or_else(|| current.map(ActionPin::at_claim));
        if let Some(pin) = pin {
            if current.map(|d| &d.definition_hash) != Some(&pin.definition_hash) {
                let task = task.clone();
                refuse_dispatch(
                    run,
                    cx,
                    &task,
                    &execution,
                    "definition_changed",
                    "definition_changed: the action definition changed (or was removed) after the activity was scheduled; it was not dispatched.",
                );
                return Ok(None);
            }
            if let Some(reason) = pin.refused.clone() {
                let task = task.clone();
                let message = crate::ledger::refusal_message(&reason);
                refuse_dispatch(run, cx, &task, &execution, &reason, message);
                return Ok(None);
            }
            run.activities.get_mut(&execution.id).expect("open").action = Some(pin);
        }
    }
    let task = lease_activity_attempt(run, cx, task_id, owner, lease_ms)?;
    let execution = execution_of(run, &task).expect("leased").clone();
    if let Some(pin) = execution.action.clone().filter(|p| p.recovery_mode.is_ledgered()) {
        open_ledger_entry(run, cx, &task, &execution, &pin, owner);
    }
    Ok(Some(task))
}

/// An activity refused before dispatch: a final, non-retryable failure; nothing was dispatched,
/// so nothing is uncertain.
fn refuse_dispatch(run: &mut RunState, cx: &mut Cx, task: &Task, execution: &ActivityExecution, reason: &str, message: &str) {
    run.close_task(cx, &task.id, TaskClosure::Failed);
    run.activities.remove(&execution.id);
    let failure_id: String = cx.ids.next_id();
    let payload = events::activity_failed(
        &failure_id,
        events::Failed::Refused {
            execution,
            reason,
            message,
        },
    );
    run.append(cx, EventType::ActivityFailed, payload, None, None);
    let refused = Resolution::Failed {
        message,
        exception_type: Some(reason),
        exception_class: None,
    };
    activity_resolved(run, cx, execution, refused);
}

fn lease_activity_attempt(run: &mut RunState, cx: &mut Cx, task_id: &TaskId, owner: &str, lease_ms: i64) -> Result<Task, Refusal> {
    if run.is_closed() {
        return Err(run_closed_refusal(run));
    }
    let now = cx.now;
    let task = run
        .tasks
        .get(task_id)
        .ok_or_else(|| Refusal::new(Reason::TaskNotLeased, "Activity task is no longer open."))?;
    if task.kind != TaskKind::Activity || !task.is_ready() || task.available_at > now {
        return Err(Refusal::new(Reason::TaskNotLeased, "Activity task is not ready to lease."));
    }
    let execution = execution_of(run, task).expect("open activity task has an execution").clone();
    let attempt_id: ActivityAttemptId = cx.id();
    let attempt_number = execution.attempt_count + 1;
    let expires_at = now + lease_ms;
    let deadline = attempt_deadline(&execution, now, now, expires_at);
    let task = run.task_mut(cx, task_id).expect("checked");
    task.fence = attempt_number as u64;
    task.state = TaskState::Leased(Lease {
        owner: owner.to_string(),
        expires_at,
        fence: task.fence,
    });
    task.deadline_at = deadline;
    task.detail = TaskDetail::Activity {
        execution_id: execution.id.clone(),
        activity_type: execution.activity_type.clone(),
        attempt_number,
        attempt_id: Some(attempt_id.clone()),
        last_heartbeat_at: None,
        started_at: Some(now),
    };
    let task = task.clone();
    run.fence_high_water = run.fence_high_water.max(task.fence);
    let stored = run.activities.get_mut(&execution.id).expect("exists");
    stored.attempt_count = attempt_number;
    stored.attempt_ids.push(attempt_id.clone());
    let payload = events::activity_started(events::Started::Leased {
        attempt: AttemptRef {
            execution: &execution,
            attempt_id: Some(&attempt_id),
            number: attempt_number,
        },
        task_id,
        lease_expires_at: expires_at,
    });
    run.append(cx, EventType::ActivityStarted, payload, None, None);
    Ok(task)
}

/// Checks that `(attempt_id, owner)` holds the live lease of activity task `task_id`.
pub(super) fn check_activity_lease<'r>(
    run: &'r RunState,
    now: Millis,
    task_id: &TaskId,
    attempt_id: &ActivityAttemptId,
    owner: &str,
) -> Result<&'r Task, Refusal> {
    let attach = |refusal: Refusal| {
        refusal
            .with("task_id", task_id.as_str())
            .with("activity_attempt_id", attempt_id.as_str())
    };
    let Some(task) = run.tasks.get(task_id) else {
        if run.is_closed() {
            return Err(attach(activity_run_closed_refusal(run)));
        }
        return Err(attach(Refusal::new(
            Reason::AttemptClosed,
            "The activity attempt is already closed.",
        )));
    };
    let TaskDetail::Activity {
        attempt_id: current,
        execution_id,
        ..
    } = &task.detail
    else {
        return Err(attach(Refusal::new(Reason::TaskNotFound, "Activity task not found.")));
    };
    if current.as_ref() != Some(attempt_id) {
        let execution = run.activities.get(execution_id);
        if execution.is_some_and(|e| e.attempt_ids.contains(attempt_id)) {
            return Err(attach(Refusal::new(Reason::AttemptClosed, "The activity attempt was superseded.")));
        }
        if run.activities.values().any(|e| e.attempt_ids.contains(attempt_id)) {
            return Err(attach(Refusal::new(
                Reason::TaskMismatch,
                "The activity attempt does not belong to this task.",
            )));
        }
        if current.is_none() {
            return Err(attach(Refusal::new(
                Reason::ActivityNotRunning,
                "The activity task has no running attempt.",
            )));
        }
        return Err(attach(Refusal::new(Reason::AttemptNotFound, "Activity attempt not found.")));
    }
    let lease = task.lease().expect("an attempt id is only set on a leased task");
    if lease.owner != owner {
        return Err(attach(Refusal::new(
            Reason::LeaseOwnerMismatch,
            "Activity attempt lease is owned by another worker.",
        ))
        .with("lease_owner", lease.owner.clone()));
    }
    if lease.expires_at <= now {
        return Err(attach(Refusal::new(Reason::LeaseExpired, "Activity attempt lease has expired."))
            .with("lease_expires_at", iso8601(lease.expires_at)));
    }
    Ok(task)
}

fn activity_run_closed_refusal(run: &RunState) -> Refusal {
    let reason = match run.closed_reason {
        Some(ClosedReason::Cancelled) => Reason::RunCancelled,
        Some(ClosedReason::Terminated) => Reason::RunTerminated,
        _ => Reason::RunClosed,
    };
    Refusal::new(reason, "The workflow run is closed; the activity outcome is ignored.")
        .with("outcome", "ignored")
        .with("cancel_requested", true)
        .with("can_continue", false)
        .with("run_status", run.status.as_str())
}

fn activity_receipt(
    run: &mut RunState,
    cx: &mut Cx,
    task: &Task,
    owner: &str,
    attempt_id: &ActivityAttemptId,
    report: ReportKind,
    receipt: Receipt,
) {
    run.remember_receipt(
        cx,
        ClosedTaskReceipt {
            task_id: task.id.clone(),
            owner: owner.to_string(),
            fence: task.fence,
            attempt_id: Some(attempt_id.clone()),
            report,
            receipt,
        },
    );
}

/// Records an attempt's result: `ActivityCompleted`, the execution closes, the workflow wakes.
pub fn complete_activity(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    attempt_id: &ActivityAttemptId,
    owner: &str,
    result: Payload,
) -> Result<Receipt, Refusal> {
    if let Some(receipt) = retained_receipt(run, task_id, owner, 0, Some(attempt_id), ReportKind::CompleteActivity) {
        return Ok(receipt);
    }
    let task = check_activity_lease(run, cx.now, task_id, attempt_id, owner)?.clone();
    let execution = execution_of(run, &task).expect("leased activity has an execution").clone();
    // A declared action's result is classified first: pending (poll again), in doubt (an
    // operator decides: the report is kept as evidence, nothing enters history), a failed
    // linked run, or conclusive.
    match classify_ledgered_result(cx, &execution, &result) {
        None | Some(ResultClass::Conclusive) => {}
        Some(ResultClass::Unknown(mut reason)) => {
            reason["result_hash"] = json!(crate::ledger::digest(result.identity()));
            if let Some(receipt) = ledger_outcome_unknown(run, cx, &task, &execution, reason) {
                activity_receipt(run, cx, &task, owner, attempt_id, ReportKind::CompleteActivity, receipt.clone());
                return Ok(receipt);
            }
        }
        Some(ResultClass::Pending { interval_seconds }) => {
            let receipt = ledger_poll_again(run, cx, &task, &execution, interval_seconds, &result);
            activity_receipt(run, cx, &task, owner, attempt_id, ReportKind::CompleteActivity, receipt.clone());
            return Ok(receipt);
        }
        Some(ResultClass::LinkedRunFailed) => {
            if let Some(mut entry) = execution.ledger_key.as_ref().and_then(|key| run.ledger.get(key)).cloned() {
                entry.state = LedgerState::Verified;
                checkpoint(
                    run,
                    cx,
                    entry,
                    obj!("result_hash" => crate::ledger::digest(result.identity()), "descriptor_status" => "failed"),
                );
            }
            let failure = ActivityFailure {
                message: "linked_run_failed: the linked run reported failure.".into(),
                failure_type: Some("linked_run_failed".into()),
                non_retryable: true,
                ..Default::default()
            };
            let mut stored = execution.clone();
            stored.ledger_key = None;
            run.activities.insert(stored.id.clone(), stored.clone());
            let receipt = end_attempt(
                run,
                cx,
                &task,
                &stored,
                AttemptEnd::Failed {
                    failure,
                    non_retryable: true,
                },
            );
            activity_receipt(run, cx, &task, owner, attempt_id, ReportKind::CompleteActivity, receipt.clone());
            return Ok(receipt);
        }
    }
    let payload = events::activity_completed(events::Completed::Worker {
        attempt: AttemptRef {
            execution: &execution,
            attempt_id: Some(attempt_id),
            number: execution.attempt_count,
        },
        result: &result,
    });
    let result_hash = crate::ledger::digest(result.identity());
    run.append(cx, EventType::ActivityCompleted, payload, None, None);
    // A declared action's conclusive result closes its ledger entry in the same transaction.
    if let Some(mut entry) = execution.ledger_key.as_ref().and_then(|key| run.ledger.get(key)).cloned() {
        entry.state = LedgerState::Verified;
        checkpoint(run, cx, entry, obj!("result_hash" => result_hash));
    }
    run.close_task(cx, task_id, TaskClosure::Completed);
    run.activities.remove(&execution.id);
    let next = activity_resolved(run, cx, &execution, Resolution::Completed(&result));
    let receipt = Receipt {
        run_status: run.status,
        created_task_ids: vec![],
        next_task_id: next,
        retained: false,
    };
    activity_receipt(run, cx, &task, owner, attempt_id, ReportKind::CompleteActivity, receipt.clone());
    Ok(receipt)
}

/// Records an attempt's failure: a retry (`ActivityRetryScheduled` + a new task after the backoff)
/// when the policy allows, else the final `ActivityFailed`.
pub fn fail_activity(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    attempt_id: &ActivityAttemptId,
    owner: &str,
    failure: ActivityFailure,
) -> Result<Receipt, Refusal> {
    if let Some(receipt) = retained_receipt(run, task_id, owner, 0, Some(attempt_id), ReportKind::FailActivity) {
        return Ok(receipt);
    }
    let task = check_activity_lease(run, cx.now, task_id, attempt_id, owner)?.clone();
    let execution = execution_of(run, &task).expect("leased activity has an execution").clone();
    let non_retryable = failure.non_retryable || execution.retry_policy.never_retries(failure.failure_type.as_deref());
    let outcome = end_attempt(run, cx, &task, &execution, AttemptEnd::Failed { failure, non_retryable });
    activity_receipt(run, cx, &task, owner, attempt_id, ReportKind::FailActivity, outcome.clone());
    Ok(outcome)
}

pub(super) enum AttemptEnd {
    Failed { failure: ActivityFailure, non_retryable: bool },
    TimedOut { timeout_kind: &'static str },
}

/// Ends the current attempt of `execution` (failed or timed out): retry or final failure.
pub(super) fn end_attempt(run: &mut RunState, cx: &mut Cx, task: &Task, execution: &ActivityExecution, end: AttemptEnd) -> Receipt {
    let reason = match &end {
        AttemptEnd::Failed { failure, .. } => {
            json!({"kind": "worker_failure", "message": failure.message, "exception_type": failure.failure_type})
        }
        AttemptEnd::TimedOut { timeout_kind } => json!({"kind": "timeout", "timeout_kind": timeout_kind}),
    };
    if let Some(receipt) = ledger_outcome_unknown(run, cx, task, execution, reason) {
        return receipt;
    }
    let attempt_number = execution.attempt_count;
    let (retryable, closure) = match &end {
        AttemptEnd::Failed { non_retryable, .. } => (!non_retryable, TaskClosure::Failed),
        AttemptEnd::TimedOut { timeout_kind } => (*timeout_kind != "schedule_to_close", TaskClosure::TimedOut),
    };
    let retry = execution
        .retry_policy
        .retry_after(attempt_number, retryable, cx.now, execution.schedule_to_close_deadline);
    run.close_task(cx, &task.id, closure);
    let attempt_id = match &task.detail {
        TaskDetail::Activity { attempt_id, .. } => attempt_id.clone(),
        _ => None,
    };
    let attempt = AttemptRef {
        execution,
        attempt_id: attempt_id.as_ref(),
        number: attempt_number,
    };
    if let Some((retry_at, backoff_seconds)) = retry {
        let retry_task = next_attempt_task(run, cx, execution, retry_at);
        let stored = run.activities.get_mut(&execution.id).expect("open execution");
        stored.task_id = retry_task.clone();
        let stored = stored.clone();
        let now = cx.now;
        set_ready_activity_deadline(run, cx, &retry_task, &stored, now);
        let payload = events::activity_retry_scheduled(events::Retry::Policy {
            attempt,
            end: &end,
            next: NextAttempt {
                task_id: &retry_task,
                available_at: retry_at,
                backoff_seconds,
            },
            retry_of_task_id: &task.id,
        });
        run.append(cx, EventType::ActivityRetryScheduled, payload, None, None);
        return Receipt {
            run_status: run.status,
            created_task_ids: vec![retry_task],
            next_task_id: None,
            retained: false,
        };
    }
    let failure_id: String = cx.ids.next_id();
    let (event_type, payload) = match &end {
        AttemptEnd::Failed { non_retryable, .. } => {
            let non_retryable = *non_retryable || !retryable || !execution.retry_policy.allows_attempt(attempt_number + 1);
            let failed = events::Failed::Attempt {
                attempt,
                end: &end,
                non_retryable,
            };
            (EventType::ActivityFailed, events::activity_failed(&failure_id, failed))
        }
        AttemptEnd::TimedOut { .. } => {
            let timed_out = events::TimedOut::Attempt { attempt, end: &end };
            (EventType::ActivityTimedOut, events::activity_timed_out(&failure_id, timed_out))
        }
    };
    run.append(cx, event_type, payload, None, None);
    run.activities.remove(&execution.id);
    let resolution = match &end {
        AttemptEnd::Failed { failure, .. } => Resolution::Failed {
            message: &failure.message,
            exception_type: failure.failure_type.as_deref(),
            exception_class: failure.class.as_deref(),
        },
        AttemptEnd::TimedOut { timeout_kind } => Resolution::TimedOut { timeout_kind },
    };
    let next = activity_resolved(run, cx, execution, resolution);
    Receipt {
        run_status: run.status,
        created_task_ids: vec![],
        next_task_id: next,
        retained: false,
    }
}

/// What an activity heartbeat tells the worker.
#[derive(Clone, Debug, PartialEq)]
pub struct ActivityHeartbeat {
    pub lease: Option<Lease>,
    pub cancel_requested: bool,
    pub can_continue: bool,
    pub reason: Option<&'static str>,
}

/// Extends an attempt's lease and heartbeat deadline. On a closed run, and to the holder of an
/// attempt a delivered cancellation stopped, it answers "stop" instead of refusing, so the
/// worker abandons the attempt.
pub fn heartbeat_activity(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    attempt_id: &ActivityAttemptId,
    owner: &str,
    lease_ms: i64,
    details: Option<Value>,
) -> Result<ActivityHeartbeat, Refusal> {
    if run.is_closed() && !run.tasks.contains_key(task_id) {
        let reason = match run.closed_reason {
            Some(ClosedReason::Cancelled) => "run_cancelled",
            Some(ClosedReason::Terminated) => "run_terminated",
            _ => "run_closed",
        };
        return Ok(ActivityHeartbeat {
            lease: None,
            cancel_requested: true,
            can_continue: false,
            reason: Some(reason),
        });
    }
    if super::activity_stop::stopped_attempt(run, task_id, attempt_id).is_some_and(|s| s.lease_owner == owner) {
        return Ok(ActivityHeartbeat {
            lease: None,
            cancel_requested: true,
            can_continue: false,
            reason: Some(Reason::ActivityCancelled.as_str()),
        });
    }
    let task = check_activity_lease(run, cx.now, task_id, attempt_id, owner)?.clone();
    let execution = execution_of(run, &task).expect("leased activity has an execution").clone();
    let now = cx.now;
    let task = run.task_mut(cx, task_id).expect("checked");
    let TaskState::Leased(lease) = &mut task.state else {
        unreachable!("checked")
    };
    lease.expires_at = lease.expires_at.max(now + lease_ms);
    let lease = lease.clone();
    // The start-to-close budget does not move with heartbeats; the heartbeat deadline does.
    let started_at = match &task.detail {
        TaskDetail::Activity { started_at, .. } => *started_at,
        _ => None,
    };
    task.deadline_at = attempt_deadline(&execution, started_at.unwrap_or(now), now, lease.expires_at);
    let attempt_number = match &mut task.detail {
        TaskDetail::Activity {
            last_heartbeat_at,
            attempt_number,
            ..
        } => {
            *last_heartbeat_at = Some(now);
            *attempt_number
        }
        _ => 0,
    };
    // New progress details are kept for the next attempt and recorded once in history.
    if let Some(details) = details.filter(|d| !d.is_null()) {
        if execution.last_heartbeat_details.as_ref() != Some(&details) {
            let payload = events::activity_heartbeat_recorded(events::Heartbeat::Worker {
                attempt: AttemptRef {
                    execution: &execution,
                    attempt_id: Some(attempt_id),
                    number: attempt_number,
                },
                at: now,
                lease_expires_at: lease.expires_at,
                progress: &details,
            });
            run.activities
                .get_mut(&execution.id)
                .expect("open execution")
                .last_heartbeat_details = Some(details);
            run.append(cx, EventType::ActivityHeartbeatRecorded, payload, None, None);
        }
    }
    Ok(ActivityHeartbeat {
        lease: Some(lease),
        cancel_requested: false,
        can_continue: true,
        reason: None,
    })
}

/// The earliest moment the attempt must be acted on: its lease, its start-to-close budget,
/// its heartbeat deadline (counted from `heartbeat_from`) and the execution's
/// schedule-to-close deadline.
pub(super) fn attempt_deadline(
    execution: &ActivityExecution,
    started_at: Millis,
    heartbeat_from: Millis,
    lease_expires_at: Millis,
) -> Option<Millis> {
    let timeouts = &execution.timeouts;
    [
        Some(lease_expires_at),
        timeouts.start_to_close_seconds.map(|s| started_at + s * 1000),
        timeouts.heartbeat_seconds.map(|s| heartbeat_from + s * 1000),
        execution.schedule_to_close_deadline,
    ]
    .into_iter()
    .flatten()
    .min()
}
