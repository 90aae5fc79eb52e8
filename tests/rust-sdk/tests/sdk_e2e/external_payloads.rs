//! The Rust SDK's runtime external payload transport against Capstan: with a namespace storage
//! policy set, the client and worker upload payloads above the threshold, history holds only
//! references, and every party gets its values back (fetched and verified by the SDK).

use super::*;

const BIG: usize = 30_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_payloads_travel_by_reference() {
    let server = CapstanServer::spawn().await;
    let storage = tempfile::tempdir().expect("storage dir");
    let http = reqwest::Client::new();
    let policy = json!({"driver": "local", "threshold_bytes": 2048,
                        "config": {"uri": format!("file://{}", storage.path().display())}});
    let response = http
        .put(format!("{}/api/namespaces/default/external-storage", server.base_url()))
        .header("X-Durable-Workflow-Control-Plane-Version", "2")
        .json(&policy)
        .send()
        .await
        .expect("set the storage policy");
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap_or_default());

    let client = server.client();
    let queue = unique("ep-q");
    let mut worker = new_worker(&client, &queue);
    worker.register_activity("e2e.repeat", |_ctx, args| async move {
        let text = args.get(0).and_then(Value::as_str).unwrap_or_default().to_string();
        Ok(json!(text.repeat(2)))
    });
    worker.register_workflow("e2e.large", |ctx, input| async move {
        let text = input.get(0).and_then(Value::as_str).unwrap_or_default().to_string();
        let doubled = ctx.activity("e2e.repeat", json!([text])).await?;
        let doubled = doubled.as_str().unwrap_or_default().to_string();
        Ok(json!({"length": doubled.len(), "tail": doubled[doubled.len() - 100..].to_string(), "echo": doubled}))
    });
    let mut running = RunningWorker::start(worker);
    let workflow_id = unique("ep");
    let input = "r".repeat(BIG);
    let handle = start(&client, "e2e.large", &queue, &workflow_id, json!([input])).await;
    let run_id = run_id_of(&handle).await;
    let result = running.result(&handle).await.expect("the workflow completes");
    assert_eq!(result["length"], 2 * BIG);
    assert_eq!(result["echo"].as_str().map(str::len), Some(2 * BIG));

    let events = server.history_events(&workflow_id, &run_id).await;
    let longest = longest_string(&Value::Array(events.clone()));
    assert!(
        longest <= 2048,
        "an inline value of {longest} characters: nothing above the threshold sits in history"
    );
    let history = serde_json::to_string(&events).unwrap();
    assert!(
        history.matches("\"external_payload\"").count() >= 3,
        "input, activity result and workflow result are references: {}",
        &history[..history.len().min(3000)]
    );
    let stored = std::fs::read_dir(storage.path().join("runtime/default"))
        .expect("stored objects")
        .count();
    assert!(stored >= 4, "{stored} objects");
    running.shutdown().await;
}

fn longest_string(value: &Value) -> usize {
    match value {
        Value::String(text) => text.len(),
        Value::Array(items) => items.iter().map(longest_string).max().unwrap_or(0),
        Value::Object(map) => map.values().map(longest_string).max().unwrap_or(0),
        _ => 0,
    }
}
