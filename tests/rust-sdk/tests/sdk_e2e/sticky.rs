//! The Rust SDK's sticky worker and condition waits against Capstan.
// The predicates return the SDK's own `Result`, whose error type is large.
#![allow(clippy::result_large_err)]

use super::*;
use durable_workflow::{StickyCacheOptions, Worker};

/// Runs the worker one task at a time until the run is `waiting` (or closed).
async fn drive_until_waiting(worker: &Worker, handle: &WorkflowHandle) {
    let deadline = Instant::now() + RESULT_TIMEOUT;
    loop {
        let description = within(CALL_TIMEOUT, "describe", handle.describe()).await.expect("describe");
        if description.status.as_deref() == Some("waiting") || description.is_terminal() {
            return;
        }
        assert!(Instant::now() < deadline, "the run never waited");
        within(CALL_TIMEOUT, "run_once", worker.run_once())
            .await
            .unwrap_or_else(|error| panic!("worker step failed: {error} ({error:?})"));
    }
}

/// What the crate's `examples/sticky_execution.rs` does: a sticky worker (its registration is
/// confirmed in full before it may poll) runs a workflow across two signals, its later tasks
/// served from its cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sticky_worker_is_confirmed_and_replays_from_its_cache() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("sticky-q");
    let mut worker = new_worker(&client, &queue)
        .build_id("capstan-sticky-v1")
        .sticky_cache(StickyCacheOptions::new(16).ttl(Duration::from_secs(60)))
        .expect("sticky options");
    worker.register_workflow("e2e.sticky", |ctx, _| async move {
        let value = ctx.side_effect(|| 42)?;
        ctx.wait_signal("first").await?;
        ctx.wait_signal("second").await?;
        Ok(json!({"recorded_value": value}))
    });
    worker
        .declare_workflow_signals("e2e.sticky", &["first", "second"])
        .expect("declare signals");
    within(CALL_TIMEOUT, "register", worker.register())
        .await
        .unwrap_or_else(|error| panic!("sticky registration refused: {error} ({error:?})"));
    let workflow_id = unique("sticky");
    let handle = start(&client, "e2e.sticky", &queue, &workflow_id, json!([])).await;
    drive_until_waiting(&worker, &handle).await;
    for name in ["first", "second"] {
        within(CALL_TIMEOUT, "signal", handle.signal(name, json!([])))
            .await
            .expect("signal");
        within(CALL_TIMEOUT, "run_once", worker.run_once()).await.expect("worker step");
        drive_until_waiting(&worker, &handle).await;
    }
    let result = within(RESULT_TIMEOUT, "result", handle.result(result_options(RESULT_TIMEOUT)))
        .await
        .expect("result");
    assert_eq!(result, json!({"recorded_value": 42}));
    let metrics = worker.sticky_cache_metrics().expect("metrics");
    assert_eq!(metrics.hit, 2, "both signalled tasks replayed from the cache: {metrics:?}");
    assert_eq!(metrics.forced_cold_replay, 0, "{metrics:?}");
}

/// A Rust condition wait that does not resolve at once is replayed on the next task: the
/// replayer requires its occurrence id on the recorded wait (it used to be dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_condition_wait_that_times_out_replays() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("condition-q");
    let mut worker = new_worker(&client, &queue);
    worker.register_workflow("e2e.condition", |ctx, _| async move {
        let waited = durable_workflow::wait_condition!(ctx, "never", timeout: Duration::from_secs(1), || Ok(false)).await?;
        let again = durable_workflow::wait_condition!(ctx, "still-never", timeout: Duration::from_secs(1), || Ok(false)).await?;
        Ok(json!({"first_satisfied": waited.is_satisfied(), "second_satisfied": again.is_satisfied()}))
    });
    let mut running = RunningWorker::start(worker);
    let workflow_id = unique("condition");
    let handle = start(&client, "e2e.condition", &queue, &workflow_id, json!([])).await;
    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("condition workflow did not complete: {error} ({error:?})"));
    assert_eq!(result, json!({"first_satisfied": false, "second_satisfied": false}));
    let run_id = run_id_of(&handle).await;
    let opened = server.history_events(&workflow_id, &run_id).await;
    let occurrences: Vec<Value> = opened
        .iter()
        .filter(|e| e["event_type"] == "ConditionWaitOpened")
        .map(|e| e["payload"]["condition_wait_occurrence_id"].clone())
        .collect();
    assert_eq!(occurrences.len(), 2);
    assert!(
        occurrences
            .iter()
            .all(|o| o.as_str().is_some_and(|s| s.starts_with("rust:condition-wait:"))),
        "{occurrences:?}"
    );
    running.shutdown().await;
}
