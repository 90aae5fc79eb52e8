//! Nexus calls in the workload: programs call the catalog operation `sim/calls/child` (a
//! `start_workflow` binding of the child type) synchronously (the step waits for the linked
//! run's end) or asynchronously (it resumes at admission). Per run, each call's step holds at
//! most one `ServiceCallStarted` and at most one terminal row, and an async or accepted call
//! never gets a terminal row (checked in `check_service_calls`); liveness at the end checks
//! that every waiting step was resolved.

use crate::report::Failure;
use crate::workload::{CHILD_TYPE, NAMESPACE, PAYLOAD, QUEUE};
use crate::world::World;
use capstan_app::catalog;
use capstan_engine::service_call::{CallMode, ServiceOperation, WaitFor};
use capstan_engine::{EventType, HistoryEvent, Payload, WorkflowCommand};
use capstan_store::CatalogKey;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

pub(crate) const ENDPOINT: &str = "sim";
pub(crate) const SERVICE: &str = "calls";
pub(crate) const OPERATION: &str = "child";

/// Registers the operation the programs call (at set-up).
pub(crate) async fn register_operation(world: &World) -> Result<(), Failure> {
    let key = |service: Option<&str>, operation: Option<&str>| CatalogKey {
        namespace: NAMESPACE.into(),
        endpoint: ENDPOINT.into(),
        service: service.map(str::to_string),
        operation: operation.map(str::to_string),
    };
    let binding = json!({"operation_mode": "sync", "handler_binding_kind": "start_workflow",
                         "handler_binding": {"workflow_type": CHILD_TYPE, "queue": QUEUE}});
    for (key, doc) in [
        (key(None, None), json!({})),
        (key(Some(SERVICE), None), json!({})),
        (key(Some(SERVICE), Some(OPERATION)), binding),
    ] {
        catalog::create_entry(&world.app, key, doc.as_object().cloned().unwrap_or_default())
            .await
            .map_err(|e| world.fail(format!("registering the operation: {e}")))?;
    }
    Ok(())
}

/// Each call's rows in one run's history, by step.
pub(crate) fn check_service_calls(world: &World, run_id: &str, events: &[HistoryEvent]) -> Result<(), Failure> {
    for (sequence, rows) in calls_by_step(events) {
        let started = rows.iter().filter(|e| e.event_type == EventType::ServiceCallStarted).count();
        let terminal = rows.len() - started;
        let resumes_on_start = rows.first().is_some_and(|first| resumes_at_admission(&first.payload));
        let ordered = started == 0 || rows[0].event_type == EventType::ServiceCallStarted;
        if started > 1 || terminal > 1 || !ordered || (started == 1 && resumes_on_start && terminal > 0) {
            let types: Vec<&str> = rows.iter().map(|e| e.event_type.as_str()).collect();
            return Err(world.fail(format!("{run_id}: service call at step {sequence} recorded {types:?}")));
        }
    }
    Ok(())
}

/// The `ServiceCall*` rows of a history, grouped by their step.
fn calls_by_step(events: &[HistoryEvent]) -> BTreeMap<u64, Vec<&HistoryEvent>> {
    let mut calls: BTreeMap<u64, Vec<&HistoryEvent>> = BTreeMap::new();
    for event in events.iter().filter(|e| e.event_type.as_str().starts_with("ServiceCall")) {
        let sequence = event.payload.get("sequence").and_then(Value::as_u64).unwrap_or(0);
        calls.entry(sequence).or_default().push(event);
    }
    calls
}

/// An async call, or one waiting only for acceptance, resumes on its Started row.
fn resumes_at_admission(row: &Map<String, Value>) -> bool {
    row.get("operation_mode").and_then(Value::as_str) == Some("async") || row.get("wait_for").and_then(Value::as_str) == Some("accepted")
}

/// How many of a history's calls were admitted, and how many the workflow may go past.
pub(crate) fn call_progress(history: &[HistoryEvent]) -> (usize, usize) {
    let calls = calls_by_step(history);
    let resolved = calls
        .values()
        .filter(|rows| rows.len() > 1 || rows[0].event_type != EventType::ServiceCallStarted || resumes_at_admission(&rows[0].payload))
        .count();
    (calls.len(), resolved)
}

/// A program's call of the sim operation.
pub(crate) fn call(mode: CallMode) -> WorkflowCommand {
    WorkflowCommand::StartServiceOperation(ServiceOperation {
        endpoint_name: ENDPOINT.into(),
        service_name: SERVICE.into(),
        operation_name: OPERATION.into(),
        request_payload: Value::String(PAYLOAD.into()),
        input: Payload::avro(PAYLOAD),
        payload_codec: Some("avro".into()),
        metadata: Map::new(),
        target_namespace: None,
        caller_namespace: None,
        idempotency_key: None,
        mode: Some(mode),
        wait_for: Some(match mode {
            CallMode::Sync => WaitFor::Completed,
            CallMode::Async => WaitFor::Accepted,
        }),
        wait_timeout_seconds: None,
        options: Default::default(),
        objects: Default::default(),
        tags: Map::new(),
        observability_context: None,
    })
}
