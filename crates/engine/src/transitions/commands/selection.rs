//! `cancel_selection_operation`: cancelling a member of a durable selection.

use crate::transitions::{events, invalid};
use crate::{ActivityExecution, CloseCommand, Cx, EventType, Refusal, RunState, SelectionCancel, TaskClosure, TaskId, TimerState};

/// Cancels the open operations of a selection member and records one
/// `SelectionOperationCancelled`. A member that already settled, or was cancelled before, is
/// left alone without an error: the Python SDK sends the cancel again on later tasks until it
/// sees a marker. The member's own leaves get no events: the marker is their outcome.
pub(super) fn cancel_selection_member(
    run: &mut RunState,
    cx: &mut Cx,
    wt: Option<&TaskId>,
    cancel: SelectionCancel,
) -> Result<(), Refusal> {
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
    let payload = events::selection_operation_cancelled(&cancel, cx.now);
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
