//! Workflow output streams through the control plane, under
//! `/workflows/{id}/runs/{run}/streams`: list, describe, read (a long poll), append, close.

use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wait;
use crate::wire::streams::{parse_items, stream_name};
use crate::wire::{self, Fields};
use crate::{render, Shared};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_engine::workflow_stream::{DEFAULT_READ_ITEMS, MAX_READ_ITEMS, MAX_WAIT_SECONDS};
use capstan_engine::Reason;
use capstan_store::Store;
use capstan_store::{StoredStreamItem, StreamState, StreamTarget};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

/// The wake-up key of a stream's readers.
pub(crate) fn wake_key(run_id: &str, stream_name: &str) -> String {
    format!("{run_id}/{stream_name}")
}

fn describe(stream: &StreamState) -> Value {
    json!({
        "stream_name": stream.stream_name,
        "status": stream.status,
        "last_offset": stream.last_offset,
        "total_items": stream.total_items,
        "pending_items": stream.pending_items,
        "opened_at": render::time(stream.opened_at),
        "last_appended_at": render::opt_time(stream.last_appended_at),
        "closed_at": render::opt_time(stream.closed_at),
        "error_reason": stream.error_reason,
        "retention_seconds": stream.retention_seconds,
        "terminal": stream.is_terminal(),
    })
}

fn item(stored: &StoredStreamItem) -> Value {
    let body = &stored.item;
    json!({
        "offset": stored.offset,
        "idempotency_key": stored.idempotency_key,
        "origin": body["origin"],
        "origin_reference": body["origin_reference"],
        "item_type": body["item_type"],
        "content_type": body["content_type"],
        "payload": body["payload"],
        "payload_reference": body["payload_reference"],
        "payload_codec": body["payload_codec"],
        "emitted_at": body["emitted_at"].as_i64().map(render::time).unwrap_or(Value::Null),
    })
}

fn target(namespace: String, workflow_id: &str, run_id: &str, name: &str) -> ApiResult<StreamTarget> {
    Ok(StreamTarget {
        namespace,
        workflow_id: workflow_id.to_string(),
        run_id: run_id.to_string(),
        stream_name: stream_name(name)?,
    })
}

pub async fn list<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let streams = state.store.list_streams(&namespace, &workflow_id, &run_id).await?;
    Ok(Json(json!({
        "workflow_id": workflow_id,
        "workflow_run_id": run_id,
        "streams": streams.iter().map(describe).collect::<Vec<_>>(),
    })))
}

pub async fn get<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id, name)): Path<(String, String, String)>,
) -> ApiResult<Json<Value>> {
    let target = target(namespace, &workflow_id, &run_id, &name)?;
    let (stream, _) = state.store.read_stream(target, 0, 0).await?;
    Ok(Json(
        json!({"workflow_id": workflow_id, "workflow_run_id": run_id, "stream": describe(&stream)}),
    ))
}

fn query_int(query: &HashMap<String, String>, key: &str, range: std::ops::RangeInclusive<u64>, default: u64) -> ApiResult<u64> {
    match query.get(key) {
        None => Ok(default),
        Some(raw) => raw
            .parse::<u64>()
            .ok()
            .filter(|n| range.contains(n))
            .ok_or_else(|| ApiError::validation(key, format!("{key} must be an integer from {} to {}.", range.start(), range.end()))),
    }
}

/// `GET …/items?from=&max_items=&wait_seconds=`: items from `from`; with `wait_seconds`, waits
/// for the first one while the stream is open.
pub async fn items<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id, name)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let from = query_int(&query, "from", 0..=i64::MAX as u64, 0)?;
    let max = query_int(&query, "max_items", 1..=MAX_READ_ITEMS, DEFAULT_READ_ITEMS)?;
    let wait = query_int(&query, "wait_seconds", 0..=MAX_WAIT_SECONDS, 0)?;
    let target = target(namespace, &workflow_id, &run_id, &name)?;
    let until = wait::Until::Elapsed(tokio::time::Instant::now() + Duration::from_secs(wait));
    let appended = state.stream_appends.channel(&wake_key(&target.run_id, &target.stream_name));
    let looked = wait::settle(
        || state.now(),
        until,
        wait::STREAM_RECHECK,
        Some(&appended),
        || async {
            let (stream, items) = state.store.read_stream(target.clone(), from, max).await?;
            Ok(if !items.is_empty() || stream.is_terminal() {
                wait::Look::Settled((stream, items))
            } else {
                wait::Look::Pending((stream, items))
            })
        },
    )
    .await?;
    let (mut stream, items) = looked.unwrap_or_else(|pending| pending);
    let next_offset = items.last().map_or(from, |i| i.offset + 1);
    let at_head = next_offset as i64 > stream.last_offset;
    if at_head && stream.pending_items > 0 {
        capstan_app::workflow_streams::caught_up(&*state, target, next_offset).await?;
        stream.pending_items = 0;
    }
    Ok(Json(json!({
        "workflow_id": workflow_id,
        "workflow_run_id": run_id,
        "stream": describe(&stream),
        "items": items.iter().map(item).collect::<Vec<_>>(),
        "next_offset": next_offset,
        "terminal": stream.is_terminal() && at_head,
    })))
}

/// `POST …/items {items, max_pending_items?}`: items before the pending cap are kept even when
/// the cap answers 429 `stream_full`.
pub async fn append<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id, name)): Path<(String, String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    wire::refuse_unknown_fields(&body, &[&["items", "max_pending_items"]], "", "stream appends")?;
    let items = parse_items(body.get("items"), "", &state.config.limits)?;
    let max_pending = Fields::new(&body).opt_int("max_pending_items", 1, i64::MAX)?.map(|n| n as u64);
    let target = target(namespace, &workflow_id, &run_id, &name)?;
    let key = wake_key(&target.run_id, &target.stream_name);
    let done = capstan_app::workflow_streams::append(&*state, target, items, max_pending).await;
    // A cap refusal still committed the items before it.
    state.stream_appends.wake(&key);
    let done = done?;
    let body = json!({
        "workflow_id": workflow_id,
        "workflow_run_id": run_id,
        "stream": describe(&done.stream),
        "accepted_offsets": done.accepted_offsets,
        "accepted": done.accepted,
        "deduped": done.deduped,
    });
    if let Some((pending, cap)) = done.full {
        let mut error = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            Reason::StreamFull,
            "The stream holds as many unread items as it may; the items before the cap were kept.",
        )
        .with("pending_items", pending)
        .with("max_pending_items", cap);
        if let Value::Object(fields) = body {
            error.fields.extend(fields);
        }
        return Err(error);
    }
    Ok((StatusCode::OK, Json(body)).into_response())
}

/// `POST …/close {error_reason?, retention_seconds?}`.
pub async fn close<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((workflow_id, run_id, name)): Path<(String, String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    wire::refuse_unknown_fields(&body, &[&["error_reason", "retention_seconds"]], "", "stream closes")?;
    let f = Fields::new(&body);
    let error_reason = f.opt_str("error_reason", 191)?.filter(|r| !r.is_empty());
    let retention = f.opt_int("retention_seconds", 1, i64::MAX)?;
    let target = target(namespace, &workflow_id, &run_id, &name)?;
    let key = wake_key(&target.run_id, &target.stream_name);
    let stream = capstan_app::workflow_streams::close(&*state, target, error_reason, retention).await?;
    state.stream_appends.wake(&key);
    Ok(Json(
        json!({"workflow_id": workflow_id, "workflow_run_id": run_id, "stream": describe(&stream)}),
    ))
}
