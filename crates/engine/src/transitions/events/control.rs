//! Control-plane requests: cancel, terminate, repair, archive, and cooperative cancellation.

use crate::transitions::iso8601;
use crate::{CancellationDelivery, CancellationRequest, CommandId, RunState, TaskId};
use serde_json::{json, Map, Value};

/// The fields every control command's event starts with.
fn command_identity(run: &RunState, command_id: &CommandId) -> Map<String, Value> {
    obj!(
        "workflow_command_id" => command_id,
        "workflow_instance_id" => run.workflow_id,
        "workflow_run_id" => run.run_id,
    )
}

fn close_requested(run: &RunState, command_id: &CommandId, command_type: &str, reason: Option<&str>) -> Map<String, Value> {
    let mut payload = command_identity(run, command_id);
    payload.extend(obj!("command_type" => command_type, "reason" => reason));
    payload
}

/// `CancelRequested` (the run closes right after it).
pub(in crate::transitions) fn cancel_requested(run: &RunState, command_id: &CommandId, reason: Option<&str>) -> Map<String, Value> {
    close_requested(run, command_id, "cancel", reason)
}

/// `TerminateRequested` (the run closes right after it).
pub(in crate::transitions) fn terminate_requested(run: &RunState, command_id: &CommandId, reason: Option<&str>) -> Map<String, Value> {
    close_requested(run, command_id, "terminate", reason)
}

/// `RepairRequested`: whether the repair offered a workflow task (`task_id`) or found nothing
/// stuck, and what the run waits for now.
pub(in crate::transitions) fn repair_requested(
    run: &RunState,
    command_id: &CommandId,
    dispatched: bool,
    task_id: Option<&TaskId>,
) -> Map<String, Value> {
    let mut payload = command_identity(run, command_id);
    payload.extend(obj!(
        "command_type" => "repair",
        "outcome" => if dispatched { "repair_dispatched" } else { "repair_not_needed" },
        "wait_kind" => run.wait_kind(),
        "task_id" => task_id,
        "task_type" => task_id.map(|_| "workflow"),
    ));
    payload
}

fn archive_identity(run: &RunState, command_id: &CommandId, reason: Option<&str>) -> Map<String, Value> {
    let mut payload = command_identity(run, command_id);
    payload.insert("reason".into(), json!(reason));
    payload
}

/// `ArchiveRequested`.
pub(in crate::transitions) fn archive_requested(run: &RunState, command_id: &CommandId, reason: Option<&str>) -> Map<String, Value> {
    let mut payload = archive_identity(run, command_id, reason);
    payload.extend(obj!("command_type" => "archive", "outcome" => "archived"));
    payload
}

/// `WorkflowArchived`, right after `ArchiveRequested`.
pub(in crate::transitions) fn workflow_archived(run: &RunState, command_id: &CommandId, reason: Option<&str>) -> Map<String, Value> {
    let mut payload = archive_identity(run, command_id, reason);
    payload.extend(obj!("archive_command_id" => command_id, "outcome" => "archived"));
    payload
}

/// `CooperativeCancellationRequested`: the workflow has until `cleanup_deadline_at`.
pub(in crate::transitions) fn cooperative_cancellation_requested(run: &RunState, request: &CancellationRequest) -> Map<String, Value> {
    let mut payload = command_identity(run, &request.request_id);
    payload.extend(obj!(
        "command_type" => "request_cancellation",
        "reason" => request.reason,
        "cleanup_deadline_at" => iso8601(request.cleanup_deadline_at),
        // The context both SDKs compare a prepared local activity's stop with.
        "cancellation" => request.context(&run.workflow_id, &run.run_id),
    ));
    payload
}

/// `CooperativeCancellationDelivered` at the authored call `done` names. A span or an operation
/// is written only when the call has one.
pub(in crate::transitions) fn cooperative_cancellation_delivered(
    run: &RunState,
    request_id: &CommandId,
    done: &CancellationDelivery,
) -> Map<String, Value> {
    let mut payload = obj!(
        "workflow_command_id" => request_id,
        "workflow_run_id" => run.run_id,
        "sequence" => done.sequence,
        "call_kind" => done.call_kind,
    );
    if done.sequence_span != 1 {
        payload.insert("sequence_span".into(), json!(done.sequence_span));
    }
    if let Some(operation) = done.operation_sequence {
        payload.insert("operation_sequence".into(), json!(operation));
        payload.insert("operation_sequence_span".into(), json!(done.operation_sequence_span));
    }
    payload
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transitions::blank_run;
    use crate::{CancellationDelivery, Cx, Payload, SequentialIds, StartRun};

    #[test]
    fn a_delivery_names_its_span_and_operation_only_when_it_has_them() {
        let limits = crate::limits::Limits::default();
        let mut ids = SequentialIds::new("id");
        let cx = Cx::new(0, &mut ids, &limits);
        let start = StartRun {
            scheduling: Default::default(),
            namespace: "default".into(),
            workflow_id: "wf-1".into(),
            run_id: "run-1".into(),
            workflow_type: "t".into(),
            task_queue: "q".into(),
            input: Payload::avro(""),
            execution_timeout_seconds: None,
            run_timeout_seconds: None,
            business_key: None,
            memo: Map::new(),
            search_attributes: Map::new(),
            command_id: "cmd-start".into(),
            contract: None,
            compatibility: None,
            origin_trace: None,
            principal: None,
        };
        let run = blank_run(&cx, start, 1, None);
        let mut done = CancellationDelivery {
            sequence: 5,
            call_kind: "timer".into(),
            sequence_span: 1,
            operation_sequence: None,
            operation_sequence_span: 1,
            delivered_at: 0,
            delivery_event_id: None,
        };
        let one_call = cooperative_cancellation_delivered(&run, &"req-1".into(), &done);
        let mut keys: Vec<&str> = one_call.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["call_kind", "sequence", "workflow_command_id", "workflow_run_id"]);

        done.call_kind = "selection_handle".into();
        done.sequence_span = 2;
        done.operation_sequence = Some(3);
        let handle = cooperative_cancellation_delivered(&run, &"req-1".into(), &done);
        assert_eq!(handle["sequence_span"], json!(2));
        assert_eq!(handle["operation_sequence"], json!(3));
        assert_eq!(handle["operation_sequence_span"], json!(1));
    }
}
