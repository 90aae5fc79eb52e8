//! Firing a schedule, the same on every backend: the engine decides (`capstan_engine::schedule`),
//! and this runs the decisions against the one open transaction that also holds the schedule's
//! row: starting workflows, closing the previous run for `cancel_other`/`terminate_other`, and
//! then writing the schedule back. Either all of it commits or none of it, so an occurrence
//! fires exactly once however many nodes evaluate the schedule.

use crate::logic::{persist, runs};
use crate::tx::Tx;
use crate::{FireReport, RunLocator, ScheduleFire, StoreResult, UlidIds};
use capstan_engine::schedule::{Decision, OverlapPolicy, Schedule, Trigger};
use capstan_engine::{close_by_command, CloseCommand, CommandId, Cx, Limits, Millis, Payload, RunId, RunState, StartRun, WorkflowId};
use serde_json::json;

/// Most occurrences one firing transaction handles (a long backfill runs in several calls).
pub const FIRE_BATCH: usize = 100;
/// Most occurrences one backfill request may name.
pub const BACKFILL_MAX: usize = 1000;

fn previous_open<'a, T: Tx>(tx: &'a mut T, schedule: &'a Schedule) -> impl std::future::Future<Output = StoreResult<bool>> + Send + 'a {
    async move {
        match &schedule.latest_workflow_id {
            Some(id) => Ok(current_run(tx, &schedule.namespace, id).await?.is_some_and(|run| !run.is_closed())),
            None => Ok(false),
        }
    }
}

async fn current_run<T: Tx>(tx: &mut T, namespace: &str, workflow_id: &str) -> StoreResult<Option<RunState>> {
    runs::locate_and_lock(tx, namespace, &RunLocator::Current(WorkflowId(workflow_id.to_string()))).await
}

/// Starts a new instance (the id is fresh).
async fn start_instance<T: Tx>(tx: &mut T, start: StartRun, now: Millis, limits: &Limits) -> StoreResult<()> {
    let mut ids = UlidIds;
    let mut cx = Cx::new(now, &mut ids, limits);
    let run = capstan_engine::start_run(&mut cx, start);
    let effects = cx.effects;
    persist::insert_instance(tx, &run, now).await?;
    persist::persist(tx, &run, &effects, true, limits).await
}

/// Cancels or terminates the current run of `workflow_id` if it is open.
async fn close_current<T: Tx>(tx: &mut T, namespace: &str, workflow_id: &str, command: CloseCommand, reason: String, now: Millis, limits: &Limits) -> StoreResult<()> {
    let Some(mut run) = current_run(tx, namespace, workflow_id).await? else {
        return Ok(());
    };
    if run.is_closed() {
        return Ok(());
    }
    let mut ids = UlidIds;
    let mut cx = Cx::new(now, &mut ids, limits);
    close_by_command(&mut run, &mut cx, command, Some(reason), CommandId(crate::new_ulid().to_string()))?;
    let effects = cx.effects;
    persist::persist(tx, &run, &effects, false, limits).await
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
    limits: &Limits,
) -> StoreResult<Option<(String, String)>> {
    let Firing {
        occurrence,
        trigger,
        policy,
        close_previous,
    } = firing;
    if let (Some(command), Some(previous)) = (close_previous, schedule.latest_workflow_id.clone()) {
        let reason = format!("Schedule overlap: {} policy applied.", policy.as_str());
        close_current(tx, &schedule.namespace, &previous, command, reason, now, limits).await?;
    }
    let workflow_id = crate::new_ulid().to_string().to_lowercase();
    let run_id = crate::new_ulid().to_string();
    let action = &schedule.action;
    let start = StartRun {
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
        command_id: CommandId(crate::new_ulid().to_string()),
        contract: None,
        compatibility: None,
    };
    match start_instance(tx, start, now, limits).await {
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
    limits: &Limits,
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
                if start_one(tx, schedule, firing, empty_input, now, limits).await?.is_some() {
                    report.started += 1;
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
                    if start_one(tx, schedule, firing, empty_input, now, limits).await?.is_some() {
                        report.started += 1;
                    }
                }
            }
            report.outcome = "evaluated".into();
        }
        ScheduleFire::Manual { policy } => {
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
                    match start_one(tx, schedule, firing, empty_input, now, limits).await? {
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
        ScheduleFire::Backfill { start, end, policy } => {
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
                        match start_one(tx, schedule, firing, empty_input, now, limits).await? {
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
