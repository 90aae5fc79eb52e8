//! Time-driven transitions: what happens when a task's deadline passes.

use crate::transitions::close::close_run_from_outside;
use crate::transitions::{
    activity_resolved, append_cooperative_cancelled, end_attempt, events, execution_of, retry_failed_child, AttemptEnd, Resolution,
    TimerWait,
};
use crate::{
    ActivityExecution, Cx, RunState, Task, TaskClosure, TaskDetail, TaskId, TaskKind, TaskState, TimerId, TimerPurpose, WorkflowFailure,
};
use crate::{ClosedReason, EventType, Observation, RunStatus};

/// The timeout kind of an attempt whose lease ran out before any of its own budgets did (its
/// worker neither reported nor heartbeated within `--activity-task-lease-seconds`).
pub const LEASE_EXPIRED: &str = "lease_expired";

/// Looks at a task whose `deadline_at` has passed: fires a timer, times a run out, returns an
/// expired workflow lease to ready, or ends a timed-out activity attempt. Returns whether
/// anything changed (a task whose deadline moved meanwhile is left alone).
pub fn on_deadline(run: &mut RunState, cx: &mut Cx, task_id: &TaskId) -> bool {
    let now = cx.now;
    let Some(task) = run.tasks.get(task_id).cloned() else {
        return false;
    };
    if task.deadline_at.is_none_or(|d| d > now) {
        return false;
    }
    match (&task.kind, &task.state) {
        (TaskKind::Timer, _) => {
            let TaskDetail::Timer { timer_id } = &task.detail else {
                return false;
            };
            fire_timer(run, cx, timer_id);
            cx.effects.observations.push(Observation::TimerFired);
        }
        (TaskKind::RunDeadline, _) if task.detail == TaskDetail::CancellationDeadline => {
            run.close_task(cx, task_id, TaskClosure::Completed);
            if !run.is_closed() {
                close_run_from_outside(run, cx, RunStatus::Cancelled, ClosedReason::Cancelled);
                append_cooperative_cancelled(run, cx, None, "deadline_expired");
            }
        }
        (TaskKind::RunDeadline, _) => time_out_run(run, cx),
        (TaskKind::Workflow, TaskState::Leased(_)) => {
            // Lease lost: offer the same task again; the next lease gets a higher attempt.
            cx.effects.observations.push(Observation::LeaseExpired { kind: TaskKind::Workflow });
            let task = run.task_mut(cx, task_id).expect("open");
            task.state = TaskState::Ready;
            task.available_at = now;
            task.deadline_at = None;
            run.record_deferred_signals(cx);
        }
        (TaskKind::Activity, state) => {
            let Some(execution) = execution_of(run, &task).cloned() else {
                return false;
            };
            let s2c_passed = execution.schedule_to_close_deadline.is_some_and(|d| d <= now);
            let timeout_kind = match state {
                _ if s2c_passed => "schedule_to_close",
                TaskState::Ready => "schedule_to_start",
                TaskState::Leased(_) => {
                    let TaskDetail::Activity {
                        last_heartbeat_at,
                        started_at,
                        ..
                    } = &task.detail
                    else {
                        return false;
                    };
                    // The earliest budget that ran out names the timeout; a lease that ran out
                    // before any budget did is named for what it is.
                    let started = started_at.unwrap_or(now);
                    let start_to_close_due = execution.timeouts.start_to_close_seconds.map(|s| started + s * 1000);
                    let heartbeat_due = execution
                        .timeouts
                        .heartbeat_seconds
                        .map(|s| last_heartbeat_at.unwrap_or(started) + s * 1000);
                    match (heartbeat_due.filter(|d| *d <= now), start_to_close_due.filter(|d| *d <= now)) {
                        (Some(heartbeat), Some(start_to_close)) if heartbeat < start_to_close => "heartbeat",
                        (Some(_), None) => "heartbeat",
                        (None, None) => LEASE_EXPIRED,
                        _ => "start_to_close",
                    }
                }
            };
            if matches!(state, TaskState::Leased(_)) {
                cx.effects.observations.push(Observation::LeaseExpired { kind: TaskKind::Activity });
            }
            cx.effects.observations.push(Observation::ActivityTimedOut { timeout_kind });
            if matches!(state, TaskState::Ready) && timeout_kind == "schedule_to_start" {
                // schedule_to_start ends the execution: no attempt ran, none can be retried.
                end_unstarted(run, cx, &task, &execution, timeout_kind);
            } else {
                end_attempt(run, cx, &task, &execution, AttemptEnd::TimedOut { timeout_kind });
            }
        }
        (TaskKind::Workflow, TaskState::Ready) => {
            let task = run.task_mut(cx, task_id).expect("open");
            task.deadline_at = None;
        }
        (TaskKind::Query, _) => return false, // query tasks live outside runs
    }
    true
}

fn end_unstarted(run: &mut RunState, cx: &mut Cx, task: &Task, execution: &ActivityExecution, timeout_kind: &'static str) {
    run.close_task(cx, &task.id, TaskClosure::TimedOut);
    let failure_id: String = cx.ids.next_id();
    let payload = events::activity_timed_out(&failure_id, events::TimedOut::Unstarted { execution, timeout_kind });
    run.append(cx, EventType::ActivityTimedOut, payload, None, None);
    run.activities.remove(&execution.id);
    activity_resolved(run, cx, execution, Resolution::TimedOut { timeout_kind });
}

fn fire_timer(run: &mut RunState, cx: &mut Cx, timer_id: &TimerId) {
    let Some(timer) = run.timers.remove(timer_id) else { return };
    run.close_task(cx, &timer.task_id, TaskClosure::Completed);
    let signal_name = match &timer.purpose {
        TimerPurpose::SignalTimeout(wait_id) => {
            let index = run.signal_waits.iter().position(|w| &w.id == wait_id);
            index.map(|i| run.signal_waits.remove(i).signal_name)
        }
        _ => None,
    };
    let condition = match &timer.purpose {
        TimerPurpose::ConditionTimeout(wait_id) => {
            let index = run.condition_waits.iter().position(|w| &w.id == wait_id);
            index.map(|i| run.condition_waits.remove(i))
        }
        _ => None,
    };
    let wait = TimerWait {
        signal_name: signal_name.as_deref(),
        condition: condition.as_ref(),
    };
    let payload = events::timer_fired(&timer, wait, cx.now);
    run.append(cx, EventType::TimerFired, payload, None, None);
    // The wait's own resolution follows its timer, as DW records it.
    if let Some(condition) = &condition {
        let payload = events::condition_wait_timed_out(condition, &timer.tags);
        run.append(cx, EventType::ConditionWaitTimedOut, payload, None, None);
    }
    run.want_workflow_task(cx, None);
}

fn time_out_run(run: &mut RunState, cx: &mut Cx) {
    if run.is_closed() {
        return;
    }
    let now = cx.now;
    let timeout_kind = match (run.execution_deadline_at, run.run_deadline_at) {
        (Some(e), _) if e <= now => "execution_timeout",
        _ => "run_timeout",
    };
    let failure_id: String = cx.ids.next_id();
    let message = format!("Workflow {} timed out ({timeout_kind}).", run.workflow_id);
    let payload = events::workflow_timed_out(run, &failure_id, timeout_kind, &message);
    run.failure = Some(WorkflowFailure {
        message,
        exception_type: Some("WorkflowTimedOut".into()),
        exception_class: Some("WorkflowTimedOut".into()),
        exception: None,
        non_retryable: true,
        boundary: None,
    });
    close_run_from_outside(run, cx, RunStatus::Failed, ClosedReason::TimedOut);
    run.append(cx, EventType::WorkflowTimedOut, payload, None, None);
    retry_failed_child(run, cx);
}
