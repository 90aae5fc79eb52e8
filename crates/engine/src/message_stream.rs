//! Message streams (DW's instance message streams): a client appends messages to a named stream
//! of a workflow instance, each under a caller `message_id`; the server numbers them from 1 per
//! instance and stream and delivers each to the current run as the reserved signal
//! [`MESSAGE_STREAM_SIGNAL`]. The workflow's `receive()` consumes them in position order and
//! reports how far it got with each workflow task completion (`message_stream_cursors`), and
//! which streams a blocked `receive()` waits on (`message_stream_waits`).
//!
//! The state is the instance's, not the run's: it moves to the next run at continue-as-new,
//! which is given a cursor checkpoint and every message its predecessor had not consumed.
//! Dedupe by `message_id` is not kept here (that would grow the run document without bound):
//! an append is a keyed command, and its stored receipt answers a repeat.

use crate::ids::{valid_client_name, CommandId, RunId, SignalId};
use crate::payload::Payload;
use crate::Millis;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// The signal name every delivery travels under (both SDKs refuse it for user signals).
pub const MESSAGE_STREAM_SIGNAL: &str = "__durable_workflow_message_stream";
/// The `schema` of a delivered message.
pub const MESSAGE_SCHEMA: &str = "durable-workflow.v2.message-stream.message";
/// The `schema` of a cursor checkpoint (the first deliveries of a continued run).
pub const CURSOR_SCHEMA: &str = "durable-workflow.v2.message-stream.cursor";
/// The keyed-command type an append is stored under (its request id is
/// `{stream}/{message_id}`; neither may contain `/`).
pub const APPEND_COMMAND_TYPE: &str = "message_stream_append";

/// Streams one instance may have.
pub const MAX_STREAMS: usize = 100;
/// Delivered messages a stream may hold that the workflow has not consumed yet: they live in
/// the run document until consumed, so the backlog is bounded (`429 message_stream_backlog_full`).
pub const MAX_UNCONSUMED: usize = 1_000;
/// Entries of `message_stream_cursors` or `message_stream_waits` in one completion.
pub const MAX_PROGRESS_ENTRIES: usize = 100;

/// `^[A-Za-z0-9._:-]{1,128}$`, as both SDKs and DW check it.
pub fn valid_stream_name(name: &str) -> bool {
    valid_client_name(name, 128)
}

/// `^[A-Za-z0-9._:-]{1,191}$`.
pub fn valid_message_id(id: &str) -> bool {
    valid_client_name(id, 191)
}

/// The request id an append is keyed by: one per (stream, message id) of an instance.
pub fn append_request_id(stream_name: &str, message_id: &str) -> String {
    format!("{stream_name}/{message_id}")
}

/// One stream of an instance.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageStream {
    /// The position of the newest message (0: none yet).
    pub last_position: u64,
    /// How far the workflow has consumed (every position at or below it).
    pub cursor: u64,
    /// Delivered messages above the cursor, in position order.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub unconsumed: VecDeque<StreamMessage>,
    /// The wait a blocked `receive()` declared (diagnostics only: delivery never depends on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_wait: Option<StreamWait>,
    /// Appends answered from an earlier receipt, or refused for reusing an id.
    #[serde(default)]
    pub duplicate_count: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_input: Option<StreamInput>,
}

/// A message the workflow has not consumed: kept to be delivered again to a continued run, or
/// offered again to a signal wait opened after its delivery.
///
/// A message for a run that has not completed its first workflow task is *held* (`run_id`
/// `None`) and delivered right after that completion: the Python SDK binds a signal recorded
/// before the run's first wait to that wait on replay, while its first execution saw the
/// signal at once, so a delivery there would make the two disagree about the cursor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamMessage {
    pub position: u64,
    pub message_id: String,
    /// The signal's argument list (the delivery map), as recorded in `SignalReceived`.
    pub delivery: Payload,
    /// The delivery's signal (`None` while held).
    #[serde(default)]
    pub signal_id: Option<SignalId>,
    pub command_id: CommandId,
    /// The run it was delivered to (`None`: held for the current run).
    #[serde(default)]
    pub run_id: Option<RunId>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamWait {
    pub run_id: RunId,
    pub after_position: u64,
    pub since: Millis,
}

/// The last append seen on a stream: `outcome` is `accepted`, `duplicate` or
/// `message_identity_conflict`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamInput {
    pub outcome: String,
    pub message_id: String,
    pub at: Millis,
}

/// The instance's streams, by name.
pub type MessageStreams = BTreeMap<String, MessageStream>;

/// What a completion reports about its streams.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamProgress {
    /// `message_stream_cursors`: `(stream_name, through_position)`.
    pub cursors: Vec<(String, u64)>,
    /// `message_stream_waits`: `(stream_name, after_position)`.
    pub waits: Vec<(String, u64)>,
}

/// What an accepted append answers.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamAppendReceipt {
    pub stream_name: String,
    pub message_id: String,
    pub position: u64,
    pub cursor_position: u64,
    /// The delivery's signal (`None`: held until the run's first workflow task completes).
    pub signal_id: Option<SignalId>,
    pub command_id: CommandId,
}
