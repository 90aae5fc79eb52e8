//! Trace context over HTTP on every backend: the capability exactly as the SDKs validate it, a
//! run's origin carrier (from its start, its parent's child command or the continue-as-new that
//! made it) handed back on its tasks, and malformed carriers refused by name.

use super::*;

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const CHILD: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
const NEXT: &str = "00-0af7651916cd43dd8448eb211c80319c-b9c7c989f97918e1-01";

fn carrier(traceparent: &str) -> Value {
    json!({"schema": "durable-workflow.trace-context", "version": 1,
           "carrier": {"traceparent": traceparent, "tracestate": "vendor=a/b"}})
}

#[tokio::test]
async fn the_capability_is_advertised_exactly_as_the_sdks_check_it() {
    let h = Harness::start().await;
    let info = send(h.bare(Method::GET, "/api/cluster/info")).await.ok(200);
    let capability = &info["worker_protocol"]["server_capabilities"]["observability_context"];
    assert_eq!(
        *capability,
        json!({"supported": true, "schema": "durable-workflow.trace-context", "version": 1,
               "dispatch_schema": "durable-workflow.queue-trace", "links_schema": "durable-workflow.trace-links",
               "max_context_bytes": 4096, "max_links": 32, "max_links_bytes": 4096})
    );
    assert!(capability["version"].is_u64() && capability["max_links"].is_u64());
}

#[tokio::test]
async fn a_runs_origin_carrier_comes_back_on_its_tasks_and_moves_with_children_and_continue_as_new() {
    let h = Harness::start().await;
    let queue = unique("trace-q");
    let workflow_id = unique("trace");
    h.register("trace-w", &queue).await;
    h.start_workflow_with(
        json!({"workflow_id": workflow_id, "workflow_type": "test.workflow", "task_queue": queue,
        "input": env(EMPTY_ARGS), "observability_context": carrier(PARENT)}),
    )
    .await
    .ok(201);
    let task = h.next_workflow_task("trace-w", &queue).await;
    assert_eq!(task["observability_context"], carrier(PARENT));
    let child_id = unique("trace-child");
    let commands = json!([
        {"type": "schedule_activity", "activity_type": "a", "arguments": env(EMPTY_ARGS)},
        {"type": "start_child_workflow", "workflow_type": "test.child", "workflow_id": child_id,
         "observability_context": carrier(CHILD)},
    ]);
    h.complete_workflow_task(&task, commands).await.ok(200);
    let activity = h.next_activity_task("trace-w", &queue).await;
    assert_eq!(
        activity["observability_context"],
        carrier(PARENT),
        "an activity task carries its run's origin"
    );
    let child_task = h.next_workflow_task("trace-w", &queue).await;
    assert_eq!(child_task["workflow_id"], child_id.as_str());
    assert_eq!(
        child_task["observability_context"],
        carrier(CHILD),
        "a child run's origin is its command's carrier"
    );
    let continued = json!([{"type": "continue_as_new", "arguments": env(EMPTY_ARGS), "observability_context": carrier(NEXT)}]);
    h.complete_workflow_task(&child_task, continued).await.ok(200);
    let next_task = h.next_workflow_task("trace-w", &queue).await;
    assert_eq!(next_task["workflow_id"], child_id.as_str());
    assert_ne!(next_task["run_id"], child_task["run_id"]);
    assert_eq!(next_task["observability_context"], carrier(NEXT));
    // Without a carrier, a task has no field at all (a null reads as malformed to the SDKs).
    h.start_workflow(&unique("untraced"), &queue).await;
    let plain = h.next_workflow_task("trace-w", &queue).await;
    assert!(plain.get("observability_context").is_none(), "{plain}");
}

#[tokio::test]
async fn malformed_carriers_are_refused_by_name() {
    let h = Harness::start().await;
    let start = |context: Value| {
        json!({"workflow_type": "test.workflow", "task_queue": "q", "input": env(EMPTY_ARGS),
                                        "observability_context": context})
    };
    let mut extra = carrier(PARENT);
    extra["more"] = json!(true);
    let mut upper = carrier(PARENT);
    upper["carrier"]["traceparent"] = json!(PARENT.to_uppercase());
    let mut slashes = carrier(PARENT);
    slashes["carrier"]["baggage"] = json!("/".repeat(2048));
    let mut float = carrier(PARENT);
    float["version"] = json!(1.0);
    for bad in [extra, upper, slashes, float, json!("00-…")] {
        let refused = h.start_workflow_with(start(bad.clone())).await.err(422, "validation_failed");
        assert!(refused["errors"].get("observability_context").is_some(), "{bad}: {refused}");
    }
    // Only child starts and continue-as-new carry one among the commands.
    let (_, task) = h.started_and_leased(&unique("trace-cmd"), "w", "q").await;
    let timer = json!([{"type": "start_timer", "delay_seconds": 1, "observability_context": carrier(PARENT)}]);
    let refused = h.complete_workflow_task(&task, timer).await.err(422, "validation_failed");
    assert!(refused["errors"].get("commands.0.observability_context").is_some(), "{refused}");
}

#[tokio::test]
async fn a_signal_update_or_cancel_carrier_is_recorded_on_the_event_it_causes() {
    let h = Harness::start().await;
    let workflow_id = unique("trace-cmd");
    let (start, task) = h.started_and_leased(&workflow_id, "w", "q").await;
    let run_id = start["run_id"].as_str().unwrap().to_string();
    h.complete_workflow_task(&task, json!([{"type": "start_timer", "delay_seconds": 3600}]))
        .await
        .ok(200);
    h.cpost(
        &format!("/api/workflows/{workflow_id}/signal/go"),
        json!({"observability_context": carrier(CHILD)}),
    )
    .await
    .ok(202);
    h.cpost(
        &format!("/api/workflows/{workflow_id}/cancel"),
        json!({"observability_context": carrier(NEXT)}),
    )
    .await
    .ok(200);
    let history = h.history(&workflow_id, &run_id).await;
    let recorded = |event_type: &str| {
        history
            .iter()
            .find(|e| e["event_type"] == event_type)
            .map(|e| e["payload"]["observability_context"].clone())
            .unwrap_or_else(|| panic!("no {event_type}"))
    };
    assert_eq!(recorded("SignalReceived"), carrier(CHILD));
    assert_eq!(recorded("CancelRequested"), carrier(NEXT));
    let mut bad = carrier(CHILD);
    bad["version"] = json!(2);
    let refused = h
        .cpost(
            &format!("/api/workflows/{}/signal/go", unique("nobody")),
            json!({"observability_context": bad}),
        )
        .await
        .err(422, "validation_failed");
    assert!(refused["errors"].get("observability_context").is_some(), "{refused}");
}

#[tokio::test]
async fn the_workflow_task_that_delivers_a_signal_or_update_links_its_carrier_once() {
    let h = Harness::start().await;
    let queue = unique("links-q");
    let workflow_id = unique("links");
    let (start, task) = h.started_and_leased(&workflow_id, "links-w", &queue).await;
    assert!(task.get("observability_links").is_none(), "{task}");
    // Sent while the first task is leased: recorded (and linked) when that lease ends.
    let mut with_baggage = carrier(CHILD);
    with_baggage["carrier"]["baggage"] = json!("user=alice");
    h.cpost(
        &format!("/api/workflows/{workflow_id}/signal/go"),
        json!({"observability_context": with_baggage}),
    )
    .await
    .ok(202);
    h.complete_workflow_task(&task, json!([{"type": "start_timer", "delay_seconds": 3600}]))
        .await
        .ok(200);
    let next = h.next_workflow_task("links-w", &queue).await;
    assert!(
        next.get("dispatch_observability_context").is_none(),
        "no OTLP endpoint, no span: a dispatch context would name nothing"
    );
    let history = h.history(&workflow_id, start["run_id"].as_str().unwrap()).await;
    let signal = history.iter().find(|e| e["event_type"] == "SignalReceived").expect("signal");
    let links = &next["observability_links"];
    assert_eq!(
        *links,
        json!({"schema": "durable-workflow.trace-links", "version": 1, "task_id": next["task_id"],
               "run_id": start["run_id"], "namespace": "default",
               "links": [{"kind": "command", "command_id": signal["workflow_command_id"],
                          "context": carrier(CHILD)}]}),
        "baggage never rides on a link"
    );
    h.complete_workflow_task(&next, json!([{"type": "start_timer", "delay_seconds": 3600}]))
        .await
        .ok(200);
    // A second signal: the next task links it alone, the first one was seen.
    h.cpost(
        &format!("/api/workflows/{workflow_id}/signal/again"),
        json!({"observability_context": carrier(NEXT)}),
    )
    .await
    .ok(202);
    let third = h.next_workflow_task("links-w", &queue).await;
    let links = third["observability_links"]["links"].as_array().expect("links");
    assert_eq!(links.len(), 1, "{third}");
    assert_eq!(links[0]["context"], carrier(NEXT));
    // A failed task is offered again with the same links.
    let failed_report = h
        .wpost(
            &format!("/api/worker/workflow-tasks/{}/fail", third["task_id"].as_str().unwrap()),
            json!({"lease_owner": third["lease_owner"], "workflow_task_attempt": third["workflow_task_attempt"],
               "failure": {"message": "boom", "type": "RuntimeError"}}),
        )
        .await;
    assert!(failed_report.status.is_success(), "{}", failed_report.body);
    let retried = wait_for("the retried task", Duration::from_secs(30), || async {
        let task = h.poll_workflow("links-w", &queue, 2).await;
        task.is_object().then_some(task)
    })
    .await;
    assert_eq!(retried["observability_links"]["links"], json!(links), "{retried}");
}

#[tokio::test]
async fn links_stay_within_the_bounds_past_which_an_sdk_drops_them_all() {
    let h = Harness::start().await;
    let queue = unique("links-bound-q");
    let workflow_id = unique("links-bound");
    let (_, task) = h.started_and_leased(&workflow_id, "links-bound-w", &queue).await;
    h.complete_workflow_task(&task, json!([{"type": "start_timer", "delay_seconds": 3600}]))
        .await
        .ok(200);
    for i in 0..40 {
        let mut context = carrier(PARENT);
        context["carrier"]["tracestate"] = json!(format!("k{i}=v"));
        h.cpost(
            &format!("/api/workflows/{workflow_id}/signal/s{i}"),
            json!({"observability_context": context}),
        )
        .await
        .ok(202);
    }
    let next = h.next_workflow_task("links-bound-w", &queue).await;
    let links = next["observability_links"]["links"].as_array().expect("links");
    assert!(!links.is_empty() && links.len() <= 32, "{}", links.len());
    let size = capstan_engine::trace::dw_json_size(&next["observability_links"]);
    assert!(size <= 4096, "{size}");
    // The newest are kept.
    assert_eq!(links.last().unwrap()["context"]["carrier"]["tracestate"], "k39=v");
}
