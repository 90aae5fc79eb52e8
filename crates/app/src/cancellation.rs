//! Cooperative cancellation: a client asks a run to stop ([`request`]); the worker holding its
//! workflow task delivers the request at one authored call ([`deliver`], deferred while
//! activities that wait for their stop are stopping); the worker of an attempt the delivery
//! stopped acknowledges the stop ([`acknowledge_stop`]).

use crate::control::{check_target, Target};
use crate::reports::{AttemptLease, WorkflowLease};
use crate::{AppResult, Services};
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::RunLocator;

/// The worker capability of runtimes that take cancellation requests.
pub const CAPABILITY: &str = "cooperative_cancellation";

/// Records a cooperative cancellation request on the instance's current run (a repeat answers
/// the first). A worker that cannot take the request must not be holding the run's workflow
/// task: it would complete the task without ever delivering the request.
pub async fn request<V: Services>(
    services: &V,
    target: Target,
    reason: Option<String>,
    cleanup_timeout_seconds: i64,
    principal: Option<Principal>,
) -> AppResult<(CancellationOutcome, RunState)> {
    let store = services.store();
    let locator = RunLocator::Current(WorkflowId(target.workflow_id.clone()));
    if let Some(run) = store.load_run(&target.namespace, locator.clone()).await? {
        let holder = run
            .workflow_task
            .as_ref()
            .and_then(|id| run.tasks.get(id))
            .and_then(|task| task.lease())
            .map(|lease| lease.owner.clone());
        if let (None, Some(owner)) = (&run.cancellation, holder) {
            let capable = store
                .get_worker(&target.namespace, &owner)
                .await?
                .is_some_and(|w| w.has_capability(CAPABILITY));
            if !capable {
                return Err(Refusal::new(
                    Reason::ActiveClaimCancellationNotSupported,
                    "The worker holding the run's workflow task does not support cooperative cancellation.",
                )
                .with(
                    "task_id",
                    run.workflow_task.as_ref().map(|t| t.as_str().to_string()).unwrap_or_default(),
                )
                .into());
            }
        }
    }
    let command_id = CommandId(services.new_id());
    let wanted = target.run_id.clone();
    let done = store
        .mutate_run(&target.namespace, locator, services.now(), move |run, cx| {
            cx.serve(RequestContext::acting_for(principal));
            check_target(run, wanted.as_deref())?;
            request_cancellation(run, cx, reason, cleanup_timeout_seconds, command_id)
        })
        .await?;
    Ok(done)
}

/// Delivers the run's request at one authored call, on the workflow task's lease; a call whose
/// activities must stop first defers it and releases the lease.
pub async fn deliver<V: Services>(services: &V, lease: WorkflowLease, delivery: DeliveryRequest) -> AppResult<(DeliveryOutcome, RunState)> {
    let WorkflowLease {
        namespace,
        task_id,
        owner,
        attempt,
        principal,
    } = lease;
    let done = services
        .store()
        .mutate_run(&namespace, RunLocator::Task(task_id.clone()), services.now(), move |run, cx| {
            cx.serve(RequestContext::acting_for(principal));
            deliver_cancellation(run, cx, &task_id, &owner, attempt, delivery)
        })
        .await?;
    Ok(done)
}

/// Records that the worker of an attempt a delivery stopped has stopped its callback
/// (`request_id` names the cancellation); a repeat gets the first receipt.
pub async fn acknowledge_stop<V: Services>(services: &V, lease: AttemptLease, request_id: String) -> AppResult<(StopReceipt, RunState)> {
    let done = crate::reports::on_attempt(services, lease, move |run, cx, task_id, attempt_id, owner| {
        acknowledge_activity_cancellation(run, cx, task_id, attempt_id, owner, &request_id)
    })
    .await?;
    Ok(done)
}
