//! Query and update-validation tasks (single-use, outside any run), and remembered polls.

use crate::rows::*;
use crate::tx::{args, locking, Locking, Tx};
use crate::*;

const UPSERT_QUERY_TASK: &str =
    "INSERT INTO query_tasks (query_task_id, namespace, task_queue, status, lease_expires_at, created_at, deadline_at, doc, kind)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
     ON CONFLICT (query_task_id) DO UPDATE SET status = excluded.status, lease_expires_at = excluded.lease_expires_at, doc = excluded.doc";
const CLAIMABLE: Locking = locking!(
    "SELECT doc FROM query_tasks WHERE namespace = $1 AND task_queue = $2 AND kind = $4 AND deadline_at > $3
       AND (status = 'ready' OR (status = 'leased' AND lease_expires_at <= $3))
     ORDER BY created_at LIMIT 8",
    "FOR UPDATE SKIP LOCKED"
);
const LOCK_QUERY_TASK: Locking = locking!(
    "SELECT doc FROM query_tasks WHERE query_task_id = $1 AND namespace = $2",
    "FOR UPDATE"
);

async fn write_query_task<T: Tx>(tx: &mut T, task: &QueryTask) -> StoreResult<()> {
    let (status, lease_expires_at) = query_columns(task);
    let doc = serde_json::to_string(task)?;
    let args = args![
        &task.id,
        &task.namespace,
        &task.task_queue,
        status,
        lease_expires_at,
        task.created_at,
        task.deadline_at,
        doc.as_str(),
        task.kind.as_str(),
    ];
    tx.execute(UPSERT_QUERY_TASK, &args).await.map(drop)
}

/// Stores a new query task and wakes its queue's pollers (on every node).
pub(crate) async fn create_query_task<T: Tx>(tx: &mut T, task: &QueryTask) -> StoreResult<()> {
    write_query_task(tx, task).await?;
    tx.announce((task.namespace.clone(), TaskKind::Query, task.task_queue.clone()))
        .await
}

/// A poller's claim of the oldest leasable query or validation task of its queue.
#[derive(Clone, Debug)]
pub struct QueryClaim {
    pub namespace: String,
    pub queue: String,
    pub kind: QueryKind,
    /// The poller's worker id, the lease owner.
    pub owner: String,
    pub lease_ms: i64,
}

/// A worker's answer to a query or validation task it holds (`QueryTask::answer` fences it).
#[derive(Clone, Debug)]
pub struct QueryAnswer {
    pub namespace: String,
    pub task_id: String,
    pub owner: String,
    pub attempt: u32,
    pub outcome: QueryOutcome,
}

pub(crate) async fn claim_query_task<T: Tx>(tx: &mut T, claim: &QueryClaim, now: Millis) -> StoreResult<Option<QueryTask>> {
    let sql = CLAIMABLE.sql(tx.dialect());
    let rows = tx
        .query(sql, &args![&claim.namespace, &claim.queue, now, claim.kind.as_str()])
        .await?;
    for row in rows {
        let mut task: QueryTask = serde_json::from_str(row.str(0)?)?;
        if task.lease(&claim.owner, claim.lease_ms, now).is_ok() {
            write_query_task(tx, &task).await?;
            return Ok(Some(task));
        }
    }
    Ok(None)
}

pub(crate) async fn answer_query_task<T: Tx>(tx: &mut T, answer: QueryAnswer, now: Millis) -> StoreResult<QueryTask> {
    let row = tx
        .query_opt(LOCK_QUERY_TASK.sql(tx.dialect()), &args![&answer.task_id, &answer.namespace])
        .await?;
    let Some(row) = row else {
        return Err(Refusal::new(Reason::QueryTaskNotFound, "Query task not found.")
            .with("query_task_id", answer.task_id)
            .into());
    };
    let mut task: QueryTask = serde_json::from_str(row.str(0)?)?;
    task.answer(&answer.owner, answer.attempt, answer.outcome, now)?;
    write_query_task(tx, &task).await?;
    Ok(task)
}

pub(crate) async fn get_query_task<T: Tx>(tx: &mut T, namespace: &str, id: &str) -> StoreResult<Option<QueryTask>> {
    let sql = "SELECT doc FROM query_tasks WHERE query_task_id = $1 AND namespace = $2";
    match tx.query_opt(sql, &args![id, namespace]).await? {
        Some(row) => Ok(Some(serde_json::from_str(row.str(0)?)?)),
        None => Ok(None),
    }
}

pub(crate) async fn delete_query_task<T: Tx>(tx: &mut T, namespace: &str, id: &str) -> StoreResult<()> {
    let sql = "DELETE FROM query_tasks WHERE query_task_id = $1 AND namespace = $2";
    tx.execute(sql, &args![id, namespace]).await.map(drop)
}
