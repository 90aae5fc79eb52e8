//! What the simulation has seen the server acknowledge, which the checks hold it to: every
//! instance that may exist, every run seen, each run's last acknowledged history head, the
//! query tasks created and answered, the runs to check after this step, and the activity
//! executions seen blocked on an unknown outcome.

use capstan_engine::RunState;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Default)]
pub(crate) struct Seen {
    /// Every workflow instance that may exist: started, children asked for, scheduled.
    pub(crate) instances: BTreeSet<String>,
    /// Run id → workflow id, for every run seen.
    pub(crate) run_workflows: BTreeMap<String, String>,
    /// Per run, the last acknowledged history head `(sequence, hash)`: it must survive restarts.
    pub(crate) acked: BTreeMap<String, (u64, String)>,
    /// Query tasks created, with whether an answer was accepted.
    pub(crate) queries: BTreeMap<String, bool>,
    /// Runs to check after this step.
    pub(crate) touched: BTreeSet<String>,
    /// Activity executions blocked on an unknown outcome (`execution:ledger_key`), with their
    /// `ActivityStarted` count when first seen blocked: it may not grow while that entry is
    /// unresolved.
    pub(crate) blocked: BTreeMap<String, usize>,
}

/// What an answer nobody heard must not count for: the acknowledged heads and query answers
/// as they were before it.
pub(crate) struct Heard {
    acked: BTreeMap<String, (u64, String)>,
    queries: BTreeMap<String, bool>,
}

impl Seen {
    /// The server acknowledged `run` as it is now (to a client, a worker or an operator).
    pub(crate) fn acknowledge(&mut self, run: &RunState) {
        self.acked
            .insert(run.run_id.as_str().to_string(), (run.last_sequence, run.last_hash.clone()));
        self.touched.insert(run.run_id.as_str().to_string());
        self.run_workflows
            .insert(run.run_id.as_str().to_string(), run.workflow_id.as_str().to_string());
        self.instances.insert(run.workflow_id.as_str().to_string());
    }

    /// What has been heard so far (see [`Seen::unhear`]).
    pub(crate) fn heard(&self) -> Heard {
        Heard {
            acked: self.acked.clone(),
            queries: self.queries.clone(),
        }
    }

    /// Forgets what was acknowledged since `heard`: its answer was lost with the power.
    pub(crate) fn unhear(&mut self, heard: Heard) {
        self.acked = heard.acked;
        self.queries = heard.queries;
    }
}
