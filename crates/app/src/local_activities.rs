//! Prepared local activities (`capstan_engine::local_activity`): a worker that registered
//! [`CAPABILITY`] asks before it runs a local activity, supervises the attempt under its workflow
//! task's lease, and reports how it ended; the server records each step and owns retries and
//! timeouts. Every use case names the workflow task claim it comes on.

use crate::reports::{admit_commands, WorkflowLease};
use crate::{AppResult, Services};
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::{RunLocator, StoreError};

/// The worker capability of runtimes that prepare local activities (with cooperative
/// cancellation, which the SDKs require alongside it).
pub const CAPABILITY: &str = "prepared_local_activities";

/// Admits an attempt of the prepared call at `sequence`.
pub async fn prepare<V: Services>(
    services: &V,
    lease: WorkflowLease,
    sequence: u32,
    worker_attempt_id: String,
    descriptor: LocalDescriptor,
) -> AppResult<(LocalAdmission, RunState)> {
    require_capability(services, &lease).await?;
    let done = on_claim(services, &lease, move |run, cx, claim| {
        prepare_local_activity(run, cx, claim, sequence, &worker_attempt_id, descriptor)
    })
    .await?;
    Ok(done)
}

/// Ends the unfinished attempt of the call at `sequence`, whose claim was lost.
pub async fn recover<V: Services>(
    services: &V,
    lease: WorkflowLease,
    sequence: u32,
    descriptor: LocalDescriptor,
) -> AppResult<(LocalRecordReceipt, RunState)> {
    require_capability(services, &lease).await?;
    let done = on_claim(services, &lease, move |run, cx, claim| {
        recover_local_activity(run, cx, claim, sequence, &descriptor)
    })
    .await?;
    Ok(done)
}

/// Commits the authored commands before a prepared call, on the claim.
pub async fn checkpoint<V: Services>(
    services: &V,
    lease: WorkflowLease,
    checkpoint_id: String,
    start_sequence: u32,
    commands: Vec<WorkflowCommand>,
) -> AppResult<(CheckpointReceipt, RunState)> {
    require_capability(services, &lease).await?;
    admit_commands(services, &lease.namespace, &commands).await?;
    let done = on_claim(services, &lease, move |run, cx, claim| {
        checkpoint_local_prefix(run, cx, claim, &checkpoint_id, start_sequence, commands)
    })
    .await?;
    Ok(done)
}

/// Admits a parallel group with local members at once, on the claim.
pub async fn checkpoint_group<V: Services>(
    services: &V,
    lease: WorkflowLease,
    checkpoint_id: String,
    start_sequence: u32,
    members: Vec<GroupMember>,
) -> AppResult<(CheckpointReceipt, RunState)> {
    require_capability(services, &lease).await?;
    let mut commands: Vec<&WorkflowCommand> = Vec::new();
    for member in &members {
        if let GroupMember::Command(command) = member {
            commands.push(command);
        }
    }
    let actions = admit_commands(services, &lease.namespace, commands).await?;
    let done = on_claim(services, &lease, move |run, cx, claim| {
        cx.serve(RequestContext::completion(None, actions, None));
        checkpoint_local_group(run, cx, claim, &checkpoint_id, start_sequence, members)
    })
    .await?;
    Ok(done)
}

/// Supervises a running attempt and keeps its claim's lease for `lease_ms` (0: the worker did
/// not ask for a renewal); answers also whether anything was written. A lease less than a
/// third used is confirmed from the run as it stands (a read: workers supervise about once a
/// second); an older one is extended, and an attempt past a deadline ended (writes).
pub async fn control<V: Services>(
    services: &V,
    lease: WorkflowLease,
    attempt_id: ActivityAttemptId,
    lease_ms: i64,
) -> AppResult<(Supervised, RunState, bool)> {
    let now = services.now();
    if let Some(run) = services
        .store()
        .load_run(&lease.namespace, RunLocator::Task(lease.task_id.clone()))
        .await?
    {
        let standing = local_activity_status(&run, now, claim_of(&lease), &attempt_id)?;
        if standing.answerable(now, lease_ms) {
            let answer = match standing.stopped {
                Some(stop) => Supervised::Stopped(stop),
                None => Supervised::Active(LocalSupervision {
                    renewed: lease_ms > 0,
                    ..standing.view
                }),
            };
            return Ok((answer, run, false));
        }
    }
    let (supervised, run) = on_claim(services, &lease, move |run, cx, claim| {
        control_local_activity(run, cx, claim, &attempt_id, lease_ms)
    })
    .await?;
    Ok((supervised, run, true))
}

/// Records a running attempt's progress.
pub async fn heartbeat<V: Services>(
    services: &V,
    lease: WorkflowLease,
    attempt_id: ActivityAttemptId,
    progress: Option<LocalProgress>,
) -> AppResult<(Supervised, RunState)> {
    let done = on_claim(services, &lease, move |run, cx, claim| {
        heartbeat_local_activity(run, cx, claim, &attempt_id, progress.as_ref())
    })
    .await?;
    Ok(done)
}

/// Records how an attempt's callback ended (`fingerprint` identifies the report for repeats).
pub async fn outcome<V: Services>(
    services: &V,
    lease: WorkflowLease,
    attempt_id: ActivityAttemptId,
    report: LocalReport,
    fingerprint: String,
) -> AppResult<(LocalRecordReceipt, RunState)> {
    let done = on_claim(services, &lease, move |run, cx, claim| {
        report_local_outcome(run, cx, claim, &attempt_id, &report, &fingerprint)
    })
    .await?;
    Ok(done)
}

/// Records that the worker stopped the callback of an attempt a cancellation stopped (a repeat
/// gets the first receipt).
pub async fn acknowledge_stop<V: Services>(
    services: &V,
    lease: WorkflowLease,
    attempt_id: ActivityAttemptId,
    request_id: String,
) -> AppResult<(StopReceipt, RunState)> {
    let done = on_claim(services, &lease, move |run, cx, claim| {
        acknowledge_local_stop(run, cx, claim, &attempt_id, &request_id)
    })
    .await?;
    Ok(done)
}

fn claim_of(lease: &WorkflowLease) -> LocalClaim<'_> {
    LocalClaim {
        task_id: &lease.task_id,
        owner: &lease.owner,
        attempt: lease.attempt,
    }
}

/// Runs `transition` on the run whose workflow task `lease` names, with the claim.
async fn on_claim<V: Services, T, F>(services: &V, lease: &WorkflowLease, transition: F) -> Result<(T, RunState), StoreError>
where
    T: Send + 'static,
    F: FnOnce(&mut RunState, &mut Cx, LocalClaim) -> Result<T, Refusal> + Send + 'static,
{
    let owned = lease.clone();
    services
        .store()
        .mutate_run(
            &lease.namespace,
            RunLocator::Task(lease.task_id.clone()),
            services.now(),
            move |run, cx| transition(run, cx, claim_of(&owned)),
        )
        .await
}

/// Admission needs a registration that listed [`CAPABILITY`] and cooperative cancellation.
async fn require_capability<V: Services>(services: &V, lease: &WorkflowLease) -> AppResult<()> {
    let worker = services.store().get_worker(&lease.namespace, &lease.owner).await?;
    let capable = worker.is_some_and(|w| w.has_capability(CAPABILITY) && w.has_capability(crate::cancellation::CAPABILITY));
    if capable {
        return Ok(());
    }
    Err(Refusal::new(
        Reason::PreparedLocalActivityNotSupported,
        "The worker holding the claim did not register prepared_local_activities with cooperative_cancellation.",
    )
    .with("required_capability", CAPABILITY)
    .with("minimum_protocol_version", "1.20")
    .with("worker_id", lease.owner.clone())
    .into())
}
