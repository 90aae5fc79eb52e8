//! Workflow output streams on the wire: a `record_side_effect.workflow_stream` directive, and
//! the items a client appends (the same item shape both ways).

use super::fields::{refuse_unknown_fields, Fields};
use crate::error::{ApiError, ApiResult};
use axum::http::StatusCode;
use capstan_engine::workflow_stream::*;
use capstan_engine::{Limits, Reason};
use serde_json::{Map, Value};

const ITEM_FIELDS: &[&str] = &[
    "payload",
    "payload_codec",
    "payload_reference",
    "item_type",
    "content_type",
    "idempotency_key",
];
const DIRECTIVE_FIELDS: &[&str] = &[
    "operation",
    "stream_name",
    "command_identity",
    "command_ordinal",
    "items",
    "max_pending_items",
    "error_reason",
    "retention_seconds",
];

/// A stream name from a path or a directive: `invalid_stream_name` (400) otherwise.
pub fn stream_name(name: &str) -> ApiResult<String> {
    if valid_stream_name(name) {
        return Ok(name.to_string());
    }
    Err(ApiError::new(
        StatusCode::BAD_REQUEST,
        Reason::InvalidStreamName,
        "A stream name starts with a letter or digit and has at most 191 of [A-Za-z0-9._:-].",
    )
    .with("stream_name", name))
}

/// `items`: 1 to 500 items, each a payload and/or a payload reference.
pub fn parse_items(list: Option<&Value>, at: &str, limits: &Limits) -> ApiResult<Vec<StreamItemInput>> {
    let field = format!("{at}items");
    let Some(Value::Array(entries)) = list else {
        return Err(ApiError::validation(&field, "The items field must be a list of items."));
    };
    if entries.is_empty() || entries.len() > MAX_APPEND_ITEMS {
        return Err(ApiError::validation(&field, format!("Between 1 and {MAX_APPEND_ITEMS} items.")));
    }
    let mut items = Vec::with_capacity(entries.len());
    for (index, entry) in entries.iter().enumerate() {
        let prefix = format!("{field}.{index}.");
        let Some(map) = entry.as_object() else {
            return Err(ApiError::validation(&format!("{field}.{index}"), "Each item must be an object."));
        };
        refuse_unknown_fields(map, &[ITEM_FIELDS], &prefix, "stream items")?;
        let f = Fields::nested(map, prefix.clone());
        if let Some(codec) = f.opt_str("payload_codec", 64)?.filter(|c| c != "avro") {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                Reason::UnsupportedPayloadCodec,
                format!("Stream item codec {codec:?} is not supported; use \"avro\"."),
            )
            .with("field", format!("{prefix}payload_codec")));
        }
        let item = StreamItemInput {
            payload: f.opt_payload("payload", limits)?,
            payload_reference: f.opt_str("payload_reference", 2048)?,
            item_type: f.opt_str("item_type", 191)?,
            content_type: f.opt_str("content_type", 191)?,
            idempotency_key: f.opt_str("idempotency_key", 255)?,
        };
        if item.payload.is_none() && item.payload_reference.is_none() {
            return Err(ApiError::validation(
                &format!("{prefix}payload"),
                "An item needs a payload or a payload_reference.",
            ));
        }
        items.push(item);
    }
    Ok(items)
}

/// A positive count field (`max_pending_items`, `retention_seconds`).
fn positive(f: &Fields, key: &str) -> ApiResult<Option<i64>> {
    f.opt_int(key, 1, i64::MAX)
}

/// `record_side_effect.workflow_stream` of command `index`.
pub fn parse_directive(map: &Map<String, Value>, index: usize, limits: &Limits) -> ApiResult<Option<StreamDirective>> {
    let Some(Value::Object(directive)) = map.get("workflow_stream") else {
        return match map.get("workflow_stream") {
            None | Some(Value::Null) => Ok(None),
            Some(_) => Err(ApiError::validation(
                &format!("commands.{index}.workflow_stream"),
                "Must be an object.",
            )),
        };
    };
    let at = format!("commands.{index}.workflow_stream.");
    refuse_unknown_fields(directive, &[DIRECTIVE_FIELDS], &at, "workflow stream directives")?;
    let f = Fields::nested(directive, at.clone());
    let name = f.req_str("stream_name", 191)?;
    let operation = match f.req_str("operation", 16)?.as_str() {
        "append" => StreamOperation::Append {
            items: parse_items(directive.get("items"), &at, limits)?,
            max_pending_items: positive(&f, "max_pending_items")?.map(|n| n as u64),
        },
        "close" => StreamOperation::Finish {
            error_reason: None,
            retention_seconds: positive(&f, "retention_seconds")?,
        },
        "error" => StreamOperation::Finish {
            error_reason: Some(f.req_str("error_reason", 191)?),
            retention_seconds: positive(&f, "retention_seconds")?,
        },
        other => {
            return Err(ApiError::validation(
                &format!("{at}operation"),
                format!("Unknown stream operation {other:?} (append, close or error)."),
            ))
        }
    };
    Ok(Some(StreamDirective {
        stream_name: stream_name(&name).map_err(|e| e.with("field", format!("{at}stream_name")))?,
        command_identity: f.req_str("command_identity", 191)?,
        command_ordinal: f.req_int("command_ordinal", 0, i64::MAX)? as u64,
        operation,
    }))
}
