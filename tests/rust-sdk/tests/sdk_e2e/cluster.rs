//! The Rust SDK against a two-node Capstan cluster sharing one PostgreSQL database: the
//! workers talk to one node, the client to the other, so every affinity and every session
//! lives in the database, not in a node's memory.

use super::*;
use durable_workflow::{StickyCacheOptions, WorkerSessionOptions};
use std::process::Command;

/// A fresh database on the test PostgreSQL (`CAPSTAN_TEST_POSTGRES_URL`), dropped on drop.
struct ScratchDatabase {
    admin_url: String,
    name: String,
}

fn psql(url: &str, sql: &str) {
    let done = Command::new("psql")
        .args([url, "-X", "-v", "ON_ERROR_STOP=1", "-At", "-c", sql])
        .output()
        .expect("psql runs (the PostgreSQL tests need it)");
    assert!(done.status.success(), "psql {sql}: {}", String::from_utf8_lossy(&done.stderr));
}

impl ScratchDatabase {
    fn create() -> Self {
        let admin_url = std::env::var("CAPSTAN_TEST_POSTGRES_URL")
            .expect("CAPSTAN_TEST_POSTGRES_URL must name a PostgreSQL database (scripts/test-all.sh starts one)");
        let name = unique("capstan_rust").replace('-', "_");
        psql(&admin_url, &format!("CREATE DATABASE {name}"));
        Self { admin_url, name }
    }

    fn url(&self) -> String {
        let (base, _) = self.admin_url.rsplit_once('/').expect("a database URL has a path");
        format!("{base}/{}", self.name)
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        psql(&self.admin_url, &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
    }
}

/// Two nodes on one database: (worker node, client node). The database outlives both.
async fn two_nodes(database: &ScratchDatabase) -> (CapstanServer, CapstanServer) {
    let url = database.url();
    let workers = CapstanServer::spawn_with(&["--database", &url]).await;
    let clients = CapstanServer::spawn_with(&["--database", &url]).await;
    (workers, clients)
}

/// A sticky worker on one node, the client on the other: the run's later tasks come back
/// to the worker's cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sticky_affinity_holds_across_two_nodes() {
    let database = ScratchDatabase::create();
    let (worker_node, client_node) = two_nodes(&database).await;
    let queue = unique("cluster-sticky-q");
    let mut worker = new_worker(&worker_node.client(), &queue)
        .build_id("capstan-cluster-v1")
        .sticky_cache(StickyCacheOptions::new(16).ttl(Duration::from_secs(60)))
        .expect("sticky options");
    worker.register_workflow("e2e.cluster-sticky", |ctx, _| async move {
        ctx.wait_signal("first").await?;
        ctx.wait_signal("second").await?;
        Ok(json!("done"))
    });
    worker
        .declare_workflow_signals("e2e.cluster-sticky", &["first", "second"])
        .expect("declare signals");
    within(CALL_TIMEOUT, "register", worker.register())
        .await
        .unwrap_or_else(|error| panic!("sticky registration refused: {error} ({error:?})"));
    let client = client_node.client();
    let workflow_id = unique("cluster-sticky");
    let handle = start(&client, "e2e.cluster-sticky", &queue, &workflow_id, json!([])).await;
    super::sticky::drive_until_waiting(&worker, &handle).await;
    for name in ["first", "second"] {
        super::sticky::signal_and_drive(&worker, &handle, name).await;
    }
    let result = within(RESULT_TIMEOUT, "result", handle.result(result_options(RESULT_TIMEOUT)))
        .await
        .expect("result");
    assert_eq!(result, json!("done"));
    let metrics = worker.sticky_cache_metrics().expect("metrics");
    assert_eq!((metrics.hit, metrics.forced_cold_replay), (2, 0), "{metrics:?}");
}

/// Session activities scheduled through one node run on the session's holder polling the
/// other, and the holder's shutdown closes the session there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn session_activities_run_on_their_holder_across_two_nodes() {
    let database = ScratchDatabase::create();
    let (worker_node, client_node) = two_nodes(&database).await;
    let queue = unique("cluster-session-q");
    let worker_id = unique("cluster-holder");
    let mut worker = new_worker(&worker_node.client(), &queue)
        .worker_id(worker_id.clone())
        .worker_sessions(true)
        .capabilities(["cache:e2e"]);
    let holder = worker_id.clone();
    worker.register_typed_activity("e2e.cluster-step", move |ctx, _step: u32| {
        let holder = holder.clone();
        async move {
            ctx.worker_session().expect("the task carries its session");
            ctx.heartbeat(json!({"step": "running"})).await?;
            Ok(holder)
        }
    });
    worker.register_typed_workflow("e2e.cluster-session", |ctx, session_id: String| async move {
        let options = WorkerSessionOptions::new(&session_id).requirements(["cache:e2e"]);
        let mut holders = Vec::new();
        for step in 0..2u32 {
            let holder: String = ctx
                .activity("e2e.cluster-step", json!(step))
                .in_worker_session(options.clone())
                .typed()
                .await?;
            holders.push(holder);
        }
        Ok(holders)
    });
    let mut running = RunningWorker::start(worker);
    let client = client_node.client();
    let handle = start(
        &client,
        "e2e.cluster-session",
        &queue,
        &unique("cluster-session"),
        json!(unique("session")),
    )
    .await;
    let result = running
        .result(&handle)
        .await
        .unwrap_or_else(|error| panic!("session workflow did not complete: {error} ({error:?})"));
    assert_eq!(result, json!([worker_id, worker_id]));
    running.shutdown().await;
}
