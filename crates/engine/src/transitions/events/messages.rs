//! Signals and updates as they arrive and as their handlers end.

use crate::transitions::events::{application_failure, payload_json};
use crate::{CommandId, Payload, RunState, SignalId, UpdateRecord, UpdateRejection, WorkflowFailure};
use serde_json::{json, Map, Value};

/// `SignalReceived`.
pub(in crate::transitions) fn signal_received(
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
pub(in crate::transitions) struct UpdateRef<'a> {
    pub command_id: &'a CommandId,
    pub update_id: &'a str,
    pub update_name: &'a str,
}

impl<'a> UpdateRef<'a> {
    /// An accepted update, as its record keeps it.
    pub(in crate::transitions) fn of(record: &'a UpdateRecord, update_id: &'a str) -> Self {
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
pub(in crate::transitions) fn update_accepted(run: &RunState, update: &UpdateRef, arguments: &Payload) -> Map<String, Value> {
    let mut payload = update_identity(run, update);
    payload.extend(obj!("arguments" => payload_json(arguments), "payload_codec" => arguments.codec));
    payload
}

/// `UpdateRejected`: the validator's verdict, before acceptance.
pub(in crate::transitions) fn update_rejected(
    run: &RunState,
    update: &UpdateRef,
    arguments: &Payload,
    rejection: &UpdateRejection,
) -> Map<String, Value> {
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
pub(in crate::transitions) fn update_applied(
    run: &RunState,
    update: &UpdateRef,
    wait_step: Option<u32>,
    arguments: &Payload,
) -> Map<String, Value> {
    let mut payload = update_identity(run, update);
    if let Some(step) = wait_step {
        payload.insert("sequence".into(), json!(step));
    }
    payload.insert("arguments".into(), payload_json(arguments));
    payload
}

/// How an update's handler ended.
pub(in crate::transitions) enum UpdateEnd<'a> {
    /// With a result; `wait_step` as for [`update_applied`].
    Completed {
        result: &'a Payload,
        wait_step: Option<u32>,
    },
    Failed(&'a WorkflowFailure),
}

/// `UpdateCompleted`, with the handler's result or its failure.
pub(in crate::transitions) fn update_completed(run: &RunState, update: &UpdateRef, end: UpdateEnd) -> Map<String, Value> {
    let mut payload = update_identity(run, update);
    match end {
        UpdateEnd::Completed { result, wait_step } => {
            if let Some(step) = wait_step {
                payload.insert("sequence".into(), json!(step));
            }
            payload.insert("result".into(), result.blob_value());
            payload.insert("payload_codec".into(), json!(result.codec));
        }
        UpdateEnd::Failed(failure) => payload.extend(application_failure(failure)),
    }
    payload
}
