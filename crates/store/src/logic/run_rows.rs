//! Writing one run's change in the caller's transaction: the run document, its new events, its
//! touched and closed task rows (with their receipts), ledger entries and checkpoints (the chain
//! checked on the way in), the search-attribute index and the payloads the run names; then one
//! announcement per queue that gained a ready task. What the change sets off in other runs is
//! `persist.rs`.

use super::external_payloads;
use super::handoff::HandedRun;
use super::run_counts;
use crate::rows::*;
use crate::tx::{args, locking, Locking, Statement, Tx};
use crate::*;
use std::collections::BTreeSet;

const INSERT_RUN: &str = "INSERT INTO runs (run_id, namespace, workflow_id, run_number, workflow_type, task_queue, status, business_key, started_at, closed_at, state, paused_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)";
const UPDATE_RUN: &str = "UPDATE runs SET status = $2, closed_at = $3, state = $4, paused_at = $5 WHERE run_id = $1";
/// Events go in one statement per transaction (up to [`EVENTS_PER_INSERT`] rows each).
const EVENTS_PER_INSERT: usize = 32;
const EVENT_COLUMNS: usize = 10;

/// An instance's namespace and current run, held until commit (a start, an import).
pub(super) const LOCK_INSTANCE: Locking = locking!(
    "SELECT namespace, current_run_id FROM workflow_instances WHERE workflow_id = $1",
    "FOR UPDATE"
);

/// The insert of `rows` events, its text built once per row count.
fn insert_events(rows: usize) -> &'static str {
    static TEXTS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        (1..=EVENTS_PER_INSERT)
            .map(|rows| {
                let values: Vec<String> = (0..rows)
                    .map(|row| {
                        let marks: Vec<String> = (1..=EVENT_COLUMNS).map(|c| format!("${}", row * EVENT_COLUMNS + c)).collect();
                        format!("({})", marks.join(", "))
                    })
                    .collect();
                format!(
                    "INSERT INTO history_events (run_id, sequence, event_id, event_type, payload, workflow_task_id, workflow_command_id, recorded_at, prev_hash, hash) VALUES {}",
                    values.join(", ")
                )
            })
            .collect()
    });
    &TEXTS[rows - 1]
}
/// `$21`: the request id of the poll a hand-off gave the lease to. A row keeps the one it has
/// while its fence (its lease) stands; the assignment comes first, as MySQL's upsert reads the
/// row's columns as the assignments before it left them.
const UPSERT_TASK: &str = "INSERT INTO tasks (task_id, namespace, run_id, kind, queue, type_name, status, available_at, deadline_at, lease_owner, lease_expires_at, fence, created_at, compatibility, sticky_owner, sticky_until, session_id, priority, fairness_key, fairness_weight, poll_request_id)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21)
     ON CONFLICT (task_id) DO UPDATE SET
         poll_request_id = CASE WHEN excluded.poll_request_id IS NOT NULL THEN excluded.poll_request_id
                                WHEN tasks.fence = excluded.fence THEN tasks.poll_request_id END,
         status = excluded.status, available_at = excluded.available_at,
         deadline_at = excluded.deadline_at, lease_owner = excluded.lease_owner,
         lease_expires_at = excluded.lease_expires_at, fence = excluded.fence,
         sticky_owner = excluded.sticky_owner, sticky_until = excluded.sticky_until, pending_lease = NULL";
/// `$3`: the receipt of the report that closed the task, if one did. Writing a task's row from
/// the document clears the lease a claim kept on the row alone (`row_lease`): the document
/// holds it now.
const CLOSE_TASK: &str =
    "UPDATE tasks SET status = $2, deadline_at = NULL, pending_lease = NULL, poll_request_id = NULL, receipt = COALESCE($3, receipt) WHERE task_id = $1";
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
const SUPERSEDE_RUN: &str = "UPDATE runs SET is_current = 0 WHERE run_id = $1";

/// Writes what one transition changed in `run` (`insert_run`: the run is new), and what the
/// hand-offs that followed it added (`leases`: their events, leased tasks and polls).
pub(crate) async fn write_change<T: Tx>(
    tx: &mut T,
    run: &RunState,
    effects: &Effects,
    leases: Option<&HandedRun>,
    insert_run: bool,
) -> StoreResult<()> {
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
            run.paused.as_ref().map(|p| p.paused_at),
        ];
        tx.execute(INSERT_RUN, &args).await?;
        run_counts::inserted(tx, run);
    } else if let Some(from) = effects.reclassed_from {
        run_counts::reclassed(tx, run, from);
    }
    persist_ledger(tx, run, effects).await?;
    // The run document keeps payloads it will hand out later (messages, updates, a child's input).
    external_payloads::record_uses(tx, &run.namespace, run.workflow_id.as_str(), &[&state]).await?;
    super::streams::apply_stream_ops(tx, run, &effects.stream_ops).await?;
    if touches_search_attributes(effects, insert_run) {
        write_search_attributes(tx, run).await?;
    }
    write_rows(tx, run, effects, leases, (!insert_run).then_some(state.as_str())).await?;
    close_tasks(tx, run, effects).await?;
    observe(tx, run, effects, insert_run);
    Ok(())
}

/// Whether the change closed the run.
fn closes_run(effects: &Effects) -> bool {
    effects.events.iter().any(|event| event.event_type.is_run_terminal())
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
    if closes_run(effects) {
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
async fn write_rows<T: Tx>(
    tx: &mut T,
    run: &RunState,
    effects: &Effects,
    leases: Option<&HandedRun>,
    updated_state: Option<&str>,
) -> StoreResult<()> {
    let events: Vec<&HistoryEvent> = effects
        .events
        .iter()
        .chain(leases.into_iter().flat_map(|l| &l.effects.events))
        .collect();
    let touched: BTreeSet<&TaskId> = effects
        .touched_tasks
        .iter()
        .chain(leases.into_iter().flat_map(|l| &l.effects.touched_tasks))
        .collect();
    let payloads = events
        .iter()
        .map(|event| {
            // Check the chain on the way in, as the verifier checks it on the way out.
            debug_assert_eq!(event.computed_hash(), event.hash);
            serde_json::to_string(&event.payload)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let texts: Vec<&str> = payloads.iter().map(String::as_str).collect();
    external_payloads::record_uses(tx, &run.namespace, run.workflow_id.as_str(), &texts).await?;
    let task_rows: Vec<_> = touched
        .into_iter()
        .map(|task_id| (task_id, run.tasks.get(task_id)))
        .map(|(task_id, task)| (task_id, task.map(|t| (t, task_type_name(run, t), task_compatibility(run, t)))))
        .collect();
    let run_id = run.run_id.as_str();
    let mut statements = Vec::with_capacity(1 + payloads.len() + task_rows.len());
    if let Some(state) = updated_state {
        statements.push(Statement {
            sql: UPDATE_RUN,
            args: args![
                run_id,
                run.status.as_str(),
                run.closed_at,
                state,
                run.paused.as_ref().map(|p| p.paused_at)
            ]
            .into(),
        });
    }
    let rows: Vec<(&&HistoryEvent, &String)> = events.iter().zip(&payloads).collect();
    for chunk in rows.chunks(EVENTS_PER_INSERT) {
        let mut args = Vec::with_capacity(chunk.len() * EVENT_COLUMNS);
        for (event, payload) in chunk {
            args.extend(args![
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
            ]);
        }
        statements.push(Statement {
            sql: insert_events(chunk.len()),
            args,
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
                i64::from(run.scheduling.priority),
                run.scheduling.fairness_key.as_deref(),
                i64::from(run.scheduling.fairness_weight),
                leases.and_then(|l| l.poll_of(task_id)),
            ]
            .into(),
        });
        // Announced only when a poller may take it (not blocked, not paused).
        if task_row_status(run, task) == "ready" && matches!(task.kind, TaskKind::Workflow | TaskKind::Activity) {
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

/// A new instance's row, as a start writes it: `run` is its current run.
pub(crate) async fn insert_instance<T: Tx>(tx: &mut T, run: &RunState, now: Millis) -> StoreResult<()> {
    let args = args![run.workflow_id.as_str(), &run.namespace, run.run_id.as_str(), now];
    tx.execute(INSERT_INSTANCE, &args).await?;
    run_counts::made_current(tx, run);
    Ok(())
}

/// The current run of an instance, as its count knows it: namespace, type, queue, run id, status.
const CURRENT_RUN_COUNTED: &str = "SELECT r.namespace, r.workflow_type, r.task_queue, r.run_id, r.status, r.paused_at
     FROM workflow_instances i JOIN runs r ON r.run_id = i.current_run_id WHERE i.workflow_id = $1";

/// Makes `run` its instance's current run (a new run of an existing instance); the run it
/// replaces is written already.
pub(crate) async fn set_current_run<T: Tx>(tx: &mut T, run: &RunState) -> StoreResult<()> {
    if let Some(row) = tx.query_opt(CURRENT_RUN_COUNTED, &args![run.workflow_id.as_str()]).await? {
        let (namespace, workflow_type, task_queue, run_id) = (row.str(0)?, row.str(1)?, row.str(2)?, row.str(3)?);
        let class = run_counts::class_of_row(row.str(4)?, row.opt_int(5)?);
        let previous = run_counts::Counted {
            namespace,
            workflow_type,
            task_queue,
            run_id,
        };
        run_counts::shift(tx, &previous, Some((class, true)), Some((class, false)));
        tx.execute(SUPERSEDE_RUN, &args![run_id]).await?;
    }
    tx.execute(SET_CURRENT_RUN, &args![run.workflow_id.as_str(), run.run_id.as_str()])
        .await?;
    run_counts::made_current(tx, run);
    Ok(())
}

/// Settled entries are final, and a resolution (a settled state) applies only over an unknown
/// outcome.
fn may_replace(stored: &str, new: &str) -> bool {
    const SETTLED: [&str; 3] = ["verified", "effect_confirmed", "effect_absent"];
    !SETTLED.contains(&stored) && (!matches!(new, "effect_confirmed" | "effect_absent") || stored == "outcome_unknown")
}
