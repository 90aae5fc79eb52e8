//! The Rust crate's own shipped conformance runners (`durable-workflow-replay-conformance`,
//! `durable-workflow-memo-restart`) against a spawned `capstan serve`. They are built from this
//! workspace with `cargo build -p durable-workflow --bins` (scripts/test-all.sh does).

mod support;

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use support::CapstanServer;

fn runner(name: &str) -> PathBuf {
    let dir = std::env::var_os("DW_RUNNERS_DIR").map(PathBuf::from).unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("test executable");
        exe.parent()
            .and_then(|deps| deps.parent())
            .expect("target profile dir")
            .to_path_buf()
    });
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it with `cargo build -p durable-workflow --bins`",
        path.display()
    );
    path
}

/// Runs a runner off the async threads, in its own scratch directory.
async fn run(name: &str, server: &CapstanServer) -> (bool, String) {
    let binary = runner(name);
    let url = server.base_url().to_string();
    let scratch = tempfile::tempdir().expect("scratch dir");
    let dir = scratch.path().to_path_buf();
    let output = tokio::time::timeout(
        std::time::Duration::from_secs(240),
        tokio::task::spawn_blocking(move || Command::new(binary).arg("--server-url").arg(url).current_dir(dir).output()),
    )
    .await
    .expect("the runner finished within 240 s")
    .expect("runner task")
    .expect("runner started");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_replay_conformance_runner_passes() {
    let server = CapstanServer::spawn().await;
    let (ok, output) = run("durable-workflow-replay-conformance", &server).await;
    let start = output.find('{').expect("a JSON report");
    let report: Value = serde_json::Deserializer::from_str(&output[start..])
        .into_iter::<Value>()
        .next()
        .expect("report")
        .expect("valid JSON");
    assert!(ok, "runner failed: {output}");
    assert_eq!(report["outcome"], "pass", "{report:#}");
    let scenarios: Vec<(String, String)> = report["scenario_results"]
        .as_array()
        .expect("scenario results")
        .iter()
        .map(|s| {
            (
                s["scenario_id"].as_str().unwrap_or("?").to_string(),
                s["status"].as_str().unwrap_or("?").to_string(),
            )
        })
        .collect();
    assert_eq!(scenarios.len(), 3, "{scenarios:?}");
    assert!(scenarios.iter().all(|(_, outcome)| outcome == "pass"), "{scenarios:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_memo_restart_runner_passes() {
    let server = CapstanServer::spawn().await;
    let (ok, output) = run("durable-workflow-memo-restart", &server).await;
    assert!(ok, "runner failed: {output}");
    let line = output
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .expect("a JSON summary");
    let summary: Value = serde_json::from_str(line).expect("valid JSON");
    assert_eq!(summary["result"], "rust-replayed-memo", "{summary}");
    assert_eq!(summary["worker_restart"], true);
    assert_eq!(summary["memo_event_count"], 1);
}
