//! The scheduler: fires due schedules. Any number of nodes may run it against one database; the
//! store fires each schedule in one transaction (on PostgreSQL under the schedule's row lock,
//! skipping a schedule another node is firing), so an occurrence starts exactly one workflow.
//! It sleeps until the earliest fire time (at most a second, so buffered occurrences notice a
//! closed run promptly), or until a schedule change kicks it.

use crate::AppState;
use capstan_app::duties;
use capstan_engine::Payload;
use capstan_store::Store;
use std::sync::Arc;
use std::time::Duration;

const BATCH: usize = 100;
const IDLE_RECHECK_MS: i64 = 1_000;
/// A floor between passes, so a schedule that cannot advance never spins the loop.
const MIN_PAUSE_MS: i64 = 20;

pub async fn run<S: Store>(state: Arc<AppState<S>>) {
    let empty_input = Payload::avro(crate::avro::empty_arguments_blob());
    let catchup_window_ms = state.config.schedule_catchup_window_ms;
    loop {
        let now = state.now();
        match duties::fire_due_schedules(&state.store, now, BATCH, catchup_window_ms, &empty_input).await {
            Ok(outcomes) => {
                for duties::FiringOutcome {
                    namespace,
                    schedule_id,
                    result,
                } in outcomes
                {
                    if let Ok(report) = &result {
                        state.metrics.schedule_started(&namespace, &report.lateness_ms);
                    }
                    match result {
                        Ok(report) if report.started > 0 => {
                            tracing::info!(namespace, schedule_id, started = report.started, "schedule fired");
                        }
                        Ok(_) => {}
                        Err(capstan_store::StoreError::Refused(refusal)) => {
                            tracing::debug!(namespace, schedule_id, %refusal, "scheduler: schedule changed meanwhile");
                        }
                        Err(error) => tracing::warn!(namespace, schedule_id, %error, "scheduler: firing failed"),
                    }
                }
            }
            Err(error) => tracing::error!(%error, "scheduler: could not read due schedules"),
        }
        let now = state.now();
        let sleep_ms = match state.store.next_schedule_wake().await {
            Ok(Some(next)) => (next - now).clamp(MIN_PAUSE_MS, IDLE_RECHECK_MS),
            _ => IDLE_RECHECK_MS,
        };
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(sleep_ms as u64)) => {}
            _ = state.scheduler_kick.notified() => {}
        }
    }
}
