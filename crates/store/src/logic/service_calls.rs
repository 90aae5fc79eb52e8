//! Nexus service calls' rows: one `service_calls` row per admitted call (unique per target route
//! and idempotency key, so a concurrent second admission of a key is refused and retried). What a
//! transition admits, links, cancels or settles, with the caller steps waiting in
//! `service_call_waiters`, is written among persist's follow-ons (`persist.rs`).

use crate::tx::{args, Row, Tx};
use crate::*;
use capstan_engine::service_call::{RouteKey, ServiceCallRecord};

const COLUMNS: &str = "service_call_id, doc";

fn record_of(row: &Row) -> StoreResult<ServiceCallRecord> {
    let id = row.text(0)?;
    serde_json::from_str(row.str(1)?).map_err(|error| StoreError::Corrupt {
        record: format!("service call {id}"),
        detail: error.to_string(),
    })
}

/// Inserts a call admitted by a transition; a call already holding its route and key is a
/// conflict (the transaction rolls back and the admission is applied again against it).
pub(crate) async fn insert<T: Tx>(tx: &mut T, call: &ServiceCallRecord) -> StoreResult<()> {
    let doc = serde_json::to_string(call)?;
    let (namespace, endpoint, service, operation) = &call.route;
    let args = args![
        &call.service_call_id,
        namespace,
        endpoint,
        service,
        operation,
        &call.idempotency_key,
        &call.caller_namespace,
        call.caller_workflow_id.as_ref().map(|w| w.as_str()),
        call.caller_run_id.as_ref().map(|r| r.as_str()),
        call.linked_run_id.as_ref().map(|r| r.as_str()),
        &call.status,
        call.created_at,
        call.updated_at,
        doc.as_str(),
    ];
    let sql = "INSERT INTO service_calls (service_call_id, namespace, endpoint_name, service_name, operation_name,
             idempotency_key, caller_namespace, caller_workflow_id, caller_run_id, linked_run_id, status,
             created_at, updated_at, doc)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) ON CONFLICT DO NOTHING";
    if tx.execute(sql, &args).await? == 0 {
        return Err(StoreError::Conflict {
            constraint: "service_calls_route_key".into(),
            message: format!("a call with idempotency key {:?} was admitted meanwhile", call.idempotency_key),
        });
    }
    Ok(())
}

pub(super) async fn save<T: Tx>(tx: &mut T, call: &ServiceCallRecord) -> StoreResult<()> {
    let doc = serde_json::to_string(call)?;
    let sql = "UPDATE service_calls SET status = $2, updated_at = $3, doc = $4 WHERE service_call_id = $1";
    tx.execute(sql, &args![&call.service_call_id, &call.status, call.updated_at, doc.as_str()])
        .await?;
    Ok(())
}

pub(crate) async fn find<T: Tx>(tx: &mut T, service_call_id: &str) -> StoreResult<Option<ServiceCallRecord>> {
    let sql = format!("SELECT {COLUMNS} FROM service_calls WHERE service_call_id = $1");
    tx.query_opt(&sql, &args![service_call_id])
        .await?
        .as_ref()
        .map(record_of)
        .transpose()
}

pub(crate) async fn find_by_key<T: Tx>(tx: &mut T, route: &RouteKey, idempotency_key: &str) -> StoreResult<Option<ServiceCallRecord>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM service_calls WHERE namespace = $1 AND endpoint_name = $2 AND service_name = $3
           AND operation_name = $4 AND idempotency_key = $5"
    );
    let args = args![&route.namespace, &route.endpoint, &route.service, &route.operation, idempotency_key];
    tx.query_opt(&sql, &args).await?.as_ref().map(record_of).transpose()
}

/// The calls a caller instance made (one run, or all its runs), oldest first.
pub(crate) async fn of_caller<T: Tx>(
    tx: &mut T,
    caller_namespace: &str,
    workflow_id: &str,
    run_id: Option<&str>,
    limit: usize,
) -> StoreResult<Vec<ServiceCallRecord>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM service_calls WHERE caller_namespace = $1 AND caller_workflow_id = $2
           AND ($3 = '' OR caller_run_id = $3) ORDER BY created_at, service_call_id LIMIT $4"
    );
    let args = args![caller_namespace, workflow_id, run_id.unwrap_or(""), limit as i64];
    tx.query(&sql, &args).await?.iter().map(record_of).collect()
}

/// Whether an operation's `cancellation_policy` cancels a call's linked run with the call.
pub fn propagates(doc: &Map<String, Value>) -> bool {
    doc.get("cancellation_policy")
        .and_then(|policy| policy.get("propagate_to_linked_workflow"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}
