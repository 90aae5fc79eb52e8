//! Operators' records: namespaces, readiness, load, bridge deliveries, search attributes,
//! credentials.

use crate::backend::Backend;
use crate::logic::{admin, credentials, duties, namespaces};
use crate::*;
use serde_json::Value;

/// Readiness, namespaces, system counts, bridge deliveries, search-attribute definitions.
pub trait AdminStore: Backend {
    /// Whether the database takes a write now: a read, and a small probe write (always on
    /// PostgreSQL; on SQLite after a failed commit, until one commits again).
    fn ping(&self) -> impl Future<Output = StoreResult<()>> + Send {
        async move { self.probe().await }
    }

    fn namespace_exists(&self, namespace: &str) -> impl Future<Output = StoreResult<bool>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { namespaces::namespace_exists(tx, &namespace).await }))
    }

    /// Every namespace, by name.
    fn namespaces(&self) -> impl Future<Output = StoreResult<Vec<NamespaceRecord>>> + Send {
        self.read(move |tx| Box::pin(async move { namespaces::namespaces(tx).await }))
    }

    /// Creates a namespace; an existing name is `namespace_already_exists`.
    fn create_namespace(&self, record: NamespaceRecord) -> impl Future<Output = StoreResult<NamespaceRecord>> + Send {
        self.write_one(move |tx| Box::pin(async move { namespaces::create_namespace(tx, record).await }))
    }

    /// Replaces a namespace's description and retention (`None` leaves a field as it is).
    fn update_namespace(
        &self,
        name: &str,
        description: Option<String>,
        retention_days: Option<i64>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<NamespaceRecord>> + Send {
        let name = name.to_string();
        self.write(move |tx| Box::pin(async move { namespaces::update_namespace(tx, &name, description, retention_days, now).await }))
    }

    /// Deletes an empty namespace (`default` never): one that still holds workflows is
    /// `namespace_not_empty`.
    fn delete_namespace(&self, name: &str) -> impl Future<Output = StoreResult<NamespaceRecord>> + Send {
        let name = name.to_string();
        self.write(move |tx| Box::pin(async move { namespaces::delete_namespace(tx, &name).await }))
    }

    /// Runs per status and open tasks per (kind, status) of a namespace, and how many leases
    /// have expired at `now` without being reclaimed yet.
    fn system_counts(&self, namespace: &str, now: Millis) -> impl Future<Output = StoreResult<SystemCounts>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { duties::system_counts(tx, &namespace, now).await }))
    }

    /// Every queue with workflow or activity work waiting or leased at `now` (at most `limit`
    /// queues, the busiest first).
    fn queue_loads(&self, now: Millis, limit: usize) -> impl Future<Output = StoreResult<Vec<QueueLoad>>> + Send {
        self.read(move |tx| Box::pin(async move { duties::queue_loads(tx, now, limit).await }))
    }

    /// How the store's connections are used now.
    fn pool_use(&self) -> PoolUse {
        self.connections()
    }

    /// How long writes stand in line before they run now (`crate::pressure`).
    fn write_queue_delay(&self) -> std::time::Duration {
        self.env().write_delay.standing()
    }

    /// The outcome recorded for a bridge delivery, if it was accepted before.
    fn bridge_delivery(&self, namespace: &str, adapter: &str, key: &str) -> impl Future<Output = StoreResult<Option<Value>>> + Send {
        let (namespace, adapter, key) = (namespace.to_string(), adapter.to_string(), key.to_string());
        self.read(move |tx| Box::pin(async move { admin::bridge_delivery(tx, &namespace, &adapter, &key).await }))
    }

    /// Records an accepted delivery; when one was recorded first (a concurrent repeat), returns
    /// that one instead and records nothing.
    fn record_bridge_delivery(
        &self,
        namespace: &str,
        adapter: &str,
        key: &str,
        outcome: Value,
        now: Millis,
    ) -> impl Future<Output = StoreResult<Option<Value>>> + Send {
        let (namespace, adapter, key) = (namespace.to_string(), adapter.to_string(), key.to_string());
        self.write_one(move |tx| {
            Box::pin(async move { admin::record_bridge_delivery(tx, &namespace, &adapter, &key, &outcome, now).await })
        })
    }

    /// The custom search attributes defined in a namespace, by name.
    fn search_attribute_definitions(
        &self,
        namespace: &str,
    ) -> impl Future<Output = StoreResult<std::collections::BTreeMap<String, capstan_engine::visibility::AttributeType>>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { admin::search_attribute_definitions(tx, &namespace).await }))
    }

    /// Defines a custom search attribute; an existing name is refused
    /// (`search_attribute_already_exists`).
    fn define_search_attribute(
        &self,
        namespace: &str,
        name: &str,
        kind: capstan_engine::visibility::AttributeType,
        now: Millis,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.write_one(move |tx| Box::pin(async move { admin::define_search_attribute(tx, &namespace, &name, kind, now).await }))
    }

    /// Removes a definition (values already stored stay on their runs); `false` if none.
    fn delete_search_attribute(&self, namespace: &str, name: &str) -> impl Future<Output = StoreResult<bool>> + Send {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.write_one(move |tx| Box::pin(async move { admin::delete_search_attribute(tx, &namespace, &name).await }))
    }

    /// Every credential managed over the admin API, by principal.
    fn credentials(&self) -> impl Future<Output = StoreResult<Vec<CredentialRecord>>> + Send {
        self.read(move |tx| Box::pin(async move { credentials::credentials(tx).await }))
    }

    /// Stores a new credential; a principal already stored is `credential_already_exists`.
    /// Each change below is recorded on the audit trail ([`CredentialEvent`]) in its own
    /// transaction.
    fn create_credential(&self, record: CredentialRecord) -> impl Future<Output = StoreResult<CredentialRecord>> + Send {
        self.write(move |tx| Box::pin(async move { credentials::create_credential(tx, record).await }))
    }

    /// Applies `change` to a stored credential (`credential_not_found`), stamping who and when.
    fn change_credential(
        &self,
        principal: &str,
        change: CredentialChange,
        by: Option<capstan_engine::Principal>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<CredentialRecord>> + Send {
        let principal = principal.to_string();
        self.write(move |tx| Box::pin(async move { credentials::change_credential(tx, &principal, change, by, now).await }))
    }

    /// Removes a stored credential (`credential_not_found`); the removed one.
    fn delete_credential(
        &self,
        principal: &str,
        by: Option<capstan_engine::Principal>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<CredentialRecord>> + Send {
        let principal = principal.to_string();
        self.write(move |tx| Box::pin(async move { credentials::delete_credential(tx, &principal, by, now).await }))
    }

    /// The credentials' audit trail, newest first: up to `limit` events older than `before`
    /// (a sequence), of `principal` alone if named.
    fn credential_events(
        &self,
        principal: Option<&str>,
        before: Option<i64>,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<CredentialEvent>>> + Send {
        let principal = principal.map(str::to_string);
        self.read(move |tx| Box::pin(async move { credentials::credential_events(tx, principal.as_deref(), before, limit).await }))
    }
}

impl<B: Backend> AdminStore for B {}
