//! DW's embedded-v2 import (`POST /api/workflows/import/embedded-v2`): a closed run exported by
//! one server is imported into another exactly, once, with its chain starting from the bundle's
//! checksum; what cannot be honoured is refused by name with nothing written.

use crate::common::*;
use serde_json::{json, Map, Value};

const IMPORT: &str = "/api/workflows/import/embedded-v2";

/// A run closed on `h`, and its exported bundle.
async fn closed_run_bundle(h: &Harness, workflow_id: &str) -> (Value, Value) {
    let (start, task) = h.started_and_leased(workflow_id, "w1", "q").await;
    h.complete_workflow_task(&task, json!([complete_workflow(EMPTY_ARGS)]))
        .await
        .ok(200);
    let run_id = start["run_id"].as_str().unwrap();
    let bundle = h
        .cget(&format!("/api/workflows/{workflow_id}/runs/{run_id}/history/export"))
        .await
        .ok(200);
    (start, bundle)
}

/// The bundle changed and sealed again, as an exporter would have written it.
fn resealed(bundle: &Value, change: impl FnOnce(&mut Map<String, Value>)) -> Value {
    let mut bundle = bundle.as_object().unwrap().clone();
    change(&mut bundle);
    bundle.remove("integrity");
    let checksum = capstan_server::history_bundle_checksum(&bundle);
    bundle.insert(
        "integrity".into(),
        json!({"canonicalization": "json-recursive-ksort-v1", "checksum_algorithm": "sha256", "checksum": checksum}),
    );
    Value::Object(bundle)
}

fn rules(report: &Value) -> Vec<String> {
    report["eligibility"]["errors"]
        .as_array()
        .unwrap_or_else(|| panic!("no errors in {report}"))
        .iter()
        .map(|e| e["rule"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_run_moves_between_servers_exactly_once() {
    let source = Harness::start().await;
    let (start, bundle) = closed_run_bundle(&source, "moving").await;
    let run_id = start["run_id"].as_str().unwrap();
    let checksum = bundle["integrity"]["checksum"].as_str().unwrap().to_string();
    let target = Harness::start().await;
    let info = target.cget("/api/cluster/info").await.ok(200);
    assert_eq!(info["embedded_v2_import_contract"]["version"], 1, "{info}");

    let dry = target.cpost(IMPORT, json!({"bundle": bundle, "dry_run": true})).await.ok(200);
    assert_eq!((&dry["status"], &dry["dry_run"]), (&json!("dry_run"), &json!(true)), "{dry}");
    target.cget("/api/workflows/moving").await.err(404, "instance_not_found");

    let report = target
        .cpost(IMPORT, json!({"bundle": bundle, "import_id": "first-move"}))
        .await
        .ok(201);
    assert_eq!(report["schema"], "durable-workflow.v2.embedded-v2-import.report");
    assert_eq!(
        (&report["status"], &report["import_id"]),
        (&json!("imported"), &json!("first-move")),
        "{report}"
    );
    assert_eq!(report["integrity"]["integrity"]["checksum_matches"], true);
    assert_eq!(report["run"]["history_chain_origin"], checksum.as_str());
    assert_eq!(report["eligibility"]["eligible"], true);

    let described = target.describe("moving").await;
    assert_eq!(described["status"], "completed", "{described}");
    assert_eq!(described["engine_source"], "embedded_v2_import");
    assert_eq!(described["import_dedupe_key"], bundle["dedupe_key"]);
    assert_eq!(described["import_source_runtime"], "capstan");
    assert!(described["imported_by"]["id"].is_string(), "who imported it: {described}");
    assert_eq!(source.describe("moving").await["engine_source"], "v2");
    let original = source.history("moving", run_id).await;
    let copied = target.history_from("moving", run_id, &checksum).await;
    let facts = |events: &[Value]| {
        events
            .iter()
            .map(|e| {
                (
                    e["id"].clone(),
                    e["event_type"].clone(),
                    e["payload"].clone(),
                    e["recorded_at"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(facts(&copied), facts(&original), "history is copied exactly");
    let integrity = target.cget(&format!("/api/workflows/moving/runs/{run_id}/integrity")).await.ok(200);
    assert_eq!(integrity["chain_origin"], checksum.as_str(), "{integrity}");
    assert!(target.verify_offline().await.ok(), "the store verifies");

    // Again: a repeat, answered as already imported; nothing changes.
    let again = target.cpost(IMPORT, json!({"bundle": bundle})).await.ok(200);
    assert_eq!(
        (&again["status"], &again["import_id"]),
        (&json!("already_imported"), &json!("first-move")),
        "{again}"
    );
    assert_eq!(target.history_from("moving", run_id, &checksum).await.len(), copied.len());

    // The imported run exports again as a sound bundle of the same history.
    let exported = target
        .cget(&format!("/api/workflows/moving/runs/{run_id}/history/export"))
        .await
        .ok(200);
    assert_eq!(exported["workflow"]["history_chain_origin"], checksum.as_str());
    assert_eq!(exported["history_events"].as_array().unwrap().len(), copied.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_honoured_is_refused_by_name_with_nothing_written() {
    let source = Harness::start().await;
    let (_, bundle) = closed_run_bundle(&source, "refusals").await;
    let target = Harness::start().await;

    let mut forged = bundle.clone();
    forged["dedupe_key"] = json!("forged");
    let report = target.cpost(IMPORT, json!({"bundle": forged})).await.err(422, "import_rejected");
    assert_eq!(rules(&report), ["bundle.integrity_failed"]);
    assert_eq!(report["integrity"]["integrity"]["checksum_matches"], false);
    assert_eq!(report["status"], "rejected");

    let redacted = resealed(&bundle, |b| {
        b["redaction"] = json!({"applied": true, "paths": ["payloads.arguments"]})
    });
    let report = target.cpost(IMPORT, json!({"bundle": redacted})).await.err(422, "import_rejected");
    assert_eq!(rules(&report), ["bundle.redacted_payloads"]);

    let unknown = resealed(&bundle, |b| b["history_events"][1]["type"] = json!("WorkflowExploded"));
    let report = target.cpost(IMPORT, json!({"bundle": unknown})).await.err(422, "import_rejected");
    assert_eq!(rules(&report), ["history_events.type_unknown"]);

    let v1 = resealed(&bundle, |b| b["schema"] = json!("workflow.v1.history"));
    let report = target.cpost(IMPORT, json!({"bundle": v1})).await.err(422, "import_rejected");
    assert_eq!(rules(&report), ["bundle.integrity_failed"]);
    assert_eq!(report["integrity"]["findings"][0]["rule"], "bundle.schema_unexpected", "{report}");

    let incomplete = resealed(&bundle, |b| b["history_complete"] = json!(false));
    let report = target
        .cpost(IMPORT, json!({"bundle": incomplete}))
        .await
        .err(422, "import_rejected");
    assert_eq!(rules(&report), ["workflow.terminal_history_incomplete"]);

    // An open run rebuilt from its history (as DW's embedded runtime exports it, without
    // Capstan's state) is refused by name where its history uses what cannot be rebuilt.
    let open = source.start_workflow("still-open", "q").await;
    let open_run = open["run_id"].as_str().unwrap();
    let open_bundle = source
        .cget(&format!("/api/workflows/still-open/runs/{open_run}/history/export"))
        .await
        .ok(200);
    let with_child = resealed(&open_bundle, |b| {
        b.remove("capstan_run_state");
        let events = b["history_events"].as_array_mut().unwrap();
        let mut child = events.last().unwrap().clone();
        child["id"] = json!("child-event");
        child["sequence"] = json!(events.len() + 1);
        child["type"] = json!("ChildWorkflowScheduled");
        child["event_type"] = json!("ChildWorkflowScheduled");
        events.push(child);
    });
    let report = target
        .cpost(IMPORT, json!({"bundle": with_child}))
        .await
        .err(422, "import_rejected");
    assert_eq!(rules(&report), ["workflow.open_feature_unsupported"]);
    assert!(
        report["eligibility"]["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("ChildWorkflowScheduled"),
        "{report}"
    );

    // Options Capstan does not know are refused, not ignored.
    target
        .cpost(IMPORT, json!({"bundle": bundle, "allow_open_leases": true}))
        .await
        .err(422, "validation_failed");
    for id in ["refusals", "still-open"] {
        target.cget(&format!("/api/workflows/{id}")).await.err(404, "instance_not_found");
    }

    // A run id already used here by another run is a conflict.
    target.cpost(IMPORT, json!({"bundle": bundle})).await.ok(201);
    let other = resealed(&bundle, |b| {
        b["dedupe_key"] = json!("another-export");
        b["workflow"]["instance_id"] = json!("elsewhere");
    });
    let report = target.cpost(IMPORT, json!({"bundle": other})).await.err(409, "import_run_conflict");
    assert_eq!(rules(&report), ["target.run_id_conflict"]);
    target.cget("/api/workflows/elsewhere").await.err(404, "instance_not_found");
}

/// A mid-flight run moves: its pending activity is dispatched and its timer kept on the target,
/// a signal reaches it there, and a worker on the target finishes it from the imported history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_run_moves_and_goes_on_where_it_was() {
    let source = Harness::start().await;
    let (start, task) = source.started_and_leased("in-flight", "w1", "q").await;
    let run_id = start["run_id"].as_str().unwrap();
    let commands = json!([schedule_activity("charge", "q"), {"type": "start_timer", "delay_seconds": 3600}]);
    source.complete_workflow_task(&task, commands).await.ok(200);

    // While its activity is running on the source, the run cannot move.
    let leased = source.next_activity_task("w1", "q").await;
    let busy = source
        .cget(&format!("/api/workflows/in-flight/runs/{run_id}/history/export"))
        .await
        .ok(200);
    let target = Harness::start().await;
    let report = target.cpost(IMPORT, json!({"bundle": busy})).await.err(422, "import_rejected");
    assert_eq!(rules(&report), ["tasks.leased_task_present", "activities.running_attempt_present"]);
    source.fail_activity(&leased, "the old worker stops").await.ok(200);
    let bundle = source
        .cget(&format!("/api/workflows/in-flight/runs/{run_id}/history/export"))
        .await
        .ok(200);

    // A carried state that disagrees with the history is not trusted.
    let stale = resealed(&bundle, |b| b["capstan_run_state"]["last_sequence"] = json!(1));
    let report = target.cpost(IMPORT, json!({"bundle": stale})).await.err(422, "import_rejected");
    assert_eq!(rules(&report), ["capstan_run_state.history_mismatch"]);
    let broken = resealed(&bundle, |b| b["capstan_run_state"]["workflow_task"] = json!("no-such-task"));
    let report = target.cpost(IMPORT, json!({"bundle": broken})).await.err(422, "import_rejected");
    assert_eq!(rules(&report), ["capstan_run_state.invalid"]);
    let child = resealed(&bundle, |b| {
        b["capstan_run_state"]["parent"] = json!({"workflow_id": "elsewhere", "run_id": "r", "sequence": 1})
    });
    let report = target.cpost(IMPORT, json!({"bundle": child})).await.err(422, "import_rejected");
    assert_eq!(rules(&report), ["workflow.open_feature_unsupported"]);
    let other_run = resealed(&bundle, |b| b["capstan_run_state"]["run_number"] = json!(7));
    let report = target.cpost(IMPORT, json!({"bundle": other_run})).await.err(422, "import_rejected");
    assert_eq!(rules(&report), ["capstan_run_state.mismatch"]);
    let newer = resealed(&bundle, |b| b["capstan_run_state"]["document_version"] = json!(99));
    let report = target.cpost(IMPORT, json!({"bundle": newer})).await.err(422, "import_rejected");
    assert_eq!(rules(&report), ["capstan_run_state.version_unsupported"]);

    goes_on_from(&target, &bundle, run_id).await;

    // Without the state Capstan carried (as DW's embedded runtime exports a run), the run is
    // rebuilt from its history and sections, and goes on the same way.
    let stateless = resealed(&bundle, |b| {
        b.remove("capstan_run_state");
    });
    goes_on_from(&Harness::start().await, &stateless, run_id).await;
}

/// Imports an open run's `bundle` (an activity whose attempt failed, a timer, both pending) into
/// `target`, and finishes it there with a new worker.
async fn goes_on_from(target: &Harness, bundle: &Value, run_id: &str) {
    let checksum = bundle["integrity"]["checksum"].as_str().unwrap().to_string();
    let report = target.cpost(IMPORT, json!({"bundle": bundle})).await.ok(201);
    assert_eq!(report["run"]["status"], "waiting", "{report}");
    let described = target.describe("in-flight").await;
    assert_eq!(described["pending_timers"].as_array().unwrap().len(), 1, "{described}");
    assert_eq!(described["pending_activities"].as_array().unwrap().len(), 1, "{described}");
    assert_eq!(described["engine_source"], "embedded_v2_import");

    // The target dispatches the activity's next attempt and records a signal.
    target.register("w2", "q").await;
    let retried = target.next_activity_task("w2", "q").await;
    assert!(retried["attempt_number"].as_u64().unwrap() >= 2, "{retried}");
    target.complete_activity(&retried, EMPTY_ARGS).await.ok(200);
    target.cpost("/api/workflows/in-flight/signal/hurry", json!({})).await.ok(202);
    let resumed = target.next_workflow_task("w2", "q").await;
    let history = resumed["history_events"].as_array().expect("history");
    assert_eq!(
        history.first().map(|e| &e["id"]),
        bundle["history_events"][0].get("id"),
        "{resumed}"
    );
    let kinds = event_types(history);
    assert!(kinds.contains(&"ActivityCompleted".to_string()), "{kinds:?}");
    target
        .complete_workflow_task(&resumed, json!([complete_workflow(EMPTY_ARGS)]))
        .await
        .ok(200);
    assert_eq!(target.describe("in-flight").await["status"], "completed");
    let events = target.history_from("in-flight", run_id, &checksum).await;
    assert_eq!(event_types(&events).last().map(String::as_str), Some("WorkflowCompleted"));
    assert!(target.verify_offline().await.ok(), "the store verifies");
}
