//! Message streams (see `capstan_engine::message_stream`): a client's append, ingested once per
//! (instance, stream, `message_id`). The append is a keyed command, so the run lock serialises
//! concurrent retries (on every node) and the stored receipt answers each repeat.

use crate::control::apply;
use crate::{AppError, AppResult, Services};
use capstan_engine::message_stream::{append_request_id, valid_message_id, valid_stream_name, APPEND_COMMAND_TYPE};
use capstan_engine::*;
use capstan_store::prelude::*;
use capstan_store::{intent_hash, CommandKey, RunLocator, StoreError};
use serde_json::{json, Value};

/// A client's append.
#[derive(Clone, Debug)]
pub struct AppendRequest {
    pub namespace: String,
    pub workflow_id: String,
    pub stream_name: String,
    pub message_id: String,
    /// The message's argument list (`None`: an empty one).
    pub input: Option<Payload>,
}

/// How an append ended: `Accepted` ingested it now; `Duplicate` found the same message
/// ingested before (the body is its first receipt).
#[derive(Clone, Debug, PartialEq)]
pub enum AppendOutcome {
    Accepted(Value),
    Duplicate(Value),
}

/// Ingests a message: the instance's current run gets it as the stream's next position. A
/// repeat with the same payload answers the first receipt; the same id with another payload is
/// refused (`message_identity_conflict`). Either repeat is counted on the stream.
pub async fn append<V: Services>(services: &V, request: AppendRequest) -> AppResult<(AppendOutcome, Option<RunState>)> {
    if !valid_stream_name(&request.stream_name) {
        return Err(AppError::invalid(
            "stream_name",
            "A stream name is 1 to 128 characters of letters, digits, '.', '_', ':' and '-'.",
        ));
    }
    if !valid_message_id(&request.message_id) {
        return Err(AppError::invalid(
            "message_id",
            "A message_id is 1 to 191 characters of letters, digits, '.', '_', ':' and '-'.",
        ));
    }
    let (codec, blob) = request.input.as_ref().map_or(("", ""), |p| (p.codec.as_str(), p.identity()));
    let key = CommandKey {
        command_type: APPEND_COMMAND_TYPE.into(),
        request_id: append_request_id(&request.stream_name, &request.message_id),
        intent_hash: intent_hash(&[codec, blob]),
    };
    let locator = RunLocator::Current(WorkflowId(request.workflow_id.clone()));
    let append = AppendStreamMessage {
        stream_name: request.stream_name.clone(),
        message_id: request.message_id.clone(),
        input: request.input.clone(),
        command_id: CommandId(services.new_id()),
    };
    let transition = move |run: &mut RunState, cx: &mut Cx| append_stream_message(run, cx, append);
    let applied = apply(services, &request.namespace, locator, Some(key), transition, render_receipt).await;
    match applied {
        Ok(receipt) if receipt.retained => {
            note(services, &request, "duplicate").await?;
            let mut body = receipt.body;
            if let Some(map) = body.as_object_mut() {
                map.remove("retained");
                map.insert("duplicate".into(), json!(true));
                map.insert("outcome".into(), json!("duplicate"));
            }
            Ok((AppendOutcome::Duplicate(body), None))
        }
        Ok(receipt) => Ok((AppendOutcome::Accepted(receipt.body), receipt.run)),
        Err(AppError::Store(StoreError::Refused(refusal))) if refusal.reason == Reason::RequestIdConflict => {
            note(services, &request, "message_identity_conflict").await?;
            Err(Refusal::new(
                Reason::MessageIdentityConflict,
                "This message_id was already appended to the stream with another payload.",
            )
            .with("accepted", false)
            .with("outcome", "rejected")
            .with("stream_name", request.stream_name.clone())
            .with("message_id", request.message_id.clone())
            .into())
        }
        Err(error) => Err(error),
    }
}

fn render_receipt(receipt: &StreamAppendReceipt, run: &RunState) -> Value {
    json!({
        "accepted": true,
        "duplicate": false,
        "workflow_id": run.workflow_id,
        "run_id": run.run_id,
        "stream_name": receipt.stream_name,
        "message_id": receipt.message_id,
        "position": receipt.position,
        "cursor_position": receipt.cursor_position,
        "signal_id": receipt.signal_id,
        "command_id": receipt.command_id,
        "outcome": "accepted",
        "reason": null,
    })
}

/// Counts a repeat on the stream's diagnostics (a second, small transaction: the repeat itself
/// changed nothing).
async fn note<V: Services>(services: &V, request: &AppendRequest, outcome: &'static str) -> AppResult<()> {
    let locator = RunLocator::Current(WorkflowId(request.workflow_id.clone()));
    let (stream, message_id) = (request.stream_name.clone(), request.message_id.clone());
    services
        .store()
        .mutate_run(&request.namespace, locator, services.now(), move |run, cx| {
            note_stream_input(run, cx, &stream, &message_id, outcome)
        })
        .await?;
    Ok(())
}

/// A stream as the diagnostics routes show it (payloads never).
pub fn describe_stream(run: &RunState, name: &str, stream: &MessageStream) -> Value {
    json!({
        "stream_name": name,
        "workflow_id": run.workflow_id,
        "run_id": run.run_id,
        "last_position": stream.last_position,
        "cursor_position": stream.cursor,
        "pending_count": stream.unconsumed.len(),
        "pending_wait": stream.pending_wait.as_ref().map(|w| json!({
            "run_id": w.run_id,
            "after_position": w.after_position,
            "since": timefmt::iso8601(w.since),
        })),
        "duplicate_count": stream.duplicate_count,
        "last_input_outcome": stream.last_input.as_ref().map(|i| i.outcome.clone()),
        "last_input_message_id": stream.last_input.as_ref().map(|i| i.message_id.clone()),
        "last_input_at": stream.last_input.as_ref().map(|i| timefmt::iso8601(i.at)),
    })
}
