//! The recovery ledger: action definitions, entries, checkpoints, atomic actions, incidents.

use crate::backend::Backend;
use crate::logic::{actions, integrity, ledger_reads};
use crate::*;
use serde_json::{Map, Value};

/// The recovery ledger: action definitions, entries and checkpoints, atomic actions, integrity incidents.
pub trait LedgerStore: Backend {
    /// Declares an activity type a consequential action. The same content again changes
    /// nothing; new content is the next version with a new hash.
    fn put_action_definition(
        &self,
        namespace: &str,
        activity_type: &str,
        recovery_mode: RecoveryMode,
        document: Map<String, Value>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<ActionDefinition>> + Send {
        let (namespace, activity_type) = (namespace.to_string(), activity_type.to_string());
        self.write(move |tx| {
            Box::pin(async move { actions::put_action_definition(tx, &namespace, &activity_type, recovery_mode, document, now).await })
        })
    }

    /// Every action definition of a namespace, by activity type.
    fn action_definitions(&self, namespace: &str) -> impl Future<Output = StoreResult<Vec<ActionDefinition>>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { ledger_reads::action_definitions(tx, &namespace).await }))
    }

    /// Ledger entries matching `filter`, oldest dispatch first.
    fn ledger_entries(
        &self,
        namespace: &str,
        filter: LedgerFilter,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<LedgerEntry>>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { ledger_reads::ledger_entries(tx, &namespace, &filter, limit).await }))
    }

    fn ledger_entry(&self, namespace: &str, ledger_key: &str) -> impl Future<Output = StoreResult<Option<LedgerEntry>>> + Send {
        let (namespace, key) = (namespace.to_string(), ledger_key.to_string());
        self.read(move |tx| Box::pin(async move { ledger_reads::ledger_entry(tx, &namespace, &key).await }))
    }

    /// An instance's ledger checkpoints in the order they were written.
    fn ledger_checkpoints(
        &self,
        namespace: &str,
        workflow_id: &WorkflowId,
    ) -> impl Future<Output = StoreResult<Vec<LedgerCheckpoint>>> + Send {
        let (namespace, workflow_id) = (namespace.to_string(), workflow_id.clone());
        self.read(move |tx| Box::pin(async move { ledger_reads::ledger_checkpoints(tx, &namespace, &workflow_id).await }))
    }

    /// Runs the oldest ready atomic-action task of `namespace` (if any) in one transaction:
    /// lease, handler, and its completion or failure.
    fn run_atomic_task(
        &self,
        namespace: &str,
        actions: AtomicActions,
        codec: &'static dyn MemoCodec,
        now: Millis,
    ) -> impl Future<Output = StoreResult<Option<AtomicOutcome>>> + Send {
        async move {
            let result = self.run_atomic(namespace.to_string(), actions, codec, now).await;
            self.guard(result).await
        }
    }

    /// Ledger figures for metrics, per namespace: entries by state (with the oldest dispatch
    /// time in each state) and open integrity incidents.
    fn ledger_stats(&self) -> impl Future<Output = StoreResult<LedgerStats>> + Send {
        self.read(move |tx| Box::pin(async move { ledger_reads::ledger_stats(tx).await }))
    }

    /// Integrity incidents of a namespace (`state`: `open` or `closed`; all without).
    fn integrity_incidents(
        &self,
        namespace: &str,
        state: Option<String>,
    ) -> impl Future<Output = StoreResult<Vec<IntegrityIncident>>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { ledger_reads::integrity_incidents(tx, &namespace, state.as_deref()).await }))
    }

    /// Closes an incident once its instance's ledger chain verifies again, and lets the run
    /// continue; a chain that is still broken is refused (`integrity_chain_broken`).
    fn close_integrity_incident(
        &self,
        namespace: &str,
        incident_id: &str,
        note: String,
        now: Millis,
    ) -> impl Future<Output = StoreResult<IntegrityIncident>> + Send {
        let (namespace, incident_id) = (namespace.to_string(), incident_id.to_string());
        let env = self.env().clone();
        self.write(move |tx| Box::pin(async move { integrity::close_incident(tx, &namespace, &incident_id, note, now, &env).await }))
    }

    /// Every workflow instance that has ledger checkpoints: `(namespace, workflow id)`.
    fn ledger_instances(&self) -> impl Future<Output = StoreResult<Vec<(String, WorkflowId)>>> + Send {
        self.read(move |tx| Box::pin(async move { ledger_reads::ledger_instances(tx).await }))
    }
}

impl<B: Backend> LedgerStore for B {}
