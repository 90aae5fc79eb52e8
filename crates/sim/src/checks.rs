//! The guarantees checked after every step and at the end (see [`check_run`]): chains,
//! acknowledged heads, one terminal fact per durable id, principals, fences, leases, settled
//! updates, schedules, redrives, no retry of an unknown outcome, activity leases within their
//! cap, kept run counts equal to a full count, and liveness. They read the
//! world's store and what it has seen, and what the clients know they asked for.

use crate::clients::Clients;
use crate::program::nexus::check_service_calls;
use crate::program::Programs;
use crate::report::Failure;
use crate::workers::WORKERS;
use crate::workload::{CHILD_TYPE, NAMESPACE, QUEUE, SIMULATED_CLIENT, SIMULATED_OPERATOR, SIMULATED_WORKER};
use crate::world::World;
use capstan_engine::sticky::STICKY_HOLD_MS;
use capstan_engine::{
    verify_chain_from, ActivityLeaseGrant, EventType, HistoryEvent, Millis, Principal, ReplayMode, RunId, RunState, Task, TaskDetail,
    TaskId, TaskKind, UpdateStatus, WorkflowId,
};
use capstan_store::{FleetStore, RunLocator, RunStore, ScheduleStore, TaskStore};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// After the calm phase: every run closed, every update settled (the checks above), and
/// the counts of what the seed exercised.
pub(crate) async fn check_settled(world: &mut World) -> Result<(), Failure> {
    for (run_id, workflow_id) in world.seen.run_workflows.clone() {
        let run = world
            .store()
            .load_run(NAMESPACE, RunLocator::Run(WorkflowId(workflow_id), RunId(run_id.clone())))
            .await
            .map_err(|e| world.fail(format!("load: {e}")))?
            .ok_or_else(|| world.fail(format!("run {run_id} is gone")))?;
        if !run.is_closed() {
            return Err(world.fail(format!("liveness: run {run_id} is still open")));
        }
        if run.run_number > 1 {
            world.counters.continued_as_new += 1;
        }
        if run.workflow_type == CHILD_TYPE && run.run_number == 1 {
            match run.service_call_ids.is_empty() {
                true => world.counters.children_started += 1,
                false => world.counters.service_calls += 1,
            }
        }
    }
    world.counters.completed = world.seen.run_workflows.values().collect::<BTreeSet<_>>().len();
    Ok(())
}

/// The replay mode a workflow lease was given agrees with the run's sticky owner, and a
/// run claimed by a registered worker went to another only after its hold ran out (`retired`:
/// the workers gone for good).
pub(crate) fn check_replay_mode(
    world: &mut World,
    retired: &BTreeSet<String>,
    task: &Task,
    run: &RunState,
    owner: &str,
    leased_at: Millis,
) -> Result<(), Failure> {
    let TaskDetail::Workflow { replay_mode, .. } = &task.detail else {
        return Ok(());
    };
    let expected = run.replay_mode_for(owner, leased_at);
    world.counters.replay_modes[expected as usize] += 1;
    if *replay_mode != Some(expected) {
        return Err(world.fail(format!(
            "workflow task {} leased by {owner} with replay mode {replay_mode:?}, expected {expected:?} ({:?})",
            task.id, run.sticky
        )));
    }
    if let (ReplayMode::ForcedColdReplay, Some(affinity)) = (expected, &run.sticky) {
        let held_until = affinity.expires_at.min(task.available_at.max(task.created_at) + STICKY_HOLD_MS);
        if leased_at < held_until && !retired.contains(&affinity.worker_id) {
            return Err(world.fail(format!(
                "workflow task {} of {} held for {} until {held_until} went to {owner} before its hold ran out (created {}, available {}, affinity {affinity:?})",
                task.id, run.workflow_id, affinity.worker_id, task.created_at, task.available_at
            )));
        }
    }
    Ok(())
}

/// A granted lease renewal is the lease the run holds for that worker, live, and it
/// recorded nothing: the run's history head is where it was.
pub(crate) fn check_lease_grant(
    world: &World,
    task_id: &TaskId,
    grant: &ActivityLeaseGrant,
    run: &RunState,
    before: Option<(u64, String)>,
    now: Millis,
) -> Result<(), Failure> {
    let held = run.tasks.get(task_id).and_then(|t| t.lease());
    if held != Some(&grant.lease) {
        return Err(world.fail(format!("renewal of {task_id} granted {:?}, the run holds {held:?}", grant.lease)));
    }
    if grant.lease.expires_at <= now {
        return Err(world.fail(format!("renewal of {task_id} granted an expired lease")));
    }
    if before != Some((run.last_sequence, run.last_hash.clone())) {
        return Err(world.fail(format!("renewing the lease of {task_id} changed its run's history")));
    }
    Ok(())
}

/// Nothing of a paused run is leased: the run a lease came with was not paused when it was
/// taken.
pub(crate) fn check_not_paused(world: &World, task: &Task, run: &RunState) -> Result<(), Failure> {
    match &run.paused {
        Some(pause) => Err(world.fail(format!(
            "task {} of {} was leased while its run was paused (since {})",
            task.id, run.workflow_id, pause.paused_at
        ))),
        None => Ok(()),
    }
}

/// A session activity is leased only by its session's holder, inside the session's lease.
pub(crate) async fn check_session_holder(world: &mut World, task: &Task, run: &RunState, owner: &str) -> Result<(), Failure> {
    let Some(requirement) = capstan_app::sessions::session_of_task(run, &task.id) else {
        return Ok(());
    };
    world.counters.session_attempts += 1;
    let session_id = &requirement.options.session_id;
    let session = world.store().get_session(NAMESPACE, session_id).await;
    let session = session.map_err(|e| world.fail(format!("session: {e}")))?;
    match session {
        Some(session) if session.held_by(owner, world.now) => Ok(()),
        other => Err(world.fail(format!(
            "activity task {} of session {session_id} leased by {owner}, but the session is {other:?}",
            task.id
        ))),
    }
}

/// Every occurrence of a schedule started at most one workflow, and every workflow it
/// started exists (and must finish).
pub(crate) async fn check_schedule(world: &mut World, schedule_id: &str) -> Result<(), Failure> {
    let events = world
        .store()
        .schedule_history(NAMESPACE, schedule_id, 0, 100_000)
        .await
        .map_err(|e| world.fail(format!("schedule history: {e}")))?
        .unwrap_or_default();
    let mut occurrences = BTreeSet::new();
    for event in events.iter().filter(|e| e.event_type == "ScheduleTriggered") {
        let occurrence = event.payload.get("occurrence_time").and_then(Value::as_str).unwrap_or("");
        if !occurrences.insert(occurrence.to_string()) {
            return Err(world.fail(format!("{schedule_id}: occurrence {occurrence} started twice")));
        }
        let Some(workflow_id) = event.workflow_id.clone() else {
            return Err(world.fail(format!("{schedule_id}: a trigger without its workflow")));
        };
        if world.seen.instances.insert(workflow_id.clone()) {
            world.counters.scheduled_starts += 1;
        }
        match world.current_run(&workflow_id).await? {
            Some(run) => {
                if !world.seen.acked.contains_key(run.run_id.as_str()) {
                    world.seen.acknowledge(&run);
                }
            }
            None => return Err(world.fail(format!("{schedule_id} started {workflow_id}, which does not exist"))),
        }
    }
    Ok(())
}

/// The runs acknowledged since the last check.
pub(crate) async fn check_touched(world: &mut World, clients: &Clients) -> Result<(), Failure> {
    for run_id in std::mem::take(&mut world.seen.touched) {
        check_run(world, clients, &run_id).await?;
    }
    Ok(())
}

/// Everything acknowledged (after a restart or a power cut, and at the end): every run, every
/// schedule, every import, every payload an instance names.
pub(crate) async fn check_all(world: &mut World, clients: &Clients) -> Result<(), Failure> {
    world.seen.touched.clear();
    for run_id in world.seen.acked.keys().cloned().collect::<Vec<_>>() {
        check_run(world, clients, &run_id).await?;
    }
    for schedule_id in clients.schedules.ids() {
        check_schedule(world, &schedule_id).await?;
    }
    clients.imports.check(world).await?;
    clients.uploads.check_held(world).await?;
    clients.batches.check(world).await?;
    check_run_counts(world).await
}

/// The run counts kept in the store's transactions equal a full count of its runs, through
/// every transition and power cut the seed made.
async fn check_run_counts(world: &mut World) -> Result<(), Failure> {
    let drift = world
        .store()
        .run_count_drift(None)
        .await
        .map_err(|e| world.fail(format!("run counts: {e}")))?;
    match drift.is_empty() {
        true => Ok(()),
        false => Err(world.fail(format!("kept run counts differ from a full count: {drift:?}"))),
    }
}

/// The guarantees of one run, from its stored state and history.
pub(crate) async fn check_run(world: &mut World, clients: &Clients, run_id: &str) -> Result<(), Failure> {
    let (run, events) = stored_run(world, run_id).await?;
    clients.ingested.check_messages(world, &run, &events)?;
    check_service_calls(world, run_id, &events)?;
    crate::clients::streams::check_output_stream(world, &run, &events).await?;
    check_acknowledged_head(world, run_id, &events)?;
    check_terminal_facts(world, &clients.programs, &run, &events)?;
    check_local_attempt_ends(world, run_id, &events)?;
    check_condition_waits(world, run_id, &events)?;
    check_updates_settled(world, &run)?;
    check_redriven(world, &run, &events)?;
    check_unknown_not_retried(world, &run, &events)
}

/// A run as stored, with its whole history, which must hold as many events as the run says
/// and chain without a break.
async fn stored_run(world: &World, run_id: &str) -> Result<(RunState, Vec<HistoryEvent>), Failure> {
    let workflow_id = world
        .seen
        .run_workflows
        .get(run_id)
        .cloned()
        .ok_or_else(|| world.fail(format!("run {run_id} was never seen")))?;
    let run = world
        .store()
        .load_run(NAMESPACE, RunLocator::Run(WorkflowId(workflow_id), RunId(run_id.to_string())))
        .await
        .map_err(|e| world.fail(format!("load: {e}")))?
        .ok_or_else(|| world.fail(format!("run {run_id} is gone")))?;
    let events = world
        .store()
        .history(&run.run_id, 0, run.last_sequence, run.last_sequence as usize + 1)
        .await
        .map_err(|e| world.fail(format!("history: {e}")))?;
    if events.len() as u64 != run.last_sequence {
        return Err(world.fail(format!(
            "{run_id}: {} events stored, the run says {}",
            events.len(),
            run.last_sequence
        )));
    }
    if let Err(sequence) = verify_chain_from(&run.chain_origin, &events) {
        return Err(world.fail(format!("{run_id}: the history chain breaks at event {sequence}")));
    }
    Ok((run, events))
}

/// No acknowledged write lost (across restarts too).
fn check_acknowledged_head(world: &World, run_id: &str, events: &[HistoryEvent]) -> Result<(), Failure> {
    let Some((sequence, hash)) = world.seen.acked.get(run_id) else {
        return Ok(());
    };
    match events.get((*sequence as usize).wrapping_sub(1)) {
        Some(event) if &event.hash == hash => Ok(()),
        _ if *sequence == 0 => Ok(()),
        other => Err(world.fail(format!(
            "{run_id}: acknowledged event {sequence} ({hash}) is not in history (found {:?})",
            other.map(|e| &e.hash)
        ))),
    }
}

/// At most one committed terminal fact per durable id, one terminal workflow event with only
/// archive bookkeeping after it, the right principal on every event, and every update outcome
/// after its acceptance.
fn check_terminal_facts(world: &World, programs: &Programs, run: &RunState, events: &[HistoryEvent]) -> Result<(), Failure> {
    let run_id = run.run_id.as_str();
    let mut terminal: BTreeMap<String, usize> = BTreeMap::new();
    let mut workflow_terminal = 0;
    for (index, event) in events.iter().enumerate() {
        check_principal(world, programs, run, event)?;
        if is_workflow_terminal(event.event_type) {
            workflow_terminal += 1;
            if index + 1 != events.len() && workflow_terminal == 1 {
                // Nothing follows a run's close but archive bookkeeping.
                let after: Vec<&str> = events[index + 1..].iter().map(|e| e.event_type.as_str()).collect();
                if after
                    .iter()
                    .any(|t| !matches!(*t, "ArchiveRequested" | "WorkflowArchived" | "ParentClosePolicyApplied"))
                {
                    return Err(world.fail(format!("{run_id}: events after the run closed: {after:?}")));
                }
            }
        }
        if let Some(key) = terminal_key(event) {
            *terminal.entry(key).or_default() += 1;
        }
    }
    if workflow_terminal > 1 {
        return Err(world.fail(format!("{run_id}: {workflow_terminal} terminal workflow events")));
    }
    if let Some((key, count)) = terminal.iter().find(|(_, count)| **count > 1) {
        return Err(world.fail(format!("{run_id}: {count} terminal facts for {key}")));
    }
    // An update's outcome follows its acceptance.
    for key in terminal.keys().filter_map(|k| k.strip_prefix("update outcome ")) {
        if !terminal.contains_key(&format!("update acceptance {key}")) {
            return Err(world.fail(format!("{run_id}: update {key} completed without being accepted")));
        }
    }
    Ok(())
}

fn is_workflow_terminal(event_type: EventType) -> bool {
    matches!(
        event_type,
        EventType::WorkflowCompleted
            | EventType::WorkflowFailed
            | EventType::WorkflowCancelled
            | EventType::WorkflowTerminated
            | EventType::WorkflowTimedOut
            | EventType::WorkflowContinuedAsNew
    )
}

/// The durable id an event is the one terminal fact of, if it is one.
fn terminal_key(event: &HistoryEvent) -> Option<String> {
    let id = |key: &str| event.payload.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    match event.event_type {
        EventType::ActivityCompleted | EventType::ActivityFailed | EventType::ActivityTimedOut | EventType::ActivityCancelled => {
            Some(format!("activity {}", id("activity_execution_id")))
        }
        EventType::ActivityCancellationAcknowledged => Some(format!("stop of attempt {}", id("activity_attempt_id"))),
        EventType::CooperativeCancellationDelivered => Some("cancellation delivery".to_string()),
        EventType::TimerFired => Some(format!("timer {}", id("timer_id"))),
        EventType::ChildRunCompleted | EventType::ChildRunFailed | EventType::ChildRunCancelled | EventType::ChildRunTerminated => {
            Some(format!("child {}", id("child_call_id")))
        }
        EventType::UpdateAccepted => Some(format!("update acceptance {}", id("update_id"))),
        EventType::UpdateCompleted => Some(format!("update outcome {}", id("update_id"))),
        EventType::SignalReceived => Some(format!(
            "signal {}",
            event.workflow_command_id.as_ref().map(|c| c.as_str()).unwrap_or("")
        )),
        _ => None,
    }
}

/// Who caused an event: a run the simulated client started records it on its start, a
/// completion records the worker that reported it, and a timer firing is the server's
/// doing and names no one; an operator's ledger resolution or redrive records the operator.
fn check_principal(world: &World, programs: &Programs, run: &RunState, event: &HistoryEvent) -> Result<(), Failure> {
    let principal = event.payload.get("principal");
    let client = Principal::token(SIMULATED_CLIENT).to_json();
    let worker = Principal::token(SIMULATED_WORKER).to_json();
    let operator = Principal::token(SIMULATED_OPERATOR).to_json();
    let resolution = event
        .payload
        .get("resolved_by")
        .and_then(|_| event.payload.get("ledger_key"))
        .and_then(Value::as_str)
        .map(|key| {
            run.ledger
                .get(key)
                .and_then(|entry| entry.resolution.as_ref())
                .map(|r| r["principal"].clone())
        });
    // The simulated client started the run: the first run of one of its instances.
    let client_started = run.run_number == 1 && programs.started(run.workflow_id.as_str());
    let wrong = match event.event_type {
        EventType::WorkflowStarted if client_started => principal != Some(&client),
        EventType::WorkflowStarted if run.redriven_from.is_some() => principal != Some(&operator),
        EventType::WorkflowCompleted if run.standalone.is_none() => principal != Some(&worker),
        EventType::TimerFired => principal.is_some(),
        // A confirmed outcome: the operator's resolution records the operator, a probe's
        // verdict no one (the server decided); an entry of an earlier run is not at hand.
        EventType::ActivityCompleted => match resolution {
            Some(Some(resolver)) if resolver == json!(SIMULATED_OPERATOR) => principal != Some(&operator),
            Some(Some(_)) => principal.is_some(),
            Some(None) => principal.is_some_and(|p| p != &operator),
            None => false,
        },
        _ => false,
    };
    if wrong {
        return Err(world.fail(format!(
            "{} {}: {} records principal {principal:?}",
            run.workflow_id,
            run.run_id,
            event.event_type.as_str()
        )));
    }
    Ok(())
}

/// A prepared local attempt ends once: a result, a failure, a timeout, a retry or a stop.
fn check_local_attempt_ends(world: &World, run_id: &str, events: &[HistoryEvent]) -> Result<(), Failure> {
    let mut attempt_ends: BTreeMap<&str, usize> = BTreeMap::new();
    for event in events {
        let ends = matches!(
            event.event_type,
            EventType::ActivityCompleted
                | EventType::ActivityFailed
                | EventType::ActivityTimedOut
                | EventType::ActivityCancelled
                | EventType::ActivityRetryScheduled
        );
        let local = event.payload.get("execution_mode").and_then(Value::as_str) == Some("local");
        if let (true, true, Some(attempt)) = (ends, local, event.payload.get("activity_attempt_id").and_then(Value::as_str)) {
            *attempt_ends.entry(attempt).or_default() += 1;
        }
    }
    match attempt_ends.iter().find(|(_, count)| **count > 1) {
        Some((attempt, count)) => Err(world.fail(format!("{run_id}: local attempt {attempt} ended {count} times"))),
        None => Ok(()),
    }
}

/// Every condition wait ends at most once (satisfied or timed out), and a timeout is its own
/// `ConditionWaitTimedOut` right after its timer's `TimerFired`, naming the same wait and timer.
fn check_condition_waits(world: &mut World, run_id: &str, events: &[HistoryEvent]) -> Result<(), Failure> {
    let mut ended: BTreeMap<&str, usize> = BTreeMap::new();
    for (at, event) in events.iter().enumerate() {
        let wait = event.payload.get("condition_wait_id").and_then(Value::as_str).unwrap_or("");
        match event.event_type {
            EventType::ConditionWaitSatisfied => *ended.entry(wait).or_default() += 1,
            EventType::ConditionWaitTimedOut => {
                *ended.entry(wait).or_default() += 1;
                world.counters.condition_timeouts += 1;
                let fired = at.checked_sub(1).map(|i| &events[i]);
                let same = |key: &str| fired.and_then(|f| f.payload.get(key)) == event.payload.get(key);
                let after_its_timer =
                    fired.is_some_and(|f| f.event_type == EventType::TimerFired) && same("condition_wait_id") && same("timer_id");
                if !after_its_timer {
                    return Err(world.fail(format!(
                        "{run_id}: condition wait {wait} timed out without its timer's TimerFired before it"
                    )));
                }
            }
            EventType::TimerFired
                if event.payload.get("timer_kind").and_then(Value::as_str) == Some("condition_timeout")
                    && events.get(at + 1).map(|next| next.event_type) != Some(EventType::ConditionWaitTimedOut) =>
            {
                return Err(world.fail(format!(
                    "{run_id}: condition wait {wait}'s timer fired without its ConditionWaitTimedOut"
                )));
            }
            _ => {}
        }
    }
    match ended.iter().find(|(_, count)| **count > 1) {
        Some((wait, count)) => Err(world.fail(format!("{run_id}: condition wait {wait} ended {count} times"))),
        None => Ok(()),
    }
}

/// A closed run has no update left open.
fn check_updates_settled(world: &World, run: &RunState) -> Result<(), Failure> {
    if run.is_closed() {
        if let Some((id, _)) = run.updates.iter().find(|(_, u)| u.status == UpdateStatus::Accepted) {
            return Err(world.fail(format!("{}: closed with update {id} still accepted", run.run_id)));
        }
    }
    Ok(())
}

/// A redriven run copies the steps before its resume step and schedules none of them.
fn check_redriven(world: &World, run: &RunState, events: &[HistoryEvent]) -> Result<(), Failure> {
    let Some(redrive) = &run.redriven_from else {
        return Ok(());
    };
    let resume = u64::from(redrive.resume_step_sequence);
    let step = |e: &HistoryEvent| e.payload.get("sequence").and_then(Value::as_u64).unwrap_or(0);
    let copied = events.iter().filter(|e| e.payload.contains_key("reused_from_run_id")).count() as u64;
    let rerun = events
        .iter()
        .any(|e| e.event_type == EventType::ActivityScheduled && step(e) < resume);
    if copied + 1 != resume || rerun {
        return Err(world.fail(format!(
            "{}: redriven at step {resume} with {copied} copied steps, rerun: {rerun}",
            run.run_id
        )));
    }
    Ok(())
}

/// No automatic retry of a step whose outcome is unknown.
fn check_unknown_not_retried(world: &mut World, run: &RunState, events: &[HistoryEvent]) -> Result<(), Failure> {
    for execution in run.activities.values() {
        let started = events
            .iter()
            .filter(|e| {
                e.event_type == EventType::ActivityStarted
                    && e.payload.get("activity_execution_id").and_then(Value::as_str) == Some(execution.id.as_str())
            })
            .count();
        // One block per unknown dispatch: a resolution (an operator's or a probe's) may
        // retry the step once, and its new dispatch may become unknown in turn.
        let Some(ledger_key) = &execution.blocked_by else { continue };
        let key = format!("{}:{ledger_key}", execution.id);
        match world.seen.blocked.get(&key) {
            Some(before) if started > *before => {
                return Err(world.fail(format!(
                    "{}: activity {key} was retried ({before} → {started} starts) while its outcome was unknown",
                    run.run_id
                )))
            }
            Some(_) => {}
            None => {
                world.seen.blocked.insert(key, started);
            }
        }
    }
    Ok(())
}

/// No lease takes the queue's activity tasks past the leased-task cap an operator set, nor its
/// fairness key past the key's cap.
pub(crate) async fn check_activity_cap(world: &mut World, leased_run: &RunState) -> Result<(), Failure> {
    let set = world.store().queue_limits(NAMESPACE, QUEUE).await;
    let set = set.map_err(|e| world.fail(format!("queue limits: {e}")))?;
    let capped = set.iter().find(|s| s.kind == TaskKind::Activity);
    let Some(state) = capped else { return Ok(()) };
    if state.limits.max_leased_tasks.is_some_and(|cap| state.leased > u64::from(cap)) {
        return Err(world.fail(format!("a lease took the activity tasks past their cap: {state:?}")));
    }
    // The lease just made must not have taken its fairness key past the key's cap. (Other
    // keys may stand above a cap an operator lowered since their leases: a cap holds new
    // leases back, it takes none away.)
    let class = capstan_engine::scheduling::class_of(leased_run.scheduling.fairness_key.as_deref()).to_string();
    let Some(cap) = state.limits.of_key(&class).and_then(|l| l.max_leased_tasks) else {
        return Ok(());
    };
    let mut leased = 0u64;
    for n in 0..WORKERS {
        let owner = format!("worker-{n}");
        let held = world.store().leased_tasks(NAMESPACE, &owner, TaskKind::Activity).await;
        for task_id in held.map_err(|e| world.fail(format!("leased tasks: {e}")))? {
            let run = world.store().load_run(NAMESPACE, RunLocator::Task(task_id)).await;
            let run = run.map_err(|e| world.fail(format!("load: {e}")))?;
            let of_class = |r: &RunState| capstan_engine::scheduling::class_of(r.scheduling.fairness_key.as_deref()) == class;
            if run.filter(|r| r.task_queue == QUEUE && of_class(r)).is_some() {
                leased += 1;
            }
        }
    }
    if leased > u64::from(cap) {
        return Err(world.fail(format!(
            "a lease took fairness key {class} to {leased} leased activities, past its cap of {cap}"
        )));
    }
    Ok(())
}
