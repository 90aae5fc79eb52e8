//! The worker fleet: registrations, sessions, build-id rollouts, task queues.

use crate::backend::Backend;
use crate::logic::{admin, fleet, flow, sessions};
use crate::*;

/// Workers, task queues and build-id rollouts.
pub trait FleetStore: Backend {
    /// Creates or updates `(namespace, worker_id)`. A changed workflow definition fingerprint
    /// on an active registration is refused with `workflow_definition_changed`.
    fn register_worker(&self, worker: WorkerRecord) -> impl Future<Output = StoreResult<WorkerRecord>> + Send {
        self.write(move |tx| Box::pin(async move { fleet::register_worker(tx, worker).await }))
    }

    /// A worker's heartbeat at `now`; `reported` fields (its free slots, its process metrics)
    /// replace those of its document. `None` when the worker is not registered.
    fn heartbeat_worker(
        &self,
        namespace: &str,
        worker_id: &str,
        now: Millis,
        reported: Map<String, Value>,
    ) -> impl Future<Output = StoreResult<Option<WorkerRecord>>> + Send {
        let (namespace, worker_id) = (namespace.to_string(), worker_id.to_string());
        self.write_one(move |tx| Box::pin(async move { fleet::heartbeat_worker(tx, &namespace, &worker_id, now, reported).await }))
    }

    fn get_worker(&self, namespace: &str, worker_id: &str) -> impl Future<Output = StoreResult<Option<WorkerRecord>>> + Send {
        let (namespace, worker_id) = (namespace.to_string(), worker_id.to_string());
        self.read(move |tx| Box::pin(async move { fleet::get_worker(tx, &namespace, &worker_id).await }))
    }

    /// Removes a registration; `false` when there was none.
    fn deregister_worker(&self, namespace: &str, worker_id: &str) -> impl Future<Output = StoreResult<bool>> + Send {
        let (namespace, worker_id) = (namespace.to_string(), worker_id.to_string());
        self.write_one(move |tx| Box::pin(async move { fleet::deregister_worker(tx, &namespace, &worker_id).await }))
    }

    /// One step on a worker session by `worker_id` (acquire, heartbeat, close), atomically:
    /// the session row is locked, refreshed (lease, TTL, holder still registered), decided by
    /// the engine and written back; a refusal writes nothing.
    fn session_step(
        &self,
        namespace: &str,
        session_id: &str,
        worker_id: &str,
        step: SessionStep,
        now: Millis,
    ) -> impl Future<Output = StoreResult<SessionAnswer>> + Send {
        let (namespace, session_id, worker_id) = (namespace.to_string(), session_id.to_string(), worker_id.to_string());
        self.write(move |tx| Box::pin(async move { sessions::session_step(tx, &namespace, &session_id, &worker_id, step, now).await }))
    }

    /// A fenced deregistration: removes `worker_id`'s registration if `token` is its current
    /// `registration_token` and keeps the receipt (`DEREGISTRATION_RECEIPT_RETENTION_MS`), so a
    /// retry with the same token gets it again; answers `(receipt, replayed)`. Another token is
    /// `worker_registration_lost_authority`; no registration and no receipt is
    /// `worker_registration_token_not_found`.
    fn deregister_fenced(
        &self,
        namespace: &str,
        worker_id: &str,
        token: &str,
        now: Millis,
    ) -> impl Future<Output = StoreResult<(Value, bool)>> + Send {
        let (namespace, worker_id, token) = (namespace.to_string(), worker_id.to_string(), token.to_string());
        self.write(move |tx| Box::pin(async move { fleet::deregister_fenced(tx, &namespace, &worker_id, &token, now).await }))
    }

    /// A worker session as stored (not refreshed).
    fn get_session(&self, namespace: &str, session_id: &str) -> impl Future<Output = StoreResult<Option<WorkerSession>>> + Send {
        let (namespace, session_id) = (namespace.to_string(), session_id.to_string());
        self.read(move |tx| Box::pin(async move { sessions::get_session(tx, &namespace, &session_id).await }))
    }

    /// The rollout intents recorded for a task queue's build-id cohorts.
    fn build_id_rollouts(&self, namespace: &str, queue: &str) -> impl Future<Output = StoreResult<Vec<BuildIdRollout>>> + Send {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.read(move |tx| Box::pin(async move { admin::build_id_rollouts(tx, &namespace, &queue).await }))
    }

    /// Drains (`draining: true`) or resumes a cohort. Draining again keeps the first
    /// `drained_at`; resuming clears it.
    fn set_build_id_drain(
        &self,
        namespace: &str,
        queue: &str,
        build_id: Option<String>,
        draining: bool,
        now: Millis,
    ) -> impl Future<Output = StoreResult<BuildIdRollout>> + Send {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.write(move |tx| Box::pin(async move { admin::set_build_id_drain(tx, &namespace, &queue, build_id, draining, now).await }))
    }

    /// Promotes a cohort for new starts on a queue (un-promoting any other).
    fn promote_build_id(
        &self,
        namespace: &str,
        queue: &str,
        build_id: Option<String>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<BuildIdRollout>> + Send {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.write(move |tx| Box::pin(async move { admin::promote_build_id(tx, &namespace, &queue, build_id, now).await }))
    }

    /// Every registration of a namespace, by worker id.
    fn workers(&self, namespace: &str) -> impl Future<Output = StoreResult<Vec<WorkerRecord>>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { fleet::workers(tx, &namespace).await }))
    }

    /// Task queues a namespace has used: with open tasks, or with registered workers.
    fn task_queue_names(&self, namespace: &str) -> impl Future<Output = StoreResult<Vec<String>>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { fleet::task_queue_names(tx, &namespace).await }))
    }

    /// Open tasks of one queue: counts by kind and status, and the current leases (at most
    /// `lease_limit`).
    fn task_queue_snapshot(
        &self,
        namespace: &str,
        queue: &str,
        lease_limit: usize,
    ) -> impl Future<Output = StoreResult<QueueSnapshot>> + Send {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.read(move |tx| Box::pin(async move { fleet::task_queue_snapshot(tx, &namespace, &queue, lease_limit).await }))
    }

    /// A queue's ready workflow and activity tasks by priority and fairness class, with the
    /// classes' recent dispatch on this node at `now`.
    fn priority_fairness(&self, namespace: &str, queue: &str, now: Millis) -> impl Future<Output = StoreResult<QueueShares>> + Send {
        let (namespace, queue, env) = (namespace.to_string(), queue.to_string(), self.env().clone());
        self.read(move |tx| Box::pin(async move { fleet::priority_fairness(tx, &namespace, &queue, now, &env).await }))
    }

    /// Sets the flow-control limits of one queue and task kind (no limit in `limits`: clears
    /// them); in force for this process's next claim, and on other nodes within a second.
    fn set_queue_limits(
        &self,
        namespace: &str,
        queue: &str,
        kind: TaskKind,
        limits: capstan_engine::flow::QueueLimits,
        now: Millis,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let (namespace, queue, env) = (namespace.to_string(), queue.to_string(), self.env().clone());
        async move {
            let (ns, q) = (namespace.clone(), queue.clone());
            self.write(move |tx| Box::pin(async move { flow::set(tx, &ns, &q, kind, &limits, now).await }))
                .await?;
            env.limited.add(&namespace, &queue, kind);
            Ok(())
        }
    }

    /// Pauses (`Some`) or resumes (`None`) one queue's tasks of one kind; whether that changed
    /// anything. In force for this process's next claim, and on other nodes within a second.
    fn set_queue_pause(
        &self,
        namespace: &str,
        queue: &str,
        kind: TaskKind,
        pause: Option<capstan_engine::PauseRecord>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<bool>> + Send {
        let (namespace, queue, env) = (namespace.to_string(), queue.to_string(), self.env().clone());
        async move {
            let (ns, q) = (namespace.clone(), queue.clone());
            let changed = self
                .write(move |tx| Box::pin(async move { flow::set_pause(tx, &ns, &q, kind, pause, now).await }))
                .await?;
            env.limited.add(&namespace, &queue, kind);
            Ok(changed)
        }
    }

    /// Every paused queue kind, `(namespace, queue, kind, paused at)`.
    fn paused_queues(&self) -> impl Future<Output = StoreResult<Vec<(String, String, String, Millis)>>> + Send {
        self.read(move |tx| Box::pin(async move { flow::paused(tx).await }))
    }

    /// The flow-control limits set on one queue, per task kind.
    fn queue_limits(&self, namespace: &str, queue: &str) -> impl Future<Output = StoreResult<Vec<QueueLimitState>>> + Send {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.read(move |tx| Box::pin(async move { flow::of_queue(tx, &namespace, &queue).await }))
    }

    /// Registrations on one task queue (for query routing: who can answer).
    fn queue_workers(&self, namespace: &str, queue: &str) -> impl Future<Output = StoreResult<Vec<WorkerRecord>>> + Send {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.read(move |tx| Box::pin(async move { fleet::queue_workers(tx, &namespace, &queue).await }))
    }
}

impl<B: Backend> FleetStore for B {}
