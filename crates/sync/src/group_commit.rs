//! The hand-off of a single writer thread with group commit, apart from the database it drives.
//!
//! Callers queue [`Job`]s; the writer takes whatever is queued (up to [`BATCH_MAX`]), runs each
//! job inside its own savepoint of one transaction (a job that fails or panics is undone alone)
//! and commits once. The rules, whatever the interleaving of callers and writer:
//!
//! - a job's announcements (ready queues) are handed on only after the COMMIT that made them
//!   true, and never for a job that was undone or a batch that did not commit;
//! - every job's caller is answered exactly once: with its result once the COMMIT is durable, or
//!   with an error (the batch did not commit; or the job panicked, or was dropped unrun: a
//!   reply closes when its job or pending answer is dropped, so this holds however the writer
//!   stops, by a panic included: whatever it holds, queued or run, is dropped with it);
//! - a job whose savepoint could not be undone takes its batch down with it: committing would
//!   make writes durable that its caller is told failed.
//!
//! The database side is a [`Backend`]; the SQLite writer is one, the loom models another.

pub use crate::shim::mpsc::{channel, Receiver, Sender};
use crate::shim::oneshot;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Jobs committed together at most.
pub const BATCH_MAX: usize = 128;

/// How a job's savepoint is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// The job succeeded: release the savepoint, its changes stay.
    Keep,
    /// The job failed: roll back to the savepoint.
    Undo,
    /// The job panicked: roll back to the savepoint.
    Panicked,
}

/// The database the writer drives.
pub trait Backend {
    /// What a job works on.
    type Conn;
    /// What a job announces (a ready queue).
    type Announcement;
    /// Why a batch did not commit; every job in it is told.
    type Error: Clone;

    fn conn(&mut self) -> &mut Self::Conn;
    /// Opens the batch's transaction. On an error the batch is dropped unrun.
    fn begin(&mut self) -> Result<(), Self::Error>;
    /// Opens a job's savepoint. On an error the job is dropped unrun.
    fn savepoint(&mut self) -> Result<(), Self::Error>;
    /// Closes a job's savepoint.
    fn end_job(&mut self, ending: Ending) -> Result<(), Self::Error>;
    /// Commits the transaction (durably), or rolls it back and says why not.
    fn commit(&mut self) -> Result<(), Self::Error>;
    /// Rolls the transaction back.
    fn rollback(&mut self);
    /// A batch is about to begin; its first job was queued this long ago (how long writes
    /// wait for the writer: what admission control reads).
    fn queued(&mut self, _waited: std::time::Duration) {}
}

/// How a job's caller is answered once its batch is over.
pub type Finish<B> = Box<dyn FnOnce(Result<(), <B as Backend>::Error>) + Send>;

/// What running a job came to.
enum Ran<B: Backend> {
    Kept(Finish<B>),
    Undone(Finish<B>),
    /// Its caller has already heard (the reply closed once the panic was caught).
    Panicked,
}

type RunJob<B> = dyn FnOnce(&mut <B as Backend>::Conn, &mut Vec<<B as Backend>::Announcement>) -> Ran<B> + Send;

/// A unit of work queued for the writer, made by [`job`]. Dropped unrun (never run, the writer
/// gone), it answers its caller with an error.
pub struct Job<B: Backend> {
    run: Box<RunJob<B>>,
    queued_at: std::time::Instant,
}

/// What a caller hears: the commit's outcome and the job's own result.
pub struct Answer<T, E, C> {
    pub commit: Result<(), C>,
    pub result: Result<T, E>,
}

impl<T, E, C> Answer<T, E, C> {
    /// The job's result if its batch committed, else why the batch did not.
    pub fn into_result(self, commit_error: impl FnOnce(C) -> E) -> Result<T, E> {
        self.commit.map_err(commit_error).and(self.result)
    }
}

/// Resolves to the [`Answer`], or to an error if the job was dropped unanswered (never run,
/// panicked, or the writer stopped).
pub type Reply<T, E, C> = oneshot::Receiver<Answer<T, E, C>>;

/// A job for `work` (kept if it returns `Ok`, undone alone if it fails or panics) and the reply
/// its caller awaits.
#[allow(clippy::type_complexity)]
pub fn job<B, T, E, W>(work: W) -> (Job<B>, Reply<T, E, B::Error>)
where
    B: Backend + 'static,
    B::Error: Send + 'static,
    T: Send + 'static,
    E: Send + 'static,
    W: FnOnce(&mut B::Conn, &mut Vec<B::Announcement>) -> Result<T, E> + Send + 'static,
{
    let (answer, answered) = oneshot::channel();
    let run = Box::new(move |conn: &mut B::Conn, announced: &mut Vec<B::Announcement>| {
        // A bug that panics inside one job must not take the writer (and with it every later
        // write) down. Caught here, where nothing else is held: the reply closes (its caller
        // hears the job was dropped) only once the unwinding is over.
        let result = match catch_unwind(AssertUnwindSafe(|| work(conn, announced))) {
            Ok(result) => result,
            Err(_) => {
                drop(answer);
                return Ran::Panicked;
            }
        };
        let keep = result.is_ok();
        let finish: Finish<B> = Box::new(move |commit| {
            // A caller that stopped waiting (its future dropped) is not there to hear it.
            let _ = answer.send(Answer { commit, result });
        });
        if keep {
            Ran::Kept(finish)
        } else {
            Ran::Undone(finish)
        }
    });
    let job = Job {
        run,
        queued_at: std::time::Instant::now(),
    };
    (job, answered)
}

/// The writer's loop: batches until every sender is gone. Announcements go to `announce`.
pub fn run<B: Backend>(backend: &mut B, inbox: &Receiver<Job<B>>, mut announce: impl FnMut(B::Announcement)) {
    while let Ok(first) = inbox.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH_MAX {
            match inbox.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        commit_batch(backend, batch, &mut announce);
    }
}

/// One group commit.
fn commit_batch<B: Backend>(backend: &mut B, batch: Vec<Job<B>>, announce: &mut impl FnMut(B::Announcement)) {
    if let Some(first) = batch.first() {
        backend.queued(first.queued_at.elapsed());
    }
    // Never run a job outside a transaction: dropping the batch answers each caller with an
    // error.
    if backend.begin().is_err() {
        return;
    }
    let mut finishers = Vec::with_capacity(batch.len());
    // Announcements of the jobs kept in this batch; handed on only after COMMIT.
    let mut announced = Vec::new();
    let mut undo_failed = None;
    for job in batch {
        if backend.savepoint().is_err() {
            continue; // dropped unrun: its caller hears so
        }
        let mut job_announced = Vec::new();
        let (ending, finish) = match (job.run)(backend.conn(), &mut job_announced) {
            Ran::Kept(finish) => (Ending::Keep, Some(finish)),
            Ran::Undone(finish) => (Ending::Undo, Some(finish)),
            Ran::Panicked => (Ending::Panicked, None),
        };
        match backend.end_job(ending) {
            // A savepoint left open is released by the COMMIT: the kept changes stay.
            Err(_) if ending == Ending::Keep => {}
            Err(error) => undo_failed = Some(error),
            Ok(()) => {}
        }
        if ending == Ending::Keep {
            announced.append(&mut job_announced);
        }
        finishers.extend(finish);
    }
    let commit = match undo_failed {
        Some(error) => {
            backend.rollback();
            Err(error)
        }
        None => backend.commit(),
    };
    if commit.is_ok() {
        for key in announced {
            announce(key);
        }
    }
    for finish in finishers {
        finish(commit.clone());
    }
}
