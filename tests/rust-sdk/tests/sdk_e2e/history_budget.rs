//! The Rust SDK's `WorkflowContext::history_budget()` reads what Capstan publishes on the
//! workflow task: the event count, the history's bytes and DW's pressure.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workflow_code_reads_the_servers_history_budget() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("budget-q");
    let mut worker = new_worker(&client, &queue);
    worker.register_workflow("e2e.budget", |ctx, _input| async move {
        let budget = ctx.history_budget()?;
        Ok(json!({
            "events": budget.event_count,
            "bytes": budget.size_bytes,
            "pressure": budget.pressure,
            "continue_as_new": budget.continue_as_new_recommended,
        }))
    });
    let mut running = RunningWorker::start(worker);
    let handle = start(&client, "e2e.budget", &queue, &unique("budget"), json!([])).await;
    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("budget workflow did not complete: {error} ({error:?})"));
    assert_eq!(result["pressure"], "ok", "{result}");
    assert_eq!(result["continue_as_new"], false);
    assert!(result["events"].as_u64() >= Some(2), "{result}");
    assert!(
        result["bytes"].as_u64().is_some_and(|b| b > 0),
        "the server publishes the history's bytes: {result}"
    );
    running.shutdown().await;
}
