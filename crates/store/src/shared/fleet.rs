//! Background duties and the worker fleet on the shared databases.

use super::{in_transaction, SharedStore};
use crate::logic::{admin, duties, fleet, runs, sessions};
use crate::*;
use serde_json::Value;

impl DutyStore for SharedStore {
    async fn run_duty<T, F>(&self, due: &DueTask, now: Millis, transition: F) -> StoreResult<(T, RunState)>
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    {
        let result = in_transaction!(self, |tx| runs::run_duty(tx, due, now, &self.env, transition));
        self.guard(result).await
    }

    async fn claim_due_tasks(&self, node: &str, now: Millis, limit: usize, hold_ms: i64) -> StoreResult<Vec<DueTask>> {
        in_transaction!(self, |tx| duties::claim_due_tasks(tx, node, now, limit, hold_ms))
    }

    async fn next_deadline(&self) -> StoreResult<Option<Millis>> {
        duties::next_deadline(&mut self.reader().await?).await
    }

    async fn prune(&self, older_than: Millis) -> StoreResult<()> {
        duties::prune(&mut self.reader().await?, older_than).await
    }

    async fn expired_instances(&self, namespace: &str, cutoff: Millis, limit: usize) -> StoreResult<Vec<(String, String, Millis)>> {
        duties::expired_instances(&mut self.reader().await?, namespace, cutoff, limit).await
    }

    async fn prune_instances(&self, namespace: &str, workflow_ids: Vec<String>, cutoff: Millis) -> StoreResult<usize> {
        in_transaction!(self, |tx| duties::prune_instances(tx, namespace, &workflow_ids, cutoff))
    }
}

impl FleetStore for SharedStore {
    async fn register_worker(&self, worker: WorkerRecord) -> StoreResult<WorkerRecord> {
        in_transaction!(self, |tx| fleet::register_worker(tx, worker))
    }

    async fn heartbeat_worker(&self, namespace: &str, worker_id: &str, now: Millis) -> StoreResult<Option<WorkerRecord>> {
        fleet::heartbeat_worker(&mut self.reader().await?, namespace, worker_id, now).await
    }

    async fn get_worker(&self, namespace: &str, worker_id: &str) -> StoreResult<Option<WorkerRecord>> {
        fleet::get_worker(&mut self.reader().await?, namespace, worker_id).await
    }

    async fn session_step(
        &self,
        namespace: &str,
        session_id: &str,
        worker_id: &str,
        step: SessionStep,
        now: Millis,
    ) -> StoreResult<SessionAnswer> {
        in_transaction!(self, |tx| sessions::session_step(tx, namespace, session_id, worker_id, step, now))
    }

    async fn deregister_fenced(&self, namespace: &str, worker_id: &str, token: &str, now: Millis) -> StoreResult<(Value, bool)> {
        in_transaction!(self, |tx| fleet::deregister_fenced(tx, namespace, worker_id, token, now))
    }

    async fn get_session(&self, namespace: &str, session_id: &str) -> StoreResult<Option<WorkerSession>> {
        sessions::get_session(&mut self.reader().await?, namespace, session_id).await
    }

    async fn deregister_worker(&self, namespace: &str, worker_id: &str) -> StoreResult<bool> {
        fleet::deregister_worker(&mut self.reader().await?, namespace, worker_id).await
    }

    async fn build_id_rollouts(&self, namespace: &str, queue: &str) -> StoreResult<Vec<BuildIdRollout>> {
        admin::build_id_rollouts(&mut self.reader().await?, namespace, queue).await
    }

    async fn set_build_id_drain(
        &self,
        namespace: &str,
        queue: &str,
        build_id: Option<String>,
        draining: bool,
        now: Millis,
    ) -> StoreResult<BuildIdRollout> {
        in_transaction!(self, |tx| admin::set_build_id_drain(tx, namespace, queue, build_id, draining, now))
    }

    async fn promote_build_id(&self, namespace: &str, queue: &str, build_id: Option<String>, now: Millis) -> StoreResult<BuildIdRollout> {
        in_transaction!(self, |tx| admin::promote_build_id(tx, namespace, queue, build_id, now))
    }

    async fn workers(&self, namespace: &str) -> StoreResult<Vec<WorkerRecord>> {
        fleet::workers(&mut self.reader().await?, namespace).await
    }

    async fn task_queue_names(&self, namespace: &str) -> StoreResult<Vec<String>> {
        fleet::task_queue_names(&mut self.reader().await?, namespace).await
    }

    async fn task_queue_snapshot(&self, namespace: &str, queue: &str, lease_limit: usize) -> StoreResult<QueueSnapshot> {
        fleet::task_queue_snapshot(&mut self.reader().await?, namespace, queue, lease_limit).await
    }

    async fn queue_workers(&self, namespace: &str, queue: &str) -> StoreResult<Vec<WorkerRecord>> {
        fleet::queue_workers(&mut self.reader().await?, namespace, queue).await
    }
}
