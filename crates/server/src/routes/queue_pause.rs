//! `POST /task-queues/{queue}/pause|resume` (Capstan): an operator's hold on a queue's workflow
//! or activity tasks, or both (`docs/pause.md`). Body `{kind?, reason?}` (no kind: both).
//! The answer says, per kind, whether it is paused now, since when, by whom and why.

use crate::auth::Role;
use crate::body::JsonObject;
use crate::error::ApiResult;
use crate::planes::Namespace;
use crate::wire::{refuse_unknown_fields, Fields};
use crate::{render, Shared};
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::{Extension, Json};
use capstan_app::queue_limits;
use capstan_engine::TaskKind;
use capstan_store::Store;
use serde_json::{json, Map, Value};

pub async fn pause<S: Store>(
    state: State<Shared<S>>,
    namespace: Extension<Namespace>,
    queue: Path<String>,
    headers: HeaderMap,
    body: JsonObject,
) -> ApiResult<Json<Value>> {
    hold(state, namespace, queue, headers, body, true).await
}

pub async fn resume<S: Store>(
    state: State<Shared<S>>,
    namespace: Extension<Namespace>,
    queue: Path<String>,
    headers: HeaderMap,
    body: JsonObject,
) -> ApiResult<Json<Value>> {
    hold(state, namespace, queue, headers, body, false).await
}

async fn hold<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(queue): Path<String>,
    headers: HeaderMap,
    JsonObject(body): JsonObject,
    pause_it: bool,
) -> ApiResult<Json<Value>> {
    let caller = state.config.auth.require_in(&headers, &[Role::Operator, Role::Admin], &namespace)?;
    refuse_unknown_fields(&body, &[&["kind", "reason"]], "", "task queue pause and resume requests")?;
    let f = Fields::new(&body);
    let kinds = match f.opt_str("kind", 32)? {
        Some(kind) => vec![queue_limits::kind_named(&kind)?],
        None => vec![TaskKind::Workflow, TaskKind::Activity],
    };
    let reason = f.opt_str("reason", 1000)?;
    let principal = Some(caller.principal);
    let changed = match pause_it {
        true => queue_limits::pause(&*state, &namespace, &queue, &kinds, reason, principal).await?,
        false => queue_limits::resume(&*state, &namespace, &queue, &kinds, principal).await?,
    };
    let outcome = match (pause_it, changed.iter().any(|(_, done)| *done)) {
        (true, true) => "paused",
        (true, false) => "pause_not_needed",
        (false, true) => "resumed",
        (false, false) => "resume_not_needed",
    };
    let mut body = pauses(&state, &namespace, &queue).await?;
    body["outcome"] = json!(outcome);
    Ok(Json(body))
}

/// `{namespace, task_queue, kinds: {workflow: {paused, pause}, activity: {…}}}`: the queue's
/// holds as they are now.
pub(crate) async fn pauses<S: Store>(state: &Shared<S>, namespace: &str, queue: &str) -> ApiResult<Value> {
    let set = queue_limits::of_queue(&**state, namespace, queue).await?;
    let mut kinds = Map::new();
    for kind in [TaskKind::Workflow, TaskKind::Activity] {
        let pause = set.iter().find(|s| s.kind == kind).and_then(|s| s.limits.paused.as_ref());
        kinds.insert(
            kind.as_str().into(),
            json!({"paused": pause.is_some(), "pause": render::pause(pause)}),
        );
    }
    Ok(json!({"namespace": namespace, "task_queue": queue, "kinds": kinds}))
}
