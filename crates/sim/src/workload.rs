//! The workload's fixed names and sizes: the namespace, queue and types every part of the
//! simulation uses, the principals clients, workers and operators act as, the leases workers
//! ask for, and [`Config`], how much of the workload one seed runs.

use capstan_engine::Millis;

#[derive(Clone, Debug)]
pub struct Config {
    pub seed: u64,
    /// Steps with faults; then a calm phase in which every workflow must finish.
    pub steps: usize,
    pub workflows: usize,
    /// Print each step (for replaying a failure).
    pub trace: bool,
}

impl Config {
    pub fn new(seed: u64) -> Self {
        Self {
            seed,
            steps: 300,
            workflows: 8,
            trace: false,
        }
    }
}

/// An Avro single-object frame of the DW `Value` schema (an empty string): payloads are opaque
/// to the engine, but they are kept well-formed.
pub(crate) const PAYLOAD: &str = "wwHioz3/VYAiNwoA";
pub(crate) const NAMESPACE: &str = "default";
pub(crate) const QUEUE: &str = "sim";
/// The principal the simulated clients act as.
pub(crate) const SIMULATED_CLIENT: &str = "simulated-client";
/// Who resolves unknown outcomes in the simulation.
pub(crate) const SIMULATED_OPERATOR: &str = "simulated-operator";
/// The principal the simulated workers act as.
pub(crate) const SIMULATED_WORKER: &str = "simulated-worker";
/// The simulated clock's start.
pub(crate) const START: Millis = 1_800_000_000_000;
pub(crate) const WORKFLOW_LEASE_MS: i64 = 5_000;
pub(crate) const ACTIVITY_LEASE_MS: i64 = 8_000;
/// The declared consequential action (non_atomic): a failed or lost dispatch of it is
/// `outcome_unknown` and waits for an operator.
pub(crate) const DECLARED: &str = "sim.charge";
pub(crate) const PLAIN: &str = "sim.work";
pub(crate) const WORKFLOW_TYPE: &str = "sim.workflow";
pub(crate) const CHILD_TYPE: &str = "sim.child";
pub(crate) const SCHEDULED_TYPE: &str = "sim.scheduled";
