//! Redrive: a failed run resumed at its failed step, after a fix (see `capstan_engine::redrive`).

use crate::{AppError, AppResult, Services};
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::RunLocator;

/// DW's bound on a redrive's `request_id`.
pub const REQUEST_ID_BYTES_MAX: usize = 191;

#[derive(Clone, Debug)]
pub struct RedriveRequest {
    pub namespace: String,
    pub workflow_id: String,
    /// The failed run.
    pub run_id: String,
    pub request_id: Option<String>,
    /// Who asked: the successor's events record it.
    pub principal: Option<Principal>,
}

/// Redrives a failed run: at most one successor per source, so a repeated request (whatever
/// its `request_id`) answers with the first redrive (`fresh: false`).
pub async fn redrive<V: Services>(services: &V, request: RedriveRequest) -> AppResult<RedriveOutcome> {
    if request.request_id.as_ref().is_some_and(|id| id.len() > REQUEST_ID_BYTES_MAX) {
        return Err(AppError::invalid(
            "request_id",
            format!("The request_id must be at most {REQUEST_ID_BYTES_MAX} bytes."),
        ));
    }
    let store = services.store();
    let namespace = request.namespace.as_str();
    let workflow_id = WorkflowId(request.workflow_id.clone());
    let current = store
        .load_run(namespace, RunLocator::Current(workflow_id.clone()))
        .await?
        .ok_or_else(|| Refusal::new(Reason::InstanceNotFound, "Workflow not found.").with("workflow_id", request.workflow_id.clone()))?;
    let source = match current.run_id.as_str() == request.run_id {
        true => current.clone(),
        false => store
            .load_run(namespace, RunLocator::Run(workflow_id.clone(), RunId(request.run_id.clone())))
            .await?
            .ok_or_else(|| Refusal::new(Reason::RunNotFound, "Workflow run not found.").with("run_id", request.run_id.clone()))?,
    };
    if let Some(done) = &source.redriven_to {
        return Ok(RedriveOutcome {
            redrive: done.clone(),
            fresh: false,
        });
    }
    // Workflow ids are never reused and only a redrive gives a failed run a successor, so a
    // source that is not current now never becomes current again.
    if source.run_id != current.run_id {
        return Err(
            Refusal::new(Reason::SourceRunNotCurrent, "Only the instance's current run can be redriven.")
                .with("current_run_id", current.run_id.as_str())
                .into(),
        );
    }
    if source.status != RunStatus::Failed {
        return Err(Refusal::new(Reason::RunNotFailed, "Only a failed run can be redriven.")
            .with("status", source.status.as_str())
            .into());
    }
    // A closed run's history no longer changes: it is read outside the transaction, which
    // checks that the run still has exactly these events.
    let events = store
        .history(&source.run_id, 0, source.last_sequence, source.last_sequence as usize)
        .await?;
    let plan = redrive_plan(&events, source.failure.as_ref().and_then(|f| f.boundary.as_ref()))?;
    let command_id = CommandId(services.new_id());
    let (request_id, principal) = (request.request_id, request.principal);
    let locator = RunLocator::Run(workflow_id, source.run_id.clone());
    let (outcome, _) = store
        .mutate_run(namespace, locator, services.now(), move |run, cx| {
            cx.serve(RequestContext::acting_for(principal));
            capstan_engine::redrive(run, cx, &plan, command_id, request_id)
        })
        .await?;
    Ok(outcome)
}
