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

async fn in_schema(schema: &str) -> SharedStore {
    SharedStore::connect_in_schema(&database_url(), schema, Limits::default(), NOW)
        .await
        .expect("connect to PostgreSQL")
}

async fn fresh() -> (SharedStore, SchemaGuard) {
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
    capstan_store::suite::a_ready_task_on_one_node_wakes_pollers_on_another(node_a, node_b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_set_on_one_node_holds_on_another_within_a_second() {
    let (node_a, guard) = fresh().await;
    let node_b = in_schema(&guard.schema).await;
    capstan_store::suite::a_limit_set_on_one_node_holds_on_another_within_a_second(node_a, node_b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_together_keep_a_leased_task_cap() {
    let (node_a, guard) = fresh().await;
    let node_b = in_schema(&guard.schema).await;
    capstan_store::suite::two_nodes_together_keep_a_leased_task_cap(node_a, node_b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_never_lease_one_task_twice() {
    let (node_a, guard) = fresh().await;
    let node_b = in_schema(&guard.schema).await;
    capstan_store::suite::two_nodes_never_lease_one_task_twice(node_a, node_b).await;
}

/// Tables, columns and indexes of a store's schema: `table.column` and `index:name` entries.
type SchemaShape = std::collections::BTreeSet<String>;

fn sqlite_shape(path: &std::path::Path) -> SchemaShape {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut shape = SchemaShape::new();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for table in tables {
        let columns: Vec<String> = conn
            .prepare("SELECT name FROM pragma_table_info(?1)")
            .unwrap()
            .query_map([&table], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        shape.extend(columns.into_iter().map(|column| format!("{table}.{column}")));
    }
    let indexes: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND name NOT LIKE 'sqlite_autoindex_%' AND name NOT LIKE '%_pkey'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    shape.extend(indexes.into_iter().map(|index| format!("index:{index}")));
    shape
}

async fn postgres_shape(schema: &str) -> SchemaShape {
    let (client, connection) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let mut shape = SchemaShape::new();
    let columns = client
        .query(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = $1",
            &[&schema],
        )
        .await
        .unwrap();
    shape.extend(
        columns
            .iter()
            .map(|r| format!("{}.{}", r.get::<_, String>(0), r.get::<_, String>(1))),
    );
    // Primary keys are indexes PostgreSQL makes itself (SQLite's are its autoindexes, or a
    // `_pkey` index where a rowid table keeps its key apart: left out too).
    let indexes = client
        .query(
            "SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND indexname NOT LIKE '%_pkey'",
            &[&schema],
        )
        .await
        .unwrap();
    shape.extend(indexes.iter().map(|r| format!("index:{}", r.get::<_, String>(0))));
    shape
}

/// The two migration lists are written per dialect; this holds them to one schema: a table,
/// column or index that one backend's migrations add and the other's do not fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_backends_migrate_to_the_same_tables_columns_and_indexes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("capstan.db");
    drop(SqliteStore::open(&path, Limits::default(), NOW).unwrap());
    let (_store, guard) = fresh().await;
    let sqlite = sqlite_shape(&path);
    let postgres = postgres_shape(&guard.schema).await;
    let only_sqlite: Vec<_> = sqlite.difference(&postgres).collect();
    let only_postgres: Vec<_> = postgres.difference(&sqlite).collect();
    assert!(
        only_sqlite.is_empty() && only_postgres.is_empty(),
        "the migrations disagree: only on SQLite {only_sqlite:?}; only on PostgreSQL {only_postgres:?}"
    );
    assert!(
        sqlite.contains("runs.state") && sqlite.contains("index:tasks_ready"),
        "the shape was read: {sqlite:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_run_document_opens_one_incident_and_blocks_the_run() {
    let (store, guard) = fresh().await;
    let schema = guard.schema.clone();
    let tamper: capstan_store::suite::Tamper = Box::new(move |run_id, document| {
        let schema = schema.clone();
        Box::pin(async move {
            let (client, connection) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            let sql = format!("UPDATE {schema}.runs SET state = $1 WHERE run_id = $2");
            client.execute(&sql, &[&document, &run_id]).await.unwrap();
        })
    });
    capstan_store::suite::an_unreadable_run_document_opens_one_incident_and_blocks_the_run(store, tamper).await;
}

/// A session setting the operator names in the URL's `options` wins over the store's bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_timeout_named_in_the_url_wins() {
    let schema = format!("t_{}", ulid::Ulid::new().to_string().to_lowercase());
    let _guard = SchemaGuard {
        url: database_url(),
        schema: schema.clone(),
    };
    let separator = if database_url().contains('?') { '&' } else { '?' };
    let url = format!("{}{separator}options=-c%20idle_in_transaction_session_timeout%3D3s", database_url());
    let store = SharedStore::connect_in_schema(&url, &schema, Limits::default(), NOW).await.unwrap();
    assert_eq!(store.session_timeouts().await.unwrap(), ("10s".to_string(), "3s".to_string()));
}

/// What an acknowledged change's survival rests on: the test database flushes its WAL, writes
/// full pages, and the store's sessions commit synchronously whatever the database's default;
/// a URL that turns that off is reported as a risk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commits_are_durable_and_a_risky_setting_is_reported() {
    let (store, _guard) = fresh().await;
    let durability = store.durability().await.unwrap();
    assert_eq!(
        (
            durability.setting("fsync"),
            durability.setting("full_page_writes"),
            durability.setting("synchronous_commit")
        ),
        (Some("on"), Some("on"), Some("on"))
    );
    assert!(durability.risks().is_empty(), "{:?}", durability.risks());

    let schema = format!("t_{}", ulid::Ulid::new().to_string().to_lowercase());
    let _guard = SchemaGuard {
        url: database_url(),
        schema: schema.clone(),
    };
    let separator = if database_url().contains('?') { '&' } else { '?' };
    let url = format!("{}{separator}options=-c%20synchronous_commit%3Doff", database_url());
    let risky = SharedStore::connect_in_schema(&url, &schema, Limits::default(), NOW).await.unwrap();
    let risks = risky.durability().await.unwrap().risks();
    assert_eq!(risks.len(), 1, "{risks:?}");
    assert!(risks[0].starts_with("synchronous_commit = off"), "{risks:?}");
}

/// A node refuses a database whose schema floor is above the migrations it knows (an older
/// binary after an upgrade that older binaries cannot run against), and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_whose_floor_is_above_this_binary_is_refused() {
    let (store, guard) = fresh().await;
    drop(store);
    let (client, connection) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let schema = &guard.schema;
    client
        .batch_execute(&format!("UPDATE {schema}.schema_floor SET floor = 1000000"))
        .await
        .unwrap();
    let refused = match SharedStore::connect_in_schema(&database_url(), schema, Limits::default(), NOW).await {
        Err(StoreError::Incompatible(message)) => message,
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("an incompatible database was opened"),
    };
    assert!(refused.contains("written by a newer Capstan"), "{refused}");
    let floor: i64 = client
        .query_one(&format!("SELECT floor FROM {schema}.schema_floor"), &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(floor, 1_000_000, "the refusal wrote nothing");
}

/// Starts `workflow_id` and completes its first workflow task with a one-second timer.
async fn with_due_timer(store: &SharedStore, workflow_id: &str) -> RunState {
    let (_, run) = store
        .start_workflow(start_request(workflow_id, "timer-q"), DuplicatePolicy::Fail, NOW)
        .await
        .unwrap();
    let (task, _) = store
        .claim_task("default", TaskKind::Workflow, "timer-q", &[], "w", 60_000, NOW, None)
        .await
        .unwrap()
        .expect("a workflow task");
    let (id, fence) = (task.id.clone(), task.fence);
    let timer = WorkflowCommand::StartTimer {
        delay_seconds: 1,
        tags: Default::default(),
    };
    store
        .mutate_run("default", RunLocator::Task(id.clone()), NOW, move |run, cx| {
            complete_workflow_task(run, cx, &id, "w", fence, vec![timer])
        })
        .await
        .unwrap();
    run
}

/// A node paused inside a transaction holds its run's row lock: the other node's deadline duty
/// for that run passes over it at once (its claim stands until it expires) and fires the
/// other runs' timers; the sessions' waits are bounded by the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duty_passes_over_a_run_another_transaction_holds() {
    let (store, guard) = fresh().await;
    assert_eq!(
        store.session_timeouts().await.unwrap(),
        ("10s".to_string(), "30s".to_string()),
        "lock waits and idle transactions are bounded on every session"
    );
    let held = with_due_timer(&store, "held").await;
    with_due_timer(&store, "free").await;
    let due = store.claim_due_tasks("node-b", NOW + 1_000, 10, 30_000).await.unwrap();
    assert_eq!(due.len(), 2);

    let (frozen, connection) = tokio_postgres::connect(&database_url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let lock = format!(
        "SET search_path = {}; BEGIN; SELECT 1 FROM runs WHERE run_id = '{}' FOR UPDATE",
        guard.schema,
        held.run_id.as_str()
    );
    frozen.batch_execute(&lock).await.unwrap();

    let started = std::time::Instant::now();
    for task in &due {
        let id = task.task_id.clone();
        let result = store
            .run_duty(task, NOW + 1_000, move |run, cx| Ok(on_deadline(run, cx, &id)))
            .await;
        let task_run = store
            .load_run("default", RunLocator::Task(task.task_id.clone()))
            .await
            .unwrap()
            .unwrap();
        match result {
            Err(StoreError::Refused(refusal)) => {
                assert_eq!(refusal.reason, Reason::RunLocked);
                assert_eq!(task_run.run_id, held.run_id, "only the held run is passed over");
            }
            Ok((fired, _)) => {
                assert!(fired);
                assert_ne!(task_run.run_id, held.run_id);
            }
            Err(other) => panic!("unexpected {other:?}"),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(2), "nothing waited for the held lock");
    assert_eq!(
        store.next_deadline().await.unwrap(),
        Some(NOW + 31_000),
        "the passed-over duty is next due when its claim expires"
    );
    frozen.batch_execute("COMMIT").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_transaction_is_rolled_back_before_its_connection_is_reused() {
    let (node_a, guard) = fresh().await;
    let node_b = in_schema(&guard.schema).await;
    capstan_store::suite::an_abandoned_transaction_is_rolled_back_before_its_connection_is_reused(node_a, node_b).await;
}
