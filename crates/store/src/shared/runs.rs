//! Runs and tasks on the shared databases.

use super::{in_transaction, Database, SharedStore};
use crate::logic::{audit, claim, fleet, ledger_reads, listing, queries, runs};
use crate::*;
use serde_json::Value;
use std::sync::Arc;

impl RunStore for SharedStore {
    fn with_observer(self, observer: Arc<dyn Observer>) -> Self {
        self.env.observer.set(observer);
        self
    }

    fn with_payload_codec(mut self, codec: &'static dyn MemoCodec) -> Self {
        self.env = Arc::new(Env {
            codec: Some(codec),
            ..Env::clone(&self.env)
        });
        self
    }

    async fn mutate_run<T, F>(&self, namespace: &str, locator: RunLocator, now: Millis, transition: F) -> StoreResult<(T, RunState)>
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    {
        let result = in_transaction!(self, |tx| runs::mutate(tx, namespace, &locator, now, &self.env, transition));
        self.guard(result).await
    }

    async fn mutate_run_keyed<T, F, R>(
        &self,
        namespace: &str,
        locator: RunLocator,
        key: CommandKey,
        now: Millis,
        transition: F,
        render: R,
    ) -> StoreResult<(KeyedReceipt<T>, Option<RunState>)>
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
        R: FnOnce(&T, &RunState) -> Value + Send + 'static,
    {
        let command = runs::KeyedCommand {
            namespace,
            locator: &locator,
            key: &key,
        };
        let result = in_transaction!(self, |tx| runs::mutate_keyed(tx, command, now, &self.env, transition, render));
        self.guard(result).await
    }

    async fn runs_page(&self, after: Option<RunId>, limit: usize) -> StoreResult<Vec<(String, WorkflowId, RunId)>> {
        let after = after.map(|r| r.as_str().to_string()).unwrap_or_default();
        ledger_reads::runs_page(&mut self.reader().await?, &after, limit).await
    }

    async fn start_workflow(&self, start: StartRun, policy: DuplicatePolicy, now: Millis) -> StoreResult<(StartOutcome, RunState)> {
        let result = in_transaction!(self, |tx| runs::start_workflow(tx, start, policy, now, &self.env));
        self.guard(result).await
    }

    async fn start_standalone_activity(&self, start: StartStandaloneActivity, now: Millis) -> StoreResult<RunState> {
        let result = in_transaction!(self, |tx| runs::start_standalone_activity(tx, start, now, &self.env));
        self.guard(result).await
    }

    async fn retained_command(
        &self,
        namespace: &str,
        workflow_id: &WorkflowId,
        command_type: &str,
        request_id: &str,
    ) -> StoreResult<Option<(String, Value)>> {
        ledger_reads::retained_command(&mut self.reader().await?, namespace, workflow_id, command_type, request_id).await
    }

    async fn load_run(&self, namespace: &str, locator: RunLocator) -> StoreResult<Option<RunState>> {
        let result = runs::load_run(&mut self.reader().await?, namespace, &locator).await;
        self.guard(result).await
    }

    async fn record_audit(&self, event: AuditEvent) -> StoreResult<()> {
        in_transaction!(self, |tx| audit::record_audit(tx, &event))
    }

    async fn audit_events(
        &self,
        namespace: &str,
        workflow_id: &str,
        before: Option<(Millis, String)>,
        limit: usize,
    ) -> StoreResult<Vec<AuditEvent>> {
        audit::audit_events(&mut self.reader().await?, namespace, workflow_id, before, limit).await
    }

    async fn history(&self, run_id: &RunId, after: u64, upto: u64, limit: usize) -> StoreResult<Vec<HistoryEvent>> {
        runs::history(&mut self.reader().await?, run_id, after, upto, limit).await
    }

    async fn stored_history(&self, run_id: &RunId, after: u64, upto: u64, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        runs::stored_history(&mut self.reader().await?, run_id, after, upto, limit).await
    }

    async fn list_runs(&self, namespace: &str, filter: ListFilter, offset: usize, limit: usize) -> StoreResult<(Vec<RunSummary>, bool)> {
        listing::list_runs(&mut self.reader().await?, namespace, &filter, offset, limit).await
    }

    async fn count_runs(&self, namespace: &str, filter: ListFilter) -> StoreResult<RunCounts> {
        listing::count_runs(&mut self.reader().await?, namespace, &filter).await
    }

    async fn runs_of(&self, namespace: &str, workflow_id: &WorkflowId) -> StoreResult<Vec<RunSummary>> {
        runs::runs_of(&mut self.reader().await?, namespace, workflow_id).await
    }
}

impl TaskStore for SharedStore {
    async fn claim_task(
        &self,
        namespace: &str,
        kind: TaskKind,
        queue: &str,
        types: &[String],
        owner: &str,
        lease_ms: i64,
        now: Millis,
        poll: Option<PollKey>,
    ) -> StoreResult<Option<(Task, RunState)>> {
        match self
            .claim_task_checked(namespace, kind, queue, types, owner, lease_ms, now, poll)
            .await
        {
            Err(error @ (StoreError::Integrity(_) | StoreError::CorruptRun(_))) => match self.settle(error).await {
                StoreError::Refused(_) => Ok(None),
                other => Err(other),
            },
            other => other,
        }
    }

    async fn leased_tasks(&self, namespace: &str, owner: &str, kind: TaskKind) -> StoreResult<Vec<TaskId>> {
        fleet::leased_tasks(&mut self.reader().await?, namespace, owner, kind).await
    }

    async fn has_ready_task(&self, namespace: &str, kind: TaskKind, queue: &str, types: &[String], now: Millis) -> StoreResult<Readiness> {
        claim::readiness(&mut self.reader().await?, namespace, kind, queue, types, now).await
    }

    async fn create_query_task(&self, task: QueryTask) -> StoreResult<()> {
        queries::create_query_task(&mut self.reader().await?, &task).await
    }

    async fn claim_query_task(
        &self,
        namespace: &str,
        queue: &str,
        kind: QueryKind,
        owner: &str,
        lease_ms: i64,
        now: Millis,
    ) -> StoreResult<Option<QueryTask>> {
        in_transaction!(self, |tx| queries::claim_query_task(
            tx, namespace, queue, kind, owner, lease_ms, now
        ))
    }

    async fn answer_query_task(
        &self,
        namespace: &str,
        id: &str,
        owner: &str,
        attempt: u32,
        outcome: QueryOutcome,
        now: Millis,
    ) -> StoreResult<QueryTask> {
        in_transaction!(self, |tx| queries::answer_query_task(
            tx, namespace, id, owner, attempt, outcome, now
        ))
    }

    async fn get_query_task(&self, namespace: &str, id: &str) -> StoreResult<Option<QueryTask>> {
        queries::get_query_task(&mut self.reader().await?, namespace, id).await
    }

    async fn delete_query_task(&self, namespace: &str, id: &str) -> StoreResult<()> {
        queries::delete_query_task(&mut self.reader().await?, namespace, id).await
    }

    async fn recall_poll(&self, key: PollKey) -> StoreResult<Option<(TaskId, u64)>> {
        queries::recall_poll(&mut self.reader().await?, &key).await
    }

    async fn wakeups(&self) -> StoreResult<Option<WakeReceiver>> {
        match &self.database {
            Database::Postgres(pg) => pg.wakeups().await,
            // This node's commits only: pollers find other nodes' tasks by their re-check.
            Database::Mysql(my) => Ok(my.wakeups()),
        }
    }
}
