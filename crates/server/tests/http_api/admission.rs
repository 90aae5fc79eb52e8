//! Overload that bends (`crates/server/src/admission/`): once writes stand in line past the
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

/// The in-flight limit is a hard bound: with the writer held, the starts past it are refused at
/// once (503, `Retry-After`, nothing done) while the admitted ones wait, and those all finish
/// when it is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_work_past_the_in_flight_limit_is_refused_at_once_and_the_admitted_finish() {
    let h = Harness::start().await;
    let Some(store) = h.sqlite() else { return };
    let limit = gauge(&h, "capstan_admission_inflight_limit{plane=\"control\"}").await;
    assert!(limit >= 16, "the control plane's limit: {limit}");
    let held = store.replication().pause_writes().await;
    let offered = limit + 10;
    let (answers, mut answered) = tokio::sync::mpsc::unbounded_channel();
    for n in 0..offered {
        let request = h
            .client(Method::POST, "/api/workflows")
            .json(&json!({"workflow_id": format!("held-{n}"), "workflow_type": "t", "task_queue": "q", "input": env(EMPTY_ARGS)}));
        let answers = answers.clone();
        tokio::spawn(async move { answers.send((n, send_allowing_server_errors(request).await)) });
    }
    let mut refused = Vec::new();
    while refused.len() < 10 {
        let (n, response) = tokio::time::timeout(Duration::from_secs(10), answered.recv())
            .await
            .expect("the starts past the limit are answered while the writer is held")
            .unwrap();
        assert_eq!(response.header("retry-after").as_deref(), Some("1"));
        response.err(503, "server_overloaded");
        refused.push(n);
    }
    assert_eq!(gauge(&h, "capstan_admission_inflight{plane=\"control\"}").await, limit);

    drop(held);
    for _ in 0..limit {
        let (_, response) = tokio::time::timeout(Duration::from_secs(10), answered.recv())
            .await
            .expect("the admitted starts finish")
            .unwrap();
        assert_eq!(response.status.as_u16(), 201);
    }
    for n in refused {
        h.cget(&format!("/api/workflows/held-{n}")).await.err(404, "instance_not_found");
    }
}

async fn gauge(h: &Harness, series: &str) -> u64 {
    let text = h.bare(Method::GET, "/metrics").send().await.unwrap().text().await.unwrap();
    let line = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&line))
        .unwrap_or_else(|| panic!("{series} in /metrics"))
        .parse()
        .unwrap()
}
