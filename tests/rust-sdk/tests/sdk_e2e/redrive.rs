//! The Rust SDK's redrive against Capstan: a run whose second activity failed is redriven
//! through `WorkflowHandle::redrive`, which checks the answer strictly (outcome, source,
//! a distinct successor, `resume_step_sequence`), and the successor completes without running
//! the first activity again.

use super::*;
use std::sync::atomic::AtomicBool;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_run_redriven_through_the_sdk_resumes_at_its_failed_step() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("redrive-q");
    let first_calls = Arc::new(AtomicU32::new(0));
    let broken = Arc::new(AtomicBool::new(true));
    let mut worker = new_worker(&client, &queue);
    {
        let first_calls = Arc::clone(&first_calls);
        worker.register_activity("e2e.redrive-first", move |_ctx, _args| {
            let first_calls = Arc::clone(&first_calls);
            async move { Ok(json!(first_calls.fetch_add(1, Ordering::SeqCst) + 1)) }
        });
    }
    {
        let broken = Arc::clone(&broken);
        worker.register_activity("e2e.redrive-second", move |_ctx, _args| {
            let broken = Arc::clone(&broken);
            async move {
                match broken.load(Ordering::SeqCst) {
                    true => Err(ActivityError::new("E2eDownstreamBroken", "the downstream is broken").into()),
                    false => Ok(json!("fixed")),
                }
            }
        });
    }
    worker.register_workflow("e2e.redrive-line", |ctx, _input| async move {
        let once = ActivityOptions::new().retry_policy(ActivityRetryPolicy::new(1));
        let first = ctx.activity_with_options("e2e.redrive-first", once.clone(), json!([])).await?;
        let second = ctx.activity_with_options("e2e.redrive-second", once, json!([])).await?;
        Ok(json!({"first": first, "second": second}))
    });
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("redrive");
    let handle = start(&client, "e2e.redrive-line", &queue, &workflow_id, json!([])).await;
    let failed_run = run_id_of(&handle).await;
    running.result(&handle).await.expect_err("the second activity fails the run");
    broken.store(false, Ordering::SeqCst);

    let redriven = within(CALL_TIMEOUT, "redrive", handle.redrive(Some("fix-1")))
        .await
        .unwrap_or_else(|error| panic!("redrive refused: {error} ({error:?})"));
    assert_eq!(
        (redriven.source_run_id.as_str(), redriven.resume_step_sequence),
        (failed_run.as_str(), 2)
    );
    let mut successor = handle.clone();
    successor.run_id = Some(redriven.run_id.clone());
    let result = running.result(&successor).await.expect("the redriven run completes");
    assert_eq!(result, json!({"first": 1, "second": "fixed"}));
    assert_eq!(first_calls.load(Ordering::SeqCst), 1, "the completed step is not run again");

    let again = within(CALL_TIMEOUT, "redrive again", handle.redrive(None))
        .await
        .expect("a repeat answers");
    assert_eq!(again.run_id, redriven.run_id, "one successor per failed run");
    let types = server.history_event_types(&workflow_id, &redriven.run_id).await;
    assert_eq!(&types[..3], ["StartAccepted", "WorkflowStarted", "ActivityCompleted"], "{types:?}");
    running.shutdown().await;
}
