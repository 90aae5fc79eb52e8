//! Workflow tasks: lease, completion (the commands are applied in `commands`), failure, release, heartbeat.

use crate::message_stream::StreamProgress;
use crate::transitions::commands::{apply_command, validate_commands};
use crate::transitions::{events, integrity_refusal, iso8601, min_opt};
use crate::{
    ActivityAttemptId, ClosedTaskReceipt, CommandId, Cx, Lease, Receipt, ReportKind, ResumeContext, RunState, SignalId, Task, TaskClosure,
    TaskDetail, TaskFailureNote, TaskId, TaskKind, TaskState, TimerId, UpdateStatus, WorkflowCommand, WorkflowTaskFailure,
};
use crate::{ClosedReason, EventType, Millis, Payload, Reason, Refusal, RunStatus};

/// Failure type the SDKs report when replay produced no new command: benign, nothing to retry.
pub const WAITING_FOR_HISTORY_FAILURE: &str = "WorkflowTaskWaitingForHistory";

/// Longest pause before a failed workflow task is offered again.
const WORKFLOW_TASK_RETRY_BACKOFF_MAX_MS: Millis = 60_000;

/// Leases a ready workflow task to `owner`. The returned task carries the new lease and the
/// history snapshot (events up to `history_snapshot`) the worker must replay.
pub fn lease_workflow_task(run: &mut RunState, cx: &mut Cx, task_id: &TaskId, owner: &str, lease_ms: i64) -> Result<Task, Refusal> {
    integrity_refusal(run)?;
    if run.is_closed() {
        return Err(run_closed_refusal(run));
    }
    let now = cx.now;
    let task = run
        .tasks
        .get(task_id)
        .ok_or_else(|| Refusal::new(Reason::TaskNotLeased, "Workflow task is no longer open."))?;
    if task.kind != TaskKind::Workflow || !task.is_ready() || task.available_at > now {
        return Err(Refusal::new(Reason::TaskNotLeased, "Workflow task is not ready to lease."));
    }
    // Every way a lease ends records its deferred signals; this keeps a new lease from ever
    // starting with some still held back.
    run.record_deferred_signals(cx);
    let snapshot = run.last_sequence;
    let mode = run.replay_mode_for(owner, now);
    let task = run.task_mut(cx, task_id).expect("checked");
    task.fence += 1;
    let lease = Lease {
        owner: owner.to_string(),
        expires_at: now + lease_ms,
        fence: task.fence,
    };
    task.deadline_at = Some(lease.expires_at);
    task.state = TaskState::Leased(lease);
    if let TaskDetail::Workflow {
        history_snapshot,
        replay_mode,
        ..
    } = &mut task.detail
    {
        *history_snapshot = snapshot;
        *replay_mode = Some(mode);
    }
    let task = task.clone();
    run.fence_high_water = run.fence_high_water.max(task.fence);
    if matches!(run.status, RunStatus::Pending | RunStatus::Waiting) {
        run.status = RunStatus::Running;
    }
    Ok(task)
}

/// Checks that `(owner, attempt)` holds the live lease of workflow task `task_id`.
pub fn check_workflow_lease<'r>(run: &'r RunState, now: Millis, task_id: &TaskId, owner: &str, attempt: u64) -> Result<&'r Task, Refusal> {
    let attach = |refusal: Refusal| refusal.with("task_id", task_id.as_str()).with("workflow_task_attempt", attempt);
    let Some(task) = run.tasks.get(task_id) else {
        if run.is_closed() {
            return Err(attach(run_closed_refusal(run)));
        }
        return Err(attach(Refusal::new(Reason::TaskNotLeased, "Workflow task is not leased.")));
    };
    if task.kind != TaskKind::Workflow {
        return Err(attach(Refusal::new(Reason::TaskNotFound, "Workflow task not found.")));
    }
    let Some(lease) = task.lease() else {
        return Err(attach(Refusal::new(Reason::TaskNotLeased, "Workflow task is not leased.")).with("task_status", "ready"));
    };
    if lease.owner != owner {
        return Err(attach(Refusal::new(
            Reason::LeaseOwnerMismatch,
            "Workflow task lease is owned by another worker.",
        ))
        .with("lease_owner", lease.owner.clone()));
    }
    if lease.fence != attempt {
        return Err(attach(Refusal::new(
            Reason::WorkflowTaskAttemptMismatch,
            "Workflow task attempt does not match the current lease.",
        ))
        .with("current_attempt", lease.fence));
    }
    if lease.expires_at <= now {
        return Err(attach(Refusal::new(Reason::LeaseExpired, "Workflow task lease has expired."))
            .with("task_status", "leased")
            .with("lease_owner", lease.owner.clone())
            .with("lease_expires_at", iso8601(lease.expires_at)));
    }
    Ok(task)
}

pub(super) fn retained_receipt(
    run: &RunState,
    task_id: &TaskId,
    owner: &str,
    fence: u64,
    attempt_id: Option<&ActivityAttemptId>,
    report: ReportKind,
) -> Option<Receipt> {
    let receipt = run.find_receipt(task_id)?;
    let same = receipt.owner == owner
        && receipt.report == report
        && receipt.attempt_id.as_ref() == attempt_id
        && (attempt_id.is_some() || receipt.fence == fence);
    same.then(|| Receipt {
        retained: true,
        ..receipt.receipt.clone()
    })
}

/// Applies a workflow task's commands: the heart of the engine.
pub fn complete_workflow_task(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    owner: &str,
    attempt: u64,
    commands: Vec<WorkflowCommand>,
) -> Result<Receipt, Refusal> {
    let claim = WorkflowClaim { task_id, owner, attempt };
    complete_workflow_task_with(run, cx, claim, commands, &StreamProgress::default())
}

/// Who completes a workflow task: its id, the lease's owner and its attempt (the fence).
#[derive(Clone, Copy, Debug)]
pub struct WorkflowClaim<'a> {
    pub task_id: &'a TaskId,
    pub owner: &'a str,
    pub attempt: u64,
}

/// [`complete_workflow_task`] with what the completion reports about its message streams
/// (`message_stream_cursors`, `message_stream_waits`): checked with the commands, applied
/// after the task's resume and before its commands, so a continue-as-new carries the
/// advanced cursors.
pub fn complete_workflow_task_with(
    run: &mut RunState,
    cx: &mut Cx,
    claim: WorkflowClaim<'_>,
    commands: Vec<WorkflowCommand>,
    streams: &StreamProgress,
) -> Result<Receipt, Refusal> {
    let WorkflowClaim { task_id, owner, attempt } = claim;
    if let Some(receipt) = retained_receipt(run, task_id, owner, attempt, None, ReportKind::CompleteWorkflowTask) {
        return Ok(receipt);
    }
    let task = check_workflow_lease(run, cx.now, task_id, owner, attempt)?.clone();
    // A run past its deadline takes no more commands; the clock is about to time it out.
    if let Some(deadline) = min_opt(run.execution_deadline_at, run.run_deadline_at).filter(|d| *d <= cx.now) {
        return Err(Refusal::new(Reason::RunTimedOut, "The workflow run is past its deadline.")
            .with("task_id", task_id.as_str())
            .with("deadline_at", iso8601(deadline)));
    }
    validate_commands(run, cx, &commands)?;
    super::message_stream::check_stream_progress(run, streams)?;
    let identity = task_command_identity(&task);
    for command in &commands {
        if let WorkflowCommand::RecordSideEffect {
            stream: Some(directive), ..
        } = command
        {
            directive.check(&identity)?;
        }
    }

    let resume = match &task.detail {
        TaskDetail::Workflow { resume, .. } => resume.clone(),
        _ => None,
    };
    match &resume {
        Some(ResumeContext::Signal {
            signal_id,
            signal_name,
            arguments,
            command_id,
        }) => {
            apply_signal_to_wait(run, cx, task_id, signal_id, signal_name, arguments, command_id, &commands);
        }
        Some(ResumeContext::AfterUpdate { update_id }) => {
            let receiver = events::Receiver::Update { update_id };
            satisfy_condition_wait(run, cx, task_id, receiver, None, &commands);
        }
        _ => {}
    }
    super::message_stream::apply_stream_progress(run, cx, task_id, streams);

    let mut created = Vec::new();
    let tasks_before: std::collections::BTreeSet<TaskId> = run.tasks.keys().cloned().collect();
    for command in commands {
        apply_command(run, cx, task_id, command)?;
    }
    run.close_task(cx, task_id, TaskClosure::Completed);
    run.workflow_task_failure = None;
    if let TaskDetail::Workflow { history_snapshot, .. } = &task.detail {
        run.command_traces.retain(|trace| trace.sequence > *history_snapshot);
    }
    run.record_deferred_signals(cx);
    if let Some(update @ ResumeContext::Update { update_id, .. }) = &resume {
        // The worker did not settle the update this task was for: offer it again.
        if run.updates.get(update_id).is_some_and(|u| u.status == UpdateStatus::Accepted) && !run.is_closed() {
            run.pending_updates.push_front(update.clone());
        }
    }
    if !run.is_closed() {
        run.status = RunStatus::Waiting;
        run.follow_up_workflow_task(cx);
    }
    super::message_stream::deliver_held_messages(run, cx);
    super::message_stream::offer_unconsumed_messages(run, cx, streams);
    for id in run.tasks.keys() {
        if !tasks_before.contains(id) {
            created.push(id.clone());
        }
    }
    let receipt = Receipt {
        run_status: run.status,
        created_task_ids: created,
        next_task_id: None,
        retained: false,
    };
    run.remember_receipt(
        cx,
        ClosedTaskReceipt {
            task_id: task_id.clone(),
            owner: owner.to_string(),
            fence: attempt,
            attempt_id: None,
            report: ReportKind::CompleteWorkflowTask,
            receipt: receipt.clone(),
        },
    );
    Ok(receipt)
}

/// The command identity a task's stream directives carry: the command that caused the task
/// (its signal or update), else the task's own id, as the poll rendered it.
fn task_command_identity(task: &Task) -> String {
    match &task.detail {
        TaskDetail::Workflow {
            resume: Some(ResumeContext::Signal { command_id, .. } | ResumeContext::Update { command_id, .. }),
            ..
        } => command_id.as_str().to_string(),
        _ => task.id.as_str().to_string(),
    }
}

/// Step 2 of a completion: the signal that caused this task is applied to the wait it resolves.
#[allow(clippy::too_many_arguments)]
fn apply_signal_to_wait(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    signal_id: &SignalId,
    signal_name: &str,
    arguments: &Payload,
    command_id: &CommandId,
    commands: &[WorkflowCommand],
) {
    if let Some(index) = run.signal_waits.iter().position(|w| w.signal_name == signal_name) {
        let wait = run.signal_waits.remove(index);
        cancel_wait_timer(run, cx, wait.timer_id.as_ref());
        let payload = events::signal_applied(&wait, command_id, signal_id, arguments);
        run.append(cx, EventType::SignalApplied, payload, Some(task_id), Some(command_id));
        return;
    }
    let receiver = events::Receiver::Signal { signal_id, signal_name };
    satisfy_condition_wait(run, cx, task_id, receiver, Some(command_id), commands);
}

/// A receiver (signal or applied update) resolves the latest open condition wait — unless the
/// same completion re-opens that wait (protocol 20 §5 step 2).
fn satisfy_condition_wait(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    receiver: events::Receiver,
    command_id: Option<&CommandId>,
    commands: &[WorkflowCommand],
) {
    let Some(wait) = run.condition_waits.last().cloned() else {
        return;
    };
    run.condition_waits.pop();
    cancel_wait_timer(run, cx, wait.timer_id.as_ref());
    let reopened = commands.iter().any(|c| {
        matches!(c, WorkflowCommand::OpenConditionWait { condition_key, fingerprint, .. }
            if *condition_key == wait.condition_key && *fingerprint == wait.fingerprint)
    });
    if reopened {
        // The re-open supersedes the old wait; a Satisfied row between them would bind later
        // receivers to the old wait on replay.
        return;
    }
    let payload = events::condition_wait_satisfied(&wait, receiver);
    run.append(cx, EventType::ConditionWaitSatisfied, payload, Some(task_id), command_id);
}

/// Closes a wait's timeout timer without an event: the wait's own resolution row records the end.
fn cancel_wait_timer(run: &mut RunState, cx: &mut Cx, timer_id: Option<&TimerId>) {
    if let Some(timer) = timer_id.and_then(|id| run.timers.remove(id)) {
        run.close_task(cx, &timer.task_id, TaskClosure::Cancelled);
    }
}

pub fn run_closed_refusal(run: &RunState) -> Refusal {
    let stop_reason = match run.closed_reason {
        Some(ClosedReason::Cancelled) => "run_cancelled",
        Some(ClosedReason::Terminated) => "run_terminated",
        Some(ClosedReason::Completed) => "run_completed",
        Some(ClosedReason::Failed) => "run_failed",
        _ => "run_closed",
    };
    Refusal::new(Reason::RunClosed, "The workflow run is closed.")
        .with("stop_reason", stop_reason)
        .with("cancel_requested", run.closed_reason == Some(ClosedReason::Cancelled))
        .with("can_continue", false)
        .with("run_status", run.status.as_str())
        .with("run_closed_reason", run.closed_reason.map(|r| r.as_str()))
        .with("run_closed_at", run.closed_at.map(iso8601))
}

/// A failed workflow task records no history of its own (only signals deferred during its lease).
/// `WorkflowTaskWaitingForHistory` closes it (nothing
/// new to do); any other failure offers it again after a capped exponential backoff and is kept
/// on the run ([`TaskFailureNote`]) until a workflow task completes.
pub fn fail_workflow_task(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    owner: &str,
    attempt: u64,
    failure: WorkflowTaskFailure,
) -> Result<Receipt, Refusal> {
    if let Some(receipt) = retained_receipt(run, task_id, owner, attempt, None, ReportKind::FailWorkflowTask) {
        return Ok(receipt);
    }
    check_workflow_lease(run, cx.now, task_id, owner, attempt)?;
    let mut created = Vec::new();
    // "Waiting for history" is benign only while something pending will wake the workflow;
    // otherwise closing the task would strand the run, so it is re-offered like any failure.
    let something_pending =
        !run.activities.is_empty() || !run.timers.is_empty() || !run.condition_waits.is_empty() || !run.signal_waits.is_empty();
    if failure.failure_type.as_deref() == Some(WAITING_FOR_HISTORY_FAILURE) && something_pending {
        run.close_task(cx, task_id, TaskClosure::Completed);
        run.workflow_task_failure = None; // the worker replayed the history: not a failure
        if run.status == RunStatus::Running {
            run.status = RunStatus::Waiting;
        }
        created.extend(run.follow_up_workflow_task(cx));
    } else {
        let note = TaskFailureNote::new(failure, task_id, attempt, owner, cx.now, run.workflow_task_failure.as_ref());
        run.workflow_task_failure = Some(note);
        let backoff = (1000i64 << attempt.saturating_sub(1).min(16)).min(WORKFLOW_TASK_RETRY_BACKOFF_MAX_MS);
        let now = cx.now;
        let task = run.task_mut(cx, task_id).expect("lease checked");
        task.state = TaskState::Ready;
        task.available_at = now + backoff;
        task.deadline_at = None;
    }
    run.record_deferred_signals(cx);
    let receipt = Receipt {
        run_status: run.status,
        created_task_ids: created,
        next_task_id: None,
        retained: false,
    };
    run.remember_receipt(
        cx,
        ClosedTaskReceipt {
            task_id: task_id.clone(),
            owner: owner.to_string(),
            fence: attempt,
            attempt_id: None,
            report: ReportKind::FailWorkflowTask,
            receipt: receipt.clone(),
        },
    );
    Ok(receipt)
}

/// A worker gives its workflow task back (it is shutting down): the task is offered again at
/// once, under a higher fence at its next lease. No history changes.
pub fn release_workflow_task(run: &mut RunState, cx: &mut Cx, task_id: &TaskId, owner: &str) -> Result<(), Refusal> {
    let now = cx.now;
    let held = run.tasks.get(task_id).and_then(|t| t.lease()).is_some_and(|l| l.owner == owner);
    if !held {
        return Err(Refusal::new(Reason::TaskNotLeased, "The task is not leased to this worker."));
    }
    let task = run.task_mut(cx, task_id).expect("checked");
    task.state = TaskState::Ready;
    task.available_at = now;
    task.deadline_at = None;
    run.record_deferred_signals(cx);
    Ok(())
}

/// Extends a workflow task's lease.
pub fn heartbeat_workflow_task(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    owner: &str,
    attempt: u64,
    lease_ms: i64,
) -> Result<Lease, Refusal> {
    check_workflow_lease(run, cx.now, task_id, owner, attempt)?;
    let now = cx.now;
    let task = run.task_mut(cx, task_id).expect("lease checked");
    let TaskState::Leased(lease) = &mut task.state else {
        unreachable!("lease checked")
    };
    lease.expires_at = now + lease_ms;
    let lease = lease.clone();
    task.deadline_at = Some(lease.expires_at);
    Ok(lease)
}
