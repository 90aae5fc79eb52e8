//! `GET /auth/credential-events`: the audit trail of the credentials managed over the API —
//! every committed change, newest first, with who made it. Never a secret or a digest. Only an
//! admin bound to no namespace may read it, as only one may make the changes.

use super::audit::limit_param;
use crate::auth::Role;
use crate::error::{ApiError, ApiResult};
use crate::page_token;
use crate::{render, Shared};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use capstan_engine::{principal, Reason};
use capstan_store::{CredentialEvent, Store, CREDENTIAL_EVENTS_PAGE_MAX};
use serde_json::{json, Value};
use std::collections::HashMap;

const PAGE_DEFAULT: usize = 50;
const PARAMS: &[&str] = &["principal", "limit", "page_token"];

pub async fn list<S: Store>(
    State(state): State<Shared<S>>,
    headers: HeaderMap,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    state.config.auth.require(&headers, &[Role::Admin])?;
    if let Some(unknown) = params.keys().find(|key| !PARAMS.contains(&key.as_str())) {
        return Err(ApiError::validation(unknown, format!("Unknown query parameter {unknown:?}.")));
    }
    let limit = limit_param(&params, PAGE_DEFAULT, CREDENTIAL_EVENTS_PAGE_MAX)?;
    let principal = params.get("principal").map(String::as_str).filter(|p| !p.is_empty());
    let before = match params.get("page_token").map(String::as_str) {
        None | Some("") => None,
        Some(token) => Some(cursor_of(token, principal)?),
    };
    let mut events = state.store.credential_events(principal, before, limit + 1).await?;
    let next_page_token = match events.len() > limit {
        true => {
            events.truncate(limit);
            events.last().map(|last| token_of(principal, last.sequence))
        }
        false => None,
    };
    Ok(Json(json!({
        "events": events.iter().map(event_json).collect::<Vec<_>>(),
        "next_page_token": next_page_token,
    })))
}

fn event_json(event: &CredentialEvent) -> Value {
    json!({
        "sequence": event.sequence,
        "principal": event.principal,
        "action": event.action,
        "secret_id": event.secret_id,
        "roles": event.roles,
        "namespaces": event.namespaces,
        "by": principal::recorded(event.by.as_ref()),
        "recorded_at": render::time(event.recorded_at),
    })
}

/// A page token: base64url JSON of the last event's sequence, bound to the filter it was issued
/// for.
fn token_of(principal: Option<&str>, sequence: i64) -> String {
    let doc = json!({"v": 1, "principal": principal, "sequence": sequence});
    page_token::issue(&doc)
}

fn cursor_of(token: &str, principal: Option<&str>) -> ApiResult<i64> {
    let invalid = || {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            Reason::InvalidPageToken,
            "The page_token is not one this list issued.",
        )
    };
    let doc = page_token::read(token).ok_or_else(invalid)?;
    if doc["v"] != 1 || doc["principal"].as_str() != principal {
        return Err(invalid());
    }
    doc["sequence"].as_i64().ok_or_else(invalid)
}
