//! `complete_update` and `fail_update`: an update handler's result.

use super::*;

pub(super) fn accepted_update(run: &RunState, update_id: &str) -> Result<UpdateRecord, Refusal> {
    match run.updates.get(update_id) {
        Some(record) if record.status == UpdateStatus::Accepted => Ok(record.clone()),
        Some(_) => Err(invalid(format!("Update {update_id} is already settled."))),
        None => Err(invalid(format!("Update {update_id} is not known on this run."))),
    }
}

/// `UpdateApplied` and `UpdateCompleted`; a regular task follows to re-evaluate the workflow.
pub(super) fn complete_update(run: &mut RunState, cx: &mut Cx, at: At, update_id: String, result: Payload) -> Result<(), Refusal> {
    let wt = at.task;
    let record = accepted_update(run, &update_id)?;
    let wait_step = run.condition_waits.last().map(|w| w.step);
    let mut identity = obj!(
        "workflow_command_id" => record.command_id,
        "update_id" => update_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "update_name" => record.update_name,
    );
    if let Some(step) = wait_step {
        identity.insert("sequence".into(), json!(step));
    }
    let mut applied = identity.clone();
    applied.insert("arguments".into(), payload_json(&record.arguments));
    run.append(cx, EventType::UpdateApplied, applied, wt, Some(&record.command_id));
    let mut completed = identity;
    completed.insert("result".into(), json!(result.blob));
    completed.insert("payload_codec".into(), json!(result.codec));
    run.append(cx, EventType::UpdateCompleted, completed, wt, Some(&record.command_id));
    let stored = run.updates.get_mut(&update_id).expect("checked");
    stored.status = UpdateStatus::Completed;
    stored.closed_at = Some(cx.now);
    stored.result = Some(result);
    // A regular task follows, re-evaluating whatever the handler changed.
    run.pending_resumes.push_back(ResumeContext::AfterUpdate { update_id });
    Ok(())
}

/// `UpdateCompleted` with the handler's failure (no `UpdateApplied`).
pub(super) fn fail_update(run: &mut RunState, cx: &mut Cx, at: At, update_id: String, failure: WorkflowFailure) -> Result<(), Refusal> {
    let wt = at.task;
    let record = accepted_update(run, &update_id)?;
    let payload = obj!(
        "workflow_command_id" => record.command_id,
        "update_id" => update_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "update_name" => record.update_name,
        "failure_category" => "application",
        "non_retryable" => failure.non_retryable,
        "exception_type" => failure.exception_type,
        "exception_class" => failure.exception_class.clone().or_else(|| failure.exception_type.clone()),
        "message" => failure.message,
        "exception" => failure.exception,
    );
    run.append(cx, EventType::UpdateCompleted, payload, wt, Some(&record.command_id));
    let stored = run.updates.get_mut(&update_id).expect("checked");
    stored.status = UpdateStatus::Failed;
    stored.closed_at = Some(cx.now);
    stored.failure = Some(failure);
    Ok(())
}
