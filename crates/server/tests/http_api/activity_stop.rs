//! Stop receipts over HTTP on every backend: a cooperative cancellation delivered at a running
//! activity gives the attempt's worker a `cancellation_acknowledgement` receipt on `/status`,
//! and its acknowledgement is recorded once — in history while the run is open, in the run's
//! document once it has closed — and answered the same on every repeat.

use super::*;

struct Stopped {
    activity: Value,
    request_id: String,
    run_id: String,
    workflow_task: Value,
}

/// A run whose running activity (leased by `w1`) a delivered cancellation interrupted; the
/// workflow task that took the delivery is still leased.
async fn stopped_activity(h: &Harness, workflow_id: &str) -> Stopped {
    h.wpost(
        "/api/worker/register",
        json!({"worker_id": "w1", "task_queue": "q", "runtime": "python", "sdk_version": "capstan-http-tests/1",
               "supported_workflow_types": [], "supported_activity_types": [], "capabilities": ["cooperative_cancellation"]}),
    )
    .await
    .ok(201);
    let (start, task) = h.started_and_leased(workflow_id, "w1", "q").await;
    let run_id = start["run_id"].as_str().unwrap().to_string();
    h.complete_workflow_task(&task, json!([schedule_activity("slow", "q")]))
        .await
        .ok(200);
    let activity = h.next_activity_task("w1", "q").await;
    let requested = h
        .cpost(
            &format!("/api/workflows/{workflow_id}/request-cancellation"),
            json!({"reason": "stop", "cleanup_timeout_seconds": 60}),
        )
        .await
        .ok(202);
    let request_id = requested["cancellation_request"]["request_id"].as_str().unwrap().to_string();
    let workflow_task = h.next_workflow_task("w1", "q").await;
    h.wpost(
        &format!(
            "/api/worker/workflow-tasks/{}/deliver-cancellation",
            workflow_task["task_id"].as_str().unwrap()
        ),
        json!({"lease_owner": "w1", "workflow_task_attempt": workflow_task["workflow_task_attempt"],
               "request_id": request_id, "sequence": 1, "call_kind": "activity", "sequence_span": 1}),
    )
    .await
    .ok(200);
    Stopped {
        activity,
        request_id,
        run_id,
        workflow_task,
    }
}

async fn status(h: &Harness, activity: &Value, owner: &str) -> Value {
    h.wpost(
        &format!("/api/worker/activity-tasks/{}/status", activity["task_id"].as_str().unwrap()),
        json!({"activity_attempt_id": activity["activity_attempt_id"], "lease_owner": owner}),
    )
    .await
    .ok(200)
}

async fn acknowledge(h: &Harness, activity: &Value, owner: &str, request_id: &str) -> Resp {
    h.wpost(
        &format!(
            "/api/worker/activity-tasks/{}/acknowledge-cancellation",
            activity["task_id"].as_str().unwrap()
        ),
        json!({"activity_attempt_id": activity["activity_attempt_id"], "lease_owner": owner, "request_id": request_id}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_attempts_receipt_is_acknowledged_once_in_history() {
    let h = Harness::start().await;
    let Stopped {
        activity,
        request_id,
        run_id,
        ..
    } = stopped_activity(&h, "stop-open").await;
    let history = h.history("stop-open", &run_id).await;
    let cancelled = history.iter().find(|e| e["event_type"] == "ActivityCancelled").unwrap();

    let seen = status(&h, &activity, "w1").await;
    assert_eq!(
        (
            seen["can_continue"].clone(),
            seen["cancel_requested"].clone(),
            seen["reason"].clone()
        ),
        (json!(false), json!(true), json!("activity_cancelled"))
    );
    assert_eq!(seen["heartbeat_recorded"], false);
    let receipt = &seen["cancellation_acknowledgement"];
    assert_eq!(receipt["callback_state"], "unknown");
    assert_eq!(receipt["request_id"], request_id.as_str());
    assert_eq!(receipt["root_request_id"], request_id.as_str());
    assert_eq!(receipt["cancellation_history_event_id"], cancelled["id"]);
    assert!(receipt["cleanup_deadline_at"].is_string());
    // Another worker asking about the attempt gets no receipt.
    assert!(status(&h, &activity, "w2").await.get("cancellation_acknowledgement").is_none());
    // A heartbeat from the holder is told to stop (it records nothing).
    let beat = h.heartbeat_activity(&activity).await.ok(200);
    assert_eq!(
        (
            beat["cancel_requested"].clone(),
            beat["can_continue"].clone(),
            beat["heartbeat_recorded"].clone()
        ),
        (json!(true), json!(false), json!(false))
    );
    assert_eq!(beat["reason"], "activity_cancelled");

    // Refusals record nothing: another owner, another request, a field the route does not take.
    acknowledge(&h, &activity, "w2", &request_id).await.err(409, "lease_owner_mismatch");
    acknowledge(&h, &activity, "w1", "other-request")
        .await
        .err(409, "cancellation_request_mismatch");
    let mut unknown = activity.clone();
    unknown["activity_attempt_id"] = json!("01NOSUCHATTEMPT");
    acknowledge(&h, &unknown, "w1", &request_id).await.err(404, "attempt_not_found");
    h.wpost(
        &format!(
            "/api/worker/activity-tasks/{}/acknowledge-cancellation",
            activity["task_id"].as_str().unwrap()
        ),
        json!({"activity_attempt_id": activity["activity_attempt_id"], "lease_owner": "w1", "request_id": request_id, "reason": "x"}),
    )
    .await
    .err(422, "validation_failed");

    let first = acknowledge(&h, &activity, "w1", &request_id).await.ok(200);
    for (key, value) in [
        ("task_id", activity["task_id"].clone()),
        ("activity_attempt_id", activity["activity_attempt_id"].clone()),
        ("lease_owner", json!("w1")),
        ("request_id", json!(request_id)),
        ("acknowledged", json!(true)),
        ("duplicate", json!(false)),
        ("reason", Value::Null),
        ("heartbeat_recorded", json!(false)),
        ("recorded_in_history", json!(true)),
    ] {
        assert_eq!(first[key], value, "{key} in {first}");
    }
    let again = acknowledge(&h, &activity, "w1", &request_id).await.ok(200);
    assert_eq!(
        (again["duplicate"].clone(), again["history_event_id"].clone()),
        (json!(true), first["history_event_id"].clone())
    );
    let history = h.history("stop-open", &run_id).await;
    let acks: Vec<&Value> = history
        .iter()
        .filter(|e| e["event_type"] == "ActivityCancellationAcknowledged")
        .collect();
    assert_eq!(acks.len(), 1);
    assert_eq!(acks[0]["id"], first["history_event_id"]);
    assert_eq!(acks[0]["payload"]["cancellation_history_event_id"], cancelled["id"]);
    assert_eq!(acks[0]["payload"]["callback_state"], "stopped");
    let seen = status(&h, &activity, "w1").await;
    assert_eq!(seen["cancellation_acknowledgement"]["callback_state"], "stopped");
    assert_eq!(seen["cancellation_acknowledgement"]["history_event_id"], first["history_event_id"]);
    // The stopped attempt's late result is refused and changes nothing.
    h.complete_activity(&activity, AVRO_NULL)
        .await
        .err_one_of(409, &["attempt_closed", "activity_not_running"]);
    assert_eq!(h.history("stop-open", &run_id).await.len(), history.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledgement_after_the_run_closed_is_kept_in_its_document() {
    let h = Harness::start().await;
    let Stopped {
        activity,
        request_id,
        run_id,
        workflow_task,
    } = stopped_activity(&h, "stop-closed").await;
    // The cleanup finishes before the activity's worker acknowledges: the run ends cancelled.
    h.complete_workflow_task(&workflow_task, json!([{"type": "complete_workflow", "result": env(AVRO_NULL)}]))
        .await
        .ok(200);
    let closed = h.history("stop-closed", &run_id).await;
    assert_eq!(closed.last().unwrap()["event_type"], "WorkflowCancelled");
    let first = acknowledge(&h, &activity, "w1", &request_id).await.ok(200);
    assert_eq!(
        (first["duplicate"].clone(), first["recorded_in_history"].clone()),
        (json!(false), json!(false))
    );
    assert!(first["history_event_id"].as_str().is_some_and(|id| !id.is_empty()));
    let again = acknowledge(&h, &activity, "w1", &request_id).await.ok(200);
    assert_eq!(
        (again["duplicate"].clone(), again["history_event_id"].clone()),
        (json!(true), first["history_event_id"].clone())
    );
    assert_eq!(
        h.history("stop-closed", &run_id).await,
        closed,
        "a closed run's history ends at its terminal event"
    );
    let seen = status(&h, &activity, "w1").await;
    assert_eq!(seen["cancellation_acknowledgement"]["callback_state"], "stopped");
}
