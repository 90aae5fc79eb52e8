//! Named credentials an admin manages over the API: a generated secret answered once and kept
//! only as a digest, rotation without a restart, grants that bind a principal to namespaces,
//! and a change another node honours within seconds.

use super::principals::{credentials_config, credentials_harness, listing, ALICE_V1, CAROL, ROOT};
use super::*;

fn call(base: &str, method: Method, path: &str, token: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .header(CONTROL_HEADER, "2")
        .bearer_auth(token)
}

async fn whoami(base: &str, token: &str) -> Resp {
    send(call(base, Method::GET, "/api/auth/whoami", token)).await
}

fn token_of(answer: &Value) -> (String, String) {
    let secret = &answer["secret"];
    (
        secret["token"].as_str().expect("the secret is answered").to_string(),
        secret["secret_id"].as_str().expect("with its id").to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_creates_rotates_regrants_and_deletes_a_credential_without_a_restart() {
    let h = credentials_harness().await;
    let base = h.url("");
    let create = |body: Value| call(&base, Method::POST, "/api/auth/credentials", ROOT).json(&body);
    let created = send(create(
        json!({"principal": "dave", "roles": ["operator"], "namespaces": ["billing"]}),
    ))
    .await
    .ok(201);
    let (first, first_id) = token_of(&created);
    assert!(first.starts_with("capstan_") && first.len() > 64, "{first}");
    let credential = &created["credential"];
    assert_eq!(
        (
            &credential["source"],
            &credential["roles"],
            &credential["namespaces"],
            &credential["created_by"]
        ),
        (
            &json!("api"),
            &json!(["operator"]),
            &json!(["billing"]),
            &json!({"type": "auth:token", "id": "root"})
        )
    );

    // It acts at once, as its principal, where it is bound and nowhere else; history says so.
    let me = whoami(&base, &first).await.ok(200);
    assert_eq!((&me["principal"]["id"], &me["namespaces"]), (&json!("dave"), &json!(["billing"])));
    send(listing(&h, "billing", &first)).await.ok(200);
    send(listing(&h, "default", &first)).await.err(403, "forbidden");
    let start = call(&base, Method::POST, "/api/workflows", &first)
        .header("X-Namespace", "billing")
        .json(&json!({"workflow_id": "daves", "workflow_type": "t", "task_queue": "q"}));
    let run_id = send(start).await.ok(201)["run_id"].as_str().unwrap().to_string();

    // Rotation: a second secret, both work; the first retired, it stops at once.
    let added = send(call(&base, Method::POST, "/api/auth/credentials/dave/secrets", ROOT))
        .await
        .ok(201);
    let (second, _) = token_of(&added);
    assert_eq!(added["credential"]["secret_count"], 2);
    whoami(&base, &first).await.ok(200);
    assert_eq!(whoami(&base, &second).await.ok(200)["principal"]["id"], "dave");
    let signal = call(&base, Method::POST, "/api/workflows/daves/signal/poke", &second)
        .header("X-Namespace", "billing")
        .json(&json!({"input": env(EMPTY_ARGS)}));
    send(signal).await.ok(202);
    let retire = format!("/api/auth/credentials/dave/secrets/{first_id}");
    let retired = send(call(&base, Method::DELETE, &retire, ROOT)).await.ok(200);
    assert_eq!(retired["secret_count"], 1);
    whoami(&base, &first).await.err(401, "unauthorized");
    whoami(&base, &second).await.ok(200);
    send(call(&base, Method::DELETE, &retire, ROOT))
        .await
        .err(404, "credential_secret_not_found");
    let last = retired["secrets"][0]["secret_id"].as_str().unwrap().to_string();
    send(call(
        &base,
        Method::DELETE,
        &format!("/api/auth/credentials/dave/secrets/{last}"),
        ROOT,
    ))
    .await
    .err(409, "credential_needs_a_secret");
    let history = format!("/api/workflows/daves/runs/{run_id}/history?page_size=1000");
    let history = call(&base, Method::GET, &history, ROOT).header("X-Namespace", "billing");
    let events = send(history).await.ok(200);
    let by_dave = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["principal"] == json!({"type": "auth:token", "id": "dave"}))
        .count();
    assert!(by_dave >= 3, "start and signal, before and after rotation, by dave: {events}");

    // Regrant: every namespace now.
    let regrant = call(&base, Method::PUT, "/api/auth/credentials/dave", ROOT).json(&json!({"roles": ["operator"], "namespaces": null}));
    let regranted = send(regrant).await.ok(200);
    assert_eq!(regranted["updated_by"]["id"], "root");
    send(listing(&h, "default", &second)).await.ok(200);

    // The list shows both sources and never a secret or its digest.
    let listed = send(call(&base, Method::GET, "/api/auth/credentials", ROOT)).await.ok(200);
    let text = listed.to_string();
    for secret in [&first, &second] {
        assert!(!text.contains(secret.as_str()), "{text}");
        let digest = capstan_server::auth::stored_form(secret);
        assert!(!text.contains(digest.trim_start_matches("sha256:")), "{text}");
    }
    let sources: Vec<(Value, Value)> = listed["credentials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["principal"].clone(), c["source"].clone()))
        .collect();
    assert!(sources.contains(&(json!("alice"), json!("file"))), "{listed}");
    assert!(sources.contains(&(json!("dave"), json!("api"))), "{listed}");
    let described = send(call(&base, Method::GET, "/api/auth/credentials/alice", ROOT)).await.ok(200);
    assert_eq!((&described["source"], &described["secret_count"]), (&json!("file"), &json!(2)));

    // Deleted: no secret of it authenticates.
    let deleted = send(call(&base, Method::DELETE, "/api/auth/credentials/dave", ROOT)).await.ok(200);
    assert_eq!(deleted["status"], "deleted");
    whoami(&base, &second).await.err(401, "unauthorized");
    send(call(&base, Method::GET, "/api/auth/credentials/dave", ROOT))
        .await
        .err(404, "credential_not_found");

    // The audit trail keeps every change, newest first, with who made it; never a secret.
    let trail = send(call(&base, Method::GET, "/api/auth/credential-events?principal=dave", ROOT))
        .await
        .ok(200);
    let events = trail["events"].as_array().unwrap();
    let actions: Vec<&str> = events.iter().map(|e| e["action"].as_str().unwrap()).collect();
    assert_eq!(
        actions,
        [
            "credential.deleted",
            "credential.regranted",
            "credential.secret_removed",
            "credential.secret_added",
            "credential.created"
        ]
    );
    assert!(
        events.iter().all(|e| e["by"] == json!({"type": "auth:token", "id": "root"})),
        "{trail}"
    );
    assert_eq!(events[2]["secret_id"], first_id.as_str());
    assert_eq!(
        (&events[1]["roles"], &events[1]["namespaces"]),
        (&json!(["operator"]), &Value::Null)
    );
    assert_eq!(events[4]["namespaces"], json!(["billing"]));
    let text = trail.to_string();
    for secret in [&first, &second] {
        assert!(!text.contains(secret.as_str()), "{text}");
        assert!(!text.contains(capstan_server::auth::stored_form(secret).trim_start_matches("sha256:")));
    }
    // A page at a time.
    let mut path = "/api/auth/credential-events?principal=dave&limit=2".to_string();
    let mut paged = Vec::new();
    loop {
        let page = send(call(&base, Method::GET, &path, ROOT)).await.ok(200);
        paged.extend(page["events"].as_array().unwrap().iter().map(|e| e["sequence"].clone()));
        match page["next_page_token"].as_str() {
            Some(token) => path = format!("/api/auth/credential-events?principal=dave&limit=2&page_token={token}"),
            None => break,
        }
    }
    assert_eq!(paged, events.iter().map(|e| e["sequence"].clone()).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credential_changes_are_for_unbound_admins_and_refuse_what_they_cannot_honour() {
    let h = credentials_harness().await;
    let base = h.url("");
    let create = |token: &str, body: Value| call(&base, Method::POST, "/api/auth/credentials", token).json(&body);
    let dave = json!({"principal": "dave", "roles": ["worker"]});
    send(create(ALICE_V1, dave.clone())).await.err(403, "forbidden");
    send(create(CAROL, dave.clone())).await.err(403, "forbidden");
    send(create("unknown-secret", dave.clone())).await.err(401, "unauthorized");
    // Principals the file or a command-line token defines are the file's.
    for principal in ["alice", "role:admin", "legacy-token"] {
        let refused = send(create(ROOT, json!({"principal": principal, "roles": ["admin"]})))
            .await
            .err(409, "credential_managed_by_file");
        assert_eq!(refused["principal"], principal);
    }
    send(call(&base, Method::POST, "/api/auth/credentials/alice/secrets", ROOT))
        .await
        .err(409, "credential_managed_by_file");
    // Nothing silently dropped or guessed.
    let refused = send(create(ROOT, json!({"principal": "dave", "roles": ["worker"], "secret": "mine"})))
        .await
        .err(422, "validation_failed");
    assert!(refused.to_string().contains("secret"), "{refused}");
    send(create(ROOT, json!({"principal": "dave", "roles": ["root"]})))
        .await
        .err(422, "validation_failed");
    send(create(ROOT, json!({"principal": "dave", "roles": []})))
        .await
        .err(422, "validation_failed");
    send(create(ROOT, json!({"principal": " dave", "roles": ["worker"]})))
        .await
        .err(422, "validation_failed");
    send(create(
        ROOT,
        json!({"principal": "dave", "roles": ["worker"], "namespaces": ["nowhere"]}),
    ))
    .await
    .err(404, "namespace_not_found");
    send(create(ROOT, json!({"principal": "dave", "roles": ["worker"], "namespaces": []})))
        .await
        .err(422, "validation_failed");
    send(create(ROOT, dave.clone())).await.ok(201);
    send(create(ROOT, dave)).await.err(409, "credential_already_exists");
    for _ in 0..4 {
        send(call(&base, Method::POST, "/api/auth/credentials/dave/secrets", ROOT))
            .await
            .ok(201);
    }
    send(call(&base, Method::POST, "/api/auth/credentials/dave/secrets", ROOT))
        .await
        .err(409, "credential_secret_limit_reached");
    send(call(&base, Method::PUT, "/api/auth/credentials/nobody", ROOT).json(&json!({"roles": ["worker"]})))
        .await
        .err(404, "credential_not_found");
    // The trail is an unbound admin's to read, and asked for plainly.
    let trail = |token: &str, query: &str| call(&base, Method::GET, &format!("/api/auth/credential-events{query}"), token);
    send(trail(ALICE_V1, "")).await.err(403, "forbidden");
    send(trail(CAROL, "")).await.err(403, "forbidden");
    let all = send(trail(ROOT, "")).await.ok(200);
    assert_eq!(
        all["events"].as_array().unwrap().len(),
        5,
        "dave made, and four secrets added: {all}"
    );
    send(trail(ROOT, "?limit=0")).await.err(422, "validation_failed");
    send(trail(ROOT, "?principals=dave")).await.err(422, "validation_failed");
    send(trail(ROOT, "?page_token=bm90LWEtdG9rZW4"))
        .await
        .err(422, "invalid_page_token");
    let first = send(trail(ROOT, "?limit=1")).await.ok(200);
    let token = first["next_page_token"].as_str().unwrap();
    send(trail(ROOT, &format!("?principal=dave&page_token={token}")))
        .await
        .err(422, "invalid_page_token");
}

/// Nodes share the database: a credential made, rotated or deleted on one node is honoured on
/// another within seconds, with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_node_honours_a_credential_change_within_seconds() {
    let h = credentials_harness().await;
    let (other, _stop) = h.another_node(credentials_config()).await;
    let base = h.url("");
    let created = send(call(&base, Method::POST, "/api/auth/credentials", ROOT).json(&json!({"principal": "erin", "roles": ["operator"]})))
        .await
        .ok(201);
    let (secret, _) = token_of(&created);
    let within = Duration::from_secs(15);
    wait_for("the other node to take the new credential", within, || async {
        (whoami(&other, &secret).await.status == 200).then_some(())
    })
    .await;
    send(call(&base, Method::DELETE, "/api/auth/credentials/erin", ROOT)).await.ok(200);
    wait_for("the other node to drop the deleted credential", within, || async {
        (whoami(&other, &secret).await.status == 401).then_some(())
    })
    .await;
}
