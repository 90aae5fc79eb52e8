//! Health, readiness and the cluster-info document the SDKs validate.

use crate::auth::Role;
use crate::error::ApiResult;
use crate::planes::server_capabilities;
use crate::{render, Shared, CONTROL_PLANE_VERSION, WORKER_PROTOCOL_VERSION};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use capstan_engine::Reason;
use capstan_store::Store;
use serde_json::{json, Value};

pub async fn health<S: Store>(State(state): State<Shared<S>>) -> Response {
    let database = state.store.ping().await;
    let body = json!({
        "status": if database.is_ok() { "serving" } else { "degraded" },
        "timestamp": render::time(state.now()),
        "checks": {"database": if database.is_ok() { "ok" } else { "unavailable" }},
    });
    let status = if database.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

pub async fn ready<S: Store>(State(state): State<Shared<S>>) -> Response {
    let database = state.store.ping().await;
    let body = json!({
        "status": if database.is_ok() { "ready" } else { "not_ready" },
        "timestamp": render::time(state.now()),
        "checks": {"database": if database.is_ok() { "ok" } else { "unavailable" }},
    });
    let status = if database.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(body)).into_response()
}

/// `GET /auth/whoami`: who the presented credential acts as — its principal, roles and the
/// namespaces it is bound to (`null`: every one). Secrets are never echoed.
pub async fn whoami<S: Store>(State(state): State<Shared<S>>, headers: HeaderMap) -> ApiResult<Json<Value>> {
    let caller = state
        .config
        .auth
        .require_role(&headers, &[Role::Worker, Role::Operator, Role::Admin])?;
    let authentication = match state.config.auth {
        crate::AuthConfig::None => "none",
        crate::AuthConfig::Token { .. } => "token",
    };
    Ok(Json(json!({
        "principal": caller.principal.to_json(),
        "roles": caller.roles.iter().map(|role| role.as_str()).collect::<Vec<_>>(),
        "namespaces": caller.namespaces,
        "authentication": authentication,
    })))
}

pub async fn cluster_info<S: Store>(State(state): State<Shared<S>>, headers: HeaderMap) -> ApiResult<Json<Value>> {
    state
        .config
        .auth
        .require_role(&headers, &[Role::Worker, Role::Operator, Role::Admin])?;
    let namespace = headers
        .get("x-namespace")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".into());
    let limits = &state.config.limits;
    // A namespace that does not exist (yet) simply has no storage.
    let storage = match state.payload_storage(&namespace).await {
        Ok(storage) => storage,
        Err(error) if error.reason == Reason::NamespaceNotFound => capstan_app::external_payloads::StorageState::NotConfigured,
        Err(error) => return Err(error),
    };
    let external_payload_storage = crate::payload_storage::discovery_json(&storage, &state.config.payloads);
    let mut capabilities = server_capabilities();
    capabilities["runtime_external_payload_transport"] = json!(!external_payload_storage.is_null());
    Ok(Json(json!({
        "server_id": state.config.server_id,
        "server": "capstan",
        "version": env!("CARGO_PKG_VERSION"),
        "default_namespace": "default",
        "namespace": {"name": namespace, "external_payload_storage": external_payload_storage},
        "supported_sdk_versions": {"python": ">=2.0", "rust": ">=4.0"},
        "capabilities": {
            "workflow_tasks": true, "activity_tasks": true, "signals": true, "queries": true, "updates": true,
            "schedules": false, "search_attributes": true, "history_export": true, "continue_as_new": true,
            "child_workflows": true, "activity_timeouts": true, "activity_retry_policy": true,
            "payload_codecs": ["avro"], "response_compression": ["gzip", "deflate"],
        },
        "limits": {
            "max_payload_bytes": limits.payload_bytes_max,
            "max_history_events": limits.history_events_max,
            "max_commands_per_completion": limits.commands_per_completion_max,
            "max_pending_activities": limits.pending_activities_max,
            "max_pending_timers": limits.pending_timers_max,
            "max_request_body_bytes": crate::body::BODY_BYTES_MAX,
        },
        "control_plane": {
            "version": CONTROL_PLANE_VERSION,
            "header": "X-Durable-Workflow-Control-Plane-Version",
            "request_contract": {
                "schema": "durable-workflow.v2.control-plane-request.contract",
                "version": 1,
                "operations": {
                    "start": {"fields": {"duplicate_policy": {"canonical_values": ["fail", "use-existing"]}}},
                    "list": {"fields": {"status": {"canonical_values": ["running", "completed", "failed"]}}},
                    "update": {"fields": {"wait_for": {"canonical_values": ["accepted", "completed"]}}},
                },
            },
        },
        "worker_protocol": {
            "version": WORKER_PROTOCOL_VERSION,
            "server_capabilities": capabilities,
        },
        "embedded_v2_import_contract": super::imports::contract_manifest(),
        "diagnostics": {"configuration_warnings": state.config.diagnostics},
        "auth_composition_contract": {
            "schema": "durable-workflow.v2.auth-composition.contract",
            "version": 1,
            "precedence": {
                "connection_values": ["flag", "environment", "selected_profile", "default"],
                "profile_selection": ["flag_env", "DW_ENV", "current_profile", "default_profile"],
            },
            "canonical_environment": {
                "server_url": "DURABLE_WORKFLOW_SERVER_URL",
                "namespace": "DURABLE_WORKFLOW_NAMESPACE",
                "auth_token": "DURABLE_WORKFLOW_AUTH_TOKEN",
                "tls_verify": "DURABLE_WORKFLOW_TLS_VERIFY",
                "profile": "DW_ENV",
            },
            "auth_material": {
                "token": {"status": "supported", "effective_config_value": "redacted"},
                // DW's SDKs require `reserved` here (client-side mTLS material is DW's to
                // define); what Capstan serves is said beside it.
                "mtls": {"status": "reserved", "capstan_server": {"supported": true, "server_option": "--tls-client-ca", "principal_type": "auth:mtls"}},
                "signed_headers": {"status": "reserved"},
            },
            "effective_config": {"required_fields": ["server_url", "namespace", "profile", "auth", "tls", "identity"]},
            "redaction": {"never_echo": ["bearer_tokens", "private_keys", "raw_authorization_headers"]},
        },
    })))
}

/// `GET /metrics`: Prometheus text (`docs/metrics.md`). The database's figures are read at each
/// scrape, so every node of a cluster reports the same ones.
pub async fn metrics<S: Store>(State(state): State<Shared<S>>, headers: HeaderMap) -> ApiResult<Response> {
    // A credential bound to namespaces sees only their series.
    let caller = state.config.auth.require_role(&headers, &[Role::Operator, Role::Admin])?;
    let text = crate::metrics::render(&state, caller.namespaces.as_ref()).await?;
    Ok((
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response())
}
