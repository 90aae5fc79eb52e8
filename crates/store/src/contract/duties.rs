//! Background duties: deadlines claimed under a duty fence and run, retention, pruning.

use crate::backend::Backend;
use crate::logic::{duties, runs};
use crate::*;

/// The background duties: due deadlines under a duty fence, retention and pruning.
pub trait DutyStore: Backend {
    /// Claims up to `limit` tasks whose deadline is at or before `now` for `node`, for `hold_ms`:
    /// tasks whose duty is held by a live claim of another node are skipped; an expired claim is
    /// taken over with a higher duty fence.
    fn claim_due_tasks(
        &self,
        node: &str,
        now: Millis,
        limit: usize,
        hold_ms: i64,
    ) -> impl Future<Output = StoreResult<Vec<DueTask>>> + Send {
        let node = node.to_string();
        self.write(move |tx| Box::pin(async move { duties::claim_due_tasks(tx, &node, now, limit, hold_ms).await }))
    }

    /// Runs a deadline transition for a claimed duty: refused with `stale_fence` (and nothing
    /// written) unless the task's duty fence still equals `due.duty_fence`; releases the duty.
    fn run_duty<T, F>(&self, due: &DueTask, now: Millis, transition: F) -> impl Future<Output = StoreResult<(T, RunState)>> + Send
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    {
        let due = due.clone();
        let env = self.env().clone();
        self.write_guarded(move |tx| Box::pin(async move { runs::run_duty(tx, &due, now, &env, transition).await }))
    }

    /// The earliest pending deadline, so the clock can sleep until then.
    fn next_deadline(&self) -> impl Future<Output = StoreResult<Option<Millis>>> + Send {
        self.read(move |tx| Box::pin(async move { duties::next_deadline(tx).await }))
    }

    /// Instances whose current run closed before `cutoff` (retention), oldest first:
    /// `(workflow_id, current run id, closed_at)`.
    fn expired_instances(
        &self,
        namespace: &str,
        cutoff: Millis,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<(String, String, Millis)>>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { duties::expired_instances(tx, &namespace, cutoff, limit).await }))
    }

    /// Deletes expired instances with every run, history event, task and index row, and frees
    /// their workflow ids. Each is checked again in the transaction (still closed before
    /// `cutoff`); returns how many were deleted. Ledger entries and checkpoints are kept: they
    /// are evidence and outlive history.
    fn prune_instances(
        &self,
        namespace: &str,
        workflow_ids: Vec<String>,
        cutoff: Millis,
    ) -> impl Future<Output = StoreResult<usize>> + Send {
        let namespace = namespace.to_string();
        self.write(move |tx| Box::pin(async move { duties::prune_instances(tx, &namespace, &workflow_ids, cutoff).await }))
    }

    /// Forgets poll memos and query tasks older than `older_than`.
    fn prune(&self, older_than: Millis) -> impl Future<Output = StoreResult<()>> + Send {
        self.write_one(move |tx| Box::pin(async move { duties::prune(tx, older_than).await }))
    }
}

impl<B: Backend> DutyStore for B {}
