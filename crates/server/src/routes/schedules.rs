//! Schedules (`/api/schedules…`): create, list, describe, update, delete, pause, resume,
//! trigger, backfill and the audit history, in DW's shapes. The decisions are the engine's
//! (`capstan_engine::schedule`); firing happens in the store, in the transaction that starts the
//! workflows. The control-plane middleware has already checked the role (operator or admin).

use crate::auth::Caller;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::Fields;
use crate::{render, Shared};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::schedules::{self, NewSchedule, ScheduleChange};
use capstan_app::AppError;
use capstan_engine::schedule::{parse_instant, OverlapPolicy, Schedule, ScheduleFields, SpecError};
use capstan_engine::{Payload, Reason};
use capstan_store::{ScheduleFilter, ScheduleFire, Store, StoreError, BACKFILL_MAX};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

const SCHEDULE_ID_MAX: usize = 128;
const NOTE_MAX: usize = 1000;
const JITTER_SECONDS_MAX: i64 = 3600;
const MEMO_BYTES_MAX: usize = 262_144;
const PAGE_SIZE_DEFAULT: usize = 50;
const PAGE_SIZE_MAX: i64 = 200;
const HISTORY_LIMIT_DEFAULT: usize = 100;
const HISTORY_LIMIT_MAX: usize = 500;

fn spec_error(error: SpecError, schedule_id: &str) -> ApiError {
    let errors = json!({ error.field.clone(): [error.message.clone()] });
    ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, error.reason, error.message)
        .with("schedule_id", schedule_id)
        .with("errors", errors.clone())
        .with("validation_errors", errors)
}

fn policy(f: &Fields, key: &str) -> ApiResult<Option<OverlapPolicy>> {
    match f.opt_str(key, 32)? {
        None => Ok(None),
        Some(text) => OverlapPolicy::parse(&text).map(Some).ok_or_else(|| {
            ApiError::validation(
                key,
                "overlap_policy must be skip, buffer_one, buffer_all, cancel_other, terminate_other or allow_all.",
            )
        }),
    }
}

/// The settable fields of a create or update body, validated.
fn fields_of(body: &Map<String, Value>, state_limits: &capstan_engine::Limits) -> ApiResult<ScheduleFields> {
    let f = Fields::new(body);
    let memo = match body.get("memo") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(Value::Object(map)) => {
            if serde_json::to_string(map).map(|s| s.len()).unwrap_or(0) > MEMO_BYTES_MAX {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    Reason::MemoTooLarge,
                    format!("The memo must be at most {MEMO_BYTES_MAX} bytes of JSON."),
                )
                .with("limit", MEMO_BYTES_MAX));
            }
            Some(Some(map.clone()))
        }
        Some(_) => return Err(ApiError::validation("memo", "The memo must be an object.")),
    };
    let search_attributes = match body.get("search_attributes") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(Value::Object(map)) => Some(Some(map.clone())),
        Some(_) => return Err(ApiError::validation("search_attributes", "search_attributes must be an object.")),
    };
    let spec = match body.get("spec") {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) if !map.is_empty() => Some(map.clone()),
        Some(_) => {
            return Err(ApiError::validation(
                "spec",
                "The spec must be an object with cron_expressions or intervals.",
            ))
        }
    };
    let (action, input_payload) = match body.get("action") {
        None | Some(Value::Null) => (None, None),
        Some(Value::Object(map)) => {
            let action_fields = Fields::nested(map, "action".into());
            action_fields.opt_str("workflow_type", 255)?;
            action_fields.opt_str("task_queue", 255)?;
            let input = action_fields.opt_payload("input", state_limits)?;
            (Some(map.clone()), input)
        }
        Some(_) => return Err(ApiError::validation("action", "The action must be an object.")),
    };
    Ok(ScheduleFields {
        spec,
        action,
        overlap_policy: policy(&f, "overlap_policy")?,
        jitter_seconds: f.opt_int("jitter_seconds", 0, JITTER_SECONDS_MAX)?,
        max_runs: f.opt_int("max_runs", 1, i64::MAX)?,
        memo,
        search_attributes,
        note: f.opt_str("note", NOTE_MAX)?,
        input_payload,
    })
}

fn empty_input() -> Payload {
    Payload::avro(crate::avro::empty_arguments_blob())
}

fn outcome(schedule_id: &str, outcome: &str) -> Json<Value> {
    Json(json!({"schedule_id": schedule_id, "outcome": outcome}))
}

fn kick<S: Store>(state: &Shared<S>) {
    state.scheduler_kick.notify_one();
}

pub async fn create<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let f = Fields::new(&body);
    let schedule_id = match f.opt_str("schedule_id", SCHEDULE_ID_MAX)? {
        Some(id) if crate::wire::valid_workflow_id(&id) => id,
        Some(_) => {
            return Err(ApiError::validation(
                "schedule_id",
                "The schedule_id may only contain letters, digits, '.', '_', ':' and '-'.",
            ))
        }
        None => state.new_id(),
    };
    if !body.get("spec").is_some_and(Value::is_object) {
        return Err(ApiError::validation("spec", "The spec field is required."));
    }
    if !body.get("action").is_some_and(Value::is_object) {
        return Err(ApiError::validation("action", "The action field is required."));
    }
    let mut fields = fields_of(&body, &state.config.limits)?;
    if let Some(Some(attributes)) = &fields.search_attributes {
        super::search_attributes::check(&state, &namespace, "search_attributes", attributes).await?;
    }
    let spec = fields
        .spec
        .take()
        .ok_or_else(|| ApiError::validation("spec", "The spec must include at least one cron_expression or interval."))?;
    let action = fields.action.take().unwrap_or_default();
    let new = NewSchedule {
        namespace: namespace.clone(),
        schedule_id: schedule_id.clone(),
        spec,
        action,
        fields,
        paused: f.opt_bool("paused")?.unwrap_or(false),
        principal: Some(caller.principal),
    };
    schedules::create(&*state, new).await.map_err(|e| spec_failure(e, &schedule_id))?;
    tracing::info!(namespace, schedule_id, "schedule created");
    kick(&state);
    Ok((StatusCode::CREATED, outcome(&schedule_id, "created")).into_response())
}

/// A list page token: base64url JSON of the last row's `(created_at, schedule_id)`, bound to the
/// namespace and filters it was issued for.
fn page_token(namespace: &str, filter: &str, last: &Schedule) -> String {
    let doc = json!({"v": 1, "namespace": namespace, "filter": filter, "created_at": last.created_at, "schedule_id": last.schedule_id});
    crate::page_token::issue(&doc)
}

pub async fn list<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    for key in params.keys() {
        if !matches!(
            key.as_str(),
            "status" | "workflow_type" | "page_size" | "next_page_token" | "namespace"
        ) {
            let message = if key == "query" {
                "Visibility queries on schedules are not supported; filter by status and workflow_type.".to_string()
            } else {
                format!("{key} is not a schedule list filter.")
            };
            return Err(
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, Reason::ScheduleListFilterUnsupported, message).with("field", key.as_str()),
            );
        }
    }
    let status = params.get("status").cloned();
    if status.as_deref().is_some_and(|s| s != "active" && s != "paused") {
        return Err(ApiError::validation("status", "status must be active or paused."));
    }
    let workflow_type = params.get("workflow_type").cloned();
    if workflow_type.as_deref().is_some_and(|t| t.trim().is_empty() || t.len() > 255) {
        return Err(ApiError::validation("workflow_type", "workflow_type must be 1 to 255 characters."));
    }
    let limit = match params.get("page_size") {
        None => PAGE_SIZE_DEFAULT,
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=PAGE_SIZE_MAX).contains(n))
            .ok_or_else(|| ApiError::validation("page_size", format!("page_size must be an integer from 1 to {PAGE_SIZE_MAX}.")))?
            as usize,
    };
    let filter_key = format!(
        "{}\u{1f}{}",
        status.clone().unwrap_or_default(),
        workflow_type.clone().unwrap_or_default()
    );
    let after = match params.get("next_page_token") {
        None => None,
        Some(token) => {
            let malformed = || {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    Reason::SchedulePageTokenMalformed,
                    "The page token is not one this server issued.",
                )
            };
            let doc = crate::page_token::read(token).ok_or_else(malformed)?;
            if doc["namespace"] != json!(namespace) {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    Reason::SchedulePageTokenNamespaceMismatch,
                    "The page token belongs to another namespace.",
                ));
            }
            if doc["filter"] != json!(filter_key) {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    Reason::SchedulePageTokenFilterMismatch,
                    "The page token was issued for other filters.",
                ));
            }
            let created_at = doc["created_at"].as_i64().ok_or_else(malformed)?;
            let schedule_id = doc["schedule_id"].as_str().ok_or_else(malformed)?.to_string();
            Some((created_at, schedule_id))
        }
    };
    let mut page = state
        .store
        .list_schedules(
            &namespace,
            ScheduleFilter {
                status,
                workflow_type,
                after,
                limit: limit + 1,
            },
        )
        .await?;
    let more = page.len() > limit;
    page.truncate(limit);
    let next = if more {
        page.last().map(|last| page_token(&namespace, &filter_key, last))
    } else {
        None
    };
    Ok(Json(json!({
        "schedules": page.iter().map(Schedule::describe).collect::<Vec<_>>(),
        "schedule_count": page.len(),
        "next_page_token": next,
    })))
}

async fn live<S: Store>(state: &Shared<S>, namespace: &str, schedule_id: &str) -> ApiResult<Schedule> {
    state
        .store
        .schedule(namespace, schedule_id)
        .await?
        .ok_or_else(|| not_found(namespace, schedule_id))
}

fn not_found(namespace: &str, schedule_id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        Reason::ScheduleNotFound,
        format!("Schedule [{schedule_id}] not found in namespace [{namespace}]."),
    )
    .with("schedule_id", schedule_id)
}

pub async fn describe<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(schedule_id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(live(&state, &namespace, &schedule_id).await?.describe()))
}

/// A use case's refusal, with a refused spec answered as its own reason naming its field.
fn spec_failure(error: AppError, schedule_id: &str) -> ApiError {
    match &error {
        AppError::Store(StoreError::Refused(refusal)) => match schedules::spec_error_of(refusal) {
            Some(spec) => spec_error(spec, schedule_id),
            None => error.into(),
        },
        _ => error.into(),
    }
}

/// Changes a schedule as the caller.
async fn change<S: Store>(state: &Shared<S>, namespace: &str, schedule_id: &str, caller: Caller, change: ScheduleChange) -> ApiResult<()> {
    schedules::change(&**state, namespace, schedule_id, Some(caller.principal), change)
        .await
        .map_err(|e| spec_failure(e, schedule_id))
}

pub async fn update<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(schedule_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let fields = fields_of(&body, &state.config.limits)?;
    if let Some(Some(attributes)) = &fields.search_attributes {
        super::search_attributes::check(&state, &namespace, "search_attributes", attributes).await?;
    }
    change(&state, &namespace, &schedule_id, caller, ScheduleChange::Update(Box::new(fields))).await?;
    kick(&state);
    Ok(outcome(&schedule_id, "updated"))
}

pub async fn delete<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(schedule_id): Path<String>,
) -> ApiResult<Json<Value>> {
    change(&state, &namespace, &schedule_id, caller, ScheduleChange::Delete).await?;
    tracing::info!(namespace, schedule_id, "schedule deleted");
    Ok(outcome(&schedule_id, "deleted"))
}

fn note_of(body: &Map<String, Value>) -> ApiResult<Option<String>> {
    Fields::new(body).opt_str("note", NOTE_MAX)
}

pub async fn pause<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(schedule_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let note = note_of(&body)?;
    change(&state, &namespace, &schedule_id, caller, ScheduleChange::Pause { note }).await?;
    Ok(outcome(&schedule_id, "paused"))
}

pub async fn resume<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(schedule_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let note = note_of(&body)?;
    change(&state, &namespace, &schedule_id, caller, ScheduleChange::Resume { note }).await?;
    kick(&state);
    Ok(outcome(&schedule_id, "resumed"))
}

pub async fn trigger<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(schedule_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let policy = policy(&Fields::new(&body), "overlap_policy")?;
    let report = state
        .store
        .fire_schedule(
            &namespace,
            &schedule_id,
            ScheduleFire::Manual {
                policy,
                principal: Some(caller.principal),
            },
            empty_input(),
            state.now(),
        )
        .await?;
    let mut answer = json!({"schedule_id": schedule_id, "outcome": report.outcome});
    for (key, value) in [
        ("workflow_id", json!(report.workflow_id)),
        ("run_id", json!(report.run_id)),
        ("reason", json!(report.reason)),
        ("buffer_depth", json!(report.buffer_depth)),
    ] {
        if !value.is_null() {
            answer[key] = value;
        }
    }
    tracing::info!(namespace, schedule_id, outcome = %report.outcome, "schedule triggered");
    Ok(Json(answer))
}

pub async fn backfill<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    Path(schedule_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    let f = Fields::new(&body);
    let instant = |key: &str| -> ApiResult<i64> {
        let text = f.req_str(key, 64)?;
        parse_instant(&text).ok_or_else(|| ApiError::validation(key, format!("{key} must be an RFC 3339 time or a date.")))
    };
    let (start, end) = (instant("start_time")?, instant("end_time")?);
    let policy = policy(&f, "overlap_policy")?;
    if end <= start {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            Reason::InvalidTimeRange,
            "end_time must be after start_time.",
        ));
    }
    let schedule = live(&state, &namespace, &schedule_id).await?;
    if schedule.occurrences_between(start, end, BACKFILL_MAX + 1).len() > BACKFILL_MAX {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            Reason::BackfillTooLarge,
            format!("A backfill may cover at most {BACKFILL_MAX} occurrences; split the range."),
        )
        .with("limit", BACKFILL_MAX));
    }
    let report = state
        .store
        .fire_schedule(
            &namespace,
            &schedule_id,
            ScheduleFire::Backfill {
                start,
                end,
                policy,
                principal: Some(caller.principal),
            },
            empty_input(),
            state.now(),
        )
        .await?;
    Ok(Json(json!({
        "schedule_id": schedule_id,
        "outcome": report.outcome,
        "fires_attempted": report.results.len(),
        "results": report.results,
    })))
}

pub async fn history<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(schedule_id): Path<String>,
    Query(params): Query<HashMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let limit = params
        .get("limit")
        .and_then(|l| l.parse::<i64>().ok())
        .filter(|l| *l > 0)
        .map(|l| (l as usize).min(HISTORY_LIMIT_MAX))
        .unwrap_or(HISTORY_LIMIT_DEFAULT);
    let after = match params.get("after_sequence").map(String::as_str) {
        None | Some("") => 0,
        Some(text) => text.parse::<u32>().map(i64::from).map_err(|_| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                Reason::InvalidAfterSequence,
                "after_sequence must be a non-negative integer.",
            )
        })?,
    };
    let mut events = state
        .store
        .schedule_history(&namespace, &schedule_id, after, limit + 1)
        .await?
        .ok_or_else(|| not_found(&namespace, &schedule_id))?;
    let has_more = events.len() > limit;
    events.truncate(limit);
    let next_cursor = if has_more { events.last().map(|e| e.sequence) } else { None };
    Ok(Json(json!({
        "schedule_id": schedule_id,
        "namespace": namespace,
        "events": events.iter().map(|e| json!({
            "id": e.event_id,
            "sequence": e.sequence,
            "event_type": e.event_type,
            "recorded_at": render::time(e.recorded_at),
            "workflow_instance_id": e.workflow_id,
            "workflow_run_id": e.run_id,
            "principal": e.payload.get("principal").cloned().unwrap_or(Value::Null),
            "payload": e.payload,
        })).collect::<Vec<_>>(),
        "has_more": has_more,
        "next_cursor": next_cursor,
    })))
}
