//! Tasks: which are ready, claiming them, and query and update-validation tasks.

use crate::backend::{Backend, Claim};
use crate::logic::{claim, fleet, queries};
use crate::parked_polls::{HandedOff, Parked, Poller};
use crate::*;

/// Tasks: claims and ready-queue wake-ups, query and validation tasks, remembered polls.
pub trait TaskStore: Backend {
    /// Open tasks of `kind` currently leased to `owner`.
    fn leased_tasks(&self, namespace: &str, owner: &str, kind: TaskKind) -> impl Future<Output = StoreResult<Vec<TaskId>>> + Send {
        let (namespace, owner) = (namespace.to_string(), owner.to_string());
        self.read(move |tx| Box::pin(async move { fleet::leased_tasks(tx, &namespace, &owner, kind).await }))
    }

    /// Whether a poll of this shape could lease something right now, and whether anything at
    /// all is ready on the queue (a read, no writer trip).
    fn has_ready_task(
        &self,
        namespace: &str,
        kind: TaskKind,
        queue: &str,
        types: &[String],
        now: Millis,
    ) -> impl Future<Output = StoreResult<Readiness>> + Send {
        self.look(LookAsk {
            namespace: namespace.to_string(),
            kind,
            queue: queue.to_string(),
            types: types.to_vec(),
            now,
            recall: None,
            worker_id: None,
        })
    }

    /// A poll's look at its queue: its readiness, the lease a retried poll took, the poller's
    /// registration as it stands; one statement, no writer trip.
    fn look(&self, ask: LookAsk) -> impl Future<Output = StoreResult<Readiness>> + Send {
        self.read(move |tx| Box::pin(async move { claim::readiness(tx, &ask).await }))
    }

    /// Leases the oldest ready task of `kind` on `queue` whose type the worker supports, and in
    /// the same transaction remembers it under the poll's `poll_request_id`, if any.
    #[allow(clippy::too_many_arguments)]
    fn claim_task(
        &self,
        namespace: &str,
        kind: TaskKind,
        queue: &str,
        types: &[String],
        owner: &str,
        lease_ms: i64,
        now: Millis,
        poll: Option<PollKey>,
    ) -> impl Future<Output = StoreResult<Option<(Task, RunState)>>> + Send {
        async move {
            let claim = Claim {
                namespace: namespace.to_string(),
                kind,
                queue: queue.to_string(),
                types: types.to_vec(),
                owner: owner.to_string(),
                lease_ms,
                now,
                poll,
            };
            match self.claim(claim).await {
                // The poller just gets nothing: the run's tasks are blocked, so the next claim
                // passes it by.
                Err(error @ (StoreError::Integrity(_) | StoreError::CorruptRun(_))) => match self.settle(error).await {
                    StoreError::Refused(_) => Ok(None),
                    other => Err(other),
                },
                other => other,
            }
        }
    }

    /// Parks a poll on this node: a transaction that makes a task it may take ready leases it
    /// to the poll and answers it after COMMIT (`parked_polls.rs`).
    fn park_poll(&self, poller: Poller) -> Parked {
        self.env().parked.park(poller)
    }

    /// Leases handed to parked polls that went away before the answer: waits for some, then
    /// takes them all (the caller gives them back).
    fn undelivered_hand_offs(&self) -> impl Future<Output = Vec<HandedOff>> + Send {
        let parked = self.env().parked.clone();
        async move { parked.undelivered().await }
    }

    /// [`TaskStore::undelivered_hand_offs`] without waiting.
    fn take_undelivered_hand_offs(&self) -> Vec<HandedOff> {
        self.env().parked.take_undelivered()
    }

    /// How many polls are parked on this node.
    fn parked_polls(&self) -> usize {
        self.env().parked.parked()
    }

    /// Wake-ups published by other nodes sharing the database; `None` for single-node stores
    /// (the in-process hub already sees every change).
    fn wakeups(&self) -> impl Future<Output = StoreResult<Option<WakeReceiver>>> + Send {
        async move { self.take_wakeups().await }
    }

    /// Stores a new query task, ready for a query poller of its queue.
    fn create_query_task(&self, task: QueryTask) -> impl Future<Output = StoreResult<()>> + Send {
        self.write_one(move |tx| Box::pin(async move { queries::create_query_task(tx, &task).await }))
    }

    /// Leases the oldest leasable query task of the claim's kind on its queue (ready, or its
    /// lease ran out unanswered).
    fn claim_query_task(&self, claim: QueryClaim, now: Millis) -> impl Future<Output = StoreResult<Option<QueryTask>>> + Send {
        self.write(move |tx| Box::pin(async move { queries::claim_query_task(tx, &claim, now).await }))
    }

    /// Records a worker's answer under the engine's fencing rules (`QueryTask::answer`).
    fn answer_query_task(&self, answer: QueryAnswer, now: Millis) -> impl Future<Output = StoreResult<QueryTask>> + Send {
        self.write(move |tx| Box::pin(async move { queries::answer_query_task(tx, answer, now).await }))
    }

    fn get_query_task(&self, namespace: &str, id: &str) -> impl Future<Output = StoreResult<Option<QueryTask>>> + Send {
        let (namespace, id) = (namespace.to_string(), id.to_string());
        self.read(move |tx| Box::pin(async move { queries::get_query_task(tx, &namespace, &id).await }))
    }

    fn delete_query_task(&self, namespace: &str, id: &str) -> impl Future<Output = StoreResult<()>> + Send {
        let (namespace, id) = (namespace.to_string(), id.to_string());
        self.write_one(move |tx| Box::pin(async move { queries::delete_query_task(tx, &namespace, &id).await }))
    }
}

impl<B: Backend> TaskStore for B {}
