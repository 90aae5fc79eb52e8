//! Standalone activities over HTTP on every backend: start, the worker's task, describe with the
//! result, listing, and the refusals.

use super::*;

#[tokio::test]
async fn a_standalone_activity_is_served_to_a_worker_and_described_with_its_result() {
    let h = Harness::start().await;
    let queue = unique("standalone-q");
    let activity_id = unique("standalone");
    let started = h
        .cpost(
            "/api/activities",
            json!({"activity_id": activity_id, "activity_type": "sa.add", "task_queue": queue,
                   "input": env("wwHioz3/VYAiNwwA"), "retry_policy": {"max_attempts": 2},
                   "schedule_to_close_timeout_seconds": 60}),
        )
        .await
        .ok(201);
    assert_eq!(started["workflow_type"], "dw.standalone_activity");
    assert_eq!(
        (started["status"].as_str(), started["command_status"].as_str()),
        (Some("running"), Some("accepted"))
    );
    assert_eq!(started["activity_class"], "sa.add", "the class defaults to the type");
    assert!(started["schedule_to_close_deadline_at"].is_string(), "{started}");
    h.register("sa-worker", &queue).await;
    assert!(h.poll_workflow("sa-worker", &queue, 0).await.is_null(), "no workflow task, ever");
    let task = h.next_activity_task("sa-worker", &queue).await;
    assert_eq!(task["workflow_id"], activity_id.as_str());
    assert_eq!(task["activity_execution_id"], started["activity_execution_id"]);
    let running = h.cget(&format!("/api/activities/{activity_id}")).await.ok(200);
    assert_eq!(
        (running["activity_status"].as_str(), running["attempt_count"].as_u64()),
        (Some("running"), Some(1))
    );
    assert!(running["result"].is_null());
    h.complete_activity(&task, "wwHioz3/VYAiNwwC").await.ok(200);
    let done = h.cget(&format!("/api/activities/{activity_id}")).await.ok(200);
    assert_eq!(
        (done["status"].as_str(), done["closed_reason"].as_str()),
        (Some("completed"), Some("completed"))
    );
    assert_eq!(done["result"], json!({"codec": "avro", "blob": "wwHioz3/VYAiNwwC"}));
    let listed = h.cget("/api/activities?status=completed&page_size=200").await.ok(200);
    let ids: Vec<&str> = listed["activities"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a["activity_id"].as_str())
        .collect();
    assert!(ids.contains(&activity_id.as_str()), "{listed}");
    assert!(listed["activities"][0].get("result").is_none(), "listings carry no results");
}

#[tokio::test]
async fn standalone_activity_requests_are_checked() {
    let h = Harness::start().await;
    h.cget("/api/activities/nobody").await.err(404, "activity_not_found");
    let missing_type = h.cpost("/api/activities", json!({"task_queue": "q"})).await;
    assert!(missing_type.err(422, "validation_failed")["errors"]["activity_type"].is_array());
    let unknown = h.cpost("/api/activities", json!({"activity_type": "a", "priority": 1})).await;
    assert!(unknown.err(422, "validation_failed")["errors"]["priority"].is_array());
    let bad_policy = h
        .cpost(
            "/api/activities",
            json!({"activity_type": "a", "retry_policy": {"max_attempts": 2, "jitter": 1}}),
        )
        .await;
    assert!(bad_policy.err(422, "validation_failed")["errors"]["retry_policy.jitter"].is_array());
    let bad_id = h
        .cpost("/api/activities", json!({"activity_type": "a", "activity_id": "a b"}))
        .await;
    assert!(bad_id.err(422, "validation_failed")["errors"]["activity_id"].is_array());
    h.cget("/api/activities?page_size=0").await.err(422, "validation_failed");
    h.cget("/api/activities?status=sleeping").await.err(422, "validation_failed");
    h.cget("/api/activities?next_page_token=%25%25")
        .await
        .err(400, "invalid_page_token");
}
