//! An activity attempt's stop acknowledged by its worker: recorded once per attempt, and a
//! delivery deferred for the stop goes on once every attempt it waits for has stopped.

use crate::activity_stop::{StopAcknowledgement, StopReceipt, StoppedAttempt};
use crate::cancellation::AwaitedStops;
use crate::history::EventType;
use crate::refusal::{Reason, Refusal};
use crate::run::{Cx, RunState};
use crate::timefmt::iso8601;
use crate::{ActivityAttemptId, TaskId};
use serde_json::{json, Map, Value};

/// The stopped attempt `attempt_id` of task `task_id`, if a cancellation stopped it.
pub fn stopped_attempt<'r>(run: &'r RunState, task_id: &TaskId, attempt_id: &ActivityAttemptId) -> Option<&'r StoppedAttempt> {
    run.stopped_attempts.get(attempt_id).filter(|s| &s.task_id == task_id)
}

/// Records that the worker holding a stopped attempt has stopped its callback. The first
/// acknowledgement is recorded (`ActivityCancellationAcknowledged`, or in the run document when
/// the run has closed); a repeat is answered with the same receipt.
pub fn acknowledge_activity_cancellation(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    attempt_id: &ActivityAttemptId,
    owner: &str,
    request_id: &str,
) -> Result<StopReceipt, Refusal> {
    let attach = |refusal: Refusal| {
        refusal
            .with("task_id", task_id.as_str())
            .with("activity_attempt_id", attempt_id.as_str())
    };
    let Some(stopped) = stopped_attempt(run, task_id, attempt_id).cloned() else {
        let known = run.activities.values().any(|e| e.attempt_ids.contains(attempt_id)) || run.tasks.contains_key(task_id);
        return Err(attach(match known {
            true => Refusal::new(Reason::ActivityNotCancelled, "No cancellation stopped this activity attempt."),
            false => Refusal::new(Reason::AttemptNotFound, "Activity attempt not found."),
        }));
    };
    if stopped.lease_owner != owner {
        return Err(attach(
            Refusal::new(Reason::LeaseOwnerMismatch, "The attempt was held by another worker.")
                .with("lease_owner", stopped.lease_owner.clone()),
        ));
    }
    if stopped.request_id.as_str() != request_id {
        return Err(attach(
            Refusal::new(
                Reason::CancellationRequestMismatch,
                "The acknowledgement names another cancellation request.",
            )
            .with("request_id", stopped.request_id.as_str()),
        ));
    }
    if let Some(acknowledgement) = stopped.acknowledgement {
        return Ok(StopReceipt {
            acknowledgement,
            duplicate: true,
        });
    }
    let received_after_deadline = cx.now > stopped.cleanup_deadline_at;
    let in_history = !run.is_closed();
    let id = match in_history {
        true => {
            let payload = acknowledged_event(&stopped, attempt_id, received_after_deadline);
            run.append(
                cx,
                EventType::ActivityCancellationAcknowledged,
                payload,
                None,
                Some(&stopped.request_id),
            );
            cx.effects.events.last().expect("appended").id.as_str().to_string()
        }
        false => cx.ids.next_id(),
    };
    let acknowledgement = StopAcknowledgement {
        id,
        in_history,
        at: cx.now,
        received_after_deadline,
    };
    run.stopped_attempts.get_mut(attempt_id).expect("found above").acknowledgement = Some(acknowledgement.clone());
    wake_a_waiting_delivery(run, cx);
    Ok(StopReceipt {
        acknowledgement,
        duplicate: false,
    })
}

/// A delivery deferred for stopped attempts (`wait_cancellation_completed`) goes on once every
/// one of them has been acknowledged, before the cleanup deadline: the run gets a workflow task
/// and its worker delivers again at the same call.
fn wake_a_waiting_delivery(run: &mut RunState, cx: &mut Cx) {
    let Some(request) = &run.cancellation else { return };
    let ready = request.delivery.is_none()
        && cx.now < request.cleanup_deadline_at
        && request.awaiting.as_ref().is_some_and(|awaiting| stops_acknowledged(run, awaiting));
    if ready {
        run.want_workflow_task(cx, None);
    }
}

fn acknowledged_event(stopped: &StoppedAttempt, attempt_id: &ActivityAttemptId, received_after_deadline: bool) -> Map<String, Value> {
    let value = json!({
        "activity_execution_id": stopped.execution_id,
        "activity_attempt_id": attempt_id,
        "task_id": stopped.task_id,
        "lease_owner": stopped.lease_owner,
        "request_id": stopped.request_id,
        "root_request_id": stopped.request_id,
        "cleanup_deadline_at": iso8601(stopped.cleanup_deadline_at),
        "cancellation_history_event_id": stopped.cancellation_event_id,
        "callback_state": "stopped",
        "evidence_source": "activity_worker",
        "received_after_deadline": received_after_deadline,
    });
    match value {
        Value::Object(map) => map,
        _ => unreachable!("an object literal"),
    }
}

/// Every attempt a deferred delivery waits for has been acknowledged as stopped.
pub(crate) fn stops_acknowledged(run: &RunState, awaiting: &AwaitedStops) -> bool {
    awaiting
        .attempts
        .iter()
        .all(|attempt| run.stopped_attempts.get(attempt).is_some_and(|s| s.acknowledgement.is_some()))
}
