//! `/api/system/*` (admin): JSON metrics and the system duties on demand. The duties also run by
//! themselves (the clock applies deadlines within about a second, and removes expired workflows
//! every minute); these routes show what is pending and run a pass now. Every pass is safe on
//! any node, at the same time as the background duties.

use crate::auth::Role;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::Fields;
use crate::{clock, render, Shared};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use capstan_app::duties::{self, RetentionScope};
use capstan_engine::Reason;
use capstan_engine::{CommandId, RunId, WorkflowId};
use capstan_store::{RunLocator, Store, StoreError};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

const PASS_IDS_MAX: usize = 100;
const LIMIT_DEFAULT: usize = 100;
const LIMIT_MAX: usize = 1000;

fn admin<S: Store>(state: &Shared<S>, headers: &HeaderMap) -> ApiResult<()> {
    state.config.auth.require(headers, &[Role::Admin]).map(|_| ())
}

fn limit_of(params: &HashMap<String, String>) -> ApiResult<usize> {
    super::audit::limit_param(params, LIMIT_DEFAULT, LIMIT_MAX)
}

async fn counts_json<S: Store>(state: &Shared<S>, namespace: &str) -> ApiResult<Value> {
    let now = state.now();
    let counts = state.store.system_counts(namespace, now).await?;
    let mut tasks = Map::new();
    for (kind, status, count) in &counts.tasks {
        let entry = tasks.entry(kind.clone()).or_insert_with(|| json!({"ready": 0, "leased": 0}));
        entry[status.as_str()] = json!(count);
    }
    let workers = state.store.workers(namespace).await?;
    let stale = workers
        .iter()
        .filter(|w| capstan_app::workers::Cadence::of(&w.document).stale(w.last_heartbeat_at, now))
        .count();
    Ok(json!({
        "namespace": namespace,
        "generated_at": render::time(now),
        "runs": counts.runs_by_status.iter().map(|(s, c)| (s.clone(), json!(c))).collect::<Map<_, _>>(),
        "tasks": tasks,
        "backlog": counts.tasks.iter().filter(|t| t.1 == "ready").map(|t| t.2).sum::<i64>(),
        "expired_leases": counts.expired_leases,
        "workers": {"total": workers.len(), "active": workers.len() - stale, "stale": stale},
    }))
}

pub async fn metrics<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    admin(&state, &headers)?;
    Ok(Json(counts_json(&state, &namespace).await?))
}

pub async fn operator_metrics<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    admin(&state, &headers)?;
    let mut body = counts_json(&state, &namespace).await?;
    let ledger = state.store.ledger_stats().await?;
    let unknown: i64 = ledger
        .entries
        .iter()
        .filter(|(ns, s, _, _)| ns == &namespace && s == "outcome_unknown")
        .map(|(_, _, n, _)| *n)
        .sum();
    body["ledger"] = json!({"outcome_unknown": unknown,
        "integrity_incidents_open": ledger.open_incidents.iter().filter(|(ns, _)| ns == &namespace).map(|(_, n)| *n).sum::<i64>()});
    Ok(Json(body))
}

/// Where the kept run counts differ from a full count of the namespace's runs (which this reads
/// whole): a check, for `capstan verify` and operators.
pub async fn run_counts<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    admin(&state, &headers)?;
    let drift = state.store.run_count_drift(Some(&namespace)).await?;
    Ok(Json(json!({
        "namespace": namespace,
        "exact": drift.is_empty(),
        "drift": drift.iter().map(|d| json!({
            "workflow_type": d.key.workflow_type, "task_queue": d.key.task_queue, "class": d.key.class,
            "current": d.key.current, "kept": d.kept, "counted": d.counted,
        })).collect::<Vec<_>>(),
    })))
}

/// Rebuilds the namespace's kept run counts from a full count.
pub async fn rebuild_run_counts<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    admin(&state, &headers)?;
    let rebuilt = duties::rebuild_run_counts(&state.store, &namespace).await?;
    Ok(Json(json!({"namespace": namespace, "keys_rebuilt": rebuilt})))
}

pub async fn repair_status<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    admin(&state, &headers)?;
    let counts = state.store.system_counts(&namespace, state.now()).await?;
    Ok(Json(json!({
        "namespace": namespace,
        "policy": {
            "expired_workflow_task_leases": "re-dispatched by the background clock within about a second of expiry",
            "expired_activity_attempts": "retried or failed under their policy by the background clock",
            "outcome_unknown": "never repaired: an operator resolves the ledger entry",
        },
        "expired_leases": counts.expired_leases,
        "candidates": counts.expired_lease_runs.iter().map(|(w, r)| json!({"workflow_id": w, "run_id": r})).collect::<Vec<_>>(),
    })))
}

/// Repairs the given instance, the given runs, or else every run whose workflow-task lease has
/// expired. A run that needs nothing is left untouched (no history event).
pub async fn repair_pass<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    admin(&state, &headers)?;
    let f = Fields::new(&body);
    let run_ids = f.string_list("run_ids")?;
    if run_ids.len() > PASS_IDS_MAX {
        return Err(ApiError::validation("run_ids", format!("At most {PASS_IDS_MAX} run ids per pass.")));
    }
    let instance = f.opt_str("instance_id", 128)?;
    let now = state.now();
    let candidates = state.store.system_counts(&namespace, now).await?.expired_lease_runs;
    let targets: Vec<RunLocator> = if let Some(workflow_id) = instance {
        vec![RunLocator::Current(WorkflowId(workflow_id))]
    } else if !run_ids.is_empty() {
        candidates
            .iter()
            .filter(|(_, r)| run_ids.contains(r))
            .map(|(w, r)| RunLocator::Run(WorkflowId(w.clone()), RunId(r.clone())))
            .collect()
    } else {
        candidates
            .iter()
            .map(|(w, r)| RunLocator::Run(WorkflowId(w.clone()), RunId(r.clone())))
            .collect()
    };
    let (mut repaired, mut not_needed, mut refused) = (0, 0, Vec::new());
    for locator in targets {
        let command_id = CommandId(state.new_id());
        let result = state
            .store
            .mutate_run(&namespace, locator.clone(), now, move |run, cx| {
                let outcome = capstan_engine::repair(run, cx, command_id)?;
                if outcome.dispatched {
                    Ok(true)
                } else {
                    // Nothing was stuck: leave the run exactly as it was.
                    Err(capstan_engine::Refusal::new(
                        capstan_engine::Reason::RunNotActive,
                        "repair not needed",
                    ))
                }
            })
            .await;
        match result {
            Ok((_, run)) => {
                repaired += 1;
                state.run_changed(&run);
            }
            Err(StoreError::Refused(r)) if r.message == "repair not needed" => not_needed += 1,
            Err(StoreError::Refused(r)) => refused.push(json!({"target": format!("{locator:?}"), "reason": r.reason.as_str()})),
            Err(error) => return Err(error.into()),
        }
    }
    Ok(Json(
        json!({"namespace": namespace, "repaired": repaired, "not_needed": not_needed, "refused": refused}),
    ))
}

pub async fn activity_timeouts<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    admin(&state, &headers)?;
    let counts = state.store.system_counts(&namespace, state.now()).await?;
    Ok(Json(json!({
        "namespace": namespace,
        "policy": "start-to-close, schedule-to-start, schedule-to-close and heartbeat timeouts are enforced by the background clock",
        "overdue_count": counts.expired_leases,
    })))
}

/// Applies every due deadline now (timeouts included), on whichever node receives it.
pub async fn activity_timeouts_pass<S: Store>(
    State(state): State<Shared<S>>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    admin(&state, &headers)?;
    let f = Fields::new(&body);
    f.opt_int("limit", 1, LIMIT_MAX as i64)?;
    if f.string_list("execution_ids")?.len() > PASS_IDS_MAX {
        return Err(ApiError::validation(
            "execution_ids",
            format!("At most {PASS_IDS_MAX} execution ids per pass."),
        ));
    }
    let processed = clock::apply_due(&state, state.now()).await?;
    Ok(Json(json!({"processed": processed})))
}

async fn retention_days<S: Store>(state: &Shared<S>, namespace: &str) -> ApiResult<Option<i64>> {
    Ok(state
        .store
        .namespaces()
        .await?
        .into_iter()
        .find(|n| n.name == namespace)
        .and_then(|n| n.retention_days))
}

pub async fn retention_status<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    admin(&state, &headers)?;
    let limit = limit_of(&params)?;
    let days = retention_days(&state, &namespace).await?;
    let now = state.now();
    let cutoff = days.map(|d| now - d * 86_400_000);
    let expired = match cutoff {
        Some(cutoff) => state.store.expired_instances(&namespace, cutoff, limit).await?,
        None => Vec::new(),
    };
    Ok(Json(json!({
        "namespace": namespace,
        "retention_days": days,
        "cutoff": render::opt_time(cutoff),
        "expired_workflow_ids": expired.iter().map(|e| e.0.clone()).collect::<Vec<_>>(),
        "expired_run_ids": expired.iter().map(|e| e.1.clone()).collect::<Vec<_>>(),
    })))
}

pub async fn retention_pass<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    admin(&state, &headers)?;
    let f = Fields::new(&body);
    let limit = f.opt_int("limit", 1, LIMIT_MAX as i64)?.unwrap_or(LIMIT_DEFAULT as i64) as usize;
    let run_ids = f.string_list("run_ids")?;
    if run_ids.len() > PASS_IDS_MAX {
        return Err(ApiError::validation("run_ids", format!("At most {PASS_IDS_MAX} run ids per pass.")));
    }
    let Some(days) = retention_days(&state, &namespace).await? else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            Reason::RetentionNotConfigured,
            "This namespace keeps closed workflows forever; set retention_days on the namespace first.",
        ));
    };
    let now = state.now();
    let scope = if run_ids.is_empty() {
        RetentionScope::Oldest(limit)
    } else {
        RetentionScope::Runs {
            run_ids: &run_ids,
            scan: LIMIT_MAX,
        }
    };
    let removed = duties::retention_pass(&state.store, &namespace, days, scope, now).await?;
    // What the removed instances (or nothing, past its grace) named goes with them.
    let collected = crate::payload_storage::collect_unused(&state).await?;
    Ok(Json(json!({
        "namespace": namespace, "retention_days": days, "pruned": removed.len(), "workflow_ids": removed,
        "external_payloads_deleted": collected.deleted,
    })))
}
