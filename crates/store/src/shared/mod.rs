//! [`SharedStore`]: the store on a database server that several Capstan nodes share
//! (PostgreSQL, MySQL, MariaDB). Every store method is written here once, over [`SharedTx`]; what only one
//! database does (connecting, migrating, waking other nodes, its settings) lives in that
//! database's module behind [`Database`].
//!
//! The database is the only authority. Every run transition holds the run's row lock
//! (`SELECT … FOR UPDATE`) while the engine checks owners, attempts and fences against the run
//! document it just read, so two nodes can never both advance one run. Pollers skip runs another
//! node is working on (`FOR UPDATE … SKIP LOCKED`). Background deadlines are claimed per task
//! under a duty fence (`claim_due_tasks`), taken over with fence + 1 when a node dies. Ready
//! tasks are announced at commit to every node, which wakes its pollers (PostgreSQL; on MySQL
//! the pollers' periodic re-check finds them).
//!
//! Lock order, everywhere: the run row first, then its task rows. The duty claim locks only task
//! rows, and `run_duty` locks the run row before the task row, so no two statements wait on each
//! other in a cycle.

mod claims;

use crate::backend::{Backend, Claim, Unit};
use crate::logic::admin;
use crate::logic::run_counts::{CountKey, Recounts};
use crate::mysql::{MyTx, Mysql};
use crate::parked_polls::Delivery;
use crate::postgres::{PgTx, Postgres};
use crate::tx::{Dialect, Param, Row, Statement, Tx};
use crate::*;
use serde_json::Value;
use std::sync::Arc;

/// The database a [`SharedStore`] runs on. (Only a few exist, so the variants' sizes need not
/// match.)
#[derive(Clone)]
#[allow(clippy::large_enum_variant)]
enum Database {
    Postgres(Postgres),
    Mysql(Mysql),
}

impl Database {
    /// The database the URL's scheme names.
    async fn connect(url: &str, schema: Option<&str>, now: Millis) -> StoreResult<Self> {
        let scheme = url.split("://").next().unwrap_or_default().to_ascii_lowercase();
        match scheme.as_str() {
            "postgres" | "postgresql" => Ok(Database::Postgres(Postgres::connect(url, schema, now).await?)),
            "mysql" | "mariadb" => {
                // The driver knows one scheme for both servers.
                let url = url.split_once("://").map(|(_, rest)| format!("mysql://{rest}")).unwrap_or_default();
                Ok(Database::Mysql(Mysql::connect(&url, schema, now).await?))
            }
            _ => Err(StoreError::Storage(format!(
                "database URL scheme {scheme:?} is not postgres://, postgresql://, mysql:// or mariadb://"
            ))),
        }
    }
}

/// A connection of a [`SharedStore`], inside a transaction ([`SharedStore::begin`]) or not
/// ([`SharedStore::reader`]). A transaction dropped before [`SharedStore::commit`] rolls back.
#[allow(clippy::large_enum_variant)] // one per open transaction, on its task's stack
pub enum SharedTx {
    Postgres(PgTx),
    Mysql(MyTx),
}

impl Tx for SharedTx {
    fn dialect(&self) -> Dialect {
        match self {
            SharedTx::Postgres(_) => Dialect::Postgres,
            SharedTx::Mysql(_) => Dialect::Mysql,
        }
    }

    async fn execute<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> StoreResult<u64> {
        match self {
            SharedTx::Postgres(tx) => tx.execute(sql, args).await,
            SharedTx::Mysql(tx) => tx.execute(sql, args).await,
        }
    }

    async fn query<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> StoreResult<Vec<Row>> {
        match self {
            SharedTx::Postgres(tx) => tx.query(sql, args).await,
            SharedTx::Mysql(tx) => tx.query(sql, args).await,
        }
    }

    async fn query_opt<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> StoreResult<Option<Row>> {
        match self {
            SharedTx::Postgres(tx) => tx.query_opt(sql, args).await,
            SharedTx::Mysql(tx) => tx.query_opt(sql, args).await,
        }
    }

    async fn execute_all<'a>(&'a mut self, statements: &'a [Statement<'a>]) -> StoreResult<()> {
        match self {
            SharedTx::Postgres(tx) => tx.execute_all(statements).await,
            SharedTx::Mysql(tx) => tx.execute_all(statements).await,
        }
    }

    async fn announce(&mut self, key: WakeKey) -> StoreResult<()> {
        match self {
            SharedTx::Postgres(tx) => tx.announce(key).await,
            SharedTx::Mysql(tx) => tx.announce(key).await,
        }
    }

    fn observe(&mut self, fact: Fact) {
        match self {
            SharedTx::Postgres(tx) => tx.observe(fact),
            SharedTx::Mysql(tx) => tx.observe(fact),
        }
    }

    fn hand_off(&mut self, delivery: Delivery) {
        match self {
            SharedTx::Postgres(tx) => tx.hand_off(delivery),
            SharedTx::Mysql(tx) => tx.hand_off(delivery),
        }
    }

    fn recount(&mut self, key: CountKey, delta: i64) {
        match self {
            SharedTx::Postgres(tx) => tx.recount(key, delta),
            SharedTx::Mysql(tx) => tx.recount(key, delta),
        }
    }

    fn take_recounts(&mut self) -> Recounts {
        match self {
            SharedTx::Postgres(tx) => tx.take_recounts(),
            SharedTx::Mysql(tx) => tx.take_recounts(),
        }
    }
}

/// What a committed transaction hands on: facts for the observer, leases for parked polls.
pub(crate) struct Committed {
    pub facts: Vec<Fact>,
    pub deliveries: Vec<Delivery>,
}

impl SharedTx {
    /// Runs statements without parameters as they are (savepoints).
    async fn batch(&mut self, sql: &str) -> StoreResult<()> {
        match self {
            SharedTx::Postgres(tx) => tx.batch(sql).await,
            SharedTx::Mysql(tx) => tx.batch(sql).await,
        }
    }

    /// A statement an atomic handler sent (the database's own placeholders, JSON parameters).
    async fn atomic_execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, String> {
        match self {
            SharedTx::Postgres(tx) => crate::postgres::atomic_execute(tx, sql, params).await,
            SharedTx::Mysql(tx) => crate::mysql::atomic_execute(tx, sql, params).await,
        }
    }

    /// A query an atomic handler sent; rows as JSON scalars.
    async fn atomic_query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, String> {
        match self {
            SharedTx::Postgres(tx) => crate::postgres::atomic_query(tx, sql, params).await,
            SharedTx::Mysql(tx) => crate::mysql::atomic_query(tx, sql, params).await,
        }
    }
}

/// The store on a database server several nodes share. Cheap to clone (a pool handle).
#[derive(Clone)]
pub struct SharedStore {
    database: Database,
    env: Arc<Env>,
}

impl SharedStore {
    /// Connects to the database `url` names (`postgres://` or `postgresql://`; `mysql://` or
    /// `mariadb://`), migrates it (one node at a time) and bootstraps the `default` namespace.
    pub async fn connect(url: &str, limits: Limits, now: Millis) -> StoreResult<Self> {
        Ok(Self::on(Database::connect(url, None, now).await?, limits))
    }

    /// Like [`connect`](Self::connect), with every table in `schema` (created if missing; on
    /// MySQL a database of that name on the same server): lets tests and tenants share one
    /// database server.
    pub async fn connect_in_schema(url: &str, schema: &str, limits: Limits, now: Millis) -> StoreResult<Self> {
        if !schema.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(StoreError::Storage(format!("schema name {schema:?} must be [A-Za-z0-9_]")));
        }
        Ok(Self::on(Database::connect(url, Some(schema), now).await?, limits))
    }

    fn on(database: Database, limits: Limits) -> Self {
        Self {
            database,
            env: Arc::new(Env::new(limits)),
        }
    }

    /// This store with its time and new ids drawn from `sources` (the wall clock and random
    /// ids until then). Call it before the store is used.
    pub fn with_sources(mut self, sources: Sources) -> Self {
        self.env = Arc::new(Env {
            sources,
            ..Env::clone(&self.env)
        });
        self
    }

    /// What the durability of an acknowledged change rests on, as the database reports it to
    /// the store's sessions.
    pub async fn durability(&self) -> StoreResult<Durability> {
        match &self.database {
            Database::Postgres(pg) => pg.durability().await,
            Database::Mysql(my) => my.durability().await,
        }
    }

    /// The bounded waits of the store's sessions, as the database reports them:
    /// `(lock wait, idle-in-transaction limit)`.
    pub async fn session_timeouts(&self) -> StoreResult<(String, String)> {
        match &self.database {
            Database::Postgres(pg) => pg.session_timeouts().await,
            Database::Mysql(my) => my.session_timeouts().await,
        }
    }

    /// A pooled connection outside a transaction: reads, and writes of one statement.
    async fn reader(&self) -> StoreResult<SharedTx> {
        match &self.database {
            Database::Postgres(pg) => Ok(SharedTx::Postgres(pg.autocommit().await?)),
            Database::Mysql(my) => Ok(SharedTx::Mysql(my.autocommit().await?)),
        }
    }

    /// A pooled connection inside a new transaction. The wait for it (the pool's queue) is
    /// how long this write waited before it ran: admission control reads it.
    async fn begin(&self) -> StoreResult<SharedTx> {
        let asked = std::time::Instant::now();
        let tx = match &self.database {
            Database::Postgres(pg) => SharedTx::Postgres(pg.begin().await?),
            Database::Mysql(my) => SharedTx::Mysql(my.begin().await?),
        };
        self.env.write_delay.observe(asked.elapsed());
        Ok(tx)
    }

    /// Rolls `tx` back before answering: a refused change leaves no lock behind it.
    async fn rollback(&self, tx: SharedTx) {
        match tx {
            SharedTx::Postgres(tx) => tx.rollback().await,
            SharedTx::Mysql(tx) => tx.rollback().await,
        }
    }

    /// Commits `tx`, then hands its facts and the commit's time to the observer and answers
    /// the parked polls it leased tasks to.
    async fn commit(&self, mut tx: SharedTx) -> StoreResult<()> {
        // Last, so the counter rows' locks are held only for the COMMIT.
        if let Err(error) = crate::logic::run_counts::flush(&mut tx).await {
            self.rollback(tx).await;
            return Err(error);
        }
        let started = std::time::Instant::now();
        let Committed { facts, deliveries } = match tx {
            SharedTx::Postgres(tx) => tx.commit().await?,
            SharedTx::Mysql(tx) => tx.commit().await?,
        };
        let observer = &self.env.observer;
        observer.get().commit(Commit {
            transactions: 1,
            took: started.elapsed(),
        });
        observer.committed(&facts);
        deliveries.into_iter().for_each(Delivery::deliver);
        Ok(())
    }
}

impl Backend for SharedStore {
    type Tx<'t> = SharedTx;

    fn env(&self) -> &Arc<Env> {
        &self.env
    }

    fn env_mut(&mut self) -> &mut Arc<Env> {
        &mut self.env
    }

    async fn read<T, F>(&self, unit: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut SharedTx) -> Unit<'t, T> + Send + 'static,
    {
        unit(&mut self.reader().await?).await
    }

    async fn write<T, F>(&self, unit: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut SharedTx) -> Unit<'t, T> + Send + 'static,
    {
        let mut tx = self.begin().await?;
        match unit(&mut tx).await {
            Ok(value) => {
                self.commit(tx).await?;
                Ok(value)
            }
            Err(error) => {
                self.rollback(tx).await;
                Err(error)
            }
        }
    }

    async fn write_one<T, F>(&self, unit: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut SharedTx) -> Unit<'t, T> + Send + 'static,
    {
        unit(&mut self.reader().await?).await
    }

    async fn claim(&self, claim: Claim) -> StoreResult<Option<(Task, RunState)>> {
        self.claim_task_checked(claim).await
    }

    async fn run_atomic(
        &self,
        namespace: String,
        actions: AtomicActions,
        codec: &'static dyn MemoCodec,
        now: Millis,
    ) -> StoreResult<Option<AtomicOutcome>> {
        self.run_atomic_task_checked(&namespace, actions, codec, now).await
    }

    async fn take_wakeups(&self) -> StoreResult<Option<WakeReceiver>> {
        match &self.database {
            Database::Postgres(pg) => pg.wakeups().await,
            // This node's commits only: pollers find other nodes' tasks by their re-check.
            Database::Mysql(my) => Ok(my.wakeups()),
        }
    }

    async fn probe(&self) -> StoreResult<()> {
        // Ready means a write commits now (see `probe_write`); not worth tracking failures to
        // skip, it is one tiny upsert.
        admin::probe_write(&mut self.reader().await?, self.env.now_ms()).await
    }

    fn connections(&self) -> PoolUse {
        match &self.database {
            Database::Postgres(pg) => pg.pool_use(),
            Database::Mysql(my) => my.pool_use(),
        }
    }
}
