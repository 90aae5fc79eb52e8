//! Namespaces: list, create, update, delete (only an empty one other than `default`).

use crate::tx::{args, locking, Locking, Row, Tx};
use crate::*;

const LOCK_NAMESPACE: Locking = locking!(
    "SELECT name, description, created_at, doc FROM namespaces WHERE name = $1",
    "FOR UPDATE"
);

fn namespace_of(row: &Row) -> StoreResult<NamespaceRecord> {
    Ok(namespace_from_row(
        row.text(0)?,
        row.opt_str(1)?.map(str::to_string),
        row.int(2)?,
        row.opt_str(3)?.map(str::to_string),
    ))
}

pub(crate) async fn namespace_exists<T: Tx>(tx: &mut T, namespace: &str) -> StoreResult<bool> {
    Ok(tx
        .query_opt("SELECT 1 FROM namespaces WHERE name = $1", &args![namespace])
        .await?
        .is_some())
}

pub(crate) async fn namespaces<T: Tx>(tx: &mut T) -> StoreResult<Vec<NamespaceRecord>> {
    let rows = tx
        .query("SELECT name, description, created_at, doc FROM namespaces ORDER BY name", &[])
        .await?;
    rows.iter().map(namespace_of).collect()
}

pub(crate) async fn create_namespace<T: Tx>(tx: &mut T, record: NamespaceRecord) -> StoreResult<NamespaceRecord> {
    let doc = serde_json::to_string(&record)?;
    let sql = "INSERT INTO namespaces (name, description, created_at, doc) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";
    let inserted = tx
        .execute(sql, &args![&record.name, &record.description, record.created_at, doc.as_str()])
        .await?;
    if inserted == 0 {
        return Err(Refusal::new(
            Reason::NamespaceAlreadyExists,
            format!("Namespace {:?} already exists.", record.name),
        )
        .with("namespace", record.name.clone())
        .into());
    }
    Ok(record)
}

async fn locked<T: Tx>(tx: &mut T, name: &str) -> StoreResult<NamespaceRecord> {
    let row = tx.query_opt(LOCK_NAMESPACE.sql(tx.dialect()), &args![name]).await?;
    row.as_ref().map(namespace_of).transpose()?.ok_or_else(|| namespace_missing(name))
}

pub(crate) async fn update_namespace<T: Tx>(
    tx: &mut T,
    name: &str,
    description: Option<String>,
    retention_days: Option<i64>,
    now: Millis,
) -> StoreResult<NamespaceRecord> {
    let mut record = locked(tx, name).await?;
    if description.is_some() {
        record.description = description;
    }
    if retention_days.is_some() {
        record.retention_days = retention_days;
    }
    record.updated_at = now;
    let doc = serde_json::to_string(&record)?;
    let sql = "UPDATE namespaces SET description = $2, doc = $3 WHERE name = $1";
    tx.execute(sql, &args![name, &record.description, doc.as_str()]).await?;
    Ok(record)
}

pub(crate) async fn set_external_storage<T: Tx>(
    tx: &mut T,
    name: &str,
    policy: Option<ExternalStoragePolicy>,
    now: Millis,
) -> StoreResult<NamespaceRecord> {
    let mut record = locked(tx, name).await?;
    record.external_payload_storage = policy;
    record.updated_at = now;
    let doc = serde_json::to_string(&record)?;
    tx.execute("UPDATE namespaces SET doc = $2 WHERE name = $1", &args![name, doc.as_str()])
        .await?;
    Ok(record)
}

pub(crate) async fn delete_namespace<T: Tx>(tx: &mut T, name: &str) -> StoreResult<NamespaceRecord> {
    let record = locked(tx, name).await?;
    let count = tx
        .query_opt("SELECT COUNT(*) FROM workflow_instances WHERE namespace = $1", &args![name])
        .await?;
    let workflows = count.map(|row| row.int(0)).transpose()?.unwrap_or(0);
    if name == "default" || workflows > 0 {
        return Err(Refusal::new(
            Reason::NamespaceNotEmpty,
            "Only an empty namespace other than default can be deleted.",
        )
        .with("namespace", name)
        .with("workflows", workflows)
        .into());
    }
    for sql in [
        "DELETE FROM namespaces WHERE name = $1",
        "DELETE FROM workers WHERE namespace = $1",
        "DELETE FROM action_definitions WHERE namespace = $1",
    ] {
        tx.execute(sql, &args![name]).await?;
    }
    Ok(record)
}
