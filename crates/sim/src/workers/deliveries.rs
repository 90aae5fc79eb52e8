//! What workers report, and how it reaches the server: a report goes out at once, is held to
//! arrive later (reordered, sometimes duplicated), or is lost with its worker; [`deliver`]
//! sends one through the use cases and judges the answer.

use crate::checks::check_lease_grant;
use crate::report::Failure;
use crate::workload::{ACTIVITY_LEASE_MS, NAMESPACE, PAYLOAD, SIMULATED_WORKER, START};
use crate::world::World;
use capstan_app::{queries, reports, AppError};
use capstan_engine::{
    ActivityAttemptId, ActivityFailure, Payload, Principal, QueryOutcome, RunState, StickyClaim, StreamProgress, TaskId, WorkflowCommand,
    WorkflowTaskFailure, WAITING_FOR_HISTORY_FAILURE,
};
use capstan_store::QueryAnswer;
use rand::Rng;
use serde_json::json;

/// A report a worker holds and delivers later (or twice, or never).
#[derive(Clone, Debug)]
pub(crate) enum Delivery {
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

/// The reports workers hold, in the order they were held.
#[derive(Default)]
pub(crate) struct Held(Vec<Delivery>);

impl Held {
    pub(crate) fn hold(&mut self, delivery: Delivery) {
        self.0.push(delivery);
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The held report at `index`, taken out.
    pub(crate) fn take(&mut self, index: usize) -> Delivery {
        self.0.remove(index)
    }

    /// A copy of the held report at `index` (it stays held, to arrive again).
    pub(crate) fn copy(&self, index: usize) -> Delivery {
        self.0[index].clone()
    }

    /// The report held longest, taken out.
    pub(crate) fn next(&mut self) -> Option<Delivery> {
        (!self.0.is_empty()).then(|| self.0.remove(0))
    }

    /// A worker's report goes out at once, is held to arrive later, or is lost with the
    /// worker (see [`fate`]).
    pub(crate) async fn hand_over(&mut self, world: &mut World, delivery: Delivery, faulty: bool) -> Result<(), Failure> {
        match fate(world, faulty) {
            0 => deliver(world, delivery).await?,
            1 => self.hold(delivery),
            _ => world.counters.lost_tasks += 1,
        }
        Ok(())
    }
}

/// What a delivery's fate is: 0 at once, 1 later, 2 never (the worker crashed).
fn fate(world: &mut World, faulty: bool) -> u8 {
    if !faulty {
        return 0;
    }
    match world.rng.random_range(0..100) {
        0..=64 => 0,
        65..=89 => 1,
        _ => 2,
    }
}

/// The claim a worker's report on a workflow task names.
pub(crate) fn workflow_lease(task_id: TaskId, owner: String, fence: u64) -> reports::WorkflowLease {
    reports::WorkflowLease {
        namespace: NAMESPACE.into(),
        task_id,
        owner,
        attempt: fence,
        principal: Some(Principal::token(SIMULATED_WORKER)),
    }
}

/// The attempt a worker's report on an activity task names.
fn attempt_lease(task_id: TaskId, attempt_id: ActivityAttemptId, owner: String) -> reports::AttemptLease {
    reports::AttemptLease {
        namespace: NAMESPACE.into(),
        task_id,
        attempt_id,
        owner,
        principal: Some(Principal::token(SIMULATED_WORKER)),
    }
}

/// Delivers one report and judges the answer.
pub(crate) async fn deliver(world: &mut World, delivery: Delivery) -> Result<(), Failure> {
    let now = world.now;
    match delivery {
        Delivery::CompleteWorkflowTask {
            task_id,
            owner,
            fence,
            commands,
            sticky,
        } => complete_workflow_task(world, task_id, owner, fence, commands, sticky).await,
        Delivery::CompleteActivity {
            task_id,
            attempt_id,
            owner,
            result,
        } => {
            world.trace(|| format!("{owner} completes activity task {task_id}"));
            let lease = attempt_lease(task_id, attempt_id, owner);
            let answer = reports::complete_activity(&world.app, lease, result).await;
            acknowledged(world, answer)
        }
        Delivery::FailActivity {
            task_id,
            attempt_id,
            owner,
        } => {
            world.trace(|| format!("{owner} fails activity task {task_id}"));
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
            let answer = reports::fail_activity(&world.app, lease, failure).await;
            acknowledged(world, answer)
        }
        Delivery::HeartbeatActivity {
            task_id,
            attempt_id,
            owner,
        } => {
            world.trace(|| format!("{owner} heartbeats activity task {task_id}"));
            let details = json!({"progress": now - START});
            let lease = attempt_lease(task_id, attempt_id, owner);
            let answer = reports::heartbeat_activity(&world.app, lease, ACTIVITY_LEASE_MS, Some(details)).await;
            acknowledged(world, answer)
        }
        Delivery::RenewActivityLease {
            task_id,
            attempt_id,
            owner,
        } => renew_activity_lease(world, task_id, attempt_id, owner).await,
        Delivery::AcknowledgeStop {
            task_id,
            attempt_id,
            owner,
            request_id,
            fence,
        } => acknowledge_stop(world, task_id, attempt_id, owner, request_id, fence).await,
        Delivery::AnswerQuery { query_id, owner, attempt } => answer_query(world, query_id, owner, attempt).await,
    }
}

/// A report's answer: the run it left, acknowledged, unless the server refused it.
fn acknowledged<T>(world: &mut World, answer: Result<(T, RunState), AppError>) -> Result<(), Failure> {
    if let Some((_, run)) = world.declined(answer)? {
        world.seen.acknowledge(&run);
    }
    Ok(())
}

async fn complete_workflow_task(
    world: &mut World,
    task_id: TaskId,
    owner: String,
    fence: u64,
    commands: Vec<WorkflowCommand>,
    sticky: Option<StickyClaim>,
) -> Result<(), Failure> {
    world.trace(|| format!("{owner} completes workflow task {task_id} (fence {fence})"));
    let lease = workflow_lease(task_id, owner, fence);
    // Like the SDKs: a replay that yields nothing new fails the task as "waiting for
    // history", which closes it without history.
    let answer = if commands.is_empty() {
        let waiting = WorkflowTaskFailure {
            message: "Workflow task waiting for scheduled history.".into(),
            failure_type: Some(WAITING_FOR_HISTORY_FAILURE.into()),
            ..Default::default()
        };
        reports::fail_workflow_task(&world.app, lease, waiting).await
    } else {
        reports::complete_workflow_task(&world.app, lease, commands, sticky, StreamProgress::default()).await
    };
    acknowledged(world, answer)
}

/// A granted renewal must be the lease the run holds, live, and record nothing.
async fn renew_activity_lease(world: &mut World, task_id: TaskId, attempt_id: ActivityAttemptId, owner: String) -> Result<(), Failure> {
    let now = world.now;
    world.trace(|| format!("{owner} renews the lease of activity task {task_id}"));
    let before = world.task_run_head(&task_id).await?;
    let lease = attempt_lease(task_id.clone(), attempt_id, owner.clone());
    let result = reports::renew_activity_lease(&world.app, lease, ACTIVITY_LEASE_MS, now).await;
    if let Some((grant, run)) = world.declined(result)? {
        check_lease_grant(world, &task_id, &grant, &run, before, now)?;
        world.counters.lease_renewals += 1;
    }
    Ok(())
}

/// A stopped attempt's worker acknowledges the stop: on its workflow task's claim for a
/// prepared local attempt, on the attempt's lease otherwise.
async fn acknowledge_stop(
    world: &mut World,
    task_id: TaskId,
    attempt_id: ActivityAttemptId,
    owner: String,
    request_id: String,
    fence: Option<u64>,
) -> Result<(), Failure> {
    world.trace(|| format!("{owner} acknowledges the stop of attempt {attempt_id} (task {task_id})"));
    let result = match fence {
        Some(attempt) => {
            let lease = workflow_lease(task_id, owner, attempt);
            capstan_app::local_activities::acknowledge_stop(&world.app, lease, attempt_id, request_id).await
        }
        None => {
            let lease = attempt_lease(task_id, attempt_id, owner);
            capstan_app::cancellation::acknowledge_stop(&world.app, lease, request_id).await
        }
    };
    if let Some((receipt, run)) = world.declined(result)? {
        if !receipt.duplicate {
            world.counters.cancellations[3] += 1;
        }
        world.seen.acknowledge(&run);
    }
    Ok(())
}

/// A query answer is accepted once, and never touches the run's history.
async fn answer_query(world: &mut World, query_id: String, owner: String, attempt: u32) -> Result<(), Failure> {
    world.trace(|| format!("{owner} answers query {query_id} (attempt {attempt})"));
    let before = world.query_run_head(&query_id).await?;
    let answer = QueryAnswer {
        namespace: NAMESPACE.into(),
        task_id: query_id.clone(),
        owner: owner.clone(),
        attempt,
        outcome: QueryOutcome::Result(Payload::avro(PAYLOAD)),
    };
    let result = queries::answer_task(&world.app, answer).await;
    if world.declined(result)?.is_some() {
        if world.seen.queries.insert(query_id.clone(), true) == Some(true) {
            return Err(world.fail(format!("query {query_id} accepted a second answer")));
        }
        world.counters.queries_answered += 1;
    }
    if world.query_run_head(&query_id).await? != before {
        return Err(world.fail(format!("answering query {query_id} changed its run's history")));
    }
    Ok(())
}
