//! Condition and signal waits: opened by the workflow, resolved by a signal or an update.

use crate::transitions::events::tagged;
use crate::{CommandId, ConditionWait, Payload, SignalId, SignalWait, StepTags};
use serde_json::{json, Map, Value};

/// `ConditionWaitOpened`.
pub(in crate::transitions) fn condition_wait_opened(wait: &ConditionWait, tags: &StepTags) -> Map<String, Value> {
    let payload = obj!(
        "condition_wait_id" => wait.id,
        "condition_key" => wait.condition_key,
        "condition_definition_fingerprint" => wait.fingerprint,
        "sequence" => wait.step,
        "timeout_seconds" => wait.timeout_seconds,
    );
    tagged(with_occurrence(payload, wait), tags)
}

/// A condition event repeats the wait's occurrence identity when the SDK gave one.
fn with_occurrence(mut payload: Map<String, Value>, wait: &ConditionWait) -> Map<String, Value> {
    if let Some(occurrence) = &wait.occurrence_id {
        payload.insert("condition_wait_occurrence_id".into(), json!(occurrence));
    }
    payload
}

/// `SignalWaitOpened`.
pub(in crate::transitions) fn signal_wait_opened(wait: &SignalWait, tags: &StepTags) -> Map<String, Value> {
    let payload = obj!(
        "signal_name" => wait.signal_name,
        "signal_wait_id" => wait.id,
        "sequence" => wait.step,
        "timeout_seconds" => wait.timeout_seconds,
    );
    tagged(payload, tags)
}

/// `SignalApplied`: the signal's value resolves the wait for its name.
pub(in crate::transitions) fn signal_applied(
    wait: &SignalWait,
    command_id: &CommandId,
    signal_id: &SignalId,
    arguments: &Payload,
) -> Map<String, Value> {
    obj!(
        "workflow_command_id" => command_id,
        "signal_id" => signal_id,
        "signal_name" => wait.signal_name,
        "signal_wait_id" => wait.id,
        "sequence" => wait.step,
        "value" => arguments.blob_value(),
        "payload_codec" => arguments.codec,
    )
}

/// What resolved a condition wait.
pub(in crate::transitions) enum Receiver<'a> {
    Signal {
        signal_id: &'a SignalId,
        signal_name: &'a str,
    },
    /// An update whose handler ran.
    Update {
        update_id: &'a str,
    },
}

/// What a condition wait's resolution repeats of it: its identity, step, timer and timeout.
fn condition_resolution(wait: &ConditionWait) -> Map<String, Value> {
    obj!(
        "condition_wait_id" => wait.id,
        "condition_key" => wait.condition_key,
        "condition_definition_fingerprint" => wait.fingerprint,
        "sequence" => wait.step,
        "timer_id" => wait.timer_id,
        "timeout_seconds" => wait.timeout_seconds,
    )
}

/// `ConditionWaitTimedOut`: the wait's own resolution row after its timeout timer fired, with
/// the wait's step tags (a selection member's group path among them), as its opening had.
pub(in crate::transitions) fn condition_wait_timed_out(wait: &ConditionWait, tags: &StepTags) -> Map<String, Value> {
    tagged(with_occurrence(condition_resolution(wait), wait), tags)
}

/// `ConditionWaitSatisfied`.
pub(in crate::transitions) fn condition_wait_satisfied(wait: &ConditionWait, receiver: Receiver) -> Map<String, Value> {
    let mut payload = condition_resolution(wait);
    match receiver {
        Receiver::Signal { signal_id, signal_name } => {
            payload.insert("workflow_signal_id".into(), json!(signal_id));
            payload.insert("signal_name".into(), json!(signal_name));
        }
        Receiver::Update { update_id } => {
            payload.insert("workflow_update_id".into(), json!(update_id));
        }
    }
    with_occurrence(payload, wait)
}
