//! `record_local_activity`: a local activity's whole story, recorded at once.

use crate::transitions::{events, LocalActivityRef, LocalAttemptRef};
use crate::{ActivityAttemptId, ActivityExecutionId, Cx, EventType, LocalActivityRecord, LocalOutcome, RunState, TaskId};

/// A local activity ran inside the workflow task: its whole story is recorded at once, as
/// activity events marked `execution_mode: local` (both SDKs' replayers need the marker on every
/// event of the step). No activity task exists and no new workflow task is needed: the same
/// completion already used the result.
pub(super) fn record_local_activity(run: &mut RunState, cx: &mut Cx, step: u32, wt: Option<&TaskId>, local: LocalActivityRecord) {
    let execution_id: ActivityExecutionId = cx.id();
    let activity = LocalActivityRef {
        execution_id: &execution_id,
        activity_type: &local.activity_type,
        step,
        tags: &local.tags,
    };
    let scheduled = events::activity_scheduled(events::Scheduled::Local {
        activity: &activity,
        arguments: &local.arguments,
        echoed: &local.echoed,
    });
    run.append(cx, EventType::ActivityScheduled, scheduled, wt, None);
    let last_index = local.attempts.len().saturating_sub(1);
    let mut last = (1u32, None::<ActivityAttemptId>, None::<String>, None::<i64>);
    for (index, attempt) in local.attempts.iter().enumerate() {
        let attempt_id: ActivityAttemptId = cx.id();
        let at = LocalAttemptRef {
            activity: &activity,
            number: attempt.attempt_number,
            attempt_id: Some(&attempt_id),
            worker_attempt_id: attempt.worker_attempt_id.as_deref(),
            duration_ms: attempt.duration_ms,
        };
        let started = events::activity_started(events::Started::Local(at));
        run.append(cx, EventType::ActivityStarted, started, wt, None);
        for heartbeat in &attempt.heartbeats {
            let payload = events::activity_heartbeat_recorded(events::Heartbeat::Local { attempt: at, heartbeat });
            run.append(cx, EventType::ActivityHeartbeatRecorded, payload, wt, None);
        }
        if index < last_index {
            let payload = events::activity_retry_scheduled(events::Retry::Local {
                attempt: at,
                retry: &attempt.retry,
            });
            run.append(cx, EventType::ActivityRetryScheduled, payload, wt, None);
        }
        last = (
            attempt.attempt_number,
            Some(attempt_id),
            attempt.worker_attempt_id.clone(),
            attempt.duration_ms,
        );
    }
    let attempt = LocalAttemptRef {
        activity: &activity,
        number: last.0,
        attempt_id: last.1.as_ref(),
        worker_attempt_id: last.2.as_deref(),
        duration_ms: last.3,
    };
    let (event_type, terminal) = match &local.outcome {
        LocalOutcome::Completed(result) => (
            EventType::ActivityCompleted,
            events::activity_completed(events::Completed::Local { attempt, result }),
        ),
        LocalOutcome::Failed(failure) => {
            let failure_id: String = cx.ids.next_id();
            let failed = events::Failed::Local { attempt, failure };
            (EventType::ActivityFailed, events::activity_failed(&failure_id, failed))
        }
        LocalOutcome::TimedOut(failure) => {
            let failure_id: String = cx.ids.next_id();
            let timed_out = events::TimedOut::Local { attempt, failure };
            (EventType::ActivityTimedOut, events::activity_timed_out(&failure_id, timed_out))
        }
        LocalOutcome::Cancelled(failure) => {
            let failure_id: String = cx.ids.next_id();
            let cancelled = events::Cancelled::Local {
                attempt,
                failure,
                failure_id: &failure_id,
            };
            (EventType::ActivityCancelled, events::activity_cancelled(cancelled))
        }
    };
    run.append(cx, event_type, terminal, wt, None);
}
