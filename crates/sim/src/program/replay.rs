//! The simulated SDK's replay: what a worker holding a workflow task decides from the run's
//! history. It settles accepted updates first, ends the run when a cancellation was delivered
//! or a strict program's activity failed, and otherwise walks the run's part of the program,
//! step by step, to the next command (or to the prepared local call it must run first).

use super::nexus;
use super::{cancellation_policy_of, session_of, Step};
use crate::workload::{CHILD_TYPE, PAYLOAD, PLAIN};
use capstan_engine::workflow_stream::{StreamDirective, StreamItemInput, StreamOperation};
use capstan_engine::{
    ActivityTimeouts, EventType, FailureBoundary, HistoryEvent, Payload, ResumeContext, RetryPolicy, ScheduleActivity, StartChild, Task,
    TaskDetail, WorkflowCommand, WorkflowFailure,
};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// Where the k-th step of a kind stands. Steps run one at a time, so the k-th opening and the
/// k-th closing event of a kind belong to the k-th step of that kind.
enum Progress {
    Done,
    Waiting,
    Next,
}

fn progress(k: usize, (opened, closed): (usize, usize)) -> Progress {
    if k <= closed {
        Progress::Done
    } else if k <= opened {
        Progress::Waiting
    } else {
        Progress::Next
    }
}

/// A prepared local call the replay stopped at: its step (`None`: the run's next one) and
/// whether an attempt of it was left unfinished by a lost claim (then it is recovered first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LocalCall {
    pub sequence: Option<u32>,
    pub recover: bool,
}

fn is_local(event: &HistoryEvent) -> bool {
    event.payload.get("execution_mode").and_then(Value::as_str) == Some("local")
}

/// Where the k-th prepared local call stands in history (k counted from 1).
fn local_call(history: &[HistoryEvent], k: usize) -> LocalCall {
    let scheduled = history
        .iter()
        .filter(|e| is_local(e) && e.event_type == EventType::ActivityScheduled)
        .nth(k - 1)
        .and_then(|e| e.payload.get("sequence").and_then(Value::as_u64));
    let last = history
        .iter()
        .rev()
        .find(|e| is_local(e) && scheduled.is_some() && e.payload.get("sequence").and_then(Value::as_u64) == scheduled);
    let recover = last.is_some_and(|e| matches!(e.event_type, EventType::ActivityStarted | EventType::ActivityHeartbeatRecorded));
    LocalCall {
        sequence: scheduled.map(|s| s as u32),
        recover,
    }
}

/// The simulated SDK: replays a program against the history and answers the next commands
/// (see [`progress`]), or the prepared local call it stopped at. Run N of an instance runs the
/// N-th part of the program (parts end at `ContinueAsNew`). Accepted updates are settled
/// first, as an SDK runs update handlers.
pub(crate) fn decide(
    workflow_id: &str,
    program: &[Step],
    history: &[HistoryEvent],
    identity: &str,
) -> (Vec<WorkflowCommand>, Option<LocalCall>) {
    if history
        .iter()
        .any(|e| e.event_type.as_str().starts_with("Workflow") && e.event_type != EventType::WorkflowStarted)
    {
        return (Vec::new(), None);
    }
    let mut commands = settle_updates(history);
    // A delivered cancellation ends the program: its cleanup is to finish.
    if history.iter().any(|e| e.event_type == EventType::CooperativeCancellationDelivered) {
        commands.push(complete());
        return (commands, None);
    }
    let strict = program.first() == Some(&Step::FailWithActivity);
    if strict {
        if let Some(failed) = history
            .iter()
            .find(|e| matches!(e.event_type, EventType::ActivityFailed | EventType::ActivityTimedOut) && !is_local(e))
        {
            commands.push(fail_with_step(failed));
            return (commands, None);
        }
    }
    let run_number = history
        .iter()
        .find(|e| e.event_type == EventType::WorkflowStarted)
        .and_then(|e| e.payload.get("run_number"))
        .and_then(Value::as_u64)
        .unwrap_or(1) as usize;
    let parts: Vec<&[Step]> = program.split(|s| *s == Step::ContinueAsNew).collect();
    // A strict program has one part: its later runs are redrives of the first.
    let (part, last_part) = match strict {
        true => (&program[1..], true),
        false => (parts.get(run_number - 1).copied().unwrap_or(&[]), run_number >= parts.len()),
    };
    let mut replay = Replay::new(workflow_id, history, identity, run_number);
    for step in part {
        match replay.next(step) {
            Next::Past => {}
            Next::Rides(command) => commands.push(command),
            Next::Waiting => return (commands, None),
            Next::Local(call) => return (commands, Some(call)),
            Next::Command(command) => {
                commands.push(command);
                return (commands, None);
            }
        }
    }
    commands.push(if last_part { complete() } else { continue_as_new() });
    (commands, None)
}

/// The completions of the updates the history accepted and has not settled yet.
fn settle_updates(history: &[HistoryEvent]) -> Vec<WorkflowCommand> {
    let update_id = |e: &HistoryEvent| e.payload.get("update_id").and_then(Value::as_str).unwrap_or("").to_string();
    let settled: BTreeSet<String> = history
        .iter()
        .filter(|e| e.event_type == EventType::UpdateCompleted)
        .map(update_id)
        .collect();
    history
        .iter()
        .filter(|e| e.event_type == EventType::UpdateAccepted && !settled.contains(&update_id(e)))
        .map(|e| WorkflowCommand::CompleteUpdate {
            update_id: update_id(e),
            result: Payload::avro(PAYLOAD),
        })
        .collect()
}

/// What one step of the program comes to in the replay.
enum Next {
    /// The history has it done: on to the next step.
    Past,
    /// A command that rides with the next step's (a stream append): on to the next step.
    Rides(WorkflowCommand),
    /// The history has it open: nothing more to command yet.
    Waiting,
    /// The prepared local call the task must run before it can go on.
    Local(LocalCall),
    /// The step's command, the last of the task.
    Command(WorkflowCommand),
}

/// A replay of one run's history: what it opened and closed of each kind of step, and how many
/// steps of each kind the walk through the program has passed.
struct Replay<'a> {
    workflow_id: &'a str,
    history: &'a [HistoryEvent],
    identity: &'a str,
    run_number: usize,
    /// `(opened, closed)` per kind.
    activities: (usize, usize),
    locals: (usize, usize),
    timers: (usize, usize),
    conditions: (usize, usize),
    children: (usize, usize),
    calls: (usize, usize),
    side_effects: usize,
    /// The steps of each kind walked so far.
    walked: Walked,
}

#[derive(Default)]
struct Walked {
    activity: usize,
    timer: usize,
    condition: usize,
    child: usize,
    local: usize,
    stream: usize,
    calls: usize,
}

impl<'a> Replay<'a> {
    fn new(workflow_id: &'a str, history: &'a [HistoryEvent], identity: &'a str, run_number: usize) -> Self {
        let count = |types: &[EventType], local: bool| {
            history
                .iter()
                .filter(|e| types.contains(&e.event_type) && is_local(e) == local)
                .count()
        };
        // A wait's timeout timer is the wait's, not a timer step of the program.
        let user_timers = |event_type: EventType| {
            history
                .iter()
                .filter(|e| e.event_type == event_type && !e.payload.contains_key("timer_kind"))
                .count()
        };
        let ends = [EventType::ActivityCompleted, EventType::ActivityFailed, EventType::ActivityTimedOut];
        // A redriven run's copied completions were scheduled in the run it redrives.
        let reused = history
            .iter()
            .filter(|e| e.event_type == EventType::ActivityCompleted && e.payload.contains_key("reused_from_run_id"))
            .count();
        let child_ends = [
            EventType::ChildRunCompleted,
            EventType::ChildRunFailed,
            EventType::ChildRunCancelled,
            EventType::ChildRunTerminated,
        ];
        Replay {
            workflow_id,
            history,
            identity,
            run_number,
            activities: (count(&[EventType::ActivityScheduled], false) + reused, count(&ends, false)),
            locals: (count(&[EventType::ActivityScheduled], true), count(&ends, true)),
            timers: (user_timers(EventType::TimerScheduled), user_timers(EventType::TimerFired)),
            conditions: (
                count(&[EventType::ConditionWaitOpened], false),
                count(&[EventType::ConditionWaitSatisfied, EventType::ConditionWaitTimedOut], false),
            ),
            children: (count(&[EventType::ChildWorkflowScheduled], false), count(&child_ends, false)),
            calls: nexus::call_progress(history),
            side_effects: count(&[EventType::SideEffectRecorded], false),
            walked: Walked::default(),
        }
    }

    /// Whether the history holds a signal event of `event_type` for `name`.
    fn has(&self, event_type: EventType, name: &str) -> bool {
        self.history
            .iter()
            .any(|e| e.event_type == event_type && e.payload.get("signal_name").and_then(Value::as_str) == Some(name))
    }

    fn next(&mut self, step: &Step) -> Next {
        let command = |k: usize, stands: (usize, usize), command: &dyn Fn() -> WorkflowCommand| match progress(k, stands) {
            Progress::Done => Next::Past,
            Progress::Waiting => Next::Waiting,
            Progress::Next => Next::Command(command()),
        };
        let walked = &mut self.walked;
        match step {
            Step::Activity(_) | Step::SessionActivity => {
                walked.activity += 1;
                command(walked.activity, self.activities, &|| schedule_activity(self.workflow_id, step))
            }
            Step::Timer(seconds) => {
                walked.timer += 1;
                let timer = || WorkflowCommand::StartTimer {
                    delay_seconds: *seconds,
                    tags: Map::new(),
                };
                command(walked.timer, self.timers, &timer)
            }
            Step::Condition(seconds) => {
                walked.condition += 1;
                let wait = || WorkflowCommand::OpenConditionWait {
                    condition_key: Some("never".into()),
                    fingerprint: None,
                    timeout_seconds: Some(*seconds),
                    tags: Map::new(),
                    occurrence_id: None,
                };
                command(walked.condition, self.conditions, &wait)
            }
            Step::Signal(n) => {
                let name = format!("go-{n}");
                if self.has(EventType::SignalReceived, &name) {
                    return Next::Past;
                }
                if self.has(EventType::SignalWaitOpened, &name) {
                    return Next::Waiting;
                }
                Next::Command(WorkflowCommand::OpenSignalWait {
                    signal_name: name,
                    timeout_seconds: None,
                    tags: Map::new(),
                })
            }
            Step::Child => {
                walked.child += 1;
                let child = walked.child;
                command(child, self.children, &|| start_child(self.workflow_id, self.run_number, child))
            }
            Step::Nexus(mode) => {
                walked.calls += 1;
                command(walked.calls, self.calls, &|| nexus::call(*mode))
            }
            Step::LocalActivity => {
                walked.local += 1;
                match progress(walked.local, self.locals) {
                    Progress::Done => Next::Past,
                    Progress::Waiting => Next::Local(local_call(self.history, walked.local)),
                    Progress::Next => Next::Local(LocalCall {
                        sequence: None,
                        recover: false,
                    }),
                }
            }
            Step::Stream => {
                walked.stream += 1;
                match walked.stream > self.side_effects {
                    true => Next::Rides(stream_append(self.identity, walked.stream as u64 - 1)),
                    false => Next::Past,
                }
            }
            Step::ContinueAsNew => unreachable!("parts are split at ContinueAsNew"),
            Step::FailWithActivity => unreachable!("only a program's first step"),
        }
    }
}

/// An activity step's command: its type (a session activity is a plain one in the instance's
/// session), retried twice with a 10 s start-to-close budget.
fn schedule_activity(workflow_id: &str, step: &Step) -> WorkflowCommand {
    let activity_type = match step {
        Step::Activity(activity_type) => activity_type,
        _ => &PLAIN,
    };
    WorkflowCommand::ScheduleActivity(ScheduleActivity {
        activity_type: activity_type.to_string(),
        arguments: Payload::avro(PAYLOAD),
        queue: None,
        retry_policy: Some(RetryPolicy {
            max_attempts: Some(3),
            backoff_seconds: vec![1],
            non_retryable_error_types: vec![],
        }),
        timeouts: ActivityTimeouts {
            start_to_close_seconds: Some(10),
            schedule_to_start_seconds: None,
            schedule_to_close_seconds: None,
            heartbeat_seconds: None,
        },
        tags: Map::new(),
        cancellation_policy: cancellation_policy_of(workflow_id),
        worker_session: (*step == Step::SessionActivity).then(|| session_of(workflow_id)),
    })
}

/// The `child`-th child of a run: terminated when its parent closes.
fn start_child(workflow_id: &str, run_number: usize, child: usize) -> WorkflowCommand {
    WorkflowCommand::StartChildWorkflow(StartChild {
        workflow_type: CHILD_TYPE.into(),
        arguments: Payload::avro(PAYLOAD),
        queue: None,
        workflow_id: Some(format!("{workflow_id}-r{run_number}-child-{child}")),
        parent_close_policy: "terminate".into(),
        cancellation_policy: cancellation_policy_of(workflow_id).map_or("abandon", |p| p.as_str()).into(),
        execution_timeout_seconds: None,
        run_timeout_seconds: None,
        retry_policy: None,
        tags: Map::new(),
        observability_context: None,
    })
}

fn complete() -> WorkflowCommand {
    WorkflowCommand::CompleteWorkflow {
        result: Payload::avro(PAYLOAD),
    }
}

fn continue_as_new() -> WorkflowCommand {
    WorkflowCommand::ContinueAsNew {
        arguments: Payload::avro(PAYLOAD),
        workflow_type: None,
        queue: None,
        tags: Map::new(),
        observability_context: None,
    }
}

/// The command identity a task's stream directives carry, as the SDKs take it from the poll:
/// the command that caused the task, else the task's id.
pub(crate) fn command_identity(task: &Task) -> String {
    match &task.detail {
        TaskDetail::Workflow {
            resume: Some(ResumeContext::Signal { command_id, .. } | ResumeContext::Update { command_id, .. }),
            ..
        } => command_id.as_str().to_string(),
        _ => task.id.as_str().to_string(),
    }
}

/// Two items for the run's output stream `out`, keyed as the SDKs key them.
fn stream_append(identity: &str, ordinal: u64) -> WorkflowCommand {
    let item = |index: usize| StreamItemInput {
        payload: Some(Payload::avro(PAYLOAD)),
        payload_reference: None,
        item_type: None,
        content_type: None,
        idempotency_key: Some(format!("dw-stream:{identity}:{ordinal}:{index}")),
    };
    WorkflowCommand::RecordSideEffect {
        result: Payload::avro(PAYLOAD),
        tags: Map::new(),
        stream: Some(StreamDirective {
            stream_name: "out".into(),
            command_identity: identity.into(),
            command_ordinal: ordinal,
            operation: StreamOperation::Append {
                items: vec![item(0), item(1)],
                max_pending_items: None,
            },
        }),
    }
}

/// A strict program's failure: the activity's, naming its step, as the SDKs send it when an
/// activity failure escapes the workflow.
fn fail_with_step(failed: &HistoryEvent) -> WorkflowCommand {
    let text = |key: &str| failed.payload.get(key).and_then(Value::as_str).unwrap_or("").to_string();
    WorkflowCommand::FailWorkflow(WorkflowFailure {
        message: format!("activity {} failed", text("activity_execution_id")),
        exception_type: Some("ActivityFailed".into()),
        boundary: Some(FailureBoundary {
            failed_step_sequence: failed.payload.get("sequence").and_then(Value::as_i64).unwrap_or(0),
            failed_activity_execution_id: text("activity_execution_id"),
        }),
        ..Default::default()
    })
}
