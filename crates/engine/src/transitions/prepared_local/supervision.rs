//! A running attempt's supervision (`control` renews the claim's lease, `heartbeat` records
//! progress) and its outcome. An attempt past a deadline is ended by the server at the first
//! report that finds it so.

use super::*;

/// What a supervision call came to.
#[derive(Clone, Debug, PartialEq)]
pub enum Supervised {
    /// The attempt runs on.
    Active(LocalSupervision),
    /// The attempt was past a deadline (`timeout_kind`): its timeout (or retry) is recorded and
    /// the claim released; the worker stops the callback.
    Ended { timeout_kind: &'static str, record: LocalRecord },
}

/// The running attempt's standing, read without a change: the lease as it is (`renewed`
/// false). A caller that finds the lease fresh and no deadline passed may answer from it.
pub fn local_activity_status(
    run: &RunState,
    now: Millis,
    claim: LocalClaim,
    attempt_id: &ActivityAttemptId,
) -> Result<(LocalSupervision, Option<&'static str>), Refusal> {
    let lease_expires_at = check_claim(run, now, claim)?;
    let step = running_step(run, claim, attempt_id)?;
    let local = &run.prepared_locals[&step];
    let attempt = local.attempt.clone().expect("running");
    let cleanup = cleanup_view(run, &local.descriptor).ok().flatten();
    let deadlines = local.deadlines(&attempt, cleanup_deadline(&cleanup));
    let passed = deadlines.passed(now);
    let view = LocalSupervision {
        execution_id: local.execution_id.clone(),
        attempt,
        renewed: false,
        lease_expires_at,
        deadlines,
        cleanup,
        heartbeat_event_id: None,
    };
    Ok((view, passed))
}

/// `control`: extends the claim's lease by `lease_ms` (the attempt holds the claim's lease;
/// neither moves a deadline) — or ends an attempt past a deadline.
pub fn control_local_activity(
    run: &mut RunState,
    cx: &mut Cx,
    claim: LocalClaim,
    attempt_id: &ActivityAttemptId,
    lease_ms: i64,
) -> Result<Supervised, Refusal> {
    let (mut view, passed) = local_activity_status(run, cx.now, claim, attempt_id)?;
    if let Some(kind) = passed {
        return Ok(timed_out(run, cx, claim, &view, kind));
    }
    let expires_at = cx.now + lease_ms;
    let task = run.task_mut(cx, claim.task_id).expect("checked");
    if let TaskState::Leased(lease) = &mut task.state {
        lease.expires_at = lease.expires_at.max(expires_at);
        view.lease_expires_at = lease.expires_at;
    }
    task.deadline_at = Some(view.lease_expires_at);
    view.renewed = true;
    Ok(Supervised::Active(view))
}

/// `heartbeat`: records the callback's progress (`ActivityHeartbeatRecorded`) and moves the
/// heartbeat deadline of a call that has a heartbeat timeout; renews no lease.
pub fn heartbeat_local_activity(
    run: &mut RunState,
    cx: &mut Cx,
    claim: LocalClaim,
    attempt_id: &ActivityAttemptId,
    progress: Option<&Map<String, Value>>,
) -> Result<Supervised, Refusal> {
    let (mut view, passed) = local_activity_status(run, cx.now, claim, attempt_id)?;
    if let Some(kind) = passed {
        return Ok(timed_out(run, cx, claim, &view, kind));
    }
    let step = running_step(run, claim, attempt_id)?;
    let local = run.prepared_locals.get_mut(&step).expect("running");
    if let (Some(seconds), Some(attempt)) = (local.descriptor.heartbeat_seconds, local.attempt.as_mut()) {
        attempt.heartbeat_deadline = Some(cx.now + seconds * 1000);
    }
    let local = local.clone();
    let attempt = local.attempt.clone().expect("running");
    let payload = events::prepared_heartbeat(&local, &attempt, progress, cx.now);
    let event_id = run.append(cx, EventType::ActivityHeartbeatRecorded, payload, Some(claim.task_id), None);
    run.extend_leased_history(cx);
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
    let record = end_attempt(run, cx, step, LocalEnd::TimedOut(kind), by, true);
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
    let (_, passed) = local_activity_status(run, cx.now, claim, attempt_id)?;
    let step = running_step(run, claim, attempt_id)?;
    let end = match (passed, report) {
        (Some(kind), _) => LocalEnd::TimedOut(kind),
        (None, LocalReport::Completed(result)) => LocalEnd::Completed(result),
        (
            None,
            LocalReport::Failed {
                message,
                exception_type,
                non_retryable,
            },
        ) => LocalEnd::Failed {
            message,
            exception_type: exception_type.as_deref(),
            non_retryable: *non_retryable,
        },
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
