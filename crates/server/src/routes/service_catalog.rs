//! The Nexus service catalog of a namespace, as DW's admin routes shape it: endpoints
//! (`/service-endpoints`), their services (`…/{endpoint}/services`) and the services' operations
//! (`…/services/{service}/operations`), each with list, create, describe, update and delete.
//! Names are `[A-Za-z0-9._-]`, case-insensitive (stored lower-cased). Reading needs the operator
//! role, changing needs admin.

use crate::auth::Role;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::{refuse_unknown_fields, Fields};
use crate::{render, Shared};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::catalog;
use capstan_store::{CatalogEntry, CatalogKey, Store};
use serde_json::{json, Map, Value};

const NAME_MAX: usize = 128;
const DESCRIPTION_MAX: usize = 1000;
const REFERENCE_MAX: usize = 512;
/// DW's operation modes (its binding kinds: `capstan_app::service_calls::BINDING_KINDS`).
const OPERATION_MODES: [&str; 2] = ["sync", "async"];
use capstan_app::service_calls::BINDING_KINDS;
const POLICIES: [&str; 5] = [
    "deadline_policy",
    "idempotency_policy",
    "cancellation_policy",
    "retry_policy",
    "boundary_policy",
];
/// Fields every entry's document may hold.
const COMMON_FIELDS: [&str; 2] = ["description", "metadata"];
const OPERATION_FIELDS: [&str; 9] = [
    "operation_mode",
    "handler_binding_kind",
    "handler_target_reference",
    "handler_binding",
    "deadline_policy",
    "idempotency_policy",
    "cancellation_policy",
    "retry_policy",
    "boundary_policy",
];

/// The name field of each level.
fn name_field(key: &CatalogKey) -> &'static str {
    match (&key.service, &key.operation) {
        (None, _) => "endpoint_name",
        (Some(_), None) => "service_name",
        (Some(_), Some(_)) => "operation_name",
    }
}

fn own_name(key: &CatalogKey) -> &str {
    key.operation.as_deref().or(key.service.as_deref()).unwrap_or(&key.endpoint)
}

fn checked_name(field: &str, name: &str) -> ApiResult<String> {
    let valid =
        !name.is_empty() && name.len() <= NAME_MAX && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if valid {
        Ok(name.to_lowercase())
    } else {
        Err(ApiError::validation(field, "A name is 1 to 128 letters, digits, '.', '_' or '-'."))
    }
}

/// The key the path names (`segments`: endpoint[, service[, operation]]).
fn key_of(namespace: &str, segments: &[String]) -> ApiResult<CatalogKey> {
    let fields = ["endpoint_name", "service_name", "operation_name"];
    let names = segments
        .iter()
        .zip(fields)
        .map(|(segment, field)| checked_name(field, segment))
        .collect::<ApiResult<Vec<_>>>()?;
    Ok(CatalogKey {
        namespace: namespace.to_string(),
        endpoint: names[0].clone(),
        service: names.get(1).cloned(),
        operation: names.get(2).cloned(),
    })
}

fn render_entry(entry: &CatalogEntry, parent_id: Option<&str>) -> Value {
    let key = &entry.key;
    let mut body = json!({
        "id": entry.id,
        "namespace": key.namespace,
        "endpoint_name": key.endpoint,
        "description": entry.doc.get("description").cloned().unwrap_or(Value::Null),
        "metadata": entry.doc.get("metadata").cloned().unwrap_or_else(|| json!({})),
        "created_at": render::time(entry.created_at),
        "updated_at": render::time(entry.updated_at),
    });
    match (&key.service, &key.operation) {
        (None, _) => {}
        (Some(service), None) => {
            body["service_name"] = json!(service);
            body["endpoint_id"] = json!(parent_id);
        }
        (Some(service), Some(operation)) => {
            body["service_name"] = json!(service);
            body["operation_name"] = json!(operation);
            body["service_id"] = json!(parent_id);
            for field in OPERATION_FIELDS {
                body[field] = entry.doc.get(field).cloned().unwrap_or(Value::Null);
            }
        }
    }
    body
}

/// The document fields of a create or update body, checked (an update keeps what it omits).
fn document(body: &Map<String, Value>, key: &CatalogKey, base: Map<String, Value>) -> ApiResult<Map<String, Value>> {
    let operation = key.operation.is_some();
    let fields: &[&str] = if operation { &OPERATION_FIELDS } else { &[] };
    refuse_unknown_fields(body, &[&COMMON_FIELDS, fields, &[name_field(key)]], "", "service catalog entry")?;
    let f = Fields::new(body);
    let mut doc = base;
    if let Some(description) = f.opt_str("description", DESCRIPTION_MAX)? {
        doc.insert("description".into(), json!(description));
    }
    if let Some(metadata) = f.opt_object("metadata")? {
        doc.insert("metadata".into(), Value::Object(metadata.clone()));
    }
    if !operation {
        return Ok(doc);
    }
    if let Some(mode) = f.opt_str("operation_mode", 16)? {
        let mode = mode.to_lowercase();
        if !OPERATION_MODES.contains(&mode.as_str()) {
            return Err(ApiError::validation("operation_mode", "The operation mode is sync or async."));
        }
        doc.insert("operation_mode".into(), json!(mode));
    }
    if let Some(kind) = f.opt_str("handler_binding_kind", 32)? {
        if !BINDING_KINDS.contains(&kind.as_str()) {
            return Err(ApiError::validation(
                "handler_binding_kind",
                format!("The handler binding kind is one of {}.", BINDING_KINDS.join(", ")),
            ));
        }
        doc.insert("handler_binding_kind".into(), json!(kind));
    }
    if let Some(reference) = f.opt_str("handler_target_reference", REFERENCE_MAX)? {
        doc.insert("handler_target_reference".into(), json!(reference));
    }
    for field in std::iter::once("handler_binding").chain(POLICIES) {
        if let Some(object) = f.opt_object(field)? {
            doc.insert(field.into(), Value::Object(object.clone()));
        }
    }
    for required in ["operation_mode", "handler_binding_kind"] {
        if !doc.contains_key(required) {
            return Err(ApiError::validation(required, format!("An operation needs {required}.")));
        }
    }
    let has_reference = doc
        .get("handler_target_reference")
        .and_then(Value::as_str)
        .is_some_and(|r| !r.is_empty());
    let has_binding = doc.get("handler_binding").and_then(Value::as_object).is_some_and(|b| !b.is_empty());
    if !has_reference && !has_binding {
        return Err(ApiError::validation(
            "handler_target_reference",
            "An operation needs a handler_target_reference or a non-empty handler_binding.",
        ));
    }
    Ok(doc)
}

async fn parent_id<S: Store>(state: &Shared<S>, key: &CatalogKey) -> ApiResult<Option<String>> {
    match key.parent() {
        None => Ok(None),
        Some(parent) => Ok(state.store.catalog_entry(parent).await?.map(|p| p.id)),
    }
}

/// `GET /service-endpoints[/{e}/services[/{s}/operations]]`.
async fn list_below<S: Store>(state: Shared<S>, headers: HeaderMap, namespace: String, segments: Vec<String>) -> ApiResult<Json<Value>> {
    state.config.auth.require(&headers, &[Role::Operator, Role::Admin])?;
    let parent = if segments.is_empty() {
        None
    } else {
        let key = key_of(&namespace, &segments)?;
        let entry = state.store.catalog_entry(key.clone()).await?;
        Some(entry.ok_or_else(|| ApiError::from(key.missing()))?)
    };
    let entries = state
        .store
        .catalog_children(&namespace, parent.as_ref().map(|p| p.key.clone()))
        .await?;
    let parent_id = parent.as_ref().map(|p| p.id.as_str());
    let rendered: Vec<Value> = entries.iter().map(|e| render_entry(e, parent_id)).collect();
    let list_key = match segments.len() {
        0 => "service_endpoints",
        1 => "services",
        _ => "operations",
    };
    Ok(Json(json!({"namespace": namespace, list_key: rendered})))
}

async fn create_below<S: Store>(
    state: Shared<S>,
    headers: HeaderMap,
    namespace: String,
    segments: Vec<String>,
    body: Map<String, Value>,
) -> ApiResult<Response> {
    state.config.auth.require(&headers, &[Role::Admin])?;
    let field = ["endpoint_name", "service_name", "operation_name"][segments.len()];
    let name = Fields::new(&body).req_str(field, NAME_MAX)?;
    let mut path = segments;
    path.push(name);
    let key = key_of(&namespace, &path)?;
    let doc = document(&body, &key, Map::new())?;
    let created = catalog::create_entry(&*state, key, doc).await?;
    tracing::info!(namespace = %created.key.namespace, entry = %own_name(&created.key), kind = field, "service catalog entry created");
    let parent = parent_id(&state, &created.key).await?;
    Ok((StatusCode::CREATED, Json(render_entry(&created, parent.as_deref()))).into_response())
}

async fn describe_at<S: Store>(state: Shared<S>, headers: HeaderMap, namespace: String, segments: Vec<String>) -> ApiResult<Json<Value>> {
    state.config.auth.require(&headers, &[Role::Operator, Role::Admin])?;
    let key = key_of(&namespace, &segments)?;
    let entry = state
        .store
        .catalog_entry(key.clone())
        .await?
        .ok_or_else(|| ApiError::from(key.missing()))?;
    let parent = parent_id(&state, &key).await?;
    Ok(Json(render_entry(&entry, parent.as_deref())))
}

async fn update_at<S: Store>(
    state: Shared<S>,
    headers: HeaderMap,
    namespace: String,
    segments: Vec<String>,
    body: Map<String, Value>,
) -> ApiResult<Json<Value>> {
    state.config.auth.require(&headers, &[Role::Admin])?;
    let key = key_of(&namespace, &segments)?;
    let field = name_field(&key);
    if let Some(name) = Fields::new(&body).opt_str(field, NAME_MAX)? {
        if name.to_lowercase() != own_name(&key) {
            return Err(ApiError::validation(field, "A catalog entry is not renamed; create another."));
        }
    }
    let existing = state
        .store
        .catalog_entry(key.clone())
        .await?
        .ok_or_else(|| ApiError::from(key.missing()))?;
    let doc = document(&body, &key, existing.doc)?;
    let updated = catalog::update_entry(&*state, key.clone(), doc).await?;
    let parent = parent_id(&state, &key).await?;
    Ok(Json(render_entry(&updated, parent.as_deref())))
}

async fn delete_at<S: Store>(state: Shared<S>, headers: HeaderMap, namespace: String, segments: Vec<String>) -> ApiResult<Json<Value>> {
    state.config.auth.require(&headers, &[Role::Admin])?;
    let key = key_of(&namespace, &segments)?;
    let deleted = catalog::delete_entry(&*state, key.clone()).await?;
    tracing::info!(namespace = %namespace, entry = %own_name(&key), "service catalog entry deleted");
    let mut body = json!({"namespace": namespace, "endpoint_name": key.endpoint, "outcome": "deleted", "id": deleted.id});
    if let Some(service) = &key.service {
        body["service_name"] = json!(service);
    }
    if let Some(operation) = &key.operation {
        body["operation_name"] = json!(operation);
    }
    Ok(Json(body))
}

// Thin route adapters: the path's segments name the level.

pub async fn list_endpoints<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    list_below(state, headers, namespace, vec![]).await
}

pub async fn create_endpoint<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    create_below(state, headers, namespace, vec![], body).await
}

pub async fn list_children<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(segments): Path<Vec<String>>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    list_below(state, headers, namespace, segments).await
}

pub async fn create_child<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(segments): Path<Vec<String>>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    create_below(state, headers, namespace, segments, body).await
}

pub async fn describe<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(segments): Path<Vec<String>>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    describe_at(state, headers, namespace, segments).await
}

pub async fn update<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(segments): Path<Vec<String>>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    update_at(state, headers, namespace, segments, body).await
}

pub async fn delete<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(segments): Path<Vec<String>>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    delete_at(state, headers, namespace, segments).await
}
