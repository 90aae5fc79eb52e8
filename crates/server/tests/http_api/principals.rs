//! Named credentials: a principal with several secrets (rotation), roles, and namespaces it is
//! bound to; who a request acts as comes from the credential alone.

use super::*;
use capstan_server::auth::{Credential, Credentials};
use capstan_server::{AuthConfig, Role};

pub(super) const ALICE_V1: &str = "alice-secret-version-1";
pub(super) const ALICE_V2: &str = "alice-secret-version-2";
pub(super) const BOB: &str = "bob-worker-secret-billing";
pub(super) const CAROL: &str = "carol-operator-secret-billing";
pub(super) const ROOT: &str = "root-admin-secret-everywhere";

pub(super) fn credentials_config() -> ServerConfig {
    let credentials = Credentials::fixed(vec![
        Credential::new("alice", &[Role::Operator], None, &[ALICE_V1, ALICE_V2]),
        Credential::new("bob", &[Role::Worker], Some(&["billing"]), &[BOB]),
        Credential::new("carol", &[Role::Operator], Some(&["billing"]), &[CAROL]),
        Credential::new("root", &[Role::Admin], None, &[ROOT]),
    ]);
    let auth = AuthConfig::Token {
        shared: None,
        worker: None,
        operator: None,
        admin: None,
        credentials,
    };
    ServerConfig {
        auth,
        ..ServerConfig::default()
    }
}

pub(super) async fn credentials_harness() -> Harness {
    let h = Harness::with_config(credentials_config(), None).await;
    send(
        h.bare(Method::POST, "/api/namespaces")
            .header(CONTROL_HEADER, "2")
            .bearer_auth(ROOT)
            .json(&json!({"name": "billing"})),
    )
    .await
    .ok(201);
    h
}

pub(super) fn listing(h: &Harness, namespace: &str, token: &str) -> reqwest::RequestBuilder {
    h.bare(Method::GET, "/api/workflows")
        .header(CONTROL_HEADER, "2")
        .header("X-Namespace", namespace)
        .bearer_auth(token)
}

fn heartbeat(h: &Harness, namespace: &str, token: &str) -> reqwest::RequestBuilder {
    h.bare(Method::POST, "/api/worker/heartbeat")
        .header(PROTOCOL_HEADER, "1.20")
        .header("X-Namespace", namespace)
        .bearer_auth(token)
        .json(&json!({"worker_id": "nobody"}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_secret_of_a_credential_acts_as_its_principal() {
    let h = credentials_harness().await;
    send(listing(&h, "default", ALICE_V1)).await.ok(200);
    send(listing(&h, "default", ALICE_V2)).await.ok(200);
    send(listing(&h, "default", "alice-secret-version-3"))
        .await
        .err(401, "unauthorized");
    // Roles still hold: alice is an operator, not a worker.
    send(heartbeat(&h, "default", ALICE_V1)).await.err(403, "forbidden");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_bound_to_a_namespace_is_refused_everywhere_else() {
    let h = credentials_harness().await;
    // Control plane.
    send(listing(&h, "billing", CAROL)).await.ok(200);
    let refused = send(listing(&h, "default", CAROL)).await.err(403, "forbidden");
    assert_eq!(refused["namespace"], "default", "{refused}");
    // Worker plane (a 404 is the handler's answer: the credential got through).
    send(heartbeat(&h, "billing", BOB)).await.err(404, "worker_not_registered");
    send(heartbeat(&h, "default", BOB)).await.err(403, "forbidden");
    let poll = h
        .bare(Method::POST, "/api/worker/workflow-tasks/poll")
        .header(PROTOCOL_HEADER, "1.20")
        .header("X-Namespace", "default")
        .bearer_auth(BOB)
        .json(&json!({"worker_id": "w", "task_queue": "q"}));
    send(poll).await.err(403, "forbidden");
    // Metrics: a bound credential sees only its namespaces' series; an unbound one sees all.
    let scrape = |token: &str| {
        let request = h.bare(Method::GET, "/metrics").bearer_auth(token.to_string());
        async move {
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 200);
            response.text().await.unwrap()
        }
    };
    let everything = scrape(ALICE_V1).await;
    assert!(everything.contains(r#"namespace="default""#) && everything.contains("capstan_db_pool_connections{"));
    let carols = scrape(CAROL).await;
    let samples: Vec<&str> = carols.lines().filter(|line| !line.starts_with('#') && !line.is_empty()).collect();
    assert!(!samples.is_empty(), "billing's series are there: {carols}");
    for sample in samples {
        assert!(sample.contains(r#"namespace="billing""#), "only billing's series: {sample}");
    }
    // Namespace administration: a bound credential sees and reads only its own namespaces.
    let namespaces = |token: &str| {
        h.bare(Method::GET, "/api/namespaces")
            .header(CONTROL_HEADER, "2")
            .bearer_auth(token.to_string())
    };
    let names = |listed: Value| -> Vec<Value> { listed["namespaces"].as_array().unwrap().iter().map(|n| n["name"].clone()).collect() };
    assert_eq!(names(send(namespaces(CAROL)).await.ok(200)), [json!("billing")]);
    assert_eq!(
        names(send(namespaces(ALICE_V1)).await.ok(200)),
        [json!("billing"), json!("default")]
    );
    let describe = |name: &str| {
        h.bare(Method::GET, &format!("/api/namespaces/{name}"))
            .header(CONTROL_HEADER, "2")
            .bearer_auth(CAROL)
    };
    send(describe("billing")).await.ok(200);
    send(describe("default")).await.err(403, "forbidden");
    let create = h
        .bare(Method::POST, "/api/namespaces")
        .header(CONTROL_HEADER, "2")
        .bearer_auth(CAROL)
        .json(&json!({"name": "carols-own"}));
    send(create).await.err(403, "forbidden");
    // Cluster info shows nothing of any namespace: every credential may read it.
    for token in [BOB, CAROL, ALICE_V2] {
        send(h.bare(Method::GET, "/api/cluster/info").bearer_auth(token)).await.ok(200);
    }
}

/// `GET /api/auth/whoami` says who a credential acts as, never its secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_names_the_credentials_principal_roles_and_namespaces() {
    let h = credentials_harness().await;
    let whoami = |token: &str| h.bare(Method::GET, "/api/auth/whoami").bearer_auth(token.to_string());
    let carol = send(whoami(CAROL)).await.ok(200);
    assert_eq!(
        carol,
        json!({"principal": {"type": "auth:token", "id": "carol"}, "roles": ["operator"], "namespaces": ["billing"], "authentication": "token"})
    );
    let alice = send(whoami(ALICE_V2)).await.ok(200);
    assert_eq!((&alice["principal"]["id"], &alice["namespaces"]), (&json!("alice"), &Value::Null));
    assert!(!alice.to_string().contains(ALICE_V2), "{alice}");
    send(whoami("nobody-knows-this")).await.err(401, "unauthorized");
    let open = Harness::start().await;
    let anonymous = send(open.bare(Method::GET, "/api/auth/whoami")).await.ok(200);
    assert_eq!(
        (&anonymous["principal"], &anonymous["authentication"]),
        (&json!({"type": "server", "id": "anonymous"}), &json!("none"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_resolution_refuses_a_principal_the_caller_names() {
    let h = credentials_harness().await;
    let resolve = h
        .bare(Method::POST, "/api/ledger/nothing-here/resolve")
        .header(CONTROL_HEADER, "2")
        .header("X-Namespace", "default")
        .bearer_auth(ROOT)
        .json(&json!({"decision": "effect_absent", "evidence": {"note": "checked"}, "principal": "mallory"}));
    let refused = send(resolve).await.err(422, "validation_failed");
    assert!(refused.to_string().contains("principal"), "{refused}");
}

/// A command-line token acts as DW's subject for it; a timer's firing is nobody's request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_line_token_acts_as_dws_subject_for_it() {
    for (token, subject) in [(Tokens::OPERATOR, "role:operator"), (Tokens::SHARED, "legacy-token")] {
        let h = Harness::with_config(
            ServerConfig {
                auth: Tokens::config(),
                ..ServerConfig::default()
            },
            Some(token),
        )
        .await;
        let workflow_id = unique("subject");
        let started = h.start_workflow(&workflow_id, "q").await;
        let events = h.history(&workflow_id, started["run_id"].as_str().unwrap()).await;
        let started_event = events.iter().find(|e| e["event_type"] == "WorkflowStarted").unwrap();
        assert_eq!(
            started_event["principal"],
            json!({"type": "auth:token", "id": subject}),
            "{started_event}"
        );
    }
}

/// A redrive, a webhook delivery, a schedule's changes and a query are the requester's doing:
/// the events they cause (and the audit trail, for the query) name the operator who asked,
/// while the worker's own reports keep naming the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrives_webhooks_schedule_changes_and_queries_record_who_asked() {
    let h = Harness::with_config(
        ServerConfig {
            auth: Tokens::config(),
            ..ServerConfig::default()
        },
        Some(Tokens::SHARED),
    )
    .await;
    let as_operator = |method: Method, path: &str| {
        h.bare(method, path)
            .header(CONTROL_HEADER, "2")
            .header("X-Namespace", "default")
            .bearer_auth(Tokens::OPERATOR)
    };
    let operator = json!({"type": "auth:token", "id": "role:operator"});
    let principals = |events: &[Value], event_type: &str| -> Vec<Value> {
        events
            .iter()
            .filter(|e| e["event_type"] == event_type)
            .map(|e| e["principal"].clone())
            .collect()
    };

    // Redrive: every event of the successor, the copied completion included.
    let queue = unique("principal-rd");
    let failed = super::redrive::fail_at_step_two(&h, "principal-rd", &queue).await;
    let failed_events = h.history("principal-rd", &failed).await;
    assert_eq!(
        principals(&failed_events, "WorkflowFailed"),
        [json!({"type": "auth:token", "id": "legacy-token"})]
    );
    let redrive = as_operator(Method::POST, &format!("/api/workflows/principal-rd/runs/{failed}/redrive")).json(&json!({}));
    let successor = send(redrive).await.ok(202)["run_id"].as_str().unwrap().to_string();
    let head = h.cget(&format!("/api/workflows/principal-rd/runs/{failed}")).await.ok(200)["history_head_hash"].clone();
    let events = h.history_from("principal-rd", &successor, head.as_str().unwrap()).await;
    assert!(principals(&events, "ActivityCompleted").len() == 1, "{events:?}");
    for event in &events {
        assert_eq!(event["principal"], operator, "{event}");
    }

    // A webhook delivery: the delivering credential.
    let delivery = json!({"action": "start_workflow", "idempotency_key": "k-1",
                          "target": {"workflow_type": "hooked", "task_queue": queue}});
    let delivered = send(as_operator(Method::POST, "/api/bridge-adapters/webhook/principal-hook").json(&delivery))
        .await
        .ok(202);
    let (workflow_id, run_id) = (delivered["workflow_id"].as_str().unwrap(), delivered["run_id"].as_str().unwrap());
    assert_eq!(
        principals(&h.history(workflow_id, run_id).await, "WorkflowStarted"),
        vec![operator.clone()]
    );

    // A schedule: its create and trigger events, and the run the trigger started.
    let create = json!({"schedule_id": "principal-schedule", "spec": {"intervals": [{"every": "PT1H"}]},
                        "action": {"workflow_type": "scheduled", "task_queue": queue}});
    send(as_operator(Method::POST, "/api/schedules").json(&create)).await.ok(201);
    let triggered = send(as_operator(Method::POST, "/api/schedules/principal-schedule/trigger").json(&json!({})))
        .await
        .ok(200);
    let (workflow_id, run_id) = (triggered["workflow_id"].as_str().unwrap(), triggered["run_id"].as_str().unwrap());
    assert_eq!(
        principals(&h.history(workflow_id, run_id).await, "WorkflowStarted"),
        vec![operator.clone()]
    );
    let schedule_events = h.cget("/api/schedules/principal-schedule/history").await.ok(200)["events"].clone();
    let by_type = |event_type: &str| {
        schedule_events
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["event_type"] == event_type)
            .map(|e| e["principal"].clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(by_type("ScheduleCreated"), vec![operator.clone()], "{schedule_events}");
    assert_eq!(by_type("ScheduleTriggered"), vec![operator.clone()], "{schedule_events}");

    // The audit trail: a foreign page token is refused.
    let audit = h.cget(&format!("/api/workflows/{workflow_id}/audit-events")).await.ok(200);
    assert_eq!(audit["events"], json!([]), "no query yet: {audit}");
    h.cget(&format!("/api/workflows/{workflow_id}/audit-events?page_token=bm9wZQ"))
        .await
        .err(422, "invalid_page_token");
}
