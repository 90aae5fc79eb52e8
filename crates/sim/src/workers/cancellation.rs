//! Cooperative cancellation in the workload: a client asks a run to stop, the worker that
//! takes its next workflow task delivers the request at the call the run waits at (deferred
//! while activities that wait for their stop are stopping), and the workers of the attempts a
//! delivery stopped acknowledge — at once, later, twice or never.

use super::deliveries::{workflow_lease, Delivery, Held};
use crate::report::Failure;
use crate::world::World;
use capstan_engine::{ActivityAttemptId, DeliveryOutcome, DeliveryRequest, RunState, StoppedAttempt, Task, TimerPurpose};

/// A cooperative worker that finds an undelivered request on its task delivers it. Returns
/// whether the task is still the worker's to complete (false: the delivery was deferred and
/// the claim released).
pub(crate) async fn deliver_requested_cancellation(
    world: &mut World,
    held: &mut Held,
    task: &Task,
    run: &RunState,
    owner: &str,
) -> Result<bool, Failure> {
    let Some(request) = run.cancellation.as_ref().filter(|r| r.delivery.is_none()) else {
        return Ok(true);
    };
    let (sequence, call_kind) = match &request.awaiting {
        Some(awaiting) => (awaiting.sequence, awaiting.call_kind.clone()),
        None => match open_call(run) {
            Some((sequence, kind)) => (sequence, kind.to_string()),
            None => return Ok(true),
        },
    };
    world.trace(|| {
        format!(
            "{owner} delivers the cancellation of {} at call {sequence} ({call_kind})",
            run.workflow_id
        )
    });
    let delivery = DeliveryRequest {
        request_id: request.request_id.to_string(),
        sequence,
        call_kind,
        sequence_span: 1,
        operation_sequence: None,
        operation_sequence_span: 1,
    };
    let lease = workflow_lease(task.id.clone(), owner.to_string(), task.fence);
    let result = capstan_app::cancellation::deliver(&world.app, lease, delivery).await;
    let Some((outcome, run)) = world.declined(result)? else {
        return Ok(true);
    };
    world.seen.acknowledge(&run);
    let unacknowledged: Vec<(ActivityAttemptId, StoppedAttempt)> = run
        .stopped_attempts
        .iter()
        .filter(|(_, stopped)| stopped.acknowledgement.is_none())
        .map(|(attempt, stopped)| (attempt.clone(), stopped.clone()))
        .collect();
    for (attempt_id, stopped) in unacknowledged {
        let ack = Delivery::AcknowledgeStop {
            task_id: stopped.task_id,
            attempt_id,
            owner: stopped.lease_owner,
            request_id: stopped.request_id.to_string(),
            fence: stopped.workflow_task_attempt,
        };
        held.hand_over(world, ack, true).await?;
    }
    match outcome {
        DeliveryOutcome::Delivered(_) => {
            world.counters.cancellations[1] += 1;
            Ok(true)
        }
        DeliveryOutcome::Waiting(_) => {
            world.counters.cancellations[2] += 1;
            if run.workflow_task.as_ref() == Some(&task.id) {
                return Err(world.fail(format!("a deferred delivery left task {} leased", task.id)));
            }
            Ok(false)
        }
    }
}

/// The call a run waits at (steps run one at a time: the latest open one).
fn open_call(run: &RunState) -> Option<(u32, &'static str)> {
    let activities = run.activities.values().map(|a| (a.step, "activity"));
    let timers = run
        .timers
        .values()
        .filter(|t| t.purpose == TimerPurpose::User)
        .map(|t| (t.step, "timer"));
    let signals = run.signal_waits.iter().map(|w| (w.step, "signal"));
    let children = run.children.keys().map(|step| (*step, "child"));
    let locals = run.prepared_locals.keys().map(|step| (*step, "local_activity"));
    activities
        .chain(timers)
        .chain(signals)
        .chain(children)
        .chain(locals)
        .max_by_key(|(step, _)| *step)
}
