//! The recovery ledger and schedules on the shared databases.

use super::{in_transaction, SharedStore};
use crate::logic::{actions, integrity, ledger_reads};
use crate::schedules;
use crate::*;
use capstan_engine::schedule::Schedule;
use serde_json::{Map, Value};

impl LedgerStore for SharedStore {
    async fn run_atomic_task(
        &self,
        namespace: &str,
        actions: AtomicActions,
        codec: &'static dyn MemoCodec,
        now: Millis,
    ) -> StoreResult<Option<AtomicOutcome>> {
        let result = self.run_atomic_task_checked(namespace, actions, codec, now).await;
        self.guard(result).await
    }

    async fn ledger_stats(&self) -> StoreResult<LedgerStats> {
        ledger_reads::ledger_stats(&mut self.reader().await?).await
    }

    async fn integrity_incidents(&self, namespace: &str, state: Option<String>) -> StoreResult<Vec<IntegrityIncident>> {
        ledger_reads::integrity_incidents(&mut self.reader().await?, namespace, state.as_deref()).await
    }

    async fn close_integrity_incident(
        &self,
        namespace: &str,
        incident_id: &str,
        note: String,
        now: Millis,
    ) -> StoreResult<IntegrityIncident> {
        let incident = in_transaction!(self, |tx| integrity::close_incident(
            tx,
            namespace,
            incident_id,
            note,
            now,
            &self.env
        ))?;
        Ok(incident)
    }

    async fn ledger_instances(&self) -> StoreResult<Vec<(String, WorkflowId)>> {
        ledger_reads::ledger_instances(&mut self.reader().await?).await
    }

    async fn put_action_definition(
        &self,
        namespace: &str,
        activity_type: &str,
        recovery_mode: RecoveryMode,
        document: Map<String, Value>,
        now: Millis,
    ) -> StoreResult<ActionDefinition> {
        in_transaction!(self, |tx| actions::put_action_definition(
            tx,
            namespace,
            activity_type,
            recovery_mode,
            document,
            now
        ))
    }

    async fn action_definitions(&self, namespace: &str) -> StoreResult<Vec<ActionDefinition>> {
        ledger_reads::action_definitions(&mut self.reader().await?, namespace).await
    }

    async fn ledger_entries(&self, namespace: &str, filter: LedgerFilter, limit: usize) -> StoreResult<Vec<LedgerEntry>> {
        ledger_reads::ledger_entries(&mut self.reader().await?, namespace, &filter, limit).await
    }

    async fn ledger_entry(&self, namespace: &str, ledger_key: &str) -> StoreResult<Option<LedgerEntry>> {
        ledger_reads::ledger_entry(&mut self.reader().await?, namespace, ledger_key).await
    }

    async fn ledger_checkpoints(&self, namespace: &str, workflow_id: &WorkflowId) -> StoreResult<Vec<LedgerCheckpoint>> {
        ledger_reads::ledger_checkpoints(&mut self.reader().await?, namespace, workflow_id).await
    }
}

impl ScheduleStore for SharedStore {
    async fn create_schedule(&self, schedule: Schedule) -> StoreResult<()> {
        in_transaction!(self, |tx| schedules::create_schedule(tx, schedule, &self.env))
    }

    async fn schedule(&self, namespace: &str, schedule_id: &str) -> StoreResult<Option<Schedule>> {
        schedules::schedule(&mut self.reader().await?, namespace, schedule_id).await
    }

    async fn list_schedules(&self, namespace: &str, filter: ScheduleFilter) -> StoreResult<Vec<Schedule>> {
        schedules::list_schedules(&mut self.reader().await?, namespace, &filter).await
    }

    async fn change_schedule<T: Send + 'static>(
        &self,
        namespace: &str,
        schedule_id: &str,
        change: impl FnOnce(&mut Schedule) -> Result<T, Refusal> + Send + 'static,
    ) -> StoreResult<T> {
        in_transaction!(self, |tx| schedules::change_schedule(tx, namespace, schedule_id, change, &self.env))
    }

    async fn fire_schedule(
        &self,
        namespace: &str,
        schedule_id: &str,
        fire: ScheduleFire,
        empty_input: Payload,
        now: Millis,
    ) -> StoreResult<FireReport> {
        in_transaction!(self, |tx| schedules::fire_schedule(
            tx,
            namespace,
            schedule_id,
            &fire,
            &empty_input,
            now,
            &self.env
        ))
    }

    async fn due_schedules(&self, now: Millis, limit: usize) -> StoreResult<Vec<(String, String)>> {
        schedules::due_schedules(&mut self.reader().await?, now, limit).await
    }

    async fn next_schedule_wake(&self) -> StoreResult<Option<Millis>> {
        schedules::next_schedule_wake(&mut self.reader().await?).await
    }

    async fn schedule_history(
        &self,
        namespace: &str,
        schedule_id: &str,
        after_sequence: i64,
        limit: usize,
    ) -> StoreResult<Option<Vec<ScheduleEventRecord>>> {
        schedules::schedule_history(&mut self.reader().await?, namespace, schedule_id, after_sequence, limit).await
    }
}
