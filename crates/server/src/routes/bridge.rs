//! Bridge adapters (`POST /api/bridge-adapters/webhook/{adapter}`): an external event starts or
//! signals a workflow, keyed by the provider's idempotency key. A repeated delivery has no second
//! effect: the accepted outcome is recorded and answered again as `duplicate`, and the commands
//! themselves are idempotent (a start's workflow id is derived from the key unless the target
//! names one; a signal carries the key as its `request_id`), so even a repeat racing the first
//! delivery, or arriving after a crash between the effect and its record, changes nothing.

use crate::auth::Caller;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::Fields;
use crate::Shared;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::control;
use capstan_engine::{Principal, Reason};
use capstan_store::{DuplicatePolicy, StartOutcome, Store};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

const SCHEMA: &str = "durable-workflow.v2.bridge-adapter-outcome.contract";

struct Event {
    adapter: String,
    action: String,
    key: String,
    target: Map<String, Value>,
    correlation: Option<Value>,
    /// The delivering credential's: what the event causes records it.
    principal: Principal,
}

impl Event {
    /// A non-empty string field of the event's target.
    fn target_str(&self, key: &str) -> Option<String> {
        self.target
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    }

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

/// The event's input as a payload, held to the same limits as a client's.
fn input_payload(input: Option<&Value>, limits: &capstan_engine::Limits) -> ApiResult<capstan_engine::Payload> {
    let mut envelope = Map::new();
    envelope.insert("input".into(), arguments(input));
    Ok(Fields::new(&envelope).opt_payload("input", limits)?.expect("an envelope was given"))
}

pub async fn webhook<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
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
        principal: caller.principal,
    };
    if event.key.is_empty() {
        return Err(ApiError::validation("idempotency_key", "The idempotency_key must not be empty."));
    }
    if let Some(first) = state.store.bridge_delivery(&namespace, &adapter, &event.key).await? {
        return Ok(duplicate(&event, &first));
    }
    let mut doc = match event.action.as_str() {
        "start_workflow" => match start_from_event(&state, &namespace, &event, body.get("input")).await? {
            Ok(doc) => doc,
            Err(answered) => return Ok(answered),
        },
        "signal_workflow" => match signal_from_event(&state, &namespace, &event, body.get("input")).await? {
            Ok(doc) => doc,
            Err(answered) => return Ok(answered),
        },
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
            .record_bridge_delivery(&namespace, &adapter, &event.key, Value::Object(doc.clone()), state.now())
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

/// What an event's delivery did: its outcome document, or an answer given already (a refusal
/// of the event, or a duplicate start), which records nothing.
type Delivered = ApiResult<Result<Map<String, Value>, Response>>;

/// `start_workflow`: the target's workflow (its id derived from the event when it names none).
async fn start_from_event<S: Store>(state: &Shared<S>, namespace: &str, event: &Event, input: Option<&Value>) -> Delivered {
    let Some(workflow_type) = event.target_str("workflow_type") else {
        return Ok(Err(event.rejected("malformed_payload", "A start needs target.workflow_type.")));
    };
    let workflow_id = event.target_str("workflow_id").unwrap_or_else(|| {
        let digest = hex::encode(Sha256::digest(format!("{}\u{1f}{}", event.adapter, event.key).as_bytes()));
        format!("bridge-{}-{}", event.adapter, &digest[..24])
    });
    let started = match input_payload(input, &state.config.limits) {
        Ok(input) => {
            let request = control::StartRequest {
                namespace: namespace.to_string(),
                workflow_id: Some(workflow_id.clone()),
                workflow_type: workflow_type.clone(),
                task_queue: event.target_str("task_queue").unwrap_or_else(|| "default".into()),
                input,
                execution_timeout_seconds: None,
                run_timeout_seconds: None,
                business_key: event.target_str("business_key"),
                memo: Map::new(),
                search_attributes: Map::new(),
                build_id: None,
                duplicate_policy: DuplicatePolicy::Fail,
                origin_trace: None,
                principal: Some(event.principal.clone()),
                priority: None,
                fairness_key: None,
                fairness_weight: None,
            };
            control::start(&**state, request).await.map_err(ApiError::from)
        }
        Err(error) => Err(error),
    };
    match started {
        Ok(control::Started { outcome, run }) => {
            if outcome == StartOutcome::StartedNew {
                state.run_changed(&run);
            }
            let mut doc = event.outcome(true, "accepted", None);
            doc.insert("workflow_id".into(), json!(run.workflow_id));
            doc.insert("run_id".into(), json!(run.run_id));
            doc.insert("workflow_type".into(), json!(workflow_type));
            let outcome = match outcome {
                StartOutcome::StartedNew => "started_new",
                StartOutcome::ReturnedExistingActive => "returned_existing_active",
            };
            doc.insert("control_plane_outcome".into(), json!(outcome));
            Ok(Ok(doc))
        }
        // The id is taken: by an earlier delivery of this event (crashed before its
        // record) or by something else; either way nothing new starts.
        Err(error) if matches!(error.reason, Reason::InstanceAlreadyStarted | Reason::WorkflowIdReservedInNamespace) => {
            let mut doc = event.outcome(false, "duplicate", Some("duplicate_start"));
            doc.insert("workflow_id".into(), json!(workflow_id));
            doc.insert("run_id".into(), error.fields.get("run_id").cloned().unwrap_or(Value::Null));
            doc.insert("workflow_type".into(), json!(workflow_type));
            doc.insert("control_plane_outcome".into(), json!("returned_existing_active"));
            Ok(Err((StatusCode::OK, Json(Value::Object(doc))).into_response()))
        }
        Err(error) if error.status.is_client_error() => Ok(Err(event.rejected("malformed_payload", error.message))),
        Err(error) => Err(error),
    }
}

/// `signal_workflow`: the target run, keyed by the event so a redelivery signals once.
async fn signal_from_event<S: Store>(state: &Shared<S>, namespace: &str, event: &Event, input: Option<&Value>) -> Delivered {
    let (Some(workflow_id), Some(signal_name)) = (event.target_str("workflow_id"), event.target_str("signal_name")) else {
        return Ok(Err(event.rejected(
            "malformed_payload",
            "A signal needs target.workflow_id and target.signal_name.",
        )));
    };
    let signaled = match input_payload(input, &state.config.limits) {
        Ok(input) => {
            let request = control::SignalRequest {
                target: control::Target {
                    namespace: namespace.to_string(),
                    workflow_id: workflow_id.clone(),
                    run_id: event.target_str("run_id"),
                },
                signal_name,
                input,
                request_id: Some(format!("bridge:{}:{}", event.adapter, event.key)),
                trace: None,
                principal: Some(event.principal.clone()),
            };
            let render = |_: &capstan_engine::CommandReceipt, run: &capstan_engine::RunState| json!({"run_id": run.run_id});
            control::signal(&**state, request, render).await.map_err(ApiError::from)
        }
        Err(error) => Err(error),
    };
    match signaled {
        Ok(receipt) => {
            if let Some(run) = &receipt.run {
                state.run_changed(run);
            }
            let retained = receipt.retained;
            let mut doc = if retained {
                event.outcome(false, "duplicate", Some("duplicate"))
            } else {
                event.outcome(true, "accepted", None)
            };
            doc.insert("workflow_id".into(), json!(workflow_id));
            doc.insert("run_id".into(), receipt.body["run_id"].clone());
            doc.insert(
                "control_plane_outcome".into(),
                json!(if retained { "deduped_existing_command" } else { "signal_received" }),
            );
            Ok(Ok(doc))
        }
        Err(error) if error.status == StatusCode::NOT_FOUND => Ok(Err(event.rejected("unknown_target", error.message))),
        Err(error) if error.status.is_client_error() => Ok(Err(event.rejected("malformed_payload", error.message))),
        Err(error) => Err(error),
    }
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
