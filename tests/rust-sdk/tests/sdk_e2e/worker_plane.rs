//! The Rust SDK's worker-plane authorities against Capstan: activity lease renewal
//! (`activity_lease_renewal`, `/renew-lease`), which the crate turns on by itself when the
//! server advertises it and then checks every activity poll, renewal and heartbeat reply.

use super::*;
use durable_workflow::CancellationPolicy;

/// With a 2 s activity lease, an attempt that runs 7 s without a heartbeat completes on its
/// only attempt because the worker renews its lease; without renewals the lease expires and
/// the run fails. The renewals leave no trace in history.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_activity_outlives_its_lease_by_renewing_it() {
    let server = CapstanServer::spawn_with(&["--activity-task-lease-seconds", "2"]).await;
    let client = server.client();
    let queue = unique("renew-q");
    let mut worker = new_worker(&client, &queue);
    worker.register_activity("e2e.outlast", |_ctx, _input| async move {
        tokio::time::sleep(Duration::from_secs(7)).await;
        Ok(json!("outlasted"))
    });
    worker.register_workflow("e2e.outlast", |ctx, _input| async move {
        let options = ActivityOptions::new()
            .retry_policy(ActivityRetryPolicy::new(1))
            .start_to_close_timeout(Duration::from_secs(120))
            .heartbeat_timeout(Duration::from_secs(60));
        let outcome = ctx.activity_with_options("e2e.outlast", options, json!([])).await?;
        Ok(json!({"activity": outcome}))
    });
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("renew");
    let handle = start(&client, "e2e.outlast", &queue, &workflow_id, json!([])).await;
    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("renewing workflow did not complete: {error} ({error:?})\n{}", server.log_tail()));
    assert_eq!(result, json!({"activity": "outlasted"}));

    let run_id = run_id_of(&handle).await;
    let kinds = server.history_event_types(&workflow_id, &run_id).await;
    assert_eq!(kinds.iter().filter(|k| *k == "ActivityStarted").count(), 1, "{kinds:?}");
    assert!(!kinds.iter().any(|k| k == "ActivityHeartbeatRecorded"), "{kinds:?}");
    running.shutdown().await;
}

/// A cooperative Rust worker (`cooperative_cancellation(true)`) whose running activity a
/// delivered cancellation interrupts: its claim observer sees the stop receipt on `/status`,
/// drops the callback and acknowledges the stop (`/acknowledge-cancellation`; a refused or
/// malformed acknowledgement would stop the whole worker), and the run ends cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cooperative_worker_acknowledges_the_stop_of_an_interrupted_activity() {
    let events = cancel_a_running_activity(None).await;
    let count = |kind: &str| events.iter().filter(|e| e["event_type"] == kind).count();
    assert_eq!((count("ActivityCancelled"), count("CooperativeCancellationDelivered")), (1, 1));
}

/// The same with `wait_cancellation_completed`: the delivery is deferred (the claim released)
/// until the activity's worker has acknowledged its stop, and the history says so in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_cancellation_completed_activity_is_stopped_before_the_delivery() {
    let events = cancel_a_running_activity(Some(CancellationPolicy::WaitCancellationCompleted)).await;
    let order: Vec<&str> = events
        .iter()
        .filter_map(|e| e["event_type"].as_str())
        .filter(|kind| {
            [
                "ActivityCancelled",
                "ActivityCancellationAcknowledged",
                "CooperativeCancellationDelivered",
                "WorkflowCancelled",
            ]
            .contains(kind)
        })
        .collect();
    assert_eq!(
        order,
        [
            "ActivityCancelled",
            "ActivityCancellationAcknowledged",
            "CooperativeCancellationDelivered",
            "WorkflowCancelled"
        ]
    );
}

/// Runs a workflow whose activity blocks, requests a cooperative cancellation while it runs,
/// waits for the run to end cancelled and the activity's worker to acknowledge its stop, and
/// returns the run's history. The worker must shut down cleanly afterwards.
async fn cancel_a_running_activity(policy: Option<CancellationPolicy>) -> Vec<Value> {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("stop-q");
    let worker_id = unique("stop-worker");
    let mut worker = new_worker(&client, &queue)
        .worker_id(worker_id.clone())
        .cooperative_cancellation(true);
    worker.register_activity("e2e.blocked", |_ctx, _input| async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        Ok(json!("not stopped"))
    });
    worker.register_workflow("e2e.stoppable", move |ctx, _input| async move {
        let mut options = ActivityOptions::new();
        if let Some(policy) = policy {
            options = options.cancellation_policy(policy);
        }
        match ctx.activity_with_options("e2e.blocked", options, json!([])).await {
            Ok(value) => Ok(json!({"activity": value})),
            Err(Error::CooperativeCancellationRequested(_)) => Ok(json!("cleaned up")),
            Err(other) => Err(other),
        }
    });
    let mut running = RunningWorker::start(worker);
    let workflow_id = unique("stoppable");
    let handle = start(&client, "e2e.stoppable", &queue, &workflow_id, json!([])).await;
    let run_id = run_id_of(&handle).await;
    server
        .wait_for_history_event(&workflow_id, &run_id, "ActivityStarted", RESULT_TIMEOUT)
        .await;
    let options = durable_workflow::CooperativeCancellationOptions {
        reason: Some("stop".to_string()),
        cleanup_timeout_seconds: Some(60),
    };
    within(CALL_TIMEOUT, "request cancellation", handle.request_cancellation(options))
        .await
        .expect("request_cancellation");
    match running.result(&handle).await {
        Err(Error::WorkflowCancelled(outcome)) => assert_eq!(outcome.kind, WorkflowTerminalKind::Cancelled),
        other => panic!("expected Error::WorkflowCancelled, got {other:?}"),
    }
    let events = server.history_events(&workflow_id, &run_id).await;
    let started = events.iter().find(|e| e["event_type"] == "ActivityStarted").expect("started");
    let (task_id, attempt_id) = (
        started["payload"]["task_id"].as_str().unwrap().to_string(),
        started["payload"]["activity_attempt_id"].as_str().unwrap().to_string(),
    );
    let deadline = Instant::now() + RESULT_TIMEOUT;
    let status = loop {
        let status = within(
            CALL_TIMEOUT,
            "status",
            client.activity_task_status(&task_id, &attempt_id, &worker_id),
        )
        .await
        .expect("status");
        if status["cancellation_acknowledgement"]["callback_state"] == "stopped" {
            break status;
        }
        assert!(Instant::now() < deadline, "the stop was never acknowledged: {status}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(status["cancel_requested"], true);
    let cancelled = events.iter().find(|e| e["event_type"] == "ActivityCancelled").expect("cancelled");
    assert_eq!(
        status["cancellation_acknowledgement"]["cancellation_history_event_id"],
        cancelled["id"]
    );
    // The worker is still alive and shuts down cleanly.
    running.shutdown().await;
    events
}
