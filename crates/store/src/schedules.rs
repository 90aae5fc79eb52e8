//! Firing a schedule, the same on every backend: the engine decides (`capstan_engine::schedule`),
//! and this runs the decisions against the one open transaction that also holds the schedule's
//! row: starting workflows, closing the previous run for `cancel_other`/`terminate_other`, and
//! then writing the schedule back. Either all of it commits or none of it, so an occurrence
//! fires exactly once however many nodes evaluate the schedule.

use crate::logic::{locate, persist, run_rows};
use crate::sources::Env;
use crate::tx::{args, locking, Locking, Row, Tx};
use crate::{schedule_missing, FireReport, RunLocator, ScheduleEventRecord, ScheduleFilter, ScheduleFire, StoreError, StoreResult};
use capstan_engine::schedule::{Decision, OverlapPolicy, Schedule, Trigger};
use capstan_engine::{close_by_command, CloseCommand, CommandId, Millis, Payload, Reason, Refusal, RunId, RunState, StartRun, WorkflowId};
use serde_json::json;

/// Most occurrences one firing transaction handles (a long backfill runs in several calls).
pub const FIRE_BATCH: usize = 100;
/// Most occurrences one backfill request may name.
pub const BACKFILL_MAX: usize = 1000;

async fn previous_open<T: Tx>(tx: &mut T, schedule: &Schedule) -> StoreResult<bool> {
    match &schedule.latest_workflow_id {
        Some(id) => Ok(current_run(tx, &schedule.namespace, id).await?.is_some_and(|run| !run.is_closed())),
        None => Ok(false),
    }
}

async fn current_run<T: Tx>(tx: &mut T, namespace: &str, workflow_id: &str) -> StoreResult<Option<RunState>> {
    locate::locate_and_lock(tx, namespace, &RunLocator::Current(WorkflowId(workflow_id.to_string()))).await
}

/// Starts a new instance (the id is fresh).
async fn start_instance<T: Tx>(tx: &mut T, start: StartRun, now: Millis, env: &Env) -> StoreResult<()> {
    let mut ids = env.ids();
    let mut cx = env.cx(now, &mut ids);
    let run = capstan_engine::start_run(&mut cx, start);
    let effects = cx.effects;
    run_rows::insert_instance(tx, &run, now).await?;
    persist::persist(tx, &run, &effects, true, env).await
}

/// Cancels or terminates the current run of `workflow_id` if it is open.
async fn close_current<T: Tx>(
    tx: &mut T,
    namespace: &str,
    workflow_id: &str,
    command: CloseCommand,
    reason: String,
    now: Millis,
    env: &Env,
) -> StoreResult<()> {
    let Some(mut run) = current_run(tx, namespace, workflow_id).await? else {
        return Ok(());
    };
    if run.is_closed() {
        return Ok(());
    }
    let mut ids = env.ids();
    let mut cx = env.cx(now, &mut ids);
    close_by_command(&mut run, &mut cx, command, Some(reason), CommandId(env.new_id()))?;
    let effects = cx.effects;
    persist::persist(tx, &run, &effects, false, env).await
}

/// One occurrence about to start: what fired it and under which policy.
struct Firing {
    occurrence: Millis,
    trigger: Trigger,
    policy: OverlapPolicy,
    close_previous: Option<CloseCommand>,
}

/// Starts the action for one occurrence; `Ok(None)` when the start itself was refused (recorded
/// as a failure on the schedule).
async fn start_one<T: Tx>(
    tx: &mut T,
    schedule: &mut Schedule,
    firing: Firing,
    empty_input: &Payload,
    now: Millis,
    env: &Env,
) -> StoreResult<Option<(String, String)>> {
    let Firing {
        occurrence,
        trigger,
        policy,
        close_previous,
    } = firing;
    if let (Some(command), Some(previous)) = (close_previous, schedule.latest_workflow_id.clone()) {
        let reason = format!("Schedule overlap: {} policy applied.", policy.as_str());
        close_current(tx, &schedule.namespace, &previous, command, reason, now, env).await?;
    }
    let workflow_id = env.new_id().to_lowercase();
    let run_id = env.new_id();
    let action = &schedule.action;
    let start = StartRun {
        scheduling: Default::default(),
        namespace: schedule.namespace.clone(),
        workflow_id: WorkflowId(workflow_id.clone()),
        run_id: RunId(run_id.clone()),
        workflow_type: action.workflow_type.clone(),
        task_queue: action.task_queue.clone().unwrap_or_else(|| "default".into()),
        input: action.input_payload.clone().unwrap_or_else(|| empty_input.clone()),
        execution_timeout_seconds: action.execution_timeout_seconds,
        run_timeout_seconds: action.run_timeout_seconds,
        business_key: None,
        memo: schedule.memo.clone().unwrap_or_default(),
        search_attributes: schedule.search_attributes.clone().unwrap_or_default(),
        command_id: CommandId(env.new_id()),
        contract: None,
        compatibility: None,
        origin_trace: None,
        principal: schedule.acting.clone(),
    };
    match start_instance(tx, start, now, env).await {
        Ok(()) => {
            schedule.record_started(occurrence, trigger, policy, &workflow_id, &run_id, now);
            Ok(Some((workflow_id, run_id)))
        }
        Err(crate::StoreError::Refused(refusal)) => {
            schedule.record_failure(refusal.reason.as_str(), now);
            Ok(None)
        }
        Err(error) => Err(error),
    }
}

/// Runs `fire` on `schedule` (already loaded and locked by the caller, who writes it back).
pub(crate) async fn fire<T: Tx>(
    tx: &mut T,
    schedule: &mut Schedule,
    fire: &ScheduleFire,
    empty_input: &Payload,
    now: Millis,
    env: &Env,
) -> StoreResult<FireReport> {
    let mut report = FireReport::default();
    match fire {
        ScheduleFire::Due { catchup_window_ms } => {
            let mut handled = 0;
            // Buffered occurrences first, one at a time, each once the previous run closed.
            while handled < FIRE_BATCH {
                let open = previous_open(tx, schedule).await?;
                let Some(occurrence) = schedule.take_buffered(open) else { break };
                handled += 1;
                let firing = Firing {
                    occurrence,
                    trigger: Trigger::Drain,
                    policy: schedule.overlap_policy,
                    close_previous: None,
                };
                if start_one(tx, schedule, firing, empty_input, now, env).await?.is_some() {
                    report.started += 1;
                    report.lateness_ms.push((now - occurrence).max(0));
                }
            }
            while handled < FIRE_BATCH {
                let Some(occurrence) = schedule.take_due(now, *catchup_window_ms) else {
                    break;
                };
                handled += 1;
                schedule.advance_past(occurrence);
                let open = previous_open(tx, schedule).await?;
                let policy = schedule.overlap_policy;
                if let Decision::Start { policy, close_previous } = schedule.decide(occurrence, Trigger::Tick, policy, open, now) {
                    let firing = Firing {
                        occurrence,
                        trigger: Trigger::Tick,
                        policy,
                        close_previous,
                    };
                    if start_one(tx, schedule, firing, empty_input, now, env).await?.is_some() {
                        report.started += 1;
                        report.lateness_ms.push((now - occurrence).max(0));
                    }
                }
            }
            report.outcome = "evaluated".into();
        }
        ScheduleFire::Manual { policy, principal } => {
            schedule.acting_as(principal.clone());
            let open = previous_open(tx, schedule).await?;
            let policy = policy.unwrap_or(schedule.overlap_policy);
            match schedule.decide(now, Trigger::Manual, policy, open, now) {
                Decision::Start { policy, close_previous } => {
                    let firing = Firing {
                        occurrence: now,
                        trigger: Trigger::Manual,
                        policy,
                        close_previous,
                    };
                    match start_one(tx, schedule, firing, empty_input, now, env).await? {
                        Some((workflow_id, run_id)) => {
                            report.outcome = "triggered".into();
                            report.workflow_id = Some(workflow_id);
                            report.run_id = Some(run_id);
                            report.started = 1;
                        }
                        None => {
                            report.outcome = "trigger_failed".into();
                            report.reason = Some("the workflow could not be started".into());
                        }
                    }
                }
                Decision::Buffered(depth) => {
                    report.outcome = "buffered".into();
                    report.buffer_depth = Some(depth);
                }
                Decision::BufferFull => {
                    report.outcome = "buffer_full".into();
                    report.reason = Some("Previous workflow is still running and buffer is at capacity.".into());
                }
                Decision::Skipped(reason) => {
                    report.outcome = "skipped".into();
                    report.reason = Some(reason.into());
                }
            }
        }
        ScheduleFire::Backfill {
            start,
            end,
            policy,
            principal,
        } => {
            schedule.acting_as(principal.clone());
            let policy = policy.unwrap_or(schedule.overlap_policy);
            for occurrence in schedule.occurrences_between(*start, *end, BACKFILL_MAX) {
                let fire_time = capstan_engine::timefmt::iso8601(occurrence);
                let open = previous_open(tx, schedule).await?;
                match schedule.decide(occurrence, Trigger::Backfill, policy, open, now) {
                    Decision::Start { policy, close_previous } => {
                        let firing = Firing {
                            occurrence,
                            trigger: Trigger::Backfill,
                            policy,
                            close_previous,
                        };
                        match start_one(tx, schedule, firing, empty_input, now, env).await? {
                            Some((workflow_id, _)) => {
                                report.started += 1;
                                report
                                    .results
                                    .push(json!({"fire_time": fire_time, "workflow_id": workflow_id, "outcome": "started"}));
                            }
                            None => report
                                .results
                                .push(json!({"fire_time": fire_time, "outcome": "failed", "reason": "the workflow could not be started"})),
                        }
                    }
                    _ => report.results.push(json!({"fire_time": fire_time, "outcome": "skipped"})),
                }
                if schedule.status == capstan_engine::schedule::ScheduleStatus::Deleted {
                    break;
                }
            }
            report.outcome = "backfill_started".into();
        }
    }
    Ok(report)
}

// ------------------------------------------------------------------------------------------
// Schedule rows: the document, its scheduler columns and the append-only audit events.

const LOCK_SCHEDULE: Locking = locking!(
    "SELECT doc FROM schedules WHERE namespace = $1 AND schedule_id = $2 AND status != 'deleted'",
    "FOR UPDATE"
);
const LOCK_SCHEDULE_OR_SKIP: Locking = locking!(
    "SELECT doc FROM schedules WHERE namespace = $1 AND schedule_id = $2 AND status != 'deleted'",
    "FOR UPDATE SKIP LOCKED"
);
const LOCK_ANY_SCHEDULE: Locking = locking!(
    "SELECT status FROM schedules WHERE namespace = $1 AND schedule_id = $2",
    "FOR UPDATE"
);
const UPSERT_SCHEDULE: &str = "INSERT INTO schedules (namespace, schedule_id, status, workflow_type, wake_at, has_buffer, created_at, doc)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
     ON CONFLICT (namespace, schedule_id) DO UPDATE SET status = excluded.status, workflow_type = excluded.workflow_type,
       wake_at = excluded.wake_at, has_buffer = excluded.has_buffer, created_at = excluded.created_at, doc = excluded.doc";
const INSERT_SCHEDULE_EVENT: &str =
    "INSERT INTO schedule_events (namespace, schedule_id, sequence, event_id, event_type, recorded_at, workflow_id, run_id, payload)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";

fn schedule_of(row: Option<Row>) -> StoreResult<Option<Schedule>> {
    row.map(|row| Ok(serde_json::from_str(row.str(0)?)?)).transpose()
}

/// The schedule (not deleted), locked for this transaction; `skip_locked`: none if another
/// node holds it.
async fn lock_schedule<T: Tx>(tx: &mut T, namespace: &str, schedule_id: &str, skip_locked: bool) -> StoreResult<Option<Schedule>> {
    let sql = if skip_locked { LOCK_SCHEDULE_OR_SKIP } else { LOCK_SCHEDULE }.sql(tx.dialect());
    schedule_of(tx.query_opt(sql, &args![namespace, schedule_id]).await?)
}

/// Writes the document and appends its pending audit events.
async fn write_schedule<T: Tx>(tx: &mut T, schedule: &mut Schedule, env: &Env) -> StoreResult<()> {
    let doc = serde_json::to_string(schedule)?;
    let args = args![
        &schedule.namespace,
        &schedule.schedule_id,
        schedule.status.as_str(),
        &schedule.action.workflow_type,
        schedule.wake_at(),
        i64::from(schedule.has_buffer()),
        schedule.created_at,
        doc.as_str(),
    ];
    tx.execute(UPSERT_SCHEDULE, &args).await?;
    let last = "SELECT COALESCE(MAX(sequence), 0) FROM schedule_events WHERE namespace = $1 AND schedule_id = $2";
    let last = tx.query_opt(last, &args![&schedule.namespace, &schedule.schedule_id]).await?;
    let mut sequence = last.map(|row| row.int(0)).transpose()?.unwrap_or(0);
    for event in std::mem::take(&mut schedule.pending_events) {
        sequence += 1;
        let event_id = env.new_id().to_lowercase();
        let payload = serde_json::to_string(&event.payload)?;
        let args = args![
            &schedule.namespace,
            &schedule.schedule_id,
            sequence,
            event_id.as_str(),
            event.event_type.as_str(),
            event.recorded_at,
            &event.workflow_id,
            &event.run_id,
            payload.as_str(),
        ];
        tx.execute(INSERT_SCHEDULE_EVENT, &args).await?;
    }
    Ok(())
}

fn already_exists(schedule: &Schedule) -> StoreError {
    Refusal::new(
        Reason::ScheduleAlreadyExists,
        format!(
            "Schedule [{}] already exists in namespace [{}].",
            schedule.schedule_id, schedule.namespace
        ),
    )
    .with("schedule_id", schedule.schedule_id.clone())
    .into()
}

/// Creates a schedule; an id in use (not deleted) is refused. The row lock (or, for a new id,
/// the primary key) serialises concurrent creates.
pub(crate) async fn create_schedule<T: Tx>(tx: &mut T, mut schedule: Schedule, env: &Env) -> StoreResult<()> {
    let sql = LOCK_ANY_SCHEDULE.sql(tx.dialect());
    let existing = tx.query_opt(sql, &args![&schedule.namespace, &schedule.schedule_id]).await?;
    if existing
        .map(|row| row.text(0))
        .transpose()?
        .is_some_and(|status| status != "deleted")
    {
        return Err(already_exists(&schedule));
    }
    match write_schedule(tx, &mut schedule, env).await {
        Err(StoreError::Conflict { .. }) => Err(already_exists(&schedule)),
        other => other,
    }
}

pub(crate) async fn schedule<T: Tx>(tx: &mut T, namespace: &str, schedule_id: &str) -> StoreResult<Option<Schedule>> {
    schedule_of(tx.query_opt(LOCK_SCHEDULE.unlocked(), &args![namespace, schedule_id]).await?)
}

pub(crate) async fn list_schedules<T: Tx>(tx: &mut T, namespace: &str, filter: &ScheduleFilter) -> StoreResult<Vec<Schedule>> {
    let sql = "SELECT doc FROM schedules WHERE namespace = $1 AND status != 'deleted'
                 AND (CAST($2 AS TEXT) IS NULL OR status = $2) AND (CAST($3 AS TEXT) IS NULL OR workflow_type = $3)
                 AND (CAST($4 AS BIGINT) IS NULL OR created_at < $4 OR (created_at = $4 AND schedule_id > $5))
               ORDER BY created_at DESC, schedule_id ASC LIMIT $6";
    let (after_at, after_id) = filter.after.clone().unzip();
    let args = args![
        namespace,
        &filter.status,
        &filter.workflow_type,
        after_at,
        &after_id,
        filter.limit as i64
    ];
    let rows = tx.query(sql, &args).await?;
    rows.iter().map(|row| Ok(serde_json::from_str(row.str(0)?)?)).collect()
}

/// Applies an operator's change to a locked schedule and writes it back.
pub(crate) async fn change_schedule<T: Tx, V>(
    tx: &mut T,
    namespace: &str,
    schedule_id: &str,
    change: impl FnOnce(&mut Schedule) -> Result<V, Refusal>,
    env: &Env,
) -> StoreResult<V> {
    let mut schedule = lock_schedule(tx, namespace, schedule_id, false)
        .await?
        .ok_or_else(|| schedule_missing(schedule_id, namespace))?;
    let value = change(&mut schedule)?;
    write_schedule(tx, &mut schedule, env).await?;
    Ok(value)
}

/// Locks the schedule and runs one firing on it. The scheduler's evaluation skips a schedule
/// another node is firing (an empty report); operators' triggers wait for it.
pub(crate) async fn fire_schedule<T: Tx>(
    tx: &mut T,
    namespace: &str,
    schedule_id: &str,
    request: &ScheduleFire,
    empty_input: &Payload,
    now: Millis,
    env: &Env,
) -> StoreResult<FireReport> {
    let evaluation = matches!(request, ScheduleFire::Due { .. });
    let Some(mut schedule) = lock_schedule(tx, namespace, schedule_id, evaluation).await? else {
        if evaluation {
            return Ok(FireReport::default());
        }
        return Err(schedule_missing(schedule_id, namespace));
    };
    let before = serde_json::to_string(&schedule)?;
    let report = fire(tx, &mut schedule, request, empty_input, now, env).await?;
    if serde_json::to_string(&schedule)? != before || !schedule.pending_events.is_empty() {
        write_schedule(tx, &mut schedule, env).await?;
    }
    Ok(report)
}

pub(crate) async fn due_schedules<T: Tx>(tx: &mut T, now: Millis, limit: usize) -> StoreResult<Vec<(String, String)>> {
    let sql = "SELECT namespace, schedule_id FROM schedules WHERE (wake_at IS NOT NULL AND wake_at <= $1) OR has_buffer = 1
               ORDER BY wake_at LIMIT $2";
    let rows = tx.query(sql, &args![now, limit as i64]).await?;
    rows.iter().map(|row| Ok((row.text(0)?, row.text(1)?))).collect()
}

pub(crate) async fn next_schedule_wake<T: Tx>(tx: &mut T) -> StoreResult<Option<Millis>> {
    let row = tx.query_opt("SELECT MIN(wake_at) FROM schedules", &[]).await?;
    Ok(row.map(|row| row.opt_int(0)).transpose()?.flatten())
}

/// A schedule's audit events after `after_sequence`; `None` for an unknown schedule (the
/// events of a deleted one remain).
pub(crate) async fn schedule_history<T: Tx>(
    tx: &mut T,
    namespace: &str,
    schedule_id: &str,
    after_sequence: i64,
    limit: usize,
) -> StoreResult<Option<Vec<ScheduleEventRecord>>> {
    let known = "SELECT 1 FROM schedules WHERE namespace = $1 AND schedule_id = $2";
    if tx.query_opt(known, &args![namespace, schedule_id]).await?.is_none() {
        return Ok(None);
    }
    let sql = "SELECT sequence, event_id, event_type, recorded_at, workflow_id, run_id, payload FROM schedule_events
               WHERE namespace = $1 AND schedule_id = $2 AND sequence > $3 ORDER BY sequence LIMIT $4";
    let rows = tx.query(sql, &args![namespace, schedule_id, after_sequence, limit as i64]).await?;
    rows.iter()
        .map(|row| {
            Ok(ScheduleEventRecord {
                sequence: row.int(0)?,
                event_id: row.text(1)?,
                event_type: row.text(2)?,
                recorded_at: row.int(3)?,
                workflow_id: row.opt_str(4)?.map(str::to_string),
                run_id: row.opt_str(5)?.map(str::to_string),
                payload: serde_json::from_str(row.str(6)?)?,
            })
        })
        .collect::<StoreResult<Vec<_>>>()
        .map(Some)
}
