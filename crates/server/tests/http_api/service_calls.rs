//! `start_service_operation` on every backend: its fields checked by name, the Rust SDK's form
//! (an envelope request, null `namespace` and `idempotency_key`) admitted with the server's
//! default key, the request kept verbatim, the linked run started on the binding's queue, and the
//! one terminal row the waiting step gets when the linked run completes.

use super::*;

async fn register_operation(h: &Harness, queue: &str) {
    h.cpost("/api/service-endpoints", json!({"endpoint_name": "billing"})).await.ok(201);
    h.cpost("/api/service-endpoints/billing/services", json!({"service_name": "invoicing"}))
        .await
        .ok(201);
    let operation = json!({"operation_name": "create", "operation_mode": "sync", "handler_binding_kind": "start_workflow",
        "handler_binding": {"workflow_type": "test.handler", "queue": queue}});
    h.cpost("/api/service-endpoints/billing/services/invoicing/operations", operation)
        .await
        .ok(201);
}

fn call(extra: Value) -> Value {
    let mut command = json!({"type": "start_service_operation", "endpoint_name": "billing", "service_name": "invoicing",
        "operation_name": "create", "request_payload": {"codec": "avro", "blob": EMPTY_ARGS}, "payload_codec": "avro",
        "metadata": {"caller_sdk_language": "sdk-rust"}, "namespace": null, "idempotency_key": null,
        "mode_override": "sync", "wait_for": "completed"});
    for (key, value) in extra.as_object().unwrap() {
        command[key] = value.clone();
    }
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_call_starts_its_linked_run_and_gets_one_terminal_row() {
    let h = Harness::start().await;
    let handlers = unique("handlers");
    register_operation(&h, &handlers).await;
    let caller = unique("caller");
    let (start, task) = h.started_and_leased(&caller, "w1", &unique("callers")).await;
    let run_id = start["run_id"].as_str().unwrap().to_string();

    for (bad, field) in [
        (call(json!({"colour": "blue"})), "commands.0.colour"),
        (call(json!({"mode_override": "later"})), "commands.0.mode_override"),
        (call(json!({"wait_for": "never"})), "commands.0.wait_for"),
        (call(json!({"endpoint_name": "bad name"})), "commands.0.endpoint_name"),
        (
            call(json!({"duplicate_start_policy": "maybe"})),
            "commands.0.duplicate_start_policy",
        ),
        (call(json!({"request_payload": null})), "commands.0.request_payload"),
    ] {
        let body = h.complete_workflow_task(&task, json!([bad])).await.err(422, "validation_failed");
        assert!(body["errors"].get(field).is_some(), "{field}: {body}");
    }
    h.complete_workflow_task(&task, json!([call(json!({}))])).await.ok(200);
    let history = h.history(&caller, &run_id).await;
    let started: Vec<_> = history.iter().filter(|e| e["event_type"] == "ServiceCallStarted").collect();
    assert_eq!(started.len(), 1);
    let row = &started[0]["payload"];
    assert_eq!(row["sequence"], 1);
    assert_eq!(
        row["request_payload"],
        json!({"codec": "avro", "blob": EMPTY_ARGS}),
        "kept verbatim"
    );
    assert_eq!(
        row["service_call"]["idempotency_key"],
        json!(format!("workflow-service-operation:{caller}:{run_id}:1"))
    );
    assert_eq!(row["service_call"]["target_namespace"], "default");
    assert_eq!(
        (row["operation_mode"].as_str(), row["wait_for"].as_str()),
        (Some("sync"), Some("completed"))
    );
    let linked = row["linked_workflow_instance_id"].as_str().expect("linked run").to_string();

    // The handler run is on the binding's queue, with the request as its input.
    h.register("w2", &handlers).await;
    let handler = h.next_workflow_task("w2", &handlers).await;
    assert_eq!(handler["workflow_id"], linked.as_str());
    assert_eq!(handler["workflow_type"], "test.handler");
    h.complete_workflow_task(&handler, json!([complete_workflow(AVRO_NULL)]))
        .await
        .ok(200);

    let history = h.history(&caller, &run_id).await;
    let rows: Vec<_> = history
        .iter()
        .filter(|e| e["event_type"].as_str().unwrap().starts_with("ServiceCall"))
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    let done = &rows[1]["payload"];
    assert_eq!(rows[1]["event_type"], "ServiceCallCompleted");
    assert_eq!(done["sequence"], 1);
    assert_eq!(done["service_call_id"], row["service_call_id"]);
    assert_eq!(done["response_payload"], json!({"codec": "avro", "blob": AVRO_NULL}));
    assert_eq!(done["service_call"]["status"], "completed");
    assert!(done.get("exception_type").is_none(), "a completed row carries no error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_execute_route_admits_calls_and_answers_refusals_with_409() {
    let h = Harness::start().await;
    let handlers = unique("handlers");
    register_operation(&h, &handlers).await;
    let execute = "/api/service-endpoints/billing/services/invoicing/operations/create/execute";
    h.cpost(execute, json!({"arguments": EMPTY_ARGS, "colour": 1}))
        .await
        .err(422, "validation_failed");
    h.cpost(execute, json!({"arguments": EMPTY_ARGS, "caller_workflow_run_id": "x".repeat(27)}))
        .await
        .err(422, "validation_failed");
    h.cpost(execute, json!({})).await.err(422, "validation_failed");
    let body = json!({"arguments": EMPTY_ARGS, "payload_codec": "avro", "idempotency_key": "k1", "mode_override": "async"});
    let call = h.cpost(execute, body.clone()).await.ok(200);
    assert_eq!((call["status"].as_str(), call["accepted"].as_bool()), (Some("started"), Some(true)));
    let id = call["id"].as_str().unwrap().to_string();
    assert_eq!(call["service_call_id"], id.as_str());
    let again = h.cpost(execute, body).await.ok(200);
    assert_eq!(
        (again["id"].as_str(), again["idempotent_replay"].as_bool()),
        (Some(id.as_str()), Some(true))
    );

    let missing = h
        .cpost(
            "/api/service-endpoints/billing/services/invoicing/operations/nope/execute",
            json!({"arguments": EMPTY_ARGS}),
        )
        .await
        .err(409, "operation_not_found");
    assert_eq!(
        (missing["status"].as_str(), missing["outcome"].as_str()),
        (Some("failed"), Some("rejected_not_found"))
    );

    let described = h
        .cget(&format!(
            "/api/service-endpoints/billing/services/invoicing/operations/create/service-calls/{id}"
        ))
        .await
        .ok(200);
    assert_eq!(described["linked_workflow_instance_id"], call["linked_workflow_instance_id"]);
    h.cget(&format!(
        "/api/service-endpoints/billing/services/invoicing/operations/other/service-calls/{id}"
    ))
    .await
    .err(404, "service_call_not_found");
    h.cget("/api/workflows/someone/nexus-operations?limit=0")
        .await
        .err(422, "validation_failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_reaches_its_waiting_caller_and_by_policy_its_linked_run() {
    let h = Harness::start().await;
    let handlers = unique("handlers");
    register_operation(&h, &handlers).await;
    let operation = json!({"operation_name": "charge", "operation_mode": "sync", "handler_binding_kind": "start_workflow",
        "handler_binding": {"workflow_type": "test.handler", "queue": handlers},
        "cancellation_policy": {"propagate_to_linked_workflow": true}});
    h.cpost("/api/service-endpoints/billing/services/invoicing/operations", operation)
        .await
        .ok(201);
    let caller = unique("caller");
    let (start, task) = h.started_and_leased(&caller, "w1", &unique("callers")).await;
    let run_id = start["run_id"].as_str().unwrap().to_string();
    h.complete_workflow_task(&task, json!([call(json!({"operation_name": "charge"}))]))
        .await
        .ok(200);
    let history = h.history(&caller, &run_id).await;
    let started = &history.iter().find(|e| e["event_type"] == "ServiceCallStarted").unwrap()["payload"];
    let id = started["service_call_id"].as_str().unwrap().to_string();
    let linked = started["linked_workflow_instance_id"].as_str().unwrap().to_string();

    let calls = "/api/service-endpoints/billing/services/invoicing/operations";
    h.cpost(&format!("{calls}/create/service-calls/{id}/cancel"), json!({}))
        .await
        .err(404, "service_call_not_found");
    h.cpost(&format!("{calls}/charge/service-calls/{id}/cancel"), json!({"why": "x"}))
        .await
        .err(422, "validation_failed");
    let cancelled = h
        .cpost(
            &format!("{calls}/charge/service-calls/{id}/cancel"),
            json!({"reason": "changed my mind"}),
        )
        .await
        .ok(200);
    assert_eq!(
        (cancelled["status"].as_str(), cancelled["outcome"].as_str()),
        (Some("cancelled"), Some("cancelled"))
    );
    h.cpost(&format!("{calls}/charge/service-calls/{id}/cancel"), json!({}))
        .await
        .err(409, "service_call_terminal");

    let history = h.history(&caller, &run_id).await;
    let rows: Vec<_> = history.iter().filter(|e| e["event_type"] == "ServiceCallCancelled").collect();
    assert_eq!(rows.len(), 1, "the waiting step hears of it once");
    let row = &rows[0]["payload"];
    assert_eq!(
        (row["exception_type"].as_str(), row["message"].as_str()),
        (Some("service_call_cancelled"), Some("changed my mind"))
    );
    assert_eq!(row["service_call"]["status"], "cancelled");
    assert_eq!(
        h.describe(&linked).await["status"],
        "cancelled",
        "the policy propagates to the linked run"
    );
    let queue = h.describe(&caller).await["task_queue"].as_str().unwrap().to_string();
    let caller_task = h.next_workflow_task("w1", &queue).await;
    assert_eq!(caller_task["workflow_id"], caller.as_str(), "the caller is woken");

    // Without the policy, the call ends and its linked run goes on.
    let execute = format!("{calls}/create/execute");
    let direct = h
        .cpost(&execute, json!({"arguments": EMPTY_ARGS, "mode_override": "async"}))
        .await
        .ok(200);
    let direct_id = direct["id"].as_str().unwrap();
    h.cpost(&format!("{calls}/create/service-calls/{direct_id}/cancel"), json!({}))
        .await
        .ok(200);
    let linked = direct["linked_workflow_instance_id"].as_str().unwrap();
    assert_eq!(h.describe(linked).await["status"], "pending");
}
