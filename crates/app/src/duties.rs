//! The background duties every node runs: applying due deadlines under a duty fence, and
//! firing due schedules.

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
    let due = store.claim_due_tasks(node, now, limit, hold_ms).await?;
    if !due.is_empty() {
        capstan_pause::point(capstan_pause::DUTY_CLAIMED);
    }
    let mut outcomes = Vec::with_capacity(due.len());
    for task in due {
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
        outcomes.push(DeadlineOutcome { task, result });
    }
    Ok(outcomes)
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
    let due = store.due_schedules(now, limit).await?;
    if !due.is_empty() {
        capstan_pause::point(capstan_pause::SCHEDULES_DUE);
    }
    let mut outcomes = Vec::with_capacity(due.len());
    for (namespace, schedule_id) in due {
        let fire = ScheduleFire::Due { catchup_window_ms };
        let result = store.fire_schedule(&namespace, &schedule_id, fire, empty_input.clone(), now).await;
        outcomes.push(FiringOutcome {
            namespace,
            schedule_id,
            result,
        });
    }
    Ok(outcomes)
}
