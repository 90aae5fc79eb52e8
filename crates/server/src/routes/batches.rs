//! `/api/batch-operations` (Capstan, `docs/batch-operations.md`): an action applied to every
//! current run a query selects. `POST` creates one (or with `dry_run` counts what it would
//! select), `GET` lists them or shows one with its progress, `POST …/{id}/cancel` stops one.

use crate::auth::Role;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::{refuse_unknown_fields, Fields};
use crate::{render, Shared};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::batches::{self, BatchAction, BatchProgress, BatchRequest, NewBatch};
use capstan_app::listing::ListQuery;
use capstan_store::{BatchOperation, Store};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

const FIELDS: &[&str] = &[
    "action",
    "query",
    "workflow_type",
    "task_queue",
    "status",
    "reason",
    "signal_name",
    "input",
    "rate_per_second",
    "limit",
    "request_id",
    "dry_run",
];
const LIST_DEFAULT: usize = 50;
const LIST_MAX: usize = 500;

/// `POST /api/batch-operations`: 201 with the batch (200 for a repeat of its `request_id`);
/// with `dry_run: true`, 200 with how many runs the selection matches now.
pub async fn create<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let caller = state.config.auth.require_in(&headers, &[Role::Operator, Role::Admin], &namespace)?;
    let (request, request_id, dry_run) = read_request(&state, &body)?;
    if request.action == BatchAction::Delete && !dry_run && !caller.roles.contains(&Role::Admin) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            capstan_engine::Reason::Forbidden,
            "A delete batch takes the admin role.",
        ));
    }
    if dry_run {
        let matched = batches::dry_run(&*state, &namespace, &request).await?;
        return Ok(
            Json(json!({"namespace": namespace, "dry_run": true, "action": request.action.as_str(), "matched": matched})).into_response(),
        );
    }
    let new = NewBatch {
        namespace,
        request,
        request_id,
        principal: Some(caller.principal),
    };
    let (batch, created) = batches::create(&*state, new).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(batch_json(&batch))).into_response())
}

fn read_request<S: Store>(state: &Shared<S>, body: &Map<String, Value>) -> ApiResult<(BatchRequest, Option<String>, bool)> {
    refuse_unknown_fields(body, &[FIELDS], "", "batch operations")?;
    let f = Fields::new(body);
    let action = BatchAction::named(&f.req_str("action", 32)?)?;
    let select = ListQuery {
        workflow_type: f.opt_str("workflow_type", 255)?,
        task_queue: f.opt_str("task_queue", 255)?,
        status: f.opt_str("status", 32)?,
        query: f.opt_str("query", 4096)?,
    };
    let signal_name = f.opt_str("signal_name", 255)?;
    // A signal without arguments carries an empty argument list, as a single signal does.
    let input = match (action, f.opt_payload("input", &state.config.limits)?) {
        (BatchAction::Signal, None) => Some(capstan_engine::Payload::avro(crate::avro::empty_arguments_blob())),
        (_, input) => input,
    };
    let rate_per_second = match f.raw("rate_per_second") {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            value
                .as_f64()
                .ok_or_else(|| ApiError::validation("rate_per_second", "rate_per_second must be a number."))?,
        ),
    };
    let request = BatchRequest {
        action,
        select,
        reason: f.opt_str("reason", 1000)?,
        signal_name,
        input,
        rate_per_second,
        limit: f.opt_int("limit", 1, i64::MAX)?.map(|n| n as u64),
    };
    let request_id = f.opt_str("request_id", 255)?.filter(|s| !s.is_empty());
    Ok((request, request_id, f.opt_bool("dry_run")?.unwrap_or(false)))
}

/// `GET /api/batch-operations?limit=N`: the namespace's batches, newest first.
pub async fn list<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    state.config.auth.require_in(&headers, &[Role::Operator, Role::Admin], &namespace)?;
    let limit = super::audit::limit_param(&params, LIST_DEFAULT, LIST_MAX)?;
    let found = state.store.batches(&namespace, limit).await?;
    Ok(Json(
        json!({"namespace": namespace, "batch_operations": found.iter().map(batch_json).collect::<Vec<_>>()}),
    ))
}

/// `GET /api/batch-operations/{id}`.
pub async fn show<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(batch_id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    state.config.auth.require_in(&headers, &[Role::Operator, Role::Admin], &namespace)?;
    Ok(Json(batch_json(&batches::get(&*state, &namespace, &batch_id).await?)))
}

/// `POST /api/batch-operations/{id}/cancel`: a running batch stops (a finished one is as it was).
pub async fn cancel<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(batch_id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Json<Value>> {
    state.config.auth.require_in(&headers, &[Role::Operator, Role::Admin], &namespace)?;
    Ok(Json(batch_json(&batches::cancel(&*state, &namespace, &batch_id).await?)))
}

/// A batch as the API shows it: what was asked, its state and its progress.
fn batch_json(batch: &BatchOperation) -> Value {
    let progress: BatchProgress = serde_json::from_value(batch.progress.clone()).unwrap_or_default();
    let mut request = batch.request.clone();
    if let Some(map) = request.as_object_mut() {
        // Shown once, at the top.
        map.remove("action");
    }
    json!({
        "batch_id": batch.batch_id,
        "namespace": batch.namespace,
        "action": batch.action,
        "state": batch.state,
        "request": request,
        "request_id": batch.request_id,
        "principal": capstan_engine::principal::recorded(batch.principal.as_ref()),
        "created_at": render::time(batch.created_at),
        "updated_at": render::time(batch.updated_at),
        "finished_at": render::opt_time(batch.finished_at),
        "matched": progress.matched,
        "done": progress.done,
        "skipped": progress.skipped.values().sum::<u64>(),
        "skipped_by_reason": progress.skipped,
        "failed": progress.failed,
        "failures": progress.failures,
    })
}
