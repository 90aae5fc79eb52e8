//! Nexus on the wire: the `start_service_operation` command, field by field
//! (`docs/sdk-notes/nexus.md` §1.1). The Python SDK sends the request as a bare blob beside
//! `payload_codec`, the Rust SDK as a `{codec, blob}` envelope, with `namespace` and
//! `idempotency_key` null when unset: null is absent.

use super::fields::Fields;
use crate::error::{ApiError, ApiResult};
use capstan_engine::service_call::{CallMode, ServiceOperation, WaitFor};
use capstan_engine::{Limits, Payload, StepTags};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The command's own fields besides `type` (step tags come on top): the catalog names, the
/// request payload, the target `namespace`, and what both forms share.
pub const SERVICE_OPERATION_FIELDS: &[&str] = &[
    "endpoint_name",
    "service_name",
    "operation_name",
    "request_payload",
    "namespace",
    "observability_context",
];

/// The body of `POST …/operations/{o}/execute` besides what both forms share (the names are
/// the path's; `arguments` is the request payload, the namespace the request's).
pub const EXECUTE_FIELDS: &[&str] = &["arguments", "caller_workflow_instance_id", "caller_workflow_run_id"];

/// The fields the command and the execute body share.
pub const SHARED_CALL_FIELDS: &[&str] = &[
    "payload_codec",
    "metadata",
    "caller_namespace",
    "idempotency_key",
    "mode_override",
    "wait_for",
    "wait_timeout_seconds",
    "target_workflow_instance_id",
    "target_workflow_run_id",
    "connection",
    "queue",
    "business_key",
    "duplicate_start_policy",
    "labels",
    "memo",
    "search_attributes",
];

const OPTION_FIELDS: &[&str] = &[
    "target_workflow_instance_id",
    "target_workflow_run_id",
    "connection",
    "queue",
    "business_key",
    "duplicate_start_policy",
];
const OBJECT_FIELDS: &[&str] = &["labels", "memo", "search_attributes"];

/// DW's catalog name pattern: letters, digits, `.`, `_`, `-`.
fn catalog_name(f: &Fields, key: &str) -> ApiResult<String> {
    let name = f.req_str(key, 255)?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
        return Err(ApiError::validation(
            &f.name(key),
            format!("The {key} must be letters, digits, '.', '_' or '-'."),
        ));
    }
    Ok(name)
}

/// `start_service_operation` at `commands.{index}`.
pub fn parse_service_operation(
    map: &Map<String, Value>,
    f: &Fields,
    index: usize,
    limits: &Limits,
    tags: StepTags,
) -> ApiResult<ServiceOperation> {
    let at = |key: &str| format!("commands.{index}.{key}");
    parse_call(map, f, "request_payload", &at, limits, tags)
}

/// An execute request's body, with the path's names put in as `endpoint_name`,
/// `service_name` and `operation_name`; `arguments` is its request payload.
pub fn parse_execute(map: &Map<String, Value>, limits: &Limits) -> ApiResult<ServiceOperation> {
    let f = Fields::new(map);
    parse_call(map, &f, "arguments", &|key: &str| key.to_string(), limits, StepTags::new())
}

/// The fields both forms share; `payload_field` holds the request payload.
fn parse_call(
    map: &Map<String, Value>,
    f: &Fields,
    payload_field: &str,
    at: &dyn Fn(&str) -> String,
    limits: &Limits,
    tags: StepTags,
) -> ApiResult<ServiceOperation> {
    let payload_codec = f.opt_str("payload_codec", 64)?.filter(|c| !c.is_empty());
    let required = || ApiError::validation(&at(payload_field), format!("The {payload_field} field is required."));
    let request_payload = map.get(payload_field).filter(|v| !v.is_null()).cloned().ok_or_else(required)?;
    let input = match (&request_payload, &payload_codec) {
        // A bare blob is in the codec the command names (Avro blobs are checked as such).
        (Value::String(blob), Some(codec)) if codec != capstan_engine::payload::AVRO_CODEC => Payload::inline(codec.clone(), blob.clone()),
        _ => f.opt_payload(payload_field, limits)?.ok_or_else(required)?,
    };
    let mode = match f.opt_str("mode_override", 16)? {
        None => None,
        Some(text) => {
            Some(CallMode::parse(&text).ok_or_else(|| ApiError::validation(&at("mode_override"), "The mode_override is sync or async."))?)
        }
    };
    let wait_for = match f.opt_str("wait_for", 16)? {
        None => None,
        Some(text) => {
            Some(WaitFor::parse(&text).ok_or_else(|| ApiError::validation(&at("wait_for"), "The wait_for is accepted or completed."))?)
        }
    };
    let mut options = BTreeMap::new();
    for key in OPTION_FIELDS {
        if let Some(value) = f.opt_str(key, 255)? {
            if value.is_empty() {
                return Err(ApiError::validation(&at(key), format!("The {key} must not be empty.")));
            }
            options.insert(key.to_string(), value);
        }
    }
    if let Some(policy) = options.get("duplicate_start_policy") {
        if !matches!(policy.as_str(), "reject_duplicate" | "return_existing_active") {
            return Err(ApiError::validation(
                &at("duplicate_start_policy"),
                "The duplicate_start_policy is reject_duplicate or return_existing_active.",
            ));
        }
    }
    let mut objects = BTreeMap::new();
    for key in OBJECT_FIELDS {
        if let Some(value) = f.opt_object(key)? {
            objects.insert(key.to_string(), value.clone());
        }
    }
    let non_empty = |key: &str| -> ApiResult<Option<String>> {
        match f.opt_str(key, 255)? {
            Some(value) if value.trim().is_empty() => Err(ApiError::validation(&at(key), format!("The {key} must not be empty."))),
            other => Ok(other),
        }
    };
    Ok(ServiceOperation {
        endpoint_name: catalog_name(f, "endpoint_name")?,
        service_name: catalog_name(f, "service_name")?,
        operation_name: catalog_name(f, "operation_name")?,
        request_payload,
        input,
        payload_codec,
        metadata: f.opt_object("metadata")?.cloned().unwrap_or_default(),
        target_namespace: non_empty("namespace")?,
        caller_namespace: non_empty("caller_namespace")?,
        idempotency_key: non_empty("idempotency_key")?,
        mode,
        wait_for,
        wait_timeout_seconds: f.opt_int("wait_timeout_seconds", 0, 86_400)?,
        options,
        objects,
        tags,
        observability_context: f.opt_trace("observability_context")?,
    })
}
