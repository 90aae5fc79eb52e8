//! Priority and fairness over HTTP on every backend: what a start may ask for, what a worker is
//! handed first, the queue's priority-fairness view and the advertised contract.

use super::*;

fn start_body(workflow_id: &str, queue: &str, extra: Value) -> Value {
    let mut body = json!({"workflow_id": workflow_id, "workflow_type": "test.workflow", "task_queue": queue,
        "input": env(EMPTY_ARGS), "execution_timeout_seconds": 3600, "run_timeout_seconds": 600});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_asks_for_a_priority_and_fairness_class_within_the_contract() {
    let h = Harness::start().await;
    let queue = unique("prio-q");
    for (extra, field, message) in [
        (
            json!({"priority": 10}),
            "priority",
            "The priority field must be an integer in the range 0..9 (lower runs first).",
        ),
        (
            json!({"priority": -1}),
            "priority",
            "The priority field must be an integer in the range 0..9 (lower runs first).",
        ),
        (json!({"priority": "high"}), "priority", ""),
        (
            json!({"fairness_weight": 0}),
            "fairness_weight",
            "The fairness_weight field must be an integer in the range 1..1000.",
        ),
        (
            json!({"fairness_weight": 1001}),
            "fairness_weight",
            "The fairness_weight field must be an integer in the range 1..1000.",
        ),
        (json!({"fairness_key": "tenant a/spaces"}), "fairness_key", ""),
        (
            json!({"fairness_key": 7}),
            "fairness_key",
            "The fairness_key field must be a string.",
        ),
    ] {
        let refused = h.start_workflow_with(start_body(&unique("prio"), &queue, extra.clone())).await;
        let body = refused.err(422, "validation_failed");
        assert!(body["errors"][field].is_array(), "{extra}: {body}");
        if !message.is_empty() {
            assert_eq!(body["errors"][field][0], message, "{extra}");
        }
    }
    let id = unique("prio-ok");
    h.start_workflow_with(start_body(
        &id,
        &queue,
        json!({"priority": 2, "fairness_key": "  Tenant-A ", "fairness_weight": 40}),
    ))
    .await
    .ok(201);
    let described = h.describe(&id).await;
    assert_eq!(
        (&described["priority"], &described["fairness_key"], &described["fairness_weight"]),
        (&json!(2), &json!("tenant-a"), &json!(40))
    );
    let plain = unique("prio-default");
    h.start_workflow(&plain, &queue).await;
    let described = h.describe(&plain).await;
    assert_eq!(
        (&described["priority"], &described["fairness_key"], &described["fairness_weight"]),
        (&json!(5), &Value::Null, &json!(1))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_get_the_most_urgent_task_first_and_the_queue_shows_the_shares() {
    let h = Harness::start().await;
    let queue = unique("prio-order");
    let slow = unique("slow");
    let urgent = unique("urgent");
    h.start_workflow_with(start_body(&slow, &queue, json!({"priority": 8})))
        .await
        .ok(201);
    h.start_workflow_with(start_body(&urgent, &queue, json!({"priority": 1, "fairness_key": "ops"})))
        .await
        .ok(201);
    let view = h.cget(&format!("/api/task-queues/{queue}/priority-fairness")).await.ok(200);
    assert_eq!(view["queue"], queue.as_str());
    assert_eq!(view["workflow_task"]["ready_tasks"], 2);
    assert_eq!(
        view["workflow_task"]["priority_tiers"],
        json!([
            {"priority": 1, "count": 1, "classes": [{"fairness_key": "ops", "count": 1, "fairness_weight": 1}]},
            {"priority": 8, "count": 1, "classes": [{"fairness_key": null, "count": 1, "fairness_weight": 1}]},
        ])
    );
    assert_eq!(
        view["activity_task"],
        json!({"ready_tasks": 0, "priority_tiers": [], "recent_dispatch": []})
    );
    h.register("prio-worker", &queue).await;
    let first = h.next_workflow_task("prio-worker", &queue).await;
    assert_eq!(first["workflow_id"], urgent.as_str(), "the priority-1 start went first");
    let second = h.next_workflow_task("prio-worker", &queue).await;
    assert_eq!(second["workflow_id"], slow.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_info_advertises_the_priority_fairness_contract() {
    let h = Harness::start().await;
    let info = h.cget("/api/cluster/info").await.ok(200);
    let contract = &info["worker_protocol"]["server_capabilities"]["task_queue_priority_fairness"];
    assert_eq!(contract["schema"], "durable-workflow.v2.task-queue-priority-fairness.contract");
    assert_eq!(contract["version"], 1);
    assert_eq!(contract["feature"], "task_queue_priority_fairness");
    assert_eq!(
        (
            &contract["fields"]["priority"]["min"],
            &contract["fields"]["priority"]["max"],
            &contract["fields"]["priority"]["default"]
        ),
        (&json!(0), &json!(9), &json!(5))
    );
    assert_eq!(contract["fields"]["fairness_key"]["default_class_label"], "__default__");
    assert_eq!(contract["fields"]["fairness_weight"]["default"], 1);
    assert_eq!(contract["dispatch"]["fairness_state_half_life_seconds"], 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_caps_and_rates_a_queue_live() {
    let h = Harness::start().await;
    let queue = unique("limited");
    let limits = |kind: &str| format!("/api/task-queues/{queue}/limits/{kind}");
    for (kind, body, field) in [
        ("workflow", json!({"max_leased_tasks": 0}), "max_leased_tasks"),
        ("workflow", json!({"dispatch_rate_per_second": 0}), "dispatch_rate_per_second"),
        ("workflow", json!({"dispatch_rate_per_second": "fast"}), "dispatch_rate_per_second"),
        ("workflow", json!({"dispatch_burst": 5}), "dispatch_burst"),
        ("workflow", json!({"max_leased": 5}), "max_leased"),
        ("timer", json!({"max_leased_tasks": 1}), "kind"),
    ] {
        let refused = h.cpost_method(Method::PUT, &limits(kind), body.clone()).await;
        assert!(refused.err(422, "validation_failed")["errors"][field].is_array(), "{kind} {body}");
    }
    let set = h
        .cpost_method(Method::PUT, &limits("workflow"), json!({"max_leased_tasks": 1}))
        .await
        .ok(200);
    assert_eq!(set["workflow_task"]["max_leased_tasks"], 1);
    assert_eq!(set["workflow_task"]["leased_tasks"], 0);
    assert!(set["activity_task"].is_null());

    for i in 0..3 {
        h.start_workflow(&unique(&format!("limited-{i}")), &queue).await;
    }
    h.register("cap-a", &queue).await;
    h.register("cap-b", &queue).await;
    assert!(h.poll_workflow("cap-a", &queue, 1).await.is_object());
    assert!(h.poll_workflow("cap-b", &queue, 1).await.is_null(), "the cap of one is held");
    let read = h.cget(&format!("/api/task-queues/{queue}/limits")).await.ok(200);
    assert_eq!(read["workflow_task"]["leased_tasks"], 1);
    let exposition = scrape(&h).await;
    let held = format!(
        "capstan_task_queue_throttled_total{{held_by=\"max_leased_tasks\",kind=\"workflow\",namespace=\"default\",queue=\"{queue}\"}}"
    );
    assert!(exposition.lines().any(|l| l.starts_with(&held)), "{held} in\n{exposition}");

    // A rate instead of the cap: a held-back long poll waits for the next token, not for the
    // end of its wait.
    let rated = h
        .cpost_method(
            Method::PUT,
            &limits("workflow"),
            json!({"dispatch_rate_per_second": 4, "dispatch_burst": 1}),
        )
        .await
        .ok(200);
    assert_eq!(rated["workflow_task"]["max_leased_tasks"], Value::Null);
    assert_eq!(rated["workflow_task"]["dispatch_burst"], 1);
    assert!(h.poll_workflow("cap-b", &queue, 5).await.is_object());
    let waited = Instant::now();
    assert!(h.poll_workflow("cap-b", &queue, 20).await.is_object(), "the next token came");
    assert!(waited.elapsed() < Duration::from_secs(10), "{:?}", waited.elapsed());
    let cleared = h.cpost_method(Method::DELETE, &limits("workflow"), json!({})).await.ok(200);
    assert!(cleared["workflow_task"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_limits_and_weighs_fairness_keys_live() {
    let h = Harness::start().await;
    let queue = unique("keyed");
    let path = format!("/api/task-queues/{queue}/limits/workflow");
    for (body, field) in [
        (
            json!({"fairness_key_limits": {"max_leased_tasks": 0}}),
            "fairness_key_limits.max_leased_tasks",
        ),
        (json!({"fairness_key_limits": {"max_leased": 1}}), "fairness_key_limits.max_leased"),
        (json!({"fairness_key_limits": {}}), "fairness_key_limits"),
        (json!({"fairness_key_overrides": {"t1": 3}}), "fairness_key_overrides.t1"),
        (
            json!({"fairness_key_overrides": {"no spaces": {"max_leased_tasks": 1}}}),
            "fairness_key_overrides.no spaces",
        ),
        (json!({"fairness_weights": {"t1": 0}}), "fairness_weights.t1"),
        (json!({"fairness_weights": {"t1": "heavy"}}), "fairness_weights.t1"),
    ] {
        let refused = h.cpost_method(Method::PUT, &path, body.clone()).await;
        assert!(refused.err(422, "validation_failed")["errors"][field].is_array(), "{body}");
    }
    let set = h
        .cpost_method(
            Method::PUT,
            &path,
            json!({"fairness_key_limits": {"max_leased_tasks": 1}, "fairness_weights": {"Tenant-A": 3}}),
        )
        .await
        .ok(200);
    assert_eq!(set["workflow_task"]["fairness_key_limits"]["max_leased_tasks"], 1);
    assert_eq!(
        set["workflow_task"]["fairness_weights"],
        json!({"tenant-a": 3}),
        "keys as runs keep them"
    );

    for (i, key) in ["tenant-a", "tenant-a", "tenant-b"].iter().enumerate() {
        let body = start_body(&unique(&format!("keyed-{i}")), &queue, json!({"fairness_key": key}));
        h.cpost("/api/workflows", body).await.ok(201);
    }
    h.register("key-a", &queue).await;
    h.register("key-b", &queue).await;
    h.register("key-c", &queue).await;
    let first = h.poll_workflow("key-a", &queue, 1).await;
    let second = h.poll_workflow("key-b", &queue, 1).await;
    assert!(first.is_object() && second.is_object());
    assert!(h.poll_workflow("key-c", &queue, 1).await.is_null(), "each key's cap of one is held");
    let exposition = scrape(&h).await;
    let held = format!(
        "capstan_task_queue_throttled_total{{held_by=\"fairness_key_max_leased_tasks\",kind=\"workflow\",namespace=\"default\",queue=\"{queue}\"}}"
    );
    assert!(exposition.lines().any(|l| l.starts_with(&held)), "{held} in\n{exposition}");
}
