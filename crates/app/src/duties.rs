//! The background duties every node runs: applying due deadlines under a duty fence, firing
//! due schedules, and removing closed workflows past their namespace's retention. Each is a claim (or a read) and then an action, kept apart so that a
//! node may stop between them — a paused process, as the multi-node simulator plays one — and
//! act later on what it believed it owned.

use capstan_engine::{on_deadline, Millis, Payload, Reason, RunState};
use capstan_store::{DueTask, FireReport, ScheduleFire, Store, StoreError, StoreResult};

/// What became of one due task.
pub struct DeadlineOutcome {
    pub task: DueTask,
    /// `Ok((true, run))`: the deadline changed the run (a timer fired, a lease expired, a
    /// timeout hit); `Ok((false, run))`: the row was out of date and was rewritten from the run;
    /// `Err(Refused)`: another node took the duty over (`stale_fence`), or another transaction
    /// held the run (`run_locked`: the duty waits in [`PassedOver`] for a retry).
    pub result: StoreResult<(bool, RunState)>,
}

/// Claims up to `limit` tasks whose deadline has come for `node` (holding each claim for
/// `hold_ms`) and applies each in its own transaction, with the duties `passed_over` earlier
/// whose retry is due. An error claiming is the pass's error; each task's own outcome is in its
/// entry, except a retried duty whose run is still held: it waits in `passed_over` again.
pub async fn apply_due_deadlines<S: Store>(
    store: &S,
    node: &str,
    now: Millis,
    limit: usize,
    hold_ms: i64,
    passed_over: &mut PassedOver,
) -> StoreResult<Vec<DeadlineOutcome>> {
    let due = claim_due_deadlines(store, node, now, limit, hold_ms).await?;
    let retries = passed_over.take_due(now);
    let mut outcomes = Vec::with_capacity(due.len() + retries.len());
    for task in due {
        let outcome = apply_deadline(store, task, now).await;
        if run_was_held(&outcome) {
            passed_over.pass_over(outcome.task.clone(), now, now + hold_ms);
        }
        outcomes.push(outcome);
    }
    for retry in retries {
        let outcome = apply_deadline(store, retry.task.clone(), now).await;
        if run_was_held(&outcome) {
            passed_over.again(retry, now);
        } else {
            outcomes.push(outcome);
        }
    }
    Ok(outcomes)
}

fn run_was_held(outcome: &DeadlineOutcome) -> bool {
    matches!(&outcome.result, Err(StoreError::Refused(refusal)) if refusal.reason == Reason::RunLocked)
}

/// The first retry of a duty whose run was held comes this soon; each further one waits twice
/// as long, up to [`RETRY_HELD_MAX_MS`].
pub const RETRY_HELD_FIRST_MS: Millis = 100;
pub const RETRY_HELD_MAX_MS: Millis = 2_000;

/// Duties this node claimed but found their run held by another transaction (`run_locked`).
/// The claim stands with its fence, so the node may retry while it lasts: a hold of a moment
/// (another node's transaction on the run) must not delay a timer until the claim expires,
/// and a long hold (a node frozen mid-transaction) costs one skipped lock per retry, backing
/// off. A retry that would come at or after the claim's expiry is dropped: the duty is claimed
/// afresh then, by whichever node comes first.
#[derive(Debug, Default)]
pub struct PassedOver {
    retries: Vec<HeldRetry>,
}

#[derive(Debug, Clone)]
pub struct HeldRetry {
    pub task: DueTask,
    retry_at: Millis,
    wait_ms: Millis,
    claim_expires_at: Millis,
}

impl PassedOver {
    /// `task`'s run was held at `now`; its claim lasts until `claim_expires_at`.
    pub fn pass_over(&mut self, task: DueTask, now: Millis, claim_expires_at: Millis) {
        self.schedule(HeldRetry {
            task,
            retry_at: now + RETRY_HELD_FIRST_MS,
            wait_ms: RETRY_HELD_FIRST_MS,
            claim_expires_at,
        });
    }

    /// A retry found the run still held at `now`: the next waits twice as long.
    pub fn again(&mut self, retry: HeldRetry, now: Millis) {
        let wait_ms = (retry.wait_ms * 2).min(RETRY_HELD_MAX_MS);
        self.schedule(HeldRetry {
            retry_at: now + wait_ms,
            wait_ms,
            ..retry
        });
    }

    fn schedule(&mut self, retry: HeldRetry) {
        if retry.retry_at < retry.claim_expires_at {
            self.retries.push(retry);
        }
    }

    /// The retries due at `now`, removed from the list.
    pub fn take_due(&mut self, now: Millis) -> Vec<HeldRetry> {
        let (due, later) = std::mem::take(&mut self.retries)
            .into_iter()
            .partition(|retry| retry.retry_at <= now);
        self.retries = later;
        due
    }

    /// When the earliest retry is due.
    pub fn next_retry(&self) -> Option<Millis> {
        self.retries.iter().map(|retry| retry.retry_at).min()
    }
}

/// Claims up to `limit` due tasks for `node`, each for `hold_ms` with the next duty fence.
pub async fn claim_due_deadlines<S: Store>(store: &S, node: &str, now: Millis, limit: usize, hold_ms: i64) -> StoreResult<Vec<DueTask>> {
    let due = store.claim_due_tasks(node, now, limit, hold_ms).await?;
    if !due.is_empty() {
        capstan_pause::point(capstan_pause::DUTY_CLAIMED);
    }
    Ok(due)
}

/// Applies one claimed deadline at `now`, refused (`stale_fence`) if the claim changed hands.
pub async fn apply_deadline<S: Store>(store: &S, task: DueTask, now: Millis) -> DeadlineOutcome {
    let id = task.task_id.clone();
    let result = store
        .run_duty(&task, now, move |run, cx| {
            let changed = on_deadline(run, cx, &id);
            if !changed {
                // The row disagrees with the run (deadline moved or task closed): rewrite it
                // from the run so it is not picked up again.
                cx.effects.touched_tasks.insert(id);
            }
            Ok(changed)
        })
        .await;
    DeadlineOutcome { task, result }
}

/// What became of one due schedule.
pub struct FiringOutcome {
    pub namespace: String,
    pub schedule_id: String,
    /// `Err(Refused)`: the schedule changed meanwhile (deleted, paused).
    pub result: StoreResult<FireReport>,
}

/// Fires up to `limit` schedules that are due at `now` (missed occurrences older than
/// `catchup_window_ms` are skipped and counted; `empty_input` starts workflows without input).
pub async fn fire_due_schedules<S: Store>(
    store: &S,
    now: Millis,
    limit: usize,
    catchup_window_ms: i64,
    empty_input: &Payload,
) -> StoreResult<Vec<FiringOutcome>> {
    let due = due_schedules(store, now, limit).await?;
    let mut outcomes = Vec::with_capacity(due.len());
    for (namespace, schedule_id) in due {
        outcomes.push(fire_schedule(store, namespace, schedule_id, now, catchup_window_ms, empty_input).await);
    }
    Ok(outcomes)
}

/// `(namespace, schedule_id)` of up to `limit` schedules due at `now`.
pub async fn due_schedules<S: Store>(store: &S, now: Millis, limit: usize) -> StoreResult<Vec<(String, String)>> {
    let due = store.due_schedules(now, limit).await?;
    if !due.is_empty() {
        capstan_pause::point(capstan_pause::SCHEDULES_DUE);
    }
    Ok(due)
}

/// Fires what of one schedule is due at `now`, decided again under the schedule's lock: a
/// schedule another node fired meanwhile has nothing due.
pub async fn fire_schedule<S: Store>(
    store: &S,
    namespace: String,
    schedule_id: String,
    now: Millis,
    catchup_window_ms: i64,
    empty_input: &Payload,
) -> FiringOutcome {
    let fire = ScheduleFire::Due { catchup_window_ms };
    let result = store.fire_schedule(&namespace, &schedule_id, fire, empty_input.clone(), now).await;
    FiringOutcome {
        namespace,
        schedule_id,
        result,
    }
}

/// Which closed instances a retention pass removes.
pub enum RetentionScope<'a> {
    /// The oldest expired ones, at most this many.
    Oldest(usize),
    /// Only those whose current run is one of these (among the first `scan` expired ones).
    Runs { run_ids: &'a [String], scan: usize },
}

/// Removes instances whose current run closed more than `retention_days` ago. Safe on every
/// node at once: each removal re-checks its instance in its own transaction. Returns the
/// workflow ids removed.
pub async fn retention_pass<S: Store>(
    store: &S,
    namespace: &str,
    retention_days: i64,
    scope: RetentionScope<'_>,
    now: Millis,
) -> StoreResult<Vec<String>> {
    let cutoff = now - retention_days * 86_400_000;
    let limit = match scope {
        RetentionScope::Oldest(limit) => limit,
        RetentionScope::Runs { scan, .. } => scan,
    };
    let expired = store.expired_instances(namespace, cutoff, limit).await?;
    let ids: Vec<String> = expired
        .into_iter()
        .filter(|(_, run_id, _)| match &scope {
            RetentionScope::Oldest(_) => true,
            RetentionScope::Runs { run_ids, .. } => run_ids.contains(run_id),
        })
        .map(|(workflow_id, _, _)| workflow_id)
        .collect();
    if ids.is_empty() {
        return Ok(ids);
    }
    let pruned = store.prune_instances(namespace, ids.clone(), cutoff).await?;
    tracing::debug!(namespace, pruned, retention_days, "retention: closed workflows removed");
    Ok(ids)
}

/// Rebuilds a namespace's kept run counts from a full count of its runs (a repair: they are
/// kept exact in every transaction, so only a fault or an older binary leaves them wrong);
/// how many keys were wrong.
pub async fn rebuild_run_counts<S: Store>(store: &S, namespace: &str) -> StoreResult<usize> {
    let rebuilt = store.recount_runs(Some(namespace)).await?;
    if rebuilt > 0 {
        tracing::warn!(namespace, rebuilt, "run counts differed from a full count; rebuilt");
    }
    Ok(rebuilt)
}

#[cfg(test)]
mod tests {
    use super::*;
    use capstan_engine::TaskId;

    fn task(id: &str) -> DueTask {
        DueTask {
            namespace: "default".into(),
            task_id: TaskId(id.into()),
            duty_fence: 1,
        }
    }

    fn due_ids(passed_over: &mut PassedOver, now: Millis) -> Vec<String> {
        passed_over.take_due(now).into_iter().map(|retry| retry.task.task_id.0).collect()
    }

    #[test]
    fn a_held_duty_is_retried_soon_then_less_often_and_never_past_its_claim() {
        let mut passed_over = PassedOver::default();
        passed_over.pass_over(task("t"), 1_000, 8_000);
        assert_eq!(passed_over.next_retry(), Some(1_000 + RETRY_HELD_FIRST_MS));
        assert!(due_ids(&mut passed_over, 1_099).is_empty(), "not before its retry");

        // Each time the run is still held, the wait doubles up to the ceiling.
        let mut now = 1_100;
        let mut waits = Vec::new();
        loop {
            let mut due = passed_over.take_due(now);
            assert_eq!(due.len(), 1);
            passed_over.again(due.remove(0), now);
            let Some(next) = passed_over.next_retry() else { break };
            waits.push(next - now);
            now = next;
        }
        assert_eq!(waits, [200, 400, 800, 1_600, 2_000]);
        assert!(now < 8_000, "the last retry comes while the claim lasts");
        assert_eq!(
            passed_over.next_retry(),
            None,
            "then the claim lapses and the duty is claimed afresh"
        );
    }

    #[test]
    fn only_the_due_retries_are_taken() {
        let mut passed_over = PassedOver::default();
        passed_over.pass_over(task("early"), 1_000, 31_000);
        passed_over.pass_over(task("late"), 1_050, 31_000);
        assert_eq!(due_ids(&mut passed_over, 1_100), ["early"]);
        assert_eq!(passed_over.next_retry(), Some(1_150));
        assert_eq!(due_ids(&mut passed_over, 1_150), ["late"]);
        assert_eq!(passed_over.next_retry(), None);
    }

    #[test]
    fn a_claim_too_short_for_a_retry_is_left_to_lapse() {
        let mut passed_over = PassedOver::default();
        passed_over.pass_over(task("t"), 1_000, 1_050);
        assert_eq!(passed_over.next_retry(), None);
    }
}
