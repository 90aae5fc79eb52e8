//! Activity events: a worker's attempts, the ledger's decisions on them, and a local activity's
//! whole story.

use crate::transitions::events::{payload_json, tagged};
use crate::transitions::ledger_steps::Resolver;
use crate::transitions::{iso8601, AttemptEnd};
use crate::{ActivityAttemptId, ActivityExecution, ActivityExecutionId, LocalFailure, Millis, Payload, StepTags, TaskId};
use serde_json::{json, Map, Value};

/// One attempt of an activity that runs on workers. `attempt_id` is written as it is: null for
/// an attempt that never started (a ready task that timed out).
#[derive(Clone, Copy)]
pub(in crate::transitions) struct AttemptRef<'a> {
    pub execution: &'a ActivityExecution,
    pub attempt_id: Option<&'a ActivityAttemptId>,
    pub number: u32,
}

impl AttemptRef<'_> {
    fn fields(&self) -> Map<String, Value> {
        obj!("activity_attempt_id" => self.attempt_id, "attempt_number" => self.number)
    }
}

/// A local activity: it ran inside the workflow task, so it has no execution of its own.
pub(in crate::transitions) struct LocalActivityRef<'a> {
    pub execution_id: &'a ActivityExecutionId,
    pub activity_type: &'a str,
    pub step: u32,
    pub tags: &'a StepTags,
}

/// One attempt of a local activity, as the worker reported it.
#[derive(Clone, Copy)]
pub(in crate::transitions) struct LocalAttemptRef<'a> {
    pub activity: &'a LocalActivityRef<'a>,
    pub number: u32,
    pub attempt_id: Option<&'a ActivityAttemptId>,
    pub worker_attempt_id: Option<&'a str>,
    /// How long the attempt ran, as the worker measured it (on the events that end it).
    pub duration_ms: Option<i64>,
}

impl LocalAttemptRef<'_> {
    fn fields(&self) -> Map<String, Value> {
        obj!("attempt_number" => self.number, "activity_attempt_id" => self.attempt_id)
    }

    /// Started and terminal events also name the worker's own attempt id.
    fn fields_with_worker_id(&self) -> Map<String, Value> {
        let mut fields = self.fields();
        fields.insert("worker_attempt_id".into(), json!(self.worker_attempt_id));
        fields
    }
}

fn execution_identity(execution: &ActivityExecution) -> Map<String, Value> {
    obj!(
        "activity_execution_id" => execution.id,
        "activity_type" => execution.activity_type,
        "sequence" => execution.step,
    )
}

/// A worker activity's event: its identity, `fields`, then the step's tags.
fn execution_event(execution: &ActivityExecution, fields: Map<String, Value>) -> Map<String, Value> {
    let mut payload = execution_identity(execution);
    payload.extend(fields);
    tagged(payload, &execution.tags)
}

/// A local activity's event. Every one carries the `execution_mode: local` marker: both SDKs'
/// replayers need it on every event of the step.
fn local_event(local: &LocalActivityRef, fields: Map<String, Value>) -> Map<String, Value> {
    let mut payload = obj!(
        "sequence" => local.step,
        "activity_execution_id" => local.execution_id,
        "activity_type" => local.activity_type,
        "execution_mode" => "local",
        "local_activity" => true,
    );
    payload.extend(fields);
    tagged(payload, local.tags)
}

fn local_attempt_event(attempt: &LocalAttemptRef, fields: Map<String, Value>) -> Map<String, Value> {
    let mut payload = attempt.fields_with_worker_id();
    payload.extend(fields);
    local_event(attempt.activity, payload)
}

/// The event that ends a local attempt also carries its measured duration.
fn local_attempt_end_event(attempt: &LocalAttemptRef, fields: Map<String, Value>) -> Map<String, Value> {
    let mut payload = local_attempt_event(attempt, fields);
    if let Some(duration) = attempt.duration_ms {
        payload.insert("duration_ms".into(), json!(duration));
    }
    payload
}

/// A local failure's message, without the padding some SDKs leave around it.
fn trimmed(message: &str) -> String {
    message.trim_matches(|c: char| " \t\n\r\0\u{b}".contains(c)).to_string()
}

// ---------------------------------------------------------------------------------------------
// Scheduled, started, heartbeat

pub(in crate::transitions) enum Scheduled<'a> {
    /// Queued for workers: `task_id` is the task of its first attempt.
    Worker {
        execution: &'a ActivityExecution,
        task_id: &'a TaskId,
    },
    /// Already run locally with `arguments`. `echoed` (the policy and timeouts the worker
    /// applied) is repeated verbatim and wins over every other field.
    Local {
        activity: &'a LocalActivityRef<'a>,
        arguments: &'a Payload,
        echoed: &'a Map<String, Value>,
    },
}

/// `ActivityScheduled`.
pub(in crate::transitions) fn activity_scheduled(scheduled: Scheduled) -> Map<String, Value> {
    match scheduled {
        Scheduled::Worker { execution, task_id } => {
            let mut fields = obj!("queue" => execution.queue);
            if execution.retry_policy_given {
                fields.insert("retry_policy".into(), execution.retry_policy.to_json());
            }
            let t = &execution.timeouts;
            for (key, value) in [
                ("start_to_close_timeout", t.start_to_close_seconds),
                ("schedule_to_start_timeout", t.schedule_to_start_seconds),
                ("schedule_to_close_timeout", t.schedule_to_close_seconds),
                ("heartbeat_timeout", t.heartbeat_seconds),
            ] {
                if let Some(value) = value {
                    fields.insert(key.into(), json!(value));
                }
            }
            fields.insert("task_id".into(), json!(task_id));
            if let Some(policy) = execution.cancellation_policy {
                fields.insert("cancellation_policy".into(), json!(policy.as_str()));
            }
            if let Some(session) = &execution.worker_session {
                fields.insert("worker_session".into(), Value::Object(session.as_sent.clone()));
            }
            execution_event(execution, fields)
        }
        Scheduled::Local {
            activity,
            arguments,
            echoed,
        } => {
            let mut payload = local_event(activity, obj!("arguments" => payload_json(arguments)));
            payload.extend(echoed.clone());
            payload
        }
    }
}

pub(in crate::transitions) enum Started<'a> {
    /// A worker leased the attempt's task until `lease_expires_at`.
    Leased {
        attempt: AttemptRef<'a>,
        task_id: &'a TaskId,
        lease_expires_at: Millis,
    },
    Local(LocalAttemptRef<'a>),
}

/// `ActivityStarted`.
pub(in crate::transitions) fn activity_started(started: Started) -> Map<String, Value> {
    match started {
        Started::Leased {
            attempt,
            task_id,
            lease_expires_at,
        } => {
            let mut fields = attempt.fields();
            fields.insert("lease_expires_at".into(), json!(iso8601(lease_expires_at)));
            fields.insert("task_id".into(), json!(task_id));
            execution_event(attempt.execution, fields)
        }
        Started::Local(attempt) => local_attempt_event(&attempt, Map::new()),
    }
}

pub(in crate::transitions) enum Heartbeat<'a> {
    /// New progress details from a worker, at `at`, with the lease it extended.
    Worker {
        attempt: AttemptRef<'a>,
        at: Millis,
        lease_expires_at: Millis,
        progress: &'a Value,
    },
    /// One `{elapsed_ms, details}` a local attempt reported (no worker attempt id on these).
    Local {
        attempt: LocalAttemptRef<'a>,
        heartbeat: &'a Value,
    },
}

/// `ActivityHeartbeatRecorded`.
pub(in crate::transitions) fn activity_heartbeat_recorded(heartbeat: Heartbeat) -> Map<String, Value> {
    match heartbeat {
        Heartbeat::Worker {
            attempt,
            at,
            lease_expires_at,
            progress,
        } => {
            let mut fields = attempt.fields();
            fields.insert("heartbeat_at".into(), json!(iso8601(at)));
            fields.insert("lease_expires_at".into(), json!(iso8601(lease_expires_at)));
            fields.insert("progress".into(), progress.clone());
            execution_event(attempt.execution, fields)
        }
        Heartbeat::Local { attempt, heartbeat } => {
            let mut fields = attempt.fields();
            fields.insert("elapsed_ms".into(), heartbeat.get("elapsed_ms").cloned().unwrap_or(Value::Null));
            fields.insert("details".into(), heartbeat.get("details").cloned().unwrap_or(Value::Null));
            local_event(attempt.activity, fields)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Retries

/// The task the next attempt runs as, and when.
pub(in crate::transitions) struct NextAttempt<'a> {
    pub task_id: &'a TaskId,
    pub available_at: Millis,
    pub backoff_seconds: i64,
}

pub(in crate::transitions) enum Retry<'a> {
    /// The attempt failed or timed out and the policy allows another (`retry_reason` `failure`
    /// or `timeout`); `retry_of_task_id` is the ended attempt's task.
    Policy {
        attempt: AttemptRef<'a>,
        end: &'a AttemptEnd,
        next: NextAttempt<'a>,
        retry_of_task_id: &'a TaskId,
    },
    /// A declared action's provider reported a pending result: poll again.
    LedgerPending { attempt: AttemptRef<'a>, next: NextAttempt<'a> },
    /// An operator recorded that a declared action's effect (ledger entry `ledger_key`) did not
    /// happen: one deliberate retry.
    LedgerEffectAbsent {
        attempt: AttemptRef<'a>,
        ledger_key: &'a str,
        next: NextAttempt<'a>,
    },
    /// A local attempt the worker retried; `retry` is its report of why.
    Local {
        attempt: LocalAttemptRef<'a>,
        retry: &'a Map<String, Value>,
    },
}

fn next_attempt(next: &NextAttempt, reason: &str) -> Map<String, Value> {
    obj!(
        "retry_task_id" => next.task_id,
        "retry_reason" => reason,
        "retry_available_at" => iso8601(next.available_at),
        "retry_backoff_seconds" => next.backoff_seconds,
    )
}

/// `ActivityRetryScheduled`.
pub(in crate::transitions) fn activity_retry_scheduled(retry: Retry) -> Map<String, Value> {
    match retry {
        Retry::Policy {
            attempt,
            end,
            next,
            retry_of_task_id,
        } => {
            let reason = match end {
                AttemptEnd::TimedOut { .. } => "timeout",
                AttemptEnd::Failed { .. } => "failure",
            };
            let mut fields = attempt_end(&attempt, end);
            fields.extend(next_attempt(&next, reason));
            let policy = &attempt.execution.retry_policy;
            fields.extend(obj!(
                "retry_of_task_id" => retry_of_task_id,
                "retry_after_attempt_id" => attempt.attempt_id,
                "retry_after_attempt" => attempt.number,
                "max_attempts" => policy.max_attempts,
                "retry_policy" => policy.to_json(),
            ));
            execution_event(attempt.execution, fields)
        }
        Retry::LedgerPending { attempt, next } => {
            let mut fields = attempt.fields();
            fields.extend(next_attempt(&next, "ledger_pending"));
            fields.insert("message".into(), json!("The provider reported a pending result; polling again."));
            execution_event(attempt.execution, fields)
        }
        Retry::LedgerEffectAbsent { attempt, ledger_key, next } => {
            let mut fields = attempt.fields();
            fields.extend(next_attempt(&next, "ledger_effect_absent"));
            fields.extend(obj!(
                "ledger_key" => ledger_key,
                "retry_after_attempt_id" => attempt.attempt_id,
                "retry_after_attempt" => attempt.number,
                "message" => "An operator recorded that the effect did not happen; one deliberate retry.",
            ));
            execution_event(attempt.execution, fields)
        }
        Retry::Local { attempt, retry } => {
            let mut fields = attempt.fields();
            for (from, to) in [
                ("retry_reason", "retry_reason"),
                ("backoff_seconds", "retry_backoff_seconds"),
                ("message", "message"),
                ("exception_type", "exception_type"),
                ("timeout_kind", "timeout_kind"),
            ] {
                if let Some(value) = retry.get(from) {
                    fields.insert(to.into(), value.clone());
                }
            }
            if let Some(duration) = attempt.duration_ms {
                fields.insert("duration_ms".into(), json!(duration));
            }
            local_event(attempt.activity, fields)
        }
    }
}

/// What every event of an ended attempt (retry, final failure, final timeout) repeats: the
/// attempt, its last heartbeat progress, and why it ended.
fn attempt_end(attempt: &AttemptRef, end: &AttemptEnd) -> Map<String, Value> {
    let mut fields = attempt.fields();
    if let Some(details) = &attempt.execution.last_heartbeat_details {
        fields.insert("last_heartbeat_details".into(), details.clone());
    }
    match end {
        AttemptEnd::Failed { failure, .. } => {
            let class = failure.class.clone().or_else(|| failure.failure_type.clone());
            fields.extend(obj!(
                "exception_type" => failure.failure_type,
                "exception_class" => class,
                "message" => failure.message,
                "code" => failure.code,
                "exception" => json!({
                    "class": class,
                    "type": failure.failure_type,
                    "message": failure.message,
                    "code": failure.code,
                    "trace": failure.stack_trace,
                    "details": failure.details.as_ref().map(payload_json),
                }),
            ));
        }
        AttemptEnd::TimedOut { timeout_kind } => {
            fields.insert("timeout_kind".into(), json!(timeout_kind));
            let message = match *timeout_kind {
                super::super::deadline::LEASE_EXPIRED => {
                    "Activity attempt lease expired: the worker neither reported nor heartbeated within its lease.".to_string()
                }
                kind => format!("Activity attempt timed out ({kind})."),
            };
            fields.insert("message".into(), json!(message));
        }
    }
    fields
}

// ---------------------------------------------------------------------------------------------
// Terminal events

pub(in crate::transitions) enum Completed<'a> {
    /// The worker reported the attempt's result.
    Worker {
        attempt: AttemptRef<'a>,
        result: &'a Payload,
    },
    /// An operator or a reconciliation probe confirmed the effect of a declared action whose
    /// outcome was unknown.
    Confirmed {
        attempt: AttemptRef<'a>,
        ledger_key: &'a str,
        result: &'a Payload,
        resolver: Resolver,
    },
    Local {
        attempt: LocalAttemptRef<'a>,
        result: &'a Payload,
    },
}

fn result_fields(result: &Payload) -> Map<String, Value> {
    obj!("result" => result.blob_value(), "payload_codec" => result.codec)
}

/// `ActivityCompleted`.
pub(in crate::transitions) fn activity_completed(completed: Completed) -> Map<String, Value> {
    match completed {
        Completed::Worker { attempt, result } => {
            let mut fields = attempt.fields();
            fields.extend(result_fields(result));
            execution_event(attempt.execution, fields)
        }
        Completed::Confirmed {
            attempt,
            ledger_key,
            result,
            resolver,
        } => {
            let mut fields = attempt.fields();
            fields.insert("ledger_key".into(), json!(ledger_key));
            fields.extend(result_fields(result));
            let resolved_by = match resolver {
                Resolver::Operator => "operator",
                Resolver::Probe => "probe",
            };
            fields.insert("resolved_by".into(), json!(resolved_by));
            execution_event(attempt.execution, fields)
        }
        Completed::Local { attempt, result } => local_attempt_end_event(&attempt, result_fields(result)),
    }
}

pub(in crate::transitions) enum Failed<'a> {
    /// Refused before dispatch (`reason` names why): nothing ran, so no attempt is named.
    Refused {
        execution: &'a ActivityExecution,
        reason: &'a str,
        message: &'a str,
    },
    /// The attempt's failure is final; `non_retryable` says whether no retry could have run.
    Attempt {
        attempt: AttemptRef<'a>,
        end: &'a AttemptEnd,
        non_retryable: bool,
    },
    Local {
        attempt: LocalAttemptRef<'a>,
        failure: &'a LocalFailure,
    },
}

/// `ActivityFailed`.
pub(in crate::transitions) fn activity_failed(failure_id: &str, failed: Failed) -> Map<String, Value> {
    match failed {
        Failed::Refused {
            execution,
            reason,
            message,
        } => execution_event(
            execution,
            obj!(
                "attempt_number" => execution.attempt_count,
                "failure_id" => failure_id,
                "failure_category" => "activity",
                "exception_type" => reason,
                "exception_class" => reason,
                "message" => message,
                "non_retryable" => true,
                "exception" => json!({"class": reason, "type": reason, "message": message}),
            ),
        ),
        Failed::Attempt {
            attempt,
            end,
            non_retryable,
        } => {
            let mut fields = attempt_end(&attempt, end);
            fields.extend(obj!(
                "failure_id" => failure_id,
                "failure_category" => "activity",
                "non_retryable" => non_retryable,
            ));
            execution_event(attempt.execution, fields)
        }
        Failed::Local { attempt, failure } => local_attempt_end_event(
            &attempt,
            obj!(
                "failure_id" => failure_id,
                "message" => trimmed(&failure.message),
                "exception_type" => failure.exception_type,
                "non_retryable" => failure.non_retryable,
                "failure_category" => "application",
            ),
        ),
    }
}

pub(in crate::transitions) enum TimedOut<'a> {
    /// No worker started it within its schedule-to-start budget: no attempt is named.
    Unstarted {
        execution: &'a ActivityExecution,
        timeout_kind: &'a str,
    },
    /// The attempt timed out and no retry follows.
    Attempt { attempt: AttemptRef<'a>, end: &'a AttemptEnd },
    Local {
        attempt: LocalAttemptRef<'a>,
        failure: &'a LocalFailure,
    },
}

/// `ActivityTimedOut`.
pub(in crate::transitions) fn activity_timed_out(failure_id: &str, timed_out: TimedOut) -> Map<String, Value> {
    match timed_out {
        TimedOut::Unstarted { execution, timeout_kind } => execution_event(
            execution,
            obj!(
                "attempt_number" => execution.attempt_count,
                "failure_id" => failure_id,
                "failure_category" => "timeout",
                "timeout_kind" => timeout_kind,
                "exception_class" => "ActivityTimedOut",
                "message" => format!("Activity timed out ({timeout_kind})."),
            ),
        ),
        TimedOut::Attempt { attempt, end } => {
            // `timeout_kind` and the message come with the attempt's end.
            let mut fields = attempt_end(&attempt, end);
            fields.extend(obj!(
                "failure_id" => failure_id,
                "failure_category" => "timeout",
                "exception_class" => "ActivityTimedOut",
                "schedule_to_close_deadline_at" => attempt.execution.schedule_to_close_deadline.map(iso8601),
            ));
            execution_event(attempt.execution, fields)
        }
        TimedOut::Local { attempt, failure } => local_attempt_end_event(
            &attempt,
            obj!(
                "failure_id" => failure_id,
                "timeout_kind" => failure.timeout_kind,
                "message" => trimmed(&failure.message),
                "exception_class" => failure.exception_type,
                "failure_category" => "timeout",
            ),
        ),
    }
}

pub(in crate::transitions) enum Cancelled<'a> {
    /// Interrupted by a delivered cooperative cancellation. Written without the step's tags, as
    /// it always was.
    Delivered(&'a ActivityExecution),
    Local {
        attempt: LocalAttemptRef<'a>,
        failure: &'a LocalFailure,
        failure_id: &'a str,
    },
}

/// `ActivityCancelled`.
pub(in crate::transitions) fn activity_cancelled(cancelled: Cancelled) -> Map<String, Value> {
    match cancelled {
        Cancelled::Delivered(execution) => {
            let mut payload = execution_identity(execution);
            payload.extend(obj!(
                "attempt_number" => execution.attempt_count,
                "message" => "Activity cancelled: cooperative cancellation delivered.",
                "exception_type" => "ActivityCancelled",
            ));
            payload
        }
        Cancelled::Local {
            attempt,
            failure,
            failure_id,
        } => local_attempt_end_event(
            &attempt,
            obj!(
                "failure_id" => failure_id,
                "message" => trimmed(&failure.message),
                "exception_type" => failure.exception_type,
                "non_retryable" => true,
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transitions::AttemptEnd;
    use crate::{ActivityExecution, ActivityExecutionId, ActivityTimeouts, Payload, RetryPolicy};

    fn execution() -> ActivityExecution {
        ActivityExecution {
            id: "act-1".into(),
            step: 3,
            activity_type: "charge".into(),
            queue: "q".into(),
            arguments: Payload::avro("YQ=="),
            retry_policy: RetryPolicy::server_default(),
            retry_policy_given: false,
            timeouts: ActivityTimeouts::default(),
            scheduled_at: 0,
            schedule_to_close_deadline: None,
            attempt_count: 1,
            attempt_ids: Vec::new(),
            task_id: "task-1".into(),
            last_heartbeat_details: None,
            tags: obj!("sequence" => 99, "message" => "tag", "parallel_group_id" => "g1"),
            action: None,
            ledger_key: None,
            blocked_by: None,
            cancellation_policy: None,
            worker_session: None,
            probe_retries: 0,
        }
    }

    #[test]
    fn step_tags_fill_in_but_never_replace_an_activity_events_fields() {
        let execution = execution();
        let attempt = AttemptRef {
            execution: &execution,
            attempt_id: None,
            number: 1,
        };
        let end = AttemptEnd::TimedOut { timeout_kind: "heartbeat" };
        let payload = activity_timed_out("f-1", TimedOut::Attempt { attempt, end: &end });
        assert_eq!(payload["sequence"], json!(3));
        assert_eq!(payload["message"], json!("Activity attempt timed out (heartbeat)."));
        assert_eq!(payload["parallel_group_id"], json!("g1"));
        assert_eq!(
            payload["activity_attempt_id"],
            Value::Null,
            "an attempt that never started is named as null"
        );

        // A cooperative cancellation's event has never carried the step's tags.
        let cancelled = activity_cancelled(Cancelled::Delivered(&execution));
        assert!(!cancelled.contains_key("parallel_group_id"));
        assert_eq!(cancelled["sequence"], json!(3));
    }

    #[test]
    fn a_local_activitys_events_all_carry_the_local_marker_and_its_echo_wins() {
        let execution_id = ActivityExecutionId::from("act-local");
        let tags = obj!("execution_mode" => "tag", "note" => "kept");
        let activity = LocalActivityRef {
            execution_id: &execution_id,
            activity_type: "lookup",
            step: 2,
            tags: &tags,
        };
        let echoed = obj!("activity_type" => "echoed", "start_to_close_timeout" => 5);
        let scheduled = activity_scheduled(Scheduled::Local {
            activity: &activity,
            arguments: &Payload::avro("YQ=="),
            echoed: &echoed,
        });
        assert_eq!(scheduled["activity_type"], json!("echoed"));
        assert_eq!(scheduled["start_to_close_timeout"], json!(5));
        let attempt = LocalAttemptRef {
            activity: &activity,
            number: 1,
            attempt_id: None,
            worker_attempt_id: Some("w-1"),
            duration_ms: Some(12),
        };
        let heartbeat = activity_heartbeat_recorded(Heartbeat::Local {
            attempt,
            heartbeat: &json!({"elapsed_ms": 4}),
        });
        assert!(
            !heartbeat.contains_key("worker_attempt_id"),
            "heartbeats never named the worker's attempt"
        );
        assert_eq!(heartbeat["details"], Value::Null);
        let completed = activity_completed(Completed::Local {
            attempt,
            result: &Payload::avro("cg=="),
        });
        assert_eq!(completed["duration_ms"], json!(12), "the attempt's end carries its duration");
        let started = activity_started(Started::Local(attempt));
        assert!(!started.contains_key("duration_ms"), "a start has no duration yet");
        assert_eq!(completed["worker_attempt_id"], json!("w-1"));
        for payload in [&scheduled, &heartbeat, &completed] {
            assert_eq!(payload["execution_mode"], json!("local"));
            assert_eq!(payload["local_activity"], json!(true));
            assert_eq!(payload["note"], json!("kept"));
        }
    }
}
