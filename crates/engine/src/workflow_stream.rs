//! Workflow output streams (DW's run-scoped streams): a run appends items to named streams,
//! closes or errors them, and clients read them by offset (from 0) with a long poll, or append
//! and close through the control plane. Items live in the store, beside the run, never in the
//! run document. The workflow's side rides on `record_side_effect.workflow_stream`: the
//! directive is applied in the completion's transaction, atomically with its plain
//! `SideEffectRecorded`, or the whole completion is refused.

use crate::payload::Payload;
use crate::refusal::{Reason, Refusal};
use crate::Millis;
use serde::{Deserialize, Serialize};

/// Items one append may carry.
pub const MAX_APPEND_ITEMS: usize = 500;
/// The pending-item cap when an append names none.
pub const DEFAULT_MAX_PENDING_ITEMS: u64 = 10_000;
/// How long a closed stream is kept when its close names no retention.
pub const DEFAULT_RETENTION_SECONDS: i64 = 3_600;
/// Items one read returns at most, and by default.
pub const MAX_READ_ITEMS: u64 = 500;
pub const DEFAULT_READ_ITEMS: u64 = 100;
/// The longest a read waits for an item.
pub const MAX_WAIT_SECONDS: u64 = 60;

/// `^[A-Za-z0-9][A-Za-z0-9._:-]{0,190}$`.
pub fn valid_stream_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=191).contains(&bytes.len())
        && bytes[0].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// One item to append.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamItemInput {
    pub payload: Option<Payload>,
    pub payload_reference: Option<String>,
    pub item_type: Option<String>,
    pub content_type: Option<String>,
    pub idempotency_key: Option<String>,
}

/// What a `record_side_effect.workflow_stream` directive asks.
#[derive(Clone, Debug, PartialEq)]
pub enum StreamOperation {
    Append {
        items: Vec<StreamItemInput>,
        max_pending_items: Option<u64>,
    },
    /// Close (`error_reason: None`) or error the stream.
    Finish {
        error_reason: Option<String>,
        retention_seconds: Option<i64>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct StreamDirective {
    pub stream_name: String,
    pub command_identity: String,
    pub command_ordinal: u64,
    pub operation: StreamOperation,
}

impl StreamDirective {
    /// DW's rules for a worker's directive: its identity is the task's command identity, and
    /// every item's key is exactly `dw-stream:{identity}:{ordinal}:{index}`.
    pub fn check(&self, task_identity: &str) -> Result<(), Refusal> {
        let refuse = |message: String| {
            Refusal::new(Reason::InvalidWorkflowStreamCommand, message)
                .with("stream_name", self.stream_name.clone())
                .with("outcome", "rejected")
                .with("recorded", false)
        };
        if self.command_identity != task_identity {
            return Err(refuse(format!(
                "The directive's command_identity must be the task's ({task_identity})."
            )));
        }
        if let StreamOperation::Append { items, .. } = &self.operation {
            for (index, item) in items.iter().enumerate() {
                let expected = format!("dw-stream:{}:{}:{index}", self.command_identity, self.command_ordinal);
                if item.idempotency_key.as_deref() != Some(expected.as_str()) {
                    return Err(refuse(format!("Item {index}'s idempotency_key must be {expected}.")));
                }
            }
        }
        Ok(())
    }
}

/// A directive to apply in the completion's transaction (the store does it: items live in their
/// own rows).
#[derive(Clone, Debug, PartialEq)]
pub struct StreamOp {
    pub directive: StreamDirective,
    pub at: Millis,
}
