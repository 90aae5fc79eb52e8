//! The transitions of a run. Each takes the run's state, the shared [`Cx`] and its inputs, and
//! either changes the state (recording events and task changes in `cx.effects`) or returns a
//! [`Refusal`]. Callers persist the changed state and the effects only on `Ok`; on `Err` they
//! discard both, so a refused report leaves nothing behind.

use crate::command::*;
use crate::contract::CommandContract;
use crate::history::EventType;
use crate::ids::*;
use crate::ledger::{ActionDefinition, ActionPin, LedgerCheckpoint, LedgerEntry, LedgerState, RecoveryMode, ResultClass};
use crate::payload::Payload;
use crate::refusal::{Reason, Refusal};
use crate::run::*;
use crate::task::*;
use crate::timefmt::iso8601;
use crate::Millis;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, VecDeque};

/// Failure type the SDKs report when replay produced no new command: benign, nothing to retry.
pub const WAITING_FOR_HISTORY_FAILURE: &str = "WorkflowTaskWaitingForHistory";

/// Longest pause before a failed workflow task is offered again.
const WORKFLOW_TASK_RETRY_BACKOFF_MAX_MS: Millis = 60_000;

macro_rules! obj {
    ($($key:expr => $value:expr),* $(,)?) => {{
        #[allow(unused_mut)]
        let mut map = Map::new();
        $(map.insert($key.to_string(), json!($value));)*
        map
    }};
}

fn payload_json(payload: &Payload) -> Value {
    json!({"codec": payload.codec, "blob": payload.blob})
}

fn extend(map: &mut Map<String, Value>, tags: &StepTags) {
    for (key, value) in tags {
        map.entry(key.clone()).or_insert_with(|| value.clone());
    }
}

// ---------------------------------------------------------------------------------------------
// Start

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
}

/// Creates run 1 of an instance: `StartAccepted`, `WorkflowStarted`, the first workflow task and
/// the run-deadline task.
pub fn start_run(cx: &mut Cx, start: StartRun) -> RunState {
    let execution_deadline_at = start.execution_timeout_seconds.map(|s| cx.now + s * 1000);
    let mut run = blank_run(cx, start, 1, execution_deadline_at);
    let command = run.start_command_id.clone();
    let mut accepted = run_identity(&run);
    accepted.insert("outcome".into(), json!("started_new"));
    run.append(cx, EventType::StartAccepted, accepted, None, Some(&command));
    begin_run(run, cx)
}

/// The fields of a run before its first event.
fn blank_run(cx: &Cx, start: StartRun, run_number: u32, execution_deadline_at: Option<Millis>) -> RunState {
    let now = cx.now;
    RunState {
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
        next_step: 1,
        steps: BTreeMap::new(),
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
        cancellation: None,
        retry_of_run_id: None,
        selections: Default::default(),
        ledger: BTreeMap::new(),
        ledger_head: crate::history::GENESIS_HASH.to_string(),
        integrity_incident: None,
    }
}

fn run_identity(run: &RunState) -> Map<String, Value> {
    obj!(
        "workflow_command_id" => run.start_command_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "workflow_type" => run.workflow_type,
        "business_key" => run.business_key,
        "memo" => run.memo,
        "search_attributes" => run.search_attributes,
    )
}

/// `WorkflowStarted`, the first workflow task and the run-deadline task of a new run.
fn begin_run(mut run: RunState, cx: &mut Cx) -> RunState {
    let command = run.start_command_id.clone();
    let mut started = run_identity(&run);
    started.insert("execution_timeout_seconds".into(), json!(run.execution_timeout_seconds));
    started.insert("run_timeout_seconds".into(), json!(run.run_timeout_seconds));
    started.insert("execution_deadline_at".into(), json!(run.execution_deadline_at.map(iso8601)));
    started.insert("run_deadline_at".into(), json!(run.run_deadline_at.map(iso8601)));
    started.insert("input_envelope".into(), payload_json(&run.input));
    started.insert("task_queue".into(), json!(run.task_queue));
    started.insert("run_number".into(), json!(run.run_number));
    if let Some(previous) = &run.continued_from_run_id {
        started.insert("continued_from_run_id".into(), json!(previous));
    }
    if let Some(contract) = &run.contract {
        started.extend(contract.declared_fields());
    }
    if let Some(parent) = &run.parent {
        started.insert("parent_workflow_instance_id".into(), json!(parent.workflow_id));
        started.insert("parent_workflow_run_id".into(), json!(parent.run_id));
        started.insert("parent_sequence".into(), json!(parent.sequence));
        if let Some(policy) = &parent.retry_policy {
            started.insert("retry_policy".into(), child_retry_snapshot(policy));
        }
        if let Some(failed) = &run.retry_of_run_id {
            started.insert("retry_attempt".into(), json!(parent.attempt));
            started.insert("retry_of_child_workflow_run_id".into(), json!(failed));
        }
    }
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
fn continued_run(cx: &mut Cx, previous: &RunState, arguments: Payload, workflow_type: Option<String>, queue: Option<String>) -> RunState {
    let start = StartRun {
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
    begin_run(run, cx)
}

// ---------------------------------------------------------------------------------------------
// Workflow tasks

/// Leases a ready workflow task to `owner`. The returned task carries the new lease and the
/// history snapshot (events up to `history_snapshot`) the worker must replay.
pub fn lease_workflow_task(run: &mut RunState, cx: &mut Cx, task_id: &TaskId, owner: &str, lease_ms: i64) -> Result<Task, Refusal> {
    integrity_refusal(run)?;
    if run.is_closed() {
        return Err(run_closed_refusal(run));
    }
    let now = cx.now;
    let task = run
        .tasks
        .get(task_id)
        .ok_or_else(|| Refusal::new(Reason::TaskNotLeased, "Workflow task is no longer open."))?;
    if task.kind != TaskKind::Workflow || !task.is_ready() || task.available_at > now {
        return Err(Refusal::new(Reason::TaskNotLeased, "Workflow task is not ready to lease."));
    }
    // Every way a lease ends records its deferred signals; this keeps a new lease from ever
    // starting with some still held back.
    run.record_deferred_signals(cx);
    let snapshot = run.last_sequence;
    let task = run.task_mut(cx, task_id).expect("checked");
    task.fence += 1;
    let lease = Lease {
        owner: owner.to_string(),
        expires_at: now + lease_ms,
        fence: task.fence,
    };
    task.deadline_at = Some(lease.expires_at);
    task.state = TaskState::Leased(lease);
    if let TaskDetail::Workflow { history_snapshot, .. } = &mut task.detail {
        *history_snapshot = snapshot;
    }
    let task = task.clone();
    run.fence_high_water = run.fence_high_water.max(task.fence);
    if matches!(run.status, RunStatus::Pending | RunStatus::Waiting) {
        run.status = RunStatus::Running;
    }
    Ok(task)
}

/// Checks that `(owner, attempt)` holds the live lease of workflow task `task_id`.
pub fn check_workflow_lease<'r>(run: &'r RunState, now: Millis, task_id: &TaskId, owner: &str, attempt: u64) -> Result<&'r Task, Refusal> {
    let attach = |refusal: Refusal| refusal.with("task_id", task_id.as_str()).with("workflow_task_attempt", attempt);
    let Some(task) = run.tasks.get(task_id) else {
        if run.is_closed() {
            return Err(attach(run_closed_refusal(run)));
        }
        return Err(attach(Refusal::new(Reason::TaskNotLeased, "Workflow task is not leased.")));
    };
    if task.kind != TaskKind::Workflow {
        return Err(attach(Refusal::new(Reason::TaskNotFound, "Workflow task not found.")));
    }
    let Some(lease) = task.lease() else {
        return Err(attach(Refusal::new(Reason::TaskNotLeased, "Workflow task is not leased.")).with("task_status", "ready"));
    };
    if lease.owner != owner {
        return Err(attach(Refusal::new(
            Reason::LeaseOwnerMismatch,
            "Workflow task lease is owned by another worker.",
        ))
        .with("lease_owner", lease.owner.clone()));
    }
    if lease.fence != attempt {
        return Err(attach(Refusal::new(
            Reason::WorkflowTaskAttemptMismatch,
            "Workflow task attempt does not match the current lease.",
        ))
        .with("current_attempt", lease.fence));
    }
    if lease.expires_at <= now {
        return Err(attach(Refusal::new(Reason::LeaseExpired, "Workflow task lease has expired."))
            .with("task_status", "leased")
            .with("lease_owner", lease.owner.clone())
            .with("lease_expires_at", iso8601(lease.expires_at)));
    }
    Ok(task)
}

fn retained_receipt(
    run: &RunState,
    task_id: &TaskId,
    owner: &str,
    fence: u64,
    attempt_id: Option<&ActivityAttemptId>,
    report: ReportKind,
) -> Option<Receipt> {
    let receipt = run.find_receipt(task_id)?;
    let same = receipt.owner == owner
        && receipt.report == report
        && receipt.attempt_id.as_ref() == attempt_id
        && (attempt_id.is_some() || receipt.fence == fence);
    same.then(|| Receipt {
        retained: true,
        ..receipt.receipt.clone()
    })
}

/// Applies a workflow task's commands: the heart of the engine.
pub fn complete_workflow_task(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    owner: &str,
    attempt: u64,
    commands: Vec<WorkflowCommand>,
) -> Result<Receipt, Refusal> {
    if let Some(receipt) = retained_receipt(run, task_id, owner, attempt, None, ReportKind::CompleteWorkflowTask) {
        return Ok(receipt);
    }
    let task = check_workflow_lease(run, cx.now, task_id, owner, attempt)?.clone();
    // A run past its deadline takes no more commands; the clock is about to time it out.
    if let Some(deadline) = min_opt(run.execution_deadline_at, run.run_deadline_at).filter(|d| *d <= cx.now) {
        return Err(Refusal::new(Reason::RunTimedOut, "The workflow run is past its deadline.")
            .with("task_id", task_id.as_str())
            .with("deadline_at", iso8601(deadline)));
    }
    validate_commands(run, cx, &commands)?;

    let resume = match &task.detail {
        TaskDetail::Workflow { resume, .. } => resume.clone(),
        _ => None,
    };
    match &resume {
        Some(ResumeContext::Signal {
            signal_id,
            signal_name,
            arguments,
            command_id,
        }) => {
            apply_signal_to_wait(run, cx, task_id, signal_id, signal_name, arguments, command_id, &commands);
        }
        Some(ResumeContext::AfterUpdate { update_id }) => {
            let receiver = obj!("workflow_update_id" => update_id);
            satisfy_condition_wait(run, cx, task_id, receiver, None, &commands);
        }
        _ => {}
    }

    let mut created = Vec::new();
    let tasks_before: std::collections::BTreeSet<TaskId> = run.tasks.keys().cloned().collect();
    for command in commands {
        apply_command(run, cx, task_id, command)?;
    }
    run.close_task(cx, task_id, TaskClosure::Completed);
    run.record_deferred_signals(cx);
    if let Some(update @ ResumeContext::Update { update_id, .. }) = &resume {
        // The worker did not settle the update this task was for: offer it again.
        if run.updates.get(update_id).is_some_and(|u| u.status == UpdateStatus::Accepted) && !run.is_closed() {
            run.pending_updates.push_front(update.clone());
        }
    }
    if !run.is_closed() {
        run.status = RunStatus::Waiting;
        run.follow_up_workflow_task(cx);
    }
    for id in run.tasks.keys() {
        if !tasks_before.contains(id) {
            created.push(id.clone());
        }
    }
    let receipt = Receipt {
        run_status: run.status,
        created_task_ids: created,
        next_task_id: None,
        retained: false,
    };
    run.remember_receipt(
        cx,
        ClosedTaskReceipt {
            task_id: task_id.clone(),
            owner: owner.to_string(),
            fence: attempt,
            attempt_id: None,
            report: ReportKind::CompleteWorkflowTask,
            receipt: receipt.clone(),
        },
    );
    Ok(receipt)
}

fn invalid(message: impl Into<String>) -> Refusal {
    Refusal::new(Reason::InvalidCommands, message)
}

fn validate_commands(run: &RunState, cx: &Cx, commands: &[WorkflowCommand]) -> Result<(), Refusal> {
    if commands.is_empty() {
        return Err(invalid("A workflow task completion needs at least one command."));
    }
    if commands.len() > cx.limits.commands_per_completion_max {
        return Err(
            Refusal::new(Reason::StructuralLimitExceeded, "Too many commands in one completion.")
                .with("limit_kind", "commands_per_completion")
                .with("current_value", commands.len())
                .with("configured_limit", cx.limits.commands_per_completion_max),
        );
    }
    let terminal_count = commands.iter().filter(|c| c.is_terminal()).count();
    if terminal_count > 1 || (terminal_count == 1 && !commands.last().is_some_and(|c| c.is_terminal())) {
        return Err(invalid("At most one terminal command is allowed and it must be last."));
    }
    let local_events: usize = commands
        .iter()
        .map(|c| match c {
            WorkflowCommand::RecordLocalActivity(local) => local.event_count(),
            _ => 0,
        })
        .sum();
    let events_after = run.last_sequence + 3 * commands.len() as u64 + local_events as u64;
    if events_after > cx.limits.history_events_max {
        return Err(Refusal::new(Reason::StructuralLimitExceeded, "The run's history is full.")
            .with("limit_kind", "history_events")
            .with("current_value", run.last_sequence)
            .with("configured_limit", cx.limits.history_events_max));
    }
    let new_activities = commands
        .iter()
        .filter(|c| matches!(c, WorkflowCommand::ScheduleActivity(_)))
        .count();
    if run.activities.len() + new_activities > cx.limits.pending_activities_max {
        return Err(Refusal::new(Reason::StructuralLimitExceeded, "Too many pending activities.")
            .with("limit_kind", "pending_activities")
            .with("current_value", run.activities.len() + new_activities)
            .with("configured_limit", cx.limits.pending_activities_max));
    }
    let new_timers = commands
        .iter()
        .filter(|c| matches!(c, WorkflowCommand::StartTimer { .. }) || matches!(c, WorkflowCommand::OpenConditionWait { timeout_seconds: Some(t), .. } | WorkflowCommand::OpenSignalWait { timeout_seconds: Some(t), .. } if *t > 0))
        .count();
    if run.timers.len() + new_timers > cx.limits.pending_timers_max {
        return Err(Refusal::new(Reason::StructuralLimitExceeded, "Too many pending timers.")
            .with("limit_kind", "pending_timers")
            .with("current_value", run.timers.len() + new_timers)
            .with("configured_limit", cx.limits.pending_timers_max));
    }
    for command in commands {
        let delay = match command {
            WorkflowCommand::StartTimer { delay_seconds, .. } => Some(*delay_seconds),
            WorkflowCommand::OpenConditionWait { timeout_seconds, .. } | WorkflowCommand::OpenSignalWait { timeout_seconds, .. } => {
                *timeout_seconds
            }
            _ => None,
        };
        if let Some(delay) = delay {
            if delay < 0 || delay > cx.limits.delay_seconds_max {
                return Err(invalid(format!(
                    "Delay {delay} s is outside 0..={} s.",
                    cx.limits.delay_seconds_max
                )));
            }
        }
        if let WorkflowCommand::RecordVersionMarker {
            version,
            min_supported,
            max_supported,
            ..
        } = command
        {
            if !(min_supported <= version && version <= max_supported) {
                return Err(invalid("record_version_marker needs min_supported <= version <= max_supported."));
            }
        }
    }
    Ok(())
}

/// Step 2 of a completion: the signal that caused this task is applied to the wait it resolves.
#[allow(clippy::too_many_arguments)]
fn apply_signal_to_wait(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    signal_id: &SignalId,
    signal_name: &str,
    arguments: &Payload,
    command_id: &CommandId,
    commands: &[WorkflowCommand],
) {
    if let Some(index) = run.signal_waits.iter().position(|w| w.signal_name == signal_name) {
        let wait = run.signal_waits.remove(index);
        cancel_wait_timer(run, cx, wait.timer_id.as_ref());
        let payload = obj!(
            "workflow_command_id" => command_id,
            "signal_id" => signal_id,
            "signal_name" => signal_name,
            "signal_wait_id" => wait.id,
            "sequence" => wait.step,
            "value" => arguments.blob,
            "payload_codec" => arguments.codec,
        );
        run.append(cx, EventType::SignalApplied, payload, Some(task_id), Some(command_id));
        return;
    }
    let receiver = obj!("workflow_signal_id" => signal_id, "signal_name" => signal_name);
    satisfy_condition_wait(run, cx, task_id, receiver, Some(command_id), commands);
}

/// A receiver (signal or applied update) resolves the latest open condition wait — unless the
/// same completion re-opens that wait (protocol 20 §5 step 2).
fn satisfy_condition_wait(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    receiver: Map<String, Value>,
    command_id: Option<&CommandId>,
    commands: &[WorkflowCommand],
) {
    let Some(wait) = run.condition_waits.last().cloned() else {
        return;
    };
    run.condition_waits.pop();
    cancel_wait_timer(run, cx, wait.timer_id.as_ref());
    let reopened = commands.iter().any(|c| {
        matches!(c, WorkflowCommand::OpenConditionWait { condition_key, fingerprint, .. }
            if *condition_key == wait.condition_key && *fingerprint == wait.fingerprint)
    });
    if reopened {
        // The re-open supersedes the old wait; a Satisfied row between them would bind later
        // receivers to the old wait on replay.
        return;
    }
    let mut payload = obj!(
        "condition_wait_id" => wait.id,
        "condition_key" => wait.condition_key,
        "condition_definition_fingerprint" => wait.fingerprint,
        "sequence" => wait.step,
        "timer_id" => wait.timer_id,
        "timeout_seconds" => wait.timeout_seconds,
    );
    payload.extend(receiver);
    run.append(cx, EventType::ConditionWaitSatisfied, payload, Some(task_id), command_id);
}

/// Closes a wait's timeout timer without an event: the wait's own resolution row records the end.
fn cancel_wait_timer(run: &mut RunState, cx: &mut Cx, timer_id: Option<&TimerId>) {
    if let Some(timer) = timer_id.and_then(|id| run.timers.remove(id)) {
        run.close_task(cx, &timer.task_id, TaskClosure::Cancelled);
    }
}

/// Assigns the step sequence of a command, or `None` when it re-sends an already recorded
/// parallel-group member (a replay: no events, no step).
fn take_step(run: &mut RunState, command: &WorkflowCommand) -> Result<Option<u32>, Refusal> {
    let kind = command.step_kind().expect("only step commands take steps");
    let tags = command.tags().expect("step commands have tags");
    let base = tags.get("parallel_group_base_sequence").and_then(Value::as_u64);
    let index = tags.get("parallel_group_index").and_then(Value::as_u64);
    if let (Some(base), Some(index)) = (base, index) {
        let target = (base + index) as u32;
        if target < run.next_step {
            return match run.steps.get(&target) {
                Some(recorded) if *recorded == kind => Ok(None),
                _ => Err(invalid(format!(
                    "Parallel group member at step {target} does not match the recorded step."
                ))),
            };
        }
        if target != run.next_step {
            return Err(invalid(format!(
                "parallel_group_base_sequence + parallel_group_index = {target}, but the next step is {}.",
                run.next_step
            )));
        }
    }
    let step = run.next_step;
    run.next_step += 1;
    run.steps.insert(step, kind);
    Ok(Some(step))
}

fn apply_command(run: &mut RunState, cx: &mut Cx, task_id: &TaskId, command: WorkflowCommand) -> Result<(), Refusal> {
    let step = if command.step_kind().is_some() {
        match take_step(run, &command)? {
            Some(step) => step,
            None => return Ok(()),
        }
    } else {
        0
    };
    let now = cx.now;
    let wt = Some(task_id);
    match command {
        WorkflowCommand::ScheduleActivity(schedule) => {
            let execution_id: ActivityExecutionId = cx.id();
            let queue = schedule
                .queue
                .clone()
                .filter(|q| !q.is_empty())
                .unwrap_or_else(|| run.task_queue.clone());
            let retry_policy_given = schedule.retry_policy.is_some();
            let retry_policy = schedule.retry_policy.clone().unwrap_or_else(RetryPolicy::server_default);
            let schedule_to_close_deadline = schedule.timeouts.schedule_to_close_seconds.map(|s| now + s * 1000);
            let task = run.new_task(
                cx,
                TaskKind::Activity,
                &queue,
                TaskDetail::Activity {
                    execution_id: execution_id.clone(),
                    activity_type: schedule.activity_type.clone(),
                    attempt_number: 1,
                    attempt_id: None,
                    last_heartbeat_at: None,
                    started_at: None,
                },
            );
            let execution = ActivityExecution {
                id: execution_id,
                step,
                activity_type: schedule.activity_type,
                queue,
                arguments: schedule.arguments,
                retry_policy,
                retry_policy_given,
                timeouts: schedule.timeouts,
                scheduled_at: now,
                schedule_to_close_deadline,
                attempt_count: 0,
                attempt_ids: Vec::new(),
                task_id: task.clone(),
                last_heartbeat_details: None,
                tags: schedule.tags,
                action: None,
                ledger_key: None,
                blocked_by: None,
            };
            let mut execution = execution;
            if let Some(definition) = cx.actions.as_ref().and_then(|actions| actions.get(&execution.activity_type)) {
                let arguments = cx.memo.and_then(|codec| codec.to_json(&execution.arguments).ok());
                execution.action = Some(ActionPin::for_arguments(definition, arguments.as_ref()));
                // An atomic action runs in the server, never on a worker: its task goes to the
                // internal queue the server's atomic executor polls.
                if definition.recovery_mode == RecoveryMode::Atomic {
                    execution.queue = ATOMIC_QUEUE.to_string();
                    let task_id = execution.task_id.clone();
                    run.task_mut(cx, &task_id).expect("just created").queue = ATOMIC_QUEUE.to_string();
                }
            }
            set_ready_activity_deadline(run, cx, &task, &execution);
            let mut payload = activity_identity(&execution);
            payload.insert("queue".into(), json!(execution.queue));
            if execution.retry_policy_given {
                payload.insert("retry_policy".into(), execution.retry_policy.to_json());
            }
            let t = &execution.timeouts;
            for (key, value) in [
                ("start_to_close_timeout", t.start_to_close_seconds),
                ("schedule_to_start_timeout", t.schedule_to_start_seconds),
                ("schedule_to_close_timeout", t.schedule_to_close_seconds),
                ("heartbeat_timeout", t.heartbeat_seconds),
            ] {
                if let Some(value) = value {
                    payload.insert(key.into(), json!(value));
                }
            }
            payload.insert("task_id".into(), json!(task));
            run.activities.insert(execution.id.clone(), execution);
            run.append(cx, EventType::ActivityScheduled, payload, wt, None);
        }
        WorkflowCommand::RecordLocalActivity(local) => record_local_activity(run, cx, step, wt, local),
        WorkflowCommand::CancelSelectionOperation(cancel) => cancel_selection_member(run, cx, wt, cancel)?,
        WorkflowCommand::StartTimer { delay_seconds, tags } => {
            let timer = schedule_timer(run, cx, step, delay_seconds, TimerPurpose::User, tags);
            let payload = timer_payload(run, &timer);
            run.append(cx, EventType::TimerScheduled, payload, wt, None);
        }
        WorkflowCommand::OpenConditionWait {
            condition_key,
            fingerprint,
            timeout_seconds,
            tags,
        } => {
            let wait_id: WaitId = cx.id();
            let mut payload = obj!(
                "condition_wait_id" => wait_id,
                "condition_key" => condition_key,
                "condition_definition_fingerprint" => fingerprint,
                "sequence" => step,
                "timeout_seconds" => timeout_seconds,
            );
            extend(&mut payload, &tags);
            run.append(cx, EventType::ConditionWaitOpened, payload, wt, None);
            let mut wait = ConditionWait {
                id: wait_id.clone(),
                step,
                condition_key,
                fingerprint,
                timeout_seconds,
                timer_id: None,
            };
            if let Some(timeout) = timeout_seconds.filter(|t| *t > 0) {
                let timer = schedule_timer(run, cx, step, timeout, TimerPurpose::ConditionTimeout(wait_id), tags);
                wait.timer_id = Some(timer.id.clone());
                run.condition_waits.push(wait);
                let payload = timer_payload(run, &timer);
                run.append(cx, EventType::TimerScheduled, payload, wt, None);
            } else {
                run.condition_waits.push(wait);
            }
        }
        WorkflowCommand::OpenSignalWait {
            signal_name,
            timeout_seconds,
            tags,
        } => {
            let wait_id: WaitId = cx.id();
            let mut payload = obj!(
                "signal_name" => signal_name,
                "signal_wait_id" => wait_id,
                "sequence" => step,
                "timeout_seconds" => timeout_seconds,
            );
            extend(&mut payload, &tags);
            run.append(cx, EventType::SignalWaitOpened, payload, wt, None);
            let mut wait = SignalWait {
                id: wait_id.clone(),
                step,
                signal_name,
                timeout_seconds,
                timer_id: None,
            };
            match timeout_seconds {
                Some(0) => {
                    // A zero timeout resolves at once: the wait times out in this very completion.
                    let timer = TimerState {
                        id: cx.id(),
                        step,
                        delay_seconds: 0,
                        fire_at: now,
                        task_id: TaskId(String::new()),
                        purpose: TimerPurpose::SignalTimeout(wait_id),
                        tags,
                    };
                    let mut payload = timer_payload_for(&timer, Some(&wait.signal_name));
                    payload.insert("fired_at".into(), json!(iso8601(now)));
                    run.append(cx, EventType::TimerFired, payload, wt, None);
                    run.workflow_task_wanted = true;
                }
                Some(timeout) if timeout > 0 => {
                    let timer = schedule_timer(run, cx, step, timeout, TimerPurpose::SignalTimeout(wait_id), tags);
                    wait.timer_id = Some(timer.id.clone());
                    let payload = timer_payload_for(&timer, Some(&wait.signal_name));
                    run.signal_waits.push(wait);
                    run.append(cx, EventType::TimerScheduled, payload, wt, None);
                }
                _ => run.signal_waits.push(wait),
            }
        }
        WorkflowCommand::RecordSideEffect { result, tags } => {
            let mut payload = obj!("sequence" => step, "result" => result.blob, "payload_codec" => result.codec);
            extend(&mut payload, &tags);
            run.append(cx, EventType::SideEffectRecorded, payload, wt, None);
        }
        WorkflowCommand::RecordVersionMarker {
            change_id,
            version,
            min_supported,
            max_supported,
            tags,
        } => {
            let mut payload = obj!(
                "sequence" => step,
                "change_id" => change_id,
                "version" => version,
                "min_supported" => min_supported,
                "max_supported" => max_supported,
            );
            extend(&mut payload, &tags);
            run.append(cx, EventType::VersionMarkerRecorded, payload, wt, None);
        }
        WorkflowCommand::UpsertSearchAttributes { attributes, tags } => {
            for (key, value) in &attributes {
                if value.is_null() {
                    run.search_attributes.remove(key);
                } else {
                    run.search_attributes.insert(key.clone(), value.clone());
                }
            }
            let mut payload = obj!("sequence" => step, "attributes" => attributes, "merged" => run.search_attributes);
            extend(&mut payload, &tags);
            run.append(cx, EventType::SearchAttributesUpserted, payload, wt, None);
        }
        // After a cooperative cancellation reached workflow code, however the code ends its
        // cleanup, the run ends cancelled.
        WorkflowCommand::CompleteWorkflow { .. } | WorkflowCommand::FailWorkflow(_) if cancellation_delivered(run) => {
            close_cancelled_cooperatively(run, cx, wt, "completed");
        }
        WorkflowCommand::CompleteWorkflow { result } => {
            let payload = obj!("output" => result.blob, "payload_codec" => result.codec);
            run.output = Some(result);
            close_run(run, cx, RunStatus::Completed, ClosedReason::Completed);
            run.append(cx, EventType::WorkflowCompleted, payload, wt, None);
        }
        WorkflowCommand::StartChildWorkflow(child) => {
            let child_id = child
                .workflow_id
                .clone()
                .unwrap_or_else(|| format!("{}:{}:{step}", run.workflow_id, run.run_id));
            let parent = ParentLink {
                workflow_id: run.workflow_id.clone(),
                run_id: run.run_id.clone(),
                sequence: step,
                retry_policy: child.retry_policy.clone(),
                attempt: 1,
            };
            let (child_run, child_effects) = {
                let mut next = Cx::new(cx.now, &mut *cx.ids, cx.limits);
                let start = StartRun {
                    namespace: run.namespace.clone(),
                    workflow_id: WorkflowId(child_id.clone()),
                    run_id: next.id(),
                    workflow_type: child.workflow_type.clone(),
                    task_queue: child
                        .queue
                        .clone()
                        .filter(|q| !q.is_empty())
                        .unwrap_or_else(|| run.task_queue.clone()),
                    input: child.arguments.clone(),
                    execution_timeout_seconds: child.execution_timeout_seconds,
                    run_timeout_seconds: child.run_timeout_seconds,
                    business_key: None,
                    memo: Map::new(),
                    search_attributes: Map::new(),
                    command_id: next.id(),
                    contract: None,
                    compatibility: None,
                };
                let execution_deadline_at = start.execution_timeout_seconds.map(|s| next.now + s * 1000);
                let mut child_run = blank_run(&next, start, 1, execution_deadline_at);
                child_run.parent = Some(parent);
                let child_run = begin_run(child_run, &mut next);
                (child_run, next.effects)
            };
            let mut payload = obj!(
                "sequence" => step,
                "child_workflow_instance_id" => child_run.workflow_id,
                "child_workflow_run_id" => child_run.run_id,
                "child_workflow_type" => child_run.workflow_type,
                "child_call_id" => child_run.start_command_id,
                "workflow_link_id" => child_run.start_command_id,
                "parent_close_policy" => child.parent_close_policy,
                "cancellation_policy" => child.cancellation_policy,
                "task_queue" => child_run.task_queue,
            );
            if let Some(policy) = &child.retry_policy {
                payload.insert("retry_policy".into(), child_retry_snapshot(policy));
            }
            extend(&mut payload, &child.tags);
            run.append(cx, EventType::ChildWorkflowScheduled, payload.clone(), wt, None);
            payload.insert("child_status".into(), json!(child_run.status.as_str()));
            payload.insert("child_run_number".into(), json!(child_run.run_number));
            payload.insert("execution_timeout_seconds".into(), json!(child_run.execution_timeout_seconds));
            payload.insert("run_timeout_seconds".into(), json!(child_run.run_timeout_seconds));
            run.append(cx, EventType::ChildRunStarted, payload, wt, None);
            run.children.insert(
                step,
                ChildLink {
                    workflow_id: child_run.workflow_id.clone(),
                    run_id: child_run.run_id.clone(),
                    workflow_type: child_run.workflow_type.clone(),
                    parent_close_policy: child.parent_close_policy,
                    cancellation_policy: child.cancellation_policy,
                    call_id: child_run.start_command_id.to_string(),
                    tags: child.tags,
                },
            );
            cx.effects.children_started.push((child_run, child_effects));
        }
        WorkflowCommand::CompleteUpdate { update_id, result } => {
            let record = accepted_update(run, &update_id)?;
            let wait_step = run.condition_waits.last().map(|w| w.step);
            let mut identity = obj!(
                "workflow_command_id" => record.command_id,
                "update_id" => update_id,
                "workflow_instance_id" => run.workflow_id,
                "workflow_run_id" => run.run_id,
                "update_name" => record.update_name,
            );
            if let Some(step) = wait_step {
                identity.insert("sequence".into(), json!(step));
            }
            let mut applied = identity.clone();
            applied.insert("arguments".into(), payload_json(&record.arguments));
            run.append(cx, EventType::UpdateApplied, applied, wt, Some(&record.command_id));
            let mut completed = identity;
            completed.insert("result".into(), json!(result.blob));
            completed.insert("payload_codec".into(), json!(result.codec));
            run.append(cx, EventType::UpdateCompleted, completed, wt, Some(&record.command_id));
            let stored = run.updates.get_mut(&update_id).expect("checked");
            stored.status = UpdateStatus::Completed;
            stored.closed_at = Some(cx.now);
            stored.result = Some(result);
            // A regular task follows, re-evaluating whatever the handler changed.
            run.pending_resumes.push_back(ResumeContext::AfterUpdate { update_id });
        }
        WorkflowCommand::FailUpdate { update_id, failure } => {
            let record = accepted_update(run, &update_id)?;
            let payload = obj!(
                "workflow_command_id" => record.command_id,
                "update_id" => update_id,
                "workflow_instance_id" => run.workflow_id,
                "workflow_run_id" => run.run_id,
                "update_name" => record.update_name,
                "failure_category" => "application",
                "non_retryable" => failure.non_retryable,
                "exception_type" => failure.exception_type,
                "exception_class" => failure.exception_class.clone().or_else(|| failure.exception_type.clone()),
                "message" => failure.message,
                "exception" => failure.exception,
            );
            run.append(cx, EventType::UpdateCompleted, payload, wt, Some(&record.command_id));
            let stored = run.updates.get_mut(&update_id).expect("checked");
            stored.status = UpdateStatus::Failed;
            stored.closed_at = Some(cx.now);
            stored.failure = Some(failure);
        }
        WorkflowCommand::UpsertMemo { entries, tags } => {
            let codec = cx.memo.ok_or_else(|| invalid("This server cannot merge memos."))?;
            let base = match &run.memo_merged {
                Some(merged) => crate::memo::MemoBase::Merged(merged),
                None => crate::memo::MemoBase::Start(&run.memo),
            };
            let merged = codec
                .merge(base, &entries)
                .map_err(|reason| invalid(format!("upsert_memo: {reason}")))?;
            let mut payload = obj!(
                "sequence" => step,
                "entries" => payload_json(&entries),
                "merged" => payload_json(&merged.merged),
            );
            extend(&mut payload, &tags);
            run.memo = merged.projection;
            run.memo_merged = Some(merged.merged);
            run.append(cx, EventType::MemoUpserted, payload, wt, None);
        }
        WorkflowCommand::ContinueAsNew {
            arguments,
            workflow_type,
            queue,
            tags,
        } => {
            close_run(run, cx, RunStatus::Completed, ClosedReason::Continued);
            // The successor is built with its own effects; its events belong to its own run.
            let (successor, successor_effects) = {
                let mut next = Cx::new(cx.now, &mut *cx.ids, cx.limits);
                let successor = continued_run(&mut next, run, arguments, workflow_type, queue);
                (successor, next.effects)
            };
            let mut payload = obj!(
                "sequence" => step,
                "continued_to_run_id" => successor.run_id,
                "continued_to_run_number" => successor.run_number,
                "workflow_link_id" => successor.start_command_id,
                "closed_reason" => "continued",
                "workflow_type" => successor.workflow_type,
                "task_queue" => successor.task_queue,
            );
            extend(&mut payload, &tags);
            run.append(cx, EventType::WorkflowContinuedAsNew, payload, wt, None);
            // Link the chains: the successor's first event follows this run's last.
            let mut successor = successor;
            let mut successor_effects = successor_effects;
            relink(&mut successor, &mut successor_effects, &run.last_hash);
            cx.effects.successor = Some(Box::new((successor, successor_effects)));
        }
        WorkflowCommand::FailWorkflow(failure) => {
            let failure_id: String = cx.ids.next_id();
            let payload = obj!(
                "failure_id" => failure_id,
                "source_kind" => "workflow_run",
                "source_id" => run.run_id,
                "failure_category" => "application",
                "non_retryable" => failure.non_retryable,
                "exception_type" => failure.exception_type,
                "exception_class" => failure.exception_class.clone().or_else(|| failure.exception_type.clone()),
                "message" => failure.message,
                "exception" => failure.exception,
            );
            run.failure = Some(failure);
            close_run(run, cx, RunStatus::Failed, ClosedReason::Failed);
            run.append(cx, EventType::WorkflowFailed, payload, wt, None);
            retry_failed_child(run, cx);
        }
    }
    Ok(())
}

/// A local activity ran inside the workflow task: its whole story is recorded at once, as
/// activity events marked `execution_mode: local` (both SDKs' replayers need the marker on every
/// event of the step). No activity task exists and no new workflow task is needed: the same
/// completion already used the result.
fn record_local_activity(run: &mut RunState, cx: &mut Cx, step: u32, wt: Option<&TaskId>, local: LocalActivityRecord) {
    let execution_id: ActivityExecutionId = cx.id();
    let mut common = obj!(
        "sequence" => step,
        "activity_execution_id" => execution_id,
        "activity_type" => local.activity_type,
        "execution_mode" => "local",
        "local_activity" => true,
    );
    extend(&mut common, &local.tags);
    let with = |extra: Map<String, Value>| {
        let mut payload = common.clone();
        payload.extend(extra);
        payload
    };
    let mut scheduled = with(obj!("arguments" => payload_json(&local.arguments)));
    scheduled.extend(local.echoed);
    run.append(cx, EventType::ActivityScheduled, scheduled, wt, None);
    let last_index = local.attempts.len().saturating_sub(1);
    let mut last = (1u32, None::<ActivityAttemptId>, None::<String>);
    for (index, attempt) in local.attempts.into_iter().enumerate() {
        let attempt_id: ActivityAttemptId = cx.id();
        let identity = obj!(
            "attempt_number" => attempt.attempt_number,
            "activity_attempt_id" => attempt_id,
        );
        let mut started = with(identity.clone());
        started.insert("worker_attempt_id".into(), json!(attempt.worker_attempt_id));
        run.append(cx, EventType::ActivityStarted, started, wt, None);
        for heartbeat in attempt.heartbeats {
            let mut payload = with(identity.clone());
            payload.insert("elapsed_ms".into(), heartbeat.get("elapsed_ms").cloned().unwrap_or(Value::Null));
            payload.insert("details".into(), heartbeat.get("details").cloned().unwrap_or(Value::Null));
            run.append(cx, EventType::ActivityHeartbeatRecorded, payload, wt, None);
        }
        if index < last_index {
            let mut payload = with(identity.clone());
            let retry = &attempt.retry;
            for (from, to) in [
                ("retry_reason", "retry_reason"),
                ("backoff_seconds", "retry_backoff_seconds"),
                ("message", "message"),
                ("exception_type", "exception_type"),
                ("timeout_kind", "timeout_kind"),
            ] {
                if let Some(value) = retry.get(from) {
                    payload.insert(to.into(), value.clone());
                }
            }
            run.append(cx, EventType::ActivityRetryScheduled, payload, wt, None);
        }
        last = (attempt.attempt_number, Some(attempt_id), attempt.worker_attempt_id);
    }
    let mut terminal = with(obj!(
        "attempt_number" => last.0,
        "activity_attempt_id" => last.1,
        "worker_attempt_id" => last.2,
    ));
    let trimmed = |message: &str| message.trim_matches(|c: char| " \t\n\r\0\u{b}".contains(c)).to_string();
    let event_type = match local.outcome {
        LocalOutcome::Completed(result) => {
            terminal.insert("result".into(), json!(result.blob));
            terminal.insert("payload_codec".into(), json!(result.codec));
            EventType::ActivityCompleted
        }
        LocalOutcome::Failed(failure) => {
            let failure_id: String = cx.ids.next_id();
            terminal.extend(obj!(
                "failure_id" => failure_id,
                "message" => trimmed(&failure.message),
                "exception_type" => failure.exception_type,
                "non_retryable" => failure.non_retryable,
                "failure_category" => "application",
            ));
            EventType::ActivityFailed
        }
        LocalOutcome::TimedOut(failure) => {
            let failure_id: String = cx.ids.next_id();
            terminal.extend(obj!(
                "failure_id" => failure_id,
                "timeout_kind" => failure.timeout_kind,
                "message" => trimmed(&failure.message),
                "exception_class" => failure.exception_type,
                "failure_category" => "timeout",
            ));
            EventType::ActivityTimedOut
        }
        LocalOutcome::Cancelled(failure) => {
            let failure_id: String = cx.ids.next_id();
            terminal.extend(obj!(
                "failure_id" => failure_id,
                "message" => trimmed(&failure.message),
                "exception_type" => failure.exception_type,
                "non_retryable" => true,
            ));
            EventType::ActivityCancelled
        }
    };
    run.append(cx, event_type, terminal, wt, None);
}

/// Cancels the open operations of a selection member and records one
/// `SelectionOperationCancelled`. A member that already settled, or was cancelled before, is
/// left alone without an error: the Python SDK sends the cancel again on later tasks until it
/// sees a marker. The member's own leaves get no events: the marker is their outcome.
fn cancel_selection_member(run: &mut RunState, cx: &mut Cx, wt: Option<&TaskId>, cancel: SelectionCancel) -> Result<(), Refusal> {
    let group_end = parse_select_group(&cancel.selection_group_id)
        .map(|(base, size)| base + size)
        .ok_or_else(|| invalid("selection_group_id must be select-calls:<base>:<size>."))?;
    if cancel.member_size == 0 || cancel.member_base_sequence + cancel.member_size > group_end as u32 {
        return Err(invalid("The selection member lies outside its group."));
    }
    if cancel.operation_kind != "group" {
        if let Some(recorded) = run.selections.identity(cancel.member_base_sequence) {
            if recorded != cancel.operation_identity {
                return Err(invalid("operation_identity does not name the member's recorded operation."));
            }
        }
    }
    let steps = cancel.member_base_sequence..cancel.member_base_sequence + cancel.member_size;
    if steps.clone().any(|s| s >= run.next_step) {
        return Err(invalid("The selection member has not been opened."));
    }
    if !run
        .selections
        .take_cancel(&cancel.selection_group_id, cancel.member_base_sequence, cancel.member_size)
    {
        return Ok(());
    }
    for step in steps {
        let timers: Vec<TimerState> = run.timers.values().filter(|t| t.step == step).cloned().collect();
        for timer in timers {
            run.timers.remove(&timer.id);
            run.close_task(cx, &timer.task_id, TaskClosure::Cancelled);
        }
        let activities: Vec<ActivityExecution> = run.activities.values().filter(|a| a.step == step).cloned().collect();
        for activity in activities {
            run.activities.remove(&activity.id);
            run.close_task(cx, &activity.task_id, TaskClosure::Cancelled);
        }
        run.condition_waits.retain(|w| w.step != step);
        run.signal_waits.retain(|w| w.step != step);
        if let Some(child) = run.children.get(&step) {
            cx.effects.close_children.push((child.workflow_id.clone(), CloseCommand::Cancel));
        }
    }
    let payload = obj!(
        "selection_group_id" => cancel.selection_group_id,
        "member_key" => cancel.member_key,
        "member_index" => cancel.member_index,
        "member_base_sequence" => cancel.member_base_sequence,
        "member_size" => cancel.member_size,
        "operation_kind" => cancel.operation_kind,
        "operation_identity" => cancel.operation_identity,
        "cancelled_at" => iso8601(cx.now),
    );
    run.append(cx, EventType::SelectionOperationCancelled, payload, wt, None);
    Ok(())
}

/// `select-calls:<base>:<size>` → `(base, size)`.
fn parse_select_group(id: &str) -> Option<(u64, u64)> {
    let rest = id.strip_prefix("select-calls:")?;
    let (base, size) = rest.split_once(':')?;
    let (base, size) = (base.parse::<u64>().ok()?, size.parse::<u64>().ok()?);
    (base >= 1 && size >= 1).then_some((base, size))
}

/// Re-hashes a successor's events so its chain starts at `origin` (the predecessor's final hash,
/// known only after the predecessor's terminal event was appended).
fn relink(run: &mut RunState, effects: &mut Effects, origin: &str) {
    run.chain_origin = origin.to_string();
    let mut prev = origin.to_string();
    for event in &mut effects.events {
        event.prev_hash = prev;
        event.hash = crate::history::chain_hash(&event.prev_hash, &event.canonical_json());
        prev = event.hash.clone();
    }
    run.last_hash = prev;
}

fn accepted_update(run: &RunState, update_id: &str) -> Result<UpdateRecord, Refusal> {
    match run.updates.get(update_id) {
        Some(record) if record.status == UpdateStatus::Accepted => Ok(record.clone()),
        Some(_) => Err(invalid(format!("Update {update_id} is already settled."))),
        None => Err(invalid(format!("Update {update_id} is not known on this run."))),
    }
}

fn schedule_timer(run: &mut RunState, cx: &mut Cx, step: u32, delay_seconds: i64, purpose: TimerPurpose, tags: StepTags) -> TimerState {
    let timer_id: TimerId = cx.id();
    let fire_at = cx.now + delay_seconds * 1000;
    let task_id = run.new_task(
        cx,
        TaskKind::Timer,
        "",
        TaskDetail::Timer {
            timer_id: timer_id.clone(),
        },
    );
    run.task_mut(cx, &task_id).expect("just created").deadline_at = Some(fire_at);
    let timer = TimerState {
        id: timer_id,
        step,
        delay_seconds,
        fire_at,
        task_id,
        purpose,
        tags,
    };
    run.timers.insert(timer.id.clone(), timer.clone());
    timer
}

fn timer_payload(run: &RunState, timer: &TimerState) -> Map<String, Value> {
    let condition = match &timer.purpose {
        TimerPurpose::ConditionTimeout(wait_id) => run.condition_waits.iter().find(|w| &w.id == wait_id),
        _ => None,
    };
    let mut payload = timer_payload_for(timer, None);
    if let Some(wait) = condition {
        payload.insert("condition_key".into(), json!(wait.condition_key));
        payload.insert("condition_definition_fingerprint".into(), json!(wait.fingerprint));
    }
    payload
}

fn timer_payload_for(timer: &TimerState, signal_name: Option<&str>) -> Map<String, Value> {
    let mut payload = obj!(
        "timer_id" => timer.id,
        "sequence" => timer.step,
        "delay_seconds" => timer.delay_seconds,
        "fire_at" => iso8601(timer.fire_at),
    );
    match &timer.purpose {
        TimerPurpose::User => {}
        TimerPurpose::ConditionTimeout(wait_id) => {
            payload.insert("timer_kind".into(), json!("condition_timeout"));
            payload.insert("condition_wait_id".into(), json!(wait_id));
        }
        TimerPurpose::SignalTimeout(wait_id) => {
            payload.insert("timer_kind".into(), json!("signal_timeout"));
            payload.insert("signal_wait_id".into(), json!(wait_id));
            if let Some(name) = signal_name {
                payload.insert("signal_name".into(), json!(name));
            }
        }
    }
    extend(&mut payload, &timer.tags);
    payload
}

/// Closes a run: every open task, timer, wait and activity of it ends with it.
fn close_run(run: &mut RunState, cx: &mut Cx, status: RunStatus, reason: ClosedReason) {
    // Accepted signals are facts of this run even if no task will see them: before the close.
    run.record_deferred_signals(cx);
    run.status = status;
    run.closed_reason = Some(reason);
    run.closed_at = Some(cx.now);
    if reason != ClosedReason::Continued {
        // A child's end reaches its parent in the same transaction (the store applies it).
        if let Some(parent) = run.parent.clone() {
            cx.effects.parent_notice = Some(ChildOutcome {
                parent,
                child_workflow_id: run.workflow_id.clone(),
                child_run_id: run.run_id.clone(),
                status,
                closed_reason: Some(reason),
                output: run.output.clone(),
                failure: run.failure.clone(),
                closed_at: cx.now,
                retry: None,
            });
        }
    }
    // Parent-close policy: open children end with the parent unless abandoned. (A continued run
    // keeps them: they belong to the instance, not the run.)
    if reason != ClosedReason::Continued {
        for child in std::mem::take(&mut run.children).into_values() {
            let command = match child.parent_close_policy.as_str() {
                "terminate" => CloseCommand::Terminate,
                "request_cancel" | "request_cancellation" => CloseCommand::Cancel,
                _ => continue,
            };
            // The parent's side of the relationship, before its terminal event (the child's
            // close commits in the same transaction). DW's field names: no `sequence` or
            // `child_call_id`, which the SDKs' replayers would take for a step resolution.
            let payload = obj!(
                "child_instance_id" => child.workflow_id,
                "child_run_id" => child.run_id,
                "child_workflow_type" => child.workflow_type,
                "policy" => child.parent_close_policy,
                "reason" => format!("Parent workflow closed ({}); parent-close policy: {}.", reason.as_str(), child.parent_close_policy),
            );
            run.append(cx, EventType::ParentClosePolicyApplied, payload, None, None);
            cx.effects.close_children.push((child.workflow_id, command));
        }
    }
    let current = run.workflow_task.clone();
    // A declared action in flight when the run closes may have acted: its outcome is unknown.
    let dispatched: Vec<String> = run.activities.values().filter_map(|a| a.ledger_key.clone()).collect();
    for key in dispatched {
        if let Some(mut entry) = run.ledger.get(&key).filter(|e| e.state == LedgerState::Dispatched).cloned() {
            let reason = json!({"kind": "run_closed", "closed_reason": reason.as_str()});
            entry.state = LedgerState::OutcomeUnknown;
            entry.unknown_reason = Some(reason.clone());
            checkpoint(run, cx, entry, obj!("reason" => reason));
        }
    }
    let open: Vec<TaskId> = run.tasks.keys().filter(|id| Some(*id) != current.as_ref()).cloned().collect();
    for id in open {
        run.close_task(cx, &id, TaskClosure::Cancelled);
    }
    run.activities.clear();
    run.timers.clear();
    run.condition_waits.clear();
    run.signal_waits.clear();
    run.pending_resumes.clear();
    run.pending_updates.clear();
    for update in run.updates.values_mut().filter(|u| u.status == UpdateStatus::Accepted) {
        update.status = UpdateStatus::Failed;
        update.closed_at = Some(cx.now);
        update.failure = Some(WorkflowFailure {
            message: "The workflow run closed before the update was applied.".into(),
            ..Default::default()
        });
    }
    run.workflow_task_wanted = false;
}

/// Closes the run's in-flight workflow task too: used by closes that do not come from a
/// workflow task (cancel, terminate, time-out).
fn close_run_from_outside(run: &mut RunState, cx: &mut Cx, status: RunStatus, reason: ClosedReason) {
    close_run(run, cx, status, reason);
    if let Some(id) = run.workflow_task.clone() {
        run.close_task(cx, &id, TaskClosure::Cancelled);
    }
}

pub fn run_closed_refusal(run: &RunState) -> Refusal {
    let stop_reason = match run.closed_reason {
        Some(ClosedReason::Cancelled) => "run_cancelled",
        Some(ClosedReason::Terminated) => "run_terminated",
        Some(ClosedReason::Completed) => "run_completed",
        Some(ClosedReason::Failed) => "run_failed",
        _ => "run_closed",
    };
    Refusal::new(Reason::RunClosed, "The workflow run is closed.")
        .with("stop_reason", stop_reason)
        .with("cancel_requested", run.closed_reason == Some(ClosedReason::Cancelled))
        .with("can_continue", false)
        .with("run_status", run.status.as_str())
        .with("run_closed_reason", run.closed_reason.map(|r| r.as_str()))
        .with("run_closed_at", run.closed_at.map(iso8601))
}

/// A worker's failure report for a workflow task.
#[derive(Clone, Debug, Default)]
pub struct WorkflowTaskFailure {
    pub message: String,
    pub failure_type: Option<String>,
}

/// A failed workflow task records no history of its own (only signals deferred during its lease).
/// `WorkflowTaskWaitingForHistory` closes it (nothing
/// new to do); any other failure offers it again after a capped exponential backoff.
pub fn fail_workflow_task(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    owner: &str,
    attempt: u64,
    failure: WorkflowTaskFailure,
) -> Result<Receipt, Refusal> {
    if let Some(receipt) = retained_receipt(run, task_id, owner, attempt, None, ReportKind::FailWorkflowTask) {
        return Ok(receipt);
    }
    check_workflow_lease(run, cx.now, task_id, owner, attempt)?;
    let mut created = Vec::new();
    // "Waiting for history" is benign only while something pending will wake the workflow;
    // otherwise closing the task would strand the run, so it is re-offered like any failure.
    let something_pending =
        !run.activities.is_empty() || !run.timers.is_empty() || !run.condition_waits.is_empty() || !run.signal_waits.is_empty();
    if failure.failure_type.as_deref() == Some(WAITING_FOR_HISTORY_FAILURE) && something_pending {
        run.close_task(cx, task_id, TaskClosure::Completed);
        if run.status == RunStatus::Running {
            run.status = RunStatus::Waiting;
        }
        created.extend(run.follow_up_workflow_task(cx));
    } else {
        let backoff = (1000i64 << attempt.saturating_sub(1).min(16)).min(WORKFLOW_TASK_RETRY_BACKOFF_MAX_MS);
        let now = cx.now;
        let task = run.task_mut(cx, task_id).expect("lease checked");
        task.state = TaskState::Ready;
        task.available_at = now + backoff;
        task.deadline_at = None;
    }
    run.record_deferred_signals(cx);
    let receipt = Receipt {
        run_status: run.status,
        created_task_ids: created,
        next_task_id: None,
        retained: false,
    };
    run.remember_receipt(
        cx,
        ClosedTaskReceipt {
            task_id: task_id.clone(),
            owner: owner.to_string(),
            fence: attempt,
            attempt_id: None,
            report: ReportKind::FailWorkflowTask,
            receipt: receipt.clone(),
        },
    );
    Ok(receipt)
}

/// A worker gives its workflow task back (it is shutting down): the task is offered again at
/// once, under a higher fence at its next lease. No history changes.
pub fn release_workflow_task(run: &mut RunState, cx: &mut Cx, task_id: &TaskId, owner: &str) -> Result<(), Refusal> {
    let now = cx.now;
    let held = run.tasks.get(task_id).and_then(|t| t.lease()).is_some_and(|l| l.owner == owner);
    if !held {
        return Err(Refusal::new(Reason::TaskNotLeased, "The task is not leased to this worker."));
    }
    let task = run.task_mut(cx, task_id).expect("checked");
    task.state = TaskState::Ready;
    task.available_at = now;
    task.deadline_at = None;
    run.record_deferred_signals(cx);
    Ok(())
}

/// Extends a workflow task's lease.
pub fn heartbeat_workflow_task(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    owner: &str,
    attempt: u64,
    lease_ms: i64,
) -> Result<Lease, Refusal> {
    check_workflow_lease(run, cx.now, task_id, owner, attempt)?;
    let now = cx.now;
    let task = run.task_mut(cx, task_id).expect("lease checked");
    let TaskState::Leased(lease) = &mut task.state else {
        unreachable!("lease checked")
    };
    lease.expires_at = now + lease_ms;
    let lease = lease.clone();
    task.deadline_at = Some(lease.expires_at);
    Ok(lease)
}

// ---------------------------------------------------------------------------------------------
// Activities

fn activity_identity(execution: &ActivityExecution) -> Map<String, Value> {
    let mut payload = obj!(
        "activity_execution_id" => execution.id,
        "activity_type" => execution.activity_type,
        "sequence" => execution.step,
    );
    extend(&mut payload, &execution.tags);
    payload
}

fn set_ready_activity_deadline(run: &mut RunState, cx: &mut Cx, task_id: &TaskId, execution: &ActivityExecution) {
    let now = cx.now;
    let task = run.task_mut(cx, task_id).expect("open activity task");
    let schedule_to_start = execution
        .timeouts
        .schedule_to_start_seconds
        .map(|s| task.available_at.max(now) + s * 1000);
    task.deadline_at = min_opt(schedule_to_start, execution.schedule_to_close_deadline);
}

fn min_opt(a: Option<Millis>, b: Option<Millis>) -> Option<Millis> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

fn execution_of<'r>(run: &'r RunState, task: &Task) -> Option<&'r ActivityExecution> {
    match &task.detail {
        TaskDetail::Activity { execution_id, .. } => run.activities.get(execution_id),
        _ => None,
    }
}

/// Leases a ready activity task: a new attempt with a new `activity_attempt_id` and fence.
pub fn lease_activity_task(run: &mut RunState, cx: &mut Cx, task_id: &TaskId, owner: &str, lease_ms: i64) -> Result<Task, Refusal> {
    lease_activity_task_with(run, cx, task_id, owner, lease_ms, None)?
        .ok_or_else(|| Refusal::new(Reason::TaskNotLeased, "The activity was not dispatched."))
}

/// Leases an activity task whose type may be a declared action: `current` is the definition
/// the store read in this same transaction. A declared action is checked against what its
/// scheduling pinned (a definition changed since is refused: the activity fails without
/// dispatch, and `Ok(None)` says nothing was leased), and its dispatch gets a ledger entry
/// committed with the lease, before any worker sees the task.
pub fn lease_activity_task_with(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    owner: &str,
    lease_ms: i64,
    current: Option<&ActionDefinition>,
) -> Result<Option<Task>, Refusal> {
    integrity_refusal(run)?;
    if let Some(task) = run.tasks.get(task_id).filter(|t| t.kind == TaskKind::Activity && t.is_ready()) {
        let execution = execution_of(run, task).expect("open activity task has an execution").clone();
        // A definition declared after scheduling applies at the claim.
        let pin = execution.action.clone().or_else(|| current.map(ActionPin::at_claim));
        if let Some(pin) = pin {
            if current.map(|d| &d.definition_hash) != Some(&pin.definition_hash) {
                let task = task.clone();
                refuse_dispatch(
                    run,
                    cx,
                    &task,
                    &execution,
                    "definition_changed",
                    "definition_changed: the action definition changed (or was removed) after the activity was scheduled; it was not dispatched.",
                );
                return Ok(None);
            }
            if let Some(reason) = pin.refused.clone() {
                let task = task.clone();
                let message = match reason.as_str() {
                    "approval_required" => "approval_required: an irreversible action needs an approval reference (approval_ref) in its arguments; it was not dispatched.",
                    _ => "backup_required: a snapshot-restore action needs a backup reference (backup_ref) in its arguments; it was not dispatched.",
                };
                refuse_dispatch(run, cx, &task, &execution, &reason, message);
                return Ok(None);
            }
            run.activities.get_mut(&execution.id).expect("open").action = Some(pin);
        }
    }
    let task = lease_activity_attempt(run, cx, task_id, owner, lease_ms)?;
    let execution = execution_of(run, &task).expect("leased").clone();
    if let Some(pin) = execution.action.clone().filter(|p| p.recovery_mode.is_ledgered()) {
        open_ledger_entry(run, cx, &task, &execution, &pin, owner);
    }
    Ok(Some(task))
}

/// An activity refused before dispatch: a final, non-retryable failure; nothing was dispatched,
/// so nothing is uncertain.
fn refuse_dispatch(run: &mut RunState, cx: &mut Cx, task: &Task, execution: &ActivityExecution, reason: &str, message: &str) {
    run.close_task(cx, &task.id, TaskClosure::Failed);
    run.activities.remove(&execution.id);
    let failure_id: String = cx.ids.next_id();
    let mut payload = activity_identity(execution);
    payload.extend(obj!(
        "attempt_number" => execution.attempt_count,
        "failure_id" => failure_id,
        "failure_category" => "activity",
        "exception_type" => reason,
        "exception_class" => reason,
        "message" => message,
        "non_retryable" => true,
        "exception" => json!({"class": reason, "type": reason, "message": message}),
    ));
    run.append(cx, EventType::ActivityFailed, payload, None, None);
    run.want_workflow_task(cx, None);
}

/// The ledger entry of a dispatch: hashes and ids only.
fn open_ledger_entry(run: &mut RunState, cx: &mut Cx, task: &Task, execution: &ActivityExecution, pin: &ActionPin, owner: &str) {
    let TaskDetail::Activity {
        attempt_id: Some(attempt_id),
        attempt_number,
        ..
    } = &task.detail
    else {
        return;
    };
    let ledger_key: String = cx.ids.next_id();
    let entry = LedgerEntry {
        ledger_key: ledger_key.clone(),
        namespace: run.namespace.clone(),
        workflow_id: run.workflow_id.clone(),
        run_id: run.run_id.clone(),
        activity_type: execution.activity_type.clone(),
        activity_execution_id: execution.id.clone(),
        activity_attempt_id: attempt_id.clone(),
        attempt_number: *attempt_number,
        fence: task.fence,
        state: LedgerState::Dispatched,
        recovery_mode: pin.recovery_mode,
        definition_hash: pin.definition_hash.clone(),
        definition_version: pin.version,
        input_hash: crate::ledger::digest(&execution.arguments.blob),
        access_context_hash: crate::ledger::digest(&format!("{}\n{}\n{}", run.namespace, owner, execution.queue)),
        // The provider's key: the activity execution id, stable across attempts.
        idempotency_key_hash: crate::ledger::digest(execution.id.as_str()),
        dispatched_at: cx.now,
        updated_at: cx.now,
        unknown_reason: None,
        resolution: None,
        checkpoint_hash: String::new(),
        late_reports: Vec::new(),
    };
    run.activities.get_mut(&execution.id).expect("open").ledger_key = Some(ledger_key);
    let details = obj!(
        "activity_execution_id" => entry.activity_execution_id,
        "activity_attempt_id" => entry.activity_attempt_id,
        "fence" => entry.fence,
        "definition_hash" => entry.definition_hash,
        "input_hash" => entry.input_hash,
        "access_context_hash" => entry.access_context_hash,
        "idempotency_key_hash" => entry.idempotency_key_hash,
    );
    checkpoint(run, cx, entry, details);
}

/// Records a ledger entry's new state as the next checkpoint of the instance chain. The run
/// keeps only entries still open (dispatched, outcome unknown); settled ones live in the store,
/// so a run with many declared actions does not carry them all in its document.
fn checkpoint(run: &mut RunState, cx: &mut Cx, mut entry: LedgerEntry, details: Map<String, Value>) -> LedgerEntry {
    let mut checkpoint = LedgerCheckpoint {
        namespace: run.namespace.clone(),
        workflow_id: run.workflow_id.clone(),
        ledger_key: entry.ledger_key.clone(),
        state: entry.state,
        recorded_at: cx.now,
        details,
        prev_hash: run.ledger_head.clone(),
        hash: String::new(),
    };
    checkpoint.hash = checkpoint.computed_hash();
    run.ledger_head = checkpoint.hash.clone();
    entry.checkpoint_hash = checkpoint.hash.clone();
    entry.updated_at = cx.now;
    cx.effects.checkpoints.push(checkpoint);
    cx.effects.ledger.push(entry.clone());
    if matches!(entry.state, LedgerState::Dispatched | LedgerState::OutcomeUnknown) {
        run.ledger.insert(entry.ledger_key.clone(), entry.clone());
    } else {
        run.ledger.remove(&entry.ledger_key);
    }
    entry
}

/// The dispatch of a declared action ended without a conclusive result: its outcome is
/// unknown. No retry, no history event: the execution waits, blocked, for an operator.
fn ledger_outcome_unknown(run: &mut RunState, cx: &mut Cx, task: &Task, execution: &ActivityExecution, reason: Value) -> Option<Receipt> {
    let key = execution.ledger_key.clone()?;
    let mut entry = run.ledger.get(&key).filter(|e| e.state == LedgerState::Dispatched)?.clone();
    run.close_task(cx, &task.id, TaskClosure::Failed);
    let stored = run.activities.get_mut(&execution.id).expect("open execution");
    stored.ledger_key = None;
    stored.blocked_by = Some(key.clone());
    entry.state = LedgerState::OutcomeUnknown;
    entry.unknown_reason = Some(reason.clone());
    checkpoint(run, cx, entry, obj!("reason" => reason));
    Some(Receipt {
        run_status: run.status,
        created_task_ids: vec![],
        next_task_id: None,
        retained: false,
    })
}

fn lease_activity_attempt(run: &mut RunState, cx: &mut Cx, task_id: &TaskId, owner: &str, lease_ms: i64) -> Result<Task, Refusal> {
    if run.is_closed() {
        return Err(run_closed_refusal(run));
    }
    let now = cx.now;
    let task = run
        .tasks
        .get(task_id)
        .ok_or_else(|| Refusal::new(Reason::TaskNotLeased, "Activity task is no longer open."))?;
    if task.kind != TaskKind::Activity || !task.is_ready() || task.available_at > now {
        return Err(Refusal::new(Reason::TaskNotLeased, "Activity task is not ready to lease."));
    }
    let execution = execution_of(run, task).expect("open activity task has an execution").clone();
    let attempt_id: ActivityAttemptId = cx.id();
    let attempt_number = execution.attempt_count + 1;
    let expires_at = now + lease_ms;
    let t = &execution.timeouts;
    let deadline = [
        Some(expires_at),
        t.start_to_close_seconds.map(|s| now + s * 1000),
        t.heartbeat_seconds.map(|s| now + s * 1000),
        execution.schedule_to_close_deadline,
    ]
    .into_iter()
    .flatten()
    .min();
    let task = run.task_mut(cx, task_id).expect("checked");
    task.fence = attempt_number as u64;
    task.state = TaskState::Leased(Lease {
        owner: owner.to_string(),
        expires_at,
        fence: task.fence,
    });
    task.deadline_at = deadline;
    task.detail = TaskDetail::Activity {
        execution_id: execution.id.clone(),
        activity_type: execution.activity_type.clone(),
        attempt_number,
        attempt_id: Some(attempt_id.clone()),
        last_heartbeat_at: None,
        started_at: Some(now),
    };
    let task = task.clone();
    run.fence_high_water = run.fence_high_water.max(task.fence);
    let stored = run.activities.get_mut(&execution.id).expect("exists");
    stored.attempt_count = attempt_number;
    stored.attempt_ids.push(attempt_id.clone());
    let mut payload = activity_identity(&execution);
    payload.insert("activity_attempt_id".into(), json!(attempt_id));
    payload.insert("attempt_number".into(), json!(attempt_number));
    payload.insert("lease_expires_at".into(), json!(iso8601(expires_at)));
    payload.insert("task_id".into(), json!(task_id));
    run.append(cx, EventType::ActivityStarted, payload, None, None);
    Ok(task)
}

/// Checks that `(attempt_id, owner)` holds the live lease of activity task `task_id`.
fn check_activity_lease<'r>(
    run: &'r RunState,
    now: Millis,
    task_id: &TaskId,
    attempt_id: &ActivityAttemptId,
    owner: &str,
) -> Result<&'r Task, Refusal> {
    let attach = |refusal: Refusal| {
        refusal
            .with("task_id", task_id.as_str())
            .with("activity_attempt_id", attempt_id.as_str())
    };
    let Some(task) = run.tasks.get(task_id) else {
        if run.is_closed() {
            return Err(attach(activity_run_closed_refusal(run)));
        }
        return Err(attach(Refusal::new(
            Reason::AttemptClosed,
            "The activity attempt is already closed.",
        )));
    };
    let TaskDetail::Activity {
        attempt_id: current,
        execution_id,
        ..
    } = &task.detail
    else {
        return Err(attach(Refusal::new(Reason::TaskNotFound, "Activity task not found.")));
    };
    if current.as_ref() != Some(attempt_id) {
        let execution = run.activities.get(execution_id);
        if execution.is_some_and(|e| e.attempt_ids.contains(attempt_id)) {
            return Err(attach(Refusal::new(Reason::AttemptClosed, "The activity attempt was superseded.")));
        }
        if run.activities.values().any(|e| e.attempt_ids.contains(attempt_id)) {
            return Err(attach(Refusal::new(
                Reason::TaskMismatch,
                "The activity attempt does not belong to this task.",
            )));
        }
        if current.is_none() {
            return Err(attach(Refusal::new(
                Reason::ActivityNotRunning,
                "The activity task has no running attempt.",
            )));
        }
        return Err(attach(Refusal::new(Reason::AttemptNotFound, "Activity attempt not found.")));
    }
    let lease = task.lease().expect("an attempt id is only set on a leased task");
    if lease.owner != owner {
        return Err(attach(Refusal::new(
            Reason::LeaseOwnerMismatch,
            "Activity attempt lease is owned by another worker.",
        ))
        .with("lease_owner", lease.owner.clone()));
    }
    if lease.expires_at <= now {
        return Err(attach(Refusal::new(Reason::LeaseExpired, "Activity attempt lease has expired."))
            .with("lease_expires_at", iso8601(lease.expires_at)));
    }
    Ok(task)
}

fn activity_run_closed_refusal(run: &RunState) -> Refusal {
    let reason = match run.closed_reason {
        Some(ClosedReason::Cancelled) => Reason::RunCancelled,
        Some(ClosedReason::Terminated) => Reason::RunTerminated,
        _ => Reason::RunClosed,
    };
    Refusal::new(reason, "The workflow run is closed; the activity outcome is ignored.")
        .with("outcome", "ignored")
        .with("cancel_requested", true)
        .with("can_continue", false)
        .with("run_status", run.status.as_str())
}

fn activity_receipt(
    run: &mut RunState,
    cx: &Cx,
    task: &Task,
    owner: &str,
    attempt_id: &ActivityAttemptId,
    report: ReportKind,
    receipt: Receipt,
) {
    run.remember_receipt(
        cx,
        ClosedTaskReceipt {
            task_id: task.id.clone(),
            owner: owner.to_string(),
            fence: task.fence,
            attempt_id: Some(attempt_id.clone()),
            report,
            receipt,
        },
    );
}

/// Records an attempt's result: `ActivityCompleted`, the execution closes, the workflow wakes.
pub fn complete_activity(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    attempt_id: &ActivityAttemptId,
    owner: &str,
    result: Payload,
) -> Result<Receipt, Refusal> {
    if let Some(receipt) = retained_receipt(run, task_id, owner, 0, Some(attempt_id), ReportKind::CompleteActivity) {
        return Ok(receipt);
    }
    let task = check_activity_lease(run, cx.now, task_id, attempt_id, owner)?.clone();
    let execution = execution_of(run, &task).expect("leased activity has an execution").clone();
    // A declared action's result is classified first: pending (poll again), in doubt (an
    // operator decides: the report is kept as evidence, nothing enters history), a failed
    // linked run, or conclusive.
    match classify_ledgered_result(cx, &execution, &result) {
        None | Some(ResultClass::Conclusive) => {}
        Some(ResultClass::Unknown(mut reason)) => {
            reason["result_hash"] = json!(crate::ledger::digest(&result.blob));
            if let Some(receipt) = ledger_outcome_unknown(run, cx, &task, &execution, reason) {
                activity_receipt(run, cx, &task, owner, attempt_id, ReportKind::CompleteActivity, receipt.clone());
                return Ok(receipt);
            }
        }
        Some(ResultClass::Pending { interval_seconds }) => {
            let receipt = ledger_poll_again(run, cx, &task, &execution, interval_seconds, &result);
            activity_receipt(run, cx, &task, owner, attempt_id, ReportKind::CompleteActivity, receipt.clone());
            return Ok(receipt);
        }
        Some(ResultClass::LinkedRunFailed) => {
            if let Some(mut entry) = execution.ledger_key.as_ref().and_then(|key| run.ledger.get(key)).cloned() {
                entry.state = LedgerState::Verified;
                checkpoint(
                    run,
                    cx,
                    entry,
                    obj!("result_hash" => crate::ledger::digest(&result.blob), "descriptor_status" => "failed"),
                );
            }
            let failure = ActivityFailure {
                message: "linked_run_failed: the linked run reported failure.".into(),
                failure_type: Some("linked_run_failed".into()),
                non_retryable: true,
                ..Default::default()
            };
            let mut stored = execution.clone();
            stored.ledger_key = None;
            run.activities.insert(stored.id.clone(), stored.clone());
            let receipt = end_attempt(
                run,
                cx,
                &task,
                &stored,
                AttemptEnd::Failed {
                    failure,
                    non_retryable: true,
                },
            );
            activity_receipt(run, cx, &task, owner, attempt_id, ReportKind::CompleteActivity, receipt.clone());
            return Ok(receipt);
        }
    }
    let mut payload = activity_identity(&execution);
    payload.insert("activity_attempt_id".into(), json!(attempt_id));
    payload.insert("attempt_number".into(), json!(execution.attempt_count));
    payload.insert("result".into(), json!(result.blob));
    payload.insert("payload_codec".into(), json!(result.codec));
    let result_hash = crate::ledger::digest(&result.blob);
    run.append(cx, EventType::ActivityCompleted, payload, None, None);
    // A declared action's conclusive result closes its ledger entry in the same transaction.
    if let Some(mut entry) = execution.ledger_key.as_ref().and_then(|key| run.ledger.get(key)).cloned() {
        entry.state = LedgerState::Verified;
        checkpoint(run, cx, entry, obj!("result_hash" => result_hash));
    }
    run.close_task(cx, task_id, TaskClosure::Completed);
    run.activities.remove(&execution.id);
    let next = run.want_workflow_task(cx, None);
    let receipt = Receipt {
        run_status: run.status,
        created_task_ids: vec![],
        next_task_id: next,
        retained: false,
    };
    activity_receipt(run, cx, &task, owner, attempt_id, ReportKind::CompleteActivity, receipt.clone());
    Ok(receipt)
}

/// How a ledgered attempt's result is to be taken (`None`: not a ledgered dispatch, or
/// nothing to check). A result that must be read but cannot be decoded is in doubt.
fn classify_ledgered_result(cx: &Cx, execution: &ActivityExecution, result: &Payload) -> Option<ResultClass> {
    execution.ledger_key.as_ref()?;
    let pin = execution.action.as_ref()?;
    if pin.verification.is_none() && pin.pending.is_none() && pin.recovery_mode != RecoveryMode::LinkedRun {
        return None;
    }
    let decoded = match cx.memo.map(|codec| codec.to_json(result)) {
        Some(Ok(decoded)) => decoded,
        Some(Err(error)) => {
            return Some(ResultClass::Unknown(
                json!({"kind": "invalid_result", "problems": [format!("the result could not be decoded: {error}")]}),
            ))
        }
        None => {
            return Some(ResultClass::Unknown(
                json!({"kind": "invalid_result", "problems": ["the result could not be decoded here"]}),
            ))
        }
    };
    Some(crate::ledger::classify_result(pin, &decoded))
}

/// A pending provider result: the entry becomes a visible `pending` handoff and the next poll
/// is a new attempt after the interval (its dispatch opens a new entry, same idempotency key).
fn ledger_poll_again(
    run: &mut RunState,
    cx: &mut Cx,
    task: &Task,
    execution: &ActivityExecution,
    interval_seconds: i64,
    result: &Payload,
) -> Receipt {
    if let Some(mut entry) = execution.ledger_key.as_ref().and_then(|key| run.ledger.get(key)).cloned() {
        entry.state = LedgerState::Pending;
        checkpoint(
            run,
            cx,
            entry,
            obj!("result_hash" => crate::ledger::digest(&result.blob), "poll_after_seconds" => interval_seconds),
        );
    }
    run.close_task(cx, &task.id, TaskClosure::Completed);
    let poll_at = cx.now + interval_seconds * 1000;
    let poll_task = run.new_task(
        cx,
        TaskKind::Activity,
        &execution.queue,
        TaskDetail::Activity {
            execution_id: execution.id.clone(),
            activity_type: execution.activity_type.clone(),
            attempt_number: execution.attempt_count + 1,
            attempt_id: None,
            last_heartbeat_at: None,
            started_at: None,
        },
    );
    run.task_mut(cx, &poll_task).expect("just created").available_at = poll_at;
    let stored = run.activities.get_mut(&execution.id).expect("open execution");
    stored.task_id = poll_task.clone();
    stored.ledger_key = None;
    let attempt_id = match &task.detail {
        TaskDetail::Activity { attempt_id, .. } => attempt_id.clone(),
        _ => None,
    };
    let mut payload = activity_identity(execution);
    payload.extend(obj!(
        "activity_attempt_id" => attempt_id,
        "attempt_number" => execution.attempt_count,
        "retry_task_id" => poll_task,
        "retry_reason" => "ledger_pending",
        "retry_available_at" => iso8601(poll_at),
        "retry_backoff_seconds" => interval_seconds,
        "message" => "The provider reported a pending result; polling again.",
    ));
    run.append(cx, EventType::ActivityRetryScheduled, payload, None, None);
    Receipt {
        run_status: run.status,
        created_task_ids: vec![poll_task],
        next_task_id: None,
        retained: false,
    }
}

/// Records an attempt's failure: a retry (`ActivityRetryScheduled` + a new task after the backoff)
/// when the policy allows, else the final `ActivityFailed`.
pub fn fail_activity(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    attempt_id: &ActivityAttemptId,
    owner: &str,
    failure: ActivityFailure,
) -> Result<Receipt, Refusal> {
    if let Some(receipt) = retained_receipt(run, task_id, owner, 0, Some(attempt_id), ReportKind::FailActivity) {
        return Ok(receipt);
    }
    let task = check_activity_lease(run, cx.now, task_id, attempt_id, owner)?.clone();
    let execution = execution_of(run, &task).expect("leased activity has an execution").clone();
    let non_retryable = failure.non_retryable
        || failure
            .failure_type
            .as_ref()
            .is_some_and(|t| execution.retry_policy.non_retryable_error_types.contains(t));
    let outcome = end_attempt(run, cx, &task, &execution, AttemptEnd::Failed { failure, non_retryable });
    activity_receipt(run, cx, &task, owner, attempt_id, ReportKind::FailActivity, outcome.clone());
    Ok(outcome)
}

enum AttemptEnd {
    Failed { failure: ActivityFailure, non_retryable: bool },
    TimedOut { timeout_kind: &'static str },
}

/// Ends the current attempt of `execution` (failed or timed out): retry or final failure.
fn end_attempt(run: &mut RunState, cx: &mut Cx, task: &Task, execution: &ActivityExecution, end: AttemptEnd) -> Receipt {
    let reason = match &end {
        AttemptEnd::Failed { failure, .. } => {
            json!({"kind": "worker_failure", "message": failure.message, "exception_type": failure.failure_type})
        }
        AttemptEnd::TimedOut { timeout_kind } => json!({"kind": "timeout", "timeout_kind": timeout_kind}),
    };
    if let Some(receipt) = ledger_outcome_unknown(run, cx, task, execution, reason) {
        return receipt;
    }
    let now = cx.now;
    let attempt_number = execution.attempt_count;
    let backoff_ms = execution.retry_policy.backoff_after(attempt_number) * 1000;
    let retry_at = now + backoff_ms;
    let (retryable, closure) = match &end {
        AttemptEnd::Failed { non_retryable, .. } => (!non_retryable, TaskClosure::Failed),
        AttemptEnd::TimedOut { timeout_kind } => (*timeout_kind != "schedule_to_close", TaskClosure::TimedOut),
    };
    let within_deadline = execution.schedule_to_close_deadline.is_none_or(|deadline| retry_at < deadline);
    let will_retry = retryable && within_deadline && execution.retry_policy.allows_attempt(attempt_number + 1);
    run.close_task(cx, &task.id, closure);
    let attempt_id = match &task.detail {
        TaskDetail::Activity { attempt_id, .. } => attempt_id.clone(),
        _ => None,
    };
    let mut payload = activity_identity(execution);
    payload.insert("activity_attempt_id".into(), json!(attempt_id));
    payload.insert("attempt_number".into(), json!(attempt_number));
    if let Some(details) = &execution.last_heartbeat_details {
        payload.insert("last_heartbeat_details".into(), details.clone());
    }
    match &end {
        AttemptEnd::Failed { failure, .. } => {
            payload.insert("exception_type".into(), json!(failure.failure_type));
            payload.insert(
                "exception_class".into(),
                json!(failure.class.clone().or_else(|| failure.failure_type.clone())),
            );
            payload.insert("message".into(), json!(failure.message));
            payload.insert("code".into(), json!(failure.code));
            payload.insert(
                "exception".into(),
                json!({
                    "class": failure.class.clone().or_else(|| failure.failure_type.clone()),
                    "type": failure.failure_type,
                    "message": failure.message,
                    "code": failure.code,
                    "trace": failure.stack_trace,
                    "details": failure.details.as_ref().map(payload_json),
                }),
            );
        }
        AttemptEnd::TimedOut { timeout_kind } => {
            payload.insert("timeout_kind".into(), json!(timeout_kind));
            payload.insert("message".into(), json!(format!("Activity attempt timed out ({timeout_kind}).")));
        }
    }
    if will_retry {
        let retry_task = run.new_task(
            cx,
            TaskKind::Activity,
            &execution.queue,
            TaskDetail::Activity {
                execution_id: execution.id.clone(),
                activity_type: execution.activity_type.clone(),
                attempt_number: attempt_number + 1,
                attempt_id: None,
                last_heartbeat_at: None,
                started_at: None,
            },
        );
        run.task_mut(cx, &retry_task).expect("just created").available_at = retry_at;
        let stored = run.activities.get_mut(&execution.id).expect("open execution");
        stored.task_id = retry_task.clone();
        let stored = stored.clone();
        set_ready_activity_deadline(run, cx, &retry_task, &stored);
        payload.insert("retry_task_id".into(), json!(retry_task));
        payload.insert("retry_of_task_id".into(), json!(task.id));
        payload.insert("retry_available_at".into(), json!(iso8601(retry_at)));
        payload.insert("retry_backoff_seconds".into(), json!(backoff_ms / 1000));
        payload.insert("retry_after_attempt_id".into(), json!(attempt_id));
        payload.insert("retry_after_attempt".into(), json!(attempt_number));
        payload.insert(
            "retry_reason".into(),
            json!(if matches!(end, AttemptEnd::TimedOut { .. }) {
                "timeout"
            } else {
                "failure"
            }),
        );
        payload.insert("max_attempts".into(), json!(execution.retry_policy.max_attempts));
        payload.insert("retry_policy".into(), execution.retry_policy.to_json());
        run.append(cx, EventType::ActivityRetryScheduled, payload, None, None);
        return Receipt {
            run_status: run.status,
            created_task_ids: vec![retry_task],
            next_task_id: None,
            retained: false,
        };
    }
    let failure_id: String = cx.ids.next_id();
    payload.insert("failure_id".into(), json!(failure_id));
    let event_type = match end {
        AttemptEnd::Failed { non_retryable, .. } => {
            payload.insert("failure_category".into(), json!("activity"));
            payload.insert(
                "non_retryable".into(),
                json!(non_retryable || !retryable || !execution.retry_policy.allows_attempt(attempt_number + 1)),
            );
            EventType::ActivityFailed
        }
        AttemptEnd::TimedOut { .. } => {
            // `timeout_kind` is already in the payload (set with the attempt's failure fields).
            payload.insert("failure_category".into(), json!("timeout"));
            payload.insert("exception_class".into(), json!("ActivityTimedOut"));
            payload.insert(
                "schedule_to_close_deadline_at".into(),
                json!(execution.schedule_to_close_deadline.map(iso8601)),
            );
            EventType::ActivityTimedOut
        }
    };
    run.append(cx, event_type, payload, None, None);
    run.activities.remove(&execution.id);
    let next = run.want_workflow_task(cx, None);
    Receipt {
        run_status: run.status,
        created_task_ids: vec![],
        next_task_id: next,
        retained: false,
    }
}

/// What an activity heartbeat tells the worker.
#[derive(Clone, Debug, PartialEq)]
pub struct ActivityHeartbeat {
    pub lease: Option<Lease>,
    pub cancel_requested: bool,
    pub can_continue: bool,
    pub reason: Option<&'static str>,
}

/// Extends an attempt's lease and heartbeat deadline. On a closed run it answers "stop" instead
/// of refusing, so the worker abandons the attempt.
pub fn heartbeat_activity(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    attempt_id: &ActivityAttemptId,
    owner: &str,
    lease_ms: i64,
    details: Option<Value>,
) -> Result<ActivityHeartbeat, Refusal> {
    if run.is_closed() && !run.tasks.contains_key(task_id) {
        let reason = match run.closed_reason {
            Some(ClosedReason::Cancelled) => "run_cancelled",
            Some(ClosedReason::Terminated) => "run_terminated",
            _ => "run_closed",
        };
        return Ok(ActivityHeartbeat {
            lease: None,
            cancel_requested: true,
            can_continue: false,
            reason: Some(reason),
        });
    }
    let task = check_activity_lease(run, cx.now, task_id, attempt_id, owner)?.clone();
    let execution = execution_of(run, &task).expect("leased activity has an execution").clone();
    let now = cx.now;
    let task = run.task_mut(cx, task_id).expect("checked");
    let TaskState::Leased(lease) = &mut task.state else {
        unreachable!("checked")
    };
    lease.expires_at = lease.expires_at.max(now + lease_ms);
    let lease = lease.clone();
    // The start-to-close budget does not move with heartbeats; the heartbeat deadline does.
    let started_at = match &task.detail {
        TaskDetail::Activity { started_at, .. } => *started_at,
        _ => None,
    };
    let start_to_close = execution
        .timeouts
        .start_to_close_seconds
        .map(|s| started_at.unwrap_or(now) + s * 1000);
    task.deadline_at = [
        Some(lease.expires_at),
        start_to_close,
        execution.timeouts.heartbeat_seconds.map(|s| now + s * 1000),
        execution.schedule_to_close_deadline,
    ]
    .into_iter()
    .flatten()
    .min();
    let attempt_number = match &mut task.detail {
        TaskDetail::Activity {
            last_heartbeat_at,
            attempt_number,
            ..
        } => {
            *last_heartbeat_at = Some(now);
            *attempt_number
        }
        _ => 0,
    };
    // New progress details are kept for the next attempt and recorded once in history.
    if let Some(details) = details.filter(|d| !d.is_null()) {
        if execution.last_heartbeat_details.as_ref() != Some(&details) {
            let mut payload = activity_identity(&execution);
            payload.insert("activity_attempt_id".into(), json!(attempt_id));
            payload.insert("attempt_number".into(), json!(attempt_number));
            payload.insert("heartbeat_at".into(), json!(iso8601(now)));
            payload.insert("lease_expires_at".into(), json!(iso8601(lease.expires_at)));
            payload.insert("progress".into(), details.clone());
            run.activities
                .get_mut(&execution.id)
                .expect("open execution")
                .last_heartbeat_details = Some(details);
            run.append(cx, EventType::ActivityHeartbeatRecorded, payload, None, None);
        }
    }
    Ok(ActivityHeartbeat {
        lease: Some(lease),
        cancel_requested: false,
        can_continue: true,
        reason: None,
    })
}

// ---------------------------------------------------------------------------------------------
// Time-driven transitions

/// Looks at a task whose `deadline_at` has passed: fires a timer, times a run out, returns an
/// expired workflow lease to ready, or ends a timed-out activity attempt. Returns whether
/// anything changed (a task whose deadline moved meanwhile is left alone).
pub fn on_deadline(run: &mut RunState, cx: &mut Cx, task_id: &TaskId) -> bool {
    let now = cx.now;
    let Some(task) = run.tasks.get(task_id).cloned() else {
        return false;
    };
    if task.deadline_at.is_none_or(|d| d > now) {
        return false;
    }
    match (&task.kind, &task.state) {
        (TaskKind::Timer, _) => {
            let TaskDetail::Timer { timer_id } = &task.detail else {
                return false;
            };
            fire_timer(run, cx, timer_id);
        }
        (TaskKind::RunDeadline, _) if task.detail == TaskDetail::CancellationDeadline => {
            run.close_task(cx, task_id, TaskClosure::Completed);
            if !run.is_closed() {
                close_run_from_outside(run, cx, RunStatus::Cancelled, ClosedReason::Cancelled);
                append_cooperative_cancelled(run, cx, None, "deadline_expired");
            }
        }
        (TaskKind::RunDeadline, _) => time_out_run(run, cx),
        (TaskKind::Workflow, TaskState::Leased(_)) => {
            // Lease lost: offer the same task again; the next lease gets a higher attempt.
            let task = run.task_mut(cx, task_id).expect("open");
            task.state = TaskState::Ready;
            task.available_at = now;
            task.deadline_at = None;
            run.record_deferred_signals(cx);
        }
        (TaskKind::Activity, state) => {
            let Some(execution) = execution_of(run, &task).cloned() else {
                return false;
            };
            let s2c_passed = execution.schedule_to_close_deadline.is_some_and(|d| d <= now);
            let timeout_kind = match state {
                _ if s2c_passed => "schedule_to_close",
                TaskState::Ready => "schedule_to_start",
                TaskState::Leased(_) => {
                    let TaskDetail::Activity {
                        last_heartbeat_at,
                        started_at,
                        ..
                    } = &task.detail
                    else {
                        return false;
                    };
                    // The earliest budget that ran out names the timeout; a bare lease expiry
                    // (no budget set) counts as start-to-close.
                    let started = started_at.unwrap_or(now);
                    let start_to_close_due = execution.timeouts.start_to_close_seconds.map(|s| started + s * 1000);
                    let heartbeat_due = execution
                        .timeouts
                        .heartbeat_seconds
                        .map(|s| last_heartbeat_at.unwrap_or(started) + s * 1000);
                    match (heartbeat_due.filter(|d| *d <= now), start_to_close_due.filter(|d| *d <= now)) {
                        (Some(heartbeat), Some(start_to_close)) if heartbeat < start_to_close => "heartbeat",
                        (Some(_), None) => "heartbeat",
                        _ => "start_to_close",
                    }
                }
            };
            if matches!(state, TaskState::Ready) && timeout_kind == "schedule_to_start" {
                // schedule_to_start ends the execution: no attempt ran, none can be retried.
                end_unstarted(run, cx, &task, &execution, timeout_kind);
            } else {
                end_attempt(run, cx, &task, &execution, AttemptEnd::TimedOut { timeout_kind });
            }
        }
        (TaskKind::Workflow, TaskState::Ready) => {
            let task = run.task_mut(cx, task_id).expect("open");
            task.deadline_at = None;
        }
        (TaskKind::Query, _) => return false, // query tasks live outside runs
    }
    true
}

fn end_unstarted(run: &mut RunState, cx: &mut Cx, task: &Task, execution: &ActivityExecution, timeout_kind: &'static str) {
    run.close_task(cx, &task.id, TaskClosure::TimedOut);
    let failure_id: String = cx.ids.next_id();
    let mut payload = activity_identity(execution);
    payload.insert("attempt_number".into(), json!(execution.attempt_count));
    payload.insert("failure_id".into(), json!(failure_id));
    payload.insert("failure_category".into(), json!("timeout"));
    payload.insert("timeout_kind".into(), json!(timeout_kind));
    payload.insert("exception_class".into(), json!("ActivityTimedOut"));
    payload.insert("message".into(), json!(format!("Activity timed out ({timeout_kind}).")));
    run.append(cx, EventType::ActivityTimedOut, payload, None, None);
    run.activities.remove(&execution.id);
    run.want_workflow_task(cx, None);
}

fn fire_timer(run: &mut RunState, cx: &mut Cx, timer_id: &TimerId) {
    let Some(timer) = run.timers.remove(timer_id) else { return };
    run.close_task(cx, &timer.task_id, TaskClosure::Completed);
    let signal_name = match &timer.purpose {
        TimerPurpose::SignalTimeout(wait_id) => {
            let index = run.signal_waits.iter().position(|w| &w.id == wait_id);
            index.map(|i| run.signal_waits.remove(i).signal_name)
        }
        _ => None,
    };
    let mut payload = timer_payload_for(&timer, signal_name.as_deref());
    if let TimerPurpose::ConditionTimeout(wait_id) = &timer.purpose {
        if let Some(index) = run.condition_waits.iter().position(|w| &w.id == wait_id) {
            let wait = run.condition_waits.remove(index);
            payload.insert("condition_key".into(), json!(wait.condition_key));
            payload.insert("condition_definition_fingerprint".into(), json!(wait.fingerprint));
        }
    }
    payload.insert("fired_at".into(), json!(iso8601(cx.now)));
    run.append(cx, EventType::TimerFired, payload, None, None);
    run.want_workflow_task(cx, None);
}

fn time_out_run(run: &mut RunState, cx: &mut Cx) {
    if run.is_closed() {
        return;
    }
    let now = cx.now;
    let timeout_kind = match (run.execution_deadline_at, run.run_deadline_at) {
        (Some(e), _) if e <= now => "execution_timeout",
        _ => "run_timeout",
    };
    let failure_id: String = cx.ids.next_id();
    let message = format!("Workflow {} timed out ({timeout_kind}).", run.workflow_id);
    let payload = obj!(
        "failure_id" => failure_id,
        "timeout_kind" => timeout_kind,
        "failure_category" => "timeout",
        "message" => message,
        "exception_class" => "WorkflowTimedOut",
        "execution_deadline_at" => run.execution_deadline_at.map(iso8601),
        "run_deadline_at" => run.run_deadline_at.map(iso8601),
    );
    run.failure = Some(WorkflowFailure {
        message,
        exception_type: Some("WorkflowTimedOut".into()),
        exception_class: Some("WorkflowTimedOut".into()),
        exception: None,
        non_retryable: true,
    });
    close_run_from_outside(run, cx, RunStatus::Failed, ClosedReason::TimedOut);
    run.append(cx, EventType::WorkflowTimedOut, payload, None, None);
    retry_failed_child(run, cx);
}

/// DW's record of a child retry policy (`max_attempts` absent means one attempt).
fn child_retry_snapshot(policy: &RetryPolicy) -> Value {
    json!({
        "snapshot_version": 1,
        "max_attempts": policy.max_attempts.unwrap_or(1),
        "backoff_seconds": policy.backoff_seconds,
        "non_retryable_error_types": policy.non_retryable_error_types,
    })
}

/// A failed (or timed-out) child run whose parent gave a retry policy with attempts left, and
/// whose failure is retryable, is followed by the instance's next run in the same transaction:
/// same type, queue and input, the execution deadline carried, its first workflow task held back
/// by the policy's backoff. The parent's call stays open; it hears of the retry, not the failure.
fn retry_failed_child(run: &mut RunState, cx: &mut Cx) {
    let Some(parent) = run.parent.clone() else {
        return;
    };
    let Some(policy) = parent.retry_policy.clone() else {
        return;
    };
    if run.status != RunStatus::Failed || parent.attempt >= policy.max_attempts.unwrap_or(1) {
        return;
    }
    let failure = run.failure.clone().unwrap_or_default();
    let listed = |name: &Option<String>| name.as_ref().is_some_and(|n| policy.non_retryable_error_types.contains(n));
    if failure.non_retryable || listed(&failure.exception_type) || listed(&failure.exception_class) {
        return;
    }
    let index = (parent.attempt as usize - 1).min(policy.backoff_seconds.len().saturating_sub(1));
    let backoff_seconds = policy.backoff_seconds.get(index).copied().unwrap_or(0).max(0);
    let (mut next, mut next_effects) = {
        let mut next_cx = Cx::new(cx.now, &mut *cx.ids, cx.limits);
        let start = StartRun {
            namespace: run.namespace.clone(),
            workflow_id: run.workflow_id.clone(),
            run_id: next_cx.id(),
            workflow_type: run.workflow_type.clone(),
            task_queue: run.task_queue.clone(),
            input: run.input.clone(),
            execution_timeout_seconds: run.execution_timeout_seconds,
            run_timeout_seconds: run.run_timeout_seconds,
            business_key: run.business_key.clone(),
            memo: run.memo.clone(),
            search_attributes: run.search_attributes.clone(),
            command_id: next_cx.id(),
            contract: run.contract.clone(),
            compatibility: run.compatibility.clone(),
        };
        let mut next = blank_run(&next_cx, start, run.run_number + 1, run.execution_deadline_at);
        next.parent = Some(ParentLink {
            attempt: parent.attempt + 1,
            ..parent.clone()
        });
        next.retry_of_run_id = Some(run.run_id.clone());
        next.ledger_head = run.ledger_head.clone();
        next.memo_merged = run.memo_merged.clone();
        let mut next = begin_run(next, &mut next_cx);
        if let Some(task) = next.workflow_task.clone() {
            next.task_mut(&mut next_cx, &task).expect("just created").available_at = cx.now + backoff_seconds * 1000;
        }
        (next, next_cx.effects)
    };
    relink(&mut next, &mut next_effects, &run.last_hash);
    if let Some(notice) = cx.effects.parent_notice.as_mut() {
        notice.retry = Some(ChildRetry {
            run_id: next.run_id.clone(),
            run_number: next.run_number,
            attempt: parent.attempt + 1,
            backoff_seconds,
        });
    }
    cx.effects.successor = Some(Box::new((next, next_effects)));
}

// ---------------------------------------------------------------------------------------------
// Control-plane commands

/// The receipt of a control-plane command applied to a run.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandReceipt {
    pub command_id: CommandId,
    pub command_sequence: u32,
    pub signal_id: Option<SignalId>,
}

fn require_open(run: &RunState) -> Result<(), Refusal> {
    if run.is_closed() {
        return Err(Refusal::new(Reason::RunNotActive, "The workflow run is not active.")
            .with("run_status", run.status.as_str())
            .with("closed_reason", run.closed_reason.map(|r| r.as_str())));
    }
    Ok(())
}

/// The contract that admits signals and updates to a run: the one recorded when it started,
/// else the one `registered` for its workflow type now (runs started before any worker
/// registered, children, and runs continued as another type).
pub fn admission_contract<'a>(run: &'a RunState, registered: Option<&'a CommandContract>) -> Option<&'a CommandContract> {
    run.contract.as_ref().or(registered)
}

/// Refuses a signal the run's workflow type does not declare (404 `unknown_signal`).
pub fn admit_signal(run: &RunState, signal_name: &str, registered: Option<&CommandContract>) -> Result<(), Refusal> {
    require_open(run)?;
    match admission_contract(run, registered) {
        Some(contract) if !contract.admits_signal(signal_name) => Err(Refusal::new(
            Reason::UnknownSignal,
            format!(
                "Workflow type {:?} does not declare a signal named {signal_name:?}.",
                run.workflow_type
            ),
        )
        .with("signal_name", signal_name)
        .with("declared_signals", contract.signals.clone())),
        _ => Ok(()),
    }
}

/// Refuses an update the run's workflow type does not declare (409 `update_rejected`), before
/// anything is recorded.
pub fn admit_update(run: &RunState, update_name: &str, registered: Option<&CommandContract>) -> Result<(), Refusal> {
    require_open(run)?;
    match admission_contract(run, registered) {
        Some(contract) if !contract.admits_update(update_name) => Err(Refusal::new(
            Reason::UpdateRejected,
            format!(
                "Workflow type {:?} does not declare an update named {update_name:?}.",
                run.workflow_type
            ),
        )
        .with("update_name", update_name)
        .with("update_status", "rejected")
        .with("declared_updates", contract.updates.clone())),
        _ => Ok(()),
    }
}

/// `SignalReceived`, and a workflow task that carries the signal as its resume context.
pub fn signal(
    run: &mut RunState,
    cx: &mut Cx,
    signal_name: &str,
    arguments: Payload,
    command_id: CommandId,
) -> Result<CommandReceipt, Refusal> {
    require_open(run)?;
    let signal_id: SignalId = cx.id();
    run.command_count += 1;
    let payload = obj!(
        "workflow_command_id" => command_id,
        "signal_id" => signal_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "signal_name" => signal_name,
        "arguments" => payload_json(&arguments),
        "payload_codec" => arguments.codec,
    );
    if run.workflow_task_leased() {
        run.deferred_signals.push(DeferredSignal {
            payload,
            command_id: command_id.clone(),
        });
    } else {
        run.append(cx, EventType::SignalReceived, payload, None, Some(&command_id));
    }
    let resume = ResumeContext::Signal {
        signal_id: signal_id.clone(),
        signal_name: signal_name.to_string(),
        arguments,
        command_id: command_id.clone(),
    };
    run.want_workflow_task(cx, Some(resume));
    Ok(CommandReceipt {
        command_id,
        command_sequence: run.command_count,
        signal_id: Some(signal_id),
    })
}

/// `UpdateAccepted`, and a dedicated workflow task that runs the update's handler.
pub fn accept_update(
    run: &mut RunState,
    cx: &mut Cx,
    update_name: &str,
    arguments: Payload,
    command_id: CommandId,
) -> Result<(String, CommandReceipt), Refusal> {
    require_open(run)?;
    let update_id: String = cx.ids.next_id();
    run.command_count += 1;
    let payload = obj!(
        "workflow_command_id" => command_id,
        "update_id" => update_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "update_name" => update_name,
        "arguments" => payload_json(&arguments),
        "payload_codec" => arguments.codec,
    );
    run.append(cx, EventType::UpdateAccepted, payload, None, Some(&command_id));
    run.updates.insert(
        update_id.clone(),
        UpdateRecord {
            update_name: update_name.to_string(),
            arguments,
            command_id: command_id.clone(),
            status: UpdateStatus::Accepted,
            result: None,
            failure: None,
            accepted_at: cx.now,
            closed_at: None,
            validation_errors: None,
        },
    );
    let resume = ResumeContext::Update {
        update_id: update_id.clone(),
        update_name: update_name.to_string(),
        command_id: command_id.clone(),
    };
    run.want_update_task(cx, resume);
    Ok((
        update_id,
        CommandReceipt {
            command_id,
            command_sequence: run.command_count,
            signal_id: None,
        },
    ))
}

/// The internal task queue of atomic actions: only the server's atomic executor claims it.
pub const ATOMIC_QUEUE: &str = "__capstan_atomic";

/// Why a validator refused an update.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct UpdateRejection {
    pub message: String,
    pub failure_type: Option<String>,
    pub validation_errors: Option<Value>,
}

/// `UpdateRejected`: the update's validator refused it before acceptance. Nothing runs and no
/// workflow task is made; the record keeps the verdict so a retried request gets it again.
pub fn reject_update(
    run: &mut RunState,
    cx: &mut Cx,
    update_name: &str,
    arguments: Payload,
    rejection: UpdateRejection,
    command_id: CommandId,
) -> Result<(String, CommandReceipt), Refusal> {
    require_open(run)?;
    let update_id: String = cx.ids.next_id();
    run.command_count += 1;
    let payload = obj!(
        "workflow_command_id" => command_id,
        "update_id" => update_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "update_name" => update_name,
        "arguments" => payload_json(&arguments),
        "payload_codec" => arguments.codec,
        "rejection_reason" => "update_validator_rejected",
        "message" => rejection.message,
        "failure_type" => rejection.failure_type,
        "validation_errors" => rejection.validation_errors,
    );
    run.append(cx, EventType::UpdateRejected, payload, None, Some(&command_id));
    run.updates.insert(
        update_id.clone(),
        UpdateRecord {
            update_name: update_name.to_string(),
            arguments,
            command_id: command_id.clone(),
            status: UpdateStatus::Rejected,
            result: None,
            failure: Some(WorkflowFailure {
                message: rejection.message,
                exception_type: rejection.failure_type,
                ..Default::default()
            }),
            accepted_at: cx.now,
            closed_at: Some(cx.now),
            validation_errors: rejection.validation_errors,
        },
    );
    Ok((
        update_id,
        CommandReceipt {
            command_id,
            command_sequence: run.command_count,
            signal_id: None,
        },
    ))
}

/// A child instance ended: record its resolution on the parent step that started it and wake
/// the parent. A parent that closed meanwhile, or never heard of the child, takes no note.
pub fn resolve_child(run: &mut RunState, cx: &mut Cx, outcome: &ChildOutcome) -> Result<bool, Refusal> {
    if run.is_closed() {
        return Ok(false);
    }
    if let Some(retry) = &outcome.retry {
        // The call stays open on the child's next run; the parent is not woken.
        let Some(link) = run.children.get_mut(&outcome.parent.sequence) else {
            return Ok(false);
        };
        link.run_id = retry.run_id.clone();
        let link = link.clone();
        let mut payload = obj!(
            "sequence" => outcome.parent.sequence,
            "child_workflow_instance_id" => outcome.child_workflow_id,
            "child_workflow_run_id" => retry.run_id,
            "child_workflow_type" => link.workflow_type,
            "parent_close_policy" => link.parent_close_policy,
            "cancellation_policy" => link.cancellation_policy,
            "child_status" => "pending",
            "child_run_number" => retry.run_number,
            "retry_attempt" => retry.attempt,
            "retry_of_child_workflow_run_id" => outcome.child_run_id,
            "retry_backoff_seconds" => retry.backoff_seconds,
        );
        if let Some(policy) = &outcome.parent.retry_policy {
            payload.insert("retry_policy".into(), child_retry_snapshot(policy));
        }
        if !link.call_id.is_empty() {
            payload.insert("child_call_id".into(), json!(link.call_id));
            payload.insert("workflow_link_id".into(), json!(link.call_id));
        }
        extend(&mut payload, &link.tags);
        run.append(cx, EventType::ChildRunStarted, payload, None, None);
        return Ok(true);
    }
    let Some(link) = run.children.remove(&outcome.parent.sequence) else {
        return Ok(false);
    };
    let mut payload = obj!(
        "sequence" => outcome.parent.sequence,
        "child_workflow_instance_id" => outcome.child_workflow_id,
        "child_workflow_run_id" => outcome.child_run_id,
        "child_workflow_type" => link.workflow_type,
        "parent_close_policy" => link.parent_close_policy,
        "cancellation_policy" => link.cancellation_policy,
        "child_status" => outcome.status.as_str(),
        "closed_reason" => outcome.closed_reason.map(|r| r.as_str()),
        "closed_at" => iso8601(outcome.closed_at),
    );
    if !link.call_id.is_empty() {
        payload.insert("child_call_id".into(), json!(link.call_id));
        payload.insert("workflow_link_id".into(), json!(link.call_id));
    }
    extend(&mut payload, &link.tags);
    let failure = |payload: &mut Map<String, Value>, category: &str| {
        let failure = outcome.failure.clone().unwrap_or_default();
        payload.insert("failure_category".into(), json!(category));
        payload.insert("exception_type".into(), json!(failure.exception_type));
        payload.insert("exception_class".into(), json!(failure.exception_class.or(failure.exception_type)));
        payload.insert("message".into(), json!(failure.message));
        payload.insert("exception".into(), json!(failure.exception));
    };
    let event_type = match outcome.closed_reason {
        Some(ClosedReason::Completed) => {
            let output = outcome
                .output
                .clone()
                .unwrap_or_else(|| Payload::avro(crate::payload::AVRO_NULL_BLOB));
            payload.insert("output".into(), json!(output.blob));
            payload.insert("payload_codec".into(), json!(output.codec));
            EventType::ChildRunCompleted
        }
        Some(ClosedReason::Cancelled) => {
            failure(&mut payload, "cancelled");
            EventType::ChildRunCancelled
        }
        Some(ClosedReason::Terminated) => {
            failure(&mut payload, "terminated");
            EventType::ChildRunTerminated
        }
        _ => {
            failure(
                &mut payload,
                if outcome.closed_reason == Some(ClosedReason::TimedOut) {
                    "timeout"
                } else {
                    "application"
                },
            );
            EventType::ChildRunFailed
        }
    };
    run.append(cx, event_type, payload, None, None);
    run.want_workflow_task(cx, None);
    Ok(true)
}

fn integrity_refusal(run: &RunState) -> Result<(), Refusal> {
    match &run.integrity_incident {
        Some(incident) => Err(Refusal::new(
            Reason::IntegrityIncidentOpen,
            "The run's ledger chain failed verification: it is blocked until an operator closes the integrity incident.",
        )
        .with("incident_id", incident.clone())),
        None => Ok(()),
    }
}

/// The ledger chain the run extends failed verification: stop the run (its tasks are no longer
/// offered) until an operator has investigated.
pub fn block_for_integrity(run: &mut RunState, cx: &mut Cx, incident_id: &str) {
    run.integrity_incident = Some(incident_id.to_string());
    let ids: Vec<TaskId> = run.tasks.keys().cloned().collect();
    for id in ids {
        run.task_mut(cx, &id);
    }
}

/// The operator closed the incident (after the chain verified again): the run's tasks are
/// offered again.
pub fn clear_integrity_block(run: &mut RunState, cx: &mut Cx) {
    run.integrity_incident = None;
    let ids: Vec<TaskId> = run.tasks.keys().cloned().collect();
    for id in ids {
        run.task_mut(cx, &id);
    }
}

/// An operator's decision on an entry whose outcome was unknown.
#[derive(Clone, Debug, PartialEq)]
pub enum LedgerDecision {
    /// The effect happened: the activity completes with `result` (an Avro null without one),
    /// and the provider is not invoked again.
    EffectConfirmed { result: Payload },
    /// It did not: one deliberate new attempt, under a new ledger entry with the same
    /// idempotency key (the worker sees the same `activity_execution_id`).
    EffectAbsent,
}

/// Records the resolution of an `outcome_unknown` entry with its evidence and principal. On an
/// open run the blocked step continues (completed, or retried once); on a closed run only the
/// evidence is recorded.
pub fn resolve_ledger_entry(
    run: &mut RunState,
    cx: &mut Cx,
    ledger_key: &str,
    decision: LedgerDecision,
    evidence: Value,
    principal: &str,
) -> Result<LedgerEntry, Refusal> {
    integrity_refusal(run)?;
    let Some(entry) = run.ledger.get(ledger_key).cloned() else {
        return Err(Refusal::new(Reason::LedgerEntryNotFound, "No such ledger entry on this run.").with("ledger_key", ledger_key));
    };
    let (entry, decision_name) = settle(entry, &decision, evidence, principal, cx.now)?;
    let execution = run
        .activities
        .values()
        .find(|a| a.blocked_by.as_deref() == Some(ledger_key))
        .cloned()
        .filter(|_| !run.is_closed());
    let resolved = checkpoint_resolution(run, cx, entry.clone(), decision_name, principal);
    let Some(execution) = execution else {
        return Ok(resolved);
    };
    let mut payload = activity_identity(&execution);
    payload.insert("activity_attempt_id".into(), json!(entry.activity_attempt_id));
    payload.insert("attempt_number".into(), json!(execution.attempt_count));
    payload.insert("ledger_key".into(), json!(ledger_key));
    match decision {
        LedgerDecision::EffectConfirmed { result } => {
            payload.insert("result".into(), json!(result.blob));
            payload.insert("payload_codec".into(), json!(result.codec));
            payload.insert("resolved_by".into(), json!("operator"));
            run.append(cx, EventType::ActivityCompleted, payload, None, None);
            run.activities.remove(&execution.id);
            run.want_workflow_task(cx, None);
        }
        LedgerDecision::EffectAbsent => {
            let retry_task = run.new_task(
                cx,
                TaskKind::Activity,
                &execution.queue,
                TaskDetail::Activity {
                    execution_id: execution.id.clone(),
                    activity_type: execution.activity_type.clone(),
                    attempt_number: execution.attempt_count + 1,
                    attempt_id: None,
                    last_heartbeat_at: None,
                    started_at: None,
                },
            );
            let stored = run.activities.get_mut(&execution.id).expect("open execution");
            stored.task_id = retry_task.clone();
            stored.blocked_by = None;
            payload.extend(obj!(
                "retry_task_id" => retry_task,
                "retry_reason" => "ledger_effect_absent",
                "retry_after_attempt_id" => entry.activity_attempt_id,
                "retry_after_attempt" => execution.attempt_count,
                "retry_available_at" => iso8601(cx.now),
                "retry_backoff_seconds" => 0,
                "message" => "An operator recorded that the effect did not happen; one deliberate retry.",
            ));
            run.append(cx, EventType::ActivityRetryScheduled, payload, None, None);
        }
    }
    Ok(resolved)
}

/// The entry with the operator's decision recorded; refused unless its outcome is unknown.
fn settle(
    mut entry: LedgerEntry,
    decision: &LedgerDecision,
    evidence: Value,
    principal: &str,
    now: Millis,
) -> Result<(LedgerEntry, &'static str), Refusal> {
    if entry.state != LedgerState::OutcomeUnknown {
        return Err(Refusal::new(
            Reason::LedgerEntryNotUnknown,
            "Only an entry whose outcome is unknown can be resolved.",
        )
        .with("ledger_key", entry.ledger_key.as_str())
        .with("state", entry.state.as_str()));
    }
    let decision_name = match decision {
        LedgerDecision::EffectConfirmed { .. } => "effect_confirmed",
        LedgerDecision::EffectAbsent => "effect_absent",
    };
    entry.state = match decision {
        LedgerDecision::EffectConfirmed { .. } => LedgerState::EffectConfirmed,
        LedgerDecision::EffectAbsent => LedgerState::EffectAbsent,
    };
    entry.resolution = Some(json!({"decision": decision_name, "evidence": evidence, "principal": principal, "resolved_at": iso8601(now)}));
    Ok((entry, decision_name))
}

fn checkpoint_resolution(run: &mut RunState, cx: &mut Cx, entry: LedgerEntry, decision_name: &str, principal: &str) -> LedgerEntry {
    let evidence = entry
        .resolution
        .as_ref()
        .map(|r| crate::canonical::to_string(&r["evidence"]))
        .unwrap_or_default();
    let evidence_hash = crate::ledger::digest(&evidence);
    checkpoint(
        run,
        cx,
        entry,
        obj!("decision" => decision_name, "principal" => principal, "evidence_hash" => evidence_hash),
    )
}

/// Resolves an entry left `outcome_unknown` by an earlier, closed run of this instance (`run`
/// is the instance's current run). The instance's checkpoint chain is only ever extended through
/// its current run, so it stays one line; the earlier run cannot continue, so the decision is
/// recorded and nothing runs. `stored` is the entry as the store holds it.
pub fn resolve_earlier_run_entry(
    run: &mut RunState,
    cx: &mut Cx,
    stored: LedgerEntry,
    decision: LedgerDecision,
    evidence: Value,
    principal: &str,
) -> Result<LedgerEntry, Refusal> {
    integrity_refusal(run)?;
    if stored.workflow_id != run.workflow_id || stored.run_id == run.run_id {
        return Err(Refusal::new(
            Reason::LedgerEntryNotFound,
            "The entry does not belong to an earlier run of this instance.",
        )
        .with("ledger_key", stored.ledger_key.as_str()));
    }
    let (entry, decision_name) = settle(stored, &decision, evidence, principal, cx.now)?;
    Ok(checkpoint_resolution(run, cx, entry, decision_name, principal))
}

/// A report from an attempt whose dispatch is already `outcome_unknown` (it lost its lease,
/// timed out…): the workflow refused it, but it is what an operator needs to decide, so it is
/// attached to the entry. Returns whether such an entry exists.
pub fn attach_late_report(run: &mut RunState, cx: &mut Cx, attempt_id: &ActivityAttemptId, report: Value) -> Result<bool, Refusal> {
    let Some(mut entry) = run
        .ledger
        .values()
        .find(|e| &e.activity_attempt_id == attempt_id && e.state == LedgerState::OutcomeUnknown)
        .cloned()
    else {
        return Ok(false);
    };
    let mut report = report;
    report["received_at"] = json!(iso8601(cx.now));
    entry.late_reports.push(report.clone());
    checkpoint(run, cx, entry, obj!("late_report" => report));
    Ok(true)
}

/// A late report for an entry of an earlier, closed run of this instance (`run` is the current
/// run, the only one that extends the instance's chain). `stored` is the entry as last known.
pub fn attach_earlier_late_report(run: &mut RunState, cx: &mut Cx, stored: LedgerEntry, report: Value) -> Result<bool, Refusal> {
    if stored.workflow_id != run.workflow_id || stored.run_id == run.run_id || stored.state != LedgerState::OutcomeUnknown {
        return Ok(false);
    }
    let mut entry = stored;
    let mut report = report;
    report["received_at"] = json!(iso8601(cx.now));
    entry.late_reports.push(report.clone());
    checkpoint(run, cx, entry, obj!("late_report" => report));
    Ok(true)
}

/// The entry blocking this run, if any: it refuses every operation that would re-run a step.
pub fn unresolved_ledger_entry(run: &RunState) -> Option<&LedgerEntry> {
    run.ledger.values().find(|e| e.state == LedgerState::OutcomeUnknown)
}

/// What a repair did.
#[derive(Clone, Debug, PartialEq)]
pub struct RepairOutcome {
    pub dispatched: bool,
    pub task_id: Option<TaskId>,
    pub command: CommandReceipt,
}

/// Operator repair of a stuck run: a workflow task waiting out a backoff or an expired lease is
/// offered now; a run with no workflow task and nothing in flight gets one. Never writes a
/// second fact: an activity, timer or wait that will resolve the run is left alone.
pub fn repair(run: &mut RunState, cx: &mut Cx, command_id: CommandId) -> Result<RepairOutcome, Refusal> {
    if let Some(entry) = unresolved_ledger_entry(run) {
        return Err(Refusal::new(
            Reason::OutcomeUnknownRequiresResolution,
            "A declared action's outcome is unknown: an operator must resolve it before the step can run again.",
        )
        .with("ledger_key", entry.ledger_key.clone())
        .with("activity_type", entry.activity_type.clone()));
    }
    require_open(run)?;
    let now = cx.now;
    let mut task_id = None;
    let dispatched = match run.workflow_task.clone() {
        Some(id) => {
            let task = run.tasks.get(&id).expect("open");
            let stuck = match &task.state {
                TaskState::Ready => task.available_at > now,
                TaskState::Leased(lease) => lease.expires_at <= now,
            };
            if stuck {
                let task = run.task_mut(cx, &id).expect("open");
                task.state = TaskState::Ready;
                task.available_at = now;
                task.deadline_at = None;
            }
            task_id = Some(id);
            stuck
        }
        None => {
            let idle = run.activities.is_empty() && run.timers.is_empty() && run.condition_waits.is_empty() && run.signal_waits.is_empty();
            if idle {
                task_id = run.want_workflow_task(cx, None);
            }
            idle
        }
    };
    run.command_count += 1;
    let payload = obj!(
        "workflow_command_id" => command_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "command_type" => "repair",
        "outcome" => if dispatched { "repair_dispatched" } else { "repair_not_needed" },
        "wait_kind" => run.wait_kind(),
        "task_id" => task_id,
        "task_type" => task_id.as_ref().map(|_| "workflow"),
    );
    run.append(cx, EventType::RepairRequested, payload, None, Some(&command_id));
    Ok(RepairOutcome {
        dispatched,
        task_id,
        command: CommandReceipt {
            command_id,
            command_sequence: run.command_count,
            signal_id: None,
        },
    })
}

/// Archives a closed run (`ArchiveRequested` + `WorkflowArchived`, after its terminal event). An
/// open run cannot be archived; an archived one needs nothing (returns `false`).
pub fn archive(run: &mut RunState, cx: &mut Cx, reason: Option<String>, command_id: CommandId) -> Result<(bool, CommandReceipt), Refusal> {
    if !run.is_closed() {
        return Err(Refusal::new(Reason::RunNotClosed, "Only a closed run can be archived.").with("run_status", run.status.as_str()));
    }
    if run.archived {
        return Ok((
            false,
            CommandReceipt {
                command_id,
                command_sequence: run.command_count,
                signal_id: None,
            },
        ));
    }
    run.command_count += 1;
    let identity = obj!(
        "workflow_command_id" => command_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "reason" => reason,
    );
    let mut requested = identity.clone();
    requested.insert("command_type".into(), json!("archive"));
    requested.insert("outcome".into(), json!("archived"));
    run.append(cx, EventType::ArchiveRequested, requested, None, Some(&command_id));
    let mut archived = identity;
    archived.insert("archive_command_id".into(), json!(command_id));
    archived.insert("outcome".into(), json!("archived"));
    run.append(cx, EventType::WorkflowArchived, archived, None, Some(&command_id));
    run.archived = true;
    Ok((
        true,
        CommandReceipt {
            command_id,
            command_sequence: run.command_count,
            signal_id: None,
        },
    ))
}

// ---------------------------------------------------------------------------------------------
// Cooperative cancellation

/// What a `request-cancellation` call found or made.
#[derive(Clone, Debug, PartialEq)]
pub struct CancellationOutcome {
    /// The run already had a request: it is returned unchanged.
    pub duplicate: bool,
    pub request: CancellationRequest,
}

/// Records a cooperative cancellation request (`CooperativeCancellationRequested`): the run stays
/// open, its next workflow task carries the request, and the workflow gets until
/// `cleanup_deadline_at` to finish. One request per run; a repeat returns the first, even after
/// the run closed.
pub fn request_cancellation(
    run: &mut RunState,
    cx: &mut Cx,
    reason: Option<String>,
    cleanup_timeout_seconds: i64,
    command_id: CommandId,
) -> Result<CancellationOutcome, Refusal> {
    if let Some(request) = &run.cancellation {
        return Ok(CancellationOutcome {
            duplicate: true,
            request: request.clone(),
        });
    }
    require_open(run)?;
    run.command_count += 1;
    let deadline = cx.now + cleanup_timeout_seconds * 1000;
    let payload = obj!(
        "workflow_command_id" => command_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "command_type" => "request_cancellation",
        "reason" => reason,
        "cleanup_deadline_at" => iso8601(deadline),
    );
    run.append(cx, EventType::CooperativeCancellationRequested, payload, None, Some(&command_id));
    let request = CancellationRequest {
        request_id: command_id,
        reason,
        requested_at: cx.now,
        cleanup_deadline_at: deadline,
        resolved_after_request: Default::default(),
        delivery: None,
    };
    run.cancellation = Some(request.clone());
    let deadline_task = run.new_task(cx, TaskKind::RunDeadline, "", TaskDetail::CancellationDeadline);
    run.task_mut(cx, &deadline_task).expect("just created").deadline_at = Some(deadline);
    // A worker holding the lease learns of the request from its heartbeat and reloads history:
    // it must see the request event.
    extend_leased_history(run, cx);
    run.want_workflow_task(cx, None);
    Ok(CancellationOutcome { duplicate: false, request })
}

/// The authored call a worker delivers the cancellation to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeliveryRequest {
    pub request_id: String,
    pub sequence: u32,
    pub call_kind: String,
    pub sequence_span: u32,
    pub operation_sequence: Option<u32>,
    pub operation_sequence_span: u32,
}

const CALL_KINDS: &[&str] = &[
    "activity",
    "local_activity",
    "timer",
    "condition",
    "signal",
    "child",
    "parallel",
    "selection_handle",
];

fn call_kind_fits(kind: &str, step: &StepKind) -> bool {
    match kind {
        "activity" | "local_activity" => matches!(step, StepKind::Activity(_)),
        "timer" => matches!(step, StepKind::Timer),
        "condition" => matches!(step, StepKind::ConditionWait),
        "signal" => matches!(step, StepKind::SignalWait(_)),
        "child" => matches!(step, StepKind::ChildWorkflow(_)),
        _ => true,
    }
}

fn step_is_open(run: &RunState, step: u32) -> bool {
    run.activities.values().any(|a| a.step == step)
        || run.timers.values().any(|t| t.step == step && t.purpose == TimerPurpose::User)
        || run.condition_waits.iter().any(|w| w.step == step)
        || run.signal_waits.iter().any(|w| w.step == step)
        || run.children.contains_key(&step)
}

fn cancellation_delivered(run: &RunState) -> bool {
    run.cancellation.as_ref().is_some_and(|r| r.delivery.is_some())
}

/// Commits the delivery of the run's cancellation request at one authored call, on the
/// worker's live lease (`CooperativeCancellationDelivered`). The interrupted call ends: a
/// pending timer is cancelled (`TimerCancelled`), a running activity too (`ActivityCancelled`),
/// an open wait is dropped; a child keeps running. The same delivery again is answered as
/// before; any other is refused.
pub fn deliver_cancellation(
    run: &mut RunState,
    cx: &mut Cx,
    task_id: &TaskId,
    owner: &str,
    attempt: u64,
    delivery: DeliveryRequest,
) -> Result<CancellationDelivery, Refusal> {
    check_workflow_lease(run, cx.now, task_id, owner, attempt)?;
    let refuse = |reason, message: &str| Refusal::new(reason, message).with("task_id", task_id.as_str());
    let Some(request) = run.cancellation.clone() else {
        return Err(refuse(Reason::CancellationRequestMismatch, "The run has no cancellation request."));
    };
    if request.request_id.as_str() != delivery.request_id {
        return Err(refuse(
            Reason::CancellationRequestMismatch,
            "The delivery names another cancellation request.",
        )
        .with("request_id", request.request_id.as_str()));
    }
    let shape_ok = CALL_KINDS.contains(&delivery.call_kind.as_str())
        && delivery.sequence >= 1
        && (1..=1000).contains(&delivery.sequence_span)
        && (delivery.call_kind == "parallel" || delivery.sequence_span == 1)
        && match delivery.operation_sequence {
            Some(operation) => {
                delivery.call_kind == "selection_handle"
                    && operation >= 1
                    && operation < delivery.sequence
                    && delivery.operation_sequence_span <= delivery.sequence - operation
            }
            None => delivery.call_kind != "selection_handle" && delivery.operation_sequence_span == 1,
        };
    if !shape_ok {
        return Err(refuse(
            Reason::InvalidCancellationDelivery,
            "The delivery does not describe one authored call.",
        ));
    }
    if let Some(done) = &request.delivery {
        let same = done.sequence == delivery.sequence
            && done.call_kind == delivery.call_kind
            && done.sequence_span == delivery.sequence_span
            && done.operation_sequence == delivery.operation_sequence
            && done.operation_sequence_span == delivery.operation_sequence_span;
        return if same {
            Ok(done.clone())
        } else {
            Err(refuse(
                Reason::CancellationDeliveryMismatch,
                "The cancellation was delivered at another call.",
            )
            .with("sequence", done.sequence))
        };
    }
    if cx.now >= request.cleanup_deadline_at {
        return Err(refuse(Reason::RunCancelled, "The cancellation cleanup deadline has passed."));
    }
    let (base, span) = match delivery.operation_sequence {
        Some(operation) => (operation, delivery.operation_sequence_span),
        None => (delivery.sequence, delivery.sequence_span),
    };
    if delivery.sequence > run.next_step {
        return Err(refuse(
            Reason::CancellationDeliverySequenceMismatch,
            "The delivery names a call after the next one the workflow can make.",
        )
        .with("next_sequence", run.next_step));
    }
    if !matches!(delivery.call_kind.as_str(), "parallel" | "selection_handle") {
        if let Some(step) = run.steps.get(&delivery.sequence) {
            if !call_kind_fits(&delivery.call_kind, step) {
                return Err(refuse(
                    Reason::CancellationDeliveryShapeMismatch,
                    "The recorded call at that sequence is of another kind.",
                ));
            }
        }
    }
    let resolved_before = |step: u32| step < run.next_step && !step_is_open(run, step) && !request.resolved_after_request.contains(&step);
    if (base..base + span).all(resolved_before) {
        return Err(refuse(
            Reason::CancellationDeliveryNotEligible,
            "That call settled before the cancellation was requested.",
        ));
    }
    for step in base..base + span {
        interrupt_step(run, cx, step);
    }
    let done = CancellationDelivery {
        sequence: delivery.sequence,
        call_kind: delivery.call_kind,
        sequence_span: delivery.sequence_span,
        operation_sequence: delivery.operation_sequence,
        operation_sequence_span: delivery.operation_sequence_span,
        delivered_at: cx.now,
    };
    let mut payload = obj!(
        "workflow_command_id" => request.request_id,
        "workflow_run_id" => run.run_id,
        "sequence" => done.sequence,
        "call_kind" => done.call_kind,
    );
    if done.sequence_span != 1 {
        payload.insert("sequence_span".into(), json!(done.sequence_span));
    }
    if let Some(operation) = done.operation_sequence {
        payload.insert("operation_sequence".into(), json!(operation));
        payload.insert("operation_sequence_span".into(), json!(done.operation_sequence_span));
    }
    run.append(
        cx,
        EventType::CooperativeCancellationDelivered,
        payload,
        Some(task_id),
        Some(&request.request_id),
    );
    run.cancellation.as_mut().expect("checked").delivery = Some(done.clone());
    extend_leased_history(run, cx);
    Ok(done)
}

/// Ends what an interrupted step was waiting for.
fn interrupt_step(run: &mut RunState, cx: &mut Cx, step: u32) {
    let timers: Vec<TimerState> = run.timers.values().filter(|t| t.step == step).cloned().collect();
    for timer in timers {
        run.timers.remove(&timer.id);
        run.close_task(cx, &timer.task_id, TaskClosure::Cancelled);
        if timer.purpose == TimerPurpose::User {
            let payload =
                obj!("timer_id" => timer.id, "sequence" => step, "delay_seconds" => timer.delay_seconds, "cancelled_at" => iso8601(cx.now));
            run.append(cx, EventType::TimerCancelled, payload, None, None);
        }
    }
    let activities: Vec<ActivityExecution> = run.activities.values().filter(|a| a.step == step).cloned().collect();
    for activity in activities {
        run.activities.remove(&activity.id);
        run.close_task(cx, &activity.task_id, TaskClosure::Cancelled);
        let payload = obj!(
            "activity_execution_id" => activity.id,
            "sequence" => step,
            "activity_type" => activity.activity_type,
            "attempt_number" => activity.attempt_count,
            "message" => "Activity cancelled: cooperative cancellation delivered.",
            "exception_type" => "ActivityCancelled",
        );
        run.append(cx, EventType::ActivityCancelled, payload, None, None);
    }
    run.condition_waits.retain(|w| w.step != step);
    run.signal_waits.retain(|w| w.step != step);
}

/// The leased workflow task may read history up to now: cancellation events recorded during
/// its lease are what its worker reloads history to see.
fn extend_leased_history(run: &mut RunState, cx: &mut Cx) {
    let last = run.last_sequence;
    if let Some(id) = run.workflow_task.clone() {
        if run.tasks.get(&id).is_some_and(|t| !t.is_ready()) {
            if let Some(TaskDetail::Workflow { history_snapshot, .. }) = run.task_mut(cx, &id).map(|t| &mut t.detail) {
                *history_snapshot = last;
            }
        }
    }
}

/// The workflow finished its cleanup after the delivery: the run ends cancelled.
fn close_cancelled_cooperatively(run: &mut RunState, cx: &mut Cx, wt: Option<&TaskId>, outcome: &str) {
    close_run(run, cx, RunStatus::Cancelled, ClosedReason::Cancelled);
    append_cooperative_cancelled(run, cx, wt, outcome);
}

/// `WorkflowCancelled` of a cooperative cancellation: `completed` cleanup or `deadline_expired`.
fn append_cooperative_cancelled(run: &mut RunState, cx: &mut Cx, wt: Option<&TaskId>, outcome: &str) {
    let request = run.cancellation.clone().expect("a cooperative close has a request");
    let reason = if outcome == "completed" {
        "Cooperative cancellation completed."
    } else {
        "Cooperative cancellation cleanup deadline expired."
    };
    let message = format!("Workflow cancelled: {reason}");
    let failure_id: String = cx.ids.next_id();
    let payload = obj!(
        "workflow_command_id" => request.request_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "failure_id" => failure_id,
        "failure_category" => "cancelled",
        "closed_reason" => "cancelled",
        "exception_class" => "WorkflowCancelled",
        "outcome" => outcome,
        "reason" => reason,
        "message" => message,
        "cancellation_cleanup" => json!({
            "request_id": request.request_id,
            "outcome": outcome,
            "cleanup_deadline_at": iso8601(request.cleanup_deadline_at),
            "delivery_sequence": request.delivery.as_ref().map(|d| d.sequence),
            "finished_at": iso8601(cx.now),
        }),
    );
    run.failure = Some(WorkflowFailure {
        message,
        exception_type: Some("WorkflowCancelled".into()),
        exception_class: Some("WorkflowCancelled".into()),
        ..Default::default()
    });
    run.append(cx, EventType::WorkflowCancelled, payload, wt, Some(&request.request_id));
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseCommand {
    Cancel,
    Terminate,
}

/// Cancel and terminate close the run at once (DW v2 semantics): the request event, then the
/// terminal event; every open task, timer and activity of the run ends.
pub fn close_by_command(
    run: &mut RunState,
    cx: &mut Cx,
    kind: CloseCommand,
    reason: Option<String>,
    command_id: CommandId,
) -> Result<CommandReceipt, Refusal> {
    require_open(run)?;
    run.command_count += 1;
    let (request_type, terminal_type, status, closed, command_type, verb) = match kind {
        CloseCommand::Cancel => (
            EventType::CancelRequested,
            EventType::WorkflowCancelled,
            RunStatus::Cancelled,
            ClosedReason::Cancelled,
            "cancel",
            "cancelled",
        ),
        CloseCommand::Terminate => (
            EventType::TerminateRequested,
            EventType::WorkflowTerminated,
            RunStatus::Terminated,
            ClosedReason::Terminated,
            "terminate",
            "terminated",
        ),
    };
    let cmd = Some(&command_id);
    let request = obj!(
        "workflow_command_id" => command_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "command_type" => command_type,
        "reason" => reason,
    );
    run.append(cx, request_type, request, None, cmd);
    close_run_from_outside(run, cx, status, closed);
    let failure_id: String = cx.ids.next_id();
    let message = match &reason {
        Some(reason) => format!("Workflow {verb}: {reason}"),
        None => format!("Workflow {verb}."),
    };
    let terminal = obj!(
        "workflow_command_id" => command_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
        "failure_id" => failure_id,
        "failure_category" => verb,
        "closed_reason" => closed.as_str(),
        "exception_class" => if kind == CloseCommand::Cancel { "WorkflowCancelled" } else { "WorkflowTerminated" },
        "message" => message,
        "reason" => reason,
    );
    run.failure = Some(WorkflowFailure {
        message,
        ..Default::default()
    });
    run.append(cx, terminal_type, terminal, None, cmd);
    Ok(CommandReceipt {
        command_id,
        command_sequence: run.command_count,
        signal_id: None,
    })
}
