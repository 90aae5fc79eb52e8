//! Finding a run and locking it against other writers until commit: by id, by the task a
//! report names, by workflow id and run id, or as its instance's current run. A document that
//! does not parse is a corrupt run, named.

use super::row_lease::{self, Load};
use crate::tx::{args, locking, Locking, Tx};
use crate::*;

// Each run read returns the document and the identity an unreadable document is reported under.
const LOCK_RUN: Locking = locking!(
    "SELECT state, namespace, workflow_id, run_id FROM runs WHERE run_id = $1",
    "FOR UPDATE"
);
const LOCK_RUN_OR_SKIP: Locking = locking!(
    "SELECT state, namespace, workflow_id, run_id FROM runs WHERE run_id = $1",
    "FOR UPDATE SKIP LOCKED"
);
// A report names its task: the task's receipt (if it closed) and the lease it holds on its row
// alone (if any) come along, see `run_of`.
const LOCK_RUN_OF_TASK: Locking = locking!(
    "SELECT r.state, r.namespace, r.workflow_id, r.run_id, t.receipt, t.pending_lease FROM tasks t JOIN runs r ON r.run_id = t.run_id WHERE t.task_id = $1 AND t.namespace = $2",
    "FOR UPDATE OF r"
);
// A duty passes over a run another transaction holds (a node frozen mid-transaction must not
// stall every other run's deadlines): its claim stands, and its node retries while it lasts.
pub(super) const LOCK_RUN_OF_TASK_OR_SKIP: Locking = locking!(
    "SELECT r.state, r.namespace, r.workflow_id, r.run_id, t.receipt, t.pending_lease FROM tasks t JOIN runs r ON r.run_id = t.run_id WHERE t.task_id = $1 AND t.namespace = $2",
    "FOR UPDATE OF r SKIP LOCKED"
);
const LOCK_NAMED_RUN: Locking = locking!(
    "SELECT state, namespace, workflow_id, run_id FROM runs WHERE run_id = $1 AND workflow_id = $2 AND namespace = $3",
    "FOR UPDATE"
);
const LOCK_CURRENT_RUN: Locking = locking!(
    "SELECT r.state, r.namespace, r.workflow_id, r.run_id FROM workflow_instances i JOIN runs r ON r.run_id = i.current_run_id WHERE i.workflow_id = $1 AND i.namespace = $2",
    "FOR UPDATE OF r"
);

/// The run of a row `(state, namespace, workflow_id, run_id[, receipt, pending_lease])`, with
/// the lease a claim left on its workflow task's row folded in (`row_lease`). A row naming a
/// task (`named`) holds its receipt, kept on its row when a report closed it (the engine
/// answers a retried report from `closed_receipts`), and its row's pending lease.
pub(super) async fn run_of<T: Tx>(
    tx: &mut T,
    row: Option<crate::tx::Row>,
    named: Option<&TaskId>,
    load: Load,
) -> StoreResult<Option<RunState>> {
    let Some(row) = row else { return Ok(None) };
    let pending = match named {
        Some(task_id) if row.0.len() > 5 => Some((task_id.as_str(), row.opt_str(5)?)),
        _ => None,
    };
    let mut run = state_of(&row)?;
    row_lease::fold(tx, &mut run, pending, load).await?;
    Ok(Some(run))
}

fn state_of(row: &crate::tx::Row) -> StoreResult<RunState> {
    let mut run = read_run(row.str(0)?, row.str(1)?, row.str(2)?, row.str(3)?)?;
    if row.0.len() > 4 {
        if let Some(text) = row.opt_str(4)? {
            let receipt: ClosedTaskReceipt = serde_json::from_str(text)
                .map_err(|e| StoreError::Storage(format!("a task receipt of run {} does not parse: {e}", run.run_id.as_str())))?;
            if run.find_receipt(&receipt.task_id).is_none() {
                run.closed_receipts.push_back(receipt);
            }
        }
    }
    Ok(run)
}

/// A stored run document, or [`StoreError::CorruptRun`] naming the run when it does not parse
/// or comes from a newer build (a retry would read the same bytes).
pub(crate) fn read_run(document: &str, namespace: &str, workflow_id: &str, run_id: &str) -> StoreResult<RunState> {
    let unreadable = |detail: String| {
        StoreError::CorruptRun(IntegrityBreach {
            namespace: namespace.to_string(),
            workflow_id: WorkflowId(workflow_id.to_string()),
            run_id: RunId(run_id.to_string()),
            detail,
        })
    };
    let mut run: RunState = serde_json::from_str(document).map_err(|e| unreadable(format!("the run document does not parse: {e}")))?;
    check_document_version(&run).map_err(unreadable)?;
    // Whatever version it was read from, it is written back in this build's form.
    run.document_version = RUN_DOCUMENT_VERSION;
    Ok(run)
}

/// Loads a run and holds it against other writers until commit. `skip_locked`: give up (None)
/// instead of waiting for another node.
pub(crate) async fn lock_run<T: Tx>(tx: &mut T, run_id: &str, skip_locked: bool) -> StoreResult<Option<RunState>> {
    let sql = if skip_locked { LOCK_RUN_OR_SKIP } else { LOCK_RUN }.sql(tx.dialect());
    let row = tx.query_opt(sql, &args![run_id]).await?;
    run_of(tx, row, None, Load::Locked).await
}

/// Locks the run of a claim's candidate, a task this transaction read ready. Its row is not
/// read again for a lease kept on it alone: one another claim wrote since is caught when this
/// claim writes the row (`row_lease::lease_row` leases only a ready row).
pub(crate) async fn lock_candidate_run<T: Tx>(
    tx: &mut T,
    run_id: &str,
    candidate: &TaskId,
    skip_locked: bool,
) -> StoreResult<Option<RunState>> {
    let sql = if skip_locked { LOCK_RUN_OR_SKIP } else { LOCK_RUN }.sql(tx.dialect());
    let Some(row) = tx.query_opt(sql, &args![run_id]).await? else {
        return Ok(None);
    };
    let mut run = state_of(&row)?;
    row_lease::fold(tx, &mut run, Some((candidate.as_str(), None)), Load::Locked).await?;
    Ok(Some(run))
}

/// Finds and locks the run `locator` names, in one statement.
pub(crate) async fn locate_and_lock<T: Tx>(tx: &mut T, namespace: &str, locator: &RunLocator) -> StoreResult<Option<RunState>> {
    let dialect = tx.dialect();
    locate(tx, namespace, locator, |statement| statement.sql(dialect), Load::Locked).await
}

/// Reads the run `locator` names, without a lock.
pub(crate) async fn load_run<T: Tx>(tx: &mut T, namespace: &str, locator: &RunLocator) -> StoreResult<Option<RunState>> {
    locate(tx, namespace, locator, Locking::unlocked, Load::Read).await
}

async fn locate<T: Tx>(
    tx: &mut T,
    namespace: &str,
    locator: &RunLocator,
    text: impl Fn(&Locking) -> &'static str,
    load: Load,
) -> StoreResult<Option<RunState>> {
    let row = match locator {
        RunLocator::Task(task_id) => tx.query_opt(text(&LOCK_RUN_OF_TASK), &args![task_id.as_str(), namespace]).await?,
        RunLocator::Run(workflow_id, run_id) => {
            let args = args![run_id.as_str(), workflow_id.as_str(), namespace];
            tx.query_opt(text(&LOCK_NAMED_RUN), &args).await?
        }
        RunLocator::Current(workflow_id) => {
            tx.query_opt(text(&LOCK_CURRENT_RUN), &args![workflow_id.as_str(), namespace])
                .await?
        }
    };
    let named = match locator {
        RunLocator::Task(task_id) => Some(task_id),
        _ => None,
    };
    run_of(tx, row, named, load).await
}
