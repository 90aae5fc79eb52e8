//! Redrive over HTTP on every backend: a failed run's successor, its repeat, and the refusals.

use super::*;

/// Runs `workflow_id` to a failure at step 2 (step 1 completed); returns the failed run id.
pub(super) async fn fail_at_step_two(h: &Harness, workflow_id: &str, queue: &str) -> String {
    let started = h.start_workflow(workflow_id, queue).await;
    h.register("rd-worker", queue).await;
    let once = |activity_type: &str| {
        let mut command = schedule_activity(activity_type, queue);
        command["retry_policy"] = json!({"max_attempts": 1});
        json!([command])
    };
    let task = h.next_workflow_task("rd-worker", queue).await;
    h.complete_workflow_task(&task, once("rd.first")).await.ok(200);
    let activity = h.next_activity_task("rd-worker", queue).await;
    h.complete_activity(&activity, "wwHioz3/VYAiNwwC").await.ok(200);
    let task = h.next_workflow_task("rd-worker", queue).await;
    h.complete_workflow_task(&task, once("rd.second")).await.ok(200);
    let activity = h.next_activity_task("rd-worker", queue).await;
    h.fail_activity(&activity, "broken").await.ok(200);
    let task = h.next_workflow_task("rd-worker", queue).await;
    let fail = json!([{"type": "fail_workflow", "message": "broken", "failed_step_sequence": 2,
                       "failed_activity_execution_id": activity["activity_execution_id"]}]);
    h.complete_workflow_task(&task, fail).await.ok(200);
    started["run_id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_failed_run_is_redriven_once_and_its_successor_resumes_at_the_failed_step() {
    let h = Harness::start().await;
    let queue = unique("redrive-q");
    let failed = fail_at_step_two(&h, "rd-wf", &queue).await;
    let path = format!("/api/workflows/rd-wf/runs/{failed}/redrive");
    let first = h.cpost(&path, json!({"request_id": "fix-1"})).await.ok(202);
    assert_eq!(
        (first["outcome"].as_str(), first["command_status"].as_str()),
        (Some("redriven"), Some("accepted"))
    );
    assert_eq!(
        (first["continued_from_run_id"].as_str(), first["resume_step_sequence"].as_u64()),
        (Some(failed.as_str()), Some(2))
    );
    let successor = first["run_id"].as_str().unwrap().to_string();
    assert_ne!(successor, failed);
    let repeat = h.cpost(&path, json!({"request_id": "other"})).await.ok(200);
    assert_eq!(repeat["run_id"], successor.as_str());
    let described = h.cget("/api/workflows/rd-wf").await.ok(200);
    assert_eq!(described["run_id"], successor.as_str());
    assert_eq!(
        (described["recovery_kind"].as_str(), described["resume_step_sequence"].as_u64()),
        (Some("redrive"), Some(2))
    );
    let source = h.cget(&format!("/api/workflows/rd-wf/runs/{failed}")).await.ok(200);
    assert_eq!(
        (source["status"].as_str(), source["redriven_to_run_id"].as_str()),
        (Some("failed"), Some(successor.as_str()))
    );
    // The successor's first task sees the copied step and schedules the failed one again.
    let task = h.next_workflow_task("rd-worker", &queue).await;
    assert_eq!(task["run_id"], successor.as_str());
    h.complete_workflow_task(&task, json!([schedule_activity("rd.second", &queue)]))
        .await
        .ok(200);
    // The successor's chain continues the failed run's.
    let source_head = source["history_head_hash"].as_str().unwrap();
    let events = h.history_from("rd-wf", &successor, source_head).await;
    let scheduled: Vec<_> = events
        .iter()
        .filter(|e| e["event_type"] == "ActivityScheduled")
        .map(|e| e["payload"]["sequence"].clone())
        .collect();
    assert_eq!(scheduled, [json!(2)]);
    let not_current = h.cpost(&path.replace(&failed, &successor), json!({})).await;
    not_current.err(409, "run_not_failed");
}

#[tokio::test]
async fn redrive_requests_are_checked() {
    let h = Harness::start().await;
    let queue = unique("redrive-bad-q");
    h.cpost("/api/workflows/nobody/runs/r/redrive", json!({}))
        .await
        .err(404, "instance_not_found");
    h.start_workflow("rd-open", &queue).await;
    h.cpost("/api/workflows/rd-open/runs/nope/redrive", json!({}))
        .await
        .err(404, "run_not_found");
    let run_id = h.cget("/api/workflows/rd-open").await.ok(200)["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let path = format!("/api/workflows/rd-open/runs/{run_id}/redrive");
    let open = h.cpost(&path, json!({})).await.err(409, "run_not_failed");
    assert_eq!(open["control_plane"]["operation"], "redrive");
    let long = h.cpost(&path, json!({"request_id": "x".repeat(192)})).await;
    assert!(long.err(422, "validation_failed")["errors"]["request_id"].is_array());
    let unknown = h.cpost(&path, json!({"reason": "because"})).await;
    assert!(unknown.err(422, "validation_failed")["errors"]["reason"].is_array());
}
