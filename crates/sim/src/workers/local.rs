//! Prepared local activities in the workload: a worker holding a workflow task admits the
//! call, supervises it, reports its end, and replays on from what the server recorded — or
//! dies mid-call (its claim runs out; the next claim recovers the attempt), or has the call
//! stopped by a cancellation requested meanwhile. Repeats of each report are sent too.

use super::deliveries::{workflow_lease, Delivery, Held};
use crate::clients::request_cooperative_cancellation;
use crate::program::local_descriptor;
use crate::program::replay::LocalCall;
use crate::report::Failure;
use crate::workload::{PAYLOAD, WORKFLOW_LEASE_MS};
use crate::world::World;
use capstan_app::local_activities;
use capstan_app::reports::WorkflowLease;
use capstan_engine::{ActivityAttemptId, LocalReport, Payload, RunState, Supervised, Task};
use rand::Rng;

/// Runs the prepared local call the replay stopped at, on the claim of `task`; answers
/// whether the claim is still held (the replay goes on) or over.
pub(crate) async fn run_local_call(
    world: &mut World,
    held: &mut Held,
    task: &Task,
    run: &RunState,
    owner: &str,
    call: LocalCall,
    faulty: bool,
) -> Result<bool, Failure> {
    let lease = workflow_lease(task.id.clone(), owner.to_string(), task.fence);
    let sequence = call.sequence.unwrap_or(run.next_step);
    if call.recover {
        return recover(world, lease, run, owner, sequence).await;
    }
    let Some(attempt_id) = admit(world, lease.clone(), task, run, owner, sequence, faulty).await? else {
        return Ok(false);
    };
    // The worker dies with the callback running: its claim runs out.
    if faulty && world.rng.random_bool(0.15) {
        world.trace(|| format!("{owner} dies running the local call at {sequence}"));
        world.counters.lost_tasks += 1;
        return Ok(false);
    }
    // A client asks the run to stop while the callback runs.
    if faulty && world.rng.random_bool(0.1) {
        request_cooperative_cancellation(world, run.workflow_id.as_str()).await?;
    }
    if faulty && world.rng.random_bool(0.5) && !supervise(world, held, lease.clone(), task, owner, attempt_id.clone()).await? {
        return Ok(false);
    }
    report_end(world, lease, attempt_id, sequence, faulty).await
}

/// The next claim recovers the attempt a lost claim left unfinished; answers whether the
/// claim is still held (the server did not schedule a retry).
async fn recover(world: &mut World, lease: WorkflowLease, run: &RunState, owner: &str, sequence: u32) -> Result<bool, Failure> {
    world.trace(|| format!("{owner} recovers the local call at {sequence} of {}", run.workflow_id));
    let descriptor = local_descriptor(run.workflow_id.as_str());
    let result = local_activities::recover(&world.app, lease, sequence, descriptor).await;
    let Some((receipt, run)) = world.declined(result)? else {
        return Ok(false);
    };
    world.seen.acknowledge(&run);
    world.counters.local_attempts[2] += 1;
    Ok(receipt.record.retry_task_id.is_none())
}

/// The worker prepares the call (sometimes twice: a repeat must name the same attempt);
/// the attempt admitted, unless refused.
async fn admit(
    world: &mut World,
    lease: WorkflowLease,
    task: &Task,
    run: &RunState,
    owner: &str,
    sequence: u32,
    faulty: bool,
) -> Result<Option<ActivityAttemptId>, Failure> {
    let descriptor = local_descriptor(run.workflow_id.as_str());
    let nonce = format!("{}:{}:{sequence}", task.id, task.fence);
    world.trace(|| format!("{owner} prepares the local call at {sequence} of {}", run.workflow_id));
    let result = local_activities::prepare(&world.app, lease.clone(), sequence, nonce.clone(), descriptor.clone()).await;
    let Some((admission, admitted_run)) = world.declined(result)? else {
        return Ok(None);
    };
    world.seen.acknowledge(&admitted_run);
    if !admission.duplicate {
        world.counters.local_attempts[0] += 1;
    }
    if faulty && world.rng.random_bool(0.2) {
        let again = local_activities::prepare(&world.app, lease, sequence, nonce, descriptor).await;
        if let Some((repeat, _)) = world.declined(again)? {
            if !repeat.duplicate || repeat.attempt != admission.attempt {
                return Err(world.fail(format!("a repeated prepare at {sequence} admitted another attempt")));
            }
        }
    }
    Ok(Some(admission.attempt.attempt_id))
}

/// The worker asks how its running attempt stands; answers whether it is still active (a
/// stopped one is acknowledged, at once, later or never; an ended one is over).
async fn supervise(
    world: &mut World,
    held: &mut Held,
    lease: WorkflowLease,
    task: &Task,
    owner: &str,
    attempt_id: ActivityAttemptId,
) -> Result<bool, Failure> {
    let result = local_activities::control(&world.app, lease, attempt_id.clone(), WORKFLOW_LEASE_MS).await;
    match world.declined(result)? {
        Some((Supervised::Stopped(stop), run, _)) => {
            world.seen.acknowledge(&run);
            world.counters.local_attempts[3] += 1;
            let ack = Delivery::AcknowledgeStop {
                task_id: task.id.clone(),
                attempt_id,
                owner: owner.to_string(),
                request_id: stop.request.request_id.to_string(),
                fence: Some(task.fence),
            };
            // Only a faulty worker supervises: its acknowledgement may come late, or never.
            held.hand_over(world, ack, true).await?;
            Ok(false)
        }
        Some((Supervised::Ended { .. }, run, _)) => {
            world.seen.acknowledge(&run);
            Ok(false)
        }
        Some((Supervised::Active(_), _, _)) => Ok(true),
        None => Ok(false),
    }
}

/// The worker reports how the call ended (sometimes twice: a repeat must record the same
/// end); answers whether the claim is still held (the server did not schedule a retry).
async fn report_end(
    world: &mut World,
    lease: WorkflowLease,
    attempt_id: ActivityAttemptId,
    sequence: u32,
    faulty: bool,
) -> Result<bool, Failure> {
    let succeeds = !faulty || world.rng.random_bool(0.6);
    let report = match succeeds {
        true => LocalReport::Completed(Payload::avro(PAYLOAD)),
        false => LocalReport::Failed {
            message: "simulated local failure".into(),
            exception_type: Some("SimulatedError".into()),
            non_retryable: false,
        },
    };
    let fingerprint = format!("{succeeds}");
    let result = local_activities::outcome(&world.app, lease.clone(), attempt_id.clone(), report.clone(), fingerprint.clone()).await;
    let Some((receipt, run)) = world.declined(result)? else {
        return Ok(false);
    };
    world.seen.acknowledge(&run);
    if faulty && world.rng.random_bool(0.25) {
        let again = local_activities::outcome(&world.app, lease, attempt_id, report, fingerprint).await;
        if let Some((repeat, _)) = world.declined(again)? {
            if !repeat.duplicate || repeat.record != receipt.record {
                return Err(world.fail(format!("a repeated outcome at {sequence} recorded another end")));
            }
        }
    }
    let released = receipt.record.retry_task_id.is_some();
    if released {
        world.counters.local_attempts[1] += 1;
    }
    Ok(!released)
}
