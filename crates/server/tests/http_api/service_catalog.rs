//! The Nexus service catalog routes on every backend: endpoints, services and operations created,
//! listed, described, updated and deleted in DW's shapes; parents required, children protecting
//! their parents, names checked, unknown fields refused, roles enforced.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_services_and_operations_round_trip() {
    let h = Harness::start().await;
    let endpoint = h
        .cpost(
            "/api/service-endpoints",
            json!({"endpoint_name": "Billing", "description": "money", "metadata": {"team": "a"}}),
        )
        .await
        .ok(201);
    assert_eq!(endpoint["endpoint_name"], "billing", "names are lower-cased");
    assert_eq!(endpoint["namespace"], "default");
    assert_eq!(endpoint["metadata"], json!({"team": "a"}));
    assert!(endpoint["id"].is_string() && endpoint["created_at"].is_string());
    h.cpost("/api/service-endpoints", json!({"endpoint_name": "billing"}))
        .await
        .err(409, "endpoint_already_exists");
    h.cpost("/api/service-endpoints", json!({"endpoint_name": "bad name"}))
        .await
        .err(422, "validation_failed");
    h.cpost("/api/service-endpoints", json!({"endpoint_name": "x", "colour": 1}))
        .await
        .err(422, "validation_failed");

    h.cpost("/api/service-endpoints/nope/services", json!({"service_name": "s"}))
        .await
        .err(404, "endpoint_not_found");
    let service = h
        .cpost("/api/service-endpoints/billing/services", json!({"service_name": "invoices"}))
        .await
        .ok(201);
    assert_eq!(
        (service["service_name"].as_str(), &service["endpoint_id"]),
        (Some("invoices"), &endpoint["id"])
    );

    let operations = "/api/service-endpoints/billing/services/invoices/operations";
    let operation = json!({"operation_name": "create", "operation_mode": "sync", "handler_binding_kind": "start_workflow",
        "handler_binding": {"workflow_type": "invoice.create", "queue": "billing"}, "retry_policy": {"max_attempts": 3}});
    let created = h.cpost(operations, operation.clone()).await.ok(201);
    assert_eq!(created["operation_mode"], "sync");
    assert_eq!(created["handler_binding"]["workflow_type"], "invoice.create");
    assert_eq!(created["retry_policy"], json!({"max_attempts": 3}));
    assert_eq!(created["service_id"], service["id"]);
    assert_eq!(created["handler_target_reference"], Value::Null);
    for (bad, field) in [
        (
            json!({"operation_name": "o", "handler_binding_kind": "start_workflow", "handler_target_reference": "t"}),
            "operation_mode",
        ),
        (
            json!({"operation_name": "o", "operation_mode": "later", "handler_binding_kind": "start_workflow", "handler_target_reference": "t"}),
            "operation_mode",
        ),
        (
            json!({"operation_name": "o", "operation_mode": "sync", "handler_binding_kind": "ftp", "handler_target_reference": "t"}),
            "handler_binding_kind",
        ),
        (
            json!({"operation_name": "o", "operation_mode": "sync", "handler_binding_kind": "query_workflow"}),
            "handler_target_reference",
        ),
    ] {
        let body = h.cpost(operations, bad).await.err(422, "validation_failed");
        assert!(body["errors"][field].is_array(), "{field}: {body}");
    }
    h.cpost(operations, operation).await.err(409, "operation_already_exists");

    // Describe, list, update (no renaming), at every level.
    let described = h.cget(&format!("{operations}/create")).await.ok(200);
    assert_eq!(described["id"], created["id"]);
    h.cget(&format!("{operations}/missing")).await.err(404, "operation_not_found");
    h.cget("/api/service-endpoints/billing/services/missing")
        .await
        .err(404, "service_not_found");
    let listed = h.cget(operations).await.ok(200);
    assert_eq!(listed["operations"].as_array().unwrap().len(), 1);
    let listed = h.cget("/api/service-endpoints").await.ok(200);
    assert_eq!(listed["service_endpoints"][0]["endpoint_name"], "billing");
    let listed = h.cget("/api/service-endpoints/billing/services").await.ok(200);
    assert_eq!(listed["services"][0]["service_name"], "invoices");
    let updated = h
        .cpost_method(
            Method::PUT,
            &format!("{operations}/create"),
            json!({"operation_mode": "async", "description": "d"}),
        )
        .await
        .ok(200);
    assert_eq!(
        (updated["operation_mode"].as_str(), updated["description"].as_str()),
        (Some("async"), Some("d"))
    );
    assert_eq!(
        updated["handler_binding"]["workflow_type"], "invoice.create",
        "what an update omits stays"
    );
    h.cpost_method(Method::PUT, &format!("{operations}/create"), json!({"operation_name": "other"}))
        .await
        .err(422, "validation_failed");
    let renamed = h
        .cpost_method(Method::PUT, "/api/service-endpoints/billing", json!({"description": "new"}))
        .await
        .ok(200);
    assert_eq!(renamed["description"], "new");

    // Parents with children stay; then everything goes, bottom up.
    send(h.client(Method::DELETE, "/api/service-endpoints/billing"))
        .await
        .err(409, "endpoint_has_services");
    send(h.client(Method::DELETE, "/api/service-endpoints/billing/services/invoices"))
        .await
        .err(409, "service_has_operations");
    let deleted = send(h.client(Method::DELETE, &format!("{operations}/create"))).await.ok(200);
    assert_eq!(
        (deleted["outcome"].as_str(), deleted["operation_name"].as_str()),
        (Some("deleted"), Some("create"))
    );
    send(h.client(Method::DELETE, "/api/service-endpoints/billing/services/invoices"))
        .await
        .ok(200);
    send(h.client(Method::DELETE, "/api/service-endpoints/billing")).await.ok(200);
    assert_eq!(h.cget("/api/service-endpoints").await.ok(200)["service_endpoints"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_catalog_is_read_by_operators_and_changed_by_admins() {
    let h = Harness::with_config(
        ServerConfig {
            auth: Tokens::config(),
            ..ServerConfig::default()
        },
        Some(Tokens::ADMIN),
    )
    .await;
    h.cpost("/api/service-endpoints", json!({"endpoint_name": "e"})).await.ok(201);
    let as_operator = |method: Method, path: &str| {
        h.bare(method, path)
            .header(CONTROL_HEADER, "2")
            .header("X-Namespace", "default")
            .bearer_auth(Tokens::OPERATOR)
    };
    send(as_operator(Method::GET, "/api/service-endpoints/e")).await.ok(200);
    send(as_operator(Method::POST, "/api/service-endpoints").json(&json!({"endpoint_name": "f"})))
        .await
        .err(403, "forbidden");
    send(as_operator(Method::DELETE, "/api/service-endpoints/e"))
        .await
        .err(403, "forbidden");
}
