//! The driver: one seed's run from set-up to the last check. It builds the world and its
//! server nodes, the clients and the workers, then runs the faulty phase (each step a random
//! action, its touched runs checked after it) and the calm phase (no more faults: everything
//! must finish), and ends with the checks of the whole seed.

use crate::checks::{check_all, check_settled, check_touched};
use crate::clients::operators::{hold, limit_activities, resolve_one_unknown, resolve_unknown, set_activity_limits};
use crate::clients::queries::send_query;
use crate::clients::schedules::pause_or_resume;
use crate::clients::{request_cooperative_cancellation, Clients};
use crate::program::nexus::register_operation;
use crate::report::{Failure, Report};
use crate::workers::deliveries::deliver;
use crate::workers::probes::{action_document, check_probes};
use crate::workers::Workers;
use crate::workload::{Config, DECLARED, NAMESPACE};
use crate::world::nodes::Cluster;
use crate::world::{Acted, World};
use capstan_app::ledger::{self, ActionDeclaration};
use capstan_engine::{RecoveryMode, WorkflowId};
use capstan_store::{ListFilter, RunLocator, RunStore};
use rand::Rng;

/// Rounds the calm phase may take before the seed fails liveness.
const CALM_ROUNDS: usize = 400;

/// Runs one seed.
pub async fn run(config: Config) -> Result<Report, Failure> {
    let mut world = World::new(config)?;
    let nodes = Cluster::new(&mut world.rng);
    let mut sim = Sim {
        world,
        nodes,
        clients: Clients::default(),
        workers: Workers::default(),
    };
    sim.set_up().await?;
    sim.faulty_phase().await?;
    let calm_rounds = sim.calm_phase().await?;
    let Sim { mut world, clients, .. } = sim;
    check_all(&mut world, &clients).await?;
    check_settled(&mut world).await?;
    check_probes(&mut world).await?;
    Ok(world.into_report(calm_rounds))
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

/// The parts of one seed's simulation, each the owner of its state.
struct Sim {
    world: World,
    /// The world's server nodes (held beside it: a node's duty pass acts on the world).
    nodes: Cluster,
    clients: Clients,
    workers: Workers,
}

impl Sim {
    /// An operator declares the consequential action and registers the catalog operation; the
    /// workers register.
    async fn set_up(&mut self) -> Result<(), Failure> {
        let world = &mut self.world;
        let declaration = ActionDeclaration {
            namespace: NAMESPACE.into(),
            activity_type: DECLARED.into(),
            recovery_mode: RecoveryMode::NonAtomic,
            document: action_document(),
            atomic_handler: false,
        };
        ledger::declare_action(&world.app, declaration)
            .await
            .map_err(|e| world.fail(format!("defining the action: {e}")))?;
        register_operation(world).await?;
        self.workers.register(world).await
    }

    async fn faulty_phase(&mut self) -> Result<(), Failure> {
        for _ in 0..self.world.config.steps {
            self.world.step += 1;
            let roll = self.world.rng.random_range(0..100);
            match self.faulty_step(roll).await? {
                Acted::Done => {}
                Acted::Idle => self.advance_clock().await?,
                Acted::ServerBack => check_all(&mut self.world, &self.clients).await?,
            }
            check_touched(&mut self.world, &self.clients).await?;
        }
        Ok(())
    }

    /// What happens at a faulty step, by its roll.
    async fn faulty_step(&mut self, roll: i32) -> Result<Acted, Failure> {
        let Sim {
            world, clients, workers, ..
        } = self;
        Ok(match roll {
            0..=7 => clients.start_workflow(world).await?,
            8..=25 => {
                workers.poll_workflow_task(world, &clients.programs, true).await?;
                Acted::Done
            }
            26..=41 => {
                workers.poll_activity_task(world, true).await?;
                Acted::Done
            }
            42..=53 => workers.deliver_held(world).await?,
            54..=60 => Acted::Idle, // the time passes
            61 => clients.batches.start(world).await?,
            62..=63 => match clients.random_started_workflow(world) {
                Some(workflow_id) => {
                    let pause_it = world.rng.random_bool(0.6);
                    hold(world, &workflow_id, pause_it).await?
                }
                None => Acted::Idle,
            },
            64 if world.rng.random_bool(0.5) => limit_activities(world).await?,
            64 => clients.collect_payloads(world).await?,
            65..=69 if world.rng.random_bool(0.3) => clients.append_message(world).await?,
            65..=69 => clients.send_signal(world).await?,
            70 => match clients.random_started_workflow(world) {
                Some(workflow_id) => {
                    request_cooperative_cancellation(world, &workflow_id).await?;
                    Acted::Done
                }
                None => Acted::Idle,
            },
            71..=75 => clients.send_update(world).await?,
            76..=77 => send_query(world).await?,
            78 => clients.imports.import_one(world).await?,
            79..=81 => {
                workers.poll_query_task(world, true).await?;
                Acted::Done
            }
            82..=87 => resolve_unknown(world).await?,
            88..=93 => clients.schedules.change(world).await?,
            94 if world.rng.random_bool(0.5) => clients.redrive_one(world).await?,
            94 => clients.close_workflow(world).await?,
            95 => workers.retire(world).await?,
            _ if world.rng.random_bool(0.5) => {
                world.power_cut()?;
                workers.server_went_down();
                Acted::ServerBack
            }
            _ => {
                world.restart()?;
                workers.server_went_down();
                Acted::ServerBack
            }
        })
    }

    /// Time passes: the clock jumps, and a node runs its duties (it may freeze doing so).
    async fn advance_clock(&mut self) -> Result<(), Failure> {
        self.world.jump_clock();
        self.nodes.pass(&mut self.world, true).await
    }

    /// No more faults: reports arrive, workers succeed, operators resolve, signals come. Every
    /// workflow must reach a terminal state; returns the rounds that took.
    async fn calm_phase(&mut self) -> Result<usize, Failure> {
        self.end_faults().await?;
        for round in 0..CALM_ROUNDS {
            let world = &mut self.world;
            if open_workflows(world).await?.is_empty() && self.clients.schedules.live(world).await?.is_empty() {
                return Ok(round + 1);
            }
            world.step += 1;
            self.calm_round().await?;
        }
        let world = &mut self.world;
        let open = open_workflows(world).await?;
        let schedules = self.clients.schedules.live(world).await?;
        Err(world.fail(format!(
            "liveness: {} workflow(s) still open and {} schedule(s) live after the faults stopped: {open:?} {schedules:?}",
            open.len(),
            schedules.len()
        )))
    }

    /// The faults end: frozen nodes wake and act on what they held; retired workers come back
    /// (a fleet is eventually whole again); clients redrive what failed; whatever workers still
    /// hold arrives (late reports are refused).
    async fn end_faults(&mut self) -> Result<(), Failure> {
        let Sim {
            world,
            nodes,
            clients,
            workers,
        } = self;
        nodes.wake_all(world).await?;
        workers.register(world).await?;
        // A slow rate must not read as a liveness failure: operators lift the limits.
        set_activity_limits(world, Default::default()).await?;
        clients.redrive_every_failed(world).await?;
        clients.batches.cancel_running(world).await?;
        while let Some(delivery) = workers.held.next() {
            world.step += 1;
            deliver(world, delivery).await?;
            check_touched(world, clients).await?;
        }
        Ok(())
    }

    /// One round of the calm phase: everyone does all there is to do, then a second passes.
    async fn calm_round(&mut self) -> Result<(), Failure> {
        let Sim {
            world,
            nodes,
            clients,
            workers,
        } = self;
        // A paused schedule would never finish: operators resume them.
        for schedule_id in clients.schedules.live(world).await? {
            pause_or_resume(world, &schedule_id, false).await?;
        }
        while workers.poll_workflow_task(world, &clients.programs, false).await? {}
        while workers.poll_activity_task(world, false).await? {}
        while workers.poll_query_task(world, false).await? {}
        while let Some(delivery) = workers.held.next() {
            deliver(world, delivery).await?;
        }
        // A paused run would never finish: operators resume every one (a batch may have paused
        // runs no client knows of, such as a Nexus call's linked run).
        let paused = ListFilter {
            status_bucket: Some("paused".into()),
            ..ListFilter::default()
        };
        let (held, _) = world
            .store()
            .list_runs(NAMESPACE, paused, 0, 1_000)
            .await
            .map_err(|e| world.fail(format!("list paused runs: {e}")))?;
        for run in held {
            hold(world, run.workflow_id.as_str(), false).await?;
        }
        for workflow_id in open_workflows(world).await? {
            clients.signal_waiting(world, &workflow_id).await?;
        }
        while resolve_one_unknown(world).await? {}
        world.advance(1_000);
        nodes.pass(world, false).await?;
        check_touched(world, clients).await
    }
}

/// The instances whose current run is still open (a run nobody polled yet, such as a child
/// closed with its parent, is acknowledged on the way, so it is checked too).
async fn open_workflows(world: &mut World) -> Result<Vec<String>, Failure> {
    let mut open = Vec::new();
    for workflow_id in world.seen.instances.iter().cloned().collect::<Vec<_>>() {
        let run = world
            .store()
            .load_run(NAMESPACE, RunLocator::Current(WorkflowId(workflow_id.clone())))
            .await
            .map_err(|e| world.fail(format!("load: {e}")))?;
        let Some(run) = run else { continue };
        if !world.seen.run_workflows.contains_key(run.run_id.as_str()) {
            world.seen.acknowledge(&run);
        }
        if !run.is_closed() {
            open.push(workflow_id);
        }
    }
    Ok(open)
}
