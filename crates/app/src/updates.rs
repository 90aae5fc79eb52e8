//! Updates: `UpdateAccepted` (or `UpdateRejected`) is recorded at once; a dedicated workflow
//! task runs the handler. An update whose run's contract declares a validator is put to a
//! validating worker first: the caller supplies that round trip (the server puts a validation
//! task to a worker and waits for its verdict), and its verdict is recorded only if the run did
//! not move on meanwhile.

use crate::control::{apply, check_target, Receipt, Target};
use crate::{contracts, AppError, Services};
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::{intent_hash, CommandKey, RunLocator};
use serde_json::{json, Value};
use std::future::Future;

pub struct UpdateRequest {
    pub target: Target,
    pub update_name: String,
    pub input: Payload,
    pub request_id: Option<String>,
    /// The caller's trace context, recorded on `UpdateAccepted`.
    pub trace: Option<TraceContext>,
    /// Who asks, as the server authenticated them: recorded on the update's events.
    pub principal: Option<Principal>,
}

/// A validating worker's answer.
pub enum Verdict {
    Approved,
    Rejected(UpdateRejection),
}

/// An update recorded (accepted or rejected), or answered from an earlier request's receipt.
pub struct Admitted {
    pub update_id: String,
    pub run_id: String,
    pub retained: bool,
    /// The run as the application left it (`None` when answered from a receipt).
    pub run: Option<RunState>,
}

/// Records an update. `validate` is called (at most once) when the run's contract declares a
/// validator for it and the request was not decided before; its error is the request's error.
pub async fn update<V, E, F, Fut>(services: &V, request: UpdateRequest, validate: F) -> Result<Admitted, E>
where
    V: Services,
    E: From<AppError>,
    F: FnOnce(RunState) -> Fut,
    Fut: Future<Output = Result<Verdict, E>>,
{
    let UpdateRequest {
        target,
        update_name,
        input,
        request_id,
        trace,
        principal,
    } = request;
    if update_name.is_empty() || update_name.len() > 255 {
        return Err(AppError::invalid("update_name", "The update name must be 1 to 255 characters.").into());
    }
    let store = services.store();
    let namespace = target.namespace.as_str();
    let workflow_id = WorkflowId(target.workflow_id.clone());
    let locator = RunLocator::Current(workflow_id.clone());
    let key = request_id.filter(|r| !r.is_empty()).map(|request_id| CommandKey {
        command_type: "update".into(),
        intent_hash: intent_hash(&[&update_name, &input.codec, input.identity(), target.run_id.as_deref().unwrap_or("")]),
        request_id,
    });
    let command_id = CommandId(services.new_id());
    // A retry of a request already decided gets that decision from its receipt, unvalidated.
    let decided = match &key {
        Some(key) => store
            .retained_command(namespace, &workflow_id, &key.command_type, &key.request_id)
            .await
            .map_err(AppError::from)?
            .is_some(),
        None => false,
    };
    let current = store.load_run(namespace, locator.clone()).await.map_err(AppError::from)?;
    let fallback = contracts::fallback_of(store, namespace, current.as_ref())
        .await
        .map_err(AppError::from)?;
    let wanted = target.run_id.clone();
    let verdict = match current {
        Some(run) if !decided && !run.is_closed() && check_target(&run, wanted.as_deref()).is_ok() => {
            match admission_contract(&run, fallback.for_run(&run)) {
                Some(contract) if contract.validates_update(&update_name) => {
                    let validated_run = run.run_id.clone();
                    Some((validated_run, validate(run).await?))
                }
                _ => None,
            }
        }
        _ => None,
    };
    let name = update_name;
    let transition = move |run: &mut RunState, cx: &mut Cx| {
        cx.serve(RequestContext::traced(principal, trace));
        check_target(run, wanted.as_deref())?;
        admit_update(run, &name, fallback.for_run(run))?;
        match verdict {
            None => accept_update(run, cx, &name, input, command_id),
            Some((validated_run, _)) if validated_run != run.run_id => Err(Refusal::new(
                Reason::StaleValidation,
                "The run changed while the update was being validated; send it again.",
            )
            .with("validated_run_id", validated_run.as_str())
            .with("retryable", true)),
            Some((_, Verdict::Approved)) => accept_update(run, cx, &name, input, command_id),
            Some((_, Verdict::Rejected(rejection))) => reject_update(run, cx, &name, input, rejection, command_id),
        }
    };
    let render = |(update_id, receipt): &(String, CommandReceipt), run: &RunState| -> Value {
        json!({"update_id": update_id, "run_id": run.run_id, "command_id": receipt.command_id, "command_sequence": receipt.command_sequence})
    };
    let Receipt { body, retained, run } = apply(services, namespace, locator, key, transition, render).await?;
    Ok(Admitted {
        update_id: body["update_id"].as_str().unwrap_or_default().to_string(),
        run_id: body["run_id"].as_str().unwrap_or_default().to_string(),
        retained,
        run,
    })
}

/// The worker capability a validating worker registers.
pub const VALIDATION_CAPABILITY: &str = "update_validation_tasks";
/// How long an update request waits for a verdict (DW's default).
pub const VALIDATION_WAIT_MS: i64 = 10_000;
/// How long a validation task's lease lasts: the worker replays the run and judges within it.
pub const VALIDATION_LEASE_MS: i64 = 10_000;

/// Why an update cannot be put to a validator now.
pub enum NoValidator {
    /// No worker of the run's queue is alive (it may be soon: retryable).
    NoLiveWorker,
    /// Live workers, but none runs update validators.
    CapabilityUnsupported,
}

/// Puts `update_name(arguments)` on `run` to a validating worker of its queue: the validation
/// task, open until `VALIDATION_WAIT_MS` from now. Waiting for the verdict is the caller's;
/// it forgets the task afterwards ([`crate::queries::forget_query`]).
pub async fn put_validation<S: Services>(
    services: &S,
    run: &RunState,
    update_name: &str,
    arguments: &Payload,
) -> Result<Result<QueryTask, NoValidator>, AppError> {
    let now = services.now();
    let workers = services.store().queue_workers(&run.namespace, &run.task_queue).await?;
    let fresh: Vec<_> = workers
        .into_iter()
        .filter(|w| now - w.last_heartbeat_at <= crate::queries::WORKER_FRESH_MS)
        .collect();
    if fresh.is_empty() {
        return Ok(Err(NoValidator::NoLiveWorker));
    }
    if !fresh.iter().any(|w| w.has_capability(VALIDATION_CAPABILITY)) {
        return Ok(Err(NoValidator::CapabilityUnsupported));
    }
    let task = QueryTask {
        id: services.new_id(),
        kind: QueryKind::UpdateValidation,
        namespace: run.namespace.clone(),
        task_queue: run.task_queue.clone(),
        workflow_id: run.workflow_id.to_string(),
        run_id: run.run_id.to_string(),
        workflow_type: run.workflow_type.clone(),
        query_name: update_name.to_string(),
        arguments: Some(arguments.clone()),
        state: QueryState::Ready,
        attempt: 0,
        created_at: now,
        deadline_at: now + VALIDATION_WAIT_MS,
    };
    services.store().create_query_task(task.clone()).await?;
    Ok(Ok(task))
}
