//! Run transitions over one open transaction: find and lock the run, let the engine decide,
//! persist what it decided. The same on both backends; the caller commits.

use super::persist::{insert_instance, persist, set_current_run};
use crate::rows::*;
use crate::tx::{args, locking, Locking, Tx};
use crate::*;

// Each run read returns the document and the identity an unreadable document is reported under.
const LOCK_RUN: Locking = locking!(
    "SELECT state, namespace, workflow_id, run_id FROM runs WHERE run_id = $1",
    "FOR UPDATE"
);
const LOCK_RUN_OR_SKIP: Locking = locking!(
    "SELECT state, namespace, workflow_id, run_id FROM runs WHERE run_id = $1",
    "FOR UPDATE SKIP LOCKED"
);
// A report names its task: the task's receipt (if it closed) comes along, see `state_of`.
const LOCK_RUN_OF_TASK: Locking = locking!(
    "SELECT r.state, r.namespace, r.workflow_id, r.run_id, t.receipt FROM tasks t JOIN runs r ON r.run_id = t.run_id WHERE t.task_id = $1 AND t.namespace = $2",
    "FOR UPDATE OF r"
);
// A duty passes over a run another transaction holds (a node frozen mid-transaction must not
// stall every other run's deadlines): its claim stands, and its node retries while it lasts.
const LOCK_RUN_OF_TASK_OR_SKIP: Locking = locking!(
    "SELECT r.state, r.namespace, r.workflow_id, r.run_id, t.receipt FROM tasks t JOIN runs r ON r.run_id = t.run_id WHERE t.task_id = $1 AND t.namespace = $2",
    "FOR UPDATE OF r SKIP LOCKED"
);
const LOCK_NAMED_RUN: Locking = locking!(
    "SELECT state, namespace, workflow_id, run_id FROM runs WHERE run_id = $1 AND workflow_id = $2 AND namespace = $3",
    "FOR UPDATE"
);
const LOCK_CURRENT_RUN: Locking = locking!(
    "SELECT r.state, r.namespace, r.workflow_id, r.run_id FROM workflow_instances i JOIN runs r ON r.run_id = i.current_run_id WHERE i.workflow_id = $1 AND i.namespace = $2",
    "FOR UPDATE OF r"
);
const LOCK_INSTANCE: Locking = locking!(
    "SELECT namespace, current_run_id FROM workflow_instances WHERE workflow_id = $1",
    "FOR UPDATE"
);
const STORED_RECEIPT: &str =
    "SELECT intent_hash, receipt FROM command_requests WHERE namespace = $1 AND workflow_id = $2 AND command_type = $3 AND request_id = $4";
const INSERT_RECEIPT: &str =
    "INSERT INTO command_requests (namespace, workflow_id, command_type, request_id, intent_hash, receipt, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7)";
const LOCK_DUTY_FENCE: Locking = locking!("SELECT duty_fence FROM tasks WHERE task_id = $1", "FOR UPDATE");
const RELEASE_DUTY: &str = "UPDATE tasks SET duty_owner = NULL, duty_expires_at = NULL WHERE task_id = $1";

/// The run of a row `(state, namespace, workflow_id, run_id[, receipt])`. A receipt column
/// holds the named task's receipt, kept on its row when a report closed it: the engine answers
/// a retried report from `closed_receipts`.
fn state_of(row: Option<crate::tx::Row>) -> StoreResult<Option<RunState>> {
    let Some(row) = row else { return Ok(None) };
    let mut run = read_run(row.str(0)?, row.str(1)?, row.str(2)?, row.str(3)?)?;
    if row.0.len() > 4 {
        if let Some(text) = row.opt_str(4)? {
            let receipt: ClosedTaskReceipt = serde_json::from_str(text)
                .map_err(|e| StoreError::Storage(format!("a task receipt of run {} does not parse: {e}", run.run_id.as_str())))?;
            if run.find_receipt(&receipt.task_id).is_none() {
                run.closed_receipts.push_back(receipt);
            }
        }
    }
    Ok(Some(run))
}

/// A stored run document, or [`StoreError::CorruptRun`] naming the run when it does not parse
/// or comes from a newer build (a retry would read the same bytes).
pub(crate) fn read_run(document: &str, namespace: &str, workflow_id: &str, run_id: &str) -> StoreResult<RunState> {
    let unreadable = |detail: String| {
        StoreError::CorruptRun(IntegrityBreach {
            namespace: namespace.to_string(),
            workflow_id: WorkflowId(workflow_id.to_string()),
            run_id: RunId(run_id.to_string()),
            detail,
        })
    };
    let mut run: RunState = serde_json::from_str(document).map_err(|e| unreadable(format!("the run document does not parse: {e}")))?;
    check_document_version(&run).map_err(unreadable)?;
    // Whatever version it was read from, it is written back in this build's form.
    run.document_version = RUN_DOCUMENT_VERSION;
    Ok(run)
}

/// Loads a run and holds it against other writers until commit. `skip_locked`: give up (None)
/// instead of waiting for another node.
pub(crate) async fn lock_run<T: Tx>(tx: &mut T, run_id: &str, skip_locked: bool) -> StoreResult<Option<RunState>> {
    let sql = if skip_locked { LOCK_RUN_OR_SKIP } else { LOCK_RUN }.sql(tx.dialect());
    let row = tx.query_opt(sql, &args![run_id]).await?;
    state_of(row)
}

/// Finds and locks the run `locator` names, in one statement.
pub(crate) async fn locate_and_lock<T: Tx>(tx: &mut T, namespace: &str, locator: &RunLocator) -> StoreResult<Option<RunState>> {
    let dialect = tx.dialect();
    locate(tx, namespace, locator, |statement| statement.sql(dialect)).await
}

/// Reads the run `locator` names, without a lock.
pub(crate) async fn load_run<T: Tx>(tx: &mut T, namespace: &str, locator: &RunLocator) -> StoreResult<Option<RunState>> {
    locate(tx, namespace, locator, Locking::unlocked).await
}

async fn locate<T: Tx>(
    tx: &mut T,
    namespace: &str,
    locator: &RunLocator,
    text: impl Fn(&Locking) -> &'static str,
) -> StoreResult<Option<RunState>> {
    let row = match locator {
        RunLocator::Task(task_id) => tx.query_opt(text(&LOCK_RUN_OF_TASK), &args![task_id.as_str(), namespace]).await?,
        RunLocator::Run(workflow_id, run_id) => {
            let args = args![run_id.as_str(), workflow_id.as_str(), namespace];
            tx.query_opt(text(&LOCK_NAMED_RUN), &args).await?
        }
        RunLocator::Current(workflow_id) => {
            tx.query_opt(text(&LOCK_CURRENT_RUN), &args![workflow_id.as_str(), namespace])
                .await?
        }
    };
    state_of(row)
}

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
    let Some(mut run) = state_of(row)? else {
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
