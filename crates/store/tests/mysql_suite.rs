//! The store behaviour suite on MariaDB (or MySQL), plus what only this database can show.
//!
//! Needs `CAPSTAN_TEST_MYSQL_URL` (scripts/test-all.sh starts a private MariaDB with
//! scripts/mariadb.sh and sets it). Each test works in a database of its own on that server,
//! dropped afterwards.

use capstan_engine::*;
use capstan_store::suite::{start_request, NOW};
use capstan_store::*;
use mysql_async::prelude::Queryable;
use std::collections::BTreeSet;

fn database_url() -> String {
    std::env::var("CAPSTAN_TEST_MYSQL_URL")
        .expect("CAPSTAN_TEST_MYSQL_URL must name a MariaDB or MySQL database (scripts/test-all.sh starts one)")
}

/// A connection to the test server itself (no database), for the checks that read its tables.
async fn admin() -> mysql_async::Conn {
    let opts = mysql_async::Opts::from_url(&database_url()).unwrap();
    mysql_async::Conn::new(mysql_async::OptsBuilder::from_opts(opts).db_name(None::<String>))
        .await
        .unwrap()
}

/// Drops the test's database when the test ends.
pub struct DatabaseGuard {
    name: String,
}

impl Drop for DatabaseGuard {
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async {
                let mut conn = admin().await;
                conn.query_drop(format!("DROP DATABASE IF EXISTS `{name}`")).await.ok()?;
                conn.disconnect().await.ok()
            })
        })
        .join();
    }
}

async fn in_database(name: &str) -> SharedStore {
    SharedStore::connect_in_schema(&database_url(), name, Limits::default(), NOW)
        .await
        .expect("connect to MariaDB")
}

async fn fresh() -> (SharedStore, DatabaseGuard) {
    let name = format!("t_{}", ulid::Ulid::new().to_string().to_lowercase());
    let store = in_database(&name).await;
    // The atomic actions' application table: MySQL refuses DDL inside a handler.
    let mut conn = admin().await;
    conn.query_drop(format!(
        "CREATE TABLE `{name}`.suite_balances (account VARCHAR(255) PRIMARY KEY, amount BIGINT NOT NULL)"
    ))
    .await
    .unwrap();
    (store, DatabaseGuard { name })
}

capstan_store::store_suite!(fresh());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_task_on_one_node_wakes_pollers_on_another() {
    let (node_a, guard) = fresh().await;
    let node_b = in_database(&guard.name).await;
    capstan_store::suite::a_ready_task_on_one_node_wakes_pollers_on_another(node_a, node_b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_set_on_one_node_holds_on_another_within_a_second() {
    let (node_a, guard) = fresh().await;
    let node_b = in_database(&guard.name).await;
    capstan_store::suite::a_limit_set_on_one_node_holds_on_another_within_a_second(node_a, node_b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_together_keep_a_leased_task_cap() {
    let (node_a, guard) = fresh().await;
    let node_b = in_database(&guard.name).await;
    capstan_store::suite::two_nodes_together_keep_a_leased_task_cap(node_a, node_b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_never_lease_one_task_twice() {
    let (node_a, guard) = fresh().await;
    let node_b = in_database(&guard.name).await;
    capstan_store::suite::two_nodes_never_lease_one_task_twice(node_a, node_b).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_transaction_is_rolled_back_before_its_connection_is_reused() {
    let (node_a, guard) = fresh().await;
    let node_b = in_database(&guard.name).await;
    capstan_store::suite::an_abandoned_transaction_is_rolled_back_before_its_connection_is_reused(node_a, node_b).await;
}

/// Ids compare byte for byte: case and trailing spaces make different ids, as on the other
/// databases (MySQL's default collations would fold or pad them into one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_differing_in_case_or_trailing_space_are_different_ids() {
    let (store, _guard) = fresh().await;
    for id in ["Order-1", "order-1", "order-1 "] {
        store
            .start_workflow(start_request(id, "ids-q"), DuplicatePolicy::Fail, NOW)
            .await
            .unwrap_or_else(|error| panic!("{id:?} is a new id: {error}"));
    }
}

/// The store's sessions wait a bounded time for a lock and, on MariaDB, for an idle
/// transaction; the server's durability settings are read and judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_bounded_and_durability_is_reported() {
    let (store, _guard) = fresh().await;
    let (lock, idle) = store.session_timeouts().await.unwrap();
    assert_eq!(lock, "10");
    assert!(idle == "30" || idle == "none", "{idle}");
    let durability = store.durability().await.unwrap();
    assert_eq!(durability.setting("innodb_flush_log_at_trx_commit"), Some("1"));
    assert!(durability.risks().is_empty(), "{:?}", durability.risks());
}

/// Tables and columns of a database (the digest columns MySQL keys need and the wake-up log
/// standing in for NOTIFY are its own, the atomic actions' table the test's).
async fn mysql_columns(database: &str) -> BTreeSet<String> {
    let mut conn = admin().await;
    let rows: Vec<(String, String)> = conn
        .exec(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = ?",
            (database,),
        )
        .await
        .unwrap();
    rows.into_iter()
        .filter(|(table, column)| {
            !matches!(table.as_str(), "suite_balances" | "wake_events")
                && !matches!(column.as_str(), "poll_key" | "request_key" | "catalog_key" | "route_key")
        })
        .map(|(table, column)| format!("{table}.{column}"))
        .collect()
}

fn sqlite_columns(path: &std::path::Path) -> BTreeSet<String> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut statement = conn
        .prepare(
            "SELECT m.name, c.name FROM sqlite_master m JOIN pragma_table_info(m.name) c
             WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite_%'",
        )
        .unwrap();
    let columns = statement
        .query_map([], |r| Ok(format!("{}.{}", r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    columns
}

/// The migrations are written per dialect; this holds MySQL's to the same tables and columns
/// as SQLite's (PostgreSQL's are held to SQLite's in postgres_suite.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_migrations_make_the_same_tables_and_columns_as_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("capstan.db");
    drop(SqliteStore::open(&path, Limits::default(), NOW).unwrap());
    let (_store, guard) = fresh().await;
    let sqlite = sqlite_columns(&path);
    let mysql = mysql_columns(&guard.name).await;
    let only_sqlite: Vec<_> = sqlite.difference(&mysql).collect();
    let only_mysql: Vec<_> = mysql.difference(&sqlite).collect();
    assert!(
        only_sqlite.is_empty() && only_mysql.is_empty(),
        "the migrations disagree: only on SQLite {only_sqlite:?}; only on MySQL {only_mysql:?}"
    );
    assert!(mysql.contains("runs.state"), "the shape was read: {mysql:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_run_document_opens_one_incident_and_blocks_the_run() {
    let (store, guard) = fresh().await;
    let database = guard.name.clone();
    let tamper: capstan_store::suite::Tamper = Box::new(move |run_id, document| {
        let database = database.clone();
        Box::pin(async move {
            let mut conn = admin().await;
            let sql = format!("UPDATE `{database}`.runs SET state = ? WHERE run_id = ?");
            conn.exec_drop(sql, (document, run_id)).await.unwrap();
        })
    });
    capstan_store::suite::an_unreadable_run_document_opens_one_incident_and_blocks_the_run(store, tamper).await;
}

/// An atomic handler's DDL would commit Capstan's transaction halfway on MySQL: it is refused
/// before it reaches the database, and the attempt fails with nothing written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_atomic_handler_cannot_commit_the_transaction_implicitly() {
    struct Ddl;
    impl AtomicAction for Ddl {
        fn run(&self, tx: &mut dyn AtomicTransaction, _: &serde_json::Value) -> Result<serde_json::Value, String> {
            tx.execute(
                "INSERT INTO suite_balances (account, amount) VALUES ($1, 1)",
                &["before-ddl".into()],
            )?;
            tx.execute("CREATE TABLE sneaky (a INT)", &[])?;
            Ok(serde_json::json!({}))
        }
    }
    let (store, guard) = fresh().await;
    let outcomes = capstan_store::suite::run_atomic_action_of(&store, std::sync::Arc::new(Ddl)).await;
    assert!(!outcomes.is_empty());
    for outcome in &outcomes {
        assert!(
            matches!(outcome, AtomicOutcome::Failed { message, .. } if message.contains("commits the transaction")),
            "{outcome:?}"
        );
    }
    let mut conn = admin().await;
    let written: Option<i64> = conn
        .query_first(format!("SELECT COUNT(*) FROM `{}`.suite_balances", guard.name))
        .await
        .unwrap();
    assert_eq!(written, Some(0), "the handler's write before the refusal was rolled back");
    let tables: Option<i64> = conn
        .query_first(format!(
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = '{}' AND table_name = 'sneaky'",
            guard.name
        ))
        .await
        .unwrap();
    assert_eq!(tables, Some(0));
}
