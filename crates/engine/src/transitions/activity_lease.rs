//! Activity lease renewal (`/worker/activity-tasks/{id}/renew-lease`): a worker that is still
//! running an attempt keeps its claim alive without reporting progress. A renewal never records
//! a heartbeat, never moves the heartbeat, start-to-close or schedule-to-close deadlines, and
//! never revives a lease that has already expired.

use super::activity::{attempt_deadline, check_activity_lease, execution_of};
use crate::{ActivityAttemptId, Cx, Lease, Millis, Refusal, RunState, Task, TaskDetail, TaskId, TaskState};

/// A renewal rewrites the lease only once this share of its term has passed; before that it
/// confirms the grant the worker holds. SDKs renew every few seconds (a third of a heartbeat
/// timeout), so this keeps renewals of a fresh lease to a read.
const RENEW_AFTER_USED_NUMERATOR: i64 = 1;
const RENEW_AFTER_USED_DENOMINATOR: i64 = 3;

/// What a renewal grants: the lease as it stands after the renewal, and the attempt's
/// heartbeat terms (unchanged by the renewal) so the worker can check its own budget.
#[derive(Clone, Debug, PartialEq)]
pub struct ActivityLeaseGrant {
    pub lease: Lease,
    pub attempt_number: u32,
    /// The attempt's last recorded heartbeat, if it has sent one.
    pub last_heartbeat_at: Option<Millis>,
    /// When the attempt times out for want of a heartbeat (counted from its last heartbeat or
    /// its start), if it has a heartbeat timeout.
    pub heartbeat_deadline_at: Option<Millis>,
    /// Whether the renewal moved the lease (false: the held grant was confirmed as it stands).
    pub extended: bool,
}

/// Answers a renewal from the run as it stands when the held lease is still fresh, without a
/// write: `Ok(None)` means the lease is due for extension ([`renew_activity_lease`]).
pub fn confirm_activity_lease(
    run: &RunState,
    now: Millis,
    task_id: &TaskId,
    attempt_id: &ActivityAttemptId,
    owner: &str,
    lease_ms: i64,
) -> Result<Option<ActivityLeaseGrant>, Refusal> {
    let task = check_activity_lease(run, now, task_id, attempt_id, owner)?;
    let lease = task.lease().expect("checked");
    let used = lease_ms - (lease.expires_at - now);
    if used * RENEW_AFTER_USED_DENOMINATOR >= lease_ms * RENEW_AFTER_USED_NUMERATOR {
        return Ok(None);
    }
    Ok(Some(grant_of(run, task, false)))
}

/// Extends an attempt's lease to `now + lease_ms` (never shortening it). The attempt's
/// deadline moves only as far as its lease allowed: the business and heartbeat deadlines
/// stay where they were.
pub fn renew_activity_lease(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    attempt_id: &ActivityAttemptId,
    owner: &str,
    lease_ms: i64,
) -> Result<ActivityLeaseGrant, Refusal> {
    let now = cx.now;
    let task = check_activity_lease(run, now, task_id, attempt_id, owner)?.clone();
    let execution = execution_of(run, &task).expect("leased activity has an execution").clone();
    let (started_at, last_heartbeat_at) = attempt_times(&task);
    let task = run.task_mut(cx, task_id).expect("checked");
    let TaskState::Leased(lease) = &mut task.state else {
        unreachable!("checked")
    };
    lease.expires_at = lease.expires_at.max(now + lease_ms);
    let expires_at = lease.expires_at;
    let heartbeat_from = last_heartbeat_at.or(started_at).unwrap_or(now);
    task.deadline_at = attempt_deadline(&execution, started_at.unwrap_or(now), heartbeat_from, expires_at);
    let task = task.clone();
    Ok(grant_of(run, &task, true))
}

fn attempt_times(task: &Task) -> (Option<Millis>, Option<Millis>) {
    match &task.detail {
        TaskDetail::Activity {
            started_at,
            last_heartbeat_at,
            ..
        } => (*started_at, *last_heartbeat_at),
        _ => (None, None),
    }
}

fn grant_of(run: &RunState, task: &Task, extended: bool) -> ActivityLeaseGrant {
    let (started_at, last_heartbeat_at) = attempt_times(task);
    let attempt_number = match &task.detail {
        TaskDetail::Activity { attempt_number, .. } => *attempt_number,
        _ => 0,
    };
    let progress_at = last_heartbeat_at.or(started_at);
    let heartbeat_seconds = execution_of(run, task).and_then(|e| e.timeouts.heartbeat_seconds);
    ActivityLeaseGrant {
        lease: task.lease().expect("checked").clone(),
        attempt_number,
        last_heartbeat_at,
        heartbeat_deadline_at: progress_at.zip(heartbeat_seconds).map(|(at, s)| at + s * 1000),
        extended,
    }
}
