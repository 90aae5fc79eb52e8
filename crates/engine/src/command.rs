//! Workflow-task commands in engine form. The HTTP layer converts the wire JSON into these by
//! hand; the engine never sees request JSON.

use crate::payload::Payload;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Parallel-group and other descriptive fields copied verbatim from a command onto its events.
pub type StepTags = Map<String, Value>;

/// The parallel-group and selection fields a step command carries and its events repeat.
pub const STEP_TAG_FIELDS: &[&str] = &[
    "parallel_group_id",
    "parallel_group_kind",
    "parallel_group_base_sequence",
    "parallel_group_size",
    "parallel_group_index",
    "parallel_group_path",
    "parallel_group_mode",
    "selection_member_key",
    "selection_member_index",
    "selection_member_base_sequence",
    "selection_member_size",
    "selection_member_kind",
];

/// The step tags of a command or of an event that repeats them (null fields are no tags).
pub fn step_tags_of(fields: &Map<String, Value>) -> StepTags {
    STEP_TAG_FIELDS
        .iter()
        .filter_map(|k| fields.get(*k).filter(|v| !v.is_null()).map(|v| (k.to_string(), v.clone())))
        .collect()
}

#[derive(Clone, Debug, PartialEq)]
pub enum WorkflowCommand {
    ScheduleActivity(ScheduleActivity),
    StartTimer {
        delay_seconds: i64,
        tags: StepTags,
    },
    OpenConditionWait {
        condition_key: Option<String>,
        fingerprint: Option<String>,
        timeout_seconds: Option<i64>,
        /// The SDK's identity of this wait occurrence (Rust: `rust:condition-wait:{n}`), recorded
        /// on every condition event of the step: the Rust replayer requires it there.
        occurrence_id: Option<String>,
        tags: StepTags,
    },
    OpenSignalWait {
        signal_name: String,
        timeout_seconds: Option<i64>,
        tags: StepTags,
    },
    RecordSideEffect {
        result: Payload,
        tags: StepTags,
        /// A workflow output stream directive riding on the side effect.
        stream: Option<crate::workflow_stream::StreamDirective>,
    },
    RecordVersionMarker {
        change_id: String,
        version: i64,
        min_supported: i64,
        max_supported: i64,
        tags: StepTags,
    },
    UpsertSearchAttributes {
        attributes: Map<String, Value>,
        /// The declared type of each upserted key (Rust sends it), recorded for typed replay.
        attribute_types: Option<Map<String, Value>>,
        tags: StepTags,
    },
    /// `result` is filled by the caller (an Avro null when the worker sent none).
    CompleteWorkflow {
        result: Payload,
    },
    FailWorkflow(WorkflowFailure),
    /// Start a child workflow (a new instance) linked to this run.
    StartChildWorkflow(StartChild),
    /// Call a Nexus service operation (see `crate::service_call`).
    StartServiceOperation(crate::service_call::ServiceOperation),
    /// The result of an update's handler (no step of its own).
    CompleteUpdate {
        update_id: String,
        result: Payload,
    },
    /// An update's handler failed (no step of its own, and no `UpdateApplied`).
    FailUpdate {
        update_id: String,
        failure: WorkflowFailure,
    },
    /// Merge entries (an encoded map; null deletes) into the run's memo.
    UpsertMemo {
        entries: Payload,
        tags: StepTags,
    },
    /// A local activity the worker already ran inside this workflow task, with its outcome.
    RecordLocalActivity(LocalActivityRecord),
    /// Cancel a member of a durable selection that has not settled (no step of its own).
    CancelSelectionOperation(SelectionCancel),
    /// Close this run and start the next run of the same instance with new input.
    ContinueAsNew {
        arguments: Payload,
        workflow_type: Option<String>,
        queue: Option<String>,
        tags: StepTags,
        /// The issuing task's trace context: the next run's origin (else the current one's).
        observability_context: Option<crate::trace::TraceContext>,
    },
}

impl WorkflowCommand {
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            WorkflowCommand::CompleteWorkflow { .. } | WorkflowCommand::FailWorkflow(_) | WorkflowCommand::ContinueAsNew { .. }
        )
    }

    /// The kind name used to match a re-sent parallel-group member against its recorded step.
    pub fn step_kind(&self) -> Option<StepKind> {
        Some(match self {
            WorkflowCommand::ScheduleActivity(a) => StepKind::Activity(a.activity_type.clone()),
            WorkflowCommand::RecordLocalActivity(a) => StepKind::Activity(a.activity_type.clone()),
            WorkflowCommand::StartTimer { .. } => StepKind::Timer,
            WorkflowCommand::OpenConditionWait { .. } => StepKind::ConditionWait,
            WorkflowCommand::OpenSignalWait { signal_name, .. } => StepKind::SignalWait(signal_name.clone()),
            WorkflowCommand::RecordSideEffect { .. } => StepKind::SideEffect,
            WorkflowCommand::RecordVersionMarker { .. } => StepKind::VersionMarker,
            WorkflowCommand::UpsertSearchAttributes { .. } => StepKind::SearchAttributes,
            WorkflowCommand::ContinueAsNew { .. } => StepKind::ContinueAsNew,
            WorkflowCommand::UpsertMemo { .. } => StepKind::Memo,
            WorkflowCommand::StartChildWorkflow(child) => StepKind::ChildWorkflow(child.workflow_type.clone()),
            WorkflowCommand::StartServiceOperation(_) => StepKind::ServiceCall,
            WorkflowCommand::CompleteWorkflow { .. }
            | WorkflowCommand::FailWorkflow(_)
            | WorkflowCommand::CompleteUpdate { .. }
            | WorkflowCommand::FailUpdate { .. }
            | WorkflowCommand::CancelSelectionOperation(_) => return None,
        })
    }

    pub fn tags(&self) -> Option<&StepTags> {
        match self {
            WorkflowCommand::ScheduleActivity(a) => Some(&a.tags),
            WorkflowCommand::RecordLocalActivity(a) => Some(&a.tags),
            WorkflowCommand::StartTimer { tags, .. }
            | WorkflowCommand::OpenConditionWait { tags, .. }
            | WorkflowCommand::OpenSignalWait { tags, .. }
            | WorkflowCommand::RecordSideEffect { tags, .. }
            | WorkflowCommand::RecordVersionMarker { tags, .. }
            | WorkflowCommand::UpsertSearchAttributes { tags, .. }
            | WorkflowCommand::ContinueAsNew { tags, .. }
            | WorkflowCommand::UpsertMemo { tags, .. } => Some(tags),
            WorkflowCommand::StartChildWorkflow(child) => Some(&child.tags),
            WorkflowCommand::StartServiceOperation(op) => Some(&op.tags),
            WorkflowCommand::CompleteWorkflow { .. }
            | WorkflowCommand::FailWorkflow(_)
            | WorkflowCommand::CompleteUpdate { .. }
            | WorkflowCommand::FailUpdate { .. }
            | WorkflowCommand::CancelSelectionOperation(_) => None,
        }
    }
}

/// Which selection member to cancel, as the SDK's handle names it.
#[derive(Clone, Debug, PartialEq)]
pub struct SelectionCancel {
    pub selection_group_id: String,
    pub member_key: Value,
    pub member_index: u64,
    pub member_base_sequence: u32,
    pub member_size: u32,
    pub operation_kind: String,
    pub operation_identity: String,
}

/// A local activity's record: the worker ran every attempt itself before completing the task.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalActivityRecord {
    pub activity_type: String,
    pub arguments: Payload,
    /// The retry policy and timeouts the worker applied, echoed on `ActivityScheduled`.
    pub echoed: Map<String, Value>,
    pub outcome: LocalOutcome,
    /// One per attempt, oldest first (at least one).
    pub attempts: Vec<LocalAttempt>,
    pub tags: StepTags,
}

#[derive(Clone, Debug, PartialEq)]
pub enum LocalOutcome {
    Completed(Payload),
    Failed(LocalFailure),
    TimedOut(LocalFailure),
    Cancelled(LocalFailure),
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct LocalFailure {
    pub message: String,
    pub exception_type: Option<String>,
    pub non_retryable: bool,
    pub timeout_kind: Option<String>,
}

/// One attempt of a local activity as the worker reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct LocalAttempt {
    pub attempt_number: u32,
    /// The worker's own id for the attempt.
    pub worker_attempt_id: Option<String>,
    /// `{elapsed_ms, details}` per heartbeat.
    pub heartbeats: Vec<Value>,
    /// For an attempt that was retried: why, and its failure (`retry_reason`, `backoff_seconds`,
    /// `message`, `exception_type`, `timeout_kind`).
    pub retry: Map<String, Value>,
    /// How long the attempt ran, as the worker measured it.
    pub duration_ms: Option<i64>,
}

impl LocalActivityRecord {
    /// History events this record appends.
    pub fn event_count(&self) -> usize {
        2 + self.attempts.iter().map(|a| 2 + a.heartbeats.len()).sum::<usize>()
    }
}

/// What a step sequence was used for; recorded per run so re-sent group members can be recognised.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepKind {
    Activity(String),
    Timer,
    ConditionWait,
    SignalWait(String),
    SideEffect,
    VersionMarker,
    SearchAttributes,
    ContinueAsNew,
    Memo,
    ChildWorkflow(String),
    ServiceCall,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StartChild {
    pub workflow_type: String,
    pub arguments: Payload,
    pub queue: Option<String>,
    /// Caller-chosen child id; derived from the parent's ids and the step when absent.
    pub workflow_id: Option<String>,
    /// `abandon`, `terminate` or `request_cancel`: what happens to the child when the parent closes.
    pub parent_close_policy: String,
    pub cancellation_policy: String,
    pub execution_timeout_seconds: Option<i64>,
    pub run_timeout_seconds: Option<i64>,
    /// Server-side retries of a failed child run (`max_attempts: None` means one attempt).
    pub retry_policy: Option<RetryPolicy>,
    pub tags: StepTags,
    /// The parent task's trace context: the child run's origin.
    pub observability_context: Option<crate::trace::TraceContext>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ScheduleActivity {
    pub activity_type: String,
    pub arguments: Payload,
    pub queue: Option<String>,
    pub retry_policy: Option<RetryPolicy>,
    pub timeouts: ActivityTimeouts,
    /// What a cancellation of the workflow does to this activity; recorded on
    /// `ActivityScheduled` (both SDKs replay it; absent means `try_cancel`).
    pub cancellation_policy: Option<ActivityCancellationPolicy>,
    /// The worker session the activity must run in: only its holder is offered the task.
    /// Recorded on `ActivityScheduled` as the workflow sent it (the Rust SDK replays it).
    pub worker_session: Option<SessionRequirement>,
    pub tags: StepTags,
}

/// An activity's cancellation policy, as the SDKs name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ActivityCancellationPolicy {
    TryCancel,
    WaitCancellationCompleted,
    Abandon,
}

impl ActivityCancellationPolicy {
    pub const ALL: [Self; 3] = [Self::TryCancel, Self::WaitCancellationCompleted, Self::Abandon];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::TryCancel => "try_cancel",
            Self::WaitCancellationCompleted => "wait_cancellation_completed",
            Self::Abandon => "abandon",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == text)
    }
}

/// A `schedule_activity.worker_session`: the session the activity must run in. `as_sent` is
/// the object exactly as the workflow sent it (it is recorded and replayed verbatim).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionRequirement {
    pub options: crate::session::SessionOptions,
    pub as_sent: Map<String, Value>,
}

/// Activity retry policy as DW defines it. `max_attempts: None` means unlimited.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub max_attempts: Option<u32>,
    pub backoff_seconds: Vec<i64>,
    pub non_retryable_error_types: Vec<String>,
}

impl RetryPolicy {
    /// Used when a `schedule_activity` carries no policy: retry until it succeeds, backing off
    /// 1 s, 2 s, 4 s … capped at 60 s — what a Temporal user expects.
    pub fn server_default() -> Self {
        Self {
            max_attempts: None,
            backoff_seconds: vec![1, 2, 4, 8, 16, 32, 60],
            non_retryable_error_types: vec![],
        }
    }

    /// Backoff before attempt `failed_attempts + 1`.
    pub fn backoff_after(&self, failed_attempts: u32) -> i64 {
        if self.backoff_seconds.is_empty() {
            return 1;
        }
        let index = (failed_attempts.max(1) - 1) as usize;
        self.backoff_seconds[index.min(self.backoff_seconds.len() - 1)]
    }

    pub fn allows_attempt(&self, attempt_number: u32) -> bool {
        self.max_attempts.is_none_or(|max| attempt_number <= max)
    }

    /// Whether the policy lists `exception_type` among the failures never retried.
    pub fn never_retries(&self, exception_type: Option<&str>) -> bool {
        exception_type.is_some_and(|t| self.non_retryable_error_types.iter().any(|n| n == t))
    }

    /// The retry after attempt `attempt_number` ended at `now`: when it is due and its backoff in
    /// seconds — unless the end was not `retryable`, the policy has no attempt left, or the retry
    /// would start at or past `deadline` (schedule-to-close).
    pub fn retry_after(
        &self,
        attempt_number: u32,
        retryable: bool,
        now: crate::Millis,
        deadline: Option<crate::Millis>,
    ) -> Option<(crate::Millis, i64)> {
        let backoff_seconds = self.backoff_after(attempt_number);
        let due = now + backoff_seconds * 1000;
        let allowed = retryable && self.allows_attempt(attempt_number + 1) && deadline.is_none_or(|deadline| due < deadline);
        allowed.then_some((due, backoff_seconds))
    }

    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "max_attempts": self.max_attempts,
            "backoff_seconds": self.backoff_seconds,
            "non_retryable_error_types": self.non_retryable_error_types,
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ActivityTimeouts {
    pub start_to_close_seconds: Option<i64>,
    pub schedule_to_start_seconds: Option<i64>,
    pub schedule_to_close_seconds: Option<i64>,
    pub heartbeat_seconds: Option<i64>,
}

/// A workflow's own failure (`fail_workflow`) or an activity failure report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkflowFailure {
    pub message: String,
    pub exception_type: Option<String>,
    pub exception_class: Option<String>,
    pub exception: Option<Value>,
    pub non_retryable: bool,
    /// Where the run failed, when an activity failure escaped the workflow (both SDKs send it
    /// with `fail_workflow`; DW's redrive resumes from it). Recorded on `WorkflowFailed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boundary: Option<FailureBoundary>,
}

/// The step and activity execution a workflow failure came from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FailureBoundary {
    pub failed_step_sequence: i64,
    pub failed_activity_execution_id: String,
}

/// An activity attempt's failure as reported by a worker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ActivityFailure {
    pub message: String,
    pub failure_type: Option<String>,
    pub class: Option<String>,
    pub code: Option<Value>,
    pub stack_trace: Option<String>,
    pub non_retryable: bool,
    pub details: Option<Payload>,
}
