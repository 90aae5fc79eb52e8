//! Event payloads, one builder per event type, so every place that records an event type
//! writes the same fields. Where one type is recorded from several places with different
//! fields (a local activity's events, an operator's ledger decision, a cooperative
//! cancellation…), the difference is a variant of the builder's parameter, never a map built at
//! the call site. Each builder is named after its event type. Two recorded types are not built
//! here: `SelectionResolved` (`crate::selection` builds it, as only the selection book knows the
//! winner) and `ActivityCancellationAcknowledged` (`transitions/activity_stop.rs`, beside the one
//! transition that records it).
//!
//! Key order does not matter (the canonical form sorts keys), but which fields a payload has,
//! and which value wins when a step tag has the same name as a field, does: explicit fields
//! always win, tags only add fields the event does not have. (A local activity's echoed fields
//! are the exception: they win over everything, see [`Scheduled::Local`].)
//!
//! Builders take the engine's state and build nothing else: ids (`failure_id`…) and messages
//! the run also keeps are made by the caller, in the order it always made them.

use crate::{Cx, Payload, StepTags, WorkflowFailure};
use serde_json::{json, Map, Value};

mod activity;
mod children;
mod control;
mod messages;
mod prepared_local;
mod records;
mod run;
mod timers;
mod waits;

pub(super) use activity::*;
pub(super) use children::*;
pub(super) use control::*;
pub(super) use messages::*;
pub(super) use prepared_local::*;
pub(super) use records::*;
pub(super) use run::*;
pub(super) use timers::*;
pub(super) use waits::*;

fn payload_json(payload: &Payload) -> Value {
    payload.envelope()
}

/// Adds the step tags the payload does not already have.
fn extend(map: &mut Map<String, Value>, tags: &StepTags) {
    for (key, value) in tags {
        map.entry(key.clone()).or_insert_with(|| value.clone());
    }
}

/// `fields`, then the step tags they lack.
/// [`tagged`] for rows built outside this module.
pub(in crate::transitions) fn tagged_row(fields: Map<String, Value>, tags: &StepTags) -> Map<String, Value> {
    tagged(fields, tags)
}

fn tagged(fields: Map<String, Value>, tags: &StepTags) -> Map<String, Value> {
    let mut payload = fields;
    extend(&mut payload, tags);
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

/// Adds the caller's trace context to the event a client request caused (`SignalReceived`,
/// `UpdateAccepted`, `CancelRequested`/`TerminateRequested`): recorded, like a header, so the
/// request's trace can be found from history. The SDKs ignore the field on replay.
pub(in crate::transitions) fn record_caller_trace(payload: &mut Map<String, Value>, cx: &Cx) {
    if let Some(trace) = &cx.caller_trace {
        payload.insert("observability_context".into(), trace.envelope());
    }
}
