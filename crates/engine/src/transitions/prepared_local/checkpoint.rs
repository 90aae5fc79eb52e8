//! `checkpoint`: authored commands that come before a prepared call (side effects, version
//! markers, memo and search-attribute upserts) are committed on the claim, which stays leased.

use super::*;

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
    let mismatch = |message: &str| Refusal::new(Reason::LocalActivityCheckpointMismatch, message).with("checkpoint_id", checkpoint_id);
    if let Some(first) = run.local_checkpoints.iter().find(|c| c.checkpoint_id == checkpoint_id) {
        let same = &first.task_id == claim.task_id
            && first.task_attempt == claim.attempt
            && first.lease_owner == claim.owner
            && first.start_sequence == start_sequence
            && first.next_sequence - first.start_sequence == commands.len() as u32;
        return match same {
            true => Ok(CheckpointReceipt {
                duplicate: true,
                checkpoint: first.clone(),
            }),
            false => Err(mismatch(
                "This checkpoint_id was committed with other commands or on another claim.",
            )),
        };
    }
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
    };
    run.local_checkpoints.push_back(checkpoint.clone());
    while run.local_checkpoints.len() > cx.limits.closed_task_receipts_max {
        run.local_checkpoints.pop_front();
    }
    run.extend_leased_history(cx);
    Ok(CheckpointReceipt {
        duplicate: false,
        checkpoint,
    })
}
