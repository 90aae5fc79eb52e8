//! [`Backend`]: what each database does its own way, and nothing else. Every store method is
//! written once (`contract/`), generically over a backend: it hands a unit of shared logic
//! (`logic/`) to [`Backend::read`], [`Backend::write`] or [`Backend::write_one`], which run it
//! on that database's [`Tx`]. What truly differs stays here: how a transaction is opened and
//! committed, how a poller's candidate task is picked and leased, how an atomic action runs
//! inside its recording transaction, how ready tasks wake pollers, readiness and pool use.
//!
//! The contract traits have `Backend` as their supertrait and implement every method once as a
//! default over it. `Backend` is sealed: its module is private, so no other crate can name or
//! implement it (the types its signatures mention are `pub` only nominally, in private modules).
//!
//! SQLite runs units on its one writer thread (group commit) or a pooled reader; the shared
//! databases (`shared/`) run them on a pooled connection. Units are `'static` because SQLite's
//! writer needs owned jobs: the contract passes owned arguments.

use crate::logic::integrity;
use crate::tx::Tx;
use crate::*;
use std::pin::Pin;
use std::sync::Arc;

/// One unit of shared logic over a backend's transaction, boxed so that one signature serves
/// every backend: `|tx| Box::pin(async move { logic::step(tx, …).await })`.
pub type Unit<'t, T> = Pin<Box<dyn Future<Output = StoreResult<T>> + Send + 't>>;

/// A poller's claim of the oldest ready task it may take (see [`TaskStore::claim_task`]).
pub struct Claim {
    pub namespace: String,
    pub kind: TaskKind,
    pub queue: String,
    pub types: Vec<String>,
    pub owner: String,
    pub lease_ms: i64,
    pub now: Millis,
    pub poll: Option<PollKey>,
}

/// A database the store runs on. See the module documentation.
pub trait Backend: Send + Sync + 'static {
    /// The backend's open transaction (SQLite's borrows a connection).
    type Tx<'t>: Tx + 't;

    /// The store's limits, sources, codec and observer.
    fn env(&self) -> &Arc<Env>;

    fn env_mut(&mut self) -> &mut Arc<Env>;

    /// Runs `unit` as a read (it writes nothing; it may see another transaction's commit).
    fn read<T, F>(&self, unit: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut Self::Tx<'t>) -> Unit<'t, T> + Send + 'static;

    /// Runs `unit` in a transaction of its own: committed (durably) when it succeeds, rolled
    /// back, its locks released, when it fails or refuses.
    fn write<T, F>(&self, unit: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut Self::Tx<'t>) -> Unit<'t, T> + Send + 'static;

    /// Runs `unit`, a write whose statements each stand alone (none needs another to have
    /// happened with it), where it costs least: autocommit where the database has it,
    /// SQLite's writer.
    fn write_one<T, F>(&self, unit: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut Self::Tx<'t>) -> Unit<'t, T> + Send + 'static;

    /// Leases the oldest ready task `claim` may take, with its run; a breach or an unreadable
    /// run comes back as that error (the contract settles it).
    fn claim(&self, claim: Claim) -> impl Future<Output = StoreResult<Option<(Task, RunState)>>> + Send;

    /// Runs the next ready atomic action of `namespace` this process has a handler for, in the
    /// transaction that records its outcome.
    fn run_atomic(
        &self,
        namespace: String,
        actions: AtomicActions,
        codec: &'static dyn MemoCodec,
        now: Millis,
    ) -> impl Future<Output = StoreResult<Option<AtomicOutcome>>> + Send;

    /// The committed ready-task announcements, once.
    fn take_wakeups(&self) -> impl Future<Output = StoreResult<Option<WakeReceiver>>> + Send;

    /// Whether the database answers and accepts a write now.
    fn probe(&self) -> impl Future<Output = StoreResult<()>> + Send;

    /// How the backend's connections are used now.
    fn connections(&self) -> PoolUse;

    /// [`Backend::write`] of a unit that reads or changes a run, with a breach or an unreadable
    /// run it meets settled ([`Backend::guard`]).
    fn write_guarded<T, F>(&self, unit: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut Self::Tx<'t>) -> Unit<'t, T> + Send + 'static,
    {
        async move {
            let result = self.write(unit).await;
            self.guard(result).await
        }
    }

    /// [`Backend::read`] of a run, with an unreadable one settled ([`Backend::guard`]).
    fn read_guarded<T, F>(&self, unit: F) -> impl Future<Output = StoreResult<T>> + Send
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t mut Self::Tx<'t>) -> Unit<'t, T> + Send + 'static,
    {
        async move {
            let result = self.read(unit).await;
            self.guard(result).await
        }
    }

    /// A change that found a broken ledger chain, or a run document it cannot read, was not
    /// written: open an incident, block the run, and answer as refused.
    fn guard<T: Send>(&self, result: StoreResult<T>) -> impl Future<Output = StoreResult<T>> + Send {
        async move {
            match result {
                Err(error) => Err(self.settle(error).await),
                ok => ok,
            }
        }
    }

    /// Turns a breach or an unreadable run into an open incident and the refusal it answers;
    /// any other error as it is.
    fn settle(&self, error: StoreError) -> impl Future<Output = StoreError> + Send {
        async move {
            let env = self.env().clone();
            let recorded = match error {
                StoreError::Integrity(breach) => {
                    self.write(move |tx| Box::pin(async move { integrity::record_breach(tx, &breach, env.now_ms(), &env).await }))
                        .await
                }
                StoreError::CorruptRun(breach) => {
                    self.write(move |tx| Box::pin(async move { integrity::record_unreadable_run(tx, &breach, env.now_ms(), &env).await }))
                        .await
                }
                other => return other,
            };
            match recorded {
                Ok(refusal) => refusal.into(),
                Err(error) => error,
            }
        }
    }
}
