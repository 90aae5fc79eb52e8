//! The simulated workers: registered at set-up (and again when the faults stop), they poll
//! for workflow, activity and query tasks, replay a run's program to its next commands (see
//! `crate::program::replay`), run activities that succeed, fail or hang, and hand their reports
//! over (`deliveries`): at once, later, twice or never. [`Workers`] holds what they hold: the
//! reports still to deliver, the highest fence each task was leased with, and which workers
//! retired for good.
//!
//! The features on the workers' side have their rooms: `cancellation` (delivering a requested
//! cancellation), `local` (prepared local activities) and `probes` (answering reconciliation
//! probes).

mod cancellation;
pub(crate) mod deliveries;
mod local;
pub(crate) mod probes;

use crate::checks::{check_activity_cap, check_not_paused, check_replay_mode, check_session_holder};
use crate::clients::request_cooperative_cancellation;
use crate::program::replay::{command_identity, decide};
use crate::program::Programs;
use crate::report::Failure;
use crate::workload::{
    ACTIVITY_LEASE_MS, CHILD_TYPE, DECLARED, NAMESPACE, PAYLOAD, PLAIN, QUEUE, SCHEDULED_TYPE, WORKFLOW_LEASE_MS, WORKFLOW_TYPE,
};
use crate::world::{Acted, World};
use cancellation::deliver_requested_cancellation;
use capstan_app::{polls, queries, workers, AppError};
use capstan_engine::{Payload, QueryKind, RunState, StickyClaim, Task, TaskDetail, TaskKind, WorkflowCommand};
use capstan_store::{HandedOff, Parked, QueryClaim, RunLocator, RunStore, TaskStore};
use deliveries::{deliver, Delivery, Held};
use local::run_local_call;
use rand::Rng;
use serde_json::{json, Map};
use std::collections::{BTreeMap, BTreeSet};

pub(crate) const WORKERS: usize = 3;
/// What the simulated workers register as their SDK (their sticky claims name it as the build).
const SDK_VERSION: &str = "capstan-sim/1";
const QUERY_LEASE_MS: i64 = 3_000;
/// How often a worker's report is delivered while the power fails inside its commit.
const MID_COMMIT_CUTS: f64 = 0.08;

#[derive(Default)]
pub(crate) struct Workers {
    /// The reports the workers hold, to deliver later.
    pub(crate) held: Held,
    /// The highest fence each task was leased with: a new claim's must be higher.
    fences: BTreeMap<String, u64>,
    /// Every (task, fence) leased: none twice.
    granted: BTreeSet<(String, u64)>,
    /// Workers retired in the faulty phase (registered again when the calm phase begins).
    retired: BTreeSet<String>,
    /// Polls parked on the node: a transaction that makes a task ready hands it to one.
    parked: Vec<ParkedPoll>,
}

/// One of the workers, at random.
fn worker(world: &mut World) -> String {
    format!("worker-{}", world.rng.random_range(0..WORKERS))
}

/// A polling worker is alive: its registration is refreshed.
/// Its heartbeat reports the slots it has free, which the registration must keep.
async fn alive(world: &World, owner: &str, free_slots: usize) -> Result<(), Failure> {
    let slots = serde_json::json!({"workflow_available": free_slots});
    let reported = serde_json::Map::from_iter([("task_slots".to_string(), slots.clone())]);
    let beat = workers::heartbeat(&world.app, NAMESPACE, owner, reported).await;
    let record = beat.map_err(|e| world.fail(format!("worker heartbeat: {e}")))?;
    if record.is_some_and(|r| r.document.get("task_slots") != Some(&slots)) {
        return Err(world.fail(format!("worker heartbeat: {owner}'s reported slots were not kept")));
    }
    Ok(())
}

/// A worker's poll for a task of `kind`, as the server runs it (one look); the poll, to park
/// it when it found nothing.
async fn poll(world: &World, owner: &str, kind: TaskKind, lease_ms: i64) -> Result<(polls::Poll, Option<(Task, RunState)>), AppError> {
    let worker = polls::poller(&world.app, NAMESPACE, owner, QUEUE, None).await?;
    let poll = polls::Poll {
        namespace: NAMESPACE.into(),
        worker,
        kind,
        poll_request_id: None,
        lease_ms,
    };
    let leased = polls::claim(&world.app, &poll).await?.into_lease();
    Ok((poll, leased))
}

/// At most this many polls stay parked at once.
const MAX_PARKED: usize = 4;

/// A poll a worker left parked, as the server parks a long poll between looks.
struct ParkedPoll {
    owner: String,
    kind: TaskKind,
    parked: Parked,
}

impl Workers {
    /// Registers the simulated workers (they answer queries).
    pub(crate) async fn register(&mut self, world: &mut World) -> Result<(), Failure> {
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
            let registration = workers::Registration {
                namespace: NAMESPACE.into(),
                worker_id: Some(format!("worker-{n}")),
                task_queue: QUEUE.into(),
                runtime: "simulated".into(),
                sdk_version: Some(SDK_VERSION.into()),
                build_id: None,
                workflow_types: vec![WORKFLOW_TYPE.into(), CHILD_TYPE.into(), SCHEDULED_TYPE.into()],
                activity_types: vec![PLAIN.into(), DECLARED.into(), probes::PROBE.into()],
                fingerprints: Map::new(),
                document,
            };
            let registered = workers::register(&world.app, registration).await;
            registered.map_err(|e| world.fail(format!("register: {e}")))?;
        }
        self.retired.clear();
        Ok(())
    }

    /// The server went down (a restart, a power cut): every parked poll's connection died with
    /// it, so nothing a transaction handed to one is read — least of all a hand-off of a commit
    /// the power cut lost.
    pub(crate) fn server_went_down(&mut self) {
        self.parked.clear();
    }

    /// A worker process goes away for good (its registration removed, as at shutdown or by an
    /// operator): its sticky runs and its worker sessions must move on to the others.
    pub(crate) async fn retire(&mut self, world: &mut World) -> Result<Acted, Failure> {
        let worker = worker(world);
        world.trace(|| format!("{worker} retires"));
        // Its process is gone, and its parked polls with it.
        self.parked.retain(|p| p.owner != worker);
        // As the server does: its leased workflow tasks are given back at once.
        let gone = workers::deregister(&world.app, NAMESPACE, &worker).await;
        gone.map_err(|e| world.fail(format!("deregister: {e}")))?;
        self.retired.insert(worker);
        world.counters.workers_retired += 1;
        Ok(Acted::Done)
    }

    /// A worker's lease of a task of `kind`: one a transaction handed to a poll it parked,
    /// else a claim; a claim that found nothing sometimes stays parked. In the faulty phase a
    /// parked poll's client sometimes goes away, and what was handed to it and not read is given
    /// back, as the server's give-back loop does.
    async fn lease(
        &mut self,
        world: &mut World,
        kind: TaskKind,
        lease_ms: i64,
        faulty: bool,
    ) -> Result<Option<(String, Task, RunState)>, Failure> {
        if faulty && !self.parked.is_empty() && world.rng.random_bool(0.05) {
            let gone = self.parked.swap_remove(world.rng.random_range(0..self.parked.len()));
            world.trace(|| format!("{}'s parked {} poll goes away", gone.owner, gone.kind.as_str()));
        }
        self.give_back(world).await?;
        self.parked.retain(|p| !p.parked.is_spent());
        for at in 0..self.parked.len() {
            if self.parked[at].kind != kind {
                continue;
            }
            if let Some(HandedOff { task, run }) = self.parked[at].parked.try_handed() {
                let ParkedPoll { owner, .. } = self.parked.swap_remove(at);
                world.counters.hand_offs += 1;
                world.trace(|| format!("{owner} was handed {} task {} of {}", kind.as_str(), task.id, run.workflow_id));
                self.note_fence(world, &task, true)?;
                return Ok(Some((owner, task, run)));
            }
        }
        let owner = worker(world);
        alive(world, &owner, self.parked.len()).await?;
        let claimed = poll(world, &owner, kind, lease_ms).await;
        match world.declined(claimed)? {
            Some((_, Some((task, run)))) => {
                self.note_fence(world, &task, false)?;
                Ok(Some((owner, task, run)))
            }
            Some((poll, None)) if self.parked.len() < MAX_PARKED && world.rng.random_bool(0.5) => {
                let parked = polls::park(&world.app, &poll);
                self.parked.push(ParkedPoll { owner, kind, parked });
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// Gives back what was handed to parked polls that went away before reading it.
    async fn give_back(&mut self, world: &mut World) -> Result<(), Failure> {
        for handed in world.store().take_undelivered_hand_offs() {
            let task_id = handed.task.id.clone();
            let given = polls::give_back(&world.app, handed).await;
            if let Some(Some(_)) = world.declined(given)? {
                world.trace(|| format!("workflow task {task_id}, handed to a poll that went away, was given back"));
            }
        }
        Ok(())
    }

    /// A claim's lease must be fenced above every lease of the task before it. A lease handed
    /// to a parked poll may be read late (the node paused between its commit and the answer,
    /// and the lease ran out and went to another meanwhile), so it is checked only never to
    /// repeat a fence the task was leased with.
    fn note_fence(&mut self, world: &World, task: &Task, handed: bool) -> Result<(), Failure> {
        if !self.granted.insert((task.id.as_str().to_string(), task.fence)) {
            return Err(world.fail(format!("task {} leased twice with fence {}", task.id, task.fence)));
        }
        let highest = self.fences.entry(task.id.as_str().to_string()).or_default();
        if task.fence <= *highest && !handed {
            return Err(world.fail(format!(
                "task {} leased again with fence {} after fence {highest}",
                task.id, task.fence
            )));
        }
        *highest = (*highest).max(task.fence);
        Ok(())
    }

    /// Polls one workflow task; returns whether one was leased.
    pub(crate) async fn poll_workflow_task(&mut self, world: &mut World, programs: &Programs, faulty: bool) -> Result<bool, Failure> {
        let Some((owner, task, run)) = self.lease(world, TaskKind::Workflow, WORKFLOW_LEASE_MS, faulty).await? else {
            return Ok(false);
        };
        check_not_paused(world, &task, &run)?;
        // When it was leased (a lease handed to a parked poll may be read later).
        let leased_at = task.lease().map_or(world.now, |lease| lease.expires_at - WORKFLOW_LEASE_MS);
        check_replay_mode(world, &self.retired, &task, &run, &owner, leased_at)?;
        world.seen.acknowledge(&run);
        if !deliver_requested_cancellation(world, &mut self.held, &task, &run, &owner).await? {
            return Ok(true);
        }
        let Some((run, commands)) = self.replay(world, programs, &task, &owner, faulty).await? else {
            return Ok(true);
        };
        for command in &commands {
            if let WorkflowCommand::StartChildWorkflow(child) = command {
                // The child may come to exist: it must then finish too.
                world.seen.instances.extend(child.workflow_id.clone());
            }
        }
        world.trace(|| {
            format!(
                "{owner} leased workflow task {} of {} (fence {}): {} command(s)",
                task.id,
                run.workflow_id,
                task.fence,
                commands.len()
            )
        });
        // Like an SDK with its cache on: a task that does not close the run may claim it.
        let claims = !commands.is_empty() && !commands.iter().any(WorkflowCommand::is_terminal) && world.rng.random_bool(0.5);
        let sticky = claims.then(|| StickyClaim {
            worker_id: owner.clone(),
            workflow_id: run.workflow_id.to_string(),
            run_id: run.run_id.to_string(),
            build_id: SDK_VERSION.into(),
            ttl_seconds: world.rng.random_range(1..=120),
            metrics: Map::new(),
        });
        let delivery = Delivery::CompleteWorkflowTask {
            task_id: task.id.clone(),
            owner,
            fence: task.fence,
            commands,
            sticky,
        };
        self.held.hand_over(world, delivery, faulty).await?;
        Ok(true)
    }

    /// Replays the run of a leased workflow task up to its next commands; a prepared local call
    /// on the way is run on the claim and the replay goes on from the history it recorded.
    /// None: a released or abandoned claim ended the task.
    async fn replay(
        &mut self,
        world: &mut World,
        programs: &Programs,
        task: &Task,
        owner: &str,
        faulty: bool,
    ) -> Result<Option<(RunState, Vec<WorkflowCommand>)>, Failure> {
        let mut local_calls = 0;
        loop {
            let run = world
                .store()
                .load_run(NAMESPACE, RunLocator::Task(task.id.clone()))
                .await
                .map_err(|e| world.fail(format!("load: {e}")))?
                .ok_or_else(|| world.fail(format!("the run of task {} is gone", task.id)))?;
            let history = world
                .store()
                .history(&run.run_id, 0, run.last_sequence, run.last_sequence as usize + 1)
                .await
                .map_err(|e| world.fail(format!("history: {e}")))?;
            let program = programs.program_for(run.workflow_id.as_str(), &run.workflow_type);
            let identity = command_identity(task);
            let (commands, local) = decide(run.workflow_id.as_str(), &program, &history, &identity);
            let Some(call) = local else { return Ok(Some((run, commands))) };
            local_calls += 1;
            if local_calls > 4 || !run_local_call(world, &mut self.held, task, &run, owner, call, faulty).await? {
                return Ok(None);
            }
        }
    }

    /// Polls one activity task; returns whether one was leased.
    pub(crate) async fn poll_activity_task(&mut self, world: &mut World, faulty: bool) -> Result<bool, Failure> {
        let Some((owner, task, run)) = self.lease(world, TaskKind::Activity, ACTIVITY_LEASE_MS, faulty).await? else {
            return Ok(false);
        };
        check_not_paused(world, &task, &run)?;
        world.seen.acknowledge(&run);
        check_activity_cap(world, &run).await?;
        let TaskDetail::Activity {
            attempt_id: Some(attempt_id),
            ..
        } = task.detail.clone()
        else {
            return Err(world.fail(format!("activity task {} leased without an attempt id", task.id)));
        };
        check_session_holder(world, &task, &run, &owner).await?;
        let succeeds = !faulty || world.rng.random_bool(0.6);
        world.trace(|| {
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
                    Some(_) => probes::probe_answer(&mut world.rng),
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
        if faulty && world.rng.random_bool(0.2) {
            self.held.hold(Delivery::HeartbeatActivity {
                task_id: task.id.clone(),
                attempt_id: attempt_id.clone(),
                owner: owner.clone(),
            });
        }
        if faulty && world.rng.random_bool(0.2) {
            self.held.hold(Delivery::RenewActivityLease {
                task_id: task.id.clone(),
                attempt_id,
                owner,
            });
        }
        // A client loses patience with a running activity: the run is asked to stop while the
        // attempt runs, so the delivery stops (or waits for) a live attempt.
        if faulty && world.rng.random_bool(0.08) {
            request_cooperative_cancellation(world, run.workflow_id.as_str()).await?;
            self.held.hold(report);
            return Ok(true);
        }
        self.held.hand_over(world, report, faulty).await?;
        Ok(true)
    }

    /// A worker polls for a query task; returns whether one was leased.
    pub(crate) async fn poll_query_task(&mut self, world: &mut World, faulty: bool) -> Result<bool, Failure> {
        let owner = worker(world);
        alive(world, &owner, self.parked.len()).await?;
        let claim = QueryClaim {
            namespace: NAMESPACE.into(),
            queue: QUEUE.into(),
            kind: QueryKind::Query,
            owner: owner.clone(),
            lease_ms: QUERY_LEASE_MS,
        };
        let claimed = queries::claim_task(&world.app, claim).await;
        let Some(Some(task)) = world.declined(claimed)? else {
            return Ok(false);
        };
        if task.is_answered() || !world.seen.queries.contains_key(&task.id) {
            return Err(world.fail(format!("query task {} leased though answered or unknown", task.id)));
        }
        world.trace(|| format!("{owner} leased query task {} (attempt {})", task.id, task.attempt));
        let delivery = Delivery::AnswerQuery {
            query_id: task.id,
            owner,
            attempt: task.attempt,
        };
        self.held.hand_over(world, delivery, faulty).await?;
        Ok(true)
    }

    /// Delivers a held report, chosen at random (reordering); sometimes keeps a copy to deliver
    /// again (duplication), and sometimes the power fails inside its commit.
    pub(crate) async fn deliver_held(&mut self, world: &mut World) -> Result<Acted, Failure> {
        if self.held.is_empty() {
            return Ok(Acted::Idle);
        }
        let index = world.rng.random_range(0..self.held.len());
        let delivery = if world.rng.random_bool(0.25) {
            world.counters.duplicates_delivered += 1;
            self.held.copy(index)
        } else {
            self.held.take(index)
        };
        if world.rng.random_bool(MID_COMMIT_CUTS) {
            return self.deliver_through_power_cut(world, delivery).await;
        }
        deliver(world, delivery).await?;
        Ok(Acted::Done)
    }

    /// The power fails while the server commits a worker's report, at the commit's sync: just
    /// before it reaches the disk or just after. Nobody hears the answer, so nothing it
    /// acknowledged counts, and the worker sends the report again later (at-least-once).
    async fn deliver_through_power_cut(&mut self, world: &mut World, delivery: Delivery) -> Result<Acted, Failure> {
        let cut = world.arm_commit_cut();
        let heard = world.seen.heard();
        let delivered = deliver(world, delivery.clone()).await;
        let fired = cut.fired();
        delivered?;
        let Some(image) = fired else {
            return Ok(Acted::Done); // nothing was written: an ordinary step
        };
        let lost = image.map_err(|e| world.fail(format!("power cut: {e}")))?;
        let when = if cut.after_sync { "after" } else { "before" };
        world.trace(|| format!("power cut inside a commit, {when} its sync ({lost} unsynced writes lost)"));
        world.seen.unhear(heard);
        self.server_went_down();
        self.held.hold(delivery);
        world.counters.mid_commit_cuts += 1;
        world.back_on_next_disk(&cut.disk, lost)?;
        Ok(Acted::ServerBack)
    }
}
