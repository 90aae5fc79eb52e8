//! A running attempt's supervision (`control` renews the claim's lease, `heartbeat` records
//! progress) and its outcome. An attempt past a deadline is ended by the server at the first
//! report that finds it so.

use super::end_attempt;
use crate::transitions::events;
use crate::transitions::events::{PreparedFailure, Provenance};
use crate::transitions::prepared_local::{check_claim, cleanup_deadline, cleanup_view, running_step, stale_attempt, LocalEnd};
use crate::{
    ActivityAttemptId, Cx, EventId, LocalReceiptKey, LocalRecord, LocalRecordReceipt, LocalReport, LocalStop, LocalSupervision,
    RecordedHeartbeat, RunState, TaskState,
};
use crate::{EventType, LocalClaim, Millis, Reason, Refusal};
use serde_json::{Map, Value};
use std::ops::ControlFlow;

/// What a supervision call came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Supervised {
    /// The attempt runs on.
    Active(LocalSupervision),
    /// A cooperative cancellation stopped the attempt (`ActivityCancelled` recorded, the worker
    /// acknowledges once the callback has stopped). Repeated calls are answered the same.
    Stopped(Box<LocalStop>),
    /// The attempt was past a deadline (`timeout_kind`): its timeout (or retry) is recorded and
    /// the claim released; the worker stops the callback.
    Ended { timeout_kind: &'static str, record: LocalRecord },
}

/// Where a running attempt stands, read without a change.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalStanding {
    /// The attempt's view, with the lease as it is (`renewed` false).
    pub view: LocalSupervision,
    /// The first deadline that has passed, as its timeout kind.
    pub passed: Option<&'static str>,
    /// A cancellation stopped it already (answered from the run as it stands).
    pub stopped: Option<Box<LocalStop>>,
    /// A cancellation request is pending and the attempt is not a cleanup call: the next
    /// supervision stops it (a write).
    pub stop_due: bool,
}

impl LocalStanding {
    /// Nothing to record: the lease is fresh for `lease_ms` and nothing stops the attempt.
    pub fn answerable(&self, now: Millis, lease_ms: i64) -> bool {
        self.stopped.is_some() || (!self.stop_due && self.passed.is_none() && self.view.lease_expires_at - now >= lease_ms * 2 / 3)
    }
}

/// The running attempt's standing under `claim`, read without a change.
pub fn local_activity_status(
    run: &RunState,
    now: Millis,
    claim: LocalClaim,
    attempt_id: &ActivityAttemptId,
) -> Result<LocalStanding, Refusal> {
    let lease_expires_at = check_claim(run, now, claim)?;
    let step = running_step(run, claim, attempt_id)?;
    let local = &run.prepared_locals[&step];
    let attempt = local.attempt.clone().expect("running");
    let cleanup = cleanup_view(run, &local.descriptor).ok().flatten();
    let deadlines = local.deadlines(&attempt, cleanup_deadline(&cleanup));
    let view = LocalSupervision {
        execution_id: local.execution_id.clone(),
        attempt,
        renewed: false,
        lease_expires_at,
        deadlines,
        cleanup,
        heartbeat_event_id: None,
    };
    let request = run.cancellation.clone();
    let stopped = match (&view.attempt.stopped_by, request.clone()) {
        (Some(event_id), Some(request)) => Some(Box::new(LocalStop {
            view: view.clone(),
            request,
            cancellation_event_id: event_id.clone(),
        })),
        _ => None,
    };
    let stop_due = stopped.is_none() && request.is_some() && local.descriptor.cleanup.is_none();
    Ok(LocalStanding {
        passed: deadlines.passed(now),
        view,
        stopped,
        stop_due,
    })
}

/// Stops a running prepared attempt for the run's cancellation request: `ActivityCancelled`,
/// and a stop receipt its worker acknowledges (`crate::activity_stop`).
pub(in crate::transitions) fn stop_prepared_attempt(run: &mut RunState, cx: &mut Cx, step: u32) -> Option<EventId> {
    let request = run.cancellation.clone()?;
    let local = run.prepared_locals.get(&step)?.clone();
    let attempt = local.attempt.clone().filter(|a| a.stopped_by.is_none())?;
    let failure_id: String = cx.ids.next_id();
    let payload = events::prepared_cancelled(&local, &attempt, &failure_id);
    let event_id = run.append(
        cx,
        EventType::ActivityCancelled,
        payload,
        Some(&attempt.task_id),
        Some(&request.request_id),
    );
    if let Some(running) = run.prepared_locals.get_mut(&step).and_then(|l| l.attempt.as_mut()) {
        running.stopped_by = Some(event_id.clone());
    }
    let stopped = crate::activity_stop::StoppedAttempt {
        workflow_task_attempt: Some(attempt.task_attempt),
        ..crate::activity_stop::StoppedAttempt::stopped_by(
            &request,
            attempt.task_id.clone(),
            local.execution_id.clone(),
            attempt.lease_owner.clone(),
            event_id.clone(),
        )
    };
    run.stopped_attempts.insert(attempt.attempt_id.clone(), stopped);
    run.extend_leased_history(cx);
    Some(event_id)
}

/// What a supervision call answers when the standing decides it without the call's own work:
/// a stop (recorded now if due) or an end past a deadline.
fn settle(run: &mut RunState, cx: &mut Cx, claim: LocalClaim, standing: LocalStanding) -> ControlFlow<Supervised, LocalSupervision> {
    if let Some(stop) = standing.stopped {
        return ControlFlow::Break(Supervised::Stopped(stop));
    }
    if standing.stop_due {
        let step = running_step(run, claim, &standing.view.attempt.attempt_id).expect("checked");
        let event_id = stop_prepared_attempt(run, cx, step).expect("a running attempt and a request");
        let mut view = standing.view;
        view.attempt.stopped_by = Some(event_id.clone());
        return ControlFlow::Break(Supervised::Stopped(Box::new(LocalStop {
            view,
            request: run.cancellation.clone().expect("checked"),
            cancellation_event_id: event_id,
        })));
    }
    if let Some(kind) = standing.passed {
        return ControlFlow::Break(timed_out(run, cx, claim, &standing.view, kind));
    }
    ControlFlow::Continue(standing.view)
}

/// `control`: extends the claim's lease by `lease_ms` (the attempt holds the claim's lease;
/// neither moves a deadline; 0 renews nothing) — or stops the attempt, or ends it past a
/// deadline.
pub fn control_local_activity(
    run: &mut RunState,
    cx: &mut Cx,
    claim: LocalClaim,
    attempt_id: &ActivityAttemptId,
    lease_ms: i64,
) -> Result<Supervised, Refusal> {
    let standing = local_activity_status(run, cx.now, claim, attempt_id)?;
    let mut view = match settle(run, cx, claim, standing) {
        ControlFlow::Break(settled) => return Ok(settled),
        ControlFlow::Continue(view) => view,
    };
    let expires_at = cx.now + lease_ms;
    let task = run.task_mut(cx, claim.task_id).expect("checked");
    if let TaskState::Leased(lease) = &mut task.state {
        lease.expires_at = lease.expires_at.max(expires_at);
        view.lease_expires_at = lease.expires_at;
    }
    task.deadline_at = Some(view.lease_expires_at);
    view.renewed = lease_ms > 0;
    Ok(Supervised::Active(view))
}

/// `heartbeat`: records the callback's progress (`ActivityHeartbeatRecorded`, once per new
/// progress, as an activity's heartbeats are) and moves the heartbeat deadline of a call that
/// has a heartbeat timeout; renews no lease.
pub fn heartbeat_local_activity(
    run: &mut RunState,
    cx: &mut Cx,
    claim: LocalClaim,
    attempt_id: &ActivityAttemptId,
    progress: Option<&Map<String, Value>>,
) -> Result<Supervised, Refusal> {
    let standing = local_activity_status(run, cx.now, claim, attempt_id)?;
    let mut view = match settle(run, cx, claim, standing) {
        ControlFlow::Break(settled) => return Ok(settled),
        ControlFlow::Continue(view) => view,
    };
    let step = running_step(run, claim, attempt_id)?;
    let local = run.prepared_locals.get_mut(&step).expect("running");
    let heartbeat_seconds = local.descriptor.heartbeat_seconds;
    let attempt = local.attempt.as_mut().expect("running");
    if let Some(seconds) = heartbeat_seconds {
        attempt.heartbeat_deadline = Some(cx.now + seconds * 1000);
    }
    let repeated = attempt.last_heartbeat.as_ref().filter(|h| h.progress.as_ref() == progress);
    let event_id = match repeated.map(|h| h.event_id.clone()) {
        Some(event_id) => event_id,
        None => {
            let local = local.clone();
            let attempt = local.attempt.clone().expect("running");
            let payload = events::prepared_heartbeat(&local, &attempt, progress, cx.now);
            let event_id = run.append(cx, EventType::ActivityHeartbeatRecorded, payload, Some(claim.task_id), None);
            run.extend_leased_history(cx);
            let running = run
                .prepared_locals
                .get_mut(&step)
                .and_then(|l| l.attempt.as_mut())
                .expect("running");
            running.last_heartbeat = Some(RecordedHeartbeat {
                event_id: event_id.clone(),
                progress: progress.cloned(),
            });
            event_id
        }
    };
    let local = &run.prepared_locals[&step];
    let attempt = local.attempt.clone().expect("running");
    view.deadlines = local.deadlines(&attempt, cleanup_deadline(&view.cleanup));
    view.attempt = attempt;
    view.heartbeat_event_id = Some(event_id);
    Ok(Supervised::Active(view))
}

fn timed_out(run: &mut RunState, cx: &mut Cx, claim: LocalClaim, view: &LocalSupervision, kind: &'static str) -> Supervised {
    let by = Provenance::Deadline {
        task_id: claim.task_id,
        task_attempt: claim.attempt,
        owner: claim.owner,
    };
    let step = running_step(run, claim, &view.attempt.attempt_id).expect("checked");
    let record = end_attempt(run, cx, step, LocalEnd::Ended(PreparedFailure::TimedOut { kind }), by, true);
    Supervised::Ended {
        timeout_kind: kind,
        record,
    }
}

/// `outcome`: the callback's result or failure (the retry policy decides what a failure leads
/// to; an attempt past a deadline is recorded as timed out instead). `fingerprint` identifies
/// the report: the same report again gets the first receipt, another one is refused.
pub fn report_local_outcome(
    run: &mut RunState,
    cx: &mut Cx,
    claim: LocalClaim,
    attempt_id: &ActivityAttemptId,
    report: &LocalReport,
    fingerprint: &str,
) -> Result<LocalRecordReceipt, Refusal> {
    if let Some(receipt) = run.local_receipts.iter().rev().find(|r| &r.record.attempt_id == attempt_id) {
        let same_claim = &receipt.record.task_id == claim.task_id
            && receipt.record.task_attempt == claim.attempt
            && receipt.record.lease_owner == claim.owner;
        return match &receipt.key {
            LocalReceiptKey::Outcome { fingerprint: first } if first == fingerprint && same_claim => Ok(LocalRecordReceipt {
                duplicate: true,
                record: receipt.record.clone(),
            }),
            LocalReceiptKey::Outcome { .. } if same_claim => Err(Refusal::new(
                Reason::LocalActivityOutcomeMismatch,
                "Another outcome was recorded for this attempt.",
            )
            .with("event_id", receipt.record.event_id.as_str())
            .with("event_type", receipt.record.event_type.clone())),
            _ => Err(stale_attempt(attempt_id)),
        };
    }
    let standing = local_activity_status(run, cx.now, claim, attempt_id)?;
    if standing.stopped.is_some() {
        return Err(
            Refusal::new(Reason::ActivityCancelled, "A cooperative cancellation stopped this attempt.")
                .with("activity_attempt_id", attempt_id.as_str()),
        );
    }
    let passed = standing.passed;
    let step = running_step(run, claim, attempt_id)?;
    let end = match (passed, report) {
        (Some(kind), _) => LocalEnd::Ended(PreparedFailure::TimedOut { kind }),
        (None, LocalReport::Completed(result)) => LocalEnd::Completed(result),
        (
            None,
            LocalReport::Failed {
                message,
                exception_type,
                non_retryable,
            },
        ) => LocalEnd::Ended(PreparedFailure::Failed {
            message,
            exception_type: exception_type.as_deref(),
            non_retryable: *non_retryable,
        }),
    };
    let by = Provenance::Outcome {
        fingerprint,
        task_id: claim.task_id,
        task_attempt: claim.attempt,
        owner: claim.owner,
    };
    let record = end_attempt(run, cx, step, end, by, false);
    Ok(LocalRecordReceipt { duplicate: false, record })
}

/// `acknowledge-cancellation` of a prepared attempt a cancellation stopped: named by the claim
/// it ran under (owner and `workflow_task_attempt`, even once that claim has ended), recorded
/// once as every stopped attempt's acknowledgement is.
pub fn acknowledge_local_stop(
    run: &mut RunState,
    cx: &mut Cx,
    claim: LocalClaim,
    attempt_id: &ActivityAttemptId,
    request_id: &str,
) -> Result<crate::activity_stop::StopReceipt, Refusal> {
    let fence = run.stopped_attempts.get(attempt_id).and_then(|s| s.workflow_task_attempt);
    if let Some(fence) = fence.filter(|fence| *fence != claim.attempt) {
        return Err(Refusal::new(
            Reason::WorkflowTaskAttemptMismatch,
            "The attempt ran under another attempt of this workflow task.",
        )
        .with("activity_attempt_id", attempt_id.as_str())
        .with("current_attempt", fence));
    }
    crate::transitions::acknowledge_activity_cancellation(run, cx, claim.task_id, attempt_id, claim.owner, request_id)
}
