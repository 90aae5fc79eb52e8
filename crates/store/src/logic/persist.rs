//! Persisting a transition's change and everything it sets off, in the caller's transaction:
//! the run's own rows (`run_rows.rs`), the successor of a continue-as-new, and the follow-on
//! transitions in other runs — children started and ended, the parent a closing child reports
//! to, a probe's answer, Nexus calls admitted, linked, cancelled and settled. Those follow-ons
//! persist changes of their own, so the recursion lives in this one file.

use super::locate::{locate_and_lock, lock_run};
use super::{run_rows, service_calls, BoxedStep};
use crate::tx::{args, Tx};
use crate::*;
use capstan_engine::ledger_probe::ProbeAnswer;
use capstan_engine::service_call::{LinkedRunClosed, ServiceWaiter};

const CURRENT_RUN_ANY_NAMESPACE: &str = "SELECT current_run_id FROM workflow_instances WHERE workflow_id = $1";

/// Writes a run's new state, its new events and its changed tasks; announces ready tasks; then
/// the successor and follow-on transitions. `insert_run`: the run is new.
pub(crate) fn persist<'a, T: Tx>(
    tx: &'a mut T,
    run: &'a RunState,
    effects: &'a Effects,
    insert_run: bool,
    env: &'a Env,
) -> BoxedStep<'a, ()> {
    Box::pin(async move {
        // A task made ready goes to a parked poll when one may take it: the run is written once,
        // with the lease.
        let handed = super::handoff::offer(tx, run, effects, env).await?;
        let (written, leases) = match &handed {
            Some(handed) => (&handed.run, Some(handed)),
            None => (run, None),
        };
        run_rows::write_change(tx, written, effects, leases, insert_run).await?;
        if let Some(successor) = &effects.successor {
            // Continue-as-new: the next run is born in the same transaction and becomes current.
            let (next, next_effects) = successor.as_ref();
            persist(tx, next, next_effects, true, env).await?;
            run_rows::set_current_run(tx, next).await?;
        }
        follow_on(tx, effects, env).await
    })
}

/// The transitions one transition sets off in other runs, in the same transaction: children it
/// started, the parent a closing child reports to, children a closing parent ends.
fn follow_on<'a, T: Tx>(tx: &'a mut T, effects: &'a Effects, env: &'a Env) -> BoxedStep<'a, ()> {
    Box::pin(async move {
        for (child, child_effects) in effects.children_started.iter().chain(&effects.probes_started) {
            run_rows::insert_instance(tx, child, child.started_at)
                .await
                .map_err(|error| match error {
                    StoreError::Conflict { message, .. } => StoreError::Storage(format!("start {}: {message}", child.workflow_id)),
                    other => other,
                })?;
            persist(tx, child, child_effects, true, env).await?;
        }
        if let Some(answer) = &effects.probe_answer {
            settle_probe(tx, answer, env).await?;
        }
        if let Some(notice) = &effects.parent_notice {
            if let Some(mut parent) = lock_run(tx, notice.parent.run_id.as_str(), false).await? {
                let mut ids = env.ids();
                let mut cx = env.cx(notice.closed_at, &mut ids);
                if resolve_child(&mut parent, &mut cx, notice)? {
                    let parent_effects = cx.effects;
                    persist(tx, &parent, &parent_effects, false, env).await?;
                }
            }
        }
        for request in &effects.cancel_children {
            cancel_child(tx, effects, request, env).await?;
        }
        write_admissions(tx, effects, env).await?;
        for (child_id, command) in &effects.close_children {
            let command_id = CommandId(env.new_id());
            on_open_child(tx, effects, child_id, env, |child, cx| {
                let reason = Some("parent closed (parent-close policy)".into());
                close_by_command(child, cx, *command, reason, command_id).map(drop)
            })
            .await?;
        }
        Ok(())
    })
}

/// A reconciliation probe's answer, applied in the transaction that closes the probe's host run
/// through the action instance's current run (the only one that extends the instance's
/// checkpoint chain), as an operator's resolution is: recorded on its entry. The run is locked before the entry is read, so an operator's
/// resolution committed meanwhile is seen and the answer changes nothing (it stays on the
/// probe's own run).
async fn settle_probe<T: Tx>(tx: &mut T, answer: &ProbeAnswer, env: &Env) -> StoreResult<()> {
    let target = &answer.target;
    let current = RunLocator::Current(target.workflow_id.clone());
    let Some(mut run) = locate_and_lock(tx, &target.namespace, &current).await? else {
        return Ok(());
    };
    let Some(stored) = super::ledger_reads::ledger_entry(tx, &target.namespace, &target.ledger_key).await? else {
        return Ok(());
    };
    let mut ids = env.ids();
    let mut cx = env.cx(answer.answered_at, &mut ids);
    match capstan_engine::answer_probe(&mut run, &mut cx, stored, answer) {
        Some(entry) => {
            tracing::info!(namespace = %target.namespace, ledger_key = %target.ledger_key, state = entry.state.as_str(),
                verdict = answer.verdict.name(), "reconciliation probe answered");
            let effects = cx.effects;
            persist(tx, &run, &effects, false, env).await
        }
        None => Ok(()),
    }
}

/// Asks a child instance's current run for a cooperative cancellation, in the parent's
/// transaction (the parent's delivery reached the child's call). A child already asked is left
/// as it is.
async fn cancel_child<T: Tx>(tx: &mut T, effects: &Effects, request: &ChildCancellation, env: &Env) -> StoreResult<()> {
    on_open_child(tx, effects, &request.workflow_id, env, |child, cx| {
        if child.cancellation.is_some() {
            return Ok(());
        }
        let (reason, timeout) = (request.reason.clone(), request.cleanup_timeout_seconds);
        request_cancellation(child, cx, reason, timeout, request.request_id.clone()).map(drop)
    })
    .await
}

/// Runs `transition` on a child instance's current run, if it is still open, in the parent's
/// transaction and at the parent's time; persists what it changed.
async fn on_open_child<T: Tx>(
    tx: &mut T,
    effects: &Effects,
    child_id: &WorkflowId,
    env: &Env,
    transition: impl FnOnce(&mut RunState, &mut Cx) -> Result<(), Refusal>,
) -> StoreResult<()> {
    let now = effects.events.last().map(|e| e.recorded_at);
    on_open_instance(tx, child_id, now, env, transition).await
}

/// Runs `transition` on an instance's current run, if it is still open, at `now` (else the
/// run's last progress); persists what it changed.
pub(crate) async fn on_open_instance<T: Tx>(
    tx: &mut T,
    workflow_id: &WorkflowId,
    now: Option<Millis>,
    env: &Env,
    transition: impl FnOnce(&mut RunState, &mut Cx) -> Result<(), Refusal>,
) -> StoreResult<()> {
    let current = tx.query_opt(CURRENT_RUN_ANY_NAMESPACE, &args![workflow_id.as_str()]).await?;
    let Some(run_id) = current.map(|row| row.text(0)).transpose()? else {
        return Ok(());
    };
    let Some(mut run) = lock_run(tx, &run_id, false).await? else {
        return Ok(());
    };
    if run.is_closed() {
        return Ok(());
    }
    let now = now.unwrap_or(run.last_progress_at);
    let mut ids = env.ids();
    let mut cx = env.cx(now, &mut ids);
    transition(&mut run, &mut cx)?;
    let run_effects = cx.effects;
    persist(tx, &run, &run_effects, false, env).await
}

/// Admits calls outside any run (the execute route): `admit` decides with a `Cx` at `now`,
/// and what it admitted is written in this transaction.
pub(crate) async fn admit_direct<T: Tx, R>(tx: &mut T, now: Millis, env: &Env, admit: impl FnOnce(&mut Cx) -> R) -> StoreResult<R> {
    let (answer, effects) = {
        let mut ids = env.ids();
        let mut cx = env.cx(now, &mut ids);
        let answer = admit(&mut cx);
        (answer, cx.effects)
    };
    write_admissions(tx, &effects, env).await?;
    Ok(answer)
}

/// What a transition admitted: its calls, its waiting steps, and the existing runs it linked.
pub(crate) fn write_admissions<'a, T: Tx>(tx: &'a mut T, effects: &'a Effects, env: &'a Env) -> BoxedStep<'a, ()> {
    Box::pin(async move {
        for call in &effects.service_calls {
            service_calls::insert(tx, call).await?;
        }
        for (run, run_effects) in &effects.service_runs_started {
            // A binding's fixed instance id taken meanwhile is a conflict: applied again, the
            // admission sees the instance.
            run_rows::insert_instance(tx, run, run.started_at).await?;
            persist(tx, run, run_effects, true, env).await?;
        }
        for waiter in &effects.service_waiters {
            let sql =
                "INSERT INTO service_call_waiters (service_call_id, caller_run_id, sequence) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";
            let args = args![&waiter.service_call_id, waiter.caller_run_id.as_str(), i64::from(waiter.sequence)];
            tx.execute(sql, &args).await?;
        }
        for (run_id, service_call_id) in &effects.service_links {
            link_run(tx, run_id, service_call_id, env).await?;
        }
        let now = effects.events.last().map(|e| e.recorded_at);
        for service_call_id in &effects.service_cancels {
            cancel_interrupted(tx, service_call_id, now, env).await?;
        }
        if let Some(closed) = &effects.service_run_closed {
            settle_linked_run(tx, closed, env).await?;
        }
        Ok(())
    })
}

/// Cancels an open call: it ends `cancelled`, every caller step waiting on it gets its
/// `ServiceCallCancelled` row, and with `propagate` (the operation's cancellation policy) its
/// linked instance is cancelled too, all in this transaction.
pub(crate) async fn cancel_service_call<T: Tx>(
    tx: &mut T,
    service_call_id: &str,
    reason: Option<String>,
    now: Millis,
    propagate: bool,
    env: &Env,
) -> StoreResult<ServiceCallRecord> {
    let call = service_calls::find(tx, service_call_id).await?.ok_or_else(|| {
        StoreError::Refused(
            Refusal::new(Reason::ServiceCallNotFound, "No service call of that id.").with("service_call_id", service_call_id),
        )
    })?;
    if call.is_terminal() {
        let refusal = Refusal::new(Reason::ServiceCallTerminal, "The service call has already ended.")
            .with("service_call_id", service_call_id)
            .with("status", call.status.clone());
        return Err(StoreError::Refused(refusal));
    }
    let closed = capstan_engine::cancelled_call(&call, reason.clone(), now);
    settle_linked_run(tx, &closed, env).await?;
    if let (true, Some(linked)) = (propagate, &call.linked_workflow_id) {
        let command_id = CommandId(env.new_id());
        let why = Some(reason.unwrap_or_else(|| "service call cancelled".into()));
        on_open_instance(tx, linked, Some(now), env, |run, cx| {
            close_by_command(run, cx, CloseCommand::Cancel, why, command_id).map(drop)
        })
        .await?;
    }
    service_calls::find(tx, service_call_id)
        .await?
        .ok_or_else(|| StoreError::Storage(format!("service call {service_call_id} vanished")))
}

/// A call a caller's delivered cooperative cancellation interrupted: cancelled, by its
/// operation's policy with its linked instance, unless it ended meanwhile.
async fn cancel_interrupted<T: Tx>(tx: &mut T, service_call_id: &str, now: Option<Millis>, env: &Env) -> StoreResult<()> {
    let Some(call) = service_calls::find(tx, service_call_id).await?.filter(|c| !c.is_terminal()) else {
        return Ok(());
    };
    let route = call.route_key();
    let operation = CatalogKey {
        namespace: route.namespace,
        endpoint: route.endpoint,
        service: Some(route.service),
        operation: Some(route.operation),
    };
    let propagate = super::catalog::find(tx, &operation)
        .await?
        .is_some_and(|entry| service_calls::propagates(&entry.doc));
    let reason = Some("The caller's cooperative cancellation was delivered at the call.".to_string());
    cancel_service_call(tx, service_call_id, reason, now.unwrap_or(call.updated_at), propagate, env)
        .await
        .map(drop)
}

/// An existing run a call linked to: its end settles the call too. A run that closed
/// meanwhile is a conflict (the admission is applied again and sees it closed).
async fn link_run<T: Tx>(tx: &mut T, run_id: &RunId, service_call_id: &str, env: &Env) -> StoreResult<()> {
    let Some(mut run) = lock_run(tx, run_id.as_str(), false).await? else {
        return Err(closed_meanwhile(run_id));
    };
    if run.is_closed() {
        return Err(closed_meanwhile(run_id));
    }
    run.service_call_ids.push(service_call_id.to_string());
    persist(tx, &run, &Effects::default(), false, env).await
}

fn closed_meanwhile(run_id: &RunId) -> StoreError {
    StoreError::Conflict {
        constraint: "service_calls_linked_run".into(),
        message: format!("the linked run {run_id} closed meanwhile"),
    }
}

/// A linked run closed: each of its calls records its end, and each caller step waiting on one
/// gets its terminal row, in this transaction.
async fn settle_linked_run<T: Tx>(tx: &mut T, closed: &LinkedRunClosed, env: &Env) -> StoreResult<()> {
    for service_call_id in &closed.service_call_ids {
        // A call cancelled before its linked run closed keeps its cancellation.
        if let Some(mut call) = service_calls::find(tx, service_call_id).await?.filter(|c| !c.is_terminal()) {
            capstan_engine::settle_call(&mut call, closed);
            service_calls::save(tx, &call).await?;
        }
        let sql = "SELECT caller_run_id, sequence FROM service_call_waiters WHERE service_call_id = $1 ORDER BY caller_run_id, sequence";
        let rows = tx.query(sql, &args![service_call_id.as_str()]).await?;
        let waiters = rows
            .iter()
            .map(|row| {
                Ok(ServiceWaiter {
                    service_call_id: service_call_id.clone(),
                    caller_run_id: RunId(row.text(0)?),
                    sequence: row.int(1)? as u32,
                })
            })
            .collect::<StoreResult<Vec<_>>>()?;
        for waiter in &waiters {
            let Some(mut caller) = lock_run(tx, waiter.caller_run_id.as_str(), false).await? else {
                continue;
            };
            let mut ids = env.ids();
            let mut cx = env.cx(closed.closed_at, &mut ids);
            if capstan_engine::resolve_service_call(&mut caller, &mut cx, waiter, closed) {
                let caller_effects = cx.effects;
                persist(tx, &caller, &caller_effects, false, env).await?;
            }
        }
        tx.execute(
            "DELETE FROM service_call_waiters WHERE service_call_id = $1",
            &args![service_call_id.as_str()],
        )
        .await?;
    }
    Ok(())
}
