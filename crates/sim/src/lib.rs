//! Deterministic simulation of Capstan: the real engine and the real SQLite store, driven by
//! one seed through a simulated clock, simulated workers and clients, and injected faults.
//!
//! A seed picks a workload (workflows made of activities, declared consequential actions,
//! timers, signal waits, child workflows and continue-as-new; updates and queries sent by
//! clients; interval schedules with every overlap policy, paused and resumed) and, step by
//! step, what happens next: a worker polls and completes at once, late, twice or never (it
//! crashed); an activity succeeds, fails, hangs past its timeout or reports after its lease
//! expired; reports are reordered and duplicated; a client retries an update with the same
//! request id; the clock jumps; the server restarts from its database file; an operator
//! resolves an `outcome_unknown` entry. After every step the touched run is checked against
//! the guarantees (see [`Sim::check_run`]), and after the faults stop every workflow, child,
//! continued run, update and schedule must finish (liveness).
//!
//! Clients and workers act through the application layer (`capstan_app`), the same use cases
//! the HTTP handlers call, so a seed covers the policy a request goes through, not only the
//! store. Everything that varies comes from the seed: the workload, the fault choices, and the
//! ids minted (a [`SeededIds`] mint and a [`ManualClock`] are the sources of the store and the
//! use cases). A failing seed replays exactly with `capstan-sim --seed N`.

mod cancellation;
mod checks;
mod local;
mod nexus;
mod nodes;
mod payloads;
mod power;
mod probes;
mod program;
mod redrive;
mod standalone;
mod streams;

use capstan_app::{control, duties, ledger, polls, queries, reports, AppError, Services};
use capstan_engine::schedule::{OverlapPolicy, Schedule, ScheduleFields};
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::{
    CatalogEntry, CatalogKey, CommandKey, DuplicatePolicy, LedgerFilter, ManualClock, RunLocator, SeededIds, Sources, SqliteStore,
    StoreError,
};
use program::{command_identity, decide, pick};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An Avro single-object frame of the DW `Value` schema (an empty string): payloads are opaque
/// to the engine, but they are kept well-formed.
const PAYLOAD: &str = "wwHioz3/VYAiNwoA";
const NAMESPACE: &str = "default";
const QUEUE: &str = "sim";
/// The principal the simulated clients act as.
const SIMULATED_CLIENT: &str = "simulated-client";
/// Who resolves unknown outcomes in the simulation.
const SIMULATED_OPERATOR: &str = "simulated-operator";
/// The principal the simulated workers act as.
const SIMULATED_WORKER: &str = "simulated-worker";
const START: Millis = 1_800_000_000_000;
const WORKFLOW_LEASE_MS: i64 = 5_000;
const ACTIVITY_LEASE_MS: i64 = 8_000;
/// The declared consequential action (non_atomic): a failed or lost dispatch of it is
/// `outcome_unknown` and waits for an operator.
const DECLARED: &str = "sim.charge";
const PLAIN: &str = "sim.work";
const WORKFLOW_TYPE: &str = "sim.workflow";
const CHILD_TYPE: &str = "sim.child";
const SCHEDULED_TYPE: &str = "sim.scheduled";
const UPDATE_NAME: &str = "bump";
const QUERY_LEASE_MS: i64 = 3_000;
const QUERY_WAIT_MS: i64 = 10_000;
/// As `capstan serve` runs it by default.
const SCHEDULE_CATCHUP_MS: i64 = 60_000;
const SCHEDULES: usize = 2;
const WORKERS: usize = 3;
/// What the simulated workers register as their SDK (their sticky claims name it as the build).
const SDK_VERSION: &str = "capstan-sim/1";
/// How often a worker's report is delivered while the power fails inside its commit.
const MID_COMMIT_CUTS: f64 = 0.08;

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

/// What one seed did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub seed: u64,
    pub steps: usize,
    pub workflows: usize,
    /// Workflow instances that came to exist; all of them closed.
    pub completed: usize,
    pub restarts: usize,
    pub duplicates_delivered: usize,
    pub refusals: BTreeMap<String, usize>,
    pub outcome_unknown_resolved: usize,
    pub lost_tasks: usize,
    pub updates_accepted: usize,
    pub update_retries_answered_from_receipt: usize,
    pub queries_answered: usize,
    pub children_started: usize,
    pub continued_as_new: usize,
    pub scheduled_starts: usize,
    pub closed_by_clients: usize,
    pub calm_rounds: usize,
    /// Workflow leases by replay mode: `[cold, sticky hit expected, forced cold]`.
    pub replay_modes: [usize; 3],
    /// Session activity attempts leased, and worker retirements.
    pub session_attempts: usize,
    pub workers_retired: usize,
    /// Activity lease renewals granted.
    pub lease_renewals: usize,
    /// Uploaded payloads that nothing named, collected.
    pub payloads_collected: usize,
    /// Runs started by Nexus calls (each call's linked run).
    pub service_calls: usize,
    /// Cooperative cancellations requested, delivered, deferred (a call waited for its
    /// activities to stop) and stops acknowledged.
    pub cancellations: [usize; 4],
    /// Prepared local attempts admitted, retried by the server, recovered after a lost claim,
    /// stopped by a cancellation.
    pub local_attempts: [usize; 4],
    /// Standalone activity runs started (first starts and restarts of a closed id).
    pub standalone_started: usize,
    /// Stream messages ingested, retried appends answered from their receipt, reused ids refused.
    pub messages_ingested: usize,
    /// Output-stream items checked against their side effects (counted at every check).
    pub stream_items: usize,
    pub message_retries: usize,
    pub message_conflicts: usize,
    /// Failed runs redriven.
    pub redrives: usize,
    /// Nodes frozen between claiming duties and acting on them; duty claims that took over an
    /// earlier claim; what the woken nodes' stale duties came to `[applied, refused stale_fence]`;
    /// schedule starts by woken nodes (occurrences still due when they woke).
    pub node_pauses: usize,
    pub duty_takeovers: usize,
    pub zombie_duties: [usize; 2],
    pub zombie_firings: usize,
    /// Power cuts, and the unsynced writes they dropped.
    pub power_cuts: usize,
    pub unsynced_writes_lost: usize,
    /// Of the power cuts, those inside a commit (at its sync: before or after it reached disk).
    pub mid_commit_cuts: usize,
    /// Probes by how they ended for their entry: found, absent, inconclusive (said so, answered
    /// nonsense, failed or timed out), and those the operator settled before they answered.
    pub probes: [usize; 4],
    /// A hash of every step taken, ids included: equal digests mean the same run.
    pub digest: u64,
}

/// A broken guarantee: the seed, the step and what was seen.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    pub step: usize,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} failed at step {}: {}\n  replay: cargo run -p capstan-sim -- --seed {} --trace",
            self.seed, self.step, self.message, self.seed
        )
    }
}

/// One step of a simulated workflow's program.
#[derive(Clone, Debug, PartialEq)]
enum Step {
    Activity(&'static str),
    /// A plain activity in the instance's worker session (only its holder may run it).
    SessionActivity,
    Timer(i64),
    /// Waits for the signal `go-N`.
    Signal(usize),
    /// Starts a child workflow and waits for it to close.
    Child,
    /// Calls the catalog operation bound to the child type: `Sync` waits for the linked run's
    /// end, `Async` resumes at admission.
    Nexus(capstan_engine::service_call::CallMode),
    /// A prepared local activity: admitted, run and reported on the workflow task's claim.
    LocalActivity,
    /// Ends this run's part of the program: the next run of the instance does the rest.
    ContinueAsNew,
    /// Appends two items to the run's output stream `out` (a `record_side_effect` directive);
    /// it does not wait, so it rides with the next step's command.
    Stream,
    /// First step only: the workflow fails with its first activity that fails for good,
    /// naming the failed step (so a client can redrive it). Such programs are plain activities.
    FailWithActivity,
}

/// A report a worker holds and delivers later (or twice, or never).
#[derive(Clone, Debug)]
enum Delivery {
    CompleteWorkflowTask {
        task_id: TaskId,
        owner: String,
        fence: u64,
        commands: Vec<WorkflowCommand>,
        /// The worker keeps the run in its (simulated) replay cache.
        sticky: Option<StickyClaim>,
    },
    CompleteActivity {
        task_id: TaskId,
        attempt_id: ActivityAttemptId,
        owner: String,
        result: Payload,
    },
    FailActivity {
        task_id: TaskId,
        attempt_id: ActivityAttemptId,
        owner: String,
    },
    HeartbeatActivity {
        task_id: TaskId,
        attempt_id: ActivityAttemptId,
        owner: String,
    },
    RenewActivityLease {
        task_id: TaskId,
        attempt_id: ActivityAttemptId,
        owner: String,
    },
    /// The worker of an attempt a delivered cancellation stopped says it has stopped; a
    /// prepared local attempt's names its workflow task claim (`fence`).
    AcknowledgeStop {
        task_id: TaskId,
        attempt_id: ActivityAttemptId,
        owner: String,
        request_id: String,
        fence: Option<u64>,
    },
    AnswerQuery {
        query_id: String,
        owner: String,
        attempt: u32,
    },
}

/// What the use cases run on in a simulation: the store (reopened on a restart), a manual
/// clock and seeded ids.
struct SimServices {
    store: Option<SqliteStore>,
    clock: Arc<ManualClock>,
    sources: Sources,
    limits: Limits,
}

impl Services for SimServices {
    type Store = SqliteStore;

    fn store(&self) -> &SqliteStore {
        self.store.as_ref().expect("the store is open")
    }

    fn sources(&self) -> &Sources {
        &self.sources
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    fn memo_codec(&self) -> Option<&'static dyn MemoCodec> {
        Some(&probes::SIM_CODEC)
    }

    async fn rollouts(&self, namespace: &str, queue: &str) -> capstan_store::StoreResult<Vec<capstan_store::BuildIdRollout>> {
        self.store().build_id_rollouts(namespace, queue).await
    }
}

struct Sim {
    config: Config,
    rng: StdRng,
    dir: tempfile::TempDir,
    /// Which disk the server runs on: a power cut moves it to a fresh one holding what the
    /// last one had synced.
    disk: usize,
    app: SimServices,
    now: Millis,
    step: usize,
    /// The programs of the workflows the clients started (children and scheduled workflows
    /// run fixed programs of their type).
    programs: BTreeMap<String, Vec<Step>>,
    /// The ids of the standalone activities clients started (a host run each, no program).
    standalone: BTreeSet<String>,
    /// The stream messages clients know were ingested.
    ingested: streams::Ingested,
    /// Every workflow instance that may exist: started, children asked for, scheduled.
    instances: BTreeSet<String>,
    /// Run id → workflow id, for every run seen.
    run_workflows: BTreeMap<String, String>,
    /// Query tasks created, with whether an answer was accepted.
    queries: BTreeMap<String, bool>,
    schedules: Vec<String>,
    inflight: Vec<Delivery>,
    /// The highest fence each task was leased with: a new lease must be higher.
    fences: BTreeMap<String, u64>,
    /// Per run, the last acknowledged history head `(sequence, hash)`: it must survive restarts.
    acked: BTreeMap<String, (u64, String)>,
    /// Runs to check after this step.
    touched: BTreeSet<String>,
    /// Activity executions blocked on an unknown outcome (`execution:ledger_key`), with their
    /// `ActivityStarted` count when first seen blocked: it may not grow while that entry is
    /// unresolved.
    blocked: BTreeMap<String, usize>,
    /// Workers retired in the faulty phase (registered again when the calm phase begins).
    retired: BTreeSet<String>,
    /// Payloads clients uploaded to the runtime transport.
    uploads: payloads::Uploads,
    /// The server nodes running the background duties over the one store.
    nodes: Vec<nodes::Node>,
    report: Report,
    digest: std::cell::Cell<u64>,
}

pub async fn run(config: Config) -> Result<Report, Failure> {
    let clock = Arc::new(ManualClock::new(START));
    let sources = Sources::new(clock.clone(), Arc::new(SeededIds::new(config.seed)));
    // tmpfs when there is one: the simulation is about logic, not fsync latency.
    let base = ["/dev/shm"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let dir = tempfile::Builder::new()
        .prefix("capstan-sim-")
        .tempdir_in(base)
        .map_err(|e| Failure {
            seed: config.seed,
            step: 0,
            message: format!("temp dir: {e}"),
        })?;
    let mut rng = StdRng::seed_from_u64(config.seed);
    let cluster = nodes::cluster(&mut rng);
    let mut sim = Sim {
        rng,
        nodes: cluster,
        report: Report {
            seed: config.seed,
            ..Report::default()
        },
        config,
        dir,
        disk: 0,
        app: SimServices {
            store: None,
            clock,
            sources,
            limits: Limits::default(),
        },
        now: START,
        step: 0,
        programs: BTreeMap::new(),
        standalone: BTreeSet::new(),
        ingested: Default::default(),
        instances: BTreeSet::new(),
        run_workflows: BTreeMap::new(),
        queries: BTreeMap::new(),
        schedules: Vec::new(),
        inflight: Vec::new(),
        fences: BTreeMap::new(),
        acked: BTreeMap::new(),
        touched: BTreeSet::new(),
        blocked: BTreeMap::new(),
        digest: std::cell::Cell::new(0),
        retired: BTreeSet::new(),
        uploads: Default::default(),
    };
    sim.open()?;
    sim.store()
        .put_action_definition(NAMESPACE, DECLARED, RecoveryMode::NonAtomic, probes::action_document(), sim.now)
        .await
        .map_err(|e| sim.fail(format!("defining the action: {e}")))?;
    sim.register_operation().await?;
    sim.register_workers().await?;
    sim.faulty_phase().await?;
    sim.calm_phase().await?;
    sim.check_all().await?;
    sim.check_settled().await?;
    sim.check_probes().await?;
    sim.report.steps = sim.step;
    sim.report.digest = sim.digest.get();
    Ok(sim.report)
}

impl Sim {
    fn fail(&self, message: impl Into<String>) -> Failure {
        Failure {
            seed: self.config.seed,
            step: self.step,
            message: message.into(),
        }
    }

    fn store(&self) -> &SqliteStore {
        self.app.store()
    }

    fn disk_dir(&self) -> PathBuf {
        self.dir.path().join(format!("disk-{}", self.disk))
    }

    fn next_disk_dir(&self) -> PathBuf {
        self.dir.path().join(format!("disk-{}", self.disk + 1))
    }

    fn open(&mut self) -> Result<(), Failure> {
        power::register();
        let path = self.disk_dir().join("capstan.db");
        let store = SqliteStore::open_with_vfs(&path, Some(power::VFS_NAME), Limits::default(), self.now)
            .map_err(|e| self.fail(format!("open: {e}")))?
            .with_sources(self.app.sources.clone())
            .with_payload_codec(&probes::SIM_CODEC);
        self.app.store = Some(store);
        Ok(())
    }

    /// Moves the simulated time (the clock the store and the use cases read) forward.
    fn advance(&mut self, by: Millis) {
        self.now = self.app.clock.advance(by);
    }

    /// Every step's line (with the ids it touched) goes into the run's digest; `--trace` prints
    /// it too. Two runs of a seed must end with the same digest.
    fn trace(&self, what: impl FnOnce() -> String) {
        use std::hash::{Hash, Hasher};
        let line = format!("[{:>4}] t+{:>7} ms  {}", self.step, self.now - START, what());
        let mut hasher = std::hash::DefaultHasher::new();
        (self.digest.get(), &line).hash(&mut hasher);
        self.digest.set(hasher.finish());
        if self.config.trace {
            eprintln!("{line}");
        }
    }

    /// A refusal is the server saying no, which the guarantees allow; anything else fails.
    fn refused<T>(&mut self, result: Result<T, StoreError>) -> Result<Option<T>, Failure> {
        match result {
            Ok(value) => Ok(Some(value)),
            Err(StoreError::Refused(refusal)) => {
                self.trace(|| format!("    refused: {}", refusal.reason.as_str()));
                *self.report.refusals.entry(refusal.reason.as_str().to_string()).or_default() += 1;
                Ok(None)
            }
            Err(other) => Err(self.fail(format!("store error: {other}"))),
        }
    }

    /// [`Sim::refused`] for a use case's answer; a request the simulator sends is never invalid.
    fn declined<T>(&mut self, result: Result<T, AppError>) -> Result<Option<T>, Failure> {
        match result {
            Ok(value) => Ok(Some(value)),
            Err(AppError::Store(error)) => self.refused(Err(error)),
            Err(invalid) => Err(self.fail(format!("a simulated request was invalid: {invalid}"))),
        }
    }

    fn acknowledge(&mut self, run: &RunState) {
        self.acked
            .insert(run.run_id.as_str().to_string(), (run.last_sequence, run.last_hash.clone()));
        self.touched.insert(run.run_id.as_str().to_string());
        self.run_workflows
            .insert(run.run_id.as_str().to_string(), run.workflow_id.as_str().to_string());
        self.instances.insert(run.workflow_id.as_str().to_string());
    }

    /// The program a run executes: the client's for the workflows it started, a fixed one per
    /// type for children and scheduled workflows.
    fn program_for(&self, workflow_id: &str, workflow_type: &str) -> Vec<Step> {
        if let Some(program) = self.programs.get(workflow_id) {
            return program.clone();
        }
        match workflow_type {
            CHILD_TYPE if workflow_id.ends_with(['1', '3', '5', '7', '9']) => {
                vec![Step::Timer(2), Step::Activity(DECLARED)]
            }
            CHILD_TYPE => vec![Step::Activity(PLAIN)],
            _ => vec![Step::Activity(PLAIN), Step::Timer(1)],
        }
    }

    // -----------------------------------------------------------------------------------------
    // Phases

    async fn faulty_phase(&mut self) -> Result<(), Failure> {
        for _ in 0..self.config.steps {
            self.step += 1;
            let roll = self.rng.random_range(0..100);
            match roll {
                0..=7 => self.start_workflow().await?,
                8..=25 => {
                    self.poll_workflow_task(true).await?;
                }
                26..=41 => {
                    self.poll_activity_task(true).await?;
                }
                42..=53 => self.deliver_inflight().await?,
                54..=63 => self.advance_clock().await?,
                64 => self.collect_payloads().await?,
                65..=69 if self.rng.random_bool(0.3) => self.append_message().await?,
                65..=69 => self.send_signal().await?,
                70 => match self.random_started_workflow() {
                    Some(workflow_id) => self.request_cooperative_cancellation(&workflow_id).await?,
                    None => self.advance_clock().await?,
                },
                71..=75 => self.send_update().await?,
                76..=78 => self.send_query().await?,
                79..=81 => {
                    self.poll_query_task(true).await?;
                }
                82..=87 => self.resolve_unknown().await?,
                88..=93 => self.change_schedules().await?,
                94 if self.rng.random_bool(0.5) => self.redrive_one().await?,
                94 => self.close_workflow().await?,
                95 => self.retire_worker().await?,
                _ if self.rng.random_bool(0.5) => self.power_cut().await?,
                _ => self.restart().await?,
            }
            self.check_touched().await?;
        }
        Ok(())
    }

    /// No more faults: reports arrive, workers succeed, operators resolve, signals come. Every
    /// workflow must reach a terminal state.
    async fn calm_phase(&mut self) -> Result<(), Failure> {
        // Frozen nodes wake and act on what they held; retired workers come back (a fleet is
        // eventually whole again).
        self.wake_all().await?;
        self.register_workers().await?;
        // Clients redrive what failed, now that the faults are fixed.
        self.redrive_every_failed().await?;
        // Whatever workers still hold arrives now (late ones are refused).
        while !self.inflight.is_empty() {
            self.step += 1;
            let delivery = self.inflight.remove(0);
            self.deliver(delivery).await?;
            self.check_touched().await?;
        }
        for round in 0..400 {
            self.report.calm_rounds = round + 1;
            if self.open_workflows().await?.is_empty() && self.live_schedules().await?.is_empty() {
                return Ok(());
            }
            self.step += 1;
            // A paused schedule would never finish: operators resume them.
            for schedule_id in self.live_schedules().await? {
                self.pause_or_resume(&schedule_id, false).await?;
            }
            while self.poll_workflow_task(false).await? {}
            while self.poll_activity_task(false).await? {}
            while self.poll_query_task(false).await? {}
            while !self.inflight.is_empty() {
                let delivery = self.inflight.remove(0);
                self.deliver(delivery).await?;
            }
            for workflow_id in self.open_workflows().await? {
                self.signal_waiting(&workflow_id).await?;
            }
            while self.resolve_one_unknown().await? {}
            self.advance(1_000);
            self.node_pass(false).await?;
            self.check_touched().await?;
        }
        let open = self.open_workflows().await?;
        let schedules = self.live_schedules().await?;
        Err(self.fail(format!(
            "liveness: {} workflow(s) still open and {} schedule(s) live after the faults stopped: {open:?} {schedules:?}",
            open.len(),
            schedules.len()
        )))
    }

    async fn live_schedules(&mut self) -> Result<Vec<String>, Failure> {
        let mut live = Vec::new();
        for schedule_id in self.schedules.clone() {
            let schedule = self
                .store()
                .schedule(NAMESPACE, &schedule_id)
                .await
                .map_err(|e| self.fail(format!("schedule: {e}")))?;
            if schedule.is_some() {
                live.push(schedule_id);
            }
        }
        Ok(live)
    }

    async fn open_workflows(&mut self) -> Result<Vec<String>, Failure> {
        let mut open = Vec::new();
        for workflow_id in self.instances.iter().cloned().collect::<Vec<_>>() {
            let run = self
                .store()
                .load_run(NAMESPACE, RunLocator::Current(WorkflowId(workflow_id.clone())))
                .await
                .map_err(|e| self.fail(format!("load: {e}")))?;
            let Some(run) = run else { continue };
            // A run nobody polled yet (a child closed with its parent) is checked too.
            if !self.run_workflows.contains_key(run.run_id.as_str()) {
                self.acknowledge(&run);
            }
            if !run.is_closed() {
                open.push(workflow_id);
            }
        }
        Ok(open)
    }

    // -----------------------------------------------------------------------------------------
    // Actions

    async fn start_workflow(&mut self) -> Result<(), Failure> {
        if self.programs.len() >= self.config.workflows {
            return self.advance_clock().await;
        }
        if self.rng.random_bool(0.2) {
            return self.start_standalone_activity().await;
        }
        if self.rng.random_bool(0.2) {
            // A line of plain activities that fails with a failed one: a client may redrive it.
            let steps = self.rng.random_range(2..=4);
            let program = std::iter::once(Step::FailWithActivity).chain((0..steps).map(|_| Step::Activity(PLAIN)));
            return self.start_program(program.collect()).await;
        }
        let length = self.rng.random_range(1..=5);
        let mut signals = 0;
        let mut continued = false;
        let program: Vec<Step> = (0..length)
            .map(|_| match self.rng.random_range(0..15) {
                13..=14 => Step::LocalActivity,
                0..=2 => Step::Activity(PLAIN),
                3..=4 => Step::Activity(DECLARED),
                5..=6 => Step::Timer(self.rng.random_range(1..=5)),
                7..=8 => {
                    signals += 1;
                    Step::Signal(signals)
                }
                9 => Step::Child,
                10 if self.rng.random_bool(0.5) => Step::Nexus(capstan_engine::service_call::CallMode::Sync),
                10 => Step::Nexus(capstan_engine::service_call::CallMode::Async),
                11 => Step::SessionActivity,
                _ if continued => Step::Stream,
                _ => {
                    continued = true;
                    Step::ContinueAsNew
                }
            })
            .collect();
        self.start_program(program).await
    }

    /// A client starts a workflow that runs `program`, sometimes twice (a lost response).
    async fn start_program(&mut self, program: Vec<Step>) -> Result<(), Failure> {
        let index = self.programs.len();
        let workflow_id = format!("sim-{}-{index}", self.config.seed);
        self.trace(|| format!("start {workflow_id} {program:?}"));
        let start = control::StartRequest {
            namespace: NAMESPACE.into(),
            workflow_id: Some(workflow_id.clone()),
            workflow_type: WORKFLOW_TYPE.into(),
            task_queue: QUEUE.into(),
            input: self.start_input(&workflow_id).await?,
            execution_timeout_seconds: None,
            run_timeout_seconds: None,
            business_key: None,
            memo: Map::new(),
            search_attributes: Map::new(),
            build_id: None,
            duplicate_policy: DuplicatePolicy::Fail,
            origin_trace: None,
            principal: Some(capstan_engine::Principal::token(SIMULATED_CLIENT)),
        };
        self.programs.insert(workflow_id.clone(), program);
        self.instances.insert(workflow_id.clone());
        let result = control::start(&self.app, start.clone()).await;
        let Some(started) = self.declined(result)? else {
            return Ok(());
        };
        self.acknowledge(&started.run);
        // A client retry of the same start (its response was lost) starts nothing new.
        if self.rng.random_bool(0.3) {
            let again = control::StartRequest {
                duplicate_policy: DuplicatePolicy::UseExisting,
                ..start
            };
            let again = control::start(&self.app, again).await;
            if let Some(repeated) = self.declined(again)? {
                if repeated.run.run_id != started.run.run_id {
                    return Err(self.fail(format!("a repeated start of {workflow_id} opened another run")));
                }
            }
        }
        Ok(())
    }

    fn worker(&mut self) -> String {
        format!("worker-{}", self.rng.random_range(0..WORKERS))
    }

    /// Registers the simulated workers (they answer queries).
    async fn register_workers(&mut self) -> Result<(), Failure> {
        for n in 0..WORKERS {
            let mut document = Map::new();
            document.insert(
                "capabilities".into(),
                json!([
                    "query_tasks",
                    "sticky_execution",
                    "worker_sessions",
                    "cooperative_cancellation",
                    "prepared_local_activities"
                ]),
            );
            let worker = capstan_store::WorkerRecord {
                namespace: NAMESPACE.into(),
                worker_id: format!("worker-{n}"),
                task_queue: QUEUE.into(),
                runtime: "simulated".into(),
                sdk_version: Some(SDK_VERSION.into()),
                build_id: None,
                supported_workflow_types: vec![WORKFLOW_TYPE.into(), CHILD_TYPE.into(), SCHEDULED_TYPE.into()],
                supported_activity_types: vec![PLAIN.into(), DECLARED.into(), probes::PROBE.into()],
                workflow_definition_fingerprints: Map::new(),
                document,
                status: "active".into(),
                registered_at: self.now,
                last_heartbeat_at: self.now,
            };
            let registered = self.store().register_worker(worker).await;
            registered.map_err(|e| self.fail(format!("register: {e}")))?;
        }
        self.retired.clear();
        Ok(())
    }

    /// A worker process goes away for good (its registration removed, as at shutdown or by an
    /// operator): its sticky runs and its worker sessions must move on to the others.
    async fn retire_worker(&mut self) -> Result<(), Failure> {
        let worker = self.worker();
        self.trace(|| format!("{worker} retires"));
        let gone = self.store().deregister_worker(NAMESPACE, &worker).await;
        gone.map_err(|e| self.fail(format!("deregister: {e}")))?;
        self.retired.insert(worker);
        self.report.workers_retired += 1;
        Ok(())
    }

    /// A worker's poll for a task of `kind`, as the server runs it (one look).
    async fn poll(&self, owner: &str, kind: TaskKind, lease_ms: i64) -> Result<Option<(Task, RunState)>, AppError> {
        let worker = polls::poller(&self.app, NAMESPACE, owner, QUEUE, None).await?;
        let poll = polls::Poll {
            namespace: NAMESPACE.into(),
            worker,
            kind,
            poll_request_id: None,
            lease_ms,
        };
        Ok(polls::claim(&self.app, &poll).await?.into_lease())
    }

    /// A polling worker is alive: its registration is refreshed.
    async fn alive(&mut self, owner: &str) -> Result<(), Failure> {
        let beat = self.store().heartbeat_worker(NAMESPACE, owner, self.now).await;
        beat.map_err(|e| self.fail(format!("worker heartbeat: {e}")))?;
        Ok(())
    }

    /// What a delivery's fate is: 0 at once, 1 later, 2 never (the worker crashed).
    fn fate(&mut self, faulty: bool) -> u8 {
        if !faulty {
            return 0;
        }
        match self.rng.random_range(0..100) {
            0..=64 => 0,
            65..=89 => 1,
            _ => 2,
        }
    }

    fn note_fence(&mut self, task: &Task) -> Result<(), Failure> {
        let previous = self.fences.insert(task.id.as_str().to_string(), task.fence);
        if let Some(previous) = previous.filter(|p| *p >= task.fence) {
            return Err(self.fail(format!(
                "task {} leased again with fence {} after fence {previous}",
                task.id, task.fence
            )));
        }
        Ok(())
    }

    /// A worker's report goes out at once, is held to arrive later, or is lost with the
    /// worker (see [`Sim::fate`]).
    async fn hand_over(&mut self, delivery: Delivery, faulty: bool) -> Result<(), Failure> {
        match self.fate(faulty) {
            0 => self.deliver(delivery).await?,
            1 => self.inflight.push(delivery),
            _ => self.report.lost_tasks += 1,
        }
        Ok(())
    }

    /// Polls one workflow task; returns whether one was leased.
    async fn poll_workflow_task(&mut self, faulty: bool) -> Result<bool, Failure> {
        let owner = self.worker();
        self.alive(&owner).await?;
        let claimed = self.poll(&owner, TaskKind::Workflow, WORKFLOW_LEASE_MS).await;
        let Some(Some((task, run))) = self.declined(claimed)? else {
            return Ok(false);
        };
        self.note_fence(&task)?;
        self.check_replay_mode(&task, &run, &owner)?;
        self.acknowledge(&run);
        if !self.deliver_requested_cancellation(&task, &run, &owner).await? {
            return Ok(true);
        }
        // Replays up to the next commands; a prepared local call on the way is run on the claim
        // and the replay goes on from the history it recorded (a released or abandoned claim
        // ends the task here).
        let mut local_calls = 0;
        let (run, commands) = loop {
            let run = self
                .store()
                .load_run(NAMESPACE, RunLocator::Task(task.id.clone()))
                .await
                .map_err(|e| self.fail(format!("load: {e}")))?
                .ok_or_else(|| self.fail(format!("the run of task {} is gone", task.id)))?;
            let history = self
                .store()
                .history(&run.run_id, 0, run.last_sequence, run.last_sequence as usize + 1)
                .await
                .map_err(|e| self.fail(format!("history: {e}")))?;
            let program = self.program_for(run.workflow_id.as_str(), &run.workflow_type);
            let identity = command_identity(&task);
            let (commands, local) = decide(run.workflow_id.as_str(), &program, &history, &identity);
            let Some(call) = local else { break (run, commands) };
            local_calls += 1;
            if local_calls > 4 || !self.run_local_call(&task, &run, &owner, call, faulty).await? {
                return Ok(true);
            }
        };
        for command in &commands {
            if let WorkflowCommand::StartChildWorkflow(child) = command {
                // The child may come to exist: it must then finish too.
                self.instances.extend(child.workflow_id.clone());
            }
        }
        self.trace(|| {
            format!(
                "{owner} leased workflow task {} of {} (fence {}): {} command(s)",
                task.id,
                run.workflow_id,
                task.fence,
                commands.len()
            )
        });
        // Like an SDK with its cache on: a task that does not close the run may claim it.
        let claims = !commands.is_empty() && !commands.iter().any(WorkflowCommand::is_terminal) && self.rng.random_bool(0.5);
        let sticky = claims.then(|| StickyClaim {
            worker_id: owner.clone(),
            workflow_id: run.workflow_id.to_string(),
            run_id: run.run_id.to_string(),
            build_id: SDK_VERSION.into(),
            ttl_seconds: self.rng.random_range(1..=120),
            metrics: Map::new(),
        });
        let delivery = Delivery::CompleteWorkflowTask {
            task_id: task.id.clone(),
            owner,
            fence: task.fence,
            commands,
            sticky,
        };
        self.hand_over(delivery, faulty).await?;
        Ok(true)
    }

    async fn poll_activity_task(&mut self, faulty: bool) -> Result<bool, Failure> {
        let owner = self.worker();
        self.alive(&owner).await?;
        let claimed = self.poll(&owner, TaskKind::Activity, ACTIVITY_LEASE_MS).await;
        let Some(Some((task, run))) = self.declined(claimed)? else {
            return Ok(false);
        };
        self.note_fence(&task)?;
        self.acknowledge(&run);
        let TaskDetail::Activity {
            attempt_id: Some(attempt_id),
            ..
        } = task.detail.clone()
        else {
            return Err(self.fail(format!("activity task {} leased without an attempt id", task.id)));
        };
        self.check_session_holder(&task, &run, &owner).await?;
        let succeeds = !faulty || self.rng.random_bool(0.6);
        self.trace(|| {
            format!(
                "{owner} leased activity task {} of {} (attempt {attempt_id}), succeeds: {succeeds}",
                task.id, run.workflow_id
            )
        });
        let report = if succeeds {
            Delivery::CompleteActivity {
                task_id: task.id.clone(),
                attempt_id: attempt_id.clone(),
                owner: owner.clone(),
                result: match run.probe_of {
                    Some(_) => self.probe_answer(),
                    None => Payload::avro(PAYLOAD),
                },
            }
        } else {
            Delivery::FailActivity {
                task_id: task.id.clone(),
                attempt_id: attempt_id.clone(),
                owner: owner.clone(),
            }
        };
        if faulty && self.rng.random_bool(0.2) {
            self.inflight.push(Delivery::HeartbeatActivity {
                task_id: task.id.clone(),
                attempt_id: attempt_id.clone(),
                owner: owner.clone(),
            });
        }
        if faulty && self.rng.random_bool(0.2) {
            self.inflight.push(Delivery::RenewActivityLease {
                task_id: task.id.clone(),
                attempt_id,
                owner,
            });
        }
        // A client loses patience with a running activity: the run is asked to stop while the
        // attempt runs, so the delivery stops (or waits for) a live attempt.
        if faulty && self.rng.random_bool(0.08) {
            self.request_cooperative_cancellation(run.workflow_id.as_str()).await?;
            self.inflight.push(report);
            return Ok(true);
        }
        self.hand_over(report, faulty).await?;
        Ok(true)
    }

    /// Delivers a held report, chosen at random (reordering); sometimes keeps a copy to deliver
    /// again (duplication).
    async fn deliver_inflight(&mut self) -> Result<(), Failure> {
        if self.inflight.is_empty() {
            return self.advance_clock().await;
        }
        let index = self.rng.random_range(0..self.inflight.len());
        let delivery = if self.rng.random_bool(0.25) {
            self.report.duplicates_delivered += 1;
            self.inflight[index].clone()
        } else {
            self.inflight.remove(index)
        };
        if self.rng.random_bool(MID_COMMIT_CUTS) {
            return self.deliver_through_power_cut(delivery).await;
        }
        self.deliver(delivery).await
    }

    async fn deliver(&mut self, delivery: Delivery) -> Result<(), Failure> {
        let now = self.now;
        match delivery {
            Delivery::CompleteWorkflowTask {
                task_id,
                owner,
                fence,
                commands,
                sticky,
            } => {
                self.trace(|| format!("{owner} completes workflow task {task_id} (fence {fence})"));
                let lease = reports::WorkflowLease {
                    namespace: NAMESPACE.into(),
                    task_id,
                    owner,
                    attempt: fence,
                    principal: Some(capstan_engine::Principal::token(SIMULATED_WORKER)),
                };
                // Like the SDKs: a replay that yields nothing new fails the task as "waiting
                // for history", which closes it without history.
                let result = if commands.is_empty() {
                    let waiting = WorkflowTaskFailure {
                        message: "Workflow task waiting for scheduled history.".into(),
                        failure_type: Some(WAITING_FOR_HISTORY_FAILURE.into()),
                    };
                    reports::fail_workflow_task(&self.app, lease, waiting).await
                } else {
                    reports::complete_workflow_task(&self.app, lease, commands, sticky, StreamProgress::default()).await
                };
                if let Some((_, run)) = self.declined(result)? {
                    self.acknowledge(&run);
                }
            }
            Delivery::CompleteActivity {
                task_id,
                attempt_id,
                owner,
                result,
            } => {
                self.trace(|| format!("{owner} completes activity task {task_id}"));
                let lease = attempt_lease(task_id, attempt_id, owner);
                let result = reports::complete_activity(&self.app, lease, result).await;
                if let Some((_, run)) = self.declined(result)? {
                    self.acknowledge(&run);
                }
            }
            Delivery::FailActivity {
                task_id,
                attempt_id,
                owner,
            } => {
                self.trace(|| format!("{owner} fails activity task {task_id}"));
                let failure = ActivityFailure {
                    message: "simulated failure".into(),
                    failure_type: Some("SimulatedError".into()),
                    class: None,
                    code: None,
                    stack_trace: None,
                    non_retryable: false,
                    details: None,
                };
                let lease = attempt_lease(task_id, attempt_id, owner);
                let result = reports::fail_activity(&self.app, lease, failure).await;
                if let Some((_, run)) = self.declined(result)? {
                    self.acknowledge(&run);
                }
            }
            Delivery::HeartbeatActivity {
                task_id,
                attempt_id,
                owner,
            } => {
                self.trace(|| format!("{owner} heartbeats activity task {task_id}"));
                let details = json!({"progress": now - START});
                let lease = attempt_lease(task_id, attempt_id, owner);
                let result = reports::heartbeat_activity(&self.app, lease, ACTIVITY_LEASE_MS, Some(details)).await;
                if let Some((_, run)) = self.declined(result)? {
                    self.acknowledge(&run);
                }
            }
            Delivery::RenewActivityLease {
                task_id,
                attempt_id,
                owner,
            } => {
                self.trace(|| format!("{owner} renews the lease of activity task {task_id}"));
                let before = self.task_run_head(&task_id).await?;
                let lease = attempt_lease(task_id.clone(), attempt_id, owner.clone());
                let result = reports::renew_activity_lease(&self.app, lease, ACTIVITY_LEASE_MS, now).await;
                if let Some((grant, run)) = self.declined(result)? {
                    self.check_lease_grant(&task_id, &grant, &run, before, now)?;
                    self.report.lease_renewals += 1;
                }
            }
            Delivery::AcknowledgeStop {
                task_id,
                attempt_id,
                owner,
                request_id,
                fence,
            } => {
                self.trace(|| format!("{owner} acknowledges the stop of attempt {attempt_id} (task {task_id})"));
                let result = match fence {
                    Some(attempt) => {
                        let lease = reports::WorkflowLease {
                            namespace: NAMESPACE.into(),
                            task_id,
                            owner,
                            attempt,
                            principal: Some(capstan_engine::Principal::token(SIMULATED_WORKER)),
                        };
                        capstan_app::local_activities::acknowledge_stop(&self.app, lease, attempt_id, request_id).await
                    }
                    None => {
                        let lease = attempt_lease(task_id, attempt_id, owner);
                        capstan_app::cancellation::acknowledge_stop(&self.app, lease, request_id).await
                    }
                };
                if let Some((receipt, run)) = self.declined(result)? {
                    if !receipt.duplicate {
                        self.report.cancellations[3] += 1;
                    }
                    self.acknowledge(&run);
                }
            }
            Delivery::AnswerQuery { query_id, owner, attempt } => {
                self.trace(|| format!("{owner} answers query {query_id} (attempt {attempt})"));
                let before = self.query_run_head(&query_id).await?;
                let result = self
                    .store()
                    .answer_query_task(
                        NAMESPACE,
                        &query_id,
                        &owner,
                        attempt,
                        QueryOutcome::Result(Payload::avro(PAYLOAD)),
                        now,
                    )
                    .await;
                if self.refused(result)?.is_some() {
                    if self.queries.insert(query_id.clone(), true) == Some(true) {
                        return Err(self.fail(format!("query {query_id} accepted a second answer")));
                    }
                    self.report.queries_answered += 1;
                }
                if self.query_run_head(&query_id).await? != before {
                    return Err(self.fail(format!("answering query {query_id} changed its run's history")));
                }
            }
        }
        Ok(())
    }

    /// The history head of the run a query task reads.
    async fn query_run_head(&mut self, query_id: &str) -> Result<Option<(u64, String)>, Failure> {
        let task = self
            .store()
            .get_query_task(NAMESPACE, query_id)
            .await
            .map_err(|e| self.fail(format!("query task: {e}")))?;
        let Some(task) = task else { return Ok(None) };
        let run = self
            .store()
            .load_run(NAMESPACE, RunLocator::Run(WorkflowId(task.workflow_id), RunId(task.run_id)))
            .await
            .map_err(|e| self.fail(format!("load: {e}")))?;
        Ok(run.map(|r| (r.last_sequence, r.last_hash)))
    }

    async fn advance_clock(&mut self) -> Result<(), Failure> {
        let jump = self.rng.random_range(0..6_000);
        self.advance(jump);
        self.trace(|| format!("clock +{jump} ms"));
        self.node_pass(true).await
    }

    /// One of the workflows the clients started, at random.
    fn random_started_workflow(&mut self) -> Option<String> {
        pick(&mut self.rng, self.programs.keys())
    }

    async fn send_signal(&mut self) -> Result<(), Failure> {
        let Some(workflow_id) = self.random_started_workflow() else {
            return self.advance_clock().await;
        };
        self.signal_waiting(&workflow_id).await
    }

    /// Sends the signal the workflow's program waits for next (any of them, at random, in the
    /// faulty phase: signals may come before their wait opens).
    async fn signal_waiting(&mut self, workflow_id: &str) -> Result<(), Failure> {
        let signals: Vec<usize> = self
            .programs
            .get(workflow_id)
            .into_iter()
            .flatten()
            .filter_map(|s| match s {
                Step::Signal(n) => Some(*n),
                _ => None,
            })
            .collect();
        if signals.is_empty() {
            return Ok(());
        }
        let n = signals[self.rng.random_range(0..signals.len())];
        let name = format!("go-{n}");
        self.trace(|| format!("signal {name} to {workflow_id}"));
        let request = control::SignalRequest {
            target: target(workflow_id),
            signal_name: name,
            input: Payload::avro(PAYLOAD),
            request_id: None,
            trace: None,
            principal: Some(capstan_engine::Principal::token(SIMULATED_CLIENT)),
        };
        let result = control::signal(
            &self.app,
            request,
            |receipt: &CommandReceipt, _: &RunState| json!({"signal_id": receipt.signal_id}),
        )
        .await;
        if let Some(run) = self.declined(result)?.and_then(|receipt| receipt.run) {
            self.acknowledge(&run);
        }
        Ok(())
    }

    /// How often a keyed client command is sent: sometimes twice (the first response was lost).
    fn sends(&mut self) -> usize {
        if self.rng.random_bool(0.3) {
            2
        } else {
            1
        }
    }

    /// Judges the answers to the sends of one keyed command, in order: a retry must be answered
    /// from the first application's receipt; a second application, or a receipt with no
    /// application before it, fails the seed. Returns the application's receipt body and the
    /// bodies the retries got (None: refused).
    fn judge_keyed(
        &mut self,
        what: &str,
        request_id: &str,
        answers: Vec<Result<control::Receipt, AppError>>,
    ) -> Result<Option<(Value, Vec<Value>)>, Failure> {
        let mut applied: Option<Value> = None;
        let mut receipts = Vec::new();
        for answer in answers {
            match self.declined(answer)? {
                None => {}
                Some(receipt) if !receipt.retained && applied.is_some() => {
                    return Err(self.fail(format!("{what} request {request_id} was applied twice")))
                }
                Some(receipt) if !receipt.retained => {
                    let run = receipt
                        .run
                        .ok_or_else(|| self.fail(format!("a fresh {what} came without its run")))?;
                    self.acknowledge(&run);
                    applied = Some(receipt.body);
                }
                Some(receipt) if applied.is_none() => {
                    return Err(self.fail(format!(
                        "{what} request {request_id} has a receipt ({}) but was never applied",
                        receipt.body
                    )))
                }
                Some(receipt) => receipts.push(receipt.body),
            }
        }
        Ok(applied.map(|body| (body, receipts)))
    }

    /// A client sends an update; a retry must get the first acceptance's update id back.
    async fn send_update(&mut self) -> Result<(), Failure> {
        let Some(workflow_id) = self.random_started_workflow() else {
            return self.advance_clock().await;
        };
        let key = CommandKey {
            command_type: "update".into(),
            request_id: format!("update-{}", self.step),
            intent_hash: format!("{UPDATE_NAME}:{PAYLOAD}"),
        };
        let command_id = CommandId(self.app.new_id());
        let mut answers = Vec::new();
        for send in 1..=self.sends() {
            self.trace(|| format!("update to {workflow_id} (request {}, send {send})", key.request_id));
            let command_id = command_id.clone();
            let transition = move |run: &mut RunState, cx: &mut Cx| {
                admit_update(run, UPDATE_NAME, None)?;
                accept_update(run, cx, UPDATE_NAME, Payload::avro(PAYLOAD), command_id)
            };
            let render = |(update_id, _): &(String, CommandReceipt), run: &RunState| json!({"update_id": update_id, "run_id": run.run_id});
            let locator = RunLocator::Current(WorkflowId(workflow_id.clone()));
            answers.push(control::apply(&self.app, NAMESPACE, locator, Some(key.clone()), transition, render).await);
        }
        let Some((applied, receipts)) = self.judge_keyed("update", &key.request_id, answers)? else {
            return Ok(());
        };
        let update_id = applied["update_id"].as_str().unwrap_or_default().to_string();
        self.report.updates_accepted += 1;
        for body in receipts {
            if body["update_id"].as_str() != Some(update_id.as_str()) {
                return Err(self.fail(format!("a retried update answered {body} from its receipt, not update {update_id}")));
            }
            self.report.update_retries_answered_from_receipt += 1;
        }
        Ok(())
    }

    /// A client asks a workflow to stop cooperatively: the run stays open until a worker
    /// delivers the request at a call and the workflow's cleanup ends it, or the cleanup
    /// deadline does.
    async fn request_cooperative_cancellation(&mut self, workflow_id: &str) -> Result<(), Failure> {
        self.trace(|| format!("cooperative cancellation requested for {workflow_id}"));
        let cleanup_seconds = self.rng.random_range(20..=120);
        let result = capstan_app::cancellation::request(
            &self.app,
            target(workflow_id),
            Some("simulated".into()),
            cleanup_seconds,
            Some(capstan_engine::Principal::token(SIMULATED_CLIENT)),
        )
        .await;
        if let Some((outcome, run)) = self.declined(result)? {
            if !outcome.duplicate {
                self.report.cancellations[0] += 1;
            }
            self.acknowledge(&run);
        }
        Ok(())
    }

    /// A client cancels or terminates a workflow: its children are terminated by their
    /// parent-close policy, its open calls end, a dispatched declared action becomes
    /// `outcome_unknown`.
    async fn close_workflow(&mut self) -> Result<(), Failure> {
        let Some(workflow_id) = self.random_started_workflow() else {
            return self.advance_clock().await;
        };
        if self.rng.random_bool(0.4) {
            return self.request_cooperative_cancellation(&workflow_id).await;
        }
        let kind = if self.rng.random_bool(0.5) {
            CloseCommand::Cancel
        } else {
            CloseCommand::Terminate
        };
        let request_id = format!("close-{}", self.step);
        let mut answers = Vec::new();
        for send in 1..=self.sends() {
            self.trace(|| format!("{kind:?} to {workflow_id} (request {request_id}, send {send})"));
            let request = control::CloseRequest {
                target: target(&workflow_id),
                kind,
                reason: Some("simulated client".into()),
                request_id: Some(request_id.clone()),
                trace: None,
                principal: Some(capstan_engine::Principal::token(SIMULATED_CLIENT)),
            };
            let render = |receipt: &CommandReceipt, _: &RunState| json!({"command_id": receipt.command_id});
            answers.push(control::close(&self.app, request, render).await);
        }
        let what = format!("{kind:?}").to_lowercase();
        let sent = self.judge_keyed(&what, &request_id, answers)?;
        if sent.is_some() {
            self.report.closed_by_clients += 1;
        }
        // Its children heard of it in the same transaction: check them now.
        let children = format!("{workflow_id}-r");
        let runs: Vec<String> = self
            .run_workflows
            .iter()
            .filter(|(_, w)| w.starts_with(&children))
            .map(|(r, _)| r.clone())
            .collect();
        self.touched.extend(runs);
        Ok(())
    }

    /// A client queries a workflow: a query task for a worker, which never touches history.
    async fn send_query(&mut self) -> Result<(), Failure> {
        let Some(workflow_id) = pick(&mut self.rng, self.instances.iter()) else {
            return self.advance_clock().await;
        };
        let request = queries::QueryRequest {
            namespace: NAMESPACE.into(),
            workflow_id: workflow_id.clone(),
            run_id: None,
            query_name: "status".into(),
            arguments: None,
            wait_ms: QUERY_WAIT_MS,
            principal: Some(capstan_engine::Principal::token(SIMULATED_CLIENT)),
        };
        let head = self
            .store()
            .load_run(NAMESPACE, RunLocator::Current(WorkflowId(workflow_id.clone())))
            .await;
        let before = head
            .map_err(|e| self.fail(format!("load: {e}")))?
            .map(|run| (run.last_sequence, run.last_hash));
        let put = queries::put_query(&self.app, request).await;
        let Some((task, _)) = self.declined(put)? else {
            return Ok(());
        };
        let id = task.id.clone();
        self.trace(|| format!("query status of {workflow_id} (query task {id})"));
        self.queries.insert(id.clone(), false);
        if self.query_run_head(&id).await? != before {
            return Err(self.fail(format!("query {id} changed the history of {workflow_id}")));
        }
        self.check_query_audited(&workflow_id, &id).await
    }

    /// A query writes no history: the instance's audit trail names who asked it.
    async fn check_query_audited(&self, workflow_id: &str, query_task_id: &str) -> Result<(), Failure> {
        let trail = self
            .store()
            .audit_events(NAMESPACE, workflow_id, None, 100_000)
            .await
            .map_err(|e| self.fail(format!("audit: {e}")))?;
        let asked = trail
            .iter()
            .filter(|event| event.detail.get("query_task_id").and_then(Value::as_str) == Some(query_task_id))
            .map(|event| event.principal.clone())
            .collect::<Vec<_>>();
        match asked.as_slice() {
            [Some(principal)] if principal.id == SIMULATED_CLIENT => Ok(()),
            other => Err(self.fail(format!("query {query_task_id} of {workflow_id}: audit trail records {other:?}"))),
        }
    }

    /// A worker polls for a query task; returns whether one was leased.
    async fn poll_query_task(&mut self, faulty: bool) -> Result<bool, Failure> {
        let owner = self.worker();
        self.alive(&owner).await?;
        let claimed = self
            .store()
            .claim_query_task(NAMESPACE, QUEUE, QueryKind::Query, &owner, QUERY_LEASE_MS, self.now)
            .await;
        let Some(Some(task)) = self.refused(claimed)? else {
            return Ok(false);
        };
        if task.is_answered() || !self.queries.contains_key(&task.id) {
            return Err(self.fail(format!("query task {} leased though answered or unknown", task.id)));
        }
        self.trace(|| format!("{owner} leased query task {} (attempt {})", task.id, task.attempt));
        let delivery = Delivery::AnswerQuery {
            query_id: task.id,
            owner,
            attempt: task.attempt,
        };
        self.hand_over(delivery, faulty).await?;
        Ok(true)
    }

    /// Creates the seed's schedules (every overlap policy over the seeds, a few runs each), or
    /// pauses or resumes one.
    async fn change_schedules(&mut self) -> Result<(), Failure> {
        if self.schedules.len() < SCHEDULES && (self.schedules.is_empty() || self.rng.random_bool(0.5)) {
            let schedule_id = format!("schedule-{}", self.schedules.len());
            let every = self.rng.random_range(10..=40);
            let policies = [
                OverlapPolicy::Skip,
                OverlapPolicy::BufferOne,
                OverlapPolicy::BufferAll,
                OverlapPolicy::CancelOther,
                OverlapPolicy::TerminateOther,
                OverlapPolicy::AllowAll,
            ];
            let policy = policies[self.rng.random_range(0..policies.len())];
            let max_runs = self.rng.random_range(2..=4);
            let spec = json!({"intervals": [{"every": format!("PT{every}S")}]});
            let action = json!({"workflow_type": SCHEDULED_TYPE, "task_queue": QUEUE});
            let fields = ScheduleFields {
                overlap_policy: Some(policy),
                max_runs: Some(max_runs),
                input_payload: Some(Payload::avro(PAYLOAD)),
                ..ScheduleFields::default()
            };
            let schedule = Schedule::create(
                NAMESPACE,
                &schedule_id,
                spec.as_object().cloned().unwrap_or_default(),
                action.as_object().expect("an object"),
                fields,
                false,
                self.now,
            )
            .map_err(|e| self.fail(format!("schedule spec: {e:?}")))?;
            self.trace(|| format!("create {schedule_id}: every {every} s, {policy:?}, {max_runs} runs"));
            let result = self.store().create_schedule(schedule).await;
            self.refused(result)?;
            self.schedules.push(schedule_id);
            return Ok(());
        }
        let index = self.rng.random_range(0..self.schedules.len());
        let schedule_id = self.schedules[index].clone();
        let pause = self.rng.random_bool(0.5);
        self.pause_or_resume(&schedule_id, pause).await
    }

    async fn pause_or_resume(&mut self, schedule_id: &str, pause: bool) -> Result<(), Failure> {
        self.trace(|| format!("{} {schedule_id}", if pause { "pause" } else { "resume" }));
        let now = self.now;
        let result = self
            .store()
            .change_schedule(NAMESPACE, schedule_id, move |schedule| {
                if pause {
                    schedule.pause(None, now);
                } else if schedule.paused_at.is_some() {
                    schedule.resume(None, now);
                }
                Ok(())
            })
            .await;
        self.refused(result)?;
        Ok(())
    }

    /// Every occurrence of a schedule started at most one workflow, and every workflow it
    /// started exists (and must finish).
    async fn check_schedule(&mut self, schedule_id: &str) -> Result<(), Failure> {
        let events = self
            .store()
            .schedule_history(NAMESPACE, schedule_id, 0, 100_000)
            .await
            .map_err(|e| self.fail(format!("schedule history: {e}")))?
            .unwrap_or_default();
        let mut occurrences = BTreeSet::new();
        for event in events.iter().filter(|e| e.event_type == "ScheduleTriggered") {
            let occurrence = event.payload.get("occurrence_time").and_then(Value::as_str).unwrap_or("");
            if !occurrences.insert(occurrence.to_string()) {
                return Err(self.fail(format!("{schedule_id}: occurrence {occurrence} started twice")));
            }
            let Some(workflow_id) = event.workflow_id.clone() else {
                return Err(self.fail(format!("{schedule_id}: a trigger without its workflow")));
            };
            if self.instances.insert(workflow_id.clone()) {
                self.report.scheduled_starts += 1;
            }
            let exists = self
                .store()
                .load_run(NAMESPACE, RunLocator::Current(WorkflowId(workflow_id.clone())))
                .await
                .map_err(|e| self.fail(format!("load: {e}")))?;
            match exists {
                Some(run) => {
                    if !self.acked.contains_key(run.run_id.as_str()) {
                        self.acknowledge(&run);
                    }
                }
                None => return Err(self.fail(format!("{schedule_id} started {workflow_id}, which does not exist"))),
            }
        }
        Ok(())
    }

    async fn resolve_unknown(&mut self) -> Result<(), Failure> {
        if !self.resolve_one_unknown().await? {
            self.advance_clock().await?;
        }
        Ok(())
    }

    /// An operator settles one `outcome_unknown` entry (either way); returns whether one was
    /// settled.
    async fn resolve_one_unknown(&mut self) -> Result<bool, Failure> {
        let filter = LedgerFilter {
            state: Some(LedgerState::OutcomeUnknown),
            ..LedgerFilter::default()
        };
        let entries = self
            .store()
            .ledger_entries(NAMESPACE, filter, 100)
            .await
            .map_err(|e| self.fail(format!("ledger: {e}")))?;
        let Some(entry) = entries.into_iter().next() else {
            return Ok(false);
        };
        let decision = if self.rng.random_bool(0.5) {
            LedgerDecision::EffectAbsent
        } else {
            LedgerDecision::EffectConfirmed {
                result: Payload::avro(PAYLOAD),
            }
        };
        self.trace(|| format!("operator resolves {} ({:?})", entry.ledger_key, decision));
        let resolution = ledger::Resolution {
            namespace: NAMESPACE.into(),
            ledger_key: entry.ledger_key,
            decision,
            evidence: json!({"note": "simulated operator"}),
            principal: capstan_engine::Principal::token(SIMULATED_OPERATOR),
        };
        let result = ledger::resolve(&self.app, resolution).await;
        let Some((_, run)) = self.declined(result)? else {
            return Ok(false);
        };
        self.report.outcome_unknown_resolved += 1;
        self.acknowledge(&run);
        Ok(true)
    }

    /// The machine loses power: the server comes back on what its disk held, every write a
    /// file had not fsynced lost. Everything acknowledged must still be there (`check_all`).
    async fn power_cut(&mut self) -> Result<(), Failure> {
        let (from, to) = (self.disk_dir(), self.next_disk_dir());
        let lost = power::durable_image(&from, &to).map_err(|e| self.fail(format!("power cut: {e}")))?;
        self.trace(|| format!("power cut ({lost} unsynced writes lost)"));
        self.back_on_next_disk(&from, lost).await
    }

    /// The power fails while the server commits a worker's report, at the commit's sync: just
    /// before it reaches the disk or just after. Nobody hears the answer, so nothing it
    /// acknowledged counts, and the worker sends the report again later (at-least-once).
    async fn deliver_through_power_cut(&mut self, delivery: Delivery) -> Result<(), Failure> {
        let (from, to) = (self.disk_dir(), self.next_disk_dir());
        let after_sync = self.rng.random_bool(0.5);
        power::arm_cut(&from, &to, after_sync);
        let (acked, queries) = (self.acked.clone(), self.queries.clone());
        let delivered = self.deliver(delivery.clone()).await;
        let fired = power::fired_cut(&from);
        delivered?;
        let Some(image) = fired else {
            return Ok(()); // nothing was written: an ordinary step
        };
        let lost = image.map_err(|e| self.fail(format!("power cut: {e}")))?;
        let when = if after_sync { "after" } else { "before" };
        self.trace(|| format!("power cut inside a commit, {when} its sync ({lost} unsynced writes lost)"));
        self.acked = acked;
        self.queries = queries;
        self.inflight.push(delivery);
        self.report.mid_commit_cuts += 1;
        self.back_on_next_disk(&from, lost).await
    }

    /// After a power cut: the server comes back on the next disk, which holds what `from` had
    /// synced. Everything acknowledged must still be there (`check_all`).
    async fn back_on_next_disk(&mut self, from: &Path, lost: usize) -> Result<(), Failure> {
        self.disk += 1;
        self.report.power_cuts += 1;
        self.report.unsynced_writes_lost += lost;
        // The old machine's files stay behind, never read again.
        self.app.store = None;
        power::forget(from);
        let _ = std::fs::remove_dir_all(from);
        self.open()?;
        self.check_all().await
    }

    /// The server process goes away and comes back on the same database file. Workers keep
    /// what they hold; their leases are still valid or expire as usual.
    async fn restart(&mut self) -> Result<(), Failure> {
        self.trace(|| "server restart".to_string());
        self.report.restarts += 1;
        self.app.store = None;
        self.open()?;
        self.check_all().await
    }
}

fn target(workflow_id: &str) -> control::Target {
    control::Target {
        namespace: NAMESPACE.into(),
        workflow_id: workflow_id.to_string(),
        run_id: None,
    }
}

fn attempt_lease(task_id: TaskId, attempt_id: ActivityAttemptId, owner: String) -> reports::AttemptLease {
    reports::AttemptLease {
        namespace: NAMESPACE.into(),
        task_id,
        attempt_id,
        owner,
        principal: Some(capstan_engine::Principal::token(SIMULATED_WORKER)),
    }
}

/// Runs one seed; a panic anywhere in the engine or store is a failure of that seed too.
pub async fn run_caught(config: Config) -> Result<Report, Failure> {
    let seed = config.seed;
    // On a thread of its own with its own single-threaded runtime: a seed runs on one thread
    // anyway, and its future need not be `Send` (rustc cannot prove it for the store's
    // futures over borrowed arguments, a known limit of its higher-ranked reasoning).
    let seeded = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(run(config))
    });
    match seeded.await {
        Ok(result) => result,
        Err(error) => Err(Failure {
            seed,
            step: 0,
            message: format!("panicked: {error}"),
        }),
    }
}

/// Sums of many seeds' reports.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub seeds: usize,
    pub steps: usize,
    pub workflows: usize,
    pub restarts: usize,
    pub duplicates: usize,
    pub lost_tasks: usize,
    pub unknown_resolved: usize,
    pub updates: usize,
    pub update_retries: usize,
    pub queries: usize,
    pub children: usize,
    pub continued: usize,
    pub scheduled: usize,
    pub closed: usize,
    pub replay_modes: [usize; 3],
    pub session_attempts: usize,
    pub workers_retired: usize,
    pub lease_renewals: usize,
    pub cancellations: [usize; 4],
    pub local_attempts: [usize; 4],
    pub standalone: usize,
    pub redrives: usize,
    /// Stream messages ingested / retries answered from the receipt / reused ids refused.
    pub messages: [usize; 3],
    pub stream_items: usize,
    pub payloads_collected: usize,
    pub service_calls: usize,
    /// Node pauses, duty take-overs, the woken nodes' stale duties `[applied, refused]`, and
    /// their schedule starts.
    pub node_pauses: usize,
    pub duty_takeovers: usize,
    pub zombie_duties: [usize; 2],
    pub zombie_firings: usize,
    pub power_cuts: usize,
    pub unsynced_writes_lost: usize,
    pub mid_commit_cuts: usize,
    pub probes: [usize; 4],
    pub refusals: BTreeMap<String, usize>,
}

impl Totals {
    pub fn add(&mut self, report: &Report) {
        self.seeds += 1;
        self.steps += report.steps;
        self.workflows += report.completed;
        self.restarts += report.restarts;
        self.duplicates += report.duplicates_delivered;
        self.lost_tasks += report.lost_tasks;
        self.unknown_resolved += report.outcome_unknown_resolved;
        self.updates += report.updates_accepted;
        self.update_retries += report.update_retries_answered_from_receipt;
        self.queries += report.queries_answered;
        self.children += report.children_started;
        self.continued += report.continued_as_new;
        self.scheduled += report.scheduled_starts;
        self.closed += report.closed_by_clients;
        for (total, seen) in self.replay_modes.iter_mut().zip(report.replay_modes) {
            *total += seen;
        }
        self.session_attempts += report.session_attempts;
        self.workers_retired += report.workers_retired;
        self.lease_renewals += report.lease_renewals;
        self.standalone += report.standalone_started;
        self.redrives += report.redrives;
        self.messages[0] += report.messages_ingested;
        self.messages[1] += report.message_retries;
        self.messages[2] += report.message_conflicts;
        self.stream_items += report.stream_items;
        self.payloads_collected += report.payloads_collected;
        self.service_calls += report.service_calls;
        self.node_pauses += report.node_pauses;
        self.duty_takeovers += report.duty_takeovers;
        self.zombie_duties[0] += report.zombie_duties[0];
        self.zombie_duties[1] += report.zombie_duties[1];
        self.zombie_firings += report.zombie_firings;
        self.power_cuts += report.power_cuts;
        self.unsynced_writes_lost += report.unsynced_writes_lost;
        self.mid_commit_cuts += report.mid_commit_cuts;
        for (total, n) in self.probes.iter_mut().zip(report.probes) {
            *total += n;
        }
        for (total, seen) in self.local_attempts.iter_mut().zip(report.local_attempts) {
            *total += seen;
        }
        for (total, seen) in self.cancellations.iter_mut().zip(report.cancellations) {
            *total += seen;
        }
        for (reason, count) in &report.refusals {
            *self.refusals.entry(reason.clone()).or_default() += count;
        }
    }

    pub fn summary(&self) -> String {
        let refusals: Vec<String> = self.refusals.iter().map(|(r, n)| format!("{r} {n}")).collect();
        format!(
            "{} seeds, {} steps, {} workflows finished ({} children, {} scheduled, {} continued runs), {} updates ({} retries answered from the receipt), {} queries answered, {} cancelled or terminated by clients, {} restarts, {} duplicate deliveries, {} lost tasks, {} unknown outcomes resolved, workflow leases cold/sticky-hit/forced-cold {}/{}/{}, {} session activity attempts, {} workers retired, {} activity leases renewed, cooperative cancellations requested/delivered/deferred/stops acknowledged {}/{}/{}/{}, prepared local attempts admitted/retried/recovered/stopped {}/{}/{}/{}, {} standalone activities, {} redrives, stream messages ingested/retries answered/reused ids refused {}/{}/{}, {} output-stream items checked, {} unused uploads collected, {} Nexus calls' linked runs, {} node pauses ({} duty take-overs; woken nodes' stale duties applied/refused {}/{}, schedule starts {}), {} power cuts ({} inside a commit; {} unsynced writes lost), probe answers found/absent/inconclusive/after the operator {}/{}/{}/{}; refusals: {}",
            self.seeds,
            self.steps,
            self.workflows,
            self.children,
            self.scheduled,
            self.continued,
            self.updates,
            self.update_retries,
            self.queries,
            self.closed,
            self.restarts,
            self.duplicates,
            self.lost_tasks,
            self.unknown_resolved,
            self.replay_modes[0],
            self.replay_modes[1],
            self.replay_modes[2],
            self.session_attempts,
            self.workers_retired,
            self.lease_renewals,
            self.cancellations[0],
            self.cancellations[1],
            self.cancellations[2],
            self.cancellations[3],
            self.local_attempts[0],
            self.local_attempts[1],
            self.local_attempts[2],
            self.local_attempts[3],
            self.standalone,
            self.redrives,
            self.messages[0],
            self.messages[1],
            self.messages[2],
            self.stream_items,
            self.payloads_collected,
            self.service_calls,
            self.node_pauses,
            self.duty_takeovers,
            self.zombie_duties[0],
            self.zombie_duties[1],
            self.zombie_firings,
            self.power_cuts,
            self.mid_commit_cuts,
            self.unsynced_writes_lost,
            self.probes[0],
            self.probes[1],
            self.probes[2],
            self.probes[3],
            if refusals.is_empty() { "none".to_string() } else { refusals.join(", ") }
        )
    }
}
