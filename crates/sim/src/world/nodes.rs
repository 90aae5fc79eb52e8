//! Several server nodes over the one store, as a PostgreSQL cluster runs them: each runs the
//! background duties (deadlines under a duty fence, schedule firings) with its own clock, a
//! little ahead of or behind the simulation's, and a node may freeze between claiming its
//! duties and acting on them (a GC pause, a frozen VM) and wake steps later, acting on what it
//! claimed with the time it read before it froze. Meanwhile the other nodes take expired claims
//! over with a higher fence. Whatever the woken node does must be refused or harmless: the
//! per-run checks after every step see a timer fired twice, a lease expired twice or a
//! schedule occurrence started twice.

use super::World;
use crate::checks::check_schedule;
use crate::report::Failure;
use crate::workload::PAYLOAD;
use capstan_app::duties;
use capstan_engine::{Millis, Payload, Reason};
use capstan_store::{DueTask, StoreError};
use rand::rngs::StdRng;
use rand::Rng;

/// Nodes in the cluster.
const NODES: usize = 3;
/// How long a node's claim on a duty holds (`--duty-lease-seconds` of the simulated cluster).
const DUTY_HOLD_MS: i64 = 5_000;
/// The most a node's clock is ahead of or behind the simulation's.
const MAX_SKEW_MS: i64 = 250;
/// As `capstan serve` runs it by default.
const SCHEDULE_CATCHUP_MS: i64 = 60_000;

/// The server nodes over the one store. (The driver holds them beside the world: a node's pass
/// acts on the world.)
pub(crate) struct Cluster {
    nodes: Vec<Node>,
}

struct Node {
    id: String,
    skew_ms: Millis,
    frozen: Option<Frozen>,
}

/// What a frozen node holds: the duties it claimed and the schedules it read as due, at `at`.
struct Frozen {
    at: Millis,
    claimed: Vec<DueTask>,
    schedules: Vec<(String, String)>,
    steps_left: usize,
}

impl Cluster {
    pub(crate) fn new(rng: &mut StdRng) -> Cluster {
        let nodes = (0..NODES)
            .map(|i| Node {
                id: format!("sim-node-{i}"),
                skew_ms: if i == 0 { 0 } else { rng.random_range(-MAX_SKEW_MS..=MAX_SKEW_MS) },
                frozen: None,
            })
            .collect();
        Cluster { nodes }
    }

    /// One node's duty pass. A frozen node's turn passes (it wakes when its steps are up); a
    /// node in the faulty phase may freeze after claiming, before acting.
    pub(crate) async fn pass(&mut self, world: &mut World, faulty: bool) -> Result<(), Failure> {
        for node in &mut self.nodes {
            if let Some(frozen) = &mut node.frozen {
                frozen.steps_left = frozen.steps_left.saturating_sub(1);
            }
        }
        let index = world.rng.random_range(0..self.nodes.len());
        match &self.nodes[index].frozen {
            Some(frozen) if frozen.steps_left > 0 => return Ok(()),
            Some(_) => return self.wake(world, index).await,
            None => {}
        }
        let (node, now) = (self.nodes[index].id.clone(), world.now + self.nodes[index].skew_ms);
        let claimed = duties::claim_due_deadlines(world.store(), &node, now, 1_000, DUTY_HOLD_MS)
            .await
            .map_err(|e| world.fail(format!("claim_due_tasks: {e}")))?;
        world.counters.duty_takeovers += claimed.iter().filter(|task| task.duty_fence > 1).count();
        let schedules = duties::due_schedules(world.store(), now, 100)
            .await
            .map_err(|e| world.fail(format!("due_schedules: {e}")))?;
        if faulty && (!claimed.is_empty() || !schedules.is_empty()) && world.rng.random_bool(0.15) {
            let steps_left = world.rng.random_range(2..25);
            world.trace(|| {
                format!(
                    "{node} froze holding {} duties, {} due schedules, for {steps_left} steps",
                    claimed.len(),
                    schedules.len()
                )
            });
            world.counters.node_pauses += 1;
            self.nodes[index].frozen = Some(Frozen {
                at: now,
                claimed,
                schedules,
                steps_left,
            });
            return Ok(());
        }
        act(world, &node, now, claimed, schedules, false).await?;
        // The node's batch runner: one step of a due batch, if any.
        let stepped = capstan_app::batches::step(&world.app, &node).await;
        world.declined(stepped).map(drop)
    }

    /// Every frozen node wakes (the calm phase begins: no more pauses).
    pub(crate) async fn wake_all(&mut self, world: &mut World) -> Result<(), Failure> {
        for index in 0..self.nodes.len() {
            if self.nodes[index].frozen.is_some() {
                self.wake(world, index).await?;
            }
        }
        Ok(())
    }

    async fn wake(&mut self, world: &mut World, index: usize) -> Result<(), Failure> {
        let Some(frozen) = self.nodes[index].frozen.take() else {
            return Ok(());
        };
        let node = self.nodes[index].id.clone();
        world.trace(|| format!("{node} woke, {} ms after it froze", world.now - frozen.at));
        act(world, &node, frozen.at, frozen.claimed, frozen.schedules, true).await
    }
}

/// Applies claimed deadlines and fires due schedules at `now`, as a node's clock and scheduler
/// do; `woken`: the node froze in between (its claims may be another's now).
async fn act(
    world: &mut World,
    node: &str,
    now: Millis,
    claimed: Vec<DueTask>,
    schedules: Vec<(String, String)>,
    woken: bool,
) -> Result<(), Failure> {
    for task in claimed {
        let outcome = duties::apply_deadline(world.store(), task, now).await;
        let stale = matches!(&outcome.result, Err(StoreError::Refused(refusal)) if refusal.reason == Reason::StaleFence);
        if woken {
            world.counters.zombie_duties[usize::from(stale)] += 1;
        } else if stale {
            return Err(world.fail(format!(
                "{node} was refused a duty it claimed this instant: {}",
                outcome.task.task_id
            )));
        }
        if let Some((_, run)) = world.refused(outcome.result)? {
            world.seen.acknowledge(&run);
        }
    }
    for (namespace, schedule_id) in schedules {
        let outcome = duties::fire_schedule(
            world.store(),
            namespace,
            schedule_id,
            now,
            SCHEDULE_CATCHUP_MS,
            &Payload::avro(PAYLOAD),
        )
        .await;
        let schedule_id = outcome.schedule_id;
        if let Some(report) = world.refused(outcome.result)? {
            if woken && report.started > 0 {
                world.counters.zombie_firings += 1;
            }
            world.trace(|| {
                format!(
                    "schedule {schedule_id} fired by {node}: {} ({} started)",
                    report.outcome, report.started
                )
            });
        }
        check_schedule(world, &schedule_id).await?;
    }
    Ok(())
}
