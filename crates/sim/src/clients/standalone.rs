//! Standalone activities in the workload: a client starts an activity on a host run of its own
//! (a plain or a declared action, one attempt or a few), workers run it like any activity task,
//! and its end closes the run. Clients also start an id again: refused while its activity is
//! open, a new run once it closed.

use crate::program::Programs;
use crate::report::Failure;
use crate::workload::{DECLARED, NAMESPACE, PAYLOAD, PLAIN, QUEUE, SIMULATED_CLIENT};
use crate::world::{pick, World};
use capstan_app::standalone::{self, StartActivityRequest};
use capstan_engine::{ActivityTimeouts, Payload, Principal, RetryPolicy, TaskKind};
use rand::Rng;
use std::collections::BTreeSet;

/// The ids of the standalone activities clients started (a host run each, no program).
#[derive(Default)]
pub(crate) struct Standalone(BTreeSet<String>);

impl Standalone {
    /// A client starts a standalone activity: a new id (which counts among the started
    /// `programs`, with an empty one), or sometimes a known id again.
    pub(crate) async fn start(&mut self, world: &mut World, programs: &mut Programs) -> Result<(), Failure> {
        // A client sometimes starts a known id again (most often one whose activity ended).
        let again = match !self.0.is_empty() && world.rng.random_bool(0.3) {
            true => pick(&mut world.rng, self.0.iter()),
            false => None,
        };
        let activity_id = match again {
            Some(known) => known,
            None => {
                let index = programs.count();
                let id = format!("sim-{}-{index}-activity", world.config.seed);
                // No workflow code: its program is empty, and it counts as a started workflow.
                programs.insert(id.clone(), Vec::new());
                self.0.insert(id.clone());
                id
            }
        };
        let activity_type = if world.rng.random_bool(0.3) { DECLARED } else { PLAIN };
        let retry_policy = match world.rng.random_range(0..3) {
            0 => None,
            n => Some(RetryPolicy {
                max_attempts: Some(n + 1),
                backoff_seconds: vec![1],
                non_retryable_error_types: Vec::new(),
            }),
        };
        world.trace(|| format!("start standalone activity {activity_id} ({activity_type}, {retry_policy:?})"));
        let request = StartActivityRequest {
            namespace: NAMESPACE.into(),
            activity_id: Some(activity_id.clone()),
            activity_type: activity_type.into(),
            activity_class: None,
            task_queue: QUEUE.into(),
            input: Payload::avro(PAYLOAD),
            business_key: None,
            retry_policy,
            timeouts: ActivityTimeouts::default(),
            principal: Some(Principal::token(SIMULATED_CLIENT)),
        };
        let previous = world.current_run(&activity_id).await?;
        let result = standalone::start_activity(&world.app, request).await;
        let Some(run) = world.declined(result)? else {
            // Refused only while the id's activity is still open.
            return match previous {
                Some(open) if !open.is_closed() => Ok(()),
                _ => Err(world.fail(format!(
                    "a start of standalone activity {activity_id} was refused though no run of it is open"
                ))),
            };
        };
        if let Some(open) = previous.filter(|p| !p.is_closed()) {
            return Err(world.fail(format!(
                "{activity_id} started run {} while run {} was open",
                run.run_id, open.run_id
            )));
        }
        if run.workflow_task.is_some() || run.tasks.values().any(|t| t.kind == TaskKind::Workflow) {
            return Err(world.fail(format!("standalone activity {activity_id} got a workflow task")));
        }
        world.counters.standalone_started += 1;
        world.seen.acknowledge(&run);
        Ok(())
    }
}
