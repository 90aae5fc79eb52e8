//! Prepared local activities over HTTP on every backend
//! (`/worker/workflow-tasks/{task}/local-activities/…`, advertised as `prepared_local_activities`):
//! the receipts the Python SDK checks, their repeats, recovery of a lost claim's attempt with a
//! server-owned retry, a deadline ended at supervision, checkpoints, and refusals.

use super::*;

const CAPABLE: &[&str] = &["cooperative_cancellation", "prepared_local_activities"];

async fn register_capable(h: &Harness, worker_id: &str, capabilities: &[&str]) {
    h.wpost(
        "/api/worker/register",
        json!({"worker_id": worker_id, "task_queue": "q", "runtime": "python", "sdk_version": "capstan-http-tests/1",
               "supported_workflow_types": [], "supported_activity_types": [], "capabilities": capabilities}),
    )
    .await
    .ok(201);
}

/// A run whose workflow task `owner` (registered with the capability) holds.
async fn leased(h: &Harness, workflow_id: &str, owner: &str) -> (Value, Value) {
    let (start, task) = h.started_and_leased(workflow_id, owner, "q").await;
    register_capable(h, owner, CAPABLE).await;
    (start, task)
}

fn descriptor(extra: Value) -> Value {
    let mut d = json!({"type": "record_local_activity", "activity_type": "greet", "execution_mode": "local",
                       "arguments": env(EMPTY_ARGS), "payload_codec": "avro"});
    d.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    d
}

async fn op(h: &Harness, task: &Value, owner: &str, path: &str, body: Value) -> Resp {
    let mut body = body;
    body["lease_owner"] = json!(owner);
    body["workflow_task_attempt"] = task["workflow_task_attempt"].clone();
    let task_id = task["task_id"].as_str().unwrap();
    h.wpost(&format!("/api/worker/workflow-tasks/{task_id}/local-activities/{path}"), body)
        .await
}

async fn prepare(h: &Harness, task: &Value, owner: &str, sequence: u32, nonce: &str, d: Value) -> Resp {
    op(
        h,
        task,
        owner,
        "prepare",
        json!({"sequence": sequence, "worker_attempt_id": nonce, "descriptor": d}),
    )
    .await
}

/// The claim's view of history from the reply's cursor, as the SDK reloads it.
async fn refreshed(h: &Harness, task: &Value, owner: &str, reply: &Value) -> Vec<Value> {
    let task_id = task["task_id"].as_str().unwrap();
    let page = h
        .wpost(
            &format!("/api/worker/workflow-tasks/{task_id}/history"),
            json!({"next_history_page_token": reply["history_refresh_page_token"], "lease_owner": owner,
                   "workflow_task_attempt": task["workflow_task_attempt"]}),
        )
        .await
        .ok(200);
    page["history_events"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_local_activity_is_recorded_one_report_at_a_time() {
    let h = Harness::start().await;
    let info = send(h.bare(Method::GET, "/api/cluster/info")).await.ok(200);
    let capabilities = &info["worker_protocol"]["server_capabilities"];
    assert_eq!(capabilities["prepared_local_activities"], true);
    assert_eq!(
        capabilities["prepared_local_activity_cancellation_policies"],
        json!(["try_cancel", "wait_cancellation_completed"])
    );
    let (start, task) = leased(&h, "prep-http", "w1").await;

    // Refusals first: nothing is recorded by any of them.
    let mut unknown = descriptor(json!({}));
    unknown["local_magic"] = json!(1);
    let refused = prepare(&h, &task, "w1", 1, "n1", unknown).await.err(422, "validation_failed");
    assert!(refused["errors"].get("descriptor.local_magic").is_some(), "{refused}");
    let ahead = prepare(&h, &task, "w1", 2, "n1", descriptor(json!({}))).await;
    assert_eq!(ahead.err(409, "local_activity_command_prefix_not_recorded")["next_sequence"], 1);
    register_capable(&h, "w-plain", &["cooperative_cancellation"]).await;
    prepare(&h, &task, "w-plain", 1, "n1", descriptor(json!({})))
        .await
        .err(409, "prepared_local_activity_not_supported");

    let d = descriptor(json!({"start_to_close_timeout": 30, "heartbeat_timeout": 10}));
    let admitted = prepare(&h, &task, "w1", 1, "n1", d.clone()).await.ok(200);
    for (key, value) in [
        ("prepared", json!(true)),
        ("duplicate", json!(false)),
        ("reason", Value::Null),
        ("workflow_task_id", task["task_id"].clone()),
        ("workflow_task_attempt", task["workflow_task_attempt"].clone()),
        ("lease_owner", json!("w1")),
        ("worker_attempt_id", json!("n1")),
        ("attempt_number", json!(1)),
        ("cancellation_cleanup", Value::Null),
        ("schedule_to_close_deadline_at", Value::Null),
    ] {
        assert_eq!(admitted[key], value, "{key} in {admitted}");
    }
    for key in [
        "start_to_close_deadline_at",
        "heartbeat_deadline_at",
        "lease_expires_at",
        "server_time",
        "history_refresh_page_token",
    ] {
        assert!(admitted[key].is_string(), "{key} in {admitted}");
    }
    let again = prepare(&h, &task, "w1", 1, "n1", d.clone()).await.ok(200);
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["activity_attempt_id"], admitted["activity_attempt_id"]);

    let history = refreshed(&h, &task, "w1", &admitted).await;
    let started = history
        .iter()
        .find(|e| e["event_type"] == "ActivityStarted")
        .expect("started in the claim's view");
    assert_eq!(started["payload"]["activity_attempt_id"], admitted["activity_attempt_id"]);
    assert_eq!(started["payload"]["execution_mode"], "local");

    let attempt = admitted["activity_attempt_id"].as_str().unwrap().to_string();
    let control = op(&h, &task, "w1", &format!("{attempt}/control"), json!({"renew_lease": true}))
        .await
        .ok(200);
    assert_eq!(
        (
            control["active"].clone(),
            control["renewed"].clone(),
            control["stop_required"].clone()
        ),
        (json!(true), json!(true), json!(false))
    );
    assert_eq!(control["heartbeat_recorded"], false);
    assert_eq!(control["start_to_close_deadline_at"], admitted["start_to_close_deadline_at"]);
    assert!(control["workflow_lease_expires_at"].is_string());
    // Without `renew_lease` nothing is extended, and the reply says so.
    let unrenewed = op(&h, &task, "w1", &format!("{attempt}/control"), json!({"renew_lease": false}))
        .await
        .ok(200);
    assert_eq!(
        (unrenewed["active"].clone(), unrenewed["renewed"].clone()),
        (json!(true), json!(false))
    );
    assert_eq!(unrenewed["lease_expires_at"], control["lease_expires_at"]);
    let beat = op(
        &h,
        &task,
        "w1",
        &format!("{attempt}/heartbeat"),
        json!({"progress": {"details": {"n": 1}}}),
    )
    .await
    .ok(200);
    assert_eq!(
        (beat["active"].clone(), beat["renewed"].clone(), beat["heartbeat_recorded"].clone()),
        (json!(true), json!(false), json!(true))
    );
    assert!(beat["heartbeat_history_event_id"].is_string());

    let report = json!({"report": {"outcome": "completed", "result": env(AVRO_NULL), "payload_codec": "avro"}});
    let outcome = op(&h, &task, "w1", &format!("{attempt}/outcome"), report.clone()).await.ok(200);
    for (key, value) in [
        ("recorded", json!(true)),
        ("duplicate", json!(false)),
        ("reason", Value::Null),
        ("event_type", json!("ActivityCompleted")),
        ("claim_released", json!(false)),
        ("created_task_ids", json!([])),
        ("workflow_run_id", start["run_id"].clone()),
        ("worker_attempt_id", json!("n1")),
    ] {
        assert_eq!(outcome[key], value, "{key} in {outcome}");
    }
    let repeat = op(&h, &task, "w1", &format!("{attempt}/outcome"), report).await.ok(200);
    assert_eq!(
        (repeat["duplicate"].clone(), repeat["event_id"].clone()),
        (json!(true), outcome["event_id"].clone())
    );
    let other = json!({"report": {"outcome": "failed", "message": "late", "non_retryable": true}});
    op(&h, &task, "w1", &format!("{attempt}/outcome"), other)
        .await
        .err(409, "local_activity_outcome_mismatch");
    let history = refreshed(&h, &task, "w1", &outcome).await;
    assert!(history
        .iter()
        .any(|e| e["id"] == outcome["event_id"] && e["event_type"] == "ActivityCompleted"));

    h.complete_workflow_task(&task, json!([complete_workflow(AVRO_NULL)])).await.ok(200);
    let events = h.history("prep-http", start["run_id"].as_str().unwrap()).await;
    let types = event_types(&events);
    let step: Vec<&str> = types.iter().map(String::as_str).filter(|t| t.starts_with("Activity")).collect();
    assert_eq!(
        step,
        [
            "ActivityScheduled",
            "ActivityStarted",
            "ActivityHeartbeatRecorded",
            "ActivityCompleted"
        ]
    );
    assert_eq!(types.last().unwrap(), "WorkflowCompleted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claims_attempt_is_recovered_and_retried_by_the_server() {
    let config = ServerConfig {
        workflow_task_lease_ms: 1_500,
        ..ServerConfig::default()
    };
    let h = Harness::with_config(config, None).await;
    let (start, task) = leased(&h, "prep-recover", "w1").await;
    let d = descriptor(json!({"retry_policy": {"max_attempts": 3, "backoff_seconds": [1]}}));
    let admitted = prepare(&h, &task, "w1", 1, "n1", d.clone()).await.ok(200);
    // w1 dies mid-call; its claim's lease runs out and w2 gets the task.
    register_capable(&h, "w2", CAPABLE).await;
    let task2 = h.next_workflow_task("w2", "q").await;
    assert_eq!(task2["task_id"], task["task_id"]);
    let recover = json!({"sequence": 1, "descriptor": d.clone()});
    let recovered = op(&h, &task2, "w2", "recover", recover.clone()).await.ok(200);
    for (key, value) in [
        ("recovered", json!(true)),
        ("duplicate", json!(false)),
        ("callback_stop_state", json!("unknown")),
        ("event_type", json!("ActivityRetryScheduled")),
        ("claim_released", json!(true)),
        ("activity_attempt_id", admitted["activity_attempt_id"].clone()),
        ("activity_execution_id", admitted["activity_execution_id"].clone()),
    ] {
        assert_eq!(recovered[key], value, "{key} in {recovered}");
    }
    assert_eq!(recovered["created_task_ids"].as_array().unwrap().len(), 1);
    let repeat = op(&h, &task2, "w2", "recover", recover).await.ok(200);
    assert_eq!(repeat["duplicate"], true);
    // The old worker's late outcome is refused.
    let attempt = admitted["activity_attempt_id"].as_str().unwrap();
    let late = json!({"report": {"outcome": "completed", "result": env(AVRO_NULL)}});
    op(&h, &task, "w1", &format!("{attempt}/outcome"), late).await.err_one_of(
        409,
        &[
            "stale_activity_attempt",
            "workflow_task_attempt_mismatch",
            "lease_owner_mismatch",
            "task_not_leased",
        ],
    );
    // The retry comes on its own task once its backoff is due: attempt 2 of the same execution.
    let task3 = h.next_workflow_task("w2", "q").await;
    assert_eq!(json!([task3["task_id"].clone()]), recovered["created_task_ids"]);
    let second = prepare(&h, &task3, "w2", 1, "n2", d).await.ok(200);
    assert_eq!(second["attempt_number"], 2);
    assert_eq!(second["activity_execution_id"], admitted["activity_execution_id"]);
    let events = h.history("prep-recover", start["run_id"].as_str().unwrap()).await;
    let retry = events.iter().find(|e| e["event_type"] == "ActivityRetryScheduled").unwrap();
    assert_eq!(retry["payload"]["local_recovery"]["lease_owner"], "w2");
    assert_eq!(retry["payload"]["local_recovery"]["original_lease_owner"], "w1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_past_its_deadline_is_ended_at_its_supervision() {
    let h = Harness::start().await;
    let (start, task) = leased(&h, "prep-deadline", "w1").await;
    let d = descriptor(json!({"start_to_close_timeout": 1, "retry_policy": {"max_attempts": 1}}));
    let admitted = prepare(&h, &task, "w1", 1, "n1", d).await.ok(200);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let attempt = admitted["activity_attempt_id"].as_str().unwrap();
    let ended = op(&h, &task, "w1", &format!("{attempt}/control"), json!({"renew_lease": true}))
        .await
        .err(409, "local_activity_deadline_expired");
    assert_eq!(
        (ended["timeout_kind"].clone(), ended["event_type"].clone()),
        (json!("start_to_close"), json!("ActivityTimedOut"))
    );
    // The released claim is over; the run's next task replays the recorded timeout.
    let next = h.next_workflow_task("w1", "q").await;
    assert_ne!(next["task_id"], task["task_id"]);
    let events = h.history("prep-deadline", start["run_id"].as_str().unwrap()).await;
    assert_eq!(count_events(&events, "ActivityTimedOut"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_commits_the_commands_before_a_call_on_the_claim() {
    let h = Harness::start().await;
    let (_, task) = leased(&h, "prep-checkpoint", "w1").await;
    let body = json!({"checkpoint_id": "cp-1", "start_sequence": 1,
                      "commands": [{"type": "record_side_effect", "result": env(AVRO_NULL)}]});
    let first = op(&h, &task, "w1", "checkpoint", body.clone()).await.ok(200);
    for (key, value) in [
        ("checkpointed", json!(true)),
        ("duplicate", json!(false)),
        ("checkpoint_id", json!("cp-1")),
        ("lease_owner", json!("w1")),
        ("start_sequence", json!(1)),
        ("next_sequence", json!(2)),
        ("reason", Value::Null),
    ] {
        assert_eq!(first[key], value, "{key} in {first}");
    }
    assert_eq!(op(&h, &task, "w1", "checkpoint", body).await.ok(200)["duplicate"], true);
    let timer = json!({"checkpoint_id": "cp-2", "start_sequence": 2, "commands": [{"type": "start_timer", "delay_seconds": 5}]});
    op(&h, &task, "w1", "checkpoint", timer).await.err(422, "validation_failed");
    prepare(&h, &task, "w1", 2, "n1", descriptor(json!({}))).await.ok(200);
}
