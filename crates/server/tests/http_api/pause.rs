//! Pausing and resuming a run over HTTP on every backend: a worker's poll gets nothing while the
//! run is paused and its task once resumed; signals land meanwhile; outcomes, repeats, the
//! audit trail, listings, counts and refusals.

use super::*;

/// A worker's long poll of `queue`'s workflow tasks (10 s), left waiting; its task, or null.
fn parked_workflow_poll(h: &Harness, queue: &str, poll_request_id: &str) -> tokio::task::JoinHandle<Value> {
    let (base, http) = (h.base.clone(), h.http.clone());
    let body = json!({"worker_id": "w", "task_queue": queue, "poll_request_id": poll_request_id, "timeout_seconds": 10});
    tokio::spawn(async move {
        let response = http
            .post(format!("{base}/api/worker/workflow-tasks/poll"))
            .header("X-Durable-Workflow-Protocol-Version", "1.20")
            .json(&body)
            .send()
            .await
            .unwrap();
        response.json::<Value>().await.unwrap()["task"].clone()
    })
}

#[tokio::test]
async fn a_paused_run_gives_workers_nothing_until_resumed() {
    let h = Harness::start().await;
    let queue = unique("pause-q");
    let workflow_id = unique("paused");
    h.register("w", &queue).await;
    h.start_workflow(&workflow_id, &queue).await;
    let path = |op: &str| format!("/api/workflows/{workflow_id}/{op}");

    let paused = h
        .cpost(&path("pause"), json!({"reason": "downstream outage", "request_id": "p-1"}))
        .await
        .ok(200);
    assert_eq!(
        (&paused["outcome"], &paused["paused"]),
        (&json!("paused"), &json!(true)),
        "{paused}"
    );
    assert_eq!(paused["pause"]["reason"], "downstream outage");
    assert!(paused["pause"]["principal"].is_object(), "{paused}");
    // A retry of the same request is answered from its receipt; another pause needs nothing.
    let retried = h
        .cpost(&path("pause"), json!({"reason": "downstream outage", "request_id": "p-1"}))
        .await
        .ok(200);
    assert_eq!((&retried["outcome"], &retried["retained"]), (&json!("paused"), &json!(true)));
    assert_eq!(h.cpost(&path("pause"), json!({})).await.ok(200)["outcome"], "pause_not_needed");

    assert!(
        h.poll_workflow("w", &queue, 1).await.is_null(),
        "a paused run's task is not handed out"
    );
    h.cpost(&format!("/api/workflows/{workflow_id}/signal/go"), json!({})).await.ok(202);
    let described = h.describe(&workflow_id).await;
    assert_eq!(
        (&described["paused"], &described["pause"]["reason"]),
        (&json!(true), &json!("downstream outage"))
    );
    let listed = h.cget(&format!("/api/workflows?status=paused&task_queue={queue}")).await.ok(200);
    assert_eq!(listed["workflows"][0]["workflow_id"], json!(workflow_id), "{listed}");
    assert_eq!(listed["workflows"][0]["paused"], true);
    let counts = h.cget(&format!("/api/workflow-counts?task_queue={queue}")).await.ok(200);
    assert_eq!((&counts["running"], &counts["paused"]), (&json!(1), &json!(1)), "{counts}");

    // A long poll parked meanwhile gets the task once the run is resumed.
    let waiting = parked_workflow_poll(&h, &queue, "after-resume");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resumed = h.cpost(&path("resume"), json!({"reason": "fixed"})).await.ok(200);
    assert_eq!((&resumed["outcome"], &resumed["pause"]), (&json!("resumed"), &json!(null)));
    assert_eq!(h.cpost(&path("resume"), json!({})).await.ok(200)["outcome"], "resume_not_needed");
    let task = waiting.await.unwrap();
    assert_eq!(task["workflow_id"], json!(workflow_id), "the parked poll gets the task: {task}");
    let history: Vec<String> = task["history_events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_type"].as_str().unwrap().to_string())
        .collect();
    assert!(history.contains(&"SignalReceived".to_string()), "{history:?}");

    // Who paused and resumed, and why, in the audit trail.
    let audit = h.cget(&format!("/api/workflows/{workflow_id}/audit-events")).await.ok(200);
    let actions: Vec<&str> = audit["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["workflow.resume", "workflow.pause"], "{audit}");
    assert_eq!(audit["events"][1]["detail"]["reason"], "downstream outage");

    // Refusals: an unknown field, another intent under a used request id, a closed run.
    h.cpost(&path("pause"), json!({"until": "tomorrow"}))
        .await
        .err(422, "validation_failed");
    h.cpost(&path("pause"), json!({"reason": "other", "request_id": "p-1"}))
        .await
        .err(409, "request_id_conflict");
    h.cpost(&path("terminate"), json!({})).await.ok(200);
    h.cpost(&path("pause"), json!({})).await.err(409, "run_not_active");
    h.cpost("/api/workflows/nobody-here/pause", json!({}))
        .await
        .err(404, "instance_not_found");
}

#[tokio::test]
async fn a_paused_queue_kind_gives_polls_nothing_until_resumed() {
    let h = Harness::start().await;
    let queue = unique("held-queue");
    h.register("w", &queue).await;
    let path = |op: &str| format!("/api/task-queues/{queue}/{op}");

    let paused = h
        .cpost(&path("pause"), json!({"kind": "workflow", "reason": "deploying"}))
        .await
        .ok(200);
    assert_eq!(paused["outcome"], "paused", "{paused}");
    assert_eq!(
        (&paused["kinds"]["workflow"]["paused"], &paused["kinds"]["activity"]["paused"]),
        (&json!(true), &json!(false))
    );
    assert_eq!(paused["kinds"]["workflow"]["pause"]["reason"], "deploying");
    assert_eq!(
        h.cpost(&path("pause"), json!({"kind": "workflow"})).await.ok(200)["outcome"],
        "pause_not_needed"
    );

    // Work waits, visible: a poll gets nothing, the queue shows its backlog and why.
    let workflow_id = unique("on-held-queue");
    h.start_workflow(&workflow_id, &queue).await;
    assert!(h.poll_workflow("w", &queue, 1).await.is_null(), "a paused kind hands out nothing");
    let described = h.cget(&format!("/api/task-queues/{queue}")).await.ok(200);
    assert_eq!(described["admission"]["workflow_tasks"]["status"], "paused", "{described}");
    assert_eq!(described["admission"]["activity_tasks"]["status"], "open");
    assert_eq!(described["stats"]["workflow_tasks"]["ready_count"], 1);
    let reasons: Vec<&str> = described["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["reason"].as_str().unwrap())
        .collect();
    assert!(reasons.contains(&"task_queue_paused"), "{described}");
    let limits = h.cget(&format!("/api/task-queues/{queue}/limits")).await.ok(200);
    assert_eq!(limits["workflow_task"]["paused"], true, "{limits}");
    let metrics = h.http.get(h.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let series = format!("capstan_task_queue_paused_seconds{{kind=\"workflow\",namespace=\"default\",queue=\"{queue}\"}}");
    assert!(metrics.contains(&series), "{series} while paused:\n{metrics}");

    // A long poll parked on the paused kind gets the task once it is resumed.
    let waiting = parked_workflow_poll(&h, &queue, "queue-resume");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resumed = h.cpost(&path("resume"), json!({})).await.ok(200);
    assert_eq!(resumed["outcome"], "resumed", "{resumed}");
    assert_eq!(resumed["kinds"]["workflow"]["paused"], false);
    let task = waiting.await.unwrap();
    assert_eq!(task["workflow_id"], json!(workflow_id), "the parked poll gets the task: {task}");
    assert_eq!(h.cpost(&path("resume"), json!({})).await.ok(200)["outcome"], "resume_not_needed");

    h.cpost(&path("pause"), json!({"kind": "timer"}))
        .await
        .err(422, "validation_failed");
    h.cpost(&path("pause"), json!({"until": "later"}))
        .await
        .err(422, "validation_failed");
}
