//! A workflow task the Rust SDK fails keeps its cause on the run: a typed entry that cannot
//! decode the recorded input is reported with the crate's type and reason, shown on describe
//! until a completed task clears it.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_entry_that_cannot_decode_its_input_shows_why_on_describe() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("task-failure-q");
    let mut worker = new_worker(&client, &queue);
    worker.register_typed_workflow("e2e.typed-entry", |_ctx, request: GreetingRequest| async move {
        Ok(json!({"hello": request.name}))
    });
    let running = RunningWorker::start(worker);

    let workflow_id = unique("task-failure");
    start(&client, "e2e.typed-entry", &queue, &workflow_id, json!(42)).await;
    let path = format!("/workflows/{workflow_id}");
    let described = within(Duration::from_secs(20), "the task failure on describe", async {
        loop {
            let described = server.control_get(&path).await;
            if !described["workflow_task_failure"].is_null() {
                return described;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    let failure = &described["workflow_task_failure"];
    assert_eq!(failure["type"], "WorkflowEntryArgumentsMismatch", "{failure}");
    assert_eq!(failure["reason"], "workflow_entry_arguments_mismatch", "{failure}");
    assert!(
        failure["message"]
            .as_str()
            .unwrap_or("")
            .contains("workflow_entry_arguments_mismatch"),
        "{failure}"
    );
    assert!(failure["consecutive_failures"].as_u64() >= Some(1), "{failure}");
    assert!(described["wait_reason"].as_str().unwrap_or("").contains("failed"), "{described}");

    running.shutdown().await;
}
