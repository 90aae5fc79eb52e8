//! Message streams: numbered deliveries on the reserved signal, cursors that consume, waits
//! offered what they missed, and a continued run that inherits what was not consumed.

mod support;

use capstan_engine::message_stream::{CURSOR_SCHEMA, MAX_UNCONSUMED, MESSAGE_SCHEMA};
use capstan_engine::*;
use serde_json::{json, Value};
use support::*;

fn append(sim: &mut Sim, stream: &str, message_id: &str) -> Result<StreamAppendReceipt, Refusal> {
    let command_id = CommandId(format!("cmd-{message_id}"));
    let append = AppendStreamMessage {
        stream_name: stream.into(),
        message_id: message_id.into(),
        input: Some(Payload::inline("json", format!("[\"{message_id}\"]"))),
        command_id,
    };
    sim.apply(|run, cx| append_stream_message(run, cx, append))
}

/// The delivery map a reserved `SignalReceived` carries (the simulator-side JSON codec).
fn delivery(event: &HistoryEvent) -> Value {
    assert_eq!(event.payload["signal_name"], json!(MESSAGE_STREAM_SIGNAL));
    let blob = event.payload["arguments"]["blob"].as_str().expect("a blob");
    let list: Value = serde_json::from_str(blob).expect("json deliveries");
    list[0].clone()
}

fn deliveries(sim: &Sim) -> Vec<Value> {
    sim.history
        .iter()
        .filter(|e| e.event_type == EventType::SignalReceived)
        .map(delivery)
        .collect()
}

fn complete_with(sim: &mut Sim, commands: Vec<WorkflowCommand>, progress: StreamProgress) -> Result<Receipt, Refusal> {
    let (task_id, fence) = sim.lease_workflow("w");
    sim.apply(|run, cx| {
        let claim = WorkflowClaim {
            task_id: &task_id,
            owner: "w",
            attempt: fence,
        };
        complete_workflow_task_with(run, cx, claim, commands, &progress)
    })
}

fn signal_wait() -> WorkflowCommand {
    WorkflowCommand::OpenSignalWait {
        signal_name: MESSAGE_STREAM_SIGNAL.into(),
        timeout_seconds: None,
        tags: StepTags::default(),
    }
}

fn cursors(stream: &str, through: u64) -> StreamProgress {
    StreamProgress {
        cursors: vec![(stream.into(), through)],
        waits: vec![],
    }
}

/// A started run whose first task completed with a timer: waiting, no task ready.
fn waiting_run() -> Sim {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![timer_command(3600)]).unwrap();
    sim
}

#[test]
fn appends_are_numbered_from_one_per_stream_and_delivered_as_the_reserved_signal() {
    let mut sim = waiting_run();
    assert_eq!(append(&mut sim, "inbox", "m-1").unwrap().position, 1);
    assert_eq!(append(&mut sim, "inbox", "m-2").unwrap().position, 2);
    assert_eq!(append(&mut sim, "other", "m-1").unwrap().position, 1, "positions are per stream");
    let delivered = deliveries(&sim);
    assert_eq!(delivered.len(), 3);
    assert_eq!(delivered[1]["schema"], json!(MESSAGE_SCHEMA));
    assert_eq!(delivered[1]["stream_name"], json!("inbox"));
    assert_eq!(delivered[1]["message_id"], json!("m-2"));
    assert_eq!(delivered[1]["position"], json!(2));
    assert_eq!(delivered[1]["payload_envelope"], json!({"codec": "json", "blob": "[\"m-2\"]"}));
    let stream = &sim.run.message_streams["inbox"];
    assert_eq!((stream.last_position, stream.cursor, stream.unconsumed.len()), (2, 0, 2));
    // Each delivery wakes the workflow with its signal as the task's resume.
    let task = sim.ready_task(TaskKind::Workflow);
    let TaskDetail::Workflow {
        resume: Some(ResumeContext::Signal { signal_name, .. }),
        ..
    } = &sim.run.tasks[&task].detail
    else {
        panic!("no signal resume")
    };
    assert_eq!(signal_name, MESSAGE_STREAM_SIGNAL);
}

#[test]
fn an_append_without_input_delivers_an_empty_argument_list() {
    let mut sim = waiting_run();
    let append = AppendStreamMessage {
        stream_name: "inbox".into(),
        message_id: "bare".into(),
        input: None,
        command_id: CommandId("c".into()),
    };
    sim.apply(|run, cx| append_stream_message(run, cx, append)).unwrap();
    assert_eq!(deliveries(&sim)[0]["payload_envelope"], json!({"codec": "json", "blob": "[]"}));
}

#[test]
fn a_closed_run_takes_no_messages() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![complete("done")]).unwrap();
    let refusal = append(&mut sim, "inbox", "late").unwrap_err();
    assert_eq!(refusal.reason, Reason::RunNotActive);
    assert!(sim.run.message_streams.is_empty());
}

#[test]
fn a_cursor_consumes_delivered_messages_once_and_records_its_advance() {
    let mut sim = waiting_run();
    append(&mut sim, "inbox", "m-1").unwrap();
    append(&mut sim, "inbox", "m-2").unwrap();
    append(&mut sim, "inbox", "m-3").unwrap();
    complete_with(&mut sim, vec![timer_command(60)], cursors("inbox", 2)).unwrap();
    let stream = &sim.run.message_streams["inbox"];
    assert_eq!(stream.cursor, 2);
    assert_eq!(stream.unconsumed.iter().map(|m| m.position).collect::<Vec<_>>(), [3]);
    let advanced: Vec<&HistoryEvent> = sim
        .history
        .iter()
        .filter(|e| e.event_type == EventType::MessageCursorAdvanced)
        .collect();
    assert_eq!(advanced.len(), 1);
    assert_eq!(advanced[0].payload["stream_key"], json!("inbox"));
    assert_eq!(
        (
            advanced[0].payload["previous_position"].clone(),
            advanced[0].payload["new_position"].clone()
        ),
        (json!(0), json!(2))
    );
    // The SDKs send their cursors again with every completion: a repeat records nothing.
    complete_with(&mut sim, vec![timer_command(60)], cursors("inbox", 2)).unwrap();
    assert_eq!(sim.count(EventType::MessageCursorAdvanced), 1);
}

#[test]
fn cursors_past_the_stream_or_over_undelivered_positions_are_refused_without_a_trace() {
    let mut sim = waiting_run();
    append(&mut sim, "inbox", "m-1").unwrap();
    let before = sim.history.len();
    let (task_id, fence) = sim.lease_workflow("w");
    let mut complete = |progress: StreamProgress| {
        sim.apply(|run, cx| {
            let claim = WorkflowClaim {
                task_id: &task_id,
                owner: "w",
                attempt: fence,
            };
            complete_workflow_task_with(run, cx, claim, vec![timer_command(60)], &progress)
        })
    };
    let refusal = complete(cursors("inbox", 2)).unwrap_err();
    assert_eq!(refusal.reason, Reason::InvalidMessageStreamProgress);
    assert_eq!(refusal.details["last_position"], json!(1));
    assert_eq!(
        complete(cursors("nowhere", 1)).unwrap_err().reason,
        Reason::InvalidMessageStreamProgress
    );
    let twice = StreamProgress {
        cursors: vec![("inbox".into(), 1), ("inbox".into(), 1)],
        waits: vec![],
    };
    assert_eq!(complete(twice).unwrap_err().reason, Reason::InvalidMessageStreamProgress);
    let wrong_wait = StreamProgress {
        cursors: vec![],
        waits: vec![("inbox".into(), 5)],
    };
    assert_eq!(complete(wrong_wait).unwrap_err().reason, Reason::InvalidMessageStreamProgress);
    assert_eq!(sim.history.len(), before, "refused completions record nothing");
    assert_eq!(sim.run.message_streams["inbox"].cursor, 0);
}

#[test]
fn a_cursor_over_a_message_delivered_to_an_earlier_run_is_refused() {
    // Positions are the instance's; a cursor may only consume what reached this run.
    let mut sim = waiting_run();
    append(&mut sim, "inbox", "m-1").unwrap();
    sim.run.message_streams.get_mut("inbox").unwrap().unconsumed[0].run_id = Some(RunId("older-run".into()));
    let refusal = complete_with(&mut sim, vec![timer_command(60)], cursors("inbox", 1)).unwrap_err();
    assert_eq!(refusal.reason, Reason::InvalidMessageStreamProgress);
    assert_eq!(refusal.details["position"], json!(1));
}

#[test]
fn a_signal_wait_opened_after_a_delivery_is_offered_the_unconsumed_message() {
    // The Rust SDK blocks with open_signal_wait on the reserved name: a message delivered while
    // its code waited on something else must reach the wait it opens later.
    let mut sim = waiting_run();
    append(&mut sim, "inbox", "m-1").unwrap();
    // The delivery's task runs while the code is elsewhere: it consumes nothing.
    complete_with(&mut sim, vec![timer_command(60)], StreamProgress::default()).unwrap();
    assert!(sim.run.workflow_task.is_none(), "nothing else to do");
    // Later the code reaches receive(): it opens the wait and declares it.
    sim.advance(61_000);
    let waiting = StreamProgress {
        cursors: vec![],
        waits: vec![("inbox".into(), 0)],
    };
    complete_with(&mut sim, vec![signal_wait()], waiting).unwrap();
    let task = sim.ready_task(TaskKind::Workflow);
    let TaskDetail::Workflow {
        resume: Some(ResumeContext::Signal {
            signal_name, arguments, ..
        }),
        ..
    } = &sim.run.tasks[&task].detail
    else {
        panic!("the unconsumed message was not offered to the new wait")
    };
    assert_eq!(signal_name, MESSAGE_STREAM_SIGNAL);
    let offered: Value = serde_json::from_str(&arguments.blob).unwrap();
    assert_eq!(offered[0]["position"], json!(1));
    // Its completion applies the message to the wait and consumes it.
    complete_with(&mut sim, vec![timer_command(60)], cursors("inbox", 1)).unwrap();
    assert_eq!(sim.count(EventType::SignalApplied), 1);
    assert_eq!(sim.count(EventType::SignalReceived), 1, "offered again, never received twice");
    assert!(sim.run.message_streams["inbox"].unconsumed.is_empty());
}

#[test]
fn a_continued_run_gets_a_cursor_checkpoint_then_only_the_unconsumed_messages() {
    let mut sim = waiting_run();
    for id in ["m-1", "m-2", "m-3"] {
        append(&mut sim, "inbox", id).unwrap();
    }
    let continue_as_new = WorkflowCommand::ContinueAsNew {
        arguments: Payload::avro("next"),
        workflow_type: None,
        queue: None,
        tags: StepTags::default(),
        observability_context: None,
    };
    let (task_id, fence) = sim.lease_workflow("w");
    let mut successor = None;
    sim.apply(|run, cx| {
        let claim = WorkflowClaim {
            task_id: &task_id,
            owner: "w",
            attempt: fence,
        };
        let receipt = complete_workflow_task_with(run, cx, claim, vec![continue_as_new], &cursors("inbox", 1))?;
        successor = cx.effects.successor.take();
        Ok(receipt)
    })
    .unwrap();
    let (next, effects) = *successor.expect("a successor");
    let received: Vec<Value> = effects
        .events
        .iter()
        .filter(|e| e.event_type == EventType::SignalReceived)
        .map(delivery)
        .collect();
    assert_eq!(
        received,
        [json!({"schema": CURSOR_SCHEMA, "stream_name": "inbox", "through_position": 1})]
    );
    let stream = &next.message_streams["inbox"];
    assert_eq!((stream.last_position, stream.cursor), (3, 1));
    assert!(stream.unconsumed.iter().all(|m| m.run_id.is_none()), "held for the new run");
    // Its first completion (a wait) is followed by the held messages, in order.
    let mut after = Sim { run: next, ..sim };
    after.history = effects.events;
    let waiting = StreamProgress {
        cursors: vec![("inbox".into(), 1)],
        waits: vec![("inbox".into(), 1)],
    };
    complete_with(
        &mut after,
        vec![WorkflowCommand::OpenConditionWait {
            condition_key: Some("message-stream:inbox:1".into()),
            fingerprint: None,
            timeout_seconds: None,
            occurrence_id: None,
            tags: StepTags::default(),
        }],
        waiting,
    )
    .unwrap();
    let types = after.event_types();
    let opened = types.iter().position(|t| *t == "ConditionWaitOpened").unwrap();
    let positions: Vec<Value> = after.history[opened..]
        .iter()
        .filter(|e| e.event_type == EventType::SignalReceived)
        .map(|e| delivery(e)["position"].clone())
        .collect();
    assert_eq!(positions, [json!(2), json!(3)], "{types:?}");
    // The new run's cursor may consume them: they were delivered to it.
    complete_with(&mut after, vec![timer_command(60)], cursors("inbox", 3)).unwrap();
    assert_eq!(after.run.message_streams["inbox"].cursor, 3);
}

#[test]
fn messages_for_a_run_that_has_not_completed_a_task_are_held_until_it_has() {
    let mut sim = Sim::start();
    let receipt = append(&mut sim, "inbox", "early").unwrap();
    assert_eq!((receipt.position, receipt.signal_id.clone()), (1, None));
    assert_eq!(sim.count(EventType::SignalReceived), 0);
    sim.complete_workflow("w", vec![timer_command(60)]).unwrap();
    let types = sim.event_types();
    assert_eq!(types.last(), Some(&"SignalReceived"), "{types:?}");
    assert_eq!(delivery(sim.history.last().unwrap())["message_id"], json!("early"));
    sim.ready_task(TaskKind::Workflow);
}

#[test]
fn a_stream_backlog_is_bounded() {
    let mut sim = waiting_run();
    for n in 0..MAX_UNCONSUMED {
        append(&mut sim, "inbox", &format!("m-{n}")).unwrap();
    }
    let refusal = append(&mut sim, "inbox", "one-more").unwrap_err();
    assert_eq!(refusal.reason, Reason::MessageStreamBacklogFull);
    assert_eq!(sim.run.message_streams["inbox"].last_position, MAX_UNCONSUMED as u64);
}

#[test]
fn waits_on_streams_nothing_was_appended_to_open_them_only_within_the_bound() {
    use capstan_engine::message_stream::MAX_STREAMS;
    let mut sim = Sim::start();
    for round in 0..2 {
        let waits = StreamProgress {
            cursors: vec![],
            waits: (0..MAX_STREAMS).map(|n| (format!("s-{round}-{n}"), 0)).collect(),
        };
        complete_with(&mut sim, vec![timer_command(60)], waits).unwrap();
        sim.advance(61_000);
    }
    assert_eq!(sim.run.message_streams.len(), MAX_STREAMS, "the second round found no room");
}
