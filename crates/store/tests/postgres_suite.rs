//! The store behaviour suite on PostgreSQL, plus what only a shared database can show:
//! wake-ups crossing from one node's store to another's.
//!
//! Needs `CAPSTAN_TEST_POSTGRES_URL` (scripts/test-all.sh starts a private PostgreSQL and sets
//! it). Each test works in its own schema, dropped afterwards.

use capstan_engine::*;
use capstan_store::suite::{start_request, NOW};
use capstan_store::*;
use std::time::Duration;

fn database_url() -> String {
    std::env::var("CAPSTAN_TEST_POSTGRES_URL")
        .expect("CAPSTAN_TEST_POSTGRES_URL must name a PostgreSQL database (scripts/test-all.sh starts one)")
}

/// Drops the test's schema when the test ends.
pub struct SchemaGuard {
    url: String,
    schema: String,
}

impl Drop for SchemaGuard {
    fn drop(&mut self) {
        let (url, schema) = (self.url.clone(), self.schema.clone());
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async {
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.ok()?;
                tokio::spawn(connection);
                client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await.ok()
            })
        })
        .join();
    }
}

async fn in_schema(schema: &str) -> PostgresStore {
    PostgresStore::connect_in_schema(&database_url(), schema, Limits::default(), NOW)
        .await
        .expect("connect to PostgreSQL")
}

async fn fresh() -> (PostgresStore, SchemaGuard) {
    let schema = format!("t_{}", ulid::Ulid::new().to_string().to_lowercase());
    let store = in_schema(&schema).await;
    (
        store,
        SchemaGuard {
            url: database_url(),
            schema,
        },
    )
}

capstan_store::store_suite!(fresh());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_task_on_one_node_wakes_pollers_on_another() {
    let (node_a, guard) = fresh().await;
    let node_b = in_schema(&guard.schema).await;
    let mut wakeups = node_b.wakeups().await.unwrap().expect("PostgreSQL publishes wake-ups");
    // Give the listener a moment to subscribe, then prove it hears a start on node A.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut started = 0;
    loop {
        node_a
            .start_workflow(start_request(&format!("wake-{started}"), "wake-q"), DuplicatePolicy::Fail, NOW)
            .await
            .unwrap();
        started += 1;
        match tokio::time::timeout(Duration::from_millis(500), wakeups.recv()).await {
            Ok(Some((namespace, kind, queue))) => {
                assert_eq!(
                    (namespace.as_str(), kind, queue.as_str()),
                    ("default", TaskKind::Workflow, "wake-q")
                );
                break;
            }
            _ if std::time::Instant::now() < deadline => continue,
            _ => panic!("no wake-up reached node B after {started} starts on node A"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_never_lease_one_task_twice() {
    let (node_a, guard) = fresh().await;
    let node_b = in_schema(&guard.schema).await;
    for i in 0..20 {
        node_a
            .start_workflow(start_request(&format!("race-{i}"), "race-q"), DuplicatePolicy::Fail, NOW)
            .await
            .unwrap();
    }
    let poll = |store: PostgresStore, owner: &'static str| {
        tokio::spawn(async move {
            let mut won = Vec::new();
            while let Some((task, _)) = store
                .claim_task("default", TaskKind::Workflow, "race-q", &[], owner, 60_000, NOW, None)
                .await
                .unwrap()
            {
                won.push(task.id);
            }
            won
        })
    };
    let (a, b) = (poll(node_a.clone(), "a"), poll(node_b.clone(), "b"));
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let mut all: Vec<_> = a.iter().chain(b.iter()).cloned().collect();
    assert_eq!(all.len(), 20, "every task leased");
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 20, "no task leased twice");
}
