//! The single SQLite writer with group commit.
//!
//! SQLite allows one writer at a time, so every write goes through one thread. The thread takes
//! whatever jobs are queued (up to `BATCH_MAX`), runs each inside its own SAVEPOINT of one
//! transaction — a job that fails rolls back to its savepoint without touching the others — and
//! COMMITs once. Only after the COMMIT (and its fsync, `synchronous=FULL`) returns does any job
//! in the batch learn its result. Many concurrent transitions therefore share one fsync without
//! any of them being acknowledged before it is durable.

use super::tx::SqliteTx;
use crate::{StoreError, StoreResult, WakeKey};
use rusqlite::Connection;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use tokio::sync::oneshot;

thread_local! {
    /// Set when a statement of the current batch failed for a reason of the device (full, IO
    /// error, read-only): the batch may commit what else it did, but the store is failing.
    static IO_FAILED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Notes a device-level SQLite error (on whichever thread saw it; only the writer's counts).
pub fn note_io_failure() {
    IO_FAILED.with(|f| f.set(true));
}

const BATCH_MAX: usize = 128;

/// Runs inside the transaction, noting the tasks it made ready; returns whether to keep its
/// changes and how to answer.
type Job = Box<dyn FnOnce(&mut Connection, &mut Vec<WakeKey>) -> (bool, Box<dyn FnOnce(StoreResult<()>) + Send>) + Send>;

#[derive(Clone)]
pub struct Writer {
    jobs: mpsc::Sender<Job>,
    health: Arc<Health>,
}

/// Whether the last group commit failed, and commit failures a fault test asked for.
#[derive(Default)]
struct Health {
    failing: AtomicBool,
    injected_failures: AtomicU32,
}

impl Writer {
    /// Starts the writer thread; committed ready-task announcements go to `wake`.
    pub fn start(conn: Connection, wake: tokio::sync::mpsc::UnboundedSender<WakeKey>) -> Self {
        let (jobs, inbox) = mpsc::channel::<Job>();
        let health = Arc::new(Health::default());
        let thread_health = health.clone();
        std::thread::Builder::new()
            .name("capstan-sqlite-writer".into())
            // Transitions run here, memo merges with them, and payload decoding recurses per
            // nesting level: the same room as the server's runtime threads.
            .stack_size(crate::STACK_BYTES)
            .spawn(move || run(conn, inbox, wake, &thread_health))
            .expect("spawn the SQLite writer thread");
        Self { jobs, health }
    }

    /// Whether the last transaction failed to begin or commit (a full disk, an IO error, a
    /// failed fsync): the server reports itself not ready until a commit succeeds again.
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
        F: FnOnce(&mut SqliteTx<'_>) -> StoreResult<T> + Send + 'static,
    {
        let (answer, answered) = oneshot::channel();
        let job: Job = Box::new(move |conn, announced| {
            let result = job(&mut SqliteTx::new(conn, announced));
            let keep = result.is_ok();
            let finish = Box::new(move |commit: StoreResult<()>| {
                let _ = answer.send(commit.and(result));
            });
            (keep, finish)
        });
        self.jobs
            .send(job)
            .map_err(|_| StoreError::Storage("the writer thread has stopped".into()))?;
        answered
            .await
            .map_err(|_| StoreError::Storage("the writer thread dropped a job".into()))?
    }
}

fn run(mut conn: Connection, inbox: mpsc::Receiver<Job>, wake: tokio::sync::mpsc::UnboundedSender<WakeKey>, health: &Health) {
    while let Ok(first) = inbox.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH_MAX {
            match inbox.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut finishers = Vec::with_capacity(batch.len());
        // Ready-task announcements of the jobs kept in this batch; sent only after COMMIT.
        let mut announced: Vec<WakeKey> = Vec::new();
        IO_FAILED.with(|f| f.set(false));
        let begin = conn.execute_batch("BEGIN IMMEDIATE");
        if let Err(error) = begin {
            // Never run a job outside a transaction: dropping the batch answers each caller
            // with a storage error.
            tracing::error!(%error, "could not begin a write transaction");
            health.failing.store(true, Ordering::SeqCst);
            drop(batch);
            continue;
        }
        for job in batch {
            let savepoint = conn.execute_batch("SAVEPOINT job");
            if let Err(error) = savepoint {
                tracing::error!(%error, "could not open a savepoint");
                continue;
            }
            let mut job_announced = Vec::new();
            // A bug that panics inside one transition must not take the writer (and with it
            // every later write) down: undo that job alone; its caller sees a storage error.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut conn, &mut job_announced)));
            let Ok((keep, finish)) = outcome else {
                tracing::error!("a write job panicked; its changes were rolled back");
                let _ = conn.execute_batch("ROLLBACK TO job; RELEASE job");
                continue;
            };
            if keep {
                announced.append(&mut job_announced);
            }
            let end = if keep {
                conn.execute_batch("RELEASE job")
            } else {
                conn.execute_batch("ROLLBACK TO job; RELEASE job")
            };
            if let Err(error) = end {
                tracing::error!(%error, "could not close a savepoint");
            }
            finishers.push(finish);
        }
        let injected = health
            .injected_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let commit = if injected {
            Err(StoreError::Storage("disk I/O error (injected: the commit's fsync failed)".into()))
        } else {
            conn.execute_batch("COMMIT").map_err(StoreError::from)
        };
        if let Err(error) = &commit {
            tracing::error!(%error, "a group commit failed; its changes were rolled back and no job in it was acknowledged");
            let _ = conn.execute_batch("ROLLBACK");
        }
        let io_failed = IO_FAILED.with(|f| f.replace(false));
        health.failing.store(commit.is_err() || io_failed, Ordering::SeqCst);
        if commit.is_ok() {
            for key in announced {
                let _ = wake.send(key);
            }
        }
        for finish in finishers {
            finish(match &commit {
                Ok(()) => Ok(()),
                Err(error) => Err(StoreError::Storage(error.to_string())),
            });
        }
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
        (Writer::start(conn, wake), woken, dir)
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
