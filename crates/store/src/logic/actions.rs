//! Declared actions: their definitions, and the steps of running an atomic one around the
//! embedding application's handler. The backends only pick the candidate and run the handler
//! inside a savepoint of their own connection.

use super::persist::persist;
use crate::tx::{args, locking, Locking, Tx};
use crate::*;
use std::sync::Arc;

const DEFINITION: Locking = locking!(
    "SELECT doc FROM action_definitions WHERE namespace = $1 AND activity_type = $2",
    "FOR UPDATE"
);
const UPSERT_DEFINITION: &str =
    "INSERT INTO action_definitions (namespace, activity_type, version, definition_hash, updated_at, doc) VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (namespace, activity_type) DO UPDATE SET version = excluded.version, definition_hash = excluded.definition_hash,
         updated_at = excluded.updated_at, doc = excluded.doc";

/// The current definition of a declared action, read in the caller's transaction.
pub(crate) async fn action_definition<T: Tx>(tx: &mut T, namespace: &str, activity_type: &str) -> StoreResult<Option<ActionDefinition>> {
    match tx.query_opt(DEFINITION.unlocked(), &args![namespace, activity_type]).await? {
        Some(row) => Ok(Some(serde_json::from_str(row.str(0)?)?)),
        None => Ok(None),
    }
}

/// Stores a definition; the same document again changes nothing, another one is the next
/// version (a dispatch pinned to the old version is then refused).
pub(crate) async fn put_action_definition<T: Tx>(
    tx: &mut T,
    namespace: &str,
    activity_type: &str,
    recovery_mode: RecoveryMode,
    document: Map<String, Value>,
    now: Millis,
) -> StoreResult<ActionDefinition> {
    let hash = ActionDefinition::hash_of(activity_type, &document);
    let row = tx.query_opt(DEFINITION.sql(tx.dialect()), &args![namespace, activity_type]).await?;
    let existing: Option<ActionDefinition> = row.map(|row| Ok::<_, StoreError>(serde_json::from_str(row.str(0)?)?)).transpose()?;
    if let Some(existing) = existing.as_ref().filter(|d| d.definition_hash == hash) {
        return Ok(existing.clone());
    }
    let definition = ActionDefinition {
        version: existing.map(|d| d.version + 1).unwrap_or(1),
        namespace: namespace.to_string(),
        activity_type: activity_type.to_string(),
        recovery_mode,
        document,
        definition_hash: hash,
        updated_at: now,
    };
    let doc = serde_json::to_string(&definition)?;
    let args = args![
        namespace,
        activity_type,
        i64::from(definition.version),
        &definition.definition_hash,
        now,
        doc.as_str()
    ];
    tx.execute(UPSERT_DEFINITION, &args).await?;
    Ok(definition)
}

/// An atomic task leased in this transaction, waiting for its handler.
pub(crate) struct AtomicStep {
    run: RunState,
    task: Task,
    /// The lease's effects, persisted with the outcome in one write.
    effects: Effects,
    /// The handler and its decoded arguments, or why there is none to run.
    pub handler: Result<(Arc<dyn AtomicAction>, Value), String>,
}

/// What leasing an atomic candidate came to.
pub(crate) enum AtomicLease {
    /// The task is no activity task (the row was out of step): nothing done.
    Nothing,
    /// Refused before dispatch (its definition changed): recorded.
    Refused(AtomicOutcome),
    Ready(Box<AtomicStep>),
}

/// Leases `task_id` of the locked `run` to the atomic executor and finds its handler.
pub(crate) async fn lease_atomic<T: Tx>(
    tx: &mut T,
    mut run: RunState,
    task_id: TaskId,
    actions: &AtomicActions,
    codec: &'static dyn MemoCodec,
    now: Millis,
    env: &Env,
) -> StoreResult<AtomicLease> {
    let activity_type = match run.tasks.get(&task_id).map(|t| &t.detail) {
        Some(TaskDetail::Activity { activity_type, .. }) => activity_type.clone(),
        _ => return Ok(AtomicLease::Nothing),
    };
    let definition = action_definition(tx, &run.namespace, &activity_type).await?;
    let mut ids = env.ids();
    let mut cx = env.cx(now, &mut ids);
    cx.memo = Some(codec);
    let leased = lease_activity_task_with(&mut run, &mut cx, &task_id, ATOMIC_OWNER, 60_000, definition.as_ref())?;
    let effects = std::mem::take(&mut cx.effects);
    let Some(task) = leased else {
        persist(tx, &run, &effects, false, env).await?;
        return Ok(AtomicLease::Refused(AtomicOutcome::Refused {
            workflow_id: run.workflow_id.clone(),
        }));
    };
    let arguments = run
        .activities
        .values()
        .find(|a| a.task_id == task_id)
        .map(|a| codec.to_json(&a.arguments))
        .unwrap_or_else(|| Err("no activity execution".into()));
    let handler = match (actions.0.get(&activity_type), arguments) {
        (None, _) => Err(format!("no atomic action is registered for {activity_type:?}")),
        (Some(_), Err(error)) => Err(format!("the arguments could not be decoded: {error}")),
        (Some(action), Ok(arguments)) => Ok((action.clone(), arguments)),
    };
    Ok(AtomicLease::Ready(Box::new(AtomicStep {
        run,
        task,
        effects,
        handler,
    })))
}

/// The payload a handler's answer is recorded as. Decided while the handler's savepoint is still
/// open: an answer that cannot be encoded fails the attempt, so its writes must roll back too.
pub(crate) fn handler_result(codec: &dyn MemoCodec, ran: Result<Value, String>) -> Result<Payload, String> {
    ran.and_then(|value| codec.json_to_payload(&value))
}

/// Records the handler's outcome (completion or failed attempt) with the lease, in the
/// handler's transaction.
pub(crate) async fn finish_atomic_step<T: Tx>(
    tx: &mut T,
    step: AtomicStep,
    handled: Result<Payload, String>,
    codec: &'static dyn MemoCodec,
    now: Millis,
    env: &Env,
) -> StoreResult<AtomicOutcome> {
    let AtomicStep {
        mut run, task, effects, ..
    } = step;
    let mut ids = env.ids();
    let mut cx = env.cx(now, &mut ids);
    cx.memo = Some(codec);
    cx.effects = effects;
    let outcome = finish_atomic(&mut run, &mut cx, &task, handled)?;
    let effects = cx.effects;
    persist(tx, &run, &effects, false, env).await?;
    Ok(outcome)
}

/// What an atomic action's attempt amounts to after its handler ran: the engine transition
/// that records it.
fn finish_atomic(run: &mut RunState, cx: &mut Cx, task: &Task, handled: Result<Payload, String>) -> StoreResult<AtomicOutcome> {
    let TaskDetail::Activity {
        attempt_id: Some(attempt_id),
        ..
    } = &task.detail
    else {
        return Err(StoreError::Storage("an atomic task leased without an attempt".into()));
    };
    let workflow_id = run.workflow_id.clone();
    match handled {
        Ok(result) => {
            complete_activity(run, cx, &task.id, attempt_id, ATOMIC_OWNER, result)?;
            Ok(AtomicOutcome::Completed { workflow_id })
        }
        Err(message) => {
            let failure = ActivityFailure {
                message: message.clone(),
                failure_type: Some("AtomicActionFailed".into()),
                ..Default::default()
            };
            fail_activity(run, cx, &task.id, attempt_id, ATOMIC_OWNER, failure)?;
            Ok(AtomicOutcome::Failed { workflow_id, message })
        }
    }
}
