//! The background duties every node runs: applying due deadlines under a duty fence, and
//! firing due schedules. Each is a claim (or a read) and then an action, kept apart so that a
//! node may stop between them — a paused process, as the multi-node simulator plays one — and
//! act later on what it believed it owned.

use capstan_engine::{on_deadline, Millis, Payload, RunState};
use capstan_store::{DueTask, FireReport, ScheduleFire, Store, StoreResult};

/// What became of one due task.
pub struct DeadlineOutcome {
    pub task: DueTask,
    /// `Ok((true, run))`: the deadline changed the run (a timer fired, a lease expired, a
    /// timeout hit); `Ok((false, run))`: the row was out of date and was rewritten from the run;
    /// `Err(Refused)`: another node took the duty over.
    pub result: StoreResult<(bool, RunState)>,
}

/// Claims up to `limit` tasks whose deadline has come for `node` (holding each claim for
/// `hold_ms`) and applies each in its own transaction. An error claiming is the pass's error;
/// each task's own outcome is in its entry.
pub async fn apply_due_deadlines<S: Store>(
    store: &S,
    node: &str,
    now: Millis,
    limit: usize,
    hold_ms: i64,
) -> StoreResult<Vec<DeadlineOutcome>> {
    let due = claim_due_deadlines(store, node, now, limit, hold_ms).await?;
    let mut outcomes = Vec::with_capacity(due.len());
    for task in due {
        outcomes.push(apply_deadline(store, task, now).await);
    }
    Ok(outcomes)
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
