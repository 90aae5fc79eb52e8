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

mod tx;

use crate::logic::persist::persist;
use crate::logic::{claim, integrity, runs};
use crate::rows::*;
use crate::schedules;
use crate::*;
use tx::PgTx;
use capstan_engine::schedule::Schedule;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Transaction};
use futures_util::StreamExt;
use std::sync::Arc;
use tokio_postgres::types::ToSql;
use tokio_postgres::{AsyncMessage, NoTls};

const POOL_SIZE: usize = 16;
const MIGRATION_LOCK: i64 = 0x00ca_9574_0001;
/// NOTIFY channel of the default schema; stores in another schema append its name.
const WAKE_CHANNEL: &str = "capstan_wake";

const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        r#"
CREATE TABLE namespaces (
    name        TEXT PRIMARY KEY,
    description TEXT,
    created_at  BIGINT NOT NULL
);
CREATE TABLE workflow_instances (
    workflow_id    TEXT PRIMARY KEY,
    namespace      TEXT NOT NULL,
    current_run_id TEXT NOT NULL,
    created_at     BIGINT NOT NULL
);
CREATE TABLE runs (
    run_id        TEXT PRIMARY KEY,
    namespace     TEXT NOT NULL,
    workflow_id   TEXT NOT NULL,
    run_number    BIGINT NOT NULL,
    workflow_type TEXT NOT NULL,
    task_queue    TEXT NOT NULL,
    status        TEXT NOT NULL,
    business_key  TEXT,
    started_at    BIGINT NOT NULL,
    closed_at     BIGINT,
    state         TEXT NOT NULL
);
CREATE INDEX runs_by_namespace ON runs (namespace, started_at DESC, run_id DESC);
CREATE INDEX runs_by_instance ON runs (workflow_id, run_number);
CREATE TABLE history_events (
    run_id              TEXT NOT NULL,
    sequence            BIGINT NOT NULL,
    event_id            TEXT NOT NULL,
    event_type          TEXT NOT NULL,
    payload             TEXT NOT NULL,
    workflow_task_id    TEXT,
    workflow_command_id TEXT,
    recorded_at         BIGINT NOT NULL,
    prev_hash           TEXT NOT NULL,
    hash                TEXT NOT NULL,
    PRIMARY KEY (run_id, sequence)
);
CREATE TABLE tasks (
    task_id          TEXT PRIMARY KEY,
    namespace        TEXT NOT NULL,
    run_id           TEXT NOT NULL,
    kind             TEXT NOT NULL,
    queue            TEXT NOT NULL,
    type_name        TEXT NOT NULL,
    status           TEXT NOT NULL,
    available_at     BIGINT NOT NULL,
    deadline_at      BIGINT,
    lease_owner      TEXT,
    lease_expires_at BIGINT,
    fence            BIGINT NOT NULL,
    created_at       BIGINT NOT NULL,
    duty_owner       TEXT,
    duty_fence       BIGINT NOT NULL DEFAULT 0,
    duty_expires_at  BIGINT
);
CREATE INDEX tasks_ready ON tasks (namespace, kind, queue, available_at) WHERE status = 'ready';
CREATE INDEX tasks_deadline ON tasks (deadline_at) WHERE deadline_at IS NOT NULL AND status IN ('ready', 'leased');
CREATE TABLE workers (
    namespace         TEXT NOT NULL,
    worker_id         TEXT NOT NULL,
    task_queue        TEXT NOT NULL,
    runtime           TEXT NOT NULL,
    sdk_version       TEXT,
    build_id          TEXT,
    workflow_types    TEXT NOT NULL,
    activity_types    TEXT NOT NULL,
    fingerprints      TEXT NOT NULL,
    document          TEXT NOT NULL,
    status            TEXT NOT NULL,
    registered_at     BIGINT NOT NULL,
    last_heartbeat_at BIGINT NOT NULL,
    PRIMARY KEY (namespace, worker_id)
);
CREATE TABLE poll_requests (
    namespace       TEXT NOT NULL,
    task_queue      TEXT NOT NULL,
    worker_id       TEXT NOT NULL,
    kind            TEXT NOT NULL,
    poll_request_id TEXT NOT NULL,
    task_id         TEXT NOT NULL,
    fence           BIGINT NOT NULL,
    created_at      BIGINT NOT NULL,
    PRIMARY KEY (namespace, task_queue, worker_id, kind, poll_request_id)
);
CREATE INDEX poll_requests_age ON poll_requests (created_at);
CREATE TABLE command_requests (
    namespace    TEXT NOT NULL,
    workflow_id  TEXT NOT NULL,
    command_type TEXT NOT NULL,
    request_id   TEXT NOT NULL,
    intent_hash  TEXT NOT NULL,
    receipt      TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (namespace, workflow_id, command_type, request_id)
);
"#,
    ),
    (
        2,
        r#"
CREATE TABLE query_tasks (
    query_task_id    TEXT PRIMARY KEY,
    namespace        TEXT NOT NULL,
    task_queue       TEXT NOT NULL,
    status           TEXT NOT NULL,
    lease_expires_at BIGINT,
    created_at       BIGINT NOT NULL,
    deadline_at      BIGINT NOT NULL,
    doc              TEXT NOT NULL
);
CREATE INDEX query_tasks_open ON query_tasks (namespace, task_queue, created_at) WHERE status <> 'answered';
"#,
    ),
    (
        3,
        r#"
CREATE TABLE search_attribute_index (
    run_id TEXT NOT NULL,
    key    TEXT NOT NULL,
    value  TEXT NOT NULL
);
CREATE INDEX search_attribute_lookup ON search_attribute_index (key, value, run_id);
CREATE INDEX search_attribute_by_run ON search_attribute_index (run_id);
"#,
    ),
    (
        4,
        r#"
-- Query tasks also carry update validations; pollers ask for one kind.
ALTER TABLE query_tasks ADD COLUMN kind TEXT NOT NULL DEFAULT 'query';
CREATE INDEX query_tasks_open_by_kind ON query_tasks (namespace, task_queue, kind, created_at) WHERE status <> 'answered';
"#,
    ),
    (
        5,
        r#"
-- The recovery ledger: declared actions, one entry per dispatch, and the checkpoint chain.
CREATE TABLE action_definitions (
    namespace       TEXT NOT NULL,
    activity_type   TEXT NOT NULL,
    version         BIGINT NOT NULL,
    definition_hash TEXT NOT NULL,
    updated_at      BIGINT NOT NULL,
    doc             TEXT NOT NULL,
    PRIMARY KEY (namespace, activity_type)
);
CREATE TABLE ledger_entries (
    ledger_key    TEXT PRIMARY KEY,
    namespace     TEXT NOT NULL,
    workflow_id   TEXT NOT NULL,
    run_id        TEXT NOT NULL,
    activity_type TEXT NOT NULL,
    state         TEXT NOT NULL,
    dispatched_at BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    doc           TEXT NOT NULL
);
CREATE INDEX ledger_by_state ON ledger_entries (namespace, state, dispatched_at);
CREATE INDEX ledger_by_workflow ON ledger_entries (namespace, workflow_id, dispatched_at);
CREATE TABLE ledger_checkpoints (
    namespace   TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    hash        TEXT NOT NULL,
    prev_hash   TEXT NOT NULL,
    ledger_key  TEXT NOT NULL,
    recorded_at BIGINT NOT NULL,
    doc         TEXT NOT NULL,
    PRIMARY KEY (namespace, workflow_id, hash)
);
"#,
    ),
    (
        6,
        r#"
-- Integrity incidents: a ledger chain that failed verification on a commit, and what was done.
CREATE TABLE integrity_incidents (
    incident_id TEXT PRIMARY KEY,
    namespace   TEXT NOT NULL,
    workflow_id TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    state       TEXT NOT NULL,
    opened_at   BIGINT NOT NULL,
    doc         TEXT NOT NULL
);
CREATE INDEX integrity_incidents_by_state ON integrity_incidents (namespace, state, opened_at);
"#,
    ),
    (
        7,
        r#"
-- Namespaces carry a document (retention, status, timestamps) beside their name.
ALTER TABLE namespaces ADD COLUMN doc TEXT;
"#,
    ),
    (
        8,
        r#"
-- Schedules: the engine's Schedule document plus copies for the scheduler and listing. A
-- deleted schedule keeps its row (status 'deleted') so its history stays readable.
CREATE TABLE schedules (
    namespace     TEXT NOT NULL,
    schedule_id   TEXT NOT NULL,
    status        TEXT NOT NULL,
    workflow_type TEXT NOT NULL,
    wake_at       BIGINT,
    has_buffer    BIGINT NOT NULL DEFAULT 0,
    created_at    BIGINT NOT NULL,
    doc           TEXT NOT NULL,
    PRIMARY KEY (namespace, schedule_id)
);
CREATE INDEX schedules_due ON schedules (wake_at) WHERE wake_at IS NOT NULL;
CREATE INDEX schedules_buffered ON schedules (has_buffer) WHERE has_buffer = 1;
-- Append-only audit history per schedule id (it outlives the schedule).
CREATE TABLE schedule_events (
    namespace    TEXT NOT NULL,
    schedule_id  TEXT NOT NULL,
    sequence     BIGINT NOT NULL,
    event_id     TEXT NOT NULL,
    event_type   TEXT NOT NULL,
    recorded_at  BIGINT NOT NULL,
    workflow_id  TEXT,
    run_id       TEXT,
    payload      TEXT NOT NULL,
    PRIMARY KEY (namespace, schedule_id, sequence)
);
"#,
    ),
    (
        9,
        r#"
-- The retention duty finds closed runs by age.
CREATE INDEX runs_closed ON runs (namespace, closed_at) WHERE closed_at IS NOT NULL;
"#,
    ),
    (
        10,
        r#"
-- Typed custom search attributes per namespace, and the numeric form of each indexed value
-- (ints, doubles, datetimes as epoch ms, bools as 0/1) for range filters.
CREATE TABLE search_attribute_definitions (
    namespace  TEXT NOT NULL,
    name       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (namespace, name)
);
ALTER TABLE search_attribute_index ADD COLUMN num DOUBLE PRECISION;
CREATE INDEX search_attribute_numeric ON search_attribute_index (key, num, run_id);
"#,
    ),
    (
        11,
        r#"
-- Build-id rollout intents per task queue ('' is the unversioned cohort).
CREATE TABLE build_id_rollouts (
    namespace    TEXT NOT NULL,
    task_queue   TEXT NOT NULL,
    build_id     TEXT NOT NULL,
    drain_intent TEXT NOT NULL,
    drained_at   BIGINT,
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (namespace, task_queue, build_id)
);
"#,
    ),
    (
        12,
        r#"
-- Accepted bridge-adapter deliveries by (adapter, idempotency key): a repeat is answered from
-- here and has no second effect.
CREATE TABLE bridge_deliveries (
    namespace       TEXT NOT NULL,
    adapter         TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    outcome         TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    PRIMARY KEY (namespace, adapter, idempotency_key)
);
"#,
    ),
    (
        13,
        r#"
-- The worker build a pinned run's workflow tasks are reserved for (NULL: any worker).
ALTER TABLE tasks ADD COLUMN compatibility TEXT;
"#,
    ),
    (
        14,
        r#"
-- The cohort promoted for new starts on a queue (at most one row has it).
ALTER TABLE build_id_rollouts ADD COLUMN promoted_at BIGINT;
"#,
    ),
    (
        15,
        r#"
-- Kept in step with SQLite's migration 15 (its readiness probe row); PostgreSQL reports write
-- failures per request and its readiness is the connection check.
CREATE TABLE health_probe (id INTEGER PRIMARY KEY, probed_at BIGINT NOT NULL);
"#,
    ),
];

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        StoreError::Storage(format!("no database connection: {error}"))
    }
}

#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    config: tokio_postgres::Config,
    limits: Arc<Limits>,
    /// The NOTIFY channel of this store's schema (channels are database-wide).
    wake_channel: Arc<str>,
}

impl PostgresStore {
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
                "SELECT t.task_id, r.state FROM tasks t JOIN runs r ON r.run_id = t.run_id
                 WHERE t.namespace = $1 AND t.kind = 'activity' AND t.queue = $2 AND t.status = 'ready' AND t.available_at <= $3
                   AND t.type_name = ANY($4)
                 ORDER BY t.available_at, t.task_id LIMIT 1 FOR UPDATE OF r SKIP LOCKED",
                &[&namespace, &ATOMIC_QUEUE, &now, &types],
            )
            .await?;
        let Some(row) = row else { return Ok(None) };
        let task_id = TaskId(row.get(0));
        let mut run: RunState = serde_json::from_str(row.get::<_, &str>(1)).map_err(corrupt)?;
        let mut ids = UlidIds;
        let mut cx = Cx::new(now, &mut ids, &self.limits);
        cx.memo = Some(codec);
        let activity_type = match run.tasks.get(&task_id).map(|t| &t.detail) {
            Some(TaskDetail::Activity { activity_type, .. }) => activity_type.clone(),
            _ => return Ok(None),
        };
        let definition = tx
            .query_opt(
                "SELECT doc FROM action_definitions WHERE namespace = $1 AND activity_type = $2",
                &[&run.namespace, &activity_type],
            )
            .await?
            .map(|r| serde_json::from_str::<ActionDefinition>(r.get::<_, &str>(0)).map_err(corrupt))
            .transpose()?;
        let Some(task) = lease_activity_task_with(&mut run, &mut cx, &task_id, ATOMIC_OWNER, 60_000, definition.as_ref())? else {
            let effects = std::mem::take(&mut cx.effects);
            persist(&mut PgTx::new(&tx, &self.wake_channel), &run, &effects, false, &self.limits).await?;
            tx.commit().await?;
            return Ok(Some(AtomicOutcome::Refused {
                workflow_id: run.workflow_id.clone(),
            }));
        };
        let arguments = run
            .activities
            .values()
            .find(|a| a.task_id == task_id)
            .map(|a| codec.to_json(&a.arguments))
            .unwrap_or_else(|| Err("no activity execution".into()));
        let handled = match (actions.0.get(&activity_type), arguments) {
            (None, _) => Err(format!("no atomic action is registered for {activity_type:?}")),
            (Some(_), Err(error)) => Err(format!("the arguments could not be decoded: {error}")),
            (Some(action), Ok(arguments)) => {
                let savepoint = tx.savepoint("capstan_atomic").await?;
                let handle = tokio::runtime::Handle::current();
                let ran = tokio::task::block_in_place(|| action.run(&mut PgAtomic { tx: &savepoint, handle }, &arguments));
                match ran {
                    Ok(value) => {
                        savepoint.commit().await?;
                        codec.json_to_payload(&value)
                    }
                    Err(message) => {
                        savepoint.rollback().await?;
                        Err(message)
                    }
                }
            }
        };
        let outcome = finish_atomic(&mut run, &mut cx, &task, handled)?;
        let effects = std::mem::take(&mut cx.effects);
        persist(&mut PgTx::new(&tx, &self.wake_channel), &run, &effects, false, &self.limits).await?;
        tx.commit().await?;
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
        for _ in 0..4 {
            let tx = client.transaction().await?;
            // One round trip picks the oldest ready task whose run nobody else holds, and locks
            // that run; runs another poller or node is working on are skipped, not waited for.
            let row = tx
                .query_opt(
                    "SELECT t.task_id, r.state FROM tasks t JOIN runs r ON r.run_id = t.run_id
                     WHERE t.namespace = $1 AND t.kind = $2 AND t.queue = $3 AND t.status = 'ready' AND t.available_at <= $4
                       AND ($5::text[] IS NULL OR t.type_name = ANY($5))
                       AND (t.compatibility IS NULL
                            OR t.compatibility = (SELECT w.build_id FROM workers w WHERE w.namespace = $1 AND w.worker_id = $6))
                     ORDER BY t.available_at, t.task_id LIMIT 1 FOR UPDATE OF r SKIP LOCKED",
                    &[&namespace, &kind.as_str(), &queue, &now, &type_filter(types), &owner],
                )
                .await?;
            let Some(row) = row else { return Ok(None) };
            let task_id = TaskId(row.get(0));
            let run: RunState = serde_json::from_str(row.get::<_, &str>(1)).map_err(corrupt)?;
            let poller = claim::Poller {
                kind,
                owner,
                lease_ms,
                poll: poll.as_ref(),
            };
            let claimed = claim::lease_candidate(&mut PgTx::new(&tx, &self.wake_channel), run, task_id, &poller, now, &self.limits).await?;
            tx.commit().await?;
            if let claim::Claimed::Leased(task, run) = claimed {
                return Ok(Some((task, run)));
            }
        }
        Ok(None)
    }

    async fn mutate_run_checked<T, F>(&self, namespace: &str, locator: RunLocator, now: Millis, transition: F) -> StoreResult<(T, RunState)>
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let changed = runs::mutate(&mut PgTx::new(&tx, &self.wake_channel), namespace, &locator, now, &self.limits, transition).await?;
        tx.commit().await?;
        Ok(changed)
    }

    #[allow(clippy::too_many_arguments)]
    async fn mutate_run_keyed_checked<T, F, R>(
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
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let mut pg = PgTx::new(&tx, &self.wake_channel);
        let receipt = runs::mutate_keyed(&mut pg, namespace, &locator, &key, now, &self.limits, transition, render).await?;
        tx.commit().await?;
        Ok(receipt)
    }

    async fn run_duty_checked<T, F>(&self, due: &DueTask, now: Millis, transition: F) -> StoreResult<(T, RunState)>
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let changed = runs::run_duty(&mut PgTx::new(&tx, &self.wake_channel), due, now, &self.limits, transition).await?;
        tx.commit().await?;
        Ok(changed)
    }

    async fn guard<T>(&self, result: StoreResult<T>) -> StoreResult<T> {
        match result {
            Err(StoreError::Integrity(breach)) => Err(self.record_breach(breach).await?.into()),
            other => other,
        }
    }

    /// A change that found a broken ledger chain was not written: open an incident and block
    /// the run, in a transaction of its own.
    async fn record_breach(&self, breach: IntegrityBreach) -> StoreResult<Refusal> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let refusal = integrity::record_breach(&mut PgTx::new(&tx, &self.wake_channel), &breach, now_ms(), &self.limits).await?;
        tx.commit().await?;
        Ok(refusal)
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
        config.options(format!("-c search_path={schema}"));
        Self::with_config(config, limits, now, format!("{WAKE_CHANNEL}_{schema}")).await
    }

    async fn with_config(config: tokio_postgres::Config, limits: Limits, now: Millis, wake_channel: String) -> StoreResult<Self> {
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
            limits: Arc::new(limits),
            wake_channel: wake_channel.into(),
        };
        store.migrate(now).await?;
        Ok(store)
    }

    async fn migrate(&self, now: Millis) -> StoreResult<()> {
        let mut client = self.pool.get().await?;
        client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]).await?;
        let result = async {
            client.batch_execute("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)").await?;
            for (version, sql) in MIGRATIONS {
                let applied = client.query_opt("SELECT 1 FROM schema_migrations WHERE version = $1", &[version]).await?.is_some();
                if applied {
                    continue;
                }
                let tx = client.transaction().await?;
                tx.batch_execute(sql).await?;
                tx.execute("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)", &[version, &now]).await?;
                tx.commit().await?;
            }
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
        result
    }
}

// ------------------------------------------------------------------------------------------

fn corrupt(error: serde_json::Error) -> StoreError {
    StoreError::Storage(format!("corrupt stored document: {error}"))
}

async fn write_query_task<C: tokio_postgres::GenericClient>(client: &C, task: &QueryTask) -> StoreResult<()> {
    let (status, lease_expires_at) = query_columns(task);
    let doc = serde_json::to_string(task).map_err(corrupt)?;
    client
        .execute(
            "INSERT INTO query_tasks (query_task_id, namespace, task_queue, status, lease_expires_at, created_at, deadline_at, doc, kind)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (query_task_id) DO UPDATE SET status = excluded.status, lease_expires_at = excluded.lease_expires_at, doc = excluded.doc",
            &[&task.id, &task.namespace, &task.task_queue, &status, &lease_expires_at, &task.created_at, &task.deadline_at, &doc, &task.kind.as_str()],
        )
        .await?;
    Ok(())
}

fn parse_kind(kind: &str) -> Option<TaskKind> {
    match kind {
        "workflow" => Some(TaskKind::Workflow),
        "activity" => Some(TaskKind::Activity),
        "query" => Some(TaskKind::Query),
        _ => None,
    }
}

fn worker_from_row(row: &tokio_postgres::Row) -> WorkerRecord {
    let list = |i: usize| serde_json::from_str::<Vec<String>>(row.get::<_, &str>(i)).unwrap_or_default();
    let map = |i: usize| serde_json::from_str::<Map<String, Value>>(row.get::<_, &str>(i)).unwrap_or_default();
    WorkerRecord {
        namespace: row.get(0),
        worker_id: row.get(1),
        task_queue: row.get(2),
        runtime: row.get(3),
        sdk_version: row.get(4),
        build_id: row.get(5),
        supported_workflow_types: list(6),
        supported_activity_types: list(7),
        workflow_definition_fingerprints: map(8),
        document: map(9),
        status: row.get(10),
        registered_at: row.get(11),
        last_heartbeat_at: row.get(12),
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
    let run: RunState = serde_json::from_str(state).map_err(corrupt)?;
    Ok(summary_of(&run))
}

fn type_filter(types: &[String]) -> Option<Vec<String>> {
    (!types.is_empty()).then(|| types.to_vec())
}

impl Store for PostgresStore {
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

    async fn create_schedule(&self, mut schedule: Schedule) -> StoreResult<()> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // The row lock (or, for a new id, the primary key) serialises concurrent creates.
        let existing = tx
            .query_opt(
                "SELECT status FROM schedules WHERE namespace = $1 AND schedule_id = $2 FOR UPDATE",
                &[&schedule.namespace, &schedule.schedule_id],
            )
            .await?;
        if existing.is_some_and(|row| row.get::<_, &str>(0) != "deleted") {
            return Err(Refusal::new(
                Reason::ScheduleAlreadyExists,
                format!(
                    "Schedule [{}] already exists in namespace [{}].",
                    schedule.schedule_id, schedule.namespace
                ),
            )
            .with("schedule_id", schedule.schedule_id.clone())
            .into());
        }
        match pg_write_schedule(&tx, &mut schedule).await {
            Err(StoreError::Conflict { constraint, .. }) if constraint == "schedules_pkey" => {
                return Err(Refusal::new(
                    Reason::ScheduleAlreadyExists,
                    format!("Schedule [{}] already exists.", schedule.schedule_id),
                )
                .with("schedule_id", schedule.schedule_id.clone())
                .into())
            }
            other => other?,
        }
        tx.commit().await?;
        Ok(())
    }

    async fn schedule(&self, namespace: &str, schedule_id: &str) -> StoreResult<Option<Schedule>> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT doc FROM schedules WHERE namespace = $1 AND schedule_id = $2 AND status != 'deleted'",
                &[&namespace, &schedule_id],
            )
            .await?;
        row.map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(corrupt)).transpose()
    }

    async fn list_schedules(&self, namespace: &str, filter: ScheduleFilter) -> StoreResult<Vec<Schedule>> {
        let client = self.pool.get().await?;
        let (after_at, after_id) = filter.after.clone().unzip();
        let rows = client
            .query(
                "SELECT doc FROM schedules WHERE namespace = $1 AND status != 'deleted'
                   AND ($2::text IS NULL OR status = $2) AND ($3::text IS NULL OR workflow_type = $3)
                   AND ($4::bigint IS NULL OR created_at < $4 OR (created_at = $4 AND schedule_id > $5))
                 ORDER BY created_at DESC, schedule_id ASC LIMIT $6",
                &[
                    &namespace,
                    &filter.status,
                    &filter.workflow_type,
                    &after_at,
                    &after_id,
                    &(filter.limit as i64),
                ],
            )
            .await?;
        rows.iter()
            .map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(corrupt))
            .collect()
    }

    async fn change_schedule<T: Send + 'static>(
        &self,
        namespace: &str,
        schedule_id: &str,
        change: impl FnOnce(&mut Schedule) -> Result<T, Refusal> + Send + 'static,
    ) -> StoreResult<T> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let mut schedule = pg_lock_schedule(&tx, namespace, schedule_id, false)
            .await?
            .ok_or_else(|| schedule_missing(schedule_id, namespace))?;
        let value = change(&mut schedule)?;
        pg_write_schedule(&tx, &mut schedule).await?;
        tx.commit().await?;
        Ok(value)
    }

    async fn fire_schedule(
        &self,
        namespace: &str,
        schedule_id: &str,
        fire: ScheduleFire,
        empty_input: Payload,
        now: Millis,
    ) -> StoreResult<FireReport> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // The scheduler skips a schedule another node is firing; operators wait for it.
        let evaluation = matches!(fire, ScheduleFire::Due { .. });
        let Some(mut schedule) = pg_lock_schedule(&tx, namespace, schedule_id, evaluation).await? else {
            if evaluation {
                return Ok(FireReport::default());
            }
            return Err(schedule_missing(schedule_id, namespace));
        };
        let before = serde_json::to_string(&schedule).map_err(corrupt)?;
        let mut pg = PgTx::new(&tx, &self.wake_channel);
        let report = schedules::fire(&mut pg, &mut schedule, &fire, &empty_input, now, &self.limits).await?;
        if serde_json::to_string(&schedule).map_err(corrupt)? != before || !schedule.pending_events.is_empty() {
            pg_write_schedule(&tx, &mut schedule).await?;
        }
        tx.commit().await?;
        Ok(report)
    }

    async fn due_schedules(&self, now: Millis, limit: usize) -> StoreResult<Vec<(String, String)>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT namespace, schedule_id FROM schedules WHERE (wake_at IS NOT NULL AND wake_at <= $1) OR has_buffer = 1
                 ORDER BY wake_at LIMIT $2",
                &[&now, &(limit as i64)],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    async fn next_schedule_wake(&self) -> StoreResult<Option<Millis>> {
        let client = self.pool.get().await?;
        Ok(client.query_one("SELECT MIN(wake_at) FROM schedules", &[]).await?.get(0))
    }

    async fn schedule_history(
        &self,
        namespace: &str,
        schedule_id: &str,
        after_sequence: i64,
        limit: usize,
    ) -> StoreResult<Option<Vec<ScheduleEventRecord>>> {
        let client = self.pool.get().await?;
        if client
            .query_opt(
                "SELECT 1 FROM schedules WHERE namespace = $1 AND schedule_id = $2",
                &[&namespace, &schedule_id],
            )
            .await?
            .is_none()
        {
            return Ok(None);
        }
        let rows = client
            .query(
                "SELECT sequence, event_id, event_type, recorded_at, workflow_id, run_id, payload FROM schedule_events
                 WHERE namespace = $1 AND schedule_id = $2 AND sequence > $3 ORDER BY sequence LIMIT $4",
                &[&namespace, &schedule_id, &after_sequence, &(limit as i64)],
            )
            .await?;
        rows.iter()
            .map(|r| {
                Ok(ScheduleEventRecord {
                    sequence: r.get(0),
                    event_id: r.get(1),
                    event_type: r.get(2),
                    recorded_at: r.get(3),
                    workflow_id: r.get(4),
                    run_id: r.get(5),
                    payload: serde_json::from_str(r.get::<_, &str>(6)).map_err(corrupt)?,
                })
            })
            .collect::<StoreResult<Vec<_>>>()
            .map(Some)
    }

    async fn namespaces(&self) -> StoreResult<Vec<NamespaceRecord>> {
        let client = self.pool.get().await?;
        let rows = client
            .query("SELECT name, description, created_at, doc FROM namespaces ORDER BY name", &[])
            .await?;
        Ok(rows
            .iter()
            .map(|r| namespace_from_row(r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect())
    }

    async fn create_namespace(&self, record: NamespaceRecord) -> StoreResult<NamespaceRecord> {
        let client = self.pool.get().await?;
        let inserted = client
            .execute(
                "INSERT INTO namespaces (name, description, created_at, doc) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                &[
                    &record.name,
                    &record.description,
                    &record.created_at,
                    &serde_json::to_string(&record).map_err(corrupt)?,
                ],
            )
            .await?;
        if inserted == 0 {
            return Err(Refusal::new(
                Reason::NamespaceAlreadyExists,
                format!("Namespace {:?} already exists.", record.name),
            )
            .with("namespace", record.name.clone())
            .into());
        }
        Ok(record)
    }

    async fn update_namespace(
        &self,
        name: &str,
        description: Option<String>,
        retention_days: Option<i64>,
        now: Millis,
    ) -> StoreResult<NamespaceRecord> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_opt(
                "SELECT name, description, created_at, doc FROM namespaces WHERE name = $1 FOR UPDATE",
                &[&name],
            )
            .await?;
        let mut record = row
            .map(|r| namespace_from_row(r.get(0), r.get(1), r.get(2), r.get(3)))
            .ok_or_else(|| namespace_missing(name))?;
        if description.is_some() {
            record.description = description;
        }
        if retention_days.is_some() {
            record.retention_days = retention_days;
        }
        record.updated_at = now;
        tx.execute(
            "UPDATE namespaces SET description = $2, doc = $3 WHERE name = $1",
            &[&name, &record.description, &serde_json::to_string(&record).map_err(corrupt)?],
        )
        .await?;
        tx.commit().await?;
        Ok(record)
    }

    async fn delete_namespace(&self, name: &str) -> StoreResult<NamespaceRecord> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_opt(
                "SELECT name, description, created_at, doc FROM namespaces WHERE name = $1 FOR UPDATE",
                &[&name],
            )
            .await?;
        let record = row
            .map(|r| namespace_from_row(r.get(0), r.get(1), r.get(2), r.get(3)))
            .ok_or_else(|| namespace_missing(name))?;
        let workflows: i64 = tx
            .query_one("SELECT COUNT(*) FROM workflow_instances WHERE namespace = $1", &[&name])
            .await?
            .get(0);
        if name == "default" || workflows > 0 {
            return Err(Refusal::new(
                Reason::NamespaceNotEmpty,
                "Only an empty namespace other than default can be deleted.",
            )
            .with("namespace", name)
            .with("workflows", workflows)
            .into());
        }
        for sql in [
            "DELETE FROM namespaces WHERE name = $1",
            "DELETE FROM workers WHERE namespace = $1",
            "DELETE FROM action_definitions WHERE namespace = $1",
        ] {
            tx.execute(sql, &[&name]).await?;
        }
        tx.commit().await?;
        Ok(record)
    }

    async fn ledger_stats(&self) -> StoreResult<LedgerStats> {
        let client = self.pool.get().await?;
        let entries = client
            .query(
                "SELECT namespace, state, COUNT(*), MIN(dispatched_at) FROM ledger_entries GROUP BY namespace, state",
                &[],
            )
            .await?
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1), r.get::<_, i64>(2), r.get::<_, i64>(3)))
            .collect();
        let open_incidents = client
            .query(
                "SELECT namespace, COUNT(*) FROM integrity_incidents WHERE state = 'open' GROUP BY namespace",
                &[],
            )
            .await?
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
            .collect();
        Ok(LedgerStats { entries, open_incidents })
    }

    async fn integrity_incidents(&self, namespace: &str, state: Option<String>) -> StoreResult<Vec<IntegrityIncident>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT doc FROM integrity_incidents WHERE namespace = $1 AND ($2::text IS NULL OR state = $2) ORDER BY opened_at, incident_id",
                &[&namespace, &state],
            )
            .await?;
        rows.iter()
            .map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(corrupt))
            .collect()
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
        let incident = integrity::close_incident(&mut pg, namespace, incident_id, note, now, &self.limits).await?;
        tx.commit().await?;
        Ok(incident)
    }

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
            Err(StoreError::Integrity(breach)) => {
                self.record_breach(breach).await?;
                Ok(None)
            }
            other => other,
        }
    }

    async fn mutate_run<T, F>(&self, namespace: &str, locator: RunLocator, now: Millis, transition: F) -> StoreResult<(T, RunState)>
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    {
        let result = self.mutate_run_checked(namespace, locator, now, transition).await;
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
        let result = self
            .mutate_run_keyed_checked(namespace, locator, key, now, transition, render)
            .await;
        self.guard(result).await
    }

    async fn run_duty<T, F>(&self, due: &DueTask, now: Millis, transition: F) -> StoreResult<(T, RunState)>
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    {
        let result = self.run_duty_checked(due, now, transition).await;
        self.guard(result).await
    }
    async fn runs_page(&self, after: Option<RunId>, limit: usize) -> StoreResult<Vec<(String, WorkflowId, RunId)>> {
        let client = self.pool.get().await?;
        let after = after.map(|r| r.as_str().to_string()).unwrap_or_default();
        let rows = client
            .query(
                "SELECT namespace, workflow_id, run_id FROM runs WHERE run_id > $1 ORDER BY run_id LIMIT $2",
                &[&after, &(limit as i64)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| (r.get::<_, String>(0), WorkflowId(r.get(1)), RunId(r.get(2))))
            .collect())
    }

    async fn ledger_instances(&self) -> StoreResult<Vec<(String, WorkflowId)>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT DISTINCT namespace, workflow_id FROM ledger_checkpoints ORDER BY namespace, workflow_id",
                &[],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get::<_, String>(0), WorkflowId(r.get(1)))).collect())
    }
    async fn put_action_definition(
        &self,
        namespace: &str,
        activity_type: &str,
        recovery_mode: RecoveryMode,
        document: Map<String, Value>,
        now: Millis,
    ) -> StoreResult<ActionDefinition> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let hash = ActionDefinition::hash_of(activity_type, &document);
        let existing = tx
            .query_opt(
                "SELECT doc FROM action_definitions WHERE namespace = $1 AND activity_type = $2 FOR UPDATE",
                &[&namespace, &activity_type],
            )
            .await?
            .map(|r| serde_json::from_str::<ActionDefinition>(r.get::<_, &str>(0)).map_err(corrupt))
            .transpose()?;
        if let Some(existing) = existing.as_ref().filter(|d| d.definition_hash == hash) {
            return Ok(existing.clone());
        }
        let definition = ActionDefinition {
            version: existing.map(|d| d.version + 1).unwrap_or(1),
            namespace: namespace.to_string(),
            activity_type: activity_type.to_string(),
            recovery_mode,
            document,
            definition_hash: hash,
            updated_at: now,
        };
        tx.execute(
            "INSERT INTO action_definitions (namespace, activity_type, version, definition_hash, updated_at, doc) VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (namespace, activity_type) DO UPDATE SET version = excluded.version, definition_hash = excluded.definition_hash,
                 updated_at = excluded.updated_at, doc = excluded.doc",
            &[
                &namespace,
                &activity_type,
                &(definition.version as i64),
                &definition.definition_hash,
                &now,
                &serde_json::to_string(&definition).map_err(corrupt)?,
            ],
        )
        .await?;
        tx.commit().await?;
        Ok(definition)
    }

    async fn action_definitions(&self, namespace: &str) -> StoreResult<Vec<ActionDefinition>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT doc FROM action_definitions WHERE namespace = $1 ORDER BY activity_type",
                &[&namespace],
            )
            .await?;
        rows.iter()
            .map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(corrupt))
            .collect()
    }

    async fn ledger_entries(&self, namespace: &str, filter: LedgerFilter, limit: usize) -> StoreResult<Vec<LedgerEntry>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT doc FROM ledger_entries WHERE namespace = $1 AND ($2::text IS NULL OR state = $2)
                   AND ($3::text IS NULL OR workflow_id = $3) AND ($4::text IS NULL OR activity_type = $4)
                 ORDER BY dispatched_at, ledger_key LIMIT $5",
                &[
                    &namespace,
                    &filter.state.map(|s| s.as_str()),
                    &filter.workflow_id,
                    &filter.activity_type,
                    &(limit as i64),
                ],
            )
            .await?;
        rows.iter()
            .map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(corrupt))
            .collect()
    }

    async fn ledger_entry(&self, namespace: &str, ledger_key: &str) -> StoreResult<Option<LedgerEntry>> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT doc FROM ledger_entries WHERE namespace = $1 AND ledger_key = $2",
                &[&namespace, &ledger_key],
            )
            .await?;
        row.map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(corrupt)).transpose()
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
            .map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(corrupt))
            .collect::<StoreResult<Vec<_>>>()?;
        Ok(crate::chain_order(checkpoints))
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
        Ok(client
            .query_opt("SELECT 1 FROM namespaces WHERE name = $1", &[&namespace])
            .await?
            .is_some())
    }

    async fn register_worker(&self, worker: WorkerRecord) -> StoreResult<WorkerRecord> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let existing = tx
            .query_opt(
                &format!("SELECT {WORKER_COLUMNS} FROM workers WHERE namespace = $1 AND worker_id = $2 FOR UPDATE"),
                &[&worker.namespace, &worker.worker_id],
            )
            .await?
            .map(|row| worker_from_row(&row));
        let mut record = worker.clone();
        if let Some(existing) = existing {
            check_fingerprints(&existing, &worker)?;
            record.registered_at = existing.registered_at;
        }
        let json = |v: &dyn erased::Json| v.to_json();
        tx.execute(
            &format!(
                "INSERT INTO workers ({WORKER_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
                 ON CONFLICT (namespace, worker_id) DO UPDATE SET task_queue = excluded.task_queue, runtime = excluded.runtime,
                   sdk_version = excluded.sdk_version, build_id = excluded.build_id, workflow_types = excluded.workflow_types,
                   activity_types = excluded.activity_types, fingerprints = excluded.fingerprints, document = excluded.document,
                   status = excluded.status, last_heartbeat_at = excluded.last_heartbeat_at"
            ),
            &[
                &record.namespace,
                &record.worker_id,
                &record.task_queue,
                &record.runtime,
                &record.sdk_version,
                &record.build_id,
                &json(&record.supported_workflow_types),
                &json(&record.supported_activity_types),
                &json(&record.workflow_definition_fingerprints),
                &json(&record.document),
                &record.status,
                &record.registered_at,
                &record.last_heartbeat_at,
            ],
        )
        .await?;
        tx.commit().await?;
        Ok(record)
    }

    async fn heartbeat_worker(&self, namespace: &str, worker_id: &str, now: Millis) -> StoreResult<Option<WorkerRecord>> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                &format!("UPDATE workers SET last_heartbeat_at = $3 WHERE namespace = $1 AND worker_id = $2 RETURNING {WORKER_COLUMNS}"),
                &[&namespace, &worker_id, &now],
            )
            .await?;
        Ok(row.map(|r| worker_from_row(&r)))
    }

    async fn get_worker(&self, namespace: &str, worker_id: &str) -> StoreResult<Option<WorkerRecord>> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                &format!("SELECT {WORKER_COLUMNS} FROM workers WHERE namespace = $1 AND worker_id = $2"),
                &[&namespace, &worker_id],
            )
            .await?;
        Ok(row.map(|r| worker_from_row(&r)))
    }

    async fn leased_tasks(&self, namespace: &str, owner: &str, kind: TaskKind) -> StoreResult<Vec<TaskId>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT task_id FROM tasks WHERE namespace = $1 AND lease_owner = $2 AND kind = $3 AND status = 'leased'",
                &[&namespace, &owner, &kind.as_str()],
            )
            .await?;
        Ok(rows.iter().map(|r| TaskId(r.get(0))).collect())
    }

    async fn deregister_worker(&self, namespace: &str, worker_id: &str) -> StoreResult<bool> {
        let client = self.pool.get().await?;
        Ok(client
            .execute(
                "DELETE FROM workers WHERE namespace = $1 AND worker_id = $2",
                &[&namespace, &worker_id],
            )
            .await?
            > 0)
    }

    async fn start_workflow(&self, start: StartRun, policy: DuplicatePolicy, now: Millis) -> StoreResult<(StartOutcome, RunState)> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let started = runs::start_workflow(&mut PgTx::new(&tx, &self.wake_channel), start, policy, now, &self.limits).await?;
        tx.commit().await?;
        Ok(started)
    }

    async fn has_ready_task(&self, namespace: &str, kind: TaskKind, queue: &str, types: &[String], now: Millis) -> StoreResult<bool> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT 1 FROM tasks WHERE namespace = $1 AND kind = $2 AND queue = $3 AND status = 'ready' AND available_at <= $4
                   AND ($5::text[] IS NULL OR type_name = ANY($5)) LIMIT 1",
                &[&namespace, &kind.as_str(), &queue, &now, &type_filter(types)],
            )
            .await?;
        Ok(row.is_some())
    }

    async fn retained_command(
        &self,
        namespace: &str,
        workflow_id: &WorkflowId,
        command_type: &str,
        request_id: &str,
    ) -> StoreResult<Option<(String, Value)>> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT intent_hash, receipt FROM command_requests WHERE namespace = $1 AND workflow_id = $2 AND command_type = $3 AND request_id = $4",
                &[&namespace, &workflow_id.as_str(), &command_type, &request_id],
            )
            .await?;
        match row {
            Some(row) => Ok(Some((row.get(0), serde_json::from_str(row.get::<_, &str>(1)).map_err(corrupt)?))),
            None => Ok(None),
        }
    }

    async fn load_run(&self, namespace: &str, locator: RunLocator) -> StoreResult<Option<RunState>> {
        let client = self.pool.get().await?;
        let sql = match &locator {
            RunLocator::Task(_) => "SELECT r.state FROM tasks t JOIN runs r ON r.run_id = t.run_id WHERE t.task_id = $1 AND t.namespace = $2",
            RunLocator::Run(_, _) => "SELECT state FROM runs WHERE run_id = $1 AND workflow_id = $3 AND namespace = $2",
            RunLocator::Current(_) => "SELECT r.state FROM workflow_instances i JOIN runs r ON r.run_id = i.current_run_id WHERE i.workflow_id = $1 AND i.namespace = $2",
        };
        let row = match &locator {
            RunLocator::Task(task_id) => client.query_opt(sql, &[&task_id.as_str(), &namespace]).await?,
            RunLocator::Run(workflow_id, run_id) => {
                client
                    .query_opt(sql, &[&run_id.as_str(), &namespace, &workflow_id.as_str()])
                    .await?
            }
            RunLocator::Current(workflow_id) => client.query_opt(sql, &[&workflow_id.as_str(), &namespace]).await?,
        };
        match row {
            Some(row) => Ok(Some(serde_json::from_str(row.get::<_, &str>(0)).map_err(corrupt)?)),
            None => Ok(None),
        }
    }

    async fn history(&self, run_id: &RunId, after: u64, upto: u64, limit: usize) -> StoreResult<Vec<HistoryEvent>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT sequence, event_id, event_type, payload, workflow_task_id, workflow_command_id, recorded_at, prev_hash, hash
                 FROM history_events WHERE run_id = $1 AND sequence > $2 AND sequence <= $3 ORDER BY sequence LIMIT $4",
                &[
                    &run_id.as_str(),
                    &(after as i64),
                    &(upto.min(i64::MAX as u64) as i64),
                    &(limit as i64),
                ],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let event_type: &str = row.get(2);
                Ok(HistoryEvent {
                    sequence: row.get::<_, i64>(0) as u64,
                    id: EventId(row.get(1)),
                    event_type: EventType::parse(event_type)
                        .ok_or_else(|| StoreError::Storage(format!("unknown stored event type {event_type}")))?,
                    payload: serde_json::from_str(row.get::<_, &str>(3)).map_err(corrupt)?,
                    workflow_task_id: row.get::<_, Option<String>>(4).map(TaskId),
                    workflow_command_id: row.get::<_, Option<String>>(5).map(CommandId),
                    recorded_at: row.get(6),
                    prev_hash: row.get(7),
                    hash: row.get(8),
                })
            })
            .collect()
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
        let rows = client
            .query(
                "SELECT state FROM runs WHERE namespace = $1 AND workflow_id = $2 ORDER BY run_number",
                &[&namespace, &workflow_id.as_str()],
            )
            .await?;
        rows.iter().map(|row| summary_from_state(row.get(0))).collect()
    }

    async fn claim_due_tasks(&self, node: &str, now: Millis, limit: usize, hold_ms: i64) -> StoreResult<Vec<DueTask>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "UPDATE tasks SET duty_owner = $1, duty_fence = duty_fence + 1, duty_expires_at = $3
                 WHERE task_id IN (
                     SELECT task_id FROM tasks
                     WHERE deadline_at IS NOT NULL AND deadline_at <= $2 AND status IN ('ready', 'leased')
                       AND (duty_expires_at IS NULL OR duty_expires_at <= $2)
                     ORDER BY deadline_at LIMIT $4 FOR UPDATE SKIP LOCKED)
                 RETURNING namespace, task_id, duty_fence",
                &[&node, &now, &(now + hold_ms), &(limit as i64)],
            )
            .await?;
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
        let row = client
            .query_one(
                "SELECT MIN(deadline_at) FROM tasks WHERE deadline_at IS NOT NULL AND status IN ('ready', 'leased')",
                &[],
            )
            .await?;
        Ok(row.get(0))
    }

    async fn prune(&self, older_than: Millis) -> StoreResult<()> {
        let client = self.pool.get().await?;
        client
            .execute("DELETE FROM poll_requests WHERE created_at < $1", &[&older_than])
            .await?;
        client
            .execute("DELETE FROM query_tasks WHERE created_at < $1", &[&older_than])
            .await?;
        Ok(())
    }

    async fn expired_instances(&self, namespace: &str, cutoff: Millis, limit: usize) -> StoreResult<Vec<(String, String, Millis)>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT i.workflow_id, r.run_id, r.closed_at FROM runs r JOIN workflow_instances i ON i.current_run_id = r.run_id
                 WHERE r.namespace = $1 AND r.closed_at IS NOT NULL AND r.closed_at < $2 ORDER BY r.closed_at LIMIT $3",
                &[&namespace, &cutoff, &(limit as i64)],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect())
    }

    async fn prune_instances(&self, namespace: &str, workflow_ids: Vec<String>, cutoff: Millis) -> StoreResult<usize> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let mut pruned = 0;
        for workflow_id in workflow_ids {
            // The instance row lock keeps a concurrent start of this id out while it is removed.
            let expired = tx
                .query_opt(
                    "SELECT 1 FROM workflow_instances i JOIN runs r ON r.run_id = i.current_run_id
                     WHERE i.workflow_id = $1 AND i.namespace = $2 AND r.closed_at IS NOT NULL AND r.closed_at < $3 FOR UPDATE OF i",
                    &[&workflow_id, &namespace, &cutoff],
                )
                .await?;
            if expired.is_none() {
                continue;
            }
            for sql in [
                "DELETE FROM history_events WHERE run_id IN (SELECT run_id FROM runs WHERE workflow_id = $1 AND namespace = $2)",
                "DELETE FROM tasks WHERE run_id IN (SELECT run_id FROM runs WHERE workflow_id = $1 AND namespace = $2)",
                "DELETE FROM search_attribute_index WHERE run_id IN (SELECT run_id FROM runs WHERE workflow_id = $1 AND namespace = $2)",
                "DELETE FROM runs WHERE workflow_id = $1 AND namespace = $2",
                "DELETE FROM command_requests WHERE workflow_id = $1 AND namespace = $2",
                "DELETE FROM workflow_instances WHERE workflow_id = $1 AND namespace = $2",
            ] {
                tx.execute(sql, &[&workflow_id, &namespace]).await?;
            }
            pruned += 1;
        }
        tx.commit().await?;
        Ok(pruned)
    }

    async fn system_counts(&self, namespace: &str, now: Millis) -> StoreResult<SystemCounts> {
        let client = self.pool.get().await?;
        let runs_by_status = client
            .query(
                "SELECT status, COUNT(*)::bigint FROM runs WHERE namespace = $1 GROUP BY status ORDER BY status",
                &[&namespace],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let tasks = client
            .query(
                "SELECT kind, status, COUNT(*)::bigint FROM tasks WHERE namespace = $1 AND status IN ('ready', 'leased')
                 GROUP BY kind, status ORDER BY kind, status",
                &[&namespace],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let expired_lease_runs = client
            .query(
                "SELECT r.workflow_id, r.run_id FROM tasks t JOIN runs r ON r.run_id = t.run_id
                 WHERE t.namespace = $1 AND t.status = 'leased' AND t.kind = 'workflow' AND t.lease_expires_at < $2 LIMIT 100",
                &[&namespace, &now],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let expired_leases = client
            .query_one(
                "SELECT COUNT(*)::bigint FROM tasks WHERE namespace = $1 AND status = 'leased' AND lease_expires_at < $2",
                &[&namespace, &now],
            )
            .await?
            .get(0);
        Ok(SystemCounts {
            runs_by_status,
            tasks,
            expired_leases,
            expired_lease_runs,
        })
    }

    async fn bridge_delivery(&self, namespace: &str, adapter: &str, key: &str) -> StoreResult<Option<Value>> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT outcome FROM bridge_deliveries WHERE namespace = $1 AND adapter = $2 AND idempotency_key = $3",
                &[&namespace, &adapter, &key],
            )
            .await?;
        row.map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(corrupt)).transpose()
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
        let inserted = client
            .execute(
                "INSERT INTO bridge_deliveries (namespace, adapter, idempotency_key, outcome, created_at) VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT DO NOTHING",
                &[&namespace, &adapter, &key, &outcome.to_string(), &now],
            )
            .await?;
        if inserted == 1 {
            return Ok(None);
        }
        self.bridge_delivery(namespace, adapter, key).await
    }

    async fn build_id_rollouts(&self, namespace: &str, queue: &str) -> StoreResult<Vec<BuildIdRollout>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT build_id, drain_intent, drained_at, updated_at, promoted_at FROM build_id_rollouts
                 WHERE namespace = $1 AND task_queue = $2 ORDER BY build_id",
                &[&namespace, &queue],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| {
                let build_id: String = r.get(0);
                BuildIdRollout {
                    build_id: (!build_id.is_empty()).then_some(build_id),
                    drain_intent: r.get(1),
                    drained_at: r.get(2),
                    updated_at: r.get(3),
                    promoted_at: r.get(4),
                }
            })
            .collect())
    }

    async fn set_build_id_drain(
        &self,
        namespace: &str,
        queue: &str,
        build_id: Option<String>,
        draining: bool,
        now: Millis,
    ) -> StoreResult<BuildIdRollout> {
        let client = self.pool.get().await?;
        let key = build_id.clone().unwrap_or_default();
        let intent = if draining { "draining" } else { "active" };
        let row = client
            .query_one(
                "INSERT INTO build_id_rollouts (namespace, task_queue, build_id, drain_intent, drained_at, updated_at)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (namespace, task_queue, build_id) DO UPDATE SET
                   drain_intent = excluded.drain_intent, updated_at = excluded.updated_at,
                   drained_at = CASE WHEN excluded.drain_intent = 'draining'
                                     THEN COALESCE(build_id_rollouts.drained_at, excluded.drained_at) ELSE NULL END
                 RETURNING drained_at, promoted_at",
                &[&namespace, &queue, &key, &intent, &draining.then_some(now), &now],
            )
            .await?;
        Ok(BuildIdRollout {
            build_id,
            drain_intent: intent.into(),
            drained_at: row.get(0),
            updated_at: now,
            promoted_at: row.get(1),
        })
    }

    async fn promote_build_id(&self, namespace: &str, queue: &str, build_id: Option<String>, now: Millis) -> StoreResult<BuildIdRollout> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let key = build_id.clone().unwrap_or_default();
        tx.execute(
            "UPDATE build_id_rollouts SET promoted_at = NULL WHERE namespace = $1 AND task_queue = $2 AND build_id <> $3",
            &[&namespace, &queue, &key],
        )
        .await?;
        let row = tx
            .query_one(
                "INSERT INTO build_id_rollouts (namespace, task_queue, build_id, drain_intent, drained_at, updated_at, promoted_at)
                 VALUES ($1, $2, $3, 'active', NULL, $4, $4)
                 ON CONFLICT (namespace, task_queue, build_id) DO UPDATE SET updated_at = excluded.updated_at,
                   promoted_at = COALESCE(build_id_rollouts.promoted_at, excluded.promoted_at)
                 RETURNING drain_intent, drained_at, promoted_at",
                &[&namespace, &queue, &key, &now],
            )
            .await?;
        tx.commit().await?;
        Ok(BuildIdRollout {
            build_id,
            drain_intent: row.get(0),
            drained_at: row.get(1),
            updated_at: now,
            promoted_at: row.get(2),
        })
    }

    async fn search_attribute_definitions(
        &self,
        namespace: &str,
    ) -> StoreResult<std::collections::BTreeMap<String, capstan_engine::visibility::AttributeType>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT name, kind FROM search_attribute_definitions WHERE namespace = $1",
                &[&namespace],
            )
            .await?;
        Ok(rows
            .iter()
            .filter_map(|r| capstan_engine::visibility::AttributeType::parse(r.get(1)).map(|k| (r.get::<_, String>(0), k)))
            .collect())
    }

    async fn define_search_attribute(
        &self,
        namespace: &str,
        name: &str,
        kind: capstan_engine::visibility::AttributeType,
        now: Millis,
    ) -> StoreResult<()> {
        let client = self.pool.get().await?;
        let inserted = client
            .execute(
                "INSERT INTO search_attribute_definitions (namespace, name, kind, created_at) VALUES ($1, $2, $3, $4)
                 ON CONFLICT DO NOTHING",
                &[&namespace, &name, &kind.as_str(), &now],
            )
            .await?;
        if inserted == 0 {
            return Err(search_attribute_exists(name));
        }
        Ok(())
    }

    async fn delete_search_attribute(&self, namespace: &str, name: &str) -> StoreResult<bool> {
        let client = self.pool.get().await?;
        Ok(client
            .execute(
                "DELETE FROM search_attribute_definitions WHERE namespace = $1 AND name = $2",
                &[&namespace, &name],
            )
            .await?
            > 0)
    }

    async fn workers(&self, namespace: &str) -> StoreResult<Vec<WorkerRecord>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                &format!("SELECT {WORKER_COLUMNS} FROM workers WHERE namespace = $1 ORDER BY worker_id"),
                &[&namespace],
            )
            .await?;
        Ok(rows.iter().map(worker_from_row).collect())
    }

    async fn task_queue_names(&self, namespace: &str) -> StoreResult<Vec<String>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "SELECT queue FROM tasks WHERE namespace = $1 AND status IN ('ready', 'leased') AND queue <> $2
                 UNION SELECT task_queue FROM workers WHERE namespace = $1 ORDER BY 1",
                &[&namespace, &ATOMIC_QUEUE],
            )
            .await?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn task_queue_snapshot(&self, namespace: &str, queue: &str, lease_limit: usize) -> StoreResult<QueueSnapshot> {
        let client = self.pool.get().await?;
        let counts = client
            .query(
                "SELECT kind, status, COUNT(*)::bigint, MIN(available_at) FROM tasks
                 WHERE namespace = $1 AND queue = $2 AND status IN ('ready', 'leased') GROUP BY kind, status",
                &[&namespace, &queue],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect();
        let leases = client
            .query(
                "SELECT t.task_id, t.kind, t.type_name, r.workflow_id, t.run_id, t.lease_owner, t.lease_expires_at
                 FROM tasks t JOIN runs r ON r.run_id = t.run_id
                 WHERE t.namespace = $1 AND t.queue = $2 AND t.status = 'leased' ORDER BY t.lease_expires_at LIMIT $3",
                &[&namespace, &queue, &(lease_limit as i64)],
            )
            .await?
            .iter()
            .map(|r| QueueLease {
                task_id: r.get(0),
                kind: r.get(1),
                type_name: r.get(2),
                workflow_id: r.get(3),
                run_id: r.get(4),
                lease_owner: r.get(5),
                lease_expires_at: r.get(6),
            })
            .collect();
        let pinned = client
            .query(
                "SELECT compatibility, COUNT(*)::bigint FROM tasks WHERE namespace = $1 AND queue = $2 AND status = 'ready'
                   AND kind = 'workflow' AND compatibility IS NOT NULL GROUP BY compatibility",
                &[&namespace, &queue],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        Ok(QueueSnapshot { counts, leases, pinned })
    }

    async fn queue_workers(&self, namespace: &str, queue: &str) -> StoreResult<Vec<WorkerRecord>> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                &format!("SELECT {WORKER_COLUMNS} FROM workers WHERE namespace = $1 AND task_queue = $2"),
                &[&namespace, &queue],
            )
            .await?;
        Ok(rows.iter().map(worker_from_row).collect())
    }

    async fn create_query_task(&self, task: QueryTask) -> StoreResult<()> {
        let client = self.pool.get().await?;
        write_query_task(&**client, &task).await?;
        // Query pollers on other nodes learn of it at once.
        let key = format!("{}\u{1f}query\u{1f}{}", task.namespace, task.task_queue);
        client.execute("SELECT pg_notify($1, $2)", &[&&*self.wake_channel, &key]).await?;
        Ok(())
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
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let rows = tx
            .query(
                "SELECT doc FROM query_tasks WHERE namespace = $1 AND task_queue = $2 AND kind = $4 AND deadline_at > $3
                   AND (status = 'ready' OR (status = 'leased' AND lease_expires_at <= $3))
                 ORDER BY created_at LIMIT 8 FOR UPDATE SKIP LOCKED",
                &[&namespace, &queue, &now, &kind.as_str()],
            )
            .await?;
        for row in rows {
            let mut task: QueryTask = serde_json::from_str(row.get::<_, &str>(0)).map_err(corrupt)?;
            if task.lease(owner, lease_ms, now).is_ok() {
                write_query_task(&*tx, &task).await?;
                tx.commit().await?;
                return Ok(Some(task));
            }
        }
        Ok(None)
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
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_opt(
                "SELECT doc FROM query_tasks WHERE query_task_id = $1 AND namespace = $2 FOR UPDATE",
                &[&id, &namespace],
            )
            .await?;
        let Some(row) = row else {
            return Err(Refusal::new(Reason::QueryTaskNotFound, "Query task not found.")
                .with("query_task_id", id)
                .into());
        };
        let mut task: QueryTask = serde_json::from_str(row.get::<_, &str>(0)).map_err(corrupt)?;
        task.answer(owner, attempt, outcome, now)?;
        write_query_task(&*tx, &task).await?;
        tx.commit().await?;
        Ok(task)
    }

    async fn get_query_task(&self, namespace: &str, id: &str) -> StoreResult<Option<QueryTask>> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT doc FROM query_tasks WHERE query_task_id = $1 AND namespace = $2",
                &[&id, &namespace],
            )
            .await?;
        match row {
            Some(row) => Ok(Some(serde_json::from_str(row.get::<_, &str>(0)).map_err(corrupt)?)),
            None => Ok(None),
        }
    }

    async fn delete_query_task(&self, namespace: &str, id: &str) -> StoreResult<()> {
        let client = self.pool.get().await?;
        client
            .execute(
                "DELETE FROM query_tasks WHERE query_task_id = $1 AND namespace = $2",
                &[&id, &namespace],
            )
            .await?;
        Ok(())
    }

    async fn recall_poll(&self, key: PollKey) -> StoreResult<Option<(TaskId, u64)>> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                "SELECT task_id, fence FROM poll_requests WHERE namespace = $1 AND task_queue = $2 AND worker_id = $3 AND kind = $4 AND poll_request_id = $5",
                &[&key.namespace, &key.task_queue, &key.worker_id, &key.kind.as_str(), &key.poll_request_id],
            )
            .await?;
        Ok(row.map(|r| (TaskId(r.get(0)), r.get::<_, i64>(1) as u64)))
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

mod erased {
    /// Serialises a stored JSON column.
    pub trait Json {
        fn to_json(&self) -> String;
    }

    impl<T: serde::Serialize> Json for T {
        fn to_json(&self) -> String {
            serde_json::to_string(self).unwrap_or_else(|_| "null".into())
        }
    }
}

/// An atomic action's view of the PostgreSQL transaction (inside its savepoint). The action is
/// synchronous: each statement blocks this worker thread (`block_in_place`) until it returns.
struct PgAtomic<'t> {
    tx: &'t Transaction<'t>,
    handle: tokio::runtime::Handle,
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

impl AtomicTransaction for PgAtomic<'_> {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, String> {
        let owned = pg_params(params);
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = owned.iter().map(|p| p.as_ref() as _).collect();
        self.handle.block_on(self.tx.execute(sql, &refs)).map_err(|e| e.to_string())
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, String> {
        let owned = pg_params(params);
        let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = owned.iter().map(|p| p.as_ref() as _).collect();
        let rows = self.handle.block_on(self.tx.query(sql, &refs)).map_err(|e| e.to_string())?;
        Ok(rows
            .iter()
            .map(|row| {
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
            })
            .collect())
    }
}

// ------------------------------------------------------------------------------------------
// Schedules

async fn pg_lock_schedule(tx: &Transaction<'_>, namespace: &str, schedule_id: &str, skip_locked: bool) -> StoreResult<Option<Schedule>> {
    let sql = if skip_locked {
        "SELECT doc FROM schedules WHERE namespace = $1 AND schedule_id = $2 AND status != 'deleted' FOR UPDATE SKIP LOCKED"
    } else {
        "SELECT doc FROM schedules WHERE namespace = $1 AND schedule_id = $2 AND status != 'deleted' FOR UPDATE"
    };
    let row = tx.query_opt(sql, &[&namespace, &schedule_id]).await?;
    row.map(|r| serde_json::from_str(r.get::<_, &str>(0)).map_err(corrupt)).transpose()
}

/// Upserts the schedule row and appends the events the change recorded (the row lock makes the
/// sequence read safe).
async fn pg_write_schedule(tx: &Transaction<'_>, schedule: &mut Schedule) -> StoreResult<()> {
    let doc = serde_json::to_string(schedule).map_err(corrupt)?;
    tx.execute(
        "INSERT INTO schedules (namespace, schedule_id, status, workflow_type, wake_at, has_buffer, created_at, doc)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (namespace, schedule_id) DO UPDATE SET status = excluded.status, workflow_type = excluded.workflow_type,
           wake_at = excluded.wake_at, has_buffer = excluded.has_buffer, created_at = excluded.created_at, doc = excluded.doc",
        &[
            &schedule.namespace,
            &schedule.schedule_id,
            &schedule.status.as_str(),
            &schedule.action.workflow_type,
            &schedule.wake_at(),
            &(schedule.has_buffer() as i64),
            &schedule.created_at,
            &doc,
        ],
    )
    .await?;
    let mut sequence: i64 = tx
        .query_one(
            "SELECT COALESCE(MAX(sequence), 0)::bigint FROM schedule_events WHERE namespace = $1 AND schedule_id = $2",
            &[&schedule.namespace, &schedule.schedule_id],
        )
        .await?
        .get(0);
    for event in std::mem::take(&mut schedule.pending_events) {
        sequence += 1;
        let payload = serde_json::to_string(&event.payload).map_err(corrupt)?;
        tx.execute(
            "INSERT INTO schedule_events (namespace, schedule_id, sequence, event_id, event_type, recorded_at, workflow_id, run_id, payload)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                &schedule.namespace,
                &schedule.schedule_id,
                &sequence,
                &crate::new_ulid().to_string().to_lowercase(),
                &event.event_type,
                &event.recorded_at,
                &event.workflow_id,
                &event.run_id,
                &payload,
            ],
        )
        .await?;
    }
    Ok(())
}

