//! A claim's workflow-task lease written to the task row alone, not the run document.
//!
//! A claim that only leases (no event appended, nothing but its task touched: a workflow task
//! with no deferred signals to record) writes its task row, with the lease's inputs kept on it
//! (`pending_lease`), and leaves the run document as it was. Whoever loads the run next — the
//! worker's report, most often, or a signal, a timer, a sweep, a read — folds the lease into
//! the document by running the engine's own lease again with the same inputs on the same
//! document: nothing can have written the document in between, since every writer loads it
//! through here. The first writer after the claim writes the folded lease with its own change,
//! so the run document is written once per report instead of once per claim and once per
//! report.
//!
//! A document written around the lease (by a node of an older build) still takes it, on the
//! history its worker was handed; a lease the run no longer admits (closed meanwhile) is
//! dropped from its row, and its worker's report is refused as for any lost lease.

use crate::tx::{args, Tx};
use crate::*;
use serde::{Deserialize, Serialize};

/// The inputs of a lease kept on its row until the run document holds it.
#[derive(Debug, Serialize, Deserialize)]
struct PendingLease {
    owner: String,
    leased_at: Millis,
    expires_at: Millis,
    fence: u64,
    /// The history the worker was handed: events up to this sequence.
    snapshot: u64,
}

/// Leases the ready row (a claim on another node may have leased it since its candidate read).
const LEASE_ROW: &str =
    "UPDATE tasks SET status = 'leased', lease_owner = $2, lease_expires_at = $3, fence = $4, deadline_at = $5, pending_lease = $6,
         poll_request_id = $7
     WHERE task_id = $1 AND status = 'ready'";
const PENDING_OF: &str = "SELECT pending_lease FROM tasks WHERE task_id = $1";
const DROP_LEASE: &str =
    "UPDATE tasks SET status = 'ready', lease_owner = NULL, lease_expires_at = NULL, fence = $2, deadline_at = $3, pending_lease = NULL,
         poll_request_id = NULL
     WHERE task_id = $1";

/// Whether the lease of `task` that produced `effects` may live on its row alone.
pub(crate) fn row_only(task: &Task, effects: &Effects) -> bool {
    let only_the_task = Effects {
        touched_tasks: [task.id.clone()].into(),
        ..Effects::default()
    };
    task.kind == TaskKind::Workflow && *effects == only_the_task
}

/// Writes the lease `task` holds (leased at `leased_at`, by the poll with request id `poll`) to
/// its row alone. False when the row is no longer ready: the candidate was leased elsewhere
/// since it was read.
pub(crate) async fn lease_row<T: Tx>(tx: &mut T, task: &Task, leased_at: Millis, poll: Option<&str>) -> StoreResult<bool> {
    let Some(lease) = task.lease() else {
        return Ok(false);
    };
    let pending = PendingLease {
        owner: lease.owner.clone(),
        leased_at,
        expires_at: lease.expires_at,
        fence: task.fence,
        snapshot: snapshot_of(task),
    };
    let text = serde_json::to_string(&pending)?;
    let args = args![
        task.id.as_str(),
        lease.owner.as_str(),
        lease.expires_at,
        task.fence as i64,
        task.deadline_at,
        text.as_str(),
        poll
    ];
    Ok(tx.execute(LEASE_ROW, &args).await? == 1)
}

/// How a run was loaded: held for writing (a lease that no longer folds is dropped from its
/// row) or only read.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Load {
    Locked,
    Read,
}

/// Folds into `run` the lease its workflow task holds on its row alone, if any. `named`: a
/// task whose `pending_lease` the load already read with the run (a report names its task).
pub(crate) async fn fold<T: Tx>(tx: &mut T, run: &mut RunState, named: Option<(&str, Option<&str>)>, load: Load) -> StoreResult<()> {
    let Some(task_id) = run.workflow_task.clone() else {
        return Ok(());
    };
    let Some(task) = run.tasks.get(&task_id).filter(|task| task.is_ready()) else {
        return Ok(());
    };
    let (fence, deadline_at) = (task.fence, task.deadline_at);
    let text = match named {
        Some((named_id, text)) if named_id == task_id.as_str() => text.map(str::to_string),
        _ => match tx.query_opt(PENDING_OF, &args![task_id.as_str()]).await? {
            Some(row) => row.opt_str(0)?.map(str::to_string),
            None => None,
        },
    };
    let Some(text) = text else { return Ok(()) };
    let pending: PendingLease = serde_json::from_str(&text)?;
    if pending.fence != fence + 1 || !run.deferred_signals.is_empty() {
        // Kept from a lease the document has moved past (the row is rewritten when it next
        // changes): nothing to fold.
        return Ok(());
    }
    let seen_by_worker = pending.snapshot;
    let written_around = seen_by_worker != run.last_sequence;
    let mut ids = SequentialIds::new("fold");
    let limits = Limits::default();
    let mut cx = Cx::new(pending.leased_at, &mut ids, &limits);
    let lease_ms = pending.expires_at - pending.leased_at;
    match lease_workflow_task(run, &mut cx, &task_id, &pending.owner, lease_ms) {
        Ok(_) if !written_around => Ok(()),
        Ok(_) => {
            // Something wrote the document without folding the lease (a node of an older
            // build): the lease stands, on the history its worker was handed, so what came
            // after is new to the workflow and wakes it again.
            tracing::warn!(run_id = %run.run_id, task_id = %task_id, "a lease kept on its task row was written around; folded on the history its worker saw");
            if let Some(TaskDetail::Workflow { history_snapshot, .. }) = run.tasks.get_mut(&task_id).map(|task| &mut task.detail) {
                *history_snapshot = seen_by_worker;
            }
            Ok(())
        }
        Err(refusal) => {
            // The run moved on so that the lease no longer holds (closed meanwhile): it is
            // void; its worker's report is refused as for any lost lease.
            tracing::warn!(run_id = %run.run_id, task_id = %task_id, %refusal, "a lease kept on its task row no longer folds into the run");
            if load == Load::Locked {
                tx.execute(DROP_LEASE, &args![task_id.as_str(), fence as i64, deadline_at]).await?;
            }
            Ok(())
        }
    }
}

fn snapshot_of(task: &Task) -> u64 {
    match &task.detail {
        TaskDetail::Workflow { history_snapshot, .. } => *history_snapshot,
        _ => 0,
    }
}
