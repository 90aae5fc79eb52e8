//! Admission: `prepare` starts an attempt (the first records the call as a new step), `recover`
//! ends an attempt whose claim was lost.

use super::end_attempt;
use crate::transitions::events::{PreparedFailure, Provenance};
use crate::transitions::prepared_local::{check_claim, cleanup_deadline, cleanup_view, schedule_call, LocalEnd};
use crate::transitions::{events, iso8601};
use crate::{
    ActivityAttemptId, CleanupView, Cx, LocalAdmission, LocalDescriptor, LocalReceiptKey, LocalRecordReceipt, PreparedAttempt,
    PreparedLocal, RunState,
};
use crate::{EventType, LocalClaim, Millis, Reason, Refusal};

/// Admits an attempt of the prepared call at `sequence` under `claim`: the first attempt takes
/// the run's next step (`ActivityScheduled`, then `ActivityStarted`); a later one follows a
/// scheduled retry once it is due. The same nonce on the same claim is answered with the same
/// attempt.
pub fn prepare_local_activity(
    run: &mut RunState,
    cx: &mut Cx,
    claim: LocalClaim,
    sequence: u32,
    worker_attempt_id: &str,
    descriptor: LocalDescriptor,
) -> Result<LocalAdmission, Refusal> {
    let lease_expires_at = check_claim(run, cx.now, claim)?;
    let cleanup = cleanup_view(run, &descriptor)?;
    let refuse = |reason, message: &str| Refusal::new(reason, message).with("sequence", sequence);
    let step = match run.prepared_locals.get(&sequence) {
        Some(local) => {
            if local.descriptor.fingerprint != descriptor.fingerprint {
                return Err(refuse(
                    Reason::LocalActivityPreparationMismatch,
                    "The descriptor differs from the call this step was prepared with.",
                ));
            }
            if let Some(attempt) = &local.attempt {
                if attempt.stopped_by.is_some() {
                    return Err(refuse(Reason::ActivityCancelled, "A cooperative cancellation stopped this call."));
                }
                let same = attempt.worker_attempt_id == worker_attempt_id
                    && &attempt.task_id == claim.task_id
                    && attempt.task_attempt == claim.attempt;
                if !same {
                    return Err(refuse(
                        Reason::LocalActivityPreviousAttemptUnresolved,
                        "An attempt of this call is still running under another claim: recover it first.",
                    )
                    .with("activity_attempt_id", attempt.attempt_id.as_str()));
                }
                return Ok(admission(local, attempt.clone(), true, lease_expires_at, cleanup));
            }
            if let Some(due) = local.retry_due_at.filter(|due| *due > cx.now) {
                return Err(refuse(Reason::LocalActivityRetryNotDue, "The retry of this call is not due yet.")
                    .with("retry_available_at", iso8601(due)));
            }
            sequence
        }
        None if sequence > run.next_step => {
            return Err(refuse(
                Reason::LocalActivityCommandPrefixNotRecorded,
                "The commands before this call are not recorded: checkpoint them first.",
            )
            .with("next_sequence", run.next_step));
        }
        None if sequence < run.next_step => {
            return Err(refuse(
                Reason::LocalActivityPreparationMismatch,
                "Another call is recorded at this sequence.",
            )
            .with("next_sequence", run.next_step));
        }
        None => schedule_call(run, cx, claim, descriptor, None)?.0,
    };
    let attempt = start_attempt(run, cx, step, claim, worker_attempt_id, lease_expires_at);
    let local = &run.prepared_locals[&step];
    Ok(admission(local, attempt, false, lease_expires_at, cleanup))
}

fn start_attempt(
    run: &mut RunState,
    cx: &mut Cx,
    step: u32,
    claim: LocalClaim,
    worker_attempt_id: &str,
    lease_expires_at: Millis,
) -> PreparedAttempt {
    let attempt_id: ActivityAttemptId = cx.id();
    let local = run.prepared_locals.get_mut(&step).expect("open");
    local.attempt_count += 1;
    let attempt = PreparedAttempt {
        attempt_id,
        number: local.attempt_count,
        worker_attempt_id: worker_attempt_id.to_string(),
        task_id: claim.task_id.clone(),
        task_attempt: claim.attempt,
        lease_owner: claim.owner.to_string(),
        started_at: cx.now,
        heartbeat_deadline: local.descriptor.heartbeat_seconds.map(|s| cx.now + s * 1000),
        stopped_by: None,
        last_heartbeat: None,
    };
    local.attempt = Some(attempt.clone());
    local.retry_due_at = None;
    let payload = events::prepared_started(local, &attempt, lease_expires_at);
    run.append(cx, EventType::ActivityStarted, payload, Some(claim.task_id), None);
    run.extend_leased_history(cx);
    attempt
}

fn admission(
    local: &PreparedLocal,
    attempt: PreparedAttempt,
    duplicate: bool,
    lease_expires_at: Millis,
    cleanup: Option<CleanupView>,
) -> LocalAdmission {
    LocalAdmission {
        duplicate,
        execution_id: local.execution_id.clone(),
        deadlines: local.deadlines(&attempt, cleanup_deadline(&cleanup)),
        attempt,
        lease_expires_at,
        cleanup,
    }
}

/// Ends the unfinished attempt of the call at `sequence`, found by a claim that replaced the one
/// it ran under: the callback's fate is unknown, so the attempt failed (or timed out, if a
/// deadline passed) and the retry policy decides what follows. A repeat on the same claim is
/// answered with the first receipt.
pub fn recover_local_activity(
    run: &mut RunState,
    cx: &mut Cx,
    claim: LocalClaim,
    sequence: u32,
    descriptor: &LocalDescriptor,
) -> Result<LocalRecordReceipt, Refusal> {
    let repeated = run.local_receipts.iter().rev().find(|r| {
        r.key == LocalReceiptKey::Recovery
            && r.record.step == sequence
            && &r.record.task_id == claim.task_id
            && r.record.task_attempt == claim.attempt
            && r.record.lease_owner == claim.owner
    });
    if let Some(receipt) = repeated {
        return Ok(LocalRecordReceipt {
            duplicate: true,
            record: receipt.record.clone(),
        });
    }
    check_claim(run, cx.now, claim)?;
    let refuse = |reason, message: &str| Refusal::new(reason, message).with("sequence", sequence);
    let Some(local) = run.prepared_locals.get(&sequence) else {
        return Err(refuse(
            Reason::LocalActivityNothingToRecover,
            "No attempt of a prepared call at this sequence is unfinished.",
        ));
    };
    let Some(original) = local.attempt.clone().filter(|a| a.stopped_by.is_none()) else {
        return Err(refuse(
            Reason::LocalActivityNothingToRecover,
            "The call's last attempt has ended; its retry is pending.",
        ));
    };
    if local.descriptor.fingerprint != descriptor.fingerprint {
        return Err(refuse(
            Reason::LocalActivityPreparationMismatch,
            "The descriptor differs from the call this step was prepared with.",
        ));
    }
    if &original.task_id == claim.task_id && original.task_attempt == claim.attempt {
        return Err(refuse(
            Reason::LocalActivityOriginalClaimLive,
            "The attempt runs under this very claim: report its outcome instead.",
        ));
    }
    let cleanup = cleanup_view(run, &local.descriptor).ok().flatten();
    let end = match local.deadlines(&original, cleanup_deadline(&cleanup)).passed(cx.now) {
        Some(kind) => PreparedFailure::TimedOut { kind },
        None => PreparedFailure::Failed {
            message: "The workflow task claim the local activity ran under was lost; the callback's outcome is unknown.",
            exception_type: Some("LocalActivityClaimLost"),
            non_retryable: false,
        },
    };
    let by = Provenance::Recovery {
        task_id: claim.task_id,
        task_attempt: claim.attempt,
        owner: claim.owner,
        original: &original,
    };
    let record = end_attempt(run, cx, sequence, LocalEnd::Ended(end), by, false);
    Ok(LocalRecordReceipt { duplicate: false, record })
}
