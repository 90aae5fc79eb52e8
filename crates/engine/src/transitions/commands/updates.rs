//! `complete_update` and `fail_update`: an update handler's result.

use crate::transitions::commands::At;
use crate::transitions::{events, invalid, UpdateEnd, UpdateRef};
use crate::{Cx, EventType, Payload, Refusal, ResumeContext, RunState, UpdateRecord, UpdateStatus, WorkflowFailure};

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
    let update = UpdateRef::of(&record, &update_id);
    let applied = events::update_applied(run, &update, wait_step, &record.arguments);
    let completed = events::update_completed(
        run,
        &update,
        UpdateEnd::Completed {
            result: &result,
            wait_step,
        },
    );
    run.append(cx, EventType::UpdateApplied, applied, wt, Some(&record.command_id));
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
    let payload = events::update_completed(run, &UpdateRef::of(&record, &update_id), UpdateEnd::Failed(&failure));
    run.append(cx, EventType::UpdateCompleted, payload, wt, Some(&record.command_id));
    let stored = run.updates.get_mut(&update_id).expect("checked");
    stored.status = UpdateStatus::Failed;
    stored.closed_at = Some(cx.now);
    stored.failure = Some(failure);
    Ok(())
}
