//! What the store tells its observer (the server's metrics): the facts a committed transaction
//! holds, and how long commits take. Facts are collected while a transaction runs and handed
//! on only after it is durable, so nothing refused or rolled back is ever counted, and a fact
//! is counted by the node that committed it, once.

use capstan_engine::{Observation, TaskKind};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// A committed fact operators count.
#[derive(Clone, Debug, PartialEq)]
pub enum Fact {
    /// A run began (a start, a child, a continue-as-new successor, a schedule's or a service
    /// call's start, a probe's or a standalone activity's host run).
    RunStarted { namespace: String, workflow_type: String },
    /// A run ended: `reason` is `completed`, `failed`, `cancelled`, `terminated`, `timed_out`
    /// or `continued` (continued as new).
    RunClosed {
        namespace: String,
        workflow_type: String,
        reason: &'static str,
    },
    /// The clock took a leased task back before its worker reported.
    LeaseExpired { namespace: String, kind: TaskKind },
    /// An activity ran out of a budget (`schedule_to_start`, `start_to_close`, `heartbeat`,
    /// `schedule_to_close`, `lease_expired`).
    ActivityTimedOut { namespace: String, timeout_kind: &'static str },
    /// A durable timer fired.
    TimerFired { namespace: String },
    /// A task was leased to a parked poll in the transaction that made it ready.
    HandedOff { namespace: String, kind: TaskKind },
    /// A run's history crossed a budget threshold (`approaching`, `continue_as_new_recommended`).
    HistoryBudgetCrossed { namespace: String, pressure: &'static str },
}

impl Fact {
    pub(crate) fn observed(namespace: &str, observation: Observation) -> Self {
        let namespace = namespace.to_string();
        match observation {
            Observation::LeaseExpired { kind } => Fact::LeaseExpired { namespace, kind },
            Observation::ActivityTimedOut { timeout_kind } => Fact::ActivityTimedOut { namespace, timeout_kind },
            Observation::TimerFired => Fact::TimerFired { namespace },
            Observation::HistoryBudgetCrossed { pressure } => Fact::HistoryBudgetCrossed { namespace, pressure },
        }
    }
}

/// One durable commit: how many transactions it carried (SQLite's group commit batches many;
/// PostgreSQL commits one at a time) and how long the COMMIT (with its fsync) took.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Commit {
    pub transactions: usize,
    pub took: Duration,
}

/// Where a store reports. Called on the committing thread (SQLite's writer, a PostgreSQL
/// task), so an implementation only records: no IO, no waiting.
pub trait Observer: Send + Sync + 'static {
    fn committed(&self, facts: &[Fact]);
    fn commit(&self, commit: Commit);
}

/// Reports to nobody: a store's observer until one is set.
struct Nobody;

impl Observer for Nobody {
    fn committed(&self, _: &[Fact]) {}
    fn commit(&self, _: Commit) {}
}

/// The observer of a store and every clone of it (and of SQLite's writer thread), set once the
/// server has built its metrics.
#[derive(Clone)]
pub struct ObserverSlot(Arc<RwLock<Arc<dyn Observer>>>);

impl Default for ObserverSlot {
    fn default() -> Self {
        Self(Arc::new(RwLock::new(Arc::new(Nobody))))
    }
}

impl ObserverSlot {
    pub fn set(&self, observer: Arc<dyn Observer>) {
        *self.0.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = observer;
    }

    pub fn get(&self) -> Arc<dyn Observer> {
        self.0.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Hands on a committed transaction's facts (nothing when there are none).
    pub fn committed(&self, facts: &[Fact]) {
        if !facts.is_empty() {
            self.get().committed(facts);
        }
    }
}
