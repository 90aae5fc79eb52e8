//! Redrive in the workload: strict programs (a line of activities that fails with a failed
//! one) are redriven by clients, sometimes with the request sent twice, during the faults and
//! once more when they stop. Every send must name the same successor, and the successor must
//! not schedule a step before the one it resumes (checked in `check_run`).

use super::keyed::sends;
use crate::program::Programs;
use crate::report::Failure;
use crate::workload::{NAMESPACE, SIMULATED_OPERATOR};
use crate::world::{pick, Acted, World};
use capstan_app::redrive::{self, RedriveRequest};
use capstan_engine::{Principal, Redrive, RunStatus, WorkflowId};
use capstan_store::{RunLocator, RunStore};

/// A client redrives a random strict workflow's current run (refused unless it failed).
pub(crate) async fn redrive_one(world: &mut World, programs: &Programs) -> Result<Acted, Failure> {
    let strict = programs.strict();
    match pick(&mut world.rng, strict.iter()) {
        Some(workflow_id) => {
            redrive_run(world, &workflow_id).await?;
            Ok(Acted::Done)
        }
        None => Ok(Acted::Idle),
    }
}

/// After the faults: every strict workflow whose current run failed is redriven once.
pub(crate) async fn redrive_every_failed(world: &mut World, programs: &Programs) -> Result<(), Failure> {
    for workflow_id in programs.strict() {
        let failed = world
            .current_run(&workflow_id)
            .await?
            .is_some_and(|r| r.status == RunStatus::Failed);
        if failed {
            redrive_run(world, &workflow_id).await?;
        }
    }
    Ok(())
}

async fn redrive_run(world: &mut World, workflow_id: &str) -> Result<(), Failure> {
    let Some(source) = world.current_run(workflow_id).await? else {
        return Ok(());
    };
    let mut answered: Option<Redrive> = None;
    for send in 1..=sends(world) {
        world.trace(|| format!("redrive {workflow_id} run {} (send {send})", source.run_id));
        let request = RedriveRequest {
            namespace: NAMESPACE.into(),
            workflow_id: workflow_id.to_string(),
            run_id: source.run_id.to_string(),
            request_id: Some(format!("redrive-{}-{send}", world.step)),
            principal: Some(Principal::token(SIMULATED_OPERATOR)),
        };
        let result = redrive::redrive(&world.app, request).await;
        let Some(outcome) = world.declined(result)? else { continue };
        if outcome.fresh {
            world.counters.redrives += 1;
        }
        match &answered {
            Some(first) if first != &outcome.redrive => {
                return Err(world.fail(format!(
                    "{workflow_id}: two redrives of run {}: {first:?} and {:?}",
                    source.run_id, outcome.redrive
                )))
            }
            _ => answered = Some(outcome.redrive),
        }
    }
    let Some(record) = answered else { return Ok(()) };
    for run_id in [&record.source_run_id, &record.successor_run_id] {
        let locator = RunLocator::Run(WorkflowId(workflow_id.to_string()), run_id.clone());
        let run = world
            .store()
            .load_run(NAMESPACE, locator)
            .await
            .map_err(|e| world.fail(format!("load: {e}")))?;
        let run = run.ok_or_else(|| world.fail(format!("{workflow_id}: redriven run {run_id} is gone")))?;
        world.seen.acknowledge(&run);
    }
    Ok(())
}
