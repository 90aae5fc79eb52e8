//! The Rust SDK's Nexus calls against Capstan: `call_nexus_service` on an operation whose
//! `start_workflow` binding starts a handler workflow resumes with the handler run's result;
//! an async call resumes at admission; a missing operation is a typed failure at the call
//! (`Error::NexusOperationFailed`), which the workflow catches. The Rust SDK sends the request
//! as a `{codec, blob}` envelope with null `namespace` and `idempotency_key`, and checks every
//! row of a call on replay (one identity across rows, its own caller ids, the request payload).

use super::*;
use durable_workflow::{NexusOperationMode, NexusServiceOptions, NexusWaitFor};

/// Registers `billing/invoicing/{operation}`, a sync operation whose `start_workflow` binding
/// starts `workflow_type` on `queue`.
async fn register_operation(server: &CapstanServer, operation: &str, workflow_type: &str, queue: &str) {
    let http = reqwest::Client::new();
    let operation = json!({"operation_name": operation, "operation_mode": "sync", "handler_binding_kind": "start_workflow",
                           "handler_binding": {"workflow_type": workflow_type, "queue": queue}});
    for (path, body) in [
        ("/service-endpoints", json!({"endpoint_name": "billing"})),
        ("/service-endpoints/billing/services", json!({"service_name": "invoicing"})),
        ("/service-endpoints/billing/services/invoicing/operations", operation),
    ] {
        let response = http
            .post(format!("{}/api{path}", server.base_url()))
            .header("X-Durable-Workflow-Control-Plane-Version", "2")
            .json(&body)
            .send()
            .await
            .expect("catalog request");
        assert_eq!(response.status(), 201, "{path}: {}", response.text().await.unwrap_or_default());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workflow_calls_an_operation_bound_to_a_workflow() {
    let server = CapstanServer::spawn().await;
    let queue = unique("nexus-q");
    register_operation(&server, "create", "e2e.nexus-invoice", &queue).await;

    let client = server.client();
    let mut worker = new_worker(&client, &queue);
    worker.register_workflow("e2e.nexus-invoice", |_ctx, input| async move {
        let amount = input.get(0).and_then(Value::as_i64).unwrap_or_default();
        Ok(json!({"invoice": amount * 2}))
    });
    worker.register_workflow("e2e.nexus-caller", |ctx, _input| async move {
        let done = ctx.call_nexus_service("billing", "invoicing", "create", json!([21])).await?;
        let options = NexusServiceOptions {
            mode: NexusOperationMode::Async,
            wait_for: NexusWaitFor::Accepted,
            ..NexusServiceOptions::new()
        };
        let started = ctx
            .call_nexus_service_with_options("billing", "invoicing", "create", options, json!([1]))
            .await?;
        let missing = match ctx.call_nexus_service("billing", "invoicing", "missing", json!([1])).await {
            Err(durable_workflow::Error::NexusOperationFailed(failure)) => json!([failure.status, failure.exception_type]),
            other => json!(format!("unexpected: {other:?}")),
        };
        Ok(json!({
            "done": serde_json::to_value(&done.result).unwrap_or_default(),
            "started": [started.status, started.linked_workflow_instance_id.is_some()],
            "missing": missing,
        }))
    });
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("nexus-caller");
    let handle = start(&client, "e2e.nexus-caller", &queue, &workflow_id, json!([])).await;
    let result = running.result(&handle).await.expect("the caller completes");
    assert_eq!(
        result,
        json!({"done": {"invoice": 42}, "started": ["started", true], "missing": ["failed", "operation_not_found"]})
    );
    let run_id = run_id_of(&handle).await;
    let types = server.history_event_types(&workflow_id, &run_id).await;
    let calls: Vec<&str> = types.iter().map(String::as_str).filter(|t| t.starts_with("ServiceCall")).collect();
    assert_eq!(
        calls,
        [
            "ServiceCallStarted",
            "ServiceCallCompleted",
            "ServiceCallStarted",
            "ServiceCallFailed"
        ],
        "{types:?}"
    );
    running.shutdown().await;
}

/// A Rust worker that opts into `nexus_cooperative_cancellation` (checked against the server's
/// advertised capability and binding kinds, and the registration's echo) has its run's
/// cooperative cancellation delivered at a waiting call: the call is cancelled, the run ends
/// cancelled, and the call's step records no row of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cooperative_cancellation_is_delivered_at_a_waiting_call() {
    let server = CapstanServer::spawn().await;
    let queue = unique("nexus-coop-q");
    register_operation(&server, "hang", "e2e.nexus-hang", &queue).await;

    let client = server.client();
    let mut worker = new_worker(&client, &queue)
        .cooperative_cancellation(true)
        .nexus_cooperative_cancellation(true);
    worker.register_workflow("e2e.nexus-hang", |ctx, _input| async move {
        ctx.sleep(Duration::from_secs(3600)).await?;
        Ok(json!("woke"))
    });
    worker.register_workflow("e2e.nexus-cancellable", |ctx, _input| async move {
        match ctx.call_nexus_service("billing", "invoicing", "hang", json!([1])).await {
            Ok(_) => Ok(json!("completed")),
            Err(Error::CooperativeCancellationRequested(_)) => Ok(json!("cleaned up")),
            Err(other) => Err(other),
        }
    });
    let mut running = RunningWorker::start(worker);
    let workflow_id = unique("nexus-cancellable");
    let handle = start(&client, "e2e.nexus-cancellable", &queue, &workflow_id, json!([])).await;
    let run_id = run_id_of(&handle).await;
    server
        .wait_for_history_event(&workflow_id, &run_id, "ServiceCallStarted", RESULT_TIMEOUT)
        .await;
    let options = durable_workflow::CooperativeCancellationOptions {
        reason: Some("stop".to_string()),
        cleanup_timeout_seconds: Some(60),
    };
    within(CALL_TIMEOUT, "request cancellation", handle.request_cancellation(options))
        .await
        .expect("request_cancellation");
    match running.result(&handle).await {
        Err(Error::WorkflowCancelled(_)) => {}
        other => panic!("expected Error::WorkflowCancelled, got {other:?}"),
    }
    let events = server.history_events(&workflow_id, &run_id).await;
    let delivered = events
        .iter()
        .find(|e| e["event_type"] == "CooperativeCancellationDelivered")
        .expect("delivered");
    assert_eq!(delivered["payload"]["call_kind"], "service_operation");
    let calls: Vec<&str> = events
        .iter()
        .filter_map(|e| e["event_type"].as_str())
        .filter(|t| t.starts_with("ServiceCall"))
        .collect();
    assert_eq!(calls, ["ServiceCallStarted"]);
    running.shutdown().await;
}
