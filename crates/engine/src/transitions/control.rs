//! Control-plane commands: signal and update admission, cancel and terminate, repair, archive.

use crate::transitions::close::close_run_from_outside;
use crate::transitions::{events, UpdateRef};
use crate::{
    require_workflow_code, unresolved_ledger_entry, ClosedReason, CommandContract, EventType, Payload, Reason, Refusal, RunStatus,
};
use crate::{
    CloseCommand, CommandId, Cx, DeferredSignal, ResumeContext, RunState, SignalId, TaskId, TaskState, UpdateRecord, UpdateStatus,
    WorkflowFailure,
};
use serde_json::Value;

/// The receipt of a control-plane command applied to a run.
#[derive(Clone, Debug, PartialEq)]
pub struct CommandReceipt {
    pub command_id: CommandId,
    pub command_sequence: u32,
    pub signal_id: Option<SignalId>,
}

pub(super) fn require_open(run: &RunState) -> Result<(), Refusal> {
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
    require_workflow_code(run)?;
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
    let pending = run.pending_signal_count();
    if pending >= cx.limits.pending_signals_max {
        let limit = cx.limits.pending_signals_max;
        return Err(Refusal::new(
            Reason::StructuralLimitExceeded,
            format!("Structural limit exceeded: {pending} pending signals (limit {limit})."),
        )
        .with("limit_kind", "pending_signal_count")
        .with("current_value", pending)
        .with("configured_limit", limit));
    }
    let signal_id = record_signal(run, cx, signal_name, arguments, command_id.clone());
    Ok(CommandReceipt {
        command_id,
        command_sequence: run.command_count,
        signal_id: Some(signal_id),
    })
}

/// `SignalReceived` (deferred while a workflow task is leased) and a resume task carrying the
/// signal: how every signal reaches workflow code, a message-stream delivery included.
pub(super) fn record_signal(run: &mut RunState, cx: &mut Cx, signal_name: &str, arguments: Payload, command_id: CommandId) -> SignalId {
    let signal_id: SignalId = cx.id();
    run.command_count += 1;
    let mut payload = events::signal_received(run, &command_id, &signal_id, signal_name, &arguments);
    events::record_caller_trace(&mut payload, cx);
    if run.workflow_task_leased() {
        // Recorded later, under whoever ends the lease: the signaller is kept with it.
        payload.insert("principal".into(), crate::principal::recorded(cx.principal.as_ref()));
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
        command_id,
    };
    run.want_workflow_task(cx, Some(resume));
    signal_id
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
    require_workflow_code(run)?;
    let update_id: String = cx.ids.next_id();
    run.command_count += 1;
    let update = UpdateRef {
        command_id: &command_id,
        update_id: &update_id,
        update_name,
    };
    let mut payload = events::update_accepted(run, &update, &arguments);
    events::record_caller_trace(&mut payload, cx);
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
    let update = UpdateRef {
        command_id: &command_id,
        update_id: &update_id,
        update_name,
    };
    let payload = events::update_rejected(run, &update, &arguments, &rejection);
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
    let payload = events::repair_requested(run, &command_id, dispatched, task_id.as_ref());
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
    let requested = events::archive_requested(run, &command_id, reason.as_deref());
    run.append(cx, EventType::ArchiveRequested, requested, None, Some(&command_id));
    let archived = events::workflow_archived(run, &command_id, reason.as_deref());
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
    let cmd = Some(&command_id);
    let reason = reason.as_deref();
    let (request_type, mut request) = match kind {
        CloseCommand::Cancel => (EventType::CancelRequested, events::cancel_requested(run, &command_id, reason)),
        CloseCommand::Terminate => (EventType::TerminateRequested, events::terminate_requested(run, &command_id, reason)),
    };
    events::record_caller_trace(&mut request, cx);
    run.append(cx, request_type, request, None, cmd);
    let (status, closed, verb) = match kind {
        CloseCommand::Cancel => (RunStatus::Cancelled, ClosedReason::Cancelled, "cancelled"),
        CloseCommand::Terminate => (RunStatus::Terminated, ClosedReason::Terminated, "terminated"),
    };
    close_run_from_outside(run, cx, status, closed);
    let failure_id: String = cx.ids.next_id();
    let message = match reason {
        Some(reason) => format!("Workflow {verb}: {reason}"),
        None => format!("Workflow {verb}."),
    };
    let (terminal_type, terminal) = match kind {
        CloseCommand::Cancel => {
            let by = events::CancelledBy::Command {
                command_id: &command_id,
                reason,
            };
            (
                EventType::WorkflowCancelled,
                events::workflow_cancelled(run, &failure_id, by, &message),
            )
        }
        CloseCommand::Terminate => (
            EventType::WorkflowTerminated,
            events::workflow_terminated(run, &failure_id, &command_id, reason, &message),
        ),
    };
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
