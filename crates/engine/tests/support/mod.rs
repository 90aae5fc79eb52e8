//! The scenario harness the engine's transition tests share: a run with its own clock and ids.
#![allow(dead_code)]

use capstan_engine::*;
use serde_json::Map;

pub const LEASE_MS: i64 = 60_000;

/// A run under test with its own clock, ids and the whole history it produced so far.
pub struct Sim {
    pub run: RunState,
    pub ids: SequentialIds,
    pub limits: Limits,
    pub now: Millis,
    pub history: Vec<HistoryEvent>,
}

impl Sim {
    pub fn start() -> Self {
        Self::starting(|cx| start_run(cx, start_fixture()))
    }

    /// A standalone activity's host run (`standalone.add` on queue `q`).
    pub fn start_standalone(retry_policy: Option<RetryPolicy>, timeouts: ActivityTimeouts) -> Self {
        let start = StartStandaloneActivity {
            run: StartRun {
                scheduling: Default::default(),
                workflow_id: "act-1".into(),
                execution_timeout_seconds: None,
                run_timeout_seconds: None,
                ..start_fixture()
            },
            activity_type: "standalone.add".into(),
            activity_class: "AddActivity".into(),
            retry_policy,
            timeouts,
        };
        Self::starting(|cx| start_standalone_activity(cx, start, 1))
    }

    fn starting(start: impl FnOnce(&mut Cx) -> RunState) -> Self {
        let limits = Limits::default();
        let mut ids = SequentialIds::new("id");
        let now = 1_000_000;
        let mut cx = Cx::new(now, &mut ids, &limits);
        let run = start(&mut cx);
        let history = cx.effects.events;
        Self {
            run,
            ids,
            limits,
            now,
            history,
        }
    }

    /// Applies a transition like the store does: keep the state and events only on `Ok`.
    pub fn apply<T>(&mut self, f: impl FnOnce(&mut RunState, &mut Cx) -> Result<T, Refusal>) -> Result<T, Refusal> {
        let before = self.run.clone();
        let mut cx = Cx::new(self.now, &mut self.ids, &self.limits);
        match f(&mut self.run, &mut cx) {
            Ok(value) => {
                self.history.extend(cx.effects.events);
                assert_eq!(self.run.invariants_hold(), Ok(()), "what the transition left");
                Ok(value)
            }
            Err(refusal) => {
                self.run = before;
                Err(refusal)
            }
        }
    }

    pub fn ready_task(&self, kind: TaskKind) -> TaskId {
        self.ready(kind).expect("a ready task")
    }

    /// A task of `kind` a worker could lease now, if there is one.
    pub fn ready(&self, kind: TaskKind) -> Option<TaskId> {
        self.run
            .tasks
            .values()
            .find(|t| t.kind == kind && t.is_ready() && t.available_at <= self.now)
            .map(|t| t.id.clone())
    }

    pub fn lease_workflow(&mut self, owner: &str) -> (TaskId, u64) {
        let id = self.ready_task(TaskKind::Workflow);
        let task = self.apply(|run, cx| lease_workflow_task(run, cx, &id, owner, LEASE_MS)).unwrap();
        (id, task.fence)
    }

    pub fn complete_workflow(&mut self, owner: &str, commands: Vec<WorkflowCommand>) -> Result<Receipt, Refusal> {
        let (id, fence) = self.lease_workflow(owner);
        self.apply(|run, cx| complete_workflow_task(run, cx, &id, owner, fence, commands))
    }

    pub fn lease_activity(&mut self, owner: &str) -> (TaskId, ActivityAttemptId) {
        let id = self.ready_task(TaskKind::Activity);
        let task = self.apply(|run, cx| lease_activity_task(run, cx, &id, owner, LEASE_MS)).unwrap();
        let TaskDetail::Activity {
            attempt_id: Some(attempt), ..
        } = task.detail
        else {
            panic!("leased without attempt")
        };
        (id, attempt)
    }

    /// Moves the clock and runs every deadline that passed, as the background clock does.
    pub fn advance(&mut self, ms: i64) {
        self.now += ms;
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

    pub fn event_types(&self) -> Vec<&'static str> {
        self.history.iter().map(|e| e.event_type.as_str()).collect()
    }

    pub fn count(&self, event_type: EventType) -> usize {
        self.history.iter().filter(|e| e.event_type == event_type).count()
    }
}

/// The start of run `run-1` of `wf-1` (a `greeter` on queue `q`).
pub fn start_fixture() -> StartRun {
    StartRun {
        scheduling: Default::default(),
        namespace: "default".into(),
        workflow_id: "wf-1".into(),
        run_id: "run-1".into(),
        workflow_type: "greeter".into(),
        task_queue: "q".into(),
        input: Payload::avro("wwHioz3/VYAiNwwA"),
        execution_timeout_seconds: Some(3600),
        run_timeout_seconds: Some(600),
        business_key: None,
        memo: Map::new(),
        search_attributes: Map::new(),
        command_id: "cmd-start".into(),
        contract: None,
        compatibility: None,
        origin_trace: None,
        principal: None,
    }
}

pub fn activity(retry: Option<RetryPolicy>) -> WorkflowCommand {
    WorkflowCommand::ScheduleActivity(ScheduleActivity {
        activity_type: "greet".into(),
        arguments: Payload::avro("args"),
        queue: None,
        retry_policy: retry,
        timeouts: ActivityTimeouts::default(),
        tags: Map::new(),
        cancellation_policy: None,
        worker_session: None,
    })
}

pub fn timer_command(delay_seconds: i64) -> WorkflowCommand {
    WorkflowCommand::StartTimer {
        delay_seconds,
        tags: Map::new(),
    }
}

pub fn complete(blob: &str) -> WorkflowCommand {
    WorkflowCommand::CompleteWorkflow {
        result: Payload::avro(blob),
    }
}

pub fn retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts: Some(max_attempts),
        backoff_seconds: vec![1],
        non_retryable_error_types: vec!["Fatal".into()],
    }
}

pub fn failure(kind: &str) -> ActivityFailure {
    ActivityFailure {
        message: "boom".into(),
        failure_type: Some(kind.into()),
        ..Default::default()
    }
}
