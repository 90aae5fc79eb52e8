//! Message streams' transitions (see [`crate::message_stream`]): an append delivers a numbered
//! message to the current run; a completion's cursors consume messages and its waits are noted;
//! a continued run receives its predecessor's cursors and unconsumed messages.

use super::control::record_signal;
use crate::message_stream::{
    valid_stream_name, StreamInput, StreamMessage, StreamWait, CURSOR_SCHEMA, MAX_PROGRESS_ENTRIES, MAX_STREAMS, MAX_UNCONSUMED,
    MESSAGE_SCHEMA,
};
use crate::transitions::require_open;
use crate::{require_workflow_code, EventType, Payload, Reason, Refusal};
use crate::{CommandId, Cx, ResumeContext, RunState, StreamAppendReceipt, StreamProgress, TaskDetail, TaskId, MESSAGE_STREAM_SIGNAL};
use serde_json::{json, Map, Value};

/// A client's append, already validated (names, id, payload codec).
#[derive(Clone, Debug)]
pub struct AppendStreamMessage {
    pub stream_name: String,
    pub message_id: String,
    /// The message's argument list; `None`: the client sent none (an empty list is delivered).
    pub input: Option<Payload>,
    pub command_id: CommandId,
}

/// Numbers the message (the stream's next position) and delivers it to `run`, the instance's
/// current run, as the reserved signal.
pub fn append_stream_message(run: &mut RunState, cx: &mut Cx, append: AppendStreamMessage) -> Result<StreamAppendReceipt, Refusal> {
    require_open(run)?;
    require_workflow_code(run)?;
    let AppendStreamMessage {
        stream_name,
        message_id,
        input,
        command_id,
    } = append;
    if !run.message_streams.contains_key(&stream_name) && run.message_streams.len() >= MAX_STREAMS {
        return Err(Refusal::new(
            Reason::StructuralLimitExceeded,
            format!("An instance may have at most {MAX_STREAMS} message streams."),
        )
        .with("limit", MAX_STREAMS));
    }
    let backlog = run.message_streams.get(&stream_name).map_or(0, |s| s.unconsumed.len());
    if backlog >= MAX_UNCONSUMED {
        return Err(Refusal::new(
            Reason::MessageStreamBacklogFull,
            format!("The stream holds {MAX_UNCONSUMED} messages the workflow has not consumed; retry once it has."),
        )
        .with("stream_name", stream_name)
        .with("unconsumed", backlog)
        .with("limit", MAX_UNCONSUMED));
    }
    let input = match input {
        Some(input) => input,
        None => encode(cx, &json!([]))?,
    };
    let position = run.message_streams.get(&stream_name).map_or(0, |s| s.last_position) + 1;
    let delivery = encode(
        cx,
        &json!([{
            "schema": MESSAGE_SCHEMA,
            "stream_name": stream_name,
            "message_id": message_id,
            "position": position,
            "payload_envelope": input.envelope(),
        }]),
    )?;
    let mut message = StreamMessage {
        position,
        message_id: message_id.clone(),
        delivery,
        signal_id: None,
        command_id: command_id.clone(),
        run_id: None,
    };
    if first_task_completed(run) {
        deliver(run, cx, &mut message);
    }
    let signal_id = message.signal_id.clone();
    let stream = run.message_streams.entry(stream_name.clone()).or_default();
    stream.last_position = position;
    stream.unconsumed.push_back(message);
    stream.last_input = Some(StreamInput {
        outcome: "accepted".into(),
        message_id: message_id.clone(),
        at: cx.now,
    });
    Ok(StreamAppendReceipt {
        stream_name,
        message_id,
        position,
        cursor_position: stream.cursor,
        signal_id,
        command_id,
    })
}

/// Notes an append that was not ingested: a repeat (`duplicate`) or an id reused for another
/// payload (`message_identity_conflict`). Diagnostics only; a closed run keeps what it had.
pub fn note_stream_input(run: &mut RunState, cx: &mut Cx, stream_name: &str, message_id: &str, outcome: &str) -> Result<(), Refusal> {
    if run.is_closed() {
        return Ok(());
    }
    if let Some(stream) = run.message_streams.get_mut(stream_name) {
        stream.duplicate_count += 1;
        stream.last_input = Some(StreamInput {
            outcome: outcome.into(),
            message_id: message_id.into(),
            at: cx.now,
        });
    }
    Ok(())
}

/// Whether the run has completed a workflow task (its first completion always takes a step).
fn first_task_completed(run: &RunState) -> bool {
    run.next_step > 1
}

/// Records a message's delivery to `run`: `SignalReceived` and a resume task.
fn deliver(run: &mut RunState, cx: &mut Cx, message: &mut StreamMessage) {
    let signal_id = record_signal(run, cx, MESSAGE_STREAM_SIGNAL, message.delivery.clone(), message.command_id.clone());
    message.signal_id = Some(signal_id);
    message.run_id = Some(run.run_id.clone());
}

/// After a completion: delivers the messages held for this run (appended before its first
/// workflow task completed, or carried over from its predecessor), in position order.
pub(super) fn deliver_held_messages(run: &mut RunState, cx: &mut Cx) {
    if run.is_closed() || !first_task_completed(run) {
        return;
    }
    let mut streams = std::mem::take(&mut run.message_streams);
    for stream in streams.values_mut() {
        for message in stream.unconsumed.iter_mut().filter(|m| m.run_id.is_none()) {
            deliver(run, cx, message);
        }
    }
    run.message_streams = streams;
}

fn encode(cx: &Cx, value: &Value) -> Result<Payload, Refusal> {
    match cx.memo {
        Some(codec) => codec
            .json_to_payload(value)
            .map_err(|e| Refusal::new(Reason::UnsupportedPayloadCodec, format!("cannot encode a stream delivery: {e}"))),
        // Without a payload codec (the simulator) deliveries are plain JSON.
        None => Ok(Payload::inline("json", value.to_string())),
    }
}

fn invalid_progress(field: &str, stream_name: &str, message: impl Into<String>) -> Refusal {
    Refusal::new(Reason::InvalidMessageStreamProgress, message)
        .with("field", field)
        .with("stream_name", stream_name)
}

/// Checks a completion's cursors and waits against DW's rules: at most
/// [`MAX_PROGRESS_ENTRIES`] each, a stream named once per list, a cursor never past the
/// stream's last position and consuming only messages delivered to this run, a wait after the
/// cursor the same completion proposes (else the stored one).
pub fn check_stream_progress(run: &RunState, progress: &StreamProgress) -> Result<(), Refusal> {
    for (field, entries) in [
        ("message_stream_cursors", &progress.cursors),
        ("message_stream_waits", &progress.waits),
    ] {
        if entries.len() > MAX_PROGRESS_ENTRIES {
            return Err(Refusal::new(
                Reason::InvalidMessageStreamProgress,
                format!("{field} holds at most {MAX_PROGRESS_ENTRIES} entries."),
            )
            .with("field", field));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (name, _) in entries {
            if !valid_stream_name(name) {
                return Err(invalid_progress(
                    field,
                    name,
                    "A stream name is 1 to 128 characters of [A-Za-z0-9._:-].",
                ));
            }
            if !seen.insert(name) {
                return Err(invalid_progress(field, name, "A stream may appear once per list."));
            }
        }
    }
    for (name, through) in &progress.cursors {
        let stream = run.message_streams.get(name);
        let last = stream.map_or(0, |s| s.last_position);
        let cursor = stream.map_or(0, |s| s.cursor);
        if *through > last {
            return Err(
                invalid_progress("message_stream_cursors", name, "The cursor is past the stream's last position.")
                    .with("through_position", *through)
                    .with("last_position", last),
            );
        }
        if *through > cursor {
            // The unconsumed messages are the positions right above the cursor, in order.
            let consumed = stream
                .iter()
                .flat_map(|s| s.unconsumed.iter())
                .take_while(|m| m.position <= *through);
            let not_here = consumed
                .filter(|m| m.run_id.as_ref() != Some(&run.run_id))
                .map(|m| m.position)
                .next();
            if let Some(missing) = not_here {
                return Err(invalid_progress(
                    "message_stream_cursors",
                    name,
                    "The cursor consumes a message that was not delivered to this run.",
                )
                .with("through_position", *through)
                .with("position", missing));
            }
        }
    }
    for (name, after) in &progress.waits {
        let proposed = progress.cursors.iter().find(|(n, _)| n == name).map(|(_, p)| *p);
        let stored = run.message_streams.get(name).map_or(0, |s| s.cursor);
        if *after != stored && proposed != Some(*after) {
            return Err(
                invalid_progress("message_stream_waits", name, "A wait's after_position must be the stream's cursor.")
                    .with("after_position", *after)
                    .with("cursor_position", proposed.unwrap_or(stored).max(stored)),
            );
        }
    }
    Ok(())
}

/// Applies checked progress: an advanced cursor drops the consumed messages and clears the
/// stream's wait (`MessageCursorAdvanced`); a repeated or older cursor changes nothing. Each
/// declared wait is noted for diagnostics.
pub(super) fn apply_stream_progress(run: &mut RunState, cx: &mut Cx, task_id: &TaskId, progress: &StreamProgress) {
    for (name, through) in &progress.cursors {
        let Some(stream) = run.message_streams.get_mut(name) else {
            continue;
        };
        if *through <= stream.cursor {
            continue;
        }
        let previous = stream.cursor;
        stream.cursor = *through;
        stream.unconsumed.retain(|m| m.position > *through);
        stream.pending_wait = None;
        let payload = obj!(
            "stream_key" => name,
            "previous_position" => previous,
            "new_position" => *through,
        );
        run.append(cx, EventType::MessageCursorAdvanced, payload, Some(task_id), None);
    }
    for (name, after) in &progress.waits {
        // A wait on a stream nothing was appended to yet opens it, within the streams' bound.
        if !run.message_streams.contains_key(name) && run.message_streams.len() >= MAX_STREAMS {
            continue;
        }
        let run_id = run.run_id.clone();
        let stream = run.message_streams.entry(name.clone()).or_default();
        if stream.last_position <= *after {
            stream.pending_wait = Some(StreamWait {
                run_id,
                after_position: *after,
                since: cx.now,
            });
        }
    }
}

/// After a completion: a signal wait on the reserved name (how the Rust SDK's `receive()`
/// blocks) only sees deliveries that come after it, so an unconsumed message delivered before
/// the wait opened is offered to it again, unless a delivery is already on its way.
pub(super) fn offer_unconsumed_messages(run: &mut RunState, cx: &mut Cx, progress: &StreamProgress) {
    if run.is_closed() || !run.signal_waits.iter().any(|w| w.signal_name == MESSAGE_STREAM_SIGNAL) {
        return;
    }
    let reserved =
        |resume: &ResumeContext| matches!(resume, ResumeContext::Signal { signal_name, .. } if signal_name == MESSAGE_STREAM_SIGNAL);
    let queued = run.pending_resumes.iter().any(reserved)
        || run
            .workflow_task
            .as_ref()
            .and_then(|id| run.tasks.get(id))
            .is_some_and(|task| matches!(&task.detail, TaskDetail::Workflow { resume: Some(resume), .. } if reserved(resume)));
    if queued {
        return;
    }
    let oldest = progress.waits.iter().find_map(|(name, after)| {
        let stream = run.message_streams.get(name)?;
        stream.unconsumed.iter().find(|m| m.position > *after).cloned()
    });
    if let Some(StreamMessage {
        signal_id: Some(signal_id),
        delivery,
        command_id,
        ..
    }) = oldest
    {
        let resume = ResumeContext::Signal {
            signal_id,
            signal_name: MESSAGE_STREAM_SIGNAL.into(),
            arguments: delivery,
            command_id,
        };
        run.want_workflow_task(cx, Some(resume));
    }
}

/// A continued run takes over its predecessor's streams: a cursor checkpoint per stream with a
/// cursor now (both SDKs seed their cursors from it before running any code), and every message
/// the predecessor had not consumed held for the run (same position and id), delivered after
/// its first workflow task completes.
pub(super) fn carry_streams_forward(run: &mut RunState, cx: &mut Cx, previous: &RunState) {
    if previous.message_streams.is_empty() {
        return;
    }
    let mut streams = previous.message_streams.clone();
    for (name, stream) in &streams {
        if stream.cursor == 0 {
            continue;
        }
        let checkpoint = json!([{
            "schema": CURSOR_SCHEMA,
            "stream_name": name,
            "through_position": stream.cursor,
        }]);
        // The codec encoded every earlier delivery of this instance; it encodes this one too.
        if let Ok(arguments) = encode(cx, &checkpoint) {
            let command_id: CommandId = cx.id();
            record_signal(run, cx, MESSAGE_STREAM_SIGNAL, arguments, command_id);
        }
    }
    for stream in streams.values_mut() {
        stream.pending_wait = None;
        for message in stream.unconsumed.iter_mut() {
            message.command_id = cx.id();
            message.signal_id = None;
            message.run_id = None;
        }
    }
    run.message_streams = streams;
}
