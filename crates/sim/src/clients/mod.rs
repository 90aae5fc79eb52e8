//! The simulated clients: they start workflows (sometimes twice, a lost response), signal,
//! update and close them, ask them to stop cooperatively, and keep what they know in
//! [`Clients`]: the programs of the workflows they started, their schedules, their uploads,
//! the stream messages they know were ingested and their standalone activities.
//!
//! Each kind of request has its room: `keyed` (how a keyed command is sent and judged),
//! `queries`, `operators` (resolutions of unknown outcomes), `imports` (closed runs copied in
//! by the import contract), `schedules`, and the features `payloads`, `redrive`, `standalone`
//! and `streams`.

pub(crate) mod batches;
pub(crate) mod imports;
mod keyed;
pub(crate) mod operators;
pub(crate) mod payloads;
pub(crate) mod queries;
mod redrive;
pub(crate) mod schedules;
mod standalone;
pub(crate) mod streams;

use crate::program::{Programs, Step};
use crate::report::Failure;
use crate::workload::{DECLARED, NAMESPACE, PAYLOAD, PLAIN, QUEUE, SIMULATED_CLIENT, WORKFLOW_TYPE};
use crate::world::{pick, Acted, World};
use capstan_app::{control, Services};
use capstan_engine::service_call::CallMode;
use capstan_engine::{accept_update, admit_update, CloseCommand, CommandId, CommandReceipt, Cx, Payload, Principal, RunState, WorkflowId};
use capstan_store::{CommandKey, DuplicatePolicy, RunLocator};
use keyed::{judge_keyed, sends};
use payloads::Uploads;
use rand::Rng;
use schedules::Schedules;
use serde_json::{json, Map};
use standalone::Standalone;
use streams::Ingested;

/// The name of the update clients send.
const UPDATE_NAME: &str = "bump";

/// What the clients know.
#[derive(Default)]
pub(crate) struct Clients {
    /// The programs of the workflows the clients started (and their standalone activities').
    pub(crate) programs: Programs,
    pub(crate) schedules: Schedules,
    /// Payloads clients uploaded to the runtime transport.
    pub(crate) uploads: Uploads,
    /// The stream messages clients know were ingested.
    pub(crate) ingested: Ingested,
    /// The ids of the standalone activities clients started (a host run each, no program).
    standalone: Standalone,
    /// The closed runs operators imported, and what each copy must hold.
    pub(crate) imports: imports::Imports,
    /// The batch operations operators started.
    pub(crate) batches: batches::Batches,
}

impl Clients {
    /// A client starts a workflow (a random program, a strict one, or a standalone activity),
    /// until the seed's workflows are started.
    pub(crate) async fn start_workflow(&mut self, world: &mut World) -> Result<Acted, Failure> {
        if self.programs.count() >= world.config.workflows {
            return Ok(Acted::Idle);
        }
        if world.rng.random_bool(0.2) {
            self.standalone.start(world, &mut self.programs).await?;
            return Ok(Acted::Done);
        }
        if world.rng.random_bool(0.3) {
            // A line of plain activities that fails with a failed one: a client may redrive it.
            let steps = world.rng.random_range(3..=5);
            let program = std::iter::once(Step::FailWithActivity).chain((0..steps).map(|_| Step::Activity(PLAIN)));
            self.start_program(world, program.collect()).await?;
            return Ok(Acted::Done);
        }
        let program = random_program(world);
        self.start_program(world, program).await?;
        Ok(Acted::Done)
    }

    /// A client starts a workflow that runs `program`, sometimes twice (a lost response).
    async fn start_program(&mut self, world: &mut World, program: Vec<Step>) -> Result<(), Failure> {
        let index = self.programs.count();
        let workflow_id = format!("sim-{}-{index}", world.config.seed);
        world.trace(|| format!("start {workflow_id} {program:?}"));
        let start = control::StartRequest {
            namespace: NAMESPACE.into(),
            workflow_id: Some(workflow_id.clone()),
            workflow_type: WORKFLOW_TYPE.into(),
            task_queue: QUEUE.into(),
            input: self.uploads.start_input(world, &workflow_id).await?,
            execution_timeout_seconds: None,
            run_timeout_seconds: None,
            business_key: None,
            memo: Map::new(),
            search_attributes: Map::new(),
            build_id: None,
            duplicate_policy: DuplicatePolicy::Fail,
            origin_trace: None,
            principal: Some(Principal::token(SIMULATED_CLIENT)),
            // Runs of every urgency and a few tenants share the queue (DW's priority and fairness).
            priority: Some(world.rng.random_range(0..=9)),
            fairness_key: [None, Some("tenant-a"), Some("Tenant-B ")][world.rng.random_range(0..3)].map(str::to_string),
            fairness_weight: Some(world.rng.random_range(1..=3)),
        };
        self.programs.insert(workflow_id.clone(), program);
        world.seen.instances.insert(workflow_id.clone());
        let result = control::start(&world.app, start.clone()).await;
        let Some(started) = world.declined(result)? else {
            return Ok(());
        };
        world.seen.acknowledge(&started.run);
        // A client retry of the same start (its response was lost) starts nothing new.
        if world.rng.random_bool(0.3) {
            let again = control::StartRequest {
                duplicate_policy: DuplicatePolicy::UseExisting,
                ..start
            };
            let again = control::start(&world.app, again).await;
            if let Some(repeated) = world.declined(again)? {
                if repeated.run.run_id != started.run.run_id {
                    return Err(world.fail(format!("a repeated start of {workflow_id} opened another run")));
                }
            }
        }
        Ok(())
    }

    /// One of the workflows the clients started, at random.
    pub(crate) fn random_started_workflow(&self, world: &mut World) -> Option<String> {
        pick(&mut world.rng, self.programs.ids())
    }

    pub(crate) async fn send_signal(&self, world: &mut World) -> Result<Acted, Failure> {
        let Some(workflow_id) = self.random_started_workflow(world) else {
            return Ok(Acted::Idle);
        };
        self.signal_waiting(world, &workflow_id).await?;
        Ok(Acted::Done)
    }

    /// Sends the signal the workflow's program waits for next (any of them, at random, in the
    /// faulty phase: signals may come before their wait opens).
    pub(crate) async fn signal_waiting(&self, world: &mut World, workflow_id: &str) -> Result<(), Failure> {
        let signals = self.programs.signals(workflow_id);
        if signals.is_empty() {
            return Ok(());
        }
        let n = signals[world.rng.random_range(0..signals.len())];
        let name = format!("go-{n}");
        world.trace(|| format!("signal {name} to {workflow_id}"));
        let request = control::SignalRequest {
            target: target(workflow_id),
            signal_name: name,
            input: Payload::avro(PAYLOAD),
            request_id: None,
            trace: None,
            principal: Some(Principal::token(SIMULATED_CLIENT)),
        };
        let result = control::signal(
            &world.app,
            request,
            |receipt: &CommandReceipt, _: &RunState| json!({"signal_id": receipt.signal_id}),
        )
        .await;
        if let Some(run) = world.declined(result)?.and_then(|receipt| receipt.run) {
            world.seen.acknowledge(&run);
        }
        Ok(())
    }

    /// A client sends an update; a retry must get the first acceptance's update id back.
    pub(crate) async fn send_update(&self, world: &mut World) -> Result<Acted, Failure> {
        let Some(workflow_id) = self.random_started_workflow(world) else {
            return Ok(Acted::Idle);
        };
        let key = CommandKey {
            command_type: "update".into(),
            request_id: format!("update-{}", world.step),
            intent_hash: format!("{UPDATE_NAME}:{PAYLOAD}"),
        };
        let command_id = CommandId(world.app.new_id());
        let mut answers = Vec::new();
        for send in 1..=sends(world) {
            world.trace(|| format!("update to {workflow_id} (request {}, send {send})", key.request_id));
            let command_id = command_id.clone();
            let transition = move |run: &mut RunState, cx: &mut Cx| {
                admit_update(run, UPDATE_NAME, None)?;
                accept_update(run, cx, UPDATE_NAME, Payload::avro(PAYLOAD), command_id)
            };
            let render = |(update_id, _): &(String, CommandReceipt), run: &RunState| json!({"update_id": update_id, "run_id": run.run_id});
            let locator = RunLocator::Current(WorkflowId(workflow_id.clone()));
            answers.push(control::apply(&world.app, NAMESPACE, locator, Some(key.clone()), transition, render).await);
        }
        let Some((applied, receipts)) = judge_keyed(world, "update", &key.request_id, answers)? else {
            return Ok(Acted::Done);
        };
        let update_id = applied["update_id"].as_str().unwrap_or_default().to_string();
        world.counters.updates_accepted += 1;
        for body in receipts {
            if body["update_id"].as_str() != Some(update_id.as_str()) {
                return Err(world.fail(format!("a retried update answered {body} from its receipt, not update {update_id}")));
            }
            world.counters.update_retries_answered_from_receipt += 1;
        }
        Ok(Acted::Done)
    }

    /// A client cancels or terminates a workflow: its children are terminated by their
    /// parent-close policy, its open calls end, a dispatched declared action becomes
    /// `outcome_unknown`.
    pub(crate) async fn close_workflow(&self, world: &mut World) -> Result<Acted, Failure> {
        let Some(workflow_id) = self.random_started_workflow(world) else {
            return Ok(Acted::Idle);
        };
        if world.rng.random_bool(0.4) {
            request_cooperative_cancellation(world, &workflow_id).await?;
            return Ok(Acted::Done);
        }
        let kind = if world.rng.random_bool(0.5) {
            CloseCommand::Cancel
        } else {
            CloseCommand::Terminate
        };
        let request_id = format!("close-{}", world.step);
        let mut answers = Vec::new();
        for send in 1..=sends(world) {
            world.trace(|| format!("{kind:?} to {workflow_id} (request {request_id}, send {send})"));
            let request = control::CloseRequest {
                target: target(&workflow_id),
                kind,
                reason: Some("simulated client".into()),
                request_id: Some(request_id.clone()),
                trace: None,
                principal: Some(Principal::token(SIMULATED_CLIENT)),
            };
            let render = |receipt: &CommandReceipt, _: &RunState| json!({"command_id": receipt.command_id});
            answers.push(control::close(&world.app, request, render).await);
        }
        let what = format!("{kind:?}").to_lowercase();
        let sent = judge_keyed(world, &what, &request_id, answers)?;
        if sent.is_some() {
            world.counters.closed_by_clients += 1;
        }
        // Its children heard of it in the same transaction: check them now.
        let children = format!("{workflow_id}-r");
        let runs: Vec<String> = world
            .seen
            .run_workflows
            .iter()
            .filter(|(_, w)| w.starts_with(&children))
            .map(|(r, _)| r.clone())
            .collect();
        world.seen.touched.extend(runs);
        Ok(Acted::Done)
    }

    /// A client appends a message to a started workflow's stream (see `streams`).
    pub(crate) async fn append_message(&mut self, world: &mut World) -> Result<Acted, Failure> {
        self.ingested.append(world, &self.programs).await
    }

    /// A client uploads a payload nothing will name, sometimes; then a collection (see `payloads`).
    pub(crate) async fn collect_payloads(&mut self, world: &mut World) -> Result<Acted, Failure> {
        self.uploads.collect(world).await?;
        Ok(Acted::Done)
    }

    /// A client redrives a random strict workflow's current run (see `redrive`).
    pub(crate) async fn redrive_one(&self, world: &mut World) -> Result<Acted, Failure> {
        redrive::redrive_one(world, &self.programs).await
    }

    /// After the faults: every strict workflow whose current run failed is redriven once.
    pub(crate) async fn redrive_every_failed(&self, world: &mut World) -> Result<(), Failure> {
        redrive::redrive_every_failed(world, &self.programs).await
    }
}

/// A random program of one to five steps, at most one of them a continue-as-new.
fn random_program(world: &mut World) -> Vec<Step> {
    let length = world.rng.random_range(1..=5);
    let mut signals = 0;
    let mut continued = false;
    (0..length)
        .map(|_| match world.rng.random_range(0..16) {
            13..=14 => Step::LocalActivity,
            0..=2 => Step::Activity(PLAIN),
            3..=4 => Step::Activity(DECLARED),
            5..=6 => Step::Timer(world.rng.random_range(1..=5)),
            7..=8 => {
                signals += 1;
                Step::Signal(signals)
            }
            9 => Step::Child,
            10 if world.rng.random_bool(0.5) => Step::Nexus(CallMode::Sync),
            10 => Step::Nexus(CallMode::Async),
            11 => Step::SessionActivity,
            15 => Step::Condition(world.rng.random_range(1..=3)),
            _ if continued => Step::Stream,
            _ => {
                continued = true;
                Step::ContinueAsNew
            }
        })
        .collect()
}

/// A client asks a workflow to stop cooperatively: the run stays open until a worker
/// delivers the request at a call and the workflow's cleanup ends it, or the cleanup
/// deadline does. (Workers' steps call it too: a client loses patience while they work.)
pub(crate) async fn request_cooperative_cancellation(world: &mut World, workflow_id: &str) -> Result<(), Failure> {
    world.trace(|| format!("cooperative cancellation requested for {workflow_id}"));
    let cleanup_seconds = world.rng.random_range(20..=120);
    let result = capstan_app::cancellation::request(
        &world.app,
        target(workflow_id),
        Some("simulated".into()),
        cleanup_seconds,
        Some(Principal::token(SIMULATED_CLIENT)),
    )
    .await;
    if let Some((outcome, run)) = world.declined(result)? {
        if !outcome.duplicate {
            world.counters.cancellations[0] += 1;
        }
        world.seen.acknowledge(&run);
    }
    Ok(())
}

fn target(workflow_id: &str) -> control::Target {
    control::Target {
        namespace: NAMESPACE.into(),
        workflow_id: workflow_id.to_string(),
        run_id: None,
    }
}
