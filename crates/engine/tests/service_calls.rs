//! Nexus calls from the caller's side: the row a call's admission records at its step, the
//! wait of a sync call and the one terminal row its linked run's end brings, the immediate
//! resumption of async calls, failures where both SDKs read them, and joining an earlier call.

mod support;

use capstan_engine::service_call::*;
use capstan_engine::*;
use serde_json::{json, Map};
use std::sync::Arc;
use support::*;

fn operation(mode: CallMode, wait_for: WaitFor, name: &str) -> ServiceOperation {
    ServiceOperation {
        endpoint_name: "Billing".into(),
        service_name: "invoicing".into(),
        operation_name: name.into(),
        request_payload: json!("req"),
        input: Payload::avro("req"),
        payload_codec: Some("avro".into()),
        metadata: json!({"caller_sdk_language": "sdk-python"}).as_object().cloned().unwrap(),
        target_namespace: None,
        caller_namespace: None,
        idempotency_key: Some(format!("key-{name}")),
        mode: Some(mode),
        wait_for: Some(wait_for),
        wait_timeout_seconds: None,
        options: Default::default(),
        objects: Default::default(),
        tags: Map::new(),
        observability_context: None,
    }
}

fn directory(earlier: Option<ServiceCallRecord>) -> Arc<ServiceDirectory> {
    let mut directory = ServiceDirectory::default();
    let binding = StartWorkflowBinding {
        workflow_type: "handler".into(),
        queue: Some("hq".into()),
        ..Default::default()
    };
    let route = RouteKey::new("default", "billing", "invoicing", "create");
    directory
        .routes
        .insert(route.clone(), ServiceRoute::StartWorkflow(Box::new(binding)));
    if let Some(call) = earlier {
        directory.calls.insert((route, call.idempotency_key.clone()), call);
    }
    Arc::new(directory)
}

/// Completes the run's next workflow task with one call; returns the transition's effects.
fn call(sim: &mut Sim, op: ServiceOperation, directory: Arc<ServiceDirectory>) -> Effects {
    let (task, fence) = sim.lease_workflow("w");
    let limits = sim.limits.clone();
    let mut cx = Cx::new(sim.now, &mut sim.ids, &limits);
    cx.services = Some(directory);
    complete_workflow_task(
        &mut sim.run,
        &mut cx,
        &task,
        "w",
        fence,
        vec![WorkflowCommand::StartServiceOperation(op)],
    )
    .unwrap();
    sim.history.extend(cx.effects.events.clone());
    cx.effects
}

fn workflow_task_ready(sim: &Sim) -> bool {
    sim.run.tasks.values().any(|t| t.kind == TaskKind::Workflow && t.is_ready())
}

#[test]
fn a_sync_call_waits_for_its_linked_run_and_gets_exactly_one_terminal_row() {
    let mut sim = Sim::start();
    let effects = call(&mut sim, operation(CallMode::Sync, WaitFor::Completed, "create"), directory(None));
    let started = sim.history.last().unwrap().clone();
    assert_eq!(started.event_type, EventType::ServiceCallStarted);
    let row = &started.payload;
    assert_eq!(row["sequence"], json!(1));
    assert_eq!(row["request_payload"], json!("req"), "kept as sent");
    assert_eq!(row["service_call"]["idempotency_key"], json!("key-create"));
    assert_eq!(row["caller_sdk_language"], json!("sdk-python"));
    assert!(row.get("exception_type").is_none());
    let (linked, _) = effects
        .service_runs_started
        .first()
        .cloned()
        .expect("the linked run starts with the call");
    assert_eq!((linked.namespace.as_str(), linked.task_queue.as_str()), ("default", "hq"));
    assert_eq!(row["linked_workflow_instance_id"], json!(linked.workflow_id));
    let call_id = row["service_call_id"].as_str().unwrap().to_string();
    assert_eq!(linked.service_call_ids, vec![call_id.clone()]);
    assert_eq!(effects.service_calls.len(), 1);
    assert_eq!(effects.service_waiters.len(), 1);
    assert!(!workflow_task_ready(&sim), "the sync call waits");

    let closed = LinkedRunClosed {
        service_call_ids: vec![call_id.clone()],
        workflow_id: linked.workflow_id.clone(),
        run_id: linked.run_id.clone(),
        status: RunStatus::Completed,
        closed_reason: Some(ClosedReason::Completed),
        output: Some(Payload::avro("out")),
        failure: None,
        closed_at: sim.now,
    };
    let waiter = effects.service_waiters[0].clone();
    assert!(sim.apply(|run, cx| Ok(resolve_service_call(run, cx, &waiter, &closed))).unwrap());
    let done = sim.history.last().unwrap();
    assert_eq!(done.event_type, EventType::ServiceCallCompleted);
    assert_eq!(done.payload["sequence"], json!(1));
    assert_eq!(done.payload["service_call_id"], json!(call_id));
    assert_eq!(done.payload["response_payload"], json!({"codec": "avro", "blob": "out"}));
    for field in [
        "endpoint_name",
        "operation_mode",
        "wait_for",
        "idempotency_key",
        "linked_workflow_run_id",
    ] {
        assert_eq!(done.payload[field], started.payload[field], "{field}");
    }
    assert!(workflow_task_ready(&sim), "the caller wakes");
    assert!(
        !sim.apply(|run, cx| Ok(resolve_service_call(run, cx, &waiter, &closed))).unwrap(),
        "a second notice records nothing"
    );
    assert_eq!(sim.count(EventType::ServiceCallCompleted), 1);
}

#[test]
fn a_failed_linked_run_fails_the_call_where_both_sdks_read_a_failure() {
    let mut sim = Sim::start();
    let effects = call(&mut sim, operation(CallMode::Sync, WaitFor::Completed, "create"), directory(None));
    let (linked, _) = effects.service_runs_started[0].clone();
    let closed = LinkedRunClosed {
        service_call_ids: linked.service_call_ids.clone(),
        workflow_id: linked.workflow_id.clone(),
        run_id: linked.run_id.clone(),
        status: RunStatus::Failed,
        closed_reason: Some(ClosedReason::Failed),
        output: None,
        failure: Some(WorkflowFailure {
            message: "no funds".into(),
            exception_type: Some("ValueError".into()),
            ..Default::default()
        }),
        closed_at: sim.now,
    };
    let waiter = effects.service_waiters[0].clone();
    sim.apply(|run, cx| Ok(resolve_service_call(run, cx, &waiter, &closed))).unwrap();
    let failed = &sim.history.last().unwrap().payload;
    assert_eq!(sim.history.last().unwrap().event_type, EventType::ServiceCallFailed);
    assert_eq!(
        (failed["exception_type"].clone(), failed["message"].clone()),
        (json!("ValueError"), json!("no funds"))
    );
    assert_eq!(failed["service_call"]["status"], json!("failed"));
    assert_eq!(failed["service_call"]["caller_observed_error_type"], json!("ValueError"));
    assert!(failed.get("response_payload").is_none());
}

#[test]
fn async_and_accepted_calls_resume_at_admission_and_never_wait() {
    for (mode, wait_for) in [(CallMode::Async, WaitFor::Accepted), (CallMode::Sync, WaitFor::Accepted)] {
        let mut sim = Sim::start();
        let effects = call(&mut sim, operation(mode, wait_for, "create"), directory(None));
        assert_eq!(sim.history.last().unwrap().event_type, EventType::ServiceCallStarted);
        assert!(effects.service_waiters.is_empty() && sim.run.service_waits.is_empty());
        assert!(workflow_task_ready(&sim), "{mode:?}/{wait_for:?} resumes at once");
    }
}

#[test]
fn misses_and_unserved_bindings_are_failed_rows_and_the_workflow_resumes() {
    let mut sim = Sim::start();
    let effects = call(&mut sim, operation(CallMode::Sync, WaitFor::Completed, "missing"), directory(None));
    let row = &sim.history.last().unwrap().payload;
    assert_eq!(sim.history.last().unwrap().event_type, EventType::ServiceCallFailed);
    assert_eq!(row["service_call"]["outcome"], json!("rejected_not_found"));
    assert_eq!(row["service_call"]["reason"], json!("endpoint_not_found"));
    assert_eq!(row["exception_type"], json!("endpoint_not_found"));
    assert!(row["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(effects.service_runs_started.is_empty());
    assert_eq!(effects.service_calls.len(), 1, "the failed call is recorded");
    assert!(workflow_task_ready(&sim));

    let mut unserved = ServiceDirectory::default();
    let route = RouteKey::new("default", "billing", "invoicing", "ping");
    unserved.routes.insert(
        route,
        ServiceRoute::Unserved {
            binding_kind: "invocable_http".into(),
            operation_mode: None,
        },
    );
    call(&mut sim, operation(CallMode::Sync, WaitFor::Completed, "ping"), Arc::new(unserved));
    let row = &sim.history.last().unwrap().payload;
    assert_eq!(row["service_call"]["outcome"], json!("handler_unavailable"));
    assert_eq!(row["sequence"], json!(2));
}

#[test]
fn a_key_already_admitted_joins_that_call_without_a_second_linked_run() {
    let mut first = Sim::start();
    let effects = call(&mut first, operation(CallMode::Sync, WaitFor::Completed, "create"), directory(None));
    let record = effects.service_calls[0].clone();
    let mut second = Sim::start();
    let joined = call(
        &mut second,
        operation(CallMode::Sync, WaitFor::Completed, "create"),
        directory(Some(record.clone())),
    );
    assert!(joined.service_runs_started.is_empty() && joined.service_calls.is_empty());
    let row = &second.history.last().unwrap().payload;
    assert_eq!(row["service_call_id"], json!(record.service_call_id));
    assert_eq!(row["service_call"]["idempotent_replay"], json!(true));
    assert_eq!(joined.service_waiters.len(), 1, "the joining step waits on the same call");

    let mut ended = record;
    ended.status = STATUS_COMPLETED.into();
    ended.response = Some(Payload::avro("out"));
    let mut third = Sim::start();
    call(
        &mut third,
        operation(CallMode::Sync, WaitFor::Completed, "create"),
        directory(Some(ended)),
    );
    let row = &third.history.last().unwrap();
    assert_eq!(
        row.event_type,
        EventType::ServiceCallCompleted,
        "an ended call answers with its end"
    );
    assert_eq!(row.payload["response_payload"], json!({"codec": "avro", "blob": "out"}));
    assert!(workflow_task_ready(&third));
}

#[test]
fn a_cooperative_cancellation_delivered_at_a_waiting_call_cancels_it_without_a_row() {
    let mut sim = Sim::start();
    call(&mut sim, operation(CallMode::Sync, WaitFor::Completed, "create"), directory(None));
    let call_id = sim.run.service_waits[&1].service_call_id.clone();
    sim.apply(|run, cx| request_cancellation(run, cx, Some("stop".into()), 60, "req-1".into()))
        .unwrap();
    let (task, fence) = sim.lease_workflow("w");
    let delivery = DeliveryRequest {
        request_id: "req-1".into(),
        sequence: 1,
        call_kind: "service_operation".into(),
        sequence_span: 1,
        operation_sequence: None,
        operation_sequence_span: 1,
    };
    let limits = sim.limits.clone();
    let mut cx = Cx::new(sim.now, &mut sim.ids, &limits);
    let outcome = deliver_cancellation(&mut sim.run, &mut cx, &task, "w", fence, delivery.clone()).unwrap();
    assert!(matches!(outcome, DeliveryOutcome::Delivered(_)));
    assert_eq!(cx.effects.service_cancels, vec![call_id]);
    let types: Vec<_> = cx.effects.events.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        ["CooperativeCancellationDelivered"],
        "no row at the call: the delivery is its end"
    );
    assert!(sim.run.service_waits.is_empty());

    // A call kind that does not fit the recorded step is refused.
    let mut other = Sim::start();
    other.complete_workflow("w", vec![timer_command(60)]).unwrap();
    other
        .apply(|run, cx| request_cancellation(run, cx, None, 60, "req-2".into()))
        .unwrap();
    let (task, fence) = other.lease_workflow("w");
    let wrong = DeliveryRequest {
        request_id: "req-2".into(),
        ..delivery
    };
    let refused = other.apply(|run, cx| deliver_cancellation(run, cx, &task, "w", fence, wrong));
    assert_eq!(refused.unwrap_err().reason, Reason::CancellationDeliveryShapeMismatch);
}

#[test]
fn two_calls_with_one_key_in_one_completion_are_one_call() {
    let mut sim = Sim::start();
    let (task, fence) = sim.lease_workflow("w");
    let limits = sim.limits.clone();
    let mut cx = Cx::new(sim.now, &mut sim.ids, &limits);
    cx.services = Some(directory(None));
    let op = || WorkflowCommand::StartServiceOperation(operation(CallMode::Async, WaitFor::Accepted, "create"));
    complete_workflow_task(&mut sim.run, &mut cx, &task, "w", fence, vec![op(), op()]).unwrap();
    assert_eq!(cx.effects.service_calls.len(), 1, "one admission of the key");
    assert_eq!(cx.effects.service_runs_started.len(), 1, "one linked run");
    let ids: Vec<_> = cx
        .effects
        .events
        .iter()
        .filter(|e| e.event_type == EventType::ServiceCallStarted)
        .map(|e| e.payload["service_call_id"].clone())
        .collect();
    assert_eq!(ids.len(), 2);
    assert_eq!(ids[0], ids[1]);
}
