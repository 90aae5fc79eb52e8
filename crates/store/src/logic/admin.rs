//! Per-namespace settings records: bridge deliveries, build-id rollouts, search-attribute
//! definitions.

use crate::tx::{args, Tx};
use crate::*;
use capstan_engine::visibility::AttributeType;
use std::collections::BTreeMap;

const BRIDGE_OUTCOME: &str = "SELECT outcome FROM bridge_deliveries WHERE namespace = $1 AND adapter = $2 AND idempotency_key = $3";
const SET_DRAIN: &str = "INSERT INTO build_id_rollouts (namespace, task_queue, build_id, drain_intent, drained_at, updated_at)
     VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (namespace, task_queue, build_id) DO UPDATE SET
       drain_intent = excluded.drain_intent, updated_at = excluded.updated_at,
       drained_at = CASE WHEN excluded.drain_intent = 'draining'
                         THEN COALESCE(build_id_rollouts.drained_at, excluded.drained_at) ELSE NULL END";
const PROMOTE: &str = "INSERT INTO build_id_rollouts (namespace, task_queue, build_id, drain_intent, drained_at, updated_at, promoted_at)
     VALUES ($1, $2, $3, 'active', NULL, $4, $4)
     ON CONFLICT (namespace, task_queue, build_id) DO UPDATE SET updated_at = excluded.updated_at,
       promoted_at = COALESCE(build_id_rollouts.promoted_at, excluded.promoted_at)";
const ROLLOUT: &str =
    "SELECT drain_intent, drained_at, promoted_at FROM build_id_rollouts WHERE namespace = $1 AND task_queue = $2 AND build_id = $3";

pub(crate) async fn bridge_delivery<T: Tx>(tx: &mut T, namespace: &str, adapter: &str, key: &str) -> StoreResult<Option<Value>> {
    let row = tx.query_opt(BRIDGE_OUTCOME, &args![namespace, adapter, key]).await?;
    row.map(|row| Ok(serde_json::from_str(row.str(0)?)?)).transpose()
}

/// Records the first outcome of `(adapter, key)`; a repeat gets the first one back instead.
pub(crate) async fn record_bridge_delivery<T: Tx>(
    tx: &mut T,
    namespace: &str,
    adapter: &str,
    key: &str,
    outcome: &Value,
    now: Millis,
) -> StoreResult<Option<Value>> {
    let sql = "INSERT INTO bridge_deliveries (namespace, adapter, idempotency_key, outcome, created_at) VALUES ($1, $2, $3, $4, $5)
               ON CONFLICT DO NOTHING";
    let text = outcome.to_string();
    if tx.execute(sql, &args![namespace, adapter, key, text.as_str(), now]).await? == 1 {
        return Ok(None);
    }
    bridge_delivery(tx, namespace, adapter, key).await
}

pub(crate) async fn build_id_rollouts<T: Tx>(tx: &mut T, namespace: &str, queue: &str) -> StoreResult<Vec<BuildIdRollout>> {
    let sql = "SELECT build_id, drain_intent, drained_at, updated_at, promoted_at FROM build_id_rollouts
               WHERE namespace = $1 AND task_queue = $2 ORDER BY build_id";
    let rows = tx.query(sql, &args![namespace, queue]).await?;
    rows.iter()
        .map(|r| {
            let build_id = r.text(0)?;
            Ok(BuildIdRollout {
                build_id: (!build_id.is_empty()).then_some(build_id),
                drain_intent: r.text(1)?,
                drained_at: r.opt_int(2)?,
                updated_at: r.int(3)?,
                promoted_at: r.opt_int(4)?,
            })
        })
        .collect()
}

/// `(drain intent, drained at, promoted at)` of one cohort (the unversioned one is `""`).
async fn rollout<T: Tx>(tx: &mut T, namespace: &str, queue: &str, key: &str) -> StoreResult<(String, Option<Millis>, Option<Millis>)> {
    let row = tx.query_opt(ROLLOUT, &args![namespace, queue, key]).await?;
    let row = row.ok_or_else(|| StoreError::Storage(format!("build-id rollout {key:?} of {queue:?} vanished in its own transaction")))?;
    Ok((row.text(0)?, row.opt_int(1)?, row.opt_int(2)?))
}

pub(crate) async fn set_build_id_drain<T: Tx>(
    tx: &mut T,
    namespace: &str,
    queue: &str,
    build_id: Option<String>,
    draining: bool,
    now: Millis,
) -> StoreResult<BuildIdRollout> {
    let key = build_id.clone().unwrap_or_default();
    let intent = if draining { "draining" } else { "active" };
    let args = args![namespace, queue, key.as_str(), intent, draining.then_some(now), now];
    tx.execute(SET_DRAIN, &args).await?;
    let (_, drained_at, promoted_at) = rollout(tx, namespace, queue, &key).await?;
    Ok(BuildIdRollout {
        build_id,
        drain_intent: intent.into(),
        drained_at,
        updated_at: now,
        promoted_at,
    })
}

/// Promotes one cohort of a queue (new starts naming no build follow it); the others lose it.
pub(crate) async fn promote_build_id<T: Tx>(
    tx: &mut T,
    namespace: &str,
    queue: &str,
    build_id: Option<String>,
    now: Millis,
) -> StoreResult<BuildIdRollout> {
    let key = build_id.clone().unwrap_or_default();
    let demote = "UPDATE build_id_rollouts SET promoted_at = NULL WHERE namespace = $1 AND task_queue = $2 AND build_id <> $3";
    tx.execute(demote, &args![namespace, queue, key.as_str()]).await?;
    tx.execute(PROMOTE, &args![namespace, queue, key.as_str(), now]).await?;
    let (drain_intent, drained_at, promoted_at) = rollout(tx, namespace, queue, &key).await?;
    Ok(BuildIdRollout {
        build_id,
        drain_intent,
        drained_at,
        updated_at: now,
        promoted_at,
    })
}

/// The namespace's defined attributes; a kind this build does not know is left out.
pub(crate) async fn search_attribute_definitions<T: Tx>(tx: &mut T, namespace: &str) -> StoreResult<BTreeMap<String, AttributeType>> {
    let sql = "SELECT name, kind FROM search_attribute_definitions WHERE namespace = $1";
    let rows = tx.query(sql, &args![namespace]).await?;
    let mut definitions = BTreeMap::new();
    for row in &rows {
        if let Some(kind) = AttributeType::parse(row.str(1)?) {
            definitions.insert(row.text(0)?, kind);
        }
    }
    Ok(definitions)
}

pub(crate) async fn define_search_attribute<T: Tx>(
    tx: &mut T,
    namespace: &str,
    name: &str,
    kind: AttributeType,
    now: Millis,
) -> StoreResult<()> {
    let sql = "INSERT INTO search_attribute_definitions (namespace, name, kind, created_at) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";
    if tx.execute(sql, &args![namespace, name, kind.as_str(), now]).await? == 0 {
        return Err(search_attribute_exists(name));
    }
    Ok(())
}

pub(crate) async fn delete_search_attribute<T: Tx>(tx: &mut T, namespace: &str, name: &str) -> StoreResult<bool> {
    let sql = "DELETE FROM search_attribute_definitions WHERE namespace = $1 AND name = $2";
    Ok(tx.execute(sql, &args![namespace, name]).await? > 0)
}

/// The readiness probe's write: one tiny upsert that commits only where the database takes
/// writes now (a connection check alone passes on a read-only or demoted database).
pub(crate) async fn probe_write<T: Tx>(tx: &mut T, now: Millis) -> StoreResult<()> {
    tx.execute(
        "INSERT INTO health_probe (id, probed_at) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET probed_at = excluded.probed_at",
        &args![now / 1000],
    )
    .await?;
    Ok(())
}
