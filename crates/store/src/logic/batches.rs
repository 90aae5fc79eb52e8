//! Batch operations' rows (`docs/batch-operations.md`): created once per request id, claimed a
//! step at a time by one node under a duty fence (another node's claim is skipped, not waited
//! for), advanced only under the fence that claimed it, cancelled. What a step does to the runs
//! it visits is the app's (`capstan_app::batches`); the row keeps where it got to.

use crate::tx::{args, locking, Locking, Tx};
use crate::*;

const COLUMNS: &str =
    "namespace, batch_id, action, request, state, progress, principal, request_id, created_at, updated_at, finished_at, next_step_at";
const INSERT: &str = "INSERT INTO batch_operations (namespace, batch_id, action, request, state, progress, principal, request_id, created_at, updated_at, finished_at, next_step_at, duty_fence)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, 0)";
const BY_REQUEST: &str =
    "SELECT namespace, batch_id, action, request, state, progress, principal, request_id, created_at, updated_at, finished_at, next_step_at
     FROM batch_operations WHERE namespace = $1 AND request_id = $2";
const BY_ID: &str =
    "SELECT namespace, batch_id, action, request, state, progress, principal, request_id, created_at, updated_at, finished_at, next_step_at
     FROM batch_operations WHERE namespace = $1 AND batch_id = $2";
const RUNNING_IN: &str = "SELECT COUNT(*) FROM batch_operations WHERE namespace = $1 AND state = 'running'";
const DUE: Locking = locking!(
    "SELECT batch_id, duty_fence FROM batch_operations
     WHERE state = 'running' AND next_step_at <= $1 AND (duty_expires_at IS NULL OR duty_expires_at <= $1)
     ORDER BY next_step_at LIMIT 1",
    "FOR UPDATE SKIP LOCKED"
);
const CLAIM: &str = "UPDATE batch_operations SET duty_owner = $2, duty_fence = duty_fence + 1, duty_expires_at = $3 WHERE batch_id = $1";
const ADVANCE: &str = "UPDATE batch_operations SET progress = $3, next_step_at = $4, state = $5, finished_at = $6, updated_at = $7,
         duty_owner = NULL, duty_expires_at = NULL
     WHERE batch_id = $1 AND duty_fence = $2 AND state = 'running'";
const LOCK_CLOSED_CURRENT: Locking = locking!(
    "SELECT 1 FROM workflow_instances i JOIN runs r ON r.run_id = i.current_run_id
     WHERE i.workflow_id = $1 AND i.namespace = $2 AND r.run_id = $3 AND r.closed_at IS NOT NULL",
    "FOR UPDATE OF i"
);
const CANCEL: &str = "UPDATE batch_operations SET state = 'cancelled', finished_at = $3, updated_at = $3
     WHERE namespace = $1 AND batch_id = $2 AND state = 'running'";

fn record(row: &crate::tx::Row) -> StoreResult<BatchOperation> {
    Ok(BatchOperation {
        namespace: row.text(0)?,
        batch_id: row.text(1)?,
        action: row.text(2)?,
        request: serde_json::from_str(row.str(3)?)?,
        state: row.text(4)?,
        progress: serde_json::from_str(row.str(5)?)?,
        principal: row.opt_str(6)?.map(serde_json::from_str).transpose()?,
        request_id: row.opt_str(7)?.map(str::to_string),
        created_at: row.int(8)?,
        updated_at: row.int(9)?,
        finished_at: row.opt_int(10)?,
        next_step_at: row.int(11)?,
    })
}

/// Creates `batch`, or answers the one created under its request id before (`false`). At most
/// `running_max` batches of a namespace run at once.
pub(crate) async fn create<T: Tx>(tx: &mut T, batch: &BatchOperation, running_max: usize) -> StoreResult<(BatchOperation, bool)> {
    if let Some(request_id) = &batch.request_id {
        if let Some(row) = tx
            .query_opt(BY_REQUEST, &args![batch.namespace.as_str(), request_id.as_str()])
            .await?
        {
            return Ok((record(&row)?, false));
        }
    }
    let running = tx
        .query_opt(RUNNING_IN, &args![batch.namespace.as_str()])
        .await?
        .map(|r| r.int(0))
        .transpose()?
        .unwrap_or(0);
    if running as usize >= running_max {
        return Err(Refusal::new(
            Reason::BatchOperationsExhausted,
            format!("{running} batch operations are running in this namespace already; at most {running_max} run at once."),
        )
        .with("running", running)
        .into());
    }
    let (request, progress) = (batch.request.to_string(), batch.progress.to_string());
    let principal = batch.principal.as_ref().map(serde_json::to_string).transpose()?;
    let args = args![
        batch.namespace.as_str(),
        batch.batch_id.as_str(),
        batch.action.as_str(),
        request.as_str(),
        batch.state.as_str(),
        progress.as_str(),
        principal.as_deref(),
        batch.request_id.as_deref(),
        batch.created_at,
        batch.updated_at,
        batch.finished_at,
        batch.next_step_at,
    ];
    tx.execute(INSERT, &args).await?;
    Ok((batch.clone(), true))
}

pub(crate) async fn get<T: Tx>(tx: &mut T, namespace: &str, batch_id: &str) -> StoreResult<Option<BatchOperation>> {
    tx.query_opt(BY_ID, &args![namespace, batch_id])
        .await?
        .map(|r| record(&r))
        .transpose()
}

/// A namespace's batches, newest first.
pub(crate) async fn list<T: Tx>(tx: &mut T, namespace: &str, limit: usize) -> StoreResult<Vec<BatchOperation>> {
    let sql = format!("SELECT {COLUMNS} FROM batch_operations WHERE namespace = $1 ORDER BY created_at DESC, batch_id DESC LIMIT $2");
    tx.query(&sql, &args![namespace, limit as i64]).await?.iter().map(record).collect()
}

/// Claims the running batch whose next step is due longest, for `node` until `now + hold_ms`,
/// under its duty fence + 1; a batch another node holds (or is claiming) is not waited for.
pub(crate) async fn claim<T: Tx>(tx: &mut T, node: &str, now: Millis, hold_ms: i64) -> StoreResult<Option<(BatchOperation, u64)>> {
    let Some(row) = tx.query_opt(DUE.sql(tx.dialect()), &args![now]).await? else {
        return Ok(None);
    };
    let (batch_id, fence) = (row.text(0)?, row.int(1)? as u64 + 1);
    tx.execute(CLAIM, &args![batch_id.as_str(), node, now + hold_ms]).await?;
    let sql = format!("SELECT {COLUMNS} FROM batch_operations WHERE batch_id = $1");
    let row = tx
        .query_opt(&sql, &args![batch_id.as_str()])
        .await?
        .ok_or_else(|| StoreError::Storage(format!("batch operation {batch_id} vanished while claimed")))?;
    Ok(Some((record(&row)?, fence)))
}

/// Saves a step's progress and when the next one is due (`finished`: the state it ended in),
/// and gives the duty up; refused (`stale_fence`) when another node claimed the batch since, or
/// it was cancelled meanwhile.
pub(crate) async fn advance<T: Tx>(tx: &mut T, step: &BatchStep, now: Millis) -> StoreResult<()> {
    let progress = step.progress.to_string();
    let (state, finished_at) = match &step.finished {
        Some(state) => (state.as_str(), Some(now)),
        None => ("running", None),
    };
    let args = args![
        step.batch_id.as_str(),
        step.fence as i64,
        progress.as_str(),
        step.next_step_at,
        state,
        finished_at,
        now,
    ];
    if tx.execute(ADVANCE, &args).await? == 0 {
        return Err(Refusal::new(
            Reason::StaleFence,
            "The batch operation was claimed by another node since, or cancelled: this step's progress is not saved.",
        )
        .with("batch_id", step.batch_id.as_str())
        .into());
    }
    Ok(())
}

/// [`advance`], and in the same transaction deletes the instances the step closed out: each
/// is given as the audit event that records its deletion (kept after it, naming who and which
/// batch). Refused, with nothing deleted and no progress saved, when one of them is no longer
/// what the step saw, a closed current run (`run_not_closed`: a new run of the id started
/// since), so that the step reads its page again.
pub(crate) async fn advance_deleting<T: Tx>(tx: &mut T, step: &BatchStep, now: Millis, deletions: &[AuditEvent]) -> StoreResult<()> {
    advance(tx, step, now).await?;
    for deletion in deletions {
        let run_id = deletion.run_id.as_deref().unwrap_or_default();
        let locked = LOCK_CLOSED_CURRENT.sql(tx.dialect());
        let args = args![deletion.workflow_id.as_str(), deletion.namespace.as_str(), run_id];
        if tx.query_opt(locked, &args).await?.is_none() {
            return Err(Refusal::new(
                Reason::RunNotClosed,
                "The instance's current run is no longer the closed run the batch step saw.",
            )
            .with("workflow_id", deletion.workflow_id.as_str())
            .into());
        }
    }
    // A step's deletions are all in its batch's namespace.
    if let Some(first) = deletions.first() {
        let ids: Vec<String> = deletions.iter().map(|d| d.workflow_id.clone()).collect();
        super::duties::remove_instances(tx, &first.namespace, &ids).await?;
    }
    for deletion in deletions {
        super::audit::record_audit(tx, deletion).await?;
    }
    Ok(())
}

/// When the next step of any running batch is due (whoever holds it: its hold's end).
pub(crate) async fn next_step<T: Tx>(tx: &mut T) -> StoreResult<Option<Millis>> {
    let sql = "SELECT MIN(CASE WHEN duty_expires_at > next_step_at THEN duty_expires_at ELSE next_step_at END)
               FROM batch_operations WHERE state = 'running'";
    Ok(tx.query_opt(sql, &[]).await?.map(|row| row.opt_int(0)).transpose()?.flatten())
}

/// Cancels a running batch; the batch as it is now (`None`: no such batch).
pub(crate) async fn cancel<T: Tx>(tx: &mut T, namespace: &str, batch_id: &str, now: Millis) -> StoreResult<Option<BatchOperation>> {
    tx.execute(CANCEL, &args![namespace, batch_id, now]).await?;
    get(tx, namespace, batch_id).await
}
