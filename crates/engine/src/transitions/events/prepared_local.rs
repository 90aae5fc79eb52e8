//! A prepared local activity's events, written one report at a time. Every one carries the
//! local markers (`execution_mode: local`, `local_activity: true`), the step's `sequence`, and
//! the workflow's `cancellation_policy` when it gave one: both SDKs' replayers compare it on
//! every event of the step.

use crate::local_activity::{PreparedAttempt, PreparedLocal};
use crate::transitions::events::{payload_json, tagged};
use crate::transitions::iso8601;
use crate::{Millis, Payload, TaskId};
use serde_json::{json, Map, Value};

/// Who reported the end of an attempt: its own worker (`outcome`), the server on a supervision
/// call that found it past a deadline, or the claim that found it unfinished (`recover`).
pub(in crate::transitions) enum Provenance<'a> {
    Deadline {
        task_id: &'a TaskId,
        task_attempt: u64,
        owner: &'a str,
    },
    Outcome {
        fingerprint: &'a str,
        task_id: &'a TaskId,
        task_attempt: u64,
        owner: &'a str,
    },
    Recovery {
        task_id: &'a TaskId,
        task_attempt: u64,
        owner: &'a str,
        original: &'a PreparedAttempt,
    },
}

impl Provenance<'_> {
    /// The claim the report came on: task, `workflow_task_attempt`, owner.
    pub(in crate::transitions) fn claim(&self) -> (&TaskId, u64, &str) {
        match self {
            Provenance::Outcome {
                task_id,
                task_attempt,
                owner,
                ..
            }
            | Provenance::Deadline {
                task_id,
                task_attempt,
                owner,
            }
            | Provenance::Recovery {
                task_id,
                task_attempt,
                owner,
                ..
            } => (task_id, *task_attempt, owner),
        }
    }

    fn fields(&self) -> Map<String, Value> {
        match self {
            Provenance::Outcome {
                fingerprint,
                task_id,
                task_attempt,
                owner,
            } => obj!("local_outcome" => obj!(
                "version" => 1,
                "report_fingerprint" => fingerprint,
                "workflow_task_id" => task_id,
                "workflow_task_attempt" => task_attempt,
                "lease_owner" => owner,
            )),
            Provenance::Deadline {
                task_id,
                task_attempt,
                owner,
            } => obj!("local_supervision" => obj!(
                "version" => 1,
                "workflow_task_id" => task_id,
                "workflow_task_attempt" => task_attempt,
                "lease_owner" => owner,
            )),
            Provenance::Recovery {
                task_id,
                task_attempt,
                owner,
                original,
            } => obj!("local_recovery" => obj!(
                "version" => 1,
                "workflow_task_id" => task_id,
                "workflow_task_attempt" => task_attempt,
                "lease_owner" => owner,
                "original_workflow_task_id" => original.task_id,
                "original_workflow_task_attempt" => original.task_attempt,
                "original_lease_owner" => original.lease_owner,
                // The claim died with the callback's fate unknown to the server.
                "callback_stop_state" => "unknown",
            )),
        }
    }
}

fn base(local: &PreparedLocal, fields: Map<String, Value>) -> Map<String, Value> {
    let mut payload = obj!(
        "sequence" => local.step,
        "activity_execution_id" => local.execution_id,
        "activity_type" => local.descriptor.activity_type,
        "execution_mode" => "local",
        "local_activity" => true,
    );
    if let Some(policy) = local.descriptor.cancellation_policy {
        payload.insert("cancellation_policy".into(), json!(policy.as_str()));
    }
    payload.extend(fields);
    tagged(payload, &local.descriptor.tags)
}

fn attempt_fields(attempt: &PreparedAttempt) -> Map<String, Value> {
    obj!(
        "activity_attempt_id" => attempt.attempt_id,
        "attempt_number" => attempt.number,
        "worker_attempt_id" => attempt.worker_attempt_id,
    )
}

fn attempt_event(local: &PreparedLocal, attempt: &PreparedAttempt, fields: Map<String, Value>) -> Map<String, Value> {
    let mut payload = attempt_fields(attempt);
    payload.extend(fields);
    base(local, payload)
}

/// `ActivityScheduled` of a prepared call: the call as the worker described it.
pub(in crate::transitions) fn prepared_scheduled(local: &PreparedLocal, task_id: &TaskId, task_attempt: u64) -> Map<String, Value> {
    let d = &local.descriptor;
    let mut fields = obj!(
        "arguments" => payload_json(&d.arguments),
        "payload_codec" => d.arguments.codec,
        "workflow_task_id" => task_id,
        "local_preparation" => obj!(
            "version" => 1,
            "descriptor_fingerprint" => d.fingerprint,
            "workflow_task_attempt" => task_attempt,
        ),
    );
    if let Some(policy) = &d.retry_policy {
        fields.insert("retry_policy".into(), policy.to_json());
    }
    for (key, value) in [
        ("start_to_close_timeout", d.start_to_close_seconds),
        ("schedule_to_close_timeout", d.schedule_to_close_seconds),
        ("heartbeat_timeout", d.heartbeat_seconds),
    ] {
        if let Some(value) = value {
            fields.insert(key.into(), json!(value));
        }
    }
    if let Some(cleanup) = &d.cleanup {
        fields.insert(
            "cancellation_cleanup".into(),
            json!({"request_id": cleanup.request_id, "delivery_history_event_id": cleanup.delivery_history_event_id}),
        );
    }
    base(local, fields)
}

/// `ActivityScheduled` of a local member of a group admitted at once: as a prepared call's,
/// naming the group checkpoint instead of a preparation.
pub(in crate::transitions) fn prepared_group_scheduled(
    local: &PreparedLocal,
    task_id: &TaskId,
    task_attempt: u64,
    checkpoint_id: &str,
) -> Map<String, Value> {
    let mut payload = prepared_scheduled(local, task_id, task_attempt);
    payload.remove("local_preparation");
    payload.insert(
        "local_group_admission".into(),
        json!({
            "version": 1,
            "descriptor_fingerprint": local.descriptor.fingerprint,
            "checkpoint_id": checkpoint_id,
            "workflow_task_attempt": task_attempt,
        }),
    );
    payload
}

/// `ActivityStarted`: an attempt admitted under a workflow task's lease.
pub(in crate::transitions) fn prepared_started(
    local: &PreparedLocal,
    attempt: &PreparedAttempt,
    lease_expires_at: Millis,
) -> Map<String, Value> {
    attempt_event(
        local,
        attempt,
        obj!(
            "lease_expires_at" => iso8601(lease_expires_at),
            "local_preparation" => obj!(
                "version" => 1,
                "descriptor_fingerprint" => local.descriptor.fingerprint,
                "workflow_task_id" => attempt.task_id,
                "workflow_task_attempt" => attempt.task_attempt,
                "lease_owner" => attempt.lease_owner,
                "schedule_to_close_deadline_at" => local.schedule_to_close_deadline().map(iso8601),
            ),
        ),
    )
}

/// `ActivityHeartbeatRecorded`: the callback's progress.
pub(in crate::transitions) fn prepared_heartbeat(
    local: &PreparedLocal,
    attempt: &PreparedAttempt,
    progress: Option<&Map<String, Value>>,
    at: Millis,
) -> Map<String, Value> {
    attempt_event(local, attempt, obj!("heartbeat_at" => iso8601(at), "progress" => progress))
}

/// `ActivityCompleted`.
pub(in crate::transitions) fn prepared_completed(
    local: &PreparedLocal,
    attempt: &PreparedAttempt,
    result: &Payload,
    by: &Provenance,
) -> Map<String, Value> {
    let mut fields = obj!("result" => result.blob_value(), "payload_codec" => result.codec);
    fields.extend(by.fields());
    attempt_event(local, attempt, fields)
}

/// Why an attempt ended without a result.
pub(in crate::transitions) enum PreparedFailure<'a> {
    Failed {
        message: &'a str,
        exception_type: Option<&'a str>,
        non_retryable: bool,
    },
    TimedOut {
        kind: &'a str,
    },
}

impl PreparedFailure<'_> {
    fn fields(&self, failure_id: &str) -> Map<String, Value> {
        match self {
            PreparedFailure::Failed {
                message,
                exception_type,
                non_retryable,
            } => obj!(
                "failure_id" => failure_id,
                "failure_category" => "application",
                "message" => message,
                "exception_type" => exception_type,
                "exception_class" => exception_type,
                "non_retryable" => non_retryable,
                "exception" => json!({"type": exception_type, "class": exception_type, "message": message}),
            ),
            PreparedFailure::TimedOut { kind } => obj!(
                "failure_id" => failure_id,
                "failure_category" => "timeout",
                "timeout_kind" => kind,
                "exception_class" => "ActivityTimedOut",
                "message" => format!("Local activity timed out ({kind})."),
            ),
        }
    }
}

/// `ActivityFailed` or `ActivityTimedOut`: the attempt's end is the activity's.
pub(in crate::transitions) fn prepared_ended(
    local: &PreparedLocal,
    attempt: &PreparedAttempt,
    failure: &PreparedFailure,
    failure_id: &str,
    by: &Provenance,
) -> Map<String, Value> {
    let mut fields = failure.fields(failure_id);
    fields.extend(by.fields());
    attempt_event(local, attempt, fields)
}

/// The retry an `ActivityRetryScheduled` announces.
pub(in crate::transitions) struct PreparedRetry<'a> {
    pub task_id: &'a TaskId,
    pub retry_of_task_id: &'a TaskId,
    pub available_at: Millis,
    pub backoff_seconds: i64,
}

/// `ActivityRetryScheduled`: the attempt ended, another follows at `retry.available_at`.
pub(in crate::transitions) fn prepared_retry_scheduled(
    local: &PreparedLocal,
    attempt: &PreparedAttempt,
    failure: &PreparedFailure,
    failure_id: &str,
    retry: PreparedRetry,
    by: &Provenance,
) -> Map<String, Value> {
    let policy = local.retry_policy();
    let mut fields = failure.fields(failure_id);
    fields.extend(obj!(
        "retry_task_id" => retry.task_id,
        "retry_of_task_id" => retry.retry_of_task_id,
        "retry_available_at" => iso8601(retry.available_at),
        "retry_backoff_seconds" => retry.backoff_seconds,
        "retry_after_attempt_id" => attempt.attempt_id,
        "retry_after_attempt" => attempt.number,
        "retry_reason" => match failure { PreparedFailure::Failed { .. } => "failure", PreparedFailure::TimedOut { .. } => "timeout" },
        "max_attempts" => policy.max_attempts,
        "retry_policy" => policy.to_json(),
    ));
    fields.extend(by.fields());
    attempt_event(local, attempt, fields)
}

/// `ActivityCancelled`: a cooperative cancellation stopped the running attempt.
pub(in crate::transitions) fn prepared_cancelled(local: &PreparedLocal, attempt: &PreparedAttempt, failure_id: &str) -> Map<String, Value> {
    attempt_event(
        local,
        attempt,
        obj!(
            "failure_id" => failure_id,
            "message" => "Local activity cancelled: a cooperative cancellation was requested.",
            "exception_type" => "ActivityCancelled",
            "non_retryable" => true,
        ),
    )
}
