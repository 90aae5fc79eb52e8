//! `GET /workflows/{id}/audit-events`: what requests did to an instance without writing its
//! history (queries), newest first, with who did it.

use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::{render, Shared};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use capstan_engine::{principal, Reason};
use capstan_store::{AuditEvent, Store};
use serde_json::{json, Value};
use std::collections::HashMap;

const PAGE_DEFAULT: usize = 50;
const PAGE_MAX: usize = 500;

pub async fn list<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(workflow_id): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let limit = limit_param(&params, PAGE_DEFAULT, PAGE_MAX)?;
    let before = match params.get("page_token").map(String::as_str) {
        None | Some("") => None,
        Some(token) => Some(cursor_of(token, &namespace, &workflow_id)?),
    };
    let mut events = state.store.audit_events(&namespace, &workflow_id, before, limit + 1).await?;
    let next_page_token = match events.len() > limit {
        true => {
            events.truncate(limit);
            events.last().map(|last| token_of(&namespace, last))
        }
        false => None,
    };
    Ok(Json(json!({
        "namespace": namespace,
        "workflow_id": workflow_id,
        "events": events.iter().map(event_json).collect::<Vec<_>>(),
        "next_page_token": next_page_token,
    })))
}

/// A list's `limit` query parameter: `default` when absent or empty, else 1 to `max`.
pub(crate) fn limit_param(params: &HashMap<String, String>, default: usize, max: usize) -> ApiResult<usize> {
    match params.get("limit").map(String::as_str) {
        None | Some("") => Ok(default),
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| ApiError::validation("limit", format!("limit must be an integer from 1 to {max}."))),
    }
}

fn event_json(event: &AuditEvent) -> Value {
    json!({
        "audit_id": event.audit_id,
        "action": event.action,
        "principal": principal::recorded(event.principal.as_ref()),
        "recorded_at": render::time(event.recorded_at),
        "run_id": event.run_id,
        "detail": event.detail,
    })
}

/// A page token: base64url JSON of the last event's `(recorded_at, audit_id)`, bound to the
/// instance it was issued for.
fn token_of(namespace: &str, last: &AuditEvent) -> String {
    let doc = json!({"v": 1, "namespace": namespace, "workflow_id": last.workflow_id, "recorded_at": last.recorded_at, "audit_id": last.audit_id});
    crate::page_token::issue(&doc)
}

fn cursor_of(token: &str, namespace: &str, workflow_id: &str) -> ApiResult<(i64, String)> {
    let invalid = || {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            Reason::InvalidPageToken,
            "The page_token is not one this list issued.",
        )
    };
    let doc = crate::page_token::read(token).ok_or_else(invalid)?;
    if doc["v"] != 1 || doc["namespace"] != namespace || doc["workflow_id"] != workflow_id {
        return Err(invalid());
    }
    match (doc["recorded_at"].as_i64(), doc["audit_id"].as_str()) {
        (Some(at), Some(id)) => Ok((at, id.to_string())),
        _ => Err(invalid()),
    }
}
