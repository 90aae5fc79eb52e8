//! The Rust SDK over TLS: `capstan serve --tls-cert --tls-key` with a certificate its own CA
//! signed; the client and its worker trust that CA by the SDK's own option
//! (`additional_root_certificates_pem`) and run a workflow with an activity. A client that does
//! not trust it is refused by the handshake.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_sdk_runs_a_workflow_over_tls() {
    let server = CapstanServer::spawn_tls().await;
    assert!(server.base_url().starts_with("https://"), "{}", server.base_url());
    let client = server.client();
    let queue = unique("tls-q");
    let mut worker = new_worker(&client, &queue);
    worker.register_activity("e2e.tls.greet", |_ctx, input| async move {
        let name = input.get(0).and_then(Value::as_str).unwrap_or("nobody").to_string();
        Ok(json!(format!("hello {name}")))
    });
    worker.register_workflow("e2e.tls", |ctx, _input| async move {
        let greeting: Value = ctx.activity_typed("e2e.tls.greet", "over tls".to_string()).await?;
        Ok(greeting)
    });
    let mut running = RunningWorker::start(worker);
    let handle = start(&client, "e2e.tls", &queue, &unique("tls"), json!(["over tls"])).await;
    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("the workflow did not complete over TLS: {error} ({error:?})"));
    assert_eq!(result, json!("hello over tls"));
    running.shutdown().await;

    // Without the CA, the same SDK is refused by the handshake.
    let stranger = Client::builder(server.base_url().to_string())
        .namespace("default")
        .timeout(Duration::from_secs(10))
        .build()
        .expect("a client");
    let refused = stranger.start_workflow("e2e.tls", &queue, &unique("untrusted"), json!([])).await;
    assert!(refused.is_err(), "a client that does not trust the server's CA got through");
}
