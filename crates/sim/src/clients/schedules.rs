//! Schedules in the workload: clients create the seed's interval schedules (every overlap
//! policy over the seeds, a few runs each) and pause and resume them; operators resume them
//! all once the faults stop. What each schedule started is checked (`check_schedule`).

use crate::report::Failure;
use crate::workload::{NAMESPACE, PAYLOAD, QUEUE, SCHEDULED_TYPE};
use crate::world::{Acted, World};
use capstan_app::schedules::{self, NewSchedule, ScheduleChange};
use capstan_engine::schedule::{OverlapPolicy, ScheduleFields};
use capstan_engine::Payload;
use capstan_store::ScheduleStore;
use rand::Rng;
use serde_json::json;

/// Schedules per seed.
const SCHEDULES: usize = 2;

/// The ids of the schedules the clients created.
#[derive(Default)]
pub(crate) struct Schedules(Vec<String>);

impl Schedules {
    pub(crate) fn ids(&self) -> Vec<String> {
        self.0.clone()
    }

    /// Creates the seed's schedules, or pauses or resumes one.
    pub(crate) async fn change(&mut self, world: &mut World) -> Result<Acted, Failure> {
        if self.0.len() < SCHEDULES && (self.0.is_empty() || world.rng.random_bool(0.5)) {
            self.create(world).await?;
            return Ok(Acted::Done);
        }
        let index = world.rng.random_range(0..self.0.len());
        let schedule_id = self.0[index].clone();
        let pause = world.rng.random_bool(0.5);
        pause_or_resume(world, &schedule_id, pause).await?;
        Ok(Acted::Done)
    }

    /// Creates the next schedule: every 10 to 40 s, with a random overlap policy, 2 to 4 runs.
    async fn create(&mut self, world: &mut World) -> Result<(), Failure> {
        let schedule_id = format!("schedule-{}", self.0.len());
        let every = world.rng.random_range(10..=40);
        let policies = [
            OverlapPolicy::Skip,
            OverlapPolicy::BufferOne,
            OverlapPolicy::BufferAll,
            OverlapPolicy::CancelOther,
            OverlapPolicy::TerminateOther,
            OverlapPolicy::AllowAll,
        ];
        let policy = policies[world.rng.random_range(0..policies.len())];
        let max_runs = world.rng.random_range(2..=4);
        let spec = json!({"intervals": [{"every": format!("PT{every}S")}]});
        let action = json!({"workflow_type": SCHEDULED_TYPE, "task_queue": QUEUE});
        let fields = ScheduleFields {
            overlap_policy: Some(policy),
            max_runs: Some(max_runs),
            input_payload: Some(Payload::avro(PAYLOAD)),
            ..ScheduleFields::default()
        };
        world.trace(|| format!("create {schedule_id}: every {every} s, {policy:?}, {max_runs} runs"));
        let new = NewSchedule {
            namespace: NAMESPACE.into(),
            schedule_id: schedule_id.clone(),
            spec: spec.as_object().cloned().unwrap_or_default(),
            action: action.as_object().cloned().unwrap_or_default(),
            fields,
            paused: false,
            principal: None,
        };
        let result = schedules::create(&world.app, new).await;
        world.declined(result)?;
        self.0.push(schedule_id);
        Ok(())
    }

    /// The schedules that still exist (a schedule is gone once it ran its runs).
    pub(crate) async fn live(&self, world: &World) -> Result<Vec<String>, Failure> {
        let mut live = Vec::new();
        for schedule_id in self.0.clone() {
            let schedule = world
                .store()
                .schedule(NAMESPACE, &schedule_id)
                .await
                .map_err(|e| world.fail(format!("schedule: {e}")))?;
            if schedule.is_some() {
                live.push(schedule_id);
            }
        }
        Ok(live)
    }
}

pub(crate) async fn pause_or_resume(world: &mut World, schedule_id: &str, pause: bool) -> Result<(), Failure> {
    world.trace(|| format!("{} {schedule_id}", if pause { "pause" } else { "resume" }));
    let change = if pause {
        ScheduleChange::Pause { note: None }
    } else {
        ScheduleChange::Resume { note: None }
    };
    let result = schedules::change(&world.app, NAMESPACE, schedule_id, None, change).await;
    world.declined(result)?;
    Ok(())
}
