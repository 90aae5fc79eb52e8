//! Nexus service calls from the caller's side: admitting a `start_service_operation` command
//! (one row at its step, see `crate::service_call`) and settling a waiting step when the linked
//! run closes.

use crate::service_call::{
    error_fields, CallMode, CallWait, Caller, CatalogLevel, RouteKey, ServiceCallRecord, ServiceDirectory, ServiceOperation, ServiceRoute,
    ServiceWaiter, StartWorkflowBinding, WaitFor, STATUS_CANCELLED, STATUS_COMPLETED, STATUS_FAILED, STATUS_STARTED,
};
use crate::transitions::commands::At;
use crate::transitions::{begin_run, blank_run, events, iso8601, LinkedRunClosed};
use crate::{ClosedReason, EventType, Millis, Payload, RunStatus, StartRun};
use crate::{Cx, Effects, RunId, RunState, WorkflowFailure, WorkflowId};
use serde_json::{json, Map, Value};

/// The caller's view of one call as it is being admitted.
struct Admission<'a> {
    op: &'a ServiceOperation,
    caller: &'a Caller,
    step: u32,
    service_call_id: String,
    route: RouteKey,
    idempotency_key: String,
    caller_namespace: String,
    mode: CallMode,
    wait_for: WaitFor,
}

/// How the call stands after admission.
enum Admitted {
    /// A linked run exists (started now, or an existing one): `ServiceCallStarted`.
    Started {
        workflow_id: WorkflowId,
        run_id: RunId,
        binding_kind: &'static str,
        target: Option<String>,
    },
    /// Admitted earlier under the same key and already ended.
    Ended(Box<ServiceCallRecord>),
    /// Refused or undispatchable: `ServiceCallFailed`.
    Failed {
        outcome: &'static str,
        reason: String,
        message: String,
        binding_kind: Option<String>,
    },
}

/// One admitted call: its row (the caller's history event, or the answer of a direct call),
/// the row's event type, and whether a linked run is running for it.
pub struct AdmittedCall {
    pub service_call_id: String,
    pub row: Map<String, Value>,
    pub event_type: EventType,
    pub running: bool,
    pub mode: CallMode,
    pub wait_for: WaitFor,
}

/// Admits a call from `caller` against the directory read into `cx.services`: a call admitted
/// earlier under the same route and key is answered as it stands; otherwise the route decides
/// (a `start_workflow` binding starts or joins the linked run). New calls and linked runs go to
/// `cx.effects` for the store.
pub fn admit_service_call(cx: &mut Cx, caller: &Caller, step: u32, op: &ServiceOperation) -> AdmittedCall {
    let directory = cx.services.clone().unwrap_or_default();
    let target_namespace = op.target_namespace.clone().unwrap_or_else(|| caller.namespace.clone());
    let route = RouteKey::new(&target_namespace, &op.endpoint_name, &op.service_name, &op.operation_name);
    let found = directory
        .routes
        .get(&route)
        .cloned()
        .unwrap_or(ServiceRoute::Missing(CatalogLevel::Endpoint));
    let catalog_mode = match &found {
        ServiceRoute::StartWorkflow(binding) => binding.operation_mode,
        ServiceRoute::Unserved { operation_mode, .. } => *operation_mode,
        ServiceRoute::Missing(_) => None,
    };
    let mode = op.mode.or(catalog_mode).unwrap_or(CallMode::Async);
    let minted: String = cx.id();
    let idempotency_key = op
        .idempotency_key
        .clone()
        .unwrap_or_else(|| match (&caller.workflow_id, &caller.run_id) {
            (Some(workflow_id), Some(run_id)) if step > 0 => format!("workflow-service-operation:{workflow_id}:{run_id}:{step}"),
            _ => format!("service-call:{minted}"),
        });
    // An earlier admission of the key: read before the transition, or made by this one (two
    // calls of one completion with one key are one call).
    let admitted_here = cx
        .effects
        .service_calls
        .iter()
        .find(|call| call.route_key() == route && call.idempotency_key == idempotency_key);
    let earlier = directory
        .calls
        .get(&(route.clone(), idempotency_key.clone()))
        .or(admitted_here)
        .cloned();
    let replay = earlier.is_some();
    let admission = Admission {
        op,
        caller,
        step,
        service_call_id: earlier.as_ref().map(|c| c.service_call_id.clone()).unwrap_or(minted),
        route,
        idempotency_key,
        caller_namespace: op.caller_namespace.clone().unwrap_or_else(|| caller.namespace.clone()),
        mode,
        wait_for: op.wait_for.unwrap_or(match mode {
            CallMode::Sync => WaitFor::Completed,
            CallMode::Async => WaitFor::Accepted,
        }),
    };
    let admitted = match earlier {
        Some(call) => replay_earlier(call),
        None if admission.caller_namespace != caller.namespace => Admitted::Failed {
            outcome: "rejected_forbidden",
            reason: "caller_namespace_mismatch".into(),
            message: format!(
                "The caller namespace {:?} is not the calling run's namespace {:?}.",
                admission.caller_namespace, caller.namespace
            ),
            binding_kind: None,
        },
        None => dispatch(cx, &admission, &directory, found),
    };
    let row = call_row(cx, &admission, &admitted, replay);
    let (event_type, status) = match &admitted {
        Admitted::Started { .. } => (EventType::ServiceCallStarted, STATUS_STARTED),
        Admitted::Ended(call) => (terminal_event(&call.status), terminal_status(&call.status)),
        Admitted::Failed { .. } => (EventType::ServiceCallFailed, STATUS_FAILED),
    };
    if !replay {
        cx.effects.service_calls.push(record(cx, &admission, &row, status, &admitted));
    }
    AdmittedCall {
        service_call_id: admission.service_call_id,
        row,
        event_type,
        running: matches!(admitted, Admitted::Started { .. }),
        mode: admission.mode,
        wait_for: admission.wait_for,
    }
}

/// Applies `start_service_operation` at `at.step` and records its row. Async calls and calls
/// waiting only for acceptance resume now; a sync call waiting for completion waits for the
/// linked run's end.
pub(super) fn start_service_operation(run: &mut RunState, cx: &mut Cx, at: At, op: ServiceOperation) {
    let step = at.step;
    let caller = Caller {
        namespace: run.namespace.clone(),
        workflow_id: Some(run.workflow_id.clone()),
        run_id: Some(run.run_id.clone()),
        origin_trace: op.observability_context.clone().or(run.origin_trace.clone()),
    };
    let call = admit_service_call(cx, &caller, step, &op);
    let waits = call.running && call.mode == CallMode::Sync && call.wait_for == WaitFor::Completed;
    let row = events::tagged_row(call.row, &op.tags);
    run.append(cx, call.event_type, row.clone(), at.task, None);
    if waits {
        run.service_waits.insert(
            step,
            CallWait {
                service_call_id: call.service_call_id.clone(),
                started: row,
            },
        );
        cx.effects.service_waiters.push(ServiceWaiter {
            service_call_id: call.service_call_id,
            caller_run_id: run.run_id.clone(),
            sequence: step,
        });
    } else {
        run.want_workflow_task(cx, None);
    }
}

/// A call admitted earlier under the same key: this caller sees it as it stands.
fn replay_earlier(call: ServiceCallRecord) -> Admitted {
    match (&call.linked_workflow_id, &call.linked_run_id) {
        (Some(workflow_id), Some(run_id)) if !call.is_terminal() => Admitted::Started {
            workflow_id: workflow_id.clone(),
            run_id: run_id.clone(),
            binding_kind: "workflow_run",
            target: call
                .surface
                .get("resolved_target_reference")
                .and_then(Value::as_str)
                .map(str::to_string),
        },
        _ => Admitted::Ended(Box::new(call)),
    }
}

/// Dispatches a new call by its route.
fn dispatch(cx: &mut Cx, admission: &Admission, directory: &ServiceDirectory, route: ServiceRoute) -> Admitted {
    let binding = match route {
        ServiceRoute::Missing(level) => {
            return Admitted::Failed {
                outcome: "rejected_not_found",
                reason: level.reason().into(),
                message: format!(
                    "No {} {:?} / {:?} / {:?} in namespace {:?}.",
                    match level {
                        CatalogLevel::Endpoint => "endpoint",
                        CatalogLevel::Service => "service",
                        CatalogLevel::Operation => "operation",
                    },
                    admission.op.endpoint_name,
                    admission.op.service_name,
                    admission.op.operation_name,
                    admission.route.namespace
                ),
                binding_kind: None,
            }
        }
        ServiceRoute::Unserved { binding_kind, .. } => {
            return Admitted::Failed {
                outcome: "handler_unavailable",
                reason: "binding_kind_not_served".into(),
                message: format!("This server does not dispatch {binding_kind:?} handler bindings; only start_workflow."),
                binding_kind: Some(binding_kind),
            }
        }
        ServiceRoute::StartWorkflow(binding) => binding,
    };
    if let Some(problem) = directory.attribute_problems.get(&admission.route) {
        return Admitted::Failed {
            outcome: "handler_failed",
            reason: "invalid_search_attributes".into(),
            message: problem.clone(),
            binding_kind: Some("start_workflow".into()),
        };
    }
    let target = binding.target_reference.clone().or(Some(binding.workflow_type.clone()));
    let policy = binding
        .duplicate_start_policy
        .clone()
        .or(admission.op.option("duplicate_start_policy").map(str::to_string));
    if let Some(instance_id) = &binding.workflow_instance_id {
        if let Some(existing) = directory.instances.get(instance_id) {
            if existing.open && policy.as_deref() == Some("return_existing_active") {
                cx.effects
                    .service_links
                    .push((existing.run_id.clone(), admission.service_call_id.clone()));
                return Admitted::Started {
                    workflow_id: WorkflowId(instance_id.clone()),
                    run_id: existing.run_id.clone(),
                    binding_kind: "workflow_run",
                    target,
                };
            }
            return Admitted::Failed {
                outcome: "handler_failed",
                reason: "workflow_instance_already_started".into(),
                message: format!("The workflow instance {instance_id:?} the binding starts already exists."),
                binding_kind: Some("start_workflow".into()),
            };
        }
    }
    let (linked, linked_effects) = start_linked_run(cx, admission, &binding);
    let started = Admitted::Started {
        workflow_id: linked.workflow_id.clone(),
        run_id: linked.run_id.clone(),
        binding_kind: "workflow_run",
        target,
    };
    cx.effects.service_runs_started.push((linked, linked_effects));
    started
}

/// The run a `start_workflow` binding starts in the target namespace: the binding's type,
/// instance id, queue and timeouts; its memo, search attributes and business key, else the
/// caller's; the request payload as its arguments.
fn start_linked_run(cx: &mut Cx, admission: &Admission, binding: &StartWorkflowBinding) -> (RunState, Effects) {
    let op = admission.op;
    let workflow_id = binding
        .workflow_instance_id
        .clone()
        .unwrap_or_else(|| format!("nexus-{}", admission.service_call_id));
    let mut next = Cx::new(cx.now, &mut *cx.ids, cx.limits);
    let start = StartRun {
        scheduling: Default::default(),
        namespace: admission.route.namespace.clone(),
        workflow_id: WorkflowId(workflow_id),
        run_id: next.id(),
        workflow_type: binding.workflow_type.clone(),
        task_queue: binding.queue.clone().filter(|q| !q.is_empty()).unwrap_or_else(|| "default".into()),
        input: op.input.clone(),
        execution_timeout_seconds: binding.execution_timeout_seconds,
        run_timeout_seconds: binding.run_timeout_seconds,
        business_key: binding.business_key.clone().or(op.option("business_key").map(str::to_string)),
        memo: binding.memo.clone().or(op.object("memo").cloned()).unwrap_or_default(),
        search_attributes: binding
            .search_attributes
            .clone()
            .or(op.object("search_attributes").cloned())
            .unwrap_or_default(),
        command_id: next.id(),
        contract: None,
        compatibility: None,
        origin_trace: admission.caller.origin_trace.clone(),
        principal: cx.principal.clone(),
    };
    let execution_deadline_at = start.execution_timeout_seconds.map(|s| next.now + s * 1000);
    super::start::acting_for(&mut next, &start);
    let mut linked = blank_run(&next, start, 1, execution_deadline_at);
    linked.service_call_ids.push(admission.service_call_id.clone());
    let linked = begin_run(linked, &mut next);
    (linked, next.effects)
}

fn terminal_event(status: &str) -> EventType {
    match status {
        STATUS_COMPLETED => EventType::ServiceCallCompleted,
        STATUS_CANCELLED => EventType::ServiceCallCancelled,
        _ => EventType::ServiceCallFailed,
    }
}

fn terminal_status(status: &str) -> &'static str {
    match status {
        STATUS_COMPLETED => STATUS_COMPLETED,
        STATUS_CANCELLED => STATUS_CANCELLED,
        _ => STATUS_FAILED,
    }
}

/// The caller's row: the call's identity, what the command asked, and how it stands
/// (`service_call` is the surface both SDKs read; the top level carries the same identity).
fn call_row(cx: &Cx, admission: &Admission, admitted: &Admitted, replay: bool) -> Map<String, Value> {
    let op = admission.op;
    let caller = admission.caller;
    let mut metadata = op.metadata.clone();
    if let (Some(workflow_id), Some(run_id)) = (&caller.workflow_id, &caller.run_id) {
        metadata.entry("caller_workflow_instance_id").or_insert(json!(workflow_id));
        metadata.entry("caller_workflow_run_id").or_insert(json!(run_id));
        metadata.entry("workflow_sequence").or_insert(json!(admission.step));
    }
    let payload_codec = op.payload_codec.clone().unwrap_or_else(|| op.input.codec.clone());
    let mut surface = obj!(
        "service_call_id" => admission.service_call_id,
        "namespace" => admission.route.namespace,
        "target_namespace" => admission.route.namespace,
        "caller_namespace" => admission.caller_namespace,
        "endpoint_name" => op.endpoint_name,
        "service_name" => op.service_name,
        "operation_name" => op.operation_name,
        "operation_mode" => admission.mode.as_str(),
        "wait_for" => admission.wait_for.as_str(),
        "idempotency_key" => admission.idempotency_key,
        "payload_codec" => payload_codec,
        "caller_workflow_instance_id" => caller.workflow_id,
        "caller_workflow_run_id" => caller.run_id,
        "wait_timeout_seconds" => op.wait_timeout_seconds,
        "metadata" => Value::Object(metadata),
        "idempotent_replay" => replay,
    );
    for (name, value) in &op.options {
        surface.insert(name.clone(), json!(value));
    }
    for (name, value) in &op.objects {
        surface.insert(name.clone(), Value::Object(value.clone()));
    }
    let now = iso8601(cx.now);
    let mut response = None;
    let mut failure = None;
    match admitted {
        Admitted::Started {
            workflow_id,
            run_id,
            binding_kind,
            target,
        } => {
            surface.extend(obj!(
                "status" => STATUS_STARTED,
                "outcome" => "accepted",
                "accepted" => true,
                "resolved_binding_kind" => *binding_kind,
                "resolved_target_reference" => target,
                "linked_workflow_instance_id" => workflow_id,
                "linked_workflow_run_id" => run_id,
                "accepted_at" => now,
                "started_at" => now,
            ));
        }
        Admitted::Ended(call) => {
            for key in [
                "status",
                "outcome",
                "outcome_reason",
                "reason",
                "resolved_binding_kind",
                "resolved_target_reference",
            ] {
                if let Some(value) = call.surface.get(key).filter(|v| !v.is_null()) {
                    surface.insert(key.into(), value.clone());
                }
            }
            for key in [
                "linked_workflow_instance_id",
                "linked_workflow_run_id",
                "completed_at",
                "failure_message",
            ] {
                if let Some(value) = call.surface.get(key).filter(|v| !v.is_null()) {
                    surface.insert(key.into(), value.clone());
                }
            }
            surface.insert("accepted".into(), json!(call.status == STATUS_COMPLETED));
            if call.status == STATUS_COMPLETED {
                response = call.response.clone();
            } else {
                let error_type = text(&call.surface, "caller_observed_error_type").unwrap_or("service_operation_failed");
                let message = text(&call.surface, "failure_message").unwrap_or("The service operation did not complete.");
                failure = Some((terminal_status(&call.status), error_type.to_string(), message.to_string()));
            }
        }
        Admitted::Failed {
            outcome,
            reason,
            message,
            binding_kind,
        } => {
            surface.extend(obj!(
                "status" => STATUS_FAILED,
                "outcome" => *outcome,
                "outcome_reason" => (*outcome == "rejected_not_found").then_some("unknown_target"),
                "reason" => reason,
                "accepted" => false,
                "resolved_binding_kind" => binding_kind,
                "completed_at" => now,
            ));
            failure = Some((STATUS_FAILED, reason.clone(), message.clone()));
        }
    }
    let mut row = obj!(
        "sequence" => (admission.step > 0).then_some(admission.step),
        "service_call_id" => admission.service_call_id,
        "workflow_instance_id" => caller.workflow_id,
        "workflow_run_id" => caller.run_id,
        "caller_workflow_instance_id" => caller.workflow_id,
        "caller_workflow_run_id" => caller.run_id,
        "caller_sdk_language" => op.metadata.get("caller_sdk_language").and_then(Value::as_str),
        "service_sdk_language" => op.metadata.get("service_sdk_language").and_then(Value::as_str),
        "endpoint_name" => op.endpoint_name,
        "service_name" => op.service_name,
        "operation_name" => op.operation_name,
        "target_namespace" => admission.route.namespace,
        "caller_namespace" => admission.caller_namespace,
        "idempotency_key" => admission.idempotency_key,
        "operation_mode" => admission.mode.as_str(),
        "wait_for" => admission.wait_for.as_str(),
        "payload_codec" => surface.get("payload_codec").cloned().unwrap_or(Value::Null),
        "request_payload" => op.request_payload,
    );
    for key in [
        "status",
        "outcome",
        "resolved_binding_kind",
        "resolved_target_reference",
        "linked_workflow_instance_id",
        "linked_workflow_run_id",
    ] {
        if let Some(value) = surface.get(key).filter(|v| !v.is_null()) {
            row.insert(key.into(), value.clone());
        }
    }
    surface.retain(|_, value| !value.is_null());
    row.insert("service_call".into(), Value::Object(surface));
    if let Some(output) = response {
        row.insert("response_payload".into(), output.envelope());
    }
    if let Some((status, error_type, message)) = failure {
        error_fields(&mut row, status, &error_type, &message);
    }
    row.retain(|_, value| !value.is_null());
    row
}

fn text<'m>(map: &'m Map<String, Value>, key: &str) -> Option<&'m str> {
    map.get(key).and_then(Value::as_str).filter(|s| !s.is_empty())
}

/// The call as the store keeps it: the row's surface, the caller and the linked run.
fn record(cx: &Cx, admission: &Admission, row: &Map<String, Value>, status: &str, admitted: &Admitted) -> ServiceCallRecord {
    let (linked_workflow_id, linked_run_id) = match admitted {
        Admitted::Started { workflow_id, run_id, .. } => (Some(workflow_id.clone()), Some(run_id.clone())),
        _ => (None, None),
    };
    let mut surface = row.get("service_call").and_then(Value::as_object).cloned().unwrap_or_default();
    surface.remove("idempotent_replay");
    if admission.step > 0 {
        surface.insert("sequence".into(), json!(admission.step));
    }
    surface.insert("request_payload".into(), admission.op.request_payload.clone());
    ServiceCallRecord {
        service_call_id: admission.service_call_id.clone(),
        route: (
            admission.route.namespace.clone(),
            admission.route.endpoint.clone(),
            admission.route.service.clone(),
            admission.route.operation.clone(),
        ),
        idempotency_key: admission.idempotency_key.clone(),
        caller_namespace: admission.caller_namespace.clone(),
        caller_workflow_id: admission.caller.workflow_id.clone(),
        caller_run_id: admission.caller.run_id.clone(),
        linked_workflow_id,
        linked_run_id,
        status: status.to_string(),
        created_at: cx.now,
        updated_at: cx.now,
        surface,
        response: None,
    }
}

/// The call's state once its linked run closed (the store writes it back).
pub fn settle_call(call: &mut ServiceCallRecord, closed: &LinkedRunClosed) {
    let (status, outcome) = closed.call_status();
    call.status = status.to_string();
    call.updated_at = closed.closed_at;
    call.surface.insert("status".into(), json!(status));
    call.surface.insert("outcome".into(), json!(outcome));
    call.surface.insert("completed_at".into(), json!(iso8601(closed.closed_at)));
    if status == STATUS_COMPLETED {
        call.response = Some(
            closed
                .output
                .clone()
                .unwrap_or_else(|| Payload::avro(crate::payload::AVRO_NULL_BLOB)),
        );
    } else {
        let (error_type, message) = closed.error();
        call.surface.insert("failure_message".into(), json!(message));
        call.surface.insert("caller_observed_error_type".into(), json!(error_type));
    }
}

/// A cancellation of an open call, as the end its waiting callers hear: `cancelled`, with the
/// reason (else DW's message) and `service_call_cancelled` as the error they observe.
pub fn cancelled_call(call: &ServiceCallRecord, reason: Option<String>, now: Millis) -> LinkedRunClosed {
    LinkedRunClosed {
        service_call_ids: vec![call.service_call_id.clone()],
        workflow_id: call.linked_workflow_id.clone().unwrap_or_else(|| WorkflowId(String::new())),
        run_id: call.linked_run_id.clone().unwrap_or_else(|| RunId(String::new())),
        status: RunStatus::Cancelled,
        closed_reason: Some(ClosedReason::Cancelled),
        output: None,
        failure: Some(WorkflowFailure {
            message: reason
                .filter(|r| !r.trim().is_empty())
                .unwrap_or_else(|| "Service operation cancelled.".into()),
            exception_type: Some("service_call_cancelled".into()),
            ..Default::default()
        }),
        closed_at: now,
    }
}

/// A linked run closed: the caller step waiting for it gets its one terminal row (same
/// identity as its Started row) and a workflow task. A caller that closed meanwhile, or no
/// longer waits at that step, takes no note.
pub fn resolve_service_call(caller: &mut RunState, cx: &mut Cx, waiter: &ServiceWaiter, closed: &LinkedRunClosed) -> bool {
    if caller.is_closed() {
        return false;
    }
    let Some(wait) = caller
        .service_waits
        .get(&waiter.sequence)
        .filter(|w| w.service_call_id == waiter.service_call_id)
        .cloned()
    else {
        return false;
    };
    caller.service_waits.remove(&waiter.sequence);
    let (status, outcome) = closed.call_status();
    let mut row = wait.started;
    row.insert("status".into(), json!(status));
    row.insert("outcome".into(), json!(outcome));
    if let Some(Value::Object(surface)) = row.get_mut("service_call") {
        surface.insert("status".into(), json!(status));
        surface.insert("outcome".into(), json!(outcome));
        surface.insert("completed_at".into(), json!(iso8601(closed.closed_at)));
    }
    let event_type = terminal_event(status);
    if status == STATUS_COMPLETED {
        let output = closed
            .output
            .clone()
            .unwrap_or_else(|| Payload::avro(crate::payload::AVRO_NULL_BLOB));
        row.insert("response_payload".into(), output.envelope());
        row.insert("payload_codec".into(), json!(output.codec));
    } else {
        let (error_type, message) = closed.error();
        error_fields(&mut row, status, &error_type, &message);
    }
    caller.append(cx, event_type, row, None, None);
    caller.want_workflow_task(cx, None);
    true
}
