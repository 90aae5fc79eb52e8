//! Worker sessions: `POST /worker/sessions` (create, reuse, reacquire), `POST
//! /worker/sessions/{id}/heartbeat` and `DELETE /worker/sessions/{id}`. Refusals carry the
//! session as it stands (`session`) and `admitted: false`.

use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::{self, Fields};
use crate::Shared;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::sessions;
use capstan_store::{SessionAnswer, Store};
use serde_json::{json, Map, Value};

fn answer(answer: SessionAnswer, status: StatusCode) -> Response {
    let body = json!({
        "admitted": true,
        "outcome": answer.outcome,
        "session": answer.session.snapshot(),
        "activity_task_id": null,
        "status": status.as_u16(),
        "reason": null,
    });
    (status, Json(body)).into_response()
}

fn refused(error: impl Into<ApiError>) -> ApiError {
    let mut error: ApiError = error.into();
    if error.status.is_client_error() {
        error.fields.insert("admitted".into(), json!(false));
    }
    error
}

fn worker_id(body: &Map<String, Value>) -> ApiResult<String> {
    Fields::new(body).req_str("worker_id", 255)
}

pub async fn acquire<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let worker = worker_id(&body)?;
    let options = wire::parse_session_options(&body, "")?;
    let done = sessions::acquire(&*state, &namespace, &worker, options).await.map_err(refused)?;
    let status = if done.outcome == "created" {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(answer(done, status))
}

pub async fn heartbeat<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(session_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    wire::refuse_unknown_fields(&body, &[&["worker_id", "lease_seconds"]], "", "session heartbeats")?;
    let worker = worker_id(&body)?;
    let lease_seconds = Fields::new(&body).opt_int("lease_seconds", 1, 31_536_000)?;
    let done = sessions::heartbeat(&*state, &namespace, &session_id, &worker, lease_seconds)
        .await
        .map_err(refused)?;
    Ok(answer(done, StatusCode::OK))
}

pub async fn close<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(session_id): Path<String>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    wire::refuse_unknown_fields(&body, &[&["worker_id", "reason"]], "", "session closes")?;
    let worker = worker_id(&body)?;
    let reason = Fields::new(&body).opt_str("reason", 255)?;
    let done = sessions::close(&*state, &namespace, &session_id, &worker, reason)
        .await
        .map_err(refused)?;
    Ok(answer(done, StatusCode::OK))
}
