//! A run's own lifecycle: its start, and each way it closes.

use crate::transitions::events::{application_failure, child_retry_snapshot, payload_json, tagged};
use crate::transitions::iso8601;
use crate::{ActivityExecutionId, CancellationRequest, ClosedReason, CommandId, Millis, Payload, RunState, StepTags, WorkflowFailure};
use serde_json::{json, Map, Value};

fn run_identity(run: &RunState) -> Map<String, Value> {
    obj!(
        "workflow_command_id" => run.start_command_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "workflow_type" => run.workflow_type,
        "business_key" => run.business_key,
        "memo" => run.memo,
        "search_attributes" => run.search_attributes,
    )
}

/// `StartAccepted` of run 1 of an instance.
pub(in crate::transitions) fn start_accepted(run: &RunState) -> Map<String, Value> {
    let mut payload = run_identity(run);
    payload.insert("outcome".into(), json!("started_new"));
    payload
}

/// `WorkflowStarted`: how the run was started, and what it continues or retries.
pub(in crate::transitions) fn workflow_started(run: &RunState) -> Map<String, Value> {
    let mut payload = run_identity(run);
    payload.extend(obj!(
        "execution_timeout_seconds" => run.execution_timeout_seconds,
        "run_timeout_seconds" => run.run_timeout_seconds,
        "execution_deadline_at" => run.execution_deadline_at.map(iso8601),
        "run_deadline_at" => run.run_deadline_at.map(iso8601),
        "input_envelope" => payload_json(&run.input),
        "task_queue" => run.task_queue,
        "run_number" => run.run_number,
    ));
    if let Some(previous) = &run.continued_from_run_id {
        payload.insert("continued_from_run_id".into(), json!(previous));
    }
    if let Some(redrive) = &run.redriven_from {
        payload.insert("resume_step_sequence".into(), json!(redrive.resume_step_sequence));
        payload.insert("recovery_kind".into(), json!("redrive"));
        payload.insert("workflow_link_id".into(), json!(redrive.command_id));
    }
    if let Some(contract) = &run.contract {
        payload.extend(contract.declared_fields());
    }
    if let Some(parent) = &run.parent {
        payload.insert("parent_workflow_instance_id".into(), json!(parent.workflow_id));
        payload.insert("parent_workflow_run_id".into(), json!(parent.run_id));
        payload.insert("parent_sequence".into(), json!(parent.sequence));
        if let Some(policy) = &parent.retry_policy {
            payload.insert("retry_policy".into(), child_retry_snapshot(policy));
        }
        if let Some(failed) = &run.retry_of_run_id {
            payload.insert("retry_attempt".into(), json!(parent.attempt));
            payload.insert("retry_of_child_workflow_run_id".into(), json!(failed));
        }
    }
    payload
}

/// `WorkflowCompleted` with the workflow's result.
pub(in crate::transitions) fn workflow_completed(result: &Payload) -> Map<String, Value> {
    obj!("output" => result.blob_value(), "payload_codec" => result.codec)
}

/// `WorkflowFailed` of the workflow's own `fail_workflow`.
pub(in crate::transitions) fn workflow_failed(run: &RunState, failure_id: &str, failure: &WorkflowFailure) -> Map<String, Value> {
    let mut payload = obj!(
        "failure_id" => failure_id,
        "source_kind" => "workflow_run",
        "source_id" => run.run_id,
    );
    payload.extend(application_failure(failure));
    if let Some(boundary) = &failure.boundary {
        payload.insert("failed_step_sequence".into(), json!(boundary.failed_step_sequence));
        payload.insert("failed_activity_execution_id".into(), json!(boundary.failed_activity_execution_id));
    }
    payload
}

/// `WorkflowContinuedAsNew` at `step`: `successor` is the instance's next run.
pub(in crate::transitions) fn workflow_continued_as_new(step: u32, successor: &RunState, tags: &StepTags) -> Map<String, Value> {
    let payload = obj!(
        "sequence" => step,
        "continued_to_run_id" => successor.run_id,
        "continued_to_run_number" => successor.run_number,
        "workflow_link_id" => successor.start_command_id,
        "closed_reason" => "continued",
        "workflow_type" => successor.workflow_type,
        "task_queue" => successor.task_queue,
    );
    tagged(payload, tags)
}

/// `WorkflowTimedOut`; `timeout_kind` is `execution_timeout` or `run_timeout`.
pub(in crate::transitions) fn workflow_timed_out(
    run: &RunState,
    failure_id: &str,
    timeout_kind: &str,
    message: &str,
) -> Map<String, Value> {
    obj!(
        "failure_id" => failure_id,
        "timeout_kind" => timeout_kind,
        "failure_category" => "timeout",
        "message" => message,
        "exception_class" => "WorkflowTimedOut",
        "execution_deadline_at" => run.execution_deadline_at.map(iso8601),
        "run_deadline_at" => run.run_deadline_at.map(iso8601),
    )
}

/// The terminal event of a cancel or terminate command.
fn closed_by_command(
    run: &RunState,
    command_id: &CommandId,
    failure_id: &str,
    closed: ClosedReason,
    exception_class: &str,
    reason: Option<&str>,
    message: &str,
) -> Map<String, Value> {
    obj!(
        "workflow_command_id" => command_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "failure_id" => failure_id,
        "failure_category" => closed.as_str(),
        "closed_reason" => closed.as_str(),
        "exception_class" => exception_class,
        "message" => message,
        "reason" => reason,
    )
}

pub(in crate::transitions) enum CancelledBy<'a> {
    /// A cancel command closed the run at once.
    Command {
        command_id: &'a CommandId,
        reason: Option<&'a str>,
    },
    /// A cooperative cancellation: the workflow's cleanup ended with `outcome` (`completed` or
    /// `deadline_expired`, which `reason` says in words) at `finished_at`.
    Cooperative {
        request: &'a CancellationRequest,
        outcome: &'a str,
        reason: &'a str,
        finished_at: Millis,
    },
}

/// `WorkflowCancelled`; `message` is the one the run keeps as its failure.
pub(in crate::transitions) fn workflow_cancelled(run: &RunState, failure_id: &str, by: CancelledBy, message: &str) -> Map<String, Value> {
    match by {
        CancelledBy::Command { command_id, reason } => closed_by_command(
            run,
            command_id,
            failure_id,
            ClosedReason::Cancelled,
            "WorkflowCancelled",
            reason,
            message,
        ),
        CancelledBy::Cooperative {
            request,
            outcome,
            reason,
            finished_at,
        } => obj!(
            "workflow_command_id" => request.request_id,
            "workflow_instance_id" => run.workflow_id,
            "workflow_run_id" => run.run_id,
            "failure_id" => failure_id,
            "failure_category" => "cancelled",
            "closed_reason" => "cancelled",
            "exception_class" => "WorkflowCancelled",
            "outcome" => outcome,
            "reason" => reason,
            "message" => message,
            "cancellation_cleanup" => json!({
                "request_id": request.request_id,
                "outcome": outcome,
                "cleanup_deadline_at": iso8601(request.cleanup_deadline_at),
                "delivery_sequence": request.delivery.as_ref().map(|d| d.sequence),
                "finished_at": iso8601(finished_at),
            }),
        ),
    }
}

/// `WorkflowTerminated`; `message` is the one the run keeps as its failure.
pub(in crate::transitions) fn workflow_terminated(
    run: &RunState,
    failure_id: &str,
    command_id: &CommandId,
    reason: Option<&str>,
    message: &str,
) -> Map<String, Value> {
    closed_by_command(
        run,
        command_id,
        failure_id,
        ClosedReason::Terminated,
        "WorkflowTerminated",
        reason,
        message,
    )
}

/// `WorkflowFailed` of a standalone activity's host run: its activity's final failure.
pub(in crate::transitions) fn host_run_failed(
    failure_id: &str,
    failure: &WorkflowFailure,
    execution_id: &ActivityExecutionId,
    timed_out: bool,
) -> Map<String, Value> {
    let mut payload = obj!(
        "failure_id" => failure_id,
        "source_kind" => "activity_execution",
        "source_id" => execution_id,
    );
    payload.extend(application_failure(failure));
    if timed_out {
        payload.insert("failure_category".into(), json!("timeout"));
    }
    payload
}
