//! `POST /workflows/{id}[/runs/{run}]/pause|resume` (Capstan): an operator's hold on a run's
//! dispatch (`capstan_engine::pause`). Body `{reason?, request_id?}`; the answer names the
//! outcome (`paused`, `pause_not_needed`, `resumed`, `resume_not_needed`) and the hold.

use super::control::{applied, in_operation, target};
use crate::auth::Caller;
use crate::body::JsonObject;
use crate::error::ApiResult;
use crate::planes::Namespace;
use crate::wire::{refuse_unknown_fields, Fields};
use crate::{render, Shared};
use axum::extract::{Path, State};
use axum::{Extension, Json};
use capstan_app::pause::{self, PauseRequest};
use capstan_engine::RunState;
use capstan_store::Store;
use serde_json::{json, Map, Value};

/// Pause or resume, and how each names what it did.
#[derive(Clone, Copy)]
enum Hold {
    Pause,
    Resume,
}

impl Hold {
    fn operation(self) -> &'static str {
        match self {
            Hold::Pause => "pause",
            Hold::Resume => "resume",
        }
    }

    fn outcome(self, changed: bool) -> &'static str {
        match (self, changed) {
            (Hold::Pause, true) => "paused",
            (Hold::Pause, false) => "pause_not_needed",
            (Hold::Resume, true) => "resumed",
            (Hold::Resume, false) => "resume_not_needed",
        }
    }
}

pub async fn pause<S: Store>(
    state: State<Shared<S>>,
    namespace: Extension<Namespace>,
    caller: Extension<Caller>,
    Path(workflow_id): Path<String>,
    body: JsonObject,
) -> ApiResult<Json<Value>> {
    hold(state, namespace, caller, (workflow_id, None), body, Hold::Pause).await
}

pub async fn pause_run<S: Store>(
    state: State<Shared<S>>,
    namespace: Extension<Namespace>,
    caller: Extension<Caller>,
    Path((workflow_id, run_id)): Path<(String, String)>,
    body: JsonObject,
) -> ApiResult<Json<Value>> {
    hold(state, namespace, caller, (workflow_id, Some(run_id)), body, Hold::Pause).await
}

pub async fn resume<S: Store>(
    state: State<Shared<S>>,
    namespace: Extension<Namespace>,
    caller: Extension<Caller>,
    Path(workflow_id): Path<String>,
    body: JsonObject,
) -> ApiResult<Json<Value>> {
    hold(state, namespace, caller, (workflow_id, None), body, Hold::Resume).await
}

pub async fn resume_run<S: Store>(
    state: State<Shared<S>>,
    namespace: Extension<Namespace>,
    caller: Extension<Caller>,
    Path((workflow_id, run_id)): Path<(String, String)>,
    body: JsonObject,
) -> ApiResult<Json<Value>> {
    hold(state, namespace, caller, (workflow_id, Some(run_id)), body, Hold::Resume).await
}

async fn hold<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    (workflow_id, run_id): (String, Option<String>),
    JsonObject(body): JsonObject,
    hold: Hold,
) -> ApiResult<Json<Value>> {
    let operation = hold.operation();
    let fields = read_body(&body).map_err(|e| in_operation(e, operation, &workflow_id))?;
    let request = PauseRequest {
        target: target(&namespace, &workflow_id, run_id),
        reason: fields.0,
        request_id: fields.1,
        principal: Some(caller.principal),
    };
    let render_receipt = {
        let workflow_id = workflow_id.clone();
        move |changed: &bool, run: &RunState| {
            json!({
                "workflow_id": workflow_id,
                "run_id": run.run_id,
                "outcome": hold.outcome(*changed),
                "paused": run.paused.is_some(),
                "pause": render::pause(run.paused.as_ref()),
                "control_plane": {"operation": operation, "workflow_id": workflow_id},
            })
        }
    };
    let receipt = match hold {
        Hold::Pause => pause::pause(&*state, request, render_receipt).await,
        Hold::Resume => pause::resume(&*state, request, render_receipt).await,
    }
    .map_err(|e| in_operation(e.into(), operation, &workflow_id))?;
    let (body, _) = applied(&state, receipt);
    tracing::info!(namespace, workflow_id, outcome = %body["outcome"], "workflow {operation} requested");
    Ok(Json(body))
}

/// `reason` (≤ 1,000 characters) and `request_id` (≤ 255); nothing else is taken.
fn read_body(body: &Map<String, Value>) -> ApiResult<(Option<String>, Option<String>)> {
    refuse_unknown_fields(body, &[&["reason", "request_id"]], "", "pause and resume requests")?;
    let f = Fields::new(body);
    let reason = f.opt_str("reason", 1000)?;
    let request_id = f.opt_str("request_id", 255)?.filter(|s| !s.is_empty());
    Ok((reason, request_id))
}
