//! [`Store`] on an embedded SQLite file: WAL journal, `synchronous=FULL`, one writer thread with
//! group commit (see `writer.rs`) and a small pool of reader connections.

mod schema;
mod tx;
mod writer;

pub(crate) use writer::note_io_failure;

use crate::logic::{claim, integrity, runs};
use crate::rows::*;
use crate::schedules;
use crate::*;
use crate::logic::persist::persist;
use tx::drive;
use writer::Writer;
use capstan_engine::schedule::Schedule;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const READERS: usize = 4;

#[derive(Clone)]
pub struct SqliteStore {
    writer: Writer,
    /// Committed ready-task announcements, handed to the server once (see `wakeups`).
    wakeups: Arc<Mutex<Option<WakeReceiver>>>,
    readers: Arc<Mutex<Vec<Connection>>>,
    path: PathBuf,
    limits: Arc<Limits>,
}

fn open_connection(path: &Path) -> StoreResult<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    // WAL lets readers run beside the writer; FULL makes every COMMIT fsync the WAL, so an
    // acknowledged transition survives power loss, not just a process crash.
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = FULL;
         PRAGMA foreign_keys = ON;
         PRAGMA busy_timeout = 10000;",
    )?;
    Ok(conn)
}

impl SqliteStore {
    /// A change that found a broken ledger chain was not written: open an incident, block the
    /// run, and answer as refused.
    async fn guard<T>(&self, result: StoreResult<T>) -> StoreResult<T> {
        match result {
            Err(StoreError::Integrity(breach)) => Err(self.record_breach(breach).await?.into()),
            other => other,
        }
    }

    /// Like [`guard`](Self::guard) for a claim: the poller just gets nothing.
    async fn guard_claim(&self, result: StoreResult<Option<(Task, RunState)>>) -> StoreResult<Option<(Task, RunState)>> {
        match result {
            Err(StoreError::Integrity(breach)) => {
                self.record_breach(breach).await?;
                Ok(None)
            }
            other => other,
        }
    }

    async fn record_breach(&self, breach: IntegrityBreach) -> StoreResult<Refusal> {
        let limits = self.limits.clone();
        self.writer
            .write_tx(move |tx| drive(integrity::record_breach(tx, &breach, now_ms(), &limits)))
            .await
    }

    /// Opens (creating if needed) the database file, migrates it and bootstraps `default`.
    pub fn open(path: &Path, limits: Limits, now: Millis) -> StoreResult<Self> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|e| StoreError::Storage(format!("create {}: {e}", dir.display())))?;
            }
        }
        let mut conn = open_connection(path)?;
        schema::migrate(&mut conn, now)?;
        let readers = (0..READERS).map(|_| open_connection(path)).collect::<StoreResult<Vec<_>>>()?;
        let (wake, wakeups) = tokio::sync::mpsc::unbounded_channel();
        Ok(Self {
            writer: Writer::start(conn, wake),
            wakeups: Arc::new(Mutex::new(Some(wakeups))),
            readers: Arc::new(Mutex::new(readers)),
            path: path.to_path_buf(),
            limits: Arc::new(limits),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Fault injection for tests: the next `count` group commits fail like a failed fsync (0 lifts
    /// the fault; `u32::MAX` keeps it until lifted).
    pub fn inject_commit_failures(&self, count: u32) {
        self.writer.inject_commit_failures(count);
    }

    /// Runs a read on a pooled reader connection, inline: SQLite point reads take microseconds,
    /// far less than a hand-off to a blocking thread would.
    async fn read<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let pooled = self.readers.lock().expect("reader pool").pop();
        let conn = match pooled {
            Some(conn) => conn,
            None => open_connection(&self.path)?,
        };
        let result = f(&conn);
        let mut pool = self.readers.lock().expect("reader pool");
        if pool.len() < READERS {
            pool.push(conn);
        }
        result
    }
}

// ------------------------------------------------------------------------------------------
// Row <-> engine conversions

fn load_state(conn: &Connection, run_id: &str) -> StoreResult<Option<RunState>> {
    let doc: Option<String> = conn
        .query_row("SELECT state FROM runs WHERE run_id = ?1", [run_id], |r| r.get(0))
        .optional()?;
    Ok(match doc {
        Some(doc) => Some(serde_json::from_str(&doc)?),
        None => None,
    })
}

fn locate_run(conn: &Connection, namespace: &str, locator: &RunLocator) -> StoreResult<Option<String>> {
    Ok(match locator {
        RunLocator::Task(task_id) => conn
            .query_row(
                "SELECT run_id FROM tasks WHERE task_id = ?1 AND namespace = ?2",
                params![task_id.as_str(), namespace],
                |r| r.get(0),
            )
            .optional()?,
        RunLocator::Run(workflow_id, run_id) => conn
            .prepare_cached("SELECT run_id FROM runs WHERE run_id = ?1 AND workflow_id = ?2 AND namespace = ?3")?
            .query_row(params![run_id.as_str(), workflow_id.as_str(), namespace], |r| r.get(0))
            .optional()?,
        RunLocator::Current(workflow_id) => conn
            .prepare_cached("SELECT current_run_id FROM workflow_instances WHERE workflow_id = ?1 AND namespace = ?2")?
            .query_row(params![workflow_id.as_str(), namespace], |r| r.get(0))
            .optional()?,
    })
}

fn worker_from_row(row: &rusqlite::Row) -> rusqlite::Result<WorkerRecord> {
    let parse_list = |text: String| serde_json::from_str::<Vec<String>>(&text).unwrap_or_default();
    let parse_map = |text: String| serde_json::from_str::<Map<String, Value>>(&text).unwrap_or_default();
    Ok(WorkerRecord {
        namespace: row.get(0)?,
        worker_id: row.get(1)?,
        task_queue: row.get(2)?,
        runtime: row.get(3)?,
        sdk_version: row.get(4)?,
        build_id: row.get(5)?,
        supported_workflow_types: parse_list(row.get(6)?),
        supported_activity_types: parse_list(row.get(7)?),
        workflow_definition_fingerprints: parse_map(row.get(8)?),
        document: parse_map(row.get(9)?),
        status: row.get(10)?,
        registered_at: row.get(11)?,
        last_heartbeat_at: row.get(12)?,
    })
}

fn get_worker(conn: &Connection, namespace: &str, worker_id: &str) -> StoreResult<Option<WorkerRecord>> {
    Ok(conn
        .query_row(
            &format!("SELECT {WORKER_COLUMNS} FROM workers WHERE namespace = ?1 AND worker_id = ?2"),
            params![namespace, worker_id],
            worker_from_row,
        )
        .optional()?)
}

/// The WHERE conditions of a listing (namespace bound as `?1`, already in `values`): current
/// runs only (unless the query already joins from the instances), then each filter. The status
/// bucket is left out for counts.
fn list_conditions(filter: &ListFilter, with_status: bool, current_only: bool, values: &mut Vec<rusqlite::types::Value>) -> String {
    let mut sql = String::from("r.namespace = ?1");
    if current_only {
        sql.push_str(" AND r.run_id = (SELECT current_run_id FROM workflow_instances i WHERE i.workflow_id = r.workflow_id)");
    }
    for (column, value) in [
        ("workflow_type", &filter.workflow_type),
        ("task_queue", &filter.task_queue),
        ("workflow_id", &filter.workflow_id),
        ("business_key", &filter.business_key),
    ] {
        if let Some(value) = value {
            values.push(value.clone().into());
            sql.push_str(&format!(" AND r.{column} = ?{}", values.len()));
        }
    }
    if let Some(bucket) = filter.status_bucket.as_deref().filter(|_| with_status) {
        let statuses: Vec<String> = bucket_statuses(bucket).iter().map(|s| format!("'{s}'")).collect();
        sql.push_str(&format!(" AND r.status IN ({})", statuses.join(", ")));
    }
    if let Some(query) = &filter.query {
        values.push(like_pattern(query).into());
        let n = values.len();
        sql.push_str(&format!(
            " AND (r.workflow_id LIKE ?{n} ESCAPE '\\' OR r.business_key LIKE ?{n} ESCAPE '\\')"
        ));
    }
    for (key, value) in &filter.attributes {
        values.push(key.clone().into());
        values.push(value.clone().into());
        let n = values.len();
        sql.push_str(&format!(
            " AND r.run_id IN (SELECT run_id FROM search_attribute_index WHERE key = ?{} AND value = ?{n})",
            n - 1
        ));
    }
    if let Some(parsed) = &filter.filter {
        let base = values.len();
        let mut bound = Vec::new();
        let condition = crate::visibility_sql::compile(parsed, "r.", &mut bound, &|i| format!("?{}", base + i + 1));
        sql.push_str(&format!(" AND {condition}"));
        values.extend(bound.into_iter().map(|p| match p {
            crate::visibility_sql::SqlParam::Text(t) => rusqlite::types::Value::Text(t),
            crate::visibility_sql::SqlParam::Number(x) => rusqlite::types::Value::Real(x),
        }));
    }
    sql
}

fn summary_from_row(row: &rusqlite::Row) -> rusqlite::Result<RunSummary> {
    let state: String = row.get(0)?;
    let run: RunState =
        serde_json::from_str(&state).map_err(|e| rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e)))?;
    Ok(summary_of(&run))
}

/// Adds `AND type_name IN (...)` for a worker that declared the types it supports.
fn type_filter(types: &[String], first_param: usize) -> String {
    if types.is_empty() {
        return String::new();
    }
    let marks: Vec<String> = (0..types.len()).map(|i| format!("?{}", first_param + i)).collect();
    format!(" AND type_name IN ({})", marks.join(", "))
}

fn event_from_row(row: &rusqlite::Row) -> rusqlite::Result<HistoryEvent> {
    let event_type: String = row.get(2)?;
    let payload: String = row.get(3)?;
    let bad = |e: Box<dyn std::error::Error + Send + Sync>| rusqlite::Error::FromSqlConversionFailure(2, rusqlite::types::Type::Text, e);
    Ok(HistoryEvent {
        sequence: row.get::<_, i64>(0)? as u64,
        id: EventId(row.get(1)?),
        event_type: EventType::parse(&event_type).ok_or_else(|| bad(format!("unknown event type {event_type}").into()))?,
        payload: serde_json::from_str(&payload).map_err(|e| bad(Box::new(e)))?,
        workflow_task_id: row.get::<_, Option<String>>(4)?.map(TaskId),
        workflow_command_id: row.get::<_, Option<String>>(5)?.map(CommandId),
        recorded_at: row.get(6)?,
        prev_hash: row.get(7)?,
        hash: row.get(8)?,
    })
}

fn hash_text(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

impl Store for SqliteStore {
    async fn ping(&self) -> StoreResult<()> {
        self.read(|conn| Ok(conn.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)).map(|_| ())?))
            .await?;
        // After a failed commit, only a write that commits proves the database writable again
        // (space freed, the device back): until then the server is not ready.
        if self.writer.is_failing() {
            self.writer
                .write(|conn| {
                    conn.execute(
                        "INSERT INTO health_probe (id, probed_at) VALUES (1, strftime('%s','now')) ON CONFLICT (id) DO UPDATE SET probed_at = excluded.probed_at",
                        [],
                    )?;
                    Ok(())
                })
                .await?;
        }
        Ok(())
    }

    async fn namespace_exists(&self, namespace: &str) -> StoreResult<bool> {
        let namespace = namespace.to_string();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached("SELECT EXISTS(SELECT 1 FROM namespaces WHERE name = ?1)")?
                .query_row([namespace], |r| r.get(0))?)
        })
        .await
    }

    async fn register_worker(&self, worker: WorkerRecord) -> StoreResult<WorkerRecord> {
        self.writer
            .write(move |conn| {
                let mut record = worker.clone();
                if let Some(existing) = get_worker(conn, &worker.namespace, &worker.worker_id)? {
                    check_fingerprints(&existing, &worker)?;
                    record.registered_at = existing.registered_at;
                }
                conn.execute(
                    &format!(
                        "INSERT INTO workers ({WORKER_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)
                         ON CONFLICT (namespace, worker_id) DO UPDATE SET task_queue = excluded.task_queue, runtime = excluded.runtime,
                           sdk_version = excluded.sdk_version, build_id = excluded.build_id, workflow_types = excluded.workflow_types,
                           activity_types = excluded.activity_types, fingerprints = excluded.fingerprints, document = excluded.document,
                           status = excluded.status, last_heartbeat_at = excluded.last_heartbeat_at"
                    ),
                    params![
                        record.namespace,
                        record.worker_id,
                        record.task_queue,
                        record.runtime,
                        record.sdk_version,
                        record.build_id,
                        serde_json::to_string(&record.supported_workflow_types)?,
                        serde_json::to_string(&record.supported_activity_types)?,
                        serde_json::to_string(&record.workflow_definition_fingerprints)?,
                        serde_json::to_string(&record.document)?,
                        record.status,
                        record.registered_at,
                        record.last_heartbeat_at,
                    ],
                )?;
                Ok(record)
            })
            .await
    }

    async fn heartbeat_worker(&self, namespace: &str, worker_id: &str, now: Millis) -> StoreResult<Option<WorkerRecord>> {
        let (namespace, worker_id) = (namespace.to_string(), worker_id.to_string());
        self.writer
            .write(move |conn| {
                conn.execute(
                    "UPDATE workers SET last_heartbeat_at = ?3 WHERE namespace = ?1 AND worker_id = ?2",
                    params![namespace, worker_id, now],
                )?;
                get_worker(conn, &namespace, &worker_id)
            })
            .await
    }

    async fn get_worker(&self, namespace: &str, worker_id: &str) -> StoreResult<Option<WorkerRecord>> {
        let (namespace, worker_id) = (namespace.to_string(), worker_id.to_string());
        self.read(move |conn| get_worker(conn, &namespace, &worker_id)).await
    }

    async fn leased_tasks(&self, namespace: &str, owner: &str, kind: TaskKind) -> StoreResult<Vec<TaskId>> {
        let (namespace, owner) = (namespace.to_string(), owner.to_string());
        self.read(move |conn| {
            Ok(conn
                .prepare_cached("SELECT task_id FROM tasks WHERE namespace = ?1 AND lease_owner = ?2 AND kind = ?3 AND status = 'leased'")?
                .query_map(params![namespace, owner, kind.as_str()], |r| Ok(TaskId(r.get(0)?)))?
                .collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn deregister_worker(&self, namespace: &str, worker_id: &str) -> StoreResult<bool> {
        let (namespace, worker_id) = (namespace.to_string(), worker_id.to_string());
        self.writer
            .write(move |conn| {
                Ok(conn.execute(
                    "DELETE FROM workers WHERE namespace = ?1 AND worker_id = ?2",
                    params![namespace, worker_id],
                )? > 0)
            })
            .await
    }

    async fn start_workflow(&self, start: StartRun, policy: DuplicatePolicy, now: Millis) -> StoreResult<(StartOutcome, RunState)> {
        let limits = self.limits.clone();
        self.writer
            .write_tx(move |tx| drive(runs::start_workflow(tx, start, policy, now, &limits)))
            .await
    }

    async fn has_ready_task(&self, namespace: &str, kind: TaskKind, queue: &str, types: &[String], now: Millis) -> StoreResult<bool> {
        let (namespace, queue, types) = (namespace.to_string(), queue.to_string(), types.to_vec());
        self.read(move |conn| {
            let sql = format!(
                "SELECT EXISTS(SELECT 1 FROM tasks WHERE namespace = ?1 AND kind = ?2 AND queue = ?3 AND status = 'ready' AND available_at <= ?4{})",
                type_filter(&types, 5)
            );
            let mut values: Vec<rusqlite::types::Value> = vec![namespace.into(), kind.as_str().to_string().into(), queue.into(), now.into()];
            values.extend(types.into_iter().map(rusqlite::types::Value::from));
            Ok(conn.prepare_cached(&sql)?.query_row(rusqlite::params_from_iter(values), |r| r.get(0))?)
        })
        .await
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
        let (namespace, queue, types, owner) = (namespace.to_string(), queue.to_string(), types.to_vec(), owner.to_string());
        let limits = self.limits.clone();
        let result = self.writer
            .write_tx(move |tx| {
                let conn = tx.connection();
                // A pinned run's workflow tasks go only to workers of its build.
                let owner_param = 5 + types.len();
                let sql = format!(
                    "SELECT task_id, run_id FROM tasks WHERE namespace = ?1 AND kind = ?2 AND queue = ?3 AND status = 'ready' AND available_at <= ?4{}
                       AND (compatibility IS NULL OR compatibility = (SELECT build_id FROM workers WHERE namespace = ?1 AND worker_id = ?{owner_param}))
                     ORDER BY available_at, task_id LIMIT 8",
                    type_filter(&types, 5)
                );
                let mut values: Vec<rusqlite::types::Value> = vec![namespace.into(), kind.as_str().to_string().into(), queue.into(), now.into()];
                values.extend(types.into_iter().map(rusqlite::types::Value::from));
                values.push(owner.clone().into());
                let candidates: Vec<(String, String)> = conn
                    .prepare_cached(&sql)?
                    .query_map(rusqlite::params_from_iter(values), |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                let poller = claim::Poller {
                    kind,
                    owner: &owner,
                    lease_ms,
                    poll: poll.as_ref(),
                };
                for (task_id, run_id) in candidates {
                    let Some(run) = drive(runs::lock_run(tx, &run_id, false))? else { continue };
                    match drive(claim::lease_candidate(tx, run, TaskId(task_id), &poller, now, &limits))? {
                        claim::Claimed::Leased(task, run) => return Ok(Some((task, run))),
                        claim::Claimed::Refused | claim::Claimed::Stale => continue,
                    }
                }
                Ok(None)
            })
            .await;
        self.guard_claim(result).await
    }

    async fn mutate_run<T, F>(&self, namespace: &str, locator: RunLocator, now: Millis, transition: F) -> StoreResult<(T, RunState)>
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    {
        let namespace = namespace.to_string();
        let limits = self.limits.clone();
        let result = self
            .writer
            .write_tx(move |tx| drive(runs::mutate(tx, &namespace, &locator, now, &limits, transition)))
            .await;
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
        let namespace = namespace.to_string();
        let limits = self.limits.clone();
        let result = self
            .writer
            .write_tx(move |tx| drive(runs::mutate_keyed(tx, &namespace, &locator, &key, now, &limits, transition, render)))
            .await;
        self.guard(result).await
    }

    async fn put_action_definition(
        &self,
        namespace: &str,
        activity_type: &str,
        recovery_mode: RecoveryMode,
        document: Map<String, Value>,
        now: Millis,
    ) -> StoreResult<ActionDefinition> {
        let (namespace, activity_type) = (namespace.to_string(), activity_type.to_string());
        self.writer
            .write_tx(move |tx| {
                let hash = ActionDefinition::hash_of(&activity_type, &document);
                let existing = drive(claim::action_definition(tx, &namespace, &activity_type))?;
                let conn = tx.connection();
                if let Some(existing) = existing.as_ref().filter(|d| d.definition_hash == hash) {
                    return Ok(existing.clone());
                }
                let definition = ActionDefinition {
                    version: existing.map(|d| d.version + 1).unwrap_or(1),
                    namespace: namespace.clone(),
                    activity_type: activity_type.clone(),
                    recovery_mode,
                    document,
                    definition_hash: hash,
                    updated_at: now,
                };
                conn.prepare_cached(
                    "INSERT INTO action_definitions (namespace, activity_type, version, definition_hash, updated_at, doc) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT (namespace, activity_type) DO UPDATE SET version = excluded.version, definition_hash = excluded.definition_hash,
                         updated_at = excluded.updated_at, doc = excluded.doc",
                )?
                .execute(params![
                    namespace,
                    activity_type,
                    definition.version,
                    definition.definition_hash,
                    now,
                    serde_json::to_string(&definition)?
                ])?;
                Ok(definition)
            })
            .await
    }

    async fn action_definitions(&self, namespace: &str) -> StoreResult<Vec<ActionDefinition>> {
        let namespace = namespace.to_string();
        self.read(move |conn| {
            let docs: Vec<String> = conn
                .prepare_cached("SELECT doc FROM action_definitions WHERE namespace = ?1 ORDER BY activity_type")?
                .query_map([&namespace], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            docs.iter().map(|d| Ok(serde_json::from_str(d)?)).collect()
        })
        .await
    }

    async fn ledger_entries(&self, namespace: &str, filter: LedgerFilter, limit: usize) -> StoreResult<Vec<LedgerEntry>> {
        let namespace = namespace.to_string();
        self.read(move |conn| {
            let docs: Vec<String> = conn
                .prepare_cached(
                    "SELECT doc FROM ledger_entries WHERE namespace = ?1 AND (?2 IS NULL OR state = ?2)
                       AND (?3 IS NULL OR workflow_id = ?3) AND (?4 IS NULL OR activity_type = ?4)
                     ORDER BY dispatched_at, ledger_key LIMIT ?5",
                )?
                .query_map(
                    params![
                        namespace,
                        filter.state.map(|s| s.as_str()),
                        filter.workflow_id,
                        filter.activity_type,
                        limit as i64
                    ],
                    |r| r.get(0),
                )?
                .collect::<Result<_, _>>()?;
            docs.iter().map(|d| Ok(serde_json::from_str(d)?)).collect()
        })
        .await
    }

    async fn ledger_entry(&self, namespace: &str, ledger_key: &str) -> StoreResult<Option<LedgerEntry>> {
        let (namespace, key) = (namespace.to_string(), ledger_key.to_string());
        self.read(move |conn| {
            let doc: Option<String> = conn
                .prepare_cached("SELECT doc FROM ledger_entries WHERE namespace = ?1 AND ledger_key = ?2")?
                .query_row(params![namespace, key], |r| r.get(0))
                .optional()?;
            Ok(doc.map(|d| serde_json::from_str(&d)).transpose()?)
        })
        .await
    }

    async fn ledger_checkpoints(&self, namespace: &str, workflow_id: &WorkflowId) -> StoreResult<Vec<LedgerCheckpoint>> {
        let (namespace, workflow_id) = (namespace.to_string(), workflow_id.as_str().to_string());
        self.read(move |conn| {
            let docs: Vec<String> = conn
                .prepare_cached("SELECT doc FROM ledger_checkpoints WHERE namespace = ?1 AND workflow_id = ?2 ORDER BY rowid")?
                .query_map(params![namespace, workflow_id], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            docs.iter().map(|d| Ok(serde_json::from_str(d)?)).collect()
        })
        .await
    }

    async fn run_atomic_task(
        &self,
        namespace: &str,
        actions: AtomicActions,
        codec: &'static dyn MemoCodec,
        now: Millis,
    ) -> StoreResult<Option<AtomicOutcome>> {
        let namespace = namespace.to_string();
        let limits = self.limits.clone();
        // Only types this process has a handler for: another node may hold the others.
        let types = serde_json::to_string(&actions.0.keys().collect::<Vec<_>>()).map_err(|e| StoreError::Storage(e.to_string()))?;
        let result = self
            .writer
            .write_tx(move |tx| {
                let candidate: Option<(String, String)> = tx
                    .connection()
                    .prepare_cached(
                        "SELECT task_id, run_id FROM tasks WHERE namespace = ?1 AND kind = 'activity' AND queue = ?2
                           AND status = 'ready' AND available_at <= ?3 AND type_name IN (SELECT value FROM json_each(?4))
                         ORDER BY available_at, task_id LIMIT 1",
                    )?
                    .query_row(params![namespace, ATOMIC_QUEUE, now, types], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                let Some((task_id, run_id)) = candidate else { return Ok(None) };
                let mut run =
                    drive(runs::lock_run(tx, &run_id, false))?.ok_or_else(|| StoreError::Storage(format!("run {run_id} is missing")))?;
                let task_id = TaskId(task_id);
                let mut ids = UlidIds;
                let mut cx = Cx::new(now, &mut ids, &limits);
                cx.memo = Some(codec);
                let activity_type = match run.tasks.get(&task_id).map(|t| &t.detail) {
                    Some(TaskDetail::Activity { activity_type, .. }) => activity_type.clone(),
                    _ => return Ok(None),
                };
                let definition = drive(claim::action_definition(tx, &run.namespace, &activity_type))?;
                let Some(task) = lease_activity_task_with(&mut run, &mut cx, &task_id, ATOMIC_OWNER, 60_000, definition.as_ref())? else {
                    drive(persist(tx, &run, &cx.effects, false, &limits))?;
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
                        let conn = tx.connection();
                        conn.execute_batch("SAVEPOINT capstan_atomic")?;
                        match action.run(&mut SqliteAtomic(conn), &arguments) {
                            Ok(value) => {
                                conn.execute_batch("RELEASE capstan_atomic")?;
                                codec.json_to_payload(&value)
                            }
                            Err(message) => {
                                conn.execute_batch("ROLLBACK TO capstan_atomic; RELEASE capstan_atomic")?;
                                Err(message)
                            }
                        }
                    }
                };
                let outcome = finish_atomic(&mut run, &mut cx, &task, handled)?;
                drive(persist(tx, &run, &cx.effects, false, &limits))?;
                Ok(Some(outcome))
            })
            .await;
        self.guard(result).await
    }

    async fn create_schedule(&self, mut schedule: Schedule) -> StoreResult<()> {
        self.writer
            .write(move |conn| {
                if load_schedule(conn, &schedule.namespace, &schedule.schedule_id)?.is_some() {
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
                write_schedule(conn, &mut schedule)
            })
            .await
    }

    async fn schedule(&self, namespace: &str, schedule_id: &str) -> StoreResult<Option<Schedule>> {
        let (namespace, schedule_id) = (namespace.to_string(), schedule_id.to_string());
        self.read(move |conn| load_schedule(conn, &namespace, &schedule_id)).await
    }

    async fn list_schedules(&self, namespace: &str, filter: ScheduleFilter) -> StoreResult<Vec<Schedule>> {
        let namespace = namespace.to_string();
        self.read(move |conn| {
            let (after_at, after_id) = filter.after.clone().unzip();
            let docs: Vec<String> = conn
                .prepare_cached(
                    "SELECT doc FROM schedules WHERE namespace = ?1 AND status != 'deleted'
                       AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR workflow_type = ?3)
                       AND (?4 IS NULL OR created_at < ?4 OR (created_at = ?4 AND schedule_id > ?5))
                     ORDER BY created_at DESC, schedule_id ASC LIMIT ?6",
                )?
                .query_map(
                    params![
                        namespace,
                        filter.status,
                        filter.workflow_type,
                        after_at,
                        after_id,
                        filter.limit as i64
                    ],
                    |r| r.get(0),
                )?
                .collect::<Result<_, _>>()?;
            docs.iter().map(|d| Ok(serde_json::from_str(d)?)).collect()
        })
        .await
    }

    async fn change_schedule<T: Send + 'static>(
        &self,
        namespace: &str,
        schedule_id: &str,
        change: impl FnOnce(&mut Schedule) -> Result<T, Refusal> + Send + 'static,
    ) -> StoreResult<T> {
        let (namespace, schedule_id) = (namespace.to_string(), schedule_id.to_string());
        self.writer
            .write(move |conn| {
                let mut schedule =
                    load_schedule(conn, &namespace, &schedule_id)?.ok_or_else(|| schedule_missing(&schedule_id, &namespace))?;
                let value = change(&mut schedule)?;
                write_schedule(conn, &mut schedule)?;
                Ok(value)
            })
            .await
    }

    async fn fire_schedule(
        &self,
        namespace: &str,
        schedule_id: &str,
        fire: ScheduleFire,
        empty_input: Payload,
        now: Millis,
    ) -> StoreResult<FireReport> {
        let (namespace, schedule_id) = (namespace.to_string(), schedule_id.to_string());
        let limits = self.limits.clone();
        self.writer
            .write_tx(move |tx| {
                let mut schedule = load_schedule(tx.connection(), &namespace, &schedule_id)?
                    .ok_or_else(|| schedule_missing(&schedule_id, &namespace))?;
                let before = serde_json::to_string(&schedule)?;
                let report = drive(schedules::fire(tx, &mut schedule, &fire, &empty_input, now, &limits))?;
                if serde_json::to_string(&schedule)? != before || !schedule.pending_events.is_empty() {
                    write_schedule(tx.connection(), &mut schedule)?;
                }
                Ok(report)
            })
            .await
    }

    async fn due_schedules(&self, now: Millis, limit: usize) -> StoreResult<Vec<(String, String)>> {
        self.read(move |conn| {
            let rows = conn
                .prepare_cached(
                    "SELECT namespace, schedule_id FROM schedules WHERE (wake_at IS NOT NULL AND wake_at <= ?1) OR has_buffer = 1
                     ORDER BY wake_at LIMIT ?2",
                )?
                .query_map(params![now, limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            Ok(rows)
        })
        .await
    }

    async fn next_schedule_wake(&self) -> StoreResult<Option<Millis>> {
        self.read(move |conn| {
            Ok(conn
                .prepare_cached("SELECT MIN(wake_at) FROM schedules")?
                .query_row([], |r| r.get(0))?)
        })
        .await
    }

    async fn schedule_history(
        &self,
        namespace: &str,
        schedule_id: &str,
        after_sequence: i64,
        limit: usize,
    ) -> StoreResult<Option<Vec<ScheduleEventRecord>>> {
        let (namespace, schedule_id) = (namespace.to_string(), schedule_id.to_string());
        self.read(move |conn| {
            let known: Option<i64> = conn
                .prepare_cached("SELECT 1 FROM schedules WHERE namespace = ?1 AND schedule_id = ?2")?
                .query_row(params![namespace, schedule_id], |r| r.get(0))
                .optional()?;
            if known.is_none() {
                return Ok(None);
            }
            let rows: Vec<EventRow> = conn
                .prepare_cached(
                    "SELECT sequence, event_id, event_type, recorded_at, workflow_id, run_id, payload FROM schedule_events
                     WHERE namespace = ?1 AND schedule_id = ?2 AND sequence > ?3 ORDER BY sequence LIMIT ?4",
                )?
                .query_map(params![namespace, schedule_id, after_sequence, limit as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?))
                })?
                .collect::<Result<_, _>>()?;
            rows.into_iter()
                .map(|(sequence, event_id, event_type, recorded_at, workflow_id, run_id, payload)| {
                    Ok(ScheduleEventRecord {
                        sequence,
                        event_id,
                        event_type,
                        recorded_at,
                        workflow_id,
                        run_id,
                        payload: serde_json::from_str(&payload)?,
                    })
                })
                .collect::<StoreResult<Vec<_>>>()
                .map(Some)
        })
        .await
    }

    async fn namespaces(&self) -> StoreResult<Vec<NamespaceRecord>> {
        self.read(move |conn| {
            let rows = conn
                .prepare_cached("SELECT name, description, created_at, doc FROM namespaces ORDER BY name")?
                .query_map([], |r| Ok(namespace_from_row(r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<Result<_, _>>()?;
            Ok(rows)
        })
        .await
    }

    async fn create_namespace(&self, record: NamespaceRecord) -> StoreResult<NamespaceRecord> {
        self.writer
            .write(move |conn| {
                let inserted = conn
                    .prepare_cached("INSERT OR IGNORE INTO namespaces (name, description, created_at, doc) VALUES (?1, ?2, ?3, ?4)")?
                    .execute(params![
                        record.name,
                        record.description,
                        record.created_at,
                        serde_json::to_string(&record)?
                    ])?;
                if inserted == 0 {
                    return Err(Refusal::new(
                        Reason::NamespaceAlreadyExists,
                        format!("Namespace {:?} already exists.", record.name),
                    )
                    .with("namespace", record.name.clone())
                    .into());
                }
                Ok(record)
            })
            .await
    }

    async fn update_namespace(
        &self,
        name: &str,
        description: Option<String>,
        retention_days: Option<i64>,
        now: Millis,
    ) -> StoreResult<NamespaceRecord> {
        let name = name.to_string();
        self.writer
            .write(move |conn| {
                let row: Option<NamespaceRecord> = conn
                    .prepare_cached("SELECT name, description, created_at, doc FROM namespaces WHERE name = ?1")?
                    .query_row([&name], |r| Ok(namespace_from_row(r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                    .optional()?;
                let mut record = row.ok_or_else(|| namespace_missing(&name))?;
                if description.is_some() {
                    record.description = description;
                }
                if retention_days.is_some() {
                    record.retention_days = retention_days;
                }
                record.updated_at = now;
                conn.prepare_cached("UPDATE namespaces SET description = ?2, doc = ?3 WHERE name = ?1")?
                    .execute(params![name, record.description, serde_json::to_string(&record)?])?;
                Ok(record)
            })
            .await
    }

    async fn delete_namespace(&self, name: &str) -> StoreResult<NamespaceRecord> {
        let name = name.to_string();
        self.writer
            .write(move |conn| {
                let row: Option<NamespaceRecord> = conn
                    .prepare_cached("SELECT name, description, created_at, doc FROM namespaces WHERE name = ?1")?
                    .query_row([&name], |r| Ok(namespace_from_row(r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
                    .optional()?;
                let record = row.ok_or_else(|| namespace_missing(&name))?;
                let workflows: i64 = conn.query_row("SELECT COUNT(*) FROM workflow_instances WHERE namespace = ?1", [&name], |r| {
                    r.get(0)
                })?;
                if name == "default" || workflows > 0 {
                    return Err(Refusal::new(
                        Reason::NamespaceNotEmpty,
                        "Only an empty namespace other than default can be deleted.",
                    )
                    .with("namespace", name.clone())
                    .with("workflows", workflows)
                    .into());
                }
                conn.execute("DELETE FROM namespaces WHERE name = ?1", [&name])?;
                conn.execute("DELETE FROM workers WHERE namespace = ?1", [&name])?;
                conn.execute("DELETE FROM action_definitions WHERE namespace = ?1", [&name])?;
                Ok(record)
            })
            .await
    }

    async fn ledger_stats(&self) -> StoreResult<LedgerStats> {
        self.read(move |conn| {
            let entries = conn
                .prepare_cached("SELECT namespace, state, COUNT(*), MIN(dispatched_at) FROM ledger_entries GROUP BY namespace, state")?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<Result<_, _>>()?;
            let open_incidents = conn
                .prepare_cached("SELECT namespace, COUNT(*) FROM integrity_incidents WHERE state = 'open' GROUP BY namespace")?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            Ok(LedgerStats { entries, open_incidents })
        })
        .await
    }

    async fn integrity_incidents(&self, namespace: &str, state: Option<String>) -> StoreResult<Vec<IntegrityIncident>> {
        let namespace = namespace.to_string();
        self.read(move |conn| {
            let docs: Vec<String> = conn
                .prepare_cached(
                    "SELECT doc FROM integrity_incidents WHERE namespace = ?1 AND (?2 IS NULL OR state = ?2) ORDER BY opened_at, incident_id",
                )?
                .query_map(params![namespace, state], |r| r.get(0))?
                .collect::<Result<_, _>>()?;
            docs.iter().map(|d| Ok(serde_json::from_str(d)?)).collect()
        })
        .await
    }

    async fn close_integrity_incident(
        &self,
        namespace: &str,
        incident_id: &str,
        note: String,
        now: Millis,
    ) -> StoreResult<IntegrityIncident> {
        let (namespace, incident_id) = (namespace.to_string(), incident_id.to_string());
        let limits = self.limits.clone();
        self.writer
            .write_tx(move |tx| drive(integrity::close_incident(tx, &namespace, &incident_id, note, now, &limits)))
            .await
    }

    async fn runs_page(&self, after: Option<RunId>, limit: usize) -> StoreResult<Vec<(String, WorkflowId, RunId)>> {
        let after = after.map(|r| r.as_str().to_string()).unwrap_or_default();
        self.read(move |conn| {
            let rows = conn
                .prepare_cached("SELECT namespace, workflow_id, run_id FROM runs WHERE run_id > ?1 ORDER BY run_id LIMIT ?2")?
                .query_map(params![after, limit as i64], |r| {
                    Ok((r.get::<_, String>(0)?, WorkflowId(r.get(1)?), RunId(r.get(2)?)))
                })?
                .collect::<Result<_, _>>()?;
            Ok(rows)
        })
        .await
    }

    async fn ledger_instances(&self) -> StoreResult<Vec<(String, WorkflowId)>> {
        self.read(move |conn| {
            let rows = conn
                .prepare_cached("SELECT DISTINCT namespace, workflow_id FROM ledger_checkpoints ORDER BY namespace, workflow_id")?
                .query_map([], |r| Ok((r.get::<_, String>(0)?, WorkflowId(r.get(1)?))))?
                .collect::<Result<_, _>>()?;
            Ok(rows)
        })
        .await
    }

    async fn retained_command(
        &self,
        namespace: &str,
        workflow_id: &WorkflowId,
        command_type: &str,
        request_id: &str,
    ) -> StoreResult<Option<(String, Value)>> {
        let key = (
            namespace.to_string(),
            workflow_id.as_str().to_string(),
            command_type.to_string(),
            request_id.to_string(),
        );
        self.read(move |conn| {
            let stored: Option<(String, String)> = conn
                .prepare_cached(
                    "SELECT intent_hash, receipt FROM command_requests WHERE namespace = ?1 AND workflow_id = ?2 AND command_type = ?3 AND request_id = ?4",
                )?
                .query_row(params![key.0, key.1, key.2, key.3], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            stored.map(|(hash, receipt)| Ok((hash, serde_json::from_str(&receipt)?))).transpose()
        })
        .await
    }

    async fn load_run(&self, namespace: &str, locator: RunLocator) -> StoreResult<Option<RunState>> {
        let namespace = namespace.to_string();
        self.read(move |conn| match locate_run(conn, &namespace, &locator)? {
            Some(run_id) => load_state(conn, &run_id),
            None => Ok(None),
        })
        .await
    }

    async fn history(&self, run_id: &RunId, after: u64, upto: u64, limit: usize) -> StoreResult<Vec<HistoryEvent>> {
        let run_id = run_id.clone();
        self.read(move |conn| {
            let mut statement = conn.prepare_cached(
                "SELECT sequence, event_id, event_type, payload, workflow_task_id, workflow_command_id, recorded_at, prev_hash, hash
                 FROM history_events WHERE run_id = ?1 AND sequence > ?2 AND sequence <= ?3 ORDER BY sequence LIMIT ?4",
            )?;
            let rows = statement.query_map(params![run_id.as_str(), after as i64, upto as i64, limit as i64], event_from_row)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn list_runs(&self, namespace: &str, filter: ListFilter, offset: usize, limit: usize) -> StoreResult<(Vec<RunSummary>, bool)> {
        let namespace = namespace.to_string();
        self.read(move |conn| {
            let mut values: Vec<rusqlite::types::Value> = vec![namespace.into()];
            let mut sql = format!(
                "SELECT state FROM runs r WHERE {}",
                list_conditions(&filter, true, true, &mut values)
            );
            if let Some(after) = filter.after {
                values.push(after.started_at.into());
                values.push(after.run_id.into());
                let n = values.len();
                sql.push_str(&format!(" AND (started_at, run_id) < (?{}, ?{n})", n - 1));
            }
            sql.push_str(&format!(
                " ORDER BY started_at DESC, run_id DESC LIMIT {} OFFSET {}",
                limit + 1,
                offset
            ));
            let mut rows: Vec<RunSummary> = conn
                .prepare(&sql)?
                .query_map(rusqlite::params_from_iter(values), summary_from_row)?
                .collect::<Result<_, _>>()?;
            let more = rows.len() > limit;
            rows.truncate(limit);
            Ok((rows, more))
        })
        .await
    }

    async fn count_runs(&self, namespace: &str, filter: ListFilter) -> StoreResult<RunCounts> {
        let namespace = namespace.to_string();
        self.read(move |conn| {
            let mut values: Vec<rusqlite::types::Value> = vec![namespace.into()];
            // From the instances to their current runs (a primary-key lookup each) rather than
            // from every run through the correlated "is it current" check.
            let conditions = list_conditions(&filter, false, false, &mut values);
            let sql = format!(
                "SELECT r.status, COUNT(*) FROM workflow_instances i JOIN runs r ON r.run_id = i.current_run_id WHERE {conditions} GROUP BY r.status"
            );
            let mut counts = RunCounts::default();
            let mut statement = conn.prepare(&sql)?;
            let mut rows = statement.query(rusqlite::params_from_iter(values))?;
            while let Some(row) = rows.next()? {
                let (status, count): (String, i64) = (row.get(0)?, row.get(1)?);
                count_into(&mut counts, &status, count as u64);
            }
            Ok(counts)
        })
        .await
    }

    async fn runs_of(&self, namespace: &str, workflow_id: &WorkflowId) -> StoreResult<Vec<RunSummary>> {
        let (namespace, workflow_id) = (namespace.to_string(), workflow_id.clone());
        self.read(move |conn| {
            Ok(conn
                .prepare("SELECT state FROM runs WHERE namespace = ?1 AND workflow_id = ?2 ORDER BY run_number")?
                .query_map(params![namespace, workflow_id.as_str()], summary_from_row)?
                .collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn claim_due_tasks(&self, node: &str, now: Millis, limit: usize, hold_ms: i64) -> StoreResult<Vec<DueTask>> {
        let node = node.to_string();
        self.writer
            .write(move |conn| {
                let due: Vec<(String, String, i64)> = conn
                    .prepare_cached(
                        "SELECT namespace, task_id, duty_fence FROM tasks
                         WHERE deadline_at IS NOT NULL AND deadline_at <= ?1 AND status IN ('ready', 'leased')
                           AND (duty_expires_at IS NULL OR duty_expires_at <= ?1)
                         ORDER BY deadline_at LIMIT ?2",
                    )?
                    .query_map(params![now, limit as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<Result<_, _>>()?;
                let mut claim =
                    conn.prepare_cached("UPDATE tasks SET duty_owner = ?2, duty_fence = ?3, duty_expires_at = ?4 WHERE task_id = ?1")?;
                let mut claimed = Vec::with_capacity(due.len());
                for (namespace, task_id, fence) in due {
                    claim.execute(params![task_id, node, fence + 1, now + hold_ms])?;
                    claimed.push(DueTask {
                        namespace,
                        task_id: TaskId(task_id),
                        duty_fence: (fence + 1) as u64,
                    });
                }
                Ok(claimed)
            })
            .await
    }

    async fn run_duty<T, F>(&self, due: &DueTask, now: Millis, transition: F) -> StoreResult<(T, RunState)>
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    {
        let due = due.clone();
        let limits = self.limits.clone();
        let result = self
            .writer
            .write_tx(move |tx| drive(runs::run_duty(tx, &due, now, &limits, transition)))
            .await;
        self.guard(result).await
    }

    async fn wakeups(&self) -> StoreResult<Option<WakeReceiver>> {
        // Includes tasks made ready in other runs by follow-on transitions (child starts…).
        Ok(self.wakeups.lock().expect("wakeups").take())
    }

    async fn next_deadline(&self) -> StoreResult<Option<Millis>> {
        self.read(|conn| {
            Ok(conn.query_row(
                "SELECT MIN(deadline_at) FROM tasks WHERE deadline_at IS NOT NULL AND status IN ('ready', 'leased')",
                [],
                |r| r.get(0),
            )?)
        })
        .await
    }

    async fn prune(&self, older_than: Millis) -> StoreResult<()> {
        self.writer
            .write(move |conn| {
                conn.prepare_cached("DELETE FROM poll_requests WHERE created_at < ?1")?
                    .execute([older_than])?;
                conn.prepare_cached("DELETE FROM query_tasks WHERE created_at < ?1")?
                    .execute([older_than])?;
                Ok(())
            })
            .await
    }

    async fn expired_instances(&self, namespace: &str, cutoff: Millis, limit: usize) -> StoreResult<Vec<(String, String, Millis)>> {
        let namespace = namespace.to_string();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT i.workflow_id, r.run_id, r.closed_at FROM runs r JOIN workflow_instances i ON i.current_run_id = r.run_id
                     WHERE r.namespace = ?1 AND r.closed_at IS NOT NULL AND r.closed_at < ?2 ORDER BY r.closed_at LIMIT ?3",
                )?
                .query_map(params![namespace, cutoff, limit as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn prune_instances(&self, namespace: &str, workflow_ids: Vec<String>, cutoff: Millis) -> StoreResult<usize> {
        let namespace = namespace.to_string();
        self.writer
            .write(move |conn| {
                let mut pruned = 0;
                for workflow_id in workflow_ids {
                    let expired: Option<i64> = conn
                        .prepare_cached(
                            "SELECT 1 FROM workflow_instances i JOIN runs r ON r.run_id = i.current_run_id
                             WHERE i.workflow_id = ?1 AND i.namespace = ?2 AND r.closed_at IS NOT NULL AND r.closed_at < ?3",
                        )?
                        .query_row(params![workflow_id, namespace, cutoff], |r| r.get(0))
                        .optional()?;
                    if expired.is_none() {
                        continue;
                    }
                    for sql in [
                        "DELETE FROM history_events WHERE run_id IN (SELECT run_id FROM runs WHERE workflow_id = ?1 AND namespace = ?2)",
                        "DELETE FROM tasks WHERE run_id IN (SELECT run_id FROM runs WHERE workflow_id = ?1 AND namespace = ?2)",
                        "DELETE FROM search_attribute_index WHERE run_id IN (SELECT run_id FROM runs WHERE workflow_id = ?1 AND namespace = ?2)",
                        "DELETE FROM runs WHERE workflow_id = ?1 AND namespace = ?2",
                        "DELETE FROM command_requests WHERE workflow_id = ?1 AND namespace = ?2",
                        "DELETE FROM workflow_instances WHERE workflow_id = ?1 AND namespace = ?2",
                    ] {
                        conn.prepare_cached(sql)?.execute(params![workflow_id, namespace])?;
                    }
                    pruned += 1;
                }
                Ok(pruned)
            })
            .await
    }

    async fn system_counts(&self, namespace: &str, now: Millis) -> StoreResult<SystemCounts> {
        let namespace = namespace.to_string();
        self.read(move |conn| {
            let runs_by_status = conn
                .prepare_cached("SELECT status, COUNT(*) FROM runs WHERE namespace = ?1 GROUP BY status ORDER BY status")?
                .query_map(params![namespace], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            let tasks = conn
                .prepare_cached(
                    "SELECT kind, status, COUNT(*) FROM tasks WHERE namespace = ?1 AND status IN ('ready', 'leased')
                     GROUP BY kind, status ORDER BY kind, status",
                )?
                .query_map(params![namespace], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<_, _>>()?;
            let expired_lease_runs: Vec<(String, String)> = conn
                .prepare_cached(
                    "SELECT r.workflow_id, r.run_id FROM tasks t JOIN runs r ON r.run_id = t.run_id
                     WHERE t.namespace = ?1 AND t.status = 'leased' AND t.kind = 'workflow' AND t.lease_expires_at < ?2 LIMIT 100",
                )?
                .query_map(params![namespace, now], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            let expired_leases = conn
                .prepare_cached("SELECT COUNT(*) FROM tasks WHERE namespace = ?1 AND status = 'leased' AND lease_expires_at < ?2")?
                .query_row(params![namespace, now], |r| r.get(0))?;
            Ok(SystemCounts {
                runs_by_status,
                tasks,
                expired_leases,
                expired_lease_runs,
            })
        })
        .await
    }

    async fn bridge_delivery(&self, namespace: &str, adapter: &str, key: &str) -> StoreResult<Option<Value>> {
        let (namespace, adapter, key) = (namespace.to_string(), adapter.to_string(), key.to_string());
        self.read(move |conn| {
            let doc: Option<String> = conn
                .prepare_cached("SELECT outcome FROM bridge_deliveries WHERE namespace = ?1 AND adapter = ?2 AND idempotency_key = ?3")?
                .query_row(params![namespace, adapter, key], |r| r.get(0))
                .optional()?;
            Ok(doc.map(|d| serde_json::from_str(&d)).transpose()?)
        })
        .await
    }

    async fn record_bridge_delivery(
        &self,
        namespace: &str,
        adapter: &str,
        key: &str,
        outcome: Value,
        now: Millis,
    ) -> StoreResult<Option<Value>> {
        let (namespace, adapter, key) = (namespace.to_string(), adapter.to_string(), key.to_string());
        self.writer
            .write(move |conn| {
                let inserted = conn
                    .prepare_cached(
                        "INSERT OR IGNORE INTO bridge_deliveries (namespace, adapter, idempotency_key, outcome, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                    )?
                    .execute(params![namespace, adapter, key, outcome.to_string(), now])?;
                if inserted == 1 {
                    return Ok(None);
                }
                let doc: String = conn
                    .prepare_cached("SELECT outcome FROM bridge_deliveries WHERE namespace = ?1 AND adapter = ?2 AND idempotency_key = ?3")?
                    .query_row(params![namespace, adapter, key], |r| r.get(0))?;
                Ok(Some(serde_json::from_str(&doc)?))
            })
            .await
    }

    async fn build_id_rollouts(&self, namespace: &str, queue: &str) -> StoreResult<Vec<BuildIdRollout>> {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT build_id, drain_intent, drained_at, updated_at, promoted_at FROM build_id_rollouts
                     WHERE namespace = ?1 AND task_queue = ?2 ORDER BY build_id",
                )?
                .query_map(params![namespace, queue], |r| {
                    let build_id: String = r.get(0)?;
                    Ok(BuildIdRollout {
                        build_id: (!build_id.is_empty()).then_some(build_id),
                        drain_intent: r.get(1)?,
                        drained_at: r.get(2)?,
                        updated_at: r.get(3)?,
                        promoted_at: r.get(4)?,
                    })
                })?
                .collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn set_build_id_drain(
        &self,
        namespace: &str,
        queue: &str,
        build_id: Option<String>,
        draining: bool,
        now: Millis,
    ) -> StoreResult<BuildIdRollout> {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.writer
            .write(move |conn| {
                let key = build_id.clone().unwrap_or_default();
                let intent = if draining { "draining" } else { "active" };
                conn.prepare_cached(
                    "INSERT INTO build_id_rollouts (namespace, task_queue, build_id, drain_intent, drained_at, updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT (namespace, task_queue, build_id) DO UPDATE SET
                       drain_intent = excluded.drain_intent, updated_at = excluded.updated_at,
                       drained_at = CASE WHEN excluded.drain_intent = 'draining'
                                         THEN COALESCE(build_id_rollouts.drained_at, excluded.drained_at) ELSE NULL END",
                )?
                .execute(params![namespace, queue, key, intent, draining.then_some(now), now])?;
                let (drained_at, promoted_at): (Option<i64>, Option<i64>) = conn
                    .prepare_cached(
                        "SELECT drained_at, promoted_at FROM build_id_rollouts WHERE namespace = ?1 AND task_queue = ?2 AND build_id = ?3",
                    )?
                    .query_row(params![namespace, queue, key], |r| Ok((r.get(0)?, r.get(1)?)))?;
                Ok(BuildIdRollout {
                    build_id,
                    drain_intent: intent.into(),
                    drained_at,
                    updated_at: now,
                    promoted_at,
                })
            })
            .await
    }

    async fn promote_build_id(&self, namespace: &str, queue: &str, build_id: Option<String>, now: Millis) -> StoreResult<BuildIdRollout> {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.writer
            .write(move |conn| {
                let key = build_id.clone().unwrap_or_default();
                conn.prepare_cached("UPDATE build_id_rollouts SET promoted_at = NULL WHERE namespace = ?1 AND task_queue = ?2 AND build_id <> ?3")?
                    .execute(params![namespace, queue, key])?;
                conn.prepare_cached(
                    "INSERT INTO build_id_rollouts (namespace, task_queue, build_id, drain_intent, drained_at, updated_at, promoted_at)
                     VALUES (?1, ?2, ?3, 'active', NULL, ?4, ?4)
                     ON CONFLICT (namespace, task_queue, build_id) DO UPDATE SET updated_at = excluded.updated_at,
                       promoted_at = COALESCE(build_id_rollouts.promoted_at, excluded.promoted_at)",
                )?
                .execute(params![namespace, queue, key, now])?;
                let (intent, drained_at, promoted_at): (String, Option<i64>, Option<i64>) = conn
                    .prepare_cached(
                        "SELECT drain_intent, drained_at, promoted_at FROM build_id_rollouts WHERE namespace = ?1 AND task_queue = ?2 AND build_id = ?3",
                    )?
                    .query_row(params![namespace, queue, key], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
                Ok(BuildIdRollout { build_id, drain_intent: intent, drained_at, updated_at: now, promoted_at })
            })
            .await
    }

    async fn search_attribute_definitions(
        &self,
        namespace: &str,
    ) -> StoreResult<std::collections::BTreeMap<String, capstan_engine::visibility::AttributeType>> {
        let namespace = namespace.to_string();
        self.read(move |conn| {
            let rows: Vec<(String, String)> = conn
                .prepare_cached("SELECT name, kind FROM search_attribute_definitions WHERE namespace = ?1")?
                .query_map(params![namespace], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            Ok(rows
                .into_iter()
                .filter_map(|(name, kind)| capstan_engine::visibility::AttributeType::parse(&kind).map(|k| (name, k)))
                .collect())
        })
        .await
    }

    async fn define_search_attribute(
        &self,
        namespace: &str,
        name: &str,
        kind: capstan_engine::visibility::AttributeType,
        now: Millis,
    ) -> StoreResult<()> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.writer
            .write(move |conn| {
                let inserted = conn
                    .prepare_cached(
                        "INSERT OR IGNORE INTO search_attribute_definitions (namespace, name, kind, created_at) VALUES (?1, ?2, ?3, ?4)",
                    )?
                    .execute(params![namespace, name, kind.as_str(), now])?;
                if inserted == 0 {
                    return Err(search_attribute_exists(&name));
                }
                Ok(())
            })
            .await
    }

    async fn delete_search_attribute(&self, namespace: &str, name: &str) -> StoreResult<bool> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.writer
            .write(move |conn| {
                Ok(conn
                    .prepare_cached("DELETE FROM search_attribute_definitions WHERE namespace = ?1 AND name = ?2")?
                    .execute(params![namespace, name])?
                    > 0)
            })
            .await
    }

    async fn workers(&self, namespace: &str) -> StoreResult<Vec<WorkerRecord>> {
        let namespace = namespace.to_string();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(&format!(
                    "SELECT {WORKER_COLUMNS} FROM workers WHERE namespace = ?1 ORDER BY worker_id"
                ))?
                .query_map(params![namespace], worker_from_row)?
                .collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn task_queue_names(&self, namespace: &str) -> StoreResult<Vec<String>> {
        let namespace = namespace.to_string();
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT queue FROM tasks WHERE namespace = ?1 AND status IN ('ready', 'leased') AND queue <> ?2
                     UNION SELECT task_queue FROM workers WHERE namespace = ?1 ORDER BY 1",
                )?
                .query_map(params![namespace, ATOMIC_QUEUE], |r| r.get(0))?
                .collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn task_queue_snapshot(&self, namespace: &str, queue: &str, lease_limit: usize) -> StoreResult<QueueSnapshot> {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.read(move |conn| {
            let counts = conn
                .prepare_cached(
                    "SELECT kind, status, COUNT(*), MIN(available_at) FROM tasks
                     WHERE namespace = ?1 AND queue = ?2 AND status IN ('ready', 'leased') GROUP BY kind, status",
                )?
                .query_map(params![namespace, queue], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<Result<_, _>>()?;
            let leases = conn
                .prepare_cached(
                    "SELECT t.task_id, t.kind, t.type_name, r.workflow_id, t.run_id, t.lease_owner, t.lease_expires_at
                     FROM tasks t JOIN runs r ON r.run_id = t.run_id
                     WHERE t.namespace = ?1 AND t.queue = ?2 AND t.status = 'leased' ORDER BY t.lease_expires_at LIMIT ?3",
                )?
                .query_map(params![namespace, queue, lease_limit as i64], |r| {
                    Ok(QueueLease {
                        task_id: r.get(0)?,
                        kind: r.get(1)?,
                        type_name: r.get(2)?,
                        workflow_id: r.get(3)?,
                        run_id: r.get(4)?,
                        lease_owner: r.get(5)?,
                        lease_expires_at: r.get(6)?,
                    })
                })?
                .collect::<Result<_, _>>()?;
            let pinned = conn
                .prepare_cached(
                    "SELECT compatibility, COUNT(*) FROM tasks WHERE namespace = ?1 AND queue = ?2 AND status = 'ready'
                       AND kind = 'workflow' AND compatibility IS NOT NULL GROUP BY compatibility",
                )?
                .query_map(params![namespace, queue], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            Ok(QueueSnapshot { counts, leases, pinned })
        })
        .await
    }

    async fn queue_workers(&self, namespace: &str, queue: &str) -> StoreResult<Vec<WorkerRecord>> {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.read(move |conn| {
            Ok(conn
                .prepare_cached(&format!(
                    "SELECT {WORKER_COLUMNS} FROM workers WHERE namespace = ?1 AND task_queue = ?2"
                ))?
                .query_map(params![namespace, queue], worker_from_row)?
                .collect::<Result<_, _>>()?)
        })
        .await
    }

    async fn create_query_task(&self, task: QueryTask) -> StoreResult<()> {
        self.writer.write(move |conn| write_query_task(conn, &task)).await
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
        let (namespace, queue, owner) = (namespace.to_string(), queue.to_string(), owner.to_string());
        self.writer
            .write(move |conn| {
                let docs: Vec<String> = conn
                    .prepare_cached(
                        "SELECT doc FROM query_tasks WHERE namespace = ?1 AND task_queue = ?2 AND kind = ?4 AND deadline_at > ?3
                           AND (status = 'ready' OR (status = 'leased' AND lease_expires_at <= ?3))
                         ORDER BY created_at LIMIT 8",
                    )?
                    .query_map(params![namespace, queue, now, kind.as_str()], |r| r.get(0))?
                    .collect::<Result<_, _>>()?;
                for doc in docs {
                    let mut task: QueryTask = serde_json::from_str(&doc)?;
                    if task.lease(&owner, lease_ms, now).is_ok() {
                        write_query_task(conn, &task)?;
                        return Ok(Some(task));
                    }
                }
                Ok(None)
            })
            .await
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
        let (namespace, id, owner) = (namespace.to_string(), id.to_string(), owner.to_string());
        self.writer
            .write(move |conn| {
                let mut task = read_query_task(conn, &namespace, &id)?
                    .ok_or_else(|| Refusal::new(Reason::QueryTaskNotFound, "Query task not found.").with("query_task_id", id.clone()))?;
                task.answer(&owner, attempt, outcome, now)?;
                write_query_task(conn, &task)?;
                Ok(task)
            })
            .await
    }

    async fn get_query_task(&self, namespace: &str, id: &str) -> StoreResult<Option<QueryTask>> {
        let (namespace, id) = (namespace.to_string(), id.to_string());
        self.read(move |conn| read_query_task(conn, &namespace, &id)).await
    }

    async fn delete_query_task(&self, namespace: &str, id: &str) -> StoreResult<()> {
        let (namespace, id) = (namespace.to_string(), id.to_string());
        self.writer
            .write(move |conn| {
                conn.prepare_cached("DELETE FROM query_tasks WHERE query_task_id = ?1 AND namespace = ?2")?
                    .execute(params![id, namespace])?;
                Ok(())
            })
            .await
    }

    async fn recall_poll(&self, key: PollKey) -> StoreResult<Option<(TaskId, u64)>> {
        self.read(move |conn| {
            Ok(conn
                .query_row(
                    "SELECT task_id, fence FROM poll_requests WHERE namespace = ?1 AND task_queue = ?2 AND worker_id = ?3 AND kind = ?4 AND poll_request_id = ?5",
                    params![key.namespace, key.task_queue, key.worker_id, key.kind.as_str(), key.poll_request_id],
                    |r| Ok((TaskId(r.get(0)?), r.get::<_, i64>(1)? as u64)),
                )
                .optional()?)
        })
        .await
    }
}

fn read_query_task(conn: &Connection, namespace: &str, id: &str) -> StoreResult<Option<QueryTask>> {
    let doc: Option<String> = conn
        .prepare_cached("SELECT doc FROM query_tasks WHERE query_task_id = ?1 AND namespace = ?2")?
        .query_row(params![id, namespace], |r| r.get(0))
        .optional()?;
    Ok(match doc {
        Some(doc) => Some(serde_json::from_str(&doc)?),
        None => None,
    })
}

fn write_query_task(conn: &Connection, task: &QueryTask) -> StoreResult<()> {
    let (status, lease_expires_at) = query_columns(task);
    conn.prepare_cached(
        "INSERT INTO query_tasks (query_task_id, namespace, task_queue, status, lease_expires_at, created_at, deadline_at, doc, kind)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (query_task_id) DO UPDATE SET status = excluded.status, lease_expires_at = excluded.lease_expires_at, doc = excluded.doc",
    )?
    .execute(params![
        task.id,
        task.namespace,
        task.task_queue,
        status,
        lease_expires_at,
        task.created_at,
        task.deadline_at,
        serde_json::to_string(task)?,
        task.kind.as_str()
    ])?;
    Ok(())
}

/// Hash of a command's intent, for `request_id` idempotency.
pub fn intent_hash(parts: &[&str]) -> String {
    hash_text(&parts.join("\u{1f}"))
}

/// An atomic action's view of the SQLite transaction (inside its savepoint).
struct SqliteAtomic<'c>(&'c Connection);

fn sqlite_param(value: &Value) -> rusqlite::types::Value {
    match value {
        Value::Bool(b) => rusqlite::types::Value::Integer(*b as i64),
        Value::Number(n) if n.is_i64() => rusqlite::types::Value::Integer(n.as_i64().unwrap_or_default()),
        Value::Number(n) => rusqlite::types::Value::Real(n.as_f64().unwrap_or_default()),
        other => json_text(other)
            .map(rusqlite::types::Value::Text)
            .unwrap_or(rusqlite::types::Value::Null),
    }
}

impl AtomicTransaction for SqliteAtomic<'_> {
    fn execute(&mut self, sql: &str, params: &[Value]) -> Result<u64, String> {
        self.0
            .execute(sql, rusqlite::params_from_iter(params.iter().map(sqlite_param)))
            .map(|n| n as u64)
            .map_err(|e| e.to_string())
    }

    fn query(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, String> {
        let mut statement = self.0.prepare(sql).map_err(|e| e.to_string())?;
        let columns = statement.column_count();
        let rows = statement
            .query_map(rusqlite::params_from_iter(params.iter().map(sqlite_param)), |row| {
                (0..columns)
                    .map(|i| {
                        Ok(match row.get_ref(i)? {
                            rusqlite::types::ValueRef::Null => Value::Null,
                            rusqlite::types::ValueRef::Integer(n) => Value::from(n),
                            rusqlite::types::ValueRef::Real(x) => Value::from(x),
                            rusqlite::types::ValueRef::Text(t) => Value::from(String::from_utf8_lossy(t).into_owned()),
                            rusqlite::types::ValueRef::Blob(b) => Value::from(String::from_utf8_lossy(b).into_owned()),
                        })
                    })
                    .collect::<rusqlite::Result<Vec<Value>>>()
            })
            .map_err(|e| e.to_string())?;
        rows.collect::<rusqlite::Result<Vec<_>>>().map_err(|e| e.to_string())
    }
}

// ------------------------------------------------------------------------------------------
// Schedules

/// sequence, event id, type, recorded at, workflow id, run id, payload.
type EventRow = (i64, String, String, i64, Option<String>, Option<String>, String);

fn load_schedule(conn: &Connection, namespace: &str, schedule_id: &str) -> StoreResult<Option<Schedule>> {
    let doc: Option<String> = conn
        .prepare_cached("SELECT doc FROM schedules WHERE namespace = ?1 AND schedule_id = ?2 AND status != 'deleted'")?
        .query_row(params![namespace, schedule_id], |r| r.get(0))
        .optional()?;
    Ok(doc.map(|d| serde_json::from_str(&d)).transpose()?)
}

/// Upserts the schedule row and appends the events the change recorded.
fn write_schedule(conn: &Connection, schedule: &mut Schedule) -> StoreResult<()> {
    conn.prepare_cached(
        "INSERT INTO schedules (namespace, schedule_id, status, workflow_type, wake_at, has_buffer, created_at, doc)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (namespace, schedule_id) DO UPDATE SET status = excluded.status, workflow_type = excluded.workflow_type,
           wake_at = excluded.wake_at, has_buffer = excluded.has_buffer, created_at = excluded.created_at, doc = excluded.doc",
    )?
    .execute(params![
        schedule.namespace,
        schedule.schedule_id,
        schedule.status.as_str(),
        schedule.action.workflow_type,
        schedule.wake_at(),
        schedule.has_buffer() as i64,
        schedule.created_at,
        serde_json::to_string(schedule)?
    ])?;
    let mut sequence: i64 = conn
        .prepare_cached("SELECT COALESCE(MAX(sequence), 0) FROM schedule_events WHERE namespace = ?1 AND schedule_id = ?2")?
        .query_row(params![schedule.namespace, schedule.schedule_id], |r| r.get(0))?;
    for event in std::mem::take(&mut schedule.pending_events) {
        sequence += 1;
        conn.prepare_cached(
            "INSERT INTO schedule_events (namespace, schedule_id, sequence, event_id, event_type, recorded_at, workflow_id, run_id, payload)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )?
        .execute(params![
            schedule.namespace,
            schedule.schedule_id,
            sequence,
            crate::new_ulid().to_string().to_lowercase(),
            event.event_type,
            event.recorded_at,
            event.workflow_id,
            event.run_id,
            serde_json::to_string(&event.payload)?
        ])?;
    }
    Ok(())
}
