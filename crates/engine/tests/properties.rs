//! Property tests: random interleavings of leases, reports (fresh, stale, duplicated, from the
//! wrong owner), expiries, signals and cancels never break the execution guarantees.

use capstan_engine::*;
use proptest::prelude::*;
use serde_json::Map;
use std::collections::{BTreeMap, BTreeSet};

const LEASE_MS: i64 = 5_000;
const OWNERS: [&str; 2] = ["worker-a", "worker-b"];

#[derive(Clone, Debug)]
enum Op {
    LeaseWorkflow {
        owner: usize,
    },
    CompleteWorkflow {
        pick: usize,
        owner: usize,
        plan: usize,
    },
    FailWorkflow {
        pick: usize,
        owner: usize,
        benign: bool,
    },
    LeaseActivity {
        owner: usize,
    },
    CompleteActivity {
        pick: usize,
        owner: usize,
    },
    FailActivity {
        pick: usize,
        owner: usize,
        fatal: bool,
    },
    HeartbeatActivity {
        pick: usize,
        owner: usize,
    },
    Signal,
    Update,
    /// The clock moves; the background sweep may or may not have run yet.
    Advance {
        ms: i64,
        sweep: bool,
    },
    Cancel,
    /// A cooperative cancellation request (the run stays open for cleanup).
    RequestCancellation,
    /// A worker delivers the request at some step, with whichever lease it holds.
    DeliverCancellation {
        pick: usize,
        owner: usize,
        step: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..2usize).prop_map(|owner| Op::LeaseWorkflow { owner }),
        4 => (0..8usize, 0..2usize, 0..5usize).prop_map(|(pick, owner, plan)| Op::CompleteWorkflow { pick, owner, plan }),
        1 => (0..8usize, 0..2usize, any::<bool>()).prop_map(|(pick, owner, benign)| Op::FailWorkflow { pick, owner, benign }),
        3 => (0..2usize).prop_map(|owner| Op::LeaseActivity { owner }),
        4 => (0..8usize, 0..2usize).prop_map(|(pick, owner)| Op::CompleteActivity { pick, owner }),
        2 => (0..8usize, 0..2usize, any::<bool>()).prop_map(|(pick, owner, fatal)| Op::FailActivity { pick, owner, fatal }),
        1 => (0..8usize, 0..2usize).prop_map(|(pick, owner)| Op::HeartbeatActivity { pick, owner }),
        2 => Just(Op::Signal),
        1 => Just(Op::Update),
        3 => (0..8_000i64, any::<bool>()).prop_map(|(ms, sweep)| Op::Advance { ms, sweep }),
        1 => Just(Op::Cancel),
        1 => Just(Op::RequestCancellation),
        2 => (0..8usize, 0..2usize, 1..4u32).prop_map(|(pick, owner, step)| Op::DeliverCancellation { pick, owner, step }),
    ]
}

fn plan(plan: usize) -> Vec<WorkflowCommand> {
    let activity = || {
        WorkflowCommand::ScheduleActivity(ScheduleActivity {
            activity_type: "act".into(),
            arguments: Payload::avro("a"),
            queue: None,
            retry_policy: Some(RetryPolicy {
                max_attempts: Some(3),
                backoff_seconds: vec![1],
                non_retryable_error_types: vec![],
            }),
            timeouts: ActivityTimeouts {
                start_to_close_seconds: Some(4),
                ..Default::default()
            },
            cancellation_policy: None,
            worker_session: None,
            tags: Map::new(),
        })
    };
    match plan {
        0 => vec![activity()],
        1 => vec![activity(), activity()],
        2 => vec![WorkflowCommand::StartTimer {
            delay_seconds: 2,
            tags: Map::new(),
        }],
        3 => vec![WorkflowCommand::OpenConditionWait {
            condition_key: Some("k".into()),
            fingerprint: None,
            timeout_seconds: Some(3),
            tags: Map::new(),
            occurrence_id: None,
        }],
        _ => vec![WorkflowCommand::CompleteWorkflow {
            result: Payload::avro("done"),
        }],
    }
}

struct World {
    run: RunState,
    ids: SequentialIds,
    limits: Limits,
    now: Millis,
    history: Vec<HistoryEvent>,
    /// Every workflow lease ever granted: (task, owner, fence).
    workflow_leases: Vec<(TaskId, String, u64)>,
    /// Every activity attempt ever granted: (task, attempt, owner).
    attempts: Vec<(TaskId, ActivityAttemptId, String)>,
    last_fence: BTreeMap<TaskId, u64>,
}

impl World {
    fn new() -> Self {
        let limits = Limits::default();
        let mut ids = SequentialIds::new("p");
        let now = 10_000_000;
        let mut cx = Cx::new(now, &mut ids, &limits);
        let run = start_run(
            &mut cx,
            StartRun {
                scheduling: Default::default(),
                namespace: "default".into(),
                workflow_id: "wf".into(),
                run_id: "run".into(),
                workflow_type: "t".into(),
                task_queue: "q".into(),
                input: Payload::avro("in"),
                execution_timeout_seconds: None,
                run_timeout_seconds: None,
                business_key: None,
                memo: Map::new(),
                search_attributes: Map::new(),
                command_id: "start".into(),
                contract: None,
                compatibility: None,
                origin_trace: None,
                principal: None,
            },
        );
        let history = cx.effects.events;
        Self {
            run,
            ids,
            limits,
            now,
            history,
            workflow_leases: vec![],
            attempts: vec![],
            last_fence: BTreeMap::new(),
        }
    }

    fn apply<T>(&mut self, f: impl FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal>) -> Result<T, Refusal> {
        let before = self.run.clone();
        let mut cx = Cx::new(self.now, &mut self.ids, &self.limits);
        match f(&mut self.run, &mut cx) {
            Ok(value) => {
                self.history.extend(cx.effects.events);
                Ok(value)
            }
            Err(refusal) => {
                self.run = before;
                Err(refusal)
            }
        }
    }

    fn ready(&self, kind: TaskKind) -> Option<TaskId> {
        self.run
            .tasks
            .values()
            .find(|t| t.kind == kind && t.is_ready() && t.available_at <= self.now)
            .map(|t| t.id.clone())
    }

    /// The oracle: does `(owner, fence)` hold the unexpired lease of workflow task `id` right now?
    fn holds_live_lease(&self, id: &TaskId, owner: &str, fence: u64) -> bool {
        self.run
            .tasks
            .get(id)
            .and_then(|t| t.lease())
            .is_some_and(|l| l.owner == owner && l.fence == fence && l.expires_at > self.now)
    }

    fn holds_live_attempt(&self, id: &TaskId, attempt: &ActivityAttemptId, owner: &str) -> bool {
        self.run.tasks.get(id).is_some_and(|t| {
            matches!(&t.detail, TaskDetail::Activity { attempt_id: Some(a), .. } if a == attempt)
                && t.lease().is_some_and(|l| l.owner == owner && l.expires_at > self.now)
        })
    }

    fn record_fence(&mut self, task: &Task) {
        if let Some(previous) = self.last_fence.insert(task.id.clone(), task.fence) {
            assert!(task.fence > previous, "fence of {} went from {previous} to {}", task.id, task.fence);
        }
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::LeaseWorkflow { owner } => {
                if let Some(id) = self.ready(TaskKind::Workflow) {
                    let task = self
                        .apply(|run, cx| lease_workflow_task(run, cx, &id, OWNERS[owner], LEASE_MS))
                        .expect("ready task leases");
                    self.record_fence(&task);
                    self.workflow_leases.push((id, OWNERS[owner].into(), task.fence));
                }
            }
            Op::CompleteWorkflow { pick, owner, plan: p } => {
                if let Some((id, _, fence)) = self.workflow_leases.get(pick % self.workflow_leases.len().max(1)).cloned() {
                    let live = self.holds_live_lease(&id, OWNERS[owner], fence);
                    if let Ok(receipt) = self.apply(|run, cx| complete_workflow_task(run, cx, &id, OWNERS[owner], fence, plan(p))) {
                        assert!(live || receipt.retained, "a completion without the live lease was accepted");
                    }
                }
            }
            Op::FailWorkflow { pick, owner, benign } => {
                if let Some((id, _, fence)) = self.workflow_leases.get(pick % self.workflow_leases.len().max(1)).cloned() {
                    let failure = WorkflowTaskFailure {
                        message: "x".into(),
                        failure_type: Some(if benign { WAITING_FOR_HISTORY_FAILURE } else { "Boom" }.into()),
                        ..Default::default()
                    };
                    let _ = self.apply(|run, cx| fail_workflow_task(run, cx, &id, OWNERS[owner], fence, failure));
                }
            }
            Op::LeaseActivity { owner } => {
                if let Some(id) = self.ready(TaskKind::Activity) {
                    let task = self
                        .apply(|run, cx| lease_activity_task(run, cx, &id, OWNERS[owner], LEASE_MS))
                        .expect("ready task leases");
                    self.record_fence(&task);
                    let TaskDetail::Activity {
                        attempt_id: Some(attempt), ..
                    } = task.detail
                    else {
                        panic!("no attempt id")
                    };
                    self.attempts.push((id, attempt, OWNERS[owner].into()));
                }
            }
            Op::CompleteActivity { pick, owner } => {
                if let Some((id, attempt, _)) = self.attempts.get(pick % self.attempts.len().max(1)).cloned() {
                    let live = self.holds_live_attempt(&id, &attempt, OWNERS[owner]);
                    if let Ok(receipt) = self.apply(|run, cx| complete_activity(run, cx, &id, &attempt, OWNERS[owner], Payload::avro("r")))
                    {
                        assert!(
                            live || receipt.retained,
                            "an activity result without the live attempt lease was accepted"
                        );
                    }
                }
            }
            Op::FailActivity { pick, owner, fatal } => {
                if let Some((id, attempt, _)) = self.attempts.get(pick % self.attempts.len().max(1)).cloned() {
                    let failure = ActivityFailure {
                        message: "f".into(),
                        non_retryable: fatal,
                        ..Default::default()
                    };
                    let _ = self.apply(|run, cx| fail_activity(run, cx, &id, &attempt, OWNERS[owner], failure));
                }
            }
            Op::HeartbeatActivity { pick, owner } => {
                if let Some((id, attempt, _)) = self.attempts.get(pick % self.attempts.len().max(1)).cloned() {
                    let _ = self.apply(|run, cx| heartbeat_activity(run, cx, &id, &attempt, OWNERS[owner], LEASE_MS, None));
                }
            }
            Op::Signal => {
                let _ = self.apply(|run, cx| signal(run, cx, "s", Payload::avro("v"), "sig".into()));
            }
            Op::Update => {
                let _ = self.apply(|run, cx| accept_update(run, cx, "u", Payload::avro("v"), "upd".into()));
            }
            Op::Advance { ms, sweep } => {
                self.now += ms;
                if !sweep {
                    return;
                }
                let due: Vec<TaskId> = self
                    .run
                    .tasks
                    .values()
                    .filter(|t| t.deadline_at.is_some_and(|d| d <= self.now))
                    .map(|t| t.id.clone())
                    .collect();
                for id in due {
                    self.apply(|run, cx| Ok(on_deadline(run, cx, &id))).unwrap();
                }
            }
            Op::Cancel => {
                let _ = self.apply(|run, cx| close_by_command(run, cx, CloseCommand::Cancel, None, "cancel".into()));
            }
            Op::RequestCancellation => {
                let _ = self.apply(|run, cx| request_cancellation(run, cx, None, 30, "coop".into()));
            }
            Op::DeliverCancellation { pick, owner, step } => {
                if let Some((id, _, fence)) = self.workflow_leases.get(pick % self.workflow_leases.len().max(1)).cloned() {
                    let live = self.holds_live_lease(&id, OWNERS[owner], fence);
                    let delivery = DeliveryRequest {
                        request_id: "coop".into(),
                        sequence: step,
                        call_kind: "activity".into(),
                        sequence_span: 1,
                        operation_sequence: None,
                        operation_sequence_span: 1,
                    };
                    if self
                        .apply(|run, cx| deliver_cancellation(run, cx, &id, OWNERS[owner], fence, delivery))
                        .is_ok()
                    {
                        assert!(live, "a cancellation delivery without the live lease was accepted");
                    }
                }
            }
        }
    }

    fn check_invariants(&self) {
        verify_chain(&self.history).expect("history chain and sequences stay valid");

        // The history budget's counters are exactly what the history holds.
        let size: u64 = self
            .history
            .iter()
            .map(|e| capstan_engine::history_budget::event_size_bytes(e.event_type.as_str(), &e.payload))
            .sum();
        let fan_out = self
            .history
            .iter()
            .map(|e| capstan_engine::history_budget::event_fan_out(&e.payload))
            .max();
        assert_eq!(
            (self.run.history_size_bytes, self.run.history_fan_out),
            (size, fan_out.unwrap_or(0))
        );

        // At most one ready-or-leased workflow task per run.
        let workflow_tasks = self.run.tasks.values().filter(|t| t.kind == TaskKind::Workflow).count();
        assert!(workflow_tasks <= 1, "{workflow_tasks} open workflow tasks");
        if self.run.is_closed() {
            assert!(self.run.tasks.is_empty(), "a closed run holds open tasks");
        }

        // Exactly one terminal fact per run once closed, and nothing after it.
        let terminal: Vec<usize> = self
            .history
            .iter()
            .enumerate()
            .filter(|(_, e)| e.event_type.is_run_terminal())
            .map(|(i, _)| i)
            .collect();
        assert!(terminal.len() <= 1, "{} terminal events", terminal.len());
        if let Some(index) = terminal.first() {
            assert_eq!(*index, self.history.len() - 1, "events after the terminal event");
            assert!(self.run.is_closed());
        }

        // Per activity execution: at most one final outcome, no attempt after it.
        let mut finished: BTreeSet<String> = BTreeSet::new();
        // Per attempt id: at most one outcome (completed, failed, retried or timed out).
        let mut attempt_outcomes: BTreeSet<String> = BTreeSet::new();
        for event in &self.history {
            let execution = event.payload.get("activity_execution_id").map(|v| v.to_string());
            let attempt = event
                .payload
                .get("activity_attempt_id")
                .filter(|v| !v.is_null())
                .map(|v| v.to_string());
            match event.event_type {
                EventType::ActivityStarted => {
                    assert!(
                        !finished.contains(execution.as_ref().unwrap()),
                        "an attempt started after the activity finished"
                    );
                }
                EventType::ActivityCompleted | EventType::ActivityFailed | EventType::ActivityTimedOut => {
                    assert!(finished.insert(execution.unwrap()), "two final outcomes for one activity execution");
                    if let Some(attempt) = attempt {
                        assert!(attempt_outcomes.insert(attempt), "two outcomes for one attempt");
                    }
                }
                EventType::ActivityRetryScheduled => {
                    assert!(
                        attempt_outcomes.insert(attempt.expect("a retry names the attempt it follows")),
                        "two outcomes for one attempt"
                    );
                }
                _ => {}
            }
        }

        // An update is settled at most once, and only after it was accepted.
        let mut settled = BTreeSet::new();
        for event in self.history.iter().filter(|e| e.event_type == EventType::UpdateCompleted) {
            assert!(settled.insert(event.payload["update_id"].to_string()), "an update completed twice");
        }
        assert!(self.history.iter().filter(|e| e.event_type == EventType::UpdateAccepted).count() >= settled.len());

        // Cooperative cancellation: one request, at most one delivery after it, and a run that
        // ends after a delivery ends cancelled (or timed out, if its own deadline came first).
        let count = |t: EventType| self.history.iter().filter(|e| e.event_type == t).count();
        assert!(count(EventType::CooperativeCancellationRequested) <= 1);
        assert!(count(EventType::CooperativeCancellationDelivered) <= count(EventType::CooperativeCancellationRequested));
        if count(EventType::CooperativeCancellationDelivered) == 1 && self.run.is_closed() {
            assert!(
                matches!(self.run.closed_reason, Some(ClosedReason::Cancelled) | Some(ClosedReason::TimedOut)),
                "a run ended {:?} after a delivered cancellation",
                self.run.closed_reason
            );
        }

        // Each timer fires at most once.
        let mut fired = BTreeSet::new();
        for event in self.history.iter().filter(|e| e.event_type == EventType::TimerFired) {
            assert!(fired.insert(event.payload["timer_id"].to_string()), "a timer fired twice");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, .. ProptestConfig::default() })]

    #[test]
    fn random_interleavings_keep_every_guarantee(ops in proptest::collection::vec(op(), 1..120)) {
        let mut world = World::new();
        for op in ops {
            world.step(op);
            world.check_invariants();
        }
    }
}

/// Liveness: once faults stop and a well-behaved worker answers, every run finishes.
#[test]
fn a_well_behaved_worker_always_finishes_the_run() {
    let mut runner = proptest::test_runner::TestRunner::default();
    runner
        .run(&proptest::collection::vec(op(), 0..80), |ops| {
            let mut world = World::new();
            for op in ops {
                world.step(op);
            }
            let mut completed_steps = 0;
            for _ in 0..400 {
                if world.run.is_closed() {
                    break;
                }
                world.step(Op::Advance { ms: 1_000, sweep: true });
                if let Some(id) = world.ready(TaskKind::Activity) {
                    let task = world.apply(|run, cx| lease_activity_task(run, cx, &id, "good", LEASE_MS)).unwrap();
                    let TaskDetail::Activity {
                        attempt_id: Some(attempt), ..
                    } = task.detail
                    else {
                        unreachable!()
                    };
                    world
                        .apply(|run, cx| complete_activity(run, cx, &id, &attempt, "good", Payload::avro("r")))
                        .unwrap();
                }
                if let Some(id) = world.ready(TaskKind::Workflow) {
                    let task = world.apply(|run, cx| lease_workflow_task(run, cx, &id, "good", LEASE_MS)).unwrap();
                    if let TaskDetail::Workflow {
                        resume: Some(ResumeContext::Update { update_id, .. }),
                        ..
                    } = &task.detail
                    {
                        let settle = vec![WorkflowCommand::CompleteUpdate {
                            update_id: update_id.clone(),
                            result: Payload::avro("r"),
                        }];
                        world
                            .apply(|run, cx| complete_workflow_task(run, cx, &id, "good", task.fence, settle))
                            .unwrap();
                        world.check_invariants();
                        continue;
                    }
                    let commands = if completed_steps < 2 { plan(0) } else { plan(4) };
                    completed_steps += 1;
                    world
                        .apply(|run, cx| complete_workflow_task(run, cx, &id, "good", task.fence, commands))
                        .unwrap();
                }
                world.check_invariants();
            }
            prop_assert!(world.run.is_closed(), "the run never finished: {:?}", world.run.status);
            Ok(())
        })
        .unwrap();
}
