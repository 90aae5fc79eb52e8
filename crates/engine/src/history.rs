//! History events and the hash chain over them.
//!
//! Every event of a run carries a contiguous `sequence` from 1 and `hash = SHA-256(prev_hash ‖
//! canonical event)`, where the canonical event is the compact JSON of
//! `{event_type, payload, recorded_at, sequence, workflow_command_id, workflow_task_id}` with
//! object keys sorted by their bytes (see [`crate::canonical`]). The first event's `prev_hash`
//! is [`GENESIS_HASH`]. This chain is the base of the recovery ledger: a verifier recomputes it
//! from the stored rows alone.

use crate::canonical::{self, Member};
use crate::ids::{CommandId, EventId, TaskId};
use crate::Millis;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

macro_rules! event_types {
    ($($name:ident),* $(,)?) => {
        /// Every history event type Capstan writes.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
        pub enum EventType { $($name),* }

        impl EventType {
            pub fn as_str(self) -> &'static str {
                match self { $(EventType::$name => stringify!($name)),* }
            }

            pub fn parse(name: &str) -> Option<Self> {
                match name { $(stringify!($name) => Some(EventType::$name),)* _ => None }
            }
        }
    };
}

event_types!(
    StartAccepted,
    WorkflowStarted,
    WorkflowCompleted,
    WorkflowFailed,
    WorkflowCancelled,
    WorkflowTerminated,
    WorkflowTimedOut,
    WorkflowContinuedAsNew,
    CancelRequested,
    TerminateRequested,
    ActivityScheduled,
    ActivityStarted,
    ActivityHeartbeatRecorded,
    ActivityRetryScheduled,
    ActivityCompleted,
    ActivityFailed,
    ActivityTimedOut,
    ActivityCancelled,
    ActivityCancellationAcknowledged,
    TimerScheduled,
    TimerFired,
    TimerCancelled,
    SignalReceived,
    MessageCursorAdvanced,
    SignalWaitOpened,
    SignalApplied,
    ConditionWaitOpened,
    ConditionWaitSatisfied,
    ConditionWaitTimedOut,
    SideEffectRecorded,
    VersionMarkerRecorded,
    SearchAttributesUpserted,
    MemoUpserted,
    UpdateAccepted,
    UpdateRejected,
    UpdateApplied,
    UpdateCompleted,
    ChildWorkflowScheduled,
    ChildRunStarted,
    ChildRunCompleted,
    ChildRunFailed,
    ChildRunCancelled,
    ChildRunTerminated,
    ChildCancellationRequested,
    ChildCancellationResolved,
    ParentClosePolicyApplied,
    ServiceCallStarted,
    ServiceCallCompleted,
    ServiceCallFailed,
    ServiceCallCancelled,
    CooperativeCancellationRequested,
    CooperativeCancellationDelivered,
    SelectionResolved,
    SelectionOperationCancelled,
    RepairRequested,
    ArchiveRequested,
    WorkflowArchived,
);

impl EventType {
    /// Events that settle an authored step (their payload's `sequence`).
    pub fn resolves_step(self) -> bool {
        matches!(
            self,
            EventType::ActivityCompleted
                | EventType::ActivityFailed
                | EventType::ActivityCancelled
                | EventType::ActivityTimedOut
                | EventType::TimerFired
                | EventType::TimerCancelled
                | EventType::ConditionWaitSatisfied
                | EventType::ConditionWaitTimedOut
                | EventType::SignalApplied
                | EventType::ChildRunCompleted
                | EventType::ChildRunFailed
                | EventType::ChildRunCancelled
                | EventType::ChildRunTerminated
                | EventType::ServiceCallCompleted
                | EventType::ServiceCallFailed
                | EventType::ServiceCallCancelled
        )
    }

    /// Events that close a run. Exactly one of them ends every closed run's history.
    pub fn is_run_terminal(self) -> bool {
        matches!(
            self,
            EventType::WorkflowCompleted
                | EventType::WorkflowFailed
                | EventType::WorkflowCancelled
                | EventType::WorkflowTerminated
                | EventType::WorkflowTimedOut
                | EventType::WorkflowContinuedAsNew
        )
    }
}

/// One committed history event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryEvent {
    pub id: EventId,
    pub sequence: u64,
    pub event_type: EventType,
    pub payload: Map<String, Value>,
    pub workflow_task_id: Option<TaskId>,
    pub workflow_command_id: Option<CommandId>,
    pub recorded_at: Millis,
    pub prev_hash: String,
    pub hash: String,
}

impl HistoryEvent {
    /// The canonical form hashed into the chain, written by [`crate::canonical`] so that the key
    /// order never depends on how serde_json's `Map` was built.
    pub fn canonical_json(&self) -> String {
        self.canonical_json_measuring_payload().0
    }

    /// [`Self::canonical_json`] with the length of its payload's text: the payload's compact
    /// JSON, which the history budget counts (only the key order differs from serde's).
    pub fn canonical_json_measuring_payload(&self) -> (String, usize) {
        let optional_id = |id: Option<&str>| Member::Value(id.map_or(Value::Null, Value::from));
        canonical::object_measuring(
            vec![
                ("event_type", Member::Value(self.event_type.as_str().into())),
                ("payload", Member::Object(&self.payload)),
                ("recorded_at", Member::Value(self.recorded_at.into())),
                ("sequence", Member::Value(self.sequence.into())),
                (
                    "workflow_command_id",
                    optional_id(self.workflow_command_id.as_ref().map(CommandId::as_str)),
                ),
                ("workflow_task_id", optional_id(self.workflow_task_id.as_ref().map(TaskId::as_str))),
            ],
            "payload",
        )
    }

    pub fn computed_hash(&self) -> String {
        chain_hash(&self.prev_hash, &self.canonical_json())
    }
}

/// `hex(SHA-256(prev_hash ‖ canonical))`.
pub fn chain_hash(prev_hash: &str, canonical: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(prev_hash.as_bytes());
    hasher.update(canonical.as_bytes());
    hex::encode(hasher.finalize())
}

/// Checks a run's whole history: contiguous sequences from 1 and an unbroken hash chain from
/// the genesis hash. Returns the sequence of the first bad event.
pub fn verify_chain(events: &[HistoryEvent]) -> Result<(), u64> {
    verify_chain_from(GENESIS_HASH, events)
}

/// Like [`verify_chain`] for a run whose chain continues another's (continue-as-new): its first
/// event links to `origin`, the predecessor's last hash.
pub fn verify_chain_from(origin: &str, events: &[HistoryEvent]) -> Result<(), u64> {
    let mut prev = origin.to_string();
    for (index, event) in events.iter().enumerate() {
        if event.sequence != index as u64 + 1 || event.prev_hash != prev || event.computed_hash() != event.hash {
            return Err(event.sequence);
        }
        prev = event.hash.clone();
    }
    Ok(())
}
