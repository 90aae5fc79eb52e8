//! Bridge adapters (`POST /api/bridge-adapters/webhook/{adapter}`): an external event starts or
//! signals a workflow, keyed by the provider's idempotency key. A repeated delivery has no second
//! effect: the accepted outcome is recorded and answered again as `duplicate`, and the commands
//! themselves are idempotent (a start's workflow id is derived from the key unless the target
//! names one; a signal carries the key as its `request_id`), so even a repeat racing the first
//! delivery, or arriving after a crash between the effect and its record, changes nothing.

use super::Namespace;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::wire::Fields;
use crate::{now_ms, Shared};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_store::Store;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

const SCHEMA: &str = "durable-workflow.v2.bridge-adapter-outcome.contract";

struct Event {
    adapter: String,
    action: String,
    key: String,
    target: Map<String, Value>,
    correlation: Option<Value>,
}

impl Event {
    fn outcome(&self, accepted: bool, outcome: &str, reason: Option<&str>) -> Map<String, Value> {
        let mut doc = json!({
            "schema": SCHEMA, "version": 1, "adapter": self.adapter, "action": self.action,
            "accepted": accepted, "outcome": outcome, "idempotency_key": self.key, "reason": reason,
            "target": self.target, "correlation": self.correlation,
        });
        std::mem::take(doc.as_object_mut().expect("object"))
    }

    fn rejected(&self, reason: &str, message: impl Into<String>) -> Response {
        let mut doc = self.outcome(false, "rejected", Some(reason));
        doc.insert("message".into(), json!(message.into()));
        (StatusCode::UNPROCESSABLE_ENTITY, Json(Value::Object(doc))).into_response()
    }
}

/// The arguments envelope of an event's `input`: a list is the argument list, anything else the
/// single argument.
fn arguments(input: Option<&Value>) -> Value {
    let list = match input {
        None | Some(Value::Null) => json!([]),
        Some(Value::Array(items)) => Value::Array(items.clone()),
        Some(other) => json!([other]),
    };
    json!({"codec": "avro", "blob": crate::avro::encode_json(&list)})
}

async fn json_of(response: Response) -> (StatusCode, Value) {
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap_or_default();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

pub async fn webhook<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(adapter): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    if adapter.is_empty()
        || adapter.len() > 64
        || !adapter
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
    {
        return Err(ApiError::validation(
            "adapter",
            "The adapter name is 1 to 64 letters, digits, '.', '_', ':' or '-'.",
        ));
    }
    let f = Fields::new(&body);
    let event = Event {
        adapter: adapter.clone(),
        action: f.req_str("action", 64)?,
        key: f.req_str("idempotency_key", 255)?,
        target: f.opt_object("target")?.cloned().unwrap_or_default(),
        correlation: match body.get("correlation") {
            None | Some(Value::Null) => None,
            Some(Value::Object(map)) => Some(Value::Object(map.clone())),
            Some(_) => return Err(ApiError::validation("correlation", "correlation must be an object.")),
        },
    };
    if event.key.is_empty() {
        return Err(ApiError::validation("idempotency_key", "The idempotency_key must not be empty."));
    }
    if let Some(first) = state.store.bridge_delivery(&namespace, &adapter, &event.key).await? {
        return Ok(duplicate(&event, &first));
    }
    let target_str = |key: &str| {
        event
            .target
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let mut doc = match event.action.as_str() {
        "start_workflow" => {
            let Some(workflow_type) = target_str("workflow_type") else {
                return Ok(event.rejected("malformed_payload", "A start needs target.workflow_type."));
            };
            let workflow_id = target_str("workflow_id").unwrap_or_else(|| {
                let digest = hex::encode(Sha256::digest(format!("{adapter}\u{1f}{}", event.key).as_bytes()));
                format!("bridge-{adapter}-{}", &digest[..24])
            });
            let mut start = Map::new();
            start.insert("workflow_id".into(), json!(workflow_id));
            start.insert("workflow_type".into(), json!(workflow_type));
            for key in ["task_queue", "business_key"] {
                if let Some(value) = target_str(key) {
                    start.insert(key.into(), json!(value));
                }
            }
            start.insert("input".into(), arguments(body.get("input")));
            match super::control::start(State(state.clone()), Extension(Namespace(namespace.clone())), JsonObject(start)).await {
                Ok(response) => {
                    let (_, started) = json_of(response).await;
                    let mut doc = event.outcome(true, "accepted", None);
                    doc.insert("workflow_id".into(), started["workflow_id"].clone());
                    doc.insert("run_id".into(), started["run_id"].clone());
                    doc.insert("workflow_type".into(), json!(workflow_type));
                    doc.insert("control_plane_outcome".into(), started["outcome"].clone());
                    doc
                }
                // The id is taken: by an earlier delivery of this event (crashed before its
                // record) or by something else; either way nothing new starts.
                Err(error) if error.reason == "instance_already_started" || error.reason == "workflow_id_reserved_in_namespace" => {
                    let mut doc = event.outcome(false, "duplicate", Some("duplicate_start"));
                    doc.insert("workflow_id".into(), json!(workflow_id));
                    doc.insert("run_id".into(), error.fields.get("run_id").cloned().unwrap_or(Value::Null));
                    doc.insert("workflow_type".into(), json!(workflow_type));
                    doc.insert("control_plane_outcome".into(), json!("returned_existing_active"));
                    return Ok((StatusCode::OK, Json(Value::Object(doc))).into_response());
                }
                Err(error) if error.status.is_client_error() => return Ok(event.rejected("malformed_payload", error.message)),
                Err(error) => return Err(error),
            }
        }
        "signal_workflow" => {
            let (Some(workflow_id), Some(signal_name)) = (target_str("workflow_id"), target_str("signal_name")) else {
                return Ok(event.rejected("malformed_payload", "A signal needs target.workflow_id and target.signal_name."));
            };
            let mut signal = Map::new();
            signal.insert("input".into(), arguments(body.get("input")));
            signal.insert("request_id".into(), json!(format!("bridge:{adapter}:{}", event.key)));
            let run_id = target_str("run_id");
            match super::control::signal_impl(state.clone(), namespace.clone(), workflow_id.clone(), run_id, signal_name, signal).await {
                Ok(response) => {
                    let (_, receipt) = json_of(response).await;
                    let retained = receipt["retained"] == json!(true);
                    let mut doc = if retained {
                        event.outcome(false, "duplicate", Some("duplicate"))
                    } else {
                        event.outcome(true, "accepted", None)
                    };
                    doc.insert("workflow_id".into(), json!(workflow_id));
                    doc.insert("run_id".into(), receipt["run_id"].clone());
                    doc.insert(
                        "control_plane_outcome".into(),
                        json!(if retained { "deduped_existing_command" } else { "signal_received" }),
                    );
                    doc
                }
                Err(error) if error.status == StatusCode::NOT_FOUND => {
                    return Ok(event.rejected("unknown_target", error.message));
                }
                Err(error) if error.status.is_client_error() => return Ok(event.rejected("malformed_payload", error.message)),
                Err(error) => return Err(error),
            }
        }
        other => {
            return Ok(event.rejected(
                "unsupported_action",
                format!("The action {other:?} is not supported; use start_workflow or signal_workflow."),
            ))
        }
    };
    if doc["accepted"] == json!(true) {
        if let Some(first) = state
            .store
            .record_bridge_delivery(&namespace, &adapter, &event.key, Value::Object(doc.clone()), now_ms())
            .await?
        {
            return Ok(duplicate(&event, &first));
        }
        tracing::info!(namespace, adapter, action = %event.action, workflow_id = %doc["workflow_id"], "bridge event accepted");
        return Ok((StatusCode::ACCEPTED, Json(Value::Object(doc))).into_response());
    }
    doc.insert("accepted".into(), json!(false));
    Ok((StatusCode::OK, Json(Value::Object(doc))).into_response())
}

/// The answer to a repeat: the first delivery's identities, nothing new done.
fn duplicate(event: &Event, first: &Value) -> Response {
    let reason = if event.action == "start_workflow" {
        "duplicate_start"
    } else {
        "duplicate"
    };
    let mut doc = event.outcome(false, "duplicate", Some(reason));
    for key in ["workflow_id", "run_id", "workflow_type"] {
        if let Some(value) = first.get(key) {
            doc.insert(key.into(), value.clone());
        }
    }
    let control = if event.action == "start_workflow" {
        "returned_existing_active"
    } else {
        "deduped_existing_command"
    };
    doc.insert("control_plane_outcome".into(), json!(control));
    (StatusCode::OK, Json(Value::Object(doc))).into_response()
}
