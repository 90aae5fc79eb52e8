//! External payload storage over HTTP on every backend: the transport advertised only while the
//! namespace's storage is usable, uploads checked against their declared size and SHA-256,
//! fetches verified against the stored reference (a changed or missing object is an error, never
//! a wrong value), references accepted in payload slots and handed back verbatim, the policy and
//! probe routes, and unused uploads collected.

use super::*;
use sha2::{Digest, Sha256};

const BLOB: &str = "wwHioz3/VYAiNwwA-a-large-payload-blob";

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

async fn set_local_storage(h: &Harness, root: &std::path::Path, threshold: u64) -> Value {
    let body = json!({"driver": "local", "threshold_bytes": threshold, "config": {"uri": format!("file://{}", root.display())}});
    send(h.client(Method::PUT, "/api/namespaces/default/external-storage").json(&body))
        .await
        .ok(200)
}

fn upload_request(h: &Harness, bytes: &[u8], size: usize, sha: &str) -> reqwest::RequestBuilder {
    h.worker(Method::POST, "/api/external-payloads/v1")
        .header("Content-Type", "application/octet-stream")
        .header("X-Durable-Workflow-Payload-Codec", "avro")
        .header("X-Durable-Workflow-Payload-Size", size.to_string())
        .header("X-Durable-Workflow-Payload-SHA256", sha)
        .body(bytes.to_vec())
}

async fn upload(h: &Harness, bytes: &[u8]) -> Value {
    let body = send(upload_request(h, bytes, bytes.len(), &sha256(bytes))).await.ok(201);
    assert_eq!(body["schema"], "durable-workflow.v2.runtime-external-payload-upload.v1");
    assert_eq!(body["transport_version"], 1);
    body["reference"].clone()
}

async fn fetch(h: &Harness, reference: &Value, sha: &str) -> reqwest::Response {
    let id = reference["reference_id"].as_str().unwrap();
    h.client(Method::GET, &format!("/api/external-payloads/v1/{id}"))
        .header("X-Durable-Workflow-Payload-Codec", "avro")
        .header("X-Durable-Workflow-Payload-Size", reference["size_bytes"].to_string())
        .header("X-Durable-Workflow-Payload-SHA256", sha)
        .send()
        .await
        .unwrap()
}

async fn error_of(response: reqwest::Response) -> (u16, Value) {
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

fn stored_file(root: &std::path::Path, reference: &Value) -> std::path::PathBuf {
    root.join("runtime/default").join(reference["reference_id"].as_str().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transport_is_advertised_with_usable_storage_and_serves_only_verified_bytes() {
    let h = Harness::start().await;
    let info = send(h.bare(Method::GET, "/api/cluster/info")).await.ok(200);
    assert_eq!(
        info["worker_protocol"]["server_capabilities"]["runtime_external_payload_transport"],
        false
    );
    assert_eq!(
        info["namespace"]["external_payload_storage"],
        Value::Null,
        "SDKs keep payloads inline"
    );
    let refused = send_allowing_server_errors(upload_request(&h, b"x", 1, &sha256(b"x"))).await;
    refused.err(503, "external_payload_unavailable");

    let root = tempfile::tempdir().unwrap();
    let described = set_local_storage(&h, root.path(), 100).await;
    assert_eq!(described["external_payload_storage"]["driver"], "local");
    assert_eq!(described["external_payload_storage"]["enabled"], true);
    assert_eq!(described["external_payload_storage"]["threshold_bytes"], 100);
    let info = send(h.bare(Method::GET, "/api/cluster/info")).await.ok(200);
    assert_eq!(
        info["worker_protocol"]["server_capabilities"]["runtime_external_payload_transport"],
        true
    );
    let storage = &info["namespace"]["external_payload_storage"];
    assert_eq!(storage["status"], "available");
    assert_eq!(storage["threshold_bytes"], 100);
    assert_eq!(
        storage["direct_provider_adapters"],
        json!({"capability_negotiated": true, "enabled": true})
    );
    assert_eq!(
        storage["transport"],
        json!({"schema": "durable-workflow.v2.runtime-external-payload-transport.v1", "version": 1,
               "reference_schema": "durable-workflow.v2.runtime-external-payload-reference.v1",
               "mode": "authenticated_namespace_runtime",
               "upload": {"method": "POST", "path": "/api/external-payloads/v1"},
               "fetch": {"method": "GET", "path_template": "/api/external-payloads/v1/{referenceId}"},
               "limits": {"max_payload_bytes": 64 << 20, "request_timeout_seconds": 60}})
    );

    // Upload (worker token) and fetch (control headers): the same bytes, the reference's headers.
    let bytes = BLOB.as_bytes();
    let reference = upload(&h, bytes).await;
    let id = reference["reference_id"].as_str().unwrap();
    assert!(id.starts_with("ep_") && id.len() == 29, "{id}");
    assert_eq!(
        reference,
        json!({"schema": "durable-workflow.v2.runtime-external-payload-reference.v1", "reference_id": id,
               "codec": "avro", "size_bytes": bytes.len(), "sha256": sha256(bytes)})
    );
    let fetched = fetch(&h, &reference, &sha256(bytes)).await;
    assert_eq!(fetched.status(), 200);
    assert_eq!(fetched.headers()["x-durable-workflow-payload-sha256"], sha256(bytes).as_str());
    assert_eq!(
        fetched.headers()["x-durable-workflow-payload-size"],
        bytes.len().to_string().as_str()
    );
    assert_eq!(fetched.headers()["x-durable-workflow-payload-codec"], "avro");
    assert_eq!(fetched.bytes().await.unwrap().as_ref(), bytes);

    // A caller expecting other bytes, an unknown id, another namespace.
    let (status, body) = error_of(fetch(&h, &reference, &"0".repeat(64)).await).await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (409, Some("external_payload_integrity_mismatch"))
    );
    let mut unknown = reference.clone();
    unknown["reference_id"] = json!("ep_01ARZ3NDEKTSV4RRFFQ69G5FAV");
    let (status, body) = error_of(fetch(&h, &unknown, &sha256(bytes)).await).await;
    assert_eq!((status, body["reason"].as_str()), (404, Some("external_payload_not_found")));

    // Uploads that do not match their declaration.
    send(upload_request(&h, bytes, bytes.len(), &"0".repeat(64)))
        .await
        .err(409, "external_payload_integrity_mismatch");
    send(upload_request(&h, bytes, bytes.len() + 1, &sha256(bytes)))
        .await
        .err(409, "external_payload_integrity_mismatch");
    let json_codec = h
        .worker(Method::POST, "/api/external-payloads/v1")
        .header("X-Durable-Workflow-Payload-Codec", "json")
        .header("X-Durable-Workflow-Payload-Size", bytes.len().to_string())
        .header("X-Durable-Workflow-Payload-SHA256", sha256(bytes))
        .body(bytes.to_vec());
    send(json_codec).await.err(422, "external_payload_unsupported");
    let no_size = h
        .worker(Method::POST, "/api/external-payloads/v1")
        .header("X-Durable-Workflow-Payload-Codec", "avro")
        .header("X-Durable-Workflow-Payload-SHA256", sha256(bytes))
        .body(bytes.to_vec());
    let body = send(no_size).await.err(422, "validation_failed");
    assert!(body["errors"].to_string().contains("x-durable-workflow-payload-size"), "{body}");
    // No completion context is advertised: an upload carrying one is refused by name, not ignored.
    let completion = upload_request(&h, bytes, bytes.len(), &sha256(bytes)).header("X-Durable-Workflow-Payload-Completion", "{}");
    let body = send(completion).await.err(422, "validation_failed");
    assert!(
        body["errors"].to_string().contains("x-durable-workflow-payload-completion"),
        "{body}"
    );
    let upper = upload_request(&h, bytes, bytes.len(), &sha256(bytes).to_uppercase());
    send(upper).await.err(422, "validation_failed");

    // The stored object altered, then gone: an error each time, never the wrong bytes.
    std::fs::write(stored_file(root.path(), &reference), b"tampered").unwrap();
    let (status, body) = error_of(fetch(&h, &reference, &sha256(bytes)).await).await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (409, Some("external_payload_integrity_mismatch"))
    );
    std::fs::remove_file(stored_file(root.path(), &reference)).unwrap();
    let (status, body) = error_of(fetch(&h, &reference, &sha256(bytes)).await).await;
    assert_eq!((status, body["reason"].as_str()), (404, Some("external_payload_not_found")));

    // Disabled: no longer advertised, uploads refused.
    let body = json!({"driver": "local", "enabled": false});
    send(h.client(Method::PUT, "/api/namespaces/default/external-storage").json(&body))
        .await
        .ok(200);
    let info = send(h.bare(Method::GET, "/api/cluster/info")).await.ok(200);
    assert_eq!(info["namespace"]["external_payload_storage"], Value::Null);
    send_allowing_server_errors(upload_request(&h, bytes, bytes.len(), &sha256(bytes)))
        .await
        .err(503, "external_payload_unavailable");
}

fn runtime_envelope(reference: &Value) -> Value {
    json!({"codec": "avro", "external_payload": reference})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn references_fill_payload_slots_and_come_back_verbatim() {
    let h = Harness::start().await;
    let root = tempfile::tempdir().unwrap();
    set_local_storage(&h, root.path(), 10).await;
    let reference = upload(&h, BLOB.as_bytes()).await;
    let direct = json!({"codec": "avro", "external_storage": {"schema": "durable-workflow.v2.external-payload-reference.v1",
        "uri": "s3://app-bucket/avro/ab/abcd", "sha256": "b".repeat(64), "size_bytes": 5000, "codec": "avro"}});
    let queue = unique("ep-q");
    let workflow_id = unique("ep");
    h.register("ep-w", &queue).await;
    h.start_workflow_with(
        json!({"workflow_id": workflow_id, "workflow_type": "test.workflow", "task_queue": queue,
        "input": runtime_envelope(&reference)}),
    )
    .await
    .ok(201);
    let task = h.next_workflow_task("ep-w", &queue).await;
    let started = task["history_events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event_type"] == "WorkflowStarted")
        .expect("a start event")
        .clone();
    assert!(started.to_string().contains(&runtime_envelope(&reference).to_string()), "{started}");
    assert_eq!(task["arguments"], runtime_envelope(&reference));
    let commands = json!([{"type": "schedule_activity", "activity_type": "a", "arguments": direct}]);
    h.complete_workflow_task(&task, commands).await.ok(200);
    let activity = h.next_activity_task("ep-w", &queue).await;
    assert_eq!(
        activity["arguments"], direct,
        "a direct reference is handed to the activity as sent"
    );
    let result = runtime_envelope(&reference);
    let completion = json!({"activity_attempt_id": activity["activity_attempt_id"], "lease_owner": "ep-w", "result": result});
    let path = format!("/api/worker/activity-tasks/{}/complete", activity["task_id"].as_str().unwrap());
    h.wpost(&path, completion).await.ok(200);
    let run_id = task["run_id"].as_str().unwrap();
    let history = h.history(&workflow_id, run_id).await;
    let completed = history.iter().find(|e| e["event_type"] == "ActivityCompleted").expect("completed");
    assert_eq!(completed["payload"]["result"], runtime_envelope(&reference), "{completed}");

    // Malformed references are refused by name.
    for (bad, problem) in [
        (json!({"codec": "avro", "external_payload": {"schema": "x"}}), "lacks reference_id"),
        (
            json!({"codec": "avro", "external_payload": reference, "blob": "x"}),
            "exactly codec and external_payload",
        ),
        (json!({"codec": "json", "external_payload": reference}), "codec"),
    ] {
        let body = h
            .start_workflow_with(json!({"workflow_id": unique("bad"), "workflow_type": "t", "task_queue": queue, "input": bad}))
            .await
            .err(422, "validation_failed");
        assert!(body.to_string().contains(problem), "{problem}: {body}");
        assert!(body["errors"]["input"].is_array(), "{body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policies_are_checked_probed_and_unused_uploads_collected() {
    let mut config = ServerConfig::default();
    config.payloads.unused_grace_ms = 0;
    let h = Harness::with_config(config, None).await;
    let put = |body: Value| send(h.client(Method::PUT, "/api/namespaces/default/external-storage").json(&body));
    put(json!({"driver": "ftp"})).await.err(422, "validation_failed");
    put(json!({"driver": "local", "config": {"colour": "red"}}))
        .await
        .err(422, "validation_failed");
    put(json!({"driver": "local", "extra": 1})).await.err(422, "validation_failed");
    put(json!({"driver": "s3", "config": {"bucket": "b", "auth_profile": "p"}}))
        .await
        .err(422, "external_payload_unsupported");
    send(
        h.client(Method::PUT, "/api/namespaces/nope/external-storage")
            .json(&json!({"driver": "local"})),
    )
    .await
    .err(404, "namespace_not_found");

    // Not configured, then a driver this build lacks: the probe fails in DW's shape.
    let probe = |body: Value| send(h.client(Method::POST, "/api/storage/test").json(&body));
    let failed = probe(json!({})).await.err(422, "external_storage_not_configured");
    assert_eq!(failed["status"], "failed");
    put(json!({"driver": "gcs", "config": {"bucket": "b"}})).await.ok(200);
    probe(json!({})).await.err(422, "storage_driver_unavailable");
    let info = send(h.bare(Method::GET, "/api/cluster/info")).await.ok(200);
    assert_eq!(
        info["namespace"]["external_payload_storage"],
        Value::Null,
        "gcs is recorded, not served"
    );

    let root = tempfile::tempdir().unwrap();
    set_local_storage(&h, root.path(), 100).await;
    probe(json!({"driver": "s3"})).await.err(422, "storage_driver_unavailable");
    let passed = probe(json!({"small_payload_bytes": 10, "large_payload_bytes": 4096})).await.ok(200);
    assert_eq!(passed["status"], "passed");
    assert_eq!(passed["driver"], "local");
    assert_eq!(passed["small_payload"]["bytes"], 10);
    assert_eq!(passed["large_payload"]["sha256"], sha256(&[b'l'; 4096]));
    assert!(passed["large_payload"]["reference_uri"].as_str().unwrap().starts_with("file:///"));

    // An upload a workflow names stays; one nothing names goes at the next collection.
    let kept = upload(&h, b"kept-payload-bytes").await;
    let dropped = upload(&h, b"dropped-payload-bytes").await;
    h.start_workflow_with(json!({"workflow_id": unique("holder"), "workflow_type": "t", "task_queue": "q",
        "input": runtime_envelope(&kept)}))
        .await
        .ok(201);
    send(
        h.client(Method::PUT, "/api/namespaces/default")
            .json(&json!({"retention_days": 30})),
    )
    .await
    .ok(200);
    let pass = h.cpost("/api/system/retention/pass", json!({})).await.ok(200);
    assert_eq!(pass["external_payloads_deleted"], 1);
    assert!(stored_file(root.path(), &kept).exists());
    assert!(!stored_file(root.path(), &dropped).exists());
    let (status, _) = error_of(fetch(&h, &dropped, &sha256(b"dropped-payload-bytes")).await).await;
    assert_eq!(status, 404);
    assert_eq!(fetch(&h, &kept, &sha256(b"kept-payload-bytes")).await.status(), 200);
}

/// A DW Avro frame (the `Value` schema's header) with `n` bytes of body.
fn large_frame(n: usize) -> String {
    use base64::Engine;
    let engine = base64::engine::general_purpose::STANDARD;
    let mut bytes = engine.decode(AVRO_NULL).unwrap()[..10].to_vec();
    bytes.extend(std::iter::repeat_n(7u8, n));
    engine.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_payloads_above_the_threshold_are_offloaded_for_clients_that_did_not() {
    let h = Harness::start().await;
    let root = tempfile::tempdir().unwrap();
    set_local_storage(&h, root.path(), 200).await;
    let big = large_frame(600);
    let small = large_frame(20);
    let queue = unique("offload-q");
    let workflow_id = unique("offload");
    h.register("offload-w", &queue).await;
    let memo = json!({"note": "x".repeat(300)});
    h.start_workflow_with(
        json!({"workflow_id": workflow_id, "workflow_type": "test.workflow", "task_queue": queue,
        "input": env(&big), "memo": memo}),
    )
    .await
    .ok(201);
    let task = h.next_workflow_task("offload-w", &queue).await;
    let reference = task["arguments"]["external_payload"].clone();
    assert_eq!(task["arguments"]["codec"], "avro");
    assert_eq!(reference["size_bytes"], big.len());
    let fetched = fetch(&h, &reference, &sha256(big.as_bytes())).await;
    assert_eq!(fetched.status(), 200);
    assert_eq!(fetched.bytes().await.unwrap().as_ref(), big.as_bytes(), "the same blob comes back");
    // A bare side-effect result and an activity's arguments; a small payload stays inline.
    let commands = json!([
        {"type": "record_side_effect", "result": big.clone()},
        {"type": "schedule_activity", "activity_type": "a", "arguments": env(&small)},
    ]);
    h.complete_workflow_task(&task, commands).await.ok(200);
    let history = h.history(&workflow_id, task["run_id"].as_str().unwrap()).await;
    let side_effect = history
        .iter()
        .find(|e| e["event_type"] == "SideEffectRecorded")
        .expect("side effect");
    assert_eq!(
        side_effect["payload"]["result"]["external_payload"]["sha256"],
        sha256(big.as_bytes())
    );
    let activity = h.next_activity_task("offload-w", &queue).await;
    assert_eq!(activity["arguments"], env(&small));
    let text = serde_json::to_string(&history).unwrap();
    assert!(!text.contains(&big), "the large blob is nowhere inline");
    assert_eq!(
        h.describe(&workflow_id).await["memo"],
        memo,
        "memos stay inline (the server reads them)"
    );
    // The blob was sent in two requests (start, completion): stored once by each.
    let stored = std::fs::read_dir(root.path().join("runtime/default")).unwrap().count();
    assert_eq!(stored, 2);
}
