//! Workflow output streams over HTTP on every backend: a worker's `record_side_effect`
//! directive applied with its side effect (or the completion refused whole), offsets from 0,
//! dedupe by idempotency key, the pending cap, close/error, and the client routes.

use super::*;

const ITEM: &str = "wwHioz3/VYAiNwwA";

fn directive(identity: &str, ordinal: u64, operation: Value) -> Value {
    let mut stream = operation;
    stream["stream_name"] = json!("out");
    stream["command_identity"] = json!(identity);
    stream["command_ordinal"] = json!(ordinal);
    json!({"type": "record_side_effect", "result": env(AVRO_NULL), "workflow_stream": stream})
}

fn items(identity: &str, ordinal: u64, n: usize) -> Value {
    json!((0..n)
        .map(|i| json!({"payload": env(ITEM), "payload_codec": "avro", "item_type": "token",
                        "idempotency_key": format!("dw-stream:{identity}:{ordinal}:{i}")}))
        .collect::<Vec<_>>())
}

#[tokio::test]
async fn a_directive_appends_with_its_side_effect_and_clients_read_append_and_close() {
    let h = Harness::start().await;
    let queue = unique("ws-q");
    let workflow_id = unique("ws");
    h.register("ws-w", &queue).await;
    let run_id = h.start_workflow(&workflow_id, &queue).await["run_id"].as_str().unwrap().to_string();
    let task = h.next_workflow_task("ws-w", &queue).await;
    let identity = task["task_id"].as_str().unwrap().to_string();
    let base = format!("/api/workflows/{workflow_id}/runs/{run_id}/streams");

    // A key that does not follow the rule refuses the whole completion.
    let mut bad = items(&identity, 0, 2);
    bad[1]["idempotency_key"] = json!("mine");
    let refused = h
        .complete_workflow_task(
            &task,
            json!([directive(&identity, 0, json!({"operation": "append", "items": bad}))]),
        )
        .await
        .err(422, "invalid_workflow_stream_command");
    assert_eq!(refused["recorded"], false);
    h.cget(&format!("{base}/out")).await.err(404, "stream_not_found");

    let append = directive(&identity, 0, json!({"operation": "append", "items": items(&identity, 0, 3)}));
    h.complete_workflow_task(&task, json!([append, {"type": "start_timer", "delay_seconds": 3600}]))
        .await
        .ok(200);
    let history = h.history(&workflow_id, &run_id).await;
    let side_effects: Vec<&Value> = history.iter().filter(|e| e["event_type"] == "SideEffectRecorded").collect();
    assert_eq!(side_effects.len(), 1);
    assert!(
        side_effects[0]["payload"].get("workflow_stream").is_none(),
        "the directive is not recorded"
    );

    let read = h.cget(&format!("{base}/out/items")).await.ok(200);
    let offsets: Vec<u64> = read["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, [0, 1, 2]);
    assert_eq!(read["items"][0]["origin"], "workflow_command");
    assert_eq!(read["items"][0]["origin_reference"], identity.as_str());
    assert_eq!(read["items"][0]["payload"], env(ITEM));
    assert_eq!((read["next_offset"].as_u64(), read["terminal"].as_bool()), (Some(3), Some(false)));
    assert_eq!(read["stream"]["pending_items"], 0, "a reader at the head clears the pending count");

    // Clients append: a known key is deduped; the cap stops an append and keeps what came before.
    let client_items = json!([{"payload": env(ITEM), "idempotency_key": "c-1"}, {"payload": env(ITEM)}, {"payload": env(ITEM)}]);
    let appended = h
        .cpost(&format!("{base}/out/items"), json!({"items": client_items, "max_pending_items": 2}))
        .await;
    let full = appended.err(429, "stream_full");
    assert_eq!(
        (full["accepted"].as_u64(), full["max_pending_items"].as_u64()),
        (Some(2), Some(2)),
        "{full}"
    );
    assert_eq!(full["accepted_offsets"], json!([3, 4]));
    let again = h
        .cpost(
            &format!("{base}/out/items"),
            json!({"items": [{"payload": env(ITEM), "idempotency_key": "c-1"}]}),
        )
        .await
        .ok(200);
    assert_eq!(
        (again["accepted_offsets"].clone(), again["deduped"].as_u64()),
        (json!([3]), Some(1))
    );
    let waited = h.cget(&format!("{base}/out/items?from=5&wait_seconds=1")).await.ok(200);
    assert!(waited["items"].as_array().unwrap().is_empty());
    assert_eq!(waited["next_offset"], 5);

    let closed = h.cpost(&format!("{base}/out/close"), json!({})).await.ok(200);
    assert_eq!(
        (closed["stream"]["status"].as_str(), closed["stream"]["retention_seconds"].as_i64()),
        (Some("closed"), Some(3600))
    );
    h.cpost(&format!("{base}/out/items"), json!({"items": [{"payload": env(ITEM)}]}))
        .await
        .err(409, "stream_closed");
    let tail = h.cget(&format!("{base}/out/items?from=5")).await.ok(200);
    assert_eq!(tail["terminal"], true);
    let listed = h.cget(&base).await.ok(200);
    assert_eq!(listed["streams"][0]["last_offset"], 4);
    h.cget(&format!("/api/workflows/{workflow_id}/runs/nope/streams"))
        .await
        .err(404, "instance_not_found");
    h.cget(&format!("{base}/-bad")).await.err(400, "invalid_stream_name");
    h.cget(&format!("{base}/out/items?max_items=501"))
        .await
        .err(422, "validation_failed");
}

#[tokio::test]
async fn a_directive_on_a_closed_or_full_stream_refuses_the_completion_whole() {
    let h = Harness::start().await;
    let queue = unique("ws-q");
    let workflow_id = unique("ws-full");
    h.register("ws-w", &queue).await;
    let run_id = h.start_workflow(&workflow_id, &queue).await["run_id"].as_str().unwrap().to_string();
    let task = h.next_workflow_task("ws-w", &queue).await;
    let identity = task["task_id"].as_str().unwrap().to_string();
    let first = directive(
        &identity,
        0,
        json!({"operation": "append", "items": items(&identity, 0, 1), "max_pending_items": 1}),
    );
    let second = directive(
        &identity,
        1,
        json!({"operation": "append", "items": items(&identity, 1, 1), "max_pending_items": 1}),
    );
    let full = h
        .complete_workflow_task(&task, json!([first.clone(), second]))
        .await
        .err(429, "stream_full");
    assert_eq!(full["recorded"], false);
    let base = format!("/api/workflows/{workflow_id}/runs/{run_id}/streams");
    h.cget(&format!("{base}/out")).await.err(404, "stream_not_found");
    assert_eq!(
        h.history(&workflow_id, &run_id).await.len(),
        2,
        "nothing of the completion was kept"
    );
    let close = directive(&identity, 1, json!({"operation": "close"}));
    let error = directive(&identity, 2, json!({"operation": "error", "error_reason": "boom"}));
    h.complete_workflow_task(&task, json!([first, close, error, {"type": "start_timer", "delay_seconds": 3600}]))
        .await
        .ok(200);
    let described = h.cget(&format!("{base}/out")).await.ok(200);
    assert_eq!(described["stream"]["status"], "closed", "a terminal stream stays as it ended");
}
