//! Batch operations over HTTP on every backend: a dry run counts, a batch acts on every run its
//! query selects (each once, skipped runs with their reason), reports progress, follows its
//! rate, can be cancelled; refusals.

use super::*;

/// Polls a batch until it leaves `running` (or the wait runs out).
async fn finished(h: &Harness, batch_id: &str) -> Value {
    wait_for("the batch to finish", Duration::from_secs(60), || async {
        let batch = h.cget(&format!("/api/batch-operations/{batch_id}")).await.ok(200);
        (batch["state"] != "running").then_some(batch)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_acts_once_on_every_run_its_query_selects() {
    let h = Harness::start().await;
    let queue = unique("batch-q");
    for i in 0..120 {
        h.start_workflow(&format!("{queue}-{i:03}"), &queue).await;
    }
    // One is closed already: the batch skips it, with its reason.
    h.cpost(&format!("/api/workflows/{queue}-000/terminate"), json!({})).await.ok(200);
    let other_queue = unique("untouched-q");
    h.start_workflow(&format!("{other_queue}-0"), &other_queue).await;

    let dry = h
        .cpost(
            "/api/batch-operations",
            json!({"action": "pause", "task_queue": queue, "status": "running", "dry_run": true}),
        )
        .await
        .ok(200);
    assert_eq!(dry["matched"], 119, "{dry}");

    let created = h
        .cpost(
            "/api/batch-operations",
            json!({"action": "pause", "task_queue": queue, "reason": "maintenance", "request_id": "pause-all"}),
        )
        .await
        .ok(201);
    let batch_id = created["batch_id"].as_str().unwrap().to_string();
    assert_eq!(created["state"], "running");
    // The same request again is the same batch.
    let repeated = h
        .cpost(
            "/api/batch-operations",
            json!({"action": "pause", "task_queue": queue, "reason": "maintenance", "request_id": "pause-all"}),
        )
        .await
        .ok(200);
    assert_eq!(repeated["batch_id"], json!(batch_id));
    let done = finished(&h, &batch_id).await;
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(
        (&done["matched"], &done["done"], &done["failed"]),
        (&json!(120), &json!(119), &json!(0)),
        "{done}"
    );
    assert_eq!(done["skipped_by_reason"]["run_not_active"], 1, "{done}");
    assert!(done["principal"].is_object());
    let counts = h.cget(&format!("/api/workflow-counts?task_queue={queue}")).await.ok(200);
    assert_eq!(counts["paused"], 119, "{counts}");
    let untouched = h.describe(&format!("{other_queue}-0")).await;
    assert_eq!(untouched["paused"], false, "a run the query does not select is left alone");
    // Each run was paused once, by the batch's principal, with its reason.
    let audit = h.cget(&format!("/api/workflows/{queue}-007/audit-events")).await.ok(200);
    let pauses: Vec<&Value> = audit["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "workflow.pause")
        .collect();
    assert_eq!(pauses.len(), 1, "{audit}");
    assert_eq!(pauses[0]["detail"]["reason"], "maintenance");

    // A signal batch, then a terminate batch over the same runs.
    let signalled = h
        .cpost(
            "/api/batch-operations",
            json!({"action": "signal", "task_queue": queue, "signal_name": "poke"}),
        )
        .await
        .ok(201);
    let signalled = finished(&h, signalled["batch_id"].as_str().unwrap()).await;
    assert_eq!(signalled["done"], 119, "{signalled}");
    let history = h
        .history(
            &format!("{queue}-042"),
            h.describe(&format!("{queue}-042")).await["run_id"].as_str().unwrap(),
        )
        .await;
    assert_eq!(count_events(&history, "SignalReceived"), 1);
    let terminated = h
        .cpost(
            "/api/batch-operations",
            json!({"action": "terminate", "task_queue": queue, "status": "running"}),
        )
        .await
        .ok(201);
    let terminated = finished(&h, terminated["batch_id"].as_str().unwrap()).await;
    assert_eq!(terminated["done"], 119, "{terminated}");
    let counts = h.cget(&format!("/api/workflow-counts?task_queue={queue}")).await.ok(200);
    assert_eq!((&counts["running"], &counts["failed"]), (&json!(0), &json!(120)), "{counts}");
    let listed = h.cget("/api/batch-operations").await.ok(200);
    assert_eq!(listed["batch_operations"].as_array().unwrap().len(), 3);
    assert_eq!(listed["batch_operations"][0]["action"], "terminate", "newest first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_follows_its_rate_and_stops_when_cancelled() {
    let h = Harness::start().await;
    let queue = unique("slow-batch-q");
    for i in 0..40 {
        h.start_workflow(&format!("{queue}-{i:02}"), &queue).await;
    }
    let created = h
        .cpost(
            "/api/batch-operations",
            json!({"action": "cancel", "task_queue": queue, "rate_per_second": 10}),
        )
        .await
        .ok(201);
    let batch_id = created["batch_id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let cancelled = h
        .cpost(&format!("/api/batch-operations/{batch_id}/cancel"), json!({}))
        .await
        .ok(200);
    assert_eq!(cancelled["state"], "cancelled");
    let matched = cancelled["matched"].as_u64().unwrap();
    assert!((1..=30).contains(&matched), "10 a second for about a second: {cancelled}");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let later = h.cget(&format!("/api/batch-operations/{batch_id}")).await.ok(200);
    assert!(
        later["matched"].as_u64().unwrap() <= matched + 10,
        "nothing after the cancel but the step under way: {later}"
    );
    let counts = h.cget(&format!("/api/workflow-counts?task_queue={queue}")).await.ok(200);
    assert!(counts["running"].as_u64().unwrap() >= 10, "{counts}");

    // Refusals.
    h.cpost("/api/batch-operations", json!({"action": "explode"}))
        .await
        .err(422, "validation_failed");
    h.cpost("/api/batch-operations", json!({"action": "signal"}))
        .await
        .err(422, "validation_failed");
    h.cpost("/api/batch-operations", json!({"action": "pause", "colour": "red"}))
        .await
        .err(422, "validation_failed");
    h.cpost("/api/batch-operations", json!({"action": "pause", "query": "Nope = 1"}))
        .await
        .err(422, "unknown_search_attribute");
    h.cget("/api/batch-operations/nope").await.err(404, "batch_operation_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_redrives_failed_runs_and_archives_closed_ones() {
    let h = Harness::start().await;
    let queue = unique("redrive-batch-q");
    let failed: Vec<String> = {
        let mut runs = Vec::new();
        for i in 0..3 {
            runs.push(super::redrive::fail_at_step_two(&h, &format!("{queue}-failed-{i}"), &queue).await);
        }
        runs
    };
    h.start_workflow(&format!("{queue}-open"), &queue).await;
    let redriven = h
        .cpost("/api/batch-operations", json!({"action": "redrive", "task_queue": queue}))
        .await
        .ok(201);
    let redriven = finished(&h, redriven["batch_id"].as_str().unwrap()).await;
    assert_eq!((&redriven["matched"], &redriven["done"]), (&json!(4), &json!(3)), "{redriven}");
    assert_eq!(redriven["skipped_by_reason"]["run_not_failed"], 1, "{redriven}");
    for (i, run_id) in failed.iter().enumerate() {
        let source = h.cget(&format!("/api/workflows/{queue}-failed-{i}/runs/{run_id}")).await.ok(200);
        assert!(source["redriven_to_run_id"].is_string(), "{source}");
    }
    // Archive: the open successors and the open run are skipped; terminate them, then archive.
    let terminated = h
        .cpost("/api/batch-operations", json!({"action": "terminate", "task_queue": queue}))
        .await
        .ok(201);
    finished(&h, terminated["batch_id"].as_str().unwrap()).await;
    let archived = h
        .cpost(
            "/api/batch-operations",
            json!({"action": "archive", "task_queue": queue, "reason": "audit"}),
        )
        .await
        .ok(201);
    let archived = finished(&h, archived["batch_id"].as_str().unwrap()).await;
    assert_eq!((&archived["matched"], &archived["done"]), (&json!(4), &json!(4)), "{archived}");
    assert_eq!(h.describe(&format!("{queue}-open")).await["archived"], true);
}

/// A delete batch takes the admin role; it deletes the closed runs' instances, skips the open
/// one, and keeps who deleted each in its audit trail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delete_batch_removes_closed_instances_for_an_admin_only() {
    let h = Harness::with_config(
        ServerConfig {
            auth: Tokens::config(),
            ..ServerConfig::default()
        },
        Some(Tokens::ADMIN),
    )
    .await;
    let queue = unique("delete-batch-q");
    for i in 0..3 {
        h.start_workflow(&format!("{queue}-{i}"), &queue).await;
    }
    for i in 0..2 {
        h.cpost(&format!("/api/workflows/{queue}-{i}/terminate"), json!({"reason": "done"}))
            .await
            .ok(200);
    }
    let delete = json!({"action": "delete", "task_queue": queue, "reason": "cleanup"});
    let as_operator = |body: &Value| {
        h.bare(Method::POST, "/api/batch-operations")
            .header(CONTROL_HEADER, "2")
            .header("X-Namespace", "default")
            .bearer_auth(Tokens::OPERATOR)
            .json(body)
    };
    send(as_operator(&delete)).await.err(403, "forbidden");
    let mut dry = delete.clone();
    dry["dry_run"] = json!(true);
    assert_eq!(send(as_operator(&dry)).await.ok(200)["matched"], 3, "an operator may count");

    let batch = h.cpost("/api/batch-operations", delete).await.ok(201);
    let batch = finished(&h, batch["batch_id"].as_str().unwrap()).await;
    assert_eq!((&batch["matched"], &batch["done"]), (&json!(3), &json!(2)), "{batch}");
    assert_eq!(batch["skipped_by_reason"]["run_not_closed"], 1, "{batch}");
    for i in 0..2 {
        h.cget(&format!("/api/workflows/{queue}-{i}")).await.err(404, "instance_not_found");
        let audit = h.cget(&format!("/api/workflows/{queue}-{i}/audit-events")).await.ok(200);
        let events = audit["events"].as_array().unwrap();
        assert_eq!(events.len(), 1, "{audit}");
        assert_eq!(events[0]["action"], "workflow.delete");
        assert_eq!(events[0]["principal"]["id"], "role:admin", "{audit}");
    }
    assert_eq!(h.describe(&format!("{queue}-2")).await["status"], "pending", "the open run stays");
    let counts = h.cget(&format!("/api/workflow-counts?task_queue={queue}")).await.ok(200);
    assert_eq!(counts["running"], 1, "{counts}");
}
