//! Workflow output streams: a worker's directive lands with its completion or not at all;
//! clients append (deduped by key, stopped by the pending cap with the items before it kept),
//! read by offset, close; closed streams expire after their retention.

use super::*;
use capstan_engine::workflow_stream::{StreamDirective, StreamItemInput, StreamOperation};

fn item(key: Option<&str>) -> StreamItemInput {
    StreamItemInput {
        payload: Some(Payload::avro("wwHioz3/VYAiNwwA")),
        payload_reference: None,
        item_type: Some("token".into()),
        content_type: None,
        idempotency_key: key.map(str::to_string),
    }
}

fn target(run: &RunState) -> StreamTarget {
    StreamTarget {
        namespace: "default".into(),
        workflow_id: run.workflow_id.as_str().into(),
        run_id: run.run_id.as_str().into(),
        stream_name: "out".into(),
    }
}

fn side_effect(identity: &str, ordinal: u64, operation: StreamOperation) -> WorkflowCommand {
    WorkflowCommand::RecordSideEffect {
        result: Payload::avro("wwHioz3/VYAiNwA="),
        tags: Map::new(),
        stream: Some(StreamDirective {
            stream_name: "out".into(),
            command_identity: identity.into(),
            command_ordinal: ordinal,
            operation,
        }),
    }
}

pub async fn workflow_streams_append_read_close_and_expire<S: Store>(store: S) {
    let run = started(&store, "streams", "q").await;
    let (task, _) = store
        .claim_task("default", TaskKind::Workflow, "q", &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("a workflow task");
    let identity = task.id.as_str().to_string();
    let fence = task.fence;
    let keyed = |i: usize| item(Some(&format!("dw-stream:{identity}:0:{i}")));
    let append = StreamOperation::Append {
        items: vec![keyed(0), keyed(1)],
        max_pending_items: Some(1),
    };
    // Over the cap: the whole completion is refused, its side effect and items with it.
    let refused = store
        .mutate_run("default", RunLocator::Task(task.id.clone()), NOW, {
            let (task_id, commands) = (task.id.clone(), vec![side_effect(&identity, 0, append)]);
            move |run, cx| complete_workflow_task(run, cx, &task_id, "w", fence, commands)
        })
        .await;
    assert_eq!(reason(refused), Reason::StreamFull);
    assert_eq!(reason(store.read_stream(target(&run), 0, 10).await), Reason::StreamNotFound);
    let append = StreamOperation::Append {
        items: vec![keyed(0), keyed(1)],
        max_pending_items: None,
    };
    store
        .mutate_run("default", RunLocator::Task(task.id.clone()), NOW, {
            let task_id = task.id.clone();
            let commands = vec![
                side_effect(&identity, 0, append),
                WorkflowCommand::StartTimer {
                    delay_seconds: 60,
                    tags: Map::new(),
                },
            ];
            move |run, cx| complete_workflow_task(run, cx, &task_id, "w", fence, commands)
        })
        .await
        .unwrap();
    let (stream, items) = store.read_stream(target(&run), 0, 10).await.unwrap();
    assert_eq!((stream.last_offset, stream.total_items, stream.pending_items), (1, 2, 2));
    assert_eq!(items.iter().map(|i| i.offset).collect::<Vec<_>>(), [0, 1]);
    assert_eq!(items[0].item["origin"], "workflow_command");

    // A client's append: a known key is deduped, the cap stops it and keeps what came before.
    let done = store
        .append_stream_items(target(&run), vec![keyed(1), item(None), item(None)], Some(3), NOW)
        .await
        .unwrap();
    assert_eq!((done.accepted_offsets.clone(), done.accepted, done.deduped), (vec![1, 2], 1, 1));
    assert_eq!(done.full, Some((3, 3)));
    store.stream_caught_up(target(&run), 3).await.unwrap();
    let (_, after) = store.read_stream(target(&run), 2, 10).await.unwrap();
    assert_eq!(after.len(), 1);
    assert_eq!(
        store.list_streams("default", "streams", run.run_id.as_str()).await.unwrap()[0].pending_items,
        0
    );

    let closed = store.finish_stream(target(&run), Some("boom".into()), Some(5), NOW).await.unwrap();
    assert_eq!((closed.status.as_str(), closed.retention_seconds), ("errored", Some(5)));
    let again = store.finish_stream(target(&run), None, None, NOW + 1).await.unwrap();
    assert_eq!(again, closed, "a terminal stream stays as it ended");
    assert_eq!(
        reason(store.append_stream_items(target(&run), vec![item(None)], None, NOW).await),
        Reason::StreamErrored
    );
    let missing = StreamTarget {
        run_id: "nope".into(),
        ..target(&run)
    };
    assert_eq!(reason(store.read_stream(missing, 0, 1).await), Reason::InstanceNotFound);
    assert_eq!(store.expire_streams(NOW + 4_000).await.unwrap(), 0);
    assert_eq!(store.expire_streams(NOW + 6_000).await.unwrap(), 1);
    assert_eq!(reason(store.read_stream(target(&run), 0, 10).await), Reason::StreamNotFound);
}
