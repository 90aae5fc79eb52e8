//! Cooperative cancellation's model: a run's cancellation request, where it reached workflow
//! code, and the stopped attempts a deferred delivery waits for. The transitions are in
//! `transitions/cancellation.rs`.

use crate::{ActivityAttemptId, CommandId, EventId, Millis, RunId, WorkflowId};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeSet;

/// A cooperative cancellation of one run (`request-cancellation`): delivered to workflow code at
/// one authored call, after which the run's end is recorded as cancelled; closed as cancelled
/// at `cleanup_deadline_at` if the workflow has not finished by then.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CancellationRequest {
    pub request_id: CommandId,
    pub reason: Option<String>,
    pub requested_at: Millis,
    pub cleanup_deadline_at: Millis,
    /// Steps resolved after the request: the delivery may still interrupt them (the SDKs only
    /// rule out steps resolved before it).
    #[serde(default)]
    pub resolved_after_request: BTreeSet<u32>,
    pub delivery: Option<CancellationDelivery>,
    /// A delivery deferred until the attempts it stopped have stopped (activities with
    /// `wait_cancellation_completed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub awaiting: Option<AwaitedStops>,
}

/// The schema of the cancellation context both SDKs read from the request event and from a
/// prepared local activity's stop.
pub const CANCELLATION_CONTEXT_SCHEMA: &str = "durable-workflow.cancellation-context/v1";

impl CancellationRequest {
    /// The request's cancellation context (`durable-workflow.cancellation-context/v1`), as the
    /// request event records it and a prepared local activity's stop repeats it: this run is
    /// the root and only entry of the lineage. The requester is the control plane (callers are
    /// not yet named principals).
    pub fn context(&self, workflow_id: &WorkflowId, run_id: &RunId) -> Value {
        serde_json::json!({
            "schema": CANCELLATION_CONTEXT_SCHEMA,
            "request_id": self.request_id,
            "root_request_id": self.request_id,
            "root_workflow_instance_id": workflow_id,
            "root_workflow_run_id": run_id,
            "parent_request_id": null,
            "reason": self.reason,
            "requester": {"type": "control_plane", "id": "request-cancellation"},
            "source": "control_plane",
            "requested_at": crate::timefmt::iso8601(self.requested_at),
            "cleanup_deadline_at": crate::timefmt::iso8601(self.cleanup_deadline_at),
            "lineage": [{"request_id": self.request_id, "workflow_instance_id": workflow_id, "workflow_run_id": run_id}],
        })
    }
}

/// A delivery waiting for the workers of the attempts it stopped to acknowledge their stop:
/// the call it was made at (a later delivery must name the same one) and the attempts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AwaitedStops {
    pub sequence: u32,
    pub call_kind: String,
    pub sequence_span: u32,
    pub operation_sequence: Option<u32>,
    pub operation_sequence_span: u32,
    pub attempts: Vec<ActivityAttemptId>,
    /// Calls whose child workflows were asked to cancel and must end first, with the child.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<(u32, WorkflowId, RunId)>,
}

/// Where the cancellation reached workflow code: the authored call it interrupts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancellationDelivery {
    pub sequence: u32,
    pub call_kind: String,
    pub sequence_span: u32,
    pub operation_sequence: Option<u32>,
    pub operation_sequence_span: u32,
    #[serde(default)]
    pub delivered_at: Millis,
    /// The `CooperativeCancellationDelivered` event (cleanup calls name it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_event_id: Option<EventId>,
}
