//! Namespaces: list, describe, create, update, delete (empty ones). These routes address a
//! namespace by path, so they skip the "`X-Namespace` must exist" check of the control plane.
//! Reading needs the operator role; changing needs admin.

use crate::auth::{Caller, Role};
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::wire::Fields;
use crate::{render, Shared};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_engine::Reason;
use capstan_store::{NamespaceRecord, Store};
use serde_json::{json, Value};

const NAME_MAX: usize = 128;
const RETENTION_DAYS_MAX: i64 = 365;

pub(super) fn namespace_json(record: &NamespaceRecord) -> Value {
    json!({
        "name": record.name,
        "description": record.description,
        "retention_days": record.retention_days,
        "status": record.status,
        "external_payload_storage": crate::payload_storage::policy_json(record.external_payload_storage.as_ref()),
        "created_at": render::time(record.created_at),
        "updated_at": render::time(record.updated_at),
    })
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= NAME_MAX && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn not_found(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        Reason::NamespaceNotFound,
        format!("Namespace {name:?} does not exist."),
    )
    .with("namespace", name)
}

/// Every namespace, or, to a credential bound to namespaces, those it may act in.
pub async fn list<S: Store>(State(state): State<Shared<S>>, Extension(caller): Extension<Caller>) -> ApiResult<Json<Value>> {
    let mut namespaces = state.store.namespaces().await?;
    if let Some(allowed) = &caller.namespaces {
        namespaces.retain(|n| allowed.contains(&n.name));
    }
    Ok(Json(
        json!({"namespaces": namespaces.iter().map(namespace_json).collect::<Vec<_>>()}),
    ))
}

pub async fn describe<S: Store>(
    State(state): State<Shared<S>>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    let name = name.to_lowercase();
    caller.require_namespace(&name)?;
    let namespaces = state.store.namespaces().await?;
    let record = namespaces.iter().find(|n| n.name == name).ok_or_else(|| not_found(&name))?;
    Ok(Json(namespace_json(record)))
}

pub async fn create<S: Store>(State(state): State<Shared<S>>, headers: HeaderMap, JsonObject(body): JsonObject) -> ApiResult<Response> {
    state.config.auth.require(&headers, &[Role::Admin])?;
    let f = Fields::new(&body);
    let name = f.req_str("name", NAME_MAX)?.to_lowercase();
    if !valid_name(&name) {
        return Err(ApiError::validation(
            "name",
            "A namespace name is 1 to 128 letters, digits, '.', '_' or '-'.",
        ));
    }
    let now = state.now();
    let record = NamespaceRecord {
        name: name.clone(),
        description: f.opt_str("description", 1000)?,
        retention_days: f.opt_int("retention_days", 1, RETENTION_DAYS_MAX)?,
        status: "active".into(),
        created_at: now,
        updated_at: now,
        external_payload_storage: None,
    };
    let created = state.store.create_namespace(record).await?;
    tracing::info!(namespace = %name, "namespace created");
    Ok((StatusCode::CREATED, Json(namespace_json(&created))).into_response())
}

pub async fn update<S: Store>(
    State(state): State<Shared<S>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    // A credential bound to the namespace may administer it, not create or delete namespaces.
    state.config.auth.require_in(&headers, &[Role::Admin], &name.to_lowercase())?;
    let f = Fields::new(&body);
    let updated = state
        .store
        .update_namespace(
            &name.to_lowercase(),
            f.opt_str("description", 1000)?,
            f.opt_int("retention_days", 1, RETENTION_DAYS_MAX)?,
            state.now(),
        )
        .await?;
    Ok(Json(namespace_json(&updated)))
}

pub async fn delete<S: Store>(State(state): State<Shared<S>>, headers: HeaderMap, Path(name): Path<String>) -> ApiResult<Json<Value>> {
    state.config.auth.require(&headers, &[Role::Admin])?;
    let deleted = state.store.delete_namespace(&name.to_lowercase()).await?;
    tracing::info!(namespace = %deleted.name, "namespace deleted");
    let mut body = namespace_json(&deleted);
    body["status"] = json!("deleted");
    body["deleted"] = json!({"namespaces": 1});
    Ok(Json(body))
}
