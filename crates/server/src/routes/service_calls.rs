//! Nexus service calls on the control plane: DW's execute route (a client's call of a catalog
//! operation, admitted as a workflow's command would be), a call's describe route, and the calls
//! a workflow made (`nexus-operations`). Handlers only translate; the admission is
//! `capstan_app::service_calls::execute`.

use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::nexus::{parse_execute, EXECUTE_FIELDS, SHARED_CALL_FIELDS};
use crate::wire::{refuse_unknown_fields, Fields};
use crate::Shared;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::service_calls::{self, DirectCall};
use capstan_engine::service_call::{RouteKey, ServiceCallRecord};
use capstan_engine::{Reason, Refusal};
use capstan_store::Store;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// The most calls one `nexus-operations` page lists (DW's default and cap).
const LIST_LIMIT: usize = 200;

/// DW's limit on a caller run id in an execute body (a ULID).
const RUN_ID_MAX: usize = 26;

/// `POST /service-endpoints/{e}/services/{s}/operations/{o}/execute`: 200 with the call when it
/// was accepted, 409 with it when it was not (the Python client turns only a 409 with a body
/// into `NexusOperationFailed`).
pub async fn execute<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((endpoint, service, operation)): Path<(String, String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    refuse_unknown_fields(&body, &[EXECUTE_FIELDS, SHARED_CALL_FIELDS], "", "execute requests")?;
    let f = Fields::new(&body);
    let caller_workflow_id = f.opt_str("caller_workflow_instance_id", 255)?;
    let caller_run_id = f.opt_str("caller_workflow_run_id", RUN_ID_MAX)?;
    f.opt_str("target_workflow_run_id", RUN_ID_MAX)?;
    let mut request = body.clone();
    request.insert("endpoint_name".into(), json!(endpoint));
    request.insert("service_name".into(), json!(service));
    request.insert("operation_name".into(), json!(operation));
    let mut op = parse_execute(&request, &state.config.limits)?;
    if let Some(id) = &caller_workflow_id {
        op.options.insert("caller_workflow_instance_id".into(), id.clone());
    }
    if let Some(id) = &caller_run_id {
        op.options.insert("caller_workflow_run_id".into(), id.clone());
    }
    let call = DirectCall {
        namespace: namespace.clone(),
        op,
        caller_workflow_id,
        caller_run_id,
    };
    let executed = service_calls::execute(&*state, call).await?;
    let status = if executed.accepted { StatusCode::OK } else { StatusCode::CONFLICT };
    tracing::info!(
        namespace,
        endpoint,
        service,
        operation,
        accepted = executed.accepted,
        "service operation executed"
    );
    Ok((status, Json(Value::Object(executed.body))).into_response())
}

/// A call as the routes show it: its surface, its id as `id`, its request and result.
fn render_call(call: &ServiceCallRecord) -> Value {
    let mut body = call.surface.clone();
    body.insert("id".into(), json!(call.service_call_id));
    body.insert("status".into(), json!(call.status));
    if let Some(response) = &call.response {
        body.insert("response_payload".into(), response.envelope());
    }
    Value::Object(body)
}

/// `GET /service-endpoints/{e}/services/{s}/operations/{o}/service-calls/{id}`.
pub async fn describe<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((endpoint, service, operation, id)): Path<(String, String, String, String)>,
) -> ApiResult<Json<Value>> {
    let call = state.store.service_call(&id).await?;
    let route = (
        namespace.clone(),
        endpoint.to_ascii_lowercase(),
        service.to_ascii_lowercase(),
        operation.to_ascii_lowercase(),
    );
    let Some(call) = call.filter(|c| c.route == route) else {
        let refusal = Refusal::new(Reason::ServiceCallNotFound, "No service call of that id under this operation.")
            .with("service_call_id", id)
            .with("found", false);
        return Err(refusal.into());
    };
    let mut body = render_call(&call);
    body["found"] = json!(true);
    Ok(Json(body))
}

/// `POST …/operations/{o}/service-calls/{id}/cancel {reason?}`: 200 with the cancelled call, 409
/// `service_call_terminal` when it already ended.
pub async fn cancel<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path((endpoint, service, operation, id)): Path<(String, String, String, String)>,
    JsonObject(body): JsonObject,
) -> ApiResult<Json<Value>> {
    refuse_unknown_fields(&body, &[&["reason"]], "", "service call cancellations")?;
    let reason = Fields::new(&body).opt_str("reason", 1000)?;
    let route = RouteKey::new(&namespace, &endpoint, &service, &operation);
    let call = service_calls::cancel(&*state, &route, &id, reason).await?;
    tracing::info!(namespace, service_call_id = %id, "service call cancelled");
    let mut body = render_call(&call);
    body["outcome"] = json!("cancelled");
    Ok(Json(body))
}

/// `GET /workflows/{wf}[/runs/{run}]/nexus-operations?limit=`: the calls the instance (or run)
/// made, oldest first.
pub async fn of_workflow<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Path(segments): Path<Vec<String>>,
    Query(query): Query<BTreeMap<String, String>>,
) -> ApiResult<Json<Value>> {
    let (workflow_id, run_id) = match segments.as_slice() {
        [workflow_id] => (workflow_id.clone(), None),
        [workflow_id, run_id] => (workflow_id.clone(), Some(run_id.clone())),
        _ => return Err(ApiError::validation("path", "Name a workflow, and optionally one of its runs.")),
    };
    let limit = match query.get("limit") {
        None => LIST_LIMIT,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| ApiError::validation("limit", "The limit is a positive integer."))?
            .min(LIST_LIMIT),
    };
    let calls = state
        .store
        .service_calls_of_caller(&namespace, &workflow_id, run_id.as_deref(), limit)
        .await?;
    let listed: Vec<Value> = calls.iter().map(render_call).collect();
    let mut body = json!({"workflow_id": workflow_id, "caller_namespace": namespace, "count": listed.len(),
                          "limit": limit, "nexus_operations": listed});
    if let Some(run_id) = run_id {
        body["workflow_run_id"] = json!(run_id);
    }
    Ok(Json(body))
}
