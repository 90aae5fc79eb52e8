//! External payload records and namespaces' storage policies.

use crate::backend::Backend;
use crate::logic::{external_payloads, namespaces};
use crate::*;

/// External payloads uploaded to the runtime transport, and namespaces' storage policies. Uses
/// are recorded by the transactions that store state naming a reference; removing an instance
/// (retention) drops its uses.
pub trait PayloadStore: Backend {
    /// Records an uploaded payload (its bytes are already in the object store).
    fn record_external_payload(&self, record: ExternalPayloadRecord) -> impl Future<Output = StoreResult<()>> + Send {
        self.write_one(move |tx| Box::pin(async move { external_payloads::insert(tx, &record).await }))
    }

    /// A payload of the namespace by reference id.
    fn external_payload(
        &self,
        namespace: &str,
        reference_id: &str,
    ) -> impl Future<Output = StoreResult<Option<ExternalPayloadRecord>>> + Send {
        let (namespace, reference_id) = (namespace.to_string(), reference_id.to_string());
        self.read(move |tx| Box::pin(async move { external_payloads::find(tx, &namespace, &reference_id).await }))
    }

    /// Payloads created before `created_before` that no stored instance uses, oldest first.
    fn unused_external_payloads(
        &self,
        created_before: Millis,
        limit: i64,
    ) -> impl Future<Output = StoreResult<Vec<ExternalPayloadRecord>>> + Send {
        self.read(move |tx| Box::pin(async move { external_payloads::unused(tx, created_before, limit).await }))
    }

    /// Deletes a payload's row if nothing uses it still; whether it did (then its bytes may go).
    fn forget_unused_external_payload(&self, namespace: &str, reference_id: &str) -> impl Future<Output = StoreResult<bool>> + Send {
        let (namespace, reference_id) = (namespace.to_string(), reference_id.to_string());
        self.write_one(move |tx| Box::pin(async move { external_payloads::forget_unused(tx, &namespace, &reference_id).await }))
    }

    /// Sets (or, with `None`, clears) a namespace's external storage policy.
    fn set_namespace_external_storage(
        &self,
        name: &str,
        policy: Option<ExternalStoragePolicy>,
        now: Millis,
    ) -> impl Future<Output = StoreResult<NamespaceRecord>> + Send {
        let name = name.to_string();
        self.write(move |tx| Box::pin(async move { namespaces::set_external_storage(tx, &name, policy, now).await }))
    }
}

impl<B: Backend> PayloadStore for B {}
