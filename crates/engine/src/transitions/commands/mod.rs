//! A workflow task's commands: validated together, then applied one by one.

use crate::transitions::commands::children::start_child_workflow;
use crate::transitions::commands::closing::{complete_workflow, continue_as_new, fail_workflow};
use crate::transitions::commands::local_activity::record_local_activity;
use crate::transitions::commands::records::{record_side_effect, record_version_marker, upsert_memo, upsert_search_attributes};
use crate::transitions::commands::selection::cancel_selection_member;
use crate::transitions::commands::timers::start_timer;
use crate::transitions::commands::updates::{complete_update, fail_update};
use crate::transitions::commands::waits::{open_condition_wait, open_signal_wait, ConditionWaitSpec};
use crate::transitions::{cancellation_delivered, close_cancelled_cooperatively, invalid, NextRun};
use crate::{Cx, Refusal, RunState, StepKind, StepTags, TaskId, WorkflowCommand};
use serde_json::Value;

mod activities;
mod children;
mod closing;
mod local_activity;
mod records;
mod selection;
mod timers;
mod updates;
mod validate;
mod waits;

pub(in crate::transitions) use activities::schedule_activity;
pub(in crate::transitions) use validate::*;

/// Where a command applies: the step it took (0 for commands without one) and the workflow
/// task whose completion carries it.
#[derive(Clone, Copy)]
pub(in crate::transitions) struct At<'t> {
    pub step: u32,
    pub task: Option<&'t TaskId>,
}

/// Assigns the step sequence of a command, or `None` when it re-sends an already recorded
/// parallel-group member (a replay: no events, no step).
fn take_step(run: &mut RunState, command: &WorkflowCommand) -> Result<Option<u32>, Refusal> {
    let kind = command.step_kind().expect("only step commands take steps");
    let tags = command.tags().expect("step commands have tags");
    take_step_of(run, kind, tags)
}

/// [`take_step`] for a step of `kind` tagged `tags` (a prepared local call has no command).
pub(in crate::transitions) fn take_step_of(run: &mut RunState, kind: StepKind, tags: &StepTags) -> Result<Option<u32>, Refusal> {
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

/// Applies one command of a completion: takes its step, then hands it to its family.
pub(super) fn apply_command(run: &mut RunState, cx: &mut Cx, task_id: &TaskId, command: WorkflowCommand) -> Result<(), Refusal> {
    let step = if command.step_kind().is_some() {
        match take_step(run, &command)? {
            Some(step) => step,
            None => return Ok(()),
        }
    } else {
        0
    };
    let at = At { step, task: Some(task_id) };
    match command {
        WorkflowCommand::ScheduleActivity(schedule) => schedule_activity(run, cx, at, schedule),
        WorkflowCommand::RecordLocalActivity(local) => record_local_activity(run, cx, at.step, at.task, local),
        WorkflowCommand::CancelSelectionOperation(cancel) => cancel_selection_member(run, cx, at.task, cancel)?,
        WorkflowCommand::StartTimer { delay_seconds, tags } => start_timer(run, cx, at, delay_seconds, tags),
        WorkflowCommand::OpenConditionWait {
            condition_key,
            fingerprint,
            timeout_seconds,
            occurrence_id,
            tags,
        } => open_condition_wait(
            run,
            cx,
            at,
            ConditionWaitSpec {
                condition_key,
                fingerprint,
                timeout_seconds,
                occurrence_id,
            },
            tags,
        ),
        WorkflowCommand::OpenSignalWait {
            signal_name,
            timeout_seconds,
            tags,
        } => open_signal_wait(run, cx, at, signal_name, timeout_seconds, tags),
        WorkflowCommand::RecordSideEffect { result, tags, stream } => record_side_effect(run, cx, at, result, tags, stream),
        WorkflowCommand::RecordVersionMarker {
            change_id,
            version,
            min_supported,
            max_supported,
            tags,
        } => record_version_marker(run, cx, at, change_id, version, min_supported..=max_supported, tags),
        WorkflowCommand::UpsertSearchAttributes {
            attributes,
            attribute_types,
            tags,
        } => upsert_search_attributes(run, cx, at, attributes, attribute_types, tags),
        WorkflowCommand::UpsertMemo { entries, tags } => upsert_memo(run, cx, at, entries, tags)?,
        WorkflowCommand::StartChildWorkflow(child) => start_child_workflow(run, cx, at, child),
        WorkflowCommand::StartServiceOperation(op) => super::start_service_operation(run, cx, at, op),
        WorkflowCommand::CompleteUpdate { update_id, result } => complete_update(run, cx, at, update_id, result)?,
        WorkflowCommand::FailUpdate { update_id, failure } => fail_update(run, cx, at, update_id, failure)?,
        // After a cooperative cancellation reached workflow code, however the code ends its
        // cleanup, the run ends cancelled.
        WorkflowCommand::CompleteWorkflow { .. } | WorkflowCommand::FailWorkflow(_) if cancellation_delivered(run) => {
            close_cancelled_cooperatively(run, cx, at.task, "completed");
        }
        WorkflowCommand::CompleteWorkflow { result } => complete_workflow(run, cx, at, result),
        WorkflowCommand::FailWorkflow(failure) => fail_workflow(run, cx, at, failure),
        WorkflowCommand::ContinueAsNew {
            arguments,
            workflow_type,
            queue,
            tags,
            observability_context,
        } => {
            let next = NextRun {
                arguments,
                workflow_type,
                queue,
                origin_trace: observability_context,
            };
            continue_as_new(run, cx, at, next, tags)
        }
    }
    Ok(())
}
