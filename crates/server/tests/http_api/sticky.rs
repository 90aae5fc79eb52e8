//! Sticky execution and the completion field rule, over HTTP on every backend.

use super::*;

/// Registers `worker_id` as a sticky-capable worker of `queue` with build `build`.
async fn register_sticky(h: &Harness, worker_id: &str, queue: &str, build: &str) -> Value {
    h.wpost(
        "/api/worker/register",
        json!({"worker_id": worker_id, "task_queue": queue, "runtime": "rust", "build_id": build,
               "sdk_version": "capstan-http-tests/1", "supported_workflow_types": [], "supported_activity_types": [],
               "capabilities": ["sticky_execution"],
               "capability_manifest": {"sticky_execution": {"supported": true, "minimum_protocol_version": "1.18"}}}),
    )
    .await
    .ok(201)
}

fn claim(task: &Value, build: &str, ttl_seconds: i64) -> Value {
    json!({"worker_id": task["lease_owner"], "workflow_id": task["workflow_id"], "run_id": task["run_id"],
           "build_id": build, "ttl_seconds": ttl_seconds, "metrics": {"hit": 1, "miss": 2, "eviction": 0, "forced_cold_replay": 0}})
}

/// Completes `task` with `commands` and a sticky claim.
async fn complete_claiming(h: &Harness, task: &Value, commands: Value, claim: Value) -> Resp {
    h.wpost(
        &format!("/api/worker/workflow-tasks/{}/complete", task["task_id"].as_str().unwrap()),
        json!({"lease_owner": task["lease_owner"], "workflow_task_attempt": task["workflow_task_attempt"],
               "commands": commands, "sticky_cache": claim}),
    )
    .await
}

fn timer(seconds: i64) -> Value {
    json!([{"type": "start_timer", "delay_seconds": seconds}])
}

async fn signal(h: &Harness, workflow_id: &str) {
    h.cpost(
        &format!("/api/workflows/{workflow_id}/signal/go"),
        json!({"input": env(EMPTY_ARGS)}),
    )
    .await
    .ok(202);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_execution_is_advertised_and_the_registration_echoed() {
    let h = Harness::start().await;
    let info = send(h.bare(Method::GET, "/api/cluster/info")).await.ok(200);
    assert_eq!(
        info["worker_protocol"]["server_capabilities"]["sticky_execution"]["supported"],
        true
    );
    let reply = register_sticky(&h, "sticky-w", "q", "build-7").await;
    // What the Rust SDK's sticky worker checks before it polls.
    assert_eq!(reply["registered"], true);
    assert_eq!(reply["worker_id"], "sticky-w");
    assert_eq!(reply["namespace"], "default");
    assert_eq!(reply["task_queue"], "q");
    assert_eq!(reply["build_id"], "build-7");
    assert_eq!(reply["capabilities"], json!(["sticky_execution"]));
    assert_eq!(reply["capability_manifest"]["sticky_execution"]["supported"], true);
    assert_eq!(reply["server_capabilities"]["sticky_execution"]["supported"], true);
    let minor: u32 = reply["protocol_version"]
        .as_str()
        .unwrap()
        .trim_start_matches("1.")
        .parse()
        .unwrap();
    assert!(minor >= 18, "{reply}");
    let plain = h.register("plain-w", "q").await;
    assert_eq!(plain["build_id"], Value::Null, "no build sent, none echoed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claimed_run_goes_back_to_its_worker_and_others_wait() {
    let h = Harness::start().await;
    register_sticky(&h, "owner", "q", "b1").await;
    register_sticky(&h, "other", "q", "b1").await;
    h.start_workflow("sticky-route", "q").await;
    let first = h.next_workflow_task("owner", "q").await;
    assert_eq!(first["sticky_replay_mode"], "cold_replay", "nobody claimed the run yet");
    complete_claiming(
        &h,
        &first,
        json!([{"type": "open_signal_wait", "signal_name": "go"}]),
        claim(&first, "b1", 60),
    )
    .await
    .ok(200);
    let described = h.describe("sticky-route").await;
    assert_eq!(described["sticky"]["worker_id"], "owner");
    assert_eq!(described["sticky"]["metrics"]["miss"], 2, "the claim's counters are kept");
    // The same completion again is answered from its receipt and changes nothing: neither a
    // longer claim nor none at all replaces the affinity.
    for repeat in [claim(&first, "b1", 3600), Value::Null] {
        let again = complete_claiming(&h, &first, json!([{"type": "open_signal_wait", "signal_name": "go"}]), repeat)
            .await
            .ok(200);
        assert_eq!(again["retained"], true);
        assert_eq!(h.describe("sticky-route").await["sticky"], described["sticky"]);
    }

    signal(&h, "sticky-route").await;
    // The other worker is not offered the held task…
    assert_eq!(h.poll_workflow("other", "q", 1).await, Value::Null);
    // …its owner is, and may trust its cache.
    let second = h.next_workflow_task("owner", "q").await;
    assert_eq!(second["sticky_replay_mode"], "sticky_hit_expected");
    assert_eq!(second["history_events"][0]["sequence"], 1, "the inline history still starts at 1");
    assert_eq!(second["last_history_sequence"], second["total_history_events"]);
    // A completion without a claim leaves the run unclaimed.
    h.complete_workflow_task(&second, json!([{"type": "open_signal_wait", "signal_name": "go"}]))
        .await
        .ok(200);
    assert_eq!(h.describe("sticky-route").await["sticky"], Value::Null);
    signal(&h, "sticky-route").await;
    let third = h.next_workflow_task("other", "q").await;
    assert_eq!(third["sticky_replay_mode"], "cold_replay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_task_goes_to_another_worker_when_its_owner_is_gone() {
    let h = Harness::start().await;
    register_sticky(&h, "owner", "q", "b1").await;
    register_sticky(&h, "other", "q", "b1").await;
    h.start_workflow("sticky-gone", "q").await;
    let first = h.next_workflow_task("owner", "q").await;
    complete_claiming(&h, &first, timer(3600), claim(&first, "b1", 3600)).await.ok(200);
    signal(&h, "sticky-gone").await;
    assert_eq!(h.poll_workflow("other", "q", 1).await, Value::Null, "held for its owner");
    send(h.worker(Method::DELETE, "/api/worker/registrations/owner")).await.ok(200);
    let taken = h.next_workflow_task("other", "q").await;
    assert_eq!(taken["sticky_replay_mode"], "forced_cold_replay", "another worker's cache is cold");
    // Its own claim moves the run to it.
    complete_claiming(&h, &taken, timer(3600), claim(&taken, "b1", 60)).await.ok(200);
    assert_eq!(h.describe("sticky-gone").await["sticky"]["worker_id"], "other");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_task_is_released_after_the_hold_when_its_owner_does_not_poll() {
    let h = Harness::start().await;
    register_sticky(&h, "owner", "q", "b1").await;
    register_sticky(&h, "other", "q", "b1").await;
    h.start_workflow("sticky-hold", "q").await;
    let first = h.next_workflow_task("owner", "q").await;
    complete_claiming(&h, &first, timer(3600), claim(&first, "b1", 3600)).await.ok(200);
    let began = Instant::now();
    signal(&h, "sticky-hold").await;
    // The owner is registered but never polls again (busy, or frozen): the hold runs out.
    let taken = wait_for("the held task to reach the other worker", Duration::from_secs(15), || async {
        let task = h.poll_workflow("other", "q", 1).await;
        task.is_object().then_some(task)
    })
    .await;
    let waited = began.elapsed();
    assert!(waited >= Duration::from_secs(4), "held for its owner first ({waited:?})");
    assert_eq!(taken["sticky_replay_mode"], "forced_cold_replay");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_must_name_its_lease_run_and_build() {
    let h = Harness::start().await;
    register_sticky(&h, "owner", "q", "b1").await;
    h.register("plain", "q2").await;
    h.start_workflow("sticky-claims", "q").await;
    let task = h.next_workflow_task("owner", "q").await;
    for (field, value) in [
        ("worker_id", json!("someone")),
        ("run_id", json!("r-other")),
        ("workflow_id", json!("wf-other")),
    ] {
        let mut bad = claim(&task, "b1", 60);
        bad[field] = value;
        let refused = complete_claiming(&h, &task, timer(1), bad)
            .await
            .err(409, "sticky_cache_identity_mismatch");
        assert_eq!(refused["field"], format!("sticky_cache.{field}"));
    }
    complete_claiming(&h, &task, timer(1), claim(&task, "b2", 60))
        .await
        .err(409, "sticky_cache_identity_mismatch");
    let refused = complete_claiming(&h, &task, timer(1), claim(&task, "b1", 0))
        .await
        .err(422, "validation_failed");
    assert!(refused["errors"].get("sticky_cache.ttl_seconds").is_some(), "{refused}");
    assert_eq!(
        h.history("sticky-claims", task["run_id"].as_str().unwrap()).await.len(),
        2,
        "nothing recorded"
    );
    complete_claiming(&h, &task, timer(1), claim(&task, "b1", 60)).await.ok(200);

    // A worker that did not register the capability cannot claim.
    h.start_workflow_with(json!({"workflow_id": "plain-claims", "workflow_type": "t", "task_queue": "q2"}))
        .await
        .ok(201);
    let plain = h.next_workflow_task("plain", "q2").await;
    complete_claiming(&h, &plain, timer(1), claim(&plain, "capstan-http-tests/1", 60))
        .await
        .err(409, "worker_capability_not_supported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_page_token_fetches_only_what_is_new() {
    let h = Harness::start().await;
    register_sticky(&h, "owner", "q", "b1").await;
    h.start_workflow("sticky-pages", "q").await;
    let first = h.next_workflow_task("owner", "q").await;
    let seen = first["last_history_sequence"].as_u64().unwrap();
    complete_claiming(
        &h,
        &first,
        json!([{"type": "open_signal_wait", "signal_name": "go"}]),
        claim(&first, "b1", 60),
    )
    .await
    .ok(200);
    signal(&h, "sticky-pages").await;
    let second = h.next_workflow_task("owner", "q").await;
    let page = h
        .wpost(
            &format!("/api/worker/workflow-tasks/{}/history", second["task_id"].as_str().unwrap()),
            json!({"lease_owner": "owner", "workflow_task_attempt": second["workflow_task_attempt"],
                   "next_history_page_token": page_token(seen)}),
        )
        .await
        .ok(200);
    let events = page["history_events"].as_array().unwrap();
    assert_eq!(events[0]["sequence"], seen + 1, "the tail starts right after what the worker holds");
    assert_eq!(events.last().unwrap()["sequence"], second["last_history_sequence"]);
    assert!(page.as_object().unwrap().contains_key("next_history_page_token") && page["next_history_page_token"].is_null());
    // The events are rendered the same on every delivery (the SDK compares them).
    let full = h
        .wpost(
            &format!("/api/worker/workflow-tasks/{}/history", second["task_id"].as_str().unwrap()),
            json!({"lease_owner": "owner", "workflow_task_attempt": second["workflow_task_attempt"], "next_history_page_token": "MA=="}),
        )
        .await
        .ok(200);
    assert_eq!(full["history_events"][0], first["history_events"][0]);
}

/// The first event of `kind` in `events`.
fn first_of(events: &[Value], kind: &str) -> Value {
    events
        .iter()
        .find(|e| e["event_type"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
        .clone()
}

fn page_token(after: u64) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(after.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_field_capstan_neither_honours_nor_records_is_refused_by_name() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("strict-fields", "w", "q").await;
    let cases = [
        (
            json!([{"type": "start_timer", "delay_seconds": 1, "cancellation_scope_id": "s1"}]),
            "commands.0.cancellation_scope_id",
        ),
        (
            json!([{"type": "start_child_workflow", "workflow_type": "c", "observability_context": {"schema": "x"}}]),
            "commands.0.observability_context",
        ),
        (
            json!([{"type": "complete_workflow", "result": env(AVRO_NULL), "surprise": 1}]),
            "commands.0.surprise",
        ),
        (
            json!([{"type": "schedule_activity", "activity_type": "a", "retry_policy": {"max_attempts": 2, "initial_interval": 5}}]),
            "commands.0.retry_policy.initial_interval",
        ),
        (
            json!([{"type": "start_timer", "delay_seconds": 1, "retry_policy": {}}]),
            "commands.0.retry_policy",
        ),
    ];
    for (commands, field) in cases {
        let refused = h.complete_workflow_task(&task, commands).await.err(422, "validation_failed");
        assert!(refused["errors"].get(field).is_some(), "{field}: {refused}");
    }
    let streams = h
        .wpost(
            &format!("/api/worker/workflow-tasks/{}/complete", task["task_id"].as_str().unwrap()),
            json!({"lease_owner": "w", "workflow_task_attempt": task["workflow_task_attempt"],
                   "commands": [{"type": "start_timer", "delay_seconds": 1}],
                   "message_stream_waits": [{"stream_name": "inbox", "after_position": 0, "surprise": 1}]}),
        )
        .await
        .err(422, "validation_failed");
    assert!(streams["errors"].get("message_stream_waits.0.surprise").is_some(), "{streams}");
    // A null carries nothing and passes; nothing refused was recorded.
    assert_eq!(h.history("strict-fields", start["run_id"].as_str().unwrap()).await.len(), 2);
    h.complete_workflow_task(
        &task,
        json!([{"type": "start_timer", "delay_seconds": 1, "cancellation_scope_id": null}]),
    )
    .await
    .ok(200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fields_the_sdks_replay_are_recorded_on_their_events() {
    let h = Harness::start().await;
    h.cpost("/api/search-attributes", json!({"name": "Stage", "type": "keyword"}))
        .await
        .ok(201);
    let (start, task) = h.started_and_leased("replayed-fields", "w", "q").await;
    let session = json!({"session_id": "s-1", "requirements": ["gpu"], "lease_seconds": 120, "ttl_seconds": 1800,
                         "max_concurrent_activities": 1, "create_if_missing": true, "allow_reacquire_after_failure": true});
    h.complete_workflow_task(
        &task,
        json!([
            {"type": "schedule_activity", "activity_type": "a", "cancellation_policy": "abandon", "schedule_to_close_timeout": 60,
             "worker_session": session},
            {"type": "open_condition_wait", "condition_key": "ready", "condition_definition_fingerprint": "sha256:x",
             "condition_wait_occurrence_id": "rust:condition-wait:0"},
            {"type": "upsert_search_attributes", "attributes": {"Stage": "one"}, "attribute_types": {"Stage": "keyword"}},
        ]),
    )
    .await
    .ok(200);
    let events = h.history("replayed-fields", start["run_id"].as_str().unwrap()).await;
    let find = |kind: &str| first_of(&events, kind);
    let scheduled = find("ActivityScheduled");
    assert_eq!(scheduled["payload"]["cancellation_policy"], "abandon");
    assert_eq!(scheduled["payload"]["worker_session"], session, "recorded exactly as sent");
    assert_eq!(
        find("ConditionWaitOpened")["payload"]["condition_wait_occurrence_id"],
        "rust:condition-wait:0"
    );
    assert_eq!(
        find("SearchAttributesUpserted")["payload"]["attribute_types"],
        json!({"Stage": "keyword"})
    );

    // The wait is satisfied by a signal: the satisfied event repeats the occurrence id.
    signal(&h, "replayed-fields").await;
    let next = h.next_workflow_task("w", "q").await;
    h.complete_workflow_task(
        &next,
        json!([{"type": "fail_workflow", "message": "boom", "failed_step_sequence": 1, "failed_activity_execution_id": "act-1"}]),
    )
    .await
    .ok(200);
    let events = h.history("replayed-fields", start["run_id"].as_str().unwrap()).await;
    let find = |kind: &str| first_of(&events, kind);
    assert_eq!(
        find("ConditionWaitSatisfied")["payload"]["condition_wait_occurrence_id"],
        "rust:condition-wait:0"
    );
    let failed = find("WorkflowFailed");
    assert_eq!(failed["payload"]["failed_step_sequence"], 1);
    assert_eq!(failed["payload"]["failed_activity_execution_id"], "act-1");
}
