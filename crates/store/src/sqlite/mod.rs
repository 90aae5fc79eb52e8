//! [`Store`] on an embedded SQLite file: WAL journal, `synchronous=FULL`, one writer thread with
//! group commit (see `writer.rs`) and a small pool of reader connections.

mod schema;
mod tx;
mod writer;

pub(crate) use writer::note_io_failure;

use crate::logic::{
    actions, admin, audit, catalog, claim, credentials, duties, external_payloads, fleet, integrity, ledger_reads, namespaces, queries,
    runs, service_calls, sessions, streams,
};
use crate::rows::*;
use crate::schedules;
use crate::*;
use capstan_engine::schedule::Schedule;
use capstan_engine::workflow_stream::StreamItemInput;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tx::{drive, SqliteTx};
use writer::Writer;

const READERS: usize = 4;
/// Prepared statements kept per connection (the shared logic has a few dozen).
const STATEMENT_CACHE: usize = 256;

#[derive(Clone)]
pub struct SqliteStore {
    writer: Writer,
    /// Committed ready-task announcements, handed to the server once (see `wakeups`).
    wakeups: Arc<Mutex<Option<WakeReceiver>>>,
    readers: Arc<Mutex<Vec<Connection>>>,
    path: PathBuf,
    /// The SQLite VFS the connections go through (`None`: the default one).
    vfs: Option<String>,
    env: Arc<Env>,
}

fn open_connection(path: &Path, vfs: Option<&str>) -> StoreResult<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match vfs {
        None => Connection::open_with_flags(path, flags)?,
        Some(vfs) => Connection::open_with_flags_and_vfs(path, flags, vfs)?,
    };
    // WAL lets readers run beside the writer; FULL makes every COMMIT fsync the WAL, so an
    // acknowledged transition survives power loss, not just a process crash.
    conn.execute_batch(
        "PRAGMA journal_mode = WAL;
         PRAGMA synchronous = FULL;
         PRAGMA foreign_keys = ON;
         PRAGMA busy_timeout = 10000;",
    )?;
    // Every statement goes through the cache; the default 16 would evict the hot ones.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

impl SqliteStore {
    /// A change that found a broken ledger chain, or a run document it cannot read, was not
    /// written: open an incident, block the run, and answer as refused.
    async fn guard<T>(&self, result: StoreResult<T>) -> StoreResult<T> {
        match result {
            Err(error) => Err(self.settle(error).await),
            ok => ok,
        }
    }

    /// Like [`guard`](Self::guard) for a claim: the poller just gets nothing (the run's tasks
    /// are blocked, so the next claim passes it by).
    async fn guard_claim(&self, result: StoreResult<Option<(Task, RunState)>>) -> StoreResult<Option<(Task, RunState)>> {
        match result {
            Err(error @ (StoreError::Integrity(_) | StoreError::CorruptRun(_))) => match self.settle(error).await {
                StoreError::Refused(_) => Ok(None),
                other => Err(other),
            },
            other => other,
        }
    }

    /// Turns a breach or an unreadable run into an open incident and the refusal it answers.
    async fn settle(&self, error: StoreError) -> StoreError {
        let recorded = match error {
            StoreError::Integrity(breach) => self.record_breach(breach).await,
            StoreError::CorruptRun(breach) => {
                let env = self.env.clone();
                self.writer
                    .write_tx(move |tx| drive(integrity::record_unreadable_run(tx, &breach, env.now_ms(), &env)))
                    .await
            }
            other => return other,
        };
        match recorded {
            Ok(refusal) => refusal.into(),
            Err(error) => error,
        }
    }

    async fn record_breach(&self, breach: IntegrityBreach) -> StoreResult<Refusal> {
        let env = self.env.clone();
        self.writer
            .write_tx(move |tx| drive(integrity::record_breach(tx, &breach, env.now_ms(), &env)))
            .await
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

    /// Opens (creating if needed) the database file, migrates it and bootstraps `default`.
    pub fn open(path: &Path, limits: Limits, now: Millis) -> StoreResult<Self> {
        Self::open_with_vfs(path, None, limits, now)
    }

    /// [`open`](Self::open) through a registered SQLite VFS (the simulator's power-cut shim).
    pub fn open_with_vfs(path: &Path, vfs: Option<&str>, limits: Limits, now: Millis) -> StoreResult<Self> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|e| StoreError::Storage(format!("create {}: {e}", dir.display())))?;
            }
        }
        let mut conn = open_connection(path, vfs)?;
        schema::migrate(&mut conn, now)?;
        let readers = (0..READERS).map(|_| open_connection(path, vfs)).collect::<StoreResult<Vec<_>>>()?;
        let (wake, wakeups) = tokio::sync::mpsc::unbounded_channel();
        let env = Env::new(limits);
        Ok(Self {
            writer: Writer::start(conn, wake, env.observer.clone()),
            wakeups: Arc::new(Mutex::new(Some(wakeups))),
            readers: Arc::new(Mutex::new(readers)),
            path: path.to_path_buf(),
            vfs: vfs.map(str::to_string),
            env: Arc::new(env),
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
        self.read_tx(move |tx| f(tx.connection())).await
    }

    /// Like [`read`](Self::read), with the shared logic's [`SqliteTx`] on the reader.
    async fn read_tx<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut SqliteTx<'_>) -> StoreResult<T> + Send + 'static,
    {
        let pooled = self.readers.lock().expect("reader pool").pop();
        let mut conn = match pooled {
            Some(conn) => conn,
            None => open_connection(&self.path, self.vfs.as_deref())?,
        };
        let result = f(&mut SqliteTx::reader(&mut conn));
        let mut pool = self.readers.lock().expect("reader pool");
        if pool.len() < READERS {
            pool.push(conn);
        }
        result
    }
}

// ------------------------------------------------------------------------------------------
// Row <-> engine conversions

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

fn hash_text(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

impl RunStore for SqliteStore {
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

    async fn start_workflow(&self, start: StartRun, policy: DuplicatePolicy, now: Millis) -> StoreResult<(StartOutcome, RunState)> {
        let env = self.env.clone();
        let result = self
            .writer
            .write_tx(move |tx| drive(runs::start_workflow(tx, start, policy, now, &env)))
            .await;
        self.guard(result).await
    }

    async fn start_standalone_activity(&self, start: StartStandaloneActivity, now: Millis) -> StoreResult<RunState> {
        let env = self.env.clone();
        let result = self
            .writer
            .write_tx(move |tx| drive(runs::start_standalone_activity(tx, start, now, &env)))
            .await;
        self.guard(result).await
    }

    async fn mutate_run<T, F>(&self, namespace: &str, locator: RunLocator, now: Millis, transition: F) -> StoreResult<(T, RunState)>
    where
        T: Send + 'static,
        F: FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal> + Send + 'static,
    {
        let namespace = namespace.to_string();
        let env = self.env.clone();
        let result = self
            .writer
            .write_tx(move |tx| drive(runs::mutate(tx, &namespace, &locator, now, &env, transition)))
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
        let env = self.env.clone();
        let result = self
            .writer
            .write_tx(move |tx| {
                drive(runs::mutate_keyed(
                    tx,
                    runs::KeyedCommand {
                        namespace: &namespace,
                        locator: &locator,
                        key: &key,
                    },
                    now,
                    &env,
                    transition,
                    render,
                ))
            })
            .await;
        self.guard(result).await
    }

    async fn runs_page(&self, after: Option<RunId>, limit: usize) -> StoreResult<Vec<(String, WorkflowId, RunId)>> {
        let after = after.map(|r| r.as_str().to_string()).unwrap_or_default();
        self.read_tx(move |tx| drive(ledger_reads::runs_page(tx, &after, limit))).await
    }

    async fn retained_command(
        &self,
        namespace: &str,
        workflow_id: &WorkflowId,
        command_type: &str,
        request_id: &str,
    ) -> StoreResult<Option<(String, Value)>> {
        let (namespace, workflow_id) = (namespace.to_string(), workflow_id.clone());
        let (command_type, request_id) = (command_type.to_string(), request_id.to_string());
        self.read_tx(move |tx| {
            drive(ledger_reads::retained_command(
                tx,
                &namespace,
                &workflow_id,
                &command_type,
                &request_id,
            ))
        })
        .await
    }

    async fn load_run(&self, namespace: &str, locator: RunLocator) -> StoreResult<Option<RunState>> {
        let namespace = namespace.to_string();
        let result = self.read_tx(move |tx| drive(runs::load_run(tx, &namespace, &locator))).await;
        self.guard(result).await
    }

    async fn record_audit(&self, event: AuditEvent) -> StoreResult<()> {
        self.writer.write_tx(move |tx| drive(audit::record_audit(tx, &event))).await
    }

    async fn audit_events(
        &self,
        namespace: &str,
        workflow_id: &str,
        before: Option<(Millis, String)>,
        limit: usize,
    ) -> StoreResult<Vec<AuditEvent>> {
        let (namespace, workflow_id) = (namespace.to_string(), workflow_id.to_string());
        self.read_tx(move |tx| drive(audit::audit_events(tx, &namespace, &workflow_id, before, limit)))
            .await
    }

    async fn history(&self, run_id: &RunId, after: u64, upto: u64, limit: usize) -> StoreResult<Vec<HistoryEvent>> {
        let run_id = run_id.clone();
        self.read_tx(move |tx| drive(runs::history(tx, &run_id, after, upto, limit))).await
    }

    async fn stored_history(&self, run_id: &RunId, after: u64, upto: u64, limit: usize) -> StoreResult<Vec<StoredEvent>> {
        let run_id = run_id.clone();
        self.read_tx(move |tx| drive(runs::stored_history(tx, &run_id, after, upto, limit)))
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
        self.read_tx(move |tx| drive(runs::runs_of(tx, &namespace, &workflow_id))).await
    }
}

impl TaskStore for SqliteStore {
    async fn leased_tasks(&self, namespace: &str, owner: &str, kind: TaskKind) -> StoreResult<Vec<TaskId>> {
        let (namespace, owner) = (namespace.to_string(), owner.to_string());
        self.read_tx(move |tx| drive(fleet::leased_tasks(tx, &namespace, &owner, kind)))
            .await
    }

    async fn has_ready_task(&self, namespace: &str, kind: TaskKind, queue: &str, types: &[String], now: Millis) -> StoreResult<Readiness> {
        let (namespace, queue, types) = (namespace.to_string(), queue.to_string(), types.to_vec());
        self.read(move |conn| {
            const READY: &str =
                "SELECT 1 FROM tasks WHERE namespace = ?1 AND kind = ?2 AND queue = ?3 AND status = 'ready' AND available_at <= ?4";
            let sql = format!("SELECT EXISTS({READY}), EXISTS({READY}{})", type_filter(&types, 5));
            let mut values: Vec<rusqlite::types::Value> =
                vec![namespace.into(), kind.as_str().to_string().into(), queue.into(), now.into()];
            values.extend(types.into_iter().map(rusqlite::types::Value::from));
            let (any, matching) = conn
                .prepare_cached(&sql)?
                .query_row(rusqlite::params_from_iter(values), |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(Readiness { any, matching })
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
        let env = self.env.clone();
        let result = self.writer
            .write_tx(move |tx| {
                let conn = tx.connection();
                // A pinned run's workflow tasks go only to workers of its build.
                let owner_param = 5 + types.len();
                let sql = format!(
                    "SELECT task_id, run_id FROM tasks WHERE namespace = ?1 AND kind = ?2 AND queue = ?3 AND status = 'ready' AND available_at <= ?4{}
                       AND (compatibility IS NULL OR compatibility = (SELECT build_id FROM workers WHERE namespace = ?1 AND worker_id = ?{owner_param}))
                       AND {} AND {}
                     ORDER BY available_at, task_id LIMIT 8",
                    type_filter(&types, 5),
                    sticky_free("tasks", &format!("?{owner_param}"), "?4"),
                    session_free("tasks", &format!("?{owner_param}"), "?4"),
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
                    match drive(claim::lease_candidate(tx, run, TaskId(task_id), &poller, now, &env))? {
                        claim::Claimed::Leased(leased) => return Ok(Some(*leased)),
                        claim::Claimed::Refused | claim::Claimed::Stale | claim::Claimed::Skipped => continue,
                    }
                }
                Ok(None)
            })
            .await;
        self.guard_claim(result).await
    }

    async fn wakeups(&self) -> StoreResult<Option<WakeReceiver>> {
        // Includes tasks made ready in other runs by follow-on transitions (child starts…).
        Ok(self.wakeups.lock().expect("wakeups").take())
    }

    async fn create_query_task(&self, task: QueryTask) -> StoreResult<()> {
        self.writer.write_tx(move |tx| drive(queries::create_query_task(tx, &task))).await
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
            .write_tx(move |tx| drive(queries::claim_query_task(tx, &namespace, &queue, kind, &owner, lease_ms, now)))
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
            .write_tx(move |tx| drive(queries::answer_query_task(tx, &namespace, &id, &owner, attempt, outcome, now)))
            .await
    }

    async fn get_query_task(&self, namespace: &str, id: &str) -> StoreResult<Option<QueryTask>> {
        let (namespace, id) = (namespace.to_string(), id.to_string());
        self.read_tx(move |tx| drive(queries::get_query_task(tx, &namespace, &id))).await
    }

    async fn delete_query_task(&self, namespace: &str, id: &str) -> StoreResult<()> {
        let (namespace, id) = (namespace.to_string(), id.to_string());
        self.writer
            .write_tx(move |tx| drive(queries::delete_query_task(tx, &namespace, &id)))
            .await
    }

    async fn recall_poll(&self, key: PollKey) -> StoreResult<Option<(TaskId, u64)>> {
        self.read_tx(move |tx| drive(queries::recall_poll(tx, &key))).await
    }
}

impl DutyStore for SqliteStore {
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
        let env = self.env.clone();
        let result = self
            .writer
            .write_tx(move |tx| drive(runs::run_duty(tx, &due, now, &env, transition)))
            .await;
        self.guard(result).await
    }

    async fn next_deadline(&self) -> StoreResult<Option<Millis>> {
        self.read_tx(|tx| drive(duties::next_deadline(tx))).await
    }

    async fn prune(&self, older_than: Millis) -> StoreResult<()> {
        self.writer.write_tx(move |tx| drive(duties::prune(tx, older_than))).await
    }

    async fn expired_instances(&self, namespace: &str, cutoff: Millis, limit: usize) -> StoreResult<Vec<(String, String, Millis)>> {
        let namespace = namespace.to_string();
        self.read_tx(move |tx| drive(duties::expired_instances(tx, &namespace, cutoff, limit)))
            .await
    }

    async fn prune_instances(&self, namespace: &str, workflow_ids: Vec<String>, cutoff: Millis) -> StoreResult<usize> {
        let namespace = namespace.to_string();
        self.writer
            .write_tx(move |tx| drive(duties::prune_instances(tx, &namespace, &workflow_ids, cutoff)))
            .await
    }
}

impl FleetStore for SqliteStore {
    async fn register_worker(&self, worker: WorkerRecord) -> StoreResult<WorkerRecord> {
        self.writer.write_tx(move |tx| drive(fleet::register_worker(tx, worker))).await
    }

    async fn heartbeat_worker(&self, namespace: &str, worker_id: &str, now: Millis) -> StoreResult<Option<WorkerRecord>> {
        let (namespace, worker_id) = (namespace.to_string(), worker_id.to_string());
        self.writer
            .write_tx(move |tx| drive(fleet::heartbeat_worker(tx, &namespace, &worker_id, now)))
            .await
    }

    async fn get_worker(&self, namespace: &str, worker_id: &str) -> StoreResult<Option<WorkerRecord>> {
        let (namespace, worker_id) = (namespace.to_string(), worker_id.to_string());
        self.read_tx(move |tx| drive(fleet::get_worker(tx, &namespace, &worker_id))).await
    }

    async fn session_step(
        &self,
        namespace: &str,
        session_id: &str,
        worker_id: &str,
        step: SessionStep,
        now: Millis,
    ) -> StoreResult<SessionAnswer> {
        let (namespace, session_id, worker_id) = (namespace.to_string(), session_id.to_string(), worker_id.to_string());
        self.writer
            .write_tx(move |tx| drive(sessions::session_step(tx, &namespace, &session_id, &worker_id, step, now)))
            .await
    }

    async fn deregister_fenced(&self, namespace: &str, worker_id: &str, token: &str, now: Millis) -> StoreResult<(Value, bool)> {
        let (namespace, worker_id, token) = (namespace.to_string(), worker_id.to_string(), token.to_string());
        self.writer
            .write_tx(move |tx| drive(fleet::deregister_fenced(tx, &namespace, &worker_id, &token, now)))
            .await
    }

    async fn get_session(&self, namespace: &str, session_id: &str) -> StoreResult<Option<WorkerSession>> {
        let (namespace, session_id) = (namespace.to_string(), session_id.to_string());
        self.read_tx(move |tx| drive(sessions::get_session(tx, &namespace, &session_id)))
            .await
    }

    async fn deregister_worker(&self, namespace: &str, worker_id: &str) -> StoreResult<bool> {
        let (namespace, worker_id) = (namespace.to_string(), worker_id.to_string());
        self.writer
            .write_tx(move |tx| drive(fleet::deregister_worker(tx, &namespace, &worker_id)))
            .await
    }

    async fn build_id_rollouts(&self, namespace: &str, queue: &str) -> StoreResult<Vec<BuildIdRollout>> {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.read_tx(move |tx| drive(admin::build_id_rollouts(tx, &namespace, &queue)))
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
            .write_tx(move |tx| drive(admin::set_build_id_drain(tx, &namespace, &queue, build_id, draining, now)))
            .await
    }

    async fn promote_build_id(&self, namespace: &str, queue: &str, build_id: Option<String>, now: Millis) -> StoreResult<BuildIdRollout> {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.writer
            .write_tx(move |tx| drive(admin::promote_build_id(tx, &namespace, &queue, build_id, now)))
            .await
    }

    async fn workers(&self, namespace: &str) -> StoreResult<Vec<WorkerRecord>> {
        let namespace = namespace.to_string();
        self.read_tx(move |tx| drive(fleet::workers(tx, &namespace))).await
    }

    async fn task_queue_names(&self, namespace: &str) -> StoreResult<Vec<String>> {
        let namespace = namespace.to_string();
        self.read_tx(move |tx| drive(fleet::task_queue_names(tx, &namespace))).await
    }

    async fn task_queue_snapshot(&self, namespace: &str, queue: &str, lease_limit: usize) -> StoreResult<QueueSnapshot> {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.read_tx(move |tx| drive(fleet::task_queue_snapshot(tx, &namespace, &queue, lease_limit)))
            .await
    }

    async fn queue_workers(&self, namespace: &str, queue: &str) -> StoreResult<Vec<WorkerRecord>> {
        let (namespace, queue) = (namespace.to_string(), queue.to_string());
        self.read_tx(move |tx| drive(fleet::queue_workers(tx, &namespace, &queue))).await
    }
}

impl LedgerStore for SqliteStore {
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
                drive(actions::put_action_definition(
                    tx,
                    &namespace,
                    &activity_type,
                    recovery_mode,
                    document,
                    now,
                ))
            })
            .await
    }

    async fn action_definitions(&self, namespace: &str) -> StoreResult<Vec<ActionDefinition>> {
        let namespace = namespace.to_string();
        self.read_tx(move |tx| drive(ledger_reads::action_definitions(tx, &namespace)))
            .await
    }

    async fn ledger_entries(&self, namespace: &str, filter: LedgerFilter, limit: usize) -> StoreResult<Vec<LedgerEntry>> {
        let namespace = namespace.to_string();
        self.read_tx(move |tx| drive(ledger_reads::ledger_entries(tx, &namespace, &filter, limit)))
            .await
    }

    async fn ledger_entry(&self, namespace: &str, ledger_key: &str) -> StoreResult<Option<LedgerEntry>> {
        let (namespace, key) = (namespace.to_string(), ledger_key.to_string());
        self.read_tx(move |tx| drive(ledger_reads::ledger_entry(tx, &namespace, &key)))
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
        let env = self.env.clone();
        // Only types this process has a handler for: another node may hold the others.
        let types = serde_json::to_string(&actions.0.keys().collect::<Vec<_>>())?;
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
                let run =
                    drive(runs::lock_run(tx, &run_id, false))?.ok_or_else(|| StoreError::Storage(format!("run {run_id} is missing")))?;
                let step = match drive(actions::lease_atomic(tx, run, TaskId(task_id), &actions, codec, now, &env))? {
                    actions::AtomicLease::Nothing => return Ok(None),
                    actions::AtomicLease::Refused(outcome) => return Ok(Some(outcome)),
                    actions::AtomicLease::Ready(step) => *step,
                };
                let handled = match &step.handler {
                    Err(message) => Err(message.clone()),
                    Ok((action, arguments)) => {
                        let conn = tx.connection();
                        conn.execute_batch("SAVEPOINT capstan_atomic")?;
                        let handled = actions::handler_result(codec, action.run(&mut SqliteAtomic(conn), arguments));
                        let end = if handled.is_ok() {
                            "RELEASE capstan_atomic"
                        } else {
                            "ROLLBACK TO capstan_atomic; RELEASE capstan_atomic"
                        };
                        conn.execute_batch(end)?;
                        handled
                    }
                };
                drive(actions::finish_atomic_step(tx, step, handled, codec, now, &env)).map(Some)
            })
            .await;
        self.guard(result).await
    }

    async fn ledger_stats(&self) -> StoreResult<LedgerStats> {
        self.read_tx(|tx| drive(ledger_reads::ledger_stats(tx))).await
    }

    async fn integrity_incidents(&self, namespace: &str, state: Option<String>) -> StoreResult<Vec<IntegrityIncident>> {
        let namespace = namespace.to_string();
        self.read_tx(move |tx| drive(ledger_reads::integrity_incidents(tx, &namespace, state.as_deref())))
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
        let env = self.env.clone();
        self.writer
            .write_tx(move |tx| drive(integrity::close_incident(tx, &namespace, &incident_id, note, now, &env)))
            .await
    }

    async fn ledger_instances(&self) -> StoreResult<Vec<(String, WorkflowId)>> {
        self.read_tx(|tx| drive(ledger_reads::ledger_instances(tx))).await
    }
}

impl ScheduleStore for SqliteStore {
    async fn create_schedule(&self, schedule: Schedule) -> StoreResult<()> {
        let env = self.env.clone();
        self.writer
            .write_tx(move |tx| drive(schedules::create_schedule(tx, schedule, &env)))
            .await
    }

    async fn schedule(&self, namespace: &str, schedule_id: &str) -> StoreResult<Option<Schedule>> {
        let (namespace, schedule_id) = (namespace.to_string(), schedule_id.to_string());
        self.read_tx(move |tx| drive(schedules::schedule(tx, &namespace, &schedule_id)))
            .await
    }

    async fn list_schedules(&self, namespace: &str, filter: ScheduleFilter) -> StoreResult<Vec<Schedule>> {
        let namespace = namespace.to_string();
        self.read_tx(move |tx| drive(schedules::list_schedules(tx, &namespace, &filter)))
            .await
    }

    async fn change_schedule<T: Send + 'static>(
        &self,
        namespace: &str,
        schedule_id: &str,
        change: impl FnOnce(&mut Schedule) -> Result<T, Refusal> + Send + 'static,
    ) -> StoreResult<T> {
        let (namespace, schedule_id) = (namespace.to_string(), schedule_id.to_string());
        let env = self.env.clone();
        self.writer
            .write_tx(move |tx| drive(schedules::change_schedule(tx, &namespace, &schedule_id, change, &env)))
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
        let env = self.env.clone();
        self.writer
            .write_tx(move |tx| {
                drive(schedules::fire_schedule(
                    tx,
                    &namespace,
                    &schedule_id,
                    &fire,
                    &empty_input,
                    now,
                    &env,
                ))
            })
            .await
    }

    async fn due_schedules(&self, now: Millis, limit: usize) -> StoreResult<Vec<(String, String)>> {
        self.read_tx(move |tx| drive(schedules::due_schedules(tx, now, limit))).await
    }

    async fn next_schedule_wake(&self) -> StoreResult<Option<Millis>> {
        self.read_tx(|tx| drive(schedules::next_schedule_wake(tx))).await
    }

    async fn schedule_history(
        &self,
        namespace: &str,
        schedule_id: &str,
        after_sequence: i64,
        limit: usize,
    ) -> StoreResult<Option<Vec<ScheduleEventRecord>>> {
        let (namespace, schedule_id) = (namespace.to_string(), schedule_id.to_string());
        self.read_tx(move |tx| drive(schedules::schedule_history(tx, &namespace, &schedule_id, after_sequence, limit)))
            .await
    }
}

impl CatalogStore for SqliteStore {
    async fn create_catalog_entry(&self, entry: CatalogEntry) -> StoreResult<CatalogEntry> {
        self.writer.write_tx(move |tx| drive(catalog::create(tx, entry))).await
    }

    async fn update_catalog_entry(&self, key: CatalogKey, doc: Map<String, Value>, now: Millis) -> StoreResult<CatalogEntry> {
        self.writer.write_tx(move |tx| drive(catalog::update(tx, &key, doc, now))).await
    }

    async fn catalog_entry(&self, key: CatalogKey) -> StoreResult<Option<CatalogEntry>> {
        self.read_tx(move |tx| drive(catalog::find(tx, &key))).await
    }

    async fn catalog_children(&self, namespace: &str, parent: Option<CatalogKey>) -> StoreResult<Vec<CatalogEntry>> {
        let namespace = namespace.to_string();
        self.read_tx(move |tx| drive(catalog::children(tx, &namespace, parent.as_ref())))
            .await
    }

    async fn delete_catalog_entry(&self, key: CatalogKey) -> StoreResult<CatalogEntry> {
        self.writer.write_tx(move |tx| drive(catalog::delete(tx, &key))).await
    }

    async fn admit_service_calls<T, F>(&self, now: Millis, admit: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Cx) -> T + Send + 'static,
    {
        let env = self.env.clone();
        self.writer
            .write_tx(move |tx| drive(service_calls::admit_direct(tx, now, &env, admit)))
            .await
    }

    async fn cancel_service_call(
        &self,
        service_call_id: &str,
        reason: Option<String>,
        now: Millis,
        propagate: bool,
    ) -> StoreResult<ServiceCallRecord> {
        let (id, env) = (service_call_id.to_string(), self.env.clone());
        self.writer
            .write_tx(move |tx| drive(service_calls::cancel(tx, &id, reason, now, propagate, &env)))
            .await
    }

    async fn service_call(&self, service_call_id: &str) -> StoreResult<Option<ServiceCallRecord>> {
        let id = service_call_id.to_string();
        self.read_tx(move |tx| drive(service_calls::find(tx, &id))).await
    }

    async fn service_call_by_key(&self, route: RouteKey, idempotency_key: &str) -> StoreResult<Option<ServiceCallRecord>> {
        let key = idempotency_key.to_string();
        self.read_tx(move |tx| drive(service_calls::find_by_key(tx, &route, &key))).await
    }

    async fn service_calls_of_caller(
        &self,
        caller_namespace: &str,
        workflow_id: &str,
        run_id: Option<&str>,
        limit: usize,
    ) -> StoreResult<Vec<ServiceCallRecord>> {
        let (namespace, workflow_id, run_id) = (caller_namespace.to_string(), workflow_id.to_string(), run_id.map(str::to_string));
        self.read_tx(move |tx| drive(service_calls::of_caller(tx, &namespace, &workflow_id, run_id.as_deref(), limit)))
            .await
    }
}

impl PayloadStore for SqliteStore {
    async fn record_external_payload(&self, record: ExternalPayloadRecord) -> StoreResult<()> {
        self.writer.write_tx(move |tx| drive(external_payloads::insert(tx, &record))).await
    }

    async fn external_payload(&self, namespace: &str, reference_id: &str) -> StoreResult<Option<ExternalPayloadRecord>> {
        let (namespace, reference_id) = (namespace.to_string(), reference_id.to_string());
        self.read_tx(move |tx| drive(external_payloads::find(tx, &namespace, &reference_id)))
            .await
    }

    async fn unused_external_payloads(&self, created_before: Millis, limit: i64) -> StoreResult<Vec<ExternalPayloadRecord>> {
        self.read_tx(move |tx| drive(external_payloads::unused(tx, created_before, limit)))
            .await
    }

    async fn forget_unused_external_payload(&self, namespace: &str, reference_id: &str) -> StoreResult<bool> {
        let (namespace, reference_id) = (namespace.to_string(), reference_id.to_string());
        self.writer
            .write_tx(move |tx| drive(external_payloads::forget_unused(tx, &namespace, &reference_id)))
            .await
    }

    async fn set_namespace_external_storage(
        &self,
        name: &str,
        policy: Option<ExternalStoragePolicy>,
        now: Millis,
    ) -> StoreResult<NamespaceRecord> {
        let name = name.to_string();
        self.writer
            .write_tx(move |tx| drive(namespaces::set_external_storage(tx, &name, policy, now)))
            .await
    }
}

impl StreamStore for SqliteStore {
    async fn append_stream_items(
        &self,
        target: StreamTarget,
        items: Vec<StreamItemInput>,
        max_pending_items: Option<u64>,
        now: Millis,
    ) -> StoreResult<StreamAppend> {
        self.writer
            .write_tx(move |tx| drive(streams::client_append(tx, &target, &items, max_pending_items, now)))
            .await
    }

    async fn finish_stream(
        &self,
        target: StreamTarget,
        error_reason: Option<String>,
        retention_seconds: Option<i64>,
        now: Millis,
    ) -> StoreResult<StreamState> {
        self.writer
            .write_tx(move |tx| drive(streams::client_finish(tx, &target, error_reason.as_deref(), retention_seconds, now)))
            .await
    }

    async fn list_streams(&self, namespace: &str, workflow_id: &str, run_id: &str) -> StoreResult<Vec<StreamState>> {
        let (namespace, workflow_id, run_id) = (namespace.to_string(), workflow_id.to_string(), run_id.to_string());
        self.read_tx(move |tx| drive(streams::list(tx, &namespace, &workflow_id, &run_id)))
            .await
    }

    async fn read_stream(&self, target: StreamTarget, from: u64, max: u64) -> StoreResult<(StreamState, Vec<StoredStreamItem>)> {
        self.read_tx(move |tx| drive(streams::read(tx, &target, from, max))).await
    }

    async fn stream_caught_up(&self, target: StreamTarget, next_offset: u64) -> StoreResult<()> {
        self.writer
            .write_tx(move |tx| drive(streams::caught_up(tx, &target, next_offset)))
            .await
    }

    async fn expire_streams(&self, now: Millis) -> StoreResult<u64> {
        self.writer.write_tx(move |tx| drive(streams::expire(tx, now))).await
    }
}

impl AdminStore for SqliteStore {
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
        self.read_tx(move |tx| drive(namespaces::namespace_exists(tx, &namespace))).await
    }

    async fn namespaces(&self) -> StoreResult<Vec<NamespaceRecord>> {
        self.read_tx(|tx| drive(namespaces::namespaces(tx))).await
    }

    async fn create_namespace(&self, record: NamespaceRecord) -> StoreResult<NamespaceRecord> {
        self.writer
            .write_tx(move |tx| drive(namespaces::create_namespace(tx, record)))
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
            .write_tx(move |tx| drive(namespaces::update_namespace(tx, &name, description, retention_days, now)))
            .await
    }

    async fn delete_namespace(&self, name: &str) -> StoreResult<NamespaceRecord> {
        let name = name.to_string();
        self.writer.write_tx(move |tx| drive(namespaces::delete_namespace(tx, &name))).await
    }

    async fn queue_loads(&self, now: Millis, limit: usize) -> StoreResult<Vec<QueueLoad>> {
        self.read_tx(move |tx| drive(duties::queue_loads(tx, now, limit))).await
    }

    fn pool_use(&self) -> PoolUse {
        let idle = self.readers.lock().map_or(0, |pool| pool.len());
        // A read that finds no pooled reader opens one of its own for the moment.
        PoolUse {
            max: READERS,
            open: READERS.max(idle),
            idle,
            waiting: 0,
        }
    }

    async fn system_counts(&self, namespace: &str, now: Millis) -> StoreResult<SystemCounts> {
        let namespace = namespace.to_string();
        self.read_tx(move |tx| drive(duties::system_counts(tx, &namespace, now))).await
    }

    async fn bridge_delivery(&self, namespace: &str, adapter: &str, key: &str) -> StoreResult<Option<Value>> {
        let (namespace, adapter, key) = (namespace.to_string(), adapter.to_string(), key.to_string());
        self.read_tx(move |tx| drive(admin::bridge_delivery(tx, &namespace, &adapter, &key)))
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
            .write_tx(move |tx| drive(admin::record_bridge_delivery(tx, &namespace, &adapter, &key, &outcome, now)))
            .await
    }

    async fn search_attribute_definitions(
        &self,
        namespace: &str,
    ) -> StoreResult<std::collections::BTreeMap<String, capstan_engine::visibility::AttributeType>> {
        let namespace = namespace.to_string();
        self.read_tx(move |tx| drive(admin::search_attribute_definitions(tx, &namespace)))
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
            .write_tx(move |tx| drive(admin::define_search_attribute(tx, &namespace, &name, kind, now)))
            .await
    }

    async fn delete_search_attribute(&self, namespace: &str, name: &str) -> StoreResult<bool> {
        let (namespace, name) = (namespace.to_string(), name.to_string());
        self.writer
            .write_tx(move |tx| drive(admin::delete_search_attribute(tx, &namespace, &name)))
            .await
    }

    async fn credentials(&self) -> StoreResult<Vec<CredentialRecord>> {
        self.read_tx(move |tx| drive(credentials::credentials(tx))).await
    }

    async fn create_credential(&self, record: CredentialRecord) -> StoreResult<CredentialRecord> {
        self.writer
            .write_tx(move |tx| drive(credentials::create_credential(tx, record)))
            .await
    }

    async fn change_credential(
        &self,
        principal: &str,
        change: CredentialChange,
        by: Option<capstan_engine::Principal>,
        now: Millis,
    ) -> StoreResult<CredentialRecord> {
        let principal = principal.to_string();
        self.writer
            .write_tx(move |tx| drive(credentials::change_credential(tx, &principal, change, by, now)))
            .await
    }

    async fn delete_credential(
        &self,
        principal: &str,
        by: Option<capstan_engine::Principal>,
        now: Millis,
    ) -> StoreResult<CredentialRecord> {
        let principal = principal.to_string();
        self.writer
            .write_tx(move |tx| drive(credentials::delete_credential(tx, &principal, by, now)))
            .await
    }

    async fn credential_events(&self, principal: Option<&str>, before: Option<i64>, limit: usize) -> StoreResult<Vec<CredentialEvent>> {
        let principal = principal.map(str::to_string);
        self.read_tx(move |tx| drive(credentials::credential_events(tx, principal.as_deref(), before, limit)))
            .await
    }
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
