//! Message streams in the workload: clients append messages to running workflows, retry an
//! append whose answer was lost, and now and then reuse a message id for another payload. The
//! judge: a message id is ingested once, at one position, positions of a stream count up by
//! one, a retry answers the first receipt, a reused id is refused; `check_messages` holds every
//! run's deliveries to what was ingested.

use super::keyed::sends;
use crate::program::Programs;
use crate::report::Failure;
use crate::workload::NAMESPACE;
use crate::world::{pick, Acted, World};
use capstan_app::message_streams::{self, AppendOutcome, AppendRequest};
use capstan_app::{AppError, AppResult};
use capstan_engine::message_stream::MESSAGE_SCHEMA;
use capstan_engine::{EventType, HistoryEvent, Payload, Reason, RunState, MESSAGE_STREAM_SIGNAL};
use capstan_store::{StoreError, StreamStore};
use rand::Rng;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

/// What the simulator knows was ingested: per (workflow, stream, message id) its payload and
/// position; per (workflow, stream) the last position.
#[derive(Default)]
pub(crate) struct Ingested {
    messages: BTreeMap<(String, String, String), (String, u64)>,
    last: BTreeMap<(String, String), u64>,
}

impl Ingested {
    /// A client appends a message to one of a started workflow's streams (`inbox` or
    /// `events`): a new one, or a known id again; sometimes twice.
    pub(crate) async fn append(&mut self, world: &mut World, programs: &Programs) -> Result<Acted, Failure> {
        let Some(workflow_id) = pick(&mut world.rng, programs.ids()) else {
            return Ok(Acted::Idle);
        };
        let stream = if world.rng.random_bool(0.7) { "inbox" } else { "events" };
        let known: Vec<String> = self
            .messages
            .keys()
            .filter(|(w, s, _)| *w == workflow_id && s == stream)
            .map(|(_, _, m)| m.clone())
            .collect();
        // A new message, or a known id again (its payload again, or rarely another one).
        let (message_id, body) = match pick(&mut world.rng, known.iter()) {
            Some(id) if world.rng.random_bool(0.3) => {
                let first = self.messages[&(workflow_id.clone(), stream.to_string(), id.clone())].0.clone();
                let body = if world.rng.random_bool(0.2) {
                    format!("{first}-changed")
                } else {
                    first
                };
                (id, body)
            }
            _ => {
                let id = format!("msg-{}", world.step);
                (id.clone(), format!("[\"{id}\"]"))
            }
        };
        world.trace(|| format!("append {message_id} to {workflow_id}/{stream}"));
        for _ in 0..sends(world) {
            let request = AppendRequest {
                namespace: NAMESPACE.into(),
                workflow_id: workflow_id.clone(),
                stream_name: stream.into(),
                message_id: message_id.clone(),
                input: Some(Payload::inline("json", body.clone())),
            };
            let answer = message_streams::append(&world.app, request).await;
            self.judge_append(world, &workflow_id, stream, &message_id, &body, answer)?;
        }
        Ok(Acted::Done)
    }

    fn judge_append(
        &mut self,
        world: &mut World,
        workflow_id: &str,
        stream: &str,
        message_id: &str,
        body: &str,
        answer: AppResult<(AppendOutcome, Option<RunState>)>,
    ) -> Result<(), Failure> {
        let key = (workflow_id.to_string(), stream.to_string(), message_id.to_string());
        let known = self.messages.get(&key).cloned();
        let conflict = matches!(&answer, Err(AppError::Store(StoreError::Refused(r))) if r.reason == Reason::MessageIdentityConflict);
        if conflict {
            return match known {
                Some((first, _)) if first != body => {
                    world.counters.message_conflicts += 1;
                    Ok(())
                }
                _ => Err(world.fail(format!("{message_id} on {workflow_id}/{stream} refused as a conflict without one"))),
            };
        }
        let Some((outcome, run)) = world.declined(answer)? else {
            return Ok(());
        };
        let position = |body: &Value| body["position"].as_u64().unwrap_or(0);
        match (outcome, known) {
            (AppendOutcome::Accepted(receipt), None) => {
                let stream_key = (key.0.clone(), key.1.clone());
                let last = self.last.get(&stream_key).copied().unwrap_or(0);
                if position(&receipt) != last + 1 {
                    return Err(world.fail(format!(
                        "{message_id} on {workflow_id}/{stream} got position {} after {last}",
                        position(&receipt)
                    )));
                }
                self.last.insert(stream_key, last + 1);
                self.messages.insert(key, (body.to_string(), position(&receipt)));
                world.counters.messages_ingested += 1;
                if let Some(run) = run {
                    world.seen.acknowledge(&run);
                }
                Ok(())
            }
            (AppendOutcome::Accepted(_), Some(_)) => Err(world.fail(format!("{message_id} on {workflow_id}/{stream} was ingested twice"))),
            (AppendOutcome::Duplicate(receipt), Some((first, at))) if first == body && position(&receipt) == at => {
                world.counters.message_retries += 1;
                Ok(())
            }
            (AppendOutcome::Duplicate(receipt), known) => Err(world.fail(format!(
                "{message_id} on {workflow_id}/{stream} answered as a duplicate ({receipt}) of {known:?}"
            ))),
        }
    }

    /// Every reserved delivery in a run is a message that was ingested, at its position, and at
    /// most once per run.
    pub(crate) fn check_messages(&self, world: &World, run: &RunState, events: &[HistoryEvent]) -> Result<(), Failure> {
        let mut seen = BTreeSet::new();
        for event in events.iter().filter(|e| e.event_type == EventType::SignalReceived) {
            if event.payload["signal_name"] != json!(MESSAGE_STREAM_SIGNAL) {
                continue;
            }
            let blob = event.payload["arguments"]["blob"].as_str().unwrap_or("");
            let delivery: Value = serde_json::from_str(blob).unwrap_or(Value::Null);
            let item = &delivery[0];
            if item["schema"] != json!(MESSAGE_SCHEMA) {
                continue; // a cursor checkpoint
            }
            let stream = item["stream_name"].as_str().unwrap_or("").to_string();
            let message_id = item["message_id"].as_str().unwrap_or("").to_string();
            let key = (run.workflow_id.as_str().to_string(), stream.clone(), message_id.clone());
            if !seen.insert((stream.clone(), message_id.clone())) {
                return Err(world.fail(format!("{}: {message_id} delivered twice on {stream}", run.run_id)));
            }
            // Ingestions the simulator never heard of (a lost answer) still count once.
            if let Some((_, position)) = self.messages.get(&key) {
                if item["position"].as_u64() != Some(*position) {
                    return Err(world.fail(format!(
                        "{}: {message_id} delivered at {} but ingested at {position}",
                        run.run_id, item["position"]
                    )));
                }
            }
        }
        Ok(())
    }
}

/// A run's output stream holds exactly the items of its recorded stream side effects: two
/// per side effect, offsets from 0 without a gap (a directive lands with its side effect,
/// once, or not at all).
pub(crate) async fn check_output_stream(world: &mut World, run: &RunState, events: &[HistoryEvent]) -> Result<(), Failure> {
    let side_effects = events.iter().filter(|e| e.event_type == EventType::SideEffectRecorded).count() as i64;
    let streams = world
        .store()
        .list_streams(NAMESPACE, run.workflow_id.as_str(), run.run_id.as_str())
        .await
        .map_err(|e| world.fail(format!("streams: {e}")))?;
    let last_offset = streams.iter().find(|s| s.stream_name == "out").map_or(-1, |s| s.last_offset);
    let items = streams.iter().find(|s| s.stream_name == "out").map_or(0, |s| s.total_items as i64);
    if last_offset + 1 != 2 * side_effects || items != 2 * side_effects {
        return Err(world.fail(format!(
            "{}: {side_effects} stream side effects but the stream's last offset is {last_offset} ({items} items)",
            run.run_id
        )));
    }
    if side_effects > 0 {
        world.counters.stream_items += 2 * side_effects as usize;
    }
    Ok(())
}
