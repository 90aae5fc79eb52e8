//! What workers report on the tasks they leased: workflow task completions, failures and
//! heartbeats; activity completions, failures and heartbeats.
//!
//! Every report names its lease (owner and fence or attempt id); the engine refuses a stale
//! one without recording anything. A refused activity report from an attempt whose declared
//! action is already `outcome_unknown` is attached to that ledger entry as evidence (the
//! refusal stands): an operator deciding the outcome sees what the worker said, late.

use crate::{search_attributes, service_calls};
use crate::{AppError, AppResult, Services};
use capstan_engine::service_call::ServiceDirectory;
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::{RunLocator, StoreError};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A workflow task lease as its holder names it.
#[derive(Clone, Debug)]
pub struct WorkflowLease {
    pub namespace: String,
    pub task_id: TaskId,
    pub owner: String,
    /// The fence (`workflow_task_attempt`).
    pub attempt: u64,
    /// Who reports, as the server authenticated them: recorded on the events the report causes.
    pub principal: Option<Principal>,
}

/// Applies a workflow task's commands. Upserted search attributes are checked against the
/// namespace's schema first; scheduling a declared action pins its definition. A `sticky`
/// claim (the worker keeps the run in its replay cache) must come from a worker registered for
/// sticky execution, name its lease and run, and its build; it becomes the run's affinity.
pub async fn complete_workflow_task<V: Services>(
    services: &V,
    lease: WorkflowLease,
    commands: Vec<WorkflowCommand>,
    sticky: Option<StickyClaim>,
    streams: StreamProgress,
) -> AppResult<(Receipt, RunState)> {
    if let Some(claim) = &sticky {
        check_sticky_registration(services, &lease, claim).await?;
    }
    let actions = admit_commands(services, &lease.namespace, &commands).await?;
    capstan_pause::point(capstan_pause::WORKFLOW_TASK_COMPLETING);
    if !service_calls::calls_services(&commands) {
        return apply_completion(services, lease, commands, sticky, streams, actions, None).await;
    }
    // A concurrent admission of a call's idempotency key (or a binding's instance id) rolls
    // the completion back; applied again, it reads and joins what was admitted.
    let mut attempt = 1;
    loop {
        let directory = service_calls::directory(services, &lease.namespace, &commands).await?;
        let applied = apply_completion(
            services,
            lease.clone(),
            commands.clone(),
            sticky.clone(),
            streams.clone(),
            actions.clone(),
            Some(directory),
        )
        .await;
        match applied {
            Err(AppError::Store(StoreError::Conflict { .. })) if attempt < service_calls::ADMISSION_ATTEMPTS => attempt += 1,
            other => return other,
        }
    }
}

async fn apply_completion<V: Services>(
    services: &V,
    lease: WorkflowLease,
    commands: Vec<WorkflowCommand>,
    sticky: Option<StickyClaim>,
    streams: StreamProgress,
    actions: Option<Arc<BTreeMap<String, ActionDefinition>>>,
    directory: Option<Arc<ServiceDirectory>>,
) -> AppResult<(Receipt, RunState)> {
    let WorkflowLease {
        owner, attempt, principal, ..
    } = lease.clone();
    let done = on_task(services, &lease.namespace, &lease.task_id, move |run, cx, task_id| {
        cx.serve(RequestContext::completion(principal, actions, directory));
        if let Some(claim) = &sticky {
            capstan_engine::check_sticky_claim(run, &owner, claim)?;
        }
        let claim = WorkflowClaim {
            task_id,
            owner: &owner,
            attempt,
        };
        let receipt = capstan_engine::complete_workflow_task_with(run, cx, claim, commands, &streams)?;
        // A repeated completion is answered from its receipt and changes nothing, the affinity
        // included (its task rows were written with the first one's).
        if !receipt.retained {
            capstan_engine::record_sticky_claim(run, cx.now, sticky);
        }
        Ok(receipt)
    })
    .await?;
    Ok(done)
}

/// What applying `commands` needs read first: their upserted search attributes are checked
/// against the namespace's schema, and the action definitions are read when they schedule
/// activities (scheduling a declared action pins its definition).
pub(crate) async fn admit_commands<'c, V: Services>(
    services: &V,
    namespace: &str,
    commands: impl IntoIterator<Item = &'c WorkflowCommand>,
) -> AppResult<Option<Arc<BTreeMap<String, ActionDefinition>>>> {
    let mut schedules = false;
    for command in commands {
        match command {
            WorkflowCommand::UpsertSearchAttributes { attributes, .. } => {
                search_attributes::check_defined(services, namespace, "commands.upsert_search_attributes", attributes).await?;
            }
            WorkflowCommand::ScheduleActivity(_) => schedules = true,
            _ => {}
        }
    }
    if !schedules {
        return Ok(None);
    }
    Ok(Some(action_catalog(services, namespace).await?).filter(|catalog| !catalog.is_empty()))
}

/// A sticky claim comes from a worker that registered the `sticky_execution` capability, for
/// the build it registered (its `build_id`, else its SDK version, as the SDKs key their cache).
async fn check_sticky_registration<V: Services>(services: &V, lease: &WorkflowLease, claim: &StickyClaim) -> AppResult<()> {
    let worker = services.store().get_worker(&lease.namespace, &lease.owner).await?.ok_or_else(|| {
        Refusal::new(Reason::WorkerNotRegistered, "Register the worker before claiming runs.").with("worker_id", lease.owner.clone())
    })?;
    let declared = worker.has_capability("sticky_execution");
    if !declared {
        return Err(Refusal::new(
            Reason::WorkerCapabilityNotSupported,
            "The worker did not register the sticky_execution capability.",
        )
        .with("capability", "sticky_execution")
        .into());
    }
    let registered_build = worker.build_id.clone().or(worker.sdk_version.clone()).unwrap_or_default();
    if claim.build_id.trim() != registered_build.trim() {
        return Err(Refusal::new(
            Reason::StickyCacheIdentityMismatch,
            "The sticky_cache claim's build_id is not the worker's registered build.",
        )
        .with("field", "sticky_cache.build_id")
        .with("registered_build_id", registered_build)
        .into());
    }
    Ok(())
}

/// Fails a workflow task (offered again after backoff; "waiting for history" closes it).
pub async fn fail_workflow_task<V: Services>(
    services: &V,
    lease: WorkflowLease,
    failure: WorkflowTaskFailure,
) -> AppResult<(Receipt, RunState)> {
    let WorkflowLease {
        owner, attempt, principal, ..
    } = lease.clone();
    let done = on_task(services, &lease.namespace, &lease.task_id, move |run, cx, task_id| {
        cx.serve(RequestContext::acting_for(principal));
        capstan_engine::fail_workflow_task(run, cx, task_id, &owner, attempt, failure)
    })
    .await?;
    Ok(done)
}

/// Extends a workflow task lease by `lease_ms`.
pub async fn heartbeat_workflow_task<V: Services>(services: &V, lease: WorkflowLease, lease_ms: i64) -> AppResult<(Lease, RunState)> {
    let WorkflowLease { owner, attempt, .. } = lease.clone();
    let done = on_task(services, &lease.namespace, &lease.task_id, move |run, cx, task_id| {
        capstan_engine::heartbeat_workflow_task(run, cx, task_id, &owner, attempt, lease_ms)
    })
    .await?;
    Ok(done)
}

/// An activity attempt lease as its holder names it.
#[derive(Clone, Debug)]
pub struct AttemptLease {
    pub namespace: String,
    pub task_id: TaskId,
    pub attempt_id: ActivityAttemptId,
    pub owner: String,
    /// Who reports, as the server authenticated them: recorded on the events the report causes.
    pub principal: Option<Principal>,
}

/// Records an attempt's result.
pub async fn complete_activity<V: Services>(services: &V, lease: AttemptLease, result: Payload) -> AppResult<(Receipt, RunState)> {
    let evidence = json!({"report": "completed", "result_hash": ledger::digest(result.identity()), "lease_owner": lease.owner});
    let (attempt_id, owner, principal) = (lease.attempt_id.clone(), lease.owner.clone(), lease.principal.clone());
    capstan_pause::point(capstan_pause::ACTIVITY_REPORTING);
    let outcome = on_task(services, &lease.namespace, &lease.task_id, move |run, cx, task_id| {
        cx.serve(RequestContext::acting_for(principal));
        capstan_engine::complete_activity(run, cx, task_id, &attempt_id, &owner, result)
    })
    .await;
    settle_report(services, &lease, evidence, outcome).await
}

/// Records an attempt's failure (retried by its policy, or the activity fails).
pub async fn fail_activity<V: Services>(services: &V, lease: AttemptLease, failure: ActivityFailure) -> AppResult<(Receipt, RunState)> {
    let evidence =
        json!({"report": "failed", "message": failure.message, "exception_type": failure.failure_type, "lease_owner": lease.owner});
    let (attempt_id, owner, principal) = (lease.attempt_id.clone(), lease.owner.clone(), lease.principal.clone());
    capstan_pause::point(capstan_pause::ACTIVITY_REPORTING);
    let outcome = on_task(services, &lease.namespace, &lease.task_id, move |run, cx, task_id| {
        cx.serve(RequestContext::acting_for(principal));
        capstan_engine::fail_activity(run, cx, task_id, &attempt_id, &owner, failure)
    })
    .await;
    settle_report(services, &lease, evidence, outcome).await
}

/// Extends an attempt's lease by `lease_ms` and records its progress `details`.
pub async fn heartbeat_activity<V: Services>(
    services: &V,
    lease: AttemptLease,
    lease_ms: i64,
    details: Option<Value>,
) -> AppResult<(ActivityHeartbeat, RunState)> {
    let done = on_attempt(services, lease, move |run, cx, task_id, attempt_id, owner| {
        capstan_engine::heartbeat_activity(run, cx, task_id, attempt_id, owner, lease_ms, details)
    })
    .await?;
    Ok(done)
}

/// Renews an activity attempt's lease without recording progress. A lease less than a third
/// used is confirmed from the run as it stands (a read); an older one is extended (a write).
/// `now` is when the request arrived, the instant its reply's `server_time` names.
pub async fn renew_activity_lease<V: Services>(
    services: &V,
    lease: AttemptLease,
    lease_ms: i64,
    now: Millis,
) -> AppResult<(ActivityLeaseGrant, RunState)> {
    let store = services.store();
    if let Some(run) = store.load_run(&lease.namespace, RunLocator::Task(lease.task_id.clone())).await? {
        let held = confirm_activity_lease(&run, now, &lease.task_id, &lease.attempt_id, &lease.owner, lease_ms)?;
        if let Some(grant) = held {
            return Ok((grant, run));
        }
    }
    let done = on_attempt(services, lease, move |run, cx, task_id, attempt_id, owner| {
        capstan_engine::renew_activity_lease(run, cx, task_id, attempt_id, owner, lease_ms)
    })
    .await?;
    Ok(done)
}

/// Runs `transition` on the run that owns the attempt `lease` names, with the lease's task,
/// attempt and owner.
pub(crate) async fn on_attempt<V: Services, T, F>(services: &V, lease: AttemptLease, transition: F) -> Result<(T, RunState), StoreError>
where
    T: Send + 'static,
    F: FnOnce(&mut RunState, &mut Cx, &TaskId, &ActivityAttemptId, &str) -> Result<T, Refusal> + Send + 'static,
{
    let AttemptLease {
        namespace,
        task_id,
        attempt_id,
        owner,
        principal,
    } = lease;
    on_task(services, &namespace, &task_id, move |run, cx, task_id| {
        cx.serve(RequestContext::acting_for(principal));
        transition(run, cx, task_id, &attempt_id, &owner)
    })
    .await
}

/// Runs `transition` on the run that owns `task_id`, now: every report is a transition on
/// the run its lease names.
async fn on_task<V: Services, T, F>(services: &V, namespace: &str, task_id: &TaskId, transition: F) -> Result<(T, RunState), StoreError>
where
    T: Send + 'static,
    F: FnOnce(&mut RunState, &mut Cx, &TaskId) -> Result<T, Refusal> + Send + 'static,
{
    let task = task_id.clone();
    services
        .store()
        .mutate_run(namespace, RunLocator::Task(task_id.clone()), services.now(), move |run, cx| {
            transition(run, cx, &task)
        })
        .await
}

/// A refused report is attached as evidence to an `outcome_unknown` entry of its attempt.
async fn settle_report<V: Services, T>(
    services: &V,
    lease: &AttemptLease,
    evidence: Value,
    outcome: Result<T, StoreError>,
) -> AppResult<T> {
    match outcome {
        Ok(done) => Ok(done),
        Err(error @ StoreError::Refused(_)) => {
            attach_late_report(services, lease, evidence).await;
            Err(error.into())
        }
        Err(error) => Err(error.into()),
    }
}

/// Attaches a late report through the instance's current run (only it extends the instance's
/// chain). Best effort: the report's own refusal is what the worker hears either way.
async fn attach_late_report<V: Services>(services: &V, lease: &AttemptLease, evidence: Value) {
    let store = services.store();
    let holder = store.load_run(&lease.namespace, RunLocator::Task(lease.task_id.clone())).await;
    let entry = holder.ok().flatten().and_then(|run| {
        run.ledger
            .values()
            .find(|e| e.activity_attempt_id == lease.attempt_id && e.state == LedgerState::OutcomeUnknown)
            .cloned()
    });
    let Some(entry) = entry else { return };
    let attempt = lease.attempt_id.clone();
    let attached = store
        .mutate_run(
            &lease.namespace,
            RunLocator::Current(entry.workflow_id.clone()),
            services.now(),
            move |run, cx| {
                if run.run_id == entry.run_id {
                    capstan_engine::attach_late_report(run, cx, &attempt, evidence)
                } else {
                    capstan_engine::attach_earlier_late_report(run, cx, entry, evidence)
                }
            },
        )
        .await;
    if let Ok((true, run)) = attached {
        tracing::warn!(namespace = %lease.namespace, workflow_id = %run.workflow_id, task_id = %lease.task_id,
            activity_attempt_id = %lease.attempt_id, "late activity report attached to its ledger entry as evidence");
    }
}

/// The namespace's declared actions by activity type.
pub async fn action_catalog<V: Services>(services: &V, namespace: &str) -> AppResult<Arc<BTreeMap<String, ActionDefinition>>> {
    let definitions = services.store().action_definitions(namespace).await?;
    Ok(Arc::new(definitions.into_iter().map(|d| (d.activity_type.clone(), d)).collect()))
}
