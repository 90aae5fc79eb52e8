//! End-to-end interoperability: the published `durable-workflow` 4.10.2 Rust
//! SDK (real `Client` + `Worker`) drives a freshly spawned `capstan serve`.
//!
//! Every test starts its own server (free port, temporary data directory),
//! runs one SDK worker, bounds every wait with a timeout, and finishes by
//! stopping the worker through the SDK's clean shutdown path, which ends with
//! `DELETE /api/worker/registrations/{id}`.

#[path = "sdk_e2e/cluster.rs"]
mod cluster;
#[path = "sdk_e2e/external_payloads.rs"]
mod external_payloads;
#[path = "sdk_e2e/history_budget.rs"]
mod history_budget;
#[path = "sdk_e2e/message_streams.rs"]
mod message_streams;
#[path = "sdk_e2e/nexus.rs"]
mod nexus;
#[path = "sdk_e2e/redrive.rs"]
mod redrive;
#[path = "sdk_e2e/sessions.rs"]
mod sessions;
#[path = "sdk_e2e/sticky.rs"]
mod sticky;
mod support;
#[path = "sdk_e2e/task_failures.rs"]
mod task_failures;
#[path = "sdk_e2e/tls.rs"]
mod tls;
#[path = "sdk_e2e/worker_plane.rs"]
mod worker_plane;
#[path = "sdk_e2e/workflow_streams.rs"]
mod workflow_streams;

use std::{
    collections::BTreeSet,
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use durable_workflow::{
    json, ActivityError, ActivityOptions, ActivityRetryPolicy, Client, Error, Value, WorkflowCommandKind, WorkflowCommandOptions,
    WorkflowHandle, WorkflowTerminalKind,
};
use serde::{Deserialize, Serialize};
use support::{new_worker, result_options, unique, within, CapstanServer, RunningWorker, CALL_TIMEOUT, RESULT_TIMEOUT};
use tokio::task::JoinSet;

/// Start a workflow through the SDK client, bounded by [`CALL_TIMEOUT`].
async fn start<T: Serialize>(client: &Client, workflow_type: &str, task_queue: &str, workflow_id: &str, input: T) -> WorkflowHandle {
    within(
        CALL_TIMEOUT,
        &format!("start_workflow {workflow_type} as {workflow_id}"),
        client.start_workflow(workflow_type, task_queue, workflow_id, input),
    )
    .await
    .unwrap_or_else(|error| panic!("start_workflow {workflow_id} failed: {error} ({error:?})"))
}

/// The run id the start response reported, or the current run from describe.
async fn run_id_of(handle: &WorkflowHandle) -> String {
    if let Some(run_id) = &handle.run_id {
        return run_id.clone();
    }
    let description = within(CALL_TIMEOUT, "describe", handle.describe())
        .await
        .expect("describe workflow");
    description.run_id.expect("describe response carries a run_id")
}

// ---------------------------------------------------------------------------
// 1. A workflow with one activity returns the activity's result.
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
struct GreetingRequest {
    name: String,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
struct GreetingResult {
    greeting: String,
    activity_calls: u32,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workflow_returns_its_activity_result() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("greet-q");

    let calls = Arc::new(AtomicU32::new(0));
    let mut worker = new_worker(&client, &queue);
    {
        let calls = Arc::clone(&calls);
        worker.register_typed_activity("e2e.greet", move |_ctx, request: GreetingRequest| {
            let calls = Arc::clone(&calls);
            async move {
                let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
                Ok(GreetingResult {
                    greeting: format!("Hello, {}!", request.name),
                    activity_calls: call,
                })
            }
        });
    }
    worker.register_typed_workflow("e2e.greeting", |ctx, request: GreetingRequest| async move {
        let from_activity: GreetingResult = ctx.activity_typed("e2e.greet", request).await?;
        Ok(from_activity)
    });
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("greeting");
    let handle = start(
        &client,
        "e2e.greeting",
        &queue,
        &workflow_id,
        GreetingRequest {
            name: "Capstan".to_string(),
        },
    )
    .await;
    assert_eq!(handle.workflow_id, workflow_id);
    assert_eq!(handle.workflow_type, "e2e.greeting");

    let result: GreetingResult = running
        .guard(
            RESULT_TIMEOUT,
            "typed greeting result",
            handle.result_typed(result_options(RESULT_TIMEOUT)),
        )
        .await
        .unwrap_or_else(|error| panic!("greeting workflow did not complete: {error} ({error:?})"));
    assert_eq!(
        result,
        GreetingResult {
            greeting: "Hello, Capstan!".to_string(),
            activity_calls: 1,
        }
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1, "activity ran exactly once");

    // The dynamic result surface decodes the same output_envelope.
    let dynamic = running.result(&handle).await.expect("dynamic result");
    assert_eq!(dynamic, json!({"greeting": "Hello, Capstan!", "activity_calls": 1}));
    let description = within(CALL_TIMEOUT, "describe", handle.describe())
        .await
        .expect("describe completed workflow");
    assert!(description.is_completed(), "status: {:?}", description.status);
    assert_eq!(description.workflow_id.as_deref(), Some(workflow_id.as_str()));

    running.shutdown().await;
}

// ---------------------------------------------------------------------------
// 2. A durable timer fires and the workflow completes.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn durable_timer_workflow_completes() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("timer-q");

    let mut worker = new_worker(&client, &queue);
    worker.register_workflow("e2e.timer", |ctx, _input| async move {
        ctx.sleep(Duration::from_secs(2)).await?;
        Ok(json!({"timer": "fired", "delay_seconds": 2}))
    });
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("timer");
    let started_at = Instant::now();
    let handle = start(&client, "e2e.timer", &queue, &workflow_id, json!([])).await;
    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("timer workflow did not complete: {error} ({error:?})"));
    let elapsed = started_at.elapsed();

    assert_eq!(result, json!({"timer": "fired", "delay_seconds": 2}));
    assert!(
        elapsed >= Duration::from_millis(1900),
        "a 2 s durable timer resolved after only {elapsed:?}"
    );

    let run_id = run_id_of(&handle).await;
    let events = server.history_event_types(&workflow_id, &run_id).await;
    for expected in ["TimerScheduled", "TimerFired", "WorkflowCompleted"] {
        assert!(events.iter().any(|event| event == expected), "history lacks {expected}: {events:?}");
    }

    running.shutdown().await;
}

// ---------------------------------------------------------------------------
// 3. A client signal wakes a workflow blocked in wait_signal.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signal_wakes_waiting_workflow_and_delivers_its_argument() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("signal-q");

    let mut worker = new_worker(&client, &queue);
    worker.register_workflow("e2e.await-approval", |ctx, _input| async move {
        let arguments = ctx.wait_signal("approve").await?;
        Ok(json!({
            "approval": arguments.first().cloned().unwrap_or(Value::Null),
            "argument_count": arguments.len(),
        }))
    });
    worker
        .declare_workflow_signals("e2e.await-approval", &["approve"])
        .expect("declare signal names");
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("approval");
    let handle = start(&client, "e2e.await-approval", &queue, &workflow_id, json!([])).await;
    let run_id = run_id_of(&handle).await;

    // Signal only once the worker has recorded the open signal wait, so the
    // signal has to wake a blocked run rather than be buffered before it.
    server
        .wait_for_history_event(&workflow_id, &run_id, "SignalWaitOpened", Duration::from_secs(20))
        .await;
    let waiting = within(CALL_TIMEOUT, "describe waiting workflow", handle.describe())
        .await
        .expect("describe waiting workflow");
    assert!(
        !waiting.is_terminal(),
        "workflow closed before being signalled: {:?}",
        waiting.status
    );

    let approval = json!({"approved_by": "ops", "ticket": 42});
    let receipt = within(CALL_TIMEOUT, "signal approve", handle.signal("approve", approval.clone()))
        .await
        .unwrap_or_else(|error| panic!("signal was refused: {error} ({error:?})"));
    assert!(receipt.is_object(), "signal receipt: {receipt}");

    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("signalled workflow did not complete: {error} ({error:?})"));
    assert_eq!(result, json!({"approval": approval, "argument_count": 1}));

    running.shutdown().await;
}

// ---------------------------------------------------------------------------
// 4. An activity failing twice succeeds on its third (last allowed) attempt.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn activity_retry_policy_recovers_after_two_failures() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("retry-q");

    let calls = Arc::new(AtomicU32::new(0));
    let attempt_numbers = Arc::new(Mutex::new(Vec::<u64>::new()));
    let mut worker = new_worker(&client, &queue);
    {
        let calls = Arc::clone(&calls);
        let attempt_numbers = Arc::clone(&attempt_numbers);
        worker.register_activity("e2e.flaky", move |ctx, _args| {
            let calls = Arc::clone(&calls);
            let attempt_numbers = Arc::clone(&attempt_numbers);
            async move {
                let call = calls.fetch_add(1, Ordering::SeqCst) + 1;
                attempt_numbers.lock().expect("attempt log lock").push(ctx.attempt_number);
                if call < 3 {
                    return Err(ActivityError::new("E2eTransientFailure", format!("planned failure on call {call}")).into());
                }
                Ok(json!({"call": call, "attempt_number": ctx.attempt_number}))
            }
        });
    }
    worker.register_workflow("e2e.retrying", |ctx, _input| async move {
        let options = ActivityOptions::new()
            .retry_policy(ActivityRetryPolicy::new(3).backoff_intervals([Duration::from_secs(1)]))
            .start_to_close_timeout(Duration::from_secs(30));
        let outcome = ctx.activity_with_options("e2e.flaky", options, json!([])).await?;
        Ok(json!({"activity": outcome}))
    });
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("retrying");
    let handle = start(&client, "e2e.retrying", &queue, &workflow_id, json!([])).await;
    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("retrying workflow did not complete: {error} ({error:?})"));

    assert_eq!(result, json!({"activity": {"call": 3, "attempt_number": 3}}));
    assert_eq!(calls.load(Ordering::SeqCst), 3, "exactly three attempts ran");
    assert_eq!(
        *attempt_numbers.lock().expect("attempt log lock"),
        vec![1, 2, 3],
        "server-assigned attempt_number per delivered attempt"
    );

    running.shutdown().await;
}

// ---------------------------------------------------------------------------
// 5. Cancel and terminate of a waiting workflow.
// ---------------------------------------------------------------------------

const WAITING_WORKFLOW: &str = "e2e.wait-forever";

/// Start a worker whose workflow blocks on a signal nobody sends, start one
/// run, and wait until its signal wait is durably open.
async fn start_waiting_workflow(server: &CapstanServer, client: &Client) -> (RunningWorker, WorkflowHandle, String) {
    let queue = unique("waiting-q");
    let mut worker = new_worker(client, &queue);
    worker.register_workflow(WAITING_WORKFLOW, |ctx, _input| async move {
        let arguments = ctx.wait_signal("never").await?;
        Ok(json!({"unexpectedly_signalled": arguments}))
    });
    worker
        .declare_workflow_signals(WAITING_WORKFLOW, &["never"])
        .expect("declare signal names");
    let running = RunningWorker::start(worker);

    let workflow_id = unique("waiting");
    let handle = start(client, WAITING_WORKFLOW, &queue, &workflow_id, json!([])).await;
    let run_id = run_id_of(&handle).await;
    server
        .wait_for_history_event(&workflow_id, &run_id, "SignalWaitOpened", Duration::from_secs(20))
        .await;
    (running, handle, run_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelling_a_waiting_workflow_yields_cancelled_outcome() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let (mut running, handle, run_id) = start_waiting_workflow(&server, &client).await;

    let accepted = within(
        CALL_TIMEOUT,
        "cancel",
        handle.cancel(WorkflowCommandOptions {
            reason: Some("e2e cancel".to_string()),
            request_id: None,
        }),
    )
    .await
    .unwrap_or_else(|error| panic!("cancel was refused: {error} ({error:?})"));
    assert_eq!(accepted.command, WorkflowCommandKind::Cancel);
    assert_eq!(accepted.workflow_id, handle.workflow_id);
    if let Some(accepted_run) = &accepted.run_id {
        assert_eq!(accepted_run, &run_id, "receipt: {}", accepted.raw);
    }
    if let Some(outcome) = &accepted.outcome {
        assert_eq!(outcome, "cancelled", "cancel receipt: {}", accepted.raw);
    }

    match running.result(&handle).await {
        Err(Error::WorkflowCancelled(outcome)) => {
            assert_eq!(outcome.kind, WorkflowTerminalKind::Cancelled);
            assert_eq!(outcome.workflow_id, handle.workflow_id);
            if let Some(outcome_run) = &outcome.run_id {
                assert_eq!(outcome_run, &run_id);
            }
        }
        other => panic!("expected Error::WorkflowCancelled, got {other:?}"),
    }
    let description = within(CALL_TIMEOUT, "describe cancelled", handle.describe())
        .await
        .expect("describe cancelled workflow");
    assert_eq!(description.status.as_deref(), Some("cancelled"));
    assert!(description.is_terminal());

    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn terminating_a_waiting_workflow_yields_terminated_outcome() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let (mut running, handle, run_id) = start_waiting_workflow(&server, &client).await;

    let accepted = within(
        CALL_TIMEOUT,
        "terminate",
        handle.terminate(WorkflowCommandOptions {
            reason: Some("e2e terminate".to_string()),
            request_id: None,
        }),
    )
    .await
    .unwrap_or_else(|error| panic!("terminate was refused: {error} ({error:?})"));
    assert_eq!(accepted.command, WorkflowCommandKind::Terminate);
    assert_eq!(accepted.workflow_id, handle.workflow_id);
    if let Some(accepted_run) = &accepted.run_id {
        assert_eq!(accepted_run, &run_id, "receipt: {}", accepted.raw);
    }
    if let Some(outcome) = &accepted.outcome {
        assert_eq!(outcome, "terminated", "terminate receipt: {}", accepted.raw);
    }

    match running.result(&handle).await {
        Err(Error::WorkflowTerminated(outcome)) => {
            assert_eq!(outcome.kind, WorkflowTerminalKind::Terminated);
            assert_eq!(outcome.workflow_id, handle.workflow_id);
            if let Some(outcome_run) = &outcome.run_id {
                assert_eq!(outcome_run, &run_id);
            }
        }
        other => panic!("expected Error::WorkflowTerminated, got {other:?}"),
    }
    let description = within(CALL_TIMEOUT, "describe terminated", handle.describe())
        .await
        .expect("describe terminated workflow");
    assert_eq!(description.status.as_deref(), Some("terminated"));
    assert!(description.is_terminal());

    running.shutdown().await;
}

// ---------------------------------------------------------------------------
// 6. Starting the same workflow id twice is refused.
// ---------------------------------------------------------------------------

/// Assert that `result` is the server's duplicate-start refusal:
/// HTTP 409 with `reason: "instance_already_started"`.
fn assert_duplicate_refused(result: durable_workflow::Result<WorkflowHandle>, when: &str) {
    match result {
        Err(Error::Http { status, body }) => {
            assert_eq!(status.as_u16(), 409, "{when}: duplicate start status; body: {body}");
            let body: Value = serde_json::from_str(&body).unwrap_or_else(|error| panic!("{when}: non-JSON refusal ({error}): {body}"));
            assert_eq!(
                body.get("reason").and_then(Value::as_str),
                Some("instance_already_started"),
                "{when}: refusal body {body}"
            );
        }
        Ok(handle) => panic!("{when}: duplicate start was accepted (run_id {:?})", handle.run_id),
        Err(other) => panic!("{when}: expected an HTTP 409 refusal, got {other} ({other:?})"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicate_start_of_same_workflow_id_is_refused() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("dup-q");

    let mut worker = new_worker(&client, &queue);
    worker.register_workflow("e2e.dedupe", |ctx, input| async move {
        let arguments = ctx.wait_signal("finish").await?;
        Ok(json!({"input": input, "finish": arguments}))
    });
    worker
        .declare_workflow_signals("e2e.dedupe", &["finish"])
        .expect("declare signal names");
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("dedupe");
    let first = start(&client, "e2e.dedupe", &queue, &workflow_id, json!(["first"])).await;
    let first_run = run_id_of(&first).await;

    // While the first run is open.
    let second = within(
        CALL_TIMEOUT,
        "duplicate start while running",
        client.start_workflow("e2e.dedupe", &queue, &workflow_id, json!(["second"])),
    )
    .await;
    assert_duplicate_refused(second, "while the first run is open");

    // The refusal left the original run in place.
    let description = within(CALL_TIMEOUT, "describe after duplicate", first.describe())
        .await
        .expect("describe after duplicate start");
    assert_eq!(description.run_id.as_deref(), Some(first_run.as_str()));
    assert!(!description.is_terminal(), "status: {:?}", description.status);

    // Finish the original run with its own input.
    server
        .wait_for_history_event(&workflow_id, &first_run, "SignalWaitOpened", Duration::from_secs(20))
        .await;
    within(CALL_TIMEOUT, "signal finish", first.signal("finish", json!("done")))
        .await
        .unwrap_or_else(|error| panic!("signal was refused: {error} ({error:?})"));
    let result = running
        .result(&first)
        .await
        .unwrap_or_else(|error| panic!("original run did not complete: {error} ({error:?})"));
    assert_eq!(result, json!({"input": ["first"], "finish": ["done"]}));

    // An instance id stays taken after its run closed (duplicate policy `fail`).
    let third = within(
        CALL_TIMEOUT,
        "duplicate start after completion",
        client.start_workflow("e2e.dedupe", &queue, &workflow_id, json!(["third"])),
    )
    .await;
    assert_duplicate_refused(third, "after the first run completed");
    let description = within(CALL_TIMEOUT, "describe after completion", first.describe())
        .await
        .expect("describe completed workflow");
    assert_eq!(description.run_id.as_deref(), Some(first_run.as_str()));
    assert!(description.is_completed(), "status: {:?}", description.status);

    running.shutdown().await;
}

// ---------------------------------------------------------------------------
// 7. Twenty concurrent workflows all complete with their own results.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_concurrent_workflows_complete() {
    const COUNT: u64 = 20;
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("fanout-q");

    let activity_calls = Arc::new(AtomicU32::new(0));
    let mut worker = new_worker(&client, &queue);
    {
        let activity_calls = Arc::clone(&activity_calls);
        worker.register_typed_activity("e2e.square", move |_ctx, n: u64| {
            let activity_calls = Arc::clone(&activity_calls);
            async move {
                activity_calls.fetch_add(1, Ordering::SeqCst);
                Ok(n * n)
            }
        });
    }
    worker.register_typed_workflow("e2e.square-workflow", |ctx, n: u64| async move {
        let square: u64 = ctx.activity_typed("e2e.square", n).await?;
        Ok(json!({"n": n, "square": square}))
    });
    let mut running = RunningWorker::start(worker);

    let prefix = unique("fanout");
    let mut starts = JoinSet::new();
    for n in 0..COUNT {
        let client = client.clone();
        let queue = queue.clone();
        let workflow_id = format!("{prefix}-{n}");
        starts.spawn(async move {
            let handle = client.start_workflow("e2e.square-workflow", &queue, &workflow_id, n).await;
            (n, workflow_id, handle)
        });
    }
    let handles = within(Duration::from_secs(60), "20 concurrent starts", async {
        let mut handles = Vec::new();
        while let Some(joined) = starts.join_next().await {
            let (n, workflow_id, handle) = joined.expect("start task panicked");
            let handle = handle.unwrap_or_else(|error| panic!("start {workflow_id} failed: {error} ({error:?})"));
            assert_eq!(handle.workflow_id, workflow_id);
            handles.push((n, handle));
        }
        handles
    })
    .await;
    let run_ids: BTreeSet<_> = handles.iter().filter_map(|(_, handle)| handle.run_id.clone()).collect();
    assert!(
        run_ids.is_empty() || run_ids.len() == COUNT as usize,
        "run ids are not distinct: {run_ids:?}"
    );

    let limit = Duration::from_secs(90);
    let results = running
        .guard(limit, "20 concurrent workflow results", async {
            let mut waits = JoinSet::new();
            for (n, handle) in handles {
                waits.spawn(async move { (n, handle.result(result_options(limit)).await) });
            }
            let mut results = Vec::new();
            while let Some(joined) = waits.join_next().await {
                results.push(joined.expect("result task panicked"));
            }
            results
        })
        .await;

    let mut completed = BTreeSet::new();
    for (n, result) in results {
        let value = result.unwrap_or_else(|error| panic!("workflow #{n} did not complete: {error} ({error:?})"));
        assert_eq!(value, json!({"n": n, "square": n * n}), "workflow #{n}");
        completed.insert(n);
    }
    assert_eq!(completed, (0..COUNT).collect::<BTreeSet<_>>());
    assert_eq!(
        activity_calls.load(Ordering::SeqCst),
        COUNT as u32,
        "one activity execution per workflow"
    );

    running.shutdown().await;
}

// ---------------------------------------------------------------------------
// 8. A query is answered by the worker's query handler from committed state.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn query_is_answered_from_the_committed_snapshot() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("query-q");

    let mut worker = new_worker(&client, &queue);
    worker.register_workflow("e2e.queried", |ctx, _input| async move {
        let arguments = ctx.wait_signal("finish").await?;
        Ok(json!({"finished_with": arguments}))
    });
    worker
        .declare_workflow_signals("e2e.queried", &["finish"])
        .expect("declare signal names");
    worker.register_query("e2e.queried", "input", |ctx, args| async move {
        Ok(json!({"workflow_input": ctx.workflow_input(), "query_args": args, "run_status": ctx.run_status}))
    });
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("queried");
    let handle = start(&client, "e2e.queried", &queue, &workflow_id, json!(["order-7"])).await;
    let run_id = run_id_of(&handle).await;
    server
        .wait_for_history_event(&workflow_id, &run_id, "SignalWaitOpened", Duration::from_secs(20))
        .await;
    let events_before = server.history_event_types(&workflow_id, &run_id).await.len();

    let answer = within(CALL_TIMEOUT, "query input", handle.query("input", json!(["detail"])))
        .await
        .unwrap_or_else(|error| panic!("query failed: {error} ({error:?})"));
    assert_eq!(answer["workflow_input"], json!(["order-7"]), "query answer: {answer}");
    assert_eq!(answer["query_args"], json!(["detail"]), "query answer: {answer}");
    assert_eq!(
        server.history_event_types(&workflow_id, &run_id).await.len(),
        events_before,
        "a query must not write history"
    );

    within(CALL_TIMEOUT, "signal finish", handle.signal("finish", json!("done")))
        .await
        .expect("signal");
    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("workflow did not complete: {error} ({error:?})"));
    assert_eq!(result, json!({"finished_with": ["done"]}));
    running.shutdown().await;
}

// ---------------------------------------------------------------------------
// 9. A parallel group (and a nested one) replays with contiguous step sequences.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn parallel_groups_replay_and_number_steps_contiguously() {
    use durable_workflow::{ParallelOperation, ParallelResult};

    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("parallel-q");

    let mut worker = new_worker(&client, &queue);
    worker.register_activity("e2e.double", |_ctx, args| async move {
        let n = args.get(0).and_then(Value::as_i64).unwrap_or_default();
        Ok(json!(n * 2))
    });
    worker.register_workflow("e2e.parallel", |ctx, _input| async move {
        let first = ctx
            .parallel(vec![
                ParallelOperation::activity("e2e.double", json!([1])),
                ParallelOperation::activity("e2e.double", json!([2])),
            ])
            .await?;
        let second = ctx
            .parallel(vec![
                ParallelOperation::activity("e2e.double", json!([3])),
                ParallelOperation::group(vec![
                    ParallelOperation::activity("e2e.double", json!([4])),
                    ParallelOperation::timer(Duration::from_secs(1)),
                ]),
            ])
            .await?;
        let values = |results: &[ParallelResult]| -> Vec<Value> {
            results
                .iter()
                .flat_map(|r| match r {
                    ParallelResult::Activity(v) => vec![v.clone()],
                    ParallelResult::Group(inner) => inner
                        .iter()
                        .filter_map(|r| {
                            if let ParallelResult::Activity(v) = r {
                                Some(v.clone())
                            } else {
                                None
                            }
                        })
                        .collect(),
                    _ => vec![],
                })
                .collect()
        };
        let mut all = values(&first);
        all.extend(values(&second));
        Ok(json!(all))
    });
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("parallel");
    let handle = start(&client, "e2e.parallel", &queue, &workflow_id, json!([])).await;
    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("parallel workflow failed: {error} ({error:?})"));
    assert_eq!(result, json!([2, 4, 6, 8]));
    let run_id = run_id_of(&handle).await;
    let events = server.history_event_types(&workflow_id, &run_id).await;
    assert_eq!(
        events.iter().filter(|e| *e == "ActivityScheduled").count(),
        4,
        "each activity scheduled once: {events:?}"
    );
    assert_eq!(events.iter().filter(|e| *e == "TimerScheduled").count(), 1);
    running.shutdown().await;
}

// ---------------------------------------------------------------------------
// Cooperative cancellation: the request reaches workflow code at its pending
// timer, the code's shielded cleanup runs, and the run ends cancelled.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cooperative_cancellation_runs_cleanup_and_ends_cancelled() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("coop-q");
    let mut worker = new_worker(&client, &queue).cooperative_cancellation(true);
    worker.register_workflow("e2e.coop", |ctx, _input| async move {
        match ctx.sleep(Duration::from_secs(300)).await {
            Ok(_) => Ok(json!({"cancelled": false})),
            Err(Error::CooperativeCancellationRequested(requested)) => {
                let _shield = ctx.cancellation_shield()?;
                ctx.sleep(Duration::from_secs(1)).await?;
                Ok(json!({"cleaned_up": requested.request.request_id}))
            }
            Err(other) => Err(other),
        }
    });
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("coop");
    let handle = start(&client, "e2e.coop", &queue, &workflow_id, json!([])).await;
    let run_id = run_id_of(&handle).await;
    server
        .wait_for_history_event(&workflow_id, &run_id, "TimerScheduled", Duration::from_secs(20))
        .await;
    let options = durable_workflow::CooperativeCancellationOptions {
        reason: Some("stop".to_string()),
        cleanup_timeout_seconds: Some(60),
    };
    let request = within(CALL_TIMEOUT, "request cancellation", handle.request_cancellation(options.clone()))
        .await
        .unwrap_or_else(|error| panic!("request_cancellation was refused: {error} ({error:?})"));
    assert!(!request.duplicate);
    assert_eq!(request.run_id, run_id);
    let again = within(CALL_TIMEOUT, "request cancellation again", handle.request_cancellation(options))
        .await
        .expect("a repeated request is answered");
    assert!(again.duplicate);
    assert_eq!(again.cancellation_request, request.cancellation_request);

    match running.result(&handle).await {
        Err(Error::WorkflowCancelled(outcome)) => assert_eq!(outcome.kind, WorkflowTerminalKind::Cancelled),
        other => panic!("expected Error::WorkflowCancelled, got {other:?}"),
    }
    let events = server.history_event_types(&workflow_id, &run_id).await;
    let count = |kind: &str| events.iter().filter(|event| *event == kind).count();
    assert_eq!(count("CooperativeCancellationRequested"), 1, "{events:?}");
    assert_eq!(count("CooperativeCancellationDelivered"), 1, "{events:?}");
    assert_eq!(count("TimerFired"), 1, "the cleanup timer ran: {events:?}");
    assert_eq!(events.last().map(String::as_str), Some("WorkflowCancelled"), "{events:?}");
    assert_eq!(count("WorkflowCompleted"), 0);

    running.shutdown().await;
}

// ---------------------------------------------------------------------------
// Local activities: run inside the workflow task and recorded once.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn local_activities_are_recorded_with_their_attempts_and_replay() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("local-q");
    let calls = Arc::new(AtomicU32::new(0));
    let mut worker = new_worker(&client, &queue).local_activities(true);
    {
        let calls = Arc::clone(&calls);
        worker.register_activity("e2e.local-greet", move |ctx, args| {
            let calls = Arc::clone(&calls);
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                ctx.heartbeat(json!({"phase": "greeting"})).await?;
                Ok(json!(format!("hello, {}", args.get(0).and_then(Value::as_str).unwrap_or(""))))
            }
        });
    }
    worker.register_activity("e2e.double", |_ctx, args| async move {
        let n = args.get(0).and_then(Value::as_i64).unwrap_or_default();
        Ok(json!(n * 2))
    });
    worker.register_workflow("e2e.local", |ctx, _input| async move {
        let greeting = ctx.local_activity("e2e.local-greet", json!(["Ada"])).await?;
        // A regular activity after it: the next task replays the recorded local step.
        let doubled = ctx.activity("e2e.double", json!([21])).await?;
        Ok(json!({"greeting": greeting, "doubled": doubled}))
    });
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("local");
    let handle = start(&client, "e2e.local", &queue, &workflow_id, json!([])).await;
    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("local activity workflow failed: {error} ({error:?})"));
    assert_eq!(result, json!({"greeting": "hello, Ada", "doubled": 42}));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the local callback ran once and was replayed after"
    );

    let run_id = run_id_of(&handle).await;
    let events = server.history_event_types(&workflow_id, &run_id).await;
    let count = |kind: &str| events.iter().filter(|event| *event == kind).count();
    assert_eq!(count("ActivityScheduled"), 2, "{events:?}");
    assert_eq!(count("ActivityCompleted"), 2, "{events:?}");
    assert!(count("ActivityHeartbeatRecorded") >= 1, "{events:?}");
    running.shutdown().await;
}

// ---------------------------------------------------------------------------
// Durable selection: an activity races a timer; the loser is cancelled.
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn select_names_one_winner_and_cancels_the_loser() {
    use durable_workflow::{ParallelOperation, ParallelResult, SelectionKey};

    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("select-q");
    let mut worker = new_worker(&client, &queue);
    worker.register_activity("e2e.double", |_ctx, args| async move {
        let n = args.get(0).and_then(Value::as_i64).unwrap_or_default();
        Ok(json!(n * 2))
    });
    worker.register_workflow("e2e.select", |ctx, _input| async move {
        let selection = ctx
            .select_keyed(vec![
                ("work".to_string(), ParallelOperation::activity("e2e.double", json!([21]))),
                ("deadline".to_string(), ParallelOperation::timer(Duration::from_secs(60))),
            ])
            .await?;
        let winner = selection.key.clone();
        let loser = if winner == SelectionKey::from("work".to_string()) {
            "deadline"
        } else {
            "work"
        };
        selection
            .handle(&SelectionKey::from(loser.to_string()))
            .expect("the loser's handle")
            .cancel()
            .await?;
        match selection.into_result()? {
            ParallelResult::Activity(value) => Ok(json!({"winner": "work", "value": value})),
            _ => Ok(json!({"winner": "deadline"})),
        }
    });
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("select");
    let handle = start(&client, "e2e.select", &queue, &workflow_id, json!([])).await;
    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("select workflow failed: {error} ({error:?})"));
    assert_eq!(result, json!({"winner": "work", "value": 42}));

    let run_id = run_id_of(&handle).await;
    let events = server.history_event_types(&workflow_id, &run_id).await;
    let count = |kind: &str| events.iter().filter(|event| *event == kind).count();
    assert_eq!(count("SelectionResolved"), 1, "{events:?}");
    assert_eq!(count("SelectionOperationCancelled"), 1, "{events:?}");
    assert_eq!(count("TimerFired"), 0, "the cancelled timer never fires: {events:?}");
    let resolved_at = events.iter().position(|e| e == "SelectionResolved").unwrap();
    assert_eq!(events[resolved_at - 1], "ActivityCompleted");
    running.shutdown().await;
}
