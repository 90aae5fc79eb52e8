//! Claims on the shared databases: leasing a task to a poller (the candidate and its run locked
//! in one read, skipping what others hold), and running an atomic action inside the transaction
//! that records its completion.

use super::{SharedStore, SharedTx};
use crate::backend::Claim;
use crate::logic::{actions, claim, flow, locate};
use crate::tx::{Param, Tx};
use crate::*;
use serde_json::Value;
use std::sync::Arc;

impl SharedStore {
    pub(super) async fn claim_task_checked(&self, wanted: Claim) -> StoreResult<Option<(Task, RunState)>> {
        // A few attempts: a candidate can turn out stale (leased a moment ago through another
        // node), or not this poller's to take now (a session activity of another worker's
        // session); then the next one is tried. A run another poller or node holds is skipped,
        // not waited for.
        let mut passed: Vec<String> = Vec::new();
        let turn = self.env.dispatch.claim_turn();
        for _ in 0..4 {
            let mut tx = self.begin().await?;
            let admitted = flow::admit(&mut tx, &wanted, &self.env).await?;
            let mut leasing = None;
            let offer = claim::candidates(&mut tx, &wanted, &passed, admitted.as_ref(), &self.env).await?;
            for candidate in claim::spread(offer, turn.turn) {
                if let Some(run) = locate::lock_candidate_run(&mut tx, &candidate.run_id, &candidate.task_id, true).await? {
                    leasing = Some((candidate, run));
                    break;
                }
            }
            let Some((candidate, run)) = leasing else { return Ok(None) };
            let claimed = claim::lease_candidate(&mut tx, run, &candidate, &wanted, admitted.as_ref(), &self.env).await?;
            self.commit(tx).await?;
            match claimed {
                claim::Claimed::Leased(leased) => return Ok(Some(*leased)),
                claim::Claimed::Skipped | claim::Claimed::Refused | claim::Claimed::Stale => passed.push(candidate.task_id.0),
            }
        }
        Ok(None)
    }

    pub(super) async fn run_atomic_task_checked(
        &self,
        namespace: &str,
        actions: AtomicActions,
        codec: &'static dyn MemoCodec,
        now: Millis,
    ) -> StoreResult<Option<AtomicOutcome>> {
        // Only types this process has a handler for: another node may hold the others.
        let types: Vec<String> = actions.0.keys().cloned().collect();
        let mut tx = self.begin().await?;
        let sql = format!(
            "SELECT t.task_id, r.state, r.namespace, r.workflow_id, r.run_id FROM tasks t JOIN runs r ON r.run_id = t.run_id
             WHERE t.namespace = $1 AND t.kind = 'activity' AND t.queue = $2 AND t.status = 'ready' AND t.available_at <= $3{}
             ORDER BY t.priority, t.available_at, t.task_id LIMIT 1 {}",
            crate::logic::listing::any_of("t.type_name", &types, 3),
            claim::lock_run_skipping(tx.dialect()),
        );
        let mut params = vec![Param::from(namespace), Param::from(ATOMIC_QUEUE), Param::from(now)];
        params.extend(types.iter().map(Param::from));
        let Some(row) = tx.query_opt(&sql, &params).await? else {
            return Ok(None);
        };
        let task_id = TaskId(row.text(0)?);
        let mut run = locate::read_run(row.str(1)?, row.str(2)?, row.str(3)?, row.str(4)?)?;
        crate::logic::row_lease::fold(&mut tx, &mut run, None, crate::logic::row_lease::Load::Locked).await?;
        let step = match actions::lease_atomic(&mut tx, run, task_id, &actions, codec, now, &self.env).await? {
            actions::AtomicLease::Nothing => return Ok(None),
            actions::AtomicLease::Refused(outcome) => {
                self.commit(tx).await?;
                return Ok(Some(outcome));
            }
            actions::AtomicLease::Ready(step) => *step,
        };
        let handled = match &step.handler {
            Err(message) => Err(message.clone()),
            Ok((action, arguments)) => {
                // The handler's writes commit with the record of its outcome, or not at all.
                tx.batch("SAVEPOINT capstan_atomic").await?;
                let handled = actions::handler_result(codec, run_handler(&mut tx, action.clone(), arguments.clone()).await);
                if handled.is_ok() {
                    tx.batch("RELEASE SAVEPOINT capstan_atomic").await?;
                } else {
                    tx.batch("ROLLBACK TO SAVEPOINT capstan_atomic").await?;
                }
                handled
            }
        };
        let outcome = actions::finish_atomic_step(&mut tx, step, handled, codec, now, &self.env).await?;
        self.commit(tx).await?;
        Ok(Some(outcome))
    }
}

/// One statement an atomic handler asks for; the async side that owns the transaction runs it.
enum AtomicRequest {
    Execute(String, Vec<Value>, tokio::sync::oneshot::Sender<Result<u64, String>>),
    Query(String, Vec<Value>, tokio::sync::oneshot::Sender<Result<Vec<Vec<Value>>, String>>),
}

/// An atomic action's view of the recording transaction (inside its savepoint). The handler is
/// synchronous, so it runs on a blocking thread and each statement is a request to the task
/// that owns the connection; no runtime thread ever blocks on it.
struct SharedAtomic {
    requests: tokio::sync::mpsc::UnboundedSender<AtomicRequest>,
}

impl SharedAtomic {
    fn ask<T>(&self, request: impl FnOnce(tokio::sync::oneshot::Sender<Result<T, String>>) -> AtomicRequest) -> Result<T, String> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.requests
            .send(request(reply))
            .map_err(|_| "the transaction is gone".to_string())?;
        answer.blocking_recv().map_err(|_| "the transaction is gone".to_string())?
    }
}

impl AtomicTransaction for SharedAtomic {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, String> {
        self.ask(|reply| AtomicRequest::Execute(sql.to_string(), params.to_vec(), reply))
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, String> {
        self.ask(|reply| AtomicRequest::Query(sql.to_string(), params.to_vec(), reply))
    }
}

/// Runs `action` on a blocking thread, serving its statements on `tx` until it returns.
async fn run_handler(tx: &mut SharedTx, action: Arc<dyn AtomicAction>, arguments: Value) -> Result<Value, String> {
    let (requests, mut inbox) = tokio::sync::mpsc::unbounded_channel();
    let mut handler = tokio::task::spawn_blocking(move || action.run(&mut SharedAtomic { requests }, &arguments));
    loop {
        tokio::select! {
            Some(request) = inbox.recv() => match request {
                AtomicRequest::Execute(sql, params, reply) => {
                    let _ = reply.send(tx.atomic_execute(&sql, &params).await);
                }
                AtomicRequest::Query(sql, params, reply) => {
                    let _ = reply.send(tx.atomic_query(&sql, &params).await);
                }
            },
            finished = &mut handler => {
                return finished.unwrap_or_else(|panic| Err(format!("the atomic handler panicked: {panic}")));
            }
        }
    }
}
