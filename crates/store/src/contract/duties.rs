//! Background duties: deadlines claimed under a duty fence and run, retention, pruning.

use crate::backend::Backend;
use crate::logic::{batches, duties, runs};
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

    /// Creates a batch operation, or answers the one created under its request id before
    /// (`false`); refused (`batch_operations_exhausted`) past `running_max` running in its
    /// namespace.
    fn create_batch(&self, batch: BatchOperation, running_max: usize) -> impl Future<Output = StoreResult<(BatchOperation, bool)>> + Send {
        self.write(move |tx| Box::pin(async move { batches::create(tx, &batch, running_max).await }))
    }

    fn batch(&self, namespace: &str, batch_id: &str) -> impl Future<Output = StoreResult<Option<BatchOperation>>> + Send {
        let (namespace, batch_id) = (namespace.to_string(), batch_id.to_string());
        self.read(move |tx| Box::pin(async move { batches::get(tx, &namespace, &batch_id).await }))
    }

    /// A namespace's batch operations, newest first.
    fn batches(&self, namespace: &str, limit: usize) -> impl Future<Output = StoreResult<Vec<BatchOperation>>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { batches::list(tx, &namespace, limit).await }))
    }

    /// Claims the running batch whose next step is due longest, for `node` until
    /// `now + hold_ms`, under a new duty fence; a batch another node holds is skipped.
    fn claim_batch(
        &self,
        node: &str,
        now: Millis,
        hold_ms: i64,
    ) -> impl Future<Output = StoreResult<Option<(BatchOperation, u64)>>> + Send {
        let node = node.to_string();
        self.write(move |tx| Box::pin(async move { batches::claim(tx, &node, now, hold_ms).await }))
    }

    /// Saves a claimed step's progress and gives the duty up; `stale_fence` when the claim was
    /// taken over or the batch cancelled since.
    fn advance_batch(&self, step: BatchStep, now: Millis) -> impl Future<Output = StoreResult<()>> + Send {
        self.write(move |tx| Box::pin(async move { batches::advance(tx, &step, now).await }))
    }

    /// [`Self::advance_batch`] for a delete batch: saves the step and deletes the instances it
    /// closed out, each given as the audit event kept of its deletion, all in one transaction;
    /// `run_not_closed` (nothing done) when one of them has a new current run since.
    fn advance_batch_deleting(
        &self,
        step: BatchStep,
        now: Millis,
        deletions: Vec<AuditEvent>,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        self.write(move |tx| Box::pin(async move { batches::advance_deleting(tx, &step, now, &deletions).await }))
    }

    /// When any running batch's next step is due (a read: nodes look before they claim).
    fn next_batch_step(&self) -> impl Future<Output = StoreResult<Option<Millis>>> + Send {
        self.read(move |tx| Box::pin(async move { batches::next_step(tx).await }))
    }

    /// Cancels a running batch (a finished one stays as it is); the batch as it is now.
    fn cancel_batch(
        &self,
        namespace: &str,
        batch_id: &str,
        now: Millis,
    ) -> impl Future<Output = StoreResult<Option<BatchOperation>>> + Send {
        let (namespace, batch_id) = (namespace.to_string(), batch_id.to_string());
        self.write(move |tx| Box::pin(async move { batches::cancel(tx, &namespace, &batch_id, now).await }))
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
