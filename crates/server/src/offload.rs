//! Payloads above a namespace's threshold never sit inline in history, whoever sends them. The
//! SDKs offload such payloads themselves once the transport is advertised; a client that does
//! not (an older SDK, a script) has them offloaded here, before its request is parsed: each
//! inline `{codec: "avro", blob}` envelope (and the bare blob of `record_side_effect.result`)
//! larger than the threshold is stored through the runtime transport's use case and replaced by
//! its `{codec, external_payload}` reference, exactly as an SDK would have sent it.
//!
//! Only bodies longer than the threshold are read here, so ordinary requests pay nothing. Memos
//! and search attributes stay inline (the server reads them), and so does a blob that is not a
//! DW Avro frame (the request's own checks refuse it by name).

use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::{AppState, Shared};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::CONTENT_LENGTH;
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use capstan_app::external_payloads::{self as payloads, Bytes, StorageState, UploadDeclaration};
use capstan_payloads::BlobStore;
use capstan_store::Store;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Mutex;

/// How long a namespace's threshold is trusted before it is read again.
const THRESHOLD_TTL_MS: i64 = 2_000;
/// Keys whose values the server reads itself.
const KEPT_INLINE: [&str; 3] = ["memo", "search_attributes", "visibility_labels"];

/// Where a namespace's large payloads go: its threshold and object store.
type Target = Option<(u64, BlobStore)>;

/// Per namespace: the offload target (none: no usable storage) and when it was read.
#[derive(Default)]
pub struct Thresholds(Mutex<HashMap<String, (Target, i64)>>);

impl<S: Store> AppState<S> {
    async fn offload_target(&self, namespace: &str) -> ApiResult<Target> {
        let now = self.now();
        if let Some((target, read_at)) = self.offload_thresholds.0.lock().expect("thresholds").get(namespace) {
            if now - read_at < THRESHOLD_TTL_MS {
                return Ok(target.clone());
            }
        }
        let storage = self.payload_storage(namespace).await?;
        let target = match &storage {
            StorageState::Available(_, store) => Some((storage.threshold_bytes(&self.config.payloads), store.clone())),
            _ => None,
        };
        self.offload_thresholds
            .0
            .lock()
            .expect("thresholds")
            .insert(namespace.to_string(), (target.clone(), now));
        Ok(target)
    }
}

/// The middleware (inside a plane's, which resolved the namespace).
pub async fn offload_large_payloads<S: Store>(State(state): State<Shared<S>>, request: Request, next: Next) -> Response {
    match offload(&state, request).await {
        Ok(request) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}

async fn offload<S: Store>(state: &AppState<S>, request: Request) -> ApiResult<Request> {
    // Reads and deletes carry no payloads.
    if matches!(*request.method(), Method::GET | Method::HEAD | Method::DELETE) {
        return Ok(request);
    }
    let Some(Namespace(namespace)) = request.extensions().get::<Namespace>().cloned() else {
        return Ok(request);
    };
    let declared_length = request
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // Nothing to read for a body that cannot hold a payload above any threshold (1 byte at least).
    if declared_length.is_some_and(|length| length < 2) {
        return Ok(request);
    }
    let Some((threshold, store)) = state.offload_target(&namespace).await? else {
        return Ok(request);
    };
    if declared_length.is_some_and(|length| length <= threshold) {
        return Ok(request);
    }
    let (mut parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, crate::body::BODY_BYTES_MAX)
        .await
        .map_err(|_| crate::body::too_large())?;
    let rebuilt = |bytes: Bytes, parts: axum::http::request::Parts| Request::from_parts(parts, Body::from(bytes));
    let Ok(mut document) = serde_json::from_slice::<Value>(&bytes) else {
        // Not JSON: the handler's extractor says so.
        return Ok(rebuilt(bytes, parts));
    };
    let mut offloader = Offloader {
        state,
        store: &store,
        namespace: &namespace,
        threshold,
        uploaded: HashMap::new(),
    };
    if !offloader.walk(&mut document).await? {
        return Ok(rebuilt(bytes, parts));
    }
    let body = Bytes::from(serde_json::to_vec(&document).expect("a JSON value serializes"));
    parts.headers.insert(CONTENT_LENGTH, body.len().into());
    Ok(rebuilt(body, parts))
}

struct Offloader<'a, S: Store> {
    state: &'a AppState<S>,
    store: &'a BlobStore,
    namespace: &'a str,
    threshold: u64,
    /// Blob → its reference: one upload per distinct payload of the request.
    uploaded: HashMap<String, Value>,
}

impl<S: Store> Offloader<'_, S> {
    /// Replaces every large inline payload under `value`; whether anything changed.
    fn walk<'b>(&'b mut self, value: &'b mut Value) -> std::pin::Pin<Box<dyn std::future::Future<Output = ApiResult<bool>> + Send + 'b>>
    where
        S: Sync,
    {
        Box::pin(async move {
            match value {
                Value::Array(items) => {
                    let mut changed = false;
                    for item in items {
                        changed |= self.walk(item).await?;
                    }
                    Ok(changed)
                }
                Value::Object(map) => {
                    if let Some(reference) = self.offload_envelope(map).await? {
                        *value = reference;
                        return Ok(true);
                    }
                    let mut changed = self.offload_side_effect_result(map).await?;
                    for (key, item) in map.iter_mut() {
                        if !KEPT_INLINE.contains(&key.as_str()) {
                            changed |= self.walk(item).await?;
                        }
                    }
                    Ok(changed)
                }
                _ => Ok(false),
            }
        })
    }

    /// `{codec: "avro", blob}` above the threshold → its reference envelope.
    async fn offload_envelope(&mut self, map: &Map<String, Value>) -> ApiResult<Option<Value>> {
        if map.len() != 2 || map.get("codec").and_then(Value::as_str) != Some(payloads::PAYLOAD_CODEC) {
            return Ok(None);
        }
        match map.get("blob").and_then(Value::as_str) {
            Some(blob) if self.is_large(blob) => Ok(Some(self.reference(blob).await?)),
            _ => Ok(None),
        }
    }

    /// A `record_side_effect` command's bare blob `result` (DW's slot shape) → its reference.
    async fn offload_side_effect_result(&mut self, map: &mut Map<String, Value>) -> ApiResult<bool> {
        if map.get("type").and_then(Value::as_str) != Some("record_side_effect") {
            return Ok(false);
        }
        let codec = map.get("payload_codec").and_then(Value::as_str).unwrap_or(payloads::PAYLOAD_CODEC);
        match map.get("result").and_then(Value::as_str) {
            Some(blob) if codec == payloads::PAYLOAD_CODEC && self.is_large(blob) => {
                let blob = blob.to_string();
                let reference = self.reference(&blob).await?;
                map.insert("result".into(), reference);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    fn is_large(&self, blob: &str) -> bool {
        blob.len() as u64 > self.threshold && crate::avro::is_value_frame(blob)
    }

    async fn reference(&mut self, blob: &str) -> ApiResult<Value> {
        if let Some(reference) = self.uploaded.get(blob) {
            return Ok(reference.clone());
        }
        let bytes = Bytes::from(blob.as_bytes().to_vec());
        let declared = UploadDeclaration {
            codec: payloads::PAYLOAD_CODEC.into(),
            size_bytes: bytes.len() as u64,
            sha256: payloads::sha256_hex(&bytes),
        };
        let record = payloads::upload(self.state, &self.state.config.payloads, self.store, self.namespace, declared, bytes)
            .await
            .map_err(ApiError::from)?;
        let reference = payloads::reference_payload(&record).envelope();
        self.uploaded.insert(blob.to_string(), reference.clone());
        Ok(reference)
    }
}
