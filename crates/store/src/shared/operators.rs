//! The catalog, payload records, streams and operators' records on the shared databases.

use super::{in_transaction, Database, SharedStore};
use crate::logic::{admin, catalog, credentials, duties, external_payloads, namespaces, service_calls, streams};
use crate::*;
use capstan_engine::workflow_stream::StreamItemInput;
use serde_json::{Map, Value};

impl CatalogStore for SharedStore {
    async fn create_catalog_entry(&self, entry: CatalogEntry) -> StoreResult<CatalogEntry> {
        in_transaction!(self, |tx| catalog::create(tx, entry))
    }

    async fn update_catalog_entry(&self, key: CatalogKey, doc: Map<String, Value>, now: Millis) -> StoreResult<CatalogEntry> {
        in_transaction!(self, |tx| catalog::update(tx, &key, doc, now))
    }

    async fn catalog_entry(&self, key: CatalogKey) -> StoreResult<Option<CatalogEntry>> {
        catalog::find(&mut self.reader().await?, &key).await
    }

    async fn catalog_children(&self, namespace: &str, parent: Option<CatalogKey>) -> StoreResult<Vec<CatalogEntry>> {
        catalog::children(&mut self.reader().await?, namespace, parent.as_ref()).await
    }

    async fn delete_catalog_entry(&self, key: CatalogKey) -> StoreResult<CatalogEntry> {
        in_transaction!(self, |tx| catalog::delete(tx, &key))
    }

    async fn admit_service_calls<T, F>(&self, now: Millis, admit: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Cx) -> T + Send + 'static,
    {
        in_transaction!(self, |tx| service_calls::admit_direct(tx, now, &self.env, admit))
    }

    async fn cancel_service_call(
        &self,
        service_call_id: &str,
        reason: Option<String>,
        now: Millis,
        propagate: bool,
    ) -> StoreResult<ServiceCallRecord> {
        in_transaction!(self, |tx| service_calls::cancel(
            tx,
            service_call_id,
            reason,
            now,
            propagate,
            &self.env
        ))
    }

    async fn service_call(&self, service_call_id: &str) -> StoreResult<Option<ServiceCallRecord>> {
        service_calls::find(&mut self.reader().await?, service_call_id).await
    }

    async fn service_call_by_key(&self, route: RouteKey, idempotency_key: &str) -> StoreResult<Option<ServiceCallRecord>> {
        service_calls::find_by_key(&mut self.reader().await?, &route, idempotency_key).await
    }

    async fn service_calls_of_caller(
        &self,
        caller_namespace: &str,
        workflow_id: &str,
        run_id: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<ServiceCallRecord>> {
        service_calls::of_caller(&mut self.reader().await?, caller_namespace, workflow_id, run_id, limit).await
    }
}

impl PayloadStore for SharedStore {
    async fn record_external_payload(&self, record: ExternalPayloadRecord) -> StoreResult<()> {
        external_payloads::insert(&mut self.reader().await?, &record).await
    }

    async fn external_payload(&self, namespace: &str, reference_id: &str) -> StoreResult<Option<ExternalPayloadRecord>> {
        external_payloads::find(&mut self.reader().await?, namespace, reference_id).await
    }

    async fn unused_external_payloads(&self, created_before: Millis, limit: i64) -> StoreResult<Vec<ExternalPayloadRecord>> {
        external_payloads::unused(&mut self.reader().await?, created_before, limit).await
    }

    async fn forget_unused_external_payload(&self, namespace: &str, reference_id: &str) -> StoreResult<bool> {
        external_payloads::forget_unused(&mut self.reader().await?, namespace, reference_id).await
    }

    async fn set_namespace_external_storage(
        &self,
        name: &str,
        policy: Option<ExternalStoragePolicy>,
        now: Millis,
    ) -> StoreResult<NamespaceRecord> {
        in_transaction!(self, |tx| namespaces::set_external_storage(tx, name, policy, now))
    }
}

impl StreamStore for SharedStore {
    async fn append_stream_items(
        &self,
        target: StreamTarget,
        items: Vec<StreamItemInput>,
        max_pending_items: Option<u64>,
        now: Millis,
    ) -> StoreResult<StreamAppend> {
        in_transaction!(self, |tx| streams::client_append(tx, &target, &items, max_pending_items, now))
    }

    async fn finish_stream(
        &self,
        target: StreamTarget,
        error_reason: Option<String>,
        retention_seconds: Option<i64>,
        now: Millis,
    ) -> StoreResult<StreamState> {
        in_transaction!(self, |tx| streams::client_finish(
            tx,
            &target,
            error_reason.as_deref(),
            retention_seconds,
            now
        ))
    }

    async fn list_streams(&self, namespace: &str, workflow_id: &str, run_id: &str) -> StoreResult<Vec<StreamState>> {
        streams::list(&mut self.reader().await?, namespace, workflow_id, run_id).await
    }

    async fn read_stream(&self, target: StreamTarget, from: u64, max: u64) -> StoreResult<(StreamState, Vec<StoredStreamItem>)> {
        streams::read(&mut self.reader().await?, &target, from, max).await
    }

    async fn stream_caught_up(&self, target: StreamTarget, next_offset: u64) -> StoreResult<()> {
        streams::caught_up(&mut self.reader().await?, &target, next_offset).await
    }

    async fn expire_streams(&self, now: Millis) -> StoreResult<u64> {
        streams::expire(&mut self.reader().await?, now).await
    }
}

impl AdminStore for SharedStore {
    async fn namespaces(&self) -> StoreResult<Vec<NamespaceRecord>> {
        namespaces::namespaces(&mut self.reader().await?).await
    }

    async fn create_namespace(&self, record: NamespaceRecord) -> StoreResult<NamespaceRecord> {
        namespaces::create_namespace(&mut self.reader().await?, record).await
    }

    async fn update_namespace(
        &self,
        name: &str,
        description: Option<String>,
        retention_days: Option<i64>,
        now: Millis,
    ) -> StoreResult<NamespaceRecord> {
        in_transaction!(self, |tx| namespaces::update_namespace(tx, name, description, retention_days, now))
    }

    async fn delete_namespace(&self, name: &str) -> StoreResult<NamespaceRecord> {
        in_transaction!(self, |tx| namespaces::delete_namespace(tx, name))
    }

    async fn ping(&self) -> StoreResult<()> {
        // Ready means a write commits now (see `probe_write`); not worth tracking failures to
        // skip, it is one tiny upsert.
        admin::probe_write(&mut self.reader().await?, self.env.now_ms()).await
    }

    async fn namespace_exists(&self, namespace: &str) -> StoreResult<bool> {
        namespaces::namespace_exists(&mut self.reader().await?, namespace).await
    }

    async fn queue_loads(&self, now: Millis, limit: usize) -> StoreResult<Vec<QueueLoad>> {
        duties::queue_loads(&mut self.reader().await?, now, limit).await
    }

    fn pool_use(&self) -> PoolUse {
        match &self.database {
            Database::Postgres(pg) => pg.pool_use(),
            Database::Mysql(my) => my.pool_use(),
        }
    }

    async fn system_counts(&self, namespace: &str, now: Millis) -> StoreResult<SystemCounts> {
        duties::system_counts(&mut self.reader().await?, namespace, now).await
    }

    async fn bridge_delivery(&self, namespace: &str, adapter: &str, key: &str) -> StoreResult<Option<Value>> {
        admin::bridge_delivery(&mut self.reader().await?, namespace, adapter, key).await
    }

    async fn record_bridge_delivery(
        &self,
        namespace: &str,
        adapter: &str,
        key: &str,
        outcome: Value,
        now: Millis,
    ) -> StoreResult<Option<Value>> {
        admin::record_bridge_delivery(&mut self.reader().await?, namespace, adapter, key, &outcome, now).await
    }

    async fn search_attribute_definitions(
        &self,
        namespace: &str,
    ) -> StoreResult<std::collections::BTreeMap<String, capstan_engine::visibility::AttributeType>> {
        admin::search_attribute_definitions(&mut self.reader().await?, namespace).await
    }

    async fn define_search_attribute(
        &self,
        namespace: &str,
        name: &str,
        kind: capstan_engine::visibility::AttributeType,
        now: Millis,
    ) -> StoreResult<()> {
        admin::define_search_attribute(&mut self.reader().await?, namespace, name, kind, now).await
    }

    async fn delete_search_attribute(&self, namespace: &str, name: &str) -> StoreResult<bool> {
        admin::delete_search_attribute(&mut self.reader().await?, namespace, name).await
    }

    async fn credentials(&self) -> StoreResult<Vec<CredentialRecord>> {
        credentials::credentials(&mut self.reader().await?).await
    }

    async fn create_credential(&self, record: CredentialRecord) -> StoreResult<CredentialRecord> {
        in_transaction!(self, |tx| credentials::create_credential(tx, record))
    }

    async fn change_credential(
        &self,
        principal: &str,
        change: CredentialChange,
        by: Option<capstan_engine::Principal>,
        now: Millis,
    ) -> StoreResult<CredentialRecord> {
        in_transaction!(self, |tx| credentials::change_credential(tx, principal, change, by, now))
    }

    async fn delete_credential(
        &self,
        principal: &str,
        by: Option<capstan_engine::Principal>,
        now: Millis,
    ) -> StoreResult<CredentialRecord> {
        in_transaction!(self, |tx| credentials::delete_credential(tx, principal, by, now))
    }

    async fn credential_events(&self, principal: Option<&str>, before: Option<i64>, limit: usize) -> StoreResult<Vec<CredentialEvent>> {
        credentials::credential_events(&mut self.reader().await?, principal, before, limit).await
    }
}
