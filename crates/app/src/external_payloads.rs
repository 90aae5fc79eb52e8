//! External payload storage: a namespace's policy, uploads to and fetches from the runtime
//! transport (bytes in the namespace's object store, identity and integrity in the database),
//! the storage probe, and the collection of payloads nothing uses any more.
//!
//! Integrity is checked on the way in (the declared size and SHA-256 must match the body) and
//! on the way out (the stored bytes must match the recorded reference): a missing or altered
//! object is an error, never a wrong value.

use crate::{AppResult, Services};
use capstan_engine::{Millis, Reason, Refusal};
use capstan_payloads::{BlobError, BlobStore};
use capstan_store::prelude::*;
use capstan_store::{ExternalPayloadRecord, ExternalStoragePolicy, NamespaceRecord};
use sha2::{Digest, Sha256};
use std::path::PathBuf;

pub use capstan_payloads::Bytes;

/// The codec every stored payload has (the SDKs' public payload codec).
pub const PAYLOAD_CODEC: &str = "avro";

/// How the server runs the transport.
#[derive(Clone, Debug)]
pub struct PayloadSettings {
    /// Where a `local` policy without `config.uri` keeps objects (a directory per namespace below).
    pub default_root: PathBuf,
    /// The largest payload the transport takes.
    pub max_bytes: u64,
    /// The inline threshold of a policy that sets none.
    pub default_threshold_bytes: u64,
    /// What SDKs are told to allow an upload or fetch.
    pub request_timeout_seconds: u64,
    /// How long an uploaded payload that nothing uses yet is kept (an SDK uploads, then sends the
    /// request naming it).
    pub unused_grace_ms: Millis,
    /// Where `default_root` was before a backup was restored into it: locations in history
    /// written then still resolve (`capstan restore` records them; docs/backup.md).
    pub former_roots: Vec<PathBuf>,
}

impl Default for PayloadSettings {
    fn default() -> Self {
        Self {
            default_root: PathBuf::from("capstan-payloads"),
            max_bytes: 64 << 20,
            default_threshold_bytes: 256 << 10,
            request_timeout_seconds: 60,
            unused_grace_ms: 3_600_000,
            former_roots: Vec::new(),
        }
    }
}

/// Whether a namespace's payloads can go to external storage now.
#[derive(Clone, Debug)]
pub enum StorageState {
    NotConfigured,
    Disabled(ExternalStoragePolicy),
    /// A policy this server cannot serve (a driver it lacks, an unusable setting).
    Unusable(ExternalStoragePolicy, String),
    Available(ExternalStoragePolicy, BlobStore),
}

impl StorageState {
    /// The store, or why there is none (`external_payload_unavailable`).
    pub fn store(&self) -> Result<&BlobStore, Refusal> {
        match self {
            StorageState::Available(_, store) => Ok(store),
            StorageState::NotConfigured => Err(unavailable("The namespace has no external payload storage.")),
            StorageState::Disabled(_) => Err(unavailable("The namespace's external payload storage is disabled.")),
            StorageState::Unusable(_, why) => Err(unavailable(why.clone())),
        }
    }

    /// The inline threshold SDKs are told (the policy's, else the server's default).
    pub fn threshold_bytes(&self, settings: &PayloadSettings) -> u64 {
        match self {
            StorageState::Available(policy, _) => policy
                .threshold_bytes
                .map_or(settings.default_threshold_bytes, |t| t as u64)
                .min(settings.max_bytes),
            _ => settings.default_threshold_bytes,
        }
    }
}

fn unavailable(message: impl Into<String>) -> Refusal {
    Refusal::new(Reason::ExternalPayloadUnavailable, message)
}

fn mismatch(message: impl Into<String>, reference_id: Option<&str>) -> Refusal {
    let refusal = Refusal::new(Reason::ExternalPayloadIntegrityMismatch, message);
    match reference_id {
        Some(id) => refusal.with("reference_id", id),
        None => refusal,
    }
}

fn blob_refusal(error: BlobError) -> Refusal {
    match error {
        BlobError::Unsupported(message) => Refusal::new(Reason::StorageDriverUnavailable, message),
        BlobError::Foreign(message) => unavailable(format!("{message} (was the namespace's storage policy changed?)")),
        BlobError::Unavailable(message) => unavailable(format!("The object store failed: {message}")),
    }
}

/// The state of a namespace's storage, from its record. `local` objects go below
/// `default_root/{namespace}` unless the policy names a directory.
pub fn storage_state(record: &NamespaceRecord, settings: &PayloadSettings) -> StorageState {
    let Some(policy) = record.external_payload_storage.clone() else {
        return StorageState::NotConfigured;
    };
    if !policy.enabled {
        return StorageState::Disabled(policy);
    }
    let root = settings.default_root.join(&record.name);
    let in_default_root = policy.config.get("uri").and_then(|v| v.as_str()).is_none_or(str::is_empty);
    match BlobStore::from_policy(&policy.driver, &policy.config, &root) {
        Ok(store) if in_default_root => {
            let former = settings.former_roots.iter().map(|r| r.join(&record.name));
            StorageState::Available(policy, store.also_holding(former))
        }
        Ok(store) => StorageState::Available(policy, store),
        Err(error) => StorageState::Unusable(policy, error.to_string()),
    }
}

/// The namespace's record (`namespace_not_found`).
pub async fn namespace<S: Services>(services: &S, name: &str) -> AppResult<NamespaceRecord> {
    let namespaces = services.store().namespaces().await?;
    namespaces.into_iter().find(|n| n.name == name).ok_or_else(|| {
        Refusal::new(Reason::NamespaceNotFound, format!("Namespace [{name}] not found."))
            .with("namespace", name)
            .into()
    })
}

/// What an upload declares in its headers.
#[derive(Clone, Debug)]
pub struct UploadDeclaration {
    pub codec: String,
    pub size_bytes: u64,
    pub sha256: String,
}

/// The payload a stored upload stands for: `{codec, external_payload: {schema, reference_id,
/// codec, size_bytes, sha256}}`, as the SDKs write it.
pub fn reference_payload(record: &ExternalPayloadRecord) -> capstan_engine::Payload {
    capstan_engine::Payload::external(
        record.codec.clone(),
        capstan_engine::PayloadReference::Runtime(reference_json(record)),
    )
}

/// The reference object itself (what an upload answers with).
pub fn reference_json(record: &ExternalPayloadRecord) -> serde_json::Value {
    serde_json::json!({
        "schema": capstan_engine::payload::RUNTIME_REFERENCE_SCHEMA,
        "reference_id": record.reference_id,
        "codec": record.codec,
        "size_bytes": record.size_bytes,
        "sha256": record.sha256,
    })
}

/// An upload above the transport's limit.
pub fn oversized(max_bytes: u64) -> Refusal {
    Refusal::new(Reason::ExternalPayloadOversized, format!("The payload exceeds {max_bytes} bytes.")).with("limit_bytes", max_bytes)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Stores an uploaded payload and records its reference.
pub async fn upload<S: Services>(
    services: &S,
    settings: &PayloadSettings,
    store: &BlobStore,
    namespace: &str,
    declared: UploadDeclaration,
    bytes: Bytes,
) -> AppResult<ExternalPayloadRecord> {
    if declared.codec != PAYLOAD_CODEC {
        return Err(Refusal::new(
            Reason::ExternalPayloadUnsupported,
            format!("Payload codec {:?} is not supported; use \"avro\".", declared.codec),
        )
        .into());
    }
    if bytes.len() as u64 > settings.max_bytes {
        return Err(oversized(settings.max_bytes).into());
    }
    if declared.size_bytes != bytes.len() as u64 {
        return Err(mismatch(
            format!("The body has {} bytes; its size header says {}.", bytes.len(), declared.size_bytes),
            None,
        )
        .into());
    }
    let sha256 = sha256_hex(&bytes);
    if sha256 != declared.sha256 {
        return Err(mismatch("The body's SHA-256 differs from its header.", None).into());
    }
    let reference_id = format!("ep_{}", services.new_id());
    let location = store
        .put(&format!("runtime/{namespace}/{reference_id}"), bytes.clone())
        .await
        .map_err(blob_refusal)?;
    let record = ExternalPayloadRecord {
        reference_id,
        namespace: namespace.to_string(),
        codec: declared.codec,
        size_bytes: bytes.len() as i64,
        sha256,
        location,
        created_at: services.now(),
    };
    services.store().record_external_payload(record.clone()).await?;
    Ok(record)
}

/// What a fetch expects (the SDK sends its reference's codec, size and SHA-256).
#[derive(Clone, Debug, Default)]
pub struct FetchExpectation {
    pub codec: Option<String>,
    pub size_bytes: Option<u64>,
    pub sha256: Option<String>,
}

/// A payload's bytes, verified against its recorded reference and the caller's expectation.
pub async fn fetch<S: Services>(
    services: &S,
    store: &BlobStore,
    namespace: &str,
    reference_id: &str,
    expected: &FetchExpectation,
) -> AppResult<(ExternalPayloadRecord, Bytes)> {
    let not_found = |message: &str| Refusal::new(Reason::ExternalPayloadNotFound, message.to_string()).with("reference_id", reference_id);
    let record = services
        .store()
        .external_payload(namespace, reference_id)
        .await?
        .ok_or_else(|| not_found("No payload of this reference id in the namespace."))?;
    let differs = expected.codec.as_ref().is_some_and(|c| *c != record.codec)
        || expected.size_bytes.is_some_and(|s| s as i64 != record.size_bytes)
        || expected.sha256.as_ref().is_some_and(|h| *h != record.sha256);
    if differs {
        return Err(mismatch(
            "The expected codec, size or SHA-256 differs from the stored reference.",
            Some(reference_id),
        )
        .into());
    }
    let bytes = store
        .get(&record.location)
        .await
        .map_err(blob_refusal)?
        .ok_or_else(|| not_found("The payload's bytes are gone from the object store."))?;
    if bytes.len() as i64 != record.size_bytes || sha256_hex(&bytes) != record.sha256 {
        return Err(mismatch("The stored bytes no longer match their reference.", Some(reference_id)).into());
    }
    Ok((record, bytes))
}

/// One round trip of the storage probe.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeResult {
    pub bytes: u64,
    pub sha256: String,
    pub location: String,
}

/// Writes, reads back, checks and deletes a payload of `size` bytes.
pub async fn probe(store: &BlobStore, kind: &str, size: u64) -> AppResult<ProbeResult> {
    let fill = if kind == "small" { b's' } else { b'l' };
    let bytes = Bytes::from(vec![fill; size as usize]);
    let sha256 = sha256_hex(&bytes);
    let location = store
        .put(&format!("storage-test/{kind}/{sha256}"), bytes.clone())
        .await
        .map_err(blob_refusal)?;
    let read = store.get(&location).await.map_err(blob_refusal)?;
    store.delete(&location).await.map_err(blob_refusal)?;
    if read.as_ref() != Some(&bytes) {
        return Err(mismatch(format!("The {kind} probe read back different bytes."), None).into());
    }
    Ok(ProbeResult {
        bytes: size,
        sha256,
        location,
    })
}

/// What one collection pass did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Collected {
    pub deleted: u64,
    /// Unused payloads left for a later pass: their namespace's store is not usable now.
    pub deferred: u64,
}

/// Deletes payloads that no stored instance has used for the grace period: the row first (only
/// if still unused), then the object. `store_of` gives a namespace's usable store.
pub async fn collect_unused<S: Services>(
    services: &S,
    settings: &PayloadSettings,
    store_of: impl Fn(&str) -> Option<BlobStore>,
    batch: i64,
) -> AppResult<Collected> {
    let before = services.now() - settings.unused_grace_ms;
    let mut collected = Collected::default();
    for record in services.store().unused_external_payloads(before, batch).await? {
        let Some(store) = store_of(&record.namespace).filter(|s| s.holds(&record.location)) else {
            collected.deferred += 1;
            continue;
        };
        if services
            .store()
            .forget_unused_external_payload(&record.namespace, &record.reference_id)
            .await?
        {
            if let Err(error) = store.delete(&record.location).await {
                tracing::warn!(location = %record.location, %error, "an unused external payload's object was not deleted");
            }
            collected.deleted += 1;
        }
    }
    Ok(collected)
}
