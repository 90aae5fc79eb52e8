//! External payload storage: the runtime transport (`POST /external-payloads/v1`, `GET
//! /external-payloads/v1/{referenceId}`), a namespace's policy (`PUT /namespaces/{n}/external-storage`)
//! and the storage probe (`POST /storage/test`). The use cases are in `capstan_app::external_payloads`.

use crate::auth::Role;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::payload_storage::UPLOAD_SCHEMA;
use crate::planes::Namespace;
use crate::wire::{refuse_unknown_fields, Fields};
use crate::Shared;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::external_payloads::{self as payloads, FetchExpectation, StorageState, UploadDeclaration};
use capstan_engine::Reason;
use capstan_store::{ExternalStoragePolicy, Store};
use serde_json::{json, Map, Value};

const CODEC_HEADER: &str = "x-durable-workflow-payload-codec";
const SIZE_HEADER: &str = "x-durable-workflow-payload-size";
const SHA256_HEADER: &str = "x-durable-workflow-payload-sha256";
/// Sent by SDKs only to servers that advertise a completion context (Capstan does not).
const COMPLETION_HEADER: &str = "x-durable-workflow-payload-completion";
/// DW's bounds of the storage probe.
const PROBE_SMALL_MAX: i64 = 1 << 20;
const PROBE_LARGE_MAX: i64 = 16 << 20;

fn header_text<'a>(headers: &'a HeaderMap, name: &str) -> ApiResult<Option<&'a str>> {
    headers
        .get(name)
        .map(|v| {
            v.to_str()
                .map_err(|_| ApiError::validation(name, format!("The {name} header must be text.")))
        })
        .transpose()
}

fn required_header<'a>(headers: &'a HeaderMap, name: &str) -> ApiResult<&'a str> {
    header_text(headers, name)?.ok_or_else(|| ApiError::validation(name, format!("The {name} header is required.")))
}

fn size_header(headers: &HeaderMap) -> ApiResult<Option<u64>> {
    header_text(headers, SIZE_HEADER)?
        .map(|text| {
            text.parse::<u64>()
                .map_err(|_| ApiError::validation(SIZE_HEADER, "The payload size header must be a non-negative integer."))
        })
        .transpose()
}

fn sha256_header(headers: &HeaderMap) -> ApiResult<Option<String>> {
    header_text(headers, SHA256_HEADER)?
        .map(|text| {
            let valid = text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            valid
                .then(|| text.to_string())
                .ok_or_else(|| ApiError::validation(SHA256_HEADER, "The payload SHA-256 header must be 64 lowercase hex digits."))
        })
        .transpose()
}

/// `POST /external-payloads/v1`: the body's bytes, declared by codec, size and SHA-256 headers.
pub async fn upload<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    request: Request,
) -> ApiResult<Response> {
    let headers = request.headers().clone();
    if headers.contains_key(COMPLETION_HEADER) {
        return Err(ApiError::validation(
            COMPLETION_HEADER,
            "This server advertises no payload completion context; send the upload without it.",
        ));
    }
    let declared = UploadDeclaration {
        codec: required_header(&headers, CODEC_HEADER)?.to_string(),
        size_bytes: size_header(&headers)?.ok_or_else(|| ApiError::validation(SIZE_HEADER, "The payload size header is required."))?,
        sha256: sha256_header(&headers)?.ok_or_else(|| ApiError::validation(SHA256_HEADER, "The payload SHA-256 header is required."))?,
    };
    let max = state.config.payloads.max_bytes;
    if declared.size_bytes > max {
        return Err(payloads::oversized(max).into());
    }
    let storage = state.payload_storage(&namespace).await?;
    let store = storage.store()?;
    let bytes = axum::body::to_bytes(request.into_body(), max as usize + 1)
        .await
        .map_err(|_| ApiError::from(payloads::oversized(max)))?;
    let record = payloads::upload(&*state, &state.config.payloads, store, &namespace, declared, bytes).await?;
    tracing::debug!(namespace = %namespace, reference_id = %record.reference_id, bytes = record.size_bytes, "external payload stored");
    let body = json!({"schema": UPLOAD_SCHEMA, "transport_version": 1, "reference": payloads::reference_json(&record)});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `GET /external-payloads/v1/{referenceId}`: the bytes, verified, with their reference headers.
pub async fn fetch<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(reference_id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let expected = FetchExpectation {
        codec: header_text(&headers, CODEC_HEADER)?.map(str::to_string),
        size_bytes: size_header(&headers)?,
        sha256: sha256_header(&headers)?,
    };
    let storage = state.payload_storage(&namespace).await?;
    let (record, bytes) = payloads::fetch(&*state, storage.store()?, &namespace, &reference_id, &expected).await?;
    let mut response = Response::new(Body::from(bytes));
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    for (name, value) in [
        (CODEC_HEADER, record.codec.clone()),
        (SIZE_HEADER, record.size_bytes.to_string()),
        (SHA256_HEADER, record.sha256.clone()),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    Ok(response)
}

/// `PUT /namespaces/{name}/external-storage` (admin): `{driver, enabled?, threshold_bytes?, config?}`.
pub async fn set_policy<S: Store>(
    State(state): State<Shared<S>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    state.config.auth.require_in(&headers, &[Role::Admin], &name.to_lowercase())?;
    let policy = parse_policy(&body, &state.config.payloads)?;
    let updated = state
        .store
        .set_namespace_external_storage(&name.to_lowercase(), Some(policy), state.now())
        .await?;
    if let StorageState::Unusable(_, why) = state.storage_of(&updated) {
        tracing::warn!(namespace = %updated.name, %why, "external storage policy recorded but not usable");
    }
    tracing::info!(namespace = %updated.name, "external storage policy set");
    Ok(Json(super::namespaces::namespace_json(&updated)))
}

fn parse_policy(body: &Map<String, Value>, settings: &payloads::PayloadSettings) -> ApiResult<ExternalStoragePolicy> {
    refuse_unknown_fields(
        body,
        &[&["driver", "enabled", "threshold_bytes", "config"]],
        "",
        "external storage policy",
    )?;
    let f = Fields::new(body);
    let driver = f.req_str("driver", 16)?;
    if !capstan_payloads::KNOWN_DRIVERS.contains(&driver.as_str()) {
        return Err(ApiError::validation("driver", "The driver must be one of local, s3, gcs, azure."));
    }
    let threshold_bytes = f.opt_int("threshold_bytes", 1, settings.max_bytes as i64)?;
    let mut config = Map::new();
    if let Some(given) = f.opt_object("config")? {
        if given.contains_key("auth_profile") {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                Reason::ExternalPayloadUnsupported,
                "Capstan reads S3 credentials from the AWS_* environment of the server; config.auth_profile is not supported.",
            )
            .with("field", "config.auth_profile"));
        }
        refuse_unknown_fields(given, &[&capstan_payloads::CONFIG_KEYS], "config.", "storage config")?;
        let fields = Fields::nested(given, "config.".into());
        for key in capstan_payloads::CONFIG_KEYS {
            let max = if matches!(key, "uri" | "endpoint") { 2048 } else { 1024 };
            if let Some(value) = fields.opt_str(key, max)?.filter(|v| !v.is_empty()) {
                config.insert(key.to_string(), Value::String(value));
            }
        }
    }
    Ok(ExternalStoragePolicy {
        driver,
        enabled: f.opt_bool("enabled")?.unwrap_or(true),
        threshold_bytes,
        config,
    })
}

/// `POST /storage/test` (admin): writes, reads back and deletes a small and a large payload
/// through the namespace's store.
pub async fn probe<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    state.config.auth.require_in(&headers, &[Role::Admin], &namespace)?;
    refuse_unknown_fields(
        &body,
        &[&["driver", "small_payload_bytes", "large_payload_bytes"]],
        "",
        "storage test",
    )?;
    let f = Fields::new(&body);
    let driver = f.opt_str("driver", 16)?;
    let small = f.opt_int("small_payload_bytes", 1, PROBE_SMALL_MAX)?.unwrap_or(1024);
    let large = f.opt_int("large_payload_bytes", 1, PROBE_LARGE_MAX)?.unwrap_or(1 << 20);
    let record = payloads::namespace(&*state, &namespace).await?;
    let failed = |reason: Reason, message: String, driver: Option<&str>| {
        let body = json!({"status": "failed", "reason": reason.as_str(), "message": message, "namespace": namespace, "driver": driver});
        (StatusCode::UNPROCESSABLE_ENTITY, Json(body)).into_response()
    };
    let storage = state.storage_of(&record);
    let policy = match &storage {
        StorageState::NotConfigured => {
            return Ok(failed(
                Reason::ExternalStorageNotConfigured,
                "External payload storage is not configured for this namespace.".into(),
                driver.as_deref(),
            ))
        }
        StorageState::Disabled(policy) => {
            return Ok(failed(
                Reason::ExternalStorageDisabled,
                "External payload storage is disabled for this namespace.".into(),
                Some(&policy.driver),
            ))
        }
        StorageState::Unusable(policy, _) | StorageState::Available(policy, _) if driver.as_deref().is_some_and(|d| d != policy.driver) => {
            return Ok(failed(
                Reason::StorageDriverUnavailable,
                "The requested storage driver is not the namespace's configured driver.".into(),
                driver.as_deref(),
            ));
        }
        StorageState::Unusable(policy, why) => return Ok(failed(Reason::StorageDriverUnavailable, why.clone(), Some(&policy.driver))),
        StorageState::Available(policy, _) => policy,
    };
    let store = storage.store()?;
    let small = payloads::probe(store, "small", small as u64).await?;
    let large = payloads::probe(store, "large", large as u64).await?;
    let round_trip = |result: payloads::ProbeResult| json!({"status": "passed", "bytes": result.bytes, "sha256": result.sha256, "reference_uri": result.location});
    let body = json!({
        "status": "passed",
        "namespace": namespace,
        "driver": policy.driver,
        "small_payload": round_trip(small),
        "large_payload": round_trip(large),
    });
    Ok(Json(body).into_response())
}
