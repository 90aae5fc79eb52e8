//! The state of one workflow run, and the bookkeeping every transition shares.

use crate::cancellation::CancellationRequest;
use crate::command::{ActivityCancellationPolicy, ActivityTimeouts, RetryPolicy, SessionRequirement, StepTags, WorkflowFailure};
use crate::contract::CommandContract;
use crate::history::{chain_hash, EventType, HistoryEvent, GENESIS_HASH};
use crate::ledger::{ActionDefinition, ActionPin, LedgerCheckpoint, LedgerEntry};
use crate::limits::Limits;
use crate::payload::Payload;
use crate::scheduling::TaskScheduling;
use crate::selection::SelectionBook;
use crate::status::{ClosedReason, RunStatus};
use crate::{
    ActivityAttemptId, ActivityExecutionId, CommandId, EventId, IdSource, Millis, ResumeContext, RunId, Task, TaskClosure, TaskDetail,
    TaskId, TaskKind, TaskState, TimerId, WaitId, WorkflowId,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActivityExecution {
    pub id: ActivityExecutionId,
    pub step: u32,
    pub activity_type: String,
    pub queue: String,
    pub arguments: Payload,
    pub retry_policy: RetryPolicy,
    /// Whether the workflow gave the policy (it is echoed to workers only then).
    pub retry_policy_given: bool,
    pub timeouts: ActivityTimeouts,
    pub scheduled_at: Millis,
    pub schedule_to_close_deadline: Option<Millis>,
    /// Attempts started so far.
    pub attempt_count: u32,
    /// Every attempt id ever issued for this execution, oldest first.
    pub attempt_ids: Vec<ActivityAttemptId>,
    /// The activity task of the current (or next) attempt.
    pub task_id: TaskId,
    /// The last progress details an attempt heartbeated; handed to the next attempt.
    #[serde(default)]
    pub last_heartbeat_details: Option<Value>,
    pub tags: StepTags,
    /// The action definition pinned when it was scheduled (a declared consequential action).
    #[serde(default)]
    pub action: Option<ActionPin>,
    /// The ledger entry of the current dispatch, while one is open.
    #[serde(default)]
    pub ledger_key: Option<String>,
    /// Set while the last dispatch's outcome is unknown: no attempt runs until it is resolved.
    #[serde(default)]
    pub blocked_by: Option<String>,
    /// The workflow's cancellation policy for this activity, when it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancellation_policy: Option<ActivityCancellationPolicy>,
    /// The worker session the activity runs in: its tasks go only to the session's holder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_session: Option<SessionRequirement>,
    /// Retries a reconciliation probe's `absent` answer scheduled (bounded by
    /// `PROBE_RETRIES_PER_EXECUTION`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub probe_retries: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_u64(n: &u64) -> bool {
    *n == 0
}

impl ActivityExecution {
    /// The key the provider deduplicates this action by: read from the arguments where the
    /// definition points, else the `activity_execution_id`, stable across attempts.
    pub fn provider_key(&self) -> &str {
        self.action
            .as_ref()
            .and_then(|pin| pin.idempotency_key.as_deref())
            .unwrap_or(self.id.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TimerPurpose {
    User,
    ConditionTimeout(WaitId),
    SignalTimeout(WaitId),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimerState {
    pub id: TimerId,
    pub step: u32,
    pub delay_seconds: i64,
    pub fire_at: Millis,
    pub task_id: TaskId,
    pub purpose: TimerPurpose,
    pub tags: StepTags,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConditionWait {
    pub id: WaitId,
    pub step: u32,
    pub condition_key: Option<String>,
    pub fingerprint: Option<String>,
    pub timeout_seconds: Option<i64>,
    pub timer_id: Option<TimerId>,
    /// The SDK's occurrence identity of the wait, repeated on each of its condition events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occurrence_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SignalWait {
    pub id: WaitId,
    pub step: u32,
    pub signal_name: String,
    pub timeout_seconds: Option<i64>,
    pub timer_id: Option<TimerId>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UpdateStatus {
    Accepted,
    Completed,
    Failed,
    /// Refused by its validator before acceptance: never applied.
    Rejected,
}

impl UpdateStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            UpdateStatus::Accepted => "accepted",
            UpdateStatus::Completed => "completed",
            UpdateStatus::Failed => "failed",
            UpdateStatus::Rejected => "rejected",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UpdateRecord {
    pub update_name: String,
    pub arguments: Payload,
    pub command_id: CommandId,
    pub status: UpdateStatus,
    pub result: Option<Payload>,
    pub failure: Option<WorkflowFailure>,
    #[serde(default)]
    pub accepted_at: Millis,
    #[serde(default)]
    pub closed_at: Option<Millis>,
    /// A validator's field errors (`{field: [message]}`), for a rejected update.
    #[serde(default)]
    pub validation_errors: Option<Value>,
}

/// What a closed task answered, kept so an identical retried report gets the same answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClosedTaskReceipt {
    pub task_id: TaskId,
    pub owner: String,
    pub fence: u64,
    pub attempt_id: Option<ActivityAttemptId>,
    pub report: ReportKind,
    pub receipt: Receipt,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReportKind {
    CompleteWorkflowTask,
    FailWorkflowTask,
    CompleteActivity,
    FailActivity,
}

/// The answer to an accepted worker report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub run_status: RunStatus,
    /// Tasks the report created (a next workflow task, activity tasks, a retry task…).
    pub created_task_ids: Vec<TaskId>,
    /// For activity reports: the run's workflow task that the resolution woke, if any.
    pub next_task_id: Option<TaskId>,
    /// `recorded` for reports that changed state; `retained` when replayed from a receipt.
    pub retained: bool,
}

/// The version of the [`RunState`] document this build writes. Raise it when a change to the
/// document would be misread by an older build, so that build refuses the run instead.
/// Version 2: steps as runs of one kind (`step_log`), worker task receipts on task rows.
pub const RUN_DOCUMENT_VERSION: u32 = 2;

/// Refuses a run document this build cannot read: one written by a newer build (or carrying a
/// version no build writes). The store calls it on every document it loads.
pub fn check_document_version(run: &RunState) -> Result<(), String> {
    match run.document_version {
        0 => Err("run document version 0 is not a version any build writes".into()),
        version if version > RUN_DOCUMENT_VERSION => Err(format!(
            "run document version {version} is newer than this build reads ({RUN_DOCUMENT_VERSION})"
        )),
        _ => Ok(()),
    }
}

/// Everything about one run that transitions read and write. The store persists it whole.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// [`RUN_DOCUMENT_VERSION`] when the document was written; documents from before the field
    /// existed read as version 1.
    #[serde(default = "first_document_version")]
    pub document_version: u32,
    pub namespace: String,
    pub workflow_id: WorkflowId,
    pub run_id: RunId,
    pub run_number: u32,
    pub workflow_type: String,
    pub task_queue: String,
    pub status: RunStatus,
    pub closed_reason: Option<ClosedReason>,
    pub input: Payload,
    pub output: Option<Payload>,
    pub failure: Option<WorkflowFailure>,
    pub business_key: Option<String>,
    /// The memo as plain JSON (the start memo, then the projection of every merge).
    pub memo: Map<String, Value>,
    /// The canonical encoded memo after the last upsert, if any.
    #[serde(default)]
    pub memo_merged: Option<Payload>,
    pub search_attributes: Map<String, Value>,
    /// Its tasks' priority and fairness class (the start's; a child or a next run inherits).
    #[serde(default, skip_serializing_if = "TaskScheduling::is_default")]
    pub scheduling: TaskScheduling,
    pub execution_timeout_seconds: Option<i64>,
    pub run_timeout_seconds: Option<i64>,
    pub execution_deadline_at: Option<Millis>,
    pub run_deadline_at: Option<Millis>,
    pub started_at: Millis,
    pub closed_at: Option<Millis>,
    pub last_progress_at: Millis,
    pub start_command_id: CommandId,

    /// An operator archived the closed run: it is read-only.
    #[serde(default)]
    pub archived: bool,
    /// The parent run's step that started this instance, for child workflows.
    #[serde(default)]
    pub parent: Option<ParentLink>,
    /// Open children of this run, by the step that started them.
    #[serde(default)]
    pub children: BTreeMap<u32, ChildLink>,
    /// The run this one continues (continue-as-new), if any.
    #[serde(default)]
    pub continued_from_run_id: Option<RunId>,
    /// The hash the run's first event links to: the genesis hash, or the last hash of the run it
    /// continues, so one instance's runs form one chain.
    #[serde(default = "genesis")]
    pub chain_origin: String,
    /// Sequence of the last history event (0 before the first).
    pub last_sequence: u64,
    /// Hash of the last history event (the genesis hash before the first).
    pub last_hash: String,
    /// Bytes of history so far (each event's type and JSON payload; DW's history budget). Runs
    /// written before the field existed count from their first event written after it.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub history_size_bytes: u64,
    /// The largest `parallel_group_size` any event of the run recorded (DW's fan-out).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub history_fan_out: u64,
    /// Next workflow step sequence to hand out (steps start at 1).
    pub next_step: u32,
    /// What each recorded step was, by step sequence.
    pub steps: crate::step_log::StepLog,
    /// Control-plane commands applied to this run (the receipts' `command_sequence`).
    pub command_count: u32,

    /// Open tasks of this run, by id.
    pub tasks: BTreeMap<TaskId, Task>,
    /// The one ready-or-leased workflow task.
    pub workflow_task: Option<TaskId>,
    /// Something resolved while the workflow task was leased: make a new task when it ends.
    pub workflow_task_wanted: bool,
    /// Signals that still need their own resume task, oldest first.
    pub pending_resumes: VecDeque<ResumeContext>,
    /// Signals accepted while a workflow task was leased, whose `SignalReceived` is recorded when
    /// that lease ends. Recorded at once, they would precede the leased task's own events, and
    /// the SDKs bind a receiver to the wait opened just before it: replay would then deliver the
    /// signal to a wait the live task never saw it in (non-deterministic). Durable with the run.
    #[serde(default)]
    pub deferred_signals: Vec<DeferredSignal>,
    pub activities: BTreeMap<ActivityExecutionId, ActivityExecution>,
    pub timers: BTreeMap<TimerId, TimerState>,
    pub condition_waits: Vec<ConditionWait>,
    pub signal_waits: Vec<SignalWait>,
    /// Receipts of closed tasks this transition may be asked about again: the store loads the
    /// receipt of the task a report names with the run (it is kept on the task's row, see
    /// [`Effects::receipts`]), and a transition adds the ones it records. Documents written before
    /// receipts moved to task rows still carry theirs; they are read, never written back.
    #[serde(default, skip_serializing)]
    pub closed_receipts: VecDeque<ClosedTaskReceipt>,
    /// Accepted updates waiting for their dedicated workflow task, oldest first.
    #[serde(default)]
    pub pending_updates: VecDeque<ResumeContext>,
    /// Every update of this run and where it stands.
    #[serde(default)]
    pub updates: BTreeMap<String, UpdateRecord>,
    /// Highest fence ever issued on this run's tasks (visible in describe output).
    pub fence_high_water: u64,
    /// The command contract registered for this workflow type when the run started, if any.
    #[serde(default)]
    pub contract: Option<CommandContract>,
    /// The worker build this run is pinned to (its workflow tasks go only to that build).
    #[serde(default)]
    pub compatibility: Option<String>,
    /// The worker whose cache holds this run (sticky execution), while its claim lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sticky: Option<crate::sticky::StickyAffinity>,
    /// A cooperative cancellation request: the run stays open for workflow-authored cleanup.
    #[serde(default)]
    pub cancellation: Option<CancellationRequest>,
    /// The failed run of this child instance that this run retries.
    #[serde(default)]
    pub retry_of_run_id: Option<RunId>,
    /// Durable selections: leaf identities, recorded winners, cancelled members.
    #[serde(default)]
    pub selections: SelectionBook,
    /// Recovery-ledger entries of this run's declared actions, by ledger key.
    #[serde(default)]
    pub ledger: BTreeMap<String, LedgerEntry>,
    /// Head of the instance's ledger checkpoint chain (carried to the next run).
    #[serde(default = "genesis")]
    pub ledger_head: String,
    /// An open integrity incident: the ledger chain this run extends failed verification, and
    /// the run makes no progress until an operator closes the incident.
    #[serde(default)]
    pub integrity_incident: Option<String>,
    /// An operator's hold (`crate::pause`): none of the run's workflow or activity tasks is
    /// dispatched until it is resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<crate::PauseRecord>,
    /// Running attempts a cooperative cancellation stopped, with their workers' stop receipts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub stopped_attempts: BTreeMap<ActivityAttemptId, crate::activity_stop::StoppedAttempt>,
    /// Prepared local activities still open (an attempt running, or a retry pending), by step.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prepared_locals: BTreeMap<u32, crate::local_activity::PreparedLocal>,
    /// Receipts of ended prepared local attempts, newest last and bounded like
    /// `closed_receipts`: a repeated outcome or recovery is answered with its receipt.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub local_receipts: VecDeque<crate::local_activity::LocalReceipt>,
    /// Checkpoints of commands committed ahead of prepared calls (bounded), for repeats.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub local_checkpoints: VecDeque<crate::local_activity::LocalCheckpoint>,
    /// Set on a standalone activity's host run only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standalone: Option<crate::standalone::StandaloneActivity>,
    /// This failed run was redriven: its successor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redriven_to: Option<crate::redrive::Redrive>,
    /// This run redrives a failed one, resuming at its failed step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redriven_from: Option<crate::redrive::Redrive>,
    /// The trace context that started this run (a start, a child start, a continue-as-new),
    /// rendered on every task of the run as its `observability_context`. An older build drops
    /// it on rewrite, which loses telemetry only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin_trace: Option<crate::trace::TraceContext>,
    /// Trace contexts of the signals, updates and cancellations recorded in history and not yet
    /// seen by a completed workflow task: the next workflow task links them (`command` links).
    /// At most [`crate::trace::MAX_LINKS`], newest kept. Telemetry only, like `origin_trace`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command_traces: Vec<crate::trace::CommandTrace>,
    /// The instance's message streams (they move to the next run at continue-as-new).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub message_streams: crate::message_stream::MessageStreams,
    /// Service calls this run's steps wait on for completion, by step (`sync` calls waiting for
    /// `completed`; see `crate::service_call`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub service_waits: BTreeMap<u32, crate::service_call::CallWait>,
    /// The service calls this instance's run was started for (or linked to): its end settles
    /// them. Carried to the next run at continue-as-new.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_call_ids: Vec<String>,
    /// Set on a reconciliation probe's host run: the ledger entry its answer resolves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_of: Option<crate::ledger_probe::ProbeTarget>,
    /// The workflow task's latest failure while it keeps failing; a completed task clears it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_task_failure: Option<crate::task_failure::TaskFailureNote>,
    /// Set on a run imported from a history bundle: where it came from (`crate::import`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub import: Option<crate::import::ImportStamp>,
}

fn first_document_version() -> u32 {
    1
}

fn genesis() -> String {
    GENESIS_HASH.to_string()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParentLink {
    pub workflow_id: WorkflowId,
    pub run_id: RunId,
    pub sequence: u32,
    /// The parent's retry policy for this child call, if it gave one.
    #[serde(default)]
    pub retry_policy: Option<RetryPolicy>,
    /// Which attempt of the child call this run is (1 for the first run).
    #[serde(default = "first_attempt")]
    pub attempt: u32,
}

fn first_attempt() -> u32 {
    1
}

/// A failed child run that the parent's retry policy restarts as the instance's next run.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildRetry {
    pub run_id: RunId,
    pub run_number: u32,
    pub attempt: u32,
    pub backoff_seconds: i64,
}

/// A `SignalReceived` waiting for the leased workflow task to end.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeferredSignal {
    pub payload: Map<String, Value>,
    pub command_id: CommandId,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChildLink {
    pub workflow_id: WorkflowId,
    pub run_id: RunId,
    pub workflow_type: String,
    pub parent_close_policy: String,
    pub cancellation_policy: String,
    /// The child's start command id, which the SDKs know as `child_call_id`/`workflow_link_id`.
    #[serde(default)]
    pub call_id: String,
    /// The command's step tags (parallel-group fields): a resolution event repeats them so the
    /// SDK can match an out-of-order resolution to its group member.
    #[serde(default)]
    pub tags: StepTags,
}

/// How a child instance ended, delivered to its parent run.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildOutcome {
    pub parent: ParentLink,
    pub child_workflow_id: WorkflowId,
    pub child_run_id: RunId,
    pub status: RunStatus,
    pub closed_reason: Option<ClosedReason>,
    pub output: Option<Payload>,
    pub failure: Option<WorkflowFailure>,
    pub closed_at: Millis,
    /// The child is retried instead of resolving the parent's call.
    pub retry: Option<ChildRetry>,
}

/// How an operator closes a run at once: cancel or terminate (also what a parent's close
/// policy does to its children, and a schedule's overlap policy to the previous run).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseCommand {
    Cancel,
    Terminate,
}

/// What one transition produced, for the store to persist in one transaction.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Effects {
    pub events: Vec<HistoryEvent>,
    /// Open tasks that were created or changed.
    pub touched_tasks: BTreeSet<TaskId>,
    /// Tasks that left the open set, with how.
    pub closed_tasks: Vec<(TaskId, TaskClosure)>,
    /// A new run of the same instance (continue-as-new) and its own effects; it becomes the
    /// instance's current run in the same transaction.
    pub successor: Option<Box<(RunState, Effects)>>,
    /// Child instances started by this transition, each with its own effects.
    pub children_started: Vec<(RunState, Effects)>,
    /// This run (a child) closed: its parent must hear of it in the same transaction.
    pub parent_notice: Option<ChildOutcome>,
    /// Ledger entries created or changed (the store upserts them).
    pub ledger: Vec<LedgerEntry>,
    /// Ledger checkpoints appended to the instance chain, in order.
    pub checkpoints: Vec<LedgerCheckpoint>,
    /// Children to close because this run closed (parent-close policy).
    pub close_children: Vec<(WorkflowId, CloseCommand)>,
    /// Children to ask for a cooperative cancellation (their call's `cancellation_policy`), in
    /// the same transaction.
    pub cancel_children: Vec<ChildCancellation>,
    /// Receipts of tasks this transition closed on a worker's report, for the store to keep
    /// with each task's row (a retried report is answered from it).
    pub receipts: Vec<ClosedTaskReceipt>,
    /// Workflow output stream directives, applied by the store in the same transaction.
    pub stream_ops: Vec<crate::workflow_stream::StreamOp>,
    /// Service calls admitted by this transition, for the store to insert (its unique key on
    /// route and idempotency key refuses a concurrent second admission).
    pub service_calls: Vec<crate::service_call::ServiceCallRecord>,
    /// Runs started for service calls (in their target namespaces), each with its own effects.
    pub service_runs_started: Vec<(RunState, Effects)>,
    /// Existing runs a service call linked to (`return_existing_active`): the store marks them.
    pub service_links: Vec<(RunId, String)>,
    /// Caller steps that wait for a call's completion.
    pub service_waiters: Vec<crate::service_call::ServiceWaiter>,
    /// Service calls a delivered cooperative cancellation interrupted: the store cancels them.
    pub service_cancels: Vec<String>,
    /// This run, linked to service calls, closed: they settle in the same transaction.
    pub service_run_closed: Option<crate::service_call::LinkedRunClosed>,
    /// Reconciliation probes started because a dispatch's outcome became unknown (host runs of
    /// standalone activities, each with its own effects).
    pub probes_started: Vec<(RunState, Effects)>,
    /// This run, a probe's host, closed: its answer is applied to the action's instance in the
    /// same transaction.
    pub probe_answer: Option<crate::ledger_probe::ProbeAnswer>,
    /// What operators count of this transition (leases that ran out, timeouts, timers fired).
    pub observations: Vec<crate::Observation>,
    /// The run's class before this transition changed it (it closed, or was paused or resumed),
    /// for the store's kept counts.
    pub reclassed_from: Option<crate::RunClass>,
}

/// A cooperative cancellation a parent's delivery asks of a child run.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildCancellation {
    /// The child instance: its current run is asked (a retried child has moved on).
    pub workflow_id: WorkflowId,
    /// The child's request id (minted by the parent's transition, recorded on both sides).
    pub request_id: CommandId,
    pub cleanup_timeout_seconds: i64,
    pub reason: Option<String>,
}

/// The inputs every transition shares: the time, the id source, the limits, and the effects it
/// accumulates.
pub struct Cx<'a> {
    pub now: Millis,
    pub ids: &'a mut (dyn IdSource + Send),
    pub limits: &'a Limits,
    /// The payload codec memo upserts merge with; without one `upsert_memo` is refused.
    pub memo: Option<&'a dyn crate::memo::MemoCodec>,
    /// The namespace's action definitions, by activity type: scheduling pins them.
    pub actions: Option<std::sync::Arc<BTreeMap<String, ActionDefinition>>>,
    /// The trace context of the client request this transition serves (a signal, an update, a
    /// cancel): recorded on the event the request causes, as `observability_context`.
    pub caller_trace: Option<crate::trace::TraceContext>,
    /// The catalog routes and earlier calls a completion's `start_service_operation` commands
    /// resolve against (read before the transition).
    pub services: Option<std::sync::Arc<crate::service_call::ServiceDirectory>>,
    /// Who the transition acts for: recorded as `principal` on every event it appends (none
    /// when the server itself acts).
    pub principal: Option<crate::Principal>,
    pub effects: Effects,
}

impl<'a> Cx<'a> {
    pub fn new(now: Millis, ids: &'a mut (dyn IdSource + Send), limits: &'a Limits) -> Self {
        Self {
            now,
            ids,
            limits,
            memo: None,
            actions: None,
            caller_trace: None,
            services: None,
            principal: None,
            effects: Effects::default(),
        }
    }

    pub fn id<T: From<String>>(&mut self) -> T {
        T::from(self.ids.next_id())
    }

    /// Takes the request this transition serves, whole: who asks, the caller's trace, and
    /// what the use case read for it beforehand.
    pub fn serve(&mut self, request: RequestContext) {
        let RequestContext {
            principal,
            caller_trace,
            actions,
            services,
        } = request;
        self.principal = principal;
        self.caller_trace = caller_trace;
        self.actions = actions;
        self.services = services;
    }
}

/// What a transition knows of the request it serves besides the run: who asks (recorded as
/// `principal` on every event), the caller's trace (recorded on the event the request causes),
/// and what the use case read before the transaction (the namespace's action definitions for
/// pinning, the service directory for calls). A use case builds it once, by the constructor
/// that names its kind of request, and hands it to [`Cx::serve`]; the payload codec comes with
/// the store, not the request.
#[derive(Clone, Default)]
pub struct RequestContext {
    pub principal: Option<crate::Principal>,
    pub caller_trace: Option<crate::trace::TraceContext>,
    pub actions: Option<std::sync::Arc<BTreeMap<String, ActionDefinition>>>,
    pub services: Option<std::sync::Arc<crate::service_call::ServiceDirectory>>,
}

impl RequestContext {
    /// A request that names only who asks (a worker's report, an operator's command).
    pub fn acting_for(principal: Option<crate::Principal>) -> Self {
        Self {
            principal,
            ..Self::default()
        }
    }

    /// A client's command carrying its trace context (a signal, an update, a close).
    pub fn traced(principal: Option<crate::Principal>, caller_trace: Option<crate::trace::TraceContext>) -> Self {
        Self {
            principal,
            caller_trace,
            ..Self::default()
        }
    }

    /// A workflow task's completion: the action definitions its schedules pin and the
    /// directory its service calls resolve against, each `None` only when no command needs it.
    pub fn completion(
        principal: Option<crate::Principal>,
        actions: Option<std::sync::Arc<BTreeMap<String, ActionDefinition>>>,
        services: Option<std::sync::Arc<crate::service_call::ServiceDirectory>>,
    ) -> Self {
        Self {
            principal,
            caller_trace: None,
            actions,
            services,
        }
    }
}

impl RunState {
    pub fn is_closed(&self) -> bool {
        self.status.is_terminal()
    }

    /// Whether the run's workflow task is leased right now.
    pub(crate) fn workflow_task_leased(&self) -> bool {
        self.workflow_task
            .as_ref()
            .and_then(|id| self.tasks.get(id))
            .is_some_and(|task| !task.is_ready())
    }

    /// Records the signals deferred during a lease that has just ended (or is about to be
    /// replaced by a close), in arrival order.
    pub(crate) fn record_deferred_signals(&mut self, cx: &mut Cx) {
        let acting = cx.principal.take();
        for deferred in std::mem::take(&mut self.deferred_signals) {
            // Each under its own signaller (kept when it was deferred), not the one ending the lease.
            cx.principal = deferred.payload.get("principal").and_then(crate::Principal::from_json);
            self.append(cx, EventType::SignalReceived, deferred.payload, None, Some(&deferred.command_id));
        }
        cx.principal = acting;
    }

    /// Appends one event to the history and the hash chain.
    pub(crate) fn append(
        &mut self,
        cx: &mut Cx,
        event_type: EventType,
        payload: Map<String, Value>,
        task_id: Option<&TaskId>,
        command_id: Option<&CommandId>,
    ) -> EventId {
        // Whatever a payload carried under this name, the recorded actor is the one the server
        // authenticated; an event the server caused has none (rendered as `null`).
        let mut payload = payload;
        match &cx.principal {
            Some(principal) => payload.insert("principal".into(), principal.to_json()),
            None => payload.remove("principal"),
        };
        let event = HistoryEvent {
            id: cx.id(),
            sequence: self.last_sequence + 1,
            event_type,
            payload,
            workflow_task_id: task_id.cloned(),
            workflow_command_id: command_id.cloned(),
            recorded_at: cx.now,
            prev_hash: self.chain_head(),
            hash: String::new(),
        };
        let event = self.link(cx, event);
        if let (Some(command_id), Some(carrier)) = (command_id, event.payload.get("observability_context")) {
            crate::trace::note_command_trace(&mut self.command_traces, command_id, event.sequence, carrier);
        }
        if let Some(request) = self.cancellation.as_mut().filter(|r| r.delivery.is_none()) {
            if event.event_type.resolves_step() {
                if let Some(step) = event.payload.get("sequence").and_then(Value::as_u64) {
                    request.resolved_after_request.insert(step as u32);
                }
            }
        }
        self.last_progress_at = cx.now;
        let resolved = self.selections.observe(event.id.as_str(), event.event_type, &event.payload);
        let id = event.id.clone();
        cx.effects.events.push(event);
        // The winner of a selection is named right after the event that settled it.
        if let Some(resolved) = resolved {
            self.append(cx, EventType::SelectionResolved, resolved, None, None);
        }
        id
    }

    /// Appends an event copied from an imported history: its id, payload (with the principal it
    /// recorded) and time are kept; only its place in this store's hash chain is new.
    pub(crate) fn append_copied(&mut self, cx: &mut Cx, copied: crate::import::ImportedEvent) {
        let event = copied.at(self.last_sequence + 1, self.chain_head());
        let event = self.link(cx, event);
        self.last_progress_at = event.recorded_at;
        cx.effects.events.push(event);
    }

    /// The hash the next event links to.
    fn chain_head(&self) -> String {
        if self.last_sequence == 0 {
            self.chain_origin.clone()
        } else {
            self.last_hash.clone()
        }
    }

    /// Seals `event` into the chain (its hash), counts it against the history budget and makes
    /// it the head.
    fn link(&mut self, cx: &mut Cx, mut event: HistoryEvent) -> HistoryEvent {
        let (canonical, payload_bytes) = event.canonical_json_measuring_payload();
        event.hash = chain_hash(&event.prev_hash, &canonical);
        self.count_budget(cx, &event, payload_bytes as u64);
        self.last_sequence = event.sequence;
        self.last_hash = event.hash.clone();
        event
    }

    pub(crate) fn put_task(&mut self, cx: &mut Cx, task: Task) {
        debug_assert!(
            self.tasks.get(&task.id).is_none_or(|held| held.fence <= task.fence),
            "a task's fence never goes back: a stale holder would pass the check again"
        );
        self.fence_high_water = self.fence_high_water.max(task.fence);
        cx.effects.touched_tasks.insert(task.id.clone());
        self.tasks.insert(task.id.clone(), task);
    }

    /// What every transition leaves true of the run, checked by the store before it writes a
    /// change (in debug builds): the workflow task it points at is an open workflow task, no
    /// task holds a fence above the high-water mark a later lease starts from, and history's
    /// head is the last event's chain link.
    pub fn invariants_hold(&self) -> Result<(), String> {
        if let Some(id) = &self.workflow_task {
            match self.tasks.get(id) {
                Some(task) if task.kind == TaskKind::Workflow => {}
                Some(task) => return Err(format!("the workflow task {} is a {} task", id.as_str(), task.kind.as_str())),
                None => return Err(format!("the workflow task {} is not open", id.as_str())),
            }
        }
        if let Some(task) = self.tasks.values().find(|task| task.fence > self.fence_high_water) {
            return Err(format!(
                "task {} holds fence {} above the high water {}",
                task.id.as_str(),
                task.fence,
                self.fence_high_water
            ));
        }
        if self.last_sequence > 0 && self.last_hash.is_empty() {
            return Err(format!("history ends at {} without a head hash", self.last_sequence));
        }
        Ok(())
    }

    pub(crate) fn task_mut(&mut self, cx: &mut Cx, id: &TaskId) -> Option<&mut Task> {
        let task = self.tasks.get_mut(id)?;
        cx.effects.touched_tasks.insert(id.clone());
        Some(task)
    }

    pub(crate) fn close_task(&mut self, cx: &mut Cx, id: &TaskId, closure: TaskClosure) -> Option<Task> {
        let task = self.tasks.remove(id)?;
        cx.effects.touched_tasks.remove(id);
        cx.effects.closed_tasks.push((id.clone(), closure));
        if self.workflow_task.as_ref() == Some(id) {
            self.workflow_task = None;
        }
        Some(task)
    }

    pub(crate) fn new_task(&mut self, cx: &mut Cx, kind: TaskKind, queue: &str, detail: TaskDetail) -> TaskId {
        let id: TaskId = cx.id();
        let task = Task {
            id: id.clone(),
            kind,
            state: TaskState::Ready,
            queue: queue.to_string(),
            available_at: cx.now,
            deadline_at: None,
            fence: 0,
            created_at: cx.now,
            detail,
        };
        self.put_task(cx, task);
        id
    }

    /// The worker session an activity task must run in, if its activity asked for one.
    pub fn session_of(&self, task: &Task) -> Option<&SessionRequirement> {
        match &task.detail {
            TaskDetail::Activity { execution_id, .. } => self.activities.get(execution_id)?.worker_session.as_ref(),
            _ => None,
        }
    }

    /// Adds `event` (whose payload's JSON is `payload_bytes` long, measured while it was
    /// hashed) to the history budget's counters; a crossed threshold is observed.
    fn count_budget(&mut self, cx: &mut Cx, event: &HistoryEvent, payload_bytes: u64) {
        use crate::history_budget::{event_fan_out, HistoryBudget};
        let before = HistoryBudget::pressure_of(self.last_sequence, self.history_size_bytes, self.history_fan_out);
        self.history_size_bytes += event.event_type.as_str().len() as u64 + payload_bytes;
        self.history_fan_out = self.history_fan_out.max(event_fan_out(&event.payload));
        let after = HistoryBudget::pressure_of(event.sequence, self.history_size_bytes, self.history_fan_out);
        if after > before {
            let pressure = after.as_str();
            cx.effects.observations.push(crate::Observation::HistoryBudgetCrossed { pressure });
        }
    }

    /// Signals accepted and not yet handed to workflow code: those waiting for a resume task, and
    /// the one the ready workflow task carries.
    pub fn pending_signal_count(&self) -> usize {
        let waiting = self
            .pending_resumes
            .iter()
            .filter(|r| matches!(r, ResumeContext::Signal { .. }))
            .count();
        let ready = self.workflow_task.as_ref().and_then(|id| self.tasks.get(id)).is_some_and(|t| {
            t.is_ready()
                && matches!(
                    t.detail,
                    TaskDetail::Workflow {
                        resume: Some(ResumeContext::Signal { .. }),
                        ..
                    }
                )
        });
        waiting + usize::from(ready)
    }

    /// Something the workflow must see happened. Guarantees exactly one ready-or-leased workflow
    /// task: creates one if none exists, otherwise remembers to create one when the leased task
    /// ends. A signal gets its own resume task so its arguments reach the worker with it.
    pub(crate) fn want_workflow_task(&mut self, cx: &mut Cx, resume: Option<ResumeContext>) -> Option<TaskId> {
        // A standalone activity's host run has no workflow code to wake.
        if self.is_closed() || self.standalone.is_some() {
            return None;
        }
        match self.workflow_task.clone() {
            None => Some(self.create_workflow_task(cx, resume)),
            Some(id) => {
                let task = self.tasks.get(&id).expect("workflow_task points at an open task");
                let ready_without_resume = task.is_ready() && matches!(task.detail, TaskDetail::Workflow { resume: None, .. });
                match resume {
                    Some(resume) if ready_without_resume => {
                        let task = self.task_mut(cx, &id).expect("open");
                        task.detail = TaskDetail::Workflow {
                            resume: Some(resume),
                            history_snapshot: 0,
                            replay_mode: None,
                        };
                    }
                    Some(resume) => self.pending_resumes.push_back(resume),
                    None => {
                        if !task.is_ready() {
                            self.workflow_task_wanted = true;
                        }
                    }
                }
                Some(id)
            }
        }
    }

    /// An accepted update needs its dedicated task: now if no workflow task exists, by turning a
    /// ready plain task into it (the plain work then follows), else after the current task.
    pub(crate) fn want_update_task(&mut self, cx: &mut Cx, update: ResumeContext) {
        if self.is_closed() {
            return;
        }
        match self.workflow_task.clone() {
            None => {
                self.create_workflow_task(cx, Some(update));
            }
            Some(id) => {
                let plain_ready = self
                    .tasks
                    .get(&id)
                    .is_some_and(|t| t.is_ready() && matches!(t.detail, TaskDetail::Workflow { resume: None, .. }));
                if plain_ready {
                    let task = self.task_mut(cx, &id).expect("open");
                    task.detail = TaskDetail::Workflow {
                        resume: Some(update),
                        history_snapshot: 0,
                        replay_mode: None,
                    };
                    self.workflow_task_wanted = true;
                } else {
                    self.pending_updates.push_back(update);
                }
            }
        }
    }

    fn create_workflow_task(&mut self, cx: &mut Cx, resume: Option<ResumeContext>) -> TaskId {
        let queue = self.task_queue.clone();
        // The worker replays up to the prepared local call whose retry is pending: no task
        // before the retry is due.
        let due = self.prepared_locals.values().filter_map(|l| l.retry_due_at).min();
        let id = self.new_task(
            cx,
            TaskKind::Workflow,
            &queue,
            TaskDetail::Workflow {
                resume,
                history_snapshot: 0,
                replay_mode: None,
            },
        );
        if let Some(due) = due.filter(|due| *due > cx.now) {
            self.task_mut(cx, &id).expect("just created").available_at = due;
        }
        self.workflow_task = Some(id.clone());
        self.workflow_task_wanted = false;
        id
    }

    /// Ends workflow task `task_id` without a completion (its worker goes back to polling) and
    /// records the signals its lease held back; the next task comes when something wants it.
    pub(crate) fn release_workflow_task(&mut self, cx: &mut Cx, task_id: &TaskId) {
        self.close_task(cx, task_id, TaskClosure::Completed);
        if self.status == RunStatus::Running {
            self.status = RunStatus::Waiting;
        }
        self.record_deferred_signals(cx);
    }

    /// The leased workflow task may read history up to now: events recorded during its lease
    /// (a cancellation request, a prepared local activity's) are what its worker reloads
    /// history to see.
    pub(crate) fn extend_leased_history(&mut self, cx: &mut Cx) {
        let last = self.last_sequence;
        if let Some(id) = self.workflow_task.clone() {
            if self.tasks.get(&id).is_some_and(|t| !t.is_ready()) {
                if let Some(TaskDetail::Workflow { history_snapshot, .. }) = self.task_mut(cx, &id).map(|t| &mut t.detail) {
                    *history_snapshot = last;
                }
            }
        }
    }

    /// After a workflow task ends without closing the run: start the next one if anything is
    /// waiting to be seen.
    pub(crate) fn follow_up_workflow_task(&mut self, cx: &mut Cx) -> Option<TaskId> {
        if self.is_closed() || self.workflow_task.is_some() {
            return None;
        }
        // Accepted updates get their own tasks, one at a time, ahead of other work. One that an
        // earlier task's worker already settled (it saw the acceptance in history) needs none.
        self.pending_updates.retain(|resume| match resume {
            ResumeContext::Update { update_id, .. } => self.updates.get(update_id).is_some_and(|u| u.status == UpdateStatus::Accepted),
            _ => true,
        });
        if let Some(update) = self.pending_updates.pop_front() {
            let still_wanted = self.workflow_task_wanted;
            let id = self.create_workflow_task(cx, Some(update));
            self.workflow_task_wanted = still_wanted;
            return Some(id);
        }
        if let Some(resume) = self.pending_resumes.pop_front() {
            return Some(self.create_workflow_task(cx, Some(resume)));
        }
        if self.workflow_task_wanted {
            return Some(self.create_workflow_task(cx, None));
        }
        None
    }

    /// Keeps a closed task's receipt: in the run for the rest of this transition, and in the
    /// effects, which the store writes on the task's row (not in the run document, which
    /// would otherwise carry up to `closed_task_receipts_max` of them through every write).
    pub(crate) fn remember_receipt(&mut self, cx: &mut Cx, receipt: ClosedTaskReceipt) {
        cx.effects.receipts.push(receipt.clone());
        self.closed_receipts.push_back(receipt);
        while self.closed_receipts.len() > cx.limits.closed_task_receipts_max {
            self.closed_receipts.pop_front();
        }
    }

    pub fn find_receipt(&self, task_id: &TaskId) -> Option<&ClosedTaskReceipt> {
        self.closed_receipts.iter().rev().find(|r| &r.task_id == task_id)
    }

    /// `wait_kind` for describe: what the run is waiting on.
    pub fn wait_kind(&self) -> Option<&'static str> {
        if self.is_closed() {
            None
        } else if self.workflow_task.is_some() {
            Some("workflow_task")
        } else if !self.signal_waits.is_empty() {
            Some("signal")
        } else if !self.condition_waits.is_empty() {
            Some("condition")
        } else if !self.activities.is_empty() {
            Some("activity")
        } else if !self.timers.is_empty() {
            Some("timer")
        } else {
            None
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::transitions::{start_run, StartRun};
    use crate::SequentialIds;

    /// Run 1 of instance `wf` (run id `run`, queue `q`), started at 1 000 ms: the fixture of
    /// the engine's unit tests.
    pub(crate) fn new_run() -> RunState {
        let limits = Limits::default();
        let mut ids = SequentialIds::new("id");
        let mut cx = Cx::new(1_000, &mut ids, &limits);
        let start = StartRun {
            scheduling: Default::default(),
            namespace: "default".into(),
            workflow_id: "wf".into(),
            run_id: "run".into(),
            workflow_type: "t".into(),
            task_queue: "q".into(),
            input: Payload::avro("in"),
            execution_timeout_seconds: None,
            run_timeout_seconds: None,
            business_key: None,
            memo: Map::new(),
            search_attributes: Map::new(),
            command_id: "start".into(),
            contract: None,
            compatibility: None,
            origin_trace: None,
            principal: None,
        };
        start_run(&mut cx, start)
    }

    #[test]
    fn a_new_run_carries_the_current_document_version() {
        let run = new_run();
        assert_eq!(run.document_version, RUN_DOCUMENT_VERSION);
        let document = serde_json::to_value(&run).unwrap();
        assert_eq!(document["document_version"], RUN_DOCUMENT_VERSION);
        assert_eq!(check_document_version(&run), Ok(()));
    }

    #[test]
    fn a_document_from_before_the_version_field_reads_as_version_1() {
        let mut document = serde_json::to_value(new_run()).unwrap();
        document.as_object_mut().unwrap().remove("document_version");
        let run: RunState = serde_json::from_value(document).unwrap();
        assert_eq!(run.document_version, 1);
        assert_eq!(check_document_version(&run), Ok(()));
    }

    #[test]
    fn a_document_newer_than_this_build_or_of_version_0_is_refused() {
        let mut run = new_run();
        run.document_version = RUN_DOCUMENT_VERSION + 1;
        let refusal = check_document_version(&run).unwrap_err();
        assert!(refusal.contains("newer than this build"), "{refusal}");
        run.document_version = 0;
        assert!(check_document_version(&run).is_err());
    }
}
