//! The audit trail of what a request did to an instance without writing its history (a query):
//! who asked, what, when. Rows live and are pruned with their instance.

use crate::tx::{args, Tx};
use crate::*;

const INSERT_AUDIT_EVENT: &str =
    "INSERT INTO audit_events (audit_id, namespace, workflow_id, run_id, action, principal, recorded_at, detail)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

pub(crate) async fn record_audit<T: Tx>(tx: &mut T, event: &AuditEvent) -> StoreResult<()> {
    let principal = event.principal.as_ref().map(|p| p.to_json().to_string());
    let detail = serde_json::to_string(&event.detail)?;
    let args = args![
        &event.audit_id,
        &event.namespace,
        &event.workflow_id,
        &event.run_id,
        &event.action,
        &principal,
        event.recorded_at,
        detail.as_str(),
    ];
    tx.execute(INSERT_AUDIT_EVENT, &args).await.map(drop)
}

/// An instance's audit events, newest first, strictly before `before` (`(recorded_at,
/// audit_id)`) when given.
pub(crate) async fn audit_events<T: Tx>(
    tx: &mut T,
    namespace: &str,
    workflow_id: &str,
    before: Option<(Millis, String)>,
    limit: usize,
) -> StoreResult<Vec<AuditEvent>> {
    const COLUMNS: &str = "SELECT audit_id, namespace, workflow_id, run_id, action, principal, recorded_at, detail FROM audit_events";
    let limit = limit as i64;
    let rows = match before {
        None => {
            let sql = format!("{COLUMNS} WHERE namespace = $1 AND workflow_id = $2 ORDER BY recorded_at DESC, audit_id DESC LIMIT $3");
            tx.query(&sql, &args![namespace, workflow_id, limit]).await?
        }
        Some((at, id)) => {
            let sql = format!(
                "{COLUMNS} WHERE namespace = $1 AND workflow_id = $2 AND (recorded_at < $3 OR (recorded_at = $3 AND audit_id < $4))
                 ORDER BY recorded_at DESC, audit_id DESC LIMIT $5"
            );
            tx.query(&sql, &args![namespace, workflow_id, at, id.as_str(), limit]).await?
        }
    };
    rows.iter()
        .map(|row| {
            let principal = match row.opt_str(5)? {
                Some(text) => capstan_engine::Principal::from_json(&serde_json::from_str(text)?),
                None => None,
            };
            Ok(AuditEvent {
                audit_id: row.text(0)?,
                namespace: row.text(1)?,
                workflow_id: row.text(2)?,
                run_id: row.opt_str(3)?.map(str::to_string),
                action: row.text(4)?,
                principal,
                recorded_at: row.int(6)?,
                detail: serde_json::from_str(row.str(7)?)?,
            })
        })
        .collect()
}
