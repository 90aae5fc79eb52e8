//! The background duties' reads and writes: the next deadline, pruning of poll and query
//! records, namespace retention, and the figures `/api/system` shows.

use super::run_counts;
use crate::tx::{args, locking, Locking, Param, Tx};
use crate::*;

/// The instances among `{ids}` whose current run closed before `$2`, locked.
const LOCK_EXPIRED_INSTANCES: Locking = locking!(
    "SELECT i.workflow_id FROM workflow_instances i JOIN runs r ON r.run_id = i.current_run_id
     WHERE i.namespace = $1 AND r.closed_at IS NOT NULL AND r.closed_at < $2 AND i.workflow_id IN ({ids})",
    "FOR UPDATE OF i"
);
/// What removing instances deletes, children first: one statement per table for a whole batch
/// (`{ids}`: the workflow ids). A statement marked `true` also binds the namespace as `$1`, the
/// ids then from `$2`. Runs are found by workflow id alone: ids are unique across namespaces,
/// and a namespace condition beside it would lead the planner to `runs_by_namespace`, a scan of
/// every run of the namespace.
const REMOVE_INSTANCES: [(&str, bool); 10] = [
    ("DELETE FROM audit_events WHERE namespace = $1 AND workflow_id IN ({ids})", true),
    (
        "DELETE FROM external_payload_uses WHERE namespace = $1 AND workflow_id IN ({ids})",
        true,
    ),
    (
        "DELETE FROM workflow_stream_items WHERE run_id IN (SELECT run_id FROM runs WHERE workflow_id IN ({ids}))",
        false,
    ),
    (
        "DELETE FROM workflow_streams WHERE run_id IN (SELECT run_id FROM runs WHERE workflow_id IN ({ids}))",
        false,
    ),
    (
        "DELETE FROM history_events WHERE run_id IN (SELECT run_id FROM runs WHERE workflow_id IN ({ids}))",
        false,
    ),
    (
        "DELETE FROM tasks WHERE run_id IN (SELECT run_id FROM runs WHERE workflow_id IN ({ids}))",
        false,
    ),
    (
        "DELETE FROM search_attribute_index WHERE run_id IN (SELECT run_id FROM runs WHERE workflow_id IN ({ids}))",
        false,
    ),
    ("DELETE FROM runs WHERE workflow_id IN ({ids})", false),
    ("DELETE FROM command_requests WHERE namespace = $1 AND workflow_id IN ({ids})", true),
    (
        "DELETE FROM workflow_instances WHERE namespace = $1 AND workflow_id IN ({ids})",
        true,
    ),
];
/// Instances removed by one set of statements.
const REMOVE_CHUNK: usize = 100;

/// `$first, $first+1, …`: one placeholder per id.
fn placeholders(first: usize, count: usize) -> String {
    (first..first + count).map(|n| format!("${n}")).collect::<Vec<_>>().join(", ")
}

/// When the next duty can be taken: a task's deadline, or, while a node's claim on it is
/// live, the claim's expiry (a due task another node holds, or one whose run was locked, is not
/// work for this node until then: the clock sleeps instead of spinning on it).
pub(crate) async fn next_deadline<T: Tx>(tx: &mut T) -> StoreResult<Option<Millis>> {
    let sql = "SELECT MIN(CASE WHEN duty_expires_at > deadline_at THEN duty_expires_at ELSE deadline_at END)
               FROM tasks WHERE deadline_at IS NOT NULL AND status IN ('ready', 'leased', 'paused')";
    Ok(tx.query_opt(sql, &[]).await?.map(|row| row.opt_int(0)).transpose()?.flatten())
}

/// Old query tasks, and poll memos of binaries before the memo moved to the task row (a
/// database shared with one still gets them).
pub(crate) async fn prune<T: Tx>(tx: &mut T, older_than: Millis) -> StoreResult<()> {
    tx.execute("DELETE FROM poll_requests WHERE created_at < $1", &args![older_than])
        .await?;
    tx.execute("DELETE FROM query_tasks WHERE created_at < $1", &args![older_than])
        .await?;
    Ok(())
}

/// Instances whose current run closed before `cutoff`: `(workflow id, run id, closed at)`.
pub(crate) async fn expired_instances<T: Tx>(
    tx: &mut T,
    namespace: &str,
    cutoff: Millis,
    limit: usize,
) -> StoreResult<Vec<(String, String, Millis)>> {
    // Current runs by the run's own mark, read in `runs_closed` order: a join to the instances
    // left PostgreSQL's planner hashing every run for each hundred (135 ms at 100,000 runs).
    let sql = "SELECT r.workflow_id, r.run_id, r.closed_at FROM runs r
               WHERE r.namespace = $1 AND r.is_current = 1 AND r.closed_at IS NOT NULL AND r.closed_at < $2
               ORDER BY r.closed_at LIMIT $3";
    let rows = tx.query(sql, &args![namespace, cutoff, limit as i64]).await?;
    rows.iter().map(|r| Ok((r.text(0)?, r.text(1)?, r.int(2)?))).collect()
}

/// Removes the instances still expired at `cutoff` (a run started since keeps its instance);
/// the instances' row locks keep a concurrent start of an id out while they go.
pub(crate) async fn prune_instances<T: Tx>(tx: &mut T, namespace: &str, workflow_ids: &[String], cutoff: Millis) -> StoreResult<usize> {
    let mut pruned = 0;
    for chunk in workflow_ids.chunks(REMOVE_CHUNK) {
        let sql = LOCK_EXPIRED_INSTANCES
            .sql(tx.dialect())
            .replace("{ids}", &placeholders(3, chunk.len()));
        let mut params: Vec<Param> = vec![namespace.into(), cutoff.into()];
        params.extend(chunk.iter().map(Param::from));
        let expired: Vec<String> = tx
            .query(&sql, &params)
            .await?
            .iter()
            .map(|r| r.text(0))
            .collect::<StoreResult<_>>()?;
        remove_instances(tx, namespace, &expired).await?;
        pruned += expired.len();
    }
    Ok(pruned)
}

/// Deletes instances: their runs, what hangs off them, and their share of the kept counts, one
/// statement per table for each hundred. The caller holds the instances' row locks (a start of
/// one of the ids waits, then makes a new instance).
pub(crate) async fn remove_instances<T: Tx>(tx: &mut T, namespace: &str, workflow_ids: &[String]) -> StoreResult<()> {
    for chunk in workflow_ids.chunks(REMOVE_CHUNK) {
        let ids: Vec<Param> = chunk.iter().map(Param::from).collect();
        let scoped: Vec<Param> = std::iter::once(namespace.into()).chain(ids.iter().cloned()).collect();
        uncount_instances(tx, namespace, &placeholders(1, chunk.len()), &ids).await?;
        for (template, namespaced) in REMOVE_INSTANCES {
            let (first, params) = if namespaced { (2, &scoped) } else { (1, &ids) };
            tx.execute(&template.replace("{ids}", &placeholders(first, chunk.len())), params)
                .await?;
        }
    }
    Ok(())
}

/// Takes instances' runs out of the kept counts, before they are removed (`ids`: the
/// placeholders of the workflow ids `params` binds).
async fn uncount_instances<T: Tx>(tx: &mut T, namespace: &str, ids: &str, params: &[Param<'_>]) -> StoreResult<()> {
    let sql = format!(
        "SELECT r.workflow_type, r.task_queue, r.run_id, r.status, CASE WHEN i.current_run_id = r.run_id THEN 1 ELSE 0 END, r.paused_at
         FROM runs r LEFT JOIN workflow_instances i ON i.workflow_id = r.workflow_id
         WHERE r.workflow_id IN ({ids})"
    );
    for row in tx.query(&sql, params).await? {
        let run = run_counts::Counted {
            namespace,
            workflow_type: row.str(0)?,
            task_queue: row.str(1)?,
            run_id: row.str(2)?,
        };
        let class = run_counts::class_of_row(row.str(3)?, row.opt_int(5)?);
        run_counts::shift(tx, &run, Some((class, row.int(4)? != 0)), None);
    }
    Ok(())
}

/// Workflow and activity work per queue: ready now (count, oldest) and leased; the busiest
/// `limit` queues. Both counts come from partial indexes over open tasks only.
pub(crate) async fn queue_loads<T: Tx>(tx: &mut T, now: Millis, limit: usize) -> StoreResult<Vec<QueueLoad>> {
    let mut loads: std::collections::BTreeMap<(String, String, String), QueueLoad> = Default::default();
    let ready = "SELECT namespace, kind, queue, COUNT(*), MIN(available_at) FROM tasks
                 WHERE status = 'ready' AND kind IN ('workflow', 'activity') AND available_at <= $1
                 GROUP BY namespace, kind, queue";
    for row in tx.query(ready, &args![now]).await? {
        let key = (row.text(0)?, row.text(1)?, row.text(2)?);
        let load = loads.entry(key.clone()).or_insert_with(|| queue_load(key));
        load.ready = row.int(3)?;
        load.oldest_ready_at = row.opt_int(4)?;
    }
    let leased = "SELECT namespace, kind, queue, COUNT(*) FROM tasks
                  WHERE status = 'leased' AND deadline_at IS NOT NULL AND kind IN ('workflow', 'activity')
                  GROUP BY namespace, kind, queue";
    for row in tx.query(leased, &args![]).await? {
        let key = (row.text(0)?, row.text(1)?, row.text(2)?);
        loads.entry(key.clone()).or_insert_with(|| queue_load(key)).leased = row.int(3)?;
    }
    let mut loads: Vec<QueueLoad> = loads.into_values().collect();
    loads.sort_by_key(|load| std::cmp::Reverse(load.ready + load.leased));
    loads.truncate(limit);
    Ok(loads)
}

fn queue_load((namespace, kind, queue): (String, String, String)) -> QueueLoad {
    QueueLoad {
        namespace,
        kind,
        queue,
        ..QueueLoad::default()
    }
}

pub(crate) async fn system_counts<T: Tx>(tx: &mut T, namespace: &str, now: Millis) -> StoreResult<SystemCounts> {
    // Kept counts: open runs are DW's `running`, closed ones go by their status.
    let runs_by_status = run_counts::all(tx, namespace)
        .await?
        .into_iter()
        .filter(|(_, count)| *count != 0)
        .map(|(class, count)| (if class == "open" { "running".to_string() } else { class }, count))
        .collect();
    let sql = "SELECT kind, status, COUNT(*) FROM tasks WHERE namespace = $1 AND status IN ('ready', 'leased')
               GROUP BY kind, status ORDER BY kind, status";
    let tasks = tx
        .query(sql, &args![namespace])
        .await?
        .iter()
        .map(|r| Ok((r.text(0)?, r.text(1)?, r.int(2)?)))
        .collect::<StoreResult<_>>()?;
    let sql = "SELECT r.workflow_id, r.run_id FROM tasks t JOIN runs r ON r.run_id = t.run_id
               WHERE t.namespace = $1 AND t.status = 'leased' AND t.kind = 'workflow' AND t.lease_expires_at < $2 LIMIT 100";
    let expired_lease_runs = tx
        .query(sql, &args![namespace, now])
        .await?
        .iter()
        .map(|r| Ok((r.text(0)?, r.text(1)?)))
        .collect::<StoreResult<_>>()?;
    let sql = "SELECT COUNT(*) FROM tasks WHERE namespace = $1 AND status = 'leased' AND lease_expires_at < $2";
    let expired_leases = tx
        .query_opt(sql, &args![namespace, now])
        .await?
        .map(|r| r.int(0))
        .transpose()?
        .unwrap_or(0);
    Ok(SystemCounts {
        runs_by_status,
        tasks,
        expired_leases,
        expired_lease_runs,
    })
}

const DUE_TASKS: Locking = locking!(
    "SELECT namespace, task_id, duty_fence FROM tasks
     WHERE deadline_at IS NOT NULL AND deadline_at <= $1 AND status IN ('ready', 'leased', 'paused')
       AND (duty_expires_at IS NULL OR duty_expires_at <= $1)
     ORDER BY deadline_at LIMIT $2",
    "FOR UPDATE SKIP LOCKED"
);

/// Claims up to `limit` tasks whose deadline has passed and whose duty nobody holds, for
/// `node` until `now + hold_ms`, each under its duty fence + 1; tasks another node is claiming
/// this moment are skipped, not waited for. Run inside a transaction.
pub(crate) async fn claim_due_tasks<T: Tx>(tx: &mut T, node: &str, now: Millis, limit: usize, hold_ms: i64) -> StoreResult<Vec<DueTask>> {
    let due = tx.query(DUE_TASKS.sql(tx.dialect()), &args![now, limit as i64]).await?;
    if due.is_empty() {
        return Ok(Vec::new());
    }
    let claimed = due
        .iter()
        .map(|row| {
            Ok(DueTask {
                namespace: row.text(0)?,
                task_id: TaskId(row.text(1)?),
                duty_fence: row.int(2)? as u64 + 1,
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    let ids: Vec<String> = claimed.iter().map(|task| task.task_id.as_str().to_string()).collect();
    let sql = format!(
        "UPDATE tasks SET duty_owner = $1, duty_fence = duty_fence + 1, duty_expires_at = $2 WHERE task_id IN ({})",
        super::listing::marks(2, ids.len())
    );
    let mut params = args![node, now + hold_ms].to_vec();
    params.extend(ids.iter().map(Param::from));
    tx.execute(&sql, &params).await?;
    Ok(claimed)
}
