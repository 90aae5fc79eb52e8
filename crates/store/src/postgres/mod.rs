//! [`Store`] on PostgreSQL, for several Capstan nodes sharing one database.
//!
//! The database is the only authority. Every run transition holds the run's row lock
//! (`SELECT … FOR UPDATE`) while the engine checks owners, attempts and fences against the run
//! document it just read, so two nodes can never both advance one run. Pollers skip runs another
//! node is working on (`FOR UPDATE SKIP LOCKED`). Background deadlines are claimed per task under a
//! duty fence (`claim_due_tasks`), taken over with fence + 1 when a node dies. Ready tasks are
//! announced with `NOTIFY capstan_wake` at commit; every node `LISTEN`s and wakes its pollers.
//!
//! Lock order, everywhere: the run row first, then its task rows. The duty claim locks only task
//! rows, and `run_duty` locks the run row before the task row, so no two statements wait on each
//! other in a cycle.

mod migrations;
mod tx;

use crate::logic::{
    actions, admin, catalog, claim, duties, external_payloads, fleet, integrity, ledger_reads, namespaces, queries, runs, service_calls,
    sessions, streams,
};
use crate::rows::*;
use crate::schedules;
use crate::*;
use capstan_engine::schedule::Schedule;
use capstan_engine::workflow_stream::StreamItemInput;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Transaction};
use futures_util::StreamExt;
use migrations::MIGRATIONS;
use std::sync::Arc;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, NoTls};
use tx::PgTx;

/// Runs shared logic in a transaction of its own on a pooled connection and commits it:
/// `in_transaction!(self, |tx| logic::step(tx, …))`.
macro_rules! in_transaction {
    ($store:expr, |$tx:ident| $step:expr) => {
        async {
            let mut client = $store.pool.get().await?;
            let transaction = client.transaction().await?;
            let (value, facts) = {
                let $tx = &mut PgTx::new(&transaction, &$store.wake_channel);
                let value = $step.await?;
                (value, $tx.take_facts())
            };
            $store.commit(transaction, facts).await?;
            Ok::<_, StoreError>(value)
        }
        .await
    };
}

/// Commits `tx`. An error the database sent (a failed deferred check, a serialization failure)
/// means nothing was applied; a connection lost before the answer leaves the outcome unknown.
async fn commit(tx: deadpool_postgres::Transaction<'_>) -> StoreResult<()> {
    tx.commit().await.map_err(|error| {
        if error.as_db_error().is_some() {
            StoreError::from(error)
        } else {
            StoreError::OutcomeUnknown(error.to_string())
        }
    })
}

const POOL_SIZE: usize = 16;
/// How long a statement waits for a lock before it fails (and is retried by its caller).
pub const LOCK_TIMEOUT_MS: u64 = 10_000;
/// How long a session may sit idle inside a transaction before the database ends it.
pub const IDLE_IN_TRANSACTION_TIMEOUT_MS: u64 = 30_000;
const MIGRATION_LOCK: i64 = 0x00ca_9574_0001;
/// NOTIFY channel of the default schema; stores in another schema append its name.
const WAKE_CHANNEL: &str = "capstan_wake";

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        StoreError::Storage(format!("no database connection: {error}"))
    }
}

#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    config: tokio_postgres::Config,
    env: Arc<Env>,
    /// The NOTIFY channel of this store's schema (channels are database-wide).
    wake_channel: Arc<str>,
}

impl PostgresStore {
    /// Commits `tx`, then hands its facts and the commit's time to the observer.
    async fn commit(&self, tx: deadpool_postgres::Transaction<'_>, facts: Vec<Fact>) -> StoreResult<()> {
        let started = std::time::Instant::now();
        commit(tx).await?;
        let observer = &self.env.observer;
        observer.get().commit(Commit {
            transactions: 1,
            took: started.elapsed(),
        });
        observer.committed(&facts);
        Ok(())
    }

    async fn run_atomic_task_checked(
        &self,
        namespace: &str,
        actions: AtomicActions,
        codec: &'static dyn MemoCodec,
        now: Millis,
    ) -> StoreResult<Option<AtomicOutcome>> {
        // Only types this process has a handler for: another node may hold the others.
        let types: Vec<String> = actions.0.keys().cloned().collect();
        let mut client = self.pool.get().await?;
        let mut tx = client.transaction().await?;
        let row = tx
            .query_opt(
                "SELECT t.task_id, r.state, r.namespace, r.workflow_id, r.run_id FROM tasks t JOIN runs r ON r.run_id = t.run_id
                 WHERE t.namespace = $1 AND t.kind = 'activity' AND t.queue = $2 AND t.status = 'ready' AND t.available_at <= $3
                   AND t.type_name = ANY($4)
                 ORDER BY t.available_at, t.task_id LIMIT 1 FOR UPDATE OF r SKIP LOCKED",
                &[&namespace, &ATOMIC_QUEUE, &now, &types],
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let task_id = TaskId(row.get(0));
        let run = runs::read_run(row.get(1), row.get(2), row.get(3), row.get(4))?;
        let mut pg = PgTx::new(&tx, &self.wake_channel);
        let leased = actions::lease_atomic(&mut pg, run, task_id, &actions, codec, now, &self.env).await?;
        let step = match leased {
            actions::AtomicLease::Nothing => return Ok(None),
            actions::AtomicLease::Refused(outcome) => {
                let facts = pg.take_facts();
                self.commit(tx, facts).await?;
                return Ok(Some(outcome));
            }
            actions::AtomicLease::Ready(step) => *step,
        };
        let mut facts = pg.take_facts();
        let handled = match &step.handler {
            Err(message) => Err(message.clone()),
            Ok((action, arguments)) => {
                let savepoint = tx.savepoint("capstan_atomic").await?;
                let handled = actions::handler_result(codec, run_handler(&savepoint, action.clone(), arguments.clone()).await);
                if handled.is_ok() {
                    savepoint.commit().await?;
                } else {
                    savepoint.rollback().await?;
                }
                handled
            }
        };
        let mut pg = PgTx::new(&tx, &self.wake_channel);
        let outcome = actions::finish_atomic_step(&mut pg, step, handled, codec, now, &self.env).await?;
        facts.extend(pg.take_facts());
        self.commit(tx, facts).await?;
        Ok(Some(outcome))
    }
    #[allow(clippy::too_many_arguments)]
    async fn claim_task_checked(
        &self,
        namespace: &str,
        kind: TaskKind,
        queue: &str,
        types: &[String],
        owner: &str,
        lease_ms: i64,
        now: Millis,
        poll: Option<PollKey>,
    ) -> StoreResult<Option<(Task, RunState)>> {
        let mut client = self.pool.get().await?;
        // A few attempts: a candidate can turn out stale (leased a moment ago through another
        // node) and then the next one is taken.
        // Candidates this poller may not take now (a session activity of another worker's
        // session): not picked again in this claim.
        let mut skipped: Vec<String> = Vec::new();
        for _ in 0..4 {
            let tx = client.transaction().await?;
            // One round trip picks the oldest ready task whose run nobody else holds, and locks
            // that run; runs another poller or node is working on are skipped, not waited for.
            let sql = format!(
                "SELECT t.task_id, r.state, r.namespace, r.workflow_id, r.run_id FROM tasks t JOIN runs r ON r.run_id = t.run_id
                     WHERE t.namespace = $1 AND t.kind = $2 AND t.queue = $3 AND t.status = 'ready' AND t.available_at <= $4
                       AND ($5::text[] IS NULL OR t.type_name = ANY($5))
                       AND (t.compatibility IS NULL
                            OR t.compatibility = (SELECT w.build_id FROM workers w WHERE w.namespace = $1 AND w.worker_id = $6))
                       AND {}
                     ORDER BY t.available_at, t.task_id LIMIT 1 FOR UPDATE OF r SKIP LOCKED",
                sticky_free("t", "$6", "$4")
            );
            // Prepared once per connection: parsed and planned once, one round trip fewer.
            let statement = tx.prepare_cached(&sql).await?;
            let row = tx
                .query_opt(&statement, &[&namespace, &kind.as_str(), &queue, &now, &type_filter(types), &owner])
                .await?;
            let Some(row) = row else { return Ok(None) };
            let task_id = TaskId(row.get(0));
            let run = runs::read_run(row.get(1), row.get(2), row.get(3), row.get(4))?;
            let poller = claim::Poller {
                kind,
                owner,
                lease_ms,
                poll: poll.as_ref(),
            };
            let candidate = task_id.to_string();
            let mut pg = PgTx::new(&tx, &self.wake_channel);
            let claimed = claim::lease_candidate(&mut pg, run, task_id, &poller, now, &self.env).await?;
            let facts = pg.take_facts();
            self.commit(tx, facts).await?;
            match claimed {
                claim::Claimed::Leased(leased) => return Ok(Some(*leased)),
                claim::Claimed::Skipped => skipped.push(candidate),
                claim::Claimed::Refused | claim::Claimed::Stale => {}
            }
        }
        Ok(None)
    }

    /// A change that found a broken ledger chain, or a run document it cannot read, was not
    /// written: open an incident, block the run, and answer as refused.
    async fn guard<T>(&self, result: StoreResult<T>) -> StoreResult<T> {
        match result {
            Err(error) => Err(self.settle(error).await),
            ok => ok,
        }
    }

    /// Turns a breach or an unreadable run into an open incident and the refusal it answers.
    async fn settle(&self, error: StoreError) -> StoreError {
        let recorded = match error {
            StoreError::Integrity(breach) => self.record_breach(breach).await,
            StoreError::CorruptRun(breach) => self.record_unreadable_run(breach).await,
            other => return other,
        };
        match recorded {
            Ok(refusal) => refusal.into(),
            Err(error) => error,
        }
    }

    async fn record_unreadable_run(&self, breach: IntegrityBreach) -> StoreResult<Refusal> {
        in_transaction!(self, |tx| integrity::record_unreadable_run(
            tx,
            &breach,
            self.env.now_ms(),
            &self.env
        ))
    }

    /// A change that found a broken ledger chain was not written: open an incident and block
    /// the run, in a transaction of its own.
    async fn record_breach(&self, breach: IntegrityBreach) -> StoreResult<Refusal> {
        in_transaction!(self, |tx| integrity::record_breach(tx, &breach, self.env.now_ms(), &self.env))
    }

    /// The shared logic on a pooled connection, outside a transaction.
    fn on<'t>(&'t self, client: &'t deadpool_postgres::Client) -> PgTx<'t, 't> {
        PgTx::client(client, &self.wake_channel)
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

    /// Connects, migrates (one node at a time, under an advisory lock) and bootstraps `default`.
    pub async fn connect(url: &str, limits: Limits, now: Millis) -> StoreResult<Self> {
        let config: tokio_postgres::Config = url.parse().map_err(|e| StoreError::Storage(format!("bad database URL: {e}")))?;
        Self::with_config(config, limits, now, WAKE_CHANNEL.to_string()).await
    }

    /// Like [`connect`](Self::connect), with every table in `schema` (created if missing): lets
    /// tests and tenants share one database.
    pub async fn connect_in_schema(url: &str, schema: &str, limits: Limits, now: Millis) -> StoreResult<Self> {
        if !schema.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(StoreError::Storage(format!("schema name {schema:?} must be [A-Za-z0-9_]")));
        }
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| StoreError::Storage(format!("bad database URL: {e}")))?;
        let (client, connection) = config.connect(NoTls).await?;
        let driver = tokio::spawn(connection);
        client.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}")).await?;
        drop(client);
        let _ = driver.await;
        let options = format!("{} -c search_path={schema}", config.get_options().unwrap_or(""));
        config.options(options.trim());
        Self::with_config(config, limits, now, format!("{WAKE_CHANNEL}_{schema}")).await
    }

    async fn with_config(mut config: tokio_postgres::Config, limits: Limits, now: Millis, wake_channel: String) -> StoreResult<Self> {
        // Bounded waits on every session: a statement waits at most LOCK_TIMEOUT for a lock, and
        // a session left idle inside a transaction (its node paused or partitioned) is ended by
        // the database after IDLE_IN_TRANSACTION_TIMEOUT, which releases its locks. A COMMIT
        // returns once its WAL is flushed (`synchronous_commit = on`), whatever the database's
        // default: a 2xx promises that. The URL's own `options` come last, so a setting the
        // operator names there wins.
        let options = format!(
            "-c lock_timeout={LOCK_TIMEOUT_MS} -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT_MS} -c synchronous_commit=on {}",
            config.get_options().unwrap_or("")
        );
        config.options(options.trim());
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(|e| StoreError::Storage(e.to_string()))?;
        let store = Self {
            pool,
            config,
            env: Arc::new(Env::new(limits)),
            wake_channel: wake_channel.into(),
        };
        store.migrate(now).await?;
        Ok(store)
    }

    async fn migrate(&self, now: Millis) -> StoreResult<()> {
        let mut client = self.pool.get().await?;
        // Another node may migrate for longer than a lock wait is allowed elsewhere.
        client.batch_execute("SET lock_timeout = 0").await?;
        client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]).await?;
        let result = async {
            client.batch_execute("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)").await?;
            client.batch_execute(schema_floor::CREATE_FLOOR_TABLE).await?;
            let database: Option<i64> = client.query_one("SELECT MAX(version) FROM schema_migrations", &[]).await?.get(0);
            let floor: Option<i64> = client.query_opt(schema_floor::READ_FLOOR, &[]).await?.map(|row| row.get(0));
            let known = MIGRATIONS.last().map_or(0, |(version, _)| *version);
            schema_floor::admit(known, database, floor)?;
            for (version, sql) in MIGRATIONS {
                let applied = client.query_opt("SELECT 1 FROM schema_migrations WHERE version = $1", &[version]).await?.is_some();
                if applied {
                    continue;
                }
                let tx = client.transaction().await?;
                tx.batch_execute(sql).await?;
                tx.execute("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)", &[version, &now]).await?;
                commit(tx).await?;
            }
            client
                .execute(
                    "INSERT INTO schema_floor (id, floor) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET floor = GREATEST(schema_floor.floor, excluded.floor)",
                    &[&schema_floor::SCHEMA_FLOOR],
                )
                .await?;
            client
                .execute(
                    "INSERT INTO namespaces (name, description, created_at) VALUES ('default', 'Default namespace', $1) ON CONFLICT DO NOTHING",
                    &[&now],
                )
                .await?;
            Ok::<(), StoreError>(())
        }
        .await;
        client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]).await?;
        client.batch_execute("RESET lock_timeout").await?;
        result
    }

    /// What the durability of an acknowledged change rests on, as the database reports it to
    /// the store's sessions.
    pub async fn durability(&self) -> StoreResult<Durability> {
        let [fsync, full_page_writes, synchronous_commit] = self.settings(["fsync", "full_page_writes", "synchronous_commit"]).await?;
        Ok(Durability {
            fsync,
            full_page_writes,
            synchronous_commit,
        })
    }

    /// The bounded waits of the store's sessions, as the database reports them:
    /// `(lock_timeout, idle_in_transaction_session_timeout)`.
    pub async fn session_timeouts(&self) -> StoreResult<(String, String)> {
        let [lock, idle] = self.settings(["lock_timeout", "idle_in_transaction_session_timeout"]).await?;
        Ok((lock, idle))
    }

    /// The values of `names` as a session of the store sees them (as `SHOW` prints them), in
    /// one round trip.
    async fn settings<const N: usize>(&self, names: [&str; N]) -> StoreResult<[String; N]> {
        let client = self.pool.get().await?;
        let columns: Vec<String> = (1..=N).map(|i| format!("current_setting(${i})")).collect();
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = names.iter().map(|n| n as _).collect();
        let row = client.query_one(&format!("SELECT {}", columns.join(", ")), &params).await?;
        Ok(std::array::from_fn(|i| row.get::<_, String>(i)))
    }
}

/// PostgreSQL's settings an acknowledged change's survival rests on: `fsync` (WAL flushed to
/// disk at all), `full_page_writes` (no torn pages after a power cut), `synchronous_commit`
/// (COMMIT waits for the flush; the store's sessions ask for `on`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Durability {
    pub fsync: String,
    pub full_page_writes: String,
    pub synchronous_commit: String,
}

impl Durability {
    /// Each setting that lets a power cut lose or corrupt an acknowledged change, with why.
    pub fn risks(&self) -> Vec<String> {
        let mut risks = Vec::new();
        if self.fsync != "on" {
            risks.push(format!(
                "fsync = {}: the database does not flush its WAL; a power cut can lose or corrupt acknowledged changes",
                self.fsync
            ));
        }
        if self.full_page_writes != "on" {
            risks.push(format!(
                "full_page_writes = {}: a power cut mid-write can leave torn pages",
                self.full_page_writes
            ));
        }
        if !matches!(self.synchronous_commit.as_str(), "on" | "remote_write" | "remote_apply") {
            risks.push(format!(
                "synchronous_commit = {}: a COMMIT returns before its WAL is flushed; a crash can lose acknowledged changes",
                self.synchronous_commit
            ));
        }
        risks
    }
}

// ------------------------------------------------------------------------------------------

fn parse_kind(kind: &str) -> Option<TaskKind> {
    match kind {
        "workflow" => Some(TaskKind::Workflow),
        "activity" => Some(TaskKind::Activity),
        "query" => Some(TaskKind::Query),
        _ => None,
    }
}

/// The WHERE conditions of a listing over `runs r` joined to the current run of each instance
/// (namespace bound as `$1`, already in `params`). The status bucket is left out for counts.
fn list_conditions(filter: &ListFilter, with_status: bool, params: &mut Vec<Box<dyn ToSql + Sync + Send>>) -> String {
    let mut sql = String::from("r.namespace = $1");
    for (column, value) in [
        ("workflow_type", &filter.workflow_type),
        ("task_queue", &filter.task_queue),
        ("workflow_id", &filter.workflow_id),
        ("business_key", &filter.business_key),
    ] {
        if let Some(value) = value {
            params.push(Box::new(value.clone()));
            sql.push_str(&format!(" AND r.{column} = ${}", params.len()));
        }
    }
    if let Some(bucket) = filter.status_bucket.as_deref().filter(|_| with_status) {
        params.push(Box::new(bucket_statuses(bucket).iter().map(|s| s.to_string()).collect::<Vec<_>>()));
        sql.push_str(&format!(" AND r.status = ANY(${})", params.len()));
    }
    if let Some(query) = &filter.query {
        params.push(Box::new(like_pattern(query)));
        let n = params.len();
        sql.push_str(&format!(" AND (r.workflow_id LIKE ${n} OR r.business_key LIKE ${n})"));
    }
    for (key, value) in &filter.attributes {
        params.push(Box::new(key.clone()));
        params.push(Box::new(value.clone()));
        let n = params.len();
        sql.push_str(&format!(
            " AND r.run_id IN (SELECT run_id FROM search_attribute_index WHERE key = ${} AND value = ${n})",
            n - 1
        ));
    }
    if let Some(parsed) = &filter.filter {
        let base = params.len();
        let mut bound = Vec::new();
        let condition = crate::visibility_sql::compile(parsed, "r.", &mut bound, &|i| format!("${}", base + i + 1));
        sql.push_str(&format!(" AND {condition}"));
        params.extend(bound.into_iter().map(|p| -> Box<dyn ToSql + Sync + Send> {
            match p {
                crate::visibility_sql::SqlParam::Text(t) => Box::new(t),
                crate::visibility_sql::SqlParam::Number(x) => Box::new(x),
            }
        }));
    }
    sql
}

fn summary_from_state(state: &str) -> StoreResult<RunSummary> {
    let run: RunState = serde_json::from_str(state)?;
    Ok(summary_of(&run))
}

fn type_filter(types: &[String]) -> Option<Vec<String>> {
    (!types.is_empty()).then(|| types.to_vec())
}

impl RunStore for PostgresStore {
    fn with_observer(self, observer: Arc<dyn Observer>) -> Self {
        self.env.observer.set(observer);
        self
    }

    fn with_payload_codec(mut self, codec: &'static dyn MemoCodec) -> Self {
        self.env = Arc::new(Env {
            codec: Some(codec),
            ..Env::clone(&self.env)
        });
        self
    }

    async fn mutate_run<T, F>(&self, namespace: &str, locator: RunLocator, now: Millis, transition: F) -> StoreResult<(T, RunState)>
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    {
        let result = in_transaction!(self, |tx| runs::mutate(tx, namespace, &locator, now, &self.env, transition));
        self.guard(result).await
    }

    async fn mutate_run_keyed<T, F, R>(
        &self,
        namespace: &str,
        locator: RunLocator,
        key: CommandKey,
        now: Millis,
        transition: F,
        render: R,
    ) -> StoreResult<(KeyedReceipt<T>, Option<RunState>)>
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
        R: FnOnce(&T, &RunState) -> Value + Send + 'static,
    {
        let command = runs::KeyedCommand {
            namespace,
            locator: &locator,
            key: &key,
        };
        let result = in_transaction!(self, |tx| runs::mutate_keyed(tx, command, now, &self.env, transition, render));
        self.guard(result).await
    }

    async fn runs_page(&self, after: Option<RunId>, limit: usize) -> StoreResult<Vec<(String, WorkflowId, RunId)>> {
        let client = self.pool.get().await?;
        let after = after.map(|r| r.as_str().to_string()).unwrap_or_default();
        ledger_reads::runs_page(&mut self.on(&client), &after, limit).await
    }

    async fn start_workflow(&self, start: StartRun, policy: DuplicatePolicy, now: Millis) -> StoreResult<(StartOutcome, RunState)> {
        let result = in_transaction!(self, |tx| runs::start_workflow(tx, start, policy, now, &self.env));
        self.guard(result).await
    }

    async fn start_standalone_activity(&self, start: StartStandaloneActivity, now: Millis) -> StoreResult<RunState> {
        let result = in_transaction!(self, |tx| runs::start_standalone_activity(tx, start, now, &self.env));
        self.guard(result).await
    }

    async fn retained_command(
        &self,
        namespace: &str,
        workflow_id: &WorkflowId,
        command_type: &str,
        request_id: &str,
    ) -> StoreResult<Option<(String, Value)>> {
        let client = self.pool.get().await?;
        ledger_reads::retained_command(&mut self.on(&client), namespace, workflow_id, command_type, request_id).await
    }

    async fn load_run(&self, namespace: &str, locator: RunLocator) -> StoreResult<Option<RunState>> {
        let client = self.pool.get().await?;
        let result = runs::load_run(&mut self.on(&client), namespace, &locator).await;
        drop(client);
        self.guard(result).await
    }

    async fn history(&self, run_id: &RunId, after: u64, upto: u64, limit: usize) -> StoreResult<Vec<HistoryEvent>> {
        let client = self.pool.get().await?;
        runs::history(&mut self.on(&client), run_id, after, upto, limit).await
    }

    async fn stored_history(&self, run_id: &RunId, after: u64, upto: u64, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let client = self.pool.get().await?;
        runs::stored_history(&mut self.on(&client), run_id, after, upto, limit).await
    }

    async fn list_runs(&self, namespace: &str, filter: ListFilter, offset: usize, limit: usize) -> StoreResult<(Vec<RunSummary>, bool)> {
        let client = self.pool.get().await?;
        let mut params: Vec<Box<dyn ToSql + Sync + Send>> = vec![Box::new(namespace.to_string())];
        let mut sql = format!(
            "SELECT r.state FROM runs r JOIN workflow_instances i ON i.current_run_id = r.run_id WHERE {}",
            list_conditions(&filter, true, &mut params)
        );
        if let Some(after) = &filter.after {
            params.push(Box::new(after.started_at));
            params.push(Box::new(after.run_id.clone()));
            let n = params.len();
            sql.push_str(&format!(" AND (r.started_at, r.run_id) < (${}, ${n})", n - 1));
        }
        sql.push_str(&format!(
            " ORDER BY r.started_at DESC, r.run_id DESC LIMIT {} OFFSET {}",
            limit + 1,
            offset
        ));
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
        let rows = client.query(&sql, &refs).await?;
        let mut summaries = rows
            .iter()
            .map(|row| summary_from_state(row.get(0)))
            .collect::<StoreResult<Vec<_>>>()?;
        let more = summaries.len() > limit;
        summaries.truncate(limit);
        Ok((summaries, more))
    }

    async fn count_runs(&self, namespace: &str, filter: ListFilter) -> StoreResult<RunCounts> {
        let client = self.pool.get().await?;
        let mut params: Vec<Box<dyn ToSql + Sync + Send>> = vec![Box::new(namespace.to_string())];
        let sql = format!(
            "SELECT r.status, COUNT(*) FROM runs r JOIN workflow_instances i ON i.current_run_id = r.run_id WHERE {} GROUP BY r.status",
            list_conditions(&filter, false, &mut params)
        );
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
        let mut counts = RunCounts::default();
        for row in client.query(&sql, &refs).await? {
            let (status, count): (String, i64) = (row.get(0), row.get(1));
            count_into(&mut counts, &status, count as u64);
        }
        Ok(counts)
    }

    async fn runs_of(&self, namespace: &str, workflow_id: &WorkflowId) -> StoreResult<Vec<RunSummary>> {
        let client = self.pool.get().await?;
        runs::runs_of(&mut self.on(&client), namespace, workflow_id).await
    }
}

impl TaskStore for PostgresStore {
    async fn claim_task(
        &self,
        namespace: &str,
        kind: TaskKind,
        queue: &str,
        types: &[String],
        owner: &str,
        lease_ms: i64,
        now: Millis,
        poll: Option<PollKey>,
    ) -> StoreResult<Option<(Task, RunState)>> {
        match self
            .claim_task_checked(namespace, kind, queue, types, owner, lease_ms, now, poll)
            .await
        {
            Err(error @ (StoreError::Integrity(_) | StoreError::CorruptRun(_))) => match self.settle(error).await {
                StoreError::Refused(_) => Ok(None),
                other => Err(other),
            },
            other => other,
        }
    }

    async fn leased_tasks(&self, namespace: &str, owner: &str, kind: TaskKind) -> StoreResult<Vec<TaskId>> {
        let client = self.pool.get().await?;
        fleet::leased_tasks(&mut self.on(&client), namespace, owner, kind).await
    }

    async fn has_ready_task(&self, namespace: &str, kind: TaskKind, queue: &str, types: &[String], now: Millis) -> StoreResult<Readiness> {
        let client = self.pool.get().await?;
        let statement = client
            .prepare_cached(
                "SELECT EXISTS(SELECT 1 FROM tasks WHERE namespace = $1 AND kind = $2 AND queue = $3 AND status = 'ready' AND available_at <= $4),
                        EXISTS(SELECT 1 FROM tasks WHERE namespace = $1 AND kind = $2 AND queue = $3 AND status = 'ready' AND available_at <= $4
                                 AND ($5::text[] IS NULL OR type_name = ANY($5)))",
            )
            .await?;
        let row = client
            .query_one(&statement, &[&namespace, &kind.as_str(), &queue, &now, &type_filter(types)])
            .await?;
        Ok(Readiness {
            any: row.get(0),
            matching: row.get(1),
        })
    }

    async fn create_query_task(&self, task: QueryTask) -> StoreResult<()> {
        let client = self.pool.get().await?;
        queries::create_query_task(&mut self.on(&client), &task).await
    }

    async fn claim_query_task(
        &self,
        namespace: &str,
        queue: &str,
        kind: QueryKind,
        owner: &str,
        lease_ms: i64,
        now: Millis,
    ) -> StoreResult<Option<QueryTask>> {
        in_transaction!(self, |tx| queries::claim_query_task(
            tx, namespace, queue, kind, owner, lease_ms, now
        ))
    }

    async fn answer_query_task(
        &self,
        namespace: &str,
        id: &str,
        owner: &str,
        attempt: u32,
        outcome: QueryOutcome,
        now: Millis,
    ) -> StoreResult<QueryTask> {
        in_transaction!(self, |tx| queries::answer_query_task(
            tx, namespace, id, owner, attempt, outcome, now
        ))
    }

    async fn get_query_task(&self, namespace: &str, id: &str) -> StoreResult<Option<QueryTask>> {
        let client = self.pool.get().await?;
        queries::get_query_task(&mut self.on(&client), namespace, id).await
    }

    async fn delete_query_task(&self, namespace: &str, id: &str) -> StoreResult<()> {
        let client = self.pool.get().await?;
        queries::delete_query_task(&mut self.on(&client), namespace, id).await
    }

    async fn recall_poll(&self, key: PollKey) -> StoreResult<Option<(TaskId, u64)>> {
        let client = self.pool.get().await?;
        queries::recall_poll(&mut self.on(&client), &key).await
    }

    async fn wakeups(&self) -> StoreResult<Option<WakeReceiver>> {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let config = self.config.clone();
        let channel = self.wake_channel.clone();
        tokio::spawn(async move {
            // Reconnect forever: a lost listener only costs latency (pollers re-check the
            // database every second), never a task.
            loop {
                if let Err(error) = listen(&config, &channel, &sender).await {
                    tracing::warn!(%error, "wake-up listener lost its connection; reconnecting");
                }
                if sender.is_closed() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
        Ok(Some(receiver))
    }
}

impl DutyStore for PostgresStore {
    async fn run_duty<T, F>(&self, due: &DueTask, now: Millis, transition: F) -> StoreResult<(T, RunState)>
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    {
        let result = in_transaction!(self, |tx| runs::run_duty(tx, due, now, &self.env, transition));
        self.guard(result).await
    }

    async fn claim_due_tasks(&self, node: &str, now: Millis, limit: usize, hold_ms: i64) -> StoreResult<Vec<DueTask>> {
        let client = self.pool.get().await?;
        let statement = client
            .prepare_cached(
                "UPDATE tasks SET duty_owner = $1, duty_fence = duty_fence + 1, duty_expires_at = $3
                 WHERE task_id IN (
                     SELECT task_id FROM tasks
                     WHERE deadline_at IS NOT NULL AND deadline_at <= $2 AND status IN ('ready', 'leased')
                       AND (duty_expires_at IS NULL OR duty_expires_at <= $2)
                     ORDER BY deadline_at LIMIT $4 FOR UPDATE SKIP LOCKED)
                 RETURNING namespace, task_id, duty_fence",
            )
            .await?;
        let rows = client.query(&statement, &[&node, &now, &(now + hold_ms), &(limit as i64)]).await?;
        Ok(rows
            .iter()
            .map(|r| DueTask {
                namespace: r.get(0),
                task_id: TaskId(r.get(1)),
                duty_fence: r.get::<_, i64>(2) as u64,
            })
            .collect())
    }

    async fn next_deadline(&self) -> StoreResult<Option<Millis>> {
        let client = self.pool.get().await?;
        duties::next_deadline(&mut self.on(&client)).await
    }

    async fn prune(&self, older_than: Millis) -> StoreResult<()> {
        let client = self.pool.get().await?;
        duties::prune(&mut self.on(&client), older_than).await
    }

    async fn expired_instances(&self, namespace: &str, cutoff: Millis, limit: usize) -> StoreResult<Vec<(String, String, Millis)>> {
        let client = self.pool.get().await?;
        duties::expired_instances(&mut self.on(&client), namespace, cutoff, limit).await
    }

    async fn prune_instances(&self, namespace: &str, workflow_ids: Vec<String>, cutoff: Millis) -> StoreResult<usize> {
        in_transaction!(self, |tx| duties::prune_instances(tx, namespace, &workflow_ids, cutoff))
    }
}

impl FleetStore for PostgresStore {
    async fn register_worker(&self, worker: WorkerRecord) -> StoreResult<WorkerRecord> {
        in_transaction!(self, |tx| fleet::register_worker(tx, worker))
    }

    async fn heartbeat_worker(&self, namespace: &str, worker_id: &str, now: Millis) -> StoreResult<Option<WorkerRecord>> {
        let client = self.pool.get().await?;
        fleet::heartbeat_worker(&mut self.on(&client), namespace, worker_id, now).await
    }

    async fn get_worker(&self, namespace: &str, worker_id: &str) -> StoreResult<Option<WorkerRecord>> {
        let client = self.pool.get().await?;
        fleet::get_worker(&mut self.on(&client), namespace, worker_id).await
    }

    async fn session_step(
        &self,
        namespace: &str,
        session_id: &str,
        worker_id: &str,
        step: SessionStep,
        now: Millis,
    ) -> StoreResult<SessionAnswer> {
        in_transaction!(self, |tx| sessions::session_step(tx, namespace, session_id, worker_id, step, now))
    }

    async fn deregister_fenced(&self, namespace: &str, worker_id: &str, token: &str, now: Millis) -> StoreResult<(Value, bool)> {
        in_transaction!(self, |tx| fleet::deregister_fenced(tx, namespace, worker_id, token, now))
    }

    async fn get_session(&self, namespace: &str, session_id: &str) -> StoreResult<Option<WorkerSession>> {
        let client = self.pool.get().await?;
        sessions::get_session(&mut self.on(&client), namespace, session_id).await
    }

    async fn deregister_worker(&self, namespace: &str, worker_id: &str) -> StoreResult<bool> {
        let client = self.pool.get().await?;
        fleet::deregister_worker(&mut self.on(&client), namespace, worker_id).await
    }

    async fn build_id_rollouts(&self, namespace: &str, queue: &str) -> StoreResult<Vec<BuildIdRollout>> {
        let client = self.pool.get().await?;
        admin::build_id_rollouts(&mut self.on(&client), namespace, queue).await
    }

    async fn set_build_id_drain(
        &self,
        namespace: &str,
        queue: &str,
        build_id: Option<String>,
        draining: bool,
        now: Millis,
    ) -> StoreResult<BuildIdRollout> {
        in_transaction!(self, |tx| admin::set_build_id_drain(tx, namespace, queue, build_id, draining, now))
    }

    async fn promote_build_id(&self, namespace: &str, queue: &str, build_id: Option<String>, now: Millis) -> StoreResult<BuildIdRollout> {
        in_transaction!(self, |tx| admin::promote_build_id(tx, namespace, queue, build_id, now))
    }

    async fn workers(&self, namespace: &str) -> StoreResult<Vec<WorkerRecord>> {
        let client = self.pool.get().await?;
        fleet::workers(&mut self.on(&client), namespace).await
    }

    async fn task_queue_names(&self, namespace: &str) -> StoreResult<Vec<String>> {
        let client = self.pool.get().await?;
        fleet::task_queue_names(&mut self.on(&client), namespace).await
    }

    async fn task_queue_snapshot(&self, namespace: &str, queue: &str, lease_limit: usize) -> StoreResult<QueueSnapshot> {
        let client = self.pool.get().await?;
        fleet::task_queue_snapshot(&mut self.on(&client), namespace, queue, lease_limit).await
    }

    async fn queue_workers(&self, namespace: &str, queue: &str) -> StoreResult<Vec<WorkerRecord>> {
        let client = self.pool.get().await?;
        fleet::queue_workers(&mut self.on(&client), namespace, queue).await
    }
}

impl LedgerStore for PostgresStore {
    async fn run_atomic_task(
        &self,
        namespace: &str,
        actions: AtomicActions,
        codec: &'static dyn MemoCodec,
        now: Millis,
    ) -> StoreResult<Option<AtomicOutcome>> {
        let result = self.run_atomic_task_checked(namespace, actions, codec, now).await;
        self.guard(result).await
    }

    async fn ledger_stats(&self) -> StoreResult<LedgerStats> {
        let client = self.pool.get().await?;
        ledger_reads::ledger_stats(&mut self.on(&client)).await
    }

    async fn integrity_incidents(&self, namespace: &str, state: Option<String>) -> StoreResult<Vec<IntegrityIncident>> {
        let client = self.pool.get().await?;
        ledger_reads::integrity_incidents(&mut self.on(&client), namespace, state.as_deref()).await
    }

    async fn close_integrity_incident(
        &self,
        namespace: &str,
        incident_id: &str,
        note: String,
        now: Millis,
    ) -> StoreResult<IntegrityIncident> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let mut pg = PgTx::new(&tx, &self.wake_channel);
        let incident = integrity::close_incident(&mut pg, namespace, incident_id, note, now, &self.env).await?;
        let facts = pg.take_facts();
        self.commit(tx, facts).await?;
        Ok(incident)
    }

    async fn ledger_instances(&self) -> StoreResult<Vec<(String, WorkflowId)>> {
        let client = self.pool.get().await?;
        ledger_reads::ledger_instances(&mut self.on(&client)).await
    }

    async fn put_action_definition(
        &self,
        namespace: &str,
        activity_type: &str,
        recovery_mode: RecoveryMode,
        document: Map<String, Value>,
        now: Millis,
    ) -> StoreResult<ActionDefinition> {
        in_transaction!(self, |tx| actions::put_action_definition(
            tx,
            namespace,
            activity_type,
            recovery_mode,
            document,
            now
        ))
    }

    async fn action_definitions(&self, namespace: &str) -> StoreResult<Vec<ActionDefinition>> {
        let client = self.pool.get().await?;
        ledger_reads::action_definitions(&mut self.on(&client), namespace).await
    }

    async fn ledger_entries(&self, namespace: &str, filter: LedgerFilter, limit: usize) -> StoreResult<Vec<LedgerEntry>> {
        let client = self.pool.get().await?;
        ledger_reads::ledger_entries(&mut self.on(&client), namespace, &filter, limit).await
    }

    async fn ledger_entry(&self, namespace: &str, ledger_key: &str) -> StoreResult<Option<LedgerEntry>> {
        let client = self.pool.get().await?;
        ledger_reads::ledger_entry(&mut self.on(&client), namespace, ledger_key).await
    }

    async fn ledger_checkpoints(&self, namespace: &str, workflow_id: &WorkflowId) -> StoreResult<Vec<LedgerCheckpoint>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT doc FROM ledger_checkpoints WHERE namespace = $1 AND workflow_id = $2",
                &[&namespace, &workflow_id.as_str()],
            )
            .await?;
        let checkpoints = rows
            .iter()
            .map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(StoreError::from))
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(crate::chain_order(checkpoints))
    }
}

impl ScheduleStore for PostgresStore {
    async fn create_schedule(&self, schedule: Schedule) -> StoreResult<()> {
        in_transaction!(self, |tx| schedules::create_schedule(tx, schedule, &self.env))
    }

    async fn schedule(&self, namespace: &str, schedule_id: &str) -> StoreResult<Option<Schedule>> {
        let client = self.pool.get().await?;
        schedules::schedule(&mut self.on(&client), namespace, schedule_id).await
    }

    async fn list_schedules(&self, namespace: &str, filter: ScheduleFilter) -> StoreResult<Vec<Schedule>> {
        let client = self.pool.get().await?;
        schedules::list_schedules(&mut self.on(&client), namespace, &filter).await
    }

    async fn change_schedule<T: Send + 'static>(
        &self,
        namespace: &str,
        schedule_id: &str,
        change: impl FnOnce(&mut Schedule) -> Result<T, Refusal> + Send + 'static,
    ) -> StoreResult<T> {
        in_transaction!(self, |tx| schedules::change_schedule(tx, namespace, schedule_id, change, &self.env))
    }

    async fn fire_schedule(
        &self,
        namespace: &str,
        schedule_id: &str,
        fire: ScheduleFire,
        empty_input: Payload,
        now: Millis,
    ) -> StoreResult<FireReport> {
        in_transaction!(self, |tx| schedules::fire_schedule(
            tx,
            namespace,
            schedule_id,
            &fire,
            &empty_input,
            now,
            &self.env
        ))
    }

    async fn due_schedules(&self, now: Millis, limit: usize) -> StoreResult<Vec<(String, String)>> {
        let client = self.pool.get().await?;
        schedules::due_schedules(&mut self.on(&client), now, limit).await
    }

    async fn next_schedule_wake(&self) -> StoreResult<Option<Millis>> {
        let client = self.pool.get().await?;
        schedules::next_schedule_wake(&mut self.on(&client)).await
    }

    async fn schedule_history(
        &self,
        namespace: &str,
        schedule_id: &str,
        after_sequence: i64,
        limit: usize,
    ) -> StoreResult<Option<Vec<ScheduleEventRecord>>> {
        let client = self.pool.get().await?;
        schedules::schedule_history(&mut self.on(&client), namespace, schedule_id, after_sequence, limit).await
    }
}

impl CatalogStore for PostgresStore {
    async fn create_catalog_entry(&self, entry: CatalogEntry) -> StoreResult<CatalogEntry> {
        in_transaction!(self, |tx| catalog::create(tx, entry))
    }

    async fn update_catalog_entry(&self, key: CatalogKey, doc: Map<String, Value>, now: Millis) -> StoreResult<CatalogEntry> {
        in_transaction!(self, |tx| catalog::update(tx, &key, doc, now))
    }

    async fn catalog_entry(&self, key: CatalogKey) -> StoreResult<Option<CatalogEntry>> {
        let client = self.pool.get().await?;
        catalog::find(&mut self.on(&client), &key).await
    }

    async fn catalog_children(&self, namespace: &str, parent: Option<CatalogKey>) -> StoreResult<Vec<CatalogEntry>> {
        let client = self.pool.get().await?;
        catalog::children(&mut self.on(&client), namespace, parent.as_ref()).await
    }

    async fn delete_catalog_entry(&self, key: CatalogKey) -> StoreResult<CatalogEntry> {
        in_transaction!(self, |tx| catalog::delete(tx, &key))
    }

    async fn admit_service_calls<T, F>(&self, now: Millis, admit: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Cx) -> T + Send + 'static,
    {
        in_transaction!(self, |tx| service_calls::admit_direct(tx, now, &self.env, admit))
    }

    async fn cancel_service_call(
        &self,
        service_call_id: &str,
        reason: Option<String>,
        now: Millis,
        propagate: bool,
    ) -> StoreResult<ServiceCallRecord> {
        in_transaction!(self, |tx| service_calls::cancel(
            tx,
            service_call_id,
            reason,
            now,
            propagate,
            &self.env
        ))
    }

    async fn service_call(&self, service_call_id: &str) -> StoreResult<Option<ServiceCallRecord>> {
        let client = self.pool.get().await?;
        service_calls::find(&mut self.on(&client), service_call_id).await
    }

    async fn service_call_by_key(&self, route: RouteKey, idempotency_key: &str) -> StoreResult<Option<ServiceCallRecord>> {
        let client = self.pool.get().await?;
        service_calls::find_by_key(&mut self.on(&client), &route, idempotency_key).await
    }

    async fn service_calls_of_caller(
        &self,
        caller_namespace: &str,
        workflow_id: &str,
        run_id: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<ServiceCallRecord>> {
        let client = self.pool.get().await?;
        service_calls::of_caller(&mut self.on(&client), caller_namespace, workflow_id, run_id, limit).await
    }
}

impl PayloadStore for PostgresStore {
    async fn record_external_payload(&self, record: ExternalPayloadRecord) -> StoreResult<()> {
        let client = self.pool.get().await?;
        external_payloads::insert(&mut self.on(&client), &record).await
    }

    async fn external_payload(&self, namespace: &str, reference_id: &str) -> StoreResult<Option<ExternalPayloadRecord>> {
        let client = self.pool.get().await?;
        external_payloads::find(&mut self.on(&client), namespace, reference_id).await
    }

    async fn unused_external_payloads(&self, created_before: Millis, limit: i64) -> StoreResult<Vec<ExternalPayloadRecord>> {
        let client = self.pool.get().await?;
        external_payloads::unused(&mut self.on(&client), created_before, limit).await
    }

    async fn forget_unused_external_payload(&self, namespace: &str, reference_id: &str) -> StoreResult<bool> {
        let client = self.pool.get().await?;
        external_payloads::forget_unused(&mut self.on(&client), namespace, reference_id).await
    }

    async fn set_namespace_external_storage(
        &self,
        name: &str,
        policy: Option<ExternalStoragePolicy>,
        now: Millis,
    ) -> StoreResult<NamespaceRecord> {
        in_transaction!(self, |tx| namespaces::set_external_storage(tx, name, policy, now))
    }
}

impl StreamStore for PostgresStore {
    async fn append_stream_items(
        &self,
        target: StreamTarget,
        items: Vec<StreamItemInput>,
        max_pending_items: Option<u64>,
        now: Millis,
    ) -> StoreResult<StreamAppend> {
        in_transaction!(self, |tx| streams::client_append(tx, &target, &items, max_pending_items, now))
    }

    async fn finish_stream(
        &self,
        target: StreamTarget,
        error_reason: Option<String>,
        retention_seconds: Option<i64>,
        now: Millis,
    ) -> StoreResult<StreamState> {
        in_transaction!(self, |tx| streams::client_finish(
            tx,
            &target,
            error_reason.as_deref(),
            retention_seconds,
            now
        ))
    }

    async fn list_streams(&self, namespace: &str, workflow_id: &str, run_id: &str) -> StoreResult<Vec<StreamState>> {
        let client = self.pool.get().await?;
        streams::list(&mut self.on(&client), namespace, workflow_id, run_id).await
    }

    async fn read_stream(&self, target: StreamTarget, from: u64, max: u64) -> StoreResult<(StreamState, Vec<StoredStreamItem>)> {
        let client = self.pool.get().await?;
        streams::read(&mut self.on(&client), &target, from, max).await
    }

    async fn stream_caught_up(&self, target: StreamTarget, next_offset: u64) -> StoreResult<()> {
        let client = self.pool.get().await?;
        streams::caught_up(&mut self.on(&client), &target, next_offset).await
    }

    async fn expire_streams(&self, now: Millis) -> StoreResult<u64> {
        let client = self.pool.get().await?;
        streams::expire(&mut self.on(&client), now).await
    }
}

impl AdminStore for PostgresStore {
    async fn namespaces(&self) -> StoreResult<Vec<NamespaceRecord>> {
        let client = self.pool.get().await?;
        namespaces::namespaces(&mut self.on(&client)).await
    }

    async fn create_namespace(&self, record: NamespaceRecord) -> StoreResult<NamespaceRecord> {
        let client = self.pool.get().await?;
        namespaces::create_namespace(&mut self.on(&client), record).await
    }

    async fn update_namespace(
        &self,
        name: &str,
        description: Option<String>,
        retention_days: Option<i64>,
        now: Millis,
    ) -> StoreResult<NamespaceRecord> {
        in_transaction!(self, |tx| namespaces::update_namespace(tx, name, description, retention_days, now))
    }

    async fn delete_namespace(&self, name: &str) -> StoreResult<NamespaceRecord> {
        in_transaction!(self, |tx| namespaces::delete_namespace(tx, name))
    }

    async fn ping(&self) -> StoreResult<()> {
        let client = self.pool.get().await?;
        // Ready means a write commits now. A connection check alone passes on a database that
        // refuses writes (a demoted primary, read-only by default, a resource limit), so the
        // probe writes its row; it is one tiny upsert, not worth tracking failures to skip.
        client
            .execute(
                "INSERT INTO health_probe (id, probed_at) VALUES (1, extract(epoch FROM now())::bigint) \
                 ON CONFLICT (id) DO UPDATE SET probed_at = EXCLUDED.probed_at",
                &[],
            )
            .await?;
        Ok(())
    }

    async fn namespace_exists(&self, namespace: &str) -> StoreResult<bool> {
        let client = self.pool.get().await?;
        namespaces::namespace_exists(&mut self.on(&client), namespace).await
    }

    async fn queue_loads(&self, now: Millis, limit: usize) -> StoreResult<Vec<QueueLoad>> {
        let client = self.pool.get().await?;
        duties::queue_loads(&mut self.on(&client), now, limit).await
    }

    fn pool_use(&self) -> PoolUse {
        let status = self.pool.status();
        PoolUse {
            max: status.max_size,
            open: status.size,
            idle: status.available,
            waiting: status.waiting,
        }
    }

    async fn system_counts(&self, namespace: &str, now: Millis) -> StoreResult<SystemCounts> {
        let client = self.pool.get().await?;
        duties::system_counts(&mut self.on(&client), namespace, now).await
    }

    async fn bridge_delivery(&self, namespace: &str, adapter: &str, key: &str) -> StoreResult<Option<Value>> {
        let client = self.pool.get().await?;
        admin::bridge_delivery(&mut self.on(&client), namespace, adapter, key).await
    }

    async fn record_bridge_delivery(
        &self,
        namespace: &str,
        adapter: &str,
        key: &str,
        outcome: Value,
        now: Millis,
    ) -> StoreResult<Option<Value>> {
        let client = self.pool.get().await?;
        admin::record_bridge_delivery(&mut self.on(&client), namespace, adapter, key, &outcome, now).await
    }

    async fn search_attribute_definitions(
        &self,
        namespace: &str,
    ) -> StoreResult<std::collections::BTreeMap<String, capstan_engine::visibility::AttributeType>> {
        let client = self.pool.get().await?;
        admin::search_attribute_definitions(&mut self.on(&client), namespace).await
    }

    async fn define_search_attribute(
        &self,
        namespace: &str,
        name: &str,
        kind: capstan_engine::visibility::AttributeType,
        now: Millis,
    ) -> StoreResult<()> {
        let client = self.pool.get().await?;
        admin::define_search_attribute(&mut self.on(&client), namespace, name, kind, now).await
    }

    async fn delete_search_attribute(&self, namespace: &str, name: &str) -> StoreResult<bool> {
        let client = self.pool.get().await?;
        admin::delete_search_attribute(&mut self.on(&client), namespace, name).await
    }
}

async fn listen(
    config: &tokio_postgres::Config,
    channel: &str,
    sender: &tokio::sync::mpsc::UnboundedSender<(String, TaskKind, String)>,
) -> StoreResult<()> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    let listen_sql = format!("LISTEN {channel}");
    let listening = client.batch_execute(&listen_sql);
    // The connection must be driven while LISTEN runs; do both until LISTEN returns.
    tokio::pin!(listening);
    loop {
        tokio::select! {
            result = &mut listening => { result?; break; }
            message = messages.next() => match message {
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(error.into()),
                None => return Err(StoreError::Storage("listener connection closed".into())),
            }
        }
    }
    while let Some(message) = messages.next().await {
        if let AsyncMessage::Notification(notification) = message? {
            let mut parts = notification.payload().splitn(3, '\u{1f}');
            if let (Some(namespace), Some(kind), Some(queue)) = (parts.next(), parts.next().and_then(parse_kind), parts.next()) {
                if sender.send((namespace.to_string(), kind, queue.to_string())).is_err() {
                    return Ok(());
                }
            }
        }
    }
    Err(StoreError::Storage("listener connection closed".into()))
}

/// One statement an atomic handler asks for; the async side that owns the savepoint runs it.
enum AtomicRequest {
    Execute(String, Vec<Value>, tokio::sync::oneshot::Sender<Result<u64, String>>),
    Query(String, Vec<Value>, tokio::sync::oneshot::Sender<Result<Vec<Vec<Value>>, String>>),
}

/// An atomic action's view of the PostgreSQL transaction (inside its savepoint). The handler is
/// synchronous, so it runs on a blocking thread and each statement is a request to the task
/// that owns the connection; no runtime thread ever blocks on it.
struct PgAtomic {
    requests: tokio::sync::mpsc::UnboundedSender<AtomicRequest>,
}

impl PgAtomic {
    fn ask<T>(&self, request: impl FnOnce(tokio::sync::oneshot::Sender<Result<T, String>>) -> AtomicRequest) -> Result<T, String> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.requests
            .send(request(reply))
            .map_err(|_| "the transaction is gone".to_string())?;
        answer.blocking_recv().map_err(|_| "the transaction is gone".to_string())?
    }
}

/// Runs `action` on a blocking thread, serving its statements on `savepoint` until it returns.
async fn run_handler(savepoint: &Transaction<'_>, action: Arc<dyn AtomicAction>, arguments: Value) -> Result<Value, String> {
    let (requests, mut inbox) = tokio::sync::mpsc::unbounded_channel();
    let mut handler = tokio::task::spawn_blocking(move || action.run(&mut PgAtomic { requests }, &arguments));
    loop {
        tokio::select! {
            Some(request) = inbox.recv() => serve_atomic(savepoint, request).await,
            finished = &mut handler => {
                return finished.unwrap_or_else(|panic| Err(format!("the atomic handler panicked: {panic}")));
            }
        }
    }
}

async fn serve_atomic(savepoint: &Transaction<'_>, request: AtomicRequest) {
    match request {
        AtomicRequest::Execute(sql, params, reply) => {
            let owned = pg_params(&params);
            let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = owned.iter().map(|p| p.as_ref() as _).collect();
            let _ = reply.send(savepoint.execute(sql.as_str(), &refs).await.map_err(|e| e.to_string()));
        }
        AtomicRequest::Query(sql, params, reply) => {
            let owned = pg_params(&params);
            let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = owned.iter().map(|p| p.as_ref() as _).collect();
            let rows = savepoint.query(sql.as_str(), &refs).await.map_err(|e| e.to_string());
            let _ = reply.send(rows.map(|rows| rows.iter().map(atomic_row).collect()));
        }
    }
}

/// A result row as JSON values, for an atomic handler.
fn atomic_row(row: &tokio_postgres::Row) -> Vec<Value> {
    (0..row.len())
        .map(|i| {
            if let Ok(v) = row.try_get::<_, Option<i64>>(i) {
                v.map(Value::from).unwrap_or(Value::Null)
            } else if let Ok(v) = row.try_get::<_, Option<i32>>(i) {
                v.map(Value::from).unwrap_or(Value::Null)
            } else if let Ok(v) = row.try_get::<_, Option<f64>>(i) {
                v.map(Value::from).unwrap_or(Value::Null)
            } else if let Ok(v) = row.try_get::<_, Option<bool>>(i) {
                v.map(Value::from).unwrap_or(Value::Null)
            } else {
                row.try_get::<_, Option<String>>(i)
                    .ok()
                    .flatten()
                    .map(Value::from)
                    .unwrap_or(Value::Null)
            }
        })
        .collect()
}

fn pg_params(params: &[Value]) -> Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> {
    params
        .iter()
        .map(|value| -> Box<dyn tokio_postgres::types::ToSql + Sync + Send> {
            match value {
                Value::Bool(b) => Box::new(*b),
                Value::Number(n) if n.is_i64() => Box::new(n.as_i64().unwrap_or_default()),
                Value::Number(n) => Box::new(n.as_f64().unwrap_or_default()),
                other => Box::new(json_text(other)),
            }
        })
        .collect()
}

impl AtomicTransaction for PgAtomic {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, String> {
        self.ask(|reply| AtomicRequest::Execute(sql.to_string(), params.to_vec(), reply))
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, String> {
        self.ask(|reply| AtomicRequest::Query(sql.to_string(), params.to_vec(), reply))
    }
}
