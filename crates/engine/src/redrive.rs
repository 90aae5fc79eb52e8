//! Redrive (DW's `POST /workflows/{id}/runs/{run}/redrive`): a failed run whose history is a
//! line of activities is resumed, after a fix, at its failed step. The successor replays the
//! completed steps from copies of their results and runs the failed step again.

use crate::command::FailureBoundary;
use crate::history::{EventType, HistoryEvent};
use crate::ids::{ActivityExecutionId, CommandId, RunId};
use crate::refusal::{Reason, Refusal};
use crate::Millis;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// A redrive, recorded on both runs: the failed source (`RunState::redriven_to`) and its
/// successor (`RunState::redriven_from`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Redrive {
    pub source_run_id: RunId,
    pub successor_run_id: RunId,
    /// The failed step, which the successor runs again (steps before it are copied).
    pub resume_step_sequence: u32,
    pub command_id: CommandId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// What a redrive copies: the completed steps before the boundary, and where it resumes.
#[derive(Clone, Debug, PartialEq)]
pub struct RedrivePlan {
    pub resume_step_sequence: u32,
    /// The `ActivityCompleted` events of the steps before the boundary, in step order.
    pub completed: Vec<ReusedStep>,
    /// The source's event count the plan was made from (the run must still have exactly these).
    pub source_events: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ReusedStep {
    pub payload: Map<String, Value>,
    pub recorded_at: Millis,
}

/// The events a redrivable history may hold between its start and its `WorkflowFailed`.
/// (DW also refuses `ActivityRetryScheduled`; Capstan accepts retries inside a step, so a run
/// under the default retry policy can be redriven.)
const STEP_EVENTS: &[EventType] = &[
    EventType::ActivityScheduled,
    EventType::ActivityStarted,
    EventType::ActivityHeartbeatRecorded,
    EventType::ActivityRetryScheduled,
    EventType::ActivityCompleted,
    EventType::ActivityFailed,
    EventType::ActivityTimedOut,
];

fn refuse(reason: Reason, message: impl Into<String>) -> Refusal {
    Refusal::new(reason, message)
}

fn unsupported(message: impl Into<String>) -> Refusal {
    refuse(Reason::UnsupportedHistory, message)
}

/// One step's events, as the plan reads them.
#[derive(Default)]
struct Step<'e> {
    activity_type: Option<&'e str>,
    completed: Vec<&'e HistoryEvent>,
    ended_otherwise: Vec<&'e HistoryEvent>,
}

/// Reads a failed run's whole history (`events`, in order) against the failure `boundary` the
/// worker recorded: the run must have started, then run only worker activities, one step after
/// the other, each completed before the boundary step, which failed (or timed out), and then
/// failed with it. Anything else is refused with the reason DW gives.
pub fn redrive_plan(events: &[HistoryEvent], boundary: Option<&FailureBoundary>) -> Result<RedrivePlan, Refusal> {
    let mut rest = events;
    if rest.first().is_some_and(|e| e.event_type == EventType::StartAccepted) {
        rest = &rest[1..];
    }
    match rest.first() {
        Some(e) if e.event_type == EventType::WorkflowStarted => rest = &rest[1..],
        _ => return Err(unsupported("The run's history does not begin with its start.")),
    }
    let Some((last, body)) = rest.split_last() else {
        return Err(unsupported("The run's history ends before it failed."));
    };
    if last.event_type != EventType::WorkflowFailed {
        return Err(unsupported(format!(
            "The run's last event is {}, not WorkflowFailed: only a run that failed, with nothing after the failure, can be redriven.",
            last.event_type.as_str()
        )));
    }
    let Some(boundary) = boundary.filter(|b| b.failed_step_sequence >= 1) else {
        return Err(refuse(
            Reason::UnrecordedFailureBoundary,
            "The run's failure names no failed step: the workflow failed by itself, or translated its activity's failure into another error.",
        ));
    };
    let mut steps: BTreeMap<u64, Step> = BTreeMap::new();
    for event in body {
        if !STEP_EVENTS.contains(&event.event_type) {
            return Err(unsupported(format!(
                "Event {} ({}) is not a worker activity's: only a line of activities can be redriven.",
                event.sequence,
                event.event_type.as_str()
            ))
            .with("event_type", event.event_type.as_str()));
        }
        if event.payload.get("execution_mode").and_then(Value::as_str) == Some("local") {
            return Err(refuse(
                Reason::UnsupportedLocalActivity,
                format!(
                    "Step event {} is a local activity's: a run with local activities cannot be redriven.",
                    event.sequence
                ),
            ));
        }
        let sequence = event.payload.get("sequence").and_then(Value::as_u64).filter(|s| *s >= 1);
        let activity_type = event.payload.get("activity_type").and_then(Value::as_str).filter(|t| !t.is_empty());
        let (Some(sequence), Some(activity_type)) = (sequence, activity_type) else {
            return Err(unsupported(format!("Event {} names no step or activity type.", event.sequence)));
        };
        let step = steps.entry(sequence).or_default();
        if step.activity_type.is_some_and(|t| t != activity_type) {
            return Err(unsupported(format!("Step {sequence} names two activity types.")));
        }
        step.activity_type = Some(activity_type);
        match event.event_type {
            EventType::ActivityCompleted => step.completed.push(event),
            EventType::ActivityFailed | EventType::ActivityTimedOut => step.ended_otherwise.push(event),
            _ => {}
        }
    }
    let resume = boundary.failed_step_sequence as u64;
    if steps.keys().copied().ne(1..=resume) {
        return Err(unsupported(format!(
            "The run's steps are {:?}: a redrive needs steps 1 to {resume}, each an activity, ending at the failed one.",
            steps.keys().collect::<Vec<_>>()
        )));
    }
    let mut completed = Vec::new();
    for (sequence, step) in &steps {
        if *sequence == resume {
            let failed_execution = step.ended_otherwise.first().and_then(|e| e.payload.get("activity_execution_id"));
            let matches = failed_execution.and_then(Value::as_str) == Some(boundary.failed_activity_execution_id.as_str());
            if !step.completed.is_empty() || step.ended_otherwise.len() != 1 || !matches {
                return Err(refuse(
                    Reason::InvalidFailedStep,
                    format!(
                        "Step {resume} did not fail as the run's failure says (execution {}).",
                        boundary.failed_activity_execution_id
                    ),
                ));
            }
            continue;
        }
        match (step.completed.as_slice(), step.ended_otherwise.is_empty()) {
            ([done], true) if done.payload.get("result").is_some_and(|r| !r.is_null()) => completed.push(ReusedStep {
                payload: done.payload.clone(),
                recorded_at: done.recorded_at,
            }),
            _ => {
                return Err(unsupported(format!(
                    "Step {sequence} before the failed step did not complete exactly once with a result."
                )))
            }
        }
    }
    Ok(RedrivePlan {
        resume_step_sequence: resume as u32,
        completed,
        source_events: events.len() as u64,
    })
}

/// The payload of a reused step's `ActivityCompleted` in the successor: the source's, under a
/// new execution id, without the source attempt's identity, naming where it came from.
pub(crate) fn reused_completion(step: &ReusedStep, source: &RunId, execution_id: &ActivityExecutionId) -> Map<String, Value> {
    let mut payload = step.payload.clone();
    let reused_id = payload.remove("activity_execution_id").unwrap_or(Value::Null);
    for key in ["activity_attempt_id", "attempt_number", "ledger_key", "resolved_by"] {
        payload.remove(key);
    }
    payload.insert("activity_execution_id".into(), Value::from(execution_id.as_str()));
    payload.insert("reused_from_run_id".into(), Value::from(source.as_str()));
    payload.insert("reused_activity_execution_id".into(), reused_id);
    payload.insert("reused_recorded_at".into(), Value::from(crate::timefmt::iso8601(step.recorded_at)));
    payload
}
