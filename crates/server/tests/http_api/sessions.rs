//! Worker sessions over HTTP on every backend: the lifecycle routes, and session activities
//! offered only to the session's holder.

use super::*;

async fn register_capable(h: &Harness, worker_id: &str, queue: &str) {
    h.wpost(
        "/api/worker/register",
        json!({"worker_id": worker_id, "task_queue": queue, "runtime": "rust", "sdk_version": "capstan-http-tests/1",
               "supported_workflow_types": [], "supported_activity_types": [], "capabilities": ["worker_sessions", "gpu"],
               "max_concurrent_worker_sessions": 2}),
    )
    .await
    .ok(201);
}

fn options(session_id: &str) -> Value {
    json!({"session_id": session_id, "requirements": ["gpu"], "lease_seconds": 120, "ttl_seconds": 1800,
           "max_concurrent_activities": 1, "create_if_missing": true, "allow_reacquire_after_failure": true})
}

async fn acquire(h: &Harness, worker_id: &str, options: &Value) -> Resp {
    let mut body = options.clone();
    body["worker_id"] = json!(worker_id);
    h.wpost("/api/worker/sessions", body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_created_reused_renewed_and_closed_by_its_holder_only() {
    let h = Harness::start().await;
    register_capable(&h, "holder", "q").await;
    register_capable(&h, "rival", "q").await;
    let created = acquire(&h, "holder", &options("s-1")).await.ok(201);
    assert_eq!(created["admitted"], true);
    assert_eq!(created["outcome"], "created");
    let session = &created["session"];
    // What the Rust SDK checks of every receipt.
    assert_eq!(session["session_id"], "s-1");
    assert_eq!(session["namespace"], "default");
    assert_eq!(session["lease_owner"], "holder");
    assert_eq!(session["status"], "active");
    assert_eq!(session["queue"], "q");
    assert_eq!(session["requirements"], json!(["gpu"]));
    assert_eq!(
        (session["lease_seconds"].clone(), session["ttl_seconds"].clone()),
        (json!(120), json!(1800))
    );
    let ttl = session["ttl_expires_at"].clone();

    let reused = acquire(&h, "holder", &options("s-1")).await.ok(200);
    assert_eq!(reused["outcome"], "reused");
    let refused = acquire(&h, "rival", &options("s-1"))
        .await
        .err(409, "session_owned_by_another_worker");
    assert_eq!(refused["admitted"], false);
    assert_eq!(refused["session"]["lease_owner"], "holder");

    let renewed = h
        .wpost(
            "/api/worker/sessions/s-1/heartbeat",
            json!({"worker_id": "holder", "lease_seconds": 60}),
        )
        .await
        .ok(200);
    assert_eq!(renewed["outcome"], "heartbeat_recorded");
    assert_eq!(renewed["session"]["ttl_expires_at"], ttl, "a renewal never extends the TTL");
    h.wpost("/api/worker/sessions/s-1/heartbeat", json!({"worker_id": "rival"}))
        .await
        .err(409, "session_owner_mismatch");
    h.wpost("/api/worker/sessions/nope/heartbeat", json!({"worker_id": "holder"}))
        .await
        .err(404, "session_not_found");

    let close = |worker: &'static str| {
        send(
            h.worker(Method::DELETE, "/api/worker/sessions/s-1")
                .json(&json!({"worker_id": worker, "reason": "worker_shutdown"})),
        )
    };
    close("rival").await.err(409, "session_owner_mismatch");
    let closed = close("holder").await.ok(200);
    assert_eq!(
        (closed["outcome"].clone(), closed["session"]["status"].clone()),
        (json!("closed"), json!("closed"))
    );
    assert_eq!(close("holder").await.ok(200)["outcome"], "already_closed");
    acquire(&h, "holder", &options("s-1")).await.err(409, "session_closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_checks_requirements_queue_and_limits() {
    let h = Harness::start().await;
    register_capable(&h, "w", "q").await;
    h.register("plain", "q").await;
    let refused = acquire(&h, "plain", &options("s-req"))
        .await
        .err(409, "session_requirements_not_met");
    assert_eq!(refused["missing_requirements"], json!(["gpu"]));
    let mut elsewhere = options("s-queue");
    elsewhere["queue"] = json!("other-q");
    acquire(&h, "w", &elsewhere).await.err(409, "session_queue_mismatch");
    let mut no_create = options("s-none");
    no_create["create_if_missing"] = json!(false);
    acquire(&h, "w", &no_create).await.err(409, "session_missing");
    acquire(&h, "w", &options("s-a")).await.ok(201);
    acquire(&h, "w", &options("s-b")).await.ok(201);
    acquire(&h, "w", &options("s-c")).await.err(409, "worker_session_limit_exceeded");
    acquire(&h, "nobody", &options("s-d")).await.err(412, "worker_not_registered");
    let mut unknown = options("s-e");
    unknown["colour"] = json!("blue");
    let refused = acquire(&h, "w", &unknown).await.err(422, "validation_failed");
    assert!(refused["errors"].get("colour").is_some(), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_activities_run_only_on_the_holder_until_it_is_gone() {
    let h = Harness::start().await;
    register_capable(&h, "wf-worker", "q").await;
    register_capable(&h, "first", "q").await;
    register_capable(&h, "second", "q").await;
    let (_, task) = {
        let start = h.start_workflow("session-wf", "q").await;
        (start, h.next_workflow_task("wf-worker", "q").await)
    };
    let session = options("s-work");
    let activity = |n: u32| json!({"type": "schedule_activity", "activity_type": format!("step-{n}"), "worker_session": session.clone()});
    h.complete_workflow_task(&task, json!([activity(1), activity(2)])).await.ok(200);

    // The first poller takes the session with the first activity…
    let one = h.next_activity_task("first", "q").await;
    assert_eq!(one["worker_session"]["session_id"], "s-work");
    assert_eq!(one["worker_session"]["lease_owner"], "first");
    assert_eq!(one["worker_session"]["queue"], "q", "the task names the session's queue");
    assert_eq!(one["worker_session"]["status"], "active");
    // …the second activity waits for the session (one at a time) and never goes elsewhere.
    assert_eq!(h.poll_activity("second", "q", 1).await, Value::Null);
    assert_eq!(h.poll_activity("first", "q", 1).await, Value::Null, "one activity at a time");
    // A heartbeat renews the session and says so.
    let beat = h.heartbeat_activity(&one).await.ok(200);
    assert_eq!(beat["worker_session"]["lease_owner"], "first");
    // The ownership check cooperative workers make carries the attempt's and the session's state.
    let status_of = |task: &Value| {
        let path = format!("/api/worker/activity-tasks/{}/status", task["task_id"].as_str().unwrap());
        let body = json!({"activity_attempt_id": task["activity_attempt_id"], "lease_owner": task["lease_owner"]});
        let h = &h;
        async move { h.wpost(&path, body).await }
    };
    let status = status_of(&one).await.ok(200);
    assert_eq!(
        (status["task_status"].clone(), status["attempt_status"].clone()),
        (json!("leased"), json!("running"))
    );
    assert_eq!(status["activity_status"], "running");
    assert_eq!(status["worker_session"]["lease_owner"], "first");
    h.complete_activity(&one, AVRO_NULL).await.ok(200);
    let done = status_of(&one).await.ok(200);
    assert_eq!(
        (
            done["can_continue"].clone(),
            done["attempt_status"].clone(),
            done["activity_status"].clone()
        ),
        (json!(false), json!("closed"), json!("closed"))
    );
    assert_eq!(h.poll_activity("second", "q", 1).await, Value::Null, "held by first");
    let two = h.next_activity_task("first", "q").await;
    assert_ne!(two["activity_type"], one["activity_type"], "the other step");
    // The holder goes away: its session is taken over by the next capable worker.
    send(h.worker(Method::DELETE, "/api/worker/registrations/first")).await.ok(200);
    h.fail_activity(&two, "lost").await;
    let retried = wait_for("the retry to reach the second worker", Duration::from_secs(10), || async {
        let task = h.poll_activity("second", "q", 1).await;
        task.is_object().then_some(task)
    })
    .await;
    assert_eq!(retried["worker_session"]["lease_owner"], "second", "reacquired: {retried}");
    let described = h
        .wpost("/api/worker/sessions/s-work/heartbeat", json!({"worker_id": "second"}))
        .await
        .ok(200);
    assert!(
        described["session"]["fence"].as_u64().unwrap() >= 2,
        "a new holder, a new fence: {described}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_deregistration_needs_the_current_token_and_answers_retries_alike() {
    let h = Harness::start().await;
    let info = send(h.bare(Method::GET, "/api/cluster/info")).await.ok(200);
    let fencing = &info["worker_protocol"]["server_capabilities"]["worker_deregistration_fencing"];
    assert_eq!(fencing["supported"], true);
    assert_eq!(fencing["schema"], "durable-workflow.v2.worker-deregistration.v1");
    assert_eq!(fencing["endpoint"], "/worker/registrations/{workerId}/deregister");
    assert!(fencing["receipt_retention_seconds"].as_i64().unwrap() > 0);

    let first = h.register("leaving", "q").await["registration_token"].as_str().unwrap().to_string();
    assert!(
        first.len() == 32 && first.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{first}"
    );
    let (_, task) = h.started_and_leased("fenced-wf", "leaving", "q").await; // registers again: a new token
    let current = h.register("leaving", "q").await["registration_token"].as_str().unwrap().to_string();
    assert_ne!(first, current, "every registration rotates the token");
    let deregister = |token: &str| h.wpost("/api/worker/registrations/leaving/deregister", json!({"registration_token": token}));
    deregister(&first).await.err(409, "worker_registration_lost_authority");
    let receipt = deregister(&current).await.ok(200);
    assert_eq!(receipt["worker_id"], "leaving");
    assert_eq!(receipt["outcome"], "deregistered");
    assert_eq!(receipt["registration_token"], json!(current));
    assert_eq!(receipt["recovered_workflow_task_count"], 1, "its leased task is handed back");
    assert_eq!(deregister(&current).await.ok(200), receipt, "a retry gets the same receipt");
    deregister(&first).await.err(404, "worker_registration_token_not_found");
    h.register("staying", "q").await;
    assert_eq!(h.poll_workflow("staying", "q", 2).await["task_id"], task["task_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_activitys_lease_renewal_renews_its_session_only_when_a_third_is_used() {
    let h = Harness::start().await;
    register_capable(&h, "wf-worker", "q").await;
    register_capable(&h, "holder", "q").await;
    h.start_workflow("session-renewal", "q").await;
    let task = h.next_workflow_task("wf-worker", "q").await;
    let mut session = options("s-renew");
    session["lease_seconds"] = json!(3);
    let activity = json!({"type": "schedule_activity", "activity_type": "step", "worker_session": session});
    h.complete_workflow_task(&task, json!([activity])).await.ok(200);
    let leased = h.next_activity_task("holder", "q").await;
    let granted = leased["worker_session"]["lease_expires_at"].clone();
    let renew = || {
        let path = format!("/api/worker/activity-tasks/{}/renew-lease", leased["task_id"].as_str().unwrap());
        let body = json!({"activity_attempt_id": leased["activity_attempt_id"], "lease_owner": "holder"});
        let h = &h;
        async move { h.wpost(&path, body).await.ok(200) }
    };
    // Fresh: confirmed as it stands.
    let fresh = renew().await;
    assert_eq!(fresh["worker_session"]["lease_owner"], "holder");
    assert_eq!(
        fresh["worker_session"]["lease_expires_at"], granted,
        "a fresh session lease is not rewritten"
    );
    // Over a third used: renewed.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let later = renew().await;
    assert!(
        later["worker_session"]["lease_expires_at"].as_str() > granted.as_str(),
        "{later} after {granted}"
    );
}
