//! The Rust SDK's workflow output streams against Capstan: `ctx.append_workflow_stream` and
//! `close_workflow_stream` in workflow code, read back with the client's strict
//! `subscribe_workflow_stream` (its description needs an integer `last_offset`).

use super::*;
use durable_workflow::WorkflowStreamAppendItem;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_workflow_streams_items_the_client_reads_to_the_end() {
    let server = CapstanServer::spawn().await;
    let client = server.client();
    let queue = unique("wstream-q");
    let mut worker = new_worker(&client, &queue);
    worker.register_workflow("e2e.wstream", |ctx, _input| async move {
        let items = [
            WorkflowStreamAppendItem::new("hello")?.item_type("token"),
            WorkflowStreamAppendItem::new("world")?.item_type("token"),
        ];
        ctx.append_workflow_stream("tokens", &items, None)?;
        ctx.close_workflow_stream("tokens", Some(60))?;
        Ok(json!("streamed"))
    });
    let mut running = RunningWorker::start(worker);
    let workflow_id = unique("wstream");
    let handle = start(&client, "e2e.wstream", &queue, &workflow_id, json!([])).await;
    let run_id = run_id_of(&handle).await;
    assert_eq!(running.result(&handle).await.expect("the workflow completes"), json!("streamed"));

    let page = within(
        CALL_TIMEOUT,
        "subscribe",
        client.subscribe_workflow_stream(&workflow_id, &run_id, "tokens", 0, 100, Duration::from_secs(1)),
    )
    .await
    .unwrap_or_else(|error| panic!("subscribe refused: {error} ({error:?})"));
    assert!(page.terminal, "{page:?}");
    assert_eq!(page.next_offset, 2);
    let read: Vec<(u64, Option<Value>, Option<String>)> = page
        .items
        .iter()
        .map(|i| (i.offset, i.payload.clone(), i.item_type.clone()))
        .collect();
    assert_eq!(
        read,
        [
            (0, Some(json!("hello")), Some("token".into())),
            (1, Some(json!("world")), Some("token".into()))
        ]
    );
    assert_eq!(
        (page.stream.status.as_str(), page.stream.last_offset, page.stream.retention_seconds),
        ("closed", 1, Some(60))
    );
    let types = server.history_event_types(&workflow_id, &run_id).await;
    assert_eq!(types.iter().filter(|t| *t == "SideEffectRecorded").count(), 2, "{types:?}");
    running.shutdown().await;
}
