//! The Rust SDK's sticky worker and condition waits against Capstan.
// The predicates return the SDK's own `Result`, whose error type is large.
#![allow(clippy::result_large_err)]

use super::*;
use durable_workflow::{StickyCacheOptions, Worker};

/// Runs the worker one task at a time until the run is `waiting` (or closed).
pub(super) async fn drive_until_waiting(worker: &Worker, handle: &WorkflowHandle) {
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
    let worker = sticky_worker(&client, &queue).await;
    let workflow_id = unique("sticky");
    let handle = start(&client, "e2e.sticky", &queue, &workflow_id, json!([])).await;
    drive_until_waiting(&worker, &handle).await;
    for name in ["first", "second"] {
        signal_and_drive(&worker, &handle, name).await;
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

/// A sticky worker for the two-signal workflow of these tests, registered and confirmed.
async fn sticky_worker(client: &Client, queue: &str) -> Worker {
    let mut worker = new_worker(client, queue)
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
    worker
}

pub(super) async fn signal_and_drive(worker: &Worker, handle: &WorkflowHandle, name: &str) {
    within(CALL_TIMEOUT, "signal", handle.signal(name, json!([])))
        .await
        .expect("signal");
    within(CALL_TIMEOUT, "run_once", worker.run_once()).await.expect("worker step");
    drive_until_waiting(worker, handle).await;
}

/// The sticky owner stops polling without a word (a crash, as the server sees it): once the
/// hold runs out its run's next task goes to another worker as a forced cold replay, which
/// replays from history to the right result, and the new worker keeps the run from then on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_sticky_owners_run_moves_to_another_worker_as_a_forced_cold_replay() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("sticky-handover-q");
    let owner = sticky_worker(&client, &queue).await;
    let workflow_id = unique("sticky-handover");
    let handle = start(&client, "e2e.sticky", &queue, &workflow_id, json!([])).await;
    drive_until_waiting(&owner, &handle).await;
    drop(owner); // never polls again, never deregisters

    let rival = sticky_worker(&client, &queue).await;
    let run_id = run_id_of(&handle).await;
    // The task stays held for the silent owner for the hold time: poll until it is handed over.
    within(CALL_TIMEOUT, "signal", handle.signal("first", json!([])))
        .await
        .expect("signal");
    let deadline = Instant::now() + RESULT_TIMEOUT;
    while !server
        .history_event_types(&workflow_id, &run_id)
        .await
        .iter()
        .any(|kind| kind == "SignalApplied")
    {
        assert!(Instant::now() < deadline, "the held task was never handed over");
        within(CALL_TIMEOUT, "run_once", rival.run_once()).await.expect("worker step");
    }
    drive_until_waiting(&rival, &handle).await;
    signal_and_drive(&rival, &handle, "second").await;
    let result = within(RESULT_TIMEOUT, "result", handle.result(result_options(RESULT_TIMEOUT)))
        .await
        .expect("result");
    assert_eq!(result, json!({"recorded_value": 42}));
    let metrics = rival.sticky_cache_metrics().expect("metrics");
    assert_eq!(metrics.forced_cold_replay, 1, "the handed-over task: {metrics:?}");
    assert_eq!(metrics.hit, 1, "the next task stayed with the new owner: {metrics:?}");
}

/// The server is killed and started again mid-workflow: the run's affinity is in its durable
/// document, so the sticky worker's next tasks still come to it as cache hits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sticky_affinity_survives_a_server_restart() {
    let mut server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("sticky-restart-q");
    let worker = sticky_worker(&client, &queue).await;
    let workflow_id = unique("sticky-restart");
    let handle = start(&client, "e2e.sticky", &queue, &workflow_id, json!([])).await;
    drive_until_waiting(&worker, &handle).await;
    server.restart().await;
    signal_and_drive(&worker, &handle, "first").await;
    signal_and_drive(&worker, &handle, "second").await;
    let result = within(RESULT_TIMEOUT, "result", handle.result(result_options(RESULT_TIMEOUT)))
        .await
        .expect("result");
    assert_eq!(result, json!({"recorded_value": 42}));
    let metrics = worker.sticky_cache_metrics().expect("metrics");
    assert_eq!((metrics.hit, metrics.forced_cold_replay), (2, 0), "{metrics:?}");
}

/// A Rust condition wait satisfied by a signal (the predicate reads committed signals), then a
/// second one: both replay with their occurrence ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_condition_wait_satisfied_by_a_signal_replays() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("condition-signal-q");
    let mut worker = new_worker(&client, &queue);
    worker.register_workflow("e2e.votes", |ctx, _| async move {
        let votes = ctx.clone();
        let first = durable_workflow::wait_condition!(ctx, "one-vote", timeout: Duration::from_secs(60), move || Ok(!votes.signals("vote")?.is_empty())).await?;
        let votes = ctx.clone();
        let second = durable_workflow::wait_condition!(ctx, "two-votes", timeout: Duration::from_secs(60), move || Ok(votes.signals("vote")?.len() >= 2)).await?;
        Ok(json!({"first": first.is_satisfied(), "second": second.is_satisfied()}))
    });
    worker.declare_workflow_signals("e2e.votes", &["vote"]).expect("declare signals");
    let mut running = RunningWorker::start(worker);
    let workflow_id = unique("votes");
    let handle = start(&client, "e2e.votes", &queue, &workflow_id, json!([])).await;
    let run_id = run_id_of(&handle).await;
    for expected_waits in [1, 2] {
        let deadline = Instant::now() + RESULT_TIMEOUT;
        loop {
            let kinds = server.history_event_types(&workflow_id, &run_id).await;
            if kinds.iter().filter(|k| *k == "ConditionWaitOpened").count() >= expected_waits {
                break;
            }
            assert!(Instant::now() < deadline, "wait {expected_waits} never opened: {kinds:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        within(CALL_TIMEOUT, "signal", handle.signal("vote", json!([expected_waits])))
            .await
            .expect("signal");
    }
    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("votes workflow did not complete: {error} ({error:?})"));
    assert_eq!(result, json!({"first": true, "second": true}));
    let events = server.history_events(&workflow_id, &run_id).await;
    let satisfied: Vec<&Value> = events.iter().filter(|e| e["event_type"] == "ConditionWaitSatisfied").collect();
    assert_eq!(satisfied.len(), 2, "{events:?}");
    assert!(satisfied
        .iter()
        .all(|e| e["payload"]["condition_wait_occurrence_id"].as_str().is_some()));
    running.shutdown().await;
}
