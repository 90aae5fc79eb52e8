//! Prepared local activities: a local activity whose attempts the server admits, supervises and
//! ends one report at a time, while the workflow task that reached the call stays leased.
//!
//! The inline path (`record_local_activity`) records a local activity's whole story at once,
//! after the worker ran it. On the prepared path the worker asks first (`prepare`: the server
//! records `ActivityScheduled` and `ActivityStarted` and issues the attempt's ids), runs the
//! callback under the workflow task's lease (`control` renews it, `heartbeat` records progress),
//! and reports the outcome; the server owns retries and timeouts. A retry releases the workflow
//! task and schedules the next one for when the retry is due; a worker lost mid-attempt leaves
//! an unfinished attempt that the next claim `recover`s. The state of such an activity lives in
//! the run document only while it is open ([`PreparedLocal`]); what a repeated report is
//! answered with lives in a bounded list of receipts ([`LocalReceipt`]).

use crate::command::{ActivityCancellationPolicy, RetryPolicy, StepTags};
use crate::payload::Payload;
use crate::{ActivityAttemptId, ActivityExecutionId, EventId, Millis, TaskId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// What the worker's replay asks to run: the authored call, as the SDK describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalDescriptor {
    pub activity_type: String,
    pub arguments: Payload,
    /// The policy as the workflow gave it (`None`: the server default).
    pub retry_policy: Option<RetryPolicy>,
    pub cancellation_policy: Option<ActivityCancellationPolicy>,
    pub start_to_close_seconds: Option<i64>,
    pub schedule_to_close_seconds: Option<i64>,
    pub heartbeat_seconds: Option<i64>,
    /// Set on a cleanup call after a delivered cancellation: the authority it runs under.
    pub cleanup: Option<CleanupAuthority>,
    pub tags: StepTags,
    /// SHA-256 of the descriptor's canonical JSON: a retry or a recovery must describe the same
    /// call.
    pub fingerprint: String,
}

/// A cleanup call names the cancellation it cleans up after and where it was delivered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanupAuthority {
    pub request_id: String,
    pub delivery_history_event_id: String,
}

/// An open prepared local activity (running, or waiting for its retry), by its step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreparedLocal {
    pub execution_id: ActivityExecutionId,
    pub step: u32,
    pub descriptor: LocalDescriptor,
    pub scheduled_at: Millis,
    /// Attempts started so far.
    pub attempt_count: u32,
    /// The running attempt, if one runs.
    pub attempt: Option<PreparedAttempt>,
    /// When the next attempt may be prepared, after a retry was scheduled.
    pub retry_due_at: Option<Millis>,
}

/// A running attempt: it holds the workflow task's lease it was prepared under.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PreparedAttempt {
    pub attempt_id: ActivityAttemptId,
    pub number: u32,
    /// The worker's nonce for this admission: the same nonce again is a retried request.
    pub worker_attempt_id: String,
    pub task_id: TaskId,
    pub task_attempt: u64,
    pub lease_owner: String,
    pub started_at: Millis,
    /// Moves with each recorded heartbeat when the call has a heartbeat timeout.
    pub heartbeat_deadline: Option<Millis>,
    /// Set once a cooperative cancellation stopped the attempt: its `ActivityCancelled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_by: Option<EventId>,
    /// The last heartbeat recorded: a heartbeat with the same progress records nothing new.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<RecordedHeartbeat>,
}

/// A heartbeat in history: its `ActivityHeartbeatRecorded` and the progress it carried.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedHeartbeat {
    pub event_id: EventId,
    pub progress: Option<Map<String, Value>>,
}

impl PreparedLocal {
    /// The policy retries are decided by: the workflow's, else the server default.
    pub fn retry_policy(&self) -> RetryPolicy {
        self.descriptor.retry_policy.clone().unwrap_or_else(RetryPolicy::server_default)
    }

    pub fn schedule_to_close_deadline(&self) -> Option<Millis> {
        self.descriptor.schedule_to_close_seconds.map(|s| self.scheduled_at + s * 1000)
    }

    /// The running attempt's deadlines, each cut at the cleanup deadline of a cleanup call.
    pub fn deadlines(&self, attempt: &PreparedAttempt, cleanup_deadline: Option<Millis>) -> LocalDeadlines {
        let cut = |at: Option<Millis>| match (at, cleanup_deadline) {
            (Some(at), Some(cleanup)) => Some(at.min(cleanup)),
            (at, _) => at,
        };
        LocalDeadlines {
            start_to_close: cut(self.descriptor.start_to_close_seconds.map(|s| attempt.started_at + s * 1000)),
            schedule_to_close: cut(self.schedule_to_close_deadline()),
            // Without a heartbeat timeout the only heartbeat bound is the cleanup deadline.
            heartbeat: match self.descriptor.heartbeat_seconds {
                Some(_) => cut(attempt.heartbeat_deadline),
                None => cleanup_deadline,
            },
        }
    }
}

/// The deadlines of a running attempt (absent: no such bound).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalDeadlines {
    pub start_to_close: Option<Millis>,
    pub schedule_to_close: Option<Millis>,
    pub heartbeat: Option<Millis>,
}

impl LocalDeadlines {
    /// The first bound that has passed at `now`, named as its timeout kind.
    pub fn passed(&self, now: Millis) -> Option<&'static str> {
        [
            ("schedule_to_close", self.schedule_to_close),
            ("start_to_close", self.start_to_close),
            ("heartbeat", self.heartbeat),
        ]
        .into_iter()
        .find(|(_, at)| at.is_some_and(|at| at <= now))
        .map(|(kind, _)| kind)
    }
}

/// The cleanup authority echoed on a cleanup call's receipts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CleanupView {
    pub request_id: String,
    pub delivery_history_event_id: String,
    pub cleanup_deadline_at: Millis,
}

/// What `prepare` answers: the admitted attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalAdmission {
    pub duplicate: bool,
    pub execution_id: ActivityExecutionId,
    pub attempt: PreparedAttempt,
    pub lease_expires_at: Millis,
    pub deadlines: LocalDeadlines,
    pub cleanup: Option<CleanupView>,
}

/// What a supervision call (`control` or `heartbeat`) answers about a running attempt.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalSupervision {
    pub execution_id: ActivityExecutionId,
    pub attempt: PreparedAttempt,
    /// Whether the lease was extended (control) — a fresh lease is confirmed without a write.
    pub renewed: bool,
    pub lease_expires_at: Millis,
    pub deadlines: LocalDeadlines,
    pub cleanup: Option<CleanupView>,
    /// The `ActivityHeartbeatRecorded` event of a heartbeat.
    pub heartbeat_event_id: Option<EventId>,
}

/// A running attempt a cooperative cancellation stopped: its worker stops the callback and
/// acknowledges the stop.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalStop {
    pub view: LocalSupervision,
    pub request: crate::cancellation::CancellationRequest,
    pub cancellation_event_id: EventId,
}

/// How a worker says its callback ended.
#[derive(Clone, Debug, PartialEq)]
pub enum LocalReport {
    Completed(Payload),
    Failed {
        message: String,
        exception_type: Option<String>,
        non_retryable: bool,
    },
}

/// The receipt of an ended attempt (an outcome report or a recovery), kept so that a repeated
/// report is answered with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalRecord {
    pub execution_id: ActivityExecutionId,
    pub attempt_id: ActivityAttemptId,
    pub worker_attempt_id: String,
    pub step: u32,
    pub event_id: EventId,
    pub event_type: String,
    pub recorded_at: Millis,
    /// The workflow task claim the report came on.
    pub task_id: TaskId,
    pub task_attempt: u64,
    pub lease_owner: String,
    /// Set when a retry released the claim: the workflow task created for the retry.
    pub retry_task_id: Option<TaskId>,
}

/// What a [`LocalRecord`] answers, and to which request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum LocalReceiptKey {
    /// An outcome report, by its canonical fingerprint.
    Outcome { fingerprint: String },
    /// The server ended the attempt past a deadline, on a supervision call.
    Deadline,
    /// A recovery of an unfinished attempt.
    Recovery,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalReceipt {
    pub key: LocalReceiptKey,
    pub record: LocalRecord,
}

/// What `outcome` and `recover` answer.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalRecordReceipt {
    pub duplicate: bool,
    pub record: LocalRecord,
}

/// A checkpoint of authored commands committed ahead of a prepared call, on one claim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalCheckpoint {
    pub checkpoint_id: String,
    pub task_id: TaskId,
    pub task_attempt: u64,
    pub lease_owner: String,
    pub start_sequence: u32,
    pub next_sequence: u32,
    /// A group checkpoint's local members: their steps and execution ids, in authored order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub locals: Vec<(u32, ActivityExecutionId)>,
}

/// One leaf of a parallel group admitted at once (`checkpoint-group`).
#[derive(Clone, Debug, PartialEq)]
pub enum GroupMember {
    /// A prepared local call: recorded as scheduled; each attempt is prepared afterwards.
    Local(LocalDescriptor),
    /// An activity, a timer or a child, as a completion would carry it.
    Command(crate::command::WorkflowCommand),
}

/// What `checkpoint` answers.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointReceipt {
    pub duplicate: bool,
    pub checkpoint: LocalCheckpoint,
}

/// A heartbeat's reported progress (`progress.details`), recorded as sent.
pub type LocalProgress = Map<String, Value>;
