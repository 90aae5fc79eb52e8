//! Leasing one candidate task to a poller. Picking candidates differs per backend (SQLite
//! reads a few in order; PostgreSQL locks one run with `SKIP LOCKED`); what happens to a
//! candidate is this, on both.

use super::persist::persist;
use crate::rows::*;
use crate::tx::{args, Tx};
use crate::*;

/// What became of a candidate.
pub(crate) enum Claimed {
    /// Leased to the poller (its poll request remembered).
    Leased(Box<(Task, RunState)>),
    /// Refused before dispatch (its action definition changed): the failure is recorded; try
    /// the next candidate.
    Refused,
    /// The row was out of step with the run document (leased a moment ago, or a bug): the row
    /// is repaired from the engine's view; try the next candidate.
    Stale,
    /// Not for this poller now (its worker session is not this worker's to take): left ready;
    /// try the next candidate.
    Skipped,
}

/// What a poller asks for.
pub(crate) struct Poller<'a> {
    pub kind: TaskKind,
    pub owner: &'a str,
    pub lease_ms: i64,
    pub poll: Option<&'a PollKey>,
}

const REMEMBER_POLL: &str =
    "INSERT INTO poll_requests (namespace, task_queue, worker_id, kind, poll_request_id, task_id, fence, created_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
     ON CONFLICT (namespace, task_queue, worker_id, kind, poll_request_id)
     DO UPDATE SET task_id = excluded.task_id, fence = excluded.fence, created_at = excluded.created_at";
const REPAIR_ROW: &str = "UPDATE tasks SET status = $2 WHERE task_id = $1 AND status = 'ready'";

/// Leases `task_id` of the locked `run` to the poller and persists the lease.
pub(crate) async fn lease_candidate<T: Tx>(
    tx: &mut T,
    mut run: RunState,
    task_id: TaskId,
    poller: &Poller<'_>,
    now: Millis,
    env: &Env,
) -> StoreResult<Claimed> {
    let activity_type = run.tasks.get(&task_id).and_then(|t| match &t.detail {
        TaskDetail::Activity { activity_type, .. } => Some(activity_type.clone()),
        _ => None,
    });
    // A declared action is checked against its definition as of now, in this transaction, and
    // ledgered before the worker sees it.
    let definition = match (poller.kind, activity_type) {
        (TaskKind::Activity, Some(activity_type)) => super::actions::action_definition(tx, &run.namespace, &activity_type).await?,
        _ => None,
    };
    // A session activity runs only on the session's holder: admitted (the session created,
    // renewed or taken over) in this transaction, or left for a worker that may run it.
    if poller.kind == TaskKind::Activity {
        let requirement = run.tasks.get(&task_id).and_then(|task| run.session_of(task)).cloned();
        if let Some(requirement) = requirement {
            let admitted = super::sessions::admit_activity(tx, &run.namespace, &requirement, &task_id, poller.owner, now).await?;
            if admitted.is_none() {
                return Ok(Claimed::Skipped);
            }
        }
    }
    let mut ids = env.ids();
    let mut cx = env.cx(now, &mut ids);
    let leased = match poller.kind {
        TaskKind::Workflow => lease_workflow_task(&mut run, &mut cx, &task_id, poller.owner, poller.lease_ms).map(Some),
        TaskKind::Activity => lease_activity_task_with(&mut run, &mut cx, &task_id, poller.owner, poller.lease_ms, definition.as_ref()),
        _ => return Ok(Claimed::Stale),
    };
    let effects = cx.effects;
    match leased {
        Ok(None) => {
            persist(tx, &run, &effects, false, env).await?;
            Ok(Claimed::Refused)
        }
        Ok(Some(task)) => {
            persist(tx, &run, &effects, false, env).await?;
            if let Some(key) = poller.poll {
                remember_poll(tx, key, &task, now).await?;
            }
            Ok(Claimed::Leased(Box::new((task, run))))
        }
        Err(refusal) => {
            tracing::debug!(task_id = %task_id, run_id = %run.run_id, %refusal, "ready task row could not be leased");
            let status = run.tasks.get(&task_id).map(|t| task_row_status(&run, t)).unwrap_or("cancelled");
            tx.execute(REPAIR_ROW, &args![task_id.as_str(), status]).await?;
            Ok(Claimed::Stale)
        }
    }
}

/// A poll request id answered with a task: a retried poll gets the same task back.
async fn remember_poll<T: Tx>(tx: &mut T, key: &PollKey, task: &Task, now: Millis) -> StoreResult<()> {
    let args = args![
        &key.namespace,
        &key.task_queue,
        &key.worker_id,
        key.kind.as_str(),
        &key.poll_request_id,
        task.id.as_str(),
        task.fence as i64,
        now
    ];
    tx.execute(REMEMBER_POLL, &args).await.map(drop)
}
