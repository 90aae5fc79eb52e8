//! Nexus service calls: one `service_calls` row per admitted call (unique per target route and
//! idempotency key, so a concurrent second admission of a key is refused and retried), and
//! `service_call_waiters`, the caller steps that wait for a call's completion. What a
//! transition admitted, linked or settled is written here, in its transaction.

use super::locate::lock_run;
use super::persist::persist;
use super::BoxedStep;
use crate::tx::{args, Row, Tx};
use crate::*;
use capstan_engine::service_call::{LinkedRunClosed, RouteKey, ServiceCallRecord, ServiceWaiter};

const COLUMNS: &str = "service_call_id, doc";

fn record_of(row: &Row) -> StoreResult<ServiceCallRecord> {
    let id = row.text(0)?;
    serde_json::from_str(row.str(1)?).map_err(|error| StoreError::Corrupt {
        record: format!("service call {id}"),
        detail: error.to_string(),
    })
}

/// Inserts a call admitted by a transition; a call already holding its route and key is a
/// conflict (the transaction rolls back and the admission is applied again against it).
pub(crate) async fn insert<T: Tx>(tx: &mut T, call: &ServiceCallRecord) -> StoreResult<()> {
    let doc = serde_json::to_string(call)?;
    let (namespace, endpoint, service, operation) = &call.route;
    let args = args![
        &call.service_call_id,
        namespace,
        endpoint,
        service,
        operation,
        &call.idempotency_key,
        &call.caller_namespace,
        call.caller_workflow_id.as_ref().map(|w| w.as_str()),
        call.caller_run_id.as_ref().map(|r| r.as_str()),
        call.linked_run_id.as_ref().map(|r| r.as_str()),
        &call.status,
        call.created_at,
        call.updated_at,
        doc.as_str(),
    ];
    let sql = "INSERT INTO service_calls (service_call_id, namespace, endpoint_name, service_name, operation_name,
             idempotency_key, caller_namespace, caller_workflow_id, caller_run_id, linked_run_id, status,
             created_at, updated_at, doc)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) ON CONFLICT DO NOTHING";
    if tx.execute(sql, &args).await? == 0 {
        return Err(StoreError::Conflict {
            constraint: "service_calls_route_key".into(),
            message: format!("a call with idempotency key {:?} was admitted meanwhile", call.idempotency_key),
        });
    }
    Ok(())
}

async fn save<T: Tx>(tx: &mut T, call: &ServiceCallRecord) -> StoreResult<()> {
    let doc = serde_json::to_string(call)?;
    let sql = "UPDATE service_calls SET status = $2, updated_at = $3, doc = $4 WHERE service_call_id = $1";
    tx.execute(sql, &args![&call.service_call_id, &call.status, call.updated_at, doc.as_str()])
        .await?;
    Ok(())
}

pub(crate) async fn find<T: Tx>(tx: &mut T, service_call_id: &str) -> StoreResult<Option<ServiceCallRecord>> {
    let sql = format!("SELECT {COLUMNS} FROM service_calls WHERE service_call_id = $1");
    tx.query_opt(&sql, &args![service_call_id])
        .await?
        .as_ref()
        .map(record_of)
        .transpose()
}

pub(crate) async fn find_by_key<T: Tx>(tx: &mut T, route: &RouteKey, idempotency_key: &str) -> StoreResult<Option<ServiceCallRecord>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM service_calls WHERE namespace = $1 AND endpoint_name = $2 AND service_name = $3
           AND operation_name = $4 AND idempotency_key = $5"
    );
    let args = args![&route.namespace, &route.endpoint, &route.service, &route.operation, idempotency_key];
    tx.query_opt(&sql, &args).await?.as_ref().map(record_of).transpose()
}

/// The calls a caller instance made (one run, or all its runs), oldest first.
pub(crate) async fn of_caller<T: Tx>(
    tx: &mut T,
    caller_namespace: &str,
    workflow_id: &str,
    run_id: Option<&str>,
    limit: usize,
) -> StoreResult<Vec<ServiceCallRecord>> {
    let sql = format!(
        "SELECT {COLUMNS} FROM service_calls WHERE caller_namespace = $1 AND caller_workflow_id = $2
           AND ($3 = '' OR caller_run_id = $3) ORDER BY created_at, service_call_id LIMIT $4"
    );
    let args = args![caller_namespace, workflow_id, run_id.unwrap_or(""), limit as i64];
    tx.query(&sql, &args).await?.iter().map(record_of).collect()
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
            insert(tx, call).await?;
        }
        for (run, run_effects) in &effects.service_runs_started {
            // A binding's fixed instance id taken meanwhile is a conflict: applied again, the
            // admission sees the instance.
            super::persist::insert_instance(tx, run, run.started_at).await?;
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
            settle(tx, closed, env).await?;
        }
        Ok(())
    })
}

/// Cancels an open call: it ends `cancelled`, every caller step waiting on it gets its
/// `ServiceCallCancelled` row, and with `propagate` (the operation's cancellation policy) its
/// linked instance is cancelled too, all in this transaction.
pub(crate) async fn cancel<T: Tx>(
    tx: &mut T,
    service_call_id: &str,
    reason: Option<String>,
    now: Millis,
    propagate: bool,
    env: &Env,
) -> StoreResult<ServiceCallRecord> {
    let call = find(tx, service_call_id).await?.ok_or_else(|| {
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
    settle(tx, &closed, env).await?;
    if let (true, Some(linked)) = (propagate, &call.linked_workflow_id) {
        let command_id = CommandId(env.new_id());
        let why = Some(reason.unwrap_or_else(|| "service call cancelled".into()));
        super::persist::on_open_instance(tx, linked, Some(now), env, |run, cx| {
            close_by_command(run, cx, CloseCommand::Cancel, why, command_id).map(drop)
        })
        .await?;
    }
    find(tx, service_call_id)
        .await?
        .ok_or_else(|| StoreError::Storage(format!("service call {service_call_id} vanished")))
}

/// A call a caller's delivered cooperative cancellation interrupted: cancelled, by its
/// operation's policy with its linked instance, unless it ended meanwhile.
async fn cancel_interrupted<T: Tx>(tx: &mut T, service_call_id: &str, now: Option<Millis>, env: &Env) -> StoreResult<()> {
    let Some(call) = find(tx, service_call_id).await?.filter(|c| !c.is_terminal()) else {
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
        .is_some_and(|entry| propagates(&entry.doc));
    let reason = Some("The caller's cooperative cancellation was delivered at the call.".to_string());
    cancel(tx, service_call_id, reason, now.unwrap_or(call.updated_at), propagate, env)
        .await
        .map(drop)
}

/// Whether an operation's `cancellation_policy` cancels a call's linked run with the call.
pub fn propagates(doc: &Map<String, Value>) -> bool {
    doc.get("cancellation_policy")
        .and_then(|policy| policy.get("propagate_to_linked_workflow"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
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
async fn settle<T: Tx>(tx: &mut T, closed: &LinkedRunClosed, env: &Env) -> StoreResult<()> {
    for service_call_id in &closed.service_call_ids {
        // A call cancelled before its linked run closed keeps its cancellation.
        if let Some(mut call) = find(tx, service_call_id).await?.filter(|c| !c.is_terminal()) {
            capstan_engine::settle_call(&mut call, closed);
            save(tx, &call).await?;
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
