//! MySQL (8.0+) and MariaDB (10.11+) under [`SharedStore`](crate::SharedStore): connecting
//! (read committed, bounded lock waits, strict mode, byte-exact ids), migrating one node at a
//! time under a named lock, and the settings an operator's durability rests on. The store's
//! statements are the shared ones, translated (`dialect.rs`).
//!
//! No `NOTIFY`: a ready task is announced to this node's pollers at commit, and to the other
//! nodes through `wake_events`, a short log written in the committing transaction (so only
//! committed announcements are seen) that every node follows every 100 ms (`wake_log.rs`).

mod dialect;
mod migrations;
mod tx;
mod wake_log;

use crate::durability::Durability;
use crate::*;
use migrations::MIGRATIONS;
use mysql_async::prelude::Queryable;
use mysql_async::{Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};
use serde_json::Value;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
pub(crate) use tx::MyTx;

const POOL_SIZE: usize = 16;
/// How long a statement waits for a row lock before it fails (seconds, InnoDB's unit).
const LOCK_WAIT_SECONDS: u64 = 10;
/// How long a session may sit idle inside a transaction before MariaDB ends it (MySQL has no
/// such limit: a paused node's locks wait for its connection to drop).
const IDLE_IN_TRANSACTION_SECONDS: u64 = 30;

/// Which server answers: their spellings differ in a few settings and collations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flavour {
    Mysql,
    Mariadb,
}

/// MySQL's duplicate column (1060) and duplicate key name (1061).
const ALREADY_THERE: [u16; 2] = [1060, 1061];

impl Flavour {
    fn of(version: &str) -> Self {
        if version.to_ascii_lowercase().contains("mariadb") {
            Flavour::Mariadb
        } else {
            Flavour::Mysql
        }
    }

    /// A binary collation that does not pad: ids compare byte for byte.
    fn collation(self) -> &'static str {
        match self {
            Flavour::Mysql => "utf8mb4_0900_bin",
            Flavour::Mariadb => "utf8mb4_nopad_bin",
        }
    }

    /// What every session sets on connecting.
    fn session(self) -> Vec<String> {
        let mut setup = vec![
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED".to_string(),
            format!("SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_SECONDS}"),
            "SET SESSION sql_mode = 'STRICT_ALL_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'".to_string(),
            format!("SET NAMES utf8mb4 COLLATE {}", self.collation()),
        ];
        if self == Flavour::Mariadb {
            setup.push(format!("SET SESSION idle_transaction_timeout = {IDLE_IN_TRANSACTION_SECONDS}"));
        }
        setup
    }
}

/// Where committed transactions announce ready tasks to this node's pollers.
type LocalWakeups = tokio::sync::mpsc::UnboundedSender<WakeKey>;

/// How a transaction announces a ready task: to this node's pollers, and in the wake-up log
/// under this store's name.
struct Announcer {
    local: LocalWakeups,
    origin: Arc<str>,
}

/// A pool of connections to one MySQL or MariaDB database.
#[derive(Clone)]
pub(crate) struct Mysql {
    pool: Pool,
    flavour: Flavour,
    local: LocalWakeups,
    /// The receiving end of `local`, handed out once (to the server's hub).
    wakeups: Arc<std::sync::Mutex<Option<WakeReceiver>>>,
    /// This store's name in `wake_events`, so it does not follow its own announcements.
    origin: Arc<str>,
    /// Connections handed out and not yet returned (the driver does not count them).
    in_use: Arc<AtomicUsize>,
    /// Callers waiting for a connection (the pool is full).
    waiting: Arc<AtomicUsize>,
}

/// One count (a connection handed out, a caller waiting for one), taken back when dropped.
struct Lent(Arc<AtomicUsize>);

impl Drop for Lent {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The URL's options, connecting where the URL says. The driver would otherwise switch a
/// loopback TCP address to the server's Unix socket, going around whatever listens at that
/// address (a proxy, a pooler, a tunnel); a URL that sets `prefer_socket` itself is obeyed.
fn at_the_address_given(url: &str) -> StoreResult<Opts> {
    let opts = Opts::from_url(url)?;
    if url.contains("prefer_socket=") {
        return Ok(opts);
    }
    Ok(OptsBuilder::from_opts(opts).prefer_socket(false).into())
}

impl Mysql {
    /// Connects to the database the URL names (or to `schema`, created if missing, on the same
    /// server) and migrates it.
    pub(crate) async fn connect(url: &str, schema: Option<&str>, now: Millis) -> StoreResult<Self> {
        let opts = at_the_address_given(url)?;
        let database = match schema {
            Some(schema) => schema.to_string(),
            None => opts
                .db_name()
                .map(str::to_string)
                .ok_or_else(|| StoreError::Storage("the database URL must name a database (mysql://host/NAME)".into()))?,
        };
        let mut probe = mysql_async::Conn::new(OptsBuilder::from_opts(opts.clone()).db_name(None::<String>)).await?;
        let version: Option<String> = probe.query_first("SELECT VERSION()").await?;
        let flavour = Flavour::of(version.as_deref().unwrap_or_default());
        if schema.is_some() {
            probe
                .query_drop(format!(
                    "CREATE DATABASE IF NOT EXISTS `{database}` CHARACTER SET utf8mb4 COLLATE {}",
                    flavour.collation()
                ))
                .await?;
        }
        probe.disconnect().await?;
        let constraints = PoolConstraints::new(0, POOL_SIZE).expect("0 <= POOL_SIZE");
        let options = OptsBuilder::from_opts(opts)
            .db_name(Some(database))
            // An UPDATE reports the rows it matched, as PostgreSQL does, not only those whose
            // values changed: fences compare counts.
            .client_found_rows(true)
            .stmt_cache_size(Some(256))
            .setup(flavour.session())
            .pool_opts(PoolOpts::default().with_constraints(constraints));
        let (local, wakeups) = tokio::sync::mpsc::unbounded_channel();
        let store = Self {
            pool: Pool::new(options),
            flavour,
            local,
            wakeups: Arc::new(std::sync::Mutex::new(Some(wakeups))),
            origin: ulid::Ulid::new().to_string().into(),
            in_use: Arc::new(AtomicUsize::new(0)),
            waiting: Arc::new(AtomicUsize::new(0)),
        };
        store.migrate(now).await?;
        Ok(store)
    }

    async fn lend(&self) -> StoreResult<(mysql_async::Conn, Lent)> {
        // Counted while it waits, also if the caller gives up (the guard's drop uncounts it).
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let queued = Lent(self.waiting.clone());
        let conn = self.pool.get_conn().await?;
        drop(queued);
        self.in_use.fetch_add(1, Ordering::Relaxed);
        Ok((conn, Lent(self.in_use.clone())))
    }

    pub(crate) async fn autocommit(&self) -> StoreResult<MyTx> {
        let (conn, lent) = self.lend().await?;
        Ok(MyTx::autocommit(conn, lent, self.announcer()))
    }

    pub(crate) async fn begin(&self) -> StoreResult<MyTx> {
        let (conn, lent) = self.lend().await?;
        MyTx::begin(conn, lent, self.announcer()).await
    }

    fn announcer(&self) -> Announcer {
        Announcer {
            local: self.local.clone(),
            origin: self.origin.clone(),
        }
    }

    async fn migrate(&self, now: Millis) -> StoreResult<()> {
        let mut conn = self.pool.get_conn().await?;
        // One node migrates at a time; the others wait (as long as it takes).
        let locked: Option<Option<i64>> = conn
            .query_first("SELECT GET_LOCK(CONCAT('capstan_migrate:', DATABASE()), 3600)")
            .await?;
        if locked.flatten() != Some(1) {
            return Err(StoreError::Storage("could not take the migration lock within an hour".into()));
        }
        let result = self.migrate_locked(&mut conn, now).await;
        let _: Option<Option<i64>> = conn
            .query_first("SELECT RELEASE_LOCK(CONCAT('capstan_migrate:', DATABASE()))")
            .await?;
        result
    }

    async fn migrate_locked(&self, conn: &mut mysql_async::Conn, now: Millis) -> StoreResult<()> {
        let table = format!("ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE={}", self.flavour.collation());
        conn.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL) {table}"
        ))
        .await?;
        conn.query_drop(format!("{} {table}", schema_floor::CREATE_FLOOR_TABLE)).await?;
        // Not data: the wake-up log stands in for NOTIFY and is made at every start.
        conn.query_drop(format!("{} {table}", wake_log::CREATE_TABLE)).await?;
        let database: Option<i64> = conn.query_first("SELECT MAX(version) FROM schema_migrations").await?.flatten();
        let floor: Option<i64> = conn.query_first(schema_floor::READ_FLOOR).await?;
        let known = MIGRATIONS.last().map_or(0, |(version, _)| *version);
        schema_floor::admit(known, database, floor)?;
        for (version, sql) in MIGRATIONS {
            let applied: Option<i64> = conn
                .exec_first("SELECT 1 FROM schema_migrations WHERE version = ?", (*version,))
                .await?;
            if applied.is_some() {
                continue;
            }
            // DDL commits on its own here, so a migration cut short runs again from the top:
            // a table is made IF NOT EXISTS, and a column or index already there is taken as
            // added (MySQL has no IF NOT EXISTS for them).
            for statement in sql.split(";\n").map(str::trim).filter(|s| !s.is_empty()) {
                match conn.query_drop(statement.replace("{table}", &table)).await {
                    Err(mysql_async::Error::Server(e)) if ALREADY_THERE.contains(&e.code) => {}
                    done => done?,
                }
            }
            conn.exec_drop("INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)", (*version, now))
                .await?;
        }
        conn.exec_drop(
            "INSERT INTO schema_floor (id, floor) VALUES (1, ?) ON DUPLICATE KEY UPDATE floor = GREATEST(floor, VALUES(floor))",
            (schema_floor::schema_floor(crate::tx::Dialect::Mysql),),
        )
        .await?;
        conn.exec_drop(
            "INSERT INTO namespaces (name, description, created_at) VALUES ('default', 'Default namespace', ?)
             ON DUPLICATE KEY UPDATE name = name",
            (now,),
        )
        .await?;
        Ok(())
    }

    /// The server's settings an acknowledged change's survival rests on.
    pub(crate) async fn durability(&self) -> StoreResult<Durability> {
        const NAMES: [&str; 4] = ["innodb_flush_log_at_trx_commit", "log_bin", "sync_binlog", "innodb_doublewrite"];
        let mut tx = self.autocommit().await?;
        let values = tx
            .settings("SELECT @@innodb_flush_log_at_trx_commit, @@log_bin, @@sync_binlog, @@innodb_doublewrite")
            .await?;
        Ok(Durability {
            settings: NAMES.iter().map(|n| n.to_string()).zip(values).collect(),
        })
    }

    /// `(lock wait, idle-in-transaction limit)` as a session of the store sees them (MySQL has
    /// no idle-in-transaction limit: `none`).
    pub(crate) async fn session_timeouts(&self) -> StoreResult<(String, String)> {
        let mut tx = self.autocommit().await?;
        let sql = match self.flavour {
            Flavour::Mariadb => "SELECT @@innodb_lock_wait_timeout, @@idle_transaction_timeout",
            Flavour::Mysql => "SELECT @@innodb_lock_wait_timeout, 'none'",
        };
        let mut values = tx.settings(sql).await?.into_iter();
        Ok((values.next().unwrap_or_default(), values.next().unwrap_or_default()))
    }

    /// What transactions make ready (once: the server's hub takes it): this node's at commit,
    /// other nodes' as the wake-up log shows them.
    pub(crate) fn wakeups(&self) -> Option<WakeReceiver> {
        let receiver = self.wakeups.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take()?;
        tokio::spawn(wake_log::follow(self.pool.clone(), self.origin.clone(), self.local.clone()));
        Some(receiver)
    }

    pub(crate) fn pool_use(&self) -> PoolUse {
        let in_use = self.in_use.load(Ordering::Relaxed);
        PoolUse {
            max: POOL_SIZE,
            open: in_use,
            idle: 0,
            waiting: self.waiting.load(Ordering::Relaxed),
        }
    }
}

/// Runs a statement an atomic handler sent, inside the recording transaction.
pub(crate) async fn atomic_execute(tx: &mut MyTx, sql: &str, params: &[Value]) -> Result<u64, String> {
    tx.execute_raw(sql, params.iter().map(json_value).collect()).await
}

/// Runs a query an atomic handler sent; rows as JSON scalars.
pub(crate) async fn atomic_query(tx: &mut MyTx, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, String> {
    let rows = tx.query_raw(sql, params.iter().map(json_value).collect()).await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            row.into_iter()
                .map(|value| match value {
                    mysql_async::Value::NULL => Value::Null,
                    mysql_async::Value::Int(v) => Value::from(v),
                    mysql_async::Value::UInt(v) => Value::from(v),
                    mysql_async::Value::Float(v) => Value::from(f64::from(v)),
                    mysql_async::Value::Double(v) => Value::from(v),
                    mysql_async::Value::Bytes(bytes) => Value::from(String::from_utf8_lossy(&bytes).into_owned()),
                    other => Value::from(other.as_sql(true)),
                })
                .collect()
        })
        .collect())
}

fn json_value(value: &Value) -> mysql_async::Value {
    match value {
        Value::Null => mysql_async::Value::NULL,
        Value::Bool(b) => mysql_async::Value::Int(i64::from(*b)),
        Value::Number(n) if n.is_i64() => mysql_async::Value::Int(n.as_i64().unwrap_or_default()),
        Value::Number(n) => mysql_async::Value::Double(n.as_f64().unwrap_or_default()),
        other => mysql_async::Value::Bytes(json_text(other).unwrap_or_default().into_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tx::{args, Tx};

    /// A loopback address is connected to over TCP, as given (a fault proxy in front of the
    /// database is what the partition tests rely on), unless the URL asks for the socket.
    #[test]
    fn a_loopback_address_is_not_swapped_for_the_servers_socket() {
        let given = at_the_address_given("mysql://root@127.0.0.1:3306/capstan").unwrap();
        assert!(!given.prefer_socket());
        let asked = at_the_address_given("mysql://root@127.0.0.1:3306/capstan?prefer_socket=true").unwrap();
        assert!(asked.prefer_socket());
    }

    /// An UPDATE counts the rows it matched, as on PostgreSQL, not only those whose values
    /// changed: the shared logic reads a count of 0 as "no such row" (`client_found_rows`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_update_that_changes_nothing_still_counts_its_row() {
        let url = std::env::var("CAPSTAN_TEST_MYSQL_URL")
            .expect("CAPSTAN_TEST_MYSQL_URL must name a MariaDB or MySQL database (scripts/test-all.sh starts one)");
        let name = format!("u_{}", ulid::Ulid::new().to_string().to_lowercase());
        let store = Mysql::connect(&url, Some(&name), 0).await.unwrap();
        let mut tx = store.autocommit().await.unwrap();
        let sql = "UPDATE namespaces SET description = description WHERE name = $1";
        let counted = tx.execute(sql, &args!["default"]).await.unwrap();
        tx.batch(&format!("DROP DATABASE `{name}`")).await.unwrap();
        assert_eq!(counted, 1);
    }
}
