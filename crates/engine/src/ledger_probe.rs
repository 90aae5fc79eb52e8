//! Reconciliation probes: asking the provider instead of waiting for a person.
//!
//! A declared action may name a *probe*, an activity type that looks the effect up at the
//! provider by the entry's idempotency key (Stripe's and Airbnb's practice: reconcile by asking).
//! When a dispatch's outcome becomes unknown the server starts the probe as a standalone activity
//! (`probe-{ledger_key}`, so at most one per entry) on the action's queue or the probe's own.
//! Its answer, `{"outcome": "found" | "absent" | "inconclusive", "evidence": {…}, "result": …}`,
//! resolves the entry the way an operator would, with the probe as the principal; anything else
//! (an inconclusive answer, a failed or timed-out probe, an answer without evidence) is recorded
//! on the entry and leaves the decision to the operator. A probe never runs the action itself:
//! its type may not be the action's nor any declared action's, and its attempts are bounded.

use crate::ids::WorkflowId;
use crate::payload::Payload;
use crate::Millis;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

/// Attempts of one probe when the definition does not say, and the most it may ask for.
pub const PROBE_ATTEMPTS_DEFAULT: u32 = 3;
pub const PROBE_ATTEMPTS_MAX: u32 = 10;
/// One probe attempt's bound (seconds) by default and at most.
pub const PROBE_START_TO_CLOSE_DEFAULT: i64 = 60;
pub const PROBE_START_TO_CLOSE_MAX: i64 = 3_600;
/// A probe's whole life (seconds, all attempts) by default and at most.
pub const PROBE_SCHEDULE_TO_CLOSE_DEFAULT: i64 = 600;
pub const PROBE_SCHEDULE_TO_CLOSE_MAX: i64 = 86_400;
/// How many times an `absent` answer may schedule one activity execution again. A second
/// `absent` for the same execution (its retry's outcome became unknown too) is left to the
/// operator: a probe never drives an action round and round.
pub const PROBE_RETRIES_PER_EXECUTION: u32 = 1;

/// The instance id of the probe of ledger entry `ledger_key`.
pub fn probe_workflow_id(ledger_key: &str) -> WorkflowId {
    WorkflowId(format!("probe-{ledger_key}"))
}

/// A definition's `probe` block.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeSpec {
    pub activity_type: String,
    /// `None`: the action's own queue.
    #[serde(default)]
    pub task_queue: Option<String>,
    pub max_attempts: u32,
    pub start_to_close_seconds: i64,
    pub schedule_to_close_seconds: i64,
}

const PROBE_FIELDS: &[&str] = &[
    "activity_type",
    "task_queue",
    "max_attempts",
    "start_to_close_seconds",
    "schedule_to_close_seconds",
];

impl ProbeSpec {
    /// The probe a stored definition document declares, if any (it was validated when defined).
    pub fn of(document: &Map<String, Value>) -> Option<Self> {
        document.get("probe").and_then(|probe| Self::parse(probe, "").ok())
    }

    /// Reads and checks a definition's `probe` block for action type `action_type`. An `Err`
    /// names the offending field (`probe.…`) and says what is wrong.
    pub fn parse(value: &Value, action_type: &str) -> Result<Self, (String, String)> {
        let bad = |field: &str, message: &str| (format!("probe.{field}"), message.to_string());
        let Some(block) = value.as_object() else {
            return Err(("probe".into(), "probe must be an object naming the probe's activity_type.".into()));
        };
        if let Some(unknown) = block.keys().find(|k| !PROBE_FIELDS.contains(&k.as_str())) {
            return Err(bad(unknown, "is not a probe field."));
        }
        let activity_type = match block.get("activity_type").and_then(Value::as_str) {
            Some(t) if !t.is_empty() && t.len() <= 255 => t.to_string(),
            _ => return Err(bad("activity_type", "the probe's activity_type must be 1 to 255 characters.")),
        };
        if activity_type == action_type {
            return Err(bad(
                "activity_type",
                "a probe asks about the action; it may not be the action itself.",
            ));
        }
        let task_queue = match block.get("task_queue") {
            None | Some(Value::Null) => None,
            Some(Value::String(q)) if !q.is_empty() && q.len() <= 255 => Some(q.clone()),
            Some(_) => return Err(bad("task_queue", "task_queue must be 1 to 255 characters.")),
        };
        let bounded = |field: &str, default: i64, max: i64| match block.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(v) => v
                .as_i64()
                .filter(|n| (1..=max).contains(n))
                .ok_or_else(|| bad(field, &format!("{field} must be an integer from 1 to {max}."))),
        };
        Ok(Self {
            activity_type,
            task_queue,
            max_attempts: bounded("max_attempts", PROBE_ATTEMPTS_DEFAULT.into(), PROBE_ATTEMPTS_MAX.into())? as u32,
            start_to_close_seconds: bounded("start_to_close_seconds", PROBE_START_TO_CLOSE_DEFAULT, PROBE_START_TO_CLOSE_MAX)?,
            schedule_to_close_seconds: bounded(
                "schedule_to_close_seconds",
                PROBE_SCHEDULE_TO_CLOSE_DEFAULT,
                PROBE_SCHEDULE_TO_CLOSE_MAX,
            )?,
        })
    }
}

/// What a probe's host run answers for: kept on the host run, read when it closes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeTarget {
    pub namespace: String,
    /// The action's instance (its current run records the answer).
    pub workflow_id: WorkflowId,
    pub ledger_key: String,
    pub probe_type: String,
}

impl ProbeTarget {
    /// Who a probe's resolution is recorded as.
    pub fn principal(&self) -> String {
        format!("probe:{}", self.probe_type)
    }
}

/// What a probe concluded.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The effect happened: the step completes with `result` (checked like an operator's).
    Found {
        evidence: Value,
        result_json: Value,
        result: Payload,
    },
    /// It did not: one deliberate retry, same idempotency key.
    Absent { evidence: Value },
    /// The probe could not tell (or failed, timed out, answered without evidence).
    Inconclusive { evidence: Value },
}

impl Verdict {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Found { .. } => "found",
            Self::Absent { .. } => "absent",
            Self::Inconclusive { .. } => "inconclusive",
        }
    }

    pub fn evidence(&self) -> &Value {
        match self {
            Self::Found { evidence, .. } | Self::Absent { evidence } | Self::Inconclusive { evidence } => evidence,
        }
    }

    /// Reads a probe's decoded result. `encode` turns the answer's `result` into the action's
    /// result payload.
    pub fn read(answer: &Value, encode: impl Fn(&Value) -> Result<Payload, String>) -> Self {
        let inconclusive = |why: String| Self::Inconclusive {
            evidence: json!({"problem": why, "answer": answer}),
        };
        let evidence = match answer.get("evidence") {
            Some(Value::Object(evidence)) if !evidence.is_empty() => Value::Object(evidence.clone()),
            _ => return inconclusive("the probe's answer carries no evidence (a non-empty object)".into()),
        };
        match answer.get("outcome").and_then(Value::as_str) {
            Some("found") => {
                let result_json = answer.get("result").cloned().unwrap_or(Value::Null);
                match encode(&result_json) {
                    Ok(result) => Self::Found {
                        evidence,
                        result_json,
                        result,
                    },
                    Err(error) => inconclusive(format!("the probe's result could not be encoded: {error}")),
                }
            }
            Some("absent") => Self::Absent { evidence },
            Some("inconclusive") => Self::Inconclusive { evidence },
            _ => inconclusive("the probe's answer must have outcome found, absent or inconclusive".into()),
        }
    }
}

/// A probe's host run closed: its answer, for the store to apply to the action's instance in
/// the same transaction.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeAnswer {
    pub target: ProbeTarget,
    pub probe_workflow_id: WorkflowId,
    pub verdict: Verdict,
    pub answered_at: Millis,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_block_is_bounded_and_never_the_action_itself() {
        let spec = ProbeSpec::parse(&json!({"activity_type": "lookup"}), "pay").unwrap();
        assert_eq!(
            (
                spec.max_attempts,
                spec.start_to_close_seconds,
                spec.schedule_to_close_seconds,
                spec.task_queue
            ),
            (
                PROBE_ATTEMPTS_DEFAULT,
                PROBE_START_TO_CLOSE_DEFAULT,
                PROBE_SCHEDULE_TO_CLOSE_DEFAULT,
                None
            )
        );
        let field = |value: Value| ProbeSpec::parse(&value, "pay").unwrap_err().0;
        assert_eq!(field(json!({"activity_type": "pay"})), "probe.activity_type");
        assert_eq!(field(json!({"activity_type": "lookup", "max_attempts": 11})), "probe.max_attempts");
        assert_eq!(
            field(json!({"activity_type": "lookup", "schedule_to_close_seconds": 0})),
            "probe.schedule_to_close_seconds"
        );
        assert_eq!(field(json!({"activity_type": "lookup", "retries": 1})), "probe.retries");
        assert_eq!(field(json!("lookup")), "probe");
    }

    #[test]
    fn an_answer_without_evidence_or_a_known_outcome_is_inconclusive() {
        let encode = |value: &Value| Ok(Payload::avro(value.to_string()));
        let found = Verdict::read(&json!({"outcome": "found", "evidence": {"ref": 1}, "result": [1]}), encode);
        assert!(matches!(&found, Verdict::Found { result, .. } if result.blob == "[1]"));
        assert_eq!(
            Verdict::read(&json!({"outcome": "absent", "evidence": {"q": 1}}), encode).name(),
            "absent"
        );
        for answer in [
            json!({"outcome": "found"}),
            json!({"outcome": "maybe", "evidence": {"q": 1}}),
            json!({"outcome": "absent", "evidence": {}}),
        ] {
            assert_eq!(Verdict::read(&answer, encode).name(), "inconclusive", "{answer}");
        }
        let unencodable = Verdict::read(&json!({"outcome": "found", "evidence": {"q": 1}}), |_| Err("no".into()));
        assert_eq!(unencodable.name(), "inconclusive");
    }
}
