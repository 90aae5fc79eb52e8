//! A namespace's external payload storage as the server holds it: the object store built from
//! its policy (kept while the policy stays the same, so an S3 client's connections are reused),
//! the discovery block SDKs read from cluster info, and the clock's collection pass.

use crate::error::ApiResult;
use crate::AppState;
use capstan_app::external_payloads::{self as payloads, StorageState};
use capstan_payloads::BlobStore;
use capstan_store::{ExternalStoragePolicy, NamespaceRecord, Store};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Mutex;

/// The transport manifest's schema, and its references' (exactly as both SDKs check them).
pub const TRANSPORT_SCHEMA: &str = "durable-workflow.v2.runtime-external-payload-transport.v1";
pub const UPLOAD_SCHEMA: &str = "durable-workflow.v2.runtime-external-payload-upload.v1";
/// Unused payloads looked at per collection pass.
const COLLECT_BATCH: i64 = 500;

#[derive(Default)]
pub struct StoreCache(Mutex<HashMap<String, (ExternalStoragePolicy, BlobStore)>>);

impl<S: Store> AppState<S> {
    /// The namespace's storage now (its record read fresh: another node may have changed it).
    pub(crate) async fn payload_storage(&self, namespace: &str) -> ApiResult<StorageState> {
        let record = payloads::namespace(self, namespace).await?;
        Ok(self.storage_of(&record))
    }

    pub(crate) fn storage_of(&self, record: &NamespaceRecord) -> StorageState {
        let mut cache = self.payload_stores.0.lock().expect("payload stores");
        if let (Some(policy), Some((cached_policy, store))) = (&record.external_payload_storage, cache.get(&record.name)) {
            if policy.enabled && policy == cached_policy {
                return StorageState::Available(policy.clone(), store.clone());
            }
        }
        let state = payloads::storage_state(record, &self.config.payloads);
        match &state {
            StorageState::Available(policy, store) => {
                cache.insert(record.name.clone(), (policy.clone(), store.clone()));
            }
            _ => {
                cache.remove(&record.name);
            }
        }
        state
    }
}

/// The policy as the namespace routes render it (DW's shape).
pub fn policy_json(policy: Option<&ExternalStoragePolicy>) -> Value {
    match policy {
        None => Value::Null,
        Some(policy) => {
            let mut body = json!({"driver": policy.driver, "enabled": policy.enabled});
            if let Some(threshold) = policy.threshold_bytes {
                body["threshold_bytes"] = json!(threshold);
            }
            if !policy.config.is_empty() {
                body["config"] = Value::Object(policy.config.clone());
            }
            body
        }
    }
}

/// `namespace.external_payload_storage` of cluster info: the policy with the runtime transport's
/// manifest when the namespace's storage is usable, else `null` (SDKs then keep payloads inline
/// and send direct references unchecked).
pub fn discovery_json(storage: &StorageState, settings: &payloads::PayloadSettings) -> Value {
    let StorageState::Available(policy, _) = storage else {
        return Value::Null;
    };
    let mut body = policy_json(Some(policy));
    body["status"] = json!("available");
    body["threshold_bytes"] = json!(storage.threshold_bytes(settings));
    body["transport"] = json!({
        "schema": TRANSPORT_SCHEMA,
        "version": 1,
        "reference_schema": capstan_engine::payload::RUNTIME_REFERENCE_SCHEMA,
        "mode": "authenticated_namespace_runtime",
        "upload": {"method": "POST", "path": "/api/external-payloads/v1"},
        "fetch": {"method": "GET", "path_template": "/api/external-payloads/v1/{referenceId}"},
        "limits": {
            "max_payload_bytes": settings.max_bytes,
            "request_timeout_seconds": settings.request_timeout_seconds,
        },
    });
    // Direct references are stored verbatim and handed back; the SDK reads their bytes itself.
    body["direct_provider_adapters"] = json!({"capability_negotiated": true, "enabled": true});
    body
}

/// The clock's pass: deletes payloads nothing has used for the grace period.
pub(crate) async fn collect_unused<S: Store>(state: &AppState<S>) -> capstan_app::AppResult<payloads::Collected> {
    let namespaces = state.store.namespaces().await?;
    let stores: HashMap<String, BlobStore> = namespaces
        .iter()
        .filter_map(|record| match state.storage_of(record) {
            StorageState::Available(_, store) => Some((record.name.clone(), store)),
            _ => None,
        })
        .collect();
    payloads::collect_unused(
        state,
        &state.config.payloads,
        |namespace| stores.get(namespace).cloned(),
        COLLECT_BATCH,
    )
    .await
}
