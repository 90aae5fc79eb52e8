//! Nexus service calls: what a completion's `start_service_operation` commands resolve against,
//! read before the transition (the catalog operations they name, the calls already admitted
//! under their idempotency keys, the instances their bindings name, whether the caller's
//! search attributes fit the target namespace). The transition then admits each call in the
//! completion's transaction (`capstan_engine::service_call`).

use crate::{search_attributes, AppResult, Services};
use capstan_engine::service_call::*;
use capstan_engine::{RequestContext, RunId, WorkflowCommand, WorkflowId};
use capstan_store::prelude::*;
use capstan_store::{CatalogKey, RunLocator, StoreError};
use serde_json::{Map, Value};
use std::sync::Arc;

/// The handler binding kinds DW's catalog accepts; only `start_workflow` is dispatched.
pub const BINDING_KINDS: &[&str] = &[
    "start_workflow",
    "update_workflow",
    "signal_workflow",
    "query_workflow",
    "activity_execution",
    "invocable_http",
];

/// How many times a completion is applied again after a concurrent admission of the same
/// idempotency key (or of a binding's instance id) refused it.
pub const ADMISSION_ATTEMPTS: usize = 3;

/// Whether a completion carries service calls.
pub fn calls_services(commands: &[WorkflowCommand]) -> bool {
    commands.iter().any(|c| matches!(c, WorkflowCommand::StartServiceOperation(_)))
}

/// Reads what the completion's service calls resolve against. `namespace` is the caller run's.
pub async fn directory<V: Services>(services: &V, namespace: &str, commands: &[WorkflowCommand]) -> AppResult<Arc<ServiceDirectory>> {
    let mut directory = ServiceDirectory::default();
    for command in commands {
        if let WorkflowCommand::StartServiceOperation(op) = command {
            read_for(services, &mut directory, namespace, op).await?;
        }
    }
    Ok(Arc::new(directory))
}

/// Adds what `op` (made from `namespace`) resolves against to `directory`.
async fn read_for<V: Services>(services: &V, directory: &mut ServiceDirectory, namespace: &str, op: &ServiceOperation) -> AppResult<()> {
    let target = op.target_namespace.as_deref().unwrap_or(namespace);
    let route = RouteKey::new(target, &op.endpoint_name, &op.service_name, &op.operation_name);
    if let Some(key) = &op.idempotency_key {
        if let Some(call) = services.store().service_call_by_key(route.clone(), key).await? {
            directory.calls.insert((route.clone(), key.clone()), call);
        }
    }
    if directory.routes.contains_key(&route) {
        return Ok(());
    }
    let resolved = resolve(services, &route).await?;
    if let ServiceRoute::StartWorkflow(binding) = &resolved {
        if let Some(instance_id) = &binding.workflow_instance_id {
            let current = services
                .store()
                .load_run(target, RunLocator::Current(WorkflowId(instance_id.clone())))
                .await?;
            if let Some(run) = current {
                let known = KnownInstance {
                    open: !run.is_closed(),
                    run_id: run.run_id,
                };
                directory.instances.insert(instance_id.clone(), known);
            }
        }
        let attributes = binding.search_attributes.as_ref().or(op.object("search_attributes"));
        if let Some(attributes) = attributes {
            if let Err(error) = search_attributes::check_defined(services, target, "search_attributes", attributes).await {
                directory.attribute_problems.insert(route.clone(), error.to_string());
            }
        }
    }
    directory.routes.insert(route, resolved);
    Ok(())
}

/// A client's execute request: `op` addressed to the request's namespace (the target), from
/// `caller_namespace` (its body's, else the request's).
pub struct DirectCall {
    pub namespace: String,
    pub op: ServiceOperation,
    pub caller_workflow_id: Option<String>,
    pub caller_run_id: Option<String>,
}

/// What an execute request admitted: whether the call was accepted, and its surface.
pub struct Executed {
    pub accepted: bool,
    pub body: Map<String, Value>,
}

/// Admits a call made outside any run (DW's execute route): the same admission a workflow's
/// command gets, recorded on the call's row instead of a history.
pub async fn execute<V: Services>(services: &V, call: DirectCall) -> AppResult<Executed> {
    let DirectCall {
        namespace,
        mut op,
        caller_workflow_id,
        caller_run_id,
    } = call;
    op.target_namespace = Some(namespace.clone());
    let caller = Caller {
        namespace: op.caller_namespace.clone().unwrap_or_else(|| namespace.clone()),
        workflow_id: caller_workflow_id.map(WorkflowId),
        run_id: caller_run_id.map(RunId),
        origin_trace: op.observability_context.clone(),
    };
    let mut attempt = 1;
    let admitted = loop {
        let mut directory = ServiceDirectory::default();
        read_for(services, &mut directory, &caller.namespace, &op).await?;
        let directory = Arc::new(directory);
        let (caller, op) = (caller.clone(), op.clone());
        let admitted = services
            .store()
            .admit_service_calls(services.now(), move |cx| {
                cx.serve(RequestContext {
                    services: Some(directory),
                    ..RequestContext::default()
                });
                capstan_engine::admit_service_call(cx, &caller, 0, &op)
            })
            .await;
        match admitted {
            Err(StoreError::Conflict { .. }) if attempt < ADMISSION_ATTEMPTS => attempt += 1,
            other => break other?,
        }
    };
    let mut body = admitted
        .row
        .get("service_call")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    body.insert("id".into(), Value::String(admitted.service_call_id.clone()));
    for key in ["message", "exception_type"] {
        if let Some(value) = admitted.row.get(key) {
            body.entry(key).or_insert(value.clone());
        }
    }
    let accepted = body.get("accepted").and_then(Value::as_bool).unwrap_or(true);
    if !accepted && !body.contains_key("reason") {
        let reason = body
            .get("outcome")
            .cloned()
            .unwrap_or(Value::String("service_operation_failed".into()));
        body.insert("reason".into(), reason);
    }
    Ok(Executed { accepted, body })
}

/// The route of one catalog address: the first missing level, or the operation's binding.
pub async fn resolve<V: Services>(services: &V, route: &RouteKey) -> AppResult<ServiceRoute> {
    let mut key = CatalogKey {
        namespace: route.namespace.clone(),
        endpoint: route.endpoint.clone(),
        service: None,
        operation: None,
    };
    let store = services.store();
    if store.catalog_entry(key.clone()).await?.is_none() {
        return Ok(ServiceRoute::Missing(CatalogLevel::Endpoint));
    }
    key.service = Some(route.service.clone());
    if store.catalog_entry(key.clone()).await?.is_none() {
        return Ok(ServiceRoute::Missing(CatalogLevel::Service));
    }
    key.operation = Some(route.operation.clone());
    let Some(operation) = store.catalog_entry(key).await? else {
        return Ok(ServiceRoute::Missing(CatalogLevel::Operation));
    };
    Ok(route_of(&operation.doc))
}

/// An operation's catalog document as a route.
pub fn route_of(doc: &Map<String, Value>) -> ServiceRoute {
    let text = |map: &Map<String, Value>, keys: &[&str]| {
        keys.iter()
            .find_map(|k| map.get(*k).and_then(Value::as_str).filter(|s| !s.trim().is_empty()))
            .map(str::to_string)
    };
    let operation_mode = text(doc, &["operation_mode"]).and_then(|m| CallMode::parse(&m));
    let kind = text(doc, &["handler_binding_kind"]).unwrap_or_default();
    if kind != "start_workflow" {
        return ServiceRoute::Unserved {
            binding_kind: kind,
            operation_mode,
        };
    }
    let binding = doc.get("handler_binding").and_then(Value::as_object).cloned().unwrap_or_default();
    let target_reference = text(doc, &["handler_target_reference"]);
    let object = |key: &str| binding.get(key).and_then(Value::as_object).cloned();
    let int = |key: &str| binding.get(key).and_then(Value::as_i64).filter(|n| *n > 0);
    ServiceRoute::StartWorkflow(Box::new(StartWorkflowBinding {
        workflow_type: text(&binding, &["workflow_type", "workflow_class", "type"])
            .or(target_reference.clone())
            .unwrap_or_default(),
        workflow_instance_id: text(&binding, &["workflow_instance_id", "instance_id"]),
        queue: text(&binding, &["queue", "task_queue"]),
        operation_mode,
        target_reference,
        duplicate_start_policy: text(&binding, &["duplicate_start_policy"]),
        business_key: text(&binding, &["business_key"]),
        execution_timeout_seconds: int("execution_timeout_seconds"),
        run_timeout_seconds: int("run_timeout_seconds"),
        memo: object("memo"),
        search_attributes: object("search_attributes"),
    }))
}

/// Cancels an open call of the operation at `route`: its waiting callers get their cancelled
/// rows, and when the operation's `cancellation_policy` says `propagate_to_linked_workflow`,
/// its linked instance is cancelled too. A call of another operation is not found.
pub async fn cancel<V: Services>(
    services: &V,
    route: &RouteKey,
    service_call_id: &str,
    reason: Option<String>,
) -> AppResult<ServiceCallRecord> {
    let store = services.store();
    let not_found = || {
        StoreError::Refused(
            capstan_engine::Refusal::new(
                capstan_engine::Reason::ServiceCallNotFound,
                "No service call of that id under this operation.",
            )
            .with("service_call_id", service_call_id),
        )
    };
    let call = store.service_call(service_call_id).await?.filter(|c| c.route_key() == *route);
    call.ok_or_else(not_found)?;
    let operation = CatalogKey {
        namespace: route.namespace.clone(),
        endpoint: route.endpoint.clone(),
        service: Some(route.service.clone()),
        operation: Some(route.operation.clone()),
    };
    let propagate = store
        .catalog_entry(operation)
        .await?
        .is_some_and(|entry| capstan_store::cancellation_propagates(&entry.doc));
    Ok(store
        .cancel_service_call(service_call_id, reason, services.now(), propagate)
        .await?)
}
