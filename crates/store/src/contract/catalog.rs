//! The Nexus service catalog and service calls made outside any run.

use crate::backend::Backend;
use crate::logic::{catalog, persist, service_calls};
use crate::*;

/// The Nexus service catalog (endpoints → services → operations, per namespace).
pub trait CatalogStore: Backend {
    /// Creates an entry; its parent must exist (`endpoint_not_found`, `service_not_found`), its
    /// key must be free (`…_already_exists`).
    fn create_catalog_entry(&self, entry: CatalogEntry) -> impl Future<Output = StoreResult<CatalogEntry>> + Send {
        self.write(move |tx| Box::pin(async move { catalog::create(tx, entry).await }))
    }

    /// Replaces an entry's document (`…_not_found`).
    fn update_catalog_entry(
        &self,
        key: CatalogKey,
        doc: Map<String, Value>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<CatalogEntry>> + Send {
        self.write(move |tx| Box::pin(async move { catalog::update(tx, &key, doc, now).await }))
    }

    fn catalog_entry(&self, key: CatalogKey) -> impl Future<Output = StoreResult<Option<CatalogEntry>>> + Send {
        self.read(move |tx| Box::pin(async move { catalog::find(tx, &key).await }))
    }

    /// The entries directly below `parent` (`None`: the namespace's endpoints), by name.
    fn catalog_children(&self, namespace: &str, parent: Option<CatalogKey>) -> impl Future<Output = StoreResult<Vec<CatalogEntry>>> + Send {
        let namespace = namespace.to_string();
        self.read(move |tx| Box::pin(async move { catalog::children(tx, &namespace, parent.as_ref()).await }))
    }

    /// Deletes an entry with nothing below it (`endpoint_has_services`, `service_has_operations`).
    fn delete_catalog_entry(&self, key: CatalogKey) -> impl Future<Output = StoreResult<CatalogEntry>> + Send {
        self.write(move |tx| Box::pin(async move { catalog::delete(tx, &key).await }))
    }

    /// Admits service calls made outside any run (a client's execute request): `admit` decides
    /// with a `Cx` at `now`; the calls and linked runs it admitted are written atomically. A
    /// concurrent admission of the same route and key is a `Conflict`.
    fn admit_service_calls<T, F>(&self, now: Millis, admit: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: FnOnce(&mut Cx) -> T + Send + 'static,
    {
        let env = self.env().clone();
        self.write(move |tx| Box::pin(async move { persist::admit_direct(tx, now, &env, admit).await }))
    }

    /// Cancels an open service call (its waiting callers get their cancelled rows; with
    /// `propagate` its linked instance is cancelled too), atomically; `service_call_terminal`
    /// if it already ended.
    fn cancel_service_call(
        &self,
        service_call_id: &str,
        reason: Option<String>,
        now: Millis,
        propagate: bool,
    ) -> impl Future<Output = StoreResult<ServiceCallRecord>> + Send {
        let (id, env) = (service_call_id.to_string(), self.env().clone());
        self.write(move |tx| Box::pin(async move { persist::cancel_service_call(tx, &id, reason, now, propagate, &env).await }))
    }

    /// A Nexus service call by id.
    fn service_call(&self, service_call_id: &str) -> impl Future<Output = StoreResult<Option<ServiceCallRecord>>> + Send {
        let id = service_call_id.to_string();
        self.read(move |tx| Box::pin(async move { service_calls::find(tx, &id).await }))
    }

    /// The call admitted under a route and idempotency key, if any.
    fn service_call_by_key(
        &self,
        route: RouteKey,
        idempotency_key: &str,
    ) -> impl Future<Output = StoreResult<Option<ServiceCallRecord>>> + Send {
        let key = idempotency_key.to_string();
        self.read(move |tx| Box::pin(async move { service_calls::find_by_key(tx, &route, &key).await }))
    }

    /// The calls a caller instance made (one run of it, or all), oldest first, at most `limit`.
    fn service_calls_of_caller(
        &self,
        caller_namespace: &str,
        workflow_id: &str,
        run_id: Option<&str>,
        limit: usize,
    ) -> impl Future<Output = StoreResult<Vec<ServiceCallRecord>>> + Send {
        let (namespace, workflow_id, run_id) = (caller_namespace.to_string(), workflow_id.to_string(), run_id.map(str::to_string));
        self.read(move |tx| Box::pin(async move { service_calls::of_caller(tx, &namespace, &workflow_id, run_id.as_deref(), limit).await }))
    }
}

impl<B: Backend> CatalogStore for B {}
