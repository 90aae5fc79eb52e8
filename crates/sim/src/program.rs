//! The simulated workflow programs: what a worker decides from a run's history, and the small
//! helpers the workload draws with.

use super::*;

/// One of `items`, at random.
pub(crate) fn pick<'a>(rng: &mut StdRng, items: impl ExactSizeIterator<Item = &'a String>) -> Option<String> {
    let count = items.len();
    if count == 0 {
        return None;
    }
    let index = rng.random_range(0..count);
    items.into_iter().nth(index).cloned()
}

/// Where the k-th step of a kind stands. Steps run one at a time, so the k-th opening and the
/// k-th closing event of a kind belong to the k-th step of that kind.
pub(crate) enum Progress {
    Done,
    Waiting,
    Next,
}

pub(crate) fn progress(k: usize, opened: usize, closed: usize) -> Progress {
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
    let count = |types: &[EventType], local: bool| {
        history
            .iter()
            .filter(|e| types.contains(&e.event_type) && is_local(e) == local)
            .count()
    };
    let ends = [EventType::ActivityCompleted, EventType::ActivityFailed, EventType::ActivityTimedOut];
    // A redriven run's copied completions were scheduled in the run it redrives.
    let reused = history
        .iter()
        .filter(|e| e.event_type == EventType::ActivityCompleted && e.payload.contains_key("reused_from_run_id"))
        .count();
    let activities_scheduled = count(&[EventType::ActivityScheduled], false) + reused;
    let activities_resolved = count(&ends, false);
    let locals_scheduled = count(&[EventType::ActivityScheduled], true);
    let locals_resolved = count(&ends, true);
    let timers_scheduled = count(&[EventType::TimerScheduled], false);
    let timers_fired = count(&[EventType::TimerFired], false);
    let children_scheduled = count(&[EventType::ChildWorkflowScheduled], false);
    let children_closed = count(
        &[
            EventType::ChildRunCompleted,
            EventType::ChildRunFailed,
            EventType::ChildRunCancelled,
            EventType::ChildRunTerminated,
        ],
        false,
    );
    let has = |event_type: EventType, name: &str| {
        history
            .iter()
            .any(|e| e.event_type == event_type && e.payload.get("signal_name").and_then(Value::as_str) == Some(name))
    };
    if history
        .iter()
        .any(|e| e.event_type.as_str().starts_with("Workflow") && e.event_type != EventType::WorkflowStarted)
    {
        return (Vec::new(), None);
    }
    let cancellation_delivered = history.iter().any(|e| e.event_type == EventType::CooperativeCancellationDelivered);
    let update_id = |e: &HistoryEvent| e.payload.get("update_id").and_then(Value::as_str).unwrap_or("").to_string();
    let settled: BTreeSet<String> = history
        .iter()
        .filter(|e| e.event_type == EventType::UpdateCompleted)
        .map(update_id)
        .collect();
    let mut commands: Vec<WorkflowCommand> = history
        .iter()
        .filter(|e| e.event_type == EventType::UpdateAccepted && !settled.contains(&update_id(e)))
        .map(|e| WorkflowCommand::CompleteUpdate {
            update_id: update_id(e),
            result: Payload::avro(PAYLOAD),
        })
        .collect();
    // A delivered cancellation ends the program: its cleanup is to finish.
    if cancellation_delivered {
        commands.push(WorkflowCommand::CompleteWorkflow {
            result: Payload::avro(PAYLOAD),
        });
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
    let side_effects = count(&[EventType::SideEffectRecorded], false);
    let (calls_admitted, calls_resolved) = crate::nexus::call_progress(history);
    let (mut activity, mut timer, mut child, mut local, mut stream, mut calls) = (0, 0, 0, 0, 0, 0);
    for step in part {
        let next = match step {
            Step::Activity(_) | Step::SessionActivity => {
                let activity_type = match step {
                    Step::Activity(activity_type) => activity_type,
                    _ => &PLAIN,
                };
                activity += 1;
                match progress(activity, activities_scheduled, activities_resolved) {
                    Progress::Done => continue,
                    Progress::Waiting => return (commands, None),
                    Progress::Next => {}
                }
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
            Step::Timer(seconds) => {
                timer += 1;
                match progress(timer, timers_scheduled, timers_fired) {
                    Progress::Done => continue,
                    Progress::Waiting => return (commands, None),
                    Progress::Next => {}
                }
                WorkflowCommand::StartTimer {
                    delay_seconds: *seconds,
                    tags: Map::new(),
                }
            }
            Step::Signal(n) => {
                let name = format!("go-{n}");
                if has(EventType::SignalReceived, &name) {
                    continue;
                }
                if has(EventType::SignalWaitOpened, &name) {
                    return (commands, None);
                }
                WorkflowCommand::OpenSignalWait {
                    signal_name: name,
                    timeout_seconds: None,
                    tags: Map::new(),
                }
            }
            Step::Child => {
                child += 1;
                match progress(child, children_scheduled, children_closed) {
                    Progress::Done => continue,
                    Progress::Waiting => return (commands, None),
                    Progress::Next => {}
                }
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
            Step::Nexus(mode) => {
                calls += 1;
                match progress(calls, calls_admitted, calls_resolved) {
                    Progress::Done => continue,
                    Progress::Waiting => return (commands, None),
                    Progress::Next => {}
                }
                crate::nexus::call(*mode)
            }
            Step::LocalActivity => {
                local += 1;
                match progress(local, locals_scheduled, locals_resolved) {
                    Progress::Done => continue,
                    Progress::Waiting => return (commands, Some(local_call(history, local))),
                    Progress::Next => {
                        let next = LocalCall {
                            sequence: None,
                            recover: false,
                        };
                        return (commands, Some(next));
                    }
                }
            }
            Step::Stream => {
                stream += 1;
                if stream > side_effects {
                    commands.push(stream_append(identity, stream as u64 - 1));
                }
                continue;
            }
            Step::ContinueAsNew => unreachable!("parts are split at ContinueAsNew"),
            Step::FailWithActivity => unreachable!("only a program's first step"),
        };
        commands.push(next);
        return (commands, None);
    }
    commands.push(if last_part {
        WorkflowCommand::CompleteWorkflow {
            result: Payload::avro(PAYLOAD),
        }
    } else {
        WorkflowCommand::ContinueAsNew {
            arguments: Payload::avro(PAYLOAD),
            workflow_type: None,
            queue: None,
            tags: Map::new(),
            observability_context: None,
        }
    });
    (commands, None)
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
    use capstan_engine::workflow_stream::{StreamDirective, StreamItemInput, StreamOperation};
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

/// The cancellation policy of a workflow's activities: each policy has its share of the
/// instances (by the id's last character, so every replay decides the same).
pub(crate) fn cancellation_policy_of(workflow_id: &str) -> Option<ActivityCancellationPolicy> {
    match workflow_id.bytes().last().unwrap_or(0) % 4 {
        0 => Some(ActivityCancellationPolicy::WaitCancellationCompleted),
        1 => Some(ActivityCancellationPolicy::Abandon),
        2 => Some(ActivityCancellationPolicy::TryCancel),
        _ => None,
    }
}

/// The worker session a workflow's session activities run in: one per instance, long-lived
/// (a session past its TTL would strand its activities, and the simulated clock jumps far).
pub(crate) fn session_of(workflow_id: &str) -> SessionRequirement {
    let options = SessionOptions {
        ttl_seconds: 365 * 86_400,
        ..SessionOptions::new(format!("sess-{workflow_id}"))
    };
    let as_sent = json!({"session_id": options.session_id, "ttl_seconds": options.ttl_seconds});
    SessionRequirement {
        options,
        as_sent: as_sent.as_object().cloned().unwrap_or_default(),
    }
}

/// What a workflow's prepared local calls look like: retried twice, a 10 s start-to-close
/// budget, the instance's cancellation policy (`abandon` is not one a local call may have).
pub(crate) fn local_descriptor(workflow_id: &str) -> LocalDescriptor {
    let cancellation_policy = cancellation_policy_of(workflow_id).filter(|p| *p != ActivityCancellationPolicy::Abandon);
    LocalDescriptor {
        activity_type: PLAIN.into(),
        arguments: Payload::avro(PAYLOAD),
        retry_policy: Some(RetryPolicy {
            max_attempts: Some(3),
            backoff_seconds: vec![1],
            non_retryable_error_types: vec![],
        }),
        cancellation_policy,
        start_to_close_seconds: Some(10),
        schedule_to_close_seconds: None,
        heartbeat_seconds: None,
        cleanup: None,
        tags: Map::new(),
        fingerprint: format!("sim-local-{}", cancellation_policy.map_or("none", |p| p.as_str())),
    }
}
