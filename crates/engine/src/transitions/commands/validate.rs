//! The checks a completion's commands pass together before any of them is applied.

use crate::transitions::invalid;
use crate::{Cx, Reason, Refusal, RunState, WorkflowCommand};

/// Refuses what would record more than `new_events` past the history limit.
pub(in crate::transitions) fn ensure_history_room(run: &RunState, cx: &Cx, new_events: u64) -> Result<(), Refusal> {
    if run.last_sequence + new_events > cx.limits.history_events_max {
        return Err(Refusal::new(Reason::StructuralLimitExceeded, "The run's history is full.")
            .with("limit_kind", "history_events")
            .with("current_value", run.last_sequence)
            .with("configured_limit", cx.limits.history_events_max));
    }
    Ok(())
}

pub(in crate::transitions) fn validate_commands(run: &RunState, cx: &Cx, commands: &[WorkflowCommand]) -> Result<(), Refusal> {
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
    ensure_history_room(run, cx, 3 * commands.len() as u64 + local_events as u64)?;
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
