//! Search-attribute definitions (`/api/search-attributes`): the typed custom attributes of a
//! namespace. Starts, upserts and schedules may only set defined attributes, with values of
//! their type; list filters are type-checked against them (`capstan_engine::visibility`).

use crate::auth::Role;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::Fields;
use crate::Shared;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_engine::visibility::{invalid_attribute_name, system_attribute, AttributeType, SYSTEM_ATTRIBUTES};
use capstan_engine::Reason;
use capstan_store::Store;
use serde_json::{json, Map, Value};

pub async fn list<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
) -> ApiResult<Json<Value>> {
    let custom = state.store.search_attribute_definitions(&namespace).await?;
    Ok(Json(json!({
        "namespace": namespace,
        "system_attributes": SYSTEM_ATTRIBUTES.iter().map(|(n, t)| (n.to_string(), json!(t.as_str()))).collect::<Map<_, _>>(),
        "custom_attributes": custom.iter().map(|(n, t)| (n.clone(), json!(t.as_str()))).collect::<Map<_, _>>(),
    })))
}

pub async fn create<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    state.config.auth.require_in(&headers, &[Role::Operator, Role::Admin], &namespace)?;
    let f = Fields::new(&body);
    let name = f.req_str("name", 128)?;
    let kind_text = f.req_str("type", 32)?;
    let kind = AttributeType::parse(&kind_text)
        .ok_or_else(|| ApiError::validation("type", "type must be keyword, text, int, double, bool, datetime or keyword_list."))?;
    if system_attribute(&name).is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            Reason::SearchAttributeReserved,
            format!("{name} is a system search attribute."),
        )
        .with("name", name));
    }
    if let Some(problem) = invalid_attribute_name(&name) {
        return Err(ApiError::validation("name", problem));
    }
    state.store.define_search_attribute(&namespace, &name, kind, state.now()).await?;
    tracing::info!(namespace, name, kind = kind.as_str(), "search attribute defined");
    Ok((
        StatusCode::CREATED,
        Json(json!({"namespace": namespace, "name": name, "type": kind.as_str(), "outcome": "created"})),
    )
        .into_response())
}

pub async fn delete<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    if system_attribute(&name).is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            Reason::SearchAttributeReserved,
            format!("{name} is a system search attribute and cannot be deleted."),
        )
        .with("name", name));
    }
    if !state.store.delete_search_attribute(&namespace, &name).await? {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            Reason::SearchAttributeNotFound,
            format!("{name} is not a search attribute of this namespace."),
        )
        .with("name", name));
    }
    Ok(Json(json!({"namespace": namespace, "name": name, "outcome": "deleted"})))
}

/// Every key must be a defined custom attribute and every value of its type (see
/// `capstan_app::search_attributes`).
pub(crate) async fn check<S: Store>(state: &Shared<S>, namespace: &str, field: &str, attributes: &Map<String, Value>) -> ApiResult<()> {
    Ok(capstan_app::search_attributes::check_defined(&**state, namespace, field, attributes).await?)
}
