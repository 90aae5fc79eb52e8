//! Workers and task queues: registrations, heartbeats, the roster, queue snapshots.

use crate::rows::*;
use crate::tx::{args, locking, Locking, Row, Tx};
use crate::*;
use std::collections::BTreeMap;

const LOCK_WORKER: Locking = locking!(
    "SELECT namespace, worker_id, task_queue, runtime, sdk_version, build_id, workflow_types, activity_types, fingerprints, document, status, registered_at, last_heartbeat_at
     FROM workers WHERE namespace = $1 AND worker_id = $2",
    "FOR UPDATE"
);
const UPSERT_WORKER: &str = "INSERT INTO workers (namespace, worker_id, task_queue, runtime, sdk_version, build_id, workflow_types, activity_types, fingerprints, document, status, registered_at, last_heartbeat_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
     ON CONFLICT (namespace, worker_id) DO UPDATE SET task_queue = excluded.task_queue, runtime = excluded.runtime,
       sdk_version = excluded.sdk_version, build_id = excluded.build_id, workflow_types = excluded.workflow_types,
       activity_types = excluded.activity_types, fingerprints = excluded.fingerprints, document = excluded.document,
       status = excluded.status, last_heartbeat_at = excluded.last_heartbeat_at";

/// A worker row (columns in `WORKER_COLUMNS` order). A stored list or map that does not parse
/// is a corrupt row, said so, never read as empty.
fn worker_of(row: &Row) -> StoreResult<WorkerRecord> {
    worker_at(row, 0)
}

/// The worker in the row's columns from `first` on (in `WORKER_COLUMNS` order).
pub(crate) fn worker_at(row: &Row, first: usize) -> StoreResult<WorkerRecord> {
    let column = |i: usize| first + i;
    Ok(WorkerRecord {
        namespace: row.text(column(0))?,
        worker_id: row.text(column(1))?,
        task_queue: row.text(column(2))?,
        runtime: row.text(column(3))?,
        sdk_version: row.opt_str(column(4))?.map(str::to_string),
        build_id: row.opt_str(column(5))?.map(str::to_string),
        supported_workflow_types: serde_json::from_str(row.str(column(6))?)?,
        supported_activity_types: serde_json::from_str(row.str(column(7))?)?,
        workflow_definition_fingerprints: serde_json::from_str(row.str(column(8))?)?,
        document: serde_json::from_str(row.str(column(9))?)?,
        status: row.text(column(10))?,
        registered_at: row.int(column(11))?,
        last_heartbeat_at: row.int(column(12))?,
    })
}

fn workers_of(rows: Vec<Row>) -> StoreResult<Vec<WorkerRecord>> {
    rows.iter().map(worker_of).collect()
}

/// Registers (or re-registers) a worker; a re-registration keeps its first `registered_at`
/// and may not change a registered workflow definition's fingerprint.
pub(crate) async fn register_worker<T: Tx>(tx: &mut T, worker: WorkerRecord) -> StoreResult<WorkerRecord> {
    let sql = LOCK_WORKER.sql(tx.dialect());
    let existing = tx.query_opt(sql, &args![&worker.namespace, &worker.worker_id]).await?;
    let mut record = worker.clone();
    if let Some(existing) = existing.as_ref().map(worker_of).transpose()? {
        check_fingerprints(&existing, &worker)?;
        record.registered_at = existing.registered_at;
    }
    let workflow_types = serde_json::to_string(&record.supported_workflow_types)?;
    let activity_types = serde_json::to_string(&record.supported_activity_types)?;
    let fingerprints = serde_json::to_string(&record.workflow_definition_fingerprints)?;
    let document = serde_json::to_string(&record.document)?;
    let args = args![
        &record.namespace,
        &record.worker_id,
        &record.task_queue,
        &record.runtime,
        &record.sdk_version,
        &record.build_id,
        workflow_types.as_str(),
        activity_types.as_str(),
        fingerprints.as_str(),
        document.as_str(),
        &record.status,
        record.registered_at,
        record.last_heartbeat_at,
    ];
    tx.execute(UPSERT_WORKER, &args).await?;
    Ok(record)
}

pub(crate) async fn heartbeat_worker<T: Tx>(
    tx: &mut T,
    namespace: &str,
    worker_id: &str,
    now: Millis,
    reported: Map<String, Value>,
) -> StoreResult<Option<WorkerRecord>> {
    if reported.is_empty() {
        let sql = "UPDATE workers SET last_heartbeat_at = $3 WHERE namespace = $1 AND worker_id = $2";
        tx.execute(sql, &args![namespace, worker_id, now]).await?;
        return get_worker(tx, namespace, worker_id).await;
    }
    let sql = LOCK_WORKER.sql(tx.dialect());
    let Some(mut worker) = tx
        .query_opt(sql, &args![namespace, worker_id])
        .await?
        .as_ref()
        .map(worker_of)
        .transpose()?
    else {
        return Ok(None);
    };
    worker.document.extend(reported);
    worker.last_heartbeat_at = now;
    let document = serde_json::to_string(&worker.document)?;
    let sql = "UPDATE workers SET last_heartbeat_at = $3, document = $4 WHERE namespace = $1 AND worker_id = $2";
    tx.execute(sql, &args![namespace, worker_id, now, document.as_str()]).await?;
    Ok(Some(worker))
}

pub(crate) async fn get_worker<T: Tx>(tx: &mut T, namespace: &str, worker_id: &str) -> StoreResult<Option<WorkerRecord>> {
    let sql = format!("SELECT {WORKER_COLUMNS} FROM workers WHERE namespace = $1 AND worker_id = $2");
    tx.query_opt(&sql, &args![namespace, worker_id])
        .await?
        .as_ref()
        .map(worker_of)
        .transpose()
}

pub(crate) async fn deregister_worker<T: Tx>(tx: &mut T, namespace: &str, worker_id: &str) -> StoreResult<bool> {
    let sql = "DELETE FROM workers WHERE namespace = $1 AND worker_id = $2";
    Ok(tx.execute(sql, &args![namespace, worker_id]).await? > 0)
}

/// How long a fenced deregistration's receipt is kept for a retried request.
pub const DEREGISTRATION_RECEIPT_RETENTION_MS: i64 = 600_000;

/// A fenced deregistration (`registration_token`): removes the registration only if the token
/// is the current registration's, and records the receipt in the same transaction, so a retry
/// after a lost reply gets the same receipt back. Answers `(receipt, replayed)`.
pub(crate) async fn deregister_fenced<T: Tx>(
    tx: &mut T,
    namespace: &str,
    worker_id: &str,
    token: &str,
    now: Millis,
) -> StoreResult<(Value, bool)> {
    let earlier = tx
        .query_opt(
            "SELECT receipt FROM worker_deregistrations WHERE namespace = $1 AND worker_id = $2 AND registration_token = $3 AND created_at > $4",
            &args![namespace, worker_id, token, now - DEREGISTRATION_RECEIPT_RETENTION_MS],
        )
        .await?;
    if let Some(row) = earlier {
        return Ok((serde_json::from_str(row.str(0)?)?, true));
    }
    let row = tx.query_opt(LOCK_WORKER.sql(tx.dialect()), &args![namespace, worker_id]).await?;
    let Some(worker) = row.as_ref().map(worker_of).transpose()? else {
        return Err(
            Refusal::new(Reason::WorkerRegistrationTokenNotFound, "No registration holds this token.")
                .with("worker_id", worker_id)
                .into(),
        );
    };
    if worker.document.get("registration_token").and_then(Value::as_str) != Some(token) {
        return Err(Refusal::new(
            Reason::WorkerRegistrationLostAuthority,
            "The worker registered again since this token was issued; the token no longer holds the registration.",
        )
        .with("worker_id", worker_id)
        .into());
    }
    let leased = leased_tasks(tx, namespace, worker_id, TaskKind::Workflow).await?;
    deregister_worker(tx, namespace, worker_id).await?;
    let receipt = serde_json::json!({
        "worker_id": worker_id,
        "registration_token": token,
        "outcome": "deregistered",
        "deregistered": true,
        "recovered_workflow_task_count": leased.len(),
        "recovered_activity_task_count": 0,
    });
    let text = receipt.to_string();
    tx.execute(
        "INSERT INTO worker_deregistrations (namespace, worker_id, registration_token, receipt, created_at) VALUES ($1, $2, $3, $4, $5)",
        &args![namespace, worker_id, token, text.as_str(), now],
    )
    .await?;
    tx.execute(
        "DELETE FROM worker_deregistrations WHERE created_at <= $1",
        &args![now - DEREGISTRATION_RECEIPT_RETENTION_MS],
    )
    .await?;
    Ok((receipt, false))
}

pub(crate) async fn leased_tasks<T: Tx>(tx: &mut T, namespace: &str, owner: &str, kind: TaskKind) -> StoreResult<Vec<TaskId>> {
    let sql = "SELECT task_id FROM tasks WHERE namespace = $1 AND lease_owner = $2 AND kind = $3 AND status = 'leased'";
    let rows = tx.query(sql, &args![namespace, owner, kind.as_str()]).await?;
    rows.iter().map(|row| Ok(TaskId(row.text(0)?))).collect()
}

pub(crate) async fn workers<T: Tx>(tx: &mut T, namespace: &str) -> StoreResult<Vec<WorkerRecord>> {
    let sql = format!("SELECT {WORKER_COLUMNS} FROM workers WHERE namespace = $1 ORDER BY worker_id");
    workers_of(tx.query(&sql, &args![namespace]).await?)
}

pub(crate) async fn queue_workers<T: Tx>(tx: &mut T, namespace: &str, queue: &str) -> StoreResult<Vec<WorkerRecord>> {
    let sql = format!("SELECT {WORKER_COLUMNS} FROM workers WHERE namespace = $1 AND task_queue = $2 ORDER BY worker_id");
    workers_of(tx.query(&sql, &args![namespace, queue]).await?)
}

/// Queues with open tasks or registered workers (the internal atomic queue is not listed).
pub(crate) async fn task_queue_names<T: Tx>(tx: &mut T, namespace: &str) -> StoreResult<Vec<String>> {
    let sql = "SELECT queue FROM tasks WHERE namespace = $1 AND status IN ('ready', 'leased') AND queue <> $2
               UNION SELECT task_queue FROM workers WHERE namespace = $1 ORDER BY 1";
    let rows = tx.query(sql, &args![namespace, ATOMIC_QUEUE]).await?;
    rows.iter().map(|row| row.text(0)).collect()
}

pub(crate) async fn task_queue_snapshot<T: Tx>(tx: &mut T, namespace: &str, queue: &str, lease_limit: usize) -> StoreResult<QueueSnapshot> {
    let counts_sql = "SELECT kind, status, COUNT(*), MIN(available_at) FROM tasks
                      WHERE namespace = $1 AND queue = $2 AND status IN ('ready', 'leased') GROUP BY kind, status";
    let counts = tx
        .query(counts_sql, &args![namespace, queue])
        .await?
        .iter()
        .map(|r| Ok((r.text(0)?, r.text(1)?, r.int(2)?, r.opt_int(3)?)))
        .collect::<StoreResult<_>>()?;
    let leases_sql = "SELECT t.task_id, t.kind, t.type_name, r.workflow_id, t.run_id, t.lease_owner, t.lease_expires_at
                      FROM tasks t JOIN runs r ON r.run_id = t.run_id
                      WHERE t.namespace = $1 AND t.queue = $2 AND t.status = 'leased' ORDER BY t.lease_expires_at LIMIT $3";
    let leases = tx
        .query(leases_sql, &args![namespace, queue, lease_limit as i64])
        .await?
        .iter()
        .map(|r| {
            Ok(QueueLease {
                task_id: r.text(0)?,
                kind: r.text(1)?,
                type_name: r.text(2)?,
                workflow_id: r.text(3)?,
                run_id: r.text(4)?,
                lease_owner: r.opt_str(5)?.map(str::to_string),
                lease_expires_at: r.opt_int(6)?,
            })
        })
        .collect::<StoreResult<_>>()?;
    let pinned_sql = "SELECT compatibility, COUNT(*) FROM tasks WHERE namespace = $1 AND queue = $2 AND status = 'ready'
                        AND kind = 'workflow' AND compatibility IS NOT NULL GROUP BY compatibility";
    let pinned = tx
        .query(pinned_sql, &args![namespace, queue])
        .await?
        .iter()
        .map(|r| Ok((r.text(0)?, r.int(1)?)))
        .collect::<StoreResult<_>>()?;
    Ok(QueueSnapshot { counts, leases, pinned })
}

/// See [`FleetStore::priority_fairness`](crate::FleetStore::priority_fairness).
pub(crate) async fn priority_fairness<T: Tx>(tx: &mut T, namespace: &str, queue: &str, now: Millis, env: &Env) -> StoreResult<QueueShares> {
    let sql = "SELECT kind, priority, fairness_key, COUNT(*), MAX(fairness_weight) FROM tasks
               WHERE namespace = $1 AND queue = $2 AND status = 'ready' AND kind IN ('workflow', 'activity')
               GROUP BY kind, priority, fairness_key ORDER BY priority";
    let mut shares = QueueShares::default();
    for row in tx.query(sql, &args![namespace, queue]).await? {
        let of_kind = match row.str(0)? {
            "workflow" => &mut shares.workflow,
            _ => &mut shares.activity,
        };
        let priority = u8::try_from(row.int(1)?).unwrap_or_default();
        let class = ClassCount {
            fairness_key: row.opt_str(2)?.map(str::to_string),
            count: row.int(3)?,
            fairness_weight: u16::try_from(row.int(4)?).unwrap_or(1),
        };
        of_kind.ready_tasks += class.count;
        match of_kind.tiers.last_mut().filter(|tier| tier.priority == priority) {
            Some(tier) => {
                tier.count += class.count;
                tier.classes.push(class);
            }
            None => of_kind.tiers.push(PriorityTier {
                priority,
                count: class.count,
                classes: vec![class],
            }),
        }
    }
    for (kind, of_kind) in [
        (TaskKind::Workflow, &mut shares.workflow),
        (TaskKind::Activity, &mut shares.activity),
    ] {
        let label = |class: &ClassCount| capstan_engine::scheduling::class_of(class.fairness_key.as_deref()).to_string();
        // Each class with ready tasks, by label, with its recent dispatch on this node.
        let mut present = BTreeMap::new();
        for tier in &mut of_kind.tiers {
            tier.classes.sort_by_key(label);
            for class in &tier.classes {
                present.entry(label(class)).or_insert_with(|| class.fairness_key.clone());
            }
        }
        let scores: BTreeMap<String, f64> = env.dispatch.scores(namespace, kind, queue, now).into_iter().collect();
        of_kind.recent_dispatch = present
            .into_iter()
            .map(|(label, key)| (key, scores.get(&label).copied().unwrap_or(0.0)))
            .collect();
    }
    Ok(shares)
}
