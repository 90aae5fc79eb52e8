//! The Nexus service catalog: endpoints, their services, and the services' operations, one row
//! each in `service_catalog` (a level below the row's own is ''). A child needs its parent, and a
//! parent with children is not deleted.

use crate::tx::{args, Row, Tx};
use crate::*;

const COLUMNS: &str = "namespace, endpoint_name, service_name, operation_name, entry_id, doc, created_at, updated_at";

fn entry_of(row: &Row) -> StoreResult<CatalogEntry> {
    let level = |name: String| (!name.is_empty()).then_some(name);
    Ok(CatalogEntry {
        key: CatalogKey {
            namespace: row.text(0)?,
            endpoint: row.text(1)?,
            service: level(row.text(2)?),
            operation: level(row.text(3)?),
        },
        id: row.text(4)?,
        doc: serde_json::from_str(row.str(5)?)?,
        created_at: row.int(6)?,
        updated_at: row.int(7)?,
    })
}

/// The row's four key columns ('' below its own level).
fn columns(key: &CatalogKey) -> [&str; 4] {
    [
        key.namespace.as_str(),
        key.endpoint.as_str(),
        key.service.as_deref().unwrap_or(""),
        key.operation.as_deref().unwrap_or(""),
    ]
}

pub(crate) async fn find<T: Tx>(tx: &mut T, key: &CatalogKey) -> StoreResult<Option<CatalogEntry>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM service_catalog WHERE namespace = $1 AND endpoint_name = $2 AND service_name = $3 AND operation_name = $4"
    );
    let [namespace, endpoint, service, operation] = columns(key);
    tx.query_opt(&sql, &args![namespace, endpoint, service, operation])
        .await?
        .as_ref()
        .map(entry_of)
        .transpose()
}

/// The entry, or the refusal naming its level.
async fn existing<T: Tx>(tx: &mut T, key: &CatalogKey) -> StoreResult<CatalogEntry> {
    find(tx, key).await?.ok_or_else(|| key.missing().into())
}

pub(crate) async fn create<T: Tx>(tx: &mut T, entry: CatalogEntry) -> StoreResult<CatalogEntry> {
    if let Some(parent) = entry.key.parent() {
        existing(tx, &parent).await?;
    }
    let sql = format!("INSERT INTO service_catalog ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING");
    let [namespace, endpoint, service, operation] = columns(&entry.key);
    let doc = serde_json::to_string(&entry.doc)?;
    let args = args![
        namespace,
        endpoint,
        service,
        operation,
        &entry.id,
        doc.as_str(),
        entry.created_at,
        entry.updated_at
    ];
    if tx.execute(&sql, &args).await? == 0 {
        return Err(entry.key.taken().into());
    }
    Ok(entry)
}

pub(crate) async fn update<T: Tx>(tx: &mut T, key: &CatalogKey, doc: Map<String, Value>, now: Millis) -> StoreResult<CatalogEntry> {
    let mut entry = existing(tx, key).await?;
    entry.doc = doc;
    entry.updated_at = now;
    let sql = "UPDATE service_catalog SET doc = $5, updated_at = $6
         WHERE namespace = $1 AND endpoint_name = $2 AND service_name = $3 AND operation_name = $4";
    let [namespace, endpoint, service, operation] = columns(key);
    let doc = serde_json::to_string(&entry.doc)?;
    tx.execute(sql, &args![namespace, endpoint, service, operation, doc.as_str(), now])
        .await?;
    Ok(entry)
}

/// The entries directly below `parent` (`None`: the namespace's endpoints), by name.
pub(crate) async fn children<T: Tx>(tx: &mut T, namespace: &str, parent: Option<&CatalogKey>) -> StoreResult<Vec<CatalogEntry>> {
    let rows = match parent {
        None => {
            let sql = format!(
                "SELECT {COLUMNS} FROM service_catalog WHERE namespace = $1 AND service_name = '' AND operation_name = '' ORDER BY endpoint_name"
            );
            tx.query(&sql, &args![namespace]).await?
        }
        Some(CatalogKey {
            endpoint, service: None, ..
        }) => {
            let sql = format!(
                "SELECT {COLUMNS} FROM service_catalog
                 WHERE namespace = $1 AND endpoint_name = $2 AND service_name <> '' AND operation_name = '' ORDER BY service_name"
            );
            tx.query(&sql, &args![namespace, endpoint.as_str()]).await?
        }
        Some(CatalogKey {
            endpoint,
            service: Some(service),
            ..
        }) => {
            let sql = format!(
                "SELECT {COLUMNS} FROM service_catalog
                 WHERE namespace = $1 AND endpoint_name = $2 AND service_name = $3 AND operation_name <> '' ORDER BY operation_name"
            );
            tx.query(&sql, &args![namespace, endpoint.as_str(), service.as_str()]).await?
        }
    };
    rows.iter().map(entry_of).collect()
}

pub(crate) async fn delete<T: Tx>(tx: &mut T, key: &CatalogKey) -> StoreResult<CatalogEntry> {
    let entry = existing(tx, key).await?;
    if key.operation.is_none() {
        let below = children(tx, &key.namespace, Some(key)).await?;
        if !below.is_empty() {
            return Err(key.has_children(below.len()).into());
        }
    }
    let sql = "DELETE FROM service_catalog WHERE namespace = $1 AND endpoint_name = $2 AND service_name = $3 AND operation_name = $4";
    let [namespace, endpoint, service, operation] = columns(key);
    tx.execute(sql, &args![namespace, endpoint, service, operation]).await?;
    Ok(entry)
}
