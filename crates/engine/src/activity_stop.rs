//! Stop receipts of activity attempts cancelled by a cooperative cancellation. When a delivered
//! cancellation interrupts an activity call whose attempt is running, the attempt's worker is
//! told so on `/status` with a receipt (`cancellation_acknowledgement`), stops its callback and
//! acknowledges the stop (`/acknowledge-cancellation`). The acknowledgement is evidence, not
//! authority: it renews nothing and changes no outcome; it is recorded once per attempt.

use crate::timefmt::iso8601;
use crate::{ActivityExecutionId, CommandId, EventId, Millis, TaskId};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A running attempt that a cooperative cancellation stopped, and what its worker said since.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StoppedAttempt {
    pub task_id: TaskId,
    pub execution_id: ActivityExecutionId,
    pub lease_owner: String,
    pub request_id: CommandId,
    pub cleanup_deadline_at: Millis,
    /// The `ActivityCancelled` event that ended the attempt.
    pub cancellation_event_id: EventId,
    #[serde(default)]
    pub acknowledgement: Option<StopAcknowledgement>,
    /// For a prepared local attempt: the `workflow_task_attempt` of the claim it ran under (its
    /// acknowledgement names that claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_task_attempt: Option<u64>,
}

/// The worker's word that the attempt's callback has stopped.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StopAcknowledgement {
    /// The `ActivityCancellationAcknowledged` event, or (when the run had already closed, and
    /// its history with it) the acknowledgement's own id, kept in the run document.
    pub id: String,
    pub in_history: bool,
    pub at: Millis,
    pub received_after_deadline: bool,
}

/// What an acknowledgement answers: its id, and whether it repeats an earlier one.
#[derive(Clone, Debug, PartialEq)]
pub struct StopReceipt {
    pub acknowledgement: StopAcknowledgement,
    pub duplicate: bool,
}

impl StoppedAttempt {
    /// The receipt of an attempt `request` stopped (`ActivityCancelled` `cancellation_event_id`),
    /// held by `lease_owner` under task `task_id`, before its worker has acknowledged it.
    pub fn stopped_by(
        request: &crate::cancellation::CancellationRequest,
        task_id: TaskId,
        execution_id: ActivityExecutionId,
        lease_owner: String,
        cancellation_event_id: EventId,
    ) -> Self {
        Self {
            task_id,
            execution_id,
            lease_owner,
            request_id: request.request_id.clone(),
            cleanup_deadline_at: request.cleanup_deadline_at,
            cancellation_event_id,
            acknowledgement: None,
            workflow_task_attempt: None,
        }
    }

    /// The receipt a `/status` reply carries for this attempt (DW's `cancellation_acknowledgement`).
    pub fn receipt_view(&self) -> Value {
        let mut view = json!({
            "request_id": self.request_id,
            "root_request_id": self.request_id,
            "cleanup_deadline_at": iso8601(self.cleanup_deadline_at),
            "cancellation_history_event_id": self.cancellation_event_id,
            "callback_state": if self.acknowledgement.is_some() { "stopped" } else { "unknown" },
        });
        if let Some(ack) = &self.acknowledgement {
            view["history_event_id"] = json!(ack.id);
            view["acknowledged_at"] = json!(iso8601(ack.at));
            view["received_after_deadline"] = json!(ack.received_after_deadline);
        }
        view
    }
}
