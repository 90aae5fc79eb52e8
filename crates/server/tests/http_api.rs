//! HTTP-level integration tests of the DW v2 wire contract (`/work/shared/protocol`): every
//! endpoint, its success shape and its error paths, against a real server on a loopback port.
//! Every error is checked for its status, its `reason`, and the DW error shape.

#[path = "http_api/activity_lease.rs"]
mod activity_lease;
#[path = "http_api/activity_stop.rs"]
mod activity_stop;
#[path = "http_api/admission.rs"]
mod admission;
#[path = "http_api/batches.rs"]
mod batches;
mod common;
#[path = "http_api/credentials_api.rs"]
mod credentials_api;
#[path = "http_api/deadlines.rs"]
mod deadlines;
#[path = "http_api/dispatch.rs"]
mod dispatch;
#[path = "http_api/external_payloads.rs"]
mod external_payloads;
#[path = "http_api/history_budget.rs"]
mod history_budget;
#[path = "http_api/imports.rs"]
mod imports;
#[path = "http_api/metrics.rs"]
mod metrics;
#[path = "http_api/pause.rs"]
mod pause;
#[path = "http_api/prepared_local.rs"]
mod prepared_local;
#[path = "http_api/principals.rs"]
mod principals;
#[path = "http_api/redrive.rs"]
mod redrive;
#[path = "http_api/service_calls.rs"]
mod service_calls;
#[path = "http_api/service_catalog.rs"]
mod service_catalog;
#[path = "http_api/sessions.rs"]
mod sessions;
#[path = "http_api/standalone.rs"]
mod standalone;
#[path = "http_api/sticky.rs"]
mod sticky;
#[path = "http_api/tenancy.rs"]
mod tenancy;
#[path = "http_api/trace_context.rs"]
mod trace_context;
#[path = "http_api/workflow_streams.rs"]
mod workflow_streams;

use capstan_server::ServerConfig;
use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

// ============================================================================================
// Health, readiness, cluster info

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_ready_need_no_headers() {
    let h = Harness::start().await;
    let health = send(h.bare(Method::GET, "/api/health")).await.ok(200);
    assert_eq!(health["status"], "serving");
    assert_eq!(health["checks"]["database"], "ok");
    assert!(health["timestamp"].is_string());

    let resp = send(h.bare(Method::GET, "/api/health")).await;
    assert!(resp.header("content-type").is_some_and(|t| t.starts_with("application/json")));
    let resp = send(h.bare(Method::GET, "/api/workflows")).await;
    assert!(resp.header("content-type").is_some_and(|t| t.starts_with("application/json")));
    resp.err(400, "missing_control_plane_version");

    let ready = send(h.bare(Method::GET, "/api/ready")).await.ok(200);
    assert_eq!(ready["status"], "ready");
    assert!(ready["checks"].is_object());
    assert!(ready["timestamp"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_info_passes_the_python_sdk_checks() {
    let h = Harness::start().await;
    let info = send(h.bare(Method::GET, "/api/cluster/info")).await.ok(200);
    assert_python_sdk_accepts_cluster_info(&info, 20);
    assert_python_sdk_accepts_cluster_info(&info, 19);
    assert_eq!(info["worker_protocol"]["version"], "1.20");
    assert_eq!(info["default_namespace"], "default");
    assert_eq!(info["namespace"]["name"], "default");
    assert!(info["server_id"].is_string());
    assert_eq!(
        info["control_plane"]["request_contract"]["operations"]["start"]["fields"]["duplicate_policy"]["canonical_values"],
        json!(["fail", "use-existing"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_info_is_not_version_gated_and_tolerates_unknown_namespaces() {
    let h = Harness::start().await;
    // Either plane's header, with any value, or none.
    for (header, value) in [
        (PROTOCOL_HEADER, "1.20"),
        (PROTOCOL_HEADER, "9.99"),
        (CONTROL_HEADER, "2"),
        (CONTROL_HEADER, "7"),
    ] {
        let info = send(h.bare(Method::GET, "/api/cluster/info").header(header, value)).await.ok(200);
        assert_python_sdk_accepts_cluster_info(&info, 20);
    }
    let info = send(h.bare(Method::GET, "/api/cluster/info").header("X-Namespace", "No-Such-Namespace"))
        .await
        .ok(200);
    assert_eq!(info["namespace"]["name"], "no-such-namespace");
}

// ============================================================================================
// Version negotiation and namespace resolution

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_protocol_1_19_and_1_20_are_accepted() {
    let h = Harness::start().await;
    for (worker, version) in [("w-119", "1.19"), ("w-120", "1.20"), ("w-10", "1.0")] {
        let resp = send(
            h.bare(Method::POST, "/api/worker/register")
                .header(PROTOCOL_HEADER, version)
                .header("X-Namespace", "default")
                .json(&json!({"worker_id": worker, "task_queue": "q", "runtime": "python"})),
        )
        .await;
        assert_eq!(resp.header(PROTOCOL_HEADER).as_deref(), Some("1.20"));
        let body = resp.ok(201);
        assert_eq!(body["worker_id"], worker);
        assert_eq!(body["registered"], true);
        assert_eq!(body["protocol_version"], "1.20");
        assert!(body["server_capabilities"].is_object());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_protocol_missing_or_unsupported_is_refused() {
    let h = Harness::start().await;
    let register = json!({"worker_id": "w", "task_queue": "q", "runtime": "rust"});

    let resp = send(
        h.bare(Method::POST, "/api/worker/register")
            .header("X-Namespace", "default")
            .json(&register),
    )
    .await;
    assert_eq!(resp.header(PROTOCOL_HEADER).as_deref(), Some("1.20"));
    let body = resp.err(400, "missing_protocol_version");
    assert_eq!(body["supported_version"], "1.20");
    assert!(body["error"].is_string(), "version errors carry `error` too: {body}");

    for version in ["1.21", "2.0", "2", "abc", "1.x", ""] {
        let resp = send(
            h.bare(Method::POST, "/api/worker/register")
                .header(PROTOCOL_HEADER, version)
                .header("X-Namespace", "default")
                .json(&register),
        )
        .await;
        let body = resp.err(400, "unsupported_protocol_version");
        assert_eq!(body["supported_version"], "1.20");
        assert_eq!(body["requested_version"], version);
        assert!(body["error"].is_string());
        assert_eq!(body["protocol_version"], "1.20", "worker-plane errors are decorated too");
    }
    // The control-plane header does not satisfy the worker plane.
    send(
        h.bare(Method::POST, "/api/worker/register")
            .header(CONTROL_HEADER, "2")
            .json(&register),
    )
    .await
    .err(400, "missing_protocol_version");
    // Nothing was registered by the refused requests.
    h.wpost("/api/worker/heartbeat", json!({"worker_id": "w"}))
        .await
        .err(404, "worker_not_registered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_version_missing_or_unsupported_is_refused() {
    let h = Harness::start().await;
    let resp = send(h.bare(Method::GET, "/api/workflows").header("X-Namespace", "default")).await;
    assert_eq!(resp.header(CONTROL_HEADER).as_deref(), Some("2"));
    let body = resp.err(400, "missing_control_plane_version");
    assert_eq!(body["supported_version"], "2");
    assert!(body["error"].is_string());

    for version in ["1", "3", "2.0", "v2"] {
        let resp = send(h.bare(Method::GET, "/api/workflows").header(CONTROL_HEADER, version)).await;
        assert_eq!(resp.header(CONTROL_HEADER).as_deref(), Some("2"));
        let body = resp.err(400, "unsupported_control_plane_version");
        assert_eq!(body["requested_version"], version);
        assert_eq!(body["supported_version"], "2");
    }
    // The worker header does not satisfy the control plane.
    send(h.bare(Method::GET, "/api/workflows").header(PROTOCOL_HEADER, "1.20"))
        .await
        .err(400, "missing_control_plane_version");

    send(h.bare(Method::GET, "/api/workflows").header(CONTROL_HEADER, " 2 "))
        .await
        .ok(200);
    let ok = h.cget("/api/workflows").await;
    assert_eq!(ok.header(CONTROL_HEADER).as_deref(), Some("2"));
    ok.ok(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_namespace_is_404_after_the_version_check() {
    let h = Harness::start().await;
    // Worker plane.
    let body = send(
        h.bare(Method::POST, "/api/worker/register")
            .header(PROTOCOL_HEADER, "1.20")
            .header("X-Namespace", "nowhere")
            .json(&json!({"worker_id": "w", "task_queue": "q", "runtime": "rust"})),
    )
    .await
    .err(404, "namespace_not_found");
    assert_eq!(body["namespace"], "nowhere");
    // Control plane, by header and by query parameter.
    let body = send(
        h.bare(Method::GET, "/api/workflows")
            .header(CONTROL_HEADER, "2")
            .header("X-Namespace", "nowhere"),
    )
    .await
    .err(404, "namespace_not_found");
    assert_eq!(body["namespace"], "nowhere");
    send(
        h.bare(Method::GET, "/api/workflows?namespace=elsewhere")
            .header(CONTROL_HEADER, "2"),
    )
    .await
    .err(404, "namespace_not_found");
    // Version errors win over the namespace check.
    send(h.bare(Method::GET, "/api/workflows").header("X-Namespace", "nowhere"))
        .await
        .err(400, "missing_control_plane_version");
    send(
        h.bare(Method::POST, "/api/worker/heartbeat")
            .header("X-Namespace", "nowhere")
            .json(&json!({"worker_id": "w"})),
    )
    .await
    .err(400, "missing_protocol_version");
    // Polls and task reports look the namespace up only when refused; the error is the same.
    for (path, body) in [
        (
            "/api/worker/workflow-tasks/poll",
            json!({"worker_id": "w", "task_queue": "q", "timeout_seconds": 0}),
        ),
        (
            "/api/worker/activity-tasks/poll",
            json!({"worker_id": "w", "task_queue": "q", "timeout_seconds": 0}),
        ),
        (
            "/api/worker/workflow-tasks/t-1/complete",
            json!({"lease_owner": "w", "workflow_task_attempt": 1, "commands": []}),
        ),
        (
            "/api/worker/activity-tasks/t-1/complete",
            json!({"lease_owner": "w", "activity_attempt_id": "a"}),
        ),
        ("/api/worker/activity-tasks/t-1/heartbeat", json!({"not_a_field": true})),
    ] {
        let body = send(
            h.bare(Method::POST, path)
                .header(PROTOCOL_HEADER, "1.20")
                .header("X-Namespace", "nowhere")
                .json(&body),
        )
        .await
        .err(404, "namespace_not_found");
        assert_eq!(body["namespace"], "nowhere", "{path}");
    }
    // The namespace is lower-cased; no header at all means `default`.
    send(
        h.bare(Method::GET, "/api/workflows")
            .header(CONTROL_HEADER, "2")
            .header("X-Namespace", "DEFAULT"),
    )
    .await
    .ok(200);
    send(h.bare(Method::GET, "/api/workflows").header(CONTROL_HEADER, "2"))
        .await
        .ok(200);
}

// ============================================================================================
// Authentication

async fn token_harness() -> Harness {
    Harness::with_config(
        ServerConfig {
            auth: Tokens::config(),
            ..ServerConfig::default()
        },
        None,
    )
    .await
}

fn worker_call(h: &Harness, token: Option<&str>) -> reqwest::RequestBuilder {
    let request = h
        .bare(Method::POST, "/api/worker/heartbeat")
        .header(PROTOCOL_HEADER, "1.20")
        .header("X-Namespace", "default")
        .json(&json!({"worker_id": "nobody"}));
    match token {
        Some(token) => request.bearer_auth(token),
        None => request,
    }
}

fn control_call(h: &Harness, token: Option<&str>) -> reqwest::RequestBuilder {
    let request = h
        .bare(Method::GET, "/api/workflows")
        .header(CONTROL_HEADER, "2")
        .header("X-Namespace", "default");
    match token {
        Some(token) => request.bearer_auth(token),
        None => request,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_auth_401_without_or_with_a_wrong_token() {
    let h = token_harness().await;
    send(worker_call(&h, None)).await.err(401, "unauthorized");
    send(worker_call(&h, Some("wrong"))).await.err(401, "unauthorized");
    send(control_call(&h, None)).await.err(401, "unauthorized");
    send(control_call(&h, Some("wrong"))).await.err(401, "unauthorized");
    send(h.bare(Method::GET, "/api/cluster/info")).await.err(401, "unauthorized");
    send(h.bare(Method::GET, "/api/cluster/info").bearer_auth("wrong"))
        .await
        .err(401, "unauthorized");
    send(
        h.bare(Method::GET, "/api/cluster/info")
            .header("Authorization", "Basic c2hhcmVkLXNlY3JldA=="),
    )
    .await
    .err(401, "unauthorized");
    // Health and readiness stay open.
    send(h.bare(Method::GET, "/api/health")).await.ok(200);
    send(h.bare(Method::GET, "/api/ready")).await.ok(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_auth_roles_are_enforced_per_plane() {
    let h = token_harness().await;
    // Worker plane: worker and shared tokens pass (404 = reached the handler), others are 403.
    send(worker_call(&h, Some(Tokens::WORKER))).await.err(404, "worker_not_registered");
    send(worker_call(&h, Some(Tokens::SHARED))).await.err(404, "worker_not_registered");
    send(worker_call(&h, Some(Tokens::OPERATOR))).await.err(403, "forbidden");
    send(worker_call(&h, Some(Tokens::ADMIN))).await.err(403, "forbidden");
    // Control plane: operator, admin and shared pass; worker is 403.
    send(control_call(&h, Some(Tokens::OPERATOR))).await.ok(200);
    send(control_call(&h, Some(Tokens::ADMIN))).await.ok(200);
    send(control_call(&h, Some(Tokens::SHARED))).await.ok(200);
    send(control_call(&h, Some(Tokens::WORKER))).await.err(403, "forbidden");
    // Cluster info: any role.
    for token in [Tokens::WORKER, Tokens::OPERATOR, Tokens::ADMIN, Tokens::SHARED] {
        let info = send(h.bare(Method::GET, "/api/cluster/info").bearer_auth(token)).await.ok(200);
        assert_python_sdk_accepts_cluster_info(&info, 20);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_token_drives_a_whole_workflow() {
    let h = Harness::with_config(
        ServerConfig {
            auth: Tokens::config(),
            ..ServerConfig::default()
        },
        Some(Tokens::SHARED),
    )
    .await;
    let (start, task) = h.started_and_leased("auth-wf", "w1", "q").await;
    h.complete_workflow_task(&task, json!([complete_workflow(AVRO_NULL)])).await.ok(200);
    let described = h.describe("auth-wf").await;
    assert_eq!(described["status"], "completed");
    assert_eq!(h.history("auth-wf", start["run_id"].as_str().unwrap()).await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_precedence_is_auth_then_role_then_version_then_namespace() {
    let h = token_harness().await;
    let no_version_unknown_ns = |token: Option<&str>| {
        let request = h.bare(Method::GET, "/api/workflows").header("X-Namespace", "nowhere");
        match token {
            Some(t) => request.bearer_auth(t),
            None => request,
        }
    };
    send(no_version_unknown_ns(None)).await.err(401, "unauthorized");
    send(no_version_unknown_ns(Some("wrong"))).await.err(401, "unauthorized");
    send(no_version_unknown_ns(Some(Tokens::WORKER))).await.err(403, "forbidden");
    send(no_version_unknown_ns(Some(Tokens::OPERATOR)))
        .await
        .err(400, "missing_control_plane_version");
    send(no_version_unknown_ns(Some(Tokens::OPERATOR)).header(CONTROL_HEADER, "3"))
        .await
        .err(400, "unsupported_control_plane_version");
    send(no_version_unknown_ns(Some(Tokens::OPERATOR)).header(CONTROL_HEADER, "2"))
        .await
        .err(404, "namespace_not_found");

    let worker = |token: Option<&str>, version: Option<&str>| {
        let mut request = h
            .bare(Method::POST, "/api/worker/register")
            .header("X-Namespace", "nowhere")
            .json(&json!({"worker_id": "w", "task_queue": "q", "runtime": "rust"}));
        if let Some(v) = version {
            request = request.header(PROTOCOL_HEADER, v);
        }
        match token {
            Some(t) => request.bearer_auth(t),
            None => request,
        }
    };
    send(worker(None, Some("2.0"))).await.err(401, "unauthorized");
    send(worker(Some(Tokens::OPERATOR), Some("2.0"))).await.err(403, "forbidden");
    send(worker(Some(Tokens::WORKER), None)).await.err(400, "missing_protocol_version");
    send(worker(Some(Tokens::WORKER), Some("2.0")))
        .await
        .err(400, "unsupported_protocol_version");
    send(worker(Some(Tokens::WORKER), Some("1.20")))
        .await
        .err(404, "namespace_not_found");
}

// ============================================================================================
// Registration

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_heartbeat_and_deregister() {
    let h = Harness::start().await;
    let body = h
        .wpost(
            "/api/worker/register",
            json!({"worker_id": "py-worker-1", "task_queue": "orders", "runtime": "python",
                   "sdk_version": "durable-workflow-python/2.12.0", "capabilities": ["query_tasks"],
                   "capability_manifest": {"local_activities": {"supported": false}},
                   "max_concurrent_workflow_tasks": 10}),
        )
        .await
        .ok(201);
    assert_eq!(body["worker_id"], "py-worker-1");
    assert_eq!(body["registered"], true);
    assert_eq!(body["namespace"], "default");
    assert_eq!(body["task_queue"], "orders");
    assert_eq!(body["capabilities"], json!(["query_tasks"]));
    assert!(body["heartbeat_interval_seconds"].as_u64().is_some_and(|s| s > 0));

    // Re-registration is idempotent.
    h.register("py-worker-1", "orders").await;
    // Without a worker id the server generates one.
    let generated = h
        .wpost("/api/worker/register", json!({"task_queue": "orders", "runtime": "rust"}))
        .await
        .ok(201);
    assert!(generated["worker_id"].as_str().is_some_and(|id| !id.is_empty()));

    let beat = h
        .wpost(
            "/api/worker/heartbeat",
            json!({"worker_id": "py-worker-1", "task_slots": {"workflow_available": 3}}),
        )
        .await
        .ok(200);
    assert_eq!(beat["worker_id"], "py-worker-1");
    assert_eq!(beat["acknowledged"], true);
    let body = h
        .wpost("/api/worker/heartbeat", json!({"worker_id": "ghost"}))
        .await
        .err(404, "worker_not_registered");
    assert_eq!(body["worker_id"], "ghost");
    h.wpost("/api/worker/heartbeat", json!({})).await.err(422, "validation_failed");

    let gone = send(h.worker(Method::DELETE, "/api/worker/registrations/py-worker-1"))
        .await
        .ok(200);
    assert_eq!(gone["worker_id"], "py-worker-1");
    assert_eq!(gone["outcome"], "deregistered");
    assert_eq!(gone["recovered_workflow_task_count"], 0);
    send(h.worker(Method::DELETE, "/api/worker/registrations/py-worker-1"))
        .await
        .err(404, "worker_not_found");
    send(h.worker(Method::DELETE, "/api/worker/registrations/never-was"))
        .await
        .err(404, "worker_not_found");
    h.wpost("/api/worker/heartbeat", json!({"worker_id": "py-worker-1"}))
        .await
        .err(404, "worker_not_registered");
    h.poll_workflow_with(json!({"worker_id": "py-worker-1", "task_queue": "orders", "timeout_seconds": 0}))
        .await
        .err(412, "worker_not_registered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_validates_its_fields() {
    let h = Harness::start().await;
    let body = h
        .wpost("/api/worker/register", json!({"worker_id": "w", "runtime": "rust"}))
        .await
        .err(422, "validation_failed");
    assert!(body["errors"]["task_queue"].is_array(), "errors names the field: {body}");
    assert!(body["validation_errors"]["task_queue"].is_array());
    let body = h
        .wpost("/api/worker/register", json!({"worker_id": "w", "task_queue": "q"}))
        .await
        .err(422, "validation_failed");
    assert!(body["errors"]["runtime"].is_array());
    for bad in [
        json!({"worker_id": "w", "task_queue": 7, "runtime": "rust"}),
        json!({"worker_id": 7, "task_queue": "q", "runtime": "rust"}),
        json!({"worker_id": "w", "task_queue": "q", "runtime": "rust", "supported_workflow_types": "all"}),
        json!({"worker_id": "w", "task_queue": "q", "runtime": "rust", "supported_activity_types": [1, 2]}),
        json!({"worker_id": "w", "task_queue": "q", "runtime": "rust", "workflow_definition_fingerprints": "x"}),
        json!({"worker_id": "w", "task_queue": "q".repeat(256), "runtime": "rust"}),
    ] {
        let body = h.wpost("/api/worker/register", bad.clone()).await.err(422, "validation_failed");
        assert!(body["errors"].is_object(), "{bad} → {body}");
    }
    // Any non-empty runtime is accepted (the old server refused `rust`).
    h.wpost(
        "/api/worker/register",
        json!({"worker_id": "w", "task_queue": "q", "runtime": "rust"}),
    )
    .await
    .ok(201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_workflow_fingerprint_is_409() {
    let h = Harness::start().await;
    let register = |fingerprint: &str| {
        json!({"worker_id": "fp-worker", "task_queue": "q", "runtime": "python",
               "workflow_definition_fingerprints": {"order.process": fingerprint, "other": "x"}})
    };
    h.wpost("/api/worker/register", register("sha-1")).await.ok(201);
    h.wpost("/api/worker/register", register("sha-1")).await.ok(201);
    let body = h
        .wpost("/api/worker/register", register("sha-2"))
        .await
        .err(409, "workflow_definition_changed");
    assert_eq!(body["workflow_type"], "order.process");
    // Another worker id may register the new definition.
    h.wpost(
        "/api/worker/register",
        json!({"worker_id": "fp-worker-2", "task_queue": "q", "runtime": "python",
               "workflow_definition_fingerprints": {"order.process": "sha-2"}}),
    )
    .await
    .ok(201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deregister_releases_leased_workflow_tasks() {
    // Protocol 10 §3: deregistration releases the worker's leased workflow tasks and counts them.
    let h = Harness::start().await;
    let (_, task) = h.started_and_leased("dereg-wf", "leaving", "q").await;
    h.register("staying", "q").await;
    let gone = send(h.worker(Method::DELETE, "/api/worker/registrations/leaving")).await.ok(200);
    assert_eq!(gone["outcome"], "deregistered");
    assert_eq!(gone["recovered_workflow_task_count"], 1, "the leased task is released: {gone}");
    let again = h.poll_workflow("staying", "q", 2).await;
    assert_eq!(again["task_id"], task["task_id"], "the released task is offered at once");
}

// ============================================================================================
// Polls

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_preconditions() {
    let h = Harness::start().await;
    h.register("w1", "orders").await;
    for path in [
        "/api/worker/workflow-tasks/poll",
        "/api/worker/activity-tasks/poll",
        "/api/worker/query-tasks/poll",
    ] {
        let body = h
            .wpost(path, json!({"worker_id": "stranger", "task_queue": "orders", "timeout_seconds": 0}))
            .await
            .err(412, "worker_not_registered");
        assert_eq!(body["worker_id"], "stranger");
        let body = h
            .wpost(path, json!({"worker_id": "w1", "task_queue": "billing", "timeout_seconds": 0}))
            .await
            .err(409, "task_queue_mismatch");
        assert_eq!(body["registered_task_queue"], "orders");
        assert_eq!(body["requested_task_queue"], "billing");
        assert_eq!(body["protocol_version"], "1.20");
        let body = h.wpost(path, json!({"task_queue": "orders"})).await.err(422, "validation_failed");
        assert!(body["errors"]["worker_id"].is_array());
        h.wpost(path, json!({"worker_id": "w1"})).await.err(422, "validation_failed");
        h.wpost(path, json!({"worker_id": "w1", "task_queue": "orders", "timeout_seconds": "soon"}))
            .await
            .err(422, "validation_failed");
        h.wpost(path, json!({"worker_id": "w1", "task_queue": "orders", "timeout_seconds": -1}))
            .await
            .err(422, "validation_failed");
    }
    // Build id mismatch between registration and poll.
    h.wpost(
        "/api/worker/register",
        json!({"worker_id": "built", "task_queue": "orders", "runtime": "rust", "build_id": "b1"}),
    )
    .await
    .ok(201);
    h.poll_workflow_with(json!({"worker_id": "built", "task_queue": "orders", "build_id": "b2", "timeout_seconds": 0}))
        .await
        .err(409, "build_id_mismatch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_polls_answer_200_task_null() {
    let h = Harness::start().await;
    h.register("w1", "q").await;
    for path in [
        "/api/worker/workflow-tasks/poll",
        "/api/worker/activity-tasks/poll",
        "/api/worker/query-tasks/poll",
    ] {
        let began = Instant::now();
        let resp = h
            .wpost(
                path,
                json!({"worker_id": "w1", "task_queue": "q", "timeout_seconds": 0,
                                "poll_request_id": unique("probe")}),
            )
            .await;
        assert_eq!(resp.header(PROTOCOL_HEADER).as_deref(), Some("1.20"));
        let body = resp.ok(200);
        assert!(body.get("task").is_some_and(Value::is_null), "{path}: {body}");
        assert_eq!(body["protocol_version"], "1.20");
        assert!(body["server_capabilities"].is_object());
        assert!(began.elapsed() < Duration::from_secs(2), "{path}: a 0 s poll answers at once");
    }
    // A 1 s poll holds about a second, then answers empty.
    let began = Instant::now();
    assert!(h.poll_workflow("w1", "q", 1).await.is_null());
    let held = began.elapsed();
    assert!(held >= Duration::from_millis(900) && held < Duration::from_secs(5), "held {held:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_is_woken_by_a_start() {
    let h = std::sync::Arc::new(Harness::start().await);
    h.register("w1", "q").await;
    let poller = {
        let h = h.clone();
        tokio::spawn(async move {
            let began = Instant::now();
            let task = h.poll_workflow("w1", "q", 20).await;
            (task, began.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await; // let the poll start waiting
    h.start_workflow("woken", "q").await;
    let (task, waited) = poller.await.unwrap();
    assert_eq!(task["workflow_id"], "woken");
    assert!(waited < Duration::from_secs(5), "the start woke the poll ({waited:?})");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_request_id_replay_returns_the_same_lease() {
    let h = Harness::start().await;
    h.register("w1", "q").await;
    h.start_workflow("replayed", "q").await;
    let poll = json!({"worker_id": "w1", "task_queue": "q", "poll_request_id": "wf-poll-abc", "timeout_seconds": 5});
    let first = h.poll_workflow_with(poll.clone()).await.ok(200)["task"].clone();
    assert!(first.is_object());
    let second = h.poll_workflow_with(poll).await.ok(200)["task"].clone();
    assert_eq!(second["task_id"], first["task_id"]);
    assert_eq!(second["workflow_task_attempt"], first["workflow_task_attempt"]);
    assert_eq!(second["lease_owner"], "w1");
    assert_eq!(second["history_events"], first["history_events"]);
    // A different poll id finds nothing (one workflow task per run).
    assert!(h.poll_workflow("w1", "q", 0).await.is_null());
    // Once the lease is gone (task completed), the same id is a fresh poll, not a stale replay.
    h.start_workflow("replayed-2", "q").await;
    let other = h.next_workflow_task("w1", "q").await;
    h.complete_workflow_task(&other, json!([complete_workflow(AVRO_NULL)]))
        .await
        .ok(200);
    let stale = json!({"worker_id": "w1", "task_queue": "q", "poll_request_id": "wf-poll-other", "timeout_seconds": 0});
    h.start_workflow("replayed-3", "q").await;
    let fresh = h.poll_workflow_with(stale.clone()).await.ok(200)["task"].clone();
    assert_eq!(fresh["workflow_id"], "replayed-3");
    h.complete_workflow_task(&fresh, json!([complete_workflow(AVRO_NULL)]))
        .await
        .ok(200);
    assert!(
        h.poll_workflow_with(stale).await.ok(200)["task"].is_null(),
        "a completed task is not replayed"
    );

    // The same for activity polls.
    h.complete_workflow_task(&first, json!([schedule_activity("charge", "q")]))
        .await
        .ok(200);
    let poll = json!({"worker_id": "w1", "task_queue": "q", "poll_request_id": "activity-poll-abc", "timeout_seconds": 5});
    let first = h.wpost("/api/worker/activity-tasks/poll", poll.clone()).await.ok(200)["task"].clone();
    let second = h.wpost("/api/worker/activity-tasks/poll", poll).await.ok(200)["task"].clone();
    assert!(first.is_object());
    assert_eq!(second["task_id"], first["task_id"]);
    assert_eq!(second["activity_attempt_id"], first["activity_attempt_id"]);
    assert_eq!(second["attempt_number"], 1);
    assert!(h.poll_activity("w1", "q", 0).await.is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_task_poll_returns_null_even_with_work_queued() {
    let h = Harness::start().await;
    h.register("w1", "q").await;
    h.start_workflow("q-wf", "q").await;
    let body = h
        .wpost(
            "/api/worker/query-tasks/poll",
            json!({"worker_id": "w1", "task_queue": "q", "poll_request_id": "rust-query-poll-1", "timeout_seconds": 0}),
        )
        .await
        .ok(200);
    assert!(body["task"].is_null());
    // The workflow task is still there for the workflow poller.
    assert_eq!(h.next_workflow_task("w1", "q").await["workflow_id"], "q-wf");
}

// ============================================================================================
// The full workflow task cycle by hand

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_workflow_cycle_by_hand() {
    let h = Harness::start().await;
    h.register("w1", "orders").await;
    let input = "wwHioz3/VYAiNwwCDGhlbGxvAA==";
    let start = h
        .start_workflow_with(
            json!({"workflow_id": "order-42", "workflow_type": "order.process", "task_queue": "orders",
            "input": env(input), "execution_timeout_seconds": 3600, "run_timeout_seconds": 600,
            "business_key": "bk-42", "memo": {"note": "hi"}}),
        )
        .await
        .ok(201);
    assert_eq!(start["outcome"], "started_new");
    assert_eq!(start["workflow_id"], "order-42");
    assert_eq!(start["workflow_type"], "order.process");
    assert_eq!(start["payload_codec"], "avro");
    assert_eq!(start["control_plane"]["operation"], "start");
    let run_id = start["run_id"].as_str().expect("run_id").to_string();

    // 1. The first workflow task: StartAccepted, WorkflowStarted.
    let task = h.next_workflow_task("w1", "orders").await;
    assert_eq!(task["workflow_id"], "order-42");
    assert_eq!(task["run_id"], run_id.as_str());
    assert_eq!(task["workflow_type"], "order.process");
    assert_eq!(task["workflow_task_attempt"], 1);
    assert_eq!(task["lease_owner"], "w1");
    assert_eq!(task["payload_codec"], "avro");
    assert_eq!(task["arguments"], env(input));
    assert_eq!(task["total_history_events"], 2);
    assert!(task["next_history_page_token"].is_null());
    let events = task["history_events"].as_array().unwrap().clone();
    assert_eq!(event_types(&events), ["StartAccepted", "WorkflowStarted"]);
    assert_eq!(events[1]["payload"]["workflow_type"], "order.process");
    assert_eq!(events[1]["payload"]["workflow_run_id"], run_id.as_str());
    assert!(events.iter().all(|e| e["recorded_at"].is_string() && e["id"].is_string()));
    assert_hash_chain(&events);
    assert_eq!(h.describe("order-42").await["status"], "running");

    // 2. Schedule an activity.
    let done = h
        .complete_workflow_task(&task, json!([schedule_activity("charge", "orders")]))
        .await
        .ok(200);
    assert_eq!(done["outcome"], "completed");
    assert_eq!(done["recorded"], true);
    assert_eq!(done["retained"], false);
    assert_eq!(done["run_status"], "waiting");
    assert_eq!(done["created_task_ids"].as_array().unwrap().len(), 1);
    assert_eq!(h.describe("order-42").await["status"], "waiting");

    // 3. The activity task.
    let activity = h.next_activity_task("w1", "orders").await;
    assert_eq!(activity["task_id"], done["created_task_ids"][0]);
    assert_eq!(activity["activity_type"], "charge");
    assert_eq!(activity["attempt_number"], 1);
    assert_eq!(activity["payload_codec"], "avro");
    assert_eq!(activity["arguments"], env(EMPTY_ARGS));
    assert_eq!(activity["workflow_id"], "order-42");
    assert_eq!(activity["run_id"], run_id.as_str());
    assert_eq!(activity["lease_owner"], "w1");
    assert!(activity["activity_attempt_id"].is_string());
    assert!(activity["activity_execution_id"].is_string());
    let result = "wwHioz3/VYAiNwIU";
    let completed = h.complete_activity(&activity, result).await.ok(200);
    assert_eq!(completed["outcome"], "completed");
    assert_eq!(completed["recorded"], true);
    assert!(completed["next_task_id"].is_string());

    // 4. The next workflow task sees the result.
    let task = h.next_workflow_task("w1", "orders").await;
    assert_eq!(task["task_id"], completed["next_task_id"]);
    let events = task["history_events"].as_array().unwrap().clone();
    assert_eq!(
        event_types(&events),
        [
            "StartAccepted",
            "WorkflowStarted",
            "ActivityScheduled",
            "ActivityStarted",
            "ActivityCompleted"
        ]
    );
    assert_eq!(events[4]["payload"]["result"], result);
    assert_eq!(events[4]["payload"]["activity_execution_id"], activity["activity_execution_id"]);
    assert_hash_chain(&events);

    // 5. Complete the workflow.
    let output = "wwHioz3/VYAiNwQE";
    let done = h.complete_workflow_task(&task, json!([complete_workflow(output)])).await.ok(200);
    assert_eq!(done["run_status"], "completed");

    let described = h.describe("order-42").await;
    assert_eq!(described["status"], "completed");
    assert_eq!(described["status_bucket"], "completed");
    assert_eq!(described["closed_reason"], "completed");
    assert_eq!(described["is_terminal"], true);
    assert_eq!(described["output_envelope"], env(output));
    assert_eq!(described["input_envelope"], env(input));
    assert_eq!(described["run_id"], run_id.as_str());
    assert_eq!(described["workflow_type"], "order.process");
    assert_eq!(described["namespace"], "default");
    assert_eq!(described["task_queue"], "orders");
    assert_eq!(described["payload_codec"], "avro");
    assert_eq!(described["business_key"], "bk-42");
    assert_eq!(described["memo"], json!({"note": "hi"}));
    assert!(described["closed_at"].is_string());
    let by_run = h.cget(&format!("/api/workflows/order-42/runs/{run_id}")).await.ok(200);
    assert_eq!(by_run["status"], "completed");
    assert_eq!(by_run["is_current_run"], true);

    let history = h.history("order-42", &run_id).await;
    assert_eq!(
        event_types(&history),
        [
            "StartAccepted",
            "WorkflowStarted",
            "ActivityScheduled",
            "ActivityStarted",
            "ActivityCompleted",
            "WorkflowCompleted"
        ]
    );
    assert_eq!(history[5]["payload"]["output"], output);
    assert_eq!(history[5]["payload"]["payload_codec"], "avro");
    assert!(history.iter().all(|e| e["timestamp"].is_string()));

    // No further work anywhere.
    assert!(h.poll_workflow("w1", "orders", 0).await.is_null());
    assert!(h.poll_activity("w1", "orders", 0).await.is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_and_history_of_unknown_workflows_and_runs() {
    let h = Harness::start().await;
    h.start_workflow("known", "q").await;
    let body = h.cget("/api/workflows/unknown").await.err(404, "instance_not_found");
    assert_eq!(body["workflow_id"], "unknown");
    h.cget("/api/workflows/unknown/runs").await.err(404, "instance_not_found");
    let body = h.cget("/api/workflows/known/runs/01NOSUCHRUN").await.err(404, "run_not_found");
    assert_eq!(body["run_id"], "01NOSUCHRUN");
    h.cget("/api/workflows/known/runs/01NOSUCHRUN/history")
        .await
        .err(404, "run_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_workflow_is_described_with_its_failure() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("failing", "w1", "q").await;
    h.complete_workflow_task(
        &task,
        json!([{"type": "fail_workflow", "message": "boom", "exception_type": "ValueError",
                "exception_class": "builtins.ValueError", "non_retryable": true}]),
    )
    .await
    .ok(200);
    let described = h.describe("failing").await;
    assert_eq!(described["status"], "failed");
    assert_eq!(described["closed_reason"], "failed");
    assert_eq!(described["failure"]["message"], "boom");
    assert_eq!(described["failure"]["exception_type"], "ValueError");
    let history = h.history("failing", start["run_id"].as_str().unwrap()).await;
    let last = history.last().unwrap();
    assert_eq!(last["event_type"], "WorkflowFailed");
    assert_eq!(last["payload"]["message"], "boom");
    assert_eq!(last["payload"]["exception_class"], "builtins.ValueError");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_history_pages_with_page_size_1() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("paged", "w1", "q").await;
    h.complete_workflow_task(
        &task,
        json!([{"type": "record_side_effect", "result": env(AVRO_NULL)}, complete_workflow(AVRO_NULL)]),
    )
    .await
    .ok(200);
    let run_id = start["run_id"].as_str().unwrap();
    let full = h.history("paged", run_id).await;
    assert_eq!(
        event_types(&full),
        ["StartAccepted", "WorkflowStarted", "SideEffectRecorded", "WorkflowCompleted"]
    );

    let mut paged = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut path = format!("/api/workflows/paged/runs/{run_id}/history?page_size=1");
        if let Some(token) = &token {
            path.push_str(&format!("&next_page_token={}", urlencode(token)));
        }
        let page = h.cget(&path).await.ok(200);
        assert_eq!(page["workflow_id"], "paged");
        assert_eq!(page["run_id"], run_id);
        let events = page["events"].as_array().unwrap();
        assert_eq!(events.len(), 1, "page_size=1 pages hold one event: {page}");
        paged.extend(events.iter().cloned());
        match page["next_page_token"].as_str() {
            Some(next) => {
                assert_ne!(Some(next.to_string()), token, "a page token never repeats");
                token = Some(next.to_string());
            }
            None => break,
        }
        assert!(paged.len() <= full.len(), "paging does not terminate");
    }
    assert_eq!(paged, full);
    assert_hash_chain(&paged);

    let base = format!("/api/workflows/paged/runs/{run_id}/history");
    h.cget(&format!("{base}?next_page_token=%21%21%21"))
        .await
        .err(400, "invalid_page_token");
    for bad in ["0", "1001", "abc", "-1"] {
        let body = h.cget(&format!("{base}?page_size={bad}")).await.err(422, "validation_failed");
        assert!(body["errors"]["page_size"].is_array());
    }
    // wait_new_event on a closed run answers at once.
    let began = Instant::now();
    let page = h
        .cget(&format!("{base}?wait_new_event=true&next_page_token={}", urlencode("NA==")))
        .await
        .ok(200);
    assert!(page["events"].as_array().unwrap().is_empty());
    assert!(began.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_plane_history_paging() {
    let h = Harness::start().await;
    h.register("w1", "q").await;
    let start = h.start_workflow("paged-worker", "q").await;
    for n in 0..3 {
        h.cpost(
            &format!("/api/workflows/paged-worker/signal/s{n}"),
            json!({"input": env(EMPTY_ARGS)}),
        )
        .await
        .ok(202);
    }
    let task = h
        .poll_workflow_with(json!({"worker_id": "w1", "task_queue": "q", "timeout_seconds": 5, "history_page_size": 2}))
        .await
        .ok(200)["task"]
        .clone();
    assert_eq!(task["total_history_events"], 5);
    let first = task["history_events"].as_array().unwrap().clone();
    assert_eq!(first.len(), 2);
    let mut all = first;
    let mut token = task["next_history_page_token"].as_str().expect("more pages").to_string();
    let task_id = task["task_id"].as_str().unwrap();
    let path = format!("/api/worker/workflow-tasks/{task_id}/history");
    loop {
        let page = h
            .wpost(
                &path,
                json!({"lease_owner": "w1", "workflow_task_attempt": task["workflow_task_attempt"],
                                 "next_history_page_token": token, "history_page_size": 2}),
            )
            .await
            .ok(200);
        assert_eq!(page["task_id"], task_id);
        assert_eq!(page["total_history_events"], 5);
        all.extend(page["history_events"].as_array().unwrap().iter().cloned());
        match page["next_history_page_token"].as_str() {
            Some(next) if !next.is_empty() => {
                assert_ne!(next, token);
                token = next.to_string();
            }
            _ => break,
        }
        assert!(all.len() <= 5);
    }
    assert_eq!(
        event_types(&all),
        [
            "StartAccepted",
            "WorkflowStarted",
            "SignalReceived",
            "SignalReceived",
            "SignalReceived"
        ]
    );
    assert_hash_chain(&all);
    // "MA==" (base64 "0") asks for a cold replay from the start.
    let cold = h
        .wpost(
            &path,
            json!({"lease_owner": "w1", "workflow_task_attempt": 1, "next_history_page_token": "MA=="}),
        )
        .await
        .ok(200);
    assert_eq!(cold["history_events"].as_array().unwrap().len(), 5);
    assert!(cold["next_history_page_token"].is_null());
    // The control plane shows the same events.
    let control = h.history("paged-worker", start["run_id"].as_str().unwrap()).await;
    let hashes = |events: &[Value]| events.iter().map(|e| e["hash"].clone()).collect::<Vec<_>>();
    assert_eq!(hashes(&control), hashes(&all));

    // Errors.
    h.wpost(
        &path,
        json!({"lease_owner": "w1", "workflow_task_attempt": 1, "next_history_page_token": "!!"}),
    )
    .await
    .err(400, "invalid_page_token");
    h.wpost(
        &path,
        json!({"lease_owner": "w1", "workflow_task_attempt": 1, "next_history_page_token": "OTk5"}),
    )
    .await
    .err(400, "invalid_page_token");
    h.wpost(&path, json!({"lease_owner": "w1", "workflow_task_attempt": 1}))
        .await
        .err(422, "validation_failed");
    let body = h
        .wpost(
            &path,
            json!({"lease_owner": "w2", "workflow_task_attempt": 1, "next_history_page_token": "MA=="}),
        )
        .await
        .err(409, "lease_owner_mismatch");
    assert_eq!(body["lease_owner"], "w1");
    h.wpost(
        &path,
        json!({"lease_owner": "w1", "workflow_task_attempt": 2, "next_history_page_token": "MA=="}),
    )
    .await
    .err(409, "workflow_task_attempt_mismatch");
    h.wpost(
        "/api/worker/workflow-tasks/01NOSUCHTASK/history",
        json!({"lease_owner": "w1", "workflow_task_attempt": 1, "next_history_page_token": "MA=="}),
    )
    .await
    .err(404, "task_not_found");
}

// ============================================================================================
// Fencing

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workflow_task_fencing() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("fenced", "w1", "q").await;
    let run_id = start["run_id"].as_str().unwrap();
    let task_id = task["task_id"].as_str().unwrap();
    let complete = format!("/api/worker/workflow-tasks/{task_id}/complete");
    let commands = json!([{"type": "start_timer", "delay_seconds": 3600}]);

    let body = h
        .wpost(
            &complete,
            json!({"lease_owner": "intruder", "workflow_task_attempt": 1, "commands": commands}),
        )
        .await
        .err(409, "lease_owner_mismatch");
    assert_eq!(body["lease_owner"], "w1");
    assert_eq!(body["task_id"], task_id);
    assert_eq!(body["recorded"], false);
    assert_eq!(body["protocol_version"], "1.20");
    let body = h
        .wpost(
            &complete,
            json!({"lease_owner": "w1", "workflow_task_attempt": 2, "commands": commands}),
        )
        .await
        .err(409, "workflow_task_attempt_mismatch");
    assert_eq!(body["current_attempt"], 1);
    let body = h
        .wpost(
            "/api/worker/workflow-tasks/01NOSUCHTASK/complete",
            json!({"lease_owner": "w1", "workflow_task_attempt": 1, "commands": commands}),
        )
        .await
        .err(404, "task_not_found");
    assert_eq!(body["task_id"], "01NOSUCHTASK");
    // Refusals changed nothing.
    assert_eq!(h.history("fenced", run_id).await.len(), 2);

    // Workflow task heartbeat.
    let beat = h
        .wpost(
            &format!("/api/worker/workflow-tasks/{task_id}/heartbeat"),
            json!({"lease_owner": "w1", "workflow_task_attempt": 1}),
        )
        .await
        .ok(200);
    assert_eq!(beat["renewed"], true);
    assert_eq!(beat["lease_owner"], "w1");
    assert_eq!(beat["task_id"], task_id);
    assert_eq!(beat["workflow_task_attempt"], 1);
    h.wpost(
        &format!("/api/worker/workflow-tasks/{task_id}/heartbeat"),
        json!({"lease_owner": "intruder", "workflow_task_attempt": 1}),
    )
    .await
    .err(409, "lease_owner_mismatch");

    // The real completion, then an identical retry.
    let first = h
        .wpost(
            &complete,
            json!({"lease_owner": "w1", "workflow_task_attempt": 1, "commands": commands}),
        )
        .await
        .ok(200);
    assert_eq!(first["retained"], false);
    let retry = h
        .wpost(
            &complete,
            json!({"lease_owner": "w1", "workflow_task_attempt": 1, "commands": commands}),
        )
        .await
        .ok(200);
    assert_eq!(retry["retained"], true);
    assert_eq!(retry["outcome"], "completed");
    assert_eq!(retry["created_task_ids"], first["created_task_ids"]);
    let history = h.history("fenced", run_id).await;
    assert_eq!(count_events(&history, "TimerScheduled"), 1, "the retry recorded nothing");
    assert_eq!(history.len(), 3);

    // Other reports on the finished task.
    h.wpost(
        &format!("/api/worker/workflow-tasks/{task_id}/fail"),
        json!({"lease_owner": "w1", "workflow_task_attempt": 1, "failure": {"message": "late"}}),
    )
    .await
    .err(409, "task_not_leased");
    h.wpost(
        &format!("/api/worker/workflow-tasks/{task_id}/heartbeat"),
        json!({"lease_owner": "w1", "workflow_task_attempt": 1}),
    )
    .await
    .err(409, "task_not_leased");
    h.wpost(
        &complete,
        json!({"lease_owner": "w1", "workflow_task_attempt": 2, "commands": commands}),
    )
    .await
    .err(409, "task_not_leased");
    h.wpost(
        &complete,
        json!({"lease_owner": "intruder", "workflow_task_attempt": 1, "commands": commands}),
    )
    .await
    .err(409, "task_not_leased");
    assert_eq!(h.history("fenced", run_id).await.len(), 3);
}

/// Found by the libFuzzer campaign on the payload target: an Avro frame of a few bytes whose
/// array block claims half a billion items made the decoder reserve gigabytes, and an
/// allocation failure aborts the process; deep nesting overflowed the stack. A worker's memo
/// upsert is decoded by the server, so such a frame must be a 4xx, and the server must live on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_avro_frames_in_a_memo_upsert_are_refused_and_the_server_lives_on() {
    use base64::Engine;
    let h = Harness::start().await;
    h.register("w1", "memo").await;
    h.start_workflow_with(json!({"workflow_id": "hostile-memo", "workflow_type": "t", "task_queue": "memo"}))
        .await
        .ok(201);
    let header = base64::engine::general_purpose::STANDARD.decode("wwHioz3/VYAiNwA=").unwrap()[..10].to_vec();
    let frame = |body: &[u8]| {
        let mut bytes = header.clone();
        bytes.extend_from_slice(body);
        base64::engine::general_purpose::STANDARD.encode(bytes)
    };
    // A map (branch 7) with one entry whose value is an array (branch 6) claiming 2^29 - 1 items.
    let huge_block = frame(&[0x0e, 0x02, 0x02, b'k', 0x0c, 0xfe, 0xff, 0xff, 0xff, 0x03, 0x00, 0x00, 0x00]);
    let mut deep = vec![0x0e, 0x02, 0x02, b'k'];
    deep.extend(std::iter::repeat_n([0x0c, 0x02], 20_000).flatten());
    let deep = frame(&deep);
    for (what, blob) in [("a block of half a billion items", huge_block), ("arrays nested 20,000 deep", deep)] {
        let task = h.next_workflow_task("w1", "memo").await;
        let upsert = json!([{"type": "upsert_memo", "entries": env(&blob)}]);
        let refused = h.complete_workflow_task(&task, upsert).await;
        assert!(refused.status.is_client_error(), "{what}: {} {}", refused.status, refused.body);
        assert_error_shape(&refused.body);
        // Alive, and the run is unharmed: the task is offered again and completes normally.
        h.cget("/api/workflows/hostile-memo").await.ok(200);
        let failed = h
            .wpost(
                &format!("/api/worker/workflow-tasks/{}/fail", task["task_id"].as_str().unwrap()),
                json!({"lease_owner": "w1", "workflow_task_attempt": task["workflow_task_attempt"], "failure": {"message": "refused"}}),
            )
            .await;
        assert!(failed.status.is_success(), "{}", failed.body);
    }
    let task = h.next_workflow_task("w1", "memo").await;
    h.complete_workflow_task(&task, json!([complete_workflow("wwHioz3/VYAiNwA=")]))
        .await
        .ok(200);
    assert_eq!(h.describe("hostile-memo").await["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_task_fencing_and_duplicate_completion() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("act-fenced", "w1", "q").await;
    let run_id = start["run_id"].as_str().unwrap();
    h.complete_workflow_task(&task, json!([schedule_activity("charge", "q")]))
        .await
        .ok(200);
    let activity = h.next_activity_task("w1", "q").await;
    let task_id = activity["task_id"].as_str().unwrap();
    let attempt_id = activity["activity_attempt_id"].as_str().unwrap();
    let complete = format!("/api/worker/activity-tasks/{task_id}/complete");

    let body = h
        .wpost(
            &complete,
            json!({"activity_attempt_id": "01NOSUCHATTEMPT", "lease_owner": "w1", "result": env(AVRO_NULL)}),
        )
        .await
        .err(404, "attempt_not_found");
    assert_eq!(body["task_id"], task_id);
    assert_eq!(body["activity_attempt_id"], "01NOSUCHATTEMPT");
    let body = h
        .wpost(
            &complete,
            json!({"activity_attempt_id": attempt_id, "lease_owner": "intruder", "result": env(AVRO_NULL)}),
        )
        .await
        .err(409, "lease_owner_mismatch");
    assert_eq!(body["lease_owner"], "w1");
    h.wpost(
        "/api/worker/activity-tasks/01NOSUCHTASK/complete",
        json!({"activity_attempt_id": attempt_id, "lease_owner": "w1", "result": env(AVRO_NULL)}),
    )
    .await
    .err(404, "task_not_found");
    let body = h
        .wpost(&complete, json!({"lease_owner": "w1", "result": env(AVRO_NULL)}))
        .await
        .err(422, "validation_failed");
    assert!(body["errors"]["activity_attempt_id"].is_array());
    h.wpost(&complete, json!({"activity_attempt_id": attempt_id, "result": env(AVRO_NULL)}))
        .await
        .err(422, "validation_failed");
    h.wpost(
        &complete,
        json!({"activity_attempt_id": attempt_id, "lease_owner": "w1", "result": {"codec": "json", "blob": "1"}}),
    )
    .await
    .err(422, "unsupported_payload_codec");

    // Heartbeats while running.
    let beat = h.heartbeat_activity(&activity).await.ok(200);
    assert_eq!(beat["cancel_requested"], false);
    assert_eq!(beat["can_continue"], true);
    assert_eq!(beat["heartbeat_recorded"], true);
    assert!(beat["reason"].is_null());
    assert!(beat["lease_expires_at"].is_string());
    h.wpost(
        &format!("/api/worker/activity-tasks/{task_id}/heartbeat"),
        json!({"activity_attempt_id": "01NOSUCHATTEMPT", "lease_owner": "w1"}),
    )
    .await
    .err(404, "attempt_not_found");

    // Complete, then the same report again.
    let first = h.complete_activity(&activity, AVRO_NULL).await.ok(200);
    assert_eq!(first["retained"], false);
    let again = h.complete_activity(&activity, AVRO_NULL).await.ok(200);
    assert_eq!(again["retained"], true);
    assert_eq!(again["next_task_id"], first["next_task_id"]);
    let history = h.history("act-fenced", run_id).await;
    assert_eq!(count_events(&history, "ActivityCompleted"), 1);

    // A different report on the closed attempt is refused without effect.
    let body = h.fail_activity(&activity, "too late").await;
    body.err_one_of(409, &["attempt_closed", "activity_not_running", "task_not_leased"]);
    let history = h.history("act-fenced", run_id).await;
    assert_eq!(count_events(&history, "ActivityCompleted"), 1);
    assert_eq!(count_events(&history, "ActivityFailed"), 0);
    // Exactly one workflow task for the result.
    let next = h.next_workflow_task("w1", "q").await;
    assert_eq!(next["task_id"], first["next_task_id"]);
    assert!(h.poll_workflow("w1", "q", 0).await.is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_workflow_lease_is_redelivered_with_a_higher_attempt() {
    let h = Harness::with_config(
        ServerConfig {
            workflow_task_lease_ms: 300,
            ..ServerConfig::default()
        },
        None,
    )
    .await;
    let (start, task) = h.started_and_leased("expiring", "slow", "q").await;
    h.register("fast", "q").await;
    assert_eq!(task["workflow_task_attempt"], 1);
    let run_id = start["run_id"].as_str().unwrap();

    // The background clock takes the expired lease back without any poll.
    wait_for("the expired lease to be recovered", Duration::from_secs(10), || async {
        let described = h.describe("expiring").await;
        let open = described["open_tasks"].as_array().cloned().unwrap_or_default();
        open.iter()
            .any(|t| t["task_id"] == task["task_id"] && t["status"] == "ready")
            .then_some(())
    })
    .await;
    let commands = json!([complete_workflow(AVRO_NULL)]);
    h.complete_workflow_task(&task, commands.clone())
        .await
        .err_one_of(409, &["lease_expired", "task_not_leased"]);

    // Redelivery to another worker with attempt 2.
    let again = h.next_workflow_task("fast", "q").await;
    assert_eq!(again["task_id"], task["task_id"]);
    assert_eq!(again["workflow_task_attempt"], 2);
    assert_eq!(again["lease_owner"], "fast");
    // The old holder is fenced out.
    h.complete_workflow_task(&task, commands.clone())
        .await
        .err_one_of(409, &["lease_owner_mismatch", "lease_expired", "task_not_leased"]);
    assert_eq!(h.history("expiring", run_id).await.len(), 2, "no history from refused reports");

    // The new holder completes (retrying with a fresh lease if a slow machine let 300 ms pass).
    let mut current = again;
    let mut attempts = vec![2u64];
    loop {
        let resp = h.complete_workflow_task(&current, commands.clone()).await;
        if resp.status.as_u16() == 200 {
            break;
        }
        resp.err_one_of(409, &["lease_expired", "task_not_leased"]);
        assert!(attempts.len() < 5, "could not complete within a 300 ms lease five times");
        current = h.next_workflow_task("fast", "q").await;
        let attempt = current["workflow_task_attempt"].as_u64().unwrap();
        assert!(attempt > *attempts.last().unwrap());
        attempts.push(attempt);
    }
    assert_eq!(h.describe("expiring").await["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_workflow_task_is_offered_again() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("retry-task", "w1", "q").await;
    let task_id = task["task_id"].as_str().unwrap();
    let fail = format!("/api/worker/workflow-tasks/{task_id}/fail");
    h.wpost(&fail, json!({"workflow_task_attempt": 1, "failure": {"message": "x"}}))
        .await
        .err(422, "validation_failed");
    h.wpost(&fail, json!({"lease_owner": "w1", "failure": {"message": "x"}}))
        .await
        .err(422, "validation_failed");
    let refused = h
        .wpost(
            &fail,
            json!({"lease_owner": "w1", "workflow_task_attempt": 1, "failure": {"message": "x", "cause": "y"}}),
        )
        .await
        .err(422, "validation_failed");
    assert!(
        refused["errors"]["failure.cause"].is_array(),
        "the refusal names the field: {refused}"
    );
    assert!(h.describe("retry-task").await["workflow_task_failure"].is_null());
    let failed = h
        .wpost(
            &fail,
            json!({"lease_owner": "w1", "workflow_task_attempt": 1,
                   "failure": {"message": "replay blew up", "type": "NondeterminismError", "reason": "history_shape_mismatch",
                               "sequence": 3, "stack_trace": "at run()\nat replay()"}}),
        )
        .await
        .ok(200);
    assert_eq!(failed["outcome"], "failed");
    assert_eq!(failed["recorded"], true);
    // Every field of the report is kept and shown, on describe and beside the history.
    let described = h.describe("retry-task").await;
    let kept = &described["workflow_task_failure"];
    for (field, value) in [
        ("message", json!("replay blew up")),
        ("type", json!("NondeterminismError")),
        ("reason", json!("history_shape_mismatch")),
        ("sequence", json!(3)),
        ("stack_trace", json!("at run()\nat replay()")),
        ("workflow_task_attempt", json!(1)),
        ("lease_owner", json!("w1")),
        ("consecutive_failures", json!(1)),
        ("task_id", json!(task_id)),
    ] {
        assert_eq!(kept[field], value, "{field} in {kept}");
    }
    let workflow_task = described["open_tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["kind"] == "workflow")
        .cloned();
    assert_eq!(workflow_task.expect("the task is open")["last_error"], "replay blew up");
    let run_id = start["run_id"].as_str().unwrap();
    let history = h.cget(&format!("/api/workflows/retry-task/runs/{run_id}/history")).await.ok(200);
    assert_eq!(history["workflow_task_failure"], *kept);
    assert_eq!(described["workflow_task_failing"], true);
    let listed = h.cget("/api/workflows?query=retry-task").await.ok(200);
    let item = &listed["workflows"][0];
    assert_eq!(
        (&item["workflow_task_failing"], &item["workflow_task_consecutive_failures"]),
        (&json!(true), &json!(1)),
        "{item}"
    );
    assert_eq!(item["workflow_task_last_error"], "replay blew up");
    let again = h.next_workflow_task("w1", "q").await;
    assert_eq!(again["task_id"], task_id);
    assert_eq!(again["workflow_task_attempt"], 2);
    // The benign "waiting for history" failure closes the task without a retry or an event.
    let again_id = again["task_id"].as_str().unwrap();
    h.wpost(
        &format!("/api/worker/workflow-tasks/{again_id}/fail"),
        json!({"lease_owner": "w1", "workflow_task_attempt": 2,
               "failure": {"message": "Workflow task waiting for scheduled history.", "type": "WorkflowTaskWaitingForHistory"}}),
    )
    .await
    .ok(200);
    assert!(h.poll_workflow("w1", "q", 0).await.is_null());
    assert_eq!(h.history("retry-task", start["run_id"].as_str().unwrap()).await.len(), 2);
}

// ============================================================================================
// Bad input

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_non_object_json_is_400() {
    let h = Harness::start().await;
    for raw in ["{not json", "{\"workflow_type\": ", "[1, 2]", "\"text\"", "42", "null", "true"] {
        send(
            h.client(Method::POST, "/api/workflows")
                .header("Content-Type", "application/json")
                .body(raw),
        )
        .await
        .err(400, "invalid_json");
        let body = send(
            h.worker(Method::POST, "/api/worker/register")
                .header("Content-Type", "application/json")
                .body(raw),
        )
        .await
        .err(400, "invalid_json");
        assert_eq!(body["protocol_version"], "1.20");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_validation() {
    let h = Harness::start().await;
    let body = h.start_workflow_with(json!({})).await.err(422, "validation_failed");
    assert!(body["errors"]["workflow_type"].is_array());
    assert!(body["validation_errors"]["workflow_type"].is_array());
    let bad_bodies = [
        ("workflow_type", json!({"workflow_type": 5})),
        ("workflow_type", json!({"workflow_type": ""})),
        ("workflow_id", json!({"workflow_type": "t", "workflow_id": "has space"})),
        ("workflow_id", json!({"workflow_type": "t", "workflow_id": "a/b"})),
        ("workflow_id", json!({"workflow_type": "t", "workflow_id": "x".repeat(129)})),
        ("workflow_id", json!({"workflow_type": "t", "workflow_id": 12})),
        ("task_queue", json!({"workflow_type": "t", "task_queue": ["q"]})),
        ("memo", json!({"workflow_type": "t", "memo": "note"})),
        (
            "execution_timeout_seconds",
            json!({"workflow_type": "t", "execution_timeout_seconds": 0}),
        ),
        (
            "execution_timeout_seconds",
            json!({"workflow_type": "t", "execution_timeout_seconds": "soon"}),
        ),
        (
            "run_timeout_seconds",
            json!({"workflow_type": "t", "execution_timeout_seconds": 10, "run_timeout_seconds": 20}),
        ),
        (
            "duplicate_policy",
            json!({"workflow_type": "t", "duplicate_policy": "use_existing"}),
        ),
        ("input", json!({"workflow_type": "t", "input": 5})),
        ("input", json!({"workflow_type": "t", "input": {"codec": "avro"}})),
        ("request_id", json!({"workflow_type": "t", "request_id": "r-1"})),
        ("retry_policy", json!({"workflow_type": "t", "retry_policy": {"max_attempts": 3}})),
        ("idempotency_key", json!({"workflow_type": "t", "idempotency_key": "k"})),
        (
            "workflow_execution_timeout",
            json!({"workflow_type": "t", "workflow_execution_timeout": 10}),
        ),
        ("workflow_run_timeout", json!({"workflow_type": "t", "workflow_run_timeout": 10})),
        ("workflow_task_timeout", json!({"workflow_type": "t", "workflow_task_timeout": 10})),
    ];
    for (field, bad) in bad_bodies {
        let body = h.start_workflow_with(bad.clone()).await.err(422, "validation_failed");
        assert!(body["errors"][field].is_array(), "{bad} should name {field}: {body}");
    }
    h.start_workflow_with(json!({"workflow_type": "t", "input": {"codec": "json", "blob": "W10="}}))
        .await
        .err(422, "unsupported_payload_codec");
    // Nothing was started by any of them.
    let list = h.cget("/api/workflows").await.ok(200);
    assert_eq!(list["workflows"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_are_413() {
    let h = Harness::start().await;
    // A body over the 8 MiB request cap.
    let huge = format!("{{\"workflow_type\":\"t\",\"pad\":\"{}\"}}", "a".repeat(8 * 1024 * 1024 + 16));
    send(
        h.client(Method::POST, "/api/workflows")
            .header("Content-Type", "application/json")
            .body(huge),
    )
    .await
    .err(413, "payload_too_large");
    // A payload blob over the 2 MiB payload limit inside a body under the cap.
    let blob = "A".repeat(2 * 1024 * 1024 + 4);
    h.start_workflow_with(json!({"workflow_type": "t", "workflow_id": "big", "input": env(&blob)}))
        .await
        .err(413, "payload_too_large");
    h.cget("/api/workflows/big").await.err(404, "instance_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_command_validation() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("cmds", "w1", "q").await;
    let run_id = start["run_id"].as_str().unwrap();
    let task_id = task["task_id"].as_str().unwrap();
    let path = format!("/api/worker/workflow-tasks/{task_id}/complete");
    let post = |commands: Value| {
        let path = path.clone();
        let h = &h;
        async move {
            h.wpost(
                &path,
                json!({"lease_owner": "w1", "workflow_task_attempt": 1, "commands": commands}),
            )
            .await
        }
    };

    // 422: structurally invalid.
    for (field, commands) in [
        ("commands", json!([])),
        ("commands", json!(null)),
        ("commands", json!({"type": "complete_workflow"})),
        ("commands.0", json!(["complete_workflow"])),
        ("commands.0.type", json!([{"activity_type": "a"}])),
        ("commands.0.activity_type", json!([{"type": "schedule_activity"}])),
        ("commands.0.delay_seconds", json!([{"type": "start_timer"}])),
        ("commands.0.delay_seconds", json!([{"type": "start_timer", "delay_seconds": -1}])),
        (
            "commands.0.delay_seconds",
            json!([{"type": "start_timer", "delay_seconds": "soon"}]),
        ),
        (
            "commands.0.retry_policy",
            json!([{"type": "start_timer", "delay_seconds": 1, "retry_policy": {}}]),
        ),
        (
            "commands.0.start_to_close_timeout",
            json!([{"type": "start_timer", "delay_seconds": 1, "start_to_close_timeout": 5}]),
        ),
        (
            "commands.0.non_retryable",
            json!([{"type": "complete_workflow", "non_retryable": true}]),
        ),
        (
            "commands.0",
            json!([{"type": "schedule_activity", "activity_type": "a", "heartbeat_timeout": 10, "start_to_close_timeout": 5}]),
        ),
        ("commands.0.message", json!([{"type": "fail_workflow"}])),
    ] {
        let body = post(commands.clone()).await.err(422, "validation_failed");
        assert!(body["errors"][field].is_array(), "{commands} should name {field}: {body}");
    }
    let body = post(json!([{"type": "complete_workflow", "result": {"codec": "json", "blob": "bnVsbA=="}}]))
        .await
        .err(422, "unsupported_payload_codec");
    assert_eq!(body["task_id"], task_id);
    h.wpost(
        &path,
        json!({"workflow_task_attempt": 1, "commands": [complete_workflow(AVRO_NULL)]}),
    )
    .await
    .err(422, "validation_failed");
    h.wpost(
        &path,
        json!({"lease_owner": "w1", "workflow_task_attempt": "first", "commands": [complete_workflow(AVRO_NULL)]}),
    )
    .await
    .err(422, "validation_failed");
    h.wpost(
        &path,
        json!({"lease_owner": "w1", "workflow_task_attempt": 0, "commands": [complete_workflow(AVRO_NULL)]}),
    )
    .await
    .err(422, "validation_failed");

    // 409 invalid_commands: semantically invalid.
    for commands in [
        json!([{"type": "teleport"}]),
        json!([complete_workflow(AVRO_NULL), complete_workflow(AVRO_NULL)]),
        json!([complete_workflow(AVRO_NULL), {"type": "fail_workflow", "message": "x"}]),
        json!([complete_workflow(AVRO_NULL), {"type": "start_timer", "delay_seconds": 1}]),
        json!([{"type": "record_version_marker", "change_id": "c", "version": 5, "min_supported": 1, "max_supported": 2}]),
    ] {
        let body = post(commands.clone()).await.err(409, "invalid_commands");
        assert_eq!(body["recorded"], false, "{commands}: {body}");
    }
    // The lease survived every refusal and nothing was recorded.
    assert_eq!(h.history("cmds", run_id).await.len(), 2);
    post(json!([complete_workflow(AVRO_NULL)])).await.ok(200);
    assert_eq!(h.describe("cmds").await["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_validation() {
    let h = Harness::start().await;
    for query in [
        "status=bogus",
        "status=cancelled",
        "page_size=0",
        "page_size=201",
        "page_size=ten",
        "page_size=-3",
    ] {
        let body = h.cget(&format!("/api/workflows?{query}")).await.err(422, "validation_failed");
        assert!(body["errors"].is_object(), "{query}: {body}");
    }
    h.cget("/api/workflows?next_page_token=%21%21").await.err(400, "invalid_page_token");
    h.cget("/api/workflows?page_size=200").await.ok(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_routes_are_404_and_wrong_methods_405() {
    let h = Harness::start().await;
    send(h.bare(Method::GET, "/api/nope")).await.err(404, "not_found");
    send(h.bare(Method::GET, "/nope")).await.err(404, "not_found");
    send(h.bare(Method::POST, "/")).await.err(405, "method_not_allowed"); // `/` is the web UI's page
    send(h.client(Method::GET, "/api/workflows/a/b/c/d/e")).await.err(404, "not_found");
    send(h.worker(Method::POST, "/api/worker/nope").json(&json!({})))
        .await
        .err(404, "not_found");
    send(h.client(Method::GET, "/api/task-queues/nope/builds"))
        .await
        .err(404, "not_found");

    send(h.worker(Method::GET, "/api/worker/register"))
        .await
        .err(405, "method_not_allowed");
    send(h.worker(Method::PUT, "/api/worker/workflow-tasks/poll"))
        .await
        .err(405, "method_not_allowed");
    send(h.client(Method::DELETE, "/api/workflows"))
        .await
        .err(405, "method_not_allowed");
    send(h.client(Method::POST, "/api/workflows/x").json(&json!({})))
        .await
        .err(405, "method_not_allowed");
    send(h.client(Method::GET, "/api/workflows/x/cancel"))
        .await
        .err(405, "method_not_allowed");
    send(h.bare(Method::POST, "/api/health")).await.err(405, "method_not_allowed");
    send(h.bare(Method::POST, "/api/cluster/info")).await.err(405, "method_not_allowed");
}

// ============================================================================================
// Start, list, runs

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_duplicate_policies() {
    let h = Harness::start().await;
    let first = h.start_workflow("dup", "q").await;
    assert_eq!(first["outcome"], "started_new");
    assert_eq!(first["status"], "pending");
    assert_eq!(first["namespace"], "default");
    let run_id = first["run_id"].clone();

    let body = h
        .start_workflow_with(json!({"workflow_id": "dup", "workflow_type": "test.workflow", "task_queue": "q"}))
        .await
        .err(409, "instance_already_started");
    assert_eq!(body["control_plane"]["operation"], "start");
    h.start_workflow_with(json!({"workflow_id": "dup", "workflow_type": "test.workflow", "duplicate_policy": "fail"}))
        .await
        .err(409, "instance_already_started");
    let existing = h
        .start_workflow_with(json!({"workflow_id": "dup", "workflow_type": "test.workflow", "task_queue": "q",
                                    "duplicate_policy": "use-existing", "input": env(AVRO_NULL)}))
        .await
        .ok(200);
    assert_eq!(existing["outcome"], "returned_existing_active");
    assert_eq!(existing["run_id"], run_id);
    assert_eq!(existing["workflow_id"], "dup");
    assert_eq!(existing["workflow_type"], "test.workflow");
    // use-existing did not touch the run's input.
    assert_eq!(h.describe("dup").await["input_envelope"], env(EMPTY_ARGS));

    // Once closed, both policies refuse.
    h.cpost("/api/workflows/dup/terminate", json!({"reason": "done"})).await.ok(200);
    h.start_workflow_with(json!({"workflow_id": "dup", "workflow_type": "test.workflow", "duplicate_policy": "use-existing"}))
        .await
        .err(409, "instance_already_started");
    h.start_workflow_with(json!({"workflow_id": "dup", "workflow_type": "test.workflow"}))
        .await
        .err(409, "instance_already_started");
    let runs = h.cget("/api/workflows/dup/runs").await.ok(200);
    assert_eq!(runs["run_count"], 1);

    // Defaults: a generated id, the default queue, an empty argument list as input.
    let generated = h.start_workflow_with(json!({"workflow_type": "test.workflow"})).await.ok(201);
    let id = generated["workflow_id"].as_str().expect("generated workflow id");
    let described = h.describe(id).await;
    assert_eq!(described["task_queue"], "default");
    assert_eq!(described["input_envelope"], env(EMPTY_ARGS));
    // Bare-string input is taken as an Avro blob.
    let bare = h
        .start_workflow_with(json!({"workflow_type": "test.workflow", "workflow_id": "bare-input", "input": AVRO_NULL}))
        .await
        .ok(201);
    assert_eq!(bare["payload_codec"], "avro");
    assert_eq!(h.describe("bare-input").await["input_envelope"], env(AVRO_NULL));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_filters_and_pages() {
    let h = Harness::start().await;
    for id in ["list-a", "list-b", "list-c"] {
        h.start_workflow(id, "q").await;
    }
    h.start_workflow_with(json!({"workflow_id": "other-d", "workflow_type": "other.type", "business_key": "needle"}))
        .await
        .ok(201);
    h.cpost("/api/workflows/list-b/terminate", json!({})).await.ok(200);

    let all = h.cget("/api/workflows").await.ok(200);
    assert_eq!(all["workflow_count"], 4);
    assert!(all["next_page_token"].is_null());
    let row = all["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["workflow_id"] == "list-a")
        .unwrap()
        .clone();
    for key in [
        "run_id",
        "workflow_type",
        "status",
        "status_bucket",
        "task_queue",
        "started_at",
        "namespace",
        "payload_codec",
    ] {
        assert!(!row[key].is_null(), "list row lacks {key}: {row}");
    }
    assert_eq!(row["is_terminal"], false);

    let ids = |page: &Value| -> Vec<String> {
        page["workflows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["workflow_id"].as_str().unwrap().to_string())
            .collect()
    };
    let running = h.cget("/api/workflows?status=running").await.ok(200);
    let mut running_ids = ids(&running);
    running_ids.sort();
    assert_eq!(running_ids, ["list-a", "list-c", "other-d"]);
    let failed = h.cget("/api/workflows?status=failed").await.ok(200);
    assert_eq!(ids(&failed), ["list-b"], "terminated counts in the failed bucket");
    assert_eq!(failed["workflows"][0]["status"], "terminated");
    assert_eq!(ids(&h.cget("/api/workflows?status=completed").await.ok(200)), Vec::<String>::new());
    assert_eq!(ids(&h.cget("/api/workflows?workflow_type=other.type").await.ok(200)), ["other-d"]);
    assert_eq!(ids(&h.cget("/api/workflows?query=needle").await.ok(200)), ["other-d"]);
    let mut matched = ids(&h.cget("/api/workflows?query=list-").await.ok(200));
    matched.sort();
    assert_eq!(matched, ["list-a", "list-b", "list-c"]);

    // Paging.
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut path = "/api/workflows?page_size=3".to_string();
        if let Some(token) = &token {
            path.push_str(&format!("&next_page_token={}", urlencode(token)));
        }
        let page = h.cget(&path).await.ok(200);
        pages += 1;
        seen.extend(ids(&page));
        match page["next_page_token"].as_str() {
            Some(next) => token = Some(next.to_string()),
            None => break,
        }
        assert!(pages < 10);
    }
    assert_eq!(pages, 2);
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 4, "pages neither repeat nor skip: {seen:?}");
    // Newest first.
    let started: Vec<String> = all["workflows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["started_at"].as_str().unwrap().to_string())
        .collect();
    assert!(started.windows(2).all(|w| w[0] >= w[1]), "not newest first: {started:?}");

    let runs = h.cget("/api/workflows/list-a/runs").await.ok(200);
    assert_eq!(runs["workflow_id"], "list-a");
    assert_eq!(runs["run_count"], 1);
    assert_eq!(runs["runs"][0]["run_number"], 1);
    assert_eq!(runs["runs"][0]["run_id"], row["run_id"]);
    assert_eq!(runs["runs"][0]["workflow_type"], "test.workflow");

    // Bucket counts under the same filters (the bucket filter itself is ignored).
    let counts = h.cget("/api/workflow-counts").await.ok(200);
    assert_eq!(
        (&counts["running"], &counts["completed"], &counts["failed"], &counts["total"]),
        (&json!(3), &json!(0), &json!(1), &json!(4))
    );
    let counts = h.cget("/api/workflow-counts?query=list-&status=completed").await.ok(200);
    assert_eq!((&counts["running"], &counts["failed"]), (&json!(2), &json!(1)));
    assert_eq!(counts["exact"], true, "within the bound a filtered count is exact");
    // The unfiltered counts above are kept in the transactions; they match a full count.
    let check = h.cget("/api/system/run-counts").await.ok(200);
    assert_eq!((&check["exact"], &check["drift"]), (&json!(true), &json!([])), "{check}");
    let rebuilt = h.cpost("/api/system/run-counts/rebuild", json!({})).await.ok(200);
    assert_eq!(rebuilt["keys_rebuilt"], 0);
    h.cget("/api/workflow-counts?query=Nope%20%3D%201")
        .await
        .err(422, "unknown_search_attribute");
    assert_eq!(ids(&h.cget("/api/workflows?task_queue=q&query=list-b").await.ok(200)), ["list-b"]);
    assert_eq!(ids(&h.cget("/api/workflows?task_queue=nope").await.ok(200)), Vec::<String>::new());
    // Old offset tokens still page; garbage is a 400.
    let offset_token = urlencode("Mw==");
    assert_eq!(
        ids(&h.cget(&format!("/api/workflows?next_page_token={offset_token}")).await.ok(200)).len(),
        1
    );
    h.cget("/api/workflows?next_page_token=bm9wZTo=")
        .await
        .err(400, "invalid_page_token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integrity_reports_the_verified_chain_of_a_run() {
    let h = Harness::start().await;
    let started = h.start_workflow("chain-1", "q").await;
    let run_id = started["run_id"].as_str().unwrap();
    let report = h.cget(&format!("/api/workflows/chain-1/runs/{run_id}/integrity")).await.ok(200);
    assert_eq!(report["chain_verified"], true, "{report}");
    let described = h.cget("/api/workflows/chain-1").await.ok(200);
    assert_eq!(report["event_count"], described["history_event_count"]);
    assert_eq!(report["head_hash"], described["history_head_hash"]);
    assert!(report["broken_at_sequence"].is_null());
    assert_eq!(report["head_hash"].as_str().unwrap().len(), 64);
    h.cget("/api/workflows/chain-1/runs/nope/integrity").await.err(404, "run_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_web_ui_is_served_at_the_root_with_a_strict_policy() {
    let h = Harness::start().await;
    for (path, kind, marker) in [
        ("/", "text/html", "<main"),
        ("/ui/app.js", "text/javascript", "decodeAvroValue"),
        ("/ui/app.css", "text/css", "--accent"),
        ("/ui/dom.js", "text/javascript", "export function h("),
        ("/ui/timeline.js", "text/javascript", "export function timelineModel("),
        ("/ui/server.js", "text/javascript", "export function parseMetrics("),
        ("/ui/access.js", "text/javascript", "export async function accessPage("),
    ] {
        let resp = h.http.get(format!("{}{path}", h.base)).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let header = |name: &str| resp.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        assert!(header("content-type").starts_with(kind), "{path}");
        assert!(header("content-security-policy").contains("script-src 'self'"), "{path}");
        assert_eq!(header("x-content-type-options"), "nosniff");
        assert!(resp.text().await.unwrap().contains(marker), "{path}");
    }
    // The API keeps its JSON 404 beside the page.
    send(h.bare(Method::GET, "/ui/nope.js")).await.err(404, "not_found");
}

// ============================================================================================
// Signals

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_plain_and_run_targeted_with_encoded_ids() {
    let h = Harness::start().await;
    h.register("w1", "q").await;
    let start = h.start_workflow("order:42", "q").await;
    let run_id = start["run_id"].as_str().unwrap().to_string();

    // Python percent-encodes every path segment of the signal route.
    let plain = format!("/api/workflows/{}/signal/{}", urlencode("order:42"), urlencode("my signal"));
    assert!(plain.contains("order%3A42") && plain.contains("my%20signal"));
    let receipt = h.cpost(&plain, json!({"input": env(EMPTY_ARGS)})).await.ok(202);
    assert_eq!(receipt["workflow_id"], "order:42");
    assert_eq!(receipt["run_id"], run_id.as_str());
    assert_eq!(receipt["signal_name"], "my signal");
    assert_eq!(receipt["outcome"], "signal_received");
    assert_eq!(receipt["command_status"], "accepted");
    assert!(receipt["command_id"].is_string());
    assert_eq!(receipt["control_plane"]["operation"], "signal");

    let targeted = format!(
        "/api/workflows/{}/runs/{}/signal/{}",
        urlencode("order:42"),
        urlencode(&run_id),
        urlencode("approve")
    );
    let receipt = h
        .cpost(&targeted, json!({"input": env(AVRO_NULL), "request_id": "sdk-python-signal-1"}))
        .await
        .ok(202);
    assert_eq!(receipt["run_id"], run_id.as_str());
    assert_eq!(receipt["signal_name"], "approve");
    assert_eq!(receipt["request_id"], "sdk-python-signal-1");
    // Without input (Python omits it for no arguments).
    h.cpost("/api/workflows/order:42/signal/bare", json!({})).await.ok(202);
    send(h.client(Method::POST, "/api/workflows/order:42/signal/no-body")).await.ok(202);

    let history = h.history("order:42", &run_id).await;
    let signals: Vec<&Value> = history.iter().filter(|e| e["event_type"] == "SignalReceived").collect();
    assert_eq!(signals.len(), 4);
    assert_eq!(signals[0]["payload"]["signal_name"], "my signal");
    assert_eq!(signals[0]["payload"]["arguments"], env(EMPTY_ARGS));
    assert_eq!(signals[0]["payload"]["workflow_instance_id"], "order:42");
    assert_eq!(signals[1]["payload"]["signal_name"], "approve");
    assert_eq!(signals[1]["payload"]["arguments"], env(AVRO_NULL));
    assert_eq!(signals[2]["payload"]["arguments"], env(EMPTY_ARGS));

    // The workflow task carries the first signal as its resume context.
    let task = h.next_workflow_task("w1", "q").await;
    assert_eq!(task["resume_source_kind"], "workflow_signal");
    assert_eq!(task["signal_name"], "my signal");
    assert_eq!(event_types(task["history_events"].as_array().unwrap()).len(), 6);

    // A run that is not the current one.
    h.cpost(
        "/api/workflows/order:42/runs/01NOTTHERUN/signal/approve",
        json!({"input": env(EMPTY_ARGS)}),
    )
    .await
    .err_one_of(409, &["run_not_current"]);
    // Signal names are bounded.
    let long = "s".repeat(256);
    h.cpost(&format!("/api/workflows/order:42/signal/{long}"), json!({}))
        .await
        .err(422, "validation_failed");
    h.cpost(
        "/api/workflows/order:42/signal/x",
        json!({"input": {"codec": "json", "blob": "W10="}}),
    )
    .await
    .err(422, "unsupported_payload_codec");
    h.cpost("/api/workflows/order:42/signal/x", json!({"request_id": 5}))
        .await
        .err(422, "validation_failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_request_id_idempotency() {
    let h = Harness::start().await;
    let start = h.start_workflow("keyed", "q").await;
    let run_id = start["run_id"].as_str().unwrap();
    let body = json!({"input": env(EMPTY_ARGS), "request_id": "sdk-rust-signal-1"});
    let first = h.cpost("/api/workflows/keyed/signal/approve", body.clone()).await.ok(202);
    assert_eq!(first["outcome"], "signal_received");
    assert!(first.get("retained").is_none_or(|r| r == false));
    let again = h.cpost("/api/workflows/keyed/signal/approve", body.clone()).await.ok(202);
    assert_eq!(again["retained"], true);
    assert_eq!(again["run_id"], first["run_id"]);
    assert_eq!(again["signal_name"], "approve");
    assert_eq!(again["command_sequence"], first["command_sequence"]);
    assert_eq!(count_events(&h.history("keyed", run_id).await, "SignalReceived"), 1);

    // Same key, different intent.
    let body = h
        .cpost(
            "/api/workflows/keyed/signal/approve",
            json!({"input": env(AVRO_NULL), "request_id": "sdk-rust-signal-1"}),
        )
        .await
        .err(409, "request_id_conflict");
    assert_eq!(body["retained_command_type"], "signal");
    assert_eq!(body["control_plane"]["operation"], "signal");
    h.cpost(
        "/api/workflows/keyed/signal/reject",
        json!({"input": env(EMPTY_ARGS), "request_id": "sdk-rust-signal-1"}),
    )
    .await
    .err(409, "request_id_conflict");
    h.cpost(
        &format!("/api/workflows/keyed/runs/{run_id}/signal/approve"),
        json!({"input": env(EMPTY_ARGS), "request_id": "sdk-rust-signal-1"}),
    )
    .await
    .err(409, "request_id_conflict");
    assert_eq!(count_events(&h.history("keyed", run_id).await, "SignalReceived"), 1);
    // Another key is another signal.
    h.cpost(
        "/api/workflows/keyed/signal/approve",
        json!({"input": env(EMPTY_ARGS), "request_id": "sdk-rust-signal-2"}),
    )
    .await
    .ok(202);
    assert_eq!(count_events(&h.history("keyed", run_id).await, "SignalReceived"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_signal_receipt_is_replayed_verbatim() {
    // 50-server-semantics: "same key + same intent → return the stored receipt with retained:true".
    // The first answer and its replay must therefore describe the same command.
    let h = Harness::start().await;
    h.start_workflow("verbatim", "q").await;
    let body = json!({"input": env(EMPTY_ARGS), "request_id": "sdk-python-signal-abc"});
    let first = h.cpost("/api/workflows/verbatim/signal/go", body.clone()).await.ok(202);
    let again = h.cpost("/api/workflows/verbatim/signal/go", body).await.ok(202);
    assert_eq!(again["retained"], true);
    assert!(
        first["command_id"].is_string(),
        "the first keyed receipt names its command: {first}"
    );
    assert_eq!(again["command_id"], first["command_id"], "first: {first}\nreplay: {again}");
    assert_eq!(again["signal_id"], first["signal_id"], "first: {first}\nreplay: {again}");
    assert_eq!(again["command_sequence"], first["command_sequence"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signal_errors() {
    let h = Harness::start().await;
    let body = h
        .cpost("/api/workflows/ghost/signal/approve", json!({"input": env(EMPTY_ARGS)}))
        .await
        .err(404, "instance_not_found");
    assert_eq!(body["workflow_id"], "ghost");
    h.cpost(
        "/api/workflows/ghost/signal/approve",
        json!({"input": env(EMPTY_ARGS), "request_id": "r"}),
    )
    .await
    .err(404, "instance_not_found");

    let (_, task) = h.started_and_leased("closed-sig", "w1", "q").await;
    h.complete_workflow_task(&task, json!([complete_workflow(AVRO_NULL)])).await.ok(200);
    for body in [
        json!({"input": env(EMPTY_ARGS)}),
        json!({"input": env(EMPTY_ARGS), "request_id": "late-1"}),
    ] {
        let refused = h
            .cpost("/api/workflows/closed-sig/signal/approve", body)
            .await
            .err(409, "run_not_active");
        assert_eq!(refused["control_plane"]["operation"], "signal", "{refused}");
        assert_eq!(refused["workflow_id"], "closed-sig");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_avro_payloads_are_refused_before_anything_is_recorded() {
    let h = Harness::start().await;
    let start = h.start_workflow("poison", "q").await;
    let run_id = start["run_id"].as_str().unwrap();
    let before = h.history("poison", run_id).await;
    // Not base64; base64 without the single-object frame; the marker without the DW fingerprint.
    for blob in ["!!!not-base64!!!", "AAAA", "wwEAAAAAAAAAAAA="] {
        let refused = h
            .cpost("/api/workflows/poison/signal/approve", json!({"input": env(blob)}))
            .await
            .err(422, "validation_failed");
        assert!(refused["errors"].get("input").is_some(), "{refused}");
        h.cpost(
            "/api/workflows",
            json!({"workflow_type": "t", "workflow_id": "p2", "input": env(blob)}),
        )
        .await
        .err(422, "validation_failed");
    }
    assert_eq!(h.history("poison", run_id).await, before, "nothing recorded");
    h.cpost("/api/workflows/poison/signal/approve", json!({"input": env(EMPTY_ARGS)}))
        .await
        .ok(202);
}

// ============================================================================================
// Cancel and terminate

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_closes_the_run_and_stops_its_activity() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("to-cancel", "w1", "q").await;
    let run_id = start["run_id"].as_str().unwrap();
    h.complete_workflow_task(&task, json!([schedule_activity("slow", "q")]))
        .await
        .ok(200);
    let activity = h.next_activity_task("w1", "q").await;

    let cancelled = h
        .cpost("/api/workflows/to-cancel/cancel", json!({"reason": "user asked"}))
        .await
        .ok(200);
    assert_eq!(cancelled["outcome"], "cancelled");
    assert_eq!(cancelled["workflow_id"], "to-cancel");
    assert_eq!(cancelled["run_id"], run_id);
    assert_eq!(cancelled["command_status"], "accepted");
    assert!(cancelled["command_id"].is_string());
    assert_eq!(cancelled["control_plane"]["operation"], "cancel");

    let history = h.history("to-cancel", run_id).await;
    let types = event_types(&history);
    assert_eq!(types[types.len() - 2..], ["CancelRequested", "WorkflowCancelled"]);
    let request = &history[history.len() - 2];
    assert_eq!(request["payload"]["reason"], "user asked");
    assert_eq!(request["payload"]["command_type"], "cancel");
    assert_eq!(history.last().unwrap()["payload"]["closed_reason"], "cancelled");
    let described = h.describe("to-cancel").await;
    assert_eq!(described["status"], "cancelled");
    assert_eq!(described["closed_reason"], "cancelled");
    assert_eq!(described["is_terminal"], true);

    let body = h
        .cpost("/api/workflows/to-cancel/cancel", json!({}))
        .await
        .err(409, "run_not_active");
    assert_eq!(body["control_plane"]["operation"], "cancel");
    h.cpost("/api/workflows/to-cancel/terminate", json!({}))
        .await
        .err(409, "run_not_active");

    // The leased activity learns about it.
    let beat = h.heartbeat_activity(&activity).await.ok(200);
    assert_eq!(beat["cancel_requested"], true);
    assert_eq!(beat["can_continue"], false);
    assert_eq!(beat["reason"], "run_cancelled");
    let body = h.complete_activity(&activity, AVRO_NULL).await.err(409, "run_cancelled");
    assert_eq!(body["outcome"], "ignored");
    assert_eq!(body["can_continue"], false);
    assert_eq!(body["activity_attempt_id"], activity["activity_attempt_id"]);
    h.fail_activity(&activity, "gave up").await.err(409, "run_cancelled");

    // Nothing new in history, no work offered.
    assert_eq!(h.history("to-cancel", run_id).await.len(), history.len());
    assert!(h.poll_workflow("w1", "q", 0).await.is_null());
    assert!(h.poll_activity("w1", "q", 0).await.is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_closes_the_run_and_fences_its_workflow_task() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("to-terminate", "w1", "q").await;
    let run_id = start["run_id"].as_str().unwrap();
    let terminated = h
        .cpost(
            &format!("/api/workflows/to-terminate/runs/{run_id}/terminate"),
            json!({"reason": "ops"}),
        )
        .await
        .ok(200);
    assert_eq!(terminated["outcome"], "terminated");
    assert_eq!(terminated["control_plane"]["operation"], "terminate");
    let history = h.history("to-terminate", run_id).await;
    assert_eq!(
        event_types(&history),
        ["StartAccepted", "WorkflowStarted", "TerminateRequested", "WorkflowTerminated"]
    );
    assert_eq!(history[3]["payload"]["reason"], "ops");
    let described = h.describe("to-terminate").await;
    assert_eq!(described["status"], "terminated");
    assert_eq!(described["closed_reason"], "terminated");

    // The in-flight workflow task is fenced out.
    let body = h
        .complete_workflow_task(&task, json!([complete_workflow(AVRO_NULL)]))
        .await
        .err(409, "run_closed");
    assert_eq!(body["stop_reason"], "run_terminated");
    assert_eq!(body["can_continue"], false);
    assert_eq!(h.history("to-terminate", run_id).await.len(), 4);

    h.cpost("/api/workflows/to-terminate/terminate", json!({}))
        .await
        .err(409, "run_not_active");
    h.cpost("/api/workflows/ghost/terminate", json!({}))
        .await
        .err(404, "instance_not_found");
    h.cpost("/api/workflows/ghost/cancel", json!({}))
        .await
        .err(404, "instance_not_found");
    h.cpost("/api/workflows/to-terminate/cancel", json!({"reason": 5}))
        .await
        .err(422, "validation_failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_request_id_is_idempotent() {
    let h = Harness::start().await;
    let start = h.start_workflow("keyed-cancel", "q").await;
    let run_id = start["run_id"].as_str().unwrap();
    let body = json!({"reason": "stop", "request_id": "cancel-1"});
    let first = h.cpost("/api/workflows/keyed-cancel/cancel", body.clone()).await.ok(200);
    assert_eq!(first["outcome"], "cancelled");
    let again = h.cpost("/api/workflows/keyed-cancel/cancel", body).await.ok(200);
    assert_eq!(again["retained"], true);
    assert_eq!(again["command_id"], first["command_id"]);
    assert_eq!(count_events(&h.history("keyed-cancel", run_id).await, "WorkflowCancelled"), 1);
    let body = h
        .cpost(
            "/api/workflows/keyed-cancel/cancel",
            json!({"reason": "other", "request_id": "cancel-1"}),
        )
        .await
        .err(409, "request_id_conflict");
    assert_eq!(body["retained_command_type"], "cancel");
    h.cpost("/api/workflows/keyed-cancel/cancel", json!({"request_id": "cancel-2"}))
        .await
        .err(409, "run_not_active");
}

// ============================================================================================
// Timers and activity retries

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timer_fires_from_the_background_clock() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("timed", "w1", "q").await;
    let done = h
        .complete_workflow_task(&task, json!([{"type": "start_timer", "delay_seconds": 1}]))
        .await
        .ok(200);
    assert_eq!(done["run_status"], "waiting");
    let began = Instant::now();
    let next = h.next_workflow_task("w1", "q").await;
    let waited = began.elapsed();
    assert!(waited < Duration::from_secs(4), "timer task arrived after {waited:?}");
    let events = next["history_events"].as_array().unwrap().clone();
    assert_eq!(
        event_types(&events),
        ["StartAccepted", "WorkflowStarted", "TimerScheduled", "TimerFired"]
    );
    assert_eq!(events[3]["payload"]["timer_id"], events[2]["payload"]["timer_id"]);
    assert_eq!(events[2]["payload"]["delay_seconds"], 1);
    h.complete_workflow_task(&next, json!([complete_workflow(AVRO_NULL)])).await.ok(200);
    assert_eq!(h.history("timed", start["run_id"].as_str().unwrap()).await.len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_retry_then_final_failure() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("retrying", "w1", "q").await;
    let run_id = start["run_id"].as_str().unwrap();
    let mut command = schedule_activity("flaky", "q");
    command["retry_policy"] = json!({"max_attempts": 2, "backoff_seconds": [0], "non_retryable_error_types": []});
    h.complete_workflow_task(&task, json!([command])).await.ok(200);

    let first = h.next_activity_task("w1", "q").await;
    assert_eq!(first["attempt_number"], 1);
    assert_eq!(first["retry_policy"]["max_attempts"], 2);
    let failed = h.fail_activity(&first, "attempt 1 broke").await.ok(200);
    assert_eq!(failed["outcome"], "failed");
    assert_eq!(failed["recorded"], true);

    let second = h.next_activity_task("w1", "q").await;
    assert_eq!(second["attempt_number"], 2);
    assert_eq!(second["activity_execution_id"], first["activity_execution_id"]);
    assert_ne!(second["activity_attempt_id"], first["activity_attempt_id"]);
    assert_ne!(second["task_id"], first["task_id"]);
    assert_eq!(failed["next_task_id"], second["task_id"]);
    // The superseded attempt is fenced out.
    h.complete_activity(&first, AVRO_NULL)
        .await
        .err_one_of(409, &["attempt_closed", "activity_not_running", "task_mismatch"]);

    let last = h.fail_activity(&second, "attempt 2 broke").await.ok(200);
    assert!(
        last["next_task_id"].is_string(),
        "the final failure creates a workflow task: {last}"
    );
    assert!(h.poll_activity("w1", "q", 0).await.is_null(), "no third attempt");

    let history = h.history("retrying", run_id).await;
    assert_eq!(
        event_types(&history),
        [
            "StartAccepted",
            "WorkflowStarted",
            "ActivityScheduled",
            "ActivityStarted",
            "ActivityRetryScheduled",
            "ActivityStarted",
            "ActivityFailed"
        ]
    );
    assert_eq!(history[4]["payload"]["message"], "attempt 1 broke");
    assert_eq!(history[6]["payload"]["message"], "attempt 2 broke");
    assert_eq!(history[6]["payload"]["attempt_number"], 2);

    let next = h.next_workflow_task("w1", "q").await;
    assert_eq!(next["task_id"], last["next_task_id"]);
    assert_eq!(
        next["history_events"].as_array().unwrap().last().unwrap()["event_type"],
        "ActivityFailed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_retryable_activity_failure_is_final_at_once() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("no-retry", "w1", "q").await;
    let mut command = schedule_activity("strict", "q");
    command["retry_policy"] = json!({"max_attempts": 5, "backoff_seconds": [0], "non_retryable_error_types": ["BadInput"]});
    h.complete_workflow_task(&task, json!([command])).await.ok(200);
    let activity = h.next_activity_task("w1", "q").await;
    h.wpost(
        &format!("/api/worker/activity-tasks/{}/fail", activity["task_id"].as_str().unwrap()),
        json!({"activity_attempt_id": activity["activity_attempt_id"], "lease_owner": "w1",
               "failure": {"message": "bad", "type": "BadInput", "details": env(AVRO_NULL)}}),
    )
    .await
    .ok(200);
    let history = h.history("no-retry", start["run_id"].as_str().unwrap()).await;
    assert_eq!(count_events(&history, "ActivityRetryScheduled"), 0);
    assert_eq!(history.last().unwrap()["event_type"], "ActivityFailed");
    assert_eq!(history.last().unwrap()["payload"]["non_retryable"], true);
}

// ============================================================================================
// Concurrency and history long-poll

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pollers_never_share_a_task() {
    let h = std::sync::Arc::new(Harness::start().await);
    const N: usize = 6;
    for i in 0..N {
        h.register(&format!("racer-{i}"), "race").await;
    }
    for i in 0..N {
        h.start_workflow(&format!("race-{i}"), "race").await;
    }
    let polls: Vec<_> = (0..N)
        .map(|i| {
            let h = h.clone();
            tokio::spawn(async move { h.poll_workflow(&format!("racer-{i}"), "race", 5).await })
        })
        .collect();
    let mut ids = Vec::new();
    for poll in polls {
        let task = poll.await.unwrap();
        assert!(task.is_object(), "every poller gets one of the {N} tasks");
        ids.push(task["task_id"].as_str().unwrap().to_string());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), N, "a task was handed to two pollers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_wait_new_event_returns_when_an_event_arrives() {
    let h = std::sync::Arc::new(Harness::start().await);
    let start = h.start_workflow("watched", "q").await;
    let run_id = start["run_id"].as_str().unwrap().to_string();
    let watcher = {
        let h = h.clone();
        let run_id = run_id.clone();
        tokio::spawn(async move {
            let token = urlencode("Mg=="); // after sequence 2
            h.cget(&format!(
                "/api/workflows/watched/runs/{run_id}/history?wait_new_event=true&next_page_token={token}"
            ))
            .await
            .ok(200)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await; // let the watcher start waiting
    assert!(!watcher.is_finished(), "no new event yet, the history poll waits");
    h.cpost("/api/workflows/watched/signal/ping", json!({})).await.ok(202);
    let page = tokio::time::timeout(Duration::from_secs(10), watcher)
        .await
        .expect("woke up")
        .unwrap();
    assert_eq!(event_types(page["events"].as_array().unwrap()), ["SignalReceived"]);
    assert_eq!(page["events"][0]["sequence"], 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_targeted_cancel_of_another_run_is_refused() {
    let h = Harness::start().await;
    let start = h.start_workflow("targeted", "q").await;
    h.cpost("/api/workflows/targeted/runs/01NOTTHERUN/cancel", json!({}))
        .await
        .err(409, "run_not_current");
    h.cpost("/api/workflows/targeted/runs/01NOTTHERUN/terminate", json!({}))
        .await
        .err(409, "run_not_current");
    assert_eq!(h.describe("targeted").await["status"], "pending");
    let run_id = start["run_id"].as_str().unwrap();
    let done = h
        .cpost(&format!("/api/workflows/targeted/runs/{run_id}/cancel"), json!({}))
        .await
        .ok(200);
    assert_eq!(done["outcome"], "cancelled");
    assert_eq!(done["run_id"], run_id);
}

// ---------------------------------------------------------------------------------------------
// Queries

/// A registration that can answer queries (the capability Python and Rust workers send).
async fn register_query_worker(h: &Harness, worker_id: &str, queue: &str) {
    h.wpost(
        "/api/worker/register",
        json!({"worker_id": worker_id, "task_queue": queue, "runtime": "python", "capabilities": ["query_tasks"]}),
    )
    .await
    .ok(201);
}

async fn poll_query(h: &Harness, worker_id: &str, queue: &str) -> Value {
    h.wpost(
        "/api/worker/query-tasks/poll",
        json!({"worker_id": worker_id, "task_queue": queue, "timeout_seconds": 10, "poll_request_id": unique("qp")}),
    )
    .await
    .ok(200)
}

#[tokio::test]
async fn a_query_is_routed_to_a_worker_and_answered_without_history() {
    let h = Harness::start().await;
    let queue = unique("query-q");
    register_query_worker(&h, "qw", &queue).await;
    let started = h.start_workflow("queried", &queue).await;
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let events_before = h.history("queried", &run_id).await.len();

    let ask = {
        let (base, http) = (h.base.clone(), h.http.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/api/workflows/queried/query/status"))
                .header("X-Durable-Workflow-Control-Plane-Version", "2")
                .json(&json!({"input": env("wwHioz3/VYAiNwwA")}))
                .send()
                .await
                .unwrap()
        })
    };
    let task = poll_query(&h, "qw", &queue).await["task"].clone();
    assert_eq!(task["query_name"], "status");
    assert_eq!(task["workflow_id"], "queried");
    assert_eq!(task["lease_owner"], "qw");
    assert_eq!(task["task_queue"], json!(queue));
    assert_eq!(task["query_task_attempt"], 1);
    assert_eq!(task["payload_codec"], "avro");
    assert_eq!(task["query_arguments"], env("wwHioz3/VYAiNwwA"));
    assert_eq!(
        task["history_events"].as_array().unwrap().len(),
        events_before,
        "the worker replays committed history"
    );
    let id = task["query_task_id"].as_str().unwrap().to_string();

    // Query-task authority: the holder is confirmed with the poll's own times, nothing renewed.
    let status = |owner: &str, attempt: u64| {
        send(h.worker(
            Method::GET,
            &format!("/api/worker/query-tasks/{id}/status?lease_owner={owner}&query_task_attempt={attempt}"),
        ))
    };
    let held = status("qw", 1).await.ok(200);
    for key in ["lease_expires_at", "query_admitted_at", "query_deadline_at"] {
        assert_eq!(held[key], task[key], "{key} as the poll gave it");
    }
    assert_eq!(
        (held["can_continue"].clone(), held["query_task_status"].clone()),
        (json!(true), json!("leased"))
    );
    assert!(held.as_object().unwrap().contains_key("reason") && held["reason"].is_null());
    assert!(held["server_time"].as_str().unwrap() < task["lease_expires_at"].as_str().unwrap());
    status("intruder", 1).await.err(409, "lease_owner_mismatch");
    status("qw", 2).await.err(409, "query_task_attempt_mismatch");

    // Fencing: wrong owner, wrong attempt, unknown id.
    let complete = |owner: &str, attempt: u64| json!({"lease_owner": owner, "query_task_attempt": attempt, "result_envelope": env("wwHioz3/VYAiNwIB")});
    h.wpost(&format!("/api/worker/query-tasks/{id}/complete"), complete("intruder", 1))
        .await
        .err(409, "lease_owner_mismatch");
    h.wpost(&format!("/api/worker/query-tasks/{id}/complete"), complete("qw", 2))
        .await
        .err(409, "query_task_attempt_mismatch");
    h.wpost("/api/worker/query-tasks/nope/complete", complete("qw", 1))
        .await
        .err(404, "query_task_not_found");
    h.wpost(&format!("/api/worker/query-tasks/{id}/complete"), complete("qw", 1))
        .await
        .ok(200);
    let answer = ask.await.unwrap();
    // Answered (and then cleaned up by the asking client): a second answer is refused either way.
    let again = h.wpost(&format!("/api/worker/query-tasks/{id}/complete"), complete("qw", 1)).await;
    assert!(
        matches!(
            (again.status.as_u16(), again.body["reason"].as_str()),
            (409, Some("query_task_not_leased")) | (404, Some("query_task_not_found"))
        ),
        "{:?}",
        again.body
    );

    assert_eq!(answer.status(), 200);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["result_envelope"], env("wwHioz3/VYAiNwIB"));
    assert_eq!(body["control_plane"]["operation"], "query");
    assert_eq!(
        h.history("queried", &run_id).await.len(),
        events_before,
        "queries never write history"
    );
}

#[tokio::test]
async fn query_failures_map_to_the_dw_reasons() {
    let h = Harness::start().await;
    let queue = unique("query-fail-q");
    h.start_workflow("no-worker", &queue).await;
    // Nobody on the queue answers queries.
    let body = h
        .cpost("/api/workflows/no-worker/query/status", json!({}))
        .await
        .err(409, "query_worker_unavailable");
    assert_eq!(body["control_plane"]["operation"], "query");
    h.cpost("/api/workflows/missing/query/status", json!({}))
        .await
        .err(404, "instance_not_found");

    register_query_worker(&h, "qw", &queue).await;
    for (reason, status) in [
        ("rejected_unknown_query", 404),
        ("invalid_query_arguments", 422),
        ("query_rejected", 409),
    ] {
        let ask = {
            let (base, http) = (h.base.clone(), h.http.clone());
            tokio::spawn(async move {
                http.post(format!("{base}/api/workflows/no-worker/query/status"))
                    .header("X-Durable-Workflow-Control-Plane-Version", "2")
                    .json(&json!({}))
                    .send()
                    .await
                    .unwrap()
            })
        };
        let task = poll_query(&h, "qw", &queue).await["task"].clone();
        let id = task["query_task_id"].as_str().unwrap();
        let fail = format!("/api/worker/query-tasks/{id}/fail");
        let unknown = json!({"lease_owner": "qw", "query_task_attempt": 1, "failure": {"message": "no", "hint": "x"}});
        let refused = h.wpost(&fail, unknown).await.err(422, "validation_failed");
        assert!(refused["errors"]["failure.hint"].is_array(), "{refused}");
        let failure = json!({"message": "no", "reason": reason, "type": "QueryError", "stack_trace": "at handler()"});
        h.wpost(&fail, json!({"lease_owner": "qw", "query_task_attempt": 1, "failure": failure}))
            .await
            .ok(200);
        let answer = ask.await.unwrap();
        assert_eq!(answer.status().as_u16(), status, "{reason}");
        let body: Value = answer.json().await.unwrap();
        assert_eq!(body["reason"], reason);
        assert_eq!(
            (&body["failure_type"], &body["stack_trace"]),
            (&json!("QueryError"), &json!("at handler()")),
            "{body}"
        );
    }
}

#[tokio::test]
async fn an_unclaimed_query_times_out_with_504() {
    let config = ServerConfig {
        query_wait_ms: 300,
        ..ServerConfig::default()
    };
    let h = Harness::with_config(config, None).await;
    let queue = unique("query-timeout-q");
    register_query_worker(&h, "qw", &queue).await;
    h.start_workflow("unanswered", &queue).await;
    // A deliberate 504, so not through the harness (which fails any 5xx).
    let unclaimed = h
        .http
        .post(h.url("/api/workflows/unanswered/query/status"))
        .header("X-Durable-Workflow-Control-Plane-Version", "2")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(unclaimed.status(), 504);
    assert_eq!(unclaimed.json::<Value>().await.unwrap()["reason"], "query_task_not_claimed");
    // Claimed but never answered.
    let ask = {
        let (base, http) = (h.base.clone(), h.http.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/api/workflows/unanswered/query/status"))
                .header("X-Durable-Workflow-Control-Plane-Version", "2")
                .json(&json!({}))
                .send()
                .await
                .unwrap()
        })
    };
    poll_query(&h, "qw", &queue).await;
    let answer = ask.await.unwrap();
    assert_eq!(answer.status(), 504);
    let body: Value = answer.json().await.unwrap();
    assert_eq!(body["reason"], "query_worker_timeout");
}

#[tokio::test]
async fn repair_offers_a_backed_off_workflow_task_now_and_writes_one_fact() {
    let h = Harness::start().await;
    let queue = unique("repair-q");
    h.register("w", &queue).await;
    let (started, task) = h.started_and_leased("repaired", "w", &queue).await;
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let task_id = task["task_id"].as_str().unwrap();
    // A failed workflow task is offered again only after a backoff…
    h.wpost(
        &format!("/api/worker/workflow-tasks/{task_id}/fail"),
        json!({"lease_owner": "w", "workflow_task_attempt": 1, "failure": {"message": "boom", "type": "Crash"}}),
    )
    .await
    .ok(200);
    let empty = h.poll_workflow("w", &queue, 0).await;
    assert!(empty.is_null(), "still backing off");
    // …unless an operator repairs the run.
    let repaired = h.cpost("/api/workflows/repaired/repair", json!({})).await.ok(200);
    assert_eq!(repaired["outcome"], "repair_dispatched");
    assert_eq!(repaired["control_plane"]["operation"], "repair");
    let again = h.poll_workflow("w", &queue, 0).await;
    assert_eq!(again["task_id"], json!(task_id));
    assert_eq!(again["workflow_task_attempt"], 2);
    let not_needed = h.cpost("/api/workflows/repaired/repair", json!({"request_id": "r1"})).await.ok(200);
    assert_eq!(not_needed["outcome"], "repair_not_needed", "a live lease needs no repair");
    let retained = h.cpost("/api/workflows/repaired/repair", json!({"request_id": "r1"})).await.ok(200);
    assert_eq!(retained["retained"], true);
    let events = h.history("repaired", &run_id).await;
    assert_eq!(count_events(&events, "RepairRequested"), 2, "the retained repair wrote nothing");
    h.cpost("/api/workflows/repaired/terminate", json!({})).await.ok(200);
    h.cpost("/api/workflows/repaired/repair", json!({}))
        .await
        .err(409, "run_not_active");
    h.cpost("/api/workflows/nobody/repair", json!({}))
        .await
        .err(404, "instance_not_found");
}

#[tokio::test]
async fn list_filters_by_search_attributes_with_the_query_grammar() {
    let h = Harness::start().await;
    let queue = unique("sa-q");
    for (name, kind) in [("Tier", "keyword"), ("Region", "keyword")] {
        h.cpost("/api/search-attributes", json!({"name": name, "type": kind})).await.ok(201);
    }
    for (id, tier) in [("sa-gold", "gold"), ("sa-silver", "silver")] {
        h.start_workflow_with(json!({"workflow_type": "t", "workflow_id": id, "task_queue": queue,
            "search_attributes": {"Tier": tier, "Region": "eu"}}))
            .await
            .ok(201);
    }
    let ids = |body: Value| -> Vec<String> {
        let mut ids: Vec<String> = body["workflows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["workflow_id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    let list = |query: &str| {
        let path = format!("/api/workflows?query={}", urlencode(query));
        let h = &h;
        async move { h.cget(&path).await }
    };
    assert_eq!(ids(list(r#"Tier = "gold""#).await.ok(200)), ["sa-gold"]);
    assert_eq!(ids(list(r#"Region = 'eu' AND Tier = "silver""#).await.ok(200)), ["sa-silver"]);
    assert_eq!(ids(list(r#"WorkflowId = "sa-gold" AND Region = "eu""#).await.ok(200)), ["sa-gold"]);
    assert!(ids(list(r#"Tier = "bronze""#).await.ok(200)).is_empty());
    assert_eq!(
        ids(list("sa-").await.ok(200)),
        ["sa-gold", "sa-silver"],
        "anything else is a substring match"
    );
    // Search attributes are bounded at start.
    let too_long = "x".repeat(2049);
    h.start_workflow_with(json!({"workflow_type": "t", "task_queue": queue, "search_attributes": {"Tier": too_long}}))
        .await
        .err(422, "validation_failed");
    h.start_workflow_with(json!({"workflow_type": "t", "task_queue": queue, "search_attributes": {"Tier": {"a": 1}}}))
        .await
        .err(422, "validation_failed");
}

#[tokio::test]
async fn a_poll_whose_client_hung_up_does_not_take_the_task() {
    use tokio::io::AsyncWriteExt;
    let h = Harness::start().await;
    let queue = unique("dead-poll-q");
    h.register("dead", &queue).await;
    h.register("live", &queue).await;
    let body = json!({"worker_id": "dead", "task_queue": queue, "timeout_seconds": 20}).to_string();
    let address = h.base.trim_start_matches("http://").to_string();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    let request = format!(
        "POST /api/worker/workflow-tasks/poll HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Durable-Workflow-Protocol-Version: 1.20\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await; // let the poll start waiting
    drop(socket); // the worker process dies mid-poll
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.start_workflow("after-hangup", &queue).await;
    let task = h.poll_workflow("live", &queue, 5).await;
    assert_eq!(
        task["workflow_id"], "after-hangup",
        "the live poller gets the task, not the dead one"
    );
    assert_eq!(task["workflow_task_attempt"], 1, "never leased to the dead poll");
}

#[tokio::test]
async fn archive_only_closed_runs_once() {
    let h = Harness::start().await;
    let queue = unique("archive-q");
    let started = h.start_workflow("archived", &queue).await;
    let run_id = started["run_id"].as_str().unwrap().to_string();
    h.cpost("/api/workflows/archived/archive", json!({}))
        .await
        .err(409, "run_not_closed");
    h.cpost("/api/workflows/archived/terminate", json!({"reason": "done"}))
        .await
        .ok(200);
    let first = h
        .cpost("/api/workflows/archived/archive", json!({"reason": "retention"}))
        .await
        .ok(200);
    assert_eq!(first["outcome"], "archived");
    let second = h.cpost("/api/workflows/archived/archive", json!({})).await.ok(200);
    assert_eq!(second["outcome"], "archive_not_needed");
    let described = h.describe("archived").await;
    assert_eq!(described["archived"], true);
    assert_eq!(described["actions"]["can_archive"], false);
    let events = h.history("archived", &run_id).await;
    let types = event_types(&events);
    assert_eq!(
        types[types.len() - 3..],
        ["WorkflowTerminated", "ArchiveRequested", "WorkflowArchived"]
    );
    assert_eq!(count_events(&events, "WorkflowArchived"), 1);
    h.cpost("/api/workflows/archived/signal/x", json!({}))
        .await
        .err(409, "run_not_active");
}

#[tokio::test]
async fn concurrent_duplicates_of_one_poll_request_get_the_same_lease() {
    let h = Harness::start().await;
    let queue = unique("dup-poll-q");
    h.register("w", &queue).await;
    let poll = || {
        let (base, http, queue) = (h.base.clone(), h.http.clone(), queue.clone());
        tokio::spawn(async move {
            let response = http
                .post(format!("{base}/api/worker/workflow-tasks/poll"))
                .header("X-Durable-Workflow-Protocol-Version", "1.20")
                .json(&json!({"worker_id": "w", "task_queue": queue, "poll_request_id": "same-poll", "timeout_seconds": 5}))
                .send()
                .await
                .unwrap();
            response.json::<Value>().await.unwrap()["task"].clone()
        })
    };
    let (first, second) = (poll(), poll());
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.start_workflow("dup-1", &queue).await;
    h.start_workflow("dup-2", &queue).await;
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(
        first["task_id"], second["task_id"],
        "a retried poll is answered with the first poll's lease"
    );
    assert_eq!(first["workflow_task_attempt"], second["workflow_task_attempt"]);
    // The other workflow's task was not consumed by the duplicate.
    let other = h.poll_workflow("w", &queue, 2).await;
    assert!(!other.is_null());
    assert_ne!(other["task_id"], first["task_id"]);
}

fn register_with_contracts(worker_id: &str, queue: &str, contracts: Value) -> Value {
    json!({"worker_id": worker_id, "task_queue": queue, "runtime": "python", "sdk_version": "capstan-http-tests/1",
           "supported_workflow_types": ["test.workflow"], "supported_activity_types": [],
           "workflow_command_contracts": contracts})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_command_contracts_admit_signals_and_updates() {
    let h = Harness::start().await;
    let contract = json!({"test.workflow": {"queries": ["state"], "signals": ["approve"], "signal_contracts": [{"name": "approve"}],
                                            "updates": ["add"], "update_contracts": [{"name": "add"}], "update_validators": []}});
    h.wpost("/api/worker/register", register_with_contracts("w1", "q", contract))
        .await
        .ok(201);
    let start = h.start_workflow("declared", "q").await;
    let run_id = start["run_id"].as_str().unwrap().to_string();

    // The contract registered at start is recorded on WorkflowStarted and shown by describe.
    let history = h.history("declared", &run_id).await;
    let started = history.iter().find(|e| e["event_type"] == "WorkflowStarted").unwrap();
    assert_eq!(started["payload"]["declared_signals"], json!(["approve"]));
    assert_eq!(started["payload"]["declared_updates"], json!(["add"]));
    assert_eq!(started["payload"]["declared_queries"], json!(["state"]));
    assert_eq!(started["payload"]["declared_update_contracts"], json!([{"name": "add"}]));
    let described = h.describe("declared").await;
    assert_eq!(described["declared_updates"], json!(["add"]));
    assert_eq!(described["actions"]["can_update"], true);

    // Undeclared names are refused before anything is recorded.
    let before = h.history("declared", &run_id).await.len();
    let refused = h
        .cpost("/api/workflows/declared/signal/nope", json!({"input": env(EMPTY_ARGS)}))
        .await
        .err(404, "unknown_signal");
    assert_eq!(refused["signal_name"], "nope");
    assert_eq!(refused["control_plane"]["operation"], "signal");
    let keyed = json!({"input": env(EMPTY_ARGS), "request_id": "k-1"});
    h.cpost("/api/workflows/declared/signal/nope", keyed)
        .await
        .err(404, "unknown_signal");
    let rejected = h
        .cpost(
            "/api/workflows/declared/update/nope",
            json!({"input": env(EMPTY_ARGS), "wait_for": "accepted"}),
        )
        .await
        .err(409, "update_rejected");
    assert_eq!(rejected["update_name"], "nope");
    assert_eq!(rejected["declared_updates"], json!(["add"]));
    assert_eq!(rejected["control_plane"]["operation"], "update");
    assert_eq!(h.history("declared", &run_id).await.len(), before);

    // Declared names pass; an accepted update is on describe, run detail and the export.
    h.cpost("/api/workflows/declared/signal/approve", json!({"input": env(EMPTY_ARGS)}))
        .await
        .ok(202);
    let accepted = h
        .cpost(
            "/api/workflows/declared/update/add",
            json!({"input": env(EMPTY_ARGS), "wait_for": "accepted"}),
        )
        .await
        .ok(200);
    let update_id = accepted["update_id"].as_str().unwrap();
    let listed = h.describe("declared").await["updates"].clone();
    assert_eq!(listed[0]["id"], update_id);
    assert_eq!(listed[0]["name"], "add");
    assert_eq!(listed[0]["status"], "accepted");
    let detail = h.cget(&format!("/api/workflows/declared/runs/{run_id}")).await.ok(200);
    assert_eq!(detail["updates"][0]["update_id"], update_id);
    let export = h
        .cget(&format!("/api/workflows/declared/runs/{run_id}/history/export"))
        .await
        .ok(200);
    assert_eq!(export["updates"][0]["id"], update_id);
    assert_eq!(export["updates"][0]["status"], "accepted");
    assert_eq!(export["updates"][0]["arguments"], EMPTY_ARGS);

    // A newer registration does not change what a started run recorded.
    let newer = json!({"test.workflow": {"signals": ["other"], "updates": []}});
    h.wpost("/api/worker/register", register_with_contracts("w2", "q", newer))
        .await
        .ok(201);
    h.cpost("/api/workflows/declared/signal/approve", json!({})).await.ok(202);
    // ... but a run started now records the newer one: no updates at all, signals only "other".
    h.start_workflow("declared-2", "q").await;
    h.cpost("/api/workflows/declared-2/update/add", json!({"wait_for": "accepted"}))
        .await
        .err(409, "update_rejected");
    h.cpost("/api/workflows/declared-2/signal/approve", json!({}))
        .await
        .err(404, "unknown_signal");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_started_before_registration_use_the_registered_contract() {
    let h = Harness::start().await;
    let start = h.start_workflow("early", "q").await;
    let run_id = start["run_id"].as_str().unwrap().to_string();
    let history = h.history("early", &run_id).await;
    let started = history.iter().find(|e| e["event_type"] == "WorkflowStarted").unwrap();
    assert!(started["payload"].get("declared_signals").is_none());
    // Nothing registered: every name is admitted.
    h.cpost("/api/workflows/early/signal/anything", json!({})).await.ok(202);

    // An empty signal list declares nothing; updates are strict once a contract exists.
    let open = json!({"test.workflow": {"signals": [], "updates": ["add"]}});
    h.wpost("/api/worker/register", register_with_contracts("w1", "q", open))
        .await
        .ok(201);
    h.cpost("/api/workflows/early/signal/still-anything", json!({})).await.ok(202);
    h.cpost("/api/workflows/early/update/other", json!({"wait_for": "accepted"}))
        .await
        .err(409, "update_rejected");

    let strict = json!({"test.workflow": {"signals": ["approve"], "updates": ["add"]}});
    h.wpost("/api/worker/register", register_with_contracts("w2", "q", strict))
        .await
        .ok(201);
    h.cpost("/api/workflows/early/signal/anything", json!({}))
        .await
        .err(404, "unknown_signal");
    h.cpost("/api/workflows/early/signal/approve", json!({})).await.ok(202);
    // A registration for another workflow type says nothing about this one.
    let other = json!({"other.workflow": {"signals": ["x"], "updates": []}});
    h.wpost("/api/worker/register", register_with_contracts("w3", "q2", other))
        .await
        .ok(201);
    h.start_workflow("elsewhere", "q2").await;
    h.cpost("/api/workflows/elsewhere/signal/anything", json!({})).await.ok(202);
}

fn validating_worker(worker_id: &str, queue: &str, capable: bool) -> Value {
    let contracts = json!({"test.workflow": {"signals": [], "updates": ["add", "plain"], "update_validators": ["add"]}});
    let mut body = register_with_contracts(worker_id, queue, contracts);
    body["capabilities"] = if capable {
        json!(["query_tasks", "update_validation_tasks"])
    } else {
        json!(["query_tasks"])
    };
    body
}

/// Starts `workflow_id` and parks it on a condition wait, so the only work left is what the test sends.
async fn parked_workflow(h: &Harness, worker_id: &str, queue: &str, workflow_id: &str) -> String {
    let run_id = h.start_workflow(workflow_id, queue).await["run_id"].as_str().unwrap().to_string();
    let task = h.next_workflow_task(worker_id, queue).await;
    assert_eq!(task["task_kind"], "workflow");
    h.complete_workflow_task(&task, json!([{"type": "open_condition_wait", "condition_key": "k"}]))
        .await
        .ok(200);
    run_id
}

fn multiplexed_poll(worker_id: &str, queue: &str) -> Value {
    json!({"worker_id": worker_id, "task_queue": queue, "poll_request_id": unique("mux"), "timeout_seconds": 5,
           "task_kinds": ["workflow", "update_validation"]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_validation_tasks_ride_the_workflow_poll_and_are_fenced() {
    let h = Harness::start().await;
    let info = h.cget("/api/cluster/info").await.ok(200);
    let advertised = &info["worker_protocol"]["server_capabilities"];
    assert_eq!(advertised["update_validation_tasks"], true);
    assert_eq!(advertised["synchronous_update_validation"]["task_poll"]["strategy"], "multiplexed");
    h.wpost("/api/worker/register", validating_worker("v1", "q", true)).await.ok(201);
    let run_id = parked_workflow(&h, "v1", "q", "validated").await;
    let started = h.history("validated", &run_id).await;
    assert_eq!(started[1]["payload"]["declared_update_validators"], json!(["add"]));

    // An update with a validator waits for a worker's verdict before anything is recorded.
    let pending = tokio::spawn(send(
        h.client(Method::POST, "/api/workflows/validated/update/add")
            .json(&json!({"input": env(EMPTY_ARGS), "wait_for": "accepted", "request_id": "u-1"})),
    ));
    // A poll for workflow tasks only never sees it.
    assert!(h.poll_workflow("v1", "q", 1).await.is_null());
    let task = h.poll_workflow_with(multiplexed_poll("v1", "q")).await.ok(200)["task"].clone();
    assert_eq!(task["task_kind"], "update_validation");
    assert_eq!(task["update_name"], "add");
    assert_eq!(task["update_validation_attempt"], 1);
    assert_eq!(task["update_arguments"], env(EMPTY_ARGS));
    assert_eq!(task["run_id"], run_id.as_str());
    assert_eq!(
        event_types(task["history_events"].as_array().unwrap()),
        ["StartAccepted", "WorkflowStarted", "ConditionWaitOpened"]
    );
    assert_eq!(count_events(&h.history("validated", &run_id).await, "UpdateAccepted"), 0);

    let id = task["update_validation_task_id"].as_str().unwrap();
    let approve = format!("/api/worker/update-validation-tasks/{id}/approve");
    h.wpost(&approve, json!({"lease_owner": "someone-else", "update_validation_attempt": 1}))
        .await
        .err(409, "update_validation_lease_owner_mismatch");
    h.wpost(&approve, json!({"lease_owner": "v1", "update_validation_attempt": 2}))
        .await
        .err(409, "stale_update_validation_completion");
    h.wpost(
        "/api/worker/update-validation-tasks/nope/approve",
        json!({"lease_owner": "v1", "update_validation_attempt": 1}),
    )
    .await
    .err(404, "update_validation_task_not_found");
    // A query answer is not a verdict.
    h.wpost(
        &format!("/api/worker/query-tasks/{id}/complete"),
        json!({"lease_owner": "v1", "query_task_attempt": 1, "result_envelope": env(AVRO_NULL)}),
    )
    .await
    .err(404, "query_task_not_found");
    let verdict = h
        .wpost(&approve, json!({"lease_owner": "v1", "update_validation_attempt": 1}))
        .await
        .ok(200);
    assert_eq!(verdict["outcome"], "approved");
    let accepted = pending.await.unwrap().ok(200);
    assert_eq!(accepted["update_status"], "accepted");
    assert_eq!(count_events(&h.history("validated", &run_id).await, "UpdateAccepted"), 1);
    // The same request again is answered from its receipt, without another validation.
    let again = h
        .cpost(
            "/api/workflows/validated/update/add",
            json!({"input": env(EMPTY_ARGS), "wait_for": "accepted", "request_id": "u-1"}),
        )
        .await
        .ok(200);
    assert_eq!(
        (again["update_id"].clone(), again["retained"].clone()),
        (accepted["update_id"].clone(), json!(true))
    );
    // An update without a validator is accepted at once.
    h.cpost("/api/workflows/validated/update/plain", json!({"wait_for": "accepted"}))
        .await
        .ok(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_update_records_only_its_rejection() {
    let h = Harness::start().await;
    h.wpost("/api/worker/register", validating_worker("v1", "q", true)).await.ok(201);
    let run_id = parked_workflow(&h, "v1", "q", "rejecting").await;
    let pending = tokio::spawn(send(
        h.client(Method::POST, "/api/workflows/rejecting/update/add")
            .json(&json!({"input": env(EMPTY_ARGS), "request_id": "r-1"})),
    ));
    let task = h.poll_workflow_with(multiplexed_poll("v1", "q")).await.ok(200)["task"].clone();
    let reject = format!(
        "/api/worker/update-validation-tasks/{}/reject",
        task["update_validation_task_id"].as_str().unwrap()
    );
    h.wpost(
        &reject,
        json!({"lease_owner": "v1", "update_validation_attempt": 1, "failure": {"message": "no", "validation_errors": {"item": "x"}}}),
    )
    .await
    .err(422, "validation_failed");
    h.wpost(&reject, json!({"lease_owner": "v1", "update_validation_attempt": 1}))
        .await
        .err(422, "validation_failed");
    let errors = json!({"item": ["must not be forbidden"]});
    let verdict = h
        .wpost(&reject, json!({"lease_owner": "v1", "update_validation_attempt": 1,
            "failure": {"message": "forbidden", "reason": "update_validator_rejected", "type": "InvalidArgument", "validation_errors": errors}}))
        .await
        .ok(200);
    assert_eq!(verdict["outcome"], "rejected");
    let refused = pending.await.unwrap().err(422, "update_validator_rejected");
    // Once the request has its verdict the task is gone: a late verdict changes nothing.
    h.wpost(
        &reject,
        json!({"lease_owner": "v1", "update_validation_attempt": 1, "failure": {"message": "again"}}),
    )
    .await
    .err(404, "update_validation_task_not_found");
    assert_eq!(refused["update_status"], "rejected");
    assert_eq!(refused["validation_errors"], errors);
    assert_eq!(refused["failure_type"], "InvalidArgument");
    let history = h.history("rejecting", &run_id).await;
    assert_eq!(count_events(&history, "UpdateRejected"), 1);
    assert_eq!(count_events(&history, "UpdateAccepted"), 0);
    let described = h.describe("rejecting").await;
    assert_eq!(described["updates"][0]["status"], "rejected");
    assert!(
        described["open_tasks"].as_array().unwrap().iter().all(|t| t["kind"] != "workflow"),
        "a rejected update makes no workflow task"
    );
    // The same request id gets the same verdict, recorded once.
    let again = h
        .cpost(
            "/api/workflows/rejecting/update/add",
            json!({"input": env(EMPTY_ARGS), "request_id": "r-1"}),
        )
        .await
        .err(422, "update_validator_rejected");
    assert_eq!(again["update_id"], refused["update_id"]);
    assert_eq!(count_events(&h.history("rejecting", &run_id).await, "UpdateRejected"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_validation_needs_a_capable_live_worker() {
    let h = Harness::start().await;
    h.wpost("/api/worker/register", validating_worker("plain", "q", false))
        .await
        .ok(201);
    parked_workflow(&h, "plain", "q", "unvalidated").await;
    // Polls must ask for known kinds, and only a capable worker may ask for validations.
    for kinds in [json!([]), json!(["workflow", "workflow"]), json!(["activity"]), json!("workflow")] {
        let mut body = multiplexed_poll("plain", "q");
        body["task_kinds"] = kinds;
        h.poll_workflow_with(body).await.err(422, "validation_failed");
    }
    let refused = h
        .poll_workflow_with(multiplexed_poll("plain", "q"))
        .await
        .err(409, "update_validation_capability_not_advertised");
    assert_eq!(refused["poll_status"], "unsupported");
    let body = h
        .cpost("/api/workflows/unvalidated/update/add", json!({"request_id": "x"}))
        .await
        .err(409, "update_validation_capability_unsupported");
    assert_eq!(body["retryable"], false);
    // A capable worker that never polls: the request gives up after the validation wait.
    h.wpost("/api/worker/register", validating_worker("idle", "q", true)).await.ok(201);
    let started = Instant::now();
    let body = send_allowing_gateway_timeout(
        h.client(Method::POST, "/api/workflows/unvalidated/update/add")
            .json(&json!({"request_id": "y"})),
    )
    .await
    .err(504, "update_validation_task_not_claimed");
    assert_eq!(body["retryable"], true);
    assert!(started.elapsed() >= Duration::from_secs(9));
    assert_eq!(
        count_events(
            &h.history("unvalidated", h.describe("unvalidated").await["run_id"].as_str().unwrap())
                .await,
            "UpdateAccepted"
        ),
        0
    );
}

fn cooperative_worker(worker_id: &str, queue: &str, capable: bool) -> Value {
    let capabilities = if capable { json!(["cooperative_cancellation"]) } else { json!([]) };
    json!({"worker_id": worker_id, "task_queue": queue, "runtime": "python", "sdk_version": "capstan-http-tests/1",
           "supported_workflow_types": ["test.workflow"], "supported_activity_types": [], "capabilities": capabilities})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_cancellation_is_delivered_on_the_lease_and_ends_the_run_cancelled() {
    let h = Harness::start().await;
    assert_eq!(
        h.cget("/api/cluster/info").await.ok(200)["worker_protocol"]["server_capabilities"]["cooperative_cancellation"],
        true
    );
    h.wpost("/api/worker/register", cooperative_worker("w1", "q", true)).await.ok(201);
    let run_id = h.start_workflow("coop", "q").await["run_id"].as_str().unwrap().to_string();
    let task = h.next_workflow_task("w1", "q").await;
    h.complete_workflow_task(&task, json!([{"type": "start_timer", "delay_seconds": 3600}]))
        .await
        .ok(200);

    let requested = h
        .cpost(
            "/api/workflows/coop/request-cancellation",
            json!({"reason": "stop", "cleanup_timeout_seconds": 60}),
        )
        .await
        .ok(202);
    assert_eq!(
        (requested["accepted"].clone(), requested["duplicate"].clone()),
        (json!(true), json!(false))
    );
    let observation = requested["cancellation_request"].clone();
    let request_id = observation["request_id"].as_str().unwrap().to_string();
    assert_eq!(observation["history_refresh_page_token"], "MA==");
    let again = h
        .cpost(
            &format!("/api/workflows/coop/runs/{run_id}/request-cancellation"),
            json!({"reason": "other"}),
        )
        .await
        .ok(200);
    assert_eq!(
        (again["duplicate"].clone(), again["cancellation_request"].clone()),
        (json!(true), observation.clone())
    );
    h.cpost("/api/workflows/coop/runs/01NOTCURRENT/request-cancellation", json!({}))
        .await
        .err(409, "run_not_current");
    h.cpost("/api/workflows/coop/request-cancellation", json!({"cleanup_timeout_seconds": 0}))
        .await
        .err(422, "validation_failed");

    // The run stays open and its next workflow task carries the request.
    let task = h.next_workflow_task("w1", "q").await;
    assert_eq!(task["cancellation_request"], observation);
    let deliver = format!(
        "/api/worker/workflow-tasks/{}/deliver-cancellation",
        task["task_id"].as_str().unwrap()
    );
    let body = |request_id: &str, sequence: u32, kind: &str| {
        json!({"lease_owner": "w1", "workflow_task_attempt": task["workflow_task_attempt"], "request_id": request_id,
               "sequence": sequence, "call_kind": kind, "sequence_span": 1})
    };
    h.wpost(&deliver, body("other", 1, "timer"))
        .await
        .err(409, "cancellation_request_mismatch");
    h.wpost(&deliver, body(&request_id, 1, "activity"))
        .await
        .err(409, "cancellation_delivery_shape_mismatch");
    h.wpost(&deliver, body(&request_id, 3, "timer"))
        .await
        .err(409, "cancellation_delivery_sequence_mismatch");
    h.wpost(&deliver, body(&request_id, 1, "nonsense"))
        .await
        .err(409, "invalid_cancellation_delivery");
    let mut stale = body(&request_id, 1, "timer");
    stale["workflow_task_attempt"] = json!(9);
    h.wpost(&deliver, stale).await.err(409, "workflow_task_attempt_mismatch");
    let delivered = h.wpost(&deliver, body(&request_id, 1, "timer")).await.ok(200);
    assert_eq!(
        (
            delivered["delivered"].clone(),
            delivered["sequence"].clone(),
            delivered["call_kind"].clone()
        ),
        (json!(true), json!(1), json!("timer"))
    );
    assert_eq!(delivered["workflow_run_id"], run_id.as_str());
    // The same delivery again is answered the same; another one is refused.
    assert_eq!(h.wpost(&deliver, body(&request_id, 1, "timer")).await.ok(200)["sequence"], 1);
    h.wpost(&deliver, body(&request_id, 2, "timer"))
        .await
        .err(409, "cancellation_delivery_mismatch");

    // The lease's history now includes the request and the delivery.
    let page = h
        .wpost(
            &format!("/api/worker/workflow-tasks/{}/history", task["task_id"].as_str().unwrap()),
            json!({"lease_owner": "w1", "workflow_task_attempt": task["workflow_task_attempt"], "next_history_page_token": "MA=="}),
        )
        .await
        .ok(200);
    let types = event_types(page["history_events"].as_array().unwrap());
    assert_eq!(
        &types[types.len() - 3..],
        [
            "CooperativeCancellationRequested",
            "TimerCancelled",
            "CooperativeCancellationDelivered"
        ]
    );
    assert!(page["next_history_page_token"].is_null());

    // Completing the cleanup ends the run cancelled, whatever the terminal command.
    h.complete_workflow_task(&task, json!([{"type": "complete_workflow", "result": env(AVRO_NULL)}]))
        .await
        .ok(200);
    let described = h.describe("coop").await;
    assert_eq!(
        (described["status"].clone(), described["closed_reason"].clone()),
        (json!("cancelled"), json!("cancelled"))
    );
    let history = h.history("coop", &run_id).await;
    let last = history.last().unwrap();
    assert_eq!(last["event_type"], "WorkflowCancelled");
    assert_eq!(last["workflow_command_id"], request_id.as_str());
    assert_eq!(last["payload"]["cancellation_cleanup"]["outcome"], "completed");
    assert_eq!(count_events(&history, "WorkflowCompleted"), 0);
    // A closed run still answers a repeated request with the original; a fresh one is refused.
    assert_eq!(
        h.cpost("/api/workflows/coop/request-cancellation", json!({})).await.ok(200)["duplicate"],
        true
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_cancellation_deadline_and_incapable_claims() {
    let h = Harness::start().await;
    h.wpost("/api/worker/register", cooperative_worker("plain", "q", false))
        .await
        .ok(201);
    h.start_workflow("held", "q").await;
    let held = h.next_workflow_task("plain", "q").await;
    let refused = h
        .cpost("/api/workflows/held/request-cancellation", json!({}))
        .await
        .err(409, "active_claim_cancellation_not_supported");
    assert_eq!(refused["task_id"], held["task_id"]);
    assert_eq!(
        count_events(
            &h.history("held", h.describe("held").await["run_id"].as_str().unwrap()).await,
            "CooperativeCancellationRequested"
        ),
        0
    );
    h.cpost("/api/workflows/nope/request-cancellation", json!({}))
        .await
        .err(404, "instance_not_found");

    // A run whose cleanup outlives its deadline is closed cancelled by the clock.
    h.start_workflow("slow-cleanup", "q2").await;
    let run_id = h.describe("slow-cleanup").await["run_id"].as_str().unwrap().to_string();
    h.cpost(
        "/api/workflows/slow-cleanup/request-cancellation",
        json!({"cleanup_timeout_seconds": 1}),
    )
    .await
    .ok(202);
    let described = wait_for("the cleanup deadline", Duration::from_secs(10), || async {
        let described = h.describe("slow-cleanup").await;
        (described["status"] == "cancelled").then_some(described)
    })
    .await;
    assert_eq!(described["closed_reason"], "cancelled");
    let history = h.history("slow-cleanup", &run_id).await;
    assert_eq!(history.last().unwrap()["payload"]["outcome"], "deadline_expired");
    h.cpost("/api/workflows/held/cancel", json!({})).await.ok(200);
    h.cpost("/api/workflows/held/request-cancellation", json!({}))
        .await
        .err(409, "run_not_active");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_activity_records_are_validated_and_recorded_without_a_task() {
    let h = Harness::start().await;
    h.register("w1", "q").await;
    let run_id = h.start_workflow("local", "q").await["run_id"].as_str().unwrap().to_string();
    let task = h.next_workflow_task("w1", "q").await;
    let record = json!({"type": "record_local_activity", "activity_type": "greet", "execution_mode": "local",
        "arguments": env(EMPTY_ARGS), "outcome": "completed", "result": env(AVRO_NULL), "start_to_close_timeout": 30,
        "retry_policy": {"max_attempts": 2, "backoff_seconds": [0], "non_retryable_error_types": []},
        "attempts": [
            {"attempt_number": 1, "attempt_id": "w-1", "outcome": "failed", "duration_ms": 3, "heartbeats": [],
             "message": "boom", "exception_type": "RuntimeError", "retry_reason": "failure", "backoff_seconds": 0},
            {"attempt_number": 2, "attempt_id": "w-2", "outcome": "completed", "duration_ms": 2,
             "heartbeats": [{"elapsed_ms": 1, "details": {"phase": "x"}}]}]});
    for (field, bad) in [
        ("outcome", json!("maybe")),
        ("attempts", json!([])),
        ("attempts", json!("all of them")),
        ("activity_type", json!("  ")),
        ("result", Value::Null),
    ] {
        let mut command = record.clone();
        command[field] = bad;
        h.complete_workflow_task(&task, json!([command]))
            .await
            .err(422, "validation_failed");
    }
    let mut failed_without_message = record.clone();
    failed_without_message["outcome"] = json!("failed");
    h.complete_workflow_task(&task, json!([failed_without_message]))
        .await
        .err(422, "validation_failed");

    h.complete_workflow_task(&task, json!([record, {"type": "complete_workflow", "result": env(AVRO_NULL)}]))
        .await
        .ok(200);
    let history = h.history("local", &run_id).await;
    let local: Vec<&Value> = history.iter().filter(|e| e["payload"]["sequence"] == 1).collect();
    assert_eq!(
        event_types(&local.iter().map(|e| (*e).clone()).collect::<Vec<_>>()),
        [
            "ActivityScheduled",
            "ActivityStarted",
            "ActivityRetryScheduled",
            "ActivityStarted",
            "ActivityHeartbeatRecorded",
            "ActivityCompleted"
        ]
    );
    for event in &local {
        assert_eq!(event["payload"]["execution_mode"], "local");
        assert_eq!(event["payload"]["local_activity"], true);
        assert_eq!(event["payload"]["activity_type"], "greet");
    }
    assert_eq!(local[2]["payload"]["retry_reason"], "failure");
    assert_eq!(local[5]["payload"]["worker_attempt_id"], "w-2");
    assert_eq!(local[5]["payload"]["attempt_number"], 2);
    assert_eq!(local[0]["payload"]["start_to_close_timeout"], 30);
    let described = h.describe("local").await;
    assert_eq!(described["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn select_winner_is_recorded_with_its_event_and_losers_are_cancelled_once() {
    let h = Harness::start().await;
    h.register("w1", "q").await;
    let run_id = h.start_workflow("race", "q").await["run_id"].as_str().unwrap().to_string();
    let task = h.next_workflow_task("w1", "q").await;
    let select = |index: u64, key: &str, kind: &str| {
        let entry = json!({"parallel_group_id": "select-calls:1:2", "parallel_group_kind": "mixed", "parallel_group_mode": "select",
            "parallel_group_base_sequence": 1, "parallel_group_size": 2, "parallel_group_index": index,
            "selection_member_key": key, "selection_member_index": index, "selection_member_base_sequence": index + 1,
            "selection_member_size": 1, "selection_member_kind": kind});
        let mut fields = entry.as_object().unwrap().clone();
        fields.insert("parallel_group_path".into(), json!([entry]));
        fields
    };
    let mut activity = json!({"type": "schedule_activity", "activity_type": "work", "arguments": env(EMPTY_ARGS)});
    activity.as_object_mut().unwrap().extend(select(0, "work", "activity"));
    let mut timer = json!({"type": "start_timer", "delay_seconds": 3600});
    timer.as_object_mut().unwrap().extend(select(1, "deadline", "timer"));
    h.complete_workflow_task(&task, json!([activity, timer])).await.ok(200);

    let attempt = h.next_activity_task("w1", "q").await;
    h.complete_activity(&attempt, AVRO_NULL).await.ok(200);
    let history = h.history("race", &run_id).await;
    let at = history
        .iter()
        .position(|e| e["event_type"] == "SelectionResolved")
        .expect("a winner");
    let (completed, resolved) = (&history[at - 1], &history[at]["payload"]);
    assert_eq!(completed["event_type"], "ActivityCompleted");
    assert_eq!(resolved["resolution_event_id"], completed["id"]);
    assert_eq!(
        (resolved["member_key"].clone(), resolved["outcome"].clone()),
        (json!("work"), json!("completed"))
    );
    let timer_id = history.iter().find(|e| e["event_type"] == "TimerScheduled").unwrap()["payload"]["timer_id"].clone();
    assert_eq!(resolved["selection_group_id"], "select-calls:1:2");

    let task = h.next_workflow_task("w1", "q").await;
    let cancel = json!({"type": "cancel_selection_operation", "selection_group_id": "select-calls:1:2", "member_key": "deadline",
        "member_index": 1, "member_base_sequence": 2, "member_size": 1, "operation_kind": "timer", "operation_identity": timer_id});
    for (field, bad) in [
        ("selection_group_id", json!("select-calls:x")),
        ("member_base_sequence", json!(3)),
        ("operation_identity", json!("other")),
    ] {
        let mut command = cancel.clone();
        command[field] = bad;
        h.complete_workflow_task(&task, json!([command])).await.err(409, "invalid_commands");
    }
    let mut tagged = cancel.clone();
    tagged["parallel_group_id"] = json!("select-calls:1:2");
    h.complete_workflow_task(&task, json!([tagged])).await.err(422, "validation_failed");
    // The same cancel twice in one completion (as Python re-sends it) records one marker.
    h.complete_workflow_task(
        &task,
        json!([cancel.clone(), cancel.clone(), {"type": "complete_workflow", "result": env(AVRO_NULL)}]),
    )
    .await
    .ok(200);
    let history = h.history("race", &run_id).await;
    assert_eq!(count_events(&history, "SelectionOperationCancelled"), 1);
    assert_eq!(count_events(&history, "SelectionResolved"), 1);
    assert!(
        h.describe("race").await["open_tasks"].as_array().unwrap().is_empty(),
        "the timer task ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn features_without_server_support_are_refused_not_dropped() {
    let h = Harness::start().await;
    h.register("w1", "q").await;
    h.start_workflow("unsupported", "q").await;
    let task = h.next_workflow_task("w1", "q").await;
    let unknown = json!({"type": "start_nexus_magic", "endpoint_name": "e"});
    let body = h.complete_workflow_task(&task, json!([unknown])).await.err(409, "invalid_commands");
    assert_eq!(body["recorded"], false);
    let stream = json!({"type": "record_side_effect", "result": env(AVRO_NULL),
        "workflow_stream": {"operation": "append", "stream_name": "out", "items": [], "command_identity": "x", "command_ordinal": 0}});
    let refused = h.complete_workflow_task(&task, json!([stream])).await.err(422, "validation_failed");
    assert!(refused["errors"].get("commands.0.workflow_stream.items").is_some(), "{refused}");
    // The task is still leased and completes normally afterwards.
    h.complete_workflow_task(&task, json!([{"type": "complete_workflow", "result": env(AVRO_NULL)}]))
        .await
        .ok(200);
}

fn ledger_call(h: &Harness, method: Method, path: &str, token: &str) -> reqwest::RequestBuilder {
    h.bare(method, path)
        .header(CONTROL_HEADER, "2")
        .header("X-Namespace", "default")
        .bearer_auth(token)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn action_definitions_and_ledger_api_validate_and_enforce_roles() {
    let h = token_harness().await;
    let definition = json!({"recovery_mode": "non_atomic", "verification": {"declared_effects": ["payment"]}});
    // Defining needs admin; reading needs operator.
    send(ledger_call(&h, Method::PUT, "/api/action-definitions/pay", Tokens::OPERATOR).json(&definition))
        .await
        .err(403, "forbidden");
    send(h.bare(Method::GET, "/metrics")).await.err(401, "unauthorized");
    send(h.bare(Method::GET, "/metrics").bearer_auth(Tokens::WORKER))
        .await
        .err(403, "forbidden");
    // Prometheus text, not JSON.
    let scraped = h.bare(Method::GET, "/metrics").bearer_auth(Tokens::OPERATOR).send().await.unwrap();
    assert_eq!(scraped.status().as_u16(), 200);
    let first = send(ledger_call(&h, Method::PUT, "/api/action-definitions/pay", Tokens::ADMIN).json(&definition))
        .await
        .ok(200);
    assert_eq!(first["version"], 1);
    assert_eq!(first["recovery_mode"], "non_atomic");
    let same = send(ledger_call(&h, Method::PUT, "/api/action-definitions/pay", Tokens::ADMIN).json(&definition))
        .await
        .ok(200);
    assert_eq!(
        (same["version"].clone(), same["definition_hash"].clone()),
        (json!(1), first["definition_hash"].clone())
    );
    let changed =
        send(ledger_call(&h, Method::PUT, "/api/action-definitions/pay", Tokens::ADMIN).json(&json!({"recovery_mode": "irreversible"})))
            .await
            .ok(200);
    assert_eq!(changed["version"], 2);
    assert_ne!(changed["definition_hash"], first["definition_hash"]);
    for bad in [
        json!({}),
        json!({"recovery_mode": "sometimes"}),
        json!({"recovery_mode": "atomic", "surprise": 1}),
        json!({"recovery_mode": "atomic", "verification": {"declared_effects": "payment"}}),
        json!({"recovery_mode": "atomic", "poll_interval_seconds": 0}),
    ] {
        send(ledger_call(&h, Method::PUT, "/api/action-definitions/pay", Tokens::ADMIN).json(&bad))
            .await
            .err(422, "validation_failed");
    }
    // No atomic handler is registered in this server: its tasks could never run.
    send(ledger_call(&h, Method::PUT, "/api/action-definitions/pay", Tokens::ADMIN).json(&json!({"recovery_mode": "atomic"})))
        .await
        .err(422, "atomic_handler_missing");
    let shown = send(ledger_call(&h, Method::GET, "/api/action-definitions/pay", Tokens::OPERATOR))
        .await
        .ok(200);
    assert_eq!(shown["version"], 2);
    let listed = send(ledger_call(&h, Method::GET, "/api/action-definitions", Tokens::OPERATOR))
        .await
        .ok(200);
    assert_eq!(listed["action_definitions"].as_array().unwrap().len(), 1);
    send(ledger_call(&h, Method::GET, "/api/action-definitions/nope", Tokens::OPERATOR))
        .await
        .err(404, "action_definition_not_found");

    // Listing and resolving.
    let entries = send(ledger_call(&h, Method::GET, "/api/ledger?state=outcome_unknown", Tokens::OPERATOR))
        .await
        .ok(200);
    assert_eq!(entries["entries"], json!([]));
    send(ledger_call(&h, Method::GET, "/api/ledger?state=lost", Tokens::OPERATOR))
        .await
        .err(422, "validation_failed");
    send(ledger_call(&h, Method::GET, "/api/ledger?limit=0", Tokens::OPERATOR))
        .await
        .err(422, "validation_failed");
    send(ledger_call(&h, Method::GET, "/api/ledger/nope", Tokens::OPERATOR))
        .await
        .err(404, "ledger_entry_not_found");
    let resolve = json!({"decision": "effect_absent", "evidence": {"note": "n"}});
    send(ledger_call(&h, Method::POST, "/api/ledger/nope/resolve", Tokens::OPERATOR).json(&resolve))
        .await
        .err(403, "forbidden");
    send(ledger_call(&h, Method::POST, "/api/ledger/nope/resolve", Tokens::ADMIN).json(&resolve))
        .await
        .err(404, "ledger_entry_not_found");
    for bad in [
        json!({"decision": "effect_absent"}),
        json!({"decision": "effect_absent", "evidence": {}}),
        json!({"decision": "maybe", "evidence": {"note": "n"}}),
        json!({"decision": "effect_absent", "evidence": {"note": "n"}, "result": 5}),
    ] {
        send(ledger_call(&h, Method::POST, "/api/ledger/nope/resolve", Tokens::ADMIN).json(&bad))
            .await
            .err(422, "validation_failed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_action_is_ledgered_at_dispatch_and_blocks_until_resolved() {
    let h = Harness::start().await;
    h.cpost_method(
        Method::PUT,
        "/api/action-definitions/charge",
        json!({"recovery_mode": "non_atomic"}),
    )
    .await
    .ok(200);
    h.register("w1", "q").await;
    let run_id = h.start_workflow("charged", "q").await["run_id"].as_str().unwrap().to_string();
    let task = h.next_workflow_task("w1", "q").await;
    h.complete_workflow_task(
        &task,
        json!([{"type": "schedule_activity", "activity_type": "charge", "arguments": env(EMPTY_ARGS)}]),
    )
    .await
    .ok(200);
    let attempt = h.next_activity_task("w1", "q").await;
    let entries = h.cget("/api/ledger?workflow_id=charged").await.ok(200)["entries"].clone();
    assert_eq!(entries[0]["state"], "dispatched", "committed before the worker saw the task");
    assert_eq!(entries[0]["activity_attempt_id"], attempt["activity_attempt_id"]);
    h.fail_activity(&attempt, "lost the connection").await.ok(200);
    let described = h.describe("charged").await;
    let key = described["blocked_by"]["ledger_key"].as_str().unwrap().to_string();
    assert_eq!(described["ledger"][0]["state"], "outcome_unknown");
    h.cpost("/api/workflows/charged/repair", json!({}))
        .await
        .err(409, "outcome_unknown_requires_resolution");
    let metrics = scrape(&h).await;
    assert!(
        metric_line(&metrics, "capstan_ledger_entries", &["state=\"outcome_unknown\""], "1"),
        "{metrics}"
    );
    assert!(
        metric_line(
            &metrics,
            "capstan_ledger_outcome_unknown_oldest_age_seconds",
            &["namespace=\"default\""],
            "0"
        ),
        "{metrics}"
    );
    assert!(h.poll_activity("w1", "q", 1).await.is_null(), "no automatic retry");
    let resolved = h
        .cpost(
            &format!("/api/ledger/{key}/resolve"),
            json!({"decision": "effect_confirmed", "evidence": {"ref": "tx-1"}, "result": {"ok": true}}),
        )
        .await
        .ok(200);
    assert_eq!(resolved["state"], "effect_confirmed");
    h.cpost(
        &format!("/api/ledger/{key}/resolve"),
        json!({"decision": "effect_absent", "evidence": {"ref": "tx-1"}}),
    )
    .await
    .err(409, "ledger_entry_not_unknown");
    let history = h.history("charged", &run_id).await;
    let completed = history.iter().find(|e| e["event_type"] == "ActivityCompleted").unwrap();
    assert_eq!(completed["payload"]["ledger_key"], key.as_str());
    assert!(h.describe("charged").await["blocked_by"].is_null());
    let metrics = scrape(&h).await;
    assert!(
        metric_line(
            &metrics,
            "capstan_ledger_resolutions_total",
            &["decision=\"effect_confirmed\""],
            "1"
        ),
        "{metrics}"
    );
    assert!(
        metric_line(&metrics, "capstan_ledger_entries", &["state=\"effect_confirmed\""], "1"),
        "{metrics}"
    );
    let shown = h.cget(&format!("/api/ledger/{key}")).await.ok(200);
    assert_eq!(shown["chain_verified"], true);
    assert_eq!(shown["checkpoints"].as_array().unwrap().len(), 3);
}

async fn scrape(h: &Harness) -> String {
    let response = h.http.get(h.url("/metrics")).send().await.expect("scrape");
    assert_eq!(response.status().as_u16(), 200);
    assert!(response
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("text/plain")));
    response.text().await.expect("metrics text")
}

/// Whether the exposition has a sample of `name` carrying every label in `labels` with `value`.
fn metric_line(text: &str, name: &str, labels: &[&str], value: &str) -> bool {
    text.lines().any(|line| {
        line.starts_with(&format!("{name}{{")) && labels.iter().all(|l| line.contains(l)) && line.ends_with(&format!(" {value}"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_report_after_an_unknown_outcome_is_refused_but_kept_as_evidence() {
    let h = Harness::start().await;
    h.cpost_method(
        Method::PUT,
        "/api/action-definitions/charge",
        json!({"recovery_mode": "non_atomic"}),
    )
    .await
    .ok(200);
    h.register("w1", "q").await;
    h.start_workflow("late", "q").await;
    let task = h.next_workflow_task("w1", "q").await;
    h.complete_workflow_task(
        &task,
        json!([{"type": "schedule_activity", "activity_type": "charge", "arguments": env(EMPTY_ARGS), "start_to_close_timeout": 1}]),
    )
    .await
    .ok(200);
    let attempt = h.next_activity_task("w1", "q").await;
    // The attempt times out: its outcome is unknown.
    let key = wait_for("the unknown outcome", Duration::from_secs(10), || async {
        let described = h.describe("late").await;
        described["blocked_by"]["ledger_key"].as_str().map(str::to_string)
    })
    .await;
    // The worker was slow, not dead: its result arrives after the lease is gone.
    h.complete_activity(&attempt, AVRO_NULL)
        .await
        .err_one_of(409, &["attempt_closed", "lease_expired", "task_not_leased"]);
    let entry = h.cget(&format!("/api/ledger/{key}")).await.ok(200);
    assert_eq!(entry["state"], "outcome_unknown", "the refusal stands");
    assert_eq!(entry["late_reports"][0]["report"], "completed");
    assert!(entry["late_reports"][0]["result_hash"].is_string());
    assert_eq!(entry["chain_verified"], true);
    let history = h.history("late", h.describe("late").await["run_id"].as_str().unwrap()).await;
    assert_eq!(count_events(&history, "ActivityCompleted"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespace_routes_validate_and_enforce_roles() {
    let h = token_harness().await;
    let listed = send(ledger_call(&h, Method::GET, "/api/namespaces", Tokens::OPERATOR))
        .await
        .ok(200);
    assert_eq!(listed["namespaces"][0]["name"], "default");
    send(ledger_call(&h, Method::POST, "/api/namespaces", Tokens::OPERATOR).json(&json!({"name": "team"})))
        .await
        .err(403, "forbidden");
    send(h.bare(Method::GET, "/api/namespaces").bearer_auth(Tokens::OPERATOR))
        .await
        .err(400, "missing_control_plane_version");
    for bad in [
        json!({}),
        json!({"name": "has space"}),
        json!({"name": "t", "retention_days": 0}),
        json!({"name": "t", "retention_days": 366}),
    ] {
        send(ledger_call(&h, Method::POST, "/api/namespaces", Tokens::ADMIN).json(&bad))
            .await
            .err(422, "validation_failed");
    }
    // The namespace in the path need not be the X-Namespace, which need not exist here.
    let created = send(
        h.bare(Method::POST, "/api/namespaces")
            .header(CONTROL_HEADER, "2")
            .header("X-Namespace", "not-yet")
            .bearer_auth(Tokens::ADMIN)
            .json(&json!({"name": "Team-A", "retention_days": 30})),
    )
    .await
    .ok(201);
    assert_eq!(
        (created["name"].clone(), created["retention_days"].clone()),
        (json!("team-a"), json!(30))
    );
    send(ledger_call(&h, Method::POST, "/api/namespaces", Tokens::ADMIN).json(&json!({"name": "team-a"})))
        .await
        .err(409, "namespace_already_exists");
    send(ledger_call(&h, Method::GET, "/api/namespaces/nope", Tokens::OPERATOR))
        .await
        .err(404, "namespace_not_found");
    send(ledger_call(&h, Method::PUT, "/api/namespaces/nope", Tokens::ADMIN).json(&json!({"retention_days": 3})))
        .await
        .err(404, "namespace_not_found");
    send(ledger_call(&h, Method::DELETE, "/api/namespaces/default", Tokens::ADMIN))
        .await
        .err(409, "namespace_not_empty");
    let deleted = send(ledger_call(&h, Method::DELETE, "/api/namespaces/team-a", Tokens::ADMIN))
        .await
        .ok(200);
    assert_eq!(deleted["deleted"]["namespaces"], 1);
}

/// Counts its calls and always refuses: an atomic attempt that fails is an ordinary failed
/// attempt, retried under the activity's policy by the server's own executor.
struct AlwaysRefuses(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl capstan_server::AtomicAction for AlwaysRefuses {
    fn run(&self, tx: &mut dyn capstan_server::AtomicTransaction, _: &Value) -> Result<Value, String> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // Writes, then refuses (MySQL refuses DDL in a handler, so there the writes fail first;
        // the refusal below is what the attempt reports either way).
        let _ = tx.execute("CREATE TABLE IF NOT EXISTS refused_writes (n INTEGER)", &[]);
        let _ = tx.execute("INSERT INTO refused_writes (n) VALUES (1)", &[]);
        Err("the books do not balance".into())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomic_actions_run_in_the_server_and_fail_like_ordinary_attempts() {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let config = ServerConfig {
        atomic_actions: capstan_server::AtomicActions::new([(
            "books.close".to_string(),
            std::sync::Arc::new(AlwaysRefuses(calls.clone())) as std::sync::Arc<dyn capstan_server::AtomicAction>,
        )]),
        ..ServerConfig::default()
    };
    let h = Harness::with_config(config, None).await;
    // A type with a handler may be declared atomic; one without may not.
    h.cpost_method(
        Method::PUT,
        "/api/action-definitions/books.close",
        json!({"recovery_mode": "atomic"}),
    )
    .await
    .ok(200);
    h.cpost_method(
        Method::PUT,
        "/api/action-definitions/books.open",
        json!({"recovery_mode": "atomic"}),
    )
    .await
    .err(422, "atomic_handler_missing");
    let queue = unique("atomic-q");
    h.register("w", &queue).await;
    h.start_workflow("closing", &queue).await;
    let task = h.next_workflow_task("w", &queue).await;
    let mut command = schedule_activity("books.close", &queue);
    command["retry_policy"] = json!({"max_attempts": 3, "backoff_seconds": [0], "non_retryable_error_types": []});
    h.complete_workflow_task(&task, json!([command])).await.ok(200);
    // The server runs it; the workflow worker is woken by the final failure.
    let resumed = h.next_workflow_task("w", &queue).await;
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        3,
        "one call per attempt, none after the last"
    );
    let run_id = resumed["run_id"].as_str().unwrap().to_string();
    let events = h.history("closing", &run_id).await;
    assert_eq!(count_events(&events, "ActivityRetryScheduled"), 2);
    assert_eq!(count_events(&events, "ActivityFailed"), 1);
    assert!(events.iter().any(|e| e.to_string().contains("the books do not balance")));
    // No worker ever sees it.
    assert!(h.poll_activity("w", &queue, 1).await["task"].is_null());
    let ledger = h.cget("/api/ledger?workflow_id=closing").await.ok(200);
    assert_eq!(
        ledger["entries"],
        json!([]),
        "atomic steps are not ledgered: they cannot be unknown"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_routes_validate_and_answer_in_dw_shapes() {
    let h = Harness::start().await;
    let action = json!({"workflow_type": "nightly", "task_queue": "q"});
    for (body, reason, field) in [
        (json!({"action": action}), "validation_failed", "spec"),
        (json!({"spec": {"intervals": [{"every": "PT1H"}]}}), "validation_failed", "action"),
        (json!({"spec": {}, "action": action}), "validation_failed", "spec"),
        (
            json!({"spec": {"cron_expressions": ["61 * * * *"]}, "action": action}),
            "invalid_cron_expression",
            "spec.cron_expressions",
        ),
        (
            json!({"spec": {"intervals": [{"every": "often"}]}, "action": action}),
            "invalid_schedule_spec",
            "spec.intervals.0.every",
        ),
        (
            json!({"spec": {"cron_expressions": ["@daily"], "timezone": "Nowhere/Land"}, "action": action}),
            "invalid_schedule_spec",
            "spec.timezone",
        ),
        (
            json!({"spec": {"cron_expressions": ["@daily"]}, "action": {"task_queue": "q"}}),
            "validation_failed",
            "action.workflow_type",
        ),
        (
            json!({"spec": {"cron_expressions": ["@daily"]}, "action": action, "overlap_policy": "sometimes"}),
            "validation_failed",
            "overlap_policy",
        ),
        (
            json!({"spec": {"cron_expressions": ["@daily"]}, "action": action, "jitter_seconds": 3601}),
            "validation_failed",
            "jitter_seconds",
        ),
        (
            json!({"spec": {"cron_expressions": ["@daily"]}, "action": action, "max_runs": 0}),
            "validation_failed",
            "max_runs",
        ),
    ] {
        let refused = h.cpost("/api/schedules", body.clone()).await.err(422, reason);
        assert!(refused["errors"].get(field).is_some(), "{body}: {refused}");
    }
    let created = h
        .cpost(
            "/api/schedules",
            json!({"schedule_id": "nightly", "spec": {"cron_expressions": ["0 3 * * *"], "timezone": "Europe/Paris"},
                   "action": action, "paused": true, "note": "starts paused", "max_runs": 5}),
        )
        .await
        .ok(201);
    assert_eq!(created, json!({"schedule_id": "nightly", "outcome": "created"}));
    h.cpost(
        "/api/schedules",
        json!({"schedule_id": "nightly", "spec": {"cron_expressions": ["@daily"]}, "action": action}),
    )
    .await
    .err(409, "schedule_already_exists");
    let described = h.cget("/api/schedules/nightly").await.ok(200);
    assert_eq!(
        (described["status"].as_str(), described["paused"].as_bool()),
        (Some("paused"), Some(true))
    );
    assert_eq!(described["remaining_actions"], 5);
    assert_eq!(described["state"]["note"], "starts paused");
    assert!(
        described["next_fire_at"].as_str().unwrap().contains("T01:00:00")
            || described["next_fire_at"].as_str().unwrap().contains("T02:00:00"),
        "03:00 in Paris is 01:00 or 02:00 UTC: {}",
        described["next_fire_at"]
    );
    h.cget("/api/schedules/nope").await.err(404, "schedule_not_found");
    h.cpost("/api/schedules/nope/pause", json!({})).await.err(404, "schedule_not_found");
    h.cpost_method(
        Method::PUT,
        "/api/schedules/nightly",
        json!({"spec": {"cron_expressions": ["nope"]}}),
    )
    .await
    .err(422, "invalid_cron_expression");
    h.cget("/api/schedules?query=Status%3D%22active%22")
        .await
        .err(422, "unsupported_schedule_list_filter");
    h.cget("/api/schedules?page_size=0").await.err(422, "validation_failed");
    h.cget("/api/schedules?next_page_token=%25%25")
        .await
        .err(400, "malformed_schedule_page_token");
    h.cget("/api/schedules/nightly/history?after_sequence=-1")
        .await
        .err(422, "invalid_after_sequence");
    h.cpost(
        "/api/schedules/nightly/backfill",
        json!({"start_time": "2026-01-02T00:00:00Z", "end_time": "2026-01-01T00:00:00Z"}),
    )
    .await
    .err(422, "invalid_time_range");
    h.cpost_method(
        Method::PUT,
        "/api/schedules/nightly",
        json!({"spec": {"intervals": [{"every": "PT1S"}]}}),
    )
    .await
    .ok(200);
    h.cpost(
        "/api/schedules/nightly/backfill",
        json!({"start_time": "2026-01-01T00:00:00Z", "end_time": "2026-01-02T00:00:00Z"}),
    )
    .await
    .err(422, "backfill_too_large");
    // Paging: three schedules, pages of two.
    for id in ["page-a", "page-b"] {
        h.cpost(
            "/api/schedules",
            json!({"schedule_id": id, "spec": {"cron_expressions": ["@daily"]}, "action": action}),
        )
        .await
        .ok(201);
    }
    let first = h.cget("/api/schedules?page_size=2").await.ok(200);
    assert_eq!(first["schedules"].as_array().unwrap().len(), 2);
    let token = first["next_page_token"].as_str().unwrap().to_string();
    let second = h.cget(&format!("/api/schedules?page_size=2&next_page_token={token}")).await.ok(200);
    assert_eq!(second["schedules"].as_array().unwrap().len(), 1);
    assert!(second["next_page_token"].is_null());
    h.cget(&format!("/api/schedules?page_size=2&status=paused&next_page_token={token}"))
        .await
        .err(409, "schedule_page_token_filter_mismatch");
    let paused_only = h.cget("/api/schedules?status=paused").await.ok(200);
    assert_eq!(paused_only["schedules"].as_array().unwrap().len(), 1);
    // Delete: gone from every route but history.
    h.cpost_method(Method::DELETE, "/api/schedules/nightly", json!({})).await.ok(200);
    h.cget("/api/schedules/nightly").await.err(404, "schedule_not_found");
    let history = h.cget("/api/schedules/nightly/history?limit=2").await.ok(200);
    assert_eq!(history["events"].as_array().unwrap().len(), 2);
    assert_eq!(
        (history["has_more"].as_bool(), history["next_cursor"].as_i64()),
        (Some(true), Some(2))
    );
    let rest = h.cget("/api/schedules/nightly/history?after_sequence=2").await.ok(200);
    let types: Vec<&str> = rest["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["ScheduleUpdated", "ScheduleDeleted"]);
    h.cget("/api/schedules/never/history").await.err(404, "schedule_not_found");
}

/// An entry left unknown by a run that continued as new is resolved after the new run has
/// extended the instance's checkpoint chain: the resolution must extend the chain's tip, not fork
/// it from the closed run's stale head, and a second resolution is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolving_an_earlier_runs_entry_extends_the_one_instance_chain() {
    let h = Harness::start().await;
    h.cpost_method(
        Method::PUT,
        "/api/action-definitions/charge",
        json!({"recovery_mode": "non_atomic"}),
    )
    .await
    .ok(200);
    let queue = unique("ledger-can");
    h.register("w", &queue).await;
    h.start_workflow("checkout", &queue).await;
    // Run 1 dispatches the declared action, then continues as new while it is in flight.
    let task = h.next_workflow_task("w", &queue).await;
    h.complete_workflow_task(&task, json!([schedule_activity("charge", &queue)]))
        .await
        .ok(200);
    let dispatched = h.next_activity_task("w", &queue).await;
    h.cpost("/api/workflows/checkout/signal/go", json!({})).await.ok(202);
    let task = h.next_workflow_task("w", &queue).await;
    h.complete_workflow_task(&task, json!([{"type": "continue_as_new"}])).await.ok(200);
    let unknown = h.cget("/api/ledger?state=outcome_unknown&workflow_id=checkout").await.ok(200);
    let earlier = unknown["entries"][0].clone();
    assert_eq!(earlier["run_id"], dispatched["run_id"], "{unknown}");
    // Run 2 dispatches the action again: its checkpoint extends the chain.
    let task = h.next_workflow_task("w", &queue).await;
    assert_ne!(task["run_id"], dispatched["run_id"]);
    h.complete_workflow_task(&task, json!([schedule_activity("charge", &queue)]))
        .await
        .ok(200);
    h.next_activity_task("w", &queue).await;
    let key = earlier["ledger_key"].as_str().unwrap().to_string();
    // The lost worker reports late: refused, but attached to run 1's entry as evidence.
    let late = h.complete_activity(&dispatched, EMPTY_ARGS).await;
    assert!(late.status.is_client_error(), "{:?}", late.status);
    let shown = h.cget(&format!("/api/ledger/{key}")).await.ok(200);
    assert_eq!(shown["late_reports"].as_array().map(Vec::len), Some(1), "{shown}");
    let resolve = json!({"decision": "effect_absent", "evidence": {"note": "the provider has no record"}});
    let resolved = h.cpost(&format!("/api/ledger/{key}/resolve"), resolve.clone()).await.ok(200);
    assert_eq!(resolved["state"], "effect_absent");
    h.cpost(&format!("/api/ledger/{key}/resolve"), resolve)
        .await
        .err(409, "ledger_entry_not_unknown");
    // One line, no fork: the offline verifier walks it from genesis.
    let report = h.verify_offline().await;
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(
        report.checkpoints_checked, 5,
        "dispatch, unknown, second dispatch, late report, resolution"
    );
}

/// Every route family × every role, as DW maps them: the worker plane is for workers only;
/// cluster info for anyone authenticated; the control plane for operators and admins; defining,
/// deleting and the system duties for admins. No token or a wrong one is 401 everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_family_checks_its_roles() {
    let h = token_harness().await;
    const W: u8 = 1;
    const O: u8 = 2;
    const A: u8 = 4;
    let families: &[(Method, &str, Value, u8)] = &[
        (
            Method::POST,
            "/api/worker/register",
            json!({"task_queue": "q", "runtime": "python"}),
            W,
        ),
        (Method::POST, "/api/worker/heartbeat", json!({"worker_id": "nobody"}), W),
        (Method::GET, "/api/cluster/info", json!(null), W | O | A),
        (Method::GET, "/api/workflows", json!(null), O | A),
        (Method::GET, "/api/workflows/nobody/audit-events", json!(null), O | A),
        (Method::POST, "/api/workflows/nobody/pause", json!({}), O | A),
        (Method::POST, "/api/task-queues/q/resume", json!({}), O | A),
        (Method::GET, "/api/batch-operations", json!(null), O | A),
        (Method::POST, "/api/workflows/nobody/runs/r/resume", json!({}), O | A),
        (
            Method::POST,
            "/api/workflows",
            json!({"workflow_type": "t", "task_queue": "q"}),
            O | A,
        ),
        (Method::GET, "/api/schedules", json!(null), O | A),
        (Method::GET, "/api/task-queues", json!(null), O | A),
        (Method::GET, "/api/workers", json!(null), O | A),
        (Method::DELETE, "/api/workers/nobody", json!(null), A),
        (Method::GET, "/api/namespaces", json!(null), O | A),
        (Method::POST, "/api/namespaces", json!({"name": "roles-ns"}), A),
        (Method::GET, "/api/action-definitions", json!(null), O | A),
        (Method::PUT, "/api/action-definitions/x", json!({"recovery_mode": "non_atomic"}), A),
        (Method::GET, "/api/ledger", json!(null), O | A),
        (Method::GET, "/api/integrity-incidents", json!(null), O | A),
        (
            Method::POST,
            "/api/bridge-adapters/webhook/github",
            json!({"action": "x", "idempotency_key": "k", "target": {}}),
            O | A,
        ),
        (Method::GET, "/api/search-attributes", json!(null), O | A),
        (Method::GET, "/api/task-queues/q/build-ids", json!(null), O | A),
        (Method::GET, "/api/auth/credentials", json!(null), A),
        (
            Method::POST,
            "/api/auth/credentials",
            json!({"principal": "roles-matrix", "roles": ["worker"]}),
            A,
        ),
        (Method::GET, "/api/system/metrics", json!(null), A),
        (Method::GET, "/api/system/retention", json!(null), A),
        (Method::POST, "/api/system/repair/pass", json!({}), A),
        (Method::GET, "/api/system/run-counts", json!(null), A),
        (Method::GET, "/metrics", json!(null), O | A),
    ];
    let worker_plane = |path: &str| path.starts_with("/api/worker/");
    for (method, path, body, allowed) in families {
        for (token, role) in [
            (None, 0),
            (Some("wrong-token"), 0),
            (Some(Tokens::WORKER), W),
            (Some(Tokens::OPERATOR), O),
            (Some(Tokens::ADMIN), A),
        ] {
            let mut request = h.bare(method.clone(), path);
            request = if worker_plane(path) {
                request.header("X-Durable-Workflow-Protocol-Version", "1.20")
            } else {
                request.header(CONTROL_HEADER, "2")
            };
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            if !body.is_null() {
                request = request.json(body);
            }
            let answer = send(request).await;
            let status = answer.status.as_u16();
            let expected = if role == 0 {
                "401"
            } else if allowed & role != 0 {
                "allowed"
            } else {
                "403"
            };
            match expected {
                "401" => assert_eq!(
                    (status, answer.body["reason"].as_str()),
                    (401, Some("unauthorized")),
                    "{method} {path} token {token:?}"
                ),
                "403" => assert_eq!(
                    (status, answer.body["reason"].as_str()),
                    (403, Some("forbidden")),
                    "{method} {path} token {token:?}"
                ),
                _ => assert!(
                    status != 401 && status != 403 && status < 500,
                    "{method} {path} token {token:?}: {status} {}",
                    answer.body
                ),
            }
        }
        // The shared token acts as every role.
        let mut request = h.bare(method.clone(), path).bearer_auth(Tokens::SHARED);
        request = if worker_plane(path) {
            request.header("X-Durable-Workflow-Protocol-Version", "1.20")
        } else {
            request.header(CONTROL_HEADER, "2")
        };
        if !body.is_null() {
            request = request.json(body);
        }
        let status = send(request).await.status.as_u16();
        assert!(status != 401 && status != 403, "{method} {path} with the shared token: {status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_search_attributes_are_defined_validated_and_queried() {
    let h = Harness::start().await;
    for (name, kind) in [
        ("Tier", "keyword"),
        ("Amount", "int"),
        ("Score", "double"),
        ("Vip", "bool"),
        ("DueAt", "datetime"),
        ("Tags", "keyword_list"),
    ] {
        let created = h.cpost("/api/search-attributes", json!({"name": name, "type": kind})).await.ok(201);
        assert_eq!((created["name"].as_str(), created["type"].as_str()), (Some(name), Some(kind)));
    }
    h.cpost("/api/search-attributes", json!({"name": "Tier", "type": "text"}))
        .await
        .err(409, "search_attribute_already_exists");
    h.cpost("/api/search-attributes", json!({"name": "WorkflowId", "type": "keyword"}))
        .await
        .err(409, "search_attribute_reserved");
    for bad in [
        json!({"name": "wf_id", "type": "keyword"}),
        json!({"name": "__internal", "type": "keyword"}),
        json!({"name": "Ok", "type": "blob"}),
    ] {
        h.cpost("/api/search-attributes", bad).await.err(422, "validation_failed");
    }
    let schema = h.cget("/api/search-attributes").await.ok(200);
    assert_eq!(schema["custom_attributes"]["Tags"], "keyword_list");
    assert_eq!(schema["system_attributes"]["WorkflowType"], "keyword");
    // Undefined keys and wrong-typed values are refused at start; nothing is recorded.
    let queue = unique("typed-sa");
    let start = |id: &str, attributes: Value| json!({"workflow_type": "t", "workflow_id": id, "task_queue": queue, "search_attributes": attributes});
    h.start_workflow_with(start("sa-undefined", json!({"Nope": "x"})))
        .await
        .err(422, "unknown_search_attribute");
    h.start_workflow_with(start("sa-wrong", json!({"Amount": "ten"})))
        .await
        .err(422, "invalid_search_attribute_value");
    h.cget("/api/workflows/sa-undefined").await.err(404, "instance_not_found");
    let runs = [
        (
            "sa-1",
            json!({"Tier": "gold", "Amount": 5, "Score": 1.5, "Vip": true, "DueAt": "2026-01-01T00:00:00Z", "Tags": ["red", "blue"]}),
        ),
        (
            "sa-2",
            json!({"Tier": "silver", "Amount": 50, "Score": 9.0, "Vip": false, "DueAt": "2026-06-01T00:00:00Z", "Tags": ["blue", "red"]}),
        ),
        ("sa-3", json!({"Tier": "bronze", "Amount": 500, "Vip": false, "Tags": ["green"]})),
    ];
    for (id, attributes) in &runs {
        h.start_workflow_with(start(id, attributes.clone())).await.ok(201);
    }
    let query = |q: &str| {
        let path = format!("/api/workflows?query={}", urlencode(q));
        let h = &h;
        async move { h.cget(&path).await }
    };
    let ids = |body: Value| -> Vec<String> {
        let mut ids: Vec<String> = body["workflows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["workflow_id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };
    for (q, expected) in [
        ("Amount > 10", vec!["sa-2", "sa-3"]),
        ("Amount >= 5 AND Amount < 500", vec!["sa-1", "sa-2"]),
        ("Score <= 1.5", vec!["sa-1"]),
        ("Vip = true", vec!["sa-1"]),
        ("NOT Vip = true", vec!["sa-2", "sa-3"]),
        (r#"Tier = "gold" OR Tier = 'bronze'"#, vec!["sa-1", "sa-3"]),
        (r#"Tier IN ("silver", "bronze") AND NOT Amount = 500"#, vec!["sa-2"]),
        (r#"Tags = "red""#, vec!["sa-1", "sa-2"]),
        (r#"Tags != "red""#, vec!["sa-3"]),
        (r#"DueAt > "2026-03-01T00:00:00Z""#, vec!["sa-2"]),
        (r#"(Tier = "gold" OR Tier = "silver") AND Vip = false"#, vec!["sa-2"]),
        (
            r#"WorkflowType = "t" AND StartTime > "2020-01-01T00:00:00Z" AND Amount = 5"#,
            vec!["sa-1"],
        ),
    ] {
        assert_eq!(ids(query(q).await.ok(200)), expected, "{q}");
    }
    for (q, reason) in [
        (r#"Amount = "ten""#, "invalid_visibility_query"),
        ("Vip = 1", "invalid_visibility_query"),
        ("Vip > false", "invalid_visibility_query"),
        (r#"Nope = "x""#, "unknown_search_attribute"),
        (r#"Tier = "gold" OR 1=1"#, "invalid_visibility_query"),
        (r#"Tier = "gold"; DROP TABLE runs"#, "invalid_visibility_query"),
        (r#"Tier = "gold" -- x"#, "invalid_visibility_query"),
    ] {
        query(q).await.err(422, reason);
    }
    // An upsert from workflow code with an undefined key is refused before anything is recorded.
    h.register("w", &queue).await;
    let task = h.next_workflow_task("w", &queue).await;
    let upsert = json!([{"type": "upsert_search_attributes", "attributes": {"Undefined": 1}}]);
    h.complete_workflow_task(&task, upsert).await.err(422, "unknown_search_attribute");
    let upsert = json!([{"type": "upsert_search_attributes", "attributes": {"Amount": 7}}]);
    h.complete_workflow_task(&task, upsert).await.ok(200);
    assert_eq!(ids(query("Amount = 7").await.ok(200)).len(), 1);
    // Definitions can be removed; system ones cannot.
    h.cpost_method(Method::DELETE, "/api/search-attributes/Score", json!({}))
        .await
        .ok(200);
    h.cpost_method(Method::DELETE, "/api/search-attributes/Score", json!({}))
        .await
        .err(404, "search_attribute_not_found");
    h.cpost_method(Method::DELETE, "/api/search-attributes/RunId", json!({}))
        .await
        .err(409, "search_attribute_reserved");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_build_id_gets_no_new_work_until_resumed() {
    let h = Harness::start().await;
    let queue = unique("rollout");
    for (worker, build) in [("old", "v1"), ("new", "v2")] {
        h.wpost(
            "/api/worker/register",
            json!({"worker_id": worker, "task_queue": queue, "runtime": "rust", "build_id": build}),
        )
        .await
        .ok(201);
    }
    let drained = h
        .cpost(&format!("/api/task-queues/{queue}/build-ids/drain"), json!({"build_id": "v1"}))
        .await
        .ok(200);
    assert_eq!(
        (drained["build_id"].as_str(), drained["drain_intent"].as_str()),
        (Some("v1"), Some("draining"))
    );
    let again = h
        .cpost(&format!("/api/task-queues/{queue}/build-ids/drain"), json!({"build_id": "v1"}))
        .await
        .ok(200);
    assert_eq!(
        again["drained_at"], drained["drained_at"],
        "a repeated drain keeps the first drained_at"
    );
    h.start_workflow("rollout-wf", &queue).await;
    // The draining cohort's poll is held and answered empty, though a task is ready…
    let held = h
        .poll_workflow_with(json!({"worker_id": "old", "task_queue": queue, "timeout_seconds": 1}))
        .await
        .ok(200);
    assert_eq!(
        (held["task"].clone(), held["poll_status"].as_str()),
        (Value::Null, Some("draining"))
    );
    // …which the other cohort gets, and describe says why nothing else would.
    let cohorts = h.cget(&format!("/api/task-queues/{queue}/build-ids")).await.ok(200);
    let v1 = cohorts["build_ids"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["build_id"] == "v1")
        .unwrap()
        .clone();
    assert_eq!(
        (v1["drain_intent"].as_str(), v1["draining_worker_count"].as_i64()),
        (Some("draining"), Some(1))
    );
    let roster = h.cget(&format!("/api/workers?task_queue={queue}&status=draining")).await.ok(200);
    assert_eq!(roster["workers"].as_array().unwrap().len(), 1);
    let task = h.next_workflow_task("new", &queue).await;
    assert_eq!(task["workflow_id"], "rollout-wf");
    h.complete_workflow_task(&task, json!([complete_workflow(AVRO_NULL)])).await.ok(200);
    // With every live worker draining, the queue's backlog is diagnosed.
    h.cpost(&format!("/api/task-queues/{queue}/build-ids/drain"), json!({"build_id": "v2"}))
        .await
        .ok(200);
    h.start_workflow("rollout-wf-2", &queue).await;
    let described = h.cget(&format!("/api/task-queues/{queue}")).await.ok(200);
    assert_eq!(described["diagnostics"][0]["reason"], "no_compatible_worker", "{described}");
    // Resumed, the old cohort takes work again.
    let resumed = h
        .cpost(&format!("/api/task-queues/{queue}/build-ids/resume"), json!({"build_id": "v1"}))
        .await
        .ok(200);
    assert_eq!(
        (resumed["drain_intent"].as_str(), resumed["drained_at"].clone()),
        (Some("active"), Value::Null)
    );
    let task = h.next_workflow_task("old", &queue).await;
    assert_eq!(task["workflow_id"], "rollout-wf-2");
    h.cpost(&format!("/api/task-queues/{queue}/build-ids/drain"), json!({"build_id": 7}))
        .await
        .err(422, "validation_failed");
}

/// A second namespace sees nothing of the first and cannot change it: workflows (describe,
/// list, signal, cancel, terminate), schedules, search-attribute definitions, workers and task
/// queues. Every answer is the same not-found a truly absent id gets, so nothing leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_resource_is_isolated_by_namespace() {
    let h = Harness::start().await;
    h.cpost("/api/namespaces", json!({"name": "tenant-b"})).await.ok(201);
    let queue = unique("iso-q");
    h.register("iso-worker", &queue).await;
    h.start_workflow("iso-wf", &queue).await;
    h.cpost("/api/search-attributes", json!({"name": "Tenant", "type": "keyword"}))
        .await
        .ok(201);
    h.cpost(
        "/api/schedules",
        json!({"schedule_id": "iso-sched", "spec": {"cron_expressions": ["@daily"]}, "action": {"workflow_type": "t"}}),
    )
    .await
    .ok(201);
    let b = |method: Method, path: &str| h.bare(method, path).header(CONTROL_HEADER, "2").header("X-Namespace", "tenant-b");
    // The same not-found as an id that exists nowhere.
    let absent = send(b(Method::GET, "/api/workflows/never-existed"))
        .await
        .err(404, "instance_not_found");
    let hidden = send(b(Method::GET, "/api/workflows/iso-wf")).await.err(404, "instance_not_found");
    assert_eq!(absent["message"], hidden["message"]);
    for (method, path) in [
        (Method::POST, "/api/workflows/iso-wf/signal/go"),
        (Method::POST, "/api/workflows/iso-wf/cancel"),
        (Method::POST, "/api/workflows/iso-wf/terminate"),
    ] {
        send(b(method, path).json(&json!({}))).await.err(404, "instance_not_found");
    }
    assert_eq!(send(b(Method::GET, "/api/workflows")).await.ok(200)["workflows"], json!([]));
    send(b(Method::GET, "/api/schedules/iso-sched"))
        .await
        .err(404, "schedule_not_found");
    assert_eq!(send(b(Method::GET, "/api/schedules")).await.ok(200)["schedules"], json!([]));
    assert_eq!(
        send(b(Method::GET, "/api/search-attributes")).await.ok(200)["custom_attributes"],
        json!({})
    );
    send(b(Method::GET, "/api/workflows?query=Tenant%20%3D%20%22a%22"))
        .await
        .err(422, "unknown_search_attribute");
    assert_eq!(send(b(Method::GET, "/api/workers")).await.ok(200)["workers"], json!([]));
    send(b(Method::GET, "/api/workers/iso-worker")).await.err(404, "worker_not_found");
    assert_eq!(send(b(Method::GET, "/api/task-queues")).await.ok(200)["task_queues"], json!([]));
    // The first namespace is untouched.
    let status = h.describe("iso-wf").await["status"].as_str().unwrap().to_string();
    assert!(matches!(status.as_str(), "pending" | "running" | "waiting"), "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_pinned_to_a_build_goes_only_to_workers_of_that_build() {
    let h = Harness::start().await;
    let queue = unique("pinned");
    for (worker, build) in [("w-v1", "v1"), ("w-v2", "v2")] {
        h.wpost(
            "/api/worker/register",
            json!({"worker_id": worker, "task_queue": queue, "runtime": "rust", "build_id": build}),
        )
        .await
        .ok(201);
    }
    h.start_workflow_with(json!({"workflow_type": "t", "workflow_id": "pinned-v1", "task_queue": queue, "build_id": "v1"}))
        .await
        .ok(201);
    assert_eq!(h.describe("pinned-v1").await["compatibility"], "v1");
    // The v2 worker never gets it, though it is ready…
    let v2 = h
        .poll_workflow_with(json!({"worker_id": "w-v2", "task_queue": queue, "timeout_seconds": 1}))
        .await
        .ok(200);
    assert!(v2["task"].is_null(), "{v2}");
    // …the v1 worker does, and so do the run's later tasks.
    let task = h.next_workflow_task("w-v1", &queue).await;
    assert_eq!(task["workflow_id"], "pinned-v1");
    h.complete_workflow_task(&task, json!([{"type": "continue_as_new"}])).await.ok(200);
    assert_eq!(
        h.describe("pinned-v1").await["compatibility"],
        "v1",
        "continue-as-new keeps the pin"
    );
    let v2 = h
        .poll_workflow_with(json!({"worker_id": "w-v2", "task_queue": queue, "timeout_seconds": 1}))
        .await
        .ok(200);
    assert!(v2["task"].is_null());
    assert_eq!(h.next_workflow_task("w-v1", &queue).await["workflow_id"], "pinned-v1");
    // An unpinned run goes to anyone; the alias `compatibility` pins too.
    h.start_workflow_with(json!({"workflow_type": "t", "workflow_id": "free", "task_queue": queue}))
        .await
        .ok(201);
    assert_eq!(h.next_workflow_task("w-v2", &queue).await["workflow_id"], "free");
    h.start_workflow_with(json!({"workflow_type": "t", "workflow_id": "pinned-v3", "task_queue": queue, "compatibility": "v3"}))
        .await
        .ok(201);
    let described = h.cget(&format!("/api/task-queues/{queue}")).await.ok(200);
    let diagnostic = described["diagnostics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["build_id"] == "v3")
        .cloned();
    assert_eq!(
        diagnostic.map(|d| d["reason"].clone()),
        Some(json!("no_compatible_worker")),
        "{described}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_starts_follow_the_promoted_build() {
    let h = Harness::start().await;
    let queue = unique("promote");
    for (worker, build) in [("p-v1", "v1"), ("p-v2", "v2")] {
        h.wpost(
            "/api/worker/register",
            json!({"worker_id": worker, "task_queue": queue, "runtime": "rust", "build_id": build}),
        )
        .await
        .ok(201);
    }
    h.start_workflow("before-promotion", &queue).await;
    assert!(h.describe("before-promotion").await["compatibility"].is_null());
    let promoted = h
        .cpost(&format!("/api/task-queues/{queue}/build-ids/promote"), json!({"build_id": "v2"}))
        .await
        .ok(200);
    assert_eq!(
        (promoted["build_id"].as_str(), promoted["new_start_selected"].as_bool()),
        (Some("v2"), Some(true))
    );
    h.start_workflow("after-promotion", &queue).await;
    assert_eq!(h.describe("after-promotion").await["compatibility"], "v2");
    // An explicit build still wins; promoting another build moves the selection.
    h.start_workflow_with(json!({"workflow_type": "t", "workflow_id": "explicit-v1", "task_queue": queue, "build_id": "v1"}))
        .await
        .ok(201);
    assert_eq!(h.describe("explicit-v1").await["compatibility"], "v1");
    h.cpost(&format!("/api/task-queues/{queue}/build-ids/promote"), json!({"build_id": "v1"}))
        .await
        .ok(200);
    let cohorts = h.cget(&format!("/api/task-queues/{queue}/build-ids")).await.ok(200);
    let selected: Vec<&str> = cohorts["build_ids"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["new_start_selected"] == json!(true))
        .map(|c| c["build_id"].as_str().unwrap())
        .collect();
    assert_eq!(selected, ["v1"]);
}

// ============================================================================================
// Storage faults

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_is_never_acknowledged_and_the_server_reports_not_ready_until_writes_work() {
    let h = Harness::start().await;
    h.register("w1", "q").await;
    send(h.bare(Method::GET, "/api/ready")).await.ok(200);

    // Commits fail (a failed fsync) until the fault is lifted: every commit, so that the
    // server's own background writes cannot use the fault up before the request under test.
    const UNTIL_LIFTED: u32 = u32::MAX;
    // Injected commit failures are SQLite's (PostgreSQL's storage faults are real ones:
    // tests/python/test_storage_faults.py).
    let Some(store) = h.sqlite() else { return };
    store.inject_commit_failures(UNTIL_LIFTED);
    let start = |id: &str| {
        h.client(Method::POST, "/api/workflows")
            .json(&json!({"workflow_id": id, "workflow_type": "t", "task_queue": "q", "input": env(EMPTY_ARGS)}))
    };
    // A start whose commit fails: 503 in the DW error shape, nothing committed.
    let refused = send_allowing_server_errors(start("fault-1")).await.err(503, "storage_unavailable");
    assert_eq!(refused["retryable"], true);
    // Not ready while commits fail: the readiness probe's own write fails too.
    let not_ready = send_allowing_server_errors(h.bare(Method::GET, "/api/ready")).await;
    assert_eq!(not_ready.status.as_u16(), 503);
    assert_eq!(not_ready.body["status"], "not_ready");
    store.inject_commit_failures(0);
    h.cget("/api/workflows/fault-1").await.err(404, "instance_not_found");
    // The probe's write commits again: ready.
    send(h.bare(Method::GET, "/api/ready")).await.ok(200);

    // A worker's completion whose commit fails is refused and changes nothing; the retry of the
    // same report (same task, same attempt) is then applied exactly once.
    h.start_workflow("fault-3", "q").await;
    let task = h.next_workflow_task("w1", "q").await;
    store.inject_commit_failures(UNTIL_LIFTED);
    let complete = || {
        h.worker(
            Method::POST,
            &format!("/api/worker/workflow-tasks/{}/complete", task["task_id"].as_str().unwrap()),
        )
        .json(
            &json!({"lease_owner": task["lease_owner"], "workflow_task_attempt": task["workflow_task_attempt"],
                          "commands": [{"type": "complete_workflow", "result": env(EMPTY_ARGS)}]}),
        )
    };
    send_allowing_server_errors(complete()).await.err(503, "storage_unavailable");
    store.inject_commit_failures(0);
    assert_eq!(h.describe("fault-3").await["status"], "running");
    let done = h
        .complete_workflow_task(&task, json!([{"type": "complete_workflow", "result": env(EMPTY_ARGS)}]))
        .await
        .ok(200);
    assert_eq!(done["recorded"], true);
    let described = h.describe("fault-3").await;
    assert_eq!(described["status"], "completed");
    let run_id = described["run_id"].as_str().unwrap();
    let history = h
        .cget(&format!("/api/workflows/fault-3/runs/{run_id}/history?page_size=100"))
        .await
        .ok(200);
    let completed = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event_type"] == "WorkflowCompleted")
        .count();
    assert_eq!(completed, 1);
}

/// A run document that does not parse is never `503 retry`: changes and reads answer 409
/// `integrity_incident_open` naming the run and its incident (one per run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_run_document_answers_an_incident_not_a_retry() {
    let h = Harness::start().await;
    let started = h.start_workflow("garbled", "q").await;
    let run_id = started["run_id"].as_str().unwrap().to_string();
    h.tamper_run_document(&run_id, r#"{"truncated": "#).await;
    let signal = json!({"input": env(EMPTY_ARGS)});
    let first = h
        .cpost("/api/workflows/garbled/signal/go", signal.clone())
        .await
        .err(409, "integrity_incident_open");
    assert_eq!(first["run_id"], json!(run_id), "{first}");
    let again = h
        .cpost("/api/workflows/garbled/signal/go", signal)
        .await
        .err(409, "integrity_incident_open");
    assert_eq!(again["incident_id"], first["incident_id"], "one incident per run");
    let read = h
        .cget(&format!("/api/workflows/garbled/runs/{run_id}"))
        .await
        .err(409, "integrity_incident_open");
    assert_eq!(read["incident_id"], first["incident_id"], "{read}");
    let incidents = h.cget("/api/integrity-incidents?state=open").await.ok(200);
    assert_eq!(
        incidents.to_string().matches(first["incident_id"].as_str().unwrap()).count(),
        1,
        "{incidents}"
    );
}
