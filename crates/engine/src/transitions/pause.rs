//! Pausing and resuming a run (`crate::pause`). Both write every task's row again: the store
//! writes a paused run's ready workflow and activity tasks as held, and a resumed run's as ready.

use crate::transitions::control::require_open;
use crate::{Cx, PauseRecord, Refusal, RunClass, RunState, TaskId};

/// Holds an open run: none of its workflow or activity tasks is dispatched until it is resumed.
/// A paused run needs nothing (`false`).
pub fn pause(run: &mut RunState, cx: &mut Cx, reason: Option<String>) -> Result<bool, Refusal> {
    require_open(run)?;
    if run.paused.is_some() {
        return Ok(false);
    }
    cx.effects.reclassed_from = Some(RunClass::Open);
    run.paused = Some(PauseRecord {
        paused_at: cx.now,
        reason,
        principal: cx.principal.clone(),
    });
    retouch_tasks(run, cx);
    Ok(true)
}

/// Lets a paused run go on: what waited is dispatched. A run not paused needs nothing (`false`).
pub fn resume(run: &mut RunState, cx: &mut Cx) -> Result<bool, Refusal> {
    require_open(run)?;
    if run.paused.is_none() {
        return Ok(false);
    }
    cx.effects.reclassed_from = Some(RunClass::Paused);
    run.paused = None;
    retouch_tasks(run, cx);
    Ok(true)
}

fn retouch_tasks(run: &mut RunState, cx: &mut Cx) {
    let ids: Vec<TaskId> = run.tasks.keys().cloned().collect();
    for id in ids {
        run.task_mut(cx, &id);
    }
}
