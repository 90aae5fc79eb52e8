//! Child workflow events on the parent's side: the start, the retry of a failed child run, its
//! resolution, and the parent-close policy.

use crate::transitions::events::tagged;
use crate::transitions::iso8601;
use crate::{ChildLink, ChildOutcome, ChildRetry, ClosedReason, Payload, RetryPolicy, RunState, StartChild};
use serde_json::{json, Map, Value};

/// DW's record of a child retry policy (`max_attempts` absent means one attempt).
pub(in crate::transitions) fn child_retry_snapshot(policy: &RetryPolicy) -> Value {
    json!({
        "snapshot_version": 1,
        "max_attempts": policy.max_attempts.unwrap_or(1),
        "backoff_seconds": policy.backoff_seconds,
        "non_retryable_error_types": policy.non_retryable_error_types,
    })
}

/// `ChildWorkflowScheduled`: `child` is the child's first run, started by `start` at `step`.
pub(in crate::transitions) fn child_workflow_scheduled(step: u32, child: &RunState, start: &StartChild) -> Map<String, Value> {
    let mut payload = obj!(
        "sequence" => step,
        "child_workflow_instance_id" => child.workflow_id,
        "child_workflow_run_id" => child.run_id,
        "child_workflow_type" => child.workflow_type,
        "child_call_id" => child.start_command_id,
        "workflow_link_id" => child.start_command_id,
        "parent_close_policy" => start.parent_close_policy,
        "cancellation_policy" => start.cancellation_policy,
        "task_queue" => child.task_queue,
    );
    if let Some(policy) = &start.retry_policy {
        payload.insert("retry_policy".into(), child_retry_snapshot(policy));
    }
    tagged(payload, &start.tags)
}

pub(in crate::transitions) enum ChildStarted<'a> {
    /// The child's first run, started with the parent's step: the scheduled event's fields, the
    /// run's number and status, and its timeouts.
    First {
        step: u32,
        child: &'a RunState,
        start: &'a StartChild,
    },
    /// The child's next run, after a failure its parent's retry policy retries: the call stays
    /// open on it. (No task queue or timeouts here; the retry and its backoff instead.)
    Retry {
        outcome: &'a ChildOutcome,
        retry: &'a ChildRetry,
        link: &'a ChildLink,
    },
}

/// `ChildRunStarted`.
pub(in crate::transitions) fn child_run_started(started: ChildStarted) -> Map<String, Value> {
    match started {
        ChildStarted::First { step, child, start } => {
            let mut payload = child_workflow_scheduled(step, child, start);
            payload.extend(obj!(
                "child_status" => child.status.as_str(),
                "child_run_number" => child.run_number,
                "execution_timeout_seconds" => child.execution_timeout_seconds,
                "run_timeout_seconds" => child.run_timeout_seconds,
            ));
            payload
        }
        ChildStarted::Retry { outcome, retry, link } => {
            let mut payload = obj!(
                "sequence" => outcome.parent.sequence,
                "child_workflow_instance_id" => outcome.child_workflow_id,
                "child_workflow_run_id" => retry.run_id,
                "child_workflow_type" => link.workflow_type,
                "parent_close_policy" => link.parent_close_policy,
                "cancellation_policy" => link.cancellation_policy,
                "child_status" => "pending",
                "child_run_number" => retry.run_number,
                "retry_attempt" => retry.attempt,
                "retry_of_child_workflow_run_id" => outcome.child_run_id,
                "retry_backoff_seconds" => retry.backoff_seconds,
            );
            if let Some(policy) = &outcome.parent.retry_policy {
                payload.insert("retry_policy".into(), child_retry_snapshot(policy));
            }
            payload.extend(call_link(link));
            tagged(payload, &link.tags)
        }
    }
}

/// The child's call id, which the SDKs know as `child_call_id`/`workflow_link_id`, when known.
fn call_link(link: &ChildLink) -> Map<String, Value> {
    if link.call_id.is_empty() {
        return Map::new();
    }
    obj!("child_call_id" => link.call_id, "workflow_link_id" => link.call_id)
}

/// The fields every resolution of a child call has (its tags included, so the SDK can match an
/// out-of-order resolution to its group member).
fn child_resolution(outcome: &ChildOutcome, link: &ChildLink, fields: Map<String, Value>) -> Map<String, Value> {
    let mut payload = obj!(
        "sequence" => outcome.parent.sequence,
        "child_workflow_instance_id" => outcome.child_workflow_id,
        "child_workflow_run_id" => outcome.child_run_id,
        "child_workflow_type" => link.workflow_type,
        "parent_close_policy" => link.parent_close_policy,
        "cancellation_policy" => link.cancellation_policy,
        "child_status" => outcome.status.as_str(),
        "closed_reason" => outcome.closed_reason.map(|r| r.as_str()),
        "closed_at" => iso8601(outcome.closed_at),
    );
    payload.extend(call_link(link));
    payload.extend(fields);
    tagged(payload, &link.tags)
}

fn child_failure(outcome: &ChildOutcome, category: &str) -> Map<String, Value> {
    let failure = outcome.failure.clone().unwrap_or_default();
    obj!(
        "failure_category" => category,
        "exception_type" => failure.exception_type,
        "exception_class" => failure.exception_class.or(failure.exception_type),
        "message" => failure.message,
        "exception" => failure.exception,
    )
}

/// `ChildRunCompleted`, with the child's output (an Avro null without one).
pub(in crate::transitions) fn child_run_completed(outcome: &ChildOutcome, link: &ChildLink) -> Map<String, Value> {
    let output = outcome
        .output
        .clone()
        .unwrap_or_else(|| Payload::avro(crate::payload::AVRO_NULL_BLOB));
    child_resolution(
        outcome,
        link,
        obj!("output" => output.blob_value(), "payload_codec" => output.codec),
    )
}

/// `ChildRunFailed`: a failed or timed-out child run.
pub(in crate::transitions) fn child_run_failed(outcome: &ChildOutcome, link: &ChildLink) -> Map<String, Value> {
    let category = if outcome.closed_reason == Some(ClosedReason::TimedOut) {
        "timeout"
    } else {
        "application"
    };
    child_resolution(outcome, link, child_failure(outcome, category))
}

/// `ChildRunCancelled`.
pub(in crate::transitions) fn child_run_cancelled(outcome: &ChildOutcome, link: &ChildLink) -> Map<String, Value> {
    child_resolution(outcome, link, child_failure(outcome, "cancelled"))
}

/// `ChildRunTerminated`.
pub(in crate::transitions) fn child_run_terminated(outcome: &ChildOutcome, link: &ChildLink) -> Map<String, Value> {
    child_resolution(outcome, link, child_failure(outcome, "terminated"))
}

/// `ParentClosePolicyApplied`: the parent's side of the relationship, before its terminal
/// event. DW's field names: no `sequence` or `child_call_id`, which the SDKs' replayers would
/// take for a step resolution.
pub(in crate::transitions) fn parent_close_policy_applied(child: &ChildLink, reason: ClosedReason) -> Map<String, Value> {
    obj!(
        "child_instance_id" => child.workflow_id,
        "child_run_id" => child.run_id,
        "child_workflow_type" => child.workflow_type,
        "policy" => child.parent_close_policy,
        "reason" => format!("Parent workflow closed ({}); parent-close policy: {}.", reason.as_str(), child.parent_close_policy),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChildLink, ChildOutcome, ClosedReason, ParentLink, RunStatus};

    #[test]
    fn a_child_resolution_repeats_the_steps_tags_and_its_call_id_only_when_known() {
        let outcome = ChildOutcome {
            parent: ParentLink {
                workflow_id: "wf-parent".into(),
                run_id: "run-parent".into(),
                sequence: 4,
                retry_policy: None,
                attempt: 1,
            },
            child_workflow_id: "wf-child".into(),
            child_run_id: "run-child".into(),
            status: RunStatus::Failed,
            closed_reason: Some(ClosedReason::TimedOut),
            output: None,
            failure: None,
            closed_at: 0,
            retry: None,
        };
        let mut link = ChildLink {
            workflow_id: "wf-child".into(),
            run_id: "run-child".into(),
            workflow_type: "child".into(),
            parent_close_policy: "terminate".into(),
            cancellation_policy: "abandon".into(),
            // A link recorded before call ids were kept.
            call_id: String::new(),
            tags: obj!("sequence" => 99, "parallel_group_index" => 1),
        };
        let failed = child_run_failed(&outcome, &link);
        assert_eq!(failed["sequence"], json!(4));
        assert_eq!(failed["parallel_group_index"], json!(1));
        assert_eq!(failed["failure_category"], json!("timeout"));
        assert!(!failed.contains_key("child_call_id") && !failed.contains_key("workflow_link_id"));

        link.call_id = "cmd-child".into();
        let cancelled = child_run_cancelled(&outcome, &link);
        assert_eq!(cancelled["child_call_id"], json!("cmd-child"));
        assert_eq!(cancelled["workflow_link_id"], json!("cmd-child"));
    }
}
