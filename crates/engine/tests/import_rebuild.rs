//! An open run rebuilt from its history alone (an import from DW's embedded runtime) must be the
//! run Capstan kept: at every point of a random run where no lease is held, the run is exported
//! as its history and sections, imported without its state, and what the rebuild made is
//! compared with the state the engine had — what it waits on, its steps, updates, selections and
//! tasks (ids aside: the import mints its own).

use capstan_engine::import::{continuation_of, ImportStamp, ImportedRun, InFlight, OpenRunSections, CONTRACT_VERSION, IMPORT_SOURCE};
use capstan_engine::*;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use serde_json::{json, Map};
use support::Sim;

mod support;

const LEASE_MS: i64 = 5_000;

#[derive(Clone, Debug)]
enum Op {
    /// A worker takes the ready workflow task and completes it with a plan (or settles the
    /// update the task was made for).
    WorkflowTurn {
        plan: usize,
    },
    /// A worker takes the ready workflow task and fails it (the next one backs off).
    WorkflowFails,
    /// A worker starts the ready activity attempt and keeps it.
    StartActivity,
    /// A worker ends a started attempt: completed, failed (retryable or not).
    EndActivity {
        pick: usize,
        outcome: u8,
    },
    Heartbeat {
        pick: usize,
    },
    Signal {
        name: usize,
    },
    Update,
    Advance {
        ms: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..10usize).prop_map(|plan| Op::WorkflowTurn { plan }),
        1 => Just(Op::WorkflowFails),
        3 => Just(Op::StartActivity),
        3 => (0..4usize, 0..3u8).prop_map(|(pick, outcome)| Op::EndActivity { pick, outcome }),
        1 => (0..4usize).prop_map(|pick| Op::Heartbeat { pick }),
        2 => (0..2usize).prop_map(|name| Op::Signal { name }),
        1 => Just(Op::Update),
        3 => (0..9_000i64).prop_map(|ms| Op::Advance { ms }),
    ]
}

fn activity(retry: bool, timeouts: ActivityTimeouts) -> WorkflowCommand {
    WorkflowCommand::ScheduleActivity(ScheduleActivity {
        activity_type: "act".into(),
        arguments: Payload::avro("a"),
        queue: None,
        retry_policy: retry.then(|| RetryPolicy {
            max_attempts: Some(3),
            backoff_seconds: vec![1, 3],
            non_retryable_error_types: vec![],
        }),
        timeouts,
        cancellation_policy: None,
        worker_session: None,
        tags: Map::new(),
    })
}

fn plan(plan: usize) -> Vec<WorkflowCommand> {
    let none = Map::new;
    match plan {
        0 => vec![activity(
            true,
            ActivityTimeouts {
                start_to_close_seconds: Some(4),
                ..Default::default()
            },
        )],
        1 => vec![
            activity(
                false,
                ActivityTimeouts {
                    schedule_to_start_seconds: Some(6),
                    schedule_to_close_seconds: Some(20),
                    ..Default::default()
                },
            ),
            activity(
                true,
                ActivityTimeouts {
                    heartbeat_seconds: Some(3),
                    ..Default::default()
                },
            ),
        ],
        2 => vec![WorkflowCommand::StartTimer {
            delay_seconds: 2,
            tags: none(),
        }],
        3 => vec![WorkflowCommand::OpenConditionWait {
            condition_key: Some("k".into()),
            fingerprint: Some("f".into()),
            timeout_seconds: Some(3),
            occurrence_id: Some("o".into()),
            tags: none(),
        }],
        4 => vec![WorkflowCommand::OpenSignalWait {
            signal_name: "s".into(),
            timeout_seconds: Some(5),
            tags: none(),
        }],
        5 => vec![WorkflowCommand::OpenSignalWait {
            signal_name: "t".into(),
            timeout_seconds: None,
            tags: none(),
        }],
        6 => vec![
            WorkflowCommand::RecordSideEffect {
                result: Payload::avro("se"),
                tags: none(),
                stream: None,
            },
            WorkflowCommand::RecordVersionMarker {
                change_id: "c".into(),
                version: 1,
                min_supported: 0,
                max_supported: 1,
                tags: none(),
            },
            WorkflowCommand::UpsertSearchAttributes {
                attributes: json!({"k": "v"}).as_object().unwrap().clone(),
                attribute_types: None,
                tags: none(),
            },
        ],
        7 => vec![WorkflowCommand::OpenConditionWait {
            condition_key: Some("forever".into()),
            fingerprint: None,
            timeout_seconds: None,
            occurrence_id: None,
            tags: none(),
        }],
        8 => vec![WorkflowCommand::RecordSideEffect {
            result: Payload::avro("alone"),
            tags: none(),
            stream: None,
        }],
        _ => vec![WorkflowCommand::CompleteWorkflow {
            result: Payload::avro("done"),
        }],
    }
}

struct World {
    sim: Sim,
    attempts: Vec<(TaskId, ActivityAttemptId)>,
    /// Lease-free points compared.
    compared: usize,
}

impl World {
    fn new() -> Self {
        Self {
            sim: Sim::start(),
            attempts: vec![],
            compared: 0,
        }
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::WorkflowTurn { plan: p } => {
                let Some(id) = self.sim.ready(TaskKind::Workflow) else { return };
                let task = self.sim.apply(|run, cx| lease_workflow_task(run, cx, &id, "w", LEASE_MS)).unwrap();
                let commands = match &task.detail {
                    TaskDetail::Workflow {
                        resume: Some(ResumeContext::Update { update_id, .. }),
                        ..
                    } => vec![WorkflowCommand::CompleteUpdate {
                        update_id: update_id.clone(),
                        result: Payload::avro("r"),
                    }],
                    TaskDetail::Workflow { resume, .. } => self.sdk_like(plan(p), resume.as_ref()),
                    _ => unreachable!(),
                };
                self.sim
                    .apply(|run, cx| complete_workflow_task(run, cx, &id, "w", task.fence, commands))
                    .unwrap();
            }
            Op::WorkflowFails => {
                let Some(id) = self.sim.ready(TaskKind::Workflow) else { return };
                let task = self.sim.apply(|run, cx| lease_workflow_task(run, cx, &id, "w", LEASE_MS)).unwrap();
                let failure = WorkflowTaskFailure {
                    message: "x".into(),
                    failure_type: Some("Boom".into()),
                    ..Default::default()
                };
                self.sim
                    .apply(|run, cx| fail_workflow_task(run, cx, &id, "w", task.fence, failure))
                    .unwrap();
            }
            Op::StartActivity => {
                let Some(id) = self.sim.ready(TaskKind::Activity) else { return };
                let task = self.sim.apply(|run, cx| lease_activity_task(run, cx, &id, "w", LEASE_MS)).unwrap();
                if let TaskDetail::Activity {
                    attempt_id: Some(attempt), ..
                } = task.detail
                {
                    self.attempts.push((id, attempt));
                }
            }
            Op::EndActivity { pick, outcome } => {
                if self.attempts.is_empty() {
                    return;
                }
                let (id, attempt) = self.attempts.remove(pick % self.attempts.len());
                let _ = match outcome {
                    0 => self
                        .sim
                        .apply(|run, cx| complete_activity(run, cx, &id, &attempt, "w", Payload::avro("r")).map(|_| ())),
                    fatal => {
                        let failure = ActivityFailure {
                            message: "f".into(),
                            non_retryable: fatal == 2,
                            ..Default::default()
                        };
                        self.sim
                            .apply(|run, cx| fail_activity(run, cx, &id, &attempt, "w", failure).map(|_| ()))
                    }
                };
            }
            Op::Heartbeat { pick } => {
                if let Some((id, attempt)) = self.attempts.get(pick % self.attempts.len().max(1)).cloned() {
                    let details = Some(json!({"done": pick}));
                    let _ = self
                        .sim
                        .apply(|run, cx| heartbeat_activity(run, cx, &id, &attempt, "w", LEASE_MS, details));
                }
            }
            Op::Signal { name } => {
                let name = ["s", "t"][name];
                let _ = self.sim.apply(|run, cx| {
                    let command = cx.id();
                    signal(run, cx, name, Payload::avro("v"), command)
                });
            }
            Op::Update => {
                let _ = self.sim.apply(|run, cx| {
                    let command = cx.id();
                    accept_update(run, cx, "u", Payload::avro("v"), command)
                });
            }
            Op::Advance { ms } => {
                self.sim.advance(ms);
                self.attempts
                    .retain(|(id, _)| self.sim.run.tasks.get(id).is_some_and(|t| !t.is_ready()));
            }
        }
    }

    /// An SDK opens a condition wait it already has open again only when a receiver resolved it
    /// (the newest wait; the condition still fails): otherwise it goes on waiting, sending
    /// something else.
    fn sdk_like(&self, commands: Vec<WorkflowCommand>, resume: Option<&ResumeContext>) -> Vec<WorkflowCommand> {
        let resolves_newest = match resume {
            Some(ResumeContext::Signal { signal_name, .. }) => !self.sim.run.signal_waits.iter().any(|w| &w.signal_name == signal_name),
            Some(ResumeContext::AfterUpdate { .. }) => true,
            _ => false,
        };
        let newest = self.sim.run.condition_waits.last().map(|w| &w.condition_key);
        let refused = commands.iter().any(|c| match c {
            WorkflowCommand::OpenConditionWait { condition_key, .. } => {
                let open = self.sim.run.condition_waits.iter().any(|w| &w.condition_key == condition_key);
                open && !(resolves_newest && newest == Some(condition_key))
            }
            _ => false,
        });
        if refused {
            plan(8)
        } else {
            commands
        }
    }

    /// A closed run imported keeps how each of its updates ended, for their callers.
    fn check_closed_import(&mut self) {
        let (workflow_id, run_id) = (self.sim.run.workflow_id.clone(), self.sim.run.run_id.clone());
        let imported = ImportedRun::copy_of(&self.sim.run, &self.sim.history, workflow_id, run_id, stamp());
        let in_flight = InFlight {
            history_complete: true,
            ..InFlight::default()
        };
        let mut ids = SequentialIds::new("imp");
        let mut cx = Cx::new(self.sim.now, &mut ids, &self.sim.limits);
        let copy = import_run(&mut cx, imported, &in_flight).expect("a closed run imports");
        assert_eq!(copy.updates, self.sim.run.updates, "the closed copy's updates differ");
    }

    /// Where no lease is held, the run rebuilt from its history is the run.
    fn check_rebuild(&mut self) {
        if self.sim.run.is_closed() {
            return self.check_closed_import();
        }
        if self.sim.run.tasks.values().any(|t| !t.is_ready()) {
            return;
        }
        let mut imported = ImportedRun::copy_of(
            &self.sim.run,
            &self.sim.history,
            self.sim.run.workflow_id.clone(),
            self.sim.run.run_id.clone(),
            stamp(),
        );
        imported.sections = OpenRunSections::of(&self.sim.run);
        let mut ids = SequentialIds::new("imp");
        let mut cx = Cx::new(self.sim.now + 60_000, &mut ids, &self.sim.limits);
        match import_run(&mut cx, imported, &InFlight::default()) {
            Ok(rebuilt) => {
                let (rebuilt, kept) = (continuation_of(&rebuilt), continuation_of(&self.sim.run));
                for (key, value) in kept.as_object().unwrap() {
                    assert_eq!(&rebuilt[key], value, "the rebuilt run's {key} differs from the run's");
                }
                assert_eq!(cx.effects.events.len(), self.sim.history.len());
                self.compared += 1;
            }
            Err(refusal) => panic!("an open run of supported features was refused: {refusal:?}"),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, .. ProptestConfig::default() })]

    #[test]
    fn an_open_run_rebuilt_from_its_history_is_the_run(ops in proptest::collection::vec(op(), 1..80)) {
        let mut world = World::new();
        world.check_rebuild();
        for op in ops {
            world.step(op);
            world.check_rebuild();
        }
    }
}

fn stamp() -> ImportStamp {
    ImportStamp {
        source: IMPORT_SOURCE.into(),
        import_id: "imp".into(),
        dedupe_key: "d".into(),
        contract_version: CONTRACT_VERSION,
        imported_at: 0,
        source_runtime: "embedded".into(),
        bundle_checksum: "ab".repeat(32),
        source_namespace: None,
        imported_by: None,
    }
}

/// The property above compares at every lease-free point: a world that seldom reached one would
/// pass it vacuously.
#[test]
fn most_points_of_random_runs_are_compared() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut compared, mut steps) = (0, 0);
    for _ in 0..50 {
        let ops = proptest::collection::vec(op(), 40..80).new_tree(&mut runner).unwrap().current();
        let mut world = World::new();
        for op in ops {
            world.step(op);
            world.check_rebuild();
            steps += 1;
        }
        compared += world.compared;
    }
    assert!(compared * 2 > steps, "compared {compared} of {steps} points");
}
