//! The hand-off: a transaction that makes a workflow or activity task ready leases it, there
//! and then, to a poll parked on this node that may take it (`parked_polls.rs`), so the run is
//! written once with the lease and the poll is answered after COMMIT, without a claim
//! transaction of its own.
//!
//! What a claim checks, the hand-off checks in memory: the poll's types and build, the run's
//! sticky hold. What a claim must read or lock in the database is left to a claim: a task of a
//! queue with flow-control limits (its limits row comes before the run row in the lock order),
//! a session activity (its session row), a declared action (its definition and ledger). Those
//! tasks stay ready and are announced, as before.

use crate::parked_polls::{Delivery, HandedOff, Poller, Taken};
use crate::rows::{task_compatibility, task_type_name};
use crate::tx::Tx;
use crate::*;

/// The run as the hand-offs left it, what they added to the transition's effects (the leases'
/// events and touched tasks), and the request id of each poll that took a task; `None` when
/// nothing was handed off.
pub(crate) struct HandedRun {
    pub run: RunState,
    pub effects: Effects,
    pub polls: Vec<(TaskId, String)>,
}

impl HandedRun {
    /// The request id of the poll `task` was handed to, kept on its row for a retry of it.
    pub(crate) fn poll_of(&self, task: &TaskId) -> Option<&str> {
        self.polls.iter().find(|(id, _)| id == task).map(|(_, poll)| poll.as_str())
    }
}

/// Leases each task `effects` made ready to a parked poll that may take it; the deliveries are
/// answered once the transaction commits.
pub(crate) async fn offer<T: Tx>(tx: &mut T, run: &RunState, effects: &Effects, env: &Env) -> StoreResult<Option<HandedRun>> {
    if env.parked.parked() == 0 || run.integrity_incident.is_some() || run.paused.is_some() || run.is_closed() {
        return Ok(None);
    }
    // The transition's time (its last event's), as a claim takes its caller's; the store's
    // clock when it recorded none.
    let now = effects.events.last().map_or_else(|| env.now_ms(), |event| event.recorded_at);
    let ready: Vec<TaskId> = effects
        .touched_tasks
        .iter()
        .filter(|id| run.tasks.get(*id).is_some_and(|task| offerable(task, now)))
        .filter(|id| {
            let task = &run.tasks[*id];
            env.parked.any_on(&run.namespace, task.kind, &task.queue)
        })
        .cloned()
        .collect();
    if ready.is_empty() {
        return Ok(None);
    }
    let mut handed: Option<HandedRun> = None;
    let mut taken: Vec<(Taken, Task)> = Vec::new();
    for task_id in ready {
        let current = handed.as_ref().map_or(run, |h| &h.run);
        let Some(task) = current.tasks.get(&task_id).filter(|t| offerable(t, now)) else {
            continue;
        };
        if !may_hand_off(tx, current, task, now, env).await? {
            continue;
        }
        let (type_name, build) = (task_type_name(current, task), task_compatibility(current, task));
        let sticky = current
            .sticky_hold(task)
            .filter(|(_, until)| *until > now)
            .map(|(owner, _)| owner.to_string());
        let fits = |poller: &Poller| {
            poller.runs(&type_name)
                && build.as_ref().is_none_or(|b| poller.build_id.as_ref() == Some(b))
                && sticky.as_ref().is_none_or(|owner| *owner == poller.worker_id)
        };
        let kind = task.kind;
        let Some(poll) = env.parked.take(&current.namespace, kind, &task.queue, fits) else {
            continue;
        };
        let HandedRun {
            mut run,
            effects,
            mut polls,
        } = handed.take().unwrap_or_else(|| HandedRun {
            run: run.clone(),
            effects: Effects::default(),
            polls: Vec::new(),
        });
        let mut ids = env.ids();
        let mut cx = env.cx(now, &mut ids);
        cx.effects = effects;
        let leased = match kind {
            TaskKind::Workflow => lease_workflow_task(&mut run, &mut cx, &task_id, &poll.poller.worker_id, poll.poller.lease_ms).map(Some),
            _ => lease_activity_task_with(&mut run, &mut cx, &task_id, &poll.poller.worker_id, poll.poller.lease_ms, None),
        };
        let effects = cx.effects;
        // Not leased leaves nothing changed: both leases refuse before they touch the run, and
        // `Ok(None)` is a declared action's, which `may_hand_off` left to a claim. The poll
        // looks again when `poll` drops.
        if let Ok(Some(task)) = leased {
            if let Some(key) = &poll.poller.poll {
                polls.push((task.id.clone(), key.poll_request_id.clone()));
            }
            let class = capstan_engine::scheduling::class_of(run.scheduling.fairness_key.as_deref());
            env.dispatch.record(&run.namespace, kind, &task.queue, class, now);
            tx.observe(Fact::HandedOff {
                namespace: run.namespace.clone(),
                kind,
            });
            taken.push((poll, task));
        }
        handed = Some(HandedRun { run, effects, polls });
    }
    if taken.is_empty() {
        // Nothing was leased, so nothing changed: the run is written as the transition left it.
        return Ok(None);
    }
    if let Some(done) = &handed {
        for (poll, task) in taken {
            tracing::debug!(task_id = %task.id, worker_id = %poll.poller.worker_id, "task handed to a parked poll");
            let handed = HandedOff {
                task,
                run: done.run.clone(),
            };
            tx.hand_off(Delivery { taken: poll, handed });
        }
    }
    Ok(handed)
}

/// A workflow or activity task a poller could lease now.
fn offerable(task: &Task, now: Millis) -> bool {
    matches!(task.kind, TaskKind::Workflow | TaskKind::Activity) && task.is_ready() && task.available_at <= now && !task.queue.is_empty()
}

/// Whether the task may be handed off at all, or is left to a claim (see the module's note).
async fn may_hand_off<T: Tx>(tx: &mut T, run: &RunState, task: &Task, now: Millis, env: &Env) -> StoreResult<bool> {
    if run.session_of(task).is_some() {
        return Ok(false);
    }
    if let TaskDetail::Activity {
        execution_id,
        activity_type,
        ..
    } = &task.detail
    {
        if run
            .activities
            .get(execution_id)
            .is_none_or(|e| e.action.is_some() || e.blocked_by.is_some())
        {
            return Ok(false);
        }
        if super::actions::action_definition(tx, &run.namespace, activity_type)
            .await?
            .is_some()
        {
            return Ok(false);
        }
    }
    Ok(!super::flow::is_limited(tx, env, &run.namespace, &task.queue, task.kind, now).await?)
}
