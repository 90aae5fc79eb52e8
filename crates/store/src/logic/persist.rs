//! Writing a transition's effects: the run document, its new events, its changed task rows,
//! ledger entries and checkpoints, search-attribute index rows, the successor of a
//! continue-as-new, and the follow-on transitions in other runs — all in the caller's
//! transaction.

use super::external_payloads;
use super::locate::{locate_and_lock, lock_run};
use super::BoxedStep;
use crate::rows::*;
use crate::tx::{args, locking, Locking, Statement, Tx};
use crate::*;
use capstan_engine::ledger_probe::ProbeAnswer;

const INSERT_RUN: &str = "INSERT INTO runs (run_id, namespace, workflow_id, run_number, workflow_type, task_queue, status, business_key, started_at, closed_at, state)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";
const UPDATE_RUN: &str = "UPDATE runs SET status = $2, closed_at = $3, state = $4 WHERE run_id = $1";
const INSERT_EVENT: &str = "INSERT INTO history_events (run_id, sequence, event_id, event_type, payload, workflow_task_id, workflow_command_id, recorded_at, prev_hash, hash)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)";
const UPSERT_TASK: &str = "INSERT INTO tasks (task_id, namespace, run_id, kind, queue, type_name, status, available_at, deadline_at, lease_owner, lease_expires_at, fence, created_at, compatibility, sticky_owner, sticky_until, session_id)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
     ON CONFLICT (task_id) DO UPDATE SET status = excluded.status, available_at = excluded.available_at,
         deadline_at = excluded.deadline_at, lease_owner = excluded.lease_owner,
         lease_expires_at = excluded.lease_expires_at, fence = excluded.fence,
         sticky_owner = excluded.sticky_owner, sticky_until = excluded.sticky_until";
/// `$3`: the receipt of the report that closed the task, if one did.
const CLOSE_TASK: &str = "UPDATE tasks SET status = $2, deadline_at = NULL, receipt = COALESCE($3, receipt) WHERE task_id = $1";
const KEEP_RECEIPT: &str = "UPDATE tasks SET receipt = $2 WHERE task_id = $1";
/// A task created and closed within one transition never had a row: record it closed.
const INSERT_CLOSED_TASK: &str =
    "INSERT INTO tasks (task_id, namespace, run_id, kind, queue, type_name, status, available_at, fence, created_at)
     VALUES ($1, $2, $3, 'timer', '', '', $4, 0, 0, 0) ON CONFLICT DO NOTHING";
const LEDGER_STATE: Locking = locking!("SELECT state FROM ledger_entries WHERE ledger_key = $1", "FOR UPDATE");
const INSERT_LEDGER_ENTRY: &str =
    "INSERT INTO ledger_entries (ledger_key, namespace, workflow_id, run_id, activity_type, state, dispatched_at, updated_at, doc)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";
const UPDATE_LEDGER_ENTRY: &str = "UPDATE ledger_entries SET state = $2, updated_at = $3, doc = $4 WHERE ledger_key = $1";
const INSERT_CHECKPOINT: &str =
    "INSERT INTO ledger_checkpoints (namespace, workflow_id, hash, prev_hash, ledger_key, recorded_at, doc) VALUES ($1, $2, $3, $4, $5, $6, $7)";
const STORED_CHECKPOINT: &str = "SELECT doc FROM ledger_checkpoints WHERE namespace = $1 AND workflow_id = $2 AND hash = $3";
const INSERT_INSTANCE: &str = "INSERT INTO workflow_instances (workflow_id, namespace, current_run_id, created_at) VALUES ($1, $2, $3, $4)";
const SET_CURRENT_RUN: &str = "UPDATE workflow_instances SET current_run_id = $2 WHERE workflow_id = $1";
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
        debug_assert_eq!(run.invariants_hold(), Ok(()), "run {} as a transition left it", run.run_id.as_str());
        let state = serde_json::to_string(run)?;
        if insert_run {
            let run_number = i64::from(run.run_number);
            let args = args![
                run.run_id.as_str(),
                &run.namespace,
                run.workflow_id.as_str(),
                run_number,
                &run.workflow_type,
                &run.task_queue,
                run.status.as_str(),
                &run.business_key,
                run.started_at,
                run.closed_at,
                state.as_str(),
            ];
            tx.execute(INSERT_RUN, &args).await?;
        }
        persist_ledger(tx, run, effects).await?;
        // The run document keeps payloads it will hand out later (messages, updates, a child's input).
        external_payloads::record_uses(tx, &run.namespace, run.workflow_id.as_str(), &[&state]).await?;
        super::streams::apply_stream_ops(tx, run, &effects.stream_ops).await?;
        if touches_search_attributes(effects, insert_run) {
            write_search_attributes(tx, run).await?;
        }
        write_rows(tx, run, effects, (!insert_run).then_some(state.as_str())).await?;
        close_tasks(tx, run, effects).await?;
        observe(tx, run, effects, insert_run);
        if let Some(successor) = &effects.successor {
            // Continue-as-new: the next run is born in the same transaction and becomes current.
            let (next, next_effects) = successor.as_ref();
            persist(tx, next, next_effects, true, env).await?;
            set_current_run(tx, next).await?;
        }
        follow_on(tx, effects, env).await
    })
}

/// What operators count of this transition, for the observer once it commits.
fn observe<T: Tx>(tx: &mut T, run: &RunState, effects: &Effects, insert_run: bool) {
    let namespace = &run.namespace;
    if insert_run {
        tx.observe(Fact::RunStarted {
            namespace: namespace.clone(),
            workflow_type: run.workflow_type.clone(),
        });
    }
    if effects.events.iter().any(|event| event.event_type.is_run_terminal()) {
        tx.observe(Fact::RunClosed {
            namespace: namespace.clone(),
            workflow_type: run.workflow_type.clone(),
            reason: run.closed_reason.map_or(run.status.as_str(), |reason| reason.as_str()),
        });
    }
    for observation in &effects.observations {
        tx.observe(Fact::observed(namespace, *observation));
    }
}

/// The run's document update, its events, and its touched task rows: independent statements,
/// sent together. Then one announcement per queue that gained a ready task.
async fn write_rows<T: Tx>(tx: &mut T, run: &RunState, effects: &Effects, updated_state: Option<&str>) -> StoreResult<()> {
    let payloads = effects
        .events
        .iter()
        .map(|event| {
            // Check the chain on the way in, as the verifier checks it on the way out.
            debug_assert_eq!(event.computed_hash(), event.hash);
            serde_json::to_string(&event.payload)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let texts: Vec<&str> = payloads.iter().map(String::as_str).collect();
    external_payloads::record_uses(tx, &run.namespace, run.workflow_id.as_str(), &texts).await?;
    let task_rows: Vec<_> = effects
        .touched_tasks
        .iter()
        .map(|task_id| (task_id, run.tasks.get(task_id)))
        .map(|(task_id, task)| (task_id, task.map(|t| (t, task_type_name(run, t), task_compatibility(run, t)))))
        .collect();
    let run_id = run.run_id.as_str();
    let mut statements = Vec::with_capacity(1 + payloads.len() + task_rows.len());
    if let Some(state) = updated_state {
        statements.push(Statement {
            sql: UPDATE_RUN,
            args: args![run_id, run.status.as_str(), run.closed_at, state].into(),
        });
    }
    for (event, payload) in effects.events.iter().zip(&payloads) {
        statements.push(Statement {
            sql: INSERT_EVENT,
            args: args![
                run_id,
                event.sequence as i64,
                event.id.as_str(),
                event.event_type.as_str(),
                payload.as_str(),
                event.workflow_task_id.as_ref().map(|t| t.as_str()),
                event.workflow_command_id.as_ref().map(|c| c.as_str()),
                event.recorded_at,
                event.prev_hash.as_str(),
                event.hash.as_str(),
            ]
            .into(),
        });
    }
    let mut ready_queues: Vec<WakeKey> = Vec::new();
    for (task_id, row) in &task_rows {
        let Some((task, type_name, compatibility)) = row else {
            // Touched but no longer open in the run: the row must not look open.
            statements.push(Statement {
                sql: CLOSE_TASK,
                args: args![task_id.as_str(), "cancelled", None::<&str>].into(),
            });
            continue;
        };
        let lease = task.lease();
        let sticky = run.sticky_hold(task);
        statements.push(Statement {
            sql: UPSERT_TASK,
            args: args![
                task.id.as_str(),
                &run.namespace,
                run_id,
                task.kind.as_str(),
                &task.queue,
                type_name,
                task_row_status(run, task),
                task.available_at,
                task.deadline_at,
                lease.map(|l| l.owner.as_str()),
                lease.map(|l| l.expires_at),
                task.fence as i64,
                task.created_at,
                compatibility,
                sticky.map(|(owner, _)| owner),
                sticky.map(|(_, until)| until),
                run.session_of(task).map(|s| s.options.session_id.as_str()),
            ]
            .into(),
        });
        if task.is_ready() && matches!(task.kind, TaskKind::Workflow | TaskKind::Activity) {
            let key = (run.namespace.clone(), task.kind, task.queue.clone());
            if !ready_queues.contains(&key) {
                ready_queues.push(key);
            }
        }
    }
    tx.execute_all(&statements).await?;
    for key in ready_queues {
        tx.announce(key).await?;
    }
    Ok(())
}

/// Closes the tasks that left the open set, each with the receipt of the report that closed
/// it (kept on its row, where the next report naming the task finds it), in one statement.
async fn close_tasks<T: Tx>(tx: &mut T, run: &RunState, effects: &Effects) -> StoreResult<()> {
    let mut receipts = effects
        .receipts
        .iter()
        .map(|receipt| Ok((&receipt.task_id, serde_json::to_string(receipt)?)))
        .collect::<StoreResult<Vec<_>>>()?;
    for (task_id, closure) in &effects.closed_tasks {
        let receipt = receipts
            .iter()
            .position(|(id, _)| *id == task_id)
            .map(|at| receipts.swap_remove(at).1);
        let args = args![task_id.as_str(), closure.as_str(), receipt.as_deref()];
        if tx.execute(CLOSE_TASK, &args).await? == 0 {
            let args = args![task_id.as_str(), &run.namespace, run.run_id.as_str(), closure.as_str()];
            tx.execute(INSERT_CLOSED_TASK, &args).await?;
            receipts.extend(receipt.map(|text| (task_id, text)));
        }
    }
    // A receipt of a task that closed some other way (none today) still lands on its row.
    for (task_id, text) in receipts {
        tx.execute(KEEP_RECEIPT, &args![task_id.as_str(), text.as_str()]).await?;
    }
    Ok(())
}

async fn write_search_attributes<T: Tx>(tx: &mut T, run: &RunState) -> StoreResult<()> {
    tx.execute("DELETE FROM search_attribute_index WHERE run_id = $1", &args![run.run_id.as_str()])
        .await?;
    for (key, value, num) in search_attribute_rows(&run.search_attributes) {
        let args = args![run.run_id.as_str(), &key, &value, num];
        tx.execute(
            "INSERT INTO search_attribute_index (run_id, key, value, num) VALUES ($1, $2, $3, $4)",
            &args,
        )
        .await?;
    }
    Ok(())
}

/// Ledger entries (current state) and their checkpoints (append-only), with the run. The
/// checkpoints must extend an intact chain: the stored checkpoint each instance's first new
/// checkpoint links to must exist and still hash to its recorded hash.
async fn persist_ledger<T: Tx>(tx: &mut T, run: &RunState, effects: &Effects) -> StoreResult<()> {
    let mut extended = std::collections::HashSet::new();
    for checkpoint in &effects.checkpoints {
        if !extended.insert(&checkpoint.workflow_id) || checkpoint.prev_hash == GENESIS_HASH {
            continue;
        }
        let args = args![&run.namespace, checkpoint.workflow_id.as_str(), &checkpoint.prev_hash];
        let previous = tx
            .query_opt(STORED_CHECKPOINT, &args)
            .await?
            .and_then(|row| row.str(0).ok().and_then(|doc| serde_json::from_str::<LedgerCheckpoint>(doc).ok()));
        if !crate::extends_intact(checkpoint, previous) {
            return Err(crate::breach_at(run, checkpoint));
        }
    }
    for entry in &effects.ledger {
        let doc = serde_json::to_string(entry)?;
        let args = args![
            &entry.ledger_key,
            &entry.namespace,
            entry.workflow_id.as_str(),
            entry.run_id.as_str(),
            &entry.activity_type,
            entry.state.as_str(),
            entry.dispatched_at,
            entry.updated_at,
            doc.as_str(),
        ];
        // The entry's row is locked while it is judged: two operators (or nodes) resolving it
        // at once are ordered, and the second finds it settled.
        let stored = tx.query_opt(LEDGER_STATE.sql(tx.dialect()), &args![&entry.ledger_key]).await?;
        match stored {
            None => {
                tx.execute(INSERT_LEDGER_ENTRY, &args).await?;
            }
            Some(row) if may_replace(row.str(0)?, entry.state.as_str()) => {
                let update = args![&entry.ledger_key, entry.state.as_str(), entry.updated_at, doc.as_str()];
                tx.execute(UPDATE_LEDGER_ENTRY, &update).await?;
            }
            Some(_) => return Err(crate::already_settled(entry)),
        }
    }
    for checkpoint in &effects.checkpoints {
        let doc = serde_json::to_string(checkpoint)?;
        let args = args![
            &checkpoint.namespace,
            checkpoint.workflow_id.as_str(),
            &checkpoint.hash,
            &checkpoint.prev_hash,
            &checkpoint.ledger_key,
            checkpoint.recorded_at,
            doc.as_str(),
        ];
        tx.execute(INSERT_CHECKPOINT, &args).await?;
    }
    Ok(())
}

/// The transitions one transition sets off in other runs, in the same transaction: children it
/// started, the parent a closing child reports to, children a closing parent ends.
fn follow_on<'a, T: Tx>(tx: &'a mut T, effects: &'a Effects, env: &'a Env) -> BoxedStep<'a, ()> {
    Box::pin(async move {
        for (child, child_effects) in effects.children_started.iter().chain(&effects.probes_started) {
            let args = args![
                child.workflow_id.as_str(),
                &child.namespace,
                child.run_id.as_str(),
                child.started_at
            ];
            tx.execute(INSERT_INSTANCE, &args).await.map_err(|error| match error {
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
        super::service_calls::write_admissions(tx, effects, env).await?;
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

/// A new instance's row, as a start writes it.
pub(crate) async fn insert_instance<T: Tx>(tx: &mut T, run: &RunState, now: Millis) -> StoreResult<()> {
    let args = args![run.workflow_id.as_str(), &run.namespace, run.run_id.as_str(), now];
    tx.execute(INSERT_INSTANCE, &args).await.map(drop)
}

/// Makes `run` its instance's current run (a new run of an existing instance).
pub(crate) async fn set_current_run<T: Tx>(tx: &mut T, run: &RunState) -> StoreResult<()> {
    tx.execute(SET_CURRENT_RUN, &args![run.workflow_id.as_str(), run.run_id.as_str()])
        .await?;
    Ok(())
}

/// Settled entries are final, and a resolution (a settled state) applies only over an unknown
/// outcome.
fn may_replace(stored: &str, new: &str) -> bool {
    const SETTLED: [&str; 3] = ["verified", "effect_confirmed", "effect_absent"];
    !SETTLED.contains(&stored) && (!matches!(new, "effect_confirmed" | "effect_absent") || stored == "outcome_unknown")
}
