//! The background clock: fires timers, times runs out, expires leases and activity timeouts,
//! without any worker traffic. It sleeps until the earliest pending deadline (at most a second),
//! or until a change kicks it, so work that is due is never waiting on a poll.

use crate::routes::after_change;
use crate::{now_ms, AppState};
use capstan_engine::on_deadline;
use capstan_store::Store;
use std::sync::Arc;
use std::time::Duration;

const BATCH: usize = 256;
const IDLE_RECHECK_MS: i64 = 1_000;

/// Poll memos only need to outlive a lease; older ones are pruned this often.
const PRUNE_EVERY_MS: i64 = 60_000;
const POLL_MEMO_TTL_MS: i64 = 3_600_000;

pub async fn run<S: Store>(state: Arc<AppState<S>>) {
    let mut pruned_at = 0;
    loop {
        let now = now_ms();
        if now - pruned_at >= PRUNE_EVERY_MS {
            pruned_at = now;
            if let Err(error) = state.store.prune(now - POLL_MEMO_TTL_MS).await {
                tracing::warn!(%error, "clock: could not prune poll memos");
            }
        }
        let due = match state
            .store
            .claim_due_tasks(&state.config.server_id, now, BATCH, state.config.duty_lease_ms)
            .await
        {
            Ok(due) => due,
            Err(error) => {
                tracing::error!(%error, "clock: could not read due tasks");
                tokio::time::sleep(Duration::from_millis(IDLE_RECHECK_MS as u64)).await;
                continue;
            }
        };
        for task in &due {
            let id = task.task_id.clone();
            let result = state
                .store
                .run_duty(task, now, move |run, cx| {
                    let changed = on_deadline(run, cx, &id);
                    if !changed {
                        // The row disagrees with the run (deadline moved or task closed):
                        // rewrite it from the run so it is not picked up again.
                        cx.effects.touched_tasks.insert(id);
                    }
                    Ok(changed)
                })
                .await;
            match result {
                Ok((true, run)) => {
                    tracing::info!(namespace = %run.namespace, workflow_id = %run.workflow_id, run_id = %run.run_id,
                        task_id = %task.task_id, run_status = run.status.as_str(), "deadline reached");
                    after_change(&state, &run);
                }
                Ok((false, _)) => {}
                Err(capstan_store::StoreError::Refused(refusal)) => {
                    tracing::debug!(task_id = %task.task_id, %refusal, "clock: duty taken over by another node");
                }
                Err(error) => tracing::warn!(task_id = %task.task_id, %error, "clock: deadline transition failed"),
            }
        }
        if due.len() == BATCH {
            continue;
        }
        let now = now_ms();
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
