//! DW's history budget on every answer that carries history, and the pending-signal cap.

use crate::common::*;
use capstan_engine::Limits;
use capstan_server::ServerConfig;
use serde_json::json;

/// A small run is `ok` on the worker's task, the worker's history page, the control-plane
/// history and describe (which also shows the thresholds); its byte count grows with its events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_budget_is_reported_where_dw_reports_it() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("budget", "w1", "q").await;
    let run_id = start["run_id"].as_str().unwrap();
    for body in [&task, &h.describe("budget").await] {
        assert_eq!(body["history_budget_pressure"], "ok", "{body}");
        assert_eq!(body["continue_as_new_recommended"], false);
        assert_eq!(body["history_budget_pressure_dimensions"], json!([]));
        assert!(body["history_size_bytes"].as_u64().unwrap() > 0, "{body}");
        assert_eq!(body["history_fan_out"], 0);
    }
    let described = h.describe("budget").await;
    assert_eq!(described["history_event_threshold"], 10_000);
    assert_eq!(described["history_event_warning_threshold"], 8_000);
    assert_eq!(described["history_size_bytes_threshold"], 5 * 1024 * 1024);
    assert_eq!(described["history_fan_out_warning_threshold"], 160);
    let listed = h.cget("/api/workflows?query=budget").await.ok(200);
    let item = &listed["workflows"][0];
    assert_eq!(
        (&item["workflow_id"], &item["history_budget_pressure"]),
        (&json!("budget"), &json!("ok")),
        "{listed}"
    );
    assert_eq!(item["history_event_count"], described["history_event_count"]);
    assert_eq!(item["history_size_bytes"], described["history_size_bytes"]);
    assert_eq!(
        (&item["continue_as_new_recommended"], &item["workflow_task_failing"]),
        (&json!(false), &json!(false))
    );
    let before = described["history_size_bytes"].as_u64().unwrap();
    let task_id = task["task_id"].as_str().unwrap();
    let page = h
        .wpost(
            &format!("/api/worker/workflow-tasks/{task_id}/history"),
            json!({"lease_owner": "w1", "workflow_task_attempt": 1, "next_history_page_token": "MA=="}),
        )
        .await
        .ok(200);
    assert_eq!(page["history_budget_pressure"], "ok", "{page}");
    assert_eq!(page["history_size_bytes"].as_u64(), Some(before));
    h.complete_workflow_task(&task, json!([{"type": "start_timer", "delay_seconds": 60}]))
        .await
        .ok(200);
    let history = h.cget(&format!("/api/workflows/budget/runs/{run_id}/history")).await.ok(200);
    assert!(history["history_size_bytes"].as_u64().unwrap() > before, "{history}");
    assert_eq!(history["history_budget_pressure"], "ok");
}

/// Signals waiting for workflow code are capped (DW's `pending_signal_count`): one more is
/// refused with 422 `structural_limit_exceeded` and recorded nowhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signals_past_the_pending_cap_are_refused() {
    let limits = Limits {
        pending_signals_max: 2,
        ..Limits::default()
    };
    let h = Harness::with_config(
        ServerConfig {
            limits,
            ..ServerConfig::default()
        },
        None,
    )
    .await;
    let start = h.start_workflow("capped", "q").await;
    for _ in 0..2 {
        h.cpost("/api/workflows/capped/signal/go", json!({})).await.ok(202);
    }
    let run_id = start["run_id"].as_str().unwrap();
    let events = h.history("capped", run_id).await.len();
    let refused = h
        .cpost("/api/workflows/capped/signal/go", json!({}))
        .await
        .err(422, "structural_limit_exceeded");
    assert_eq!(refused["limit_kind"], "pending_signal_count", "{refused}");
    assert_eq!((&refused["current_value"], &refused["configured_limit"]), (&json!(2), &json!(2)));
    assert_eq!(h.history("capped", run_id).await.len(), events, "nothing recorded");
}
