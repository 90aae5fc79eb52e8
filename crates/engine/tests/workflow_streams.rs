//! Workflow output stream directives: checked against the task's command identity and the
//! SDKs' item keys, and handed to the store with their side effect, never recorded in history.

mod support;

use capstan_engine::workflow_stream::{StreamDirective, StreamItemInput, StreamOp, StreamOperation};
use capstan_engine::*;
use serde_json::Map;
use support::*;

fn append(identity: &str, ordinal: u64, keys: &[String]) -> WorkflowCommand {
    let items = keys
        .iter()
        .map(|key| StreamItemInput {
            payload: Some(Payload::avro("item")),
            payload_reference: None,
            item_type: None,
            content_type: None,
            idempotency_key: Some(key.clone()),
        })
        .collect();
    WorkflowCommand::RecordSideEffect {
        result: Payload::avro("null"),
        tags: Map::new(),
        stream: Some(StreamDirective {
            stream_name: "out".into(),
            command_identity: identity.into(),
            command_ordinal: ordinal,
            operation: StreamOperation::Append {
                items,
                max_pending_items: None,
            },
        }),
    }
}

/// Completes the next workflow task with `commands(identity)`, returning the stream ops.
fn complete(sim: &mut Sim, identity: Option<&str>, commands: impl FnOnce(&str) -> Vec<WorkflowCommand>) -> Result<Vec<StreamOp>, Refusal> {
    let (task_id, fence) = sim.lease_workflow("w");
    let identity = identity.map(str::to_string).unwrap_or_else(|| task_id.as_str().to_string());
    let commands = commands(&identity);
    sim.apply(|run, cx| {
        complete_workflow_task(run, cx, &task_id, "w", fence, commands)?;
        Ok(std::mem::take(&mut cx.effects.stream_ops))
    })
}

#[test]
fn a_directive_keyed_by_the_task_rides_on_its_side_effect() {
    let mut sim = Sim::start();
    let ops = complete(&mut sim, None, |identity| {
        let keys = [format!("dw-stream:{identity}:0:0"), format!("dw-stream:{identity}:0:1")];
        vec![append(identity, 0, &keys), timer_command(60)]
    })
    .unwrap();
    assert_eq!(ops.len(), 1);
    assert_eq!(ops[0].at, sim.now);
    let recorded: Vec<&HistoryEvent> = sim
        .history
        .iter()
        .filter(|e| e.event_type == EventType::SideEffectRecorded)
        .collect();
    assert_eq!(recorded.len(), 1);
    assert!(
        !recorded[0].payload.contains_key("workflow_stream"),
        "replay never sees the directive"
    );
}

#[test]
fn a_directive_with_another_identity_or_key_refuses_the_completion() {
    let mut sim = Sim::start();
    let (task_id, fence) = sim.lease_workflow("w");
    let identity = task_id.as_str().to_string();
    let mut attempt = |command: WorkflowCommand| {
        sim.apply(|run, cx| complete_workflow_task(run, cx, &task_id, "w", fence, vec![command, timer_command(60)]))
            .unwrap_err()
    };
    let wrong_identity = attempt(append("someone-else", 0, &["dw-stream:someone-else:0:0".into()]));
    assert_eq!(wrong_identity.reason, Reason::InvalidWorkflowStreamCommand);
    let wrong_key = attempt(append(&identity, 3, &[format!("dw-stream:{identity}:0:0")]));
    assert_eq!(wrong_key.reason, Reason::InvalidWorkflowStreamCommand);
    assert_eq!(wrong_key.details["recorded"], serde_json::json!(false));
    assert_eq!(sim.count(EventType::SideEffectRecorded), 0);
}

#[test]
fn a_signalled_task_keys_its_directives_by_the_signals_command() {
    let mut sim = Sim::start();
    sim.complete_workflow("w", vec![timer_command(3600)]).unwrap();
    sim.apply(|run, cx| signal(run, cx, "go", Payload::avro("x"), CommandId("signal-cmd".into())))
        .unwrap();
    let keys = ["dw-stream:signal-cmd:0:0".to_string()];
    let ops = complete(&mut sim, Some("signal-cmd"), |identity| {
        vec![append(identity, 0, &keys), timer_command(60)]
    })
    .unwrap();
    assert_eq!(ops[0].directive.command_identity, "signal-cmd");
}
