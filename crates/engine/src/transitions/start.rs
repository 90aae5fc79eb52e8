//! Starting a run: run 1 of an instance, and the fresh run a continue-as-new or a child retry begins.

use crate::transitions::{events, min_opt};
use crate::{
    CommandContract, CommandId, Cx, EventType, Millis, Payload, RunId, RunState, RunStatus, TaskDetail, TaskKind, WorkflowId,
    RUN_DOCUMENT_VERSION,
};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, VecDeque};

/// Everything needed to start a run, already validated by the caller.
#[derive(Clone, Debug)]
pub struct StartRun {
    pub namespace: String,
    pub workflow_id: WorkflowId,
    pub run_id: RunId,
    pub workflow_type: String,
    pub task_queue: String,
    pub input: Payload,
    pub execution_timeout_seconds: Option<i64>,
    pub run_timeout_seconds: Option<i64>,
    pub business_key: Option<String>,
    pub memo: Map<String, Value>,
    pub search_attributes: Map<String, Value>,
    pub command_id: CommandId,
    /// The command contract registered for the workflow type at start, recorded on the run.
    pub contract: Option<CommandContract>,
    /// The worker build the run is pinned to: only workers of this build id get its workflow
    /// tasks (None: any worker of the queue).
    pub compatibility: Option<String>,
    /// The caller's trace context: the run's origin (see `crate::trace`).
    pub origin_trace: Option<crate::trace::TraceContext>,
    /// Who started it (a request's authenticated principal); `None` when the server did (a
    /// schedule, a parent's command, a redrive).
    pub principal: Option<crate::Principal>,
    /// The run's tasks' priority and fairness class.
    pub scheduling: crate::TaskScheduling,
}

/// Creates run 1 of an instance: `StartAccepted`, `WorkflowStarted`, the first workflow task and
/// the run-deadline task.
pub fn start_run(cx: &mut Cx, start: StartRun) -> RunState {
    acting_for(cx, &start);
    let execution_deadline_at = start.execution_timeout_seconds.map(|s| cx.now + s * 1000);
    let mut run = blank_run(cx, start, 1, execution_deadline_at);
    let command = run.start_command_id.clone();
    let accepted = events::start_accepted(&run);
    run.append(cx, EventType::StartAccepted, accepted, None, Some(&command));
    begin_run(run, cx)
}

/// A new run's events record who started it (the transition's principal when the start names
/// none).
pub(super) fn acting_for(cx: &mut Cx, start: &StartRun) {
    if start.principal.is_some() {
        cx.principal = start.principal.clone();
    }
}

/// The fields of a run before its first event.
pub(super) fn blank_run(cx: &Cx, start: StartRun, run_number: u32, execution_deadline_at: Option<Millis>) -> RunState {
    let now = cx.now;
    RunState {
        document_version: RUN_DOCUMENT_VERSION,
        namespace: start.namespace,
        workflow_id: start.workflow_id,
        run_id: start.run_id,
        run_number,
        workflow_type: start.workflow_type,
        task_queue: start.task_queue,
        status: RunStatus::Pending,
        closed_reason: None,
        input: start.input,
        output: None,
        failure: None,
        business_key: start.business_key,
        memo: start.memo,
        memo_merged: None,
        search_attributes: start.search_attributes,
        scheduling: start.scheduling,
        execution_timeout_seconds: start.execution_timeout_seconds,
        run_timeout_seconds: start.run_timeout_seconds,
        execution_deadline_at,
        run_deadline_at: start.run_timeout_seconds.map(|s| now + s * 1000),
        started_at: now,
        closed_at: None,
        last_progress_at: now,
        start_command_id: start.command_id,
        archived: false,
        parent: None,
        children: BTreeMap::new(),
        continued_from_run_id: None,
        chain_origin: crate::history::GENESIS_HASH.to_string(),
        last_sequence: 0,
        last_hash: String::new(),
        history_size_bytes: 0,
        history_fan_out: 0,
        next_step: 1,
        steps: Default::default(),
        command_count: 1,
        tasks: BTreeMap::new(),
        workflow_task: None,
        workflow_task_wanted: false,
        pending_resumes: VecDeque::new(),
        deferred_signals: Vec::new(),
        activities: BTreeMap::new(),
        timers: BTreeMap::new(),
        condition_waits: Vec::new(),
        signal_waits: Vec::new(),
        closed_receipts: VecDeque::new(),
        pending_updates: VecDeque::new(),
        updates: BTreeMap::new(),
        fence_high_water: 0,
        contract: start.contract,
        compatibility: start.compatibility,
        sticky: None,
        cancellation: None,
        retry_of_run_id: None,
        selections: Default::default(),
        ledger: BTreeMap::new(),
        ledger_head: crate::history::GENESIS_HASH.to_string(),
        integrity_incident: None,
        paused: None,
        stopped_attempts: BTreeMap::new(),
        prepared_locals: BTreeMap::new(),
        local_receipts: Default::default(),
        local_checkpoints: Default::default(),
        standalone: None,
        redriven_to: None,
        redriven_from: None,
        message_streams: Default::default(),
        service_waits: BTreeMap::new(),
        service_call_ids: Vec::new(),
        probe_of: None,
        workflow_task_failure: None,
        import: None,
        origin_trace: start.origin_trace,
        command_traces: Vec::new(),
    }
}

/// `WorkflowStarted`, the first workflow task and the run-deadline task of a new run.
pub(super) fn begin_run(mut run: RunState, cx: &mut Cx) -> RunState {
    let command = run.start_command_id.clone();
    let started = events::workflow_started(&run);
    run.append(cx, EventType::WorkflowStarted, started, None, Some(&command));
    run.want_workflow_task(cx, None);
    if let Some(deadline) = min_opt(run.execution_deadline_at, run.run_deadline_at) {
        let id = run.new_task(cx, TaskKind::RunDeadline, "", TaskDetail::RunDeadline);
        run.task_mut(cx, &id).expect("just created").deadline_at = Some(deadline);
    }
    run
}

/// The next run of a continued instance: same id, run number + 1, new input, the execution
/// deadline carried over, a fresh run deadline, and a history chain that continues the old one.
/// What a continue-as-new asks of the next run.
pub(super) struct NextRun {
    pub arguments: Payload,
    pub workflow_type: Option<String>,
    pub queue: Option<String>,
    /// The issuing task's trace context (else the run keeps its predecessor's origin).
    pub origin_trace: Option<crate::trace::TraceContext>,
}

pub(super) fn continued_run(cx: &mut Cx, previous: &RunState, next: NextRun) -> RunState {
    let NextRun {
        arguments,
        workflow_type,
        queue,
        origin_trace,
    } = next;
    let start = StartRun {
        scheduling: previous.scheduling.clone(),
        namespace: previous.namespace.clone(),
        workflow_id: previous.workflow_id.clone(),
        run_id: cx.id(),
        workflow_type: workflow_type
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| previous.workflow_type.clone()),
        task_queue: queue.filter(|q| !q.is_empty()).unwrap_or_else(|| previous.task_queue.clone()),
        input: arguments,
        execution_timeout_seconds: previous.execution_timeout_seconds,
        run_timeout_seconds: previous.run_timeout_seconds,
        business_key: previous.business_key.clone(),
        memo: previous.memo.clone(),
        search_attributes: previous.search_attributes.clone(),
        command_id: cx.id(),
        contract: None,
        compatibility: None,
        origin_trace: origin_trace.or_else(|| previous.origin_trace.clone()),
        principal: cx.principal.clone(),
    };
    // The contract belongs to a workflow type on a queue; a run that moves to another has none.
    // So does the build pin: the same code keeps its build.
    let same_code = start.workflow_type == previous.workflow_type && start.task_queue == previous.task_queue;
    let start = StartRun {
        contract: previous.contract.clone().filter(|_| same_code),
        compatibility: previous.compatibility.clone().filter(|_| same_code),
        ..start
    };
    let mut run = blank_run(cx, start, previous.run_number + 1, previous.execution_deadline_at);
    run.continued_from_run_id = Some(previous.run_id.clone());
    run.chain_origin = previous.last_hash.clone();
    run.ledger_head = previous.ledger_head.clone();
    run.memo_merged = previous.memo_merged.clone();
    run.parent = previous.parent.clone();
    run.service_call_ids = previous.service_call_ids.clone();
    let mut run = begin_run(run, cx);
    super::message_stream::carry_streams_forward(&mut run, cx, previous);
    run
}
