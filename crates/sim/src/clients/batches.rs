//! Operators' batch operations in the workload: a batch pauses, resumes or signals the running
//! workflows of the queue, or archives its closed ones; nodes step the batches in their duty passes (and freeze, and lose
//! power, like any holder of a duty). Checks: a batch's tallies add up, and a signal batch sent
//! its signal to no run twice.

use crate::report::Failure;
use crate::workload::{NAMESPACE, QUEUE, SIMULATED_OPERATOR};
use crate::world::{Acted, World};
use capstan_app::batches::{self, BatchAction, BatchProgress, BatchRequest, NewBatch};
use capstan_app::listing::ListQuery;
use capstan_engine::{EventType, Payload, Principal};
use capstan_store::{DutyStore, RunStore};
use rand::Rng;

/// The batches operators started: id, action, and a signal batch's signal.
#[derive(Default)]
pub(crate) struct Batches {
    started: Vec<(String, BatchAction, Option<String>)>,
}

impl Batches {
    /// An operator starts a batch over the queue's running workflows.
    pub(crate) async fn start(&mut self, world: &mut World) -> Result<Acted, Failure> {
        let actions = [BatchAction::Pause, BatchAction::Resume, BatchAction::Signal, BatchAction::Archive];
        let action = actions[world.rng.random_range(0..actions.len())];
        let signal_name = (action == BatchAction::Signal).then(|| format!("batch-signal-{}", self.started.len()));
        // An archive batch takes closed runs (open ones would be skipped); the others, running ones.
        let status = match action {
            BatchAction::Archive => ["completed", "failed"][world.rng.random_range(0..2)],
            _ => "running",
        };
        let request = BatchRequest {
            action,
            select: ListQuery {
                task_queue: Some(QUEUE.into()),
                status: Some(status.into()),
                ..ListQuery::default()
            },
            reason: Some("simulated batch".into()),
            input: signal_name.as_ref().map(|_| Payload::avro(crate::workload::PAYLOAD)),
            signal_name: signal_name.clone(),
            rate_per_second: world.rng.random_bool(0.3).then_some(5.0),
            limit: None,
        };
        let new = NewBatch {
            namespace: NAMESPACE.into(),
            request,
            request_id: None,
            principal: Some(Principal::token(SIMULATED_OPERATOR)),
        };
        let created = batches::create(&world.app, new).await;
        let Some((batch, _)) = world.declined(created)? else {
            return Ok(Acted::Done);
        };
        world.trace(|| format!("operator starts batch {} ({})", batch.batch_id, action.as_str()));
        world.counters.batches += 1;
        self.started.push((batch.batch_id, action, signal_name));
        Ok(Acted::Done)
    }

    /// The faults end: running batches are cancelled (a pause batch would keep holding runs).
    pub(crate) async fn cancel_running(&self, world: &mut World) -> Result<(), Failure> {
        for (batch_id, _, _) in &self.started {
            let cancelled = batches::cancel(&world.app, NAMESPACE, batch_id).await;
            world.declined(cancelled)?;
        }
        Ok(())
    }

    /// Every batch's tallies add up; no run got a signal batch's signal twice.
    pub(crate) async fn check(&self, world: &mut World) -> Result<(), Failure> {
        for (batch_id, _, signal_name) in &self.started {
            let batch = world
                .store()
                .batch(NAMESPACE, batch_id)
                .await
                .map_err(|e| world.fail(format!("batch: {e}")))?
                .ok_or_else(|| world.fail(format!("batch {batch_id} is gone")))?;
            let progress: BatchProgress =
                serde_json::from_value(batch.progress.clone()).map_err(|e| world.fail(format!("batch progress: {e}")))?;
            let skipped: u64 = progress.skipped.values().sum();
            if progress.done + skipped + progress.failed != progress.matched {
                return Err(world.fail(format!("batch {batch_id}'s tallies do not add up: {progress:?}")));
            }
            let Some(signal_name) = signal_name else { continue };
            for run_id in world.seen.run_workflows.keys().cloned().collect::<Vec<_>>() {
                let run_id = capstan_engine::RunId(run_id);
                let events = world
                    .store()
                    .history(&run_id, 0, u64::MAX / 2, 100_000)
                    .await
                    .map_err(|e| world.fail(format!("history: {e}")))?;
                let sent = events
                    .iter()
                    .filter(|e| e.event_type == EventType::SignalReceived && e.payload["signal_name"] == signal_name.as_str())
                    .count();
                if sent > 1 {
                    return Err(world.fail(format!("batch {batch_id} signalled run {run_id} {sent} times")));
                }
            }
        }
        Ok(())
    }
}
