//! Activity lease renewal over HTTP on every backend (`/renew-lease`, advertised as
//! `activity_lease_renewal`): the poll reply's `server_time` and heartbeat terms, renewals that
//! confirm a fresh grant and extend an older one without recording progress, and refusals for
//! a wrong owner, an unknown attempt, an unknown field and an expired lease.

use super::*;

const LEASE_MS: i64 = 3_000;

fn is_utc6(value: &Value) -> bool {
    value
        .as_str()
        .is_some_and(|s| s.len() == 27 && s.ends_with('Z') && s.as_bytes()[19] == b'.' && s[20..26].bytes().all(|b| b.is_ascii_digit()))
}

async fn renew(h: &Harness, task: &Value, owner: &str) -> Resp {
    h.wpost(
        &format!("/api/worker/activity-tasks/{}/renew-lease", task["task_id"].as_str().unwrap()),
        json!({"activity_attempt_id": task["activity_attempt_id"], "lease_owner": owner}),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_activity_lease_is_renewed_without_recording_progress() {
    let config = ServerConfig {
        activity_task_lease_ms: LEASE_MS,
        ..ServerConfig::default()
    };
    let h = Harness::with_config(config, None).await;
    let info = send(h.bare(Method::GET, "/api/cluster/info")).await.ok(200);
    assert_eq!(info["worker_protocol"]["server_capabilities"]["activity_lease_renewal"], true);
    let (start, task) = h.started_and_leased("renewed", "w1", "q").await;
    let run_id = start["run_id"].as_str().unwrap();
    let mut command = schedule_activity("slow", "q");
    command["heartbeat_timeout"] = json!(30);
    command["retry_policy"] = json!({"max_attempts": 1});
    h.complete_workflow_task(&task, json!([command])).await.ok(200);

    let polled = h
        .wpost(
            "/api/worker/activity-tasks/poll",
            json!({"worker_id": "w1", "task_queue": "q", "poll_request_id": unique("p"), "timeout_seconds": 5}),
        )
        .await
        .ok(200);
    // What both SDKs check of an activity poll once the capability is on.
    assert!(is_utc6(&polled["server_time"]), "{polled}");
    let activity = polled["task"].clone();
    assert!(is_utc6(&activity["lease_expires_at"]));
    assert_eq!(activity["retry_policy"]["heartbeat_timeout"], 30);
    assert_eq!(activity["retry_policy"]["max_attempts"], 1);
    let heartbeat_deadline = activity["deadlines"]["heartbeat"].clone();
    assert!(is_utc6(&heartbeat_deadline));

    let confirmed = renew(&h, &activity, "w1").await.ok(200);
    for (key, value) in [
        ("workflow_task_id", &activity["task_id"]),
        ("workflow_instance_id", &activity["workflow_id"]),
        ("workflow_run_id", &activity["run_id"]),
        ("activity_execution_id", &activity["activity_execution_id"]),
        ("activity_attempt_id", &activity["activity_attempt_id"]),
        ("attempt_number", &json!(1)),
        ("lease_owner", &json!("w1")),
        ("lease_renewed", &json!(true)),
        ("can_continue", &json!(true)),
        ("cancel_requested", &json!(false)),
        ("heartbeat_recorded", &json!(false)),
        ("reason", &Value::Null),
    ] {
        assert_eq!(&confirmed[key], value, "{key} in {confirmed}");
    }
    assert!(
        confirmed["server_time"].as_str() > polled["server_time"].as_str(),
        "server_time moves forward"
    );
    assert_eq!(
        confirmed["lease_expires_at"], activity["lease_expires_at"],
        "a fresh lease is confirmed as it stands"
    );
    assert_eq!(confirmed["heartbeat_deadline_at"], heartbeat_deadline);

    // Past a third of its term the lease is extended; the heartbeat deadline stays.
    tokio::time::sleep(Duration::from_millis(LEASE_MS as u64 / 2)).await;
    let extended = renew(&h, &activity, "w1").await.ok(200);
    assert!(
        extended["lease_expires_at"].as_str() > confirmed["lease_expires_at"].as_str(),
        "{extended}"
    );
    assert!(extended["server_time"].as_str() > confirmed["server_time"].as_str());
    assert_eq!(extended["heartbeat_deadline_at"], heartbeat_deadline, "a renewal is not progress");
    assert!(extended.get("last_heartbeat_at").is_none(), "no heartbeat was recorded");
    let history = h.history("renewed", run_id).await;
    assert_eq!(count_events(&history, "ActivityHeartbeatRecorded"), 0);

    // Refusals: another owner, an unknown attempt, a field the route does not take.
    let refused = renew(&h, &activity, "intruder").await.err(409, "lease_owner_mismatch");
    assert_eq!(
        (refused["lease_renewed"].clone(), refused["can_continue"].clone()),
        (json!(false), json!(false))
    );
    let mut stranger = activity.clone();
    stranger["activity_attempt_id"] = json!("01NOSUCHATTEMPT");
    renew(&h, &stranger, "w1").await.err(404, "attempt_not_found");
    let body = h
        .wpost(
            &format!("/api/worker/activity-tasks/{}/renew-lease", activity["task_id"].as_str().unwrap()),
            json!({"activity_attempt_id": activity["activity_attempt_id"], "lease_owner": "w1", "details": {"x": 1}}),
        )
        .await
        .err(422, "validation_failed");
    assert!(body["errors"]["details"].is_array(), "{body}");

    // A lease left to run out is never revived.
    tokio::time::sleep(Duration::from_millis(LEASE_MS as u64 + 500)).await;
    let late = renew(&h, &activity, "w1").await;
    late.err_one_of(409, &["lease_expired", "attempt_closed", "run_closed"]);
    let history = h.history("renewed", run_id).await;
    assert_eq!(count_events(&history, "ActivityCompleted"), 0);
}
