//! The background clock: fires timers, times runs out, expires leases and activity timeouts,
//! without any worker traffic. It sleeps until the earliest pending deadline (at most a second),
//! or until a change kicks it, so work that is due is never waiting on a poll.

use crate::routes::after_change;
use crate::AppState;
use capstan_app::duties;
use capstan_store::Store;
use std::sync::Arc;
use std::time::Duration;

const BATCH: usize = 256;
const IDLE_RECHECK_MS: i64 = 1_000;

/// The retention duty runs this often, removing at most this many instances per namespace a pass.
const RETENTION_EVERY_MS: i64 = 60_000;
const RETENTION_BATCH: usize = 500;

/// Poll memos only need to outlive a lease; older ones are pruned this often.
const PRUNE_EVERY_MS: i64 = 60_000;
const POLL_MEMO_TTL_MS: i64 = 3_600_000;

pub async fn run<S: Store>(state: Arc<AppState<S>>) {
    let mut pruned_at = 0;
    let mut retained_at = 0;
    loop {
        let now = state.now();
        if now - pruned_at >= PRUNE_EVERY_MS {
            pruned_at = now;
            if let Err(error) = state.store.prune(now - POLL_MEMO_TTL_MS).await {
                tracing::warn!(%error, "clock: could not prune poll memos");
            }
        }
        let due = match apply_due(&state, now).await {
            Ok(due) => due,
            Err(error) => {
                tracing::error!(%error, "clock: could not read due tasks");
                tokio::time::sleep(Duration::from_millis(IDLE_RECHECK_MS as u64)).await;
                continue;
            }
        };
        if now - retained_at >= RETENTION_EVERY_MS {
            retained_at = now;
            for namespace in state.store.namespaces().await.unwrap_or_default() {
                if let Err(error) = retention_pass(&state, &namespace.name, namespace.retention_days, RETENTION_BATCH, now).await {
                    tracing::warn!(namespace = %namespace.name, %error, "clock: retention pass failed");
                }
            }
        }
        if due == BATCH {
            continue;
        }
        let now = state.now();
        let sleep_ms = match state.store.next_deadline().await {
            Ok(Some(next)) => (next - now).clamp(0, IDLE_RECHECK_MS),
            _ => IDLE_RECHECK_MS,
        };
        if sleep_ms == 0 {
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(sleep_ms as u64)) => {}
            _ = state.clock_kick.notified() => {}
        }
    }
}

/// Claims the tasks whose deadline has come (timers, run timeouts, expired leases, activity
/// timeouts) and applies each; returns how many were due. The clock calls it continuously; the
/// activity-timeout pass endpoint calls it on demand.
pub(crate) async fn apply_due<S: Store>(state: &Arc<AppState<S>>, now: i64) -> capstan_store::StoreResult<usize> {
    let outcomes = duties::apply_due_deadlines(&state.store, &state.config.server_id, now, BATCH, state.config.duty_lease_ms).await?;
    for outcome in &outcomes {
        let task_id = &outcome.task.task_id;
        match &outcome.result {
            Ok((true, run)) => {
                tracing::info!(namespace = %run.namespace, workflow_id = %run.workflow_id, run_id = %run.run_id,
                    task_id = %task_id, run_status = run.status.as_str(), "deadline reached");
                after_change(state, run);
            }
            Ok((false, _)) => {}
            Err(capstan_store::StoreError::Refused(refusal)) => {
                tracing::debug!(task_id = %task_id, %refusal, "clock: duty taken over by another node");
            }
            Err(error) => tracing::warn!(task_id = %task_id, %error, "clock: deadline transition failed"),
        }
    }
    Ok(outcomes.len())
}

/// Removes instances whose current run closed more than `retention_days` ago (nothing without
/// a retention). Safe on every node at once: each removal re-checks its instance in its own
/// transaction. Returns the workflow ids removed.
pub(crate) async fn retention_pass<S: Store>(
    state: &Arc<AppState<S>>,
    namespace: &str,
    retention_days: Option<i64>,
    limit: usize,
    now: i64,
) -> capstan_store::StoreResult<Vec<String>> {
    let Some(days) = retention_days else { return Ok(Vec::new()) };
    let cutoff = now - days * 86_400_000;
    let expired = state.store.expired_instances(namespace, cutoff, limit).await?;
    if expired.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<String> = expired.into_iter().map(|(workflow_id, _, _)| workflow_id).collect();
    let pruned = state.store.prune_instances(namespace, ids.clone(), cutoff).await?;
    tracing::info!(namespace, pruned, retention_days = days, "retention: closed workflows removed");
    Ok(ids)
}
