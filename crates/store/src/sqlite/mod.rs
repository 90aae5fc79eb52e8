//! [`Store`] on an embedded SQLite file: WAL journal, `synchronous=FULL`, one writer thread with
//! group commit (see `writer.rs`) and a small pool of reader connections.

mod replication;
mod schema;
mod tx;
mod writer;

pub use replication::Replication;
pub(crate) use writer::note_io_failure;
pub use writer::WritesPaused;

use crate::backend::{Backend, Claim, Unit};
use crate::logic::{actions, claim, flow, locate};
use crate::*;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde_json::Value;
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
            writer: Writer::start(conn, wake, env.observer.clone(), env.write_delay.clone()),
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

    /// Fault injection for tests: writes read as standing in line for `standing` now (see
    /// `crate::pressure::WriteDelay::inject`).
    pub fn inject_write_delay(&self, standing: std::time::Duration) {
        self.env.write_delay.inject(standing);
    }

    /// Takes a pooled reader connection (or opens one when all are lent) and gives it back.
    fn with_reader<T>(&self, f: impl FnOnce(&mut Connection) -> StoreResult<T>) -> StoreResult<T> {
        let pooled = self.readers.lock().expect("reader pool").pop();
        let mut conn = match pooled {
            Some(conn) => conn,
            None => open_connection(&self.path, self.vfs.as_deref())?,
        };
        let result = f(&mut conn);
        let mut pool = self.readers.lock().expect("reader pool");
        if pool.len() < READERS {
            pool.push(conn);
        }
        result
    }
}

impl Backend for SqliteStore {
    type Tx<'t> = SqliteTx<'t>;

    fn env(&self) -> &Arc<Env> {
        &self.env
    }

    fn env_mut(&mut self) -> &mut Arc<Env> {
        &mut self.env
    }

    /// Inline on a pooled reader: SQLite point reads take microseconds, far less than a
    /// hand-off to a blocking thread would.
    async fn read<T, F>(&self, unit: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut SqliteTx<'t>) -> Unit<'t, T> + Send + 'static,
    {
        self.with_reader(|conn| drive(unit(&mut SqliteTx::reader(conn))))
    }

    async fn write<T, F>(&self, unit: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut SqliteTx<'t>) -> Unit<'t, T> + Send + 'static,
    {
        self.writer.write_tx(move |tx| drive(unit(tx))).await
    }

    async fn write_one<T, F>(&self, unit: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut SqliteTx<'t>) -> Unit<'t, T> + Send + 'static,
    {
        self.write(unit).await
    }

    /// The candidates in one read, each tried in turn in the same write job: the one writer
    /// means nobody else can take them meanwhile.
    async fn claim(&self, wanted: Claim) -> StoreResult<Option<(Task, RunState)>> {
        let env = self.env.clone();
        self.writer
            .write_tx(move |tx| {
                let admitted = drive(flow::admit(tx, &wanted, &env))?;
                for candidate in drive(claim::candidates(tx, &wanted, &[], admitted.as_ref(), &env))? {
                    let Some(run) = drive(locate::lock_candidate_run(tx, &candidate.run_id, &candidate.task_id, false))? else {
                        continue;
                    };
                    let claimed = drive(claim::lease_candidate(tx, run, &candidate, &wanted, admitted.as_ref(), &env))?;
                    if let claim::Claimed::Leased(leased) = claimed {
                        return Ok(Some(*leased));
                    }
                }
                Ok(None)
            })
            .await
    }

    async fn run_atomic(
        &self,
        namespace: String,
        actions: AtomicActions,
        codec: &'static dyn MemoCodec,
        now: Millis,
    ) -> StoreResult<Option<AtomicOutcome>> {
        let env = self.env.clone();
        // Only types this process has a handler for: another node may hold the others.
        let types = serde_json::to_string(&actions.0.keys().collect::<Vec<_>>())?;
        self.writer
            .write_tx(move |tx| {
                let candidate: Option<(String, String)> = tx
                    .connection()
                    .prepare_cached(
                        "SELECT task_id, run_id FROM tasks WHERE namespace = ?1 AND kind = 'activity' AND queue = ?2
                           AND status = 'ready' AND available_at <= ?3 AND type_name IN (SELECT value FROM json_each(?4))
                         ORDER BY priority, available_at, task_id LIMIT 1",
                    )?
                    .query_row(params![namespace, ATOMIC_QUEUE, now, types], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()?;
                let Some((task_id, run_id)) = candidate else { return Ok(None) };
                let run =
                    drive(locate::lock_run(tx, &run_id, false))?.ok_or_else(|| StoreError::Storage(format!("run {run_id} is missing")))?;
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
            .await
    }

    async fn take_wakeups(&self) -> StoreResult<Option<WakeReceiver>> {
        // Includes tasks made ready in other runs by follow-on transitions (child starts…).
        Ok(self.wakeups.lock().expect("wakeups").take())
    }

    async fn probe(&self) -> StoreResult<()> {
        self.with_reader(|conn| Ok(conn.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)).map(|_| ())?))?;
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

    fn connections(&self) -> PoolUse {
        let idle = self.readers.lock().map_or(0, |pool| pool.len());
        // A read that finds no pooled reader opens one of its own for the moment.
        PoolUse {
            max: READERS,
            open: READERS.max(idle),
            idle,
            waiting: 0,
        }
    }
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
