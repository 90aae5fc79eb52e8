//! The background clock: fires timers, times runs out, expires leases and activity timeouts,
//! without any worker traffic. It sleeps until the earliest pending deadline (at most a second),
//! or until a change brings an earlier one, so work that is due is never waiting on a poll.

use crate::AppState;
use capstan_app::duties;
use capstan_engine::RunState;
use capstan_store::Store;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const BATCH: usize = 256;
const IDLE_RECHECK_MS: i64 = 1_000;

/// Poll memos only need to outlive a lease; older ones are pruned this often.
const PRUNE_EVERY_MS: i64 = 60_000;
const POLL_MEMO_TTL_MS: i64 = 3_600_000;

/// What wakes the clock early: a change that brings a deadline before the one it sleeps towards.
/// Most changes bring none (a lease expiring in a minute, against a clock that sleeps at most a
/// second), and a kick costs a due-task claim and a deadline read in the store, so changes that
/// cannot matter do not kick.
pub(crate) struct ClockAlarm {
    kick: tokio::sync::Notify,
    /// When the sleeping clock wakes by itself; `i64::MAX` while it is awake (it may have read the
    /// next deadline before a change committed, so every deadline kicks then).
    asleep_until: AtomicI64,
    /// Claimed duties whose run another transaction held, retried while their claims last.
    passed_over: tokio::sync::Mutex<duties::PassedOver>,
}

impl Default for ClockAlarm {
    fn default() -> Self {
        Self {
            kick: tokio::sync::Notify::new(),
            asleep_until: AtomicI64::new(i64::MAX),
            passed_over: Default::default(),
        }
    }
}

impl ClockAlarm {
    /// A change wrote `deadline`: wake the clock if it would sleep past it.
    fn deadline_set(&self, deadline: i64) {
        if deadline < self.asleep_until.load(Ordering::SeqCst) {
            self.kick.notify_one();
        }
    }

    /// A change to `run` committed: wake the clock if the run now has a deadline before the one
    /// the clock sleeps towards.
    pub(crate) fn run_changed(&self, run: &RunState) {
        if let Some(earliest) = run.tasks.values().filter_map(|task| task.deadline_at).min() {
            self.deadline_set(earliest);
        }
    }

    /// Wake the clock whatever it sleeps towards.
    pub(crate) fn kick(&self) {
        self.kick.notify_one();
    }

    /// Sleeps until `until` (domain time, `ms` from now) or a kick, and is awake again after.
    async fn sleep(&self, until: i64, ms: i64) {
        self.asleep_until.store(until, Ordering::SeqCst);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(ms as u64)) => {}
            _ = self.kick.notified() => {}
        }
        self.asleep_until.store(i64::MAX, Ordering::SeqCst);
    }
}

pub async fn run<S: Store>(state: Arc<AppState<S>>) {
    let mut pruned_at = 0;
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
        if due == BATCH {
            continue;
        }
        let now = state.now();
        let retry = state.clock.passed_over.lock().await.next_retry();
        let next = match state.store.next_deadline().await {
            Ok(next) => next.into_iter().chain(retry).min(),
            Err(_) => retry,
        };
        let sleep_ms = next.map_or(IDLE_RECHECK_MS, |next| (next - now).clamp(0, IDLE_RECHECK_MS));
        if sleep_ms == 0 {
            tokio::task::yield_now().await;
            continue;
        }
        state.clock.sleep(now + sleep_ms, sleep_ms).await;
    }
}

/// Claims the tasks whose deadline has come (timers, run timeouts, expired leases, activity
/// timeouts) and applies each; returns how many were due. The clock calls it continuously; the
/// activity-timeout pass endpoint calls it on demand.
pub(crate) async fn apply_due<S: Store>(state: &Arc<AppState<S>>, now: i64) -> capstan_store::StoreResult<usize> {
    // Held for the pass: an on-demand pass waits for the clock's.
    let mut passed_over = state.clock.passed_over.lock().await;
    let (node, hold_ms) = (&state.config.server_id, state.config.duty_lease_ms);
    let outcomes = duties::apply_due_deadlines(&state.store, node, now, BATCH, hold_ms, &mut passed_over).await?;
    for outcome in &outcomes {
        let task_id = &outcome.task.task_id;
        match &outcome.result {
            Ok((true, run)) => {
                tracing::info!(namespace = %run.namespace, workflow_id = %run.workflow_id, run_id = %run.run_id,
                    task_id = %task_id, run_status = run.status.as_str(), "deadline reached");
                state.run_changed(run);
            }
            Ok((false, _)) => {}
            Err(capstan_store::StoreError::Refused(refusal)) if refusal.reason == capstan_engine::Reason::RunLocked => {
                tracing::info!(task_id = %task_id, "clock: run held by another transaction; the duty is retried shortly");
            }
            Err(capstan_store::StoreError::Refused(refusal)) => {
                // A node that paused or lost its claim: worth a line, it explains a late node's silence.
                tracing::info!(task_id = %task_id, reason = %refusal.reason, "clock: duty taken over by another node; nothing applied");
            }
            Err(error) => tracing::warn!(task_id = %task_id, %error, "clock: deadline transition failed"),
        }
    }
    Ok(outcomes.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::Instant;

    /// How long a clock told to sleep 1,000 ms (at domain time 0) sleeps, when `change` runs
    /// 10 ms into its sleep.
    async fn slept_with(change: impl FnOnce(&ClockAlarm) + Send + 'static) -> Duration {
        let alarm = Arc::new(ClockAlarm::default());
        let sleeper = {
            let alarm = alarm.clone();
            tokio::spawn(async move {
                let began = Instant::now();
                alarm.sleep(1_000, 1_000).await;
                began.elapsed()
            })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        change(&alarm);
        sleeper.await.unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_before_the_clock_wakes_it() {
        let slept = slept_with(|alarm| alarm.deadline_set(500)).await;
        assert_eq!(slept, Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_after_the_clock_wakes_by_itself_does_not_kick_it() {
        let slept = slept_with(|alarm| alarm.deadline_set(60_000)).await;
        assert_eq!(slept, Duration::from_millis(1_000));
    }

    /// A run started at domain time 0, with a run timeout or without.
    fn run_with_timeout(run_timeout_seconds: Option<i64>) -> RunState {
        use capstan_engine::*;
        let limits = Limits::default();
        let mut ids = SequentialIds::new("id");
        let mut cx = Cx::new(0, &mut ids, &limits);
        let start = StartRun {
            scheduling: Default::default(),
            namespace: "default".into(),
            workflow_id: "wf".into(),
            run_id: "run".into(),
            workflow_type: "t".into(),
            task_queue: "q".into(),
            input: Payload::avro("in"),
            execution_timeout_seconds: None,
            run_timeout_seconds,
            business_key: None,
            memo: Default::default(),
            search_attributes: Default::default(),
            command_id: "start".into(),
            contract: None,
            compatibility: None,
            origin_trace: None,
            principal: None,
        };
        start_run(&mut cx, start)
    }

    #[tokio::test(start_paused = true)]
    async fn a_changed_run_wakes_the_clock_only_for_a_deadline_before_its_wake_up() {
        for (timeout, slept) in [(Some(1), 10), (Some(60), 5_000), (None, 5_000)] {
            let alarm = Arc::new(ClockAlarm::default());
            let sleeper = {
                let alarm = alarm.clone();
                tokio::spawn(async move {
                    let began = Instant::now();
                    alarm.sleep(5_000, 5_000).await;
                    began.elapsed()
                })
            };
            tokio::time::sleep(Duration::from_millis(10)).await;
            alarm.run_changed(&run_with_timeout(timeout));
            assert_eq!(sleeper.await.unwrap(), Duration::from_millis(slept), "run timeout {timeout:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_set_while_the_clock_is_awake_cuts_its_next_sleep_short() {
        let alarm = ClockAlarm::default();
        // The clock may have read the next deadline before this change committed.
        alarm.deadline_set(60_000);
        let began = Instant::now();
        alarm.sleep(1_000, 1_000).await;
        assert_eq!(began.elapsed(), Duration::ZERO);
    }
}
