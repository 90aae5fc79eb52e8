//! Run transitions over one open transaction: find and lock the run, let the engine decide,
//! persist what it decided. The same on both backends; the caller commits.

use super::locate::{load_run, locate_and_lock, lock_run, run_of, LOCK_RUN_OF_TASK_OR_SKIP};
use super::persist::persist;
use super::row_lease::Load;
use super::run_rows::{insert_instance, set_current_run, LOCK_INSTANCE};
use crate::rows::*;
use crate::tx::{args, locking, Locking, Tx};
use crate::*;

const STORED_RECEIPT: &str =
    "SELECT intent_hash, receipt FROM command_requests WHERE namespace = $1 AND workflow_id = $2 AND command_type = $3 AND request_id = $4";
const INSERT_RECEIPT: &str =
    "INSERT INTO command_requests (namespace, workflow_id, command_type, request_id, intent_hash, receipt, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)";
const LOCK_DUTY_FENCE: Locking = locking!("SELECT duty_fence FROM tasks WHERE task_id = $1", "FOR UPDATE");
const RELEASE_DUTY: &str = "UPDATE tasks SET duty_owner = NULL, duty_expires_at = NULL WHERE task_id = $1";

/// Events `after < sequence <= upto` of a run, in order, at most `limit`.
pub(crate) async fn history<T: Tx>(tx: &mut T, run_id: &RunId, after: u64, upto: u64, limit: usize) -> StoreResult<Vec<HistoryEvent>> {
    let stored = stored_history(tx, run_id, after, upto, limit).await?;
    stored
        .into_iter()
        .map(|event| {
            Ok(HistoryEvent {
                event_type: EventType::parse(&event.event_type)
                    .ok_or_else(|| StoreError::Storage(format!("unknown stored event type {}", event.event_type)))?,
                payload: serde_json::from_str(&event.payload)?,
                sequence: event.sequence,
                id: EventId(event.id),
                workflow_task_id: event.workflow_task_id.map(TaskId),
                workflow_command_id: event.workflow_command_id.map(CommandId),
                recorded_at: event.recorded_at,
                prev_hash: event.prev_hash,
                hash: event.hash,
            })
        })
        .collect()
}

/// The same events as stored: the payload as the JSON text it was written as.
pub(crate) async fn stored_history<T: Tx>(
    tx: &mut T,
    run_id: &RunId,
    after: u64,
    upto: u64,
    limit: usize,
) -> StoreResult<Vec<StoredEvent>> {
    let sql = "SELECT sequence, event_id, event_type, payload, workflow_task_id, workflow_command_id, recorded_at, prev_hash, hash
               FROM history_events WHERE run_id = $1 AND sequence > $2 AND sequence <= $3 ORDER BY sequence LIMIT $4";
    let bound = |n: u64| n.min(i64::MAX as u64) as i64;
    let args = args![run_id.as_str(), bound(after), bound(upto), limit as i64];
    let rows = tx.query(sql, &args).await?;
    rows.into_iter()
        .map(|mut row| {
            Ok(StoredEvent {
                sequence: row.int(0)? as u64,
                id: row.take_text(1)?,
                event_type: row.take_text(2)?,
                payload: row.take_text(3)?,
                workflow_task_id: row.take_opt_text(4)?,
                workflow_command_id: row.take_opt_text(5)?,
                recorded_at: row.int(6)?,
                prev_hash: row.take_text(7)?,
                hash: row.take_text(8)?,
            })
        })
        .collect()
}

/// Every run of an instance, oldest first.
pub(crate) async fn runs_of<T: Tx>(tx: &mut T, namespace: &str, workflow_id: &WorkflowId) -> StoreResult<Vec<RunSummary>> {
    let sql = "SELECT state FROM runs WHERE namespace = $1 AND workflow_id = $2 ORDER BY run_number";
    let rows = tx.query(sql, &args![namespace, workflow_id.as_str()]).await?;
    rows.iter()
        .map(|row| Ok(summary_of(&serde_json::from_str::<RunState>(row.str(0)?)?)))
        .collect()
}

/// Runs one engine transition on the run `locator` names and persists its effects.
pub(crate) async fn mutate<T, V, F>(
    tx: &mut T,
    namespace: &str,
    locator: &RunLocator,
    now: Millis,
    env: &Env,
    transition: F,
) -> StoreResult<(V, RunState)>
where
    T: Tx,
    F: FnOnce(&mut RunState, &mut Cx) -> Result<V, Refusal>,
{
    let mut run = locate_and_lock(tx, namespace, locator).await?.ok_or_else(|| not_found(locator))?;
    let mut ids = env.ids();
    let mut cx = env.cx(now, &mut ids);
    let value = transition(&mut run, &mut cx)?;
    let effects = cx.effects;
    persist(tx, &run, &effects, false, env).await?;
    Ok((value, run))
}

/// Which run a keyed command addresses, and under which request id.
pub(crate) struct KeyedCommand<'a> {
    pub namespace: &'a str,
    pub locator: &'a RunLocator,
    pub key: &'a CommandKey,
}

/// A client command keyed by `request_id`: a repeat with the same intent is answered from the
/// stored receipt and changes nothing; another intent under the same id is refused.
pub(crate) async fn mutate_keyed<T, V, F, R>(
    tx: &mut T,
    command: KeyedCommand<'_>,
    now: Millis,
    env: &Env,
    transition: F,
    render: R,
) -> StoreResult<(KeyedReceipt<V>, Option<RunState>)>
where
    T: Tx,
    F: FnOnce(&mut RunState, &mut Cx) -> Result<V, Refusal>,
    R: FnOnce(&V, &RunState) -> Value,
{
    let KeyedCommand { namespace, locator, key } = command;
    let workflow_id = match locator {
        RunLocator::Run(w, _) | RunLocator::Current(w) => w.as_str(),
        RunLocator::Task(_) => return Err(StoreError::Storage("keyed commands address workflows, not tasks".into())),
    };
    // The run lock serialises concurrent uses of one request id (SQLite: the one writer).
    let mut run = locate_and_lock(tx, namespace, locator).await?.ok_or_else(|| not_found(locator))?;
    let stored = tx
        .query_opt(STORED_RECEIPT, &args![namespace, workflow_id, &key.command_type, &key.request_id])
        .await?;
    if let Some(row) = stored {
        if row.str(0)? != key.intent_hash {
            return Err(Refusal::new(
                Reason::RequestIdConflict,
                "This request_id was already used for a different command.",
            )
            .with("retained_command_type", key.command_type.clone())
            .with("request_id", key.request_id.clone())
            .into());
        }
        return Ok((KeyedReceipt::Retained(serde_json::from_str(row.str(1)?)?), None));
    }
    let mut ids = env.ids();
    let mut cx = env.cx(now, &mut ids);
    let value = transition(&mut run, &mut cx)?;
    let effects = cx.effects;
    persist(tx, &run, &effects, false, env).await?;
    let receipt = render(&value, &run).to_string();
    let args = args![
        namespace,
        workflow_id,
        &key.command_type,
        &key.request_id,
        &key.intent_hash,
        receipt.as_str(),
        now
    ];
    tx.execute(INSERT_RECEIPT, &args).await?;
    Ok((KeyedReceipt::Fresh(value), Some(run)))
}

/// A background deadline claimed under `due.duty_fence`: refused if another node took the duty
/// over since (lock order: run row, then task row).
pub(crate) async fn run_duty<T, V, F>(tx: &mut T, due: &DueTask, now: Millis, env: &Env, transition: F) -> StoreResult<(V, RunState)>
where
    T: Tx,
    F: FnOnce(&mut RunState, &mut Cx) -> Result<V, Refusal>,
{
    let locator = RunLocator::Task(due.task_id.clone());
    let args = args![due.task_id.as_str(), due.namespace.as_str()];
    let row = tx.query_opt(LOCK_RUN_OF_TASK_OR_SKIP.sql(tx.dialect()), &args).await?;
    let Some(mut run) = run_of(tx, row, Some(&due.task_id), Load::Locked).await? else {
        if load_run(tx, &due.namespace, &locator).await?.is_some() {
            return Err(Refusal::new(
                Reason::RunLocked,
                "Another transaction holds the run; its node retries the duty while the claim lasts.",
            )
            .with("task_id", due.task_id.as_str())
            .into());
        }
        return Err(not_found(&locator).into());
    };
    let fence_sql = LOCK_DUTY_FENCE.sql(tx.dialect());
    let fence = tx.query_opt(fence_sql, &args![due.task_id.as_str()]).await?;
    let fence = fence.map(|row| row.int(0)).transpose()?;
    if fence != Some(due.duty_fence as i64) {
        return Err(Refusal::new(Reason::StaleFence, "Another node took over this duty.")
            .with("task_id", due.task_id.as_str())
            .with("duty_fence", due.duty_fence)
            .with("current_duty_fence", fence)
            .into());
    }
    capstan_pause::point(capstan_pause::DUTY_LOCKED);
    let mut ids = env.ids();
    let mut cx = env.cx(now, &mut ids);
    let value = transition(&mut run, &mut cx)?;
    let effects = cx.effects;
    persist(tx, &run, &effects, false, env).await?;
    tx.execute(RELEASE_DUTY, &args![due.task_id.as_str()]).await?;
    Ok((value, run))
}

/// Starts a standalone activity: run 1 of a new host instance, or the next run of a host
/// instance whose current run has closed (DW reuses an activity id once its activity ended).
pub(crate) async fn start_standalone_activity<T: Tx>(
    tx: &mut T,
    start: StartStandaloneActivity,
    now: Millis,
    env: &Env,
) -> StoreResult<RunState> {
    let activity_id = start.run.workflow_id.clone();
    let existing = tx.query_opt(LOCK_INSTANCE.sql(tx.dialect()), &args![activity_id.as_str()]).await?;
    let run_number = match existing {
        None => 1,
        Some(row) => {
            let (namespace, run_id) = (row.text(0)?, row.text(1)?);
            if namespace != start.run.namespace {
                return Err(Refusal::new(
                    Reason::ActivityIdReservedInNamespace,
                    "This activity id is reserved in another namespace.",
                )
                .with("activity_id", activity_id.as_str())
                .with("command_status", "rejected")
                .with("rejection_reason", "activity_id_reserved_in_namespace")
                .into());
            }
            let current = lock_run(tx, &run_id, false)
                .await?
                .ok_or_else(|| StoreError::Storage(format!("instance points at missing run {run_id}")))?;
            if current.standalone.is_none() {
                return Err(
                    activity_id_refusal(format!("The id [{activity_id}] belongs to a workflow, not a standalone activity.")).into(),
                );
            }
            if !current.is_closed() {
                return Err(activity_id_refusal(format!("Standalone activity [{activity_id}] is already running.")).into());
            }
            current.run_number + 1
        }
    };
    let mut ids = env.ids();
    let mut cx = env.cx(now, &mut ids);
    let run = capstan_engine::start_standalone_activity(&mut cx, start, run_number);
    let effects = cx.effects;
    if run_number == 1 {
        match insert_instance(tx, &run, now).await {
            // Another node started this id a moment ago.
            Err(StoreError::Conflict { .. }) => {
                return Err(activity_id_refusal(format!("Standalone activity [{activity_id}] is already running.")).into())
            }
            other => other?,
        }
    }
    persist(tx, &run, &effects, true, env).await?;
    if run_number > 1 {
        set_current_run(tx, &run).await?;
    }
    Ok(run)
}

/// DW answers a taken activity id as a validation error on `activity_id` (422), not a 409.
fn activity_id_refusal(message: String) -> Refusal {
    let errors = serde_json::json!({ "activity_id": [message.clone()] });
    Refusal::new(Reason::ValidationFailed, message)
        .with("errors", errors.clone())
        .with("validation_errors", errors)
}

/// Starts a new instance, or applies the duplicate-start rule to the one that exists.
pub(crate) async fn start_workflow<T: Tx>(
    tx: &mut T,
    start: StartRun,
    policy: DuplicatePolicy,
    now: Millis,
    env: &Env,
) -> StoreResult<(StartOutcome, RunState)> {
    let existing = tx
        .query_opt(LOCK_INSTANCE.sql(tx.dialect()), &args![start.workflow_id.as_str()])
        .await?;
    if let Some(row) = existing {
        let (namespace, run_id) = (row.text(0)?, row.text(1)?);
        let current = lock_run(tx, &run_id, false)
            .await?
            .ok_or_else(|| StoreError::Storage(format!("instance points at missing run {run_id}")))?;
        return Ok(existing_instance(&namespace, &start, current, policy)?);
    }
    let mut ids = env.ids();
    let mut cx = env.cx(now, &mut ids);
    let workflow_id = start.workflow_id.clone();
    let run = start_run(&mut cx, start);
    let effects = cx.effects;
    match insert_instance(tx, &run, now).await {
        // Another node started this id a moment ago.
        Err(StoreError::Conflict { .. }) => {
            return Err(
                Refusal::new(Reason::InstanceAlreadyStarted, "A workflow with this id was already started.")
                    .with("workflow_id", workflow_id.as_str())
                    .into(),
            )
        }
        other => other?,
    }
    persist(tx, &run, &effects, true, env).await?;
    Ok((StartOutcome::StartedNew, run))
}
