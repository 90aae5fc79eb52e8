//! `checkpoint`: authored commands that come before a prepared call (side effects, version
//! markers, memo and search-attribute upserts) are committed on the claim, which stays leased.
//! `checkpoint-group`: a parallel group with local members is admitted at once — every leaf
//! takes its step and its opening event in one transaction; the local members' attempts are
//! prepared afterwards, one `prepare` each.

use crate::transitions::commands::{apply_command, validate_commands};
use crate::transitions::invalid;
use crate::transitions::prepared_local::{check_claim, schedule_call};
use crate::{CheckpointReceipt, Cx, GroupMember, LocalCheckpoint, LocalClaim, Reason, Refusal, RunState, WorkflowCommand};

/// The command types a checkpoint may carry: those that record a fact and wait for nothing.
pub fn checkpoint_admits(command: &WorkflowCommand) -> bool {
    matches!(
        command,
        WorkflowCommand::RecordSideEffect { .. }
            | WorkflowCommand::RecordVersionMarker { .. }
            | WorkflowCommand::UpsertMemo { .. }
            | WorkflowCommand::UpsertSearchAttributes { .. }
    )
}

/// Applies `commands` from the run's next step, `start_sequence`, as a completion would, without
/// ending the claim. The same `checkpoint_id` on the same claim is answered as the first time.
pub fn checkpoint_local_prefix(
    run: &mut RunState,
    cx: &mut Cx,
    claim: LocalClaim,
    checkpoint_id: &str,
    start_sequence: u32,
    commands: Vec<WorkflowCommand>,
) -> Result<CheckpointReceipt, Refusal> {
    if let Some(answer) = repeated(run, claim, checkpoint_id, start_sequence, commands.len()) {
        return answer;
    }
    let mismatch = |message: &str| Refusal::new(Reason::LocalActivityCheckpointMismatch, message).with("checkpoint_id", checkpoint_id);
    check_claim(run, cx.now, claim)?;
    if start_sequence != run.next_step {
        return Err(mismatch("A checkpoint starts at the run's next step.").with("next_sequence", run.next_step));
    }
    if !commands.iter().all(checkpoint_admits) {
        return Err(invalid("A checkpoint carries side effects, version markers and upserts only."));
    }
    validate_commands(run, cx, &commands)?;
    for command in commands {
        apply_command(run, cx, claim.task_id, command)?;
    }
    let checkpoint = LocalCheckpoint {
        checkpoint_id: checkpoint_id.to_string(),
        task_id: claim.task_id.clone(),
        task_attempt: claim.attempt,
        lease_owner: claim.owner.to_string(),
        start_sequence,
        next_sequence: run.next_step,
        locals: Vec::new(),
    };
    Ok(remember_checkpoint(run, cx, checkpoint))
}

/// A checkpoint id seen before: the first receipt for the same request on the same claim,
/// a refusal for anything else.
fn repeated(
    run: &RunState,
    claim: LocalClaim,
    checkpoint_id: &str,
    start_sequence: u32,
    size: usize,
) -> Option<Result<CheckpointReceipt, Refusal>> {
    let first = run.local_checkpoints.iter().find(|c| c.checkpoint_id == checkpoint_id)?;
    let same = &first.task_id == claim.task_id
        && first.task_attempt == claim.attempt
        && first.lease_owner == claim.owner
        && first.start_sequence == start_sequence
        && first.next_sequence - first.start_sequence == size as u32;
    Some(match same {
        true => Ok(CheckpointReceipt {
            duplicate: true,
            checkpoint: first.clone(),
        }),
        false => Err(Refusal::new(
            Reason::LocalActivityCheckpointMismatch,
            "This checkpoint_id was committed with other commands or on another claim.",
        )
        .with("checkpoint_id", checkpoint_id)),
    })
}

fn remember_checkpoint(run: &mut RunState, cx: &mut Cx, checkpoint: LocalCheckpoint) -> CheckpointReceipt {
    run.local_checkpoints.push_back(checkpoint.clone());
    while run.local_checkpoints.len() > cx.limits.closed_task_receipts_max {
        run.local_checkpoints.pop_front();
    }
    run.extend_leased_history(cx);
    CheckpointReceipt {
        duplicate: false,
        checkpoint,
    }
}

/// The leaves a group checkpoint may hold besides local calls.
pub fn group_admits(command: &WorkflowCommand) -> bool {
    matches!(
        command,
        WorkflowCommand::ScheduleActivity(_) | WorkflowCommand::StartTimer { .. } | WorkflowCommand::StartChildWorkflow(_)
    )
}

/// Most leaves one group checkpoint admits (the SDKs' bound).
pub const GROUP_MEMBERS_MAX: usize = 100;

/// Admits a parallel group from the run's next step, `start_sequence`: every leaf in authored
/// order takes its step; a local member is recorded as scheduled (`ActivityScheduled`, no
/// attempt yet) under the execution id the receipt names; the others as a completion records
/// them. The same `checkpoint_id` on the same claim is answered as the first time.
pub fn checkpoint_local_group(
    run: &mut RunState,
    cx: &mut Cx,
    claim: LocalClaim,
    checkpoint_id: &str,
    start_sequence: u32,
    members: Vec<GroupMember>,
) -> Result<CheckpointReceipt, Refusal> {
    if let Some(answer) = repeated(run, claim, checkpoint_id, start_sequence, members.len()) {
        return answer;
    }
    let mismatch = |message: &str| Refusal::new(Reason::LocalActivityCheckpointMismatch, message).with("checkpoint_id", checkpoint_id);
    check_claim(run, cx.now, claim)?;
    if start_sequence != run.next_step {
        return Err(mismatch("A checkpoint starts at the run's next step.").with("next_sequence", run.next_step));
    }
    let locals = members.iter().filter(|m| matches!(m, GroupMember::Local(_))).count();
    if locals == 0 || members.len() > GROUP_MEMBERS_MAX {
        return Err(invalid(format!(
            "A group checkpoint holds 1 to {GROUP_MEMBERS_MAX} leaves, at least one of them a local call."
        )));
    }
    let commands: Vec<WorkflowCommand> = members
        .iter()
        .filter_map(|m| match m {
            GroupMember::Command(command) => Some(command.clone()),
            GroupMember::Local(_) => None,
        })
        .collect();
    if !commands.iter().all(group_admits) {
        return Err(invalid("A group's other leaves are activities, timers and child workflows."));
    }
    if !commands.is_empty() {
        validate_commands(run, cx, &commands)?;
    }
    let mut admitted = Vec::new();
    for member in members {
        match member {
            GroupMember::Command(command) => apply_command(run, cx, claim.task_id, command)?,
            GroupMember::Local(descriptor) => admitted.push(schedule_call(run, cx, claim, descriptor, Some(checkpoint_id))?),
        }
    }
    let checkpoint = LocalCheckpoint {
        checkpoint_id: checkpoint_id.to_string(),
        task_id: claim.task_id.clone(),
        task_attempt: claim.attempt,
        lease_owner: claim.owner.to_string(),
        start_sequence,
        next_sequence: run.next_step,
        locals: admitted,
    };
    Ok(remember_checkpoint(run, cx, checkpoint))
}
