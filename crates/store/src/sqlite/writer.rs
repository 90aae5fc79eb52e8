//! The single SQLite writer with group commit.
//!
//! SQLite allows one writer at a time, so every write goes through one thread. The thread takes
//! whatever jobs are queued (up to `BATCH_MAX`), runs each inside its own SAVEPOINT of one
//! transaction — a job that fails rolls back to its savepoint without touching the others — and
//! COMMITs once. Only after the COMMIT (and its fsync, `synchronous=FULL`) returns does any job
//! in the batch learn its result. Many concurrent transitions therefore share one fsync without
//! any of them being acknowledged before it is durable.
//!
//! The hand-off itself (batching, savepoints, announcements only after COMMIT, each caller
//! answered exactly once, a failed job that cannot be undone taking its batch down) is
//! `capstan_sync::group_commit`, model-checked there under loom; this file is the SQLite side.

use super::tx::{drive, Notice, SqliteTx};
use crate::observe::{Commit, ObserverSlot};
use crate::{StoreError, StoreResult, WakeKey};
use capstan_sync::group_commit::{self, Backend, Ending, Job};
use rusqlite::Connection;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Instant;

thread_local! {
    /// Set when a statement of the current batch failed for a reason of the device (full, IO
    /// error, read-only): the batch may commit what else it did, but the store is failing.
    static IO_FAILED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Notes a device-level SQLite error (on whichever thread saw it; only the writer's counts).
pub fn note_io_failure() {
    IO_FAILED.with(|f| f.set(true));
}

#[derive(Clone)]
pub struct Writer {
    jobs: group_commit::Sender<Job<Sqlite>>,
    health: Arc<Health>,
    gate: Gate,
}

/// Held by the writer thread for each group commit, from BEGIN to COMMIT or ROLLBACK; whoever
/// else holds it (the replica, while it copies the WAL's tail and checkpoints) has the writer
/// parked between transactions.
type Gate = Arc<tokio::sync::Mutex<()>>;

/// The writer parked between transactions while this lives (see [`Writer::pause`]).
pub struct WritesPaused(#[allow(dead_code)] tokio::sync::OwnedMutexGuard<()>);

/// Whether the last group commit failed, and commit failures a fault test asked for.
#[derive(Default)]
struct Health {
    failing: AtomicBool,
    injected_failures: AtomicU32,
}

impl Writer {
    /// Starts the writer thread; committed ready-task announcements go to `wake`, committed
    /// facts and commit times to `observer`.
    pub fn start(
        conn: Connection,
        wake: tokio::sync::mpsc::UnboundedSender<WakeKey>,
        observer: ObserverSlot,
        delay: Arc<crate::pressure::WriteDelay>,
    ) -> Self {
        let (jobs, inbox) = group_commit::channel::<Job<Sqlite>>();
        let health = Arc::new(Health::default());
        let gate = Gate::default();
        let mut backend = Sqlite {
            conn,
            health: health.clone(),
            observer: observer.clone(),
            jobs_in_batch: 0,
            gate: gate.clone(),
            holding: None,
            delay,
        };
        std::thread::Builder::new()
            .name("capstan-sqlite-writer".into())
            // Transitions run here, memo merges with them, and payload decoding recurses per
            // nesting level: the same room as the server's runtime threads.
            .stack_size(crate::STACK_BYTES)
            .spawn(move || {
                let _stopped = Stopped(backend.health.clone());
                group_commit::run(&mut backend, &inbox, |notice| match notice {
                    Notice::Wake(key) => {
                        let _ = wake.send(key);
                    }
                    Notice::Fact(fact) => observer.committed(std::slice::from_ref(&fact)),
                    Notice::HandOff(delivery) => delivery.deliver(),
                    // Applied before the job ended; none is left by then.
                    Notice::Recount(..) => {}
                })
            })
            .expect("spawn the SQLite writer thread");
        Self { jobs, health, gate }
    }

    /// Parks the writer between transactions until the returned guard is dropped: no COMMIT
    /// happens meanwhile. Resolves once the transaction in progress (if any) has ended.
    pub async fn pause(&self) -> WritesPaused {
        WritesPaused(self.gate.clone().lock_owned().await)
    }

    /// Runs `f` on the writer's connection between transactions (a connection setting).
    pub async fn configure(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<()> + Send + 'static) -> StoreResult<()> {
        self.write(move |conn| Ok(f(conn)?)).await
    }

    /// Whether the last transaction failed to begin or commit (a full disk, an IO error, a
    /// failed fsync), or the writer thread stopped: the server reports itself not ready until a
    /// commit succeeds again.
    pub fn is_failing(&self) -> bool {
        self.health.failing.load(Ordering::SeqCst)
    }

    /// Makes the next `count` group commits fail as a failed fsync would (rolled back, every
    /// job in them answered with a storage error). For fault-injection tests.
    pub fn inject_commit_failures(&self, count: u32) {
        self.health.injected_failures.store(count, Ordering::SeqCst);
    }

    /// Runs `job` in the next group commit and resolves once that commit is durable.
    pub async fn write<T, F>(&self, job: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        self.write_tx(move |tx| job(tx.connection())).await
    }

    /// Like [`write`](Self::write), with the job given a [`SqliteTx`]: the shared transaction
    /// logic runs on it, and the tasks it announces are handed to pollers after COMMIT.
    pub async fn write_tx<T, F>(&self, job: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut SqliteTx<'t>) -> StoreResult<T> + Send + 'static,
    {
        let (job, reply) = group_commit::job::<Sqlite, T, StoreError, _>(move |conn: &mut Connection, announced: &mut Vec<Notice>| {
            let value = job(&mut SqliteTx::new(conn, announced))?;
            drive(crate::logic::run_counts::flush(&mut SqliteTx::new(conn, announced)))?;
            Ok(value)
        });
        self.jobs
            .send(job)
            .map_err(|_| StoreError::Storage("the writer thread has stopped".into()))?;
        reply
            .await
            .map_err(|_| StoreError::Storage("the writer thread dropped a job".into()))?
            .into_result(StoreError::Storage)
    }
}

/// Marks the store failing when the writer thread ends: it ends only once the store is gone,
/// or by a panic, after which every write is refused.
struct Stopped(Arc<Health>);

impl Drop for Stopped {
    fn drop(&mut self) {
        self.0.failing.store(true, Ordering::SeqCst);
    }
}

/// The database side of the group commit (see `capstan_sync::group_commit`, which holds the
/// hand-off: batching, savepoints per job, announcements only after COMMIT, each caller
/// answered once). Errors are the message each job of a batch that did not commit is given.
struct Sqlite {
    conn: Connection,
    health: Arc<Health>,
    observer: ObserverSlot,
    /// Jobs run in the open batch (its group commit's size).
    jobs_in_batch: usize,
    gate: Gate,
    /// The gate, held from BEGIN to the transaction's end.
    holding: Option<tokio::sync::OwnedMutexGuard<()>>,
    /// How long jobs wait for the writer (admission control reads it).
    delay: Arc<crate::pressure::WriteDelay>,
}

impl Backend for Sqlite {
    type Conn = Connection;
    type Announcement = Notice;
    type Error = String;

    fn conn(&mut self) -> &mut Connection {
        &mut self.conn
    }

    fn begin(&mut self) -> Result<(), String> {
        IO_FAILED.with(|f| f.set(false));
        self.jobs_in_batch = 0;
        self.holding = Some(self.gate.clone().blocking_lock_owned());
        self.conn.execute_batch("BEGIN IMMEDIATE").map_err(|error| {
            tracing::error!(%error, "could not begin a write transaction");
            self.health.failing.store(true, Ordering::SeqCst);
            self.holding = None;
            error.to_string()
        })
    }

    fn savepoint(&mut self) -> Result<(), String> {
        self.jobs_in_batch += 1;
        self.conn.execute_batch("SAVEPOINT job").map_err(|error| {
            tracing::error!(%error, "could not open a savepoint");
            error.to_string()
        })
    }

    fn end_job(&mut self, ending: Ending) -> Result<(), String> {
        let sql = match ending {
            Ending::Keep => "RELEASE job",
            Ending::Undo => "ROLLBACK TO job; RELEASE job",
            Ending::Panicked => {
                tracing::error!("a write job panicked; its changes were rolled back");
                "ROLLBACK TO job; RELEASE job"
            }
        };
        self.conn.execute_batch(sql).map_err(|error| {
            tracing::error!(%error, "could not close a savepoint");
            format!("a failed write could not be undone, so its group commit was rolled back: {error}")
        })
    }

    fn commit(&mut self) -> Result<(), String> {
        let injected = self
            .health
            .injected_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let commit = if injected {
            Err(StoreError::Storage("disk I/O error (injected: the commit's fsync failed)".into()))
        } else {
            let started = Instant::now();
            let committed = self.conn.execute_batch("COMMIT").map_err(StoreError::from);
            if committed.is_ok() {
                self.observer.get().commit(Commit {
                    transactions: self.jobs_in_batch,
                    took: started.elapsed(),
                });
            }
            committed
        };
        if let Err(error) = &commit {
            tracing::error!(%error, "a group commit failed; its changes were rolled back and no job in it was acknowledged");
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        self.holding = None;
        let io_failed = IO_FAILED.with(|f| f.replace(false));
        self.health.failing.store(commit.is_err() || io_failed, Ordering::SeqCst);
        commit.map_err(|error| error.to_string())
    }

    fn queued(&mut self, waited: std::time::Duration) {
        self.delay.observe(waited);
    }

    fn rollback(&mut self) {
        tracing::error!("a group commit was rolled back whole, a failed write in it not undone; no job in it was acknowledged");
        let _ = self.conn.execute_batch("ROLLBACK");
        self.holding = None;
        IO_FAILED.with(|f| f.set(false));
        self.health.failing.store(true, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tx::Tx;
    use capstan_engine::TaskKind;

    fn writer() -> (Writer, tokio::sync::mpsc::UnboundedReceiver<WakeKey>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("w.db")).unwrap();
        conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY)").unwrap();
        let (wake, woken) = tokio::sync::mpsc::unbounded_channel();
        (Writer::start(conn, wake, ObserverSlot::default(), Default::default()), woken, dir)
    }

    /// Keeps what it is told.
    #[derive(Default)]
    struct Heard {
        facts: std::sync::Mutex<Vec<crate::Fact>>,
        commits: std::sync::Mutex<Vec<Commit>>,
    }

    impl crate::Observer for Heard {
        fn committed(&self, facts: &[crate::Fact]) {
            self.facts.lock().unwrap().extend_from_slice(facts);
        }
        fn commit(&self, commit: Commit) {
            self.commits.lock().unwrap().push(commit);
        }
    }

    fn timer_fired(namespace: &str) -> crate::Fact {
        crate::Fact::TimerFired {
            namespace: namespace.into(),
        }
    }

    #[tokio::test]
    async fn the_observer_hears_committed_facts_only_and_every_commit() {
        let dir = tempfile::tempdir().unwrap();
        let conn = Connection::open(dir.path().join("w.db")).unwrap();
        let (wake, _woken) = tokio::sync::mpsc::unbounded_channel();
        let slot = ObserverSlot::default();
        let heard = Arc::new(Heard::default());
        slot.set(heard.clone());
        let writer = Writer::start(conn, wake, slot, Default::default());
        let refused = writer
            .write_tx(|tx| {
                tx.observe(timer_fired("refused"));
                Err::<(), _>(StoreError::Storage("refused after observing".into()))
            })
            .await;
        assert!(refused.is_err());
        writer
            .write_tx(|tx| {
                tx.observe(timer_fired("kept"));
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(
            *heard.facts.lock().unwrap(),
            vec![timer_fired("kept")],
            "only the committed job's fact"
        );
        let commits = heard.commits.lock().unwrap();
        assert!(!commits.is_empty());
        assert!(commits.iter().all(|c| c.transactions >= 1), "{commits:?}");
        assert_eq!(
            commits.iter().map(|c| c.transactions).sum::<usize>(),
            2,
            "both jobs ran in a committed batch"
        );
    }

    fn key(queue: &str) -> WakeKey {
        ("default".into(), TaskKind::Workflow, queue.into())
    }

    #[tokio::test]
    async fn a_rolled_back_job_announces_nothing_and_a_committed_one_after_commit() {
        let (writer, mut woken, _dir) = writer();
        let refused = writer
            .write_tx(|tx| {
                tx.connection().execute("INSERT INTO t (id) VALUES (1)", [])?;
                let _ = crate::sqlite::tx::drive(async { tx.announce(key("refused")).await });
                Err::<(), _>(StoreError::Storage("refused after announcing".into()))
            })
            .await;
        assert!(refused.is_err());
        writer
            .write_tx(|tx| crate::sqlite::tx::drive(async { tx.announce(key("kept")).await }))
            .await
            .unwrap();
        assert_eq!(woken.recv().await, Some(key("kept")), "only the committed job's announcement");
        assert!(woken.try_recv().is_err());
        let rows: i64 = writer
            .write(|conn| Ok(conn.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(rows, 0, "the refused job's write was rolled back with it");
    }

    #[tokio::test]
    async fn a_panicking_job_is_undone_alone_and_its_caller_told() {
        let (writer, mut woken, _dir) = writer();
        let panicked = writer
            .write_tx(|tx| -> StoreResult<()> {
                tx.connection().execute("INSERT INTO t (id) VALUES (1)", [])?;
                let _ = crate::sqlite::tx::drive(async { tx.announce(key("panicked")).await });
                panic!("a bug in a transition")
            })
            .await;
        assert!(
            matches!(&panicked, Err(StoreError::Storage(m)) if m.contains("dropped a job")),
            "{panicked:?}"
        );
        writer
            .write_tx(|tx| crate::sqlite::tx::drive(async { tx.announce(key("kept")).await }))
            .await
            .unwrap();
        assert_eq!(woken.recv().await, Some(key("kept")));
        assert!(woken.try_recv().is_err());
        let rows: i64 = writer
            .write(|conn| Ok(conn.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0))?))
            .await
            .unwrap();
        assert_eq!(rows, 0);
        assert!(!writer.is_failing());
    }

    #[tokio::test]
    async fn a_unique_violation_is_a_conflict_naming_the_columns() {
        let (writer, _woken, _dir) = writer();
        writer
            .write(|conn| Ok(conn.execute("INSERT INTO t (id) VALUES (7)", [])?))
            .await
            .unwrap();
        let again = writer.write(|conn| Ok(conn.execute("INSERT INTO t (id) VALUES (7)", [])?)).await;
        assert!(
            matches!(&again, Err(StoreError::Conflict { constraint, .. }) if constraint == "t.id"),
            "{again:?}"
        );
    }
}
