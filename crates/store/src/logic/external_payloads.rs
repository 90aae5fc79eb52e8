//! External payloads: the rows of bytes uploaded to the runtime transport, which workflow
//! instances use them, and which may go. A use is recorded in the transaction that writes the
//! state naming the reference (history, run document, stream items), so a payload is
//! collectable exactly when no stored instance names it.

use crate::tx::{args, Tx};
use crate::*;
use capstan_engine::payload::runtime_reference_ids;

const INSERT_PAYLOAD: &str = "INSERT INTO external_payloads (reference_id, namespace, codec, size_bytes, sha256, location, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7)";
const SELECT_PAYLOAD: &str = "SELECT reference_id, namespace, codec, size_bytes, sha256, location, created_at
     FROM external_payloads WHERE namespace = $1 AND reference_id = $2";
const INSERT_USE: &str =
    "INSERT INTO external_payload_uses (reference_id, namespace, workflow_id) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
const UNUSED_PAYLOADS: &str = "SELECT reference_id, namespace, codec, size_bytes, sha256, location, created_at
     FROM external_payloads p
     WHERE p.created_at < $1
       AND NOT EXISTS (SELECT 1 FROM external_payload_uses u WHERE u.reference_id = p.reference_id AND u.namespace = p.namespace)
     ORDER BY p.created_at LIMIT $2";
/// Only while still unused: a use committed since the listing keeps the row.
const FORGET_UNUSED: &str = "DELETE FROM external_payloads WHERE reference_id = $1 AND namespace = $2
       AND NOT EXISTS (SELECT 1 FROM external_payload_uses u WHERE u.reference_id = $1 AND u.namespace = $2)";

fn record_of(row: &crate::tx::Row) -> StoreResult<ExternalPayloadRecord> {
    Ok(ExternalPayloadRecord {
        reference_id: row.text(0)?,
        namespace: row.text(1)?,
        codec: row.text(2)?,
        size_bytes: row.int(3)?,
        sha256: row.text(4)?,
        location: row.text(5)?,
        created_at: row.int(6)?,
    })
}

pub(crate) async fn insert<T: Tx>(tx: &mut T, record: &ExternalPayloadRecord) -> StoreResult<()> {
    let args = args![
        &record.reference_id,
        &record.namespace,
        &record.codec,
        record.size_bytes,
        &record.sha256,
        &record.location,
        record.created_at,
    ];
    tx.execute(INSERT_PAYLOAD, &args).await?;
    Ok(())
}

pub(crate) async fn find<T: Tx>(tx: &mut T, namespace: &str, reference_id: &str) -> StoreResult<Option<ExternalPayloadRecord>> {
    tx.query_opt(SELECT_PAYLOAD, &args![namespace, reference_id])
        .await?
        .as_ref()
        .map(record_of)
        .transpose()
}

/// Records that the instance's stored state names every runtime reference in `texts`.
pub(crate) async fn record_uses<T: Tx>(tx: &mut T, namespace: &str, workflow_id: &str, texts: &[&str]) -> StoreResult<()> {
    let mut ids: Vec<&str> = texts.iter().flat_map(|text| runtime_reference_ids(text)).collect();
    ids.sort_unstable();
    ids.dedup();
    for id in ids {
        tx.execute(INSERT_USE, &args![id, namespace, workflow_id]).await?;
    }
    Ok(())
}

/// [`record_uses`] for a text written under a run id alone (a stream item).
pub(crate) async fn record_uses_of_run<T: Tx>(tx: &mut T, run_id: &str, text: &str) -> StoreResult<()> {
    if runtime_reference_ids(text).next().is_none() {
        return Ok(());
    }
    let sql = "SELECT namespace, workflow_id FROM runs WHERE run_id = $1";
    if let Some(row) = tx.query_opt(sql, &args![run_id]).await? {
        record_uses(tx, row.str(0)?, row.str(1)?, &[text]).await?;
    }
    Ok(())
}

pub(crate) async fn unused<T: Tx>(tx: &mut T, created_before: Millis, limit: i64) -> StoreResult<Vec<ExternalPayloadRecord>> {
    let rows = tx.query(UNUSED_PAYLOADS, &args![created_before, limit]).await?;
    rows.iter().map(record_of).collect()
}

pub(crate) async fn forget_unused<T: Tx>(tx: &mut T, namespace: &str, reference_id: &str) -> StoreResult<bool> {
    Ok(tx.execute(FORGET_UNUSED, &args![reference_id, namespace]).await? > 0)
}
