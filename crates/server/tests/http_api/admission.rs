//! Overload that bends (`crates/server/src/admission.rs`): once writes stand in line past the
//! target, new work is refused with 503 `server_overloaded` and polls with 429
//! `long_poll_capacity_exhausted`, both with `Retry-After`, nothing done; reads go on; and
//! when the line is gone everything is admitted again. (SQLite: the standing queue is
//! injected; the shared databases measure their pool's wait with the same code.)

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standing_write_queue_refuses_new_work_and_polls_with_retry_after_and_reads_go_on() {
    let h = Harness::start().await;
    h.register("w1", "q").await;
    h.start_workflow("before", "q").await;
    // A standing queue: writes read as waiting 300 ms (SQLite's injected fault; the measure
    // itself is `capstan_store::pressure`'s unit test).
    let Some(store) = h.sqlite() else { return };
    store.inject_write_delay(Duration::from_millis(300));

    let refused = send_allowing_server_errors(
        h.client(Method::POST, "/api/workflows")
            .json(&json!({"workflow_id": "refused", "workflow_type": "t", "task_queue": "q", "input": env(EMPTY_ARGS)})),
    )
    .await;
    assert_eq!(refused.header("retry-after").as_deref(), Some("1"));
    let body = refused.err(503, "server_overloaded");
    assert_eq!(
        (body["retryable"].clone(), body["retry_after_seconds"].clone()),
        (json!(true), json!(1))
    );

    let shed = h
        .wpost(
            "/api/worker/workflow-tasks/poll",
            json!({"worker_id": "w1", "task_queue": "q", "poll_request_id": "p1"}),
        )
        .await;
    assert_eq!(shed.header("retry-after").as_deref(), Some("1"));
    let body = shed.err(429, "long_poll_capacity_exhausted");
    for (key, value) in [
        ("poll_status", json!("long_poll_capacity_exhausted")),
        ("task", Value::Null),
        ("task_kind", json!("workflow_task")),
        ("task_queue", json!("q")),
        ("retryable", json!(true)),
        ("retry_after_seconds", json!(1)),
        ("poll_request_id", json!("p1")),
    ] {
        assert_eq!(body[key], value, "{key}: {body}");
    }
    // Reads are never refused.
    h.cget("/api/workflows/before").await.ok(200);

    // The line gone, everything is admitted again; the refused start did nothing.
    wait_for("the queue to clear", Duration::from_secs(5), || async {
        let response = send_allowing_server_errors(
            h.client(Method::POST, "/api/workflows")
                .json(&json!({"workflow_id": "after", "workflow_type": "t", "task_queue": "q", "input": env(EMPTY_ARGS)})),
        )
        .await;
        (response.status.as_u16() == 201).then_some(())
    })
    .await;
    h.cget("/api/workflows/refused").await.err(404, "instance_not_found");
    let text = h.bare(Method::GET, "/metrics").send().await.unwrap().text().await.unwrap();
    for plane in ["poll", "control"] {
        let line = format!("capstan_admission_refused_total{{plane=\"{plane}\"}} ");
        let count: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .unwrap_or_else(|| panic!("{line} in /metrics"))
            .parse()
            .unwrap();
        assert!(count >= 1, "{plane}: {count}");
    }
}
