//! The world the simulated clients and workers act in: the seed's random choices, the
//! simulated clock and the step count (with the trace every step writes into the digest), the
//! disk the server's SQLite file lives on with the power cuts and restarts that take the server
//! away, and the services (`SimServices`) the `capstan_app` use cases run on. Everyone acting
//! adds to its counters and to what it has [`Seen`] acknowledged.
//!
//! Its other rooms: `power`, the VFS shim that makes power cuts lose unsynced writes; `nodes`,
//! the server nodes running the background duties; `seen`.

pub(crate) mod nodes;
mod power;
pub(crate) mod seen;

use crate::report::{Counters, Failure, Report};
use crate::workload::{Config, NAMESPACE, START};
use capstan_app::{AppError, Services};
use capstan_engine::{Limits, MemoBase, MemoCodec, MergedMemo, Millis, Payload, RunId, RunState, TaskId, WorkflowId};
use capstan_store::{
    BuildIdRollout, FleetStore, ManualClock, RunLocator, RunStore, SeededIds, Sources, SqliteStore, StoreError, StoreResult, TaskStore,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seen::Seen;
use serde_json::Value;
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What the use cases run on in a simulation: the store (reopened on a restart), a manual
/// clock and seeded ids.
pub(crate) struct SimServices {
    store: Option<SqliteStore>,
    clock: Arc<ManualClock>,
    sources: Sources,
    limits: Limits,
    registrations: capstan_app::polls::KnownRegistrations,
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

    fn known_registrations(&self) -> Option<&capstan_app::polls::KnownRegistrations> {
        Some(&self.registrations)
    }

    async fn rollouts(&self, namespace: &str, queue: &str) -> StoreResult<Vec<BuildIdRollout>> {
        self.store().build_id_rollouts(namespace, queue).await
    }
}

/// Payload blobs as JSON text where they are JSON (probe questions and answers), the fixed
/// workload payload as a string: the simulator checks logic, not the SDKs' Avro.
pub(crate) struct SimCodec;

impl MemoCodec for SimCodec {
    fn merge(&self, _: MemoBase<'_>, _: &Payload) -> Result<MergedMemo, String> {
        Err("the simulated workload keeps no memo".into())
    }

    fn to_json(&self, payload: &Payload) -> Result<Value, String> {
        Ok(serde_json::from_str(&payload.blob).unwrap_or_else(|_| Value::String(payload.blob.clone())))
    }

    fn json_to_payload(&self, value: &Value) -> Result<Payload, String> {
        Ok(Payload::avro(value.to_string()))
    }
}

pub(crate) static SIM_CODEC: SimCodec = SimCodec;

/// What an action came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acted {
    /// It did what it came for (or was refused doing it).
    Done,
    /// It found nothing to act on: the time passes instead.
    Idle,
    /// The power failed on the way, and the server is back on the next disk: everything
    /// acknowledged must still be there.
    ServerBack,
}

/// A power cut armed to fail inside the next commit on the server's disk.
pub(crate) struct CommitCut {
    /// The disk the server runs on.
    pub(crate) disk: PathBuf,
    /// Whether the sync in progress reaches the disk before the power fails.
    pub(crate) after_sync: bool,
}

impl CommitCut {
    /// Disarms the cut; what it did if it happened (the unsynced writes it dropped).
    pub(crate) fn fired(&self) -> Option<std::io::Result<usize>> {
        power::fired_cut(&self.disk)
    }
}

pub(crate) struct World {
    pub(crate) config: Config,
    /// Every choice the seed makes, in the order they are made.
    pub(crate) rng: StdRng,
    /// The simulated time (what the store and the use cases read).
    pub(crate) now: Millis,
    pub(crate) step: usize,
    pub(crate) app: SimServices,
    pub(crate) seen: Seen,
    pub(crate) counters: Counters,
    dir: tempfile::TempDir,
    /// Which disk the server runs on: a power cut moves it to a fresh one holding what the
    /// last one had synced.
    disk: usize,
    digest: Cell<u64>,
}

impl World {
    /// A world at the start of the simulated time, its server up on a fresh disk.
    pub(crate) fn new(config: Config) -> Result<World, Failure> {
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
        let mut world = World {
            rng: StdRng::seed_from_u64(config.seed),
            config,
            now: START,
            step: 0,
            app: SimServices {
                store: None,
                clock,
                sources,
                limits: Limits::default(),
                registrations: Default::default(),
            },
            seen: Seen::default(),
            counters: Counters::default(),
            dir,
            disk: 0,
            digest: Cell::new(0),
        };
        world.open()?;
        Ok(world)
    }

    /// The seed's report, once it ran to the end.
    pub(crate) fn into_report(self, calm_rounds: usize) -> Report {
        Report {
            seed: self.config.seed,
            steps: self.step,
            workflows: self.seen.instances.len(),
            calm_rounds,
            digest: self.digest.get(),
            counters: self.counters,
        }
    }

    pub(crate) fn fail(&self, message: impl Into<String>) -> Failure {
        Failure {
            seed: self.config.seed,
            step: self.step,
            message: message.into(),
        }
    }

    pub(crate) fn store(&self) -> &SqliteStore {
        self.app.store()
    }

    /// Where the runtime transport keeps uploaded payloads (it outlives the server's disks).
    pub(crate) fn payloads_dir(&self) -> PathBuf {
        self.dir.path().join("payloads")
    }

    /// Every step's line (with the ids it touched) goes into the run's digest; `--trace` prints
    /// it too. Two runs of a seed must end with the same digest.
    pub(crate) fn trace(&self, what: impl FnOnce() -> String) {
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
    pub(crate) fn refused<T>(&mut self, result: Result<T, StoreError>) -> Result<Option<T>, Failure> {
        match result {
            Ok(value) => Ok(Some(value)),
            Err(StoreError::Refused(refusal)) => {
                self.trace(|| format!("    refused: {}", refusal.reason.as_str()));
                *self.counters.refusals.entry(refusal.reason.as_str().to_string()).or_default() += 1;
                Ok(None)
            }
            Err(other) => Err(self.fail(format!("store error: {other}"))),
        }
    }

    /// [`World::refused`] for a use case's answer; a request the simulator sends is never invalid.
    pub(crate) fn declined<T>(&mut self, result: Result<T, AppError>) -> Result<Option<T>, Failure> {
        match result {
            Ok(value) => Ok(Some(value)),
            Err(AppError::Store(error)) => self.refused(Err(error)),
            Err(invalid) => Err(self.fail(format!("a simulated request was invalid: {invalid}"))),
        }
    }

    // -----------------------------------------------------------------------------------------
    // Reads

    /// The current run of an instance.
    pub(crate) async fn current_run(&self, workflow_id: &str) -> Result<Option<RunState>, Failure> {
        self.store()
            .load_run(NAMESPACE, RunLocator::Current(WorkflowId(workflow_id.to_string())))
            .await
            .map_err(|e| self.fail(format!("load: {e}")))
    }

    /// The history head of the run that owns `task_id`.
    pub(crate) async fn task_run_head(&self, task_id: &TaskId) -> Result<Option<(u64, String)>, Failure> {
        let run = self
            .store()
            .load_run(NAMESPACE, RunLocator::Task(task_id.clone()))
            .await
            .map_err(|e| self.fail(format!("load: {e}")))?;
        Ok(run.map(|r| (r.last_sequence, r.last_hash)))
    }

    /// The history head of the run a query task reads.
    pub(crate) async fn query_run_head(&self, query_id: &str) -> Result<Option<(u64, String)>, Failure> {
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

    // -----------------------------------------------------------------------------------------
    // Time

    /// Moves the simulated time (the clock the store and the use cases read) forward.
    pub(crate) fn advance(&mut self, by: Millis) {
        self.now = self.app.clock.advance(by);
    }

    /// The clock jumps ahead by up to 6 s (the nodes' duty pass that follows is the driver's).
    pub(crate) fn jump_clock(&mut self) {
        let jump = self.rng.random_range(0..6_000);
        self.advance(jump);
        self.trace(|| format!("clock +{jump} ms"));
    }

    // -----------------------------------------------------------------------------------------
    // The server's disk, restarts and power cuts (after each, the driver checks everything
    // acknowledged is still there)

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
            .with_payload_codec(&SIM_CODEC);
        self.app.store = Some(store);
        Ok(())
    }

    /// The server process goes away and comes back on the same database file. Workers keep
    /// what they hold; their leases are still valid or expire as usual.
    pub(crate) fn restart(&mut self) -> Result<(), Failure> {
        self.trace(|| "server restart".to_string());
        self.counters.restarts += 1;
        self.app.store = None;
        self.open()
    }

    /// The machine loses power: the server comes back on what its disk held, every write a
    /// file had not fsynced lost.
    pub(crate) fn power_cut(&mut self) -> Result<(), Failure> {
        let (from, to) = (self.disk_dir(), self.next_disk_dir());
        let lost = power::durable_image(&from, &to).map_err(|e| self.fail(format!("power cut: {e}")))?;
        self.trace(|| format!("power cut ({lost} unsynced writes lost)"));
        self.back_on_next_disk(&from, lost)
    }

    /// Makes the power fail at the next commit's sync, just before it reaches the disk or just
    /// after (see [`CommitCut::fired`]).
    pub(crate) fn arm_commit_cut(&mut self) -> CommitCut {
        let (from, to) = (self.disk_dir(), self.next_disk_dir());
        let after_sync = self.rng.random_bool(0.5);
        power::arm_cut(&from, &to, after_sync);
        CommitCut { disk: from, after_sync }
    }

    /// After a power cut: the server comes back on the next disk, which holds what `from` had
    /// synced.
    pub(crate) fn back_on_next_disk(&mut self, from: &Path, lost: usize) -> Result<(), Failure> {
        self.disk += 1;
        self.counters.power_cuts += 1;
        self.counters.unsynced_writes_lost += lost;
        // The old machine's files stay behind, never read again.
        self.app.store = None;
        power::forget(from);
        let _ = std::fs::remove_dir_all(from);
        self.open()
    }
}

/// One of `items`, drawn with the seed's `rng` (no draw when there is none).
pub(crate) fn pick<'a>(rng: &mut StdRng, items: impl ExactSizeIterator<Item = &'a String>) -> Option<String> {
    let count = items.len();
    if count == 0 {
        return None;
    }
    let index = rng.random_range(0..count);
    items.into_iter().nth(index).cloned()
}
