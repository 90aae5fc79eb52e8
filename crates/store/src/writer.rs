//! The single SQLite writer with group commit.
//!
//! SQLite allows one writer at a time, so every write goes through one thread. The thread takes
//! whatever jobs are queued (up to `BATCH_MAX`), runs each inside its own SAVEPOINT of one
//! transaction — a job that fails rolls back to its savepoint without touching the others — and
//! COMMITs once. Only after the COMMIT (and its fsync, `synchronous=FULL`) returns does any job
//! in the batch learn its result. Many concurrent transitions therefore share one fsync without
//! any of them being acknowledged before it is durable.

use crate::{StoreError, StoreResult};
use capstan_engine::TaskKind;
use rusqlite::Connection;
use std::cell::RefCell;
use std::sync::mpsc;
use tokio::sync::oneshot;

/// `(namespace, kind, queue)` of a task made ready.
pub type WakeKey = (String, TaskKind, String);

thread_local! {
    /// Ready-task announcements of the jobs in the current batch; sent only after COMMIT.
    static ANNOUNCED: RefCell<Vec<WakeKey>> = const { RefCell::new(Vec::new()) };
}

/// Called by jobs (on the writer thread) for each task they make ready.
pub fn announce(key: WakeKey) {
    ANNOUNCED.with(|a| a.borrow_mut().push(key));
}

const BATCH_MAX: usize = 128;

/// Runs inside the transaction; returns whether to keep its changes and how to answer.
type Job = Box<dyn FnOnce(&Connection) -> (bool, Box<dyn FnOnce(StoreResult<()>) + Send>) + Send>;

#[derive(Clone)]
pub struct Writer {
    jobs: mpsc::Sender<Job>,
}

impl Writer {
    /// Starts the writer thread; committed ready-task announcements go to `wake`.
    pub fn start(conn: Connection, wake: tokio::sync::mpsc::UnboundedSender<WakeKey>) -> Self {
        let (jobs, inbox) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("capstan-sqlite-writer".into())
            .spawn(move || run(conn, inbox, wake))
            .expect("spawn the SQLite writer thread");
        Self { jobs }
    }

    /// Runs `job` in the next group commit and resolves once that commit is durable.
    pub async fn write<T, F>(&self, job: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> StoreResult<T> + Send + 'static,
    {
        let (answer, answered) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let result = job(conn);
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

fn run(conn: Connection, inbox: mpsc::Receiver<Job>, wake: tokio::sync::mpsc::UnboundedSender<WakeKey>) {
    while let Ok(first) = inbox.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH_MAX {
            match inbox.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut finishers = Vec::with_capacity(batch.len());
        let begin = conn.execute_batch("BEGIN IMMEDIATE");
        if let Err(error) = begin {
            // Never run a job outside a transaction: dropping the batch answers each caller
            // with a storage error.
            tracing::error!(%error, "could not begin a write transaction");
            drop(batch);
            continue;
        }
        for job in batch {
            let savepoint = conn.execute_batch("SAVEPOINT job");
            if let Err(error) = savepoint {
                tracing::error!(%error, "could not open a savepoint");
                continue;
            }
            let mark = ANNOUNCED.with(|a| a.borrow().len());
            // A bug that panics inside one transition must not take the writer (and with it
            // every later write) down: undo that job alone; its caller sees a storage error.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&conn)));
            let Ok((keep, finish)) = outcome else {
                tracing::error!("a write job panicked; its changes were rolled back");
                ANNOUNCED.with(|a| a.borrow_mut().truncate(mark));
                let _ = conn.execute_batch("ROLLBACK TO job; RELEASE job");
                continue;
            };
            if !keep {
                ANNOUNCED.with(|a| a.borrow_mut().truncate(mark));
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
        let commit = conn.execute_batch("COMMIT").map_err(StoreError::from);
        if commit.is_err() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        let announced = ANNOUNCED.with(|a| std::mem::take(&mut *a.borrow_mut()));
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
