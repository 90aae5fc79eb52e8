//! Reads of the recovery ledger and integrity records, and the receipts of keyed commands.

use crate::tx::{args, Dialect, Row, Tx};
use crate::*;

fn docs<D: serde::de::DeserializeOwned>(rows: Vec<Row>) -> StoreResult<Vec<D>> {
    rows.iter().map(|row| Ok(serde_json::from_str(row.str(0)?)?)).collect()
}

fn doc<D: serde::de::DeserializeOwned>(row: Option<Row>) -> StoreResult<Option<D>> {
    row.map(|row| Ok(serde_json::from_str(row.str(0)?)?)).transpose()
}

pub(crate) async fn action_definitions<T: Tx>(tx: &mut T, namespace: &str) -> StoreResult<Vec<ActionDefinition>> {
    let sql = "SELECT doc FROM action_definitions WHERE namespace = $1 ORDER BY activity_type";
    docs(tx.query(sql, &args![namespace]).await?)
}

pub(crate) async fn ledger_entries<T: Tx>(
    tx: &mut T,
    namespace: &str,
    filter: &LedgerFilter,
    limit: usize,
) -> StoreResult<Vec<LedgerEntry>> {
    let sql = "SELECT doc FROM ledger_entries WHERE namespace = $1 AND (CAST($2 AS TEXT) IS NULL OR state = $2)
                 AND (CAST($3 AS TEXT) IS NULL OR workflow_id = $3) AND (CAST($4 AS TEXT) IS NULL OR activity_type = $4)
               ORDER BY dispatched_at, ledger_key LIMIT $5";
    let args = args![
        namespace,
        filter.state.map(|s| s.as_str()),
        &filter.workflow_id,
        &filter.activity_type,
        limit as i64
    ];
    docs(tx.query(sql, &args).await?)
}

pub(crate) async fn ledger_entry<T: Tx>(tx: &mut T, namespace: &str, ledger_key: &str) -> StoreResult<Option<LedgerEntry>> {
    let sql = "SELECT doc FROM ledger_entries WHERE namespace = $1 AND ledger_key = $2";
    doc(tx.query_opt(sql, &args![namespace, ledger_key]).await?)
}

pub(crate) async fn ledger_stats<T: Tx>(tx: &mut T) -> StoreResult<LedgerStats> {
    let sql = "SELECT namespace, state, COUNT(*), MIN(dispatched_at) FROM ledger_entries GROUP BY namespace, state";
    let entries = tx
        .query(sql, &[])
        .await?
        .iter()
        .map(|r| Ok((r.text(0)?, r.text(1)?, r.int(2)?, r.int(3)?)))
        .collect::<StoreResult<_>>()?;
    let sql = "SELECT namespace, COUNT(*) FROM integrity_incidents WHERE state = 'open' GROUP BY namespace";
    let open_incidents = tx
        .query(sql, &[])
        .await?
        .iter()
        .map(|r| Ok((r.text(0)?, r.int(1)?)))
        .collect::<StoreResult<_>>()?;
    Ok(LedgerStats { entries, open_incidents })
}

pub(crate) async fn integrity_incidents<T: Tx>(tx: &mut T, namespace: &str, state: Option<&str>) -> StoreResult<Vec<IntegrityIncident>> {
    let sql = "SELECT doc FROM integrity_incidents WHERE namespace = $1 AND (CAST($2 AS TEXT) IS NULL OR state = $2)
               ORDER BY opened_at, incident_id";
    docs(tx.query(sql, &args![namespace, state]).await?)
}

/// Every run after `after` in id order, a page at a time (the offline verifier walks them).
pub(crate) async fn runs_page<T: Tx>(tx: &mut T, after: &str, limit: usize) -> StoreResult<Vec<(String, WorkflowId, RunId)>> {
    let sql = "SELECT namespace, workflow_id, run_id FROM runs WHERE run_id > $1 ORDER BY run_id LIMIT $2";
    let rows = tx.query(sql, &args![after, limit as i64]).await?;
    rows.iter()
        .map(|r| Ok((r.text(0)?, WorkflowId(r.text(1)?), RunId(r.text(2)?))))
        .collect()
}

pub(crate) async fn ledger_instances<T: Tx>(tx: &mut T) -> StoreResult<Vec<(String, WorkflowId)>> {
    let sql = "SELECT DISTINCT namespace, workflow_id FROM ledger_checkpoints ORDER BY namespace, workflow_id";
    let rows = tx.query(sql, &[]).await?;
    rows.iter().map(|r| Ok((r.text(0)?, WorkflowId(r.text(1)?)))).collect()
}

/// The intent hash and receipt stored for a keyed command, if it ran.
pub(crate) async fn retained_command<T: Tx>(
    tx: &mut T,
    namespace: &str,
    workflow_id: &WorkflowId,
    command_type: &str,
    request_id: &str,
) -> StoreResult<Option<(String, Value)>> {
    let sql = "SELECT intent_hash, receipt FROM command_requests WHERE namespace = $1 AND workflow_id = $2 AND command_type = $3 AND request_id = $4";
    let row = tx
        .query_opt(sql, &args![namespace, workflow_id.as_str(), command_type, request_id])
        .await?;
    row.map(|row| Ok((row.text(0)?, serde_json::from_str(row.str(1)?)?))).transpose()
}

/// A workflow's ledger checkpoints, in chain order.
pub(crate) async fn ledger_checkpoints<T: Tx>(tx: &mut T, namespace: &str, workflow_id: &WorkflowId) -> StoreResult<Vec<LedgerCheckpoint>> {
    // SQLite has one writer, so its rows' order is the order they were recorded in; the
    // shared databases have no such order, so the chain's links give it.
    let by_rowid = tx.dialect() == Dialect::Sqlite;
    let sql = if by_rowid {
        "SELECT doc FROM ledger_checkpoints WHERE namespace = $1 AND workflow_id = $2 ORDER BY rowid"
    } else {
        "SELECT doc FROM ledger_checkpoints WHERE namespace = $1 AND workflow_id = $2"
    };
    let rows = tx.query(sql, &args![namespace, workflow_id.as_str()]).await?;
    let checkpoints = rows
        .iter()
        .map(|row| serde_json::from_str(row.str(0)?).map_err(StoreError::from))
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(if by_rowid { checkpoints } else { crate::chain_order(checkpoints) })
}
