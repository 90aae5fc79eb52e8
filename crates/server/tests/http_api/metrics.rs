//! `/metrics` on every backend: the series exist from start-up, a small workload moves them,
//! and every series the shipped Grafana dashboard names is exported.

use super::*;

const DASHBOARD: &str = include_str!("../../../../deploy/grafana/capstan.json");

/// The metric families the dashboard's queries name (a histogram's `_bucket`, `_sum` and
/// `_count` stand for the histogram).
fn dashboard_families(exposition: &str) -> std::collections::BTreeSet<String> {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().expect("an expr").to_string());
        }
    }
    for variable in dashboard["templating"]["list"].as_array().expect("variables") {
        if let Some(definition) = variable["definition"].as_str() {
            exprs.push(definition.to_string());
        }
    }
    assert!(exprs.len() >= 20, "the dashboard has its panels: {}", exprs.len());
    let mut families = std::collections::BTreeSet::new();
    for expr in &exprs {
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if !(word.starts_with("capstan_") || word.starts_with("process_")) {
                continue;
            }
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    let base = word.strip_suffix(suffix)?;
                    exposition.contains(&format!("# TYPE {base} histogram\n")).then(|| base.to_string())
                })
                .unwrap_or_else(|| word.to_string());
            families.insert(family);
        }
    }
    families
}

/// Whether the exposition has a sample of `family` (a histogram: its `_count`).
fn has_sample(exposition: &str, family: &str) -> bool {
    exposition.lines().any(|line| {
        [family.to_string(), format!("{family}_count")]
            .iter()
            .any(|name| line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} ")))
    })
}

/// The value of the one sample of `name` whose labels include every one of `labels`.
fn value(exposition: &str, name: &str, labels: &[&str]) -> f64 {
    let found: Vec<f64> = exposition
        .lines()
        .filter(|line| line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} ")))
        .filter(|line| labels.iter().all(|label| line.contains(label)))
        .map(|line| line.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(found.len(), 1, "one sample of {name} with {labels:?}:\n{exposition}");
    found[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_exist_from_start_up_and_count_what_happens() {
    let h = Harness::start().await;
    let fresh = scrape(&h).await;
    // Declared from the start: every family the dashboard queries.
    let families = dashboard_families(&fresh);
    assert!(families.len() >= 25, "{families:?}");
    for family in &families {
        assert!(fresh.contains(&format!("# TYPE {family} ")), "{family} is declared at start-up");
    }
    // Closed label sets are at zero before anything happened.
    let complete = "route=\"/api/worker/workflow-tasks/:task_id/complete\"";
    for (name, labels) in [
        ("capstan_polls_total", vec!["kind=\"workflow\"", "outcome=\"empty\""]),
        ("capstan_task_dispatches_total", vec!["kind=\"activity\"", "delivery=\"again\""]),
        ("capstan_lease_expiries_total", vec!["namespace=\"default\"", "kind=\"workflow\""]),
        (
            "capstan_activity_timeouts_total",
            vec!["namespace=\"default\"", "timeout=\"heartbeat\""],
        ),
        ("capstan_timers_fired_total", vec!["namespace=\"default\""]),
        ("capstan_http_requests_total", vec![complete, "code=\"5xx\""]),
        ("capstan_http_refusals_total", vec![complete, "reason=\"lease_owner_mismatch\""]),
        ("capstan_http_requests_total", vec!["route=\"/ui/timeline.js\"", "code=\"2xx\""]),
        ("capstan_ledger_entries", vec!["namespace=\"default\"", "state=\"outcome_unknown\""]),
        ("capstan_integrity_incidents_open", vec!["namespace=\"default\""]),
        ("capstan_schedule_starts_total", vec!["namespace=\"default\""]),
    ] {
        assert_eq!(value(&fresh, name, &labels), 0.0, "{name} {labels:?} at zero");
    }
    assert_eq!(value(&fresh, "capstan_build_info", &[]), 1.0);
    assert!(value(&fresh, "capstan_db_pool_max_connections", &[]) >= 1.0);

    // A run started, polled, completed; a foreign worker's report; an empty poll; a run waiting.
    let (_, task) = h.started_and_leased("metered", "meter-worker", "metered-q").await;
    h.complete_workflow_task(&task, json!([complete_workflow(AVRO_NULL)])).await.ok(200);
    let mut foreign = task.clone();
    foreign["lease_owner"] = json!("another-worker");
    let stale = h.complete_workflow_task(&foreign, json!([complete_workflow(AVRO_NULL)])).await;
    assert_eq!(stale.status.as_u16(), 409);
    let stale_reason = stale.body["reason"].as_str().unwrap().to_string();
    assert!(h.poll_workflow("meter-worker", "metered-q", 0).await["task"].is_null());
    h.start_workflow("waiting", "metered-q").await;

    let text = scrape(&h).await;
    let started = ["namespace=\"default\"", "workflow_type=\"test.workflow\""];
    assert_eq!(value(&text, "capstan_workflows_started_total", &started), 2.0);
    let completed = ["namespace=\"default\"", "workflow_type=\"test.workflow\"", "reason=\"completed\""];
    assert_eq!(value(&text, "capstan_workflows_closed_total", &completed), 1.0);
    let failed = ["namespace=\"default\"", "workflow_type=\"test.workflow\"", "reason=\"failed\""];
    assert_eq!(value(&text, "capstan_workflows_closed_total", &failed), 0.0);
    assert_eq!(value(&text, "capstan_polls_total", &["kind=\"workflow\"", "outcome=\"task\""]), 1.0);
    assert_eq!(
        value(&text, "capstan_polls_total", &["kind=\"workflow\"", "outcome=\"empty\""]),
        1.0
    );
    assert_eq!(
        value(&text, "capstan_task_dispatches_total", &["kind=\"workflow\"", "delivery=\"first\""]),
        1.0
    );
    assert_eq!(value(&text, "capstan_http_requests_total", &[complete, "code=\"2xx\""]), 1.0);
    assert_eq!(value(&text, "capstan_http_requests_total", &[complete, "code=\"4xx\""]), 1.0);
    let refused = format!("reason=\"{stale_reason}\"");
    assert_eq!(value(&text, "capstan_http_refusals_total", &[complete, &refused]), 1.0);
    let queue = ["namespace=\"default\"", "kind=\"workflow\"", "queue=\"metered-q\""];
    assert_eq!(value(&text, "capstan_task_queue_ready", &queue), 1.0);
    assert_eq!(value(&text, "capstan_task_queue_leased", &queue), 0.0);
    let runs = |class: &str| format!("class=\"{class}\"");
    assert_eq!(
        value(&text, "capstan_workflow_runs", &["namespace=\"default\"", &runs("open")]),
        1.0
    );
    assert_eq!(
        value(&text, "capstan_workflow_runs", &["namespace=\"default\"", &runs("completed")]),
        1.0
    );
    h.cpost("/api/workflows/waiting/pause", json!({})).await.ok(200);
    let held = scrape(&h).await;
    assert_eq!(
        value(&held, "capstan_workflow_runs", &["namespace=\"default\"", &runs("paused")]),
        1.0
    );
    assert_eq!(
        value(&held, "capstan_workflow_runs", &["namespace=\"default\"", &runs("open")]),
        0.0
    );
    assert!(
        !held
            .lines()
            .any(|l| l.starts_with("capstan_task_queue_ready{") && l.contains("queue=\"metered-q\"")),
        "a paused run's task is not waiting for a worker"
    );
    h.cpost("/api/workflows/waiting/resume", json!({})).await.ok(200);
    assert!(value(&text, "capstan_store_commit_seconds_count", &[]) >= 3.0, "commits are timed");
    assert!(
        text.lines().all(|line| !line.contains("metered\"") && !line.contains("waiting\"")),
        "no workflow id is a label value"
    );
    let unmatched = h.http.get(h.url("/no/such/route")).send().await.unwrap();
    assert_eq!(unmatched.status().as_u16(), 404);
    let text = scrape(&h).await;
    assert_eq!(
        value(&text, "capstan_http_requests_total", &["route=\"unmatched\"", "code=\"4xx\""]),
        1.0
    );

    // With that workload, every series the dashboard names has samples (a process metric
    // only where the platform has them).
    for family in dashboard_families(&text) {
        if family.starts_with("process_") && !cfg!(target_os = "linux") {
            continue;
        }
        assert!(has_sample(&text, &family), "{family} has samples");
    }
}
