//! The Rust SDK's message streams against Capstan: `WorkflowHandle::append_message` and
//! `ctx.message_stream(..).receive(..)`, which blocks with a signal wait on the reserved name
//! and only takes deliveries that continue its cursor. Messages sent before its first receive
//! (while it sleeps) reach it through the server offering unconsumed messages to the wait it
//! opens later; a retried append is ingested once.

use super::*;

fn positions(batch: &[durable_workflow::MessageStreamMessage]) -> Vec<Value> {
    batch.iter().map(|m| json!([m.position, m.message_id])).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_reach_receive_in_order_once_through_the_sdk() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("streams-q");
    let mut worker = new_worker(&client, &queue);
    worker.register_workflow("e2e.streams-collect", |ctx, _input| async move {
        ctx.sleep(Duration::from_secs(2)).await?;
        let stream = ctx.message_stream("inbox")?;
        let mut got = Vec::new();
        while got.len() < 4 {
            got.extend(positions(&stream.receive(10).await?));
        }
        Ok(json!(got))
    });
    let mut running = RunningWorker::start(worker);

    let workflow_id = unique("streams");
    let handle = start(&client, "e2e.streams-collect", &queue, &workflow_id, json!([])).await;
    let run_id = run_id_of(&handle).await;
    server
        .wait_for_history_event(&workflow_id, &run_id, "TimerScheduled", Duration::from_secs(20))
        .await;
    for id in ["m-1", "m-2", "m-3"] {
        let receipt = within(CALL_TIMEOUT, "append", handle.append_message("inbox", id, json!([id])))
            .await
            .unwrap_or_else(|error| panic!("append refused: {error} ({error:?})"));
        assert_eq!(receipt["outcome"], json!("accepted"), "{receipt}");
    }
    let retried = within(CALL_TIMEOUT, "append again", handle.append_message("inbox", "m-2", json!(["m-2"])))
        .await
        .expect("a retried append answers");
    assert_eq!((retried["position"].clone(), retried["duplicate"].clone()), (json!(2), json!(true)));
    server
        .wait_for_history_event(&workflow_id, &run_id, "SignalWaitOpened", Duration::from_secs(20))
        .await;
    within(CALL_TIMEOUT, "append last", handle.append_message("inbox", "m-4", json!(["m-4"])))
        .await
        .expect("append m-4");
    let result = running.result(&handle).await.expect("the workflow receives all four");
    assert_eq!(result, json!([[1, "m-1"], [2, "m-2"], [3, "m-3"], [4, "m-4"]]));
    let types = server.history_event_types(&workflow_id, &run_id).await;
    assert_eq!(types.iter().filter(|t| *t == "SignalReceived").count(), 4, "{types:?}");
    running.shutdown().await;
}
