//! The recovery ledger's API: action definitions, ledger entries, and operator resolution.
//! Reading needs the operator role; defining and resolving need admin (when auth is on).

use crate::auth::Role;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::Fields;
use crate::{render, Shared};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::ledger::{self, ActionDeclaration};
use capstan_engine::*;
use capstan_store::{LedgerFilter, Store};
use serde_json::{json, Value};
use std::collections::HashMap;

/// Fields an action definition may carry besides `recovery_mode`.
const DEFINITION_FIELDS: &[&str] = &[
    "recovery_mode",
    "verification",
    "pending",
    "poll_interval_seconds",
    "pins",
    "preview",
    "idempotency_key",
    "probe",
];
const LEDGER_PAGE_DEFAULT: usize = 100;
const LEDGER_PAGE_MAX: usize = 1000;

pub fn definition_json(definition: &ActionDefinition) -> Value {
    let mut body = json!({
        "namespace": definition.namespace,
        "activity_type": definition.activity_type,
        "version": definition.version,
        "definition_hash": definition.definition_hash,
        "updated_at": render::time(definition.updated_at),
    });
    let fields = body.as_object_mut().expect("an object");
    for (key, value) in &definition.document {
        fields.insert(key.clone(), value.clone());
    }
    body
}

pub fn entry_json(entry: &LedgerEntry) -> Value {
    json!({
        "ledger_key": entry.ledger_key,
        "namespace": entry.namespace,
        "workflow_id": entry.workflow_id,
        "run_id": entry.run_id,
        "activity_type": entry.activity_type,
        "activity_execution_id": entry.activity_execution_id,
        "activity_attempt_id": entry.activity_attempt_id,
        "attempt_number": entry.attempt_number,
        "fence": entry.fence,
        "state": entry.state.as_str(),
        "recovery_mode": entry.recovery_mode.as_str(),
        "definition_hash": entry.definition_hash,
        "definition_version": entry.definition_version,
        "input_hash": entry.input_hash,
        "access_context_hash": entry.access_context_hash,
        "idempotency_key_hash": entry.idempotency_key_hash,
        "preview_hash": entry.preview_hash,
        "probe": entry.probe,
        "dispatched_at": render::time(entry.dispatched_at),
        "updated_at": render::time(entry.updated_at),
        "unknown_reason": entry.unknown_reason,
        "resolution": entry.resolution,
        "late_reports": entry.late_reports,
        "checkpoint_hash": entry.checkpoint_hash,
    })
}

/// The namespace's definitions keyed by activity type, for pinning at scheduling.
pub async fn put_definition<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    Path(activity_type): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    state.config.auth.require_in(&headers, &[Role::Admin], &namespace)?;
    if activity_type.is_empty() || activity_type.len() > 255 {
        return Err(ApiError::validation(
            "activity_type",
            "The activity type must be 1 to 255 characters.",
        ));
    }
    if let Some(unknown) = body.keys().find(|k| !DEFINITION_FIELDS.contains(&k.as_str())) {
        return Err(ApiError::validation(
            unknown,
            format!("{unknown} is not an action definition field."),
        ));
    }
    let f = Fields::new(&body);
    let mode_text = f.req_str("recovery_mode", 32)?;
    let recovery_mode = RecoveryMode::parse(&mode_text).ok_or_else(|| {
        ApiError::validation(
            "recovery_mode",
            "recovery_mode must be non_atomic, atomic, snapshot_restore, irreversible or linked_run.",
        )
    })?;
    for key in ["verification", "pending", "pins"] {
        f.opt_object(key)?;
    }
    f.opt_int("poll_interval_seconds", 1, 86_400)?;
    for pointer in ["preview", "idempotency_key"] {
        if f.opt_str(pointer, 1024)?.is_some_and(|p| !p.starts_with('/')) {
            return Err(ApiError::validation(
                pointer,
                format!("{pointer} must be a JSON pointer into the decoded argument list (e.g. \"/0/{pointer}\")."),
            ));
        }
    }
    if let Some(pending) = body.get("pending") {
        let pointer_ok = pending
            .get("pointer")
            .is_none_or(|p| p.as_str().is_some_and(|p| p.is_empty() || p.starts_with('/')));
        if !pointer_ok || !pending.get("values").is_some_and(Value::is_array) {
            return Err(ApiError::validation(
                "pending",
                "pending must be {\"pointer\": a JSON pointer into the result, \"values\": [the values that mean pending]}.",
            ));
        }
    }
    if let Some(effects) = body.get("verification").and_then(|v| v.get("declared_effects")) {
        if !effects.as_array().is_some_and(|e| e.iter().all(Value::is_string)) {
            return Err(ApiError::validation(
                "verification.declared_effects",
                "declared_effects must be a list of effect kinds.",
            ));
        }
    }
    let declaration = ActionDeclaration {
        namespace: namespace.clone(),
        activity_type: activity_type.clone(),
        recovery_mode,
        document: body,
        atomic_handler: state.config.atomic_actions.0.contains_key(&activity_type),
    };
    let definition = ledger::declare_action(&*state, declaration).await?;
    tracing::info!(namespace, activity_type, version = definition.version, hash = %definition.definition_hash, "action defined");
    Ok((StatusCode::OK, Json(definition_json(&definition))).into_response())
}

pub async fn get_definition<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(activity_type): Path<String>,
) -> ApiResult<Json<Value>> {
    let definitions = state.store.action_definitions(&namespace).await?;
    let definition = definitions.iter().find(|d| d.activity_type == activity_type).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            Reason::ActionDefinitionNotFound,
            "No action is defined for that activity type.",
        )
        .with("activity_type", activity_type.clone())
    })?;
    Ok(Json(definition_json(definition)))
}

pub async fn list_definitions<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
) -> ApiResult<Json<Value>> {
    let definitions = state.store.action_definitions(&namespace).await?;
    Ok(Json(json!({
        "action_definitions": definitions.iter().map(definition_json).collect::<Vec<_>>(),
    })))
}

pub async fn list_entries<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let state_filter = match query.get("state").filter(|s| !s.is_empty()) {
        None => None,
        Some(text) => Some(LedgerState::parse(text).ok_or_else(|| {
            ApiError::validation(
                "state",
                "state must be dispatched, pending, verified, outcome_unknown, effect_confirmed or effect_absent.",
            )
        })?),
    };
    let limit = match query.get("limit") {
        None => LEDGER_PAGE_DEFAULT,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=LEDGER_PAGE_MAX).contains(n))
            .ok_or_else(|| ApiError::validation("limit", format!("limit must be 1 to {LEDGER_PAGE_MAX}.")))?,
    };
    let filter = LedgerFilter {
        state: state_filter,
        workflow_id: query.get("workflow_id").filter(|s| !s.is_empty()).cloned(),
        activity_type: query.get("activity_type").filter(|s| !s.is_empty()).cloned(),
    };
    let entries = state.store.ledger_entries(&namespace, filter, limit).await?;
    Ok(Json(json!({"entries": entries.iter().map(entry_json).collect::<Vec<_>>()})))
}

fn entry_not_found(ledger_key: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, Reason::LedgerEntryNotFound, "No such ledger entry.").with("ledger_key", ledger_key)
}

pub async fn get_entry<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(ledger_key): Path<String>,
) -> ApiResult<Json<Value>> {
    let entry = state
        .store
        .ledger_entry(&namespace, &ledger_key)
        .await?
        .ok_or_else(|| entry_not_found(&ledger_key))?;
    let checkpoints = state.store.ledger_checkpoints(&namespace, &entry.workflow_id).await?;
    let chain_ok = capstan_engine::ledger::verify_checkpoints(&checkpoints).is_ok();
    let mut body = entry_json(&entry);
    body["checkpoints"] = json!(checkpoints
        .iter()
        .filter(|c| c.ledger_key == ledger_key)
        .map(
            |c| json!({"state": c.state.as_str(), "recorded_at": render::time(c.recorded_at), "details": c.details,
                        "prev_hash": c.prev_hash, "hash": c.hash})
        )
        .collect::<Vec<_>>());
    body["chain_verified"] = json!(chain_ok);
    Ok(Json(body))
}

/// `POST /ledger/{key}/resolve`: the operator's decision on an unknown outcome.
pub async fn resolve<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    Path(ledger_key): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let caller = state.config.auth.require_in(&headers, &[Role::Admin], &namespace)?;
    let f = Fields::new(&body);
    if body.contains_key("principal") {
        // The resolver is who the credential says, never what the caller writes.
        return Err(ApiError::validation(
            "principal",
            "The resolving principal is taken from the credential; remove the principal field.",
        ));
    }
    let evidence = match body.get("evidence") {
        Some(Value::Object(evidence)) if !evidence.is_empty() => Value::Object(evidence.clone()),
        _ => {
            return Err(ApiError::validation(
                "evidence",
                "evidence must be a non-empty object (e.g. the provider's reference and a note).",
            ))
        }
    };
    let decision = match f.req_str("decision", 32)?.as_str() {
        "effect_confirmed" => LedgerDecision::EffectConfirmed {
            result: match body.get("result") {
                None | Some(Value::Null) => Payload::avro(crate::avro::null_blob()),
                Some(value) => Payload::avro(crate::avro::encode_json(value)),
            },
        },
        "effect_absent" => {
            if body.get("result").is_some_and(|r| !r.is_null()) {
                return Err(ApiError::validation("result", "Only effect_confirmed takes a result."));
            }
            LedgerDecision::EffectAbsent
        }
        _ => {
            return Err(ApiError::validation(
                "decision",
                "decision must be effect_confirmed or effect_absent.",
            ))
        }
    };
    let resolution = capstan_app::ledger::Resolution {
        namespace: namespace.clone(),
        ledger_key: ledger_key.clone(),
        decision,
        evidence,
        principal: caller.principal,
    };
    let (resolved, run) = capstan_app::ledger::resolve(&*state, resolution).await?;
    state.run_changed(&run);
    tracing::info!(namespace, ledger_key, state = resolved.state.as_str(), workflow_id = %run.workflow_id, "ledger entry resolved");
    Ok(Json(entry_json(&resolved)))
}

fn incident_json(incident: &capstan_store::IntegrityIncident) -> Value {
    json!({
        "incident_id": incident.incident_id,
        "namespace": incident.namespace,
        "workflow_id": incident.workflow_id,
        "run_id": incident.run_id,
        "state": incident.state,
        "detail": incident.detail,
        "opened_at": render::time(incident.opened_at),
        "closed_at": incident.closed_at.map(render::time),
        "note": incident.note,
    })
}

/// `GET /integrity-incidents[?state=open|closed]`.
pub async fn list_incidents<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Query(query): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let wanted = match query.get("state").map(String::as_str) {
        None | Some("") => None,
        Some(s @ ("open" | "closed")) => Some(s.to_string()),
        Some(_) => return Err(ApiError::validation("state", "state must be open or closed.")),
    };
    let incidents = state.store.integrity_incidents(&namespace, wanted).await?;
    Ok(Json(json!({"incidents": incidents.iter().map(incident_json).collect::<Vec<_>>()})))
}

/// `POST /integrity-incidents/{id}/close`: after investigating, an operator closes an incident;
/// the chain must verify again, and the run continues.
pub async fn close_incident<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    Path(incident_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    state.config.auth.require_in(&headers, &[Role::Admin], &namespace)?;
    let note = Fields::new(&body).req_str("note", 10_000)?;
    let incident = state
        .store
        .close_integrity_incident(&namespace, &incident_id, note, state.now())
        .await?;
    tracing::info!(namespace, incident_id, workflow_id = %incident.workflow_id, "integrity incident closed");
    Ok(Json(incident_json(&incident)))
}
