//! Event payloads, one builder per event type, so every place that records an event type
//! writes the same fields. (Not every type is here yet; the rest are still built where they
//! are recorded.)
//!
//! Key order does not matter (the canonical form sorts keys), but which fields a payload has,
//! and which value wins when a step tag has the same name as a field, does: explicit fields
//! always win, tags only add fields the event does not have.

use super::*;

// ---------------------------------------------------------------------------------------------
// Timers

/// What a wait's timeout timer repeats of its wait, when the wait is still known.
#[derive(Clone, Copy, Default)]
pub(super) struct TimerWait<'a> {
    pub signal_name: Option<&'a str>,
    pub condition: Option<&'a ConditionWait>,
}

/// `TimerScheduled`.
pub(super) fn timer_scheduled(timer: &TimerState, wait: TimerWait) -> Map<String, Value> {
    timer_payload(timer, wait, Map::new())
}

/// `TimerFired`.
pub(super) fn timer_fired(timer: &TimerState, wait: TimerWait, fired_at: Millis) -> Map<String, Value> {
    timer_payload(timer, wait, obj!("fired_at" => iso8601(fired_at)))
}

/// `TimerCancelled`: a user timer ended by a cooperative cancellation (no tags, no fire time).
pub(super) fn timer_cancelled(timer: &TimerState, cancelled_at: Millis) -> Map<String, Value> {
    obj!(
        "timer_id" => timer.id,
        "sequence" => timer.step,
        "delay_seconds" => timer.delay_seconds,
        "cancelled_at" => iso8601(cancelled_at),
    )
}

fn timer_payload(timer: &TimerState, wait: TimerWait, extra: Map<String, Value>) -> Map<String, Value> {
    let mut payload = obj!(
        "timer_id" => timer.id,
        "sequence" => timer.step,
        "delay_seconds" => timer.delay_seconds,
        "fire_at" => iso8601(timer.fire_at),
    );
    match &timer.purpose {
        TimerPurpose::User => {}
        TimerPurpose::ConditionTimeout(wait_id) => {
            payload.insert("timer_kind".into(), json!("condition_timeout"));
            payload.insert("condition_wait_id".into(), json!(wait_id));
        }
        TimerPurpose::SignalTimeout(wait_id) => {
            payload.insert("timer_kind".into(), json!("signal_timeout"));
            payload.insert("signal_wait_id".into(), json!(wait_id));
            if let Some(name) = wait.signal_name {
                payload.insert("signal_name".into(), json!(name));
            }
        }
    }
    if let Some(condition) = wait.condition {
        payload.insert("condition_key".into(), json!(condition.condition_key));
        payload.insert("condition_definition_fingerprint".into(), json!(condition.fingerprint));
    }
    payload.extend(extra);
    extend(&mut payload, &timer.tags);
    payload
}

// ---------------------------------------------------------------------------------------------
// Signals and updates

/// `SignalReceived`.
pub(super) fn signal_received(
    run: &RunState,
    command_id: &CommandId,
    signal_id: &SignalId,
    signal_name: &str,
    arguments: &Payload,
) -> Map<String, Value> {
    obj!(
        "workflow_command_id" => command_id,
        "signal_id" => signal_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "signal_name" => signal_name,
        "arguments" => payload_json(arguments),
        "payload_codec" => arguments.codec,
    )
}

/// Which update an update event is about.
pub(super) struct UpdateRef<'a> {
    pub command_id: &'a CommandId,
    pub update_id: &'a str,
    pub update_name: &'a str,
}

impl<'a> UpdateRef<'a> {
    /// An accepted update, as its record keeps it.
    pub(super) fn of(record: &'a UpdateRecord, update_id: &'a str) -> Self {
        Self {
            command_id: &record.command_id,
            update_id,
            update_name: &record.update_name,
        }
    }
}

fn update_identity(run: &RunState, update: &UpdateRef) -> Map<String, Value> {
    obj!(
        "workflow_command_id" => update.command_id,
        "update_id" => update.update_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "update_name" => update.update_name,
    )
}

/// `UpdateAccepted`.
pub(super) fn update_accepted(run: &RunState, update: &UpdateRef, arguments: &Payload) -> Map<String, Value> {
    let mut payload = update_identity(run, update);
    payload.extend(obj!("arguments" => payload_json(arguments), "payload_codec" => arguments.codec));
    payload
}

/// `UpdateRejected`: the validator's verdict, before acceptance.
pub(super) fn update_rejected(run: &RunState, update: &UpdateRef, arguments: &Payload, rejection: &UpdateRejection) -> Map<String, Value> {
    let mut payload = update_accepted(run, update, arguments);
    payload.extend(obj!(
        "rejection_reason" => "update_validator_rejected",
        "message" => rejection.message,
        "failure_type" => rejection.failure_type,
        "validation_errors" => rejection.validation_errors,
    ));
    payload
}

/// `UpdateApplied`; `wait_step` is the condition wait open when the handler ran, if any.
pub(super) fn update_applied(run: &RunState, update: &UpdateRef, wait_step: Option<u32>, arguments: &Payload) -> Map<String, Value> {
    let mut payload = update_identity(run, update);
    if let Some(step) = wait_step {
        payload.insert("sequence".into(), json!(step));
    }
    payload.insert("arguments".into(), payload_json(arguments));
    payload
}

/// How an update's handler ended.
pub(super) enum UpdateEnd<'a> {
    /// With a result; `wait_step` as for [`update_applied`].
    Completed {
        result: &'a Payload,
        wait_step: Option<u32>,
    },
    Failed(&'a WorkflowFailure),
}

/// `UpdateCompleted`, with the handler's result or its failure.
pub(super) fn update_completed(run: &RunState, update: &UpdateRef, end: UpdateEnd) -> Map<String, Value> {
    let mut payload = update_identity(run, update);
    match end {
        UpdateEnd::Completed { result, wait_step } => {
            if let Some(step) = wait_step {
                payload.insert("sequence".into(), json!(step));
            }
            payload.insert("result".into(), json!(result.blob));
            payload.insert("payload_codec".into(), json!(result.codec));
        }
        UpdateEnd::Failed(failure) => payload.extend(application_failure(failure)),
    }
    payload
}

// ---------------------------------------------------------------------------------------------
// Workflow failures

/// `WorkflowFailed` of the workflow's own `fail_workflow`.
pub(super) fn workflow_failed(run: &RunState, failure_id: &str, failure: &WorkflowFailure) -> Map<String, Value> {
    let mut payload = obj!(
        "failure_id" => failure_id,
        "source_kind" => "workflow_run",
        "source_id" => run.run_id,
    );
    payload.extend(application_failure(failure));
    payload
}

/// The fields of a failure the workflow's code raised (the run's own, or an update handler's).
fn application_failure(failure: &WorkflowFailure) -> Map<String, Value> {
    obj!(
        "failure_category" => "application",
        "non_retryable" => failure.non_retryable,
        "exception_type" => failure.exception_type,
        "exception_class" => failure.exception_class.clone().or_else(|| failure.exception_type.clone()),
        "message" => failure.message,
        "exception" => failure.exception,
    )
}
